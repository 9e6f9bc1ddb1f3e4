//! How a claim's cost depends on what else is stored, and the claim
//! throughput of the in-memory store.
//!
//! Enqueues one million pending messages and times a claim of 100 with a
//! thousand pending, with a million pending, and with a hundred thousand
//! live claims in front of the due messages: a claim walks an index, not the
//! whole store, so the three should cost about the same. On the memory store
//! it also claims and settles 100 000 of them in claims of 100 (claim, then
//! `mark_delivered` each); the SQL stores' throughput is the `bench`
//! binary's.
//!
//! ```text
//! cargo run --release -p outbox-bench --bin claim_bench
//! cargo run --release -p outbox-bench --bin claim_bench -- --store sqlite
//! WITH_POSTGRES_DURABLE=1 scripts/with-postgres cargo run --release -p outbox-bench \
//!     --features postgres --bin claim_bench -- --store postgres
//! ```
//!
//! With `--keys N`, it instead compares, in one run, the claim of 100 with a
//! million pending messages without ordering keys and with a million pending
//! spread round-robin over `N` ordering keys (so a tenth of them are heads
//! with `--keys 100000`), and reports the ratio.
//!
//! ```text
//! cargo run --release -p outbox-bench --bin claim_bench -- --store sqlite --keys 100000
//! ```
//!
//! With `--queues N`, it compares, in one run, a claim of 100 from a
//! million pending messages in one queue with a claim of 100 over `N`
//! queues holding a million between them (round-robin), the claim serving
//! every one of them with an equal share of the 100; and a claim of 100
//! from one of those queues alone. With `--priorities`, it compares a claim
//! of 100 from a million pending messages of one priority with the same
//! messages spread over eleven priorities (-5 to 5).
//!
//! ```text
//! cargo run --release -p outbox-bench --bin claim_bench -- --store sqlite --queues 10
//! cargo run --release -p outbox-bench --bin claim_bench -- --store sqlite --priorities
//! ```
//!
//! `--pending N` (with `--keys`, `--queues` or `--priorities`) puts `N`
//! messages in each store instead of
//! a million. With `--mixed` (and `--keys`) the keyed store also gets `N`
//! keyless messages, enqueued after its keyed ones: the run then measures a
//! claim of 100 that takes each key's head and keyless messages queued
//! behind a keyed backlog, against the same claim with no keys at all. With
//! fewer keys than the claim's 100 (`--keys 3`), a keyed claim takes one
//! head per key: the run then measures a claim that finds few heads in
//! front of a long backlog.
//!
//! With `--hot N` (and `--keys`) the keyed store also gets `N` messages of
//! one more key, enqueued before all the others, so that key's backlog is
//! at the front of claim order; the keyless store gets as many messages as
//! the keyed one has keyed. The shape of a production store with many keys
//! and one busy entity: a keyed claim of 100 takes the hot key's head and
//! 99 other heads.
//!
//! ```text
//! cargo run --release -p outbox-bench --bin claim_bench -- --store sqlite --keys 100000 \
//!     --pending 100000 --hot 100000
//! ```
//!
//! SQLite runs on fresh files in the temporary directory, PostgreSQL on
//! fresh tables in `DATABASE_URL`, removed afterwards. Each timed claim is
//! the median of 300 (`--samples N` for another number); each claim's
//! messages are given back before the next.
//!
//! # Output
//!
//! The last line is one JSON object. Without `--keys`: `store`, `pending`;
//! on memory `settled`, `claims_per_sec`, `messages_per_sec`; then
//! `claim100_us_at_1k`, `claim100_us_at_1m` (µs), `ratio_1m_vs_1k`,
//! `claim100_us_behind_100k_live`. With `--keys`: `store`, `pending`,
//! `keys`, `mixed`, `hot_backlog`, `claimed_keyed` (messages a keyed claim finds),
//! `claim100_us_keyless`, `claim100_us_keyed`, `ratio_keyed_vs_keyless`.
//! With `--queues`: `store`, `pending`, `queues`, `claim100_us_one_queue`,
//! `claim100_us_all_queues`, `ratio_all_queues_vs_one`,
//! `claim100_us_one_of_the_queues`, `ratio_one_of_the_queues_vs_one`. With
//! `--priorities`: `store`, `pending`, `priorities`, `claim100_us_plain`,
//! `claim100_us_prioritized`, `ratio_priorities_vs_none`.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeZone, Utc};
use futures_util::future::join_all;
use outbox::{
    ClaimBatch, MarkDelivered, MessageKind, NewMessage, OutboxAdmin, OutboxStore, Payload,
    QueueLimit, ReleaseClaim,
};
use outbox_bench::args::{Flags, refuse};
use outbox_bench::report::print_json;
use outbox_bench::stats::{median, micros, round};
use outbox_bench::store::{STORES, check, claim, memory_filled};
use serde::Serialize;

