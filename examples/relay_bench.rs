//! Relay throughput to each broker against a raw publishing loop, in the
//! same run.
//!
//! ```text
//! scripts/with-services cargo run --release --example relay_bench -- --store sqlite
//! WITH_POSTGRES_DURABLE=1 scripts/with-services cargo run --release \
//!     --features postgres --example relay_bench -- --store sqlite,postgres
//! ```
//!
//! For each broker of `--broker` (`nats`, `amqp`, `redis`, a list of them,
//! or `all`, the default; from `NATS_URL`, `AMQP_URL`, `REDIS_URL`) and each
//! store it fills a fresh outbox with `--messages` events (100 000 by
//! default), then, timed:
//!
//! - **raw**: the broker's client crate publishing the same payloads with
//!   the same headers and the same acknowledgement mode into a fresh
//!   destination, with `--window` publishes awaiting their acknowledgement
//!   at once: the best a relay could do over that connection, with no store
//!   at all, on a connection and a two-worker Tokio runtime of its own.
//!   NATS: JetStream `PubAck`s. RabbitMQ: persistent, mandatory
//!   publishes on a confirm-mode channel, each confirm awaited. Redis: the
//!   transport's own dedup-and-`XADD` script, each reply awaited.
//! - **relay**: the actor runtime draining the outbox into another fresh
//!   destination through the broker transport (`Drain` in a loop, `--batch`
//!   messages a pass, `--concurrency` deliveries in flight), each message
//!   settled in the store once the broker acknowledged it.
//! - **drain**: the same runtime with the same settings draining a second
//!   outbox, filled alike, into a bus that publishes nowhere: the store's
//!   and the runtime's own ceiling, which no transport can pass. The relay
//!   over this (`relay_to_drain`) is what the transport costs; the drain
//!   over the raw loop bounds the ratio any transport could reach.
//!
//! `--store memory` relays from the in-memory store: no SQL at all, so the
//! relay there is what the runtime and the transport cost together, the
//! most any store could reach on the same machine.
//!
//! The drains run as `outbox relay` does by default: `--batch 10000`,
//! `--concurrency 256`, `--prefetch 256`, no `--arbiters` (the drain's
//! `delivery_arbiters`).
//!
//! The destination is checked afterwards to hold every message once. Each
//! (store, broker) prints one JSON line with the three rates and the ratios.

use std::future::{Future, IntoFuture};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use outbox::{
    Clock, DrainConfig, EventBus, MemoryOutbox, MessageKind, NewMessage, OutboxAdmin, OutboxStore,
    Payload, Registry, SqliteOutbox, SystemClock,
};
use outbox_actors::{Drain, DrainCoordinator, GetStatus};

const BROKERS: [&str; 3] = ["nats", "amqp", "redis"];
const FILL_CHUNK: u64 = 10_000;

struct Args {
    brokers: Vec<String>,
    stores: Vec<String>,
    messages: u64,
    concurrency: usize,
    batch: usize,
    prefetch: usize,
    arbiters: usize,
    window: usize,
}

