//! A store on the server's clock (the default): leases, admin changes and
//! claims follow the database's time, whatever the callers' clocks say.

use std::time::Duration;

use outbox::{
    ClaimBatch, ClaimLoss, Error, MarkDelivered, MessageStatus, OutboxAdmin, OutboxStore,
};

use crate::sql_support::{LEASE, event, t0, unique};
use crate::{pool, server_clock_store};

/// On the server's clock, an operator's requeue and retry-now make a
/// message due by the server's clock, whatever the operator's says: one an
/// hour ahead does not leave it waiting an hour.
#[tokio::test]
async fn admin_changes_follow_the_servers_clock() {
    let pool = pool().await;
    let outbox = server_clock_store(&pool, &unique("admin_clock")).await;
    let real = chrono::Utc::now;
    let hour = chrono::Duration::hours(1);
    let claim = |now| ClaimBatch {
        on_dead_letter: Default::default(),
        limit: 10,
        now,
        lease: LEASE,
        max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
        queues: Vec::new(),
        durable: true,
    };
    outbox
        .enqueue(event("dead", 1, real()).with_id("dead"))
        .await
        .unwrap();
    let claimed = outbox.claim_batch(claim(real())).await.unwrap().claimed;
    outbox
        .mark_failed(outbox::MarkFailed {
            id: "dead".into(),
            claim_token: claimed[0].claim_token.clone(),
            error: outbox::ErrorRecord::new("Test", "gave up"),
            dead_letter: true,
            now: real(),
            retry_at: None,
        })
        .await
        .unwrap();
    let requeue = outbox::RequeueDeadLetters {
        id: Some("dead".into()),
        name: None,
        now: real() + hour,
    };
    assert_eq!(outbox.requeue_dead_letters(requeue).await.unwrap(), 1);
    let again = outbox.claim_batch(claim(real())).await.unwrap().claimed;
    assert_eq!(again.len(), 1, "due by the server's clock once requeued");

    // Retry-now of a message waiting for its retry, asked an hour ahead.
    outbox
        .enqueue(
            event("later", 2, real())
                .with_id("later")
                .available_at(real() + chrono::Duration::days(1)),
        )
        .await
        .unwrap();
    outbox
        .retry_now(outbox::RetryNow {
            id: "later".into(),
            now: real() + hour,
        })
        .await
        .unwrap();
    let later = outbox.claim_batch(claim(real())).await.unwrap().claimed;
    assert_eq!(later.len(), 1, "due by the server's clock after retry-now");
}

