//! Settlement statements: how many may be in flight, and each message's
//! writes applied in call order however many are.

use outbox::{ClaimBatch, Error, MarkDelivered, OutboxAdmin, OutboxStore, PostgresOutbox};

use crate::pool;
use crate::sql_support::{LEASE, event, secs, t0, unique};

#[tokio::test]
async fn settlement_statements_must_fit_the_pool() {
    let pool = pool().await;
    for statements in [0, 5] {
        let error = PostgresOutbox::builder(pool.clone())
            .settlement_statements(statements)
            .unwrap_err();
        assert!(
            matches!(
                error,
                Error::InvalidInput {
                    field: "settlement_statements",
                    ..
                }
            ),
            "{error}"
        );
        assert!(error.to_string().contains("max_connections (4)"), "{error}");
    }
    PostgresOutbox::builder(pool)
        .settlement_statements(4)
        .unwrap();
}

/// Settlement statements in flight together still apply each message's
/// writes in call order: a delivery and a release of one claim, sent
/// together, deliver it and refuse the release, for every message.
#[tokio::test]
async fn concurrent_settlement_statements_keep_each_messages_writes_in_order() {
    let pool = pool().await;
    let table = unique("inflight");
    let outbox = PostgresOutbox::builder(pool.clone())
        .table(&table)
        .unwrap()
        .settlement_statements(3)
        .unwrap()
        .caller_clock(true)
        .build();
    outbox.setup().await.unwrap();
    for n in 0..300 {
        outbox
            .enqueue(event(&format!("m{n}"), n, t0()))
            .await
            .unwrap();
    }
    let batch = outbox
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: 300,
            now: t0(),
            lease: LEASE,
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
            queues: Vec::new(),
            durable: true,
        })
        .await
        .unwrap();
    assert_eq!(batch.claimed.len(), 300);
    let now = t0() + secs(1);
    let writes = batch.claimed.iter().map(|message| {
        let outbox = outbox.clone();
        let (id, claim_token) = (message.id.clone(), message.claim_token.clone());
        async move {
            let deliver = outbox.mark_delivered(MarkDelivered {
                id: id.clone(),
                claim_token: claim_token.clone(),
                now,
                delete: false,
            });
            let release = outbox.release_claim(outbox::ReleaseClaim {
                id,
                claim_token,
                now,
            });
            let (delivered, released) = futures_util::future::join(deliver, release).await;
            (
                delivered.is_ok(),
                released.is_err_and(|e| e.is_claim_lost()),
            )
        }
    });
    let results = futures_util::future::join_all(writes).await;
    assert!(results.iter().all(|r| *r == (true, true)), "{results:?}");
    let stats = outbox.stats(now).await.unwrap();
    assert_eq!((stats.delivered, stats.pending), (300, 0));
}

/// A claim is a round trip (and, durable, a flush): a drain sizing itself
/// claims ahead, and keeps as many claims in flight as the pool has
/// connections beside the settlement statements and one for the
/// application, one at least and four at most.
#[tokio::test]
async fn a_self_sizing_drain_claims_ahead_within_the_pool() {
    let small = pool().await; // four connections
    for (statements, claims) in [(1, 2), (2, 1), (3, 1)] {
        let store = PostgresOutbox::builder(small.clone())
            .settlement_statements(statements)
            .unwrap()
            .build();
        assert!(store.claims_ahead());
        assert_eq!(store.claim_parallelism(), claims, "{statements} statements");
    }
    let large = sqlx::postgres::PgPoolOptions::new()
        .max_connections(16)
        .connect_lazy_with(small.connect_options().as_ref().clone());
    let store = PostgresOutbox::builder(large).build();
    assert_eq!(store.claim_parallelism(), 4);
}