impl Args {
    /// The settings of both drains, the relay's and the one to nowhere.
    fn drain_config(&self) -> DrainConfig {
        DrainConfig {
            batch_size: self.batch.max(self.concurrency),
            concurrency: self.concurrency,
            prefetch: self.prefetch,
            delivery_arbiters: self.arbiters,
            ..DrainConfig::default()
        }
    }
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        brokers: BROKERS.map(str::to_owned).to_vec(),
        stores: vec!["sqlite".to_owned()],
        messages: 100_000,
        concurrency: 256,
        batch: 10_000,
        prefetch: 256,
        arbiters: 0,
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
            "--broker" => {
                args.brokers = match value()?.as_str() {
                    "all" => BROKERS.map(str::to_owned).to_vec(),
                    list => list.split(',').map(str::to_owned).collect(),
                }
            }
            "--store" => args.stores = value()?.split(',').map(str::to_owned).collect(),
            "--messages" => args.messages = number(value()?)?,
            "--concurrency" => args.concurrency = number(value()?)? as usize,
            "--batch" => args.batch = number(value()?)? as usize,
            "--window" => args.window = number(value()?)? as usize,
            "--prefetch" => {
                args.prefetch = value()?
                    .parse()
                    .map_err(|_| "--prefetch: write a whole number from 0".to_owned())?
            }
            "--arbiters" => {
                args.arbiters = value()?
                    .parse()
                    .map_err(|_| "--arbiters: write a whole number from 0".to_owned())?
            }
            other => {
                return Err(format!(
                    "unknown flag {other}; use --broker nats,amqp,redis (or all), --store memory,sqlite,postgres, \
                     --messages N, --concurrency N, --batch N, --prefetch N, --arbiters N, --window N"
                ));
            }
        }
    }
    args.drain_config()
        .validate()
        .map_err(|e| format!("the drain's settings: {e}"))?;
    if let Some(other) = args.brokers.iter().find(|b| !BROKERS.contains(&b.as_str())) {
        return Err(format!("--broker {other}: use nats, amqp, redis or all"));
    }
    for store in &args.stores {
        match store.as_str() {
            "memory" | "sqlite" => {}
            "postgres" if cfg!(feature = "postgres") => {}
            "postgres" => return Err("--store postgres needs --features postgres".to_owned()),
            other => return Err(format!("--store {other}: use memory, sqlite or postgres")),
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
    /// The name `--broker` and the JSON line use.
    const NAME: &'static str;
    type Transport: EventBus + Clone;
    /// A fresh destination; the transport that publishes there.
    async fn transport(&mut self) -> Self::Transport;
    /// Publish `messages` payloads like the outbox's to a fresh destination
    /// with `window` acknowledgements awaited at once, on a connection of
    /// its own ([`raw_on_own_runtime`]); the time it took.
    async fn raw(&mut self, messages: u64, window: usize) -> Duration;
    /// How many messages the last transport's destination holds.
    async fn stored(&mut self) -> u64;
    /// Remove every destination this benchmark made.
    async fn clean_up(&mut self);
}

/// Run a raw loop on a multi-threaded runtime of its own, two workers (one
/// per core of the machine the README's figures come from), apart from the
/// actor system: `connect` (untimed) makes its client
/// there, so the client's connection task runs there too, and `publish`
/// (timed) publishes; the time `publish` took.
fn raw_on_own_runtime<C, P>(
    connect: impl FnOnce() -> C + Send + 'static,
    publish: impl FnOnce(C::Output) -> P + Send + 'static,
) -> Duration
where
    C: Future,
    P: Future,
{
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime for the raw loop");
        runtime.block_on(async move {
            let client = connect().await;
            let started = Instant::now();
            publish(client).await;
            started.elapsed()
        })
    })
    .join()
    .expect("the raw loop")
}

/// The URL in `var`, which `scripts/with-services` exports.
fn service_url(var: &str, broker: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        eprintln!("--broker {broker} needs {var}; run it under scripts/with-services");
        std::process::exit(2)
    })
}

mod nats {
    use async_nats::HeaderMap;
    use async_nats::jetstream::{self, stream};
    use bytes::Bytes;
    use outbox_brokers::{NameMap, NatsConfig, NatsTransport};

    use super::*;

    pub(super) struct Nats {
        url: String,
        js: jetstream::Context,
        streams: Vec<String>,
        next: usize,
        window: usize,
    }

