//! `DrainCoordinator`: the long-lived actor an application talks to.
//!
//! One per outbox. It owns the configuration, store, registry, transports,
//! observers and subscribers; runs passes on [`Drain`] (never two at once:
//! Drains that arrive during a pass are coalesced into one follow-up pass and
//! all get its report), on its own schedule (ticks that find a pass running
//! start no second one) and on wake-ups from the store; tallies each pass
//! from the outcome messages of its deliveries; and fans notifications out
//! to subscribers.
//!
//! A pass that spent its whole budget (its last claim came back full) is
//! followed at once by the next one, and so on while claims come back full:
//! a backlog drains at the speed of the store and the handlers, whatever
//! the schedule. Only a pass that ended on an empty or short claim waits
//! for a `Drain`, a tick, a wake-up or a due time, so an empty store never
//! spins. Passes of such a chain still never overlap; Drains that arrive
//! during one join the next pass of the chain and get its report; a
//! shutdown ends the chain.
//!
//! Some stores wake only drains that asked (PostgreSQL: `NOTIFY` serializes
//! the commits that send it, so enqueues send it only when a drain waits;
//! see [`outbox::Wakeups::arm`]). With such a store the coordinator arms
//! before a pass's first claim unless it is armed already, and stays armed
//! until a wake-up comes. A pass that could not arm (an enqueue was in
//! flight) and ended on an empty or short claim is followed by another
//! after 1 ms, then twice as long each time up to 25 ms, until one arms:
//! what committed meanwhile is claimed without a wake-up.
//!
//! A pass ends only when its slowest delivery ends. So that one slow handler
//! does not hold back messages committed meanwhile, every `Drain`, tick and
//! wake-up that arrives during a pass also lets the running pass claim again
//! for its idle slots (within its budget), even after a claim came back
//! empty.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use chrono::{DateTime, DurationRound, Utc};
use outbox::{ArmWakeups, OutboxStore, SharedStore};
use tokio::sync::oneshot;

mod builder;
mod schedules;

pub use builder::DrainCoordinatorBuilder;
use builder::Parts;
pub use schedules::GetSchedules;

use crate::claimer::{self, Claimer, Refill, WindDown};
use crate::context::{DrainContext, after, until};
use crate::error::{Error, Result};
use crate::messages::{Abandoned, Arming, ClaimerDone, DeliveryFinished};
use crate::notices::{LeaseLost, Notice, OutcomeNotice};
use crate::report::{DrainReport, Outcome};
use crate::retention;
use crate::telemetry;

/// Run a drain pass and answer with its report.
///
/// If a pass is running, this joins the one follow-up pass that starts when
/// it ends (however many Drains arrive meanwhile) and answers with that
/// report. A pass that spent its whole batch starts the next by itself, so
/// the report covers the pass this `Drain` ran or joined, not the passes
/// chained after it: [`GetStatus`] has the totals.
#[derive(Debug, Clone, Copy, Default, Message)]
#[rtype(result = "Result<DrainReport>")]
pub struct Drain;

/// Register a subscriber for notifications.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub enum Subscribe {
    /// Every lease failure: lost, recovered or degraded.
    LeaseLost(Recipient<LeaseLost>),
    /// Settlement failures and dead letters.
    Outcomes(Recipient<OutcomeNotice>),
}

/// Stop: claim nothing more, let deliveries in flight finish within `grace`,
/// abort the rest and release their claims, then stop the coordinator.
/// Answers with the report of the pass it interrupted (empty if none ran).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "DrainReport")]
pub struct Shutdown {
    /// How long deliveries in flight may still run.
    pub grace: Duration,
}

/// Ask what the coordinator is doing.
#[derive(Debug, Clone, Copy, Default, Message)]
#[rtype(result = "CoordinatorStatus")]
pub struct GetStatus;

/// What [`GetStatus`] answers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct CoordinatorStatus {
    /// A pass is running.
    pub running: bool,
    /// A follow-up pass is queued behind the running one.
    pub follow_up_queued: bool,
    /// Passes finished since start.
    pub passes: u64,
    /// The report of the last finished pass.
    pub last_report: Option<DrainReport>,
    /// Totals over every finished pass.
    pub totals: DrainReport,
    /// Shutdown has begun.
    pub shutting_down: bool,
}