mod keys;

use keys::{KeysRun, compare_keys};

/// Messages in the large store.
const PENDING: u64 = 1_000_000;
/// Messages in the small store.
const SMALL: u64 = 1_000;
/// Messages the memory store settles, and live claims put in front.
const SETTLED: usize = 100_000;
/// Messages a timed claim asks for.
const CLAIM: usize = 100;
const LEASE: Duration = Duration::from_secs(30);
/// Timed claims per store size; the median is reported. `--samples N`
/// sets another number, for runs whose slow side would take too long.
static SAMPLES: AtomicUsize = AtomicUsize::new(300);

fn at(ms: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap() + chrono::Duration::milliseconds(ms)
}

/// Ordering keys the messages enqueued from now on are spread over; 0 for
/// none.
static KEYS: AtomicU64 = AtomicU64::new(0);

/// Messages from this one on get no ordering key (`--mixed`).
static KEYED_BELOW: AtomicU64 = AtomicU64::new(u64::MAX);

/// Messages below this one get the hot key (`--hot`).
static HOT: AtomicU64 = AtomicU64::new(0);

/// Queues the messages enqueued from now on are spread over; 0 for the
/// default queue alone.
static QUEUES: AtomicU64 = AtomicU64::new(0);

/// Priorities the messages enqueued from now on are spread over, around
/// 0; 0 for none.
static PRIORITIES: AtomicU64 = AtomicU64::new(0);

/// The name of the `n`th queue of a `--queues` run.
fn queue_name(n: u64) -> String {
    format!("queue-{n}")
}

