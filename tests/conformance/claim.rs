//! Claims: which messages a claim selects and in what order, the fields it
//! sets, leases judged by the claim's own `now`, dead letters at claim,
//! invalid claim parameters, and concurrent claims.

use std::collections::HashSet;
use std::time::Duration;

use outbox::{
    ClaimBatch, MessageKind, MessageStatus, NewMessage, OutboxAdmin, OutboxStore, Payload,
    TraceCarrier,
};
use serde_json::json;

use super::{
    FAR_FUTURE, MINUTE, SECOND, assert_invalid, assert_token_refused, at, claim, claim_nothing,
    claim_one, delivered, everything, failed, get, ids, lease, put, put_at, renew, sorted,
};

pub(crate) async fn empty_store_claims_nothing<S: OutboxStore + OutboxAdmin + Clone>(store: S) {
    claim_nothing(&store, 0).await;
    claim_nothing(&store, FAR_FUTURE).await;
    assert!(everything(&store).await.is_empty());
}

pub(crate) async fn future_message_is_claimed_at_exactly_available_at<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    put_at(&store, "later", 0, 10 * SECOND, 5).await;
    let before = get(&store, "later").await;

    claim_nothing(&store, 0).await;
    claim_nothing(&store, 10 * SECOND - 1).await;
    assert_eq!(
        get(&store, "later").await,
        before,
        "an empty claim changed the message"
    );

    let claimed = claim_one(&store, 10 * SECOND, MINUTE).await;
    assert_eq!(claimed.id, "later");
    assert_eq!(claimed.available_at, at(10 * SECOND));
}

pub(crate) async fn claim_orders_by_available_at_then_created_at<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    // (id, created_at, available_at), enqueued out of order on purpose.
    let messages = [
        ("a", 0, 3_000),
        ("b", 10, 1_000),
        ("c", 20, 2_000),
        ("d", 30, 1_000),
        ("e", -50, 2_000),
    ];
    for (id, created, available) in messages {
        put_at(&store, id, created, available, 5).await;
    }
    let expected = ["b", "d", "e", "c", "a"];

    // Pairs first: the selection, not the order of the returned vector.
    let copy = store.clone();
    let first = claim(&copy, 2, 5_000, MINUTE).await;
    assert_eq!(ids(&first).0, sorted(&expected[..2]));
    let second = claim(&copy, 2, 5_000, MINUTE).await;
    assert_eq!(ids(&second).0, sorted(&expected[2..4]));
    let third = claim(&copy, 2, 5_000, MINUTE).await;
    assert_eq!(ids(&third).0, sorted(&expected[4..]));

    // Then one at a time, once the leases ran out: the same order exactly.
    let mut order = Vec::new();
    for _ in 0..expected.len() {
        order.push(claim_one(&store, 5_000 + MINUTE, MINUTE).await.id);
    }
    assert_eq!(order, expected);
    claim_nothing(&store, 5_000 + MINUTE).await;
}

pub(crate) async fn claim_respects_limit<S: OutboxStore + OutboxAdmin + Clone>(store: S) {
    for i in 0..10 {
        put_at(&store, &format!("m{i:02}"), i, i, 5).await;
    }
    let mut seen = HashSet::new();
    for expected in [3, 3, 3, 1, 0] {
        let batch = claim(&store, 3, SECOND, MINUTE).await;
        assert_eq!(batch.claimed.len(), expected);
        assert!(batch.dead_lettered.is_empty());
        for message in batch.claimed {
            assert!(seen.insert(message.id), "a live claim was handed out twice");
        }
    }
    assert_eq!(seen.len(), 10);

    // A limit above what is eligible takes everything eligible.
    let batch = claim(&store, 1_000, SECOND + MINUTE, MINUTE).await;
    assert_eq!(batch.claimed.len(), 10);
    let stats = store.stats(at(SECOND + MINUTE)).await.unwrap();
    assert_eq!(stats.claimed, 10);
    assert_eq!(stats.pending, 0);
}

