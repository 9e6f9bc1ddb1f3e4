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
//! leaves the table to autovacuum. With `--delete-on-delivery` each message
//! is deleted by the write that settles it instead. With retention
//! working, the claim cost and the table size of the last rounds are those
//! of the first rounds after the horizon filled. `--messages` (a million by
//! default) is rounded down to whole rounds, and is at least 25 rounds.
//!
//! ```text
//! cargo run --release -p outbox-bench --bin retention_bench -- --store sqlite --messages 1000000
//! WITH_POSTGRES_DURABLE=1 scripts/with-postgres cargo run --release -p outbox-bench \
//!     --features postgres --bin retention_bench -- --store postgres --messages 1000000 \
//!     [--vacuum-after 0] [--delete-on-delivery]
//! ```
//!
//! Table size: `page_count * page_size` on SQLite (the file, free pages
//! included), `pg_total_relation_size` (table, indexes and TOAST) on
//! PostgreSQL.
//!
//! # Output
//!
//! A progress line on standard error every ten rounds; the last line of
//! standard output is one JSON object: `store`, `delivered`, `deleted`,
//! `claim_us_early` and `claim_us_late` (the median claim of 100 in a
//! round, averaged over ten rounds after the horizon filled and the last
//! ten), `claim_late_over_early`, `table_bytes_empty`, `table_bytes_early`,
//! `table_bytes_mid`, `table_bytes_late`, `table_late_over_early`,
//! `table_late_over_mid`, `vacuum_after`, `vacuums`, `vacuum_seconds`,
//! `delete_on_delivery`, `seconds`.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures_util::future::join_all;
use outbox::{
    MarkDelivered, MessageKind, MessageStatus, NewMessage, OutboxStore, Payload, PurgeBatch,
};
use outbox_bench::args::{Flags, refuse};
use outbox_bench::report::print_json;
use outbox_bench::stats::{mean, median, round};
use outbox_bench::store::{Fill, SQL_STORES, check, claim, fill};
use serde::Serialize;

/// Messages enqueued and delivered per round, in one transaction.
const ROUND: u64 = 10_000;
/// Messages a claim asks for.
const CLAIM: usize = 100;
/// Rows a retention batch deletes at most.
const RETENTION_BATCH: usize = 1_000;
/// Rounds of delivered rows kept behind the horizon.
const HORIZON_ROUNDS: usize = 5;
/// Rounds whose figures are averaged at each end of the run.
const WINDOW: usize = 10;

/// The command line.
#[derive(Clone, Copy)]
struct Settings {
    /// Messages delivered over the run.
    messages: u64,
    /// Deleted rows between two `vacuum` calls; 0 for none.
    vacuum_after: u64,
    /// Delete each message in the write that settles it, as
    /// `retention.delete_on_delivery` does, rather than keep five rounds.
    delete_on_delivery: bool,
}

fn parse_args(mut flags: Flags) -> Result<(String, Settings), String> {
    let mut store = "sqlite".to_owned();
    let mut settings = Settings {
        messages: 1_000_000,
        vacuum_after: outbox::RetentionConfig::default().vacuum_after,
        delete_on_delivery: false,
    };
    while let Some(flag) = flags.next_flag() {
        match flag.as_str() {
            "--store" => store = flags.value(&flag)?,
            "--messages" => {
                settings.messages = flags.value(&flag)?.parse().map_err(|_| {
                    "--messages takes a number of messages, such as 1000000".to_owned()
                })?
            }
            "--vacuum-after" => {
                settings.vacuum_after = flags.value(&flag)?.parse().map_err(|_| {
                    "--vacuum-after takes a number of deleted rows, such as 10000 (0: never)"
                        .to_owned()
                })?
            }
            "--delete-on-delivery" => settings.delete_on_delivery = true,
            "--help" | "-h" => {
                return Err(format!(
                    "usage: retention_bench [--store {}] [--messages N] [--vacuum-after N] \
                     [--delete-on-delivery]",
                    SQL_STORES.join("|")
                ));
            }
            other => return Err(format!("unknown argument {other:?}; see --help")),
        }
    }
    check(&store, SQL_STORES)?;
    Ok((store, settings))
}