/// A store wake-up: something was committed.
struct Wake;

/// The first wait before claiming again when a pass could not arm the
/// store's wake-ups: an enqueue was committing, so more may follow at once.
const POLL_MIN: Duration = Duration::from_millis(1);

/// The longest wait before claiming again when passes in a row could not
/// arm the store's wake-ups (the wait starts over at [`POLL_MIN`] after a
/// pass that claimed something). It bounds how late a message committed
/// meanwhile is seen to about what a wake-up takes on a durable server,
/// at the cost of one mostly-empty claim per 25 ms while enqueuing
/// transactions stay open (a long transaction that enqueued blocks arming
/// until it ends).
const POLL_MAX: Duration = Duration::from_millis(25);

type Waiter = oneshot::Sender<Result<DrainReport>>;

/// The running pass.
struct Pass {
    /// Its number; reports of other passes do not count in it.
    id: u64,
    /// Its claimer, for refills and the shutdown.
    claimer: Addr<Claimer>,
    /// Its tally so far.
    report: DrainReport,
    /// Deliveries that reported their outcome.
    finished: u64,
    /// Known once the claimer is done; the pass ends when every claimed
    /// message has reported (reports and `ClaimerDone` may arrive in any order).
    claimed: Option<u64>,
    /// Why claiming stopped early; the pass then ends in an error.
    error: Option<Error>,
    /// It spent its budget on full claims: the next pass starts at once.
    spent: bool,
    /// What arming the store's wake-ups before its first claim found.
    arming: Arming,
    /// Wake-ups heard before it armed: one heard after means the arming
    /// was used up.
    wakes_at_start: u64,
    /// How long the next pass should wait for a store that faulted.
    pause: Duration,
    /// Who waits for its report.
    waiters: Vec<Waiter>,
}

/// The coordinator actor. Build one with [`DrainCoordinator::builder`].
pub struct DrainCoordinator {
    /// What every actor of this coordinator shares.
    drain: Arc<DrainContext>,
    /// The delivery arbiters it owns, stopped with it.
    arbiters: Vec<Arbiter>,
    /// Handles of `arbiters`, handed to each claimer.
    arbiter_handles: Arc<[ArbiterHandle]>,
    /// Start a pass on store wake-ups.
    wake_on_insert: bool,
    /// How to ask the store for the next wake-up, when it wakes only
    /// drains that asked.
    arm: Option<ArmWakeups>,
    /// The store will wake this coordinator on the next committed insert.
    armed: bool,
    /// Wake-ups heard so far.
    wakes: u64,
    /// The wait before the next pass when a pass could not arm.
    poll: Duration,
    /// The pass armed to follow one that could not arm.
    poll_timer: Option<SpawnHandle>,
    /// Who hears every lease failure.
    lease_subscribers: Vec<Recipient<LeaseLost>>,
    /// Who hears settlement failures and dead letters.
    outcome_subscribers: Vec<Recipient<OutcomeNotice>>,
    /// The running pass; never more than one.
    pass: Option<Pass>,
    /// The number the next pass gets.
    next_pass: u64,
    /// Waiters of the follow-up pass; `Some` (even empty) means one is due.
    follow_up: Option<Vec<Waiter>>,
    /// `Some` once shutdown began: who waits for it to complete.
    shutdown: Option<Vec<oneshot::Sender<DrainReport>>>,
    /// The schedule, the wake-up stream and the periodic schedules'
    /// runners, cancelled at shutdown.
    background: Vec<SpawnHandle>,
    /// A retention run is going; the next tick skips rather than overlap.
    retaining: bool,
    /// When work this coordinator left behind becomes claimable again
    /// (retries, lost leases, a failed claim), so it comes back to it
    /// without a schedule or a new insert.
    revisits: BTreeSet<DateTime<Utc>>,
    /// The timer armed for the first of `revisits`, and when it fires.
    revisit_timer: Option<(DateTime<Utc>, SpawnHandle)>,
    /// Passes finished, for [`GetStatus`].
    passes: u64,
    /// The last finished pass's report, for [`GetStatus`].
    last_report: Option<DrainReport>,
    /// Totals over every finished pass, for [`GetStatus`].
    totals: DrainReport,
    /// When the pending gauge was last sampled.
    pending_sampled: Option<tokio::time::Instant>,
    /// The periodic schedules it runs, each in a future of `background`.
    schedules: Vec<crate::schedule::runner::Runner>,
}

