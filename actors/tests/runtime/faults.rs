//! Faults: panicking handlers, dying actors, failing observers, misbehaving
//! stores, and randomized faults that must keep every invariant.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox::{
    ClaimBatch, Clock, DeliveryError, DrainConfig, Error as CoreError, MessageStatus, NewMessage,
    OutboxAdmin, OutboxStore, RetryPolicy,
};
use outbox_actors::{
    DeadLetter, Drain, DrainObserver, DrainReport, Error, GetStatus, LeaseLost, ObserverResult,
    OutcomeNotice,
};

use crate::support::{self, Fault, FaultStore, Op, run};
use crate::{Counting, Harness, Ping, config, ping, report, settle};

#[test]
fn abandoned_messages_are_dead_lettered_at_claim_and_observed() {
    run(|| async {
        let counting = Counting::default();
        let observer = counting.clone();
        let h = Harness::start_with(FaultStore::new(), config(), move |b| b.observer(observer));
        let id = h
            .store
            .enqueue(
                NewMessage::event(&ping(1, 0))
                    .unwrap()
                    .with_max_attempts(1)
                    .at(h.clock.now()),
            )
            .await
            .unwrap()
            .into_id();
        // A worker claimed it and vanished.
        let taken = h
            .store
            .claim_batch(ClaimBatch {
                on_dead_letter: Default::default(),
                limit: 1,
                now: h.clock.now(),
                lease: Duration::from_secs(30),
                max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
                queues: Vec::new(),
                durable: true,
            })
            .await
            .unwrap();
        assert_eq!(taken.claimed.len(), 1);
        tokio::time::sleep(Duration::from_secs(31)).await;
        let r = h.drain().await;
        assert_eq!(
            r,
            report(|r| {
                r.dead_lettered = 1;
                r.abandoned_dead_lettered = 1;
            })
        );
        let dead = counting.dead_letters.lock().unwrap().clone();
        assert_eq!(dead.len(), 1);
        assert!(dead[0].abandoned && dead[0].id == id);
        assert!(
            dead[0].error.type_name.contains("AbandonedClaimError"),
            "{}",
            dead[0].error
        );
        let outcomes = h.recorder.outcomes();
        assert!(matches!(&outcomes[..], [OutcomeNotice::DeadLettered(d)] if d.abandoned));
        assert_eq!(h.status(&id).await, MessageStatus::DeadLettered);
        assert!(
            h.probe.started.lock().unwrap().is_empty(),
            "never delivered"
        );
    });
}

#[test]
fn a_panicking_handler_is_a_delivery_failure() {
    run(|| async {
        let h = Harness::start(config());
        let id = h
            .enqueue(Ping {
                panic: true,
                ..ping(1, 5)
            })
            .await;
        let r = h.drain().await;
        assert_eq!(r.retried, 1);
        let message = h.message(&id).await;
        assert_eq!(message.status, MessageStatus::Pending);
        let error = message.last_error.unwrap();
        assert_eq!(error.type_name, "panic");
        assert!(error.message.contains("ping 1 handler panicked"), "{error}");
        // Retried after the policy's fixed 5 s, from the failure time.
        assert_eq!(
            message.available_at - message.updated_at,
            chrono::Duration::seconds(5)
        );
        // The coordinator is unharmed.
        assert_eq!(h.coordinator.send(GetStatus).await.unwrap().passes, 1);
    });
}

#[test]
fn delivery_actor_death_reports_the_message_lost() {
    run(|| async {
        let store = FaultStore::new();
        store.fault(Op::Deliver, 1, Fault::Panic);
        let h = Harness::start_with(store, config(), |b| b);
        let id = h.enqueue(ping(1, 10)).await;
        let r = h.drain().await;
        assert_eq!(
            r,
            report(|r| {
                r.claimed = 1;
                r.lease_lost = 1;
            })
        );
        let leases = h.leases();
        assert_eq!(leases.len(), 1);
        assert!(!leases[0].confirmed_lost);
        assert!(
            leases[0]
                .error
                .to_string()
                .contains("delivery actor stopped"),
            "{}",
            leases[0].error
        );
        // The coordinator survives, and comes back for the message once its
        // lease has ended.
        tokio::time::sleep(Duration::from_secs(31)).await;
        assert_eq!(h.status(&id).await, MessageStatus::Delivered);
        assert_eq!(
            h.coordinator
                .send(GetStatus)
                .await
                .unwrap()
                .totals
                .delivered,
            1
        );
    });
}

