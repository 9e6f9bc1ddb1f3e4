//! What a store keeps for periodic schedules: one row per schedule, whose
//! `last_slot` makes each slot's enqueue happen once, however many processes
//! run the schedule.
//!
//! The runtime (`outbox-actors`) computes the slots; the store only keeps
//! the schedule's progress and writes a slot's message in the same
//! transaction that moves the progress past it ([`ScheduleStore::enqueue_slot`]).
//! Operators read the rows back through
//! [`OutboxAdmin::list_schedules`](crate::OutboxAdmin::list_schedules).
//!
//! # The rule that makes a slot happen once
//!
//! A slot is enqueued only by the call that moves the schedule's
//! `last_slot` from before the slot to the slot itself, and that move and
//! the message commit together or not at all. Every later attempt at the
//! same slot, from this process or another, finds `last_slot` at or past it
//! and writes nothing ([`SlotOutcome::Taken`]). This holds after the slot's
//! message is delivered and deleted (`delete_on_delivery`, retention),
//! which frees its idempotency key: the key is the message's own record of
//! its slot, `last_slot` is what keeps the slot from coming back.

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;

use crate::error::Result;
use crate::message::{Enqueued, NewMessage};

/// The longest schedule name accepted, in bytes.
pub const MAX_SCHEDULE_NAME_LEN: usize = 100;

/// Why `name` cannot name a schedule, if it cannot: empty or blank, longer
/// than [`MAX_SCHEDULE_NAME_LEN`] bytes, or holding a control character
/// (which no SQL store or terminal shows faithfully).
pub fn schedule_name_problem(name: &str) -> Option<String> {
    if name.trim().is_empty() {
        return Some("must not be empty".to_owned());
    }
    if name.len() > MAX_SCHEDULE_NAME_LEN {
        return Some(format!(
            "is {} bytes; schedule names are at most {MAX_SCHEDULE_NAME_LEN} bytes",
            name.len()
        ));
    }
    if name.chars().any(char::is_control) {
        return Some("contains a control character".to_owned());
    }
    if name.trim() != name {
        return Some("starts or ends with white space".to_owned());
    }
    None
}

/// The idempotency key of one slot of schedule `name`:
/// `schedule:{name}:{slot}`, the slot in RFC 3339, UTC, to the microsecond.
/// A slot's message carries it, so a slot is recognisable in the outbox.
pub fn slot_key(name: &str, slot: DateTime<Utc>) -> String {
    format!(
        "schedule:{name}:{}",
        slot.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
    )
}

/// A schedule as a store keeps it: its definition, as the processes that
/// run it declared it last, and how far it got.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct ScheduleState {
    /// The schedule's name, unique in its outbox.
    pub name: String,
    /// Its cadence as declared: `cron <expression>` or `every <interval>`.
    pub expression: String,
    /// The IANA time zone its cron fields are read in.
    pub time_zone: String,
    /// The name of the message each slot enqueues.
    pub message_name: String,
    /// When it was first declared; its first slot is at or after this.
    pub created_at: DateTime<Utc>,
    /// When its definition or progress last changed.
    pub updated_at: DateTime<Utc>,
    /// The latest slot enqueued (or passed over by its catch-up policy);
    /// no slot at or before it is ever enqueued.
    pub last_slot: Option<DateTime<Utc>>,
    /// The slot after `last_slot`, as the process that wrote last computed
    /// it: when the next message is due, while some process runs the
    /// schedule.
    pub next_slot: Option<DateTime<Utc>>,
    /// The process that enqueued `last_slot`.
    pub last_enqueued_by: Option<String>,
    /// When it did.
    pub last_enqueued_at: Option<DateTime<Utc>>,
    /// The id of the message of `last_slot`.
    pub last_message_id: Option<String>,
}

impl ScheduleState {
    /// A fresh schedule's state: declared at `now`, no slot yet.
    pub fn declared(params: &DeclareSchedule) -> Self {
        ScheduleState {
            name: params.name.clone(),
            expression: params.expression.clone(),
            time_zone: params.time_zone.clone(),
            message_name: params.message_name.clone(),
            created_at: params.now,
            updated_at: params.now,
            last_slot: None,
            next_slot: params.next_slot,
            last_enqueued_by: None,
            last_enqueued_at: None,
            last_message_id: None,
        }
    }

    /// This state with `params`' definition; its progress is kept.
    pub fn redeclared(mut self, params: &DeclareSchedule) -> Self {
        self.expression = params.expression.clone();
        self.time_zone = params.time_zone.clone();
        self.message_name = params.message_name.clone();
        self.next_slot = params.next_slot;
        self.updated_at = params.now;
        self
    }
}

