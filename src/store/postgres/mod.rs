//! The PostgreSQL store: one outbox shared by many processes on many machines.
//!
//! This file is the store, its claim and its fenced writes; `statements.rs`
//! holds its SQL text, `listener.rs` the `LISTEN`/`NOTIFY` wake-ups,
//! `admin.rs` its listing. What it shares with the SQLite store (fenced-write
//! forwarding, requeue, purge, stats, reading rows) is in
//! [`crate::store::sql`].
//!
//! One table (name configurable, see [`TableName`]); times are `timestamptz`,
//! the payload `jsonb` (so it may come back with its keys reordered).
//!
//! - **Claims** are one statement: each arm of eligibility (pending and due;
//!   claimed with an expired lease) is read from its own partial index with
//!   `FOR UPDATE SKIP LOCKED`, so concurrent claimers never wait for each
//!   other and never take the same row, and the picked rows are updated in
//!   the same statement. Rows out of attempts are left alone by that
//!   statement and dead-lettered by a second one, guarded so that it only
//!   applies while they are still eligible and still out of attempts (which
//!   keeps the error record exactly the one every store writes).
//! - **Fenced writes** (renewals and settlements) are one `UPDATE ... FROM
//!   unnest(...)` over any number of rows, each matched on `id`,
//!   `claim_token` and `locked_until > now` in that statement; see
//!   [`SettlementMode`]. A row that matches nothing is a claim error; only
//!   then is the row read again, to name the reason.
//! - **Wake-ups**: an enqueue through this store sends `NOTIFY` on the
//!   table's [channel](PostgresOutbox::channel), in the inserting statement,
//!   when a drain waits for one; PostgreSQL delivers it when (and only if)
//!   the transaction commits. `NOTIFY` serializes the commits of the
//!   transactions that send it, so a drain about to wait says so first
//!   ([`Wakeups::arm`](crate::Wakeups::arm), an unlogged flag), and only the
//!   first enqueue after that notifies (under `REPEATABLE READ` and
//!   `SERIALIZABLE`, every enqueue does; see
//!   `migrations/postgres/0004_idle_drains.sql`). A drain cannot arm while
//!   an enqueue is between its insert and its commit; it then claims again
//!   shortly instead. [`OutboxStore::wakeups`](crate::OutboxStore::wakeups)
//!   listens on a connection of its own, reconnects after errors, wakes
//!   once after every (re)connect because notifications sent meanwhile are
//!   lost, and stops when the last [`Wakeups`](crate::Wakeups) is dropped.
//!
//! # Which clock
//!
//! The server's, for every lease; see "Which clock" on [`PostgresOutbox`].
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
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, Column, Row};

use super::connect;
use super::fenced::{FencedBackend, FencedOp, FencedWrite};
use super::kit::{check, lease_end};
use super::sql::{
    self, ColumnPositions, Dialect, SettlementMode, SqlBackend, SqlOutbox, SqlParts, TableName, db,
};
use super::{Armed, ClaimBatch, ClaimedBatch};
use crate::error::ErrorRecord;
use crate::error::{AbandonedClaimError, Backend, Error, Result};
use crate::message::{Enqueued, NewMessage, OnDeadLetter, OutboxMessage};
use listener::ListenerShared;
use statements::{ClaimValues, Statements, channel_of};

/// What a claim did with `row` (see `Statements::claim_first`): read by position,
/// since a claim's statements all select it first, and without a copy,
/// since it is read for every row a claim returns.
fn outcome(row: &PgRow) -> Result<&str> {
    match row.columns().first() {
        Some(column) if column.name() == "outcome" => row.try_get(0),
        _ => row.try_get("outcome"),
    }
    .map_err(db("claim_batch"))
}

/// A statement with its binds, as `sqlx::query` makes it.
type PgQuery<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

mod admin;
mod listener;
mod statements;

/// The shared half over this store's core.
type Shared = SqlOutbox<Core>;

/// The migrations for the default `outbox` table, tracked by sqlx in
/// `_sqlx_migrations`. Use it to fold the outbox into a migration run of your
/// own; otherwise [`PostgresOutbox::setup`] does the same for any table name,
/// tracked per table. Use one or the other for a given database.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/postgres");

