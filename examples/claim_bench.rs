//! How a claim's cost depends on what else is stored, and the claim
//! throughput of the in-memory store.
//!
//! Enqueues one million pending messages and times a claim of 100 with a
//! thousand pending, with a million pending, and with a hundred thousand
//! live claims in front of the due messages: a claim walks an index, not the
//! whole store, so the three should cost about the same. On the memory store
//! it also claims and settles 100 000 of them in claims of 100 (claim, then
//! `mark_delivered` each); the SQL stores' throughput is `examples/bench`'s.
//!
//! ```text
//! cargo run --release --example claim_bench
//! cargo run --release --example claim_bench -- --store sqlite
//! WITH_POSTGRES_DURABLE=1 scripts/with-postgres cargo run --release --features postgres \
//!     --example claim_bench -- --store postgres
//! ```
//!
//! With `--keys N`, it instead compares, in one run, the claim of 100 with a
//! million pending messages without ordering keys and with a million pending
//! spread round-robin over `N` ordering keys (so a tenth of them are heads
//! with `--keys 100000`), and reports the ratio.
//!
//! ```text
//! cargo run --release --features sqlite --example claim_bench -- --store sqlite --keys 100000
//! ```
//!
//! `--pending N` (with `--keys`) puts `N` messages in each store instead of
//! a million. With `--mixed` (and `--keys`) the keyed store also gets `N`
//! keyless messages, enqueued after its keyed ones: the run then measures a
//! claim of 100 that takes each key's head and keyless messages queued
//! behind a keyed backlog, against the same claim with no keys at all. With fewer keys than the claim's 100 (`--keys 3`), a keyed
//! claim takes one head per key: the run then measures a claim that finds
//! few heads in front of a long backlog.
//!
//! SQLite runs on fresh files in the temporary directory, PostgreSQL on
//! fresh tables in `DATABASE_URL`, removed afterwards.
//!
//! The last line of output is one JSON object with the figures.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeZone, Utc};
use futures_util::future::join_all;
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

/// Messages per transaction while filling a SQL store.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
const FILL_CHUNK: usize = 10_000;

/// Ordering keys the messages enqueued from now on are spread over; 0 for
/// none.
static KEYS: AtomicUsize = AtomicUsize::new(0);

/// Messages from this one on get no ordering key (`--mixed`).
static KEYED_BELOW: AtomicUsize = AtomicUsize::new(usize::MAX);

