//! The message model: what is stored, what a claim hands out, what enqueue takes.

use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::error::ErrorRecord;
use crate::error::{Error, RegistryError, Result};
use crate::kind::{MessageKind, MessageStatus};
use crate::payload::Payload;
use crate::payload::{Event, Job};
use crate::queue::{DEFAULT_QUEUE, check_priority, check_queue_name};
use crate::retry::RetryPolicy;
use crate::trace::TraceCarrier;

// Parsing fails with `Error`, whose variants name the kinds: kept here, above
// both, so `kind.rs` stays a leaf.
impl FromStr for MessageKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "event" => Ok(MessageKind::Event),
            "job" => Ok(MessageKind::Job),
            other => Err(Error::invalid(
                "kind",
                format!("{other:?} is not a message kind; use `event` or `job`"),
            )),
        }
    }
}

impl FromStr for MessageStatus {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "pending" => Ok(MessageStatus::Pending),
            "claimed" => Ok(MessageStatus::Claimed),
            "delivered" => Ok(MessageStatus::Delivered),
            "dead_lettered" | "dead-lettered" | "deadlettered" => Ok(MessageStatus::DeadLettered),
            "cancelled" | "canceled" => Ok(MessageStatus::Cancelled),
            other => Err(Error::invalid(
                "status",
                format!(
                    "{other:?} is not a status; use pending, claimed, delivered, dead_lettered \
                     or cancelled"
                ),
            )),
        }
    }
}

/// A stored outbox message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutboxMessage {
    /// Unique id, caller-supplied or generated.
    pub id: String,
    /// Event or job.
    pub kind: MessageKind,
    /// The registered name.
    pub name: String,
    /// The JSON payload.
    pub payload: Payload,
    /// Trace context captured at enqueue.
    pub trace: Option<TraceCarrier>,
    /// Where the message is in its life.
    pub status: MessageStatus,
    /// Claims made so far.
    pub attempts: u32,
    /// The attempt cap stored with the message: the one given at enqueue
    /// when `max_attempts_set`, otherwise [`DEFAULT_MAX_ATTEMPTS`](crate::DEFAULT_MAX_ATTEMPTS) as it was
    /// when the message was enqueued. See
    /// [`OutboxMessage::effective_max_attempts`] for the cap that applies.
    pub max_attempts: u32,
    /// `true` when the enqueuer (or the job's retry policy) set the attempt
    /// cap; `false` when the draining worker's `retry.max_attempts` decides.
    #[serde(default = "set_by_default")]
    pub max_attempts_set: bool,
    /// Not claimable before this time.
    pub available_at: DateTime<Utc>,
    /// The token of the current claim, while claimed.
    pub claim_token: Option<String>,
    /// When the current claim was made.
    pub claimed_at: Option<DateTime<Utc>>,
    /// When the current claim's lease runs out.
    pub locked_until: Option<DateTime<Utc>>,
    /// The error of the last failed attempt.
    pub last_error: Option<ErrorRecord>,
    /// When the message was enqueued.
    pub created_at: DateTime<Utc>,
    /// When the message last changed.
    pub updated_at: DateTime<Utc>,
    /// When the message was delivered.
    pub delivered_at: Option<DateTime<Utc>>,
    /// The ordering key: messages sharing one are delivered one at a time,
    /// in enqueue order. `None` for messages without an order.
    pub ordering_key: Option<String>,
    /// When an operator skipped this dead letter (`outbox skip`), so that
    /// the later messages of its ordering key go on without it.
    pub skipped_at: Option<DateTime<Utc>>,
    /// The queue it was enqueued in.
    #[serde(default = "default_queue")]
    pub queue: String,
    /// Its priority within its queue: higher is claimed first.
    #[serde(default)]
    pub priority: i16,
    /// When an operator cancelled it while it was claimed: its delivery
    /// runs on (its handler can see the request), and its settlement
    /// records it as cancelled unless the handler succeeded.
    #[serde(default)]
    pub cancel_requested_at: Option<DateTime<Utc>>,
}

fn set_by_default() -> bool {
    true
}

fn default_queue() -> String {
    DEFAULT_QUEUE.to_owned()
}

