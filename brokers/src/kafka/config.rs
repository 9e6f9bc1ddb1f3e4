//! What a [`KafkaTransport`](super::KafkaTransport) is told, and the
//! librdkafka settings it makes of it.

use std::time::Duration;

use rdkafka::ClientConfig;

use super::BROKER;
use crate::{BrokerError, FailureClass, NameMap};

/// Settings the transport owns: setting them through [`KafkaConfig::set`]
/// would weaken a guarantee or contradict another setting, so it is refused.
const OWNED: &[(&str, &str)] = &[
    ("bootstrap.servers", "give the brokers in the URL"),
    ("metadata.broker.list", "give the brokers in the URL"),
    ("enable.idempotence", "the producer is always idempotent"),
    ("acks", "every publish waits for all in-sync replicas"),
    (
        "request.required.acks",
        "every publish waits for all in-sync replicas",
    ),
    ("message.timeout.ms", "use KafkaConfig::delivery_timeout"),
    ("delivery.timeout.ms", "use KafkaConfig::delivery_timeout"),
    (
        "transactional.id",
        "the transport does not use transactions",
    ),
];

/// Where and how a [`KafkaTransport`](super::KafkaTransport) publishes.
#[derive(Debug, Clone)]
pub struct KafkaConfig {
    topics: NameMap,
    pub(crate) delivery_timeout: Duration,
    client_id: String,
    properties: Vec<(String, String)>,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        Self::new(NameMap::default())
    }
}

impl KafkaConfig {
    /// Publish each message to the topic `topics` gives its name, waiting
    /// up to 10 s for the broker's acknowledgement.
    pub fn new(topics: NameMap) -> Self {
        KafkaConfig {
            topics,
            delivery_timeout: Duration::from_secs(10),
            client_id: "outbox".to_owned(),
            properties: Vec::new(),
        }
    }