/// An outbox in a PostgreSQL database. Cheap to clone; clones share the
/// pool, the settlement batch and the wake-up listener.
///
/// ```no_run
/// use outbox::prelude::*;
/// use outbox::PostgresOutbox;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> outbox::Result<()> {
/// let outbox = PostgresOutbox::connect("postgres://localhost/app").await?;
///
/// let mut tx = outbox.pool().begin().await.unwrap();
/// sqlx::query("INSERT INTO orders (id) VALUES (7)").execute(&mut *tx).await.unwrap();
/// let message = NewMessage::new(outbox::MessageKind::Event, "order.placed", serde_json::json!({"order_id": 7}).into());
/// outbox.enqueue_in(&mut tx, message).await?;
/// tx.commit().await.unwrap(); // the message and the order, or neither
/// # Ok(())
/// # }
/// ```
///
/// # Which clock: the server's
///
/// Workers on many machines share this table, and their clocks disagree. So
/// by default every lease is computed and judged with PostgreSQL's own time
/// (`statement_timestamp()`, the start of the statement, which is its own
/// transaction), not the `now` the caller passes:
///
/// - a claim takes what is due and what has expired *on the server's clock*,
///   and writes `claimed_at` and `locked_until = server time + lease`;
/// - a renewal or settlement applies only while `locked_until` is after the
///   server's time, and a renewal sets `locked_until = server time + lease`;
///   `delivered_at`, `updated_at` and a release's `available_at` are the
///   server's time;
/// - [`stats`](crate::OutboxAdmin::stats) counts live and expired claims and
///   due messages on the server's clock;
/// - an enqueue without `available_at` is due at the server's time of the
///   insert. Times the caller gives are kept as given, on its clock:
///   `created_at`, an explicit `available_at`, a retry's `retry_at` (a
///   caller ahead of the server by `s` sees them take effect `s` later), and
///   the requeue and purge horizons of the admin operations.
///
/// So clock skew between workers can never hand a live lease to a second
/// worker: only the server's clock says when a lease ends. A caller still
/// needs a deadline on *its* clock, so a claim and a renewal return
/// `claimed_at = now` and `locked_until = now + lease` with the caller's
/// `now`, while the row holds the server's times. That deadline is safe
/// under any skew: the caller read `now` before the statement ran, so the
/// server's lease ends no earlier (in real time) than the caller's deadline;
/// the runtime stops a delivery by then. A slow round trip only makes the
/// caller's deadline earlier than it needs to be.
///
/// `caller_clock(true)` on the [builder](PostgresOutbox::builder) switches a
/// store to the caller's `now`, as the memory and SQLite stores use, for
/// tests on a virtual clock.
#[derive(Clone)]
pub struct PostgresOutbox {
    inner: SqlOutbox<Core>,
    listener: Arc<ListenerShared>,
}

impl std::fmt::Debug for PostgresOutbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresOutbox")
            .field("table", &self.inner.core.parts.table.to_string())
            .field("channel", &self.inner.core.channel)
            .field("settlement", &self.inner.mode())
            .finish_non_exhaustive()
    }
}

/// Settings for a [`PostgresOutbox`]; start with [`PostgresOutbox::builder`].
#[derive(Debug, Clone)]
pub struct PostgresOutboxBuilder {
    pool: PgPool,
    table: TableName,
    settlement: SettlementMode,
    /// Most batched settlement statements in flight; `None`: half the pool.
    settlement_statements: Option<usize>,
    notify: bool,
    caller_clock: bool,
}

impl PostgresOutboxBuilder {
    /// Use this table (`table` or `schema.table`); `outbox` by default.
    pub fn table(mut self, name: &str) -> Result<Self> {
        self.table = TableName::parse(name)?;
        Ok(self)
    }

    /// Whether enqueue wakes waiting drains (default `true`). It notifies
    /// only when a drain armed (see [`Wakeups::arm`](crate::Wakeups::arm)),
    /// but still reads the drains' flag under a shared advisory lock; turn
    /// it off when no process listens.
    pub fn notify(mut self, notify: bool) -> Self {
        self.notify = notify;
        self
    }

    /// Judge leases by the caller's `now` instead of the database's clock
    /// (default `false`).
    ///
    /// By default claims, renewals, settlements and the live-claim counts
    /// of [`stats`](crate::OutboxAdmin::stats) read the time from the
    /// server, so clock skew between worker machines cannot hand a live
    /// lease to a second worker; see [`PostgresOutbox`]. Turned on, the
    /// store uses the `now` each call passes, as the memory and SQLite
    /// stores do. That is for tests that drive the store on a virtual clock
    /// (this crate's conformance suite does); with workers on more than one
    /// machine it brings back the skew hazard.
    pub fn caller_clock(mut self, caller_clock: bool) -> Self {
        self.caller_clock = caller_clock;
        self
    }

    /// How many batched renewal and settlement statements may be in flight
    /// at once (default: half the pool's `max_connections`, at least 1).
    ///
    /// Each statement is a commit, and on a durable server a commit waits for
    /// its WAL flush; commits in flight together share one flush, so with
    /// several statements in flight a drain settles more messages per flush
    /// instead of queueing every batch behind the one before. Writes to one
    /// message still apply in call order: a message is never in two
    /// statements at once. The rest of the pool is left for claims,
    /// enqueues and admin calls. Refused with [`Error::InvalidInput`] when
    /// zero or larger than the pool.
    pub fn settlement_statements(mut self, statements: usize) -> Result<Self> {
        let pool_size = self.pool.options().get_max_connections() as usize;
        if statements == 0 || statements > pool_size {
            return Err(Error::invalid(
                "settlement_statements",
                format!(
                    "must be between 1 and the pool's max_connections ({pool_size}); \
                     {statements} given"
                ),
            ));
        }
        self.settlement_statements = Some(statements);
        Ok(self)
    }

    /// The store. Call [`PostgresOutbox::setup`] once before using a new table.
    pub fn build(self) -> PostgresOutbox {
        let statements = self
            .settlement_statements
            .unwrap_or_else(|| (self.pool.options().get_max_connections() as usize / 2).max(1));
        PostgresOutbox {
            inner: SqlOutbox::new(
                Core::new(
                    self.pool,
                    self.table,
                    self.notify,
                    !self.caller_clock,
                    statements,
                ),
                self.settlement,
                statements,
            ),
            listener: Arc::new(ListenerShared::new()),
        }
    }
}

