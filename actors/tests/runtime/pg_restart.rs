//! PostgreSQL restarted as a crash would (`pg_ctl restart -m immediate`)
//! in the middle of a drain: nothing is lost, no more messages are delivered
//! twice than were in flight, and the drain picks up again by itself.
//!
//! Needs a cluster it may restart: run it with `scripts/with-postgres
//! --restartable cargo test -p outbox-actors --features postgres --test
//! runtime pg_restart:: -- --nocapture`, which exports
//! `WITH_POSTGRES_RESTART`; without it the test says so and passes. A
//! restart drops every connection to the cluster, so it is not run beside
//! the other PostgreSQL tests. Real time; bounded to two minutes.

use std::collections::HashMap;
use std::str::FromStr;
use std::time::{Duration, Instant};

use outbox::{DrainConfig, PostgresOutbox};
use outbox_actors::Shutdown;
use sqlx::AssertSqlSafe;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use crate::sql_support::{coordinator, idle, ping, probe};

const MESSAGES: u64 = 20_000;
const CONCURRENCY: usize = 4;
/// Restart once this many messages were delivered.
const RESTART_AFTER: usize = 5_000;
/// The whole test, restart included.
const WHOLE_RUN: Duration = Duration::from_secs(120);
/// How soon after the server accepts connections deliveries must start again.
const RESUME_WITHIN: Duration = Duration::from_secs(5);

async fn pool(url: &str, application_name: &str) -> PgPool {
    let options = PgConnectOptions::from_str(url)
        .expect("DATABASE_URL is a PostgreSQL URL")
        .application_name(application_name);
    PgPoolOptions::new()
        .max_connections(10)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(options)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to DATABASE_URL: {e}"))
}

/// Rows of `table` not delivered yet.
async fn undelivered(pool: &PgPool, table: &str) -> Option<i64> {
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM {table} WHERE status <> 'delivered'"
    )))
    .fetch_one(pool)
    .await
    .ok()
}

#[actix_rt::test]
async fn a_crash_restart_mid_drain_loses_nothing_and_doubles_only_what_was_in_flight() {
    let Ok(restart) = std::env::var("WITH_POSTGRES_RESTART") else {
        println!(
            "pg_restart: skipped, WITH_POSTGRES_RESTART is not set. Run it with \
             `scripts/with-postgres --restartable cargo test -p outbox-actors --features \
             postgres --test runtime pg_restart:: -- --nocapture`"
        );
        return;
    };
    let url = std::env::var("DATABASE_URL").expect("with-postgres exports DATABASE_URL");
    let table = format!("restart_{}", uuid::Uuid::new_v4().simple());
    let pool = pool(&url, &table).await;
    let outbox = PostgresOutbox::builder(pool.clone())
        .table(&table)
        .unwrap()
        .build();
    outbox.setup().await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    for n in 0..MESSAGES {
        outbox.enqueue_in(&mut tx, ping(n)).await.unwrap();
    }
    tx.commit().await.unwrap();

    let (probe, mut reports) = probe();
    let config = DrainConfig {
        concurrency: CONCURRENCY,
        batch_size: 1_000,
        lease: Duration::from_secs(3),
        // A running worker: passes on a schedule, nothing sent by the test
        // once it started, so the drain resumes by itself or not at all.
        every: Some(Duration::from_millis(100)),
        ..DrainConfig::default()
    };
    let coordinator = coordinator(outbox.clone(), &probe, config, false);

    let began = Instant::now();
    let give_up = began + WHOLE_RUN;
    let mut runs: HashMap<String, u32> = HashMap::new();
    let mut restart_job = None;
    let mut restarted: Option<(Instant, Instant)> = None;
    let mut resumed: Option<Instant> = None;
    while runs.len() < MESSAGES as usize {
        let left = give_up.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "the drain did not finish within {WHOLE_RUN:?}: {} of {MESSAGES} delivered",
            runs.len()
        );
        tokio::select! {
            delivery = reports.finished.recv() => {
                let delivery = delivery.expect("the probe lives");
                if let Some((_, accepting)) = restarted
                    && delivery.started > accepting
                {
                    resumed.get_or_insert(delivery.started);
                }
                *runs.entry(delivery.id).or_default() += 1;
                if runs.len() >= RESTART_AFTER && restart_job.is_none() && restarted.is_none() {
                    let restart = restart.clone();
                    restart_job = Some(tokio::task::spawn_blocking(move || {
                        let started = Instant::now();
                        let status = std::process::Command::new(&restart)
                            .status()
                            .unwrap_or_else(|e| panic!("cannot run {restart}: {e}"));
                        assert!(status.success(), "{restart} failed: {status}");
                        (started, Instant::now())
                    }));
                }
            }
            done = async { restart_job.as_mut().expect("guarded").await }, if restart_job.is_some() => {
                restarted = Some(done.expect("the restart ran"));
                restart_job = None;
            }
            () = tokio::time::sleep(left) => {}
        }
    }
    let (restart_began, accepting) = restarted.expect("the server was restarted mid-drain");

    // Every message delivered; now let the store agree, and late duplicates
    // (a delivery whose acknowledgement was lost runs again after its lease)
    // show up before counting.
    loop {
        if undelivered(&pool, &table).await == Some(0) {
            break;
        }
        assert!(
            Instant::now() < give_up,
            "rows still not delivered after {WHOLE_RUN:?}"
        );
        // A poll of the database, which announces nothing.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    idle(&coordinator).await;
    for delivery in reports.finished_so_far() {
        *runs.entry(delivery.id).or_default() += 1;
    }
    let drained = began.elapsed();
    // Stop the worker and close the pool inside the runtime: connections
    // dropped after it would have nowhere to be closed.
    coordinator
        .send(Shutdown {
            grace: Duration::from_secs(1),
        })
        .await
        .unwrap();
    drop(outbox);
    pool.close().await;

    let delivered = runs.len() as u64;
    let lost = MESSAGES - delivered;
    let duplicates: u64 = runs.values().map(|&n| u64::from(n - 1)).sum();
    let most = runs.values().copied().max().unwrap_or(0);
    let resume = resumed.map(|at| at.duration_since(accepting));
    println!(
        "pg_restart: messages {MESSAGES}, concurrency {CONCURRENCY}, delivered {delivered}, \
         lost {lost}, duplicates {duplicates} (most runs of one message {most}), \
         restart took {} ms, deliveries resumed {} ms after the server accepted connections, \
         drain {:.1} s",
        accepting.duration_since(restart_began).as_millis(),
        resume.map_or_else(|| "never".to_owned(), |d| d.as_millis().to_string()),
        drained.as_secs_f64()
    );
    assert_eq!(lost, 0);
    assert!(
        duplicates <= 2 * CONCURRENCY as u64,
        "{duplicates} duplicates for a concurrency of {CONCURRENCY}"
    );
    let resume = resume.expect("deliveries resumed after the restart");
    assert!(
        resume <= RESUME_WITHIN,
        "deliveries resumed {resume:?} after the server accepted connections"
    );
}
