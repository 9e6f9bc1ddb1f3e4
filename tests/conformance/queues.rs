//! Named queues and pausing them: a message is stored in its queue, a claim
//! takes only from the queues it serves, each up to its own limit (and its
//! own attempt cap), an ordering key's order holds within its queue, bad
//! names are refused; a paused queue is claimed from by no one until it is
//! resumed, while its claims settle as usual and other queues go on.

use outbox::{
    ClaimBatch, ClaimedBatch, EnqueueOptions, Error, MAX_QUEUE_NAME_LEN, MessageStatus,
    OutboxAdmin, OutboxStore, PauseQueue, QueueLimit,
};

use super::{
    MINUTE, SECOND, assert_invalid, at, claim, delivered, get, lease, message, put, renew,
};

/// `id` in `queue`, enqueued at `created` and due then.
async fn put_in<S: OutboxStore>(store: &S, id: &str, queue: &str, created: i64) {
    put(
        store,
        message(id, "conformance.queued", created).with_queue(queue),
    )
    .await;
}

/// A claim of up to `limit` at `now` from `queues`, each with its limit.
pub(crate) async fn claim_from<S: OutboxStore>(
    store: &S,
    queues: &[(&str, usize)],
    limit: usize,
    now: i64,
) -> ClaimedBatch {
    store
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit,
            now: at(now),
            lease: lease(MINUTE),
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
            queues: queues
                .iter()
                .map(|&(queue, limit)| QueueLimit::new(queue, limit))
                .collect(),
            durable: true,
        })
        .await
        .expect("claim_batch")
}

/// The ids claimed, sorted.
pub(crate) fn claimed_ids(batch: &ClaimedBatch) -> Vec<String> {
    let mut ids: Vec<String> = batch.claimed.iter().map(|m| m.id.clone()).collect();
    ids.sort();
    ids
}

fn names(ids: &[&str]) -> Vec<String> {
    ids.iter().map(|id| id.to_string()).collect()
}

async fn pause<S: OutboxAdmin>(store: &S, queue: &str, now: i64) -> bool {
    store
        .pause_queue(PauseQueue {
            queue: queue.to_owned(),
            now: at(now),
        })
        .await
        .expect("pause_queue")
}

pub(crate) async fn queue_a_message_keeps_its_queue_and_priority<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    put(&store, message("plain", "conformance.queued", 0)).await;
    let options = EnqueueOptions::new().queue("emails").priority(7);
    put(
        &store,
        message("mail", "conformance.queued", 0).with_options(options),
    )
    .await;
    let plain = get(&store, "plain").await;
    assert_eq!((plain.queue.as_str(), plain.priority), ("default", 0));
    let mail = get(&store, "mail").await;
    assert_eq!((mail.queue.as_str(), mail.priority), ("emails", 7));
    assert_eq!(mail.cancel_requested_at, None);

    let batch = claim_from(&store, &[("emails", 10)], 10, SECOND).await;
    assert_eq!(claimed_ids(&batch), names(&["mail"]));
    let claimed = &batch.claimed[0];
    assert_eq!((claimed.queue.as_str(), claimed.priority), ("emails", 7));
}

pub(crate) async fn queue_a_claim_takes_only_the_queues_it_serves<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    put_in(&store, "a1", "a", 0).await;
    put_in(&store, "b1", "b", 1).await;
    put_in(&store, "d1", "default", 2).await;
    put_in(&store, "c1", "c", 3).await;
    // Without queues, a claim serves the default queue alone.
    let batch = claim(&store, 100, SECOND, MINUTE).await;
    assert_eq!(claimed_ids(&batch), names(&["d1"]));
    let batch = claim_from(&store, &[("a", 10), ("c", 10)], 100, SECOND).await;
    assert_eq!(claimed_ids(&batch), names(&["a1", "c1"]));
    assert_eq!(get(&store, "b1").await.status, MessageStatus::Pending);
    // A queue nobody enqueued into is served as readily: it is empty.
    let batch = claim_from(&store, &[("b", 10), ("nobody", 10)], 100, SECOND).await;
    assert_eq!(claimed_ids(&batch), names(&["b1"]));
}

