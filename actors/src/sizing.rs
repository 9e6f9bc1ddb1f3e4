//! How much a drain claims ahead, and how many claims it overlaps, when its
//! config leaves `prefetch` or `claims_in_flight` unset.
//!
//! A claim costs a round trip and, on a durable store, a commit, whatever
//! it returns: claims of a few rows each spend the store on that overhead,
//! and a handler slot that frees waits a whole round trip for its next
//! message. Messages claimed ahead fix both, but wait for a slot with
//! their leases running. So the drain measures, as it runs, the rate its
//! handlers start at and how long its claims take, and keeps enough
//! messages waiting to cover [`WINDOW_ROUND_TRIPS`] claim round trips at
//! that rate, and lets room build up to a whole share before it claims
//! while the messages still waiting cover a couple of round trips: with fast
//! handlers that makes claims of hundreds of rows, with slow ones (whose
//! starts are rare next to a round trip) next to nothing beyond one message
//! per handler. Whatever the measurements, no message
//! is claimed to wait longer than a quarter of the heartbeat interval at the
//! measured rate, far from the point where a waiting message is given back
//! as stale.
//!
//! A store whose claims cost only CPU the handlers share (the memory
//! store) says so
//! ([`OutboxStore::claims_ahead`](outbox::OutboxStore::claims_ahead)), and
//! nothing is claimed ahead there: each message held costs memory and its
//! actors' CPU, for no wait to hide. A store bounds what is claimed ahead
//! ([`OutboxStore::prefetch_limit`](outbox::OutboxStore::prefetch_limit)):
//! on SQLite, whose claims wait for nothing but cost a transaction each,
//! claims need only be large enough for that cost to be small per message.
//!
//! Claims in flight come from the store
//! ([`OutboxStore::claim_parallelism`](outbox::OutboxStore::claim_parallelism)):
//! a store whose claims wait on a flush overlaps them, one with a single
//! writer gains nothing from it.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use outbox::DrainConfig;
use tokio::time::Instant;

/// Claim round trips the waiting messages cover at the measured rate. A
/// claim's round trip grows with its size, so the window grows with the
/// claims until fixed costs are small beside the rows'; a few round trips
/// more than the claims in flight keep every slot fed while claims queue
/// behind settlements for the store.
const WINDOW_ROUND_TRIPS: f64 = 16.0;

/// Claim round trips the waiting messages must still cover when a claim
/// waits for a whole share of room: two, so one slow claim does not leave
/// handlers idle.
const LOW_WATER_ROUND_TRIPS: f64 = 2.0;

/// How much of a new sample the averages take: enough to follow a change
/// within a few claims, little enough that one slow claim does not swing
/// the size.
const WEIGHT: f64 = 0.25;

/// Shortest span a rate sample is taken over: shorter ones, between two
/// claims that return together, say more about scheduling than about the
/// handlers.
const MIN_SPAN: Duration = Duration::from_millis(5);

/// A drain's claim sizing, shared by its passes so each starts from what
/// the last one measured.
#[derive(Debug)]
pub(crate) struct Sizing {
    /// `prefetch` as configured; `None` sizes it from the measurements.
    fixed_prefetch: Option<usize>,
    /// Claims a pass may have in flight.
    claims_in_flight: usize,
    /// Handlers that may run at once, over every queue served.
    concurrency: usize,
    /// The most a sized prefetch holds: the store's bound.
    limit: usize,
    /// A quarter of the heartbeat interval: the longest a message is
    /// claimed ahead to wait.
    longest_wait: Duration,
    /// Handler starts since the current rate sample began: counted on every
    /// start, so outside the lock.
    started: AtomicU64,
    measured: Mutex<Measured>,
}

#[derive(Debug, Default)]
struct Measured {
    /// Handler starts per second, averaged.
    rate: Option<f64>,
    /// Seconds a claim takes, averaged.
    round_trip: Option<f64>,
    /// Where the current rate sample began.
    since: Option<Instant>,
}

