//! The SQLite store against real database files.
//!
//! Every test passes `now` explicitly and runs on a real-time runtime: a
//! paused clock would fire pool timeouts and batch windows while the runtime
//! waits for the database.

mod conformance;
mod sql_support;

use std::path::PathBuf;
use std::time::Duration;

use futures_util::FutureExt;
use outbox::DEFAULT_BUSY_TIMEOUT;
use outbox::{
    ClaimBatch, ClaimLoss, Enqueued, Error, ListMessages, MarkDelivered, NewMessage, OutboxAdmin,
    OutboxStore, RenewClaim, SettlementMode, SqliteOutbox,
};
use sql_support::{LEASE, event, secs, t0, unique};
use sqlx::Connection;
use sqlx::sqlite::{SqlitePool, SqlitePoolOptions};

/// A directory of database files, removed when the test ends.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(unique("outbox-sqlite"));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn url(&self) -> String {
        format!("sqlite://{}/outbox.db", self.0.display())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn pool(dir: &TempDir) -> SqlitePool {
    SqlitePoolOptions::new()
        .connect_with(SqliteOutbox::connect_options(&dir.url()).unwrap())
        .await
        .unwrap()
}

async fn store(pool: &SqlitePool, table: &str, mode: SettlementMode) -> SqliteOutbox {
    let outbox = SqliteOutbox::builder(pool.clone())
        .table(table)
        .unwrap()
        .settlement(mode)
        .unwrap()
        .build();
    outbox.setup().await.unwrap();
    outbox
}

/// A fresh store for each conformance case: a database file of its own, with
/// the same settings as [`SqliteOutbox::connect`]. The files stay under
/// cargo's target directory until the next run, which clears them.
async fn setup() -> SqliteOutbox {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("sqlite-conformance");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    });
    let url = format!("sqlite://{}/{}.db", dir.display(), unique("case"));
    SqliteOutbox::connect(&url).await.unwrap()
}

conformance::conformance_suite!(setup);
conformance::schedules::schedule_suite!(setup);

/// A database file of its own for a contract case.
async fn database() -> (TempDir, SqlitePool) {
    let dir = TempDir::new();
    let pool = pool(&dir).await;
    (dir, pool)
}

/// A business table next to the outbox: its name, how to create it, and an
/// insert of one `id`.
fn orders() -> (String, String, String) {
    (
        "orders".to_owned(),
        "CREATE TABLE orders (id INTEGER PRIMARY KEY)".to_owned(),
        "INSERT INTO orders (id) VALUES (?1)".to_owned(),
    )
}

/// The refused names created nothing at all.
async fn nothing_created(pool: &SqlitePool) {
    let tables: i64 = sqlx::query_scalar("SELECT count(*) FROM sqlite_master")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(tables, 0);
}

sql_support::sql_conformance_suite! {
    store: SqliteOutbox,
    database: database,
    open: store,
    tx_table: "outbox",
    orders: orders,
    hostile_names: [
        "x; drop table y",
        "a.b.c",
        "",
        "\"quoted\"",
        "'single'",
        "outbox--",
        "sqlite_master",
        "main.sqlite_stat1",
        "name with space",
    ],
    nothing_created: nothing_created,
}

#[tokio::test]
async fn connect_creates_the_file_and_the_table_and_setup_runs_twice() {
    let dir = TempDir::new();
    let outbox = SqliteOutbox::connect(&dir.url()).await.unwrap();
    assert!(dir.0.join("outbox.db").exists());
    outbox.setup().await.unwrap();
    outbox.setup().await.unwrap();
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(outbox.pool())
        .await
        .unwrap();
    assert_eq!(mode, "wal");
    let timeout: i64 = sqlx::query_scalar("PRAGMA busy_timeout")
        .fetch_one(outbox.pool())
        .await
        .unwrap();
    assert_eq!(timeout, DEFAULT_BUSY_TIMEOUT.as_millis() as i64);
    // Reconnecting to an existing database migrates nothing again.
    let again = SqliteOutbox::connect(&dir.url()).await.unwrap();
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_migrations")
        .fetch_one(again.pool())
        .await
        .unwrap();
    assert_eq!(applied, outbox::SQLITE_MIGRATOR.iter().count() as i64);
}

