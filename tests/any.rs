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
    AnyOutbox, AnyTransaction, DatabaseKind, Enqueued, Error, MessageStatus, NewMessage, OpenMode,
    OutboxAdmin, OutboxStore, PostgresOutbox, SqlValue, SqliteOutbox, UrlError,
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
    assert_eq!(outbox.kind(), DatabaseKind::Sqlite);
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
    crate::conformance::schedules::schedule_suite!(setup);

    #[tokio::test]
    async fn enqueue_in_a_transaction_commits_and_rolls_back() {
        super::transaction_commits_and_rolls_back(setup().await).await;
    }

    #[tokio::test]
    async fn a_message_reaches_the_store_unchanged() {
        super::message_reaches_the_store_unchanged(setup().await).await;
    }

    #[tokio::test]
    async fn a_batch_in_a_transaction_commits_and_rolls_back() {
        super::a_batch_in_a_transaction(setup().await).await;
    }

    #[tokio::test]
    async fn opening_a_table_sets_nothing_up_until_asked() {
        let url = sqlite_url();
        super::opening_sets_nothing_up_until_asked(&url, &unique("opened")).await;
        // The schema of a table on SQLite is an attached database: `main`.
        super::opening_sets_nothing_up_until_asked(&url, &format!("main.{}", unique("opened")))
            .await;
    }

    #[tokio::test]
    async fn a_missing_file_is_created_only_in_create_mode() {
        let url = sqlite_url();
        let path = file_of(&url);
        for mode in [OpenMode::ReadOnly, OpenMode::Existing] {
            let refused = AnyOutbox::options().mode(mode).open(&url).await;
            assert!(
                matches!(
                    refused,
                    Err(Error::Connect {
                        database: DatabaseKind::Sqlite,
                        ..
                    })
                ),
                "{mode:?}: {refused:?}"
            );
            assert!(!path.exists(), "{mode:?} created {}", path.display());
        }
        let created = AnyOutbox::options().open(&url).await.unwrap();
        assert!(path.exists());
        // Nothing set up: creating the file is all it did.
        assert!(!created.table_exists().await.unwrap());
        created.close().await;
    }

    #[tokio::test]
    async fn read_only_never_changes_a_file_and_existing_keeps_its_journal() {
        let url = sqlite_url();
        let path = file_of(&url);
        plain_sqlite_file(&url).await;
        let before = std::fs::read(&path).unwrap();

        let reader = AnyOutbox::options()
            .mode(OpenMode::ReadOnly)
            .open(&url)
            .await
            .unwrap();
        assert!(!reader.table_exists().await.unwrap());
        assert_eq!(
            reader.applied_migrations().await.unwrap(),
            Vec::<i64>::new()
        );
        let write = reader.setup().await;
        assert!(write.is_err(), "a read-only outbox set up its table");
        reader.close().await;
        assert_eq!(std::fs::read(&path).unwrap(), before, "the file changed");
        assert_eq!(siblings(&path), [file_name(&path)]);

        // Writable, yet the file keeps its rollback journal: opening does
        // not convert a database that may not be an outbox's.
        let writer = AnyOutbox::options()
            .mode(OpenMode::Existing)
            .open(&url)
            .await
            .unwrap();
        writer.setup().await.unwrap();
        writer.enqueue(event("kept", 1, t0())).await.unwrap();
        let journal: Option<String> = writer
            .fetch_scalar("PRAGMA journal_mode", &[])
            .await
            .unwrap();
        assert_eq!(journal.as_deref(), Some("delete"));
        writer.close().await;

        // Create mode opens outbox files as the store does: in WAL.
        let owner = AnyOutbox::options().open(&url).await.unwrap();
        let journal: Option<String> = owner
            .fetch_scalar("PRAGMA journal_mode", &[])
            .await
            .unwrap();
        assert_eq!(journal.as_deref(), Some("wal"));
        assert_eq!(owner.stats(t0()).await.unwrap().pending, 1);
        owner.close().await;
    }

    #[tokio::test]
    async fn a_name_sqlite_reserves_is_refused() {
        let refused = AnyOutbox::options()
            .table("sqlite_outbox")
            .open(&sqlite_url())
            .await;
        assert!(
            matches!(refused, Err(Error::InvalidTableName { ref name, .. }) if name == "sqlite_outbox"),
            "{refused:?}"
        );
    }

    #[tokio::test]
    async fn only_postgres_wakes_a_drain_for_another_process() {
        let outbox = setup().await;
        // Its own wake-ups come from this process's commits.
        assert!(outbox.wakeups().is_some());
        assert!(outbox.cross_process_wakeups().is_none());
    }

    #[tokio::test]
    async fn close_closes_the_pool_of_every_clone() {
        let outbox = setup().await;
        let clone = outbox.clone();
        outbox.close().await;
        assert!(clone.as_sqlite().unwrap().pool().is_closed());
        assert!(clone.stats(t0()).await.is_err());
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
    crate::conformance::schedules::schedule_suite!(setup);

    #[tokio::test]
    async fn enqueue_in_a_transaction_commits_and_rolls_back() {
        super::transaction_commits_and_rolls_back(setup().await).await;
    }

    #[tokio::test]
    async fn a_message_reaches_the_store_unchanged() {
        super::message_reaches_the_store_unchanged(setup().await).await;
    }

    #[tokio::test]
    async fn a_batch_in_a_transaction_commits_and_rolls_back() {
        super::a_batch_in_a_transaction(setup().await).await;
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
        let refused = postgres
            .enqueue_batch_in(&mut tx, vec![event("y", 1, t0())])
            .await
            .unwrap_err();
        assert!(
            matches!(&refused, Error::InvalidInput { field: "tx", .. }),
            "{refused}"
        );
        tx.rollback().await.unwrap();
        let stats = postgres.stats(t0()).await.unwrap();
        assert_eq!(stats.total(), 0);
    }

    #[tokio::test]
    async fn opening_a_table_sets_nothing_up_until_asked() {
        let url = database_url();
        super::opening_sets_nothing_up_until_asked(&url, &unique("opened")).await;
        // A schema of its own, created by setup.
        let qualified = format!("{}.{}", unique("schema"), unique("opened"));
        super::opening_sets_nothing_up_until_asked(&url, &qualified).await;
    }

    #[tokio::test]
    async fn a_commit_in_another_process_wakes_a_drain() {
        let table = unique("woken");
        let open = |table: String| async move {
            AnyOutbox::options()
                .table(table)
                .postgres_pool(outbox::sqlx::postgres::PgPoolOptions::new().max_connections(2))
                .open(&database_url())
                .await
                .unwrap()
        };
        let drain = open(table.clone()).await;
        drain.setup().await.unwrap();
        // Another pool stands for the application's process.
        let application = open(table).await;

        let mut wakeups = drain
            .cross_process_wakeups()
            .expect("PostgreSQL tells every connection about a commit");
        let arm = wakeups.arm().expect("PostgreSQL wakes drains that armed");
        assert_eq!(arm.arm().await.unwrap(), outbox::ArmOutcome::Armed);
        application.enqueue(event("a", 1, t0())).await.unwrap();
        // The bound only turns a lost wake-up into a failure, not a hang.
        let woken = tokio::time::timeout(std::time::Duration::from_secs(30), wakeups.changed())
            .await
            .expect("no wake-up within 30 s of the commit");
        assert!(woken);
        application.close().await;
        drain.close().await;
    }

    #[tokio::test]
    async fn the_pool_settings_are_the_callers() {
        let outbox = AnyOutbox::options()
            .table(unique("pooled"))
            .postgres_pool(outbox::sqlx::postgres::PgPoolOptions::new().max_connections(3))
            .open(&database_url())
            .await
            .unwrap();
        let pool = outbox.as_postgres().unwrap().pool();
        assert_eq!(pool.options().get_max_connections(), 3);
        outbox.close().await;
        assert!(pool.is_closed());
    }

    #[tokio::test]
    async fn the_url_picks_postgres() {
        let outbox = AnyOutbox::connect(&database_url()).await.unwrap();
        assert_eq!(outbox.kind(), DatabaseKind::Postgres);
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

/// A batch in a transaction of either database: answered in order, a
/// duplicate id in its place, the transaction usable after it; committed
/// with the business row, or gone with it.
async fn a_batch_in_a_transaction(outbox: AnyOutbox) {
    let orders = unique("orders");
    outbox
        .execute(
            outbox::sqlx::AssertSqlSafe(format!("CREATE TABLE {orders} (id BIGINT PRIMARY KEY)")),
            &[],
        )
        .await
        .unwrap();
    let insert = format!("INSERT INTO {orders} (id) VALUES ($1)");
    let mut tx = outbox.begin().await.unwrap();
    let answers = outbox
        .enqueue_batch_in(
            &mut tx,
            vec![
                event("b-1", 1, t0()),
                event("b-1", 2, t0()),
                event("b-2", 3, t0()),
            ],
        )
        .await
        .unwrap();
    assert_eq!(
        answers,
        [
            Enqueued::Inserted("b-1".into()),
            Enqueued::AlreadyExists("b-1".into()),
            Enqueued::Inserted("b-2".into()),
        ]
    );
    tx.execute(
        outbox::sqlx::AssertSqlSafe(insert.clone()),
        &[SqlValue::from(1_i64)],
    )
    .await
    .unwrap();
    let jobs = outbox
        .enqueue_jobs_in(&mut tx, [&OrderJob { n: 1 }, &OrderJob { n: 2 }])
        .await
        .unwrap();
    assert!(jobs.iter().all(Enqueued::is_inserted));
    tx.commit().await.unwrap();
    assert_eq!(outbox.stats(t0()).await.unwrap().pending, 4);
    let stored = outbox.get_message("b-1").await.unwrap();
    assert_eq!(stored.payload.to_value()["n"], 1);

    let mut tx = outbox.begin().await.unwrap();
    tx.execute(
        outbox::sqlx::AssertSqlSafe(insert),
        &[SqlValue::from(2_i64)],
    )
    .await
    .unwrap();
    outbox
        .enqueue_events_in(&mut tx, &[OrderPlaced { order_id: 2 }])
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(outbox.stats(t0()).await.unwrap().pending, 4);
}

#[derive(serde::Serialize, serde::Deserialize)]
struct OrderJob {
    n: u32,
}

impl outbox::Job for OrderJob {
    const NAME: &'static str = "order.job";
}

/// A table opened by name is not created until `setup`, and the schema
/// questions answer before and after.
async fn opening_sets_nothing_up_until_asked(url: &str, table: &str) {
    let outbox = AnyOutbox::options().table(table).open(url).await.unwrap();
    assert_eq!(outbox.table().to_string(), table);
    assert!(!outbox.table_exists().await.unwrap());
    assert_eq!(
        outbox.applied_migrations().await.unwrap(),
        Vec::<i64>::new()
    );
    let shipped: Vec<i64> = outbox.migrator().iter().map(|m| m.version).collect();
    assert!(shipped.len() >= 2, "{shipped:?}");
    assert!(
        outbox
            .migrator()
            .iter()
            .any(|m| m.version == 1 && m.description == "outbox"),
        "the first migration creates the table"
    );

    outbox.setup().await.unwrap();
    assert!(outbox.table_exists().await.unwrap());
    assert_eq!(outbox.applied_migrations().await.unwrap(), shipped);
    outbox.enqueue(event("opened", 1, t0())).await.unwrap();
    assert_eq!(outbox.stats(t0()).await.unwrap().pending, 1);

    // Another table of the same database is still missing.
    let other = AnyOutbox::options()
        .table(format!("{table}_b"))
        .mode(OpenMode::Existing)
        .open(url)
        .await
        .unwrap();
    assert!(!other.table_exists().await.unwrap());
    assert_eq!(other.applied_migrations().await.unwrap(), Vec::<i64>::new());
    other.close().await;
    outbox.close().await;
}

/// The file a `sqlite://` URL of [`sqlite_url`] names.
fn file_of(url: &str) -> PathBuf {
    PathBuf::from(url.strip_prefix("sqlite://").unwrap())
}

fn file_name(path: &std::path::Path) -> String {
    path.file_name().unwrap().to_string_lossy().into_owned()
}

/// The files of `path`'s directory whose names start with its own: the
/// database and any journal beside it.
fn siblings(path: &std::path::Path) -> Vec<String> {
    let name = file_name(path);
    let mut found: Vec<String> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|sibling| sibling.starts_with(&name))
        .collect();
    found.sort();
    found
}

/// A SQLite file that is not an outbox: one table, rollback journal.
async fn plain_sqlite_file(url: &str) {
    use std::str::FromStr;
    let options = outbox::sqlx::sqlite::SqliteConnectOptions::from_str(url)
        .unwrap()
        .create_if_missing(true);
    let pool = outbox::sqlx::sqlite::SqlitePoolOptions::new()
        .connect_with(options)
        .await
        .unwrap();
    outbox::sqlx::query("CREATE TABLE notes (body TEXT)")
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
}

#[test]
fn the_scheme_picks_the_store() {
    for (url, scheme) in [
        ("sqlite://app.db", Some("sqlite")),
        ("sqlite::memory:", Some("sqlite")),
        ("postgres://u@h/db", Some("postgres")),
        ("PostgreSQL://u@h/db", Some("postgresql")),
        ("mysql://u:secret@h/db", Some("mysql")),
        ("app.db", None),
        (":memory:", None),
    ] {
        assert_eq!(AnyOutbox::scheme(url).as_deref(), scheme, "{url}");
    }
}

#[tokio::test]
async fn opening_refuses_the_url_first_then_the_table_name() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(unique("refusals"));
    std::fs::create_dir_all(&dir).unwrap();
    let bad_table = "orders; drop table orders";
    for (url, table) in [
        ("mysql://app:s3cret@db/app", bad_table),
        ("app.db", "outbox"),
    ] {
        let refused = AnyOutbox::options().table(table).open(url).await;
        assert!(
            matches!(refused, Err(Error::Url(UrlError::UnsupportedScheme { .. }))),
            "{url}: {refused:?}"
        );
    }
    let file = dir.join("never.db");
    let url = format!("sqlite://{}", file.display());
    let refused = AnyOutbox::options().table(bad_table).open(&url).await;
    assert!(
        matches!(refused, Err(Error::InvalidTableName { .. })),
        "{refused:?}"
    );
    // Then the URL's own checks, before anything connects.
    let refused = AnyOutbox::options().open("sqlite://").await;
    assert!(
        matches!(refused, Err(Error::Url(UrlError::NoPath { .. }))),
        "{refused:?}"
    );
    let refused = AnyOutbox::options()
        .open("postgres://app@db:notaport/app")
        .await;
    assert!(
        matches!(
            refused,
            Err(Error::Url(UrlError::Malformed {
                database: DatabaseKind::Postgres,
                ..
            }))
        ),
        "{refused:?}"
    );
    assert!(!file.exists(), "a refused open created its file");
    std::fs::remove_dir_all(&dir).ok();
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
