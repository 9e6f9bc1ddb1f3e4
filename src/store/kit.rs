//! The toolkit for implementing a store: what [`MemoryOutbox`], the SQL
//! stores and any store of your own use to behave the same way.
//!
//! - [`check`]: the input checks every store runs before touching anything,
//!   so invalid parameters are refused with the same errors everywhere.
//! - [`lease_end`]: `now + lease`, refused when it leaves the calendar.
//! - [`WakeupSender`]: the sending half of [`Wakeups`], for a store that can
//!   tell when messages were committed.
//! - [`new_message_id`] and [`new_claim_token`]: the ids and tokens the
//!   bundled stores generate.
//! - [`page`]: a page of a listing out of one row more than asked for.
//! - [`redact_url`]: a database URL without its password, for messages.
//!
//! Applications need none of this; the store port itself (the
//! [`OutboxStore`](crate::OutboxStore) and [`OutboxAdmin`](crate::OutboxAdmin)
//! traits and their parameter structs) is in the crate root.
//!
//! [`MemoryOutbox`]: crate::MemoryOutbox

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{ArmWakeups, MessagePage, Wakeups};
use crate::error::{Error, Result};
use crate::message::OutboxMessage;
pub use crate::message::{new_claim_token, new_message_id};

/// The sending half of [`Wakeups`], kept by a store.
#[derive(Debug, Clone)]
pub struct WakeupSender(Arc<tokio::sync::watch::Sender<u64>>);

impl WakeupSender {
    /// A sender with no receivers yet.
    pub fn new() -> Self {
        WakeupSender(Arc::new(tokio::sync::watch::Sender::new(0)))
    }

    /// Wake every subscriber (cheap when nobody listens).
    pub fn wake(&self) {
        self.0.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A new receiver; it sees only wake-ups sent after this call.
    pub fn subscribe(&self) -> Wakeups {
        Wakeups::new(self.0.subscribe(), None)
    }

    /// A new receiver for a store that wakes only drains that asked, each
    /// asking through `arm`; see [`Wakeups::arm`].
    pub fn subscribe_armed(&self, arm: ArmWakeups) -> Wakeups {
        Wakeups::new(self.0.subscribe(), Some(arm))
    }

    /// Wait until no receiver is left, so a store can stop the work that
    /// feeds them.
    pub async fn closed(&self) {
        self.0.closed().await
    }

    /// `true` when some receiver is alive.
    pub fn has_subscribers(&self) -> bool {
        self.0.receiver_count() > 0
    }

    /// A handle that wakes the same receivers without keeping the sender
    /// alive, for registries that outlive the stores in them.
    pub(crate) fn downgrade(&self) -> WeakWakeupSender {
        WeakWakeupSender(Arc::downgrade(&self.0))
    }
}

/// A [`WakeupSender`] that does not keep its store's sender alive.
#[derive(Debug, Clone)]
pub(crate) struct WeakWakeupSender(std::sync::Weak<tokio::sync::watch::Sender<u64>>);

impl WeakWakeupSender {
    /// The sender, unless every clone of it is gone.
    pub(crate) fn upgrade(&self) -> Option<WakeupSender> {
        self.0.upgrade().map(WakeupSender)
    }

