//! Consume relayed messages through an inbox, so each message's effects
//! apply exactly once.
//!
//! The relay publishes at least once. A consumer here closes the loop, for
//! each message it receives:
//!
//! 1. begin a transaction on the inbox's database;
//! 2. record the message id (the `Outbox-Message-Id` header) for this
//!    consumer's name ([`outbox::InboxStore::record_in`]);
//! 3. if the record is new, run the handler, which writes the message's
//!    effects in the same transaction; if it is not, the message is a copy
//!    of one already committed: skip to 5;
//! 4. commit;
//! 5. acknowledge the message to the broker.
//!
//! A handler error (or panic), or a failing database, rolls the
//! transaction back and hands the message back to the broker, which
//! delivers it again by its own mechanism. A crash anywhere before the
//! commit leaves nothing; a crash between the commit and the
//! acknowledgement leaves a message the broker redelivers, which the inbox
//! then answers as already processed. So whatever fails, the effects of a
//! message are committed once.
//!
//! One consumer applies one message at a time, in the order its broker
//! hands them over; run several (on the same durable consumer, queue,
//! consumer group or Kafka group) to apply more at once, each with the same
//! consumer name: the inbox keeps their copies apart. Each consumer's page
//! says where order holds.
//!
//! | broker | consumer | acknowledged | redelivered after a failure | no id |
//! |---|---|---|---|---|
//! | NATS JetStream | [`NatsInboxConsumer`], a pull consumer, explicit ack | `ack` | `nak` with the retry delay | terminated (`term`) |
//! | RabbitMQ | [`AmqpInboxConsumer`], `basic.consume`, manual ack | `basic.ack` | `basic.nack` with requeue, after the retry delay | rejected without requeue: dead-lettered if the queue has a dead-letter exchange |
//! | Redis Streams | [`RedisInboxConsumer`], a consumer group | `XACK` | left pending, read again after the retry delay; pending entries of dead consumers claimed (`XAUTOCLAIM`) | moved to a dead-letter stream if one is set, and acknowledged |
//! | Kafka | [`KafkaInboxConsumer`], a consumer group, offsets committed by hand | offset committed | the partition sought back to it after the retry delay | skipped (offset committed) |
//!
//! Every consumer also deletes its inbox rows older than its retention
//! window (7 days by default; see [`outbox::InboxRetention`] and the
//! guide's inbox page for choosing it), and reports through the tracing
//! events of [`events`](crate::events) and the metrics of
//! [`metrics`](crate::metrics). Each message is consumed in a span named
//! `inbox consume` (`otel.name` `inbox consume {message name}`, `otel.kind`
//! `consumer`), whose parent, with the `opentelemetry` feature, is the
//! trace the message carries in its `traceparent` header: the request that
//! enqueued the message, the relay's delivery and the consumer are one
//! trace.
//!
//! # Layout
//!
//! - `received.rs`: [`Received`], a message as a handler sees it.
//! - `handler.rs`: [`InboxHandler`] and [`handler_fn`].
//! - `telemetry.rs`: the span, events and metrics of each outcome.
//! - `apply.rs`: one message through the inbox, in its transaction.
//! - `runner.rs`: the loop every consumer runs, over a broker's source.
//! - `nats.rs`, `amqp.rs`, `redis.rs`, `kafka.rs`: one consumer per broker,
//!   behind the broker's feature.

// With a database but no broker, the machinery is built and nothing runs it.
#![cfg_attr(
    not(any(
        feature = "nats",
        feature = "amqp",
        feature = "redis",
        feature = "kafka"
    )),
    allow(dead_code)
)]

mod apply;
mod handler;
mod received;
mod runner;
mod telemetry;

#[cfg(feature = "amqp")]
mod amqp;
#[cfg(feature = "kafka")]
mod kafka;
#[cfg(feature = "nats")]
mod nats;
#[cfg(feature = "redis")]
mod redis;

#[cfg(feature = "amqp")]
pub use amqp::AmqpInboxConsumer;
pub use handler::{FnHandler, HandlerError, InboxHandler, handler_fn};
#[cfg(feature = "kafka")]
pub use kafka::{KafkaInboxConsumer, KafkaInboxConsumerBuilder};
#[cfg(feature = "nats")]
pub use nats::NatsInboxConsumer;
pub use received::Received;
#[cfg(feature = "redis")]
pub use redis::RedisInboxConsumer;
pub use runner::ConsumerReport;

/// The settings every broker's consumer has, written once: retention, the
/// retry delay, and running until a shutdown signal.
#[cfg(any(
    feature = "nats",
    feature = "amqp",
    feature = "redis",
    feature = "kafka"
))]
macro_rules! consumer_settings {
    ($consumer:ident) => {
        impl<I, H> $consumer<I, H>
        where
            I: outbox::InboxStore,
            H: $crate::consume::InboxHandler<I::Database>,
        {
            /// Delete this consumer's inbox rows recorded longer ago than
            /// the window, in bounded batches, every `retention.every`
            /// (first at start); `None` keeps them. Default:
            /// [`InboxRetention::default`](outbox::InboxRetention::default),
            /// a window of 7 days. Refused when out of range.
            pub fn retention(
                mut self,
                retention: Option<outbox::InboxRetention>,
            ) -> Result<Self, outbox::ConfigError> {
                if let Some(retention) = &retention {
                    retention.validate()?;
                }
                self.runner.settings.retention = retention;
                Ok(self)
            }

            /// How long a message that failed waits before the broker
            /// delivers it again, and a receive that failed before the
            /// next (default 1 s).
            pub fn retry_delay(mut self, delay: std::time::Duration) -> Self {
                self.runner.settings.retry_delay = delay;
                self
            }

            /// The consumer's name in the inbox.
            pub fn name(&self) -> &str {
                &self.runner.settings.consumer
            }

            /// Consume until `shutdown` completes (a message being applied
            /// then is finished and acknowledged first), and say what was
            /// done. Broker failures are logged and retried, never
            /// returned: the consumer runs until it is told to stop.
            pub async fn run(
                self,
                shutdown: impl std::future::Future<Output = ()> + Send,
            ) -> $crate::consume::ConsumerReport {
                self.runner.run(shutdown).await
            }
        }
    };
}

#[cfg(any(
    feature = "nats",
    feature = "amqp",
    feature = "redis",
    feature = "kafka"
))]
use consumer_settings;
