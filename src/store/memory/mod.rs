//! An in-memory store: the full contract, for tests, demos and benchmarks.
//!
//! `index.rs` is the index engine: the messages and the ordered indexes a
//! claim walks, kept in step with every change. This file is the store's
//! operations over it, each a few index operations under one lock.
//! `schedules.rs` keeps the periodic schedules beside them.

use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use chrono::{DateTime, Utc};

use super::kit::{WakeupSender, check, lease_end};
use super::{
    BlockedKey, CancelMessages, CancelReport, ClaimBatch, ClaimedBatch, Lease, ListMessages,
    MarkDelivered, MarkFailed, MessagePage, MinuteActivity, OutboxAdmin, OutboxStats, OutboxStore,
    PauseQueue, PurgeBatch, PurgeMessages, QueueState, ReleaseClaim, RenewClaim,
    RequeueDeadLetters, RetryNow, SkipDeadLetter, Wakeups, merge_activity,
};
use crate::error::{AbandonedClaimError, AdminError, Error, ErrorRecord, Result};
use crate::kind::MessageStatus;
use crate::message::{
    ClaimedMessage, Enqueued, NewMessage, OnDeadLetter, OutboxMessage, new_claim_token,
};
use crate::store::schedules::{ScheduleState, ScheduleStore};
use index::{Place, State, Stored, clear_claim, split_key_id, status_index};

mod cancel;
mod index;
mod schedules;

/// An outbox held in process memory. Cheap to clone; clones share the data.
///
/// Safe to share across threads. A claim reads only the messages it takes:
/// pending messages and claims sit in separate ordered indexes, and settled
/// messages in none, so a claim costs the same with a thousand or a million
/// messages stored, and with any number of live claims ahead of the due ones.
/// Of each ordering key only the first pending or claimed message is among
/// the pending a claim reads, so no backlog queued behind a key costs it.
/// Pending messages are kept by queue and priority, so a claim reads the
/// queues it serves and, in each, the due messages of each priority, and
/// no scheduled message, however many wait.
#[derive(Clone, Default)]
pub struct MemoryOutbox {
    // A std mutex, not tokio's: no critical section awaits, each is a few
    // index operations, and a std lock is several times cheaper uncontended.
    state: Arc<Mutex<State>>,
    wake: WakeupSender,
    /// The periodic schedules, by name. A lock of their own, always taken
    /// before `state`'s: a slot's enqueue holds it across the insert, so
    /// the check of `last_slot` and the message go together.
    schedules: Arc<Mutex<std::collections::BTreeMap<String, ScheduleState>>>,
}

impl std::fmt::Debug for MemoryOutbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.lock();
        f.debug_struct("MemoryOutbox")
            .field("messages", &state.ids.len())
            .field(
                "pending",
                &state.counts[status_index(MessageStatus::Pending)],
            )
            .field("claimed", &(state.leases.len() + state.expired.len()))
            .finish()
    }
}

impl MemoryOutbox {
    /// An empty outbox.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Critical sections panic only on a broken invariant, and then the
        // data is wrong with or without the lock; poisoning would only turn
        // one bug into a store that refuses every later call.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Number of stored messages.
    pub fn len(&self) -> usize {
        self.lock().ids.len()
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
            .values()
            .map(|&slot| state.stored(slot).message.clone())
            .collect()
    }

    fn enqueue_now(&self, message: NewMessage) -> Result<Enqueued> {
        message.validate()?;
        let enqueued = Self::insert(&mut self.lock(), message);
        if enqueued.is_inserted() {
            self.wake.wake();
        }
        Ok(enqueued)
    }

    /// The whole batch under one lock, so no claim sees part of it, and one
    /// wake-up for it.
    fn enqueue_batch_now(&self, messages: Vec<NewMessage>) -> Result<Vec<Enqueued>> {
        NewMessage::validate_batch(&messages)?;
        let answers: Vec<Enqueued> = {
            let mut state = self.lock();
            messages
                .into_iter()
                .map(|message| Self::insert(&mut state, message))
                .collect()
        };
        if answers.iter().any(Enqueued::is_inserted) {
            self.wake.wake();
        }
        Ok(answers)
    }