    /// `true` once every clone of the sender is gone.
    pub(crate) fn is_gone(&self) -> bool {
        self.0.strong_count() == 0
    }
}

impl Default for WakeupSender {
    fn default() -> Self {
        Self::new()
    }
}

/// The page of `limit` messages out of up to `limit + 1` read, oldest
/// first: a message past the limit only says that another page follows.
pub fn page(messages: Vec<OutboxMessage>, limit: usize) -> MessagePage {
    MessagePage::of(messages, limit)
}

/// `now + lease`, or an input error when that leaves the calendar.
pub fn lease_end(now: DateTime<Utc>, lease: Duration) -> Result<DateTime<Utc>> {
    chrono::Duration::from_std(lease)
        .ok()
        .and_then(|lease| now.checked_add_signed(lease))
        .ok_or_else(|| Error::invalid("lease", "is too long to add to now"))
}

/// The end of an idempotency window of `window` that opens at `now`; the
/// latest representable time when it would overflow.
pub fn window_end(now: DateTime<Utc>, window: std::time::Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(window)
        .ok()
        .and_then(|window| now.checked_add_signed(window))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// Input checks every store runs before touching anything, so invalid
/// parameters are refused the same way everywhere and change nothing.
pub mod check {
    use std::time::Duration;

    use crate::error::{AdminError, Error, Result};
    use crate::store::{
        CancelMessages, ClaimBatch, ListMessages, PurgeBatch, PurgeMessages, RequeueDeadLetters,
    };

    /// `limit >= 1`, `lease > 0`, valid queues (see
    /// [`ClaimBatch::served`]).
    pub fn claim_batch(params: &ClaimBatch) -> Result<()> {
        if params.limit == 0 {
            return Err(Error::invalid("limit", "must be at least 1"));
        }
        if params.max_attempts == 0 {
            return Err(Error::invalid(
                "max_attempts",
                "must be at least 1 (the cap of messages enqueued without one)",
            ));
        }
        params.served()?;
        positive_lease(params.lease)
    }

    /// A queue name an operator gave, to pause or resume.
    pub fn queue(name: &str) -> Result<()> {
        crate::queue::check_queue_name("queue", name)
    }

    /// A cancel names one id, or at least one filter, not both; every
    /// value is one a message could have.
    pub fn cancel(params: &CancelMessages) -> Result<()> {
        let filtered =
            params.name.is_some() || params.ordering_key.is_some() || params.queue.is_some();
        match &params.id {
            Some(id) if id.is_empty() => return Err(Error::invalid("id", "must not be empty")),
            Some(_) if filtered => {
                return Err(Error::invalid(
                    "id",
                    "cannot be combined with a name, key or queue filter; cancel one message \
                     or a set",
                ));
            }
            Some(_) => {}
            None if !filtered => {
                return Err(Error::invalid(
                    "filter",
                    "give an id, or at least one of a name, an ordering key and a queue; \
                     cancelling every message at once is not offered",
                ));
            }
            None => {}
        }
        if params.name.as_deref().is_some_and(str::is_empty) {
            return Err(Error::invalid("name", "must not be empty"));
        }
        if params.ordering_key.as_deref().is_some_and(str::is_empty) {
            return Err(Error::invalid("ordering_key", "must not be empty"));
        }
        if let Some(queue) = &params.queue {
            crate::queue::check_queue_name("queue", queue)?;
        }
        Ok(())
    }

    /// A lease longer than zero.
    pub fn positive_lease(lease: Duration) -> Result<()> {
        if lease.is_zero() {
            return Err(Error::invalid("lease", "must be longer than zero"));
        }
        if lease > crate::limits::MAX_DURATION {
            return Err(Error::invalid("lease", "must be at most one year"));
        }
        Ok(())
    }

    /// Non-empty id and claim token.
    pub fn fence(id: &str, claim_token: &str) -> Result<()> {
        if id.is_empty() {
            return Err(Error::invalid("id", "must not be empty"));
        }
        if claim_token.is_empty() {
            return Err(Error::invalid("claim_token", "must not be empty"));
        }
        Ok(())
    }

    /// `1 <= limit <= 10 000` for [`blocked_keys`](crate::OutboxAdmin::blocked_keys).
    pub fn blocked_keys(limit: usize) -> Result<()> {
        if limit == 0 || limit > 10_000 {
            return Err(Error::invalid("limit", "must be between 1 and 10000"));
        }
        Ok(())
    }

    /// A non-empty id to skip.
    pub fn skip(id: &str) -> Result<()> {
        if id.is_empty() {
            return Err(Error::invalid("id", "must not be empty"));
        }
        Ok(())
    }

    /// `1 <= limit <= 10 000`.
    pub fn list(params: &ListMessages) -> Result<()> {
        if params.limit == 0 || params.limit > 10_000 {
            return Err(Error::invalid("limit", "must be between 1 and 10000"));
        }
        Ok(())
    }

    /// Only terminal statuses may be purged.
    pub fn purge(params: &PurgeMessages) -> Result<()> {
        match params.status {
            Some(status) if !status.is_terminal() => Err(AdminError::UnsafePurge { status }.into()),
            _ => Ok(()),
        }
    }

    /// A terminal status and `1 <= limit <= 10 000`.
    pub fn purge_batch(params: &PurgeBatch) -> Result<()> {
        if !params.status.is_terminal() {
            return Err(AdminError::UnsafePurge {
                status: params.status,
            }
            .into());
        }
        if params.limit == 0 || params.limit > 10_000 {
            return Err(Error::invalid("limit", "must be between 1 and 10000"));
        }
        Ok(())
    }

    /// A requeue names one id, or a set by name, not both.
    pub fn requeue(params: &RequeueDeadLetters) -> Result<()> {
        if params.id.as_deref().is_some_and(str::is_empty) {
            return Err(Error::invalid("id", "must not be empty"));
        }
        if params.id.is_some() && params.name.is_some() {
            return Err(Error::invalid(
                "name",
                "cannot be combined with an id; requeue one message or a set by name",
            ));
        }
        Ok(())
    }
}

/// `url` with its password, if any, replaced by `***`: a database URL as
/// it may be shown in an error message or a log line.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_owned();
    };
    match rest[..at].split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***{}", &rest[at..]),
        None => url.to_owned(),
    }
}
