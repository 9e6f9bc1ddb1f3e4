//! Redis Streams through the `redis` crate.
//!
//! [`RedisTransport`] appends each claimed message to a stream (`XADD`), the
//! stream key being what its [`NameMap`] gives the message name. An entry has
//! the field `payload` (the stored JSON as is) and one field per header of
//! [`headers`](crate::headers): `Outbox-Message-Id`, `Outbox-Name`,
//! `Outbox-Kind`, `Outbox-Attempt`, and `traceparent`/`tracestate` when the
//! message was enqueued inside a trace.
//!
//! # Deduplication
//!
//! One server-side script does, atomically: `SET <dedup prefix><id> 1 NX PX
//! <window>`, and only if that key was not there, `XADD`. So a redelivery of
//! the same outbox id within [`RedisConfig::dedup_window`] of the first
//! successful publish adds nothing (the publish succeeds and the outbox
//! settles the message); the stream holds each id once. A redelivery after
//! the window (the key expired), or after the dedup key was lost (a Redis
//! restart without persistence, a failover to a replica that had not
//! received it, eviction under `maxmemory` with an evicting policy), is
//! appended again: consumers that cannot tolerate a second copy deduplicate
//! on the `Outbox-Message-Id` field. Keep the window longer than the time a
//! message can stay unsettled after its publish (the claim lease plus the
//! retry backoff); the default is 24 h.
//!
//! If `XADD` fails inside the script, the script removes the dedup key it
//! just set, so the retry is not mistaken for a duplicate.
//!
//! # Failures
//!
//! Connection errors and timeouts are transient (retried with the message's
//! backoff); the next publish after a loss opens a new connection. `OOM`
//! (Redis above `maxmemory`), `LOADING`, `BUSY`, `TRYAGAIN`, `MASTERDOWN`,
//! `READONLY` (a failover in progress) are transient back-pressure.
//! `WRONGTYPE` (the stream key holds another type), `NOPERM`/`NOAUTH`/
//! `WRONGPASS` (authorization) are permanent: the message is dead-lettered at
//! once with Redis's reason.
//!
//! Ordering: a stream keeps append order; route a family of messages that
//! must stay ordered to one stream key (the name map), and remember retries
//! and concurrent deliveries can still reorder appends.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use outbox_brokers::NameMap;
//! use outbox_brokers::redis::{RedisConfig, RedisTransport};
//!
//! # async fn run() -> Result<(), outbox_brokers::BrokerError> {
//! let transport = RedisTransport::connect(
//!     "redis://127.0.0.1:6379/0",
//!     RedisConfig::new()
//!         .streams(NameMap::new("events:"))
//!         .dedup_window(Duration::from_secs(24 * 3600))
//!         .max_len(1_000_000),
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
use outbox::{Delivery, DeliveryResult, EventBus, JobDispatcher};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, ErrorKind, RedisError, Script};
use tokio::sync::Mutex;

use crate::{BrokerError, FailureClass, NameMap, each_header};

const BROKER: &str = "redis";

/// The server-side script each publish runs, for tools that want to append
/// exactly as the transport does (the relay benchmark's raw loop does).
///
/// `KEYS[1]` the dedup key, `KEYS[2]` the stream; `ARGV[1]` the window in
/// ms, `ARGV[2]` the approximate MAXLEN (`0`: none), then field/value pairs. It
/// answers `duplicate` when the dedup key was already set, else the new
/// entry's id.
pub const PUBLISH_SCRIPT: &str = r#"
if not redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1]) then
  return 'duplicate'
end
local xadd = {'XADD', KEYS[2]}
if ARGV[2] ~= '0' then
  table.insert(xadd, 'MAXLEN')
  table.insert(xadd, '~')
  table.insert(xadd, ARGV[2])
end
table.insert(xadd, '*')
for i = 3, #ARGV do
  table.insert(xadd, ARGV[i])
end
local added = redis.pcall(unpack(xadd))
if type(added) == 'table' and added.err then
  redis.call('DEL', KEYS[1])
  return added
end
return added
"#;