#[test]
fn heartbeat_death_is_unconfirmed_loss() {
    run(|| async {
        let store = FaultStore::new();
        store.fault(Op::Renew, 1, Fault::Panic);
        let h = Harness::start_with(store, config(), |b| b);
        h.enqueue(ping(1, 20_000)).await;
        let started = h.clock.now();
        let r = h.drain().await;
        assert_eq!(r.lease_lost, 1);
        assert_eq!(
            (h.clock.now() - started).num_seconds(),
            10,
            "lost at the failed heartbeat"
        );
        assert_eq!(h.probe.aborted(), 1);
        let leases = h.leases();
        assert!(!leases[0].confirmed_lost);
        assert!(
            leases[0].error.to_string().contains("heartbeat stopped"),
            "{}",
            leases[0].error
        );
        assert_eq!(h.coordinator.send(GetStatus).await.unwrap().passes, 1);
    });
}

struct Panicking;
impl DrainObserver for Panicking {
    fn on_error(&self, _: &DeliveryError, _: &outbox::ClaimedMessage) -> ObserverResult {
        panic!("observer panicked")
    }
    fn on_dead_letter(&self, _: &DeadLetter) -> ObserverResult {
        panic!("observer panicked")
    }
    fn on_lease_error(&self, _: &LeaseLost) -> ObserverResult {
        panic!("observer panicked")
    }
    fn on_settlement_error(&self, _: &outbox_actors::SettlementFailed) -> ObserverResult {
        panic!("observer panicked")
    }
}

struct Failing;
impl DrainObserver for Failing {
    fn on_error(&self, _: &DeliveryError, _: &outbox::ClaimedMessage) -> ObserverResult {
        Err("observer failed".into())
    }
    fn on_dead_letter(&self, _: &DeadLetter) -> ObserverResult {
        Err("observer failed".into())
    }
    fn on_lease_error(&self, _: &LeaseLost) -> ObserverResult {
        Err("observer failed".into())
    }
}

#[test]
fn observers_that_panic_or_fail_change_nothing() {
    run(|| async {
        let counting = Counting::default();
        let observer = counting.clone();
        let store = FaultStore::new();
        store.fault(Op::Deliver, 1, Fault::Transient);
        let h = Harness::start_with(store, config(), move |b| {
            b.observer(Panicking).observer(Failing).observer(observer)
        });
        let failing = h
            .store
            .enqueue(
                NewMessage::event(&Ping {
                    fail: Some("no".into()),
                    ..ping(1, 1)
                })
                .unwrap()
                .with_max_attempts(1)
                .at(h.clock.now()),
            )
            .await
            .unwrap()
            .into_id();
        let fine = h.enqueue(ping(2, 1)).await;
        let r = h.drain().await;
        assert_eq!((r.claimed, r.delivered, r.dead_lettered), (2, 1, 1));
        assert_eq!(h.status(&failing).await, MessageStatus::DeadLettered);
        assert_eq!(h.status(&fine).await, MessageStatus::Delivered);
        // The observer after the broken ones still heard everything.
        assert_eq!(counting.errors.load(Ordering::SeqCst), 1);
        assert_eq!(counting.dead_letters.lock().unwrap().len(), 1);
        assert_eq!(
            counting.leases.load(Ordering::SeqCst),
            1,
            "the degraded extension"
        );
    });
}

#[test]
fn a_failed_claim_is_retried_by_the_coordinator() {
    run(|| async {
        let store = FaultStore::new();
        store.fault(Op::Claim, 1, Fault::Transient);
        let h = Harness::start_with(store, config(), |b| b);
        let id = h.enqueue(ping(1, 10)).await;
        assert!(h.coordinator.send(Drain).await.unwrap().is_err());
        // Tried again a heartbeat (10 s) later.
        tokio::time::sleep(Duration::from_millis(10_100)).await;
        assert_eq!(h.status(&id).await, MessageStatus::Delivered);
    });
}

