//! Scaling by processes: one backlog on one PostgreSQL server, drained by 1,
//! 2, 4 and 8 processes in turn, the same total concurrency split across
//! them; the throughput of each, and what each message cost the server's
//! CPU and the processes' own.
//!
//! ```text
//! cargo build --release -p outbox-bench --features postgres --bin scale_bench
//! WITH_POSTGRES_DURABLE=1 scripts/with-postgres target/release/scale_bench \
//!     --processes 1,2,4,8 --messages 20000 --concurrency 64 --rounds 3 \
//!     --plot docs/processes.png
//! ```
//!
//! Flags: `--processes LIST` (1,2,4,8), `--messages N` (20000, the backlog
//! of each run), `--concurrency C` (64: the handlers running at once across
//! all processes; a run of `P` processes gives each `C / P`, the first ones
//! one more when it does not divide), `--batch N` (100, each pass's
//! `batch_size`), `--rounds R` (3: every process count is run once per
//! round, rounds one after another, so a machine's drift touches them all
//! alike), `--plot FILE.png` (a picture of the figures). Needs the
//! `postgres` feature and `DATABASE_URL`; figures should come from a
//! durable server (`WITH_POSTGRES_DURABLE=1`).
//!
//! Each run fills a fresh table with the backlog (then `ANALYZE` and a
//! `CHECKPOINT`, so the drain pays for neither), starts the processes
//! (this binary again, with `--worker`: the actor runtime, `Drain` after
//! `Drain`, a no-op handler, a pool of its concurrency plus two), lets them
//! open their pools, starts the clock and all of them at once, and stops it
//! when the last one has found nothing left. Every message must have been
//! delivered once, by the processes' counts and by the table's.
//!
//! The server's CPU time is read from `/proc` (the postmaster, every process
//! it started, and what those that ended took with them), so it is known
//! only for a server on this machine, and `null` otherwise. On a machine of
//! few cores the processes and the server share them: the table shows where
//! that ceiling is, not how far a bigger primary goes.
//!
//! # Output
//!
//! One line per run, a Markdown table of the medians, and last one JSON
//! object: `benchmark` ("scale_bench"), `messages`, `concurrency`,
//! `batch`, `rounds`, `durability` (the server's `fsync` and
//! `synchronous_commit`), `cores` (this machine's), and `points`, one per
//! process count: `processes`, `concurrency_each` (a list), `per_sec` (the
//! median), `rounds_per_sec`, `server_cpu_us_per_message`,
//! `workers_cpu_us_per_message` (all the processes' CPU together),
//! `server_cores` (the server's CPU time over the wall time: how many cores
//! it kept busy).

mod picture;
mod server_cpu;
mod worker;

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use outbox::NewMessage;
use outbox_bench::args::{Flags, refuse};
use outbox_bench::drain::current_thread;
use outbox_bench::report::print_json;
use outbox_bench::stats::{median, round};
use outbox_bench::store::{self, FILL_CHUNK, postgres};
use serde::Serialize;
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, Connection, PgConnection};

use server_cpu::ServerCpu;
use worker::{Done, Tick, Worker};

const USAGE: &str = "usage: scale_bench [--processes LIST] [--messages N] [--concurrency C] \
                     [--batch N] [--rounds R] [--plot FILE.png]";

struct Args {
    processes: Vec<usize>,
    messages: u64,
    concurrency: usize,
    batch: usize,
    rounds: usize,
    plot: Option<PathBuf>,
}

