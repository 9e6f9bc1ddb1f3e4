//! Retention: settled messages older than their horizon are deleted by the
//! coordinator in bounded batches; younger ones and live ones stay.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::Addr;
use chrono::{DateTime, Utc};
use outbox::{
    ClaimBatch, ClaimedBatch, Clock, DrainConfig, Enqueued, MarkDelivered, MarkFailed,
    MemoryOutbox, MessageStatus, NewMessage, OutboxAdmin, OutboxStore, PurgeBatch, ReleaseClaim,
    RenewClaim, Result, RetentionConfig, RetryPolicy, TokioClock, Wakeups,
};
use outbox_actors::{Drain, DrainCoordinator};

use crate::support::{clock, run, settle_mailboxes};
use crate::{Ping, Probe, bus, ping, registry};

/// A memory store that records every retention batch (its limit and how
/// many rows it deleted) and counts vacuums.
#[derive(Clone, Default)]
struct Recording {
    inner: MemoryOutbox,
    batches: Arc<Mutex<Vec<(MessageStatus, usize, u64)>>>,
    vacuums: Arc<AtomicU64>,
}

impl OutboxStore for Recording {
    async fn enqueue(&self, message: NewMessage) -> Result<Enqueued> {
        self.inner.enqueue(message).await
    }
    async fn claim_batch(&self, params: ClaimBatch) -> Result<ClaimedBatch> {
        self.inner.claim_batch(params).await
    }
    async fn renew_claim(&self, params: RenewClaim) -> Result<DateTime<Utc>> {
        self.inner.renew_claim(params).await
    }
    async fn mark_delivered(&self, params: MarkDelivered) -> Result<()> {
        self.inner.mark_delivered(params).await
    }
    async fn mark_failed(&self, params: MarkFailed) -> Result<()> {
        self.inner.mark_failed(params).await
    }
    async fn release_claim(&self, params: ReleaseClaim) -> Result<()> {
        self.inner.release_claim(params).await
    }
    fn wakeups(&self) -> Option<Wakeups> {
        OutboxStore::wakeups(&self.inner)
    }
    async fn purge_batch(&self, params: PurgeBatch) -> Result<u64> {
        let deleted = self.inner.purge_batch(params).await?;
        self.batches
            .lock()
            .unwrap()
            .push((params.status, params.limit, deleted));
        Ok(deleted)
    }
    async fn vacuum(&self) -> Result<()> {
        self.vacuums.fetch_add(1, Ordering::Relaxed);
        self.inner.vacuum().await
    }
}

fn start(
    store: &Recording,
    clock: &TokioClock,
    retention: RetentionConfig,
) -> Addr<DrainCoordinator> {
    let config = DrainConfig {
        retry: RetryPolicy::fixed(Duration::from_secs(5)),
        retention,
        ..DrainConfig::default()
    };
    DrainCoordinator::builder(store.clone())
        .registry(registry())
        .event_bus(bus(&Probe::default(), clock))
        .config(config)
        .clock(clock.clone())
        .wake_on_insert(false)
        .start()
        .unwrap()
}

async fn enqueue(store: &Recording, clock: &TokioClock, ping: Ping, max_attempts: u32) -> String {
    let message = NewMessage::event(&ping)
        .unwrap()
        .with_max_attempts(max_attempts)
        .at(clock.now());
    store.enqueue(message).await.unwrap().into_id()
}

async fn ids(store: &Recording) -> Vec<String> {
    let mut ids: Vec<String> = store.inner.snapshot().into_iter().map(|m| m.id).collect();
    ids.sort();
    ids
}

async fn wait(duration: Duration) {
    tokio::time::sleep(duration).await;
    settle_mailboxes().await;
}

