//! Relay throughput to a broker against a raw publishing loop, in the same run.
//!
//! ```text
//! scripts/with-services cargo run --release --example relay_bench -- --store sqlite
//! WITH_POSTGRES_DURABLE=1 scripts/with-services cargo run --release \
//!     --features postgres --example relay_bench -- --store sqlite,postgres
//! ```
//!
//! For each store it fills a fresh outbox with `--messages` events (100 000
//! by default), then, timed:
//!
//! - **raw**: the broker's client crate publishing the same payloads with
//!   the same headers into a fresh stream, acknowledgements awaited, with
//!   `--window` publishes awaiting their acknowledgement at once: the best a
//!   relay could do over that connection, with no store at all.
//! - **relay**: the actor runtime draining the outbox into another fresh
//!   stream through the broker transport (`Drain` in a loop, `--batch`
//!   messages a pass, `--concurrency` deliveries in flight), each message
//!   settled in the store once the broker acknowledged it.
//!
//! Both sides use one connection of the same client on the same
//! single-threaded runtime. The broker comes from `--broker` (`nats`, from
//! `NATS_URL`); the stream is checked afterwards to hold every message once.
//! Each (store, broker) prints one JSON line with both rates and their ratio.

use std::future::IntoFuture;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use outbox::{
    Clock, DrainConfig, EventBus, MessageKind, NewMessage, OutboxAdmin, OutboxStore, Payload,
    Registry, SqliteOutbox, SystemClock,
};
use outbox_actors::{Drain, DrainCoordinator, GetStatus};

const FILL_CHUNK: u64 = 10_000;

struct Args {
    broker: String,
    stores: Vec<String>,
    messages: u64,
    concurrency: usize,
    batch: usize,
    window: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        broker: "nats".to_owned(),
        stores: vec!["sqlite".to_owned()],
        messages: 100_000,
        concurrency: 256,
        batch: 1_000,
        window: 256,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |v: String| -> Result<u64, String> {
            v.parse::<u64>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("{flag} {v}: write a whole number above 0"))
        };
        match flag.as_str() {
            "--broker" => args.broker = value()?,
            "--store" => args.stores = value()?.split(',').map(str::to_owned).collect(),
            "--messages" => args.messages = number(value()?)?,
            "--concurrency" => args.concurrency = number(value()?)? as usize,
            "--batch" => args.batch = number(value()?)? as usize,
            "--window" => args.window = number(value()?)? as usize,
            other => {
                return Err(format!(
                    "unknown flag {other}; use --broker nats, --store sqlite,postgres, \
                     --messages N, --concurrency N, --batch N, --window N"
                ));
            }
        }
    }
    if args.broker != "nats" {
        return Err(format!(
            "--broker {}: this benchmark knows nats",
            args.broker
        ));
    }
    for store in &args.stores {
        match store.as_str() {
            "sqlite" => {}
            "postgres" if cfg!(feature = "postgres") => {}
            "postgres" => return Err("--store postgres needs --features postgres".to_owned()),
            other => return Err(format!("--store {other}: use sqlite or postgres")),
        }
    }
    Ok(args)
}

