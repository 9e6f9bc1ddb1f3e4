//! Past one primary: the outbox sharded by ordering key across databases,
//! each shard drained on its own, as the guide's stores page describes.
//!
//! Two memory stores stand for two databases. A message goes to the shard
//! a stable hash of its ordering key picks, so all of a key's messages live
//! in one shard, whose claims already hold one message of a key at a time,
//! in enqueue order. Two drains, one per shard, claim and settle in a
//! seeded random interleaving (deliveries finishing out of claim order,
//! some failing and retried); per-key order must hold across the whole
//! run. Routing each message instead of each key breaks it, which the last
//! test shows.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use outbox::{
    ClaimBatch, ClaimedMessage, ErrorRecord, MarkDelivered, MarkFailed, MemoryOutbox, MessageKind,
    NewMessage, OnDeadLetter, OutboxStore, Payload,
};

const SHARDS: usize = 2;
const KEYS: usize = 40;
const PER_KEY: u32 = 25;

/// FNV-1a, 64 bits: the same number for the same key in every process, on
/// every machine and in every version, which `std`'s hasher does not
/// promise.
fn fnv1a(key: &str) -> u64 {
    key.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The shard of `key` among `shards`.
fn shard_of(key: &str, shards: usize) -> usize {
    (fnv1a(key) % shards as u64) as usize
}

/// A small seeded generator (xorshift64*), so a failure replays.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
    }
}

fn at(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(1_700_000_000_000 + ms).unwrap()
}

/// `(key, sequence number within the key)` of a message, from its id.
fn parse(id: &str) -> (String, u32) {
    let (key, seq) = id.rsplit_once('#').expect("id is key#seq");
    (key.to_owned(), seq.parse().expect("a sequence number"))
}

/// One delivery as the run's log records it.
struct Delivered {
    key: String,
    seq: u32,
    shard: usize,
}

/// Enqueues `PER_KEY` messages for each of `KEYS` keys, keys interleaved,
/// each into the shard `route` picks (given the key and the message's
/// place among the key's); then drains every shard on its own, interleaved at random, and
/// returns the deliveries in the order they completed.
async fn run(route: impl Fn(&str, u32) -> usize, seed: u64) -> Vec<Delivered> {
    let shards: Vec<MemoryOutbox> = (0..SHARDS).map(|_| MemoryOutbox::new()).collect();
    let mut clock = 0;
    for seq in 0..PER_KEY {
        for k in 0..KEYS {
            let key = format!("customer-{k}");
            let message = NewMessage::new(
                MessageKind::Event,
                "customer.changed",
                Payload::from_json(format!(r#"{{"seq":{seq}}}"#)).unwrap(),
            )
            .with_id(format!("{key}#{seq}"))
            .with_ordering_key(&key)
            .at(at(clock));
            shards[route(&key, seq)]
                .enqueue(message)
                .await
                .expect("enqueue");
            clock += 1;
        }
    }

    let mut rng = Rng(seed);
    let mut in_flight: Vec<Vec<ClaimedMessage>> = vec![Vec::new(); SHARDS];
    let mut log = Vec::new();
    let total = KEYS * PER_KEY as usize;
    while log.len() < total {
        clock += 1;
        let now = at(clock);
        let shard = rng.below(SHARDS);
        let store = &shards[shard];
        let running = &mut in_flight[shard];
        // Each drain claims for free slots of a concurrency of 8, and
        // finishes its deliveries in any order.
        if running.len() < 8 && (running.is_empty() || rng.below(3) == 0) {
            let batch = store
                .claim_batch(ClaimBatch {
                    on_dead_letter: OnDeadLetter::default(),
                    limit: 1 + rng.below(8 - running.len()),
                    now,
                    lease: Duration::from_secs(3600),
                    max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
                    queues: Vec::new(),
                    durable: true,
                })
                .await
                .expect("claim");
            assert!(batch.dead_lettered.is_empty());
            running.extend(batch.claimed);
            continue;
        }
        if running.is_empty() {
            continue;
        }
        let message = running.swap_remove(rng.below(running.len()));
        if rng.below(10) == 0 {
            store
                .mark_failed(MarkFailed {
                    id: message.id.clone(),
                    claim_token: message.claim_token.clone(),
                    error: ErrorRecord::new("Flaky", "the consumer was busy"),
                    dead_letter: false,
                    now,
                    retry_at: Some(now),
                })
                .await
                .expect("retry");
            continue;
        }
        store
            .mark_delivered(MarkDelivered {
                id: message.id.clone(),
                claim_token: message.claim_token.clone(),
                now,
                delete: false,
            })
            .await
            .expect("settle");
        let (key, seq) = parse(&message.id);
        log.push(Delivered { key, seq, shard });
    }
    log
}

#[test]
fn the_hash_is_fnv1a_and_spreads_keys_over_both_shards() {
    assert_eq!(fnv1a(""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a("a"), 0xaf63_dc4c_8601_ec8c);
    let mut per_shard = [0; SHARDS];
    for k in 0..KEYS {
        per_shard[shard_of(&format!("customer-{k}"), SHARDS)] += 1;
    }
    assert!(per_shard.iter().all(|&n| n > 0), "{per_shard:?}");
}

#[tokio::test]
async fn a_key_routed_to_one_shard_keeps_its_order_while_the_shards_drain_apart() {
    for seed in [1, 7, 2024] {
        let log = run(|key, _| shard_of(key, SHARDS), seed).await;
        let mut next: HashMap<&str, u32> = HashMap::new();
        let mut shards_of: BTreeMap<&str, usize> = BTreeMap::new();
        let mut per_shard = [0; SHARDS];
        for delivery in &log {
            let expected = next.entry(&delivery.key).or_insert(0);
            assert_eq!(
                delivery.seq, *expected,
                "seed {seed}: {} delivered out of order",
                delivery.key
            );
            *expected += 1;
            let shard = *shards_of.entry(&delivery.key).or_insert(delivery.shard);
            assert_eq!(shard, delivery.shard, "a key lives in one shard");
            assert_eq!(shard, shard_of(&delivery.key, SHARDS));
            per_shard[shard] += 1;
        }
        assert_eq!(next.len(), KEYS);
        assert!(next.values().all(|&n| n == PER_KEY), "each message once");
        assert!(per_shard.iter().all(|&n| n > 0), "both shards drained");
    }
}

#[tokio::test]
async fn routing_each_message_instead_of_each_key_breaks_the_order() {
    // Round robin over a key's messages: its next message waits for
    // nothing in the other shard.
    let log = run(|_, seq| seq as usize % SHARDS, 1).await;
    let mut last: HashMap<&str, u32> = HashMap::new();
    let out_of_order = log
        .iter()
        .filter(|delivery| {
            let before = last.insert(&delivery.key, delivery.seq);
            before.is_some_and(|before| before > delivery.seq)
        })
        .count();
    assert!(
        out_of_order > 0,
        "with a key's messages in both shards, the shards' drains overtake each other"
    );
}
