//! What a message is (an event or a job) and where it is in its life.
//!
//! The two enums every layer names, from the error type up to the stores,
//! so they sit in a leaf that names no other module. Parsing them fails with
//! the crate's [`Error`](crate::Error), which names them in turn, so their
//! `FromStr` impls live in the `message` module, above both.

use std::fmt;

use serde::{Deserialize, Serialize};

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
    /// Cancelled by an operator before it was delivered; kept for the
    /// record until retention removes it, never delivered. Terminal.
    Cancelled,
}

impl MessageStatus {
    /// Every status, in life order.
    pub const ALL: [MessageStatus; 5] = [
        MessageStatus::Pending,
        MessageStatus::Claimed,
        MessageStatus::Delivered,
        MessageStatus::DeadLettered,
        MessageStatus::Cancelled,
    ];

    /// The statuses nothing claims again, which purges and retention delete.
    pub const TERMINAL: [MessageStatus; 3] = [
        MessageStatus::Delivered,
        MessageStatus::DeadLettered,
        MessageStatus::Cancelled,
    ];

    /// The stored spelling: `pending`, `claimed`, `delivered`,
    /// `dead_lettered`, `cancelled`.
    pub fn as_str(self) -> &'static str {
        match self {
            MessageStatus::Pending => "pending",
            MessageStatus::Claimed => "claimed",
            MessageStatus::Delivered => "delivered",
            MessageStatus::DeadLettered => "dead_lettered",
            MessageStatus::Cancelled => "cancelled",
        }
    }

    /// `true` for `Delivered`, `DeadLettered` and `Cancelled`: nothing will
    /// claim it again.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            MessageStatus::Delivered | MessageStatus::DeadLettered | MessageStatus::Cancelled
        )
    }
}

impl fmt::Display for MessageStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