/// What the publish script answers for a redelivery inside the window.
const DUPLICATE: &str = "duplicate";

/// Where and how [`RedisTransport`] appends.
#[derive(Debug, Clone)]
pub struct RedisConfig {
    streams: NameMap,
    dedup_prefix: String,
    dedup_window: Duration,
    max_len: Option<u64>,
    timeout: Duration,
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl RedisConfig {
    /// Stream key = message name, dedup keys `outbox:dedup:<id>` kept 24 h,
    /// no trimming, a 10 s timeout per command.
    pub fn new() -> Self {
        RedisConfig {
            streams: NameMap::default(),
            dedup_prefix: "outbox:dedup:".to_owned(),
            dedup_window: Duration::from_secs(24 * 3600),
            max_len: None,
            timeout: Duration::from_secs(10),
        }
    }

    /// How a message name becomes the stream key.
    pub fn streams(mut self, streams: NameMap) -> Self {
        self.streams = streams;
        self
    }

    /// How long a published id is remembered: a redelivery within it adds
    /// nothing. Rounded to milliseconds, at least 1 ms.
    pub fn dedup_window(mut self, window: Duration) -> Self {
        self.dedup_window = window;
        self
    }

    /// The prefix of the dedup keys (followed by the message id).
    pub fn dedup_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.dedup_prefix = prefix.into();
        self
    }

    /// Trim each stream to about `n` entries on every append (`MAXLEN ~ n`):
    /// Redis trims whole macro nodes, so the stream may hold somewhat more.
    pub fn max_len(mut self, n: u64) -> Self {
        self.max_len = Some(n);
        self
    }

    /// How long connecting, and each publish, may take before it fails as
    /// transient. Keep it well under the claim lease.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    fn window_ms(&self) -> u64 {
        u64::try_from(self.dedup_window.as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }
}

struct Inner {
    client: Client,
    config: RedisConfig,
    script: Script,
    /// The shared connection and a count of connections opened, so a failed
    /// publish drops only the connection it used.
    connection: Mutex<(Option<MultiplexedConnection>, u64)>,
}

/// Appends outbox messages to Redis Streams, deduplicated by outbox id.
///
/// Cheap to clone; clones share the connection. See the [module
/// docs](self) for the entry layout, the dedup window and how failures are
/// classified.
#[derive(Clone)]
pub struct RedisTransport {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RedisTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTransport")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

/// What one publish did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Appended {
    /// A new entry, with the id Redis gave it.
    Entry(String),
    /// The id was published within the dedup window: nothing was added.
    Duplicate,
}

