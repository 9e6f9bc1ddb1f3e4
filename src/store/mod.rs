//! The store port: what the drain runtime and operators need from storage.
//!
//! [`OutboxStore`] is the drain path (enqueue, claim, renew, settle,
//! release); [`OutboxAdmin`] is the operator path (count, list, inspect,
//! requeue, purge, pause and resume queues, cancel). Every operation takes
//! `now` from the caller, so one conformance suite drives every store on a
//! virtual clock, and every write to a claimed message is fenced by its
//! claim token *and* a live lease.
//!
//! # Which clock
//!
//! [`MemoryOutbox`](crate::MemoryOutbox) and the SQLite store run on one
//! machine and use the caller's `now` for everything. The PostgreSQL store
//! is shared by workers on many machines and judges leases by the server's
//! clock (claims, renewals, fenced writes, live-claim counts), so clock skew
//! cannot hand a live lease to a second worker. Every store returns a
//! claim's and a renewal's `locked_until` as `now + lease` on the caller's
//! clock: a deadline the caller can keep with its own clock, which the
//! store's lease outlasts.
//!
//! # Layout
//!
//! Leaves first: each file imports only files listed before it (and the
//! port, which every store builds on).
//!
//! - `mod.rs` (this module): the drain path of the port, [`OutboxStore`],
//!   its parameter and result types, [`Wakeups`], [`DynOutboxStore`].
//! - `admin.rs`: the operator path, [`OutboxAdmin`], its parameter and
//!   result types.
//! - [`kit`]: the toolkit for implementing a store (input checks, lease
//!   arithmetic, the wake-up sender, id and token generators).
//! - `connect.rs`: checking database URLs before connecting, and naming
//!   connection failures and a missing table in errors that say what to do.
//! - [`memory`]: [`MemoryOutbox`](memory::MemoryOutbox), the reference
//!   store: `index.rs` (its index engine), `mod.rs` (its operations).
//! - `fenced.rs`: fenced writes (renewals and settlements), sent alone or
//!   batched into one statement, and the switch between the two,
//!   `SettlementMode`.
//! - `sql/`: what the SQL stores share, written once, one file per concern:
//!   table names and migrations rendered per table, and, behind a private
//!   trait, every operation that differs between them only in SQL text and
//!   time encoding. Its `mod.rs` lists the files.
//! - `sqlite/`: `mod.rs` (the store, its builder and core), `statements.rs`
//!   (its SQL text), `enqueue.rs`, `claim.rs`, `settle.rs` (its fenced
//!   writes), `admin.rs` (its listing).
//! - `postgres/`: the same files, and `listener.rs` (`LISTEN`/`NOTIFY`
//!   wake-ups).
//! - `any.rs`: `AnyOutbox`, either SQL store picked by URL, and
//!   `AnyTransaction`, a transaction on either database.
//!
//! Beside the port, [`schedules`] is what a store keeps for periodic
//! schedules: [`ScheduleStore`](schedules::ScheduleStore), reached through
//! [`OutboxStore::schedules`], and the rows
//! [`OutboxAdmin::list_schedules`] reads. It imports only the message model,
//! so every store file may build on it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;

use crate::error::Result;
use crate::error::{Error, ErrorRecord};
use crate::kind::MessageStatus;
use crate::message::{ClaimedMessage, Enqueued, NewMessage, OnDeadLetter, OutboxMessage};
use crate::queue::{DEFAULT_QUEUE, check_queue_name};

mod admin;

pub(crate) use admin::merge_activity;
pub use admin::{
    BlockedKey, CancelMessages, CancelReport, ListCursor, ListMessages, MessagePage,
    MinuteActivity, OutboxAdmin, OutboxStats, PauseQueue, PurgeMessages, QueueState,
    RequeueDeadLetters, RetryNow, SkipDeadLetter,
};
use schedules::ScheduleStore;

#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "sqlite", feature = "postgres"))))]
pub(crate) mod any;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) mod connect;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod fenced;
pub mod kit;
pub(crate) mod memory;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub(crate) mod postgres;
pub(crate) mod schedules;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "sqlite", feature = "postgres"))))]
pub(crate) mod sql;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub(crate) mod sqlite;

