//! Cancelling: a pending or scheduled message ends `Cancelled` at once and
//! is never claimed; a settled one is refused with its status; a filter
//! cancels every match, and a dry run only counts; a live claim gets the
//! request, which its renewals report and its settlement turns into
//! `Cancelled` unless the handler succeeded; an expired claim is cancelled
//! at once, or at the next claim when the request came while it was live;
//! a cancelled message frees its ordering key and is purged like any
//! settled message.

use outbox::{
    AdminError, CancelMessages, CancelReport, Error, MessageStatus, OutboxAdmin, OutboxStore,
    PurgeMessages,
};

use super::queues::claimed_ids;
use super::{
    FAR_FUTURE, MINUTE, SECOND, assert_invalid, at, claim, claim_nothing, delivered, failed, get,
    message, put, released, renew,
};

async fn cancel<S: OutboxAdmin>(store: &S, params: CancelMessages) -> CancelReport {
    store
        .cancel_messages(params)
        .await
        .expect("cancel_messages")
}

async fn put_plain<S: OutboxStore>(store: &S, id: &str, created: i64, available: i64) {
    let new = message(id, "conformance.cancelled", created).available_at(at(available));
    put(store, new).await;
}

pub(crate) async fn cancel_a_pending_or_scheduled_message<S: OutboxStore + OutboxAdmin + Clone>(
    store: S,
) {
    put_plain(&store, "due", 0, 0).await;
    put_plain(&store, "scheduled", 0, MINUTE).await;
    put_plain(&store, "kept", 0, 0).await;
    for id in ["due", "scheduled"] {
        let report = cancel(&store, CancelMessages::id(id, at(SECOND))).await;
        assert_eq!(report, CancelReport::new(1, 0));
        let cancelled = get(&store, id).await;
        assert_eq!(cancelled.status, MessageStatus::Cancelled);
        assert_eq!(cancelled.updated_at, at(SECOND));
    }
    let batch = claim(&store, 100, FAR_FUTURE, MINUTE).await;
    assert_eq!(claimed_ids(&batch), ["kept"]);
    let stats = store.stats(at(2 * SECOND)).await.unwrap();
    assert_eq!((stats.cancelled, stats.claimed), (2, 1));
    // Cancelled messages are settled: purged like delivered ones.
    let purge = PurgeMessages {
        status: Some(MessageStatus::Cancelled),
        older_than: at(2 * SECOND),
    };
    assert_eq!(store.count_purgeable(purge).await.unwrap(), 2);
    assert_eq!(store.purge(purge).await.unwrap(), 2);
    assert!(matches!(
        store.get_message("due").await,
        Err(Error::NotFound { .. })
    ));
}

pub(crate) async fn cancel_refuses_settled_messages_with_their_status<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    put_plain(&store, "done", 0, 0).await;
    put_plain(&store, "dead", 1, 0).await;
    let batch = claim(&store, 10, SECOND, MINUTE).await;
    for claimed in &batch.claimed {
        if claimed.id == "done" {
            store
                .mark_delivered(delivered("done", &claimed.claim_token, 2 * SECOND))
                .await
                .unwrap();
        } else {
            store
                .mark_failed(failed("dead", &claimed.claim_token, 2 * SECOND, true, None))
                .await
                .unwrap();
        }
    }
    put_plain(&store, "gone", 2, 0).await;
    cancel(&store, CancelMessages::id("gone", at(3 * SECOND))).await;
    let expected = [
        ("done", MessageStatus::Delivered),
        ("dead", MessageStatus::DeadLettered),
        ("gone", MessageStatus::Cancelled),
    ];
    for (id, status) in expected {
        let before = get(&store, id).await;
        match store
            .cancel_messages(CancelMessages::id(id, at(4 * SECOND)))
            .await
        {
            Err(Error::Admin(AdminError::NotCancellable {
                id: got,
                status: got_status,
            })) => {
                assert_eq!((got.as_str(), got_status), (id, status));
            }
            other => panic!("cancelling {id} ({status}) answered {other:?}"),
        }
        assert_eq!(
            get(&store, id).await,
            before,
            "a refused cancel changed {id}"
        );
    }
    assert!(matches!(
        store
            .cancel_messages(CancelMessages::id("missing", at(0)))
            .await,
        Err(Error::NotFound { .. })
    ));
}

