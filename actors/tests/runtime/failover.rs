//! PostgreSQL failing over to its standby in the middle of a drain, with
//! enqueues still arriving: the primary is stopped as a crash would stop it
//! (`pg_ctl stop -m immediate`), the synchronous standby is promoted, and
//! the proxy the application reaches the database through is repointed at
//! it, as an orchestrator does.
//!
//! What must hold: every enqueue either is acknowledged or fails with a
//! store error its caller sees; every acknowledged message is delivered (0
//! lost); no more messages run twice than were in flight when the primary
//! went away; and the drain carries on by itself once the new primary
//! answers. An enqueue that failed may still have committed (its connection
//! died after the commit reached the server): such messages are counted
//! apart, delivered or not, never as lost.
//!
//! Needs a primary it may fail over: run it with `scripts/with-postgres
//! --standby cargo test -p outbox-actors --features postgres --test runtime
//! failover:: -- --nocapture`, which puts HAProxy in front of a primary and
//! a synchronous standby and exports `WITH_POSTGRES_FAILOVER`; without it
//! the test says so and passes. Real time; bounded to five minutes.

use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::str::FromStr;
use std::time::{Duration, Instant};

use outbox::{DrainConfig, OutboxStore, PostgresOutbox};
use outbox_actors::Shutdown;
use sqlx::AssertSqlSafe;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use tokio::sync::watch;

use crate::sql_support::{coordinator, idle, ping, probe};

/// Enqueued before the drain starts.
const PRELOADED: u64 = 16_000;
/// Enqueued while it runs, by [`ENQUEUERS`] tasks taking turns.
const ARRIVING: u64 = 4_000;
const ENQUEUERS: u64 = 2;
/// How often each enqueuer enqueues: the arrivals outlast the failover.
const ENQUEUE_EVERY: Duration = Duration::from_millis(20);
const CONCURRENCY: usize = 4;
/// Fail over once this many messages were delivered.
const FAIL_OVER_AFTER: usize = 5_000;
/// The whole test, failover included: a loaded two-core machine drains
/// the lot in about a minute and a half.
const WHOLE_RUN: Duration = Duration::from_secs(300);
/// How soon after the new primary answers deliveries must start again.
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

/// What the application saw of its enqueues.
#[derive(Default)]
struct Enqueues {
    /// Acknowledged: these must be delivered.
    acknowledged: HashSet<String>,
    /// Failed with a store error: the caller knows, and may enqueue again.
    failed: HashSet<String>,
    /// Acknowledged after the new primary answered.
    acknowledged_after_failover: usize,
}

/// Enqueue `ARRIVING / ENQUEUERS` messages, one every [`ENQUEUE_EVERY`],
/// through the application's own pool. The last quarter waits for the
/// failover, so enqueues arrive on both sides of it whatever the machine's
/// speed.
async fn arrive(
    outbox: PostgresOutbox,
    first: u64,
    mut failed_over: watch::Receiver<bool>,
    into: Rc<std::cell::RefCell<Enqueues>>,
) {
    let share = ARRIVING / ENQUEUERS;
    let mut pace = tokio::time::interval(ENQUEUE_EVERY);
    for i in 0..share {
        if i == share - share / 4 {
            let _ = failed_over.wait_for(|done| *done).await;
        }
        pace.tick().await;
        let n = PRELOADED + first + i * ENQUEUERS;
        let id = format!("m{n:05}");
        let after = *failed_over.borrow();
        match outbox.enqueue(ping(n)).await {
            Ok(_) => {
                let mut seen = into.borrow_mut();
                seen.acknowledged.insert(id);
                if after {
                    seen.acknowledged_after_failover += 1;
                }
            }
            // The typed errors of a connection that died or a server that
            // does not answer: the caller is told, nothing is silent.
            Err(outbox::Error::Store { .. } | outbox::Error::Connect { .. }) => {
                into.borrow_mut().failed.insert(id);
            }
            Err(other) => panic!("enqueue {id} failed with an unexpected error: {other}"),
        }
    }
}

