//! The SQLite store: the embedded default.
//!
//! This file is the store, its builder, connecting and setting up, and the
//! core its parts share. The other files each add one concern, importing
//! this one and never each other (but `statements.rs` and `wakes.rs`):
//!
//! - `statements.rs`: its SQL text, rendered once per table (imports
//!   nothing of the store).
//! - `wakes.rs`: which drains a commit wakes (imports nothing of the
//!   store either).
//! - `enqueue.rs`: enqueue, and the hooks that wake drains.
//! - `claim.rs`: the claim, and decoding what it claimed.
//! - `settle.rs`: the fenced writes (renewals and settlements).
//! - `admin.rs`: its listing and activity.
//! - `schedules.rs`: the periodic schedules: a slot's enqueue in one
//!   immediate transaction with the move of its schedule's `last_slot`.
//!
//! What it shares with the PostgreSQL store (fenced-write forwarding,
//! requeue, purge, stats, reading rows) is in [`crate::store::sql`].
//!
//! One table (name configurable, see [`TableName`]), bundled SQLite through
//! sqlx, WAL journal, a `busy_timeout` so writers queue instead of failing.
//! Times are stored as INTEGER microseconds since the epoch.
//!
//! - **Claims** run inside a `BEGIN IMMEDIATE` transaction: the write lock
//!   is taken before anything is read, so two claimers can never pick the
//!   same row, and the claim never has to upgrade a read lock (which fails
//!   in WAL mode when another writer got in first). One statement picks the
//!   rows and hands them over as one JSON text, a second claims them by
//!   rowid; messages out of attempts are dead-lettered by that second
//!   statement.
//! - **Fenced writes** (renewals and settlements) are an `UPDATE ... FROM
//!   json_each(...)` over any number of rows, each matched on `id`,
//!   `claim_token` and `locked_until > now`; see [`SettlementMode`]. Each
//!   kind of write has a statement of its own that assigns only the columns
//!   it changes, so SQLite maintains only the indexes over those: a batch
//!   runs one statement per kind of write in it.
//! - The store's own writes take turns on an in-process lock, so they queue
//!   on a future instead of spinning in SQLite's busy handler.
//!
//! # Time
//!
//! Lease arithmetic uses the caller's `now` (the application's clock), as the
//! port requires, so tests run on any clock. SQLite is a single-node store, so
//! there is no skew between nodes to tolerate.
//!
//! # Wake-ups
//!
//! [`OutboxStore::wakeups`](crate::OutboxStore::wakeups) fires when a
//! message is committed through this store: at once after
//! [`OutboxStore::enqueue`](crate::OutboxStore::enqueue) and requeues, and
//! from SQLite's hooks for [`SqliteOutbox::enqueue_in`]. The first enqueue
//! on a connection gives it an update, a commit and a rollback hook for
//! the rest of its life: the update hook notes each table a transaction
//! inserts into, and the commit hook wakes the drains of every store
//! registered for those tables of this database file, so the caller's
//! transaction wakes drains exactly when it commits, and not at all when
//! it rolls back; an insert of the application's own into the table wakes
//! them too. A collation the hooks come with marks the connection, and
//! the insert asks for it in its `RETURNING` clause, so an enqueue on a
//! hooked connection takes no round trip beyond its insert. The commit hook
//! runs while SQLite commits, before the commit returns; that is early
//! enough and never too early, because a claim starts with `BEGIN
//! IMMEDIATE`, which waits for the committing transaction's write lock and
//! then sees its rows. SQLite keeps one hook of each kind per connection:
//! do not install your own on connections you pass to `enqueue_in`.
//!
//! # Runtimes
//!
//! The pool's connections, and the task that batches fenced writes, run on
//! the tokio runtime that first used them; a connection whose runtime shut
//! down is dead. Create the store on the runtime that outlives its users (in
//! an actix application, the system's runtime, before the server starts),
//! and share clones of it, rather than opening it on a short-lived runtime
//! and passing it on. The batch task is started again on the caller's
//! runtime if its own is gone, so only the pool needs this care.

use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};

use super::Wakeups;
use super::connect;
#[cfg(feature = "inspect-statements")]
use super::fenced::FencedOp;
use super::kit::WakeupSender;
use super::sql::{
    self, Dialect, SettlementMode, SqlBackend, SqlOutbox, SqlParts, StoredTime, TableName,
};
use crate::database::DatabaseKind;
use crate::error::{Error, Result};
use statements::Statements;

