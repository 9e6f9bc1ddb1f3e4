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
//! let id = store.enqueue(NewMessage::event(&OrderPlaced { order_id: 7 })?).await?.into_id();
//!
//! let batch = store
//!     .claim_batch(ClaimBatch { on_dead_letter: Default::default(), limit: 10, now: outbox::SystemClock.now(), lease: std::time::Duration::from_secs(30), max_attempts: outbox::DEFAULT_MAX_ATTEMPTS, queues: Vec::new(), durable: true })
//!     .await?;
//! assert_eq!(batch.claimed[0].id, id);
//! # Ok(())
//! # }
//! ```
//!
//! # Guide
//!
//! The guide explains what these items are for: [enqueueing](https://github.com/outbox-rs/outbox/blob/main/docs/src/enqueueing.md)
//! (transactions, ids, idempotency, ordering keys, delays), the
//! [stores](https://github.com/outbox-rs/outbox/blob/main/docs/src/stores.md) (memory, SQLite, PostgreSQL, `AnyOutbox`,
//! migrations), and the [guarantees](https://github.com/outbox-rs/outbox/blob/main/docs/src/guarantees.md) every store keeps.
//!
//! # Layout
//!
//! One concept per file. The modules are private: everything public is
//! re-exported flat at the crate root (and the common names in [`prelude`]),
//! except the store implementers' toolkit, [`kit`]. Each module imports only
//! modules listed before it, so the list reads from the leaves up to the
//! store port, which builds on all of them.
//!
//! - `kind`: [`MessageKind`] (event or job) and [`MessageStatus`], the two
//!   enums every other module names.
//! - `database`: [`DatabaseKind`], which database a SQL store speaks to.
//! - `limits`: the bounds and defaults that configuration, retry policies,
//!   messages and stores all share ([`MAX_DURATION`], [`MIN_LEASE`],
//!   [`DEFAULT_MAX_ATTEMPTS`]).
//! - `clock`: [`Clock`], with [`SystemClock`] and the test clock [`TokioClock`].
//! - `error`: [`Error`] and its parts; [`ClaimError`] is the one the
//!   runtime treats as confirmed loss of a claim. Also what a delivery fails
//!   with, [`DeliveryError`], and [`ErrorRecord`], its size-bounded form kept
//!   in `last_error`.
//! - `retry`: [`RetryPolicy`], exponential backoff with cap and seedable jitter.
//! - `queue`: named queues and priorities: [`DEFAULT_QUEUE`], the bounds
//!   on names and priorities ([`MAX_QUEUE_NAME_LEN`], [`MIN_PRIORITY`],
//!   [`MAX_PRIORITY`]), and [`QueueConfig`], how a drain serves a queue.
//! - `payload`: what a message carries: the JSON [`Payload`], the
//!   [`Event`] and [`Job`] traits payload types implement (a job names its
//!   retry policy), and the [`RawMessage`] a catch-all decodes into.
//! - `trace`: trace propagation, the [`TraceCarrier`] a message takes from
//!   enqueue to delivery.
//! - `message`: the stored [`OutboxMessage`], the [`ClaimedMessage`] a
//!   delivery sees, and the [`NewMessage`] enqueue takes; also
//!   [`RetryPolicy::max_attempts_for`], the attempt cap of one claimed
//!   message.
//! - `config`: [`DrainConfig`], validated, with humantime durations.
//! - `registry`: the [`Registry`] of payload types by name, which decodes
//!   stored payloads at delivery.
//! - `transport`: the [`EventBus`] and [`JobDispatcher`] traits, and the
//!   in-process [`InProcessBus`] and [`InProcessJobs`].
//! - `store`: the stores, one folder, also listed leaves first (every file
//!   in it builds on the port in `store/mod.rs`; see that module's notes).
//!   - `store/mod.rs`: the port. [`OutboxStore`] is the drain path (enqueue,
//!     claim, renew, settle, release), [`OutboxAdmin`] the operator path;
//!     each operation takes a parameter struct with the caller's `now`.
//!   - `store/kit.rs`: [`kit`], the toolkit for implementing a store.
//!   - `store/connect.rs`: database URLs checked, connection failures named.
//!   - `store/memory/`: [`MemoryOutbox`], the full contract in process
//!     memory, for tests, demos and benchmarks: `index.rs` its index engine,
//!     `mod.rs` its operations.
//!   - `store/fenced.rs`: fenced writes to claimed messages (renewals and
//!     settlements), sent one by one or coalesced into one statement, as
//!     `SettlementMode` says.
//!   - `store/sql/`: what the two SQL stores share, written once, one file
//!     per concern: `TableName` (`table.rs`), migrations rendered per
//!     table (`migrate.rs`), shared SQL text (`statements.rs`), the backend
//!     trait (`backend.rs`), rows (`row.rs`), errors and refusals
//!     (`errors.rs`), the generic store (`store.rs`) and the macro that
//!     writes each store's public impls (`facade.rs`).
//!   - `store/sqlite/`: `SqliteOutbox` (feature `sqlite`, the default):
//!     the store, its builder and core (`mod.rs`), SQL text
//!     (`statements.rs`), enqueue, claim, fenced writes and listing (a file
//!     each).
//!   - `store/postgres/`: `PostgresOutbox` (feature `postgres`): the same
//!     files, and its `LISTEN`/`NOTIFY` wake-up listener (`listener.rs`).
//!   - `store/any.rs`: `AnyOutbox`, either SQL store chosen by URL at
//!     start-up, with `AnyTransaction` to enqueue in a transaction of
//!     either database.
//!   - `store/schedules.rs`: what a store keeps for periodic schedules:
//!     [`ScheduleStore`] (declare a schedule, enqueue one of its slots
//!     once) and the [`ScheduleState`] operators read; each store adds a
//!     `schedules.rs` of its own.
//! - `testing` (feature `testing`): [`testing`], helpers for an
//!   application's own tests: what was enqueued, by type, and a handler
//!   that records what was delivered.
//! - `inbox`: the consumer's side (features `sqlite`, `postgres`): record
//!   a relayed message's id in the transaction that applies it, so its
//!   effects apply once (`InboxStore`, `SqliteInbox`, `PostgresInbox`),
//!   and delete old records by a window (`InboxRetention`). Its table
//!   comes with the outbox's migrations.
//!
//! A file's tests beyond a few cases live beside it, in a `tests.rs` of the
//! folder named after it (`config/tests.rs`, `store/fenced/tests.rs`, ...).
//!
//! Both SQL stores add enqueue inside the caller's own sqlx transaction.
//!
//! # Features
//!
//! - `sqlite` (default): the embedded store.
//! - `postgres`: the distributed store.
//! - `opentelemetry`: capture the current span's trace context at enqueue as
//!   a W3C [`TraceCarrier`] and turn stored carriers back into OpenTelemetry
//!   contexts; see [`TraceCarrier`].
//! - `testing`: the [`testing`] module, for an application's tests (enable
//!   it in `[dev-dependencies]`).
#![cfg_attr(docsrs, feature(doc_cfg))]

