//! `outbox relay` against real brokers: NATS with JetStream at `NATS_URL`,
//! RabbitMQ at `AMQP_URL`, Redis at `REDIS_URL` and a Kafka-API broker at
//! `KAFKA_URL`
//! (`scripts/with-services cargo test -p outbox-cli --test relay`).

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};
use outbox::{MessageKind, NewMessage, OutboxStore, Payload, SqliteOutbox};

fn service_url(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!(
            "{var} is not set: run these tests through scripts/with-services \
             (scripts/with-services cargo test -p outbox-cli --test relay)"
        )
    })
}

fn nats_url() -> String {
    service_url("NATS_URL")
}

fn unique() -> String {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos(),
    );
    format!("{:012x}", hasher.finish() & 0xffff_ffff_ffff)
}

/// A SQLite outbox with `count` events, a stream for them, and the flags
/// that relay one to the other.
struct Fixture {
    dir: PathBuf,
    url: String,
    stream: String,
    prefix: String,
    js: jetstream::Context,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Fixture {
    async fn new(count: usize) -> Fixture {
        let id = unique();
        let dir = std::env::temp_dir().join(format!("outbox-relay-{id}"));
        std::fs::create_dir_all(&dir).unwrap();
        let url = format!("sqlite://{}", dir.join("outbox.db").display());
        let migrated = outbox(&["--database", &url, "migrate"]);
        assert!(migrated.status.success(), "{}", text(&migrated.stderr));
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .connect_with(SqliteOutbox::connect_options(&url).unwrap())
            .await
            .unwrap();
        let store = SqliteOutbox::builder(pool.clone()).build();
        for n in 0..count {
            let payload = Payload::from_json(format!(r#"{{"n":{n}}}"#)).unwrap();
            store
                .enqueue(NewMessage::new(
                    MessageKind::Event,
                    "orders.placed",
                    payload,
                ))
                .await
                .unwrap();
        }
        pool.close().await;
        let client = async_nats::connect(nats_url()).await.unwrap();
        let js = jetstream::new(client);
        let stream = format!("RELAY_{id}");
        let prefix = format!("relay{id}.");
        js.create_stream(stream::Config {
            name: stream.clone(),
            subjects: vec![format!("{prefix}>")],
            ..Default::default()
        })
        .await
        .unwrap();
        Fixture {
            dir,
            url,
            stream,
            prefix,
            js,
        }
    }

    /// `outbox relay` of this outbox to the NATS stream, with `extra` flags.
    fn relay(&self, extra: &[&str]) -> Command {
        let mut command = self.relay_to(&nats_url(), &["--stream", &self.stream]);
        command.args(extra);
        command
    }

    /// `outbox relay` of this outbox to the broker at `to`, under this
    /// fixture's prefix, with `extra` flags.
    fn relay_to(&self, to: &str, extra: &[&str]) -> Command {
        let mut command = outbox_command();
        command.args([
            "--database",
            &self.url,
            "relay",
            "--to",
            to,
            "--subject-prefix",
            &self.prefix,
        ]);
        command.args(extra);
        command
    }

    async fn stored(&self) -> u64 {
        let mut stream = self.js.get_stream(&self.stream).await.unwrap();
        stream.info().await.unwrap().state.messages
    }
}

fn outbox_command() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_outbox"));
    command
        .env_remove("OUTBOX_DATABASE_URL")
        .env_remove("OUTBOX_TABLE")
        .env_remove("OUTBOX_RELAY_TO")
        .stdin(Stdio::null());
    command
}

fn outbox(args: &[&str]) -> Output {
    outbox_command().args(args).output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test]
async fn relay_once_publishes_every_message_and_reports_the_pass() {
    let f = Fixture::new(50).await;
    let output = f.relay(&["--once"]).output().unwrap();
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("pass: claimed 50, delivered 50"),
        "{stderr}"
    );
    assert_eq!(f.stored().await, 50);
    let stream = f.js.get_stream(&f.stream).await.unwrap();
    let first = stream.get_raw_message(1).await.unwrap();
    assert_eq!(first.subject.as_str(), format!("{}orders.placed", f.prefix));
    assert!(first.headers.get("Nats-Msg-Id").is_some());
    // Everything was delivered: a second run finds nothing.
    let again = f.relay(&["--once"]).output().unwrap();
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert_eq!(f.stored().await, 50);
}

#[tokio::test]
async fn relay_runs_until_sigterm_then_prints_the_totals() {
    let f = Fixture::new(30).await;
    let child = f
        .relay(&["--every", "200ms"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id().to_string();
    let start = Instant::now();
    while f.stored().await < 30 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "not relayed within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let sent = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(sent.success(), "kill -TERM");
    let output = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("relaying to NATS JetStream from table outbox every 200ms"),
        "{stderr}"
    );
    assert!(stderr.contains("stopped after"), "{stderr}");
    assert!(stderr.contains("delivered 30"), "{stderr}");
}

#[tokio::test]
async fn a_missing_stream_or_exchange_or_an_unknown_broker_is_a_usage_error() {
    let f = Fixture::new(1).await;
    let output = outbox(&[
        "--database",
        &f.url,
        "relay",
        "--to",
        &nats_url(),
        "--stream",
        "NO_SUCH_STREAM",
        "--once",
    ]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("stream `NO_SUCH_STREAM` does not exist"),
        "{stderr}"
    );
    let amqp = service_url("AMQP_URL");
    let output = outbox(&[
        "--database",
        &f.url,
        "relay",
        "--to",
        &amqp,
        "--exchange",
        "no-such-exchange",
        "--once",
    ]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("no-such-exchange"), "{stderr}");
    let output = outbox(&[
        "--database",
        &f.url,
        "relay",
        "--to",
        "mqtt://x:1",
        "--once",
    ]);
    assert_eq!(output.status.code(), Some(2));
    assert!(text(&output.stderr).contains("unknown broker scheme `mqtt://`"));
    assert_eq!(f.stored().await, 0, "nothing was published");
}

#[tokio::test]
async fn relay_to_redis_appends_each_message_once() {
    let f = Fixture::new(50).await;
    let redis = service_url("REDIS_URL");
    let relay = |extra: &[&str]| {
        f.relay_to(&redis, &["--once"])
            .args(extra)
            .output()
            .unwrap()
    };
    let output = relay(&[]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("delivered 50"),
        "{}",
        text(&output.stderr)
    );
    // Nothing is left to relay, so a second run appends nothing.
    let output = relay(&[]);
    assert!(output.status.success(), "{}", text(&output.stderr));

    let client = redis::Client::open(redis.as_str()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let entries: u64 = redis::cmd("XLEN")
        .arg(format!("{}orders.placed", f.prefix))
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(entries, 50);
}

#[tokio::test]
async fn relay_to_kafka_produces_each_message_once() {
    use rdkafka::ClientConfig;
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::consumer::{BaseConsumer, Consumer};

    let f = Fixture::new(50).await;
    let kafka = service_url("KAFKA_URL");
    let bootstrap = kafka.strip_prefix("kafka://").unwrap().to_owned();
    let topic = format!("{}orders.placed", f.prefix);
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .unwrap();
    for created in admin
        .create_topics(
            &[NewTopic::new(&topic, 2, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await
        .unwrap()
    {
        created.unwrap();
    }
    let relay = || f.relay_to(&kafka, &["--once"]).output().unwrap();
    let output = relay();
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("delivered 50"),
        "{}",
        text(&output.stderr)
    );
    // Nothing is left to relay, so a second run produces nothing.
    let output = relay();
    assert!(output.status.success(), "{}", text(&output.stderr));

    let records = tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("group.id", format!("relay-test-{}", unique()))
            .create()
            .unwrap();
        (0..2)
            .map(|partition| {
                let (low, high) = consumer
                    .fetch_watermarks(&topic, partition, Duration::from_secs(10))
                    .unwrap();
                high - low
            })
            .sum::<i64>()
    })
    .await
    .unwrap();
    assert_eq!(records, 50);
}

/// A loopback port nothing listens on (a moment ago).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `redis-server` of one test's own, stopped when dropped.
struct OwnRedis(std::process::Child);

impl Drop for OwnRedis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The stderr lines of a running command, as they come.
fn lines_of(stderr: std::process::ChildStderr) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Every line up to and including the first that contains `wanted`.
fn until_line(lines: &std::sync::mpsc::Receiver<String>, wanted: &str) -> Vec<String> {
    let mut seen = Vec::new();
    loop {
        match lines.recv_timeout(Duration::from_secs(60)) {
            Ok(line) => {
                let found = line.contains(wanted);
                seen.push(line);
                if found {
                    return seen;
                }
            }
            Err(error) => panic!("no line with {wanted:?} ({error}); seen: {seen:#?}"),
        }
    }
}

/// Stop a running relay with SIGTERM: it exits successfully, and one of
/// the lines it printed last says `wanted`.
fn stopped_saying(
    mut child: std::process::Child,
    lines: &std::sync::mpsc::Receiver<String>,
    wanted: &str,
) {
    let sent = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success(), "kill -TERM");
    assert!(child.wait().unwrap().success());
    let rest: Vec<String> = lines.iter().collect();
    assert!(rest.iter().any(|line| line.contains(wanted)), "{rest:#?}");
}

#[tokio::test]
async fn relay_waits_for_a_broker_that_is_not_up_yet() {
    let f = Fixture::new(40).await;
    let port = free_port();
    let to = format!("redis://127.0.0.1:{port}");
    let relay = |extra: &[&str]| f.relay_to(&to, extra);

    // `--once` gives up at the first failure, for its caller to run it again.
    let output = relay(&["--once"]).output().unwrap();
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("is the broker running"), "{stderr}");
    assert!(!stderr.contains("trying again"), "{stderr}");

    // Stopped while it waits: nothing was claimed, and that is no failure.
    let mut child = relay(&[]).stderr(Stdio::piped()).spawn().unwrap();
    let lines = lines_of(child.stderr.take().unwrap());
    until_line(&lines, "trying again in 1s");
    stopped_saying(child, &lines, "nothing was claimed");

    // Left running, it relays once the broker comes up.
    let mut child = relay(&["--every", "200ms"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = lines_of(child.stderr.take().unwrap());
    let waited = until_line(&lines, "trying again in 2s");
    assert!(
        waited[0].contains("redis connect failed (Transient)"),
        "{waited:#?}"
    );
    let dir = f.dir.join("redis");
    std::fs::create_dir_all(&dir).unwrap();
    let _redis = OwnRedis(
        Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    until_line(&lines, "relaying to Redis Streams from");
    let client = redis::Client::open(to.as_str()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let stream = format!("{}orders.placed", f.prefix);
    let start = Instant::now();
    loop {
        let entries: u64 = redis::cmd("XLEN")
            .arg(&stream)
            .query_async(&mut connection)
            .await
            .unwrap();
        if entries == 40 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{entries} of 40 relayed within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stopped_saying(child, &lines, "delivered 40");
}
