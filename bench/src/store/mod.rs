//! The stores a benchmark runs on: which ones this build has, and each one
//! made fresh and filled before anything is timed.
//!
//! SQLite runs on a new file in the temporary directory, removed afterwards
//! ([`sqlite::TempDatabase`]); PostgreSQL on a new table in `DATABASE_URL`,
//! dropped afterwards ([`postgres::drop_tables`]).

#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "sqlite")]
pub mod sqlite;

use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox::{ClaimBatch, MemoryOutbox, NewMessage, OutboxStore};

/// Every store this build can measure: `memory` always, the SQL stores
/// with their cargo features.
pub const STORES: &[&str] = &[
    "memory",
    #[cfg(feature = "sqlite")]
    "sqlite",
    #[cfg(feature = "postgres")]
    "postgres",
];

/// The SQL stores this build can measure.
pub const SQL_STORES: &[&str] = &[
    #[cfg(feature = "sqlite")]
    "sqlite",
    #[cfg(feature = "postgres")]
    "postgres",
];

/// Any failure of a fill: the store's, or the database driver's.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Messages per transaction while a SQL store is filled.
pub const FILL_CHUNK: u64 = 10_000;

/// `Ok` when `store` is one of `known` (what this build has of the stores
/// a benchmark supports); else an error naming them and the features that
/// add the others.
pub fn check(store: &str, known: &[&str]) -> Result<(), String> {
    if known.contains(&store) {
        return Ok(());
    }
    Err(format!(
        "unknown store {store:?}; this build knows: {} (the SQL stores need their cargo \
         features: --features sqlite, --features postgres)",
        known.join(", ")
    ))
}

/// A claim of up to `limit` messages at `now` under `lease`, with the
/// store's default attempt cap.
pub fn claim(limit: usize, now: DateTime<Utc>, lease: Duration) -> ClaimBatch {
    ClaimBatch {
        on_dead_letter: Default::default(),
        limit,
        now,
        lease,
        max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
        queues: Vec::new(),
        durable: true,
    }
}

/// A memory store holding `message(n)` for each `n` of `0..count`.
pub async fn memory_filled(count: u64, mut message: impl FnMut(u64) -> NewMessage) -> MemoryOutbox {
    let store = MemoryOutbox::new();
    for n in 0..count {
        store
            .enqueue(message(n))
            .await
            .expect("enqueue into memory");
    }
    store
}

/// A SQL store, filled the way an application writes: inside its own
/// transactions.
pub trait Fill {
    /// Enqueues `messages` in one transaction and commits it. Each message
    /// is made as it is enqueued, so a large fill holds one at a time.
    fn enqueue_all(
        &self,
        messages: impl Iterator<Item = NewMessage>,
    ) -> impl Future<Output = Result<(), BoxError>>;
}

/// `Fill` for a SQL store: its `enqueue_in` for each message inside one
/// transaction of its pool. Written once for both stores, whose
/// transactions are of different databases.
macro_rules! fill_in_transactions {
    ($store:ty) => {
        impl $crate::store::Fill for $store {
            async fn enqueue_all(
                &self,
                messages: impl Iterator<Item = outbox::NewMessage>,
            ) -> Result<(), $crate::store::BoxError> {
                let mut tx = self.pool().begin().await?;
                for message in messages {
                    self.enqueue_in(&mut tx, message).await?;
                }
                tx.commit().await?;
                Ok(())
            }
        }
    };
}
use fill_in_transactions;

/// Enqueues `message(n)` for each `n` of `range` into `store`, in
/// transactions of `chunk` messages.
///
/// # Panics
///
/// When an enqueue or a commit fails: a benchmark's fill has no failure to
/// recover from.
pub async fn fill(
    store: &impl Fill,
    range: std::ops::Range<u64>,
    chunk: u64,
    mut message: impl FnMut(u64) -> NewMessage,
) {
    let mut n = range.start;
    while n < range.end {
        let end = range.end.min(n + chunk);
        store
            .enqueue_all((n..end).map(&mut message))
            .await
            .expect("fill the store");
        n = end;
    }
}
