//! The PostgreSQL store against a real server.
//!
//! Run with `scripts/with-postgres cargo test --all-features --test
//! postgres` (the query-plan tests need `inspect-statements`); without
//! `DATABASE_URL` every test fails and says so. Each test uses tables of its
//! own, so they run in parallel against one database.
//! Every test passes `now` explicitly and runs on a real-time runtime: a
//! paused clock would fire pool timeouts and batch windows while the runtime
//! waits for the database.
//!
//! # Layout
//!
//! This file holds the helpers every module shares and runs the store
//! conformance suites (`conformance`, `sql_support`, shared with the other
//! stores' tests) on PostgreSQL. One module per theme:
//!
//! - `schema`: setting up tables, schemas, indexes and vacuum settings.
//! - `input`: what PostgreSQL stores and refuses.
//! - `claims`, `settlement`: concurrent claims and settlement statements.
//! - `wakeups`: `LISTEN`/`NOTIFY`.
//! - `faults`: killed connections.
//! - `server_clock`: leases on the database's clock.
//! - `plans`: query plans on large tables (some need `inspect-statements`).
//! - `one_connection`: what one connection keeps between calls.

#[path = "../conformance/mod.rs"]
mod conformance;
#[path = "../sql_support/mod.rs"]
mod sql_support;

mod claims;
mod faults;
mod input;
mod key_heads;
mod one_connection;
mod plans;
mod schema;
mod server_clock;
mod settlement;
mod wakeups;

use std::str::FromStr;
use std::time::Duration;

use outbox::{OutboxStore, PostgresOutbox, SettlementMode};
use sql_support::unique;
use sqlx::AssertSqlSafe;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| {
        panic!(
            "DATABASE_URL is not set. The PostgreSQL tests need a server: run them with \
             `scripts/with-postgres cargo test --all-features --test postgres`"
        )
    })
}

/// A pool whose connections carry `application_name`, so a test can find
/// (and kill) them.
async fn pool_named(application_name: &str) -> PgPool {
    let options = PgConnectOptions::from_str(&database_url())
        .expect("DATABASE_URL is a PostgreSQL URL")
        .application_name(application_name);
    PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(options)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to DATABASE_URL: {e}"))
}

async fn pool() -> PgPool {
    pool_named("outbox-tests").await
}

/// A store on the caller's clock: the suite passes every `now` (on a fixed
/// clock far from the server's), so the contract is checked to the
/// microsecond. The store's default, the server's clock, has tests of its
/// own (`server_clock`).
async fn store(pool: &PgPool, table: &str, mode: SettlementMode) -> PostgresOutbox {
    let outbox = PostgresOutbox::builder(pool.clone())
        .table(table)
        .unwrap()
        .settlement(mode)
        .unwrap()
        .caller_clock(true)
        .build();
    outbox.setup().await.unwrap();
    outbox
}

/// A store on the server's clock (the default), for table `table`.
async fn server_clock_store(pool: &PgPool, table: &str) -> PostgresOutbox {
    let outbox = PostgresOutbox::builder(pool.clone())
        .table(table)
        .unwrap()
        .build();
    outbox.setup().await.unwrap();
    outbox
}

/// Wait for a condition the server reports, for at most ten seconds.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..200 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting until {what}");
}

async fn backends(pool: &PgPool, application_name: &str, filter: &str) -> Vec<i32> {
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND {filter}"
    )))
    .bind(application_name)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// A fresh store for each conformance case: a table of its own.
async fn setup() -> PostgresOutbox {
    store(&pool().await, &unique("case"), SettlementMode::default()).await
}

conformance::conformance_suite!(setup);
conformance::schedules::schedule_suite!(setup);

/// The shared test database; tables of their own keep the cases apart.
async fn database() -> ((), PgPool) {
    ((), pool().await)
}

/// A business table of its own next to the outbox: its name, how to create
/// it, and an insert of one `id`.
fn orders() -> (String, String, String) {
    let orders = unique("orders");
    (
        orders.clone(),
        format!("CREATE TABLE {orders} (id bigint PRIMARY KEY)"),
        format!("INSERT INTO {orders} (id) VALUES ($1)"),
    )
}

sql_support::sql_conformance_suite! {
    store: PostgresOutbox,
    database: database,
    open: store,
    tx_table: unique("tx"),
    orders: orders,
    hostile_names: [
        "x; drop table y",
        "a.b.c",
        "",
        "\"quoted\"",
        "o'neil",
        "public.",
        "tab\tle",
    ],
}