#[tokio::test]
async fn in_memory_database_works_on_one_connection() {
    let outbox = SqliteOutbox::connect("sqlite::memory:").await.unwrap();
    outbox.enqueue(event("a", 1, t0())).await.unwrap();
    let batch = outbox
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: 5,
            now: t0(),
            lease: LEASE,
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
            queues: Vec::new(),
            durable: true,
        })
        .await
        .unwrap();
    assert_eq!(batch.claimed.len(), 1);
}

#[tokio::test]
async fn custom_tables_coexist_and_each_is_set_up_once() {
    let dir = TempDir::new();
    let pool = pool(&dir).await;
    let a = store(&pool, "jobs_a", SettlementMode::PerMessage).await;
    let b = store(&pool, "main.jobs_b", SettlementMode::PerMessage).await;
    a.setup().await.unwrap();
    b.setup().await.unwrap();
    a.enqueue(event("x", 1, t0())).await.unwrap();
    b.enqueue(event("x", 2, t0())).await.unwrap();
    assert_eq!(a.get_message("x").await.unwrap().payload.to_value()["n"], 1);
    assert_eq!(b.get_message("x").await.unwrap().payload.to_value()["n"], 2);
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'jobs_b' \
         AND name NOT LIKE 'sqlite_%' ORDER BY name",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        indexes,
        [
            "jobs_b_claimed",
            "jobs_b_created",
            "jobs_b_idempotency",
            "jobs_b_live_keyed",
            "jobs_b_ordering",
            "jobs_b_ordering_claimed",
            "jobs_b_pending_heads",
            "jobs_b_pending_keyed",
            "jobs_b_pending_keyless",
            "jobs_b_settled"
        ]
    );
    // Migration 0012: the triggers that keep each key's head, named after
    // the table and created in its database, though it was named with it.
    let triggers: Vec<String> = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'jobs_b' \
         ORDER BY name",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        triggers,
        [
            "jobs_b_head_deleted",
            "jobs_b_head_enqueued",
            "jobs_b_head_requeued",
            "jobs_b_head_settled"
        ]
    );
    // Migration 0008: only rows with an idempotency key are in its index.
    let idempotency: String =
        sqlx::query_scalar("SELECT sql FROM sqlite_master WHERE name = 'jobs_b_idempotency'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(
        idempotency.contains("UNIQUE")
            && idempotency.ends_with("WHERE idempotency_key IS NOT NULL"),
        "{idempotency}"
    );
    for tracking in ["jobs_a_migrations", "jobs_b_migrations"] {
        let applied: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM {tracking}"
        )))
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(
            applied,
            outbox::SQLITE_MIGRATOR.iter().count() as i64,
            "{tracking}"
        );
    }
}

/// `EXPLAIN QUERY PLAN` of `statement`, to bind its arguments to.
#[cfg(feature = "inspect-statements")]
fn explain(
    statement: &str,
) -> sqlx::query::Query<'static, sqlx::Sqlite, sqlx::sqlite::SqliteArguments> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "EXPLAIN QUERY PLAN {statement}"
    )))
}

/// The lines of the plan `explain` asks for, as SQLite words them.
#[cfg(feature = "inspect-statements")]
async fn query_plan(
    conn: &mut sqlx::SqliteConnection,
    explain: sqlx::query::Query<'static, sqlx::Sqlite, sqlx::sqlite::SqliteArguments>,
) -> Vec<String> {
    use sqlx::Row;

    explain
        .fetch_all(conn)
        .await
        .unwrap()
        .iter()
        .map(|row| row.get::<String, _>("detail"))
        .collect()
}

