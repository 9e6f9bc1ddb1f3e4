//! The operator path of the store port: [`OutboxAdmin`], its parameter
//! and result types. Every operation takes the caller's `now` where time
//! matters, as the drain path does, and refuses what is unsafe (changing a
//! message under a live claim, purging unsettled messages) with an
//! [`AdminError`](crate::AdminError) naming the message and its status.

use std::future::Future;

use chrono::{DateTime, Utc};

use crate::error::{Error, Result, UnreadableMessage};
use crate::kind::MessageStatus;
use crate::message::OutboxMessage;
use crate::store::schedules::ScheduleState;

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
    /// Messages cancelled.
    pub cancelled: u64,
    /// Claimed messages whose lease is still live at `now`.
    pub live_claims: u64,
    /// Claimed messages whose lease ran out (their worker is gone or stuck).
    pub expired_claims: u64,
    /// `available_at` of the oldest pending message that is due.
    pub oldest_due_at: Option<DateTime<Utc>>,
    /// Ordering keys held by a dead letter that was not skipped (see
    /// [`OutboxAdmin::blocked_keys`]); under
    /// [`OnDeadLetter::Skip`](crate::OnDeadLetter::Skip) they do not hold their later messages.
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
            MessageStatus::Cancelled => self.cancelled,
        }
    }

    /// All messages.
    pub fn total(&self) -> u64 {
        self.pending + self.claimed + self.delivered + self.dead_lettered + self.cancelled
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
    /// The queue the key is in: a key's order holds within its queue.
    pub queue: String,
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
    /// A blocked key, as a store reports it, in the default queue.
    pub fn new(ordering_key: String, head_id: String, head_name: String, waiting: u64) -> Self {
        BlockedKey {
            queue: crate::queue::DEFAULT_QUEUE.to_owned(),
            ordering_key,
            head_id,
            head_name,
            waiting,
        }
    }

    /// The same key, in `queue`.
    pub fn in_queue(mut self, queue: String) -> Self {
        self.queue = queue;
        self
    }
}

/// Delete terminal messages that settled before a horizon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PurgeMessages {
    /// `Delivered`, `DeadLettered` or `Cancelled`; `None` for all three.
    /// Anything else is refused.
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

/// Pause one queue: see [`OutboxAdmin::pause_queue`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PauseQueue {
    /// The queue; it need not hold any message yet.
    pub queue: String,
    /// The caller's clock; becomes the pause's `paused_at` (the database's
    /// time on a store that judges leases by it).
    pub now: DateTime<Utc>,
}

/// A queue as an operator sees it: what waits in it, and whether it is
/// paused.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct QueueState {
    /// The queue's name.
    pub queue: String,
    /// Its pending messages, due or not.
    pub pending: u64,
    /// Its messages under a claim, live or expired.
    pub claimed: u64,
    /// When it was paused; `None` while it is served.
    pub paused_at: Option<DateTime<Utc>>,
}

impl QueueState {
    /// A queue, as a store reports it.
    pub fn new(
        queue: String,
        pending: u64,
        claimed: u64,
        paused_at: Option<DateTime<Utc>>,
    ) -> Self {
        QueueState {
            queue,
            pending,
            claimed,
            paused_at,
        }
    }

    /// `true` while the queue is paused.
    pub fn is_paused(&self) -> bool {
        self.paused_at.is_some()
    }
}

/// Cancel one message by id, or every pending and claimed message matching
/// a filter; see [`OutboxAdmin::cancel_messages`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CancelMessages {
    /// One message; not with the filters.
    pub id: Option<String>,
    /// Only messages with this name.
    pub name: Option<String>,
    /// Only messages with this ordering key.
    pub ordering_key: Option<String>,
    /// Only messages in this queue.
    pub queue: Option<String>,
    /// Count what would be cancelled, changing nothing.
    pub dry_run: bool,
    /// The caller's clock: cancelled messages are stamped with it, and it
    /// tells a live claim from an expired one (the database's time on a
    /// store that judges leases by it).
    pub now: DateTime<Utc>,
}

impl CancelMessages {
    /// Cancel the message `id`.
    pub fn id(id: impl Into<String>, now: DateTime<Utc>) -> Self {
        CancelMessages {
            id: Some(id.into()),
            now,
            ..Default::default()
        }
    }

