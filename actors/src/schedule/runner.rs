//! The loop one schedule runs in a coordinator: declare the schedule in the
//! store, enqueue the slots that are due (the missed ones as the catch-up
//! policy says), sleep on tokio time until the next slot, and again.
//!
//! The loop holds no lock and elects no leader: every process that runs
//! the schedule wakes at each slot and asks the store to enqueue it; the
//! store lets the first one through and answers the others that the slot
//! is taken (see [`outbox::ScheduleStore::enqueue_slot`]). What this
//! process knows of the schedule's progress is only a hint: a slot it
//! believes due may be taken already, and the store's answer corrects it.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox::{DeclareSchedule, EnqueueOptions, EnqueueSlot, ScheduleState, SlotOutcome, slot_key};

use super::{CatchUp, Checked, ScheduleStatus};
use crate::context::{DrainContext, before, until};
use crate::telemetry;

/// The first wait after a failed store call; it doubles up to
/// [`RETRY_MAX`] while calls keep failing.
const RETRY_MIN: Duration = Duration::from_secs(1);

/// The longest wait after failed store calls.
const RETRY_MAX: Duration = Duration::from_secs(60);

/// The longest a runner sleeps before it looks at the clock again, so a
/// wall clock that jumps (a host's clock set, a suspended machine) delays
/// a slot by at most this.
const LONGEST_NAP: Duration = Duration::from_secs(60 * 60);

/// One schedule of one coordinator, ready to run.
#[derive(Debug, Clone)]
pub(crate) struct Runner {
    /// The schedule.
    schedule: Arc<Checked>,
    /// This process's name in the store (`last_enqueued_by`).
    process: Arc<str>,
    /// What this process did, for [`GetSchedules`](crate::GetSchedules).
    status: Arc<Mutex<ScheduleStatus>>,
}

impl Runner {
    pub(crate) fn new(schedule: Checked, process: Arc<str>) -> Self {
        let status = ScheduleStatus {
            name: schedule.name.clone(),
            ..ScheduleStatus::default()
        };
        Runner {
            schedule: Arc::new(schedule),
            process,
            status: Arc::new(Mutex::new(status)),
        }
    }

