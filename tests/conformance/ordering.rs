//! Ordering keys and enqueue options: heads only, retries and expired leases
//! keep the head, dead letters block or are skipped, skips and requeues
//! unblock, keyless messages never wait, many concurrent claimers never hold
//! two messages of one key; delays, run-at times, attempt budgets and
//! idempotency keys with their window.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::{
    AdminError, ClaimBatch, ClaimedBatch, EnqueueOptions, Enqueued, Error, MAX_KEY_LEN,
    MessageStatus, OnDeadLetter, OutboxAdmin, OutboxStore, RequeueDeadLetters, SkipDeadLetter,
};

use super::{
    MINUTE, SECOND, assert_invalid, at, delivered, everything, failed, get, lease, message, put,
};

/// `id`, an event with ordering key `key` (when given), enqueued at `created`.
async fn keyed<S: OutboxStore>(store: &S, id: &str, key: Option<&str>, created: i64) -> String {
    let mut new = message(id, "conformance.ordered", created);
    if let Some(key) = key {
        new = new.with_ordering_key(key);
    }
    put(store, new).await
}

async fn claim_with<S: OutboxStore>(
    store: &S,
    policy: OnDeadLetter,
    limit: usize,
    now: i64,
) -> ClaimedBatch {
    store
        .claim_batch(ClaimBatch {
            on_dead_letter: policy,
            limit,
            now: at(now),
            lease: lease(MINUTE),
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
            queues: Vec::new(),
            durable: true,
        })
        .await
        .expect("claim_batch")
}

/// The ids a claim under `policy` takes at `now`, sorted.
async fn claimed_ids<S: OutboxStore>(store: &S, policy: OnDeadLetter, now: i64) -> Vec<String> {
    let batch = claim_with(store, policy, 100, now).await;
    assert!(batch.dead_lettered.is_empty(), "{batch:?}");
    let mut ids: Vec<String> = batch.claimed.into_iter().map(|m| m.id).collect();
    ids.sort();
    ids
}

/// Claim the one message `id` at `now` and return its token.
async fn claim_only<S: OutboxStore>(store: &S, id: &str, now: i64) -> String {
    let batch = claim_with(store, OnDeadLetter::Block, 100, now).await;
    assert_eq!(
        batch
            .claimed
            .iter()
            .map(|m| m.id.as_str())
            .collect::<Vec<_>>(),
        [id],
        "{batch:?}"
    );
    batch.claimed[0].claim_token.clone()
}

/// Dead-letter `id`, the only claimable message at `now`.
async fn dead_letter<S: OutboxStore>(store: &S, id: &str, now: i64) {
    let token = claim_only(store, id, now).await;
    store
        .mark_failed(failed(id, &token, now + 1, true, None))
        .await
        .unwrap();
}

fn strings(ids: &[&str]) -> Vec<String> {
    ids.iter().map(|id| id.to_string()).collect()
}

pub(crate) async fn a_claim_takes_only_the_head_of_each_key<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    keyed(&store, "a1", Some("a"), 0).await;
    keyed(&store, "b1", Some("b"), 1).await;
    keyed(&store, "a2", Some("a"), 2).await;
    keyed(&store, "x", None, 3).await;
    keyed(&store, "a3", Some("a"), 4).await;
    keyed(&store, "y", None, 5).await;
    let batch = claim_with(&store, OnDeadLetter::Block, 100, SECOND).await;
    let mut got: Vec<_> = batch.claimed.iter().map(|m| m.id.clone()).collect();
    got.sort();
    assert_eq!(got, strings(&["a1", "b1", "x", "y"]));
    let a1 = batch.claimed.iter().find(|m| m.id == "a1").unwrap();
    assert_eq!(a1.ordering_key.as_deref(), Some("a"));
    assert_eq!(get(&store, "a2").await.ordering_key.as_deref(), Some("a"));
    // Nothing more while a1 is claimed, however often one asks.
    assert!(
        claimed_ids(&store, OnDeadLetter::Block, 2 * SECOND)
            .await
            .is_empty()
    );
    store
        .mark_delivered(delivered("a1", &a1.claim_token, 3 * SECOND))
        .await
        .unwrap();
    assert_eq!(
        claimed_ids(&store, OnDeadLetter::Block, 4 * SECOND).await,
        ["a2"]
    );
}

