//! The `testing` helpers on a SQL store: what a transaction enqueued is
//! found by type and payload once it commits, and not after a rollback.

use outbox::SqliteOutbox;
use outbox::testing::{assert_enqueued, assert_job_enqueued, enqueued, enqueued_jobs};
use outbox::{Clock, Event, Job, OutboxAdmin};
use serde::{Deserialize, Serialize};

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct OrderPlaced {
    order_id: u64,
}

impl Event for OrderPlaced {
    const NAME: &'static str = "order.placed";
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct SendReceipt {
    order_id: u64,
}

impl Job for SendReceipt {
    const NAME: &'static str = "receipt.send";
}

async fn store() -> SqliteOutbox {
    SqliteOutbox::connect("sqlite::memory:").await.unwrap()
}

#[tokio::test]
async fn testing_helpers_read_a_sqlite_store() {
    let store = store().await;
    let mut tx = store.pool().begin().await.unwrap();
    store
        .enqueue_event_in(&mut tx, &OrderPlaced { order_id: 7 })
        .await
        .unwrap();
    store
        .enqueue_job_in(&mut tx, &SendReceipt { order_id: 7 })
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let mut rolled_back = store.pool().begin().await.unwrap();
    store
        .enqueue_event_in(&mut rolled_back, &OrderPlaced { order_id: 8 })
        .await
        .unwrap();
    rolled_back.rollback().await.unwrap();

    assert_eq!(
        assert_enqueued::<OrderPlaced>(&store, |order| order.order_id == 7).await,
        OrderPlaced { order_id: 7 }
    );
    assert_eq!(
        assert_job_enqueued::<SendReceipt>(&store, |receipt| receipt.order_id == 7).await,
        SendReceipt { order_id: 7 }
    );
    assert_eq!(
        enqueued::<OrderPlaced>(&store).await,
        [OrderPlaced { order_id: 7 }],
        "the rolled-back order is not there"
    );
    assert_eq!(enqueued_jobs::<SendReceipt>(&store).await.len(), 1);
    assert_eq!(
        store
            .stats(outbox::SystemClock.now())
            .await
            .unwrap()
            .total(),
        2
    );
}

#[tokio::test]
#[should_panic(expected = "no job \"receipt.send\" was enqueued")]
async fn testing_assert_job_enqueued_panics_when_none_is() {
    let store = store().await;
    assert_job_enqueued::<SendReceipt>(&store, |_| true).await;
}
