//! The actor runtime end to end on PostgreSQL: transactional enqueue,
//! wake-ups by `LISTEN`/`NOTIFY` (and their reconnection), four workers on
//! one table, two workers whose clocks disagree by more than a lease, and
//! connections killed in the middle of a pass.
//!
//! Run with `scripts/with-postgres cargo test -p outbox-actors --features
//! postgres --test runtime postgres::`; without `DATABASE_URL` every test fails and says so.
//! Each test uses tables and connection names of its own, so they run in
//! parallel against one database. Real time and the system clock; see
//! `sql_support`.

use std::collections::{HashMap, HashSet};
use std::str::FromStr;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use outbox::{
    Clock, DrainConfig, MessageStatus, OutboxAdmin, OutboxStore, PostgresOutbox, SystemClock,
};
use outbox_actors::{CoordinatorStatus, Drain, DrainReport, Error, OutcomeNotice};
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Row};

use crate::sql_support::{
    self, BOUND, Delivery, Notices, OrderPlaced, assert_accounts_for_every_claim, coordinator,
    eventually, held_ping, idle, ping, probe, status, within,
};

fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| {
        panic!(
            "DATABASE_URL is not set. The PostgreSQL tests need a server: run them with \
             `scripts/with-postgres cargo test -p outbox-actors --features postgres --test runtime postgres::`"
        )
    })
}

/// A short random suffix, so parallel tests use tables of their own.
fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}

/// A pool whose connections carry `application_name`, so a test can find
/// (and kill) them; the store's wake-up listener carries it too.
async fn pool_named(application_name: &str, max_connections: u32) -> PgPool {
    let options = PgConnectOptions::from_str(&database_url())
        .expect("DATABASE_URL is a PostgreSQL URL")
        .application_name(application_name);
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(options)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to DATABASE_URL: {e}"))
}

/// The store on table `name`, its pool's connections named `name` too.
async fn store(name: &str) -> (PgPool, PostgresOutbox) {
    let pool = pool_named(name, 10).await;
    let outbox = PostgresOutbox::builder(pool.clone())
        .table(name)
        .unwrap()
        .build();
    outbox.setup().await.unwrap();
    (pool, outbox)
}

/// Backends of `application_name` (other than the asking one) matching `filter`.
async fn backends(admin: &PgPool, application_name: &str, filter: &str) -> Vec<i32> {
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT pid FROM pg_stat_activity \
         WHERE application_name = $1 AND pid <> pg_backend_pid() AND {filter}"
    )))
    .bind(application_name)
    .fetch_all(admin)
    .await
    .unwrap()
}

async fn terminate(admin: &PgPool, pids: &[i32]) {
    for pid in pids {
        sqlx::query("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .execute(admin)
            .await
            .unwrap();
    }
}

const LISTENING: &str =
    "(query LIKE 'LISTEN%' OR (query LIKE 'SELECT setval(%' AND query LIKE '%served%'))";

/// Rolled back, the order and its event are both gone and a `Drain` finds
/// nothing; committed, both are there and the next `Drain` delivers the event.
#[actix_rt::test]
async fn transactional_enqueue_through_the_runtime() {
    let name = unique("tx");
    let (pool, outbox) = store(&name).await;
    let orders = unique("orders");
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {orders} (id bigint PRIMARY KEY)"
    )))
    .execute(&pool)
    .await
    .unwrap();
    let (probe, mut reports) = probe();
    let coordinator = coordinator(outbox.clone(), &probe, DrainConfig::default(), false);
    let count = |sql: String| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql))
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };

    let mut tx = pool.begin().await.unwrap();
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {orders} (id) VALUES (1)"
    )))
    .execute(&mut *tx)
    .await
    .unwrap();
    outbox
        .enqueue_event_in(&mut tx, &OrderPlaced { order_id: 1 })
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let report = coordinator.send(Drain).await.unwrap().unwrap();
    assert_eq!((report.claimed, report.delivered), (0, 0), "{report}");
    assert_eq!(count(format!("SELECT count(*) FROM {orders}")).await, 0);
    assert_eq!(count(format!("SELECT count(*) FROM {name}")).await, 0);

    let mut tx = pool.begin().await.unwrap();
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {orders} (id) VALUES (2)"
    )))
    .execute(&mut *tx)
    .await
    .unwrap();
    let id = outbox
        .enqueue_event_in(&mut tx, &OrderPlaced { order_id: 2 })
        .await
        .unwrap()
        .into_id();
    tx.commit().await.unwrap();
    let report = coordinator.send(Drain).await.unwrap().unwrap();
    assert_eq!((report.claimed, report.delivered), (1, 1), "{report}");
    assert_eq!(reports.finished(1).await[0].id, id);
    assert_eq!(
        count(format!("SELECT count(*) FROM {orders} WHERE id = 2")).await,
        1
    );
    let message = outbox.get_message(&id).await.unwrap();
    assert_eq!(message.status, MessageStatus::Delivered);
    assert_eq!(message.payload.to_value()["order_id"], 2);
}

