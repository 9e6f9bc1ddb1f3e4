//! RabbitMQ: `basic.consume` on a queue with manual acknowledgements.

use std::time::Duration;

use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions, BasicRejectOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{Channel, Connection, ConnectionProperties};
use outbox::InboxStore;

use super::consumer_settings;
use super::handler::InboxHandler;
use super::received::Received;
use super::runner::{Refusal, Runner, Settings, Source};
use crate::amqp::classify;
use crate::{BrokerError, FailureClass};

const BROKER: &str = "amqp";

/// Consumes a RabbitMQ queue through an inbox: each message is recorded
/// and applied in one transaction, then acknowledged.
///
/// - Acknowledged (`basic.ack`) after the commit, also for a copy the
///   inbox already holds.
/// - A failed message is held for the retry delay, then `basic.nack`ed
///   with requeue: RabbitMQ puts it back in the queue (at its place, when
///   it can) and delivers it again. A consumer that dies, or loses its
///   connection, before acknowledging leaves its unacknowledged messages
///   to RabbitMQ, which requeues them.
/// - A message without an id (no `Outbox-Message-Id` header, nor a
///   `message_id` property) is rejected without requeue: RabbitMQ drops
///   it, or dead-letters it when the queue has a dead-letter exchange
///   (`x-dead-letter-exchange`). Give the queue one to keep such messages.
/// - Order: a queue delivers in order; a requeued message goes back to
///   its place, but the messages after it that were already delivered
///   (up to the prefetch) are applied before it comes back. For a strict
///   order through failures, set the prefetch to 1.
///
/// The queue is the application's (bound to the relay's exchange); the
/// consumer checks it exists when it connects, and reconnects by itself
/// after a lost connection.
///
/// ```no_run
/// # #[cfg(feature = "sqlite")]
/// # async fn run(inbox: outbox::SqliteInbox) -> Result<(), outbox_brokers::BrokerError> {
/// use outbox::sqlx::{self, Sqlite, Transaction};
/// use outbox_brokers::consume::{AmqpInboxConsumer, Received, handler_fn};
///
/// let handler = handler_fn(|tx: &mut Transaction<'static, Sqlite>, message: &Received| {
///     Box::pin(async move {
///         sqlx::query("INSERT INTO invoices (order_message) VALUES (?1)")
///             .bind(&message.id)
///             .execute(&mut **tx)
///             .await?;
///         Ok(())
///     })
/// });
/// let consumer = AmqpInboxConsumer::connect(
///     "amqp://guest:guest@127.0.0.1:5672/%2f",
///     "billing.orders",
///     inbox,
///     "billing",
///     handler,
/// )
/// .await?;
/// consumer.run(async { tokio::signal::ctrl_c().await.unwrap() }).await;
/// # Ok(())
/// # }
/// ```
pub struct AmqpInboxConsumer<I, H> {
    runner: Runner<AmqpSource, I, H>,
}

impl<I, H> std::fmt::Debug for AmqpInboxConsumer<I, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpInboxConsumer")
            .field("consumer", &self.runner.settings.consumer)
            .field("queue", &self.runner.source.queue)
            .finish_non_exhaustive()
    }
}

impl<I, H> AmqpInboxConsumer<I, H>
where
    I: InboxStore,
    H: InboxHandler<I::Database>,
{
    /// Connect to `url` and check that `queue` exists, to consume it as
    /// `name` in `inbox`, applying each new message with `handler`.
    ///
    /// A broker that cannot be reached is a transient error; refused
    /// credentials, a missing queue or a name the inbox would refuse are
    /// permanent ones.
    pub async fn connect(
        url: &str,
        queue: impl Into<String>,
        inbox: I,
        name: impl Into<String>,
        handler: H,
    ) -> Result<Self, BrokerError> {
        let settings = Settings::new(BROKER, name)?;
        let mut source = AmqpSource {
            url: url.to_owned(),
            queue: queue.into(),
            prefetch: 16,
            session: None,
        };
        let channel = source.open().await?;
        channel
            .queue_declare(
                &source.queue,
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(|e| classify("declare queue", e))?;
        Ok(AmqpInboxConsumer {
            runner: Runner {
                source,
                inbox,
                handler,
                settings,
            },
        })
    }

    /// Most messages RabbitMQ delivers ahead of their acknowledgement
    /// (`basic.qos`; default 16).
    pub fn prefetch(mut self, prefetch: u16) -> Self {
        self.runner.source.prefetch = prefetch.max(1);
        self
    }
}

consumer_settings!(AmqpInboxConsumer);

/// An open connection and the consumer on it.
struct Session {
    connection: Connection,
    channel: Channel,
    /// Started on the first receive of a session.
    deliveries: Option<lapin::Consumer>,
}

/// The queue, and the session consuming it.
pub(crate) struct AmqpSource {
    url: String,
    queue: String,
    prefetch: u16,
    /// Opened when needed; dropped after a failure, so the next receive
    /// opens another.
    session: Option<Session>,
}

impl AmqpSource {
    /// The session's channel, opening a connection first when there is
    /// none.
    async fn open(&mut self) -> Result<Channel, BrokerError> {
        if let Some(session) = &self.session
            && session.channel.status().connected()
        {
            return Ok(session.channel.clone());
        }
        self.discard().await;
        let connection = Connection::connect(&self.url, ConnectionProperties::default())
            .await
            .map_err(|e| classify("connect", e))?;
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| classify("open channel", e))?;
        channel
            .basic_qos(self.prefetch, BasicQosOptions::default())
            .await
            .map_err(|e| classify("qos", e))?;
        self.session = Some(Session {
            connection,
            channel: channel.clone(),
            deliveries: None,
        });
        Ok(channel)
    }
}

