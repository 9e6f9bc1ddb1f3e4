//! The Kafka consumer, on a PostgreSQL inbox, against tansu.

use std::collections::BTreeMap;
use std::time::Duration;

use outbox::sqlx::{self, AssertSqlSafe};
use outbox::{MemoryOutbox, MessageKind, NewMessage, OutboxStore, Payload};
use outbox_brokers::NameMap;
use outbox_brokers::consume::KafkaInboxConsumer;
use outbox_brokers::kafka::{KafkaConfig, KafkaTransport};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::harness::{self, coordinator, counting, service_url, shutdown, unique, wait_for};
use crate::{
    Behaviour, Effects, Running, WAIT, applied, assert_once, postgres, postgres_handler, stopped,
};

fn bootstrap() -> String {
    service_url("KAFKA_URL")
        .strip_prefix("kafka://")
        .expect("KAFKA_URL starts with kafka://")
        .to_owned()
}

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

/// Whether `group` has committed, on every partition of `topic`, the
/// offset after its last record.
async fn caught_up(topic: &str, group: &str) -> bool {
    let (topic, group, brokers) = (topic.to_owned(), group.to_owned(), bootstrap());
    tokio::task::spawn_blocking(move || {
        // Not subscribed: reading the group's offsets does not join it.
        let reader: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("group.id", &group)
            .set("enable.auto.commit", "false")
            .create()
            .expect("a reader");
        let timeout = Duration::from_secs(10);
        let metadata = reader
            .fetch_metadata(Some(&topic), timeout)
            .expect("the topic's metadata");
        let mut wanted = TopicPartitionList::new();
        let mut ends = BTreeMap::new();
        for partition in metadata.topics()[0].partitions() {
            let (_, high) = reader
                .fetch_watermarks(&topic, partition.id(), timeout)
                .expect("watermarks");
            ends.insert(partition.id(), high);
            wanted.add_partition(&topic, partition.id());
        }
        let Ok(committed) = reader.committed_offsets(wanted, timeout) else {
            return false;
        };
        committed.elements().iter().all(|element| {
            let end = ends[&element.partition()];
            match element.offset() {
                Offset::Offset(offset) => offset >= end,
                _ => end == 0,
            }
        })
    })
    .await
    .expect("the reader thread")
}

/// The payloads' `n` per ordering key, in the order their effects committed.
async fn applied_order(
    inbox: &outbox::PostgresInbox,
    effects: &Effects,
) -> BTreeMap<String, Vec<u64>> {
    let rows: Vec<(String,)> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT payload FROM {} ORDER BY seq",
        effects.table
    )))
    .fetch_all(inbox.pool())
    .await
    .expect("read the effects");
    let mut order: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (payload,) in rows {
        let value: serde_json::Value = serde_json::from_str(&payload).expect("JSON");
        let key = value["key"].as_str().expect("a key").to_owned();
        order
            .entry(key)
            .or_default()
            .push(value["n"].as_u64().expect("an n"));
    }
    order
}

#[test]
fn keyed_records_and_their_copies_are_applied_once_in_order_through_failures() {
    harness::run(|| async {
        const N: usize = 40;
        const KEYS: usize = 8;
        let prefix = format!("inbox{}.", unique());
        let topic = format!("{prefix}orders.placed");
        create_topic(&topic, 4).await;
        let (inbox, effects) = postgres().await;

        // The relay loses every first acknowledgement: each message is
        // produced twice (a new record each time), after the first copy
        // and before its key's next message.
        let store = MemoryOutbox::new();
        let mut ids = Vec::new();
        for n in 0..N {
            let key = format!("key-{}", n % KEYS);
            let payload = Payload::from(serde_json::json!({ "n": n, "key": key }));
            let message = NewMessage::new(MessageKind::Event, "orders.placed", payload)
                .with_ordering_key(key);
            ids.push(store.enqueue(message).await.expect("enqueue").into_id());
        }
        let transport = KafkaTransport::connect(
            &service_url("KAFKA_URL"),
            KafkaConfig::new(NameMap::new(&prefix)),
        )
        .await
        .expect("connect the transport");
        let (bus, stats) = counting(transport, true);
        let relay = coordinator(&store, bus);
        wait_for("the relay to publish everything", WAIT, || async {
            harness::count(&store, outbox::MessageStatus::Delivered).await == N
        })
        .await;
        shutdown(relay).await;
        assert_eq!(stats.acked(), 2 * N as u64, "each message produced twice");

        let group = format!("billing-{}", unique());
        let consumer = KafkaInboxConsumer::builder(&service_url("KAFKA_URL"), &group, &[&topic])
            .connect(
                inbox.clone(),
                "billing",
                postgres_handler(&effects, Behaviour::FailFirst),
            )
            .expect("join the group")
            .retry_delay(Duration::from_millis(50));
        let running = Running::start(|signal| consumer.run(stopped(signal)));
        wait_for(
            "every record to be consumed and committed",
            WAIT,
            || async {
                applied(inbox.pool(), &effects).await.len() == N && caught_up(&topic, &group).await
            },
        )
        .await;
        let report = running.stop().await;

        assert_once(&applied(inbox.pool(), &effects).await, &ids);
        assert_eq!(
            (report.processed, report.duplicates, report.failed),
            (N as u64, N as u64, N as u64),
            "{report:?}"
        );
        for (key, order) in applied_order(&inbox, &effects).await {
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(order, sorted, "key {key} applied out of order");
        }
    });
}

#[tokio::test]
async fn a_record_without_an_id_is_skipped_and_the_next_one_applied() {
    let topic = format!("inbox{}.orders", unique());
    create_topic(&topic, 1).await;
    let (inbox, effects) = postgres().await;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .expect("a producer");
    for headers in [
        OwnedHeaders::new(),
        OwnedHeaders::new().insert(rdkafka::message::Header {
            key: "Outbox-Message-Id",
            value: Some("m-1"),
        }),
    ] {
        producer
            .send(
                FutureRecord::<str, str>::to(&topic)
                    .payload("{}")
                    .headers(headers),
                Duration::from_secs(10),
            )
            .await
            .expect("produced");
    }
    let group = format!("billing-{}", unique());
    let consumer = KafkaInboxConsumer::builder(&service_url("KAFKA_URL"), &group, &[&topic])
        .connect(
            inbox.clone(),
            "billing",
            postgres_handler(&effects, Behaviour::Apply),
        )
        .expect("join the group");
    let running = Running::start(|signal| consumer.run(stopped(signal)));
    wait_for("both records to be done", WAIT, || async {
        applied(inbox.pool(), &effects).await.len() == 1 && caught_up(&topic, &group).await
    })
    .await;
    let report = running.stop().await;
    assert_eq!((report.processed, report.refused), (1, 1), "{report:?}");
}

#[tokio::test]
async fn the_consumers_own_settings_are_refused() {
    let (inbox, effects) = postgres().await;
    let refused = KafkaInboxConsumer::builder(&service_url("KAFKA_URL"), "g", &["t"])
        .set("enable.auto.commit", "true")
        .connect(
            inbox,
            "billing",
            postgres_handler(&effects, Behaviour::Apply),
        )
        .expect_err("auto commits would commit records not yet applied");
    assert!(refused.is_permanent(), "{refused}");
    assert!(refused.reason.contains("enable.auto.commit"), "{refused}");
}
