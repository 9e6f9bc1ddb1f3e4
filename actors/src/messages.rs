//! The reports that travel up the actor tree.
//!
//! A child tells its parent what happened through these, holding a
//! `Recipient` of each (never the parent's `Addr`), so an actor's file
//! depends only on the actors below it. The commands that travel down sit
//! at the top of the file of the actor that receives them.
//!
//! | report | from | to |
//! |---|---|---|
//! | [`LeaseHandedOver`] | heartbeat | delivery |
//! | [`HeartbeatLoss`] | heartbeat | delivery |
//! | [`CancelRequested`] | heartbeat | delivery |
//! | [`HandlerReturned`] | delivery | claimer |
//! | [`DeliveryEnded`] | delivery | claimer |
//! | [`DeliveryFinished`] | delivery | coordinator |
//! | [`Abandoned`] | claimer | coordinator |
//! | [`ClaimerDone`] | claimer | coordinator |
//!
//! Beside them, [`GiveBack`]: the claimer's reason for handing a delivery
//! a message to give back undelivered, which the delivery logs.

use actix::Message;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::error::Error;
use crate::notices::{CancelledMessage, DeadLetter, LeaseLost, Notice};
use crate::report::Outcome;

/// What the heartbeat knows of the lease when the delivery is done: its
/// answer to `StopAndHandOver`.
#[derive(Debug)]
pub(crate) enum HandOver {
    /// The claim was last confirmed until `locked_until`, still ahead;
    /// settle before then.
    Held {
        /// The end of the last lease a renewal (or the claim) confirmed.
        locked_until: DateTime<Utc>,
        /// The first transient renewal error seen along the way: recovered
        /// from if the first settlement write succeeds.
        renewal_error: Option<Error>,
    },
    /// The claim is lost or unconfirmed; do not settle.
    Lost(LeaseLost),
}

/// The heartbeat stopped and hands over the last confirmed lease.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct LeaseHandedOver(pub(crate) HandOver);

/// The heartbeat found the claim lost (or died) while the delivery was still
/// running; it carries the notice subscribers will get.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct HeartbeatLoss(pub(crate) LeaseLost);

/// A renewal reported that an operator cancelled the message: the
/// delivery tells its handler.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct CancelRequested;

/// A delivery's handler returned; its settlement is still under way, but
/// it no longer needs a slot.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct HandlerReturned {
    /// The slot the delivery was started in.
    pub(crate) slot: u64,
}

/// A delivery reported its outcome, or died: its slot and its place among
/// the pass's live deliveries are free.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct DeliveryEnded {
    /// The slot the delivery was started in.
    pub(crate) slot: u64,
    /// A store call of the delivery failed for the store's sake (not a lost
    /// claim) or did not answer: claiming backs off.
    pub(crate) store_faulted: bool,
}

/// A delivery's one outcome and what subscribers should hear of it.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct DeliveryFinished {
    /// The pass that claimed the message: a late report of an earlier pass
    /// must not count in the running one.
    pub(crate) pass: u64,
    /// What happened to the message.
    pub(crate) outcome: Outcome,
    /// What subscribers should hear, in order.
    pub(crate) notices: Vec<Notice>,
    /// When a retried message is due again.
    pub(crate) retry_at: Option<DateTime<Utc>>,
}

/// Messages a claim of the running pass dead-lettered because their
/// attempts were used up, or cancelled because an operator asked to while
/// their claim ran out.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct Abandoned {
    /// The pass whose claim found them.
    pub(crate) pass: u64,
    /// One per abandoned message.
    pub(crate) dead_letters: Vec<DeadLetter>,
    /// One per message cancelled at claim.
    pub(crate) cancelled: Vec<CancelledMessage>,
}

/// The claimer of a pass stopped: it claimed, and started a delivery for,
/// `claimed` messages.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct ClaimerDone {
    /// The pass the claimer served.
    pub(crate) pass: u64,
    /// Deliveries it started; the pass ends when that many have finished.
    pub(crate) claimed: u64,
    /// Why it stopped claiming early, if it did.
    pub(crate) error: Option<Error>,
    /// It selected its whole budget, its last claim coming back full, and
    /// claimed without error to the end: more messages are likely due.
    pub(crate) spent: bool,
    /// How long claiming should still wait after store faults.
    pub(crate) pause: std::time::Duration,
    /// What arming the store's wake-ups before the first claim found.
    pub(crate) arming: Arming,
}

/// What a pass's claimer found when it armed the store's wake-ups (see
/// [`outbox::Wakeups::arm`]) before its first claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arming {
    /// It was not asked to: the store wakes on every insert, or the
    /// coordinator was armed already.
    NotAsked,
    /// Armed: the next insert committed wakes the coordinator.
    Armed,
    /// An enqueue was in flight: not armed.
    Busy,
    /// The store failed to answer: not armed.
    Failed,
}

/// Why a claimed message is given back without its handler starting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GiveBack {
    /// The claim took `took`, longer than the `left` of the lease it
    /// returned with: a sign of a slow store.
    Late { took: Duration, left: Duration },
    /// Prefetched, it waited `waited` for a free slot; only `left` of its
    /// lease remains, too little for its heartbeat's first renewal.
    Stale { waited: Duration, left: Duration },
    /// Prefetched, it was still waiting for a slot when the drain shut down.
    Shutdown,
}
