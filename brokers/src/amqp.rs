//! RabbitMQ (AMQP 0-9-1) through `lapin`.
//!
//! [`AmqpTransport`] publishes each claimed message, its stored JSON as is,
//! to one exchange with the routing key its [`NameMap`] gives the message
//! name, and settles it as delivered only once the broker confirmed it:
//!
//! - publisher confirms are on, and the message is persistent (delivery
//!   mode 2), so a confirm means the broker took responsibility for it;
//! - `message_id` is the outbox message id, `content_type` is
//!   `application/json`, `type` is the message name, and the headers of
//!   [`headers`](crate::headers) (id, name, kind, attempt, `traceparent`,
//!   `tracestate`) are AMQP headers;
//! - the publish is `mandatory`: a message no queue is bound to receive comes
//!   back (basic.return) and is dead-lettered at once with the broker's reply
//!   (`312 NO_ROUTE`), instead of being dropped silently;
//! - a nack (a queue refused the message, e.g. full with
//!   `x-overflow: reject-publish`) is a transient failure, retried with the
//!   message's backoff; so are a lost connection and a confirm that does not
//!   arrive within [`AmqpConfig::confirm_timeout`]. The next publish after a
//!   loss opens a new connection and channel;
//! - an exchange that does not exist is an error of [`AmqpTransport::connect`]
//!   (a passive declare), and a broker refusal that no retry can fix (access
//!   refused, exchange deleted, message larger than `max_message_size`)
//!   dead-letters the message at once with the broker's reason.
//!
//! # Deduplication
//!
//! RabbitMQ has no broker-side deduplication without a plugin: a message
//! redelivered by the outbox (its confirm was lost, or its lease ran out
//! while the broker was slow) is routed again and consumers see it twice.
//! Every copy carries the same `message_id` (the outbox id), which is what a
//! consumer deduplicates on: record processed ids (for as long as the outbox
//! may still redeliver, i.e. until the message is settled, typically
//! seconds to minutes) in the same transaction as the consumer's effect, or
//! make the effect idempotent.
//!
//! Ordering: RabbitMQ keeps publish order per queue, but retries and
//! concurrent deliveries reorder; route a message family to one queue and
//! order on a field of the payload when order matters.
//!
//! ```no_run
//! use outbox_brokers::NameMap;
//! use outbox_brokers::amqp::{AmqpConfig, AmqpTransport};
//!
//! # async fn run() -> Result<(), outbox_brokers::BrokerError> {
//! let transport = AmqpTransport::connect(
//!     "amqp://guest:guest@127.0.0.1:5672/%2f",
//!     AmqpConfig::new("events").routing(NameMap::new("outbox.")),
//! )
//! .await?;
//! // `transport` is an `outbox::EventBus` and an `outbox::JobDispatcher`:
//! // hand it to the coordinator (see the README).
//! # let _ = transport;
//! # Ok(())
//! # }
//! ```

use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::LocalBoxFuture;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::protocol::{AMQPErrorKind, AMQPHardError, AMQPSoftError};
use lapin::publisher_confirm::Confirmation;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ErrorKind, ExchangeKind};
use outbox::{Delivery, DeliveryResult, EventBus, JobDispatcher};
use tokio::sync::Mutex;

use crate::error::redact;
use crate::{BrokerError, FailureClass, NameMap, each_header};

const BROKER: &str = "amqp";

/// Where and how [`AmqpTransport`] publishes.
#[derive(Debug, Clone)]
pub struct AmqpConfig {
    exchange: String,
    routing: NameMap,
    confirm_timeout: Duration,
    connection_name: String,
}

impl AmqpConfig {
    /// Publish to `exchange` (which must exist; `""` is the default
    /// exchange, which routes to the queue named by the routing key), with
    /// the message name as routing key, a 10 s confirm timeout.
    pub fn new(exchange: impl Into<String>) -> Self {
        AmqpConfig {
            exchange: exchange.into(),
            routing: NameMap::default(),
            confirm_timeout: Duration::from_secs(10),
            connection_name: "outbox".to_owned(),
        }
    }

    /// How a message name becomes the routing key.
    pub fn routing(mut self, routing: NameMap) -> Self {
        self.routing = routing;
        self
    }

    /// How long a publish waits for the broker's confirm, and connecting
    /// for the connection, before it fails as transient (and is retried with
    /// the message's backoff). Keep it well under the claim lease.
    pub fn confirm_timeout(mut self, timeout: Duration) -> Self {
        self.confirm_timeout = timeout;
        self
    }