    impl Nats {
        pub(super) async fn connect(window: usize) -> Nats {
            let url = service_url("NATS_URL", "nats");
            let client = async_nats::connect(&url)
                .await
                .expect("connect to NATS_URL");
            Nats {
                url,
                js: jetstream::new(client),
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
    }

    impl Broker for Nats {
        const NAME: &'static str = "nats";
        type Transport = NatsTransport;

        async fn transport(&mut self) -> NatsTransport {
            let (name, prefix) = self.fresh().await;
            let config = NatsConfig::new(name, NameMap::new(prefix)).max_ack_inflight(self.window);
            NatsTransport::connect(&self.url, config)
                .await
                .expect("the bench stream")
        }

        async fn raw(&mut self, messages: u64, window: usize) -> Duration {
            let (_, prefix) = self.fresh().await;
            let url = self.url.clone();
            let connect = move || async move {
                let client = async_nats::connect(url).await.expect("connect to NATS_URL");
                jetstream::ContextBuilder::new()
                    .max_ack_inflight(window)
                    .backpressure_on_inflight(true)
                    .build(client)
            };
            let payloads = (0..messages)
                .map(|n| Bytes::from(payload_json(n)))
                .collect();
            raw_on_own_runtime(connect, move |js| publish(js, prefix, payloads, window))
        }

        async fn stored(&mut self) -> u64 {
            let name = self.streams.last().expect("a stream").clone();
            let mut stream = self.js.get_stream(&name).await.expect("the stream");
            stream.info().await.expect("stream info").state.messages
        }

        async fn clean_up(&mut self) {
            for name in self.streams.drain(..) {
                let _ = self.js.delete_stream(&name).await;
            }
        }
    }

    /// The raw loop.
    async fn publish(js: jetstream::Context, prefix: String, payloads: Vec<Bytes>, window: usize) {
        let subject = format!("{prefix}orders.placed");
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
            let ack = js
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
    }
}

mod amqp {
    use lapin::options::{
        BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, ExchangeDeleteOptions,
        QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
    };
    use lapin::publisher_confirm::Confirmation;
    use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
    use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
    use outbox_brokers::{AmqpConfig, AmqpTransport, NameMap};

    use super::*;

    /// Routing keys are this prefix and the message name; each destination
    /// is an exchange of its own with one queue bound to `bench.#`.
    const PREFIX: &str = "bench.";

    pub(super) struct Amqp {
        url: String,
        connection: Connection,
        channel: Channel,
        names: Vec<String>,
    }

    /// A connection to `url` and a channel on it in confirm mode.
    async fn confirm_channel(url: &str) -> (Connection, Channel) {
        let connection = Connection::connect(url, ConnectionProperties::default())
            .await
            .expect("connect to AMQP_URL");
        let channel = connection.create_channel().await.expect("a channel");
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .expect("confirm mode");
        (connection, channel)
    }

    impl Amqp {
        pub(super) async fn connect() -> Amqp {
            let url = service_url("AMQP_URL", "amqp");
            let (connection, channel) = confirm_channel(&url).await;
            Amqp {
                url,
                connection,
                channel,
                names: Vec::new(),
            }
        }

        /// A durable topic exchange and a durable queue bound to it, both
        /// named after the run.
        async fn fresh(&mut self) -> String {
            let name = format!("relay_bench_{}_{}", std::process::id(), self.names.len());
            let durable = ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            };
            self.channel
                .exchange_declare(&name, ExchangeKind::Topic, durable, FieldTable::default())
                .await
                .expect("declare the bench exchange");
            let queue = QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            };
            self.channel
                .queue_declare(&name, queue, FieldTable::default())
                .await
                .expect("declare the bench queue");
            self.channel
                .queue_bind(
                    &name,
                    &name,
                    &format!("{PREFIX}#"),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .expect("bind the bench queue");
            self.names.push(name.clone());
            name
        }
    }

