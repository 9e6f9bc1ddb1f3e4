//! Setting up: tables, schemas and indexes of their own per table name,
//! migrations tracked per table, and a table's vacuum settings.

use outbox::{OutboxAdmin, OutboxStore, PostgresOutbox, SettlementMode};
use sqlx::AssertSqlSafe;

use crate::sql_support::{event, t0, unique};
use crate::{pool, store};

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
            "events_inbox_pkey",
            "events_inbox_retention",
            "events_key_head",
            "events_keys_pkey",
            "events_live_keyed",
            "events_migrations_pkey",
            "events_ordering",
            "events_ordering_claimed",
            "events_paused_pkey",
            "events_pending_heads",
            "events_pending_keyed",
            "events_pending_keyless",
            "events_pkey",
            "events_schedules_pkey",
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
