//! The memory store's index engine: messages in slots, and the ordered
//! indexes a claim walks (pending by queue and priority, queued behind
//! their ordering key, leased, expired), kept in step with every change to
//! a message.
//!
//! The operations in `mod.rs` read the indexes directly but change a stored
//! message only through [`State::update`], [`State::insert`] and
//! [`State::remove`], which keep the invariant on [`State`].

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use foldhash::HashMap;

use crate::error::{ClaimError, ClaimLoss, Result};
use crate::kind::MessageStatus;
use crate::message::OutboxMessage;

/// The data behind the lock.
///
/// Invariant: every stored message is in exactly the index its `place`
/// names, under the key made from its current fields. All changes to a
/// stored message go through [`State::update`], which keeps it so.
#[derive(Default)]
pub(super) struct State {
    /// Messages by slot. Slots are handed out in enqueue order, so messages
    /// claimed together sit together in memory; a purge frees slots for reuse.
    pub(super) slots: Vec<Option<Stored>>,
    free: Vec<usize>,
    pub(super) ids: HashMap<Arc<str>, usize>,
    /// Pending messages a claim may take: every keyless one and each
    /// ordering key's front (see [`KeyState::front`]), by queue, then by
    /// priority (highest first), each level in claim order. A level holds
    /// due and scheduled messages alike, oldest first, so a claim reads
    /// the due prefix of each level of a queue and no scheduled message.
    pub(super) pending: HashMap<Arc<str>, BTreeMap<Reverse<i16>, BTreeSet<DueKey>>>,
    /// The other pending messages of ordering keys, which wait for an
    /// earlier message of their key, in claim order: kept out of `pending`
    /// so a claim never walks them.
    pub(super) queued: BTreeSet<DueKey>,
    /// Claims, by lease end, until a claim finds them expired.
    pub(super) leases: BTreeSet<LeaseKey>,
    /// Claims a claim found expired, in claim order. Kept apart from
    /// `leases` so a claim never walks past live claims to reach them.
    pub(super) expired: BTreeSet<DueKey>,
    /// Every message by `(created_at, id)`, for stable listing.
    pub(super) listing: BTreeMap<(DateTime<Utc>, Arc<str>), usize>,
    next_seq: u64,
    pub(super) counts: [u64; 5],
    /// Pending and claimed messages per queue, for the queues' listing.
    pub(super) queue_counts: HashMap<Arc<str>, [u64; 2]>,
    /// Paused queues, and when each was paused.
    pub(super) paused: BTreeMap<String, DateTime<Utc>>,
    /// Keyed messages that still hold their ordering key, per key and
    /// queue (see [`key_id`]).
    pub(super) keys: HashMap<Arc<str>, KeyState>,
    /// Idempotency keys: the message holding each, and when its window ends.
    pub(super) idempotency: HashMap<String, (Arc<str>, DateTime<Utc>)>,
}

/// The messages of one ordering key that are not delivered (nor skipped).
#[derive(Default)]
pub(super) struct KeyState {
    /// By enqueue order.
    pub(super) unsettled: BTreeMap<u64, usize>,
    /// Enqueue order of the claimed ones.
    pub(super) claimed: BTreeSet<u64>,
    /// The slot of the key's front, its first pending or claimed message,
    /// while that one is pending: the one message of the key in `pending`.
    front: Option<usize>,
}

/// Whether a message with this status and skip mark holds its key.
fn holds_key(message: &OutboxMessage) -> bool {
    !matches!(
        message.status,
        MessageStatus::Delivered | MessageStatus::Cancelled
    ) && message.skipped_at.is_none()
}

/// The name `keys` knows an ordering key by: its queue and the key, apart
/// by a NUL, which neither may hold. A key's order holds within its queue.
pub(super) fn key_id(queue: &str, key: &str) -> String {
    format!("{queue}\0{key}")
}

/// The queue and ordering key a [`key_id`] names.
pub(super) fn split_key_id(id: &str) -> (&str, &str) {
    id.split_once('\0').expect("a key id holds its queue")
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
    let Some(state) = keys.get(key_id(&stored.queue, key).as_str()) else {
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
            MessageStatus::DeadLettered | MessageStatus::Delivered | MessageStatus::Cancelled => {}
        }
    }
    true
}

pub(super) struct Stored {
    pub(super) message: OutboxMessage,
    /// The message's queue, shared with the indexes that name it.
    pub(super) queue: Arc<str>,
    /// Enqueue order: the tie-break after `created_at`.
    pub(super) seq: u64,
    pub(super) place: Place,
    /// The idempotency key given at enqueue, to free it when the message
    /// goes.
    pub(super) idempotency_key: Option<String>,
}

/// Which index holds a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Place {
    Pending,
    Queued,
    Leased,
    Expired,
    Settled,
}

