//! Relay throughput to each broker against a raw publishing loop, in the
//! same run.
//!
//! ```text
//! scripts/with-services cargo run --release -p outbox-bench --bin relay_bench -- --store sqlite
//! WITH_POSTGRES_DURABLE=1 scripts/with-services cargo run --release -p outbox-bench \
//!     --features postgres --bin relay_bench -- --store sqlite,postgres
//! ```
//!
//! For each broker of `--broker` (`nats`, `amqp`, `redis`, `kafka`, a list
//! of them, or `all`, the default; from `NATS_URL`, `AMQP_URL`, `REDIS_URL`,
//! `KAFKA_URL`) and each
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
//!   transport's own dedup-and-`XADD` script, each reply awaited. Kafka:
//!   an idempotent `acks=all` producer, each delivery report awaited.
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
//! The destination is checked afterwards to hold every message once.
//!
//! # Output
//!
//! One JSON line per (store, broker): `bench` (`"relay"`), `broker`,
//! `store`, `messages`, `concurrency`, `batch`, `prefetch`, `arbiters`,
//! `raw_window`, the three rates `relay_msgs_per_s`, `raw_msgs_per_s` and
//! `drain_msgs_per_s`, `ratio` (relay over raw), `relay_to_drain`, and
//! `stream_messages` (what the destination held afterwards).
//!
//! And what each part cost this process, in microseconds of user and
//! system CPU per message: `client_cpu_us_per_msg` (the relay),
//! `raw_client_cpu_us_per_msg` (the raw loop) and
//! `drain_client_cpu_us_per_msg` (the drain to nowhere), with `cpu_ratio`,
//! the relay's over the raw loop's. The parts run one after another and
//! nothing else in the process works meanwhile, so each figure is that
//! part's own; the brokers' servers are other processes and count in none.
//! On a machine whose cores the broker's server shares, the rates say as
//! much about the machine as about the relay; the CPU per message does not
//! depend on what the server takes.
//!
//! A broker is a module implementing [`Broker`], named in [`BROKERS`] and in
//! [`run`].

mod amqp;
mod kafka;
mod nats;
mod redis_streams;

use std::future::{Future, IntoFuture};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use outbox::{
    Clock, DrainConfig, EventBus, MessageKind, NewMessage, OutboxAdmin, OutboxStore, Payload,
    Registry, SystemClock,
};
use outbox_actors::DrainCoordinator;
use outbox_bench::args::{Flags, refuse};
use outbox_bench::drain::drain_loop;
use outbox_bench::report::print_json;
use outbox_bench::resources::with_user_system_cpu;
use outbox_bench::stats::{per_sec, round};
use outbox_bench::store::sqlite::TempDatabase;
use outbox_bench::store::{FILL_CHUNK, STORES, check, fill, memory_filled};

const BROKERS: [&str; 4] = ["nats", "amqp", "redis", "kafka"];

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
            prefetch: Some(self.prefetch),
            delivery_arbiters: self.arbiters,
            ..DrainConfig::default()
        }
    }
}

fn parse_args(mut flags: Flags) -> Result<Args, String> {
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
    while let Some(flag) = flags.next_flag() {
        let mut number = || -> Result<u64, String> {
            let v = flags.value(&flag)?;
            v.parse::<u64>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("{flag} {v}: write a whole number above 0"))
        };
        match flag.as_str() {
            "--broker" => {
                args.brokers = match flags.list(&flag)? {
                    list if list == ["all"] => BROKERS.map(str::to_owned).to_vec(),
                    list => list,
                }
            }
            "--store" => args.stores = flags.list(&flag)?,
            "--messages" => args.messages = number()?,
            "--concurrency" => args.concurrency = number()? as usize,
            "--batch" => args.batch = number()? as usize,
            "--window" => args.window = number()? as usize,
            "--prefetch" => {
                args.prefetch = flags
                    .value(&flag)?
                    .parse()
                    .map_err(|_| "--prefetch: write a whole number from 0".to_owned())?
            }
            "--arbiters" => {
                args.arbiters = flags
                    .value(&flag)?
                    .parse()
                    .map_err(|_| "--arbiters: write a whole number from 0".to_owned())?
            }
            other => {
                return Err(format!(
                    "unknown flag {other}; use --broker nats,amqp,redis,kafka (or all), --store memory,sqlite,postgres, \
                     --messages N, --concurrency N, --batch N, --prefetch N, --arbiters N, --window N"
                ));
            }
        }
    }
    args.drain_config()
        .validate()
        .map_err(|e| format!("the drain's settings: {e}"))?;
    if let Some(other) = args.brokers.iter().find(|b| !BROKERS.contains(&b.as_str())) {
        return Err(format!(
            "--broker {other}: use nats, amqp, redis, kafka or all"
        ));
    }
    for store in &args.stores {
        check(store, STORES)?;
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
    /// its own ([`raw_on_own_runtime`]); the time and the CPU it took.
    async fn raw(&mut self, messages: u64, window: usize) -> Spent;
    /// How many messages the last transport's destination holds.
    async fn stored(&mut self) -> u64;
    /// Remove every destination this benchmark made.
    async fn clean_up(&mut self);
}

/// What a timed part took: its wall time, and the user and system time the
/// process spent meanwhile (`None` off Linux).
#[derive(Debug, Clone, Copy)]
struct Spent {
    elapsed: Duration,
    cpu: Option<Duration>,
}

