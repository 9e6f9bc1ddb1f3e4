//! Query plans on large tables: the claim, its functions and the listing
//! are read from their indexes, and no claim is priced for JIT compilation.

#[cfg(feature = "inspect-statements")]
use outbox::{ClaimBatch, OutboxStore};
use outbox::{ListCursor, ListMessages, MessageStatus, OutboxAdmin, SettlementMode};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Row};

#[cfg(feature = "inspect-statements")]
use crate::sql_support::{LEASE, event};
use crate::sql_support::{t0, unique};
use crate::{database_url, pool, store};

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
    let mut query = body[..body.find(";\n").unwrap()]
        .replace("\"outbox_", &format!("\"{table}_"))
        .replace("\"outbox\"", &format!("\"{table}\""));
    for (name, replacement) in params {
        query = query.replace(name, replacement);
    }
    query
}

/// The migration that defines the settle function as it is.
#[cfg(feature = "inspect-statements")]
const FUNCTIONS: &str = include_str!("../../migrations/postgres/0014_queues.sql");

/// The migration that defines the claim functions (both passes) as they
/// are.
const CLAIM_FUNCTION: &str = include_str!("../../migrations/postgres/0017_key_heads.sql");

/// The parameters of [`claim_function_query`].
const CLAIM_PARAMETERS: &str =
    "(text[], integer[], bigint[], integer, integer, timestamptz, bigint, boolean)";

/// The claim the table's `claim` function runs (a claim's first pass):
/// `$1` queues, `$2` their limits, `$3` their attempt caps, `$4` limit, `$5`
/// walk, `$6` now (NULL for the database's), `$7` lease in µs, `$8` block.
fn claim_function_query(table: &str) -> String {
    function_query(
        CLAIM_FUNCTION,
        0,
        table,
        &[
            ("p_queues", "$1"),
            ("p_limits", "$2"),
            ("p_caps", "$3"),
            ("p_limit", "$4"),
            ("p_walk", "$5"),
            ("v_now", "coalesce($6, statement_timestamp())"),
            ("p_lease", "$7"),
            ("p_block", "$8"),
        ],
    )
}

/// The arguments of a claim of `limit` from the default queue, walking
/// `walk`, at `now` (SQL).
fn claim_arguments(limit: usize, walk: usize, now: &str) -> String {
    format!(
        "array['default'], array[{limit}], array[25]::bigint[], {limit}, {walk}, {now}, \
         30000000, true"
    )
}

/// The fenced writes the table's `settle` function runs: the batch of
/// deletions only (`$1` ids, `$2` tokens, `$3` nows) and the batch of any
/// writes (`$1` ops, then ids, tokens, nows, leases, new due times and
/// errors).
#[cfg(feature = "inspect-statements")]
fn settle_function_queries(table: &str) -> (String, String) {
    let migration = FUNCTIONS;
    let deletions = function_query(
        migration,
        2,
        table,
        &[("p_id", "$1"), ("p_token", "$2"), ("p_now", "$3")],
    );
    let any = function_query(
        migration,
        3,
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
            format!(
                "claim_plan({})",
                claim_arguments(10, 36, "'2030-01-01 12:00:00+00'")
            ),
            "array['deliver', 'deliver'], array['p0', 'p1'], array['t', 't'], \
             array['2030-01-01 12:00:00+00', '2030-01-01 12:00:00+00']::timestamptz[], \
             array[NULL, NULL]::bigint[], array[NULL, NULL]::timestamptz[], \
             array[NULL, NULL]::text[]",
        ),
        (
            format!("claim_plan({})", claim_arguments(10, 36, "NULL")),
            "array['deliver', 'deliver'], array['p0', 'p1'], array['t', 't'], \
             array[NULL, NULL]::timestamptz[], array[NULL, NULL]::bigint[], \
             array[NULL, NULL]::timestamptz[], array[NULL, NULL]::text[]",
        ),
    ];
    for ((claim_run, settle_args), mode) in runs
        .iter()
        .flat_map(|args| ["force_custom_plan", "force_generic_plan"].map(|mode| (args, mode)))
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
            sqlx::raw_sql(AssertSqlSafe(explain(claim_run.as_str())))
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
        for (name, args) in [("settle_plan", *settle_args), ("delete_plan", delete_args)] {
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
            queues: Vec::new(),
            durable: true,
        })
        .await
        .unwrap();
    let ids: Vec<_> = batch.claimed.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, ["p0", "p1", "p2"]);
}

/// The second pass of a keyed claim is priced below PostgreSQL's default
/// `jit_above_cost` even as a statement of its own, with a keyed backlog
/// behind its heads: compiling a claim takes longer than running it. (Its
/// function turns JIT compilation off as well.)
#[cfg(feature = "inspect-statements")]
#[tokio::test]
async fn no_claim_statement_is_priced_for_jit_compilation() {
    let pool = pool().await;
    let table = unique("jit");
    // The table, set up.
    store(&pool, &table, SettlementMode::default()).await;
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
        CLAIM_FUNCTION,
        1,
        &table,
        &[
            ("p_ids", "$1"),
            ("p_queues", "$2"),
            ("p_caps", "$3"),
            ("p_now", "$4"),
            ("p_lease", "$5"),
            ("p_block", "$6"),
        ],
    );
    for limit in [1, 100, 1000, 4160] {
        let statements = [(
            "(text[], text[], bigint[], timestamptz, bigint, boolean)".to_owned(),
            claim_heads.clone(),
            "array['m1', 'm2', 'm3'], array['default'], array[25]::bigint[], \
                 '2030-01-01 12:00:00+00', 30000000, true"
                .to_owned(),
        )];
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
            "EXECUTE claim({})",
            claim_arguments(limit, 16, "'2030-01-01 12:00:00+00'")
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
    let plan = sqlx::raw_sql(AssertSqlSafe(format!(
        "EXPLAIN EXECUTE claim({})",
        claim_arguments(10, 36, "'2030-01-01 12:00:00+00'")
    )))
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