pub(crate) async fn claim_sets_claim_fields<S: OutboxStore + OutboxAdmin + Clone>(store: S) {
    let trace = TraceCarrier {
        traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned(),
        tracestate: Some("congo=t61rcWkgMzE".to_owned()),
    };
    let payload = Payload::from(json!({ "order": 7, "lines": [1, 2, 3] }));
    let new = NewMessage::new(MessageKind::Job, "billing.charge", payload.clone())
        .with_id("job-1")
        .with_max_attempts(4)
        .with_trace(trace.clone())
        .available_at(at(500))
        .at(at(100));
    put(&store, new).await;

    let claimed = claim_one(&store, SECOND, 30 * SECOND).await;
    assert_eq!(claimed.id, "job-1");
    assert_eq!(claimed.kind, MessageKind::Job);
    assert_eq!(claimed.name, "billing.charge");
    assert_eq!(claimed.payload.to_value(), payload.to_value());
    assert_eq!(claimed.trace, Some(trace.clone()));
    assert_eq!(claimed.attempts, 1);
    assert_eq!(claimed.max_attempts, 4);
    assert_eq!(claimed.available_at, at(500));
    assert_eq!(claimed.created_at, at(100));
    assert!(!claimed.claim_token.is_empty());
    assert_eq!(claimed.claimed_at, at(SECOND));
    assert_eq!(claimed.locked_until, at(31 * SECOND));

    let stored = get(&store, "job-1").await;
    assert_eq!(stored.status, MessageStatus::Claimed);
    assert_eq!(stored.attempts, 1);
    assert_eq!(
        stored.claim_token.as_deref(),
        Some(claimed.claim_token.as_str())
    );
    assert_eq!(stored.claimed_at, Some(at(SECOND)));
    assert_eq!(stored.locked_until, Some(at(31 * SECOND)));
    assert_eq!(stored.updated_at, at(SECOND));
    assert_eq!(stored.created_at, at(100));
    assert_eq!(stored.available_at, at(500));
    assert_eq!(stored.delivered_at, None);
    assert_eq!(stored.last_error, None);
    assert_eq!(stored.trace, Some(trace));
}

pub(crate) async fn claim_tokens_are_never_reused<S: OutboxStore + OutboxAdmin + Clone>(store: S) {
    for i in 0..20 {
        put_at(&store, &format!("m{i:02}"), i, i, 10).await;
    }
    let mut tokens = HashSet::new();
    for round in 0..3 {
        let now = SECOND + round * MINUTE;
        let batch = claim(&store, 100, now, SECOND).await;
        assert_eq!(batch.claimed.len(), 20, "round {round}");
        for message in batch.claimed {
            assert!(!message.claim_token.is_empty());
            assert!(
                tokens.insert(message.claim_token.clone()),
                "token {} was handed out before",
                message.claim_token
            );
            assert_eq!(message.attempts, round as u32 + 1);
        }
    }
    assert_eq!(tokens.len(), 60);
}

pub(crate) async fn live_claim_is_not_claimable<S: OutboxStore + OutboxAdmin + Clone>(store: S) {
    put_at(&store, "held", 0, 0, 5).await;
    let claimed = claim_one(&store, 0, 10 * SECOND).await;
    let before = get(&store, "held").await;

    claim_nothing(&store, 0).await;
    claim_nothing(&store, 10 * SECOND - 1).await;
    assert_eq!(
        get(&store, "held").await,
        before,
        "an empty claim changed a live claim"
    );
    assert_eq!(before.claim_token, Some(claimed.claim_token));
}

pub(crate) async fn live_claims_do_not_block_later_messages<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    for i in 0..6 {
        put_at(&store, &format!("m{i}"), i, i, 5).await;
    }
    let first = claim(&store, 2, 10, MINUTE).await;
    assert_eq!(ids(&first).0, sorted(&["m0", "m1"]));
    // The oldest messages are held; the limit is filled from behind them.
    let second = claim(&store, 2, 20, MINUTE).await;
    assert_eq!(ids(&second).0, sorted(&["m2", "m3"]));
    let third = claim(&store, 5, 30, MINUTE).await;
    assert_eq!(ids(&third).0, sorted(&["m4", "m5"]));
}

pub(crate) async fn expired_claim_is_reclaimed_and_old_token_refused<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    put_at(&store, "m", 0, 0, 5).await;
    let first = claim_one(&store, 0, 10 * SECOND).await;

    // Exactly at `locked_until` the lease is over.
    let second = claim_one(&store, 10 * SECOND, 10 * SECOND).await;
    assert_eq!(second.id, "m");
    assert_ne!(second.claim_token, first.claim_token);
    assert_eq!(second.attempts, 2);
    assert_eq!(second.claimed_at, at(10 * SECOND));
    assert_eq!(second.locked_until, at(20 * SECOND));

    // The first worker comes back while the second claim is live.
    assert_token_refused(&store, "m", &first.claim_token, 11 * SECOND).await;
    let stored = get(&store, "m").await;
    assert_eq!(
        stored.claim_token.as_deref(),
        Some(second.claim_token.as_str())
    );
    assert_eq!(stored.attempts, 2);

    // The second claim still works.
    store
        .mark_delivered(delivered("m", &second.claim_token, 12 * SECOND))
        .await
        .expect("the live token settles");
    assert_eq!(get(&store, "m").await.status, MessageStatus::Delivered);
}

