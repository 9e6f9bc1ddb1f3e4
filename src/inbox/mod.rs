//! The inbox: a consumer of relayed messages records each message id in its
//! own transaction, beside the message's effects, so the effects apply
//! once however many copies of the message arrive.
//!
//! The relay publishes at least once: a lost acknowledgement, an expired
//! lease or a broker's own redelivery all hand a consumer a second copy.
//! Inside the transaction that applies a message, the consumer calls
//! `record_in` with its own name and the message id (the
//! `Outbox-Message-Id` header the relay sets). The first copy answers
//! [`Recorded::New`]: apply the effects and commit. A copy of a message
//! already committed answers [`Recorded::AlreadyProcessed`]: skip it (roll
//! back or commit, nothing was written) and acknowledge it. A transaction
//! that rolls back takes its record with it, so the next copy is new again.
//!
//! A duplicate is not an error inside the transaction: the insert is
//! `ON CONFLICT DO NOTHING`, as for the outbox's enqueue of a taken id, and
//! input the database would refuse is refused before anything is sent, so
//! the caller's transaction is never aborted by the inbox.
//!
//! The table is `"<outbox table>_inbox"` (`outbox_inbox` by default), created
//! by the outbox's own migrations: `SqliteInbox::setup` and
//! `PostgresInbox::setup` run them, as the outbox stores' `setup` do.
//! Rows older than a window are deleted in bounded batches
//! ([`InboxStore::purge_expired`], [`InboxRetention`]); the window must
//! outlast the time a copy of a message can still arrive (see the guide's
//! inbox page).
//!
//! `outbox-brokers` runs consumers on this for NATS JetStream, RabbitMQ,
//! Redis Streams and Kafka: receive, record, apply, commit, acknowledge.
//!
//! # Layout
//!
//! - `mod.rs`: what both databases share: the answer of a record, the
//!   retention settings, the [`InboxStore`] trait and input checks.
//! - `statements.rs`: the SQL text of each database, rendered per table.
//! - `sqlite.rs`: `SqliteInbox`; `postgres.rs`: `PostgresInbox`.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::clock::SharedClock;
use crate::error::{ConfigError, ConfigViolation, Error, Result};
use crate::limits::MAX_DURATION;

#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;
mod statements;

#[cfg(feature = "postgres")]
pub use postgres::{PostgresInbox, PostgresInboxBuilder};
#[cfg(feature = "sqlite")]
pub use sqlite::{SqliteInbox, SqliteInboxBuilder};

/// The longest consumer name accepted, in bytes.
pub const MAX_CONSUMER_LEN: usize = 256;

/// The longest message id the inbox records, in bytes: PostgreSQL refuses
/// index entries of more than about 2 700 bytes, and a refusal would abort
/// the caller's transaction, so longer ids are refused before they are sent.
pub const MAX_INBOX_ID_LEN: usize = 2_048;

/// What recording a message id in the inbox found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[must_use = "a message already processed must not be applied again"]
pub enum Recorded {
    /// The first copy: apply the message's effects in the same transaction
    /// and commit.
    New,
    /// A copy of a message this consumer already committed: apply nothing,
    /// acknowledge it.
    AlreadyProcessed,
}

impl Recorded {
    /// `true` for [`Recorded::New`].
    pub fn is_new(self) -> bool {
        self == Recorded::New
    }
}

/// How long inbox rows are kept, and how they are deleted: rows of a
/// consumer recorded more than `window` ago go, in batches of at most
/// `batch_size` rows (each a statement of its own, so no lock is held for
/// long), at most every `every`.
///
/// A copy of a message that arrives after its row was deleted is applied
/// again: keep the window longer than the broker can redeliver and the
/// relay can republish a message (the guide's inbox page says how to
/// reckon it).
///
/// ```
/// let retention: outbox::InboxRetention =
///     serde_json::from_str(r#"{ "window": "14d", "every": "1h" }"#).unwrap();
/// retention.validate().unwrap();
/// assert_eq!(retention.window, std::time::Duration::from_secs(14 * 86_400));
/// assert_eq!(retention.batch_size, 1_000);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InboxRetention {
    /// Delete rows recorded longer ago than this. Default 7 days.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    /// Most rows one delete statement removes; 1 to 10 000. Default 1 000.
    pub batch_size: usize,
    /// Time between retention runs. Default 10 minutes.
    #[serde(with = "humantime_serde")]
    pub every: Duration,
}