/// Claim up to `limit` eligible messages under a lease of `lease`, from the
/// queues of [`ClaimBatch::queues`] (by default the `default` queue), at
/// most each queue's own limit from each.
///
/// Eligible: in a queue the claim serves that is not paused, `Pending` with
/// `available_at <= now`, or `Claimed` with `locked_until <= now`. Within a
/// queue, higher priority first, then oldest `available_at`, then
/// `created_at`, then enqueue order; a claim cut short by `limit` keeps the
/// first messages in that order over all its queues. A selected message
/// that already used its attempt cap (its own when it was set at enqueue,
/// otherwise its queue's [`QueueLimit::max_attempts`], else
/// [`ClaimBatch::max_attempts`]) is dead-lettered with an abandoned-claim
/// error instead of claimed; an expired claim whose cancellation was
/// requested ([`OutboxAdmin::cancel_messages`]) is cancelled instead.
/// Claimed, dead-lettered and cancelled together never exceed `limit`.
///
/// A message with an ordering key is eligible only when no earlier message
/// of its key in its queue (lower enqueue sequence) is pending or claimed,
/// no later one is claimed, and, with [`OnDeadLetter::Block`], no earlier
/// one is a dead letter that was not skipped. So a claim takes at most the
/// head of each key, and a retried head keeps its place; a key's order
/// holds within its queue, whatever the priorities.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimBatch {
    /// Whether an earlier dead letter holds the later messages of its
    /// ordering key; the drain's `ordering.on_dead_letter`.
    pub on_dead_letter: OnDeadLetter,
    /// Most messages to select; at least 1.
    pub limit: usize,
    /// The caller's clock, read before the call. A store that judges leases
    /// by its own clock (PostgreSQL) uses it only for the deadline it
    /// returns.
    pub now: DateTime<Utc>,
    /// Lease length; `locked_until = now + lease`.
    pub lease: Duration,
    /// The attempt cap of messages enqueued without one of their own: the
    /// drain's `retry.max_attempts`, or
    /// [`DEFAULT_MAX_ATTEMPTS`](crate::DEFAULT_MAX_ATTEMPTS); at least 1.
    /// Claimed messages carry the cap that applied to them.
    pub max_attempts: u32,
    /// The queues to claim from, each with the most messages to take from
    /// it; no queue twice. Empty: the `default` queue alone, up to `limit`.
    pub queues: Vec<QueueLimit>,
    /// Whether the claim must be durable when the call returns. The drain
    /// asks for that when some of the messages may wait for a handler: a
    /// store crash that undid their claim would otherwise let their
    /// handlers run while the messages are pending again, to be delivered
    /// a second time. When `false` the drain has an idle handler for every
    /// message it asked for, and a store may answer before the claim is
    /// durable (PostgreSQL then commits without waiting for its WAL
    /// flush): a crash delivers again at most what was already running.
    /// A store whose every commit is equally durable ignores it.
    pub durable: bool,
}

/// One queue a claim takes messages from; see [`ClaimBatch::queues`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueLimit {
    /// The queue's name.
    pub queue: String,
    /// Most messages to take from it; at least 1 (capped by the claim's
    /// `limit`).
    pub limit: usize,
    /// The attempt cap of its messages enqueued without one (the queue's
    /// own retry policy's); `None`: the claim's
    /// [`max_attempts`](ClaimBatch::max_attempts).
    pub max_attempts: Option<u32>,
}

impl QueueLimit {
    /// Up to `limit` messages from `queue`, under the claim's attempt cap.
    pub fn new(queue: impl Into<String>, limit: usize) -> Self {
        QueueLimit {
            queue: queue.into(),
            limit,
            max_attempts: None,
        }
    }
}

impl ClaimBatch {
    /// The queues this claim serves, each with its limit (at most the
    /// claim's) and its attempt cap resolved; the `default` queue when
    /// [`ClaimBatch::queues`] is empty. Refuses a bad name, a zero limit or
    /// cap, or a queue named twice, as an input error naming `queues`.
    pub fn served(&self) -> Result<Vec<QueueLimit>> {
        if self.queues.is_empty() {
            return Ok(vec![QueueLimit {
                queue: DEFAULT_QUEUE.to_owned(),
                limit: self.limit,
                max_attempts: Some(self.max_attempts),
            }]);
        }
        let mut served: Vec<QueueLimit> = Vec::with_capacity(self.queues.len());
        for queue in &self.queues {
            check_queue_name("queues", &queue.queue)?;
            if queue.limit == 0 || queue.max_attempts == Some(0) {
                return Err(Error::invalid(
                    "queues",
                    format!(
                        "queue {:?} has a limit or attempt cap of 0; give at least 1, or \
                         leave the queue out",
                        queue.queue
                    ),
                ));
            }
            if served.iter().any(|other| other.queue == queue.queue) {
                return Err(Error::invalid(
                    "queues",
                    format!("queue {:?} is named twice", queue.queue),
                ));
            }
            served.push(QueueLimit {
                queue: queue.queue.clone(),
                limit: queue.limit.min(self.limit),
                max_attempts: Some(queue.max_attempts.unwrap_or(self.max_attempts)),
            });
        }
        Ok(served)
    }
}