/// The claim must read both arms of eligibility from their partial indexes,
/// never scanning the table, so settled rows behind it cost nothing.
#[cfg(feature = "inspect-statements")]
#[tokio::test]
async fn claim_is_answered_from_the_partial_indexes() {
    let dir = TempDir::new();
    let pool = pool(&dir).await;
    let table = unique("plan");
    let outbox = store(&pool, &table, SettlementMode::PerMessage).await;
    // Many settled rows, a few unsettled ones, fresh statistics: the planner
    // must still pick the partial indexes.
    let mut tx = pool.begin().await.unwrap();
    for i in 0..5_000 {
        outbox
            .enqueue_in(&mut tx, event(&format!("s{i}"), i, t0()))
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE {table} SET status = 'delivered', delivered_at = created_at"
    )))
    .execute(&pool)
    .await
    .unwrap();
    for i in 0..3 {
        outbox
            .enqueue(event(&format!("p{i}"), i, t0()))
            .await
            .unwrap();
    }
    // Statistics as they are while nothing is claimed: the planner must not
    // take the empty index of claimed rows for a free way in. Planned on the
    // connection that took them, which loads them for sure.
    let mut conn = pool.acquire().await.unwrap();
    sqlx::query("ANALYZE").execute(&mut *conn).await.unwrap();

    let plan = query_plan(
        &mut conn,
        explain(outbox.claim_statement())
            .bind(0_i64)
            .bind(0_i64)
            .bind(10_i64)
            .bind(true)
            .bind(r#"[["default", 10, 25]]"#)
            .bind(10_i64),
    )
    .await;
    let plan_text = plan.join("\n");
    println!("{plan_text}");
    // Both pending arms, keyless rows and keys' heads, are read one
    // priority at a time, each in claim order: no sort of the due rows,
    // however many there are, and no scheduled row walked.
    for arm in ["keyless", "heads"] {
        let level =
            format!("INDEX {table}_pending_{arm} (queue=? AND priority=? AND available_at<?)");
        let pending = plan
            .iter()
            .position(|l| l.contains(&level))
            .unwrap_or_else(|| panic!("{arm} pending arm not from its index:\n{plan_text}"));
        assert!(
            !plan[pending + 1].contains("TEMP B-TREE"),
            "{arm} pending arm is sorted:\n{plan_text}"
        );
        // The priorities in use are found in the index, by a probe each.
        let probe = format!("INDEX {table}_pending_{arm} (queue=? AND priority<?)");
        let probe = plan
            .iter()
            .position(|l| l.contains(&probe))
            .unwrap_or_else(|| panic!("{arm} priorities not from the index:\n{plan_text}"));
        assert!(
            !plan[probe + 1].contains("TEMP B-TREE"),
            "{arm} priorities are sorted:\n{plan_text}"
        );
    }
    assert!(
        plan.iter()
            .any(|l| l.contains(&format!("INDEX {table}_claimed (locked_until<?)"))),
        "expired arm not from its index:\n{plan_text}"
    );
    assert!(
        !plan.iter().any(|l| l.starts_with(&format!("SCAN {table}"))),
        "the claim scans the table:\n{plan_text}"
    );
    // The rows picked are claimed by rowid.
    let plan = query_plan(
        &mut conn,
        explain(outbox.claim_take_statement())
            .bind(0_i64)
            .bind(0_i64)
            .bind("[[1, \"t\", 5]]"),
    )
    .await;
    let plan_text = plan.join("\n");
    println!("{plan_text}");
    assert!(
        plan.iter()
            .any(|l| l.starts_with("SEARCH m USING INTEGER PRIMARY KEY (rowid=?)")),
        "the claim does not find its rows by rowid:\n{plan_text}"
    );
    assert!(
        !plan.iter().any(|l| l.starts_with("SCAN m")),
        "the claim scans the table:\n{plan_text}"
    );
    // The fenced write looks each row up by id.
    let plan = query_plan(&mut conn, explain(outbox.fenced_statement()).bind("[]")).await;
    let plan_text = plan.join("\n");
    println!("{plan_text}");
    assert!(
        plan.iter()
            .any(|l| l.contains("USING INDEX sqlite_autoindex") && l.contains("(id=?)")),
        "settlement does not look rows up by id:\n{plan_text}"
    );
    drop(conn);

    let batch = outbox
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: 10,
            now: t0(),
            lease: LEASE,
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
            queues: Vec::new(),
            durable: true,
        })
        .await
        .unwrap();
    let ids: Vec<_> = batch.claimed.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, ["p0", "p1", "p2"]);
}

