//! The PostgreSQL store: one outbox shared by many processes on many machines.
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
//! - **Wake-ups**: every enqueue through this store sends `NOTIFY` on the
//!   table's [channel](PostgresOutbox::channel) in the inserting statement,
//!   which PostgreSQL delivers when (and only if) the transaction commits.
//!   [`OutboxStore::wakeups`] listens on a connection of its own, reconnects
//!   after errors, wakes once after every (re)connect because notifications
//!   sent meanwhile are lost, and stops when the last [`Wakeups`] is dropped.
//!
//! # Time and clock skew
//!
//! Lease arithmetic uses the caller's `now` (the application's clock), never
//! the database's, as the port requires; tests drive it on virtual time.
//! Between nodes this means:
//!
//! - **Fencing is correct under any skew.** Every write checks the claim
//!   token, which only the current claim holds; a node with a wrong clock can
//!   at worst believe its own lease is shorter or longer than it is, and a
//!   write under a superseded token matches no row whatever the clocks say.
//! - **Skew decides when an expired claim may be taken over.** A node whose
//!   clock runs ahead by `s` sees other nodes' leases end `s` early and may
//!   re-claim a message while its first worker still renews it (the worker
//!   then loses its claim, and the message is delivered twice). Workers renew
//!   every `heartbeat`, so a lease has `lease - heartbeat` of slack: keep
//!   clock skew well below that (NTP keeps it in milliseconds; the defaults
//!   leave 20 s).
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
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgListener, PgPool, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, Row};

use super::fenced::{FencedWrite, FencedBackend, FencedWriter};
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
/// own; otherwise [`PostgresOutbox::setup`] does the same for any table name,
/// tracked per table. Use one or the other for a given database.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/postgres");

/// The longest wait between attempts to re-establish the wake-up listener.
const MAX_LISTEN_BACKOFF: Duration = Duration::from_secs(5);

fn columns(prefix: &str) -> String {
    [
        "seq",
        "id",
        "kind",
        "name",
        "payload::text AS payload",
        "trace",
        "status",
        "attempts",
        "max_attempts",
        "available_at",
        "claim_token",
        "claimed_at",
        "locked_until",
        "last_error",
        "created_at",
        "updated_at",
        "delivered_at",
    ]
    .iter()
    .map(|c| format!("{prefix}{c}"))
    .collect::<Vec<_>>()
    .join(", ")
}

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
#[derive(Clone)]
pub struct PostgresOutbox {
    core: Arc<Core>,
    settler: Arc<FencedWriter<Core>>,
    listener: Arc<ListenerShared>,
}

impl std::fmt::Debug for PostgresOutbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresOutbox")
            .field("table", &self.core.table.to_string())
            .field("channel", &self.core.channel)
            .field("settlement", &self.settler.mode())
            .finish_non_exhaustive()
    }
}

/// Settings for a [`PostgresOutbox`]; start with [`PostgresOutbox::builder`].
#[derive(Debug, Clone)]
pub struct PostgresOutboxBuilder {
    pool: PgPool,
    table: TableName,
    settlement: SettlementMode,
    notify: bool,
}

impl PostgresOutboxBuilder {
    /// Use this table (`table` or `schema.table`); `outbox` by default.
    pub fn table(mut self, name: &str) -> Result<Self> {
        self.table = TableName::parse(name)?;
        Ok(self)
    }

    /// How renewals and settlements are sent; batched by default
    /// ([`SettlementMode::DEFAULT_BATCHED`]).
    pub fn settlement(mut self, mode: SettlementMode) -> Result<Self> {
        self.settlement = mode.validate()?;
        Ok(self)
    }

    /// Whether enqueue sends `NOTIFY` (default `true`). Turn it off when no
    /// process listens, to spare every committing enqueue PostgreSQL's
    /// notification queue lock.
    pub fn notify(mut self, notify: bool) -> Self {
        self.notify = notify;
        self
    }