    /// The connection name shown in the RabbitMQ management UI.
    pub fn connection_name(mut self, name: impl Into<String>) -> Self {
        self.connection_name = name.into();
        self
    }

    /// The exchange messages are published to.
    pub fn exchange(&self) -> &str {
        &self.exchange
    }
}

/// An open connection and its confirm-mode channel.
struct Session {
    connection: Connection,
    channel: Channel,
    /// Counts sessions, so a failed publish drops only the session it used.
    generation: u64,
}

struct Inner {
    url: String,
    config: AmqpConfig,
    session: Mutex<(Option<Session>, u64)>,
}

/// Publishes outbox messages to a RabbitMQ exchange with publisher confirms.
///
/// Cheap to clone; clones share the connection. See the [module
/// docs](self) for what is published and how failures are classified.
#[derive(Clone)]
pub struct AmqpTransport {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for AmqpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpTransport")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl AmqpTransport {
    /// Connect to `url` (`amqp://user:pass@host:port/vhost`, or `amqps://`)
    /// and check that the exchange exists.
    ///
    /// Fails with a [`FailureClass::Permanent`] error when the exchange does
    /// not exist or the credentials are refused, and a transient one when
    /// the broker cannot be reached.
    pub async fn connect(url: &str, config: AmqpConfig) -> Result<Self, BrokerError> {
        let inner = Arc::new(Inner {
            url: url.to_owned(),
            config,
            session: Mutex::new((None, 0)),
        });
        let session = open(&inner.url, &inner.config, 1).await?;
        *inner.session.lock().await = (Some(session), 1);
        Ok(AmqpTransport { inner })
    }

    /// The configuration this transport publishes with.
    pub fn config(&self) -> &AmqpConfig {
        &self.inner.config
    }

    /// Publish one claimed message and wait for the broker's confirm.
    pub async fn send(&self, delivery: &Delivery) -> Result<(), BrokerError> {
        let (channel, generation) = self.channel().await?;
        let result = self.publish_on(&channel, delivery).await;
        if let Err(error) = &result
            && error.operation != "route"
            && error.operation != "nack"
        {
            // The channel is closed after any channel or connection error,
            // and a missing confirm may mean a half-open connection: drop it
            // so the next publish opens a fresh one.
            self.discard(generation).await;
        }
        result
    }

    async fn channel(&self) -> Result<(Channel, u64), BrokerError> {
        let mut guard = self.inner.session.lock().await;
        if let Some(session) = &guard.0
            && session.connection.status().connected()
            && session.channel.status().connected()
        {
            return Ok((session.channel.clone(), session.generation));
        }
        if let Some(stale) = guard.0.take() {
            // Best effort: the broker may be gone already.
            let close = stale.connection.close(320, "reconnecting");
            let _ = tokio::time::timeout(self.inner.config.confirm_timeout, close).await;
        }
        let generation = guard.1 + 1;
        let session = open(&self.inner.url, &self.inner.config, generation).await?;
        let channel = session.channel.clone();
        *guard = (Some(session), generation);
        Ok((channel, generation))
    }

    async fn discard(&self, generation: u64) {
        let mut guard = self.inner.session.lock().await;
        if guard.0.as_ref().map(|s| s.generation) == Some(generation) {
            guard.0 = None;
        }
    }

    async fn publish_on(&self, channel: &Channel, delivery: &Delivery) -> Result<(), BrokerError> {
        let config = &self.inner.config;
        let message = delivery.context.message();
        let routing_key = config.routing.destination(&message.name);
        let mut table = FieldTable::default();
        each_header(message, |name, value| {
            table.insert(
                ShortString::from(name),
                AMQPValue::LongString(LongString::from(value)),
            );
        });
        let properties = BasicProperties::default()
            .with_message_id(ShortString::from(message.id.clone()))
            .with_type(ShortString::from(message.name.clone()))
            .with_content_type(ShortString::from("application/json"))
            .with_delivery_mode(2)
            .with_headers(table);
        let options = BasicPublishOptions {
            mandatory: true,
            immediate: false,
        };
        let publish = async {
            let confirm = channel
                .basic_publish(
                    &config.exchange,
                    &routing_key,
                    options,
                    message.payload.as_str().as_bytes(),
                    properties,
                )
                .await
                .map_err(|e| classify("publish", e))?;
            confirm.await.map_err(|e| classify("publish", e))
        };
        let confirmation = match tokio::time::timeout(config.confirm_timeout, publish).await {
            Ok(confirmation) => confirmation?,
            Err(_) => {
                return Err(BrokerError::new(
                    BROKER,
                    "confirm",
                    FailureClass::Transient,
                    format!(
                        "no confirm from the broker within {:?}",
                        config.confirm_timeout
                    ),
                ));
            }
        };
        match confirmation {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned)) => {
                Err(BrokerError::new(
                    BROKER,
                    "route",
                    FailureClass::Permanent,
                    format!(
                        "{} {}: exchange {:?} has no queue bound for routing key {:?}",
                        returned.reply_code, returned.reply_text, config.exchange, routing_key
                    ),
                ))
            }
            Confirmation::Nack(None) => Err(BrokerError::new(
                BROKER,
                "nack",
                FailureClass::Transient,
                format!(
                    "the broker nacked the message (routing key {routing_key:?}): a queue refused \
                     it, e.g. full with x-overflow reject-publish, or failed to store it"
                ),
            )),
            Confirmation::NotRequested => Err(BrokerError::new(
                BROKER,
                "confirm",
                FailureClass::Transient,
                "the channel is not in confirm mode",
            )),
        }
    }
}

