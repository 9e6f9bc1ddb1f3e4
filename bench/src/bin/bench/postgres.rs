//! The PostgreSQL sides: a fresh table each in `DATABASE_URL`, the
//! baseline raw SQL, and the transactions and log each side cost the server.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use outbox::{Clock, DrainConfig, PostgresOutbox, SystemClock};
use outbox_bench::args::refuse;
use outbox_bench::drain::current_thread;
use outbox_bench::resources::with_cpu;
use outbox_bench::store::{self, FILL_CHUNK, postgres};
use sqlx::postgres::{PgConnection, PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Connection, Row};

use crate::sides::{RuntimeSettings, Side, drain_with_runtime, run_sides, ticks};

/// Rows per claim of the raw-SQL baseline.
const BASELINE_CLAIM: usize = 100;

fn url() -> String {
    postgres::database_url().unwrap_or_else(|message| refuse(message))
}

/// The runtime against [`raw_sql`], each on a table of its own, with the
/// commits and the log each drain cost.
pub(crate) fn sides(settings: RuntimeSettings, run: (bool, bool)) -> (Option<Side>, Option<Side>) {
    let messages = settings.messages;
    run_sides(
        run,
        counted("baseline", settings, |store| async move {
            raw_sql(&store, messages).await
        }),
        counted("runtime", settings, |store| {
            drain_with_runtime(store, settings)
        }),
    )
}

/// One side on a fresh table `bench_<pid>_<side>`: `drain` timed, the
/// commits and the log it cost counted once its connections closed, the
/// table dropped afterwards.
async fn counted<F>(
    side: &str,
    settings: RuntimeSettings,
    drain: impl FnOnce(PostgresOutbox) -> F,
) -> Side
where
    F: Future<Output = Duration>,
{
    let messages = settings.messages;
    let mut counters = Counters::connect().await;
    let store = filled(side, messages, settings.pool).await;
    let before = counters.settled().await;
    let measured = with_cpu(drain(store.clone())).await;
    let counts = counters.per_message(store.pool(), before, messages).await;
    drop_table(&store).await;
    Side {
        commits_per_message: Some(counts.commits),
        wal_bytes_per_message: Some(counts.wal),
        ..Side::timed(measured)
    }
}

/// The server's durability settings, as the plot's note states them:
/// `fsync=on, synchronous_commit=on`.
pub(crate) fn durability() -> String {
    current_thread().block_on(async {
        let mut conn = PgConnection::connect(&url()).await.expect("connect");
        let mut shown = Vec::new();
        for setting in ["fsync", "synchronous_commit"] {
            let value: String = sqlx::query_scalar(AssertSqlSafe(format!("SHOW {setting}")))
                .fetch_one(&mut conn)
                .await
                .expect("read a server setting");
            shown.push(format!("{setting}={value}"));
        }
        conn.close().await.ok();
        shown.join(", ")
    })
}

/// Pool options of `size` connections (sqlx's default, as a user gets
/// it, unless given).
fn pool_options(size: Option<u32>) -> PgPoolOptions {
    let options = PgPoolOptions::new();
    match size {
        Some(size) => options.max_connections(size),
        None => options,
    }
}

/// A fresh table `bench_<pid>_<side>` holding `messages` pending ticks,
/// filled on a pool that is closed again, and a store on a new pool for
/// the drain. Nobody listens during the bench: no NOTIFY per insert.
async fn filled(side: &str, messages: u64, pool: Option<u32>) -> PostgresOutbox {
    let url = url();
    let table = format!("bench_{}_{side}", std::process::id());
    let fill = postgres::fresh(&url, &table, pool_options(None), false).await;
    store::fill(&fill, 0..messages, FILL_CHUNK, ticks()).await;
    postgres::analyze(&fill).await;
    fill.pool().close().await;
    postgres::store(&url, &table, pool_options(pool), false)
}

/// Drops the store's table and what came with it.
async fn drop_table(store: &PostgresOutbox) {
    postgres::drop_tables(&url(), &store.table().to_string()).await;
}

/// Counts the transactions committed in the bench database and the log
/// the server wrote, from a connection of its own.
struct Counters {
    conn: PgConnection,
}

impl Counters {
    async fn connect() -> Self {
        Counters {
            conn: PgConnection::connect(&url()).await.expect("connect"),
        }
    }

