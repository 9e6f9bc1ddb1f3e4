//! Tracing of the runtime, on virtual time: the delivery span and its
//! events, and the stored trace carrier handed to handlers, read from a
//! subscriber local to the test's thread (the actix system runs on it).

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use outbox::{
    Clock, DeliveryContext, DeliveryError, DrainConfig, Event, InProcessBus, InProcessJobs, Job,
    NewMessage, OutboxStore, Registry, RetryPolicy, TokioClock, TraceCarrier,
};
use outbox_actors::{Drain, DrainCoordinator, DrainReport};
use serde::{Deserialize, Serialize};
use support::{Fault, FaultStore, Op, clock, run};
use tracing::Level;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Order {
    work_ms: u64,
    fail: bool,
    note: String,
}

impl Event for Order {
    const NAME: &'static str = "order.placed";
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Invoice {
    work_ms: u64,
}

impl Job for Invoice {
    const NAME: &'static str = "invoice.send";
}

fn order(work_ms: u64) -> Order {
    Order {
        work_ms,
        ..Order::default()
    }
}

fn failing(work_ms: u64) -> Order {
    Order {
        work_ms,
        fail: true,
        ..Order::default()
    }
}

/// What handlers saw of their trace context.
type Traces = Arc<Mutex<Vec<Option<TraceCarrier>>>>;

fn bus(traces: &Traces) -> InProcessBus {
    let traces = traces.clone();
    InProcessBus::new().on(move |order: Arc<Order>, context: DeliveryContext| {
        traces.lock().unwrap().push(context.trace().cloned());
        async move {
            tokio::time::sleep(Duration::from_millis(order.work_ms)).await;
            if order.fail {
                Err(DeliveryError::msg("the order service said no"))
            } else {
                Ok(())
            }
        }
    })
}

fn jobs() -> InProcessJobs {
    InProcessJobs::new().on(|invoice: Invoice, _: DeliveryContext| async move {
        tokio::time::sleep(Duration::from_millis(invoice.work_ms)).await;
        Ok(())
    })
}

fn config() -> DrainConfig {
    DrainConfig {
        concurrency: 4,
        retry: RetryPolicy::fixed(Duration::from_secs(5)),
        ..DrainConfig::default()
    }
}

struct Harness<S> {
    store: S,
    clock: TokioClock,
    traces: Traces,
    coordinator: Addr<DrainCoordinator>,
}

impl<S: OutboxStore + Clone> Harness<S> {
    fn start(store: S, config: DrainConfig) -> Self {
        let clock = clock();
        let traces = Traces::default();
        let builder = DrainCoordinator::builder(store.clone())
            .registry(
                Registry::builder()
                    .event::<Order>()
                    .job::<Invoice>()
                    .build()
                    .unwrap(),
            )
            .event_bus(bus(&traces))
            .job_dispatcher(jobs())
            .config(config)
            .clock(clock.clone())
            .wake_on_insert(false);
        Harness {
            coordinator: builder.start().unwrap(),
            store,
            clock,
            traces,
        }
    }

    async fn enqueue(&self, message: NewMessage) -> String {
        self.store
            .enqueue(message.at(self.clock.now()))
            .await
            .unwrap()
    }

    async fn drain(&self) -> DrainReport {
        self.coordinator.send(Drain).await.unwrap().unwrap()
    }
}

fn event(order: Order) -> NewMessage {
    NewMessage::event(&order).unwrap()
}

#[derive(Debug, Clone)]
struct Captured {
    level: Level,
    fields: BTreeMap<String, String>,
    /// The span the event was recorded in.
    span: Option<String>,
}

#[derive(Debug, Clone)]
struct CapturedSpan {
    name: String,
    fields: BTreeMap<String, String>,
    root: bool,
}

/// A layer that keeps every event and span, with all their fields.
#[derive(Clone, Default)]
struct Capture {
    events: Arc<Mutex<Vec<Captured>>>,
    spans: Arc<Mutex<Vec<CapturedSpan>>>,
}

#[derive(Default)]
struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        _: &tracing::span::Id,
        _: Context<'_, S>,
    ) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        self.spans.lock().unwrap().push(CapturedSpan {
            name: attrs.metadata().name().to_owned(),
            fields: fields.0,
            root: attrs.is_root(),
        });
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        self.events.lock().unwrap().push(Captured {
            level: *event.metadata().level(),
            fields: fields.0,
            span: ctx.event_span(event).map(|span| span.name().to_owned()),
        });
    }
}

impl Capture {
    fn named(&self, name: &str) -> Vec<Captured> {
        self.events
            .lock()
            .unwrap()
            .iter()
            .filter(|event| event.fields.get("event").map(String::as_str) == Some(name))
            .cloned()
            .collect()
    }
}

fn traced<F, Fut>(test: F) -> Capture
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = ()>,
{
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    tracing::subscriber::with_default(subscriber, || run(test));
    capture
}

