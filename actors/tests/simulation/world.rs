//! One schedule: a coordinator (and the ones that replace it after each
//! shutdown) drains messages over the simulated store while faults are
//! drawn from the seed; then the invariants are checked.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use chrono::{DateTime, TimeZone, Utc};
use outbox::{
    Clock, DeliveryContext, DeliveryError, DrainConfig, Event, InProcessBus, MessageStatus,
    NewMessage, OutboxStore, Registry, RetryPolicy, SettlementConfig, TokioClock,
};
use outbox_actors::{
    Drain, DrainCoordinator, DrainReport, GetStatus, LeaseLost, LeaseState, OutcomeNotice, Shutdown,
};
use serde::{Deserialize, Serialize};

use crate::rng::Rng;
use crate::store::{Rates, SimStore, Trace, note};

/// The message every schedule sends: how its handler behaves on each attempt.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Task {
    pub n: u32,
    pub work_ms: u64,
    /// Fail while the attempt is at most this.
    pub fail_until: u32,
    /// Panic while the attempt is at most this.
    pub panic_until: u32,
    /// Never return while the attempt is at most this.
    pub hang_until: u32,
}

impl Event for Task {
    const NAME: &'static str = "sim.task";
}

/// The panic message of a handler told to panic; the panic hook stays quiet for it.
pub(crate) const HANDLER_PANIC: &str = "simulated handler panic";

/// Longest any single wait of the driver may take, in virtual time, before
/// the schedule is declared stuck.
const STUCK: Duration = Duration::from_secs(6 * 60 * 60);

/// What the handlers did, per message.
#[derive(Default)]
struct Runs {
    next: u64,
    /// Runs in progress: run number and start time, per message.
    active: HashMap<String, Vec<(u64, DateTime<Utc>)>>,
    /// A run that started while `.0` was in progress, at `.1`.
    watched: Vec<(u64, String, DateTime<Utc>)>,
    /// Handlers that returned `Ok`, per message.
    succeeded: HashMap<String, u32>,
    violations: Vec<String>,
    started: u64,
}

#[derive(Clone, Default)]
struct Handlers(Arc<Mutex<Runs>>, Trace);

struct RunGuard {
    handlers: Handlers,
    id: String,
    run: u64,
    clock: TokioClock,
}

impl Drop for RunGuard {
    fn drop(&mut self) {
        let now = self.clock.now();
        note(&self.handlers.1, &self.clock, || {
            format!("handler of {} (run {}) ended", self.id, self.run)
        });
        let mut runs = self.handlers.0.lock().unwrap();
        if let Some(active) = runs.active.get_mut(&self.id) {
            active.retain(|(run, _)| *run != self.run);
        }
        let overlapped: Vec<String> = runs
            .watched
            .iter()
            .filter(|(run, _, started)| *run == self.run && now > *started)
            .map(|(_, id, started)| {
                format!("two handlers of {id} overlapped: one started at {started} ended at {now}")
            })
            .collect();
        runs.watched.retain(|(run, _, _)| *run != self.run);
        runs.violations.extend(overlapped);
    }
}

impl Handlers {
    fn enter(&self, id: &str, clock: &TokioClock) -> RunGuard {
        let now = clock.now();
        let mut runs = self.0.lock().unwrap();
        runs.next += 1;
        runs.started += 1;
        let run = runs.next;
        note(&self.1, clock, || {
            format!("handler of {id} (run {run}) started")
        });
        let others: Vec<u64> = runs
            .active
            .get(id)
            .map(|active| active.iter().map(|(run, _)| *run).collect())
            .unwrap_or_default();
        for other in others {
            runs.watched.push((other, id.to_owned(), now));
        }
        runs.active
            .entry(id.to_owned())
            .or_default()
            .push((run, now));
        RunGuard {
            handlers: self.clone(),
            id: id.to_owned(),
            run,
            clock: clock.clone(),
        }
    }

    fn succeeded(&self, id: &str) {
        *self
            .0
            .lock()
            .unwrap()
            .succeeded
            .entry(id.to_owned())
            .or_default() += 1;
    }
}

