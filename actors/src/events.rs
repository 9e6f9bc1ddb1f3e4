//! The tracing events the runtime emits: one constant per event name, and
//! [`ALL`], the list of them with their levels and fields.
//!
//! Every event has target `outbox` and a stable `event` field holding one
//! of these names, so log pipelines can match on it rather than on the
//! message text. The events of a delivery are emitted inside its span,
//! `outbox deliver` (see the crate docs). A payload appears in one event
//! only, [`DELIVERY_STARTED`], at `trace` level.
//!
//! The runtime emits these constants, never a name written out, and a test
//! checks that it does: each name is written once, here, with the level and
//! fields it is emitted with.
//!
//! ```
//! use outbox_actors::events;
//!
//! let delivered = events::ALL
//!     .iter()
//!     .find(|event| event.name == events::DELIVERED)
//!     .expect("listed");
//! assert_eq!(delivered.level, tracing::Level::INFO);
//! assert!(delivered.fields.contains(&"id"));
//! ```

use tracing::Level;

/// One tracing event of the runtime, as [`ALL`] lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct TracingEvent {
    /// The value of its `event` field: one of this module's constants.
    pub name: &'static str,
    /// The level it is emitted at.
    pub level: Level,
    /// The levels it is emitted at in the cases its description names
    /// instead; empty for most events.
    pub other_levels: &'static [Level],
    /// Its fields besides `event`, in the order they are recorded; a field
    /// the description calls optional is left out when it has no value.
    pub fields: &'static [&'static str],
    /// When it is emitted, in a sentence or two.
    pub description: &'static str,
}

/// Writes each event once: its constant, with a doc comment made of its
/// description, level and fields, and its entry in [`ALL`].
macro_rules! events {
    ($(
        $constant:ident = $name:literal at $level:ident $(or $other:ident)*,
        fields [$first:ident $(, $field:ident)*]:
        $description:literal;
    )*) => {
        $(
            #[doc = $description]
            #[doc = ""]
            #[doc = concat!(
                "Name `", $name, "`, level `", stringify!($level), "`",
                $(" (`", stringify!($other), "` as described)",)*
                ", fields `", stringify!($first), "`", $(", `", stringify!($field), "`",)*
                "."
            )]
            pub const $constant: &str = $name;
        )*

        /// Every event the runtime emits, grouped by what it is about:
        /// a delivery, a job's own record, a pass, retention, schedules.
        pub const ALL: &[TracingEvent] = &[$(
            TracingEvent {
                name: $constant,
                level: Level::$level,
                other_levels: &[$(Level::$other),*],
                fields: &[stringify!($first) $(, stringify!($field))*],
                description: $description,
            },
        )*];
    };
}

