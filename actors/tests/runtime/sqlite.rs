//! The actor runtime end to end on SQLite database files: transactional
//! enqueue, wake-ups from commits, and a database locked by another
//! connection. Real time and the system clock; see `sql_support`.

use std::path::PathBuf;
use std::time::Duration;

use futures_util::FutureExt;
use outbox::{
    ClaimBatch, ClaimedBatch, Clock, DrainConfig, Error as CoreError, MarkDelivered, MarkFailed,
    MessageStatus, NewMessage, OutboxAdmin, OutboxStore, ReleaseClaim, RenewClaim, SqliteOutbox,
    SystemClock,
};
use outbox_actors::{Drain, Error, LeaseState};
use sqlx::Connection;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};
use tokio::sync::mpsc;

use crate::sql_support::{
    BOUND, Notices, OrderPlaced, assert_accounts_for_every_claim, coordinator, held_ping, idle,
    ping, probe, status, within,
};

/// A directory of database files, removed when the test ends.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "outbox-sqlite-runtime-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn options(&self) -> SqliteConnectOptions {
        SqliteOutbox::connect_options(&format!("sqlite://{}/outbox.db", self.0.display())).unwrap()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn open(options: SqliteConnectOptions) -> (SqlitePool, SqliteOutbox) {
    let pool = SqlitePoolOptions::new()
        .connect_with(options)
        .await
        .unwrap();
    let outbox = SqliteOutbox::new(pool.clone());
    outbox.setup().await.unwrap();
    (pool, outbox)
}

fn config(concurrency: usize) -> DrainConfig {
    DrainConfig {
        concurrency,
        ..DrainConfig::default()
    }
}

