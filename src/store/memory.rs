//! An in-memory store: the full contract, for tests, demos and benchmarks.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use chrono::{DateTime, Utc};

use super::{
    ClaimBatch, ClaimedBatch, ListMessages, MarkDelivered, MarkFailed, MessagePage, OutboxAdmin,
    OutboxStats, OutboxStore, PurgeMessages, ReleaseClaim, RenewClaim, RequeueDeadLetters,
    WakeupSender, Wakeups, check, lease_end,
};
use crate::error::{AbandonedClaimError, AdminError, ClaimError, ClaimLoss, Error, Result};
use crate::message::{
    ClaimedMessage, ErrorRecord, MessageStatus, NewMessage, OutboxMessage, new_claim_token,
};
use crate::store::ListCursor;

/// An outbox held in process memory. Cheap to clone; clones share the data.
///
/// Safe to share across threads. Claims do not scan every message: unsettled
/// messages are kept in an index ordered by `(available_at, created_at)`, so
/// a claim walks only the due prefix of it (plus any live claims in that
/// prefix), whether a thousand or a million messages wait behind it.
#[derive(Clone, Default)]
pub struct MemoryOutbox {
    // A std mutex, not tokio's: no critical section awaits, each is a few
    // map operations, and a std lock is several times cheaper uncontended.
    state: Arc<Mutex<State>>,
    wake: WakeupSender,
}

impl std::fmt::Debug for MemoryOutbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.lock();
        f.debug_struct("MemoryOutbox")
            .field("messages", &state.messages.len())
            .field("unsettled", &state.queue.len())
            .finish()
    }
}

#[derive(Default)]
struct State {
    messages: HashMap<Arc<str>, Stored>,
    /// Pending and claimed messages: the only ones a claim can take.
    queue: BTreeSet<QueueKey>,
    /// Every message by `(created_at, id)`, for stable listing.
    listing: BTreeSet<(DateTime<Utc>, Arc<str>)>,
    next_seq: u64,
    counts: [u64; 4],
}

struct Stored {
    message: OutboxMessage,
    /// Insertion order: the tie-break after `created_at`.
    seq: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct QueueKey {
    available_at: DateTime<Utc>,
    created_at: DateTime<Utc>,
    seq: u64,
    id: Arc<str>,
}

impl Stored {
    fn key(&self, id: &Arc<str>) -> QueueKey {
        QueueKey {
            available_at: self.message.available_at,
            created_at: self.message.created_at,
            seq: self.seq,
            id: id.clone(),
        }
    }
}

fn status_slot(status: MessageStatus) -> usize {
    status as usize
}

impl State {
    fn set_status(&mut self, id: &str, status: MessageStatus) {
        let stored = self.messages.get_mut(id).expect("message exists");
        let old = stored.message.status;
        self.counts[status_slot(old)] -= 1;
        self.counts[status_slot(status)] += 1;
        stored.message.status = status;
    }

    /// The message if `claim_token` owns it with a live lease at `now`.
    fn fenced(&mut self, id: &str, claim_token: &str, now: DateTime<Utc>) -> Result<Arc<str>> {
        let (key, stored) = self
            .messages
            .get_key_value(id)
            .ok_or_else(|| ClaimError::new(id, ClaimLoss::Missing))?;
        let message = &stored.message;
        if message.status != MessageStatus::Claimed {
            return Err(ClaimError::new(id, ClaimLoss::NotClaimed).into());
        }
        if message.claim_token.as_deref() != Some(claim_token) {
            return Err(ClaimError::new(id, ClaimLoss::TokenMismatch).into());
        }
        if message.locked_until.is_none_or(|until| until <= now) {
            return Err(ClaimError::new(id, ClaimLoss::LeaseExpired).into());
        }
        Ok(key.clone())
    }

