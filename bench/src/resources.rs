//! What a run costs the machine, read from `/proc` (Linux only; elsewhere
//! every reading is `None`): the CPU time of this process and of the whole
//! machine over a timed span, and the process's peak resident set size.

use std::time::Duration;

/// A timed span's wall time and the CPU time spent while it ran.
#[derive(Debug, Clone, Copy)]
pub struct Timed {
    /// The span's own measure of its time.
    pub elapsed: Duration,
    /// CPU time of every thread of this process (a store's worker threads
    /// included, a database server's not).
    pub cpu: Option<Duration>,
    /// CPU time of the whole machine: this process, a database server on
    /// the same machine, and anything else running then.
    pub machine_cpu: Option<Duration>,
}

/// Runs `span`, which times itself, and adds the CPU time the process and
/// the machine spent while it ran.
pub async fn with_cpu(span: impl Future<Output = Duration>) -> Timed {
    let before = (process_cpu(), machine_cpu());
    let elapsed = span.await;
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
/// (`/proc/self/task/*/schedstat`), to the nanosecond. A thread that exits
/// takes its share along, so measure across spans in which the threads
/// that work (the store's included) stay up.
pub fn process_cpu() -> Option<Duration> {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let Ok(stat) = std::fs::read_to_string(task.ok()?.path().join("schedstat")) else {
            continue;
        };
        total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(Duration::from_nanos(total))
}

/// The user and system time this process has spent, every thread it ever
/// ran included, the ones that have exited too: what
/// `getrusage(RUSAGE_SELF)` reports, read from `/proc/self/stat` (in the
/// kernel's 10 ms ticks) so no `unsafe` is needed. Unlike [`process_cpu`]
/// it can measure a span whose threads come and go (a runtime built for
/// it), at the cost of resolution: measure spans of seconds.
pub fn process_user_system_cpu() -> Option<Duration> {
    /// Ticks per second of the `/proc` counters (`USER_HZ`), fixed at 100
    /// on Linux whatever the kernel's own tick.
    const USER_HZ: u64 = 100;
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name, in parentheses, may hold spaces: count the fields
    // after it. `utime` and `stime` are the 14th and 15th fields.
    let mut after_name = stat.rsplit_once(')')?.1.split_whitespace().skip(11);
    let user: u64 = after_name.next()?.parse().ok()?;
    let system: u64 = after_name.next()?.parse().ok()?;
    Some(Duration::from_millis((user + system) * 1000 / USER_HZ))
}

/// Runs `span` and also returns the user and system time the process spent
/// meanwhile ([`process_user_system_cpu`]): the span's own CPU when nothing
/// else in the process works while it runs.
pub async fn with_user_system_cpu<T>(span: impl Future<Output = T>) -> (T, Option<Duration>) {
    let before = process_user_system_cpu();
    let out = span.await;
    let spent = process_user_system_cpu()
        .zip(before)
        .map(|(after, before)| after.saturating_sub(before));
    (out, spent)
}

/// The machine's CPU counters from `/proc/stat`, summed over its CPUs.
struct MachineCpu {
    /// Time spent running anything: user, nice, system, irq and softirq.
    busy: u64,
    /// That, plus idle, I/O wait and time stolen by the hypervisor.
    total: u64,
    /// The CPUs the counters sum over.
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

/// The process's peak resident set size so far (`VmHWM`), in MiB.
pub fn peak_rss_mib() -> Option<f64> {
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
/// one measured part allocated does not count against the next; `false` if
/// it could not.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}
