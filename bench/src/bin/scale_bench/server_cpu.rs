//! The CPU time a PostgreSQL server on this machine spent, from `/proc`:
//! the postmaster and every process it started (backends, the WAL writer,
//! the checkpointer, autovacuum), living or gone.
//!
//! A process's `/proc/PID/stat` counts its own time and, once it has reaped
//! them, the time of its children that exited. The postmaster reaps every
//! backend, so the server's total at any moment is the postmaster's four
//! counters plus those of its living children; the difference of two such
//! totals is what the server spent in between, including backends that
//! started and ended meanwhile.

use std::time::Duration;

/// A server on this machine, found through the backend of a connection.
pub(crate) struct ServerCpu {
    /// The postmaster's process id.
    postmaster: u32,
    /// Clock ticks per second of the counters (`getconf CLK_TCK`).
    ticks_per_sec: f64,
}

/// `/proc/PID/stat` after the command name (which may hold spaces and
/// parentheses): the process's state is field 0, its parent field 1, its
/// user and system time fields 11 and 12, its reaped children's 13 and 14.
fn stat(pid: u32) -> Option<Vec<u64>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &text[text.rfind(')')? + 1..];
    Some(
        after_name
            .split_whitespace()
            .skip(1)
            .map(|field| field.parse().unwrap_or(0))
            .collect(),
    )
}

/// The parent and the four time counters (user, system, reaped children's
/// user and system) of `pid`, in ticks.
fn times(pid: u32) -> Option<(u32, u64)> {
    let fields = stat(pid)?;
    let parent = u32::try_from(*fields.first()?).ok()?;
    Some((parent, fields.get(10..14)?.iter().sum()))
}

impl ServerCpu {
    /// The server whose backend `backend` is (`pg_backend_pid()` of a
    /// connection), when it runs on this machine and `/proc` shows it.
    pub(crate) fn of_backend(backend: u32) -> Option<Self> {
        let (postmaster, _) = times(backend)?;
        let name = std::fs::read_to_string(format!("/proc/{postmaster}/comm")).ok()?;
        if !name.trim().starts_with("postgres") {
            return None;
        }
        Some(ServerCpu {
            postmaster,
            ticks_per_sec: ticks_per_sec(),
        })
    }

    /// The server's CPU time so far (see the module's note).
    pub(crate) fn total(&self) -> Option<Duration> {
        let (_, mut ticks) = times(self.postmaster)?;
        for entry in std::fs::read_dir("/proc").ok()?.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
                continue;
            };
            if let Some((parent, child)) = times(pid)
                && parent == self.postmaster
            {
                ticks += child;
            }
        }
        Some(Duration::from_secs_f64(ticks as f64 / self.ticks_per_sec))
    }
}

/// The kernel's clock ticks per second for `/proc` counters: `getconf
/// CLK_TCK`, or 100, which every Linux on common hardware uses.
fn ticks_per_sec() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|output| String::from_utf8(output.stdout).ok())
        .and_then(|text| text.trim().parse().ok())
        .filter(|&ticks: &f64| ticks > 0.0)
        .unwrap_or(100.0)
}
