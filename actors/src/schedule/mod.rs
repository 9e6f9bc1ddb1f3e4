//! Periodic messages: a [`Schedule`] enqueues one message per slot of a
//! cron expression or a fixed interval, in a time zone.
//!
//! Any number of processes may run the same schedule: each slot is
//! enqueued once, by whichever process gets there first, through the
//! store's [`ScheduleStore::enqueue_slot`](outbox::ScheduleStore::enqueue_slot)
//! (the slot's time in an idempotency key, and the schedule's `last_slot`
//! moved in the same transaction), with no leader to elect. A process that
//! was down for some slots enqueues the ones it missed, or only the latest,
//! as its [`CatchUp`] policy says, never one older than its catch-up horizon.
//!
//! - `mod.rs` (this file): [`Schedule`] and [`CatchUp`] as the application
//!   declares them, and their checks.
//! - `slots.rs`: when the slots fall (time zones, daylight saving time).
//! - `runner.rs`: the loop each schedule runs in a coordinator: declare,
//!   catch up, sleep until the next slot, enqueue it.

use std::collections::BTreeSet;
use std::str::FromStr;
use std::time::Duration;

use chrono_tz::Tz;
use outbox::{Event, Job, MessageKind, NewMessage, Payload};

use crate::error::ScheduleError;

pub(crate) mod runner;
mod slots;

pub(crate) use slots::{Cadence, Slots};

/// How long after its slot a missed slot may still be enqueued, unless
/// [`Schedule::catch_up_within`] says otherwise: a day.
pub const DEFAULT_CATCH_UP_WITHIN: Duration = Duration::from_secs(24 * 60 * 60);

/// What a process does about the slots that passed while no process ran
/// the schedule (all of them down, or none started yet). Slots older than
/// the catch-up horizon ([`Schedule::catch_up_within`]) are never
/// enqueued.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CatchUp {
    /// Enqueue only the most recent missed slot (the default): a report
    /// that runs once when its process comes back, however long it was away.
    #[default]
    Latest,
    /// Enqueue every missed slot within the horizon, oldest first: each
    /// slot counts (an hourly billing run).
    All,
}

impl CatchUp {
    /// `latest` or `all`.
    pub fn as_str(self) -> &'static str {
        match self {
            CatchUp::Latest => "latest",
            CatchUp::All => "all",
        }
    }
}

/// When a schedule's slots fall, as declared.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Declared {
    /// A cron expression: five fields (minute to day of week) or six
    /// (seconds first).
    Cron(String),
    /// A fixed interval.
    Every(Duration),
}

/// A periodic message: one enqueue per slot of a cron expression or of a
/// fixed interval, read in a time zone (UTC unless set). Give it to the
/// coordinator's builder with
/// [`DrainCoordinatorBuilder::schedule`](crate::DrainCoordinatorBuilder::schedule);
/// the builder checks it when it starts, and refuses to start with a
/// [`ScheduleError`] that names the field at fault.
///
/// Each slot's message is an ordinary one: it is claimable from its slot
/// (its `available_at` is the slot, which its handler can read from
/// [`DeliveryContext::message`](outbox::DeliveryContext::message)), and it
/// carries the slot's idempotency key, [`outbox::slot_key`].
///
/// ```
/// use std::time::Duration;
/// use outbox_actors::{CatchUp, Schedule};
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct NightlyReport;
/// impl outbox_actors::outbox::Job for NightlyReport { const NAME: &'static str = "report.nightly"; }
///
/// let nightly = Schedule::cron("nightly-report", "0 3 * * *")
///     .time_zone("Europe/Paris")
///     .job(&NightlyReport)
///     .catch_up(CatchUp::Latest);
/// let heartbeat = Schedule::every("heartbeat", Duration::from_secs(60))
///     .job(&NightlyReport)
///     .catch_up(CatchUp::All)
///     .catch_up_within(Duration::from_secs(3600));
/// # let _ = (nightly, heartbeat);
/// ```
#[derive(Debug, Clone)]
#[must_use = "a schedule does nothing until given to a coordinator's builder"]
pub struct Schedule {
    /// Its name, unique in its outbox.
    name: String,
    /// Its cadence.
    declared: Declared,
    /// Its IANA time zone.
    time_zone: String,
    /// What each slot enqueues, or why it cannot.
    message: Option<Result<NewMessage, String>>,
    /// What to do about missed slots.
    catch_up: CatchUp,
    /// How late a missed slot may still be enqueued.
    catch_up_within: Duration,
}

