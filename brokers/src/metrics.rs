//! The inbox consumers' metrics, through the
//! [`metrics`](https://docs.rs/metrics) facade: the constants are the
//! names, for dashboards and tests, and [`ALL`] lists them.
//!
//! The consumers record into whatever recorder the application installs;
//! with none every call is a no-op. Every metric has the label `consumer`,
//! the consumer's name (so cardinality is the number of consumers).
//!
//! | metric | type | unit | labels | what |
//! |---|---|---|---|---|
//! | `outbox_inbox_processed_total` | counter | messages | `consumer` | messages applied and committed |
//! | `outbox_inbox_duplicates_total` | counter | messages | `consumer` | copies of committed messages, acknowledged unapplied |
//! | `outbox_inbox_failed_total` | counter | messages | `consumer`, `stage` | messages rolled back for redelivery; `stage` is `begin`, `record`, `handler` or `commit` |
//! | `outbox_inbox_refused_total` | counter | messages | `consumer` | messages without an id, refused |
//! | `outbox_inbox_ack_failed_total` | counter | messages | `consumer`, `operation` | acknowledgements the broker did not take |
//! | `outbox_inbox_duration_seconds` | histogram | seconds | `consumer`, `outcome` | begin to commit or rollback, for `outcome` `processed`, `duplicate` or `failed` |
//! | `outbox_inbox_retention_deleted_total` | counter | rows | `consumer` | inbox rows deleted by retention |

// The recording functions serve the consumers, which need a database and a
// broker; the names are public either way.
#![cfg_attr(
    not(all(
        any(feature = "sqlite", feature = "postgres"),
        any(
            feature = "nats",
            feature = "amqp",
            feature = "redis",
            feature = "kafka"
        )
    )),
    allow(dead_code)
)]

use std::time::Duration;

use metrics::{counter, histogram};

/// Counter: messages applied and committed.
pub const PROCESSED: &str = "outbox_inbox_processed_total";
/// Counter: copies of committed messages, acknowledged unapplied.
pub const DUPLICATES: &str = "outbox_inbox_duplicates_total";
/// Counter: messages rolled back for redelivery, label `stage`.
pub const FAILED: &str = "outbox_inbox_failed_total";
/// Counter: messages without an id, refused.
pub const REFUSED: &str = "outbox_inbox_refused_total";
/// Counter: acknowledgements the broker did not take, label `operation`.
pub const ACK_FAILED: &str = "outbox_inbox_ack_failed_total";
/// Histogram (seconds): begin to commit or rollback, label `outcome`.
pub const DURATION: &str = "outbox_inbox_duration_seconds";
/// Counter: inbox rows deleted by retention.
pub const RETENTION_DELETED: &str = "outbox_inbox_retention_deleted_total";

/// Every metric name the inbox consumers record.
pub const ALL: &[&str] = &[
    PROCESSED,
    DUPLICATES,
    FAILED,
    REFUSED,
    ACK_FAILED,
    DURATION,
    RETENTION_DELETED,
];

/// A message applied and committed; `took` from begin to commit.
pub(crate) fn processed(consumer: &str, took: Duration) {
    counter!(PROCESSED, "consumer" => consumer.to_owned()).increment(1);
    duration(consumer, "processed", took);
}

/// A copy of a committed message; `took` from begin to rollback.
pub(crate) fn duplicate(consumer: &str, took: Duration) {
    counter!(DUPLICATES, "consumer" => consumer.to_owned()).increment(1);
    duration(consumer, "duplicate", took);
}

/// A message rolled back at `stage`; `took` from begin to rollback.
pub(crate) fn failed(consumer: &str, stage: &'static str, took: Duration) {
    counter!(FAILED, "consumer" => consumer.to_owned(), "stage" => stage).increment(1);
    duration(consumer, "failed", took);
}

fn duration(consumer: &str, outcome: &'static str, took: Duration) {
    histogram!(DURATION, "consumer" => consumer.to_owned(), "outcome" => outcome)
        .record(took.as_secs_f64());
}

pub(crate) fn refused(consumer: &str) {
    counter!(REFUSED, "consumer" => consumer.to_owned()).increment(1);
}

pub(crate) fn ack_failed(consumer: &str, operation: &'static str) {
    counter!(ACK_FAILED, "consumer" => consumer.to_owned(), "operation" => operation).increment(1);
}

pub(crate) fn retention_deleted(consumer: &str, deleted: u64) {
    counter!(RETENTION_DELETED, "consumer" => consumer.to_owned()).increment(deleted);
}
