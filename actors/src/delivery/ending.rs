//! How a delivery ended, and reporting it: once, in one place.
//!
//! The delivery actor hands its [`Ending`] here when it is done: a claim
//! lost before a settlement could start, a settlement that ran, or a claim
//! given back. [`report`] emits the telemetry and metrics, calls the
//! observers, and answers the outcome, the notices for subscribers and
//! what the claimer needs to know, for the actor to send on. The writes
//! themselves are `settlement`'s; nothing here touches the store.

use chrono::{DateTime, Utc};
use outbox::ClaimedMessage;

use crate::context::DrainContext;
use crate::error::Error;
use crate::messages::GiveBack;
use crate::notices::{
    CancelledMessage, HandlerResult, LeaseLost, LeaseOperation, LeaseState, Notice, OutcomeNotice,
};
use crate::report::Outcome;
use crate::retention;
use crate::settlement::{End, Release, Settlement};
use crate::telemetry;

/// How a delivery ended: what its actor reports, once.
#[derive(Debug)]
// One per delivery, moved once into the report.
#[allow(clippy::large_enum_variant)]
pub(super) enum Ending {
    /// The claim was lost (or `max_active` passed) before a settlement
    /// could start: nothing was written.
    Lost(LeaseLost),
    /// The settlement ran.
    Settled(Settlement),
    /// The claim was given back undelivered, or giving it back failed.
    Released(Release),
}

/// What a delivery tells the coordinator and the claimer as it ends.
pub(super) struct Report {
    /// The one outcome it counts as.
    pub(super) outcome: Outcome,
    /// What subscribers should hear, in order.
    pub(super) notices: Vec<Notice>,
    /// When a retried message is due again.
    pub(super) retry_at: Option<DateTime<Utc>>,
    /// A store call failed for the store's sake: claiming backs off.
    pub(super) store_faulted: bool,
}

/// Emit the telemetry and call the observers for how a delivery ended
/// (`handler` says how far its handler got; `give_back` why its claim was
/// given back, if it was); answer what the delivery reports. Call inside
/// the delivery's span.
pub(super) fn report(
    drain: &DrainContext,
    message: &ClaimedMessage,
    handler: &HandlerResult,
    give_back: Option<GiveBack>,
    ending: Ending,
) -> Report {
    let settlement = match ending {
        Ending::Lost(failure) => Settlement::Lost(failure),
        Ending::Settled(settlement) => settlement,
        Ending::Released(release) => {
            return report_release(drain, message, handler, give_back, release);
        }
    };
    let outcome = settlement.outcome();
    let store_faulted = settlement.store_faulted();
    let (renewal, lost, delivery_error, end, failed_attempts) = match settlement {
        Settlement::Lost(failure) => {
            report_lease(drain, &failure);
            return Report {
                outcome,
                notices: vec![Notice::Lease(failure)],
                retry_at: None,
                store_faulted,
            };
        }
        Settlement::Written {
            renewal,
            lost,
            delivery_error,
            end,
            failed_attempts,
            ..
        } => (renewal, lost, delivery_error, end, failed_attempts),
    };
    for (attempt, error) in &failed_attempts {
        telemetry::settlement_attempt_failed(message, *attempt, error);
    }
    let mut notices = Vec::new();
    for notice in renewal.into_iter().chain(lost.map(|lost| *lost)) {
        report_lease(drain, &notice);
        notices.push(Notice::Lease(notice));
    }
    if let Some(error) = &delivery_error {
        drain.observe("on_error", |observer| observer.on_error(error, message));
    }
    let retry_at = report_end(drain, message, end, &mut notices);
    Report {
        outcome,
        notices,
        retry_at,
        store_faulted,
    }
}

fn report_lease(drain: &DrainContext, failure: &LeaseLost) {
    telemetry::lease_failure(failure);
    drain.observe("on_lease_error", |observer| {
        observer.on_lease_error(failure)
    });
}

/// Report how the writes of a settlement ended, adding the notices it
/// calls for; answer when a retried message is due again.
fn report_end(
    drain: &DrainContext,
    message: &ClaimedMessage,
    end: End,
    notices: &mut Vec<Notice>,
) -> Option<DateTime<Utc>> {
    match end {
        End::Unsettled(failure) => {
            telemetry::settlement_failed(&failure);
            drain.observe("on_settlement_error", |observer| {
                observer.on_settlement_error(&failure)
            });
            notices.push(Notice::Outcome(OutcomeNotice::SettlementFailed(failure)));
            None
        }
        End::Delivered { deleted } => {
            if deleted {
                retention::deleted_at_delivery(drain);
            }
            telemetry::delivered(message);
            None
        }
        End::DeadLettered(dead_letter) => {
            telemetry::dead_lettered(&dead_letter);
            drain.observe("on_dead_letter", |observer| {
                observer.on_dead_letter(&dead_letter)
            });
            notices.push(Notice::Outcome(OutcomeNotice::DeadLettered(dead_letter)));
            None
        }
        End::Cancelled => {
            let cancelled = CancelledMessage::delivered(message);
            telemetry::cancelled(&cancelled);
            notices.push(Notice::Outcome(OutcomeNotice::Cancelled(cancelled)));
            None
        }
        End::Retried {
            error,
            delay,
            retry_at,
        } => {
            telemetry::retry_scheduled(message, &error, delay, retry_at);
            retry_at
        }
    }
}

/// Report how giving a claim back went.
fn report_release(
    drain: &DrainContext,
    message: &ClaimedMessage,
    handler: &HandlerResult,
    give_back: Option<GiveBack>,
    release: Release,
) -> Report {
    // A claim that came back too late means a slow store as much as a
    // failed write does.
    let late = matches!(give_back, Some(GiveBack::Late { .. }));
    let store_faulted = release.store_faulted() || late;
    let (confirmed_lost, error) = match release {
        Release::Released => {
            telemetry::released(message, give_back);
            (false, None)
        }
        Release::Failed(error) => {
            telemetry::release_failed(message, Some(&error));
            (error.is_claim_lost(), Some(error.into()))
        }
        Release::TimedOut => {
            telemetry::release_failed(message, None);
            let timeout = Error::Timeout {
                operation: "release_claim",
                timeout: drain.config.lease,
            };
            (false, Some(timeout))
        }
    };
    let Some(error) = error else {
        return Report {
            outcome: Outcome::Released,
            notices: Vec::new(),
            retry_at: None,
            store_faulted,
        };
    };
    // The claim stays with this worker until its lease runs out, so the
    // message waits that long: subscribers hear of it like of any lost
    // lease. `outbox.release_failed` has already logged and counted it.
    let failure = LeaseLost::new(
        message,
        LeaseOperation::Release,
        LeaseState::Lost,
        confirmed_lost,
        error,
    )
    .after(handler.clone());
    drain.observe("on_lease_error", |observer| {
        observer.on_lease_error(&failure)
    });
    Report {
        outcome: Outcome::LeaseLost,
        notices: vec![Notice::Lease(failure)],
        retry_at: None,
        store_faulted,
    }
}
