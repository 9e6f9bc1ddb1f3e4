//! The inbox consumers against real brokers and databases: messages relayed
//! by the outbox (and extra copies of them, as a republish after a broker's
//! deduplication window would make) are applied once each, a failing
//! handler rolls back and the broker redelivers, and a message without an
//! id is refused the broker's way.
//!
//! Needs the servers of `scripts/with-services` (`DATABASE_URL`,
//! `NATS_URL`, `AMQP_URL`, `REDIS_URL`, `KAFKA_URL`):
//!
//!   scripts/with-services cargo test -p outbox-brokers --all-features --test inbox
//!
//! Real brokers answer in real time, so every wait is a bounded poll. Each
//! test has streams, queues and tables of its own, so they run in parallel;
//! none stops a broker.

#[path = "../harness/mod.rs"]
mod harness;

#[cfg(feature = "amqp")]
mod amqp;
#[cfg(feature = "kafka")]
mod kafka;
#[cfg(feature = "nats")]
mod nats;
#[cfg(feature = "redis")]
mod redis;

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use outbox::sqlx::{self, AssertSqlSafe, Postgres, Sqlite, Transaction};
use outbox::{PostgresInbox, SqliteInbox};
use outbox_brokers::consume::{ConsumerReport, InboxHandler, Received, handler_fn};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How a test handler behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Behaviour {
    /// Writes the effect and succeeds.
    Apply,
    /// The first time it sees a message: writes the effect, then fails, so
    /// the effect must roll back and the message come again.
    FailFirst,
}

/// An effects table beside an inbox: one row per applied message.
#[derive(Clone)]
struct Effects {
    table: String,
    /// Ids the handler has seen, for [`Behaviour::FailFirst`].
    seen: Arc<Mutex<HashSet<String>>>,
}

impl Effects {
    fn named(inbox_table: &str) -> Self {
        Effects {
            table: format!("\"{}_effects\"", inbox_table.trim_matches('"')),
            seen: Arc::default(),
        }
    }

    /// Whether the handler should fail this copy.
    fn fails(&self, behaviour: Behaviour, id: &str) -> bool {
        behaviour == Behaviour::FailFirst && self.seen.lock().unwrap().insert(id.to_owned())
    }

    fn insert(&self, placeholder: &str) -> String {
        format!(
            "INSERT INTO {} (message_id, payload) VALUES ({placeholder}1, {placeholder}2)",
            self.table
        )
    }
}

/// A PostgreSQL inbox of its own, and its effects table.
async fn postgres() -> (PostgresInbox, Effects) {
    let url = harness::service_url("DATABASE_URL");
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect(&url)
        .await
        .expect("connect to DATABASE_URL");
    let table = format!("inbox_{}", harness::unique());
    let inbox = PostgresInbox::builder(pool)
        .table(&table)
        .expect("a valid table name")
        .build();
    inbox.setup().await.expect("set up the inbox");
    let effects = Effects::named(&table);
    // `seq`: the order effects committed in, for the ordering checks.
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE TABLE {} (message_id text NOT NULL, payload text NOT NULL, \
         seq bigint GENERATED ALWAYS AS IDENTITY)",
        effects.table
    )))
    .execute(inbox.pool())
    .await
    .expect("create the effects table");
    (inbox, effects)
}

/// A SQLite inbox in a file of its own, and its effects table. The file is
/// left in the temporary directory's test folder.
async fn sqlite() -> (SqliteInbox, Effects) {
    let dir = std::env::temp_dir().join("outbox-inbox-tests");
    std::fs::create_dir_all(&dir).expect("create the test directory");
    let url = format!("sqlite://{}/{}.db", dir.display(), harness::unique());
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .connect_with(outbox::SqliteOutbox::connect_options(&url).expect("a SQLite URL"))
        .await
        .expect("open the database");
    let inbox = SqliteInbox::new(pool);
    inbox.setup().await.expect("set up the inbox");
    let effects = Effects::named("outbox_inbox");
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE TABLE {} (message_id text NOT NULL, payload text NOT NULL)",
        effects.table
    )))
    .execute(inbox.pool())
    .await
    .expect("create the effects table");
    (inbox, effects)
}

fn payload(message: &Received) -> String {
    message.payload_str().unwrap_or_default().to_owned()
}