/// What a claim selected.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct ClaimedBatch {
    /// Messages now owned by their fresh tokens.
    pub claimed: Vec<ClaimedMessage>,
    /// Messages that had no attempts left, now dead-lettered.
    pub dead_lettered: Vec<OutboxMessage>,
    /// Expired claims whose cancellation had been requested, now cancelled.
    pub cancelled: Vec<OutboxMessage>,
}

impl ClaimedBatch {
    /// Claimed plus dead-lettered plus cancelled.
    pub fn len(&self) -> usize {
        self.claimed.len() + self.dead_lettered.len() + self.cancelled.len()
    }

    /// `true` when nothing was selected.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Extend a live claim: `locked_until = now + lease`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenewClaim {
    /// The message id.
    pub id: String,
    /// The claim token that must still own it.
    pub claim_token: String,
    /// The caller's clock.
    pub now: DateTime<Utc>,
    /// New lease length from `now`.
    pub lease: Duration,
}

/// What a renewal confirmed: see [`OutboxStore::renew_lease`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Lease {
    /// The new end of the lease, `now + lease` on the caller's clock.
    pub locked_until: DateTime<Utc>,
    /// An operator asked to cancel the message while it was claimed: its
    /// handler should stop if it can, and its settlement will record it as
    /// cancelled unless the handler succeeds.
    pub cancel_requested: bool,
}

impl Lease {
    /// A renewed lease until `locked_until`.
    pub fn new(locked_until: DateTime<Utc>, cancel_requested: bool) -> Self {
        Lease {
            locked_until,
            cancel_requested,
        }
    }
}

/// FencedWrite a claimed message as delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MarkDelivered {
    /// The message id.
    pub id: String,
    /// The claim token that must still own it.
    pub claim_token: String,
    /// The caller's clock; becomes `delivered_at`.
    pub now: DateTime<Utc>,
    /// Delete the message in the same fenced write instead of keeping it
    /// as delivered (what `RetentionConfig::delete_on_delivery` asks the
    /// runtime for). A deleted message frees its idempotency key, and the
    /// next message of its ordering key becomes claimable, as after a purge.
    pub delete: bool,
}

/// FencedWrite a claimed message as failed: retry later, or dead-letter.
#[derive(Debug, Clone, PartialEq)]
pub struct MarkFailed {
    /// The message id.
    pub id: String,
    /// The claim token that must still own it.
    pub claim_token: String,
    /// The delivery error, stored as `last_error`.
    pub error: ErrorRecord,
    /// `true` to dead-letter, `false` to make it pending again.
    pub dead_letter: bool,
    /// The caller's clock.
    pub now: DateTime<Utc>,
    /// When a retried message becomes available; `None` means `now`.
    pub retry_at: Option<DateTime<Utc>>,
}

/// Give a claim back unsettled (at shutdown): pending, available now, and the
/// attempt not counted against the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseClaim {
    /// The message id.
    pub id: String,
    /// The claim token that must still own it.
    pub claim_token: String,
    /// The caller's clock.
    pub now: DateTime<Utc>,
}

/// A signal that new messages were committed, so an idle drain can start
/// without waiting for its next tick. Bursts collapse into one wake-up.
///
/// Most stores signal every insert. A store whose signal costs its writers
/// something (PostgreSQL's `NOTIFY` serializes their commits) signals only
/// drains that said they wait for one: its wake-ups carry a [`ArmWakeups`],
/// and a drain about to wait calls it first (see [`Wakeups::arm`]).
#[derive(Debug, Clone)]
pub struct Wakeups {
    changed: tokio::sync::watch::Receiver<u64>,
    arm: Option<ArmWakeups>,
}

impl Wakeups {
    pub(crate) fn new(changed: tokio::sync::watch::Receiver<u64>, arm: Option<ArmWakeups>) -> Self {
        Wakeups { changed, arm }
    }

