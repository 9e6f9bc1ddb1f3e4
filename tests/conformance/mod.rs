//! The store contract, as tests every store must pass.
//!
//! A store's test file brings in this module, says how to make a fresh,
//! empty store, and expands the suite:
//!
//! ```ignore
//! mod conformance;
//! async fn setup() -> MyStore { /* a fresh, empty store */ }
//! conformance::conformance_suite!(setup);
//! ```
//!
//! Each case is a generic function over the public port alone, so the memory,
//! SQLite and PostgreSQL stores run exactly the same checks. The rules that
//! make that possible:
//!
//! - every timestamp is passed in (`at(ms)`: whole milliseconds after a fixed
//!   base), never read from a clock, and SQL stores keep microseconds, so
//!   every value read back must equal the value written;
//! - no sleeping and no paused tokio clock: SQL stores do real I/O, and a
//!   paused clock would jump ahead while they wait on it;
//! - no ordering is assumed among messages with the same `created_at`, nor
//!   in the vectors a claim returns: order is checked through *which*
//!   messages a claim selects;
//! - after every refusal the test re-reads what it refused to touch.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Debug;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use outbox::message::MAX_ERROR_RECORD_BYTES;
use outbox::{
    AdminError, ClaimBatch, ClaimedBatch, ClaimedMessage, Error, ErrorRecord, ListCursor,
    ListMessages, MarkDelivered, MarkFailed, MessageKind, MessageStatus, NewMessage, OutboxAdmin,
    OutboxMessage, OutboxStats, OutboxStore, Payload, PurgeMessages, ReleaseClaim, RenewClaim,
    RequeueDeadLetters, Result, TraceCarrier,
};
use serde_json::json;

/// Expands to one `#[tokio::test]` per contract case, each on a fresh store
/// from `$setup`, an `async fn() -> S` where `S: OutboxStore + OutboxAdmin + Clone`.
macro_rules! conformance_suite {
    ($setup:path) => {
        $crate::conformance::conformance_suite!(@cases $setup;
            conformance_empty_store_claims_nothing => empty_store_claims_nothing,
            conformance_future_message_is_claimed_at_exactly_available_at
                => future_message_is_claimed_at_exactly_available_at,
            conformance_claim_orders_by_available_at_then_created_at
                => claim_orders_by_available_at_then_created_at,
            conformance_claim_respects_limit => claim_respects_limit,
            conformance_claim_sets_claim_fields => claim_sets_claim_fields,
            conformance_claim_tokens_are_never_reused => claim_tokens_are_never_reused,
            conformance_live_claim_is_not_claimable => live_claim_is_not_claimable,
            conformance_live_claims_do_not_block_later_messages
                => live_claims_do_not_block_later_messages,
            conformance_expired_claim_is_reclaimed_and_old_token_refused
                => expired_claim_is_reclaimed_and_old_token_refused,
            conformance_expired_claims_compete_by_available_at
                => expired_claims_compete_by_available_at,
            conformance_claims_judge_leases_by_their_own_now
                => claims_judge_leases_by_their_own_now,
            conformance_exhausted_claim_is_dead_lettered_at_claim
                => exhausted_claim_is_dead_lettered_at_claim,
            conformance_exhausted_pending_message_is_dead_lettered_at_claim
                => exhausted_pending_message_is_dead_lettered_at_claim,
            conformance_dead_letters_at_claim_count_toward_limit
                => dead_letters_at_claim_count_toward_limit,
            conformance_renew_extends_live_claim => renew_extends_live_claim,
            conformance_renew_refuses_wrong_token => renew_refuses_wrong_token,
            conformance_renew_refuses_expired_lease => renew_refuses_expired_lease,
            conformance_renew_refuses_unclaimed_message => renew_refuses_unclaimed_message,
            conformance_deliver_refuses_wrong_token_and_expired_lease
                => deliver_refuses_wrong_token_and_expired_lease,
            conformance_fail_refuses_wrong_token_and_expired_lease
                => fail_refuses_wrong_token_and_expired_lease,
            conformance_release_refuses_wrong_token_and_expired_lease
                => release_refuses_wrong_token_and_expired_lease,
            conformance_deliver_settles_for_good => deliver_settles_for_good,
            conformance_fail_with_retry_at_reschedules => fail_with_retry_at_reschedules,
            conformance_fail_without_retry_at_is_available_now
                => fail_without_retry_at_is_available_now,
            conformance_fail_with_dead_letter_settles_for_good
                => fail_with_dead_letter_settles_for_good,
            conformance_release_returns_message_uncounted => release_returns_message_uncounted,
            conformance_release_keeps_payload_and_last_error
                => release_keeps_payload_and_last_error,
            conformance_release_does_not_spend_the_attempt_budget
                => release_does_not_spend_the_attempt_budget,
            conformance_settled_claim_refuses_further_writes
                => settled_claim_refuses_further_writes,
            conformance_invalid_claim_parameters_change_nothing
                => invalid_claim_parameters_change_nothing,
            conformance_invalid_fence_parameters_change_nothing
                => invalid_fence_parameters_change_nothing,
            conformance_invalid_enqueue_changes_nothing => invalid_enqueue_changes_nothing,
            conformance_enqueue_generates_unique_ids => enqueue_generates_unique_ids,
            conformance_enqueue_duplicate_id_leaves_stored_message_untouched
                => enqueue_duplicate_id_leaves_stored_message_untouched,
            conformance_enqueue_stores_every_field => enqueue_stores_every_field,
            conformance_payload_round_trips => payload_round_trips,
            conformance_trace_carrier_round_trips => trace_carrier_round_trips,
            conformance_oversized_error_is_stored_truncated
                => oversized_error_is_stored_truncated,
            conformance_stats_counts_statuses_and_claims => stats_counts_statuses_and_claims,
            conformance_get_missing_message_is_not_found => get_missing_message_is_not_found,
            conformance_list_filters_by_status_and_name => list_filters_by_status_and_name,
            conformance_list_pages_are_disjoint_and_complete
                => list_pages_are_disjoint_and_complete,
            conformance_list_is_stable_across_inserts => list_is_stable_across_inserts,
            conformance_list_refuses_invalid_limit => list_refuses_invalid_limit,
            conformance_requeue_dead_letter_by_id => requeue_dead_letter_by_id,
            conformance_requeue_all_dead_letters_by_name => requeue_all_dead_letters_by_name,
            conformance_requeue_refuses_live_claim => requeue_refuses_live_claim,
            conformance_requeue_refuses_non_dead_letters => requeue_refuses_non_dead_letters,
            conformance_purge_removes_only_old_terminal_messages
                => purge_removes_only_old_terminal_messages,
            conformance_purge_refuses_pending_and_claimed => purge_refuses_pending_and_claimed,
        );

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn conformance_concurrent_claims_never_share_a_live_message() {
            $crate::conformance::concurrent_claims_never_share_a_live_message($setup().await)
                .await;
        }
    };
    (@cases $setup:path; $($test:ident => $case:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $test() {
                $crate::conformance::$case($setup().await).await;
            }
        )*
    };
}
pub(crate) use conformance_suite;