    /// Store a validated message unless its idempotency key is held by a
    /// message whose window is still open at its `now`, or its id is taken.
    fn insert(state: &mut State, message: NewMessage) -> Enqueued {
        let id: Arc<str> = Arc::from(message.resolve_id());
        let now = message.now;
        let queue: Arc<str> = Arc::from(message.queue.as_str());
        if let Some(idempotency) = &message.idempotency
            && let Some((holder, until)) = state.idempotency.get(&idempotency.key)
            && *until > now
        {
            return Enqueued::AlreadyExists(holder.to_string());
        }
        if state.ids.contains_key(&id) {
            return Enqueued::AlreadyExists(id.to_string());
        }
        let stored = Stored {
            message: OutboxMessage {
                id: id.to_string(),
                kind: message.kind,
                name: message.name,
                payload: message.payload,
                trace: message.trace,
                status: MessageStatus::Pending,
                attempts: 0,
                max_attempts: message.max_attempts.unwrap_or(crate::DEFAULT_MAX_ATTEMPTS),
                max_attempts_set: message.max_attempts.is_some(),
                available_at: message.available_at.unwrap_or(now),
                claim_token: None,
                claimed_at: None,
                locked_until: None,
                last_error: None,
                created_at: now,
                updated_at: now,
                delivered_at: None,
                ordering_key: message.ordering_key,
                skipped_at: None,
                queue: message.queue,
                priority: message.priority,
                cancel_requested_at: None,
            },
            queue,
            seq: 0,
            place: Place::Pending,
            idempotency_key: message.idempotency.as_ref().map(|i| i.key.clone()),
        };
        if let Some(idempotency) = message.idempotency {
            let until = crate::store::kit::window_end(now, idempotency.window);
            state
                .idempotency
                .insert(idempotency.key, (id.clone(), until));
        }
        state.insert(id.clone(), stored);
        Enqueued::Inserted(id.to_string())
    }

    fn claim_now(&self, params: ClaimBatch) -> Result<ClaimedBatch> {
        check::claim_batch(&params)?;
        let served = params.served()?;
        let ClaimBatch {
            on_dead_letter,
            limit,
            now,
            lease,
            ..
        } = params;
        let locked_until = lease_end(now, lease)?;
        let queues: Vec<(&str, usize)> = served
            .iter()
            .map(|queue| (queue.queue.as_str(), queue.limit))
            .collect();
        let cap_of = |queue: &str| {
            served
                .iter()
                .find(|served| served.queue == queue)
                .and_then(|served| served.max_attempts)
                .unwrap_or(params.max_attempts)
        };
        let mut state = self.lock();
        let mut batch = ClaimedBatch::default();
        let block = on_dead_letter == OnDeadLetter::Block;
        for slot in state.select(&queues, limit, now, block) {
            let message = &state.stored(slot).message;
            if message.cancel_requested_at.is_some() {
                // Its worker is gone with the cancellation asked for: it
                // ends here, never delivered.
                let cancelled = state.update(slot, |message| {
                    message.status = MessageStatus::Cancelled;
                    message.updated_at = now;
                    clear_claim(message);
                    message.clone()
                });
                batch.cancelled.push(cancelled);
                continue;
            }
            let max_attempts = message.effective_max_attempts(cap_of(&message.queue));
            if message.attempts >= max_attempts {
                let error = ErrorRecord::from_error(&AbandonedClaimError {
                    id: message.id.clone(),
                    attempts: message.attempts,
                    max_attempts,
                });
                let dead = state.update(slot, |message| {
                    message.status = MessageStatus::DeadLettered;
                    message.last_error = Some(error);
                    message.updated_at = now;
                    clear_claim(message);
                    message.clone()
                });
                batch.dead_lettered.push(dead);
                continue;
            }
            let claim_token = new_claim_token();
            let claimed = state.update(slot, |message| {
                message.status = MessageStatus::Claimed;
                message.attempts += 1;
                message.claim_token = Some(claim_token.clone());
                message.claimed_at = Some(now);
                message.locked_until = Some(locked_until);
                message.updated_at = now;
                ClaimedMessage {
                    id: message.id.clone(),
                    kind: message.kind,
                    name: message.name.clone(),
                    payload: message.payload.clone(),
                    trace: message.trace.clone(),
                    attempts: message.attempts,
                    max_attempts,
                    max_attempts_set: message.max_attempts_set,
                    available_at: message.available_at,
                    created_at: message.created_at,
                    ordering_key: message.ordering_key.clone(),
                    queue: message.queue.clone(),
                    priority: message.priority,
                    claim_token,
                    claimed_at: now,
                    locked_until,
                }
            });
            batch.claimed.push(claimed);
        }
        Ok(batch)
    }