    /// The store. Call [`PostgresOutbox::setup`] once before using a new table.
    pub fn build(self) -> PostgresOutbox {
        let core = Arc::new(Core::new(self.pool, self.table, self.notify));
        PostgresOutbox {
            settler: Arc::new(FencedWriter::new(core.clone(), self.settlement)),
            listener: Arc::new(ListenerShared {
                wake: WakeupSender::new(),
                running: Mutex::new(false),
            }),
            core,
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
            notify: true,
        }
    }

    /// Connect to `url` and set up the default table.
    pub async fn connect(url: &str) -> Result<Self> {
        let options = PgConnectOptions::from_str(url)
            .map_err(|e| Error::invalid("url", format!("not a PostgreSQL URL: {e}")))?;
        let pool = PgPoolOptions::new()
            .connect_with(options)
            .await
            .map_err(db("connect"))?;
        let outbox = Self::new(pool);
        outbox.setup().await?;
        Ok(outbox)
    }

    /// Create or upgrade this store's table (and its schema, if named) and
    /// indexes. Safe to run any number of times, from any number of
    /// processes (sqlx serializes migrations with an advisory lock).
    pub async fn setup(&self) -> Result<()> {
        self.migrator()
            .run(&self.core.pool)
            .await
            .map_err(|e| Error::store("setup", e))
    }

    /// The migrations for this store's table, tracked in
    /// `"<table>_migrations"`; [`PostgresOutbox::setup`] runs them.
    pub fn migrator(&self) -> sqlx::migrate::Migrator {
        let mut migrator = sql::migrator_for(&MIGRATOR, &self.core.table, Dialect::Postgres);
        if let Some(schema) = self.core.table.schema() {
            migrator.create_schema(format!("\"{schema}\""));
        }
        migrator
    }

    /// The pool the store uses.
    pub fn pool(&self) -> &PgPool {
        &self.core.pool
    }

    /// The table the store uses.
    pub fn table(&self) -> &TableName {
        &self.core.table
    }

    /// The `LISTEN`/`NOTIFY` channel of this table: `outbox:<schema.table>`,
    /// or `outbox:<hash>` when that would exceed PostgreSQL's 63 bytes.
    pub fn channel(&self) -> &str {
        &self.core.channel
    }

    /// The statement that claims up to `limit` messages, for tools that
    /// measure the store against raw SQL. Binds: `$1` now, `$2` lease end.
    /// Rows out of attempts come back with `abandoned = true`, untouched.
    ///
    /// The limit is written into the statement rather than bound: PostgreSQL
    /// cannot see a bound `LIMIT` when it plans a statement for reuse and
    /// assumes a tenth of the table, so it planned every claim afresh. With
    /// the limit written out, each size of claim is a prepared statement of
    /// its own whose plan is reused.
    pub fn claim_sql(&self, limit: usize) -> String {
        self.core.sql.claim(limit)
    }

    /// The fenced write statement. Binds seven arrays of equal length: `$1`
    /// op (`renew`, `deliver`, `retry`, `dead`, `release`), `$2` id, `$3`
    /// token, `$4` now, `$5` new `locked_until` (renew), `$6` new
    /// `available_at` (retry), `$7` `last_error` JSON; returns the ids it
    /// changed.
    pub fn settle_sql(&self) -> &str {
        &self.core.sql.settle
    }

    /// Enqueue on the caller's connection, inside the caller's transaction
    /// when there is one (`&mut *tx`): rolled back, the message is gone;
    /// committed, the next claim sees it and listeners are notified.
    pub async fn enqueue_in(&self, conn: &mut PgConnection, message: NewMessage) -> Result<String> {
        message.validate()?;
        self.core.insert(conn, message).await
    }

    /// [`PostgresOutbox::enqueue_in`] for an event of registered type `E`.
    pub async fn enqueue_event_in<E: Event>(
        &self,
        conn: &mut PgConnection,
        payload: &E,
    ) -> Result<String> {
        self.enqueue_in(conn, NewMessage::event(payload)?).await
    }

