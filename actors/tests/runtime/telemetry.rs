//! Tracing and metrics of the runtime, on virtual time: the delivery span
//! and its events, the stored trace carrier handed to handlers, and every
//! metric, read from a `metrics-util` debugging recorder that is local to
//! the test's thread (the actix system runs on that one thread).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use outbox::{
    ClaimBatch, ClaimedBatch, Clock, DeliveryContext, DeliveryError, DrainConfig, Event,
    InProcessBus, InProcessJobs, Job, MarkDelivered, MarkFailed, MemoryOutbox, NewMessage,
    OutboxStore, Registry, ReleaseClaim, RenewClaim, RetryPolicy, TokioClock, TraceCarrier,
};
use outbox_actors::metrics as names;
use outbox_actors::{Drain, DrainCoordinator, DrainReport};
use serde::{Deserialize, Serialize};
use tracing::Level;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

use crate::support::{self, Fault, FaultStore, Op, clock, run};

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
            .into_id()
    }

    async fn drain(&self) -> DrainReport {
        self.coordinator.send(Drain).await.unwrap().unwrap()
    }
}

fn event(order: Order) -> NewMessage {
    NewMessage::event(&order).unwrap()
}

// ---------------------------------------------------------------------------
// Metrics

/// Running totals of what the recorder saw.
///
/// A debugging recorder's snapshot drains it (counters and gauges swap to
/// zero, histograms empty), so each read adds the new snapshot to these
/// totals. Gauges add up too: the active-deliveries gauge moves by
/// increments. The pending gauge is *set*, so a test reads it only once.
#[derive(Clone)]
struct Metrics {
    snapshotter: Snapshotter,
    totals: Arc<Mutex<BTreeMap<(String, Labels), Value>>>,
}

type Labels = Vec<(String, String)>;

#[derive(Debug, Clone)]
enum Value {
    Counter(u64),
    Gauge(f64),
    Histogram(Vec<f64>),
}

impl Metrics {
    fn read(&self) {
        let mut totals = self.totals.lock().unwrap();
        for (key, _, _, value) in self.snapshotter.snapshot().into_vec() {
            let key = key.key();
            let mut labels: Labels = key
                .labels()
                .map(|label| (label.key().to_owned(), label.value().to_owned()))
                .collect();
            labels.sort();
            let entry = totals.entry((key.name().to_owned(), labels));
            match value {
                DebugValue::Counter(n) => {
                    if let Value::Counter(total) = entry.or_insert(Value::Counter(0)) {
                        *total += n;
                    }
                }
                DebugValue::Gauge(x) => {
                    if let Value::Gauge(total) = entry.or_insert(Value::Gauge(0.0)) {
                        *total += x.into_inner();
                    }
                }
                DebugValue::Histogram(xs) => {
                    if let Value::Histogram(all) = entry.or_insert(Value::Histogram(Vec::new())) {
                        all.extend(xs.into_iter().map(|x| x.into_inner()));
                    }
                }
            }
        }
    }

    fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<Value> {
        self.read();
        let mut labels: Labels = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        labels.sort();
        self.totals
            .lock()
            .unwrap()
            .get(&(name.to_owned(), labels))
            .cloned()
    }

    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        match self.get(name, labels) {
            Some(Value::Counter(n)) => n,
            None => 0,
            other => panic!("{name} {labels:?} is not a counter: {other:?}"),
        }
    }

    fn gauge(&self, name: &str) -> Option<f64> {
        match self.get(name, &[]) {
            Some(Value::Gauge(x)) => Some(x),
            None => None,
            other => panic!("{name} is not a gauge: {other:?}"),
        }
    }

    fn histogram(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        match self.get(name, labels) {
            Some(Value::Histogram(xs)) => xs,
            None => Vec::new(),
            other => panic!("{name} {labels:?} is not a histogram: {other:?}"),
        }
    }

    /// Every counter with this name, whatever its labels.
    fn counters_named(&self, name: &str) -> Vec<(Labels, u64)> {
        self.read();
        self.totals
            .lock()
            .unwrap()
            .iter()
            .filter(|((n, _), _)| n == name)
            .filter_map(|((_, labels), value)| match value {
                Value::Counter(n) => Some((labels.clone(), *n)),
                _ => None,
            })
            .collect()
    }
}

