//! The store port: what the drain runtime and operators need from storage.
//!
//! [`OutboxStore`] is the drain path (enqueue, claim, renew, settle,
//! release); [`OutboxAdmin`] is the operator path (count, list, inspect,
//! requeue, purge). Every operation takes `now` from the caller, so one
//! conformance suite drives every store on a virtual clock, and every write
//! to a claimed message is fenced by its claim token *and* a live lease.
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
//! - `mod.rs` (this module): the port, [`OutboxStore`] and [`OutboxAdmin`],
//!   their parameter and result types, [`Wakeups`], [`DynOutboxStore`].
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

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;

use crate::error::Result;
use crate::error::{ErrorRecord, UnreadableMessage};
use crate::kind::MessageStatus;
use crate::message::{ClaimedMessage, Enqueued, NewMessage, OnDeadLetter, OutboxMessage};

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
#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "sqlite", feature = "postgres"))))]
pub(crate) mod sql;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub(crate) mod sqlite;

/// Claim up to `limit` eligible messages under a lease of `lease`.
///
/// Eligible: `Pending` with `available_at <= now`, or `Claimed` with
/// `locked_until <= now`. Oldest `available_at` first, then `created_at`.
/// A selected message that already used its attempt cap (its own when it was
/// set at enqueue, otherwise [`ClaimBatch::max_attempts`]) is dead-lettered
/// with an abandoned-claim error instead of claimed. Claimed and
/// dead-lettered together never exceed `limit`.
///
/// A message with an ordering key is eligible only when no earlier message
/// of its key (lower enqueue sequence) is pending or claimed, no later one
/// is claimed, and, with [`OnDeadLetter::Block`], no earlier one is a dead
/// letter that was not skipped. So a claim takes at most the head of each
/// key, and a retried head keeps its place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
}

/// What a claim selected.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct ClaimedBatch {
    /// Messages now owned by their fresh tokens.
    pub claimed: Vec<ClaimedMessage>,
    /// Messages that had no attempts left, now dead-lettered.
    pub dead_lettered: Vec<OutboxMessage>,
}

impl ClaimedBatch {
    /// Claimed plus dead-lettered.
    pub fn len(&self) -> usize {
        self.claimed.len() + self.dead_lettered.len()
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

    /// FencedWrite as delivered: `delivered_at = now`, claim cleared; or,
    /// with [`MarkDelivered::delete`], the message deleted under the same
    /// fence.
    fn mark_delivered(&self, params: MarkDelivered) -> impl Future<Output = Result<()>> + Send;

    /// FencedWrite as failed: dead-lettered, or pending at `retry_at`; claim cleared.
    fn mark_failed(&self, params: MarkFailed) -> impl Future<Output = Result<()>> + Send;

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
    /// holds is skipped). The runtime's retention runs call it once enough
    /// rows went (`RetentionConfig::vacuum_after`). The default does
    /// nothing, for stores that reuse freed space as rows go.
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

    /// How many messages are `Pending` (due or not), when the store can
    /// count them cheaply; the runtime samples it after each drain pass for
    /// its pending-messages gauge. The default, `None`, leaves that gauge
    /// unreported. A store whose count scans settled rows should keep the
    /// default rather than slow every pass down.
    fn pending_count(&self) -> impl Future<Output = Result<Option<u64>>> + Send {
        std::future::ready(Ok(None))
    }
}

/// Counts per status and the health figures an operator looks at first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct OutboxStats {
    /// Messages waiting (due or not).
    pub pending: u64,
    /// Messages under a claim (live or expired).
    pub claimed: u64,
    /// Messages delivered.
    pub delivered: u64,
    /// Messages dead-lettered.
    pub dead_lettered: u64,
    /// Claimed messages whose lease is still live at `now`.
    pub live_claims: u64,
    /// Claimed messages whose lease ran out (their worker is gone or stuck).
    pub expired_claims: u64,
    /// `available_at` of the oldest pending message that is due.
    pub oldest_due_at: Option<DateTime<Utc>>,
    /// Ordering keys held by a dead letter that was not skipped (see
    /// [`OutboxAdmin::blocked_keys`]); under
    /// [`OnDeadLetter::Skip`] they do not hold their later messages.
    pub blocked_keys: u64,
}

impl OutboxStats {
    /// The count for one status.
    pub fn count(&self, status: MessageStatus) -> u64 {
        match status {
            MessageStatus::Pending => self.pending,
            MessageStatus::Claimed => self.claimed,
            MessageStatus::Delivered => self.delivered,
            MessageStatus::DeadLettered => self.dead_lettered,
        }
    }

    /// All messages.
    pub fn total(&self) -> u64 {
        self.pending + self.claimed + self.delivered + self.dead_lettered
    }
}

