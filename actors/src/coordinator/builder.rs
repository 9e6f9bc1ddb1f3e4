//! [`DrainCoordinatorBuilder`]: what a coordinator is made of, checked
//! before it starts.
//!
//! The builder validates the settings and the registrations together and
//! hands the coordinator its parts. Starting the actor is the
//! coordinator's own business (`start` and `start_in` sit in its file), so
//! this file needs nothing of it.

use std::sync::Arc;

use actix::Recipient;
use std::collections::BTreeMap;

use outbox::{
    Clock, DrainConfig, EventBus, JobDispatcher, QueueConfig, Registry, RetryPolicy, SharedClock,
    SharedStore, SystemClock,
};

use crate::context::{DrainContext, DrainObserver};
use crate::error::{Result, ScheduleError};
use crate::notices::{LeaseLost, OutcomeNotice};
use crate::registrations;
use crate::schedule::{self, Schedule, runner::Runner};
use crate::sizing::Sizing;

/// Configures and starts a [`DrainCoordinator`](crate::DrainCoordinator).
#[must_use = "a builder does nothing until `start` is called"]
pub struct DrainCoordinatorBuilder {
    /// Where messages are claimed and settled.
    store: SharedStore,
    /// The registrations given, if any; else derived from the transports.
    registry: Option<Registry>,
    /// Delivers events.
    events: Option<Arc<dyn EventBus>>,
    /// Delivers jobs.
    jobs: Option<Arc<dyn JobDispatcher>>,
    /// The settings, validated at start.
    config: DrainConfig,
    /// Queues named with [`DrainCoordinatorBuilder::queue`], added to the
    /// settings' at start (so `config` may come before or after them).
    queues: BTreeMap<String, QueueConfig>,
    /// Where `now` comes from.
    clock: SharedClock,
    /// Called as deliveries end.
    observers: Vec<Arc<dyn DrainObserver>>,
    /// Start a pass on store wake-ups.
    wake_on_insert: bool,
    /// Subscribed to lease failures from the start.
    lease_subscribers: Vec<Recipient<LeaseLost>>,
    /// Subscribed to settlement failures and dead letters from the start.
    outcome_subscribers: Vec<Recipient<OutcomeNotice>>,
    /// The periodic schedules this coordinator runs, checked at start.
    schedules: Vec<Schedule>,
    /// This process's name in the schedules' `last_enqueued_by`.
    process_name: Option<String>,
}

/// What a builder whose settings and registrations hold hands the
/// coordinator it starts.
pub(super) struct Parts {
    /// What every actor of the coordinator shares.
    pub(super) drain: DrainContext,
    /// Start a pass on store wake-ups.
    pub(super) wake_on_insert: bool,
    /// Subscribed to lease failures from the start.
    pub(super) lease_subscribers: Vec<Recipient<LeaseLost>>,
    /// Subscribed to settlement failures and dead letters from the start.
    pub(super) outcome_subscribers: Vec<Recipient<OutcomeNotice>>,
    /// The periodic schedules, checked, to run from the start.
    pub(super) schedules: Vec<Runner>,
}

