//! `DeliveryActor`: delivers one claimed message and settles it.
//!
//! One per claimed message, started by the claimer on a delivery arbiter.
//! It decodes the payload, runs the handler (a panic in it is a delivery
//! failure), starts a child [`HeartbeatActor`] when the first renewal is due
//! (a handler that returns before then needs none), and owns the
//! `max_active` timer. Lease loss or `max_active` aborts the delivery: its future is
//! dropped and nothing is settled. A finished delivery stops its heartbeat
//! (which waits for a renewal in flight and hands over the last confirmed
//! lease), settles under the claim token within that lease (the
//! [`settlement`](crate::settlement) functions make the writes and return
//! what happened), reports exactly one outcome, in one place (`ending`:
//! telemetry, metrics, observers, then the outcome with its notices), and
//! stops. If
//! the actor itself dies, its drop guard reports the message lost and frees
//! the slot, so the pass still ends. A claim that came back too late to be
//! worth delivering, a prefetched message that waited for a slot until too
//! little of its lease was left, or one still waiting at shutdown (see the
//! claimer) is given back at once, undelivered.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use actix::prelude::*;
use chrono::{DateTime, Utc};
use futures_util::FutureExt;
use futures_util::future::LocalBoxFuture;
use outbox::{
    CancelToken, ClaimedMessage, Delivery, DeliveryContext, DeliveryError, DeliveryResult,
    MessageKind,
};
use tracing::Instrument;

mod ending;

use ending::{Ending, report};

use crate::context::{DrainContext, after};
use crate::error::{LeaseLostError, MaxActiveDurationError};
use crate::heartbeat::{HeartbeatActor, StopAndHandOver, StopHeartbeat};
use crate::lease;
use crate::messages::{
    CancelRequested, DeliveryEnded, DeliveryFinished, GiveBack, HandOver, HandlerReturned,
    HeartbeatLoss, LeaseHandedOver,
};
use crate::metrics::NameMetrics;
use crate::notices::{HandlerResult, LeaseLost, LeaseOperation, LeaseState, Notice};
use crate::report::Outcome;
use crate::settlement;
use crate::telemetry;

/// Abort the delivery (shutdown grace is over) and give the claim back.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct Abort;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The handler runs; lease loss or `max_active` aborts it.
    Delivering,
    /// The handler returned; waiting for the heartbeat to hand over the lease.
    AwaitingLease,
    /// Writing the outcome under the claim token.
    Settling,
    /// Aborted: giving the claim back.
    Releasing,
    /// The outcome is reported; the actor is stopping.
    Done,
}

/// Where the deliveries of one pass report, shared by all of them: each
/// recipient is an allocation and a count of senders to keep, and a
/// delivery lives for one message.
pub(crate) struct ReportTo {
    /// The pass that claimed the messages; the coordinator counts by it.
    pub(crate) pass: u64,
    /// Where the outcome goes.
    pub(crate) coordinator: Recipient<DeliveryFinished>,
    /// Told when the handler returns, so the slot can take another message.
    pub(crate) returned: Recipient<HandlerReturned>,
    /// Told when the delivery ends, however it ends.
    pub(crate) ended: Recipient<DeliveryEnded>,
}

/// Reports the one outcome of a delivery; if dropped before reporting (the
/// actor died), reports the message lost so the slot is freed anyway.
pub(crate) struct Reporter {
    /// Where the reports go.
    to: Arc<ReportTo>,
    /// The claimer's name for this delivery.
    slot: u64,
    /// The claimed message, for the loss a dying actor reports.
    message: Arc<ClaimedMessage>,
    /// What deliveries of its kind and name record.
    metrics: Arc<NameMetrics>,
    /// The delivery's heartbeat while it runs: reporting stops it.
    heartbeat: Option<Addr<HeartbeatActor>>,
    /// How the handler ended, once it has: a dying actor's loss says so.
    handler: HandlerResult,
    /// Set until the outcome is reported; still set on drop means the
    /// actor died.
    armed: bool,
}

