//! What the broker tests share: a real-time actix system, the services'
//! URLs, stopping and starting a broker, a coordinator over a memory outbox,
//! and a bus wrapper that forces redeliveries.
#![allow(dead_code, unreachable_pub, missing_docs)]

use std::future::Future;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use actix::Addr;
use futures_util::FutureExt;
use futures_util::future::LocalBoxFuture;
use outbox::{
    ClaimedMessage, Delivery, DeliveryContext, DeliveryError, DeliveryResult, DrainConfig,
    EventBus, MemoryOutbox, MessageKind, MessageStatus, NewMessage, OutboxAdmin, OutboxMessage,
    OutboxStore, Payload, Registry, RetryPolicy, TraceCarrier,
};
use outbox_actors::{DrainCoordinator, Shutdown};

/// The brokers are shared by every test of a binary, and one test stops
/// its broker: tests run one at a time.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Run `test` in an actix system on real time: the brokers are real.
pub fn run<F, Fut>(test: F)
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = ()>,
{
    actix_rt::System::new().block_on(test());
}

/// The URL `scripts/with-services` exported in `var`.
pub fn service_url(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!(
            "{var} is not set: run the broker tests under scripts/with-services, \
             e.g. `scripts/with-services cargo test -p outbox-brokers --all-features`"
        )
    })
}

/// Stop or start a broker through `WITH_SERVICES_CTL` (same port after a
/// start, data kept across the stop).
pub fn ctl(action: &str, service: &str) {
    let script = service_url("WITH_SERVICES_CTL");
    let status = Command::new(&script)
        .args([action, service])
        .status()
        .unwrap_or_else(|e| panic!("cannot run {script}: {e}"));
    assert!(
        status.success(),
        "`{script} {action} {service}` failed: {status}"
    );
}

/// Wait, up to `limit`, for `check` to hold; polls every 20 ms.
pub async fn wait_for<F, Fut>(what: &str, limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(
            start.elapsed() < limit,
            "gave up after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A message as a claim hands it to a transport: claimed now, leased for
/// 30 s, in the default queue, with no attempt cap of its own.
pub fn claimed(
    id: &str,
    kind: MessageKind,
    name: &str,
    payload: Payload,
    trace: Option<TraceCarrier>,
    attempts: u32,
) -> ClaimedMessage {
    let now = chrono::Utc::now();
    ClaimedMessage {
        id: id.to_owned(),
        kind,
        name: name.to_owned(),
        payload,
        trace,
        attempts,
        max_attempts: u32::MAX,
        max_attempts_set: false,
        available_at: now,
        created_at: now,
        ordering_key: None,
        claim_token: "token".to_owned(),
        claimed_at: now,
        locked_until: now + chrono::Duration::seconds(30),
        queue: outbox::DEFAULT_QUEUE.to_owned(),
        priority: 0,
    }
}

/// The delivery of `message`, its trace carrier with it.
pub fn delivery_of(message: ClaimedMessage) -> Delivery {
    let trace = message.trace.clone();
    Delivery {
        payload: Box::new(()),
        context: DeliveryContext::new(Arc::new(message), trace),
    }
}

/// A unique suffix, so tests never see each other's destinations.
pub fn unique() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// A trace context as an instrumented producer would have captured it.
pub fn trace() -> TraceCarrier {
    TraceCarrier {
        traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned(),
        tracestate: Some("vendor=abc".to_owned()),
    }
}

/// Enqueue `n` events named `name`, payload `{"n": i}`; returns their ids.
pub async fn enqueue(store: &MemoryOutbox, name: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let payload = Payload::from_json(format!(r#"{{"n":{i}}}"#)).expect("valid JSON");
        let message = NewMessage::new(MessageKind::Event, name, payload).with_trace(trace());
        ids.push(store.enqueue(message).await.expect("enqueue").into_id());
    }
    ids
}

/// Retries soon and often: a broker outage must not use up the attempts.
pub fn retry() -> RetryPolicy {
    let mut policy = RetryPolicy::default();
    policy.max_attempts = Some(1_000);
    policy.initial_delay = Duration::from_millis(20);
    policy.max_delay = Duration::from_millis(500);
    policy.jitter = 0.0;
    policy.seed = Some(1);
    policy
}

/// A coordinator publishing every event of `store` through `bus`, draining
/// on its own every 50 ms.
pub fn coordinator(store: &MemoryOutbox, bus: impl EventBus) -> Addr<DrainCoordinator> {
    DrainCoordinator::builder(store.clone())
        .registry(
            Registry::builder()
                .any(MessageKind::Event)
                .build()
                .expect("registry"),
        )
        .event_bus(bus)
        .config(DrainConfig {
            batch_size: 100,
            concurrency: 32,
            lease: Duration::from_secs(30),
            every: Some(Duration::from_millis(50)),
            retry: retry(),
            ..DrainConfig::default()
        })
        .start()
        .expect("coordinator starts")
}

pub async fn shutdown(coordinator: Addr<DrainCoordinator>) {
    let _ = coordinator
        .send(Shutdown {
            grace: Duration::from_secs(5),
        })
        .await;
}

/// Counts of `store`'s messages by status.
pub async fn count(store: &MemoryOutbox, status: MessageStatus) -> usize {
    store
        .snapshot()
        .iter()
        .filter(|m| m.status == status)
        .count()
}

/// Wait, up to `limit`, until message `id` is delivered or dead-lettered.
pub async fn settled(store: &MemoryOutbox, id: &str, limit: Duration) -> OutboxMessage {
    wait_for(&format!("message {id} to settle"), limit, || async {
        let message = store.get_message(id).await.expect("message exists");
        matches!(
            message.status,
            MessageStatus::Delivered | MessageStatus::DeadLettered
        )
    })
    .await;
    store.get_message(id).await.expect("message exists")
}

#[derive(Default)]
pub struct Stats {
    /// Publishes the broker acknowledged.
    pub acked: AtomicU64,
    /// Publishes that failed.
    pub failed: AtomicU64,
}

impl Stats {
    pub fn acked(&self) -> u64 {
        self.acked.load(Ordering::SeqCst)
    }
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::SeqCst)
    }
}

/// Wraps `bus`; `force` makes first attempts fail after a successful publish.
pub fn counting<B: EventBus + Clone>(bus: B, force: bool) -> (Counting<B>, Arc<Stats>) {
    let stats = Arc::new(Stats::default());
    (
        Counting {
            bus,
            force,
            stats: stats.clone(),
        },
        stats,
    )
}

/// Publishes through the wrapped bus and counts the outcomes; with
/// `force`, fails the first attempt of every message although the broker
/// took it, so the outbox redelivers, as it does when an acknowledgement is
/// lost.
#[derive(Clone)]
pub struct Counting<B> {
    bus: B,
    force: bool,
    stats: Arc<Stats>,
}

impl<B: EventBus + Clone> EventBus for Counting<B> {
    fn publish(&self, delivery: Delivery) -> LocalBoxFuture<'static, DeliveryResult> {
        let first = delivery.context.attempt() == 1;
        let force = self.force;
        let stats = self.stats.clone();
        let publish = self.bus.publish(delivery);
        async move {
            match publish.await {
                Ok(()) => {
                    stats.acked.fetch_add(1, Ordering::SeqCst);
                    if force && first {
                        Err(DeliveryError::msg(
                            "the acknowledgement was lost (forced by the test)",
                        ))
                    } else {
                        Ok(())
                    }
                }
                Err(error) => {
                    stats.failed.fetch_add(1, Ordering::SeqCst);
                    Err(error)
                }
            }
        }
        .boxed_local()
    }
}
