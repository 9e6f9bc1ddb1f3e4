//! Tracing and metrics: one span per delivery, one hook per outcome.
//!
//! The actors call these hooks where an outcome is decided; each hook emits
//! the tracing event and records the metrics, so the two never disagree.
//!
//! Each event carries a stable `event` field, one of the names in
//! [`events`](crate::events), which also lists its level and fields: a hook
//! here that emits a new event, or changes one's level or fields, changes
//! that list too (a test compares the two).

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox::{ClaimedMessage, ErrorRecord, MessageKind, MessageStatus, TraceCarrier};
use tokio::time::Instant;
use tracing::Span;

use crate::context::{DrainContext, until};
use crate::error::Error;
use crate::events;
use crate::messages::GiveBack;
use crate::metrics::{self, NameMetrics};
use crate::notices::{CancelledMessage, DeadLetter, LeaseLost, LeaseState, SettlementFailed};
use crate::report::{DrainReport, Outcome};

/// The span a delivery runs in: `outbox deliver {name}`.
///
/// A root span: a delivery's parent is the trace stored at enqueue, not
/// whatever span the claimer happened to run in. With the `opentelemetry`
/// feature (of `outbox`, enabled by any crate in the build) it is parented
/// on that stored context; an invalid one is logged at debug and the
/// delivery starts a trace of its own.
pub(crate) fn delivery_span(message: &ClaimedMessage) -> Span {
    let span = tracing::info_span!(
        target: "outbox",
        parent: None,
        "outbox deliver",
        otel.name = %format_args!("outbox deliver {}", message.name),
        otel.kind = "consumer",
        outbox.message_kind = message.kind.as_str(),
        outbox.message_name = %message.name,
        outbox.message_id = %message.id,
        outbox.attempt = message.attempts,
    );
    if let Some(carrier) = &message.trace
        && let Err(error) = carrier.set_parent_of(&span)
    {
        tracing::debug!(target: "outbox", parent: &span, event = events::TRACE_INVALID,
            id = %message.id, %error,
            "stored trace context is invalid; the delivery starts a new trace");
    }
    span
}

/// The trace context handed to the handler: the delivery span's own, so
/// downstream calls continue the delivery's trace. Without OpenTelemetry
/// recording the span, the context stored at enqueue, unchanged.
pub(crate) fn delivery_trace(message: &ClaimedMessage, span: &Span) -> Option<TraceCarrier> {
    TraceCarrier::from_span(span).or_else(|| message.trace.clone())
}

/// A delivery's handler starts now. Call inside its span.
pub(crate) fn delivery_started(message: &ClaimedMessage) {
    tracing::trace!(target: "outbox", event = events::DELIVERY_STARTED, id = %message.id,
        kind = message.kind.as_str(), name = %message.name, attempt = message.attempts,
        payload = message.payload.as_str(), "outbox delivery started");
}

/// A claimed message got its delivery (and its slot).
pub(crate) fn delivery_claimed(metrics: &NameMetrics) {
    metrics::claimed(metrics);
}

/// A delivery reported its one outcome and freed its slot.
pub(crate) fn delivery_reported(metrics: &NameMetrics) {
    metrics::reported(metrics);
}

/// A delivery's outcome is final; `started` is when the delivery started.
pub(crate) fn settled(
    message: &ClaimedMessage,
    metrics: &NameMetrics,
    outcome: Outcome,
    started: Instant,
    now: DateTime<Utc>,
) {
    metrics::settled(
        metrics,
        outcome,
        started.elapsed(),
        until(message.created_at, now),
    );
}

/// A message was delivered and its delivery settled; its counter is
/// recorded with the outcome, by [`settled`].
pub(crate) fn delivered(message: &ClaimedMessage) {
    tracing::info!(target: "outbox", event = events::DELIVERED, id = %message.id,
        kind = message.kind.as_str(), name = %message.name, attempt = message.attempts,
        "outbox message delivered");
    if message.kind == MessageKind::Job {
        tracing::info!(target: "outbox", event = events::JOB_COMPLETED, id = %message.id,
            job = %message.name, attempt = message.attempts, "job completed");
    }
}

pub(crate) fn retry_scheduled(
    message: &ClaimedMessage,
    error: &ErrorRecord,
    delay: Duration,
    retry_at: Option<DateTime<Utc>>,
) {
    let retry_at = retry_at.map(|at| at.to_rfc3339());
    tracing::warn!(target: "outbox", event = events::RETRY_SCHEDULED, id = %message.id,
        kind = message.kind.as_str(), name = %message.name, attempt = message.attempts,
        retry_delay_ms = delay.as_millis() as u64, retry_at = retry_at.as_deref(),
        error = %error, "outbox delivery failed; retry scheduled");
    if message.kind == MessageKind::Job {
        tracing::warn!(target: "outbox", event = events::JOB_RETRY_SCHEDULED, id = %message.id,
            job = %message.name, attempt = message.attempts,
            retry_delay_ms = delay.as_millis() as u64, retry_at = retry_at.as_deref(),
            error = %error, "job failed; retry scheduled");
    }
    metrics::retried(message);
}