mod admin;
mod claim;
mod enqueue;
mod schedules;
mod settle;
mod statements;
mod wakes;

/// The shared half over this store's core.
type Shared = SqlOutbox<Core>;

/// The migrations for the default `outbox` table, tracked by sqlx in
/// `_sqlx_migrations`. Use it to fold the outbox into a migration run of your
/// own; otherwise [`SqliteOutbox::setup`] does the same for any table name,
/// tracked per table. Use one or the other for a given database.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/sqlite");

/// How long a connection opened by [`SqliteOutbox::connect_options`] waits for
/// another writer before failing with "database is locked".
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// An outbox in a SQLite database. Cheap to clone; clones share the pool,
/// the settlement batch and the wake-ups.
///
/// ```
/// use outbox::prelude::*;
/// use outbox::SqliteOutbox;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> outbox::Result<()> {
/// # let dir = std::env::temp_dir().join(format!("outbox-doc-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir).unwrap();
/// # let url = format!("sqlite://{}/app.db", dir.display());
/// let outbox = SqliteOutbox::connect(&url).await?; // creates the file and the table
///
/// // Enqueue in the same transaction as the business rows.
/// let mut tx = outbox.pool().begin().await.unwrap();
/// sqlx::query("CREATE TABLE IF NOT EXISTS orders (id INTEGER)").execute(&mut *tx).await.unwrap();
/// sqlx::query("INSERT INTO orders (id) VALUES (7)").execute(&mut *tx).await.unwrap();
/// let message = NewMessage::new(outbox::MessageKind::Event, "order.placed", serde_json::json!({"order_id": 7}).into());
/// outbox.enqueue_in(&mut tx, message).await?;
/// tx.commit().await.unwrap();
///
/// let now = outbox::SystemClock.now();
/// let batch = outbox
///     .claim_batch(ClaimBatch { on_dead_letter: Default::default(), limit: 10, now, lease: std::time::Duration::from_secs(30), max_attempts: outbox::DEFAULT_MAX_ATTEMPTS, queues: Vec::new(), durable: true })
///     .await?;
/// assert_eq!(batch.claimed.len(), 1);
/// # std::fs::remove_dir_all(&dir).ok();
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct SqliteOutbox {
    inner: SqlOutbox<Core>,
}

impl std::fmt::Debug for SqliteOutbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteOutbox")
            .field("table", &self.inner.core.parts.table.to_string())
            .field("settlement", &self.inner.mode())
            .finish_non_exhaustive()
    }
}

/// Settings for a [`SqliteOutbox`]; start with [`SqliteOutbox::builder`].
#[derive(Debug, Clone)]
pub struct SqliteOutboxBuilder {
    pool: SqlitePool,
    table: TableName,
    settlement: SettlementMode,
}

impl SqliteOutboxBuilder {
    /// Use this table (`table` or `schema.table`, where the schema is an
    /// attached database such as `main`); `outbox` by default.
    pub fn table(mut self, name: &str) -> Result<Self> {
        let table = TableName::parse(name)?;
        if table.table().to_ascii_lowercase().starts_with("sqlite_") {
            return Err(Error::InvalidTableName {
                name: name.to_owned(),
                reason: "SQLite reserves names starting with `sqlite_`",
            });
        }
        self.table = table;
        Ok(self)
    }

    /// The store. Call [`SqliteOutbox::setup`] once before using a new table.
    pub fn build(self) -> SqliteOutbox {
        SqliteOutbox {
            // SQLite takes one writer at a time: a second statement in
            // flight would only wait for the database lock.
            inner: SqlOutbox::new(Core::new(self.pool, self.table), self.settlement, 1),
        }
    }
}

impl SqliteOutbox {
    /// A store on `pool` with the default settings. The pool should use WAL
    /// and a busy timeout; [`SqliteOutbox::connect_options`] sets both.
    pub fn new(pool: SqlitePool) -> Self {
        Self::builder(pool).build()
    }

    /// Settings for a store on `pool`.
    pub fn builder(pool: SqlitePool) -> SqliteOutboxBuilder {
        SqliteOutboxBuilder {
            pool,
            table: TableName::default(),
            settlement: SettlementMode::default(),
        }
    }

