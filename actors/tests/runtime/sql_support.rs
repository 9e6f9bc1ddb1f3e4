//! What the end-to-end tests of the runtime against real databases share: a
//! handler that reports every delivery as it starts and ends (and can be held
//! at a gate), bounded waits, and the check that a pass's report accounts for
//! every claimed message.
//!
//! These tests run on real time with the system clock: a paused tokio clock
//! would fire leases, pool timeouts and settlement windows while the runtime
//! waits on the database. Nothing sleeps to observe a behaviour: each test
//! awaits the handler's reports or the coordinator's answers, and bounds
//! every wait only so that a failure ends the test instead of hanging it.
#![allow(dead_code, unreachable_pub, missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::Addr;
use outbox::{DeliveryContext, DrainConfig, Event, InProcessBus, OutboxStore, Registry};
use outbox_actors::{
    CoordinatorStatus, DrainCoordinator, DrainReport, GetStatus, LeaseLost, LeaseState,
    OutcomeNotice,
};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};

/// The test event. A held ping waits at the probe's gate before it returns.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Ping {
    pub n: u64,
    #[serde(default)]
    pub hold: bool,
}

impl Event for Ping {
    const NAME: &'static str = "ping";
}

/// The business event of the transactional tests.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OrderPlaced {
    pub order_id: i64,
}

impl Event for OrderPlaced {
    const NAME: &'static str = "order.placed";
}

pub fn ping(n: u64) -> outbox::NewMessage {
    outbox::NewMessage::event(&Ping { n, hold: false })
        .unwrap()
        .with_id(format!("m{n:05}"))
}

pub fn held_ping(n: u64) -> outbox::NewMessage {
    outbox::NewMessage::event(&Ping { n, hold: true })
        .unwrap()
        .with_id(format!("m{n:05}"))
}

pub fn registry() -> Registry {
    Registry::builder()
        .event::<Ping>()
        .event::<OrderPlaced>()
        .build()
        .unwrap()
}

/// One delivery as its handler saw it.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub id: String,
    pub attempt: u32,
    pub worker: usize,
    pub started: Instant,
    pub finished: Instant,
}

/// The handler side: reports each delivery's start and end.
#[derive(Clone)]
pub struct Probe {
    worker: usize,
    started: mpsc::UnboundedSender<String>,
    finished: mpsc::UnboundedSender<Delivery>,
    gate: watch::Receiver<bool>,
}

/// The test side of a [`Probe`].
pub struct Reports {
    pub started: mpsc::UnboundedReceiver<String>,
    pub finished: mpsc::UnboundedReceiver<Delivery>,
    gate: watch::Sender<bool>,
}

pub fn probe() -> (Probe, Reports) {
    let (started, started_rx) = mpsc::unbounded_channel();
    let (finished, finished_rx) = mpsc::unbounded_channel();
    let (gate, gate_rx) = watch::channel(false);
    (
        Probe {
            worker: 0,
            started,
            finished,
            gate: gate_rx,
        },
        Reports {
            started: started_rx,
            finished: finished_rx,
            gate,
        },
    )
}

impl Probe {
    /// The same probe, reporting deliveries as made by `worker`.
    pub fn for_worker(&self, worker: usize) -> Probe {
        Probe {
            worker,
            ..self.clone()
        }
    }

    async fn handle(&self, context: DeliveryContext, hold: bool) -> outbox::DeliveryResult {
        let started = Instant::now();
        let _ = self.started.send(context.id().to_owned());
        if hold {
            let mut gate = self.gate.clone();
            let _ = gate.wait_for(|open| *open).await;
        }
        // Give other deliveries a turn, so overlapping runs would show.
        tokio::task::yield_now().await;
        let _ = self.finished.send(Delivery {
            id: context.id().to_owned(),
            attempt: context.attempt(),
            worker: self.worker,
            started,
            finished: Instant::now(),
        });
        Ok(())
    }

    /// An event bus that runs every [`Ping`] and [`OrderPlaced`] through
    /// this probe.
    pub fn bus(&self) -> InProcessBus {
        let pings = self.clone();
        let orders = self.clone();
        InProcessBus::new()
            .on(move |ping: Arc<Ping>, context: DeliveryContext| {
                let probe = pings.clone();
                async move { probe.handle(context, ping.hold).await }
            })
            .on(move |_: Arc<OrderPlaced>, context: DeliveryContext| {
                let probe = orders.clone();
                async move { probe.handle(context, false).await }
            })
    }
}

impl Reports {
    /// Let held deliveries finish.
    pub fn open_gate(&self) {
        self.gate.send_replace(true);
    }

    /// The ids of the next `n` deliveries to start.
    pub async fn started(&mut self, n: usize) -> Vec<String> {
        let mut ids = Vec::with_capacity(n);
        within(&format!("{n} deliveries start"), BOUND, async {
            while ids.len() < n {
                ids.push(self.started.recv().await.expect("the probe lives"));
            }
        })
        .await;
        ids
    }

    /// The next `n` deliveries to finish.
    pub async fn finished(&mut self, n: usize) -> Vec<Delivery> {
        let mut done = Vec::with_capacity(n);
        within(&format!("{n} deliveries finish"), BOUND, async {
            while done.len() < n {
                done.push(self.finished.recv().await.expect("the probe lives"));
            }
        })
        .await;
        done
    }