    /// The raw loop.
    async fn publish(channel: &Channel, exchange: &str, payloads: Vec<String>, window: usize) {
        let routing_key = format!("{PREFIX}orders.placed");
        let mandatory = BasicPublishOptions {
            mandatory: true,
            immediate: false,
        };
        let acked = |confirmed: lapin::Result<Confirmation>| {
            let confirmed = confirmed.expect("confirmed");
            assert!(
                matches!(confirmed, Confirmation::Ack(None)),
                "{confirmed:?}"
            );
        };
        let mut confirms = FuturesUnordered::new();
        for (n, payload) in payloads.iter().enumerate() {
            // The properties the transport sends, built per message as it does.
            let id = format!("raw-{n}");
            let mut headers = FieldTable::default();
            for (name, value) in [
                ("Outbox-Message-Id", id.as_str()),
                ("Outbox-Name", "orders.placed"),
                ("Outbox-Kind", "event"),
                ("Outbox-Attempt", "1"),
            ] {
                headers.insert(
                    ShortString::from(name),
                    AMQPValue::LongString(LongString::from(value)),
                );
            }
            let properties = BasicProperties::default()
                .with_message_id(ShortString::from(id))
                .with_type(ShortString::from("orders.placed"))
                .with_content_type(ShortString::from("application/json"))
                .with_delivery_mode(2)
                .with_headers(headers);
            let confirm = channel
                .basic_publish(
                    exchange,
                    &routing_key,
                    mandatory,
                    payload.as_bytes(),
                    properties,
                )
                .await
                .expect("publish");
            confirms.push(confirm.into_future());
            if confirms.len() >= window {
                acked(confirms.next().await.expect("a confirm"));
            }
        }
        while let Some(confirmed) = confirms.next().await {
            acked(confirmed);
        }
    }

    impl Broker for Amqp {
        const NAME: &'static str = "amqp";
        type Transport = AmqpTransport;

        async fn transport(&mut self) -> AmqpTransport {
            let name = self.fresh().await;
            let config = AmqpConfig::new(name).routing(NameMap::new(PREFIX));
            AmqpTransport::connect(&self.url, config)
                .await
                .expect("the bench exchange")
        }

        async fn raw(&mut self, messages: u64, window: usize) -> Duration {
            let exchange = self.fresh().await;
            let url = self.url.clone();
            let connect = move || async move { confirm_channel(&url).await };
            let payloads = (0..messages).map(payload_json).collect();
            raw_on_own_runtime(connect, move |(connection, channel)| async move {
                publish(&channel, &exchange, payloads, window).await;
                let _ = connection.close(200, "done").await;
            })
        }

        async fn stored(&mut self) -> u64 {
            let name = self.names.last().expect("a queue");
            let passive = QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            };
            let queue = self
                .channel
                .queue_declare(name, passive, FieldTable::default())
                .await
                .expect("the bench queue");
            u64::from(queue.message_count())
        }

        async fn clean_up(&mut self) {
            for name in self.names.drain(..) {
                let _ = self
                    .channel
                    .queue_delete(&name, QueueDeleteOptions::default())
                    .await;
                let _ = self
                    .channel
                    .exchange_delete(&name, ExchangeDeleteOptions::default())
                    .await;
            }
            let _ = self.connection.close(200, "done").await;
        }
    }
}

mod redis_streams {
    use outbox_brokers::NameMap;
    use outbox_brokers::redis::{PUBLISH_SCRIPT, RedisConfig, RedisTransport};
    use redis::Script;
    use redis::aio::MultiplexedConnection;

    use super::*;

    /// How long the benchmark's dedup keys live if a run dies before its
    /// clean-up.
    const DEDUP_WINDOW: Duration = Duration::from_secs(600);

    pub(super) struct Redis {
        url: String,
        connection: MultiplexedConnection,
        /// The key prefix of each destination made so far.
        prefixes: Vec<String>,
    }

    impl Redis {
        pub(super) async fn connect() -> Redis {
            let url = service_url("REDIS_URL", "redis");
            let connection = redis::Client::open(url.as_str())
                .expect("REDIS_URL is a Redis URL")
                .get_multiplexed_async_connection()
                .await
                .expect("connect to REDIS_URL");
            Redis {
                url,
                connection,
                prefixes: Vec::new(),
            }
        }

        /// A key prefix of its own: the stream is `<prefix>orders.placed`,
        /// the dedup keys `<prefix>dedup:<id>`.
        fn fresh(&mut self) -> String {
            let prefix = format!(
                "relay_bench:{}:{}:",
                std::process::id(),
                self.prefixes.len()
            );
            self.prefixes.push(prefix.clone());
            prefix
        }
    }

