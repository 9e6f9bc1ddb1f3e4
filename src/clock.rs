//! Where the runtime's wall-clock `now` comes from.
//!
//! All waiting uses tokio time; the timestamps handed to stores come from a
//! [`Clock`]. In production that is [`SystemClock`]. In tests it is
//! [`TokioClock`], which moves with tokio's `Instant`, so on a paused runtime
//! an hour of leases passes in a millisecond and every run is deterministic.

use std::fmt;
use std::sync::Arc;

use chrono::{DateTime, SubsecRound, Utc};

/// A source of wall-clock time for store operations.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current time, truncated to microseconds.
    fn now(&self) -> DateTime<Utc>;
}

/// A clock shared by the runtime's actors.
pub type SharedClock = Arc<dyn Clock>;

/// The operating system's clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        system_now()
    }
}

/// Wall time that advances with tokio's clock.
///
/// Fixed to `origin` when created; `now()` is `origin` plus the tokio time
/// elapsed since. With `tokio::time::pause()` (or a runtime built with
/// `start_paused(true)`), `tokio::time::advance` and auto-advance move it too.
#[derive(Debug, Clone)]
pub struct TokioClock {
    origin: DateTime<Utc>,
    started: tokio::time::Instant,
}

impl TokioClock {
    /// A clock reading `origin` now.
    pub fn starting_at(origin: DateTime<Utc>) -> Self {
        TokioClock {
            origin: origin.trunc_subsecs(6),
            started: tokio::time::Instant::now(),
        }
    }

    /// A clock reading the system time now.
    pub fn new() -> Self {
        Self::starting_at(system_now())
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now(&self) -> DateTime<Utc> {
        let elapsed = self.started.elapsed();
        // Elapsed tokio time is far below chrono's range (±262,000 years).
        let elapsed = chrono::Duration::from_std(elapsed).unwrap_or(chrono::Duration::MAX);
        (self.origin + elapsed).trunc_subsecs(6)
    }
}

/// The system time, truncated to microseconds: the finest precision every
/// store keeps, so a timestamp reads back exactly as it was written.
///
/// Read once or more per delivery, so it skips chrono's rounding: the
/// microseconds since the epoch are exact in an `i64` for ±292,000 years,
/// and a clock set before 1970 takes the slow path.
pub(crate) fn system_now() -> DateTime<Utc> {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()
        .and_then(|since| i64::try_from(since.as_micros()).ok())
        .and_then(DateTime::from_timestamp_micros)
        .unwrap_or_else(|| Utc::now().trunc_subsecs(6))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_now_is_the_system_time_to_the_microsecond() {
        let before = Utc::now().trunc_subsecs(6);
        let now = system_now();
        let after = Utc::now();
        assert_eq!(now.timestamp_subsec_nanos() % 1_000, 0);
        assert!(
            before <= now && now <= after,
            "{before} <= {now} <= {after}"
        );
    }
}