/// A starting coordinator opens the connections its claims and settlements
/// will use and runs a claim and a settlement of nothing on each, so the
/// first messages do not wait while each new connection compiles the
/// table's functions and plans their statements.
#[actix_rt::test]
async fn a_starting_coordinator_prepares_the_connections_it_will_use() {
    let name = unique("warm");
    let pool = pool_named(&name, 10).await;
    let outbox = PostgresOutbox::builder(pool.clone())
        .table(&name)
        .unwrap()
        .settlement_statements(3)
        .unwrap()
        .build();
    outbox.setup().await.unwrap();
    let admin = pool_named("warm-admin", 1).await;
    let (probe, _reports) = probe();
    let config = DrainConfig {
        claims_in_flight: Some(2),
        ..DrainConfig::default()
    };
    let _coordinator = coordinator(outbox.clone(), &probe, config, false);
    // Each warmed connection's last statement is the settlement of nothing.
    let settled_nothing = format!("query LIKE 'SELECT * FROM \"{name}_settle\"(%'");
    eventually(
        "two claims' and three settlements' connections are prepared",
        || {
            let (admin, name, filter) = (admin.clone(), name.clone(), settled_nothing.clone());
            async move { backends(&admin, &name, &filter).await.len() == 5 }
        },
    )
    .await;
}

/// With no schedule and no `Drain`, a commit starts a pass; a rollback
/// notifies nobody and starts none; a burst of commits during a pass
/// becomes one follow-up pass.
#[actix_rt::test]
async fn commits_wake_the_coordinator_and_bursts_are_coalesced() {
    let name = unique("wake");
    let (pool, outbox) = store(&name).await;
    let (probe, mut reports) = probe();
    let coordinator = coordinator(outbox.clone(), &probe, DrainConfig::default(), true);
    // Once listening, the store wakes once (notifications sent before were
    // missed): wait for that empty pass.
    eventually("the first pass after listening", || async {
        status(&coordinator).await.passes >= 1
    })
    .await;
    idle(&coordinator).await;

    let mut tx = pool.begin().await.unwrap();
    let id = outbox.enqueue_in(&mut tx, ping(1)).await.unwrap().into_id();
    tx.commit().await.unwrap();
    assert_eq!(reports.finished(1).await[0].id, id);
    // Armed, so no pass that polls for an arming falls among those counted.
    idle(&coordinator).await;
    armed(&pool, &name).await;
    let before = idle(&coordinator).await;

    // Rolled back: a listener of the test's own hears nothing before a
    // marker sent afterwards, and the marker's pass finds nothing.
    let mut listener = PgListener::connect(&database_url()).await.unwrap();
    listener.listen(outbox.channel()).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    outbox.enqueue_in(&mut tx, ping(2)).await.unwrap();
    tx.rollback().await.unwrap();
    sqlx::query("SELECT pg_notify($1, 'marker')")
        .bind(outbox.channel())
        .execute(&pool)
        .await
        .unwrap();
    let heard = within("the marker arrives", BOUND, listener.recv()).await;
    assert_eq!(heard.unwrap().payload(), "marker", "a rollback notified");
    eventually("the marker's pass", || async {
        status(&coordinator).await.passes > before.passes
    })
    .await;
    let after = idle(&coordinator).await;
    assert_eq!(after.passes, before.passes + 1, "{after:?}");
    assert_eq!(after.last_report.unwrap().claimed, 0);

    // A burst of commits while a pass is busy with a held message.
    let burst = 50;
    let mut tx = pool.begin().await.unwrap();
    outbox.enqueue_in(&mut tx, held_ping(100)).await.unwrap();
    tx.commit().await.unwrap();
    reports.started(1).await;
    for n in 0..burst {
        let mut tx = pool.begin().await.unwrap();
        outbox.enqueue_in(&mut tx, ping(200 + n)).await.unwrap();
        tx.commit().await.unwrap();
    }
    reports.open_gate();
    reports.finished(1 + burst as usize).await;
    let end = idle(&coordinator).await;
    let passes = end.passes - after.passes;
    println!("{burst} commits during a pass took {passes} passes");
    assert!(passes <= 3, "{burst} commits took {passes} passes: {end:?}");
    assert_eq!(end.totals.delivered, 2 + burst);
    assert!(reports.finished_so_far().is_empty());
    let stats = outbox.stats(SystemClock.now()).await.unwrap();
    assert_eq!((stats.delivered, stats.total()), (2 + burst, 2 + burst));
}

