//! The actor runtime, one test per behaviour, on virtual time: every test
//! runs the actix system on a paused tokio runtime with a clock tied to
//! tokio's `Instant`, so minutes of leases pass in microseconds.

mod support;

mod telemetry;
#[cfg(feature = "opentelemetry")]
mod telemetry_otel;

// The tests against real databases and the actix-web example, each behind
// the feature of its store: one test binary cannot use `required-features`
// per module.
#[cfg(feature = "sqlite")]
mod actix_web;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod sql_support;
#[cfg(feature = "sqlite")]
mod sqlite;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use chrono::{DateTime, Utc};
use outbox::{
    ClaimBatch, Clock, DeliveryContext, DeliveryError, DrainConfig, Error as CoreError, Event,
    InProcessBus, InProcessJobs, Job, MessageKind, MessageStatus, NewMessage, OutboxAdmin,
    OutboxStore, Payload, RawMessage, Registry, RetryPolicy, TokioClock,
};
use outbox_actors::{
    DeadLetter, Drain, DrainCoordinator, DrainObserver, DrainReport, Error, GetStatus, LeaseLost,
    LeaseOperation, LeaseState, ObserverResult, OutcomeNotice, Shutdown, Subscribe,
};
use serde::{Deserialize, Serialize};
use support::{Fault, FaultStore, Op, Recorder, clock, run};

/// The test event: how long its handler works and how it ends.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Ping {
    n: u32,
    work_ms: u64,
    fail: Option<String>,
    panic: bool,
    /// Fail (with `fail`'s reason, or a default) while the attempt is at most this.
    #[serde(default)]
    fail_until: u32,
}

impl Event for Ping {
    const NAME: &'static str = "ping";
}

fn ping(n: u32, work_ms: u64) -> Ping {
    Ping {
        n,
        work_ms,
        ..Ping::default()
    }
}

/// When each message's handler started or finished.
type Timeline = Arc<Mutex<Vec<(String, DateTime<Utc>)>>>;

/// Watches handlers: who ran, when, how many at once, which were aborted.
#[derive(Clone, Default)]
struct Probe {
    in_flight: Arc<AtomicUsize>,
    max_in_flight: Arc<AtomicUsize>,
    aborted: Arc<AtomicUsize>,
    started: Timeline,
    completed: Timeline,
}

impl Probe {
    /// When each handler started, in milliseconds since the epoch of the
    /// virtual clock, in start order.
    fn start_offsets(&self) -> Vec<i64> {
        self.started
            .lock()
            .unwrap()
            .iter()
            .map(|(_, at)| (*at - support::epoch()).num_milliseconds())
            .collect()
    }
}

struct Running {
    probe: Probe,
    id: String,
    clock: TokioClock,
    done: bool,
}