    /// [`PostgresOutbox::enqueue_in`] for a job of registered type `J`.
    pub async fn enqueue_job_in<J: Job>(
        &self,
        conn: &mut PgConnection,
        payload: &J,
    ) -> Result<String> {
        self.enqueue_in(conn, NewMessage::job(payload)?).await
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
    settle: Arc<str>,
    fences: Arc<str>,
    get: Arc<str>,
    stats: Arc<str>,
    requeue_one: Arc<str>,
    requeue_all: Arc<str>,
    requeue_state: Arc<str>,
    purge: Arc<str>,
    notify: Arc<str>,
    table: Arc<str>,
}

impl Statements {
    fn new(table: &TableName, notify: bool) -> Self {
        let t = table.quoted();
        let all = columns("");
        let m_all = columns("m.");
        let insert = format!(
            "INSERT INTO {t} (id, kind, name, payload, trace, status, attempts, max_attempts, \
             available_at, created_at, updated_at) \
             VALUES ($1, $2, $3, $4::jsonb, $5, 'pending', 0, $6, $7, $8, $8)"
        );
        Statements {
            // NOTIFY in the inserting statement: delivered at commit, never
            // for a rollback, and deduplicated within a transaction.
            insert: if notify {
                format!(
                    "WITH inserted AS ({insert} RETURNING 1) \
                     SELECT pg_notify($9, '') FROM inserted"
                )
            } else {
                insert
            }
            .into(),
            // Each arm is read from its own partial index in claim order,
            // skipping rows another claimer holds; the union is cut to the
            // limit again. Rows out of attempts are returned untouched.
            // `{limit}` is written out per claim; see `claim_sql`.
            claim: format!(
                "WITH pending AS ( \
                   SELECT id, available_at, created_at, seq, attempts >= max_attempts AS abandoned \
                   FROM {t} WHERE status = 'pending' AND available_at <= $1 \
                   ORDER BY available_at, created_at, seq LIMIT {{limit}} FOR UPDATE SKIP LOCKED), \
                 expired AS ( \
                   SELECT id, available_at, created_at, seq, attempts >= max_attempts AS abandoned \
                   FROM {t} WHERE status = 'claimed' AND locked_until <= $1 \
                   ORDER BY available_at, created_at, seq LIMIT {{limit}} FOR UPDATE SKIP LOCKED), \
                 picked AS ( \
                   SELECT * FROM pending UNION ALL SELECT * FROM expired \
                   ORDER BY available_at, created_at, seq LIMIT {{limit}}), \
                 claimed AS ( \
                   UPDATE {t} AS m SET status = 'claimed', attempts = m.attempts + 1, \
                     claim_token = gen_random_uuid()::text, claimed_at = $1, locked_until = $2, \
                     updated_at = $1 \
                   FROM picked WHERE m.id = picked.id AND NOT picked.abandoned \
                   RETURNING {m_all}) \
                 SELECT false AS abandoned, * FROM claimed \
                 UNION ALL \
                 SELECT true, {m_all} FROM {t} AS m JOIN picked ON m.id = picked.id \
                 WHERE picked.abandoned"
            )
            .into(),
            abandoned: format!(
                "UPDATE {t} AS m SET status = 'dead_lettered', claim_token = NULL, \
                   claimed_at = NULL, locked_until = NULL, last_error = v.error, updated_at = $1 \
                 FROM unnest($2::text[], $3::bigint[], $4::text[]) AS v(id, attempts, error) \
                 WHERE m.id = v.id AND m.attempts = v.attempts AND m.attempts >= m.max_attempts \
                   AND ((m.status = 'pending' AND m.available_at <= $1) \
                     OR (m.status = 'claimed' AND m.locked_until <= $1)) \
                 RETURNING {m_all}"
            )
            .into(),
            quarantine: format!(
                "UPDATE {t} SET status = 'dead_lettered', claim_token = NULL, claimed_at = NULL, \
                   locked_until = NULL, last_error = $1, updated_at = $2 \
                 WHERE seq = $3 AND status IN ('pending', 'claimed') \
                   AND claim_token IS NOT DISTINCT FROM $4"
            )
            .into(),
            // Each row is looked up by primary key, so a batch costs the
            // same however many claims are out. The status test is written
            // so that the index of claimed rows does not match it: scanning
            // all claims for every batch is what the planner picks otherwise.
            settle: format!(
                "UPDATE {t} AS m SET \
                   status = CASE v.op WHEN 'renew' THEN 'claimed' WHEN 'deliver' THEN 'delivered' \
                     WHEN 'dead' THEN 'dead_lettered' ELSE 'pending' END, \
                   attempts = CASE v.op WHEN 'release' THEN greatest(m.attempts - 1, 0) \
                     ELSE m.attempts END, \
                   available_at = CASE v.op WHEN 'retry' THEN v.available WHEN 'release' THEN v.now \
                     ELSE m.available_at END, \
                   claim_token = CASE v.op WHEN 'renew' THEN m.claim_token END, \
                   claimed_at = CASE v.op WHEN 'renew' THEN m.claimed_at END, \
                   locked_until = CASE v.op WHEN 'renew' THEN v.until END, \
                   last_error = CASE WHEN v.op IN ('retry', 'dead') THEN v.error \
                     ELSE m.last_error END, \
                   delivered_at = CASE v.op WHEN 'deliver' THEN v.now ELSE m.delivered_at END, \
                   updated_at = v.now \
                 FROM unnest($1::text[], $2::text[], $3::text[], $4::timestamptz[], \
                   $5::timestamptz[], $6::timestamptz[], $7::text[]) \
                   AS v(op, id, token, now, until, available, error) \
                 WHERE m.id = v.id AND coalesce(m.status, '') = 'claimed' \
                   AND m.claim_token = v.token AND m.locked_until > v.now \
                 RETURNING m.id"
            )
            .into(),
            fences: format!(
                "SELECT id, status, claim_token, locked_until FROM {t} WHERE id = ANY($1)"
            )
            .into(),
            get: format!("SELECT {all} FROM {t} WHERE id = $1").into(),
            stats: format!(
                "SELECT \
                   (SELECT count(*) FROM {t} WHERE status = 'pending'), \
                   (SELECT count(*) FROM {t} WHERE status = 'claimed'), \
                   (SELECT count(*) FROM {t} WHERE status = 'delivered'), \
                   (SELECT count(*) FROM {t} WHERE status = 'dead_lettered'), \
                   (SELECT count(*) FROM {t} WHERE status = 'claimed' AND locked_until > $1), \
                   (SELECT min(available_at) FROM {t} WHERE status = 'pending' AND available_at <= $1)"
            )
            .into(),
            requeue_one: format!(
                "UPDATE {t} SET status = 'pending', attempts = 0, available_at = $2, updated_at = $2 \
                 WHERE id = $1 AND status = 'dead_lettered'"
            )
            .into(),
            requeue_all: format!(
                "UPDATE {t} SET status = 'pending', attempts = 0, available_at = $1, updated_at = $1 \
                 WHERE status = 'dead_lettered' AND ($2::text IS NULL OR name = $2)"
            )
            .into(),
            requeue_state: format!("SELECT status, locked_until FROM {t} WHERE id = $1").into(),
            purge: format!(
                "DELETE FROM {t} WHERE status IN ('delivered', 'dead_lettered') \
                 AND ($1::text IS NULL OR status = $1) AND updated_at < $2"
            )
            .into(),
            notify: "SELECT pg_notify($1, '')".into(),
            table: t.into(),
        }
    }
}

impl Statements {
    /// The claim statement for up to `limit` messages. A number is the only
    /// thing written into it.
    fn claim(&self, limit: usize) -> String {
        self.claim.replace("{limit}", &limit.to_string())
    }
}

/// The channel of `table`: readable when it fits in an identifier.
fn channel_of(table: &TableName) -> String {
    let readable = format!("outbox:{table}");
    if readable.len() <= 63 {
        return readable;
    }
    // FNV-1a: stable across processes and builds, unlike std's hasher.
    let hash = table
        .to_string()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    format!("outbox:{hash:016x}")
}

/// What the store and its settlement batch share.
struct Core {
    pool: PgPool,
    table: TableName,
    channel: String,
    notify: bool,
    sql: Statements,
}

impl Core {
    fn new(pool: PgPool, table: TableName, notify: bool) -> Self {
        Core {
            sql: Statements::new(&table, notify),
            channel: channel_of(&table),
            notify,
            pool,
            table,
        }
    }

