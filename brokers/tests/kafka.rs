//! The Kafka transport against a real Kafka-protocol broker (tansu, as
//! `scripts/with-services` starts it: `KAFKA_URL`, and `WITH_SERVICES_CTL`
//! to stop and start it).
//!
//!   scripts/with-services cargo test -p outbox-brokers --features kafka --test kafka
//!
//! A real broker answers in real time, so every wait here is a bounded poll.

mod harness;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use futures_util::future::LocalBoxFuture;
use harness::{
    coordinator, count, counting, ctl, enqueue, serial, service_url, settled, shutdown, unique,
    wait_for,
};
use outbox::{
    Delivery, DeliveryResult, EventBus, MemoryOutbox, MessageKind, MessageStatus, NewMessage,
    OutboxStore, Payload,
};
use outbox_brokers::kafka::{InvalidTopic, KafkaConfig, KafkaTransport};
use outbox_brokers::{FailureClass, NameMap};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

fn bootstrap() -> String {
    service_url("KAFKA_URL")
        .strip_prefix("kafka://")
        .expect("KAFKA_URL starts with kafka://")
        .to_owned()
}

/// A topic prefix no other test uses.
fn prefix() -> String {
    format!("t{}.", unique())
}

/// Create `topic` with `partitions` partitions.
async fn create_topic(topic: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
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

async fn transport(config: KafkaConfig) -> KafkaTransport {
    KafkaTransport::connect(&service_url("KAFKA_URL"), config)
        .await
        .expect("connect the transport")
}

/// One record as a consumer reads it.
#[derive(Debug, Clone)]
struct Record {
    partition: i32,
    offset: i64,
    key: Option<String>,
    payload: String,
    headers: Vec<(String, String)>,
}

impl Record {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    fn id(&self) -> &str {
        self.header("Outbox-Message-Id")
            .expect("every record carries its message id")
    }
}

/// Every record of `topic`, partition by partition, in offset order.
async fn read_topic(topic: &str) -> Vec<Record> {
    let topic = topic.to_owned();
    let brokers = bootstrap();
    tokio::task::spawn_blocking(move || {
        // librdkafka wants a group even for an assignment; nothing is
        // committed to it.
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("group.id", format!("reader-{}", unique()))
            .set("enable.auto.commit", "false")
            .create()
            .expect("a consumer");
        let timeout = Duration::from_secs(10);
        let metadata = consumer
            .fetch_metadata(Some(&topic), timeout)
            .expect("the topic's metadata");
        let partitions: Vec<i32> = metadata.topics()[0]
            .partitions()
            .iter()
            .map(|p| p.id())
            .collect();
        let mut assignment = TopicPartitionList::new();
        let mut remaining = BTreeMap::new();
        for &partition in &partitions {
            let (low, high) = consumer
                .fetch_watermarks(&topic, partition, timeout)
                .expect("the partition's watermarks");
            if high > low {
                remaining.insert(partition, high);
            }
            assignment
                .add_partition_offset(&topic, partition, Offset::Beginning)
                .expect("assign");
        }
        consumer.assign(&assignment).expect("assign");
        let mut records = Vec::new();
        let start = Instant::now();
        while !remaining.is_empty() {
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "read {} records of {topic}, still waiting for {remaining:?}",
                records.len()
            );
            let Some(message) = consumer.poll(Duration::from_millis(200)) else {
                continue;
            };
            let message = message.expect("a record");
            let text = |bytes: &[u8]| String::from_utf8(bytes.to_vec()).expect("UTF-8");
            let headers = message
                .headers()
                .map(|headers| {
                    headers
                        .iter()
                        .map(|h| (h.key.to_owned(), text(h.value.unwrap_or_default())))
                        .collect()
                })
                .unwrap_or_default();
            let record = Record {
                partition: message.partition(),
                offset: message.offset(),
                key: message.key().map(text),
                payload: text(message.payload().unwrap_or_default()),
                headers,
            };
            if remaining
                .get(&record.partition)
                .is_some_and(|&high| record.offset + 1 >= high)
            {
                remaining.remove(&record.partition);
            }
            records.push(record);
        }
        records.sort_by_key(|r| (r.partition, r.offset));
        records
    })
    .await
    .expect("the reader thread")
}

