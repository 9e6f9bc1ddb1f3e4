//! Ordering keys' heads after every write that moves one: a cancel, a
//! delete on delivery, a purge, a dead letter at claim, a requeue; and a
//! hot key's long backlog in front of many other keys. The SQL stores keep
//! each key's head apart from the messages (a flag their writes maintain),
//! so these check that every way a head moves is seen by the next claim.

use outbox::{
    CancelMessages, ClaimBatch, ClaimedBatch, OnDeadLetter, OutboxAdmin, OutboxStore,
    PurgeMessages, RequeueDeadLetters,
};

use super::{MINUTE, SECOND, at, delivered, failed, lease, message, put, released};

/// `id`, an event of ordering key `key`, enqueued at `created`.
async fn keyed<S: OutboxStore>(store: &S, id: &str, key: &str, created: i64) {
    put(
        store,
        message(id, "conformance.keyed", created).with_ordering_key(key),
    )
    .await;
}

async fn claim_under<S: OutboxStore>(
    store: &S,
    policy: OnDeadLetter,
    limit: usize,
    now: i64,
) -> ClaimedBatch {
    store
        .claim_batch(ClaimBatch {
            on_dead_letter: policy,
            limit,
            now: at(now),
            lease: lease(MINUTE),
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
            queues: Vec::new(),
            durable: true,
        })
        .await
        .expect("claim_batch")
}

/// The ids a blocking claim of 100 takes at `now`, sorted, with their
/// tokens in the same order.
async fn claimed<S: OutboxStore>(store: &S, now: i64) -> (Vec<String>, Vec<String>) {
    let batch = claim_under(store, OnDeadLetter::Block, 100, now).await;
    let mut claimed: Vec<_> = batch
        .claimed
        .into_iter()
        .map(|m| (m.id, m.claim_token))
        .collect();
    claimed.sort();
    claimed.into_iter().unzip()
}

pub(crate) async fn cancelling_a_head_hands_its_key_on<S: OutboxStore + OutboxAdmin + Clone>(
    store: S,
) {
    for (n, id) in ["k1", "k2", "k3", "k4"].into_iter().enumerate() {
        keyed(&store, id, "k", n as i64).await;
    }
    // A pending head cancelled: the next message is the head.
    store
        .cancel_messages(CancelMessages::id("k1", at(SECOND)))
        .await
        .unwrap();
    let (ids, tokens) = claimed(&store, 2 * SECOND).await;
    assert_eq!(ids, ["k2"]);
    // A message behind a claimed head cancelled: the head holds the key,
    // and the one after the cancelled message follows it.
    store
        .cancel_messages(CancelMessages::id("k3", at(3 * SECOND)))
        .await
        .unwrap();
    assert!(claimed(&store, 4 * SECOND).await.0.is_empty());
    // A claimed head whose cancellation is requested, cancelled when its
    // failure is settled.
    store
        .cancel_messages(CancelMessages::id("k2", at(5 * SECOND)))
        .await
        .unwrap();
    store
        .mark_failed(failed("k2", &tokens[0], 6 * SECOND, false, None))
        .await
        .unwrap();
    assert_eq!(claimed(&store, 7 * SECOND).await.0, ["k4"]);
}

pub(crate) async fn deleting_a_head_on_delivery_hands_its_key_on<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    keyed(&store, "k1", "k", 0).await;
    keyed(&store, "k2", "k", 1).await;
    let (ids, tokens) = claimed(&store, SECOND).await;
    assert_eq!(ids, ["k1"]);
    let deleted = outbox::MarkDelivered {
        delete: true,
        ..delivered("k1", &tokens[0], 2 * SECOND)
    };
    store.mark_delivered(deleted).await.unwrap();
    assert_eq!(claimed(&store, 3 * SECOND).await.0, ["k2"]);
}

pub(crate) async fn purging_settled_messages_leaves_their_keys_heads<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    for (n, id) in ["a1", "a2", "a3"].into_iter().enumerate() {
        keyed(&store, id, "a", n as i64).await;
    }
    keyed(&store, "b1", "b", 10).await;
    keyed(&store, "b2", "b", 11).await;
    // a1 delivered, b1 dead-lettered: a2 is a's head, b is held.
    let (ids, tokens) = claimed(&store, SECOND).await;
    assert_eq!(ids, ["a1", "b1"]);
    store
        .mark_delivered(delivered("a1", &tokens[0], 2 * SECOND))
        .await
        .unwrap();
    store
        .mark_failed(failed("b1", &tokens[1], 2 * SECOND, true, None))
        .await
        .unwrap();
    let purge = PurgeMessages {
        status: None,
        older_than: at(3 * SECOND),
    };
    assert_eq!(store.purge(purge).await.unwrap(), 2);
    // The delivered message gone, a's head is where it was; the dead
    // letter gone, it holds b no more.
    assert_eq!(claimed(&store, 4 * SECOND).await.0, ["a2", "b2"]);
}

