//! Each key's head flag on PostgreSQL, where an enqueue and a settlement of
//! one key can run at once: an enqueue whose transaction is still open when
//! the key's head is delivered, under READ COMMITTED or REPEATABLE READ,
//! leaves its message claimable once it commits.

use outbox::{ClaimBatch, MarkDelivered, OutboxStore, PostgresOutbox, SettlementMode};

use crate::sql_support::{LEASE, event, secs, t0, unique};
use crate::{pool, store};

/// The ids a claim of 10 takes at `now`, with their tokens.
async fn claim(outbox: &PostgresOutbox, now: i64) -> Vec<(String, String)> {
    let batch = outbox
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: 10,
            now: t0() + secs(now),
            lease: LEASE,
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
            queues: Vec::new(),
            durable: true,
        })
        .await
        .unwrap();
    batch
        .claimed
        .into_iter()
        .map(|m| (m.id, m.claim_token))
        .collect()
}

/// Enqueues `k2` of key `k` in a transaction at `isolation`, which takes
/// its snapshot, then stays open while `k1`, the key's head, is claimed
/// and delivered; once it commits, `k2` is the head.
async fn enqueue_while_the_head_is_delivered(isolation: &str) {
    let pool = pool().await;
    let outbox = store(&pool, &unique("heads"), SettlementMode::default()).await;
    outbox
        .enqueue(event("k1", 1, t0()).with_ordering_key("k"))
        .await
        .unwrap();
    let mut tx = pool.begin().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SET TRANSACTION ISOLATION LEVEL {isolation}"
    )))
    .execute(&mut *tx)
    .await
    .unwrap();
    sqlx::query("SELECT 1").execute(&mut *tx).await.unwrap();
    outbox
        .enqueue_in(&mut tx, event("k2", 2, t0()).with_ordering_key("k"))
        .await
        .unwrap();
    let claimed = claim(&outbox, 1).await;
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].0, "k1");
    outbox
        .mark_delivered(MarkDelivered {
            delete: false,
            id: "k1".into(),
            claim_token: claimed[0].1.clone(),
            now: t0() + secs(2),
        })
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let claimed = claim(&outbox, 3).await;
    let ids: Vec<_> = claimed.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["k2"]);
}

#[tokio::test]
async fn an_enqueue_open_while_its_keys_head_is_delivered_is_the_next_head() {
    enqueue_while_the_head_is_delivered("READ COMMITTED").await;
}

#[tokio::test]
async fn an_enqueue_under_repeatable_read_while_its_keys_head_is_delivered_is_the_next_head() {
    enqueue_while_the_head_is_delivered("REPEATABLE READ").await;
}

/// The keys of `table` that hold a row in its keys table.
async fn key_rows(pool: &sqlx::PgPool, table: &str) -> Vec<String> {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT ordering_key FROM \"{table}_keys\" ORDER BY ordering_key"
    )))
    .fetch_all(pool)
    .await
    .unwrap()
}

/// A key's row (what its writers lock to take turns) stays while the key
/// is used, and the store's vacuum deletes it once the key has nothing
/// pending or claimed, whether delivered rows are kept or deleted: keys
/// that are entities do not grow the table without bound. A key used
/// again after its row went gets one again, and its messages still go in
/// order.
#[tokio::test]
async fn the_vacuum_deletes_the_rows_of_keys_with_nothing_pending_or_claimed() {
    let pool = pool().await;
    for delete in [false, true] {
        let table = unique("keyrows");
        let outbox = store(&pool, &table, SettlementMode::default()).await;
        for (id, key) in [("a1", "a"), ("a2", "a"), ("b1", "b")] {
            outbox
                .enqueue(event(id, 1, t0()).with_ordering_key(key))
                .await
                .unwrap();
        }
        assert_eq!(key_rows(&pool, &table).await, ["a", "b"]);
        let deliver = |claimed: Vec<(String, String)>, now: i64| {
            let outbox = outbox.clone();
            async move {
                for (id, claim_token) in claimed {
                    outbox
                        .mark_delivered(MarkDelivered {
                            delete,
                            id,
                            claim_token,
                            now: t0() + secs(now),
                        })
                        .await
                        .unwrap();
                }
            }
        };
        // The heads a1 and b1: b has nothing left, a has a2.
        deliver(claim(&outbox, 1).await, 1).await;
        assert_eq!(
            key_rows(&pool, &table).await,
            ["a", "b"],
            "delete: {delete}"
        );
        outbox.vacuum().await.unwrap();
        assert_eq!(key_rows(&pool, &table).await, ["a"], "delete: {delete}");
        deliver(claim(&outbox, 2).await, 2).await;
        outbox.vacuum().await.unwrap();
        assert!(key_rows(&pool, &table).await.is_empty(), "delete: {delete}");

        for id in ["b2", "b3"] {
            outbox
                .enqueue(event(id, 3, t0()).with_ordering_key("b"))
                .await
                .unwrap();
        }
        assert_eq!(key_rows(&pool, &table).await, ["b"]);
        let claimed = claim(&outbox, 4).await;
        let ids: Vec<_> = claimed.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, ["b2"]);
    }
}

