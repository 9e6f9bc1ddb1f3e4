//! NATS JetStream: a pull consumer with explicit acknowledgements.

use std::time::Duration;

use async_nats::jetstream::consumer::pull::{Config, Stream};
use async_nats::jetstream::consumer::{AckPolicy, Consumer};
use async_nats::jetstream::{AckKind, Message};
use futures_util::StreamExt;
use outbox::InboxStore;

use super::consumer_settings;
use super::handler::InboxHandler;
use super::received::Received;
use super::runner::{Refusal, Runner, Settings, Source};
use crate::{BrokerError, FailureClass};

const BROKER: &str = "nats";

/// Consumes a JetStream pull consumer through an inbox: each message is
/// recorded and applied in one transaction, then acknowledged.
///
/// - Acknowledged (`ack`) after the commit, also for a copy the inbox
///   already holds.
/// - A failed message is `nak`ed with the retry delay, and JetStream
///   delivers it again after it (up to the consumer's `max_deliver`, if
///   set). A consumer that dies before acknowledging leaves its messages to
///   the consumer's `ack_wait`, after which JetStream delivers them again.
/// - A message without an id (no `Outbox-Message-Id` header, nor
///   `Nats-Msg-Id`) is terminated (`term`): JetStream never delivers it
///   again and publishes a `MSG_TERMINATED` advisory for it.
/// - Order: a stream's messages come in stream order, but a `nak`ed message
///   comes back after later ones. To keep a subject's order through
///   failures, give the consumer `max_ack_pending: 1`, so nothing else is
///   delivered until the failed message is done.
///
/// The JetStream consumer is the application's: create it durable (so a
/// restart resumes where it was), with `AckPolicy::Explicit` (refused
/// otherwise), and an `ack_wait` longer than a message takes to apply.
///
/// ```no_run
/// # #[cfg(feature = "postgres")]
/// # async fn run(pool: outbox::sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// use async_nats::jetstream::{self, consumer::pull};
/// use outbox::PostgresInbox;
/// use outbox::sqlx::{self, Postgres, Transaction};
/// use outbox_brokers::consume::{NatsInboxConsumer, Received, handler_fn};
///
/// let js = jetstream::new(async_nats::connect("nats://127.0.0.1:4222").await?);
/// let stream = js.get_stream("EVENTS").await?;
/// let durable = stream
///     .get_or_create_consumer("billing", pull::Config {
///         durable_name: Some("billing".into()),
///         filter_subject: "events.order.placed".into(),
///         ..Default::default()
///     })
///     .await?;
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
/// let consumer = NatsInboxConsumer::new(durable, PostgresInbox::new(pool), "billing", handler)?;
/// let report = consumer.run(async { tokio::signal::ctrl_c().await.unwrap() }).await;
/// println!("{report:?}");
/// # Ok(())
/// # }
/// ```
pub struct NatsInboxConsumer<I, H> {
    runner: Runner<NatsSource, I, H>,
}

impl<I, H> std::fmt::Debug for NatsInboxConsumer<I, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsInboxConsumer")
            .field("consumer", &self.runner.settings.consumer)
            .finish_non_exhaustive()
    }
}