fn parse_args(mut flags: Flags) -> Result<Args, String> {
    let mut args = Args {
        processes: vec![1, 2, 4, 8],
        messages: 20_000,
        concurrency: 64,
        batch: 100,
        rounds: 3,
        plot: None,
    };
    while let Some(flag) = flags.next_flag() {
        match flag.as_str() {
            "--processes" => {
                args.processes = flags
                    .list(&flag)?
                    .iter()
                    .map(|n| n.parse().map_err(|e| format!("--processes: {n:?}: {e}")))
                    .collect::<Result<_, _>>()?;
            }
            "--messages" => args.messages = flags.parse(&flag)?,
            "--concurrency" => args.concurrency = flags.parse(&flag)?,
            "--batch" => args.batch = flags.parse(&flag)?,
            "--rounds" => args.rounds = flags.parse(&flag)?,
            "--plot" => args.plot = Some(flags.value(&flag)?.into()),
            "--help" | "-h" => refuse(USAGE),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    if args.messages == 0 || args.rounds == 0 || args.batch == 0 {
        return Err("--messages, --batch and --rounds must be at least 1".to_owned());
    }
    if let Some(&too_many) = args
        .processes
        .iter()
        .find(|&&p| p == 0 || p > args.concurrency)
    {
        return Err(format!(
            "--processes: {too_many} processes cannot share a concurrency of {} (each needs \
             at least 1)",
            args.concurrency
        ));
    }
    // A pass's batch holds at least its handlers (the drain's own rule).
    let largest_share = args
        .processes
        .iter()
        .map(|&p| split(args.concurrency, p)[0])
        .max()
        .unwrap_or(0);
    if largest_share > args.batch {
        return Err(format!(
            "--batch {} is below a process's concurrency of {largest_share}",
            args.batch
        ));
    }
    Ok(args)
}

/// `total` handlers shared by `processes`: the first ones one more when it
/// does not divide.
fn split(total: usize, processes: usize) -> Vec<usize> {
    (0..processes)
        .map(|i| total / processes + usize::from(i < total % processes))
        .collect()
}

/// One process count's figures, medians over the rounds.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Point {
    pub(crate) processes: usize,
    pub(crate) concurrency_each: Vec<usize>,
    pub(crate) per_sec: f64,
    pub(crate) rounds_per_sec: Vec<f64>,
    pub(crate) server_cpu_us_per_message: Option<f64>,
    pub(crate) workers_cpu_us_per_message: Option<f64>,
    pub(crate) server_cores: Option<f64>,
}

/// What one run measured.
struct Run {
    per_sec: f64,
    server_cpu_us_per_message: Option<f64>,
    workers_cpu_us_per_message: Option<f64>,
    server_cores: Option<f64>,
}

#[derive(Serialize)]
struct Summary {
    benchmark: &'static str,
    messages: u64,
    concurrency: usize,
    batch: usize,
    rounds: usize,
    durability: String,
    cores: usize,
    points: Vec<Point>,
}

/// A line of a child's standard output; the run fails without one.
fn line_of(reader: &mut impl BufRead, what: &str) -> String {
    let mut line = String::new();
    match reader.read_line(&mut line) {
        Ok(n) if n > 0 => line.trim().to_owned(),
        _ => {
            eprintln!("scale_bench: a drain process ended before {what}");
            std::process::exit(1)
        }
    }
}

/// Fills a fresh table, drains it with `processes` processes, and drops it.
fn run(
    url: &str,
    args: &Args,
    processes: usize,
    round_no: usize,
    server: Option<&ServerCpu>,
) -> Run {
    let runtime = current_thread();
    let table = format!("scale_{}_{processes}_{round_no}", std::process::id());
    runtime.block_on(async {
        let fill = postgres::fresh(url, &table, PgPoolOptions::new(), false).await;
        store::fill(&fill, 0..args.messages, FILL_CHUNK, |n| {
            NewMessage::event(&Tick { n }).expect("a tick serializes")
        })
        .await;
        postgres::analyze(&fill).await;
        sqlx::raw_sql("CHECKPOINT")
            .execute(fill.pool())
            .await
            .expect("checkpoint after the fill");
        fill.pool().close().await;
    });

    let exe = std::env::current_exe().expect("this binary's path");
    let mut children: Vec<(Child, BufReader<std::process::ChildStdout>)> =
        split(args.concurrency, processes)
            .into_iter()
            .map(|concurrency| {
                let worker = Worker {
                    table: table.clone(),
                    concurrency,
                    batch: args.batch,
                    pool: concurrency as u32 + 2,
                };
                let mut child = Command::new(&exe)
                    .args(worker.args())
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .spawn()
                    .expect("start a drain process");
                let stdout = BufReader::new(child.stdout.take().expect("piped"));
                (child, stdout)
            })
            .collect();
    for (_, stdout) in &mut children {
        let ready = line_of(stdout, "it was ready");
        assert_eq!(ready, "ready", "a drain process said {ready:?}");
    }

    let server_before = server.and_then(ServerCpu::total);
    let started = Instant::now();
    for (child, _) in &mut children {
        let stdin = child.stdin.as_mut().expect("piped");
        stdin
            .write_all(b"go\n")
            .expect("tell a drain process to go");
        stdin.flush().expect("tell a drain process to go");
    }
    let done: Vec<Done> = children
        .iter_mut()
        .map(|(_, stdout)| {
            let line = line_of(stdout, "it was done");
            serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("a drain process printed {line:?}: {e}"))
        })
        .collect();
    let elapsed = started.elapsed();
    for (mut child, _) in children {
        let status = child.wait().expect("a drain process ends");
        assert!(status.success(), "a drain process failed: {status}");
    }
    // The backends of the processes' pools end as the pools close: let the
    // postmaster reap them, which adds their time to its own.
    std::thread::sleep(Duration::from_millis(300));
    let server_spent = server
        .and_then(ServerCpu::total)
        .zip(server_before)
        .map(|(after, before)| after.saturating_sub(before));

    let delivered: u64 = done.iter().map(|d| d.delivered).sum();
    let in_table: i64 = runtime.block_on(async {
        let mut conn = PgConnection::connect(url).await.expect("connect");
        let count = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT count(*) FROM \"{table}\" WHERE status = 'delivered'"
        )))
        .fetch_one(&mut conn)
        .await
        .expect("count what was delivered");
        conn.close().await.ok();
        count
    });
    runtime.block_on(postgres::drop_tables(url, &table));
    assert_eq!(
        (delivered, in_table as u64),
        (args.messages, args.messages),
        "every message delivered once, by the processes' counts and by the table's"
    );

    let messages = args.messages as f64;
    let workers_cpu: Option<u64> = done.iter().map(|d| d.cpu_us).sum();
    Run {
        per_sec: messages / elapsed.as_secs_f64(),
        server_cpu_us_per_message: server_spent.map(|s| s.as_secs_f64() * 1e6 / messages),
        workers_cpu_us_per_message: workers_cpu.map(|us| us as f64 / messages),
        server_cores: server_spent.map(|s| s.as_secs_f64() / elapsed.as_secs_f64()),
    }
}

