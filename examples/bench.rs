//! Throughput of the actor runtime against a baseline, in the same run.
//!
//! ```text
//! cargo run --release --example bench -- --store memory --messages 200000 --concurrency 64
//! cargo run --release --example bench -- --store sqlite --messages 100000 --concurrency 64
//! scripts/with-postgres cargo run --release --features postgres --example bench -- \
//!     --store postgres --messages 100000 --concurrency 64
//! ```
//!
//! The runtime delivers every message to a no-op handler: claim (as many as
//! there are free slots), decode, handle, settle (the settlement write is
//! also the final lease extension). What it is measured against depends on the store:
//!
//! - **memory**: a plain tokio loop that makes the same store calls with the
//!   same concurrency, without actors, heartbeats, timers or outcome
//!   messages.
//! - **sqlite**, **postgres**: raw SQL, the best a drain could do with
//!   statements like the store's own, written out here: a loop that claims
//!   100 rows with one statement and marks them delivered in one fenced
//!   write. No renewal, no handler, one statement in flight at a time.
//!
//! Each side gets a store of its own, filled before timing starts: a fresh
//! database file (SQLite) or a fresh table in `DATABASE_URL` (PostgreSQL,
//! dropped afterwards). Both sides run against the same database server with
//! the same settings. On PostgreSQL the run also counts transactions: the
//! growth of `pg_stat_database.xact_commit` over each timed drain, divided
//! by the messages (the connections are closed before the count is read,
//! since a backend publishes its counts when it goes idle or exits), and the
//! write-ahead log written over the same span, per message
//! (`wal_bytes_per_message`): what a change to the store's rows or indexes
//! moves, steadier than the rate.
//!
//! By default the runtime side sends `Drain` in a loop, one pass answering
//! each (`--batch` messages a pass, all of them unless given). With
//! `--schedule EVERY` (`500ms`, `5s`, ...) it sends no `Drain` at all: the
//! coordinator runs on that schedule (`every`, `--batch` 100 unless given),
//! and the run is timed from its start until every message is delivered.
//! A schedule's first pass starts at once and each pass that spent its
//! batch on full claims starts the next, so this measures how fast a
//! backlog drains on a schedule, to put beside the `Drain` loop with the
//! same `--batch`.
//!
//! Memory is measured as peak resident set size (`VmHWM` in
//! `/proc/self/status`, Linux only): the process's peak, and each side's own,
//! its peak reset before the side fills its store (writing `5` to
//! `/proc/self/clear_refs`), so a side's figure covers its fill and its
//! drain. Where the peak cannot be reset, only the process's peak is given.
//!
//! CPU is measured as the time every thread of the process spent on a CPU
//! while a side drained (`/proc/self/task/*/schedstat`, Linux only), per
//! message: `runtime_cpu_us_per_message`, `baseline_cpu_us_per_message`.
//! It takes in the store's own threads (SQLite's worker) but not a database
//! server's, and on a shared machine it moves less from run to run than
//! the rate does. The machine's CPU time over the same span (`/proc/stat`,
//! every CPU) is beside it, per message: `runtime_machine_cpu_us_per_message`,
//! `baseline_machine_cpu_us_per_message`. With PostgreSQL on the same
//! machine that includes the server's work, which is what a change to the
//! store's SQL moves; it also counts whatever else runs meanwhile.
//!
//! With `--sweep 1,4,16,64,256` the bench measures every (store,
//! concurrency) pair in turn, runtime and baseline each, for each store of
//! `--store` (a comma-separated list there: `memory,sqlite,postgres`). It
//! prints each point's line and JSON object as a single run does, then one
//! JSON object with every point; `--plot FILE.png` also draws them (see
//! `bench_plot.rs`):
//!
//! ```text
//! WITH_POSTGRES_DURABLE=1 scripts/with-postgres cargo run --release --features postgres \
//!     --example bench -- --store memory,sqlite,postgres --messages 20000 \
//!     --sweep 1,4,16,64,256 --plot docs/throughput.png
//! ```
//!
//! `--prefetch N` and `--claims N` set the runtime's `prefetch` and
//! `claims_in_flight`; `--pool N` sizes each side's PostgreSQL pool (sqlx's
//! default, 10, unless given), to match a peer run's `--pool`.
//! `--delete-on-delivery` sets the runtime's `retention.delete_on_delivery`:
//! each message is deleted by the write that settles it, as job queues
//! that keep no finished jobs do; the baseline still marks rows delivered.
//!
//! The last line printed is one JSON object.

mod bench_plot;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use outbox::{
    ClaimBatch, Clock, DeliveryContext, DrainConfig, Event, InProcessBus, MarkDelivered,
    MemoryOutbox, MessageKind, NewMessage, OutboxAdmin, OutboxStore, Registry, SharedStore,
    SystemClock,
};
use outbox_actors::{Drain, DrainCoordinator, GetStatus, Shutdown};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct Tick {
    n: u64,
}

impl Event for Tick {
    const NAME: &'static str = "bench.tick";
}

/// Rows per claim of the raw-SQL baseline.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
const BASELINE_CLAIM: usize = 100;

/// Messages per transaction while filling a SQL store.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
const FILL_CHUNK: u64 = 10_000;

struct Args {
    /// One store, or with `--sweep` a list of them.
    stores: Vec<String>,
    messages: u64,
    concurrency: usize,
    batch: Option<usize>,
    /// Run one side only (for profiling): `runtime` or `baseline`.
    only: Option<String>,
    /// Delivery arbiters for the runtime (0: the coordinator's thread).
    arbiters: usize,
    /// `prefetch` of the runtime's drain.
    prefetch: usize,
    /// `claims_in_flight` of the runtime's drain.
    claims: usize,
    /// Drain on this schedule instead of sending `Drain` in a loop.
    schedule: Option<Duration>,
    /// Measure each of these concurrencies in turn.
    sweep: Option<Vec<usize>>,
    /// Draw the sweep into this PNG.
    plot: Option<std::path::PathBuf>,
    /// PostgreSQL connections of each side's pool (sqlx's default unless given).
    pool: Option<u32>,
    /// The runtime deletes each message as it settles it.
    delete_on_delivery: bool,
}

