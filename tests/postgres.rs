//! The PostgreSQL store against a real server.
//!
//! Run with `scripts/with-postgres cargo test --all-features --test
//! postgres` (the query-plan tests need `inspect-statements`); without
//! `DATABASE_URL` every test fails and says so. Each test uses tables of its
//! own, so they run in parallel against one database.
//! Every test passes `now` explicitly and runs on a real-time runtime: a
//! paused clock would fire pool timeouts and batch windows while the runtime
//! waits for the database.

mod conformance;
mod sql_support;

use std::str::FromStr;
use std::time::Duration;

use outbox::{
    Armed, ClaimBatch, ClaimLoss, Enqueued, Error, ListCursor, ListMessages, MarkDelivered,
    MessageStatus, NewMessage, OutboxAdmin, OutboxStore, PostgresOutbox, SettlementMode,
};
use sql_support::{LEASE, event, secs, t0, unique};
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Row};

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
/// own below.
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

/// Writes rows by hand with `insert` (its `$1` bound to `t0()`), then
/// refreshes the table's statistics, so plans are made for those rows.
async fn insert_and_analyze(pool: &PgPool, table: &str, insert: String) {
    sqlx::query(AssertSqlSafe(insert))
        .bind(t0())
        .execute(pool)
        .await
        .unwrap();
    sqlx::query(AssertSqlSafe(format!("ANALYZE {table}")))
        .execute(pool)
        .await
        .unwrap();
}

/// The `nth` query (from 0) of a function of `migration`, for `table`, with
/// its arguments replaced as `params` says (name, replacement): EXPLAIN
/// cannot see inside a function, so its plans are read from this.
fn function_query(migration: &str, nth: usize, table: &str, params: &[(&str, &str)]) -> String {
    let body = migration.split("RETURN QUERY").nth(nth + 1).unwrap();
    let mut query =
        body[..body.find(";\n").unwrap()].replace("\"outbox\"", &format!("\"{table}\""));
    for (name, replacement) in params {
        query = query.replace(name, replacement);
    }
    query
}

/// The parameters of [`claim_function_query`].
const CLAIM_PARAMETERS: &str = "(integer, integer, timestamptz, bigint, bigint, boolean)";

/// The claim the table's `claim` function runs (a claim's first pass):
/// `$1` limit, `$2` walk, `$3` now (NULL for the database's), `$4` lease in
/// µs, `$5` attempt cap, `$6` block.
fn claim_function_query(table: &str) -> String {
    function_query(
        include_str!("../migrations/postgres/0012_claim_function.sql"),
        0,
        table,
        &[
            ("p_limit", "$1"),
            ("p_walk", "$2"),
            ("v_now", "coalesce($3, statement_timestamp())"),
            ("p_lease", "$4"),
            ("p_cap", "$5"),
            ("p_block", "$6"),
        ],
    )
}

/// The fenced writes the table's `settle` function runs: the batch of
/// deletions only (`$1` ids, `$2` tokens, `$3` nows) and the batch of any
/// writes (`$1` ops, then ids, tokens, nows, leases, new due times and
/// errors).
#[cfg(feature = "inspect-statements")]
fn settle_function_queries(table: &str) -> (String, String) {
    let migration = include_str!("../migrations/postgres/0013_settle_function.sql");
    let deletions = function_query(
        migration,
        0,
        table,
        &[("p_id", "$1"), ("p_token", "$2"), ("p_now", "$3")],
    );
    let any = function_query(
        migration,
        1,
        table,
        &[
            ("p_op", "$1"),
            ("p_id", "$2"),
            ("p_token", "$3"),
            ("p_now", "$4"),
            ("p_lease", "$5"),
            ("p_available", "$6"),
            ("p_error", "$7"),
        ],
    );
    (deletions, any)
}

/// A fresh store for each conformance case: a table of its own.
async fn setup() -> PostgresOutbox {
    store(&pool().await, &unique("case"), SettlementMode::default()).await
}

conformance::conformance_suite!(setup);

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

#[tokio::test]
async fn setup_runs_twice_and_creates_schemas_and_tables_of_their_own() {
    let pool = pool().await;
    let plain = unique("setup");
    let schema = unique("app");
    let qualified = format!("{schema}.events");
    let a = store(&pool, &plain, SettlementMode::default()).await;
    let b = store(&pool, &qualified, SettlementMode::default()).await;
    a.setup().await.unwrap();
    b.setup().await.unwrap();
    a.enqueue(event("x", 1, t0())).await.unwrap();
    b.enqueue(event("x", 2, t0())).await.unwrap();
    assert_eq!(a.get_message("x").await.unwrap().payload.to_value()["n"], 1);
    assert_eq!(b.get_message("x").await.unwrap().payload.to_value()["n"], 2);
    let applied: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM \"{schema}\".events_migrations"
    )))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(applied, outbox::POSTGRES_MIGRATOR.iter().count() as i64);
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT indexname::text FROM pg_indexes WHERE schemaname = $1 ORDER BY indexname",
    )
    .bind(&schema)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        indexes,
        [
            "events_claimed",
            "events_created",
            "events_drains_pkey",
            "events_idempotency",
            "events_migrations_pkey",
            "events_ordering",
            "events_ordering_claimed",
            "events_pending_keyed",
            "events_pending_keyless",
            "events_pkey",
            "events_settled"
        ]
    );
    // Migration 0008: only rows with an idempotency key are in its index.
    let idempotency: String = sqlx::query_scalar(
        "SELECT indexdef FROM pg_indexes WHERE schemaname = $1 AND indexname = 'events_idempotency'",
    )
    .bind(&schema)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(
        idempotency.starts_with("CREATE UNIQUE INDEX")
            && idempotency.ends_with("WHERE (idempotency_key IS NOT NULL)"),
        "{idempotency}"
    );
    // Migrations 0010 and 0011: the listing index is keyed by the creation
    // time alone and leaves claimed rows out.
    let created: String = sqlx::query_scalar(
        "SELECT indexdef FROM pg_indexes WHERE schemaname = $1 AND indexname = 'events_created'",
    )
    .bind(&schema)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(
        created.ends_with("(created_at) WHERE (status <> 'claimed'::text)"),
        "{created}"
    );
    // Concurrent setups of one new table serialize on sqlx's migration lock.
    let shared = unique("concurrent");
    let stores: Vec<_> = (0..3)
        .map(|_| {
            PostgresOutbox::builder(pool.clone())
                .table(&shared)
                .unwrap()
                .build()
        })
        .collect();
    let results = futures_util::future::join_all(stores.iter().map(|s| s.setup())).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
}

/// Migration 0006's autovacuum settings land on a table of any name, and
/// `vacuum` runs on it (it cannot run inside a transaction).
#[tokio::test]
async fn a_custom_table_gets_its_vacuum_settings_and_vacuums() {
    let pool = pool().await;
    let schema = unique("vac");
    let outbox = store(
        &pool,
        &format!("{schema}.events"),
        SettlementMode::default(),
    )
    .await;
    let options: Vec<String> = sqlx::query_scalar(
        "SELECT unnest(c.reloptions) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = $1 AND c.relname = 'events' ORDER BY 1",
    )
    .bind(&schema)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        options,
        [
            "autovacuum_vacuum_cost_delay=0",
            "autovacuum_vacuum_scale_factor=0.0",
            "autovacuum_vacuum_threshold=5000"
        ]
    );
    outbox.enqueue(event("x", 1, t0())).await.unwrap();
    outbox.vacuum().await.unwrap();
    assert_eq!(outbox.get_message("x").await.unwrap().id, "x");
}

