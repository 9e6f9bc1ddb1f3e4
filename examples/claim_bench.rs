//! Claim throughput of the in-memory store, and how a claim's cost depends
//! on what else is stored.
//!
//! Enqueues one million pending messages, then claims and settles 100 000 of
//! them in claims of 100 (claim, then `mark_delivered` each). It also times a
//! claim of 100 with a thousand pending, with a million pending, and with a
//! hundred thousand live claims in front of the due messages: a claim walks
//! an index, not the whole store, so the three should cost about the same.
//!
//! ```text
//! cargo run --release --example claim_bench
//! ```
//!
//! The last line of output is one JSON object with the figures.

use std::time::{Duration, Instant};

use chrono::{DateTime, TimeZone, Utc};
use outbox::{
    ClaimBatch, MarkDelivered, MemoryOutbox, MessageKind, NewMessage, OutboxAdmin, OutboxStore,
    Payload, ReleaseClaim,
};

const PENDING: usize = 1_000_000;
const SETTLED: usize = 100_000;
const CLAIM: usize = 100;
const LEASE: Duration = Duration::from_secs(30);
/// Timed claims per store size; the median is reported.
const SAMPLES: usize = 300;

fn at(ms: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap() + chrono::Duration::milliseconds(ms)
}

/// A store with `count` pending messages, created a millisecond apart.
async fn filled(count: usize) -> MemoryOutbox {
    let store = MemoryOutbox::new();
    for i in 0..count {
        let payload = Payload::from_json(format!(r#"{{"order":{i}}}"#)).expect("valid JSON");
        let message = NewMessage::new(MessageKind::Event, "order.placed", payload).at(at(i as i64));
        store.enqueue(message).await.expect("enqueue");
    }
    store
}

/// Median time of a claim of 100 at `now`. Each claim is given back so the
/// store keeps its size (a released message goes to the back of the queue).
async fn claim_cost(store: &MemoryOutbox, now: DateTime<Utc>) -> Duration {
    let mut samples = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        let params = ClaimBatch {
            limit: CLAIM,
            now,
            lease: LEASE,
        };
        let started = Instant::now();
        let batch = store.claim_batch(params).await.expect("claim");
        samples.push(started.elapsed());
        assert_eq!(batch.claimed.len(), CLAIM, "the store ran dry");
        for message in batch.claimed {
            let release = ReleaseClaim {
                id: message.id,
                claim_token: message.claim_token,
                now,
            };
            store.release_claim(release).await.expect("release");
        }
    }
    samples.sort();
    samples[SAMPLES / 2]
}

fn micros(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6 * 100.0).round() / 100.0
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let started = Instant::now();
    let store = filled(PENDING).await;
    let enqueue_secs = started.elapsed().as_secs_f64();
    println!(
        "enqueued {PENDING} messages in {enqueue_secs:.2} s ({:.0} messages/s)",
        PENDING as f64 / enqueue_secs
    );
    // Every message is due from here on.
    let now = at(PENDING as i64 + 1_000);

    let at_1m = claim_cost(&store, now).await;
    let small = filled(1_000).await;
    let at_1k = claim_cost(&small, now).await;
    println!(
        "claim of {CLAIM}: {:.2} µs with 1 000 pending, {:.2} µs with 1 000 000 pending",
        micros(at_1k),
        micros(at_1m)
    );

    let started = Instant::now();
    let mut claims = 0usize;
    let mut settled = 0usize;
    while settled < SETTLED {
        let params = ClaimBatch {
            limit: CLAIM,
            now,
            lease: LEASE,
        };
        let batch = store.claim_batch(params).await.expect("claim");
        claims += 1;
        assert_eq!(batch.claimed.len(), CLAIM, "the store ran dry");
        for message in batch.claimed {
            let delivered = MarkDelivered {
                id: message.id,
                claim_token: message.claim_token,
                now,
            };
            store.mark_delivered(delivered).await.expect("deliver");
            settled += 1;
        }
    }
    let settle_secs = started.elapsed().as_secs_f64();
    let claims_per_sec = claims as f64 / settle_secs;
    let messages_per_sec = settled as f64 / settle_secs;
    println!(
        "claimed and delivered {settled} messages in {claims} claims in {settle_secs:.2} s \
         ({claims_per_sec:.0} claims/s, {messages_per_sec:.0} messages/s)"
    );

    // Live claims sit in front of every due message; a claim must not walk them.
    let mut held = 0usize;
    while held < SETTLED {
        let params = ClaimBatch {
            limit: CLAIM,
            now,
            lease: Duration::from_secs(3_600),
        };
        held += store
            .claim_batch(params)
            .await
            .expect("claim")
            .claimed
            .len();
    }
    let behind_live = claim_cost(&store, now).await;
    println!(
        "claim of {CLAIM} behind {held} live claims: {:.2} µs",
        micros(behind_live)
    );
    let stats = store.stats(now).await.expect("stats");
    println!(
        "store now: {} pending, {} claimed, {} delivered",
        stats.pending, stats.claimed, stats.delivered
    );

    let ratio = at_1m.as_secs_f64() / at_1k.as_secs_f64();
    println!(
        "{{\"store\":\"memory\",\"pending\":{PENDING},\"settled\":{settled},\
         \"claims_per_sec\":{claims_per_sec:.0},\"messages_per_sec\":{messages_per_sec:.0},\
         \"claim100_us_at_1k\":{},\"claim100_us_at_1m\":{},\"ratio_1m_vs_1k\":{ratio:.2},\
         \"claim100_us_behind_100k_live\":{}}}",
        micros(at_1k),
        micros(at_1m),
        micros(behind_live)
    );
}