    /// End a claim: clear its fields, then leave the queue (terminal) or
    /// move to a new place in it (pending again at `available_at`).
    fn settle(
        &mut self,
        id: &Arc<str>,
        status: MessageStatus,
        available_at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) {
        let stored = self.messages.get_mut(id).expect("message exists");
        let old_key = stored.key(id);
        let message = &mut stored.message;
        message.claim_token = None;
        message.claimed_at = None;
        message.locked_until = None;
        message.updated_at = now;
        message.available_at = available_at;
        let new_key = stored.key(id);
        self.queue.remove(&old_key);
        if !status.is_terminal() {
            self.queue.insert(new_key);
        }
        self.set_status(id, status);
    }
}

impl MemoryOutbox {
    /// An empty outbox.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // No critical section can leave the state half-updated on a panic
        // that matters to callers (they only panic on broken invariants), so
        // a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Number of stored messages.
    pub fn len(&self) -> usize {
        self.lock().messages.len()
    }

    /// `true` when nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every stored message, in `(created_at, id)` order. For tests and demos.
    pub fn snapshot(&self) -> Vec<OutboxMessage> {
        let state = self.lock();
        state
            .listing
            .iter()
            .map(|(_, id)| state.messages[id].message.clone())
            .collect()
    }

    fn enqueue_now(&self, message: NewMessage) -> Result<String> {
        message.validate()?;
        let id: Arc<str> = Arc::from(message.resolve_id());
        let now = message.now;
        let mut state = self.lock();
        if state.messages.contains_key(&id) {
            return Err(Error::DuplicateId { id: id.to_string() });
        }
        let seq = state.next_seq;
        state.next_seq += 1;
        let stored = Stored {
            message: OutboxMessage {
                id: id.to_string(),
                kind: message.kind,
                name: message.name,
                payload: message.payload,
                trace: message.trace,
                status: MessageStatus::Pending,
                attempts: 0,
                max_attempts: message.max_attempts,
                available_at: message.available_at.unwrap_or(now),
                claim_token: None,
                claimed_at: None,
                locked_until: None,
                last_error: None,
                created_at: now,
                updated_at: now,
                delivered_at: None,
            },
            seq,
        };
        state.queue.insert(stored.key(&id));
        state.listing.insert((now, id.clone()));
        state.messages.insert(id.clone(), stored);
        state.counts[status_slot(MessageStatus::Pending)] += 1;
        drop(state);
        self.wake.wake();
        Ok(id.to_string())
    }

    fn claim_now(&self, params: ClaimBatch) -> Result<ClaimedBatch> {
        check::claim_batch(&params)?;
        let ClaimBatch { limit, now, lease } = params;
        let locked_until = lease_end(now, lease)?;
        let mut state = self.lock();
        let mut selected = Vec::with_capacity(limit.min(1024));
        for key in &state.queue {
            if key.available_at > now || selected.len() == limit {
                break;
            }
            if state.messages[&key.id].message.is_claimable(now) {
                selected.push(key.id.clone());
            }
        }
        let mut batch = ClaimedBatch::default();
        for id in selected {
            let stored = state
                .messages
                .get_mut(&id)
                .expect("selected message exists");
            let message = &mut stored.message;
            if message.attempts >= message.max_attempts {
                message.last_error = Some(ErrorRecord::from_error(&AbandonedClaimError {
                    id: id.to_string(),
                    attempts: message.attempts,
                    max_attempts: message.max_attempts,
                }));
                let available_at = message.available_at;
                state.settle(&id, MessageStatus::DeadLettered, available_at, now);
                batch
                    .dead_lettered
                    .push(state.messages[&id].message.clone());
                continue;
            }
            let token = new_claim_token();
            message.attempts += 1;
            message.claim_token = Some(token.clone());
            message.claimed_at = Some(now);
            message.locked_until = Some(locked_until);
            message.updated_at = now;
            batch.claimed.push(ClaimedMessage {
                id: message.id.clone(),
                kind: message.kind,
                name: message.name.clone(),
                payload: message.payload.clone(),
                trace: message.trace.clone(),
                attempts: message.attempts,
                max_attempts: message.max_attempts,
                available_at: message.available_at,
                created_at: message.created_at,
                claim_token: token,
                claimed_at: now,
                locked_until,
            });
            if message.status != MessageStatus::Claimed {
                state.set_status(&id, MessageStatus::Claimed);
            }
        }
        Ok(batch)
    }

