//! Batch enqueue: answers in order, duplicates (stored or within the batch)
//! and idempotency keys per message, enqueue order for ordering keys, the
//! bound and invalid messages refused whole, and the same answers and rows
//! as enqueueing the messages one after another.

use std::time::Duration;

use outbox::{
    EnqueueOptions, Enqueued, Error, MAX_ENQUEUE_BATCH, MemoryOutbox, MessageKind, NewMessage,
    OutboxAdmin, OutboxStore, Payload,
};
use serde_json::json;

use super::{
    FAR_FUTURE, MINUTE, SECOND, at, claim, claim_nothing, claim_one, everything, get, message, put,
};

fn inserted(id: &str) -> Enqueued {
    Enqueued::Inserted(id.to_owned())
}

fn exists(id: &str) -> Enqueued {
    Enqueued::AlreadyExists(id.to_owned())
}

/// `message` with an idempotency key held for a minute.
fn keyed(id: &str, key: &str, created: i64) -> NewMessage {
    message(id, "conformance.batch", created)
        .with_options(EnqueueOptions::new().idempotency_key(key, Duration::from_secs(60)))
}

pub(crate) async fn a_batch_is_stored_whole_and_answered_in_order<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    let generated = NewMessage::new(
        MessageKind::Job,
        "conformance.job",
        Payload::from(json!({ "n": 2 })),
    )
    .with_max_attempts(3)
    .at(at(2));
    let batch = vec![
        message("b-0", "conformance.batch", 0),
        message("b-1", "conformance.batch", 1).available_at(at(MINUTE)),
        generated,
        message("b-3", "conformance.batch", 3).with_ordering_key("k"),
    ];
    let answers = store.enqueue_batch(batch).await.unwrap();
    assert_eq!(answers.len(), 4);
    assert_eq!(answers[0], inserted("b-0"));
    assert_eq!(answers[1], inserted("b-1"));
    assert!(answers[2].is_inserted(), "{:?}", answers[2]);
    assert_eq!(answers[3], inserted("b-3"));

    let job = get(&store, answers[2].id()).await;
    assert_eq!(job.kind, MessageKind::Job);
    assert_eq!(job.name, "conformance.job");
    assert_eq!(job.payload.to_value(), json!({ "n": 2 }));
    assert_eq!((job.max_attempts, job.max_attempts_set), (3, true));
    assert_eq!(job.created_at, at(2));
    assert_eq!(job.available_at, at(2));
    assert_eq!(get(&store, "b-1").await.available_at, at(MINUTE));
    assert_eq!(get(&store, "b-3").await.ordering_key.as_deref(), Some("k"));
    assert_eq!(everything(&store).await.len(), 4);

    // Claimed in claim order, the batch's own.
    let (first, second, third) = (
        claim_one(&store, SECOND, MINUTE).await,
        claim_one(&store, SECOND, MINUTE).await,
        claim_one(&store, SECOND, MINUTE).await,
    );
    assert_eq!(
        [first.id, second.id, third.id],
        [
            "b-0".to_owned(),
            answers[2].id().to_owned(),
            "b-3".to_owned()
        ]
    );
    assert_eq!(claim_one(&store, MINUTE, MINUTE).await.id, "b-1");

    // An empty batch is answered at once and writes nothing.
    assert_eq!(store.enqueue_batch(Vec::new()).await.unwrap(), []);
    assert_eq!(everything(&store).await.len(), 4);
}

