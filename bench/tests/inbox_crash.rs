//! The inbox crash harness: exactly-once effects through SIGKILLs.
//!
//! A relay (an outbox drained by the actor runtime, in this process)
//! publishes 5 000 messages through a broker, each one twice: every first
//! attempt reports a lost acknowledgement after the broker took the
//! message, so the relay publishes it again (on NATS, after the stream's
//! duplicate window, so JetStream keeps both copies). Meanwhile a consumer
//! process (`inbox_consumer`) applies each message through an inbox on
//! PostgreSQL, its effect an `INSERT` into a table with no unique key, and
//! is killed with SIGKILL twenty times at random moments and restarted each
//! time: mid-transaction, between a commit and its acknowledgement, with
//! messages pulled and not yet applied. The last run goes on until the
//! broker has nothing left for it (on Kafka it reads the topic again from
//! its start, in a group of its own, so the inbox meets every copy an
//! earlier run applied). Then the effects table must hold every
//! message exactly once: 0 lost, 0 doubled. On Kafka, each key's effects
//! must also have committed in enqueue order.
//!
//! NATS and Kafka, against the servers of `scripts/with-services`
//! (`DATABASE_URL`, `NATS_URL`, `KAFKA_URL`):
//!
//!   scripts/with-services cargo test -p outbox-bench --all-features --test inbox_crash -- --nocapture
//!
//! Each run prints its figure line, `inbox crash harness (BROKER): N
//! messages, 20 kills, lost 0, doubled 0`, and a line of details. The kill
//! moments come from a seeded generator; the seed is printed, and
//! `OUTBOX_CRASH_SEED=<seed>` replays the same schedule (the moments, not
//! the machine's timing). Real processes on real time, bounded by the kill
//! schedule and a limit on the last run; the two runs take turns.
#![cfg(feature = "postgres")]

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::FutureExt;
use futures_util::future::LocalBoxFuture;
use outbox::sqlx::{self, AssertSqlSafe, PgPool};
use outbox::{
    Delivery, DeliveryError, DeliveryResult, DrainConfig, EventBus, MemoryOutbox, MessageKind,
    MessageStatus, NewMessage, OutboxStore, Payload, PostgresInbox, Registry, RetryPolicy,
};
use outbox_actors::{DrainCoordinator, Shutdown};
use outbox_brokers::NameMap;

/// Messages the relay publishes (each twice).
const MESSAGES: usize = 5_000;
/// Consumer runs killed with SIGKILL; one more then finishes.
const KILLS: u32 = 20;
/// The relay enqueues in this many chunks, one every [`Pace::chunk_every`],
/// so it is still publishing while the kills go on.
const CHUNKS: usize = 20;
/// Ordering keys of the messages (Kafka puts a key in one partition).
const KEYS: usize = 50;
/// The last run must have applied and acknowledged everything within this.
const LAST_RUN_LIMIT: Duration = Duration::from_secs(240);

/// How the last run, which is not killed, consumes differently.
#[derive(Debug, Default, Clone, Copy)]
struct LastRun<'a> {
    /// Replaces the runs' `--source`.
    source: Option<&'a str>,
    /// Added to the runs' flags.
    flags: &'a [&'a str],
}

/// How fast a run goes on a broker: when its consumer is killed, and how
/// fast the relay publishes to keep pace with the kills.
#[derive(Debug, Clone, Copy)]
struct Pace {
    /// A run is killed this long after it was started (uniform, in ms).
    kill_after_ms: (u64, u64),
    /// The time between two chunks of messages.
    chunk_every: Duration,
}

/// NATS: a run consumes within milliseconds of its start.
const NATS: Pace = Pace {
    kill_after_ms: (300, 900),
    chunk_every: Duration::from_millis(400),
};

/// Kafka: a run first joins the group, which waits for the session of the
/// run killed before it to time out, so each run lives longer.
const KAFKA: Pace = Pace {
    kill_after_ms: (2_000, 4_000),
    chunk_every: Duration::from_millis(2_500),
};