    fn renew_now(&self, params: RenewClaim) -> Result<Lease> {
        check::fence(&params.id, &params.claim_token)?;
        check::positive_lease(params.lease)?;
        let locked_until = lease_end(params.now, params.lease)?;
        let mut state = self.lock();
        let slot = state.fenced(&params.id, &params.claim_token, params.now)?;
        let cancel_requested = state.update(slot, |message| {
            message.locked_until = Some(locked_until);
            message.updated_at = params.now;
            message.cancel_requested_at.is_some()
        });
        Ok(Lease::new(locked_until, cancel_requested))
    }

    fn deliver_now(&self, params: MarkDelivered) -> Result<()> {
        check::fence(&params.id, &params.claim_token)?;
        let mut state = self.lock();
        let slot = state.fenced(&params.id, &params.claim_token, params.now)?;
        state.update(slot, |message| {
            message.status = MessageStatus::Delivered;
            message.delivered_at = Some(params.now);
            message.updated_at = params.now;
            clear_claim(message);
        });
        if params.delete {
            state.remove(slot);
        }
        Ok(())
    }

    fn fail_now(&self, params: MarkFailed) -> Result<MessageStatus> {
        check::fence(&params.id, &params.claim_token)?;
        // Bounding a huge error is the slow part; do it before taking the lock.
        let error = params.error.bounded();
        let mut state = self.lock();
        let slot = state.fenced(&params.id, &params.claim_token, params.now)?;
        let status = state.update(slot, |message| {
            if message.cancel_requested_at.is_some() {
                message.status = MessageStatus::Cancelled;
            } else if params.dead_letter {
                message.status = MessageStatus::DeadLettered;
            } else {
                message.status = MessageStatus::Pending;
                message.available_at = params.retry_at.unwrap_or(params.now);
            }
            message.last_error = Some(error);
            message.updated_at = params.now;
            clear_claim(message);
            message.status
        });
        Ok(status)
    }

    fn release_now(&self, params: ReleaseClaim) -> Result<()> {
        check::fence(&params.id, &params.claim_token)?;
        let mut state = self.lock();
        let slot = state.fenced(&params.id, &params.claim_token, params.now)?;
        state.update(slot, |message| {
            // A claim given back after its cancellation was asked for is
            // not run again.
            message.status = if message.cancel_requested_at.is_some() {
                MessageStatus::Cancelled
            } else {
                MessageStatus::Pending
            };
            message.available_at = params.now;
            message.attempts = message.attempts.saturating_sub(1);
            message.updated_at = params.now;
            clear_claim(message);
        });
        Ok(())
    }

    fn stats_now(&self, now: DateTime<Utc>) -> OutboxStats {
        let state = self.lock();
        let count = |status| state.counts[status_index(status)];
        let mut stats = OutboxStats {
            pending: count(MessageStatus::Pending),
            claimed: count(MessageStatus::Claimed),
            delivered: count(MessageStatus::Delivered),
            dead_lettered: count(MessageStatus::DeadLettered),
            cancelled: count(MessageStatus::Cancelled),
            ..OutboxStats::default()
        };
        stats.blocked_keys = state
            .keys
            .values()
            .filter(|key| {
                key.unsettled
                    .values()
                    .any(|&slot| state.stored(slot).message.status == MessageStatus::DeadLettered)
            })
            .count() as u64;
        let claims = state.leases.iter().map(|key| key.slot);
        for slot in claims.chain(state.expired.iter().map(|key| key.slot)) {
            if state.stored(slot).message.has_live_claim(now) {
                stats.live_claims += 1;
            } else {
                stats.expired_claims += 1;
            }
        }
        // Each level and `queued` are ordered by `available_at`, so their
        // first entries hold the oldest.
        stats.oldest_due_at = state
            .pending
            .values()
            .flat_map(|levels| levels.values())
            .chain([&state.queued])
            .filter_map(|due| due.first())
            .map(|key| key.available_at)
            .min()
            .filter(|available_at| *available_at <= now);
        stats
    }

