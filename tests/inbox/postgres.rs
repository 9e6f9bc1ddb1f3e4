//! The inbox in PostgreSQL: the shared suite, schema-qualified tables, and
//! what only a server with concurrent transactions shows: a copy recorded
//! while the first is uncommitted waits for it, and retention skips rows a
//! transaction holds.

use std::sync::Arc;
use std::time::Duration;

use outbox::{InboxStore, PostgresInbox, PurgeInbox, Recorded};
use sqlx::postgres::{PgPool, PgPoolOptions};

use crate::{HandClock, days, t0, unique};

type Inbox = PostgresInbox;

async fn pool() -> PgPool {
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| {
        panic!(
            "DATABASE_URL is not set. The PostgreSQL inbox tests need a server: run them with \
             `scripts/with-postgres cargo test -p outbox --all-features --test inbox`"
        )
    });
    PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(30))
        .connect(&url)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to DATABASE_URL: {e}"))
}

async fn inbox_on(pool: &PgPool, table: &str) -> (Inbox, Arc<HandClock>) {
    let clock = HandClock::new();
    let inbox = PostgresInbox::builder(pool.clone())
        .table(table)
        .unwrap()
        .clock(clock.clone())
        .build();
    inbox.setup().await.unwrap();
    (inbox, clock)
}

async fn setup() -> (Inbox, Arc<HandClock>) {
    inbox_on(&pool().await, &unique("orders")).await
}

inbox_suite!(setup);

#[tokio::test]
async fn a_copy_recorded_during_the_first_waits_for_its_outcome() {
    let pool = pool().await;
    let (inbox, _clock) = inbox_on(&pool, &unique("orders")).await;
    for commit_first in [true, false] {
        let id = format!("m-{commit_first}");
        let mut first = inbox.pool().begin().await.unwrap();
        assert!(
            inbox
                .record_in(&mut first, "billing", &id)
                .await
                .unwrap()
                .is_new()
        );
        let second = tokio::spawn({
            let (inbox, id) = (inbox.clone(), id.clone());
            async move {
                let mut tx = inbox.pool().begin().await.unwrap();
                let recorded = inbox.record_in(&mut tx, "billing", &id).await.unwrap();
                tx.commit().await.unwrap();
                recorded
            }
        });
        if commit_first {
            first.commit().await.unwrap();
        } else {
            first.rollback().await.unwrap();
        }
        let expected = if commit_first {
            Recorded::AlreadyProcessed
        } else {
            Recorded::New
        };
        assert_eq!(
            second.await.unwrap(),
            expected,
            "first committed: {commit_first}"
        );
        assert!(inbox.is_processed("billing", &id).await.unwrap());
    }
}

#[tokio::test]
async fn a_schema_qualified_inbox_lives_in_its_schema() {
    let pool = pool().await;
    let schema = unique("app");
    let (inbox, _clock) = inbox_on(&pool, &format!("{schema}.events")).await;
    assert_eq!(
        inbox.inbox_table(),
        format!("\"{schema}\".\"events_inbox\"")
    );
    let mut tx = inbox.pool().begin().await.unwrap();
    assert!(
        inbox
            .record_in(&mut tx, "billing", "m-1")
            .await
            .unwrap()
            .is_new()
    );
    tx.commit().await.unwrap();
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT indexname::text FROM pg_indexes WHERE schemaname = $1 \
         AND tablename = 'events_inbox' ORDER BY indexname",
    )
    .bind(&schema)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(indexes, ["events_inbox_pkey", "events_inbox_retention"]);
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA \"{schema}\" CASCADE"
    )))
    .execute(&pool)
    .await
    .unwrap();
}

#[tokio::test]
async fn retention_leaves_rows_a_transaction_holds_for_the_next_batch() {
    let pool = pool().await;
    let (inbox, clock) = inbox_on(&pool, &unique("orders")).await;
    for id in ["a", "b", "c"] {
        let mut tx = inbox.pool().begin().await.unwrap();
        assert!(
            inbox
                .record_in(&mut tx, "billing", id)
                .await
                .unwrap()
                .is_new()
        );
        tx.commit().await.unwrap();
    }
    clock.set(t0() + days(8));
    let mut holder = inbox.pool().begin().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT 1 FROM {} WHERE consumer = 'billing' AND message_id = 'b' FOR UPDATE",
        inbox.inbox_table()
    )))
    .execute(&mut *holder)
    .await
    .unwrap();
    let batch = || PurgeInbox {
        consumer: "billing".to_owned(),
        older_than: t0() + days(1),
        limit: 10,
    };
    // Not waited for: the batch goes on without the held row.
    assert_eq!(inbox.purge_batch(batch()).await.unwrap(), 2);
    assert!(inbox.is_processed("billing", "b").await.unwrap());
    holder.commit().await.unwrap();
    assert_eq!(inbox.purge_batch(batch()).await.unwrap(), 1);
    assert!(!inbox.is_processed("billing", "b").await.unwrap());
}
