//! Fenced writes: renewal, delivery, failure and release apply only while
//! the claim token holds a live lease, and each leaves the message as it
//! says.

use std::time::Duration;

use outbox::{
    Error, MessageKind, MessageStatus, NewMessage, OutboxAdmin, OutboxStore, Payload, RenewClaim,
};
use serde_json::json;

use super::{
    FAR_FUTURE, MINUTE, SECOND, assert_claim_lost, assert_invalid, assert_token_refused, at, claim,
    claim_nothing, claim_one, delivered, delivery_error, failed, get, put, put_at, released, renew,
};

// ---------------------------------------------------------------------------
// Renewal.

pub(crate) async fn renew_extends_live_claim<S: OutboxStore + OutboxAdmin + Clone>(store: S) {
    put_at(&store, "m", 0, 0, 5).await;
    let claimed = claim_one(&store, 0, 10 * SECOND).await;

    let until = store
        .renew_claim(renew("m", &claimed.claim_token, 5 * SECOND, 20 * SECOND))
        .await
        .expect("a live claim renews");
    assert_eq!(until, at(25 * SECOND));
    let stored = get(&store, "m").await;
    assert_eq!(stored.locked_until, Some(at(25 * SECOND)));
    assert_eq!(stored.status, MessageStatus::Claimed);
    assert_eq!(
        stored.claim_token.as_deref(),
        Some(claimed.claim_token.as_str())
    );
    assert_eq!(stored.claimed_at, Some(at(0)));
    assert_eq!(stored.attempts, 1, "a renewal is not an attempt");
    assert_eq!(stored.updated_at, at(5 * SECOND));

    // Held past the original lease, up to the renewed one.
    claim_nothing(&store, 10 * SECOND).await;
    claim_nothing(&store, 25 * SECOND - 1).await;

    // A renewal just before the end still counts.
    let until = store
        .renew_claim(renew("m", &claimed.claim_token, 25 * SECOND - 1, SECOND))
        .await
        .unwrap();
    assert_eq!(until, at(26 * SECOND - 1));
    claim_nothing(&store, 26 * SECOND - 2).await;
    let reclaimed = claim_one(&store, 26 * SECOND - 1, SECOND).await;
    assert_eq!(reclaimed.attempts, 2);
}

pub(crate) async fn renew_refuses_wrong_token<S: OutboxStore + OutboxAdmin + Clone>(store: S) {
    put_at(&store, "m", 0, 0, 5).await;
    let claimed = claim_one(&store, 0, 10 * SECOND).await;
    let before = get(&store, "m").await;

    let wrong = format!("{}-not", claimed.claim_token);
    assert_claim_lost(
        store.renew_claim(renew("m", &wrong, SECOND, MINUTE)).await,
        "m",
    );
    assert_claim_lost(
        store.renew_claim(renew("m", "x", SECOND, MINUTE)).await,
        "m",
    );
    assert_eq!(get(&store, "m").await, before);

    // The lease was not extended by the refused renewals.
    assert_eq!(claim_one(&store, 10 * SECOND, MINUTE).await.id, "m");
}

pub(crate) async fn renew_refuses_expired_lease<S: OutboxStore + OutboxAdmin + Clone>(store: S) {
    put_at(&store, "m", 0, 0, 5).await;
    let claimed = claim_one(&store, 0, 10 * SECOND).await;
    let before = get(&store, "m").await;

    for now in [10 * SECOND, 10 * SECOND + 1, MINUTE] {
        let result = store
            .renew_claim(renew("m", &claimed.claim_token, now, MINUTE))
            .await;
        assert_claim_lost(result, "m");
        assert_eq!(
            get(&store, "m").await,
            before,
            "a refused renew at {now} ms changed it"
        );
    }
    assert_eq!(claim_one(&store, 10 * SECOND, MINUTE).await.attempts, 2);
}

