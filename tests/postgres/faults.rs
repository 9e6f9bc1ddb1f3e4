//! Faults: a backend killed mid-claim or mid-settlement is a transient error,
//! and the pool recovers.

use outbox::{ClaimBatch, Error, MarkDelivered, OutboxAdmin, OutboxStore, SettlementMode};
use sqlx::AssertSqlSafe;

use crate::sql_support::{LEASE, event, secs, t0, unique};
use crate::{backends, eventually, pool_named, store};

/// A backend killed in the middle of a claim or a settlement is a transient
/// store error, never a claim loss; the pool recovers and nothing is lost.
#[tokio::test]
async fn killed_connections_are_transient_and_the_pool_recovers() {
    let name = unique("killed");
    let pool = pool_named(&name).await;
    let outbox = store(&pool, &name, SettlementMode::default()).await;
    let admin = pool_named("outbox-tests-admin").await;
    for i in 0..3 {
        outbox
            .enqueue(event(&format!("m{i}"), i, t0()))
            .await
            .unwrap();
    }
    let kill_waiting = || async {
        let waiting = backends(&admin, &name, "wait_event_type = 'Lock'").await;
        for pid in &waiting {
            sqlx::query("SELECT pg_terminate_backend($1)")
                .bind(pid)
                .execute(&admin)
                .await
                .unwrap();
        }
        !waiting.is_empty()
    };

    // A claim stuck behind a table lock, killed.
    let mut locker = admin.begin().await.unwrap();
    sqlx::query(AssertSqlSafe(format!(
        "LOCK TABLE {name} IN ACCESS EXCLUSIVE MODE"
    )))
    .execute(&mut *locker)
    .await
    .unwrap();
    let claim = tokio::spawn({
        let outbox = outbox.clone();
        async move {
            outbox
                .claim_batch(ClaimBatch {
                    on_dead_letter: Default::default(),
                    limit: 2,
                    now: t0(),
                    lease: LEASE,
                    max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
                    queues: Vec::new(),
                    durable: true,
                })
                .await
        }
    });
    eventually("the claim waits for the lock", kill_waiting).await;
    let e = claim.await.unwrap().unwrap_err();
    assert!(
        matches!(
            e,
            Error::Store {
                operation: "claim_batch",
                ..
            }
        ),
        "{e:?}"
    );
    locker.rollback().await.unwrap();

    let batch = outbox
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: 2,
            now: t0(),
            lease: LEASE,
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
            queues: Vec::new(),
            durable: true,
        })
        .await
        .unwrap();
    assert_eq!(batch.claimed.len(), 2);
    let first = batch.claimed[0].clone();

    // A settlement stuck behind a row lock, killed: not a claim loss.
    let mut locker = admin.begin().await.unwrap();
    sqlx::query(AssertSqlSafe(format!(
        "SELECT 1 FROM {name} WHERE id = $1 FOR UPDATE"
    )))
    .bind(&first.id)
    .execute(&mut *locker)
    .await
    .unwrap();
    let settle = tokio::spawn({
        let (outbox, first) = (outbox.clone(), first.clone());
        async move {
            outbox
                .mark_delivered(MarkDelivered {
                    delete: false,
                    id: first.id,
                    claim_token: first.claim_token,
                    now: t0() + secs(1),
                })
                .await
        }
    });
    eventually("the settlement waits for the row", kill_waiting).await;
    let e = settle.await.unwrap().unwrap_err();
    assert!(
        matches!(
            e,
            Error::Store {
                operation: "mark_delivered",
                ..
            }
        ),
        "{e:?}"
    );
    assert!(!e.is_claim_lost());
    locker.rollback().await.unwrap();

    // Idle connections killed behind the pool's back.
    for pid in backends(&admin, &name, "state = 'idle'").await {
        sqlx::query("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .execute(&admin)
            .await
            .unwrap();
    }
    let retry = MarkDelivered {
        delete: false,
        id: first.id.clone(),
        claim_token: first.claim_token.clone(),
        now: t0() + secs(2),
    };
    if let Err(e) = outbox.mark_delivered(retry.clone()).await {
        assert!(matches!(e, Error::Store { .. }), "{e:?}");
        outbox.mark_delivered(retry).await.unwrap();
    }
    let stats = outbox.stats(t0() + secs(2)).await.unwrap();
    assert_eq!((stats.delivered, stats.claimed, stats.pending), (1, 1, 1));
}