// ---------------------------------------------------------------------------
// Time, messages and checks shared by the cases.

const SECOND: i64 = 1_000;
const MINUTE: i64 = 60 * SECOND;
/// Far enough ahead that anything still claimable would be claimed.
const FAR_FUTURE: i64 = 10 * 365 * 24 * 60 * MINUTE;

/// `ms` milliseconds after 2026-01-01T00:00:00Z.
fn at(ms: i64) -> DateTime<Utc> {
    let base = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
    base + chrono::Duration::milliseconds(ms)
}

fn lease(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).expect("a lease is positive"))
}

/// An event named `name`, with `id`, enqueued at `created` and available then.
fn message(id: &str, name: &str, created: i64) -> NewMessage {
    NewMessage::new(
        MessageKind::Event,
        name,
        Payload::from(json!({ "id": id, "name": name })),
    )
    .with_id(id)
    .at(at(created))
}

async fn put<S: OutboxStore>(store: &S, new: NewMessage) -> String {
    store.enqueue(new).await.expect("enqueue")
}

/// Enqueue `id` at `created`, available at `available`, with `max_attempts`.
async fn put_at<S: OutboxStore>(
    store: &S,
    id: &str,
    created: i64,
    available: i64,
    max_attempts: u32,
) -> String {
    let new = message(id, "conformance.event", created)
        .available_at(at(available))
        .with_max_attempts(max_attempts);
    put(store, new).await
}

async fn claim<S: OutboxStore>(store: &S, limit: usize, now: i64, lease_ms: i64) -> ClaimedBatch {
    let batch = store
        .claim_batch(ClaimBatch {
            limit,
            now: at(now),
            lease: lease(lease_ms),
        })
        .await
        .expect("claim_batch");
    assert!(
        batch.len() <= limit,
        "a claim of {limit} selected {} messages",
        batch.len()
    );
    batch
}