    /// Transactions committed so far by every other backend, once those
    /// backends are gone, and the write-ahead log's position. A backend
    /// publishes its counts when it goes idle (at most once a second) or
    /// exits, so this waits until no other client is connected: close
    /// the pools first.
    async fn settled(&mut self) -> Counts {
        loop {
            let others: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND pid <> pg_backend_pid() \
                   AND backend_type = 'client backend'",
            )
            .fetch_one(&mut self.conn)
            .await
            .expect("read pg_stat_activity");
            if others == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // A backend leaves pg_stat_activity in the same exit step that
        // publishes its counts; give that step time to finish.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (commits, wal) = sqlx::query_as(
            "SELECT xact_commit, pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint \
             FROM pg_stat_database WHERE datname = current_database()",
        )
        .fetch_one(&mut self.conn)
        .await
        .expect("read pg_stat_database");
        Counts { commits, wal }
    }

    /// Close `pool` and count, per message, the commits made and the
    /// log written since `before`. The commits include this
    /// connection's own reads (one per 50 ms while waiting), a rounding
    /// error at these message counts; the log is the whole server's,
    /// autovacuum's included.
    async fn per_message(&mut self, pool: &PgPool, before: Counts, messages: u64) -> Counts<f64> {
        pool.close().await;
        let after = self.settled().await;
        Counts {
            commits: (after.commits - before.commits) as f64 / messages as f64,
            wal: (after.wal - before.wal) as f64 / messages as f64,
        }
    }
}

/// Committed transactions and write-ahead log bytes.
#[derive(Debug, Clone, Copy)]
struct Counts<T = i64> {
    commits: T,
    wal: T,
}

/// The store's claim of up to `limit` messages, as it runs it for the
/// bench's messages (one queue, one priority, no ordering keys): pending
/// rows in the order of the index of keyless ones, which serves only a
/// claim that names the queue and the priority. Binds: `$1` now, `$2`
/// lease end. Rows out of attempts come back with `abandoned = true`,
/// untouched.
fn claim_sql(t: &str, limit: usize) -> String {
    let columns = |prefix: &str| {
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
        .map(|c| format!("{prefix}{c}"))
        .join(", ")
    };
    let m_all = columns("m.");
    format!(
        "WITH pending AS ( \
           SELECT id, available_at, created_at, seq, attempts >= max_attempts AS abandoned \
           FROM {t} WHERE status = 'pending' AND ordering_key IS NULL \
             AND queue = 'default' AND priority = 0 AND available_at <= $1 \
           ORDER BY available_at, created_at, seq LIMIT {limit} FOR UPDATE SKIP LOCKED), \
         expired AS ( \
           SELECT id, available_at, created_at, seq, attempts >= max_attempts AS abandoned \
           FROM {t} WHERE status = 'claimed' AND locked_until <= $1 \
           ORDER BY available_at, created_at, seq LIMIT {limit} FOR UPDATE SKIP LOCKED), \
         picked AS ( \
           SELECT * FROM pending UNION ALL SELECT * FROM expired \
           ORDER BY available_at, created_at, seq LIMIT {limit}), \
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
}

/// The store's fenced write. Binds seven arrays of equal length: `$1`
/// op, `$2` id, `$3` token, `$4` now, `$5` new `locked_until`, `$6` new
/// `available_at`, `$7` `last_error`; returns the ids it changed.
fn deliver_sql(t: &str) -> String {
    format!(
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
}

/// Raw SQL: claim 100 with the claim statement, mark them all
/// delivered in one fenced write, until every message is delivered.
async fn raw_sql(store: &PostgresOutbox, messages: u64) -> Duration {
    let lease = DrainConfig::default().lease;
    let pool = store.pool();
    let table = store.table().quoted();
    let claim: Arc<str> = claim_sql(&table, BASELINE_CLAIM).into();
    let settle: Arc<str> = deliver_sql(&table).into();
    let started = Instant::now();
    let mut delivered = 0;
    while delivered < messages {
        let now = SystemClock.now();
        let claimed: Vec<(bool, String, Option<String>)> =
            sqlx::query(AssertSqlSafe(claim.clone()))
                .bind(now)
                .bind(now + lease)
                .fetch_all(pool)
                .await
                .expect("claim")
                .iter()
                .map(|row| (row.get("abandoned"), row.get("id"), row.get("claim_token")))
                .collect();
        assert!(!claimed.is_empty(), "the store ran dry after {delivered}");
        let n = claimed.len();
        let (ids, tokens): (Vec<String>, Vec<String>) = claimed
            .into_iter()
            .map(|(abandoned, id, token)| {
                assert!(!abandoned, "no bench message runs out of attempts");
                (id, token.expect("a claimed row has a token"))
            })
            .unzip();
        let now = SystemClock.now();
        let settled: Vec<String> = sqlx::query_scalar(AssertSqlSafe(settle.clone()))
            .bind(vec!["deliver"; n])
            .bind(ids)
            .bind(tokens)
            .bind(vec![now; n])
            .bind(vec![None::<DateTime<Utc>>; n])
            .bind(vec![None::<DateTime<Utc>>; n])
            .bind(vec![None::<String>; n])
            .fetch_all(pool)
            .await
            .expect("settle");
        assert_eq!(settled.len(), n, "every claim settles");
        delivered += n as u64;
    }
    started.elapsed()
}