pub(crate) fn dead_lettered(dead_letter: &DeadLetter) {
    tracing::error!(target: "outbox", event = events::DEAD_LETTERED, id = %dead_letter.id,
        kind = dead_letter.kind.as_str(), name = %dead_letter.name, attempts = dead_letter.attempts,
        abandoned = dead_letter.abandoned, error = %dead_letter.error, "outbox message dead-lettered");
    if dead_letter.kind == MessageKind::Job {
        tracing::error!(target: "outbox", event = events::JOB_DEAD_LETTERED, id = %dead_letter.id,
            job = %dead_letter.name, attempts = dead_letter.attempts,
            abandoned = dead_letter.abandoned, error = %dead_letter.error, "job dead-lettered");
    }
    metrics::dead_lettered(dead_letter);
}

/// A renewal reported the message's cancellation; its handler is told.
pub(crate) fn cancel_requested(message: &ClaimedMessage) {
    tracing::info!(target: "outbox", event = events::CANCEL_REQUESTED, id = %message.id,
        kind = message.kind.as_str(), name = %message.name, queue = %message.queue,
        attempt = message.attempts, "outbox message cancelled while it is delivered");
}

pub(crate) fn cancelled(cancelled: &CancelledMessage) {
    tracing::info!(target: "outbox", event = events::CANCELLED, id = %cancelled.id,
        kind = cancelled.kind.as_str(), name = %cancelled.name, queue = %cancelled.queue,
        attempts = cancelled.attempts, at_claim = cancelled.at_claim,
        "outbox message cancelled");
    metrics::cancelled(cancelled);
}

pub(crate) fn lease_failure(failure: &LeaseLost) {
    let operation = failure.operation.as_str();
    match failure.state {
        LeaseState::Lost if failure.handler.finished() => tracing::warn!(target: "outbox",
            event = events::LEASE_LOST, id = %failure.id, kind = failure.kind.as_str(),
            name = %failure.name, operation, confirmed_lost = failure.confirmed_lost,
            handler = failure.handler.as_str(), error = %failure.error,
            "outbox claim lost after the handler finished; its result is not settled and the \
             message will be delivered again"),
        LeaseState::Lost => tracing::warn!(target: "outbox", event = events::LEASE_LOST,
            id = %failure.id, kind = failure.kind.as_str(), name = %failure.name, operation,
            confirmed_lost = failure.confirmed_lost, handler = failure.handler.as_str(),
            error = %failure.error, "outbox claim lost; delivery aborted, nothing settled"),
        LeaseState::Recovered => tracing::info!(target: "outbox",
            event = events::RENEWAL_RECOVERED, id = %failure.id, kind = failure.kind.as_str(),
            name = %failure.name, error = %failure.error, "outbox claim renewal recovered"),
        LeaseState::Degraded => tracing::warn!(target: "outbox", event = events::RENEWAL_DEGRADED,
            id = %failure.id, kind = failure.kind.as_str(), name = %failure.name, error = %failure.error,
            "outbox claim renewal failed; settling under the last confirmed lease"),
    }
    metrics::lease_failure(failure);
}

/// A delivery actor stopped before reporting: its claim is as good as lost.
/// Runs in a drop guard, maybe while unwinding, so it only logs and counts.
pub(crate) fn delivery_died(failure: &LeaseLost) {
    tracing::error!(target: "outbox", event = events::LEASE_LOST, id = %failure.id,
        kind = failure.kind.as_str(), name = %failure.name, confirmed_lost = false,
        "outbox delivery actor died; its message is claimable again after its lease");
    metrics::lease_failure(failure);
}

/// A settlement write failed transiently at `attempt`, with attempts left
/// or not: logged attempt by attempt, so that a settlement that ends badly
/// can be read back. Call inside the delivery's span.
pub(crate) fn settlement_attempt_failed(
    message: &ClaimedMessage,
    attempt: u32,
    error: &outbox::Error,
) {
    tracing::debug!(target: "outbox", id = %message.id, attempt, %error,
        "outbox settlement attempt failed");
}

pub(crate) fn settlement_failed(failure: &SettlementFailed) {
    tracing::error!(target: "outbox", event = events::SETTLEMENT_FAILED, id = %failure.id,
        kind = failure.kind.as_str(), name = %failure.name,
        delivery_succeeded = failure.delivery_succeeded, claim_lost = failure.claim_lost,
        error = %failure.error, "outbox settlement failed");
    metrics::settlement_failed(failure);
}