    fn renew_now(&self, params: RenewClaim) -> Result<DateTime<Utc>> {
        check::fence(&params.id, &params.claim_token)?;
        check::positive_lease(params.lease)?;
        let locked_until = lease_end(params.now, params.lease)?;
        let mut state = self.lock();
        let id = state.fenced(&params.id, &params.claim_token, params.now)?;
        let message = &mut state
            .messages
            .get_mut(&id)
            .expect("fenced message exists")
            .message;
        message.locked_until = Some(locked_until);
        message.updated_at = params.now;
        Ok(locked_until)
    }

    fn deliver_now(&self, params: MarkDelivered) -> Result<()> {
        check::fence(&params.id, &params.claim_token)?;
        let mut state = self.lock();
        let id = state.fenced(&params.id, &params.claim_token, params.now)?;
        let available_at = state.messages[&id].message.available_at;
        state.settle(&id, MessageStatus::Delivered, available_at, params.now);
        let message = &mut state
            .messages
            .get_mut(&id)
            .expect("settled message exists")
            .message;
        message.delivered_at = Some(params.now);
        Ok(())
    }

    fn fail_now(&self, params: MarkFailed) -> Result<()> {
        check::fence(&params.id, &params.claim_token)?;
        let mut state = self.lock();
        let id = state.fenced(&params.id, &params.claim_token, params.now)?;
        let (status, available_at) = if params.dead_letter {
            let current = state.messages[&id].message.available_at;
            (MessageStatus::DeadLettered, current)
        } else {
            (
                MessageStatus::Pending,
                params.retry_at.unwrap_or(params.now),
            )
        };
        state.settle(&id, status, available_at, params.now);
        let message = &mut state
            .messages
            .get_mut(&id)
            .expect("settled message exists")
            .message;
        message.last_error = Some(params.error.bounded());
        Ok(())
    }

    fn release_now(&self, params: ReleaseClaim) -> Result<()> {
        check::fence(&params.id, &params.claim_token)?;
        let mut state = self.lock();
        let id = state.fenced(&params.id, &params.claim_token, params.now)?;
        state.settle(&id, MessageStatus::Pending, params.now, params.now);
        let message = &mut state
            .messages
            .get_mut(&id)
            .expect("released message exists")
            .message;
        message.attempts = message.attempts.saturating_sub(1);
        Ok(())
    }

    fn stats_now(&self, now: DateTime<Utc>) -> OutboxStats {
        let state = self.lock();
        let count = |status| state.counts[status_slot(status)];
        let mut stats = OutboxStats {
            pending: count(MessageStatus::Pending),
            claimed: count(MessageStatus::Claimed),
            delivered: count(MessageStatus::Delivered),
            dead_lettered: count(MessageStatus::DeadLettered),
            ..OutboxStats::default()
        };
        for key in &state.queue {
            let message = &state.messages[&key.id].message;
            match message.status {
                MessageStatus::Claimed if message.has_live_claim(now) => stats.live_claims += 1,
                MessageStatus::Claimed => stats.expired_claims += 1,
                MessageStatus::Pending if message.available_at <= now => {
                    stats.oldest_due_at = Some(match stats.oldest_due_at {
                        Some(oldest) => oldest.min(message.available_at),
                        None => message.available_at,
                    });
                }
                _ => {}
            }
        }
        stats
    }

    fn list_now(&self, params: ListMessages) -> Result<MessagePage> {
        check::list(&params)?;
        let state = self.lock();
        let start = match &params.after {
            Some(cursor) => {
                std::ops::Bound::Excluded((cursor.created_at, Arc::from(cursor.id.as_str())))
            }
            None => std::ops::Bound::Unbounded,
        };
        let mut messages = Vec::new();
        let mut more = false;
        for (_, id) in state.listing.range((start, std::ops::Bound::Unbounded)) {
            let message = &state.messages[id].message;
            if params.status.is_some_and(|status| status != message.status)
                || params
                    .name
                    .as_deref()
                    .is_some_and(|name| name != message.name)
            {
                continue;
            }
            if messages.len() == params.limit {
                more = true;
                break;
            }
            messages.push(message.clone());
        }
        let next = more.then(|| {
            let last: &OutboxMessage = messages.last().expect("a full page has a last message");
            ListCursor {
                created_at: last.created_at,
                id: last.id.clone(),
            }
        });
        Ok(MessagePage { messages, next })
    }