/// The stores this build can measure.
const STORES: &[&str] = &[
    "memory",
    #[cfg(feature = "sqlite")]
    "sqlite",
    #[cfg(feature = "postgres")]
    "postgres",
];

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        stores: vec!["memory".into()],
        messages: 200_000,
        concurrency: 64,
        batch: None,
        only: None,
        arbiters: 0,
        prefetch: 0,
        claims: DrainConfig::default().claims_in_flight,
        schedule: None,
        sweep: None,
        plot: None,
        pool: None,
        delete_on_delivery: false,
    };
    let mut concurrency_given = false;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--store" => {
                args.stores = value()?
                    .split(',')
                    .map(|store| store.trim().to_owned())
                    .collect()
            }
            "--sweep" => {
                args.sweep = Some(
                    value()?
                        .split(',')
                        .map(|n| {
                            n.trim().parse::<usize>().map_err(|e| {
                                format!("--sweep takes concurrencies such as 1,4,16: {n:?}: {e}")
                            })
                        })
                        .collect::<Result<_, _>>()?,
                )
            }
            "--plot" => args.plot = Some(value()?.into()),
            "--messages" => {
                args.messages = value()?.parse().map_err(|e| format!("--messages: {e}"))?
            }
            "--concurrency" => {
                concurrency_given = true;
                args.concurrency = value()?
                    .parse()
                    .map_err(|e| format!("--concurrency: {e}"))?
            }
            "--batch" => args.batch = Some(value()?.parse().map_err(|e| format!("--batch: {e}"))?),
            "--only" => args.only = Some(value()?),
            "--arbiters" => {
                args.arbiters = value()?.parse().map_err(|e| format!("--arbiters: {e}"))?
            }
            "--prefetch" => {
                args.prefetch = value()?.parse().map_err(|e| format!("--prefetch: {e}"))?
            }
            "--claims" => args.claims = value()?.parse().map_err(|e| format!("--claims: {e}"))?,
            "--pool" => {
                let pool: u32 = value()?.parse().map_err(|e| format!("--pool: {e}"))?;
                if pool == 0 {
                    return Err("--pool: a pool needs at least 1 connection".into());
                }
                args.pool = Some(pool);
            }
            "--schedule" => args.schedule = Some(parse_every(&value()?)?),
            "--delete-on-delivery" => args.delete_on_delivery = true,
            "--help" | "-h" => {
                return Err(format!(
                    "usage: bench [--store {}] [--messages N] [--concurrency N] [--batch N] \
                     [--only runtime|baseline] [--arbiters N] [--prefetch N] [--claims N] [--schedule EVERY] [--pool N] [--delete-on-delivery]\n       \
                     bench --store STORE,STORE... --sweep N,N,... [--plot FILE.png] \
                     [--messages N] [--batch N] [--arbiters N] [--prefetch N] [--claims N] [--schedule EVERY] [--pool N] [--delete-on-delivery]",
                    STORES.join("|")
                ));
            }
            other => return Err(format!("unknown argument {other:?}; see --help")),
        }
    }
    for store in &args.stores {
        if !STORES.contains(&store.as_str()) {
            return Err(format!(
                "unknown store {store:?}; this build knows: {} (the SQL stores need their \
                 cargo features: --features sqlite, --features postgres)",
                STORES.join(", ")
            ));
        }
    }
    match &args.sweep {
        None if args.stores.len() > 1 => {
            return Err("--store takes a list of stores only with --sweep".into());
        }
        None if args.plot.is_some() => {
            return Err(
                "--plot draws a sweep: give --sweep too (e.g. --sweep 1,4,16,64,256)".into(),
            );
        }
        Some(_) if concurrency_given => {
            return Err("--sweep gives the concurrencies: drop --concurrency".into());
        }
        Some(_) if args.only.is_some() => {
            return Err("--sweep measures both sides of every point: drop --only".into());
        }
        Some(sweep) if sweep.is_empty() || sweep.contains(&0) => {
            return Err("--sweep takes concurrencies of at least 1".into());
        }
        _ => {}
    }
    if let Some(plot) = &args.plot
        && plot.extension().and_then(|e| e.to_str()) != Some("png")
    {
        return Err(format!(
            "--plot writes a PNG: name it *.png, not {}",
            plot.display()
        ));
    }
    if args
        .only
        .as_deref()
        .is_some_and(|only| only != "runtime" && only != "baseline")
    {
        return Err("--only takes runtime or baseline".into());
    }
    if args.messages == 0 || args.concurrency == 0 {
        return Err("--messages and --concurrency must be at least 1".into());
    }
    // The drain refuses these at start; say so before filling any store.
    let drain = DrainConfig {
        prefetch: args.prefetch,
        claims_in_flight: args.claims,
        ..DrainConfig::default()
    };
    drain
        .validate()
        .map_err(|error| format!("--prefetch or --claims: {error}"))?;
    Ok(args)
}

/// A duration as `DrainConfig` reads `every` (`"500ms"`, `"2s"`).
fn parse_every(value: &str) -> Result<Duration, String> {
    let config: DrainConfig = serde_json::from_value(serde_json::json!({ "every": value }))
        .map_err(|e| format!("--schedule: {e}"))?;
    config
        .every
        .ok_or_else(|| "--schedule needs a duration".to_owned())
}

fn tick(n: u64) -> NewMessage {
    NewMessage::event(&Tick { n }).expect("a tick serializes")
}

async fn fill(store: &MemoryOutbox, messages: u64) {
    let now = SystemClock.now();
    for n in 0..messages {
        store
            .enqueue(tick(n).at(now))
            .await
            .expect("enqueue into memory");
    }
}

fn registry() -> Registry {
    Registry::builder()
        .event::<Tick>()
        .build()
        .expect("one event registers")
}

fn bus() -> InProcessBus {
    InProcessBus::new().on(|_: Arc<Tick>, _: DeliveryContext| async { Ok(()) })
}

/// The same store calls as the runtime, from one task with `concurrency`
/// deliveries in flight.
async fn baseline(store: SharedStore, messages: u64, concurrency: usize) -> Duration {
    let registry = registry();
    let bus = bus();
    let lease = DrainConfig::default().lease;
    let started = Instant::now();
    let mut in_flight = FuturesUnordered::new();
    let mut delivered = 0;
    let mut exhausted = false;
    while delivered < messages {
        if !exhausted && in_flight.len() < concurrency {
            let batch = store
                .claim_batch(ClaimBatch {
                    on_dead_letter: Default::default(),
                    limit: concurrency - in_flight.len(),
                    now: SystemClock.now(),
                    lease,
                    max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
                })
                .await
                .expect("claim");
            exhausted = batch.claimed.is_empty();
            for message in batch.claimed {
                let store = store.clone();
                let message = Arc::new(message);
                let payload = registry
                    .decode(MessageKind::Event, &message.name, &message.payload)
                    .expect("decode");
                let publish = outbox::EventBus::publish(
                    &bus,
                    outbox::Delivery {
                        payload,
                        context: DeliveryContext::new(message.clone(), None),
                    },
                );
                in_flight.push(async move {
                    publish.await.expect("no-op handler");
                    store
                        .mark_delivered(MarkDelivered {
                            delete: false,
                            id: message.id.clone(),
                            claim_token: message.claim_token.clone(),
                            now: SystemClock.now(),
                        })
                        .await
                        .expect("deliver");
                });
            }
        }
        if in_flight.next().await.is_some() {
            delivered += 1;
        }
    }
    started.elapsed()
}