impl Reporter {
    pub(crate) fn new(
        to: Arc<ReportTo>,
        slot: u64,
        message: Arc<ClaimedMessage>,
        metrics: Arc<NameMetrics>,
    ) -> Self {
        telemetry::delivery_claimed(&metrics);
        Reporter {
            to,
            slot,
            message,
            metrics,
            heartbeat: None,
            handler: HandlerResult::Unfinished,
            armed: true,
        }
    }

    /// Report the one outcome; `store_faulted` when a store call of the
    /// delivery failed for the store's sake (the claimer then backs off).
    fn report(
        &mut self,
        outcome: Outcome,
        notices: Vec<Notice>,
        retry_at: Option<DateTime<Utc>>,
        store_faulted: bool,
    ) {
        if self.armed {
            telemetry::delivery_reported(&self.metrics);
        }
        self.armed = false;
        if let Some(heartbeat) = self.heartbeat.take() {
            heartbeat.do_send(StopHeartbeat);
        }
        self.to.coordinator.do_send(DeliveryFinished {
            pass: self.to.pass,
            outcome,
            notices,
            retry_at,
        });
        self.to.ended.do_send(DeliveryEnded {
            slot: self.slot,
            store_faulted,
        });
    }
}

impl Drop for Reporter {
    fn drop(&mut self) {
        if self.armed {
            // Only message sends here: this may run while unwinding from a
            // panic, where calling user code could abort the process.
            let error = LeaseLostError::new(
                &self.message.id,
                "its delivery actor stopped unexpectedly",
                None,
            );
            let failure = LeaseLost::new(
                &self.message,
                LeaseOperation::Renew,
                LeaseState::Lost,
                false,
                error.into(),
            )
            .after(self.handler.clone());
            telemetry::delivery_died(&failure);
            self.report(
                Outcome::LeaseLost,
                vec![Notice::Lease(failure)],
                None,
                false,
            );
        }
    }
}

pub(crate) struct DeliveryActor {
    /// The store, transports, observers and timings of the drain.
    drain: Arc<DrainContext>,
    /// The claimed message being delivered.
    message: Arc<ClaimedMessage>,
    /// Reports the outcome exactly once, even if the actor dies.
    reporter: Reporter,
    /// Where the delivery is; late messages from an earlier phase are ignored.
    phase: Phase,
    /// When `max_active` ends: the settlement deadline as much as the lease's.
    active_until: DateTime<Utc>,
    /// The handler's future, dropped when the delivery is aborted.
    delivery: Option<SpawnHandle>,
    /// The one timer of a running handler: it starts the heartbeat when
    /// its first renewal is due, and ends the delivery when `max_active`
    /// does; cancelled when the handler returns. Most handlers return
    /// before either, so those deliveries register one timer and start no
    /// heartbeat actor at all.
    timer: Option<SpawnHandle>,
    /// The heartbeat is still to start, at `heartbeat_at`.
    heartbeat_due: bool,
    /// When the heartbeat's first renewal is due.
    heartbeat_at: tokio::time::Instant,
    /// When `max_active` ends the handler, on the runtime's clock.
    max_active_at: tokio::time::Instant,
    /// The handler's result, kept while the heartbeat hands over the lease.
    result: Option<DeliveryResult>,
    /// The delivery's span: every event of this delivery is inside it.
    span: tracing::Span,
    /// When the delivery started, its handler about to.
    started: tokio::time::Instant,
    /// Set for a message given back undelivered, and why.
    give_back: Option<GiveBack>,
    /// Tells the handler, through its context, that an operator cancelled
    /// the message; cancelled when a renewal reports it.
    cancel: CancelToken,
}

