//! The NATS JetStream consumer, on a PostgreSQL inbox.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::{AckPolicy, pull};
use async_nats::jetstream::{self, stream};
use bytes::Bytes;
use outbox::MemoryOutbox;
use outbox_brokers::consume::NatsInboxConsumer;
use outbox_brokers::{NameMap, NatsConfig, NatsTransport};

use crate::harness::{self, coordinator, enqueue, service_url, shutdown, wait_for};
use crate::{Behaviour, Running, WAIT, applied, assert_once, postgres, postgres_handler, stopped};

static STREAMS: AtomicUsize = AtomicUsize::new(0);

/// A stream of its own: the context, its name and its subject prefix.
async fn fresh_stream() -> (jetstream::Context, String, String) {
    let client = async_nats::connect(service_url("NATS_URL"))
        .await
        .expect("connect to NATS_URL");
    let js = jetstream::new(client);
    let n = STREAMS.fetch_add(1, Ordering::Relaxed);
    let name = format!("INBOX_T{}_{n}", std::process::id());
    let prefix = format!("inbox{}n{n}.", std::process::id());
    js.create_stream(stream::Config {
        name: name.clone(),
        subjects: vec![format!("{prefix}>")],
        ..Default::default()
    })
    .await
    .expect("create the test stream");
    (js, name, prefix)
}

/// A durable pull consumer named `name` on `stream`.
async fn durable(
    js: &jetstream::Context,
    stream: &str,
    name: &str,
    ack_wait: Duration,
) -> jetstream::consumer::Consumer<pull::Config> {
    js.get_stream(stream)
        .await
        .expect("the stream exists")
        .create_consumer(pull::Config {
            durable_name: Some(name.to_owned()),
            ack_policy: AckPolicy::Explicit,
            ack_wait,
            ..Default::default()
        })
        .await
        .expect("create the consumer")
}

/// Publish `payload` to `subject` with these headers, straight to JetStream.
async fn publish_raw(
    js: &jetstream::Context,
    subject: String,
    headers: &[(&str, &str)],
    payload: &str,
) {
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        map.insert(*name, *value);
    }
    js.publish_with_headers(subject, map, Bytes::from(payload.to_owned()))
        .await
        .expect("publish")
        .await
        .expect("the stream stores it");
}

/// Whether the consumer has nothing left to deliver nor awaiting an ack.
async fn drained(js: &jetstream::Context, stream: &str, consumer: &str) -> bool {
    let stream = js.get_stream(stream).await.expect("the stream exists");
    let info = stream.consumer_info(consumer).await.expect("consumer info");
    info.num_pending == 0 && info.num_ack_pending == 0
}

#[test]
fn relayed_messages_and_their_copies_are_applied_once_through_failures() {
    harness::run(|| async {
        const N: usize = 40;
        let (js, stream, prefix) = fresh_stream().await;
        let (inbox, effects) = postgres().await;

        // The relay: an outbox drained into the stream.
        let store = MemoryOutbox::new();
        let ids = enqueue(&store, "orders.placed", N).await;
        let transport = NatsTransport::connect(
            &service_url("NATS_URL"),
            NatsConfig::new(&stream, NameMap::new(&prefix)),
        )
        .await
        .expect("connect the transport");
        let relay = coordinator(&store, transport);
        wait_for("the relay to publish everything", WAIT, || async {
            harness::count(&store, outbox::MessageStatus::Delivered).await == N
        })
        .await;
        shutdown(relay).await;
        // A second copy of each, as a republish after JetStream's
        // duplicate window would store: same outbox id, new Nats-Msg-Id.
        for id in &ids {
            let copy = format!("{id}-copy");
            publish_raw(
                &js,
                format!("{prefix}orders.placed"),
                &[
                    ("Outbox-Message-Id", id),
                    ("Nats-Msg-Id", &copy),
                    ("Outbox-Name", "orders.placed"),
                ],
                r#"{"copy":true}"#,
            )
            .await;
        }

        let consumer = NatsInboxConsumer::new(
            durable(&js, &stream, "billing", Duration::from_secs(30)).await,
            inbox.clone(),
            "billing",
            postgres_handler(&effects, Behaviour::FailFirst),
        )
        .expect("an explicit-ack consumer")
        .retry_delay(Duration::from_millis(50));
        let running = Running::start(|signal| consumer.run(stopped(signal)));
        wait_for("every copy to be consumed", WAIT, || async {
            applied(inbox.pool(), &effects).await.len() == N
                && drained(&js, &stream, "billing").await
        })
        .await;
        let report = running.stop().await;

        assert_once(&applied(inbox.pool(), &effects).await, &ids);
        // Each message failed once (its first copy, rolled back and
        // redelivered), was applied once, and its other copy was skipped.
        assert_eq!(
            (
                report.processed,
                report.duplicates,
                report.failed,
                report.refused
            ),
            (N as u64, N as u64, N as u64, 0),
            "{report:?}"
        );
    });
}

