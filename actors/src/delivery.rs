//! `DeliveryActor`: delivers one claimed message and settles it.
//!
//! One per claimed message, started by the [`Claimer`](crate::claimer::Claimer)
//! on a delivery arbiter. It decodes the payload, runs the handler (a panic
//! in it is a delivery failure), starts a child
//! [`HeartbeatActor`](crate::heartbeat::HeartbeatActor), and owns the
//! `max_active` timer. Lease loss or `max_active` aborts the delivery: its
//! future is dropped and nothing is settled. A finished delivery stops its
//! heartbeat (which waits for a renewal in flight and hands over the last
//! confirmed lease), settles under the claim token within that lease, its
//! first settlement write doubling as the final extension, reports exactly
//! one outcome and stops. If the actor itself dies, its drop guard reports
//! the message lost and frees the slot, so the pass still ends.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use chrono::{DateTime, Utc};
use futures_util::FutureExt;
use futures_util::future::LocalBoxFuture;
use outbox::{
    ClaimedMessage, Delivery, DeliveryContext, DeliveryError, DeliveryResult, ErrorRecord,
    LeaseLostError, MarkDelivered, MarkFailed, MaxActiveDurationError, MessageKind, ReleaseClaim,
};
use tracing::Instrument;

use crate::claimer::SlotFreed;
use crate::context::{DrainContext, after, until};
use crate::coordinator::DeliveryFinished;
use crate::heartbeat::{Extension, HeartbeatActor, StopAndExtend, StopHeartbeat, deadline_failure};
use crate::messages::{
    DeadLetter, LeaseLost, LeaseOperation, LeaseState, Notice, Outcome, OutcomeNotice,
    SettleOperation, SettlementFailed,
};
use crate::telemetry;

/// Abort the delivery (shutdown grace is over) and give the claim back.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct Abort;

/// The heartbeat's answer to `StopAndExtend`.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct Extended(pub(crate) Extension);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The handler runs; lease loss or `max_active` aborts it.
    Delivering,
    /// The handler returned; waiting for the heartbeat's final extension.
    Extending,
    /// Writing the outcome under the claim token.
    Settling,
    Done,
}

/// Reports the one outcome of a delivery; if dropped before reporting (the
/// actor died), reports the message lost so the slot is freed anyway.
pub(crate) struct Reporter {
    pub(crate) pass: u64,
    pub(crate) slot: u64,
    pub(crate) coordinator: Recipient<DeliveryFinished>,
    pub(crate) claimer: Recipient<SlotFreed>,
    pub(crate) message: Arc<ClaimedMessage>,
    heartbeat: Option<Addr<HeartbeatActor>>,
    armed: bool,
}

impl Reporter {
    pub(crate) fn new(
        pass: u64,
        slot: u64,
        coordinator: Recipient<DeliveryFinished>,
        claimer: Recipient<SlotFreed>,
        message: Arc<ClaimedMessage>,
    ) -> Self {
        telemetry::delivery_claimed(&message);
        Reporter {
            pass,
            slot,
            coordinator,
            claimer,
            message,
            heartbeat: None,
            armed: true,
        }
    }

    fn report(&mut self, outcome: Outcome, notices: Vec<Notice>, retry_at: Option<DateTime<Utc>>) {
        if self.armed {
            telemetry::delivery_reported();
        }
        self.armed = false;
        if let Some(heartbeat) = self.heartbeat.take() {
            heartbeat.do_send(StopHeartbeat);
        }
        self.coordinator.do_send(DeliveryFinished {
            pass: self.pass,
            outcome,
            notices,
            retry_at,
        });
        self.claimer.do_send(SlotFreed {
            slot: self.slot,
            finished: true,
        });
    }
}

impl Drop for Reporter {
    fn drop(&mut self) {
        if self.armed {
            // Only message sends here: this may run while unwinding from a
            // panic, where calling user code could abort the process.
            let error = LeaseLostError {
                id: self.message.id.clone(),
                reason: "its delivery actor stopped unexpectedly".to_owned(),
                source: None,
            };
            let failure = LeaseLost::new(
                &self.message,
                LeaseOperation::Renew,
                LeaseState::Lost,
                false,
                error.into(),
            );
            telemetry::delivery_died(&failure);
            self.report(Outcome::LeaseLost, vec![Notice::Lease(failure)], None);
        }
    }
}