impl PostgresOutbox {
    /// A store on `pool` with the default settings.
    pub fn new(pool: PgPool) -> Self {
        Self::builder(pool).build()
    }

    /// Settings for a store on `pool`.
    pub fn builder(pool: PgPool) -> PostgresOutboxBuilder {
        PostgresOutboxBuilder {
            pool,
            table: TableName::default(),
            settlement: SettlementMode::default(),
            settlement_statements: None,
            notify: true,
            caller_clock: false,
        }
    }

    /// Connect to `url` and set up the default table, waiting at most
    /// [`DEFAULT_CONNECT_TIMEOUT`](Self::DEFAULT_CONNECT_TIMEOUT) for a
    /// connection; see [`PostgresOutbox::connect_timeout`].
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_timeout(url, Self::DEFAULT_CONNECT_TIMEOUT).await
    }

    /// How long [`PostgresOutbox::connect`] waits for a connection, and its
    /// pool for a free one.
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

    /// Connect to `url` and set up the default table. The first connection
    /// is made directly, so a server that refuses it is reported at once
    /// with the operating system's reason ([`Error::Connect`]), and one that
    /// does not answer is given up on after `timeout`; the pool then waits
    /// at most `timeout` for a connection (sqlx's own default is 30 s). A
    /// SQLite URL is refused with [`Error::Url`].
    pub async fn connect_timeout(url: &str, timeout: Duration) -> Result<Self> {
        let pool = Self::connect_pool(url, PgPoolOptions::new().acquire_timeout(timeout)).await?;
        let outbox = Self::new(pool);
        outbox.setup().await?;
        Ok(outbox)
    }

    /// A pool of `pool` settings on `url`, for [`PostgresOutbox::new`] or
    /// [`PostgresOutbox::builder`]. Unlike sqlx's own `connect_with`, which
    /// retries a refused connection until the acquire timeout and then only
    /// says it timed out, this reports a server that refuses or cannot be
    /// reached with the operating system's reason ([`Error::Connect`]), and
    /// gives up on one that does not answer after the acquire timeout.
    pub async fn connect_pool(url: &str, pool: PgPoolOptions) -> Result<PgPool> {
        let options = Self::connect_options(url)?;
        Self::probe(url, &options, pool.get_acquire_timeout()).await?;
        pool.connect_with(options)
            .await
            .map_err(|e| connect::connect_failed(url, &e, Backend::Postgres))
    }

    /// The options `url` gives; a SQLite URL is refused with [`Error::Url`]
    /// saying to use [`SqliteOutbox`](crate::SqliteOutbox).
    pub fn connect_options(url: &str) -> Result<PgConnectOptions> {
        connect::check_postgres_url(url)?;
        PgConnectOptions::from_str(url).map_err(|e| connect::malformed(url, Backend::Postgres, e))
    }

    /// Open one connection, and close it: sqlx's pool retries a refused
    /// connection until its timeout and then reports only that it timed out.
    async fn probe(url: &str, options: &PgConnectOptions, timeout: Duration) -> Result<()> {
        use sqlx::{ConnectOptions, Connection};
        match tokio::time::timeout(timeout, options.connect()).await {
            Ok(Ok(conn)) => {
                // Closing politely only spares the server a log line.
                let _ = conn.close().await;
                Ok(())
            }
            Ok(Err(e)) => Err(connect::connect_failed(url, &e, Backend::Postgres)),
            Err(_) => Err(Error::Connect {
                url: super::kit::redact_url(url),
                reason: format!(
                    "no connection within {}",
                    humantime::format_duration(timeout)
                ),
                backend: Backend::Postgres,
            }),
        }
    }

    /// Create or upgrade this store's table (and its schema, if named) and
    /// indexes. Safe to run any number of times, from any number of
    /// processes (sqlx serializes migrations with an advisory lock).
    pub async fn setup(&self) -> Result<()> {
        self.migrator()
            .run(&self.inner.core.parts.pool)
            .await
            .map_err(|e| Error::store("setup", e))
    }

    /// The migrations for this store's table, tracked in
    /// `"<table>_migrations"`; [`PostgresOutbox::setup`] runs them.
    pub fn migrator(&self) -> sqlx::migrate::Migrator {
        let mut migrator =
            sql::migrator_for(&MIGRATOR, &self.inner.core.parts.table, Dialect::Postgres);
        if let Some(schema) = self.inner.core.parts.table.schema() {
            migrator.create_schema(format!("\"{schema}\""));
        }
        migrator
    }

    /// The `LISTEN`/`NOTIFY` channel of this table: `outbox:<schema.table>`,
    /// or `outbox:<hash>` when that would exceed PostgreSQL's 63 bytes.
    pub fn channel(&self) -> &str {
        &self.inner.core.channel
    }

    /// The claim after a short first pass, of up to `limit` messages under
    /// the `block` policy, with a lease of `lease_micros` and an attempt cap
    /// of `cap`; `$1` is now when `caller_now`, and the keys whose locks the
    /// transaction holds are its last parameter. See
    /// `Statements::claim_locked`.
    #[cfg(feature = "inspect-statements")]
    #[doc(hidden)]
    pub fn locked_claim_statement(
        &self,
        limit: usize,
        lease_micros: i64,
        cap: u32,
        caller_now: bool,
    ) -> String {
        let values = ClaimValues {
            lease_micros,
            cap,
            caller_now,
        };
        self.inner.core.sql.claim_locked(limit, true, values)
    }

    /// The lookup of up to `limit` keys' heads beyond a claim's walk, on
    /// the caller's clock (`$1`) or the database's; see
    /// `Statements::key_heads`.
    #[cfg(feature = "inspect-statements")]
    #[doc(hidden)]
    pub fn key_heads_statement(&self, limit: usize, caller_now: bool) -> String {
        // The lookup writes neither the lease nor the cap.
        let values = ClaimValues {
            lease_micros: 0,
            cap: 0,
            caller_now,
        };
        self.inner.core.sql.key_heads(limit, true, values)
    }

    /// Enqueue on the caller's connection, inside the caller's transaction
    /// when there is one (`&mut *tx`): rolled back, the message is gone;
    /// committed, the next claim sees it and listeners are notified.
    ///
    /// A taken id answers [`Enqueued::AlreadyExists`] and leaves the
    /// transaction usable (`ON CONFLICT DO NOTHING`: no error is raised in
    /// it), so the rows written before and after it still commit. Input
    /// PostgreSQL would refuse (a NUL character in the id or name, `\u0000`
    /// or a lone surrogate escape in the payload, a time before 4713 BC) is
    /// refused here with [`Error::InvalidInput`] before anything is sent,
    /// so it does not abort the transaction either.
    pub async fn enqueue_in(
        &self,
        conn: &mut PgConnection,
        message: NewMessage,
    ) -> Result<Enqueued> {
        message.validate()?;
        storable(&message)?;
        self.inner.core.insert(conn, message).await
    }

    /// Enqueue through the store's pool, in a transaction of its own.
    async fn enqueue_now(&self, message: NewMessage) -> Result<Enqueued> {
        message.validate()?;
        storable(&message)?;
        let mut conn = self
            .inner
            .core
            .parts
            .pool
            .acquire()
            .await
            .map_err(db("enqueue"))?;
        self.inner.core.insert(&mut conn, message).await
    }
}

