//! Keeping the lease: renewals, their failures and losses, the hand-over
//! of the last confirmed lease, `max_active`, and what subscribers hear.

use std::time::Duration;

use actix::prelude::*;
use outbox::{Clock, DrainConfig, MessageKind, MessageStatus};
use outbox_actors::{Error, LeaseOperation, LeaseState, Subscribe};

use crate::support::{self, Fault, FaultStore, Op, Recorder, run};
use crate::{Harness, config, ping, report, settle};

#[test]
fn renewal_recovered_after_a_transient_failure() {
    run(|| async {
        let store = FaultStore::new();
        store.fault(Op::Renew, 1, Fault::Transient);
        let h = Harness::start_with(store, config(), |b| b);
        let id = h.enqueue(ping(1, 25_000)).await;
        let r = h.drain().await;
        assert_eq!(r.delivered, 1);
        let leases = h.leases();
        assert_eq!(leases.len(), 1, "{leases:?}");
        assert_eq!(leases[0].state, LeaseState::Recovered);
        assert_eq!(leases[0].operation, LeaseOperation::Renew);
        assert!(!leases[0].confirmed_lost);
        assert_eq!(h.status(&id).await, MessageStatus::Delivered);
        // First renewal at 10 s failed; the retry came after a third of the
        // 20 s left (not a full heartbeat), then renewals went on normally.
        let renewals: Vec<_> = h
            .store
            .log()
            .into_iter()
            .filter(|c| c.op == Op::Renew)
            .collect();
        let offsets: Vec<i64> = renewals
            .iter()
            .map(|c| (c.now - support::epoch()).num_milliseconds())
            .collect();
        assert_eq!(&offsets[..2], &[10_000, 16_667], "{offsets:?}");
    });
}

#[test]
fn renewal_degraded_when_the_final_extension_fails() {
    run(|| async {
        let store = FaultStore::new();
        // The extension is the first settlement write.
        store.fault(Op::Deliver, 1, Fault::Transient);
        let h = Harness::start_with(store, config(), |b| b);
        let id = h.enqueue(ping(1, 1_000)).await;
        let r = h.drain().await;
        assert_eq!(r.delivered, 1);
        let leases = h.leases();
        assert_eq!(leases.len(), 1);
        assert_eq!(
            (leases[0].state, leases[0].operation),
            (LeaseState::Degraded, LeaseOperation::Renew)
        );
        assert_eq!(h.status(&id).await, MessageStatus::Delivered);
        // Settled under the claim's first lease, on the second attempt.
        let writes: Vec<i64> = h
            .store
            .log()
            .iter()
            .filter(|c| c.op == Op::Deliver)
            .map(|c| (c.now - support::epoch()).num_milliseconds())
            .collect();
        assert_eq!(writes, [1_000, 1_100]);
        assert_eq!(h.store.calls(Op::Renew), 0);
    });
}

#[test]
fn renewal_recovered_when_the_extension_succeeds() {
    run(|| async {
        let store = FaultStore::new();
        store.fault(Op::Renew, 1, Fault::Transient);
        let h = Harness::start_with(store, config(), |b| b);
        h.enqueue(ping(1, 12_000)).await;
        assert_eq!(h.drain().await.delivered, 1);
        // The renewal at 10 s failed, its retry was still waiting when the
        // handler finished; the settlement write confirmed the lease.
        let leases = h.leases();
        assert_eq!(leases.len(), 1, "{leases:?}");
        assert_eq!(leases[0].state, LeaseState::Recovered);
        assert_eq!(h.store.calls(Op::Renew), 1);
    });
}

#[test]
fn expired_lease_answer_is_a_transient_renewal_error() {
    run(|| async {
        let store = FaultStore::new();
        store.fault(Op::Renew, 1, Fault::ExpiredLease);
        let h = Harness::start_with(store, config(), |b| b);
        h.enqueue(ping(1, 15_000)).await;
        assert_eq!(h.drain().await.delivered, 1);
        let leases = h.leases();
        assert_eq!(leases.len(), 1);
        assert_eq!(leases[0].state, LeaseState::Recovered);
        assert!(
            leases[0].error.to_string().contains("already ended"),
            "{}",
            leases[0].error
        );
    });
}

#[test]
fn the_extension_waits_for_a_renewal_in_flight() {
    run(|| async {
        let store = FaultStore::new();
        store.fault(Op::Renew, 1, Fault::Delay(Duration::from_secs(2)));
        let h = Harness::start_with(store, config(), |b| b);
        h.enqueue(ping(1, 11_000)).await;
        assert_eq!(h.drain().await.delivered, 1);
        // The heartbeat's renewal started at 10 s and answered at 12 s; the
        // handler finished at 11 s, but the extension (the settlement write)
        // waited for the answer.
        let writes: Vec<(Op, i64, support::Answer)> = h
            .store
            .log()
            .iter()
            .filter(|c| c.op != Op::Claim)
            .map(|c| {
                (
                    c.op,
                    (c.now - support::epoch()).num_milliseconds(),
                    c.answer,
                )
            })
            .collect();
        assert_eq!(
            writes,
            [
                (Op::Renew, 10_000, support::Answer::Ok),
                (Op::Deliver, 12_000, support::Answer::Ok)
            ]
        );
        assert!(h.leases().is_empty());
    });
}

