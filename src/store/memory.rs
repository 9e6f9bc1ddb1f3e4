//! An in-memory store: the full contract, for tests, demos and benchmarks.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use chrono::{DateTime, Utc};

use super::kit::{WakeupSender, check, lease_end};
use super::{
    BlockedKey, ClaimBatch, ClaimedBatch, ListMessages, MarkDelivered, MarkFailed, MessagePage,
    MinuteActivity, OutboxAdmin, OutboxStats, OutboxStore, PurgeBatch, PurgeMessages, ReleaseClaim,
    RenewClaim, RequeueDeadLetters, RetryNow, SkipDeadLetter, Wakeups, merge_activity,
};
use crate::error::{
    AbandonedClaimError, AdminError, ClaimError, ClaimLoss, Error, ErrorRecord, Result,
};
use crate::kind::MessageStatus;
use crate::message::{
    ClaimedMessage, Enqueued, NewMessage, OnDeadLetter, OutboxMessage, new_claim_token,
};

/// An outbox held in process memory. Cheap to clone; clones share the data.
///
/// Safe to share across threads. A claim reads only the messages it takes:
/// pending messages and claims sit in separate ordered indexes, and settled
/// messages in none, so a claim costs the same with a thousand or a million
/// messages stored, and with any number of live claims ahead of the due ones.
/// Of each ordering key only the first pending or claimed message is among
/// the pending a claim reads, so no backlog queued behind a key costs it.
#[derive(Clone, Default)]
pub struct MemoryOutbox {
    // A std mutex, not tokio's: no critical section awaits, each is a few
    // index operations, and a std lock is several times cheaper uncontended.
    state: Arc<Mutex<State>>,
    wake: WakeupSender,
}

impl std::fmt::Debug for MemoryOutbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.lock();
        f.debug_struct("MemoryOutbox")
            .field("messages", &state.ids.len())
            .field("pending", &state.pending.len())
            .field("claimed", &(state.leases.len() + state.expired.len()))
            .finish()
    }
}

/// The data behind the lock.
///
/// Invariant: every stored message is in exactly the index its `place`
/// names, under the key made from its current fields. All changes to a
/// stored message go through [`State::update`], which keeps it so.
#[derive(Default)]
struct State {
    /// Messages by slot. Slots are handed out in enqueue order, so messages
    /// claimed together sit together in memory; a purge frees slots for reuse.
    slots: Vec<Option<Stored>>,
    free: Vec<usize>,
    ids: HashMap<Arc<str>, usize>,
    /// Pending messages a claim may take: every keyless one and each
    /// ordering key's front (see [`KeyState::front`]), in claim order.
    pending: BTreeSet<DueKey>,
    /// The other pending messages of ordering keys, which wait for an
    /// earlier message of their key, in claim order: kept out of `pending`
    /// so a claim never walks them.
    queued: BTreeSet<DueKey>,
    /// Claims, by lease end, until a claim finds them expired.
    leases: BTreeSet<LeaseKey>,
    /// Claims a claim found expired, in claim order. Kept apart from
    /// `leases` so a claim never walks past live claims to reach them.
    expired: BTreeSet<DueKey>,
    /// Every message by `(created_at, id)`, for stable listing.
    listing: BTreeMap<(DateTime<Utc>, Arc<str>), usize>,
    next_seq: u64,
    counts: [u64; 4],
    /// Keyed messages that still hold their ordering key, per key.
    keys: HashMap<Arc<str>, KeyState>,
    /// Idempotency keys: the message holding each, and when its window ends.
    idempotency: HashMap<String, (Arc<str>, DateTime<Utc>)>,
}

/// The messages of one ordering key that are not delivered (nor skipped).
#[derive(Default)]
struct KeyState {
    /// By enqueue order.
    unsettled: BTreeMap<u64, usize>,
    /// Enqueue order of the claimed ones.
    claimed: BTreeSet<u64>,
    /// The slot of the key's front, its first pending or claimed message,
    /// while that one is pending: the one message of the key in `pending`.
    front: Option<usize>,
}

/// Whether a message with this status and skip mark holds its key.
fn holds_key(message: &OutboxMessage) -> bool {
    message.status != MessageStatus::Delivered && message.skipped_at.is_none()
}

