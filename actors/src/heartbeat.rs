//! `HeartbeatActor`: keeps one claim's lease alive while its delivery runs.
//!
//! A child of one [`DeliveryActor`](crate::delivery::DeliveryActor). Every
//! `heartbeat` it renews the lease, each renewal bounded by
//! `min(locked_until, active_until)`. A claim error is confirmed loss; other
//! errors are retried after `min(heartbeat, remaining / 3)` until the
//! deadline; a renewal that does not answer before the deadline is loss
//! (unconfirmed). Loss is told to the parent as [`LeaseLost`]. When the
//! delivery is done the parent sends [`StopAndExtend`]: the heartbeat stops
//! without cutting a renewal in flight, answers [`Extended`] with the last
//! lease it confirmed, and stops. The extension itself is the first
//! settlement write: it is fenced on the claim token and a live lease at
//! the moment it is made, which is all a renewal just before it would
//! confirm, so a separate renewal would only cost a write (see
//! `settle_delivery` in the delivery module).

use std::sync::Arc;
use std::time::Duration;

use crate::context::{DrainContext, until};
use crate::delivery::{DeliveryActor, Extended};
use crate::messages::{LeaseLost, LeaseOperation, LeaseState};
use actix::prelude::*;
use chrono::{DateTime, Utc};
use outbox::{ClaimedMessage, LeaseLostError, MaxActiveDurationError, RenewClaim};

/// Stop renewing, let a renewal in flight finish, then answer [`Extended`]
/// with the lease for the extension.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct StopAndExtend;

/// Stop at once; a renewal in flight is abandoned.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct StopHeartbeat;

/// What the heartbeat knows of the lease when the delivery is done.
#[derive(Debug)]
pub(crate) enum Extension {
    /// The claim was last confirmed until `locked_until`, still ahead;
    /// extend and settle before then.
    Held {
        locked_until: DateTime<Utc>,
        /// The first transient renewal error seen along the way: recovered
        /// from if the extension succeeds.
        renewal_error: Option<outbox::Error>,
    },
    /// The claim is lost or unconfirmed; do not settle.
    Lost(LeaseLost),
}

/// The result of one renewal bounded by a deadline.
enum Renewal {
    Succeeded(DateTime<Utc>),
    Failed(outbox::Error),
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
    let call = drain.store.renew_claim(RenewClaim {
        id: message.id.clone(),
        claim_token: message.claim_token.clone(),
        now: renewal_at,
        lease: drain.config.lease,
    });
    match tokio::time::timeout(remaining, call).await {
        Err(_) => Renewal::Deadline,
        Ok(Err(error)) => Renewal::Failed(error),
        Ok(Ok(locked_until)) => {
            let completed_at = drain.now();
            if completed_at >= deadline {
                Renewal::Deadline
            } else if locked_until <= completed_at {
                // Not a claim error: the store answered, just not usefully,
                // so this is retried like any transient failure.
                Renewal::Failed(
                    LeaseLostError {
                        id: message.id.clone(),
                        reason: format!(
                            "renewal returned a lease that already ended ({locked_until})"
                        ),
                        source: None,
                    }
                    .into(),
                )
            } else {
                Renewal::Succeeded(locked_until)
            }
        }
    }
}

/// The failure for a deadline that passed: `max_active` when it ends first,
/// else the lease.
pub(crate) fn deadline_failure(
    drain: &DrainContext,
    message: &ClaimedMessage,
    active_first: bool,
    confirmed_lost: bool,
    reason: &str,
    cause: Option<outbox::Error>,
) -> LeaseLost {
    let (operation, confirmed_lost, error) = if active_first {
        let error = MaxActiveDurationError {
            id: message.id.clone(),
            max_active: drain.config.max_active,
        };
        (LeaseOperation::MaxActive, false, error.into())
    } else {
        let error = LeaseLostError {
            id: message.id.clone(),
            reason: reason.to_owned(),
            source: cause.map(Box::new),
        };
        (LeaseOperation::Renew, confirmed_lost, error.into())
    };
    LeaseLost::new(message, operation, LeaseState::Lost, confirmed_lost, error)
}

pub(crate) struct HeartbeatActor {
    drain: Arc<DrainContext>,
    message: Arc<ClaimedMessage>,
    parent: Addr<DeliveryActor>,
    locked_until: DateTime<Utc>,
    active_until: DateTime<Utc>,
    /// The first transient renewal error, reported as *recovered* if a later
    /// renewal succeeds.
    first_error: Option<outbox::Error>,
    /// Set once the claim is lost; every later answer repeats it.
    failure: Option<LeaseLost>,
    renewing: bool,
    stopped: bool,
    /// A `StopAndExtend` arrived during a renewal; answer it after that.
    pending_stop: bool,
    tick: Option<SpawnHandle>,
    /// Cleared on every orderly stop; if the actor is dropped while still
    /// armed it died, and the parent must hear that the lease is unconfirmed.
    armed: bool,
}

impl HeartbeatActor {
    pub(crate) fn new(
        drain: Arc<DrainContext>,
        message: Arc<ClaimedMessage>,
        parent: Addr<DeliveryActor>,
        active_until: DateTime<Utc>,
    ) -> Self {
        HeartbeatActor {
            locked_until: message.locked_until,
            drain,
            message,
            parent,
            active_until,
            first_error: None,
            failure: None,
            renewing: false,
            stopped: false,
            pending_stop: false,
            tick: None,
            armed: true,
        }
    }

    /// The renewal deadline, and whether `max_active` is what bounds it.
    fn deadline(&self) -> (DateTime<Utc>, bool) {
        let active_first = self.active_until <= self.locked_until;
        (self.locked_until.min(self.active_until), active_first)
    }