/// The runtime's settings for a bench run.
#[derive(Debug, Clone, Copy)]
struct RuntimeSettings {
    messages: u64,
    concurrency: usize,
    batch_size: usize,
    arbiters: usize,
    /// Messages claimed ahead of free slots.
    prefetch: usize,
    /// Claims in flight at once.
    claims: usize,
    /// `Some`: no `Drain` loop, the coordinator drains on this schedule.
    schedule: Option<Duration>,
    /// PostgreSQL pool size; `None` for sqlx's default.
    pool: Option<u32>,
    /// `retention.delete_on_delivery` of the runtime's drain.
    delete_on_delivery: bool,
}

/// Drain every message with the actor runtime; returns the time taken.
/// Must run inside an actix system.
async fn drain_with_runtime(
    store: impl OutboxStore + OutboxAdmin + Clone,
    settings: RuntimeSettings,
) -> Duration {
    let coordinator = DrainCoordinator::builder(store.clone())
        .registry(registry())
        .event_bus(bus())
        .config(DrainConfig {
            batch_size: settings.batch_size,
            concurrency: settings.concurrency,
            delivery_arbiters: settings.arbiters,
            prefetch: settings.prefetch,
            claims_in_flight: settings.claims,
            every: settings.schedule,
            retention: outbox::RetentionConfig {
                delete_on_delivery: settings.delete_on_delivery,
                ..Default::default()
            },
            ..DrainConfig::default()
        })
        .wake_on_insert(false)
        .start()
        .expect("a valid configuration");
    let started = Instant::now();
    if settings.schedule.is_some() {
        return drain_on_schedule(coordinator, store, started, settings).await;
    }
    loop {
        let report = coordinator
            .send(Drain)
            .await
            .expect("coordinator")
            .expect("pass");
        assert_eq!(
            report.delivered, report.claimed,
            "every message delivered: {report}"
        );
        // A pass that spent its batch starts the next by itself, so a Drain
        // answers for the pass it joined, not for every pass since the last
        // one: count from the totals.
        let totals = coordinator
            .send(GetStatus)
            .await
            .expect("coordinator")
            .totals;
        if totals.delivered >= settings.messages {
            break started.elapsed();
        }
        assert!(
            report.claimed > 0,
            "the store ran dry after {}",
            totals.delivered
        );
    }
}

/// Wait, sending no `Drain`, until the coordinator on its schedule has
/// delivered `messages`; returns the time since `started`. The wait polls
/// the coordinator's totals every 5 ms (a status answer is a field read;
/// at most 5 ms late, and rare enough not to compete with the drain for the
/// coordinator's thread), then, untimed, checks the store holds nothing more to deliver and
/// stops the coordinator so no tick touches the store afterwards.
async fn drain_on_schedule(
    coordinator: actix::Addr<DrainCoordinator>,
    store: impl OutboxAdmin,
    started: Instant,
    settings: RuntimeSettings,
) -> Duration {
    let messages = settings.messages;
    let elapsed = loop {
        let status = coordinator.send(GetStatus).await.expect("coordinator");
        if status.totals.delivered >= messages {
            break started.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let status = coordinator.send(GetStatus).await.expect("coordinator");
    assert_eq!(
        (status.totals.claimed, status.totals.delivered),
        (messages, messages),
        "every message delivered once: {:?}",
        status.totals
    );
    let stats = store.stats(SystemClock.now()).await.expect("stats");
    let kept = if settings.delete_on_delivery {
        0
    } else {
        messages
    };
    assert_eq!(
        (stats.pending, stats.claimed, stats.delivered),
        (0, 0, kept),
        "the store is empty"
    );
    coordinator
        .send(Shutdown {
            grace: Duration::ZERO,
        })
        .await
        .expect("coordinator");
    elapsed
}

/// What one side of a run measured.
#[derive(Debug, Clone, Copy)]
struct Side {
    elapsed: Duration,
    /// CPU time of the whole process (every thread, the store's included)
    /// while the side drained.
    cpu: Option<Duration>,
    /// CPU time of the whole machine while the side drained: the process,
    /// a database server on the same machine, and anything else running.
    machine_cpu: Option<Duration>,
    /// Committed transactions per message (PostgreSQL only).
    commits_per_message: Option<f64>,
    /// Write-ahead log written per message, bytes (PostgreSQL only).
    wal_bytes_per_message: Option<f64>,
    /// Peak RSS while this side filled and drained its store, in MiB.
    peak_rss_mib: Option<f64>,
}

impl Side {
    fn timed(timed: Timed) -> Self {
        Side {
            elapsed: timed.elapsed,
            cpu: timed.cpu,
            machine_cpu: timed.machine_cpu,
            commits_per_message: None,
            wal_bytes_per_message: None,
            peak_rss_mib: None,
        }
    }
}

/// A drain's time and the CPU time spent while it ran.
struct Timed {
    elapsed: Duration,
    cpu: Option<Duration>,
    machine_cpu: Option<Duration>,
}

/// Runs a drain that times itself; returns its time and the CPU time the
/// process and the machine spent while it ran.
async fn with_cpu(drain: impl Future<Output = Duration>) -> Timed {
    let before = (process_cpu(), machine_cpu());
    let elapsed = drain.await;
    let cpu = process_cpu()
        .zip(before.0)
        .map(|(after, before)| after.saturating_sub(before));
    let machine_cpu = machine_cpu().zip(before.1).and_then(|(after, before)| {
        let total = after.total.checked_sub(before.total).filter(|&t| t > 0)?;
        let busy = after.busy.saturating_sub(before.busy);
        // The counters tick in units of the kernel's clock; their share of
        // the whole, times the time every CPU had, is the busy time.
        Some(elapsed.mul_f64(busy as f64 / total as f64 * after.cpus as f64))
    });
    Timed {
        elapsed,
        cpu,
        machine_cpu,
    }
}

/// The time every live thread of this process has spent on a CPU
/// (`/proc/self/task/*/schedstat`, Linux only), in nanoseconds' precision.
/// A thread that exits takes its share along, so measure across spans in
/// which the threads that work (the store's included) stay up.
fn process_cpu() -> Option<Duration> {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let Ok(stat) = std::fs::read_to_string(task.ok()?.path().join("schedstat")) else {
            continue;
        };
        total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(Duration::from_nanos(total))
}

/// The machine's CPU counters from `/proc/stat` (Linux only), summed over
/// its CPUs.
struct MachineCpu {
    /// Time spent running anything: user, nice, system, irq and softirq.
    busy: u64,
    /// That, plus idle, I/O wait and time stolen by the hypervisor.
    total: u64,
    cpus: usize,
}

fn machine_cpu() -> Option<MachineCpu> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let mut lines = stat.lines();
    let fields: Vec<u64> = lines
        .next()?
        .strip_prefix("cpu ")?
        .split_whitespace()
        .map(|field| field.parse().ok())
        .collect::<Option<_>>()?;
    let field = |i: usize| fields.get(i).copied().unwrap_or(0);
    // user, nice, system, idle, iowait, irq, softirq, steal; guest time is
    // already counted in user.
    let busy = field(0) + field(1) + field(2) + field(5) + field(6);
    let total = busy + field(3) + field(4) + field(7);
    let cpus = lines
        .filter(|line| {
            line.starts_with("cpu") && line.as_bytes().get(3).is_some_and(u8::is_ascii_digit)
        })
        .count();
    Some(MachineCpu { busy, total, cpus })
}

/// The process's peak resident set size so far (`VmHWM`), in MiB; `None`
/// where `/proc/self/status` has no such line (not Linux).
fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    Some(kib / 1024.0)
}

