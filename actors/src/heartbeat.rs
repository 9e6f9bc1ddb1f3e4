//! `HeartbeatActor`: keeps one claim's lease alive while its delivery runs.
//!
//! A child of one delivery actor, started when the first renewal is due
//! (most handlers return before then, and need none: the delivery then
//! hands over the claim's own lease, see `lease::unrenewed_hand_over`). It renews at
//! once, then every `heartbeat`, each renewal bounded by
//! `min(locked_until, active_until)`. A claim error
//! is confirmed loss; other errors are retried after
//! `min(heartbeat, remaining / 3)` until the deadline; a renewal that does
//! not answer before the deadline is loss (unconfirmed). Loss is told to the
//! parent as [`HeartbeatLoss`]. When the delivery is done the parent sends
//! [`StopAndHandOver`]: the heartbeat stops without cutting a renewal in
//! flight, answers [`LeaseHandedOver`] with the last lease it confirmed, and
//! stops. It does not renew once more first: the first settlement write is
//! fenced on the claim token and a live lease at the moment it is made,
//! which is all such a renewal would confirm (see the `settlement` module).
//! A renewal that reports the message's cancellation (an operator asked
//! for it) tells the parent once, as [`CancelRequested`], and renewing goes
//! on: the handler decides whether to stop.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use chrono::{DateTime, Utc};
use outbox::{ClaimedMessage, RenewClaim};

use crate::context::{DrainContext, until};
use crate::error::{Error, LeaseLostError};
use crate::lease::{self, Deadline};
use crate::messages::{CancelRequested, HandOver, HeartbeatLoss, LeaseHandedOver};
use crate::notices::{LeaseLost, LeaseOperation, LeaseState};

/// Stop renewing, let a renewal in flight finish, then answer
/// [`LeaseHandedOver`] with the last confirmed lease.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct StopAndHandOver;

/// Stop at once; a renewal in flight is abandoned.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct StopHeartbeat;

/// Where the heartbeat is in its life.
#[derive(Debug)]
enum Phase {
    /// Between renewals: the next one is scheduled.
    Waiting,
    /// A renewal is in flight.
    Renewing,
    /// A [`StopAndHandOver`] arrived during a renewal; answer it once that
    /// renewal has.
    HandOverDue,
    /// The claim is lost and the parent was told; every later answer
    /// repeats this failure.
    Lost(LeaseLost),
    /// Stopped in order (handed over, told to stop, or the parent is gone):
    /// nothing more to tell.
    Stopped,
}

/// The result of one renewal bounded by a deadline.
enum Renewal {
    /// Renewed until then; `true` when the message's cancellation was
    /// requested.
    Succeeded(DateTime<Utc>, bool),
    Failed(Error),
    Deadline,
}

async fn bounded_renewal(
    drain: Arc<DrainContext>,
    message: Arc<ClaimedMessage>,
    deadline: DateTime<Utc>,
) -> Renewal {
    let renewal_at = drain.now();
    let remaining = until(renewal_at, deadline);
    if remaining.is_zero() {
        return Renewal::Deadline;
    }
    let call = drain.store.renew_lease(RenewClaim {
        id: message.id.clone(),
        claim_token: message.claim_token.clone(),
        now: renewal_at,
        lease: drain.config.lease,
    });
    match tokio::time::timeout(remaining, call).await {
        Err(_) => Renewal::Deadline,
        Ok(Err(error)) => Renewal::Failed(error.into()),
        Ok(Ok(lease)) => {
            let locked_until = lease.locked_until;
            let completed_at = drain.now();
            if completed_at >= deadline {
                Renewal::Deadline
            } else if locked_until <= completed_at {
                // Not a claim error: the store answered, just not usefully,
                // so this is retried like any transient failure.
                Renewal::Failed(
                    LeaseLostError::new(
                        &message.id,
                        format!("renewal returned a lease that already ended ({locked_until})"),
                        None,
                    )
                    .into(),
                )
            } else {
                Renewal::Succeeded(locked_until, lease.cancel_requested)
            }
        }
    }
}

