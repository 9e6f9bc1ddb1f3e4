//! NATS JetStream through `async-nats`.
//!
//! [`NatsTransport`] publishes each message to the subject its name maps to
//! ([`NameMap`]), with the stored JSON as the payload, the [`headers`](crate::headers) of
//! every transport, and `Nats-Msg-Id` set to the outbox message id; it
//! settles the delivery only once JetStream's `PubAck` arrived.
//!
//! ```no_run
//! use outbox::{MessageKind, OutboxStore, Registry};
//! use outbox_actors::DrainCoordinator;
//! use outbox_brokers::{NameMap, NatsConfig, NatsTransport};
//!
//! # async fn relay(store: impl OutboxStore) -> Result<(), Box<dyn std::error::Error>> {
//! // A stream `EVENTS` on `events.>` must exist (`nats stream add EVENTS --subjects 'events.>'`).
//! let names = NameMap::new("events.").rename("orders.placed", "order.placed");
//! let nats = NatsTransport::connect("nats://127.0.0.1:4222", NatsConfig::new("EVENTS", names)).await?;
//! let coordinator = DrainCoordinator::builder(store)
//!     .registry(Registry::builder().any(MessageKind::Event).any(MessageKind::Job).build()?)
//!     .event_bus(nats.clone())
//!     .job_dispatcher(nats)
//!     .start()?;
//! # let _ = coordinator;
//! # Ok(())
//! # }
//! ```
//!
//! # Deduplication
//!
//! JetStream drops a message whose `Nats-Msg-Id` it has already stored
//! within the stream's duplicate window (`duplicate_window`, 2 minutes by
//! default): the `PubAck` of such a redelivery says `duplicate` and the
//! stream keeps one copy. A redelivery that reaches the server after the
//! window has passed since the first copy was stored (a publish whose `PubAck`
//! was lost, then a lease expiring and a retry backoff longer than the
//! window) is stored a second time, and consumers must then deduplicate on
//! the `Outbox-Message-Id` header. Keep the window longer than the lease plus
//! the longest retry delay.
//!
//! # Ordering keys
//!
//! A JetStream stream keeps the order in which it stored messages, per
//! subject as a whole. To keep a key's messages apart (one consumer per key,
//! or a subject filter per key), give the key a subject of its own through
//! the name map: `NameMap::new("events.").rename("orders.placed",
//! "orders.placed.eu")` publishes to `events.orders.placed.eu`, which a
//! stream on `events.>` still stores.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::header::HeaderName;
use async_nats::jetstream::context::{GetStreamErrorKind, PublishError, PublishErrorKind};
use async_nats::jetstream::{self, ErrorCode};
use async_nats::{
    Client, ConnectErrorKind, Event, HeaderMap, HeaderValue, ServerAddr, ServerError,
};
use bytes::Bytes;
use futures_util::future::LocalBoxFuture;
use outbox::{ClaimedMessage, Delivery, DeliveryResult, EventBus, JobDispatcher};

use crate::error::redact;
use crate::{BrokerError, FailureClass, NameMap, each_header};

const BROKER: &str = "nats";
/// How many server permission violations are remembered to explain a
/// publish that timed out because the server refused it.
const VIOLATIONS_KEPT: usize = 64;

/// Settings of a [`NatsTransport`].
#[derive(Debug, Clone)]
pub struct NatsConfig {
    names: NameMap,
    stream: String,
    ack_timeout: Duration,
    max_ack_inflight: usize,
}

impl NatsConfig {
    /// Publish to the subjects `names` gives, into `stream`, which must
    /// exist and cover every subject that starts with the name map's prefix
    /// (for the prefix `events.`, a stream on `events.>`).
    pub fn new(stream: impl Into<String>, names: NameMap) -> Self {
        NatsConfig {
            names,
            stream: stream.into(),
            ack_timeout: Duration::from_secs(5),
            max_ack_inflight: 5_000,
        }
    }

    /// How long a publish waits for its `PubAck` before it fails as a
    /// transient error (default 5 s).
    pub fn ack_timeout(mut self, timeout: Duration) -> Self {
        self.ack_timeout = timeout;
        self
    }

    /// How many publishes may await their `PubAck` at once (default 5 000);
    /// past that a publish waits for a free place.
    pub fn max_ack_inflight(mut self, limit: usize) -> Self {
        self.max_ack_inflight = limit.max(1);
        self
    }

