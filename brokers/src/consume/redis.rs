//! Redis Streams: a member of a consumer group.

use std::collections::VecDeque;
use std::time::Duration;

use outbox::InboxStore;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, Value};
use tokio::time::Instant;

use super::consumer_settings;
use super::handler::InboxHandler;
use super::received::Received;
use super::runner::{Refusal, Runner, Settings, Source};
use crate::redis::{classify, connection_lost};
use crate::{BrokerError, FailureClass};

const BROKER: &str = "redis";

/// Consumes a Redis stream as a member of a consumer group, through an
/// inbox: each entry is recorded and applied in one transaction, then
/// acknowledged.
///
/// - Acknowledged (`XACK`) after the commit, also for a copy the inbox
///   already holds.
/// - A failed entry stays pending: after the retry delay the member reads
///   its own pending entries again (`XREADGROUP ... 0`) and applies them.
///   A member that dies leaves its pending entries to the group: another
///   member claims those idle longer than
///   [`claim_idle`](Self::claim_idle) (`XAUTOCLAIM`), and a member that
///   restarts under the same [`member`](Self::member) name reads its own at
///   once.
/// - An entry without an id (no `Outbox-Message-Id` field) is copied to the
///   dead-letter stream when one is set ([`dead_letter`](Self::dead_letter),
///   with a `refused` field saying why), and acknowledged either way.
/// - Order: a group hands out entries in stream order, but a failed entry
///   comes back after later ones, and so do entries claimed from a dead
///   member.
///
/// The group is created (from the start of the stream, creating the stream
/// if needed) when it does not exist.
///
/// ```no_run
/// # #[cfg(feature = "sqlite")]
/// # async fn run(inbox: outbox::SqliteInbox) -> Result<(), outbox_brokers::BrokerError> {
/// use outbox::sqlx::{self, Sqlite, Transaction};
/// use outbox_brokers::consume::{RedisInboxConsumer, Received, handler_fn};
///
/// let handler = handler_fn(|tx: &mut Transaction<'static, Sqlite>, message: &Received| {
///     Box::pin(async move {
///         sqlx::query("INSERT INTO invoices (order_message) VALUES (?1)")
///             .bind(&message.id)
///             .execute(&mut **tx)
///             .await?;
///         Ok(())
///     })
/// });
/// let consumer = RedisInboxConsumer::connect(
///     "redis://127.0.0.1:6379/0",
///     "events:order.placed",
///     "billing",
///     inbox,
///     "billing",
///     handler,
/// )
/// .await?
/// .member("billing-1")
/// .dead_letter("events:order.placed:refused");
/// consumer.run(async { tokio::signal::ctrl_c().await.unwrap() }).await;
/// # Ok(())
/// # }
/// ```
pub struct RedisInboxConsumer<I, H> {
    runner: Runner<RedisSource, I, H>,
}

impl<I, H> std::fmt::Debug for RedisInboxConsumer<I, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let source = &self.runner.source;
        f.debug_struct("RedisInboxConsumer")
            .field("consumer", &self.runner.settings.consumer)
            .field("stream", &source.stream)
            .field("group", &source.group)
            .field("member", &source.member)
            .finish_non_exhaustive()
    }
}

