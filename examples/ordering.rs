//! Per-key ordering under concurrency and failures.
//!
//! Enqueues `--keys` ordering keys × `--per-key` messages (3 × 1 000 by
//! default), interleaved key by key, and drains them at `--concurrency` 16
//! through a handler that fails some first attempts (each failure is retried
//! and keeps its place at the head of its key). It then checks that every
//! key's messages were first delivered successfully in enqueue order, that no
//! two messages of one key were ever in a handler at once, and prints the
//! check and, last, one JSON line.
//!
//! ```text
//! cargo run --release --example ordering                               # SQLite, a temporary file
//! cargo run --release --example ordering -- --database sqlite://ordering.db
//! scripts/with-postgres sh -c 'cargo run --release --features postgres --example ordering -- \
//!     --database "$DATABASE_URL"'
//! ```
//!
//! On PostgreSQL it uses a table of its own, `outbox_ordering_example`,
//! emptied first.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::prelude::*;
use outbox::{
    Clock, EnqueueOptions, NewMessage, OutboxAdmin, OutboxStore, RetryPolicy, SystemClock,
};
use outbox_actors::prelude::*;
use serde::{Deserialize, Serialize};

/// One step of an aggregate's history; `seq` is its place in its key.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Step {
    key: String,
    seq: u32,
}

impl Event for Step {
    const NAME: &'static str = "ordering.step";
}

/// What the handler saw.
#[derive(Default)]
struct Seen {
    /// Per key, the `seq` of each first successful delivery, in order.
    delivered: BTreeMap<String, Vec<u32>>,
    /// Messages of each key in a handler right now.
    in_flight: HashMap<String, u32>,
    /// The most messages of one key ever in handlers at once.
    max_in_flight_per_key: u32,
    /// Attempts the handler failed on purpose.
    injected_failures: u64,
}

struct Steps(Arc<Mutex<Seen>>);

impl Actor for Steps {
    type Context = Context<Self>;
}

impl Handler<DeliverEvent<Step>> for Steps {
    type Result = ResponseFuture<DeliveryResult>;

    fn handle(&mut self, step: DeliverEvent<Step>, _: &mut Context<Self>) -> Self::Result {
        let seen = self.0.clone();
        let key = step.event.key.clone();
        let seq = step.event.seq;
        {
            let mut seen = seen.lock().unwrap();
            let running = seen.in_flight.entry(key.clone()).or_default();
            *running += 1;
            let running = *running;
            seen.max_in_flight_per_key = seen.max_in_flight_per_key.max(running);
        }
        // About one first attempt in seven fails, and one second attempt in
        // fifty: the step is retried and the later steps of its key wait.
        let mix = seq.wrapping_mul(2_654_435_761) ^ key.len() as u32;
        let fails = match step.context.attempt() {
            1 => mix % 7 == 3,
            2 => mix % 50 == 11,
            _ => false,
        };
        // Some work, so that handlers of different keys overlap.
        let work = Duration::from_micros(u64::from(mix % 500));
        Box::pin(async move {
            tokio::time::sleep(work).await;
            let mut seen = seen.lock().unwrap();
            *seen.in_flight.get_mut(&key).expect("counted on entry") -= 1;
            if fails {
                seen.injected_failures += 1;
                return Err(DeliveryError::msg("injected failure"));
            }
            let delivered = seen.delivered.entry(key).or_default();
            // At-least-once: a step delivered again after a lost lease is
            // not a first delivery.
            if !delivered.contains(&seq) {
                delivered.push(seq);
            }
            Ok(())
        })
    }
}

struct Args {
    database: Option<String>,
    keys: u32,
    per_key: u32,
    concurrency: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        database: None,
        keys: 3,
        per_key: 1_000,
        concurrency: 16,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |value: String, flag: &str| {
            value
                .parse::<u32>()
                .ok()
                .filter(|n| (1..=1_000_000).contains(n))
                .ok_or_else(|| format!("{flag} takes a number from 1 to 1000000 ({value:?} given)"))
        };
        match flag.as_str() {
            "--database" => args.database = Some(value()?),
            "--keys" => args.keys = number(value()?, "--keys")?,
            "--per-key" => args.per_key = number(value()?, "--per-key")?,
            "--concurrency" => args.concurrency = number(value()?, "--concurrency")? as usize,
            "--help" | "-h" => {
                return Err("usage: ordering [--database sqlite://PATH|postgres://URL] \
                            [--keys N] [--per-key N] [--concurrency N]"
                    .into());
            }
            other => return Err(format!("unknown argument {other:?}; see --help")),
        }
    }
    Ok(args)
}

#[actix::main]
async fn main() {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            std::process::exit(2);
        }
    };
    let url = args.database.clone().unwrap_or_else(|| {
        let path = std::env::temp_dir().join(format!("outbox-ordering-{}.db", std::process::id()));
        format!("sqlite://{}", path.display())
    });
    let result = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        postgres(&url, &args).await
    } else if url.starts_with("sqlite:") {
        match outbox::SqliteOutbox::connect(&url).await {
            Ok(store) => run("sqlite", store, &args).await,
            Err(error) => Err(error.into()),
        }
    } else {
        Err(format!("--database takes sqlite://PATH or postgres://URL, not {url:?}").into())
    };
    if args.database.is_none()
        && let Some(path) = url.strip_prefix("sqlite://")
    {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{path}{suffix}"));
        }
    }
    match result {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(error) => {
            eprintln!("ordering failed: {error}");
            std::process::exit(1);
        }
    }
}