    /// The name map.
    pub fn names(&self) -> &NameMap {
        &self.names
    }

    /// The stream name.
    pub fn stream(&self) -> &str {
        &self.stream
    }
}

/// Publishes outbox messages to NATS JetStream: an [`EventBus`] and a
/// [`JobDispatcher`].
///
/// Cloning is cheap and shares the connection.
#[derive(Debug, Clone)]
pub struct NatsTransport(Arc<Shared>);

/// What the clones of one transport share. Behind one `Arc` because every
/// delivery takes a clone into its future: one count to move, where the
/// client and the JetStream context would take several.
#[derive(Debug)]
struct Shared {
    client: Client,
    jetstream: jetstream::Context,
    config: NatsConfig,
    violations: Arc<Mutex<VecDeque<String>>>,
}

impl NatsTransport {
    /// Connect to `url` (`nats://host:port`, or several separated by
    /// commas) and check that the configured stream exists and covers the
    /// name map's subjects.
    ///
    /// A server that cannot be reached is a transient error; bad
    /// credentials, a malformed URL, a missing stream or one that does not
    /// cover the subjects are permanent ones saying what to fix. Once
    /// connected, the client reconnects by itself for as long as it takes,
    /// and publishes fail as transient errors meanwhile.
    pub async fn connect(url: &str, config: NatsConfig) -> Result<Self, BrokerError> {
        // async-nats reads a string as one address; a cluster's list is
        // split here, so the client knows every node and reconnects to a
        // live one.
        let servers = url
            .split(',')
            .map(|one| one.trim().parse::<ServerAddr>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|err| {
                let reason = format!("`{}` is not a NATS URL: {err}", redact(url));
                BrokerError::new(BROKER, "connect", FailureClass::Permanent, reason)
            })?;
        let violations = Arc::new(Mutex::new(VecDeque::new()));
        let seen = Arc::clone(&violations);
        let client = async_nats::ConnectOptions::new()
            .connection_timeout(Duration::from_secs(5))
            .event_callback(move |event| {
                let seen = Arc::clone(&seen);
                async move {
                    // The server refuses a publish it does not permit with an
                    // -ERR on the connection, not on the publish: remember it
                    // so the publish that then times out can say why.
                    if let Event::ServerError(ServerError::Other(reason)) = event
                        && reason
                            .to_ascii_lowercase()
                            .contains("permissions violation")
                    {
                        let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                        if seen.len() == VIOLATIONS_KEPT {
                            seen.pop_front();
                        }
                        seen.push_back(reason);
                    }
                }
            })
            .connect(servers.as_slice())
            .await
            .map_err(|err| {
                let class = match err.kind() {
                    ConnectErrorKind::ServerParse
                    | ConnectErrorKind::Authentication
                    | ConnectErrorKind::AuthorizationViolation => FailureClass::Permanent,
                    _ => FailureClass::Transient,
                };
                let reason = format!("cannot connect to {}: {err}", redact(url));
                BrokerError::new(BROKER, "connect", class, reason).with_source(err)
            })?;
        Self::checked(client, config, violations).await
    }

    /// Use a connected client (its own options, its own reconnection
    /// policy), checking the stream as [`NatsTransport::connect`] does.
    pub async fn from_client(client: Client, config: NatsConfig) -> Result<Self, BrokerError> {
        Self::checked(client, config, Arc::new(Mutex::new(VecDeque::new()))).await
    }

    /// The transport over `client`, once the stream is checked;
    /// `violations` is where the client's event callback keeps the
    /// permission violations it saw.
    async fn checked(
        client: Client,
        config: NatsConfig,
        violations: Arc<Mutex<VecDeque<String>>>,
    ) -> Result<Self, BrokerError> {
        let jetstream = jetstream::ContextBuilder::new()
            .timeout(config.ack_timeout)
            .max_ack_inflight(config.max_ack_inflight)
            .backpressure_on_inflight(true)
            .build(client.clone());
        let transport = NatsTransport(Arc::new(Shared {
            client,
            jetstream,
            config,
            violations,
        }));
        transport.verify_stream().await?;
        Ok(transport)
    }

    /// The client, to subscribe or publish outside the outbox.
    pub fn client(&self) -> &Client {
        &self.0.client
    }

    /// The JetStream context publishes go through.
    pub fn jetstream(&self) -> &jetstream::Context {
        &self.0.jetstream
    }

