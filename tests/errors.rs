//! Errors that name the cause and the fix, and rows that do not decode but
//! stay visible, on both SQL stores.
//!
//! The SQLite tests and the PostgreSQL URL and connection tests need no
//! server. The tests named `postgres_*_on_a_server` need one at
//! `DATABASE_URL`: run them with `scripts/with-postgres cargo test
//! --all-features --test errors`; without it they fail and say so.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use outbox::{
    ClaimBatch, Error, ListMessages, NewMessage, OutboxAdmin, OutboxStore, Payload, PostgresOutbox,
    SqliteOutbox, UrlError,
};
use sqlx::sqlite::SqlitePoolOptions;

fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}

/// A directory of its own, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(unique("outbox-errors"));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn url(&self, file: &str) -> String {
        format!("sqlite://{}/{file}", self.0.display())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn claim() -> ClaimBatch {
    ClaimBatch {
        on_dead_letter: Default::default(),
        limit: 10,
        now: chrono::Utc::now(),
        lease: Duration::from_secs(30),
        max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
        queues: Vec::new(),
        durable: true,
    }
}

#[tokio::test]
async fn sqlite_refuses_a_postgres_url_and_names_the_store_to_use() {
    let error = SqliteOutbox::connect("postgres://app:s3cret@db.example/app")
        .await
        .unwrap_err();
    println!("{error}");
    let Error::Url(UrlError::PostgresUrlForSqlite { url }) = &error else {
        panic!("{error:?}");
    };
    assert_eq!(url, "postgres://app:***@db.example/app");
    let text = error.to_string();
    assert!(
        text.contains("is a PostgreSQL URL") && text.contains("PostgresOutbox::connect"),
        "{text}"
    );
    assert!(!text.contains("s3cret"), "{text}");
}

#[tokio::test]
async fn postgres_refuses_a_sqlite_url_and_names_the_store_to_use() {
    let error = PostgresOutbox::connect("sqlite://x.db").await.unwrap_err();
    println!("{error}");
    assert!(
        matches!(&error, Error::Url(UrlError::SqliteUrlForPostgres { .. })),
        "{error:?}"
    );
    let text = error.to_string();
    assert!(
        text.contains("is a SQLite URL") && text.contains("SqliteOutbox::connect"),
        "{text}"
    );
}

#[tokio::test]
async fn a_sqlite_url_without_a_path_says_so() {
    for url in ["sqlite://", "sqlite:"] {
        let error = SqliteOutbox::connect(url).await.unwrap_err();
        println!("{error}");
        assert!(
            matches!(&error, Error::Url(UrlError::NoPath { .. })),
            "{url}: {error:?}"
        );
        assert!(error.to_string().contains("has no path"), "{error}");
    }
}

#[tokio::test]
async fn a_refused_postgres_connection_gives_the_os_error_at_once() {
    // Bind a port, then free it: nothing listens there now.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let started = Instant::now();
    let error = PostgresOutbox::connect(&format!("postgres://app:pw@127.0.0.1:{port}/app"))
        .await
        .unwrap_err();
    println!("{error}");
    assert!(
        started.elapsed() < PostgresOutbox::DEFAULT_CONNECT_TIMEOUT,
        "took {:?}",
        started.elapsed()
    );
    let Error::Connect { url, reason, .. } = &error else {
        panic!("{error:?}");
    };
    assert!(
        reason.contains("refused") && reason.contains("os error"),
        "{reason}"
    );
    assert!(!url.contains(":pw@"), "{url}");
    assert!(PostgresOutbox::DEFAULT_CONNECT_TIMEOUT <= Duration::from_secs(5));
}

#[tokio::test]
async fn a_silent_postgres_server_is_given_up_on_after_the_timeout() {
    // Accepts the TCP connection (the backlog does) and never answers.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let timeout = Duration::from_millis(300);
    let started = Instant::now();
    let error =
        PostgresOutbox::connect_timeout(&format!("postgres://app@127.0.0.1:{port}/app"), timeout)
            .await
            .unwrap_err();
    println!("{error}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let Error::Connect { reason, .. } = &error else {
        panic!("{error:?}");
    };
    assert!(reason.contains("no connection within 300ms"), "{reason}");
    drop(listener);
}