sql::sql_store!(PostgresOutbox, PostgresOutboxBuilder, PgPool, PgConnection);

/// How many claims after a short first pass look keys' heads up without
/// one. A first pass is cheap when the keyed backlog thins out again; one
/// that comes back short costs a commit for nothing.
const FIRST_PASSES_SKIPPED: u32 = 15;

/// Rows claimed before the first new [plan generation](Core::planned);
/// each later one waits for sixteen times as many.
const FIRST_REPLAN_AT: u64 = 1024;

/// What the store and its settlement batch share.
struct Core {
    parts: SqlParts<sqlx::Postgres>,
    channel: String,
    notify: bool,
    /// Leases are judged by the database's clock, not the caller's `now`.
    server_clock: bool,
    sql: Statements,
    /// Claims still to go straight to the key lookup; see
    /// [`FIRST_PASSES_SKIPPED`].
    skip_first_passes: AtomicU32,
    /// Rows this store has claimed; see [`Core::planned`].
    claimed_rows: AtomicU64,
    /// How many settlement statements may be in flight at once; see
    /// [`Core::warm_up`].
    settlement_statements: usize,
}

impl Core {
    fn new(
        pool: PgPool,
        table: TableName,
        notify: bool,
        server_clock: bool,
        settlement_statements: usize,
    ) -> Self {
        let (sql, shared) = Statements::new(&table, notify);
        Core {
            sql,
            channel: channel_of(&table),
            notify,
            server_clock,
            skip_first_passes: AtomicU32::new(0),
            claimed_rows: AtomicU64::new(0),
            settlement_statements,
            parts: SqlParts {
                pool,
                table,
                shared,
            },
        }
    }

    /// Insert unless the id is taken. A taken id is not a unique violation
    /// (`ON CONFLICT DO NOTHING`), which would abort the caller's
    /// transaction; the statement returns a row only when it inserted.
    async fn insert(&self, conn: &mut PgConnection, message: NewMessage) -> Result<Enqueued> {
        let id = message.resolve_id();
        let message = NewMessage {
            id: Some(id.clone()),
            ..message
        };
        let sql = self.sql.insert.clone();
        Shared::insert_idempotent(&self.parts, conn, &message, id, |conn| {
            let (_, mut query) = Shared::insert(&sql, &message, self.server_clock);
            if self.notify {
                query = query.bind(self.channel.clone());
            }
            Box::pin(async move {
                Ok(query
                    .fetch_optional(conn)
                    .await
                    .map_err(enqueue_error)?
                    .is_some())
            })
        })
        .await
    }

    /// Ask for a wake-up on the next committed insert; see
    /// `Statements::arm`.
    async fn arm(&self) -> Result<Armed> {
        let armed = sqlx::query(AssertSqlSafe(self.sql.arm.clone()))
            .fetch_optional(&self.parts.pool)
            .await
            .map_err(db("arm_wakeups"))?;
        Ok(if armed.is_some() {
            Armed::Yes
        } else {
            Armed::Busy
        })
    }

    /// The server's time, when the store judges leases by it, to name why
    /// a fenced write missed; `None` on the caller's clock, or when it
    /// cannot be read (the reason is then judged on the caller's clock).
    async fn server_now(&self) -> Option<DateTime<Utc>> {
        if !self.server_clock {
            return None;
        }
        sqlx::query_scalar("SELECT statement_timestamp()")
            .fetch_one(&self.parts.pool)
            .await
            .ok()
    }