/// The server's `fsync` and `synchronous_commit`, and the server's CPU
/// when it runs on this machine.
fn server(url: &str) -> (String, Option<ServerCpu>) {
    current_thread().block_on(async {
        let mut conn = PgConnection::connect(url)
            .await
            .expect("connect to DATABASE_URL");
        let mut shown = Vec::new();
        for setting in ["fsync", "synchronous_commit"] {
            let value: String = sqlx::query_scalar(AssertSqlSafe(format!("SHOW {setting}")))
                .fetch_one(&mut conn)
                .await
                .expect("read a server setting");
            shown.push(format!("{setting}={value}"));
        }
        let backend: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut conn)
            .await
            .expect("the backend's process id");
        let cpu = u32::try_from(backend).ok().and_then(ServerCpu::of_backend);
        conn.close().await.ok();
        (shown.join(", "), cpu)
    })
}

/// The medians of `runs` for a point.
fn point(processes: usize, concurrency: usize, runs: &[Run]) -> Point {
    let optional = |value: fn(&Run) -> Option<f64>, places| {
        let values: Option<Vec<f64>> = runs.iter().map(value).collect();
        values.map(|values| round(median(values), places))
    };
    Point {
        processes,
        concurrency_each: split(concurrency, processes),
        per_sec: round(median(runs.iter().map(|r| r.per_sec).collect()), 1),
        rounds_per_sec: runs.iter().map(|r| round(r.per_sec, 1)).collect(),
        server_cpu_us_per_message: optional(|r| r.server_cpu_us_per_message, 1),
        workers_cpu_us_per_message: optional(|r| r.workers_cpu_us_per_message, 1),
        server_cores: optional(|r| r.server_cores, 2),
    }
}