#[tokio::test]
async fn an_unmigrated_sqlite_database_points_at_setup() {
    let dir = TempDir::new();
    let pool = SqlitePoolOptions::new()
        .connect_with(SqliteOutbox::connect_options(&dir.url("bare.db")).unwrap())
        .await
        .unwrap();
    // No setup().
    let outbox = SqliteOutbox::new(pool);
    let drained = outbox.claim_batch(claim()).await.unwrap_err();
    println!("{drained}");
    let administered = outbox.stats(chrono::Utc::now()).await.unwrap_err();
    for (error, operation) in [(&drained, "claim_batch"), (&administered, "stats")] {
        let Error::NotSetUp {
            operation: op,
            detail,
        } = error
        else {
            panic!("{error:?}");
        };
        assert_eq!(*op, operation);
        assert!(detail.contains("no such table"), "{detail}");
        let text = error.to_string();
        assert!(
            text.contains("setup()") && text.contains("outbox migrate"),
            "{text}"
        );
    }
}

/// A store holding one good message, and rows written by hand that do not
/// decode: a payload that is not JSON, a time that is text, a trace that is
/// not JSON. Created in that order, one microsecond apart.
async fn sqlite_with_bad_rows(dir: &TempDir) -> SqliteOutbox {
    let outbox = SqliteOutbox::connect(&dir.url("bad.db")).await.unwrap();
    let t = chrono::DateTime::from_timestamp(1_800_000_000, 0).unwrap();
    outbox
        .enqueue(
            NewMessage::new(
                outbox::MessageKind::Event,
                "good",
                Payload::from_json("{}").unwrap(),
            )
            .with_id("a-good")
            .at(t),
        )
        .await
        .unwrap();
    let rows = [
        ("b-payload", "not json", None),
        ("c-time", "{}", None),
        ("d-trace", "{}", Some("{broken")),
    ];
    for (n, (id, payload, trace)) in rows.into_iter().enumerate() {
        let at = t.timestamp_micros() + 1 + n as i64;
        sqlx::query(
            "INSERT INTO outbox (id, kind, name, payload, trace, max_attempts, \
             available_at, created_at, updated_at) VALUES (?1, 'event', 'x', ?2, ?3, 3, ?4, ?4, ?4)",
        )
        .bind(id)
        .bind(payload)
        .bind(trace)
        .bind(at)
        .execute(outbox.pool())
        .await
        .unwrap();
    }
    // SQLite stores whatever type it is given, whatever the column says.
    sqlx::query("UPDATE outbox SET available_at = 'tomorrow' WHERE id = 'c-time'")
        .execute(outbox.pool())
        .await
        .unwrap();
    outbox
}

#[tokio::test]
async fn sqlite_lists_and_shows_unreadable_rows_with_their_raw_columns() {
    let dir = TempDir::new();
    let outbox = sqlite_with_bad_rows(&dir).await;
    let page = outbox.list_messages(ListMessages::default()).await.unwrap();
    assert_eq!(page.messages.len(), 1);
    assert_eq!(page.messages[0].id, "a-good");
    let ids: Vec<&str> = page.unreadable.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["b-payload", "c-time", "d-trace"]);
    assert_eq!(page.unreadable[0].payload(), Some("not json"));
    assert!(page.unreadable[0].reason.contains("payload"));
    assert!(page.unreadable[1].reason.contains("available_at"));
    assert_eq!(page.unreadable[1].column("available_at"), Some("tomorrow"));
    assert!(page.unreadable[2].reason.contains("trace"));
    assert_eq!(page.unreadable[2].column("trace"), Some("{broken"));
    assert!(page.next.is_none());

    match outbox.get_message("b-payload").await {
        Err(Error::Unreadable(row)) => {
            println!("{}", Error::Unreadable(row.clone()));
            assert_eq!(row.id, "b-payload");
            assert_eq!(row.payload(), Some("not json"));
            assert_eq!(row.column("name"), Some("x"));
        }
        other => panic!("{other:?}"),
    }
    assert!(outbox.get_message("a-good").await.is_ok());
}