pub(crate) struct DeliveryActor {
    drain: Arc<DrainContext>,
    message: Arc<ClaimedMessage>,
    reporter: Reporter,
    phase: Phase,
    active_until: DateTime<Utc>,
    delivery: Option<SpawnHandle>,
    max_active: Option<SpawnHandle>,
    /// The handler's result, kept while the extension is under way.
    result: Option<DeliveryResult>,
    span: tracing::Span,
    /// When the handler started.
    started: tokio::time::Instant,
}

impl DeliveryActor {
    pub(crate) fn new(drain: Arc<DrainContext>, reporter: Reporter) -> Self {
        let message = reporter.message.clone();
        DeliveryActor {
            span: telemetry::delivery_span(&message),
            active_until: message.claimed_at,
            drain,
            message,
            reporter,
            phase: Phase::Delivering,
            delivery: None,
            max_active: None,
            result: None,
            started: tokio::time::Instant::now(),
        }
    }

    /// Stop delivering: drop the handler's future and the `max_active` timer.
    fn stop_delivering(&mut self, ctx: &mut Context<Self>) {
        for handle in [self.delivery.take(), self.max_active.take()]
            .into_iter()
            .flatten()
        {
            ctx.cancel_future(handle);
        }
    }

    fn lost(&mut self, failure: LeaseLost, ctx: &mut Context<Self>) {
        self.stop_delivering(ctx);
        if let Some(heartbeat) = self.reporter.heartbeat.take() {
            heartbeat.do_send(StopHeartbeat);
        }
        self.span.in_scope(|| report_lease(&self.drain, &failure));
        self.finish(Outcome::LeaseLost, vec![Notice::Lease(failure)], None, ctx);
    }

    fn delivered(&mut self, result: DeliveryResult, ctx: &mut Context<Self>) {
        if self.phase != Phase::Delivering {
            return;
        }
        self.delivery = None;
        self.stop_delivering(ctx);
        self.phase = Phase::Extending;
        self.result = Some(result);
        // The handler's slot is free; the claim and settlement writes still
        // to come do not need it.
        self.reporter.claimer.do_send(SlotFreed {
            slot: self.reporter.slot,
            finished: false,
        });
        match &self.reporter.heartbeat {
            Some(heartbeat) => heartbeat.do_send(StopAndExtend),
            None => {
                let failure = heartbeat_gone(&self.message);
                self.lost(failure, ctx);
            }
        }
    }

    fn finish(
        &mut self,
        outcome: Outcome,
        notices: Vec<Notice>,
        retry_at: Option<DateTime<Utc>>,
        ctx: &mut Context<Self>,
    ) {
        self.phase = Phase::Done;
        self.reporter.report(outcome, notices, retry_at);
        ctx.stop();
    }
}

impl Actor for DeliveryActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let started_at = self.drain.now();
        self.active_until = after(started_at, self.drain.config.max_active);
        let heartbeat = HeartbeatActor::new(
            self.drain.clone(),
            self.message.clone(),
            ctx.address(),
            self.active_until,
        )
        .start();
        self.reporter.heartbeat = Some(heartbeat);

        self.started = self
            .span
            .in_scope(|| telemetry::delivery_started(&self.message));
        let run =
            deliver(&self.drain, self.message.clone(), &self.span).instrument(self.span.clone());
        self.delivery = Some(ctx.spawn(run.into_actor(self).map(|result, act, ctx| {
            act.delivered(result, ctx);
        })));
        self.max_active = Some(ctx.run_later(self.drain.config.max_active, |act, ctx| {
            act.max_active = None;
            if act.phase == Phase::Delivering {
                let error = MaxActiveDurationError {
                    id: act.message.id.clone(),
                    max_active: act.drain.config.max_active,
                };
                let failure = LeaseLost::new(
                    &act.message,
                    LeaseOperation::MaxActive,
                    LeaseState::Lost,
                    false,
                    error.into(),
                );
                act.lost(failure, ctx);
            }
        }));
    }
}

impl Handler<LeaseLost> for DeliveryActor {
    type Result = ();

    fn handle(&mut self, failure: LeaseLost, ctx: &mut Context<Self>) {
        // While extending, a loss the heartbeat reported (or its death) is
        // the answer; any `Extended` still on its way is then ignored.
        if matches!(self.phase, Phase::Delivering | Phase::Extending) {
            self.lost(failure, ctx);
        }
    }
}

impl Handler<Extended> for DeliveryActor {
    type Result = ();

