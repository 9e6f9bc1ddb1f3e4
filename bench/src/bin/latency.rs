//! Enqueue → handler latency with wake-ups, at a fixed rate.
//!
//! ```text
//! cargo run --release -p outbox-bench --bin latency -- --store sqlite
//! scripts/with-postgres cargo run --release -p outbox-bench --features postgres --bin latency -- \
//!     --store postgres
//! ```
//!
//! A producer thread enqueues messages at `--rate` per second (1 000 by
//! default) for `--seconds` (5), each in its own committed write, the way
//! request handlers of an application would. A coordinator with no
//! schedule and `--concurrency` deliveries (16) drains on the store's
//! wake-ups alone (SQLite: the in-process signal; PostgreSQL:
//! `LISTEN`/`NOTIFY`, sent by an enqueue only while the drain waits for
//! one; between, it claims again until it can say it waits); `--prefetch N`
//! and `--claims N` fix what the drain otherwise sizes. Latency is
//! from the moment the enqueue is called to the moment the handler starts,
//! so it includes the commit. The first fifth of a second is warm-up and
//! not counted.
//!
//! # Output
//!
//! The percentiles in words, then one JSON object: `store`, `rate`,
//! `messages` (counted), `p50_ms`, `p90_ms`, `p99_ms`, `max_ms` (enqueue
//! called → handler started), `commit_to_handler_p50_ms` and `_p99_ms`
//! (enqueue returned → handler started), `enqueue_call_p50_ms` and `_p99_ms`
//! (the enqueue call, its commit, alone), and `passes` (the drain's passes
//! over the run). The last two pairs tell a producer held up by its commits
//! from a slow wake-up.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use outbox::{
    DeliveryContext, DrainConfig, Event, InProcessBus, NewMessage, Registry, SharedStore,
};
use outbox_actors::{DrainCoordinator, GetStatus, Shutdown};
use outbox_bench::args::{Flags, refuse};
use outbox_bench::drain::current_thread;
use outbox_bench::report::print_json;
use outbox_bench::stats::percentile_ms;
use outbox_bench::store::{SQL_STORES, check};
use serde::{Deserialize, Serialize};

/// A message that carries the moment it was enqueued.
#[derive(Debug, Serialize, Deserialize)]
struct Stamp {
    n: u64,
    /// Microseconds since [`origin`] when the enqueue was called.
    sent_us: u64,
}

impl Event for Stamp {
    const NAME: &'static str = "latency.stamp";
}

/// One monotonic origin for the producer thread and the handlers.
fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

fn micros_since_origin() -> u64 {
    origin().elapsed().as_micros() as u64
}

/// The command line.
struct Args {
    /// `sqlite` or `postgres`.
    store: String,
    /// Messages enqueued per second.
    rate: u64,
    /// How long the producer enqueues.
    seconds: f64,
    /// The drain's deliveries in flight.
    concurrency: usize,
    /// The drain's `prefetch`, when given.
    prefetch: Option<usize>,
    /// The drain's `claims_in_flight`, when given.
    claims: Option<usize>,
}

fn parse_args(mut flags: Flags) -> Result<Args, String> {
    let mut args = Args {
        store: "sqlite".into(),
        rate: 1_000,
        seconds: 5.0,
        concurrency: 16,
        prefetch: None,
        claims: None,
    };
    while let Some(flag) = flags.next_flag() {
        match flag.as_str() {
            "--store" => args.store = flags.value(&flag)?,
            "--rate" => args.rate = flags.parse(&flag)?,
            "--seconds" => args.seconds = flags.parse(&flag)?,
            "--concurrency" => args.concurrency = flags.parse(&flag)?,
            "--prefetch" => args.prefetch = Some(flags.parse(&flag)?),
            "--claims" => args.claims = Some(flags.parse(&flag)?),
            "--help" | "-h" => {
                return Err("usage: latency [--store sqlite|postgres] [--rate PER_SEC] \
                     [--seconds N] [--concurrency N] [--prefetch N] [--claims N]"
                    .into());
            }
            other => return Err(format!("unknown argument {other:?}; see --help")),
        }
    }
    if args.rate == 0 || args.seconds <= 0.0 || args.concurrency == 0 {
        return Err("--rate, --seconds and --concurrency must be positive".into());
    }
    check(&args.store, SQL_STORES)?;
    Ok(args)
}