/// A listing page after a cursor is read from the creation index, not by
/// scanning the table, with a hundred thousand rows and fresh statistics,
/// and rows of one creation time still come in id order.
#[tokio::test]
async fn a_listing_page_is_read_from_the_creation_index() {
    // One connection, so the statistics the listing leaves are the ones
    // this connection flushes.
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&database_url())
        .await
        .unwrap();
    let table = unique("listing");
    let outbox = store(&pool, &table, SettlementMode::default()).await;
    // Three rows a millisecond, ids counting down within each: the id
    // order is not the insertion order.
    insert_and_analyze(
        &pool,
        &table,
        format!(
            "INSERT INTO {table} (id, kind, name, payload, status, max_attempts, available_at, \
               created_at, updated_at, delivered_at) \
             SELECT 'r' || lpad((i / 3)::text, 6, '0') || (2 - i % 3), 'event', 'settled', '{{}}', \
               'delivered', 5, $1, $1 + (i / 3) * interval '1 millisecond', $1, $1 \
             FROM generate_series(0, 99999) AS i"
        ),
    )
    .await;
    let scans = async || -> (i64, i64) {
        // Flushes this backend's pending counts, the listing's included.
        sqlx::query("SELECT pg_stat_force_next_flush()")
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query_as(
            "SELECT t.seq_scan, i.idx_scan FROM pg_stat_user_tables t \
             JOIN pg_stat_user_indexes i ON i.relid = t.relid \
             WHERE t.relname = $1 AND i.indexrelname = $1 || '_created'",
        )
        .bind(&table)
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    // A page after the same cursor: its ids.
    let page_after = async |status: Option<MessageStatus>, limit: usize| -> Vec<String> {
        let page = outbox
            .list_messages(ListMessages {
                status,
                name: None,
                limit,
                after: Some(ListCursor {
                    created_at: t0() + chrono::Duration::milliseconds(20_000),
                    id: "r0200001".to_owned(),
                }),
            })
            .await
            .unwrap();
        page.messages.into_iter().map(|m| m.id).collect()
    };
    let before = scans().await;
    assert_eq!(
        page_after(Some(MessageStatus::Delivered), 4).await,
        ["r0200002", "r0200010", "r0200011", "r0200012"]
    );
    let after = scans().await;
    assert_eq!(after.0, before.0, "the listing scanned the table");
    assert!(
        after.1 > before.1,
        "the listing did not use the creation index"
    );
    // Without a status, claimed rows are read from their own index beside
    // it (migration 0011), and the table is still not scanned.
    assert_eq!(page_after(None, 2).await, ["r0200002", "r0200010"]);
    let unfiltered = scans().await;
    assert_eq!(unfiltered.0, after.0, "the listing scanned the table");
    assert!(
        unfiltered.1 > after.1,
        "the listing did not use the creation index"
    );
}

/// Both arms of the claim are read from their partial indexes, with a
/// hundred thousand settled rows in the table and fresh statistics.
#[cfg(feature = "inspect-statements")]
#[tokio::test]
async fn claim_is_answered_from_the_partial_indexes() {
    let pool = pool().await;
    let table = unique("plan");
    let outbox = store(&pool, &table, SettlementMode::default()).await;
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {table} (id, kind, name, payload, status, max_attempts, available_at, \
           created_at, updated_at, delivered_at) \
         SELECT 's' || i, 'event', 'settled', '{{}}', 'delivered', 5, $1, $1, $1, $1 \
         FROM generate_series(1, 100000) AS i"
    )))
    .bind(t0())
    .execute(&pool)
    .await
    .unwrap();
    for i in 0..3 {
        outbox
            .enqueue(event(&format!("p{i}"), i, t0()))
            .await
            .unwrap();
    }
    sqlx::query(AssertSqlSafe(format!("ANALYZE {table}")))
        .execute(&pool)
        .await
        .unwrap();

    // Checked in the plan made for these values and in the generic one that
    // a cached statement ends up with.
    let mut conn = pool.acquire().await.unwrap();
    sqlx::raw_sql(AssertSqlSafe(format!(
        "PREPARE claim_plan {CLAIM_PARAMETERS} AS {}; \
         PREPARE settle_plan (text[], text[], text[], timestamptz[], bigint[], \
           timestamptz[], text[]) AS {}; \
         PREPARE delete_plan (text[], text[], timestamptz[]) AS {}",
        claim_function_query(&table),
        settle_function_queries(&table).1,
        settle_function_queries(&table).0
    )))
    .execute(&mut *conn)
    .await
    .unwrap();
    // On the caller's clock, and on the server's (a NULL `now`). The
    // function plans its claim generic; the custom plan is checked too, so
    // that the plan does not hang on the sequential scans the function
    // prices out.
    let runs = [
        (
            "claim_plan(10, 36, '2030-01-01 12:00:00+00', 30000000, 25, true)",
            "array['deliver', 'deliver'], array['p0', 'p1'], array['t', 't'], \
             array['2030-01-01 12:00:00+00', '2030-01-01 12:00:00+00']::timestamptz[], \
             array[NULL, NULL]::bigint[], array[NULL, NULL]::timestamptz[], \
             array[NULL, NULL]::text[]",
        ),
        (
            "claim_plan(10, 36, NULL, 30000000, 25, true)",
            "array['deliver', 'deliver'], array['p0', 'p1'], array['t', 't'], \
             array[NULL, NULL]::timestamptz[], array[NULL, NULL]::bigint[], \
             array[NULL, NULL]::timestamptz[], array[NULL, NULL]::text[]",
        ),
    ];
    for ((claim_run, settle_args), mode) in runs
        .iter()
        .flat_map(|args| ["force_custom_plan", "force_generic_plan"].map(|mode| (*args, mode)))
    {
        let explain =
            |execute: &str| format!("SET plan_cache_mode = {mode}; EXPLAIN EXECUTE {execute}");
        let plan = |rows: Vec<sqlx::postgres::PgRow>| {
            rows.iter()
                .map(|row| row.get::<String, _>(0))
                .collect::<Vec<_>>()
                .join("\n")
        };
        let claim = plan(
            sqlx::raw_sql(AssertSqlSafe(explain(claim_run)))
                .fetch_all(&mut *conn)
                .await
                .unwrap(),
        );
        println!("claim, {mode}:\n{claim}");
        assert!(
            claim.contains(&format!("Index Scan using {table}_pending")),
            "{claim}"
        );
        assert!(
            claim.contains(&format!("Index Scan using {table}_claimed")),
            "{claim}"
        );
        assert!(!claim.contains(&format!("Seq Scan on {table}")), "{claim}");

        // The fenced write finds each row by primary key, so a batch costs
        // the same however many claims are out; so does the batch of
        // deletions only.
        let delete_args = "array['p0', 'p1'], array['t', 't'], array[NULL, NULL]::timestamptz[]";
        for (name, args) in [("settle_plan", settle_args), ("delete_plan", delete_args)] {
            let settle = plan(
                sqlx::raw_sql(AssertSqlSafe(explain(&format!("{name}({args})"))))
                    .fetch_all(&mut *conn)
                    .await
                    .unwrap(),
            );
            println!("{name}, {mode}:\n{settle}");
            assert!(
                settle.contains(&format!("Index Scan using {table}_pkey")),
                "{settle}"
            );
            assert!(settle.contains("Index Cond: (id = "), "{settle}");
            assert!(!settle.contains(&format!("{table}_claimed")), "{settle}");
            assert!(
                !settle.contains(&format!("Seq Scan on {table}")),
                "{settle}"
            );
        }
    }
    drop(conn);

    let batch = outbox
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: 10,
            now: t0(),
            lease: LEASE,
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
        })
        .await
        .unwrap();
    let ids: Vec<_> = batch.claimed.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, ["p0", "p1", "p2"]);
}

