//! How a drain runs: batch size, concurrency, lease, heartbeat, limits.
//!
//! Deserializable with serde; durations are humantime strings (`"30s"`,
//! `"5m"`, `"1h 30m"`). [`DrainConfig::validate`] reports every broken rule
//! at once, each naming its field.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{ConfigError, ConfigViolation};
use crate::limits::{MAX_DURATION, MIN_LEASE};
use crate::message::OnDeadLetter;
use crate::queue::{DEFAULT_QUEUE, QueueConfig, check_queue_name};
use crate::retry::RetryPolicy;

/// The most messages [`DrainConfig::prefetch`] may hold: each is a claimed
/// row whose lease runs while it waits.
pub(crate) const MAX_PREFETCH: usize = 4096;

/// The most claims [`DrainConfig::claims_in_flight`] may allow at once: each
/// holds a store connection while it runs.
const MAX_CLAIMS_IN_FLIGHT: usize = 64;

/// Drain settings. `Default` gives the documented defaults.
///
/// ```
/// let config: outbox::DrainConfig = serde_json::from_str(
///     r#"{ "concurrency": 16, "lease": "45s", "max_active": "10m" }"#,
/// ).unwrap();
/// config.validate().unwrap();
/// assert_eq!(config.heartbeat(), std::time::Duration::from_secs(15));
/// ```
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DrainConfig {
    /// Most messages one pass claims (delivered and abandoned together). Default 100.
    pub batch_size: usize,
    /// Handlers running at once; at most `batch_size`. A delivery whose
    /// handler returned settles without holding a slot, so the next message
    /// starts while it does (up to `concurrency + prefetch` deliveries settle
    /// at once behind the running handlers). Default 1.
    pub concurrency: usize,
    /// Messages claimed ahead of free handler slots, at most 4096. They wait,
    /// in claim order, for a slot, so a handler starts as soon as one
    /// frees instead of after a claim's round-trip, and claims are larger
    /// and fewer; the same number more deliveries may be settling at once.
    /// Their heartbeat starts with their handler: one that waited until less
    /// than a heartbeat interval (plus the claim's own time) of its lease is
    /// left is given back undelivered, and all are given back at shutdown.
    /// Default `None`: the drain sizes it as it runs, from the rate handlers
    /// start at and the claims' round trip, never to wait longer than a
    /// quarter of the heartbeat interval and never more than the store's
    /// bound ([`OutboxStore::prefetch_limit`](crate::OutboxStore::prefetch_limit));
    /// `Some(0)` claims only for free slots.
    pub prefetch: Option<usize>,
    /// Claims a pass may have in flight at once, 1 to 64. With more than
    /// one, the free slots (`concurrency + prefetch`) are claimed in shares
    /// of `(concurrency + prefetch) / claims_in_flight`, and a claim goes out
    /// while others still run, as soon as a share of slots is free: a
    /// store whose claim is bound by a durable commit's round-trip (such as
    /// PostgreSQL with `fsync` on) overlaps those waits, and the commits of
    /// concurrent claims share a flush. Each claim holds a store connection
    /// while it runs. Default `None`: what the store says suits it
    /// ([`OutboxStore::claim_parallelism`](crate::OutboxStore::claim_parallelism)).
    pub claims_in_flight: Option<usize>,
    /// How long a claim owns a message unless renewed. Default 30 s.
    #[serde(with = "humantime_serde")]
    pub lease: Duration,
    /// Renewal interval; shorter than `lease`. Default `lease / 3`.
    #[serde(with = "humantime_serde")]
    pub heartbeat: Option<Duration>,
    /// Longest a single delivery may run before it is aborted. Default 300 s.
    #[serde(with = "humantime_serde")]
    pub max_active: Duration,
    /// Retry policy for events and for jobs without their own.
    pub retry: RetryPolicy,
    /// How settlement writes are retried.
    pub settlement: SettlementConfig,
    /// Drain by itself at this interval; `None` drains only on request and
    /// on wake-ups. Default none.
    #[serde(with = "humantime_serde")]
    pub every: Option<Duration>,
    /// Number of extra arbiters (threads) to spread deliveries over; 0 runs
    /// them on the coordinator's arbiter. Default 0.
    pub delivery_arbiters: usize,
    /// How ordering keys behave.
    pub ordering: OrderingConfig,
    /// How long settled messages are kept. Default: for ever (nothing is
    /// deleted; `outbox purge` still can).
    pub retention: RetentionConfig,
    /// The queues this drain serves, each with its own concurrency (and,
    /// optionally, retry policy). Empty (the default): the `default` queue
    /// alone, with `concurrency` handlers and the drain's `retry`. Naming
    /// any queue serves exactly the queues named, so name `default` too
    /// to keep serving it; `concurrency` then bounds nothing, and the
    /// queues' concurrencies together must not exceed `batch_size`.
    /// `prefetch` is shared among the queues in proportion to their
    /// concurrency.
    pub queues: BTreeMap<String, QueueConfig>,
}