#[tokio::test]
async fn wakeups_fire_on_commit_and_never_before_or_on_rollback() {
    let dir = TempDir::new();
    let pool = pool(&dir).await;
    let outbox = store(&pool, "outbox", SettlementMode::default()).await;
    let mut wakeups = outbox.wakeups().expect("the SQLite store wakes");

    let mut tx = pool.begin().await.unwrap();
    outbox
        .enqueue_in(&mut tx, event("a", 1, t0()))
        .await
        .unwrap();
    assert!(
        wakeups.changed().now_or_never().is_none(),
        "woke before commit"
    );
    tx.commit().await.unwrap();
    // The hook runs inside the commit, so the wake-up is already there.
    assert_eq!(wakeups.changed().now_or_never(), Some(true));

    let mut tx = pool.begin().await.unwrap();
    outbox
        .enqueue_in(&mut tx, event("b", 1, t0()))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert!(
        wakeups.changed().now_or_never().is_none(),
        "woke for a rollback"
    );

    // A later commit of other work on the same connection does not wake.
    let mut conn = pool.acquire().await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    outbox
        .enqueue_in(&mut tx, event("c", 1, t0()))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(wakeups.changed().now_or_never(), Some(true));
    let mut tx = conn.begin().await.unwrap();
    sqlx::query("CREATE TABLE other (x)")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert!(
        wakeups.changed().now_or_never().is_none(),
        "woke for unrelated work"
    );
    drop(conn);

    // Through the pool: awake once the enqueue returns.
    outbox.enqueue(event("d", 1, t0())).await.unwrap();
    assert_eq!(wakeups.changed().now_or_never(), Some(true));

    // A burst collapses into one wake-up.
    for i in 0..5 {
        outbox
            .enqueue(event(&format!("burst{i}"), i, t0()))
            .await
            .unwrap();
    }
    assert_eq!(wakeups.changed().now_or_never(), Some(true));
    assert!(wakeups.changed().now_or_never().is_none());
}

#[tokio::test]
async fn one_transaction_enqueueing_into_two_outboxes_wakes_the_drains_of_both() {
    let dir = TempDir::new();
    let pool = pool(&dir).await;
    let orders = store(&pool, "orders_outbox", SettlementMode::default()).await;
    let billing = store(&pool, "billing_outbox", SettlementMode::default()).await;
    let mut order_wakeups = orders.wakeups().expect("the SQLite store wakes");
    let mut billing_wakeups = billing.wakeups().expect("the SQLite store wakes");

    let mut tx = pool.begin().await.unwrap();
    orders
        .enqueue_in(&mut tx, event("placed", 1, t0()))
        .await
        .unwrap();
    billing
        .enqueue_in(&mut tx, event("invoiced", 1, t0()))
        .await
        .unwrap();
    orders
        .enqueue_in(&mut tx, event("confirmed", 1, t0()))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(order_wakeups.changed().now_or_never(), Some(true));
    assert_eq!(billing_wakeups.changed().now_or_never(), Some(true));

    // A rollback disarms both, and the next commit on that connection
    // wakes only the outbox it enqueued into.
    let mut conn = pool.acquire().await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    orders
        .enqueue_in(&mut tx, event("lost", 1, t0()))
        .await
        .unwrap();
    billing
        .enqueue_in(&mut tx, event("lost", 1, t0()))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    billing
        .enqueue_in(&mut tx, event("refunded", 1, t0()))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert!(
        order_wakeups.changed().now_or_never().is_none(),
        "woke an outbox nothing was enqueued into"
    );
    assert_eq!(billing_wakeups.changed().now_or_never(), Some(true));
}

