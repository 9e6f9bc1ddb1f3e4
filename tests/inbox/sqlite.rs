//! The inbox in SQLite: the shared suite on an in-memory database, and
//! the names SQLite reserves.

use std::sync::Arc;

use outbox::SqliteInbox;

use crate::{HandClock, unique};

type Inbox = SqliteInbox;

async fn setup() -> (Inbox, Arc<HandClock>) {
    let outbox = outbox::SqliteOutbox::connect("sqlite::memory:")
        .await
        .unwrap();
    let clock = HandClock::new();
    let inbox = SqliteInbox::builder(outbox.pool().clone())
        .table(&unique("orders"))
        .unwrap()
        .clock(clock.clone())
        .build();
    inbox.setup().await.unwrap();
    (inbox, clock)
}

inbox_suite!(setup);

#[tokio::test]
async fn the_outbox_and_its_inbox_share_a_name_and_a_setup() {
    let outbox = outbox::SqliteOutbox::connect("sqlite::memory:")
        .await
        .unwrap();
    let inbox = outbox.inbox();
    assert_eq!(inbox.inbox_table(), "\"outbox_inbox\"");
    let mut tx = inbox.pool().begin().await.unwrap();
    assert!(
        inbox
            .record_in(&mut tx, "billing", "m-1")
            .await
            .unwrap()
            .is_new()
    );
    tx.commit().await.unwrap();

    let jobs = outbox::SqliteOutbox::builder(outbox.pool().clone())
        .table("main.jobs")
        .unwrap()
        .build();
    jobs.setup().await.unwrap();
    let jobs_inbox = jobs.inbox();
    assert_eq!(jobs_inbox.inbox_table(), "\"main\".\"jobs_inbox\"");
    assert!(!jobs_inbox.is_processed("billing", "m-1").await.unwrap());
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'jobs_inbox' \
         ORDER BY name",
    )
    .fetch_all(jobs.pool())
    .await
    .unwrap();
    assert_eq!(
        indexes,
        ["jobs_inbox_retention", "sqlite_autoindex_jobs_inbox_1"]
    );
}

#[tokio::test]
async fn hostile_and_reserved_names_are_refused() {
    let outbox = outbox::SqliteOutbox::connect("sqlite::memory:")
        .await
        .unwrap();
    for bad in [
        "inbox; DROP TABLE outbox",
        "a\"b",
        "sqlite_master",
        "x.y.z",
        "",
    ] {
        let refused = SqliteInbox::builder(outbox.pool().clone()).table(bad);
        assert!(
            matches!(refused, Err(outbox::Error::InvalidTableName { .. })),
            "{bad:?}: {refused:?}"
        );
    }
}