pub(crate) async fn a_head_dead_lettered_at_claim_hands_its_key_on<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    put(
        &store,
        message("k1", "conformance.keyed", 0)
            .with_ordering_key("k")
            .with_max_attempts(1),
    )
    .await;
    keyed(&store, "k2", "k", 1).await;
    assert_eq!(claimed(&store, SECOND).await.0, ["k1"]);
    // The lease runs out with the attempt spent: the next claim
    // dead-letters k1, and under `Skip` k2 is the head at once.
    let batch = claim_under(&store, OnDeadLetter::Skip, 100, 2 * MINUTE).await;
    let dead: Vec<_> = batch.dead_lettered.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(dead, ["k1"]);
    let next = claim_under(&store, OnDeadLetter::Skip, 100, 2 * MINUTE + 1).await;
    let ids: Vec<_> = next.claimed.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, ["k2"]);
}

pub(crate) async fn a_requeued_dead_letter_comes_before_its_keys_backlog<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    for n in 1..=5 {
        keyed(&store, &format!("k{n}"), "k", n).await;
    }
    let (ids, tokens) = claimed(&store, SECOND).await;
    assert_eq!(ids, ["k1"]);
    store
        .mark_failed(failed("k1", &tokens[0], 2 * SECOND, true, None))
        .await
        .unwrap();
    // Under `Skip`, k2 goes on and is delivered.
    let batch = claim_under(&store, OnDeadLetter::Skip, 100, 3 * SECOND).await;
    assert_eq!(batch.claimed.len(), 1);
    assert_eq!(batch.claimed[0].id, "k2");
    let token = batch.claimed[0].claim_token.clone();
    store
        .mark_delivered(delivered("k2", &token, 4 * SECOND))
        .await
        .unwrap();
    // k1 requeued: it is the key's head again, before k3 to k5.
    let requeue = RequeueDeadLetters {
        id: Some("k1".into()),
        name: None,
        now: at(5 * SECOND),
    };
    assert_eq!(store.requeue_dead_letters(requeue).await.unwrap(), 1);
    let (ids, tokens) = claimed(&store, 6 * SECOND).await;
    assert_eq!(ids, ["k1"]);
    // Released, it stays the head; delivered, k3 follows.
    store
        .release_claim(released("k1", &tokens[0], 7 * SECOND))
        .await
        .unwrap();
    let (ids, tokens) = claimed(&store, 8 * SECOND).await;
    assert_eq!(ids, ["k1"]);
    store
        .mark_delivered(delivered("k1", &tokens[0], 9 * SECOND))
        .await
        .unwrap();
    assert_eq!(claimed(&store, 10 * SECOND).await.0, ["k3"]);
}

pub(crate) async fn a_hot_keys_backlog_does_not_hide_the_other_keys<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    // 300 messages of one key, then one message each of 150 other keys.
    for n in 0..300 {
        keyed(&store, &format!("hot-{n:03}"), "hot", n).await;
    }
    for n in 0..150 {
        keyed(&store, &format!("key-{n:03}"), &format!("k{n:03}"), 300 + n).await;
    }
    // A claim of 100 takes the hot key's head and the first 99 other keys.
    let batch = claim_under(&store, OnDeadLetter::Block, 100, SECOND).await;
    let mut ids: Vec<_> = batch.claimed.iter().map(|m| m.id.clone()).collect();
    ids.sort();
    let mut expected = vec!["hot-000".to_owned()];
    expected.extend((0..99).map(|n| format!("key-{n:03}")));
    expected.sort();
    assert_eq!(ids, expected);
    for message in &batch.claimed {
        store
            .mark_delivered(delivered(&message.id, &message.claim_token, 2 * SECOND))
            .await
            .unwrap();
    }
    // The next takes the hot key's second message and the 51 keys left.
    let batch = claim_under(&store, OnDeadLetter::Block, 100, 3 * SECOND).await;
    let mut ids: Vec<_> = batch.claimed.iter().map(|m| m.id.clone()).collect();
    ids.sort();
    let mut expected = vec!["hot-001".to_owned()];
    expected.extend((99..150).map(|n| format!("key-{n:03}")));
    expected.sort();
    assert_eq!(ids, expected);
}