    fn handle(&mut self, Extended(extension): Extended, ctx: &mut Context<Self>) {
        if self.phase != Phase::Extending {
            return;
        }
        self.phase = Phase::Settling;
        // The heartbeat stops itself after answering.
        self.reporter.heartbeat = None;
        let result = self
            .result
            .take()
            .expect("a result is kept while extending");
        let settle = settle_delivery(
            self.drain.clone(),
            self.message.clone(),
            self.active_until,
            extension,
            result,
        );
        ctx.spawn(settle.instrument(self.span.clone()).into_actor(self).map(
            |(outcome, notices, retry_at), act, ctx| {
                telemetry::settled(&act.message, outcome, act.started, act.drain.now());
                act.finish(outcome, notices, retry_at, ctx)
            },
        ));
    }
}

impl Handler<Abort> for DeliveryActor {
    type Result = ();

    fn handle(&mut self, _: Abort, ctx: &mut Context<Self>) {
        // A delivery that already finished is settling within its own
        // deadline; let it.
        if self.phase != Phase::Delivering {
            return;
        }
        self.stop_delivering(ctx);
        self.phase = Phase::Settling;
        if let Some(heartbeat) = self.reporter.heartbeat.take() {
            heartbeat.do_send(StopHeartbeat);
        }
        let drain = self.drain.clone();
        let message = self.message.clone();
        let release = async move {
            let call = drain.store.release_claim(ReleaseClaim {
                id: message.id.clone(),
                claim_token: message.claim_token.clone(),
                now: drain.now(),
            });
            match tokio::time::timeout(drain.config.lease, call).await {
                Ok(Ok(())) => {
                    tracing::info!(target: "outbox", event = "outbox.released", id = %message.id,
                        name = %message.name, "outbox claim released at shutdown");
                    Outcome::Released
                }
                Ok(Err(error)) => {
                    tracing::warn!(target: "outbox", event = "outbox.release_failed", id = %message.id,
                        %error, "could not release outbox claim at shutdown; it is claimable after its lease");
                    Outcome::LeaseLost
                }
                Err(_) => {
                    tracing::warn!(target: "outbox", event = "outbox.release_failed", id = %message.id,
                        "outbox claim release timed out at shutdown; it is claimable after its lease");
                    Outcome::LeaseLost
                }
            }
        };
        ctx.spawn(
            release
                .instrument(self.span.clone())
                .into_actor(self)
                .map(|outcome, act, ctx| act.finish(outcome, Vec::new(), None, ctx)),
        );
    }
}

/// Decode and hand the message to its transport. Panics in the transport,
/// synchronous or inside its future, become delivery errors.
fn deliver(
    drain: &DrainContext,
    message: Arc<ClaimedMessage>,
    span: &tracing::Span,
) -> LocalBoxFuture<'static, DeliveryResult> {
    let payload = match drain
        .registry
        .decode(message.kind, &message.name, &message.payload)
    {
        Ok(payload) => payload,
        Err(error) => return Box::pin(std::future::ready(Err(outbox::Error::from(error).into()))),
    };
    let trace = telemetry::delivery_trace(&message, span);
    let delivery = Delivery {
        payload,
        context: DeliveryContext::new(message.clone(), trace),
    };
    let call = std::panic::catch_unwind(AssertUnwindSafe(|| match message.kind {
        MessageKind::Event => drain.events.as_ref().map(|bus| bus.publish(delivery)),
        MessageKind::Job => drain.jobs.as_ref().map(|jobs| jobs.dispatch(delivery)),
    }));
    match call {
        Ok(Some(future)) => Box::pin(
            AssertUnwindSafe(future)
                .catch_unwind()
                .map(|result| result.unwrap_or_else(|panic| Err(DeliveryError::panic(&*panic)))),
        ),
        // The capability check before each pass makes this unreachable in
        // practice: a decodable message has a registration, so a transport.
        Ok(None) => Box::pin(std::future::ready(Err(DeliveryError::msg(format!(
            "no transport delivers {} messages",
            message.kind
        ))))),
        Err(panic) => Box::pin(std::future::ready(Err(DeliveryError::panic(&*panic)))),
    }
}

/// The loss reported when the heartbeat is gone without an answer.
fn heartbeat_gone(message: &ClaimedMessage) -> LeaseLost {
    let error = LeaseLostError {
        id: message.id.clone(),
        reason: "the heartbeat stopped before confirming the lease".to_owned(),
        source: None,
    };
    LeaseLost::new(
        message,
        LeaseOperation::Renew,
        LeaseState::Lost,
        false,
        error.into(),
    )
}

fn report_lease(drain: &DrainContext, failure: &LeaseLost) {
    telemetry::lease(failure);
    drain.observe("on_lease_error", |observer| {
        observer.on_lease_error(failure)
    });
}

/// The settlement write to make.
enum Settle {
    Delivered,
    Failed {
        error: ErrorRecord,
        dead_letter: bool,
        retry_at: Option<DateTime<Utc>>,
        retry_delay: Duration,
    },
}

