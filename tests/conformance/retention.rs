//! Retention: bounded deletes of settled messages, oldest first.

use outbox::{AdminError, ClaimLoss, EnqueueOptions, MessageStatus, PurgeBatch};

use super::*;

/// Settle `id` (enqueued at 0) at `when`: delivered, or dead-lettered.
async fn settle<S: OutboxStore>(store: &S, id: &str, when: i64, dead: bool) {
    put(store, message(id, "conformance.event", 0)).await;
    let claimed = claim_one(store, when, MINUTE).await;
    assert_eq!(claimed.id, id);
    if dead {
        store
            .mark_failed(failed(id, &claimed.claim_token, when, true, None))
            .await
            .unwrap();
    } else {
        store
            .mark_delivered(delivered(id, &claimed.claim_token, when))
            .await
            .unwrap();
    }
}

fn batch(status: MessageStatus, older_than: i64, limit: usize) -> PurgeBatch {
    PurgeBatch {
        status,
        older_than: at(older_than),
        limit,
    }
}

pub(crate) async fn purge_batch_deletes_oldest_settled_first_and_is_bounded<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    // Settled one at a time so each has its own time: d1..d5 delivered at
    // 1..5 s, x6 and x7 dead-lettered at 6 and 7 s; p stays pending.
    for n in 1..=5 {
        settle(&store, &format!("d{n}"), n * SECOND, false).await;
    }
    settle(&store, "x6", 6 * SECOND, true).await;
    settle(&store, "x7", 7 * SECOND, true).await;
    put(&store, message("p", "conformance.event", 0)).await;

    let delivered_before_4s = batch(MessageStatus::Delivered, 4 * SECOND, 2);
    assert_eq!(store.purge_batch(delivered_before_4s).await.unwrap(), 2);
    let left: Vec<String> = everything(&store).await.into_keys().collect();
    assert_eq!(
        left,
        sorted(&["d3", "d4", "d5", "p", "x6", "x7"]),
        "oldest first"
    );
    assert_eq!(store.purge_batch(delivered_before_4s).await.unwrap(), 1);
    assert_eq!(store.purge_batch(delivered_before_4s).await.unwrap(), 0);

    // A horizon is strict, and dead letters go only when asked for.
    let dead = batch(MessageStatus::DeadLettered, 7 * SECOND, 10);
    assert_eq!(store.purge_batch(dead).await.unwrap(), 1);
    let left: Vec<String> = everything(&store).await.into_keys().collect();
    assert_eq!(left, sorted(&["d4", "d5", "p", "x7"]));
    let stats = store.stats(at(8 * SECOND)).await.unwrap();
    assert_eq!(
        (stats.pending, stats.delivered, stats.dead_lettered),
        (1, 2, 1)
    );
}

pub(crate) async fn purge_batch_refuses_live_statuses_and_bad_limits<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    put(&store, message("p", "conformance.event", 0)).await;
    for status in [MessageStatus::Pending, MessageStatus::Claimed] {
        match store.purge_batch(batch(status, FAR_FUTURE, 10)).await {
            Err(Error::Admin(AdminError::UnsafePurge { status: refused })) => {
                assert_eq!(refused, status)
            }
            other => panic!("expected an unsafe-purge refusal, got {other:?}"),
        }
    }
    for limit in [0, 10_001] {
        assert_invalid(
            store
                .purge_batch(batch(MessageStatus::Delivered, FAR_FUTURE, limit))
                .await,
            "limit",
        );
    }
    assert_eq!(get(&store, "p").await.status, MessageStatus::Pending);
}

fn delivered_and_deleted(id: &str, token: &str, now: i64) -> MarkDelivered {
    MarkDelivered {
        delete: true,
        ..delivered(id, token, now)
    }
}

