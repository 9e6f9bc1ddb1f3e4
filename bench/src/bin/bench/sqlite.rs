//! The SQLite sides: a fresh database file each, the baseline raw SQL.

use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox::{Clock, DrainConfig, SqliteOutbox, SystemClock};
use outbox_bench::resources::with_cpu;
use outbox_bench::store::sqlite::TempDatabase;
use outbox_bench::store::{FILL_CHUNK, fill};
use sqlx::{AssertSqlSafe, Row};

use crate::sides::{RuntimeSettings, Side, drain_with_runtime, run_sides, ticks};

/// Rows per claim of the raw-SQL baseline.
const BASELINE_CLAIM: usize = 100;

/// A store on a fresh file, holding `messages` pending ticks.
async fn filled(database: &TempDatabase, messages: u64) -> SqliteOutbox {
    let store = database.open().await;
    fill(&store, 0..messages, FILL_CHUNK, ticks()).await;
    store
}

/// The runtime against [`raw_sql`], each on a database file of its own.
pub(crate) fn sides(settings: RuntimeSettings, run: (bool, bool)) -> (Option<Side>, Option<Side>) {
    let messages = settings.messages;
    run_sides(
        run,
        async {
            let database = TempDatabase::new("bench-baseline");
            let store = filled(&database, messages).await;
            let measured = with_cpu(raw_sql(&store, messages)).await;
            store.pool().close().await;
            Side::timed(measured)
        },
        async {
            let database = TempDatabase::new("bench-runtime");
            let store = filled(&database, messages).await;
            let pool = store.pool().clone();
            let measured = with_cpu(drain_with_runtime(store, settings)).await;
            pool.close().await;
            Side::timed(measured)
        },
    )
}

/// The store's claim, as it runs it for the bench's messages (one queue,
/// one priority, no ordering keys): pending rows in the order of the index
/// of keyless ones, which serves only a claim that names the queue and the
/// priority; the limit an expression so SQLite does not compile the
/// statement again each time it is bound. Binds: `?1` now and `?2`
/// lease end (µs since the epoch), `?3` limit.
fn claim_sql(t: &str) -> String {
    format!(
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
               WHERE status = 'pending' AND ordering_key IS NULL \
                 AND queue = 'default' AND priority = 0 AND available_at <= ?1 \
               ORDER BY available_at, created_at, seq LIMIT CAST(?3 AS INTEGER)) \
             UNION ALL \
             SELECT * FROM ( \
               SELECT seq, available_at, created_at FROM {t} \
               WHERE status = 'claimed' AND locked_until <= ?1 \
               ORDER BY available_at, created_at, seq LIMIT CAST(?3 AS INTEGER))) \
           ORDER BY available_at, created_at, seq LIMIT CAST(?3 AS INTEGER)) \
         RETURNING seq, id, kind, name, payload, trace, status, attempts, max_attempts, \
           available_at, claim_token, claimed_at, locked_until, last_error, created_at, \
           updated_at, delivered_at"
    )
}

/// The store's fenced write that marks a batch delivered. Binds: `?1` a
/// JSON array of `[id, token, now]` rows (`now` in µs); returns the ids
/// it changed.
fn deliver_sql(t: &str) -> String {
    format!(
        "UPDATE {t} AS m SET status = 'delivered', claim_token = NULL, claimed_at = NULL, \
           locked_until = NULL, delivered_at = v.now, updated_at = v.now \
         FROM (SELECT value ->> 0 AS id, value ->> 1 AS token, value ->> 2 AS now \
           FROM json_each(?1)) AS v \
         WHERE m.id = v.id AND +m.status = 'claimed' AND m.claim_token = v.token \
           AND +m.locked_until > v.now \
         RETURNING id"
    )
}

/// Raw SQL: claim 100 with the claim statement, mark them all
/// delivered in one fenced write, until every message is delivered.
async fn raw_sql(store: &SqliteOutbox, messages: u64) -> Duration {
    let lease = DrainConfig::default().lease;
    let pool = store.pool();
    let table = store.table().quoted();
    let claim: Arc<str> = claim_sql(&table).into();
    let settle: Arc<str> = deliver_sql(&table).into();
    let started = Instant::now();
    let mut delivered = 0;
    while delivered < messages {
        let now = SystemClock.now();
        let until = now + lease;
        // The store claims in a `BEGIN IMMEDIATE` transaction; one
        // statement in autocommit takes the same write lock up front.
        let claimed: Vec<(String, Option<String>)> = sqlx::query(AssertSqlSafe(claim.clone()))
            .bind(now.timestamp_micros())
            .bind(until.timestamp_micros())
            .bind(BASELINE_CLAIM as i64)
            .fetch_all(pool)
            .await
            .expect("claim")
            .iter()
            .map(|row| (row.get("id"), row.get("claim_token")))
            .collect();
        assert!(!claimed.is_empty(), "the store ran dry after {delivered}");
        let now = SystemClock.now().timestamp_micros();
        let rows: Vec<_> = claimed
            .iter()
            .map(|(id, token)| {
                let token = token.as_deref().expect("a claimed row has a token");
                serde_json::json!([id, token, now])
            })
            .collect();
        let settled: Vec<String> = sqlx::query_scalar(AssertSqlSafe(settle.clone()))
            .bind(serde_json::Value::Array(rows).to_string())
            .fetch_all(pool)
            .await
            .expect("settle");
        assert_eq!(settled.len(), claimed.len(), "every claim settles");
        delivered += settled.len() as u64;
    }
    started.elapsed()
}