pub(crate) async fn queue_each_queue_is_held_to_its_own_limit<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    for i in 0..5 {
        put_in(&store, &format!("a{i}"), "a", i).await;
        put_in(&store, &format!("b{i}"), "b", 10 + i).await;
    }
    let batch = claim_from(&store, &[("a", 2), ("b", 3)], 100, SECOND).await;
    assert_eq!(claimed_ids(&batch), names(&["a0", "a1", "b0", "b1", "b2"]));
    // The claim's own limit cuts the queues' together, in claim order:
    // `a` has the older messages.
    let batch = claim_from(&store, &[("a", 5), ("b", 5)], 3, SECOND).await;
    assert_eq!(claimed_ids(&batch), names(&["a2", "a3", "a4"]));
    let batch = claim_from(&store, &[("a", 5), ("b", 5)], 3, SECOND).await;
    assert_eq!(claimed_ids(&batch), names(&["b3", "b4"]));
}

pub(crate) async fn queue_an_ordering_key_orders_within_its_queue<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    let keyed = |id: &str, queue: &str, created: i64| {
        message(id, "conformance.queued", created)
            .with_queue(queue)
            .with_ordering_key("order-7")
    };
    put(&store, keyed("a1", "a", 0)).await;
    put(&store, keyed("a2", "a", 1)).await;
    put(&store, keyed("b1", "b", 2)).await;
    put(&store, keyed("b2", "b", 3)).await;
    // One head per key and queue: the key in `b` does not wait for `a`.
    let batch = claim_from(&store, &[("a", 10), ("b", 10)], 100, SECOND).await;
    assert_eq!(claimed_ids(&batch), names(&["a1", "b1"]));
    // Serving `b` alone, `a`'s claimed head holds nothing in `b`.
    let token = |id: &str| {
        batch
            .claimed
            .iter()
            .find(|m| m.id == id)
            .map(|m| m.claim_token.clone())
            .unwrap()
    };
    store
        .mark_delivered(delivered("b1", &token("b1"), 2 * SECOND))
        .await
        .unwrap();
    let batch_b = claim_from(&store, &[("b", 10)], 100, 3 * SECOND).await;
    assert_eq!(claimed_ids(&batch_b), names(&["b2"]));
    // `a2` still waits for `a1`.
    assert!(
        claim_from(&store, &[("a", 10)], 100, 3 * SECOND)
            .await
            .is_empty()
    );
    store
        .mark_delivered(delivered("a1", &token("a1"), 4 * SECOND))
        .await
        .unwrap();
    let batch = claim_from(&store, &[("a", 10)], 100, 5 * SECOND).await;
    assert_eq!(claimed_ids(&batch), names(&["a2"]));
}

pub(crate) async fn queue_names_and_limits_are_checked<S: OutboxStore + OutboxAdmin + Clone>(
    store: S,
) {
    let long = "q".repeat(MAX_QUEUE_NAME_LEN + 1);
    for bad in ["", "two words", "semi;colon", long.as_str()] {
        let new = message("m", "conformance.queued", 0).with_queue(bad);
        assert_invalid(store.enqueue(new).await, "queue");
    }
    let at_max = "q".repeat(MAX_QUEUE_NAME_LEN);
    put_in(&store, "long", &at_max, 0).await;
    assert_eq!(get(&store, "long").await.queue, at_max);
    let claim_of = |queues: Vec<QueueLimit>| ClaimBatch {
        on_dead_letter: Default::default(),
        limit: 10,
        now: at(SECOND),
        lease: lease(MINUTE),
        max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
        queues,
        durable: true,
    };
    let refused = [
        vec![QueueLimit::new("bad name", 1)],
        vec![QueueLimit::new("a", 0)],
        vec![QueueLimit::new("a", 1), QueueLimit::new("a", 2)],
        vec![QueueLimit {
            max_attempts: Some(0),
            ..QueueLimit::new("a", 1)
        }],
    ];
    for queues in refused {
        assert_invalid(store.claim_batch(claim_of(queues)).await, "queues");
    }
    // Nothing was claimed by the refused claims.
    assert_eq!(get(&store, "long").await.status, MessageStatus::Pending);
}

pub(crate) async fn queue_states_count_pending_and_claimed<S: OutboxStore + OutboxAdmin + Clone>(
    store: S,
) {
    assert!(store.queues().await.unwrap().is_empty());
    put_in(&store, "a1", "a", 0).await;
    put_in(&store, "a2", "a", 1).await;
    put_in(&store, "b1", "b", 2).await;
    claim_from(&store, &[("a", 1)], 1, SECOND).await;
    pause(&store, "idle", SECOND).await;
    let queues = store.queues().await.unwrap();
    let seen: Vec<_> = queues
        .iter()
        .map(|q| (q.queue.as_str(), q.pending, q.claimed, q.is_paused()))
        .collect();
    assert_eq!(
        seen,
        [("a", 1, 1, false), ("b", 1, 0, false), ("idle", 0, 0, true)]
    );
}