    fn list_now(&self, params: ListMessages) -> Result<MessagePage> {
        check::list(&params)?;
        let state = self.lock();
        let start = match &params.after {
            Some(cursor) => Bound::Excluded((cursor.created_at, Arc::from(cursor.id.as_str()))),
            None => Bound::Unbounded,
        };
        let mut messages = Vec::new();
        for &slot in state
            .listing
            .range((start, Bound::Unbounded))
            .map(|(_, slot)| slot)
        {
            let message = &state.stored(slot).message;
            if params.status.is_some_and(|status| status != message.status)
                || params
                    .name
                    .as_deref()
                    .is_some_and(|name| name != message.name)
            {
                continue;
            }
            messages.push(message.clone());
            if messages.len() > params.limit {
                break;
            }
        }
        Ok(MessagePage::of(messages, params.limit))
    }

    fn get_now(&self, id: &str) -> Result<OutboxMessage> {
        let state = self.lock();
        state
            .ids
            .get(id)
            .map(|&slot| state.stored(slot).message.clone())
            .ok_or_else(|| Error::NotFound { id: id.to_owned() })
    }

    fn requeue_now(&self, params: RequeueDeadLetters) -> Result<u64> {
        check::requeue(&params)?;
        let now = params.now;
        let mut state = self.lock();
        let targets: Vec<usize> = match &params.id {
            Some(id) => {
                let slot = *state
                    .ids
                    .get(id.as_str())
                    .ok_or_else(|| Error::NotFound { id: id.clone() })?;
                let message = &state.stored(slot).message;
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
                vec![slot]
            }
            None => state
                .slots
                .iter()
                .enumerate()
                .filter_map(|(slot, stored)| Some((slot, &stored.as_ref()?.message)))
                .filter(|(_, message)| {
                    message.status == MessageStatus::DeadLettered
                        && params
                            .name
                            .as_deref()
                            .is_none_or(|name| name == message.name)
                })
                .map(|(slot, _)| slot)
                .collect(),
        };
        for &slot in &targets {
            state.update(slot, |message| {
                message.status = MessageStatus::Pending;
                message.attempts = 0;
                message.available_at = now;
                message.updated_at = now;
                message.skipped_at = None;
            });
        }
        drop(state);
        if !targets.is_empty() {
            self.wake.wake();
        }
        Ok(targets.len() as u64)
    }

    fn skip_now(&self, params: SkipDeadLetter) -> Result<()> {
        check::skip(&params.id)?;
        let mut state = self.lock();
        let slot = *state
            .ids
            .get(params.id.as_str())
            .ok_or_else(|| Error::NotFound {
                id: params.id.clone(),
            })?;
        let message = &state.stored(slot).message;
        if message.has_live_claim(params.now) {
            return Err(AdminError::ClaimLive {
                id: params.id,
                locked_until: message.locked_until.expect("a live claim has a lease"),
            }
            .into());
        }
        if message.status != MessageStatus::DeadLettered {
            return Err(AdminError::NotDeadLettered {
                id: params.id,
                status: message.status,
            }
            .into());
        }
        state.update(slot, |message| {
            message.skipped_at = Some(params.now);
            message.updated_at = params.now;
        });
        drop(state);
        self.wake.wake();
        Ok(())
    }

