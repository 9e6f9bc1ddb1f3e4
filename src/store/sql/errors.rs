//! What the shared half answers when a call does not go through: database
//! errors named for their operation (or the missing table), why a fenced
//! write's claim was lost, read from the row as it is now, and why an admin
//! change to one message was refused.

use std::collections::HashMap;

use chrono::{DateTime, Utc};

use crate::error::{AdminError, ClaimError, ClaimLoss, Error, Result};
use crate::kind::MessageStatus;
use crate::store::connect::missing_table;
use crate::store::fenced::FencedWrite;

/// Map a database error of `operation` to the store's transient error, or,
/// when the table is missing, to [`Error::NotSetUp`] with the fix.
pub(crate) fn db(operation: &'static str) -> impl FnOnce(sqlx::Error) -> Error {
    move |e| match missing_table(&e) {
        Some(detail) => Error::NotSetUp { operation, detail },
        None => Error::store(operation, e),
    }
}

/// The columns that fence a write, as read back to name why it missed:
/// status, claim token, `locked_until`.
pub(crate) type Fence = (String, Option<String>, Option<DateTime<Utc>>);

/// The answer for each fenced write a statement did not change: why its
/// claim was lost, from the fences read back.
pub(crate) fn lost_claim(row: &FencedWrite, fences: &HashMap<String, Fence>) -> Result<()> {
    let fence = fences.get(&row.id).cloned();
    Err(claim_loss(&row.id, fence, &row.claim_token, row.now).into())
}

/// Why a fenced write matched no row, from the row as it is now.
pub(crate) fn claim_loss(
    id: &str,
    row: Option<(String, Option<String>, Option<DateTime<Utc>>)>,
    claim_token: &str,
    now: DateTime<Utc>,
) -> ClaimError {
    let reason = match row {
        None => ClaimLoss::Missing,
        Some((status, _, _)) if status != MessageStatus::Claimed.as_str() => ClaimLoss::NotClaimed,
        Some((_, token, _)) if token.as_deref() != Some(claim_token) => ClaimLoss::TokenMismatch,
        Some((_, _, until)) if until.is_none_or(|until| until <= now) => ClaimLoss::LeaseExpired,
        // The row matches now, so it changed between the write and this read.
        Some(_) => ClaimLoss::Unknown,
    };
    ClaimError::new(id, reason)
}

/// The refusal every admin change to one message shares: its live claim.
fn live_claim(
    id: &str,
    status: MessageStatus,
    locked_until: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Option<Error> {
    locked_until
        .filter(|&until| status == MessageStatus::Claimed && until > now)
        .map(|locked_until| {
            AdminError::ClaimLive {
                id: id.to_owned(),
                locked_until,
            }
            .into()
        })
}

/// Why a requeue matched nothing, from the message's status and lease as
/// read afterwards.
pub(crate) fn requeue_refusal(
    id: &str,
    status: MessageStatus,
    locked_until: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Error {
    // A dead letter that the update missed was requeued in between.
    live_claim(id, status, locked_until, now).unwrap_or_else(|| {
        AdminError::NotDeadLettered {
            id: id.to_owned(),
            status,
        }
        .into()
    })
}

/// Names the refusal of an admin change to one message from its id, its
/// status, its lease (if any) and the caller's clock.
pub(crate) type Refusal = fn(&str, MessageStatus, Option<DateTime<Utc>>, DateTime<Utc>) -> Error;

/// Why a message could not be retried now: its live claim, or its status.
pub(crate) fn retry_refusal(
    id: &str,
    status: MessageStatus,
    locked_until: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Error {
    live_claim(id, status, locked_until, now).unwrap_or_else(|| {
        AdminError::NotPending {
            id: id.to_owned(),
            status,
        }
        .into()
    })
}

/// Why a cancel of one message matched nothing: it is settled. A cancel
/// never refuses a live claim (it records the request), so only the status
/// is named.
pub(crate) fn cancel_refusal(
    id: &str,
    status: MessageStatus,
    _locked_until: Option<DateTime<Utc>>,
    _now: DateTime<Utc>,
) -> Error {
    AdminError::NotCancellable {
        id: id.to_owned(),
        status,
    }
    .into()
}