pub(crate) async fn queue_attempt_caps_are_each_queues_own<S: OutboxStore + OutboxAdmin + Clone>(
    store: S,
) {
    put_in(&store, "a", "a", 0).await;
    put_in(&store, "b", "b", 0).await;
    let claim_capped = |now: i64| {
        let store = store.clone();
        async move {
            store
                .claim_batch(ClaimBatch {
                    on_dead_letter: Default::default(),
                    limit: 10,
                    now: at(now),
                    lease: lease(SECOND),
                    max_attempts: 3,
                    queues: vec![
                        QueueLimit {
                            max_attempts: Some(1),
                            ..QueueLimit::new("a", 5)
                        },
                        QueueLimit::new("b", 5),
                    ],
                    durable: true,
                })
                .await
                .unwrap()
        }
    };
    // The first claim takes both; their leases run out unsettled.
    assert_eq!(claim_capped(0).await.claimed.len(), 2);
    // `a` had one attempt; `b` has the claim's three.
    let batch = claim_capped(2 * SECOND).await;
    assert_eq!(claimed_ids(&batch), names(&["b"]));
    let dead: Vec<&str> = batch.dead_lettered.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(dead, ["a"]);
    assert_eq!(get(&store, "a").await.status, MessageStatus::DeadLettered);
}

pub(crate) async fn pause_a_paused_queue_is_skipped_and_others_go_on<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    put_in(&store, "a1", "a", 0).await;
    put_in(&store, "b1", "b", 1).await;
    assert!(pause(&store, "a", 0).await, "the first pause pauses");
    assert!(
        !pause(&store, "a", 0).await,
        "a second pause finds it paused"
    );
    let batch = claim_from(&store, &[("a", 10), ("b", 10)], 100, SECOND).await;
    assert_eq!(claimed_ids(&batch), names(&["b1"]));
    assert!(
        claim_from(&store, &[("a", 10)], 100, SECOND)
            .await
            .is_empty()
    );
    assert!(store.resume_queue("a").await.unwrap());
    assert!(!store.resume_queue("a").await.unwrap());
    let batch = claim_from(&store, &[("a", 10), ("b", 10)], 100, 2 * SECOND).await;
    assert_eq!(claimed_ids(&batch), names(&["a1"]));
}

pub(crate) async fn pause_claims_already_made_settle_as_usual<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    put_in(&store, "a1", "a", 0).await;
    let batch = claim_from(&store, &[("a", 10)], 100, SECOND).await;
    let token = batch.claimed[0].claim_token.clone();
    pause(&store, "a", 2 * SECOND).await;
    store
        .renew_claim(renew("a1", &token, 3 * SECOND, MINUTE))
        .await
        .expect("a paused queue's claim is renewed");
    store
        .mark_delivered(delivered("a1", &token, 4 * SECOND))
        .await
        .expect("a paused queue's claim settles");
    assert_eq!(get(&store, "a1").await.status, MessageStatus::Delivered);
}

pub(crate) async fn pause_an_expired_claim_waits_for_the_resume<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    put_in(&store, "a1", "a", 0).await;
    claim_from(&store, &[("a", 10)], 100, SECOND).await;
    pause(&store, "a", 2 * SECOND).await;
    // The lease ran out, but the queue is paused: no one takes it over.
    let late = SECOND + 2 * MINUTE;
    assert!(claim_from(&store, &[("a", 10)], 100, late).await.is_empty());
    store.resume_queue("a").await.unwrap();
    let batch = claim_from(&store, &[("a", 10)], 100, late).await;
    assert_eq!(claimed_ids(&batch), names(&["a1"]));
    assert_eq!(batch.claimed[0].attempts, 2);
}

pub(crate) async fn pause_names_are_checked<S: OutboxStore + OutboxAdmin + Clone>(store: S) {
    for bad in ["", "two words"] {
        let params = PauseQueue {
            queue: bad.to_owned(),
            now: at(0),
        };
        assert_invalid(store.pause_queue(params).await, "queue");
        assert_invalid(store.resume_queue(bad).await, "queue");
    }
    assert!(store.queues().await.unwrap().is_empty());
    let unknown = store.resume_queue("never-paused").await;
    assert!(matches!(unknown, Ok(false)), "{unknown:?}");
    let _: Option<Error> = None;
}
