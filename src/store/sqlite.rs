//! The SQLite store: the embedded default.
//!
//! One table (name configurable, see [`TableName`]), bundled SQLite through
//! sqlx, WAL journal, a `busy_timeout` so writers queue instead of failing.
//! Times are stored as INTEGER microseconds since the epoch.
//!
//! - **Claims** are one `UPDATE ... RETURNING` inside a `BEGIN IMMEDIATE`
//!   transaction: the write lock is taken before anything is read, so two
//!   claimers can never pick the same row, and the claim never has to upgrade
//!   a read lock (which fails in WAL mode when another writer got in first).
//!   Messages out of attempts are dead-lettered by the same statement.
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
//! [`OutboxStore::wakeups`] fires when a message is committed through this
//! store: at once after [`OutboxStore::enqueue`] and requeues, and from a
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

use super::fenced::{FencedWrite, FencedBackend, FencedOp, FencedWriter};
use super::sql::{self, Dialect, MessageRow, SettlementMode, TableName, db};
use super::{
    ClaimBatch, ClaimedBatch, ListMessages, MarkDelivered, MarkFailed, MessagePage, OutboxAdmin,
    OutboxStats, OutboxStore, PurgeMessages, ReleaseClaim, RenewClaim, RequeueDeadLetters,
    WakeupSender, Wakeups, check, lease_end,
};
use crate::error::{AbandonedClaimError, Error, Result};
use crate::message::{ErrorRecord, MessageStatus, NewMessage, OutboxMessage};
use crate::registry::{Event, Job};

/// The migrations for the default `outbox` table, tracked by sqlx in
/// `_sqlx_migrations`. Use it to fold the outbox into a migration run of your
/// own; otherwise [`SqliteOutbox::setup`] does the same for any table name,
/// tracked per table. Use one or the other for a given database.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/sqlite");

/// How long a connection opened by [`SqliteOutbox::connect_options`] waits for
/// another writer before failing with "database is locked".
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

const COLUMNS: &str = "seq, id, kind, name, payload, trace, status, attempts, max_attempts, \
    available_at, claim_token, claimed_at, locked_until, last_error, created_at, updated_at, \
    delivered_at";

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
///     .claim_batch(ClaimBatch { limit: 10, now, lease: std::time::Duration::from_secs(30) })
///     .await?;
/// assert_eq!(batch.claimed.len(), 1);
/// # std::fs::remove_dir_all(&dir).ok();
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct SqliteOutbox {
    core: Arc<Core>,
    settler: Arc<FencedWriter<Core>>,
    wake: WakeupSender,
}