#[tokio::test]
async fn a_connection_keeps_waking_for_every_insert_it_commits_into_an_outbox() {
    let dir = TempDir::new();
    let pool = pool(&dir).await;
    let outbox = store(&pool, "outbox", SettlementMode::default()).await;
    let mut wakeups = outbox.wakeups().expect("the SQLite store wakes");
    // Another database with a table of the same name: its drains never
    // wake for this one's commits.
    let elsewhere_dir = TempDir::new();
    let elsewhere_pool = self::pool(&elsewhere_dir).await;
    let elsewhere = store(&elsewhere_pool, "outbox", SettlementMode::default()).await;
    let mut elsewhere_wakeups = elsewhere.wakeups().expect("the SQLite store wakes");
    let mut conn = pool.acquire().await.unwrap();
    sqlx::query("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
        .execute(&mut *conn)
        .await
        .unwrap();

    // A batch first: the connection gets its hooks before the insert.
    let mut tx = conn.begin().await.unwrap();
    outbox
        .enqueue_batch_in(&mut tx, vec![event("b1", 1, t0()), event("b2", 2, t0())])
        .await
        .unwrap();
    assert!(
        wakeups.changed().now_or_never().is_none(),
        "woke before commit"
    );
    tx.commit().await.unwrap();
    assert_eq!(wakeups.changed().now_or_never(), Some(true));

    // The same connection, hooked already: each commit of an enqueue wakes.
    for round in 0..3 {
        let mut tx = conn.begin().await.unwrap();
        outbox
            .enqueue_in(&mut tx, event(&format!("one{round}"), 1, t0()))
            .await
            .unwrap();
        tx.commit().await.unwrap();
        assert_eq!(
            wakeups.changed().now_or_never(),
            Some(true),
            "round {round}"
        );
    }

    // Not for a rollback, nor for a commit that stored no message: one
    // with only business rows, one whose message was there already.
    let mut tx = conn.begin().await.unwrap();
    outbox
        .enqueue_in(&mut tx, event("rolled-back", 1, t0()))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    sqlx::query("INSERT INTO orders (id) VALUES (1)")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    let again = outbox
        .enqueue_in(&mut tx, event("one0", 1, t0()))
        .await
        .unwrap();
    assert!(!again.is_inserted());
    tx.commit().await.unwrap();
    assert!(
        wakeups.changed().now_or_never().is_none(),
        "woke for a commit that stored no message"
    );

    // A row the application inserts into the table itself wakes as well,
    // once the connection has the hooks.
    sqlx::query(
        "INSERT INTO outbox (id, kind, name, payload, status, attempts, max_attempts, \
         available_at, created_at, updated_at) \
         VALUES ('by-hand', 'event', 'e', '{}', 'pending', 0, 25, 0, 0, 0)",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    assert_eq!(wakeups.changed().now_or_never(), Some(true));
    assert!(
        elsewhere_wakeups.changed().now_or_never().is_none(),
        "woke the drains of another database"
    );
    assert_eq!(outbox.pending_count().await.unwrap(), Some(6));
}

#[tokio::test]
async fn a_locked_database_is_a_transient_error_and_nothing_is_lost() {
    let dir = TempDir::new();
    let options = SqliteOutbox::connect_options(&dir.url())
        .unwrap()
        .busy_timeout(Duration::from_millis(50));
    let pool = SqlitePoolOptions::new()
        .connect_with(options.clone())
        .await
        .unwrap();
    let outbox = store(&pool, "outbox", SettlementMode::default()).await;
    outbox.enqueue(event("before", 1, t0())).await.unwrap();
    let batch = outbox
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: 1,
            now: t0(),
            lease: LEASE,
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
            queues: Vec::new(),
            durable: true,
        })
        .await
        .unwrap();
    let claimed = batch.claimed[0].clone();

    // Another process holds the write lock.
    let mut other = sqlx::SqliteConnection::connect_with(&options)
        .await
        .unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut other)
        .await
        .unwrap();

    let is_transient = |e: &Error, operation: &str| {
        matches!(e, Error::Store { operation: op, .. } if *op == operation) && !e.is_claim_lost()
    };
    let e = outbox.enqueue(event("during", 2, t0())).await.unwrap_err();
    assert!(is_transient(&e, "enqueue"), "{e:?}");
    assert!(e.to_string().contains("locked"), "{e}");
    let e = outbox
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: 5,
            now: t0(),
            lease: LEASE,
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
            queues: Vec::new(),
            durable: true,
        })
        .await
        .unwrap_err();
    assert!(is_transient(&e, "claim_batch"), "{e:?}");
    let renew = RenewClaim {
        id: claimed.id.clone(),
        claim_token: claimed.claim_token.clone(),
        now: t0() + secs(1),
        lease: LEASE,
    };
    let e = outbox.renew_claim(renew.clone()).await.unwrap_err();
    assert!(is_transient(&e, "renew_claim"), "{e:?}");

    sqlx::query("ROLLBACK").execute(&mut other).await.unwrap();

    // Retried after the lock is gone: everything goes through.
    outbox.renew_claim(renew).await.unwrap();
    outbox.enqueue(event("during", 2, t0())).await.unwrap();
    outbox
        .mark_delivered(MarkDelivered {
            delete: false,
            id: claimed.id.clone(),
            claim_token: claimed.claim_token.clone(),
            now: t0() + secs(2),
        })
        .await
        .unwrap();
    let batch = outbox
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: 5,
            now: t0() + secs(2),
            lease: LEASE,
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
            queues: Vec::new(),
            durable: true,
        })
        .await
        .unwrap();
    assert_eq!(batch.claimed.len(), 1);
    assert_eq!(batch.claimed[0].id, "during");
    let stats = outbox.stats(t0() + secs(2)).await.unwrap();
    assert_eq!((stats.delivered, stats.claimed, stats.total()), (1, 1, 2));
}

