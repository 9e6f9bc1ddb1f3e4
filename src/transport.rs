//! Where a decoded message goes: the event bus and the job dispatcher.
//!
//! Both are traits, so an application can bring its own. The crate ships
//! [`InProcessBus`] (any number of async handlers per event) and
//! [`InProcessJobs`] (one async handler per job); `outbox-actors` adds
//! delivery to actix `Recipient`s. Both in-process transports take a
//! catch-all handler (`on_any`) for the names they have no typed handler
//! for, which gets the message as stored, a [`RawMessage`].

use std::any::Any;
use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use foldhash::HashMap;
use futures_util::future::LocalBoxFuture;

use crate::error::DeliveryError;
use crate::error::{Error, RegistryError};
use crate::kind::MessageKind;
use crate::message::ClaimedMessage;
use crate::payload::{DecodedPayload, Event, Job, RawMessage};
use crate::registry::RegistryBuilder;
use crate::trace::TraceCarrier;

/// What a transport's future resolves to.
pub type DeliveryResult = Result<(), DeliveryError>;

/// What a handler learns about the message it is handling.
#[derive(Debug, Clone)]
pub struct DeliveryContext {
    message: Arc<ClaimedMessage>,
    trace: Option<TraceCarrier>,
    cancel: CancelToken,
}

/// Says whether an operator cancelled a message while it was being
/// delivered. The runtime holds one per delivery and cancels it when a
/// renewal of the lease reports the request; the handler reads it through
/// its [`DeliveryContext`]. Cheap to clone; clones share the state.
#[derive(Debug, Clone, Default)]
pub struct CancelToken(Arc<CancelState>);

/// A flag and the waiters to wake when it is set. Every delivery makes a
/// token and almost none is ever cancelled, so it is one allocation of a
/// few words, not a channel.
#[derive(Debug, Default)]
struct CancelState {
    cancelled: AtomicBool,
    waiters: tokio::sync::Notify,
}

impl CancelToken {
    /// A token not cancelled.
    pub fn new() -> Self {
        CancelToken::default()
    }

    /// Mark it cancelled, waking every [`CancelToken::cancelled`] waiting.
    pub fn cancel(&self) {
        if !self.0.cancelled.swap(true, Ordering::AcqRel) {
            self.0.waiters.notify_waiters();
        }
    }

    /// `true` once it was cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.0.cancelled.load(Ordering::Acquire)
    }

    /// Resolves once it is cancelled; never, if it is not.
    pub async fn cancelled(&self) {
        loop {
            // Registered before the flag is read, so a `cancel` between the
            // two still wakes this wait.
            let mut wake = std::pin::pin!(self.0.waiters.notified());
            wake.as_mut().enable();
            if self.is_cancelled() {
                return;
            }
            wake.await;
        }
    }
}

impl DeliveryContext {
    /// Context for `message`, with the delivery's own trace context.
    pub fn new(message: Arc<ClaimedMessage>, trace: Option<TraceCarrier>) -> Self {
        DeliveryContext {
            message,
            trace,
            cancel: CancelToken::new(),
        }
    }

    /// The same context, reporting cancellation through `token`.
    pub fn with_cancel_token(mut self, token: CancelToken) -> Self {
        self.cancel = token;
        self
    }

    /// `true` once an operator cancelled the message while this delivery
    /// runs (`outbox cancel`, [`OutboxAdmin::cancel_messages`](crate::OutboxAdmin::cancel_messages)).
    /// The runtime learns it at the lease's next renewal, so within a
    /// heartbeat interval. A handler that can stop should: if it then
    /// fails, the message ends `Cancelled` and never runs again; if it
    /// succeeds anyway, the message is recorded as delivered.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Resolves once the message is cancelled (see
    /// [`DeliveryContext::is_cancelled`]); never, if it is not. Race it
    /// against the handler's work with `tokio::select!` to stop early.
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await
    }

    /// The claimed message (its payload as JSON, ids, attempt counts).
    pub fn message(&self) -> &ClaimedMessage {
        &self.message
    }

    /// The message id; use it to make handlers idempotent, since delivery is
    /// at-least-once.
    pub fn id(&self) -> &str {
        &self.message.id
    }

    /// The message name.
    pub fn name(&self) -> &str {
        &self.message.name
    }

    /// Which attempt this is, starting at 1.
    pub fn attempt(&self) -> u32 {
        self.message.attempts
    }

    /// Trace context to continue the delivery's trace in downstream calls.
    pub fn trace(&self) -> Option<&TraceCarrier> {
        self.trace.as_ref()
    }
}

/// One decoded message on its way to a handler.
pub struct Delivery {
    /// The payload, decoded into the type the registry names.
    pub payload: DecodedPayload,
    /// Everything else about the message.
    pub context: DeliveryContext,
}

