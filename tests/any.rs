//! `AnyOutbox`: the store contract through the one type over both SQL
//! databases, and enqueue inside a transaction of each.
//!
//! The PostgreSQL half needs a server: run with `scripts/with-postgres cargo
//! test --all-features --test any`; without `DATABASE_URL` its tests fail
//! and say so. Every test passes `now` explicitly and runs on a real-time
//! runtime, as the stores' own suites do.

mod conformance;
#[allow(unused_macros, unused_imports)]
mod sql_support;

use std::path::PathBuf;

use outbox::{
    AnyOutbox, AnyTransaction, Backend, Enqueued, Error, MessageStatus, NewMessage, OutboxAdmin,
    PostgresOutbox, SqlValue, SqliteOutbox, UrlError,
};
use sql_support::{OrderPlaced, event, t0, unique};

/// A SQLite URL in a directory of this test binary's own.
fn sqlite_url() -> String {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("any-outbox");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    });
    format!("sqlite://{}/{}.db", dir.display(), unique("case"))
}

fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| {
        panic!(
            "DATABASE_URL is not set. The PostgreSQL half needs a server: run it with \
             `scripts/with-postgres cargo test --all-features --test any`"
        )
    })
}

/// SQLite through the URL, as an application opens it.
async fn sqlite() -> AnyOutbox {
    let outbox = AnyOutbox::connect(&sqlite_url()).await.unwrap();
    assert_eq!(outbox.backend(), Backend::Sqlite);
    outbox
}

/// PostgreSQL on a table of its own, on the caller's clock so the contract
/// is checked to the microsecond (the suite passes every `now`).
async fn postgres() -> AnyOutbox {
    let pool = PostgresOutbox::connect_pool(
        &database_url(),
        outbox::sqlx::postgres::PgPoolOptions::new().max_connections(4),
    )
    .await
    .unwrap();
    let store = PostgresOutbox::builder(pool)
        .table(&unique("any"))
        .unwrap()
        .caller_clock(true)
        .build();
    store.setup().await.unwrap();
    AnyOutbox::from(store)
}

mod on_sqlite {
    use super::*;

    async fn setup() -> AnyOutbox {
        sqlite().await
    }

    crate::conformance::conformance_suite!(setup);

    #[tokio::test]
    async fn enqueue_in_a_transaction_commits_and_rolls_back() {
        super::transaction_commits_and_rolls_back(setup().await).await;
    }

    #[tokio::test]
    async fn a_message_reaches_the_store_unchanged() {
        super::message_reaches_the_store_unchanged(setup().await).await;
    }

    #[tokio::test]
    async fn the_backend_connection_is_reachable() {
        let outbox = setup().await;
        let mut tx = outbox.begin().await.unwrap();
        let conn = tx.as_sqlite().expect("a SQLite transaction");
        let version: String = outbox::sqlx::query_scalar("SELECT sqlite_version()")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        assert!(version.starts_with('3'), "{version}");
        assert!(tx.as_postgres().is_none());
        assert!(outbox.as_sqlite().is_some() && outbox.as_postgres().is_none());
        tx.rollback().await.unwrap();
    }
}

mod on_postgres {
    use super::*;

    async fn setup() -> AnyOutbox {
        postgres().await
    }

    crate::conformance::conformance_suite!(setup);

    #[tokio::test]
    async fn enqueue_in_a_transaction_commits_and_rolls_back() {
        super::transaction_commits_and_rolls_back(setup().await).await;
    }

    #[tokio::test]
    async fn a_message_reaches_the_store_unchanged() {
        super::message_reaches_the_store_unchanged(setup().await).await;
    }

    #[tokio::test]
    async fn a_transaction_of_the_other_database_is_refused() {
        let postgres = setup().await;
        let sqlite = sqlite().await;
        let mut tx = sqlite.begin().await.unwrap();
        let refused = postgres
            .enqueue_in(&mut tx, event("x", 1, t0()))
            .await
            .unwrap_err();
        assert!(
            matches!(&refused, Error::InvalidInput { field: "tx", reason }
                if reason.contains("SQLite transaction") && reason.contains("PostgreSQL outbox")),
            "{refused}"
        );
        tx.rollback().await.unwrap();
        let stats = postgres.stats(t0()).await.unwrap();
        assert_eq!(stats.total(), 0);
    }

    #[tokio::test]
    async fn the_url_picks_postgres() {
        let outbox = AnyOutbox::connect(&database_url()).await.unwrap();
        assert_eq!(outbox.backend(), Backend::Postgres);
        let mut tx = outbox.begin().await.unwrap();
        assert!(tx.as_postgres().is_some() && tx.as_sqlite().is_none());
        tx.rollback().await.unwrap();
    }
}