/// Resets the peak to the current RSS (Linux 4.0 and later), so that what
/// one side allocated does not count against the next; `false` if it could
/// not.
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Runs one side if `run` is set, with the peak reset first, and records
/// the side's peak.
fn measured_if(run: bool, side: impl FnOnce() -> Side) -> Option<Side> {
    run.then(|| {
        let fresh = reset_peak_rss();
        let mut side = side();
        side.peak_rss_mib = if fresh { peak_rss_mib() } else { None };
        side
    })
}

fn memory_sides(
    messages: u64,
    concurrency: usize,
    settings: RuntimeSettings,
    (run_baseline, run_runtime): (bool, bool),
) -> (Option<Side>, Option<Side>) {
    let baseline_side = measured_if(run_baseline, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let store = MemoryOutbox::new();
            fill(&store, messages).await;
            Side::timed(with_cpu(baseline(Arc::new(store), messages, concurrency)).await)
        })
    });
    let runtime_side = measured_if(run_runtime, || {
        actix::System::new().block_on(async move {
            let store = MemoryOutbox::new();
            fill(&store, messages).await;
            Side::timed(with_cpu(drain_with_runtime(store, settings)).await)
        })
    });
    (baseline_side, runtime_side)
}

#[cfg(feature = "sqlite")]
mod sqlite {
    //! The SQLite side: a fresh database file per side.

    use std::path::{Path, PathBuf};

    use outbox::SqliteOutbox;
    use sqlx::{AssertSqlSafe, Row};

    use super::*;

    /// A database file in the temporary directory, removed on drop with its
    /// WAL and shared-memory files.
    pub(super) struct TempDatabase {
        path: PathBuf,
    }

    impl TempDatabase {
        pub(super) fn new(side: &str) -> Self {
            let path = std::env::temp_dir().join(format!(
                "outbox-bench-{}-{side}-{}.db",
                std::process::id(),
                uuid_suffix()
            ));
            TempDatabase { path }
        }

        pub(super) fn url(&self) -> String {
            format!("sqlite://{}", self.path.display())
        }
    }

    impl Drop for TempDatabase {
        fn drop(&mut self) {
            for suffix in ["", "-wal", "-shm"] {
                let mut name = self.path.clone().into_os_string();
                name.push(suffix);
                let _ = std::fs::remove_file(Path::new(&name));
            }
        }
    }

    fn uuid_suffix() -> String {
        outbox::kit::new_claim_token()[..8].to_owned()
    }

    /// A store on a fresh file, holding `messages` pending ticks.
    pub(super) async fn filled(database: &TempDatabase, messages: u64) -> SqliteOutbox {
        let store = SqliteOutbox::connect(&database.url())
            .await
            .expect("open the bench database");
        let now = SystemClock.now();
        let mut n = 0;
        while n < messages {
            let mut tx = store.pool().begin().await.expect("begin");
            for _ in 0..FILL_CHUNK.min(messages - n) {
                store
                    .enqueue_in(&mut tx, tick(n).at(now))
                    .await
                    .expect("enqueue");
                n += 1;
            }
            tx.commit().await.expect("commit");
        }
        store
    }

    /// The store's claim, as it runs it for messages without ordering keys
    /// (the bench enqueues none): pending rows from the index of keyless
    /// ones, the limit an expression so SQLite does not compile the
    /// statement again each time it is bound. Binds: `?1` now and `?2`
    /// lease end (µs since the epoch), `?3` limit.
    fn claim_sql(t: &str) -> String {
        format!(
            "UPDATE {t} SET \
               status = CASE WHEN attempts >= max_attempts THEN 'dead_lettered' ELSE 'claimed' END, \
               attempts = CASE WHEN attempts >= max_attempts THEN attempts ELSE attempts + 1 END, \
               claim_token = CASE WHEN attempts >= max_attempts THEN NULL ELSE lower(hex(randomblob(16))) END, \
               claimed_at = CASE WHEN attempts >= max_attempts THEN NULL ELSE ?1 END, \
               locked_until = CASE WHEN attempts >= max_attempts THEN NULL ELSE ?2 END, \
               updated_at = ?1 \
             WHERE seq IN ( \
               SELECT seq FROM ( \
                 SELECT * FROM ( \
                   SELECT seq, available_at, created_at FROM {t} \
                   WHERE status = 'pending' AND ordering_key IS NULL AND available_at <= ?1 \
                   ORDER BY available_at, created_at, seq LIMIT CAST(?3 AS INTEGER)) \
                 UNION ALL \
                 SELECT * FROM ( \
                   SELECT seq, available_at, created_at FROM {t} \
                   WHERE status = 'claimed' AND locked_until <= ?1 \
                   ORDER BY available_at, created_at, seq LIMIT CAST(?3 AS INTEGER))) \
               ORDER BY available_at, created_at, seq LIMIT CAST(?3 AS INTEGER)) \
             RETURNING seq, id, kind, name, payload, trace, status, attempts, max_attempts, \
               available_at, claim_token, claimed_at, locked_until, last_error, created_at, \
               updated_at, delivered_at"
        )
    }

    /// The store's fenced write that marks a batch delivered. Binds: `?1` a
    /// JSON array of `[id, token, now]` rows (`now` in µs); returns the ids
    /// it changed.
    fn deliver_sql(t: &str) -> String {
        format!(
            "UPDATE {t} AS m SET status = 'delivered', claim_token = NULL, claimed_at = NULL, \
               locked_until = NULL, delivered_at = v.now, updated_at = v.now \
             FROM (SELECT value ->> 0 AS id, value ->> 1 AS token, value ->> 2 AS now \
               FROM json_each(?1)) AS v \
             WHERE m.id = v.id AND +m.status = 'claimed' AND m.claim_token = v.token \
               AND +m.locked_until > v.now \
             RETURNING id"
        )
    }