pub(crate) async fn a_retried_head_keeps_its_place<S: OutboxStore + OutboxAdmin + Clone>(store: S) {
    keyed(&store, "a1", Some("a"), 0).await;
    keyed(&store, "a2", Some("a"), 1).await;
    let token = claim_only(&store, "a1", SECOND).await;
    store
        .mark_failed(failed("a1", &token, 2 * SECOND, false, Some(MINUTE)))
        .await
        .unwrap();
    // a1 waits for its retry; a2 waits for a1.
    assert!(
        claimed_ids(&store, OnDeadLetter::Block, 3 * SECOND)
            .await
            .is_empty()
    );
    assert_eq!(
        claimed_ids(&store, OnDeadLetter::Block, MINUTE).await,
        ["a1"]
    );
}

pub(crate) async fn an_expired_head_is_reclaimed_before_the_next<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    keyed(&store, "a1", Some("a"), 0).await;
    keyed(&store, "a2", Some("a"), 1).await;
    let first = claim_only(&store, "a1", SECOND).await;
    assert!(
        claimed_ids(&store, OnDeadLetter::Block, 30 * SECOND)
            .await
            .is_empty()
    );
    // The lease ran out: the head is claimed again, the next still waits.
    let second = claim_only(&store, "a1", 2 * MINUTE).await;
    assert_ne!(first, second);
    assert!(
        claimed_ids(&store, OnDeadLetter::Block, 2 * MINUTE + 1)
            .await
            .is_empty()
    );
}

pub(crate) async fn a_dead_letter_blocks_its_key_until_skipped<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    keyed(&store, "a1", Some("a"), 0).await;
    keyed(&store, "a2", Some("a"), 1).await;
    keyed(&store, "a3", Some("a"), 2).await;
    dead_letter(&store, "a1", SECOND).await;
    keyed(&store, "x", None, 3).await;
    // Keyless messages go on; the key stops.
    assert_eq!(
        claimed_ids(&store, OnDeadLetter::Block, 2 * SECOND).await,
        ["x"]
    );
    assert!(
        claimed_ids(&store, OnDeadLetter::Block, 3 * SECOND)
            .await
            .is_empty()
    );
    let stats = store.stats(at(3 * SECOND)).await.unwrap();
    assert_eq!(stats.blocked_keys, 1);
    let blocked = store.blocked_keys(10).await.unwrap();
    assert_eq!(blocked.len(), 1);
    assert_eq!(
        (
            blocked[0].ordering_key.as_str(),
            blocked[0].head_id.as_str(),
            blocked[0].head_name.as_str(),
            blocked[0].waiting
        ),
        ("a", "a1", "conformance.ordered", 2)
    );
    // Skipped, the dead letter stays dead-lettered and lets a2 go.
    store
        .skip_dead_letter(SkipDeadLetter {
            id: "a1".into(),
            now: at(4 * SECOND),
        })
        .await
        .unwrap();
    let a1 = get(&store, "a1").await;
    assert_eq!(a1.status, MessageStatus::DeadLettered);
    assert_eq!(a1.skipped_at, Some(at(4 * SECOND)));
    assert_eq!(store.stats(at(4 * SECOND)).await.unwrap().blocked_keys, 0);
    assert!(store.blocked_keys(10).await.unwrap().is_empty());
    assert_eq!(
        claimed_ids(&store, OnDeadLetter::Block, 5 * SECOND).await,
        ["a2"]
    );
}

pub(crate) async fn under_skip_a_dead_letter_does_not_hold_its_key<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    keyed(&store, "a1", Some("a"), 0).await;
    keyed(&store, "a2", Some("a"), 1).await;
    dead_letter(&store, "a1", SECOND).await;
    assert!(
        claimed_ids(&store, OnDeadLetter::Block, 2 * SECOND)
            .await
            .is_empty()
    );
    assert_eq!(
        claimed_ids(&store, OnDeadLetter::Skip, 2 * SECOND).await,
        ["a2"]
    );
}