/// The business rows and the message commit together, or neither stays.
async fn transaction_commits_and_rolls_back(outbox: AnyOutbox) {
    let orders = unique("orders");
    outbox
        .execute(
            outbox::sqlx::AssertSqlSafe(format!(
                "CREATE TABLE {orders} (id BIGINT PRIMARY KEY, customer TEXT NOT NULL, note TEXT)"
            )),
            &[],
        )
        .await
        .unwrap();
    let insert =
        format!("INSERT INTO {orders} (id, customer, note) VALUES ($1, $2, $3) RETURNING id");
    let count = format!("SELECT count(*) FROM {orders}");

    async fn place(outbox: &AnyOutbox, tx: &mut AnyTransaction, insert: &str, id: i64) -> String {
        let returned: Option<i64> = tx
            .fetch_scalar(
                outbox::sqlx::AssertSqlSafe(insert.to_owned()),
                &[
                    SqlValue::from(id),
                    SqlValue::from("ada"),
                    SqlValue::from(None::<&str>),
                ],
            )
            .await
            .unwrap();
        assert_eq!(returned, Some(id));
        outbox
            .enqueue_event_in(tx, &OrderPlaced { order_id: id })
            .await
            .unwrap()
            .into_id()
    }

    let mut tx = outbox.begin().await.unwrap();
    let rolled_back = place(&outbox, &mut tx, &insert, 1).await;
    tx.rollback().await.unwrap();

    let mut tx = outbox.begin().await.unwrap();
    let committed = place(&outbox, &mut tx, &insert, 2).await;
    let changed = tx
        .execute(
            outbox::sqlx::AssertSqlSafe(format!("UPDATE {orders} SET note = $1 WHERE id = $2")),
            &[SqlValue::from("gift"), SqlValue::from(2_i64)],
        )
        .await
        .unwrap();
    assert_eq!(changed, 1);
    tx.commit().await.unwrap();

    // Dropped without commit: rolled back like an explicit rollback.
    {
        let mut tx = outbox.begin().await.unwrap();
        place(&outbox, &mut tx, &insert, 3).await;
    }

    let rows: Option<i64> = outbox
        .fetch_scalar(outbox::sqlx::AssertSqlSafe(count), &[])
        .await
        .unwrap();
    assert_eq!(rows, Some(1), "only the committed order stays");
    assert!(matches!(
        outbox.get_message(&rolled_back).await,
        Err(Error::NotFound { .. })
    ));
    let message = outbox.get_message(&committed).await.unwrap();
    assert_eq!(
        (message.status, message.name.as_str()),
        (MessageStatus::Pending, "order.placed")
    );
    let stats = outbox.stats(t0()).await.unwrap();
    assert_eq!((stats.pending, stats.total()), (1, 1));
}

/// Every field the caller sets arrives as given, and a taken id answers
/// `AlreadyExists` without spoiling the transaction.
async fn message_reaches_the_store_unchanged(outbox: AnyOutbox) {
    let message = NewMessage::job(&OrderJob { n: 5 })
        .unwrap()
        .with_id("fixed-id")
        .at(t0())
        .available_at(t0() + sql_support::secs(60))
        .with_max_attempts(9);
    let mut tx = outbox.begin().await.unwrap();
    let first = outbox.enqueue_in(&mut tx, message.clone()).await.unwrap();
    assert!(
        matches!(first, Enqueued::Inserted(ref id) if id == "fixed-id"),
        "{first:?}"
    );
    let again = outbox.enqueue_in(&mut tx, message).await.unwrap();
    assert!(
        matches!(again, Enqueued::AlreadyExists(ref id) if id == "fixed-id"),
        "{again:?}"
    );
    tx.commit().await.unwrap();

    let stored = outbox.get_message("fixed-id").await.unwrap();
    assert_eq!(stored.kind, outbox::MessageKind::Job);
    assert_eq!(stored.name, "order.job");
    assert_eq!(stored.max_attempts, 9);
    assert_eq!(stored.available_at, t0() + sql_support::secs(60));
    assert_eq!(stored.created_at, t0());
    let payload: serde_json::Value = serde_json::from_str(stored.payload.as_str()).unwrap();
    assert_eq!(payload, serde_json::json!({ "n": 5 }));
}

#[derive(serde::Serialize, serde::Deserialize)]
struct OrderJob {
    n: u32,
}

impl outbox::Job for OrderJob {
    const NAME: &'static str = "order.job";
}

#[tokio::test]
async fn a_url_of_no_supported_database_is_refused() {
    for url in ["mysql://app@db/app", "app.db", "http://db/app"] {
        match AnyOutbox::connect(url).await {
            Err(Error::Url(UrlError::UnsupportedScheme { url: named })) => {
                assert_eq!(named, url);
            }
            other => panic!("{url}: {other:?}"),
        }
    }
    let refused = AnyOutbox::connect("mysql://app:s3cret@db/app")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("***") && !refused.contains("s3cret") && refused.contains("sqlite://"),
        "{refused}"
    );
    // The SQLite store's own checks still apply behind the scheme.
    assert!(matches!(
        AnyOutbox::connect("sqlite://").await,
        Err(Error::Url(UrlError::NoPath { .. }))
    ));
    let _: fn(SqliteOutbox) -> AnyOutbox = AnyOutbox::from;
}