#[test]
fn confirmed_loss_at_renewal_aborts_the_delivery() {
    run(|| async {
        let store = FaultStore::new();
        store.fault(Op::Renew, 1, Fault::Claim);
        let h = Harness::start_with(store, config(), |b| b);
        let id = h.enqueue(ping(1, 60_000)).await;
        let r = h.drain().await;
        assert_eq!(
            r,
            report(|r| {
                r.claimed = 1;
                r.lease_lost = 1;
            })
        );
        assert_eq!(h.probe.aborted(), 1, "the handler's future was dropped");
        let leases = h.leases();
        assert_eq!(leases.len(), 1);
        assert_eq!(
            (leases[0].state, leases[0].operation),
            (LeaseState::Lost, LeaseOperation::Renew)
        );
        assert!(leases[0].confirmed_lost && leases[0].error.is_claim_lost());
        assert_eq!(
            h.store.calls(Op::Deliver) + h.store.calls(Op::Fail),
            0,
            "nothing settled"
        );
        // The message waits out its lease, then is delivered on the next attempt.
        assert_eq!(h.status(&id).await, MessageStatus::Claimed);
        tokio::time::sleep(Duration::from_secs(30)).await;
        let next = h.drain().await;
        assert_eq!(next.delivered, 1);
        assert_eq!(h.message(&id).await.attempts, 2);
    });
}

#[test]
fn renewal_that_never_answers_is_unconfirmed_loss() {
    run(|| async {
        let store = FaultStore::new();
        store.always(Op::Renew, Fault::Hang);
        // One message per pass: otherwise the pass would claim it again as
        // soon as its lease ran out.
        let h = Harness::start_with(
            store,
            DrainConfig {
                batch_size: 1,
                ..config()
            },
            |b| b,
        );
        h.enqueue(ping(1, 120_000)).await;
        let started = h.clock.now();
        assert_eq!(h.drain().await.lease_lost, 1);
        let leases = h.leases();
        assert_eq!(leases[0].state, LeaseState::Lost);
        assert!(!leases[0].confirmed_lost);
        // Lost when the lease ran out (30 s), not when the handler finished.
        assert_eq!((h.clock.now() - started).num_seconds(), 30);
    });
}

#[test]
fn renewals_that_keep_failing_lose_the_lease_when_it_ends() {
    run(|| async {
        let store = FaultStore::new();
        store.always(Op::Renew, Fault::Transient);
        let h = Harness::start_with(
            store,
            DrainConfig {
                batch_size: 1,
                ..config()
            },
            |b| b,
        );
        h.enqueue(ping(1, 120_000)).await;
        let started = h.clock.now();
        assert_eq!(h.drain().await.lease_lost, 1);
        // Retries came ever closer to the end of the lease (a third of what
        // was left each time), and the claim was given up when it ended.
        assert_eq!((h.clock.now() - started).num_seconds(), 30);
        assert!(h.store.calls(Op::Renew) > 5);
        let leases = h.leases();
        assert_eq!(
            (leases[0].operation, leases[0].state),
            (LeaseOperation::Renew, LeaseState::Lost)
        );
        // The last retry found the lease already over: that loss is certain.
        assert!(leases[0].confirmed_lost);
        let Error::LeaseLost(lost) = &leases[0].error else {
            panic!("{:?}", leases[0].error)
        };
        assert!(lost.reason.contains("ran out"), "{}", lost.reason);
        assert_eq!(h.probe.aborted(), 1);
    });
}

#[test]
fn renewal_retries_are_bounded_by_max_active_when_it_ends_first() {
    run(|| async {
        let store = FaultStore::new();
        store.always(Op::Renew, Fault::Transient);
        let h = Harness::start_with(
            store,
            DrainConfig {
                batch_size: 1,
                max_active: Duration::from_secs(20),
                ..config()
            },
            |b| b,
        );
        h.enqueue(ping(1, 120_000)).await;
        let started = h.clock.now();
        assert_eq!(h.drain().await.lease_lost, 1);
        assert_eq!((h.clock.now() - started).num_seconds(), 20);
        let leases = h.leases();
        assert_eq!(leases.len(), 1, "{leases:?}");
        assert_eq!(leases[0].operation, LeaseOperation::MaxActive);
        assert!(matches!(leases[0].error, Error::MaxActiveDuration(_)));
    });
}

#[test]
fn max_active_aborts_a_delivery_that_runs_too_long() {
    run(|| async {
        let h = Harness::start(DrainConfig {
            max_active: Duration::from_secs(5),
            ..config()
        });
        h.enqueue(ping(1, 10_000)).await;
        let started = h.clock.now();
        let r = h.drain().await;
        assert_eq!(r.lease_lost, 1);
        assert_eq!((h.clock.now() - started).num_seconds(), 5);
        assert_eq!(h.probe.aborted(), 1);
        let leases = h.leases();
        assert_eq!(
            (leases[0].operation, leases[0].state),
            (LeaseOperation::MaxActive, LeaseState::Lost)
        );
        assert!(matches!(leases[0].error, Error::MaxActiveDuration(_)));
        assert_eq!(h.store.calls(Op::Deliver), 0);
    });
}

