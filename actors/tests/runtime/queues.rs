//! Named queues, pausing them and cancelling messages, on virtual time, over
//! the memory store: each queue runs at its own concurrency and under its
//! own retry policy; a paused queue's running deliveries settle while
//! nothing more is claimed from it, other queues go on, and a resume wakes
//! the drain; a handler sees a cancellation at the next renewal, a failure
//! after it ends the message cancelled and a success delivers it; an
//! expired claim with a request is cancelled at claim.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use outbox::{
    CancelMessages, ClaimBatch, Clock, DeliveryContext, DeliveryError, DrainConfig, EnqueueOptions,
    InProcessBus, MemoryOutbox, MessageStatus, NewMessage, OutboxAdmin, OutboxStore, PauseQueue,
    QueueConfig, RetryPolicy, TokioClock,
};
use outbox_actors::{Drain, DrainCoordinator, DrainCoordinatorBuilder, OutcomeNotice};

use crate::support::{Recorder, clock, run};
use crate::{Ping, ping, registry, report, settle};

/// How many handlers of each queue ran at once, at most, and which
/// messages each queue's handlers ran, in start order.
#[derive(Clone, Default)]
struct PerQueue {
    running: Arc<Mutex<HashMap<String, usize>>>,
    most: Arc<Mutex<HashMap<String, usize>>>,
    ran: Arc<Mutex<Vec<String>>>,
}

impl PerQueue {
    fn most(&self, queue: &str) -> usize {
        self.most.lock().unwrap().get(queue).copied().unwrap_or(0)
    }
}

/// A bus whose handler works `work_ms` and, when the ping says `fail`,
/// fails; with `cooperative`, it stops early and fails when the message is
/// cancelled.
fn bus(per_queue: &PerQueue, cooperative: bool) -> InProcessBus {
    let per_queue = per_queue.clone();
    InProcessBus::new().on(move |ping: Arc<Ping>, context: DeliveryContext| {
        let per_queue = per_queue.clone();
        let queue = context.message().queue.clone();
        {
            let mut running = per_queue.running.lock().unwrap();
            let now = running.entry(queue.clone()).or_default();
            *now += 1;
            let mut most = per_queue.most.lock().unwrap();
            let most = most.entry(queue.clone()).or_default();
            *most = (*most).max(*now);
            per_queue.ran.lock().unwrap().push(context.id().to_owned());
        }
        async move {
            let work = tokio::time::sleep(Duration::from_millis(ping.work_ms));
            let cancelled = if cooperative {
                tokio::select! {
                    () = work => false,
                    () = context.cancelled() => true,
                }
            } else {
                work.await;
                false
            };
            *per_queue.running.lock().unwrap().get_mut(&queue).unwrap() -= 1;
            if cancelled {
                return Err(DeliveryError::msg("stopped: the message was cancelled"));
            }
            match &ping.fail {
                Some(reason) => Err(DeliveryError::msg(reason)),
                None => Ok(()),
            }
        }
    })
}

/// A coordinator over `store`, as `customize` adds to it, with a recorder
/// of outcome notices.
fn start(
    store: &MemoryOutbox,
    clock: &TokioClock,
    per_queue: &PerQueue,
    cooperative: bool,
    config: DrainConfig,
    customize: impl FnOnce(DrainCoordinatorBuilder) -> DrainCoordinatorBuilder,
) -> (Addr<DrainCoordinator>, Recorder) {
    let recorder = Recorder::default();
    let builder = DrainCoordinator::builder(store.clone())
        .registry(registry())
        .event_bus(bus(per_queue, cooperative))
        .config(config)
        .clock(clock.clone())
        .subscribe_outcomes(recorder.clone().start().recipient());
    (customize(builder).start().unwrap(), recorder)
}

async fn put(store: &MemoryOutbox, clock: &TokioClock, ping: Ping, queue: &str) -> String {
    let message = NewMessage::event(&ping)
        .unwrap()
        .with_options(EnqueueOptions::new().queue(queue))
        .at(clock.now());
    store.enqueue(message).await.unwrap().into_id()
}

fn config() -> DrainConfig {
    DrainConfig {
        batch_size: 20,
        retry: RetryPolicy::fixed(Duration::from_secs(5)),
        ..DrainConfig::default()
    }
}

