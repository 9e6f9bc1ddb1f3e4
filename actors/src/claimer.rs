//! `Claimer`: fills delivery slots for one pass.
//!
//! A slot is a running handler: it claims only as many messages as there are
//! free slots (never past the pass's remaining budget), starts one
//! [`DeliveryActor`] per claimed message, and refills a slot as soon as its
//! handler returns, while that delivery settles, rather than waiting for a
//! whole wave to finish. Up to `claims_in_flight` claims run at once, each
//! for a share of the slots (`(concurrency + prefetch) / claims_in_flight`):
//! the first for whatever is free (at most a share), the others only once a
//! whole share is free; slots that free while they run are filled by the
//! next, so a slow store gets larger batches on its own. A claim's budget is
//! set aside when it goes out and what it did not use is returned when it
//! comes back, so concurrent claims never select more than the pass's
//! budget. Concurrent claims are safe at store level as claims of separate
//! workers are (each is atomic, and at most one message per ordering key is
//! claimed at a time). With `prefetch`, a claim also takes up to that many messages
//! more than there are free slots: they wait in claim order and start as
//! slots free, without waiting for a claim's round-trip; when the drain sizes
//! the prefetch itself (`sizing`), the first claim too waits for a whole
//! share of room while more messages wait than cover a couple of claim
//! round trips, so claims stay large. A waiting message's
//! lease runs (its heartbeat starts with its handler), so one that waited
//! until less than a heartbeat interval, plus what its claim took, of its
//! lease is left is given back undelivered (outcome `released`); at
//! shutdown every waiting message is given back the same way. Slots that
//! free together (a batched settlement answers many deliveries at once)
//! are filled by one claim: a refill waits only until
//! the messages already in the mailbox are handled. Messages dead-lettered
//! at claim (attempts used up) are reported as dead letters. The pass ends
//! when the budget is spent, a claim returns nothing, or claiming fails, and
//! every claim in flight has come back and every delivery it started has
//! reported (an empty claim stops further claims; those still in flight
//! deliver what they took). A [`Refill`] (sent when new
//! messages may be due) makes it claim again after an empty claim, as long
//! as the pass is still open. When it is done it tells the coordinator
//! whether the budget was spent (so more is likely waiting and the next pass
//! should start at once) and how long claiming should still back off.
//!
//! Outages: claiming waits while more deliveries are still settling than
//! the concurrency (their writes queue behind the store; claiming more would
//! only start handlers whose settlements miss their leases), and pauses,
//! with a doubling backoff, after a delivery's store call failed for the
//! store's sake. A claim is timed on the runtime's clock: when it comes back
//! with less lease left than it took (the lease the store granted, from its
//! `claimed_at` to `locked_until`, less the time the call took; the store
//! was slow to answer, for instance waiting for a connection), no handler
//! starts on its messages: they are given back at once (outcome
//! `released`, claimable again at once, the attempt not counted) and
//! claiming backs off the same way.
//!
//! Queues: each queue the drain serves is a lane of slots of its own
//! (`lanes`), with its own concurrency and its share of the prefetch. A
//! claim asks every lane that has room for up to that room, in one
//! statement whatever the number of queues, the claim's limit shared among
//! them in turn; a message starts only while its own queue has a free
//! handler, and waits (in claim order) otherwise. A lane whose last claim
//! found nothing is not asked again until a refill, or until one of its
//! keyed deliveries ends; the pass goes idle when every lane is. A paused
//! queue simply yields nothing: the store skips it.
//!
//! It reports to its coordinator through recipients of [`Abandoned`],
//! [`ClaimerDone`] and (handed to each delivery) `DeliveryFinished`.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use foldhash::{HashMap, HashSet};
use outbox::{ArmOutcome, ArmWakeups, ClaimBatch, ClaimedBatch, ReleaseClaim};

use crate::context::{DrainContext, until};
use crate::delivery::{Abort, DeliveryActor, ReportTo, Reporter};
use crate::error::Error;
use crate::messages::{
    Abandoned, Arming, ClaimerDone, DeliveryEnded, DeliveryFinished, GiveBack, HandlerReturned,
};
use crate::metrics::PassMetrics;
use crate::notices::{CancelledMessage, DeadLetter};
use crate::telemetry;
use lanes::Lanes;
use waiting::{Waiting, late_claim};