/// The `i`th message, created `i` milliseconds after the first, with the
/// ordering key `i % KEYS` when there are keys and `i` is below
/// `KEYED_BELOW`.
fn message(i: usize) -> NewMessage {
    let payload = Payload::from_json(format!(r#"{{"order":{i}}}"#)).expect("valid JSON");
    let message = NewMessage::new(MessageKind::Event, "order.placed", payload).at(at(i as i64));
    match KEYS.load(Ordering::Relaxed) {
        0 => message,
        _ if i >= KEYED_BELOW.load(Ordering::Relaxed) => message,
        keys => message.with_ordering_key(format!("order-{}", i % keys)),
    }
}

/// The size of the keyed store of a `--keys` run: `pending` keyed messages,
/// and with `mixed` as many keyless ones after them.
fn keyed_fill(pending: usize, mixed: bool) -> usize {
    if mixed {
        KEYED_BELOW.store(pending, Ordering::Relaxed);
        2 * pending
    } else {
        pending
    }
}

/// A store with `count` pending messages, created a millisecond apart.
async fn filled(count: usize) -> MemoryOutbox {
    let store = MemoryOutbox::new();
    for i in 0..count {
        store.enqueue(message(i)).await.expect("enqueue");
    }
    store
}

/// Median time of a claim of 100 at `now`. Each claim is given back so the
/// store keeps its size (a released message goes to the back of the queue);
/// the releases run together, so a SQL store writes them in few statements.
async fn claim_cost(store: &impl OutboxStore, now: DateTime<Utc>) -> Duration {
    claim_cost_of(store, now, CLAIM).await
}

/// [`claim_cost`] for a store where each claim finds `expected` messages.
async fn claim_cost_of(store: &impl OutboxStore, now: DateTime<Utc>, expected: usize) -> Duration {
    let mut samples = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        let params = ClaimBatch {
            on_dead_letter: Default::default(),
            limit: CLAIM,
            now,
            lease: LEASE,
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
        };
        let started = Instant::now();
        let batch = store.claim_batch(params).await.expect("claim");
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
    samples.sort();
    samples[SAMPLES / 2]
}

fn micros(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6 * 100.0).round() / 100.0
}

/// The stores this build can measure.
const STORES: &[&str] = &[
    "memory",
    #[cfg(feature = "sqlite")]
    "sqlite",
    #[cfg(feature = "postgres")]
    "postgres",
];

/// `--store NAME`, `--keys N`, `--pending N` and `--mixed`, in any order.
fn parse_args() -> (String, Option<usize>, usize, bool) {
    let usage = || -> ! {
        eprintln!(
            "usage: claim_bench [--store {}] [--keys N [--pending N] [--mixed]]",
            STORES.join("|")
        );
        std::process::exit(2);
    };
    let mut store = "memory".to_owned();
    let mut keys = None;
    let mut pending = None;
    let mut mixed = false;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--mixed" {
            mixed = true;
            continue;
        }
        let value = args.next().unwrap_or_else(|| usage());
        match flag.as_str() {
            "--store" => store = value,
            "--keys" => match value.parse::<usize>() {
                Ok(n) if n >= 1 => keys = Some(n),
                _ => {
                    eprintln!(
                        "--keys takes a number of ordering keys, at least 1 ({value:?} given)"
                    );
                    std::process::exit(2);
                }
            },
            "--pending" => match value.parse::<usize>() {
                Ok(n) if n >= CLAIM => pending = Some(n),
                _ => {
                    eprintln!(
                        "--pending takes a number of messages, at least {CLAIM} ({value:?} given)"
                    );
                    std::process::exit(2);
                }
            },
            _ => usage(),
        }
    }
    if pending.is_some() && keys.is_none() {
        eprintln!("--pending sizes the --keys comparison; give --keys too");
        std::process::exit(2);
    }
    if mixed && keys.is_none() {
        eprintln!("--mixed adds keyless messages to the --keys comparison; give --keys too");
        std::process::exit(2);
    }
    if !STORES.contains(&store.as_str()) {
        eprintln!(
            "unknown store {store:?}; this build knows: {} (the SQL stores need their cargo \
             features: --features sqlite, --features postgres)",
            STORES.join(", ")
        );
        std::process::exit(2);
    }
    (store, keys, pending.unwrap_or(PENDING), mixed)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let (store, keys, pending, mixed) = parse_args();
    match (store.as_str(), keys) {
        #[cfg(feature = "sqlite")]
        ("sqlite", None) => sqlite::run().await,
        #[cfg(feature = "sqlite")]
        ("sqlite", Some(keys)) => sqlite::run_keys(keys, pending, mixed).await,
        #[cfg(feature = "postgres")]
        ("postgres", None) => postgres::run().await,
        #[cfg(feature = "postgres")]
        ("postgres", Some(keys)) => postgres::run_keys(keys, pending, mixed).await,
        (_, None) => {
            let started = Instant::now();
            let store = filled(PENDING).await;
            let small = filled(1_000).await;
            measure("memory", started, store, small, true).await;
        }
        (_, Some(keys)) => {
            let keyless = filled(pending).await;
            KEYS.store(keys, Ordering::Relaxed);
            let keyed = filled(keyed_fill(pending, mixed)).await;
            compare_keys("memory", keys, pending, mixed, &keyless, &keyed).await;
        }
    }
}

