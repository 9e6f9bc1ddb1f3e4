//! What enqueueing costs the producer: a batch enqueue against a raw
//! multi-row `INSERT`, and what `enqueue_in` adds to the caller's
//! transaction.
//!
//! ```text
//! cargo run --release -p outbox-bench --bin enqueue_bench -- --store sqlite
//! WITH_POSTGRES_DURABLE=1 scripts/with-postgres cargo run --release -p outbox-bench \
//!     --features postgres --bin enqueue_bench -- --store postgres \
//!     [--messages 100000] [--batch 1000] [--transactions 2000]
//! ```
//!
//! **Batches.** `--messages` messages (100 000) go into two tables of the
//! same shape (both set up by the store's migrations, indexes included), in
//! batches of `--batch` (1 000, at most [`MAX_ENQUEUE_BATCH`]): into one
//! through [`OutboxStore::enqueue_batch`](outbox::OutboxStore::enqueue_batch)
//! (a transaction of its own per batch), into the other as one hand-written
//! multi-row `INSERT` per batch, committed on its own, binding the same
//! values. The two take turns batch by batch, so
//! both see the same machine; the rows are the same, ids included.
//!
//! **Transactions.** `--transactions` transactions (2 000) of each of three
//! kinds, taking turns: one inserts a business row and enqueues an event
//! with `enqueue_in`; one does the same with an event that carries an
//! ordering key (one of 997 customers, so most keys already have messages
//! waiting, as an application's entities do); the other inserts two
//! business rows. The events carry no id: the store generates it, as for
//! an application that does not name its messages. Each is timed from
//! `begin` to the end of its commit. On PostgreSQL the store notifies
//! on insert (the default), as an application whose drains wait for
//! wake-ups runs it; no drain listens, so no `NOTIFY` is sent, but each
//! enqueue still reads the drains' flag.
//!
//! SQLite runs on a fresh file in the temporary directory (WAL,
//! `synchronous = NORMAL`, as `SqliteOutbox::connect` opens it),
//! PostgreSQL on fresh tables in `DATABASE_URL`; both are removed
//! afterwards.
//!
//! # Output
//!
//! The figures in words, then one JSON object: `store`, `durable`
//! (PostgreSQL: `fsync` and `synchronous_commit` on; SQLite: its
//! `synchronous` setting), `messages`, `batch`, `batch_msgs_per_sec`,
//! `raw_msgs_per_sec`, `batch_ratio` (the first over the second),
//! `transactions`, `tx_enqueue_p50_ms`, `tx_enqueue_p99_ms`,
//! `tx_plain_p50_ms`, `tx_plain_p99_ms`, `tx_overhead` (the median
//! transaction with an enqueue over the median one with two plain rows),
//! `tx_keyed_p50_ms`, `tx_keyed_p99_ms`, `tx_keyed_overhead` (the same with
//! a keyed enqueue), `seconds`.

use std::time::{Duration, Instant};

use chrono::Utc;
use outbox::{MAX_ENQUEUE_BATCH, MessageKind, NewMessage, Payload};
use outbox_bench::args::{Flags, refuse};
use outbox_bench::report::print_json;
use outbox_bench::stats::{per_sec, percentile_ms, round};
use outbox_bench::store::{SQL_STORES, check};
use serde::Serialize;

/// The command line.
struct Args {
    /// `sqlite` or `postgres`.
    store: String,
    /// Messages enqueued in batches, into each table.
    messages: usize,
    /// Messages per batch.
    batch: usize,
    /// Transactions of each kind.
    transactions: usize,
}

