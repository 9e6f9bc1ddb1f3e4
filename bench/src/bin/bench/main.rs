//! Throughput of the actor runtime against a baseline, in the same run.
//!
//! ```text
//! cargo run --release -p outbox-bench --bin bench -- --store memory --messages 200000 --concurrency 64
//! cargo run --release -p outbox-bench --bin bench -- --store sqlite --messages 100000 --concurrency 64
//! scripts/with-postgres cargo run --release -p outbox-bench --features postgres --bin bench -- \
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
//! JSON object with every point; `--plot FILE.png` also draws them (the
//! `bench_plot` binary draws such a line again later):
//!
//! ```text
//! WITH_POSTGRES_DURABLE=1 scripts/with-postgres cargo run --release -p outbox-bench \
//!     --features postgres --bin bench -- --store memory,sqlite,postgres --messages 20000 \
//!     --sweep 1,4,16,64,256 --plot docs/throughput.png
//! ```
//!
//! `--prefetch N` and `--claims N` set the runtime's `prefetch` and
//! `claims_in_flight`; `--pool N` sizes each side's PostgreSQL pool (sqlx's
//! default, 10, unless given), to match a peer run's `--pool`.
//! `--delete-on-delivery` sets the runtime's `retention.delete_on_delivery`:
//! each message is deleted by the write that settles it, as job queues
//! that keep no finished jobs do; the baseline still marks rows delivered.
//! `--only runtime|baseline` runs one side (for profiling); `--arbiters N`
//! sets the runtime's `delivery_arbiters`.
//!
//! # Output
//!
//! One human line and one JSON object per point, the last line one JSON
//! object: a point's (`outbox_bench::throughput::Summary`: `store`,
//! `messages`, `concurrency`, `batch`, `prefetch`, `claims_in_flight`,
//! `schedule_ms`, `pool`, `delete_on_delivery`, `runtime_per_sec`,
//! `baseline_per_sec`, `ratio`, the CPU, commit, WAL and peak RSS figures
//! above), or after a sweep every point's (`SweepSummary`: `messages`,
//! `concurrencies`, `plot`, `points`).

#[cfg(feature = "postgres")]
mod postgres;
mod sides;
#[cfg(feature = "sqlite")]
mod sqlite;

use std::path::PathBuf;
use std::time::Duration;

use outbox::DrainConfig;
use outbox_bench::args::{Flags, refuse};
use outbox_bench::plot;
use outbox_bench::report::print_json;
use outbox_bench::resources::peak_rss_mib;
use outbox_bench::stats::{per_sec, round};
use outbox_bench::store::{STORES, check};
use outbox_bench::throughput::{Summary, SweepSummary, driven_by};

use crate::sides::{RuntimeSettings, Side};

/// The command line.
struct Args {
    /// One store, or with `--sweep` a list of them.
    stores: Vec<String>,
    /// Messages each side drains.
    messages: u64,
    /// The runtime's deliveries in flight (a single run's).
    concurrency: usize,
    /// `batch_size` of the runtime's passes, when given.
    batch: Option<usize>,
    /// Run one side only (for profiling): `runtime` or `baseline`.
    only: Option<String>,
    /// Delivery arbiters for the runtime (0: the coordinator's thread).
    arbiters: usize,
    /// `prefetch` of the runtime's drain; `None` leaves it to the drain.
    prefetch: Option<usize>,
    /// `claims_in_flight` of the runtime's drain; `None` leaves it to the store.
    claims: Option<usize>,
    /// Drain on this schedule instead of sending `Drain` in a loop.
    schedule: Option<Duration>,
    /// Measure each of these concurrencies in turn.
    sweep: Option<Vec<usize>>,
    /// Draw the sweep into this PNG.
    plot: Option<PathBuf>,
    /// PostgreSQL connections of each side's pool (sqlx's default unless given).
    pool: Option<u32>,
    /// The runtime deletes each message as it settles it.
    delete_on_delivery: bool,
}