impl Schedule {
    /// A schedule named `name` whose slots are the times `expression`
    /// matches: five fields (minute, hour, day of month, month, day of
    /// week) or six (seconds first), with `*`, `,`, `-`, `/`, names of
    /// months and days, `L`, `W` and `#`.
    pub fn cron(name: impl Into<String>, expression: impl Into<String>) -> Self {
        Self::new(name.into(), Declared::Cron(expression.into()))
    }

    /// A schedule named `name` with a slot every `interval` of real time,
    /// counted from midnight of 1 January 1970 on its zone's clock.
    pub fn every(name: impl Into<String>, interval: Duration) -> Self {
        Self::new(name.into(), Declared::Every(interval))
    }

    fn new(name: String, declared: Declared) -> Self {
        Schedule {
            name,
            declared,
            time_zone: "UTC".to_owned(),
            message: None,
            catch_up: CatchUp::default(),
            catch_up_within: DEFAULT_CATCH_UP_WITHIN,
        }
    }

    /// Read the cron expression on this IANA time zone's wall clock
    /// (`Europe/Paris`, `America/New_York`, `UTC`); see the guide for what
    /// happens at daylight saving time changes.
    pub fn time_zone(mut self, zone: impl Into<String>) -> Self {
        self.time_zone = zone.into();
        self
    }

    /// Enqueue this event at each slot.
    pub fn event<E: Event>(mut self, payload: &E) -> Self {
        self.message = Some(NewMessage::event(payload).map_err(|e| e.to_string()));
        self
    }

    /// Enqueue this job at each slot, with its job's attempt budget.
    pub fn job<J: Job>(mut self, payload: &J) -> Self {
        self.message = Some(NewMessage::job(payload).map_err(|e| e.to_string()));
        self
    }

    /// Enqueue a message of this kind, name and JSON payload at each slot.
    pub fn message(mut self, kind: MessageKind, name: impl Into<String>, payload: Payload) -> Self {
        self.message = Some(Ok(NewMessage::new(kind, name, payload)));
        self
    }

    /// What a process does about slots that passed while no process ran
    /// the schedule; [`CatchUp::Latest`] unless set.
    pub fn catch_up(mut self, policy: CatchUp) -> Self {
        self.catch_up = policy;
        self
    }

    /// How long after its slot a missed slot may still be enqueued;
    /// [`DEFAULT_CATCH_UP_WITHIN`] unless set. It is also how long a slot's
    /// idempotency key holds.
    pub fn catch_up_within(mut self, horizon: Duration) -> Self {
        self.catch_up_within = horizon;
        self
    }

    /// The schedule's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Check everything the builder checks of one schedule: its name, its
    /// expression or interval, its time zone, its message and its horizon.
    pub fn validate(&self) -> Result<(), ScheduleError> {
        self.check().map(|_| ())
    }