impl RedisTransport {
    /// Connect to `url` (`redis://[user:pass@]host:port/db`, `rediss://` for
    /// TLS is not enabled in this build) and load the publish script.
    ///
    /// A malformed URL or refused credentials are permanent errors; an
    /// unreachable server is transient.
    pub async fn connect(url: &str, config: RedisConfig) -> Result<Self, BrokerError> {
        let client = Client::open(url).map_err(|e| {
            BrokerError::new(
                BROKER,
                "connect",
                FailureClass::Permanent,
                format!("invalid Redis URL: {e}"),
            )
            .with_source(e)
        })?;
        let transport = RedisTransport {
            inner: Arc::new(Inner {
                client,
                config,
                script: Script::new(PUBLISH_SCRIPT),
                connection: Mutex::new((None, 0)),
            }),
        };
        let (mut connection, _) = transport.connection().await?;
        // Loading the script now turns a server that refuses scripts
        // (NOPERM, no EVAL) into an error here rather than at first publish.
        let invocation = transport.inner.script.prepare_invoke();
        let load = invocation.load_async(&mut connection);
        match tokio::time::timeout(transport.inner.config.timeout, load).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(classify("load script", e)),
            Err(_) => return Err(timed_out("load script", transport.inner.config.timeout)),
        }
        Ok(transport)
    }

    /// The configuration this transport publishes with.
    pub fn config(&self) -> &RedisConfig {
        &self.inner.config
    }

    /// Append one claimed message, unless its id was appended within the
    /// dedup window.
    pub async fn send(&self, delivery: &Delivery) -> Result<Appended, BrokerError> {
        let config = &self.inner.config;
        let message = delivery.context.message();
        let stream = config.streams.destination(&message.name);
        let (mut connection, generation) = self.connection().await?;
        let mut invocation = self.inner.script.prepare_invoke();
        invocation
            .key(format!("{}{}", config.dedup_prefix, message.id))
            .key(&stream)
            .arg(config.window_ms())
            .arg(config.max_len.unwrap_or(0))
            .arg("payload")
            .arg(message.payload.as_str());
        each_header(message, |name, value| {
            invocation.arg(name).arg(value);
        });
        let call = invocation.invoke_async::<String>(&mut connection);
        let (result, lost) = match tokio::time::timeout(config.timeout, call).await {
            Ok(Ok(reply)) if reply == DUPLICATE => (Ok(Appended::Duplicate), false),
            Ok(Ok(entry)) => (Ok(Appended::Entry(entry)), false),
            Ok(Err(e)) => {
                let lost = connection_lost(&e);
                (Err(classify("publish", e)), lost)
            }
            // A command that timed out may leave a half-open connection.
            Err(_) => (Err(timed_out("publish", config.timeout)), true),
        };
        if lost {
            self.discard(generation).await;
        }
        result
    }

    async fn connection(&self) -> Result<(MultiplexedConnection, u64), BrokerError> {
        let mut guard = self.inner.connection.lock().await;
        if let (Some(connection), generation) = &*guard {
            return Ok((connection.clone(), *generation));
        }
        let timeout = self.inner.config.timeout;
        let settings = AsyncConnectionConfig::new()
            .set_connection_timeout(timeout)
            .set_response_timeout(timeout);
        // Boxed, as connecting is rare: inline, its future made every
        // publish's over two kilobytes, an allocation glibc serves slowly
        // (it consolidates its free lists for every one that large).
        let connection = Box::pin(
            self.inner
                .client
                .get_multiplexed_async_connection_with_config(&settings),
        )
        .await
        .map_err(|e| classify("connect", e))?;
        let generation = guard.1 + 1;
        *guard = (Some(connection.clone()), generation);
        Ok((connection, generation))
    }

    /// Drop the shared connection after it failed, unless a concurrent
    /// publish already replaced it.
    async fn discard(&self, generation: u64) {
        let mut guard = self.inner.connection.lock().await;
        if guard.0.is_some() && guard.1 == generation {
            guard.0 = None;
        }
    }
}

/// Whether the error is about the connection rather than a server reply
/// (a reply leaves the connection usable).
pub(crate) fn connection_lost(error: &RedisError) -> bool {
    error.is_io_error()
        || error.is_timeout()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
}

fn timed_out(operation: &'static str, timeout: Duration) -> BrokerError {
    BrokerError::new(
        BROKER,
        operation,
        FailureClass::Transient,
        format!("no answer from Redis within {timeout:?}"),
    )
}

/// Server refusals are classified by their error code; anything about the
/// connection is transient.
pub(crate) fn classify(operation: &'static str, error: RedisError) -> BrokerError {
    let reason = error.to_string();
    let class = if connection_lost(&error) {
        FailureClass::Transient
    } else {
        match (error.kind(), error.code().unwrap_or_default()) {
            (ErrorKind::AuthenticationFailed | ErrorKind::InvalidClientConfig, _) => {
                FailureClass::Permanent
            }
            (_, "WRONGTYPE" | "NOPERM" | "NOAUTH" | "WRONGPASS") => FailureClass::Permanent,
            // OOM, LOADING, BUSY, TRYAGAIN, MASTERDOWN, READONLY and the
            // unknown: a retry with backoff may succeed, and a message that
            // keeps failing still dead-letters after its attempts.
            _ => FailureClass::Transient,
        }
    };
    BrokerError::new(BROKER, operation, class, reason).with_source(error)
}

impl EventBus for RedisTransport {
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

impl JobDispatcher for RedisTransport {
    fn dispatch(&self, delivery: Delivery) -> LocalBoxFuture<'static, DeliveryResult> {
        self.publish(delivery)
    }
}