#[cfg(feature = "postgres")]
async fn postgres(url: &str, args: &Args) -> Result<bool, Box<dyn std::error::Error>> {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .connect(url)
        .await?;
    let store = outbox::PostgresOutbox::builder(pool)
        .table("outbox_ordering_example")?
        .build();
    store.setup().await?;
    sqlx::query("DELETE FROM outbox_ordering_example")
        .execute(store.pool())
        .await?;
    run("postgres", store, args).await
}

#[cfg(not(feature = "postgres"))]
async fn postgres(_: &str, _: &Args) -> Result<bool, Box<dyn std::error::Error>> {
    Err("this build has no PostgreSQL store; add --features postgres".into())
}

/// Enqueue, drain, check; `Ok(true)` when every key kept its order.
async fn run<S: OutboxStore + OutboxAdmin + Clone>(
    store_name: &str,
    store: S,
    args: &Args,
) -> Result<bool, Box<dyn std::error::Error>> {
    let total = u64::from(args.keys) * u64::from(args.per_key);
    println!(
        "ordering: {} keys × {} messages on {store_name}, concurrency {}",
        args.keys, args.per_key, args.concurrency
    );
    // Interleaved, so every claim sees all keys; each key's steps in order.
    let enqueue_started = Instant::now();
    for seq in 0..args.per_key {
        for k in 0..args.keys {
            let key = format!("order-{k}");
            let step = Step {
                key: key.clone(),
                seq,
            };
            let message =
                NewMessage::event(&step)?.with_options(EnqueueOptions::new().ordering_key(key));
            store.enqueue(message).await?;
        }
    }
    println!(
        "enqueued {total} messages in {:.2} s",
        enqueue_started.elapsed().as_secs_f64()
    );

    let seen = Arc::new(Mutex::new(Seen::default()));
    let handler = Steps(seen.clone()).start();
    let config = DrainConfig {
        concurrency: args.concurrency,
        batch_size: args.concurrency * 4,
        every: Some(Duration::from_millis(20)),
        lease: Duration::from_secs(10),
        retry: RetryPolicy::fixed(Duration::from_millis(5)).with_max_attempts(10),
        ..DrainConfig::default()
    };
    let started = Instant::now();
    let coordinator = DrainCoordinator::builder(store.clone())
        .registry(Registry::builder().event::<Step>().build()?)
        .event_bus(RecipientBus::new().subscribe(handler.recipient()))
        .config(config)
        .start()?;
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let stats = store.stats(SystemClock.now()).await?;
        if stats.pending + stats.claimed == 0 {
            break;
        }
        if started.elapsed() > Duration::from_secs(600) {
            return Err("the outbox did not drain within ten minutes".into());
        }
    }
    let elapsed = started.elapsed();
    let status = coordinator.send(GetStatus).await?;
    coordinator
        .send(Shutdown {
            grace: Duration::from_secs(1),
        })
        .await?;
    let stats = store.stats(SystemClock.now()).await?;

    let seen = seen.lock().unwrap();
    let mut out_of_order = 0u64;
    let mut first_break = None;
    for (key, seqs) in &seen.delivered {
        for (place, &seq) in seqs.iter().enumerate() {
            if seq != place as u32 {
                out_of_order += 1;
                first_break.get_or_insert_with(|| format!("{key}: step {seq} at place {place}"));
            }
        }
    }
    let complete = seen.delivered.len() == args.keys as usize
        && seen
            .delivered
            .values()
            .all(|seqs| seqs.len() == args.per_key as usize);
    let ordered = out_of_order == 0 && complete && seen.max_in_flight_per_key <= 1;
    let totals = status.totals;
    println!(
        "drained in {:.2} s: {} delivered, {} retried ({} injected failures), {} dead-lettered",
        elapsed.as_secs_f64(),
        stats.delivered,
        totals.retried,
        seen.injected_failures,
        stats.dead_lettered
    );
    println!(
        "check: per key, first successful deliveries in enqueue order: {} \
         ({} keys, {} of {} messages checked, {out_of_order} out of place{}); \
         most messages of one key in handlers at once: {}",
        if ordered { "OK" } else { "FAILED" },
        seen.delivered.len(),
        seen.delivered.values().map(Vec::len).sum::<usize>(),
        total,
        first_break.map_or_else(String::new, |b| format!(", first: {b}")),
        seen.max_in_flight_per_key
    );
    println!(
        "{{\"example\":\"ordering\",\"store\":\"{store_name}\",\"keys\":{},\"per_key\":{},\
         \"concurrency\":{},\"delivered\":{},\"retried\":{},\"injected_failures\":{},\
         \"dead_lettered\":{},\"out_of_order\":{out_of_order},\"max_in_flight_per_key\":{},\
         \"ordered\":{ordered},\"elapsed_s\":{:.3},\"messages_per_sec\":{:.0}}}",
        args.keys,
        args.per_key,
        args.concurrency,
        stats.delivered,
        totals.retried,
        seen.injected_failures,
        stats.dead_lettered,
        seen.max_in_flight_per_key,
        elapsed.as_secs_f64(),
        stats.delivered as f64 / elapsed.as_secs_f64()
    );
    Ok(ordered)
}