/// Run `test` on virtual time with a debugging recorder local to this
/// thread, where the whole actix system runs.
fn run_metered<F, Fut>(test: F)
where
    F: FnOnce(Metrics) -> Fut,
    Fut: Future<Output = ()>,
{
    let recorder = DebuggingRecorder::new();
    let metrics = Metrics {
        snapshotter: recorder.snapshotter(),
        totals: Arc::default(),
    };
    metrics::with_local_recorder(&recorder, || run_subscribed(|| test(metrics)));
}

/// Run `test` with a tracing subscriber that records nothing.
///
/// Tracing caches per callsite whether anyone listens. A test that hit a
/// callsite with no subscriber at all, while another test's scoped one was
/// being registered, could cache "nobody" and hide that test's events; with
/// a subscriber in every test of this file, every answer is "yes".
fn run_subscribed<F, Fut>(test: F)
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = ()>,
{
    tracing::subscriber::with_default(tracing_subscriber::registry(), || run(test));
}

const ORDER: [(&str, &str); 2] = [("kind", "event"), ("name", "order.placed")];
const INVOICE: [(&str, &str); 2] = [("kind", "job"), ("name", "invoice.send")];

fn with<'a>(base: &[(&'a str, &'a str)], more: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    base.iter().chain(more).copied().collect()
}

fn assert_close(actual: &[f64], expected: &[f64]) {
    assert_eq!(actual.len(), expected.len(), "{actual:?} vs {expected:?}");
    for (a, e) in actual.iter().zip(expected) {
        assert!((a - e).abs() < 1e-6, "{actual:?} vs {expected:?}");
    }
}

#[test]
fn outcomes_are_counted_by_kind_and_name() {
    run_metered(|m| async move {
        let h = Harness::start(FaultStore::new(), config());
        h.enqueue(event(order(10))).await;
        h.enqueue(event(failing(10))).await;
        h.enqueue(event(failing(10)).with_max_attempts(1)).await;
        h.enqueue(NewMessage::job(&Invoice { work_ms: 10 }).unwrap())
            .await;
        let report = h.drain().await;
        assert_eq!(
            (
                report.claimed,
                report.delivered,
                report.retried,
                report.dead_lettered
            ),
            (4, 2, 1, 1)
        );

        assert_eq!(m.counter(names::CLAIMED, &ORDER), 3);
        assert_eq!(m.counter(names::CLAIMED, &INVOICE), 1);
        assert_eq!(m.counter(names::DELIVERED, &ORDER), 1);
        assert_eq!(m.counter(names::DELIVERED, &INVOICE), 1);
        assert_eq!(m.counter(names::RETRIED, &ORDER), 1);
        assert_eq!(
            m.counter(
                names::DEAD_LETTERED,
                &with(&ORDER, &[("abandoned", "false")])
            ),
            1
        );
        assert!(m.counters_named(names::SETTLEMENT_FAILED).is_empty());
        assert!(m.counters_named(names::LEASE_FAILURES).is_empty());
        assert_eq!(m.gauge(names::ACTIVE_DELIVERIES), Some(0.0));
    });
}

#[test]
fn abandoned_dead_letters_are_labelled_and_never_claimed() {
    run_metered(|m| async move {
        let h = Harness::start(FaultStore::new(), config());
        h.enqueue(event(order(0)).with_max_attempts(1)).await;
        // A worker claimed it and vanished.
        let taken = h
            .store
            .claim_batch(ClaimBatch {
                on_dead_letter: Default::default(),
                limit: 1,
                now: h.clock.now(),
                lease: Duration::from_secs(30),
                max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
                queues: Vec::new(),
                durable: true,
            })
            .await
            .unwrap();
        assert_eq!(taken.claimed.len(), 1);
        tokio::time::sleep(Duration::from_secs(31)).await;
        assert_eq!(h.drain().await.abandoned_dead_lettered, 1);

        assert_eq!(
            m.counter(
                names::DEAD_LETTERED,
                &with(&ORDER, &[("abandoned", "true")])
            ),
            1
        );
        assert!(m.counters_named(names::CLAIMED).is_empty());
    });
}