fn parse_args(mut flags: Flags) -> Result<Args, String> {
    let mut args = Args {
        store: "sqlite".into(),
        messages: 100_000,
        batch: 1_000,
        transactions: 2_000,
    };
    while let Some(flag) = flags.next_flag() {
        match flag.as_str() {
            "--store" => args.store = flags.value(&flag)?,
            "--messages" => args.messages = flags.parse(&flag)?,
            "--batch" => args.batch = flags.parse(&flag)?,
            "--transactions" => args.transactions = flags.parse(&flag)?,
            "--help" | "-h" => {
                return Err(format!(
                    "usage: enqueue_bench [--store {}] [--messages N] [--batch N] \
                     [--transactions N]",
                    SQL_STORES.join("|")
                ));
            }
            other => return Err(format!("unknown argument {other:?}; see --help")),
        }
    }
    if args.messages == 0 || args.transactions == 0 {
        return Err("--messages and --transactions must be positive".into());
    }
    if args.batch == 0 || args.batch > MAX_ENQUEUE_BATCH {
        return Err(format!(
            "--batch must be between 1 and {MAX_ENQUEUE_BATCH}, the most one batch takes"
        ));
    }
    check(&args.store, SQL_STORES)?;
    Ok(args)
}

/// The event every row carries: a small order, as an application's would.
/// Without an id, the store generates one as it does for an application
/// that does not name its messages (the batches name theirs, so the raw
/// table gets the same rows).
fn message(n: usize) -> NewMessage {
    let payload = Payload::from_json(format!(
        r#"{{"order_id":{n},"customer":"customer-{}","total_cents":{}}}"#,
        n % 997,
        1_000 + n % 50_000
    ))
    .expect("valid JSON");
    NewMessage::new(MessageKind::Event, "order.placed", payload)
}

/// What each store runs, timed by the caller.
trait Subject {
    /// Enqueues `messages` with the store's batch enqueue.
    async fn batch(&self, messages: Vec<NewMessage>);
    /// Inserts the same rows into the raw table, one statement.
    async fn raw(&self, messages: &[NewMessage]);
    /// A transaction with business row `order` and `message` enqueued.
    async fn with_enqueue(&self, order: i64, message: NewMessage);
    /// A transaction with business rows `order` and `order + 1`.
    async fn plain(&self, order: i64);
    /// Whether the database keeps a commit through a crash, in its words.
    async fn durable(&self) -> String;
}

/// The JSON line.
#[derive(Serialize)]
struct Summary<'a> {
    store: &'a str,
    durable: String,
    messages: usize,
    batch: usize,
    batch_msgs_per_sec: f64,
    raw_msgs_per_sec: f64,
    batch_ratio: f64,
    transactions: usize,
    tx_enqueue_p50_ms: f64,
    tx_enqueue_p99_ms: f64,
    tx_plain_p50_ms: f64,
    tx_plain_p99_ms: f64,
    tx_overhead: f64,
    tx_keyed_p50_ms: f64,
    tx_keyed_p99_ms: f64,
    tx_keyed_overhead: f64,
    seconds: f64,
}