mod lanes;
mod waiting;

/// New messages may be due (a wake-up, a tick or a `Drain` arrived during
/// the pass): claim again for free slots, even after an empty claim.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct Refill;

/// Claim for the free slots. Sent to self, so it is handled after every
/// message already in the mailbox: the slots those free join the claim.
#[derive(Debug, Message)]
#[rtype(result = "()")]
struct FillSlots;

/// Stop claiming; abort deliveries still running after `grace`.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct WindDown {
    pub(crate) grace: Duration,
}

/// The longest pause of claiming after store faults, however many came in a
/// row (at most the heartbeat interval): the drain resumes soon after the
/// store does.
const MAX_PAUSE: Duration = Duration::from_secs(5);

/// Whether the pass still claims.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Claiming for slots as they free.
    Claiming,
    /// The last claim found nothing due; a [`Refill`] makes it claim again.
    Idle,
    /// Claiming failed; the pass claims no more and ends with the error.
    Failed,
    /// Shutting down: no more claims; deliveries run out their grace.
    WindingDown,
    /// The shutdown grace is over: every delivery, even one started by a
    /// claim that was in flight, is aborted.
    Aborting,
}

/// Where a claimer's reports go: its coordinator.
pub(crate) struct CoordinatorRecipients {
    /// Handed to each delivery, for its outcome.
    pub(crate) finished: Recipient<DeliveryFinished>,
    /// Messages a claim dead-lettered.
    pub(crate) abandoned: Recipient<Abandoned>,
    /// The claimer is done.
    pub(crate) done: Recipient<ClaimerDone>,
}

pub(crate) struct Claimer {
    /// The store, config and observers of the drain.
    drain: Arc<DrainContext>,
    /// Where reports go.
    coordinator: CoordinatorRecipients,
    /// The pass this claimer serves; every report carries it.
    pass: u64,
    /// Where deliveries run: round-robin over these, or the current arbiter.
    arbiters: Arc<[ArbiterHandle]>,
    /// The arbiter the next delivery starts on.
    next_arbiter: usize,
    /// Messages this pass may still select (claimed plus abandoned).
    budget: usize,
    /// Handlers that may run at once, over every queue served.
    concurrency: usize,
    /// The queues served, each with its slots.
    lanes: Lanes,
    /// Every live delivery, whether its handler still runs, and its lane.
    active: HashMap<u64, (Addr<DeliveryActor>, bool, usize)>,
    /// Deliveries whose handler still runs, over every lane.
    handling: usize,
    /// Prefetched messages waiting for a free slot, in claim order.
    waiting: VecDeque<Waiting>,
    /// Live deliveries of messages with an ordering key: when one ends, the
    /// next message of its key may have become claimable.
    keyed: HashSet<u64>,
    /// The slot number the next delivery gets.
    next_slot: u64,
    /// Deliveries started; the coordinator waits for that many outcomes.
    claimed: u64,
    /// Claims (or arming, or the release of an over-claim) in flight.
    claims: usize,
    /// Slots the claims in flight asked for: they count as taken until the
    /// claims come back.
    asked: usize,
    /// A [`FillSlots`] is queued.
    filling: bool,
    /// Whether the pass still claims.
    phase: Phase,
    /// Why claiming stopped early, reported when the claimer is done.
    error: Option<Error>,
    /// Claiming is paused after store faults until then.
    paused_until: Option<tokio::time::Instant>,
    /// The next pause after a store fault; doubles with each fault in a row
    /// and starts over after a delivery ends without one.
    backoff: Duration,
    /// Arm the store's wake-ups before the first claim, so that what
    /// commits after the pass's last claim wakes the coordinator.
    arm: Option<ArmWakeups>,
    /// What arming found.
    arming: Arming,
    /// Where this pass's deliveries report, once one has started.
    report_to: Option<Arc<ReportTo>>,
    /// What this pass's deliveries record, by kind and name.
    metrics: PassMetrics,
    /// Arming has not answered yet: a claim before it could miss a commit
    /// that then wakes nobody.
    arming_in_flight: bool,
}