impl Settle {
    fn operation(&self) -> SettleOperation {
        match self {
            Settle::Delivered => SettleOperation::MarkDelivered,
            Settle::Failed { .. } => SettleOperation::MarkFailed,
        }
    }
}

/// Why a settlement did not happen.
struct Unsettled {
    error: outbox::Error,
    claim_lost: bool,
}

/// Why one settlement write did not apply.
enum Unwritten {
    /// The deadline passed before it was made or answered.
    Deadline,
    Failed(outbox::Error),
}

/// One settlement write under the claim token, bounded by `deadline`.
async fn write_once(
    drain: &DrainContext,
    message: &ClaimedMessage,
    settle: &Settle,
    deadline: DateTime<Utc>,
) -> Result<(), Unwritten> {
    let now = drain.now();
    let remaining = until(now, deadline);
    if remaining.is_zero() {
        return Err(Unwritten::Deadline);
    }
    let call = match settle {
        Settle::Delivered => drain.store.mark_delivered(MarkDelivered {
            id: message.id.clone(),
            claim_token: message.claim_token.clone(),
            now,
        }),
        Settle::Failed {
            error,
            dead_letter,
            retry_at,
            ..
        } => drain.store.mark_failed(MarkFailed {
            id: message.id.clone(),
            claim_token: message.claim_token.clone(),
            error: error.clone(),
            dead_letter: *dead_letter,
            now,
            retry_at: *retry_at,
        }),
    };
    match tokio::time::timeout(remaining, call).await {
        Err(_) => Err(Unwritten::Deadline),
        Ok(Err(error)) => Err(Unwritten::Failed(error)),
        Ok(Ok(())) => Ok(()),
    }
}

/// The settlement attempts after the first write (the extension) failed
/// with `first_error`: up to the configured attempts in all, with doubling
/// delay, each bounded by `deadline`.
async fn retry_settlement(
    drain: &DrainContext,
    message: &ClaimedMessage,
    deadline: DateTime<Utc>,
    settle: &Settle,
    first_error: outbox::Error,
) -> Result<(), Unsettled> {
    let missed_deadline = || Unsettled {
        error: LeaseLostError {
            id: message.id.clone(),
            reason: format!(
                "{} did not complete before its settlement deadline",
                match settle.operation() {
                    SettleOperation::MarkDelivered => "mark_delivered",
                    SettleOperation::MarkFailed => "mark_failed",
                }
            ),
            source: None,
        }
        .into(),
        claim_lost: true,
    };
    tracing::debug!(target: "outbox", id = %message.id, attempt = 1, error = %first_error,
        "outbox settlement attempt failed");
    let mut last_error = first_error;
    for attempt in 2..=drain.config.settlement.attempts {
        let remaining = until(drain.now(), deadline);
        if remaining.is_zero() {
            break;
        }
        let backoff = drain
            .config
            .settlement
            .delay
            .saturating_mul(1 << (attempt - 2).min(20));
        tokio::time::sleep(backoff.min(remaining).max(Duration::from_millis(1))).await;
        match write_once(drain, message, settle, deadline).await {
            Ok(()) => return Ok(()),
            Err(Unwritten::Deadline) => return Err(missed_deadline()),
            Err(Unwritten::Failed(error)) if error.is_claim_lost() => {
                return Err(Unsettled {
                    error,
                    claim_lost: true,
                });
            }
            Err(Unwritten::Failed(error)) => {
                tracing::debug!(target: "outbox", id = %message.id, attempt, %error,
                    "outbox settlement attempt failed");
                last_error = error;
            }
        }
    }
    Err(Unsettled {
        error: last_error,
        claim_lost: false,
    })
}

/// What a settled delivery reports: its outcome, what subscribers should
/// hear, and when a retried message is due again.
type Settled = (Outcome, Vec<Notice>, Option<DateTime<Utc>>);

/// The extension found the claim lost: nothing is settled.
fn lost_at_extension(drain: &DrainContext, failure: LeaseLost) -> Settled {
    report_lease(drain, &failure);
    (Outcome::LeaseLost, vec![Notice::Lease(failure)], None)
}

