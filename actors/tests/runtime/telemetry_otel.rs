//! Trace propagation with the `opentelemetry` feature, on virtual time: a
//! message enqueued inside a span is delivered in a span whose parent is
//! that span, through the W3C carrier stored with the message. Spans go to
//! the SDK's in-memory exporter through `tracing-opentelemetry`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::trace::{SpanId, SpanKind, TraceId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use outbox::{
    Clock, DeliveryContext, DrainConfig, Event, InProcessBus, MemoryOutbox, NewMessage,
    OutboxAdmin, OutboxMessage, OutboxStore, Registry, TraceCarrier,
};
use outbox_actors::{Drain, DrainCoordinator, DrainReport};
use serde::{Deserialize, Serialize};
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;

use crate::support::{clock, run};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Shipped {
    parcel: u32,
}

impl Event for Shipped {
    const NAME: &'static str = "parcel.shipped";
}

const DELIVERY_SPAN: &str = "outbox deliver parcel.shipped";

/// What one test saw: the exported spans, and by parcel the trace context
/// its handler got and the message as stored.
struct Traced {
    spans: Vec<SpanData>,
    handed: Vec<(u32, Option<TraceCarrier>)>,
    stored: Vec<(u32, OutboxMessage)>,
}

impl Traced {
    fn span(&self, name: &str) -> &SpanData {
        let found: Vec<_> = self.spans.iter().filter(|span| span.name == name).collect();
        assert_eq!(found.len(), 1, "one span named {name}: {:#?}", self.spans);
        found[0]
    }

    /// The delivery span of `parcel`.
    fn delivery(&self, parcel: u32) -> &SpanData {
        let id = &lookup(&self.stored, parcel).id;
        let found: Vec<_> = self
            .spans
            .iter()
            .filter(|span| attribute(span, "outbox.message_id").as_ref() == Some(id))
            .collect();
        assert_eq!(
            found.len(),
            1,
            "one span delivers parcel {parcel}: {:#?}",
            self.spans
        );
        assert_eq!(found[0].name, DELIVERY_SPAN);
        found[0]
    }

    fn handed(&self, parcel: u32) -> Option<TraceCarrier> {
        lookup(&self.handed, parcel).clone()
    }

    fn stored(&self, parcel: u32) -> Option<TraceCarrier> {
        lookup(&self.stored, parcel).trace.clone()
    }
}

fn lookup<T>(list: &[(u32, T)], parcel: u32) -> &T {
    &list
        .iter()
        .find(|(p, _)| *p == parcel)
        .unwrap_or_else(|| panic!("parcel {parcel} not seen"))
        .1
}

/// Enqueue with `enqueue`, drain once, and export every span, with an
/// OpenTelemetry layer scoped to this thread (the actix system runs on it).
fn traced<F, Fut>(enqueue: F) -> Traced
where
    F: FnOnce(MemoryOutbox) -> Fut,
    Fut: Future<Output = ()>,
{
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("outbox-tests")));
    let handed = Arc::new(Mutex::new(Vec::new()));
    let stored = Arc::new(Mutex::new(Vec::new()));
    tracing::subscriber::with_default(subscriber, || {
        run(|| async {
            let store = MemoryOutbox::new();
            enqueue(store.clone()).await;
            let seen = handed.clone();
            let coordinator = DrainCoordinator::builder(store.clone())
                .registry(Registry::builder().event::<Shipped>().build().unwrap())
                .event_bus(InProcessBus::new().on(
                    move |shipped: Arc<Shipped>, context: DeliveryContext| {
                        seen.lock()
                            .unwrap()
                            .push((shipped.parcel, context.trace().cloned()));
                        async {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            Ok(())
                        }
                    },
                ))
                .config(DrainConfig::default())
                .clock(clock())
                .wake_on_insert(false)
                .start()
                .unwrap();
            let report: DrainReport = coordinator.send(Drain).await.unwrap().unwrap();
            assert_eq!(report.delivered, report.claimed, "{report}");
            let page = store.list_messages(Default::default()).await.unwrap();
            for message in page.messages {
                let parcel = message.payload.decode::<Shipped>().unwrap().parcel;
                stored.lock().unwrap().push((parcel, message));
            }
        })
    });
    provider.force_flush().unwrap();
    Traced {
        spans: exporter.get_finished_spans().unwrap(),
        handed: Arc::try_unwrap(handed).unwrap().into_inner().unwrap(),
        stored: Arc::try_unwrap(stored).unwrap().into_inner().unwrap(),
    }
}

fn shipped(parcel: u32) -> NewMessage {
    NewMessage::event(&Shipped { parcel })
        .unwrap()
        .at(clock().now())
}