impl<I, H> NatsInboxConsumer<I, H>
where
    I: InboxStore,
    H: InboxHandler<I::Database>,
{
    /// Consume `consumer` as `name` in `inbox`, applying each new message
    /// with `handler`. Refuses a JetStream consumer whose ack policy is not
    /// explicit (acknowledging after the commit is the point), and a name
    /// the inbox would refuse.
    pub fn new(
        consumer: Consumer<Config>,
        inbox: I,
        name: impl Into<String>,
        handler: H,
    ) -> Result<Self, BrokerError> {
        let settings = Settings::new(BROKER, name)?;
        let policy = consumer.cached_info().config.ack_policy;
        if policy != AckPolicy::Explicit {
            return Err(BrokerError::new(
                BROKER,
                "configure",
                FailureClass::Permanent,
                format!(
                    "JetStream consumer `{}` acknowledges with {policy:?}; an inbox consumer \
                     acknowledges each message after its commit, so create it with \
                     AckPolicy::Explicit",
                    consumer.cached_info().name
                ),
            ));
        }
        Ok(NatsInboxConsumer {
            runner: Runner {
                source: NatsSource {
                    consumer,
                    messages: None,
                    batch: 100,
                },
                inbox,
                handler,
                settings,
            },
        })
    }

    /// Most messages pulled at once (default 100). Pulled messages wait
    /// their turn with their `ack_wait` running: keep a batch's time to
    /// apply well under it.
    pub fn batch(mut self, batch: usize) -> Self {
        self.runner.source.batch = batch.max(1);
        self
    }
}

consumer_settings!(NatsInboxConsumer);

/// The pull consumer and its open stream of messages.
pub(crate) struct NatsSource {
    consumer: Consumer<Config>,
    /// Opened on the first receive, and again after it failed.
    messages: Option<Stream>,
    batch: usize,
}

impl NatsSource {
    fn failed(
        operation: &'static str,
        error: impl std::error::Error + Send + Sync + 'static,
    ) -> BrokerError {
        BrokerError::new(
            BROKER,
            operation,
            FailureClass::Transient,
            error.to_string(),
        )
        .with_source(error)
    }
}

impl Source for NatsSource {
    type Delivery = Message;
    const SYSTEM: &'static str = "nats";

    async fn next(&mut self) -> Result<Message, BrokerError> {
        let messages = match &mut self.messages {
            Some(messages) => messages,
            None => {
                let opened = self
                    .consumer
                    .stream()
                    .max_messages_per_batch(self.batch)
                    .messages()
                    .await
                    .map_err(|e| Self::failed("receive", e))?;
                self.messages.insert(opened)
            }
        };
        match messages.next().await {
            Some(Ok(message)) => Ok(message),
            Some(Err(error)) => {
                self.messages = None;
                Err(Self::failed("receive", error))
            }
            None => {
                self.messages = None;
                Err(BrokerError::new(
                    BROKER,
                    "receive",
                    FailureClass::Transient,
                    "the stream of messages ended",
                ))
            }
        }
    }

    fn read(&self, message: &Message) -> Result<Received, Refusal> {
        let mut headers = Vec::new();
        let mut nats_id = None;
        if let Some(map) = &message.headers {
            for (name, values) in map.iter() {
                for value in values {
                    let (name, value) = (name.to_string(), value.as_str().to_owned());
                    if name.eq_ignore_ascii_case(async_nats::header::NATS_MESSAGE_ID.as_ref()) {
                        nats_id = Some(value.clone());
                    }
                    headers.push((name, value));
                }
            }
        }
        let source = message.subject.to_string();
        let mut received =
            Received::from_headers(headers, message.payload.to_vec(), source.clone(), nats_id)
                .map_err(|reason| Refusal { source, reason })?;
        received.deliveries = message
            .info()
            .ok()
            .and_then(|info| u64::try_from(info.delivered).ok());
        Ok(received)
    }

    async fn ack(&mut self, message: Message) -> Result<(), BrokerError> {
        message
            .ack()
            .await
            .map_err(|e| BrokerError::new(BROKER, "ack", FailureClass::Transient, e.to_string()))
    }

    async fn retry(&mut self, message: Message, delay: Duration) -> Result<(), BrokerError> {
        message
            .ack_with(AckKind::Nak(Some(delay)))
            .await
            .map_err(|e| BrokerError::new(BROKER, "nak", FailureClass::Transient, e.to_string()))
    }

    async fn refuse(&mut self, message: Message, _reason: &'static str) -> Result<(), BrokerError> {
        message
            .ack_with(AckKind::Term)
            .await
            .map_err(|e| BrokerError::new(BROKER, "term", FailureClass::Transient, e.to_string()))
    }
}