#[actix_rt::test]
async fn a_failover_mid_drain_loses_no_acknowledged_message() {
    let Ok(failover) = std::env::var("WITH_POSTGRES_FAILOVER") else {
        println!(
            "failover: skipped, WITH_POSTGRES_FAILOVER is not set. Run it with \
             `scripts/with-postgres --standby cargo test -p outbox-actors --features \
             postgres --test runtime failover:: -- --nocapture`"
        );
        return;
    };
    let url = std::env::var("DATABASE_URL").expect("with-postgres exports DATABASE_URL");
    let table = format!("failover_{}", uuid::Uuid::new_v4().simple());
    // A worker and an application, each with its pool, both through the proxy.
    let pool = pool(&url, &format!("{table}_drain")).await;
    let app_pool = self::pool(&url, &format!("{table}_app")).await;
    let outbox = PostgresOutbox::builder(pool.clone())
        .table(&table)
        .unwrap()
        .build();
    outbox.setup().await.unwrap();
    let app = PostgresOutbox::builder(app_pool.clone())
        .table(&table)
        .unwrap()
        .build();
    let mut tx = pool.begin().await.unwrap();
    for n in 0..PRELOADED {
        outbox.enqueue_in(&mut tx, ping(n)).await.unwrap();
    }
    tx.commit().await.unwrap();
    let enqueues = Rc::new(std::cell::RefCell::new(Enqueues::default()));
    enqueues
        .borrow_mut()
        .acknowledged
        .extend((0..PRELOADED).map(|n| format!("m{n:05}")));

    let (probe, mut reports) = probe();
    let config = DrainConfig {
        concurrency: CONCURRENCY,
        batch_size: 1_000,
        lease: Duration::from_secs(3),
        // A running worker: passes on a schedule and on wake-ups, nothing
        // sent by the test, so the drain resumes by itself or not at all.
        every: Some(Duration::from_millis(100)),
        // Nothing claimed ahead, so the bound below is the tightest one.
        prefetch: Some(0),
        ..DrainConfig::default()
    };
    // Handlers running and deliveries settling behind them: the messages
    // whose outcome a failover can lose.
    let bound = 2 * config.concurrency as u64;
    let coordinator = coordinator(outbox.clone(), &probe, config, true);

    let (failed_over_tx, failed_over) = watch::channel(false);
    let arrivals: Vec<_> = (0..ENQUEUERS)
        .map(|first| {
            actix_rt::spawn(arrive(
                app.clone(),
                first,
                failed_over.clone(),
                Rc::clone(&enqueues),
            ))
        })
        .collect();

    let began = Instant::now();
    let give_up = began + WHOLE_RUN;
    let mut runs: HashMap<String, u32> = HashMap::new();
    let mut failover_job = None;
    let mut failed: Option<(Instant, Instant)> = None;
    let mut resumed: Option<Instant> = None;
    let all_delivered = |runs: &HashMap<String, u32>, enqueues: &Enqueues| {
        enqueues.acknowledged.iter().all(|id| runs.contains_key(id))
    };
    while !(arrivals.iter().all(|arrival| arrival.is_finished())
        && all_delivered(&runs, &enqueues.borrow()))
    {
        assert!(
            Instant::now() < give_up,
            "the drain did not finish within {WHOLE_RUN:?}: {} delivered, {} acknowledged",
            runs.len(),
            enqueues.borrow().acknowledged.len()
        );
        tokio::select! {
            delivery = reports.finished.recv() => {
                let delivery = delivery.expect("the probe lives");
                if let Some((_, answering)) = failed
                    && delivery.started > answering
                {
                    resumed.get_or_insert(delivery.started);
                }
                *runs.entry(delivery.id).or_default() += 1;
                if runs.len() >= FAIL_OVER_AFTER && failover_job.is_none() && failed.is_none() {
                    let failover = failover.clone();
                    failover_job = Some(tokio::task::spawn_blocking(move || {
                        let started = Instant::now();
                        let status = std::process::Command::new(&failover)
                            .status()
                            .unwrap_or_else(|e| panic!("cannot run {failover}: {e}"));
                        assert!(status.success(), "{failover} failed: {status}");
                        (started, Instant::now())
                    }));
                }
            }
            done = async { failover_job.as_mut().expect("guarded").await }, if failover_job.is_some() => {
                failed = Some(done.expect("the failover ran"));
                failover_job = None;
                failed_over_tx.send_replace(true);
            }
            // Checks the loop's bound and the arrivals, which announce
            // nothing, when no delivery does.
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
    for arrival in arrivals {
        arrival.await.expect("an enqueuer panicked");
    }
    let (stopped, answering) = failed.expect("the primary failed over mid-drain");

    // Every acknowledged message delivered; now let the store agree (the
    // failed enqueues that committed all the same are delivered too), and
    // late duplicates (a delivery whose settlement the old primary took to
    // its grave runs again after its lease) show up before counting.
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
    // Stop the worker and close the pools inside the runtime: connections
    // dropped after it would have nowhere to be closed.
    coordinator
        .send(Shutdown {
            grace: Duration::from_secs(1),
        })
        .await
        .unwrap();
    drop((outbox, app));
    pool.close().await;
    app_pool.close().await;

    let enqueues = enqueues.borrow();
    let acknowledged = enqueues.acknowledged.len();
    let lost = enqueues
        .acknowledged
        .iter()
        .filter(|id| !runs.contains_key(*id))
        .count();
    let failed_delivered = enqueues
        .failed
        .iter()
        .filter(|id| runs.contains_key(*id))
        .count();
    let duplicates: u64 = runs.values().map(|&n| u64::from(n - 1)).sum();
    let most = runs.values().copied().max().unwrap_or(0);
    let resume = resumed.map(|at| at.duration_since(answering));
    let outage = resumed.map(|at| at.duration_since(stopped));
    println!(
        "failover: {acknowledged} messages, lost {lost}, duplicates {duplicates} (bound {bound}), \
         resumed after {} s",
        outage.map_or_else(|| "never".to_owned(), |d| format!("{:.1}", d.as_secs_f64()))
    );
    println!(
        "failover details: preloaded {PRELOADED}, arriving {ARRIVING} of which acknowledged {} \
         ({} after the failover) and failed with a store error {} (delivered all the same {}), \
         concurrency {CONCURRENCY}, most runs of one message {most}, the new primary answered \
         {} ms after the old one stopped, deliveries resumed {} ms after that, drain {:.1} s",
        acknowledged as u64 - PRELOADED,
        enqueues.acknowledged_after_failover,
        enqueues.failed.len(),
        failed_delivered,
        answering.duration_since(stopped).as_millis(),
        resume.map_or_else(|| "never".to_owned(), |d| d.as_millis().to_string()),
        drained.as_secs_f64()
    );
    assert_eq!(lost, 0, "acknowledged messages were never delivered");
    assert!(
        duplicates <= bound,
        "{duplicates} duplicates, above the {bound} deliveries in flight"
    );
    assert!(
        enqueues.acknowledged_after_failover > 0,
        "enqueues went on after the failover"
    );
    let resume = resume.expect("deliveries resumed after the failover");
    assert!(
        resume <= RESUME_WITHIN,
        "deliveries resumed {resume:?} after the new primary answered"
    );
}