events! {
    TRACE_INVALID = "outbox.trace_invalid" at DEBUG,
        fields [id, error]:
        "The trace context stored with a message does not parse: its delivery starts a \
         trace of its own. Never fails the delivery.";
    DELIVERY_STARTED = "outbox.delivery_started" at TRACE,
        fields [id, kind, name, attempt, payload]:
        "A handler starts on a claimed message. The only event that carries the payload.";
    DELIVERED = "outbox.delivered" at INFO,
        fields [id, kind, name, attempt]:
        "A message was delivered and stored as delivered.";
    RETRY_SCHEDULED = "outbox.retry_scheduled" at WARN,
        fields [id, kind, name, attempt, retry_delay_ms, retry_at, error]:
        "A delivery failed and was stored for another attempt after `retry_delay_ms` \
         (at `retry_at`, RFC 3339, when known).";
    DEAD_LETTERED = "outbox.dead_lettered" at ERROR,
        fields [id, kind, name, attempts, abandoned, error]:
        "A message was dead-lettered: after a delivery that failed for good, or \
         (`abandoned`) at claim, its attempts used up by workers that never settled it.";
    LEASE_LOST = "outbox.lease_lost" at WARN or ERROR,
        fields [id, kind, name, operation, confirmed_lost, handler, error]:
        "A claim was lost or could not be confirmed (a renewal or the first settlement \
         write, or `max_active`): the delivery was aborted, or its handler's result \
         (`handler`) is not settled, and the message is delivered again after its lease. \
         At `ERROR`, with `id`, `kind`, `name` and `confirmed_lost` only, when the \
         delivery actor itself died.";
    RENEWAL_RECOVERED = "outbox.renewal_recovered" at INFO,
        fields [id, kind, name, error]:
        "Renewals of a claim failed (`error`, the first failure), then the first \
         settlement write succeeded: the message settled normally.";
    RENEWAL_DEGRADED = "outbox.renewal_degraded" at WARN,
        fields [id, kind, name, error]:
        "The first settlement write failed (`error`) without losing the claim: the \
         settlement goes on under the last confirmed lease.";
    SETTLEMENT_FAILED = "outbox.settlement_failed" at ERROR,
        fields [id, kind, name, delivery_succeeded, claim_lost, error]:
        "A delivery's outcome could not be stored; the message is claimable again after \
         its lease (`claim_lost` when the claim was lost while trying).";
    CANCEL_REQUESTED = "outbox.cancel_requested" at INFO,
        fields [id, kind, name, queue, attempt]:
        "A renewal reported that an operator cancelled the message being delivered: its \
         handler can see it (`DeliveryContext::is_cancelled`). If the handler then fails, or \
         the claim is given back, the message ends cancelled; if it succeeds, delivered.";
    CANCELLED = "outbox.cancelled" at INFO,
        fields [id, kind, name, queue, attempts, at_claim]:
        "A message cancelled while claimed ended cancelled and will never run again: its \
         handler failed after the request, or (`at_claim`) a claim found its lease run out.";
    CLAIM_TOO_LATE = "outbox.claim_too_late" at WARN,
        fields [id, name, took_ms, lease_left_ms]:
        "A claim took longer than the lease it left: its message is given back \
         undelivered (then `outbox.released`).";
    PREFETCH_STALE = "outbox.prefetch_stale" at WARN,
        fields [id, name, waited_ms, lease_left_ms]:
        "A prefetched message waited for a free slot until too little of its lease was \
         left: it is given back undelivered (then `outbox.released`).";
    RELEASED = "outbox.released" at INFO,
        fields [id, name]:
        "A claim was given back undelivered, claimable again at once: at shutdown, or \
         because it came back too late or waited too long for a slot.";
    RELEASE_FAILED = "outbox.release_failed" at WARN,
        fields [id, error]:
        "A claim could not be given back (`error`), or giving it back did not answer \
         within a lease (no `error`): the message is claimable after its lease.";
    JOB_COMPLETED = "job.completed" at INFO,
        fields [id, job, attempt]:
        "A job message was delivered: its job-level record, beside `outbox.delivered`.";
    JOB_RETRY_SCHEDULED = "job.retry_scheduled" at WARN,
        fields [id, job, attempt, retry_delay_ms, retry_at, error]:
        "A job failed and is retried: its job-level record, beside \
         `outbox.retry_scheduled`.";
    JOB_DEAD_LETTERED = "job.dead_lettered" at ERROR,
        fields [id, job, attempts, abandoned, error]:
        "A job was dead-lettered: its job-level record, beside `outbox.dead_lettered`.";
    CLAIM_FAILED = "outbox.claim_failed" at WARN or ERROR,
        fields [error]:
        "A claim failed or did not answer within a lease: the pass stops claiming and the \
         next one tries again. At `ERROR` when the store returned more messages than \
         asked for.";
    CLAIMING_PAUSED = "outbox.claiming_paused" at DEBUG,
        fields [pause_ms]:
        "A delivery's store call failed for the store's sake, or a claim came back too \
         late: the pass claims again after `pause_ms`.";
    ARMING_FAILED = "outbox.arming_failed" at WARN,
        fields [error]:
        "Asking the store for a wake-up on the next insert failed: the coordinator claims \
         again after a heartbeat interval instead of waiting for one.";
    WARM_UP_FAILED = "outbox.warm_up_failed" at DEBUG,
        fields [error]:
        "Preparing the store's connections at start failed: they are opened as needed, \
         and a store that is down is reported by the first claim.";
    PASS_FINISHED = "outbox.pass_finished" at DEBUG,
        fields [claimed, delivered, retried, dead_lettered, settlement_failed, lease_lost,
            cancelled]:
        "A drain pass ended, with its tally.";
    RETENTION = "outbox.retention" at INFO or DEBUG,
        fields [status, deleted, horizon_s]:
        "A retention run deleted `deleted` settled messages of `status` older than \
         `horizon_s`; at `DEBUG` when it found none.";
    RETENTION_FAILED = "outbox.retention_failed" at WARN,
        fields [status, error]:
        "A retention batch failed: the run stops, and the next one tries again.";
    RETENTION_VACUUM = "outbox.retention_vacuum" at DEBUG,
        fields [deleted]:
        "Retention vacuumed the store after `deleted` rows went.";
    RETENTION_VACUUM_FAILED = "outbox.retention_vacuum_failed" at WARN,
        fields [error]:
        "The vacuum after a retention run failed; the next run tries again.";
    SCHEDULE_SLOT_ENQUEUED = "outbox.schedule_slot_enqueued" at INFO,
        fields [schedule, slot, id, late_ms]:
        "This process enqueued the message of a periodic schedule's slot, `late_ms` after \
         the slot (more than a few milliseconds when it caught up on a missed slot).";
    SCHEDULE_SLOT_TAKEN = "outbox.schedule_slot_taken" at DEBUG,
        fields [schedule, slot, last_slot]:
        "Another process had already enqueued the slot (the schedule was at `last_slot`): \
         this one wrote nothing.";
    SCHEDULE_SLOTS_MISSED = "outbox.schedule_slots_missed" at INFO,
        fields [schedule, after, before, catch_up]:
        "The slots after `after` (the last slot enqueued, or the schedule's first \
         declaration) and before `before` (the slot enqueued now) passed while no process \
         ran the schedule, and are passed over: those older than the catch-up horizon, and \
         under `catch_up` = `latest` all but the latest.";
    SCHEDULE_FAILED = "outbox.schedule_failed" at WARN,
        fields [schedule, error, retry_ms]:
        "Declaring a periodic schedule, or enqueueing one of its slots, failed in the store; \
         this process tries again after `retry_ms` (other processes running the schedule \
         may enqueue the slot meanwhile).";
}
