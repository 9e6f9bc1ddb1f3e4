//! Redis Streams: a key prefix per destination, each message appended by
//! the transport's own dedup-and-`XADD` script.

use outbox_brokers::NameMap;
use outbox_brokers::redis::{PUBLISH_SCRIPT, RedisConfig, RedisTransport};
use redis::Script;
use redis::aio::MultiplexedConnection;

use super::*;

/// How long the benchmark's dedup keys live if a run dies before its
/// clean-up.
const DEDUP_WINDOW: Duration = Duration::from_secs(600);

pub(super) struct Redis {
    url: String,
    connection: MultiplexedConnection,
    /// The key prefix of each destination made so far.
    prefixes: Vec<String>,
}

impl Redis {
    pub(super) async fn connect() -> Redis {
        let url = service_url("REDIS_URL", "redis");
        let connection = redis::Client::open(url.as_str())
            .expect("REDIS_URL is a Redis URL")
            .get_multiplexed_async_connection()
            .await
            .expect("connect to REDIS_URL");
        Redis {
            url,
            connection,
            prefixes: Vec::new(),
        }
    }

    /// A key prefix of its own: the stream is `<prefix>orders.placed`,
    /// the dedup keys `<prefix>dedup:<id>`.
    fn fresh(&mut self) -> String {
        let prefix = format!(
            "relay_bench:{}:{}:",
            std::process::id(),
            self.prefixes.len()
        );
        self.prefixes.push(prefix.clone());
        prefix
    }
}

/// The raw loop.
async fn publish(
    connection: MultiplexedConnection,
    prefix: String,
    payloads: Vec<String>,
    window: usize,
) {
    let script = Script::new(PUBLISH_SCRIPT);
    let stream = format!("{prefix}orders.placed");
    let window_ms = DEDUP_WINDOW.as_millis() as u64;
    let mut replies = FuturesUnordered::new();
    for (n, payload) in payloads.iter().enumerate() {
        // The arguments the transport sends, built per message as it does.
        let id = format!("raw-{n}");
        let mut invocation = script.prepare_invoke();
        invocation
            .key(format!("{prefix}dedup:{id}"))
            .key(&stream)
            .arg(window_ms)
            .arg(0)
            .arg("payload")
            .arg(payload.as_str())
            .arg("Outbox-Message-Id")
            .arg(&id)
            .arg("Outbox-Name")
            .arg("orders.placed")
            .arg("Outbox-Kind")
            .arg("event")
            .arg("Outbox-Attempt")
            .arg(1);
        let mut connection = connection.clone();
        replies.push(async move { invocation.invoke_async::<String>(&mut connection).await });
        if replies.len() >= window {
            replies.next().await.expect("a reply").expect("appended");
        }
    }
    while let Some(reply) = replies.next().await {
        reply.expect("appended");
    }
}

impl Broker for Redis {
    const NAME: &'static str = "redis";
    type Transport = RedisTransport;

    async fn transport(&mut self) -> RedisTransport {
        let prefix = self.fresh();
        let config = RedisConfig::new()
            .streams(NameMap::new(prefix.clone()))
            .dedup_prefix(format!("{prefix}dedup:"))
            .dedup_window(DEDUP_WINDOW);
        RedisTransport::connect(&self.url, config)
            .await
            .expect("the bench server")
    }

    async fn raw(&mut self, messages: u64, window: usize) -> Spent {
        let prefix = self.fresh();
        let url = self.url.clone();
        let connect = move || async move {
            let mut connection = redis::Client::open(url.as_str())
                .expect("REDIS_URL is a Redis URL")
                .get_multiplexed_async_connection()
                .await
                .expect("connect to REDIS_URL");
            // Loaded before the clock starts, as the transport loads it
            // when it connects.
            let _: String = Script::new(PUBLISH_SCRIPT)
                .prepare_invoke()
                .load_async(&mut connection)
                .await
                .expect("load the script");
            connection
        };
        let payloads = (0..messages).map(payload_json).collect();
        raw_on_own_runtime(connect, move |connection| {
            publish(connection, prefix, payloads, window)
        })
    }

    async fn stored(&mut self) -> u64 {
        let prefix = self.prefixes.last().expect("a stream");
        redis::cmd("XLEN")
            .arg(format!("{prefix}orders.placed"))
            .query_async(&mut self.connection)
            .await
            .expect("XLEN")
    }

    async fn clean_up(&mut self) {
        for prefix in self.prefixes.drain(..) {
            let mut cursor = 0u64;
            loop {
                let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(format!("{prefix}*"))
                    .arg("COUNT")
                    .arg(10_000)
                    .query_async(&mut self.connection)
                    .await
                    .expect("SCAN");
                if !keys.is_empty() {
                    let _: Result<u64, _> = redis::cmd("UNLINK")
                        .arg(&keys)
                        .query_async(&mut self.connection)
                        .await;
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
    }
}
