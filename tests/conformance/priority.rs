//! Priorities: higher first within a queue, then oldest due; a scheduled
//! message of any priority waits for its time without standing in front of
//! due ones; an ordering key keeps its order whatever its messages'
//! priorities; expired claims compete by priority; out-of-range priorities
//! are refused.

use outbox::{MAX_PRIORITY, MIN_PRIORITY, MessageStatus, OutboxAdmin, OutboxStore};

use super::queues::claimed_ids;
use super::{MINUTE, SECOND, assert_invalid, at, claim, delivered, get, message, put};

/// `id` in the default queue with `priority`, enqueued at `created`, due
/// at `available`.
async fn put_priority<S: OutboxStore>(
    store: &S,
    id: &str,
    priority: i16,
    created: i64,
    available: i64,
) {
    let new = message(id, "conformance.prioritized", created)
        .with_priority(priority)
        .available_at(at(available));
    put(store, new).await;
}

/// The ids of one claim of `limit` at `now`, in claim order as the ids say
/// (each claim here takes one).
async fn take_one<S: OutboxStore>(store: &S, now: i64) -> Vec<String> {
    claimed_ids(&claim(store, 1, now, MINUTE).await)
}

pub(crate) async fn priority_higher_goes_first_within_a_queue<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    put_priority(&store, "low", -5, 0, 0).await;
    put_priority(&store, "plain", 0, 1, 1).await;
    put_priority(&store, "high", 5, 2, 2).await;
    put_priority(&store, "top", MAX_PRIORITY, 3, 3).await;
    put_priority(&store, "bottom", MIN_PRIORITY, 4, 4).await;
    let now = SECOND;
    let mut order = Vec::new();
    for _ in 0..5 {
        order.extend(take_one(&store, now).await);
    }
    assert_eq!(order, ["top", "high", "plain", "low", "bottom"]);
}

pub(crate) async fn priority_ties_go_oldest_due_first<S: OutboxStore + OutboxAdmin + Clone>(
    store: S,
) {
    // Created in one order, due in the other.
    put_priority(&store, "second", 3, 0, 20).await;
    put_priority(&store, "first", 3, 1, 10).await;
    put_priority(&store, "lower", 2, 2, 0).await;
    let now = SECOND;
    let mut order = Vec::new();
    for _ in 0..3 {
        order.extend(take_one(&store, now).await);
    }
    assert_eq!(order, ["first", "second", "lower"]);
}

pub(crate) async fn priority_a_scheduled_message_waits_without_blocking_due_ones<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    for i in 0..3 {
        put_priority(&store, &format!("later{i}"), 100, i, MINUTE).await;
    }
    put_priority(&store, "due", 0, 10, 0).await;
    let batch = claim(&store, 10, SECOND, MINUTE).await;
    assert_eq!(claimed_ids(&batch), ["due"]);
    put_priority(&store, "due2", 0, 20, 0).await;
    // Once the scheduled ones are due, they go first.
    let batch = claim(&store, 2, MINUTE, MINUTE).await;
    assert_eq!(claimed_ids(&batch), ["later0", "later1"]);
}

pub(crate) async fn priority_never_reorders_an_ordering_key<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    let keyed = |id: &str, priority: i16, created: i64| {
        message(id, "conformance.prioritized", created)
            .with_ordering_key("order-1")
            .with_priority(priority)
    };
    put(&store, keyed("k1", 0, 0)).await;
    put(&store, keyed("k2", 50, 1)).await;
    put_priority(&store, "loose", 10, 2, 2).await;
    // The key's head is k1 whatever k2's priority; the keyless message of a
    // higher priority than k1 goes before it.
    assert_eq!(take_one(&store, SECOND).await, ["loose"]);
    let batch = claim(&store, 10, SECOND, MINUTE).await;
    assert_eq!(claimed_ids(&batch), ["k1"]);
    assert_eq!(get(&store, "k2").await.status, MessageStatus::Pending);
    let token = batch.claimed[0].claim_token.clone();
    store
        .mark_delivered(delivered("k1", &token, 2 * SECOND))
        .await
        .unwrap();
    assert_eq!(take_one(&store, 3 * SECOND).await, ["k2"]);
}

pub(crate) async fn priority_expired_claims_compete_by_priority<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    put_priority(&store, "old-low", 0, 0, 0).await;
    put_priority(&store, "old-high", 9, 1, 1).await;
    // Both claimed, both leases run out.
    assert_eq!(claim(&store, 10, SECOND, SECOND).await.claimed.len(), 2);
    put_priority(&store, "new-mid", 5, 2 * SECOND, 2 * SECOND).await;
    let now = 3 * SECOND;
    let mut order = Vec::new();
    for _ in 0..3 {
        order.extend(take_one(&store, now).await);
    }
    assert_eq!(order, ["old-high", "new-mid", "old-low"]);
}

pub(crate) async fn priority_out_of_range_is_refused<S: OutboxStore + OutboxAdmin + Clone>(
    store: S,
) {
    for bad in [MAX_PRIORITY + 1, MIN_PRIORITY - 1, i16::MAX, i16::MIN] {
        let new = message("m", "conformance.prioritized", 0).with_priority(bad);
        assert_invalid(store.enqueue(new).await, "priority");
    }
    assert!(matches!(
        store.get_message("m").await,
        Err(outbox::Error::NotFound { .. })
    ));
}