impl fmt::Debug for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delivery")
            .field("context", &self.context)
            .finish_non_exhaustive()
    }
}

/// Registers one payload type with a [`RegistryBuilder`]; what a typed
/// handler knows about its message, kept so a registry can be derived from
/// the handlers.
pub type Registration = fn(RegistryBuilder) -> RegistryBuilder;

/// Which message names a transport serves, so a drain can check at start
/// that every registered name has a handler and every handler a
/// registration, and can derive the registry from the handlers.
///
/// A transport that cannot tell (the default of [`EventBus::serves`] and
/// [`JobDispatcher::serves`]) answers [`ServedNames::unknown`], and is then
/// trusted to serve whatever is registered.
///
/// ```
/// use outbox::{Event, ServedNames};
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct OrderPlaced { order_id: u64 }
/// impl Event for OrderPlaced { const NAME: &'static str = "order.placed"; }
///
/// let served = ServedNames::none().event::<OrderPlaced>().name("audit.logged");
/// assert!(served.serves("order.placed") && served.serves("audit.logged"));
/// assert!(!served.serves("order.shipped"));
/// assert!(ServedNames::unknown().serves("anything"));
/// ```
#[derive(Clone, Default)]
pub struct ServedNames {
    /// Each name served, with how to register its type when it is known.
    names: BTreeMap<String, Option<Registration>>,
    catch_all: bool,
    unknown: bool,
}

impl ServedNames {
    /// Serves no name (yet); add them with [`ServedNames::event`],
    /// [`ServedNames::job`], [`ServedNames::name`] and [`ServedNames::catch_all`].
    pub fn none() -> Self {
        Self::default()
    }

    /// The transport cannot say what it serves: the start-up check trusts
    /// it with every registered name, and no registry can be derived from it.
    pub fn unknown() -> Self {
        ServedNames {
            unknown: true,
            ..Self::default()
        }
    }

    /// Serves event `E`, whose type a derived registry registers.
    pub fn event<E: Event>(mut self) -> Self {
        let register: Registration = RegistryBuilder::event::<E>;
        self.names.insert(E::NAME.to_owned(), Some(register));
        self
    }

    /// Serves job `J`, whose type (and retry policy) a derived registry
    /// registers.
    pub fn job<J: Job>(mut self) -> Self {
        let register: Registration = RegistryBuilder::job::<J>;
        self.names.insert(J::NAME.to_owned(), Some(register));
        self
    }

    /// Serves `name`, of a type this transport does not know; such a name
    /// must be registered in an explicit registry.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.names.entry(name.into()).or_insert(None);
        self
    }

    /// Also serves every name without a handler of its own.
    pub fn catch_all(mut self) -> Self {
        self.catch_all = true;
        self
    }

    /// `false` for [`ServedNames::unknown`].
    pub fn is_known(&self) -> bool {
        !self.unknown
    }

    /// `true` when a catch-all handler takes the names without a handler.
    pub fn catches_all(&self) -> bool {
        self.catch_all
    }

    /// `true` when a message named `name` reaches a handler: a typed one, a
    /// catch-all, or (when unknown) presumably.
    pub fn serves(&self, name: &str) -> bool {
        self.unknown || self.catch_all || self.names.contains_key(name)
    }

    /// The names with a handler of their own, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names.keys().map(String::as_str)
    }

    /// The registration of `name`'s type, when the transport knows it.
    pub fn registration(&self, name: &str) -> Option<Registration> {
        self.names.get(name).copied().flatten()
    }
}

impl fmt::Debug for ServedNames {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.unknown {
            return f.write_str("ServedNames::unknown()");
        }
        f.debug_struct("ServedNames")
            .field("names", &self.names.keys().collect::<Vec<_>>())
            .field("catch_all", &self.catch_all)
            .finish()
    }
}

/// Publishes events to their handlers.
///
/// The returned future need not be `Send`: the runtime polls it on the
/// arbiter that runs the delivery, so handlers may hold `!Send` state.
pub trait EventBus: Send + Sync + 'static {
    /// Deliver one event; `Err` fails the attempt (retried per policy).
    fn publish(&self, delivery: Delivery) -> LocalBoxFuture<'static, DeliveryResult>;

    /// The event names this bus serves, checked against the registry when
    /// a drain starts (and used to derive one when none is given). The
    /// default, [`ServedNames::unknown`], skips the check for this bus.
    fn serves(&self) -> ServedNames {
        ServedNames::unknown()
    }
}