impl Claimer {
    pub(crate) fn new(
        drain: Arc<DrainContext>,
        coordinator: CoordinatorRecipients,
        pass: u64,
        arbiters: Arc<[ArbiterHandle]>,
        arm: Option<ArmWakeups>,
    ) -> Self {
        Claimer {
            budget: drain.config.batch_size,
            concurrency: drain.config.total_concurrency(),
            lanes: Lanes::new(&drain.config),
            drain,
            coordinator,
            pass,
            arbiters,
            next_arbiter: 0,
            active: HashMap::default(),
            handling: 0,
            waiting: VecDeque::new(),
            keyed: HashSet::default(),
            next_slot: 0,
            claimed: 0,
            claims: 0,
            asked: 0,
            filling: false,
            phase: Phase::Claiming,
            error: None,
            paused_until: None,
            backoff: Duration::ZERO,
            arm,
            arming: Arming::NotAsked,
            arming_in_flight: false,
            report_to: None,
            metrics: PassMetrics::default(),
        }
    }

    /// Arm the store's wake-ups, then claim. Counted as a claim in flight,
    /// so the pass does not end before it answers, and nothing is claimed
    /// before then (see `arming_in_flight`).
    fn arm_then_fill(&mut self, arm: ArmWakeups, ctx: &mut Context<Self>) {
        self.claims += 1;
        self.arming_in_flight = true;
        let lease = self.drain.config.lease;
        let armed = async move { tokio::time::timeout(lease, arm.arm()).await };
        ctx.spawn(armed.into_actor(self).map(move |armed, act, ctx| {
            act.claims -= 1;
            act.arming_in_flight = false;
            act.arming = match armed {
                Ok(Ok(ArmOutcome::Armed)) => Arming::Armed,
                Ok(Ok(ArmOutcome::EnqueueInFlight)) => Arming::Busy,
                Ok(Err(error)) => {
                    telemetry::arming_failed(&Error::from(error));
                    Arming::Failed
                }
                Err(_) => {
                    telemetry::arming_failed(&Error::Timeout {
                        operation: "arm_wakeups",
                        timeout: lease,
                    });
                    Arming::Failed
                }
            };
            act.fill(ctx);
            act.finish_if_done(ctx);
        }));
    }

    /// A delivery's store call failed for the store's sake: pause claiming,
    /// then claim the free slots when the pause ends.
    fn pause(&mut self, ctx: &mut Context<Self>) {
        let cap = self.drain.heartbeat.min(MAX_PAUSE);
        let first = self.drain.config.settlement.delay.min(cap);
        self.backoff = if self.backoff.is_zero() {
            first
        } else {
            self.backoff.saturating_mul(2).min(cap)
        };
        let until = tokio::time::Instant::now() + self.backoff;
        if self.paused_until.is_some_and(|paused| paused >= until) {
            return;
        }
        self.paused_until = Some(until);
        telemetry::claiming_paused(self.backoff);
        ctx.run_later(self.backoff, |act, ctx| {
            if act
                .paused_until
                .is_some_and(|paused| paused <= tokio::time::Instant::now())
            {
                act.paused_until = None;
                act.fill(ctx);
                act.finish_if_done(ctx);
            }
        });
    }

