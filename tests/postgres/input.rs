//! What PostgreSQL stores and refuses: payloads as JSON, and input it would
//! refuse caught before it can abort the caller's transaction.

use outbox::{Enqueued, Error, NewMessage, OutboxAdmin, OutboxStore, SettlementMode};
use sqlx::AssertSqlSafe;

use crate::sql_support::{event, t0, unique};
use crate::{orders, pool, store};

#[tokio::test]
async fn payloads_round_trip_as_json_and_bad_text_is_refused() {
    let pool = pool().await;
    let outbox = store(&pool, &unique("json"), SettlementMode::default()).await;
    let now = t0() + chrono::Duration::microseconds(654_321);
    let json = r#"{"z":1,"a":[true,null,"é"],"nested":{"b":2,"a":1}}"#;
    let message = NewMessage::new(
        outbox::MessageKind::Job,
        "exact",
        outbox::Payload::from_json(json).unwrap(),
    )
    .with_id("exact")
    .with_max_attempts(u32::MAX)
    .at(now);
    outbox.enqueue(message).await.unwrap();
    let stored = outbox.get_message("exact").await.unwrap();
    // jsonb may reorder keys; the value is the same.
    assert_eq!(
        stored.payload.to_value(),
        serde_json::from_str::<serde_json::Value>(json).unwrap()
    );
    assert_eq!(stored.created_at, now);
    assert_eq!(stored.max_attempts, u32::MAX);

    assert_eq!(
        outbox.enqueue(event("exact", 2, t0())).await.unwrap(),
        Enqueued::AlreadyExists("exact".to_owned())
    );
    let nul = NewMessage::new(
        outbox::MessageKind::Event,
        "nul",
        outbox::Payload::from_json(r#"{"s":"\u0000"}"#).unwrap(),
    );
    match outbox.enqueue(nul).await {
        Err(Error::InvalidInput { field, reason }) => {
            assert_eq!(field, "payload");
            assert!(reason.contains("PostgreSQL"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}

/// Input PostgreSQL would refuse is refused before it is sent, so the
/// caller's transaction goes on and commits its business rows.
#[tokio::test]
async fn input_postgres_refuses_is_refused_without_aborting_the_transaction() {
    let pool = pool().await;
    let outbox = store(&pool, &unique("refused"), SettlementMode::default()).await;
    let (orders, create_orders, insert_order) = orders();
    sqlx::query(AssertSqlSafe(create_orders))
        .execute(&pool)
        .await
        .unwrap();
    let raw = |json: &str| {
        NewMessage::new(
            outbox::MessageKind::Event,
            "refused",
            outbox::Payload::from_json(json).unwrap(),
        )
    };
    let mut tx = pool.begin().await.unwrap();
    sqlx::query(AssertSqlSafe(insert_order.clone()))
        .bind(1_i64)
        .execute(&mut *tx)
        .await
        .unwrap();
    let far_past = chrono::DateTime::<chrono::Utc>::MIN_UTC;
    let cases = [
        (raw("{}").with_id("nul\0id"), "id"),
        (
            NewMessage::new(
                outbox::MessageKind::Event,
                "nul\0name",
                serde_json::json!({}).into(),
            ),
            "name",
        ),
        (raw(r#"{"s":"a\u0000b"}"#), "payload"),
        (raw(r#"{"k\u0000":1}"#), "payload"),
        (raw(r#"["\ud800"]"#), "payload"),
        (raw(r#"["\udc00\ud800"]"#), "payload"),
        (raw("{}").at(far_past), "now"),
        (raw("{}").available_at(far_past), "available_at"),
    ];
    for (message, field) in cases {
        match outbox.enqueue_in(&mut tx, message.clone()).await {
            Err(Error::InvalidInput { field: f, reason }) => {
                assert_eq!(f, field);
                assert!(reason.contains("PostgreSQL"), "{reason}");
            }
            other => panic!("{field}: {other:?}"),
        }
        // In a batch, behind a good message: the whole batch is refused,
        // naming the message, and nothing is sent.
        let batch = vec![raw("{}").with_id("fine"), message];
        match outbox.enqueue_batch_in(&mut tx, batch).await {
            Err(Error::InvalidInput { field: f, reason }) => {
                assert_eq!(f, field);
                assert!(reason.contains("message 1 of the batch"), "{reason}");
            }
            other => panic!("{field} in a batch: {other:?}"),
        }
    }
    // Escaped backslashes and whole surrogate pairs are stored as they are.
    let kept = outbox
        .enqueue_in(
            &mut tx,
            raw(r#"{"path":"C:\\u0000","pair":"\ud83d\udce6"}"#).with_id("kept"),
        )
        .await
        .unwrap();
    assert!(kept.is_inserted());
    sqlx::query(AssertSqlSafe(insert_order))
        .bind(2_i64)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let committed: i64 =
        sqlx::query_scalar(AssertSqlSafe(format!("SELECT count(*) FROM {orders}")))
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(committed, 2);
    assert!(matches!(
        outbox.get_message("fine").await,
        Err(Error::NotFound { .. })
    ));
    let stored = outbox.get_message("kept").await.unwrap().payload.to_value();
    assert_eq!(stored["path"], "C:\\u0000");
    assert_eq!(stored["pair"], "📦");
}
