//! Admin: stats, one message, listing page by page, requeueing dead
//! letters, and purging settled messages.

use std::collections::{BTreeMap, HashSet};

use outbox::{
    AdminError, Error, ListCursor, ListMessages, MessageStatus, OutboxAdmin, OutboxStats,
    OutboxStore, PurgeMessages, RequeueDeadLetters, RetryNow,
};

use super::{
    FAR_FUTURE, MINUTE, SECOND, assert_invalid, at, claim, claim_nothing, claim_one, delivered,
    everything, failed, get, ids, message, put, put_at, released, renew, sorted,
};

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

pub(crate) async fn list_pages_interleave_claimed_and_unclaimed<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    // Groups of three share a `created_at`; within each, one message is
    // claimed, one delivered and one pending again after a retry, so a page
    // boundary falls between claimed and unclaimed rows at every position.
    let mut all = Vec::new();
    for i in 0..18 {
        all.push(put(&store, message(&format!("s{i:02}"), "e", (i / 3) as i64)).await);
    }
    let batch = claim(&store, 18, SECOND, MINUTE).await;
    assert_eq!(batch.claimed.len(), 18);
    for claimed in &batch.claimed {
        let i: usize = claimed.id[1..].parse().unwrap();
        match i % 3 {
            0 => store
                .mark_delivered(delivered(&claimed.id, &claimed.claim_token, SECOND))
                .await
                .unwrap(),
            2 => store
                .mark_failed(failed(
                    &claimed.id,
                    &claimed.claim_token,
                    SECOND,
                    false,
                    Some(MINUTE),
                ))
                .await
                .unwrap(),
            _ => {}
        }
    }
    for limit in [1, 2, 4, 5, 18] {
        let pages = pages(&store, None, None, limit).await;
        assert_eq!(
            pages.concat(),
            all,
            "every message once, in listing order, at limit {limit}"
        );
    }
    let claimed: Vec<String> = all.iter().skip(1).step_by(3).cloned().collect();
    assert_eq!(
        pages(&store, Some(MessageStatus::Claimed), None, 4)
            .await
            .concat(),
        claimed
    );
    let unclaimed: Vec<String> = all
        .iter()
        .filter(|id| !claimed.contains(id))
        .cloned()
        .collect();
    let (delivered_ids, pending_ids): (Vec<String>, Vec<String>) = unclaimed
        .iter()
        .cloned()
        .partition(|id| id[1..].parse::<usize>().unwrap() % 3 == 0);
    assert_eq!(
        pages(&store, Some(MessageStatus::Delivered), None, 4)
            .await
            .concat(),
        delivered_ids
    );
    assert_eq!(
        pages(&store, Some(MessageStatus::Pending), None, 4)
            .await
            .concat(),
        pending_ids
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

fn retry(id: &str, now: chrono::DateTime<chrono::Utc>) -> RetryNow {
    RetryNow {
        id: id.to_owned(),
        now,
    }
}

pub(crate) async fn retry_now_makes_a_pending_message_due<S: OutboxStore + OutboxAdmin + Clone>(
    store: S,
) {
    // Backed off ten minutes into the future, and one already due.
    put_at(&store, "later", 0, 10 * MINUTE, 5).await;
    put_at(&store, "due", 1, 0, 5).await;
    store.retry_now(retry("later", at(SECOND))).await.unwrap();
    let later = get(&store, "later").await;
    assert_eq!(later.status, MessageStatus::Pending);
    assert_eq!(later.available_at, at(SECOND));
    assert_eq!(later.attempts, 0);
    // Never pushed later than it already was.
    store.retry_now(retry("due", at(2 * SECOND))).await.unwrap();
    assert_eq!(get(&store, "due").await.available_at, at(0));
    // Both are claimable now.
    let batch = claim(&store, 10, 2 * SECOND, MINUTE).await;
    assert_eq!(batch.claimed.len(), 2, "{batch:?}");
}

pub(crate) async fn retry_now_refuses_claims_and_settled_messages<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    put_at(&store, "m", 0, 0, 5).await;
    let claimed = claim_one(&store, 0, MINUTE).await;
    let before = get(&store, "m").await;
    match store.retry_now(retry("m", at(SECOND))).await {
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
        .expect("the claim survived the refused retry");
    match store.retry_now(retry("m", at(3 * SECOND))).await {
        Err(Error::Admin(AdminError::NotPending { id, status })) => {
            assert_eq!(id, "m");
            assert_eq!(status, MessageStatus::Delivered);
        }
        other => panic!("expected a not-pending refusal, got {other:?}"),
    }
    dead_letter(&store, "dead", "e", 4 * SECOND).await;
    assert!(matches!(
        store.retry_now(retry("dead", at(5 * SECOND))).await,
        Err(Error::Admin(AdminError::NotPending {
            status: MessageStatus::DeadLettered,
            ..
        }))
    ));
    assert!(matches!(
        store.retry_now(retry("missing", at(5 * SECOND))).await,
        Err(Error::NotFound { id }) if id == "missing"
    ));
}

pub(crate) async fn count_purgeable_matches_purge<S: OutboxStore + OutboxAdmin + Clone>(store: S) {
    dead_letter(&store, "dead-old", "e", 0).await;
    dead_letter(&store, "dead-new", "e", 10 * MINUTE).await;
    put_at(&store, "delivered-old", 1, 0, 5).await;
    let claimed = claim_one(&store, SECOND, MINUTE).await;
    store
        .mark_delivered(delivered("delivered-old", &claimed.claim_token, 2 * SECOND))
        .await
        .unwrap();
    put_at(&store, "pending", 2, 0, 5).await;
    let both = PurgeMessages {
        status: None,
        older_than: at(5 * MINUTE),
    };
    let dead_only = PurgeMessages {
        status: Some(MessageStatus::DeadLettered),
        ..both
    };
    assert_eq!(store.count_purgeable(dead_only).await.unwrap(), 1);
    assert_eq!(store.count_purgeable(both).await.unwrap(), 2);
    // Counting deleted nothing.
    assert_eq!(store.stats(at(0)).await.unwrap().total(), 4);
    assert!(matches!(
        store
            .count_purgeable(PurgeMessages {
                status: Some(MessageStatus::Pending),
                ..both
            })
            .await,
        Err(Error::Admin(AdminError::UnsafePurge { .. }))
    ));
    assert_eq!(store.purge(both).await.unwrap(), 2);
    assert_eq!(store.count_purgeable(both).await.unwrap(), 0);
}

pub(crate) async fn activity_counts_settled_messages_per_minute<
    S: OutboxStore + OutboxAdmin + Clone,
>(
    store: S,
) {
    // Two delivered in minute 1, one dead-lettered in minute 3, and one
    // delivered before the window.
    for (id, created, settled) in [
        ("early", 0, 10 * SECOND),
        ("a", 1, MINUTE + SECOND),
        ("b", 2, MINUTE + 59 * SECOND),
    ] {
        put_at(&store, id, created, 0, 5).await;
        let claimed = claim_one(&store, settled, MINUTE).await;
        store
            .mark_delivered(delivered(id, &claimed.claim_token, settled))
            .await
            .unwrap();
    }
    dead_letter(&store, "dead", "e", 3 * MINUTE + 30 * SECOND).await;
    put_at(&store, "pending", 5, 0, 5).await;

    let activity = store.activity(at(MINUTE)).await.unwrap();
    let minutes: Vec<_> = activity
        .iter()
        .map(|m| (m.minute, m.delivered, m.dead_lettered))
        .collect();
    assert_eq!(
        minutes,
        vec![(at(MINUTE), 2, 0), (at(3 * MINUTE), 0, 1)],
        "{activity:?}"
    );
    assert!(store.activity(at(4 * MINUTE)).await.unwrap().is_empty());
}