impl Running {
    fn complete(mut self) {
        self.done = true;
        let now = self.clock.now();
        self.probe
            .completed
            .lock()
            .unwrap()
            .push((self.id.clone(), now));
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.probe.in_flight.fetch_sub(1, Ordering::SeqCst);
        if !self.done {
            self.probe.aborted.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Probe {
    fn enter(&self, id: &str, clock: &TokioClock) -> Running {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        self.started
            .lock()
            .unwrap()
            .push((id.to_owned(), clock.now()));
        Running {
            probe: self.clone(),
            id: id.to_owned(),
            clock: clock.clone(),
            done: false,
        }
    }

    fn completed(&self) -> Vec<(String, DateTime<Utc>)> {
        self.completed.lock().unwrap().clone()
    }

    fn aborted(&self) -> usize {
        self.aborted.load(Ordering::SeqCst)
    }
}

fn bus(probe: &Probe, clock: &TokioClock) -> InProcessBus {
    let probe = probe.clone();
    let clock = clock.clone();
    InProcessBus::new().on(move |ping: Arc<Ping>, context: DeliveryContext| {
        let running = probe.enter(context.id(), &clock);
        async move {
            tokio::time::sleep(Duration::from_millis(ping.work_ms)).await;
            if ping.panic {
                panic!("ping {} handler panicked", ping.n);
            }
            running.complete();
            if context.attempt() <= ping.fail_until {
                return Err(DeliveryError::msg(format!(
                    "attempt {} fails",
                    context.attempt()
                )));
            }
            match &ping.fail {
                Some(reason) => Err(DeliveryError::msg(reason)),
                None => Ok(()),
            }
        }
    })
}

fn registry() -> Registry {
    Registry::builder().event::<Ping>().build().unwrap()
}

fn config() -> DrainConfig {
    DrainConfig {
        retry: RetryPolicy::fixed(Duration::from_secs(5)),
        ..DrainConfig::default()
    }
}

struct Harness {
    store: FaultStore,
    clock: TokioClock,
    probe: Probe,
    recorder: Recorder,
    coordinator: Addr<DrainCoordinator>,
}

impl Harness {
    fn start(config: DrainConfig) -> Self {
        Self::start_with(FaultStore::new(), config, |builder| builder)
    }

    fn start_with(
        store: FaultStore,
        config: DrainConfig,
        customize: impl FnOnce(
            outbox_actors::DrainCoordinatorBuilder,
        ) -> outbox_actors::DrainCoordinatorBuilder,
    ) -> Self {
        let clock = clock();
        let probe = Probe::default();
        let recorder = Recorder::default();
        let recorder_addr = recorder.clone().start();
        let builder = DrainCoordinator::builder(store.clone())
            .registry(registry())
            .event_bus(bus(&probe, &clock))
            .config(config)
            .clock(clock.clone())
            .wake_on_insert(false)
            .subscribe_lease_lost(recorder_addr.clone().recipient())
            .subscribe_outcomes(recorder_addr.recipient());
        let coordinator = customize(builder).start().unwrap();
        Harness {
            store,
            clock,
            probe,
            recorder,
            coordinator,
        }
    }

    async fn enqueue(&self, ping: Ping) -> String {
        let message = NewMessage::event(&ping).unwrap().at(self.clock.now());
        self.store.enqueue(message).await.unwrap()
    }

    async fn drain(&self) -> DrainReport {
        self.coordinator.send(Drain).await.unwrap().unwrap()
    }

    async fn message(&self, id: &str) -> outbox::OutboxMessage {
        self.store.inner().get_message(id).await.unwrap()
    }

    async fn status(&self, id: &str) -> MessageStatus {
        self.message(id).await.status
    }

    fn leases(&self) -> Vec<LeaseLost> {
        self.recorder.leases()
    }
}

fn report(f: impl FnOnce(&mut DrainReport)) -> DrainReport {
    let mut report = DrainReport::default();
    f(&mut report);
    report
}

#[test]
fn delivers_every_message_and_reports_it() {
    run(|| async {
        let h = Harness::start(DrainConfig {
            concurrency: 2,
            ..config()
        });
        let ids = [
            h.enqueue(ping(1, 10)).await,
            h.enqueue(ping(2, 10)).await,
            h.enqueue(ping(3, 10)).await,
        ];
        let r = h.drain().await;
        assert_eq!(
            r,
            report(|r| {
                r.claimed = 3;
                r.delivered = 3;
            })
        );
        for id in &ids {
            let message = h.message(id).await;
            assert_eq!(message.status, MessageStatus::Delivered);
            assert!(message.claim_token.is_none() && message.delivered_at.is_some());
        }
        assert!(h.leases().is_empty());
        assert_eq!(h.drain().await, DrainReport::default());
    });
}

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
        let CoreError::LeaseLost(lost) = &leases[0].error else {
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
        assert!(matches!(leases[0].error, CoreError::MaxActiveDuration(_)));
    });
}

#[test]
fn confirmed_loss_at_the_extension_settles_nothing() {
    run(|| async {
        let store = FaultStore::new();
        store.fault(Op::Deliver, 1, Fault::Claim);
        let h = Harness::start_with(store, config(), |b| b);
        h.enqueue(ping(1, 1_000)).await;
        let r = h.drain().await;
        assert_eq!(
            r,
            report(|r| {
                r.claimed = 1;
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
        assert!(h.recorder.outcomes().is_empty(), "no settlement failure");
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
            matches!(failure.error, CoreError::LeaseLost(_)),
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
        assert_eq!((r.settlement_failed, r.lease_lost), (0, 1));
        assert_eq!((h.clock.now() - started).num_milliseconds(), 30_000);
        let leases = h.leases();
        assert_eq!(
            (leases[0].operation, leases[0].state),
            (LeaseOperation::Renew, LeaseState::Lost)
        );
        assert!(!leases[0].confirmed_lost);
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
        assert!(matches!(leases[0].error, CoreError::MaxActiveDuration(_)));
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
        assert_eq!((r.lease_lost, r.delivered, r.settlement_failed), (1, 0, 0));
        // The write at 4 s was cut off at `max_active`, 5 s.
        assert_eq!((h.clock.now() - started).num_seconds(), 5);
        let leases = h.leases();
        assert_eq!(leases[0].operation, LeaseOperation::MaxActive);
        assert!(!leases[0].confirmed_lost);
        assert_eq!(h.store.calls(Op::Deliver), 1);
    });
}

#[derive(Clone, Default)]
struct Counting {
    errors: Arc<AtomicUsize>,
    dead_letters: Arc<Mutex<Vec<DeadLetter>>>,
    leases: Arc<AtomicUsize>,
    settlements: Arc<AtomicUsize>,
}

impl DrainObserver for Counting {
    fn on_error(&self, _: &DeliveryError, _: &outbox::ClaimedMessage) -> ObserverResult {
        self.errors.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn on_dead_letter(&self, dead_letter: &DeadLetter) -> ObserverResult {
        self.dead_letters.lock().unwrap().push(dead_letter.clone());
        Ok(())
    }
    fn on_lease_error(&self, _: &LeaseLost) -> ObserverResult {
        self.leases.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn on_settlement_error(&self, _: &outbox_actors::SettlementFailed) -> ObserverResult {
        self.settlements.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

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
            .unwrap();
        // A worker claimed it and vanished.
        let taken = h
            .store
            .claim_batch(ClaimBatch {
                limit: 1,
                now: h.clock.now(),
                lease: Duration::from_secs(30),
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
            .unwrap();
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
            .unwrap();
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
fn drains_during_a_pass_are_coalesced_into_one_follow_up() {
    run(|| async {
        let h = Harness::start(DrainConfig {
            batch_size: 2,
            ..config()
        });
        for n in 0..3 {
            h.enqueue(ping(n, 1_000)).await;
        }
        let sends: Vec<_> = (0..5).map(|_| h.coordinator.send(Drain)).collect();
        let reports: Vec<DrainReport> = futures_util::future::join_all(sends)
            .await
            .into_iter()
            .map(|r| r.unwrap().unwrap())
            .collect();
        assert_eq!(reports[0].delivered, 2);
        for follow_up in &reports[1..] {
            assert_eq!(follow_up.delivered, 1, "{reports:?}");
        }
        assert_eq!(h.coordinator.send(GetStatus).await.unwrap().passes, 2);
        assert_eq!(
            h.probe.max_in_flight.load(Ordering::SeqCst),
            1,
            "passes never overlap"
        );
    });
}

#[test]
fn the_schedule_skips_ticks_while_a_pass_runs() {
    run(|| async {
        let h = Harness::start(DrainConfig {
            batch_size: 1,
            every: Some(Duration::from_secs(1)),
            ..config()
        });
        for n in 0..10 {
            h.enqueue(ping(n, 3_500)).await;
        }
        tokio::time::sleep(Duration::from_secs(10)).await;
        // Passes start at 0 s, 4 s and 8 s (ticks at 1-3 s and 5-7 s found a
        // pass running): two finished, the third is running.
        let status = h.coordinator.send(GetStatus).await.unwrap();
        assert_eq!(status.passes, 2);
        assert!(status.running);
        assert_eq!(h.probe.max_in_flight.load(Ordering::SeqCst), 1);
        let starts = h.probe.start_offsets();
        assert_eq!(starts, [0, 4_000, 8_000]);
        // A Drain can still be sent at any time.
        assert_eq!(h.drain().await.delivered, 1);
    });
}

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
fn concurrency_is_never_exceeded() {
    run(|| async {
        let h = Harness::start(DrainConfig {
            concurrency: 4,
            batch_size: 40,
            ..config()
        });
        for n in 0..40 {
            h.enqueue(ping(n, u64::from(n * 7919 % 5_000))).await;
        }
        let r = h.drain().await;
        assert_eq!(r.delivered, 40);
        assert_eq!(h.probe.max_in_flight.load(Ordering::SeqCst), 4);
    });
}

#[test]
fn the_next_handlers_run_while_earlier_deliveries_settle_within_the_batch() {
    run(|| async {
        let store = FaultStore::new();
        store.always(Op::Deliver, Fault::Delay(Duration::from_secs(5)));
        let h = Harness::start_with(
            store,
            DrainConfig {
                concurrency: 2,
                batch_size: 4,
                ..config()
            },
            |b| b,
        );
        for n in 0..6 {
            h.enqueue(ping(n, 10)).await;
        }
        // Two handlers at a time; the second pair runs while the first pair
        // settles (5 s each). The pass holds no more claims than its batch,
        // so the last pair waits for the next pass.
        assert_eq!(h.drain().await.delivered, 4);
        assert_eq!(h.probe.start_offsets(), [0, 0, 10, 10]);
        assert_eq!(h.drain().await.delivered, 2);
        assert_eq!(h.probe.start_offsets(), [0, 0, 10, 10, 5_020, 5_020]);
        assert_eq!(h.probe.max_in_flight.load(Ordering::SeqCst), 2);
    });
}

#[test]
fn claiming_waits_when_too_many_deliveries_are_settling() {
    run(|| async {
        let store = FaultStore::new();
        store.always(Op::Deliver, Fault::Delay(Duration::from_secs(10)));
        let h = Harness::start_with(
            store,
            DrainConfig {
                concurrency: 1,
                batch_size: 600,
                ..config()
            },
            |b| b,
        );
        for n in 0..600 {
            h.enqueue(ping(n, 1)).await;
        }
        assert_eq!(h.drain().await.delivered, 600);
        let starts = h.probe.start_offsets();
        // One handler at a time, and 512 deliveries settling behind it: the
        // next claim waits for the first settlement.
        let before_first_settled = starts.iter().filter(|&&at| at < 10_000).count();
        assert_eq!(before_first_settled, 513, "{starts:?}");
    });
}

#[test]
fn a_freed_slot_is_refilled_at_once_not_in_waves() {
    run(|| async {
        let h = Harness::start(DrainConfig {
            concurrency: 2,
            batch_size: 10,
            ..config()
        });
        let slow = h.enqueue(ping(0, 10_000)).await;
        for n in 1..10 {
            h.enqueue(ping(n, 1_000)).await;
        }
        assert_eq!(h.drain().await.delivered, 10);
        let completed = h.probe.completed();
        let slow_done = completed.iter().find(|(id, _)| *id == slow).unwrap().1;
        let before = completed.iter().filter(|(_, at)| *at < slow_done).count();
        // The other slot delivered all nine 1 s messages while the slow one ran.
        assert_eq!(before, 9, "{completed:?}");
    });
}

#[test]
fn a_slow_delivery_does_not_hold_back_messages_committed_meanwhile() {
    run(|| async {
        let h = Harness::start_with(
            FaultStore::new(),
            DrainConfig {
                concurrency: 2,
                ..config()
            },
            |b| b.wake_on_insert(true),
        );
        settle().await;
        let slow = h.enqueue(ping(1, 60_000)).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        // The pass's claim came back empty long ago; the slow delivery keeps
        // it open. A new commit wakes it to use its idle slot.
        let quick = h.enqueue(ping(2, 10)).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(h.status(&quick).await, MessageStatus::Delivered);
        assert_eq!(h.status(&slow).await, MessageStatus::Claimed);
        let status = h.coordinator.send(GetStatus).await.unwrap();
        assert_eq!(
            (status.passes, status.running),
            (0, true),
            "still the first pass"
        );
    });
}

#[test]
fn a_tick_during_a_long_pass_lets_it_claim_for_idle_slots() {
    run(|| async {
        let h = Harness::start(DrainConfig {
            concurrency: 2,
            every: Some(Duration::from_secs(1)),
            ..config()
        });
        h.enqueue(ping(1, 60_000)).await;
        settle().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let quick = h.enqueue(ping(2, 10)).await;
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        assert_eq!(
            h.status(&quick).await,
            MessageStatus::Delivered,
            "claimed at the 1 s tick"
        );
        let status = h.coordinator.send(GetStatus).await.unwrap();
        assert_eq!((status.passes, status.running), (0, true));
    });
}

#[test]
fn a_retried_message_is_revisited_when_due_without_a_schedule() {
    run(|| async {
        let h = Harness::start(config());
        let id = h
            .enqueue(Ping {
                fail_until: 1,
                ..ping(1, 10)
            })
            .await;
        assert_eq!(h.drain().await.retried, 1);
        // No schedule, no wake-ups, no Drain: the coordinator comes back at
        // the retry time (5 s) by itself.
        tokio::time::sleep(Duration::from_millis(5_100)).await;
        let message = h.message(&id).await;
        assert_eq!(
            (message.status, message.attempts),
            (MessageStatus::Delivered, 2)
        );
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
fn slots_freed_together_are_refilled_by_one_claim() {
    run(|| async {
        let h = Harness::start(DrainConfig {
            concurrency: 4,
            batch_size: 8,
            ..config()
        });
        for n in 0..8 {
            h.enqueue(ping(n, 1_000)).await;
        }
        assert_eq!(h.drain().await.delivered, 8);
        // The first four deliveries end at the same instant: one claim for
        // their four slots, not one for the first slot and one for the rest.
        assert_eq!(h.store.calls(Op::Claim), 2);
    });
}

#[test]
fn a_pass_refuses_to_start_without_a_transport_for_registered_messages() {
    run(|| async {
        let store = FaultStore::new();
        let clock = clock();
        let id = store
            .enqueue(NewMessage::event(&ping(1, 0)).unwrap().at(clock.now()))
            .await
            .unwrap();
        let coordinator = DrainCoordinator::builder(store.clone())
            .registry(registry())
            .clock(clock)
            .start()
            .unwrap();
        let refused = coordinator.send(Drain).await.unwrap().unwrap_err();
        assert!(
            matches!(
                refused,
                Error::Outbox(CoreError::MissingTransport {
                    kind: MessageKind::Event,
                    ..
                })
            ),
            "{refused}"
        );
        assert!(refused.to_string().contains("ping"), "{refused}");
        assert_eq!(
            store.calls(Op::Claim),
            0,
            "refused before claiming anything"
        );
        let message = store.inner().get_message(&id).await.unwrap();
        assert_eq!(
            (message.status, message.attempts),
            (MessageStatus::Pending, 0)
        );
    });
}

#[test]
fn an_undecodable_payload_is_dead_lettered_at_once() {
    run(|| async {
        let h = Harness::start(config());
        let raw = NewMessage::new(
            MessageKind::Event,
            "ping",
            Payload::from_json(r#"{"n":"not a number","work_ms":0}"#).unwrap(),
        )
        .at(h.clock.now());
        let id = h.store.enqueue(raw).await.unwrap();
        let r = h.drain().await;
        assert_eq!((r.dead_lettered, r.retried), (1, 0));
        let message = h.message(&id).await;
        assert_eq!(
            (message.status, message.attempts),
            (MessageStatus::DeadLettered, 1)
        );
        assert!(
            message
                .last_error
                .unwrap()
                .message
                .contains("does not decode")
        );
    });
}

#[test]
fn an_unknown_name_is_retried_for_a_worker_that_knows_it() {
    run(|| async {
        let h = Harness::start(config());
        let raw = NewMessage::new(
            MessageKind::Event,
            "pong",
            Payload::from_json("{}").unwrap(),
        )
        .at(h.clock.now());
        let id = h.store.enqueue(raw).await.unwrap();
        assert_eq!(h.drain().await.retried, 1);
        let message = h.message(&id).await;
        assert_eq!(message.status, MessageStatus::Pending);
        assert!(
            message
                .last_error
                .unwrap()
                .message
                .contains("no event named \"pong\"")
        );
    });
}

#[test]
fn a_catch_all_delivers_unknown_names_as_stored_after_typed_ones() {
    run(|| async {
        let store = FaultStore::new();
        let clock = clock();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (typed, any, jobs) = (seen.clone(), seen.clone(), seen.clone());
        let coordinator = DrainCoordinator::builder(store.clone())
            .registry(
                Registry::builder()
                    .event::<Ping>()
                    .any(MessageKind::Event)
                    .any(MessageKind::Job)
                    .build()
                    .unwrap(),
            )
            .event_bus(
                InProcessBus::new()
                    .on(move |ping: Arc<Ping>, _ctx| {
                        typed.lock().unwrap().push(format!("ping {}", ping.n));
                        async { Ok(()) }
                    })
                    .on_any(move |message: Arc<RawMessage>, _ctx| {
                        any.lock().unwrap().push(format!(
                            "{} {} {}",
                            message.kind,
                            message.name,
                            message.payload.as_str()
                        ));
                        async { Ok(()) }
                    }),
            )
            .job_dispatcher(InProcessJobs::new().on_any(move |job: RawMessage, _ctx| {
                jobs.lock()
                    .unwrap()
                    .push(format!("{} {}", job.kind, job.name));
                async { Err(DeliveryError::msg("no worker for it here")) }
            }))
            .config(config())
            .clock(clock.clone())
            .start()
            .unwrap();
        let raw = |kind, name: &str, json: &str| {
            NewMessage::new(kind, name, Payload::from_json(json).unwrap()).at(clock.now())
        };
        store
            .enqueue(NewMessage::event(&ping(1, 0)).unwrap().at(clock.now()))
            .await
            .unwrap();
        store
            .enqueue(raw(MessageKind::Event, "pong", r#"{"n":2}"#))
            .await
            .unwrap();
        let job = store
            .enqueue(raw(MessageKind::Job, "reindex", "{}"))
            .await
            .unwrap();
        let report = coordinator.send(Drain).await.unwrap().unwrap();
        assert_eq!((report.delivered, report.retried), (2, 1), "{report}");
        assert_eq!(
            *seen.lock().unwrap(),
            ["ping 1", r#"event pong {"n":2}"#, "job reindex"]
        );
        let failed = store.inner().get_message(&job).await.unwrap();
        assert_eq!(failed.status, MessageStatus::Pending);
        assert_eq!(failed.last_error.unwrap().message, "no worker for it here");
    });
}

#[test]
fn a_catch_all_without_its_transport_refuses_the_pass() {
    run(|| async {
        let store = FaultStore::new();
        let clock = clock();
        store
            .enqueue(
                NewMessage::new(
                    MessageKind::Job,
                    "reindex",
                    Payload::from_json("{}").unwrap(),
                )
                .at(clock.now()),
            )
            .await
            .unwrap();
        let coordinator = DrainCoordinator::builder(store.clone())
            .registry(Registry::builder().any(MessageKind::Job).build().unwrap())
            .clock(clock)
            .start()
            .unwrap();
        let refused = coordinator.send(Drain).await.unwrap().unwrap_err();
        assert!(
            matches!(
                refused,
                Error::Outbox(CoreError::MissingTransport {
                    kind: MessageKind::Job,
                    ..
                })
            ),
            "{refused}"
        );
        assert!(refused.to_string().contains("any other name"), "{refused}");
        assert_eq!(store.calls(Op::Claim), 0);
    });
}

#[derive(Debug, Serialize, Deserialize)]
struct Reindex {
    shard: u32,
}

impl Job for Reindex {
    const NAME: &'static str = "reindex";
    fn retry_policy() -> Option<RetryPolicy> {
        Some(RetryPolicy::fixed(Duration::from_secs(60)).with_max_attempts(2))
    }
}

#[test]
fn a_jobs_own_retry_policy_governs_its_retries() {
    run(|| async {
        let store = FaultStore::new();
        let clock = clock();
        let runs = Arc::new(AtomicUsize::new(0));
        let counter = runs.clone();
        let coordinator = DrainCoordinator::builder(store.clone())
            .registry(Registry::builder().job::<Reindex>().build().unwrap())
            .job_dispatcher(InProcessJobs::new().on(move |job: Reindex, _ctx| {
                counter.fetch_add(1, Ordering::SeqCst);
                async move { Err(DeliveryError::msg(format!("shard {} offline", job.shard))) }
            }))
            .config(config())
            .clock(clock.clone())
            .start()
            .unwrap();
        let message = NewMessage::job(&Reindex { shard: 3 })
            .unwrap()
            .at(clock.now());
        assert_eq!(message.max_attempts, 2, "the job's budget");
        let id = store.enqueue(message).await.unwrap();
        assert_eq!(coordinator.send(Drain).await.unwrap().unwrap().retried, 1);
        let pending = store.inner().get_message(&id).await.unwrap();
        assert_eq!(
            pending.available_at - pending.updated_at,
            chrono::Duration::seconds(60)
        );
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(
            coordinator
                .send(Drain)
                .await
                .unwrap()
                .unwrap()
                .dead_lettered,
            1
        );
        assert_eq!(runs.load(Ordering::SeqCst), 2);
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
                Error::Pass {
                    source: CoreError::StoreContract(_),
                    ..
                }
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
            source,
            CoreError::Store {
                operation: "claim_batch",
                ..
            }
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
                Error::Pass {
                    source: CoreError::Timeout { .. },
                    ..
                }
            ),
            "{error}"
        );
        assert_eq!(h.drain().await.delivered, 1);
    });
}

#[test]
fn a_committed_message_wakes_an_idle_coordinator() {
    run(|| async {
        let h = Harness::start_with(FaultStore::new(), config(), |b| b.wake_on_insert(true));
        settle().await;
        let id = h.enqueue(ping(1, 0)).await;
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(h.status(&id).await, MessageStatus::Delivered);
        // A burst while a pass runs becomes one follow-up pass.
        for n in 0..20 {
            h.enqueue(ping(n, 100)).await;
        }
        tokio::time::sleep(Duration::from_secs(10)).await;
        let status = h.coordinator.send(GetStatus).await.unwrap();
        assert_eq!(status.totals.delivered, 21);
        assert!(status.passes <= 3, "{status:?}");
    });
}

async fn settle() {
    support::settle_mailboxes().await;
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

#[test]
fn invalid_configuration_is_refused_at_start_naming_each_field() {
    run(|| async {
        let error = DrainCoordinator::builder(FaultStore::new())
            .config(DrainConfig {
                batch_size: 2,
                concurrency: 3,
                lease: Duration::from_millis(1),
                ..DrainConfig::default()
            })
            .start()
            .unwrap_err();
        let Error::Outbox(CoreError::Config(config)) = &error else {
            panic!("{error}")
        };
        assert!(
            config.names("concurrency") && config.names("lease"),
            "{error}"
        );
    });
}

/// A coordinator started on another arbiter answers like any other.
#[test]
fn a_coordinator_runs_on_a_given_arbiter() {
    actix::System::new().block_on(async {
        let arbiter = Arbiter::new();
        let store = FaultStore::new();
        store
            .enqueue(NewMessage::event(&ping(1, 0)).unwrap())
            .await
            .unwrap();
        let coordinator = DrainCoordinator::builder(store.clone())
            .registry(registry())
            .event_bus(InProcessBus::new().on(|_: Arc<Ping>, _| async { Ok(()) }))
            .start_in(&arbiter.handle())
            .unwrap();
        assert_eq!(coordinator.send(Drain).await.unwrap().unwrap().delivered, 1);
        coordinator
            .send(Shutdown {
                grace: Duration::ZERO,
            })
            .await
            .unwrap();
        arbiter.stop();
    });
}

/// Deliveries spread over several arbiters: a handler that hogs its thread
/// does not stall a delivery on another. Real threads, so real time; the
/// time bound only turns a hang into a failure.
#[test]
fn a_busy_handler_does_not_stall_deliveries_on_other_arbiters() {
    use std::sync::atomic::AtomicBool;

    #[derive(Debug, Serialize, Deserialize)]
    struct Spin {
        hog: bool,
    }
    impl Event for Spin {
        const NAME: &'static str = "spin";
    }

    let system = actix::System::new();
    system.block_on(async {
        let store = FaultStore::new();
        let flag = Arc::new(AtomicBool::new(false));
        let saw_flag = Arc::new(AtomicBool::new(false));
        let (flag_in, saw_in) = (flag.clone(), saw_flag.clone());
        let bus = InProcessBus::new().on(move |spin: Arc<Spin>, _ctx| {
            let (flag, saw) = (flag_in.clone(), saw_in.clone());
            async move {
                if spin.hog {
                    let deadline = std::time::Instant::now() + Duration::from_secs(20);
                    while std::time::Instant::now() < deadline {
                        if flag.load(Ordering::SeqCst) {
                            saw.store(true, Ordering::SeqCst);
                            break;
                        }
                        std::hint::spin_loop();
                    }
                } else {
                    flag.store(true, Ordering::SeqCst);
                }
                Ok(())
            }
        });
        let coordinator = DrainCoordinator::builder(store.clone())
            .registry(Registry::builder().event::<Spin>().build().unwrap())
            .event_bus(bus)
            .config(DrainConfig {
                concurrency: 2,
                delivery_arbiters: 2,
                ..DrainConfig::default()
            })
            .start()
            .unwrap();
        store
            .enqueue(NewMessage::event(&Spin { hog: true }).unwrap())
            .await
            .unwrap();
        store
            .enqueue(NewMessage::event(&Spin { hog: false }).unwrap())
            .await
            .unwrap();
        let r = coordinator.send(Drain).await.unwrap().unwrap();
        assert_eq!(r.delivered, 2);
        assert!(
            saw_flag.load(Ordering::SeqCst),
            "the hog's arbiter stalled the other delivery"
        );
        coordinator
            .send(Shutdown {
                grace: Duration::from_secs(1),
            })
            .await
            .unwrap();
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