impl Default for InboxRetention {
    fn default() -> Self {
        InboxRetention {
            window: Self::DEFAULT_WINDOW,
            batch_size: 1_000,
            every: Duration::from_secs(600),
        }
    }
}

impl InboxRetention {
    /// The window when none is configured: 7 days.
    pub const DEFAULT_WINDOW: Duration = Duration::from_secs(7 * 24 * 60 * 60);

    /// Most batches one run deletes. A backlog larger than this (after
    /// retention is first turned on over a large table) goes over several
    /// runs, so one run never keeps the database busy for long.
    pub const MAX_BATCHES_PER_RUN: usize = 100;

    /// The default settings with this window.
    pub fn with_window(window: Duration) -> Self {
        InboxRetention {
            window,
            ..Self::default()
        }
    }

    /// Check every field; the error lists each one out of range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut out = Vec::new();
        let show = |d: Duration| humantime::format_duration(d).to_string();
        if self.window.is_zero() {
            out.push(ConfigViolation::new(
                "inbox.window",
                "must be longer than zero",
            ));
        }
        if !(1..=10_000).contains(&self.batch_size) {
            out.push(ConfigViolation::new(
                "inbox.batch_size",
                format!("must be between 1 and 10000 ({} given)", self.batch_size),
            ));
        }
        if self.every.is_zero() {
            out.push(ConfigViolation::new(
                "inbox.every",
                "must be longer than zero",
            ));
        }
        for (field, value) in [("inbox.window", self.window), ("inbox.every", self.every)] {
            if value > MAX_DURATION {
                out.push(ConfigViolation::new(
                    field,
                    format!(
                        "must be at most {} ({} given)",
                        show(MAX_DURATION),
                        show(value)
                    ),
                ));
            }
        }
        if out.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::new(out))
        }
    }
}

/// Delete one bounded batch of a consumer's inbox rows recorded before a
/// horizon: what retention runs, one short statement at a time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PurgeInbox {
    /// Whose rows.
    pub consumer: String,
    /// Only rows recorded (`processed_at`) before this.
    pub older_than: DateTime<Utc>,
    /// Most rows to delete; 1 to 10 000.
    pub limit: usize,
}

/// An inbox in a SQL database: what the consumer runners of `outbox-brokers`
/// need, implemented by `SqliteInbox` and `PostgresInbox` (as the features allow).
///
/// Every time the inbox writes comes from its clock
/// ([`InboxStore::now`]), so tests can run retention on a clock of their
/// own.
pub trait InboxStore: Clone + Send + Sync + 'static {
    /// The sqlx database of the consumer's transactions.
    type Database: sqlx::Database;

    /// A transaction on the inbox's pool, for a message's record and its
    /// effects.
    fn begin(
        &self,
    ) -> impl Future<Output = Result<sqlx::Transaction<'static, Self::Database>>> + Send;

    /// Record that `consumer` processed `message_id`, on the caller's
    /// connection (inside the caller's transaction: pass `&mut *tx`).
    /// [`Recorded::AlreadyProcessed`] when a committed transaction recorded
    /// it before; never an error that aborts the transaction for that.
    /// Refuses with [`Error::InvalidInput`] an empty or oversized consumer
    /// name or id, or one with a NUL character, before sending anything.
    fn record_in<'a>(
        &'a self,
        conn: &'a mut <Self::Database as sqlx::Database>::Connection,
        consumer: &'a str,
        message_id: &'a str,
    ) -> impl Future<Output = Result<Recorded>> + Send + 'a;

    /// Whether `consumer` has a committed record of `message_id`.
    fn is_processed(
        &self,
        consumer: &str,
        message_id: &str,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Delete one batch of rows; returns how many went. Rows another
    /// transaction holds are left for the next batch.
    fn purge_batch(&self, params: PurgeInbox) -> impl Future<Output = Result<u64>> + Send;

    /// The inbox's clock: the time records are stamped with and retention
    /// measures from.
    fn now(&self) -> DateTime<Utc>;

    /// One retention run for `consumer`: batches of rows recorded more than
    /// `retention.window` ago, until a batch comes back short or
    /// [`InboxRetention::MAX_BATCHES_PER_RUN`] ran. Returns the rows
    /// deleted; a failing batch ends the run with its error.
    fn purge_expired(
        &self,
        consumer: &str,
        retention: &InboxRetention,
    ) -> impl Future<Output = Result<u64>> + Send {
        let consumer = consumer.to_owned();
        let retention = *retention;
        async move {
            retention.validate()?;
            check_consumer(&consumer)?;
            let window = chrono::Duration::from_std(retention.window)
                .map_err(|_| Error::invalid("inbox.window", "is out of range"))?;
            let older_than = self.now() - window;
            let mut deleted = 0;
            for _ in 0..InboxRetention::MAX_BATCHES_PER_RUN {
                let done = self
                    .purge_batch(PurgeInbox {
                        consumer: consumer.clone(),
                        older_than,
                        limit: retention.batch_size,
                    })
                    .await?;
                deleted += done;
                if done < retention.batch_size as u64 {
                    break;
                }
                // Let the consumers' own transactions go first.
                tokio::task::yield_now().await;
            }
            Ok(deleted)
        }
    }
}