pub(crate) async fn expired_claims_compete_by_available_at<S: OutboxStore + OutboxAdmin + Clone>(
    store: S,
) {
    put_at(&store, "old", 0, 0, 5).await;
    claim_one(&store, 0, 10 * SECOND).await;
    put_at(&store, "new", 5 * SECOND, 5 * SECOND, 5).await;

    // Both are eligible at 20 s; the expired claim has the older `available_at`.
    let reclaimed = claim_one(&store, 20 * SECOND, MINUTE).await;
    assert_eq!(reclaimed.id, "old");
    assert_eq!(reclaimed.attempts, 2);
    assert_eq!(claim_one(&store, 20 * SECOND, MINUTE).await.id, "new");
}

pub(crate) async fn claims_judge_leases_by_their_own_now<S: OutboxStore + OutboxAdmin + Clone>(
    store: S,
) {
    for i in 0..3 {
        put_at(&store, &format!("m{i}"), i, i, 5).await;
    }
    let batch = claim(&store, 3, 10, 10 * SECOND).await;
    assert_eq!(batch.claimed.len(), 3);
    let token = |id: &str| {
        batch
            .claimed
            .iter()
            .find(|m| m.id == id)
            .map(|m| m.claim_token.clone())
            .unwrap()
    };

    // A worker whose clock reads 20 s takes one of the three expired claims.
    assert_eq!(claim_one(&store, 20 * SECOND, 10 * SECOND).await.id, "m0");
    // Workers whose clocks are behind still see the other two as live: the
    // lease is judged by each caller's `now`, not by what others have seen.
    claim_nothing(&store, 9 * SECOND).await;
    let until = store
        .renew_claim(renew("m1", &token("m1"), 9 * SECOND, MINUTE))
        .await
        .expect("the lease is live at the caller's now");
    assert_eq!(until, at(69 * SECOND));
    assert_eq!(get(&store, "m1").await.locked_until, Some(at(69 * SECOND)));

    let batch = claim(&store, 10, 20 * SECOND, MINUTE).await;
    assert_eq!(ids(&batch), (sorted(&["m2"]), vec![]));
    store
        .mark_delivered(delivered("m1", &token("m1"), 30 * SECOND))
        .await
        .expect("the renewed claim settles");
}

pub(crate) async fn exhausted_claim_is_dead_lettered_at_claim<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    put_at(&store, "m", 0, 0, 2).await;
    claim_one(&store, 0, SECOND).await;
    let last = claim_one(&store, SECOND, SECOND).await;
    assert_eq!(last.attempts, 2);

    // Both attempts ended in lost leases: the next claim gives up on it.
    let batch = claim(&store, 10, 2 * SECOND, SECOND).await;
    assert!(
        batch.claimed.is_empty(),
        "an exhausted message was claimed: {batch:?}"
    );
    assert_eq!(batch.dead_lettered.len(), 1);
    let dead = &batch.dead_lettered[0];
    assert_eq!(dead.id, "m");
    assert_eq!(dead.status, MessageStatus::DeadLettered);
    assert_eq!(dead.attempts, 2, "giving up is not an attempt");
    assert_eq!(dead.claim_token, None);
    assert_eq!(dead.claimed_at, None);
    assert_eq!(dead.locked_until, None);
    assert_eq!(dead.delivered_at, None);
    assert_eq!(dead.updated_at, at(2 * SECOND));
    let error = dead
        .last_error
        .as_ref()
        .expect("the abandoned claim is recorded");
    assert!(
        error.type_name.contains("AbandonedClaim"),
        "last_error names the abandoned-claim error: {error:?}"
    );
    assert!(!error.message.is_empty());

    assert_eq!(
        &get(&store, "m").await,
        dead,
        "the returned message is what is stored"
    );
    claim_nothing(&store, FAR_FUTURE).await;
    assert_token_refused(&store, "m", &last.claim_token, 2 * SECOND).await;
    let stats = store.stats(at(2 * SECOND)).await.unwrap();
    assert_eq!(
        (stats.dead_lettered, stats.claimed, stats.pending),
        (1, 0, 0)
    );
}