async fn run(label: &str, subject: &impl Subject, args: &Args) {
    let started = Instant::now();
    let (mut ours, mut raw) = (Duration::ZERO, Duration::ZERO);
    let mut n = 0;
    for turn in 0.. {
        if n >= args.messages {
            break;
        }
        let rows: Vec<NewMessage> = (n..args.messages.min(n + args.batch))
            .map(|n| {
                message(n)
                    .with_id(outbox::kit::new_message_id())
                    .at(Utc::now())
            })
            .collect();
        n += rows.len();
        // Each side goes first every other batch.
        for raw_side in [turn % 2 == 0, turn % 2 == 1] {
            let copy = rows.clone();
            let timer = Instant::now();
            if raw_side {
                subject.raw(&copy).await;
                raw += timer.elapsed();
            } else {
                subject.batch(copy).await;
                ours += timer.elapsed();
            }
        }
    }
    let messages = args.messages as u64;
    let (batch_rate, raw_rate) = (per_sec(messages, ours), per_sec(messages, raw));
    println!(
        "{label}: {messages} messages in batches of {}: enqueue_batch {batch_rate:.0}/s, \
         raw INSERT {raw_rate:.0}/s",
        args.batch
    );

    // Microseconds per transaction: with an enqueue, with a keyed one,
    // with two plain rows.
    let mut timings: [Vec<u64>; 3] = Default::default();
    for i in 0..args.transactions {
        let order = 10 * i as i64;
        // Each kind goes first every third time.
        for turn in 0..3 {
            let kind = (i + turn) % 3;
            let timer = Instant::now();
            match kind {
                0 => subject.with_enqueue(order, message(i)).await,
                1 => {
                    let keyed = message(i).with_ordering_key(format!("customer-{}", i % 997));
                    subject.with_enqueue(order + 2, keyed).await;
                }
                _ => subject.plain(order + 4).await,
            }
            timings[kind].push(timer.elapsed().as_micros() as u64);
        }
    }
    for timing in &mut timings {
        timing.sort_unstable();
    }
    let [with_enqueue, keyed, plain] = &timings;
    let (enqueue_p50, keyed_p50, plain_p50) = (
        percentile_ms(with_enqueue, 50.0),
        percentile_ms(keyed, 50.0),
        percentile_ms(plain, 50.0),
    );
    println!(
        "{label}: {} transactions each: with enqueue_in p50 {enqueue_p50:.3} ms, \
         with a keyed one {keyed_p50:.3} ms, with two plain rows {plain_p50:.3} ms",
        args.transactions
    );
    print_json(&Summary {
        store: label,
        durable: subject.durable().await,
        messages: args.messages,
        batch: args.batch,
        batch_msgs_per_sec: round(batch_rate, 0),
        raw_msgs_per_sec: round(raw_rate, 0),
        batch_ratio: round(batch_rate / raw_rate, 3),
        transactions: args.transactions,
        tx_enqueue_p50_ms: enqueue_p50,
        tx_enqueue_p99_ms: percentile_ms(with_enqueue, 99.0),
        tx_plain_p50_ms: plain_p50,
        tx_plain_p99_ms: percentile_ms(plain, 99.0),
        tx_overhead: round(enqueue_p50 / plain_p50, 3),
        tx_keyed_p50_ms: keyed_p50,
        tx_keyed_p99_ms: percentile_ms(keyed, 99.0),
        tx_keyed_overhead: round(keyed_p50 / plain_p50, 3),
        seconds: round(started.elapsed().as_secs_f64(), 1),
    });
}

/// `INSERT INTO <table> (<columns>) VALUES <rows>`, `row(r)` writing the
/// values of row `r`: the values the store binds, and the status and the
/// attempts written as the store writes them.
fn raw_insert(table: &str, rows: usize, row: impl Fn(usize) -> String) -> String {
    let values: Vec<String> = (0..rows).map(row).collect();
    format!(
        "INSERT INTO {table} (id, kind, name, payload, trace, status, attempts, max_attempts, \
         available_at, created_at, updated_at, ordering_key, idempotency_key, \
         idempotency_until, max_attempts_set) VALUES {}",
        values.join(", ")
    )
}

/// The business table: an order per row.
const ORDERS: &str = "CREATE TABLE bench_orders (id BIGINT PRIMARY KEY, customer TEXT NOT NULL, \
     total_cents BIGINT NOT NULL)";

#[cfg(feature = "sqlite")]
mod sqlite {
    use outbox::sqlx::{self, AssertSqlSafe, Sqlite};
    use outbox::{NewMessage, OutboxStore, SqliteOutbox};

    use super::{ORDERS, raw_insert};

    pub(super) struct Subject {
        pub(super) store: SqliteOutbox,
        pub(super) raw_table: String,
    }

    impl Subject {
        pub(super) async fn open(store: SqliteOutbox) -> Self {
            let raw = SqliteOutbox::builder(store.pool().clone())
                .table("raw_rows")
                .expect("a valid table name")
                .build();
            raw.setup().await.expect("create the raw table");
            sqlx::query(ORDERS)
                .execute(store.pool())
                .await
                .expect("create the orders table");
            Subject {
                raw_table: raw.table().quoted(),
                store,
            }
        }

