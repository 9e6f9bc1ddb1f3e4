//! Helpers for an application's own tests (feature `testing`): what was
//! enqueued, asserted by type with a predicate on the payload, and a
//! handler that records what was delivered.
//!
//! They work on any store that implements [`OutboxAdmin`]: [`MemoryOutbox`]
//! in unit tests, the SQL stores in tests against a real database. Enable
//! the feature for tests only:
//!
//! ```toml
//! [dev-dependencies]
//! outbox = { version = "0.1", features = ["testing"] }
//! ```
//!
//! Failures panic with what the store holds, as assertions do; a store that
//! fails to answer panics too, since a test cannot go on without it.
//!
//! ```
//! use outbox::prelude::*;
//! use outbox::testing::{assert_enqueued, enqueued};
//!
//! #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
//! struct OrderPlaced { order_id: u64 }
//! impl Event for OrderPlaced { const NAME: &'static str = "order.placed"; }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> outbox::Result<()> {
//! let store = MemoryOutbox::new();
//! store.enqueue(NewMessage::event(&OrderPlaced { order_id: 7 })?).await?;
//!
//! let placed = assert_enqueued::<OrderPlaced>(&store, |order| order.order_id == 7).await;
//! assert_eq!(placed, OrderPlaced { order_id: 7 });
//! assert_eq!(enqueued::<OrderPlaced>(&store).await.len(), 1);
//! # Ok(())
//! # }
//! ```
//!
//! [`MemoryOutbox`]: crate::MemoryOutbox

use std::any::Any;
use std::fmt::Debug;
use std::sync::{Arc, Mutex, PoisonError};

use serde::de::DeserializeOwned;

use crate::kind::MessageKind;
use crate::message::{ClaimedMessage, OutboxMessage};
use crate::payload::{Event, Job};
use crate::store::{ListMessages, OutboxAdmin};
use crate::transport::{DeliveryContext, DeliveryResult};

/// Every stored message of `kind` named `name`, whatever its status, in
/// enqueue order (`created_at`, then id).
///
/// # Panics
///
/// When the store fails to list them.
pub async fn stored<S: OutboxAdmin>(
    store: &S,
    kind: MessageKind,
    name: &str,
) -> Vec<OutboxMessage> {
    let mut found = Vec::new();
    let mut after = None;
    loop {
        let page = store
            .list_messages(ListMessages {
                status: None,
                name: Some(name.to_owned()),
                limit: 1_000,
                after,
            })
            .await
            .unwrap_or_else(|e| panic!("listing the stored {name:?} messages failed: {e}"));
        found.extend(page.messages.into_iter().filter(|m| m.kind == kind));
        match page.next {
            Some(next) => after = Some(next),
            None => return found,
        }
    }
}

/// The payloads of every stored event of type `E` (pending, claimed,
/// delivered or dead-lettered), decoded, in enqueue order.
///
/// # Panics
///
/// When the store fails, or a stored payload of `E`'s name does not decode
/// as `E`.
pub async fn enqueued<E: Event>(store: &impl OutboxAdmin) -> Vec<E> {
    decode_all(stored(store, MessageKind::Event, E::NAME).await)
}

/// The payloads of every stored job of type `J`, decoded, in enqueue order.
///
/// # Panics
///
/// As [`enqueued`].
pub async fn enqueued_jobs<J: Job>(store: &impl OutboxAdmin) -> Vec<J> {
    decode_all(stored(store, MessageKind::Job, J::NAME).await)
}

/// The first stored event of type `E` whose payload satisfies `matches`.
///
/// # Panics
///
/// When there is none, listing the events of `E`'s name that are stored;
/// and as [`enqueued`].
pub async fn assert_enqueued<E: Event>(
    store: &impl OutboxAdmin,
    matches: impl Fn(&E) -> bool,
) -> E {
    let messages = stored(store, MessageKind::Event, E::NAME).await;
    find(messages, "event", E::NAME, matches)
}

/// The first stored job of type `J` whose payload satisfies `matches`.
///
/// # Panics
///
/// As [`assert_enqueued`].
pub async fn assert_job_enqueued<J: Job>(
    store: &impl OutboxAdmin,
    matches: impl Fn(&J) -> bool,
) -> J {
    let messages = stored(store, MessageKind::Job, J::NAME).await;
    find(messages, "job", J::NAME, matches)
}

