//! Ordering keys in the runtime: at concurrency 16, with failing first
//! attempts and retries, each key's messages run one at a time and are first
//! delivered in enqueue order, while other keys and keyless messages go on.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::{
    Clock, DeliveryContext, DeliveryError, DrainConfig, EnqueueOptions, InProcessBus,
    MessageStatus, NewMessage, OutboxAdmin, OutboxStore, RetryPolicy,
};
use outbox_actors::{Drain, DrainCoordinator};

use crate::support::{clock, run};
use crate::{Ping, registry};

#[derive(Default)]
struct Seen {
    in_flight: HashMap<String, u32>,
    max_in_flight_per_key: u32,
    max_in_flight: u32,
    running: u32,
    /// Per key, the `n` of each first successful delivery, in order.
    delivered: BTreeMap<String, Vec<u32>>,
    failures: u32,
}

#[test]
fn each_key_is_delivered_in_order_at_concurrency_16_with_failures() {
    run(|| async {
        const KEYS: u32 = 6;
        const PER_KEY: u32 = 40;
        const KEYLESS: u32 = 60;
        let clock = clock();
        let store = outbox::MemoryOutbox::new();
        for n in 0..PER_KEY {
            for k in 0..KEYS {
                let ping = Ping {
                    n,
                    work_ms: u64::from((n * 7 + k * 13) % 20),
                    ..Ping::default()
                };
                let message = NewMessage::event(&ping)
                    .unwrap()
                    .with_options(EnqueueOptions::new().ordering_key(format!("key-{k}")))
                    .at(clock.now());
                store.enqueue(message).await.unwrap();
            }
        }
        for n in 0..KEYLESS {
            let ping = Ping {
                n,
                work_ms: 5,
                ..Ping::default()
            };
            let message = NewMessage::event(&ping).unwrap().at(clock.now());
            store.enqueue(message).await.unwrap();
        }

        let seen = Arc::new(Mutex::new(Seen::default()));
        let bus = {
            let seen = seen.clone();
            InProcessBus::new().on(move |ping: Arc<Ping>, context: DeliveryContext| {
                let seen = seen.clone();
                let key = context
                    .message()
                    .ordering_key
                    .clone()
                    .unwrap_or_else(|| "-".to_owned());
                {
                    let mut seen = seen.lock().unwrap();
                    seen.running += 1;
                    seen.max_in_flight = seen.max_in_flight.max(seen.running);
                    if key != "-" {
                        let now = seen.in_flight.entry(key.clone()).or_default();
                        *now += 1;
                        let now = *now;
                        seen.max_in_flight_per_key = seen.max_in_flight_per_key.max(now);
                    }
                }
                // One first attempt in three fails, every key some of the time.
                let fails =
                    context.attempt() == 1 && (ping.n * 5 + key.len() as u32).is_multiple_of(3);
                async move {
                    tokio::time::sleep(Duration::from_millis(ping.work_ms)).await;
                    let mut seen = seen.lock().unwrap();
                    seen.running -= 1;
                    if key != "-" {
                        *seen.in_flight.get_mut(&key).unwrap() -= 1;
                    }
                    if fails {
                        seen.failures += 1;
                        return Err(DeliveryError::msg("injected failure"));
                    }
                    let delivered = seen.delivered.entry(key).or_default();
                    if !delivered.contains(&ping.n) {
                        delivered.push(ping.n);
                    }
                    Ok(())
                }
            })
        };
        let coordinator = DrainCoordinator::builder(store.clone())
            .registry(registry())
            .event_bus(bus)
            .config(DrainConfig {
                concurrency: 16,
                batch_size: 64,
                retry: RetryPolicy::fixed(Duration::from_millis(50)).with_max_attempts(5),
                ..DrainConfig::default()
            })
            .clock(clock.clone())
            .wake_on_insert(false)
            .start()
            .unwrap();
        for _ in 0..10_000 {
            coordinator.send(Drain).await.unwrap().unwrap();
            let stats = store.stats(clock.now()).await.unwrap();
            if stats.pending + stats.claimed == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }

        let stats = store.stats(clock.now()).await.unwrap();
        assert_eq!(
            (stats.delivered, stats.dead_lettered),
            (u64::from(KEYS * PER_KEY + KEYLESS), 0)
        );
        assert!(
            store
                .snapshot()
                .iter()
                .all(|m| m.status == MessageStatus::Delivered)
        );
        let seen = seen.lock().unwrap();
        assert!(seen.failures > 0, "some attempts failed");
        assert_eq!(
            seen.max_in_flight_per_key, 1,
            "one message per key at a time"
        );
        assert!(
            seen.max_in_flight > KEYS,
            "keyless messages ran beside the keys ({} at most)",
            seen.max_in_flight
        );
        for k in 0..KEYS {
            let key = format!("key-{k}");
            assert_eq!(
                seen.delivered[&key],
                (0..PER_KEY).collect::<Vec<_>>(),
                "{key} was first delivered out of order"
            );
        }
        assert_eq!(seen.delivered["-"].len(), KEYLESS as usize);
    });
}

/// A key's next message becomes claimable only when the one before it
/// settles, after the pass's claim for it came back empty: the pass claims
/// again then, so one `Drain` walks the whole key instead of one message per
/// tick or wake-up (PostgreSQL sends wake-ups on enqueue only).
#[test]
fn one_pass_follows_a_key_from_message_to_message() {
    run(|| async {
        const PER_KEY: u32 = 5;
        let clock = clock();
        let store = outbox::MemoryOutbox::new();
        for n in 0..PER_KEY {
            let message = NewMessage::event(&Ping {
                n,
                work_ms: 10,
                ..Ping::default()
            })
            .unwrap()
            .with_options(EnqueueOptions::new().ordering_key("order-7"))
            .at(clock.now());
            store.enqueue(message).await.unwrap();
        }
        let order = Arc::new(Mutex::new(Vec::new()));
        let bus = {
            let order = order.clone();
            InProcessBus::new().on(move |ping: Arc<Ping>, _: DeliveryContext| {
                let order = order.clone();
                async move {
                    tokio::time::sleep(Duration::from_millis(ping.work_ms)).await;
                    order.lock().unwrap().push(ping.n);
                    Ok(())
                }
            })
        };
        let coordinator = DrainCoordinator::builder(store.clone())
            .registry(registry())
            .event_bus(bus)
            .config(DrainConfig {
                concurrency: 4,
                ..DrainConfig::default()
            })
            .clock(clock.clone())
            .wake_on_insert(false)
            .start()
            .unwrap();
        let report = coordinator.send(Drain).await.unwrap().unwrap();
        assert_eq!(report.delivered, u64::from(PER_KEY), "{report}");
        assert_eq!(*order.lock().unwrap(), (0..PER_KEY).collect::<Vec<_>>());
    });
}