impl DeliveryActor {
    /// A delivery of the claimed message `reporter` carries.
    pub(crate) fn new(drain: Arc<DrainContext>, reporter: Reporter) -> Self {
        let message = reporter.message.clone();
        let now = tokio::time::Instant::now();
        DeliveryActor {
            span: telemetry::delivery_span(&message),
            active_until: message.claimed_at,
            drain,
            message,
            reporter,
            phase: Phase::Delivering,
            delivery: None,
            timer: None,
            heartbeat_due: false,
            heartbeat_at: now,
            max_active_at: now,
            result: None,
            started: now,
            give_back: None,
            cancel: CancelToken::new(),
        }
    }

    /// Give the claim back at once instead of delivering, for `why`.
    pub(crate) fn give_back(drain: Arc<DrainContext>, reporter: Reporter, why: GiveBack) -> Self {
        DeliveryActor {
            give_back: Some(why),
            ..Self::new(drain, reporter)
        }
    }

    /// Stop delivering: drop the handler's future, and its timer with the
    /// heartbeat not started yet.
    fn stop_delivering(&mut self, ctx: &mut Context<Self>) {
        self.heartbeat_due = false;
        for handle in [self.delivery.take(), self.timer.take()]
            .into_iter()
            .flatten()
        {
            ctx.cancel_future(handle);
        }
    }

    /// Set the timer for the handler's next deadline: the heartbeat's
    /// start while it is due, and `max_active`.
    fn set_timer(&mut self, ctx: &mut Context<Self>) {
        let at = if self.heartbeat_due {
            self.heartbeat_at.min(self.max_active_at)
        } else {
            self.max_active_at
        };
        let delay = at.saturating_duration_since(tokio::time::Instant::now());
        self.timer = Some(ctx.run_later(delay, |act, ctx| act.timer_fired(ctx)));
    }

    /// Start the heartbeat if it is due; end the delivery if `max_active`
    /// is over; otherwise wait for the next deadline.
    fn timer_fired(&mut self, ctx: &mut Context<Self>) {
        self.timer = None;
        if self.phase != Phase::Delivering {
            return;
        }
        let now = tokio::time::Instant::now();
        if self.heartbeat_due && now >= self.heartbeat_at {
            self.start_heartbeat(ctx);
        }
        if now < self.max_active_at {
            self.set_timer(ctx);
            return;
        }
        // After the handler's future has been polled at this instant too
        // (it comes later in the actor's futures): a handler that returns
        // just as `max_active` ends has returned in time.
        let over = actix::fut::ready(());
        self.timer = Some(
            ctx.spawn(ActorFutureExt::map(over, |(), act: &mut Self, ctx| {
                act.timer = None;
                if act.phase == Phase::Delivering {
                    let error =
                        MaxActiveDurationError::new(&act.message.id, act.drain.config.max_active);
                    let failure = LeaseLost::new(
                        &act.message,
                        LeaseOperation::MaxActive,
                        LeaseState::Lost,
                        false,
                        error.into(),
                    );
                    act.lost(failure, ctx);
                }
            })),
        );
    }

    fn lost(&mut self, failure: LeaseLost, ctx: &mut Context<Self>) {
        // A loss after the handler returned says how it ended: its effect
        // happened, and the message will be delivered again.
        let failure = failure.after(self.reporter.handler.clone());
        self.stop_delivering(ctx);
        if let Some(heartbeat) = self.reporter.heartbeat.take() {
            heartbeat.do_send(StopHeartbeat);
        }
        self.end(Ending::Lost(failure), ctx);
    }