fn decode<T: DeserializeOwned>(message: &OutboxMessage) -> T {
    message.payload.decode().unwrap_or_else(|e| {
        panic!(
            "the payload of message {} ({:?}) does not decode as {}: {e}; it is {}",
            message.id,
            message.name,
            std::any::type_name::<T>(),
            message.payload.as_str()
        )
    })
}

fn decode_all<T: DeserializeOwned>(messages: Vec<OutboxMessage>) -> Vec<T> {
    messages.iter().map(decode).collect()
}

fn find<T: DeserializeOwned>(
    messages: Vec<OutboxMessage>,
    kind: &str,
    name: &str,
    matches: impl Fn(&T) -> bool,
) -> T {
    let mut seen = Vec::new();
    for message in &messages {
        let payload: T = decode(message);
        if matches(&payload) {
            return payload;
        }
        seen.push(format!(
            "  {} ({}): {}",
            message.id,
            message.status,
            message.payload.as_str()
        ));
    }
    if seen.is_empty() {
        panic!("no {kind} {name:?} was enqueued");
    }
    panic!(
        "no {kind} {name:?} that matches was enqueued; the {} stored:\n{}",
        seen.len(),
        seen.join("\n")
    );
}

/// One delivery a [`RecordingHandler`] received.
#[derive(Clone)]
struct Record {
    /// The message as claimed: id, name, attempt, `available_at`.
    message: ClaimedMessage,
    /// The decoded payload, to hand back by type.
    payload: Arc<dyn Any + Send + Sync>,
}

/// A handler that records every delivery it receives, decoded, and
/// succeeds: register it with an in-process transport, run the drain, then
/// ask what arrived, by type.
///
/// Clones share the record, so keep one and hand clones to the transports.
///
/// ```
/// use outbox::prelude::*;
/// use outbox::testing::RecordingHandler;
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct OrderPlaced { order_id: u64 }
/// impl Event for OrderPlaced { const NAME: &'static str = "order.placed"; }
///
/// let recorder = RecordingHandler::new();
/// let bus = InProcessBus::new().on(recorder.event::<OrderPlaced>());
/// // ... start a drain with `bus`, enqueue, drain ...
/// assert!(recorder.received::<OrderPlaced>().is_empty());
/// # let _ = bus;
/// ```
#[derive(Clone, Default)]
pub struct RecordingHandler {
    /// Every delivery, in the order the handlers ran.
    records: Arc<Mutex<Vec<Record>>>,
}

impl Debug for RecordingHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordingHandler")
            .field("deliveries", &self.len())
            .finish()
    }
}

impl RecordingHandler {
    /// A recorder that has received nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// A handler for events of type `E`, for
    /// [`InProcessBus::on`](crate::InProcessBus::on): it records each event
    /// and succeeds.
    pub fn event<E: Event>(
        &self,
    ) -> impl Fn(Arc<E>, DeliveryContext) -> std::future::Ready<DeliveryResult> + Send + Sync + 'static
    {
        let records = self.records.clone();
        move |event, context| {
            record(&records, &context, event);
            std::future::ready(Ok(()))
        }
    }

    /// A handler for jobs of type `J`, for
    /// [`InProcessJobs::on`](crate::InProcessJobs::on): it records each job
    /// and succeeds.
    pub fn job<J: Job>(
        &self,
    ) -> impl Fn(J, DeliveryContext) -> std::future::Ready<DeliveryResult> + Send + Sync + 'static
    {
        let records = self.records.clone();
        move |job, context| {
            record(&records, &context, Arc::new(job));
            std::future::ready(Ok(()))
        }
    }

    /// The payloads of type `T` received so far, in delivery order (a
    /// message delivered twice appears twice).
    pub fn received<T: Send + Sync + 'static>(&self) -> Vec<Arc<T>> {
        self.lock()
            .iter()
            .filter_map(|record| record.payload.clone().downcast::<T>().ok())
            .collect()
    }

    /// The messages received so far, of every type, in delivery order: ids,
    /// names, attempts and `available_at` (a scheduled message's slot).
    pub fn messages(&self) -> Vec<ClaimedMessage> {
        self.lock()
            .iter()
            .map(|record| record.message.clone())
            .collect()
    }

    /// How many deliveries were received, of every type.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// `true` while nothing was received.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forget everything received so far.
    pub fn clear(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Record>> {
        // A panicking test thread must not hide what was recorded.
        self.records.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn record<T: Send + Sync + 'static>(
    records: &Mutex<Vec<Record>>,
    context: &DeliveryContext,
    payload: Arc<T>,
) {
    records
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(Record {
            message: context.message().clone(),
            payload,
        });
}