    /// Deliveries that finished and were not taken yet.
    pub fn finished_so_far(&mut self) -> Vec<Delivery> {
        let mut done = Vec::new();
        while let Ok(delivery) = self.finished.try_recv() {
            done.push(delivery);
        }
        done
    }
}

/// The bound on any single wait: long enough for a loaded machine, short
/// enough that a broken test fails rather than hangs.
pub const BOUND: Duration = Duration::from_secs(20);

/// Await `future`, failing the test if it takes longer than `bound`.
pub async fn within<T>(what: &str, bound: Duration, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(bound, future)
        .await
        .unwrap_or_else(|_| panic!("timed out after {bound:?} waiting until {what}"))
}

/// Poll `check` until it holds, for at most [`BOUND`]. Only for state that
/// announces no change (the database, a coordinator between passes).
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let give_up = Instant::now() + BOUND;
    while !check().await {
        assert!(Instant::now() < give_up, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Start a coordinator on the current actix system. No schedule: passes run
/// only on `Drain` and, when `wake` is set, on the store's wake-ups.
pub fn coordinator(
    store: impl OutboxStore,
    probe: &Probe,
    config: DrainConfig,
    wake: bool,
) -> Addr<DrainCoordinator> {
    DrainCoordinator::builder(store)
        .registry(registry())
        .event_bus(probe.bus())
        .config(config)
        .wake_on_insert(wake)
        .start()
        .unwrap()
}

pub async fn status(coordinator: &Addr<DrainCoordinator>) -> CoordinatorStatus {
    coordinator.send(GetStatus).await.unwrap()
}

/// Wait until the coordinator runs no pass and has none queued.
pub async fn idle(coordinator: &Addr<DrainCoordinator>) -> CoordinatorStatus {
    eventually("the coordinator is idle", || async {
        let status = status(coordinator).await;
        !status.running && !status.follow_up_queued
    })
    .await;
    status(coordinator).await
}

/// Collects the notifications a coordinator sends its subscribers.
#[derive(Clone, Default)]
pub struct Notices {
    pub leases: Arc<std::sync::Mutex<Vec<LeaseLost>>>,
    pub outcomes: Arc<std::sync::Mutex<Vec<OutcomeNotice>>>,
}

impl actix::Actor for Notices {
    type Context = actix::Context<Self>;
}

impl actix::Handler<LeaseLost> for Notices {
    type Result = ();
    fn handle(&mut self, lost: LeaseLost, _: &mut Self::Context) {
        self.leases.lock().unwrap().push(lost);
    }
}

impl actix::Handler<OutcomeNotice> for Notices {
    type Result = ();
    fn handle(&mut self, notice: OutcomeNotice, _: &mut Self::Context) {
        self.outcomes.lock().unwrap().push(notice);
    }
}

impl Notices {
    /// Start collecting from `coordinator`.
    pub async fn subscribe(coordinator: &Addr<DrainCoordinator>) -> Notices {
        use actix::Actor;
        let notices = Notices::default();
        let address = notices.clone().start();
        coordinator
            .send(outbox_actors::Subscribe::LeaseLost(
                address.clone().recipient(),
            ))
            .await
            .unwrap();
        coordinator
            .send(outbox_actors::Subscribe::Outcomes(address.recipient()))
            .await
            .unwrap();
        notices
    }

    /// Take what arrived so far.
    pub fn take(&self) -> (Vec<LeaseLost>, Vec<OutcomeNotice>) {
        (
            std::mem::take(&mut *self.leases.lock().unwrap()),
            std::mem::take(&mut *self.outcomes.lock().unwrap()),
        )
    }
}

/// Check that `report` gives every claimed message exactly one outcome, as
/// the notifications of the same pass tell it: a settlement failure that
/// lost its claim counts in both `settlement_failed` and `lease_lost`, and
/// every lease loss and settlement failure was announced.
pub fn assert_accounts_for_every_claim(
    report: &DrainReport,
    leases: &[LeaseLost],
    outcomes: &[OutcomeNotice],
) {
    let failures: Vec<_> = outcomes
        .iter()
        .filter_map(|notice| match notice {
            OutcomeNotice::SettlementFailed(failure) => Some(failure),
            _ => None,
        })
        .collect();
    let lost_while_settling = failures.iter().filter(|f| f.claim_lost).count() as u64;
    // A claim lost at the first settlement write is heard twice (a lost
    // lease and a settlement failure) and counted once: count claims.
    let lost_claims: std::collections::HashSet<(&str, u32)> = leases
        .iter()
        .filter(|lease| lease.state == LeaseState::Lost)
        .map(|lease| (lease.id.as_str(), lease.attempt))
        .chain(
            failures
                .iter()
                .filter(|f| f.claim_lost)
                .map(|f| (f.id.as_str(), f.attempt)),
        )
        .collect();
    assert_eq!(
        failures.len() as u64,
        report.settlement_failed,
        "one notice per settlement failure: {report}"
    );
    assert_eq!(
        lost_claims.len() as u64,
        report.lease_lost,
        "a notice for every lost lease: {report}"
    );
    let outcomes = report.delivered
        + report.retried
        + (report.dead_lettered - report.abandoned_dead_lettered)
        + report.settlement_failed
        + (report.lease_lost - lost_while_settling)
        + report.released;
    assert_eq!(
        outcomes, report.claimed,
        "every claimed message has exactly one outcome: {report}"
    );
}