/// Dispatches jobs to their handler.
pub trait JobDispatcher: Send + Sync + 'static {
    /// Run one job; `Err` fails the attempt (retried per the job's policy).
    fn dispatch(&self, delivery: Delivery) -> LocalBoxFuture<'static, DeliveryResult>;

    /// The job names this dispatcher serves, checked against the registry
    /// when a drain starts (and used to derive one when none is given). The
    /// default, [`ServedNames::unknown`], skips the check for this dispatcher.
    fn serves(&self) -> ServedNames {
        ServedNames::unknown()
    }
}

type SharedHandler = Arc<
    dyn Fn(Arc<dyn Any + Send + Sync>, DeliveryContext) -> LocalBoxFuture<'static, DeliveryResult>
        + Send
        + Sync,
>;

type OwnedHandler = Arc<
    dyn Fn(DecodedPayload, DeliveryContext) -> LocalBoxFuture<'static, DeliveryResult>
        + Send
        + Sync,
>;

/// A catch-all handler; `P` is how it takes the [`RawMessage`].
type RawHandler<P> =
    Arc<dyn Fn(P, DeliveryContext) -> LocalBoxFuture<'static, DeliveryResult> + Send + Sync>;

/// An in-process event bus: async handlers by event name.
///
/// Every handler of an event runs, concurrently; the delivery fails if any
/// of them fails, and then all of them run again on the retry. Make handlers
/// idempotent (key on [`DeliveryContext::id`]).
#[derive(Clone, Default)]
pub struct InProcessBus {
    handlers: HashMap<&'static str, Vec<SharedHandler>>,
    any: Vec<RawHandler<Arc<RawMessage>>>,
    served: ServedNames,
}

impl InProcessBus {
    /// An empty bus.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add a handler for event `E`.
    pub fn on<E, F, Fut>(mut self, handler: F) -> Self
    where
        E: Event,
        F: Fn(Arc<E>, DeliveryContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = DeliveryResult> + 'static,
    {
        let erased: SharedHandler =
            Arc::new(move |payload, context| match payload.downcast::<E>() {
                Ok(event) => Box::pin(handler(event, context)),
                Err(_) => Box::pin(std::future::ready(Err(type_mismatch::<E>(
                    MessageKind::Event,
                    E::NAME,
                )))),
            });
        self.handlers.entry(E::NAME).or_default().push(erased);
        self.served = std::mem::take(&mut self.served).event::<E>();
        self
    }

    /// Add a handler for every event that has no typed handler on this bus.
    ///
    /// It gets the event as stored: a [`RawMessage`] with the JSON payload,
    /// whether the registry decoded it with a catch-all
    /// ([`RegistryBuilder::any`](crate::RegistryBuilder::any)) or into a type
    /// no handler here takes. Typed handlers come first: an event with one
    /// never reaches the catch-all. Several catch-alls all run, like typed
    /// handlers of one event.
    ///
    /// ```
    /// use outbox::{InProcessBus, RawMessage};
    ///
    /// let bus = InProcessBus::new().on_any(|message: std::sync::Arc<RawMessage>, _ctx| async move {
    ///     println!("{} {}: {}", message.kind, message.name, message.payload.as_str());
    ///     Ok(())
    /// });
    /// assert!(bus.handles("any.name"));
    /// ```
    pub fn on_any<F, Fut>(mut self, handler: F) -> Self
    where
        F: Fn(Arc<RawMessage>, DeliveryContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = DeliveryResult> + 'static,
    {
        self.any.push(Arc::new(move |message, context| {
            Box::pin(handler(message, context))
        }));
        self.served = std::mem::take(&mut self.served).catch_all();
        self
    }

    /// `true` when some handler listens to `name` (a catch-all listens to all).
    pub fn handles(&self, name: &str) -> bool {
        self.handlers.contains_key(name) || !self.any.is_empty()
    }
}

impl fmt::Debug for InProcessBus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names: Vec<_> = self.handlers.keys().collect();
        names.sort();
        f.debug_struct("InProcessBus")
            .field("events", &names)
            .field("catch_alls", &self.any.len())
            .finish()
    }
}

impl EventBus for InProcessBus {
    fn publish(&self, delivery: Delivery) -> LocalBoxFuture<'static, DeliveryResult> {
        let context = delivery.context;
        match self.handlers.get(context.name()) {
            Some(handlers) => {
                let payload: Arc<dyn Any + Send + Sync> = Arc::from(delivery.payload);
                fan_out(handlers, context, |handler, context| {
                    handler(payload.clone(), context)
                })
            }
            None if !self.any.is_empty() => {
                let message = Arc::new(raw(delivery.payload, &context));
                fan_out(&self.any, context, |handler, context| {
                    handler(message.clone(), context)
                })
            }
            None => Box::pin(std::future::ready(Err(no_handler(
                MessageKind::Event,
                context.name(),
            )))),
        }
    }

    fn serves(&self) -> ServedNames {
        self.served.clone()
    }
}

