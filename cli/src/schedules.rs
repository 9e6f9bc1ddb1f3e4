//! The periodic schedules `status` shows: each one's cadence, zone, last
//! and next slot and the process that enqueued the last, as the store keeps
//! them (the processes that run a schedule write its row; this command
//! only reads it).

use chrono::{DateTime, Utc};
use outbox::{AnyOutbox, OutboxAdmin, ScheduleState};

use crate::fail::Failure;
use crate::output::{Table, relative_short, time, truncate};

/// How late a schedule's next slot may be before `status` says no process
/// seems to run it: a slot is enqueued the moment it is due, so a minute
/// covers a busy store and clocks a little apart.
const OVERDUE_AFTER: chrono::Duration = chrono::Duration::minutes(1);

/// The schedules of the outbox, or why there are none to show.
pub(crate) enum Schedules {
    /// The rows, by name (possibly none).
    Read(Vec<ScheduleState>),
    /// The table's migrations predate schedules: `outbox migrate` adds them.
    NotSetUp,
}

impl Schedules {
    /// The rows, for `status --json` (none when the table is missing).
    pub(crate) fn states(&self) -> &[ScheduleState] {
        match self {
            Schedules::Read(states) => states,
            Schedules::NotSetUp => &[],
        }
    }
}

/// Read every schedule of the outbox; an outbox set up before schedules
/// existed has none, which is no failure of `status`.
pub(crate) async fn read(store: &AnyOutbox) -> Result<Schedules, Failure> {
    match store.list_schedules().await {
        Ok(states) => Ok(Schedules::Read(states)),
        Err(outbox::Error::NotSetUp { .. }) => Ok(Schedules::NotSetUp),
        Err(other) => Err(other.into()),
    }
}

/// The schedules section of `status`, after the counts; nothing when the
/// outbox has no schedule.
pub(crate) fn print(schedules: &Schedules, now: DateTime<Utc>) {
    let states = match schedules {
        Schedules::NotSetUp => {
            outln!(
                "\nschedules: this table has no schedules table yet (it was set up by an \
                 older version); `outbox migrate` adds it"
            );
            return;
        }
        Schedules::Read(states) if states.is_empty() => return,
        Schedules::Read(states) => states,
    };
    outln!(
        "\n{} periodic schedule{}:",
        states.len(),
        if states.len() == 1 { "" } else { "s" }
    );
    let mut table = Table::new(&[
        "NAME",
        "CADENCE",
        "ZONE",
        "LAST SLOT",
        "NEXT SLOT",
        "LAST ENQUEUED BY",
    ]);
    let when = |at: Option<DateTime<Utc>>| match at {
        Some(at) => format!("{} ({})", time(at), relative_short(now, at)),
        None => "none yet".to_owned(),
    };
    let mut overdue = Vec::new();
    for state in states {
        if state
            .next_slot
            .is_some_and(|next| next + OVERDUE_AFTER < now)
        {
            overdue.push(state.name.as_str());
        }
        table.row(vec![
            truncate(&state.name, 40),
            truncate(&state.expression, 30),
            state.time_zone.clone(),
            when(state.last_slot),
            when(state.next_slot),
            state
                .last_enqueued_by
                .as_deref()
                .map_or_else(|| "-".to_owned(), |by| truncate(by, 30)),
        ]);
    }
    out!("{}", table.render());
    if !overdue.is_empty() {
        outln!(
            "overdue: {} (the next slot passed and no process enqueued it: is a drain \
             running with the schedule?)",
            overdue.join(", ")
        );
    }
}
