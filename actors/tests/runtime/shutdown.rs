//! Shutdown: the grace period, aborting what is left, releasing its claims,
//! and refusing drains afterwards.

use std::time::Duration;

use outbox::{DrainConfig, MessageStatus};
use outbox_actors::{Drain, Error, LeaseOperation, LeaseState, Shutdown};

use crate::support::{Fault, FaultStore, Op, run};
use crate::{Harness, config, ping, report};

#[test]
fn shutdown_aborts_after_the_grace_and_releases_claims() {
    run(|| async {
        let h = Harness::start(DrainConfig {
            concurrency: 4,
            ..config()
        });
        let mut ids = Vec::new();
        for n in 0..4 {
            ids.push(h.enqueue(ping(n, 60_000)).await);
        }
        let quick = h.enqueue(ping(9, 500)).await;
        let drain = h.coordinator.send(Drain);
        tokio::time::sleep(Duration::from_secs(1)).await;
        let shutdown = h
            .coordinator
            .send(Shutdown {
                grace: Duration::from_secs(5),
            })
            .await
            .unwrap();
        assert_eq!(
            shutdown,
            report(|r| {
                r.claimed = 4;
                r.released = 4;
            })
        );
        assert_eq!(drain.await.unwrap().unwrap(), shutdown);
        assert_eq!(h.probe.aborted(), 4);
        for id in &ids {
            let message = h.message(id).await;
            assert_eq!(
                (message.status, message.attempts),
                (MessageStatus::Pending, 0)
            );
            assert!(message.claim_token.is_none());
        }
        assert_eq!(
            h.message(&quick).await.attempts,
            0,
            "never claimed after shutdown began"
        );
        assert!(
            h.coordinator.send(Drain).await.is_err(),
            "the coordinator stopped"
        );
    });
}

#[test]
fn shutdown_lets_deliveries_finish_within_the_grace() {
    run(|| async {
        let h = Harness::start(config());
        let id = h.enqueue(ping(1, 2_000)).await;
        let drain = h.coordinator.send(Drain);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let r = h
            .coordinator
            .send(Shutdown {
                grace: Duration::from_secs(5),
            })
            .await
            .unwrap();
        assert_eq!((r.delivered, r.released), (1, 0));
        assert_eq!(drain.await.unwrap().unwrap(), r);
        assert_eq!(h.status(&id).await, MessageStatus::Delivered);
    });
}

#[test]
fn drains_after_shutdown_began_are_refused() {
    run(|| async {
        let h = Harness::start(config());
        h.enqueue(ping(1, 2_000)).await;
        let first = h.coordinator.send(Drain);
        tokio::time::sleep(Duration::from_millis(1)).await;
        let queued = h.coordinator.send(Drain);
        let shutdown = h.coordinator.send(Shutdown {
            grace: Duration::from_secs(5),
        });
        tokio::time::sleep(Duration::from_millis(1)).await;
        let late = h.coordinator.send(Drain).await.unwrap();
        assert!(matches!(late, Err(Error::ShuttingDown)), "{late:?}");
        assert!(matches!(queued.await.unwrap(), Err(Error::ShuttingDown)));
        assert_eq!(first.await.unwrap().unwrap().delivered, 1);
        assert_eq!(shutdown.await.unwrap().delivered, 1);
    });
}

#[test]
fn a_claim_not_given_back_at_shutdown_is_heard_as_a_lost_lease() {
    run(|| async {
        let store = FaultStore::new();
        store.fault(Op::Release, 1, Fault::Transient);
        store.fault(Op::Release, 2, Fault::Hang);
        let h = Harness::start_with(
            store,
            DrainConfig {
                concurrency: 3,
                ..config()
            },
            |b| b,
        );
        let mut ids = Vec::new();
        for n in 0..3 {
            ids.push(h.enqueue(ping(n, 60_000)).await);
        }
        let drain = h.coordinator.send(Drain);
        tokio::time::sleep(Duration::from_secs(1)).await;
        let r = h
            .coordinator
            .send(Shutdown {
                grace: Duration::from_secs(1),
            })
            .await
            .unwrap();
        assert_eq!((r.claimed, r.released, r.lease_lost), (3, 1, 2), "{r}");
        assert_eq!(drain.await.unwrap().unwrap(), r);
        let mut lost: Vec<_> = h
            .leases()
            .into_iter()
            .map(|l| (l.operation, l.state, l.confirmed_lost, l.handler.finished()))
            .collect();
        lost.dedup();
        assert_eq!(
            lost,
            [(LeaseOperation::Release, LeaseState::Lost, false, false)],
            "one notice per claim not given back"
        );
        assert_eq!(h.leases().len(), 2);
        let mut statuses = Vec::new();
        for id in &ids {
            statuses.push(h.status(id).await);
        }
        statuses.sort_by_key(|s| format!("{s:?}"));
        assert_eq!(
            statuses,
            [
                MessageStatus::Claimed,
                MessageStatus::Claimed,
                MessageStatus::Pending
            ]
        );
    });
}