mod clock;
mod config;
mod database;
mod error;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod inbox;
mod kind;
mod limits;
mod message;
mod payload;
mod queue;
mod registry;
mod retry;
mod store;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;
mod trace;
mod transport;

pub use clock::{Clock, SharedClock, SystemClock, TokioClock};
pub use config::{DrainConfig, OrderingConfig, RetentionConfig, SettlementConfig};
pub use database::DatabaseKind;
pub use error::{
    AbandonedClaimError, AdminError, ClaimError, ClaimLoss, ConfigError, ConfigViolation,
    DeliveryError, Error, ErrorRecord, MAX_ERROR_RECORD_BYTES, RegistryError, Result, SharedError,
    UnreadableMessage, UrlError,
};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use inbox::{
    InboxRetention, InboxStore, MAX_CONSUMER_LEN, MAX_INBOX_ID_LEN, PurgeInbox, Recorded,
};
#[cfg(feature = "postgres")]
pub use inbox::{PostgresInbox, PostgresInboxBuilder};
#[cfg(feature = "sqlite")]
pub use inbox::{SqliteInbox, SqliteInboxBuilder};
pub use kind::{MessageKind, MessageStatus};
pub use limits::{DEFAULT_MAX_ATTEMPTS, MAX_DURATION, MAX_ENQUEUE_BATCH, MIN_LEASE};
pub use message::{
    ClaimedMessage, EnqueueOptions, Enqueued, Idempotency, MAX_KEY_LEN, NewMessage, OnDeadLetter,
    OutboxMessage,
};
pub use payload::{DecodedPayload, Event, Job, Payload, RawMessage};
pub use queue::{DEFAULT_QUEUE, MAX_PRIORITY, MAX_QUEUE_NAME_LEN, MIN_PRIORITY, QueueConfig};
pub use registry::{Registry, RegistryBuilder};
pub use retry::{RetryPolicy, ShouldRetry};
/// The sqlx the SQL stores are built on, so an application's transactions
/// and the outbox's always agree on its version.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "sqlite", feature = "postgres"))))]
pub use sqlx;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use store::any::{AnyColumn, AnyOutbox, AnyOutboxOptions, AnyTransaction, OpenMode, SqlValue};
pub use store::kit;
pub use store::memory::MemoryOutbox;
#[cfg(feature = "postgres")]
pub use store::postgres::{MIGRATOR as POSTGRES_MIGRATOR, PostgresOutbox, PostgresOutboxBuilder};
pub use store::schedules::{
    DeclareSchedule, EnqueueSlot, MAX_SCHEDULE_NAME_LEN, ScheduleState, ScheduleStore, SlotOutcome,
    schedule_name_problem, slot_key,
};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use store::sql::{MAX_TABLE_NAME_PART, SettlementMode, TableName};
#[cfg(feature = "sqlite")]
pub use store::sqlite::{
    DEFAULT_BUSY_TIMEOUT, MIGRATOR as SQLITE_MIGRATOR, SqliteOutbox, SqliteOutboxBuilder,
};
pub use store::{
    ArmOutcome, ArmWakeups, BlockedKey, CancelMessages, CancelReport, ClaimBatch, ClaimedBatch,
    DynOutboxStore, Lease, ListCursor, ListMessages, MarkDelivered, MarkFailed, MessagePage,
    MinuteActivity, OutboxAdmin, OutboxStats, OutboxStore, PauseQueue, PurgeBatch, PurgeMessages,
    QueueLimit, QueueState, ReleaseClaim, RenewClaim, RequeueDeadLetters, RetryNow, SharedStore,
    SkipDeadLetter, Wakeups,
};
pub use trace::TraceCarrier;
pub use transport::{
    CancelToken, Delivery, DeliveryContext, DeliveryResult, EventBus, InProcessBus, InProcessJobs,
    JobDispatcher, Registration, ServedNames,
};

/// The names most programs need: `use outbox::prelude::*;`.
pub mod prelude {
    pub use crate::{
        ClaimBatch, Clock, DeliveryContext, DeliveryError, DeliveryResult, DrainConfig, Enqueued,
        Event, InProcessBus, InProcessJobs, Job, MemoryOutbox, NewMessage, OutboxAdmin,
        OutboxStore, Registry, RetryPolicy,
    };
}
