//! The deadline a delivery works to, shared by the heartbeat, the delivery
//! and the settlement: the end of the last confirmed lease or of
//! `max_active`, whichever comes first; when to renew before it; and the
//! loss to report once it has passed.
//!
//! Plain functions of the drain's clock and settings: the heartbeat renews
//! against the deadline, the delivery hands over the claim's own lease when
//! no renewal was due yet, and the settlement bounds its writes by it, so
//! all three name a passed deadline the same way.

use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox::ClaimedMessage;

use crate::context::{DrainContext, until};
use crate::error::{Error, LeaseLostError, MaxActiveDurationError};
use crate::messages::HandOver;
use crate::notices::{LeaseLost, LeaseOperation, LeaseState};

/// When a delivery's claim stops being safe to act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Deadline {
    /// `min(locked_until, active_until)`.
    pub(crate) at: DateTime<Utc>,
    /// `max_active` ends no later than the lease: passing the deadline is
    /// then a `max_active` failure, not a lost lease.
    pub(crate) max_active_first: bool,
}

impl Deadline {
    /// The deadline of a lease confirmed until `locked_until`, for a
    /// delivery whose `max_active` ends at `active_until`.
    pub(crate) fn new(locked_until: DateTime<Utc>, active_until: DateTime<Utc>) -> Self {
        Deadline {
            at: locked_until.min(active_until),
            max_active_first: active_until <= locked_until,
        }
    }

    /// The loss to report once this deadline has passed: a `max_active`
    /// failure when `max_active` set it, else a lost lease for `reason`
    /// (caused by `cause`), `confirmed_lost` as the caller knows it.
    pub(crate) fn passed(
        self,
        drain: &DrainContext,
        message: &ClaimedMessage,
        confirmed_lost: bool,
        reason: &str,
        cause: Option<Error>,
    ) -> LeaseLost {
        let (operation, confirmed_lost, error) = if self.max_active_first {
            let error = MaxActiveDurationError::new(&message.id, drain.config.max_active);
            (LeaseOperation::MaxActive, false, error.into())
        } else {
            let error = LeaseLostError::new(&message.id, reason, cause);
            (LeaseOperation::Renew, confirmed_lost, error.into())
        };
        LeaseLost::new(message, operation, LeaseState::Lost, confirmed_lost, error)
    }
}

/// The deadline of a lease confirmed until `locked_until`, or the loss to
/// report (for `reason`) when it has passed already.
pub(crate) fn deadline_ahead(
    drain: &DrainContext,
    message: &ClaimedMessage,
    locked_until: DateTime<Utc>,
    active_until: DateTime<Utc>,
    reason: &str,
) -> Result<Deadline, Box<LeaseLost>> {
    let deadline = Deadline::new(locked_until, active_until);
    if drain.now() >= deadline.at {
        // Over on this worker's clock: as good as confirmed, as the
        // reference reports it (unless `max_active` ended it).
        let confirmed_lost = !deadline.max_active_first;
        return Err(Box::new(deadline.passed(
            drain,
            message,
            confirmed_lost,
            reason,
            None,
        )));
    }
    Ok(deadline)
}

/// How long until the next renewal. Every `heartbeat`, unless less than
/// that is left of the lease (a claim that took long to answer): a renewal
/// after the lease has ended would let the handler run past it while
/// another worker claims the message, so renew halfway to the end instead.
/// When `max_active` ends the delivery before the lease does, the
/// delivery's own timer stops it and an early renewal would gain nothing.
pub(crate) fn renewal_delay(
    drain: &DrainContext,
    now: DateTime<Utc>,
    locked_until: DateTime<Utc>,
    active_until: DateTime<Utc>,
) -> Duration {
    let remaining = until(now, locked_until);
    if remaining >= drain.heartbeat || active_until <= locked_until {
        drain.heartbeat
    } else {
        (remaining / 2).max(Duration::from_millis(1))
    }
}

/// What a delivery whose handler returned before its first renewal was due
/// hands over: the claim's own lease, if it is still running; as a
/// heartbeat stopped before its first renewal would.
pub(crate) fn unrenewed_hand_over(
    drain: &DrainContext,
    message: &ClaimedMessage,
    active_until: DateTime<Utc>,
) -> HandOver {
    match deadline_ahead(
        drain,
        message,
        message.locked_until,
        active_until,
        "the lease ran out before the delivery finished",
    ) {
        Ok(_) => HandOver::Held {
            locked_until: message.locked_until,
            renewal_error: None,
        },
        Err(failure) => HandOver::Lost(*failure),
    }
}