        async fn order(tx: &mut sqlx::Transaction<'_, Sqlite>, order: i64) {
            sqlx::query("INSERT INTO bench_orders (id, customer, total_cents) VALUES (?1, ?2, ?3)")
                .bind(order)
                .bind("ada")
                .bind(1_999_i64)
                .execute(&mut **tx)
                .await
                .expect("insert an order");
        }
    }

    fn micros(at: chrono::DateTime<chrono::Utc>) -> i64 {
        at.timestamp_micros()
    }

    impl super::Subject for Subject {
        async fn batch(&self, messages: Vec<NewMessage>) {
            self.store
                .enqueue_batch(messages)
                .await
                .expect("enqueue a batch");
        }

        async fn raw(&self, messages: &[NewMessage]) {
            // Anonymous placeholders, as the store writes them: sqlx binds
            // numbered ones in time quadratic in their number.
            let sql = raw_insert(&self.raw_table, messages.len(), |_| {
                "(?, ?, ?, ?, ?, 'pending', 0, ?, ?, ?, ?, ?, ?, ?, ?)".to_owned()
            });
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for m in messages {
                query = query
                    .bind(m.id.as_deref())
                    .bind(m.kind.as_str())
                    .bind(m.name.as_str())
                    .bind(m.payload.as_str())
                    .bind(None::<String>)
                    .bind(i64::from(outbox::DEFAULT_MAX_ATTEMPTS))
                    .bind(micros(m.now))
                    .bind(micros(m.now))
                    .bind(micros(m.now))
                    .bind(None::<String>)
                    .bind(None::<String>)
                    .bind(None::<i64>)
                    .bind(false);
            }
            query
                .execute(self.store.pool())
                .await
                .expect("a raw insert");
        }

        async fn with_enqueue(&self, order: i64, message: NewMessage) {
            let mut tx = self.store.pool().begin().await.expect("begin");
            Self::order(&mut tx, order).await;
            self.store
                .enqueue_in(&mut tx, message)
                .await
                .expect("enqueue_in");
            tx.commit().await.expect("commit");
        }

        async fn plain(&self, order: i64) {
            let mut tx = self.store.pool().begin().await.expect("begin");
            Self::order(&mut tx, order).await;
            Self::order(&mut tx, order + 1).await;
            tx.commit().await.expect("commit");
        }

        async fn durable(&self) -> String {
            let level: i64 = sqlx::query_scalar("PRAGMA synchronous")
                .fetch_one(self.store.pool())
                .await
                .expect("PRAGMA synchronous");
            let name = ["off", "normal", "full", "extra"]
                .get(level as usize)
                .copied()
                .unwrap_or("unknown");
            format!("synchronous = {name}")
        }
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use outbox::sqlx::{self, AssertSqlSafe, Postgres};
    use outbox::{NewMessage, OutboxStore, PostgresOutbox};

    use super::{ORDERS, raw_insert};

    pub(super) struct Subject {
        pub(super) store: PostgresOutbox,
        pub(super) raw_table: String,
    }

    impl Subject {
        pub(super) async fn open(store: PostgresOutbox, raw: PostgresOutbox) -> Self {
            sqlx::query("DROP TABLE IF EXISTS bench_orders")
                .execute(store.pool())
                .await
                .expect("drop an old orders table");
            sqlx::query(ORDERS)
                .execute(store.pool())
                .await
                .expect("create the orders table");
            Subject {
                raw_table: raw.table().quoted(),
                store,
            }
        }

        async fn order(tx: &mut sqlx::Transaction<'_, Postgres>, order: i64) {
            sqlx::query("INSERT INTO bench_orders (id, customer, total_cents) VALUES ($1, $2, $3)")
                .bind(order)
                .bind("ada")
                .bind(1_999_i64)
                .execute(&mut **tx)
                .await
                .expect("insert an order");
        }
    }

    impl super::Subject for Subject {
        async fn batch(&self, messages: Vec<NewMessage>) {
            self.store
                .enqueue_batch(messages)
                .await
                .expect("enqueue a batch");
        }