impl std::fmt::Debug for DrainCoordinatorBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DrainCoordinatorBuilder")
            .field("registry", &self.registry)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl DrainCoordinatorBuilder {
    /// A builder over `store`, with the default settings and nothing
    /// registered.
    pub(super) fn new(store: SharedStore) -> Self {
        DrainCoordinatorBuilder {
            store,
            registry: None,
            events: None,
            jobs: None,
            config: DrainConfig::default(),
            queues: BTreeMap::new(),
            clock: Arc::new(SystemClock),
            observers: Vec::new(),
            wake_on_insert: true,
            lease_subscribers: Vec::new(),
            outcome_subscribers: Vec::new(),
            schedules: Vec::new(),
            process_name: None,
        }
    }

    /// The registered events and jobs. Optional: without it, the registry
    /// is derived from the typed handlers of the event bus and the job
    /// dispatcher (and their catch-alls), so each name is written once.
    /// Given, `start` checks it against them: a registered name no handler
    /// serves, a handler whose name is not registered, and messages
    /// registered without a transport are refused together in one
    /// [`ConfigError`](outbox::ConfigError).
    pub fn registry(mut self, registry: Registry) -> Self {
        self.registry = Some(registry);
        self
    }

    /// Where events go.
    pub fn event_bus(mut self, bus: impl EventBus) -> Self {
        self.events = Some(Arc::new(bus));
        self
    }

    /// Where jobs go.
    pub fn job_dispatcher(mut self, jobs: impl JobDispatcher) -> Self {
        self.jobs = Some(Arc::new(jobs));
        self
    }

    /// Drain settings (validated by `start`).
    pub fn config(mut self, config: DrainConfig) -> Self {
        self.config = config;
        self
    }

    /// Serve the queue `name` with `queue`'s concurrency (and retry
    /// policy, if it has one); see [`DrainConfig::queues`]. Naming queues
    /// serves exactly the queues named, beside those of the configuration:
    /// name `default` too to keep serving it.
    ///
    /// ```
    /// # use outbox_actors::prelude::*;
    /// # use outbox::QueueConfig;
    /// # let store = MemoryOutbox::new();
    /// let builder = DrainCoordinator::builder(store)
    ///     .queue("default", QueueConfig::new(4))
    ///     .queue("emails", QueueConfig::new(8).retry(RetryPolicy::default().with_max_attempts(5)));
    /// # let _ = builder;
    /// ```
    pub fn queue(mut self, name: impl Into<String>, queue: QueueConfig) -> Self {
        self.queues.insert(name.into(), queue);
        self
    }

    /// The retry policy for events and for jobs without their own
    /// (shorthand for setting `config.retry`).
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.config.retry = policy;
        self
    }

    /// The clock stores get `now` from; [`SystemClock`] unless set.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Add an observer.
    pub fn observer(mut self, observer: impl DrainObserver) -> Self {
        self.observers.push(Arc::new(observer));
        self
    }

    /// Subscribe `recipient` to lease failures from the start.
    pub fn subscribe_lease_lost(mut self, recipient: Recipient<LeaseLost>) -> Self {
        self.lease_subscribers.push(recipient);
        self
    }

    /// Subscribe `recipient` to settlement failures and dead letters from the start.
    pub fn subscribe_outcomes(mut self, recipient: Recipient<OutcomeNotice>) -> Self {
        self.outcome_subscribers.push(recipient);
        self
    }

    /// Start a pass when the store signals a committed insert (default on),
    /// so a new message does not wait for the next tick.
    pub fn wake_on_insert(mut self, wake: bool) -> Self {
        self.wake_on_insert = wake;
        self
    }

    /// Run this periodic schedule: enqueue its message at each of its
    /// slots. Any number of processes may run the same schedule (same name,
    /// same outbox): each slot is enqueued once, by the first of them to
    /// get there. `start` checks every schedule, and refuses two with one
    /// name and a store that keeps no schedules, with an
    /// [`Error::Schedule`](crate::Error::Schedule) that names the field.
    pub fn schedule(mut self, schedule: Schedule) -> Self {
        self.schedules.push(schedule);
        self
    }

    /// How this process is named in its schedules' `last_enqueued_by`
    /// (what `outbox status` and the dashboard show); its host name and
    /// process id unless set.
    pub fn process_name(mut self, name: impl Into<String>) -> Self {
        self.process_name = Some(name.into());
        self
    }

    /// Validate the settings and the registrations together, and hand
    /// over what the coordinator is made of.
    pub(super) fn into_parts(mut self) -> Result<Parts> {
        self.config.queues.append(&mut self.queues);
        let registry =
            registrations::resolve(self.registry, self.events.as_deref(), self.jobs.as_deref());
        // One error lists every problem, settings and registrations alike.
        let registry = match (self.config.validate(), registry) {
            (Ok(_), registry) => registry?,
            (Err(mut config), Err(outbox::Error::Config(registrations))) => {
                config.violations.extend(registrations.violations);
                return Err(outbox::Error::from(config).into());
            }
            (Err(config), _) => return Err(outbox::Error::from(config).into()),
        };
        let schedules = schedule::check_all(&self.schedules)?;
        if !schedules.is_empty() && self.store.schedules().is_none() {
            return Err(ScheduleError::Unsupported.into());
        }
        let process: std::sync::Arc<str> = self
            .process_name
            .unwrap_or_else(schedule::runner::default_process_name)
            .into();
        let schedules = schedules
            .into_iter()
            .map(|schedule| Runner::new(schedule, process.clone()))
            .collect();
        let heartbeat = self.config.heartbeat();
        let sizing = Sizing::new(
            &self.config,
            self.store.claim_parallelism(),
            self.store.claims_ahead(),
            self.store.prefetch_limit(),
        );
        Ok(Parts {
            drain: DrainContext {
                store: self.store,
                registry,
                events: self.events,
                jobs: self.jobs,
                config: self.config,
                heartbeat,
                clock: self.clock,
                observers: self.observers,
                deleted_since_vacuum: Default::default(),
                sizing,
            },
            wake_on_insert: self.wake_on_insert,
            lease_subscribers: self.lease_subscribers,
            outcome_subscribers: self.outcome_subscribers,
            schedules,
        })
    }
}
