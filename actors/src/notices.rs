//! The public reports and notifications: what a pass did ([`DrainReport`],
//! [`Outcome`]) and what subscribers and observers hear ([`LeaseLost`],
//! [`OutcomeNotice`] with [`SettlementFailed`] and [`DeadLetter`]).
//!
//! The actors' own protocol never reuses these: it has its reports in
//! `messages`, and carries these inside them only to hand them on.

use std::fmt;

use actix::Message;
use outbox::{ClaimedMessage, DeliveryError, ErrorRecord, MessageKind, OutboxMessage};
use serde::Serialize;

use crate::error::Error;

/// What one drain pass did. Every claimed message has exactly one outcome.
///
/// Counted as the reference outbox counts: `dead_lettered` includes the
/// `abandoned_dead_lettered` messages (dead-lettered at claim, never
/// delivered), and a settlement that failed because the claim was lost counts
/// in both `settlement_failed` and `lease_lost`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct DrainReport {
    /// Messages claimed for delivery (abandoned ones not included).
    pub claimed: u64,
    /// Delivered and acknowledged.
    pub delivered: u64,
    /// Failed and scheduled for another attempt.
    pub retried: u64,
    /// Dead-lettered: after delivery failed for good, or abandoned at claim.
    pub dead_lettered: u64,
    /// Dead-lettered at claim because their attempts were used up.
    pub abandoned_dead_lettered: u64,
    /// Delivered or failed, but the outcome could not be stored.
    pub settlement_failed: u64,
    /// Claims that were lost or could not be confirmed (nothing settled).
    pub lease_lost: u64,
    /// Claims given back unsettled at shutdown.
    pub released: u64,
}

impl DrainReport {
    /// Messages the pass touched: claimed plus abandoned.
    pub fn selected(&self) -> u64 {
        self.claimed + self.abandoned_dead_lettered
    }

    pub(crate) fn add(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Delivered => self.delivered += 1,
            Outcome::Retried => self.retried += 1,
            Outcome::DeadLettered => self.dead_lettered += 1,
            Outcome::SettlementFailed { claim_lost } => {
                self.settlement_failed += 1;
                if claim_lost {
                    self.lease_lost += 1;
                }
            }
            Outcome::LeaseLost => self.lease_lost += 1,
            Outcome::Released => self.released += 1,
        }
    }
}

impl std::ops::AddAssign for DrainReport {
    fn add_assign(&mut self, pass: DrainReport) {
        self.claimed += pass.claimed;
        self.delivered += pass.delivered;
        self.retried += pass.retried;
        self.dead_lettered += pass.dead_lettered;
        self.abandoned_dead_lettered += pass.abandoned_dead_lettered;
        self.settlement_failed += pass.settlement_failed;
        self.lease_lost += pass.lease_lost;
        self.released += pass.released;
    }
}

impl fmt::Display for DrainReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "claimed {}, delivered {}, retried {}, dead-lettered {} ({} abandoned), \
             settlement failed {}, lease lost {}, released {}",
            self.claimed,
            self.delivered,
            self.retried,
            self.dead_lettered,
            self.abandoned_dead_lettered,
            self.settlement_failed,
            self.lease_lost,
            self.released
        )
    }
}

/// The one outcome of one claimed message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Delivered and acknowledged.
    Delivered,
    /// Failed; pending again at its retry time.
    Retried,
    /// Failed for good; dead-lettered.
    DeadLettered,
    /// The outcome could not be stored; `claim_lost` when the claim was lost
    /// while trying (the message is claimable again after its lease).
    SettlementFailed {
        /// The claim was confirmed lost or its deadline passed.
        claim_lost: bool,
    },
    /// The claim was lost or unconfirmed before the handler's result could
    /// be written: the delivery was aborted, or it finished but the lease
    /// could not be confirmed for its settlement. Nothing settled; the
    /// message is claimable again after its lease.
    LeaseLost,
    /// Given back unsettled, claimable again at once: at shutdown, or because
    /// the claim took so long that less of its lease was left than the claim
    /// itself had taken (a handler started on it would likely outlive it).
    Released,
}

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

/// Settlement failures and dead letters, for outcome subscribers.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
#[non_exhaustive]
pub enum OutcomeNotice {
    /// A delivery's outcome could not be stored.
    SettlementFailed(SettlementFailed),
    /// A message was dead-lettered.
    DeadLettered(DeadLetter),
}

/// Something a delivery wants subscribers to hear about.
#[derive(Debug, Clone)]
pub(crate) enum Notice {
    /// For lease-lost subscribers.
    Lease(LeaseLost),
    /// For outcome subscribers.
    Outcome(OutcomeNotice),
}
