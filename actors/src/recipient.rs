//! Delivery to actix actors: an event bus and a job dispatcher whose handlers
//! are `Recipient`s.

use std::fmt;
use std::sync::Arc;

use actix::prelude::*;
use foldhash::HashMap;
use futures_util::future::LocalBoxFuture;
use outbox::{
    Delivery, DeliveryContext, DeliveryError, DeliveryResult, Event, EventBus, Job, JobDispatcher,
    MessageKind, RegistryError, ServedNames,
};

/// An event handed to an actor; answer `Ok(())` once it is handled.
pub struct DeliverEvent<E: Event> {
    /// The decoded event, shared by every subscriber.
    pub event: Arc<E>,
    /// The message's id, attempt and trace context.
    pub context: DeliveryContext,
}

impl<E: Event> Message for DeliverEvent<E> {
    type Result = DeliveryResult;
}

impl<E: Event> fmt::Debug for DeliverEvent<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeliverEvent")
            .field("context", &self.context)
            .finish_non_exhaustive()
    }
}

/// A job handed to an actor; answer `Ok(())` once it is done.
pub struct DeliverJob<J: Job> {
    /// The decoded job.
    pub job: J,
    /// The message's id, attempt and trace context.
    pub context: DeliveryContext,
}

impl<J: Job> Message for DeliverJob<J> {
    type Result = DeliveryResult;
}

impl<J: Job> fmt::Debug for DeliverJob<J> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeliverJob")
            .field("context", &self.context)
            .finish_non_exhaustive()
    }
}

type EventSender = Arc<
    dyn Fn(
            Arc<dyn std::any::Any + Send + Sync>,
            DeliveryContext,
        ) -> LocalBoxFuture<'static, DeliveryResult>
        + Send
        + Sync,
>;

type JobSender = Arc<
    dyn Fn(outbox::DecodedPayload, DeliveryContext) -> LocalBoxFuture<'static, DeliveryResult>
        + Send
        + Sync,
>;

fn mailbox_error(name: &str, error: MailboxError) -> DeliveryError {
    DeliveryError::msg(format!(
        "the actor handling {name:?} did not answer: {error}"
    ))
}

fn mismatch<T>(kind: MessageKind, name: &str) -> DeliveryError {
    outbox::Error::from(RegistryError::TypeMismatch {
        kind,
        name: name.to_owned(),
        registered: "another type",
        expected: std::any::type_name::<T>(),
    })
    .into()
}

/// An event bus that delivers each event to every actor subscribed to it.
///
/// The delivery fails if any subscriber answers `Err` or has stopped.
#[derive(Clone, Default)]
pub struct RecipientBus {
    subscribers: HashMap<&'static str, Vec<EventSender>>,
    served: ServedNames,
}

impl RecipientBus {
    /// A bus with no subscribers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Deliver every `E` to `recipient`.
    pub fn subscribe<E: Event>(mut self, recipient: Recipient<DeliverEvent<E>>) -> Self {
        let sender: EventSender = Arc::new(move |payload, context| {
            let event = match payload.downcast::<E>() {
                Ok(event) => event,
                Err(_) => {
                    return Box::pin(std::future::ready(Err(mismatch::<E>(
                        MessageKind::Event,
                        E::NAME,
                    ))));
                }
            };
            let request = recipient.send(DeliverEvent { event, context });
            Box::pin(async move {
                request
                    .await
                    .map_err(|error| mailbox_error(E::NAME, error))?
            })
        });
        self.subscribers.entry(E::NAME).or_default().push(sender);
        self.served = std::mem::take(&mut self.served).event::<E>();
        self
    }
}

impl fmt::Debug for RecipientBus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names: Vec<_> = self.subscribers.keys().collect();
        names.sort();
        f.debug_struct("RecipientBus")
            .field("events", &names)
            .finish()
    }
}

impl EventBus for RecipientBus {
    fn publish(&self, delivery: Delivery) -> LocalBoxFuture<'static, DeliveryResult> {
        let name = delivery.context.name().to_owned();
        let Some(subscribers) = self.subscribers.get(name.as_str()) else {
            let error = outbox::Error::from(RegistryError::NoHandler {
                kind: MessageKind::Event,
                name,
            });
            return Box::pin(std::future::ready(Err(error.into())));
        };
        let payload: Arc<dyn std::any::Any + Send + Sync> = Arc::from(delivery.payload);
        let sends: Vec<_> = subscribers
            .iter()
            .map(|send| send(payload.clone(), delivery.context.clone()))
            .collect();
        Box::pin(async move {
            futures_util::future::join_all(sends)
                .await
                .into_iter()
                .collect()
        })
    }

    fn serves(&self) -> ServedNames {
        self.served.clone()
    }
}

/// A job dispatcher that hands each job to the actor registered for it.
#[derive(Clone, Default)]
pub struct RecipientJobs {
    handlers: HashMap<&'static str, JobSender>,
    served: ServedNames,
}

impl RecipientJobs {
    /// A dispatcher with no handlers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Run every `J` on `recipient`, replacing any earlier handler for it.
    pub fn handle<J: Job>(mut self, recipient: Recipient<DeliverJob<J>>) -> Self {
        let sender: JobSender = Arc::new(move |payload, context| {
            let job = match payload.downcast::<J>() {
                Ok(job) => *job,
                Err(_) => {
                    return Box::pin(std::future::ready(Err(mismatch::<J>(
                        MessageKind::Job,
                        J::NAME,
                    ))));
                }
            };
            let request = recipient.send(DeliverJob { job, context });
            Box::pin(async move {
                request
                    .await
                    .map_err(|error| mailbox_error(J::NAME, error))?
            })
        });
        self.handlers.insert(J::NAME, sender);
        self.served = std::mem::take(&mut self.served).job::<J>();
        self
    }
}

impl fmt::Debug for RecipientJobs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names: Vec<_> = self.handlers.keys().collect();
        names.sort();
        f.debug_struct("RecipientJobs")
            .field("jobs", &names)
            .finish()
    }
}

impl JobDispatcher for RecipientJobs {
    fn dispatch(&self, delivery: Delivery) -> LocalBoxFuture<'static, DeliveryResult> {
        match self.handlers.get(delivery.context.name()) {
            Some(send) => send(delivery.payload, delivery.context),
            None => {
                let error = outbox::Error::from(RegistryError::NoHandler {
                    kind: MessageKind::Job,
                    name: delivery.context.name().to_owned(),
                });
                Box::pin(std::future::ready(Err(error.into())))
            }
        }
    }

    fn serves(&self) -> ServedNames {
        self.served.clone()
    }
}