impl OutboxMessage {
    /// The attempt cap that applies to this message under a drain whose cap
    /// (its `retry.max_attempts`, or [`DEFAULT_MAX_ATTEMPTS`](crate::DEFAULT_MAX_ATTEMPTS)) is
    /// `drain_cap`: the message's own when it was set, the drain's otherwise.
    pub fn effective_max_attempts(&self, drain_cap: u32) -> u32 {
        if self.max_attempts_set {
            self.max_attempts
        } else {
            drain_cap
        }
    }

    /// `true` when a claim made at `now` could take this message.
    pub fn is_claimable(&self, now: DateTime<Utc>) -> bool {
        match self.status {
            MessageStatus::Pending => self.available_at <= now,
            MessageStatus::Claimed => self.locked_until.is_none_or(|until| until <= now),
            MessageStatus::Delivered | MessageStatus::DeadLettered | MessageStatus::Cancelled => {
                false
            }
        }
    }

    /// `true` when a claim on this message is live at `now`.
    pub fn has_live_claim(&self, now: DateTime<Utc>) -> bool {
        self.status == MessageStatus::Claimed && self.locked_until.is_some_and(|until| until > now)
    }
}

/// A message as a delivery sees it: claimed, with its token and lease.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClaimedMessage {
    /// Unique id.
    pub id: String,
    /// Event or job.
    pub kind: MessageKind,
    /// The registered name.
    pub name: String,
    /// The JSON payload.
    pub payload: Payload,
    /// Trace context captured at enqueue.
    pub trace: Option<TraceCarrier>,
    /// Claims made so far, this one included.
    pub attempts: u32,
    /// Claims allowed before the message is dead-lettered: the message's
    /// own cap when it was set, otherwise the cap of the claim
    /// ([`ClaimBatch::max_attempts`](crate::ClaimBatch::max_attempts)).
    pub max_attempts: u32,
    /// `true` when `max_attempts` is the message's own cap (set at enqueue
    /// or by its job's policy); `false` when it is the claim's.
    #[serde(default = "set_by_default")]
    pub max_attempts_set: bool,
    /// When the message became available.
    pub available_at: DateTime<Utc>,
    /// When the message was enqueued.
    pub created_at: DateTime<Utc>,
    /// The ordering key the message was enqueued with, if any.
    pub ordering_key: Option<String>,
    /// The queue it was enqueued in.
    #[serde(default = "default_queue")]
    pub queue: String,
    /// Its priority within its queue.
    #[serde(default)]
    pub priority: i16,
    /// The token that fences every write of this claim.
    pub claim_token: String,
    /// When this claim was made.
    pub claimed_at: DateTime<Utc>,
    /// When this claim's lease runs out unless renewed.
    pub locked_until: DateTime<Utc>,
}

// Here rather than in `retry.rs`: it reads a claimed message, and the retry
// policy sits below the message model (payload types name their policy).
impl RetryPolicy {
    /// The attempt cap of `message` under this policy: the message's own
    /// when it was set at enqueue, else this policy's `max_attempts`, else
    /// the cap the message was claimed under (the drain's).
    pub fn max_attempts_for(&self, message: &ClaimedMessage) -> u32 {
        if message.max_attempts_set {
            message.max_attempts
        } else {
            self.max_attempts.unwrap_or(message.max_attempts)
        }
    }
}

/// What an enqueue did: stored the message, or found its id taken.
///
/// An enqueue never fails because the id is taken, and never aborts the
/// caller's transaction over it: the message is simply not written, so the
/// rest of the transaction (the business rows the message goes with) still
/// commits. What to do with each:
///
/// - [`Enqueued::Inserted`]: the message is stored (inside a transaction:
///   once it commits). Nothing more to do.
/// - [`Enqueued::AlreadyExists`]: a message with this id was already stored,
///   and it is left untouched (its name, payload, status, attempts). When ids
///   name the business fact (an idempotency key, such as `order-7-placed`),
///   this is the retry of an enqueue that already happened: treat it as done
///   and commit. When the ids were meant to be fresh, two different messages
///   collided: roll back, or enqueue again without an id (one is generated).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Enqueued {
    /// The message was stored under this id.
    Inserted(String),
    /// A message with this id already existed; nothing was written.
    AlreadyExists(String),
}

impl Enqueued {
    /// The message's id, in either case.
    pub fn id(&self) -> &str {
        match self {
            Enqueued::Inserted(id) | Enqueued::AlreadyExists(id) => id,
        }
    }