/// Enqueues of a few keys, each in a transaction of its own, race a drain
/// that delivers each key's head as soon as it can and vacuums often, so
/// enqueues commit while their key's row is being deleted and inserted
/// again. Every message is delivered, each key's in enqueue order, and
/// the last vacuum leaves no key's row behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueues_racing_the_deliveries_of_their_keys_keep_order_and_leave_no_rows() {
    const KEYS: usize = 4;
    const PER_KEY: usize = 150;
    let pool = pool().await;
    let table = unique("keyrace");
    let outbox = store(&pool, &table, SettlementMode::default()).await;
    let producer = {
        let outbox = outbox.clone();
        tokio::spawn(async move {
            for seq in 0..PER_KEY {
                for key in 0..KEYS {
                    let id = format!("k{key}-{seq:03}");
                    outbox
                        .enqueue(event(&id, seq as u64, t0()).with_ordering_key(format!("k{key}")))
                        .await
                        .unwrap();
                }
            }
        })
    };
    let mut delivered: Vec<Vec<String>> = vec![Vec::new(); KEYS];
    let mut claims = 0;
    while delivered.iter().map(Vec::len).sum::<usize>() < KEYS * PER_KEY {
        claims += 1;
        assert!(
            claims < 100_000,
            "gave up with {:?} delivered per key",
            delivered.iter().map(Vec::len).collect::<Vec<_>>()
        );
        for (id, claim_token) in claim(&outbox, 1).await {
            outbox
                .mark_delivered(MarkDelivered {
                    delete: claims % 2 == 0,
                    id: id.clone(),
                    claim_token,
                    now: t0() + secs(1),
                })
                .await
                .unwrap();
            let key: usize = id[1..2].parse().unwrap();
            delivered[key].push(id);
        }
        if claims % 8 == 0 {
            outbox.vacuum().await.unwrap();
        }
    }
    producer.await.unwrap();
    for (key, ids) in delivered.iter().enumerate() {
        let expected: Vec<String> = (0..PER_KEY).map(|seq| format!("k{key}-{seq:03}")).collect();
        assert_eq!(ids, &expected, "key k{key}");
    }
    outbox.vacuum().await.unwrap();
    assert!(key_rows(&pool, &table).await.is_empty());
}

/// Two batches of the same new keys, enqueued at once in opposite orders:
/// each commit inserts its keys' rows in its batch's order, so without
/// care each would wait for a row the other inserted, a deadlock the
/// server ends by failing one. Both are stored, each message once.
#[tokio::test]
async fn batches_of_the_same_new_keys_in_opposite_orders_are_both_stored() {
    const KEYS: usize = 300;
    let pool = pool().await;
    let outbox = store(&pool, &unique("opposite"), SettlementMode::default()).await;
    for round in 0..3 {
        let batch = |side: &str| -> Vec<outbox::NewMessage> {
            (0..KEYS)
                .map(|n| {
                    event(&format!("{side}{round}-{n}"), n as u64, t0())
                        .with_ordering_key(format!("key{round}-{n}"))
                })
                .collect()
        };
        let mut reversed = batch("b");
        reversed.reverse();
        let (forward, backward) = tokio::join!(
            outbox.enqueue_batch(batch("a")),
            outbox.enqueue_batch(reversed)
        );
        let stored = |answers: outbox::Result<Vec<outbox::Enqueued>>| {
            let answers = answers.expect("the batch is stored");
            assert!(answers.iter().all(outbox::Enqueued::is_inserted));
            answers.len()
        };
        assert_eq!(
            stored(forward) + stored(backward),
            2 * KEYS,
            "round {round}"
        );
    }
}