/// Every claim statement run without JIT compilation off is priced below
/// PostgreSQL's default `jit_above_cost`, with a keyed backlog that makes
/// the claim walk and fall back to its key lookup: compiling a claim takes
/// longer than running it. The key lookup is priced above it, which is
/// why the store runs it with JIT off.
#[cfg(feature = "inspect-statements")]
#[tokio::test]
async fn no_claim_statement_is_priced_for_jit_compilation() {
    let pool = pool().await;
    let table = unique("jit");
    let outbox = store(&pool, &table, SettlementMode::default()).await;
    // Three keys with long queues, and keyless messages beside them.
    insert_and_analyze(
        &pool,
        &table,
        format!(
            "INSERT INTO {table} (id, kind, name, payload, max_attempts, available_at, \
               created_at, updated_at, ordering_key) \
             SELECT 'm' || i, 'event', 'backlog', '{{}}', 5, $1, $1, $1, \
               CASE WHEN i % 4 = 0 THEN NULL ELSE 'k' || (i % 4) END \
             FROM generate_series(1, 40000) AS i"
        ),
    )
    .await;
    let mut conn = pool.acquire().await.unwrap();
    sqlx::raw_sql("RESET jit_above_cost")
        .execute(&mut *conn)
        .await
        .unwrap();
    let jit_above: f64 = sqlx::query_scalar("SELECT current_setting('jit_above_cost')::float8")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    let cost = |plan: serde_json::Value| plan[0]["Plan"]["Total Cost"].as_f64().unwrap();
    // The claim the `claim_heads` function runs, with its arguments as
    // parameters, for this table.
    let claim_heads = function_query(
        include_str!("../migrations/postgres/0009_claim_heads.sql"),
        0,
        &table,
        &[
            ("p_ids", "$1"),
            ("p_now", "$2"),
            ("p_lease", "$3"),
            ("p_cap", "$4"),
            ("p_block", "$5"),
        ],
    );
    for limit in [1, 100, 1000, 4160] {
        let statements = [
            (
                "(text[], timestamptz, bigint, bigint, boolean)",
                claim_heads.clone(),
                "array['m1', 'm2', 'm3'], '2030-01-01 12:00:00+00', 30000000, 25, true",
            ),
            (
                "(timestamptz, text[])",
                outbox.locked_claim_statement(limit, 30_000_000, 25, true),
                "'2030-01-01 12:00:00+00', array['k1', 'k2', 'k3']",
            ),
        ];
        for (i, (types, statement, args)) in statements.into_iter().enumerate() {
            let name = format!("jit_{limit}_{i}");
            sqlx::raw_sql(AssertSqlSafe(format!(
                "PREPARE {name} {types} AS {statement}"
            )))
            .execute(&mut *conn)
            .await
            .unwrap();
            for mode in ["force_custom_plan", "force_generic_plan"] {
                sqlx::raw_sql(AssertSqlSafe(format!("SET plan_cache_mode = {mode}")))
                    .execute(&mut *conn)
                    .await
                    .unwrap();
                let plan: serde_json::Value = sqlx::query_scalar(AssertSqlSafe(format!(
                    "EXPLAIN (FORMAT JSON) EXECUTE {name}({args})"
                )))
                .fetch_one(&mut *conn)
                .await
                .unwrap();
                let cost = cost(plan);
                println!("limit {limit}, statement {i}, {mode}: cost {cost}");
                assert!(
                    cost < jit_above,
                    "limit {limit}, statement {i}, {mode}: cost {cost} >= {jit_above}:\n{statement}"
                );
            }
        }
    }
    // The key lookup runs, and is right, with JIT off.
    let plan: serde_json::Value = sqlx::query_scalar(AssertSqlSafe(format!(
        "EXPLAIN (FORMAT JSON) {}",
        outbox
            .key_heads_statement(100, true)
            .replace("$1", "'2030-01-01 12:00:00+00'")
    )))
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    println!("key lookup: cost {}", cost(plan));
    let heads: Vec<(String, i64)> = sqlx::query_as(AssertSqlSafe(
        outbox
            .key_heads_statement(100, true)
            .replace("$1", "'2030-01-01 12:00:00+00'"),
    ))
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    let keys: Vec<_> = heads.into_iter().map(|(key, _)| key).collect();
    assert_eq!(keys, ["k1", "k2", "k3"]);
}

/// The claim's first pass is planned once per connection, whatever its
/// limit: its function forces a generic plan. A plan for reuse cannot see
/// the limit and is costed for a tenth of the table, and with any
/// parameter PostgreSQL would plan the first five runs afresh; the function
/// also prices sequential scans out, so the generic plan reads the partial
/// indexes and goes to the claimed rows by address, on a large backlog too.
#[tokio::test]
async fn the_claim_function_plans_once_for_every_limit() {
    let pool = pool().await;
    let table = unique("reuse");
    store(&pool, &table, SettlementMode::default()).await;
    // A backlog: what a plan that cannot see the limit is costed for.
    insert_and_analyze(
        &pool,
        &table,
        format!(
            "INSERT INTO {table} (id, kind, name, payload, max_attempts, available_at, \
               created_at, updated_at) \
             SELECT 'm' || i, 'event', 'backlog', '{{}}', 5, $1, $1, $1 \
             FROM generate_series(1, 50000) AS i"
        ),
    )
    .await;
    let mut tx = pool.begin().await.unwrap();
    // The function's own settings, applied here as it applies them.
    let settings: Vec<String> =
        sqlx::query_scalar("SELECT unnest(proconfig) FROM pg_proc WHERE oid = $1::regproc")
            .bind(format!("\"{table}_claim\""))
            .fetch_all(&mut *tx)
            .await
            .unwrap();
    assert_eq!(
        settings,
        [
            "plan_cache_mode=force_generic_plan",
            "enable_seqscan=off",
            "jit=off"
        ]
    );
    for setting in &settings {
        let (name, value) = setting.split_once('=').unwrap();
        sqlx::raw_sql(AssertSqlSafe(format!("SET LOCAL {name} = {value}")))
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    sqlx::raw_sql(AssertSqlSafe(format!(
        "PREPARE claim {CLAIM_PARAMETERS} AS {}",
        claim_function_query(&table)
    )))
    .execute(&mut *tx)
    .await
    .unwrap();
    let mut claimed = 0;
    for limit in [1, 7, 10, 100, 500] {
        let rows = sqlx::raw_sql(AssertSqlSafe(format!(
            "EXECUTE claim({limit}, 16, '2030-01-01 12:00:00+00', 30000000, 25, true)"
        )))
        .fetch_all(&mut *tx)
        .await
        .unwrap();
        assert_eq!(rows.len(), limit, "limit {limit}");
        claimed += limit;
    }
    let (generic, custom): (i64, i64) = sqlx::query_as(
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = 'claim'",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert_eq!((generic, custom), (5, 0));
    let plan = sqlx::raw_sql(
        "EXPLAIN EXECUTE claim(10, 36, '2030-01-01 12:00:00+00', 30000000, 25, true)",
    )
    .fetch_all(&mut *tx)
    .await
    .unwrap()
    .iter()
    .map(|row| row.get::<String, _>(0))
    .collect::<Vec<_>>()
    .join("\n");
    println!("{plan}");
    assert!(
        plan.contains(&format!("Index Scan using {table}_pending_keyless")),
        "{plan}"
    );
    assert!(plan.contains(&format!("Tid Scan on {table}")), "{plan}");
    assert!(!plan.contains("Seq Scan"), "{plan}");
    let still_pending: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM {table} WHERE status = 'pending'"
    )))
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert_eq!(still_pending as usize, 50_000 - claimed);
    tx.rollback().await.unwrap();
}