/// The listener's backend is terminated: the store reconnects, wakes once,
/// and committed messages are still delivered without any `Drain`.
#[actix_rt::test]
async fn the_wake_up_listener_reconnects_after_its_backend_is_killed() {
    let name = unique("relisten");
    let (pool, outbox) = store(&name).await;
    let admin = pool_named(&unique("admin"), 2).await;
    let (probe, mut reports) = probe();
    let coordinator = coordinator(outbox.clone(), &probe, DrainConfig::default(), true);
    eventually("the store listens", || async {
        backends(&admin, &name, LISTENING).await.len() == 1
    })
    .await;
    let killed = backends(&admin, &name, LISTENING).await;
    terminate(&admin, &killed).await;

    // Committed while the listener may still be down: the wake-up after it
    // reconnects finds the message.
    let mut tx = pool.begin().await.unwrap();
    let first = outbox.enqueue_in(&mut tx, ping(1)).await.unwrap().into_id();
    tx.commit().await.unwrap();
    assert_eq!(reports.finished(1).await[0].id, first);

    // Listening again on a new backend, it hears the next commit.
    eventually("the store listens again", || async {
        let listening = backends(&admin, &name, LISTENING).await;
        listening.len() == 1 && listening != killed
    })
    .await;
    let mut tx = pool.begin().await.unwrap();
    let second = outbox.enqueue_in(&mut tx, ping(2)).await.unwrap().into_id();
    tx.commit().await.unwrap();
    assert_eq!(reports.finished(1).await[0].id, second);
    let end = idle(&coordinator).await;
    assert_eq!(end.totals.delivered, 2, "{end:?}");
}

/// Wait until a drain on table `name` is armed. The coordinator can read
/// idle while its drain is not armed yet (a pass that could not arm polls
/// again a moment later); an enqueue then finds no drain waiting and rightly
/// sends no `NOTIFY`, so a test that counts them waits for the arming
/// itself.
async fn armed(pool: &PgPool, name: &str) {
    eventually("the drain is armed", || async {
        // An arming is live and no wake-up has served it yet.
        sqlx::query_scalar::<_, bool>(AssertSqlSafe(format!(
            "SELECT coalesce(pg_sequence_last_value('\"{name}_armed\"'), 0) \
               > greatest(coalesce(pg_sequence_last_value('\"{name}_served\"'), 0), \
                 (date_part('epoch', clock_timestamp()) * 1000)::int8)"
        )))
        .fetch_one(pool)
        .await
        .unwrap()
    })
    .await;
}

/// Wait until the last wake-up on table `name` is recorded as served by
/// the store's listener: until then, commits go on notifying.
async fn served(pool: &PgPool, name: &str) {
    eventually("the wake-up is recorded as served", || async {
        sqlx::query_scalar::<_, bool>(AssertSqlSafe(format!(
            "SELECT coalesce(pg_sequence_last_value('\"{name}_armed\"'), 0) \
               <= coalesce(pg_sequence_last_value('\"{name}_served\"'), 0)"
        )))
        .fetch_one(pool)
        .await
        .unwrap()
    })
    .await;
}

/// What a listener of the test's own heard up to a marker sent now.
async fn heard_until_marker(listener: &mut PgListener, pool: &PgPool, channel: &str) -> usize {
    sqlx::query("SELECT pg_notify($1, 'marker')")
        .bind(channel)
        .execute(pool)
        .await
        .unwrap();
    let mut heard = 0;
    loop {
        let notification = within("the marker arrives", BOUND, listener.recv()).await;
        if notification.unwrap().payload() == "marker" {
            return heard;
        }
        heard += 1;
    }
}

