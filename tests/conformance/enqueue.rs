//! Enqueue: ids, duplicates, every stored field and its round trip,
//! truncated errors, and invalid input.

use std::collections::HashSet;

use outbox::{
    Enqueued, ErrorRecord, MAX_ERROR_RECORD_BYTES, MarkFailed, MessageKind, MessageStatus,
    NewMessage, OutboxAdmin, OutboxStats, OutboxStore, Payload, TraceCarrier,
};
use serde_json::json;

use super::{
    FAR_FUTURE, MINUTE, SECOND, assert_invalid, at, claim, claim_nothing, claim_one, delivered,
    everything, failed, get, message, put, put_at,
};

pub(crate) async fn invalid_enqueue_changes_nothing<S: OutboxStore + OutboxAdmin + Clone>(
    store: S,
) {
    let payload = || Payload::from(json!({}));
    let cases = [
        (NewMessage::new(MessageKind::Event, "", payload()), "name"),
        (
            NewMessage::new(MessageKind::Event, "   ", payload()),
            "name",
        ),
        (
            NewMessage::new(MessageKind::Job, "job", payload()).with_max_attempts(0),
            "max_attempts",
        ),
        (
            NewMessage::new(MessageKind::Event, "event", payload()).with_id(""),
            "id",
        ),
        (
            NewMessage::new(MessageKind::Event, "event", payload()).with_id(" "),
            "id",
        ),
    ];
    for (new, field) in cases {
        assert_invalid(store.enqueue(new.at(at(0))).await, field);
    }
    assert!(everything(&store).await.is_empty());
    assert_eq!(store.stats(at(0)).await.unwrap(), OutboxStats::default());
    claim_nothing(&store, FAR_FUTURE).await;
}

pub(crate) async fn enqueue_generates_unique_ids<S: OutboxStore + OutboxAdmin + Clone>(store: S) {
    let mut seen = HashSet::new();
    for i in 0..200 {
        let new = NewMessage::new(MessageKind::Event, "e", Payload::from(json!(i))).at(at(i));
        let id = put(&store, new).await;
        assert!(!id.is_empty());
        assert!(seen.insert(id.clone()), "id {id} generated twice");
        assert_eq!(get(&store, &id).await.payload.to_value(), json!(i));
    }
    let stored = everything(&store).await;
    assert_eq!(stored.len(), 200);
    assert!(stored.keys().all(|id| seen.contains(id)));

    // A caller's id is kept as given.
    assert_eq!(put(&store, message("mine-1", "e", 500)).await, "mine-1");
}

pub(crate) async fn enqueue_duplicate_id_leaves_stored_message_untouched<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    put(&store, message("order-1", "order.placed", 0)).await;
    put(&store, message("order-2", "order.placed", 1)).await;
    let claimed = claim_one(&store, SECOND, MINUTE).await;
    assert_eq!(claimed.id, "order-1");
    store
        .mark_delivered(delivered("order-1", &claimed.claim_token, 2 * SECOND))
        .await
        .unwrap();
    let before = everything(&store).await;

    for id in ["order-1", "order-2"] {
        let duplicate = NewMessage::new(
            MessageKind::Job,
            "something.else",
            Payload::from(json!({ "overwritten": true })),
        )
        .with_id(id)
        .with_max_attempts(9)
        .at(at(3 * SECOND));
        let enqueued = store.enqueue(duplicate).await.unwrap();
        assert_eq!(enqueued, Enqueued::AlreadyExists(id.to_owned()));
        assert_eq!(enqueued.id(), id);
        assert!(!enqueued.is_inserted());
    }
    assert_eq!(everything(&store).await, before);

    // The id stays taken after the stored message was claimed and delivered,
    // and a fresh id is still inserted.
    assert_eq!(
        store
            .enqueue(message("order-3", "order.placed", 4 * SECOND))
            .await
            .unwrap(),
        Enqueued::Inserted("order-3".to_owned())
    );
}

pub(crate) async fn enqueue_stores_every_field<S: OutboxStore + OutboxAdmin + Clone>(store: S) {
    let payload = Payload::from(json!({ "user": "ada", "plan": "pro" }));
    let new = NewMessage::new(MessageKind::Job, "mail.welcome", payload.clone())
        .with_id("welcome-ada")
        .with_max_attempts(3)
        .available_at(at(MINUTE))
        .at(at(SECOND));
    assert_eq!(put(&store, new).await, "welcome-ada");

    let stored = get(&store, "welcome-ada").await;
    assert_eq!(stored.id, "welcome-ada");
    assert_eq!(stored.kind, MessageKind::Job);
    assert_eq!(stored.name, "mail.welcome");
    assert_eq!(stored.payload.to_value(), payload.to_value());
    assert_eq!(stored.trace, None);
    assert_eq!(stored.status, MessageStatus::Pending);
    assert_eq!(stored.attempts, 0);
    assert_eq!(stored.max_attempts, 3);
    assert_eq!(stored.available_at, at(MINUTE));
    assert_eq!(stored.claim_token, None);
    assert_eq!(stored.claimed_at, None);
    assert_eq!(stored.locked_until, None);
    assert_eq!(stored.last_error, None);
    assert_eq!(stored.created_at, at(SECOND));
    assert_eq!(stored.updated_at, at(SECOND));
    assert_eq!(stored.delivered_at, None);

    // No `available_at` means available at enqueue time.
    put(&store, message("now", "e", 2 * SECOND)).await;
    assert_eq!(get(&store, "now").await.available_at, at(2 * SECOND));
}