/// Run one delivery of `order` against `store` and return the lease
/// failures counted, by their `state` and `operation` labels.
fn lease_failures(store: FaultStore, config: DrainConfig, order: Order) -> Vec<(String, u64)> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let out = seen.clone();
    run_metered(|m| async move {
        let h = Harness::start(store, config);
        h.enqueue(event(order)).await;
        h.drain().await;
        for (labels, n) in m.counters_named(names::LEASE_FAILURES) {
            let label = |key: &str| {
                labels
                    .iter()
                    .find(|(k, _)| k == key)
                    .map(|(_, v)| v.clone())
                    .unwrap()
            };
            assert_eq!(
                (label("kind"), label("name")),
                ("event".into(), "order.placed".into())
            );
            out.lock()
                .unwrap()
                .push((format!("{}/{}", label("state"), label("operation")), n));
        }
    });
    Arc::try_unwrap(seen).unwrap().into_inner().unwrap()
}

#[test]
fn lease_failures_are_counted_by_state_and_operation() {
    let store = FaultStore::new();
    store.fault(Op::Renew, 1, Fault::Claim);
    assert_eq!(
        lease_failures(store, config(), order(60_000)),
        [("lost/renew".to_owned(), 1)]
    );

    let store = FaultStore::new();
    store.fault(Op::Renew, 1, Fault::Transient);
    assert_eq!(
        lease_failures(store, config(), order(25_000)),
        [("recovered/renew".to_owned(), 1)]
    );

    // The extension is the first settlement write.
    let store = FaultStore::new();
    store.fault(Op::Deliver, 1, Fault::Transient);
    assert_eq!(
        lease_failures(store, config(), order(1_000)),
        [("degraded/renew".to_owned(), 1)]
    );

    let short = DrainConfig {
        max_active: Duration::from_secs(5),
        ..config()
    };
    assert_eq!(
        lease_failures(FaultStore::new(), short, order(60_000)),
        [("lost/max_active".to_owned(), 1)]
    );
}

#[test]
fn settlement_failures_are_counted_and_record_no_duration() {
    run_metered(|m| async move {
        // The extension write fails, the next settlement attempt is refused.
        let store = FaultStore::new();
        store.fault(Op::Deliver, 1, Fault::Transient);
        store.fault(Op::Deliver, 2, Fault::Claim);
        let h = Harness::start(store, config());
        h.enqueue(event(order(10))).await;
        let report = h.drain().await;
        assert_eq!((report.settlement_failed, report.lease_lost), (1, 1));

        assert_eq!(
            m.counter(
                names::SETTLEMENT_FAILED,
                &with(&ORDER, &[("claim_lost", "true")])
            ),
            1
        );
        assert!(m.counters_named(names::DELIVERED).is_empty());
        assert!(
            m.histogram(
                names::DELIVERY_DURATION,
                &with(&ORDER, &[("outcome", "delivered")])
            )
            .is_empty()
        );
        assert!(m.histogram(names::ENQUEUE_TO_DELIVERED, &ORDER).is_empty());
    });
}

#[test]
fn durations_run_from_handler_start_and_from_enqueue_to_settlement() {
    run_metered(|m| async move {
        let store = FaultStore::new();
        // The failed order's settlement write takes a second.
        store.fault(Op::Fail, 1, Fault::Delay(Duration::from_secs(1)));
        let h = Harness::start(
            store,
            DrainConfig {
                concurrency: 1,
                ..config()
            },
        );
        h.enqueue(event(order(250))).await;
        h.enqueue(event(failing(100))).await;
        // Both wait two seconds before a drain picks them up.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let report = h.drain().await;
        assert_eq!((report.delivered, report.retried), (1, 1));

        let delivered = with(&ORDER, &[("outcome", "delivered")]);
        let retried = with(&ORDER, &[("outcome", "retried")]);
        assert_close(&m.histogram(names::DELIVERY_DURATION, &delivered), &[0.25]);
        // Handler 0.1 s, then a settlement write of 1 s.
        assert_close(&m.histogram(names::DELIVERY_DURATION, &retried), &[1.1]);
        // Enqueued at 0, claimed at 2 s, delivered 0.25 s later.
        assert_close(&m.histogram(names::ENQUEUE_TO_DELIVERED, &ORDER), &[2.25]);
    });
}

