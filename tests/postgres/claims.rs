//! Claims: concurrent claimers never share a message, and messages out of
//! attempts are dead-lettered by the claim.

use outbox::{
    ClaimBatch, ClaimLoss, Error, MarkDelivered, MessageStatus, OutboxAdmin, OutboxStore,
    SettlementMode,
};
use sqlx::{AssertSqlSafe, Row};

use crate::sql_support::{LEASE, event, secs, t0, unique};
use crate::{pool, store};

/// Concurrent claimers skip each other's rows: every message is claimed
/// exactly once.
#[tokio::test]
async fn concurrent_claims_never_take_the_same_message() {
    let pool = pool().await;
    let table = unique("skip");
    let outbox = store(&pool, &table, SettlementMode::default()).await;
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {table} (id, kind, name, payload, max_attempts, available_at, created_at, \
           updated_at) \
         SELECT 'm' || i, 'event', 'n', '{{}}', 5, $1, $1, $1 FROM generate_series(1, 600) AS i"
    )))
    .bind(t0())
    .execute(&pool)
    .await
    .unwrap();
    let claimers = (0..6).map(|_| {
        let outbox = outbox.clone();
        tokio::spawn(async move {
            let mut ids = Vec::new();
            loop {
                let batch = outbox
                    .claim_batch(ClaimBatch {
                        on_dead_letter: Default::default(),
                        limit: 7,
                        now: t0(),
                        lease: LEASE,
                        max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
                        queues: Vec::new(),
                        durable: true,
                    })
                    .await
                    .unwrap();
                if batch.is_empty() {
                    return ids;
                }
                ids.extend(batch.claimed.into_iter().map(|m| m.id));
            }
        })
    });
    let mut all: Vec<String> = Vec::new();
    for claimer in claimers.collect::<Vec<_>>() {
        all.extend(claimer.await.unwrap());
    }
    let total = all.len();
    all.sort();
    all.dedup();
    assert_eq!((total, all.len()), (600, 600));
}

#[tokio::test]
async fn messages_out_of_attempts_are_dead_lettered_by_the_claim() {
    let pool = pool().await;
    let outbox = store(&pool, &unique("abandon"), SettlementMode::default()).await;
    outbox
        .enqueue(event("once", 1, t0()).with_max_attempts(1))
        .await
        .unwrap();
    outbox
        .enqueue(event("fresh", 2, t0() + secs(1)))
        .await
        .unwrap();
    let first = outbox
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: 1,
            now: t0() + secs(1),
            lease: LEASE,
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
            queues: Vec::new(),
            durable: true,
        })
        .await
        .unwrap();
    assert_eq!(first.claimed[0].id, "once");
    // Its lease runs out unsettled; the next claim gives up on it.
    let later = t0() + secs(31);
    let second = outbox
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: 5,
            now: later,
            lease: LEASE,
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
            queues: Vec::new(),
            durable: true,
        })
        .await
        .unwrap();
    assert_eq!(second.claimed.len(), 1);
    assert_eq!(second.claimed[0].id, "fresh");
    assert_eq!(second.dead_lettered.len(), 1);
    let dead = &second.dead_lettered[0];
    assert_eq!(
        (dead.id.as_str(), dead.status, dead.attempts),
        ("once", MessageStatus::DeadLettered, 1)
    );
    assert_eq!(dead.claim_token, None);
    assert_eq!(dead.updated_at, later);
    let record = dead.last_error.clone().unwrap();
    assert!(
        record.type_name.ends_with("AbandonedClaimError"),
        "{record:?}"
    );
    assert_eq!(
        outbox.get_message("once").await.unwrap().last_error,
        Some(record)
    );
    let stale = outbox
        .mark_delivered(MarkDelivered {
            delete: false,
            id: "once".into(),
            claim_token: first.claimed[0].claim_token.clone(),
            now: later,
        })
        .await
        .unwrap_err();
    match stale {
        Error::Claim(e) => assert_eq!(e.reason, ClaimLoss::NotClaimed),
        other => panic!("{other:?}"),
    }
    let row = sqlx::query(AssertSqlSafe(format!(
        "SELECT status FROM {} WHERE id = 'once'",
        outbox.table().quoted()
    )))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(row.get::<String, _>(0), "dead_lettered");
}