/// Declare a schedule: create its row, or give an existing one this
/// definition. Its progress (`last_slot` and what goes with it) and its
/// `created_at` are kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeclareSchedule {
    /// The schedule's name; see [`schedule_name_problem`].
    pub name: String,
    /// Its cadence, for display: `cron <expression>` or `every <interval>`.
    pub expression: String,
    /// Its IANA time zone, for display.
    pub time_zone: String,
    /// The name of the message each slot enqueues, for display.
    pub message_name: String,
    /// The first slot the declaring process will enqueue, for display.
    pub next_slot: Option<DateTime<Utc>>,
    /// The caller's clock; `created_at` of a new schedule.
    pub now: DateTime<Utc>,
}

/// Enqueue one slot of a declared schedule, once: in one transaction, move
/// the schedule's `last_slot` to `slot` if it is still before it, and only
/// then enqueue `message`.
#[derive(Debug, Clone)]
pub struct EnqueueSlot {
    /// The schedule's name.
    pub schedule: String,
    /// The slot: its scheduled time.
    pub slot: DateTime<Utc>,
    /// The slot after it, stored as the schedule's `next_slot`.
    pub next_slot: Option<DateTime<Utc>>,
    /// Who enqueues it, stored as `last_enqueued_by`.
    pub enqueued_by: String,
    /// The slot's message, enqueued as any other (its `now` is
    /// `last_enqueued_at`). The runtime gives it the slot's
    /// [`slot_key`] as idempotency key and the slot as `available_at`.
    pub message: NewMessage,
}

/// What [`ScheduleStore::enqueue_slot`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SlotOutcome {
    /// This call moved `last_slot` to the slot and enqueued its message:
    /// [`Enqueued::Inserted`], or [`Enqueued::AlreadyExists`] when the
    /// message's id or idempotency key was already taken (nothing else was
    /// written for the slot then).
    Enqueued(Enqueued),
    /// The schedule was already at or past the slot: another process (or
    /// an earlier call) enqueued it or passed over it. Nothing was written.
    Taken {
        /// The schedule's `last_slot` as found.
        last_slot: DateTime<Utc>,
    },
}

/// The schedule operations of a store, which the runtime uses to run
/// periodic schedules. Reached through
/// [`OutboxStore::schedules`](crate::OutboxStore::schedules), so it is
/// object-safe: its futures are boxed (schedules write once per slot).
pub trait ScheduleStore: Send + Sync {
    /// Create the schedule's row, or update its definition; answers the
    /// row as it now is. A name that breaks [`schedule_name_problem`] is
    /// refused with [`Error::InvalidInput`](crate::Error::InvalidInput).
    fn declare_schedule(&self, params: DeclareSchedule) -> BoxFuture<'_, Result<ScheduleState>>;

    /// Enqueue one slot once; see [`EnqueueSlot`] and [`SlotOutcome`]. A
    /// schedule never declared is refused with [`Error::InvalidInput`](crate::Error::InvalidInput)
    /// (field `schedule`), an invalid message as
    /// [`OutboxStore::enqueue`](crate::OutboxStore::enqueue) refuses it;
    /// neither writes anything.
    fn enqueue_slot(&self, params: EnqueueSlot) -> BoxFuture<'_, Result<SlotOutcome>>;
}

/// The checks every store runs before a schedule operation writes anything.
pub(crate) mod check {
    use crate::error::{Error, Result};
    use crate::store::schedules::{DeclareSchedule, EnqueueSlot, schedule_name_problem};

    pub(crate) fn declare(params: &DeclareSchedule) -> Result<()> {
        name("name", &params.name)?;
        for (field, text) in [
            ("expression", &params.expression),
            ("time_zone", &params.time_zone),
            ("message_name", &params.message_name),
        ] {
            if text.trim().is_empty() {
                return Err(Error::invalid(field, "must not be empty"));
            }
            if text.contains('\0') {
                return Err(Error::invalid(field, "contains a NUL character"));
            }
        }
        Ok(())
    }

    pub(crate) fn enqueue_slot(params: &EnqueueSlot) -> Result<()> {
        name("schedule", &params.schedule)?;
        if params.enqueued_by.contains('\0') {
            return Err(Error::invalid("enqueued_by", "contains a NUL character"));
        }
        params.message.validate()
    }

    fn name(field: &'static str, name: &str) -> Result<()> {
        match schedule_name_problem(name) {
            Some(reason) => Err(Error::invalid(field, reason)),
            None => Ok(()),
        }
    }

    /// The refusal for a slot of a schedule that was never declared.
    pub(crate) fn undeclared(name: &str) -> Error {
        Error::invalid(
            "schedule",
            format!("no schedule named {name:?} is declared in this outbox; declare it first"),
        )
    }
}