impl std::fmt::Debug for SqliteOutbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteOutbox")
            .field("table", &self.core.table.to_string())
            .field("settlement", &self.settler.mode())
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

    /// How renewals and settlements are sent; batched by default
    /// ([`SettlementMode::DEFAULT_BATCHED`]).
    pub fn settlement(mut self, mode: SettlementMode) -> Result<Self> {
        self.settlement = mode.validate()?;
        Ok(self)
    }

    /// The store. Call [`SqliteOutbox::setup`] once before using a new table.
    pub fn build(self) -> SqliteOutbox {
        let core = Arc::new(Core::new(self.pool, self.table));
        SqliteOutbox {
            settler: Arc::new(FencedWriter::new(core.clone(), self.settlement)),
            core,
            wake: WakeupSender::new(),
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
        let pool = pool.connect_with(options).await.map_err(db("connect"))?;
        let outbox = Self::new(pool);
        outbox.setup().await?;
        Ok(outbox)
    }

    /// Connection options for an outbox database: WAL journal, `synchronous =
    /// NORMAL` (durable in WAL mode except for the last commits before a power
    /// loss), a busy timeout of [`DEFAULT_BUSY_TIMEOUT`], and the file created
    /// when missing.
    pub fn connect_options(url: &str) -> Result<SqliteConnectOptions> {
        Ok(SqliteConnectOptions::from_str(url)
            .map_err(|e| Error::invalid("url", format!("not a SQLite URL: {e}")))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(DEFAULT_BUSY_TIMEOUT))
    }

    /// Create or upgrade this store's table and indexes. Safe to run any
    /// number of times, from any number of processes.
    pub async fn setup(&self) -> Result<()> {
        let migrator = self.migrator();
        // sqlx takes no lock around SQLite migrations: a process that read
        // the applied versions just before another one applied them fails on
        // the duplicate version. Read again; by then they are applied.
        if migrator.run(&self.core.pool).await.is_ok() {
            return Ok(());
        }
        migrator
            .run(&self.core.pool)
            .await
            .map_err(|e| Error::store("setup", e))
    }

    /// The migrations for this store's table, tracked in
    /// `"<table>_migrations"`; [`SqliteOutbox::setup`] runs them.
    pub fn migrator(&self) -> sqlx::migrate::Migrator {
        sql::migrator_for(&MIGRATOR, &self.core.table, Dialect::Sqlite)
    }

    /// The pool the store uses.
    pub fn pool(&self) -> &SqlitePool {
        &self.core.pool
    }

    /// The table the store uses.
    pub fn table(&self) -> &TableName {
        &self.core.table
    }

    /// The claim statement, for tools that measure the store against raw SQL.
    /// Binds: `?1` now and `?2` lease end (µs since the epoch), `?3` limit.
    pub fn claim_sql(&self) -> &str {
        &self.core.sql.claim
    }

    /// The fenced write that marks a batch delivered, as the store runs it
    /// for a batch of [`mark_delivered`](OutboxStore::mark_delivered) calls.
    /// Binds: `?1` a JSON array of `[id, token, now]` rows (`now` in µs);
    /// returns the ids it changed. Renewals and the other settlements have
    /// statements of the same shape.
    pub fn settle_sql(&self) -> &str {
        &self.core.sql.settle.deliver
    }

    /// Enqueue on the caller's connection, inside the caller's transaction
    /// when there is one (`&mut *tx`): rolled back, the message is gone;
    /// committed, the next claim sees it and [`OutboxStore::wakeups`] fires.
    pub async fn enqueue_in(
        &self,
        conn: &mut SqliteConnection,
        message: NewMessage,
    ) -> Result<String> {
        message.validate()?;
        self.arm_wakeup(conn).await?;
        self.core.insert(conn, message).await
    }

    /// [`SqliteOutbox::enqueue_in`] for an event of registered type `E`.
    pub async fn enqueue_event_in<E: Event>(
        &self,
        conn: &mut SqliteConnection,
        payload: &E,
    ) -> Result<String> {
        self.enqueue_in(conn, NewMessage::event(payload)?).await
    }

    /// [`SqliteOutbox::enqueue_in`] for a job of registered type `J`.
    pub async fn enqueue_job_in<J: Job>(
        &self,
        conn: &mut SqliteConnection,
        payload: &J,
    ) -> Result<String> {
        self.enqueue_in(conn, NewMessage::job(payload)?).await
    }

    /// Wake on this connection's next commit, not on a rollback.
    async fn arm_wakeup(&self, conn: &mut SqliteConnection) -> Result<()> {
        let mut handle = conn.lock_handle().await.map_err(db("enqueue"))?;
        let armed = Arc::new(AtomicBool::new(true));
        let disarm = armed.clone();
        let wake = self.wake.clone();
        handle.set_commit_hook(move || {
            if armed.swap(false, Ordering::AcqRel) {
                wake.wake();
            }
            true
        });
        handle.set_rollback_hook(move || disarm.store(false, Ordering::Release));
        Ok(())
    }

    async fn settle(&self, row: FencedWrite) -> Result<()> {
        check::fence(&row.id, &row.claim_token)?;
        self.settler.run(row).await
    }
}