/// The two runs take turns: each measures a consumer alone on the machine.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn service_url(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!(
            "{var} is not set: the inbox crash harness needs the servers of scripts/with-services \
             (scripts/with-services cargo test -p outbox-bench --all-features --test inbox_crash)"
        )
    })
}

fn nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_nanos()
}

/// A name no other run uses.
fn unique(prefix: &str) -> String {
    format!(
        "{prefix}_{}_{}",
        std::process::id(),
        nanos() % 1_000_000_000
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_applies_every_message_once_through_twenty_kills() {
    let _turn = SERIAL.lock().await;
    let url = service_url("NATS_URL");
    let stream = unique("INBOXCRASH");
    let prefix = format!("{}.", stream.to_ascii_lowercase());
    let js = async_nats::jetstream::new(
        async_nats::connect(&url)
            .await
            .expect("connect to NATS_URL"),
    );
    js.create_stream(async_nats::jetstream::stream::Config {
        name: stream.clone(),
        subjects: vec![format!("{prefix}>")],
        // Shorter than the relay's retry delay: the second copy of each
        // message is stored, as a republish after the window would be.
        duplicate_window: Duration::from_millis(100),
        ..Default::default()
    })
    .await
    .expect("create the stream");
    js.get_stream(&stream)
        .await
        .expect("the stream")
        .create_consumer(async_nats::jetstream::consumer::pull::Config {
            durable_name: Some("crash".to_owned()),
            // Short, so what a killed run pulled comes back soon.
            ack_wait: Duration::from_secs(1),
            ..Default::default()
        })
        .await
        .expect("create the durable consumer");
    let relay = {
        let (url, stream, prefix) = (url.clone(), stream.clone(), prefix.clone());
        move || async move {
            let config = outbox_brokers::NatsConfig::new(&stream, NameMap::new(&prefix));
            outbox_brokers::NatsTransport::connect(&url, config)
                .await
                .expect("connect the relay")
        }
    };
    let drained = {
        let (js, stream) = (js.clone(), stream.clone());
        move || {
            let (js, stream) = (js.clone(), stream.clone());
            async move {
                let mut stream = js.get_stream(&stream).await.map_err(|e| e.to_string())?;
                let consumer = stream
                    .consumer_info("crash")
                    .await
                    .map_err(|e| e.to_string())?;
                if consumer.num_pending > 0 || consumer.num_ack_pending > 0 {
                    return Err(format!(
                        "{} pending, {} awaiting an ack, {} redelivered",
                        consumer.num_pending, consumer.num_ack_pending, consumer.num_redelivered
                    ));
                }
                Ok(stream
                    .info()
                    .await
                    .map_err(|e| e.to_string())?
                    .state
                    .messages)
            }
        }
    };
    harness(
        "nats",
        NATS,
        relay,
        &["--url", &url, "--source", &format!("{stream}/crash")],
        LastRun::default(),
        drained,
        false,
    )
    .await;
    let _ = js.delete_stream(&stream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_applies_every_message_once_in_key_order_through_twenty_kills() {
    let _turn = SERIAL.lock().await;
    let url = service_url("KAFKA_URL");
    let brokers = url.trim_start_matches("kafka://").to_owned();
    let prefix = format!("{}.", unique("inboxcrash"));
    let topic = format!("{prefix}crash.tick");
    kafka::create_topic(&brokers, &topic, 8).await;
    let group = unique("crash");
    // The last run reads in a group of its own, from the topic's start:
    // tansu 0.6 can leave a killed member's partitions assigned to it for
    // good, so a run in the killed runs' group may never get them. The
    // inbox, shared by every run, skips whatever an earlier run applied;
    // that is what this harness proves, whatever the group's offsets.
    let last_group = format!("{group}-last");
    let relay = {
        let (url, prefix) = (url.clone(), prefix.clone());
        move || async move {
            outbox_brokers::KafkaTransport::connect(
                &url,
                outbox_brokers::KafkaConfig::new(NameMap::new(&prefix)),
            )
            .await
            .expect("connect the relay")
        }
    };
    let drained = {
        let (brokers, topic, group) = (brokers.clone(), topic.clone(), last_group.clone());
        move || {
            let (brokers, topic, group) = (brokers.clone(), topic.clone(), group.clone());
            async move {
                match kafka::caught_up(brokers.clone(), topic.clone(), group.clone()).await {
                    Some(stored) => Ok(stored),
                    None => Err(kafka::describe(brokers, topic, group).await),
                }
            }
        }
    };
    harness(
        "kafka",
        KAFKA,
        relay,
        &[
            "--url",
            &url,
            "--source",
            &format!("{topic}/{group}"),
            // A killed run's partitions go to the next one once its
            // session times out: keep that short.
            "--set",
            "session.timeout.ms=1500",
            "--set",
            "heartbeat.interval.ms=300",
        ],
        LastRun {
            source: Some(&format!("{topic}/{last_group}")),
            // The last run is never killed: a session as short as the
            // killed runs' would expire whenever a loaded machine delays a
            // heartbeat, and tansu can keep the partitions of a member it
            // expired.
            flags: &[
                "--set",
                "session.timeout.ms=30000",
                "--set",
                "heartbeat.interval.ms=3000",
            ],
        },
        drained,
        true,
    )
    .await;
}

/// Publish, kill twenty times, let the last run finish, and judge the
/// effects. `relay` makes the relay's transport (in the relay's thread),
/// `pace` times the kills and the relay, `consumer_args` tell
/// `inbox_consumer` where to consume, `last` changes them for the last
/// run, `drained` answers how many copies
/// the broker stored once it has nothing left for the consumer (else what
/// it has left, to report a stall), `keyed`
/// asks for per-key order to be checked.
async fn harness<R, RF, T, D, DF>(
    label: &str,
    pace: Pace,
    relay: R,
    consumer_args: &[&str],
    last: LastRun<'_>,
    drained: D,
    keyed: bool,
) where
    R: FnOnce() -> RF + Send + 'static,
    RF: std::future::Future<Output = T>,
    T: EventBus + Clone,
    D: Fn() -> DF,
    DF: std::future::Future<Output = Result<u64, String>>,
{
    let seed = seed();
    println!(
        "inbox crash harness ({label}): seed {seed}; replay the schedule with \
         OUTBOX_CRASH_SEED={seed} cargo test -p outbox-bench --all-features --test inbox_crash"
    );
    let started = Instant::now();
    let database = service_url("DATABASE_URL");
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&database)
        .await
        .expect("connect to DATABASE_URL");
    let table = unique(&format!("inbox_crash_{label}"));
    PostgresInbox::builder(pool.clone())
        .table(&table)
        .expect("a valid table name")
        .build()
        .setup()
        .await
        .expect("set up the inbox");
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE TABLE \"{table}_effects\" (message_id text NOT NULL, run bigint NOT NULL, \
         key text, n bigint, seq bigint GENERATED ALWAYS AS IDENTITY)"
    )))
    .execute(&pool)
    .await
    .expect("create the effects table");

    let published = Arc::new(AtomicU64::new(0));
    let relay_thread = {
        let published = Arc::clone(&published);
        std::thread::spawn(move || {
            actix::System::new().block_on(async move {
                let transport = relay().await;
                run_relay(transport, published, pace.chunk_every).await;
            })
        })
    };

    let mut rng = SplitMix64(seed);
    let mut args: Vec<String> = consumer_args.iter().map(|a| (*a).to_owned()).collect();
    args.extend([
        "--database".into(),
        database.clone(),
        "--table".into(),
        table.clone(),
    ]);
    let stderr = std::env::temp_dir().join(format!("{table}.stderr"));
    for run in 0..KILLS {
        let mut child = spawn_consumer(label, &args, run, &stderr);
        let after = rng.between(pace.kill_after_ms.0, pace.kill_after_ms.1);
        tokio::time::sleep(Duration::from_millis(after)).await;
        if let Some(status) = child.try_wait().expect("poll the consumer") {
            panic!(
                "run {run} exited by itself ({status}) before its kill (seed {seed}); its \
                 stderr: {}",
                std::fs::read_to_string(&stderr).unwrap_or_default()
            );
        }
        // SIGKILL: no shutdown, nothing acknowledged or committed after it.
        child.kill().expect("SIGKILL the consumer");
        child.wait().expect("reap the consumer");
    }

    if let Some(source) = last.source {
        let at = args
            .iter()
            .position(|a| a == "--source")
            .expect("a --source")
            + 1;
        args[at] = source.to_owned();
    }
    args.extend(last.flags.iter().map(|flag| (*flag).to_owned()));
    let mut last = spawn_consumer(label, &args, KILLS, &stderr);
    relay_thread.join().expect("the relay thread");
    let deadline = Instant::now() + LAST_RUN_LIMIT;
    let stored = loop {
        if let Some(status) = last.try_wait().expect("poll the consumer") {
            panic!(
                "the last run exited ({status}, seed {seed}); its stderr: {}",
                std::fs::read_to_string(&stderr).unwrap_or_default()
            );
        }
        let state = if applied(&pool, &table).await.len() == MESSAGES {
            drained().await
        } else {
            Err("messages left to apply".to_owned())
        };
        if let Ok(stored) = state {
            break stored;
        }
        if Instant::now() > deadline {
            last.kill().ok();
            last.wait().ok();
            panic!(
                "the last run did not apply and acknowledge everything within \
                 {LAST_RUN_LIMIT:?} (seed {seed}): {} of {MESSAGES} applied; the broker: {}; \
                 its stderr: {}",
                applied(&pool, &table).await.len(),
                drained().await.err().unwrap_or_default(),
                std::fs::read_to_string(&stderr).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    last.kill().ok();
    last.wait().ok();

    let applied = applied(&pool, &table).await;
    let lost = (0..MESSAGES)
        .filter(|n| !applied.contains_key(&message_id(*n)))
        .count();
    let doubled: Vec<_> = applied.iter().filter(|(_, rows)| **rows > 1).collect();
    let out_of_order = if keyed {
        out_of_order(&pool, &table).await
    } else {
        Vec::new()
    };
    let runs_applying: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(DISTINCT run) FROM \"{table}_effects\""
    )))
    .fetch_one(&pool)
    .await
    .expect("count the runs");
    println!(
        "inbox crash harness ({label}): {MESSAGES} messages, {KILLS} kills, lost {lost}, doubled {}",
        doubled.len()
    );
    println!(
        "inbox crash harness ({label}) details: {} copies published, {stored} stored by the \
         broker, effects committed by {} of {} runs, {} keys out of order, seed {seed}, {:.1}s",
        published.load(Ordering::Relaxed),
        runs_applying,
        KILLS + 1,
        out_of_order.len(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!(lost, 0, "messages never applied (seed {seed})");
    assert!(
        doubled.is_empty(),
        "messages applied twice (seed {seed}): {doubled:?}"
    );
    assert!(
        out_of_order.is_empty(),
        "keys whose effects committed out of enqueue order (seed {seed}): {out_of_order:?}"
    );
    assert_eq!(
        (published.load(Ordering::Relaxed), stored),
        (2 * MESSAGES as u64, 2 * MESSAGES as u64),
        "the relay publishes each message twice, and the broker keeps both copies"
    );
    sqlx::raw_sql(AssertSqlSafe(format!(
        "DROP TABLE \"{table}_effects\", \"{table}_inbox\", \"{table}\", \"{table}_migrations\", \
         \"{table}_drains\" CASCADE; \
         DROP SEQUENCE \"{table}_armed\", \"{table}_served\""
    )))
    .execute(&pool)
    .await
    .ok();
    let _ = std::fs::remove_file(&stderr);
}

fn message_id(n: usize) -> String {
    format!("tick-{n:05}")
}

/// How many effect rows each message has.
async fn applied(pool: &PgPool, table: &str) -> BTreeMap<String, i64> {
    let rows: Vec<(String, i64)> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT message_id, count(*) FROM \"{table}_effects\" GROUP BY message_id"
    )))
    .fetch_all(pool)
    .await
    .expect("count the effects");
    rows.into_iter().collect()
}

