//! The public notifications: what subscribers and observers hear of a
//! delivery ([`LeaseLost`], [`OutcomeNotice`] with [`SettlementFailed`] and
//! [`DeadLetter`]). What a pass did, [`DrainReport`](crate::DrainReport),
//! is in `report`.
//!
//! The actors' own protocol never reuses these: it has its reports in
//! `messages`, and carries these inside them only to hand them on.

use actix::Message;
use outbox::{ClaimedMessage, DeliveryError, ErrorRecord, MessageKind, OutboxMessage};
use serde::Serialize;

use crate::error::Error;

/// Which guard of a claim failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseOperation {
    /// Renewing the lease: a heartbeat, or the first settlement write after
    /// the heartbeat handed over the lease (fenced on a live lease like a
    /// renewal).
    Renew,
    /// The delivery reached the `max_active` limit.
    MaxActive,
    /// Giving the claim back unsettled (at shutdown, or a claim that came
    /// back too late to deliver) failed or did not answer: the message is
    /// claimable again only once its lease has run out.
    Release,
}

impl LeaseOperation {
    /// For logs and metrics: `renew`, `max_active` or `release`, as
    /// serialized.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            LeaseOperation::Renew => "renew",
            LeaseOperation::MaxActive => "max_active",
            LeaseOperation::Release => "release",
        }
    }
}

/// How a lease failure ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseState {
    /// The claim is lost or could not be confirmed; nothing was settled.
    Lost,
    /// Renewals failed for a while, then succeeded; the message settled normally.
    Recovered,
    /// The first settlement write failed transiently; the message settled
    /// under its last confirmed lease.
    Degraded,
}

/// A lease failure: sent to lease-lost subscribers and observers.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct LeaseLost {
    /// The message id.
    pub id: String,
    /// The message kind.
    pub kind: MessageKind,
    /// The message name.
    pub name: String,
    /// Which attempt this was.
    pub attempt: u32,
    /// Which guard failed.
    pub operation: LeaseOperation,
    /// Lost, recovered or degraded.
    pub state: LeaseState,
    /// `true` when the claim is known to be gone: the store answered that
    /// another token owns the message (or that the lease is over), or the
    /// lease ran out on this worker's clock before a renewal or the first
    /// settlement write could be made (as the reference reports it). `false`
    /// when the claim could only not be confirmed: a renewal or write that
    /// did not answer in time, failures until the deadline, `max_active`, or
    /// a delivery that died.
    pub confirmed_lost: bool,
    /// Whether the handler had finished when this was reported, and how (the
    /// reference's `deliverySucceeded`). A finished handler whose lease is
    /// lost means its effect happened but nothing was settled: the message
    /// will be delivered again after its lease.
    pub handler: HandlerResult,
    /// What went wrong.
    pub error: Error,
}

/// How far the handler of a delivery had got when a lease failure was
/// reported.
#[derive(Debug, Clone)]
pub enum HandlerResult {
    /// The handler had not returned: it was aborted (or its delivery died),
    /// so its effect may or may not have happened.
    Unfinished,
    /// The handler succeeded: its effect happened, and unless the outcome
    /// was settled, the message will be delivered again.
    Succeeded,
    /// The handler failed with this error.
    Failed(DeliveryError),
}

impl HandlerResult {
    /// `true` once the handler had returned, with either result.
    pub fn finished(&self) -> bool {
        !matches!(self, HandlerResult::Unfinished)
    }

    /// `true` when the handler had returned successfully (the reference's
    /// `deliverySucceeded`).
    pub fn succeeded(&self) -> bool {
        matches!(self, HandlerResult::Succeeded)
    }

    /// The handler's error, when it had failed.
    pub fn error(&self) -> Option<&DeliveryError> {
        match self {
            HandlerResult::Failed(error) => Some(error),
            _ => None,
        }
    }

    pub(crate) fn of(result: &outbox::DeliveryResult) -> Self {
        match result {
            Ok(()) => HandlerResult::Succeeded,
            Err(error) => HandlerResult::Failed(error.clone()),
        }
    }

    /// For logs and metrics: `unfinished`, `succeeded` or `failed`.
    pub fn as_str(&self) -> &'static str {
        match self {
            HandlerResult::Unfinished => "unfinished",
            HandlerResult::Succeeded => "succeeded",
            HandlerResult::Failed(_) => "failed",
        }
    }
}