/// `true` when the message in `slot` is the head of its ordering key (or has
/// none): no earlier message of the key is pending or claimed (or, while
/// `block`, a dead letter not skipped), and no later one is claimed under a
/// lease still running at `now` (see the SQL stores' head test for why an
/// expired one does not count).
fn is_head(
    slots: &[Option<Stored>],
    keys: &HashMap<Arc<str>, KeyState>,
    slot: usize,
    block: bool,
    now: DateTime<Utc>,
) -> bool {
    let stored = slots[slot]
        .as_ref()
        .expect("a candidate slot holds a message");
    let Some(key) = stored.message.ordering_key.as_deref() else {
        return true;
    };
    let Some(state) = keys.get(key) else {
        return true;
    };
    let leased = |seq: &u64| {
        state.unsettled.get(seq).is_some_and(|&later| {
            slots[later]
                .as_ref()
                .and_then(|later| later.message.locked_until)
                .is_some_and(|until| until > now)
        })
    };
    if state.claimed.range(stored.seq + 1..).any(leased) {
        return false;
    }
    for &earlier in state.unsettled.range(..stored.seq).map(|(_, slot)| slot) {
        let message = &slots[earlier]
            .as_ref()
            .expect("a keyed slot holds a message")
            .message;
        match message.status {
            MessageStatus::Pending | MessageStatus::Claimed => return false,
            MessageStatus::DeadLettered if block => return false,
            MessageStatus::DeadLettered | MessageStatus::Delivered => {}
        }
    }
    true
}

struct Stored {
    message: OutboxMessage,
    /// Enqueue order: the tie-break after `created_at`.
    seq: u64,
    place: Place,
    /// The idempotency key given at enqueue, to free it when the message
    /// goes.
    idempotency_key: Option<String>,
}

/// Which index holds a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Pending,
    Queued,
    Leased,
    Expired,
    Settled,
}

/// Claim order: `available_at`, then `created_at`, then enqueue order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct DueKey {
    available_at: DateTime<Utc>,
    created_at: DateTime<Utc>,
    seq: u64,
    slot: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct LeaseKey {
    locked_until: DateTime<Utc>,
    seq: u64,
    slot: usize,
}

impl Stored {
    fn due_key(&self, slot: usize) -> DueKey {
        DueKey {
            available_at: self.message.available_at,
            created_at: self.message.created_at,
            seq: self.seq,
            slot,
        }
    }

    fn lease_key(&self, slot: usize) -> LeaseKey {
        LeaseKey {
            locked_until: self.message.locked_until.expect("a claim has a lease"),
            seq: self.seq,
            slot,
        }
    }
}

fn status_index(status: MessageStatus) -> usize {
    status as usize
}

fn clear_claim(message: &mut OutboxMessage) {
    message.claim_token = None;
    message.claimed_at = None;
    message.locked_until = None;
}

impl State {
    fn stored(&self, slot: usize) -> &Stored {
        self.slots[slot]
            .as_ref()
            .expect("an indexed slot holds a message")
    }

    /// Change one message and move it to the index its new fields call for.
    fn update<R>(&mut self, slot: usize, change: impl FnOnce(&mut OutboxMessage) -> R) -> R {
        let stored = self.slots[slot]
            .as_mut()
            .expect("an indexed slot holds a message");
        // Out of its index first, while its key still matches its fields.
        match stored.place {
            Place::Pending => self.pending.remove(&stored.due_key(slot)),
            Place::Queued => self.queued.remove(&stored.due_key(slot)),
            Place::Leased => self.leases.remove(&stored.lease_key(slot)),
            Place::Expired => self.expired.remove(&stored.due_key(slot)),
            Place::Settled => true,
        };
        let before = stored.message.status;
        let held_before = holds_key(&stored.message);
        let result = change(&mut stored.message);
        let after = stored.message.status;
        let key = stored.message.ordering_key.clone();
        if let Some(key) = key.as_deref() {
            let seq = stored.seq;
            let held_after = holds_key(&stored.message);
            let state = self.keys.entry(Arc::from(key)).or_default();
            // Out of `pending` above, so no longer the front there.
            if state.front == Some(slot) {
                state.front = None;
            }
            if before == MessageStatus::Claimed {
                state.claimed.remove(&seq);
            }
            if after == MessageStatus::Claimed {
                state.claimed.insert(seq);
            }
            match (held_before, held_after) {
                (true, false) => {
                    state.unsettled.remove(&seq);
                }
                (false, true) => {
                    state.unsettled.insert(seq, slot);
                }
                _ => {}
            }
            if state.unsettled.is_empty() && state.claimed.is_empty() {
                self.keys.remove(key);
            }
        }
        stored.place = match after {
            // A keyed message waits in `queued` until `refront` finds it at
            // its key's front.
            MessageStatus::Pending if key.is_some() => {
                self.queued.insert(stored.due_key(slot));
                Place::Queued
            }
            MessageStatus::Pending => {
                self.pending.insert(stored.due_key(slot));
                Place::Pending
            }
            MessageStatus::Claimed => {
                self.leases.insert(stored.lease_key(slot));
                Place::Leased
            }
            MessageStatus::Delivered | MessageStatus::DeadLettered => Place::Settled,
        };
        self.counts[status_index(before)] -= 1;
        self.counts[status_index(after)] += 1;
        if let Some(key) = key {
            self.refront(&key);
        }
        result
    }

