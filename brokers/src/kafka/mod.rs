//! Apache Kafka through `rdkafka` (librdkafka).
//!
//! [`KafkaTransport`] produces each claimed message to the topic its
//! [`NameMap`] gives the message name, and settles it as delivered only once
//! the broker acknowledged the record:
//!
//! - the record's value is the stored JSON as is; its key is the message's
//!   ordering key (none without one); its headers are those of [`headers`](crate::headers):
//!   `Outbox-Message-Id`, `Outbox-Name`, `Outbox-Kind`, `Outbox-Attempt`,
//!   and `traceparent`/`tracestate` when the message was enqueued inside a
//!   trace;
//! - the producer is idempotent (`enable.idempotence=true`, so `acks=all`):
//!   an acknowledgement means every in-sync replica has the record, and the
//!   client's own retries of a record are written once;
//! - keys are spread over partitions by the Java client's hash
//!   (`partitioner=murmur2_random`), so a key lands in the partition other
//!   Kafka producers (Kafka Connect, Debezium) would put it in.
//!
//! ```no_run
//! use outbox::{MessageKind, OutboxStore, Registry};
//! use outbox_actors::DrainCoordinator;
//! use outbox_brokers::NameMap;
//! use outbox_brokers::kafka::{KafkaConfig, KafkaTransport};
//!
//! # async fn relay(store: impl OutboxStore) -> Result<(), Box<dyn std::error::Error>> {
//! // Topics `events.order.placed`, `events.users.created`, ... must exist,
//! // unless the brokers create topics on demand.
//! let topics = NameMap::new("events.").rename("orders.placed", "order.placed");
//! let kafka = KafkaTransport::connect("kafka://127.0.0.1:9092", KafkaConfig::new(topics)).await?;
//! let coordinator = DrainCoordinator::builder(store)
//!     .registry(Registry::builder().any(MessageKind::Event).any(MessageKind::Job).build()?)
//!     .event_bus(kafka.clone())
//!     .job_dispatcher(kafka)
//!     .start()?;
//! # let _ = coordinator;
//! # Ok(())
//! # }
//! ```
//!
//! # Ordering keys
//!
//! The outbox publishes one message of a key at a time, in enqueue order,
//! and the key picks the partition: a key's messages reach their partition
//! in enqueue order, and a consumer of that partition reads them so.
//! Messages of different keys, and messages without a key, are not ordered
//! with each other. Adding partitions to a topic moves keys to other
//! partitions; do it while the relay is stopped and the consumers caught up.
//!
//! # Deduplication
//!
//! The idempotent producer deduplicates the retries librdkafka makes of one
//! record within one producer session: a produce request whose answer was
//! lost, sent again by the client, is written once. It does not deduplicate
//! a message the outbox publishes again, which is a new record:
//!
//! - a publish that failed after the broker had stored the record (its
//!   acknowledgement did not arrive within [`KafkaConfig::delivery_timeout`],
//!   because the broker stopped or was slow), retried with the message's
//!   backoff;
//! - a restart of the relay (a new producer, a new producer id), or the
//!   relay's process dying between the acknowledgement and the settlement;
//! - a lease that ran out during the publish, so that another worker
//!   claimed the message and published it too.
//!
//! Each copy carries the same `Outbox-Message-Id` header, and a keyed copy
//! lands in the same partition, after the first and before the key's next
//! message. Consumers that must see a message once deduplicate on that
//! header: record the ids they processed in the transaction of their
//! effect, or make the effect idempotent.
//!
//! # Failures
//!
//! Retried with the message's backoff (transient): the brokers down or
//! unreachable, a timeout, a leader election (`NOT_LEADER_OR_FOLLOWER`,
//! `LEADER_NOT_AVAILABLE`), too few in-sync replicas, a full local queue.
//! Dead-lettered at once with the broker's reason (permanent): a topic that
//! does not exist on brokers that do not create topics on demand, a message
//! larger than `message.max.bytes` or the topic's `max.message.bytes`,
//! refused authorization or authentication, and a message name that maps
//! to a topic Kafka forbids ([`InvalidTopic`]).
//!
//! A publish that timed out, or that the broker failed with an error that
//! leaves the producer's sequence numbers in doubt (an unknown server
//! error, an unknown producer id, a sequence out of order), ends the
//! producer session: the transport replaces the producer with a new one (a
//! new producer id), and fails the old one's queued and in-flight records,
//! which the outbox retries. librdkafka would instead bump the session's
//! epoch by itself and go on producing, which Apache Kafka accepts but not
//! every Kafka-API broker does (tansu 0.6's storage panics on the first
//! record of the bumped session and answers nothing after). So the
//! transport keeps the delivery timeout itself and librdkafka never times
//! a record out: the session ends before the client could bump it. A
//! producer that hit a fatal error is replaced the same way.
//!
//! # Why librdkafka
//!
//! It is the Kafka client outside the JVM that the Kafka project's own
//! tools are measured against: idempotent production, reconnection,
//! metadata refresh, batching and the Java client's partitioner, with the
//! librdkafka source built into the crate (a C compiler and `make`, no
//! system library). The pure-Rust `rskafka` produces without a producer id
//! (no idempotence) and to one partition at a time (no partitioner).