    /// `statement`, a claim statement sent as text (after a short first
    /// pass), marked with a plan generation that steps when the rows this
    /// store has claimed reach [`FIRST_REPLAN_AT`], and again at each
    /// sixteenfold of that.
    ///
    /// A connection keeps the plan of a prepared statement until the
    /// table's statistics change, and a plan made while the table was
    /// nearly empty reads the whole table (a scan is then cheaper than an
    /// index). An outbox that fills faster than autovacuum analyzes it (it
    /// looks once a minute) would scan a growing table on every such claim.
    /// A new text is prepared, and planned for the table as it is now, on
    /// each connection. Planning a claim costs more than running a small
    /// one, so generations are few: five by a billion rows. A plan made once
    /// the table holds a thousand rows or so already reads it by index and
    /// address, and keeps doing so as it grows. (The first pass and the
    /// fenced writes, which run far more often, are functions whose plans
    /// price sequential scans out instead: see
    /// `migrations/postgres/0012_claim_function.sql`.)
    fn planned(&self, mut statement: String) -> String {
        let claimed = self.claimed_rows.load(Ordering::Relaxed);
        let generation = (u64::BITS - (claimed / FIRST_REPLAN_AT).leading_zeros()).div_ceil(4);
        if generation > 0 {
            use std::fmt::Write;
            let _ = write!(statement, " -- plan {generation}");
        }
        statement
    }

