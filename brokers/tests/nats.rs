//! The NATS JetStream transport against a real `nats-server -js`.
//!
//! Needs `NATS_URL` (and, for the restart test, `WITH_SERVICES_CTL`), as
//! `scripts/with-services` exports them:
//!
//!   scripts/with-services cargo test -p outbox-brokers --features nats --test nats
//!
//! A real broker answers in real time, so every wait here is a bounded poll.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};
use futures_util::StreamExt;
use futures_util::future::LocalBoxFuture;
use outbox::{
    Delivery, DeliveryError, DeliveryResult, DrainConfig, EventBus, MemoryOutbox, MessageKind,
    MessageStatus, NewMessage, OutboxAdmin, OutboxStore, Payload, Registry, RetryPolicy,
    TraceCarrier,
};
use outbox_actors::DrainCoordinator;
use outbox_brokers::{BrokerError, FailureClass, NameMap, NatsConfig, NatsTransport};

static STREAMS: AtomicUsize = AtomicUsize::new(0);

/// One test at a time: the restart test stops the server every other test
/// talks to. An async lock, since each test holds it across its awaits.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn nats_url() -> String {
    std::env::var("NATS_URL").unwrap_or_else(|_| {
        panic!(
            "NATS_URL is not set: run these tests through scripts/with-services \
             (scripts/with-services cargo test -p outbox-brokers --features nats --test nats), \
             or point NATS_URL at a nats-server started with -js"
        )
    })
}

/// A stream of its own for one test: `(stream name, subject prefix)`.
async fn fresh_stream(
    configure: impl FnOnce(&mut stream::Config),
) -> (jetstream::Context, String, String) {
    let client = async_nats::connect(nats_url())
        .await
        .expect("connect to NATS_URL");
    let js = jetstream::new(client);
    let n = STREAMS.fetch_add(1, Ordering::Relaxed);
    let name = format!("OUTBOX_T{}_{n}", std::process::id());
    let prefix = format!("t{}n{n}.", std::process::id());
    let mut config = stream::Config {
        name: name.clone(),
        subjects: vec![format!("{prefix}>")],
        ..Default::default()
    };
    configure(&mut config);
    js.create_stream(config)
        .await
        .expect("create the test stream");
    (js, name, prefix)
}