impl std::fmt::Debug for DrainCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DrainCoordinator")
            .field("config", &self.drain.config)
            .field("registry", &self.drain.registry)
            .field("running", &self.pass.is_some())
            .field("passes", &self.passes)
            .finish_non_exhaustive()
    }
}

impl DrainCoordinator {
    /// Start building a coordinator over `store`.
    pub fn builder(store: impl OutboxStore) -> DrainCoordinatorBuilder {
        Self::builder_shared(Arc::new(store))
    }

    /// Start building a coordinator over a store already behind a pointer.
    pub fn builder_shared(store: SharedStore) -> DrainCoordinatorBuilder {
        DrainCoordinatorBuilder::new(store)
    }

    /// A coordinator of `parts`, with its delivery arbiters, not started.
    fn new(parts: Parts) -> Self {
        let arbiters: Vec<Arbiter> = (0..parts.drain.config.delivery_arbiters)
            .map(|_| Arbiter::new())
            .collect();
        let arbiter_handles = arbiters.iter().map(Arbiter::handle).collect();
        DrainCoordinator {
            drain: Arc::new(parts.drain),
            arbiters,
            arbiter_handles,
            wake_on_insert: parts.wake_on_insert,
            arm: None,
            armed: false,
            wakes: 0,
            poll: POLL_MIN,
            poll_timer: None,
            lease_subscribers: parts.lease_subscribers,
            outcome_subscribers: parts.outcome_subscribers,
            pass: None,
            next_pass: 0,
            follow_up: None,
            shutdown: None,
            background: Vec::new(),
            retaining: false,
            revisits: BTreeSet::new(),
            revisit_timer: None,
            pending_sampled: None,
            passes: 0,
            last_report: None,
            totals: DrainReport::default(),
            schedules: parts.schedules,
        }
    }

    fn start_pass(&mut self, waiters: Vec<Waiter>, ctx: &mut Context<Self>) {
        let id = self.next_pass;
        self.next_pass += 1;
        let address = ctx.address();
        let coordinator = claimer::CoordinatorRecipients {
            finished: address.clone().recipient(),
            abandoned: address.clone().recipient(),
            done: address.recipient(),
        };
        if let Some(timer) = self.poll_timer.take() {
            ctx.cancel_future(timer);
        }
        let arm = self.arm.clone().filter(|_| !self.armed);
        let claimer = Claimer::new(
            self.drain.clone(),
            coordinator,
            id,
            self.arbiter_handles.clone(),
            arm,
        )
        .start();
        self.pass = Some(Pass {
            id,
            claimer,
            report: DrainReport::default(),
            finished: 0,
            claimed: None,
            error: None,
            spent: false,
            arming: Arming::NotAsked,
            wakes_at_start: self.wakes,
            pause: Duration::ZERO,
            waiters,
        });
    }

    /// Start a pass now if idle, else make sure one follows the running pass
    /// (and let the running one use its idle slots meanwhile).
    fn request_pass(&mut self, waiter: Option<Waiter>, ctx: &mut Context<Self>) {
        if let Some(pass) = &self.pass {
            pass.claimer.do_send(Refill);
            self.follow_up.get_or_insert_with(Vec::new).extend(waiter);
        } else {
            self.start_pass(waiter.into_iter().collect(), ctx);
        }
    }

    /// Come back for work that is due at `at`: a pass then (or, if one is
    /// running, a refill and a follow-up).
    fn revisit(&mut self, at: DateTime<Utc>, ctx: &mut Context<Self>) {
        if self.shutdown.is_some() {
            return;
        }
        // Revisits within a few milliseconds of each other share one pass.
        let at = at
            .duration_round_up(chrono::Duration::milliseconds(10))
            .unwrap_or(at);
        self.revisits.insert(at);
        self.arm_revisit(ctx);
    }

