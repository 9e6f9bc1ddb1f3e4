//! `relay`: drain the outbox to a broker, the same runtime as `drain` with
//! a broker transport in place of a command.
//!
//! The URL scheme of `--to` picks the transport ([`connect`]); each broker
//! transport of `outbox-brokers` that this binary was built with has an arm
//! there.

use std::sync::Arc;

use futures_util::future::LocalBoxFuture;
use outbox::kit::redact_url;
use outbox::{AnyOutbox, Delivery, DeliveryResult, EventBus, JobDispatcher};
use outbox_brokers::{BrokerError, NameMap};

use crate::cli::RelayArgs;
use crate::drain::{self, Defaults};
use crate::fail::Failure;

/// `relay --once` or `relay` until Ctrl-C or SIGTERM.
pub(crate) async fn relay(store: &AnyOutbox, args: RelayArgs) -> Result<(), Failure> {
    let (broker, doing) = connect(&args).await?;
    let relay = Relay(broker);
    // A broker's acknowledgement takes milliseconds, so slots are refilled
    // from prefetched messages rather than after a claim's round-trip, and
    // passes are long enough that their tails (the last publishes of a pass,
    // awaited before the next starts) are a small share of the time.
    let defaults = Defaults {
        batch_size: 10_000,
        concurrency: 256,
        prefetch: Some(256),
        every: Some(std::time::Duration::from_secs(1)),
        doing,
    };
    drain::run_passes(store, &args.run, defaults, relay.clone(), relay).await
}

/// A transport that publishes both kinds of message.
trait Broker: EventBus + JobDispatcher {}
impl<T: EventBus + JobDispatcher> Broker for T {}

/// The broker transport, reporting each failed publish on stderr as
/// `drain` reports each failed delivery.
#[derive(Clone)]
struct Relay(Arc<dyn Broker>);

impl EventBus for Relay {
    fn publish(&self, delivery: Delivery) -> LocalBoxFuture<'static, DeliveryResult> {
        let context = delivery.context.clone();
        drain::reported(self.0.publish(delivery), &context)
    }
}

impl JobDispatcher for Relay {
    fn dispatch(&self, delivery: Delivery) -> LocalBoxFuture<'static, DeliveryResult> {
        let context = delivery.context.clone();
        drain::reported(self.0.dispatch(delivery), &context)
    }
}

/// The transport for `--to`, by its scheme, connected and checked.
async fn connect(args: &RelayArgs) -> Result<(Arc<dyn Broker>, &'static str), Failure> {
    let scheme = args
        .to
        .split_once("://")
        .map(|(scheme, _)| scheme.to_ascii_lowercase())
        .ok_or_else(|| {
            Failure::usage(format!("--to {:?} has no scheme", redact_url(&args.to)))
                .hint("write nats://HOST:PORT, amqp://HOST:PORT/VHOST, redis://HOST:PORT or kafka://HOST:PORT")
        })?;
    let names = NameMap::new(args.subject_prefix.clone());
    match scheme.as_str() {
        "nats" | "tls" => {
            use outbox_brokers::nats::{NatsConfig, NatsTransport};
            let config = NatsConfig::new(args.stream.clone(), names).ack_timeout(args.ack_timeout);
            let transport = NatsTransport::connect(&args.to, config)
                .await
                .map_err(broker_failure)?;
            Ok((Arc::new(transport), "relaying to NATS JetStream from"))
        }
        "amqp" | "amqps" => {
            use outbox_brokers::amqp::{AmqpConfig, AmqpTransport};
            let config = AmqpConfig::new(args.exchange.clone())
                .routing(names)
                .confirm_timeout(args.ack_timeout);
            let transport = AmqpTransport::connect(&args.to, config)
                .await
                .map_err(broker_failure)?;
            Ok((Arc::new(transport), "relaying to RabbitMQ from"))
        }
        "redis" => {
            use outbox_brokers::redis::{RedisConfig, RedisTransport};
            let mut config = RedisConfig::new()
                .streams(names)
                .dedup_window(args.dedup_window)
                .timeout(args.ack_timeout);
            if let Some(max_len) = args.max_len {
                config = config.max_len(max_len);
            }
            let transport = RedisTransport::connect(&args.to, config)
                .await
                .map_err(broker_failure)?;
            Ok((Arc::new(transport), "relaying to Redis Streams from"))
        }
        "kafka" => {
            use outbox_brokers::kafka::{KafkaConfig, KafkaTransport};
            let config = KafkaConfig::new(names).delivery_timeout(args.ack_timeout);
            let transport = KafkaTransport::connect(&args.to, config)
                .await
                .map_err(broker_failure)?;
            Ok((Arc::new(transport), "relaying to Kafka from"))
        }
        other => Err(Failure::usage(format!(
            "--to {}: unknown broker scheme `{other}://`",
            redact_url(&args.to)
        ))
        .hint(
            "use nats://HOST:PORT, amqp://HOST:PORT/VHOST, redis://HOST:PORT or kafka://HOST:PORT",
        )),
    }
}

/// A broker that refused the configuration is a usage error (fix the flags
/// or the broker); one that could not be reached is operational.
fn broker_failure(error: BrokerError) -> Failure {
    if error.is_permanent() {
        Failure::usage(error.to_string())
            .hint("check --to, --stream, --exchange and --subject-prefix against the broker's configuration")
    } else {
        Failure::operational(error.to_string()).hint("is the broker running and reachable?")
    }
}