#[tokio::test]
async fn timestamps_payloads_and_traces_round_trip_exactly() {
    let dir = TempDir::new();
    let pool = pool(&dir).await;
    let outbox = store(&pool, "outbox", SettlementMode::default()).await;
    let now = t0() + chrono::Duration::microseconds(123_457);
    let payload = r#"{"z":1,"a":[true,null,"é\u0000"],"n":1.5e3}"#;
    let message = NewMessage::new(
        outbox::MessageKind::Job,
        "exact",
        outbox::Payload::from_json(payload).unwrap(),
    )
    .with_id("exact")
    .with_trace(outbox::TraceCarrier {
        traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
        tracestate: Some("congo=t61rcWkgMzE".into()),
    })
    .with_max_attempts(u32::MAX)
    .available_at(now + secs(1))
    .at(now);
    outbox.enqueue(message).await.unwrap();
    let stored = outbox.get_message("exact").await.unwrap();
    assert_eq!(stored.payload.as_str(), payload);
    assert_eq!(stored.created_at, now);
    assert_eq!(stored.available_at, now + secs(1));
    assert_eq!(stored.max_attempts, u32::MAX);
    assert_eq!(
        stored.trace.unwrap().tracestate.as_deref(),
        Some("congo=t61rcWkgMzE")
    );
    let batch = outbox
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: 1,
            now: now + secs(1),
            lease: Duration::from_micros(1_500_001),
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
            queues: Vec::new(),
            durable: true,
        })
        .await
        .unwrap();
    assert_eq!(
        batch.claimed[0].locked_until,
        now + secs(1) + chrono::Duration::microseconds(1_500_001)
    );
}

#[tokio::test]
async fn an_unreadable_row_is_reported_and_does_not_block_claims() {
    let dir = TempDir::new();
    let pool = pool(&dir).await;
    let outbox = store(&pool, "outbox", SettlementMode::default()).await;
    outbox
        .enqueue(event("good", 1, t0() + secs(1)))
        .await
        .unwrap();
    // Written by hand, by something that is not this store.
    sqlx::query(
        "INSERT INTO outbox (id, kind, name, payload, max_attempts, available_at, created_at, updated_at) \
         VALUES ('bad', 'event', 'x', 'not json', 3, ?1, ?1, ?1)",
    )
    .bind(t0().timestamp_micros())
    .execute(&pool)
    .await
    .unwrap();
    match outbox.get_message("bad").await {
        Err(Error::Unreadable(row)) => {
            assert_eq!(row.id, "bad");
            assert!(row.reason.contains("payload"), "{}", row.reason);
            assert_eq!(row.payload(), Some("not json"));
        }
        other => panic!("expected an unreadable row, got {other:?}"),
    }
    let page = outbox.list_messages(ListMessages::default()).await.unwrap();
    assert_eq!(page.messages.len(), 1);
    assert_eq!(page.unreadable.len(), 1);
    let batch = outbox
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: 10,
            now: t0() + secs(2),
            lease: LEASE,
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
            queues: Vec::new(),
            durable: true,
        })
        .await
        .unwrap();
    assert_eq!(batch.claimed.len(), 1);
    assert_eq!(batch.claimed[0].id, "good");
    let (status, error): (String, String) =
        sqlx::query_as("SELECT status, last_error FROM outbox WHERE id = 'bad'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(status, "dead_lettered");
    assert!(error.contains("unreadable"), "{error}");
}