    /// Raw SQL: claim 100 with the claim statement, mark them all
    /// delivered in one fenced write, until every message is delivered.
    pub(super) async fn raw_sql(store: &SqliteOutbox, messages: u64) -> Duration {
        let lease = DrainConfig::default().lease;
        let pool = store.pool();
        let table = store.table().quoted();
        let claim: Arc<str> = claim_sql(&table).into();
        let settle: Arc<str> = deliver_sql(&table).into();
        let started = Instant::now();
        let mut delivered = 0;
        while delivered < messages {
            let now = SystemClock.now();
            let until = now + lease;
            // The store claims in a `BEGIN IMMEDIATE` transaction; one
            // statement in autocommit takes the same write lock up front.
            let claimed: Vec<(String, Option<String>)> = sqlx::query(AssertSqlSafe(claim.clone()))
                .bind(now.timestamp_micros())
                .bind(until.timestamp_micros())
                .bind(BASELINE_CLAIM as i64)
                .fetch_all(pool)
                .await
                .expect("claim")
                .iter()
                .map(|row| (row.get("id"), row.get("claim_token")))
                .collect();
            assert!(!claimed.is_empty(), "the store ran dry after {delivered}");
            let now = SystemClock.now().timestamp_micros();
            let rows: Vec<_> = claimed
                .iter()
                .map(|(id, token)| {
                    let token = token.as_deref().expect("a claimed row has a token");
                    serde_json::json!([id, token, now])
                })
                .collect();
            let settled: Vec<String> = sqlx::query_scalar(AssertSqlSafe(settle.clone()))
                .bind(serde_json::Value::Array(rows).to_string())
                .fetch_all(pool)
                .await
                .expect("settle");
            assert_eq!(settled.len(), claimed.len(), "every claim settles");
            delivered += settled.len() as u64;
        }
        started.elapsed()
    }
}

#[cfg(feature = "sqlite")]
fn sqlite_sides(
    messages: u64,
    settings: RuntimeSettings,
    (run_baseline, run_runtime): (bool, bool),
) -> (Option<Side>, Option<Side>) {
    let baseline_side = measured_if(run_baseline, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let database = sqlite::TempDatabase::new("baseline");
            let store = sqlite::filled(&database, messages).await;
            let measured = with_cpu(sqlite::raw_sql(&store, messages)).await;
            store.pool().close().await;
            Side::timed(measured)
        })
    });
    let runtime_side = measured_if(run_runtime, || {
        actix::System::new().block_on(async move {
            let database = sqlite::TempDatabase::new("runtime");
            let store = sqlite::filled(&database, messages).await;
            let pool = store.pool().clone();
            let measured = with_cpu(drain_with_runtime(store, settings)).await;
            pool.close().await;
            Side::timed(measured)
        })
    });
    (baseline_side, runtime_side)
}

#[cfg(feature = "postgres")]
mod postgres {
    //! The PostgreSQL side: a fresh table per side in `DATABASE_URL`.

    use chrono::{DateTime, Utc};
    use outbox::PostgresOutbox;
    use sqlx::postgres::{PgConnection, PgPool, PgPoolOptions};
    use sqlx::{AssertSqlSafe, Connection, Row};

    use super::*;

    pub(super) fn url() -> String {
        std::env::var("DATABASE_URL").unwrap_or_else(|_| {
            eprintln!(
                "--store postgres needs DATABASE_URL; run it under scripts/with-postgres \
                 for a throwaway cluster"
            );
            std::process::exit(2)
        })
    }