pub(crate) struct HeartbeatActor {
    /// The store, clock and timings.
    drain: Arc<DrainContext>,
    /// The claimed message whose lease this keeps.
    message: Arc<ClaimedMessage>,
    /// Where a loss goes while the delivery still runs; also tells whether
    /// the parent is still alive.
    lost: Recipient<HeartbeatLoss>,
    /// Where the answer to [`StopAndHandOver`] goes.
    handed_over: Recipient<LeaseHandedOver>,
    /// Where a reported cancellation goes, once; `None` once told.
    cancel: Option<Recipient<CancelRequested>>,
    /// The end of the last lease the claim or a renewal confirmed.
    locked_until: DateTime<Utc>,
    /// The delivery's `max_active` end: no renewal is worth more than that.
    active_until: DateTime<Utc>,
    /// The first transient renewal error, reported as *recovered* if a later
    /// renewal (or the first settlement write) succeeds.
    first_error: Option<Error>,
    /// Where the heartbeat is; a drop in any phase but `Lost` or `Stopped`
    /// means it died, and the parent must hear the lease is unconfirmed.
    phase: Phase,
    /// The next scheduled renewal, cancelled on hand-over.
    tick: Option<SpawnHandle>,
}

impl HeartbeatActor {
    pub(crate) fn new(
        drain: Arc<DrainContext>,
        message: Arc<ClaimedMessage>,
        lost: Recipient<HeartbeatLoss>,
        handed_over: Recipient<LeaseHandedOver>,
        cancel: Recipient<CancelRequested>,
        active_until: DateTime<Utc>,
    ) -> Self {
        HeartbeatActor {
            locked_until: message.locked_until,
            drain,
            message,
            lost,
            handed_over,
            cancel: Some(cancel),
            active_until,
            first_error: None,
            phase: Phase::Waiting,
            tick: None,
        }
    }

    fn lost(&self, operation: LeaseOperation, confirmed_lost: bool, error: Error) -> LeaseLost {
        LeaseLost::new(
            &self.message,
            operation,
            LeaseState::Lost,
            confirmed_lost,
            error,
        )
    }

    /// The deadline of the last confirmed lease, or the loss to report
    /// (for `reason`) when it has passed.
    fn deadline_ahead(&self, reason: &str) -> Result<Deadline, Box<LeaseLost>> {
        lease::deadline_ahead(
            &self.drain,
            &self.message,
            self.locked_until,
            self.active_until,
            reason,
        )
    }

    fn schedule(&mut self, delay: Duration, ctx: &mut Context<Self>) {
        self.phase = Phase::Waiting;
        self.tick = Some(ctx.run_later(delay, |act, ctx| act.renew(ctx)));
    }

    fn renew(&mut self, ctx: &mut Context<Self>) {
        self.tick = None;
        if !matches!(self.phase, Phase::Waiting) {
            return;
        }
        if !self.lost.connected() {
            // The delivery is gone without saying so; its claim is not ours to keep.
            self.phase = Phase::Stopped;
            ctx.stop();
            return;
        }
        let deadline = match self.deadline_ahead("the lease ran out before it was renewed") {
            Ok(deadline) => deadline,
            Err(failure) => return self.fail(*failure),
        };
        self.phase = Phase::Renewing;
        let renewal = bounded_renewal(self.drain.clone(), self.message.clone(), deadline.at);
        ctx.spawn(renewal.into_actor(self).map(move |renewal, act, ctx| {
            act.renewed(renewal, deadline, ctx);
        }));
    }