#[test]
fn a_store_that_claims_more_than_asked_fails_the_pass() {
    run(|| async {
        let store = FaultStore::new();
        store.fault(Op::Claim, 1, Fault::OverClaim);
        let h = Harness::start_with(store, config(), |b| b);
        let a = h.enqueue(ping(1, 0)).await;
        let b = h.enqueue(ping(2, 0)).await;
        let error = h.coordinator.send(Drain).await.unwrap().unwrap_err();
        assert!(
            matches!(
                &error,
                Error::Pass { source, .. }
                    if matches!(**source, Error::Outbox(CoreError::StoreContract(_)))
            ),
            "{error}"
        );
        assert!(
            error
                .to_string()
                .contains("returned 2 messages for a limit of 1"),
            "{error}"
        );
        assert!(
            h.probe.started.lock().unwrap().is_empty(),
            "nothing delivered"
        );
        for id in [a, b] {
            let message = h.message(&id).await;
            assert_eq!(
                (message.status, message.attempts),
                (MessageStatus::Pending, 0),
                "released"
            );
        }
        assert_eq!(h.drain().await.delivered, 2);
    });
}

#[test]
fn a_failed_claim_ends_the_pass_with_its_report() {
    run(|| async {
        let store = FaultStore::new();
        store.fault(Op::Claim, 2, Fault::Transient);
        let h = Harness::start_with(store, config(), |b| b);
        h.enqueue(ping(1, 0)).await;
        h.enqueue(ping(2, 0)).await;
        let error = h.coordinator.send(Drain).await.unwrap().unwrap_err();
        let Error::Pass { source, report } = &error else {
            panic!("{error}")
        };
        assert!(matches!(
            **source,
            Error::Outbox(CoreError::Store {
                operation: "claim_batch",
                ..
            })
        ));
        assert_eq!((report.claimed, report.delivered), (1, 1));
        assert_eq!(h.drain().await.delivered, 1, "the next pass picks up");
    });
}

#[test]
fn a_claim_that_hangs_is_bounded_by_the_lease() {
    run(|| async {
        let store = FaultStore::new();
        store.fault(Op::Claim, 1, Fault::Hang);
        let h = Harness::start_with(store, config(), |b| b);
        h.enqueue(ping(1, 0)).await;
        let error = h.coordinator.send(Drain).await.unwrap().unwrap_err();
        assert!(
            matches!(
                &error,
                Error::Pass { source, .. } if matches!(**source, Error::Timeout { .. })
            ),
            "{error}"
        );
        assert_eq!(h.drain().await.delivered, 1);
    });
}

/// Random faults and delivery times over many seeds; after every run the
/// invariants hold, and once faults stop every message ends delivered or
/// dead-lettered.
#[test]
fn randomized_faults_keep_every_invariant() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    for seed in 0..60u64 {
        let seen = seen.clone();
        run(move || async move {
            let report = random_run(seed).await;
            seen.lock().unwrap().push(report);
        });
    }
    // The runs as a whole went through every kind of outcome, so the
    // invariants above were checked against all of them.
    let seen = seen.lock().unwrap();
    let total = |f: fn(&DrainReport) -> u64| seen.iter().map(f).sum::<u64>();
    assert!(total(|r| r.delivered) > 0 && total(|r| r.retried) > 0);
    assert!(total(|r| r.lease_lost) > 0 && total(|r| r.settlement_failed) > 0);
    assert!(
        total(|r| r.abandoned_dead_lettered) > 0
            && total(|r| r.dead_lettered) > total(|r| r.abandoned_dead_lettered)
    );
}