    /// A claim's first pass: see `Statements::claim_first`.
    fn claim_first(
        &self,
        limit: usize,
        now: Option<DateTime<Utc>>,
        lease_micros: i64,
        cap: u32,
        block: bool,
    ) -> PgQuery<'static> {
        sqlx::query(AssertSqlSafe(self.sql.claim_first.clone()))
            .bind(i32::try_from(limit).unwrap_or(i32::MAX))
            .bind(i32::try_from(sql::keyed_walk(limit)).unwrap_or(i32::MAX))
            .bind(now)
            .bind(lease_micros)
            .bind(i64::from(cap))
            .bind(block)
    }

    /// Open up to `claims` connections plus one per settlement statement,
    /// leaving one of the pool's for the first pass and the application,
    /// and run on each a claim of nothing and a settlement of nothing of
    /// both kinds: a connection compiles the table's functions and plans
    /// their statements at its first call of each (see
    /// [`OutboxStore::warm_up`](crate::OutboxStore::warm_up)). A pool that
    /// has no connection to spare within a moment gets fewer warmed.
    async fn warm_up(&self, claims: usize) -> Result<()> {
        const SPARE_WAIT: Duration = Duration::from_millis(250);
        let pool = &self.parts.pool;
        let room = (pool.options().get_max_connections() as usize).saturating_sub(1);
        let mut connections = Vec::new();
        while connections.len() < (claims + self.settlement_statements).min(room) {
            match tokio::time::timeout(SPARE_WAIT, pool.acquire()).await {
                Ok(connection) => connections.push(connection.map_err(db("warm_up"))?),
                Err(_) => break,
            }
        }
        for connection in &mut connections {
            self.claim_first(0, None, 1, 1, false)
                .execute(&mut **connection)
                .await
                .map_err(db("warm_up"))?;
            for deletions_only in [true, false] {
                self.settle(&[], deletions_only)
                    .fetch_all(&mut **connection)
                    .await
                    .map_err(db("warm_up"))?;
            }
        }
        Ok(())
    }

    /// A batch of fenced writes; `deletions_only` when every row is a
    /// deletion, which then sends no ops and none of the columns they would
    /// write (where delivered messages are deleted, most batches are).
    fn settle<'q>(
        &self,
        rows: &'q [FencedWrite],
        deletions_only: bool,
    ) -> sqlx::query::QueryScalar<'q, sqlx::Postgres, String, sqlx::postgres::PgArguments> {
        let mut ids = Vec::with_capacity(rows.len());
        let mut tokens = Vec::with_capacity(rows.len());
        let mut nows = Vec::with_capacity(rows.len());
        for row in rows {
            ids.push(row.id.as_str());
            tokens.push(row.claim_token.as_str());
            nows.push(self.bound_now(row.now));
        }
        let (mut ops, mut leases, mut availables, mut errors) = (None, None, None, None);
        if !deletions_only {
            ops = Some(rows.iter().map(|row| row.op.code()).collect::<Vec<_>>());
            leases = Some(
                rows.iter()
                    .map(|row| row.op.lease_micros())
                    .collect::<Vec<_>>(),
            );
            availables = Some(
                rows.iter()
                    .map(|row| row.op.available_at())
                    .collect::<Vec<_>>(),
            );
            errors = Some(
                rows.iter()
                    .map(|row| row.error.as_deref())
                    .collect::<Vec<_>>(),
            );
        }
        sqlx::query_scalar(AssertSqlSafe(self.sql.settle.clone()))
            .bind(ops)
            .bind(ids)
            .bind(tokens)
            .bind(nows)
            .bind(leases)
            .bind(availables)
            .bind(errors)
    }

    /// The `now` to bind: the caller's, or NULL for the database's.
    fn bound_now(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        (!self.server_clock).then_some(now)
    }

    /// `query` with the claim's `now` bound as `$1` when the store runs on
    /// the caller's clock (see [`Statements::claim_locked`]).
    fn with_now<'q>(&self, query: PgQuery<'q>, now: DateTime<Utc>) -> PgQuery<'q> {
        if self.server_clock {
            query
        } else {
            query.bind(now)
        }
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
        let lease_micros = i64::try_from(lease.as_micros())
            .map_err(|_| Error::invalid("lease", "is too long to add to now"))?;
        let block = on_dead_letter == OnDeadLetter::Block;
        let values = ClaimValues {
            lease_micros,
            cap,
            caller_now: !self.server_clock,
        };
        let mut claimed = Vec::with_capacity(limit);
        let mut abandoned = Vec::new();
        // After a short first pass, the next few claims go straight to the
        // key lookup: the backlog that made it short is likely still there,
        // and a first pass that comes back short costs a commit for nothing.
        let lookup = self
            .skip_first_passes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok();
        let mut short = lookup;
        if !lookup {
            let rows = self
                .claim_first(limit, self.bound_now(now), lease_micros, cap, block)
                .fetch_all(&self.parts.pool)
                .await
                .map_err(db("claim_batch"))?;
            // The heads the first pass left to the second, with the hashes
            // of their keys; and whether it claimed nothing for a head its
            // walk may have missed.
            let mut heads = Vec::new();
            for row in &rows {
                match outcome(row)? {
                    "keyed" => {
                        let hash: i64 = row.try_get("key_hash").map_err(db("claim_batch"))?;
                        let id: String = row.try_get("id").map_err(db("claim_batch"))?;
                        heads.push((hash, id));
                    }
                    "short" => short = true,
                    _ => {}
                }
            }
            self.read_claimed(&rows, now, locked_until, cap, &mut claimed, &mut abandoned)
                .await?;
            if short {
                self.skip_first_passes
                    .store(FIRST_PASSES_SKIPPED, Ordering::Relaxed);
            } else if !heads.is_empty() {
                // One round trip locks their keys and claims those still
                // heads (`migrations/postgres/0009_claim_heads.sql`).
                let (hashes, ids) = lock_order(heads);
                let rows = sqlx::query(AssertSqlSafe(self.sql.claim_heads.clone()))
                    .bind(&hashes)
                    .bind(&ids)
                    .bind(self.bound_now(now))
                    .bind(lease_micros)
                    .bind(i64::from(cap))
                    .bind(block)
                    .fetch_all(&self.parts.pool)
                    .await
                    .map_err(db("claim_batch"))?;
                self.read_claimed(&rows, now, locked_until, cap, &mut claimed, &mut abandoned)
                    .await?;
            }
        }
        if short {
            // Claim with the heads of the keys looked up one by one, their
            // keys locked. JIT off for this transaction only: the lookup is
            // priced above `jit_above_cost` though it runs in milliseconds.
            // Its commit does not wait for the disk, as every claim's
            // (`statements::NO_FLUSH`).
            let mut tx = self
                .parts
                .pool
                .begin_with("BEGIN; SET LOCAL jit = off; SET LOCAL synchronous_commit = off")
                .await
                .map_err(db("claim_batch"))?;
            let lookup_sql = self.planned(self.sql.key_heads(limit, block, values));
            let mut lookup = sqlx::query_as(AssertSqlSafe(lookup_sql));
            if values.caller_now {
                lookup = lookup.bind(now);
            }
            let keys: Vec<(String, i64)> = lookup
                .fetch_all(&mut *tx)
                .await
                .map_err(db("claim_batch"))?;
            let (hashes, keys) = lock_order(keys.into_iter().map(|(key, hash)| (hash, key)));
            sqlx::query(AssertSqlSafe(self.sql.lock_keys.clone()))
                .bind(&hashes)
                .execute(&mut *tx)
                .await
                .map_err(db("claim_batch"))?;
            let claim = self.planned(self.sql.claim_locked(limit, block, values));
            let rows = self
                .with_now(sqlx::query(AssertSqlSafe(claim)), now)
                .bind(&keys)
                .fetch_all(&mut *tx)
                .await
                .map_err(db("claim_batch"))?;
            tx.commit().await.map_err(db("claim_batch"))?;
            self.read_claimed(&rows, now, locked_until, cap, &mut claimed, &mut abandoned)
                .await?;
        }
        claimed.sort_by_key(|(seq, m)| (m.available_at, m.created_at, *seq));
        self.claimed_rows
            .fetch_add(claimed.len() as u64, Ordering::Relaxed);
        let mut batch = ClaimedBatch {
            claimed: claimed.into_iter().map(|(_, m)| m).collect(),
            dead_lettered: Vec::new(),
        };
        if !abandoned.is_empty() {
            batch.dead_lettered = self.dead_letter_abandoned(abandoned, now, cap).await?;
        }
        Ok(batch)
    }

    /// Sort the rows of one pass into claimed and abandoned, quarantining
    /// unreadable ones; rows left for the second pass are skipped.
    async fn read_claimed(
        &self,
        rows: &[PgRow],
        now: DateTime<Utc>,
        locked_until: DateTime<Utc>,
        cap: u32,
        claimed: &mut Vec<(i64, crate::ClaimedMessage)>,
        abandoned: &mut Vec<(i64, OutboxMessage)>,
    ) -> Result<()> {
        // Every row of a result has the same columns: found once.
        let Some(at) = rows.first().map(ColumnPositions::of) else {
            return Ok(());
        };
        for row in rows {
            let outcome = outcome(row)?;
            if outcome == "keyed" || outcome == "short" {
                continue;
            }
            let decoded = Shared::decode_at(row, &at).and_then(|r| Ok((r.seq, r.into_message()?)));
            match decoded {
                Ok((seq, message)) if outcome == "abandoned" => abandoned.push((seq, message)),
                Ok((seq, message)) => {
                    let mut message = sql::claimed_view(message, cap)?;
                    if self.server_clock {
                        // The lease began on the server no earlier than
                        // the caller read `now`, so it ends no earlier than
                        // `now + lease` on the caller's clock, whatever the
                        // skew between the two: a deadline the caller can
                        // keep with its own clock. The row keeps the
                        // server's times.
                        message.claimed_at = now;
                        message.locked_until = locked_until;
                    }
                    claimed.push((seq, message));
                }
                Err(unreadable) => self.quarantine(row, unreadable, now).await?,
            }
        }
        Ok(())
    }

    /// Dead-letter the rows a claim found out of attempts, if they still are.
    async fn dead_letter_abandoned(
        &self,
        abandoned: Vec<(i64, OutboxMessage)>,
        now: DateTime<Utc>,
        cap: u32,
    ) -> Result<Vec<OutboxMessage>> {
        let mut ids = Vec::with_capacity(abandoned.len());
        let mut attempts = Vec::with_capacity(abandoned.len());
        let mut errors = Vec::with_capacity(abandoned.len());
        for (_, message) in &abandoned {
            ids.push(message.id.clone());
            attempts.push(i64::from(message.attempts));
            errors.push(
                ErrorRecord::from_error(&AbandonedClaimError {
                    id: message.id.clone(),
                    attempts: message.attempts,
                    max_attempts: message.effective_max_attempts(cap),
                })
                .to_json(),
            );
        }
        let rows = sqlx::query(AssertSqlSafe(self.sql.abandoned.clone()))
            .bind(self.bound_now(now))
            .bind(ids)
            .bind(attempts)
            .bind(errors)
            .bind(i64::from(cap))
            .fetch_all(&self.parts.pool)
            .await
            .map_err(db("claim_batch"))?;
        let mut dead = rows
            .iter()
            .map(|row| {
                let row = Shared::decode(row)?;
                Ok((row.seq, row.into_message()?))
            })
            .collect::<Result<Vec<_>>>()?;
        dead.sort_by_key(|(seq, m)| (m.available_at, m.created_at, *seq));
        Ok(dead.into_iter().map(|(_, m)| m).collect())
    }

    /// Dead-letter a row a claim selected but cannot read, so it does not
    /// stop every claim after it; an operator finds the reason in `last_error`.
    async fn quarantine(&self, row: &PgRow, unreadable: Error, now: DateTime<Utc>) -> Result<()> {
        let seq: i64 = row.try_get("seq").map_err(db("claim_batch"))?;
        let token: Option<String> = row.try_get("claim_token").map_err(db("claim_batch"))?;
        tracing::error!(table = %self.parts.table, seq, error = %unreadable,
            "outbox row is unreadable; dead-lettered");
        sqlx::query(AssertSqlSafe(self.sql.quarantine.clone()))
            .bind(ErrorRecord::from_error(&unreadable).to_json())
            .bind(self.bound_now(now))
            .bind(seq)
            .bind(token)
            .execute(&self.parts.pool)
            .await
            .map_err(db("claim_batch"))?;
        Ok(())
    }
}