#[test]
fn queues_each_queue_runs_at_its_own_concurrency() {
    run(|| async {
        let (store, clock, per_queue) = (MemoryOutbox::new(), clock(), PerQueue::default());
        let (coordinator, _) = start(&store, &clock, &per_queue, false, config(), |b| {
            b.queue("slow", QueueConfig::new(1))
                .queue("fast", QueueConfig::new(3))
        });
        for n in 0..4 {
            put(&store, &clock, ping(n, 100), "slow").await;
            put(&store, &clock, ping(10 + n, 100), "fast").await;
        }
        let elsewhere = put(&store, &clock, ping(99, 100), "default").await;
        let started = tokio::time::Instant::now();
        let mut report = coordinator.send(Drain).await.unwrap().unwrap();
        while report.delivered < 8 {
            report += coordinator.send(Drain).await.unwrap().unwrap();
        }
        assert_eq!(report.delivered, 8);
        assert_eq!(per_queue.most("slow"), 1);
        assert_eq!(per_queue.most("fast"), 3);
        // The slow queue's four run one after another; the fast queue's
        // beside them.
        assert_eq!(started.elapsed(), Duration::from_millis(400));
        // A queue the drain does not serve is left to drains that do.
        let waiting = store.get_message(&elsewhere).await.unwrap();
        assert_eq!(waiting.status, MessageStatus::Pending);
    });
}

#[test]
fn queues_a_queues_retry_policy_governs_its_messages() {
    run(|| async {
        let (store, clock, per_queue) = (MemoryOutbox::new(), clock(), PerQueue::default());
        let once = RetryPolicy::fixed(Duration::from_secs(5)).with_max_attempts(1);
        let (coordinator, _) = start(&store, &clock, &per_queue, false, config(), |b| {
            b.queue("default", QueueConfig::new(2))
                .queue("strict", QueueConfig::new(2).retry(once))
        });
        let failing = || Ping {
            fail: Some("no".into()),
            ..ping(0, 10)
        };
        let strict = put(&store, &clock, failing(), "strict").await;
        let lenient = put(&store, &clock, failing(), "default").await;
        let r = coordinator.send(Drain).await.unwrap().unwrap();
        assert_eq!(
            r,
            report(|r| {
                r.claimed = 2;
                r.retried = 1;
                r.dead_lettered = 1;
            })
        );
        let status = |id: String| {
            let store = store.clone();
            async move { store.get_message(&id).await.unwrap().status }
        };
        assert_eq!(status(strict).await, MessageStatus::DeadLettered);
        assert_eq!(status(lenient).await, MessageStatus::Pending);
    });
}

#[test]
fn pause_a_paused_queue_settles_what_runs_and_claims_nothing_more() {
    run(|| async {
        let (store, clock, per_queue) = (MemoryOutbox::new(), clock(), PerQueue::default());
        let (coordinator, _) = start(&store, &clock, &per_queue, false, config(), |b| {
            b.queue("a", QueueConfig::new(1))
                .queue("b", QueueConfig::new(1))
        });
        let running = put(&store, &clock, ping(0, 1_000), "a").await;
        let drain = coordinator.send(Drain);
        // The first handler of `a` runs; the queue is paused meanwhile.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let paused = store
            .pause_queue(PauseQueue {
                queue: "a".into(),
                now: clock.now(),
            })
            .await
            .unwrap();
        assert!(paused);
        let held = put(&store, &clock, ping(1, 10), "a").await;
        let other = put(&store, &clock, ping(2, 10), "b").await;
        // The running delivery, and `b`'s message, claimed on the wake-up
        // its enqueue sent.
        let r = drain.await.unwrap().unwrap();
        assert_eq!(r.delivered, 2, "{r}");
        // Its running delivery settled as usual; `b` goes on, `a` waits.
        let r = coordinator.send(Drain).await.unwrap().unwrap();
        assert_eq!(r.claimed, 0, "{r}");
        let status = |id: &str| {
            let (store, id) = (store.clone(), id.to_owned());
            async move { store.get_message(&id).await.unwrap().status }
        };
        assert_eq!(status(&running).await, MessageStatus::Delivered);
        assert_eq!(status(&other).await, MessageStatus::Delivered);
        assert_eq!(status(&held).await, MessageStatus::Pending);
        // A resume wakes the drain: no `Drain` is sent.
        assert!(store.resume_queue("a").await.unwrap());
        tokio::time::sleep(Duration::from_millis(100)).await;
        settle().await;
        assert_eq!(status(&held).await, MessageStatus::Delivered);
    });
}