fn parse_args(mut flags: Flags) -> Result<Args, String> {
    let mut args = Args {
        stores: vec!["memory".into()],
        messages: 200_000,
        concurrency: 64,
        batch: None,
        only: None,
        arbiters: 0,
        prefetch: None,
        claims: None,
        schedule: None,
        sweep: None,
        plot: None,
        pool: None,
        delete_on_delivery: false,
    };
    let mut concurrency_given = false;
    while let Some(flag) = flags.next_flag() {
        match flag.as_str() {
            "--store" => args.stores = flags.list(&flag)?,
            "--sweep" => {
                args.sweep = Some(
                    flags
                        .list(&flag)?
                        .iter()
                        .map(|n| {
                            n.parse::<usize>().map_err(|e| {
                                format!("--sweep takes concurrencies such as 1,4,16: {n:?}: {e}")
                            })
                        })
                        .collect::<Result<_, _>>()?,
                )
            }
            "--plot" => args.plot = Some(flags.value(&flag)?.into()),
            "--messages" => args.messages = flags.parse(&flag)?,
            "--concurrency" => {
                concurrency_given = true;
                args.concurrency = flags.parse(&flag)?;
            }
            "--batch" => args.batch = Some(flags.parse(&flag)?),
            "--only" => args.only = Some(flags.value(&flag)?),
            "--arbiters" => args.arbiters = flags.parse(&flag)?,
            "--prefetch" => args.prefetch = Some(flags.parse(&flag)?),
            "--claims" => args.claims = Some(flags.parse(&flag)?),
            "--pool" => {
                let pool: u32 = flags.parse(&flag)?;
                if pool == 0 {
                    return Err("--pool: a pool needs at least 1 connection".into());
                }
                args.pool = Some(pool);
            }
            "--schedule" => args.schedule = Some(parse_every(&flags.value(&flag)?)?),
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
        check(store, STORES)?;
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

fn main() {
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
    } = parse_args(Flags::from_env()).unwrap_or_else(|message| refuse(message));
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
        plot::prepare(plot).unwrap_or_else(|message| refuse(message));
    }
    let mut points = Vec::new();
    for store in &stores {
        for &concurrency in &sweep {
            points.push(measure(store, settings(concurrency), sides));
        }
    }
    if let Some(path) = &plot {
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
            "{}{server}; one run on a shared {cores}-core machine",
            plot::settings_note(messages, schedule)
        );
        if let Err(message) = plot::draw(path, &plot::points(&points), &note) {
            eprintln!("{message}");
            std::process::exit(1);
        }
        eprintln!("bench: wrote {}", path.display());
    }
    print_json(&SweepSummary {
        messages,
        concurrencies: sweep,
        plot: plot.map(|path| path.display().to_string()),
        points,
    });
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
        "sqlite" => sqlite::sides(settings, sides),
        #[cfg(feature = "postgres")]
        "postgres" => postgres::sides(settings, sides),
        _ => sides::memory(settings, sides),
    };
    // A side's peak was reset before it ran; the process's is the larger of
    // what is left and every side's own.
    let peak_rss = [runtime_side, baseline_side]
        .iter()
        .flatten()
        .filter_map(|side| side.peak_rss_mib)
        .chain(peak_rss_mib())
        .reduce(f64::max);
    let rate = |side: Option<Side>| side.map(|side| per_sec(messages, side.elapsed));
    let runtime_per_sec = rate(runtime_side);
    let baseline_per_sec = rate(baseline_side);
    let or_auto = |value: Option<usize>| value.map_or("auto".to_owned(), |n| n.to_string());
    println!(
        "{store_name}: {messages} messages, concurrency {concurrency}, batch {batch_size}, \
         prefetch {}, claims {}, {}: runtime {}, baseline {}",
        or_auto(prefetch),
        or_auto(claims),
        driven_by(schedule),
        Side::describe(runtime_side, messages),
        Side::describe(baseline_side, messages),
    );
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
    print_json(&summary);
    summary
}
