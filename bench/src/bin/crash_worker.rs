//! A drain worker made to be killed: the process the crash harness
//! (`bench/tests/crash.rs`) runs, SIGKILLs and restarts.
//!
//! ```text
//! crash_worker --store sqlite:///tmp/crash.db --log /tmp/deliveries.log --run 3
//! crash_worker --store postgres://postgres@127.0.0.1:5432/postgres --table crash_1 \
//!     --log /tmp/deliveries.log --run 3      # built with --features postgres
//! ```
//!
//! Flags: `--store URL` and `--log PATH` and `--run ID` (required),
//! `--table NAME` (the store's default table unless given),
//! `--concurrency N` (4), `--lease-ms MS` (2000), `--work-ms MIN-MAX`
//! (20-60: each delivery's time, fixed per message). It prints no JSON: its
//! output is the delivery log.
//!
//! It drains the outbox at `--store` with the actor runtime (a
//! `DrainCoordinator` on a schedule, a short lease) and exits once the store
//! holds nothing pending or claimed. The handler of [`CRASH_EVENT`] appends
//! one line to the delivery log when it starts and one when it ends, then
//! returns `Ok`:
//!
//! ```text
//! start <run> <message id> <attempt> <µs since the epoch>
//! end <run> <message id> <attempt> <µs since the epoch>
//! ```
//!
//! The log is opened with `O_APPEND` and each line is one `write`, without
//! `fsync`: a SIGKILL ends the process, not the kernel, so every line written
//! before the kill is in the file and no line is torn or interleaved. Several
//! runs append to the same file one after another.
//!
//! Exit status: 0 when drained, 1 when the store or the runtime failed,
//! 2 for bad arguments.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use outbox::{
    Clock, DeliveryContext, DrainConfig, Event, InProcessBus, OutboxAdmin, OutboxStore, SystemClock,
};
use outbox_actors::{DrainCoordinator, Shutdown};
use outbox_bench::args::{Flags, refuse};
use serde::{Deserialize, Serialize};

/// The name of the event the harness enqueues and this worker handles.
const CRASH_EVENT: &str = "crash.tick";

/// The payload: only its message id matters to the harness.
#[derive(Debug, Serialize, Deserialize)]
struct CrashTick {
    n: u64,
}

impl Event for CrashTick {
    const NAME: &'static str = CRASH_EVENT;
}

const USAGE: &str = "usage: crash_worker --store URL [--table NAME] --log PATH --run ID \
                     [--concurrency N] [--lease-ms MS] [--work-ms MIN-MAX]";

struct Args {
    /// `sqlite://PATH` or `postgres://...`.
    store: String,
    /// The outbox table; the store's default when absent.
    table: Option<String>,
    /// The delivery log, appended to.
    log: PathBuf,
    /// Written on every line, so the harness knows which process ran what.
    run: u32,
    concurrency: usize,
    lease: Duration,
    /// Each delivery takes between these many milliseconds, chosen from its
    /// id, so a kill finds handlers mid-way.
    work_ms: (u64, u64),
}

fn parse_args(mut flags: Flags) -> Result<Args, String> {
    let mut store = None;
    let mut table = None;
    let mut log = None;
    let mut run = None;
    let mut concurrency = 4;
    let mut lease = Duration::from_secs(2);
    let mut work_ms = (20, 60);
    while let Some(flag) = flags.next_flag() {
        match flag.as_str() {
            "--store" => store = Some(flags.value(&flag)?),
            "--table" => table = Some(flags.value(&flag)?),
            "--log" => log = Some(PathBuf::from(flags.value(&flag)?)),
            "--run" => run = Some(flags.parse(&flag)?),
            "--concurrency" => concurrency = flags.parse(&flag)?,
            "--lease-ms" => lease = Duration::from_millis(flags.parse(&flag)?),
            "--work-ms" => {
                let text = flags.value(&flag)?;
                let (min, max) = text.split_once('-').ok_or_else(|| {
                    format!("--work-ms takes MIN-MAX, such as 20-60, not {text:?}")
                })?;
                let parse = |part: &str| {
                    part.parse::<u64>()
                        .map_err(|e| format!("--work-ms takes MIN-MAX milliseconds: {e}"))
                };
                work_ms = (parse(min)?, parse(max)?);
                if work_ms.0 > work_ms.1 {
                    return Err(format!("--work-ms {text}: MIN is above MAX"));
                }
            }
            "--help" | "-h" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other:?}; {USAGE}")),
        }
    }
    let missing = |name: &str| format!("{name} is required; {USAGE}");
    Ok(Args {
        store: store.ok_or_else(|| missing("--store"))?,
        table,
        log: log.ok_or_else(|| missing("--log"))?,
        run: run.ok_or_else(|| missing("--run"))?,
        concurrency,
        lease,
        work_ms,
    })
}