impl LeaseLost {
    pub(crate) fn new(
        message: &ClaimedMessage,
        operation: LeaseOperation,
        state: LeaseState,
        confirmed_lost: bool,
        error: Error,
    ) -> Self {
        LeaseLost {
            id: message.id.clone(),
            kind: message.kind,
            name: message.name.clone(),
            attempt: message.attempts,
            operation,
            state,
            confirmed_lost,
            handler: HandlerResult::Unfinished,
            error,
        }
    }

    /// The same failure, reported once the handler had ended with `handler`.
    pub(crate) fn after(mut self, handler: HandlerResult) -> Self {
        self.handler = handler;
        self
    }
}

/// The settlement write that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SettleOperation {
    /// Recording a delivered message.
    MarkDelivered,
    /// Recording a failed message (retry or dead-letter).
    MarkFailed,
}

/// A delivery whose outcome could not be stored.
#[derive(Debug, Clone)]
pub struct SettlementFailed {
    /// The message id.
    pub id: String,
    /// The message kind.
    pub kind: MessageKind,
    /// The message name.
    pub name: String,
    /// Which attempt this was.
    pub attempt: u32,
    /// The write that failed.
    pub operation: SettleOperation,
    /// `true` when the handler had succeeded (the effect happened; the
    /// message will be delivered again after its lease: at-least-once).
    pub delivery_succeeded: bool,
    /// The handler's error, when it failed.
    pub delivery_error: Option<DeliveryError>,
    /// Why the write failed.
    pub error: Error,
    /// `true` when the claim was lost while settling.
    pub claim_lost: bool,
}

/// A message that was dead-lettered.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// The message id.
    pub id: String,
    /// The message kind.
    pub kind: MessageKind,
    /// The message name.
    pub name: String,
    /// Claims made.
    pub attempts: u32,
    /// The message's attempt budget.
    pub max_attempts: u32,
    /// The error recorded with it.
    pub error: ErrorRecord,
    /// `true` when it was dead-lettered at claim (attempts used up by
    /// workers that never settled it) rather than after a failed delivery.
    pub abandoned: bool,
}

impl DeadLetter {
    pub(crate) fn delivered(message: &ClaimedMessage, error: ErrorRecord) -> Self {
        DeadLetter {
            id: message.id.clone(),
            kind: message.kind,
            name: message.name.clone(),
            attempts: message.attempts,
            max_attempts: message.max_attempts,
            error,
            abandoned: false,
        }
    }

    pub(crate) fn abandoned(message: &OutboxMessage) -> Self {
        DeadLetter {
            id: message.id.clone(),
            kind: message.kind,
            name: message.name.clone(),
            attempts: message.attempts,
            max_attempts: message.max_attempts,
            error: message.last_error.clone().unwrap_or_else(|| {
                ErrorRecord::from_error(&outbox::AbandonedClaimError::new(
                    message.id.clone(),
                    message.attempts,
                    message.max_attempts,
                ))
            }),
            abandoned: true,
        }
    }
}

/// A message an operator cancelled while it was claimed, which ended
/// cancelled: never delivered, never run again.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct CancelledMessage {
    /// The message id.
    pub id: String,
    /// The message kind.
    pub kind: MessageKind,
    /// The message name.
    pub name: String,
    /// Its queue.
    pub queue: String,
    /// Claims made.
    pub attempts: u32,
    /// `true` when a claim found it, its lease run out (its worker gone);
    /// `false` when its handler failed after the request.
    pub at_claim: bool,
}

impl CancelledMessage {
    pub(crate) fn delivered(message: &ClaimedMessage) -> Self {
        CancelledMessage {
            id: message.id.clone(),
            kind: message.kind,
            name: message.name.clone(),
            queue: message.queue.clone(),
            attempts: message.attempts,
            at_claim: false,
        }
    }

    pub(crate) fn at_claim(message: &OutboxMessage) -> Self {
        CancelledMessage {
            id: message.id.clone(),
            kind: message.kind,
            name: message.name.clone(),
            queue: message.queue.clone(),
            attempts: message.attempts,
            at_claim: true,
        }
    }
}

/// Settlement failures, dead letters and cancellations, for outcome
/// subscribers.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
#[non_exhaustive]
pub enum OutcomeNotice {
    /// A delivery's outcome could not be stored.
    SettlementFailed(SettlementFailed),
    /// A message was dead-lettered.
    DeadLettered(DeadLetter),
    /// A message cancelled while claimed ended cancelled.
    Cancelled(CancelledMessage),
}

/// Something a delivery wants subscribers to hear about.
#[derive(Debug, Clone)]
pub(crate) enum Notice {
    /// For lease-lost subscribers.
    Lease(LeaseLost),
    /// For outcome subscribers.
    Outcome(OutcomeNotice),
}