/// Rows another writer left with values this store never writes: each is
/// either claimed as it reads or dead-lettered with the reason, and none
/// stops the claim of the rows around it, however the claim hands rows over.
#[tokio::test]
async fn a_claim_takes_readable_rows_and_dead_letters_the_rest_whatever_they_hold() {
    let dir = TempDir::new();
    let pool = pool(&dir).await;
    let outbox = store(&pool, "outbox", SettlementMode::default()).await;
    for (i, id) in ["good-1", "good-2"].iter().enumerate() {
        outbox
            .enqueue(event(id, i as u64, t0() + secs(1)))
            .await
            .unwrap();
    }
    // (id, name, payload, trace, max_attempts, due in seconds), the values
    // as SQL expressions. Text that is not UTF-8 comes due a claim later than
    // the rest, so both the claim that hands rows over as JSON and the one
    // that cannot are met.
    let hostile = [
        ("blob-payload", "'x'", "X'7B7D'", "NULL", "3", 0),
        ("blob-name", "X'78'", "'{}'", "NULL", "3", 0),
        ("broken-trace", "'x'", "'{}'", "'{broken'", "3", 0),
        ("real-cap", "'x'", "'{}'", "NULL", "2.5", 0),
        ("text-cap", "'x'", "'{}'", "NULL", "'many'", 0),
        (
            "escaped",
            "'x\"y'",
            r#"'{"a": "\u00e9\n"}'"#,
            "NULL",
            "3",
            0,
        ),
        (
            "bad-utf8-name",
            "CAST(X'FF' AS TEXT)",
            "'{}'",
            "NULL",
            "3",
            3,
        ),
        ("late", "'x'", "'{}'", "NULL", "3", 3),
    ];
    // And one out of attempts, which the claim dead-letters.
    sqlx::query(
        "INSERT INTO outbox (id, kind, name, payload, attempts, max_attempts, max_attempts_set, \
           available_at, created_at, updated_at) \
         VALUES ('spent', 'event', 'x', '{}', 2, 2, 1, ?1, ?1, ?1)",
    )
    .bind(t0().timestamp_micros())
    .execute(&pool)
    .await
    .unwrap();
    for (id, name, payload, trace, cap, due) in hostile {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO outbox (id, kind, name, payload, trace, max_attempts, max_attempts_set, \
               available_at, created_at, updated_at) \
             VALUES ('{id}', 'event', {name}, {payload}, {trace}, {cap}, 1, ?1, ?1, ?1)"
        )))
        .bind((t0() + secs(due)).timestamp_micros())
        .execute(&pool)
        .await
        .unwrap();
    }
    let mut claimed = Vec::new();
    let mut dead = Vec::new();
    for at in [2, 4] {
        let batch = outbox
            .claim_batch(ClaimBatch {
                on_dead_letter: Default::default(),
                limit: 20,
                now: t0() + secs(at),
                lease: LEASE,
                max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
                queues: Vec::new(),
                durable: true,
            })
            .await
            .unwrap();
        claimed.extend(batch.claimed);
        dead.extend(batch.dead_lettered.into_iter().map(|m| m.id));
    }
    let mut ids: Vec<&str> = claimed.iter().map(|m| m.id.as_str()).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["escaped", "good-1", "good-2", "late"]);
    assert_eq!(dead, ["spent"]);
    let escaped = claimed.iter().find(|m| m.id == "escaped").unwrap();
    assert_eq!(escaped.name, "x\"y");
    assert_eq!(escaped.payload.as_str(), "{\"a\": \"\\u00e9\\n\"}");
    for message in &claimed {
        assert_eq!(message.attempts, 1);
        let (status, token): (String, String) =
            sqlx::query_as("SELECT status, claim_token FROM outbox WHERE id = ?1")
                .bind(&message.id)
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(
            (status.as_str(), token.as_str()),
            ("claimed", message.claim_token.as_str())
        );
    }
    let unreadable: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT id, status, last_error FROM outbox \
         WHERE id NOT IN ('good-1', 'good-2', 'escaped', 'late', 'spent') ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(unreadable.len(), 6, "{unreadable:?}");
    for (id, status, error) in unreadable {
        assert_eq!(status, "dead_lettered", "{id}");
        assert!(error.contains("unreadable"), "{id}: {error}");
    }
}