    async fn insert(&self, conn: &mut PgConnection, message: NewMessage) -> Result<String> {
        let id = message.resolve_id();
        let now = message.now;
        let mut query = sqlx::query(AssertSqlSafe(self.sql.insert.clone()))
            .bind(&id)
            .bind(message.kind.as_str())
            .bind(&message.name)
            .bind(message.payload.as_str())
            .bind(sql::trace_json(message.trace.as_ref()))
            .bind(i64::from(message.max_attempts))
            .bind(message.available_at.unwrap_or(now))
            .bind(now);
        if self.notify {
            query = query.bind(&self.channel);
        }
        query
            .execute(conn)
            .await
            .map_err(|e| enqueue_error(&id, e))?;
        Ok(id)
    }

    async fn claim(&self, params: ClaimBatch) -> Result<ClaimedBatch> {
        check::claim_batch(&params)?;
        let ClaimBatch { limit, now, lease } = params;
        let locked_until = lease_end(now, lease)?;
        let rows = sqlx::query(AssertSqlSafe(self.sql.claim(limit)))
            .bind(now)
            .bind(locked_until)
            .fetch_all(&self.pool)
            .await
            .map_err(db("claim_batch"))?;
        let mut claimed = Vec::with_capacity(rows.len());
        let mut abandoned = Vec::new();
        for row in &rows {
            let decoded = decode(row).and_then(|r| Ok((r.seq, r.into_message()?)));
            let is_abandoned: bool = row.try_get("abandoned").map_err(db("claim_batch"))?;
            match decoded {
                Ok((seq, message)) if is_abandoned => abandoned.push((seq, message)),
                Ok((seq, message)) => claimed.push((seq, sql::claimed_view(message)?)),
                Err(unreadable) => self.quarantine(row, unreadable, now).await?,
            }
        }
        claimed.sort_by_key(|(seq, m)| (m.available_at, m.created_at, *seq));
        let mut batch = ClaimedBatch {
            claimed: claimed.into_iter().map(|(_, m)| m).collect(),
            dead_lettered: Vec::new(),
        };
        if !abandoned.is_empty() {
            batch.dead_lettered = self.dead_letter_abandoned(abandoned, now).await?;
        }
        Ok(batch)
    }