/// On the server's clock, callers an hour apart agree on every lease: the
/// one behind can claim what is due, the one ahead cannot take a live
/// lease over, renewals and settlements judge liveness by the server, and
/// each caller gets its lease back as a deadline on its own clock.
#[tokio::test]
async fn leases_follow_the_servers_clock_whatever_the_callers_say() {
    let pool = pool().await;
    let outbox = server_clock_store(&pool, &unique("server_clock")).await;
    let real = chrono::Utc::now;
    let hour = chrono::Duration::hours(1);
    let lease = Duration::from_secs(30);

    // Enqueued by a caller an hour ahead, with no `available_at`: due on the
    // server's clock at once, not in an hour.
    outbox
        .enqueue(event("m", 1, real() + hour).with_id("m"))
        .await
        .unwrap();
    let behind = real() - hour;
    let batch = outbox
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: 10,
            now: behind,
            lease,
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
            queues: Vec::new(),
            durable: true,
        })
        .await
        .unwrap();
    assert_eq!(batch.claimed.len(), 1, "due by the server's clock");
    let claimed = &batch.claimed[0];
    // The caller's deadline is on its own clock...
    assert_eq!(claimed.claimed_at, behind);
    assert_eq!(
        claimed.locked_until,
        behind + chrono::Duration::from_std(lease).unwrap()
    );
    // ...and the row holds the server's.
    let stored = outbox.get_message("m").await.unwrap();
    let server_until = stored.locked_until.unwrap();
    let expected = real() + chrono::Duration::from_std(lease).unwrap();
    assert!(
        (server_until - expected).num_seconds().abs() < 10,
        "stored lease {server_until} is the server's, near {expected}"
    );

    // A caller an hour ahead sees no expired lease to take over.
    let ahead = real() + hour;
    let stolen = outbox
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: 10,
            now: ahead,
            lease,
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
            queues: Vec::new(),
            durable: true,
        })
        .await
        .unwrap();
    assert!(stolen.is_empty(), "{stolen:?}");
    let stats = outbox.stats(ahead).await.unwrap();
    assert_eq!((stats.live_claims, stats.expired_claims), (1, 0));

    // The owner renews with a clock an hour ahead: still live on the server.
    let renewed = outbox
        .renew_claim(outbox::RenewClaim {
            id: "m".into(),
            claim_token: claimed.claim_token.clone(),
            now: ahead,
            lease,
        })
        .await
        .unwrap();
    assert_eq!(renewed, ahead + chrono::Duration::from_std(lease).unwrap());
    outbox
        .mark_delivered(MarkDelivered {
            delete: false,
            id: "m".into(),
            claim_token: claimed.claim_token.clone(),
            now: ahead,
        })
        .await
        .unwrap();
    let delivered = outbox.get_message("m").await.unwrap();
    assert_eq!(delivered.status, MessageStatus::Delivered);
    let at = delivered.delivered_at.unwrap();
    assert!((at - real()).num_seconds().abs() < 10, "delivered at {at}");

    // A short lease runs out on the server's clock even for a caller far
    // behind: it can take the claim over, and the first token is refused.
    outbox
        .enqueue(event("short", 2, real()).with_id("short"))
        .await
        .unwrap();
    let short = Duration::from_millis(200);
    let first = outbox
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: 1,
            now: real(),
            lease: short,
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
            queues: Vec::new(),
            durable: true,
        })
        .await
        .unwrap()
        .claimed
        .remove(0);
    // Real time: the server's clock is what is under test.
    tokio::time::sleep(Duration::from_millis(400)).await;
    // The caller, an hour behind, believes its lease still runs: refused,
    // and named as the server saw it.
    let expired = outbox
        .mark_delivered(MarkDelivered {
            delete: false,
            id: "short".into(),
            claim_token: first.claim_token.clone(),
            now: real() - hour,
        })
        .await;
    match expired {
        Err(Error::Claim(e)) => assert_eq!(e.reason, ClaimLoss::LeaseExpired),
        other => panic!("{other:?}"),
    }
    let second = outbox
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: 1,
            now: real() - hour,
            lease,
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
            queues: Vec::new(),
            durable: true,
        })
        .await
        .unwrap();
    assert_eq!(second.claimed.len(), 1, "expired on the server's clock");
    assert_eq!(second.claimed[0].attempts, 2);
    let refused = outbox
        .mark_delivered(MarkDelivered {
            delete: false,
            id: "short".into(),
            claim_token: first.claim_token,
            now: real() - hour,
        })
        .await;
    match refused {
        Err(Error::Claim(e)) => assert_eq!(e.reason, ClaimLoss::TokenMismatch),
        other => panic!("{other:?}"),
    }
}

/// On the server's clock a claim's two passes bind no time: a claim takes
/// each key's head with the keyless rows, and leaves every later row of a
/// key alone.
#[tokio::test]
async fn on_the_servers_clock_a_claim_takes_the_heads_of_its_keys() {
    let pool = pool().await;
    let outbox = server_clock_store(&pool, &unique("server_heads")).await;
    // Thirty rows of each of three keys, taking turns, then five keyless
    // rows: a claim of ten finds three heads and five keyless rows.
    for n in 0..90 {
        outbox
            .enqueue(event(&format!("k{n:02}"), n, t0()).with_ordering_key(format!("key{}", n % 3)))
            .await
            .unwrap();
    }
    for n in 0..5 {
        outbox
            .enqueue(event(&format!("x{n}"), 90 + n, t0()))
            .await
            .unwrap();
    }
    let claim = || {
        outbox.claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: 10,
            now: chrono::Utc::now(),
            lease: LEASE,
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
            queues: Vec::new(),
            durable: true,
        })
    };
    let batch = claim().await.unwrap();
    let mut ids: Vec<_> = batch.claimed.iter().map(|m| m.id.as_str()).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["k00", "k01", "k02", "x0", "x1", "x2", "x3", "x4"]);
    // The heads are claimed, so nothing of their keys is claimable.
    assert!(claim().await.unwrap().claimed.is_empty());
}
