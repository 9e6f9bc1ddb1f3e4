//! The SQLite store: the embedded default.
//!
//! This file is the store and its claim; `statements.rs` holds its SQL text,
//! `admin.rs` its listing. What it shares with the PostgreSQL store (fenced
//! writes, requeue, purge, stats, reading rows) is in [`crate::store::sql`].
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
//! [`OutboxStore::wakeups`](crate::OutboxStore::wakeups) fires when a message is committed through this
//! store: at once after [`OutboxStore::enqueue`](crate::OutboxStore::enqueue) and requeues, and from a
//! SQLite commit hook for [`SqliteOutbox::enqueue_in`], which installs the
//! hook on the caller's connection, so the caller's own transaction wakes the
//! drain exactly when it commits, and not at all when it rolls back. The hook
//! runs while SQLite commits, before the commit returns; that is early enough
//! and never too early, because a claim starts with `BEGIN IMMEDIATE`, which
//! waits for the committing transaction's write lock and then sees its rows.
//! Rows inserted into the table by other means are found on the next tick.
//! SQLite keeps one commit hook per connection: do not install your own on
//! connections you pass to `enqueue_in` (and of two stores enqueueing in one
//! transaction, only the last one's wake-up fires).
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
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteRow, SqliteSynchronous,
};
use sqlx::{AssertSqlSafe, Connection, Row};

use super::connect;
use super::fenced::{FencedBackend, FencedOp, FencedWrite};
use super::kit::{WakeupSender, check, lease_end};
use super::sql::{
    self, Dialect, SettlementMode, SqlBackend, SqlOutbox, SqlParts, StoredTime, TableName, db,
};
use super::{ClaimBatch, ClaimedBatch, Wakeups};
use crate::error::ErrorRecord;
use crate::error::{AbandonedClaimError, Backend, Error, Result};
use crate::kind::MessageStatus;
use crate::message::{
    ClaimedMessage, Enqueued, NewMessage, OnDeadLetter, OutboxMessage, new_claim_token,
};
use crate::payload::Payload;
use statements::{FencedWrites, Statements};

mod admin;
mod statements;

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
///     .claim_batch(ClaimBatch { on_dead_letter: Default::default(), limit: 10, now, lease: std::time::Duration::from_secs(30), max_attempts: outbox::DEFAULT_MAX_ATTEMPTS })
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
            .map_err(|e| connect::connect_failed(url, &e, Backend::Sqlite))?;
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
        SqliteConnectOptions::from_str(url).map_err(|e| connect::malformed(url, Backend::Sqlite, e))
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
    /// claim costs. Binds: `?1` now and `?2` lease end (µs since the
    /// epoch), `?3` limit.
    #[cfg(feature = "inspect-statements")]
    #[doc(hidden)]
    pub fn claim_statement(&self) -> &str {
        &self.inner.core.sql.pick
    }

    /// The statement that claims the rows picked, by rowid. Binds: `?1`
    /// now and `?2` lease end, `?3` a JSON array of `[seq, token]`, `?4`
    /// the attempt cap.
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

    /// Enqueue on the caller's connection, inside the caller's transaction
    /// when there is one (`&mut *tx`): rolled back, the message is gone;
    /// committed, the next claim sees it and [`OutboxStore::wakeups`](crate::OutboxStore::wakeups) fires.
    pub async fn enqueue_in(
        &self,
        conn: &mut SqliteConnection,
        message: NewMessage,
    ) -> Result<Enqueued> {
        message.validate()?;
        self.arm_wakeup(conn).await?;
        self.inner.core.insert(conn, message).await
    }

    /// Wake on this connection's next commit, not on a rollback.
    async fn arm_wakeup(&self, conn: &mut SqliteConnection) -> Result<()> {
        let mut handle = conn.lock_handle().await.map_err(db("enqueue"))?;
        let armed = Arc::new(AtomicBool::new(true));
        let disarm = armed.clone();
        let wake = self.inner.core.wake.clone();
        handle.set_commit_hook(move || {
            if armed.swap(false, Ordering::AcqRel) {
                wake.wake();
            }
            true
        });
        handle.set_rollback_hook(move || disarm.store(false, Ordering::Release));
        Ok(())
    }

    /// Enqueue through the store's own pool, in a transaction of its own.
    async fn enqueue_now(&self, message: NewMessage) -> Result<Enqueued> {
        message.validate()?;
        let core = &self.inner.core;
        let enqueued = {
            let _write = core.write.lock().await;
            let mut conn = core.parts.pool.acquire().await.map_err(db("enqueue"))?;
            core.insert(&mut conn, message).await?
        };
        // Autocommit: the row is committed now.
        if enqueued.is_inserted() {
            core.wake.wake();
        }
        Ok(enqueued)
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
}