    fn delivered(&mut self, result: DeliveryResult, ctx: &mut Context<Self>) {
        if self.phase != Phase::Delivering {
            return;
        }
        self.delivery = None;
        let heartbeat_due = self.heartbeat_due;
        self.stop_delivering(ctx);
        self.phase = Phase::AwaitingLease;
        self.reporter.handler = HandlerResult::of(&result);
        self.result = Some(result);
        // The handler's slot is free; the settlement writes still to come
        // do not need it.
        self.reporter.to.returned.do_send(HandlerReturned {
            slot: self.reporter.slot,
        });
        match (&self.reporter.heartbeat, heartbeat_due) {
            (Some(heartbeat), _) => heartbeat.do_send(StopAndHandOver),
            (None, true) => {
                // No renewal was due yet: the claim's own lease is the one
                // to settle under.
                let hand_over =
                    lease::unrenewed_hand_over(&self.drain, &self.message, self.active_until);
                self.lease_handed_over(hand_over, ctx);
            }
            (None, false) => {
                let failure = heartbeat_gone(&self.message);
                self.lost(failure, ctx);
            }
        }
    }

    /// Start the heartbeat: its first renewal is due.
    fn start_heartbeat(&mut self, ctx: &mut Context<Self>) {
        self.heartbeat_due = false;
        if self.phase != Phase::Delivering {
            return;
        }
        let heartbeat = HeartbeatActor::new(
            self.drain.clone(),
            self.message.clone(),
            ctx.address().recipient(),
            ctx.address().recipient(),
            ctx.address().recipient(),
            self.active_until,
        )
        .start();
        self.reporter.heartbeat = Some(heartbeat);
    }

    /// Settle under the lease `hand_over` confirms, or report it lost.
    fn lease_handed_over(&mut self, hand_over: HandOver, ctx: &mut Context<Self>) {
        if self.phase != Phase::AwaitingLease {
            return;
        }
        self.phase = Phase::Settling;
        // The heartbeat stops itself after answering.
        self.reporter.heartbeat = None;
        let result = self
            .result
            .take()
            .expect("a result is kept while awaiting the lease");
        let written = match settlement::prepare(
            &self.drain,
            &self.message,
            self.active_until,
            hand_over,
            result,
        ) {
            Ok(written) => written,
            Err(lost) => return self.end(Ending::Lost(*lost), ctx),
        };
        let settle =
            settlement::write_settlement(self.drain.clone(), self.message.clone(), written);
        ctx.spawn(
            settle
                .instrument(self.span.clone())
                .into_actor(self)
                .map(|settlement, act, ctx| act.end(Ending::Settled(settlement), ctx)),
        );
    }

    /// Report how the delivery ended, once and in one place, in the
    /// reference order: telemetry and observers, then the outcome with its
    /// notices; then stop.
    fn end(&mut self, ending: Ending, ctx: &mut Context<Self>) {
        self.phase = Phase::Done;
        let settled = matches!(ending, Ending::Settled(_));
        let report = self.span.in_scope(|| {
            report(
                &self.drain,
                &self.message,
                &self.reporter.handler,
                self.give_back,
                ending,
            )
        });
        if settled {
            telemetry::settled(
                &self.message,
                &self.reporter.metrics,
                report.outcome,
                self.started,
                self.drain.now(),
            );
        }
        self.reporter.report(
            report.outcome,
            report.notices,
            report.retry_at,
            report.store_faulted,
        );
        ctx.stop();
    }
}

impl Actor for DeliveryActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        if let Some(why) = self.give_back {
            self.span
                .in_scope(|| telemetry::giving_back(&self.message, why));
            self.release(ctx);
            return;
        }
        let started_at = self.drain.now();
        self.active_until = after(started_at, self.drain.config.max_active);
        let first_renewal = lease::renewal_delay(
            &self.drain,
            started_at,
            self.message.locked_until,
            self.active_until,
        );
        // The instant the actor was made, a moment ago: each read of the
        // runtime's clock costs, and one per delivery is enough.
        let now = self.started;
        self.heartbeat_due = true;
        self.heartbeat_at = now + first_renewal;
        self.max_active_at = now + self.drain.config.max_active;

        self.span
            .in_scope(|| telemetry::delivery_started(&self.message));
        let run = deliver(
            &self.drain,
            self.message.clone(),
            self.cancel.clone(),
            &self.span,
        )
        .instrument(self.span.clone());
        let run = TimerAfterFirstPoll {
            run: run.into_actor(self),
            armed: false,
        };
        self.delivery = Some(ctx.spawn(run.map(|result, act, ctx| {
            act.delivered(result, ctx);
        })));
    }
}