pub(crate) async fn a_requeued_dead_letter_is_the_head_again<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    keyed(&store, "a1", Some("a"), 0).await;
    keyed(&store, "a2", Some("a"), 1).await;
    dead_letter(&store, "a1", SECOND).await;
    let requeue = RequeueDeadLetters {
        id: Some("a1".into()),
        name: None,
        now: at(2 * SECOND),
    };
    assert_eq!(store.requeue_dead_letters(requeue).await.unwrap(), 1);
    assert_eq!(
        claimed_ids(&store, OnDeadLetter::Block, 3 * SECOND).await,
        ["a1"]
    );
}

pub(crate) async fn a_requeued_earlier_message_waits_for_a_claimed_later_one<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    keyed(&store, "a1", Some("a"), 0).await;
    keyed(&store, "a2", Some("a"), 1).await;
    dead_letter(&store, "a1", SECOND).await;
    store
        .skip_dead_letter(SkipDeadLetter {
            id: "a1".into(),
            now: at(2 * SECOND),
        })
        .await
        .unwrap();
    let token = claim_only(&store, "a2", 3 * SECOND).await;
    let requeue = RequeueDeadLetters {
        id: Some("a1".into()),
        name: None,
        now: at(4 * SECOND),
    };
    assert_eq!(store.requeue_dead_letters(requeue).await.unwrap(), 1);
    assert_eq!(get(&store, "a1").await.skipped_at, None);
    // Never two of one key at once, even when the earlier one came back.
    assert!(
        claimed_ids(&store, OnDeadLetter::Block, 5 * SECOND)
            .await
            .is_empty()
    );
    store
        .mark_delivered(delivered("a2", &token, 6 * SECOND))
        .await
        .unwrap();
    assert_eq!(
        claimed_ids(&store, OnDeadLetter::Block, 7 * SECOND).await,
        ["a1"]
    );
}

/// A later message whose claim ran out does not hold its key against an
/// earlier one requeued meanwhile: the earlier goes first, then the later
/// is claimed again. Holding the key for it stopped both for good (the
/// earlier waited for the later's claim, the later for the earlier).
pub(crate) async fn a_requeued_earlier_message_goes_first_once_the_later_claim_ran_out<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    keyed(&store, "a1", Some("a"), 0).await;
    keyed(&store, "a2", Some("a"), 1).await;
    dead_letter(&store, "a1", SECOND).await;
    store
        .skip_dead_letter(SkipDeadLetter {
            id: "a1".into(),
            now: at(2 * SECOND),
        })
        .await
        .unwrap();
    claim_only(&store, "a2", 3 * SECOND).await;
    let requeue = RequeueDeadLetters {
        id: Some("a1".into()),
        name: None,
        now: at(4 * SECOND),
    };
    assert_eq!(store.requeue_dead_letters(requeue).await.unwrap(), 1);
    let expired = 3 * SECOND + MINUTE;
    let token = claim_only(&store, "a1", expired).await;
    // a2, its claim over, waits behind a1 like any later message.
    assert!(
        claimed_ids(&store, OnDeadLetter::Block, expired + 1)
            .await
            .is_empty()
    );
    store
        .mark_delivered(delivered("a1", &token, expired + 2))
        .await
        .unwrap();
    assert_eq!(
        claimed_ids(&store, OnDeadLetter::Block, expired + 3).await,
        ["a2"]
    );
}