fn bus(handlers: &Handlers, clock: &TokioClock) -> InProcessBus {
    let handlers = handlers.clone();
    let clock = clock.clone();
    InProcessBus::new().on(move |task: Arc<Task>, context: DeliveryContext| {
        let guard = handlers.enter(context.id(), &clock);
        let handlers = handlers.clone();
        async move {
            let attempt = context.attempt();
            tokio::time::sleep(Duration::from_millis(task.work_ms)).await;
            if attempt <= task.hang_until {
                std::future::pending::<()>().await;
            }
            if attempt <= task.panic_until {
                panic!("{HANDLER_PANIC}");
            }
            drop(guard);
            if attempt <= task.fail_until {
                return Err(DeliveryError::msg(format!("attempt {attempt} fails")));
            }
            handlers.succeeded(context.id());
            Ok(())
        }
    })
}

/// Records every notice one coordinator sends.
#[derive(Clone, Default)]
struct Recorder {
    leases: Arc<Mutex<Vec<LeaseLost>>>,
    outcomes: Arc<Mutex<Vec<OutcomeNotice>>>,
}

impl Actor for Recorder {
    type Context = Context<Self>;
}

impl Handler<LeaseLost> for Recorder {
    type Result = ();
    fn handle(&mut self, lost: LeaseLost, _: &mut Context<Self>) {
        self.leases.lock().unwrap().push(lost);
    }
}

impl Handler<OutcomeNotice> for Recorder {
    type Result = ();
    fn handle(&mut self, notice: OutcomeNotice, _: &mut Context<Self>) {
        self.outcomes.lock().unwrap().push(notice);
    }
}

/// One coordinator's life: from its start to the answer of its shutdown.
struct Incarnation {
    owner: usize,
    coordinator: Addr<DrainCoordinator>,
    recorder: Recorder,
    /// Totals before shutdown plus the pass shutdown interrupted.
    totals: Option<DrainReport>,
}

/// What the whole run of one schedule adds to the summary.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Tally {
    pub messages: u64,
    pub incarnations: u64,
    pub handler_runs: u64,
    pub totals: DrainReport,
    pub faults: [u64; 6],
    pub stale_now_writes: u64,
}

/// A failed schedule: every invariant it broke.
#[derive(Debug)]
pub(crate) struct Failure {
    pub violations: Vec<String>,
    pub schedule: String,
}

/// A coordinator told to stop: its number, the totals asked for just
/// before, and the shutdown's answer.
type Stopping = (
    usize,
    Request<DrainCoordinator, GetStatus>,
    Request<DrainCoordinator, Shutdown>,
);

struct World {
    rng: Rng,
    clock: TokioClock,
    store: SimStore,
    config: DrainConfig,
    wake_on_insert: bool,
    handlers: Handlers,
    incarnations: Vec<Incarnation>,
    /// Shutdowns sent, with the totals asked for just before, not yet awaited.
    stopping: Vec<Stopping>,
    ids: Vec<String>,
    violations: Vec<String>,
}

fn epoch() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap()
}

/// Draw the configuration of a schedule.
fn draw_config(rng: &mut Rng, seed: u64) -> DrainConfig {
    let concurrency = rng.range(1, 6) as usize;
    let lease = Duration::from_millis(rng.range(2_000, 30_000));
    let heartbeat = rng
        .chance(0.3)
        .then(|| lease.mul_f64(0.2 + 0.6 * rng.unit()));
    DrainConfig {
        concurrency,
        // From the seed rather than the generator, so every other draw of a
        // seed stays what it was before prefetch existed: none to three
        // messages ahead, or sized by the drain.
        prefetch: [Some(0), Some(1), Some(2), Some(3), None][(seed % 5) as usize],
        // Likewise: one to three claims in flight, or the store's choice.
        claims_in_flight: [Some(1), Some(2), Some(3), None][(seed / 5 % 4) as usize],
        batch_size: concurrency + rng.below(8) as usize,
        lease,
        heartbeat,
        max_active: Duration::from_millis(rng.range(3_000, 60_000)),
        retry: RetryPolicy::fixed(Duration::from_millis(rng.range(100, 3_000))).with_seed(seed),
        settlement: SettlementConfig {
            attempts: rng.range(1, 4) as u32,
            delay: Duration::from_millis(rng.range(10, 500)),
        },
        every: rng
            .chance(0.3)
            .then(|| Duration::from_millis(rng.range(500, 20_000))),
        delivery_arbiters: 0,
        ordering: Default::default(),
        retention: Default::default(),
        queues: Default::default(),
    }
}

