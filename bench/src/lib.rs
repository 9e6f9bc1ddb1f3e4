//! The outbox crates' benchmarks, one binary each, and the support code they
//! share.
//!
//! Every benchmark builds the stores it measures from scratch (a new SQLite
//! file, a new PostgreSQL table in `DATABASE_URL`), fills them before any
//! clock starts, removes them afterwards, and ends its output with one line
//! of JSON holding its figures. Run one with
//!
//! ```text
//! cargo run --release -p outbox-bench --bin NAME -- FLAGS
//! ```
//!
//! or build them all (`cargo build --release -p outbox-bench --features
//! postgres`) and run `target/release/NAME`. Each binary's own doc comment
//! gives its flags, its JSON fields and a command to start from;
//! `--help` prints the flags.
//!
//! | binary | measures |
//! |---|---|
//! | `bench` | drain throughput of the actor runtime against a baseline in the same run, on memory, SQLite or PostgreSQL; with `--sweep`, against concurrency |
//! | `bench_plot` | nothing: draws a `bench --sweep` JSON line as a PNG |
//! | `claim_bench` | what a claim costs with a thousand or a million pending messages, behind live claims, and with ordering keys |
//! | `enqueue_bench` | the producer's side: a batch enqueue against a raw multi-row `INSERT` of the same rows, and what `enqueue_in` adds to the caller's transaction |
//! | `latency` | enqueue → handler latency at a fixed rate, with wake-ups and no schedule |
//! | `relay_bench` | relay throughput to NATS, RabbitMQ and Redis against the broker client's own publishing loop |
//! | `retention_bench` | claim cost and table size over a long stream with retention deleting what settled |
//! | `scale_bench` | one PostgreSQL backlog drained by 1, 2, 4 and 8 processes: throughput, and the server's CPU per message |
//! | `crash_worker` | nothing: the drain worker that the crash harness (`tests/crash.rs`) kills and restarts |
//! | `inbox_consumer` | nothing: the inbox consumer that the inbox crash harness (`tests/inbox_crash.rs`) kills and restarts |
//!
//! The PostgreSQL runs want the `postgres` feature and a server:
//! `scripts/with-postgres` makes a throwaway one and exports
//! `DATABASE_URL` (`WITH_POSTGRES_DURABLE=1` for a durable one, as figures
//! should come from); `scripts/with-services` adds the brokers
//! `relay_bench` needs.
//!
//! # Layout
//!
//! Each module imports only modules listed before it.
//!
//! - [`args`]: the command line, read flag by flag, and the one way a bad
//!   one ends (exit status 2).
//! - [`stats`]: medians, means, percentiles and rounding.
//! - [`report`]: the JSON line each benchmark ends with.
//! - [`resources`]: process and machine CPU time, and peak RSS, from
//!   `/proc`.
//! - [`store`]: which stores the build has, a claim's parameters, and each
//!   store made fresh and filled; `store/sqlite.rs` (temporary files) and
//!   `store/postgres.rs` (tables in `DATABASE_URL`).
//! - [`drain`]: a timed `Drain` loop on the actor runtime, and the plain
//!   Tokio runtime the baselines run on.
//! - [`throughput`]: the JSON objects of `bench`, which `bench_plot` reads
//!   back.
//! - [`plot`]: the PNG of a sweep.
//!
//! The binaries live in `src/bin/`, a folder for those of several files
//! (`bench/`, `relay_bench/`).
//!
//! # Features
//!
//! - `sqlite` (default): the `--store sqlite` runs; `relay_bench` needs it.
//! - `postgres`: the `--store postgres` runs.
//! - `mimalloc`: every binary allocates with mimalloc, as the `outbox`
//!   command does, instead of the system's allocator. Off by default, so
//!   the figures are what an application gets unless it picks an
//!   allocator; every JSON line names the one that ran (`allocator`).

pub mod args;
pub mod drain;
pub mod plot;
pub mod report;
pub mod resources;
pub mod stats;
pub mod store;
pub mod throughput;

#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The allocator this build's binaries use, as their JSON lines name it.
pub const ALLOCATOR: &str = if cfg!(feature = "mimalloc") {
    "mimalloc"
} else {
    "system"
};