    /// The raw loop.
    async fn publish(
        connection: MultiplexedConnection,
        prefix: String,
        payloads: Vec<String>,
        window: usize,
    ) {
        let script = Script::new(PUBLISH_SCRIPT);
        let stream = format!("{prefix}orders.placed");
        let window_ms = DEDUP_WINDOW.as_millis() as u64;
        let mut replies = FuturesUnordered::new();
        for (n, payload) in payloads.iter().enumerate() {
            // The arguments the transport sends, built per message as it does.
            let id = format!("raw-{n}");
            let mut invocation = script.prepare_invoke();
            invocation
                .key(format!("{prefix}dedup:{id}"))
                .key(&stream)
                .arg(window_ms)
                .arg(0)
                .arg("payload")
                .arg(payload.as_str())
                .arg("Outbox-Message-Id")
                .arg(&id)
                .arg("Outbox-Name")
                .arg("orders.placed")
                .arg("Outbox-Kind")
                .arg("event")
                .arg("Outbox-Attempt")
                .arg(1);
            let mut connection = connection.clone();
            replies.push(async move { invocation.invoke_async::<String>(&mut connection).await });
            if replies.len() >= window {
                replies.next().await.expect("a reply").expect("appended");
            }
        }
        while let Some(reply) = replies.next().await {
            reply.expect("appended");
        }
    }

    impl Broker for Redis {
        const NAME: &'static str = "redis";
        type Transport = RedisTransport;

        async fn transport(&mut self) -> RedisTransport {
            let prefix = self.fresh();
            let config = RedisConfig::new()
                .streams(NameMap::new(prefix.clone()))
                .dedup_prefix(format!("{prefix}dedup:"))
                .dedup_window(DEDUP_WINDOW);
            RedisTransport::connect(&self.url, config)
                .await
                .expect("the bench server")
        }

        async fn raw(&mut self, messages: u64, window: usize) -> Duration {
            let prefix = self.fresh();
            let url = self.url.clone();
            let connect = move || async move {
                let mut connection = redis::Client::open(url.as_str())
                    .expect("REDIS_URL is a Redis URL")
                    .get_multiplexed_async_connection()
                    .await
                    .expect("connect to REDIS_URL");
                // Loaded before the clock starts, as the transport loads it
                // when it connects.
                let _: String = Script::new(PUBLISH_SCRIPT)
                    .prepare_invoke()
                    .load_async(&mut connection)
                    .await
                    .expect("load the script");
                connection
            };
            let payloads = (0..messages).map(payload_json).collect();
            raw_on_own_runtime(connect, move |connection| {
                publish(connection, prefix, payloads, window)
            })
        }

        async fn stored(&mut self) -> u64 {
            let prefix = self.prefixes.last().expect("a stream");
            redis::cmd("XLEN")
                .arg(format!("{prefix}orders.placed"))
                .query_async(&mut self.connection)
                .await
                .expect("XLEN")
        }

        async fn clean_up(&mut self) {
            for prefix in self.prefixes.drain(..) {
                let mut cursor = 0u64;
                loop {
                    let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(format!("{prefix}*"))
                        .arg("COUNT")
                        .arg(10_000)
                        .query_async(&mut self.connection)
                        .await
                        .expect("SCAN");
                    if !keys.is_empty() {
                        let _: Result<u64, _> = redis::cmd("UNLINK")
                            .arg(&keys)
                            .query_async(&mut self.connection)
                            .await;
                    }
                    if next == 0 {
                        break;
                    }
                    cursor = next;
                }
            }
        }
    }
}

async fn fill_memory(messages: u64) -> MemoryOutbox {
    let store = MemoryOutbox::new();
    let now = SystemClock.now();
    for n in 0..messages {
        store.enqueue(event(n).at(now)).await.expect("enqueue");
    }
    store
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

    /// An outbox of `messages` events in a fresh table named after the run
    /// and `side`.
    pub(super) async fn filled(messages: u64, side: &str) -> PostgresOutbox {
        let table = format!("relay_bench_{}_{side}", std::process::id());
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
            "DROP TABLE IF EXISTS \"{table}\", \"{table}_migrations\", \"{table}_drains\"; \
             DROP FUNCTION IF EXISTS \"{table}_wake\", \"{table}_claim_heads\", \"{table}_claim\", \"{table}_settle\""
        )))
        .await
        .expect("drop the bench table");
    }

    pub(super) async fn clean_up(store: &PostgresOutbox) {
        drop_table(store.pool(), &store.table().to_string()).await;
        store.pool().close().await;
    }
}

