//! The PostgreSQL store: one outbox shared by many processes on many machines.
//!
//! This file is the store, its builder, connecting and setting up, and the
//! core its parts share. The other files each add one concern, importing
//! this one and never each other (but `statements.rs`):
//!
//! - `statements.rs`: its SQL text, rendered once per table (imports
//!   nothing of the store).
//! - `listener.rs`: the `LISTEN`/`NOTIFY` wake-ups (imports nothing of the
//!   store either; the store hands it a pool and a channel).
//! - `enqueue.rs`: enqueue, and the input PostgreSQL would refuse.
//! - `claim.rs`: the claim.
//! - `settle.rs`: the fenced writes (renewals and settlements).
//! - `admin.rs`: its listing and activity.
//! - `schedules.rs`: the periodic schedules: a slot's enqueue in one
//!   transaction with the move of its schedule's `last_slot`.
//!
//! What it shares with the SQLite store (fenced-write forwarding, requeue,
//! purge, stats, reading rows) is in [`crate::store::sql`].
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
//!   ([`Wakeups::arm`](crate::Wakeups::arm), a sequence the inserting
//!   statement reads as it is now, whatever its snapshot), and enqueues
//!   notify only until a listener has heard one (see
//!   `migrations/postgres/0020_wake_sequences.sql`). A drain cannot arm
//!   while an enqueue is between its insert and its commit; it then claims
//!   again shortly instead. [`OutboxStore::wakeups`](crate::OutboxStore::wakeups)
//!   listens on a connection of its own, records each wake-up it hears as
//!   served, renews an arming that waits unwoken before it lapses (a
//!   minute), reconnects after errors, wakes once after every (re)connect
//!   because notifications sent meanwhile are lost, and stops when the last
//!   [`Wakeups`] is dropped.
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
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, Row};

use super::connect;
use super::sql::{
    self, Dialect, PgTime, SettlementMode, SqlBackend, SqlOutbox, SqlParts, TableName, db,
};
use super::{ArmOutcome, ArmWakeups, Wakeups};
use crate::database::DatabaseKind;
use crate::error::{Error, Result};
use listener::Listener;
use statements::{Statements, channel_of};

mod admin;
mod claim;
mod enqueue;
mod listener;
mod schedules;
mod settle;
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
    listener: Arc<Listener>,
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
            listener: Arc::new(Listener::new()),
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
            .map_err(|e| connect::connect_failed(url, &e, DatabaseKind::Postgres))
    }

    /// The options `url` gives; a SQLite URL is refused with [`Error::Url`]
    /// saying to use `SqliteOutbox`.
    pub fn connect_options(url: &str) -> Result<PgConnectOptions> {
        connect::check_postgres_url(url)?;
        PgConnectOptions::from_str(url)
            .map_err(|e| connect::malformed(url, DatabaseKind::Postgres, e))
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
            Ok(Err(e)) => Err(connect::connect_failed(url, &e, DatabaseKind::Postgres)),
            Err(_) => Err(Error::Connect {
                url: super::kit::redact_url(url),
                reason: format!(
                    "no connection within {}",
                    humantime::format_duration(timeout)
                ),
                database: DatabaseKind::Postgres,
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

    /// Listens on [`PostgresOutbox::channel`] while any receiver lives;
    /// `None` outside a tokio runtime. Enqueues notify only drains that
    /// armed (see [`Wakeups::arm`]).
    fn subscribe(&self) -> Option<Wakeups> {
        let core = self.inner.core.clone();
        let listener = self.listener.clone();
        let arm = ArmWakeups::new(move || {
            let core = core.clone();
            let listener = listener.clone();
            async move {
                let outcome = core.arm().await?;
                if outcome == ArmOutcome::Armed {
                    // For the listener to renew until a wake-up comes.
                    listener.armed();
                }
                Ok(outcome)
            }
        });
        let statements = listener::Statements {
            arm,
            served: self.inner.core.sql.served.clone(),
        };
        self.listener.subscribe(
            &statements,
            &self.inner.core.parts.pool,
            &self.inner.core.channel,
        )
    }
}

sql::sql_store!(PostgresOutbox, PostgresOutboxBuilder, PgPool, PgConnection);

/// What the store and its settlement batch share.
struct Core {
    parts: SqlParts<sqlx::Postgres>,
    channel: String,
    notify: bool,
    /// Leases are judged by the database's clock, not the caller's `now`.
    server_clock: bool,
    sql: Statements,
    /// How many settlement statements may be in flight at once; see
    /// [`Core::warm_up`].
    settlement_statements: usize,
    /// The periodic schedules' statements.
    schedules: sql::ScheduleStatements,
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
        let schedules = sql::ScheduleStatements::new(&table, Dialect::Postgres);
        Core {
            sql,
            schedules,
            channel: channel_of(&table),
            notify,
            server_clock,
            settlement_statements,
            parts: SqlParts {
                pool,
                table,
                shared,
            },
        }
    }

    /// Ask for a wake-up on the next committed insert; see
    /// `Statements::arm`.
    async fn arm(&self) -> Result<ArmOutcome> {
        let armed = sqlx::query(AssertSqlSafe(self.sql.arm.clone()))
            .fetch_optional(&self.parts.pool)
            .await
            .map_err(db("arm_wakeups"))?;
        Ok(if armed.is_some() {
            ArmOutcome::Armed
        } else {
            ArmOutcome::EnqueueInFlight
        })
    }

    /// The `now` to bind: the caller's, or NULL for the database's.
    fn bound_now(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        (!self.server_clock).then_some(now)
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
            self.claim_nothing()
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

    /// Up to four: a durable claim mostly waits for its commit's flush,
    /// and concurrent claims share one. Each holds a connection, so no more
    /// than the pool has beside the settlement statements and one for the
    /// application (four on sqlx's default pool of 10).
    /// Yes: a claim is a network round trip and, durable, a flush.
    pub(crate) fn claims_ahead(&self) -> bool {
        true
    }

    /// The most a configured `prefetch` may hold: the more a claim takes,
    /// the more flushes the messages share.
    pub(crate) fn prefetch_limit(&self) -> usize {
        crate::config::MAX_PREFETCH
    }

    pub(crate) fn claim_parallelism(&self) -> usize {
        let pool = self.parts.pool.options().get_max_connections() as usize;
        pool.saturating_sub(self.settlement_statements + 1)
            .clamp(1, 4)
    }
}

impl SqlBackend for Core {
    type Db = sqlx::Postgres;
    /// `timestamptz`.
    type Time = PgTime;

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
                        row.try_get::<Option<PgTime>, _>(i)
                            .map(|v| v.map(|v| v.0.to_rfc3339()))
                    })
                    .unwrap_or_else(|e| Some(format!("<unreadable: {e}>")));
                (column.name().to_owned(), text)
            })
            .collect()
    }
}