impl Core {
    fn new(pool: SqlitePool, table: TableName) -> Self {
        let (sql, shared) = Statements::new(&table);
        Core {
            sql,
            parts: SqlParts {
                pool,
                table,
                shared,
            },
            write: tokio::sync::Mutex::new(()),
            wake: WakeupSender::new(),
        }
    }

    /// Insert unless the id is taken. A taken id is not a constraint
    /// violation (`ON CONFLICT DO NOTHING`), so the caller's transaction
    /// goes on as if the statement had not run.
    async fn insert(&self, conn: &mut SqliteConnection, message: NewMessage) -> Result<Enqueued> {
        let id = message.resolve_id();
        let message = NewMessage {
            id: Some(id.clone()),
            ..message
        };
        let sql = self.sql.insert.clone();
        Shared::insert_idempotent(&self.parts, conn, &message, id, |conn| {
            let (_, query) = Shared::insert(&sql, &message, false);
            Box::pin(async move {
                let done = query.execute(conn).await.map_err(db("enqueue"))?;
                Ok(done.rows_affected() > 0)
            })
        })
        .await
    }

    /// Nothing to do: the database is in process, and SQLite prepares a
    /// statement in microseconds.
    async fn warm_up(&self, _claims: usize) -> Result<()> {
        Ok(())
    }

    async fn claim(&self, params: ClaimBatch) -> Result<ClaimedBatch> {
        check::claim_batch(&params)?;
        let ClaimBatch {
            on_dead_letter,
            limit,
            now,
            lease,
            max_attempts: cap,
        } = params;
        let locked_until = lease_end(now, lease)?;
        let _write = self.write.lock().await;
        let mut conn = self.parts.pool.acquire().await.map_err(db("claim_batch"))?;
        let mut tx = conn
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(db("claim_batch"))?;
        // The claim's binds, in the order of both `claim` and `pick`.
        let bound = |statement: &Arc<str>| {
            sqlx::query(AssertSqlSafe(statement.clone()))
                .bind(micros(now))
                .bind(micros(locked_until))
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .bind(on_dead_letter == OnDeadLetter::Block)
                .bind(i64::from(cap))
                .bind(i64::try_from(sql::keyed_walk(limit)).unwrap_or(i64::MAX))
        };
        let picked = match bound(&self.sql.pick).fetch_one(&mut *tx).await {
            Ok(row) => row
                .try_get::<&str, _>(0)
                .ok()
                .and_then(|json| serde_json::from_str::<Vec<Picked>>(json).ok()),
            Err(e) => {
                tracing::debug!(table = %self.parts.table, error = %e,
                    "claim rows not readable as JSON; claiming with one statement");
                None
            }
        };
        let mut selected = Vec::new();
        let rows = match picked {
            Some(picked) => {
                self.take(&mut tx, &picked, now, locked_until, cap, &mut selected)
                    .await?
            }
            // A value JSON cannot carry (text that is not UTF-8): claim the
            // rows with one statement that reads each value as it is, so
            // the rows below say what is wrong with them.
            None => bound(&self.sql.claim)
                .fetch_all(&mut *tx)
                .await
                .map_err(db("claim_batch"))?,
        };
        for row in &rows {
            if let Some(claimed) = claimed_row(row, cap) {
                selected.push(claimed);
                continue;
            }
            // Dead-lettered at claim, or unreadable: the full decode says
            // which, and why.
            match Shared::decode(row).and_then(|read| Ok((read.seq, read.into_message()?))) {
                Ok((seq, message)) => selected.push((seq, Selected::Abandoned(message))),
                Err(unreadable) => {
                    let seq: i64 = row.try_get("seq").map_err(db("claim_batch"))?;
                    self.quarantine(&mut tx, seq, &unreadable, now).await?;
                }
            }
        }
        selected.sort_by_key(|(seq, selected)| {
            let (available_at, created_at) = selected.order();
            (available_at, created_at, *seq)
        });
        let mut batch = ClaimedBatch::default();
        for (seq, selected) in selected {
            let mut message = match selected {
                Selected::Claimed(message) => {
                    batch.claimed.push(message);
                    continue;
                }
                Selected::Abandoned(message) => message,
            };
            if message.status == MessageStatus::DeadLettered {
                let record = ErrorRecord::from_error(&AbandonedClaimError {
                    id: message.id.clone(),
                    attempts: message.attempts,
                    max_attempts: message.effective_max_attempts(cap),
                });
                sqlx::query(AssertSqlSafe(self.sql.abandoned.clone()))
                    .bind(record.to_json())
                    .bind(seq)
                    .execute(&mut *tx)
                    .await
                    .map_err(db("claim_batch"))?;
                message.last_error = Some(record);
                batch.dead_lettered.push(message);
            } else {
                batch.claimed.push(sql::claimed_view(message, cap)?);
            }
        }
        tx.commit().await.map_err(db("claim_batch"))?;
        Ok(batch)
    }