/// A long backlog behind few keys, longer than a claim walks: each claim
/// takes the heads only, in claim order, whether they sit among the first
/// due messages or far behind them, a retried head keeps its place, and
/// the backlog drains in key order.
pub(crate) async fn a_long_backlog_behind_few_keys_yields_only_heads<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    const BACKLOG: usize = 300;
    // Key a's whole backlog first, then b's and c's interleaved, then one
    // keyless message: b's and c's heads sit behind all of a's messages.
    let mut created = 0;
    for i in 0..BACKLOG {
        keyed(&store, &format!("a{i:03}"), Some("a"), created).await;
        created += 1;
    }
    for i in 0..BACKLOG / 2 {
        for key in ["b", "c"] {
            keyed(&store, &format!("{key}{i:03}"), Some(key), created).await;
            created += 1;
        }
    }
    keyed(&store, "x", None, created).await;
    let mut now = created + SECOND;
    let mut tokens = HashMap::new();
    let claim = |batch: ClaimedBatch, tokens: &mut HashMap<String, String>| {
        assert!(batch.dead_lettered.is_empty(), "{batch:?}");
        batch
            .claimed
            .into_iter()
            .map(|m| {
                tokens.insert(m.id.clone(), m.claim_token);
                m.id
            })
            .collect::<Vec<_>>()
    };
    // The first two heads in claim order, then the others.
    let first = claim(
        claim_with(&store, OnDeadLetter::Block, 2, now).await,
        &mut tokens,
    );
    assert_eq!(first, ["a000", "b000"]);
    let rest = claim(
        claim_with(&store, OnDeadLetter::Block, 100, now).await,
        &mut tokens,
    );
    assert_eq!(rest, ["c000", "x"]);
    assert!(
        claimed_ids(&store, OnDeadLetter::Block, now + 1)
            .await
            .is_empty()
    );
    // Every claimed message, per key, in the order claimed.
    let mut order: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for id in first.iter().chain(&rest).filter(|id| *id != "x") {
        order
            .entry(id[..1].to_owned())
            .or_default()
            .push(id.clone());
    }
    let mut retried = false;
    for round in 0.. {
        assert!(
            round < 4 * BACKLOG,
            "the backlog stopped draining: {order:?}"
        );
        for (id, token) in tokens.drain() {
            if id == "a100" && !retried {
                // Retried a minute on: a101 and after wait for it.
                retried = true;
                store
                    .mark_failed(failed(&id, &token, now + 1, false, Some(now + MINUTE)))
                    .await
                    .unwrap();
            } else {
                store
                    .mark_delivered(delivered(&id, &token, now + 1))
                    .await
                    .unwrap();
            }
        }
        now += 2;
        let mut batch = claim(
            claim_with(&store, OnDeadLetter::Block, 100, now).await,
            &mut tokens,
        );
        if batch.is_empty() {
            if order["a"].len() < BACKLOG + 1 {
                // Only the retry is left to wait for.
                now += MINUTE;
                continue;
            }
            break;
        }
        assert!(batch.len() <= 3, "{batch:?}");
        batch.sort();
        batch.dedup_by(|a, b| a[..1] == b[..1]);
        assert_eq!(batch.len(), tokens.len(), "one message per key per claim");
        for id in batch {
            order.entry(id[..1].to_owned()).or_default().push(id);
        }
    }
    let expected = |key: &str, count: usize| -> Vec<String> {
        let mut ids: Vec<String> = (0..count).map(|i| format!("{key}{i:03}")).collect();
        if key == "a" {
            ids.insert(100, "a100".into());
        }
        ids
    };
    assert_eq!(order["a"], expected("a", BACKLOG));
    assert_eq!(order["b"], expected("b", BACKLOG / 2));
    assert_eq!(order["c"], expected("c", BACKLOG / 2));
    let stats = store.stats(at(now)).await.unwrap();
    assert_eq!((stats.pending, stats.claimed), (0, 0));
    assert_eq!(stats.delivered, 2 * BACKLOG as u64 + 1);
}

pub(crate) async fn skip_refuses_what_is_not_a_dead_letter<S: OutboxStore + OutboxAdmin + Clone>(
    store: S,
) {
    keyed(&store, "a1", Some("a"), 0).await;
    let skip = |id: &str| SkipDeadLetter {
        id: id.into(),
        now: at(SECOND),
    };
    match store.skip_dead_letter(skip("a1")).await {
        Err(Error::Admin(AdminError::NotDeadLettered { id, status })) => {
            assert_eq!((id.as_str(), status), ("a1", MessageStatus::Pending));
        }
        other => panic!("expected NotDeadLettered, got {other:?}"),
    }
    assert!(matches!(
        store.skip_dead_letter(skip("nope")).await,
        Err(Error::NotFound { .. })
    ));
    assert_invalid(store.skip_dead_letter(skip("")).await, "id");
    assert_invalid(store.blocked_keys(0).await, "limit");
    assert_eq!(get(&store, "a1").await.skipped_at, None);
}