#[test]
fn each_delivery_runs_in_its_own_root_span_with_one_event_per_outcome() {
    let capture = traced(|| async {
        let h = Harness::start(FaultStore::new(), config());
        h.enqueue(event(order(10))).await;
        h.enqueue(event(failing(10))).await;
        h.enqueue(event(failing(10)).with_max_attempts(1)).await;
        h.enqueue(NewMessage::job(&Invoice { work_ms: 10 }).unwrap())
            .await;
        h.drain().await;
    });

    let spans = capture.spans.lock().unwrap().clone();
    let deliveries: Vec<_> = spans
        .iter()
        .filter(|span| span.name == "outbox deliver")
        .collect();
    assert_eq!(deliveries.len(), 4);
    for span in &deliveries {
        assert!(span.root, "a delivery span has no contextual parent");
        let name = &span.fields["outbox.message_name"];
        assert_eq!(span.fields["otel.name"], format!("outbox deliver {name}"));
        assert_eq!(span.fields["otel.kind"], "consumer");
        let kind = &span.fields["outbox.message_kind"];
        assert!(kind == "event" || kind == "job", "{kind}");
    }

    for (name, count) in [
        ("outbox.delivered", 2),
        ("job.completed", 1),
        ("outbox.retry_scheduled", 1),
        ("outbox.dead_lettered", 1),
        ("outbox.delivery_started", 4),
    ] {
        let events = capture.named(name);
        assert_eq!(events.len(), count, "{name}: {events:?}");
        for event in &events {
            assert_eq!(event.span.as_deref(), Some("outbox deliver"), "{name}");
        }
    }
    let retry = &capture.named("outbox.retry_scheduled")[0];
    assert_eq!(retry.fields["retry_delay_ms"], "5000");
    assert!(
        retry.fields["retry_at"].starts_with("2026-01-01T00:00:05"),
        "{retry:?}"
    );
    let dead = &capture.named("outbox.dead_lettered")[0];
    assert_eq!(dead.fields["abandoned"], "false");
}

#[test]
fn payloads_are_logged_at_trace_level_only() {
    const SECRET: &str = "card 4111 1111 1111 1111";
    let capture = traced(|| async {
        let store = FaultStore::new();
        // Fail a settlement too, so every error path logs.
        store.fault(Op::Fail, 1, Fault::Claim);
        let h = Harness::start(store, config());
        let mut secret = failing(10);
        secret.note = SECRET.to_owned();
        h.enqueue(event(secret.clone())).await;
        secret.fail = false;
        h.enqueue(event(secret)).await;
        h.drain().await;
    });

    let events = capture.events.lock().unwrap().clone();
    assert!(!capture.named("outbox.settlement_failed").is_empty());
    let leaks: Vec<_> = events
        .iter()
        .filter(|event| event.fields.values().any(|value| value.contains("4111")))
        .collect();
    assert!(!leaks.is_empty(), "the trace-level event shows the payload");
    for event in leaks {
        assert_eq!(event.level, Level::TRACE, "{event:?}");
        assert_eq!(event.fields["event"], "outbox.delivery_started");
    }
    let spans = capture.spans.lock().unwrap().clone();
    assert!(
        spans
            .iter()
            .all(|span| span.fields.values().all(|value| !value.contains("4111")))
    );
}

#[test]
fn the_stored_carrier_reaches_the_handler_unchanged_without_an_opentelemetry_layer() {
    let stored = TraceCarrier {
        traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_owned(),
        tracestate: Some("vendor=opaque".to_owned()),
    };
    let invalid = TraceCarrier {
        traceparent: "not a traceparent".to_owned(),
        tracestate: None,
    };
    let expected = [Some(stored.clone()), Some(invalid.clone()), None];
    let traces = Arc::new(Mutex::new(Vec::new()));
    let seen = traces.clone();
    // With a subscriber, but none that records OpenTelemetry contexts.
    let capture = traced(move || async move {
        let h = Harness::start(
            FaultStore::new(),
            DrainConfig {
                concurrency: 1,
                ..config()
            },
        );
        h.enqueue(event(order(10)).with_trace(stored)).await;
        h.enqueue(event(order(10)).with_trace(invalid)).await;
        let mut untraced = event(order(10));
        untraced.trace = None;
        h.enqueue(untraced).await;
        assert_eq!(h.drain().await.delivered, 3);
        seen.lock()
            .unwrap()
            .extend(h.traces.lock().unwrap().clone());
    });
    assert_eq!(*traces.lock().unwrap(), expected);
    // Only the `opentelemetry` feature reads carriers, and so notices a bad one.
    let noticed = capture.named("outbox.trace_invalid");
    if cfg!(feature = "opentelemetry") {
        assert_eq!(noticed.len(), 1, "{noticed:?}");
        assert_eq!(noticed[0].level, Level::DEBUG);
        assert_eq!(noticed[0].span.as_deref(), Some("outbox deliver"));
    } else {
        assert!(noticed.is_empty());
    }
}