fn message(i: u64, now: DateTime<Utc>) -> NewMessage {
    let payload = Payload::from_json(format!(r#"{{"order":{i}}}"#)).expect("valid JSON");
    NewMessage::new(MessageKind::Event, "order.placed", payload).at(now)
}

/// The JSON line.
#[derive(Serialize)]
struct Summary<'a> {
    store: &'a str,
    delivered: u64,
    deleted: u64,
    claim_us_early: f64,
    claim_us_late: f64,
    claim_late_over_early: f64,
    table_bytes_empty: u64,
    table_bytes_early: u64,
    table_bytes_mid: u64,
    table_bytes_late: u64,
    table_late_over_early: f64,
    table_late_over_mid: f64,
    vacuum_after: u64,
    vacuums: u32,
    vacuum_seconds: f64,
    delete_on_delivery: bool,
    seconds: f64,
}

/// Runs the rounds on `store`; `size` measures its table.
async fn run<S, F>(label: &str, store: S, size: impl Fn() -> F, settings: Settings)
where
    S: OutboxStore + Fill,
    F: Future<Output = u64>,
{
    let Settings {
        messages,
        vacuum_after,
        delete_on_delivery,
    } = settings;
    let rounds = ((messages / ROUND) as usize).max(2 * WINDOW + HORIZON_ROUNDS);
    let started = Instant::now();
    let mut claim_us = Vec::with_capacity(rounds);
    let mut sizes = Vec::with_capacity(rounds);
    let mut deleted_total = 0u64;
    let mut deleted_since_vacuum = 0u64;
    let mut vacuums = 0u32;
    let mut vacuum_seconds = 0.0;
    let size_empty = size().await;
    // The system clock: the PostgreSQL store stamps settlements with the
    // server's time, so a horizon on any other clock would match nothing.
    let mut round_started: Vec<DateTime<Utc>> = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let now = Utc::now();
        round_started.push(now);
        let first = round as u64 * ROUND;
        fill(&store, first..first + ROUND, ROUND, |i| message(i, now)).await;
        let mut timings = Vec::with_capacity(ROUND as usize / CLAIM);
        loop {
            let timer = Instant::now();
            let batch = store
                .claim_batch(claim(CLAIM, now, Duration::from_secs(30)))
                .await
                .expect("claim");
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
        if let Some(horizon) = round
            .checked_sub(HORIZON_ROUNDS - 1)
            .map(|r| round_started[r])
        {
            let deleted = purge(&store, horizon).await;
            deleted_total += deleted;
            deleted_since_vacuum += deleted;
            if vacuum_after > 0 && deleted_since_vacuum >= vacuum_after {
                let timer = Instant::now();
                store.vacuum().await.expect("vacuum");
                vacuum_seconds += timer.elapsed().as_secs_f64();
                vacuums += 1;
                deleted_since_vacuum = 0;
            }
        }
        claim_us.push(median(timings));
        sizes.push(size().await as f64);
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
    let early = HORIZON_ROUNDS + 1..HORIZON_ROUNDS + 1 + WINDOW;
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
    print_json(&Summary {
        store: label,
        delivered: rounds as u64 * ROUND,
        deleted: deleted_total,
        claim_us_early: round(claim_early, 1),
        claim_us_late: round(claim_late, 1),
        claim_late_over_early: round(claim_late / claim_early, 3),
        table_bytes_empty: size_empty,
        table_bytes_early: size_early.round() as u64,
        table_bytes_mid: size_mid.round() as u64,
        table_bytes_late: size_late.round() as u64,
        table_late_over_early: round(size_late / size_early, 3),
        table_late_over_mid: round(size_late / size_mid, 3),
        vacuum_after,
        vacuums,
        vacuum_seconds: round(vacuum_seconds, 1),
        delete_on_delivery,
        seconds: round(started.elapsed().as_secs_f64(), 1),
    });
}

/// Deletes what was delivered before `horizon` in batches, as a retention
/// run does, until a batch comes back short; the rows deleted.
async fn purge(store: &impl OutboxStore, horizon: DateTime<Utc>) -> u64 {
    let mut deleted = 0;
    loop {
        let done = store
            .purge_batch(PurgeBatch {
                status: MessageStatus::Delivered,
                older_than: horizon,
                limit: RETENTION_BATCH,
            })
            .await
            .expect("purge_batch");
        deleted += done;
        if done < RETENTION_BATCH as u64 {
            return deleted;
        }
    }
}

#[tokio::main]
async fn main() {
    let (store, settings) = parse_args(Flags::from_env()).unwrap_or_else(|message| refuse(message));
    match store.as_str() {
        #[cfg(feature = "sqlite")]
        "sqlite" => {
            use outbox_bench::store::sqlite::{TempDatabase, file_bytes};
            let database = TempDatabase::new("retention-bench");
            let store = database.open().await;
            run("sqlite", store.clone(), || file_bytes(&store), settings).await;
            store.pool().close().await;
        }
        #[cfg(feature = "postgres")]
        "postgres" => {
            use outbox_bench::store::postgres::{database_url, drop_tables, fresh, table_bytes};
            let url = database_url().unwrap_or_else(|message| refuse(message));
            let table = format!("retention_bench_{}", std::process::id());
            let options = sqlx::postgres::PgPoolOptions::new().max_connections(16);
            let store = fresh(&url, &table, options, false).await;
            run("postgres", store.clone(), || table_bytes(&store), settings).await;
            drop_tables(&url, &table).await;
        }
        _ => unreachable!("checked by parse_args"),
    }
}
