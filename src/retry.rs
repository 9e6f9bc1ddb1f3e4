//! When a failed delivery is tried again, and how long it waits.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{ConfigViolation, DeliveryError};
use crate::limits::{DEFAULT_MAX_ATTEMPTS, MAX_DURATION};

/// A predicate that decides whether an error is worth another attempt.
pub type ShouldRetry = Arc<dyn Fn(&DeliveryError) -> bool + Send + Sync>;

/// Retry policy: attempt cap, exponential backoff with a cap and jitter, and
/// an optional should-retry predicate.
///
/// The drain's policy applies to events and to jobs without a policy of their
/// own; a [`Job`](crate::Job) that declares one is governed by it alone.
///
/// The delay after the `n`th failed attempt is
/// `min(initial_delay * multiplier^(n-1), max_delay)`, then reduced by up to
/// `jitter` of itself. Jitter is a pure function of `seed`, the message id and
/// the attempt, so a seeded policy gives exact, repeatable delays.
///
/// # Attempt cap
///
/// The cap on a message's attempts is, first to be given wins:
///
/// 1. the message's own, given at enqueue
///    ([`NewMessage::with_max_attempts`](crate::NewMessage::with_max_attempts));
/// 2. its job's policy's `max_attempts` (stamped on the message at enqueue by
///    [`NewMessage::job`](crate::NewMessage::job));
/// 3. the drain's `retry.max_attempts`, which can raise or lower it;
/// 4. [`DEFAULT_MAX_ATTEMPTS`] (25).
///
/// The default policy (1 s doubling, capped at 3 h, jitter 0.2) with 25
/// attempts keeps a message at least 27 h 38 min before it is dead-lettered
/// (34 h 33 min without jitter),
/// even when jitter shortens every delay by its full 20 %
/// ([`RetryPolicy::shortest_total_delay`]).
#[derive(Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryPolicy {
    /// Attempts allowed in all, for messages enqueued without a cap of their
    /// own; `None` means [`DEFAULT_MAX_ATTEMPTS`]. It can raise the cap as
    /// well as lower it; see "Attempt cap" above.
    pub max_attempts: Option<u32>,
    /// Delay after the first failure.
    #[serde(with = "humantime_serde")]
    pub initial_delay: Duration,
    /// Growth factor per further failure; at least 1.
    pub multiplier: f64,
    /// Upper bound on any delay.
    #[serde(with = "humantime_serde")]
    pub max_delay: Duration,
    /// Fraction (0 to 1) by which a delay may be shortened at random, so
    /// failures that happened together do not retry together.
    pub jitter: f64,
    /// Seed for the jitter; `None` picks one per process.
    pub seed: Option<u64>,
    #[serde(skip)]
    should_retry: Option<ShouldRetry>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: None,
            initial_delay: Duration::from_secs(1),
            multiplier: 2.0,
            max_delay: Duration::from_secs(3 * 60 * 60),
            jitter: 0.2,
            seed: None,
            should_retry: None,
        }
    }
}

impl fmt::Debug for RetryPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryPolicy")
            .field("max_attempts", &self.max_attempts)
            .field("initial_delay", &self.initial_delay)
            .field("multiplier", &self.multiplier)
            .field("max_delay", &self.max_delay)
            .field("jitter", &self.jitter)
            .field("seed", &self.seed)
            .field("should_retry", &self.should_retry.as_ref().map(|_| "<fn>"))
            .finish()
    }
}

impl RetryPolicy {
    /// The same delay after every failure, no jitter.
    pub fn fixed(delay: Duration) -> Self {
        RetryPolicy {
            initial_delay: delay,
            multiplier: 1.0,
            max_delay: delay,
            jitter: 0.0,
            ..RetryPolicy::default()
        }
    }

    /// Retry immediately (the message is claimable again at once).
    pub fn immediate() -> Self {
        Self::fixed(Duration::ZERO)
    }

    /// Exponential backoff from `initial` growing by `multiplier`, capped at `max`.
    pub fn exponential(initial: Duration, multiplier: f64, max: Duration) -> Self {
        RetryPolicy {
            initial_delay: initial,
            multiplier,
            max_delay: max,
            ..RetryPolicy::default()
        }
    }