impl<I, H> RedisInboxConsumer<I, H>
where
    I: InboxStore,
    H: InboxHandler<I::Database>,
{
    /// Connect to `url`, creating the consumer group `group` on `stream` if
    /// it does not exist, to consume it as `name` in `inbox`, applying each
    /// new entry with `handler`. The member's name in the group is `name`
    /// and the process id unless [`member`](Self::member) sets one.
    ///
    /// A malformed URL, refused credentials, a key of another type or a
    /// name the inbox would refuse are permanent errors; an unreachable
    /// server is transient.
    pub async fn connect(
        url: &str,
        stream: impl Into<String>,
        group: impl Into<String>,
        inbox: I,
        name: impl Into<String>,
        handler: H,
    ) -> Result<Self, BrokerError> {
        let settings = Settings::new(BROKER, name)?;
        let client = Client::open(url).map_err(|e| {
            BrokerError::new(
                BROKER,
                "connect",
                FailureClass::Permanent,
                format!("invalid Redis URL: {e}"),
            )
            .with_source(e)
        })?;
        let mut source = RedisSource {
            client,
            connection: None,
            stream: stream.into(),
            group: group.into(),
            member: format!("{}-{}", settings.consumer, std::process::id()),
            count: 100,
            block: Duration::from_secs(1),
            claim_idle: Duration::from_secs(30),
            dead_letter: None,
            buffer: VecDeque::new(),
            own_pending: Some(OwnPending::from_start(Instant::now())),
            reading: false,
            next_claim: Instant::now(),
            claim_cursor: START.to_owned(),
        };
        source.create_group().await?;
        Ok(RedisInboxConsumer {
            runner: Runner {
                source,
                inbox,
                handler,
                settings,
            },
        })
    }

    /// The member's name in the group. A member that restarts under the
    /// same name reads the entries it left pending at once, rather than
    /// waiting for another member to claim them.
    pub fn member(mut self, member: impl Into<String>) -> Self {
        self.runner.source.member = member.into();
        self
    }

    /// Copy entries without an id to this stream before acknowledging
    /// them; by default they are only acknowledged (and logged).
    pub fn dead_letter(mut self, stream: impl Into<String>) -> Self {
        self.runner.source.dead_letter = Some(stream.into());
        self
    }

    /// How long another member's entry must have been pending before this
    /// one claims it (default 30 s): longer than an entry takes to apply,
    /// or live members' entries are applied twice over (the inbox then
    /// skips the second copy).
    pub fn claim_idle(mut self, idle: Duration) -> Self {
        self.runner.source.claim_idle = idle.max(Duration::from_millis(1));
        self
    }

    /// Most entries read at once (default 100).
    pub fn count(mut self, count: usize) -> Self {
        self.runner.source.count = count.max(1);
        self
    }

    /// How long one read waits for new entries (default 1 s).
    pub fn block(mut self, block: Duration) -> Self {
        self.runner.source.block = block.max(Duration::from_millis(1));
        self
    }
}

consumer_settings!(RedisInboxConsumer);

/// The lowest stream id: "from the start".
const START: &str = "0-0";

/// One stream entry: its id, and its fields, `None` when the entry is
/// gone from the stream (trimmed or deleted while pending).
pub(crate) struct Entry {
    id: String,
    fields: Option<Vec<(String, Vec<u8>)>>,
}

/// A pass over this member's own pending entries, due at `at`, resumed
/// after `after`.
#[derive(Debug, Clone)]
struct OwnPending {
    at: Instant,
    after: String,
}

impl OwnPending {
    fn from_start(at: Instant) -> Self {
        OwnPending {
            at,
            after: START.to_owned(),
        }
    }
}

/// The group member and what it has read but not yet handed over.
pub(crate) struct RedisSource {
    client: Client,
    /// Opened when needed; dropped when it fails.
    connection: Option<MultiplexedConnection>,
    stream: String,
    group: String,
    member: String,
    count: usize,
    block: Duration,
    claim_idle: Duration,
    dead_letter: Option<String>,
    /// Entries read and not yet handed over, in order.
    buffer: VecDeque<Entry>,
    /// The next pass over this member's pending entries: at start, after
    /// a failure's retry delay, and after a read that was cut short (its
    /// entries are pending and nobody has them).
    own_pending: Option<OwnPending>,
    /// Set while a read is in flight: found set, the read was dropped.
    reading: bool,
    /// When to claim other members' idle entries next.
    next_claim: Instant,
    /// Where the claim sweep goes on (`XAUTOCLAIM` pages).
    claim_cursor: String,
}

impl RedisSource {
    async fn connection(&mut self) -> Result<MultiplexedConnection, BrokerError> {
        if let Some(connection) = &self.connection {
            return Ok(connection.clone());
        }
        let settings = AsyncConnectionConfig::new()
            .set_connection_timeout(Duration::from_secs(5))
            .set_response_timeout(self.block + Duration::from_secs(10));
        let connection = self
            .client
            .get_multiplexed_async_connection_with_config(&settings)
            .await
            .map_err(|e| classify("connect", e))?;
        self.connection = Some(connection.clone());
        Ok(connection)
    }