/// Run a raw loop on a multi-threaded runtime of its own, two workers (one
/// per core of the machine the README's figures come from), apart from the
/// actor system: `connect` (untimed) makes its client
/// there, so the client's connection task runs there too, and `publish`
/// (timed) publishes; the time and the CPU `publish` took. The actix
/// thread waits for the loop without running anything, so the process's
/// CPU meanwhile is the loop's own.
fn raw_on_own_runtime<C, P>(
    connect: impl FnOnce() -> C + Send + 'static,
    publish: impl FnOnce(C::Output) -> P + Send + 'static,
) -> Spent
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
            let ((), cpu) = with_user_system_cpu(async {
                publish(client).await;
            })
            .await;
            Spent {
                elapsed: started.elapsed(),
                cpu,
            }
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
    drain_loop(&coordinator, args.messages).await
}

/// Drain `store` through `transport` as [`drain`] does, with the user and
/// system time the process spent meanwhile: the actix thread, the store's
/// threads and the transport's client, and nothing else, since nothing else
/// in the process works while a drain runs.
async fn drain_spent(
    store: impl OutboxStore + OutboxAdmin + Clone,
    transport: impl EventBus,
    args: &Args,
) -> Spent {
    let (elapsed, cpu) = with_user_system_cpu(drain(store, transport, args)).await;
    Spent { elapsed, cpu }
}

async fn measure<B: Broker>(
    broker: &mut B,
    store_name: &str,
    [store, ceiling]: [impl OutboxStore + OutboxAdmin + Clone; 2],
    args: &Args,
) {
    let raw = broker.raw(args.messages, args.window).await;
    let drained = drain_spent(ceiling, Nowhere, args).await;
    let transport = broker.transport().await;
    let relayed = drain_spent(store, transport, args).await;
    let stored = broker.stored().await;
    assert_eq!(
        stored, args.messages,
        "the destination holds every message once"
    );
    let rate = |spent: Spent| per_sec(args.messages, spent.elapsed);
    let (relay_rate, raw_rate, drain_rate) = (rate(relayed), rate(raw), rate(drained));
    let per_message = |spent: Spent| {
        spent
            .cpu
            .map(|cpu| cpu.as_secs_f64() * 1e6 / args.messages as f64)
    };
    let (relay_cpu, raw_cpu, drain_cpu) =
        (per_message(relayed), per_message(raw), per_message(drained));
    let cpu_ratio = relay_cpu
        .zip(raw_cpu)
        .map(|(relay, raw)| round(relay / raw, 2));
    // `json!` sorts the keys, as every earlier line of this benchmark had them.
    print_json(&serde_json::json!({
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
            "ratio": round(relay_rate / raw_rate, 2),
            "drain_msgs_per_s": drain_rate.round(),
            "relay_to_drain": round(relay_rate / drain_rate, 2),
            "client_cpu_us_per_msg": relay_cpu.map(|us| round(us, 2)),
            "raw_client_cpu_us_per_msg": raw_cpu.map(|us| round(us, 2)),
            "drain_client_cpu_us_per_msg": drain_cpu.map(|us| round(us, 2)),
            "cpu_ratio": cpu_ratio,
            "stream_messages": stored,
    }));
}

async fn run(args: Args) {
    for broker in &args.brokers {
        match broker.as_str() {
            "nats" => each_store(&mut nats::Nats::connect(args.window).await, &args).await,
            "amqp" => each_store(&mut amqp::Amqp::connect().await, &args).await,
            "redis" => each_store(&mut redis_streams::Redis::connect().await, &args).await,
            "kafka" => each_store(&mut kafka::Kafka::connect().await, &args).await,
            _ => unreachable!("checked by parse_args"),
        }
    }
}

/// One line per store of `args`, each from a freshly filled outbox.
async fn each_store<B: Broker>(broker: &mut B, args: &Args) {
    for store in &args.stores {
        let now = SystemClock.now();
        let events = |n| event(n).at(now);
        match store.as_str() {
            "sqlite" => {
                let (relayed_file, drained_file) = (
                    TempDatabase::new("relay-bench-relayed"),
                    TempDatabase::new("relay-bench-drained"),
                );
                let (relayed, drained) = (relayed_file.open().await, drained_file.open().await);
                fill(&relayed, 0..args.messages, FILL_CHUNK, events).await;
                fill(&drained, 0..args.messages, FILL_CHUNK, events).await;
                measure(broker, "sqlite", [relayed.clone(), drained.clone()], args).await;
                relayed.pool().close().await;
                drained.pool().close().await;
            }
            #[cfg(feature = "postgres")]
            "postgres" => {
                use outbox_bench::store::postgres::{analyze, database_url, drop_tables, fresh};
                let url = database_url().unwrap_or_else(|message| refuse(message));
                let mut stores = Vec::new();
                for side in ["relayed", "drained"] {
                    let table = format!("relay_bench_{}_{side}", std::process::id());
                    let options = sqlx::postgres::PgPoolOptions::new();
                    let store = fresh(&url, &table, options, false).await;
                    fill(&store, 0..args.messages, FILL_CHUNK, events).await;
                    analyze(&store).await;
                    stores.push((table, store));
                }
                let [relayed, drained] = [&stores[0].1, &stores[1].1].map(Clone::clone);
                measure(broker, "postgres", [relayed, drained], args).await;
                for (table, store) in stores {
                    drop_tables(&url, &table).await;
                    store.pool().close().await;
                }
            }
            _ => {
                let stores = [
                    memory_filled(args.messages, events).await,
                    memory_filled(args.messages, events).await,
                ];
                measure(broker, "memory", stores, args).await;
            }
        }
    }
    broker.clean_up().await;
}

fn main() {
    let args = parse_args(Flags::from_env()).unwrap_or_else(|message| refuse(message));
    actix_rt::System::new().block_on(run(args));
}