    /// Claim the rows `picked` in `tx`, pushing onto `selected` each one
    /// claimed whose picked columns decode; returns the rest (out of
    /// attempts and so dead-lettered, or with a column the delivery cannot
    /// read) as stored after the claim, for the full decode to sort out.
    async fn take(
        &self,
        tx: &mut SqliteConnection,
        picked: &[Picked],
        now: DateTime<Utc>,
        locked_until: DateTime<Utc>,
        cap: u32,
        selected: &mut Vec<(i64, Selected)>,
    ) -> Result<Vec<SqliteRow>> {
        if picked.is_empty() {
            return Ok(Vec::new());
        }
        let tokens: Vec<String> = picked.iter().map(|_| new_claim_token()).collect();
        let rows = serde_json::to_string(
            &picked
                .iter()
                .zip(&tokens)
                .map(|(picked, token)| (picked.0, token))
                .collect::<Vec<_>>(),
        )
        .expect("integers and strings serialize");
        let done = sqlx::query(AssertSqlSafe(self.sql.take.clone()))
            .bind(micros(now))
            .bind(micros(locked_until))
            .bind(rows)
            .bind(i64::from(cap))
            .execute(&mut *tx)
            .await
            .map_err(db("claim_batch"))?;
        // The write lock has been held since the rows were picked, so
        // nothing else can have changed them.
        if usize::try_from(done.rows_affected()) != Ok(picked.len()) {
            return Err(Error::store(
                "claim_batch",
                std::io::Error::other(format!(
                    "{} rows picked, {} claimed",
                    picked.len(),
                    done.rows_affected()
                )),
            ));
        }
        // The times as stored, to the microsecond.
        let claimed_at = DateTime::from_timestamp_micros(micros(now));
        let until = DateTime::from_timestamp_micros(micros(locked_until));
        let mut rest = Vec::new();
        for (Picked(seq, columns), token) in picked.iter().zip(tokens) {
            let claimed = columns.as_deref().zip(claimed_at.zip(until)).and_then(
                |(columns, (claimed_at, until))| {
                    picked_claim(columns, cap, token, claimed_at, until)
                },
            );
            match claimed {
                Some(message) => selected.push((*seq, Selected::Claimed(message))),
                None => rest.push(*seq),
            }
        }
        if rest.is_empty() {
            return Ok(Vec::new());
        }
        sqlx::query(AssertSqlSafe(self.sql.by_seq.clone()))
            .bind(serde_json::to_string(&rest).expect("integers serialize"))
            .fetch_all(&mut *tx)
            .await
            .map_err(db("claim_batch"))
    }