fn assert_gone<S: OutboxAdmin>(store: &S, id: &str) -> impl std::future::Future<Output = ()> {
    let found = store.get_message(id);
    let id = id.to_owned();
    async move {
        match found.await {
            Err(Error::NotFound { id: missing }) => assert_eq!(missing, id),
            other => panic!("expected {id} deleted, got {other:?}"),
        }
    }
}

pub(crate) async fn delivery_with_delete_removes_the_message_under_its_fence<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    put(&store, message("a", "conformance.event", 0)).await;
    put(&store, message("b", "conformance.event", 0)).await;
    let claimed = claim(&store, 2, 0, 10 * SECOND).await;
    let token = |id: &str| {
        claimed
            .claimed
            .iter()
            .find(|m| m.id == id)
            .map(|m| m.claim_token.clone())
            .expect("claimed")
    };
    let before = get(&store, "a").await;

    // Refused like a plain delivery: another token, or a lease that ended.
    assert_claim_lost(
        store
            .mark_delivered(delivered_and_deleted("a", "wrong", SECOND))
            .await,
        "a",
    );
    assert_claim_lost(
        store
            .mark_delivered(delivered_and_deleted("b", &token("b"), 10 * SECOND))
            .await,
        "b",
    );
    assert_eq!(
        get(&store, "a").await,
        before,
        "a refused delete changed it"
    );
    assert_eq!(get(&store, "b").await.status, MessageStatus::Claimed);

    store
        .mark_delivered(delivered_and_deleted("a", &token("a"), SECOND))
        .await
        .expect("the owner deletes it");
    assert_gone(&store, "a").await;
    let stats = store.stats(at(2 * SECOND)).await.unwrap();
    assert_eq!((stats.claimed, stats.delivered), (1, 0));
    // Settling it again finds nothing to settle.
    match store
        .mark_delivered(delivered_and_deleted("a", &token("a"), 2 * SECOND))
        .await
    {
        Err(Error::Claim(error)) => {
            assert_eq!((error.id.as_str(), error.reason), ("a", ClaimLoss::Missing))
        }
        other => panic!("expected a missing message, got {other:?}"),
    }
    // Nothing is left for retention to delete.
    let purge = batch(MessageStatus::Delivered, FAR_FUTURE, 10);
    assert_eq!(store.purge_batch(purge).await.unwrap(), 0);
}

pub(crate) async fn a_message_deleted_at_delivery_frees_its_keys<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    let window = Duration::from_secs(3600);
    let keyed = |id: &str, created: i64| {
        message(id, "conformance.event", created).with_options(
            EnqueueOptions::new()
                .ordering_key("order-7")
                .idempotency_key(format!("once-{id}"), window),
        )
    };
    put(&store, keyed("k1", 0)).await;
    put(&store, keyed("k2", 1)).await;
    let head = claim(&store, 10, SECOND, MINUTE).await;
    assert_eq!(ids(&head).0, ["k1"], "one message of a key at a time");
    store
        .mark_delivered(delivered_and_deleted(
            "k1",
            &head.claimed[0].claim_token,
            2 * SECOND,
        ))
        .await
        .unwrap();
    assert_gone(&store, "k1").await;
    // The deleted head lets its key go on.
    let next = claim(&store, 10, 3 * SECOND, MINUTE).await;
    assert_eq!(ids(&next).0, ["k2"]);
    // Its idempotency key is free again inside its window, as after a purge;
    // the key of the message still stored still holds.
    let k1_again = message("k1-again", "conformance.event", 4 * SECOND)
        .with_options(EnqueueOptions::new().idempotency_key("once-k1", window));
    assert_eq!(
        store.enqueue(k1_again).await.unwrap(),
        Enqueued::Inserted("k1-again".into())
    );
    let k2_again = message("k2-again", "conformance.event", 4 * SECOND)
        .with_options(EnqueueOptions::new().idempotency_key("once-k2", window));
    assert_eq!(
        store.enqueue(k2_again).await.unwrap(),
        Enqueued::AlreadyExists("k2".into())
    );
}
