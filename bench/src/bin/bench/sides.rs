//! What both sides of every store share: the message they drain, the
//! runtime side, the figures a side yields; and the memory store's sides.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use outbox::{
    Clock, DeliveryContext, DrainConfig, Event, InProcessBus, MarkDelivered, MessageKind,
    NewMessage, OutboxAdmin, OutboxStore, Registry, SharedStore, SystemClock,
};
use outbox_actors::{DrainCoordinator, GetStatus, Shutdown};
use outbox_bench::drain::{current_thread, drain_loop};
use outbox_bench::resources::{Timed, peak_rss_mib, reset_peak_rss, with_cpu};
use outbox_bench::store::{claim, memory_filled};
use serde::{Deserialize, Serialize};

/// The message every side drains.
#[derive(Debug, Serialize, Deserialize)]
struct Tick {
    n: u64,
}

impl Event for Tick {
    const NAME: &'static str = "bench.tick";
}

/// The ticks of a fill, all due at the moment this is called.
pub(crate) fn ticks() -> impl FnMut(u64) -> NewMessage {
    let now = SystemClock.now();
    move |n| {
        NewMessage::event(&Tick { n })
            .expect("a tick serializes")
            .at(now)
    }
}

fn registry() -> Registry {
    Registry::builder()
        .event::<Tick>()
        .build()
        .expect("one event registers")
}

fn bus() -> InProcessBus {
    InProcessBus::new().on(|_: Arc<Tick>, _: DeliveryContext| async { Ok(()) })
}

/// The runtime's settings for a bench run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RuntimeSettings {
    /// Messages each side drains.
    pub(crate) messages: u64,
    /// Deliveries in flight at once.
    pub(crate) concurrency: usize,
    /// `batch_size` of a pass.
    pub(crate) batch_size: usize,
    /// Delivery arbiters (0: the coordinator's thread).
    pub(crate) arbiters: usize,
    /// Messages claimed ahead of free slots.
    pub(crate) prefetch: Option<usize>,
    /// Claims in flight at once.
    pub(crate) claims: Option<usize>,
    /// `Some`: no `Drain` loop, the coordinator drains on this schedule.
    pub(crate) schedule: Option<Duration>,
    /// PostgreSQL pool size; `None` for sqlx's default.
    pub(crate) pool: Option<u32>,
    /// `retention.delete_on_delivery` of the runtime's drain.
    pub(crate) delete_on_delivery: bool,
}

/// What one side of a run measured.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Side {
    /// The drain's wall time.
    pub(crate) elapsed: Duration,
    /// CPU time of the whole process (every thread, the store's included)
    /// while the side drained.
    pub(crate) cpu: Option<Duration>,
    /// CPU time of the whole machine while the side drained: the process,
    /// a database server on the same machine, and anything else running.
    pub(crate) machine_cpu: Option<Duration>,
    /// Committed transactions per message (PostgreSQL only).
    pub(crate) commits_per_message: Option<f64>,
    /// Write-ahead log written per message, bytes (PostgreSQL only).
    pub(crate) wal_bytes_per_message: Option<f64>,
    /// Peak RSS while this side filled and drained its store, in MiB.
    pub(crate) peak_rss_mib: Option<f64>,
}

impl Side {
    pub(crate) fn timed(timed: Timed) -> Self {
        Side {
            elapsed: timed.elapsed,
            cpu: timed.cpu,
            machine_cpu: timed.machine_cpu,
            commits_per_message: None,
            wal_bytes_per_message: None,
            peak_rss_mib: None,
        }
    }

    /// One side's figures for the human line, or that it did not run
    /// (`--only`).
    pub(crate) fn describe(side: Option<Side>, messages: u64) -> String {
        let Some(side) = side else {
            return "not run".to_owned();
        };
        let commits = side
            .commits_per_message
            .map(|c| format!(", {c:.4} commits/message"))
            .unwrap_or_default();
        let rss = side
            .peak_rss_mib
            .map(|mib| format!(", peak RSS {mib:.1} MiB"))
            .unwrap_or_default();
        format!(
            "{:.0}/s ({:.2?}{commits}{rss})",
            messages as f64 / side.elapsed.as_secs_f64(),
            side.elapsed
        )
    }
}

/// Runs one side if `run` is set, with the peak reset first, and records
/// the side's peak.
fn measured_if(run: bool, side: impl FnOnce() -> Side) -> Option<Side> {
    run.then(|| {
        let fresh = reset_peak_rss();
        let mut side = side();
        side.peak_rss_mib = if fresh { peak_rss_mib() } else { None };
        side
    })
}

