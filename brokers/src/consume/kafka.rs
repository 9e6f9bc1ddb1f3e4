//! Kafka: a member of a consumer group, committing offsets by hand.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use outbox::InboxStore;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{Headers, Message, OwnedMessage};
use rdkafka::util::Timeout;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use super::consumer_settings;
use super::handler::InboxHandler;
use super::received::Received;
use super::runner::{Refusal, Runner, Settings, Source};
use crate::kafka::bootstrap_servers;
use crate::{BrokerError, FailureClass};

const BROKER: &str = "kafka";

/// Settings the consumer owns: the guarantees rest on them.
const OWNED: &[(&str, &str)] = &[
    ("bootstrap.servers", "give the brokers in the URL"),
    ("group.id", "give the group to KafkaInboxConsumer::connect"),
    (
        "enable.auto.commit",
        "offsets are committed after each message's transaction",
    ),
    (
        "enable.auto.offset.store",
        "offsets are committed after each message's transaction",
    ),
];

/// Consumes Kafka topics as a member of a consumer group, through an inbox:
/// each record is recorded and applied in one transaction, then its offset
/// is committed.
///
/// - Committed (the offset after the record) once the transaction
///   committed, also for a copy the inbox already holds. Automatic commits
///   are off: an offset is never committed for a record not yet applied.
///   Commits are asynchronous: one lost in a crash or a rebalance only
///   means the records after the last committed offset are read again, and
///   the inbox skips those already applied.
/// - A failed record stops its partition: after the retry delay the
///   consumer seeks the partition back to it, so it and the records after
///   it are read again in order. Records of that partition fetched before
///   the seek are dropped unread.
/// - A record without an id (no `Outbox-Message-Id` header) is skipped: its
///   offset is committed after the `inbox.refused` event, since Kafka has
///   no dead-letter queue of its own.
/// - Order: a partition's records are applied in offset order, through
///   failures too; the relay puts a key's messages in one partition, so a
///   key's messages are applied in enqueue order (duplicates of a message
///   land after the first copy and are skipped).
///
/// The topics are the application's; the group is created by the brokers
/// when the first member joins. A group with no committed offsets starts
/// at the beginning of each partition (`auto.offset.reset=earliest`;
/// [`KafkaInboxConsumerBuilder::set`] changes it).
///
/// ```no_run
/// # #[cfg(feature = "postgres")]
/// # async fn run(inbox: outbox::PostgresInbox) -> Result<(), outbox_brokers::BrokerError> {
/// use outbox::sqlx::{self, Postgres, Transaction};
/// use outbox_brokers::consume::{KafkaInboxConsumer, Received, handler_fn};
///
/// let handler = handler_fn(|tx: &mut Transaction<'static, Postgres>, message: &Received| {
///     Box::pin(async move {
///         sqlx::query("INSERT INTO invoices (order_message) VALUES ($1)")
///             .bind(&message.id)
///             .execute(&mut **tx)
///             .await?;
///         Ok(())
///     })
/// });
/// let consumer = KafkaInboxConsumer::builder(
///     "kafka://127.0.0.1:9092",
///     "billing",
///     &["events.order.placed"],
/// )
/// .connect(inbox, "billing", handler)?;
/// consumer.run(async { tokio::signal::ctrl_c().await.unwrap() }).await;
/// # Ok(())
/// # }
/// ```
pub struct KafkaInboxConsumer<I, H> {
    runner: Runner<KafkaSource, I, H>,
}

impl<I, H> std::fmt::Debug for KafkaInboxConsumer<I, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaInboxConsumer")
            .field("consumer", &self.runner.settings.consumer)
            .field("topics", &self.runner.source.topics)
            .finish_non_exhaustive()
    }
}

/// What a [`KafkaInboxConsumer`] connects with: the brokers, the group, the
/// topics and any other librdkafka consumer property.
#[derive(Debug, Clone)]
pub struct KafkaInboxConsumerBuilder {
    url: String,
    group: String,
    topics: Vec<String>,
    properties: Vec<(String, String)>,
}

impl KafkaInboxConsumerBuilder {
    /// Any other librdkafka consumer property: TLS and SASL,
    /// `auto.offset.reset`, `session.timeout.ms`, ... Those the consumer's
    /// guarantees rest on (the brokers, the group, automatic commits) are
    /// refused by [`connect`](Self::connect).
    pub fn set(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.properties.push((key.into(), value.into()));
        self
    }