/// A handler writing into `effects` on PostgreSQL.
fn postgres_handler(effects: &Effects, behaviour: Behaviour) -> impl InboxHandler<Postgres> {
    let effects = effects.clone();
    let sql = effects.insert("$");
    handler_fn(
        move |tx: &mut Transaction<'static, Postgres>, message: &Received| {
            let (effects, sql) = (effects.clone(), sql.clone());
            Box::pin(async move {
                sqlx::query(AssertSqlSafe(sql))
                    .bind(&message.id)
                    .bind(payload(message))
                    .execute(&mut **tx)
                    .await?;
                if effects.fails(behaviour, &message.id) {
                    return Err("the handler fails the first copy (forced by the test)".into());
                }
                Ok(())
            })
        },
    )
}

/// A handler writing into `effects` on SQLite.
fn sqlite_handler(effects: &Effects, behaviour: Behaviour) -> impl InboxHandler<Sqlite> {
    let effects = effects.clone();
    let sql = effects.insert("?");
    handler_fn(
        move |tx: &mut Transaction<'static, Sqlite>, message: &Received| {
            let (effects, sql) = (effects.clone(), sql.clone());
            Box::pin(async move {
                sqlx::query(AssertSqlSafe(sql))
                    .bind(&message.id)
                    .bind(payload(message))
                    .execute(&mut **tx)
                    .await?;
                if effects.fails(behaviour, &message.id) {
                    return Err("the handler fails the first copy (forced by the test)".into());
                }
                Ok(())
            })
        },
    )
}

/// A pool whose effects table can be counted.
trait Counted: Sync {
    fn applied<'a>(&'a self, effects: &'a Effects) -> BoxFuture<'a, BTreeMap<String, i64>>;
}

/// Writes [`Counted`] for a pool type: the same statement on either
/// database.
macro_rules! counted {
    ($pool:ty) => {
        impl Counted for $pool {
            fn applied<'a>(&'a self, effects: &'a Effects) -> BoxFuture<'a, BTreeMap<String, i64>> {
                Box::pin(async move {
                    let rows: Vec<(String, i64)> = sqlx::query_as(AssertSqlSafe(format!(
                        "SELECT message_id, count(*) FROM {} GROUP BY message_id",
                        effects.table
                    )))
                    .fetch_all(self)
                    .await
                    .expect("count the effects");
                    rows.into_iter().collect()
                })
            }
        }
    };
}

counted!(sqlx::PgPool);
counted!(sqlx::SqlitePool);

/// How many effect rows each message id has.
async fn applied(pool: &impl Counted, effects: &Effects) -> BTreeMap<String, i64> {
    pool.applied(effects).await
}

/// Each of `ids` applied exactly once, and nothing else.
fn assert_once(applied: &BTreeMap<String, i64>, ids: &[String]) {
    let doubled: Vec<_> = applied.iter().filter(|(_, n)| **n > 1).collect();
    assert!(doubled.is_empty(), "applied more than once: {doubled:?}");
    let missing: Vec<_> = ids.iter().filter(|id| !applied.contains_key(*id)).collect();
    assert!(missing.is_empty(), "never applied: {missing:?}");
    assert_eq!(
        applied.len(),
        ids.len(),
        "applied messages that were not sent"
    );
}

/// A consumer running in a task of its own, until [`Running::stop`].
struct Running {
    stop: oneshot::Sender<()>,
    task: JoinHandle<ConsumerReport>,
}

impl Running {
    fn start<F>(run: impl FnOnce(oneshot::Receiver<()>) -> F) -> Running
    where
        F: std::future::Future<Output = ConsumerReport> + Send + 'static,
    {
        let (stop, stopped) = oneshot::channel();
        Running {
            stop,
            task: tokio::spawn(run(stopped)),
        }
    }

    /// Stop it (the message it is on is finished first) and take its report.
    async fn stop(self) -> ConsumerReport {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .expect("the consumer stops within 30 s")
            .expect("the consumer's task does not panic")
    }
}

/// The shutdown signal of a [`Running`] consumer.
async fn stopped(signal: oneshot::Receiver<()>) {
    let _ = signal.await;
}

const WAIT: Duration = Duration::from_secs(60);