/// A drain whose next tick is an hour away is woken by a commit; while
/// its pass is busy, fifty more commits send one `NOTIFY` between them, not
/// one each (each would serialize its commit behind the others'), once the
/// store's listener heard the first, and are all delivered.
#[actix_rt::test]
async fn an_idle_drain_is_woken_and_a_busy_one_is_not_notified_per_enqueue() {
    let name = unique("armed");
    let (pool, outbox) = store(&name).await;
    let (probe, mut reports) = probe();
    let config = DrainConfig {
        every: Some(Duration::from_secs(3600)),
        ..DrainConfig::default()
    };
    let coordinator = coordinator(outbox.clone(), &probe, config, true);
    eventually("the first pass after listening", || async {
        status(&coordinator).await.passes >= 1
    })
    .await;
    idle(&coordinator).await;
    armed(&pool, &name).await;
    let mut listener = PgListener::connect(&database_url()).await.unwrap();
    listener.listen(outbox.channel()).await.unwrap();

    let id = outbox.enqueue(held_ping(1)).await.unwrap().into_id();
    assert_eq!(reports.started(1).await, [id]);
    assert_eq!(
        heard_until_marker(&mut listener, &pool, outbox.channel()).await,
        1
    );

    // The pass armed again as it started: the first commit of the burst
    // notifies, and once the store's listener heard it (a moment later,
    // during which commits go on notifying) the others do not.
    let burst = 50;
    outbox.enqueue(ping(100)).await.unwrap();
    served(&pool, &name).await;
    for n in 1..burst {
        outbox.enqueue(ping(100 + n)).await.unwrap();
    }
    let heard = heard_until_marker(&mut listener, &pool, outbox.channel()).await;
    assert_eq!(
        heard, 1,
        "{burst} enqueues during a pass sent {heard} NOTIFYs"
    );
    reports.open_gate();
    reports.finished(1 + burst as usize).await;
    let end = idle(&coordinator).await;
    assert_eq!(end.totals.delivered, 1 + burst, "{end:?}");
}

/// An enqueue is between its insert and its commit while the drain ends a
/// pass: the drain cannot arm, so the enqueue sends no `NOTIFY`, yet the
/// message is delivered (the drain claims again shortly until it can arm),
/// and once armed the drain is woken by the next commit again.
#[actix_rt::test]
async fn an_enqueue_committing_while_the_drain_goes_idle_is_not_lost() {
    let name = unique("race");
    let (pool, outbox) = store(&name).await;
    let mut listener = PgListener::connect(&database_url()).await.unwrap();
    listener.listen(outbox.channel()).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    let first = outbox.enqueue_in(&mut tx, ping(1)).await.unwrap().into_id();

    let (probe, mut reports) = probe();
    let coordinator = coordinator(outbox.clone(), &probe, DrainConfig::default(), true);
    // Passes that found nothing, each unable to arm.
    eventually("a few passes", || async {
        status(&coordinator).await.passes >= 3
    })
    .await;
    tx.commit().await.unwrap();
    assert_eq!(reports.finished(1).await[0].id, first);
    assert_eq!(
        heard_until_marker(&mut listener, &pool, outbox.channel()).await,
        0
    );

    // Armed once nothing is in flight: the next commit wakes it.
    idle(&coordinator).await;
    armed(&pool, &name).await;
    let second = outbox.enqueue(ping(2)).await.unwrap().into_id();
    assert_eq!(reports.finished(1).await[0].id, second);
    assert_eq!(
        heard_until_marker(&mut listener, &pool, outbox.channel()).await,
        1
    );
    idle(&coordinator).await;
}

/// Two drains in two processes (stores with pools and listeners of their
/// own) on one table share one flag: a commit while both wait wakes both
/// (the `NOTIFY` reaches every listener, and each arms again before its
/// next claim), and every message of a stream of commits is delivered
/// without a schedule, whichever drain was busy.
#[actix_rt::test]
async fn drains_sharing_a_table_are_all_woken() {
    let name = unique("shared");
    let (_, first) = store(&name).await;
    let second = PostgresOutbox::builder(pool_named(&name, 4).await)
        .table(&name)
        .unwrap()
        .build();
    let (probe, mut reports) = probe();
    let a = coordinator(
        first.clone(),
        &probe.for_worker(0),
        DrainConfig::default(),
        true,
    );
    let b = coordinator(second, &probe.for_worker(1), DrainConfig::default(), true);
    for coordinator in [&a, &b] {
        eventually("the first pass after listening", || async {
            status(coordinator).await.passes >= 1
        })
        .await;
    }
    let (before_a, before_b) = (idle(&a).await, idle(&b).await);
    first.enqueue(ping(1)).await.unwrap();
    reports.finished(1).await;
    eventually("both drains woke", || async {
        status(&a).await.passes > before_a.passes && status(&b).await.passes > before_b.passes
    })
    .await;

    let messages = 100;
    for n in 0..messages {
        first.enqueue(ping(100 + n)).await.unwrap();
        if n % 10 == 0 {
            // Let a pass or two end between some of them.
            reports.finished(1).await;
        }
    }
    reports.finished(messages as usize - 10).await;
    let (a, b) = (idle(&a).await, idle(&b).await);
    assert_eq!(a.totals.delivered + b.totals.delivered, 1 + messages);
}