async fn count(pool: &SqlitePool, sql: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Rolled back, the order and its event are both gone and a `Drain` finds
/// nothing; committed, both are there and the next `Drain` delivers the event.
#[actix_rt::test]
async fn transactional_enqueue_through_the_runtime() {
    let dir = TempDir::new();
    let (pool, outbox) = open(dir.options()).await;
    sqlx::query("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
        .execute(&pool)
        .await
        .unwrap();
    let (probe, mut reports) = probe();
    let coordinator = coordinator(outbox.clone(), &probe, config(1), false);

    let mut tx = pool.begin().await.unwrap();
    sqlx::query("INSERT INTO orders (id) VALUES (1)")
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
    assert_eq!(count(&pool, "SELECT count(*) FROM orders").await, 0);
    assert_eq!(count(&pool, "SELECT count(*) FROM outbox").await, 0);

    let mut tx = pool.begin().await.unwrap();
    sqlx::query("INSERT INTO orders (id) VALUES (2)")
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
        count(&pool, "SELECT count(*) FROM orders WHERE id = 2").await,
        1
    );
    let message = outbox.get_message(&id).await.unwrap();
    assert_eq!(message.status, MessageStatus::Delivered);
    assert_eq!(message.payload.to_value()["order_id"], 2);
}

/// With no schedule and no `Drain`, a commit starts a pass; a rollback wakes
/// nothing; a burst of commits during a pass becomes one follow-up pass.
#[actix_rt::test]
async fn commits_wake_the_coordinator_and_bursts_are_coalesced() {
    let dir = TempDir::new();
    let (pool, outbox) = open(dir.options()).await;
    let (probe, mut reports) = probe();
    let coordinator = coordinator(outbox.clone(), &probe, config(4), true);
    // A receiver of the test's own sees every wake-up the coordinator gets.
    let mut wakeups = outbox.wakeups().unwrap();

    let mut tx = pool.begin().await.unwrap();
    let id = outbox.enqueue_in(&mut tx, ping(1)).await.unwrap().into_id();
    tx.commit().await.unwrap();
    assert_eq!(reports.finished(1).await[0].id, id);
    let before = idle(&coordinator).await;
    assert_eq!(before.passes, 1, "{before:?}");
    assert_eq!(wakeups.changed().now_or_never(), Some(true));

    // Rolled back: the commit hook never fires, so nothing can wake a pass.
    let mut tx = pool.begin().await.unwrap();
    outbox.enqueue_in(&mut tx, ping(2)).await.unwrap();
    tx.rollback().await.unwrap();
    assert!(
        wakeups.changed().now_or_never().is_none(),
        "a rollback woke"
    );
    let after = status(&coordinator).await;
    assert_eq!((after.passes, after.running), (before.passes, false));

    // A burst of commits while a pass is busy with a held message: the
    // wake-ups collapse into one follow-up pass.
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
    let delivered = reports.finished(1 + burst as usize).await;
    assert_eq!(delivered.len(), 1 + burst as usize);
    let end = idle(&coordinator).await;
    let passes = end.passes - after.passes;
    println!("{burst} commits during a pass took {passes} passes");
    assert!(passes <= 3, "{burst} commits took {passes} passes: {end:?}");
    assert_eq!(end.totals.delivered, 2 + burst);
    assert!(reports.finished_so_far().is_empty());
    let stats = outbox.stats(SystemClock.now()).await.unwrap();
    assert_eq!((stats.delivered, stats.total()), (2 + burst, 2 + burst));
}

/// Calls and failures of a store, reported as they happen.
#[derive(Clone)]
struct Watched {
    inner: SqliteOutbox,
    failures: mpsc::UnboundedSender<(&'static str, CoreError)>,
}

impl Watched {
    fn seen<T>(&self, operation: &'static str, result: outbox::Result<T>) -> outbox::Result<T> {
        if let Err(error) = &result {
            let _ = self.failures.send((operation, error.clone()));
        }
        result
    }
}

impl OutboxStore for Watched {
    async fn enqueue(&self, message: NewMessage) -> outbox::Result<outbox::Enqueued> {
        let result = self.inner.enqueue(message).await;
        self.seen("enqueue", result)
    }
    async fn claim_batch(&self, params: ClaimBatch) -> outbox::Result<ClaimedBatch> {
        let result = self.inner.claim_batch(params).await;
        self.seen("claim_batch", result)
    }
    async fn renew_claim(
        &self,
        params: RenewClaim,
    ) -> outbox::Result<chrono::DateTime<chrono::Utc>> {
        let result = self.inner.renew_claim(params).await;
        self.seen("renew_claim", result)
    }
    async fn mark_delivered(&self, params: MarkDelivered) -> outbox::Result<()> {
        let result = self.inner.mark_delivered(params).await;
        self.seen("mark_delivered", result)
    }
    async fn mark_failed(&self, params: MarkFailed) -> outbox::Result<()> {
        let result = self.inner.mark_failed(params).await;
        self.seen("mark_failed", result)
    }
    async fn release_claim(&self, params: ReleaseClaim) -> outbox::Result<()> {
        let result = self.inner.release_claim(params).await;
        self.seen("release_claim", result)
    }
}

/// Another connection holds the write lock: a claim fails with a typed
/// store error that ends the pass; settlements fail transiently and are
/// retried. Once the lock is gone every message is delivered, none lost.
#[actix_rt::test]
async fn a_locked_database_fails_transiently_and_loses_nothing() {
    let dir = TempDir::new();
    let options = dir.options().busy_timeout(Duration::from_millis(50));
    let (_pool, outbox) = open(options.clone()).await;
    let (failures, mut failed) = mpsc::unbounded_channel();
    let store = Watched {
        inner: outbox.clone(),
        failures,
    };
    let (probe, mut reports) = probe();
    let lease = Duration::from_secs(10);
    let config = DrainConfig {
        concurrency: 8,
        batch_size: 8,
        lease,
        ..DrainConfig::default()
    };
    let coordinator = coordinator(store, &probe, config, false);
    let notices = Notices::subscribe(&coordinator).await;
    let mut other = sqlx::SqliteConnection::connect_with(&options)
        .await
        .unwrap();
    let is_lock_error = |e: &CoreError, operation: &str| {
        matches!(e, CoreError::Store { operation: op, .. } if *op == operation)
            && e.to_string().contains("locked")
    };

    // Locked while the pass claims: the pass ends with the store's error.
    for n in 0..4 {
        outbox.enqueue(ping(n)).await.unwrap();
    }
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut other)
        .await
        .unwrap();
    let error = coordinator.send(Drain).await.unwrap().unwrap_err();
    match &error {
        Error::Pass { source, report } => {
            assert!(
                matches!(&**source, Error::Outbox(e) if is_lock_error(e, "claim_batch")),
                "{source:?}"
            );
            assert_eq!(report.claimed, 0, "{report}");
        }
        other => panic!("expected a pass error, got {other:?}"),
    }
    let (operation, source) = failed.try_recv().unwrap();
    assert!(is_lock_error(&source, operation), "{operation}: {source:?}");
    sqlx::query("ROLLBACK").execute(&mut other).await.unwrap();
    let report = coordinator.send(Drain).await.unwrap().unwrap();
    assert_eq!((report.claimed, report.delivered), (4, 4), "{report}");
    reports.finished(4).await;
    assert!(failed.try_recv().is_err());

    // Locked while deliveries settle: renewals and settlements fail with
    // the same typed error; released after the first failed settlement, a
    // retry of it goes through within the lease.
    for n in 10..18 {
        outbox.enqueue(held_ping(n)).await.unwrap();
    }
    let pass = actix_rt::spawn(coordinator.send(Drain));
    reports.started(8).await;
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut other)
        .await
        .unwrap();
    reports.open_gate();
    let mut seen = Vec::new();
    within("a settlement fails on the lock", BOUND, async {
        loop {
            let (operation, error) = failed.recv().await.unwrap();
            assert!(is_lock_error(&error, operation), "{operation}: {error:?}");
            seen.push(operation);
            if operation == "mark_delivered" {
                break;
            }
        }
    })
    .await;
    sqlx::query("ROLLBACK").execute(&mut other).await.unwrap();
    let report = within("the pass ends", BOUND, pass)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    println!("failed while locked: {seen:?}; {report}");
    assert_eq!((report.claimed, report.delivered), (8, 8), "{report}");
    let (leases, outcomes) = notices.take();
    assert_accounts_for_every_claim(&report, &leases, &outcomes);
    assert!(outcomes.is_empty(), "{outcomes:?}");
    // A failed extension is settled under the last confirmed lease.
    assert!(
        leases
            .iter()
            .all(|lease| lease.state == LeaseState::Degraded && !lease.confirmed_lost),
        "{leases:?}"
    );
    reports.finished(8).await;

    let stats = outbox.stats(SystemClock.now()).await.unwrap();
    assert_eq!((stats.delivered, stats.total()), (12, 12), "{stats:?}");
    let messages = outbox
        .list_messages(outbox::ListMessages::default())
        .await
        .unwrap();
    assert!(messages.messages.iter().all(|m| m.attempts == 1));
}