/// NOTIFY goes out when the enqueueing transaction commits, never on
/// rollback. Notifications reach a listener in commit order, so a marker
/// sent after the rollback must be the next thing it sees. (A drain waits
/// for a wake-up: it armed; see the test after this one.)
#[tokio::test]
async fn enqueue_notifies_at_commit_only() {
    let pool = pool().await;
    let outbox = store(&pool, &unique("notify"), SettlementMode::default()).await;
    let mut listener = PgListener::connect(&database_url()).await.unwrap();
    listener.listen(outbox.channel()).await.unwrap();
    let wakeups = outbox.wakeups().unwrap();
    let arm = wakeups
        .arm()
        .expect("PostgreSQL wakes only drains that armed");
    assert_eq!(arm.arm().await.unwrap(), Armed::Yes);

    let mut tx = pool.begin().await.unwrap();
    outbox
        .enqueue_in(&mut tx, event("a", 1, t0()))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    sqlx::query("SELECT pg_notify($1, 'marker')")
        .bind(outbox.channel())
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(listener.recv().await.unwrap().payload(), "marker");

    let mut tx = pool.begin().await.unwrap();
    outbox
        .enqueue_in(&mut tx, event("b", 1, t0()))
        .await
        .unwrap();
    outbox
        .enqueue_in(&mut tx, event("c", 1, t0()))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    sqlx::query("SELECT pg_notify($1, 'marker')")
        .bind(outbox.channel())
        .execute(&pool)
        .await
        .unwrap();
    // One notification for the transaction (PostgreSQL folds duplicates).
    assert_eq!(listener.recv().await.unwrap().payload(), "");
    assert_eq!(listener.recv().await.unwrap().payload(), "marker");

    // Turned off, enqueue sends nothing.
    assert_eq!(arm.arm().await.unwrap(), Armed::Yes);
    let quiet = PostgresOutbox::builder(pool.clone())
        .table(&outbox.table().to_string())
        .unwrap()
        .notify(false)
        .build();
    quiet.enqueue(event("d", 1, t0())).await.unwrap();
    sqlx::query("SELECT pg_notify($1, 'marker')")
        .bind(outbox.channel())
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(listener.recv().await.unwrap().payload(), "marker");
}

/// Enqueues notify only when a drain armed, once per arming; a drain
/// cannot arm while an enqueue is between its insert and its commit; under
/// REPEATABLE READ and SERIALIZABLE every enqueue notifies, and a flag
/// changed after the transaction's snapshot fails nothing. On a table in a
/// schema of its own, whose flag table and function are named after it.
#[tokio::test]
async fn enqueues_notify_only_when_a_drain_armed() {
    let pool = pool().await;
    let table = format!("{}.events", unique("armed"));
    let outbox = store(&pool, &table, SettlementMode::default()).await;
    let mut listener = PgListener::connect(&database_url()).await.unwrap();
    listener.listen(outbox.channel()).await.unwrap();
    let wakeups = outbox.wakeups().unwrap();
    let arm = wakeups.arm().unwrap();
    let mut n = 0;
    let mut enqueue = || {
        n += 1;
        event(&format!("e{n}"), n, t0())
    };
    // What the listener heard up to a marker sent now.
    let heard = async |listener: &mut PgListener| {
        sqlx::query("SELECT pg_notify($1, 'marker')")
            .bind(outbox.channel())
            .execute(&pool)
            .await
            .unwrap();
        let mut heard = Vec::new();
        loop {
            let payload = listener.recv().await.unwrap().payload().to_owned();
            if payload == "marker" {
                return heard;
            }
            heard.push(payload);
        }
    };

    // Nobody armed (the flag's row does not even exist yet): silence.
    outbox.enqueue(enqueue()).await.unwrap();
    assert!(heard(&mut listener).await.is_empty());

    // Armed: the first enqueue notifies, the next ones do not.
    assert_eq!(arm.arm().await.unwrap(), Armed::Yes);
    for _ in 0..5 {
        outbox.enqueue(enqueue()).await.unwrap();
    }
    assert_eq!(heard(&mut listener).await, [""]);

    // An enqueue in flight keeps a drain from arming until it ends.
    let mut tx = pool.begin().await.unwrap();
    outbox.enqueue_in(&mut tx, enqueue()).await.unwrap();
    assert_eq!(arm.arm().await.unwrap(), Armed::Busy);
    tx.commit().await.unwrap();
    assert!(heard(&mut listener).await.is_empty());
    assert_eq!(arm.arm().await.unwrap(), Armed::Yes);
    // A rolled-back enqueue leaves the drain armed.
    let mut tx = pool.begin().await.unwrap();
    outbox.enqueue_in(&mut tx, enqueue()).await.unwrap();
    tx.rollback().await.unwrap();
    outbox.enqueue(enqueue()).await.unwrap();
    assert_eq!(heard(&mut listener).await, [""]);

    for level in ["REPEATABLE READ", "SERIALIZABLE"] {
        assert_eq!(arm.arm().await.unwrap(), Armed::Yes);
        let mut tx = pool.begin().await.unwrap();
        sqlx::query(AssertSqlSafe(format!(
            "SET TRANSACTION ISOLATION LEVEL {level}"
        )))
        .execute(&mut *tx)
        .await
        .unwrap();
        // The snapshot is taken here, while the flag is set; another
        // enqueue clears it (and notifies) before this one runs.
        sqlx::query("SELECT 1").execute(&mut *tx).await.unwrap();
        outbox.enqueue(enqueue()).await.unwrap();
        outbox.enqueue_in(&mut tx, enqueue()).await.unwrap();
        outbox.enqueue_in(&mut tx, enqueue()).await.unwrap();
        tx.commit().await.unwrap();
        // Not armed any more, yet it notified, once for its transaction.
        assert_eq!(heard(&mut listener).await, ["", ""], "{level}");
    }
    assert_eq!(outbox.stats(t0()).await.unwrap().pending, n - 1);
}