/// Four coordinators, each in its own actix system on its own thread with
/// its own pool, drain one table. Leases outlast the test, so every message
/// must be delivered exactly once: never twice, never by two workers at once.
#[test]
fn four_workers_deliver_every_message_exactly_once() {
    const MESSAGES: u64 = 20_000;
    const WORKERS: usize = 4;
    let name = unique("workers");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let started = Instant::now();
    let (admin, outbox) = runtime.block_on(store(&name));
    // A few big transactions, in parallel.
    runtime.block_on(async {
        let chunks = (0..WORKERS as u64).map(|chunk| {
            let (pool, outbox) = (admin.clone(), outbox.clone());
            tokio::spawn(async move {
                let mut tx = pool.begin().await.unwrap();
                let per_chunk = MESSAGES / WORKERS as u64;
                for n in chunk * per_chunk..(chunk + 1) * per_chunk {
                    outbox.enqueue_in(&mut tx, ping(n)).await.unwrap();
                }
                tx.commit().await.unwrap();
            })
        });
        for chunk in chunks.collect::<Vec<_>>() {
            chunk.await.unwrap();
        }
    });
    let enqueued = started.elapsed();

    let (probe, mut reports) = probe();
    let ready = Arc::new(Barrier::new(WORKERS));
    let drained = Instant::now();
    let workers: Vec<_> = (0..WORKERS)
        .map(|worker| {
            let (name, probe, ready) = (name.clone(), probe.for_worker(worker), ready.clone());
            std::thread::spawn(move || {
                actix_rt::System::new().block_on(drain_as_worker(worker, name, probe, ready))
            })
        })
        .collect();
    let statuses: Vec<CoordinatorStatus> = workers
        .into_iter()
        .map(|worker| worker.join().expect("a worker panicked"))
        .collect();
    let drained = drained.elapsed();

    let mut deliveries = reports.finished_so_far();
    let shares: Vec<u64> = statuses.iter().map(|s| s.totals.delivered).collect();
    println!(
        "enqueued {MESSAGES} in {enqueued:?}, drained in {drained:?}; shares {shares:?}, \
         passes {:?}",
        statuses.iter().map(|s| s.passes).collect::<Vec<_>>()
    );
    let totals = statuses.iter().fold(DrainReport::default(), |mut sum, s| {
        add(&mut sum, &s.totals);
        sum
    });
    assert_eq!(
        (totals.claimed, totals.delivered),
        (MESSAGES, MESSAGES),
        "{totals}"
    );
    assert_eq!(
        totals.retried + totals.dead_lettered + totals.settlement_failed + totals.lease_lost,
        0,
        "{totals}"
    );
    for (worker, share) in shares.iter().enumerate() {
        assert!(*share > 0, "worker {worker} delivered nothing: {shares:?}");
    }
    for (worker, status) in statuses.iter().enumerate() {
        let reported = deliveries.iter().filter(|d| d.worker == worker).count() as u64;
        assert_eq!(reported, status.totals.delivered, "worker {worker}");
    }

    // Every message ran once, on attempt 1, and no two runs of one overlap.
    assert_eq!(deliveries.len() as u64, MESSAGES);
    deliveries.sort_by(|a, b| (&a.id, a.started).cmp(&(&b.id, b.started)));
    let twice: Vec<&[Delivery]> = deliveries
        .chunk_by(|a, b| a.id == b.id)
        .filter(|runs| runs.len() > 1)
        .collect();
    let overlapping = twice
        .iter()
        .filter(|runs| runs.windows(2).any(|w| w[1].started < w[0].finished))
        .count();
    assert_eq!(overlapping, 0, "deliveries of one message overlapped");
    assert!(
        twice.is_empty(),
        "delivered more than once: {:?}",
        &twice[..1]
    );
    assert!(deliveries.iter().all(|d| d.attempt == 1));
    let ids: HashSet<&str> = deliveries.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids.len() as u64, MESSAGES);

    let (delivered_once, rows): (i64, i64) = runtime.block_on(async {
        let row = sqlx::query(AssertSqlSafe(format!(
            "SELECT count(*) FILTER (WHERE status = 'delivered' AND attempts = 1), count(*) \
             FROM {name}"
        )))
        .fetch_one(&admin)
        .await
        .unwrap();
        (row.get(0), row.get(1))
    });
    assert_eq!((delivered_once, rows), (MESSAGES as i64, MESSAGES as i64));
}