/// Claim exactly one message and no dead letter.
async fn claim_one<S: OutboxStore>(store: &S, now: i64, lease_ms: i64) -> ClaimedMessage {
    let mut batch = claim(store, 1, now, lease_ms).await;
    assert!(
        batch.dead_lettered.is_empty(),
        "unexpected dead letters: {batch:?}"
    );
    assert_eq!(batch.claimed.len(), 1, "expected one claim: {batch:?}");
    batch.claimed.pop().unwrap()
}

async fn claim_nothing<S: OutboxStore>(store: &S, now: i64) {
    let batch = claim(store, 100, now, MINUTE).await;
    assert!(
        batch.is_empty(),
        "expected nothing claimable at {now} ms: {batch:?}"
    );
}

fn ids(batch: &ClaimedBatch) -> (Vec<String>, Vec<String>) {
    let mut claimed: Vec<String> = batch.claimed.iter().map(|m| m.id.clone()).collect();
    let mut dead: Vec<String> = batch.dead_lettered.iter().map(|m| m.id.clone()).collect();
    claimed.sort();
    dead.sort();
    (claimed, dead)
}

fn sorted(ids: &[&str]) -> Vec<String> {
    let mut ids: Vec<String> = ids.iter().map(|id| id.to_string()).collect();
    ids.sort();
    ids
}

async fn get<S: OutboxAdmin>(store: &S, id: &str) -> OutboxMessage {
    store.get_message(id).await.expect("get_message")
}

/// Every stored message, by id, read through the admin listing.
async fn everything<S: OutboxAdmin>(store: &S) -> BTreeMap<String, OutboxMessage> {
    let mut all = BTreeMap::new();
    let mut after = None;
    loop {
        let page = store
            .list_messages(ListMessages {
                limit: 10_000,
                after,
                ..ListMessages::default()
            })
            .await
            .expect("list_messages");
        for message in page.messages {
            let id = message.id.clone();
            assert!(
                all.insert(id.clone(), message).is_none(),
                "{id} listed twice"
            );
        }
        match page.next {
            Some(next) => after = Some(next),
            None => return all,
        }
    }
}

fn renew(id: &str, token: &str, now: i64, lease_ms: i64) -> RenewClaim {
    RenewClaim {
        id: id.to_owned(),
        claim_token: token.to_owned(),
        now: at(now),
        lease: lease(lease_ms),
    }
}

fn delivered(id: &str, token: &str, now: i64) -> MarkDelivered {
    MarkDelivered {
        id: id.to_owned(),
        claim_token: token.to_owned(),
        now: at(now),
    }
}

fn failed(id: &str, token: &str, now: i64, dead_letter: bool, retry_at: Option<i64>) -> MarkFailed {
    MarkFailed {
        id: id.to_owned(),
        claim_token: token.to_owned(),
        error: delivery_error(),
        dead_letter,
        now: at(now),
        retry_at: retry_at.map(at),
    }
}

fn released(id: &str, token: &str, now: i64) -> ReleaseClaim {
    ReleaseClaim {
        id: id.to_owned(),
        claim_token: token.to_owned(),
        now: at(now),
    }
}

fn delivery_error() -> ErrorRecord {
    ErrorRecord {
        type_name: "app::DeliveryFailed".to_owned(),
        message: "the downstream service answered 503".to_owned(),
        causes: vec!["connection reset by peer".to_owned()],
        truncated: false,
    }
}

/// `result` must be the claim error for `id`.
#[track_caller]
fn assert_claim_lost<T: Debug>(result: Result<T>, id: &str) {
    match result {
        Err(Error::Claim(error)) => {
            assert_eq!(error.id, id, "the claim error names the message");
            assert!(Error::Claim(error).is_claim_lost());
        }
        other => panic!("expected a claim error for {id}, got {other:?}"),
    }
}

/// `result` must reject `field` as invalid input.
#[track_caller]
fn assert_invalid<T: Debug>(result: Result<T>, field: &str) {
    match result {
        Err(Error::InvalidInput { field: got, .. }) => assert_eq!(got, field),
        other => panic!("expected invalid `{field}`, got {other:?}"),
    }
}

/// Try every fenced write with `token` at `now`; each must be refused with a
/// claim error and leave the message exactly as it was.
async fn assert_token_refused<S: OutboxStore + OutboxAdmin>(
    store: &S,
    id: &str,
    token: &str,
    now: i64,
) {
    let before = get(store, id).await;
    assert_claim_lost(store.renew_claim(renew(id, token, now, MINUTE)).await, id);
    assert_eq!(get(store, id).await, before, "a refused renew changed {id}");
    assert_claim_lost(store.mark_delivered(delivered(id, token, now)).await, id);
    assert_eq!(
        get(store, id).await,
        before,
        "a refused delivery changed {id}"
    );
    for dead_letter in [false, true] {
        let fail = failed(id, token, now, dead_letter, Some(now + MINUTE));
        assert_claim_lost(store.mark_failed(fail).await, id);
        assert_eq!(
            get(store, id).await,
            before,
            "a refused failure changed {id}"
        );
    }
    assert_claim_lost(store.release_claim(released(id, token, now)).await, id);
    assert_eq!(
        get(store, id).await,
        before,
        "a refused release changed {id}"
    );
}

