//! The runtime's error type.
//!
//! The errors only a running drain can meet live here rather than in
//! [`outbox::Error`]: a lease that could not be confirmed, a delivery past
//! `max_active`, a store call that did not answer in time, a registry
//! with no transport, and a periodic schedule that cannot run. Everything the core and its stores report arrives
//! boxed in as [`Error::Outbox`].

use std::time::Duration;

use crate::report::DrainReport;

/// `Result` with this crate's [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong starting or running drains.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An error from the outbox core or its store (invalid config, store
    /// failure, a claim that no longer owns its message).
    #[error(transparent)]
    Outbox(#[from] outbox::Error),
    /// A delivery could not confirm that it still holds its claim.
    #[error(transparent)]
    LeaseLost(#[from] LeaseLostError),
    /// A delivery ran past the configured `max_active` window.
    #[error(transparent)]
    MaxActiveDuration(#[from] MaxActiveDurationError),
    /// A store call did not answer within its time bound.
    #[error("outbox store did not answer {operation} within {}", humantime::format_duration(*timeout))]
    Timeout {
        /// The store operation that timed out.
        operation: &'static str,
        /// How long the drain waited.
        timeout: Duration,
    },
    /// The pass stopped claiming because the store failed; the deliveries it
    /// had already started finished, and `report` counts them. The next pass
    /// picks up where this one stopped.
    #[error("drain pass stopped claiming: {source} (finished before stopping: {report})")]
    Pass {
        /// Why claiming stopped.
        source: Box<Error>,
        /// What the pass did before it stopped.
        report: Box<DrainReport>,
    },
    /// The coordinator is shutting down and starts no new passes.
    #[error("the drain coordinator is shutting down and starts no new passes")]
    ShuttingDown,
    /// The coordinator stopped before it could answer.
    #[error("the drain coordinator stopped before answering")]
    Stopped,
    /// A periodic schedule given to the coordinator's builder is invalid;
    /// nothing was started.
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
}

impl Error {
    /// The report of the pass this error ended, if it ended one.
    pub fn report(&self) -> Option<&DrainReport> {
        match self {
            Error::Pass { report, .. } => Some(report),
            _ => None,
        }
    }

    /// `true` when the store confirmed that the claim token no longer owns
    /// the message ([`outbox::Error::is_claim_lost`]).
    pub fn is_claim_lost(&self) -> bool {
        matches!(self, Error::Outbox(error) if error.is_claim_lost())
    }
}

/// A delivery could not confirm that its claim is still active.
#[derive(Debug, Clone, thiserror::Error)]
#[error("outbox claim for message {id:?} is no longer confirmed: {reason}")]
#[non_exhaustive]
pub struct LeaseLostError {
    /// The message id.
    pub id: String,
    /// What happened.
    pub reason: String,
    /// The error behind it, if any.
    #[source]
    pub source: Option<Box<Error>>,
}

impl LeaseLostError {
    pub(crate) fn new(id: &str, reason: impl Into<String>, source: Option<Error>) -> Self {
        LeaseLostError {
            id: id.to_owned(),
            reason: reason.into(),
            source: source.map(Box::new),
        }
    }
}

/// A delivery ran longer than the configured `max_active` window.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("outbox delivery of message {id:?} exceeded its active-claim limit of {}", humantime::format_duration(*max_active))]
#[non_exhaustive]
pub struct MaxActiveDurationError {
    /// The message id.
    pub id: String,
    /// The configured limit.
    pub max_active: Duration,
}

impl MaxActiveDurationError {
    pub(crate) fn new(id: &str, max_active: Duration) -> Self {
        MaxActiveDurationError {
            id: id.to_owned(),
            max_active,
        }
    }
}

/// Why a periodic schedule cannot run. Each variant names the field of the
/// schedule that is wrong ([`ScheduleError::field`]); the coordinator's
/// builder refuses to start with any of them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScheduleError {
    /// The schedule's name is empty, too long or not printable.
    #[error("invalid schedule `name` {name:?}: {reason}")]
    InvalidName {
        /// The name as given.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Two schedules of one coordinator have the same name.
    #[error("two schedules are named {name:?}; each schedule's `name` must be unique")]
    DuplicateName {
        /// The name given twice.
        name: String,
    },
    /// The cron expression does not parse.
    #[error("schedule {schedule:?}: invalid `cron` expression {expression:?}: {reason}")]
    InvalidCron {
        /// The schedule's name.
        schedule: String,
        /// The expression as given.
        expression: String,
        /// What the parser found wrong.
        reason: String,
    },
    /// The time zone is not an IANA time zone name.
    #[error(
        "schedule {schedule:?}: unknown `time_zone` {zone:?}; use an IANA name such as \
         `Europe/Paris`, `America/New_York` or `UTC`"
    )]
    UnknownTimeZone {
        /// The schedule's name.
        schedule: String,
        /// The zone as given.
        zone: String,
    },
    /// The interval is zero, or longer than a year.
    #[error("schedule {schedule:?}: invalid `interval`: {reason}")]
    InvalidInterval {
        /// The schedule's name.
        schedule: String,
        /// What the interval must be instead.
        reason: String,
    },
    /// The schedule has no message to enqueue, or its payload does not
    /// serialize.
    #[error("schedule {schedule:?}: invalid `message`: {reason}")]
    InvalidMessage {
        /// The schedule's name.
        schedule: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The catch-up horizon is zero, or longer than a year.
    #[error("schedule {schedule:?}: invalid `catch_up_within`: {reason}")]
    InvalidCatchUp {
        /// The schedule's name.
        schedule: String,
        /// What the horizon must be instead.
        reason: String,
    },
    /// The coordinator's store keeps no schedules
    /// ([`OutboxStore::schedules`](outbox::OutboxStore::schedules) is
    /// `None`).
    #[error(
        "the drain's `store` keeps no periodic schedules; use the memory, SQLite or \
         PostgreSQL store, or give the coordinator no schedules"
    )]
    Unsupported,
}

impl ScheduleError {
    /// The field of the schedule (or of the coordinator) that is wrong:
    /// `name`, `cron`, `time_zone`, `interval`, `message`,
    /// `catch_up_within` or `store`.
    pub fn field(&self) -> &'static str {
        match self {
            ScheduleError::InvalidName { .. } | ScheduleError::DuplicateName { .. } => "name",
            ScheduleError::InvalidCron { .. } => "cron",
            ScheduleError::UnknownTimeZone { .. } => "time_zone",
            ScheduleError::InvalidInterval { .. } => "interval",
            ScheduleError::InvalidMessage { .. } => "message",
            ScheduleError::InvalidCatchUp { .. } => "catch_up_within",
            ScheduleError::Unsupported => "store",
        }
    }
}
