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
        let in_leases =
            stored.message.locked_until.is_some() && state.leases.contains(&stored.lease_key(slot));
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
    let new =
        NewMessage::new(MessageKind::Event, "e", Payload::from(serde_json::json!(7))).at(at(50));
    store.enqueue_now(new).unwrap();
    assert_eq!(store.lock().slots.len(), 6, "a purged slot is reused");
    assert_consistent(&store);
}