// ---------------------------------------------------------------------------
// Claims.

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

pub(crate) async fn invalid_claim_parameters_change_nothing<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    put_at(&store, "m", 0, 0, 5).await;
    let before = everything(&store).await;

    let zero_limit = ClaimBatch {
        limit: 0,
        now: at(SECOND),
        lease: lease(MINUTE),
    };
    assert_invalid(store.claim_batch(zero_limit).await, "limit");
    let zero_lease = ClaimBatch {
        limit: 10,
        now: at(SECOND),
        lease: Duration::ZERO,
    };
    assert_invalid(store.claim_batch(zero_lease).await, "lease");
    assert_eq!(everything(&store).await, before);
    assert_eq!(claim_one(&store, SECOND, MINUTE).await.attempts, 1);
}

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

// ---------------------------------------------------------------------------
// Enqueue and what is stored.

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
        match store.enqueue(duplicate).await {
            Err(Error::DuplicateId { id: taken }) => assert_eq!(taken, id),
            other => panic!("expected a duplicate id error for {id}, got {other:?}"),
        }
    }
    assert_eq!(everything(&store).await, before);
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

// ---------------------------------------------------------------------------
// Admin.

pub(crate) async fn stats_counts_statuses_and_claims<S: OutboxStore + OutboxAdmin + Clone>(
    store: S,
) {
    assert_eq!(store.stats(at(0)).await.unwrap(), OutboxStats::default());

    // Claimed first, in this order of `available_at`.
    put_at(&store, "delivered", 0, 100, 5).await;
    put_at(&store, "dead", 1, 200, 5).await;
    put_at(&store, "live", 2, 300, 5).await;
    put_at(&store, "expired", 3, 400, 5).await;
    // Left pending: two due (the oldest at 2 s) and one in the future.
    put_at(&store, "due-new", 4, 3 * SECOND, 5).await;
    put_at(&store, "due-old", 5, 2 * SECOND, 5).await;
    put_at(&store, "future", 6, 10 * MINUTE, 5).await;

    let batch = claim(&store, 4, SECOND, 10 * SECOND).await;
    assert_eq!(
        ids(&batch).0,
        sorted(&["delivered", "dead", "live", "expired"])
    );
    let token = |id: &str| {
        batch
            .claimed
            .iter()
            .find(|m| m.id == id)
            .map(|m| m.claim_token.clone())
            .unwrap()
    };
    store
        .mark_delivered(delivered("delivered", &token("delivered"), 2 * SECOND))
        .await
        .unwrap();
    store
        .mark_failed(failed("dead", &token("dead"), 2 * SECOND, true, None))
        .await
        .unwrap();
    store
        .renew_claim(renew("live", &token("live"), 5 * SECOND, MINUTE))
        .await
        .unwrap();

    let before = everything(&store).await;
    let stats = store.stats(at(20 * SECOND)).await.unwrap();
    let mut expected = OutboxStats::default();
    expected.pending = 3;
    expected.claimed = 2;
    expected.delivered = 1;
    expected.dead_lettered = 1;
    expected.live_claims = 1;
    expected.expired_claims = 1;
    expected.oldest_due_at = Some(at(2 * SECOND));
    assert_eq!(stats, expected);
    let per_status: u64 = MessageStatus::ALL.iter().map(|s| stats.count(*s)).sum();
    assert_eq!((stats.total(), per_status), (7, 7));

    // Earlier, only one of the pending messages was due, and both claims were live.
    let early = store.stats(at(2 * SECOND + 500)).await.unwrap();
    assert_eq!(early.oldest_due_at, Some(at(2 * SECOND)));
    assert_eq!((early.live_claims, early.expired_claims), (2, 0));
    let earliest = store.stats(at(2 * SECOND - 1)).await.unwrap();
    assert_eq!(earliest.oldest_due_at, None);

    assert_eq!(everything(&store).await, before, "stats changed something");
}

