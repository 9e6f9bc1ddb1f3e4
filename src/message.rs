//! The message model: what is stored, what a claim hands out, what enqueue takes.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::error::{Error, RegistryError, Result};
use crate::registry::{Event, Job};

/// Attempts a message gets when the enqueuer does not say otherwise.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 5;

/// Whether a message goes to the event bus or to the job dispatcher.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MessageKind {
    /// Published to the [`EventBus`](crate::EventBus); any number of handlers.
    Event,
    /// Dispatched to the [`JobDispatcher`](crate::JobDispatcher); one handler.
    Job,
}

impl MessageKind {
    /// The stored spelling: `event` or `job`.
    pub fn as_str(self) -> &'static str {
        match self {
            MessageKind::Event => "event",
            MessageKind::Job => "job",
        }
    }
}

impl fmt::Display for MessageKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

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

/// Where a message is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MessageStatus {
    /// Waiting for `available_at`, then for a claim.
    Pending,
    /// Owned by a claim token until `locked_until`.
    Claimed,
    /// Delivered and acknowledged. Terminal.
    Delivered,
    /// Given up on; kept for inspection and requeue. Terminal.
    DeadLettered,
}

impl MessageStatus {
    /// Every status, in life order.
    pub const ALL: [MessageStatus; 4] = [
        MessageStatus::Pending,
        MessageStatus::Claimed,
        MessageStatus::Delivered,
        MessageStatus::DeadLettered,
    ];

    /// The stored spelling: `pending`, `claimed`, `delivered`, `dead_lettered`.
    pub fn as_str(self) -> &'static str {
        match self {
            MessageStatus::Pending => "pending",
            MessageStatus::Claimed => "claimed",
            MessageStatus::Delivered => "delivered",
            MessageStatus::DeadLettered => "dead_lettered",
        }
    }

    /// `true` for `Delivered` and `DeadLettered`: nothing will claim it again.
    pub fn is_terminal(self) -> bool {
        matches!(self, MessageStatus::Delivered | MessageStatus::DeadLettered)
    }
}

impl fmt::Display for MessageStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
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
            other => Err(Error::invalid(
                "status",
                format!(
                    "{other:?} is not a status; use pending, claimed, delivered or dead_lettered"
                ),
            )),
        }
    }
}

/// W3C trace context captured at enqueue, so a delivery can join the trace
/// of the request that produced it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceCarrier {
    /// The `traceparent` header value.
    pub traceparent: String,
    /// The `tracestate` header value, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
}

/// A message payload: validated JSON text.
///
/// Kept as text so a stored payload is decoded once, straight into its
/// registered type, with no intermediate `serde_json::Value`.
#[derive(Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Payload(Box<RawValue>);

impl Payload {
    /// Serialize `value` into a payload.
    pub fn from_serialize<T: Serialize + ?Sized>(value: &T) -> serde_json::Result<Self> {
        serde_json::value::to_raw_value(value).map(Payload)
    }

    /// Take JSON text as a payload, rejecting anything that is not JSON.
    pub fn from_json(json: impl Into<String>) -> Result<Self> {
        RawValue::from_string(json.into())
            .map(Payload)
            .map_err(|e| Error::invalid("payload", format!("not valid JSON: {e}")))
    }

    /// The JSON text.
    pub fn as_str(&self) -> &str {
        self.0.get()
    }

    /// Decode into `T`.
    pub fn decode<T: DeserializeOwned>(&self) -> serde_json::Result<T> {
        serde_json::from_str(self.0.get())
    }

    /// Decode into a `serde_json::Value`, for display and inspection.
    pub fn to_value(&self) -> serde_json::Value {
        // A `RawValue` always holds valid JSON, so this cannot fail.
        serde_json::from_str(self.0.get()).unwrap_or(serde_json::Value::Null)
    }
}

impl From<serde_json::Value> for Payload {
    fn from(value: serde_json::Value) -> Self {
        // Serializing a `Value` cannot fail: its keys are strings.
        Payload(serde_json::value::to_raw_value(&value).expect("a JSON value serializes"))
    }
}

impl PartialEq for Payload {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Payloads may hold personal data: keep them out of `{:?}` output,
        // which ends up in logs. Use `as_str` to see one on purpose.
        write!(f, "Payload({} bytes)", self.as_str().len())
    }
}

/// Largest serialized [`ErrorRecord`], in bytes. A larger error is truncated
/// so one pathological error cannot bloat a row.
pub const MAX_ERROR_RECORD_BYTES: usize = 8 * 1024;

const TRUNCATION_MARKER: &str = "…[truncated]";

/// A delivery error as stored in `last_error`: type name, message and cause
/// chain, bounded to [`MAX_ERROR_RECORD_BYTES`] when serialized.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorRecord {
    /// The Rust type of the error, or a label such as `panic`.
    #[serde(rename = "type")]
    pub type_name: String,
    /// The error's `Display` output.
    pub message: String,
    /// The `Display` output of each `source()`, outermost first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub causes: Vec<String>,
    /// `true` when something was cut to fit the size bound.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

