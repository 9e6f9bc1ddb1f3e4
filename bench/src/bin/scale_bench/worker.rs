//! One drain process: `scale_bench --worker` as the parent starts it.
//!
//! It opens its pool, says `ready` on standard output, waits for a line
//! on standard input, then drains the shared table with the actor runtime
//! (`Drain` after `Drain`, as passes that spend their batch follow one
//! another) until a pass claims nothing and nothing is pending, and prints
//! one JSON line: what it delivered and the CPU time it spent.

use std::io::BufRead;
use std::sync::Arc;
use std::time::Duration;

use outbox::{
    Clock, DeliveryContext, DrainConfig, Event, InProcessBus, OutboxAdmin, Registry, SystemClock,
};
use outbox_actors::{Drain, DrainCoordinator, GetStatus, Shutdown};
use outbox_bench::args::Flags;
use outbox_bench::report::print_json;
use outbox_bench::resources::process_cpu;
use outbox_bench::store::postgres;
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgPoolOptions;

/// The message the benchmark fills the table with; its handler does nothing.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Tick {
    pub(crate) n: u64,
}

impl Event for Tick {
    const NAME: &'static str = "scale.tick";
}

/// What a worker prints when it is done.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Done {
    /// Messages this process delivered.
    pub(crate) delivered: u64,
    /// CPU time of this process while it drained, µs.
    pub(crate) cpu_us: Option<u64>,
}

/// A worker's settings, from the flags after `--worker`.
pub(crate) struct Worker {
    pub(crate) table: String,
    pub(crate) concurrency: usize,
    pub(crate) batch: usize,
    pub(crate) pool: u32,
}

impl Worker {
    /// The flags the parent passes (see [`Worker::args`]).
    pub(crate) fn parse(mut flags: Flags) -> Result<Self, String> {
        let mut worker = Worker {
            table: String::new(),
            concurrency: 1,
            batch: 100,
            pool: 3,
        };
        while let Some(flag) = flags.next_flag() {
            match flag.as_str() {
                "--table" => worker.table = flags.value(&flag)?,
                "--concurrency" => worker.concurrency = flags.parse(&flag)?,
                "--batch" => worker.batch = flags.parse(&flag)?,
                "--pool" => worker.pool = flags.parse(&flag)?,
                other => return Err(format!("--worker: unknown argument {other:?}")),
            }
        }
        if worker.table.is_empty() {
            return Err("--worker needs --table".to_owned());
        }
        Ok(worker)
    }

    /// The command line that starts this worker.
    pub(crate) fn args(&self) -> Vec<String> {
        vec![
            "--worker".to_owned(),
            "--table".to_owned(),
            self.table.clone(),
            "--concurrency".to_owned(),
            self.concurrency.to_string(),
            "--batch".to_owned(),
            self.batch.to_string(),
            "--pool".to_owned(),
            self.pool.to_string(),
        ]
    }

    /// Runs the worker to the end; exits the process on a failure.
    pub(crate) fn run(self, url: &str) {
        let system = actix_rt::System::new();
        let store = system.block_on(async {
            let store = postgres::store(
                url,
                &self.table,
                PgPoolOptions::new().max_connections(self.pool),
                false,
            );
            // A connection open before the clock starts.
            store
                .stats(SystemClock.now())
                .await
                .expect("the worker reaches the table");
            store
        });
        println!("ready");
        let mut go = String::new();
        std::io::stdin()
            .lock()
            .read_line(&mut go)
            .expect("the parent says go");
        let cpu_before = process_cpu();
        let delivered = system.block_on(async {
            let coordinator = DrainCoordinator::builder(store.clone())
                .registry(
                    Registry::builder()
                        .event::<Tick>()
                        .build()
                        .expect("registry"),
                )
                .event_bus(
                    InProcessBus::new().on(|_: Arc<Tick>, _: DeliveryContext| async { Ok(()) }),
                )
                .config(DrainConfig {
                    concurrency: self.concurrency,
                    batch_size: self.batch,
                    ..DrainConfig::default()
                })
                .wake_on_insert(false)
                .start()
                .expect("the coordinator starts");
            loop {
                let report = coordinator
                    .send(Drain)
                    .await
                    .expect("the coordinator answers")
                    .expect("a pass runs");
                // Others hold what is claimed and not delivered yet: this
                // process is done once nothing is left to claim.
                if report.claimed == 0
                    && store
                        .stats(SystemClock.now())
                        .await
                        .expect("the table answers")
                        .pending
                        == 0
                {
                    break;
                }
            }
            let delivered = coordinator
                .send(GetStatus)
                .await
                .expect("the coordinator answers")
                .totals
                .delivered;
            coordinator
                .send(Shutdown {
                    grace: Duration::from_secs(5),
                })
                .await
                .expect("the coordinator stops");
            delivered
        });
        let cpu_us = process_cpu()
            .zip(cpu_before)
            .map(|(after, before)| after.saturating_sub(before).as_micros() as u64);
        system.block_on(store.pool().close());
        print_json(&Done { delivered, cpu_us });
    }
}