pub(crate) async fn renew_refuses_unclaimed_message<S: OutboxStore + OutboxAdmin + Clone>(
    store: S,
) {
    put_at(&store, "pending", 0, 0, 5).await;
    let before = get(&store, "pending").await;
    assert_claim_lost(
        store
            .renew_claim(renew("pending", "some-token", SECOND, MINUTE))
            .await,
        "pending",
    );
    assert_eq!(get(&store, "pending").await, before);

    put_at(&store, "delivered", 1, 1, 5).await;
    put_at(&store, "dead", 2, 2, 5).await;
    put_at(&store, "released", 3, 3, 5).await;
    // Claim all four, then settle three of them in each way there is.
    let held = claim(&store, 4, 10, MINUTE).await;
    let token = |id: &str| {
        held.claimed
            .iter()
            .find(|m| m.id == id)
            .map(|m| m.claim_token.clone())
            .expect("claimed")
    };
    store
        .mark_delivered(delivered("delivered", &token("delivered"), 20))
        .await
        .unwrap();
    store
        .mark_failed(failed("dead", &token("dead"), 20, true, None))
        .await
        .unwrap();
    store
        .release_claim(released("released", &token("released"), 20))
        .await
        .unwrap();

    for id in ["delivered", "dead", "released"] {
        let before = get(&store, id).await;
        assert_claim_lost(
            store.renew_claim(renew(id, &token(id), 30, MINUTE)).await,
            id,
        );
        assert_eq!(
            get(&store, id).await,
            before,
            "a refused renew changed {id}"
        );
    }

    assert_claim_lost(
        store
            .renew_claim(renew("missing", "token", 30, MINUTE))
            .await,
        "missing",
    );
    assert!(matches!(
        store.get_message("missing").await,
        Err(Error::NotFound { .. })
    ));
}

// ---------------------------------------------------------------------------
// Settlement guards.

pub(crate) async fn deliver_refuses_wrong_token_and_expired_lease<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    put_at(&store, "m", 0, 0, 5).await;
    let claimed = claim_one(&store, 0, 10 * SECOND).await;
    let before = get(&store, "m").await;

    assert_claim_lost(
        store.mark_delivered(delivered("m", "wrong", SECOND)).await,
        "m",
    );
    assert_eq!(get(&store, "m").await, before);

    // Nobody re-claimed it, but the lease is over: the token no longer owns it.
    for now in [10 * SECOND, 10 * SECOND + 1, MINUTE] {
        let result = store
            .mark_delivered(delivered("m", &claimed.claim_token, now))
            .await;
        assert_claim_lost(result, "m");
        assert_eq!(
            get(&store, "m").await,
            before,
            "a refused delivery at {now} ms changed it"
        );
    }
    assert_eq!(claim_one(&store, MINUTE, MINUTE).await.attempts, 2);
}

pub(crate) async fn fail_refuses_wrong_token_and_expired_lease<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    put_at(&store, "m", 0, 0, 5).await;
    let claimed = claim_one(&store, 0, 10 * SECOND).await;
    let before = get(&store, "m").await;

    for dead_letter in [false, true] {
        let result = store
            .mark_failed(failed("m", "wrong", SECOND, dead_letter, None))
            .await;
        assert_claim_lost(result, "m");
        assert_eq!(get(&store, "m").await, before);

        for now in [10 * SECOND, 10 * SECOND + 1, MINUTE] {
            let fail = failed("m", &claimed.claim_token, now, dead_letter, Some(now));
            assert_claim_lost(store.mark_failed(fail).await, "m");
            assert_eq!(
                get(&store, "m").await,
                before,
                "a refused failure at {now} ms changed it"
            );
        }
    }
    assert_eq!(claim_one(&store, MINUTE, MINUTE).await.attempts, 2);
}

pub(crate) async fn release_refuses_wrong_token_and_expired_lease<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    put_at(&store, "m", 0, 0, 5).await;
    let claimed = claim_one(&store, 0, 10 * SECOND).await;
    let before = get(&store, "m").await;

    assert_claim_lost(
        store.release_claim(released("m", "wrong", SECOND)).await,
        "m",
    );
    assert_eq!(get(&store, "m").await, before);
    for now in [10 * SECOND, MINUTE] {
        let result = store
            .release_claim(released("m", &claimed.claim_token, now))
            .await;
        assert_claim_lost(result, "m");
        assert_eq!(
            get(&store, "m").await,
            before,
            "a refused release at {now} ms changed it"
        );
    }
}

// ---------------------------------------------------------------------------
// Settlement outcomes.

pub(crate) async fn deliver_settles_for_good<S: OutboxStore + OutboxAdmin + Clone>(store: S) {
    put_at(&store, "m", 0, 0, 5).await;
    let claimed = claim_one(&store, 0, 10 * SECOND).await;
    store
        .mark_delivered(delivered("m", &claimed.claim_token, 3 * SECOND))
        .await
        .expect("a live claim settles");

    let stored = get(&store, "m").await;
    assert_eq!(stored.status, MessageStatus::Delivered);
    assert_eq!(stored.delivered_at, Some(at(3 * SECOND)));
    assert_eq!(stored.updated_at, at(3 * SECOND));
    assert_eq!(stored.claim_token, None);
    assert_eq!(stored.claimed_at, None);
    assert_eq!(stored.locked_until, None);
    assert_eq!(stored.attempts, 1);
    assert_eq!(stored.last_error, None);

    claim_nothing(&store, 10 * SECOND).await;
    claim_nothing(&store, FAR_FUTURE).await;
    assert_eq!(get(&store, "m").await, stored);
    let stats = store.stats(at(FAR_FUTURE)).await.unwrap();
    assert_eq!((stats.delivered, stats.pending, stats.claimed), (1, 0, 0));
}