/// Claim order: `available_at`, then `created_at`, then enqueue order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct DueKey {
    pub(super) available_at: DateTime<Utc>,
    pub(super) created_at: DateTime<Utc>,
    pub(super) seq: u64,
    pub(super) slot: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct LeaseKey {
    pub(super) locked_until: DateTime<Utc>,
    pub(super) seq: u64,
    pub(super) slot: usize,
}

impl Stored {
    /// The level of `pending` that holds this message while it is there.
    fn level(&self) -> Reverse<i16> {
        Reverse(self.message.priority)
    }

    /// The ordering key's name in `keys`, when it has one.
    fn key_id(&self) -> Option<String> {
        self.message
            .ordering_key
            .as_deref()
            .map(|key| key_id(&self.queue, key))
    }

    pub(super) fn due_key(&self, slot: usize) -> DueKey {
        DueKey {
            available_at: self.message.available_at,
            created_at: self.message.created_at,
            seq: self.seq,
            slot,
        }
    }

    pub(super) fn lease_key(&self, slot: usize) -> LeaseKey {
        LeaseKey {
            locked_until: self.message.locked_until.expect("a claim has a lease"),
            seq: self.seq,
            slot,
        }
    }
}

pub(super) fn status_index(status: MessageStatus) -> usize {
    status as usize
}

/// The index of `status` in a queue's `[pending, claimed]` counts.
fn queue_index(status: MessageStatus) -> Option<usize> {
    match status {
        MessageStatus::Pending => Some(0),
        MessageStatus::Claimed => Some(1),
        _ => None,
    }
}

/// Put `key` into the pending index of `queue` at `level`.
fn add_pending(
    pending: &mut HashMap<Arc<str>, BTreeMap<Reverse<i16>, BTreeSet<DueKey>>>,
    queue: &Arc<str>,
    level: Reverse<i16>,
    key: DueKey,
) {
    pending
        .entry(queue.clone())
        .or_default()
        .entry(level)
        .or_default()
        .insert(key);
}

/// Take `key` out of the pending index of `queue` at `level`, dropping a
/// level or queue left empty so claims never walk them.
fn remove_pending(
    pending: &mut HashMap<Arc<str>, BTreeMap<Reverse<i16>, BTreeSet<DueKey>>>,
    queue: &str,
    level: Reverse<i16>,
    key: &DueKey,
) -> bool {
    let Some(levels) = pending.get_mut(queue) else {
        return false;
    };
    let Some(set) = levels.get_mut(&level) else {
        return false;
    };
    let removed = set.remove(key);
    if set.is_empty() {
        levels.remove(&level);
        if levels.is_empty() {
            pending.remove(queue);
        }
    }
    removed
}

/// The claim order of a candidate within its queue: higher priority
/// first, then the due order.
pub(super) type ClaimOrder = (Reverse<i16>, DueKey);

pub(super) fn clear_claim(message: &mut OutboxMessage) {
    message.claim_token = None;
    message.claimed_at = None;
    message.locked_until = None;
}

impl State {
    pub(super) fn stored(&self, slot: usize) -> &Stored {
        self.slots[slot]
            .as_ref()
            .expect("an indexed slot holds a message")
    }