    /// Wait for the next wake-up; `false` once the store is gone.
    pub async fn changed(&mut self) -> bool {
        self.changed.changed().await.is_ok()
    }

    /// How to ask for the next wake-up, when inserts wake only drains that
    /// asked; `None` when every insert wakes.
    ///
    /// A drain that uses it arms before a pass's claims, and counts on a
    /// wake-up only while the last arming answered [`ArmOutcome::Armed`] and no
    /// wake-up came since: the first insert committed after arming wakes
    /// every listener and disarms them all (each arms again before its next
    /// claims). Anything committed before arming, the pass's claims see.
    pub fn arm(&self) -> Option<ArmWakeups> {
        self.arm.clone()
    }
}

/// What asking for a wake-up ([`ArmWakeups::arm`]) came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArmOutcome {
    /// Armed: the next insert committed from now on wakes every listener.
    Armed,
    /// An enqueue was between its insert and its commit, so arming now
    /// could miss it: not armed. Claim again shortly and arm again.
    EnqueueInFlight,
}

/// Asks a store to wake its listeners on the next committed insert
/// ("arming" its wake-ups), for stores whose inserts wake only drains that
/// asked, such as PostgreSQL, whose `NOTIFY` costs every enqueue a shared
/// flush; see [`Wakeups::arm`]. Cheap to clone.
#[derive(Clone)]
pub struct ArmWakeups(Arc<dyn Fn() -> BoxFuture<'static, Result<ArmOutcome>> + Send + Sync>);

impl ArmWakeups {
    /// An arm that runs `arm` each time.
    pub fn new<F, Fut>(arm: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<ArmOutcome>> + Send + 'static,
    {
        ArmWakeups(Arc::new(move || Box::pin(arm())))
    }

    /// Ask for a wake-up on the next committed insert.
    pub fn arm(&self) -> BoxFuture<'static, Result<ArmOutcome>> {
        (self.0)()
    }
}

impl std::fmt::Debug for ArmWakeups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ArmWakeups")
    }
}