pub(crate) async fn a_batch_answers_each_duplicate_in_its_place<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    put(&store, message("stored", "conformance.batch", 0)).await;
    let before = get(&store, "stored").await;
    let overwrite = |id: &str, created: i64| {
        NewMessage::new(
            MessageKind::Job,
            "something.else",
            Payload::from(json!({ "overwritten": true })),
        )
        .with_id(id)
        .at(at(created))
    };
    let batch = vec![
        message("a", "conformance.batch", SECOND),
        overwrite("stored", SECOND + 1),
        overwrite("a", SECOND + 2),
        message("b", "conformance.batch", SECOND + 3),
        overwrite("b", SECOND + 4),
        overwrite("a", SECOND + 5),
        message("c", "conformance.batch", SECOND + 6),
    ];
    let answers = store.enqueue_batch(batch).await.unwrap();
    assert_eq!(
        answers,
        [
            inserted("a"),
            exists("stored"),
            exists("a"),
            inserted("b"),
            exists("b"),
            exists("a"),
            inserted("c"),
        ]
    );
    assert_eq!(get(&store, "stored").await, before, "left untouched");
    for id in ["a", "b", "c"] {
        let stored = get(&store, id).await;
        assert_eq!(
            stored.name, "conformance.batch",
            "{id} is the first of its id"
        );
        assert_eq!(stored.kind, MessageKind::Event);
    }
    assert_eq!(get(&store, "b").await.created_at, at(SECOND + 3));
    assert_eq!(everything(&store).await.len(), 4);

    // A batch of nothing but duplicates writes nothing.
    let answers = store
        .enqueue_batch(vec![
            overwrite("a", 2 * SECOND),
            overwrite("stored", 2 * SECOND),
        ])
        .await
        .unwrap();
    assert_eq!(answers, [exists("a"), exists("stored")]);
    assert_eq!(everything(&store).await.len(), 4);
}

pub(crate) async fn a_batch_honours_each_idempotency_key<S: OutboxStore + OutboxAdmin + Clone>(
    store: S,
) {
    put(&store, keyed("held", "held-key", 0)).await;
    put(&store, keyed("ended", "ended-key", 0)).await;
    let now = MINUTE + SECOND;
    // `held` took its key later than `ended`: still within its window.
    let answers_before = store
        .enqueue(keyed("held-again", "held-key", 30 * SECOND))
        .await
        .unwrap();
    assert_eq!(answers_before, exists("held"));
    put(&store, keyed("late", "late-key", 30 * SECOND)).await;

    let batch = vec![
        keyed("k-0", "late-key", now),
        keyed("k-1", "fresh-key", now),
        keyed("k-2", "ended-key", now),
        keyed("k-3", "fresh-key", now + 1),
        message("k-4", "conformance.batch", now + 2),
        keyed("k-5", "ended-key", now + 3),
        keyed("k-6", "other-key", now + 4),
    ];
    let answers = store.enqueue_batch(batch).await.unwrap();
    assert_eq!(
        answers,
        [
            exists("late"),
            inserted("k-1"),
            // The window of `ended` closed at one minute: the key is taken over.
            inserted("k-2"),
            exists("k-1"),
            inserted("k-4"),
            exists("k-2"),
            inserted("k-6"),
        ]
    );
    let all = everything(&store).await;
    let ids: Vec<&str> = all.keys().map(String::as_str).collect();
    assert_eq!(
        ids,
        ["ended", "held", "k-1", "k-2", "k-4", "k-6", "late"],
        "one message per key and window"
    );

    // The ids still deduplicate on their own, keys or not.
    let answers = store
        .enqueue_batch(vec![
            keyed("k-1", "yet-another-key", now + 5),
            keyed("k-7", "yet-another-key", now + 6),
        ])
        .await
        .unwrap();
    assert_eq!(answers, [exists("k-1"), inserted("k-7")]);
}

pub(crate) async fn a_batch_takes_its_places_in_enqueue_order<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    // One ordering key, one enqueue time: only the batch's order tells
    // the messages apart, and the key hands them out in that order.
    let ids: Vec<String> = (0..12).map(|i| format!("o-{:02}", 11 - i)).collect();
    let batch = ids
        .iter()
        .map(|id| message(id, "conformance.batch", 0).with_ordering_key("one-key"))
        .collect();
    let answers = store.enqueue_batch(batch).await.unwrap();
    assert!(answers.iter().all(Enqueued::is_inserted));
    for (i, id) in ids.iter().enumerate() {
        let now = (i as i64 + 1) * SECOND;
        let claimed = claim_one(&store, now, MINUTE).await;
        assert_eq!(&claimed.id, id, "claim {i} takes the batch's message {i}");
        store
            .mark_delivered(super::delivered(&claimed.id, &claimed.claim_token, now))
            .await
            .unwrap();
    }
    claim_nothing(&store, FAR_FUTURE).await;
}