    /// Dead-letter the rows a claim found out of attempts, if they still are.
    async fn dead_letter_abandoned(
        &self,
        abandoned: Vec<(i64, OutboxMessage)>,
        now: DateTime<Utc>,
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
                    max_attempts: message.max_attempts,
                })
                .to_json(),
            );
        }
        let rows = sqlx::query(AssertSqlSafe(self.sql.abandoned.clone()))
            .bind(now)
            .bind(ids)
            .bind(attempts)
            .bind(errors)
            .fetch_all(&self.pool)
            .await
            .map_err(db("claim_batch"))?;
        let mut dead = rows
            .iter()
            .map(|row| {
                let row = decode(row)?;
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
        tracing::error!(table = %self.table, seq, error = %unreadable,
            "outbox row is unreadable; dead-lettered");
        sqlx::query(AssertSqlSafe(self.sql.quarantine.clone()))
            .bind(ErrorRecord::from_error(&unreadable).to_json())
            .bind(now)
            .bind(seq)
            .bind(token)
            .execute(&self.pool)
            .await
            .map_err(db("claim_batch"))?;
        Ok(())
    }

    /// The fence columns of `ids` as they are now, to name why a fenced write
    /// missed. Only on that failure path; a read error leaves the reason
    /// unknown (the write already proved the claim lost).
    async fn fences(&self, ids: Vec<String>) -> std::collections::HashMap<String, Fence> {
        let rows = sqlx::query(AssertSqlSafe(self.sql.fences.clone()))
            .bind(ids)
            .fetch_all(&self.pool)
            .await
            .unwrap_or_default();
        rows.iter()
            .filter_map(|row| {
                let id: String = row.try_get(0).ok()?;
                let fence = (
                    row.try_get(1).ok()?,
                    row.try_get(2).ok()?,
                    row.try_get(3).ok()?,
                );
                Some((id, fence))
            })
            .collect()
    }
}