#[tokio::test]
async fn wakeups_listen_reconnect_and_stop_with_the_last_receiver() {
    let name = unique("wake");
    let pool = pool_named(&name).await;
    let outbox = store(&pool, &name, SettlementMode::default()).await;
    let bound = Duration::from_secs(10);
    let mut wakeups = outbox.wakeups().expect("a runtime is running");
    // Once listening, it wakes once: anything sent before was missed.
    assert!(
        tokio::time::timeout(bound, wakeups.changed())
            .await
            .unwrap()
    );
    let listening = "query LIKE 'LISTEN%'";
    assert_eq!(backends(&pool, &name, listening).await.len(), 1);

    // A committed enqueue from another process wakes it, once it armed.
    let arm = wakeups.arm().unwrap();
    assert_eq!(arm.arm().await.unwrap(), Armed::Yes);
    let other_pool = pool_named("outbox-tests-other").await;
    let other = PostgresOutbox::builder(other_pool)
        .table(&name)
        .unwrap()
        .build();
    other.enqueue(event("a", 1, t0())).await.unwrap();
    assert!(
        tokio::time::timeout(bound, wakeups.changed())
            .await
            .unwrap()
    );

    // The listener's connection is killed: it reconnects and wakes once.
    for pid in backends(&pool, &name, listening).await {
        sqlx::query("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .execute(&pool)
            .await
            .unwrap();
    }
    assert!(
        tokio::time::timeout(bound, wakeups.changed())
            .await
            .unwrap()
    );
    eventually("the listener listens again", || async {
        backends(&pool, &name, listening).await.len() == 1
    })
    .await;
    assert_eq!(arm.arm().await.unwrap(), Armed::Yes);
    other.enqueue(event("b", 1, t0())).await.unwrap();
    assert!(
        tokio::time::timeout(bound, wakeups.changed())
            .await
            .unwrap()
    );

    // A second receiver shares the listener; dropping every receiver stops it.
    let second = outbox.wakeups().unwrap();
    assert_eq!(backends(&pool, &name, listening).await.len(), 1);
    drop(wakeups);
    drop(second);
    eventually("the listener has stopped", || async {
        backends(&pool, &name, listening).await.is_empty()
    })
    .await;
    // Subscribing again starts a new one.
    let mut again = outbox.wakeups().unwrap();
    assert!(tokio::time::timeout(bound, again.changed()).await.unwrap());
}

/// Concurrent claimers skip each other's rows: every message is claimed
/// exactly once.
#[tokio::test]
async fn concurrent_claims_never_take_the_same_message() {
    let pool = pool().await;
    let table = unique("skip");
    let outbox = store(&pool, &table, SettlementMode::default()).await;
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {table} (id, kind, name, payload, max_attempts, available_at, created_at, \
           updated_at) \
         SELECT 'm' || i, 'event', 'n', '{{}}', 5, $1, $1, $1 FROM generate_series(1, 600) AS i"
    )))
    .bind(t0())
    .execute(&pool)
    .await
    .unwrap();
    let claimers = (0..6).map(|_| {
        let outbox = outbox.clone();
        tokio::spawn(async move {
            let mut ids = Vec::new();
            loop {
                let batch = outbox
                    .claim_batch(ClaimBatch {
                        on_dead_letter: Default::default(),
                        limit: 7,
                        now: t0(),
                        lease: LEASE,
                        max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
                    })
                    .await
                    .unwrap();
                if batch.is_empty() {
                    return ids;
                }
                ids.extend(batch.claimed.into_iter().map(|m| m.id));
            }
        })
    });
    let mut all: Vec<String> = Vec::new();
    for claimer in claimers.collect::<Vec<_>>() {
        all.extend(claimer.await.unwrap());
    }
    let total = all.len();
    all.sort();
    all.dedup();
    assert_eq!((total, all.len()), (600, 600));
}

#[tokio::test]
async fn settlement_statements_must_fit_the_pool() {
    let pool = pool().await;
    for statements in [0, 5] {
        let error = PostgresOutbox::builder(pool.clone())
            .settlement_statements(statements)
            .unwrap_err();
        assert!(
            matches!(
                error,
                Error::InvalidInput {
                    field: "settlement_statements",
                    ..
                }
            ),
            "{error}"
        );
        assert!(error.to_string().contains("max_connections (4)"), "{error}");
    }
    PostgresOutbox::builder(pool)
        .settlement_statements(4)
        .unwrap();
}

/// Settlement statements in flight together still apply each message's
/// writes in call order: a delivery and a release of one claim, sent
/// together, deliver it and refuse the release, for every message.
#[tokio::test]
async fn concurrent_settlement_statements_keep_each_messages_writes_in_order() {
    let pool = pool().await;
    let table = unique("inflight");
    let outbox = PostgresOutbox::builder(pool.clone())
        .table(&table)
        .unwrap()
        .settlement_statements(3)
        .unwrap()
        .caller_clock(true)
        .build();
    outbox.setup().await.unwrap();
    for n in 0..300 {
        outbox
            .enqueue(event(&format!("m{n}"), n, t0()))
            .await
            .unwrap();
    }
    let batch = outbox
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: 300,
            now: t0(),
            lease: LEASE,
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
        })
        .await
        .unwrap();
    assert_eq!(batch.claimed.len(), 300);
    let now = t0() + secs(1);
    let writes = batch.claimed.iter().map(|message| {
        let outbox = outbox.clone();
        let (id, claim_token) = (message.id.clone(), message.claim_token.clone());
        async move {
            let deliver = outbox.mark_delivered(MarkDelivered {
                id: id.clone(),
                claim_token: claim_token.clone(),
                now,
                delete: false,
            });
            let release = outbox.release_claim(outbox::ReleaseClaim {
                id,
                claim_token,
                now,
            });
            let (delivered, released) = futures_util::future::join(deliver, release).await;
            (
                delivered.is_ok(),
                released.is_err_and(|e| e.is_claim_lost()),
            )
        }
    });
    let results = futures_util::future::join_all(writes).await;
    assert!(results.iter().all(|r| *r == (true, true)), "{results:?}");
    let stats = outbox.stats(now).await.unwrap();
    assert_eq!((stats.delivered, stats.pending), (300, 0));
}

/// A backend killed in the middle of a claim or a settlement is a transient
/// store error, never a claim loss; the pool recovers and nothing is lost.
#[tokio::test]
async fn killed_connections_are_transient_and_the_pool_recovers() {
    let name = unique("killed");
    let pool = pool_named(&name).await;
    let outbox = store(&pool, &name, SettlementMode::default()).await;
    let admin = pool_named("outbox-tests-admin").await;
    for i in 0..3 {
        outbox
            .enqueue(event(&format!("m{i}"), i, t0()))
            .await
            .unwrap();
    }
    let kill_waiting = || async {
        let waiting = backends(&admin, &name, "wait_event_type = 'Lock'").await;
        for pid in &waiting {
            sqlx::query("SELECT pg_terminate_backend($1)")
                .bind(pid)
                .execute(&admin)
                .await
                .unwrap();
        }
        !waiting.is_empty()
    };

    // A claim stuck behind a table lock, killed.
    let mut locker = admin.begin().await.unwrap();
    sqlx::query(AssertSqlSafe(format!(
        "LOCK TABLE {name} IN ACCESS EXCLUSIVE MODE"
    )))
    .execute(&mut *locker)
    .await
    .unwrap();
    let claim = tokio::spawn({
        let outbox = outbox.clone();
        async move {
            outbox
                .claim_batch(ClaimBatch {
                    on_dead_letter: Default::default(),
                    limit: 2,
                    now: t0(),
                    lease: LEASE,
                    max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
                })
                .await
        }
    });
    eventually("the claim waits for the lock", kill_waiting).await;
    let e = claim.await.unwrap().unwrap_err();
    assert!(
        matches!(
            e,
            Error::Store {
                operation: "claim_batch",
                ..
            }
        ),
        "{e:?}"
    );
    locker.rollback().await.unwrap();

    let batch = outbox
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: 2,
            now: t0(),
            lease: LEASE,
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
        })
        .await
        .unwrap();
    assert_eq!(batch.claimed.len(), 2);
    let first = batch.claimed[0].clone();

    // A settlement stuck behind a row lock, killed: not a claim loss.
    let mut locker = admin.begin().await.unwrap();
    sqlx::query(AssertSqlSafe(format!(
        "SELECT 1 FROM {name} WHERE id = $1 FOR UPDATE"
    )))
    .bind(&first.id)
    .execute(&mut *locker)
    .await
    .unwrap();
    let settle = tokio::spawn({
        let (outbox, first) = (outbox.clone(), first.clone());
        async move {
            outbox
                .mark_delivered(MarkDelivered {
                    delete: false,
                    id: first.id,
                    claim_token: first.claim_token,
                    now: t0() + secs(1),
                })
                .await
        }
    });
    eventually("the settlement waits for the row", kill_waiting).await;
    let e = settle.await.unwrap().unwrap_err();
    assert!(
        matches!(
            e,
            Error::Store {
                operation: "mark_delivered",
                ..
            }
        ),
        "{e:?}"
    );
    assert!(!e.is_claim_lost());
    locker.rollback().await.unwrap();

    // Idle connections killed behind the pool's back.
    for pid in backends(&admin, &name, "state = 'idle'").await {
        sqlx::query("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .execute(&admin)
            .await
            .unwrap();
    }
    let retry = MarkDelivered {
        delete: false,
        id: first.id.clone(),
        claim_token: first.claim_token.clone(),
        now: t0() + secs(2),
    };
    if let Err(e) = outbox.mark_delivered(retry.clone()).await {
        assert!(matches!(e, Error::Store { .. }), "{e:?}");
        outbox.mark_delivered(retry).await.unwrap();
    }
    let stats = outbox.stats(t0() + secs(2)).await.unwrap();
    assert_eq!((stats.delivered, stats.claimed, stats.pending), (1, 1, 1));
}

