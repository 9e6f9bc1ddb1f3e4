//! Settlement: the fenced write after delivery, its retries and deadline,
//! and a claim lost while settling.

use std::sync::atomic::Ordering;
use std::time::Duration;

use outbox::{Clock, DrainConfig, MessageStatus, NewMessage, OutboxStore};
use outbox_actors::{
    DrainReport, Error, LeaseOperation, LeaseState, OutcomeNotice, SettleOperation,
};

use crate::support::{self, Fault, FaultStore, Op, run};
use crate::{Counting, Harness, Ping, config, ping, report};

#[test]
fn confirmed_loss_at_the_extension_settles_nothing_and_says_the_handler_succeeded() {
    run(|| async {
        let store = FaultStore::new();
        store.fault(Op::Deliver, 1, Fault::Claim);
        let h = Harness::start_with(store, config(), |b| b);
        h.enqueue(ping(1, 1_000)).await;
        let r = h.drain().await;
        // A failed acknowledgement after the handler finished, with the
        // claim lost: counted as the reference counts one.
        assert_eq!(
            r,
            report(|r| {
                r.claimed = 1;
                r.settlement_failed = 1;
                r.lease_lost = 1;
            })
        );
        assert_eq!(h.probe.completed().len(), 1, "the handler finished");
        assert_eq!(
            h.store.calls(Op::Deliver),
            1,
            "the refused extension write is not retried"
        );
        let leases = h.leases();
        assert_eq!(
            (leases[0].operation, leases[0].state),
            (LeaseOperation::Renew, LeaseState::Lost)
        );
        assert!(leases[0].confirmed_lost && leases[0].error.is_claim_lost());
        assert!(
            leases[0].handler.finished() && leases[0].handler.succeeded(),
            "{:?}",
            leases[0].handler
        );
        let outcomes = h.recorder.outcomes();
        let [OutcomeNotice::SettlementFailed(failure)] = &outcomes[..] else {
            panic!("{outcomes:?}")
        };
        assert!(failure.claim_lost && failure.delivery_succeeded && failure.error.is_claim_lost());
    });
}

#[test]
fn a_failed_handler_whose_extension_is_refused_says_how_it_failed() {
    run(|| async {
        let counting = Counting::default();
        let observer = counting.clone();
        let store = FaultStore::new();
        store.fault(Op::Fail, 1, Fault::Claim);
        let h = Harness::start_with(store, config(), move |b| b.observer(observer));
        h.enqueue(Ping {
            fail: Some("downstream said no".into()),
            ..ping(1, 10)
        })
        .await;
        let r = h.drain().await;
        assert_eq!((r.settlement_failed, r.lease_lost, r.retried), (1, 1, 0));
        let leases = h.leases();
        let [lost] = &leases[..] else {
            panic!("{leases:?}")
        };
        assert_eq!(lost.state, LeaseState::Lost);
        assert!(lost.handler.finished() && !lost.handler.succeeded());
        assert_eq!(
            lost.handler.error().map(ToString::to_string).as_deref(),
            Some("downstream said no")
        );
        let outcomes = h.recorder.outcomes();
        let [OutcomeNotice::SettlementFailed(failure)] = &outcomes[..] else {
            panic!("{outcomes:?}")
        };
        assert!(failure.claim_lost && !failure.delivery_succeeded);
        assert_eq!(failure.operation, SettleOperation::MarkFailed);
        // Every observer hears it once: the lease, the handler's error,
        // and the acknowledgement that could not be stored.
        assert_eq!(counting.leases.load(Ordering::SeqCst), 1);
        assert_eq!(counting.errors.load(Ordering::SeqCst), 1);
        assert_eq!(counting.settlements.load(Ordering::SeqCst), 1);
    });
}

#[test]
fn confirmed_loss_at_settlement_counts_settlement_failed_and_lease_lost() {
    run(|| async {
        let store = FaultStore::new();
        store.fault(Op::Deliver, 1, Fault::Transient);
        store.fault(Op::Deliver, 2, Fault::Claim);
        let h = Harness::start_with(store, config(), |b| b);
        h.enqueue(ping(1, 10)).await;
        let r = h.drain().await;
        assert_eq!(
            r,
            report(|r| {
                r.claimed = 1;
                r.settlement_failed = 1;
                r.lease_lost = 1;
            })
        );
        assert_eq!(
            h.store.calls(Op::Deliver),
            2,
            "a claim error is never retried"
        );
        let outcomes = h.recorder.outcomes();
        let OutcomeNotice::SettlementFailed(failure) = &outcomes[0] else {
            panic!("{outcomes:?}")
        };
        assert!(failure.claim_lost && failure.delivery_succeeded && failure.error.is_claim_lost());
    });
}