/// The key hashes of `keys` (hash, a key or a head's id) in the one order
/// every claimer takes their locks, each once (two keys may share a hash;
/// one lock serves both), and the keys or ids.
fn lock_order(keys: impl IntoIterator<Item = (i64, String)>) -> (Vec<i64>, Vec<String>) {
    let mut keys: Vec<(i64, String)> = keys.into_iter().collect();
    keys.sort_unstable();
    keys.dedup();
    let (mut hashes, keys): (Vec<i64>, Vec<String>) = keys.into_iter().unzip();
    hashes.dedup();
    (hashes, keys)
}

/// The earliest time a `timestamptz` holds: 4714-11-24 BC (year -4713).
fn earliest_timestamptz() -> DateTime<Utc> {
    use chrono::TimeZone;
    Utc.with_ymd_and_hms(-4713, 11, 24, 0, 0, 0)
        .single()
        .expect("a valid date")
}

/// Refuse what PostgreSQL would refuse, before it is sent: a refused
/// statement aborts the caller's transaction, and its commit then rolls
/// back everything else the transaction wrote.
fn storable(message: &NewMessage) -> Result<()> {
    let nul = "contains a NUL character (\\0), which PostgreSQL cannot store in text; remove it";
    if message.id.as_deref().is_some_and(|id| id.contains('\0')) {
        return Err(Error::invalid("id", nul));
    }
    if message.name.contains('\0') {
        return Err(Error::invalid("name", nul));
    }
    if let Some(reason) = jsonb_refuses(message.payload.as_str()) {
        return Err(Error::invalid("payload", reason));
    }
    let earliest = earliest_timestamptz();
    if message.now < earliest {
        return Err(Error::invalid(
            "now",
            "is before 4713 BC, which PostgreSQL cannot store; use a real enqueue time",
        ));
    }
    if message.available_at.is_some_and(|at| at < earliest) {
        return Err(Error::invalid(
            "available_at",
            "is before 4713 BC, which PostgreSQL cannot store; leave it unset to make the \
             message available now",
        ));
    }
    Ok(())
}