/// The `i`th message, created `i` milliseconds after the first, with the
/// ordering key `i % KEYS` when there are keys and `i` is below
/// `KEYED_BELOW`, and the hot key when `i` is below `HOT`.
fn message(i: u64) -> NewMessage {
    let payload = Payload::from_json(format!(r#"{{"order":{i}}}"#)).expect("valid JSON");
    let mut message = NewMessage::new(MessageKind::Event, "order.placed", payload).at(at(i as i64));
    if let queues @ 1.. = QUEUES.load(Ordering::Relaxed) {
        message = message.with_queue(queue_name(i % queues));
    }
    if let levels @ 1.. = PRIORITIES.load(Ordering::Relaxed) {
        // Spread so that neighbours in time differ in priority.
        let level = (i.wrapping_mul(7919) % levels) as i16 - (levels / 2) as i16;
        message = message.with_priority(level);
    }
    match KEYS.load(Ordering::Relaxed) {
        0 => message,
        _ if i >= KEYED_BELOW.load(Ordering::Relaxed) => message,
        _ if i < HOT.load(Ordering::Relaxed) => message.with_ordering_key("hot"),
        keys => message.with_ordering_key(format!("order-{}", i % keys)),
    }
}

/// Median time of a claim of 100 at `now`, where each claim finds
/// `expected` messages. Each claim is given back so the store keeps its
/// size (a released message goes to the back of the queue); the releases
/// run together, so a SQL store writes them in few statements.
async fn claim_cost(store: &impl OutboxStore, now: DateTime<Utc>, expected: usize) -> Duration {
    claim_cost_of(store, || claim(CLAIM, now, LEASE), expected).await
}

/// [`claim_cost`] for the claims `batch` makes.
async fn claim_cost_of(
    store: &impl OutboxStore,
    batch: impl Fn() -> ClaimBatch,
    expected: usize,
) -> Duration {
    let now = batch().now;
    let count = SAMPLES.load(Ordering::Relaxed);
    let mut samples = Vec::with_capacity(count);
    for _ in 0..count {
        let started = Instant::now();
        let batch = store.claim_batch(batch()).await.expect("claim");
        samples.push(started.elapsed());
        assert_eq!(batch.claimed.len(), expected, "the store ran dry");
        let releases = batch.claimed.into_iter().map(|message| {
            store.release_claim(ReleaseClaim {
                id: message.id,
                claim_token: message.claim_token,
                now,
            })
        });
        for released in join_all(releases).await {
            released.expect("release");
        }
    }
    median(samples)
}

/// The command line.
struct Args {
    /// The store measured.
    store: String,
    /// `--keys N`: compare keyless with keyed claims.
    keys: Option<u64>,
    /// Messages in each store of a `--keys` run.
    pending: u64,
    /// Keyless messages behind the keyed ones.
    mixed: bool,
    /// `--hot N`: messages of one hot key in front of the keyed ones.
    hot: u64,
    /// `--queues N`: compare one queue with `N`.
    queues: Option<u64>,
    /// `--priorities`: compare one priority with eleven.
    priorities: bool,
}

fn parse_args(mut flags: Flags) -> Result<Args, String> {
    let usage = || {
        format!(
            "usage: claim_bench [--store {}] [--samples N] [--keys N [--pending N] [--mixed] [--hot N] | --queues N \
             [--pending N] | --priorities [--pending N]]",
            STORES.join("|")
        )
    };
    let mut args = Args {
        store: "memory".to_owned(),
        keys: None,
        pending: PENDING,
        mixed: false,
        hot: 0,
        queues: None,
        priorities: false,
    };
    let mut pending_given = false;
    while let Some(flag) = flags.next_flag() {
        match flag.as_str() {
            "--mixed" => args.mixed = true,
            "--samples" => {
                let value = flags.value(&flag).map_err(|_| usage())?;
                match value.parse() {
                    Ok(n) if n >= 1 => SAMPLES.store(n, Ordering::Relaxed),
                    _ => {
                        return Err(format!(
                            "--samples takes a number of timed claims, at least 1 ({value:?} given)"
                        ));
                    }
                }
            }
            "--hot" => {
                let value = flags.value(&flag).map_err(|_| usage())?;
                match value.parse() {
                    Ok(n) if n >= 1 => args.hot = n,
                    _ => {
                        return Err(format!(
                            "--hot takes a number of messages, at least 1 ({value:?} given)"
                        ));
                    }
                }
            }
            "--priorities" => args.priorities = true,
            "--queues" => {
                let value = flags.value(&flag).map_err(|_| usage())?;
                match value.parse() {
                    Ok(n) if (2..=(CLAIM as u64)).contains(&n) => args.queues = Some(n),
                    _ => {
                        return Err(format!(
                            "--queues takes a number of queues, 2 to {CLAIM} ({value:?} given)"
                        ));
                    }
                }
            }
            "--store" => args.store = flags.value(&flag).map_err(|_| usage())?,
            "--keys" => {
                let value = flags.value(&flag).map_err(|_| usage())?;
                match value.parse() {
                    Ok(n) if n >= 1 => args.keys = Some(n),
                    _ => {
                        return Err(format!(
                            "--keys takes a number of ordering keys, at least 1 ({value:?} given)"
                        ));
                    }
                }
            }
            "--pending" => {
                let value = flags.value(&flag).map_err(|_| usage())?;
                match value.parse() {
                    Ok(n) if n >= CLAIM as u64 => {
                        pending_given = true;
                        args.pending = n;
                    }
                    _ => {
                        return Err(format!(
                            "--pending takes a number of messages, at least {CLAIM} ({value:?} given)"
                        ));
                    }
                }
            }
            _ => return Err(usage()),
        }
    }
    let modes = [args.keys.is_some(), args.queues.is_some(), args.priorities];
    if modes.iter().filter(|&&on| on).count() > 1 {
        return Err("--keys, --queues and --priorities are separate runs; give one".into());
    }
    if pending_given && !modes.contains(&true) {
        return Err(
            "--pending sizes the --keys, --queues or --priorities comparison; give one".into(),
        );
    }
    if args.mixed && args.keys.is_none() {
        return Err(
            "--mixed adds keyless messages to the --keys comparison; give --keys too".into(),
        );
    }
    if args.hot > 0 && args.keys.is_none() {
        return Err("--hot adds a hot key to the --keys comparison; give --keys too".into());
    }
    check(&args.store, STORES)?;
    Ok(args)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let Args {
        store,
        keys,
        pending,
        mixed,
        hot,
        queues,
        priorities,
    } = parse_args(Flags::from_env()).unwrap_or_else(|message| refuse(message));
    if let Some(queues) = queues {
        return match store.as_str() {
            #[cfg(feature = "sqlite")]
            "sqlite" => sqlite::run_queues(queues, pending).await,
            #[cfg(feature = "postgres")]
            "postgres" => postgres::run_queues(queues, pending).await,
            _ => {
                let one = memory_filled(pending, message).await;
                QUEUES.store(queues, Ordering::Relaxed);
                let many = memory_filled(pending, message).await;
                compare_queues("memory", queues, pending, &one, &many).await;
            }
        };
    }
    if priorities {
        return match store.as_str() {
            #[cfg(feature = "sqlite")]
            "sqlite" => sqlite::run_priorities(pending).await,
            #[cfg(feature = "postgres")]
            "postgres" => postgres::run_priorities(pending).await,
            _ => {
                let plain = memory_filled(pending, message).await;
                PRIORITIES.store(LEVELS, Ordering::Relaxed);
                let prioritized = memory_filled(pending, message).await;
                compare_priorities("memory", pending, &plain, &prioritized).await;
            }
        };
    }
    let keys = keys.map(|keys| KeysRun {
        keys,
        pending,
        mixed,
        hot,
    });
    match (store.as_str(), keys) {
        #[cfg(feature = "sqlite")]
        ("sqlite", None) => sqlite::run().await,
        #[cfg(feature = "sqlite")]
        ("sqlite", Some(keys)) => sqlite::run_keys(keys).await,
        #[cfg(feature = "postgres")]
        ("postgres", None) => postgres::run().await,
        #[cfg(feature = "postgres")]
        ("postgres", Some(keys)) => postgres::run_keys(keys).await,
        (_, None) => {
            let started = Instant::now();
            let store = memory_filled(PENDING, message).await;
            let small = memory_filled(SMALL, message).await;
            measure("memory", started, store, small, true).await;
        }
        (_, Some(keys)) => {
            let keyless = memory_filled(keys.keyless_fill(), message).await;
            let keyed = memory_filled(keys.keyed_fill(), message).await;
            compare_keys("memory", keys, &keyless, &keyed).await;
        }
    }
}

/// Priorities of a `--priorities` run: -5 to 5.
const LEVELS: u64 = 11;

/// The JSON line of a `--queues` run.
#[derive(Serialize)]
struct QueuesSummary<'a> {
    store: &'a str,
    pending: u64,
    queues: u64,
    /// Median claim of 100 with every message in one queue, µs.
    claim100_us_one_queue: f64,
    /// Median claim of 100 over every queue, an equal share from each, µs.
    claim100_us_all_queues: f64,
    ratio_all_queues_vs_one: f64,
    /// Median claim of 100 from one of the queues alone, µs.
    claim100_us_one_of_the_queues: f64,
    ratio_one_of_the_queues_vs_one: f64,
}

/// Times a claim of 100 from `one` (every message in one queue) against
/// claims over the `queues` queues of `many`: from all of them, and from one.
async fn compare_queues<S: OutboxStore>(name: &str, queues: u64, pending: u64, one: &S, many: &S) {
    let now = at(pending as i64 + 1_000);
    let share = CLAIM / queues as usize;
    let over = |served: Vec<QueueLimit>, limit: usize| {
        move || ClaimBatch {
            queues: served.clone(),
            ..claim(limit, now, LEASE)
        }
    };
    let all: Vec<QueueLimit> = (0..queues)
        .map(|n| QueueLimit::new(queue_name(n), share))
        .collect();
    let all_claim = share * queues as usize;
    let single = vec![QueueLimit::new(queue_name(0), CLAIM)];
    let (mut one_cost, mut all_cost, mut single_cost) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..3 {
        one_cost.push(claim_cost(one, now, CLAIM).await);
        all_cost.push(claim_cost_of(many, over(all.clone(), all_claim), all_claim).await);
        single_cost.push(claim_cost_of(many, over(single.clone(), CLAIM), CLAIM).await);
    }
    let (one_cost, all_cost, single_cost) =
        (median(one_cost), median(all_cost), median(single_cost));
    let ratio = |cost: Duration| round(cost.as_secs_f64() / one_cost.as_secs_f64(), 2);
    println!(
        "{name}: claim of {CLAIM} with {pending} pending: {:.2} µs from one queue, {:.2} µs \
         over {queues} queues ({share} each), {:.2} µs from one of them",
        micros(one_cost),
        micros(all_cost),
        micros(single_cost)
    );
    print_json(&QueuesSummary {
        store: name,
        pending,
        queues,
        claim100_us_one_queue: micros(one_cost),
        claim100_us_all_queues: micros(all_cost),
        ratio_all_queues_vs_one: ratio(all_cost),
        claim100_us_one_of_the_queues: micros(single_cost),
        ratio_one_of_the_queues_vs_one: ratio(single_cost),
    });
}

/// The JSON line of a `--priorities` run.
#[derive(Serialize)]
struct PrioritiesSummary<'a> {
    store: &'a str,
    pending: u64,
    priorities: u64,
    /// Median claim of 100, every message of priority 0, µs.
    claim100_us_plain: f64,
    /// The same messages over the priorities, µs.
    claim100_us_prioritized: f64,
    ratio_priorities_vs_none: f64,
}