    fn blocked_now(&self, limit: usize) -> Result<Vec<BlockedKey>> {
        check::blocked_keys(limit)?;
        let state = self.lock();
        let mut blocked: Vec<BlockedKey> = state
            .keys
            .iter()
            .filter_map(|(key, keyed)| {
                let (&head_seq, &head) = keyed.unsettled.iter().find(|&(_, &slot)| {
                    state.stored(slot).message.status == MessageStatus::DeadLettered
                })?;
                let head = &state.stored(head).message;
                let waiting = keyed
                    .unsettled
                    .range(head_seq + 1..)
                    .filter(|&(_, &slot)| {
                        matches!(
                            state.stored(slot).message.status,
                            MessageStatus::Pending | MessageStatus::Claimed
                        )
                    })
                    .count();
                let (queue, key) = split_key_id(key);
                Some(
                    BlockedKey::new(
                        key.to_owned(),
                        head.id.clone(),
                        head.name.clone(),
                        waiting as u64,
                    )
                    .in_queue(queue.to_owned()),
                )
            })
            .collect();
        blocked.sort_by(|a, b| (&a.ordering_key, &a.queue).cmp(&(&b.ordering_key, &b.queue)));
        blocked.truncate(limit);
        Ok(blocked)
    }

    fn purge_now(&self, params: PurgeMessages) -> Result<u64> {
        check::purge(&params)?;
        Ok(self.purge_where(params.status, params.older_than, usize::MAX))
    }

    fn purge_batch_now(&self, params: PurgeBatch) -> Result<u64> {
        check::purge_batch(&params)?;
        Ok(self.purge_where(Some(params.status), params.older_than, params.limit))
    }

    /// Delete up to `limit` terminal messages (of `status`) last changed
    /// before `older_than`, oldest first.
    fn purge_where(
        &self,
        status: Option<MessageStatus>,
        older_than: DateTime<Utc>,
        limit: usize,
    ) -> u64 {
        let mut state = self.lock();
        let mut doomed: Vec<(DateTime<Utc>, usize)> = state
            .slots
            .iter()
            .enumerate()
            .filter_map(|(slot, stored)| Some((slot, &stored.as_ref()?.message)))
            .filter(|(_, message)| {
                message.status.is_terminal()
                    && status.is_none_or(|status| status == message.status)
                    && message.updated_at < older_than
            })
            .map(|(slot, message)| (message.updated_at, slot))
            .collect();
        doomed.sort_unstable();
        doomed.truncate(limit);
        let doomed: Vec<usize> = doomed.into_iter().map(|(_, slot)| slot).collect();
        for &slot in &doomed {
            state.remove(slot);
        }
        doomed.len() as u64
    }
}

impl OutboxStore for MemoryOutbox {
    async fn enqueue(&self, message: NewMessage) -> Result<Enqueued> {
        self.enqueue_now(message)
    }

    async fn enqueue_batch(&self, messages: Vec<NewMessage>) -> Result<Vec<Enqueued>> {
        self.enqueue_batch_now(messages)
    }

    async fn claim_batch(&self, params: ClaimBatch) -> Result<ClaimedBatch> {
        self.claim_now(params)
    }

    async fn renew_claim(&self, params: RenewClaim) -> Result<DateTime<Utc>> {
        Ok(self.renew_now(params)?.locked_until)
    }

    async fn renew_lease(&self, params: RenewClaim) -> Result<Lease> {
        self.renew_now(params)
    }

    async fn mark_delivered(&self, params: MarkDelivered) -> Result<()> {
        self.deliver_now(params)
    }

    async fn mark_failed(&self, params: MarkFailed) -> Result<()> {
        self.fail_now(params).map(drop)
    }

    async fn settle_failure(&self, params: MarkFailed) -> Result<MessageStatus> {
        self.fail_now(params)
    }

    async fn release_claim(&self, params: ReleaseClaim) -> Result<()> {
        self.release_now(params)
    }

    fn wakeups(&self) -> Option<Wakeups> {
        Some(self.wake.subscribe())
    }

    async fn purge_batch(&self, params: PurgeBatch) -> Result<u64> {
        self.purge_batch_now(params)
    }

    /// No: a claim takes microseconds of the CPU the handlers share.
    fn claims_ahead(&self) -> bool {
        false
    }

    fn schedules(&self) -> Option<&dyn ScheduleStore> {
        Some(self)
    }

