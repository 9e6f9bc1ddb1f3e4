//! The memory store's cancel: pending messages and expired claims end
//! cancelled at once; a live claim gets the request on its row, for its
//! renewals to report and its settlement to act on.

use super::index::{State, clear_claim};
use super::{MemoryOutbox, check};
use crate::error::{AdminError, Error, Result};
use crate::kind::MessageStatus;
use crate::message::OutboxMessage;
use crate::store::{CancelMessages, CancelReport};

/// What a cancel does to one message.
enum Cancel {
    /// Cancelled now: pending, or claimed under a lease that ran out.
    Now,
    /// Under a live claim: the request is recorded.
    Request,
}

impl MemoryOutbox {
    pub(super) fn cancel_now(&self, params: CancelMessages) -> Result<CancelReport> {
        check::cancel(&params)?;
        let now = params.now;
        let mut state = self.lock();
        let targets: Vec<(usize, Cancel)> = match &params.id {
            Some(id) => {
                let slot = *state
                    .ids
                    .get(id.as_str())
                    .ok_or_else(|| Error::NotFound { id: id.clone() })?;
                let message = &state.stored(slot).message;
                let cancel = how(message, now).ok_or_else(|| AdminError::NotCancellable {
                    id: id.clone(),
                    status: message.status,
                })?;
                vec![(slot, cancel)]
            }
            None => matching(&state, &params),
        };
        let mut report = CancelReport::default();
        for (slot, cancel) in targets {
            match cancel {
                Cancel::Now => report.cancelled += 1,
                Cancel::Request => report.requested += 1,
            }
            if params.dry_run {
                continue;
            }
            state.update(slot, |message| match cancel {
                Cancel::Now => {
                    message.status = MessageStatus::Cancelled;
                    message.updated_at = now;
                    clear_claim(message);
                }
                Cancel::Request => {
                    message.cancel_requested_at.get_or_insert(now);
                }
            });
        }
        Ok(report)
    }
}

/// What cancelling `message` at `now` does; `None` when it cannot be
/// cancelled (it is settled).
fn how(message: &OutboxMessage, now: chrono::DateTime<chrono::Utc>) -> Option<Cancel> {
    match message.status {
        MessageStatus::Pending => Some(Cancel::Now),
        MessageStatus::Claimed if message.has_live_claim(now) => Some(Cancel::Request),
        MessageStatus::Claimed => Some(Cancel::Now),
        MessageStatus::Delivered | MessageStatus::DeadLettered | MessageStatus::Cancelled => None,
    }
}

/// The pending and claimed messages the filters of `params` match, with
/// what cancelling each does.
fn matching(state: &State, params: &CancelMessages) -> Vec<(usize, Cancel)> {
    let wanted = |message: &OutboxMessage| {
        params
            .name
            .as_deref()
            .is_none_or(|name| name == message.name)
            && params
                .ordering_key
                .as_deref()
                .is_none_or(|key| Some(key) == message.ordering_key.as_deref())
            && params
                .queue
                .as_deref()
                .is_none_or(|queue| queue == message.queue)
    };
    state
        .slots
        .iter()
        .enumerate()
        .filter_map(|(slot, stored)| Some((slot, &stored.as_ref()?.message)))
        .filter(|(_, message)| wanted(message))
        .filter_map(|(slot, message)| Some((slot, how(message, params.now)?)))
        .collect()
}