/// The clock an inbox uses when none is given: the system's.
fn system_clock() -> SharedClock {
    std::sync::Arc::new(crate::clock::SystemClock)
}

/// Refuse a consumer name the database would refuse or that cannot name
/// anyone.
pub(crate) fn check_consumer(consumer: &str) -> Result<()> {
    check_text("consumer", consumer, MAX_CONSUMER_LEN)
}

/// Refuse what either database would refuse, so a record never aborts the
/// caller's transaction.
fn check_record(consumer: &str, message_id: &str) -> Result<()> {
    check_consumer(consumer)?;
    check_text("message_id", message_id, MAX_INBOX_ID_LEN)
}

fn check_text(field: &'static str, value: &str, max: usize) -> Result<()> {
    if value.trim().is_empty() {
        return Err(Error::invalid(field, "must not be empty"));
    }
    if value.len() > max {
        return Err(Error::invalid(
            field,
            format!("is {} bytes; at most {max} are accepted", value.len()),
        ));
    }
    if value.contains('\0') {
        return Err(Error::invalid(
            field,
            "contains a NUL character (\\0), which PostgreSQL cannot store in text; remove it",
        ));
    }
    Ok(())
}

/// Refuse a purge batch out of range.
fn check_purge(params: &PurgeInbox) -> Result<()> {
    check_consumer(&params.consumer)?;
    if !(1..=10_000).contains(&params.limit) {
        return Err(Error::invalid(
            "limit",
            format!("must be between 1 and 10000 ({} given)", params.limit),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_refuse_what_a_database_would() {
        assert!(check_record("billing", "m-1").is_ok());
        for (consumer, id, field) in [
            ("", "m-1", "consumer"),
            ("  ", "m-1", "consumer"),
            ("billing", "", "message_id"),
            ("bill\0ing", "m-1", "consumer"),
            ("billing", "m\0", "message_id"),
        ] {
            match check_record(consumer, id) {
                Err(Error::InvalidInput { field: got, .. }) => assert_eq!(got, field),
                other => panic!("{consumer:?}/{id:?}: {other:?}"),
            }
        }
        let long = "x".repeat(MAX_INBOX_ID_LEN + 1);
        assert!(check_record("billing", &long).is_err());
        assert!(check_record(&"c".repeat(MAX_CONSUMER_LEN + 1), "m").is_err());
    }

    #[test]
    fn retention_settings_are_checked() {
        InboxRetention::default().validate().unwrap();
        let bad = InboxRetention {
            window: Duration::ZERO,
            batch_size: 0,
            every: MAX_DURATION * 2,
        };
        let error = bad.validate().unwrap_err();
        for field in ["inbox.window", "inbox.batch_size", "inbox.every"] {
            assert!(error.names(field), "{field}: {error}");
        }
        assert_eq!(
            InboxRetention::with_window(Duration::from_secs(60)).batch_size,
            1_000
        );
    }
}