    /// The server's durability settings, as the plot's note states them:
    /// `fsync=on, synchronous_commit=on`.
    pub(super) fn durability() -> String {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let mut conn = PgConnection::connect(&url()).await.expect("connect");
            let mut shown = Vec::new();
            for setting in ["fsync", "synchronous_commit"] {
                let value: String = sqlx::query_scalar(AssertSqlSafe(format!("SHOW {setting}")))
                    .fetch_one(&mut conn)
                    .await
                    .expect("read a server setting");
                shown.push(format!("{setting}={value}"));
            }
            conn.close().await.ok();
            shown.join(", ")
        })
    }

    /// The store on a fresh pool of `size` connections (sqlx's default, as a
    /// user gets it, unless given), which connects when first used.
    fn store(table: &str, size: Option<u32>) -> PostgresOutbox {
        let mut options = PgPoolOptions::new();
        if let Some(size) = size {
            options = options.max_connections(size);
        }
        let pool = options
            .connect_lazy(&url())
            .expect("DATABASE_URL is a PostgreSQL URL");
        PostgresOutbox::builder(pool)
            .table(table)
            .expect("a valid table name")
            // Nobody listens during the bench: no NOTIFY per insert.
            .notify(false)
            .build()
    }

    /// A fresh table `bench_<pid>_<side>` holding `messages` pending ticks,
    /// filled on a pool that is closed again, and a store on a new pool for
    /// the drain.
    pub(super) async fn filled(side: &str, messages: u64, pool: Option<u32>) -> PostgresOutbox {
        let table = format!("bench_{}_{side}", std::process::id());
        let fill = store(&table, None);
        drop_table(&fill).await;
        fill.setup().await.expect("create the bench table");
        let now = SystemClock.now();
        let mut n = 0;
        while n < messages {
            let mut tx = fill.pool().begin().await.expect("begin");
            for _ in 0..FILL_CHUNK.min(messages - n) {
                fill.enqueue_in(&mut tx, tick(n).at(now))
                    .await
                    .expect("enqueue");
                n += 1;
            }
            tx.commit().await.expect("commit");
        }
        sqlx::query(AssertSqlSafe(format!("ANALYZE \"{table}\"")))
            .execute(fill.pool())
            .await
            .expect("analyze");
        fill.pool().close().await;
        store(&table, pool)
    }

    pub(super) async fn drop_table(store: &PostgresOutbox) {
        let table = store.table().to_string();
        let mut conn = PgConnection::connect(&url()).await.expect("connect");
        sqlx::raw_sql(AssertSqlSafe(format!(
            "DROP TABLE IF EXISTS \"{table}\", \"{table}_migrations\", \"{table}_drains\"; \
             DROP FUNCTION IF EXISTS \"{table}_wake\", \"{table}_claim_heads\", \"{table}_claim\", \"{table}_settle\""
        )))
        .execute(&mut conn)
        .await
        .expect("drop the bench table");
        conn.close().await.ok();
    }

    /// Counts the transactions committed in the bench database and the log
    /// the server wrote, from a connection of its own.
    pub(super) struct Counters {
        conn: PgConnection,
    }

    impl Counters {
        pub(super) async fn connect() -> Self {
            Counters {
                conn: PgConnection::connect(&url()).await.expect("connect"),
            }
        }

        /// Transactions committed so far by every other backend, once those
        /// backends are gone, and the write-ahead log's position. A backend
        /// publishes its counts when it goes idle (at most once a second) or
        /// exits, so this waits until no other client is connected: close
        /// the pools first.
        pub(super) async fn settled(&mut self) -> Counts {
            loop {
                let others: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM pg_stat_activity \
                     WHERE datname = current_database() AND pid <> pg_backend_pid() \
                       AND backend_type = 'client backend'",
                )
                .fetch_one(&mut self.conn)
                .await
                .expect("read pg_stat_activity");
                if others == 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            // A backend leaves pg_stat_activity in the same exit step that
            // publishes its counts; give that step time to finish.
            tokio::time::sleep(Duration::from_millis(100)).await;
            let (commits, wal) = sqlx::query_as(
                "SELECT xact_commit, pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint \
                 FROM pg_stat_database WHERE datname = current_database()",
            )
            .fetch_one(&mut self.conn)
            .await
            .expect("read pg_stat_database");
            Counts { commits, wal }
        }

        /// Close `pool` and count, per message, the commits made and the
        /// log written since `before`. The commits include this
        /// connection's own reads (one per 50 ms while waiting), a rounding
        /// error at these message counts; the log is the whole server's,
        /// autovacuum's included.
        pub(super) async fn per_message(
            &mut self,
            pool: &PgPool,
            before: Counts,
            messages: u64,
        ) -> Counts<f64> {
            pool.close().await;
            let after = self.settled().await;
            Counts {
                commits: (after.commits - before.commits) as f64 / messages as f64,
                wal: (after.wal - before.wal) as f64 / messages as f64,
            }
        }
    }

    /// Committed transactions and write-ahead log bytes.
    #[derive(Debug, Clone, Copy)]
    pub(super) struct Counts<T = i64> {
        pub(super) commits: T,
        pub(super) wal: T,
    }

    /// The store's claim of up to `limit` messages, as it runs it. Binds:
    /// `$1` now, `$2` lease end. Rows out of attempts come back with
    /// `abandoned = true`, untouched.
    fn claim_sql(t: &str, limit: usize) -> String {
        let columns = |prefix: &str| {
            [
                "seq",
                "id",
                "kind",
                "name",
                "payload::text AS payload",
                "trace",
                "status",
                "attempts",
                "max_attempts",
                "available_at",
                "claim_token",
                "claimed_at",
                "locked_until",
                "last_error",
                "created_at",
                "updated_at",
                "delivered_at",
            ]
            .map(|c| format!("{prefix}{c}"))
            .join(", ")
        };
        let m_all = columns("m.");
        format!(
            "WITH pending AS ( \
               SELECT id, available_at, created_at, seq, attempts >= max_attempts AS abandoned \
               FROM {t} WHERE status = 'pending' AND available_at <= $1 \
               ORDER BY available_at, created_at, seq LIMIT {limit} FOR UPDATE SKIP LOCKED), \
             expired AS ( \
               SELECT id, available_at, created_at, seq, attempts >= max_attempts AS abandoned \
               FROM {t} WHERE status = 'claimed' AND locked_until <= $1 \
               ORDER BY available_at, created_at, seq LIMIT {limit} FOR UPDATE SKIP LOCKED), \
             picked AS ( \
               SELECT * FROM pending UNION ALL SELECT * FROM expired \
               ORDER BY available_at, created_at, seq LIMIT {limit}), \
             claimed AS ( \
               UPDATE {t} AS m SET status = 'claimed', attempts = m.attempts + 1, \
                 claim_token = gen_random_uuid()::text, claimed_at = $1, locked_until = $2, \
                 updated_at = $1 \
               FROM picked WHERE m.id = picked.id AND NOT picked.abandoned \
               RETURNING {m_all}) \
             SELECT false AS abandoned, * FROM claimed \
             UNION ALL \
             SELECT true, {m_all} FROM {t} AS m JOIN picked ON m.id = picked.id \
             WHERE picked.abandoned"
        )
    }

    /// The store's fenced write. Binds seven arrays of equal length: `$1`
    /// op, `$2` id, `$3` token, `$4` now, `$5` new `locked_until`, `$6` new
    /// `available_at`, `$7` `last_error`; returns the ids it changed.
    fn deliver_sql(t: &str) -> String {
        format!(
            "UPDATE {t} AS m SET \
               status = CASE v.op WHEN 'renew' THEN 'claimed' WHEN 'deliver' THEN 'delivered' \
                 WHEN 'dead' THEN 'dead_lettered' ELSE 'pending' END, \
               attempts = CASE v.op WHEN 'release' THEN greatest(m.attempts - 1, 0) \
                 ELSE m.attempts END, \
               available_at = CASE v.op WHEN 'retry' THEN v.available WHEN 'release' THEN v.now \
                 ELSE m.available_at END, \
               claim_token = CASE v.op WHEN 'renew' THEN m.claim_token END, \
               claimed_at = CASE v.op WHEN 'renew' THEN m.claimed_at END, \
               locked_until = CASE v.op WHEN 'renew' THEN v.until END, \
               last_error = CASE WHEN v.op IN ('retry', 'dead') THEN v.error \
                 ELSE m.last_error END, \
               delivered_at = CASE v.op WHEN 'deliver' THEN v.now ELSE m.delivered_at END, \
               updated_at = v.now \
             FROM unnest($1::text[], $2::text[], $3::text[], $4::timestamptz[], \
               $5::timestamptz[], $6::timestamptz[], $7::text[]) \
               AS v(op, id, token, now, until, available, error) \
             WHERE m.id = v.id AND coalesce(m.status, '') = 'claimed' \
               AND m.claim_token = v.token AND m.locked_until > v.now \
             RETURNING m.id"
        )
    }

    /// Raw SQL: claim 100 with the claim statement, mark them all
    /// delivered in one fenced write, until every message is delivered.
    pub(super) async fn raw_sql(store: &PostgresOutbox, messages: u64) -> Duration {
        let lease = DrainConfig::default().lease;
        let pool = store.pool();
        let table = store.table().quoted();
        let claim: Arc<str> = claim_sql(&table, BASELINE_CLAIM).into();
        let settle: Arc<str> = deliver_sql(&table).into();
        let started = Instant::now();
        let mut delivered = 0;
        while delivered < messages {
            let now = SystemClock.now();
            let claimed: Vec<(bool, String, Option<String>)> =
                sqlx::query(AssertSqlSafe(claim.clone()))
                    .bind(now)
                    .bind(now + lease)
                    .fetch_all(pool)
                    .await
                    .expect("claim")
                    .iter()
                    .map(|row| (row.get("abandoned"), row.get("id"), row.get("claim_token")))
                    .collect();
            assert!(!claimed.is_empty(), "the store ran dry after {delivered}");
            let n = claimed.len();
            let (ids, tokens): (Vec<String>, Vec<String>) = claimed
                .into_iter()
                .map(|(abandoned, id, token)| {
                    assert!(!abandoned, "no bench message runs out of attempts");
                    (id, token.expect("a claimed row has a token"))
                })
                .unzip();
            let now = SystemClock.now();
            let settled: Vec<String> = sqlx::query_scalar(AssertSqlSafe(settle.clone()))
                .bind(vec!["deliver"; n])
                .bind(ids)
                .bind(tokens)
                .bind(vec![now; n])
                .bind(vec![None::<DateTime<Utc>>; n])
                .bind(vec![None::<DateTime<Utc>>; n])
                .bind(vec![None::<String>; n])
                .fetch_all(pool)
                .await
                .expect("settle");
            assert_eq!(settled.len(), n, "every claim settles");
            delivered += n as u64;
        }
        started.elapsed()
    }
}