    /// Dead-letter a row a claim selected but cannot read, so it does not
    /// stop every claim after it; an operator finds the reason in `last_error`.
    async fn quarantine(
        &self,
        conn: &mut SqliteConnection,
        seq: i64,
        unreadable: &Error,
        now: DateTime<Utc>,
    ) -> Result<()> {
        tracing::error!(table = %self.parts.table, seq, error = %unreadable,
            "outbox row is unreadable; dead-lettered");
        sqlx::query(AssertSqlSafe(self.sql.quarantine.clone()))
            .bind(ErrorRecord::from_error(unreadable).to_json())
            .bind(micros(now))
            .bind(seq)
            .execute(conn)
            .await
            .map_err(db("claim_batch"))?;
        Ok(())
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

impl FencedBackend for Core {
    /// One statement per kind of write in the batch (a batch of renewals is
    /// one statement, renewals and deliveries are two), each row fenced on
    /// its own. A statement that fails fails its rows only.
    async fn apply(&self, rows: &[FencedWrite]) -> Result<Vec<Result<()>>> {
        let mut results: Vec<Option<Result<()>>> = vec![None; rows.len()];
        let mut lost = Vec::new();
        {
            let _write = self.write.lock().await;
            for kind in FencedWrites::KINDS {
                let group: Vec<usize> = (0..rows.len())
                    .filter(|&i| rows[i].op.code() == kind)
                    .collect();
                let Some(&first) = group.first() else {
                    continue;
                };
                let op = rows[first].op;
                let json = fenced_json(group.iter().map(|&i| &rows[i]));
                match self.write_group(op, &json, group.len()).await {
                    Ok(None) => {
                        for &i in &group {
                            results[i] = Some(Ok(()));
                        }
                    }
                    Ok(Some(changed)) => {
                        for &i in &group {
                            if changed.contains(&rows[i].id) {
                                results[i] = Some(Ok(()));
                            } else {
                                lost.push(i);
                            }
                        }
                    }
                    Err(e) => {
                        let error = Error::store(op.operation(), e);
                        for &i in &group {
                            results[i] = Some(Err(error.clone()));
                        }
                    }
                }
            }
        }
        if !lost.is_empty() {
            let ids: Vec<&str> = lost.iter().map(|&i| rows[i].id.as_str()).collect();
            let json = serde_json::to_string(&ids).expect("ids serialize");
            let fences = Shared::fences(&self.parts, &self.sql.fences, json).await;
            for i in lost {
                results[i] = Some(sql::lost_claim(&rows[i], &fences));
            }
        }
        Ok(results
            .into_iter()
            .map(|result| result.expect("every row belongs to one kind of write"))
            .collect())
    }
}

/// From how many rows a fenced write is counted rather than returning its
/// ids: each id comes back from SQLite's worker as a row of its own, which
/// past a few rows costs more than the transaction's two extra commands.
const COUNTED_FROM: usize = 8;

impl Core {
    /// Apply one kind of write, `op`, to the `count` rows of `json`: `None`
    /// when every row applied, else the ids of the rows that did.
    async fn write_group(
        &self,
        op: FencedOp,
        json: &str,
        count: usize,
    ) -> sqlx::Result<Option<std::collections::HashSet<String>>> {
        let mut conn = self.parts.pool.acquire().await?;
        if count >= COUNTED_FROM {
            // Ids are distinct, so each row changes at most one message: a
            // full count means every row applied. A short one is undone and
            // the write run again, returning which rows it changed.
            let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
            let done = sqlx::query(AssertSqlSafe(self.sql.fenced.counted(op).clone()))
                .bind(json)
                .execute(&mut *tx)
                .await?;
            if usize::try_from(done.rows_affected()) == Ok(count) {
                tx.commit().await?;
                return Ok(None);
            }
            tx.rollback().await?;
        }
        let changed: Vec<String> =
            sqlx::query_scalar(AssertSqlSafe(self.sql.fenced.get(op).clone()))
                .bind(json)
                .fetch_all(&mut *conn)
                .await?;
        Ok(Some(changed.into_iter().collect()))
    }
}

/// The JSON array of rows a fenced write reads, each `[id, token, now]`
/// (`now` in µs), then what the write sets (the new lease end, or the retry
/// time and the error record). Written straight to text, one row at a time.
fn fenced_json<'a>(rows: impl Iterator<Item = &'a FencedWrite>) -> String {
    let mut json = Vec::with_capacity(128);
    json.push(b'[');
    for (n, row) in rows.enumerate() {
        if n > 0 {
            json.push(b',');
        }
        let fence = (row.id.as_str(), row.claim_token.as_str(), micros(row.now));
        let (id, token, now) = fence;
        let error = row.error.as_deref();
        let written = match row.op {
            FencedOp::Renew { locked_until, .. } => {
                serde_json::to_writer(&mut json, &(id, token, now, micros(locked_until)))
            }
            FencedOp::Retry { available_at } => {
                serde_json::to_writer(&mut json, &(id, token, now, micros(available_at), error))
            }
            FencedOp::DeadLetter => serde_json::to_writer(&mut json, &(id, token, now, error)),
            FencedOp::Deliver | FencedOp::Delete | FencedOp::Release => {
                serde_json::to_writer(&mut json, &fence)
            }
        };
        written.expect("strings and integers serialize");
    }
    json.push(b']');
    String::from_utf8(json).expect("serde_json writes UTF-8")
}

/// A row a claim selected: claimed, or dead-lettered at claim (out of
/// attempts), which the caller gets as the full stored message.
enum Selected {
    Claimed(ClaimedMessage),
    Abandoned(OutboxMessage),
}

impl Selected {
    /// Where the row stands in claim order, before its `seq`.
    fn order(&self) -> (DateTime<Utc>, DateTime<Utc>) {
        match self {
            Selected::Claimed(m) => (m.available_at, m.created_at),
            Selected::Abandoned(m) => (m.available_at, m.created_at),
        }
    }
}

/// A row the claim returned as claimed, decoded by position (the order of
/// [`statements::COLUMNS`]) straight into the message a delivery gets, with
/// `cap` the claim's attempt cap. `None` for any other row, or one with a
/// column the full decode ([`SqlOutbox::decode`]) would refuse: that decode
/// then says what the row is, or why it cannot be read. Columns the
/// delivery does not need are still checked, not copied.
fn claimed_row(row: &SqliteRow, cap: u32) -> Option<(i64, Selected)> {
    let text = |i: usize| row.try_get::<&str, _>(i).ok();
    let optional_text = |i: usize| row.try_get::<Option<&str>, _>(i).ok();
    let time = |i: usize| DateTime::from_timestamp_micros(row.try_get::<i64, _>(i).ok()?);
    let optional_time = |i: usize| match row.try_get::<Option<i64>, _>(i).ok()? {
        Some(micros) => DateTime::from_timestamp_micros(micros).map(Some),
        None => Some(None),
    };
    let count = |i: usize| u32::try_from(row.try_get::<i64, _>(i).ok()?).ok();
    if text(6)? != MessageStatus::Claimed.as_str() {
        return None;
    }
    let trace = match optional_text(5)? {
        Some(text) => Some(serde_json::from_str(text).ok()?),
        None => None,
    };
    // Read only to be checked, as the full decode would.
    optional_text(13)?;
    time(15)?;
    optional_time(16)?;
    optional_time(18)?;
    let max_attempts_set: bool = row.try_get(19).ok()?;
    let max_attempts = count(8)?;
    let message = ClaimedMessage {
        id: text(1)?.to_owned(),
        kind: text(2)?.parse().ok()?,
        name: text(3)?.to_owned(),
        payload: Payload::from_json(text(4)?).ok()?,
        trace,
        attempts: count(7)?,
        max_attempts: if max_attempts_set { max_attempts } else { cap },
        max_attempts_set,
        available_at: time(9)?,
        created_at: time(14)?,
        ordering_key: optional_text(17)?.map(str::to_owned),
        claim_token: optional_text(10)??.to_owned(),
        claimed_at: optional_time(11)??,
        locked_until: optional_time(12)??,
    };
    Some((row.try_get(0).ok()?, Selected::Claimed(message)))
}

/// A row as [`Statements::pick`](statements::Statements) writes it out: its
/// `seq` and its [`statements::PICKED`] columns, `None` when one held a
/// blob.
#[derive(serde::Deserialize)]
struct Picked(i64, Option<Box<serde_json::value::RawValue>>);

/// The [`statements::PICKED`] columns, in their order, as JSON carries
/// them: a column of another type (an integer stored as text, say) fails
/// to decode, as it would from the row.
type PickedColumns = (
    String,
    String,
    String,
    String,
    Option<String>,
    i64,
    i64,
    i64,
    i64,
    i64,
    Option<String>,
    Option<String>,
    Option<i64>,
    Option<i64>,
);

/// The message a delivery gets for a picked row that the claim took, with
/// `cap` the claim's attempt cap and the claim's `token` and times. `None`
/// when the row was out of attempts (the claim dead-lettered it), or has a
/// column the full decode would refuse, as [`claimed_row`] decides.
fn picked_claim(
    columns: &serde_json::value::RawValue,
    cap: u32,
    token: String,
    claimed_at: DateTime<Utc>,
    locked_until: DateTime<Utc>,
) -> Option<ClaimedMessage> {
    let (
        id,
        kind,
        name,
        payload,
        trace,
        attempts,
        max_attempts,
        max_attempts_set,
        available_at,
        created_at,
        ordering_key,
        _last_error,
        delivered_at,
        skipped_at,
    ): PickedColumns = serde_json::from_str(columns.get()).ok()?;
    let max_attempts_set = max_attempts_set != 0;
    // As the claim's own test, on the stored integers.
    if attempts
        >= (if max_attempts_set {
            max_attempts
        } else {
            i64::from(cap)
        })
    {
        return None;
    }
    let time = DateTime::from_timestamp_micros;
    for micros in [delivered_at, skipped_at].into_iter().flatten() {
        time(micros)?;
    }
    let trace = match trace {
        Some(text) => Some(serde_json::from_str(&text).ok()?),
        None => None,
    };
    let max_attempts = u32::try_from(max_attempts).ok()?;
    Some(ClaimedMessage {
        id,
        kind: kind.parse().ok()?,
        name,
        payload: Payload::from_json(payload).ok()?,
        trace,
        attempts: u32::try_from(attempts.checked_add(1)?).ok()?,
        max_attempts: if max_attempts_set { max_attempts } else { cap },
        max_attempts_set,
        available_at: time(available_at)?,
        created_at: time(created_at)?,
        ordering_key,
        claim_token: token,
        claimed_at,
        locked_until,
    })
}

/// `at` as the store binds it: µs since the epoch.
fn micros(at: DateTime<Utc>) -> i64 {
    i64::store(at)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use chrono::TimeZone;

    use super::*;
    use crate::kind::MessageKind;
    use crate::store::{OutboxAdmin, OutboxStore};

    /// The store's statements select the message columns in the order the
    /// shared decode reads them by position (any other order is still read,
    /// by name, at a cost per row).
    #[test]
    fn statements_select_the_columns_in_the_decoded_order() {
        assert_eq!(
            statements::COLUMNS.split(", ").collect::<Vec<_>>(),
            crate::store::sql::MESSAGE_COLUMNS
        );
    }

    /// A database file of its own, removed on drop.
    struct TempFile(PathBuf);

    impl TempFile {
        fn new(name: &str) -> Self {
            let unique = crate::message::new_claim_token();
            TempFile(std::env::temp_dir().join(format!("outbox-unit-{name}-{unique}.db")))
        }

        fn url(&self) -> String {
            format!("sqlite://{}", self.0.display())
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            for suffix in ["", "-wal", "-shm"] {
                let mut path = self.0.clone().into_os_string();
                path.push(suffix);
                let _ = std::fs::remove_file(path);
            }
        }
    }

    fn t0() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap()
    }