/// The rendered statements for one table.
#[derive(Debug)]
struct Statements {
    insert: Arc<str>,
    claim: Arc<str>,
    abandoned: Arc<str>,
    quarantine: Arc<str>,
    settle: FencedWrites,
    fences: Arc<str>,
    get: Arc<str>,
    stats: Arc<str>,
    requeue_one: Arc<str>,
    requeue_all: Arc<str>,
    requeue_state: Arc<str>,
    purge: Arc<str>,
    table: Arc<str>,
}

impl Statements {
    fn new(table: &TableName) -> Self {
        let t = table.quoted();
        Statements {
            insert: format!(
                "INSERT INTO {t} (id, kind, name, payload, trace, status, attempts, max_attempts, \
                 available_at, created_at, updated_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, 'pending', 0, ?6, ?7, ?8, ?8)"
            )
            .into(),
            // Each arm is answered from its own partial index, in claim
            // order; the union is cut to the limit again.
            claim: format!(
                "UPDATE {t} SET \
                   status = CASE WHEN attempts >= max_attempts THEN 'dead_lettered' ELSE 'claimed' END, \
                   attempts = CASE WHEN attempts >= max_attempts THEN attempts ELSE attempts + 1 END, \
                   claim_token = CASE WHEN attempts >= max_attempts THEN NULL ELSE lower(hex(randomblob(16))) END, \
                   claimed_at = CASE WHEN attempts >= max_attempts THEN NULL ELSE ?1 END, \
                   locked_until = CASE WHEN attempts >= max_attempts THEN NULL ELSE ?2 END, \
                   updated_at = ?1 \
                 WHERE seq IN ( \
                   SELECT seq FROM ( \
                     SELECT * FROM ( \
                       SELECT seq, available_at, created_at FROM {t} \
                       WHERE status = 'pending' AND available_at <= ?1 \
                       ORDER BY available_at, created_at, seq LIMIT ?3) \
                     UNION ALL \
                     SELECT * FROM ( \
                       SELECT seq, available_at, created_at FROM {t} \
                       WHERE status = 'claimed' AND locked_until <= ?1 \
                       ORDER BY available_at, created_at, seq LIMIT ?3)) \
                   ORDER BY available_at, created_at, seq LIMIT ?3) \
                 RETURNING {COLUMNS}"
            )
            .into(),
            abandoned: format!("UPDATE {t} SET last_error = ?1 WHERE seq = ?2").into(),
            quarantine: format!(
                "UPDATE {t} SET status = 'dead_lettered', claim_token = NULL, claimed_at = NULL, \
                 locked_until = NULL, last_error = ?1, updated_at = ?2 WHERE seq = ?3"
            )
            .into(),
            settle: FencedWrites::new(&t),
            fences: format!(
                "SELECT id, status, claim_token, locked_until FROM {t} \
                 WHERE id IN (SELECT value FROM json_each(?1))"
            )
            .into(),
            get: format!("SELECT {COLUMNS} FROM {t} WHERE id = ?1").into(),
            stats: format!(
                "SELECT \
                   (SELECT count(*) FROM {t} WHERE status = 'pending'), \
                   (SELECT count(*) FROM {t} WHERE status = 'claimed'), \
                   (SELECT count(*) FROM {t} WHERE status = 'delivered'), \
                   (SELECT count(*) FROM {t} WHERE status = 'dead_lettered'), \
                   (SELECT count(*) FROM {t} WHERE status = 'claimed' AND locked_until > ?1), \
                   (SELECT min(available_at) FROM {t} WHERE status = 'pending' AND available_at <= ?1)"
            )
            .into(),
            requeue_one: format!(
                "UPDATE {t} SET status = 'pending', attempts = 0, available_at = ?2, updated_at = ?2 \
                 WHERE id = ?1 AND status = 'dead_lettered'"
            )
            .into(),
            requeue_all: format!(
                "UPDATE {t} SET status = 'pending', attempts = 0, available_at = ?1, updated_at = ?1 \
                 WHERE status = 'dead_lettered' AND (?2 IS NULL OR name = ?2)"
            )
            .into(),
            requeue_state: format!("SELECT status, locked_until FROM {t} WHERE id = ?1").into(),
            purge: format!(
                "DELETE FROM {t} WHERE status IN ('delivered', 'dead_lettered') \
                 AND (?1 IS NULL OR status = ?1) AND updated_at < ?2"
            )
            .into(),
            table: t.into(),
        }
    }
}