#[tokio::test]
async fn payloads_round_trip_as_json_and_bad_text_is_refused() {
    let pool = pool().await;
    let outbox = store(&pool, &unique("json"), SettlementMode::default()).await;
    let now = t0() + chrono::Duration::microseconds(654_321);
    let json = r#"{"z":1,"a":[true,null,"é"],"nested":{"b":2,"a":1}}"#;
    let message = NewMessage::new(
        outbox::MessageKind::Job,
        "exact",
        outbox::Payload::from_json(json).unwrap(),
    )
    .with_id("exact")
    .with_max_attempts(u32::MAX)
    .at(now);
    outbox.enqueue(message).await.unwrap();
    let stored = outbox.get_message("exact").await.unwrap();
    // jsonb may reorder keys; the value is the same.
    assert_eq!(
        stored.payload.to_value(),
        serde_json::from_str::<serde_json::Value>(json).unwrap()
    );
    assert_eq!(stored.created_at, now);
    assert_eq!(stored.max_attempts, u32::MAX);

    assert_eq!(
        outbox.enqueue(event("exact", 2, t0())).await.unwrap(),
        Enqueued::AlreadyExists("exact".to_owned())
    );
    let nul = NewMessage::new(
        outbox::MessageKind::Event,
        "nul",
        outbox::Payload::from_json(r#"{"s":"\u0000"}"#).unwrap(),
    );
    match outbox.enqueue(nul).await {
        Err(Error::InvalidInput { field, reason }) => {
            assert_eq!(field, "payload");
            assert!(reason.contains("PostgreSQL"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn messages_out_of_attempts_are_dead_lettered_by_the_claim() {
    let pool = pool().await;
    let outbox = store(&pool, &unique("abandon"), SettlementMode::default()).await;
    outbox
        .enqueue(event("once", 1, t0()).with_max_attempts(1))
        .await
        .unwrap();
    outbox
        .enqueue(event("fresh", 2, t0() + secs(1)))
        .await
        .unwrap();
    let first = outbox
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: 1,
            now: t0() + secs(1),
            lease: LEASE,
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
        })
        .await
        .unwrap();
    assert_eq!(first.claimed[0].id, "once");
    // Its lease runs out unsettled; the next claim gives up on it.
    let later = t0() + secs(31);
    let second = outbox
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: 5,
            now: later,
            lease: LEASE,
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
        })
        .await
        .unwrap();
    assert_eq!(second.claimed.len(), 1);
    assert_eq!(second.claimed[0].id, "fresh");
    assert_eq!(second.dead_lettered.len(), 1);
    let dead = &second.dead_lettered[0];
    assert_eq!(
        (dead.id.as_str(), dead.status, dead.attempts),
        ("once", MessageStatus::DeadLettered, 1)
    );
    assert_eq!(dead.claim_token, None);
    assert_eq!(dead.updated_at, later);
    let record = dead.last_error.clone().unwrap();
    assert!(
        record.type_name.ends_with("AbandonedClaimError"),
        "{record:?}"
    );
    assert_eq!(
        outbox.get_message("once").await.unwrap().last_error,
        Some(record)
    );
    let stale = outbox
        .mark_delivered(MarkDelivered {
            delete: false,
            id: "once".into(),
            claim_token: first.claimed[0].claim_token.clone(),
            now: later,
        })
        .await
        .unwrap_err();
    match stale {
        Error::Claim(e) => assert_eq!(e.reason, ClaimLoss::NotClaimed),
        other => panic!("{other:?}"),
    }
    let row = sqlx::query(AssertSqlSafe(format!(
        "SELECT status FROM {} WHERE id = 'once'",
        outbox.table().quoted()
    )))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(row.get::<String, _>(0), "dead_lettered");
}

/// Input PostgreSQL would refuse is refused before it is sent, so the
/// caller's transaction goes on and commits its business rows.
#[tokio::test]
async fn input_postgres_refuses_is_refused_without_aborting_the_transaction() {
    let pool = pool().await;
    let outbox = store(&pool, &unique("refused"), SettlementMode::default()).await;
    let (orders, create_orders, insert_order) = orders();
    sqlx::query(AssertSqlSafe(create_orders))
        .execute(&pool)
        .await
        .unwrap();
    let raw = |json: &str| {
        NewMessage::new(
            outbox::MessageKind::Event,
            "refused",
            outbox::Payload::from_json(json).unwrap(),
        )
    };
    let mut tx = pool.begin().await.unwrap();
    sqlx::query(AssertSqlSafe(insert_order.clone()))
        .bind(1_i64)
        .execute(&mut *tx)
        .await
        .unwrap();
    let far_past = chrono::DateTime::<chrono::Utc>::MIN_UTC;
    let cases = [
        (raw("{}").with_id("nul\0id"), "id"),
        (
            NewMessage::new(
                outbox::MessageKind::Event,
                "nul\0name",
                serde_json::json!({}).into(),
            ),
            "name",
        ),
        (raw(r#"{"s":"a\u0000b"}"#), "payload"),
        (raw(r#"{"k\u0000":1}"#), "payload"),
        (raw(r#"["\ud800"]"#), "payload"),
        (raw(r#"["\udc00\ud800"]"#), "payload"),
        (raw("{}").at(far_past), "now"),
        (raw("{}").available_at(far_past), "available_at"),
    ];
    for (message, field) in cases {
        match outbox.enqueue_in(&mut tx, message).await {
            Err(Error::InvalidInput { field: f, reason }) => {
                assert_eq!(f, field);
                assert!(reason.contains("PostgreSQL"), "{reason}");
            }
            other => panic!("{field}: {other:?}"),
        }
    }
    // Escaped backslashes and whole surrogate pairs are stored as they are.
    let kept = outbox
        .enqueue_in(
            &mut tx,
            raw(r#"{"path":"C:\\u0000","pair":"\ud83d\udce6"}"#).with_id("kept"),
        )
        .await
        .unwrap();
    assert!(kept.is_inserted());
    sqlx::query(AssertSqlSafe(insert_order))
        .bind(2_i64)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let committed: i64 =
        sqlx::query_scalar(AssertSqlSafe(format!("SELECT count(*) FROM {orders}")))
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(committed, 2);
    let stored = outbox.get_message("kept").await.unwrap().payload.to_value();
    assert_eq!(stored["path"], "C:\\u0000");
    assert_eq!(stored["pair"], "📦");
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

/// On the server's clock, an operator's requeue and retry-now make a
/// message due by the server's clock, whatever the operator's says: one an
/// hour ahead does not leave it waiting an hour.
#[tokio::test]
async fn admin_changes_follow_the_servers_clock() {
    let pool = pool().await;
    let outbox = server_clock_store(&pool, &unique("admin_clock")).await;
    let real = chrono::Utc::now;
    let hour = chrono::Duration::hours(1);
    let claim = |now| ClaimBatch {
        on_dead_letter: Default::default(),
        limit: 10,
        now,
        lease: LEASE,
        max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
    };
    outbox
        .enqueue(event("dead", 1, real()).with_id("dead"))
        .await
        .unwrap();
    let claimed = outbox.claim_batch(claim(real())).await.unwrap().claimed;
    outbox
        .mark_failed(outbox::MarkFailed {
            id: "dead".into(),
            claim_token: claimed[0].claim_token.clone(),
            error: outbox::ErrorRecord::new("Test", "gave up"),
            dead_letter: true,
            now: real(),
            retry_at: None,
        })
        .await
        .unwrap();
    let requeue = outbox::RequeueDeadLetters {
        id: Some("dead".into()),
        name: None,
        now: real() + hour,
    };
    assert_eq!(outbox.requeue_dead_letters(requeue).await.unwrap(), 1);
    let again = outbox.claim_batch(claim(real())).await.unwrap().claimed;
    assert_eq!(again.len(), 1, "due by the server's clock once requeued");

    // Retry-now of a message waiting for its retry, asked an hour ahead.
    outbox
        .enqueue(
            event("later", 2, real())
                .with_id("later")
                .available_at(real() + chrono::Duration::days(1)),
        )
        .await
        .unwrap();
    outbox
        .retry_now(outbox::RetryNow {
            id: "later".into(),
            now: real() + hour,
        })
        .await
        .unwrap();
    let later = outbox.claim_batch(claim(real())).await.unwrap().claimed;
    assert_eq!(later.len(), 1, "due by the server's clock after retry-now");
}

/// On the server's clock, callers an hour apart agree on every lease: the
/// one behind can claim what is due, the one ahead cannot take a live
/// lease over, renewals and settlements judge liveness by the server, and
/// each caller gets its lease back as a deadline on its own clock.
#[tokio::test]
async fn leases_follow_the_servers_clock_whatever_the_callers_say() {
    let pool = pool().await;
    let outbox = server_clock_store(&pool, &unique("server_clock")).await;
    let real = chrono::Utc::now;
    let hour = chrono::Duration::hours(1);
    let lease = Duration::from_secs(30);

    // Enqueued by a caller an hour ahead, with no `available_at`: due on the
    // server's clock at once, not in an hour.
    outbox
        .enqueue(event("m", 1, real() + hour).with_id("m"))
        .await
        .unwrap();
    let behind = real() - hour;
    let batch = outbox
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: 10,
            now: behind,
            lease,
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
        })
        .await
        .unwrap();
    assert_eq!(batch.claimed.len(), 1, "due by the server's clock");
    let claimed = &batch.claimed[0];
    // The caller's deadline is on its own clock...
    assert_eq!(claimed.claimed_at, behind);
    assert_eq!(
        claimed.locked_until,
        behind + chrono::Duration::from_std(lease).unwrap()
    );
    // ...and the row holds the server's.
    let stored = outbox.get_message("m").await.unwrap();
    let server_until = stored.locked_until.unwrap();
    let expected = real() + chrono::Duration::from_std(lease).unwrap();
    assert!(
        (server_until - expected).num_seconds().abs() < 10,
        "stored lease {server_until} is the server's, near {expected}"
    );

    // A caller an hour ahead sees no expired lease to take over.
    let ahead = real() + hour;
    let stolen = outbox
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: 10,
            now: ahead,
            lease,
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
        })
        .await
        .unwrap();
    assert!(stolen.is_empty(), "{stolen:?}");
    let stats = outbox.stats(ahead).await.unwrap();
    assert_eq!((stats.live_claims, stats.expired_claims), (1, 0));

    // The owner renews with a clock an hour ahead: still live on the server.
    let renewed = outbox
        .renew_claim(outbox::RenewClaim {
            id: "m".into(),
            claim_token: claimed.claim_token.clone(),
            now: ahead,
            lease,
        })
        .await
        .unwrap();
    assert_eq!(renewed, ahead + chrono::Duration::from_std(lease).unwrap());
    outbox
        .mark_delivered(MarkDelivered {
            delete: false,
            id: "m".into(),
            claim_token: claimed.claim_token.clone(),
            now: ahead,
        })
        .await
        .unwrap();
    let delivered = outbox.get_message("m").await.unwrap();
    assert_eq!(delivered.status, MessageStatus::Delivered);
    let at = delivered.delivered_at.unwrap();
    assert!((at - real()).num_seconds().abs() < 10, "delivered at {at}");

    // A short lease runs out on the server's clock even for a caller far
    // behind: it can take the claim over, and the first token is refused.
    outbox
        .enqueue(event("short", 2, real()).with_id("short"))
        .await
        .unwrap();
    let short = Duration::from_millis(200);
    let first = outbox
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: 1,
            now: real(),
            lease: short,
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
        })
        .await
        .unwrap()
        .claimed
        .remove(0);
    // Real time: the server's clock is what is under test.
    tokio::time::sleep(Duration::from_millis(400)).await;
    // The caller, an hour behind, believes its lease still runs: refused,
    // and named as the server saw it.
    let expired = outbox
        .mark_delivered(MarkDelivered {
            delete: false,
            id: "short".into(),
            claim_token: first.claim_token.clone(),
            now: real() - hour,
        })
        .await;
    match expired {
        Err(Error::Claim(e)) => assert_eq!(e.reason, ClaimLoss::LeaseExpired),
        other => panic!("{other:?}"),
    }
    let second = outbox
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: 1,
            now: real() - hour,
            lease,
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
        })
        .await
        .unwrap();
    assert_eq!(second.claimed.len(), 1, "expired on the server's clock");
    assert_eq!(second.claimed[0].attempts, 2);
    let refused = outbox
        .mark_delivered(MarkDelivered {
            delete: false,
            id: "short".into(),
            claim_token: first.claim_token,
            now: real() - hour,
        })
        .await;
    match refused {
        Err(Error::Claim(e)) => assert_eq!(e.reason, ClaimLoss::TokenMismatch),
        other => panic!("{other:?}"),
    }
}

/// On the server's clock a claim's statements bind no time, and the keys of
/// the locked pass are its first parameter: a claim whose walk of keyed
/// rows is cut short looks each key's head up, claims the heads with the
/// keyless rows, and leaves every later row of a key alone.
#[tokio::test]
async fn on_the_servers_clock_a_short_claim_looks_up_the_heads_of_its_keys() {
    let pool = pool().await;
    let outbox = server_clock_store(&pool, &unique("server_heads")).await;
    // Thirty rows of each of three keys, taking turns, then five keyless
    // rows: a claim of ten walks 36 keyed rows, finds three heads and five
    // keyless rows, and comes back short.
    for n in 0..90 {
        outbox
            .enqueue(event(&format!("k{n:02}"), n, t0()).with_ordering_key(format!("key{}", n % 3)))
            .await
            .unwrap();
    }
    for n in 0..5 {
        outbox
            .enqueue(event(&format!("x{n}"), 90 + n, t0()))
            .await
            .unwrap();
    }
    let claim = || {
        outbox.claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: 10,
            now: chrono::Utc::now(),
            lease: LEASE,
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
        })
    };
    let batch = claim().await.unwrap();
    let mut ids: Vec<_> = batch.claimed.iter().map(|m| m.id.as_str()).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["k00", "k01", "k02", "x0", "x1", "x2", "x3", "x4"]);
    // The heads are claimed, so nothing of their keys is claimable.
    assert!(claim().await.unwrap().claimed.is_empty());
}

/// A store on the server's clock, on a table of its own, over a pool of one
/// connection: every statement is prepared and planned on the one a test
/// inspects.
async fn one_connection_store(prefix: &str) -> (PgPool, String, PostgresOutbox) {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&database_url())
        .await
        .unwrap();
    let table = unique(prefix);
    let outbox = server_clock_store(&pool, &table).await;
    (pool, table, outbox)
}