    /// Allow at most this many attempts in all.
    pub fn with_max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = Some(max_attempts);
        self
    }

    /// Shorten delays at random by up to this fraction (0 to 1).
    pub fn with_jitter(mut self, jitter: f64) -> Self {
        self.jitter = jitter;
        self
    }

    /// Fix the jitter seed, for repeatable delays.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Retry only errors for which `predicate` returns `true`; others are
    /// dead-lettered at once.
    pub fn with_should_retry(
        mut self,
        predicate: impl Fn(&DeliveryError) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.should_retry = Some(Arc::new(predicate));
        self
    }

    // `max_attempts_for`, the cap of one claimed message, is in
    // `message.rs`: it reads the message, which this module sits below.

    /// This policy's cap for messages without their own:
    /// `max_attempts`, or [`DEFAULT_MAX_ATTEMPTS`].
    pub fn attempt_cap(&self) -> u32 {
        self.max_attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS)
    }

    /// Whether a message that has been claimed `attempts` times, under a cap
    /// of `max_attempts` (see [`RetryPolicy::max_attempts_for`]), gets
    /// another attempt after `error`.
    pub fn allows_retry(&self, attempts: u32, max_attempts: u32, error: &DeliveryError) -> bool {
        attempts < max_attempts && self.should_retry.as_ref().is_none_or(|retry| retry(error))
    }

    /// The delay after the `attempts`th failure before jitter: what
    /// [`RetryPolicy::delay`] shortens at random.
    pub fn nominal_delay(&self, attempts: u32) -> Duration {
        let exponent = attempts.saturating_sub(1).min(1024) as i32;
        let base = self.initial_delay.as_secs_f64() * self.multiplier.powi(exponent);
        Duration::from_secs_f64(base.min(self.max_delay.as_secs_f64()).max(0.0))
    }

    /// The least time a message with `max_attempts` attempts can spend
    /// between its first attempt and its last, whatever the jitter: the sum
    /// of its `max_attempts - 1` delays, each shortened by the full
    /// `jitter`. Handler run time comes on top.
    pub fn shortest_total_delay(&self, max_attempts: u32) -> Duration {
        let keep = 1.0 - self.jitter.clamp(0.0, 1.0);
        (1..max_attempts)
            .map(|n| self.nominal_delay(n).mul_f64(keep))
            .sum()
    }

    /// The delay before the next attempt of message `id` after its
    /// `attempts`th failed attempt.
    pub fn delay(&self, attempts: u32, id: &str) -> Duration {
        let capped = self.nominal_delay(attempts).as_secs_f64();
        let jitter = self.jitter.clamp(0.0, 1.0) * unit_interval(self.seed(), id, attempts);
        Duration::from_secs_f64((capped * (1.0 - jitter)).max(0.0))
    }

    fn seed(&self) -> u64 {
        self.seed.unwrap_or_else(|| *PROCESS_SEED)
    }

    /// Append every broken rule to `out`.
    pub(crate) fn check(&self, out: &mut Vec<ConfigViolation>) {
        let mut bad = |field, rule: String| out.push(ConfigViolation { field, rule });
        if self.max_attempts == Some(0) {
            bad("retry.max_attempts", "must be at least 1 (0 given)".into());
        }
        if !self.multiplier.is_finite() || self.multiplier < 1.0 {
            bad(
                "retry.multiplier",
                format!("must be a finite number >= 1 ({} given)", self.multiplier),
            );
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            bad(
                "retry.jitter",
                format!("must be between 0 and 1 ({} given)", self.jitter),
            );
        }
        if self.initial_delay > self.max_delay {
            bad(
                "retry.initial_delay",
                format!(
                    "must not exceed retry.max_delay ({} > {})",
                    humantime::format_duration(self.initial_delay),
                    humantime::format_duration(self.max_delay)
                ),
            );
        }
        if self.max_delay > MAX_DURATION {
            bad(
                "retry.max_delay",
                format!(
                    "must be at most {}",
                    humantime::format_duration(MAX_DURATION)
                ),
            );
        }
    }
}

static PROCESS_SEED: std::sync::LazyLock<u64> =
    std::sync::LazyLock::new(|| uuid::Uuid::new_v4().as_u64_pair().0);

/// A number in `[0, 1)` that depends only on its inputs.
fn unit_interval(seed: u64, id: &str, attempts: u32) -> f64 {
    // FNV-1a over the id, then a splitmix64 finalizer: stable across
    // processes and platforms, unlike std's randomly keyed hasher.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in id.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let mut z = seed ^ hash ^ (u64::from(attempts) << 32);
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_caps() {
        let policy = RetryPolicy::exponential(Duration::from_secs(1), 2.0, Duration::from_secs(10))
            .with_jitter(0.0);
        let delays: Vec<_> = (1..=6).map(|n| policy.delay(n, "m").as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 10, 10]);
    }

    #[test]
    fn seeded_jitter_is_exact_and_bounded() {
        let policy = RetryPolicy::fixed(Duration::from_secs(10))
            .with_jitter(0.5)
            .with_seed(7);
        let a = policy.delay(3, "message-1");
        assert_eq!(a, policy.delay(3, "message-1"));
        assert_ne!(a, policy.delay(3, "message-2"));
        for n in 1..100 {
            let d = policy.delay(n, "message-1");
            assert!(
                d <= Duration::from_secs(10) && d >= Duration::from_secs(5),
                "{d:?}"
            );
        }
    }

    #[test]
    fn default_budget_outlasts_a_day_with_the_worst_jitter() {
        let policy = RetryPolicy::default();
        let day = Duration::from_secs(24 * 60 * 60);
        let shortest = policy.shortest_total_delay(DEFAULT_MAX_ATTEMPTS);
        assert!(shortest >= day, "{shortest:?}");
        // The bound holds for the delays actually drawn, for any seed and id.
        for seed in 0..200u64 {
            let seeded = policy.clone().with_seed(seed);
            let id = format!("message-{seed}");
            let total: Duration = (1..DEFAULT_MAX_ATTEMPTS)
                .map(|n| seeded.delay(n, &id))
                .sum();
            assert!(total >= shortest, "seed {seed}: {total:?} < {shortest:?}");
        }
        // Each delay: doubling from 1 s, capped at 3 h.
        let nominal: Vec<u64> = (1..DEFAULT_MAX_ATTEMPTS)
            .map(|n| policy.nominal_delay(n).as_secs())
            .collect();
        assert_eq!(&nominal[..3], [1, 2, 4]);
        assert_eq!(nominal[12], 4096);
        assert_eq!(nominal[13], 8192);
        assert!(nominal[14..].iter().all(|&d| d == 3 * 60 * 60));
        assert_eq!(shortest.as_secs(), 99_506);
    }

    #[test]
    fn attempt_cap_bounds_retries() {
        let error = DeliveryError::msg("boom");
        let policy = RetryPolicy::default();
        assert!(policy.allows_retry(4, 5, &error));
        assert!(!policy.allows_retry(5, 5, &error));
        assert!(policy.allows_retry(24, 25, &error));
        let picky = RetryPolicy::default().with_should_retry(|e| !e.to_string().contains("fatal"));
        assert!(!picky.allows_retry(1, 5, &DeliveryError::msg("fatal: no")));
        assert!(picky.allows_retry(1, 5, &error));
    }
}