/// What the store and its settlement batch share.
struct Core {
    pool: SqlitePool,
    table: TableName,
    sql: Statements,
    /// Taken by every write the store makes on its own connections.
    write: tokio::sync::Mutex<()>,
}

impl Core {
    fn new(pool: SqlitePool, table: TableName) -> Self {
        Core {
            sql: Statements::new(&table),
            pool,
            table,
            write: tokio::sync::Mutex::new(()),
        }
    }

    async fn insert(&self, conn: &mut SqliteConnection, message: NewMessage) -> Result<String> {
        let id = message.resolve_id();
        let now = message.now;
        sqlx::query(AssertSqlSafe(self.sql.insert.clone()))
            .bind(&id)
            .bind(message.kind.as_str())
            .bind(&message.name)
            .bind(message.payload.as_str())
            .bind(sql::trace_json(message.trace.as_ref()))
            .bind(i64::from(message.max_attempts))
            .bind(micros(message.available_at.unwrap_or(now)))
            .bind(micros(now))
            .execute(conn)
            .await
            .map_err(|e| match e.as_database_error() {
                Some(d) if d.is_unique_violation() => Error::DuplicateId { id: id.clone() },
                _ => Error::store("enqueue", e),
            })?;
        Ok(id)
    }

    async fn claim(&self, params: ClaimBatch) -> Result<ClaimedBatch> {
        check::claim_batch(&params)?;
        let ClaimBatch { limit, now, lease } = params;
        let locked_until = lease_end(now, lease)?;
        let _write = self.write.lock().await;
        let mut conn = self.pool.acquire().await.map_err(db("claim_batch"))?;
        let mut tx = conn
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(db("claim_batch"))?;
        let rows = sqlx::query(AssertSqlSafe(self.sql.claim.clone()))
            .bind(micros(now))
            .bind(micros(locked_until))
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&mut *tx)
            .await
            .map_err(db("claim_batch"))?;
        let mut selected = Vec::with_capacity(rows.len());
        for row in &rows {
            match decode(row).and_then(|read| Ok((read.seq, read.into_message()?))) {
                Ok(read) => selected.push(read),
                Err(unreadable) => {
                    let seq: i64 = row.try_get("seq").map_err(db("claim_batch"))?;
                    self.quarantine(&mut tx, seq, &unreadable, now).await?;
                }
            }
        }
        selected.sort_by_key(|(seq, m)| (m.available_at, m.created_at, *seq));
        let mut batch = ClaimedBatch::default();
        for (seq, mut message) in selected {
            if message.status == MessageStatus::DeadLettered {
                let record = ErrorRecord::from_error(&AbandonedClaimError {
                    id: message.id.clone(),
                    attempts: message.attempts,
                    max_attempts: message.max_attempts,
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
                batch.claimed.push(sql::claimed_view(message)?);
            }
        }
        tx.commit().await.map_err(db("claim_batch"))?;
        Ok(batch)
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
        tracing::error!(table = %self.table, seq, error = %unreadable,
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
                let statement = self.sql.settle.get(rows[first].op).clone();
                let json =
                    serde_json::Value::Array(group.iter().map(|&i| fenced_row(&rows[i])).collect())
                        .to_string();
                let changed: sqlx::Result<Vec<String>> =
                    sqlx::query_scalar(AssertSqlSafe(statement))
                        .bind(&json)
                        .fetch_all(&self.pool)
                        .await;
                match changed {
                    Ok(changed) => {
                        let changed: std::collections::HashSet<String> =
                            changed.into_iter().collect();
                        for &i in &group {
                            if changed.contains(&rows[i].id) {
                                results[i] = Some(Ok(()));
                            } else {
                                lost.push(i);
                            }
                        }
                    }
                    Err(e) => {
                        let error = Error::store(rows[first].op.operation(), e);
                        for &i in &group {
                            results[i] = Some(Err(error.clone()));
                        }
                    }
                }
            }
        }
        if !lost.is_empty() {
            let ids: Vec<&str> = lost.iter().map(|&i| rows[i].id.as_str()).collect();
            let fences = self.fences(&ids).await;
            for i in lost {
                let row = &rows[i];
                let fence = fences.get(&row.id).cloned();
                results[i] = Some(Err(sql::claim_loss(
                    &row.id,
                    fence,
                    &row.claim_token,
                    row.now,
                )
                .into()));
            }
        }
        Ok(results
            .into_iter()
            .map(|result| result.expect("every row belongs to one kind of write"))
            .collect())
    }
}

