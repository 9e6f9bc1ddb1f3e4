//! Bounds on durations that several layers check: configuration, retry
//! policies and stores all refuse the same values.
//!
//! A leaf: it names no other module, so everything may import it.

use std::time::Duration;

/// Longest duration any setting accepts (one year): longer timers are a
/// misconfiguration, and stores must be able to add them to a timestamp.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// Shortest lease: the heartbeat must fit strictly inside it.
pub const MIN_LEASE: Duration = Duration::from_millis(2);