    /// The message's id, in either case, by value.
    pub fn into_id(self) -> String {
        match self {
            Enqueued::Inserted(id) | Enqueued::AlreadyExists(id) => id,
        }
    }

    /// `true` when this call stored the message.
    pub fn is_inserted(&self) -> bool {
        matches!(self, Enqueued::Inserted(_))
    }
}

/// A message to enqueue.
///
/// Build one with [`NewMessage::event`] or [`NewMessage::job`] for registered
/// types (serialized here, at the call site), or [`NewMessage::new`] for raw
/// JSON. `now` defaults to the system clock; set it with [`NewMessage::at`]
/// when the caller has its own clock (tests on virtual time do).
///
/// With the `opentelemetry` feature, `trace` starts as the current span's
/// trace context, so the delivery joins the trace that enqueued it; see
/// [`TraceCarrier`].
#[derive(Debug, Clone)]
pub struct NewMessage {
    /// The id to use; `None` generates a time-ordered UUID.
    pub id: Option<String>,
    /// Event or job.
    pub kind: MessageKind,
    /// The registered name.
    pub name: String,
    /// The JSON payload.
    pub payload: Payload,
    /// Trace context to store with the message.
    pub trace: Option<TraceCarrier>,
    /// Claims allowed before dead-lettering; at least 1. `None` leaves it to
    /// the draining worker: its `retry.max_attempts`, or
    /// [`DEFAULT_MAX_ATTEMPTS`](crate::DEFAULT_MAX_ATTEMPTS).
    pub max_attempts: Option<u32>,
    /// Not claimable before this time; `None` means `now`.
    pub available_at: Option<DateTime<Utc>>,
    /// The enqueue time: `created_at` and `updated_at` of the stored message.
    pub now: DateTime<Utc>,
    /// Deliver one at a time, in enqueue order, with the other messages of
    /// this key; see [`EnqueueOptions::ordering_key`].
    pub ordering_key: Option<String>,
    /// Deduplicate enqueues by this key within a window; see
    /// [`EnqueueOptions::idempotency_key`].
    pub idempotency: Option<Idempotency>,
    /// The queue to enqueue in; see [`EnqueueOptions::queue`].
    pub queue: String,
    /// The priority within the queue; see [`EnqueueOptions::priority`].
    pub priority: i16,
}

/// The longest ordering or idempotency key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 512;

/// An idempotency key and how long it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Idempotency {
    /// The key; 1 to [`MAX_KEY_LEN`] bytes.
    pub key: String,
    /// How long after the enqueue that took the key a second enqueue with
    /// it still finds the first; at least 1 ms.
    pub window: std::time::Duration,
}

impl NewMessage {
    /// A raw message, enqueued now, whose attempt cap the draining worker
    /// decides (see [`NewMessage::max_attempts`]).
    pub fn new(kind: MessageKind, name: impl Into<String>, payload: Payload) -> Self {
        NewMessage {
            id: None,
            kind,
            name: name.into(),
            payload,
            trace: TraceCarrier::current(),
            max_attempts: None,
            available_at: None,
            now: crate::clock::system_now(),
            ordering_key: None,
            idempotency: None,
            queue: DEFAULT_QUEUE.to_owned(),
            priority: 0,
        }
    }

    /// An event of registered type `E`, serialized now.
    pub fn event<E: Event>(payload: &E) -> Result<Self> {
        let payload = encode(MessageKind::Event, E::NAME, payload)?;
        Ok(Self::new(MessageKind::Event, E::NAME, payload))
    }

    /// A job of registered type `J`, serialized now, with the job's attempt budget.
    pub fn job<J: Job>(payload: &J) -> Result<Self> {
        let payload = encode(MessageKind::Job, J::NAME, payload)?;
        let mut message = Self::new(MessageKind::Job, J::NAME, payload);
        if let Some(max_attempts) = J::retry_policy().and_then(|policy| policy.max_attempts) {
            message.max_attempts = Some(max_attempts);
        }
        Ok(message)
    }