    fn lost(
        &self,
        operation: LeaseOperation,
        confirmed_lost: bool,
        error: outbox::Error,
    ) -> LeaseLost {
        LeaseLost::new(
            &self.message,
            operation,
            LeaseState::Lost,
            confirmed_lost,
            error,
        )
    }

    fn deadline_failure(
        &self,
        active_first: bool,
        confirmed_lost: bool,
        reason: &str,
        cause: Option<outbox::Error>,
    ) -> LeaseLost {
        deadline_failure(
            &self.drain,
            &self.message,
            active_first,
            confirmed_lost,
            reason,
            cause,
        )
    }

    /// The deadline of the next renewal and whether `max_active` sets it, or
    /// the failure to report when it has passed already.
    fn time_left(&self, reason: &str) -> Result<(DateTime<Utc>, bool), LeaseLost> {
        let (deadline, active_first) = self.deadline();
        if self.drain.now() >= deadline {
            return Err(self.deadline_failure(active_first, !active_first, reason, None));
        }
        Ok((deadline, active_first))
    }

    fn schedule(&mut self, delay: Duration, ctx: &mut Context<Self>) {
        self.tick = Some(ctx.run_later(delay, |act, ctx| act.renew(ctx)));
    }

    fn renew(&mut self, ctx: &mut Context<Self>) {
        self.tick = None;
        if self.stopped {
            return;
        }
        if !self.parent.connected() {
            // The delivery is gone without saying so; its claim is not ours to keep.
            self.armed = false;
            ctx.stop();
            return;
        }
        let (deadline, active_first) =
            match self.time_left("the lease ran out before it was renewed") {
                Ok(left) => left,
                Err(failure) => return self.fail(failure),
            };
        self.renewing = true;
        let renewal = bounded_renewal(self.drain.clone(), self.message.clone(), deadline);
        ctx.spawn(renewal.into_actor(self).map(move |renewal, act, ctx| {
            act.renewed(renewal, deadline, active_first, ctx);
        }));
    }

    fn renewed(
        &mut self,
        renewal: Renewal,
        deadline: DateTime<Utc>,
        active_first: bool,
        ctx: &mut Context<Self>,
    ) {
        self.renewing = false;
        match renewal {
            Renewal::Succeeded(locked_until) => {
                self.locked_until = locked_until;
                if !self.stopped {
                    self.schedule(self.drain.heartbeat, ctx);
                }
            }
            Renewal::Deadline => {
                let failure = self.deadline_failure(
                    active_first,
                    false,
                    "a renewal did not complete before the lease deadline",
                    None,
                );
                self.fail(failure);
            }
            Renewal::Failed(error) if error.is_claim_lost() => {
                let failure = self.lost(LeaseOperation::Renew, true, error);
                self.fail(failure);
            }
            Renewal::Failed(error) => {
                if self.first_error.is_none() {
                    self.first_error = Some(error.clone());
                }
                if !self.stopped {
                    let remaining = until(self.drain.now(), deadline);
                    if remaining.is_zero() {
                        let failure = self.deadline_failure(
                            active_first,
                            false,
                            "renewals did not recover before the lease ran out",
                            Some(error),
                        );
                        self.fail(failure);
                    } else {
                        let retry = self.drain.heartbeat.min(remaining / 3);
                        self.schedule(retry.max(Duration::from_millis(1)), ctx);
                    }
                }
            }
        }
        if std::mem::take(&mut self.pending_stop) {
            self.extend(ctx);
        }
    }

    fn fail(&mut self, failure: LeaseLost) {
        if self.failure.is_some() {
            return;
        }
        self.stopped = true;
        // A parent waiting on `StopAndExtend` gets the failure as its answer;
        // only a parent still delivering needs to be told.
        if !self.pending_stop {
            self.parent.do_send(failure.clone());
        }
        self.failure = Some(failure);
    }

    fn extend(&mut self, ctx: &mut Context<Self>) {
        let extension = match self.failure.clone() {
            Some(failure) => Extension::Lost(failure),
            None => match self.time_left("the lease ran out before the delivery finished") {
                Ok(_) => Extension::Held {
                    locked_until: self.locked_until,
                    renewal_error: self.first_error.take(),
                },
                Err(failure) => Extension::Lost(failure),
            },
        };
        self.answer(extension, ctx);
    }

    fn answer(&mut self, extension: Extension, ctx: &mut Context<Self>) {
        self.parent.do_send(Extended(extension));
        self.armed = false;
        ctx.stop();
    }
}

impl Actor for HeartbeatActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.schedule(self.drain.heartbeat, ctx);
    }
}

impl Drop for HeartbeatActor {
    fn drop(&mut self) {
        if self.armed && self.failure.is_none() {
            let error = LeaseLostError {
                id: self.message.id.clone(),
                reason: "the heartbeat stopped unexpectedly".to_owned(),
                source: None,
            };
            self.parent
                .do_send(self.lost(LeaseOperation::Renew, false, error.into()));
        }
    }
}

impl Handler<StopAndExtend> for HeartbeatActor {
    type Result = ();

    fn handle(&mut self, _: StopAndExtend, ctx: &mut Context<Self>) {
        self.stopped = true;
        if let Some(tick) = self.tick.take() {
            ctx.cancel_future(tick);
        }
        if self.renewing {
            self.pending_stop = true;
        } else {
            self.extend(ctx);
        }
    }
}

impl Handler<StopHeartbeat> for HeartbeatActor {
    type Result = ();

    fn handle(&mut self, _: StopHeartbeat, ctx: &mut Context<Self>) {
        self.stopped = true;
        self.armed = false;
        ctx.stop();
    }
}