type Fence = (String, Option<String>, Option<DateTime<Utc>>);

fn enqueue_error(id: &str, e: sqlx::Error) -> Error {
    let Some(database) = e.as_database_error() else {
        return Error::store("enqueue", e);
    };
    if database.is_unique_violation() {
        return Error::DuplicateId { id: id.to_owned() };
    }
    match database.code().as_deref() {
        // Text PostgreSQL cannot store: a NUL character, or "\u0000" in jsonb.
        Some("22021" | "22P05" | "22P02") => Error::invalid(
            "message",
            format!("PostgreSQL cannot store it: {}", database.message()),
        ),
        _ => Error::store("enqueue", e),
    }
}

impl FencedBackend for Core {
    async fn apply(&self, rows: &[FencedWrite]) -> Result<Vec<Result<()>>> {
        let n = rows.len();
        let mut ops = Vec::with_capacity(n);
        let mut ids = Vec::with_capacity(n);
        let mut tokens = Vec::with_capacity(n);
        let mut nows = Vec::with_capacity(n);
        let mut untils = Vec::with_capacity(n);
        let mut availables = Vec::with_capacity(n);
        let mut errors = Vec::with_capacity(n);
        for row in rows {
            ops.push(row.op.code());
            ids.push(row.id.as_str());
            tokens.push(row.claim_token.as_str());
            nows.push(row.now);
            untils.push(row.op.locked_until());
            availables.push(row.op.available_at());
            errors.push(row.error.as_deref());
        }
        let changed: Vec<String> = sqlx::query_scalar(AssertSqlSafe(self.sql.settle.clone()))
            .bind(ops)
            .bind(ids)
            .bind(tokens)
            .bind(nows)
            .bind(untils)
            .bind(availables)
            .bind(errors)
            .fetch_all(&self.pool)
            .await
            .map_err(db("settle"))?;
        let changed: std::collections::HashSet<String> = changed.into_iter().collect();
        let lost: Vec<String> = rows
            .iter()
            .filter(|row| !changed.contains(&row.id))
            .map(|row| row.id.clone())
            .collect();
        let fences = if lost.is_empty() {
            Default::default()
        } else {
            self.fences(lost).await
        };
        Ok(rows
            .iter()
            .map(|row| {
                if changed.contains(&row.id) {
                    Ok(())
                } else {
                    let fence = fences.get(&row.id).cloned();
                    Err(sql::claim_loss(&row.id, fence, &row.claim_token, row.now).into())
                }
            })
            .collect())
    }
}

/// The wake-up listener's state, shared by the store's clones.
struct ListenerShared {
    wake: WakeupSender,
    /// Whether a listener task runs. Checked and set under this lock
    /// together with subscribing, so a task never stops while a subscriber
    /// it should serve exists.
    running: Mutex<bool>,
}