    /// Use this id instead of a generated one.
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// Allow this many claims before dead-lettering. The message's own cap
    /// wins over its job's policy and over the drain's `retry.max_attempts`.
    pub fn with_max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = Some(max_attempts);
        self
    }

    /// Keep the message unclaimable until `at`.
    pub fn available_at(mut self, at: DateTime<Utc>) -> Self {
        self.available_at = Some(at);
        self
    }

    /// Store this trace context with the message, instead of the one
    /// captured from the current span.
    pub fn with_trace(mut self, trace: TraceCarrier) -> Self {
        self.trace = Some(trace);
        self
    }

    /// Store the current span's trace context (see
    /// [`TraceCarrier::current`]), replacing the carrier this message has.
    /// Keeps it when no trace context is active, and always without the
    /// `opentelemetry` feature.
    ///
    /// [`NewMessage::new`] already captures it; call this when the message
    /// was built outside the span that enqueues it.
    pub fn with_current_trace(mut self) -> Self {
        if let Some(trace) = TraceCarrier::current() {
            self.trace = Some(trace);
        }
        self
    }

    /// Deliver this message one at a time, in enqueue order, with the other
    /// messages of `key`; see [`EnqueueOptions::ordering_key`].
    pub fn with_ordering_key(mut self, key: impl Into<String>) -> Self {
        self.ordering_key = Some(key.into());
        self
    }

    /// Enqueue in `queue` instead of [`DEFAULT_QUEUE`]; see
    /// [`EnqueueOptions::queue`].
    pub fn with_queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = queue.into();
        self
    }

    /// Claim before (higher) or after (lower) the other due messages of its
    /// queue; see [`EnqueueOptions::priority`].
    pub fn with_priority(mut self, priority: i16) -> Self {
        self.priority = priority;
        self
    }

    /// Apply `options`: each option that is set replaces what the message
    /// has. A delay counts from the message's `now`.
    pub fn with_options(mut self, options: EnqueueOptions) -> Self {
        if let Some(at) = options.run_at {
            self.available_at = Some(at);
        }
        if let Some(delay) = options.delay {
            self.available_at = Some(
                chrono::Duration::from_std(delay)
                    .ok()
                    .and_then(|delay| self.now.checked_add_signed(delay))
                    .unwrap_or(DateTime::<Utc>::MAX_UTC),
            );
        }
        if let Some(key) = options.ordering_key {
            self.ordering_key = Some(key);
        }
        if let Some(idempotency) = options.idempotency {
            self.idempotency = Some(idempotency);
        }
        if let Some(max_attempts) = options.max_attempts {
            self.max_attempts = Some(max_attempts);
        }
        if let Some(queue) = options.queue {
            self.queue = queue;
        }
        if let Some(priority) = options.priority {
            self.priority = priority;
        }
        self
    }

    /// Enqueue as of `now` (the caller's clock) instead of the system clock.
    pub fn at(mut self, now: DateTime<Utc>) -> Self {
        self.now = now;
        self
    }

    /// Check what every store requires: a non-empty name and id, at least one
    /// attempt. Stores call this before writing anything.
    pub fn validate(&self) -> Result<()> {
        if self.name.trim().is_empty() {
            return Err(Error::invalid("name", "must not be empty"));
        }
        if self.id.as_deref().is_some_and(|id| id.trim().is_empty()) {
            return Err(Error::invalid(
                "id",
                "must not be empty; leave it unset to generate one",
            ));
        }
        if self.max_attempts == Some(0) {
            return Err(Error::invalid("max_attempts", "must be at least 1"));
        }
        if let Some(key) = &self.ordering_key {
            check_key("ordering_key", key)?;
        }
        check_queue_name("queue", &self.queue)?;
        check_priority(self.priority)?;
        if let Some(idempotency) = &self.idempotency {
            check_key("idempotency_key", &idempotency.key)?;
            if idempotency.window < std::time::Duration::from_millis(1) {
                return Err(Error::invalid(
                    "idempotency_key.window",
                    "must be at least 1ms; a key that holds for no time deduplicates nothing",
                ));
            }
            if idempotency.window > crate::limits::MAX_DURATION {
                return Err(Error::invalid(
                    "idempotency_key.window",
                    "must be at most 365 days",
                ));
            }
        }
        Ok(())
    }

    /// The id to store: the caller's, or a fresh time-ordered UUID.
    pub fn resolve_id(&self) -> String {
        self.id.clone().unwrap_or_else(new_message_id)
    }

    /// Check a batch as every store does before writing any of it: at most
    /// [`MAX_ENQUEUE_BATCH`](crate::MAX_ENQUEUE_BATCH) messages, else
    /// [`Error::BatchTooLarge`]; each one [valid](NewMessage::validate),
    /// else its error, with its position in the reason (see
    /// [`NewMessage::refused_in_batch`]).
    pub fn validate_batch(messages: &[NewMessage]) -> Result<()> {
        if messages.len() > crate::limits::MAX_ENQUEUE_BATCH {
            return Err(Error::BatchTooLarge {
                messages: messages.len(),
                max: crate::limits::MAX_ENQUEUE_BATCH,
            });
        }
        for (index, message) in messages.iter().enumerate() {
            message
                .validate()
                .map_err(|e| Self::refused_in_batch(e, index))?;
        }
        Ok(())
    }

    /// `error`, which refused the message at `index` of a batch, saying
    /// so: an [`Error::InvalidInput`] keeps its field and gets the position
    /// in its reason, so code that matches on the field works the same for
    /// a batch as for one message. Other errors are returned as they are.
    pub fn refused_in_batch(error: Error, index: usize) -> Error {
        match error {
            Error::InvalidInput { field, reason } => Error::InvalidInput {
                field,
                reason: format!("{reason} (message {index} of the batch; nothing was written)"),
            },
            other => other,
        }
    }
}