pub(crate) async fn cancel_by_filter_counts_first_when_dry<S: OutboxStore + OutboxAdmin + Clone>(
    store: S,
) {
    let new = |id: &str, name: &str, queue: &str, key: Option<&str>| {
        let new = message(id, name, 0).with_queue(queue);
        match key {
            Some(key) => new.with_ordering_key(key),
            None => new,
        }
    };
    put(&store, new("a", "order.placed", "default", None)).await;
    put(&store, new("b", "order.placed", "emails", None)).await;
    put(&store, new("c", "order.shipped", "emails", Some("k"))).await;
    put(&store, new("d", "order.shipped", "emails", None)).await;
    let dry = CancelMessages::matching(at(SECOND))
        .queue("emails")
        .dry_run(true);
    assert_eq!(cancel(&store, dry).await, CancelReport::new(3, 0));
    for id in ["a", "b", "c", "d"] {
        assert_eq!(get(&store, id).await.status, MessageStatus::Pending);
    }
    let by_name = CancelMessages::matching(at(SECOND))
        .name("order.shipped")
        .queue("emails");
    let by_key = CancelMessages::matching(at(SECOND)).ordering_key("k");
    assert_eq!(
        cancel(&store, by_key.clone().dry_run(true)).await,
        CancelReport::new(1, 0)
    );
    assert_eq!(cancel(&store, by_name).await, CancelReport::new(2, 0));
    assert_eq!(cancel(&store, by_key).await, CancelReport::new(0, 0));
    let statuses: Vec<MessageStatus> = statuses(&store, &["a", "b", "c", "d"]).await;
    assert_eq!(
        statuses,
        [
            MessageStatus::Pending,
            MessageStatus::Pending,
            MessageStatus::Cancelled,
            MessageStatus::Cancelled
        ]
    );
}

async fn statuses<S: OutboxAdmin>(store: &S, ids: &[&str]) -> Vec<MessageStatus> {
    let mut statuses = Vec::new();
    for id in ids {
        statuses.push(get(store, id).await.status);
    }
    statuses
}

pub(crate) async fn cancel_a_live_claim_is_requested_and_settles_cancelled<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    put_plain(&store, "m", 0, 0).await;
    let token = claim(&store, 1, SECOND, MINUTE).await.claimed[0]
        .claim_token
        .clone();
    let lease = store
        .renew_lease(renew("m", &token, 2 * SECOND, MINUTE))
        .await
        .unwrap();
    assert!(!lease.cancel_requested);
    let report = cancel(&store, CancelMessages::id("m", at(3 * SECOND))).await;
    assert_eq!(report, CancelReport::new(0, 1));
    let requested = get(&store, "m").await;
    assert_eq!(requested.status, MessageStatus::Claimed);
    assert_eq!(requested.claim_token.as_deref(), Some(token.as_str()));
    assert!(requested.cancel_requested_at.is_some());
    // A second request changes nothing but counts the claim.
    let again = cancel(&store, CancelMessages::id("m", at(4 * SECOND))).await;
    assert_eq!(again, CancelReport::new(0, 1));
    let lease = store
        .renew_lease(renew("m", &token, 5 * SECOND, MINUTE))
        .await
        .unwrap();
    assert!(lease.cancel_requested, "the renewal reports the request");
    assert_eq!(lease.locked_until, at(5 * SECOND + MINUTE));
    // The handler failed: a retry is recorded as the cancellation.
    let status = store
        .settle_failure(failed("m", &token, 6 * SECOND, false, Some(7 * SECOND)))
        .await
        .unwrap();
    assert_eq!(status, MessageStatus::Cancelled);
    let cancelled = get(&store, "m").await;
    assert_eq!(cancelled.status, MessageStatus::Cancelled);
    assert_eq!(cancelled.claim_token, None);
    assert!(cancelled.last_error.is_some());
    claim_nothing(&store, FAR_FUTURE).await;
}