/// Times a claim of 100 from `plain` against the same from `prioritized`.
async fn compare_priorities<S: OutboxStore>(name: &str, pending: u64, plain: &S, prioritized: &S) {
    let now = at(pending as i64 + 1_000);
    let (mut plain_cost, mut prioritized_cost) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        plain_cost.push(claim_cost(plain, now, CLAIM).await);
        prioritized_cost.push(claim_cost(prioritized, now, CLAIM).await);
    }
    let (plain_cost, prioritized_cost) = (median(plain_cost), median(prioritized_cost));
    let ratio = round(prioritized_cost.as_secs_f64() / plain_cost.as_secs_f64(), 2);
    println!(
        "{name}: claim of {CLAIM} with {pending} pending: {:.2} µs of one priority, {:.2} µs \
         over {LEVELS} priorities ({ratio}x)",
        micros(plain_cost),
        micros(prioritized_cost)
    );
    print_json(&PrioritiesSummary {
        store: name,
        pending,
        priorities: LEVELS,
        claim100_us_plain: micros(plain_cost),
        claim100_us_prioritized: micros(prioritized_cost),
        ratio_priorities_vs_none: ratio,
    });
}

/// The JSON line of a run without `--keys`.
#[derive(Serialize)]
struct Summary<'a> {
    store: &'a str,
    pending: u64,
    /// The memory store's claim-and-settle figures.
    #[serde(flatten)]
    throughput: Option<Throughput>,
    /// Median claim of 100 with a thousand pending, µs.
    claim100_us_at_1k: f64,
    /// With a million pending, µs.
    claim100_us_at_1m: f64,
    ratio_1m_vs_1k: f64,
    /// With a hundred thousand live claims in front of the due messages, µs.
    claim100_us_behind_100k_live: f64,
}

