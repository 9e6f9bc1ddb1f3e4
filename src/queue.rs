//! Named queues and priorities: the names and numbers a message is enqueued
//! with, the bounds every store checks them against, and how a drain serves
//! one queue ([`QueueConfig`]).
//!
//! A queue is a name on each message, chosen at enqueue (by default
//! [`DEFAULT_QUEUE`]); queues are created by use, and a drain serves the
//! queues it names, each with its own concurrency. A priority orders the
//! due messages of one queue: higher first, then by `available_at`. Neither
//! changes the order of an ordering key, whose messages are delivered one at
//! a time in enqueue order within their queue.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::retry::RetryPolicy;

/// The queue of a message enqueued without one, and the queue a drain
/// serves when it names none.
pub const DEFAULT_QUEUE: &str = "default";

/// The longest queue name, in bytes.
pub const MAX_QUEUE_NAME_LEN: usize = 64;

/// The lowest priority a message may have.
pub const MIN_PRIORITY: i16 = -1000;

/// The highest priority a message may have.
pub const MAX_PRIORITY: i16 = 1000;

/// Refuses, as an input error naming `field`, a queue name that is empty,
/// longer than [`MAX_QUEUE_NAME_LEN`], or holds anything but ASCII letters,
/// digits, `_`, `-`, `.` and `:`. The names end up in URLs, command lines
/// and log fields, where such names need no quoting.
pub(crate) fn check_queue_name(field: &'static str, name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::invalid(
            field,
            "must not be empty; leave it unset for the default queue",
        ));
    }
    if name.len() > MAX_QUEUE_NAME_LEN {
        return Err(Error::invalid(
            field,
            format!(
                "{name:?} is {} bytes; a queue name is at most {MAX_QUEUE_NAME_LEN}",
                name.len()
            ),
        ));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':')))
    {
        return Err(Error::invalid(
            field,
            format!("{name:?} holds {bad:?}; use ASCII letters, digits, `_`, `-`, `.` and `:`"),
        ));
    }
    Ok(())
}

/// Refuses a priority outside [`MIN_PRIORITY`]`..=`[`MAX_PRIORITY`], as an
/// input error naming `priority`.
pub(crate) fn check_priority(priority: i16) -> Result<()> {
    if !(MIN_PRIORITY..=MAX_PRIORITY).contains(&priority) {
        return Err(Error::invalid(
            "priority",
            format!("is {priority}; use {MIN_PRIORITY} to {MAX_PRIORITY} (higher goes first)"),
        ));
    }
    Ok(())
}

/// How a drain serves one queue: how many of its handlers run at once, and
/// the retry policy of its messages when it differs from the drain's.
///
/// ```
/// let config: outbox::DrainConfig = serde_json::from_str(
///     r#"{ "batch_size": 100, "queues": { "emails": { "concurrency": 8 }, "default": { "concurrency": 2 } } }"#,
/// ).unwrap();
/// config.validate().unwrap();
/// assert_eq!(config.queues["emails"].concurrency, 8);
/// ```
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QueueConfig {
    /// Handlers of this queue running at once; at least 1. Default 1.
    pub concurrency: usize,
    /// The retry policy of this queue's events and of its jobs without a
    /// policy of their own; the drain's `retry` when unset. Its
    /// `max_attempts` is the attempt cap of the queue's messages enqueued
    /// without one.
    pub retry: Option<RetryPolicy>,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            concurrency: 1,
            retry: None,
        }
    }
}

impl QueueConfig {
    /// A queue served by `concurrency` handlers at once, under the drain's
    /// retry policy.
    pub fn new(concurrency: usize) -> Self {
        QueueConfig {
            concurrency,
            retry: None,
        }
    }

    /// Retry this queue's messages under `policy` instead of the drain's.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = Some(policy);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_names_are_checked() {
        for good in ["default", "emails", "billing.v2", "tenant-7:high", "a"] {
            check_queue_name("queue", good).unwrap();
        }
        let long = "q".repeat(MAX_QUEUE_NAME_LEN + 1);
        for bad in ["", "with space", "ümlaut", "semi;colon", long.as_str()] {
            let error = check_queue_name("queue", bad).unwrap_err();
            assert!(
                matches!(error, Error::InvalidInput { field: "queue", .. }),
                "{bad:?}: {error}"
            );
        }
    }

    #[test]
    fn priorities_are_bounded() {
        check_priority(MIN_PRIORITY).unwrap();
        check_priority(MAX_PRIORITY).unwrap();
        for bad in [MIN_PRIORITY - 1, MAX_PRIORITY + 1, i16::MAX, i16::MIN] {
            let error = check_priority(bad).unwrap_err();
            assert!(matches!(
                error,
                Error::InvalidInput {
                    field: "priority",
                    ..
                }
            ));
        }
    }
}
