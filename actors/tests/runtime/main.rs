//! The runtime's tests: one binary, one module per theme.
//!
//! The behaviour tests run the actix system on virtual time: a paused tokio
//! runtime with a clock tied to tokio's `Instant`, so minutes of leases pass
//! in microseconds. The tests against real databases and the actix-web
//! example run on real time.
//!
//! # Layout
//!
//! - `passes`, `prefetch`, `claims`, `lease`, `settlement`, `outages`,
//!   `shutdown`, `registry`, `faults`, `budget`, `ordering`, `retention`:
//!   one test per behaviour, against the scriptable fault store of
//!   `support`, through the [`Harness`] below.
//! - `queues`: named queues, pausing and cancelling, over the memory
//!   store (its admin side pauses and cancels).
//! - `schedules`: periodic schedules on the memory store, several
//!   coordinators at once, on virtual time; `schedules_sql`, with a store
//!   feature: the same on one SQLite file and one PostgreSQL table, still on
//!   virtual time (each store call on a blocking thread).
//! - `telemetry`, and `telemetry_otel` with the `opentelemetry` feature:
//!   spans, events and metrics.
//! - `events`: the list of tracing events checked against the code that
//!   emits them.
//! - `testing`, with the `testing` feature: the helpers applications' tests
//!   use.
//! - `sqlite` and `postgres`, with the feature of the same name, sharing
//!   `sql_support`: end to end on real databases.
//! - `pg_restart`, with the `postgres` feature: PostgreSQL restarted as a
//!   crash would mid-drain; it runs only under `scripts/with-postgres
//!   --restartable`, on its own.
//! - `failover`, with the `postgres` feature: the primary stopped mid-drain
//!   and its standby promoted behind HAProxy; it runs only under
//!   `scripts/with-postgres --standby`.
//! - `actix_web`, with the `sqlite` feature: the actix-web example over HTTP.

mod support;

mod budget;
mod claims;
mod events;
mod faults;
mod lease;
mod ordering;
mod outages;
mod passes;
mod prefetch;
mod queues;
mod registry;
mod retention;
mod schedules;
mod settlement;
mod shutdown;
mod telemetry;
#[cfg(feature = "opentelemetry")]
mod telemetry_otel;
#[cfg(feature = "testing")]
mod testing;

// Gated on the features they need, since one test binary cannot use
// `required-features` per module.
#[cfg(feature = "sqlite")]
mod actix_web;
#[cfg(feature = "postgres")]
mod failover;
#[cfg(feature = "postgres")]
mod pg_restart;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod schedules_sql;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod sql_support;
#[cfg(feature = "sqlite")]
mod sqlite;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use chrono::{DateTime, Utc};
use outbox::{
    Clock, DeliveryContext, DeliveryError, DrainConfig, Event, InProcessBus, MessageStatus,
    NewMessage, OutboxAdmin, OutboxStore, Registry, RetryPolicy, TokioClock,
};
use outbox_actors::{
    DeadLetter, Drain, DrainCoordinator, DrainObserver, DrainReport, LeaseLost, ObserverResult,
};
use serde::{Deserialize, Serialize};
use support::{FaultStore, Recorder, clock};

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

/// The drain most tests study: nothing claimed ahead and one claim at a
/// time, so every claim and start falls where the test says. The sizing a
/// default config gets has tests of its own (`sizing`).
fn config() -> DrainConfig {
    DrainConfig {
        retry: RetryPolicy::fixed(Duration::from_secs(5)),
        prefetch: Some(0),
        claims_in_flight: Some(1),
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
        self.store.enqueue(message).await.unwrap().into_id()
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

async fn settle() {
    support::settle_mailboxes().await;
}