/// Claims of 100, each message settled, until 100 000 were.
#[derive(Serialize)]
struct Throughput {
    settled: usize,
    claims_per_sec: u64,
    messages_per_sec: u64,
}

/// Times the claims on `store` (a million pending) and `small` (a
/// thousand), filled since `started`; settles 100 000 first if `settle`.
async fn measure<S: OutboxStore + OutboxAdmin>(
    name: &str,
    started: Instant,
    store: S,
    small: S,
    settle: bool,
) {
    let enqueue_secs = started.elapsed().as_secs_f64();
    println!(
        "enqueued {} messages in {enqueue_secs:.2} s ({:.0} messages/s)",
        PENDING + SMALL,
        (PENDING + SMALL) as f64 / enqueue_secs
    );
    // Every message is due from here on.
    let now = at((PENDING + SMALL) as i64);

    let at_1m = claim_cost(&store, now, CLAIM).await;
    let at_1k = claim_cost(&small, now, CLAIM).await;
    println!(
        "{name}: claim of {CLAIM}: {:.2} µs with 1 000 pending, {:.2} µs with 1 000 000 pending",
        micros(at_1k),
        micros(at_1m)
    );

    let throughput = if settle {
        Some(settle_all(&store, now).await)
    } else {
        None
    };

    // Live claims sit in front of every due message; a claim must not walk them.
    let mut held = 0usize;
    while held < SETTLED {
        held += store
            .claim_batch(claim(CLAIM, now, Duration::from_secs(3_600)))
            .await
            .expect("claim")
            .claimed
            .len();
    }
    let behind_live = claim_cost(&store, now, CLAIM).await;
    println!(
        "claim of {CLAIM} behind {held} live claims: {:.2} µs",
        micros(behind_live)
    );
    let stats = store.stats(now).await.expect("stats");
    println!(
        "store now: {} pending, {} claimed, {} delivered",
        stats.pending, stats.claimed, stats.delivered
    );

    print_json(&Summary {
        store: name,
        pending: PENDING,
        throughput,
        claim100_us_at_1k: micros(at_1k),
        claim100_us_at_1m: micros(at_1m),
        ratio_1m_vs_1k: round(at_1m.as_secs_f64() / at_1k.as_secs_f64(), 2),
        claim100_us_behind_100k_live: micros(behind_live),
    });
}