/// How ordering keys behave (see
/// [`EnqueueOptions::ordering_key`](crate::EnqueueOptions::ordering_key)).
///
/// ```
/// let config: outbox::DrainConfig =
///     serde_json::from_str(r#"{ "ordering": { "on_dead_letter": "skip" } }"#).unwrap();
/// assert_eq!(config.ordering.on_dead_letter, outbox::OnDeadLetter::Skip);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OrderingConfig {
    /// What a dead-lettered message does to the later messages of its key:
    /// `block` (the default) holds them until the dead letter is requeued or
    /// skipped; `skip` lets them go on.
    pub on_dead_letter: OnDeadLetter,
}

/// How long settled messages are kept, and how the runtime deletes older
/// ones: in batches of at most `batch_size` rows, each a statement of its
/// own (no long lock), at most every `every`, beside the drain passes.
///
/// ```
/// let config: outbox::DrainConfig = serde_json::from_str(
///     r#"{ "retention": { "delivered": "7d", "dead_lettered": "30d" } }"#,
/// ).unwrap();
/// config.validate().unwrap();
/// assert_eq!(config.retention.delivered, Some(std::time::Duration::from_secs(7 * 86_400)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionConfig {
    /// Delete delivered messages this long after they were delivered, and
    /// cancelled ones this long after they were cancelled. Default: keep
    /// them.
    #[serde(with = "humantime_serde")]
    pub delivered: Option<Duration>,
    /// Delete dead-lettered messages this long after they were
    /// dead-lettered. Default: keep them.
    #[serde(with = "humantime_serde")]
    pub dead_lettered: Option<Duration>,
    /// Delete each delivered message in the write that settles it (fenced
    /// like any settlement: only while the claim still owns it), so no
    /// delivered row is left behind. Retention runs still delete delivered
    /// rows left by workers without this setting. A deleted message frees
    /// its idempotency key and lets the next message of its ordering key
    /// go. Not with `delivered`.
    pub delete_on_delivery: bool,
    /// Most rows one delete statement removes; 1 to 10 000. Default 1 000.
    pub batch_size: usize,
    /// Time between retention runs. Default 60 s.
    #[serde(with = "humantime_serde")]
    pub every: Duration,
    /// Once this many rows were deleted (by retention runs and at delivery)
    /// since the last time, a retention run ends with
    /// [`OutboxStore::vacuum`](crate::OutboxStore::vacuum): on PostgreSQL a
    /// plain `VACUUM` of the table, so the space of deleted rows is reused
    /// at once rather than when autovacuum next gets to the table, and the
    /// table stays the size its live rows need. It reads the table's
    /// changed pages and its indexes, beside the traffic; `0` leaves the
    /// table to autovacuum alone. Other stores reuse freed space by
    /// themselves. Default 10 000.
    pub vacuum_after: u64,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig {
            delivered: None,
            dead_lettered: None,
            delete_on_delivery: false,
            batch_size: 1_000,
            every: Duration::from_secs(60),
            vacuum_after: 10_000,
        }
    }
}