    /// Join the group and subscribe to the topics, to consume them as
    /// `name` in `inbox`, applying each new record with `handler`.
    ///
    /// A malformed URL, a refused property or a name the inbox would
    /// refuse are permanent errors. Brokers that do not answer yet are not
    /// an error: librdkafka keeps trying, and the consumer receives once
    /// they answer.
    pub fn connect<I, H>(
        self,
        inbox: I,
        name: impl Into<String>,
        handler: H,
    ) -> Result<KafkaInboxConsumer<I, H>, BrokerError>
    where
        I: InboxStore,
        H: InboxHandler<I::Database>,
    {
        let settings = Settings::new(BROKER, name)?;
        let mut config = ClientConfig::new();
        for (key, value) in &self.properties {
            if let Some((_, instead)) = OWNED.iter().find(|(owned, _)| owned == key) {
                return Err(refused(format!(
                    "the property `{key}` cannot be set ({value:?}): {instead}"
                )));
            }
            config.set(key, value);
        }
        if config.get("auto.offset.reset").is_none() {
            config.set("auto.offset.reset", "earliest");
        }
        config
            .set("bootstrap.servers", bootstrap_servers(&self.url)?)
            .set("group.id", &self.group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false");
        let consumer: StreamConsumer = config
            .create()
            .map_err(|e| refused(format!("the consumer cannot be created: {e}")).with_source(e))?;
        let topics: Vec<&str> = self.topics.iter().map(String::as_str).collect();
        consumer
            .subscribe(&topics)
            .map_err(|e| refused(format!("subscribing to {topics:?}: {e}")).with_source(e))?;
        Ok(KafkaInboxConsumer {
            runner: Runner {
                source: KafkaSource {
                    consumer: Some(Arc::new(consumer)),
                    topics: self.topics,
                    rewound: HashMap::new(),
                },
                inbox,
                handler,
                settings,
            },
        })
    }
}

fn refused(reason: String) -> BrokerError {
    BrokerError::new(BROKER, "connect", FailureClass::Permanent, reason)
}

impl KafkaInboxConsumer<(), ()> {
    /// Settings for a member of `group` on the brokers of `url`
    /// (`kafka://HOST:PORT`, or several `HOST:PORT` separated by commas),
    /// consuming `topics`.
    pub fn builder(url: &str, group: &str, topics: &[&str]) -> KafkaInboxConsumerBuilder {
        KafkaInboxConsumerBuilder {
            url: url.to_owned(),
            group: group.to_owned(),
            topics: topics.iter().map(|topic| (*topic).to_owned()).collect(),
            properties: Vec::new(),
        }
    }
}

consumer_settings!(KafkaInboxConsumer);

/// The group member, and the partitions it sought back.
pub(crate) struct KafkaSource {
    /// `None` once closed. Shared with the blocking task that closes it.
    consumer: Option<Arc<StreamConsumer>>,
    topics: Vec<String>,
    /// Partitions sought back to a failed record, by the offset they must
    /// go on from: records after it fetched before the seek are dropped.
    rewound: HashMap<(String, i32), i64>,
}

impl KafkaSource {
    fn consumer(&self) -> Result<&StreamConsumer, BrokerError> {
        self.consumer.as_deref().ok_or_else(|| {
            BrokerError::new(
                BROKER,
                "receive",
                FailureClass::Permanent,
                "the consumer was closed",
            )
        })
    }

    fn transient(operation: &'static str, error: rdkafka::error::KafkaError) -> BrokerError {
        BrokerError::new(
            BROKER,
            operation,
            FailureClass::Transient,
            error.to_string(),
        )
        .with_source(error)
    }

    /// Commit the offset after `message`.
    fn commit_after(&self, message: &OwnedMessage) -> Result<(), BrokerError> {
        let mut offsets = TopicPartitionList::new();
        offsets
            .add_partition_offset(
                message.topic(),
                message.partition(),
                Offset::Offset(message.offset() + 1),
            )
            .map_err(|e| Self::transient("commit", e))?;
        self.consumer()?
            .commit(&offsets, CommitMode::Async)
            .map_err(|e| Self::transient("commit", e))
    }
}

impl Source for KafkaSource {
    type Delivery = OwnedMessage;
    const SYSTEM: &'static str = "kafka";

    async fn next(&mut self) -> Result<OwnedMessage, BrokerError> {
        loop {
            let message = self
                .consumer()?
                .recv()
                .await
                .map_err(|e| Self::transient("receive", e))?
                .detach();
            let key = (message.topic().to_owned(), message.partition());
            match self.rewound.get(&key) {
                // Fetched before the seek took effect: it comes again.
                Some(&from) if message.offset() > from => continue,
                Some(_) => {
                    self.rewound.remove(&key);
                }
                None => {}
            }
            return Ok(message);
        }
    }

    fn read(&self, message: &OwnedMessage) -> Result<Received, Refusal> {
        let headers = message
            .headers()
            .map(|headers| {
                headers
                    .iter()
                    .map(|header| {
                        let value = header.value.unwrap_or_default();
                        (
                            header.key.to_owned(),
                            String::from_utf8_lossy(value).into_owned(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let payload = message.payload().unwrap_or_default().to_vec();
        let source = message.topic().to_owned();
        Received::from_headers(headers, payload, source.clone(), None)
            .map_err(|reason| Refusal { source, reason })
    }

    async fn ack(&mut self, message: OwnedMessage) -> Result<(), BrokerError> {
        self.commit_after(&message)
    }

    async fn retry(&mut self, message: OwnedMessage, delay: Duration) -> Result<(), BrokerError> {
        tokio::time::sleep(delay).await;
        let key = (message.topic().to_owned(), message.partition());
        self.rewound.insert(key, message.offset());
        // Without a timeout the seek is queued and the call returns at once.
        self.consumer()?
            .seek(
                message.topic(),
                message.partition(),
                Offset::Offset(message.offset()),
                Timeout::After(Duration::ZERO),
            )
            .map_err(|e| Self::transient("seek", e))
    }

    async fn refuse(
        &mut self,
        message: OwnedMessage,
        _reason: &'static str,
    ) -> Result<(), BrokerError> {
        self.commit_after(&message)
    }

    async fn close(&mut self) {
        if let Some(consumer) = self.consumer.take() {
            // Leaving the group waits for the brokers: off the runtime.
            let _ = tokio::task::spawn_blocking(move || drop(consumer)).await;
        }
    }
}