/// Drain every message with the actor runtime; returns the time taken.
/// Must run inside an actix system.
pub(crate) async fn drain_with_runtime(
    store: impl OutboxStore + OutboxAdmin + Clone,
    settings: RuntimeSettings,
) -> Duration {
    let coordinator = DrainCoordinator::builder(store.clone())
        .registry(registry())
        .event_bus(bus())
        .config(DrainConfig {
            batch_size: settings.batch_size,
            concurrency: settings.concurrency,
            delivery_arbiters: settings.arbiters,
            prefetch: settings.prefetch,
            claims_in_flight: settings.claims,
            every: settings.schedule,
            retention: outbox::RetentionConfig {
                delete_on_delivery: settings.delete_on_delivery,
                ..Default::default()
            },
            ..DrainConfig::default()
        })
        .wake_on_insert(false)
        .start()
        .expect("a valid configuration");
    if settings.schedule.is_some() {
        return drain_on_schedule(coordinator, store, Instant::now(), settings).await;
    }
    drain_loop(&coordinator, settings.messages).await
}

/// Wait, sending no `Drain`, until the coordinator on its schedule has
/// delivered `messages`; returns the time since `started`. The wait polls
/// the coordinator's totals every 5 ms (a status answer is a field read;
/// at most 5 ms late, and rare enough not to compete with the drain for the
/// coordinator's thread), then, untimed, checks the store holds nothing more to deliver and
/// stops the coordinator so no tick touches the store afterwards.
async fn drain_on_schedule(
    coordinator: actix::Addr<DrainCoordinator>,
    store: impl OutboxAdmin,
    started: Instant,
    settings: RuntimeSettings,
) -> Duration {
    let messages = settings.messages;
    let elapsed = loop {
        let status = coordinator.send(GetStatus).await.expect("coordinator");
        if status.totals.delivered >= messages {
            break started.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let status = coordinator.send(GetStatus).await.expect("coordinator");
    assert_eq!(
        (status.totals.claimed, status.totals.delivered),
        (messages, messages),
        "every message delivered once: {:?}",
        status.totals
    );
    let stats = store.stats(SystemClock.now()).await.expect("stats");
    let kept = if settings.delete_on_delivery {
        0
    } else {
        messages
    };
    assert_eq!(
        (stats.pending, stats.claimed, stats.delivered),
        (0, 0, kept),
        "the store is empty"
    );
    coordinator
        .send(Shutdown {
            grace: Duration::ZERO,
        })
        .await
        .expect("coordinator");
    elapsed
}

/// Runs the sides `run` asks for, the baseline first: the baseline on a
/// plain Tokio runtime, the runtime side in an actix system. Each future
/// makes its own store, so a side's peak RSS covers its fill.
pub(crate) fn run_sides(
    (run_baseline, run_runtime): (bool, bool),
    baseline: impl Future<Output = Side>,
    runtime: impl Future<Output = Side>,
) -> (Option<Side>, Option<Side>) {
    let baseline = measured_if(run_baseline, || current_thread().block_on(baseline));
    let runtime = measured_if(run_runtime, || actix::System::new().block_on(runtime));
    (baseline, runtime)
}

/// The memory store's sides: the runtime against [`baseline`].
pub(crate) fn memory(settings: RuntimeSettings, run: (bool, bool)) -> (Option<Side>, Option<Side>) {
    let RuntimeSettings {
        messages,
        concurrency,
        ..
    } = settings;
    run_sides(
        run,
        async {
            let store = memory_filled(messages, ticks()).await;
            Side::timed(with_cpu(baseline(Arc::new(store), messages, concurrency)).await)
        },
        async {
            let store = memory_filled(messages, ticks()).await;
            Side::timed(with_cpu(drain_with_runtime(store, settings)).await)
        },
    )
}

/// The same store calls as the runtime, from one task with `concurrency`
/// deliveries in flight.
async fn baseline(store: SharedStore, messages: u64, concurrency: usize) -> Duration {
    let registry = registry();
    let bus = bus();
    let lease = DrainConfig::default().lease;
    let started = Instant::now();
    let mut in_flight = FuturesUnordered::new();
    let mut delivered = 0;
    let mut exhausted = false;
    while delivered < messages {
        if !exhausted && in_flight.len() < concurrency {
            let batch = store
                .claim_batch(claim(
                    concurrency - in_flight.len(),
                    SystemClock.now(),
                    lease,
                ))
                .await
                .expect("claim");
            exhausted = batch.claimed.is_empty();
            for message in batch.claimed {
                let store = store.clone();
                let message = Arc::new(message);
                let payload = registry
                    .decode(MessageKind::Event, &message.name, &message.payload)
                    .expect("decode");
                let publish = outbox::EventBus::publish(
                    &bus,
                    outbox::Delivery {
                        payload,
                        context: DeliveryContext::new(message.clone(), None),
                    },
                );
                in_flight.push(async move {
                    publish.await.expect("no-op handler");
                    store
                        .mark_delivered(MarkDelivered {
                            delete: false,
                            id: message.id.clone(),
                            claim_token: message.claim_token.clone(),
                            now: SystemClock.now(),
                        })
                        .await
                        .expect("deliver");
                });
            }
        }
        if in_flight.next().await.is_some() {
            delivered += 1;
        }
    }
    started.elapsed()
}