#[test]
fn settlement_that_misses_its_deadline_is_claim_loss() {
    run(|| async {
        let store = FaultStore::new();
        store.fault(Op::Deliver, 1, Fault::Transient);
        store.always(Op::Deliver, Fault::Hang);
        let h = Harness::start_with(
            store,
            DrainConfig {
                batch_size: 1,
                ..config()
            },
            |b| b,
        );
        h.enqueue(ping(1, 10)).await;
        let started = h.clock.now();
        let r = h.drain().await;
        assert_eq!((r.settlement_failed, r.lease_lost), (1, 1));
        // The extension failed, so the claim's own lease, to 30 s, is the
        // deadline.
        assert_eq!((h.clock.now() - started).num_milliseconds(), 30_000);
        let outcomes = h.recorder.outcomes();
        let OutcomeNotice::SettlementFailed(failure) = &outcomes[0] else {
            panic!("{outcomes:?}")
        };
        assert!(
            matches!(failure.error, Error::LeaseLost(_)),
            "{:?}",
            failure.error
        );
    });
}

#[test]
fn an_extension_that_misses_its_deadline_is_unconfirmed_loss() {
    run(|| async {
        let store = FaultStore::new();
        store.always(Op::Deliver, Fault::Hang);
        let h = Harness::start_with(store, config(), |b| b);
        h.enqueue(ping(1, 10)).await;
        let started = h.clock.now();
        let r = h.drain().await;
        assert_eq!((r.settlement_failed, r.lease_lost), (1, 1));
        assert_eq!((h.clock.now() - started).num_milliseconds(), 30_000);
        let leases = h.leases();
        assert_eq!(
            (leases[0].operation, leases[0].state),
            (LeaseOperation::Renew, LeaseState::Lost)
        );
        assert!(!leases[0].confirmed_lost);
        assert!(leases[0].handler.succeeded(), "the handler had finished");
        assert_eq!(h.store.calls(Op::Deliver), 1);
    });
}

#[test]
fn settlement_retries_with_doubling_delay_then_gives_up() {
    run(|| async {
        let store = FaultStore::new();
        store.always(Op::Deliver, Fault::Transient);
        let h = Harness::start_with(store, config(), |b| b);
        let id = h.enqueue(ping(1, 10)).await;
        let r = h.drain().await;
        assert_eq!((r.settlement_failed, r.lease_lost, r.delivered), (1, 0, 0));
        let times: Vec<i64> = h
            .store
            .log()
            .iter()
            .filter(|c| c.op == Op::Deliver)
            .map(|c| (c.now - support::epoch()).num_milliseconds())
            .collect();
        assert_eq!(times, [10, 110, 310]);
        assert_eq!(
            h.status(&id).await,
            MessageStatus::Claimed,
            "claimable after its lease"
        );
    });
}

#[test]
fn a_failing_delivery_is_retried_then_dead_lettered() {
    run(|| async {
        let counting = Counting::default();
        let observer = counting.clone();
        let h = Harness::start_with(FaultStore::new(), config(), move |b| b.observer(observer));
        let id = h
            .store
            .enqueue(
                NewMessage::event(&Ping {
                    fail: Some("downstream said no".into()),
                    ..ping(1, 5)
                })
                .unwrap()
                .with_max_attempts(2)
                .at(h.clock.now()),
            )
            .await
            .unwrap()
            .into_id();
        assert_eq!(h.drain().await.retried, 1);
        assert_eq!(
            h.drain().await,
            DrainReport::default(),
            "not due before its retry time"
        );
        tokio::time::sleep(Duration::from_secs(5)).await;
        let r = h.drain().await;
        assert_eq!(
            (r.claimed, r.dead_lettered, r.abandoned_dead_lettered),
            (1, 1, 0)
        );
        assert_eq!(counting.errors.load(Ordering::SeqCst), 2);
        let dead = counting.dead_letters.lock().unwrap().clone();
        assert!(!dead[0].abandoned && dead[0].error.message == "downstream said no");
        let message = h.message(&id).await;
        assert_eq!(
            (message.status, message.attempts),
            (MessageStatus::DeadLettered, 2)
        );
    });
}