/// Run every handler of one event at once; the delivery fails if any fails.
fn fan_out<H>(
    handlers: &[H],
    context: DeliveryContext,
    call: impl Fn(&H, DeliveryContext) -> LocalBoxFuture<'static, DeliveryResult>,
) -> LocalBoxFuture<'static, DeliveryResult> {
    if let [only] = handlers {
        return call(only, context);
    }
    let runs: Vec<_> = handlers
        .iter()
        .map(|handler| call(handler, context.clone()))
        .collect();
    Box::pin(async move {
        futures_util::future::join_all(runs)
            .await
            .into_iter()
            .collect::<Result<(), _>>()
    })
}

/// An in-process job dispatcher: one async handler per job name.
#[derive(Clone, Default)]
pub struct InProcessJobs {
    handlers: HashMap<&'static str, OwnedHandler>,
    any: Option<RawHandler<RawMessage>>,
    served: ServedNames,
}

impl InProcessJobs {
    /// A dispatcher with no handlers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Handle job `J` with `handler`, replacing any earlier handler for it.
    pub fn on<J, F, Fut>(mut self, handler: F) -> Self
    where
        J: Job,
        F: Fn(J, DeliveryContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = DeliveryResult> + 'static,
    {
        let erased: OwnedHandler =
            Arc::new(move |payload, context| match payload.downcast::<J>() {
                Ok(job) => Box::pin(handler(*job, context)),
                Err(_) => Box::pin(std::future::ready(Err(type_mismatch::<J>(
                    MessageKind::Job,
                    J::NAME,
                )))),
            });
        self.handlers.insert(J::NAME, erased);
        self.served = std::mem::take(&mut self.served).job::<J>();
        self
    }

    /// Handle every job that has no typed handler here, replacing any
    /// earlier catch-all.
    ///
    /// It gets the job as stored: a [`RawMessage`] with the JSON payload,
    /// whether the registry decoded it with a catch-all
    /// ([`RegistryBuilder::any`](crate::RegistryBuilder::any)) or into a type
    /// no handler here takes. A job with a typed handler never reaches it.
    pub fn on_any<F, Fut>(mut self, handler: F) -> Self
    where
        F: Fn(RawMessage, DeliveryContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = DeliveryResult> + 'static,
    {
        self.any = Some(Arc::new(move |job, context| {
            Box::pin(handler(job, context))
        }));
        self.served = std::mem::take(&mut self.served).catch_all();
        self
    }

    /// `true` when a handler runs job `name` (a catch-all runs them all).
    pub fn handles(&self, name: &str) -> bool {
        self.handlers.contains_key(name) || self.any.is_some()
    }
}

impl fmt::Debug for InProcessJobs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names: Vec<_> = self.handlers.keys().collect();
        names.sort();
        f.debug_struct("InProcessJobs")
            .field("jobs", &names)
            .field("catch_all", &self.any.is_some())
            .finish()
    }
}

impl JobDispatcher for InProcessJobs {
    fn dispatch(&self, delivery: Delivery) -> LocalBoxFuture<'static, DeliveryResult> {
        match (self.handlers.get(delivery.context.name()), &self.any) {
            (Some(handler), _) => handler(delivery.payload, delivery.context),
            (None, Some(any)) => any(raw(delivery.payload, &delivery.context), delivery.context),
            (None, None) => Box::pin(std::future::ready(Err(no_handler(
                MessageKind::Job,
                delivery.context.name(),
            )))),
        }
    }

    fn serves(&self) -> ServedNames {
        self.served.clone()
    }
}

/// The message as stored, for a catch-all handler: the registry's
/// [`RawMessage`] when it made one, else rebuilt from the claimed message
/// (its payload decoded into a type no handler here takes).
fn raw(payload: DecodedPayload, context: &DeliveryContext) -> RawMessage {
    match payload.downcast::<RawMessage>() {
        Ok(message) => *message,
        Err(_) => {
            let message = context.message();
            RawMessage {
                kind: message.kind,
                name: message.name.clone(),
                payload: message.payload.clone(),
            }
        }
    }
}

fn no_handler(kind: MessageKind, name: &str) -> DeliveryError {
    Error::from(RegistryError::NoHandler {
        kind,
        name: name.to_owned(),
    })
    .into()
}

fn type_mismatch<T>(kind: MessageKind, name: &str) -> DeliveryError {
    Error::from(RegistryError::TypeMismatch {
        kind,
        name: name.to_owned(),
        registered: "another type",
        expected: std::any::type_name::<T>(),
    })
    .into()
}

#[cfg(test)]
mod tests;