impl ListenerShared {
    fn lock(&self) -> std::sync::MutexGuard<'_, bool> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl PostgresOutbox {
    fn subscribe(&self) -> Option<Wakeups> {
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let mut running = self.listener.lock();
        let wakeups = self.listener.wake.subscribe();
        if !*running {
            *running = true;
            // The listener gets a connection of its own, outside the store's
            // pool, so it never takes a connection from claims and settlements.
            let options = (*self.core.pool.connect_options()).clone();
            runtime.spawn(listen(
                options,
                self.core.channel.clone(),
                self.listener.clone(),
            ));
        }
        Some(wakeups)
    }
}

/// Listen on `channel` until the last subscriber is gone.
async fn listen(options: PgConnectOptions, channel: String, shared: Arc<ListenerShared>) {
    let wake = shared.wake.clone();
    let mut backoff = Duration::from_millis(50);
    loop {
        let connected = tokio::select! {
            () = wake.0.closed() => None,
            connected = connect_listener(&options, &channel) => Some(connected),
        };
        let mut listener = match connected {
            None if stop(&shared) => return,
            None => continue,
            Some(Ok(listener)) => listener,
            Some(Err(e)) => {
                tracing::warn!(%channel, error = %e, retry_in = ?backoff,
                    "outbox wake-up listener cannot connect");
                tokio::select! {
                    () = wake.0.closed() => if stop(&shared) { return },
                    () = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(MAX_LISTEN_BACKOFF);
                continue;
            }
        };
        backoff = Duration::from_millis(50);
        // Notifications sent while nobody listened are lost: look once.
        wake.wake();
        loop {
            let received = tokio::select! {
                () = wake.0.closed() => None,
                received = listener.try_recv() => Some(received),
            };
            match received {
                // A cancelled receive may leave the connection mid-message:
                // start over on a fresh one if subscribers came back.
                None if stop(&shared) => return,
                None => break,
                Some(Ok(Some(_))) => wake.wake(),
                // The connection dropped and the listener reconnected (and
                // listens again); anything sent in between is lost.
                Some(Ok(None)) => wake.wake(),
                Some(Err(e)) => {
                    tracing::warn!(%channel, error = %e, "outbox wake-up listener lost its connection");
                    break;
                }
            }
        }
    }
}

/// `true` (and the task marked stopped) when no subscriber is left.
fn stop(shared: &ListenerShared) -> bool {
    let mut running = shared.lock();
    if shared.wake.has_subscribers() {
        return false;
    }
    *running = false;
    true
}

async fn connect_listener(options: &PgConnectOptions, channel: &str) -> sqlx::Result<PgListener> {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .idle_timeout(None)
        .max_lifetime(None)
        .connect_lazy_with(options.clone());
    let mut listener = PgListener::connect_with(&pool).await?;
    listener.ignore_pool_close_event(true);
    listener.listen(channel).await?;
    Ok(listener)
}

impl OutboxStore for PostgresOutbox {
    async fn enqueue(&self, message: NewMessage) -> Result<String> {
        message.validate()?;
        let mut conn = self.core.pool.acquire().await.map_err(db("enqueue"))?;
        self.core.insert(&mut conn, message).await
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

    /// Listens on [`PostgresOutbox::channel`] while any receiver lives;
    /// `None` outside a tokio runtime.
    fn wakeups(&self) -> Option<Wakeups> {
        self.subscribe()
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

impl OutboxAdmin for PostgresOutbox {
    async fn stats(&self, now: DateTime<Utc>) -> Result<OutboxStats> {
        let row = sqlx::query(AssertSqlSafe(self.core.sql.stats.clone()))
            .bind(now)
            .fetch_one(&self.core.pool)
            .await
            .map_err(db("stats"))?;
        let count = |i: usize| -> Result<u64> {
            let n: i64 = row.try_get(i).map_err(db("stats"))?;
            Ok(u64::try_from(n).unwrap_or(0))
        };
        let claimed = count(1)?;
        let live_claims = count(4)?;
        Ok(OutboxStats {
            pending: count(0)?,
            claimed,
            delivered: count(2)?,
            dead_lettered: count(3)?,
            live_claims,
            expired_claims: claimed.saturating_sub(live_claims),
            oldest_due_at: row.try_get(5).map_err(db("stats"))?,
        })
    }

    async fn list_messages(&self, params: ListMessages) -> Result<MessagePage> {
        check::list(&params)?;
        let mut query = format!(
            "SELECT {} FROM {} WHERE true",
            columns(""),
            self.core.sql.table
        );
        let mut n = 0;
        let mut next_param = || {
            n += 1;
            n
        };
        if params.status.is_some() {
            query.push_str(&format!(" AND status = ${}", next_param()));
        }
        if params.name.is_some() {
            query.push_str(&format!(" AND name = ${}", next_param()));
        }
        if params.after.is_some() {
            let (a, b) = (next_param(), next_param());
            query.push_str(&format!(" AND (created_at, id) > (${a}, ${b})"));
        }
        query.push_str(&format!(" ORDER BY created_at, id LIMIT ${}", next_param()));
        let mut q = sqlx::query(AssertSqlSafe(query));
        if let Some(status) = params.status {
            q = q.bind(status.as_str());
        }
        if let Some(name) = &params.name {
            q = q.bind(name.as_str());
        }
        if let Some(after) = &params.after {
            q = q.bind(after.created_at).bind(after.id.as_str());
        }
        let rows = q
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
        let requeued = match &params.id {
            Some(id) => {
                let done = sqlx::query(AssertSqlSafe(self.core.sql.requeue_one.clone()))
                    .bind(id)
                    .bind(params.now)
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
                .bind(params.now)
                .bind(params.name.as_deref())
                .execute(&self.core.pool)
                .await
                .map_err(db("requeue_dead_letters"))?
                .rows_affected(),
        };
        if requeued > 0 && self.core.notify {
            // Best effort: the requeue is committed either way, and a missed
            // wake-up only waits for the next tick.
            let notified = sqlx::query(AssertSqlSafe(self.core.sql.notify.clone()))
                .bind(&self.core.channel)
                .execute(&self.core.pool)
                .await;
            if let Err(e) = notified {
                tracing::warn!(channel = %self.core.channel, error = %e, "outbox requeue could not notify");
            }
        }
        Ok(requeued)
    }

    async fn purge(&self, params: PurgeMessages) -> Result<u64> {
        check::purge(&params)?;
        Ok(sqlx::query(AssertSqlSafe(self.core.sql.purge.clone()))
            .bind(params.status.map(MessageStatus::as_str))
            .bind(params.older_than)
            .execute(&self.core.pool)
            .await
            .map_err(db("purge"))?
            .rows_affected())
    }
}

impl PostgresOutbox {
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
        let until: Option<DateTime<Utc>> = row.try_get(1).ok().flatten();
        sql::requeue_refusal(id, status, until, now)
    }
}

fn decode(row: &PgRow) -> Result<MessageRow> {
    let id: String = row.try_get("id").map_err(|e| Error::CorruptRow {
        id: String::from("<unreadable>"),
        reason: e.to_string(),
    })?;
    let corrupt = |e: sqlx::Error| Error::CorruptRow {
        id: id.clone(),
        reason: e.to_string(),
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
        available_at: row.try_get("available_at").map_err(corrupt)?,
        claim_token: row.try_get("claim_token").map_err(corrupt)?,
        claimed_at: row.try_get("claimed_at").map_err(corrupt)?,
        locked_until: row.try_get("locked_until").map_err(corrupt)?,
        last_error: row.try_get("last_error").map_err(corrupt)?,
        created_at: row.try_get("created_at").map_err(corrupt)?,
        updated_at: row.try_get("updated_at").map_err(corrupt)?,
        delivered_at: row.try_get("delivered_at").map_err(corrupt)?,
        id: id.clone(),
    })
}