mod classify;
mod config;
mod topic;

use std::sync::{Arc, Mutex};

use futures_util::FutureExt;
use futures_util::future::LocalBoxFuture;
use outbox::{ClaimedMessage, Delivery, DeliveryResult, EventBus, JobDispatcher};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer, PurgeConfig};
use rdkafka::util::Timeout;

pub use config::KafkaConfig;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) use config::bootstrap_servers;
pub use topic::{InvalidTopic, MAX_TOPIC_LEN};

use crate::{BrokerError, FailureClass, NameMap, each_header};

const BROKER: &str = "kafka";

/// Where a record was stored: what the broker acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Produced {
    /// The partition the record went to.
    pub partition: i32,
    /// Its offset in that partition.
    pub offset: i64,
}

struct Inner {
    config: KafkaConfig,
    client: rdkafka::ClientConfig,
    /// The producer and a count of producers made, so a fatal error
    /// replaces only the producer that had it. A std mutex: it is never
    /// held across an await.
    producer: Mutex<(FutureProducer, u64)>,
}

/// Produces outbox messages to Kafka with an idempotent producer: an
/// [`EventBus`] and a [`JobDispatcher`].
///
/// Cheap to clone; clones share the producer. See the [module docs](self)
/// for the record layout, ordering, deduplication and how failures are
/// classified.
#[derive(Clone)]
pub struct KafkaTransport {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for KafkaTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaTransport")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl KafkaTransport {
    /// Connect to the brokers of `url` (`kafka://HOST:PORT`, or several
    /// `HOST:PORT` separated by commas) and wait, up to the delivery
    /// timeout, for the cluster's metadata.
    ///
    /// A malformed URL, a refused or invalid setting are permanent errors;
    /// brokers that do not answer are a transient one. Once connected,
    /// librdkafka reconnects by itself for as long as it takes, and
    /// publishes fail as transient errors meanwhile.
    pub async fn connect(url: &str, config: KafkaConfig) -> Result<Self, BrokerError> {
        let client = config.client_config(url)?;
        let producer = create(&client)?;
        let timeout = config.delivery_timeout;
        let probe = producer.clone();
        let metadata = tokio::task::spawn_blocking(move || {
            probe
                .client()
                .fetch_metadata(None, Timeout::After(timeout))
                .map(|metadata| metadata.brokers().len())
        })
        .await;
        match metadata {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => {
                let class = match &error {
                    // The cluster did not answer: nothing to fix here yet.
                    KafkaError::MetadataFetch(_) => FailureClass::Transient,
                    other => classify::class_of_error(other),
                };
                return Err(BrokerError::new(
                    BROKER,
                    "connect",
                    class,
                    format!("no metadata from {url} within {timeout:?}: {error}"),
                )
                .with_source(error));
            }
            Err(join) => {
                return Err(BrokerError::new(
                    BROKER,
                    "connect",
                    FailureClass::Transient,
                    format!("the metadata request did not complete: {join}"),
                ));
            }
        }
        Ok(KafkaTransport {
            inner: Arc::new(Inner {
                config,
                client,
                producer: Mutex::new((producer, 1)),
            }),
        })
    }