    fn fill(&mut self, ctx: &mut Context<Self>) {
        let drain = self.drain.clone();
        let sizing = &drain.sizing;
        let (concurrency, prefetch) = (self.concurrency, sizing.prefetch());
        let in_flight = sizing.claims_in_flight();
        self.lanes.set_prefetch(prefetch);
        let share = (concurrency + prefetch).div_ceil(in_flight);
        while self.claims < in_flight
            && !self.arming_in_flight
            && self.phase == Phase::Claiming
            && self.budget > 0
            && self.paused_until.is_none()
        {
            // A slot is a running handler. Deliveries whose handler returned
            // finish their settlement without one, so the next claim
            // overlaps those writes instead of waiting for them; but no more
            // than the concurrency may be settling, so a store that settles
            // slower than it claims makes claiming wait rather than pile up
            // handlers whose writes queue past their leases. Prefetched
            // messages, and those claims in flight asked for, count as
            // running handlers, and widen both bounds by as many.
            let taken = self.waiting.len() + self.asked;
            let free = (concurrency + prefetch)
                .saturating_sub(self.handling + taken)
                .min((2 * concurrency + prefetch).saturating_sub(self.active.len() + taken));
            // Beside a claim in flight, another goes out only for a whole
            // share: slots that free a few at a time join one claim instead
            // of each costing a statement and a commit.
            if free == 0 || (self.claims > 0 && free < share) {
                return;
            }
            // With a sized prefetch, the first claim too waits for a whole
            // share while enough messages wait to keep every handler busy
            // through a couple of round trips: claims are fewer and larger,
            // and none leaves a handler idle.
            if free < share.min(self.budget)
                && self.lanes.all_fed()
                && sizing
                    .low_water()
                    .is_some_and(|low| self.waiting.len() > low)
            {
                return;
            }
            // Each queue is asked for no more than its own room.
            let asks = self.lanes.share(free.min(share).min(self.budget));
            if asks.is_empty() {
                return;
            }
            self.claim(asks, ctx);
        }
    }

    /// Claim what `asks` asks of each lane, setting that much budget and as
    /// many slots aside until the claim comes back.
    fn claim(&mut self, asks: Vec<(usize, usize)>, ctx: &mut Context<Self>) {
        let limit: usize = asks.iter().map(|&(_, ask)| ask).sum();
        // A claim for more than a queue's idle handlers (those no running
        // delivery, waiting message or claim in flight will take) leaves
        // messages waiting: it must be durable before they run, or a store
        // crash could undo it while their handlers run on, every one of
        // them then delivered again. One whose every message starts at once
        // may skip the wait for the disk: a crash then doubles no more than
        // what was running. The lanes' handlers add up to the drain's, so
        // no lane asked past its own idle ones is no claim past the drain's.
        let durable = self.lanes.may_wait(&asks);
        self.claims += 1;
        self.asked += limit;
        self.budget -= limit;
        self.lanes.ask(&asks, false);
        let queues = self.lanes.request(&asks);
        let drain = self.drain.clone();
        let claim = async move {
            let lease = drain.config.lease;
            let started = drain.now();
            let call = drain.store.claim_batch(ClaimBatch {
                on_dead_letter: drain.config.ordering.on_dead_letter,
                limit,
                now: started,
                lease,
                max_attempts: drain.config.retry.attempt_cap(),
                queues,
                durable,
            });
            // A claim that outlives a lease is useless even if it succeeds:
            // every lease it took would already be over.
            let result = match tokio::time::timeout(lease, call).await {
                Ok(result) => result.map_err(Error::from),
                Err(_) => Err(Error::Timeout {
                    operation: "claim_batch",
                    timeout: lease,
                }),
            };
            (result, until(started, drain.now()))
        };
        ctx.spawn(claim.into_actor(self).map(move |(result, took), act, ctx| {
            act.claimed(asks, result, took, ctx);
        }));
    }