    /// Run `command`, dropping the connection when it failed for the
    /// connection's sake.
    async fn query(
        &mut self,
        operation: &'static str,
        command: &redis::Cmd,
    ) -> Result<Value, BrokerError> {
        let mut connection = self.connection().await?;
        match command.query_async(&mut connection).await {
            Ok(value) => Ok(value),
            Err(error) => {
                if connection_lost(&error) {
                    self.connection = None;
                }
                Err(classify(operation, error))
            }
        }
    }

    async fn create_group(&mut self) -> Result<(), BrokerError> {
        let mut command = redis::cmd("XGROUP");
        command
            .arg("CREATE")
            .arg(&self.stream)
            .arg(&self.group)
            .arg("0")
            .arg("MKSTREAM");
        match self.query("create group", &command).await {
            Ok(_) => Ok(()),
            Err(error) if error.reason.contains("BUSYGROUP") => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// `XREADGROUP` from `id` (`>` for new entries, else this member's
    /// pending entries after `id`), blocking for `block` when given.
    async fn read_group(
        &mut self,
        id: &str,
        block: Option<Duration>,
    ) -> Result<Vec<Entry>, BrokerError> {
        let mut command = redis::cmd("XREADGROUP");
        command
            .arg("GROUP")
            .arg(&self.group)
            .arg(&self.member)
            .arg("COUNT")
            .arg(self.count);
        if let Some(block) = block {
            command.arg("BLOCK").arg(block.as_millis().max(1) as u64);
        }
        command.arg("STREAMS").arg(&self.stream).arg(id);
        self.reading = true;
        let reply = self.query("receive", &command).await;
        self.reading = false;
        // Entries of a read whose answer was lost are pending for this
        // member: read them again.
        let reply = reply.inspect_err(|_| self.reread(Instant::now()))?;
        Ok(match reply {
            Value::Array(streams) => streams
                .into_iter()
                .flat_map(|stream| match stream {
                    Value::Array(mut pair) if pair.len() == 2 => entries(pair.remove(1)),
                    _ => Vec::new(),
                })
                .collect(),
            Value::Map(streams) => streams
                .into_iter()
                .flat_map(|(_, value)| entries(value))
                .collect(),
            _ => Vec::new(),
        })
    }

    /// One page of `XAUTOCLAIM`: entries of any member pending longer
    /// than `claim_idle`, now this member's.
    async fn claim(&mut self) -> Result<Vec<Entry>, BrokerError> {
        let mut command = redis::cmd("XAUTOCLAIM");
        command
            .arg(&self.stream)
            .arg(&self.group)
            .arg(&self.member)
            .arg(self.claim_idle.as_millis() as u64)
            .arg(&self.claim_cursor)
            .arg("COUNT")
            .arg(self.count);
        self.reading = true;
        let reply = self.query("claim", &command).await;
        self.reading = false;
        let reply = reply.inspect_err(|_| self.reread(Instant::now()))?;
        let Value::Array(mut parts) = reply else {
            return Ok(Vec::new());
        };
        if parts.len() < 2 {
            return Ok(Vec::new());
        }
        let claimed = entries(parts.remove(1));
        self.claim_cursor = text(&parts[0]).unwrap_or_else(|| START.to_owned());
        if self.claim_cursor == START {
            // A whole sweep done: the next one after half the idle time, so
            // an entry waits at most about one and a half times it.
            self.next_claim = Instant::now() + self.claim_idle / 2;
        }
        Ok(claimed)
    }

    /// Read this member's pending entries again from the start, at `at`.
    /// A pass already planned starts over from the start, and not before
    /// either time: a failed entry must wait out its delay even when a
    /// pass is under way.
    fn reread(&mut self, at: Instant) {
        let at = self
            .own_pending
            .as_ref()
            .map_or(at, |pending| pending.at.max(at));
        self.own_pending = Some(OwnPending::from_start(at));
    }

    async fn command_on(
        &mut self,
        operation: &'static str,
        command: redis::Cmd,
    ) -> Result<(), BrokerError> {
        self.query(operation, &command).await.map(drop)
    }

    fn xack(&self, id: &str) -> redis::Cmd {
        let mut command = redis::cmd("XACK");
        command.arg(&self.stream).arg(&self.group).arg(id);
        command
    }
}

impl Source for RedisSource {
    type Delivery = Entry;
    const SYSTEM: &'static str = "redis";

    async fn next(&mut self) -> Result<Entry, BrokerError> {
        loop {
            if let Some(entry) = self.buffer.pop_front() {
                return Ok(entry);
            }
            let now = Instant::now();
            if std::mem::take(&mut self.reading) {
                self.reread(now);
            }
            if let Some(pending) = self.own_pending.clone()
                && pending.at <= now
            {
                let entries = self.read_group(&pending.after, None).await?;
                match entries.last() {
                    Some(last) => {
                        if let Some(own) = &mut self.own_pending {
                            own.after = last.id.clone();
                        }
                    }
                    None => self.own_pending = None,
                }
                self.buffer.extend(entries);
                continue;
            }
            if self.next_claim <= now {
                let claimed = self.claim().await?;
                self.buffer.extend(claimed);
                continue;
            }
            let entries = self.read_group(">", Some(self.block)).await?;
            self.buffer.extend(entries);
        }
    }

    fn read(&self, entry: &Entry) -> Result<Received, Refusal> {
        let refuse = |reason| Refusal {
            source: self.stream.clone(),
            reason,
        };
        let Some(fields) = &entry.fields else {
            return Err(refuse(
                "the entry left the stream (trimmed or deleted) before it was applied",
            ));
        };
        let mut payload = Vec::new();
        let mut headers = Vec::new();
        for (name, value) in fields {
            if name == "payload" {
                payload = value.clone();
            } else {
                headers.push((name.clone(), String::from_utf8_lossy(value).into_owned()));
            }
        }
        Received::from_headers(headers, payload, self.stream.clone(), None).map_err(refuse)
    }

    async fn ack(&mut self, entry: Entry) -> Result<(), BrokerError> {
        let command = self.xack(&entry.id);
        self.command_on("ack", command).await
    }

    async fn retry(&mut self, _entry: Entry, delay: Duration) -> Result<(), BrokerError> {
        // Left pending: the next pass over this member's own entries, after
        // the delay, hands it over again.
        self.reread(Instant::now() + delay);
        Ok(())
    }

    async fn refuse(&mut self, entry: Entry, reason: &'static str) -> Result<(), BrokerError> {
        if let Some(dead_letter) = self.dead_letter.clone() {
            let mut command = redis::cmd("XADD");
            command.arg(&dead_letter).arg("*");
            for (name, value) in entry.fields.iter().flatten() {
                command.arg(name).arg(value.as_slice());
            }
            command
                .arg("refused")
                .arg(reason)
                .arg("entry")
                .arg(&entry.id);
            self.command_on("dead-letter", command).await?;
        }
        let command = self.xack(&entry.id);
        self.command_on("ack", command).await
    }
}

/// The entries of one stream in a reply: `[[id, [field, value, ...]], ...]`,
/// an entry gone from the stream having no fields.
fn entries(value: Value) -> Vec<Entry> {
    let Value::Array(items) = value else {
        return Vec::new();
    };
    items
        .into_iter()
        .filter_map(|item| {
            let Value::Array(mut pair) = item else {
                return None;
            };
            if pair.len() != 2 {
                return None;
            }
            let fields = pair.pop()?;
            let id = text(&pair[0])?;
            let fields = match fields {
                Value::Array(flat) => Some(
                    flat.chunks(2)
                        .filter_map(|kv| Some((text(kv.first()?)?, bytes(kv.get(1)?)?)))
                        .collect(),
                ),
                Value::Map(map) => Some(
                    map.iter()
                        .filter_map(|(k, v)| Some((text(k)?, bytes(v)?)))
                        .collect(),
                ),
                _ => None,
            };
            Some(Entry { id, fields })
        })
        .collect()
}

fn bytes(value: &Value) -> Option<Vec<u8>> {
    match value {
        Value::BulkString(bytes) => Some(bytes.clone()),
        Value::SimpleString(text) => Some(text.clone().into_bytes()),
        Value::Int(n) => Some(n.to_string().into_bytes()),
        _ => None,
    }
}

fn text(value: &Value) -> Option<String> {
    bytes(value).map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
}