/// Open a connection and a confirm-mode channel, and check the exchange,
/// within the confirm timeout: a host that drops packets must not hold the
/// session lock (and every publish behind it) for the system's TCP timeout.
async fn open(url: &str, config: &AmqpConfig, generation: u64) -> Result<Session, BrokerError> {
    match tokio::time::timeout(config.confirm_timeout, open_now(url, config, generation)).await {
        Ok(session) => session,
        Err(_) => Err(BrokerError::new(
            BROKER,
            "connect",
            FailureClass::Transient,
            format!(
                "no connection to the broker within {:?}",
                config.confirm_timeout
            ),
        )),
    }
}

async fn open_now(url: &str, config: &AmqpConfig, generation: u64) -> Result<Session, BrokerError> {
    let properties = ConnectionProperties::default()
        .with_connection_name(LongString::from(config.connection_name.clone()));
    let connection = Connection::connect(url, properties).await.map_err(|e| {
        let mut error = classify("connect", e);
        // The client quotes a URL it cannot parse, password and all.
        error.reason = error.reason.replace(url, &redact(url));
        error
    })?;
    let channel = connection
        .create_channel()
        .await
        .map_err(|e| classify("open channel", e))?;
    if !config.exchange.is_empty() {
        // Passive: checks the exchange exists without creating or changing it.
        let passive = ExchangeDeclareOptions {
            passive: true,
            ..ExchangeDeclareOptions::default()
        };
        channel
            .exchange_declare(
                &config.exchange,
                ExchangeKind::Direct,
                passive,
                FieldTable::default(),
            )
            .await
            .map_err(|e| classify("declare exchange", e))?;
    }
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(|e| classify("confirm select", e))?;
    Ok(Session {
        connection,
        channel,
        generation,
    })
}

/// Refusals a retry cannot change are permanent; everything about the
/// connection (I/O, a closed channel, a forced close, missed heartbeats) is
/// transient.
pub(crate) fn classify(operation: &'static str, error: lapin::Error) -> BrokerError {
    let (class, reason) = match error.kind() {
        ErrorKind::ProtocolError(amqp) => {
            let class = match amqp.kind() {
                AMQPErrorKind::Soft(
                    AMQPSoftError::ACCESSREFUSED
                    | AMQPSoftError::NOTFOUND
                    | AMQPSoftError::PRECONDITIONFAILED
                    | AMQPSoftError::CONTENTTOOLARGE
                    | AMQPSoftError::NOROUTE,
                )
                | AMQPErrorKind::Hard(
                    AMQPHardError::NOTALLOWED
                    | AMQPHardError::INVALIDPATH
                    | AMQPHardError::NOTIMPLEMENTED,
                ) => FailureClass::Permanent,
                _ => FailureClass::Transient,
            };
            (class, format!("{} {}", amqp.get_id(), amqp.get_message()))
        }
        _ => (FailureClass::Transient, error.to_string()),
    };
    BrokerError::new(BROKER, operation, class, reason).with_source(error)
}

impl EventBus for AmqpTransport {
    fn publish(&self, delivery: Delivery) -> LocalBoxFuture<'static, DeliveryResult> {
        let transport = self.clone();
        async move {
            transport
                .send(&delivery)
                .await
                .map_err(BrokerError::into_delivery_error)
        }
        .boxed_local()
    }
}

impl JobDispatcher for AmqpTransport {
    fn dispatch(&self, delivery: Delivery) -> LocalBoxFuture<'static, DeliveryResult> {
        self.publish(delivery)
    }
}