    /// A store holding `count` claimed messages, and those claims.
    async fn claimed(file: &TempFile, count: usize) -> (SqliteOutbox, Vec<crate::ClaimedMessage>) {
        let store = SqliteOutbox::connect(&file.url()).await.unwrap();
        for n in 0..count {
            let payload = crate::Payload::from_json(format!("{{\"n\":{n}}}")).unwrap();
            let message = NewMessage::new(MessageKind::Event, "test", payload).at(t0());
            store.enqueue(message).await.unwrap();
        }
        let batch = store
            .claim_batch(ClaimBatch {
                on_dead_letter: Default::default(),
                limit: count,
                now: t0(),
                lease: Duration::from_secs(30),
                max_attempts: crate::DEFAULT_MAX_ATTEMPTS,
            })
            .await
            .unwrap();
        assert_eq!(batch.claimed.len(), count);
        (store, batch.claimed)
    }

    fn row(op: FencedOp, message: &crate::ClaimedMessage) -> FencedWrite {
        FencedWrite {
            op,
            id: message.id.clone(),
            claim_token: message.claim_token.clone(),
            now: t0() + chrono::Duration::seconds(1),
            error: Some(ErrorRecord::new("test::Failure", "failed").to_json()),
        }
    }

    /// Every fenced write looks its rows up by id, with statistics of a
    /// table of mostly settled rows and few claims.
    #[tokio::test]
    async fn every_fenced_write_looks_rows_up_by_id() {
        let file = TempFile::new("plans");
        let (store, _) = claimed(&file, 2_000).await;
        sqlx::query("UPDATE \"outbox\" SET status = 'delivered' WHERE seq > 3")
            .execute(store.pool())
            .await
            .unwrap();
        let mut conn = store.pool().acquire().await.unwrap();
        sqlx::query("ANALYZE").execute(&mut *conn).await.unwrap();
        for statement in store.inner.core.sql.fenced.all() {
            let plan: Vec<String> =
                sqlx::query(AssertSqlSafe(format!("EXPLAIN QUERY PLAN {statement}")))
                    .bind("[]")
                    .fetch_all(&mut *conn)
                    .await
                    .unwrap()
                    .iter()
                    .map(|row| row.get::<String, _>("detail"))
                    .collect();
            assert!(
                plan.iter()
                    .any(|l| l.contains("USING INDEX sqlite_autoindex") && l.contains("(id=?)")),
                "{statement}\ndoes not look rows up by id:\n{}",
                plan.join("\n")
            );
        }
    }

