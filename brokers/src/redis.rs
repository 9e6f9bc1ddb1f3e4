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
//! # Batching
//!
//! Publishes made at the same time share a script call: the transport takes
//! the publishes waiting when a call can go out (up to 64) and runs the
//! script once for all of them, each message deduplicated and appended on
//! its own and answered on its own (one refused append fails its message
//! alone). Nothing waits to fill a batch: a lone publish goes out at once,
//! and up to four calls are in flight on the connection. A call costs the
//! client about as much as one publish, so a relay with many deliveries in
//! flight spends a fraction of the CPU per message.
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

use std::io::Write;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use futures_util::future::LocalBoxFuture;
use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use outbox::{ClaimedMessage, Delivery, DeliveryContext, DeliveryResult, EventBus, JobDispatcher};
use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, Client, Cmd, ErrorKind, RedisError, RedisWrite, Script, ToRedisArgs,
};
use tokio::sync::{Mutex, mpsc, oneshot};

use crate::{BrokerError, FailureClass, NameMap, each_header};

const BROKER: &str = "redis";

/// The server-side script for one message, for tools that want to append
/// as the transport does, one call a message (the relay benchmark's raw
/// loop does); the transport runs the same steps for each message of a
/// batch in one call.
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

/// What the transport runs: [`PUBLISH_SCRIPT`] for each message of a batch.
///
/// `KEYS` two a message, its dedup key then its stream; `ARGV[1]` the window
/// in ms, `ARGV[2]` the approximate MAXLEN (`0`: none), then one argument a
/// message: its field/value strings, each written as its length in bytes,
/// `:`, and the bytes. One argument and one answer for the whole batch,
/// rather than a dozen and one a message, because the client's work is per
/// argument and per reply. The answer has a line a message, in order: the
/// new entry's id, `duplicate`, or `!` and the error Redis gave (one line:
/// Redis errors have no line breaks). `pcall` throughout, so a refusal
/// (`OOM`, `WRONGTYPE`) fails its own message and the next ones are still
/// tried.
const BATCH_SCRIPT: &str = r#"
local out = {}
for m = 1, #KEYS / 2 do
  local dedup, stream = KEYS[2 * m - 1], KEYS[2 * m]
  local set = redis.pcall('SET', dedup, '1', 'NX', 'PX', ARGV[1])
  if type(set) == 'table' and set.err then
    out[m] = '!' .. set.err
  elseif not set then
    out[m] = 'duplicate'
  else
    local xadd = {'XADD', stream}
    if ARGV[2] ~= '0' then
      table.insert(xadd, 'MAXLEN')
      table.insert(xadd, '~')
      table.insert(xadd, ARGV[2])
    end
    table.insert(xadd, '*')
    local packed, at = ARGV[m + 2], 1
    while at <= #packed do
      local colon = string.find(packed, ':', at, true)
      local stop = colon + tonumber(string.sub(packed, at, colon - 1))
      table.insert(xadd, string.sub(packed, colon + 1, stop))
      at = stop + 1
    end
    local added = redis.pcall(unpack(xadd))
    if type(added) == 'table' and added.err then
      redis.pcall('DEL', dedup)
      out[m] = '!' .. added.err
    else
      out[m] = added
    end
  end
end
return table.concat(out, '\n')
"#;

/// What the publish script answers for a redelivery inside the window.
const DUPLICATE: &str = "duplicate";

/// The most messages one script call appends: Redis runs a script to its
/// end before serving anything else, so a call stays under a millisecond
/// of the server's time (some 11 µs a message).
const MAX_BATCH: usize = 64;

/// The most script calls in flight on the connection at once: enough to
/// keep it busy while a call's answer travels back, few enough that
/// publishes arriving meanwhile gather into the next batch.
const MAX_IN_FLIGHT: usize = 4;

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

    /// How long connecting, and each script call (the publishes of one
    /// batch), may take before it fails as transient; a publish that waited
    /// for a free call waits that long again at most. Keep it well under
    /// the claim lease.
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

/// What the transport and its batch task share.
struct Shared {
    client: Client,
    config: RedisConfig,
    script: Script,
    /// The shared connection and a count of connections opened, so a failed
    /// call drops only the connection it used.
    connection: Mutex<(Option<MultiplexedConnection>, u64)>,
}

struct Inner {
    shared: Arc<Shared>,
    /// Where publishes wait for the batch task: `None` before the first
    /// publish. Unbounded, as the publishes waiting are never more than the
    /// deliveries in flight, each waiting for its answer. The task ends once every clone of the transport is gone
    /// (this sender with them), or with the runtime it was started on; the
    /// next publish then starts another.
    waiting: std::sync::Mutex<Option<mpsc::UnboundedSender<Waiting>>>,
}

/// A publish waiting for its batch.
struct Waiting {
    context: DeliveryContext,
    answer: oneshot::Sender<Result<Appended, BrokerError>>,
}