impl Sizing {
    /// Sizing for `config`, on a store that gives `claim_parallelism` for an
    /// unset `claims_in_flight`, says whether it `claims_ahead` at all, and
    /// bounds a sized prefetch at `prefetch_limit`.
    pub(crate) fn new(
        config: &DrainConfig,
        claim_parallelism: usize,
        claims_ahead: bool,
        prefetch_limit: usize,
    ) -> Self {
        Sizing {
            fixed_prefetch: config.prefetch.or((!claims_ahead).then_some(0)),
            claims_in_flight: config.claims_in_flight.unwrap_or(claim_parallelism).max(1),
            concurrency: config.total_concurrency().max(1),
            limit: prefetch_limit,
            longest_wait: config.heartbeat() / 4,
            started: AtomicU64::new(0),
            measured: Mutex::new(Measured::default()),
        }
    }

    /// Claims a pass may have in flight.
    pub(crate) fn claims_in_flight(&self) -> usize {
        self.claims_in_flight
    }

    /// Messages to claim ahead of free slots now.
    pub(crate) fn prefetch(&self) -> usize {
        if let Some(prefetch) = self.fixed_prefetch {
            return prefetch;
        }
        let measured = self.lock();
        let (Some(rate), Some(round_trip)) = (measured.rate, measured.round_trip) else {
            // Nothing measured yet: handlers may be slow enough that a
            // message waiting for one would see its lease run low.
            return 0;
        };
        let by_lease = rate * self.longest_wait.as_secs_f64();
        let window = rate * round_trip * WINDOW_ROUND_TRIPS;
        let floor = (self.concurrency as f64).min(by_lease);
        window.min(by_lease).max(floor).min(self.limit as f64) as usize
    }

    /// With a sized prefetch, the fewest waiting messages below which a
    /// claim goes out for whatever room is free: above it, a claim waits
    /// for a whole share of room, so claims are large and few while the
    /// waiting messages still cover [`LOW_WATER_ROUND_TRIPS`] round trips.
    /// `None` with a configured prefetch, whose claims go out for any room.
    pub(crate) fn low_water(&self) -> Option<usize> {
        if self.fixed_prefetch.is_some() {
            return None;
        }
        let measured = self.lock();
        let (rate, round_trip) = (measured.rate?, measured.round_trip?);
        Some((rate * round_trip * LOW_WATER_ROUND_TRIPS).ceil() as usize)
    }

    /// `count` handlers started.
    pub(crate) fn started(&self, count: u64) {
        if self.fixed_prefetch.is_none() {
            self.started.fetch_add(count, Ordering::Relaxed);
        }
    }

    /// A claim came back after `took`, at `now`.
    pub(crate) fn claimed(&self, took: Duration, now: Instant) {
        if self.fixed_prefetch.is_some() {
            return;
        }
        let mut measured = self.lock();
        measured.round_trip = Some(average(measured.round_trip, took.as_secs_f64()));
        match measured.since {
            Some(since) if now.duration_since(since) >= MIN_SPAN => {
                let span = now.duration_since(since).as_secs_f64();
                let rate = self.started.swap(0, Ordering::Relaxed) as f64 / span;
                measured.rate = Some(average(measured.rate, rate));
                measured.since = Some(now);
            }
            Some(_) => {}
            None => {
                self.started.store(0, Ordering::Relaxed);
                measured.since = Some(now);
            }
        }
    }