#[tokio::test]
async fn pages_step_over_unreadable_rows() {
    let dir = TempDir::new();
    let outbox = sqlite_with_bad_rows(&dir).await;
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = outbox
            .list_messages(ListMessages {
                limit: 1,
                after,
                ..ListMessages::default()
            })
            .await
            .unwrap();
        assert_eq!(page.messages.len() + page.unreadable.len(), 1);
        seen.extend(page.messages.iter().map(|m| m.id.clone()));
        seen.extend(page.unreadable.iter().map(|r| r.id.clone()));
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(seen, ["a-good", "b-payload", "c-time", "d-trace"]);
}

fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| {
        panic!(
            "DATABASE_URL is not set. The PostgreSQL tests need a server: run them with \
             `scripts/with-postgres cargo test --all-features --test errors`"
        )
    })
}

async fn postgres_pool() -> sqlx::PgPool {
    PostgresOutbox::connect_pool(
        &database_url(),
        sqlx::postgres::PgPoolOptions::new().max_connections(2),
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn postgres_unmigrated_points_at_setup_on_a_server() {
    let pool = postgres_pool().await;
    let outbox = PostgresOutbox::builder(pool)
        .table(&unique("never_set_up"))
        .unwrap()
        .build();
    let drained = outbox.claim_batch(claim()).await.unwrap_err();
    println!("{drained}");
    let administered = outbox
        .list_messages(ListMessages::default())
        .await
        .unwrap_err();
    for error in [drained, administered] {
        assert!(matches!(error, Error::NotSetUp { .. }), "{error:?}");
        assert!(error.to_string().contains("outbox migrate"), "{error}");
    }
}

#[tokio::test]
async fn postgres_lists_and_shows_unreadable_rows_on_a_server() {
    let pool = postgres_pool().await;
    let table = unique("unreadable");
    let outbox = PostgresOutbox::builder(pool.clone())
        .table(&table)
        .unwrap()
        .build();
    outbox.setup().await.unwrap();
    for id in ["a", "b", "c"] {
        let message = NewMessage::new(
            outbox::MessageKind::Event,
            "x",
            Payload::from_json("{}").unwrap(),
        )
        .with_id(id);
        outbox.enqueue(message).await.unwrap();
    }
    // PostgreSQL's constraints keep the payload JSON and the status known;
    // a trace and a count are what another writer can still get wrong.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE \"{table}\" SET trace = 'not json' WHERE id = 'b'"
    )))
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE \"{table}\" SET attempts = -1 WHERE id = 'c'"
    )))
    .execute(&pool)
    .await
    .unwrap();
    let page = outbox.list_messages(ListMessages::default()).await.unwrap();
    assert_eq!(page.messages.len(), 1);
    let bad: Vec<(&str, Option<&str>)> = page
        .unreadable
        .iter()
        .map(|r| (r.id.as_str(), r.column("trace")))
        .collect();
    assert_eq!(bad, [("b", Some("not json")), ("c", None)]);
    assert_eq!(page.unreadable[1].column("attempts"), Some("-1"));
    assert_eq!(page.unreadable[0].payload(), Some("{}"));
    match outbox.get_message("c").await {
        Err(Error::Unreadable(row)) => assert!(row.reason.contains("attempts is -1"), "{row:?}"),
        other => panic!("{other:?}"),
    }
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP TABLE \"{table}\", \"{table}_migrations\", \"{table}_drains\"; \
         DROP FUNCTION \"{table}_wake\", \"{table}_claim_heads\", \"{table}_claim\", \"{table}_settle\"; \
         DROP SEQUENCE \"{table}_armed\", \"{table}_served\""
    )))
    .execute(&pool)
    .await
    .unwrap();
}