pub(crate) async fn get_missing_message_is_not_found<S: OutboxStore + OutboxAdmin + Clone>(
    store: S,
) {
    match store.get_message("nope").await {
        Err(Error::NotFound { id }) => assert_eq!(id, "nope"),
        other => panic!("expected not found, got {other:?}"),
    }
    put(&store, message("yes", "e", 0)).await;
    assert!(matches!(
        store.get_message("nope").await,
        Err(Error::NotFound { .. })
    ));
    assert_eq!(get(&store, "yes").await.id, "yes");
}

/// Enqueue `count` messages named by turns `a`, `b`, `c`, created a second
/// apart, and settle a few so every status is present. Returns the ids.
async fn populate<S: OutboxStore + OutboxAdmin>(store: &S, count: i64) -> Vec<String> {
    let mut all = Vec::new();
    for i in 0..count {
        let name = ["a", "b", "c"][i as usize % 3];
        all.push(put(store, message(&format!("m{i:03}"), name, i * SECOND)).await);
    }
    // m000 delivered, m001 dead-lettered, m002 claimed; the rest pending.
    let batch = claim(store, 3, count * SECOND, MINUTE).await;
    for claimed in batch.claimed {
        match claimed.id.as_str() {
            "m000" => store
                .mark_delivered(delivered("m000", &claimed.claim_token, count * SECOND))
                .await
                .unwrap(),
            "m001" => store
                .mark_failed(failed(
                    "m001",
                    &claimed.claim_token,
                    count * SECOND,
                    true,
                    None,
                ))
                .await
                .unwrap(),
            _ => {}
        }
    }
    all
}

pub(crate) async fn list_filters_by_status_and_name<S: OutboxStore + OutboxAdmin + Clone>(
    store: S,
) {
    populate(&store, 12).await;
    let list = |status: Option<MessageStatus>, name: Option<&str>| {
        let store = store.clone();
        let name = name.map(str::to_owned);
        async move {
            let page = store
                .list_messages(ListMessages {
                    status,
                    name,
                    limit: 100,
                    after: None,
                })
                .await
                .unwrap();
            assert!(page.next.is_none());
            let created: Vec<_> = page.messages.iter().map(|m| m.created_at).collect();
            assert!(created.windows(2).all(|w| w[0] <= w[1]), "oldest first");
            page.messages
                .into_iter()
                .map(|m| m.id)
                .collect::<Vec<String>>()
        }
    };

    assert_eq!(list(None, None).await.len(), 12);
    assert_eq!(list(Some(MessageStatus::Delivered), None).await, ["m000"]);
    assert_eq!(
        list(Some(MessageStatus::DeadLettered), None).await,
        ["m001"]
    );
    assert_eq!(list(Some(MessageStatus::Claimed), None).await, ["m002"]);
    assert_eq!(list(Some(MessageStatus::Pending), None).await.len(), 9);
    assert_eq!(
        list(None, Some("a")).await,
        ["m000", "m003", "m006", "m009"]
    );
    assert_eq!(
        list(Some(MessageStatus::Pending), Some("b")).await,
        ["m004", "m007", "m010"]
    );
    assert_eq!(
        list(Some(MessageStatus::Claimed), Some("a")).await,
        Vec::<String>::new()
    );
    assert_eq!(list(None, Some("nobody")).await, Vec::<String>::new());
}

/// Page through a listing `limit` at a time; returns the pages' ids.
async fn pages<S: OutboxAdmin>(
    store: &S,
    status: Option<MessageStatus>,
    name: Option<&str>,
    limit: usize,
) -> Vec<Vec<String>> {
    let mut pages = Vec::new();
    let mut after = None;
    loop {
        let page = store
            .list_messages(ListMessages {
                status,
                name: name.map(str::to_owned),
                limit,
                after,
            })
            .await
            .unwrap();
        assert!(page.messages.len() <= limit);
        assert!(pages.len() < 1_000, "the listing does not end");
        if let (Some(next), Some(last)) = (&page.next, page.messages.last()) {
            assert_eq!(
                next,
                &ListCursor {
                    created_at: last.created_at,
                    id: last.id.clone()
                },
                "the cursor is the last message seen"
            );
        }
        let done = page.next.is_none();
        after = page.next;
        pages.push(page.messages.into_iter().map(|m| m.id).collect());
        if done {
            return pages;
        }
    }
}

fn assert_disjoint_cover(pages: &[Vec<String>], expected: &[String]) {
    let mut seen = HashSet::new();
    for id in pages.iter().flatten() {
        assert!(seen.insert(id.clone()), "{id} is on two pages");
    }
    let expected: HashSet<String> = expected.iter().cloned().collect();
    assert_eq!(seen, expected, "the pages cover the listing exactly");
}

