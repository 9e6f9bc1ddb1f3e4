//! A transactional outbox.
//!
//! An application writes its business rows **and** an outbox message in one
//! database transaction. A drain (the `outbox-actors` crate runs one inside
//! an actix system) claims pending messages under a lease, delivers each to
//! an in-process event bus or job dispatcher, keeps the lease alive while the
//! delivery runs, and settles the message (delivered, retry later,
//! dead-letter) only while its claim token still owns it. Delivery is
//! at-least-once; the claim token fences every write, so a worker that lost
//! its lease can never overwrite the outcome of the worker that holds it now.
//!
//! This crate is everything but the runtime, and pulls in no actix: a web
//! handler that only enqueues depends on it alone.
//!
//! # Layout
//!
//! - [`message`]: the stored [`OutboxMessage`], the [`ClaimedMessage`] a
//!   delivery sees, the [`NewMessage`] enqueue takes, and [`ErrorRecord`],
//!   the size-bounded form of a delivery error kept in `last_error`.
//! - [`store`]: the store port. [`OutboxStore`] is the drain path (enqueue,
//!   claim, renew, settle, release), [`OutboxAdmin`] the operator path; each
//!   operation takes a parameter struct with the caller's `now`.
//!   [`MemoryOutbox`] implements both; so do `SqliteOutbox` (`store::sqlite`,
//!   feature `sqlite`, the default) and `PostgresOutbox` (`store::postgres`,
//!   feature `postgres`), which add enqueue inside the caller's own sqlx
//!   transaction. `store::sql` holds what the two share: table names,
//!   migrations rendered per table, settlement batching.
//! - [`registry`]: [`Event`] and [`Job`] payload types registered by name in a
//!   [`Registry`], which decodes stored payloads at delivery.
//! - [`transport`]: the [`EventBus`] and [`JobDispatcher`] traits, the
//!   in-process [`InProcessBus`] and [`InProcessJobs`], and [`DeliveryError`].
//! - [`retry`]: [`RetryPolicy`], exponential backoff with cap and seedable jitter.
//! - [`config`]: [`DrainConfig`], validated, with humantime durations.
//! - [`clock`]: [`Clock`], with [`SystemClock`] and the test clock [`TokioClock`].
//! - [`error`]: [`Error`] and its parts; [`ClaimError`] is the one the
//!   runtime treats as confirmed loss of a claim.
//! - [`trace`]: trace propagation, the [`TraceCarrier`] a message takes from
//!   enqueue to delivery.
//!
//! # Features
//!
//! - `sqlite` (default): the embedded store.
//! - `postgres`: the distributed store.
//! - `opentelemetry`: capture the current span's trace context at enqueue as
//!   a W3C [`TraceCarrier`] and turn stored carriers back into OpenTelemetry
//!   contexts; see [`trace`].
//!
//! # Example
//!
//! ```
//! use outbox::prelude::*;
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct OrderPlaced { order_id: u64 }
//! impl Event for OrderPlaced { const NAME: &'static str = "order.placed"; }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> outbox::Result<()> {
//! let store = MemoryOutbox::new();
//! let id = store.enqueue(NewMessage::event(&OrderPlaced { order_id: 7 })?).await?;
//!
//! let batch = store
//!     .claim_batch(ClaimBatch { limit: 10, now: outbox::clock::SystemClock.now(), lease: std::time::Duration::from_secs(30) })
//!     .await?;
//! assert_eq!(batch.claimed[0].id, id);
//! # Ok(())
//! # }
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod clock;
pub mod config;
pub mod error;
pub mod message;
pub mod registry;
pub mod retry;
pub mod store;
pub mod trace;
pub mod transport;

pub use clock::{Clock, SharedClock, SystemClock, TokioClock};
pub use config::{DrainConfig, SettlementConfig};
pub use error::{
    AbandonedClaimError, AdminError, ClaimError, ClaimLoss, ConfigError, ConfigViolation, Error,
    RegistryError, Result,
};
pub use message::{
    ClaimedMessage, DEFAULT_MAX_ATTEMPTS, ErrorRecord, MessageKind, MessageStatus, NewMessage,
    OutboxMessage, Payload, TraceCarrier,
};
pub use registry::{Event, Job, RawMessage, Registry, RegistryBuilder};
pub use retry::RetryPolicy;
/// The sqlx the SQL stores are built on, so an application's transactions
/// and the outbox's always agree on its version.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "sqlite", feature = "postgres"))))]
pub use sqlx;
pub use store::memory::MemoryOutbox;
#[cfg(feature = "postgres")]
pub use store::postgres::PostgresOutbox;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use store::sql::{SettlementMode, TableName};
#[cfg(feature = "sqlite")]
pub use store::sqlite::SqliteOutbox;
pub use store::{
    ClaimBatch, ClaimedBatch, DynOutboxStore, ListCursor, ListMessages, MarkDelivered, MarkFailed,
    MessagePage, OutboxAdmin, OutboxStats, OutboxStore, PurgeMessages, ReleaseClaim, RenewClaim,
    RequeueDeadLetters, SharedStore, Wakeups,
};
pub use transport::{
    Delivery, DeliveryContext, DeliveryError, DeliveryResult, EventBus, InProcessBus,
    InProcessJobs, JobDispatcher,
};

/// The names most programs need: `use outbox::prelude::*;`.
pub mod prelude {
    pub use crate::{
        ClaimBatch, Clock, DeliveryContext, DeliveryError, DeliveryResult, DrainConfig, Event,
        InProcessBus, InProcessJobs, Job, MemoryOutbox, NewMessage, OutboxAdmin, OutboxStore,
        Registry, RetryPolicy,
    };
}