    /// The configuration this transport publishes with.
    pub fn config(&self) -> &KafkaConfig {
        &self.inner.config
    }

    /// The producer publishes go through, to produce outside the outbox
    /// (it is replaced after a fatal error: ask again rather than keep it).
    pub fn producer(&self) -> FutureProducer {
        self.current().0
    }

    /// The topic `name` is published to, or why Kafka would refuse it.
    pub fn topic(&self, name: &str) -> Result<String, InvalidTopic> {
        topic_of(self.inner.config.topics(), name)
    }

    /// Produce one claimed message and wait for the broker's acknowledgement.
    pub async fn send(&self, delivery: &Delivery) -> Result<Produced, BrokerError> {
        self.produce(delivery.context.message()).await
    }

    /// Produce `message` and wait for the broker's acknowledgement.
    pub async fn produce(&self, message: &ClaimedMessage) -> Result<Produced, BrokerError> {
        let topic = self.topic(&message.name).map_err(|invalid| {
            BrokerError::new(
                BROKER,
                "publish",
                FailureClass::Permanent,
                invalid.to_string(),
            )
            .with_source(invalid)
        })?;
        // `insert` takes the list and gives it back.
        let mut record_headers = Some(OwnedHeaders::new_with_capacity(6));
        each_header(message, |name, value| {
            record_headers = record_headers.take().map(|list| {
                list.insert(Header {
                    key: name,
                    value: Some(value.as_bytes()),
                })
            });
        });
        let record_headers = record_headers.expect("the header list is given back");
        let mut record = FutureRecord::<str, str>::to(&topic)
            .payload(message.payload.as_str())
            .headers(record_headers);
        if let Some(key) = &message.ordering_key {
            record = record.key(key.as_str());
        }
        let (producer, generation) = self.current();
        let timeout = self.inner.config.delivery_timeout;
        // The client never times a record out (see `KafkaConfig`): this is
        // the delivery timeout. The enqueue wait is bounded by it too.
        let sent =
            tokio::time::timeout(timeout, producer.send(record, Timeout::After(timeout))).await;
        match sent {
            Ok(Ok(delivery)) => Ok(Produced {
                partition: delivery.partition,
                offset: delivery.offset,
            }),
            Ok(Err((error, _))) => {
                let fatal = producer.client().fatal_error();
                drop(producer);
                let code = error.rdkafka_error_code();
                if fatal.is_some() || code.is_some_and(classify::ends_session) {
                    self.replace(generation);
                }
                if let Some((code, reason)) = fatal {
                    return Err(BrokerError::new(
                        BROKER,
                        "publish",
                        FailureClass::Transient,
                        format!(
                            "the producer failed for good ({code:?}: {reason}) and is replaced; \
                             publishing to `{topic}`: {error}"
                        ),
                    )
                    .with_source(error));
                }
                let class = classify::class_of_error(&error);
                let reason = match code {
                    Some(RDKafkaErrorCode::MessageSizeTooLarge) => format!(
                        "a message of {} bytes to `{topic}` is larger than the client's \
                         message.max.bytes or the topic's max.message.bytes: {error}",
                        message.payload.as_str().len()
                    ),
                    Some(
                        RDKafkaErrorCode::UnknownTopic | RDKafkaErrorCode::UnknownTopicOrPartition,
                    ) => format!(
                        "topic `{topic}` does not exist and the brokers did not create it: \
                         create it, or rename the message in the name map ({error})"
                    ),
                    _ => format!("publishing to `{topic}`: {error}"),
                };
                Err(BrokerError::new(BROKER, "publish", class, reason).with_source(error))
            }
            Err(_) => {
                drop(producer);
                // The record's fate is unknown: its session ends, and the
                // record is purged with the old producer's queue.
                self.replace(generation);
                Err(BrokerError::new(
                    BROKER,
                    "publish",
                    FailureClass::Transient,
                    format!(
                        "no acknowledgement from the brokers for `{topic}` within {timeout:?}; \
                         the producer is replaced"
                    ),
                ))
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (FutureProducer, u64)> {
        self.inner
            .producer
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn current(&self) -> (FutureProducer, u64) {
        let guard = self.lock();
        (guard.0.clone(), guard.1)
    }

    /// Replace producer `generation`, unless a concurrent publish did. The
    /// old producer's queued and in-flight records are failed at once
    /// (their publishes are retried by the outbox), so it sends nothing
    /// more under the session it gave up.
    fn replace(&self, generation: u64) {
        // Every publish of a lost session fails at once: one makes the new
        // producer, the others see it made.
        let made = |guard: &(FutureProducer, u64)| guard.1 != generation;
        if made(&self.lock()) {
            return;
        }
        let fresh = match create(&self.inner.client) {
            Ok(fresh) => fresh,
            Err(error) => {
                tracing::warn!(%error, "the Kafka producer failed for good and no new one could be made");
                return;
            }
        };
        let stale = {
            let mut guard = self.lock();
            if made(&guard) {
                return;
            }
            let next = guard.1 + 1;
            std::mem::replace(&mut *guard, (fresh, next)).0
        };
        // Purging may wait on the client's queues, and dropping the last
        // handle flushes and joins its thread: not on the runtime's thread.
        drop(tokio::task::spawn_blocking(move || {
            stale.purge(PurgeConfig::default().queue().inflight());
            drop(stale);
        }));
    }
}

/// A producer with `client`'s settings.
fn create(client: &rdkafka::ClientConfig) -> Result<FutureProducer, BrokerError> {
    client.create().map_err(|error: KafkaError| {
        BrokerError::new(
            BROKER,
            "connect",
            classify::class_of_error(&error),
            format!("cannot create the producer: {error}"),
        )
        .with_source(error)
    })
}

fn topic_of(topics: &NameMap, name: &str) -> Result<String, InvalidTopic> {
    let topic = topics.destination(name);
    match topic::check(&topic) {
        Ok(()) => Ok(topic),
        Err(reason) => Err(InvalidTopic {
            name: name.to_owned(),
            topic,
            reason,
        }),
    }
}

impl EventBus for KafkaTransport {
    fn publish(&self, delivery: Delivery) -> LocalBoxFuture<'static, DeliveryResult> {
        let transport = self.clone();
        async move {
            transport
                .send(&delivery)
                .await
                .map(drop)
                .map_err(BrokerError::into_delivery_error)
        }
        .boxed_local()
    }
}

impl JobDispatcher for KafkaTransport {
    fn dispatch(&self, delivery: Delivery) -> LocalBoxFuture<'static, DeliveryResult> {
        self.publish(delivery)
    }
}

#[cfg(test)]
mod tests {
    use super::topic_of;
    use crate::NameMap;

    #[test]
    fn an_invalid_topic_names_the_message() {
        let topics = NameMap::new("events.").rename("orders placed", "orders.placed");
        assert_eq!(
            topic_of(&topics, "orders placed").unwrap(),
            "events.orders.placed"
        );
        let invalid = topic_of(&topics, "users created").unwrap_err();
        assert_eq!(invalid.name, "users created");
        assert_eq!(invalid.topic, "events.users created");
        let said = invalid.to_string();
        assert!(said.contains("`users created`"), "{said}");
        assert!(said.contains("[a-zA-Z0-9._-]"), "{said}");
    }
}