pub(crate) async fn list_pages_are_disjoint_and_complete<S: OutboxStore + OutboxAdmin + Clone>(
    store: S,
) {
    // Groups of three share a `created_at`, so the cursor's tie-break on id
    // decides what comes next.
    let mut all = Vec::new();
    for i in 0..24 {
        all.push(
            put(
                &store,
                message(&format!("t{i:02}"), ["a", "b"][i % 2], (i / 3) as i64),
            )
            .await,
        );
    }
    for limit in [1, 2, 4, 5, 7, 24, 100] {
        let pages = pages(&store, None, None, limit).await;
        assert_disjoint_cover(&pages, &all);
        assert_eq!(
            pages.len(),
            24_usize.div_ceil(limit),
            "page count at limit {limit}"
        );
        let full = pages[..pages.len() - 1].iter().all(|p| p.len() == limit);
        assert!(full, "only the last page is short at limit {limit}");
    }
    let named_a: Vec<String> = all.iter().step_by(2).cloned().collect();
    assert_disjoint_cover(&pages(&store, None, Some("a"), 5).await, &named_a);
    assert_disjoint_cover(
        &pages(&store, Some(MessageStatus::Pending), Some("b"), 4).await,
        &all.iter().skip(1).step_by(2).cloned().collect::<Vec<_>>(),
    );
}

pub(crate) async fn list_is_stable_across_inserts<S: OutboxStore + OutboxAdmin + Clone>(store: S) {
    let mut original = Vec::new();
    for i in 0..9 {
        original.push(put(&store, message(&format!("o{i}"), "e", i * SECOND)).await);
    }
    let mut seen = Vec::new();
    let mut after = None;
    let mut late = Vec::new();
    let mut page_no = 0;
    loop {
        let page = store
            .list_messages(ListMessages {
                limit: 4,
                after: after.clone(),
                ..ListMessages::default()
            })
            .await
            .unwrap();
        seen.extend(page.messages.iter().map(|m| m.id.clone()));
        let Some(next) = page.next else { break };
        after = Some(next);
        // Between pages, one message arrives after everything and one before
        // the cursor; neither may shift what the next page holds.
        page_no += 1;
        let id = put(
            &store,
            message(&format!("late{page_no}"), "e", MINUTE + page_no),
        )
        .await;
        late.push(id);
        put(&store, message(&format!("early{page_no}"), "e", -SECOND)).await;
    }
    assert!(page_no >= 2, "the listing spanned several pages");
    let mut unique = HashSet::new();
    for id in &seen {
        assert!(unique.insert(id.clone()), "{id} listed twice");
    }
    for id in original.iter().chain(&late) {
        assert!(unique.contains(id), "{id} was skipped");
    }
}

pub(crate) async fn list_refuses_invalid_limit<S: OutboxStore + OutboxAdmin + Clone>(store: S) {
    put(&store, message("m", "e", 0)).await;
    for limit in [0, 10_001] {
        let params = ListMessages {
            limit,
            ..ListMessages::default()
        };
        assert_invalid(store.list_messages(params).await, "limit");
    }
    let params = ListMessages {
        limit: 10_000,
        ..ListMessages::default()
    };
    assert_eq!(store.list_messages(params).await.unwrap().messages.len(), 1);
}

/// Dead-letter `id` (enqueued at `created`) through a failed claim at `now`.
async fn dead_letter<S: OutboxStore + OutboxAdmin>(store: &S, id: &str, name: &str, now: i64) {
    put(store, message(id, name, now)).await;
    let batch = claim(store, 100, now, MINUTE).await;
    let claimed = batch
        .claimed
        .iter()
        .find(|m| m.id == id)
        .expect("the new message is claimed");
    store
        .mark_failed(failed(id, &claimed.claim_token, now, true, None))
        .await
        .unwrap();
    for other in batch.claimed.iter().filter(|m| m.id != id) {
        store
            .release_claim(released(&other.id, &other.claim_token, now))
            .await
            .unwrap();
    }
    assert_eq!(get(store, id).await.status, MessageStatus::DeadLettered);
}

pub(crate) async fn requeue_dead_letter_by_id<S: OutboxStore + OutboxAdmin + Clone>(store: S) {
    dead_letter(&store, "dead", "e", 0).await;
    dead_letter(&store, "other", "e", 1).await;
    let other = get(&store, "other").await;

    let count = store
        .requeue_dead_letters(RequeueDeadLetters {
            id: Some("dead".to_owned()),
            name: None,
            now: at(MINUTE),
        })
        .await
        .unwrap();
    assert_eq!(count, 1);
    let stored = get(&store, "dead").await;
    assert_eq!(stored.status, MessageStatus::Pending);
    assert_eq!(stored.attempts, 0);
    assert_eq!(stored.available_at, at(MINUTE));
    assert_eq!(stored.updated_at, at(MINUTE));
    assert_eq!(stored.claim_token, None);
    assert_eq!(
        get(&store, "other").await,
        other,
        "only the named message moves"
    );

    claim_nothing(&store, MINUTE - 1).await;
    let claimed = claim_one(&store, MINUTE, MINUTE).await;
    assert_eq!((claimed.id.as_str(), claimed.attempts), ("dead", 1));
}