    fn claimed(
        &mut self,
        asks: Vec<(usize, usize)>,
        result: Result<ClaimedBatch, Error>,
        took: Duration,
        ctx: &mut Context<Self>,
    ) {
        let limit: usize = asks.iter().map(|&(_, ask)| ask).sum();
        self.claims -= 1;
        self.asked -= limit;
        self.budget += limit;
        self.lanes.ask(&asks, true);
        if result.is_ok() {
            self.drain.sizing.claimed(took, tokio::time::Instant::now());
        }
        // A store that took more than asked, or from a queue not asked for,
        // broke its contract.
        let broken = match &result {
            Ok(batch) if batch.len() > limit => Some(format!(
                "claim_batch returned {} messages for a limit of {limit}",
                batch.len()
            )),
            Ok(batch) => self.lane_counts(&asks, batch).err(),
            Err(_) => None,
        };
        match result {
            Err(error) => {
                telemetry::claim_failed(&error);
                self.stop_claiming(error);
            }
            Ok(batch) if broken.is_some() => {
                let error = Error::from(outbox::Error::StoreContract(
                    broken.expect("a broken contract has its reason"),
                ));
                telemetry::claim_broke_contract(&error);
                self.stop_claiming(error);
                // Give back what it took, so those messages need not wait out
                // a lease; the pass ends once that is done.
                self.claims += 1;
                let release = release_all(self.drain.clone(), batch);
                ctx.spawn(release.into_actor(self).map(|(), act, ctx| {
                    act.claims -= 1;
                    act.finish_if_done(ctx);
                }));
            }
            Ok(batch) if batch.is_empty() => {
                for &(lane, _) in &asks {
                    self.lanes.get_mut(lane).idle = true;
                }
                if self.phase == Phase::Claiming && self.lanes.all_idle() {
                    self.phase = Phase::Idle;
                }
            }
            Ok(batch) => {
                self.budget -= batch.len();
                let counts = self
                    .lane_counts(&asks, &batch)
                    .expect("checked when the claim came back");
                for (&(lane, _), &count) in asks.iter().zip(&counts) {
                    self.lanes.get_mut(lane).idle = count == 0;
                }
                let abandoned: Vec<DeadLetter> = batch
                    .dead_lettered
                    .iter()
                    .map(DeadLetter::abandoned)
                    .collect();
                let cancelled: Vec<CancelledMessage> = batch
                    .cancelled
                    .iter()
                    .map(CancelledMessage::at_claim)
                    .collect();
                if !abandoned.is_empty() || !cancelled.is_empty() {
                    self.coordinator.abandoned.do_send(Abandoned {
                        pass: self.pass,
                        dead_letters: abandoned.clone(),
                        cancelled: cancelled.clone(),
                    });
                }
                // Start deliveries before running abandoned-message observers,
                // so fresh claims get their heartbeats as early as possible.
                let returned = tokio::time::Instant::now();
                for message in batch.claimed {
                    let lane = self
                        .lanes
                        .of(&message.queue)
                        .expect("checked when the claim came back");
                    // Messages still waiting hold every slot of their queue
                    // (a slot that frees starts one of them), so a message
                    // starts now only when none of its queue waits.
                    if self.lanes.get(lane).has_free_handler() && self.handling < self.concurrency {
                        let late = late_claim(&message, took);
                        self.start_delivery(message, lane, late, ctx);
                    } else {
                        self.lanes.get_mut(lane).waiting += 1;
                        self.waiting.push_back(Waiting {
                            message,
                            lane,
                            took,
                            returned,
                        });
                    }
                }
                self.start_waiting(ctx);
                for dead_letter in &abandoned {
                    telemetry::dead_lettered(dead_letter);
                    self.drain.observe("on_dead_letter", |observer| {
                        observer.on_dead_letter(dead_letter)
                    });
                }
                for cancelled in &cancelled {
                    telemetry::cancelled(cancelled);
                }
                self.fill(ctx);
            }
        }
        self.finish_if_done(ctx);
    }

    fn stop_claiming(&mut self, error: Error) {
        // A shutdown under way stays one: its grace and aborts still apply.
        if matches!(self.phase, Phase::Claiming | Phase::Idle) {
            self.phase = Phase::Failed;
        }
        self.error.get_or_insert(error);
    }

    /// How many messages of each lane `asks` asked of `batch` holds, in
    /// the order of `asks`; how the store broke its contract when it holds
    /// a message of a queue it did not ask.
    fn lane_counts(
        &self,
        asks: &[(usize, usize)],
        batch: &ClaimedBatch,
    ) -> Result<Vec<usize>, String> {
        let mut counts = vec![0; asks.len()];
        let queues = batch
            .claimed
            .iter()
            .map(|m| &m.queue)
            .chain(batch.dead_lettered.iter().map(|m| &m.queue))
            .chain(batch.cancelled.iter().map(|m| &m.queue));
        for queue in queues {
            let asked = self
                .lanes
                .of(queue)
                .and_then(|lane| asks.iter().position(|&(asked, _)| asked == lane));
            match asked {
                Some(i) => counts[i] += 1,
                None => {
                    return Err(format!(
                        "claim_batch returned a message of queue {queue:?}, which it was \
                         not asked for"
                    ));
                }
            }
        }
        Ok(counts)
    }