    /// How long a publish may take, retries inside the client included,
    /// before it fails as transient and the outbox retries the message with
    /// its backoff (default 10 s, at least 1 ms). The transport keeps this
    /// time itself, not librdkafka, whose `message.timeout.ms` is set to
    /// never (the [module docs](super#failures) say why). Keep it well
    /// under the claim lease: a publish still waiting when the lease runs
    /// out is abandoned and published again.
    pub fn delivery_timeout(mut self, timeout: Duration) -> Self {
        self.delivery_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// The `client.id` the brokers see (default `outbox`).
    pub fn client_id(mut self, id: impl Into<String>) -> Self {
        self.client_id = id.into();
        self
    }

    /// Any other librdkafka producer property: TLS and SASL
    /// (`security.protocol`, `sasl.mechanism`, ...; the `ssl` and `sasl`
    /// features of `rdkafka` must then be enabled), `compression.type`,
    /// `linger.ms`, ... The properties that carry the transport's
    /// guarantees (`enable.idempotence`, `acks`, the delivery timeout, the
    /// brokers) are refused by
    /// [`KafkaTransport::connect`](super::KafkaTransport::connect).
    pub fn set(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.properties.push((key.into(), value.into()));
        self
    }

    /// How message names become topics.
    pub fn topics(&self) -> &NameMap {
        &self.topics
    }

    /// The librdkafka settings of a producer for the brokers of `url`.
    pub(crate) fn client_config(&self, url: &str) -> Result<ClientConfig, BrokerError> {
        let brokers = bootstrap_servers(url)?;
        let mut config = ClientConfig::new();
        for (key, value) in &self.properties {
            if let Some((_, instead)) = OWNED.iter().find(|(owned, _)| owned == key) {
                return Err(BrokerError::new(
                    BROKER,
                    "connect",
                    FailureClass::Permanent,
                    format!("the property `{key}` cannot be set ({value:?}): {instead}"),
                ));
            }
            config.set(key, value);
        }
        if config.get("partitioner").is_none() {
            config.set("partitioner", "murmur2_random");
        }
        let timeout_ms = self.delivery_timeout.as_millis().clamp(1, i32::MAX as u128);
        // A topic missing from the cluster fails its messages after this
        // long, with an error that dead-letters them; it must come before
        // the delivery timeout, whose error is only retried.
        let propagation_ms = (timeout_ms / 2).max(1);
        // A record librdkafka timed out would make it bump the session's
        // epoch and go on producing under the new one, which not every
        // Kafka-API broker accepts: the transport times each publish out
        // itself and then starts a new session (see `KafkaTransport::produce`).
        config
            .set("bootstrap.servers", brokers)
            .set("client.id", &self.client_id)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("message.timeout.ms", "0")
            .set("request.timeout.ms", timeout_ms.to_string())
            .set(
                "topic.metadata.propagation.max.ms",
                propagation_ms.to_string(),
            );
        Ok(config)
    }
}

/// The `host:port` list of a `kafka://HOST:PORT[,HOST:PORT...]` URL.
pub(crate) fn bootstrap_servers(url: &str) -> Result<String, BrokerError> {
    let refuse = |why: &str| {
        BrokerError::new(
            BROKER,
            "connect",
            FailureClass::Permanent,
            format!("`{url}` is not a Kafka URL: {why} (write kafka://HOST:PORT[,HOST:PORT...])"),
        )
    };
    let Some(rest) = url.strip_prefix("kafka://") else {
        return Err(refuse("it does not start with kafka://"));
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains('@') {
        return Err(refuse(
            "credentials go in KafkaConfig::set (sasl.username, sasl.password), not in the URL",
        ));
    }
    if rest.contains(['/', '?', '#']) {
        return Err(refuse("it has a path or a query"));
    }
    let mut brokers = Vec::new();
    for broker in rest.split(',') {
        match broker.rsplit_once(':') {
            Some((host, port))
                if !host.is_empty() && !port.is_empty() && port.parse::<u16>().is_ok() =>
            {
                brokers.push(broker);
            }
            _ => return Err(refuse(&format!("`{broker}` is not HOST:PORT"))),
        }
    }
    Ok(brokers.join(","))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{KafkaConfig, bootstrap_servers};
    use crate::FailureClass;

    #[test]
    fn urls_name_the_brokers() {
        assert_eq!(
            bootstrap_servers("kafka://127.0.0.1:9092").unwrap(),
            "127.0.0.1:9092"
        );
        assert_eq!(
            bootstrap_servers("kafka://a:9092,b:9093/").unwrap(),
            "a:9092,b:9093"
        );
        assert_eq!(
            bootstrap_servers("kafka://[::1]:9092").unwrap(),
            "[::1]:9092"
        );
        for bad in [
            "nats://a:4222",
            "a:9092",
            "kafka://",
            "kafka://a",
            "kafka://a:port",
            "kafka://u:p@a:9092",
            "kafka://a:9092/topic",
            "kafka://a:9092,",
        ] {
            let error = bootstrap_servers(bad).expect_err(bad);
            assert_eq!(error.class, FailureClass::Permanent, "{bad}");
        }
    }

    #[test]
    fn the_guarantees_cannot_be_overridden() {
        let config = KafkaConfig::default()
            .set("linger.ms", "5")
            .delivery_timeout(Duration::from_secs(4));
        let built = config.client_config("kafka://a:9092").unwrap();
        assert_eq!(built.get("enable.idempotence"), Some("true"));
        assert_eq!(built.get("acks"), Some("all"));
        assert_eq!(built.get("message.timeout.ms"), Some("0"));
        assert_eq!(built.get("request.timeout.ms"), Some("4000"));
        assert_eq!(built.get("topic.metadata.propagation.max.ms"), Some("2000"));
        assert_eq!(built.get("linger.ms"), Some("5"));
        assert_eq!(built.get("partitioner"), Some("murmur2_random"));

        for key in ["enable.idempotence", "acks", "message.timeout.ms"] {
            let error = KafkaConfig::default()
                .set(key, "0")
                .client_config("kafka://a:9092")
                .expect_err(key);
            assert_eq!(error.class, FailureClass::Permanent);
            assert!(error.reason.contains(key), "{error}");
        }
    }
}