    fn arm_revisit(&mut self, ctx: &mut Context<Self>) {
        let Some(&first) = self.revisits.first() else {
            return;
        };
        if let Some((armed_for, handle)) = self.revisit_timer {
            if armed_for <= first {
                return;
            }
            ctx.cancel_future(handle);
        }
        let delay = until(self.drain.now(), first);
        let handle = ctx.run_later(delay, |act, ctx| {
            act.revisit_timer = None;
            let now = act.drain.now();
            let due: Vec<_> = act.revisits.range(..=now).copied().collect();
            for at in &due {
                act.revisits.remove(at);
            }
            if !due.is_empty() && act.shutdown.is_none() {
                act.request_pass(None, ctx);
            }
            act.arm_revisit(ctx);
        });
        self.revisit_timer = Some((first, handle));
    }

    fn current_pass(&mut self, pass: u64) -> Option<&mut Pass> {
        self.pass.as_mut().filter(|current| current.id == pass)
    }

    fn end_pass_if_done(&mut self, ctx: &mut Context<Self>) {
        let done = self
            .pass
            .as_ref()
            .is_some_and(|pass| pass.claimed == Some(pass.finished));
        if !done {
            return;
        }
        let pass = self.pass.take().expect("a finished pass exists");
        let report = pass.report;
        telemetry::pass_finished(&self.drain, &report, &mut self.pending_sampled);
        self.passes += 1;
        self.last_report = Some(report);
        self.totals += report;
        let failed = pass.error.is_some();
        let result = match pass.error {
            None => Ok(report),
            Some(source) => Err(Error::Pass {
                source: Box::new(source),
                report: Box::new(report),
            }),
        };
        for waiter in pass.waiters {
            let _ = waiter.send(result.clone());
        }
        if pass.arming == Arming::Armed && self.wakes == pass.wakes_at_start {
            self.armed = true;
        }
        if report.claimed > 0 || self.armed {
            self.poll = POLL_MIN;
        }
        if let Some(waiters) = self.shutdown.take() {
            for waiter in waiters {
                let _ = waiter.send(report);
            }
            self.shutdown = Some(Vec::new());
            ctx.stop();
        } else if let Some(waiters) = self.follow_up.take() {
            self.start_pass(waiters, ctx);
        } else if pass.spent {
            // More is likely waiting: no tick or wake-up may come for it
            // (a backlog left by a crash, or enqueued by another process).
            if pass.pause.is_zero() {
                self.start_pass(Vec::new(), ctx);
            } else {
                let at = after(self.drain.now(), pass.pause);
                self.revisit(at, ctx);
            }
        } else if self.arm.is_some() && !self.armed && !failed {
            self.poll_unarmed(pass.arming, ctx);
        }
    }

    /// The pass ended waiting, but no wake-up will come for what commits
    /// from now on: claim again soon, and arm again first.
    fn poll_unarmed(&mut self, arming: Arming, ctx: &mut Context<Self>) {
        if arming == Arming::Failed {
            // A store that cannot answer gets the pace of failed claims.
            let at = after(self.drain.now(), self.drain.heartbeat);
            self.revisit(at, ctx);
            return;
        }
        let wait = self.poll;
        self.poll = (self.poll * 2).min(POLL_MAX);
        if let Some(timer) = self.poll_timer.take() {
            ctx.cancel_future(timer);
        }
        self.poll_timer = Some(ctx.run_later(wait, |act, ctx| {
            act.poll_timer = None;
            if act.shutdown.is_none() {
                act.request_pass(None, ctx);
            }
        }));
    }

    fn notify(&mut self, notice: Notice) {
        match notice {
            Notice::Lease(failure) => {
                self.lease_subscribers
                    .retain(|subscriber| subscriber.connected());
                for subscriber in &self.lease_subscribers {
                    subscriber.do_send(failure.clone());
                }
            }
            Notice::Outcome(outcome) => {
                self.outcome_subscribers
                    .retain(|subscriber| subscriber.connected());
                for subscriber in &self.outcome_subscribers {
                    subscriber.do_send(outcome.clone());
                }
            }
        }
    }
}