    /// Start waiting messages, in claim order, while their queue has a free
    /// handler; at shutdown, give back those left waiting.
    fn start_waiting(&mut self, ctx: &mut Context<Self>) {
        let mut next = 0;
        while next < self.waiting.len() && self.handling < self.concurrency {
            let lane = self.waiting[next].lane;
            if !self.lanes.get(lane).has_free_handler() {
                next += 1;
                continue;
            }
            let waiting = self
                .waiting
                .remove(next)
                .expect("the index is within the queue");
            self.lanes.get_mut(lane).waiting -= 1;
            let give_back = waiting.give_back(self.drain.heartbeat);
            self.start_delivery(waiting.message, lane, give_back, ctx);
        }
        if matches!(self.phase, Phase::WindingDown | Phase::Aborting) {
            while let Some(waiting) = self.waiting.pop_front() {
                self.lanes.get_mut(waiting.lane).waiting -= 1;
                let lane = waiting.lane;
                self.start_delivery(waiting.message, lane, Some(GiveBack::Shutdown), ctx);
            }
        }
    }

    /// Start the delivery of `message` in `lane`; or, with `give_back`,
    /// give it back undelivered.
    fn start_delivery(
        &mut self,
        message: outbox::ClaimedMessage,
        lane: usize,
        give_back: Option<GiveBack>,
        ctx: &mut Context<Self>,
    ) {
        let slot = self.next_slot;
        self.next_slot += 1;
        self.claimed += 1;
        if message.ordering_key.is_some() {
            self.keyed.insert(slot);
        }
        let (pass, finished) = (self.pass, &self.coordinator.finished);
        let to = self.report_to.get_or_insert_with(|| {
            Arc::new(ReportTo {
                pass,
                coordinator: finished.clone(),
                returned: ctx.address().recipient(),
                ended: ctx.address().recipient(),
            })
        });
        let metrics = self.metrics.of(message.kind, &message.name);
        let reporter = Reporter::new(to.clone(), slot, Arc::new(message), metrics);
        let drain = self.drain.clone();
        let actor = move || match give_back {
            Some(why) => DeliveryActor::give_back(drain, reporter, why),
            None => DeliveryActor::new(drain, reporter),
        };
        let address = if self.arbiters.is_empty() {
            actor().start()
        } else {
            let arbiter = &self.arbiters[self.next_arbiter % self.arbiters.len()];
            self.next_arbiter = self.next_arbiter.wrapping_add(1);
            DeliveryActor::start_in_arbiter(arbiter, move |_| actor())
        };
        if self.phase == Phase::Aborting {
            address.do_send(Abort);
        }
        if give_back.is_none() {
            self.drain.sizing.started(1);
        }
        self.active.insert(slot, (address, true, lane));
        self.handling += 1;
        self.lanes.get_mut(lane).handling += 1;
    }

    fn finish_if_done(&mut self, ctx: &mut Context<Self>) {
        let done_claiming = self.phase != Phase::Claiming || self.budget == 0;
        if self.claims == 0 && done_claiming && self.active.is_empty() && self.waiting.is_empty() {
            // The budget can only reach zero through a claim that came back
            // with all it asked for (a claim's limit never exceeds what is
            // left), so a spent budget means the store still had rows when
            // the pass stopped asking. A shutdown or a failed claim ends the
            // chain whatever the budget.
            let spent = self.budget == 0 && self.phase == Phase::Claiming && self.error.is_none();
            // What is left of a store-fault pause: the next pass waits it out
            // rather than hitting a failing store again at once.
            let pause = self.paused_until.map_or(Duration::ZERO, |paused| {
                paused.saturating_duration_since(tokio::time::Instant::now())
            });
            self.drain.sizing.pass_ended();
            self.coordinator.done.do_send(ClaimerDone {
                pass: self.pass,
                claimed: self.claimed,
                error: self.error.take(),
                spent,
                pause,
                arming: self.arming,
            });
            ctx.stop();
        }
    }
}