/// Many claimers, several keys, failures on the way: a key is never held by
/// two claims at once, and each key's messages are first delivered in
/// enqueue order.
pub(crate) async fn concurrent_claims_keep_each_key_in_order<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    const KEYS: usize = 5;
    const PER_KEY: usize = 40;
    const KEYLESS: usize = 40;
    const TASKS: usize = 8;
    let mut created = 0;
    for i in 0..PER_KEY {
        for k in 0..KEYS {
            keyed(
                &store,
                &format!("k{k}-{i:03}"),
                Some(&format!("k{k}")),
                created,
            )
            .await;
            created += 1;
        }
        if i < KEYLESS {
            keyed(&store, &format!("free-{i:03}"), None, created).await;
            created += 1;
        }
    }
    // Which key each claim holds right now, and each key's first deliveries.
    let held: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    let order: Arc<Mutex<BTreeMap<String, Vec<String>>>> = Arc::default();
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let store = store.clone();
        let held = held.clone();
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let mut idle = 0;
            let mut round = 0_u64;
            let now = MINUTE;
            while idle < 20 {
                round += 1;
                let batch = claim_with(&store, OnDeadLetter::Block, 3, now).await;
                assert!(batch.dead_lettered.is_empty());
                if batch.claimed.is_empty() {
                    idle += 1;
                    tokio::task::yield_now().await;
                    continue;
                }
                idle = 0;
                for message in &batch.claimed {
                    if let Some(key) = &message.ordering_key {
                        let previous = held.lock().unwrap().insert(key.clone(), message.id.clone());
                        assert!(
                            previous.is_none(),
                            "{} claimed while {previous:?} of key {key} was held",
                            message.id
                        );
                    }
                }
                for (n, message) in batch.claimed.into_iter().enumerate() {
                    if let Some(key) = &message.ordering_key {
                        held.lock().unwrap().remove(key);
                    }
                    // Some first attempts fail and are retried at once.
                    let fail =
                        message.attempts == 1 && (round as usize + n + task).is_multiple_of(3);
                    if fail {
                        store
                            .mark_failed(failed(
                                &message.id,
                                &message.claim_token,
                                now,
                                false,
                                Some(now),
                            ))
                            .await
                            .unwrap();
                    } else {
                        if let Some(key) = &message.ordering_key {
                            order
                                .lock()
                                .unwrap()
                                .entry(key.clone())
                                .or_default()
                                .push(message.id.clone());
                        }
                        store
                            .mark_delivered(delivered(&message.id, &message.claim_token, now))
                            .await
                            .unwrap();
                    }
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("a claiming task panicked");
    }
    let order = order.lock().unwrap().clone();
    assert_eq!(order.len(), KEYS);
    for (key, ids) in &order {
        let mut expected = ids.clone();
        expected.sort();
        assert_eq!(ids, &expected, "key {key} was delivered out of order");
        assert_eq!(ids.len(), PER_KEY);
    }
    let all = everything(&store).await;
    assert_eq!(all.len(), KEYS * PER_KEY + KEYLESS);
    assert!(all.values().all(|m| m.status == MessageStatus::Delivered));
}