fn main() {
    let args = parse_args(Flags::from_env())
        .unwrap_or_else(|message| refuse(format!("crash_worker: {message}")));
    let run = args.run;
    let result = actix::System::new().block_on(open_and_drain(args));
    if let Err(error) = result {
        eprintln!("crash_worker run {run}: {error}");
        std::process::exit(1);
    }
}

type BoxError = Box<dyn std::error::Error>;

async fn open_and_drain(args: Args) -> Result<(), BoxError> {
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&args.log)
        .map_err(|e| format!("cannot open the delivery log {}: {e}", args.log.display()))?;
    let log = DeliveryLog {
        file: Arc::new(log),
        run: args.run,
    };
    if args.store.starts_with("sqlite:") {
        return drain_sqlite(&args, log).await;
    }
    if args.store.starts_with("postgres:") || args.store.starts_with("postgresql:") {
        return drain_postgres(&args, log).await;
    }
    Err(format!(
        "--store {:?} is neither a sqlite:// nor a postgres:// URL",
        args.store
    )
    .into())
}

#[cfg(feature = "sqlite")]
async fn drain_sqlite(args: &Args, log: DeliveryLog) -> Result<(), BoxError> {
    use outbox::SqliteOutbox;
    use outbox::sqlx::sqlite::SqlitePoolOptions;

    let pool = SqlitePoolOptions::new()
        .connect_with(SqliteOutbox::connect_options(&args.store)?)
        .await?;
    let mut builder = SqliteOutbox::builder(pool);
    if let Some(table) = &args.table {
        builder = builder.table(table)?;
    }
    let store = builder.build();
    store.setup().await?;
    drain(store, args, log).await
}

#[cfg(not(feature = "sqlite"))]
async fn drain_sqlite(_: &Args, _: DeliveryLog) -> Result<(), BoxError> {
    Err("this worker was built without SQLite; build it with --features sqlite".into())
}

#[cfg(feature = "postgres")]
async fn drain_postgres(args: &Args, log: DeliveryLog) -> Result<(), BoxError> {
    use outbox::PostgresOutbox;
    use outbox::sqlx::postgres::PgPoolOptions;

    let pool = PgPoolOptions::new().connect(&args.store).await?;
    let mut builder = PostgresOutbox::builder(pool);
    if let Some(table) = &args.table {
        builder = builder.table(table)?;
    }
    let store = builder.build();
    store.setup().await?;
    drain(store, args, log).await
}

#[cfg(not(feature = "postgres"))]
async fn drain_postgres(_: &Args, _: DeliveryLog) -> Result<(), BoxError> {
    Err("this worker was built without PostgreSQL; build it with --features postgres".into())
}

/// Run the drain until nothing is pending or claimed, then shut it down.
async fn drain<S>(store: S, args: &Args, log: DeliveryLog) -> Result<(), BoxError>
where
    S: OutboxStore + OutboxAdmin + Clone,
{
    let work_ms = args.work_ms;
    let bus = InProcessBus::new().on(move |_: Arc<CrashTick>, context: DeliveryContext| {
        let log = log.clone();
        async move {
            log.line("start", &context);
            tokio::time::sleep(Duration::from_millis(work_for(context.id(), work_ms))).await;
            log.line("end", &context);
            Ok(())
        }
    });
    let coordinator = DrainCoordinator::builder(store.clone())
        .event_bus(bus)
        .config(DrainConfig {
            concurrency: args.concurrency,
            batch_size: 100.max(args.concurrency),
            lease: args.lease,
            // Claims left by a killed run are taken over within a tick of
            // their lease running out.
            every: Some(Duration::from_millis(100)),
            ..DrainConfig::default()
        })
        .start()?;
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let stats = store.stats(SystemClock.now()).await?;
        // Claimed includes this run's own deliveries: it exits only once
        // each of them is settled.
        if stats.pending + stats.claimed == 0 {
            break;
        }
    }
    coordinator
        .send(Shutdown {
            grace: Duration::from_secs(1),
        })
        .await?;
    Ok(())
}

/// Milliseconds of work for message `id`: fixed per message, spread over
/// `min..=max` (FNV-1a of the id).
fn work_for(id: &str, (min, max): (u64, u64)) -> u64 {
    let hash = id.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    min + hash % (max - min + 1)
}

/// The append-only delivery log of one run.
#[derive(Clone)]
struct DeliveryLog {
    file: Arc<File>,
    run: u32,
}

impl DeliveryLog {
    /// Append one line with a single `write` (the file is in append mode,
    /// so lines from one run never interleave mid-line). A failed write
    /// stops the process: a log with holes would make the harness report
    /// messages as lost that were delivered.
    fn line(&self, what: &str, context: &DeliveryContext) {
        let micros = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_micros());
        let line = format!(
            "{what} {} {} {} {micros}\n",
            self.run,
            context.id(),
            context.attempt()
        );
        if let Err(error) = (&*self.file).write_all(line.as_bytes()) {
            eprintln!(
                "crash_worker run {}: delivery log write failed: {error}",
                self.run
            );
            std::process::exit(1);
        }
    }
}