fn traceparent(trace_id: TraceId, span_id: SpanId) -> String {
    format!("00-{trace_id}-{span_id}-01")
}

fn attribute(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.to_string())
}

#[test]
fn the_delivery_span_is_a_child_of_the_enqueuing_span() {
    let traced = traced(|store| async move {
        let request = tracing::info_span!("place order");
        async {
            store.enqueue(shipped(1)).await.unwrap();
        }
        .instrument(request)
        .await;
    });

    let request = traced.span("place order");
    let delivery = traced.delivery(1);
    let trace_id = request.span_context.trace_id();
    assert_eq!(delivery.span_context.trace_id(), trace_id);
    assert_eq!(delivery.parent_span_id, request.span_context.span_id());
    assert!(
        delivery.parent_span_is_remote,
        "the parent came from the store"
    );
    assert_eq!(delivery.span_kind, SpanKind::Consumer);
    assert_eq!(
        attribute(delivery, "outbox.message_kind").as_deref(),
        Some("event")
    );
    assert_eq!(
        attribute(delivery, "outbox.message_name").as_deref(),
        Some("parcel.shipped")
    );

    // Stored at enqueue: the enqueuing span's context.
    let stored = traced.stored(1).expect("the enqueue captured a trace");
    assert_eq!(
        stored.traceparent,
        traceparent(trace_id, request.span_context.span_id())
    );
    // Handed to the handler: the delivery span's own context, so calls it
    // makes continue the delivery's trace.
    let handed = traced.handed(1).unwrap();
    assert_eq!(
        handed.traceparent,
        traceparent(trace_id, delivery.span_context.span_id())
    );
}

#[test]
fn an_explicit_trace_is_never_overwritten() {
    const EXPLICIT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let explicit = TraceCarrier {
        traceparent: EXPLICIT.to_owned(),
        tracestate: Some("vendor=opaque".to_owned()),
    };
    let carrier = explicit.clone();
    let traced = traced(|store| async move {
        // Built inside a span, so a trace was captured, then given one
        // explicitly.
        async {
            store.enqueue(shipped(1).with_trace(carrier)).await.unwrap();
        }
        .instrument(tracing::info_span!("place order"))
        .await;
    });

    assert_eq!(traced.stored(1), Some(explicit));
    let delivery = traced.delivery(1);
    assert_eq!(
        delivery.span_context.trace_id(),
        TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap()
    );
    assert_eq!(
        delivery.parent_span_id,
        SpanId::from_hex("00f067aa0ba902b7").unwrap()
    );
    assert_eq!(
        delivery.span_context.trace_state().get("vendor"),
        Some("opaque"),
        "tracestate is carried too"
    );
}

#[test]
fn with_current_trace_captures_the_span_a_message_is_enqueued_in() {
    let traced = traced(|store| async move {
        // Built outside any span, so nothing was captured.
        let message = shipped(1);
        assert_eq!(message.trace, None);
        let untraced = shipped(2);
        async {
            store.enqueue(message.with_current_trace()).await.unwrap();
        }
        .instrument(tracing::info_span!("place order"))
        .await;
        // Outside a span, `with_current_trace` keeps what the message has.
        store.enqueue(untraced.with_current_trace()).await.unwrap();
    });

    let request = traced.span("place order");
    assert_eq!(
        traced.delivery(1).parent_span_id,
        request.span_context.span_id()
    );
    assert_eq!(traced.stored(2), None);
    // No stored trace: the delivery is a root of its own trace.
    let delivery = traced.delivery(2);
    assert_eq!(delivery.parent_span_id, SpanId::INVALID);
    assert_ne!(
        delivery.span_context.trace_id(),
        request.span_context.trace_id()
    );
}

#[test]
fn an_invalid_stored_trace_starts_a_fresh_root_and_still_delivers() {
    let garbage = TraceCarrier {
        traceparent: "00-not-a-trace".to_owned(),
        tracestate: None,
    };
    let stored = garbage.clone();
    let traced = traced(|store| async move {
        store.enqueue(shipped(1).with_trace(stored)).await.unwrap();
    });

    assert_eq!(traced.stored(1), Some(garbage));
    let delivery = traced.delivery(1);
    assert_eq!(delivery.parent_span_id, SpanId::INVALID);
    assert!(delivery.span_context.is_valid());
    // The handler continues the fresh trace, not the invalid one.
    let handed = traced.handed(1).unwrap();
    assert_eq!(
        handed.traceparent,
        traceparent(
            delivery.span_context.trace_id(),
            delivery.span_context.span_id()
        )
    );
}