/// One worker of [`four_workers_deliver_every_message_exactly_once`]: drain
/// until a pass claims nothing and nothing is pending (messages other
/// workers hold are theirs to finish).
async fn drain_as_worker(
    worker: usize,
    table: String,
    probe: sql_support::Probe,
    ready: Arc<Barrier>,
) -> CoordinatorStatus {
    let pool = pool_named(&format!("{table}-w{worker}"), 8).await;
    let outbox = PostgresOutbox::builder(pool).table(&table).unwrap().build();
    let config = DrainConfig {
        batch_size: 1_000,
        concurrency: 32,
        lease: Duration::from_secs(300),
        // One claim at a time in the first worker, up to four in the last:
        // a worker's own claims compete for rows as other workers' do.
        claims_in_flight: Some(1 + worker),
        ..DrainConfig::default()
    };
    let coordinator = coordinator(outbox.clone(), &probe, config, false);
    status(&coordinator).await;
    // Start together, so the workers compete for the same rows.
    ready.wait();
    let give_up = Instant::now() + Duration::from_secs(120);
    loop {
        assert!(Instant::now() < give_up, "worker {worker} never finished");
        let report = coordinator.send(Drain).await.unwrap().unwrap();
        if report.claimed == 0 && outbox.stats(SystemClock.now()).await.unwrap().pending == 0 {
            break;
        }
    }
    status(&coordinator).await
}

fn add(sum: &mut DrainReport, pass: &DrainReport) {
    sum.claimed += pass.claimed;
    sum.delivered += pass.delivered;
    sum.retried += pass.retried;
    sum.dead_lettered += pass.dead_lettered;
    sum.settlement_failed += pass.settlement_failed;
    sum.lease_lost += pass.lease_lost;
}