/// Everything after the handler returned: the extension, the settlement,
/// and the notices, in the reference order.
///
/// The extension is the first settlement write. A renewal just before it
/// would confirm only what that write's own fence confirms (this token owns
/// the message and its lease is live now), so the write stands in for it,
/// with the renewal's outcomes: a claim error is confirmed loss and settles
/// nothing; a transient failure with lease left settles under the last
/// confirmed lease, reported as degraded; earlier renewal errors are
/// reported as recovered once it succeeds.
async fn settle_delivery(
    drain: Arc<DrainContext>,
    message: Arc<ClaimedMessage>,
    active_until: DateTime<Utc>,
    extension: Extension,
    result: DeliveryResult,
) -> Settled {
    let (locked_until, renewal_error) = match extension {
        Extension::Lost(failure) => return lost_at_extension(&drain, failure),
        Extension::Held {
            locked_until,
            renewal_error,
        } => (locked_until, renewal_error),
    };
    let mut notices = Vec::new();
    let (write, delivery_error) = match result {
        Ok(()) => (Settle::Delivered, None),
        Err(error) => {
            let failed_at = drain.now();
            let policy = drain.retry_policy(&message);
            let retry = !error.is_undecodable()
                && policy.allows_retry(message.attempts, message.max_attempts, &error);
            let retry_delay = if retry {
                policy.delay(message.attempts, &message.id)
            } else {
                Duration::ZERO
            };
            let write = Settle::Failed {
                error: error.to_record(),
                dead_letter: !retry,
                retry_at: retry.then(|| after(failed_at, retry_delay)),
                retry_delay,
            };
            (write, Some(error))
        }
    };
    let deadline = locked_until.min(active_until);
    let lease = |state, confirmed_lost, error| {
        LeaseLost::new(
            &message,
            LeaseOperation::Renew,
            state,
            confirmed_lost,
            error,
        )
    };
    let (renewal_notice, settled) = match write_once(&drain, &message, &write, deadline).await {
        Ok(()) => (
            renewal_error.map(|error| lease(LeaseState::Recovered, false, error)),
            Ok(()),
        ),
        Err(Unwritten::Deadline) => {
            let failure = deadline_failure(
                &drain,
                &message,
                active_until <= locked_until,
                false,
                "the extension write did not complete before the lease deadline",
                None,
            );
            return lost_at_extension(&drain, failure);
        }
        Err(Unwritten::Failed(error)) if error.is_claim_lost() => {
            return lost_at_extension(&drain, lease(LeaseState::Lost, true, error));
        }
        Err(Unwritten::Failed(error)) if drain.now() < deadline => {
            // The last confirmed lease is still running: settle under it, the
            // failed write counting as the first attempt.
            let settled = retry_settlement(&drain, &message, deadline, &write, error.clone()).await;
            (Some(lease(LeaseState::Degraded, false, error)), settled)
        }
        Err(Unwritten::Failed(error)) => {
            let failure = if active_until <= locked_until {
                deadline_failure(&drain, &message, true, false, "", None)
            } else {
                lease(LeaseState::Lost, false, error)
            };
            return lost_at_extension(&drain, failure);
        }
    };

    if let Some(notice) = renewal_notice {
        report_lease(&drain, &notice);
        notices.push(Notice::Lease(notice));
    }
    if let Some(error) = &delivery_error {
        drain.observe("on_error", |observer| observer.on_error(error, &message));
    }
    if let Err(unsettled) = settled {
        let failure = SettlementFailed {
            id: message.id.clone(),
            kind: message.kind,
            name: message.name.clone(),
            attempt: message.attempts,
            operation: write.operation(),
            delivery_succeeded: delivery_error.is_none(),
            delivery_error,
            error: unsettled.error,
            claim_lost: unsettled.claim_lost,
        };
        telemetry::settlement_failed(&failure);
        drain.observe("on_settlement_error", |observer| {
            observer.on_settlement_error(&failure)
        });
        notices.push(Notice::Outcome(OutcomeNotice::SettlementFailed(failure)));
        return (
            Outcome::SettlementFailed {
                claim_lost: unsettled.claim_lost,
            },
            notices,
            None,
        );
    }
    match write {
        Settle::Delivered => {
            telemetry::delivered(&message);
            (Outcome::Delivered, notices, None)
        }
        Settle::Failed {
            error,
            dead_letter: true,
            ..
        } => {
            let dead_letter = DeadLetter::delivered(&message, error);
            telemetry::dead_lettered(&dead_letter);
            drain.observe("on_dead_letter", |observer| {
                observer.on_dead_letter(&dead_letter)
            });
            notices.push(Notice::Outcome(OutcomeNotice::DeadLettered(dead_letter)));
            (Outcome::DeadLettered, notices, None)
        }
        Settle::Failed {
            error,
            retry_at,
            retry_delay,
            ..
        } => {
            telemetry::retry_scheduled(&message, &error, retry_delay, retry_at);
            (Outcome::Retried, notices, retry_at)
        }
    }
}