#[test]
fn max_active_reached_during_the_extension() {
    run(|| async {
        let store = FaultStore::new();
        store.fault(Op::Deliver, 1, Fault::Delay(Duration::from_secs(2)));
        let h = Harness::start_with(
            store,
            DrainConfig {
                max_active: Duration::from_secs(5),
                ..config()
            },
            |b| b,
        );
        h.enqueue(ping(1, 4_000)).await;
        let started = h.clock.now();
        let r = h.drain().await;
        // The write at 4 s was the acknowledgement as much as the extension.
        assert_eq!((r.lease_lost, r.delivered, r.settlement_failed), (1, 0, 1));
        // The write at 4 s was cut off at `max_active`, 5 s.
        assert_eq!((h.clock.now() - started).num_seconds(), 5);
        let leases = h.leases();
        assert_eq!(leases[0].operation, LeaseOperation::MaxActive);
        assert!(!leases[0].confirmed_lost);
        assert!(leases[0].handler.succeeded());
        assert_eq!(h.store.calls(Op::Deliver), 1);
    });
}

#[test]
fn a_lease_lost_after_the_handler_finished_says_so_and_settles_nothing() {
    run(|| async {
        let store = FaultStore::new();
        // The renewal at 10 s never answers; the handler finishes at 15 s,
        // and the hand-over waits for that renewal, lost at 30 s.
        store.always(Op::Renew, Fault::Hang);
        let h = Harness::start_with(store, config(), |b| b);
        h.enqueue(ping(1, 15_000)).await;
        let r = h.drain().await;
        // No write was made: a plain lease loss, as a failed final
        // extension is in the reference.
        assert_eq!((r.lease_lost, r.settlement_failed, r.delivered), (1, 0, 0));
        assert_eq!(h.store.calls(Op::Deliver), 0);
        let leases = h.leases();
        let [lost] = &leases[..] else {
            panic!("{leases:?}")
        };
        assert_eq!(lost.state, LeaseState::Lost);
        assert!(!lost.confirmed_lost, "a renewal without an answer");
        assert!(lost.handler.finished() && lost.handler.succeeded());
        assert_eq!(h.probe.aborted(), 0, "the handler was not cut off");
    });
}

#[test]
fn a_lease_lost_while_the_handler_runs_says_it_did_not_finish() {
    run(|| async {
        let store = FaultStore::new();
        store.fault(Op::Renew, 1, Fault::Claim);
        let h = Harness::start_with(store, config(), |b| b);
        h.enqueue(ping(1, 20_000)).await;
        assert_eq!(h.drain().await.lease_lost, 1);
        let leases = h.leases();
        assert!(!leases[0].handler.finished(), "{:?}", leases[0].handler);
        assert_eq!(leases[0].handler.error().map(ToString::to_string), None);
        assert_eq!(h.probe.aborted(), 1);
    });
}

#[test]
fn a_lost_lease_is_revisited_when_it_has_ended() {
    run(|| async {
        let store = FaultStore::new();
        store.fault(Op::Renew, 1, Fault::Claim);
        let h = Harness::start_with(store, config(), |b| b);
        let id = h.enqueue(ping(1, 20_000)).await;
        assert_eq!(h.drain().await.lease_lost, 1);
        // Lost at 10 s; the lease from the claim ends at 30 s, and the
        // coordinator looks again a lease after the loss (40 s).
        tokio::time::sleep(Duration::from_secs(31)).await;
        assert_eq!(
            h.status(&id).await,
            MessageStatus::Claimed,
            "not before the revisit"
        );
        tokio::time::sleep(Duration::from_secs(30)).await;
        let message = h.message(&id).await;
        assert_eq!(
            (message.status, message.attempts),
            (MessageStatus::Delivered, 2)
        );
    });
}

#[test]
fn lease_lost_subscribers_hear_every_field() {
    run(|| async {
        let store = FaultStore::new();
        store.fault(Op::Renew, 1, Fault::Claim);
        let h = Harness::start_with(store, config(), |b| b);
        let late = Recorder::default();
        h.coordinator
            .send(Subscribe::LeaseLost(late.clone().start().recipient()))
            .await
            .unwrap();
        let id = h.enqueue(ping(1, 60_000)).await;
        h.drain().await;
        settle().await;
        for leases in [h.leases(), late.leases()] {
            assert_eq!(leases.len(), 1);
            let lost = &leases[0];
            assert_eq!(
                (lost.id.as_str(), lost.name.as_str(), lost.kind),
                (id.as_str(), "ping", MessageKind::Event)
            );
            assert_eq!(
                (lost.attempt, lost.operation, lost.state),
                (1, LeaseOperation::Renew, LeaseState::Lost)
            );
            assert!(lost.confirmed_lost);
        }
    });
}