impl RetentionConfig {
    /// How long delivered messages are kept, if they are deleted at all.
    pub fn delivered_horizon(&self) -> Option<Duration> {
        if self.delete_on_delivery {
            Some(Duration::ZERO)
        } else {
            self.delivered
        }
    }

    /// `true` when some settled messages are to be deleted.
    pub fn is_enabled(&self) -> bool {
        self.delivered_horizon().is_some() || self.dead_lettered.is_some()
    }

    fn check(&self, out: &mut Vec<ConfigViolation>) {
        let mut bad = |field, rule: String| out.push(ConfigViolation { field, rule });
        let show = |d: Duration| humantime::format_duration(d).to_string();
        if self.delete_on_delivery && self.delivered.is_some() {
            bad(
                "retention.delete_on_delivery",
                "cannot be set with retention.delivered; keep one of the two".into(),
            );
        }
        if !(1..=10_000).contains(&self.batch_size) {
            bad(
                "retention.batch_size",
                format!("must be between 1 and 10000 ({} given)", self.batch_size),
            );
        }
        if self.every.is_zero() {
            bad("retention.every", "must be longer than zero".into());
        }
        let limits = [
            ("retention.delivered", self.delivered),
            ("retention.dead_lettered", self.dead_lettered),
            ("retention.every", Some(self.every)),
        ];
        for (field, value) in limits {
            if let Some(value) = value.filter(|v| *v > MAX_DURATION) {
                bad(
                    field,
                    format!(
                        "must be at most {} ({} given)",
                        show(MAX_DURATION),
                        show(value)
                    ),
                );
            }
        }
    }
}

impl Default for DrainConfig {
    fn default() -> Self {
        DrainConfig {
            batch_size: 100,
            concurrency: 1,
            prefetch: None,
            claims_in_flight: None,
            lease: Duration::from_secs(30),
            heartbeat: None,
            max_active: Duration::from_secs(300),
            retry: RetryPolicy::default(),
            settlement: SettlementConfig::default(),
            every: None,
            delivery_arbiters: 0,
            ordering: OrderingConfig::default(),
            retention: RetentionConfig::default(),
            queues: BTreeMap::new(),
        }
    }
}

/// How settlement writes are retried when the store fails transiently.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SettlementConfig {
    /// Attempts per settlement. Default 3.
    pub attempts: u32,
    /// Delay before the second attempt, doubling after each. Default 100 ms.
    #[serde(with = "humantime_serde")]
    pub delay: Duration,
}

impl Default for SettlementConfig {
    fn default() -> Self {
        SettlementConfig {
            attempts: 3,
            delay: Duration::from_millis(100),
        }
    }
}

impl DrainConfig {
    /// The renewal interval: as configured, or a third of the lease (at least 1 ms).
    pub fn heartbeat(&self) -> Duration {
        self.heartbeat
            .unwrap_or_else(|| (self.lease / 3).max(Duration::from_millis(1)))
    }

    /// The queues served, by name, with their concurrency and retry policy:
    /// those of [`DrainConfig::queues`], or when it names none, the
    /// `default` queue with [`DrainConfig::concurrency`].
    pub fn served_queues(&self) -> BTreeMap<String, QueueConfig> {
        if self.queues.is_empty() {
            BTreeMap::from([(DEFAULT_QUEUE.to_owned(), QueueConfig::new(self.concurrency))])
        } else {
            self.queues.clone()
        }
    }

    /// Handlers running at once over every queue served.
    pub fn total_concurrency(&self) -> usize {
        if self.queues.is_empty() {
            self.concurrency
        } else {
            self.queues.values().map(|queue| queue.concurrency).sum()
        }
    }

    /// Check every rule; the error lists all violations, each naming its field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut out = Vec::new();
        let mut bad = |field, rule: String| out.push(ConfigViolation { field, rule });
        let show = |d: Duration| humantime::format_duration(d).to_string();