/// The JSON row a fenced write reads: `[id, token, now]`, then what the
/// write sets (the new lease end, or the retry time and the error record).
fn fenced_row(row: &FencedWrite) -> serde_json::Value {
    let mut fields = vec![
        serde_json::Value::from(row.id.as_str()),
        serde_json::Value::from(row.claim_token.as_str()),
        serde_json::Value::from(micros(row.now)),
    ];
    match row.op {
        FencedOp::Renew { locked_until } => fields.push(micros(locked_until).into()),
        FencedOp::Retry { available_at } => {
            fields.push(micros(available_at).into());
            fields.push(row.error.as_deref().into());
        }
        FencedOp::DeadLetter => fields.push(row.error.as_deref().into()),
        FencedOp::Deliver | FencedOp::Release => {}
    }
    serde_json::Value::Array(fields)
}

/// The fenced write statements, one per kind of write.
///
/// Each sets only the columns its write changes: SQLite maintains only the
/// indexes over the columns an `UPDATE` assigns, so one statement that
/// assigned every column (to serve every kind of write) cost about twice
/// as much per row. Every row is looked up by id and applied only while
/// its token still holds a live claim. The unary `+` keeps the planner off
/// the index of claimed rows, which statistics taken while few rows were
/// claimed make look free, and which would then be scanned once per row of
/// the batch.
#[derive(Debug)]
struct FencedWrites {
    renew: Arc<str>,
    deliver: Arc<str>,
    retry: Arc<str>,
    dead: Arc<str>,
    release: Arc<str>,
}