/// The drain path of a store.
///
/// Every write to a claimed message applies only while `claim_token` owns it
/// and its lease is live (`locked_until > now`); otherwise it fails with
/// [`Error::Claim`](crate::Error::Claim), the one error the runtime treats
/// as confirmed loss.
///
/// `now` is the caller's clock. The memory and SQLite stores judge leases
/// by it; the PostgreSQL store judges them by the server's clock, so clock
/// skew between machines cannot hand a live lease to a second worker (see
/// "Which clock" on `PostgresOutbox`). Either way, the
/// `locked_until` a claim or renewal returns is `now + lease` on the
/// caller's clock, never later than the lease the store holds.
pub trait OutboxStore: Send + Sync + 'static {
    /// Store a new message. An id that is already stored is not an error:
    /// the answer is [`Enqueued::AlreadyExists`], nothing is written, and the
    /// stored message is left untouched; see [`Enqueued`] for what to do
    /// with each answer. Invalid input is refused with
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) before anything is
    /// written.
    fn enqueue(&self, message: NewMessage) -> impl Future<Output = Result<Enqueued>> + Send;

    /// Store a batch of new messages, all or nothing, and answer each one,
    /// in order, as [`enqueue`](OutboxStore::enqueue) would have answered
    /// it with the batch's earlier messages stored before it: a message
    /// whose id, or whose idempotency key within its window, an earlier
    /// message of the batch took answers [`Enqueued::AlreadyExists`] with
    /// that message's id, like one already stored. Each message keeps its
    /// own id, idempotency key and options, and the batch's messages take
    /// their places in enqueue order (what ordering keys follow) in the
    /// order given.
    ///
    /// Refused before anything is written: more than
    /// [`MAX_ENQUEUE_BATCH`](crate::MAX_ENQUEUE_BATCH) messages, with
    /// [`Error::BatchTooLarge`](crate::Error::BatchTooLarge); an invalid
    /// message, with its error, which names its position (see
    /// [`NewMessage::validate_batch`]). An empty batch writes nothing.
    ///
    /// The bundled stores write a batch in one statement (the SQL stores
    /// in a transaction of their own; see their `enqueue_batch_in` for one
    /// in yours) and wake drains once for it. The default enqueues the
    /// messages one at a time after checking them all, and is all or
    /// nothing only as far as a failure before the first write goes.
    fn enqueue_batch(
        &self,
        messages: Vec<NewMessage>,
    ) -> impl Future<Output = Result<Vec<Enqueued>>> + Send {
        async move {
            NewMessage::validate_batch(&messages)?;
            let mut answers = Vec::with_capacity(messages.len());
            for message in messages {
                answers.push(self.enqueue(message).await?);
            }
            Ok(answers)
        }
    }

    /// Claim eligible messages; see [`ClaimBatch`].
    fn claim_batch(&self, params: ClaimBatch) -> impl Future<Output = Result<ClaimedBatch>> + Send;

    /// Extend a live claim; returns the new `locked_until`.
    fn renew_claim(&self, params: RenewClaim)
    -> impl Future<Output = Result<DateTime<Utc>>> + Send;

    /// Extend a live claim as [`renew_claim`](OutboxStore::renew_claim)
    /// does, and say whether the message's cancellation was requested
    /// meanwhile (see [`OutboxAdmin::cancel_messages`]): the runtime's
    /// heartbeat renews with it and tells the handler. The default renews
    /// and reports no request, for stores without cancellation.
    fn renew_lease(&self, params: RenewClaim) -> impl Future<Output = Result<Lease>> + Send {
        async move {
            let locked_until = self.renew_claim(params).await?;
            Ok(Lease::new(locked_until, false))
        }
    }

    /// FencedWrite as delivered: `delivered_at = now`, claim cleared; or,
    /// with [`MarkDelivered::delete`], the message deleted under the same
    /// fence.
    fn mark_delivered(&self, params: MarkDelivered) -> impl Future<Output = Result<()>> + Send;

    /// FencedWrite as failed: dead-lettered, or pending at `retry_at`; claim
    /// cleared. A message whose cancellation was requested while it was
    /// claimed is cancelled instead (see
    /// [`settle_failure`](OutboxStore::settle_failure), which says which).
    fn mark_failed(&self, params: MarkFailed) -> impl Future<Output = Result<()>> + Send;

    /// [`mark_failed`](OutboxStore::mark_failed), answering the status the
    /// message was left in: `Pending` (a retry), `DeadLettered`, or
    /// `Cancelled` when its cancellation was requested while it was
    /// claimed. The default writes with `mark_failed` and answers what was
    /// asked for, for stores without cancellation.
    fn settle_failure(
        &self,
        params: MarkFailed,
    ) -> impl Future<Output = Result<MessageStatus>> + Send {
        async move {
            let status = if params.dead_letter {
                MessageStatus::DeadLettered
            } else {
                MessageStatus::Pending
            };
            self.mark_failed(params).await?;
            Ok(status)
        }
    }

    /// Give a claim back unsettled; see [`ReleaseClaim`].
    fn release_claim(&self, params: ReleaseClaim) -> impl Future<Output = Result<()>> + Send;

    /// Wake-ups on committed inserts, when the store can tell.
    fn wakeups(&self) -> Option<Wakeups> {
        None
    }

    /// Delete up to `limit` terminal messages of `status` settled before
    /// `older_than`, oldest first; returns how many. One bounded statement:
    /// rows other workers hold are skipped, never waited for. The default
    /// refuses, for stores that cannot delete (retention then reports the
    /// error and deletes nothing).
    fn purge_batch(&self, params: PurgeBatch) -> impl Future<Output = Result<u64>> + Send {
        let _ = params;
        std::future::ready(Err(crate::Error::invalid(
            "retention",
            "this store does not delete settled messages; leave DrainConfig.retention unset",
        )))
    }

    /// Make the space of the rows deleted so far reusable, where the store
    /// needs to be told: on PostgreSQL a plain `VACUUM` of the table (never
    /// `FULL`; reads and writes go on meanwhile, and a table another vacuum
    /// holds is skipped), after deleting the rows of `<table>_keys` whose
    /// ordering keys have nothing pending or claimed (up to 100 000 a
    /// call, none a writer holds). The runtime's retention runs call it
    /// once enough rows went (`RetentionConfig::vacuum_after`). The default
    /// does nothing, for stores that reuse freed space as rows go.
    fn vacuum(&self) -> impl Future<Output = Result<()>> + Send {
        std::future::ready(Ok(()))
    }

    /// Open and prepare, before a drain's first messages, the connections
    /// its `claims` claims in flight and its settlements will use. The
    /// runtime calls it once when a coordinator starts, in the background,
    /// and logs a failure without acting on it: the drain opens what it
    /// needs as it goes. On PostgreSQL a connection's first claim and first
    /// settlement compile the table's functions and plan their statements,
    /// tens of milliseconds on a busy server, which the first messages
    /// after a start would otherwise wait for. The default does nothing.
    fn warm_up(&self, claims: usize) -> impl Future<Output = Result<()>> + Send {
        let _ = claims;
        std::future::ready(Ok(()))
    }

    /// How many claims a drain should keep in flight at once when its
    /// config leaves `claims_in_flight` unset. Worth more than one on a
    /// store where a claim mostly waits (for a durable commit's flush, say)
    /// and concurrent claims share that wait; a store with a single writer
    /// gains nothing from more. The default is 1.
    fn claim_parallelism(&self) -> usize {
        1
    }

    /// Whether a drain whose config leaves `prefetch` unset should claim
    /// messages ahead of its free slots. Worth it where a claim's time is
    /// mostly waiting (a network round trip, a flush) that messages claimed
    /// ahead hide; not where a claim costs only CPU the handlers share, as
    /// in an in-process store, and every message held costs memory. The
    /// default is `true`.
    fn claims_ahead(&self) -> bool {
        true
    }

    /// The most messages a drain whose config leaves `prefetch` unset
    /// claims ahead, when it [claims ahead](OutboxStore::claims_ahead) at
    /// all: what makes its claims large enough that their fixed cost is
    /// small beside the rows', where more would only hold memory. The
    /// default is the most a configured `prefetch` may hold, 4 096.
    fn prefetch_limit(&self) -> usize {
        crate::config::MAX_PREFETCH
    }

    /// The store's periodic schedules, when it keeps them (the bundled
    /// stores do); `None` by default. A drain with schedules refuses to
    /// start on a store without them.
    fn schedules(&self) -> Option<&dyn ScheduleStore> {
        None
    }

    /// How many messages are `Pending` (due or not), when the store can
    /// count them cheaply; the runtime samples it after each drain pass for
    /// its pending-messages gauge. The default, `None`, leaves that gauge
    /// unreported. A store whose count scans settled rows should keep the
    /// default rather than slow every pass down.
    fn pending_count(&self) -> impl Future<Output = Result<Option<u64>>> + Send {
        std::future::ready(Ok(None))
    }
}

