//! Deterministic simulation of the whole drain runtime.
//!
//! Each schedule is drawn from a seed: a configuration (concurrency,
//! batch, lease, heartbeat, `max_active`, settlement retries, a drain
//! schedule or none, wake-ups or none), messages whose handlers work for a
//! while, fail, panic or hang on their first attempts, and a store whose
//! every call may fail transiently (before or after doing its work), refuse
//! the claim, wait before its work (with the caller's `now` already read),
//! answer late, or never answer. The driver sends drains, lets time pass,
//! enqueues more, and shuts the coordinator down at random moments (the next
//! one starting at once or after the old one stopped); then faults stop and
//! the last coordinator drains until nothing is pending or claimed.
//!
//! Everything runs in one actix system on a paused current-thread tokio
//! runtime with a clock tied to tokio's `Instant`: hours of leases pass in
//! microseconds, and a schedule replays from its seed.
//!
//! After each schedule every invariant is checked (see `world::World::check`):
//! every claimed message has exactly one outcome; no write under a token
//! that did not hold a live claim ever succeeded, and no claim settled
//! twice; no message was claimed while another claim of it was live, and no
//! two handlers of one message overlapped; each coordinator's totals match
//! what the store answered it and what its subscribers heard; nothing is
//! lost (every message ends delivered or dead-lettered, and a delivered one
//! had a handler succeed).
//!
//! Environment: `SIM_SCHEDULES` (default 10 000) schedules, seeds
//! `SIM_FIRST..SIM_FIRST + SIM_SCHEDULES` (default from 0), over
//! `SIM_THREADS` threads (default: the available cores); `SIM_SEED` replays
//! one seed and prints what it did, with `SIM_TRACE=1` every store call and
//! handler run in order.

mod rng;
mod store;
mod world;

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use outbox_actors::DrainReport;

use store::FAULT_NAMES;
use world::{Failure, HANDLER_PANIC, Tally};

fn env(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    match value.trim().parse() {
        Ok(number) => Some(number),
        Err(_) => {
            eprintln!("{name} must be a whole number, not {value:?}");
            std::process::exit(2);
        }
    }
}

/// Run one schedule in its own actix system; a panic is a failure too.
fn run_one(seed: u64, trace: store::Trace) -> Result<Tally, Failure> {
    let result = Arc::new(Mutex::new(None));
    let slot = result.clone();
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let system = actix_rt::System::with_tokio_rt(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(true)
                .build()
                .expect("a paused runtime builds")
        });
        system.block_on(async move {
            *slot.lock().unwrap() = Some(world::run(seed, trace).await);
        });
    }));
    match ran {
        Ok(()) => result.lock().unwrap().take().expect("the schedule ran"),
        Err(panic) => Err(Failure {
            violations: vec![format!(
                "panicked: {}",
                panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("(no message)")
            )],
            schedule: String::new(),
        }),
    }
}

fn replay_command(seed: u64) -> String {
    format!("SIM_SEED={seed} cargo test -p outbox-actors --test simulation")
}

fn print_failure(out: &mut impl Write, seed: u64, failure: &Failure) {
    let _ = writeln!(out, "\nschedule {seed} FAILED ({})", failure.schedule);
    for violation in failure.violations.iter().take(20) {
        let _ = writeln!(out, "  - {violation}");
    }
    if failure.violations.len() > 20 {
        let _ = writeln!(out, "  ... {} more", failure.violations.len() - 20);
    }
    let _ = writeln!(out, "  replay: {}", replay_command(seed));
}

#[derive(Default)]
struct Summary {
    schedules: u64,
    messages: u64,
    incarnations: u64,
    handler_runs: u64,
    totals: DrainReport,
    faults: [u64; 6],
    stale_now_writes: u64,
    failures: Vec<(u64, Failure)>,
}

impl Summary {
    fn add(&mut self, seed: u64, result: Result<Tally, Failure>) {
        self.schedules += 1;
        match result {
            Ok(outcome) => {
                self.messages += outcome.messages;
                self.incarnations += outcome.incarnations;
                self.handler_runs += outcome.handler_runs;
                self.totals += outcome.totals;
                for (sum, count) in self.faults.iter_mut().zip(outcome.faults) {
                    *sum += count;
                }
                self.stale_now_writes += outcome.stale_now_writes;
            }
            Err(failure) => self.failures.push((seed, failure)),
        }
    }