    /// Delete the settled message in `slot`: out of every lookup, its
    /// ordering key and its idempotency key (when it still holds it).
    fn remove(&mut self, slot: usize) {
        let stored = self.slots[slot]
            .take()
            .expect("a removed slot holds a message");
        // Settled messages are in no claim index; only the lookups go.
        debug_assert_eq!(stored.place, Place::Settled);
        let message = stored.message;
        let id = self
            .ids
            .remove_entry(message.id.as_str())
            .map(|(id, _)| id)
            .expect("a stored message has an id entry");
        self.listing.remove(&(message.created_at, id.clone()));
        self.counts[status_index(message.status)] -= 1;
        if let Some(key) = message.ordering_key.as_deref()
            && let Some(keyed) = self.keys.get_mut(key)
        {
            keyed.unsettled.remove(&stored.seq);
            if keyed.unsettled.is_empty() && keyed.claimed.is_empty() {
                self.keys.remove(key);
            }
        }
        if let Some(key) = stored.idempotency_key
            && self
                .idempotency
                .get(&key)
                .is_some_and(|(holder, _)| *holder == id)
        {
            self.idempotency.remove(&key);
        }
        self.free.push(slot);
    }

    /// Put `key`'s front (its first pending or claimed message) in
    /// `pending` if it is pending, and the key's message that was there
    /// before back in `queued`. Only a change to one of the key's messages
    /// moves its front, so this runs after each; it reads the key's dead
    /// letters before the front and no message after it.
    fn refront(&mut self, key: &str) {
        let Some(state) = self.keys.get_mut(key) else {
            return;
        };
        let status = |slot: usize| {
            self.slots[slot]
                .as_ref()
                .expect("a keyed slot holds a message")
                .message
                .status
        };
        let front = state
            .unsettled
            .values()
            .copied()
            .find(|&slot| {
                matches!(
                    status(slot),
                    MessageStatus::Pending | MessageStatus::Claimed
                )
            })
            .filter(|&slot| status(slot) == MessageStatus::Pending);
        if front == state.front {
            return;
        }
        let before = std::mem::replace(&mut state.front, front);
        if let Some(slot) = before {
            self.move_pending(slot, Place::Queued);
        }
        if let Some(slot) = front {
            self.move_pending(slot, Place::Pending);
        }
    }

    /// Move the pending message in `slot` to `pending` or `queued`.
    fn move_pending(&mut self, slot: usize, to: Place) {
        let stored = self.slots[slot]
            .as_mut()
            .expect("a keyed slot holds a message");
        let key = stored.due_key(slot);
        match std::mem::replace(&mut stored.place, to) {
            Place::Pending => self.pending.remove(&key),
            Place::Queued => self.queued.remove(&key),
            other => unreachable!("only pending messages move between the two, not {other:?}"),
        };
        match to {
            Place::Pending => self.pending.insert(key),
            Place::Queued => self.queued.insert(key),
            other => unreachable!("only pending messages move between the two, not {other:?}"),
        };
    }