/// A claim was given back: at shutdown, or (`late`) because it came back
/// too late to deliver. Call inside the delivery's span.
pub(crate) fn released(message: &ClaimedMessage, given_back: Option<GiveBack>) {
    let why = match given_back {
        Some(GiveBack::Late { .. }) => "it came back too late",
        Some(GiveBack::Stale { .. }) => "it waited too long for a free slot",
        Some(GiveBack::Shutdown) | None => "the drain is shutting down",
    };
    tracing::info!(target: "outbox", event = events::RELEASED, id = %message.id,
        name = %message.name, "outbox claim released undelivered: {why}");
    metrics::released(message);
}

/// A claimed message is given back before its handler starts: see
/// [`GiveBack`]. Call inside the delivery's span.
pub(crate) fn giving_back(message: &ClaimedMessage, given_back: GiveBack) {
    match given_back {
        GiveBack::Late { took, left } => tracing::warn!(target: "outbox",
            event = events::CLAIM_TOO_LATE, id = %message.id, name = %message.name,
            took_ms = took.as_millis() as u64, lease_left_ms = left.as_millis() as u64,
            "outbox claim took longer than the lease it left; giving it back undelivered"),
        GiveBack::Stale { waited, left } => tracing::warn!(target: "outbox",
            event = events::PREFETCH_STALE, id = %message.id, name = %message.name,
            waited_ms = waited.as_millis() as u64, lease_left_ms = left.as_millis() as u64,
            "outbox message waited for a free slot until too little of its lease was left; \
             giving it back undelivered"),
        GiveBack::Shutdown => {}
    }
}

/// A claim could not be given back: the store failed with
/// `error`, or (`None`) did not answer within a lease. Call inside the
/// delivery's span.
pub(crate) fn release_failed(message: &ClaimedMessage, error: Option<&outbox::Error>) {
    match error {
        Some(error) => tracing::warn!(target: "outbox", event = events::RELEASE_FAILED,
            id = %message.id, %error,
            "could not release outbox claim; it is claimable after its lease"),
        None => tracing::warn!(target: "outbox", event = events::RELEASE_FAILED,
            id = %message.id,
            "outbox claim release timed out; it is claimable after its lease"),
    }
    metrics::release_failed(message);
}

/// A claim failed (the store failed or did not answer); the pass stops claiming.
pub(crate) fn claim_failed(error: &Error) {
    tracing::warn!(target: "outbox", event = events::CLAIM_FAILED, %error,
        "outbox claim failed; this pass stops claiming");
    metrics::claim_failed();
}

/// Opening and preparing the store's connections at start failed; the
/// drain opens them as it needs them, and a store that is down is reported
/// by the first claim.
pub(crate) fn warm_up_failed(error: &outbox::Error) {
    tracing::debug!(target: "outbox", event = events::WARM_UP_FAILED, %error,
        "outbox could not prepare the store's connections ahead of the first claim");
}

/// Arming the store's wake-ups failed; the coordinator claims again after
/// a heartbeat interval rather than wait for a wake-up that may not come.
pub(crate) fn arming_failed(error: &Error) {
    tracing::warn!(target: "outbox", event = events::ARMING_FAILED, %error,
        "outbox could not ask the store for a wake-up; claiming again soon");
}

/// A retention run deleted `deleted` messages of `status` older than `horizon`.
pub(crate) fn retention_deleted(status: MessageStatus, deleted: u64, horizon: Duration) {
    if deleted > 0 {
        tracing::info!(target: "outbox", event = events::RETENTION, status = status.as_str(),
            deleted, horizon_s = horizon.as_secs(), "outbox retention deleted settled messages");
    } else {
        tracing::debug!(target: "outbox", event = events::RETENTION, status = status.as_str(),
            deleted, horizon_s = horizon.as_secs(), "outbox retention found nothing to delete");
    }
    metrics::retention_deleted(status, deleted);
}

/// A delivery deleted its message as it settled (`delete_on_delivery`);
/// counted with the rows retention runs delete. No event of its own: the
/// delivery's `outbox.delivered` already says it.
pub(crate) fn deleted_at_delivery() {
    metrics::retention_deleted(MessageStatus::Delivered, 1);
}

/// A retention run vacuumed the store after `deleted` rows went.
pub(crate) fn retention_vacuumed(deleted: u64) {
    tracing::debug!(target: "outbox", event = events::RETENTION_VACUUM, deleted,
        "outbox retention vacuumed the table");
}