impl FencedWrites {
    /// Every kind, by [`FencedOp::code`], in the order a batch applies them.
    const KINDS: [&'static str; 5] = ["renew", "deliver", "retry", "dead", "release"];

    fn new(t: &str) -> Self {
        let write = |fields: &[&str], set: &str| -> Arc<str> {
            let columns = fields
                .iter()
                .enumerate()
                .map(|(i, field)| format!("value ->> {i} AS {field}"))
                .collect::<Vec<_>>()
                .join(", ");
            format!(
                "UPDATE {t} AS m SET {set} \
                 FROM (SELECT {columns} FROM json_each(?1)) AS v \
                 WHERE m.id = v.id AND +m.status = 'claimed' AND m.claim_token = v.token \
                   AND +m.locked_until > v.now \
                 RETURNING id"
            )
            .into()
        };
        const FENCE: [&str; 3] = ["id", "token", "now"];
        const CLEAR: &str = "claim_token = NULL, claimed_at = NULL, locked_until = NULL";
        FencedWrites {
            renew: write(
                &[&FENCE[..], &["until"]].concat(),
                "locked_until = v.until, updated_at = v.now",
            ),
            deliver: write(
                &FENCE,
                &format!("status = 'delivered', {CLEAR}, delivered_at = v.now, updated_at = v.now"),
            ),
            retry: write(
                &[&FENCE[..], &["available", "error"]].concat(),
                &format!(
                    "status = 'pending', available_at = v.available, {CLEAR}, \
                     last_error = v.error, updated_at = v.now"
                ),
            ),
            dead: write(
                &[&FENCE[..], &["error"]].concat(),
                &format!(
                    "status = 'dead_lettered', {CLEAR}, last_error = v.error, updated_at = v.now"
                ),
            ),
            release: write(
                &FENCE,
                &format!(
                    "status = 'pending', attempts = max(m.attempts - 1, 0), available_at = v.now, \
                     {CLEAR}, updated_at = v.now"
                ),
            ),
        }
    }

    /// The statement for `op`.
    fn get(&self, op: FencedOp) -> &Arc<str> {
        match op {
            FencedOp::Renew { .. } => &self.renew,
            FencedOp::Deliver => &self.deliver,
            FencedOp::Retry { .. } => &self.retry,
            FencedOp::DeadLetter => &self.dead,
            FencedOp::Release => &self.release,
        }
    }
}

type Fence = (String, Option<String>, Option<DateTime<Utc>>);

impl Core {
    /// The fence columns of `ids` as they are now, to name why a fenced write
    /// missed. Only on that failure path; a read error leaves the reason
    /// unknown (the write already proved the claim lost).
    async fn fences(&self, ids: &[&str]) -> std::collections::HashMap<String, Fence> {
        let json = serde_json::to_string(ids).expect("ids serialize");
        let rows = sqlx::query(AssertSqlSafe(self.sql.fences.clone()))
            .bind(json)
            .fetch_all(&self.pool)
            .await
            .unwrap_or_default();
        rows.iter()
            .filter_map(|row| {
                let id: String = row.try_get(0).ok()?;
                let status: String = row.try_get(1).ok()?;
                let token: Option<String> = row.try_get(2).ok()?;
                let until: Option<i64> = row.try_get(3).ok()?;
                let until = match until {
                    Some(us) => Some(from_micros(us).ok()?),
                    None => None,
                };
                Some((id, (status, token, until)))
            })
            .collect()
    }
}

impl OutboxStore for SqliteOutbox {
    async fn enqueue(&self, message: NewMessage) -> Result<String> {
        message.validate()?;
        let id = {
            let _write = self.core.write.lock().await;
            let mut conn = self.core.pool.acquire().await.map_err(db("enqueue"))?;
            self.core.insert(&mut conn, message).await?
        };
        // Autocommit: the row is committed now.
        self.wake.wake();
        Ok(id)
    }

    async fn claim_batch(&self, params: ClaimBatch) -> Result<ClaimedBatch> {
        self.core.claim(params).await
    }

    async fn renew_claim(&self, params: RenewClaim) -> Result<DateTime<Utc>> {
        let (row, locked_until) = FencedWrite::renew(params)?;
        self.settle(row).await?;
        Ok(locked_until)
    }

    async fn mark_delivered(&self, params: MarkDelivered) -> Result<()> {
        self.settle(params.into()).await
    }

    async fn mark_failed(&self, params: MarkFailed) -> Result<()> {
        self.settle(params.into()).await
    }

    async fn release_claim(&self, params: ReleaseClaim) -> Result<()> {
        self.settle(params.into()).await
    }

    fn wakeups(&self) -> Option<Wakeups> {
        Some(self.wake.subscribe())
    }