async fn random_run(seed: u64) -> DrainReport {
    let mut rng = seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1;
    let mut next = move |bound: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % bound
    };
    let store = FaultStore::new();
    store.randomize(
        seed,
        support::FaultRates {
            transient: 0.08,
            transient_after: 0.04,
            claim: 0.03,
            delay: 0.05,
            hang: 0.01,
        },
    );
    let concurrency = 1 + next(6) as usize;
    let config = DrainConfig {
        concurrency,
        batch_size: concurrency + next(10) as usize,
        lease: Duration::from_secs(30),
        max_active: Duration::from_secs(45),
        retry: RetryPolicy::fixed(Duration::from_secs(2)).with_seed(seed),
        ..DrainConfig::default()
    };
    let h = Harness::start_with(store, config, |b| b);
    let total = 5 + next(20) as u32;
    let mut ids = Vec::new();
    for n in 0..total {
        let work = match next(10) {
            0 => 50_000 + next(20_000),
            1..=3 => next(20_000),
            _ => next(500),
        };
        let fail = (next(5) == 0).then(|| format!("failure {n}"));
        ids.push(
            h.enqueue(Ping {
                n,
                work_ms: work,
                fail,
                panic: next(30) == 0,
                fail_until: 0,
            })
            .await,
        );
    }

    let mut reports = Vec::new();
    for _ in 0..6 {
        match h.coordinator.send(Drain).await.unwrap() {
            Ok(report) => reports.push(report),
            Err(Error::Pass { report, .. }) => reports.push(*report),
            Err(other) => panic!("seed {seed}: {other}"),
        }
        tokio::time::sleep(Duration::from_secs(next(40))).await;
    }
    h.store.calm();
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_secs(31)).await;
        reports.push(h.drain().await);
        let stats = h.store.inner().stats(h.clock.now()).await.unwrap();
        if stats.pending + stats.claimed == 0 {
            break;
        }
    }
    settle().await;

    // Once faults stop, every message ends delivered or dead-lettered.
    for id in &ids {
        let status = h.status(id).await;
        assert!(status.is_terminal(), "seed {seed}: {id} ended {status}");
    }

    // Each claimed message has exactly one outcome, and the report adds up.
    let lost_while_settling = h
        .recorder
        .outcomes()
        .iter()
        .filter(|n| matches!(n, OutcomeNotice::SettlementFailed(f) if f.claim_lost))
        .count() as u64;
    for r in &reports {
        let outcomes = r.delivered
            + r.retried
            + (r.dead_lettered - r.abandoned_dead_lettered)
            + r.settlement_failed
            + r.lease_lost
            + r.released;
        assert!(outcomes >= r.claimed, "seed {seed}: {r}");
    }
    // Every pass counts, the ones the coordinator started by itself (to
    // revisit retries and lost leases) as much as those a Drain asked for.
    let t = h.coordinator.send(GetStatus).await.unwrap().totals;
    assert_eq!(
        t.claimed,
        t.delivered
            + t.retried
            + (t.dead_lettered - t.abandoned_dead_lettered)
            + t.settlement_failed
            + (t.lease_lost - lost_while_settling)
            + t.released,
        "seed {seed}: {t}"
    );
    let claims = h
        .store
        .log()
        .iter()
        .filter(|c| c.op == Op::Claim && c.answer == support::Answer::Ok)
        .count() as u64;
    assert_eq!(
        claims, t.claimed,
        "seed {seed}: every claim reached a delivery"
    );

    // No settlement is attempted after the store said the claim was lost,
    // and no message ever has two live claims.
    let log = h.store.log();
    let mut lost_tokens = std::collections::HashSet::new();
    let mut lease_of: HashMap<String, (String, DateTime<Utc>)> = HashMap::new();
    let mut settled: HashMap<String, DateTime<Utc>> = HashMap::new();
    for call in &log {
        match call.op {
            Op::Claim => {
                if let Some((previous, locked_until)) = lease_of.get(&call.id) {
                    let settled_before = settled.get(previous).is_some_and(|at| *at <= call.now);
                    assert!(
                        settled_before || *locked_until <= call.now,
                        "seed {seed}: {} claimed at {} while {previous} held it until {locked_until}",
                        call.id,
                        call.now
                    );
                }
                lease_of.insert(
                    call.id.clone(),
                    (call.token.clone(), call.locked_until.unwrap()),
                );
            }
            Op::Renew => {
                if let (Some(lease), Some(until)) = (
                    lease_of.get_mut(&call.id).filter(|l| l.0 == call.token),
                    call.locked_until,
                ) {
                    lease.1 = lease.1.max(until);
                }
            }
            Op::Deliver | Op::Fail | Op::Release => {
                assert!(
                    !lost_tokens.contains(&call.token),
                    "seed {seed}: {:?} of {} at {} after its claim was reported lost",
                    call.op,
                    call.id,
                    call.now
                );
                if call.applied {
                    settled.insert(call.token.clone(), call.now);
                }
            }
        }
        if call.answer == support::Answer::ClaimLost {
            lost_tokens.insert(call.token.clone());
        }
    }
    t
}