#[tokio::test]
async fn duplicate_ids_are_reported_and_claim_losses_are_named() {
    let dir = TempDir::new();
    let pool = pool(&dir).await;
    let outbox = store(&pool, "outbox", SettlementMode::default()).await;
    outbox.enqueue(event("dup", 1, t0())).await.unwrap();
    assert_eq!(
        outbox.enqueue(event("dup", 2, t0())).await.unwrap(),
        Enqueued::AlreadyExists("dup".to_owned())
    );
    let mut tx = pool.begin().await.unwrap();
    assert_eq!(
        outbox
            .enqueue_in(&mut tx, event("dup", 3, t0()))
            .await
            .unwrap(),
        Enqueued::AlreadyExists("dup".to_owned())
    );
    drop(tx);
    assert_eq!(
        outbox.get_message("dup").await.unwrap().payload.to_value()["n"],
        1
    );

    let claimed = outbox
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: 1,
            now: t0(),
            lease: LEASE,
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
            queues: Vec::new(),
            durable: true,
        })
        .await
        .unwrap()
        .claimed
        .remove(0);
    let lost = |token: &str, now| {
        outbox.renew_claim(RenewClaim {
            id: "dup".into(),
            claim_token: token.into(),
            now,
            lease: LEASE,
        })
    };
    match lost("wrong", t0()).await {
        Err(Error::Claim(e)) => assert_eq!(e.reason, ClaimLoss::TokenMismatch),
        other => panic!("{other:?}"),
    }
    match lost(&claimed.claim_token, t0() + LEASE_CHRONO).await {
        Err(Error::Claim(e)) => assert_eq!(e.reason, ClaimLoss::LeaseExpired),
        other => panic!("{other:?}"),
    }
    // The lease ran out: the next claim takes the message over.
    let again = outbox
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: 1,
            now: t0() + LEASE_CHRONO,
            lease: LEASE,
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
            queues: Vec::new(),
            durable: true,
        })
        .await
        .unwrap();
    assert_eq!(again.claimed[0].attempts, 2);
    assert_ne!(again.claimed[0].claim_token, claimed.claim_token);
}

const LEASE_CHRONO: chrono::Duration = chrono::Duration::seconds(30);

#[tokio::test]
async fn concurrent_setups_of_a_new_database_all_succeed() {
    let dir = TempDir::new();
    let mut stores = Vec::new();
    for _ in 0..3 {
        stores.push(SqliteOutbox::new(pool(&dir).await));
    }
    let results = futures_util::future::join_all(stores.iter().map(|s| s.setup())).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    stores[0].enqueue(event("a", 1, t0())).await.unwrap();
}

/// One writer: a drain sizing itself claims ahead, up to 512 (claims that
/// large leave little of a transaction's cost to each message), one claim
/// at a time.
#[tokio::test]
async fn a_self_sizing_drain_claims_up_to_512_ahead_and_one_claim_at_a_time() {
    let store = setup().await;
    assert!(store.claims_ahead());
    assert_eq!(store.prefetch_limit(), 512);
    assert_eq!(store.claim_parallelism(), 1);
}