fn check_key(field: &'static str, key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(Error::invalid(
            field,
            "must not be empty; leave it unset for none",
        ));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(Error::invalid(
            field,
            format!(
                "is {} bytes; keys are at most {MAX_KEY_LEN} bytes (hash a longer one)",
                key.len()
            ),
        ));
    }
    if key.contains('\0') {
        return Err(Error::invalid(
            field,
            "contains a NUL character, which the SQL stores cannot keep",
        ));
    }
    Ok(())
}

/// How to enqueue a message: its queue and priority, when it becomes
/// claimable, its ordering key, its idempotency key and its attempt budget.
/// Every option is unset by default and every store honours each one.
///
/// ```
/// use std::time::Duration;
/// use outbox::EnqueueOptions;
///
/// let options = EnqueueOptions::new()
///     .queue("emails")
///     .priority(10)
///     .delay(Duration::from_secs(60))
///     .ordering_key("order-7")
///     .idempotency_key("order-7-placed", Duration::from_secs(24 * 3600))
///     .max_attempts(10);
/// # let _ = options;
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnqueueOptions {
    delay: Option<std::time::Duration>,
    run_at: Option<DateTime<Utc>>,
    ordering_key: Option<String>,
    idempotency: Option<Idempotency>,
    max_attempts: Option<u32>,
    queue: Option<String>,
    priority: Option<i16>,
}

impl EnqueueOptions {
    /// No options: claimable at once, no keys, the default attempt budget.
    pub fn new() -> Self {
        Self::default()
    }

    /// Not claimable until `delay` after the enqueue. Replaces
    /// [`EnqueueOptions::run_at`].
    pub fn delay(mut self, delay: std::time::Duration) -> Self {
        self.delay = Some(delay);
        self.run_at = None;
        self
    }

    /// Not claimable before `at`. Replaces [`EnqueueOptions::delay`].
    pub fn run_at(mut self, at: DateTime<Utc>) -> Self {
        self.run_at = Some(at);
        self.delay = None;
        self
    }

    /// Deliver one at a time, in enqueue order, with the other messages of
    /// `key`: a message is claimed only once every earlier message of its key
    /// is delivered (or, dead-lettered, skipped). A retry keeps its place at
    /// the head. Messages of different keys, and messages without a key, do
    /// not wait for each other. At most [`MAX_KEY_LEN`] bytes.
    pub fn ordering_key(mut self, key: impl Into<String>) -> Self {
        self.ordering_key = Some(key.into());
        self
    }

    /// Enqueue at most once per `key` within `window`: while a stored
    /// message took `key` less than `window` before this enqueue's `now`, the
    /// enqueue writes nothing and answers
    /// [`Enqueued::AlreadyExists`] with that message's id, without failing
    /// the caller's transaction. Once the window has passed, the next enqueue
    /// with `key` stores a new message and takes the key over. The key lives
    /// with the message, so purging the message frees it early.
    pub fn idempotency_key(mut self, key: impl Into<String>, window: std::time::Duration) -> Self {
        self.idempotency = Some(Idempotency {
            key: key.into(),
            window,
        });
        self
    }