    /// Open (creating it if missing) the database at `url`, with
    /// [`SqliteOutbox::connect_options`], and set up the default table.
    ///
    /// An in-memory database (`sqlite::memory:`) gets a pool of exactly one
    /// connection, since it lives only as long as that connection: commit or
    /// drop a transaction taken from [`SqliteOutbox::pool`] before calling
    /// the store, which waits for that connection.
    pub async fn connect(url: &str) -> Result<Self> {
        let options = Self::connect_options(url)?;
        let mut pool = SqlitePoolOptions::new();
        if url.contains(":memory:") || url.contains("mode=memory") {
            // An in-memory database lives as long as a connection to it, and
            // its connections share tables under shared-cache locking, which
            // the busy timeout does not cover: keep exactly one, for good.
            pool = pool
                .max_connections(1)
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None);
        }
        let pool = pool
            .connect_with(options)
            .await
            .map_err(|e| connect::connect_failed(url, &e, DatabaseKind::Sqlite))?;
        let outbox = Self::new(pool);
        outbox.setup().await?;
        Ok(outbox)
    }

    /// Connection options for an outbox database: WAL journal, `synchronous =
    /// NORMAL` (durable in WAL mode except for the last commits before a power
    /// loss), a busy timeout of [`DEFAULT_BUSY_TIMEOUT`], and the file created
    /// when missing.
    ///
    /// A PostgreSQL URL, or a SQLite URL without a path, is refused with
    /// [`Error::Url`] saying what to pass instead.
    pub fn connect_options(url: &str) -> Result<SqliteConnectOptions> {
        Ok(Self::parse_url(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(DEFAULT_BUSY_TIMEOUT))
    }

    /// Connection options that only read: the file is opened read-only,
    /// never created, and its journal mode is left as it is, so inspecting a
    /// database (one that may not even be an outbox) never changes it. A
    /// store on such a pool can count, list and show messages; its writes
    /// fail. URLs are checked as by [`SqliteOutbox::connect_options`].
    pub fn read_only_options(url: &str) -> Result<SqliteConnectOptions> {
        Ok(Self::parse_url(url)?
            .read_only(true)
            .create_if_missing(false)
            .busy_timeout(DEFAULT_BUSY_TIMEOUT))
    }

    fn parse_url(url: &str) -> Result<SqliteConnectOptions> {
        connect::check_sqlite_url(url)?;
        SqliteConnectOptions::from_str(url)
            .map_err(|e| connect::malformed(url, DatabaseKind::Sqlite, e))
    }

    /// Create or upgrade this store's table and indexes. Safe to run any
    /// number of times, from any number of processes.
    pub async fn setup(&self) -> Result<()> {
        let migrator = self.migrator();
        // sqlx takes no lock around SQLite migrations: a process that read
        // the applied versions just before another one applied the next
        // migration fails on it (a duplicate version, or a column added
        // twice). Read again; each such failure means the other process got
        // one migration further, so one retry per migration is enough for
        // any number of racing processes, and a real error still surfaces.
        let mut attempts = migrator.iter().count();
        loop {
            match migrator.run(&self.inner.core.parts.pool).await {
                Ok(()) => return Ok(()),
                Err(_) if attempts > 0 => attempts -= 1,
                Err(e) => return Err(Error::store("setup", e)),
            }
        }
    }

    /// The migrations for this store's table, tracked in
    /// `"<table>_migrations"`; [`SqliteOutbox::setup`] runs them.
    pub fn migrator(&self) -> sqlx::migrate::Migrator {
        sql::migrator_for(&MIGRATOR, &self.inner.core.parts.table, Dialect::Sqlite)
    }

    /// The statement that picks a claim's rows, whose plan decides what a
    /// claim costs. Binds as the claim: `?1` now and `?2` lease end (µs
    /// since the epoch), `?3` limit, `?4` block, `?5` the queues as JSON,
    /// `?6` the walk, `?7` the largest queue limit.
    #[cfg(feature = "inspect-statements")]
    #[doc(hidden)]
    pub fn claim_statement(&self) -> &str {
        &self.inner.core.sql.pick
    }

    /// The statement that claims the rows picked, by rowid. Binds: `?1`
    /// now and `?2` lease end, `?3` a JSON array of `[seq, token, attempt
    /// cap]`.
    #[cfg(feature = "inspect-statements")]
    #[doc(hidden)]
    pub fn claim_take_statement(&self) -> &str {
        &self.inner.core.sql.take
    }

    /// The fenced write that marks a batch delivered. Binds: `?1` a JSON
    /// array of `[id, token, now]` rows (`now` in µs); returns the ids it
    /// changed.
    #[cfg(feature = "inspect-statements")]
    #[doc(hidden)]
    pub fn fenced_statement(&self) -> &str {
        self.inner.core.sql.fenced.get(FencedOp::Deliver)
    }

    fn subscribe(&self) -> Option<Wakeups> {
        Some(self.inner.core.wake.subscribe())
    }
}

