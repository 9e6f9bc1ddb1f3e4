//! PostgreSQL: a fresh table per store in the database at `DATABASE_URL`
//! (`scripts/with-postgres` makes a throwaway cluster and exports it),
//! dropped with everything its migrations made when the benchmark is done.

use outbox::PostgresOutbox;
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, Connection, PgConnection};

/// `DATABASE_URL`, or an error that says how to get a server.
pub fn database_url() -> Result<String, String> {
    std::env::var("DATABASE_URL").map_err(|_| {
        "--store postgres needs DATABASE_URL; run it under scripts/with-postgres for a \
         throwaway cluster"
            .to_owned()
    })
}

/// A store on `table` over a pool made with `options`, which connects when
/// first used. `notify` is the store's `NOTIFY` per insert: off unless a
/// drain listens for wake-ups, so an enqueue costs what it costs an
/// application whose workers poll.
///
/// # Panics
///
/// When `url` is not a PostgreSQL URL or `table` not a valid table name.
pub fn store(url: &str, table: &str, options: PgPoolOptions, notify: bool) -> PostgresOutbox {
    let pool = options
        .connect_lazy(url)
        .expect("DATABASE_URL is a PostgreSQL URL");
    PostgresOutbox::builder(pool)
        .table(table)
        .expect("a valid table name")
        .notify(notify)
        .build()
}

/// [`store`] on a table made fresh: whatever an earlier run left under the
/// name is dropped first, then the migrations run.
///
/// # Panics
///
/// As [`store`], and when the server refuses the set-up.
pub async fn fresh(url: &str, table: &str, options: PgPoolOptions, notify: bool) -> PostgresOutbox {
    drop_tables(url, table).await;
    let store = store(url, table, options, notify);
    store.setup().await.expect("create the bench table");
    store
}

/// Drops `table` and what its migrations made beside it (the migration
/// record, the drains table, the functions), from a connection of its own,
/// so it works after the store's pool is closed or its runtime gone.
///
/// # Panics
///
/// When the server cannot be reached or refuses.
pub async fn drop_tables(url: &str, table: &str) {
    let mut conn = PgConnection::connect(url)
        .await
        .expect("connect to DATABASE_URL");
    sqlx::raw_sql(AssertSqlSafe(format!(
        "DROP TABLE IF EXISTS \"{table}\", \"{table}_migrations\", \"{table}_drains\", \"{table}_inbox\"; \
         DROP FUNCTION IF EXISTS \"{table}_wake\", \"{table}_claim_heads\", \"{table}_claim\", \
           \"{table}_settle\"; \
         DROP SEQUENCE IF EXISTS \"{table}_armed\", \"{table}_served\""
    )))
    .execute(&mut conn)
    .await
    .expect("drop the bench table");
    conn.close().await.ok();
}

/// Refreshes the planner's statistics of the store's table, as autovacuum
/// would some time after a large fill, so the first timed statements are
/// planned for the table as it is.
///
/// # Panics
///
/// When the server refuses.
pub async fn analyze(store: &PostgresOutbox) {
    sqlx::raw_sql(AssertSqlSafe(format!("ANALYZE {}", store.table().quoted())))
        .execute(store.pool())
        .await
        .expect("analyze");
}

/// The table's size with its indexes and TOAST
/// (`pg_total_relation_size`).
///
/// # Panics
///
/// When the server refuses.
pub async fn table_bytes(store: &PostgresOutbox) -> u64 {
    let size: i64 = sqlx::query_scalar("SELECT pg_total_relation_size($1::regclass)")
        .bind(store.table().quoted())
        .fetch_one(store.pool())
        .await
        .expect("table size");
    size as u64
}

super::fill_in_transactions!(PostgresOutbox);