pub(crate) async fn exhausted_pending_message_is_dead_lettered_at_claim<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    // A retry scheduled after the last attempt: the claim, not the
    // delivery, is where the budget is enforced.
    put_at(&store, "m", 0, 0, 1).await;
    let claimed = claim_one(&store, 0, MINUTE).await;
    store
        .mark_failed(failed(
            "m",
            &claimed.claim_token,
            SECOND,
            false,
            Some(2 * SECOND),
        ))
        .await
        .unwrap();
    claim_nothing(&store, 2 * SECOND - 1).await;

    let batch = claim(&store, 10, 2 * SECOND, MINUTE).await;
    assert!(batch.claimed.is_empty());
    assert_eq!(batch.dead_lettered.len(), 1);
    let dead = &batch.dead_lettered[0];
    assert_eq!(dead.status, MessageStatus::DeadLettered);
    assert_eq!(dead.attempts, 1);
    assert!(
        dead.last_error
            .as_ref()
            .unwrap()
            .type_name
            .contains("AbandonedClaim")
    );
    assert_eq!(&get(&store, "m").await, dead);
    claim_nothing(&store, FAR_FUTURE).await;
}

pub(crate) async fn dead_letters_at_claim_count_toward_limit<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    // Exhausted (x) and fresh (f) messages interleaved by `available_at`.
    for (i, id) in ["x1", "f1", "x2", "f2", "x3", "f3"].iter().enumerate() {
        let max_attempts = if id.starts_with('x') { 1 } else { 5 };
        put_at(&store, id, i as i64, i as i64, max_attempts).await;
    }
    assert_eq!(claim(&store, 10, 10, SECOND).await.claimed.len(), 6);

    // All six leases ran out. Four are selected, two of which are exhausted.
    let batch = claim(&store, 4, 2 * SECOND, MINUTE).await;
    assert_eq!(batch.len(), 4);
    assert_eq!(ids(&batch), (sorted(&["f1", "f2"]), sorted(&["x1", "x2"])));

    // A dead letter alone fills a limit of one.
    let batch = claim(&store, 1, 2 * SECOND, MINUTE).await;
    assert_eq!(ids(&batch), (vec![], sorted(&["x3"])));

    let batch = claim(&store, 10, 2 * SECOND, MINUTE).await;
    assert_eq!(ids(&batch), (sorted(&["f3"]), vec![]));

    let stats = store.stats(at(2 * SECOND)).await.unwrap();
    assert_eq!((stats.claimed, stats.dead_lettered), (3, 3));
}

pub(crate) async fn invalid_claim_parameters_change_nothing<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    put_at(&store, "m", 0, 0, 5).await;
    let before = everything(&store).await;

    let zero_limit = ClaimBatch {
        on_dead_letter: Default::default(),
        limit: 0,
        now: at(SECOND),
        lease: lease(MINUTE),
        max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
        queues: Vec::new(),
        durable: true,
    };
    assert_invalid(store.claim_batch(zero_limit).await, "limit");
    let zero_lease = ClaimBatch {
        on_dead_letter: Default::default(),
        limit: 10,
        now: at(SECOND),
        lease: Duration::ZERO,
        max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
        queues: Vec::new(),
        durable: true,
    };
    assert_invalid(store.claim_batch(zero_lease).await, "lease");
    assert_eq!(everything(&store).await, before);
    assert_eq!(claim_one(&store, SECOND, MINUTE).await.attempts, 1);
}

pub(crate) async fn concurrent_claims_never_share_a_live_message<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    const MESSAGES: i64 = 500;
    const TASKS: usize = 8;
    const LIMIT: usize = 7;
    for i in 0..MESSAGES {
        put_at(&store, &format!("c{i:03}"), i, i, 5).await;
    }

    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let batch = claim(&store, LIMIT, MINUTE, 10 * MINUTE).await;
                assert!(batch.dead_lettered.is_empty());
                if batch.claimed.is_empty() {
                    return mine;
                }
                mine.extend(batch.claimed.into_iter().map(|m| (m.id, m.claim_token)));
            }
        }));
    }

    let mut ids = HashSet::new();
    let mut tokens = HashSet::new();
    for task in tasks {
        for (id, token) in task.await.expect("a claiming task panicked") {
            assert!(
                ids.insert(id.clone()),
                "{id} was claimed twice while its claim was live"
            );
            assert!(tokens.insert(token), "a token was handed out twice");
        }
    }
    assert_eq!(
        ids.len(),
        MESSAGES as usize,
        "every message is claimed exactly once"
    );

    let stats = store.stats(at(MINUTE)).await.unwrap();
    assert_eq!(
        (stats.claimed, stats.live_claims, stats.pending),
        (500, 500, 0)
    );
    let stored = everything(&store).await;
    assert!(
        stored
            .values()
            .all(|m| m.attempts == 1 && m.status == MessageStatus::Claimed)
    );
}