/// Draw how stormy the store is: some schedules are calm, most are not.
fn draw_rates(rng: &mut Rng) -> Rates {
    let storm = [0.0, 0.3, 1.0, 1.0, 2.0][rng.below(5) as usize];
    let mut rate = |max: f64| storm * max * rng.unit();
    Rates {
        transient: rate(0.12),
        transient_after: rate(0.06),
        claim: rate(0.04),
        delay_before: rate(0.08),
        delay_after: rate(0.08),
        hang: rate(0.02),
        max_delay: Duration::from_millis(rng.range(10, 40_000)),
    }
}

fn draw_task(rng: &mut Rng, n: u32) -> Task {
    let work_ms = match rng.below(10) {
        0 => rng.range(5_000, 70_000),
        1..=3 => rng.below(5_000),
        _ => rng.below(300),
    };
    let mut until = |p: f64| {
        if rng.chance(p) {
            rng.range(1, 3) as u32
        } else {
            0
        }
    };
    Task {
        n,
        work_ms,
        fail_until: until(0.25),
        panic_until: until(0.05),
        hang_until: until(0.05),
    }
}

impl World {
    fn new(seed: u64, trace: Trace) -> Self {
        let mut rng = Rng::new(seed);
        let config = draw_config(&mut rng, seed);
        let rates = draw_rates(&mut rng);
        let wake_on_insert = rng.chance(0.5);
        let clock = TokioClock::starting_at(epoch());
        World {
            store: SimStore::new(seed, rates, clock.clone(), trace.clone()),
            rng,
            clock,
            config,
            wake_on_insert,
            handlers: Handlers(Arc::default(), trace),
            incarnations: Vec::new(),
            stopping: Vec::new(),
            ids: Vec::new(),
            violations: Vec::new(),
        }
    }

    fn describe(&self) -> String {
        format!(
            "concurrency {}, batch {}, lease {:?}, heartbeat {:?}, max_active {:?}, \
             settlement {:?}, every {:?}, wake_on_insert {}",
            self.config.concurrency,
            self.config.batch_size,
            self.config.lease,
            self.config.heartbeat(),
            self.config.max_active,
            self.config.settlement,
            self.config.every,
            self.wake_on_insert
        )
    }

    fn start(&mut self) {
        let owner = self.incarnations.len();
        let recorder = Recorder::default();
        let address = recorder.clone().start();
        let coordinator = DrainCoordinator::builder(self.store.owned_by(owner))
            .registry(Registry::builder().event::<Task>().build().unwrap())
            .event_bus(bus(&self.handlers, &self.clock))
            .config(self.config.clone())
            .clock(self.clock.clone())
            .wake_on_insert(self.wake_on_insert)
            .subscribe_lease_lost(address.clone().recipient())
            .subscribe_outcomes(address.recipient())
            .start()
            .expect("a drawn configuration is valid");
        self.incarnations.push(Incarnation {
            owner,
            coordinator,
            recorder,
            totals: None,
        });
    }

    fn current(&self) -> &Incarnation {
        self.incarnations.last().expect("a coordinator runs")
    }

    async fn enqueue(&mut self, count: u64) {
        for _ in 0..count {
            let n = self.ids.len() as u32;
            let task = draw_task(&mut self.rng, n);
            let mut message = NewMessage::event(&task)
                .unwrap()
                .with_id(format!("m{n:03}"))
                .with_max_attempts(self.rng.range(1, 6) as u32)
                .at(self.clock.now());
            if self.rng.chance(0.2) {
                let later = self.clock.now()
                    + chrono::Duration::milliseconds(self.rng.below(20_000) as i64);
                message = message.available_at(later);
            }
            let id = self.store.enqueue(message).await.unwrap().into_id();
            self.ids.push(id);
        }
    }

    /// Bound a wait of the driver; `None` (and a violation) when it is stuck.
    async fn bounded<T>(&mut self, what: &str, wait: impl Future<Output = T>) -> Option<T> {
        match tokio::time::timeout(STUCK, wait).await {
            Ok(value) => Some(value),
            Err(_) => {
                self.violations.push(format!(
                    "{what} did not answer within {STUCK:?} of virtual time"
                ));
                None
            }
        }
    }

    async fn drain(&mut self) -> bool {
        let request = self.current().coordinator.send(Drain);
        self.bounded("a Drain", request).await.is_some()
    }