/// The keys whose effects did not commit in enqueue order.
async fn out_of_order(pool: &PgPool, table: &str) -> Vec<String> {
    let rows: Vec<(String, i64)> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT key, n FROM \"{table}_effects\" ORDER BY seq"
    )))
    .fetch_all(pool)
    .await
    .expect("read the effects in commit order");
    let mut last: BTreeMap<String, i64> = BTreeMap::new();
    let mut wrong = Vec::new();
    for (key, n) in rows {
        if last.get(&key).is_some_and(|before| *before > n) && !wrong.contains(&key) {
            wrong.push(key.clone());
        }
        last.insert(key, n);
    }
    wrong
}

fn spawn_consumer(broker: &str, args: &[String], run: u32, stderr: &Path) -> Child {
    let stderr = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(stderr)
        .expect("open the consumer's stderr file");
    Command::new(env!("CARGO_BIN_EXE_inbox_consumer"))
        .args(["--broker", broker])
        .args(args)
        .args(["--run", &run.to_string(), "--work-ms", "0-1"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("start inbox_consumer")
}

/// Enqueue the messages chunk by chunk and drain them through `transport`,
/// losing every first acknowledgement; returns once all are delivered.
async fn run_relay<T: EventBus + Clone>(
    transport: T,
    published: Arc<AtomicU64>,
    chunk_every: Duration,
) {
    let store = MemoryOutbox::new();
    let mut retry = RetryPolicy::default();
    retry.max_attempts = Some(1_000);
    // Longer than NATS's duplicate window: the second copy is stored.
    retry.initial_delay = Duration::from_millis(300);
    retry.max_delay = Duration::from_secs(1);
    retry.jitter = 0.0;
    let coordinator = DrainCoordinator::builder(store.clone())
        .registry(
            Registry::builder()
                .any(MessageKind::Event)
                .build()
                .expect("a registry"),
        )
        .event_bus(LoseFirstAck {
            bus: transport,
            published,
        })
        .config(DrainConfig {
            batch_size: 200,
            concurrency: 64,
            every: Some(Duration::from_millis(50)),
            retry,
            ..DrainConfig::default()
        })
        .start()
        .expect("the relay starts");
    let per_chunk = MESSAGES / CHUNKS;
    for chunk in 0..CHUNKS {
        for n in chunk * per_chunk..(chunk + 1) * per_chunk {
            let key = format!("key-{}", n % KEYS);
            let payload = Payload::from(serde_json::json!({ "n": n, "key": key }));
            let message = NewMessage::new(MessageKind::Event, "crash.tick", payload)
                .with_id(message_id(n))
                .with_ordering_key(key);
            store.enqueue(message).await.expect("enqueue");
        }
        tokio::time::sleep(chunk_every).await;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let delivered = store
            .snapshot()
            .iter()
            .filter(|m| m.status == MessageStatus::Delivered)
            .count();
        if delivered == MESSAGES {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the relay delivered {delivered} of {MESSAGES} in two minutes"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = coordinator
        .send(Shutdown {
            grace: Duration::from_secs(5),
        })
        .await;
}

/// Publishes through the transport, then fails each message's first
/// attempt as if the broker's acknowledgement had been lost: the relay
/// publishes it again.
#[derive(Clone)]
struct LoseFirstAck<T> {
    bus: T,
    published: Arc<AtomicU64>,
}

impl<T: EventBus + Clone> EventBus for LoseFirstAck<T> {
    fn publish(&self, delivery: Delivery) -> LocalBoxFuture<'static, DeliveryResult> {
        let first = delivery.context.attempt() == 1;
        let published = Arc::clone(&self.published);
        let publish = self.bus.publish(delivery);
        async move {
            publish.await?;
            published.fetch_add(1, Ordering::Relaxed);
            if first {
                return Err(DeliveryError::msg("the acknowledgement was lost (forced)"));
            }
            Ok(())
        }
        .boxed_local()
    }
}

/// `OUTBOX_CRASH_SEED`, else a new one from the clock.
fn seed() -> u64 {
    match std::env::var("OUTBOX_CRASH_SEED") {
        Ok(text) => text
            .parse()
            .unwrap_or_else(|e| panic!("OUTBOX_CRASH_SEED={text:?} is not a u64 seed: {e}")),
        Err(_) => nanos() as u64,
    }
}

/// SplitMix64: a small seeded generator, so the kill schedule replays.
struct SplitMix64(u64);

impl SplitMix64 {
    fn between(&mut self, low: u64, high: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        low + (z ^ (z >> 31)) % (high - low + 1)
    }
}

/// The Kafka side: a topic of its own, and whether the group caught up.
mod kafka {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::{ClientConfig, Offset, TopicPartitionList};

    pub(crate) async fn create_topic(brokers: &str, topic: &str, partitions: i32) {
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .create()
            .expect("an admin client");
        let created = admin
            .create_topics(
                &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
                &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
            )
            .await
            .expect("CreateTopics answered");
        for result in created {
            result.unwrap_or_else(|(name, code)| panic!("creating topic {name}: {code:?}"));
        }
    }

    /// How many records `topic` holds, once `group` committed on every
    /// partition the offset after its last record; `None` before.
    pub(crate) async fn caught_up(brokers: String, topic: String, group: String) -> Option<u64> {
        tokio::task::spawn_blocking(move || {
            // Not subscribed: reading the group's offsets does not join it.
            let reader: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", brokers)
                .set("group.id", &group)
                .set("enable.auto.commit", "false")
                .create()
                .expect("a reader");
            let timeout = Duration::from_secs(10);
            let metadata = reader.fetch_metadata(Some(&topic), timeout).ok()?;
            let mut wanted = TopicPartitionList::new();
            let mut ends = BTreeMap::new();
            for partition in metadata.topics()[0].partitions() {
                let (low, high) = reader
                    .fetch_watermarks(&topic, partition.id(), timeout)
                    .ok()?;
                ends.insert(partition.id(), (low, high));
                wanted.add_partition(&topic, partition.id());
            }
            let committed = reader.committed_offsets(wanted, timeout).ok()?;
            let done = committed.elements().iter().all(|element| {
                let (low, high) = ends[&element.partition()];
                match element.offset() {
                    Offset::Offset(offset) => offset >= high,
                    _ => high == low,
                }
            });
            done.then(|| ends.values().map(|(low, high)| (high - low) as u64).sum())
        })
        .await
        .expect("the reader thread")
    }

    /// The group's members and, per partition, its watermarks and committed
    /// offset: what a stalled run is told with.
    pub(crate) async fn describe(brokers: String, topic: String, group: String) -> String {
        tokio::task::spawn_blocking(move || {
            let reader: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", brokers)
                .set("group.id", &group)
                .set("enable.auto.commit", "false")
                .create()
                .expect("a reader");
            let timeout = Duration::from_secs(10);
            let members = match reader.fetch_group_list(Some(&group), timeout) {
                Ok(list) => list
                    .groups()
                    .iter()
                    .map(|g| format!("{} {} members {}", g.name(), g.state(), g.members().len()))
                    .collect::<Vec<_>>()
                    .join("; "),
                Err(error) => format!("no group list: {error}"),
            };
            let mut partitions = Vec::new();
            if let Ok(metadata) = reader.fetch_metadata(Some(&topic), timeout) {
                let mut wanted = TopicPartitionList::new();
                for partition in metadata.topics()[0].partitions() {
                    wanted.add_partition(&topic, partition.id());
                }
                if let Ok(committed) = reader.committed_offsets(wanted, timeout) {
                    for element in committed.elements() {
                        let marks = reader.fetch_watermarks(&topic, element.partition(), timeout);
                        partitions.push(format!(
                            "{}: committed {:?}, watermarks {marks:?}",
                            element.partition(),
                            element.offset()
                        ));
                    }
                }
            }
            format!("group {members}; partitions {}", partitions.join(", "))
        })
        .await
        .expect("the reader thread")
    }
}