/// Claim up to `limit` messages now.
async fn claim_now(outbox: &PostgresOutbox, limit: usize) -> outbox::Result<outbox::ClaimedBatch> {
    outbox
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit,
            now: chrono::Utc::now(),
            lease: LEASE,
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
        })
        .await
}

/// A connection keeps a statement's plan until the table's statistics
/// change, and a plan made while the table was empty reads the table whole.
/// Claims and settlements run functions whose plans price sequential scans
/// out, so plans made on the empty table read the indexes as it fills.
#[tokio::test]
async fn a_plan_made_on_an_empty_table_does_not_scan_it_once_it_fills() {
    let (pool, table, outbox) = one_connection_store("replan").await;
    let claim = |limit| claim_now(&outbox, limit);
    let deliver = |id: &str, claim_token: &str, delete| {
        outbox.mark_delivered(MarkDelivered {
            delete,
            id: id.to_owned(),
            claim_token: claim_token.to_owned(),
            now: chrono::Utc::now(),
        })
    };
    let seq_scans = async || -> i64 {
        // Flushes this backend's pending counts: the one connection's.
        sqlx::query("SELECT pg_stat_force_next_flush()")
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query_scalar("SELECT seq_scan FROM pg_stat_user_tables WHERE relname = $1")
            .bind(&table)
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    // Every statement planned on the empty table.
    assert!(claim(10).await.unwrap().claimed.is_empty());
    assert!(deliver("gone", "gone", false).await.is_err());
    assert!(deliver("gone", "gone", true).await.is_err());
    // Rows written behind the planner's back: no ANALYZE, so no plan of the
    // connection is thrown away.
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {table} (id, kind, name, payload, max_attempts, available_at, \
           created_at, updated_at) \
         SELECT 'm' || i, 'event', 'backlog', '{{}}', 5, now() - interval '1 hour', now(), now() \
         FROM generate_series(1, 5000) AS i"
    )))
    .execute(&pool)
    .await
    .unwrap();
    let before = seq_scans().await;
    let claimed = claim(1100).await.unwrap().claimed;
    assert_eq!(claimed.len(), 1100);
    for (message, delete) in claimed.iter().zip([false, true]) {
        deliver(&message.id, &message.claim_token, delete)
            .await
            .unwrap();
    }
    assert_eq!(claim(10).await.unwrap().claimed.len(), 10);
    assert_eq!(
        seq_scans().await,
        before,
        "a plan made on the empty table scanned it"
    );
}