    /// A pass ended: the next one may start after a pause in which nothing
    /// was asked of the handlers, which says nothing of their rate.
    pub(crate) fn pass_ended(&self) {
        self.lock().since = None;
        self.started.store(0, Ordering::Relaxed);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Measured> {
        // The sizes are advice: after a panic elsewhere, what was measured
        // is as good as before.
        self.measured
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn average(old: Option<f64>, sample: f64) -> f64 {
    match old {
        Some(old) => old + WEIGHT * (sample - old),
        None => sample,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bound of a store that sets none (PostgreSQL's).
    const LIMIT: usize = 4096;

    fn sizing(config: DrainConfig) -> Sizing {
        Sizing::new(&config, 4, true, LIMIT)
    }

    fn config(concurrency: usize) -> DrainConfig {
        DrainConfig {
            concurrency,
            batch_size: concurrency.max(100),
            ..DrainConfig::default()
        }
    }

    /// Feeds `claims` claims of `took` each, `per_claim` handler starts
    /// between two, spaced by `took`.
    fn run(sizing: &Sizing, claims: u32, took: Duration, per_claim: u64) {
        let start = Instant::now();
        for i in 0..claims {
            sizing.started(per_claim);
            sizing.claimed(took, start + took * i);
        }
    }

    #[test]
    fn a_store_that_does_not_claim_ahead_gets_no_prefetch() {
        let sizing = Sizing::new(&config(64), 1, false, LIMIT);
        run(&sizing, 40, Duration::from_millis(10), 500);
        assert_eq!((sizing.prefetch(), sizing.low_water()), (0, None));
    }

    #[test]
    fn configured_values_are_kept() {
        let sizing = sizing(DrainConfig {
            prefetch: Some(7),
            claims_in_flight: Some(3),
            ..config(16)
        });
        run(&sizing, 20, Duration::from_millis(10), 1_000);
        assert_eq!((sizing.prefetch(), sizing.claims_in_flight()), (7, 3));
    }

    #[test]
    fn unset_values_start_with_nothing_ahead_and_the_stores_parallelism() {
        let sizing = sizing(config(64));
        assert_eq!((sizing.prefetch(), sizing.claims_in_flight()), (0, 4));
    }

    #[test]
    fn fast_handlers_get_claims_that_cover_round_trips() {
        // 500 starts per 10 ms claim: 50 000 a second, so 16 round trips
        // hold 8 000 messages, past the bound.
        let sizing = sizing(config(64));
        run(&sizing, 40, Duration::from_millis(10), 500);
        assert_eq!(sizing.prefetch(), LIMIT);
        // 2 000 a second for 10 ms round trips: 320.
        let sizing = Sizing::new(&config(64), 4, true, LIMIT);
        run(&sizing, 40, Duration::from_millis(10), 20);
        assert!(
            (310..=330).contains(&sizing.prefetch()),
            "{}",
            sizing.prefetch()
        );
    }

    #[test]
    fn the_stores_limit_bounds_a_sized_prefetch() {
        // As above, 8 000 wanted, on a store that holds at most 512 ahead.
        let sizing = Sizing::new(&config(64), 1, true, 512);
        run(&sizing, 40, Duration::from_millis(10), 500);
        assert_eq!(sizing.prefetch(), 512);
        // Below it, the same size as anywhere.
        let sizing = Sizing::new(&config(64), 1, true, 512);
        run(&sizing, 40, Duration::from_millis(10), 20);
        assert!((310..=330).contains(&sizing.prefetch()));
    }

    #[test]
    fn slow_handlers_keep_one_message_per_handler_within_the_lease() {
        // 64 handlers of 5 s each: about 13 starts a second, far below one
        // per handler within a round trip's window; the floor is what a
        // quarter heartbeat (2.5 s) of starts holds, 32.
        let sizing = sizing(config(64));
        run(&sizing, 40, Duration::from_millis(100), 1);
        let rate = 10.0;
        let expected = (rate * 2.5) as usize;
        assert_eq!(sizing.prefetch(), expected);
    }

    #[test]
    fn a_pass_boundary_starts_a_fresh_rate_sample() {
        let sizing = sizing(config(8));
        run(&sizing, 10, Duration::from_millis(10), 100);
        let before = sizing.prefetch();
        sizing.pass_ended();
        // The first claim of the next pass only starts a sample.
        sizing.claimed(
            Duration::from_millis(10),
            Instant::now() + Duration::from_secs(60),
        );
        assert_eq!(sizing.prefetch(), before);
    }
}