#[test]
fn active_deliveries_rise_while_handlers_run_and_fall_when_they_report() {
    run_metered(|m| async move {
        let h = Harness::start(FaultStore::new(), config());
        for _ in 0..3 {
            h.enqueue(event(order(10_000))).await;
        }
        let pass = h.coordinator.send(Drain);
        let pass = actix::spawn(pass);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(m.gauge(names::ACTIVE_DELIVERIES), Some(3.0));
        assert_eq!(pass.await.unwrap().unwrap().unwrap().delivered, 3);
        assert_eq!(m.gauge(names::ACTIVE_DELIVERIES), Some(0.0));
    });
}

#[test]
fn the_pending_gauge_is_sampled_after_each_pass() {
    run_metered(|m| async move {
        let h = Harness::start(FaultStore::new(), config());
        h.enqueue(event(order(10))).await;
        h.enqueue(event(failing(10))).await;
        let later = h.clock.now() + chrono::Duration::hours(1);
        h.enqueue(event(order(10)).available_at(later)).await;
        h.drain().await;
        support::settle_mailboxes().await;
        // The retried order and the one not yet due.
        assert_eq!(m.gauge(names::PENDING_MESSAGES), Some(2.0));
    });
}

/// A store that cannot count its pending messages: the default.
#[derive(Clone, Default)]
struct Uncounted(MemoryOutbox);

impl OutboxStore for Uncounted {
    async fn enqueue(&self, message: NewMessage) -> outbox::Result<outbox::Enqueued> {
        self.0.enqueue(message).await
    }
    async fn claim_batch(&self, params: ClaimBatch) -> outbox::Result<ClaimedBatch> {
        self.0.claim_batch(params).await
    }
    async fn renew_claim(
        &self,
        params: RenewClaim,
    ) -> outbox::Result<chrono::DateTime<chrono::Utc>> {
        self.0.renew_claim(params).await
    }
    async fn mark_delivered(&self, params: MarkDelivered) -> outbox::Result<()> {
        self.0.mark_delivered(params).await
    }
    async fn mark_failed(&self, params: MarkFailed) -> outbox::Result<()> {
        self.0.mark_failed(params).await
    }
    async fn release_claim(&self, params: ReleaseClaim) -> outbox::Result<()> {
        self.0.release_claim(params).await
    }
}

#[test]
fn a_store_that_cannot_count_leaves_the_pending_gauge_unreported() {
    run_metered(|m| async move {
        let h = Harness::start(Uncounted::default(), config());
        h.enqueue(event(order(10))).await;
        assert_eq!(h.drain().await.delivered, 1);
        support::settle_mailboxes().await;
        assert_eq!(m.gauge(names::PENDING_MESSAGES), None);
        assert_eq!(m.counter(names::DELIVERED, &ORDER), 1);
    });
}

#[test]
fn metrics_are_described_with_their_units() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        run_subscribed(|| async {
            let h = Harness::start(FaultStore::new(), config());
            h.enqueue(event(order(10))).await;
            h.drain().await;
            support::settle_mailboxes().await;
        })
    });
    let units: BTreeMap<String, Option<metrics::Unit>> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, unit, _, _)| (key.key().name().to_owned(), unit))
        .collect();
    assert_eq!(
        units[names::DELIVERY_DURATION],
        Some(metrics::Unit::Seconds)
    );
    assert_eq!(
        units[names::ENQUEUE_TO_DELIVERED],
        Some(metrics::Unit::Seconds)
    );
    assert_eq!(units[names::DELIVERED], Some(metrics::Unit::Count));
    assert_eq!(units[names::PENDING_MESSAGES], Some(metrics::Unit::Count));
}

// ---------------------------------------------------------------------------
// Tracing

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
        store.fault(Op::Fail, 1, Fault::Transient);
        store.fault(Op::Fail, 2, Fault::Claim);
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