pub(crate) async fn cancel_a_live_claim_whose_handler_succeeds_is_delivered<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    put_plain(&store, "ok", 0, 0).await;
    put_plain(&store, "dead", 1, 0).await;
    put_plain(&store, "back", 2, 0).await;
    let batch = claim(&store, 3, SECOND, MINUTE).await;
    let token = |id: &str| {
        batch
            .claimed
            .iter()
            .find(|m| m.id == id)
            .unwrap()
            .claim_token
            .clone()
    };
    let report = cancel(
        &store,
        CancelMessages::matching(at(2 * SECOND)).name("conformance.cancelled"),
    )
    .await;
    assert_eq!(report, CancelReport::new(0, 3));
    store
        .mark_delivered(delivered("ok", &token("ok"), 3 * SECOND))
        .await
        .unwrap();
    assert_eq!(get(&store, "ok").await.status, MessageStatus::Delivered);
    // Out of attempts or not, a failure after the request ends cancelled.
    let status = store
        .settle_failure(failed("dead", &token("dead"), 3 * SECOND, true, None))
        .await
        .unwrap();
    assert_eq!(status, MessageStatus::Cancelled);
    // A claim given back is not run again either.
    store
        .release_claim(released("back", &token("back"), 3 * SECOND))
        .await
        .unwrap();
    assert_eq!(get(&store, "back").await.status, MessageStatus::Cancelled);
    claim_nothing(&store, FAR_FUTURE).await;
}

pub(crate) async fn cancel_an_expired_claim_ends_it<S: OutboxStore + OutboxAdmin + Clone>(
    store: S,
) {
    put_plain(&store, "expired", 0, 0).await;
    put_plain(&store, "requested", 1, 0).await;
    claim(&store, 2, SECOND, MINUTE).await;
    // Requested while live; its worker then goes away.
    let report = cancel(&store, CancelMessages::id("requested", at(2 * SECOND))).await;
    assert_eq!(report, CancelReport::new(0, 1));
    // Cancelled after its lease ran out: nothing owns it, it ends now.
    let late = SECOND + 2 * MINUTE;
    let report = cancel(&store, CancelMessages::id("expired", at(late))).await;
    assert_eq!(report, CancelReport::new(1, 0));
    assert_eq!(
        get(&store, "expired").await.status,
        MessageStatus::Cancelled
    );
    // The next claim finds the other one expired with its request, and
    // cancels it rather than deliver it again.
    let batch = claim(&store, 10, late, MINUTE).await;
    assert!(batch.claimed.is_empty(), "{batch:?}");
    let cancelled: Vec<&str> = batch.cancelled.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(cancelled, ["requested"]);
    assert_eq!(batch.cancelled[0].status, MessageStatus::Cancelled);
    assert_eq!(
        get(&store, "requested").await.status,
        MessageStatus::Cancelled
    );
}

pub(crate) async fn cancel_frees_an_ordering_key<S: OutboxStore + OutboxAdmin + Clone>(store: S) {
    for (i, id) in ["k1", "k2"].into_iter().enumerate() {
        let new = message(id, "conformance.cancelled", i as i64).with_ordering_key("k");
        put(&store, new).await;
    }
    cancel(&store, CancelMessages::id("k1", at(SECOND))).await;
    let batch = claim(&store, 10, 2 * SECOND, MINUTE).await;
    assert_eq!(claimed_ids(&batch), ["k2"]);
}

pub(crate) async fn cancel_invalid_parameters_change_nothing<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    put_plain(&store, "m", 0, 0).await;
    let now = at(SECOND);
    let cases = [
        (CancelMessages::matching(now), "filter"),
        (CancelMessages::id("m", now).name("x"), "id"),
        (CancelMessages::id("", now), "id"),
        (CancelMessages::matching(now).queue("two words"), "queue"),
        (CancelMessages::matching(now).name(""), "name"),
        (
            CancelMessages::matching(now).ordering_key(""),
            "ordering_key",
        ),
    ];
    for (params, field) in cases {
        assert_invalid(store.cancel_messages(params).await, field);
    }
    assert_eq!(get(&store, "m").await.status, MessageStatus::Pending);
}