/// Appends outbox messages to Redis Streams, deduplicated by outbox id.
///
/// Cheap to clone; clones share the connection and the batches. See the
/// [module docs](self) for the entry layout, the dedup window, batching and
/// how failures are classified.
#[derive(Clone)]
pub struct RedisTransport {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RedisTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTransport")
            .field("config", &self.inner.shared.config)
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
        let shared = Arc::new(Shared {
            client,
            config,
            script: Script::new(BATCH_SCRIPT),
            connection: Mutex::new((None, 0)),
        });
        let (mut connection, _) = shared.connection().await?;
        // Loading the script now turns a server that refuses scripts
        // (NOPERM, no EVAL) into an error here rather than at first publish.
        let invocation = shared.script.prepare_invoke();
        let load = invocation.load_async(&mut connection);
        match tokio::time::timeout(shared.config.timeout, load).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(classify("load script", e)),
            Err(_) => return Err(timed_out("load script", shared.config.timeout)),
        }
        Ok(RedisTransport {
            inner: Arc::new(Inner {
                shared,
                waiting: std::sync::Mutex::new(None),
            }),
        })
    }

    /// The configuration this transport publishes with.
    pub fn config(&self) -> &RedisConfig {
        &self.inner.shared.config
    }

    /// Append one claimed message, unless its id was appended within the
    /// dedup window. It goes out in the next script call, with the other
    /// publishes waiting then.
    pub async fn send(&self, delivery: &Delivery) -> Result<Appended, BrokerError> {
        self.append(delivery.context.clone()).await
    }

    /// [`RedisTransport::send`] of a delivery the caller gives up, so the
    /// relay's path moves its context into the batch instead of copying it.
    async fn append(&self, context: DeliveryContext) -> Result<Appended, BrokerError> {
        let (answer, answered) = oneshot::channel();
        self.submit(Waiting { context, answer });
        answered.await.unwrap_or_else(|_| {
            // The batch task's runtime shut down with this publish in it.
            Err(BrokerError::new(
                BROKER,
                "publish",
                FailureClass::Transient,
                "the transport's batch task stopped before the publish was answered".to_owned(),
            ))
        })
    }

    /// Hand `waiting` to the batch task, starting one on the current runtime
    /// when there is none or its runtime ended.
    fn submit(&self, waiting: Waiting) {
        let mut sender = self
            .inner
            .waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let waiting = match sender.as_ref() {
            Some(running) => match running.send(waiting) {
                Ok(()) => return,
                Err(mpsc::error::SendError(waiting)) => waiting,
            },
            None => waiting,
        };
        let (started, receiver) = mpsc::unbounded_channel();
        tokio::spawn(batches(self.inner.shared.clone(), receiver));
        // The receiver was just made and lives in the task, so this cannot
        // fail; if the task were gone the publish would answer as stopped.
        let _ = started.send(waiting);
        *sender = Some(started);
    }
}

/// Gather waiting publishes into script calls, up to [`MAX_IN_FLIGHT`] at
/// once, until every sender is gone.
async fn batches(shared: Arc<Shared>, mut waiting: mpsc::UnboundedReceiver<Waiting>) {
    let mut in_flight = FuturesUnordered::new();
    loop {
        tokio::select! {
            // A finished call frees its slot before the next batch is cut,
            // so the batch takes in everything that waited meanwhile.
            biased;
            Some(()) = in_flight.next(), if !in_flight.is_empty() => {}
            next = waiting.recv(), if in_flight.len() < MAX_IN_FLIGHT => {
                let Some(first) = next else { break };
                let mut batch = Vec::with_capacity(MAX_BATCH);
                batch.push(first);
                while batch.len() < MAX_BATCH {
                    match waiting.try_recv() {
                        Ok(next) => batch.push(next),
                        Err(_) => break,
                    }
                }
                in_flight.push(shared.clone().publish(batch));
            }
        }
    }
    while in_flight.next().await.is_some() {}
}

impl Shared {
    /// One script call for `batch`, each publish answered with its own
    /// outcome, or all of them with the call's error.
    async fn publish(self: Arc<Self>, batch: Vec<Waiting>) {
        match self.call(&batch).await {
            Ok(answers) => {
                for (waiting, answer) in batch.into_iter().zip(answers) {
                    let _ = waiting.answer.send(answer);
                }
            }
            Err(error) => {
                for waiting in batch {
                    let copy = BrokerError::new(
                        error.broker,
                        error.operation,
                        error.class,
                        error.reason.clone(),
                    );
                    let _ = waiting.answer.send(Err(copy));
                }
            }
        }
    }

    async fn call(
        &self,
        batch: &[Waiting],
    ) -> Result<Vec<Result<Appended, BrokerError>>, BrokerError> {
        let call = self.batch_command(batch);
        let (mut connection, generation) = self.connection().await?;
        let timeout = self.config.timeout;
        let replies = match tokio::time::timeout(timeout, self.run(&call, &mut connection)).await {
            Ok(Ok(replies)) => replies,
            Ok(Err(e)) => {
                if connection_lost(&e) {
                    self.discard(generation).await;
                }
                return Err(classify("publish", e));
            }
            // A command that timed out may leave a half-open connection.
            Err(_) => {
                self.discard(generation).await;
                return Err(timed_out("publish", timeout));
            }
        };
        let answers: Vec<_> = replies.split('\n').map(answer).collect();
        if answers.len() != batch.len() {
            return Err(BrokerError::new(
                BROKER,
                "publish",
                FailureClass::Transient,
                format!(
                    "the publish script answered {} of {} messages; is another script loaded \
                     under its SHA?",
                    answers.len(),
                    batch.len()
                ),
            ));
        }
        Ok(answers)
    }