/// One page of a listing, oldest first.
#[derive(Debug, Clone)]
pub struct ListMessages {
    /// Only this status, if set.
    pub status: Option<MessageStatus>,
    /// Only this name, if set.
    pub name: Option<String>,
    /// Page size; 1 to 10 000.
    pub limit: usize,
    /// Continue after this cursor (from the previous page's `next`).
    pub after: Option<ListCursor>,
}

impl Default for ListMessages {
    fn default() -> Self {
        ListMessages {
            status: None,
            name: None,
            limit: 100,
            after: None,
        }
    }
}

/// A position in a listing: `(created_at, id)` of the last message seen.
/// Stable under inserts and deletes, unlike an offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListCursor {
    /// `created_at` of the last message on the previous page.
    pub created_at: DateTime<Utc>,
    /// `id` of the last message on the previous page.
    pub id: String,
}

/// A page of messages and where the next page starts.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct MessagePage {
    /// The messages, ordered by `(created_at, id)`.
    pub messages: Vec<OutboxMessage>,
    /// The rows of this page that do not read back as messages (a payload
    /// that is not JSON, an unknown status, ...), with their raw columns and
    /// why, in the same order. They take their place in the page, so a page
    /// holds `messages.len() + unreadable.len()` rows, and one bad row never
    /// hides the others. Empty for stores that keep typed messages (memory).
    pub unreadable: Vec<UnreadableMessage>,
    /// The cursor for the next page; `None` on the last page.
    pub next: Option<ListCursor>,
}

impl MessagePage {
    /// A page of `messages`, followed by the page that starts after `next`.
    pub fn new(messages: Vec<OutboxMessage>, next: Option<ListCursor>) -> Self {
        MessagePage {
            messages,
            unreadable: Vec::new(),
            next,
        }
    }

    /// The page with these unreadable rows beside its messages.
    pub fn with_unreadable(mut self, unreadable: Vec<UnreadableMessage>) -> Self {
        self.unreadable = unreadable;
        self
    }

    /// The page of `limit` messages out of up to `limit + 1` read: a
    /// message past the limit only says that another page follows.
    pub(crate) fn of(mut messages: Vec<OutboxMessage>, limit: usize) -> Self {
        let more = messages.len() > limit;
        messages.truncate(limit);
        let next = more
            .then(|| messages.last())
            .flatten()
            .map(|last| ListCursor {
                created_at: last.created_at,
                id: last.id.clone(),
            });
        MessagePage::new(messages, next)
    }
}

/// Requeue dead letters: pending, available `now`, attempts reset to 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequeueDeadLetters {
    /// One message by id; `None` for all dead letters (of `name`, if set).
    pub id: Option<String>,
    /// Only dead letters with this name, when requeueing all.
    pub name: Option<String>,
    /// The caller's clock: requeued messages are due from then. A store
    /// that judges leases by the database's clock (PostgreSQL's default)
    /// uses the database's time instead.
    pub now: DateTime<Utc>,
}

/// Skip one dead letter of an ordering key: it stays dead-lettered, with
/// `skipped_at = now`, and no longer holds the later messages of its key.
/// Requeueing it later clears the mark.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkipDeadLetter {
    /// The dead letter's id.
    pub id: String,
    /// The caller's clock; becomes `skipped_at` (the database's time on a
    /// store that judges leases by it).
    pub now: DateTime<Utc>,
}

/// An ordering key held by a dead letter: its earliest dead letter that was
/// not skipped, and how many messages of the key wait behind it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct BlockedKey {
    /// The ordering key.
    pub ordering_key: String,
    /// The id of the dead letter that holds it.
    pub head_id: String,
    /// The head's registered name.
    pub head_name: String,
    /// Pending or claimed messages of the key after the head.
    pub waiting: u64,
}

impl BlockedKey {
    /// A blocked key, as a store reports it.
    pub fn new(ordering_key: String, head_id: String, head_name: String, waiting: u64) -> Self {
        BlockedKey {
            ordering_key,
            head_id,
            head_name,
            waiting,
        }
    }
}

/// Delete terminal messages that settled before a horizon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PurgeMessages {
    /// `Delivered` or `DeadLettered`; `None` for both. Anything else is refused.
    pub status: Option<MessageStatus>,
    /// Only messages whose last change (`updated_at`) is before this.
    pub older_than: DateTime<Utc>,
}

/// Make a pending message due now, its backoff cut short.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryNow {
    /// The message id.
    pub id: String,
    /// The caller's clock: the message becomes available at this time (or
    /// stays at its earlier `available_at`); the database's time on a store
    /// that judges leases by it.
    pub now: DateTime<Utc>,
}

/// How many messages settled in one minute, for an activity chart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct MinuteActivity {
    /// The start of the minute (UTC, whole minute).
    pub minute: DateTime<Utc>,
    /// Messages delivered in that minute (still stored, not purged).
    pub delivered: u64,
    /// Messages dead-lettered in that minute (still dead-lettered).
    pub dead_lettered: u64,
}