pub(crate) async fn requeue_all_dead_letters_by_name<S: OutboxStore + OutboxAdmin + Clone>(
    store: S,
) {
    dead_letter(&store, "a1", "a", 0).await;
    dead_letter(&store, "a2", "a", 1).await;
    dead_letter(&store, "b1", "b", 2).await;
    put(&store, message("a-pending", "a", 3)).await;
    let pending = get(&store, "a-pending").await;

    let requeue = |name: Option<&str>| RequeueDeadLetters {
        id: None,
        name: name.map(str::to_owned),
        now: at(MINUTE),
    };
    assert_eq!(
        store
            .requeue_dead_letters(requeue(Some("a")))
            .await
            .unwrap(),
        2
    );
    for id in ["a1", "a2"] {
        let stored = get(&store, id).await;
        assert_eq!(
            (stored.status, stored.attempts),
            (MessageStatus::Pending, 0)
        );
        assert_eq!(stored.available_at, at(MINUTE));
    }
    assert_eq!(get(&store, "b1").await.status, MessageStatus::DeadLettered);
    assert_eq!(
        get(&store, "a-pending").await,
        pending,
        "pending messages are not touched"
    );
    assert_eq!(
        store
            .requeue_dead_letters(requeue(Some("a")))
            .await
            .unwrap(),
        0
    );

    assert_eq!(store.requeue_dead_letters(requeue(None)).await.unwrap(), 1);
    assert_eq!(get(&store, "b1").await.status, MessageStatus::Pending);
    assert_eq!(store.stats(at(MINUTE)).await.unwrap().dead_lettered, 0);
    assert_eq!(claim(&store, 10, MINUTE, MINUTE).await.claimed.len(), 4);
}

pub(crate) async fn requeue_refuses_live_claim<S: OutboxStore + OutboxAdmin + Clone>(store: S) {
    put_at(&store, "m", 0, 0, 5).await;
    let claimed = claim_one(&store, 0, MINUTE).await;
    let before = get(&store, "m").await;

    let requeue = RequeueDeadLetters {
        id: Some("m".to_owned()),
        name: None,
        now: at(SECOND),
    };
    match store.requeue_dead_letters(requeue).await {
        Err(Error::Admin(AdminError::ClaimLive { id, locked_until })) => {
            assert_eq!(id, "m");
            assert_eq!(locked_until, at(MINUTE));
        }
        other => panic!("expected a live-claim refusal, got {other:?}"),
    }
    assert_eq!(get(&store, "m").await, before);
    store
        .mark_delivered(delivered("m", &claimed.claim_token, 2 * SECOND))
        .await
        .expect("the claim survived the refused requeue");
}

pub(crate) async fn requeue_refuses_non_dead_letters<S: OutboxStore + OutboxAdmin + Clone>(
    store: S,
) {
    put_at(&store, "delivered", 0, 0, 5).await;
    put_at(&store, "expired", 1, 1, 5).await;
    put_at(&store, "pending", 2, MINUTE, 5).await;
    let batch = claim(&store, 2, 10, SECOND).await;
    let delivered_token = batch
        .claimed
        .iter()
        .find(|m| m.id == "delivered")
        .map(|m| m.claim_token.clone())
        .unwrap();
    store
        .mark_delivered(delivered("delivered", &delivered_token, 20))
        .await
        .unwrap();
    let before = everything(&store).await;

    let requeue = |id: &str| RequeueDeadLetters {
        id: Some(id.to_owned()),
        name: None,
        now: at(10 * SECOND),
    };
    for (id, status) in [
        ("delivered", MessageStatus::Delivered),
        ("expired", MessageStatus::Claimed),
        ("pending", MessageStatus::Pending),
    ] {
        match store.requeue_dead_letters(requeue(id)).await {
            Err(Error::Admin(AdminError::NotDeadLettered {
                id: got,
                status: is,
            })) => {
                assert_eq!((got.as_str(), is), (id, status));
            }
            other => panic!("expected {id} to be refused as not dead-lettered, got {other:?}"),
        }
    }
    assert!(matches!(
        store.requeue_dead_letters(requeue("missing")).await,
        Err(Error::NotFound { .. })
    ));
    assert_invalid(store.requeue_dead_letters(requeue("")).await, "id");
    let both = RequeueDeadLetters {
        name: Some("e".to_owned()),
        ..requeue("delivered")
    };
    assert_invalid(store.requeue_dead_letters(both).await, "name");
    // Requeueing all when there are no dead letters is a no-op, not an error.
    let all = RequeueDeadLetters {
        id: None,
        name: None,
        now: at(10 * SECOND),
    };
    assert_eq!(store.requeue_dead_letters(all).await.unwrap(), 0);
    assert_eq!(everything(&store).await, before);
}