pub(crate) async fn fail_with_retry_at_reschedules<S: OutboxStore + OutboxAdmin + Clone>(store: S) {
    put_at(&store, "m", 0, 0, 5).await;
    let claimed = claim_one(&store, 0, 30 * SECOND).await;
    store
        .mark_failed(failed(
            "m",
            &claimed.claim_token,
            SECOND,
            false,
            Some(MINUTE),
        ))
        .await
        .expect("a live claim settles");

    let stored = get(&store, "m").await;
    assert_eq!(stored.status, MessageStatus::Pending);
    assert_eq!(stored.available_at, at(MINUTE));
    assert_eq!(stored.last_error, Some(delivery_error()));
    assert_eq!(stored.claim_token, None);
    assert_eq!(stored.claimed_at, None);
    assert_eq!(stored.locked_until, None);
    assert_eq!(stored.delivered_at, None);
    assert_eq!(stored.attempts, 1);
    assert_eq!(stored.updated_at, at(SECOND));

    claim_nothing(&store, MINUTE - 1).await;
    let again = claim_one(&store, MINUTE, MINUTE).await;
    assert_eq!(again.attempts, 2);
    assert_ne!(again.claim_token, claimed.claim_token);
    // The last error stays visible while the next attempt runs.
    assert_eq!(get(&store, "m").await.last_error, Some(delivery_error()));
}

pub(crate) async fn fail_without_retry_at_is_available_now<S: OutboxStore + OutboxAdmin + Clone>(
    store: S,
) {
    put_at(&store, "m", 0, 0, 5).await;
    let claimed = claim_one(&store, 0, 30 * SECOND).await;
    store
        .mark_failed(failed("m", &claimed.claim_token, 2 * SECOND, false, None))
        .await
        .unwrap();
    let stored = get(&store, "m").await;
    assert_eq!(stored.status, MessageStatus::Pending);
    assert_eq!(stored.available_at, at(2 * SECOND));
    assert_eq!(stored.last_error, Some(delivery_error()));
    assert_eq!(claim_one(&store, 2 * SECOND, MINUTE).await.attempts, 2);
}

pub(crate) async fn fail_with_dead_letter_settles_for_good<S: OutboxStore + OutboxAdmin + Clone>(
    store: S,
) {
    put_at(&store, "m", 0, 0, 5).await;
    let claimed = claim_one(&store, 0, 30 * SECOND).await;
    // A `retry_at` next to `dead_letter` does not bring it back.
    store
        .mark_failed(failed(
            "m",
            &claimed.claim_token,
            SECOND,
            true,
            Some(2 * SECOND),
        ))
        .await
        .unwrap();

    let stored = get(&store, "m").await;
    assert_eq!(stored.status, MessageStatus::DeadLettered);
    assert_eq!(stored.last_error, Some(delivery_error()));
    assert_eq!(stored.claim_token, None);
    assert_eq!(stored.claimed_at, None);
    assert_eq!(stored.locked_until, None);
    assert_eq!(stored.delivered_at, None);
    assert_eq!(stored.updated_at, at(SECOND));

    claim_nothing(&store, 2 * SECOND).await;
    claim_nothing(&store, FAR_FUTURE).await;
    assert_eq!(get(&store, "m").await, stored);
    assert_eq!(store.stats(at(FAR_FUTURE)).await.unwrap().dead_lettered, 1);
}

pub(crate) async fn release_returns_message_uncounted<S: OutboxStore + OutboxAdmin + Clone>(
    store: S,
) {
    put_at(&store, "m", 0, 0, 5).await;
    let claimed = claim_one(&store, 0, 30 * SECOND).await;
    store
        .release_claim(released("m", &claimed.claim_token, 5 * SECOND))
        .await
        .expect("a live claim is released");

    let stored = get(&store, "m").await;
    assert_eq!(stored.status, MessageStatus::Pending);
    assert_eq!(stored.available_at, at(5 * SECOND));
    assert_eq!(stored.attempts, 0, "a released attempt does not count");
    assert_eq!(stored.claim_token, None);
    assert_eq!(stored.claimed_at, None);
    assert_eq!(stored.locked_until, None);
    assert_eq!(stored.updated_at, at(5 * SECOND));

    let again = claim_one(&store, 5 * SECOND, MINUTE).await;
    assert_eq!(again.attempts, 1);
    assert_ne!(again.claim_token, claimed.claim_token);
}

