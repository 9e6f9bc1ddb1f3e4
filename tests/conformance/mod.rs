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

pub(crate) mod admin;
pub(crate) mod batch;
pub(crate) mod budget;
pub(crate) mod cancel;
pub(crate) mod claim;
pub(crate) mod enqueue;
pub(crate) mod fenced;
pub(crate) mod key_heads;
pub(crate) mod ordering;
pub(crate) mod priority;
pub(crate) mod queues;
pub(crate) mod retention;
pub(crate) mod schedules;

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use outbox::{
    ClaimBatch, ClaimedBatch, ClaimedMessage, Enqueued, Error, ErrorRecord, ListMessages,
    MarkDelivered, MarkFailed, MessageKind, NewMessage, OutboxAdmin, OutboxMessage, OutboxStore,
    Payload, ReleaseClaim, RenewClaim, Result,
};
use serde_json::json;

/// Expands to one `#[tokio::test]` per contract case, each on a fresh store
/// from `$setup`, an `async fn() -> S` where `S: OutboxStore + OutboxAdmin + Clone`.
macro_rules! conformance_suite {
    ($setup:path) => {
        $crate::conformance::conformance_suite!(@cases $setup;
            conformance_empty_store_claims_nothing => claim::empty_store_claims_nothing,
            conformance_future_message_is_claimed_at_exactly_available_at
                => claim::future_message_is_claimed_at_exactly_available_at,
            conformance_claim_orders_by_available_at_then_created_at
                => claim::claim_orders_by_available_at_then_created_at,
            conformance_claim_respects_limit => claim::claim_respects_limit,
            conformance_claim_sets_claim_fields => claim::claim_sets_claim_fields,
            conformance_claim_tokens_are_never_reused => claim::claim_tokens_are_never_reused,
            conformance_live_claim_is_not_claimable => claim::live_claim_is_not_claimable,
            conformance_live_claims_do_not_block_later_messages
                => claim::live_claims_do_not_block_later_messages,
            conformance_expired_claim_is_reclaimed_and_old_token_refused
                => claim::expired_claim_is_reclaimed_and_old_token_refused,
            conformance_expired_claims_compete_by_available_at
                => claim::expired_claims_compete_by_available_at,
            conformance_claims_judge_leases_by_their_own_now
                => claim::claims_judge_leases_by_their_own_now,
            conformance_exhausted_claim_is_dead_lettered_at_claim
                => claim::exhausted_claim_is_dead_lettered_at_claim,
            conformance_exhausted_pending_message_is_dead_lettered_at_claim
                => claim::exhausted_pending_message_is_dead_lettered_at_claim,
            conformance_dead_letters_at_claim_count_toward_limit
                => claim::dead_letters_at_claim_count_toward_limit,
            conformance_invalid_claim_parameters_change_nothing
                => claim::invalid_claim_parameters_change_nothing,
            conformance_renew_extends_live_claim => fenced::renew_extends_live_claim,
            conformance_renew_refuses_wrong_token => fenced::renew_refuses_wrong_token,
            conformance_renew_refuses_expired_lease => fenced::renew_refuses_expired_lease,
            conformance_renew_refuses_unclaimed_message => fenced::renew_refuses_unclaimed_message,
            conformance_deliver_refuses_wrong_token_and_expired_lease
                => fenced::deliver_refuses_wrong_token_and_expired_lease,
            conformance_fail_refuses_wrong_token_and_expired_lease
                => fenced::fail_refuses_wrong_token_and_expired_lease,
            conformance_release_refuses_wrong_token_and_expired_lease
                => fenced::release_refuses_wrong_token_and_expired_lease,
            conformance_deliver_settles_for_good => fenced::deliver_settles_for_good,
            conformance_fail_with_retry_at_reschedules => fenced::fail_with_retry_at_reschedules,
            conformance_fail_without_retry_at_is_available_now
                => fenced::fail_without_retry_at_is_available_now,
            conformance_fail_with_dead_letter_settles_for_good
                => fenced::fail_with_dead_letter_settles_for_good,
            conformance_release_returns_message_uncounted
                => fenced::release_returns_message_uncounted,
            conformance_release_keeps_payload_and_last_error
                => fenced::release_keeps_payload_and_last_error,
            conformance_release_does_not_spend_the_attempt_budget
                => fenced::release_does_not_spend_the_attempt_budget,
            conformance_settled_claim_refuses_further_writes
                => fenced::settled_claim_refuses_further_writes,
            conformance_invalid_fence_parameters_change_nothing
                => fenced::invalid_fence_parameters_change_nothing,
            conformance_invalid_enqueue_changes_nothing => enqueue::invalid_enqueue_changes_nothing,
            conformance_enqueue_generates_unique_ids => enqueue::enqueue_generates_unique_ids,
            conformance_enqueue_duplicate_id_leaves_stored_message_untouched
                => enqueue::enqueue_duplicate_id_leaves_stored_message_untouched,
            conformance_enqueue_stores_every_field => enqueue::enqueue_stores_every_field,
            conformance_payload_round_trips => enqueue::payload_round_trips,
            conformance_trace_carrier_round_trips => enqueue::trace_carrier_round_trips,
            conformance_oversized_error_is_stored_truncated
                => enqueue::oversized_error_is_stored_truncated,
            conformance_a_batch_is_stored_whole_and_answered_in_order
                => batch::a_batch_is_stored_whole_and_answered_in_order,
            conformance_a_batch_answers_each_duplicate_in_its_place
                => batch::a_batch_answers_each_duplicate_in_its_place,
            conformance_a_batch_honours_each_idempotency_key
                => batch::a_batch_honours_each_idempotency_key,
            conformance_a_batch_takes_its_places_in_enqueue_order
                => batch::a_batch_takes_its_places_in_enqueue_order,
            conformance_an_oversized_or_invalid_batch_changes_nothing
                => batch::an_oversized_or_invalid_batch_changes_nothing,
            conformance_a_batch_answers_as_enqueues_one_after_another
                => batch::a_batch_answers_as_enqueues_one_after_another,
            conformance_stats_counts_statuses_and_claims => admin::stats_counts_statuses_and_claims,
            conformance_get_missing_message_is_not_found => admin::get_missing_message_is_not_found,
            conformance_list_filters_by_status_and_name => admin::list_filters_by_status_and_name,
            conformance_list_pages_are_disjoint_and_complete
                => admin::list_pages_are_disjoint_and_complete,
            conformance_list_pages_interleave_claimed_and_unclaimed
                => admin::list_pages_interleave_claimed_and_unclaimed,
            conformance_list_is_stable_across_inserts => admin::list_is_stable_across_inserts,
            conformance_list_refuses_invalid_limit => admin::list_refuses_invalid_limit,
            conformance_requeue_dead_letter_by_id => admin::requeue_dead_letter_by_id,
            conformance_requeue_all_dead_letters_by_name => admin::requeue_all_dead_letters_by_name,
            conformance_requeue_refuses_live_claim => admin::requeue_refuses_live_claim,
            conformance_requeue_refuses_non_dead_letters => admin::requeue_refuses_non_dead_letters,
            conformance_purge_removes_only_old_terminal_messages
                => admin::purge_removes_only_old_terminal_messages,
            conformance_purge_refuses_pending_and_claimed
                => admin::purge_refuses_pending_and_claimed,
            conformance_retry_now_makes_a_pending_message_due
                => admin::retry_now_makes_a_pending_message_due,
            conformance_retry_now_refuses_claims_and_settled_messages
                => admin::retry_now_refuses_claims_and_settled_messages,
            conformance_count_purgeable_matches_purge => admin::count_purgeable_matches_purge,
            conformance_activity_counts_settled_messages_per_minute
                => admin::activity_counts_settled_messages_per_minute,
            conformance_a_claim_takes_only_the_head_of_each_key
                => ordering::a_claim_takes_only_the_head_of_each_key,
            conformance_cancelling_a_head_hands_its_key_on
                => key_heads::cancelling_a_head_hands_its_key_on,
            conformance_deleting_a_head_on_delivery_hands_its_key_on
                => key_heads::deleting_a_head_on_delivery_hands_its_key_on,
            conformance_purging_settled_messages_leaves_their_keys_heads
                => key_heads::purging_settled_messages_leaves_their_keys_heads,
            conformance_a_head_dead_lettered_at_claim_hands_its_key_on
                => key_heads::a_head_dead_lettered_at_claim_hands_its_key_on,
            conformance_a_requeued_dead_letter_comes_before_its_keys_backlog
                => key_heads::a_requeued_dead_letter_comes_before_its_keys_backlog,
            conformance_a_hot_keys_backlog_does_not_hide_the_other_keys
                => key_heads::a_hot_keys_backlog_does_not_hide_the_other_keys,
            conformance_a_retried_head_keeps_its_place => ordering::a_retried_head_keeps_its_place,
            conformance_an_expired_head_is_reclaimed_before_the_next
                => ordering::an_expired_head_is_reclaimed_before_the_next,
            conformance_a_dead_letter_blocks_its_key_until_skipped
                => ordering::a_dead_letter_blocks_its_key_until_skipped,
            conformance_under_skip_a_dead_letter_does_not_hold_its_key
                => ordering::under_skip_a_dead_letter_does_not_hold_its_key,
            conformance_a_requeued_dead_letter_is_the_head_again
                => ordering::a_requeued_dead_letter_is_the_head_again,
            conformance_a_requeued_earlier_message_waits_for_a_claimed_later_one
                => ordering::a_requeued_earlier_message_waits_for_a_claimed_later_one,
            conformance_a_requeued_earlier_message_goes_first_once_the_later_claim_ran_out
                => ordering::a_requeued_earlier_message_goes_first_once_the_later_claim_ran_out,
            conformance_a_long_backlog_behind_few_keys_yields_only_heads
                => ordering::a_long_backlog_behind_few_keys_yields_only_heads,
            conformance_skip_refuses_what_is_not_a_dead_letter
                => ordering::skip_refuses_what_is_not_a_dead_letter,
            conformance_enqueue_options_set_time_key_and_budget
                => ordering::enqueue_options_set_time_key_and_budget,
            conformance_an_idempotency_key_holds_for_its_window
                => ordering::an_idempotency_key_holds_for_its_window,
            conformance_invalid_enqueue_options_change_nothing
                => ordering::invalid_enqueue_options_change_nothing,
            conformance_claim_cap_applies_to_messages_without_their_own
                => budget::claim_cap_applies_to_messages_without_their_own,
            conformance_pending_message_out_of_attempts_is_dead_lettered_by_the_claim
                => budget::pending_message_out_of_attempts_is_dead_lettered_by_the_claim,
            conformance_zero_claim_cap_is_refused => budget::zero_claim_cap_is_refused,
            conformance_purge_batch_deletes_oldest_settled_first_and_is_bounded
                => retention::purge_batch_deletes_oldest_settled_first_and_is_bounded,
            conformance_purge_batch_refuses_live_statuses_and_bad_limits
                => retention::purge_batch_refuses_live_statuses_and_bad_limits,
            conformance_delivery_with_delete_removes_the_message_under_its_fence
                => retention::delivery_with_delete_removes_the_message_under_its_fence,
            conformance_a_message_deleted_at_delivery_frees_its_keys
                => retention::a_message_deleted_at_delivery_frees_its_keys,
            conformance_queue_a_message_keeps_its_queue_and_priority
                => queues::queue_a_message_keeps_its_queue_and_priority,
            conformance_queue_a_claim_takes_only_the_queues_it_serves
                => queues::queue_a_claim_takes_only_the_queues_it_serves,
            conformance_queue_each_queue_is_held_to_its_own_limit
                => queues::queue_each_queue_is_held_to_its_own_limit,
            conformance_queue_an_ordering_key_orders_within_its_queue
                => queues::queue_an_ordering_key_orders_within_its_queue,
            conformance_queue_names_and_limits_are_checked
                => queues::queue_names_and_limits_are_checked,
            conformance_queue_states_count_pending_and_claimed
                => queues::queue_states_count_pending_and_claimed,
            conformance_queue_attempt_caps_are_each_queues_own
                => queues::queue_attempt_caps_are_each_queues_own,
            conformance_pause_a_paused_queue_is_skipped_and_others_go_on
                => queues::pause_a_paused_queue_is_skipped_and_others_go_on,
            conformance_pause_claims_already_made_settle_as_usual
                => queues::pause_claims_already_made_settle_as_usual,
            conformance_pause_an_expired_claim_waits_for_the_resume
                => queues::pause_an_expired_claim_waits_for_the_resume,
            conformance_pause_names_are_checked => queues::pause_names_are_checked,
            conformance_priority_higher_goes_first_within_a_queue
                => priority::priority_higher_goes_first_within_a_queue,
            conformance_priority_ties_go_oldest_due_first
                => priority::priority_ties_go_oldest_due_first,
            conformance_priority_a_scheduled_message_waits_without_blocking_due_ones
                => priority::priority_a_scheduled_message_waits_without_blocking_due_ones,
            conformance_priority_never_reorders_an_ordering_key
                => priority::priority_never_reorders_an_ordering_key,
            conformance_priority_expired_claims_compete_by_priority
                => priority::priority_expired_claims_compete_by_priority,
            conformance_priority_out_of_range_is_refused
                => priority::priority_out_of_range_is_refused,
            conformance_cancel_a_pending_or_scheduled_message
                => cancel::cancel_a_pending_or_scheduled_message,
            conformance_cancel_refuses_settled_messages_with_their_status
                => cancel::cancel_refuses_settled_messages_with_their_status,
            conformance_cancel_by_filter_counts_first_when_dry
                => cancel::cancel_by_filter_counts_first_when_dry,
            conformance_cancel_a_live_claim_is_requested_and_settles_cancelled
                => cancel::cancel_a_live_claim_is_requested_and_settles_cancelled,
            conformance_cancel_a_live_claim_whose_handler_succeeds_is_delivered
                => cancel::cancel_a_live_claim_whose_handler_succeeds_is_delivered,
            conformance_cancel_an_expired_claim_ends_it => cancel::cancel_an_expired_claim_ends_it,
            conformance_cancel_frees_an_ordering_key => cancel::cancel_frees_an_ordering_key,
            conformance_cancel_invalid_parameters_change_nothing
                => cancel::cancel_invalid_parameters_change_nothing,
        );

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn conformance_concurrent_claims_keep_each_key_in_order() {
            $crate::conformance::ordering::concurrent_claims_keep_each_key_in_order($setup().await)
                .await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn conformance_concurrent_claims_never_share_a_live_message() {
            $crate::conformance::claim::concurrent_claims_never_share_a_live_message($setup().await)
                .await;
        }
    };
    (@cases $setup:path; $($test:ident => $group:ident::$case:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $test() {
                $crate::conformance::$group::$case($setup().await).await;
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
    match store.enqueue(new).await.expect("enqueue") {
        Enqueued::Inserted(id) => id,
        other => panic!("expected a fresh insert, got {other:?}"),
    }
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
            on_dead_letter: Default::default(),
            limit,
            now: at(now),
            lease: lease(lease_ms),
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
            queues: Vec::new(),
            durable: true,
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
        delete: false,
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
