//! What every actor of a drain shares, and the observer hooks.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox::{
    ClaimedMessage, DeliveryError, DrainConfig, EventBus, JobDispatcher, MessageKind, Registry,
    RetryPolicy, SharedClock, SharedStore,
};

use crate::notices::{DeadLetter, LeaseLost, SettlementFailed};
use crate::sizing::Sizing;

/// What an observer hook returns; an `Err` is logged and changes nothing.
pub type ObserverResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// Hooks called as deliveries end, on the arbiter that ran the delivery.
///
/// Every method has a no-op default. A hook that returns an error or panics
/// changes nothing: the outcome is already decided (and usually stored) when
/// it runs. Hooks are synchronous and should be quick; hand slow work to an
/// actor or task. For notifications delivered to actors, see
/// [`Subscribe`](crate::Subscribe).
pub trait DrainObserver: Send + Sync + 'static {
    /// A delivery failed (before the retry or dead-letter was stored).
    fn on_error(&self, error: &DeliveryError, message: &ClaimedMessage) -> ObserverResult {
        let _ = (error, message);
        Ok(())
    }

    /// A message was dead-lettered (after a failed delivery, or at claim).
    fn on_dead_letter(&self, dead_letter: &DeadLetter) -> ObserverResult {
        let _ = dead_letter;
        Ok(())
    }

    /// A lease was lost, or renewals recovered or degraded.
    fn on_lease_error(&self, failure: &LeaseLost) -> ObserverResult {
        let _ = failure;
        Ok(())
    }

    /// A delivery's outcome could not be stored.
    fn on_settlement_error(&self, failure: &SettlementFailed) -> ObserverResult {
        let _ = failure;
        Ok(())
    }
}

/// Everything the actors of one coordinator share. Fixed once built, but
/// for the measurements `sizing` keeps.
pub(crate) struct DrainContext {
    /// Where messages are claimed and settled.
    pub(crate) store: SharedStore,
    /// Decodes payloads and holds per-job retry policies.
    pub(crate) registry: Registry,
    /// Delivers events, if the drain has any.
    pub(crate) events: Option<Arc<dyn EventBus>>,
    /// Delivers jobs, if the drain has any.
    pub(crate) jobs: Option<Arc<dyn JobDispatcher>>,
    /// The validated drain settings.
    pub(crate) config: DrainConfig,
    /// The renewal interval, derived from `config` once.
    pub(crate) heartbeat: Duration,
    /// Where `now` comes from for every store call.
    pub(crate) clock: SharedClock,
    /// Called as deliveries end.
    pub(crate) observers: Vec<Arc<dyn DrainObserver>>,
    /// Rows deleted (by retention runs and at delivery) since the store
    /// was last vacuumed; see `RetentionConfig::vacuum_after`.
    pub(crate) deleted_since_vacuum: AtomicU64,
    /// How much claims take ahead, and how many overlap.
    pub(crate) sizing: Sizing,
}

impl DrainContext {
    pub(crate) fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }

    /// The policy that governs retries of `message`: the job's own, else
    /// its queue's, else the drain's.
    pub(crate) fn retry_policy(&self, message: &ClaimedMessage) -> &RetryPolicy {
        let queue = self
            .config
            .queues
            .get(&message.queue)
            .and_then(|queue| queue.retry.as_ref())
            .unwrap_or(&self.config.retry);
        match message.kind {
            MessageKind::Job => self
                .registry
                .retry_policy(MessageKind::Job, &message.name)
                .unwrap_or(queue),
            MessageKind::Event => queue,
        }
    }

    /// Call `hook` on every observer; errors and panics are logged, never raised.
    pub(crate) fn observe(
        &self,
        hook: &'static str,
        call: impl Fn(&dyn DrainObserver) -> ObserverResult,
    ) {
        for observer in &self.observers {
            match catch_unwind(AssertUnwindSafe(|| call(observer.as_ref()))) {
                Ok(Ok(())) => {}
                Ok(Err(error)) => {
                    tracing::warn!(target: "outbox", hook, %error, "outbox observer failed; outcome unchanged");
                }
                Err(_) => {
                    tracing::warn!(target: "outbox", hook, "outbox observer panicked; outcome unchanged");
                }
            }
        }
    }
}

/// `to - from`, as a non-negative std duration (zero when `to <= from`).
pub(crate) fn until(from: DateTime<Utc>, to: DateTime<Utc>) -> Duration {
    (to - from).to_std().unwrap_or(Duration::ZERO)
}

/// `at + duration`, saturating at the end of the calendar.
pub(crate) fn after(at: DateTime<Utc>, duration: Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(duration)
        .ok()
        .and_then(|d| at.checked_add_signed(d))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// `at - duration`, saturating at the start of the calendar.
pub(crate) fn before(at: DateTime<Utc>, duration: Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(duration)
        .ok()
        .and_then(|d| at.checked_sub_signed(d))
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}