pub(crate) async fn release_keeps_payload_and_last_error<S: OutboxStore + OutboxAdmin + Clone>(
    store: S,
) {
    let payload = json!({ "order": 42, "note": "release me" });
    put(
        &store,
        NewMessage::new(
            MessageKind::Event,
            "order.placed",
            Payload::from(payload.clone()),
        )
        .with_id("m")
        .at(at(0)),
    )
    .await;
    let first = claim_one(&store, 0, MINUTE).await;
    store
        .mark_failed(failed("m", &first.claim_token, SECOND, false, None))
        .await
        .unwrap();
    let second = claim_one(&store, SECOND, MINUTE).await;
    assert_eq!(second.attempts, 2);
    store
        .release_claim(released("m", &second.claim_token, 2 * SECOND))
        .await
        .unwrap();

    let stored = get(&store, "m").await;
    assert_eq!(stored.attempts, 1);
    assert_eq!(stored.payload.to_value(), payload);
    assert_eq!(stored.last_error, Some(delivery_error()));
    assert_eq!(stored.name, "order.placed");
    let third = claim_one(&store, 2 * SECOND, MINUTE).await;
    assert_eq!(third.payload.to_value(), payload);
    assert_eq!(third.attempts, 2);
}

pub(crate) async fn release_does_not_spend_the_attempt_budget<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    put_at(&store, "m", 0, 0, 1).await;
    for round in 0..3 {
        let now = round * SECOND;
        let claimed = claim_one(&store, now, MINUTE).await;
        assert_eq!(claimed.attempts, 1);
        store
            .release_claim(released("m", &claimed.claim_token, now + 1))
            .await
            .unwrap();
    }
    let last = claim_one(&store, 10 * SECOND, MINUTE).await;
    store
        .mark_delivered(delivered("m", &last.claim_token, 11 * SECOND))
        .await
        .unwrap();
}

pub(crate) async fn settled_claim_refuses_further_writes<S: OutboxStore + OutboxAdmin + Clone>(
    store: S,
) {
    for (i, id) in ["delivered", "retried", "dead", "released"]
        .iter()
        .enumerate()
    {
        put_at(&store, id, i as i64, i as i64, 5).await;
    }
    let batch = claim(&store, 4, 10, MINUTE).await;
    assert_eq!(batch.claimed.len(), 4);
    let token = |id: &str| {
        batch
            .claimed
            .iter()
            .find(|m| m.id == id)
            .map(|m| m.claim_token.clone())
            .unwrap()
    };
    store
        .mark_delivered(delivered("delivered", &token("delivered"), 20))
        .await
        .unwrap();
    store
        .mark_failed(failed(
            "retried",
            &token("retried"),
            20,
            false,
            Some(MINUTE),
        ))
        .await
        .unwrap();
    store
        .mark_failed(failed("dead", &token("dead"), 20, true, None))
        .await
        .unwrap();
    store
        .release_claim(released("released", &token("released"), 20))
        .await
        .unwrap();

    // Each token settled once; every second write with it is refused, while
    // its original lease would still be live.
    for id in ["delivered", "retried", "dead", "released"] {
        assert_token_refused(&store, id, &token(id), 30).await;
    }
}

// ---------------------------------------------------------------------------
// Invalid parameters.

pub(crate) async fn invalid_fence_parameters_change_nothing<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    put_at(&store, "m", 0, 0, 5).await;
    let claimed = claim_one(&store, 0, MINUTE).await;
    let token = claimed.claim_token.as_str();
    let before = get(&store, "m").await;

    assert_invalid(
        store.renew_claim(renew("", token, SECOND, MINUTE)).await,
        "id",
    );
    assert_invalid(
        store.renew_claim(renew("m", "", SECOND, MINUTE)).await,
        "claim_token",
    );
    let zero_lease = RenewClaim {
        lease: Duration::ZERO,
        ..renew("m", token, SECOND, MINUTE)
    };
    assert_invalid(store.renew_claim(zero_lease).await, "lease");
    assert_invalid(
        store.mark_delivered(delivered("", token, SECOND)).await,
        "id",
    );
    assert_invalid(
        store.mark_delivered(delivered("m", "", SECOND)).await,
        "claim_token",
    );
    assert_invalid(
        store
            .mark_failed(failed("", token, SECOND, false, None))
            .await,
        "id",
    );
    assert_invalid(
        store.mark_failed(failed("m", "", SECOND, true, None)).await,
        "claim_token",
    );
    assert_invalid(store.release_claim(released("", token, SECOND)).await, "id");
    assert_invalid(
        store.release_claim(released("m", "", SECOND)).await,
        "claim_token",
    );
    assert_eq!(get(&store, "m").await, before);

    // The claim is intact: its token still settles it.
    store
        .mark_delivered(delivered("m", token, SECOND))
        .await
        .unwrap();
}