    /// A write of many rows is counted rather than returning ids: when
    /// every row applies, all are answered `Ok`; when some do not, the
    /// count is short, the write is undone and run again returning ids, so
    /// each row still gets its own answer and the others still apply.
    #[tokio::test]
    async fn a_counted_write_answers_each_row() {
        let file = TempFile::new("counted");
        let (store, claims) = claimed(&file, 2 * COUNTED_FROM).await;
        let (first, second) = claims.split_at(COUNTED_FROM);
        let rows: Vec<_> = first.iter().map(|c| row(FencedOp::Deliver, c)).collect();
        let results = store.inner.core.apply(&rows).await.unwrap();
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        let mut rows: Vec<_> = second.iter().map(|c| row(FencedOp::Deliver, c)).collect();
        rows[1].claim_token = "not-the-token".into();
        rows[4].claim_token = "not-the-token".into();
        let results = store.inner.core.apply(&rows).await.unwrap();
        for (n, (result, claim)) in results.iter().zip(second).enumerate() {
            let stored = store.get_message(&claim.id).await.unwrap();
            if n == 1 || n == 4 {
                assert!(
                    matches!(result, Err(Error::Claim(_))),
                    "row {n}: {result:?}"
                );
                assert_eq!(stored.status, MessageStatus::Claimed);
            } else {
                assert!(result.is_ok(), "row {n}: {result:?}");
                assert_eq!(stored.status, MessageStatus::Delivered);
            }
        }
    }