#[tokio::test]
async fn a_message_without_an_id_is_terminated_and_the_next_one_applied() {
    let (js, stream, prefix) = fresh_stream().await;
    let (inbox, effects) = postgres().await;
    publish_raw(&js, format!("{prefix}orders.placed"), &[], "{}").await;
    publish_raw(
        &js,
        format!("{prefix}orders.placed"),
        &[("Outbox-Message-Id", "m-1")],
        "{}",
    )
    .await;
    let consumer = NatsInboxConsumer::new(
        durable(&js, &stream, "billing", Duration::from_secs(1)).await,
        inbox.clone(),
        "billing",
        postgres_handler(&effects, Behaviour::Apply),
    )
    .expect("an explicit-ack consumer");
    let running = Running::start(|signal| consumer.run(stopped(signal)));
    wait_for("both messages to be done", WAIT, || async {
        applied(inbox.pool(), &effects).await.len() == 1 && drained(&js, &stream, "billing").await
    })
    .await;
    let report = running.stop().await;
    assert_eq!((report.processed, report.refused), (1, 1), "{report:?}");
    let info = js
        .get_stream(&stream)
        .await
        .unwrap()
        .consumer_info("billing")
        .await
        .unwrap();
    // Terminated, not left to its ack wait: never delivered again.
    assert_eq!(info.num_redelivered, 0, "{info:?}");
}

#[tokio::test]
async fn a_consumer_that_does_not_ack_explicitly_is_refused() {
    let (js, stream, _prefix) = fresh_stream().await;
    let (inbox, effects) = postgres().await;
    let none = js
        .get_stream(&stream)
        .await
        .unwrap()
        .create_consumer(pull::Config {
            durable_name: Some("lax".to_owned()),
            ack_policy: AckPolicy::None,
            ..Default::default()
        })
        .await
        .unwrap();
    let refused = NatsInboxConsumer::new(
        none,
        inbox,
        "billing",
        postgres_handler(&effects, Behaviour::Apply),
    )
    .expect_err("acknowledging after the commit needs explicit acks");
    assert!(refused.is_permanent(), "{refused}");
    assert!(refused.reason.contains("AckPolicy::Explicit"), "{refused}");
}

#[cfg(feature = "opentelemetry")]
#[tokio::test]
async fn the_consumers_span_is_a_child_of_the_trace_the_message_carries() {
    use std::sync::OnceLock;

    use opentelemetry::trace::{SpanId, TraceId, TracerProvider as _};
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
    use tracing_subscriber::layer::SubscriberExt;

    // A global subscriber: callsites' interest is global, so a subscriber
    // set for this thread alone races the other tests' threads.
    static OTEL: OnceLock<(InMemorySpanExporter, SdkTracerProvider)> = OnceLock::new();
    let (exporter, provider) = OTEL.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("inbox-test")));
        tracing::subscriber::set_global_default(subscriber).expect("the only global subscriber");
        (exporter, provider)
    });

    let (js, stream, prefix) = fresh_stream().await;
    let (inbox, effects) = postgres().await;
    let trace = harness::trace();
    publish_raw(
        &js,
        format!("{prefix}orders.placed"),
        &[
            ("Outbox-Message-Id", "traced-1"),
            ("Outbox-Name", "orders.placed"),
            ("traceparent", &trace.traceparent),
        ],
        "{}",
    )
    .await;
    let consumer = NatsInboxConsumer::new(
        durable(&js, &stream, "billing", Duration::from_secs(30)).await,
        inbox.clone(),
        "billing",
        postgres_handler(&effects, Behaviour::Apply),
    )
    .expect("an explicit-ack consumer");
    let report = {
        let (stop, signal) = tokio::sync::oneshot::channel();
        let run = consumer.run(stopped(signal));
        let wait = async {
            wait_for("the message to be applied", WAIT, || async {
                applied(inbox.pool(), &effects).await.len() == 1
            })
            .await;
            let _ = stop.send(());
        };
        let (report, ()) = tokio::join!(run, wait);
        report
    };
    assert_eq!(report.processed, 1);
    provider.force_flush().expect("flush the spans");
    let spans = exporter.get_finished_spans().expect("the exported spans");
    let consumed = spans
        .iter()
        .find(|span| {
            span.name == "inbox consume orders.placed"
                && span.attributes.iter().any(|kv| {
                    kv.key.as_str() == "outbox.message_id" && kv.value.as_str() == "traced-1"
                })
        })
        .unwrap_or_else(|| panic!("no consumer span in {spans:#?}"));
    assert_eq!(
        consumed.span_context.trace_id(),
        TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap()
    );
    assert_eq!(
        consumed.parent_span_id,
        SpanId::from_hex("00f067aa0ba902b7").unwrap()
    );
}