impl Actor for DrainCoordinator {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        telemetry::coordinator_started();
        // A task of the runtime's rather than the actor's: a future the actor
        // owns is dropped with it, which may be after the runtime is gone,
        // and a pooled connection dropped there has nowhere to go back to.
        let store = self.drain.store.clone();
        let claims = self.drain.sizing.claims_in_flight();
        tokio::spawn(async move {
            if let Err(error) = store.warm_up(claims).await {
                telemetry::warm_up_failed(&error);
            }
        });
        if let Some(every) = self.drain.config.every {
            // Messages may have waited while no worker ran: drain at once,
            // then on every tick that finds the coordinator idle.
            self.request_pass(None, ctx);
            self.background.push(ctx.run_interval(every, |act, ctx| {
                if act.shutdown.is_some() {
                    return;
                }
                match &act.pass {
                    None => act.start_pass(Vec::new(), ctx),
                    // No second pass; the running one may claim for idle slots.
                    Some(pass) => pass.claimer.do_send(Refill),
                }
            }));
        }
        if let Some(every) = retention::every(&self.drain.config.retention) {
            self.background.push(ctx.run_interval(every, |act, ctx| {
                if act.shutdown.is_some() || act.retaining {
                    return;
                }
                act.retaining = true;
                let drain = act.drain.clone();
                ctx.spawn(
                    async move { retention::run(&drain).await }
                        .into_actor(act)
                        .map(|_, act, _| act.retaining = false),
                );
            }));
        }
        self.start_schedules(ctx);
        if self.wake_on_insert
            && let Some(wakeups) = self.drain.store.wakeups()
        {
            self.arm = wakeups.arm();
            let stream = futures_util::stream::unfold(wakeups, |mut wakeups| async move {
                wakeups.changed().await.then_some((Wake, wakeups))
            });
            self.background.push(ctx.add_stream(stream));
        }
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        for arbiter in &self.arbiters {
            arbiter.stop();
        }
        for waiter in self.follow_up.take().into_iter().flatten() {
            let _ = waiter.send(Err(Error::Stopped));
        }
    }
}

impl StreamHandler<Wake> for DrainCoordinator {
    fn handle(&mut self, _: Wake, ctx: &mut Context<Self>) {
        // An insert used the arming up (or the listener reconnected and
        // may have missed one): arm again before the next claim.
        self.wakes += 1;
        self.armed = false;
        if self.shutdown.is_none() {
            self.request_pass(None, ctx);
        }
    }

    fn finished(&mut self, _: &mut Context<Self>) {
        // The store stopped sending wake-ups; the schedule and explicit
        // Drains still work, so keep running (the default would stop us).
    }
}

impl Handler<Drain> for DrainCoordinator {
    type Result = ResponseFuture<Result<DrainReport>>;

    fn handle(&mut self, _: Drain, ctx: &mut Context<Self>) -> Self::Result {
        if self.shutdown.is_some() {
            return Box::pin(std::future::ready(Err(Error::ShuttingDown)));
        }
        let (waiter, answer) = oneshot::channel();
        self.request_pass(Some(waiter), ctx);
        Box::pin(async move { answer.await.unwrap_or(Err(Error::Stopped)) })
    }
}

impl Handler<Subscribe> for DrainCoordinator {
    type Result = ();

    fn handle(&mut self, subscribe: Subscribe, _: &mut Context<Self>) {
        match subscribe {
            Subscribe::LeaseLost(recipient) => self.lease_subscribers.push(recipient),
            Subscribe::Outcomes(recipient) => self.outcome_subscribers.push(recipient),
        }
    }
}

impl Handler<Shutdown> for DrainCoordinator {
    type Result = ResponseFuture<DrainReport>;

    fn handle(&mut self, shutdown: Shutdown, ctx: &mut Context<Self>) -> Self::Result {
        if self.shutdown.is_none() {
            self.shutdown = Some(Vec::new());
            for handle in self.background.drain(..) {
                ctx.cancel_future(handle);
            }
            if let Some((_, handle)) = self.revisit_timer.take() {
                ctx.cancel_future(handle);
            }
            if let Some(handle) = self.poll_timer.take() {
                ctx.cancel_future(handle);
            }
            self.revisits.clear();
            for waiter in self.follow_up.take().into_iter().flatten() {
                let _ = waiter.send(Err(Error::ShuttingDown));
            }
        }
        let (waiter, answer) = oneshot::channel();
        match &self.pass {
            Some(pass) => {
                pass.claimer.do_send(WindDown {
                    grace: shutdown.grace,
                });
                self.shutdown.get_or_insert_with(Vec::new).push(waiter);
            }
            None => {
                let _ = waiter.send(DrainReport::default());
                ctx.stop();
            }
        }
        Box::pin(async move { answer.await.unwrap_or_default() })
    }
}