/// The pool's backends are killed again and again while a pass settles,
/// and half the messages are row-locked so their settlements cannot get
/// through. The pass reports exactly what it could not settle; once the
/// leases end, later passes deliver it; nothing is lost or left claimed.
#[actix_rt::test]
async fn killed_connections_mid_drain_lose_nothing() {
    const MESSAGES: u64 = 16;
    let name = unique("killed");
    let (_pool, outbox) = store(&name).await;
    let admin = pool_named(&unique("admin"), 4).await;
    for n in 0..MESSAGES {
        outbox.enqueue(held_ping(n)).await.unwrap();
    }
    let (probe, mut reports) = probe();
    let config = DrainConfig {
        batch_size: MESSAGES as usize,
        concurrency: MESSAGES as usize,
        lease: Duration::from_secs(2),
        ..DrainConfig::default()
    };
    let coordinator = coordinator(outbox.clone(), &probe, config, false);
    let notices = Notices::subscribe(&coordinator).await;

    // Every message claimed and its handler running.
    let pass = actix_rt::spawn(coordinator.send(Drain));
    reports.started(MESSAGES as usize).await;
    let locked: Vec<String> = (0..MESSAGES)
        .filter(|n| n % 2 == 1)
        .map(|n| format!("m{n:05}"))
        .collect();
    let mut locker = admin.begin().await.unwrap();
    sqlx::query(AssertSqlSafe(format!(
        "SELECT 1 FROM {name} WHERE id = ANY($1) FOR UPDATE"
    )))
    .bind(&locked)
    .execute(&mut *locker)
    .await
    .unwrap();
    let killer = actix_rt::spawn({
        let (admin, name) = (admin.clone(), name.clone());
        async move {
            let mut killed = 0;
            loop {
                let pids = backends(&admin, &name, "true").await;
                killed += pids.len();
                terminate(&admin, &pids).await;
                // The pace of the fault, not a wait for a result.
                tokio::time::sleep(Duration::from_millis(20)).await;
                if killed > 1_000 {
                    return killed;
                }
            }
        }
    });
    reports.open_gate();
    let first = within("the pass ends", BOUND, pass).await.unwrap().unwrap();
    killer.abort();
    locker.rollback().await.unwrap();
    let report = match first {
        Ok(report) => report,
        Err(Error::Pass { source, report }) => {
            assert!(!source.is_claim_lost(), "{source:?}");
            *report
        }
        Err(other) => panic!("unexpected drain error: {other:?}"),
    };
    let (leases, outcomes) = notices.take();
    println!("first pass: {report}");
    assert_eq!(report.claimed, MESSAGES, "{report}");
    assert_accounts_for_every_claim(&report, &leases, &outcomes);
    assert_eq!(report.retried + report.dead_lettered, 0, "{report}");
    for notice in &outcomes {
        let OutcomeNotice::SettlementFailed(failure) = notice else {
            panic!("unexpected notice {notice:?}");
        };
        assert!(failure.delivery_succeeded);
        // Killed statements are transient errors; only a missed deadline
        // gives the claim up.
        assert!(!failure.error.is_claim_lost(), "{failure:?}");
    }
    assert!(
        leases.iter().all(|lease| !lease.confirmed_lost),
        "nobody else took a claim: {leases:?}"
    );
    let unsettled = report.claimed - report.delivered;
    assert!(unsettled >= locked.len() as u64, "{report}");
    assert_eq!(
        reports.finished(MESSAGES as usize).await.len(),
        MESSAGES as usize
    );

    // What the database says: the locked rows are still claimed, under
    // leases that run out; what the report counted delivered is delivered.
    let rows = status_of(&admin, &name).await;
    for id in &locked {
        assert_eq!(rows[id].0, "claimed", "{id}");
    }
    let delivered_first = rows.values().filter(|(s, _)| s == "delivered").count() as u64;
    assert!(delivered_first >= report.delivered, "{rows:?}");

    // Once the last of their leases has ended, the next pass takes every
    // unsettled message over and delivers it.
    let leases_end: chrono::DateTime<chrono::Utc> = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT max(locked_until) FROM {name} WHERE status = 'claimed'"
    )))
    .fetch_one(&admin)
    .await
    .unwrap();
    let remaining = (leases_end - SystemClock.now())
        .to_std()
        .unwrap_or_default();
    tokio::time::sleep(remaining + Duration::from_millis(10)).await;
    let later = coordinator.send(Drain).await.unwrap().unwrap();
    println!("next pass: {later}");
    assert_eq!(later.delivered, MESSAGES - delivered_first, "{later}");
    assert_eq!(later.claimed, later.delivered, "{later}");
    let redelivered = reports.finished(later.delivered as usize).await;
    assert!(
        redelivered.iter().all(|d| d.attempt == 2),
        "{redelivered:?}"
    );
    let rows = status_of(&admin, &name).await;
    assert!(rows.values().all(|(s, _)| s == "delivered"), "{rows:?}");
    for id in &locked {
        assert_eq!(rows[id].1, 2, "{id}");
    }
    let stats = outbox.stats(SystemClock.now()).await.unwrap();
    assert_eq!((stats.claimed, stats.pending), (0, 0), "{stats:?}");
}

/// Status and attempts of every row, by id.
async fn status_of(admin: &PgPool, table: &str) -> HashMap<String, (String, i64)> {
    sqlx::query(AssertSqlSafe(format!(
        "SELECT id, status, attempts FROM {table}"
    )))
    .fetch_all(admin)
    .await
    .unwrap()
    .iter()
    .map(|row| (row.get(0), (row.get(1), row.get(2))))
    .collect()
}

/// A system clock set off by `offset`: a machine whose clock is wrong.
#[derive(Debug, Clone, Copy)]
struct SkewedClock {
    offset: chrono::Duration,
}

impl Clock for SkewedClock {
    fn now(&self) -> chrono::DateTime<chrono::Utc> {
        SystemClock.now() + self.offset
    }
}

/// One run of one message by one worker, on the test's monotonic clock.
#[derive(Debug, Clone)]
struct Run {
    id: String,
    worker: usize,
    started: Instant,
    finished: Instant,
}

