//! Retention: bounded deletes of settled messages, oldest first.

use outbox::{AdminError, MessageStatus, PurgeBatch};

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
