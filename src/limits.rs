//! Bounds and defaults that several layers share: configuration, retry
//! policies, messages and stores all refuse the same durations and fall back
//! on the same attempt cap.
//!
//! A leaf: it names no other module, so everything may import it.

use std::time::Duration;

/// Longest duration any setting accepts (one year): longer timers are a
/// misconfiguration, and stores must be able to add them to a timestamp.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// Shortest lease: the heartbeat must fit strictly inside it.
pub const MIN_LEASE: Duration = Duration::from_millis(2);

/// Attempts a message gets when neither the enqueuer, its job's policy nor
/// the drain's `retry.max_attempts` says otherwise.
///
/// With the default [`RetryPolicy`](crate::RetryPolicy) backoff, 25 attempts
/// span at least 24 hours even when jitter shortens every delay as far as it
/// can, so an outage of a day dead-letters nothing.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 25;

/// The most messages one batch enqueue takes
/// ([`OutboxStore::enqueue_batch`](crate::OutboxStore::enqueue_batch) and
/// the SQL stores' `enqueue_batch_in`); a larger batch is refused with
/// [`Error::BatchTooLarge`](crate::Error::BatchTooLarge) before anything is
/// written.
///
/// A batch is one statement: on SQLite a multi-row `INSERT` with a bound
/// value per column and row (13 today), and SQLite takes at most 32 766 of
/// them, so the bound leaves room for twice today's columns. Larger batches would gain
/// little (a thousand rows already spread a statement's fixed cost thin) and
/// would hold the table's write lock, and on PostgreSQL the rows' locks,
/// longer.
pub const MAX_ENQUEUE_BATCH: usize = 1_000;