/// A lease of 3 s renewed every second: a cancellation reaches the handler
/// within a second.
fn renewing() -> DrainConfig {
    DrainConfig {
        lease: Duration::from_secs(3),
        ..config()
    }
}

#[test]
fn cancel_a_handler_sees_it_and_its_failure_ends_the_message_cancelled() {
    run(|| async {
        let (store, clock, per_queue) = (MemoryOutbox::new(), clock(), PerQueue::default());
        let (coordinator, recorder) = start(&store, &clock, &per_queue, true, renewing(), |b| b);
        let id = put(&store, &clock, ping(0, 60_000), "default").await;
        let drain = coordinator.send(Drain);
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        let requested = store
            .cancel_messages(CancelMessages::id(&id, clock.now()))
            .await
            .unwrap();
        assert_eq!(requested.requested, 1);
        let started = tokio::time::Instant::now();
        let r = drain.await.unwrap().unwrap();
        // Heard at the renewal at 2 s, half a second after the request.
        assert_eq!(started.elapsed(), Duration::from_millis(500));
        assert_eq!(
            r,
            report(|r| {
                r.claimed = 1;
                r.cancelled = 1;
            })
        );
        let message = store.get_message(&id).await.unwrap();
        assert_eq!(message.status, MessageStatus::Cancelled);
        assert!(message.cancel_requested_at.is_some());
        settle().await;
        let notices = recorder.outcomes();
        assert!(
            matches!(&notices[..], [OutcomeNotice::Cancelled(c)] if c.id == id && !c.at_claim),
            "{notices:?}"
        );
        // It never runs again.
        tokio::time::sleep(Duration::from_secs(60)).await;
        let r = coordinator.send(Drain).await.unwrap().unwrap();
        assert_eq!(r.claimed, 0);
        assert_eq!(per_queue.ran.lock().unwrap().len(), 1);
    });
}

#[test]
fn cancel_a_handler_that_succeeds_anyway_delivers_the_message() {
    run(|| async {
        let (store, clock, per_queue) = (MemoryOutbox::new(), clock(), PerQueue::default());
        // This handler does not look at the cancellation.
        let (coordinator, _) = start(&store, &clock, &per_queue, false, renewing(), |b| b);
        let id = put(&store, &clock, ping(0, 5_000), "default").await;
        let drain = coordinator.send(Drain);
        tokio::time::sleep(Duration::from_millis(500)).await;
        store
            .cancel_messages(CancelMessages::id(&id, clock.now()))
            .await
            .unwrap();
        let r = drain.await.unwrap().unwrap();
        assert_eq!(r.delivered, 1, "{r}");
        assert_eq!(r.cancelled, 0);
        let message = store.get_message(&id).await.unwrap();
        assert_eq!(message.status, MessageStatus::Delivered);
    });
}

#[test]
fn cancel_an_expired_claim_with_a_request_is_cancelled_at_claim() {
    run(|| async {
        let (store, clock, per_queue) = (MemoryOutbox::new(), clock(), PerQueue::default());
        let id = put(&store, &clock, ping(0, 10), "default").await;
        // A worker that claimed it and went away.
        let claimed = store
            .claim_batch(ClaimBatch {
                on_dead_letter: Default::default(),
                limit: 1,
                now: clock.now(),
                lease: Duration::from_secs(3),
                max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
                queues: Vec::new(),
                durable: true,
            })
            .await
            .unwrap();
        assert_eq!(claimed.claimed.len(), 1);
        store
            .cancel_messages(CancelMessages::id(&id, clock.now()))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(4)).await;
        let (coordinator, recorder) = start(&store, &clock, &per_queue, false, config(), |b| b);
        let r = coordinator.send(Drain).await.unwrap().unwrap();
        assert_eq!(
            r,
            report(|r| {
                r.cancelled = 1;
                r.cancelled_at_claim = 1;
            })
        );
        assert_eq!(r.selected(), 1);
        settle().await;
        let notices = recorder.outcomes();
        assert!(
            matches!(&notices[..], [OutcomeNotice::Cancelled(c)] if c.at_claim),
            "{notices:?}"
        );
        assert!(per_queue.ran.lock().unwrap().is_empty());
    });
}