    /// Send a shutdown, and ask for the totals in the same mailbox turn, so
    /// no pass ends between the two.
    fn shut_down(&mut self, grace: Duration) {
        let incarnation = self.current();
        let status = incarnation.coordinator.send(GetStatus);
        let shutdown = incarnation.coordinator.send(Shutdown { grace });
        self.stopping.push((incarnation.owner, status, shutdown));
    }

    /// Wait for every shutdown sent; record each coordinator's totals.
    async fn await_shutdowns(&mut self) -> bool {
        for (owner, status, shutdown) in std::mem::take(&mut self.stopping) {
            let Some(answers) = self
                .bounded("a Shutdown", async move { (status.await, shutdown.await) })
                .await
            else {
                return false;
            };
            match answers {
                (Ok(status), Ok(interrupted)) => {
                    let mut totals = status.totals;
                    totals += interrupted;
                    self.incarnations[owner].totals = Some(totals);
                }
                (status, shutdown) => {
                    self.violations.push(format!(
                        "coordinator {owner} did not answer: {:?} {:?}",
                        status.err(),
                        shutdown.err()
                    ));
                    return false;
                }
            }
        }
        true
    }

    /// The schedule: drains, waits, new messages and shutdowns at moments
    /// drawn from the seed, under faults.
    async fn storm(&mut self) -> bool {
        let steps = self.rng.range(2, 8);
        for _ in 0..steps {
            match self.rng.below(10) {
                0..=3 => {
                    if !self.drain().await {
                        return false;
                    }
                }
                4..=5 => {
                    let lease = self.config.lease.as_millis() as u64;
                    let wait = Duration::from_millis(self.rng.below(2 * lease));
                    tokio::time::sleep(wait).await;
                }
                6..=7 => {
                    let count = self.rng.range(1, 4);
                    self.enqueue(count).await;
                    if self.rng.chance(0.5) {
                        self.current().coordinator.do_send(Drain);
                    }
                }
                _ => {
                    // A shutdown at a random moment, often in the middle of
                    // a pass; the next coordinator starts at once (a rolling
                    // restart) or once the old one stopped.
                    self.current().coordinator.do_send(Drain);
                    let lag = Duration::from_millis(self.rng.below(5_000));
                    tokio::time::sleep(lag).await;
                    let lease = self.config.lease.as_millis() as u64;
                    let grace = Duration::from_millis(self.rng.below(lease));
                    self.shut_down(grace);
                    if self.rng.chance(0.5) && !self.await_shutdowns().await {
                        return false;
                    }
                    self.start();
                }
            }
        }
        true
    }

    /// Faults stop; the last coordinator drains until nothing is pending
    /// or claimed.
    async fn recover(&mut self) -> bool {
        self.store.calm();
        let lease = self.config.lease;
        for _ in 0..200 {
            if !self.drain().await {
                return false;
            }
            let stats = outbox::OutboxAdmin::stats(self.store.inner(), self.clock.now())
                .await
                .unwrap();
            if stats.pending + stats.claimed == 0 {
                return true;
            }
            tokio::time::sleep(lease).await;
        }
        self.violations
            .push("messages still pending or claimed after 200 calm passes".into());
        false
    }