impl Handler<GetStatus> for DrainCoordinator {
    type Result = MessageResult<GetStatus>;

    fn handle(&mut self, _: GetStatus, _: &mut Context<Self>) -> Self::Result {
        MessageResult(CoordinatorStatus {
            running: self.pass.is_some(),
            follow_up_queued: self.follow_up.is_some(),
            passes: self.passes,
            last_report: self.last_report,
            totals: self.totals,
            shutting_down: self.shutdown.is_some(),
        })
    }
}

impl Handler<DeliveryFinished> for DrainCoordinator {
    type Result = ();

    fn handle(&mut self, finished: DeliveryFinished, ctx: &mut Context<Self>) {
        if let Some(pass) = self.current_pass(finished.pass) {
            pass.report.add(finished.outcome);
            pass.finished += 1;
        }
        let due_again = match finished.outcome {
            Outcome::Retried => finished.retry_at,
            // Claimable again once its lease ends, at the latest a lease from now.
            Outcome::LeaseLost | Outcome::SettlementFailed { .. } => {
                Some(after(self.drain.now(), self.drain.config.lease))
            }
            // Given back, so claimable at once (at shutdown no pass follows).
            Outcome::Released => Some(self.drain.now()),
            Outcome::Delivered | Outcome::DeadLettered | Outcome::Cancelled => None,
        };
        if let Some(at) = due_again {
            self.revisit(at, ctx);
        }
        for notice in finished.notices {
            self.notify(notice);
        }
        self.end_pass_if_done(ctx);
    }
}

impl Handler<Abandoned> for DrainCoordinator {
    type Result = ();

    fn handle(&mut self, abandoned: Abandoned, _: &mut Context<Self>) {
        if let Some(pass) = self.current_pass(abandoned.pass) {
            let count = abandoned.dead_letters.len() as u64;
            pass.report.dead_lettered += count;
            pass.report.abandoned_dead_lettered += count;
            let cancelled = abandoned.cancelled.len() as u64;
            pass.report.cancelled += cancelled;
            pass.report.cancelled_at_claim += cancelled;
        }
        for dead_letter in abandoned.dead_letters {
            self.notify(Notice::Outcome(OutcomeNotice::DeadLettered(dead_letter)));
        }
        for cancelled in abandoned.cancelled {
            self.notify(Notice::Outcome(OutcomeNotice::Cancelled(cancelled)));
        }
    }
}

impl Handler<ClaimerDone> for DrainCoordinator {
    type Result = ();

    fn handle(&mut self, done: ClaimerDone, ctx: &mut Context<Self>) {
        if done.error.is_some() {
            // Try the store again soon; and a claim that failed may still
            // have taken rows, claimable again when their leases end.
            let now = self.drain.now();
            self.revisit(after(now, self.drain.heartbeat), ctx);
            self.revisit(after(now, self.drain.config.lease), ctx);
        }
        if let Some(pass) = self.current_pass(done.pass) {
            pass.claimed = Some(done.claimed);
            pass.report.claimed = done.claimed;
            pass.error = done.error;
            pass.spent = done.spent;
            pass.pause = done.pause;
            pass.arming = done.arming;
        }
        self.end_pass_if_done(ctx);
    }
}

// Here rather than beside the builder's settings: starting needs the actor.
impl DrainCoordinatorBuilder {
    /// Validate the configuration and the registrations (see
    /// [`registry`](Self::registry)) and start the coordinator on the
    /// current arbiter. Must be called inside a running actix system.
    pub fn start(self) -> Result<Addr<DrainCoordinator>> {
        Ok(DrainCoordinator::new(self.into_parts()?).start())
    }

    /// Validate the configuration and start the coordinator on `arbiter`.
    pub fn start_in(self, arbiter: &ArbiterHandle) -> Result<Addr<DrainCoordinator>> {
        let coordinator = DrainCoordinator::new(self.into_parts()?);
        Ok(DrainCoordinator::start_in_arbiter(arbiter, move |_| {
            coordinator
        }))
    }
}
