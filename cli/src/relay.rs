//! `relay`: drain the outbox to a broker, the same runtime as `drain` with
//! a broker transport in place of a command.
//!
//! The URL scheme of `--to` picks the transport ([`connect`]); each broker
//! transport of `outbox-brokers` that this binary was built with has an arm
//! there.

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::LocalBoxFuture;
use outbox::kit::redact_url;
use outbox::{AnyOutbox, Delivery, DeliveryResult, EventBus, JobDispatcher};
use outbox_brokers::{BrokerError, NameMap};

use crate::cli::RelayArgs;
use crate::drain::{self, Defaults};
use crate::fail::Failure;

/// The wait before connecting again to a broker that could not be reached;
/// it doubles with each failed attempt up to [`LAST_RETRY`].
const FIRST_RETRY: Duration = Duration::from_secs(1);

/// The longest wait between two attempts to reach the broker.
const LAST_RETRY: Duration = Duration::from_secs(30);

/// `relay --once` or `relay` until Ctrl-C or SIGTERM.
pub(crate) async fn relay(store: &AnyOutbox, args: RelayArgs) -> Result<(), Failure> {
    let scheme = Scheme::of(&args.to)?;
    // Installed before the broker is tried, so Ctrl-C also ends the wait
    // for a broker that is not up yet.
    let mut stop = pin!(drain::stop_signal()?);
    let Some((broker, doing)) = reach(scheme, &args, stop.as_mut()).await? else {
        eprintln!(
            "stopped before {} answered; nothing was claimed",
            redact_url(&args.to)
        );
        return Ok(());
    };
    let relay = Relay(broker);
    // A broker's acknowledgement takes milliseconds, so slots are refilled
    // from prefetched messages rather than after a claim's round-trip, and
    // passes are long enough that their tails (the last publishes of a pass,
    // awaited before the next starts) are a small share of the time.
    let defaults = Defaults {
        batch_size: 10_000,
        concurrency: 256,
        prefetch: Some(256),
        every: Some(Duration::from_secs(1)),
        doing,
    };
    drain::run_passes(store, &args.run, defaults, stop, relay.clone(), relay).await
}

/// Connect to the broker, or `None` if `stop` came first.
///
/// A broker that cannot be reached (down, restarting, a cluster still
/// electing its leaders) is tried again, after 1 s, then twice as long each
/// time up to 30 s, for as long as it takes: an orchestrator may start the
/// relay before its broker, and a relay that exited would only be started
/// again. `--once` gives up at the first failure instead, for the caller
/// (a scheduled job, a script) to run it again. A broker that refuses the
/// configuration is not tried again either: only the operator can fix it.
async fn reach(
    scheme: Scheme,
    args: &RelayArgs,
    mut stop: Pin<&mut impl Future<Output = ()>>,
) -> Result<Option<(Arc<dyn Broker>, &'static str)>, Failure> {
    let mut delay = FIRST_RETRY;
    loop {
        let attempt = tokio::select! {
            biased;
            () = stop.as_mut() => return Ok(None),
            attempt = connect(scheme, args) => attempt,
        };
        let error = match attempt {
            Ok(connected) => return Ok(Some(connected)),
            Err(error) if error.is_permanent() || args.run.once => {
                return Err(broker_failure(error));
            }
            Err(error) => error,
        };
        eprintln!(
            "{error}; trying again in {}",
            humantime::format_duration(delay)
        );
        tokio::select! {
            biased;
            () = stop.as_mut() => return Ok(None),
            () = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(LAST_RETRY);
    }
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

/// The brokers `--to` can name, by its URL's scheme.
#[derive(Debug, Clone, Copy)]
enum Scheme {
    Nats,
    Amqp,
    Redis,
    Kafka,
}

impl Scheme {
    /// The scheme of `to`, or a usage error naming the ones known.
    fn of(to: &str) -> Result<Scheme, Failure> {
        const KNOWN: &str =
            "use nats://HOST:PORT, amqp://HOST:PORT/VHOST, redis://HOST:PORT or kafka://HOST:PORT";
        let Some((scheme, _)) = to.split_once("://") else {
            return Err(
                Failure::usage(format!("--to {:?} has no scheme", redact_url(to))).hint(KNOWN),
            );
        };
        match scheme.to_ascii_lowercase().as_str() {
            "nats" | "tls" => Ok(Scheme::Nats),
            "amqp" | "amqps" => Ok(Scheme::Amqp),
            "redis" => Ok(Scheme::Redis),
            "kafka" => Ok(Scheme::Kafka),
            other => Err(Failure::usage(format!(
                "--to {}: unknown broker scheme `{other}://`",
                redact_url(to)
            ))
            .hint(KNOWN)),
        }
    }
}

/// The transport for `--to`, connected and checked, and how the command
/// announces itself.
async fn connect(
    scheme: Scheme,
    args: &RelayArgs,
) -> Result<(Arc<dyn Broker>, &'static str), BrokerError> {
    let names = NameMap::new(args.subject_prefix.clone());
    Ok(match scheme {
        Scheme::Nats => {
            use outbox_brokers::nats::{NatsConfig, NatsTransport};
            let config = NatsConfig::new(args.stream.clone(), names).ack_timeout(args.ack_timeout);
            let transport = NatsTransport::connect(&args.to, config).await?;
            (Arc::new(transport), "relaying to NATS JetStream from")
        }
        Scheme::Amqp => {
            use outbox_brokers::amqp::{AmqpConfig, AmqpTransport};
            let config = AmqpConfig::new(args.exchange.clone())
                .routing(names)
                .confirm_timeout(args.ack_timeout);
            let transport = AmqpTransport::connect(&args.to, config).await?;
            (Arc::new(transport), "relaying to RabbitMQ from")
        }
        Scheme::Redis => {
            use outbox_brokers::redis::{RedisConfig, RedisTransport};
            let mut config = RedisConfig::new()
                .streams(names)
                .dedup_window(args.dedup_window)
                .timeout(args.ack_timeout);
            if let Some(max_len) = args.max_len {
                config = config.max_len(max_len);
            }
            let transport = RedisTransport::connect(&args.to, config).await?;
            (Arc::new(transport), "relaying to Redis Streams from")
        }
        Scheme::Kafka => {
            use outbox_brokers::kafka::{KafkaConfig, KafkaTransport};
            let config = KafkaConfig::new(names).delivery_timeout(args.ack_timeout);
            let transport = KafkaTransport::connect(&args.to, config).await?;
            (Arc::new(transport), "relaying to Kafka from")
        }
    })
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