    /// Allow this many claims before dead-lettering; at least 1.
    pub fn max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = Some(max_attempts);
        self
    }

    /// Enqueue in `queue` (by default [`DEFAULT_QUEUE`]): only drains that
    /// serve it claim the message, each with the queue's own concurrency,
    /// and an operator can pause the queue. Queues are created by use; a
    /// name is 1 to [`MAX_QUEUE_NAME_LEN`](crate::MAX_QUEUE_NAME_LEN) ASCII
    /// letters, digits, `_`, `-`, `.` or `:`. An ordering key's order holds
    /// within its queue.
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = Some(queue.into());
        self
    }

    /// Claim this message before the due messages of its queue with a
    /// lower priority (default 0), from
    /// [`MIN_PRIORITY`](crate::MIN_PRIORITY) to
    /// [`MAX_PRIORITY`](crate::MAX_PRIORITY). Messages of one priority go
    /// oldest `available_at` first. A priority never reorders an ordering
    /// key: its messages still go one at a time, in enqueue order.
    pub fn priority(mut self, priority: i16) -> Self {
        self.priority = Some(priority);
        self
    }
}

/// What a claim does with the later messages of an ordering key whose
/// earlier message was dead-lettered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnDeadLetter {
    /// The key stops at its dead letter until an operator requeues it
    /// (`outbox requeue`) or skips it (`outbox skip`).
    #[default]
    Block,
    /// A dead letter no longer holds its key: the next message goes on.
    Skip,
}

impl FromStr for OnDeadLetter {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "block" => Ok(OnDeadLetter::Block),
            "skip" => Ok(OnDeadLetter::Skip),
            other => Err(Error::invalid(
                "ordering.on_dead_letter",
                format!("{other:?} is not a policy; use `block` or `skip`"),
            )),
        }
    }
}

fn encode<T: Serialize>(kind: MessageKind, name: &str, payload: &T) -> Result<Payload> {
    Payload::from_serialize(payload).map_err(|e| {
        RegistryError::Encode {
            kind,
            name: name.to_owned(),
            source: std::sync::Arc::new(e),
        }
        .into()
    })
}

/// A fresh message id: a UUIDv7, so ids sort roughly by creation time and
/// keep B-tree inserts local.
pub fn new_message_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// A fresh claim token: a random UUIDv4, unguessable by other workers.
pub fn new_claim_token() -> String {
    uuid::Uuid::new_v4().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claimed(max_attempts: u32, set: bool) -> ClaimedMessage {
        let now = chrono::DateTime::UNIX_EPOCH;
        ClaimedMessage {
            id: "m".into(),
            kind: crate::MessageKind::Event,
            name: "e".into(),
            payload: crate::Payload::from_json("{}".to_string()).unwrap(),
            trace: None,
            ordering_key: None,
            queue: crate::DEFAULT_QUEUE.into(),
            priority: 0,
            attempts: 1,
            max_attempts,
            max_attempts_set: set,
            available_at: now,
            created_at: now,
            claim_token: "t".into(),
            claimed_at: now,
            locked_until: now,
        }
    }

    #[test]
    fn attempt_cap_precedence_message_then_policy_then_claim() {
        let policy = crate::retry::RetryPolicy::default().with_max_attempts(3);
        // Set at enqueue: the message's own cap wins, higher or lower.
        assert_eq!(policy.max_attempts_for(&claimed(40, true)), 40);
        assert_eq!(policy.max_attempts_for(&claimed(2, true)), 2);
        // Not set: the policy's cap, higher or lower than the claim's.
        assert_eq!(policy.max_attempts_for(&claimed(25, false)), 3);
        let generous = crate::retry::RetryPolicy::default().with_max_attempts(50);
        assert_eq!(generous.max_attempts_for(&claimed(25, false)), 50);
        // Neither: the cap the message was claimed under.
        assert_eq!(
            crate::retry::RetryPolicy::default().max_attempts_for(&claimed(25, false)),
            25
        );
        assert_eq!(
            crate::retry::RetryPolicy::default().attempt_cap(),
            crate::DEFAULT_MAX_ATTEMPTS
        );
        assert_eq!(generous.attempt_cap(), 50);
    }
}