    fn renewed(&mut self, renewal: Renewal, deadline: Deadline, ctx: &mut Context<Self>) {
        // Only a hand-over can have arrived during the renewal: a
        // `StopHeartbeat` stops the actor, and the renewal with it.
        let hand_over_due = matches!(self.phase, Phase::HandOverDue);
        // `Ok(delay)`: renew again after `delay` (unless handing over).
        let next = match renewal {
            Renewal::Succeeded(locked_until, cancel_requested) => {
                self.locked_until = locked_until;
                if cancel_requested && let Some(cancel) = self.cancel.take() {
                    cancel.do_send(CancelRequested);
                }
                Ok(lease::renewal_delay(
                    &self.drain,
                    self.drain.now(),
                    self.locked_until,
                    self.active_until,
                ))
            }
            Renewal::Deadline => Err(deadline.passed(
                &self.drain,
                &self.message,
                false,
                "a renewal did not complete before the lease deadline",
                None,
            )),
            Renewal::Failed(error) if error.is_claim_lost() => {
                Err(self.lost(LeaseOperation::Renew, true, error))
            }
            Renewal::Failed(error) => {
                if self.first_error.is_none() {
                    self.first_error = Some(error.clone());
                }
                if hand_over_due {
                    // The hand-over checks the deadline itself.
                    Ok(Duration::ZERO)
                } else {
                    let remaining = until(self.drain.now(), deadline.at);
                    if remaining.is_zero() {
                        Err(deadline.passed(
                            &self.drain,
                            &self.message,
                            false,
                            "renewals did not recover before the lease ran out",
                            Some(error),
                        ))
                    } else {
                        let retry = self.drain.heartbeat.min(remaining / 3);
                        Ok(retry.max(Duration::from_millis(1)))
                    }
                }
            }
        };
        match (next, hand_over_due) {
            // A parent waiting on the hand-over gets the failure as its
            // answer; only a parent still delivering needs to be told.
            (Err(failure), true) => self.hand_over(HandOver::Lost(failure), ctx),
            (Ok(_), true) => self.hand_over_lease(ctx),
            (Err(failure), false) => self.fail(failure),
            (Ok(delay), false) => self.schedule(delay, ctx),
        }
    }

    /// The claim is lost while the delivery runs: tell the parent, once.
    fn fail(&mut self, failure: LeaseLost) {
        self.lost.do_send(HeartbeatLoss(failure.clone()));
        self.phase = Phase::Lost(failure);
    }

    /// Hand over the last confirmed lease, if it is still running.
    fn hand_over_lease(&mut self, ctx: &mut Context<Self>) {
        let hand_over = match self.deadline_ahead("the lease ran out before the delivery finished")
        {
            Ok(_) => HandOver::Held {
                locked_until: self.locked_until,
                renewal_error: self.first_error.take(),
            },
            Err(failure) => HandOver::Lost(*failure),
        };
        self.hand_over(hand_over, ctx);
    }

    fn hand_over(&mut self, hand_over: HandOver, ctx: &mut Context<Self>) {
        self.handed_over.do_send(LeaseHandedOver(hand_over));
        self.phase = Phase::Stopped;
        ctx.stop();
    }
}

impl Actor for HeartbeatActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // Started when the first renewal is due.
        self.renew(ctx);
    }
}

impl Drop for HeartbeatActor {
    fn drop(&mut self) {
        if matches!(
            self.phase,
            Phase::Waiting | Phase::Renewing | Phase::HandOverDue
        ) {
            let error =
                LeaseLostError::new(&self.message.id, "the heartbeat stopped unexpectedly", None);
            self.lost.do_send(HeartbeatLoss(self.lost(
                LeaseOperation::Renew,
                false,
                error.into(),
            )));
        }
    }
}

impl Handler<StopAndHandOver> for HeartbeatActor {
    type Result = ();

    fn handle(&mut self, _: StopAndHandOver, ctx: &mut Context<Self>) {
        if let Some(tick) = self.tick.take() {
            ctx.cancel_future(tick);
        }
        match &self.phase {
            Phase::Renewing | Phase::HandOverDue => self.phase = Phase::HandOverDue,
            Phase::Waiting => self.hand_over_lease(ctx),
            Phase::Lost(failure) => {
                let failure = failure.clone();
                self.hand_over(HandOver::Lost(failure), ctx);
            }
            Phase::Stopped => {}
        }
    }
}

impl Handler<StopHeartbeat> for HeartbeatActor {
    type Result = ();

    fn handle(&mut self, _: StopHeartbeat, ctx: &mut Context<Self>) {
        self.phase = Phase::Stopped;
        ctx.stop();
    }
}
