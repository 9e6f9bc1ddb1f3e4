//! What the SQLite and PostgreSQL tests share: the contract every SQL store
//! keeps beyond the store port ([`sql_conformance_suite!`]), and a scripted
//! sequence of settlements whose outcomes must not depend on how they reach
//! the database.
#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use futures_util::future::join_all;
use outbox::{
    ClaimBatch, ErrorRecord, Event, MarkDelivered, MarkFailed, MessageKind, NewMessage,
    OutboxAdmin, OutboxStore, Payload, ReleaseClaim, RenewClaim,
};

/// A fixed point on the caller's clock; tests pass `now` explicitly.
pub fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2030, 1, 1, 12, 0, 0).unwrap()
}

pub fn secs(n: i64) -> chrono::Duration {
    chrono::Duration::seconds(n)
}

pub const LEASE: Duration = Duration::from_secs(30);

/// An event named `name` with payload `{"n": n}`, enqueued at `now`.
pub fn event(id: &str, n: u64, now: DateTime<Utc>) -> NewMessage {
    NewMessage::new(
        MessageKind::Event,
        "test.event",
        Payload::from(serde_json::json!({ "n": n })),
    )
    .with_id(id)
    .at(now)
}

/// The business event of the transactional enqueue tests.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct OrderPlaced {
    pub order_id: i64,
}

impl Event for OrderPlaced {
    const NAME: &'static str = "order.placed";
}

/// A short random suffix, so parallel tests use tables of their own.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}

fn outcome(result: outbox::Result<impl std::fmt::Debug>) -> String {
    match result {
        Ok(_) => "ok".to_owned(),
        Err(outbox::Error::Claim(e)) => format!("claim lost: {:?}", e.reason),
        Err(e) => format!("error: {e}"),
    }
}

/// Run the same script on `store`: claim eight messages, then settle them
/// concurrently (so a batching store sends them together), with lost claims
/// and deliveries that delete in the middle, then settle again. Returns every outcome and the final
/// state of every message, free of tokens and other per-run values.
pub async fn settlement_script<S: OutboxStore + OutboxAdmin>(store: &S) -> Vec<String> {
    let now = t0();
    for i in 0..8 {
        store
            .enqueue(event(&format!("m{i}"), i, now + secs(i as i64)))
            .await
            .unwrap();
    }
    let batch = store
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: 10,
            now: now + secs(10),
            lease: LEASE,
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
            queues: Vec::new(),
            durable: true,
        })
        .await
        .unwrap();
    assert_eq!(batch.claimed.len(), 8);
    let token = |i: usize| batch.claimed[i].claim_token.clone();
    let id = |i: usize| batch.claimed[i].id.clone();
    let at = now + secs(20);
    let failure = ErrorRecord::new("test::Failure", "handler failed");

    let round_one = join_all(vec![
        Box::pin(async {
            outcome(
                store
                    .mark_delivered(MarkDelivered {
                        delete: false,
                        id: id(0),
                        claim_token: token(0),
                        now: at,
                    })
                    .await,
            )
        }) as std::pin::Pin<Box<dyn std::future::Future<Output = String>>>,
        Box::pin(async {
            outcome(
                store
                    .mark_delivered(MarkDelivered {
                        delete: false,
                        id: id(1),
                        claim_token: "not-the-token".into(),
                        now: at,
                    })
                    .await,
            )
        }),
        Box::pin(async {
            outcome(
                store
                    .renew_claim(RenewClaim {
                        id: id(2),
                        claim_token: token(2),
                        now: at,
                        lease: LEASE,
                    })
                    .await,
            )
        }),
        Box::pin(async {
            outcome(
                store
                    .mark_failed(MarkFailed {
                        id: id(3),
                        claim_token: token(3),
                        error: failure.clone(),
                        dead_letter: false,
                        now: at,
                        retry_at: Some(at + secs(60)),
                    })
                    .await,
            )
        }),
        Box::pin(async {
            outcome(
                store
                    .release_claim(ReleaseClaim {
                        id: id(4),
                        claim_token: token(4),
                        now: at,
                    })
                    .await,
            )
        }),
        Box::pin(async {
            // Past the lease: the claim is lost even though nobody took it.
            outcome(
                store
                    .mark_delivered(MarkDelivered {
                        delete: false,
                        id: id(5),
                        claim_token: token(5),
                        now: now + secs(41),
                    })
                    .await,
            )
        }),
        Box::pin(async {
            outcome(
                store
                    .mark_delivered(MarkDelivered {
                        delete: false,
                        id: "missing".into(),
                        claim_token: "t".into(),
                        now: at,
                    })
                    .await,
            )
        }),
        Box::pin(async {
            outcome(
                store
                    .mark_delivered(MarkDelivered {
                        id: id(6),
                        claim_token: token(6),
                        now: at,
                        delete: true,
                    })
                    .await,
            )
        }),
        Box::pin(async {
            outcome(
                store
                    .mark_delivered(MarkDelivered {
                        id: id(7),
                        claim_token: "not-the-token".into(),
                        now: at,
                        delete: true,
                    })
                    .await,
            )
        }),
    ])
    .await;

    let later = at + secs(5);
    let round_two = join_all(vec![
        Box::pin(async {
            outcome(
                store
                    .mark_delivered(MarkDelivered {
                        delete: false,
                        id: id(0),
                        claim_token: token(0),
                        now: later,
                    })
                    .await,
            )
        }) as std::pin::Pin<Box<dyn std::future::Future<Output = String>>>,
        Box::pin(async {
            outcome(
                store
                    .mark_failed(MarkFailed {
                        id: id(2),
                        claim_token: token(2),
                        error: failure.clone(),
                        dead_letter: true,
                        now: later,
                        retry_at: None,
                    })
                    .await,
            )
        }),
        Box::pin(async {
            outcome(
                store
                    .mark_delivered(MarkDelivered {
                        delete: false,
                        id: id(1),
                        claim_token: token(1),
                        now: later,
                    })
                    .await,
            )
        }),
        Box::pin(async {
            outcome(
                store
                    .mark_delivered(MarkDelivered {
                        id: id(6),
                        claim_token: token(6),
                        now: later,
                        delete: true,
                    })
                    .await,
            )
        }),
        Box::pin(async {
            outcome(
                store
                    .mark_delivered(MarkDelivered {
                        id: id(7),
                        claim_token: token(7),
                        now: later,
                        delete: true,
                    })
                    .await,
            )
        }),
    ])
    .await;

    let mut log: Vec<String> = round_one.into_iter().chain(round_two).collect();
    for i in 0..8 {
        let m = match store.get_message(&format!("m{i}")).await {
            Err(outbox::Error::NotFound { .. }) => {
                log.push(format!("m{i}: deleted"));
                continue;
            }
            found => found.unwrap(),
        };
        log.push(format!(
            "m{i}: {} attempts={} available_at={} locked_until={:?} token={} delivered_at={:?} \
             updated_at={} last_error={:?}",
            m.status,
            m.attempts,
            m.available_at,
            m.locked_until,
            m.claim_token.is_some(),
            m.delivered_at,
            m.updated_at,
            m.last_error.map(|e| e.type_name),
        ));
    }
    log
}