    /// The claim's decode by position gives what the full decode of the
    /// same row gives.
    #[tokio::test]
    async fn a_claimed_row_decodes_as_the_full_decode_does() {
        let file = TempFile::new("decode");
        let store = SqliteOutbox::connect(&file.url()).await.unwrap();
        let payload = crate::Payload::from_json(r#"{"n": [1, "two"]}"#).unwrap();
        let message = NewMessage::new(MessageKind::Job, "decode", payload)
            .at(t0())
            .with_ordering_key("k");
        store.enqueue(message).await.unwrap();
        let cap = 7;
        let batch = store
            .claim_batch(ClaimBatch {
                on_dead_letter: Default::default(),
                limit: 1,
                now: t0(),
                lease: Duration::from_secs(30),
                max_attempts: cap,
            })
            .await
            .unwrap();
        let claimed = &batch.claimed[0];
        let row = sqlx::query(AssertSqlSafe(format!(
            "SELECT {} FROM \"outbox\"",
            statements::COLUMNS
        )))
        .fetch_one(store.pool())
        .await
        .unwrap();
        let full = Shared::decode(&row).unwrap().into_message().unwrap();
        assert_eq!(*claimed, sql::claimed_view(full, cap).unwrap());
        assert_eq!(claimed.ordering_key.as_deref(), Some("k"));
        assert_eq!(claimed.max_attempts, cap);
    }

    /// A batch mixing kinds of writes runs one statement per kind; one that
    /// fails fails its own rows, and the others still apply.
    #[tokio::test]
    async fn a_failed_kind_of_write_fails_only_its_rows() {
        let file = TempFile::new("partial");
        let (store, claims) = claimed(&file, 3).await;
        sqlx::query(
            "CREATE TRIGGER no_dead_letters BEFORE UPDATE OF status ON \"outbox\" \
             WHEN NEW.status = 'dead_lettered' BEGIN SELECT RAISE(ABORT, 'refused'); END",
        )
        .execute(store.pool())
        .await
        .unwrap();
        let until = t0() + chrono::Duration::seconds(31);
        let rows = [
            row(FencedOp::Deliver, &claims[0]),
            row(FencedOp::DeadLetter, &claims[1]),
            row(
                FencedOp::Renew {
                    locked_until: until,
                    lease: std::time::Duration::from_secs(31),
                },
                &claims[2],
            ),
        ];
        let results = store.inner.core.apply(&rows).await.unwrap();
        assert!(results[0].is_ok(), "{:?}", results[0]);
        match &results[1] {
            Err(Error::Store { operation, .. }) => assert_eq!(*operation, "mark_failed"),
            other => panic!("the refused dead letter: {other:?}"),
        }
        assert!(results[2].is_ok(), "{:?}", results[2]);
        let status = |id: &str| {
            let store = store.clone();
            let id = id.to_owned();
            async move { store.get_message(&id).await.unwrap() }
        };
        assert_eq!(status(&claims[0].id).await.status, MessageStatus::Delivered);
        assert_eq!(status(&claims[1].id).await.status, MessageStatus::Claimed);
        assert_eq!(status(&claims[2].id).await.locked_until, Some(until));
    }
}