pub(crate) async fn enqueue_options_set_time_key_and_budget<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    let delayed = message("delayed", "conformance.options", 0)
        .with_options(EnqueueOptions::new().delay(Duration::from_secs(90)));
    put(&store, delayed).await;
    let scheduled = message("scheduled", "conformance.options", 0)
        .with_options(EnqueueOptions::new().run_at(at(100 * SECOND)));
    put(&store, scheduled).await;
    let keyed = message("keyed", "conformance.options", 0).with_options(
        EnqueueOptions::new()
            .ordering_key("order-7")
            .max_attempts(9),
    );
    put(&store, keyed).await;
    assert_eq!(get(&store, "delayed").await.available_at, at(90 * SECOND));
    assert_eq!(
        get(&store, "scheduled").await.available_at,
        at(100 * SECOND)
    );
    let keyed = get(&store, "keyed").await;
    assert_eq!(keyed.ordering_key.as_deref(), Some("order-7"));
    assert_eq!(keyed.max_attempts, 9);
    assert_eq!(keyed.available_at, at(0));
    assert_eq!(
        claimed_ids(&store, OnDeadLetter::Block, MINUTE).await,
        ["keyed"]
    );
    assert_eq!(
        claimed_ids(&store, OnDeadLetter::Block, 90 * SECOND).await,
        ["delayed"]
    );
    assert_eq!(
        claimed_ids(&store, OnDeadLetter::Block, 100 * SECOND).await,
        ["scheduled"]
    );
}

pub(crate) async fn an_idempotency_key_holds_for_its_window<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    let window = Duration::from_secs(60);
    let once = |id: &str, key: &str, created: i64| {
        message(id, "conformance.once", created)
            .with_options(EnqueueOptions::new().idempotency_key(key, window))
    };
    assert_eq!(
        store.enqueue(once("first", "pay-7", 0)).await.unwrap(),
        Enqueued::Inserted("first".into())
    );
    // Inside the window: the first message's id, nothing written.
    assert_eq!(
        store
            .enqueue(once("second", "pay-7", 59 * SECOND))
            .await
            .unwrap(),
        Enqueued::AlreadyExists("first".into())
    );
    let generated = message("unused", "conformance.once", SECOND)
        .with_options(EnqueueOptions::new().idempotency_key("pay-7", window));
    let generated = outbox::NewMessage {
        id: None,
        ..generated
    };
    assert_eq!(
        store.enqueue(generated).await.unwrap(),
        Enqueued::AlreadyExists("first".into())
    );
    // Another key is another message.
    assert!(
        store
            .enqueue(once("other", "pay-8", SECOND))
            .await
            .unwrap()
            .is_inserted()
    );
    // Once the window has passed, the key is taken over by a new message.
    assert_eq!(
        store.enqueue(once("third", "pay-7", MINUTE)).await.unwrap(),
        Enqueued::Inserted("third".into())
    );
    assert_eq!(
        store
            .enqueue(once("fourth", "pay-7", MINUTE + SECOND))
            .await
            .unwrap(),
        Enqueued::AlreadyExists("third".into())
    );
    let all = everything(&store).await;
    assert_eq!(
        all.keys().cloned().collect::<Vec<_>>(),
        strings(&["first", "other", "third"])
    );
    // The id still deduplicates on its own.
    assert_eq!(
        store
            .enqueue(once("first", "pay-9", 2 * MINUTE))
            .await
            .unwrap(),
        Enqueued::AlreadyExists("first".into())
    );
}

pub(crate) async fn invalid_enqueue_options_change_nothing<S: OutboxStore + OutboxAdmin + Clone>(
    store: S,
) {
    let with =
        |options: EnqueueOptions| message("bad", "conformance.options", 0).with_options(options);
    assert_invalid(
        store
            .enqueue(with(EnqueueOptions::new().ordering_key("")))
            .await,
        "ordering_key",
    );
    assert_invalid(
        store
            .enqueue(with(
                EnqueueOptions::new().ordering_key("k".repeat(MAX_KEY_LEN + 1)),
            ))
            .await,
        "ordering_key",
    );
    assert_invalid(
        store
            .enqueue(with(EnqueueOptions::new().ordering_key("a\0b")))
            .await,
        "ordering_key",
    );
    assert_invalid(
        store
            .enqueue(with(
                EnqueueOptions::new().idempotency_key("", Duration::from_secs(1)),
            ))
            .await,
        "idempotency_key",
    );
    assert_invalid(
        store
            .enqueue(with(
                EnqueueOptions::new().idempotency_key("k", Duration::ZERO),
            ))
            .await,
        "idempotency_key.window",
    );
    assert_invalid(
        store
            .enqueue(with(EnqueueOptions::new().max_attempts(0)))
            .await,
        "max_attempts",
    );
    assert!(everything(&store).await.is_empty());
}