pub(crate) async fn payload_round_trips<S: OutboxStore + OutboxAdmin + Clone>(store: S) {
    let payloads = [
        json!({
            "greeting": "Grüße, 世界! Привет, мир. مرحبا بالعالم",
            "emoji": "📦🚚✅ 👩🏽‍💻",
            "combining": "e\u{301} vs \u{e9}",
            "escapes": "quote \" backslash \\ slash / newline \n tab \t bell \u{7}",
            "nested": { "list": [1, -2, 3.5, 1e-7, 12345678901234_i64, true, false, null, [], {}] },
            "empty": "",
        }),
        json!("a bare string: ünïcödé"),
        json!([1, "two", { "three": 3 }]),
        json!(0),
        json!(null),
        json!({ "big": "x".repeat(64 * 1024) }),
    ];
    for (i, value) in payloads.iter().enumerate() {
        let id = format!("p{i}");
        let new = NewMessage::new(
            MessageKind::Event,
            "payload.test",
            Payload::from(value.clone()),
        )
        .with_id(&id)
        .at(at(i as i64));
        put(&store, new).await;
        assert_eq!(
            &get(&store, &id).await.payload.to_value(),
            value,
            "payload {i}"
        );
    }

    // The claim hands out the same payloads.
    let batch = claim(&store, 100, SECOND, MINUTE).await;
    assert_eq!(batch.claimed.len(), payloads.len());
    for claimed in batch.claimed {
        let i: usize = claimed.id[1..].parse().unwrap();
        assert_eq!(
            claimed.payload.to_value(),
            payloads[i],
            "claimed payload {i}"
        );
    }
}

pub(crate) async fn trace_carrier_round_trips<S: OutboxStore + OutboxAdmin + Clone>(store: S) {
    let full = TraceCarrier {
        traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_owned(),
        tracestate: Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE".to_owned()),
    };
    let bare = TraceCarrier {
        traceparent: "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-00".to_owned(),
        tracestate: None,
    };
    put(&store, message("full", "e", 0).with_trace(full.clone())).await;
    put(&store, message("bare", "e", 1).with_trace(bare.clone())).await;
    put(&store, message("none", "e", 2)).await;

    assert_eq!(get(&store, "full").await.trace, Some(full.clone()));
    assert_eq!(get(&store, "bare").await.trace, Some(bare.clone()));
    assert_eq!(get(&store, "none").await.trace, None);

    let batch = claim(&store, 10, SECOND, MINUTE).await;
    for claimed in batch.claimed {
        let expected = match claimed.id.as_str() {
            "full" => Some(full.clone()),
            "bare" => Some(bare.clone()),
            _ => None,
        };
        assert_eq!(claimed.trace, expected, "trace of {}", claimed.id);
    }
}

pub(crate) async fn oversized_error_is_stored_truncated<S: OutboxStore + OutboxAdmin + Clone>(
    store: S,
) {
    put_at(&store, "m", 0, 0, 5).await;
    let huge = ErrorRecord {
        type_name: "app::HugeError".to_owned(),
        message: "é".repeat(512 * 1024),
        causes: (0..200)
            .map(|i| format!("cause {i}: {}", "y".repeat(10 * 1024)))
            .collect(),
        truncated: false,
    };
    assert!(huge.to_json().len() > 1024 * 1024);

    let first = claim_one(&store, 0, MINUTE).await;
    let fail = MarkFailed {
        error: huge.clone(),
        ..failed("m", &first.claim_token, SECOND, false, None)
    };
    store.mark_failed(fail).await.unwrap();
    let stored = get(&store, "m")
        .await
        .last_error
        .expect("an error is stored");
    assert!(
        stored.to_json().len() <= MAX_ERROR_RECORD_BYTES,
        "stored error is {} bytes",
        stored.to_json().len()
    );
    assert!(stored.truncated);
    assert_eq!(stored.type_name, "app::HugeError");
    assert!(
        stored.message.starts_with("éé"),
        "the start of the message is kept"
    );

    // An error that fits is kept as it was, without the flag.
    let second = claim_one(&store, SECOND, MINUTE).await;
    let small = ErrorRecord {
        type_name: "app::Small".to_owned(),
        message: "näher: 404 ✗".to_owned(),
        causes: vec!["outer".to_owned(), "inner".to_owned()],
        truncated: false,
    };
    let fail = MarkFailed {
        error: small.clone(),
        ..failed("m", &second.claim_token, 2 * SECOND, true, None)
    };
    store.mark_failed(fail).await.unwrap();
    assert_eq!(get(&store, "m").await.last_error, Some(small));
}