    async fn pending_count(&self) -> Result<Option<u64>> {
        Ok(Some(
            self.lock().counts[status_index(MessageStatus::Pending)],
        ))
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

    async fn count_purgeable(&self, params: PurgeMessages) -> Result<u64> {
        check::purge(&params)?;
        let state = self.lock();
        Ok(state
            .slots
            .iter()
            .filter_map(|stored| Some(&stored.as_ref()?.message))
            .filter(|message| purgeable(message, &params))
            .count() as u64)
    }

    async fn activity(&self, since: DateTime<Utc>) -> Result<Vec<MinuteActivity>> {
        let state = self.lock();
        let rows = state
            .slots
            .iter()
            .filter_map(|stored| Some(&stored.as_ref()?.message))
            .filter(|message| message.status.is_terminal() && message.updated_at >= since)
            .map(|message| {
                let secs = message.updated_at.timestamp();
                let minute = DateTime::from_timestamp(secs - secs.rem_euclid(60), 0)
                    .expect("a whole minute of a stored time is in range");
                (minute, message.status, 1)
            })
            .collect::<Vec<_>>();
        Ok(merge_activity(rows))
    }

    async fn retry_now(&self, params: RetryNow) -> Result<()> {
        let (id, now) = (params.id.as_str(), params.now);
        let mut state = self.lock();
        let slot = *state
            .ids
            .get(id)
            .ok_or_else(|| Error::NotFound { id: id.to_owned() })?;
        let message = &state.stored(slot).message;
        if message.has_live_claim(now) {
            return Err(AdminError::ClaimLive {
                id: id.to_owned(),
                locked_until: message.locked_until.expect("a live claim has a lease"),
            }
            .into());
        }
        if message.status != MessageStatus::Pending {
            return Err(AdminError::NotPending {
                id: id.to_owned(),
                status: message.status,
            }
            .into());
        }
        state.update(slot, |message| {
            message.available_at = message.available_at.min(now);
            message.updated_at = now;
        });
        drop(state);
        self.wake.wake();
        Ok(())
    }

    async fn skip_dead_letter(&self, params: SkipDeadLetter) -> Result<()> {
        self.skip_now(params)
    }

    async fn list_schedules(&self) -> Result<Vec<ScheduleState>> {
        Ok(self.schedules_now())
    }

    async fn blocked_keys(&self, limit: usize) -> Result<Vec<BlockedKey>> {
        self.blocked_now(limit)
    }

    async fn pause_queue(&self, params: PauseQueue) -> Result<bool> {
        check::queue(&params.queue)?;
        let mut state = self.lock();
        if state.paused.contains_key(&params.queue) {
            return Ok(false);
        }
        state.paused.insert(params.queue, params.now);
        Ok(true)
    }

    async fn resume_queue(&self, queue: &str) -> Result<bool> {
        check::queue(queue)?;
        let resumed = self.lock().paused.remove(queue).is_some();
        if resumed {
            self.wake.wake();
        }
        Ok(resumed)
    }

    async fn queues(&self) -> Result<Vec<QueueState>> {
        let state = self.lock();
        let mut queues: std::collections::BTreeMap<&str, QueueState> = state
            .queue_counts
            .iter()
            .map(|(queue, &[pending, claimed])| {
                let paused_at = state.paused.get(&**queue).copied();
                let row = QueueState::new(queue.to_string(), pending, claimed, paused_at);
                (&**queue, row)
            })
            .collect();
        for (queue, &paused_at) in &state.paused {
            queues
                .entry(queue.as_str())
                .or_insert_with(|| QueueState::new(queue.clone(), 0, 0, Some(paused_at)));
        }
        Ok(queues.into_values().collect())
    }

    async fn cancel_messages(&self, params: CancelMessages) -> Result<CancelReport> {
        self.cancel_now(params)
    }
}

/// Whether a purge with `params` deletes `message`.
fn purgeable(message: &OutboxMessage, params: &PurgeMessages) -> bool {
    message.status.is_terminal()
        && params.status.is_none_or(|status| status == message.status)
        && message.updated_at < params.older_than
}

#[cfg(test)]
mod tests;
