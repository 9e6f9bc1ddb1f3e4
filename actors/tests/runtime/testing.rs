//! The helpers of `outbox_actors::testing` (feature `testing`), used as an
//! application's tests use them: a paused system, draining until idle
//! across retries and delays, the recording handler, the enqueue
//! assertions.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use chrono::{TimeZone, Utc};
use outbox::{
    Clock, DeliveryContext, DeliveryError, DrainConfig, EnqueueOptions, Event, InProcessBus,
    InProcessJobs, Job, MemoryOutbox, NewMessage, OutboxStore, RetryPolicy, TokioClock,
};
use outbox_actors::DrainCoordinator;
use outbox_actors::testing::{
    RecordingHandler, assert_enqueued, assert_job_enqueued, drain_until_idle, enqueued,
    enqueued_jobs, run_paused,
};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct OrderPlaced {
    order_id: u64,
}

impl Event for OrderPlaced {
    const NAME: &'static str = "order.placed";
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct SendReceipt {
    order_id: u64,
}

impl Job for SendReceipt {
    const NAME: &'static str = "receipt.send";
}

fn clock() -> TokioClock {
    TokioClock::starting_at(Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap())
}

#[test]
fn testing_drain_until_idle_waits_out_a_retrys_backoff() {
    run_paused(async {
        let store = MemoryOutbox::new();
        let clock = clock();
        let recorder = RecordingHandler::new();
        let attempts = Arc::new(AtomicU32::new(0));
        let flaky = attempts.clone();
        let jobs = InProcessJobs::new().on(move |_: SendReceipt, context: DeliveryContext| {
            flaky.fetch_add(1, Ordering::SeqCst);
            async move {
                if context.attempt() == 1 {
                    return Err(DeliveryError::msg("the mail server is down"));
                }
                Ok(())
            }
        });
        let coordinator = DrainCoordinator::builder(store.clone())
            .event_bus(InProcessBus::new().on(recorder.event::<OrderPlaced>()))
            .job_dispatcher(jobs)
            .config(DrainConfig {
                retry: RetryPolicy::fixed(Duration::from_secs(10 * 60)),
                ..DrainConfig::default()
            })
            .clock(clock.clone())
            .start()
            .unwrap();
        let now = clock.now();
        store
            .enqueue(
                NewMessage::event(&OrderPlaced { order_id: 7 })
                    .unwrap()
                    .at(now),
            )
            .await
            .unwrap();
        store
            .enqueue(
                NewMessage::job(&SendReceipt { order_id: 7 })
                    .unwrap()
                    .at(now),
            )
            .await
            .unwrap();

        let started = tokio::time::Instant::now();
        let report = drain_until_idle(&coordinator, &store, &clock, Duration::from_secs(3600))
            .await
            .unwrap();
        assert_eq!(report.delivered, 2);
        assert_eq!(report.retried, 1);
        assert_eq!(attempts.load(Ordering::SeqCst), 2);
        assert!(
            started.elapsed() >= Duration::from_secs(10 * 60),
            "it waited out the backoff on virtual time"
        );
        assert_eq!(
            recorder
                .received::<OrderPlaced>()
                .iter()
                .map(|order| order.order_id)
                .collect::<Vec<_>>(),
            [7]
        );
        assert_eq!(recorder.len(), 1);
        assert_eq!(recorder.messages()[0].name, "order.placed");
    });
}

#[test]
fn testing_drain_until_idle_leaves_what_is_due_past_its_horizon() {
    run_paused(async {
        let store = MemoryOutbox::new();
        let clock = clock();
        let recorder = RecordingHandler::new();
        let coordinator = DrainCoordinator::builder(store.clone())
            .event_bus(InProcessBus::new().on(recorder.event::<OrderPlaced>()))
            .clock(clock.clone())
            .start()
            .unwrap();
        let now = clock.now();
        for (order_id, delay) in [(1, 30 * 60), (2, 2 * 3600)] {
            let message = NewMessage::event(&OrderPlaced { order_id })
                .unwrap()
                .at(now)
                .with_options(EnqueueOptions::new().delay(Duration::from_secs(delay)));
            store.enqueue(message).await.unwrap();
        }
        let report = drain_until_idle(&coordinator, &store, &clock, Duration::from_secs(3600))
            .await
            .unwrap();
        assert_eq!(report.delivered, 1, "the one due within the hour");
        assert_eq!(recorder.received::<OrderPlaced>()[0].order_id, 1);
        assert_eq!(
            enqueued::<OrderPlaced>(&store).await.len(),
            2,
            "both stay stored"
        );
    });
}

#[test]
fn testing_recording_handler_records_by_type() {
    run_paused(async {
        let store = MemoryOutbox::new();
        let clock = clock();
        let recorder = RecordingHandler::new();
        let coordinator = DrainCoordinator::builder(store.clone())
            .event_bus(InProcessBus::new().on(recorder.event::<OrderPlaced>()))
            .job_dispatcher(InProcessJobs::new().on(recorder.job::<SendReceipt>()))
            .clock(clock.clone())
            .start()
            .unwrap();
        let now = clock.now();
        for order_id in [1, 2] {
            store
                .enqueue(
                    NewMessage::event(&OrderPlaced { order_id })
                        .unwrap()
                        .at(now),
                )
                .await
                .unwrap();
        }
        store
            .enqueue(
                NewMessage::job(&SendReceipt { order_id: 3 })
                    .unwrap()
                    .at(now),
            )
            .await
            .unwrap();
        drain_until_idle(&coordinator, &store, &clock, Duration::ZERO)
            .await
            .unwrap();
        let mut orders: Vec<u64> = recorder
            .received::<OrderPlaced>()
            .iter()
            .map(|order| order.order_id)
            .collect();
        orders.sort();
        assert_eq!(orders, [1, 2]);
        assert_eq!(
            recorder.received::<SendReceipt>().as_slice(),
            [Arc::new(SendReceipt { order_id: 3 })]
        );
        assert_eq!(recorder.len(), 3);
        recorder.clear();
        assert!(recorder.is_empty());
    });
}

#[test]
fn testing_assertions_find_messages_by_type_and_payload() {
    run_paused(async {
        let store = MemoryOutbox::new();
        for order_id in [1, 2] {
            store
                .enqueue(NewMessage::event(&OrderPlaced { order_id }).unwrap())
                .await
                .unwrap();
        }
        store
            .enqueue(NewMessage::job(&SendReceipt { order_id: 2 }).unwrap())
            .await
            .unwrap();
        assert_eq!(
            assert_enqueued::<OrderPlaced>(&store, |order| order.order_id == 2).await,
            OrderPlaced { order_id: 2 }
        );
        assert_eq!(
            assert_job_enqueued::<SendReceipt>(&store, |_| true).await,
            SendReceipt { order_id: 2 }
        );
        assert_eq!(
            enqueued::<OrderPlaced>(&store).await,
            [OrderPlaced { order_id: 1 }, OrderPlaced { order_id: 2 }]
        );
        assert_eq!(enqueued_jobs::<SendReceipt>(&store).await.len(), 1);
    });
}

#[test]
#[should_panic(expected = "no event \"order.placed\" that matches was enqueued")]
fn testing_assert_enqueued_panics_with_what_is_stored() {
    run_paused(async {
        let store = MemoryOutbox::new();
        store
            .enqueue(NewMessage::event(&OrderPlaced { order_id: 1 }).unwrap())
            .await
            .unwrap();
        assert_enqueued::<OrderPlaced>(&store, |order| order.order_id == 9).await;
    });
}