/// Delete one bounded batch of terminal messages of one status that settled
/// before a horizon: what retention runs, one short statement at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PurgeBatch {
    /// `Delivered`, `DeadLettered` or `Cancelled`; anything else is refused.
    pub status: MessageStatus,
    /// Only messages whose last change (`updated_at`) is before this.
    pub older_than: DateTime<Utc>,
    /// Most rows to delete; 1 to 10 000.
    pub limit: usize,
}

/// [`OutboxStore`] behind a pointer, for the runtime, which picks its store
/// at run time. Implemented for every `OutboxStore`.
pub trait DynOutboxStore: Send + Sync + 'static {
    /// See [`OutboxStore::enqueue`].
    fn enqueue(&self, message: NewMessage) -> BoxFuture<'_, Result<Enqueued>>;
    /// See [`OutboxStore::enqueue_batch`].
    fn enqueue_batch(&self, messages: Vec<NewMessage>) -> BoxFuture<'_, Result<Vec<Enqueued>>>;
    /// See [`OutboxStore::claim_batch`].
    fn claim_batch(&self, params: ClaimBatch) -> BoxFuture<'_, Result<ClaimedBatch>>;
    /// See [`OutboxStore::renew_claim`].
    fn renew_claim(&self, params: RenewClaim) -> BoxFuture<'_, Result<DateTime<Utc>>>;
    /// See [`OutboxStore::renew_lease`].
    fn renew_lease(&self, params: RenewClaim) -> BoxFuture<'_, Result<Lease>>;
    /// See [`OutboxStore::settle_failure`].
    fn settle_failure(&self, params: MarkFailed) -> BoxFuture<'_, Result<MessageStatus>>;
    /// See [`OutboxStore::mark_delivered`].
    fn mark_delivered(&self, params: MarkDelivered) -> BoxFuture<'_, Result<()>>;
    /// See [`OutboxStore::mark_failed`].
    fn mark_failed(&self, params: MarkFailed) -> BoxFuture<'_, Result<()>>;
    /// See [`OutboxStore::release_claim`].
    fn release_claim(&self, params: ReleaseClaim) -> BoxFuture<'_, Result<()>>;
    /// See [`OutboxStore::wakeups`].
    fn wakeups(&self) -> Option<Wakeups>;
    /// See [`OutboxStore::purge_batch`].
    fn purge_batch(&self, params: PurgeBatch) -> BoxFuture<'_, Result<u64>>;
    /// See [`OutboxStore::pending_count`].
    fn pending_count(&self) -> BoxFuture<'_, Result<Option<u64>>> {
        Box::pin(std::future::ready(Ok(None)))
    }
    /// See [`OutboxStore::vacuum`].
    fn vacuum(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(std::future::ready(Ok(())))
    }
    /// See [`OutboxStore::warm_up`].
    fn warm_up(&self, claims: usize) -> BoxFuture<'_, Result<()>> {
        let _ = claims;
        Box::pin(std::future::ready(Ok(())))
    }
    /// See [`OutboxStore::claim_parallelism`].
    fn claim_parallelism(&self) -> usize {
        1
    }
    /// See [`OutboxStore::claims_ahead`].
    fn claims_ahead(&self) -> bool {
        true
    }
    /// See [`OutboxStore::prefetch_limit`].
    fn prefetch_limit(&self) -> usize {
        crate::config::MAX_PREFETCH
    }
    /// See [`OutboxStore::schedules`].
    fn schedules(&self) -> Option<&dyn ScheduleStore> {
        None
    }
}