    /// The settings.
    pub fn config(&self) -> &NatsConfig {
        &self.0.config
    }

    /// The subject `name` is published to.
    pub fn subject(&self, name: &str) -> String {
        self.config().names.destination(name)
    }

    async fn verify_stream(&self) -> Result<(), BrokerError> {
        let subjects = self.stream_subjects("verify stream").await?;
        let prefix = self.config().names.prefix();
        if subjects.iter().any(|s| covers_prefix(s, prefix)) {
            return Ok(());
        }
        Err(BrokerError::new(
            BROKER,
            "verify stream",
            FailureClass::Permanent,
            format!(
                "stream `{}` has subjects {subjects:?}, which do not cover every subject \
                 starting with `{prefix}`: add `{prefix}>` to its subjects or change the prefix",
                self.config().stream
            ),
        ))
    }

    async fn stream_subjects(&self, operation: &'static str) -> Result<Vec<String>, BrokerError> {
        let stream = &self.config().stream;
        match self.jetstream().get_stream(stream).await {
            Ok(found) => Ok(found.cached_info().config.subjects.clone()),
            Err(err) => {
                let (class, reason) = match err.kind() {
                    GetStreamErrorKind::JetStream(js)
                        if js.error_code() == ErrorCode::STREAM_NOT_FOUND =>
                    {
                        (
                            FailureClass::Permanent,
                            format!(
                                "stream `{stream}` does not exist: create it with subjects covering `{}>` \
                             (e.g. `nats stream add {stream} --subjects '{}>'`)",
                                self.config().names.prefix(),
                                self.config().names.prefix()
                            ),
                        )
                    }
                    GetStreamErrorKind::EmptyName | GetStreamErrorKind::InvalidStreamName => (
                        FailureClass::Permanent,
                        format!("`{stream}` is not a valid stream name: {err}"),
                    ),
                    GetStreamErrorKind::JetStream(js)
                        if js.error_code() == ErrorCode::JETSTREAM_NOT_ENABLED
                            || js.error_code() == ErrorCode::JETSTREAM_NOT_ENABLED_FOR_ACCOUNT =>
                    {
                        (
                            FailureClass::Permanent,
                            format!(
                                "JetStream is not enabled on this server or account (start nats-server with -js): {err}"
                            ),
                        )
                    }
                    _ => (
                        FailureClass::Transient,
                        format!("looking up stream `{stream}`: {err}"),
                    ),
                };
                Err(BrokerError::new(BROKER, operation, class, reason).with_source(err))
            }
        }
    }

    /// Publish `message` and await its `PubAck`.
    pub async fn publish_message(&self, message: &ClaimedMessage) -> Result<(), BrokerError> {
        let subject = self.subject(&message.name);
        if let Err(reason) = valid_subject(&subject) {
            return Err(BrokerError::new(
                BROKER,
                "publish",
                FailureClass::Permanent,
                format!(
                    "message name `{}` maps to subject `{subject}`, {reason}: rename it in the name map",
                    message.name
                ),
            ));
        }
        let map = header_map(message)?;
        let payload = Bytes::copy_from_slice(message.payload.as_str().as_bytes());
        let size = payload.len();
        // Boxed on its own: the client's publish future is most of a
        // publish's, and with it inline the whole took over a kilobyte, an
        // allocation the allocator serves slowly, once per message.
        let sent = Box::pin(
            self.jetstream()
                .publish_with_headers(subject.clone(), map, payload),
        )
        .await;
        let result = match sent {
            Ok(ack) => ack.await,
            Err(err) => Err(err),
        };
        match result {
            Ok(ack) => {
                if ack.duplicate {
                    tracing::debug!(id = %message.id, %subject, stream = %ack.stream, "JetStream already held this message id: dropped as a duplicate");
                }
                Ok(())
            }
            // Boxed: classifying may look the stream up, a future many
            // times the size of a publish, which every publish's future
            // would otherwise carry.
            Err(err) => Err(Box::pin(self.classify(err, &subject, size)).await),
        }
    }