/// `Some(x)` to one place, `None` as a dash.
fn cell(value: Option<f64>) -> String {
    value.map_or_else(|| "–".to_owned(), |x| format!("{x:.1}"))
}

fn main() {
    let mut flags = Flags::from_env();
    let url = postgres::database_url().unwrap_or_else(|message| refuse(message));
    if std::env::args().nth(1).as_deref() == Some("--worker") {
        flags.next_flag();
        let worker = Worker::parse(flags).unwrap_or_else(|message| refuse(message));
        worker.run(&url);
        return;
    }
    let args = parse_args(flags).unwrap_or_else(|message| refuse(message));
    if let Some(path) = &args.plot {
        outbox_bench::plot::prepare(path).unwrap_or_else(|message| refuse(message));
    }
    let (durability, server_cpu) = server(&url);
    if server_cpu.is_none() {
        eprintln!(
            "scale_bench: the server is not a process of this machine that /proc shows: its CPU \
             time is not measured"
        );
    }

    let mut runs: Vec<Vec<Run>> = args.processes.iter().map(|_| Vec::new()).collect();
    for round_no in 1..=args.rounds {
        for (i, &processes) in args.processes.iter().enumerate() {
            let measured = run(&url, &args, processes, round_no, server_cpu.as_ref());
            println!(
                "round {round_no}, {processes} processes: {:.0} msg/s, server CPU {} µs/msg \
                 ({} cores busy), drain processes' CPU {} µs/msg",
                measured.per_sec,
                cell(measured.server_cpu_us_per_message),
                measured
                    .server_cores
                    .map_or_else(|| "–".to_owned(), |c| format!("{c:.2}")),
                cell(measured.workers_cpu_us_per_message),
            );
            runs[i].push(measured);
        }
    }
    let points: Vec<Point> = args
        .processes
        .iter()
        .zip(&runs)
        .map(|(&processes, runs)| point(processes, args.concurrency, runs))
        .collect();
    let cores = std::thread::available_parallelism().map_or(0, usize::from);

    println!();
    println!(
        "| processes | concurrency each | msg/s (median) | rounds | server CPU µs/msg | drain \
         processes' CPU µs/msg | server cores busy |"
    );
    println!("|---|---|---|---|---|---|---|");
    for p in &points {
        let each: Vec<String> = p.concurrency_each.iter().map(usize::to_string).collect();
        let rounds: Vec<String> = p.rounds_per_sec.iter().map(|r| format!("{r:.0}")).collect();
        println!(
            "| {} | {} | {:.0} | {} | {} | {} | {} |",
            p.processes,
            each.join(", "),
            p.per_sec,
            rounds.join(" / "),
            cell(p.server_cpu_us_per_message),
            cell(p.workers_cpu_us_per_message),
            p.server_cores
                .map_or_else(|| "–".to_owned(), |c| format!("{c:.2}")),
        );
    }
    println!();
    if let Some(path) = &args.plot {
        let note = format!(
            "{} messages a run, concurrency {} across the processes, batch {}, median of {} \
             rounds; PostgreSQL {durability}; {cores} cores shared by the server and the processes",
            args.messages, args.concurrency, args.batch, args.rounds
        );
        picture::draw(path, &points, &note).unwrap_or_else(|message| refuse(message));
    }
    print_json(&Summary {
        benchmark: "scale_bench",
        messages: args.messages,
        concurrency: args.concurrency,
        batch: args.batch,
        rounds: args.rounds,
        durability,
        cores,
        points,
    });
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn concurrency_is_shared_with_the_first_processes_taking_the_rest() {
        assert_eq!(split(16, 1), [16]);
        assert_eq!(split(16, 8), [2; 8]);
        assert_eq!(split(10, 4), [3, 3, 2, 2]);
    }
}