    /// The schedule checked, ready to run.
    pub(crate) fn check(&self) -> Result<Checked, ScheduleError> {
        let schedule = || self.name.clone();
        if let Some(reason) = outbox::schedule_name_problem(&self.name) {
            return Err(ScheduleError::InvalidName {
                name: self.name.clone(),
                reason,
            });
        }
        let (cadence, expression) = match &self.declared {
            Declared::Cron(expression) => {
                let cron = croner::Cron::from_str(expression.trim()).map_err(|e| {
                    ScheduleError::InvalidCron {
                        schedule: schedule(),
                        expression: expression.clone(),
                        reason: e.to_string(),
                    }
                })?;
                (
                    Cadence::Cron(Box::new(cron)),
                    format!("cron {}", expression.trim()),
                )
            }
            Declared::Every(interval) => {
                let reason = if interval.is_zero() {
                    Some("must be longer than zero".to_owned())
                } else if *interval > outbox::MAX_DURATION {
                    Some("must be at most 365 days; use a cron expression".to_owned())
                } else if interval.subsec_nanos() % 1_000 != 0 {
                    Some("must be a whole number of microseconds".to_owned())
                } else {
                    None
                };
                if let Some(reason) = reason {
                    return Err(ScheduleError::InvalidInterval {
                        schedule: schedule(),
                        reason,
                    });
                }
                let every = chrono::Duration::from_std(*interval)
                    .expect("at most a year fits chrono's range");
                (
                    Cadence::Every(every),
                    format!("every {}", humantime::format_duration(*interval)),
                )
            }
        };
        let zone =
            Tz::from_str(self.time_zone.trim()).map_err(|_| ScheduleError::UnknownTimeZone {
                schedule: schedule(),
                zone: self.time_zone.clone(),
            })?;
        let invalid_message = |reason: String| ScheduleError::InvalidMessage {
            schedule: schedule(),
            reason,
        };
        let mut message = match &self.message {
            None => {
                return Err(invalid_message(
                    "none given; set one with `.event(..)`, `.job(..)` or `.message(..)`"
                        .to_owned(),
                ));
            }
            Some(Err(reason)) => return Err(invalid_message(reason.clone())),
            Some(Ok(message)) => message.clone(),
        };
        // A slot's message belongs to no request's trace.
        message.trace = None;
        message
            .validate()
            .map_err(|e| invalid_message(e.to_string()))?;
        let horizon = self.catch_up_within;
        if horizon < Duration::from_millis(1) || horizon > outbox::MAX_DURATION {
            return Err(ScheduleError::InvalidCatchUp {
                schedule: schedule(),
                reason: "must be from 1ms to 365 days".to_owned(),
            });
        }
        Ok(Checked {
            name: self.name.clone(),
            slots: Slots::new(cadence, zone),
            expression,
            time_zone: zone.name().to_owned(),
            message,
            catch_up: self.catch_up,
            horizon,
        })
    }
}

/// What one process did for one schedule since its coordinator started,
/// as [`GetSchedules`](crate::GetSchedules) answers. The schedule's state
/// shared by every process is in the store
/// ([`OutboxAdmin::list_schedules`](outbox::OutboxAdmin::list_schedules)).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct ScheduleStatus {
    /// The schedule's name.
    pub name: String,
    /// Slots this process enqueued.
    pub enqueued: u64,
    /// Slots this process found already enqueued (or passed over) by
    /// another process, and left alone.
    pub taken: u64,
    /// Store calls (declaring the schedule, enqueueing a slot) that failed
    /// and were tried again later.
    pub failures: u64,
    /// The latest slot this process knows to be enqueued, by any process.
    pub last_slot: Option<chrono::DateTime<chrono::Utc>>,
    /// The slot this process waits for; `None` before the schedule is
    /// declared, and when it has no slot left.
    pub next_slot: Option<chrono::DateTime<chrono::Utc>>,
}

/// A schedule that passed its checks.
#[derive(Debug, Clone)]
pub(crate) struct Checked {
    /// Its name.
    pub(crate) name: String,
    /// When its slots fall.
    pub(crate) slots: Slots,
    /// Its cadence as the store shows it: `cron …` or `every …`.
    pub(crate) expression: String,
    /// Its zone's IANA name.
    pub(crate) time_zone: String,
    /// The message each slot enqueues, as a template.
    pub(crate) message: NewMessage,
    /// What to do about missed slots.
    pub(crate) catch_up: CatchUp,
    /// How late a missed slot may still be enqueued.
    pub(crate) horizon: Duration,
}

/// Check every schedule, and that no two share a name.
pub(crate) fn check_all(schedules: &[Schedule]) -> Result<Vec<Checked>, ScheduleError> {
    let mut names = BTreeSet::new();
    let mut checked = Vec::with_capacity(schedules.len());
    for schedule in schedules {
        let schedule = schedule.check()?;
        if !names.insert(schedule.name.clone()) {
            return Err(ScheduleError::DuplicateName {
                name: schedule.name,
            });
        }
        checked.push(schedule);
    }
    Ok(checked)
}