#[cfg(feature = "postgres")]
fn postgres_sides(
    messages: u64,
    settings: RuntimeSettings,
    (run_baseline, run_runtime): (bool, bool),
) -> (Option<Side>, Option<Side>) {
    let baseline_side = measured_if(run_baseline, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let mut counters = postgres::Counters::connect().await;
            let store = postgres::filled("baseline", messages, settings.pool).await;
            let before = counters.settled().await;
            let measured = with_cpu(postgres::raw_sql(&store, messages)).await;
            let counts = counters.per_message(store.pool(), before, messages).await;
            postgres::drop_table(&store).await;
            Side {
                commits_per_message: Some(counts.commits),
                wal_bytes_per_message: Some(counts.wal),
                ..Side::timed(measured)
            }
        })
    });
    let runtime_side = measured_if(run_runtime, || {
        actix::System::new().block_on(async move {
            let mut counters = postgres::Counters::connect().await;
            let store = postgres::filled("runtime", messages, settings.pool).await;
            let before = counters.settled().await;
            let measured = with_cpu(drain_with_runtime(store.clone(), settings)).await;
            let counts = counters.per_message(store.pool(), before, messages).await;
            postgres::drop_table(&store).await;
            Side {
                commits_per_message: Some(counts.commits),
                wal_bytes_per_message: Some(counts.wal),
                ..Side::timed(measured)
            }
        })
    });
    (baseline_side, runtime_side)
}

fn main() {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            std::process::exit(2);
        }
    };
    let Args {
        stores,
        messages,
        concurrency,
        batch,
        only,
        arbiters,
        prefetch,
        claims,
        schedule,
        sweep,
        plot,
        pool,
        delete_on_delivery,
    } = args;
    let sides = (
        only.as_deref() != Some("runtime"),
        only.as_deref() != Some("baseline"),
    );
    // A `Drain` loop measures passes as large as asked (all at once unless
    // told); a schedule measures how passes of a production-sized batch
    // follow one another.
    let default_batch = match schedule {
        Some(_) => DrainConfig::default().batch_size,
        None => messages as usize,
    };
    let settings = |concurrency: usize| RuntimeSettings {
        messages,
        concurrency,
        batch_size: batch.unwrap_or(default_batch).max(concurrency),
        arbiters,
        prefetch,
        claims,
        schedule,
        pool,
        delete_on_delivery,
    };

    let Some(sweep) = sweep else {
        measure(&stores[0], settings(concurrency), sides);
        return;
    };
    // Fail on the font or the output path now, not after the sweep.
    if let Some(plot) = &plot {
        let prepared = bench_plot::load_font().and_then(|()| {
            match plot.parent().filter(|dir| !dir.as_os_str().is_empty()) {
                Some(dir) => std::fs::create_dir_all(dir)
                    .map_err(|e| format!("--plot: cannot create {}: {e}", dir.display())),
                None => Ok(()),
            }
        });
        if let Err(message) = prepared {
            eprintln!("{message}");
            std::process::exit(2);
        }
    }
    let mut points = Vec::new();
    for store in &stores {
        for &concurrency in &sweep {
            points.push(measure(store, settings(concurrency), sides));
        }
    }
    if let Some(plot) = &plot {
        // A sweep measures both sides (it refuses `--only`).
        let drawn: Vec<bench_plot::Point<'_>> = points
            .iter()
            .filter_map(|point| {
                Some(bench_plot::Point {
                    store: &point.store,
                    concurrency: point.concurrency,
                    runtime_per_sec: point.runtime_per_sec?,
                    baseline_per_sec: point.baseline_per_sec?,
                })
            })
            .collect();
        let driven_by = schedule.map_or_else(
            || "a Drain loop".to_owned(),
            |every| format!("schedule {every:?}"),
        );
        #[cfg(feature = "postgres")]
        let server = if stores.iter().any(|store| store == "postgres") {
            format!("; PostgreSQL {}", postgres::durability())
        } else {
            String::new()
        };
        #[cfg(not(feature = "postgres"))]
        let server = String::new();
        let cores = std::thread::available_parallelism().map_or(0, usize::from);
        let note = format!(
            "{messages} messages a point, no-op handler, {driven_by}{server}; \
             one run on a shared {cores}-core machine"
        );
        if let Err(message) = bench_plot::draw(plot, &drawn, &note) {
            eprintln!("{message}");
            std::process::exit(1);
        }
        eprintln!("bench: wrote {}", plot.display());
    }
    let summary = SweepSummary {
        messages,
        concurrencies: sweep,
        plot: plot.map(|path| path.display().to_string()),
        points,
    };
    println!(
        "{}",
        serde_json::to_string(&summary).expect("the summary serializes")
    );
}