/// Release every claim of `batch`, each bounded by the lease.
async fn release_all(drain: Arc<DrainContext>, batch: ClaimedBatch) {
    let releases = batch.claimed.into_iter().map(|message| {
        let drain = drain.clone();
        async move {
            let call = drain.store.release_claim(ReleaseClaim {
                id: message.id,
                claim_token: message.claim_token,
                now: drain.now(),
            });
            let _ = tokio::time::timeout(drain.config.lease, call).await;
        }
    });
    futures_util::future::join_all(releases).await;
}

impl Actor for Claimer {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        match self.arm.take() {
            Some(arm) => self.arm_then_fill(arm, ctx),
            None => self.fill(ctx),
        }
    }
}

impl Claimer {
    /// A slot of `lane` freed: its handler returned, or its delivery ended.
    fn slot_freed(&mut self, handler_was_running: bool, lane: usize, ctx: &mut Context<Self>) {
        if handler_was_running {
            self.handling -= 1;
            self.lanes.get_mut(lane).handling -= 1;
        }
        self.start_waiting(ctx);
        // A claim per freed slot would cost a statement per message when
        // one settlement frees many slots at once; claim once for all of them.
        if !self.filling {
            self.filling = true;
            ctx.notify(FillSlots);
        }
        self.finish_if_done(ctx);
    }
}

impl Handler<HandlerReturned> for Claimer {
    type Result = ();

    fn handle(&mut self, returned: HandlerReturned, ctx: &mut Context<Self>) {
        let Some((_, handling, lane)) = self.active.get_mut(&returned.slot) else {
            return;
        };
        let handler_was_running = std::mem::replace(handling, false);
        let lane = *lane;
        self.slot_freed(handler_was_running, lane, ctx);
    }
}

impl Handler<DeliveryEnded> for Claimer {
    type Result = ();

    fn handle(&mut self, ended: DeliveryEnded, ctx: &mut Context<Self>) {
        let Some((_, handler_was_running, lane)) = self.active.remove(&ended.slot) else {
            return;
        };
        if ended.store_faulted {
            self.pause(ctx);
        } else {
            self.backoff = Duration::ZERO;
        }
        // The settled message held its key: the empty claim that idled this
        // pass may have been empty only because of it, so claim again rather
        // than leave the key's next message to the next tick or wake-up
        // (which, on PostgreSQL, only an enqueue sends).
        if self.keyed.remove(&ended.slot) {
            self.lanes.get_mut(lane).idle = false;
            if self.phase == Phase::Idle {
                self.phase = Phase::Claiming;
            }
        }
        self.slot_freed(handler_was_running, lane, ctx);
    }
}

impl Handler<FillSlots> for Claimer {
    type Result = ();

    fn handle(&mut self, _: FillSlots, ctx: &mut Context<Self>) {
        self.filling = false;
        self.fill(ctx);
        self.finish_if_done(ctx);
    }
}

impl Handler<Refill> for Claimer {
    type Result = ();

    fn handle(&mut self, _: Refill, ctx: &mut Context<Self>) {
        // An empty claim only means nothing was due *then*. While slower
        // deliveries keep the pass open, idle slots would otherwise wait for
        // the slowest of them before anything new is claimed. A pass that
        // stopped on a store error stays stopped: the next pass retries.
        if matches!(self.phase, Phase::Claiming | Phase::Idle) {
            self.phase = Phase::Claiming;
            self.lanes.wake();
            self.fill(ctx);
            self.finish_if_done(ctx);
        }
    }
}

impl Handler<WindDown> for Claimer {
    type Result = ();

    fn handle(&mut self, wind_down: WindDown, ctx: &mut Context<Self>) {
        if self.phase != Phase::Aborting {
            self.phase = Phase::WindingDown;
        }
        self.start_waiting(ctx);
        ctx.run_later(wind_down.grace, |act, _| {
            act.phase = Phase::Aborting;
            for (delivery, _, _) in act.active.values() {
                delivery.do_send(Abort);
            }
        });
        self.finish_if_done(ctx);
    }
}