fn payload_json(n: u64) -> String {
    format!(r#"{{"order":{n},"total_cents":{}}}"#, n * 7 % 10_000)
}

fn event(n: u64) -> NewMessage {
    let payload = Payload::from_json(payload_json(n)).expect("JSON");
    NewMessage::new(MessageKind::Event, "orders.placed", payload)
}

/// A broker the benchmark can relay to: a transport for the runtime, and
/// the same client publishing raw.
trait Broker {
    type Transport: EventBus + Clone;
    /// A fresh destination; the transport that publishes there.
    async fn transport(&mut self) -> Self::Transport;
    /// Publish `messages` payloads like the outbox's to a fresh destination
    /// with `window` acknowledgements awaited at once; the time it took.
    async fn raw(&mut self, messages: u64, window: usize) -> Duration;
    /// How many messages the last transport's destination holds.
    async fn stored(&mut self) -> u64;
}

mod nats {
    use async_nats::HeaderMap;
    use async_nats::jetstream::{self, stream};
    use bytes::Bytes;
    use outbox_brokers::{NameMap, NatsConfig, NatsTransport};

    use super::*;

    pub(super) struct Nats {
        client: async_nats::Client,
        js: jetstream::Context,
        streams: Vec<String>,
        next: usize,
        window: usize,
    }

    impl Nats {
        pub(super) async fn connect(window: usize) -> Nats {
            let url = std::env::var("NATS_URL").unwrap_or_else(|_| {
                eprintln!("--broker nats needs NATS_URL; run it under scripts/with-services");
                std::process::exit(2)
            });
            let client = async_nats::connect(&url)
                .await
                .expect("connect to NATS_URL");
            let js = jetstream::ContextBuilder::new()
                .max_ack_inflight(window)
                .backpressure_on_inflight(true)
                .build(client.clone());
            Nats {
                client,
                js,
                streams: Vec::new(),
                next: 0,
                window,
            }
        }

        async fn fresh(&mut self) -> (String, String) {
            let id = format!("{}_{}", std::process::id(), self.next);
            self.next += 1;
            let name = format!("BENCH_{id}");
            let prefix = format!("bench{id}.");
            self.js
                .create_stream(stream::Config {
                    name: name.clone(),
                    subjects: vec![format!("{prefix}>")],
                    ..Default::default()
                })
                .await
                .expect("create the bench stream");
            self.streams.push(name.clone());
            (name, prefix)
        }

        pub(super) async fn clean_up(&mut self) {
            for name in self.streams.drain(..) {
                let _ = self.js.delete_stream(&name).await;
            }
        }
    }

    impl Broker for Nats {
        type Transport = NatsTransport;

        async fn transport(&mut self) -> NatsTransport {
            let (name, prefix) = self.fresh().await;
            let config = NatsConfig::new(name, NameMap::new(prefix)).max_ack_inflight(self.window);
            NatsTransport::from_client(self.client.clone(), config)
                .await
                .expect("the bench stream")
        }

        async fn raw(&mut self, messages: u64, window: usize) -> Duration {
            let (_, prefix) = self.fresh().await;
            let subject = format!("{prefix}orders.placed");
            let payloads: Vec<Bytes> = (0..messages)
                .map(|n| Bytes::from(payload_json(n)))
                .collect();
            let started = Instant::now();
            let mut acks = FuturesUnordered::new();
            for (n, payload) in payloads.into_iter().enumerate() {
                // The headers the transport sends, built per message as it does.
                let id = format!("raw-{n}");
                let mut headers = HeaderMap::new();
                headers.insert(async_nats::header::NATS_MESSAGE_ID, id.as_str());
                headers.insert("Outbox-Message-Id", id.as_str());
                headers.insert("Outbox-Name", "orders.placed");
                headers.insert("Outbox-Kind", "event");
                headers.insert("Outbox-Attempt", "1");
                let ack = self
                    .js
                    .publish_with_headers(subject.clone(), headers, payload)
                    .await
                    .expect("publish");
                acks.push(ack.into_future());
                if acks.len() >= window {
                    acks.next().await.expect("an ack").expect("acknowledged");
                }
            }
            while let Some(ack) = acks.next().await {
                ack.expect("acknowledged");
            }
            started.elapsed()
        }

        async fn stored(&mut self) -> u64 {
            let name = self.streams.last().expect("a stream").clone();
            let mut stream = self.js.get_stream(&name).await.expect("the stream");
            stream.info().await.expect("stream info").state.messages
        }
    }
}

async fn fill_sqlite(path: &std::path::Path, messages: u64) -> SqliteOutbox {
    let store = SqliteOutbox::connect(&format!("sqlite://{}", path.display()))
        .await
        .expect("open the bench database");
    let now = SystemClock.now();
    let mut n = 0;
    while n < messages {
        let mut tx = store.pool().begin().await.expect("begin");
        for _ in 0..FILL_CHUNK.min(messages - n) {
            store
                .enqueue_in(&mut tx, event(n).at(now))
                .await
                .expect("enqueue");
            n += 1;
        }
        tx.commit().await.expect("commit");
    }
    store
}

#[cfg(feature = "postgres")]
mod pg {
    use outbox::PostgresOutbox;
    use sqlx::postgres::PgPoolOptions;
    use sqlx::{AssertSqlSafe, Executor};

    use super::*;

    fn url() -> String {
        std::env::var("DATABASE_URL").unwrap_or_else(|_| {
            eprintln!("--store postgres needs DATABASE_URL; run it under scripts/with-services");
            std::process::exit(2)
        })
    }

    pub(super) async fn filled(messages: u64) -> PostgresOutbox {
        let table = format!("relay_bench_{}", std::process::id());
        let pool = PgPoolOptions::new()
            .connect_lazy(&url())
            .expect("a PostgreSQL URL");
        drop_table(&pool, &table).await;
        let store = PostgresOutbox::builder(pool)
            .table(&table)
            .expect("a valid table name")
            .notify(false)
            .build();
        store.setup().await.expect("create the bench table");
        let now = SystemClock.now();
        let mut n = 0;
        while n < messages {
            let mut tx = store.pool().begin().await.expect("begin");
            for _ in 0..FILL_CHUNK.min(messages - n) {
                store
                    .enqueue_in(&mut tx, event(n).at(now))
                    .await
                    .expect("enqueue");
                n += 1;
            }
            tx.commit().await.expect("commit");
        }
        store
            .pool()
            .execute(AssertSqlSafe(format!("ANALYZE \"{table}\"")))
            .await
            .expect("analyze");
        store
    }

    async fn drop_table(pool: &sqlx::PgPool, table: &str) {
        pool.execute(AssertSqlSafe(format!(
            "DROP TABLE IF EXISTS \"{table}\"; DROP TABLE IF EXISTS \"{table}_migrations\""
        )))
        .await
        .expect("drop the bench table");
    }

    pub(super) async fn clean_up(store: &PostgresOutbox) {
        drop_table(store.pool(), &store.table().to_string()).await;
        store.pool().close().await;
    }
}

/// Drain `store` through `transport` with the runtime; the time it took.
async fn relay(
    store: impl OutboxStore + OutboxAdmin + Clone,
    transport: impl EventBus,
    args: &Args,
) -> Duration {
    let coordinator = DrainCoordinator::builder(store)
        .registry(
            Registry::builder()
                .any(MessageKind::Event)
                .build()
                .expect("registry"),
        )
        .event_bus(transport)
        .config(DrainConfig {
            batch_size: args.batch.max(args.concurrency),
            concurrency: args.concurrency,
            ..DrainConfig::default()
        })
        .wake_on_insert(false)
        .start()
        .expect("a valid configuration");
    let started = Instant::now();
    loop {
        let report = coordinator
            .send(Drain)
            .await
            .expect("coordinator")
            .expect("pass");
        assert_eq!(
            report.delivered, report.claimed,
            "every message delivered: {report}"
        );
        let totals = coordinator
            .send(GetStatus)
            .await
            .expect("coordinator")
            .totals;
        if totals.delivered >= args.messages {
            break started.elapsed();
        }
        assert!(
            report.claimed > 0,
            "the store ran dry after {}",
            totals.delivered
        );
    }
}

async fn measure<B: Broker>(
    broker: &mut B,
    store_name: &str,
    store: impl OutboxStore + OutboxAdmin + Clone,
    args: &Args,
) {
    let raw = broker.raw(args.messages, args.window).await;
    let transport = broker.transport().await;
    let relayed = relay(store, transport, args).await;
    let stored = broker.stored().await;
    assert_eq!(stored, args.messages, "the stream holds every message once");
    let rate = |d: Duration| args.messages as f64 / d.as_secs_f64();
    let (relay_rate, raw_rate) = (rate(relayed), rate(raw));
    println!(
        "{}",
        serde_json::json!({
            "bench": "relay",
            "broker": args.broker,
            "store": store_name,
            "messages": args.messages,
            "concurrency": args.concurrency,
            "batch": args.batch.max(args.concurrency),
            "raw_window": args.window,
            "relay_msgs_per_s": relay_rate.round(),
            "raw_msgs_per_s": raw_rate.round(),
            "ratio": (relay_rate / raw_rate * 100.0).round() / 100.0,
            "stream_messages": stored,
        })
    );
}

async fn run(args: Args) {
    let mut broker = nats::Nats::connect(args.window).await;
    for store in &args.stores {
        match store.as_str() {
            "sqlite" => {
                let dir = std::env::temp_dir().join(format!("relay-bench-{}", std::process::id()));
                std::fs::create_dir_all(&dir).expect("a temporary directory");
                let outbox = fill_sqlite(&dir.join("outbox.db"), args.messages).await;
                measure(&mut broker, "sqlite", outbox.clone(), &args).await;
                outbox.pool().close().await;
                let _ = std::fs::remove_dir_all(&dir);
            }
            #[cfg(feature = "postgres")]
            "postgres" => {
                let outbox = pg::filled(args.messages).await;
                measure(&mut broker, "postgres", outbox.clone(), &args).await;
                pg::clean_up(&outbox).await;
            }
            _ => unreachable!("checked by parse_args"),
        }
    }
    broker.clean_up().await;
}

fn main() {
    let args = parse_args().unwrap_or_else(|message| {
        eprintln!("{message}");
        std::process::exit(2)
    });
    actix_rt::System::new().block_on(run(args));
}