/// The handler's future, which sets the delivery's timer (heartbeat start,
/// `max_active`) once its first poll leaves it running.
///
/// A handler that returns on its first poll needs neither deadline, and
/// setting a timer is not free: registering one due earlier than the
/// runtime's driver last planned to wake (any timer, when it last waited
/// with none) wakes the driver with a system call, and under a fast drain
/// that was one per message. The deadlines are instants fixed when the
/// delivery started, so setting the timer after that poll, within the same
/// turn of the runtime, moves neither of them.
struct TimerAfterFirstPoll<F> {
    run: F,
    armed: bool,
}

impl<F> ActorFuture<DeliveryActor> for TimerAfterFirstPoll<F>
where
    F: ActorFuture<DeliveryActor> + Unpin,
{
    type Output = F::Output;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        act: &mut DeliveryActor,
        ctx: &mut Context<DeliveryActor>,
        task: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        let polled = std::pin::Pin::new(&mut self.run).poll(act, ctx, task);
        if polled.is_pending() && !self.armed {
            self.armed = true;
            act.set_timer(ctx);
        }
        polled
    }
}

impl Handler<HeartbeatLoss> for DeliveryActor {
    type Result = ();

    fn handle(&mut self, HeartbeatLoss(failure): HeartbeatLoss, ctx: &mut Context<Self>) {
        // While awaiting the lease, a loss the heartbeat reported (or its
        // death) is the answer; any hand-over still on its way is then
        // ignored.
        if matches!(self.phase, Phase::Delivering | Phase::AwaitingLease) {
            self.lost(failure, ctx);
        }
    }
}

impl Handler<CancelRequested> for DeliveryActor {
    type Result = ();

    fn handle(&mut self, _: CancelRequested, _: &mut Context<Self>) {
        if !self.cancel.is_cancelled() {
            self.span
                .in_scope(|| telemetry::cancel_requested(&self.message));
            self.cancel.cancel();
        }
    }
}

impl Handler<LeaseHandedOver> for DeliveryActor {
    type Result = ();

    fn handle(&mut self, LeaseHandedOver(hand_over): LeaseHandedOver, ctx: &mut Context<Self>) {
        self.lease_handed_over(hand_over, ctx);
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
        self.release(ctx);
    }
}

impl DeliveryActor {
    /// Give the claim back unsettled, and report how that went.
    fn release(&mut self, ctx: &mut Context<Self>) {
        self.phase = Phase::Releasing;
        if let Some(heartbeat) = self.reporter.heartbeat.take() {
            heartbeat.do_send(StopHeartbeat);
        }
        let drain = self.drain.clone();
        let message = self.message.clone();
        let release = async move { settlement::release_claim(&drain, &message).await };
        ctx.spawn(
            release
                .instrument(self.span.clone())
                .into_actor(self)
                .map(|release, act, ctx| act.end(Ending::Released(release), ctx)),
        );
    }
}

/// Decode and hand the message to its transport, its context reporting
/// cancellation through `cancel`. Panics in the transport, synchronous or
/// inside its future, become delivery errors.
fn deliver(
    drain: &DrainContext,
    message: Arc<ClaimedMessage>,
    cancel: CancelToken,
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
        context: DeliveryContext::new(message.clone(), trace).with_cancel_token(cancel),
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
    let error = LeaseLostError::new(
        &message.id,
        "the heartbeat stopped before confirming the lease",
        None,
    );
    LeaseLost::new(
        message,
        LeaseOperation::Renew,
        LeaseState::Lost,
        false,
        error.into(),
    )
}