    /// Counts from the partial index of pending rows, never touching
    /// settled ones.
    async fn pending_count(&self) -> Result<Option<u64>> {
        let sql = format!(
            "SELECT count(*) FROM {} WHERE status = 'pending'",
            self.core.sql.table
        );
        let count: i64 = sqlx::query_scalar(AssertSqlSafe(sql))
            .fetch_one(&self.core.pool)
            .await
            .map_err(db("pending_count"))?;
        Ok(Some(u64::try_from(count).unwrap_or(0)))
    }
}

impl OutboxAdmin for SqliteOutbox {
    async fn stats(&self, now: DateTime<Utc>) -> Result<OutboxStats> {
        let row = sqlx::query(AssertSqlSafe(self.core.sql.stats.clone()))
            .bind(micros(now))
            .fetch_one(&self.core.pool)
            .await
            .map_err(db("stats"))?;
        let count = |i: usize| -> Result<u64> {
            let n: i64 = row.try_get(i).map_err(db("stats"))?;
            Ok(u64::try_from(n).unwrap_or(0))
        };
        let claimed = count(1)?;
        let live_claims = count(4)?;
        let oldest: Option<i64> = row.try_get(5).map_err(db("stats"))?;
        Ok(OutboxStats {
            pending: count(0)?,
            claimed,
            delivered: count(2)?,
            dead_lettered: count(3)?,
            live_claims,
            expired_claims: claimed.saturating_sub(live_claims),
            oldest_due_at: oldest.map(from_micros).transpose()?,
        })
    }

    async fn list_messages(&self, params: ListMessages) -> Result<MessagePage> {
        check::list(&params)?;
        let mut query = format!("SELECT {COLUMNS} FROM {} WHERE 1 = 1", self.core.sql.table);
        if params.status.is_some() {
            query.push_str(" AND status = ?1");
        }
        if params.name.is_some() {
            query.push_str(" AND name = ?2");
        }
        if params.after.is_some() {
            query.push_str(" AND (created_at, id) > (?3, ?4)");
        }
        query.push_str(" ORDER BY created_at, id LIMIT ?5");
        let rows = sqlx::query(AssertSqlSafe(query))
            .bind(params.status.map(MessageStatus::as_str))
            .bind(params.name.as_deref())
            .bind(params.after.as_ref().map(|c| micros(c.created_at)))
            .bind(params.after.as_ref().map(|c| c.id.as_str()))
            .bind(i64::try_from(params.limit).unwrap_or(i64::MAX) + 1)
            .fetch_all(&self.core.pool)
            .await
            .map_err(db("list_messages"))?;
        let messages = rows
            .iter()
            .map(|row| decode(row)?.into_message())
            .collect::<Result<Vec<_>>>()?;
        Ok(MessagePage::of(messages, params.limit))
    }

    async fn get_message(&self, id: &str) -> Result<OutboxMessage> {
        let row = sqlx::query(AssertSqlSafe(self.core.sql.get.clone()))
            .bind(id)
            .fetch_optional(&self.core.pool)
            .await
            .map_err(db("get_message"))?
            .ok_or_else(|| Error::NotFound { id: id.to_owned() })?;
        decode(&row)?.into_message()
    }

    async fn requeue_dead_letters(&self, params: RequeueDeadLetters) -> Result<u64> {
        check::requeue(&params)?;
        let now = micros(params.now);
        let requeued = {
            let _write = self.core.write.lock().await;
            match &params.id {
                Some(id) => {
                    let done = sqlx::query(AssertSqlSafe(self.core.sql.requeue_one.clone()))
                        .bind(id)
                        .bind(now)
                        .execute(&self.core.pool)
                        .await
                        .map_err(db("requeue_dead_letters"))?
                        .rows_affected();
                    if done == 0 {
                        return Err(self.requeue_refusal(id, params.now).await);
                    }
                    done
                }
                None => sqlx::query(AssertSqlSafe(self.core.sql.requeue_all.clone()))
                    .bind(now)
                    .bind(params.name.as_deref())
                    .execute(&self.core.pool)
                    .await
                    .map_err(db("requeue_dead_letters"))?
                    .rows_affected(),
            }
        };
        if requeued > 0 {
            self.wake.wake();
        }
        Ok(requeued)
    }

