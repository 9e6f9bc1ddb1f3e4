//! The attempt cap: a message's own, or the claim's for messages without one.

use super::*;

async fn claim_capped<S: OutboxStore>(store: &S, now: i64, cap: u32) -> ClaimedBatch {
    store
        .claim_batch(ClaimBatch {
            limit: 10,
            now: at(now),
            lease: lease(SECOND),
            max_attempts: cap,
            on_dead_letter: Default::default(),
            queues: Vec::new(),
            durable: true,
        })
        .await
        .expect("claim_batch")
}

fn caps(batch: &ClaimedBatch) -> BTreeMap<String, (u32, u32, bool)> {
    batch
        .claimed
        .iter()
        .map(|m| {
            (
                m.id.clone(),
                (m.attempts, m.max_attempts, m.max_attempts_set),
            )
        })
        .collect()
}

pub(crate) async fn claim_cap_applies_to_messages_without_their_own<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    put(
        &store,
        message("own", "conformance.event", 0).with_max_attempts(2),
    )
    .await;
    put(&store, message("free", "conformance.event", 0)).await;

    let stored = get(&store, "free").await;
    assert!(!stored.max_attempts_set, "no cap given: {stored:?}");
    assert_eq!(stored.max_attempts, outbox::DEFAULT_MAX_ATTEMPTS);
    assert_eq!(stored.effective_max_attempts(7), 7);
    let own = get(&store, "own").await;
    assert!(own.max_attempts_set && own.max_attempts == 2, "{own:?}");
    assert_eq!(own.effective_max_attempts(7), 2);

    // A claim's cap lower than the message's own leaves the own one alone.
    let first = claim_capped(&store, 0, 1).await;
    assert_eq!(
        caps(&first),
        BTreeMap::from([
            ("free".to_string(), (1, 1, false)),
            ("own".to_string(), (1, 2, true)),
        ])
    );

    // Under a cap of 1, the message without its own is out of attempts once
    // its lease runs out; a claim with a higher cap keeps it going.
    let second = claim_capped(&store, 2 * SECOND, 3).await;
    assert!(second.dead_lettered.is_empty(), "{second:?}");
    assert_eq!(
        caps(&second),
        BTreeMap::from([
            ("free".to_string(), (2, 3, false)),
            ("own".to_string(), (2, 2, true)),
        ])
    );

    // The message's own cap is spent; the other has one attempt left.
    let third = claim_capped(&store, 4 * SECOND, 3).await;
    assert_eq!(ids(&third), (sorted(&["free"]), sorted(&["own"])));
    let dead = &third.dead_lettered[0];
    let error = dead.last_error.as_ref().expect("the abandoned claim");
    assert!(
        error.message.contains("2 of 2"),
        "the error names the cap that applied: {error:?}"
    );

    // Lowering the claim's cap dead-letters the message without its own.
    let fourth = claim_capped(&store, 6 * SECOND, 2).await;
    assert_eq!(ids(&fourth), (sorted(&[]), sorted(&["free"])));
    let error = fourth.dead_lettered[0].last_error.as_ref().unwrap();
    assert!(error.message.contains("3 of 2"), "{error:?}");
    let stored = get(&store, "free").await;
    assert!(!stored.max_attempts_set, "{stored:?}");
    assert_eq!(stored.attempts, 3);
}

/// A pending message whose attempts already reach the claim's cap (it was
/// retried under a higher one) is dead-lettered by the claim that finds
/// it, beside the messages it claims, in whichever form the store's claim
/// takes for one queue of one priority.
pub(crate) async fn pending_message_out_of_attempts_is_dead_lettered_by_the_claim<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    put(&store, message("spent", "conformance.event", 0)).await;
    let first = claim_capped(&store, 0, 3).await;
    assert_eq!(ids(&first), (sorted(&["spent"]), sorted(&[])));
    let token = first.claimed[0].claim_token.clone();
    store
        .mark_failed(failed("spent", &token, SECOND / 2, false, None))
        .await
        .expect("a retry");
    put(&store, message("fresh", "conformance.event", 2 * SECOND)).await;

    let second = claim_capped(&store, 3 * SECOND, 1).await;
    assert_eq!(ids(&second), (sorted(&["fresh"]), sorted(&["spent"])));
    let error = second.dead_lettered[0].last_error.as_ref().expect("why");
    assert!(error.message.contains("1 of 1"), "{error:?}");
    let stored = get(&store, "spent").await;
    assert_eq!(
        stored.status,
        outbox::MessageStatus::DeadLettered,
        "{stored:?}"
    );
    assert_eq!(stored.attempts, 1);
}

pub(crate) async fn zero_claim_cap_is_refused<S: OutboxStore + OutboxAdmin + Clone>(store: S) {
    put(&store, message("m", "conformance.event", 0)).await;
    let zero = ClaimBatch {
        on_dead_letter: Default::default(),
        limit: 1,
        now: at(0),
        lease: lease(MINUTE),
        max_attempts: 0,
        queues: Vec::new(),
        durable: true,
    };
    assert_invalid(store.claim_batch(zero).await, "max_attempts");
    let stored = get(&store, "m").await;
    assert_eq!(stored.attempts, 0, "nothing claimed: {stored:?}");
    claim_one(&store, 0, MINUTE).await;
}
