//! Publish outbox messages to a broker.
//!
//! Each transport here implements [`outbox::EventBus`] and
//! [`outbox::JobDispatcher`], so a drain publishes under the same leases,
//! retries, dead letters and notifications as an in-process handler: a
//! message is settled as delivered only once the broker acknowledged it.
//! Delivery is at-least-once, so every transport puts the outbox message id
//! on what it publishes, for the broker or the consumers to deduplicate on;
//! each transport's docs say which, and over what window.
//!
//! ```
//! # #[cfg(feature = "nats")]
//! # async fn relay() -> Result<(), Box<dyn std::error::Error>> {
//! use outbox_brokers::{NameMap, NatsConfig, NatsTransport};
//!
//! // `orders.placed` is published to the subject `events.orders.placed`, on
//! // the stream `EVENTS`; the transport is then the drain's event bus.
//! let names = NameMap::new("events.");
//! let nats = NatsTransport::connect("nats://127.0.0.1:4222", NatsConfig::new("EVENTS", names)).await?;
//! # let _ = nats;
//! # Ok(())
//! # }
//! ```
//!
//! What every transport shares lives here: how a message name becomes a
//! destination ([`NameMap`]), the headers a published message carries
//! ([`headers`]), and how broker failures are classified ([`BrokerError`]).
//!
//! On the consuming side, `consume` records each message id in the
//! consumer's own transaction, so its effects apply once however many
//! copies arrive (see the guide's inbox page).
//!
//! The guide's page on [publishing to a broker](https://github.com/outbox-rs/outbox/blob/main/docs/src/brokers.md) covers the
//! relay, deduplication per broker and what consumers must do.
//!
//! # Layout
//!
//! - `lib.rs` (this file): the headers every transport sets.
//! - `naming`: [`NameMap`], message names to destinations.
//! - `error`: [`BrokerError`] and its [`FailureClass`], retried or not.
//! - `nats`, `amqp`, `redis`, `kafka`: one transport each, behind a feature
//!   of the same name, with its configuration (`kafka` is a folder: the
//!   transport, its configuration, topic names, failure classes).
//! - [`events`] and [`metrics`]: the names the inbox consumers log and
//!   record, each listed once.
//! - `consume` (a folder; features `sqlite` or `postgres`, and a
//!   broker's): the other end, consumers that apply each relayed message
//!   exactly once through an inbox (`outbox::InboxStore`).

#[cfg(feature = "amqp")]
pub mod amqp;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub mod consume;
mod error;
pub mod events;
#[cfg(feature = "kafka")]
pub mod kafka;
pub mod metrics;
mod naming;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "redis")]
pub mod redis;

#[cfg(feature = "amqp")]
pub use amqp::{AmqpConfig, AmqpTransport};
pub use error::{BrokerError, FailureClass};
#[cfg(feature = "kafka")]
pub use kafka::{KafkaConfig, KafkaTransport};
pub use naming::NameMap;
#[cfg(feature = "nats")]
pub use nats::{NatsConfig, NatsTransport};
#[cfg(feature = "redis")]
pub use redis::{RedisConfig, RedisTransport};

use outbox::ClaimedMessage;

/// Header carrying the outbox message id.
pub const HEADER_ID: &str = "Outbox-Message-Id";
/// Header carrying the message name as enqueued.
pub const HEADER_NAME: &str = "Outbox-Name";
/// Header carrying the kind: `event` or `job`.
pub const HEADER_KIND: &str = "Outbox-Kind";
/// Header carrying the delivery attempt, starting at 1.
pub const HEADER_ATTEMPT: &str = "Outbox-Attempt";
/// W3C trace context header, when the message was enqueued inside a trace.
pub const HEADER_TRACEPARENT: &str = "traceparent";
/// W3C trace state header, when the enqueuing trace had one.
pub const HEADER_TRACESTATE: &str = "tracestate";

/// The headers every transport puts on a published message, in this order:
/// id, name, kind, attempt, then `traceparent` and `tracestate` when the
/// message carries a trace context.
pub fn headers(message: &ClaimedMessage) -> Vec<(&'static str, String)> {
    let mut headers = Vec::with_capacity(6);
    each_header(message, |name, value| {
        headers.push((name, value.to_owned()))
    });
    headers
}

/// Call `put` with each of [`headers`], in the same order, on text
/// borrowed from the message: a transport copies each value once, into its
/// client's own header type, instead of into a `String` first.
pub(crate) fn each_header(message: &ClaimedMessage, mut put: impl FnMut(&'static str, &str)) {
    let mut digits = [0u8; 20];
    put(HEADER_ID, &message.id);
    put(HEADER_NAME, &message.name);
    put(HEADER_KIND, message.kind.as_str());
    put(
        HEADER_ATTEMPT,
        decimal(message.attempts.into(), &mut digits),
    );
    if let Some(trace) = &message.trace {
        put(HEADER_TRACEPARENT, &trace.traceparent);
        if let Some(state) = &trace.tracestate {
            put(HEADER_TRACESTATE, state);
        }
    }
}

/// `n` in decimal, written into `digits` (the twenty a `u64` can take):
/// without the formatting machinery, which a relay would otherwise run for
/// several numbers of every message.
pub(crate) fn decimal(mut n: u64, digits: &mut [u8; 20]) -> &str {
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    std::str::from_utf8(&digits[start..]).expect("ASCII digits")
}

#[cfg(test)]
mod tests {
    use super::decimal;

    #[test]
    fn numbers_are_written_in_decimal() {
        for n in [0, 1, 9, 10, 42, 1_000_000, u32::MAX.into(), u64::MAX] {
            assert_eq!(decimal(n, &mut [0; 20]), n.to_string());
        }
    }
}