/// Times the claim of 100 with `pending` messages, without keys and with
/// them spread over `keys` ordering keys (and, if `mixed`, keyless ones
/// behind them), and prints both and the ratio.
async fn compare_keys<S: OutboxStore>(
    name: &str,
    keys: usize,
    pending: usize,
    mixed: bool,
    keyless: &S,
    keyed: &S,
) {
    let now = at(2 * pending as i64 + 1_000);
    // One head per key at most; keyless messages fill the rest.
    let keyed_claim = if mixed { CLAIM } else { CLAIM.min(keys) };
    // Alternating, so neither side gets a warmer machine.
    let mut keyless_cost = Vec::new();
    let mut keyed_cost = Vec::new();
    for _ in 0..3 {
        keyless_cost.push(claim_cost(keyless, now).await);
        keyed_cost.push(claim_cost_of(keyed, now, keyed_claim).await);
    }
    keyless_cost.sort();
    keyed_cost.sort();
    let (keyless_cost, keyed_cost) = (keyless_cost[1], keyed_cost[1]);
    let ratio = keyed_cost.as_secs_f64() / keyless_cost.as_secs_f64();
    println!(
        "{name}: claim of {CLAIM} with {pending} pending: {:.2} µs without ordering keys, \
         {:.2} µs over {keys} keys{}, {keyed_claim} a claim ({ratio:.2}x)",
        micros(keyless_cost),
        micros(keyed_cost),
        if mixed {
            " with as many keyless behind"
        } else {
            ""
        }
    );
    println!(
        "{{\"store\":\"{name}\",\"pending\":{pending},\"keys\":{keys},\"mixed\":{mixed},\
         \"claimed_keyed\":{keyed_claim},\
         \"claim100_us_keyless\":{},\"claim100_us_keyed\":{},\"ratio_keyed_vs_keyless\":{ratio:.2}}}",
        micros(keyless_cost),
        micros(keyed_cost)
    );
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
        PENDING + 1_000,
        (PENDING + 1_000) as f64 / enqueue_secs
    );
    // Every message is due from here on.
    let now = at(PENDING as i64 + 1_000);

    let at_1m = claim_cost(&store, now).await;
    let at_1k = claim_cost(&small, now).await;
    println!(
        "{name}: claim of {CLAIM}: {:.2} µs with 1 000 pending, {:.2} µs with 1 000 000 pending",
        micros(at_1k),
        micros(at_1m)
    );

    let mut throughput = String::new();
    if settle {
        let started = Instant::now();
        let mut claims = 0usize;
        let mut settled = 0usize;
        while settled < SETTLED {
            let params = ClaimBatch {
                on_dead_letter: Default::default(),
                limit: CLAIM,
                now,
                lease: LEASE,
                max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
            };
            let batch = store.claim_batch(params).await.expect("claim");
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
        throughput = format!(
            "\"settled\":{settled},\"claims_per_sec\":{claims_per_sec:.0},\
             \"messages_per_sec\":{messages_per_sec:.0},"
        );
    }

    // Live claims sit in front of every due message; a claim must not walk them.
    let mut held = 0usize;
    while held < SETTLED {
        let params = ClaimBatch {
            on_dead_letter: Default::default(),
            limit: CLAIM,
            now,
            lease: Duration::from_secs(3_600),
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
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
        "{{\"store\":\"{name}\",\"pending\":{PENDING},{throughput}\
         \"claim100_us_at_1k\":{},\"claim100_us_at_1m\":{},\"ratio_1m_vs_1k\":{ratio:.2},\
         \"claim100_us_behind_100k_live\":{}}}",
        micros(at_1k),
        micros(at_1m),
        micros(behind_live)
    );
}

#[cfg(feature = "sqlite")]
mod sqlite {
    //! Fresh database files in the temporary directory.

    use std::path::PathBuf;

    use outbox::SqliteOutbox;

    use super::*;

    /// A database file, removed on drop with its WAL and shared-memory files.
    struct TempDatabase(PathBuf);

    impl Drop for TempDatabase {
        fn drop(&mut self) {
            for suffix in ["", "-wal", "-shm"] {
                let mut name = self.0.clone().into_os_string();
                name.push(suffix);
                let _ = std::fs::remove_file(PathBuf::from(name));
            }
        }
    }

    async fn filled(count: usize) -> (TempDatabase, SqliteOutbox) {
        filled_as(count, "plain").await
    }

    async fn filled_as(count: usize, tag: &str) -> (TempDatabase, SqliteOutbox) {
        let database = TempDatabase(std::env::temp_dir().join(format!(
            "outbox-claim-bench-{}-{tag}-{count}.db",
            std::process::id()
        )));
        let store = SqliteOutbox::connect(&format!("sqlite://{}", database.0.display()))
            .await
            .expect("open the bench database");
        let mut i = 0;
        while i < count {
            let mut tx = store.pool().begin().await.expect("begin");
            for _ in 0..FILL_CHUNK.min(count - i) {
                store
                    .enqueue_in(&mut tx, message(i))
                    .await
                    .expect("enqueue");
                i += 1;
            }
            tx.commit().await.expect("commit");
        }
        (database, store)
    }

    pub(super) async fn run() {
        let started = Instant::now();
        let (_large, store) = filled(PENDING).await;
        let (_small, small) = filled(1_000).await;
        measure("sqlite", started, store, small, false).await;
    }

    pub(super) async fn run_keys(keys: usize, pending: usize, mixed: bool) {
        let (_keyless_file, keyless) = filled(pending).await;
        KEYS.store(keys, Ordering::Relaxed);
        let (_keyed_file, keyed) = filled_as(keyed_fill(pending, mixed), "keyed").await;
        compare_keys("sqlite", keys, pending, mixed, &keyless, &keyed).await;
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    //! Fresh tables in `DATABASE_URL`, dropped afterwards.

    use outbox::PostgresOutbox;
    use sqlx::AssertSqlSafe;
    use sqlx::postgres::PgPoolOptions;

    use super::*;

    async fn filled(url: &str, count: usize) -> PostgresOutbox {
        filled_as(url, count, "plain").await
    }

    async fn filled_as(url: &str, count: usize, tag: &str) -> PostgresOutbox {
        let pool = PgPoolOptions::new()
            .connect(url)
            .await
            .expect("connect to DATABASE_URL");
        let store = PostgresOutbox::builder(pool)
            .table(&format!("claim_bench_{}_{tag}_{count}", std::process::id()))
            .expect("a valid table name")
            .notify(false)
            .build();
        drop_table(&store).await;
        store.setup().await.expect("create the bench table");
        let mut i = 0;
        while i < count {
            let mut tx = store.pool().begin().await.expect("begin");
            for _ in 0..FILL_CHUNK.min(count - i) {
                store
                    .enqueue_in(&mut tx, message(i))
                    .await
                    .expect("enqueue");
                i += 1;
            }
            tx.commit().await.expect("commit");
        }
        let analyze = format!("ANALYZE {}", store.table().quoted());
        sqlx::raw_sql(AssertSqlSafe(analyze))
            .execute(store.pool())
            .await
            .expect("analyze");
        store
    }

    async fn drop_table(store: &PostgresOutbox) {
        let table = store.table().to_string();
        let drop = format!(
            "DROP TABLE IF EXISTS \"{table}\", \"{table}_migrations\", \"{table}_drains\"; \
             DROP FUNCTION IF EXISTS \"{table}_wake\", \"{table}_claim_heads\", \"{table}_claim\", \"{table}_settle\""
        );
        sqlx::raw_sql(AssertSqlSafe(drop))
            .execute(store.pool())
            .await
            .expect("drop the bench table");
    }

    pub(super) async fn run_keys(keys: usize, pending: usize, mixed: bool) {
        let url = database_url();
        let keyless = filled(&url, pending).await;
        KEYS.store(keys, Ordering::Relaxed);
        let keyed = filled_as(&url, keyed_fill(pending, mixed), "keyed").await;
        compare_keys("postgres", keys, pending, mixed, &keyless, &keyed).await;
        drop_table(&keyless).await;
        drop_table(&keyed).await;
    }

    fn database_url() -> String {
        std::env::var("DATABASE_URL").unwrap_or_else(|_| {
            eprintln!(
                "--store postgres needs DATABASE_URL; run it under scripts/with-postgres \
                 for a throwaway cluster"
            );
            std::process::exit(2)
        })
    }

    pub(super) async fn run() {
        let url = database_url();
        let started = Instant::now();
        let store = filled(&url, PENDING).await;
        let small = filled(&url, 1_000).await;
        measure("postgres", started, store.clone(), small.clone(), false).await;
        drop_table(&store).await;
        drop_table(&small).await;
    }
}