impl MinuteActivity {
    /// The counts of one minute.
    pub fn new(minute: DateTime<Utc>, delivered: u64, dead_lettered: u64) -> Self {
        MinuteActivity {
            minute,
            delivered,
            dead_lettered,
        }
    }
}

/// Delete one bounded batch of terminal messages of one status that settled
/// before a horizon: what retention runs, one short statement at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PurgeBatch {
    /// `Delivered` or `DeadLettered`; anything else is refused.
    pub status: MessageStatus,
    /// Only messages whose last change (`updated_at`) is before this.
    pub older_than: DateTime<Utc>,
    /// Most rows to delete; 1 to 10 000.
    pub limit: usize,
}

/// The operator path of a store.
pub trait OutboxAdmin: Send + Sync + 'static {
    /// Counts per status, live and expired claims, oldest due message.
    fn stats(&self, now: DateTime<Utc>) -> impl Future<Output = Result<OutboxStats>> + Send;

    /// One page of messages, oldest first, filtered by status and name.
    fn list_messages(
        &self,
        params: ListMessages,
    ) -> impl Future<Output = Result<MessagePage>> + Send;

    /// One message by id; [`Error::NotFound`](crate::Error::NotFound) when
    /// there is none.
    fn get_message(&self, id: &str) -> impl Future<Output = Result<OutboxMessage>> + Send;

    /// Requeue one dead letter, or all of them (of one name); returns how many.
    /// A message under a live claim is refused with
    /// [`AdminError::ClaimLive`](crate::AdminError::ClaimLive), any other
    /// non-dead-lettered message with
    /// [`AdminError::NotDeadLettered`](crate::AdminError::NotDeadLettered).
    fn requeue_dead_letters(
        &self,
        params: RequeueDeadLetters,
    ) -> impl Future<Output = Result<u64>> + Send;

    /// Mark a dead letter as skipped so the later messages of its ordering
    /// key go on; see [`SkipDeadLetter`]. Anything but a dead letter is
    /// refused with
    /// [`AdminError::NotDeadLettered`](crate::AdminError::NotDeadLettered)
    /// (or [`AdminError::ClaimLive`](crate::AdminError::ClaimLive)), an
    /// unknown id with [`Error::NotFound`](crate::Error::NotFound).
    fn skip_dead_letter(&self, params: SkipDeadLetter) -> impl Future<Output = Result<()>> + Send;

    /// Up to `limit` (1 to 10 000) ordering keys held by a dead letter that
    /// was not skipped, by key.
    fn blocked_keys(&self, limit: usize) -> impl Future<Output = Result<Vec<BlockedKey>>> + Send;

    /// Delete terminal messages settled before the horizon; returns how many.
    /// Pending and claimed messages are never touched; asking for them is
    /// refused with [`AdminError::UnsafePurge`](crate::AdminError::UnsafePurge).
    fn purge(&self, params: PurgeMessages) -> impl Future<Output = Result<u64>> + Send;

    /// How many messages [`purge`](OutboxAdmin::purge) would delete with
    /// these parameters, deleting nothing; refuses what `purge` refuses.
    fn count_purgeable(&self, params: PurgeMessages) -> impl Future<Output = Result<u64>> + Send;

    /// Delivered and dead-lettered messages per minute whose last change
    /// (`updated_at`) is at or after `since`, oldest minute first; minutes
    /// with neither are left out. Messages purged or requeued since are not
    /// counted.
    fn activity(
        &self,
        since: DateTime<Utc>,
    ) -> impl Future<Output = Result<Vec<MinuteActivity>>> + Send;

    /// Make a pending message due `now` (its backoff cut short); attempts
    /// are kept. A message under a live claim is refused with
    /// [`AdminError::ClaimLive`](crate::AdminError::ClaimLive), any other
    /// non-pending one with
    /// [`AdminError::NotPending`](crate::AdminError::NotPending), an unknown
    /// id with [`Error::NotFound`](crate::Error::NotFound).
    fn retry_now(&self, params: RetryNow) -> impl Future<Output = Result<()>> + Send;
}

/// The per-minute counts of `(minute, status, count)` rows, merged by
/// minute, oldest first.
pub(crate) fn merge_activity(
    rows: impl IntoIterator<Item = (DateTime<Utc>, MessageStatus, u64)>,
) -> Vec<MinuteActivity> {
    let mut minutes = std::collections::BTreeMap::<DateTime<Utc>, MinuteActivity>::new();
    for (minute, status, count) in rows {
        let entry = minutes
            .entry(minute)
            .or_insert_with(|| MinuteActivity::new(minute, 0, 0));
        match status {
            MessageStatus::Delivered => entry.delivered += count,
            MessageStatus::DeadLettered => entry.dead_lettered += count,
            MessageStatus::Pending | MessageStatus::Claimed => {}
        }
    }
    minutes.into_values().collect()
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
}

/// A store shared by the runtime's actors.
pub type SharedStore = Arc<dyn DynOutboxStore>;