impl ErrorRecord {
    /// A record with no causes, bounded.
    pub fn new(type_name: impl Into<String>, message: impl Into<String>) -> Self {
        ErrorRecord {
            type_name: type_name.into(),
            message: message.into(),
            causes: Vec::new(),
            truncated: false,
        }
        .bounded()
    }

    /// Record `error` and its `source()` chain, bounded.
    pub fn from_error<E: std::error::Error + ?Sized>(error: &E) -> Self {
        Self::from_dyn(std::any::type_name::<E>(), error)
    }

    /// Record a type-erased error under an explicit type name, bounded.
    pub fn from_dyn(
        type_name: impl Into<String>,
        error: &(impl std::error::Error + ?Sized),
    ) -> Self {
        let mut causes = Vec::new();
        let mut source = error.source();
        // A cyclic or absurdly deep chain must not hang or bloat the record.
        while let Some(cause) = source {
            if causes.len() >= 32 {
                break;
            }
            causes.push(cause.to_string());
            source = cause.source();
        }
        ErrorRecord {
            type_name: type_name.into(),
            message: error.to_string(),
            causes,
            truncated: false,
        }
        .bounded()
    }

    /// The record as JSON, as stores keep it.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("an error record serializes")
    }

    /// Read a stored record; text that is not a record is kept as the message.
    pub fn from_json(json: &str) -> Self {
        serde_json::from_str(json).unwrap_or_else(|_| ErrorRecord::new("unknown", json))
    }

    /// Cut the record down until its JSON fits [`MAX_ERROR_RECORD_BYTES`].
    pub fn bounded(mut self) -> Self {
        if self.to_json().len() <= MAX_ERROR_RECORD_BYTES {
            return self;
        }
        self.truncated = true;
        // Escaping can grow text up to six-fold (`\u0000`), so cut, measure,
        // and cut again: drop causes from the innermost, then halve strings.
        truncate_str(&mut self.type_name, 256);
        for cause in &mut self.causes {
            truncate_str(cause, 1024);
        }
        truncate_str(&mut self.message, MAX_ERROR_RECORD_BYTES / 2);
        while self.to_json().len() > MAX_ERROR_RECORD_BYTES {
            if self.causes.pop().is_some() {
                continue;
            }
            let half = self.message.len() / 2;
            truncate_str(&mut self.message, half);
        }
        self
    }
}

impl fmt::Display for ErrorRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.type_name, self.message)?;
        for cause in &self.causes {
            write!(f, "\n  caused by: {cause}")?;
        }
        Ok(())
    }
}

fn truncate_str(s: &mut String, max: usize) {
    if s.len() <= max {
        return;
    }
    let mut cut = max.saturating_sub(TRUNCATION_MARKER.len());
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    s.truncate(cut);
    s.push_str(TRUNCATION_MARKER);
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
    /// Claims allowed before the message is dead-lettered.
    pub max_attempts: u32,
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
}

impl OutboxMessage {
    /// `true` when a claim made at `now` could take this message.
    pub fn is_claimable(&self, now: DateTime<Utc>) -> bool {
        match self.status {
            MessageStatus::Pending => self.available_at <= now,
            MessageStatus::Claimed => self.locked_until.is_none_or(|until| until <= now),
            MessageStatus::Delivered | MessageStatus::DeadLettered => false,
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
    /// Claims allowed before the message is dead-lettered.
    pub max_attempts: u32,
    /// When the message became available.
    pub available_at: DateTime<Utc>,
    /// When the message was enqueued.
    pub created_at: DateTime<Utc>,
    /// The token that fences every write of this claim.
    pub claim_token: String,
    /// When this claim was made.
    pub claimed_at: DateTime<Utc>,
    /// When this claim's lease runs out unless renewed.
    pub locked_until: DateTime<Utc>,
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
/// [`crate::trace`].
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
    /// Claims allowed before dead-lettering; at least 1.
    pub max_attempts: u32,
    /// Not claimable before this time; `None` means `now`.
    pub available_at: Option<DateTime<Utc>>,
    /// The enqueue time: `created_at` and `updated_at` of the stored message.
    pub now: DateTime<Utc>,
}

impl NewMessage {
    /// A raw message with the default attempt budget, enqueued now.
    pub fn new(kind: MessageKind, name: impl Into<String>, payload: Payload) -> Self {
        NewMessage {
            id: None,
            kind,
            name: name.into(),
            payload,
            trace: TraceCarrier::current(),
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            available_at: None,
            now: crate::clock::system_now(),
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
            message.max_attempts = max_attempts;
        }
        Ok(message)
    }

    /// Use this id instead of a generated one.
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// Allow this many claims before dead-lettering.
    pub fn with_max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = max_attempts;
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
        if self.max_attempts == 0 {
            return Err(Error::invalid("max_attempts", "must be at least 1"));
        }
        Ok(())
    }

    /// The id to store: the caller's, or a fresh time-ordered UUID.
    pub fn resolve_id(&self) -> String {
        self.id.clone().unwrap_or_else(new_message_id)
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
