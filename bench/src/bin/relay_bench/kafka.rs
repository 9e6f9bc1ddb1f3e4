//! Kafka: a topic per destination, records produced by an idempotent
//! `acks=all` producer, the transport's own settings.

use outbox_brokers::NameMap;
use outbox_brokers::kafka::{KafkaConfig, KafkaTransport};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

use super::*;

/// Partitions of each topic the benchmark makes.
const PARTITIONS: i32 = 8;

pub(super) struct Kafka {
    url: String,
    bootstrap: String,
    admin: AdminClient<DefaultClientContext>,
    /// The topics made so far.
    topics: Vec<String>,
}

impl Kafka {
    pub(super) async fn connect() -> Kafka {
        let url = service_url("KAFKA_URL", "kafka");
        let bootstrap = url
            .strip_prefix("kafka://")
            .unwrap_or_else(|| {
                eprintln!("KAFKA_URL {url:?} does not start with kafka://");
                std::process::exit(2)
            })
            .to_owned();
        let admin = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .create()
            .expect("an admin client for KAFKA_URL");
        Kafka {
            url,
            bootstrap,
            admin,
            topics: Vec::new(),
        }
    }

    /// A topic of its own, created: `<prefix>orders.placed`; the prefix.
    async fn fresh(&mut self) -> String {
        let prefix = format!("relay_bench.{}.{}.", std::process::id(), self.topics.len());
        let topic = format!("{prefix}orders.placed");
        let created = self
            .admin
            .create_topics(
                &[NewTopic::new(
                    &topic,
                    PARTITIONS,
                    TopicReplication::Fixed(1),
                )],
                &AdminOptions::new(),
            )
            .await
            .expect("CreateTopics");
        for result in created {
            result.unwrap_or_else(|(name, code)| panic!("creating {name}: {code:?}"));
        }
        self.topics.push(topic);
        prefix
    }
}

/// The raw loop: the transport's producer settings, its record layout.
async fn publish(producer: FutureProducer, topic: String, payloads: Vec<String>, window: usize) {
    let mut acks = FuturesUnordered::new();
    for (n, payload) in payloads.into_iter().enumerate() {
        let id = format!("raw-{n}");
        let producer = producer.clone();
        let topic = topic.clone();
        acks.push(async move {
            let headers = [
                ("Outbox-Message-Id", id.as_str()),
                ("Outbox-Name", "orders.placed"),
                ("Outbox-Kind", "event"),
                ("Outbox-Attempt", "1"),
            ]
            .into_iter()
            .fold(OwnedHeaders::new(), |headers, (key, value)| {
                headers.insert(Header {
                    key,
                    value: Some(value),
                })
            });
            let record = FutureRecord::<str, str>::to(&topic)
                .payload(&payload)
                .headers(headers);
            producer
                .send(record, Duration::from_secs(10))
                .await
                .map_err(|(error, _)| error)
        });
        if acks.len() >= window {
            acks.next().await.expect("an ack").expect("produced");
        }
    }
    while let Some(ack) = acks.next().await {
        ack.expect("produced");
    }
}

impl Broker for Kafka {
    const NAME: &'static str = "kafka";
    type Transport = KafkaTransport;

    async fn transport(&mut self) -> KafkaTransport {
        let prefix = self.fresh().await;
        KafkaTransport::connect(&self.url, KafkaConfig::new(NameMap::new(prefix)))
            .await
            .expect("the bench broker")
    }

    async fn raw(&mut self, messages: u64, window: usize) -> Duration {
        let prefix = self.fresh().await;
        let topic = format!("{prefix}orders.placed");
        let bootstrap = self.bootstrap.clone();
        let connect = move || async move {
            ClientConfig::new()
                .set("bootstrap.servers", bootstrap)
                .set("enable.idempotence", "true")
                .set("acks", "all")
                .set("partitioner", "murmur2_random")
                .create::<FutureProducer>()
                .expect("a producer for KAFKA_URL")
        };
        let payloads = (0..messages).map(payload_json).collect();
        raw_on_own_runtime(connect, move |producer| {
            publish(producer, topic, payloads, window)
        })
    }

    async fn stored(&mut self) -> u64 {
        let topic = self.topics.last().expect("a topic").clone();
        let bootstrap = self.bootstrap.clone();
        tokio::task::spawn_blocking(move || {
            use rdkafka::consumer::{BaseConsumer, Consumer};
            let consumer: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", bootstrap)
                .set("group.id", "relay_bench")
                .create()
                .expect("a consumer for KAFKA_URL");
            (0..PARTITIONS)
                .map(|partition| {
                    let (low, high) = consumer
                        .fetch_watermarks(&topic, partition, Duration::from_secs(10))
                        .expect("the partition's watermarks");
                    (high - low) as u64
                })
                .sum()
        })
        .await
        .expect("the watermark thread")
    }

    async fn clean_up(&mut self) {
        let topics: Vec<String> = self.topics.drain(..).collect();
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        // Best effort, as the other brokers' clean-ups are.
        let _ = self.admin.delete_topics(&names, &AdminOptions::new()).await;
    }
}