/// Makes the producer's store, on the producer's runtime.
type StoreFactory = Box<dyn FnOnce() -> SharedStore + Send>;

/// The store under test, and what to do with it afterwards.
struct Subject {
    /// The coordinator's store.
    store: SharedStore,
    /// The producer's store: the same table, seen from another runtime.
    producer: StoreFactory,
    /// Removes the store once the actix system is gone.
    cleanup: Box<dyn FnOnce()>,
}

async fn open(name: &str) -> Subject {
    match name {
        #[cfg(feature = "sqlite")]
        "sqlite" => open_sqlite().await,
        #[cfg(feature = "postgres")]
        "postgres" => open_postgres().await,
        _ => unreachable!("checked by parse_args"),
    }
}

#[cfg(feature = "sqlite")]
async fn open_sqlite() -> Subject {
    let database = outbox_bench::store::sqlite::TempDatabase::new("latency");
    let store = database.open().await;
    // SQLite connections run on threads of their own, not on a runtime, so
    // both sides can share the store; they must, for its in-process wake-ups.
    let shared: SharedStore = Arc::new(store);
    Subject {
        store: shared.clone(),
        producer: Box::new(move || shared),
        cleanup: Box::new(move || drop(database)),
    }
}

#[cfg(feature = "postgres")]
async fn open_postgres() -> Subject {
    use outbox_bench::store::postgres::{database_url, drop_tables, fresh, store};
    use sqlx::postgres::PgPoolOptions;

    let url = database_url().unwrap_or_else(|message| refuse(message));
    // A table of its own, dropped afterwards, so runs never see each other.
    // Its inserts notify: the drain waits on them.
    let table = format!("latency_{}", uuid::Uuid::new_v4().simple());
    let coordinator_store = fresh(&url, &table, PgPoolOptions::new(), true).await;
    // A connection belongs to the runtime that opened it and fails once that
    // runtime shuts down, so the producer gets a pool of its own, opened on
    // its runtime; the coordinator hears its commits through NOTIFY.
    let (producer_table, producer_url) = (table.clone(), url.clone());
    let producer: StoreFactory = Box::new(move || {
        Arc::new(store(
            &producer_url,
            &producer_table,
            PgPoolOptions::new(),
            true,
        ))
    });
    Subject {
        store: Arc::new(coordinator_store),
        producer,
        // The pool's connections belonged to the runtime that ended with
        // the system, so the tables are dropped on a runtime of their own.
        cleanup: Box::new(move || current_thread().block_on(drop_tables(&url, &table))),
    }
}

/// Enqueue `total` messages at `rate` per second, each call on a task of its
/// own (the way independent requests would), on a runtime of its own.
/// Returns when each enqueue call returned (committed), in microseconds
/// since [`origin`], and how long it took.
fn produce(store: StoreFactory, rate: u64, total: u64) -> Vec<(u64, u64)> {
    current_thread().block_on(async move {
        let store = store();
        let started = tokio::time::Instant::now();
        let mut calls = Vec::with_capacity(total as usize);
        for n in 0..total {
            let due = started + Duration::from_secs_f64(n as f64 / rate as f64);
            tokio::time::sleep_until(due).await;
            let store = store.clone();
            calls.push(tokio::spawn(async move {
                let sent_us = micros_since_origin();
                let message = NewMessage::event(&Stamp { n, sent_us }).expect("a stamp serializes");
                store.enqueue(message).await.expect("enqueue");
                let committed_us = micros_since_origin();
                (committed_us, committed_us - sent_us)
            }));
        }
        let mut took = Vec::with_capacity(calls.len());
        for call in calls {
            took.push(call.await.expect("an enqueue task"));
        }
        took
    })
}

/// The 50th, 90th and 99th percentiles and the maximum of `values` (µs),
/// in milliseconds.
fn summary(values: &mut [u64]) -> [f64; 4] {
    values.sort_unstable();
    [50.0, 90.0, 99.0, 100.0].map(|p| percentile_ms(values, p))
}