pub(crate) async fn purge_removes_only_old_terminal_messages<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    // Settled at 1 s, 2 s and 10 s; three more left unsettled.
    for (i, id) in [
        "delivered-old",
        "dead-old",
        "delivered-new",
        "live",
        "expired",
    ]
    .iter()
    .enumerate()
    {
        put_at(&store, id, i as i64, i as i64, 5).await;
    }
    put_at(&store, "pending", 10, 10, 5).await;
    let tokens: BTreeMap<String, String> = claim(&store, 5, 100, SECOND)
        .await
        .claimed
        .into_iter()
        .map(|m| (m.id, m.claim_token))
        .collect();
    assert_eq!(tokens.len(), 5);
    store
        .mark_delivered(delivered(
            "delivered-old",
            &tokens["delivered-old"],
            SECOND - 1,
        ))
        .await
        .unwrap();
    store
        .mark_failed(failed(
            "dead-old",
            &tokens["dead-old"],
            SECOND - 1,
            true,
            None,
        ))
        .await
        .unwrap();
    store
        .renew_claim(renew(
            "delivered-new",
            &tokens["delivered-new"],
            500,
            20 * SECOND,
        ))
        .await
        .unwrap();
    store
        .renew_claim(renew("live", &tokens["live"], 500, 10 * MINUTE))
        .await
        .unwrap();
    store
        .mark_delivered(delivered(
            "delivered-new",
            &tokens["delivered-new"],
            10 * SECOND,
        ))
        .await
        .unwrap();

    let purge = |status, older_than| PurgeMessages { status, older_than };
    // The horizon is exclusive: a message settled exactly at it stays.
    assert_eq!(store.purge(purge(None, at(SECOND - 1))).await.unwrap(), 0);
    assert_eq!(store.purge(purge(None, at(5 * SECOND))).await.unwrap(), 2);
    for id in ["delivered-old", "dead-old"] {
        assert!(matches!(
            store.get_message(id).await,
            Err(Error::NotFound { .. })
        ));
    }
    let left = everything(&store).await;
    assert_eq!(
        left.keys().cloned().collect::<Vec<_>>(),
        sorted(&["delivered-new", "expired", "live", "pending"])
    );

    // By status, past everything: only that status goes.
    let far = at(FAR_FUTURE);
    assert_eq!(
        store
            .purge(purge(Some(MessageStatus::DeadLettered), far))
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        store
            .purge(purge(Some(MessageStatus::Delivered), far))
            .await
            .unwrap(),
        1
    );
    let left = everything(&store).await;
    assert_eq!(
        left.keys().cloned().collect::<Vec<_>>(),
        sorted(&["expired", "live", "pending"])
    );
    assert_eq!(store.purge(purge(None, far)).await.unwrap(), 0);
    assert_eq!(
        everything(&store).await,
        left,
        "unsettled messages are never purged"
    );
    let stats = store.stats(at(20 * SECOND)).await.unwrap();
    assert_eq!(
        (stats.delivered, stats.dead_lettered, stats.total()),
        (0, 0, 3)
    );
}

pub(crate) async fn purge_refuses_pending_and_claimed<S: OutboxStore + OutboxAdmin + Clone>(
    store: S,
) {
    put_at(&store, "claimed", 0, 0, 5).await;
    put_at(&store, "pending", 1, MINUTE, 5).await;
    claim_one(&store, 0, SECOND).await;
    let before = everything(&store).await;

    for status in [MessageStatus::Pending, MessageStatus::Claimed] {
        let purge = PurgeMessages {
            status: Some(status),
            older_than: at(FAR_FUTURE),
        };
        match store.purge(purge).await {
            Err(Error::Admin(AdminError::UnsafePurge { status: refused })) => {
                assert_eq!(refused, status)
            }
            other => panic!("expected purging {status} to be refused, got {other:?}"),
        }
    }
    assert_eq!(everything(&store).await, before);
}

// ---------------------------------------------------------------------------
// Concurrency.

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