/// The claim after a short first pass is sent as text, planned once per
/// connection and size. Once the store has claimed its first thousand rows
/// it is sent under a new text, which each connection plans again, for the
/// table as it has become.
#[tokio::test]
async fn a_claim_sent_as_text_is_planned_again_once_the_table_fills() {
    let (pool, table, outbox) = one_connection_store("regen").await;
    let claim = |limit| claim_now(&outbox, limit);
    // One key's queue ahead of the keyless rows, longer than a claim of ten
    // walks: the first pass comes back short, and the claim takes its
    // locked pass.
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {table} (id, kind, name, payload, max_attempts, available_at, \
           created_at, updated_at, ordering_key) \
         SELECT 'm' || i, 'event', 'backlog', '{{}}', 5, now() - interval '1 hour', now(), \
           now(), CASE WHEN i <= 100 THEN 'k' END \
         FROM generate_series(1, 3000) AS i"
    )))
    .execute(&pool)
    .await
    .unwrap();
    assert_eq!(claim(10).await.unwrap().claimed.len(), 10);
    assert_eq!(claim(1100).await.unwrap().claimed.len(), 1100);
    assert_eq!(claim(10).await.unwrap().claimed.len(), 10);

    let prepared: Vec<String> = sqlx::query_scalar(
        "SELECT statement FROM pg_prepared_statements \
         WHERE statement LIKE 'WITH keyless AS%LIMIT 10 %fronts AS%' ORDER BY prepare_time",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(prepared.len(), 2, "{prepared:?}");
    assert!(!prepared[0].contains("-- plan"));
    assert!(prepared[1].ends_with("-- plan 1"), "{}", prepared[1]);
}

/// A claim commits without waiting for its WAL to be flushed, whichever
/// pass claims; enqueues and settlements still wait, and the setting never
/// outlives the claim's transaction on its pooled connection.
#[tokio::test]
async fn only_claims_commit_without_waiting_for_the_disk() {
    let (pool, table, outbox) = one_connection_store("no_flush").await;
    // The test cluster turns synchronous commits off for speed; its one
    // connection turns them back on, as a production server has them.
    sqlx::query("SET synchronous_commit = on")
        .execute(&pool)
        .await
        .unwrap();
    // A deferred trigger runs at commit, under the setting that commit obeys.
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE TABLE {table}_commits (op text, status text, mode text); \
         CREATE FUNCTION {table}_commit_mode() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN \
             INSERT INTO {table}_commits VALUES (TG_OP, \
                 CASE TG_OP WHEN 'DELETE' THEN OLD.status ELSE NEW.status END, \
                 current_setting('synchronous_commit')); \
             RETURN NULL; \
         END $$; \
         CREATE CONSTRAINT TRIGGER commit_mode AFTER INSERT OR UPDATE OR DELETE ON {table} \
             DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {table}_commit_mode()"
    )))
    .execute(&pool)
    .await
    .unwrap();
    let commits = async || -> Vec<(String, String, String)> {
        let rows = sqlx::query_as(AssertSqlSafe(format!(
            "DELETE FROM {table}_commits RETURNING op, status, mode"
        )))
        .fetch_all(&pool)
        .await
        .unwrap();
        let mut rows: Vec<(String, String, String)> = rows;
        rows.sort_unstable();
        rows.dedup();
        rows
    };
    let row = |op: &str, status: &str, mode: &str| (op.into(), status.into(), mode.into());
    // Settles every other message by deleting it, the rest by an update;
    // both kinds wait for their flush.
    let settle = async |claimed: Vec<outbox::ClaimedMessage>| {
        for (n, message) in claimed.into_iter().enumerate() {
            outbox
                .mark_delivered(MarkDelivered {
                    delete: n % 2 == 1,
                    id: message.id,
                    claim_token: message.claim_token,
                    now: chrono::Utc::now(),
                })
                .await
                .unwrap();
        }
        assert_eq!(
            commits().await,
            [
                row("DELETE", "claimed", "on"),
                row("UPDATE", "delivered", "on")
            ]
        );
    };

    // The first pass claims the keyless rows; the key's head goes to the
    // second, `claim_heads`.
    for n in 0..2 {
        outbox
            .enqueue(event(&format!("x{n}"), n, t0()))
            .await
            .unwrap();
    }
    outbox
        .enqueue(event("k0", 2, t0()).with_ordering_key("key"))
        .await
        .unwrap();
    assert_eq!(commits().await, [row("INSERT", "pending", "on")]);
    let claimed = claim_now(&outbox, 10).await.unwrap().claimed;
    assert_eq!(claimed.len(), 3);
    assert_eq!(commits().await, [row("UPDATE", "claimed", "off")]);
    settle(claimed).await;

    // Keyed rows beyond the first pass's walk: it comes back short, and the
    // claim locks the keys and claims in a transaction of its own.
    for n in 0..60 {
        outbox
            .enqueue(event(&format!("k{n:02}"), n, t0()).with_ordering_key(format!("key{}", n % 3)))
            .await
            .unwrap();
    }
    outbox.enqueue(event("x9", 60, t0())).await.unwrap();
    commits().await;
    let claimed = claim_now(&outbox, 10).await.unwrap().claimed;
    let mut ids: Vec<_> = claimed.iter().map(|m| m.id.as_str()).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["k00", "k01", "k02", "x9"]);
    assert_eq!(commits().await, [row("UPDATE", "claimed", "off")]);
    settle(claimed).await;
    let session: String = sqlx::query_scalar("SHOW synchronous_commit")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(session, "on");
}
