//! What a message carries: the stored JSON [`Payload`], the [`Event`] and
//! [`Job`] traits a payload type implements, and the forms a payload takes
//! at delivery ([`DecodedPayload`], [`RawMessage`]).
//!
//! Below the message model, the registry and the transports, which all
//! build on it; it names only the kinds, the error type and the retry policy
//! a job may carry.

use std::any::Any;
use std::fmt;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::error::{Error, Result};
use crate::kind::MessageKind;
use crate::retry::RetryPolicy;

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

/// A payload type published as an event.
///
/// ```
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct OrderPlaced { order_id: u64 }
///
/// impl outbox::Event for OrderPlaced {
///     const NAME: &'static str = "order.placed";
/// }
/// ```
pub trait Event: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// The stored message name; keep it stable across releases.
    const NAME: &'static str;
}

/// A payload type run as a job.
///
/// A job may carry its own [`RetryPolicy`], which then governs the outbox's
/// retries of that job (and its `max_attempts` becomes the message's budget).
pub trait Job: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// The stored message name; keep it stable across releases.
    const NAME: &'static str;

    /// This job's retry policy; `None` uses the drain's.
    fn retry_policy() -> Option<RetryPolicy> {
        None
    }
}

/// A payload decoded into its registered type, type-erased.
pub type DecodedPayload = Box<dyn Any + Send + Sync>;

/// A message whose name has no typed registration, as a catch-all
/// ([`RegistryBuilder::any`](crate::RegistryBuilder::any)) decodes it: kind, name and the payload as stored.
///
/// Handle it with [`InProcessBus::on_any`](crate::InProcessBus::on_any) or
/// [`InProcessJobs::on_any`](crate::InProcessJobs::on_any).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RawMessage {
    /// Event or job.
    pub kind: MessageKind,
    /// The stored name.
    pub name: String,
    /// The stored JSON payload, undecoded.
    pub payload: Payload,
}
