//! What a pass did: the [`DrainReport`] of a pass, and the one [`Outcome`]
//! of each message it claimed.
//!
//! Below every other module: the errors carry a pass's report
//! ([`Error::Pass`](crate::Error::Pass)), the notices and internal reports
//! carry outcomes, and none of that may lead back here.

use std::fmt;

use serde::Serialize;

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
    /// Cancelled by an operator while claimed: their handler failed after
    /// the request, or their claim had run out and a claim found them
    /// (`cancelled_at_claim`). Never delivered, never run again.
    pub cancelled: u64,
    /// Of `cancelled`, those found by a claim, their lease run out: not
    /// counted in `claimed`.
    pub cancelled_at_claim: u64,
}

impl DrainReport {
    /// Messages the pass touched: claimed plus abandoned plus cancelled at
    /// claim.
    pub fn selected(&self) -> u64 {
        self.claimed + self.abandoned_dead_lettered + self.cancelled_at_claim
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
            Outcome::Cancelled => self.cancelled += 1,
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
        self.cancelled += pass.cancelled;
        self.cancelled_at_claim += pass.cancelled_at_claim;
    }
}

impl fmt::Display for DrainReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "claimed {}, delivered {}, retried {}, dead-lettered {} ({} abandoned), \
             settlement failed {}, lease lost {}, released {}, cancelled {} ({} at claim)",
            self.claimed,
            self.delivered,
            self.retried,
            self.dead_lettered,
            self.abandoned_dead_lettered,
            self.settlement_failed,
            self.lease_lost,
            self.released,
            self.cancelled,
            self.cancelled_at_claim
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
    /// Cancelled by an operator while it was being delivered, and its
    /// handler failed: stored as cancelled, never to run again.
    Cancelled,
}