/// One publish attempt as the wrapper saw it.
#[derive(Debug, Clone)]
struct Attempt {
    id: String,
    started: Instant,
    ended: Instant,
    ok: bool,
}

/// Records every publish attempt with its times and outcome.
#[derive(Clone)]
struct Timed<B> {
    bus: B,
    attempts: Arc<Mutex<Vec<Attempt>>>,
}

impl<B: EventBus + Clone> EventBus for Timed<B> {
    fn publish(&self, delivery: Delivery) -> LocalBoxFuture<'static, DeliveryResult> {
        let id = delivery.context.message().id.clone();
        let attempts = Arc::clone(&self.attempts);
        let started = Instant::now();
        let publish = self.bus.publish(delivery);
        async move {
            let result = publish.await;
            attempts.lock().unwrap().push(Attempt {
                id,
                started,
                ended: Instant::now(),
                ok: result.is_ok(),
            });
            result
        }
        .boxed_local()
    }
}

/// Enqueue `per_key` messages for each of `keys` ordering keys, round
/// robin, payload `{"key":k,"seq":j}`.
async fn enqueue_keyed(store: &MemoryOutbox, name: &str, keys: usize, per_key: usize) {
    for seq in 0..per_key {
        for key in 0..keys {
            let payload = Payload::from_json(format!(r#"{{"key":{key},"seq":{seq}}}"#)).unwrap();
            let message = NewMessage::new(MessageKind::Event, name, payload)
                .with_ordering_key(format!("key-{key}"));
            store.enqueue(message).await.expect("enqueue");
        }
    }
}

fn seq_of(record: &Record) -> u64 {
    let payload: serde_json::Value = serde_json::from_str(&record.payload).expect("JSON");
    payload["seq"].as_u64().expect("a seq")
}

#[test]
fn ten_thousand_keyed_messages_survive_a_broker_restart_mid_relay() {
    let _serial = serial();
    harness::run(|| async {
        const KEYS: usize = 100;
        const PER_KEY: usize = 100;
        const N: usize = KEYS * PER_KEY;
        let prefix = prefix();
        let topic = format!("{prefix}orders.placed");
        create_topic(&topic, 8).await;
        let store = MemoryOutbox::new();
        enqueue_keyed(&store, "orders.placed", KEYS, PER_KEY).await;
        let attempts = Arc::new(Mutex::new(Vec::new()));
        let bus = Timed {
            bus: transport(
                KafkaConfig::new(NameMap::new(prefix.as_str()))
                    .delivery_timeout(Duration::from_secs(3)),
            )
            .await,
            attempts: Arc::clone(&attempts),
        };
        let coordinator = coordinator(&store, bus);
        let limit = Duration::from_secs(120);
        wait_for("a tenth delivered", limit, || async {
            count(&store, MessageStatus::Delivered).await >= N / 10
        })
        .await;
        let stop_began = Instant::now();
        ctl("stop", "kafka");
        let stop_ended = Instant::now();
        let delivered_at_stop = count(&store, MessageStatus::Delivered).await;
        wait_for("a publish to fail", limit, || async {
            attempts.lock().unwrap().iter().any(|a| !a.ok)
        })
        .await;
        ctl("start", "kafka");
        wait_for(
            "every message delivered",
            Duration::from_secs(600),
            || async { count(&store, MessageStatus::Delivered).await == N },
        )
        .await;
        shutdown(coordinator).await;

        let records = read_topic(&topic).await;
        let attempts = attempts.lock().unwrap().clone();
        let failed = attempts.iter().filter(|a| !a.ok).count();
        // A record the broker may hold without its publish having been
        // acknowledged: a failed publish that was on its way when the
        // broker went (started before the stop ended, ended after it began).
        let in_flight_at_stop: HashSet<&str> = attempts
            .iter()
            .filter(|a| !a.ok && a.started <= stop_ended && a.ended >= stop_began)
            .map(|a| a.id.as_str())
            .collect();
        let mut copies: HashMap<&str, Vec<&Record>> = HashMap::new();
        for record in &records {
            copies.entry(record.id()).or_default().push(record);
        }
        let lost = N - copies.len();
        let duplicates = records.len() - copies.len();
        println!(
            "kafka restart: N={N} keys={KEYS} delivered_at_stop={delivered_at_stop} \
             attempts={} failed_attempts={failed} records={} distinct_ids={} lost={lost} \
             duplicates={duplicates} bound_in_flight_at_stop={}",
            attempts.len(),
            records.len(),
            copies.len(),
            in_flight_at_stop.len(),
        );
        assert!(failed > 0, "the outage was seen");
        assert_eq!(lost, 0, "every message is in the topic");
        assert_eq!(count(&store, MessageStatus::DeadLettered).await, 0);

        // A copy is the same message: same key, same payload, same partition.
        for (id, same) in &copies {
            for copy in &same[1..] {
                assert_eq!(copy.payload, same[0].payload, "{id}");
                assert_eq!(copy.key, same[0].key, "{id}");
                assert_eq!(copy.partition, same[0].partition, "{id}");
            }
            if same.len() > 1 {
                assert!(
                    in_flight_at_stop.contains(id),
                    "{id} was published twice without an attempt in flight at the stop"
                );
            }
        }
        assert!(
            duplicates <= in_flight_at_stop.len(),
            "{duplicates} duplicates, at most {} were in flight at the stop",
            in_flight_at_stop.len()
        );

        // Each key in one partition, its messages in enqueue order there
        // (a duplicate right after its first copy, never after a later one).
        let mut by_key: BTreeMap<&str, Vec<&Record>> = BTreeMap::new();
        for record in &records {
            by_key
                .entry(record.key.as_deref().expect("a key"))
                .or_default()
                .push(record);
        }
        assert_eq!(by_key.len(), KEYS);
        for (key, records) in by_key {
            let partitions: HashSet<i32> = records.iter().map(|r| r.partition).collect();
            assert_eq!(partitions.len(), 1, "{key} spread over {partitions:?}");
            let seqs: Vec<u64> = records.iter().map(|r| seq_of(r)).collect();
            assert!(
                seqs.windows(2).all(|w| w[0] <= w[1]),
                "{key} out of order: {seqs:?}"
            );
            let mut distinct = seqs.clone();
            distinct.dedup();
            assert_eq!(distinct, (0..PER_KEY as u64).collect::<Vec<_>>(), "{key}");
        }
    });
}

#[test]
fn the_record_carries_the_payload_the_key_the_headers_and_the_trace_context() {
    let _serial = serial();
    harness::run(|| async {
        let prefix = prefix();
        let topic = format!("{prefix}orders.placed");
        create_topic(&topic, 3).await;
        let store = MemoryOutbox::new();
        let ids = enqueue(&store, "orders.placed", 1).await;
        let keyed = NewMessage::new(
            MessageKind::Event,
            "orders.placed",
            Payload::from_json(r#"{"n":1}"#).unwrap(),
        )
        .with_ordering_key("order-7")
        .with_trace(harness::trace());
        let keyed = store.enqueue(keyed).await.unwrap().into_id();
        let transport = transport(KafkaConfig::new(NameMap::new(prefix.as_str()))).await;
        let coordinator = coordinator(&store, transport);
        for id in [&ids[0], &keyed] {
            let message = settled(&store, id, Duration::from_secs(30)).await;
            assert_eq!(message.status, MessageStatus::Delivered);
        }
        shutdown(coordinator).await;

        let records = read_topic(&topic).await;
        assert_eq!(records.len(), 2);
        let first = records.iter().find(|r| r.id() == ids[0]).unwrap();
        let second = records.iter().find(|r| r.id() == keyed).unwrap();
        let trace = harness::trace();
        assert_eq!(first.payload, r#"{"n":0}"#);
        assert_eq!(first.key, None);
        assert_eq!(second.key.as_deref(), Some("order-7"));
        for (record, id) in [(first, &ids[0]), (second, &keyed)] {
            let names: Vec<&str> = record.headers.iter().map(|(k, _)| k.as_str()).collect();
            assert_eq!(
                names,
                [
                    "Outbox-Message-Id",
                    "Outbox-Name",
                    "Outbox-Kind",
                    "Outbox-Attempt",
                    "traceparent",
                    "tracestate"
                ]
            );
            assert_eq!(record.header("Outbox-Message-Id"), Some(id.as_str()));
            assert_eq!(record.header("Outbox-Name"), Some("orders.placed"));
            assert_eq!(record.header("Outbox-Kind"), Some("event"));
            assert_eq!(record.header("Outbox-Attempt"), Some("1"));
            assert_eq!(
                record.header("traceparent"),
                Some(trace.traceparent.as_str())
            );
            assert_eq!(record.header("tracestate"), trace.tracestate.as_deref());
        }
    });
}

#[test]
fn an_outbox_redelivery_is_a_new_record_with_the_same_message_id() {
    let _serial = serial();
    harness::run(|| async {
        const KEYS: usize = 10;
        const PER_KEY: usize = 20;
        const N: usize = KEYS * PER_KEY;
        let prefix = prefix();
        let topic = format!("{prefix}orders.placed");
        create_topic(&topic, 4).await;
        let store = MemoryOutbox::new();
        enqueue_keyed(&store, "orders.placed", KEYS, PER_KEY).await;
        // Every first attempt is reported failed after the broker took it,
        // as when an acknowledgement is lost: the outbox publishes again.
        let (bus, stats) = counting(
            transport(KafkaConfig::new(NameMap::new(prefix.as_str()))).await,
            true,
        );
        let coordinator = coordinator(&store, bus);
        wait_for(
            "every message delivered",
            Duration::from_secs(120),
            || async { count(&store, MessageStatus::Delivered).await == N },
        )
        .await;
        shutdown(coordinator).await;
        assert_eq!(stats.acked(), 2 * N as u64);

        // The idempotent producer does not see through it: two records per
        // message, which a consumer tells apart by the message id only.
        let records = read_topic(&topic).await;
        assert_eq!(records.len(), 2 * N);
        let mut by_id: HashMap<&str, Vec<&Record>> = HashMap::new();
        for record in &records {
            by_id.entry(record.id()).or_default().push(record);
        }
        assert_eq!(by_id.len(), N);
        for (id, copies) in &by_id {
            assert_eq!(copies.len(), 2, "{id}");
            assert_eq!(copies[0].payload, copies[1].payload);
            assert_eq!(copies[0].partition, copies[1].partition);
            let attempts: Vec<_> = copies
                .iter()
                .map(|c| c.header("Outbox-Attempt").unwrap())
                .collect();
            assert_eq!(attempts, ["1", "2"], "{id}");
        }
        // Within a partition a key's copies come in pairs, in enqueue order.
        let mut by_key: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
        for record in &records {
            by_key
                .entry(record.key.as_deref().unwrap())
                .or_default()
                .push(seq_of(record));
        }
        for (key, seqs) in by_key {
            let expected: Vec<u64> = (0..PER_KEY as u64).flat_map(|s| [s, s]).collect();
            assert_eq!(seqs, expected, "{key}");
        }
    });
}

#[test]
fn an_unknown_topic_dead_letters_at_once() {
    let _serial = serial();
    harness::run(|| async {
        let prefix = prefix();
        let store = MemoryOutbox::new();
        let ids = enqueue(&store, "orders.placed", 1).await;
        let transport = transport(
            KafkaConfig::new(NameMap::new(prefix.as_str()))
                .delivery_timeout(Duration::from_secs(4)),
        )
        .await;
        let coordinator = coordinator(&store, transport);
        let message = settled(&store, &ids[0], Duration::from_secs(60)).await;
        shutdown(coordinator).await;

        assert_eq!(message.status, MessageStatus::DeadLettered);
        assert_eq!(message.attempts, 1, "dead-lettered at once");
        let error = message.last_error.expect("the reason is kept");
        assert!(
            error.message.contains(&format!("{prefix}orders.placed")),
            "{error:?}"
        );
        assert!(error.message.contains("does not exist"), "{error:?}");
    });
}

#[test]
fn a_message_over_the_size_limit_dead_letters_at_once() {
    let _serial = serial();
    harness::run(|| async {
        let prefix = prefix();
        let topic = format!("{prefix}orders.placed");
        create_topic(&topic, 1).await;
        let store = MemoryOutbox::new();
        let big = format!(r#"{{"blob":"{}"}}"#, "x".repeat(20_000));
        let big = NewMessage::new(
            MessageKind::Event,
            "orders.placed",
            Payload::from_json(big).unwrap(),
        );
        let big = store.enqueue(big).await.unwrap().into_id();
        let small = enqueue(&store, "orders.placed", 1).await;
        let transport = transport(
            KafkaConfig::new(NameMap::new(prefix.as_str())).set("message.max.bytes", "10000"),
        )
        .await;
        let coordinator = coordinator(&store, transport);
        let refused = settled(&store, &big, Duration::from_secs(30)).await;
        let taken = settled(&store, &small[0], Duration::from_secs(30)).await;
        shutdown(coordinator).await;

        assert_eq!(refused.status, MessageStatus::DeadLettered);
        assert_eq!(refused.attempts, 1, "dead-lettered at once");
        let error = refused.last_error.expect("the reason is kept");
        assert!(error.message.contains("larger than"), "{error:?}");
        assert_eq!(taken.status, MessageStatus::Delivered);
        let records = read_topic(&topic).await;
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].id(), small[0]);
    });
}

#[test]
fn a_name_that_maps_to_an_invalid_topic_dead_letters_naming_it() {
    let _serial = serial();
    harness::run(|| async {
        let transport = transport(KafkaConfig::new(NameMap::new("events."))).await;
        assert_eq!(
            transport.topic("orders placed"),
            Err(InvalidTopic {
                name: "orders placed".into(),
                topic: "events.orders placed".into(),
                reason: "has a character outside [a-zA-Z0-9._-]",
            })
        );
        let store = MemoryOutbox::new();
        let ids = enqueue(&store, "orders placed", 1).await;
        let coordinator = coordinator(&store, transport);
        let message = settled(&store, &ids[0], Duration::from_secs(30)).await;
        shutdown(coordinator).await;

        assert_eq!(message.status, MessageStatus::DeadLettered);
        assert_eq!(message.attempts, 1);
        let error = message.last_error.expect("the reason is kept");
        assert!(error.message.contains("`orders placed`"), "{error:?}");
    });
}

#[test]
fn connect_errors_are_classified() {
    let _serial = serial();
    harness::run(|| async {
        for bad in ["http://127.0.0.1:9092", "kafka://127.0.0.1"] {
            let error = KafkaTransport::connect(bad, KafkaConfig::default())
                .await
                .expect_err(bad);
            assert_eq!(error.class, FailureClass::Permanent, "{error}");
        }
        let refused = KafkaTransport::connect(
            &service_url("KAFKA_URL"),
            KafkaConfig::default().set("acks", "1"),
        )
        .await
        .expect_err("acks belongs to the transport");
        assert_eq!(refused.class, FailureClass::Permanent, "{refused}");
        let invalid = KafkaTransport::connect(
            &service_url("KAFKA_URL"),
            KafkaConfig::default().set("no.such.property", "1"),
        )
        .await
        .expect_err("librdkafka refuses unknown properties");
        assert_eq!(invalid.class, FailureClass::Permanent, "{invalid}");

        let unreachable = KafkaTransport::connect(
            "kafka://127.0.0.1:1",
            KafkaConfig::default().delivery_timeout(Duration::from_secs(2)),
        )
        .await
        .expect_err("nothing listens on port 1");
        assert_eq!(unreachable.class, FailureClass::Transient, "{unreachable}");
    });
}