    /// Change one message and move it to the index its new fields call for.
    pub(super) fn update<R>(
        &mut self,
        slot: usize,
        change: impl FnOnce(&mut OutboxMessage) -> R,
    ) -> R {
        let stored = self.slots[slot]
            .as_mut()
            .expect("an indexed slot holds a message");
        // Out of its index first, while its key still matches its fields.
        match stored.place {
            Place::Pending => remove_pending(
                &mut self.pending,
                &stored.queue,
                stored.level(),
                &stored.due_key(slot),
            ),
            Place::Queued => self.queued.remove(&stored.due_key(slot)),
            Place::Leased => self.leases.remove(&stored.lease_key(slot)),
            Place::Expired => self.expired.remove(&stored.due_key(slot)),
            Place::Settled => true,
        };
        let before = stored.message.status;
        let held_before = holds_key(&stored.message);
        let result = change(&mut stored.message);
        let after = stored.message.status;
        let key = stored.key_id();
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
                add_pending(
                    &mut self.pending,
                    &stored.queue,
                    stored.level(),
                    stored.due_key(slot),
                );
                Place::Pending
            }
            MessageStatus::Claimed => {
                self.leases.insert(stored.lease_key(slot));
                Place::Leased
            }
            MessageStatus::Delivered | MessageStatus::DeadLettered | MessageStatus::Cancelled => {
                Place::Settled
            }
        };
        self.counts[status_index(before)] -= 1;
        self.counts[status_index(after)] += 1;
        if before != after {
            let counts = self.queue_counts.entry(stored.queue.clone()).or_default();
            if let Some(i) = queue_index(before) {
                counts[i] -= 1;
            }
            if let Some(i) = queue_index(after) {
                counts[i] += 1;
            }
            if *counts == [0, 0] {
                self.queue_counts.remove(&stored.queue);
            }
        }
        if let Some(key) = key {
            self.refront(&key);
        }
        result
    }

    /// Store a new pending message under `id`, last in enqueue order: in
    /// `pending`, or, with an ordering key, in `queued` until `refront`
    /// finds it at its key's front.
    pub(super) fn insert(&mut self, id: Arc<str>, stored: Stored) {
        let created_at = stored.message.created_at;
        let seq = self.next_seq;
        self.next_seq += 1;
        let stored = Stored { seq, ..stored };
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        };
        let key = stored.key_id();
        let stored = match key {
            // Queued until `refront` finds it at its key's front.
            Some(ref key) => {
                let keyed = self.keys.entry(Arc::from(key.as_str())).or_default();
                keyed.unsettled.insert(seq, slot);
                self.queued.insert(stored.due_key(slot));
                Stored {
                    place: Place::Queued,
                    ..stored
                }
            }
            None => {
                add_pending(
                    &mut self.pending,
                    &stored.queue,
                    stored.level(),
                    stored.due_key(slot),
                );
                stored
            }
        };
        self.queue_counts.entry(stored.queue.clone()).or_default()[0] += 1;
        self.slots[slot] = Some(stored);
        if let Some(key) = key {
            self.refront(&key);
        }
        self.ids.insert(id.clone(), slot);
        self.listing.insert((created_at, id), slot);
        self.counts[status_index(MessageStatus::Pending)] += 1;
    }

    /// Delete the settled message in `slot`: out of every lookup, its
    /// ordering key and its idempotency key (when it still holds it).
    pub(super) fn remove(&mut self, slot: usize) {
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
        if let Some(key) = message.ordering_key.as_deref() {
            let key = key_id(&stored.queue, key);
            if let Some(keyed) = self.keys.get_mut(key.as_str()) {
                keyed.unsettled.remove(&stored.seq);
                if keyed.unsettled.is_empty() && keyed.claimed.is_empty() {
                    self.keys.remove(key.as_str());
                }
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
        let (queue, level) = (stored.queue.clone(), stored.level());
        match std::mem::replace(&mut stored.place, to) {
            Place::Pending => remove_pending(&mut self.pending, &queue, level, &key),
            Place::Queued => self.queued.remove(&key),
            other => unreachable!("only pending messages move between the two, not {other:?}"),
        };
        match to {
            Place::Pending => {
                add_pending(&mut self.pending, &queue, level, key);
                true
            }
            Place::Queued => self.queued.insert(key),
            other => unreachable!("only pending messages move between the two, not {other:?}"),
        };
    }

    /// The slot of `id` if `claim_token` owns it with a live lease at `now`.
    pub(super) fn fenced(&self, id: &str, claim_token: &str, now: DateTime<Utc>) -> Result<usize> {
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

    /// Up to `limit` claimable slots at `now`, at most each served queue's
    /// own limit from it and none from a paused queue, in claim order (see
    /// [`ClaimOrder`]), at most the head of each ordering key.
    pub(super) fn select(
        &mut self,
        served: &[(&str, usize)],
        limit: usize,
        now: DateTime<Utc>,
        block: bool,
    ) -> Vec<usize> {
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
        let mut selected: Vec<(ClaimOrder, usize)> = Vec::new();
        for &(queue, queue_limit) in served {
            if self.paused.contains_key(queue) {
                continue;
            }
            let queue_limit = queue_limit.min(limit);
            let mut candidates: Vec<(ClaimOrder, usize)> = Vec::new();
            // Levels from the highest priority down; within one, the due
            // prefix in claim order. Once a level filled the queue's limit,
            // no lower level can get into it.
            for (&level, due) in self.pending.get(queue).into_iter().flatten() {
                if candidates.len() >= queue_limit {
                    break;
                }
                candidates.extend(
                    due.iter()
                        .take_while(|key| key.available_at <= now)
                        .filter(|key| is_head(slots, keys, key.slot, block, now))
                        .take(queue_limit)
                        .map(|key| ((level, *key), key.slot)),
                );
            }
            // A claim found expired stays claimable; the check only matters
            // when callers' clocks disagree and `now` is earlier than that
            // claim's. They are few, and ordered by due time, not priority:
            // each competes.
            candidates.extend(
                self.expired
                    .iter()
                    .filter(|key| {
                        let stored = slots[key.slot]
                            .as_ref()
                            .expect("an expired slot holds a message");
                        &*stored.queue == queue
                            && stored.message.is_claimable(now)
                            && is_head(slots, keys, key.slot, block, now)
                    })
                    .map(|key| {
                        let priority = slots[key.slot]
                            .as_ref()
                            .expect("an expired slot holds a message")
                            .message
                            .priority;
                        ((Reverse(priority), *key), key.slot)
                    }),
            );
            candidates.sort_unstable();
            candidates.truncate(queue_limit);
            selected.extend(candidates);
        }
        selected.sort_unstable();
        selected.truncate(limit);
        selected.into_iter().map(|(_, slot)| slot).collect()
    }
}
