//! Retention keeps the table and the claim flat: delivers a stream of
//! messages with retention deleting delivered rows older than a horizon,
//! and prints the claim cost and the table size early and late in the run.
//!
//! Each round enqueues 10 000 messages, delivers them (claims of 100, each
//! message settled with `mark_delivered`), then runs retention as the
//! runtime does: `purge_batch` of at most 1 000 rows until a batch comes
//! back short, deleting what settled before the fifth-last round started, so
//! about 50 000 delivered rows are kept at any time. Like a retention run,
//! it then calls `vacuum` once `--vacuum-after` rows (default: the
//! runtime's, 10 000) were deleted since the last one; `--vacuum-after 0`
//! leaves the table to autovacuum. With retention working, the claim cost
//! and the table size of the last rounds are those of the first rounds
//! after the horizon filled.
//!
//! ```text
//! cargo run --release --example retention_bench -- --store sqlite --messages 1000000
//! WITH_POSTGRES_DURABLE=1 scripts/with-postgres cargo run --release --features postgres \
//!     --example retention_bench -- --store postgres --messages 1000000 \
//!     [--vacuum-after 0] [--delete-on-delivery]
//! ```
//!
//! Table size: `page_count * page_size` on SQLite (the file, free pages
//! included), `pg_total_relation_size` (table, indexes and TOAST) on
//! PostgreSQL. The last line of output is one JSON object with the figures.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures_util::future::{BoxFuture, join_all};
use outbox::{
    ClaimBatch, MarkDelivered, MessageKind, MessageStatus, NewMessage, OutboxStore, Payload,
    PurgeBatch,
};

const ROUND: usize = 10_000;
const CLAIM: usize = 100;
const RETENTION_BATCH: usize = 1_000;
const HORIZON_ROUNDS: i64 = 5;
/// Rounds whose figures are averaged at each end of the run.
const WINDOW: usize = 10;