    /// Cancel every pending and claimed message, of the filters set with
    /// [`CancelMessages::name`], [`CancelMessages::ordering_key`] and
    /// [`CancelMessages::queue`] (at least one).
    pub fn matching(now: DateTime<Utc>) -> Self {
        CancelMessages {
            now,
            ..Default::default()
        }
    }

    /// Only messages with this name.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Only messages with this ordering key.
    pub fn ordering_key(mut self, key: impl Into<String>) -> Self {
        self.ordering_key = Some(key.into());
        self
    }

    /// Only messages in this queue.
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = Some(queue.into());
        self
    }

    /// Count, changing nothing.
    pub fn dry_run(mut self, dry_run: bool) -> Self {
        self.dry_run = dry_run;
        self
    }
}

/// What a cancel did (or, dry, would do).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct CancelReport {
    /// Messages now `Cancelled`: pending ones (due or scheduled), and
    /// claimed ones whose lease had run out.
    pub cancelled: u64,
    /// Messages under a live claim whose cancellation was requested: their
    /// handlers can see it, and their settlement records them as cancelled
    /// unless the handler succeeds.
    pub requested: u64,
}

impl CancelReport {
    /// A cancel's counts, as a store reports them.
    pub fn new(cancelled: u64, requested: u64) -> Self {
        CancelReport {
            cancelled,
            requested,
        }
    }

    /// Every message the cancel matched.
    pub fn total(&self) -> u64 {
        self.cancelled + self.requested
    }
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

    /// Pause a queue: from each drain's next claim on, nothing more is
    /// claimed from it (running deliveries finish and settle as usual;
    /// other queues go on). Kept in the store, so every process sees it and
    /// it survives restarts. Answers `true` when this call paused it,
    /// `false` when it was paused already. An invalid name is refused with
    /// [`Error::InvalidInput`] naming `queue`. The default refuses, for
    /// stores without queues.
    fn pause_queue(&self, params: PauseQueue) -> impl Future<Output = Result<bool>> + Send {
        let _ = params;
        std::future::ready(Err(unsupported("pause queues")))
    }

    /// Resume a paused queue, and wake drains waiting for work. Answers
    /// `true` when it was paused. The default refuses, for stores without
    /// queues.
    fn resume_queue(&self, queue: &str) -> impl Future<Output = Result<bool>> + Send {
        let _ = queue;
        std::future::ready(Err(unsupported("resume queues")))
    }

    /// Every queue that holds pending or claimed messages, and every paused
    /// queue, by name. The default knows of none.
    fn queues(&self) -> impl Future<Output = Result<Vec<QueueState>>> + Send {
        std::future::ready(Ok(Vec::new()))
    }

    /// Cancel pending and claimed messages: one by id, or every one
    /// matching the filters (at least one of name, ordering key and queue).
    ///
    /// A pending message (due or scheduled), or a claimed one whose lease
    /// ran out, becomes `Cancelled` at once and is never delivered. A
    /// message under a live claim keeps running: the request is recorded
    /// on it, its handler sees it at the lease's next renewal
    /// ([`OutboxStore::renew_lease`](crate::OutboxStore::renew_lease)), and
    /// its settlement records it as cancelled, never as a retry, unless the
    /// handler succeeded (then it is delivered). By id, a message in any
    /// other status is refused with
    /// [`AdminError::NotCancellable`](crate::AdminError::NotCancellable),
    /// an unknown id with [`Error::NotFound`]. With `dry_run`, nothing
    /// changes and the counts say what would. The default refuses, for
    /// stores without cancellation.
    fn cancel_messages(
        &self,
        params: CancelMessages,
    ) -> impl Future<Output = Result<CancelReport>> + Send {
        let _ = params;
        std::future::ready(Err(unsupported("cancel messages")))
    }

    /// Every periodic schedule declared in this outbox, by name: its
    /// definition and progress (see [`ScheduleState`]). The default, for
    /// stores that keep no schedules, is none.
    fn list_schedules(&self) -> impl Future<Output = Result<Vec<ScheduleState>>> + Send {
        std::future::ready(Ok(Vec::new()))
    }
}

/// What the default of an operation a store does not support answers.
fn unsupported(what: &str) -> Error {
    Error::StoreContract(format!("this store cannot {what}"))
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
            MessageStatus::Pending | MessageStatus::Claimed | MessageStatus::Cancelled => {}
        }
    }
    minutes.into_values().collect()
}