/// The vacuum after a retention run failed; the next run tries again.
pub(crate) fn retention_vacuum_failed(error: &outbox::Error) {
    tracing::warn!(target: "outbox", event = events::RETENTION_VACUUM_FAILED, %error,
        "outbox retention could not vacuum the table; retrying at the next run");
}

/// A retention batch failed; the run stops, the next one tries again.
pub(crate) fn retention_failed(status: MessageStatus, error: &outbox::Error) {
    tracing::warn!(target: "outbox", event = events::RETENTION_FAILED,
        status = status.as_str(), %error, "outbox retention failed; retrying at the next run");
}

/// A delivery's store call failed for the store's sake (or a claim came
/// back too late): the pass claims again after `pause`.
pub(crate) fn claiming_paused(pause: Duration) {
    tracing::debug!(target: "outbox", event = events::CLAIMING_PAUSED,
        pause_ms = pause.as_millis() as u64, "outbox store faults; claiming paused");
}

/// A claim returned more messages than asked; the pass stops claiming.
pub(crate) fn claim_broke_contract(error: &Error) {
    tracing::error!(target: "outbox", event = events::CLAIM_FAILED, %error);
    metrics::claim_failed();
}

/// A coordinator starts: describe the metrics to the installed recorder.
pub(crate) fn coordinator_started() {
    metrics::describe();
}

/// How often at most the pending gauge is sampled: passes can run hundreds
/// of times a second on wake-ups, and each sample is a count in the store.
const PENDING_SAMPLE_INTERVAL: Duration = Duration::from_secs(1);

/// A pass ended: log its tally and, at most every
/// [`PENDING_SAMPLE_INTERVAL`], sample the pending gauge. `last_sample` is
/// the coordinator's memory of when it last did.
pub(crate) fn pass_finished(
    drain: &Arc<DrainContext>,
    report: &DrainReport,
    last_sample: &mut Option<Instant>,
) {
    tracing::debug!(target: "outbox", event = events::PASS_FINISHED, claimed = report.claimed,
        delivered = report.delivered, retried = report.retried, dead_lettered = report.dead_lettered,
        settlement_failed = report.settlement_failed, lease_lost = report.lease_lost,
        cancelled = report.cancelled, "outbox drain pass finished");
    if last_sample.is_some_and(|at| at.elapsed() < PENDING_SAMPLE_INTERVAL) {
        return;
    }
    *last_sample = Some(Instant::now());
    let drain = drain.clone();
    // Off the coordinator's mailbox: a slow count must not delay the next pass.
    actix::spawn(async move {
        let count = drain.store.pending_count();
        match tokio::time::timeout(drain.config.lease, count).await {
            Ok(Ok(Some(count))) => metrics::pending(count),
            Ok(Ok(None)) => {}
            Ok(Err(error)) => tracing::debug!(target: "outbox", %error,
                "could not count pending outbox messages"),
            Err(_) => tracing::debug!(target: "outbox",
                "counting pending outbox messages timed out"),
        }
    });
}

/// This process enqueued a schedule's slot, at `now`.
pub(crate) fn schedule_slot_enqueued(
    schedule: &str,
    slot: DateTime<Utc>,
    id: &str,
    now: DateTime<Utc>,
) {
    let late_ms = until(slot, now).as_millis() as u64;
    tracing::info!(target: "outbox", event = events::SCHEDULE_SLOT_ENQUEUED,
        schedule, slot = %slot, id, late_ms, "outbox schedule slot enqueued");
    metrics::schedule_slot(schedule, "enqueued");
}

/// Another process had the slot already.
pub(crate) fn schedule_slot_taken(schedule: &str, slot: DateTime<Utc>, last_slot: DateTime<Utc>) {
    tracing::debug!(target: "outbox", event = events::SCHEDULE_SLOT_TAKEN,
        schedule, slot = %slot, last_slot = %last_slot,
        "outbox schedule slot already enqueued by another process");
    metrics::schedule_slot(schedule, "taken");
}

/// Slots between `after` and `before` are passed over.
pub(crate) fn schedule_slots_missed(
    schedule: &str,
    after: DateTime<Utc>,
    before: DateTime<Utc>,
    catch_up: &'static str,
) {
    tracing::info!(target: "outbox", event = events::SCHEDULE_SLOTS_MISSED,
        schedule, after = %after, before = %before, catch_up,
        "outbox schedule slots missed while no process ran it are passed over");
}

/// A schedule's store call failed; it is tried again after `retry`.
pub(crate) fn schedule_failed(schedule: &str, error: &outbox::Error, retry: Duration) {
    tracing::warn!(target: "outbox", event = events::SCHEDULE_FAILED,
        schedule, %error, retry_ms = retry.as_millis() as u64,
        "outbox schedule failed in the store; retrying");
    metrics::schedule_slot(schedule, "failed");
}