    async fn classify(&self, err: PublishError, subject: &str, size: usize) -> BrokerError {
        let (class, reason) = match err.kind() {
            PublishErrorKind::MaxPayloadExceeded => (
                FailureClass::Permanent,
                format!(
                    "message of {size} bytes to `{subject}` exceeds the server's max_payload of {} bytes",
                    self.0.client.server_info().max_payload
                ),
            ),
            PublishErrorKind::StreamNotFound => match self.stream_subjects("publish").await {
                // The stream is there and would take the subject: JetStream
                // did not answer yet (a server starting, a reconnect).
                Ok(subjects) if subjects.iter().any(|s| subject_matches(s, subject)) => (
                    FailureClass::Transient,
                    format!(
                        "no JetStream responder for `{subject}` (server starting or reconnecting)"
                    ),
                ),
                Ok(subjects) => (
                    FailureClass::Permanent,
                    format!(
                        "no stream for subject `{subject}`: stream `{}` covers {subjects:?}",
                        self.0.config.stream
                    ),
                ),
                Err(lookup) if lookup.is_permanent() => (
                    FailureClass::Permanent,
                    format!("no stream for subject `{subject}`: {}", lookup.reason),
                ),
                Err(lookup) => (
                    FailureClass::Transient,
                    format!(
                        "no JetStream responder for `{subject}`, and {}",
                        lookup.reason
                    ),
                ),
            },
            PublishErrorKind::TimedOut => match self.violation(subject) {
                Some(violation) => (FailureClass::Permanent, violation),
                None => (
                    FailureClass::Transient,
                    format!(
                        "no PubAck for `{subject}` within {:?} (connection {:?})",
                        self.0.config.ack_timeout,
                        self.0.client.connection_state()
                    ),
                ),
            },
            PublishErrorKind::BrokenPipe | PublishErrorKind::MaxAckPending => (
                FailureClass::Transient,
                format!("publishing to `{subject}`: {err}"),
            ),
            PublishErrorKind::WrongLastMessageId | PublishErrorKind::WrongLastSequence => (
                FailureClass::Permanent,
                format!("publishing to `{subject}`: {err}"),
            ),
            PublishErrorKind::Other => {
                let code = std::error::Error::source(&err)
                    .and_then(|source| source.downcast_ref::<jetstream::Error>())
                    .map(jetstream::Error::error_code);
                let class = match code {
                    Some(
                        ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM
                        | ErrorCode::STREAM_NOT_MATCH
                        | ErrorCode::STREAM_NOT_FOUND,
                    ) => FailureClass::Permanent,
                    // Storage and limit errors clear as consumers catch up:
                    // back-pressure, retried with the message's backoff.
                    _ => FailureClass::Transient,
                };
                let detail = std::error::Error::source(&err)
                    .map_or_else(|| err.to_string(), |source| source.to_string());
                (class, format!("publishing to `{subject}`: {detail}"))
            }
        };
        BrokerError::new(BROKER, "publish", class, reason).with_source(err)
    }

    fn violation(&self, subject: &str) -> Option<String> {
        let seen = self.0.violations.lock().unwrap_or_else(|e| e.into_inner());
        let quoted = format!("\"{subject}\"");
        seen.iter().rev().find(|r| r.contains(&quoted)).cloned()
    }

    fn deliver(&self, delivery: Delivery) -> LocalBoxFuture<'static, DeliveryResult> {
        let transport = self.clone();
        Box::pin(async move {
            transport
                .publish_message(delivery.context.message())
                .await
                .map_err(BrokerError::into_delivery_error)
        })
    }
}

impl EventBus for NatsTransport {
    fn publish(&self, delivery: Delivery) -> LocalBoxFuture<'static, DeliveryResult> {
        self.deliver(delivery)
    }
}

impl JobDispatcher for NatsTransport {
    fn dispatch(&self, delivery: Delivery) -> LocalBoxFuture<'static, DeliveryResult> {
        self.deliver(delivery)
    }
}

/// Why `subject` cannot be published to, if it cannot.
fn valid_subject(subject: &str) -> Result<(), &'static str> {
    if subject.is_empty() {
        return Err("which is empty");
    }
    if subject.chars().any(char::is_whitespace) {
        return Err("which contains whitespace");
    }
    if subject.split('.').any(|token| token.is_empty()) {
        return Err("which has an empty token");
    }
    if subject.split('.').any(|token| token == "*" || token == ">") {
        return Err("which contains a wildcard");
    }
    Ok(())
}