/// Claims 100 at a time and marks each delivered, until 100 000 are.
async fn settle_all(store: &impl OutboxStore, now: DateTime<Utc>) -> Throughput {
    let started = Instant::now();
    let mut claims = 0usize;
    let mut settled = 0usize;
    while settled < SETTLED {
        let batch = store
            .claim_batch(claim(CLAIM, now, LEASE))
            .await
            .expect("claim");
        claims += 1;
        assert_eq!(batch.claimed.len(), CLAIM, "the store ran dry");
        for message in batch.claimed {
            let delivered = MarkDelivered {
                delete: false,
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
    Throughput {
        settled,
        claims_per_sec: claims_per_sec.round() as u64,
        messages_per_sec: messages_per_sec.round() as u64,
    }
}

#[cfg(feature = "sqlite")]
mod sqlite {
    //! Fresh database files in the temporary directory.

    use outbox::SqliteOutbox;
    use outbox_bench::store::sqlite::TempDatabase;
    use outbox_bench::store::{FILL_CHUNK, fill};

    use super::*;

    /// A file holding `count` messages.
    async fn filled(count: u64) -> (TempDatabase, SqliteOutbox) {
        let database = TempDatabase::new("claim-bench");
        let store = database.open().await;
        fill(&store, 0..count, FILL_CHUNK, message).await;
        (database, store)
    }

    pub(super) async fn run() {
        let started = Instant::now();
        let (_large, store) = filled(PENDING).await;
        let (_small, small) = filled(SMALL).await;
        measure("sqlite", started, store, small, false).await;
    }

    pub(super) async fn run_keys(keys: KeysRun) {
        let (_keyless_file, keyless) = filled(keys.keyless_fill()).await;
        let (_keyed_file, keyed) = filled(keys.keyed_fill()).await;
        compare_keys("sqlite", keys, &keyless, &keyed).await;
    }

    pub(super) async fn run_queues(queues: u64, pending: u64) {
        let (_one_file, one) = filled(pending).await;
        QUEUES.store(queues, Ordering::Relaxed);
        let (_many_file, many) = filled(pending).await;
        compare_queues("sqlite", queues, pending, &one, &many).await;
    }

    pub(super) async fn run_priorities(pending: u64) {
        let (_plain_file, plain) = filled(pending).await;
        PRIORITIES.store(LEVELS, Ordering::Relaxed);
        let (_prioritized_file, prioritized) = filled(pending).await;
        compare_priorities("sqlite", pending, &plain, &prioritized).await;
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    //! Fresh tables in `DATABASE_URL`, dropped afterwards.

    use outbox::PostgresOutbox;
    use outbox_bench::store::postgres::{analyze, database_url, drop_tables, fresh};
    use outbox_bench::store::{FILL_CHUNK, fill};
    use sqlx::postgres::PgPoolOptions;

    use super::*;

    /// A table `claim_bench_<pid>_<tag>_<count>` holding `count` messages.
    async fn filled(url: &str, count: u64, tag: &str) -> PostgresOutbox {
        let table = format!("claim_bench_{}_{tag}_{count}", std::process::id());
        let store = fresh(url, &table, PgPoolOptions::new(), false).await;
        fill(&store, 0..count, FILL_CHUNK, message).await;
        analyze(&store).await;
        store
    }

    /// Drops each store's table.
    async fn drop_all(url: &str, stores: &[&PostgresOutbox]) {
        for store in stores {
            drop_tables(url, &store.table().to_string()).await;
        }
    }

    fn url() -> String {
        database_url().unwrap_or_else(|message| refuse(message))
    }

    pub(super) async fn run() {
        let url = url();
        let started = Instant::now();
        let store = filled(&url, PENDING, "plain").await;
        let small = filled(&url, SMALL, "plain").await;
        measure("postgres", started, store.clone(), small.clone(), false).await;
        drop_all(&url, &[&store, &small]).await;
    }

    pub(super) async fn run_keys(keys: KeysRun) {
        let url = url();
        let keyless = filled(&url, keys.keyless_fill(), "plain").await;
        let keyed = filled(&url, keys.keyed_fill(), "keyed").await;
        compare_keys("postgres", keys, &keyless, &keyed).await;
        drop_all(&url, &[&keyless, &keyed]).await;
    }

    pub(super) async fn run_queues(queues: u64, pending: u64) {
        let url = url();
        let one = filled(&url, pending, "one").await;
        QUEUES.store(queues, Ordering::Relaxed);
        let many = filled(&url, pending, "queues").await;
        compare_queues("postgres", queues, pending, &one, &many).await;
        drop_all(&url, &[&one, &many]).await;
    }

    pub(super) async fn run_priorities(pending: u64) {
        let url = url();
        let plain = filled(&url, pending, "plain").await;
        PRIORITIES.store(LEVELS, Ordering::Relaxed);
        let prioritized = filled(&url, pending, "prioritized").await;
        compare_priorities("postgres", pending, &plain, &prioritized).await;
        drop_all(&url, &[&plain, &prioritized]).await;
    }
}