/// Expands to the contract every SQL store keeps beyond the store port, one
/// `#[tokio::test]` per case:
///
/// - `store`: the store type;
/// - `database`: an `async fn() -> (G, Pool)`, a database of the test's own
///   and a guard that keeps it while the test runs;
/// - `open`: an `async fn(&Pool, table, SettlementMode) -> store`, set up;
/// - `tx_table`: the outbox table of the transactional enqueue test;
/// - `orders`: an `fn() -> (name, create, insert)`: a business table of
///   `id`s, the statement that creates it, and an insert binding one `i64`;
/// - `hostile_names`: table names the builder must refuse;
/// - `nothing_created` (optional): an `async fn(&Pool)` asserting the
///   refused names left no trace in the database.
macro_rules! sql_conformance_suite {
    (
        store: $store:ty,
        database: $database:path,
        open: $open:path,
        tx_table: $tx_table:expr,
        orders: $orders:path,
        hostile_names: [$($hostile:expr),* $(,)?],
        $(nothing_created: $nothing_created:path,)?
    ) => {
        #[tokio::test]
        async fn a_duplicate_enqueue_keeps_the_transaction_and_its_business_rows() {
            use outbox::{Enqueued, MessageKind, NewMessage, OutboxAdmin, Payload, SettlementMode};
            use sqlx::AssertSqlSafe;

            let (_database, pool) = $database().await;
            let outbox = $open(&pool, &$tx_table, SettlementMode::default()).await;
            let (orders, create_orders, insert_order) = $orders();
            sqlx::query(AssertSqlSafe(create_orders))
                .execute(&pool)
                .await
                .unwrap();
            let order = |n: i64| NewMessage::new(
                MessageKind::Event,
                "order.placed",
                Payload::from(serde_json::json!({ "order_id": n })),
            );
            assert_eq!(
                outbox.enqueue(order(1).with_id("order-1")).await.unwrap(),
                Enqueued::Inserted("order-1".to_owned())
            );

            // A business row, the duplicate, another business row and a fresh
            // message, all in one transaction: every statement after the
            // duplicate still runs, and the commit keeps them all.
            let mut tx = pool.begin().await.unwrap();
            sqlx::query(AssertSqlSafe(insert_order.clone()))
                .bind(10_i64)
                .execute(&mut *tx)
                .await
                .unwrap();
            let duplicate = outbox
                .enqueue_in(&mut tx, order(2).with_id("order-1"))
                .await
                .unwrap();
            assert_eq!(duplicate, Enqueued::AlreadyExists("order-1".to_owned()));
            assert_eq!(duplicate.id(), "order-1");
            sqlx::query(AssertSqlSafe(insert_order.clone()))
                .bind(11_i64)
                .execute(&mut *tx)
                .await
                .unwrap();
            let fresh = outbox
                .enqueue_in(&mut tx, order(3).with_id("order-3"))
                .await
                .unwrap();
            assert!(fresh.is_inserted());
            tx.commit().await.unwrap();

            let count = |sql: String| {
                let pool = pool.clone();
                async move {
                    sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql))
                        .fetch_one(&pool)
                        .await
                        .unwrap()
                }
            };
            assert_eq!(
                count(format!("SELECT count(*) FROM {orders} WHERE id IN (10, 11)")).await,
                2,
                "both business rows committed"
            );
            let stored = outbox.get_message("order-1").await.unwrap();
            assert_eq!(stored.payload.to_value()["order_id"], 1, "left untouched");
            assert_eq!(
                outbox.get_message("order-3").await.unwrap().payload.to_value()["order_id"],
                3
            );
        }

        #[tokio::test]
        async fn a_batch_with_duplicate_ids_keeps_the_transaction_and_its_business_rows() {
            use $crate::sql_support::OrderPlaced;
            use outbox::{Enqueued, MessageKind, NewMessage, OutboxAdmin, Payload, SettlementMode};
            use sqlx::AssertSqlSafe;

            let (_database, pool) = $database().await;
            let outbox = $open(&pool, &$tx_table, SettlementMode::default()).await;
            let (orders, create_orders, insert_order) = $orders();
            sqlx::query(AssertSqlSafe(create_orders))
                .execute(&pool)
                .await
                .unwrap();
            let order = |n: i64, id: &str| {
                NewMessage::new(
                    MessageKind::Event,
                    "order.placed",
                    Payload::from(serde_json::json!({ "order_id": n })),
                )
                .with_id(id)
            };
            assert!(outbox.enqueue(order(1, "order-1")).await.unwrap().is_inserted());

            // A business row, a batch holding an id already stored and an id
            // twice, another business row and a second batch: every
            // statement after the duplicates still runs, and the commit
            // keeps them all.
            let mut tx = pool.begin().await.unwrap();
            sqlx::query(AssertSqlSafe(insert_order.clone()))
                .bind(30_i64)
                .execute(&mut *tx)
                .await
                .unwrap();
            let answers = outbox
                .enqueue_batch_in(
                    &mut tx,
                    vec![
                        order(2, "order-2"),
                        order(3, "order-1"),
                        order(4, "order-2"),
                        order(5, "order-5"),
                    ],
                )
                .await
                .unwrap();
            assert_eq!(
                answers,
                [
                    Enqueued::Inserted("order-2".to_owned()),
                    Enqueued::AlreadyExists("order-1".to_owned()),
                    Enqueued::AlreadyExists("order-2".to_owned()),
                    Enqueued::Inserted("order-5".to_owned()),
                ]
            );
            sqlx::query(AssertSqlSafe(insert_order.clone()))
                .bind(31_i64)
                .execute(&mut *tx)
                .await
                .unwrap();
            let typed = outbox
                .enqueue_events_in(&mut tx, &[OrderPlaced { order_id: 6 }, OrderPlaced { order_id: 7 }])
                .await
                .unwrap();
            assert!(typed.iter().all(Enqueued::is_inserted));
            tx.commit().await.unwrap();

            let rows: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
                "SELECT count(*) FROM {orders} WHERE id IN (30, 31)"
            )))
            .fetch_one(&pool)
            .await
            .unwrap();
            assert_eq!(rows, 2, "both business rows committed");
            let payload = |id: &str| {
                let outbox = outbox.clone();
                let id = id.to_owned();
                async move {
                    outbox.get_message(&id).await.unwrap().payload.to_value()["order_id"].clone()
                }
            };
            assert_eq!(payload("order-1").await, 1, "left untouched");
            assert_eq!(payload("order-2").await, 2, "the first of the batch's two");
            assert_eq!(payload("order-5").await, 5);
            assert_eq!(payload(typed[1].id()).await, 7);
            let stats = outbox.stats(chrono::Utc::now()).await.unwrap();
            assert_eq!(stats.pending, 5);

            // Rolled back, a batch leaves nothing.
            let mut tx = pool.begin().await.unwrap();
            let answers = outbox
                .enqueue_batch_in(&mut tx, vec![order(8, "order-8"), order(9, "order-9")])
                .await
                .unwrap();
            assert!(answers.iter().all(Enqueued::is_inserted));
            tx.rollback().await.unwrap();
            assert_eq!(outbox.stats(chrono::Utc::now()).await.unwrap().pending, 5);
            assert!(outbox.get_message("order-8").await.is_err());
        }

        #[tokio::test]
        async fn an_idempotent_enqueue_in_a_transaction_keeps_it_and_its_business_rows() {
            use $crate::sql_support::OrderPlaced;
            use outbox::{EnqueueOptions, Enqueued, OutboxAdmin, SettlementMode};
            use sqlx::AssertSqlSafe;
            use std::time::Duration;

            let (_database, pool) = $database().await;
            let outbox = $open(&pool, &$tx_table, SettlementMode::default()).await;
            let (orders, create_orders, insert_order) = $orders();
            sqlx::query(AssertSqlSafe(create_orders))
                .execute(&pool)
                .await
                .unwrap();
            let options = || {
                EnqueueOptions::new()
                    .idempotency_key("order-20-placed", Duration::from_secs(3600))
                    .ordering_key("order-20")
                    .delay(Duration::from_secs(5))
            };
            let mut tx = pool.begin().await.unwrap();
            let first = outbox
                .enqueue_event_with(&mut tx, &OrderPlaced { order_id: 20 }, options())
                .await
                .unwrap();
            assert!(first.is_inserted());
            tx.commit().await.unwrap();

            // The retried request: its business row and a second enqueue
            // with the same key, which finds the first and writes nothing.
            let mut tx = pool.begin().await.unwrap();
            sqlx::query(AssertSqlSafe(insert_order.clone()))
                .bind(20_i64)
                .execute(&mut *tx)
                .await
                .unwrap();
            let again = outbox
                .enqueue_event_with(&mut tx, &OrderPlaced { order_id: 20 }, options())
                .await
                .unwrap();
            assert_eq!(again, Enqueued::AlreadyExists(first.id().to_owned()));
            sqlx::query(AssertSqlSafe(insert_order.clone()))
                .bind(21_i64)
                .execute(&mut *tx)
                .await
                .unwrap();
            tx.commit().await.unwrap();

            let rows: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
                "SELECT count(*) FROM {orders} WHERE id IN (20, 21)"
            )))
            .fetch_one(&pool)
            .await
            .unwrap();
            assert_eq!(rows, 2, "both business rows committed");
            let stats = outbox.stats(chrono::Utc::now()).await.unwrap();
            assert_eq!(stats.pending, 1, "one message for the two enqueues");
            let stored = outbox.get_message(first.id()).await.unwrap();
            assert_eq!(stored.ordering_key.as_deref(), Some("order-20"));
            assert!(stored.available_at > stored.created_at);
        }

        #[tokio::test]
        async fn transactional_enqueue_commits_or_vanishes_with_the_business_rows() {
            use $crate::sql_support::OrderPlaced;
            use outbox::{
                ClaimBatch, Clock, Error, MessageStatus, NewMessage, OutboxAdmin, OutboxStore,
                SettlementMode,
            };
            use sqlx::AssertSqlSafe;

            let (_database, pool) = $database().await;
            let outbox = $open(&pool, &$tx_table, SettlementMode::default()).await;
            let (orders, create_orders, insert_order) = $orders();
            sqlx::query(AssertSqlSafe(create_orders))
                .execute(&pool)
                .await
                .unwrap();

            // Rolled back: neither the order nor its event.
            let mut tx = pool.begin().await.unwrap();
            sqlx::query(AssertSqlSafe(insert_order.clone()))
                .bind(1_i64)
                .execute(&mut *tx)
                .await
                .unwrap();
            let rolled_back = outbox
                .enqueue_event_in(&mut tx, &OrderPlaced { order_id: 1 })
                .await
                .unwrap()
                .into_id();
            tx.rollback().await.unwrap();
            assert!(matches!(
                outbox.get_message(&rolled_back).await,
                Err(Error::NotFound { .. })
            ));

            // A failure after the enqueue drops the transaction: still neither.
            {
                let mut tx = pool.begin().await.unwrap();
                sqlx::query(AssertSqlSafe(insert_order.clone()))
                    .bind(2_i64)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                outbox
                    .enqueue_in(
                        &mut tx,
                        NewMessage::event(&OrderPlaced { order_id: 2 })
                            .unwrap()
                            .with_id("o2"),
                    )
                    .await
                    .unwrap();
                let failed = sqlx::query(AssertSqlSafe(insert_order.clone()))
                    .bind(2_i64)
                    .execute(&mut *tx)
                    .await;
                assert!(failed.is_err());
            }
            assert!(matches!(
                outbox.get_message("o2").await,
                Err(Error::NotFound { .. })
            ));

            // Committed: both, and the event is claimable at once.
            let mut tx = pool.begin().await.unwrap();
            sqlx::query(AssertSqlSafe(insert_order.clone()))
                .bind(3_i64)
                .execute(&mut *tx)
                .await
                .unwrap();
            let committed = outbox
                .enqueue_event_in(&mut tx, &OrderPlaced { order_id: 3 })
                .await
                .unwrap()
                .into_id();
            tx.commit().await.unwrap();
            let ids: Vec<i64> =
                sqlx::query_scalar(AssertSqlSafe(format!("SELECT id FROM {orders}")))
                    .fetch_all(&pool)
                    .await
                    .unwrap();
            assert_eq!(ids, [3]);
            let batch = outbox
                .claim_batch(ClaimBatch {
 on_dead_letter: Default::default(),
                    limit: 10,
                    now: outbox::SystemClock.now(),
                    lease: $crate::sql_support::LEASE,
                    max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
                    queues: Vec::new(),
                    durable: true,
                })
                .await
                .unwrap();
            assert_eq!(batch.claimed.len(), 1);
            assert_eq!(batch.claimed[0].id, committed);
            assert_eq!(
                batch.claimed[0]
                    .payload
                    .decode::<OrderPlaced>()
                    .unwrap()
                    .order_id,
                3
            );

            // On a plain pool connection, outside any transaction.
            let mut conn = pool.acquire().await.unwrap();
            outbox
                .enqueue_in(
                    &mut conn,
                    $crate::sql_support::event("plain", 1, $crate::sql_support::t0()),
                )
                .await
                .unwrap();
            drop(conn);
            assert_eq!(
                outbox.get_message("plain").await.unwrap().status,
                MessageStatus::Pending
            );
        }

        /// Batched and per-message settlement decide every row the same way,
        /// and the same way as the reference store.
        #[tokio::test]
        async fn batched_and_per_message_settlement_give_identical_outcomes() {
            use std::time::Duration;

            use $crate::sql_support::{settlement_script, unique};
            use outbox::{MemoryOutbox, SettlementMode};

            let (_database, pool) = $database().await;
            let per_message = $open(&pool, &unique("single"), SettlementMode::PerMessage).await;
            let batched = $open(
                &pool,
                &unique("batched"),
                // A window long enough that every concurrent call lands in one batch.
                SettlementMode::Batched {
                    window: Duration::from_millis(50),
                    max_rows: 128,
                },
            )
            .await;
            let small_batches = $open(
                &pool,
                &unique("small"),
                SettlementMode::Batched {
                    window: Duration::from_millis(50),
                    max_rows: 2,
                },
            )
            .await;
            let reference = settlement_script(&MemoryOutbox::new()).await;
            let single = settlement_script(&per_message).await;
            let together = settlement_script(&batched).await;
            let split = settlement_script(&small_batches).await;
            println!("{}", reference.join("\n"));
            assert_eq!(single, reference);
            assert_eq!(together, reference);
            assert_eq!(split, reference);
        }

        #[tokio::test]
        async fn hostile_table_names_are_refused_before_any_sql() {
            use outbox::Error;

            let (_database, pool) = $database().await;
            for name in [$($hostile),*] {
                match <$store>::builder(pool.clone()).table(name) {
                    Err(Error::InvalidTableName {
                        name: refused,
                        reason,
                    }) => {
                        assert_eq!(refused, name);
                        assert!(!reason.is_empty());
                    }
                    other => panic!("{name:?} was not refused: {other:?}"),
                }
            }
            $($nothing_created(&pool).await;)?
        }
    };
}
pub(crate) use sql_conformance_suite;