/// Two workers on one table, one clock 5 s ahead and one 5 s behind, with
/// 3 s leases renewed every second: more skew than a lease lasts. PostgreSQL
/// judges every lease by its own clock, so neither takes over a message the
/// other still runs.
#[test]
fn skewed_clocks_never_run_one_message_twice_at_once() {
    const MESSAGES: u64 = 400;
    const CONCURRENCY: usize = 4;
    let name = unique("skew");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (admin, outbox) = runtime.block_on(store(&name));
    runtime.block_on(async {
        let mut tx = admin.begin().await.unwrap();
        for n in 0..MESSAGES {
            outbox.enqueue_in(&mut tx, ping(n)).await.unwrap();
        }
        tx.commit().await.unwrap();
    });

    let runs = Arc::new(std::sync::Mutex::new(Vec::<Run>::new()));
    let offsets = [5, -5];
    let ready = Arc::new(Barrier::new(offsets.len()));
    let started = Instant::now();
    let workers: Vec<_> = offsets
        .into_iter()
        .enumerate()
        .map(|(worker, offset)| {
            let (name, runs, ready) = (name.clone(), runs.clone(), ready.clone());
            let clock = SkewedClock {
                offset: chrono::Duration::seconds(offset),
            };
            std::thread::spawn(move || {
                actix_rt::System::new().block_on(drain_skewed(
                    worker,
                    name,
                    clock,
                    CONCURRENCY,
                    runs,
                    ready,
                ))
            })
        })
        .collect();
    let statuses: Vec<CoordinatorStatus> = workers
        .into_iter()
        .map(|worker| worker.join().expect("a worker panicked"))
        .collect();
    let took = started.elapsed();

    let mut runs = runs.lock().unwrap().clone();
    runs.sort_by(|a, b| (&a.id, a.started).cmp(&(&b.id, b.started)));
    let ids: HashSet<&str> = runs.iter().map(|r| r.id.as_str()).collect();
    let delivered = ids.len() as u64;
    let duplicates = runs.len() as u64 - delivered;
    let overlaps = runs
        .windows(2)
        .filter(|w| w[0].id == w[1].id && w[1].started < w[0].finished)
        .count();
    let shares: Vec<usize> = (0..offsets.len())
        .map(|worker| runs.iter().filter(|r| r.worker == worker).count())
        .collect();
    let lost: Vec<u64> = statuses.iter().map(|s| s.totals.lease_lost).collect();
    println!(
        "skewed clocks (+5 s, -5 s; lease 3 s, heartbeat 1 s, concurrency {CONCURRENCY} each): \
         {MESSAGES} messages, delivered {delivered}, duplicates {duplicates}, overlaps \
         {overlaps}; runs per worker {shares:?}, leases lost {lost:?}, in {took:?}"
    );
    assert_eq!(delivered, MESSAGES, "every message ran");
    assert_eq!(overlaps, 0, "two runs of one message overlapped");
    assert!(
        duplicates <= 2 * CONCURRENCY as u64,
        "{duplicates} duplicates"
    );
    for (worker, share) in shares.iter().enumerate() {
        assert!(*share > 0, "worker {worker} ran nothing: {shares:?}");
    }
    let settled: i64 = runtime.block_on(async {
        sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT count(*) FROM {name} WHERE status = 'delivered'"
        )))
        .fetch_one(&admin)
        .await
        .unwrap()
    });
    assert_eq!(settled, MESSAGES as i64);
}

/// One worker of [`skewed_clocks_never_run_one_message_twice_at_once`]:
/// 50 ms handlers, drained until nothing is pending or claimed.
async fn drain_skewed(
    worker: usize,
    table: String,
    clock: SkewedClock,
    concurrency: usize,
    runs: Arc<std::sync::Mutex<Vec<Run>>>,
    ready: Arc<Barrier>,
) -> CoordinatorStatus {
    let pool = pool_named(&format!("{table}-w{worker}"), 8).await;
    let outbox = PostgresOutbox::builder(pool).table(&table).unwrap().build();
    let bus = outbox::InProcessBus::new().on(
        move |_: Arc<sql_support::Ping>, context: outbox::DeliveryContext| {
            let runs = runs.clone();
            async move {
                let started = Instant::now();
                tokio::time::sleep(Duration::from_millis(50)).await;
                runs.lock().unwrap().push(Run {
                    id: context.id().to_owned(),
                    worker,
                    started,
                    finished: Instant::now(),
                });
                Ok(())
            }
        },
    );
    let config = DrainConfig {
        concurrency,
        lease: Duration::from_secs(3),
        heartbeat: Some(Duration::from_secs(1)),
        ..DrainConfig::default()
    };
    let coordinator = outbox_actors::DrainCoordinator::builder(outbox.clone())
        .event_bus(bus)
        .config(config)
        .clock(clock)
        .start()
        .unwrap();
    status(&coordinator).await;
    ready.wait();
    let give_up = Instant::now() + Duration::from_secs(120);
    loop {
        assert!(Instant::now() < give_up, "worker {worker} never finished");
        let report = coordinator.send(Drain).await.unwrap().unwrap();
        let stats = outbox.stats(SystemClock.now()).await.unwrap();
        if report.claimed == 0 && stats.pending + stats.claimed == 0 {
            break;
        }
        if report.claimed == 0 {
            // The other worker holds the rest; look again shortly.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    status(&coordinator).await
}
