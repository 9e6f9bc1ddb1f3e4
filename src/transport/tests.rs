//! The in-process event bus and job dispatcher, and delivery through the
//! registry.

use std::sync::Mutex;

use chrono::Utc;
use serde::{Deserialize, Serialize};

use super::*;
use crate::payload::Payload;
use crate::registry::Registry;

#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct Placed {
    order: u64,
}
impl Event for Placed {
    const NAME: &'static str = "order.placed";
}
impl Job for Placed {
    const NAME: &'static str = "order.placed";
}

fn claimed(kind: MessageKind, name: &str, json: &str) -> Arc<ClaimedMessage> {
    let now = Utc::now();
    Arc::new(ClaimedMessage {
        id: format!("id-{name}"),
        kind,
        name: name.to_owned(),
        payload: Payload::from_json(json).unwrap(),
        trace: None,
        attempts: 1,
        max_attempts: 3,
        max_attempts_set: true,
        available_at: now,
        created_at: now,
        ordering_key: None,
        queue: crate::DEFAULT_QUEUE.into(),
        priority: 0,
        claim_token: "token".to_owned(),
        claimed_at: now,
        locked_until: now,
    })
}

/// Decode `message` with `registry`, as the runtime does, into a delivery.
fn delivery(registry: &Registry, message: Arc<ClaimedMessage>) -> Delivery {
    let payload = registry
        .decode(message.kind, &message.name, &message.payload)
        .unwrap();
    Delivery {
        payload,
        context: DeliveryContext::new(message, None),
    }
}

type Seen = Arc<Mutex<Vec<String>>>;

fn bus(seen: &Seen) -> InProcessBus {
    let (typed, any) = (seen.clone(), seen.clone());
    InProcessBus::new()
        .on(move |event: Arc<Placed>, _| {
            typed.lock().unwrap().push(format!("typed {}", event.order));
            std::future::ready(Ok(()))
        })
        .on_any(move |message: Arc<RawMessage>, ctx| {
            any.lock().unwrap().push(format!(
                "any {} {} {} {}",
                message.kind,
                message.name,
                message.payload.as_str(),
                ctx.id()
            ));
            std::future::ready(Ok(()))
        })
}

#[tokio::test(flavor = "current_thread")]
async fn bus_catch_all_takes_what_no_typed_handler_takes() {
    let registry = Registry::builder()
        .event::<Placed>()
        .any(MessageKind::Event)
        .build()
        .unwrap();
    let seen = Seen::default();
    let bus = bus(&seen);
    assert!(bus.handles("order.placed") && bus.handles("anything"));

    let placed = claimed(MessageKind::Event, "order.placed", r#"{"order":7}"#);
    let shipped = claimed(MessageKind::Event, "order.shipped", r#"{"order":8}"#);
    bus.publish(delivery(&registry, placed)).await.unwrap();
    bus.publish(delivery(&registry, shipped)).await.unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        [
            "typed 7",
            r#"any event order.shipped {"order":8} id-order.shipped"#
        ]
    );
}

#[tokio::test(flavor = "current_thread")]
async fn bus_catch_all_gets_typed_payloads_as_stored() {
    // The registry knows the type, but this bus has only a catch-all.
    let registry = Registry::builder().event::<Placed>().build().unwrap();
    let seen = Seen::default();
    let any = seen.clone();
    let bus = InProcessBus::new().on_any(move |message: Arc<RawMessage>, _| {
        any.lock()
            .unwrap()
            .push(message.payload.as_str().to_owned());
        std::future::ready(Err(DeliveryError::msg("refused")))
    });
    let placed = claimed(MessageKind::Event, "order.placed", r#"{"order":7}"#);
    let error = bus.publish(delivery(&registry, placed)).await.unwrap_err();
    assert_eq!(error.to_string(), "refused");
    assert_eq!(*seen.lock().unwrap(), [r#"{"order":7}"#]);
}

#[tokio::test(flavor = "current_thread")]
async fn bus_without_catch_all_still_reports_no_handler() {
    let registry = Registry::builder().any(MessageKind::Event).build().unwrap();
    let bus = InProcessBus::new().on(|_: Arc<Placed>, _| std::future::ready(Ok(())));
    assert!(!bus.handles("order.shipped"));
    let shipped = claimed(MessageKind::Event, "order.shipped", "{}");
    let error = bus.publish(delivery(&registry, shipped)).await.unwrap_err();
    assert!(matches!(
        error.downcast_ref::<Error>(),
        Some(Error::Registry(RegistryError::NoHandler { .. }))
    ));
}

#[tokio::test(flavor = "current_thread")]
async fn jobs_catch_all_takes_what_no_typed_handler_takes() {
    let registry = Registry::builder()
        .job::<Placed>()
        .any(MessageKind::Job)
        .build()
        .unwrap();
    let seen = Seen::default();
    let (typed, any) = (seen.clone(), seen.clone());
    let jobs = InProcessJobs::new()
        .on(move |job: Placed, _| {
            typed.lock().unwrap().push(format!("typed {}", job.order));
            std::future::ready(Ok(()))
        })
        .on_any(move |job: RawMessage, ctx| {
            any.lock().unwrap().push(format!(
                "any {} {} {} attempt {}",
                job.kind,
                job.name,
                job.payload.as_str(),
                ctx.attempt()
            ));
            std::future::ready(Ok(()))
        });
    assert!(jobs.handles("order.placed") && jobs.handles("report.build"));

    let placed = claimed(MessageKind::Job, "order.placed", r#"{"order":7}"#);
    let report = claimed(MessageKind::Job, "report.build", r#"[1,2]"#);
    jobs.dispatch(delivery(&registry, placed)).await.unwrap();
    jobs.dispatch(delivery(&registry, report)).await.unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        ["typed 7", "any job report.build [1,2] attempt 1"]
    );
    assert!(!InProcessJobs::new().handles("report.build"));
}