impl AmqpSource {
    /// Close the session's connection, if there is one: RabbitMQ then
    /// requeues what it delivered on it and was not acknowledged, at once
    /// rather than when it notices the connection is gone.
    async fn discard(&mut self) {
        if let Some(session) = self.session.take() {
            let close = session.connection.close(200, "inbox consumer done");
            // Best effort: the broker may be gone already.
            let _ = tokio::time::timeout(Duration::from_secs(5), close).await;
        }
    }
}

impl Source for AmqpSource {
    type Delivery = Delivery;
    const SYSTEM: &'static str = "rabbitmq";

    async fn next(&mut self) -> Result<Delivery, BrokerError> {
        let channel = self.open().await?;
        let session = self.session.as_mut().expect("opened above");
        let deliveries = match &mut session.deliveries {
            Some(deliveries) => deliveries,
            None => {
                let started = channel
                    .basic_consume(
                        &self.queue,
                        "",
                        BasicConsumeOptions::default(),
                        FieldTable::default(),
                    )
                    .await
                    .map_err(|e| classify("consume", e))?;
                session.deliveries.insert(started)
            }
        };
        match deliveries.next().await {
            Some(Ok(delivery)) => Ok(delivery),
            Some(Err(error)) => {
                self.discard().await;
                Err(classify("receive", error))
            }
            None => {
                self.discard().await;
                Err(BrokerError::new(
                    BROKER,
                    "receive",
                    FailureClass::Transient,
                    format!(
                        "the broker cancelled the consumer of queue {:?}",
                        self.queue
                    ),
                ))
            }
        }
    }

    fn read(&self, delivery: &Delivery) -> Result<Received, Refusal> {
        let headers = delivery
            .properties
            .headers()
            .as_ref()
            .map(|table| {
                table
                    .inner()
                    .iter()
                    .filter_map(|(name, value)| Some((name.to_string(), text(value)?)))
                    .collect()
            })
            .unwrap_or_default();
        let message_id = delivery
            .properties
            .message_id()
            .as_ref()
            .map(|id| id.to_string());
        Received::from_headers(
            headers,
            delivery.data.clone(),
            self.queue.clone(),
            message_id,
        )
        .map_err(|reason| Refusal {
            source: self.queue.clone(),
            reason,
        })
    }

    async fn ack(&mut self, delivery: Delivery) -> Result<(), BrokerError> {
        delivery
            .ack(BasicAckOptions::default())
            .await
            .map(drop)
            .map_err(|e| classify("ack", e))
    }

    async fn retry(&mut self, delivery: Delivery, delay: Duration) -> Result<(), BrokerError> {
        // A requeued message comes straight back: the wait keeps a failing
        // database from turning into a busy loop.
        tokio::time::sleep(delay).await;
        let requeue = BasicNackOptions {
            multiple: false,
            requeue: true,
        };
        delivery
            .nack(requeue)
            .await
            .map(drop)
            .map_err(|e| classify("nack", e))
    }

    async fn close(&mut self) {
        self.discard().await;
    }

    async fn refuse(
        &mut self,
        delivery: Delivery,
        _reason: &'static str,
    ) -> Result<(), BrokerError> {
        delivery
            .reject(BasicRejectOptions { requeue: false })
            .await
            .map(drop)
            .map_err(|e| classify("reject", e))
    }
}

/// A header's value as text, for the kinds a producer sets text in.
fn text(value: &AMQPValue) -> Option<String> {
    match value {
        AMQPValue::LongString(text) => Some(long_string(text)),
        AMQPValue::ShortString(text) => Some(text.to_string()),
        AMQPValue::LongInt(n) => Some(n.to_string()),
        AMQPValue::LongLongInt(n) => Some(n.to_string()),
        AMQPValue::LongUInt(n) => Some(n.to_string()),
        AMQPValue::ShortInt(n) => Some(n.to_string()),
        AMQPValue::ShortUInt(n) => Some(n.to_string()),
        _ => None,
    }
}

fn long_string(text: &LongString) -> String {
    String::from_utf8_lossy(text.as_bytes()).into_owned()
}