/// A bus that publishes nowhere: the drain with it is the store's and the
/// runtime's ceiling, which no transport can pass.
#[derive(Clone)]
struct Nowhere;

impl EventBus for Nowhere {
    fn publish(
        &self,
        _: outbox::Delivery,
    ) -> futures_util::future::LocalBoxFuture<'static, outbox::DeliveryResult> {
        Box::pin(std::future::ready(Ok(())))
    }
}

/// Drain `store` through `transport` with the runtime; the time it took.
async fn drain(
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
        .config(args.drain_config())
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
    [store, ceiling]: [impl OutboxStore + OutboxAdmin + Clone; 2],
    args: &Args,
) {
    let raw = broker.raw(args.messages, args.window).await;
    let drained = drain(ceiling, Nowhere, args).await;
    let transport = broker.transport().await;
    let relayed = drain(store, transport, args).await;
    let stored = broker.stored().await;
    assert_eq!(
        stored, args.messages,
        "the destination holds every message once"
    );
    let rate = |d: Duration| args.messages as f64 / d.as_secs_f64();
    let (relay_rate, raw_rate, drain_rate) = (rate(relayed), rate(raw), rate(drained));
    println!(
        "{}",
        serde_json::json!({
            "bench": "relay",
            "broker": B::NAME,
            "store": store_name,
            "messages": args.messages,
            "concurrency": args.concurrency,
            "batch": args.batch.max(args.concurrency),
            "prefetch": args.prefetch,
            "arbiters": args.arbiters,
            "raw_window": args.window,
            "relay_msgs_per_s": relay_rate.round(),
            "raw_msgs_per_s": raw_rate.round(),
            "ratio": (relay_rate / raw_rate * 100.0).round() / 100.0,
            "drain_msgs_per_s": drain_rate.round(),
            "relay_to_drain": (relay_rate / drain_rate * 100.0).round() / 100.0,
            "stream_messages": stored,
        })
    );
}

async fn run(args: Args) {
    for broker in &args.brokers {
        match broker.as_str() {
            "nats" => each_store(&mut nats::Nats::connect(args.window).await, &args).await,
            "amqp" => each_store(&mut amqp::Amqp::connect().await, &args).await,
            "redis" => each_store(&mut redis_streams::Redis::connect().await, &args).await,
            _ => unreachable!("checked by parse_args"),
        }
    }
}

/// One line per store of `args`, each from a freshly filled outbox.
async fn each_store<B: Broker>(broker: &mut B, args: &Args) {
    for store in &args.stores {
        match store.as_str() {
            "memory" => {
                let stores = [
                    fill_memory(args.messages).await,
                    fill_memory(args.messages).await,
                ];
                measure(broker, "memory", stores, args).await;
            }
            "sqlite" => {
                let dir = std::env::temp_dir().join(format!("relay-bench-{}", std::process::id()));
                std::fs::create_dir_all(&dir).expect("a temporary directory");
                let relayed = fill_sqlite(&dir.join("outbox.db"), args.messages).await;
                let drained = fill_sqlite(&dir.join("drained.db"), args.messages).await;
                measure(broker, "sqlite", [relayed.clone(), drained.clone()], args).await;
                relayed.pool().close().await;
                drained.pool().close().await;
                let _ = std::fs::remove_dir_all(&dir);
            }
            #[cfg(feature = "postgres")]
            "postgres" => {
                let relayed = pg::filled(args.messages, "relayed").await;
                let drained = pg::filled(args.messages, "drained").await;
                measure(broker, "postgres", [relayed.clone(), drained.clone()], args).await;
                pg::clean_up(&relayed).await;
                pg::clean_up(&drained).await;
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