/// The headers `message` is published with: `Nats-Msg-Id` and every
/// transport's. The client panics on a header value with a line break, and
/// a stored id, name or trace carrier can hold one: it is refused here.
fn header_map(message: &ClaimedMessage) -> Result<HeaderMap, BrokerError> {
    let mut map = HeaderMap::new();
    // The first header that would hold a line break.
    let mut refused = None;
    let mut put =
        |name: HeaderName, header: &'static str, text: &str| match text.parse::<HeaderValue>() {
            Ok(value) => map.insert(name, value),
            Err(_) => {
                refused.get_or_insert(header);
            }
        };
    put(
        async_nats::header::NATS_MESSAGE_ID,
        "Nats-Msg-Id",
        &message.id,
    );
    each_header(message, |name, text| {
        put(HeaderName::from_static(name), name, text)
    });
    match refused {
        None => Ok(map),
        Some(header) => Err(BrokerError::new(
            BROKER,
            "publish",
            FailureClass::Permanent,
            format!(
                "the {header} header of message {:?} would hold a line break, which \
                 NATS headers cannot carry",
                message.id
            ),
        )),
    }
}

/// Whether the stream subject `pattern` matches `subject`.
fn subject_matches(pattern: &str, subject: &str) -> bool {
    let mut tokens = subject.split('.');
    for want in pattern.split('.') {
        match (want, tokens.next()) {
            (">", Some(_)) => return true,
            ("*", Some(_)) => {}
            (want, Some(token)) if want == token => {}
            _ => return false,
        }
    }
    tokens.next().is_none()
}

/// Whether `pattern` matches every subject `prefix` + name, for any name.
fn covers_prefix(pattern: &str, prefix: &str) -> bool {
    // A partial last token of the prefix is completed by the name, so only
    // the whole tokens before it must match one by one.
    let whole = prefix.rfind('.').map_or("", |dot| &prefix[..dot]);
    let whole: Vec<&str> = if whole.is_empty() {
        Vec::new()
    } else {
        whole.split('.').collect()
    };
    let wanted: Vec<&str> = pattern.split('.').collect();
    for (i, token) in whole.iter().enumerate() {
        match wanted.get(i) {
            Some(&">") => return true,
            Some(&"*") => {}
            Some(want) if want == token => {}
            _ => return false,
        }
    }
    // What follows is a name of any number of tokens: only `>` takes them all.
    wanted.len() == whole.len() + 1 && wanted[whole.len()] == ">"
}

#[cfg(test)]
mod tests {
    use super::{covers_prefix, redact, subject_matches, valid_subject};

    #[test]
    fn a_prefix_is_covered_only_by_a_full_wildcard_after_it() {
        assert!(covers_prefix("events.>", "events."));
        assert!(covers_prefix(">", "events."));
        assert!(covers_prefix("*.>", "events."));
        assert!(covers_prefix(">", ""));
        assert!(covers_prefix("a.>", "a.b"));
        assert!(!covers_prefix("events.*", "events."));
        assert!(!covers_prefix("orders.>", "events."));
        assert!(!covers_prefix("events.orders.>", "events."));
        assert!(!covers_prefix("events", "events."));
    }

    #[test]
    fn subjects_match_nats_wildcards() {
        assert!(subject_matches("events.>", "events.orders.placed"));
        assert!(subject_matches("events.*.placed", "events.orders.placed"));
        assert!(!subject_matches("events.*", "events.orders.placed"));
        assert!(!subject_matches("events.>", "events"));
        assert!(subject_matches("a.b", "a.b"));
        assert!(!subject_matches("a.b", "a.b.c"));
    }

    #[test]
    fn bad_subjects_say_why() {
        assert!(valid_subject("events.orders.placed").is_ok());
        assert_eq!(
            valid_subject("events.a b"),
            Err("which contains whitespace")
        );
        assert_eq!(valid_subject("events..a"), Err("which has an empty token"));
        assert_eq!(valid_subject("events.*"), Err("which contains a wildcard"));
        assert_eq!(valid_subject(""), Err("which is empty"));
    }

    #[test]
    fn passwords_stay_out_of_messages() {
        assert_eq!(redact("nats://u:p@host:4222"), "nats://***@host:4222");
        assert_eq!(redact("nats://host:4222"), "nats://host:4222");
        // Found by the fuzz test: the client reads these as credentials too.
        assert_eq!(redact("nats:u:p@host:4222"), "nats:***@host:4222");
        assert_eq!(redact("u:p@host:4222"), "u:***@host:4222");
    }
}