fn main() {
    let Args {
        store: store_name,
        rate,
        seconds,
        concurrency,
        prefetch,
        claims,
    } = parse_args(Flags::from_env()).unwrap_or_else(|message| refuse(message));
    let total = (rate as f64 * seconds).round().max(1.0) as u64;
    let name = store_name.clone();
    let warmup = rate / 5;
    origin();

    let (runs, passes, cleanup) = actix::System::new().block_on(async move {
        let subject = open(&name).await;
        let latencies = Arc::new(Mutex::new(Vec::with_capacity(total as usize)));
        let (done, mut all_done) = tokio::sync::mpsc::unbounded_channel();
        let bus = {
            let latencies = latencies.clone();
            InProcessBus::new().on(move |stamp: Arc<Stamp>, _: DeliveryContext| {
                let mut latencies = latencies.lock().expect("latencies");
                latencies.push((stamp.n, stamp.sent_us, micros_since_origin()));
                if latencies.len() as u64 == total {
                    let _ = done.send(());
                }
                std::future::ready(Ok(()))
            })
        };
        let coordinator = DrainCoordinator::builder_shared(subject.store.clone())
            .registry(
                Registry::builder()
                    .event::<Stamp>()
                    .build()
                    .expect("a registry"),
            )
            .event_bus(bus)
            .config(DrainConfig {
                concurrency,
                prefetch,
                claims_in_flight: claims,
                ..DrainConfig::default()
            })
            .wake_on_insert(true)
            .start()
            .expect("a valid configuration");
        // Let the store's listener (PostgreSQL) connect and its first
        // wake-up pass run before the clock starts.
        coordinator.send(GetStatus).await.expect("the coordinator");
        tokio::time::sleep(Duration::from_millis(500)).await;
        let before = coordinator.send(GetStatus).await.expect("the coordinator");

        let producer_store = subject.producer;
        let producer = std::thread::spawn(move || produce(producer_store, rate, total));
        let finished = tokio::time::timeout(
            Duration::from_secs_f64(seconds) + Duration::from_secs(30),
            all_done.recv(),
        )
        .await;
        let enqueue_calls = producer.join().expect("the producer");
        if finished.is_err() {
            let delivered = latencies.lock().expect("latencies").len();
            eprintln!("only {delivered} of {total} messages were delivered; giving up");
            std::process::exit(1);
        }
        let after = coordinator.send(GetStatus).await.expect("the coordinator");
        // The last handler ran; its settlement may still be under way.
        coordinator
            .send(Shutdown {
                grace: Duration::from_secs(5),
            })
            .await
            .expect("the coordinator");
        // Per message: enqueue called → handler started; enqueue returned
        // (committed) → handler started; the enqueue call itself.
        let mut runs = [Vec::new(), Vec::new(), Vec::new()];
        for (n, sent_us, handled_us) in std::mem::take(&mut *latencies.lock().expect("latencies")) {
            if n < warmup {
                continue;
            }
            let (committed_us, call_us) = enqueue_calls[n as usize];
            runs[0].push(handled_us.saturating_sub(sent_us));
            runs[1].push(handled_us.saturating_sub(committed_us));
            runs[2].push(call_us);
        }
        (runs, after.passes - before.passes, subject.cleanup)
    });
    cleanup();

    let [mut latencies, mut after_commit, mut enqueue_calls] = runs;
    let messages = latencies.len();
    let [p50, p90, p99, max] = summary(&mut latencies);
    let [w50, w90, w99, wmax] = summary(&mut after_commit);
    let [c50, c90, c99, cmax] = summary(&mut enqueue_calls);
    println!(
        "{store_name}: {messages} messages at {rate}/s (after {warmup} warm-up), \
         {passes} passes (no schedule)"
    );
    println!(
        "  enqueue call (commit):  p50 {c50:.3} ms, p90 {c90:.3} ms, p99 {c99:.3} ms, max {cmax:.3} ms"
    );
    println!(
        "  commit -> handler:      p50 {w50:.3} ms, p90 {w90:.3} ms, p99 {w99:.3} ms, max {wmax:.3} ms"
    );
    println!(
        "  enqueue -> handler:     p50 {p50:.3} ms, p90 {p90:.3} ms, p99 {p99:.3} ms, max {max:.3} ms"
    );
    // `json!` sorts the keys, as every earlier line of this benchmark had them.
    print_json(&serde_json::json!({
        "store": store_name,
        "rate": rate,
        "messages": messages,
        "p50_ms": p50,
        "p90_ms": p90,
        "p99_ms": p99,
        "max_ms": max,
        "commit_to_handler_p50_ms": w50,
        "commit_to_handler_p99_ms": w99,
        "enqueue_call_p50_ms": c50,
        "enqueue_call_p99_ms": c99,
        "passes": passes,
    }));
}