impl<S: OutboxStore> DynOutboxStore for S {
    fn enqueue(&self, message: NewMessage) -> BoxFuture<'_, Result<Enqueued>> {
        Box::pin(OutboxStore::enqueue(self, message))
    }
    fn enqueue_batch(&self, messages: Vec<NewMessage>) -> BoxFuture<'_, Result<Vec<Enqueued>>> {
        Box::pin(OutboxStore::enqueue_batch(self, messages))
    }
    fn claim_batch(&self, params: ClaimBatch) -> BoxFuture<'_, Result<ClaimedBatch>> {
        Box::pin(OutboxStore::claim_batch(self, params))
    }
    fn renew_claim(&self, params: RenewClaim) -> BoxFuture<'_, Result<DateTime<Utc>>> {
        Box::pin(OutboxStore::renew_claim(self, params))
    }
    fn renew_lease(&self, params: RenewClaim) -> BoxFuture<'_, Result<Lease>> {
        Box::pin(OutboxStore::renew_lease(self, params))
    }
    fn settle_failure(&self, params: MarkFailed) -> BoxFuture<'_, Result<MessageStatus>> {
        Box::pin(OutboxStore::settle_failure(self, params))
    }
    fn mark_delivered(&self, params: MarkDelivered) -> BoxFuture<'_, Result<()>> {
        Box::pin(OutboxStore::mark_delivered(self, params))
    }
    fn mark_failed(&self, params: MarkFailed) -> BoxFuture<'_, Result<()>> {
        Box::pin(OutboxStore::mark_failed(self, params))
    }
    fn release_claim(&self, params: ReleaseClaim) -> BoxFuture<'_, Result<()>> {
        Box::pin(OutboxStore::release_claim(self, params))
    }
    fn wakeups(&self) -> Option<Wakeups> {
        OutboxStore::wakeups(self)
    }
    fn purge_batch(&self, params: PurgeBatch) -> BoxFuture<'_, Result<u64>> {
        Box::pin(OutboxStore::purge_batch(self, params))
    }
    fn pending_count(&self) -> BoxFuture<'_, Result<Option<u64>>> {
        Box::pin(OutboxStore::pending_count(self))
    }
    fn vacuum(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(OutboxStore::vacuum(self))
    }
    fn warm_up(&self, claims: usize) -> BoxFuture<'_, Result<()>> {
        Box::pin(OutboxStore::warm_up(self, claims))
    }
    fn claim_parallelism(&self) -> usize {
        OutboxStore::claim_parallelism(self)
    }
    fn claims_ahead(&self) -> bool {
        OutboxStore::claims_ahead(self)
    }
    fn prefetch_limit(&self) -> usize {
        OutboxStore::prefetch_limit(self)
    }
    fn schedules(&self) -> Option<&dyn ScheduleStore> {
        OutboxStore::schedules(self)
    }
}

/// A store shared by the runtime's actors.
pub type SharedStore = Arc<dyn DynOutboxStore>;