        async fn raw(&self, messages: &[NewMessage]) {
            let sql = raw_insert(&self.raw_table, messages.len(), |row| {
                let p = |k: usize| row * 12 + k;
                format!(
                    "(${}, ${}, ${}, ${}::jsonb, ${}, 'pending', 0, ${}, ${}, ${}, ${}, ${}, ${}, \
                     ${}, ${})",
                    p(1),
                    p(2),
                    p(3),
                    p(4),
                    p(5),
                    p(6),
                    p(7),
                    p(8),
                    p(8),
                    p(9),
                    p(10),
                    p(11),
                    p(12)
                )
            });
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for m in messages {
                query = query
                    .bind(m.id.as_deref())
                    .bind(m.kind.as_str())
                    .bind(m.name.as_str())
                    .bind(m.payload.as_str())
                    .bind(None::<String>)
                    .bind(i64::from(outbox::DEFAULT_MAX_ATTEMPTS))
                    .bind(m.now)
                    .bind(m.now)
                    .bind(None::<String>)
                    .bind(None::<String>)
                    .bind(None::<chrono::DateTime<chrono::Utc>>)
                    .bind(false);
            }
            query
                .execute(self.store.pool())
                .await
                .expect("a raw insert");
        }

        async fn with_enqueue(&self, order: i64, message: NewMessage) {
            let mut tx = self.store.pool().begin().await.expect("begin");
            Self::order(&mut tx, order).await;
            self.store
                .enqueue_in(&mut tx, message)
                .await
                .expect("enqueue_in");
            tx.commit().await.expect("commit");
        }

        async fn plain(&self, order: i64) {
            let mut tx = self.store.pool().begin().await.expect("begin");
            Self::order(&mut tx, order).await;
            Self::order(&mut tx, order + 1).await;
            tx.commit().await.expect("commit");
        }

        async fn durable(&self) -> String {
            let (fsync, commit): (String, String) = sqlx::query_as(
                "SELECT current_setting('fsync'), current_setting('synchronous_commit')",
            )
            .fetch_one(self.store.pool())
            .await
            .expect("read the durability settings");
            format!("fsync = {fsync}, synchronous_commit = {commit}")
        }
    }

    /// Drops the orders table; the store's tables go with `drop_tables`.
    pub(super) async fn drop_orders(url: &str) {
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(url)
            .await
            .expect("connect to DATABASE_URL");
        sqlx::query("DROP TABLE IF EXISTS bench_orders")
            .execute(&mut conn)
            .await
            .expect("drop the orders table");
    }
}

#[tokio::main]
async fn main() {
    let args = parse_args(Flags::from_env()).unwrap_or_else(|message| refuse(message));
    match args.store.as_str() {
        #[cfg(feature = "sqlite")]
        "sqlite" => {
            let database = outbox_bench::store::sqlite::TempDatabase::new("enqueue-bench");
            let subject = sqlite::Subject::open(database.open().await).await;
            run("sqlite", &subject, &args).await;
            subject.store.pool().close().await;
        }
        #[cfg(feature = "postgres")]
        "postgres" => {
            use outbox_bench::store::postgres::{database_url, drop_tables, fresh};
            let url = database_url().unwrap_or_else(|message| refuse(message));
            let table = format!("enqueue_bench_{}", std::process::id());
            let raw_table = format!("enqueue_raw_{}", std::process::id());
            let options = || sqlx::postgres::PgPoolOptions::new().max_connections(4);
            let store = fresh(&url, &table, options(), true).await;
            let raw = fresh(&url, &raw_table, options(), false).await;
            let subject = postgres::Subject::open(store, raw).await;
            run("postgres", &subject, &args).await;
            subject.store.pool().close().await;
            drop_tables(&url, &table).await;
            drop_tables(&url, &raw_table).await;
            postgres::drop_orders(&url).await;
        }
        _ => unreachable!("checked by parse_args"),
    }
}