sql::sql_store!(
    SqliteOutbox,
    SqliteOutboxBuilder,
    SqlitePool,
    SqliteConnection
);

/// What the store and its settlement batch share.
struct Core {
    parts: SqlParts<sqlx::Sqlite>,
    sql: Statements,
    /// Taken by every write the store makes on its own connections.
    write: tokio::sync::Mutex<()>,
    /// Wakes drains when the store commits messages.
    wake: WakeupSender,
    /// The database file, as absolute a path as can be had without
    /// touching it: with the table, what names the store's drains to the
    /// hooks that wake them (see `wakes.rs`).
    database: std::sync::Arc<str>,
    /// The periodic schedules' statements.
    schedules: sql::ScheduleStatements,
}

impl Core {
    fn new(pool: SqlitePool, table: TableName) -> Self {
        let (sql, shared) = Statements::new(&table);
        let schedules = sql::ScheduleStatements::new(&table, Dialect::Sqlite);
        let file = pool.connect_options().get_filename().to_owned();
        let database: std::sync::Arc<str> = std::path::absolute(&file)
            .unwrap_or(file)
            .to_string_lossy()
            .into();
        let wake = WakeupSender::new();
        wakes::register(&database, &table, &wake);
        Core {
            sql,
            parts: SqlParts {
                pool,
                table,
                shared,
            },
            write: tokio::sync::Mutex::new(()),
            wake,
            database,
            schedules,
        }
    }

    /// Nothing to do: the database is in process, and SQLite prepares a
    /// statement in microseconds.
    async fn warm_up(&self, _claims: usize) -> Result<()> {
        Ok(())
    }

    /// One: every claim is a write, and SQLite has a single writer.
    pub(crate) fn claim_parallelism(&self) -> usize {
        1
    }

    /// Yes: a claim is a transaction of the single writer, whose fixed
    /// cost claims of a few rows each pay over and over as slots free one
    /// by one. Up to [`Core::prefetch_limit`].
    pub(crate) fn claims_ahead(&self) -> bool {
        true
    }

    /// 512: claims that large leave little of a transaction's fixed cost
    /// to each message, and more held ahead only costs memory (measured in
    /// BENCHMARKS.md, "Drain cost per message").
    pub(crate) fn prefetch_limit(&self) -> usize {
        512
    }
}

impl SqlBackend for Core {
    type Db = sqlx::Sqlite;
    /// Microseconds since the epoch, as INTEGER.
    type Time = i64;

    fn parts(&self) -> &SqlParts<sqlx::Sqlite> {
        &self.parts
    }

    async fn write_lock(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        Some(self.write.lock().await)
    }

    /// Requeued rows are committed when the statement returns.
    async fn after_requeue(&self) {
        self.wake.wake();
    }

    /// SQLite keeps whatever type a value was written with, whatever the
    /// column's declared type: try each storage class.
    fn raw_columns(
        row: &sqlx::sqlite::SqliteRow,
    ) -> std::collections::BTreeMap<String, Option<String>> {
        use sqlx::Column;
        row.columns()
            .iter()
            .map(|column| {
                let i = column.ordinal();
                let text = row
                    .try_get::<Option<String>, _>(i)
                    .or_else(|_| {
                        row.try_get::<Option<i64>, _>(i)
                            .map(|v| v.map(|v| v.to_string()))
                    })
                    .or_else(|_| {
                        row.try_get::<Option<f64>, _>(i)
                            .map(|v| v.map(|v| v.to_string()))
                    })
                    .or_else(|_| {
                        row.try_get::<Option<Vec<u8>>, _>(i)
                            .map(|v| v.map(|v| String::from_utf8_lossy(&v).into_owned()))
                    })
                    .unwrap_or_else(|e| Some(format!("<unreadable: {e}>")));
                (column.name().to_owned(), text)
            })
            .collect()
    }
}

/// `at` as the store binds it: µs since the epoch.
fn micros(at: DateTime<Utc>) -> i64 {
    i64::store(at)
}

#[cfg(test)]
mod tests;