    async fn purge(&self, params: PurgeMessages) -> Result<u64> {
        check::purge(&params)?;
        let _write = self.core.write.lock().await;
        Ok(sqlx::query(AssertSqlSafe(self.core.sql.purge.clone()))
            .bind(params.status.map(MessageStatus::as_str))
            .bind(micros(params.older_than))
            .execute(&self.core.pool)
            .await
            .map_err(db("purge"))?
            .rows_affected())
    }
}

impl SqliteOutbox {
    /// Why a message could not be requeued.
    async fn requeue_refusal(&self, id: &str, now: DateTime<Utc>) -> Error {
        let row = sqlx::query(AssertSqlSafe(self.core.sql.requeue_state.clone()))
            .bind(id)
            .fetch_optional(&self.core.pool)
            .await;
        let row = match row {
            Ok(Some(row)) => row,
            Ok(None) => return Error::NotFound { id: id.to_owned() },
            Err(e) => return Error::store("requeue_dead_letters", e),
        };
        let status: Result<MessageStatus> = row
            .try_get::<String, _>(0)
            .map_err(db("requeue_dead_letters"))
            .and_then(|s| s.parse());
        let status = match status {
            Ok(status) => status,
            Err(e) => return e,
        };
        let until: Option<DateTime<Utc>> = row
            .try_get::<Option<i64>, _>(1)
            .ok()
            .flatten()
            .and_then(|us| from_micros(us).ok());
        sql::requeue_refusal(id, status, until, now)
    }
}

fn micros(at: DateTime<Utc>) -> i64 {
    at.timestamp_micros()
}

fn from_micros(us: i64) -> Result<DateTime<Utc>> {
    DateTime::from_timestamp_micros(us).ok_or_else(|| Error::CorruptRow {
        id: String::new(),
        reason: format!("{us} µs since the epoch is out of range"),
    })
}

fn decode(row: &SqliteRow) -> Result<MessageRow> {
    let id: String = row.try_get("id").map_err(|e| Error::CorruptRow {
        id: String::from("<unreadable>"),
        reason: e.to_string(),
    })?;
    let corrupt = |e: sqlx::Error| Error::CorruptRow {
        id: id.clone(),
        reason: e.to_string(),
    };
    let time = |column: &str| -> Result<DateTime<Utc>> {
        let us: i64 = row.try_get(column).map_err(corrupt)?;
        from_micros(us).map_err(|e| Error::CorruptRow {
            id: id.clone(),
            reason: format!("{column}: {e}"),
        })
    };
    let optional_time = |column: &str| -> Result<Option<DateTime<Utc>>> {
        let us: Option<i64> = row.try_get(column).map_err(corrupt)?;
        us.map(|us| {
            from_micros(us).map_err(|e| Error::CorruptRow {
                id: id.clone(),
                reason: format!("{column}: {e}"),
            })
        })
        .transpose()
    };
    Ok(MessageRow {
        seq: row.try_get("seq").map_err(corrupt)?,
        kind: row.try_get("kind").map_err(corrupt)?,
        name: row.try_get("name").map_err(corrupt)?,
        payload: row.try_get("payload").map_err(corrupt)?,
        trace: row.try_get("trace").map_err(corrupt)?,
        status: row.try_get("status").map_err(corrupt)?,
        attempts: row.try_get("attempts").map_err(corrupt)?,
        max_attempts: row.try_get("max_attempts").map_err(corrupt)?,
        available_at: time("available_at")?,
        claim_token: row.try_get("claim_token").map_err(corrupt)?,
        claimed_at: optional_time("claimed_at")?,
        locked_until: optional_time("locked_until")?,
        last_error: row.try_get("last_error").map_err(corrupt)?,
        created_at: time("created_at")?,
        updated_at: time("updated_at")?,
        delivered_at: optional_time("delivered_at")?,
        id: id.clone(),
    })
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use chrono::TimeZone;

    use super::*;
    use crate::message::MessageKind;

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
                limit: count,
                now: t0(),
                lease: Duration::from_secs(30),
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
        let writes = &store.core.sql.settle;
        for statement in [
            &writes.renew,
            &writes.deliver,
            &writes.retry,
            &writes.dead,
            &writes.release,
        ] {
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
                },
                &claims[2],
            ),
        ];
        let results = store.core.apply(&rows).await.unwrap();
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