        if self.batch_size == 0 {
            bad("batch_size", "must be at least 1 (0 given)".into());
        }
        if self.concurrency == 0 {
            bad("concurrency", "must be at least 1 (0 given)".into());
        } else if self.concurrency > self.batch_size && self.batch_size > 0 {
            bad(
                "concurrency",
                format!(
                    "must not exceed batch_size ({} > {})",
                    self.concurrency, self.batch_size
                ),
            );
        }
        if self.lease < MIN_LEASE {
            bad(
                "lease",
                format!(
                    "must be at least {} ({} given)",
                    show(MIN_LEASE),
                    show(self.lease)
                ),
            );
        }
        let heartbeat = self.heartbeat();
        // A heartbeat derived from a refused lease is wrong only because the
        // lease is: the lease's violation says all there is to fix.
        let derived_from_bad_lease = self.heartbeat.is_none() && self.lease < MIN_LEASE;
        if !derived_from_bad_lease {
            if heartbeat.is_zero() {
                bad("heartbeat", "must be longer than zero".into());
            } else if heartbeat >= self.lease {
                bad(
                    "heartbeat",
                    format!(
                        "must be shorter than lease ({} >= {})",
                        show(heartbeat),
                        show(self.lease)
                    ),
                );
            }
        }
        if self.max_active.is_zero() {
            bad("max_active", "must be longer than zero".into());
        }
        if self.settlement.attempts == 0 {
            bad("settlement.attempts", "must be at least 1 (0 given)".into());
        }
        if self.settlement.delay.is_zero() {
            bad("settlement.delay", "must be longer than zero".into());
        }
        if self.every.is_some_and(|every| every.is_zero()) {
            bad("every", "must be longer than zero, or unset".into());
        }
        if let Some(prefetch) = self.prefetch.filter(|&p| p > MAX_PREFETCH) {
            bad(
                "prefetch",
                format!("must be at most {MAX_PREFETCH} ({prefetch} given), or unset"),
            );
        }
        if let Some(claims) = self
            .claims_in_flight
            .filter(|c| !(1..=MAX_CLAIMS_IN_FLIGHT).contains(c))
        {
            bad(
                "claims_in_flight",
                format!("must be between 1 and {MAX_CLAIMS_IN_FLIGHT} ({claims} given), or unset"),
            );
        }
        if self.delivery_arbiters > 256 {
            bad(
                "delivery_arbiters",
                format!("must be at most 256 ({} given)", self.delivery_arbiters),
            );
        }
        let limits = [
            ("lease", Some(self.lease)),
            ("heartbeat", self.heartbeat),
            ("max_active", Some(self.max_active)),
            ("settlement.delay", Some(self.settlement.delay)),
            ("every", self.every),
        ];
        for (field, value) in limits {
            if let Some(value) = value.filter(|v| *v > MAX_DURATION) {
                bad(
                    field,
                    format!(
                        "must be at most {} ({} given)",
                        show(MAX_DURATION),
                        show(value)
                    ),
                );
            }
        }
        self.retry.check(&mut out);
        self.retention.check(&mut out);
        self.check_queues(&mut out);

        if out.is_empty() {
            Ok(())
        } else {
            Err(ConfigError { violations: out })
        }
    }

    /// The rules of [`DrainConfig::queues`]: valid names, at least one
    /// handler each, no more handlers in all than a pass claims.
    fn check_queues(&self, out: &mut Vec<ConfigViolation>) {
        let mut bad = |field, rule: String| out.push(ConfigViolation { field, rule });
        for (name, queue) in &self.queues {
            if let Err(error) = check_queue_name("queues", name) {
                bad("queues", error.to_string());
            }
            if queue.concurrency == 0 {
                bad(
                    "queues.concurrency",
                    format!("must be at least 1 (0 given for queue {name:?})"),
                );
            }
            if let Some(retry) = &queue.retry {
                let mut rules = Vec::new();
                retry.check(&mut rules);
                for rule in rules {
                    bad(
                        "queues.retry",
                        format!("{} (queue {name:?}): {}", rule.field, rule.rule),
                    );
                }
            }
        }
        let total = self.total_concurrency();
        if !self.queues.is_empty() && total > self.batch_size && self.batch_size > 0 {
            bad(
                "queues.concurrency",
                format!(
                    "the queues' concurrencies add up to {total}, more than batch_size ({})",
                    self.batch_size
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests;
