//! Where a decoded message goes: the event bus and the job dispatcher.
//!
//! Both are traits, so an application can bring its own. The crate ships
//! [`InProcessBus`] (any number of async handlers per event) and
//! [`InProcessJobs`] (one async handler per job); `outbox-actors` adds
//! delivery to actix `Recipient`s.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;

use futures_util::future::LocalBoxFuture;

use crate::error::{Error, RegistryError};
use crate::message::{ClaimedMessage, ErrorRecord, MessageKind, TraceCarrier};
use crate::registry::{Event, Job};

/// A payload decoded into its registered type, type-erased.
pub type DecodedPayload = Box<dyn Any + Send + Sync>;

/// What a transport's future resolves to.
pub type DeliveryResult = Result<(), DeliveryError>;

/// The error a delivery failed with: any error type, or a plain message.
///
/// Handlers return `Result<(), DeliveryError>` and can use `?` on any
/// `std::error::Error`; the type name and cause chain are kept for
/// `last_error`. It is cheap to clone, so observers can keep it.
#[derive(Clone)]
pub struct DeliveryError {
    type_name: &'static str,
    error: Arc<dyn std::error::Error + Send + Sync + 'static>,
}

impl DeliveryError {
    /// A delivery error that is just a message.
    pub fn msg(message: impl fmt::Display) -> Self {
        DeliveryError {
            type_name: "message",
            error: Arc::new(MessageError(message.to_string())),
        }
    }

    /// Turn a caught panic into a delivery error.
    pub fn panic(payload: &(dyn Any + Send)) -> Self {
        let text = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a handler panicked with a non-string payload".to_owned());
        DeliveryError {
            type_name: "panic",
            error: Arc::new(MessageError(format!("handler panicked: {text}"))),
        }
    }

    /// The Rust type name of the wrapped error (`message` or `panic` for those).
    pub fn type_name(&self) -> &'static str {
        self.type_name
    }

    /// The wrapped error.
    pub fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.error
    }

    /// The wrapped error, if it is a `T`.
    pub fn downcast_ref<T: std::error::Error + 'static>(&self) -> Option<&T> {
        self.error.downcast_ref::<T>()
    }

    /// `true` when the payload did not decode into its registered type:
    /// retrying cannot help, so the runtime dead-letters at once.
    pub fn is_undecodable(&self) -> bool {
        matches!(
            self.downcast_ref::<Error>(),
            Some(Error::Registry(RegistryError::Decode { .. }))
        )
    }

    /// `true` for a panic caught in a handler.
    pub fn is_panic(&self) -> bool {
        self.type_name == "panic"
    }

    /// The error as stored in `last_error`.
    pub fn to_record(&self) -> ErrorRecord {
        ErrorRecord::from_dyn(self.type_name, self.as_error())
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for DeliveryError {
    fn from(error: E) -> Self {
        DeliveryError {
            type_name: std::any::type_name::<E>(),
            error: Arc::new(error),
        }
    }
}

impl fmt::Display for DeliveryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl fmt::Debug for DeliveryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeliveryError({}: {})", self.type_name, self.error)
    }
}

#[derive(Debug)]
struct MessageError(String);

impl fmt::Display for MessageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for MessageError {}

/// What a handler learns about the message it is handling.
#[derive(Debug, Clone)]
pub struct DeliveryContext {
    message: Arc<ClaimedMessage>,
    trace: Option<TraceCarrier>,
}

impl DeliveryContext {
    /// Context for `message`, with the delivery's own trace context.
    pub fn new(message: Arc<ClaimedMessage>, trace: Option<TraceCarrier>) -> Self {
        DeliveryContext { message, trace }
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

/// Publishes events to their handlers.
///
/// The returned future need not be `Send`: the runtime polls it on the
/// arbiter that runs the delivery, so handlers may hold `!Send` state.
pub trait EventBus: Send + Sync + 'static {
    /// Deliver one event; `Err` fails the attempt (retried per policy).
    fn publish(&self, delivery: Delivery) -> LocalBoxFuture<'static, DeliveryResult>;
}

/// Dispatches jobs to their handler.
pub trait JobDispatcher: Send + Sync + 'static {
    /// Run one job; `Err` fails the attempt (retried per the job's policy).
    fn dispatch(&self, delivery: Delivery) -> LocalBoxFuture<'static, DeliveryResult>;
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

/// An in-process event bus: async handlers by event name.
///
/// Every handler of an event runs, concurrently; the delivery fails if any
/// of them fails, and then all of them run again on the retry. Make handlers
/// idempotent (key on [`DeliveryContext::id`]).
#[derive(Clone, Default)]
pub struct InProcessBus {
    handlers: HashMap<&'static str, Vec<SharedHandler>>,
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
        self
    }

    /// `true` when some handler listens to `name`.
    pub fn handles(&self, name: &str) -> bool {
        self.handlers.contains_key(name)
    }
}

impl fmt::Debug for InProcessBus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names: Vec<_> = self.handlers.keys().collect();
        names.sort();
        f.debug_struct("InProcessBus")
            .field("events", &names)
            .finish()
    }
}

impl EventBus for InProcessBus {
    fn publish(&self, delivery: Delivery) -> LocalBoxFuture<'static, DeliveryResult> {
        let Some(handlers) = self.handlers.get(delivery.context.name()) else {
            return Box::pin(std::future::ready(Err(no_handler(
                MessageKind::Event,
                delivery.context.name(),
            ))));
        };
        let payload: Arc<dyn Any + Send + Sync> = Arc::from(delivery.payload);
        if let [only] = handlers.as_slice() {
            return only(payload, delivery.context);
        }
        let runs: Vec<_> = handlers
            .iter()
            .map(|handler| handler(payload.clone(), delivery.context.clone()))
            .collect();
        Box::pin(async move {
            futures_util::future::join_all(runs)
                .await
                .into_iter()
                .collect::<Result<(), _>>()
        })
    }
}

/// An in-process job dispatcher: one async handler per job name.
#[derive(Clone, Default)]
pub struct InProcessJobs {
    handlers: HashMap<&'static str, OwnedHandler>,
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
        self
    }

    /// `true` when a handler runs job `name`.
    pub fn handles(&self, name: &str) -> bool {
        self.handlers.contains_key(name)
    }
}

impl fmt::Debug for InProcessJobs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names: Vec<_> = self.handlers.keys().collect();
        names.sort();
        f.debug_struct("InProcessJobs")
            .field("jobs", &names)
            .finish()
    }
}

impl JobDispatcher for InProcessJobs {
    fn dispatch(&self, delivery: Delivery) -> LocalBoxFuture<'static, DeliveryResult> {
        match self.handlers.get(delivery.context.name()) {
            Some(handler) => handler(delivery.payload, delivery.context),
            None => Box::pin(std::future::ready(Err(no_handler(
                MessageKind::Job,
                delivery.context.name(),
            )))),
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