fn event(name: &str, n: usize) -> NewMessage {
    NewMessage::new(
        MessageKind::Event,
        name,
        Payload::from_json(format!(r#"{{"n":{n}}}"#)).unwrap(),
    )
}

fn drain_config() -> DrainConfig {
    DrainConfig {
        batch_size: 100,
        concurrency: 64,
        retry: RetryPolicy::exponential(Duration::from_millis(100), 2.0, Duration::from_secs(1)),
        every: Some(Duration::from_millis(100)),
        ..DrainConfig::default()
    }
}

fn coordinator(store: &MemoryOutbox, bus: impl EventBus) -> actix::Addr<DrainCoordinator> {
    DrainCoordinator::builder(store.clone())
        .registry(Registry::builder().any(MessageKind::Event).build().unwrap())
        .event_bus(bus)
        .config(drain_config())
        .start()
        .unwrap()
}

/// Polls `done` every 50 ms for at most `limit`.
async fn wait_until<F: std::future::Future<Output = bool>>(
    limit: Duration,
    what: &str,
    mut done: impl FnMut() -> F,
) {
    let start = Instant::now();
    while !done().await {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn settled(store: &MemoryOutbox) -> (u64, u64) {
    let stats = store.stats(chrono::Utc::now()).await.unwrap();
    (stats.delivered, stats.dead_lettered)
}

/// Every message the stream holds, by sequence: its outbox id header and
/// its `traceparent`, if any.
async fn stored(js: &jetstream::Context, stream: &str) -> Vec<(String, Option<String>)> {
    let mut handle = js.get_stream(stream).await.unwrap();
    let count = handle.info().await.unwrap().state.messages;
    let mut out = Vec::new();
    for sequence in 1..=count {
        let message = handle.get_raw_message(sequence).await.unwrap();
        let header = |name| message.headers.get(name).map(|v| v.as_str().to_owned());
        out.push((
            header("Outbox-Message-Id").expect("an id header"),
            header("traceparent"),
        ));
    }
    out
}

/// Counts what a plain (non-JetStream) subscriber sees on the prefix:
/// every publish, duplicates included, since dedup happens in the stream.
fn count_publishes(
    client: async_nats::Client,
    prefix: &str,
) -> impl std::future::Future<Output = Arc<Mutex<BTreeMap<String, usize>>>> {
    let subject = format!("{prefix}>");
    async move {
        let seen = Arc::new(Mutex::new(BTreeMap::new()));
        let mut subscription = client.subscribe(subject).await.unwrap();
        client.flush().await.unwrap();
        let into = Arc::clone(&seen);
        tokio::spawn(async move {
            while let Some(message) = subscription.next().await {
                if let Some(id) = message
                    .headers
                    .as_ref()
                    .and_then(|h| h.get("Outbox-Message-Id"))
                {
                    *into
                        .lock()
                        .unwrap()
                        .entry(id.as_str().to_owned())
                        .or_insert(0) += 1;
                }
            }
        });
        seen
    }
}

/// Publishes through the transport, then fails the first attempt as if its
/// `PubAck` had been lost: the retry publishes the same id again.
struct LoseFirstAck(NatsTransport);

impl EventBus for LoseFirstAck {
    fn publish(&self, delivery: Delivery) -> LocalBoxFuture<'static, DeliveryResult> {
        let transport = self.0.clone();
        Box::pin(async move {
            let message = delivery.context.message();
            transport
                .publish_message(message)
                .await
                .map_err(BrokerError::into_delivery_error)?;
            if message.attempts == 1 {
                return Err(DeliveryError::msg("PubAck lost on the way back"));
            }
            Ok(())
        })
    }
}

#[actix_rt::test]
async fn a_redelivered_message_is_stored_once() {
    let _serial = SERIAL.lock().await;
    const N: usize = 20;
    let (js, stream, prefix) = fresh_stream(|_| {}).await;
    let transport =
        NatsTransport::connect(&nats_url(), NatsConfig::new(&stream, NameMap::new(&prefix)))
            .await
            .unwrap();
    let seen = count_publishes(transport.client().clone(), &prefix).await;
    let store = MemoryOutbox::new();
    for n in 0..N {
        store.enqueue(event("orders.placed", n)).await.unwrap();
    }
    let _coordinator = coordinator(&store, LoseFirstAck(transport));
    wait_until(Duration::from_secs(30), "all delivered", || async {
        settled(&store).await.0 == N as u64
    })
    .await;
    let stored = stored(&js, &stream).await;
    let ids: BTreeSet<_> = stored.iter().map(|(id, _)| id.clone()).collect();
    assert_eq!(
        (stored.len(), ids.len()),
        (N, N),
        "the stream holds each id once"
    );
    wait_until(
        Duration::from_secs(10),
        "the subscriber saw both publishes",
        || async { seen.lock().unwrap().values().sum::<usize>() == 2 * N },
    )
    .await;
    assert!(seen.lock().unwrap().values().all(|&count| count == 2));
}

#[actix_rt::test]
async fn a_broker_restart_mid_drain_loses_nothing() {
    let _serial = SERIAL.lock().await;
    const N: usize = 2_000;
    let ctl = std::env::var("WITH_SERVICES_CTL").unwrap_or_else(|_| {
        panic!("WITH_SERVICES_CTL is not set: run this test through scripts/with-services, which can stop and start nats-server")
    });
    let (js, stream, prefix) = fresh_stream(|_| {}).await;
    let config =
        NatsConfig::new(&stream, NameMap::new(&prefix)).ack_timeout(Duration::from_secs(1));
    let transport = NatsTransport::connect(&nats_url(), config).await.unwrap();
    let seen = count_publishes(transport.client().clone(), &prefix).await;
    let store = MemoryOutbox::new();
    for n in 0..N {
        store
            .enqueue(event("orders.placed", n).with_max_attempts(1_000))
            .await
            .unwrap();
    }
    let _coordinator = coordinator(&store, transport);
    wait_until(Duration::from_secs(60), "a quarter delivered", || async {
        settled(&store).await.0 >= (N / 4) as u64
    })
    .await;
    let run = |action: &'static str| {
        let ctl = ctl.clone();
        tokio::task::spawn_blocking(move || {
            let status = std::process::Command::new(&ctl)
                .args([action, "nats"])
                .status()
                .unwrap();
            assert!(status.success(), "{ctl} {action} nats: {status}");
        })
    };
    run("stop").await.unwrap();
    let at_stop = settled(&store).await.0;
    tokio::time::sleep(Duration::from_secs(2)).await;
    run("start").await.unwrap();
    wait_until(
        Duration::from_secs(120),
        "the drain resumed and delivered everything",
        || async { settled(&store).await.0 == N as u64 },
    )
    .await;
    let stored = stored(&js, &stream).await;
    let ids: BTreeSet<_> = stored.iter().map(|(id, _)| id.clone()).collect();
    // The subscriber reconnects too; give it a moment to catch the last publishes.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let seen = seen.lock().unwrap().clone();
    let published: usize = seen.values().sum();
    println!(
        "nats restart mid-drain: N={N} delivered={} (at the stop: {at_stop}) lost={} \
         publishes seen by a subscriber={published} (distinct ids {}, duplicates before dedup {}) \
         stream messages={} (duplicates after dedup {})",
        settled(&store).await.0,
        N - ids.len(),
        seen.len(),
        published.saturating_sub(seen.len()),
        stored.len(),
        stored.len() - ids.len(),
    );
    assert_eq!(ids.len(), N, "every message reached the stream");
    assert_eq!(stored.len(), N, "the stream holds each id once");
    assert!(
        at_stop < N as u64,
        "the broker stopped before the drain finished"
    );
}

#[actix_rt::test]
async fn no_stream_for_the_subject_dead_letters_at_once_with_the_reason() {
    let _serial = SERIAL.lock().await;
    let (js, stream, prefix) = fresh_stream(|_| {}).await;
    let transport =
        NatsTransport::connect(&nats_url(), NatsConfig::new(&stream, NameMap::new(&prefix)))
            .await
            .unwrap();
    // The stream is narrowed after the transport started: nothing takes
    // the message's subject any more.
    let mut narrowed = js
        .get_stream(&stream)
        .await
        .unwrap()
        .cached_info()
        .config
        .clone();
    narrowed.subjects = vec![format!("{prefix}audit.>")];
    js.update_stream(narrowed).await.unwrap();
    let store = MemoryOutbox::new();
    let id = store
        .enqueue(event("orders.placed", 1))
        .await
        .unwrap()
        .into_id();
    let _coordinator = coordinator(&store, transport);
    wait_until(Duration::from_secs(30), "dead-lettered", || async {
        settled(&store).await.1 == 1
    })
    .await;
    let message = store.get_message(&id).await.unwrap();
    assert_eq!(
        (message.status, message.attempts),
        (MessageStatus::DeadLettered, 1)
    );
    let error = message.last_error.unwrap().message;
    assert!(error.contains("no stream for subject"), "{error}");
    assert!(error.contains(&format!("{prefix}orders.placed")), "{error}");
}

#[actix_rt::test]
async fn a_message_above_the_stream_limit_dead_letters_at_once_with_the_reason() {
    let _serial = SERIAL.lock().await;
    let (_js, stream, prefix) = fresh_stream(|config| config.max_message_size = 300).await;
    let transport =
        NatsTransport::connect(&nats_url(), NatsConfig::new(&stream, NameMap::new(&prefix)))
            .await
            .unwrap();
    let store = MemoryOutbox::new();
    let big = format!(r#"{{"text":"{}"}}"#, "x".repeat(500));
    let id = store
        .enqueue(NewMessage::new(
            MessageKind::Event,
            "orders.placed",
            Payload::from_json(big).unwrap(),
        ))
        .await
        .unwrap()
        .into_id();
    let small = store
        .enqueue(NewMessage::new(
            MessageKind::Event,
            "orders.placed",
            Payload::from_json("{}").unwrap(),
        ))
        .await
        .unwrap()
        .into_id();
    let _coordinator = coordinator(&store, transport);
    wait_until(Duration::from_secs(30), "settled", || async {
        settled(&store).await == (1, 1)
    })
    .await;
    let message = store.get_message(&id).await.unwrap();
    assert_eq!(
        (message.status, message.attempts),
        (MessageStatus::DeadLettered, 1)
    );
    let error = message.last_error.unwrap().message;
    assert!(
        error
            .to_lowercase()
            .contains("message size exceeds maximum"),
        "{error}"
    );
    assert_eq!(
        store.get_message(&small).await.unwrap().status,
        MessageStatus::Delivered
    );
}

#[actix_rt::test]
async fn a_missing_stream_is_a_configuration_error_at_start() {
    let _serial = SERIAL.lock().await;
    let (_js, _stream, prefix) = fresh_stream(|_| {}).await;
    let error = NatsTransport::connect(
        &nats_url(),
        NatsConfig::new("NO_SUCH_STREAM", NameMap::new(&prefix)),
    )
    .await
    .unwrap_err();
    assert_eq!(error.class, FailureClass::Permanent);
    assert!(
        error
            .reason
            .contains("stream `NO_SUCH_STREAM` does not exist"),
        "{error}"
    );
}

#[actix_rt::test]
async fn a_stream_that_misses_the_subjects_is_a_configuration_error_at_start() {
    let _serial = SERIAL.lock().await;
    let (_js, stream, _prefix) = fresh_stream(|_| {}).await;
    let error = NatsTransport::connect(
        &nats_url(),
        NatsConfig::new(&stream, NameMap::new("elsewhere.")),
    )
    .await
    .unwrap_err();
    assert_eq!(error.class, FailureClass::Permanent);
    assert!(error.reason.contains("do not cover"), "{error}");
    assert!(error.reason.contains("elsewhere.>"), "{error}");
}

#[actix_rt::test]
async fn the_trace_context_and_the_outbox_headers_arrive() {
    let _serial = SERIAL.lock().await;
    let (js, stream, prefix) = fresh_stream(|_| {}).await;
    let transport =
        NatsTransport::connect(&nats_url(), NatsConfig::new(&stream, NameMap::new(&prefix)))
            .await
            .unwrap();
    let store = MemoryOutbox::new();
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let id = store
        .enqueue(event("orders.placed", 1).with_trace(TraceCarrier {
            traceparent: traceparent.to_owned(),
            tracestate: Some("vendor=1".to_owned()),
        }))
        .await
        .unwrap()
        .into_id();
    let _coordinator = coordinator(&store, transport);
    wait_until(Duration::from_secs(30), "delivered", || async {
        settled(&store).await.0 == 1
    })
    .await;
    let mut handle = js.get_stream(&stream).await.unwrap();
    let message = handle.get_raw_message(1).await.unwrap();
    let header = |name| message.headers.get(name).map(|v| v.as_str().to_owned());
    assert_eq!(header("traceparent").as_deref(), Some(traceparent));
    assert_eq!(header("tracestate").as_deref(), Some("vendor=1"));
    assert_eq!(header("Nats-Msg-Id"), Some(id.clone()));
    assert_eq!(header("Outbox-Message-Id"), Some(id));
    assert_eq!(header("Outbox-Name").as_deref(), Some("orders.placed"));
    assert_eq!(header("Outbox-Kind").as_deref(), Some("event"));
    assert_eq!(header("Outbox-Attempt").as_deref(), Some("1"));
    assert_eq!(message.subject.as_str(), format!("{prefix}orders.placed"));
    assert_eq!(&message.payload[..], br#"{"n":1}"#);
    assert_eq!(handle.info().await.unwrap().state.messages, 1);
}
