//! Throughput of the actor runtime against a baseline that makes the same
//! store calls from a plain tokio loop, in the same run.
//!
//! ```text
//! cargo run --release --example bench -- --store memory --messages 200000 --concurrency 64
//! ```
//!
//! Both sides deliver every message to a no-op handler: claim (as many as
//! there are free slots), decode, handle, renew once (the final extension),
//! mark delivered. The runtime adds what the baseline lacks: an actor and a
//! heartbeat per message, the `max_active` timer, bounded store calls,
//! outcome messages. The last line printed is one JSON object.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use outbox::{
    ClaimBatch, Clock, DeliveryContext, DrainConfig, Event, InProcessBus, MarkDelivered,
    MemoryOutbox, MessageKind, NewMessage, OutboxStore, Registry, RenewClaim, SharedStore,
    SystemClock,
};
use outbox_actors::{Drain, DrainCoordinator};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct Tick {
    n: u64,
}

impl Event for Tick {
    const NAME: &'static str = "bench.tick";
}

struct Args {
    store: String,
    messages: u64,
    concurrency: usize,
    batch: Option<usize>,
    /// Run one side only (for profiling): `runtime` or `baseline`.
    only: Option<String>,
    /// Delivery arbiters for the runtime (0: the coordinator's thread).
    arbiters: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        store: "memory".into(),
        messages: 200_000,
        concurrency: 64,
        batch: None,
        only: None,
        arbiters: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--store" => args.store = value()?,
            "--messages" => {
                args.messages = value()?.parse().map_err(|e| format!("--messages: {e}"))?
            }
            "--concurrency" => {
                args.concurrency = value()?
                    .parse()
                    .map_err(|e| format!("--concurrency: {e}"))?
            }
            "--batch" => args.batch = Some(value()?.parse().map_err(|e| format!("--batch: {e}"))?),
            "--only" => args.only = Some(value()?),
            "--arbiters" => {
                args.arbiters = value()?.parse().map_err(|e| format!("--arbiters: {e}"))?
            }
            "--help" | "-h" => {
                return Err(
                    "usage: bench [--store memory] [--messages N] [--concurrency N] [--batch N]"
                        .into(),
                );
            }
            other => return Err(format!("unknown argument {other:?}; see --help")),
        }
    }
    if args.store != "memory" {
        return Err(format!(
            "unknown store {:?}; this build knows: memory",
            args.store
        ));
    }
    if args.messages == 0 || args.concurrency == 0 {
        return Err("--messages and --concurrency must be at least 1".into());
    }
    Ok(args)
}

async fn fill(store: &MemoryOutbox, messages: u64) {
    let now = SystemClock.now();
    for n in 0..messages {
        store
            .enqueue(
                NewMessage::event(&Tick { n })
                    .expect("a tick serializes")
                    .at(now),
            )
            .await
            .expect("enqueue into memory");
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
                .claim_batch(ClaimBatch {
                    limit: concurrency - in_flight.len(),
                    now: SystemClock.now(),
                    lease,
                })
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
                        .renew_claim(RenewClaim {
                            id: message.id.clone(),
                            claim_token: message.claim_token.clone(),
                            now: SystemClock.now(),
                            lease,
                        })
                        .await
                        .expect("renew");
                    store
                        .mark_delivered(MarkDelivered {
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

fn main() {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            std::process::exit(2);
        }
    };
    let Args {
        store: store_name,
        messages,
        concurrency,
        batch,
        only,
        arbiters,
    } = args;
    let run_baseline = only.as_deref() != Some("runtime");
    let run_runtime = only.as_deref() != Some("baseline");
    let batch_size = batch.unwrap_or(messages as usize).max(concurrency);

    let baseline_time = run_baseline.then(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let store = MemoryOutbox::new();
            fill(&store, messages).await;
            baseline(Arc::new(store), messages, concurrency).await
        })
    });

    let runtime_time = run_runtime.then(|| {
        actix::System::new().block_on(async move {
            let store = MemoryOutbox::new();
            fill(&store, messages).await;
            let coordinator = DrainCoordinator::builder(store.clone())
                .registry(registry())
                .event_bus(bus())
                .config(DrainConfig {
                    batch_size,
                    concurrency,
                    delivery_arbiters: arbiters,
                    ..DrainConfig::default()
                })
                .wake_on_insert(false)
                .start()
                .expect("a valid configuration");
            let started = Instant::now();
            let mut delivered = 0;
            while delivered < messages {
                let report = coordinator
                    .send(Drain)
                    .await
                    .expect("coordinator")
                    .expect("pass");
                assert_eq!(
                    report.delivered, report.claimed,
                    "every message delivered: {report}"
                );
                delivered += report.delivered;
            }
            started.elapsed()
        })
    });
    let (Some(runtime_time), Some(baseline_time)) = (runtime_time, baseline_time) else {
        println!("{runtime_time:?} {baseline_time:?}");
        return;
    };

    let per_sec = |elapsed: Duration| messages as f64 / elapsed.as_secs_f64();
    let runtime_per_sec = per_sec(runtime_time);
    let baseline_per_sec = per_sec(baseline_time);
    println!(
        "{store_name}: {messages} messages, concurrency {concurrency}, batch {batch_size}: \
         runtime {:.0}/s ({:.2?}), baseline {:.0}/s ({:.2?})",
        runtime_per_sec, runtime_time, baseline_per_sec, baseline_time
    );
    println!(
        "{}",
        serde_json::json!({
            "store": store_name,
            "messages": messages,
            "concurrency": concurrency,
            "runtime_per_sec": runtime_per_sec.round(),
            "baseline_per_sec": baseline_per_sec.round(),
            "ratio": (runtime_per_sec / baseline_per_sec * 1000.0).round() / 1000.0,
        })
    );
}