/// Measures one store at one concurrency, prints its line and its JSON
/// object (a side `--only` left out has `null` figures), and returns the
/// object.
fn measure(store_name: &str, settings: RuntimeSettings, sides: (bool, bool)) -> Summary {
    let RuntimeSettings {
        messages,
        concurrency,
        batch_size,
        prefetch,
        claims,
        schedule,
        pool,
        delete_on_delivery,
        ..
    } = settings;
    let (baseline_side, runtime_side) = match store_name {
        #[cfg(feature = "sqlite")]
        "sqlite" => sqlite_sides(messages, settings, sides),
        #[cfg(feature = "postgres")]
        "postgres" => postgres_sides(messages, settings, sides),
        _ => memory_sides(messages, concurrency, settings, sides),
    };
    // A side's peak was reset before it ran; the process's is the larger of
    // what is left and every side's own.
    let peak_rss = [runtime_side, baseline_side]
        .iter()
        .flatten()
        .filter_map(|side| side.peak_rss_mib)
        .chain(peak_rss_mib())
        .reduce(f64::max);
    let per_sec =
        |side: Option<Side>| side.map(|side| messages as f64 / side.elapsed.as_secs_f64());
    let runtime_per_sec = per_sec(runtime_side);
    let baseline_per_sec = per_sec(baseline_side);
    // One side's figures for the human line, or that it did not run
    // (`--only`).
    let described = |side: Option<Side>| {
        let Some(side) = side else {
            return "not run".to_owned();
        };
        let commits = side
            .commits_per_message
            .map(|c| format!(", {c:.4} commits/message"))
            .unwrap_or_default();
        let rss = side
            .peak_rss_mib
            .map(|mib| format!(", peak RSS {mib:.1} MiB"))
            .unwrap_or_default();
        format!(
            "{:.0}/s ({:.2?}{commits}{rss})",
            messages as f64 / side.elapsed.as_secs_f64(),
            side.elapsed
        )
    };
    let driven_by = schedule.map_or_else(
        || "a Drain loop".to_owned(),
        |every| format!("schedule {every:?}"),
    );
    println!(
        "{store_name}: {messages} messages, concurrency {concurrency}, batch {batch_size}, \
         prefetch {prefetch}, claims {claims}, {driven_by}: runtime {}, baseline {}",
        described(runtime_side),
        described(baseline_side),
    );
    let round = |x: f64, places: i32| {
        let scale = 10f64.powi(places);
        (x * scale).round() / scale
    };
    let per_message =
        |cpu: Option<Duration>| cpu.map(|cpu| round(cpu.as_secs_f64() * 1e6 / messages as f64, 2));
    let summary = Summary {
        store: store_name.to_owned(),
        messages,
        concurrency,
        batch: batch_size,
        prefetch,
        claims_in_flight: claims,
        schedule_ms: schedule.map(|every| every.as_millis() as u64),
        pool,
        delete_on_delivery,
        runtime_per_sec: runtime_per_sec.map(f64::round),
        baseline_per_sec: baseline_per_sec.map(f64::round),
        ratio: runtime_per_sec
            .zip(baseline_per_sec)
            .map(|(runtime, baseline)| round(runtime / baseline, 3)),
        runtime_cpu_us_per_message: per_message(runtime_side.and_then(|side| side.cpu)),
        baseline_cpu_us_per_message: per_message(baseline_side.and_then(|side| side.cpu)),
        runtime_machine_cpu_us_per_message: per_message(
            runtime_side.and_then(|side| side.machine_cpu),
        ),
        baseline_machine_cpu_us_per_message: per_message(
            baseline_side.and_then(|side| side.machine_cpu),
        ),
        commits_per_message: runtime_side
            .and_then(|side| side.commits_per_message)
            .map(|c| round(c, 4)),
        baseline_commits_per_message: baseline_side
            .and_then(|side| side.commits_per_message)
            .map(|c| round(c, 4)),
        wal_bytes_per_message: runtime_side
            .and_then(|side| side.wal_bytes_per_message)
            .map(f64::round),
        baseline_wal_bytes_per_message: baseline_side
            .and_then(|side| side.wal_bytes_per_message)
            .map(f64::round),
        peak_rss_mib: peak_rss.map(|mib| round(mib, 1)),
        runtime_peak_rss_mib: runtime_side
            .and_then(|side| side.peak_rss_mib)
            .map(|mib| round(mib, 1)),
        baseline_peak_rss_mib: baseline_side
            .and_then(|side| side.peak_rss_mib)
            .map(|mib| round(mib, 1)),
    };
    println!(
        "{}",
        serde_json::to_string(&summary).expect("the summary serializes")
    );
    summary
}

/// The last line of a sweep: every point's object, in the order measured.
#[derive(Serialize)]
struct SweepSummary {
    /// Messages drained by each side at each point.
    messages: u64,
    /// The concurrencies measured, for each store.
    concurrencies: Vec<usize>,
    /// The PNG drawn, if any.
    plot: Option<String>,
    points: Vec<Summary>,
}

/// The last line of output, fields in this order.
#[derive(Serialize)]
struct Summary {
    store: String,
    messages: u64,
    concurrency: usize,
    /// `batch_size` of the runtime's passes.
    batch: usize,
    /// `prefetch` of the runtime's drain.
    prefetch: usize,
    /// `claims_in_flight` of the runtime's drain.
    claims_in_flight: usize,
    /// The schedule the runtime drained on, or `None` for a `Drain` loop.
    schedule_ms: Option<u64>,
    /// Each side's PostgreSQL pool size, when given.
    pool: Option<u32>,
    /// Whether the runtime deleted each message as it settled it.
    delete_on_delivery: bool,
    /// Messages per second of each side; `None` for a side `--only` left
    /// out.
    runtime_per_sec: Option<f64>,
    baseline_per_sec: Option<f64>,
    /// `runtime_per_sec / baseline_per_sec`, when both ran.
    ratio: Option<f64>,
    /// CPU time of the process (every thread: the runtime, the store's
    /// workers, the client) per message while the runtime drained, µs. On
    /// PostgreSQL the server's work is not in it.
    runtime_cpu_us_per_message: Option<f64>,
    /// The same for the baseline.
    baseline_cpu_us_per_message: Option<f64>,
    /// CPU time of the whole machine per message while the runtime
    /// drained, µs: with a PostgreSQL server on the same machine, its work
    /// is in it. Anything else running then is too.
    runtime_machine_cpu_us_per_message: Option<f64>,
    /// The same for the baseline.
    baseline_machine_cpu_us_per_message: Option<f64>,
    /// The runtime's committed transactions per message (PostgreSQL).
    commits_per_message: Option<f64>,
    /// The baseline's, for comparison (PostgreSQL).
    baseline_commits_per_message: Option<f64>,
    /// The runtime's write-ahead log per message, bytes (PostgreSQL).
    wal_bytes_per_message: Option<f64>,
    /// The baseline's (PostgreSQL).
    baseline_wal_bytes_per_message: Option<f64>,
    /// The process's peak RSS (`VmHWM`), MiB.
    peak_rss_mib: Option<f64>,
    /// The runtime side's peak RSS over its fill and drain, MiB.
    runtime_peak_rss_mib: Option<f64>,
    /// The baseline side's, MiB.
    baseline_peak_rss_mib: Option<f64>,
}