#[test]
fn settled_messages_past_their_horizon_go_in_bounded_batches() {
    run(|| async {
        let store = Recording::default();
        let clock = clock();
        let coordinator = start(
            &store,
            &clock,
            RetentionConfig {
                delivered: Some(Duration::from_secs(3_600)),
                dead_lettered: Some(Duration::from_secs(2 * 3_600)),
                batch_size: 3,
                every: Duration::from_secs(60),
                ..RetentionConfig::default()
            },
        );
        for n in 0..7 {
            enqueue(&store, &clock, ping(n, 0), 5).await;
        }
        let failing = Ping {
            fail: Some("refused".into()),
            ..ping(99, 0)
        };
        let dead = enqueue(&store, &clock, failing, 1).await;
        let report = coordinator.send(Drain).await.unwrap().unwrap();
        assert_eq!((report.delivered, report.dead_lettered), (7, 1));

        // Half an hour on: every run found nothing old enough.
        wait(Duration::from_secs(30 * 60)).await;
        let mut young = Vec::new();
        for n in 10..13 {
            young.push(enqueue(&store, &clock, ping(n, 0), 5).await);
        }
        let report = coordinator.send(Drain).await.unwrap().unwrap();
        assert_eq!(report.delivered, 3);
        let late = enqueue(&store, &clock, ping(21, 0), 5).await;
        assert_eq!(ids(&store).await.len(), 12, "nothing deleted yet");
        assert!(store.batches.lock().unwrap().iter().all(|b| b.2 == 0));

        // Past an hour from the first deliveries: those seven go, three
        // rows at most per statement; the younger ones and the dead letter
        // stay, and so does the pending message.
        wait(Duration::from_secs(31 * 60)).await;
        let mut expected: Vec<String> = young.clone();
        expected.extend([dead.clone(), late.clone()]);
        expected.sort();
        assert_eq!(ids(&store).await, expected);
        let batches = store.batches.lock().unwrap().clone();
        assert!(
            batches
                .iter()
                .all(|&(_, limit, deleted)| limit == 3 && deleted <= 3),
            "{batches:?}"
        );
        let delivered: Vec<u64> = batches
            .iter()
            .filter(|b| b.0 == MessageStatus::Delivered && b.2 > 0)
            .map(|b| b.2)
            .collect();
        assert_eq!(delivered, [3, 3, 1], "{batches:?}");
        assert_eq!(
            store.inner.get_message(&late).await.unwrap().status,
            MessageStatus::Pending
        );

        // Past two hours: the dead letter goes, and the later deliveries.
        wait(Duration::from_secs(60 * 60)).await;
        let left = ids(&store).await;
        assert_eq!(left.len(), 1, "{left:?}");
        assert_eq!(left[0], late);
    });
}

#[test]
fn delete_on_delivery_removes_delivered_messages_at_the_next_run() {
    run(|| async {
        let store = Recording::default();
        let clock = clock();
        let coordinator = start(
            &store,
            &clock,
            RetentionConfig {
                delete_on_delivery: true,
                every: Duration::from_secs(10),
                ..RetentionConfig::default()
            },
        );
        for n in 0..5 {
            enqueue(&store, &clock, ping(n, 0), 5).await;
        }
        let failing = Ping {
            fail: Some("refused".into()),
            ..ping(99, 0)
        };
        let dead = enqueue(&store, &clock, failing, 1).await;
        coordinator.send(Drain).await.unwrap().unwrap();
        wait(Duration::from_secs(11)).await;
        assert_eq!(ids(&store).await, [dead], "dead letters are kept");
    });
}

#[test]
fn delete_on_delivery_deletes_each_message_as_it_settles() {
    run(|| async {
        let store = Recording::default();
        let clock = clock();
        let coordinator = start(
            &store,
            &clock,
            RetentionConfig {
                delete_on_delivery: true,
                every: Duration::from_secs(10),
                vacuum_after: 4,
                ..RetentionConfig::default()
            },
        );
        for n in 0..5 {
            enqueue(&store, &clock, ping(n, 0), 5).await;
        }
        let failing = Ping {
            fail: Some("refused".into()),
            ..ping(99, 0)
        };
        let dead = enqueue(&store, &clock, failing, 1).await;
        let report = coordinator.send(Drain).await.unwrap().unwrap();
        assert_eq!((report.delivered, report.dead_lettered), (5, 1));
        // Gone as they settled, before any retention run.
        assert_eq!(ids(&store).await, std::slice::from_ref(&dead));
        assert!(store.batches.lock().unwrap().is_empty());
        assert_eq!(store.vacuums.load(Ordering::Relaxed), 0);

        // The next run finds nothing to delete, but five rows went since
        // the store was last vacuumed: it vacuums, once.
        wait(Duration::from_secs(11)).await;
        let batches = store.batches.lock().unwrap().clone();
        assert!(batches.iter().all(|b| b.2 == 0), "{batches:?}");
        assert_eq!(store.vacuums.load(Ordering::Relaxed), 1);
        wait(Duration::from_secs(20)).await;
        assert_eq!(store.vacuums.load(Ordering::Relaxed), 1);
        assert_eq!(ids(&store).await, [dead]);
    });
}

#[test]
fn vacuum_after_zero_never_vacuums() {
    run(|| async {
        let store = Recording::default();
        let clock = clock();
        let coordinator = start(
            &store,
            &clock,
            RetentionConfig {
                delete_on_delivery: true,
                every: Duration::from_secs(10),
                vacuum_after: 0,
                ..RetentionConfig::default()
            },
        );
        for n in 0..5 {
            enqueue(&store, &clock, ping(n, 0), 5).await;
        }
        coordinator.send(Drain).await.unwrap().unwrap();
        wait(Duration::from_secs(31)).await;
        assert!(ids(&store).await.is_empty());
        assert_eq!(store.vacuums.load(Ordering::Relaxed), 0);
    });
}