    /// The `EVALSHA` of [`BATCH_SCRIPT`] for `batch`, written straight into
    /// one command buffer: each message's keys and packed fields are
    /// written where they go, with no string or argument of their own on
    /// the way, which was most of the client's work per message beside the
    /// connection's.
    fn batch_command(&self, batch: &[Waiting]) -> Cmd {
        let config = &self.config;
        let mut call = redis::cmd("EVALSHA");
        call.arg(self.script.get_hash()).arg(2 * batch.len());
        for waiting in batch {
            let message = waiting.context.message();
            call.arg(Joined(&config.dedup_prefix, &message.id))
                .arg(Joined(
                    config.streams.prefix(),
                    config.streams.renamed(&message.name),
                ));
        }
        call.arg(config.window_ms())
            .arg(config.max_len.unwrap_or(0));
        for waiting in batch {
            call.arg(Packed(waiting.context.message()));
        }
        call
    }

    /// Run `call`, loading the script first if the server lost it (a
    /// restart, `SCRIPT FLUSH`) and trying once more.
    async fn run(
        &self,
        call: &Cmd,
        connection: &mut MultiplexedConnection,
    ) -> redis::RedisResult<String> {
        match call.query_async(connection).await {
            Err(e) if e.kind() == ErrorKind::NoScriptError => {
                self.script.load_async(connection).await?;
                call.query_async(connection).await
            }
            answered => answered,
        }
    }

    async fn connection(&self) -> Result<(MultiplexedConnection, u64), BrokerError> {
        let mut guard = self.connection.lock().await;
        if let (Some(connection), generation) = &*guard {
            return Ok((connection.clone(), *generation));
        }
        let timeout = self.config.timeout;
        let settings = AsyncConnectionConfig::new()
            .set_connection_timeout(timeout)
            .set_response_timeout(timeout);
        // Boxed, as connecting is rare: inline, its future made every
        // call's over two kilobytes.
        let connection = Box::pin(
            self.client
                .get_multiplexed_async_connection_with_config(&settings),
        )
        .await
        .map_err(|e| classify("connect", e))?;
        let generation = guard.1 + 1;
        *guard = (Some(connection.clone()), generation);
        Ok((connection, generation))
    }

    /// Drop the shared connection after it failed, unless a concurrent
    /// call already replaced it.
    async fn discard(&self, generation: u64) {
        let mut guard = self.connection.lock().await;
        if guard.0.is_some() && guard.1 == generation {
            guard.0 = None;
        }
    }
}

/// Two strings written as one argument: a dedup key or a stream's name.
struct Joined<'a>(&'a str, &'a str);

impl ToRedisArgs for Joined<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut arg = out.writer_for_next_arg();
        // Writing into the command's buffer cannot fail.
        let _ = arg.write_all(self.0.as_bytes());
        let _ = arg.write_all(self.1.as_bytes());
    }
}

/// A message's fields as one argument of the batch script: the payload,
/// then the headers, each name and value written as its length in bytes,
/// `:`, and the bytes.
struct Packed<'a>(&'a ClaimedMessage);

impl ToRedisArgs for Packed<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut arg = out.writer_for_next_arg();
        let mut pack = |value: &str| {
            let mut digits = [0; 20];
            let _ = arg.write_all(crate::decimal(value.len() as u64, &mut digits).as_bytes());
            let _ = arg.write_all(b":");
            let _ = arg.write_all(value.as_bytes());
        };
        pack("payload");
        pack(self.0.payload.as_str());
        each_header(self.0, |name, value| {
            pack(name);
            pack(value);
        });
    }
}

/// One message's answer from the batch script.
fn answer(reply: &str) -> Result<Appended, BrokerError> {
    if reply == DUPLICATE {
        return Ok(Appended::Duplicate);
    }
    match reply.strip_prefix('!') {
        // The error Redis gave, its code first ("WRONGTYPE Operation ...").
        Some(reason) => {
            let code = reason.split_whitespace().next().unwrap_or_default();
            let class = if permanent(code) {
                FailureClass::Permanent
            } else {
                FailureClass::Transient
            };
            Err(BrokerError::new(
                BROKER,
                "publish",
                class,
                reason.to_owned(),
            ))
        }
        None => Ok(Appended::Entry(reply.to_owned())),
    }
}

/// Refusals a retry cannot cure: the key holds another type, or the user
/// may not write it.
fn permanent(code: &str) -> bool {
    matches!(code, "WRONGTYPE" | "NOPERM" | "NOAUTH" | "WRONGPASS")
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
            (_, code) if permanent(code) => FailureClass::Permanent,
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
                .append(delivery.context)
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