    /// The slot of `id` if `claim_token` owns it with a live lease at `now`.
    fn fenced(&self, id: &str, claim_token: &str, now: DateTime<Utc>) -> Result<usize> {
        let slot = *self
            .ids
            .get(id)
            .ok_or_else(|| ClaimError::new(id, ClaimLoss::Missing))?;
        let message = &self.stored(slot).message;
        if message.status != MessageStatus::Claimed {
            return Err(ClaimError::new(id, ClaimLoss::NotClaimed).into());
        }
        if message.claim_token.as_deref() != Some(claim_token) {
            return Err(ClaimError::new(id, ClaimLoss::TokenMismatch).into());
        }
        if message.locked_until.is_none_or(|until| until <= now) {
            return Err(ClaimError::new(id, ClaimLoss::LeaseExpired).into());
        }
        Ok(slot)
    }

    /// Up to `limit` claimable slots at `now`, in claim order, at most the
    /// head of each ordering key.
    fn select(&mut self, limit: usize, now: DateTime<Utc>, block: bool) -> Vec<usize> {
        // Leases that ran out by `now` join the claimable, in claim order.
        // Each claim moves once, so this costs nothing when none expired.
        while let Some(lease) = self.leases.first().copied() {
            if lease.locked_until > now {
                break;
            }
            self.leases.pop_first();
            let stored = self.slots[lease.slot]
                .as_mut()
                .expect("a leased slot holds a message");
            stored.place = Place::Expired;
            self.expired.insert(stored.due_key(lease.slot));
        }

        let slots = &self.slots;
        let keys = &self.keys;
        let mut pending = self
            .pending
            .iter()
            .take_while(|key| key.available_at <= now)
            .filter(|key| is_head(slots, keys, key.slot, block, now))
            .peekable();
        // A claim found expired stays claimable; this only matters when
        // callers' clocks disagree and `now` is earlier than that claim's.
        let mut expired = self
            .expired
            .iter()
            .filter(|key| {
                let message = &slots[key.slot]
                    .as_ref()
                    .expect("an expired slot holds a message");
                message.message.is_claimable(now) && is_head(slots, keys, key.slot, block, now)
            })
            .peekable();
        let mut selected = Vec::with_capacity(limit.min(1024));
        while selected.len() < limit {
            let next = match (pending.peek(), expired.peek()) {
                (Some(p), Some(e)) if p <= e => pending.next(),
                (_, Some(_)) => expired.next(),
                (Some(_), None) => pending.next(),
                (None, None) => break,
            };
            selected.extend(next.map(|key| key.slot));
        }
        selected
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
        let id: Arc<str> = Arc::from(message.resolve_id());
        let now = message.now;
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
            },
            seq: 0,
            place: Place::Pending,
            idempotency_key: message.idempotency.as_ref().map(|i| i.key.clone()),
        };
        let mut state = self.lock();
        if let Some(idempotency) = &message.idempotency
            && let Some((holder, until)) = state.idempotency.get(&idempotency.key)
            && *until > now
        {
            return Ok(Enqueued::AlreadyExists(holder.to_string()));
        }
        if state.ids.contains_key(&id) {
            return Ok(Enqueued::AlreadyExists(id.to_string()));
        }
        if let Some(idempotency) = message.idempotency {
            let until = crate::store::kit::window_end(now, idempotency.window);
            state
                .idempotency
                .insert(idempotency.key, (id.clone(), until));
        }
        let seq = state.next_seq;
        state.next_seq += 1;
        let stored = Stored { seq, ..stored };
        let slot = match state.free.pop() {
            Some(slot) => slot,
            None => {
                state.slots.push(None);
                state.slots.len() - 1
            }
        };
        let key = stored.message.ordering_key.clone();
        let stored = match key {
            // Queued until `refront` finds it at its key's front.
            Some(ref key) => {
                let keyed = state.keys.entry(Arc::from(key.as_str())).or_default();
                keyed.unsettled.insert(seq, slot);
                state.queued.insert(stored.due_key(slot));
                Stored {
                    place: Place::Queued,
                    ..stored
                }
            }
            None => {
                state.pending.insert(stored.due_key(slot));
                stored
            }
        };
        state.slots[slot] = Some(stored);
        if let Some(key) = key {
            state.refront(&key);
        }
        state.ids.insert(id.clone(), slot);
        state.listing.insert((now, id.clone()), slot);
        state.counts[status_index(MessageStatus::Pending)] += 1;
        drop(state);
        self.wake.wake();
        Ok(Enqueued::Inserted(id.to_string()))
    }

    fn claim_now(&self, params: ClaimBatch) -> Result<ClaimedBatch> {
        check::claim_batch(&params)?;
        let ClaimBatch {
            on_dead_letter,
            limit,
            now,
            lease,
            max_attempts: cap,
        } = params;
        let locked_until = lease_end(now, lease)?;
        let mut state = self.lock();
        let mut batch = ClaimedBatch::default();
        let block = on_dead_letter == OnDeadLetter::Block;
        for slot in state.select(limit, now, block) {
            let message = &state.stored(slot).message;
            let max_attempts = message.effective_max_attempts(cap);
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
                    claim_token,
                    claimed_at: now,
                    locked_until,
                }
            });
            batch.claimed.push(claimed);
        }
        Ok(batch)
    }

    fn renew_now(&self, params: RenewClaim) -> Result<DateTime<Utc>> {
        check::fence(&params.id, &params.claim_token)?;
        check::positive_lease(params.lease)?;
        let locked_until = lease_end(params.now, params.lease)?;
        let mut state = self.lock();
        let slot = state.fenced(&params.id, &params.claim_token, params.now)?;
        state.update(slot, |message| {
            message.locked_until = Some(locked_until);
            message.updated_at = params.now;
        });
        Ok(locked_until)
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

    fn fail_now(&self, params: MarkFailed) -> Result<()> {
        check::fence(&params.id, &params.claim_token)?;
        // Bounding a huge error is the slow part; do it before taking the lock.
        let error = params.error.bounded();
        let mut state = self.lock();
        let slot = state.fenced(&params.id, &params.claim_token, params.now)?;
        state.update(slot, |message| {
            if params.dead_letter {
                message.status = MessageStatus::DeadLettered;
            } else {
                message.status = MessageStatus::Pending;
                message.available_at = params.retry_at.unwrap_or(params.now);
            }
            message.last_error = Some(error);
            message.updated_at = params.now;
            clear_claim(message);
        });
        Ok(())
    }

    fn release_now(&self, params: ReleaseClaim) -> Result<()> {
        check::fence(&params.id, &params.claim_token)?;
        let mut state = self.lock();
        let slot = state.fenced(&params.id, &params.claim_token, params.now)?;
        state.update(slot, |message| {
            message.status = MessageStatus::Pending;
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
        // Both are ordered by `available_at`, so their first entries hold the
        // oldest.
        stats.oldest_due_at = [state.pending.first(), state.queued.first()]
            .into_iter()
            .flatten()
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
                Some(BlockedKey::new(
                    key.to_string(),
                    head.id.clone(),
                    head.name.clone(),
                    waiting as u64,
                ))
            })
            .collect();
        blocked.sort_by(|a, b| a.ordering_key.cmp(&b.ordering_key));
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

    async fn purge_batch(&self, params: PurgeBatch) -> Result<u64> {
        self.purge_batch_now(params)
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

    async fn blocked_keys(&self, limit: usize) -> Result<Vec<BlockedKey>> {
        self.blocked_now(limit)
    }
}

/// Whether a purge with `params` deletes `message`.
fn purgeable(message: &OutboxMessage, params: &PurgeMessages) -> bool {
    message.status.is_terminal()
        && params.status.is_none_or(|status| status == message.status)
        && message.updated_at < params.older_than
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kind::MessageKind;
    use crate::payload::Payload;
    use chrono::TimeZone;
    use std::time::Duration;

    fn at(secs: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap() + chrono::Duration::seconds(secs)
    }

    fn claim(store: &MemoryOutbox, limit: usize, now: i64) -> ClaimedBatch {
        let lease = Duration::from_secs(10);
        store
            .claim_now(ClaimBatch {
                on_dead_letter: Default::default(),
                limit,
                now: at(now),
                lease,
                max_attempts: crate::DEFAULT_MAX_ATTEMPTS,
            })
            .unwrap()
    }

    fn claimed(batch: &ClaimedBatch) -> Vec<&str> {
        batch.claimed.iter().map(|m| m.id.as_str()).collect()
    }

    fn dead(batch: &ClaimedBatch) -> Vec<&str> {
        batch.dead_lettered.iter().map(|m| m.id.as_str()).collect()
    }

    /// The indexes agree with the messages: each message is in the index
    /// its status calls for, under its current key, and nowhere else.
    fn assert_consistent(store: &MemoryOutbox) {
        let state = store.lock();
        let mut indexed = 0;
        for (slot, stored) in state.slots.iter().enumerate() {
            let Some(stored) = stored else { continue };
            indexed += 1;
            let in_pending = state.pending.contains(&stored.due_key(slot));
            let in_queued = state.queued.contains(&stored.due_key(slot));
            let in_expired = state.expired.contains(&stored.due_key(slot));
            let in_leases = stored.message.locked_until.is_some()
                && state.leases.contains(&stored.lease_key(slot));
            let expected = match stored.message.status {
                MessageStatus::Pending => {
                    // A keyed message is in `pending` exactly when it is its
                    // key's front.
                    let front = stored.message.ordering_key.as_deref().is_none_or(|key| {
                        state.keys[key].unsettled.values().find(|&&other| {
                            matches!(
                                state.stored(other).message.status,
                                MessageStatus::Pending | MessageStatus::Claimed
                            )
                        }) == Some(&slot)
                    });
                    (front, !front, false, false)
                }
                MessageStatus::Claimed => (
                    false,
                    false,
                    stored.place == Place::Expired,
                    stored.place == Place::Leased,
                ),
                _ => (false, false, false, false),
            };
            assert_eq!(
                (in_pending, in_queued, in_expired, in_leases),
                expected,
                "{:?}",
                stored.message.id
            );
        }
        assert_eq!(
            state.pending.len() + state.queued.len() + state.leases.len() + state.expired.len(),
            (state.counts[0] + state.counts[1]) as usize
        );
        assert_eq!(indexed, state.ids.len());
        assert_eq!(indexed, state.listing.len());
        assert_eq!(indexed as u64, state.counts.iter().sum::<u64>());
    }

    #[test]
    fn indexes_follow_every_transition() {
        let store = MemoryOutbox::new();
        for i in 0..6 {
            let new = NewMessage::new(MessageKind::Event, "e", Payload::from(serde_json::json!(i)))
                .with_id(format!("m{i}"))
                .with_max_attempts(2)
                .at(at(i));
            store.enqueue_now(new).unwrap();
        }
        assert_consistent(&store);
        let first = claim(&store, 4, 10);
        assert_eq!(claimed(&first), ["m0", "m1", "m2", "m3"]);
        assert_consistent(&store);
        let renew = |m: &ClaimedMessage| RenewClaim {
            id: m.id.clone(),
            claim_token: m.claim_token.clone(),
            now: at(15),
            lease: Duration::from_secs(60),
        };
        store.renew_now(renew(&first.claimed[0])).unwrap();
        store.renew_now(renew(&first.claimed[1])).unwrap();
        assert_consistent(&store);
        // m2 and m3 ran out at 20 s; this claim finds both expired, takes one.
        assert_eq!(claimed(&claim(&store, 1, 25)), ["m2"]);
        assert_consistent(&store);
        // A caller whose clock is behind still sees m3's claim as live.
        assert_eq!(claimed(&claim(&store, 10, 19)), ["m4", "m5"]);
        assert_consistent(&store);
        assert_eq!(claimed(&claim(&store, 10, 20)), ["m3"]);
        let last = claim(&store, 10, 100);
        assert_eq!(claimed(&last), ["m0", "m1", "m4", "m5"]);
        assert_eq!(dead(&last), ["m2", "m3"]);
        assert_consistent(&store);
        let purged = store
            .purge_now(PurgeMessages {
                status: None,
                older_than: at(101),
            })
            .unwrap();
        assert_eq!(purged, 2);
        assert_consistent(&store);
        let new = NewMessage::new(MessageKind::Event, "e", Payload::from(serde_json::json!(7)))
            .at(at(50));
        store.enqueue_now(new).unwrap();
        assert_eq!(store.lock().slots.len(), 6, "a purged slot is reused");
        assert_consistent(&store);
    }
}
