//! The JSON objects of the `bench` binary: one per measured point, and a
//! sweep's list of them, which `bench_plot` reads back. One definition for
//! both, so the writer and the reader cannot drift apart.

use serde::{Deserialize, Serialize};

/// One (store, concurrency) point: the runtime's figures beside its
/// same-run baseline's. Fields are printed in this order; a side that did
/// not run (`--only`) has `null` figures.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    /// `memory`, `sqlite` or `postgres`.
    pub store: String,
    /// Messages drained by each side.
    pub messages: u64,
    /// Deliveries the runtime had in flight at once.
    pub concurrency: usize,
    /// `batch_size` of the runtime's passes.
    pub batch: usize,
    /// `prefetch` of the runtime's drain; `None`: sized by the drain.
    pub prefetch: Option<usize>,
    /// `claims_in_flight` of the runtime's drain; `None`: the store's choice.
    pub claims_in_flight: Option<usize>,
    /// The schedule the runtime drained on, or `None` for a `Drain` loop.
    pub schedule_ms: Option<u64>,
    /// Each side's PostgreSQL pool size, when given.
    pub pool: Option<u32>,
    /// Whether the runtime deleted each message as it settled it.
    pub delete_on_delivery: bool,
    /// Messages per second of the runtime.
    pub runtime_per_sec: Option<f64>,
    /// Messages per second of the baseline.
    pub baseline_per_sec: Option<f64>,
    /// `runtime_per_sec / baseline_per_sec`, when both ran.
    pub ratio: Option<f64>,
    /// CPU time of the process (every thread: the runtime, the store's
    /// workers, the client) per message while the runtime drained, µs. On
    /// PostgreSQL the server's work is not in it.
    pub runtime_cpu_us_per_message: Option<f64>,
    /// The same for the baseline.
    pub baseline_cpu_us_per_message: Option<f64>,
    /// CPU time of the whole machine per message while the runtime
    /// drained, µs: with a PostgreSQL server on the same machine, its work
    /// is in it. Anything else running then is too.
    pub runtime_machine_cpu_us_per_message: Option<f64>,
    /// The same for the baseline.
    pub baseline_machine_cpu_us_per_message: Option<f64>,
    /// The runtime's committed transactions per message (PostgreSQL).
    pub commits_per_message: Option<f64>,
    /// The baseline's, for comparison (PostgreSQL).
    pub baseline_commits_per_message: Option<f64>,
    /// The runtime's write-ahead log per message, bytes (PostgreSQL).
    pub wal_bytes_per_message: Option<f64>,
    /// The baseline's (PostgreSQL).
    pub baseline_wal_bytes_per_message: Option<f64>,
    /// The process's peak RSS (`VmHWM`), MiB.
    pub peak_rss_mib: Option<f64>,
    /// The runtime side's peak RSS over its fill and drain, MiB.
    pub runtime_peak_rss_mib: Option<f64>,
    /// The baseline side's, MiB.
    pub baseline_peak_rss_mib: Option<f64>,
}

/// The last line of a sweep: every point's object, in the order measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SweepSummary {
    /// Messages drained by each side at each point.
    pub messages: u64,
    /// The concurrencies measured, for each store.
    pub concurrencies: Vec<usize>,
    /// The PNG drawn, if any.
    pub plot: Option<String>,
    /// Every point, store by store, each store's in the order of
    /// `concurrencies`.
    pub points: Vec<Summary>,
}

/// What drove the runtime's passes, in words: `a Drain loop`, or
/// `schedule 500ms`.
pub fn driven_by(schedule: Option<std::time::Duration>) -> String {
    schedule.map_or_else(
        || "a Drain loop".to_owned(),
        |every| format!("schedule {every:?}"),
    )
}