    fn check_incarnation(&mut self, incarnation: &Incarnation) {
        let owner = incarnation.owner;
        let Some(t) = incarnation.totals else {
            self.violations
                .push(format!("coordinator {owner} has no totals"));
            return;
        };
        let answered = self.store.answered(owner);
        let leases = incarnation.recorder.leases.lock().unwrap().clone();
        let outcomes = incarnation.recorder.outcomes.lock().unwrap().clone();
        let settlement_failed: Vec<_> = outcomes
            .iter()
            .filter_map(|n| match n {
                OutcomeNotice::SettlementFailed(f) => Some(f),
                _ => None,
            })
            .collect();
        let lost_while_settling = settlement_failed.iter().filter(|f| f.claim_lost).count() as u64;
        let dead_letters = outcomes
            .iter()
            .filter(|n| matches!(n, OutcomeNotice::DeadLettered(_)))
            .count() as u64;
        let lost = leases
            .iter()
            .filter(|l| l.state == LeaseState::Lost)
            .count() as u64;
        let mut check = |holds: bool, what: String| {
            if !holds {
                self.violations
                    .push(format!("coordinator {owner}: {what} (totals: {t})"));
            }
        };
        let outcomes_sum = t.delivered
            + t.retried
            + (t.dead_lettered - t.abandoned_dead_lettered)
            + t.settlement_failed
            + (t.lease_lost - lost_while_settling)
            + t.released;
        check(
            outcomes_sum == t.claimed,
            format!("{outcomes_sum} outcomes for {} claimed messages", t.claimed),
        );
        check(
            t.claimed == answered.claimed,
            format!("the store answered {} claimed messages", answered.claimed),
        );
        check(
            t.abandoned_dead_lettered == answered.abandoned,
            format!("the store dead-lettered {} at claim", answered.abandoned),
        );
        check(
            t.delivered == answered.delivered,
            format!("the store confirmed {} deliveries", answered.delivered),
        );
        check(
            t.retried == answered.retried,
            format!("the store confirmed {} retries", answered.retried),
        );
        check(
            t.dead_lettered - t.abandoned_dead_lettered == answered.dead_lettered,
            format!(
                "the store confirmed {} dead letters after delivery",
                answered.dead_lettered
            ),
        );
        check(
            t.released == answered.released,
            format!("the store confirmed {} releases", answered.released),
        );
        check(
            dead_letters == t.dead_lettered,
            format!("subscribers heard {dead_letters} dead letters"),
        );
        check(
            settlement_failed.len() as u64 == t.settlement_failed,
            format!(
                "subscribers heard {} settlement failures",
                settlement_failed.len()
            ),
        );
        // Every lost claim is heard as a lost lease, those lost while
        // settling and those not given back at shutdown included.
        check(
            lost == t.lease_lost,
            format!(
                "subscribers heard {lost} lost leases ({lost_while_settling} lost while \
                 settling, {} releases failed)",
                answered.release_failed
            ),
        );
    }

    /// Every invariant, once the run is over.
    async fn check(&mut self) -> Tally {
        let messages = self.store.all_messages().await;
        if messages.len() != self.ids.len() {
            self.violations.push(format!(
                "{} messages enqueued, {} in the store",
                self.ids.len(),
                messages.len()
            ));
        }
        let runs = std::mem::take(&mut *self.handlers.0.lock().unwrap());
        for message in &messages {
            if !message.status.is_terminal() {
                self.violations.push(format!(
                    "{} ended {} (attempt {} of {})",
                    message.id, message.status, message.attempts, message.max_attempts
                ));
            }
            if message.status == MessageStatus::Delivered
                && runs.succeeded.get(&message.id).copied().unwrap_or(0) == 0
            {
                self.violations.push(format!(
                    "{} is delivered but no handler of it succeeded",
                    message.id
                ));
            }
        }
        self.violations.extend(runs.violations);
        for (run, id, started) in &runs.watched {
            self.violations.push(format!(
                "a handler of {id} (run {run}) never ended, and another started at {started}"
            ));
        }
        self.violations.extend(self.store.violations());
        let incarnations = std::mem::take(&mut self.incarnations);
        let mut totals = DrainReport::default();
        for incarnation in &incarnations {
            self.check_incarnation(incarnation);
            totals += incarnation.totals.unwrap_or_default();
        }
        let counts = self.store.counts();
        Tally {
            messages: self.ids.len() as u64,
            incarnations: incarnations.len() as u64,
            handler_runs: runs.started,
            totals,
            faults: counts.injected,
            stale_now_writes: counts.stale_now_writes,
        }
    }
}

/// Let every actor work through its mailbox (no virtual time passes).
async fn settle_mailboxes() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

/// Run the schedule of `seed` and check every invariant.
pub(crate) async fn run(seed: u64, trace: Trace) -> Result<Tally, Failure> {
    let mut world = World::new(seed, trace);
    let schedule = world.describe();
    let count = world.rng.range(1, 12);
    world.enqueue(count).await;
    world.start();
    let finished = world.storm().await && world.await_shutdowns().await && world.recover().await;
    if finished {
        world.shut_down(Duration::ZERO);
        world.await_shutdowns().await;
    }
    settle_mailboxes().await;
    let outcome = world.check().await;
    if world.violations.is_empty() {
        Ok(outcome)
    } else {
        Err(Failure {
            violations: world.violations,
            schedule,
        })
    }
}
