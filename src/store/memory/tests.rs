//! The memory store's indexes against its messages, through every
//! transition.

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
            queues: Vec::new(),
            durable: true,
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
        let in_pending = state
            .pending
            .get(&*stored.queue)
            .and_then(|levels| levels.get(&std::cmp::Reverse(stored.message.priority)))
            .is_some_and(|due| due.contains(&stored.due_key(slot)));
        let in_queued = state.queued.contains(&stored.due_key(slot));
        let in_expired = state.expired.contains(&stored.due_key(slot));
        let in_leases =
            stored.message.locked_until.is_some() && state.leases.contains(&stored.lease_key(slot));
        let expected = match stored.message.status {
            MessageStatus::Pending => {
                // A keyed message is in `pending` exactly when it is its
                // key's front.
                let front = stored.message.ordering_key.as_deref().is_none_or(|key| {
                    let key = index::key_id(&stored.queue, key);
                    state.keys[key.as_str()].unsettled.values().find(|&&other| {
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
    let pending: usize = state
        .pending
        .values()
        .flat_map(|levels| levels.values())
        .map(|due| {
            assert!(!due.is_empty(), "an empty level is dropped");
            due.len()
        })
        .sum();
    assert_eq!(
        pending + state.queued.len() + state.leases.len() + state.expired.len(),
        (state.counts[0] + state.counts[1]) as usize
    );
    let per_queue: u64 = state.queue_counts.values().flatten().sum();
    assert_eq!(per_queue, state.counts[0] + state.counts[1]);
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
    let new =
        NewMessage::new(MessageKind::Event, "e", Payload::from(serde_json::json!(7))).at(at(50));
    store.enqueue_now(new).unwrap();
    assert_eq!(store.lock().slots.len(), 6, "a purged slot is reused");
    assert_consistent(&store);
}

#[test]
fn claims_read_each_queue_by_priority_and_skip_scheduled_messages() {
    let store = MemoryOutbox::new();
    let enqueue = |id: &str, queue: &str, priority: i16, available: i64| {
        let new = NewMessage::new(MessageKind::Event, "e", Payload::from(serde_json::json!(1)))
            .with_id(id)
            .with_queue(queue)
            .with_priority(priority)
            .at(at(0))
            .available_at(at(available));
        store.enqueue_now(new).unwrap();
    };
    // A scheduled message of the highest priority stands in front of
    // nothing: its level's due prefix is empty.
    enqueue("later", "a", 9, 100);
    enqueue("low", "a", 0, 0);
    enqueue("high", "a", 5, 1);
    enqueue("other", "b", 0, 0);
    assert_consistent(&store);
    let batch = store
        .claim_now(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: 10,
            now: at(10),
            lease: Duration::from_secs(10),
            max_attempts: crate::DEFAULT_MAX_ATTEMPTS,
            queues: vec![crate::QueueLimit::new("a", 1)],
            durable: true,
        })
        .unwrap();
    assert_eq!(claimed(&batch), ["high"]);
    assert_consistent(&store);
    let mut queues = futures_util::FutureExt::now_or_never(store.queues())
        .unwrap()
        .unwrap();
    queues.sort_by(|x, y| x.queue.cmp(&y.queue));
    let counts: Vec<_> = queues
        .iter()
        .map(|q| (q.queue.as_str(), q.pending, q.claimed))
        .collect();
    assert_eq!(counts, [("a", 2, 1), ("b", 1, 0)]);
}