    /// What this process did so far.
    pub(crate) fn status(&self) -> ScheduleStatus {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ScheduleStatus> {
        self.status.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Run the schedule until the future is dropped (at the coordinator's
    /// shutdown) or the schedule has no slot left.
    pub(crate) async fn run(self, drain: Arc<DrainContext>) {
        let mut retry = RETRY_MIN;
        let state = loop {
            match self.declare(&drain).await {
                Ok(state) => break state,
                Err(error) => {
                    self.failed(&error, retry);
                    tokio::time::sleep(retry).await;
                    retry = (retry * 2).min(RETRY_MAX);
                }
            }
        };
        let mut progress = Progress {
            last: state.last_slot,
            created: state.created_at,
        };
        self.lock().last_slot = progress.last;
        retry = RETRY_MIN;
        loop {
            let now = drain.now();
            if let Err(error) = self.catch_up(&drain, now, &mut progress).await {
                self.failed(&error, retry);
                tokio::time::sleep(retry).await;
                retry = (retry * 2).min(RETRY_MAX);
                continue;
            }
            retry = RETRY_MIN;
            let from = progress.last.map_or(now, |last| last.max(now));
            let Some(next) = self.schedule.slots.next_after(from) else {
                // An expression that never matches again: nothing to wait for.
                self.lock().next_slot = None;
                return;
            };
            self.lock().next_slot = Some(next);
            let nap = until(drain.now(), next).min(LONGEST_NAP);
            tokio::time::sleep(nap).await;
        }
    }

    async fn declare(&self, drain: &DrainContext) -> outbox::Result<ScheduleState> {
        let now = drain.now();
        let schedule = &self.schedule;
        let store = drain.store.schedules().ok_or_else(unsupported)?;
        let declared = store.declare_schedule(DeclareSchedule {
            name: schedule.name.clone(),
            expression: schedule.expression.clone(),
            time_zone: schedule.time_zone.clone(),
            message_name: schedule.message.name.clone(),
            next_slot: schedule.slots.first_from(now),
            now,
        });
        bounded(drain, "declare_schedule", declared).await
    }

    /// Enqueue what is due at `now`: under [`CatchUp::All`] every slot
    /// since the last one, oldest first; under [`CatchUp::Latest`] the
    /// latest only. Never a slot before the schedule was first declared,
    /// nor one older than the horizon.
    async fn catch_up(
        &self,
        drain: &DrainContext,
        now: DateTime<Utc>,
        progress: &mut Progress,
    ) -> outbox::Result<()> {
        let schedule = &self.schedule;
        let slots = &schedule.slots;
        let floor = before(now, schedule.horizon).max(progress.created);
        let mut candidate = match progress.last {
            Some(last) if last >= floor => slots.next_after(last),
            _ => slots.first_from(floor),
        };
        let due = |slot: &DateTime<Utc>| *slot <= now;
        let first = match schedule.catch_up {
            CatchUp::All => candidate.filter(due),
            CatchUp::Latest => {
                let mut latest = None;
                let mut next = candidate;
                while let Some(slot) = next.filter(due) {
                    latest = Some(slot);
                    next = slots.next_after(slot);
                }
                latest
            }
        };
        let Some(first) = first else {
            return Ok(());
        };
        let expected = match progress.last {
            Some(last) => slots.next_after(last),
            None => slots.first_from(progress.created),
        };
        if expected.is_some_and(|expected| expected < first) {
            let after = progress.last.unwrap_or(progress.created);
            telemetry::schedule_slots_missed(
                &schedule.name,
                after,
                first,
                schedule.catch_up.as_str(),
            );
        }
        match schedule.catch_up {
            CatchUp::All => {
                while let Some(slot) = candidate.filter(due) {
                    self.enqueue(drain, slot, now, progress).await?;
                    let last = progress.last.unwrap_or(slot);
                    candidate = slots.next_after(last.max(slot));
                }
            }
            CatchUp::Latest => self.enqueue(drain, first, now, progress).await?,
        }
        Ok(())
    }

    async fn enqueue(
        &self,
        drain: &DrainContext,
        slot: DateTime<Utc>,
        now: DateTime<Utc>,
        progress: &mut Progress,
    ) -> outbox::Result<()> {
        let schedule = &self.schedule;
        let store = drain.store.schedules().ok_or_else(unsupported)?;
        let message = schedule.message.clone().at(drain.now()).with_options(
            EnqueueOptions::new()
                .run_at(slot)
                .idempotency_key(slot_key(&schedule.name, slot), schedule.horizon),
        );
        let enqueue = store.enqueue_slot(EnqueueSlot {
            schedule: schedule.name.clone(),
            slot,
            next_slot: schedule.slots.next_after(slot),
            enqueued_by: self.process.to_string(),
            message,
        });
        match bounded(drain, "enqueue_slot", enqueue).await? {
            SlotOutcome::Enqueued(enqueued) => {
                progress.last = Some(slot);
                let mut status = self.lock();
                status.enqueued += 1;
                status.last_slot = Some(slot);
                drop(status);
                telemetry::schedule_slot_enqueued(&schedule.name, slot, enqueued.id(), now);
            }
            SlotOutcome::Taken { last_slot } => {
                let last = progress.last.map_or(last_slot, |last| last.max(last_slot));
                progress.last = Some(last.max(slot));
                let mut status = self.lock();
                status.taken += 1;
                status.last_slot = progress.last;
                drop(status);
                telemetry::schedule_slot_taken(&schedule.name, slot, last_slot);
            }
            other => {
                return Err(outbox::Error::StoreContract(format!(
                    "enqueue_slot answered {other:?}, which this runtime does not know"
                )));
            }
        }
        Ok(())
    }

    fn failed(&self, error: &outbox::Error, retry: Duration) {
        self.lock().failures += 1;
        telemetry::schedule_failed(&self.schedule.name, error, retry);
    }
}

/// What this process knows of the schedule's progress.
struct Progress {
    /// The latest slot known enqueued or passed over, by any process.
    last: Option<DateTime<Utc>>,
    /// When the schedule was first declared: no slot before it.
    created: DateTime<Utc>,
}

/// A store call bounded by the drain's lease: a store that does not answer
/// must not hold the schedule forever.
async fn bounded<T>(
    drain: &DrainContext,
    operation: &'static str,
    call: impl std::future::Future<Output = outbox::Result<T>>,
) -> outbox::Result<T> {
    match tokio::time::timeout(drain.config.lease, call).await {
        Ok(result) => result,
        Err(_) => Err(outbox::Error::store(
            operation,
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "no answer within {}",
                    humantime::format_duration(drain.config.lease)
                ),
            ),
        )),
    }
}

/// Checked when the coordinator starts; only a store that changed its
/// answer since gets here.
fn unsupported() -> outbox::Error {
    outbox::Error::invalid("schedules", "the store keeps no periodic schedules")
}

/// How this process names itself in the schedules' `last_enqueued_by`
/// unless the builder was given a name: its host name and process id.
pub(crate) fn default_process_name() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .map(|host| host.trim().to_owned())
        .filter(|host| !host.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("{host}:{}", std::process::id())
}