    /// The kinds of outcome and fault the runs went through, so the
    /// invariants were checked against each of them.
    fn uncovered(&self) -> Vec<&'static str> {
        let t = &self.totals;
        let outcomes = [
            (t.delivered, "delivered"),
            (t.retried, "retried"),
            (t.dead_lettered - t.abandoned_dead_lettered, "dead-lettered"),
            (t.abandoned_dead_lettered, "abandoned"),
            (t.settlement_failed, "settlement failed"),
            (t.lease_lost, "lease lost"),
            (t.released, "released"),
        ];
        let faults = self
            .faults
            .iter()
            .zip(FAULT_NAMES)
            .map(|(n, name)| (*n, name));
        outcomes
            .into_iter()
            .chain(faults)
            .filter(|(count, _)| *count == 0)
            .map(|(_, name)| name)
            .collect()
    }
}

fn main() {
    // Handlers told to panic are part of the schedule; any other panic is
    // reported as usual.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied());
        if message != Some(HANDLER_PANIC) {
            default_hook(info);
        }
    }));
    let mut out = std::io::stderr();

    if let Some(seed) = env("SIM_SEED") {
        let trace: store::Trace = (std::env::var_os("SIM_TRACE").is_some()).then(Default::default);
        let result = run_one(seed, trace.clone());
        if let Some(trace) = trace {
            for line in trace.lock().unwrap().iter() {
                let _ = writeln!(out, "{line}");
            }
        }
        match &result {
            Ok(outcome) => {
                let _ = writeln!(
                    out,
                    "schedule {seed} passed: {} messages, {} coordinators, {} handler runs; {}",
                    outcome.messages, outcome.incarnations, outcome.handler_runs, outcome.totals
                );
            }
            Err(failure) => {
                print_failure(&mut out, seed, failure);
                std::process::exit(1);
            }
        }
        return;
    }

    let schedules = env("SIM_SCHEDULES").unwrap_or(10_000);
    let first = env("SIM_FIRST").unwrap_or(0);
    let threads = env("SIM_THREADS")
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u64))
        .clamp(1, 64);
    let started = Instant::now();
    let next = Arc::new(AtomicU64::new(first));
    let end = first + schedules;
    let summary = Arc::new(Mutex::new(Summary::default()));
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let next = next.clone();
            let summary = summary.clone();
            std::thread::spawn(move || {
                loop {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= end {
                        break;
                    }
                    let result = run_one(seed, None);
                    if let Err(failure) = &result {
                        print_failure(&mut std::io::stderr(), seed, failure);
                    }
                    summary.lock().unwrap().add(seed, result);
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().expect("a simulation thread finished");
    }
    let elapsed = started.elapsed();
    let summary = summary.lock().unwrap();
    let _ = writeln!(
        out,
        "simulation: {} schedules (seeds {first}..{end}) on {threads} threads in {:.1} s: \
         {} failed; {} messages, {} coordinators, {} handler runs",
        summary.schedules,
        elapsed.as_secs_f64(),
        summary.failures.len(),
        summary.messages,
        summary.incarnations,
        summary.handler_runs,
    );
    let _ = writeln!(out, "simulation outcomes: {}", summary.totals);
    let faults: Vec<String> = summary
        .faults
        .iter()
        .zip(FAULT_NAMES)
        .map(|(count, name)| format!("{name} {count}"))
        .collect();
    let _ = writeln!(
        out,
        "simulation faults: {}; writes applied after the lease ended on the clock \
         (caller's now read before a delay) {}",
        faults.join(", "),
        summary.stale_now_writes
    );
    if !summary.failures.is_empty() {
        let _ = writeln!(out, "\nfailed schedules; replay one with:");
        for (seed, _) in summary.failures.iter().take(20) {
            let _ = writeln!(out, "  {}", replay_command(*seed));
        }
        std::process::exit(1);
    }
    let uncovered = summary.uncovered();
    if schedules >= 1_000 && !uncovered.is_empty() {
        let _ = writeln!(
            out,
            "simulation never went through: {} (the schedules no longer exercise them)",
            uncovered.join(", ")
        );
        std::process::exit(1);
    }
}