    fn get_now(&self, id: &str) -> Result<OutboxMessage> {
        self.lock()
            .messages
            .get(id)
            .map(|stored| stored.message.clone())
            .ok_or_else(|| Error::NotFound { id: id.to_owned() })
    }

    fn requeue_now(&self, params: RequeueDeadLetters) -> Result<u64> {
        check::requeue(&params)?;
        let now = params.now;
        let mut state = self.lock();
        let targets: Vec<Arc<str>> = match &params.id {
            Some(id) => {
                let (key, stored) = state
                    .messages
                    .get_key_value(id.as_str())
                    .ok_or_else(|| Error::NotFound { id: id.clone() })?;
                let message = &stored.message;
                if message.has_live_claim(now) {
                    return Err(AdminError::ClaimLive {
                        id: id.clone(),
                        locked_until: message.locked_until.expect("a live claim has a lease"),
                    }
                    .into());
                }
                if message.status != MessageStatus::DeadLettered {
                    return Err(AdminError::NotDeadLettered {
                        id: id.clone(),
                        status: message.status,
                    }
                    .into());
                }
                vec![key.clone()]
            }
            None => state
                .messages
                .iter()
                .filter(|(_, stored)| {
                    stored.message.status == MessageStatus::DeadLettered
                        && params
                            .name
                            .as_deref()
                            .is_none_or(|name| name == stored.message.name)
                })
                .map(|(id, _)| id.clone())
                .collect(),
        };
        for id in &targets {
            let stored = state.messages.get_mut(id).expect("target exists");
            stored.message.attempts = 0;
            stored.message.available_at = now;
            stored.message.updated_at = now;
            let key = stored.key(id);
            state.queue.insert(key);
            state.set_status(id, MessageStatus::Pending);
        }
        drop(state);
        if !targets.is_empty() {
            self.wake.wake();
        }
        Ok(targets.len() as u64)
    }

    fn purge_now(&self, params: PurgeMessages) -> Result<u64> {
        check::purge(&params)?;
        let mut state = self.lock();
        let doomed: Vec<(Arc<str>, DateTime<Utc>, MessageStatus)> = state
            .messages
            .iter()
            .filter(|(_, stored)| {
                let message = &stored.message;
                message.status.is_terminal()
                    && params.status.is_none_or(|status| status == message.status)
                    && message.updated_at < params.older_than
            })
            .map(|(id, stored)| (id.clone(), stored.message.created_at, stored.message.status))
            .collect();
        for (id, created_at, status) in &doomed {
            state.messages.remove(id);
            state.listing.remove(&(*created_at, id.clone()));
            state.counts[status_slot(*status)] -= 1;
        }
        Ok(doomed.len() as u64)
    }
}

impl OutboxStore for MemoryOutbox {
    async fn enqueue(&self, message: NewMessage) -> Result<String> {
        self.enqueue_now(message)
    }

    async fn claim_batch(&self, params: ClaimBatch) -> Result<ClaimedBatch> {
        self.claim_now(params)
    }

    async fn renew_claim(&self, params: RenewClaim) -> Result<DateTime<Utc>> {
        self.renew_now(params)
    }

    async fn mark_delivered(&self, params: MarkDelivered) -> Result<()> {
        self.deliver_now(params)
    }

    async fn mark_failed(&self, params: MarkFailed) -> Result<()> {
        self.fail_now(params)
    }

    async fn release_claim(&self, params: ReleaseClaim) -> Result<()> {
        self.release_now(params)
    }

    fn wakeups(&self) -> Option<Wakeups> {
        Some(self.wake.subscribe())
    }
}

impl OutboxAdmin for MemoryOutbox {
    async fn stats(&self, now: DateTime<Utc>) -> Result<OutboxStats> {
        Ok(self.stats_now(now))
    }

    async fn list_messages(&self, params: ListMessages) -> Result<MessagePage> {
        self.list_now(params)
    }

    async fn get_message(&self, id: &str) -> Result<OutboxMessage> {
        self.get_now(id)
    }

    async fn requeue_dead_letters(&self, params: RequeueDeadLetters) -> Result<u64> {
        self.requeue_now(params)
    }

    async fn purge(&self, params: PurgeMessages) -> Result<u64> {
        self.purge_now(params)
    }
}