pub(crate) async fn an_oversized_or_invalid_batch_changes_nothing<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    let many = |n: usize| -> Vec<NewMessage> {
        (0..n)
            .map(|i| message(&format!("m-{i}"), "conformance.batch", 0))
            .collect()
    };
    // The bound itself is taken.
    let answers = store.enqueue_batch(many(MAX_ENQUEUE_BATCH)).await.unwrap();
    assert_eq!(answers.len(), MAX_ENQUEUE_BATCH);
    assert!(answers.iter().all(Enqueued::is_inserted));
    let stats = store.stats(at(0)).await.unwrap();
    assert_eq!(stats.pending, MAX_ENQUEUE_BATCH as u64);

    let fresh = |prefix: &str, n: usize| -> Vec<NewMessage> {
        (0..n)
            .map(|i| message(&format!("{prefix}-{i}"), "conformance.batch", SECOND))
            .collect()
    };
    match store
        .enqueue_batch(fresh("over", MAX_ENQUEUE_BATCH + 1))
        .await
    {
        Err(Error::BatchTooLarge { messages, max }) => {
            assert_eq!((messages, max), (MAX_ENQUEUE_BATCH + 1, MAX_ENQUEUE_BATCH));
        }
        other => panic!("expected BatchTooLarge, got {other:?}"),
    }

    // One invalid message refuses the whole batch, and says which.
    let mut batch = fresh("bad", 4);
    batch[2].name = String::new();
    match store.enqueue_batch(batch).await {
        Err(Error::InvalidInput { field, reason }) => {
            assert_eq!(field, "name");
            assert!(reason.contains("message 2 of the batch"), "{reason}");
        }
        other => panic!("expected an invalid name, got {other:?}"),
    }
    let mut batch = fresh("bad", 3);
    batch[1] = batch[1].clone().with_max_attempts(0);
    assert!(matches!(
        store.enqueue_batch(batch).await,
        Err(Error::InvalidInput {
            field: "max_attempts",
            ..
        })
    ));
    assert_eq!(store.stats(at(0)).await.unwrap(), stats);
    let stored = everything(&store).await;
    assert!(
        stored.keys().all(|id| id.starts_with("m-")),
        "only the first batch"
    );
    assert_eq!(
        claim(&store, 10, FAR_FUTURE, MINUTE).await.claimed.len(),
        10,
        "the first batch is claimable"
    );
}

/// A batch of every kind of repeat (ids and keys, stored and within the
/// batch, windows open and ended, keyed and not), enqueued once as a batch
/// into `store` and once message by message into a fresh memory store:
/// the same answers, and the same messages stored.
pub(crate) async fn a_batch_answers_as_enqueues_one_after_another<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    let reference = MemoryOutbox::new();
    let before = || {
        vec![
            message("x", "conformance.batch", 0),
            keyed("y", "key-y", 0),
            keyed("z", "key-z", 50 * SECOND),
        ]
    };
    for new in before() {
        put(&store, new.clone()).await;
        put(&reference, new).await;
    }
    let now = MINUTE + SECOND;
    let batch = vec![
        keyed("x", "key-1", now),               // a stored id, a fresh key
        message("x", "conformance.batch", now), // that id again, no key
        keyed("p", "key-1", now),               // the key the first did not take
        keyed("q", "key-y", now),               // a stored key whose window ended
        keyed("r", "key-y", now),               // that key again, now taken
        keyed("s", "key-z", now),               // a stored key still held
        message("p", "conformance.batch", now), // an id taken in this batch
        keyed("t", "key-2", now),
        keyed("t", "key-3", now), // an id taken in this batch, with a key
        keyed("u", "key-3", now), // the key its first use did not take
        message("v", "conformance.batch", now),
        message("v", "conformance.batch", now),
        keyed("w", "key-w", now),
    ];
    let mut expected = Vec::new();
    for new in batch.clone() {
        expected.push(reference.enqueue(new).await.unwrap());
    }
    let answers = store.enqueue_batch(batch).await.unwrap();
    assert_eq!(answers, expected);

    let summary = |all: std::collections::BTreeMap<String, outbox::OutboxMessage>| {
        all.into_values()
            .map(|m| {
                (
                    m.id,
                    m.name,
                    m.payload.to_value(),
                    m.created_at,
                    m.ordering_key,
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        summary(everything(&store).await),
        summary(everything(&reference).await)
    );
}