fn message(i: usize, now: DateTime<Utc>) -> NewMessage {
    let payload = Payload::from_json(format!(r#"{{"order":{i}}}"#)).expect("valid JSON");
    NewMessage::new(MessageKind::Event, "order.placed", payload).at(now)
}

/// What differs between the stores: filling a round in transactions, and
/// measuring the table.
trait Table: Send + Sync {
    fn fill(&self, first: usize, now: DateTime<Utc>) -> BoxFuture<'_, ()>;
    fn size(&self) -> BoxFuture<'_, u64>;
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len() as f64
}

/// The command line.
#[derive(Clone, Copy)]
struct Settings {
    messages: usize,
    /// Deleted rows between two `vacuum` calls; 0 for none.
    vacuum_after: u64,
    /// Delete each message in the write that settles it, as
    /// `retention.delete_on_delivery` does, rather than keep five rounds.
    delete_on_delivery: bool,
}

async fn run<S: OutboxStore + Clone>(label: &str, store: S, table: &dyn Table, settings: Settings) {
    let Settings {
        messages,
        vacuum_after,
        delete_on_delivery,
    } = settings;
    let rounds = (messages / ROUND).max(2 * WINDOW + HORIZON_ROUNDS as usize);
    let started = Instant::now();
    let mut claim_us = Vec::with_capacity(rounds);
    let mut sizes = Vec::with_capacity(rounds);
    let mut deleted_total = 0u64;
    let mut deleted_since_vacuum = 0u64;
    let mut vacuums = 0u32;
    let mut vacuum_seconds = 0.0;
    let size_empty = table.size().await;
    // The system clock: the PostgreSQL store stamps settlements with the
    // server's time, so a horizon on any other clock would match nothing.
    let mut round_started: Vec<DateTime<Utc>> = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let now = Utc::now();
        round_started.push(now);
        table.fill(round * ROUND, now).await;
        let mut timings = Vec::with_capacity(ROUND / CLAIM);
        loop {
            let claim = ClaimBatch {
                on_dead_letter: Default::default(),
                limit: CLAIM,
                now,
                lease: Duration::from_secs(30),
                max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
            };
            let timer = Instant::now();
            let batch = store.claim_batch(claim).await.expect("claim");
            timings.push(timer.elapsed().as_secs_f64() * 1e6);
            if batch.claimed.is_empty() {
                break;
            }
            join_all(batch.claimed.iter().map(|m| {
                store.mark_delivered(MarkDelivered {
                    delete: delete_on_delivery,
                    id: m.id.clone(),
                    claim_token: m.claim_token.clone(),
                    now,
                })
            }))
            .await
            .into_iter()
            .collect::<outbox::Result<Vec<()>>>()
            .expect("mark_delivered");
            if delete_on_delivery {
                deleted_total += batch.claimed.len() as u64;
                deleted_since_vacuum += batch.claimed.len() as u64;
            }
        }
        // Keep the last HORIZON_ROUNDS rounds: delete what settled before
        // the oldest of them started.
        let Some(&horizon) = round
            .checked_sub(HORIZON_ROUNDS as usize - 1)
            .map(|r| &round_started[r])
        else {
            claim_us.push(median(timings));
            sizes.push(table.size().await as f64);
            continue;
        };
        loop {
            let done = store
                .purge_batch(PurgeBatch {
                    status: MessageStatus::Delivered,
                    older_than: horizon,
                    limit: RETENTION_BATCH,
                })
                .await
                .expect("purge_batch");
            deleted_total += done;
            deleted_since_vacuum += done;
            if done < RETENTION_BATCH as u64 {
                break;
            }
        }
        if vacuum_after > 0 && deleted_since_vacuum >= vacuum_after {
            let timer = Instant::now();
            store.vacuum().await.expect("vacuum");
            vacuum_seconds += timer.elapsed().as_secs_f64();
            vacuums += 1;
            deleted_since_vacuum = 0;
        }
        claim_us.push(median(timings));
        sizes.push(table.size().await as f64);
        if round % 10 == 9 {
            eprintln!(
                "{label}: round {} of {rounds}: claim of {CLAIM} {:.0} µs, table {:.1} MiB",
                round + 1,
                claim_us[round],
                sizes[round] / (1 << 20) as f64
            );
        }
    }
    // The first window starts once the horizon filled: from then on the
    // table holds the same number of rows.
    let early = HORIZON_ROUNDS as usize + 1..HORIZON_ROUNDS as usize + 1 + WINDOW;
    let late = rounds - WINDOW..rounds;
    // Halfway: a table that only grows keeps growing past it; one whose
    // size is set by how often vacuum reclaims space reads the same here
    // and late.
    let mid = rounds / 2 - WINDOW / 2..rounds / 2 - WINDOW / 2 + WINDOW;
    let size_mid = mean(&sizes[mid]);
    let claim_early = mean(&claim_us[early.clone()]);
    let claim_late = mean(&claim_us[late.clone()]);
    let size_early = mean(&sizes[early]);
    let size_late = mean(&sizes[late]);
    println!(
        "{{\"store\":\"{label}\",\"delivered\":{},\"deleted\":{deleted_total},\
         \"claim_us_early\":{claim_early:.1},\"claim_us_late\":{claim_late:.1},\
         \"claim_late_over_early\":{:.3},\"table_bytes_empty\":{size_empty},\
         \"table_bytes_early\":{size_early:.0},\"table_bytes_mid\":{size_mid:.0},\
         \"table_bytes_late\":{size_late:.0},\"table_late_over_early\":{:.3},\
         \"table_late_over_mid\":{:.3},\"vacuum_after\":{vacuum_after},\"vacuums\":{vacuums},\
         \"vacuum_seconds\":{vacuum_seconds:.1},\"delete_on_delivery\":{delete_on_delivery},\
         \"seconds\":{:.1}}}",
        rounds * ROUND,
        claim_late / claim_early,
        size_late / size_early,
        size_late / size_mid,
        started.elapsed().as_secs_f64()
    );
}

#[cfg(feature = "sqlite")]
mod sqlite {
    //! A fresh file in the temporary directory, removed afterwards.

    use std::path::PathBuf;

    use outbox::SqliteOutbox;

    use super::*;

    struct Sqlite(SqliteOutbox);

    impl Table for Sqlite {
        fn fill(&self, first: usize, now: DateTime<Utc>) -> BoxFuture<'_, ()> {
            Box::pin(async move {
                let mut tx = self.0.pool().begin().await.expect("begin");
                for i in first..first + ROUND {
                    self.0
                        .enqueue_in(&mut tx, message(i, now))
                        .await
                        .expect("enqueue");
                }
                tx.commit().await.expect("commit");
            })
        }

        fn size(&self) -> BoxFuture<'_, u64> {
            Box::pin(async move {
                let (pages, size): (i64, i64) = sqlx::query_as(
                    "SELECT (SELECT page_count FROM pragma_page_count()), \
                     (SELECT page_size FROM pragma_page_size())",
                )
                .fetch_one(self.0.pool())
                .await
                .expect("page count");
                (pages * size) as u64
            })
        }
    }

    pub(super) async fn main(settings: Settings) {
        let path =
            std::env::temp_dir().join(format!("outbox-retention-bench-{}.db", std::process::id()));
        let store = SqliteOutbox::connect(&format!("sqlite://{}", path.display()))
            .await
            .expect("open the bench database");
        run("sqlite", store.clone(), &Sqlite(store), settings).await;
        for suffix in ["", "-wal", "-shm"] {
            let mut name = path.clone().into_os_string();
            name.push(suffix);
            let _ = std::fs::remove_file(PathBuf::from(name));
        }
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    //! A fresh table in `DATABASE_URL`, dropped afterwards.

    use outbox::PostgresOutbox;
    use sqlx::AssertSqlSafe;
    use sqlx::postgres::PgPoolOptions;

    use super::*;

    struct Postgres(PostgresOutbox);

    impl Table for Postgres {
        fn fill(&self, first: usize, now: DateTime<Utc>) -> BoxFuture<'_, ()> {
            Box::pin(async move {
                let mut tx = self.0.pool().begin().await.expect("begin");
                for i in first..first + ROUND {
                    self.0
                        .enqueue_in(&mut tx, message(i, now))
                        .await
                        .expect("enqueue");
                }
                tx.commit().await.expect("commit");
            })
        }

        fn size(&self) -> BoxFuture<'_, u64> {
            Box::pin(async move {
                let size: i64 = sqlx::query_scalar("SELECT pg_total_relation_size($1::regclass)")
                    .bind(self.0.table().quoted())
                    .fetch_one(self.0.pool())
                    .await
                    .expect("table size");
                size as u64
            })
        }
    }

    async fn drop_table(store: &PostgresOutbox) {
        let table = store.table().to_string();
        let drop = format!(
            "DROP TABLE IF EXISTS \"{table}\", \"{table}_migrations\", \"{table}_drains\"; \
             DROP FUNCTION IF EXISTS \"{table}_wake\", \"{table}_claim_heads\", \"{table}_claim\", \"{table}_settle\""
        );
        sqlx::raw_sql(AssertSqlSafe(drop))
            .execute(store.pool())
            .await
            .expect("drop the bench table");
    }

    pub(super) async fn main(settings: Settings) {
        let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| {
            eprintln!(
                "--store postgres needs DATABASE_URL; run it under scripts/with-postgres \
                 for a throwaway cluster"
            );
            std::process::exit(2)
        });
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .connect(&url)
            .await
            .expect("connect to DATABASE_URL");
        let store = PostgresOutbox::builder(pool)
            .table(&format!("retention_bench_{}", std::process::id()))
            .expect("a valid table name")
            .notify(false)
            .build();
        drop_table(&store).await;
        store.setup().await.expect("create the bench table");
        run(
            "postgres",
            store.clone(),
            &Postgres(store.clone()),
            settings,
        )
        .await;
        drop_table(&store).await;
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let store = value("--store").unwrap_or_else(|| "sqlite".to_owned());
    let messages: usize = match value("--messages").map(|m| m.parse()) {
        None => 1_000_000,
        Some(Ok(m)) => m,
        Some(Err(_)) => {
            eprintln!("--messages takes a number of messages, such as 1000000");
            std::process::exit(2)
        }
    };
    let vacuum_after: u64 = match value("--vacuum-after").map(|v| v.parse()) {
        None => outbox::RetentionConfig::default().vacuum_after,
        Some(Ok(v)) => v,
        Some(Err(_)) => {
            eprintln!("--vacuum-after takes a number of deleted rows, such as 10000 (0: never)");
            std::process::exit(2)
        }
    };
    let settings = Settings {
        messages,
        vacuum_after,
        delete_on_delivery: args.iter().any(|a| a == "--delete-on-delivery"),
    };
    match store.as_str() {
        #[cfg(feature = "sqlite")]
        "sqlite" => sqlite::main(settings).await,
        #[cfg(feature = "postgres")]
        "postgres" => postgres::main(settings).await,
        other => {
            eprintln!(
                "--store {other} is not built in; use sqlite (default feature) or postgres \
                 (--features postgres)"
            );
            std::process::exit(2)
        }
    }
}