/// Why `jsonb` would refuse this JSON text, if it would: `\u0000` in a
/// string (jsonb strings cannot hold NUL), or a `\u` escape of half a
/// surrogate pair.
fn jsonb_refuses(json: &str) -> Option<&'static str> {
    let bytes = json.as_bytes();
    let hex = |at: usize| -> Option<u32> {
        let digits = std::str::from_utf8(bytes.get(at..at + 4)?).ok()?;
        u32::from_str_radix(digits, 16).ok()
    };
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            0 => return Some(NUL_IN_JSON),
            b'\\' if bytes.get(i + 1) == Some(&b'u') => {
                let unit = hex(i + 2)?;
                match unit {
                    0 => return Some(NUL_IN_JSON),
                    0xD800..=0xDBFF => {
                        let low = (bytes.get(i + 6..i + 8) == Some(b"\\u"))
                            .then(|| hex(i + 8))
                            .flatten();
                        if !matches!(low, Some(0xDC00..=0xDFFF)) {
                            return Some(LONE_SURROGATE);
                        }
                        i += 12;
                    }
                    0xDC00..=0xDFFF => return Some(LONE_SURROGATE),
                    _ => i += 6,
                }
            }
            // Any other escape is two bytes; skipping both keeps an escaped
            // backslash from being read as the start of an escape.
            b'\\' => i += 2,
            _ => i += 1,
        }
    }
    None
}

const NUL_IN_JSON: &str = "contains \"\\u0000\" (a NUL character), which PostgreSQL's jsonb cannot \
     store; remove it or encode the bytes (for example as base64)";
const LONE_SURROGATE: &str = "contains a \"\\u\" escape of half a UTF-16 surrogate pair, which \
     PostgreSQL's jsonb refuses; send the whole pair or the character itself";

fn enqueue_error(e: sqlx::Error) -> Error {
    let Some(database) = e.as_database_error() else {
        return Error::store("enqueue", e);
    };
    match database.code().as_deref() {
        // Text PostgreSQL cannot store: a NUL character, or "\u0000" in jsonb.
        Some("22021" | "22P05" | "22P02") => Error::invalid(
            "message",
            format!("PostgreSQL cannot store it: {}", database.message()),
        ),
        _ => Error::store("enqueue", e),
    }
}

impl SqlBackend for Core {
    type Db = sqlx::Postgres;
    /// `timestamptz`.
    type Time = DateTime<Utc>;

    fn parts(&self) -> &SqlParts<sqlx::Postgres> {
        &self.parts
    }

    fn server_clock(&self) -> bool {
        self.server_clock
    }

    /// PostgreSQL queues writers itself.
    async fn write_lock(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        None
    }

    async fn after_requeue(&self) {
        if !self.notify {
            return;
        }
        // Best effort: the requeue is committed either way, and a missed
        // wake-up only waits for the next tick.
        let notified = sqlx::query(AssertSqlSafe(self.sql.notify.clone()))
            .bind(&self.channel)
            .execute(&self.parts.pool)
            .await;
        if let Err(e) = notified {
            tracing::warn!(channel = %self.channel, error = %e, "outbox requeue could not notify");
        }
    }

    /// Text, integer and time columns (the payload is selected as text).
    fn raw_columns(row: &PgRow) -> std::collections::BTreeMap<String, Option<String>> {
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
                        row.try_get::<Option<DateTime<Utc>>, _>(i)
                            .map(|v| v.map(|v| v.to_rfc3339()))
                    })
                    .unwrap_or_else(|e| Some(format!("<unreadable: {e}>")));
                (column.name().to_owned(), text)
            })
            .collect()
    }
}

impl FencedBackend for Core {
    async fn apply(&self, rows: &[FencedWrite]) -> Result<Vec<Result<()>>> {
        let deletions_only = rows.iter().all(|row| row.op == FencedOp::Delete);
        let lost = self
            .settle(rows, deletions_only)
            .fetch_all(&self.parts.pool)
            .await
            .map_err(db("settle"))?;
        if lost.is_empty() {
            return Ok(rows.iter().map(|_| Ok(())).collect());
        }
        let lost_ids: std::collections::HashSet<String> = lost.iter().cloned().collect();
        let fences = Shared::fences(&self.parts, &self.sql.fences, lost).await;
        let server_now = self.server_now().await;
        Ok(rows
            .iter()
            .map(|row| {
                if !lost_ids.contains(&row.id) {
                    return Ok(());
                }
                match server_now {
                    // The write judged the lease by the server's clock:
                    // name the reason the same way, with the lease moved
                    // onto the writer's clock.
                    Some(server_now) => {
                        let mut fences = fences.clone();
                        if let Some((_, _, Some(until))) = fences.get_mut(&row.id) {
                            *until = row.now + (*until - server_now);
                        }
                        sql::lost_claim(row, &fences)
                    }
                    None => sql::lost_claim(row, &fences),
                }
            })
            .collect())
    }
}
