//! Checks shared by the SQLite and PostgreSQL tests: a scripted sequence of
//! settlements whose outcomes must not depend on how they reach the database.
#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use futures_util::future::join_all;
use outbox::{
    ClaimBatch, ErrorRecord, MarkDelivered, MarkFailed, MessageKind, NewMessage, OutboxAdmin,
    OutboxStore, Payload, ReleaseClaim, RenewClaim,
};

/// A fixed point on the caller's clock; tests pass `now` explicitly.
pub fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2030, 1, 1, 12, 0, 0).unwrap()
}

pub fn secs(n: i64) -> chrono::Duration {
    chrono::Duration::seconds(n)
}

pub const LEASE: Duration = Duration::from_secs(30);

/// An event named `name` with payload `{"n": n}`, enqueued at `now`.
pub fn event(id: &str, n: u64, now: DateTime<Utc>) -> NewMessage {
    NewMessage::new(
        MessageKind::Event,
        "test.event",
        Payload::from(serde_json::json!({ "n": n })),
    )
    .with_id(id)
    .at(now)
}

/// A short random suffix, so parallel tests use tables of their own.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}

fn outcome(result: outbox::Result<impl std::fmt::Debug>) -> String {
    match result {
        Ok(_) => "ok".to_owned(),
        Err(outbox::Error::Claim(e)) => format!("claim lost: {:?}", e.reason),
        Err(e) => format!("error: {e}"),
    }
}

/// Run the same script on `store`: claim six messages, then settle them
/// concurrently (so a batching store sends them together), with lost claims
/// in the middle, then settle again. Returns every outcome and the final
/// state of every message, free of tokens and other per-run values.
pub async fn settlement_script<S: OutboxStore + OutboxAdmin>(store: &S) -> Vec<String> {
    let now = t0();
    for i in 0..6 {
        store
            .enqueue(event(&format!("m{i}"), i, now + secs(i as i64)))
            .await
            .unwrap();
    }
    let batch = store
        .claim_batch(ClaimBatch {
            limit: 10,
            now: now + secs(10),
            lease: LEASE,
        })
        .await
        .unwrap();
    assert_eq!(batch.claimed.len(), 6);
    let token = |i: usize| batch.claimed[i].claim_token.clone();
    let id = |i: usize| batch.claimed[i].id.clone();
    let at = now + secs(20);
    let failure = ErrorRecord::new("test::Failure", "handler failed");

    let round_one = join_all(vec![
        Box::pin(async {
            outcome(
                store
                    .mark_delivered(MarkDelivered {
                        id: id(0),
                        claim_token: token(0),
                        now: at,
                    })
                    .await,
            )
        }) as std::pin::Pin<Box<dyn std::future::Future<Output = String>>>,
        Box::pin(async {
            outcome(
                store
                    .mark_delivered(MarkDelivered {
                        id: id(1),
                        claim_token: "not-the-token".into(),
                        now: at,
                    })
                    .await,
            )
        }),
        Box::pin(async {
            outcome(
                store
                    .renew_claim(RenewClaim {
                        id: id(2),
                        claim_token: token(2),
                        now: at,
                        lease: LEASE,
                    })
                    .await,
            )
        }),
        Box::pin(async {
            outcome(
                store
                    .mark_failed(MarkFailed {
                        id: id(3),
                        claim_token: token(3),
                        error: failure.clone(),
                        dead_letter: false,
                        now: at,
                        retry_at: Some(at + secs(60)),
                    })
                    .await,
            )
        }),
        Box::pin(async {
            outcome(
                store
                    .release_claim(ReleaseClaim {
                        id: id(4),
                        claim_token: token(4),
                        now: at,
                    })
                    .await,
            )
        }),
        Box::pin(async {
            // Past the lease: the claim is lost even though nobody took it.
            outcome(
                store
                    .mark_delivered(MarkDelivered {
                        id: id(5),
                        claim_token: token(5),
                        now: now + secs(41),
                    })
                    .await,
            )
        }),
        Box::pin(async {
            outcome(
                store
                    .mark_delivered(MarkDelivered {
                        id: "missing".into(),
                        claim_token: "t".into(),
                        now: at,
                    })
                    .await,
            )
        }),
    ])
    .await;

    let later = at + secs(5);
    let round_two = join_all(vec![
        Box::pin(async {
            outcome(
                store
                    .mark_delivered(MarkDelivered {
                        id: id(0),
                        claim_token: token(0),
                        now: later,
                    })
                    .await,
            )
        }) as std::pin::Pin<Box<dyn std::future::Future<Output = String>>>,
        Box::pin(async {
            outcome(
                store
                    .mark_failed(MarkFailed {
                        id: id(2),
                        claim_token: token(2),
                        error: failure.clone(),
                        dead_letter: true,
                        now: later,
                        retry_at: None,
                    })
                    .await,
            )
        }),
        Box::pin(async {
            outcome(
                store
                    .mark_delivered(MarkDelivered {
                        id: id(1),
                        claim_token: token(1),
                        now: later,
                    })
                    .await,
            )
        }),
    ])
    .await;

    let mut log: Vec<String> = round_one.into_iter().chain(round_two).collect();
    for i in 0..6 {
        let m = store.get_message(&format!("m{i}")).await.unwrap();
        log.push(format!(
            "m{i}: {} attempts={} available_at={} locked_until={:?} token={} delivered_at={:?} \
             updated_at={} last_error={:?}",
            m.status,
            m.attempts,
            m.available_at,
            m.locked_until,
            m.claim_token.is_some(),
            m.delivered_at,
            m.updated_at,
            m.last_error.map(|e| e.type_name),
        ));
    }
    log
}
