//! Metrics, through the [`metrics`](https://docs.rs/metrics) facade.
//!
//! The runtime records into whatever recorder the application installs
//! (for example `metrics-exporter-prometheus`); with none installed every
//! call is a no-op. Install it before the runtime starts: a drain pass
//! takes the handles of what every delivery records from the recorder
//! installed when it does, once per message name. Names follow Prometheus
//! conventions: counters end in `_total`, durations are histograms in
//! seconds. The constants below are the names, for dashboards and tests.
//!
//! Labels: `kind` is `event` or `job`, `name` the registered message name
//! (so cardinality is the number of registered types).
//!
//! | metric | type | unit | labels | what |
//! |---|---|---|---|---|
//! | `outbox_claimed_total` | counter | messages | `kind`, `name` | claims that started a delivery |
//! | `outbox_delivered_total` | counter | messages | `kind`, `name` | delivered and settled |
//! | `outbox_retried_total` | counter | messages | `kind`, `name` | failed and settled for a retry |
//! | `outbox_dead_lettered_total` | counter | messages | `kind`, `name`, `abandoned` | dead-lettered; `abandoned="true"` when at claim, attempts used up |
//! | `outbox_settlement_failed_total` | counter | messages | `kind`, `name`, `claim_lost` | the outcome could not be stored |
//! | `outbox_cancelled_total` | counter | messages | `kind`, `name`, `at_claim` | cancelled while claimed, never to run again: after a failed handler, or at claim (`at_claim="true"`), the lease run out |
//! | `outbox_released_total` | counter | messages | `kind`, `name` | claims given back unsettled: at shutdown, or because a claim came back with less lease left than it took |
//! | `outbox_release_failed_total` | counter | messages | `kind`, `name` | claims not given back (the store failed or did not answer); claimable after their lease |
//! | `outbox_claim_failed_total` | counter | claims | none | claims that failed or broke the store's contract; each stops its pass claiming |
//! | `outbox_lease_failures_total` | counter | notifications | `kind`, `name`, `state`, `operation` | every [`LeaseLost`] notification but a failed release (counted in `outbox_release_failed_total`): `state` is `lost`, `recovered` or `degraded`, `operation` is `renew` or `max_active` |
//! | `outbox_delivery_duration_seconds` | histogram | seconds | `kind`, `name`, `outcome` | handler start to settled, for `outcome` `delivered`, `retried` or `dead_lettered` |
//! | `outbox_enqueue_to_delivered_seconds` | histogram | seconds | `kind`, `name` | `created_at` to settled as delivered: waiting, deliberate delays and retries included |
//! | `outbox_retention_deleted_total` | counter | messages | `status` | settled messages deleted by retention runs, and delivered ones deleted as they settle (`delete_on_delivery`); `status` is `delivered` or `dead_lettered` |
//! | `outbox_schedule_slots_total` | counter | slots | `schedule`, `outcome` | slots of a periodic schedule this process tried: `outcome` is `enqueued` (this process wrote it), `taken` (another process had) or `failed` (a store call for the schedule failed; tried again) |
//! | `outbox_active_deliveries` | gauge | deliveries | none | deliveries running now, in this process |
//! | `outbox_pending_messages` | gauge | messages | none | `Pending` messages in the store, sampled after each drain pass |
//!
//! `metrics-exporter-prometheus` renders a histogram as a summary (quantiles,
//! which cannot be added up across instances) unless it is given buckets:
//! call `PrometheusBuilder::set_buckets_for_metric` for the two histograms,
//! as the actix-web example does, to export `_bucket{le=…}`, `_sum` and
//! `_count`.
//!
//! Deliveries whose claim was lost, or whose outcome could not be stored,
//! record no duration: they did not settle. The pending gauge is reported
//! by stores that implement
//! [`OutboxStore::pending_count`](outbox::OutboxStore::pending_count), as
//! the memory, SQLite and PostgreSQL stores do.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use foldhash::HashMap;
use metrics::{
    Counter, Gauge, Histogram, SharedString, Unit, counter, describe_counter, describe_gauge,
    describe_histogram, gauge, histogram,
};
use outbox::{ClaimedMessage, MessageKind};

use crate::notices::{CancelledMessage, DeadLetter, LeaseLost, LeaseState, SettlementFailed};
use crate::report::Outcome;

/// Counter: claims that started a delivery.
pub const CLAIMED: &str = "outbox_claimed_total";
/// Counter: messages delivered and settled.
pub const DELIVERED: &str = "outbox_delivered_total";
/// Counter: failed deliveries settled for a retry.
pub const RETRIED: &str = "outbox_retried_total";
/// Counter: messages dead-lettered, label `abandoned`.
pub const DEAD_LETTERED: &str = "outbox_dead_lettered_total";
/// Counter: outcomes that could not be stored, label `claim_lost`.
pub const SETTLEMENT_FAILED: &str = "outbox_settlement_failed_total";
/// Counter: messages cancelled while claimed, label `at_claim`.
pub const CANCELLED: &str = "outbox_cancelled_total";
/// Counter: claims given back unsettled (at shutdown, or claimed too late).
pub const RELEASED: &str = "outbox_released_total";
/// Counter: claims not given back.
pub const RELEASE_FAILED: &str = "outbox_release_failed_total";
/// Counter: claims that failed; each stops its pass claiming.
pub const CLAIM_FAILED: &str = "outbox_claim_failed_total";
/// Counter: lease notifications, labels `state` and `operation`.
pub const LEASE_FAILURES: &str = "outbox_lease_failures_total";
/// Counter: settled messages deleted by retention, label `status`.
pub const RETENTION_DELETED: &str = "outbox_retention_deleted_total";
/// Counter: slots of a periodic schedule tried, labels `schedule` and `outcome`.
pub const SCHEDULE_SLOTS: &str = "outbox_schedule_slots_total";
/// Histogram (seconds): handler start to settled, label `outcome`.
pub const DELIVERY_DURATION: &str = "outbox_delivery_duration_seconds";
/// Histogram (seconds): enqueue (`created_at`) to settled as delivered.
pub const ENQUEUE_TO_DELIVERED: &str = "outbox_enqueue_to_delivered_seconds";
/// Gauge: deliveries running now.
pub const ACTIVE_DELIVERIES: &str = "outbox_active_deliveries";
/// Gauge: `Pending` messages in the store, sampled after each pass.
pub const PENDING_MESSAGES: &str = "outbox_pending_messages";

/// Give the installed recorder units and help texts (a Prometheus exporter
/// prints them as `# HELP`). Cheap, so every coordinator does it at start.
pub(crate) fn describe() {
    let counters = [
        (CLAIMED, "Claims that started a delivery."),
        (DELIVERED, "Messages delivered and settled."),
        (RETRIED, "Failed deliveries settled for a retry."),
        (
            DEAD_LETTERED,
            "Messages dead-lettered, at claim (abandoned) or after delivery.",
        ),
        (
            SETTLEMENT_FAILED,
            "Deliveries whose outcome could not be stored.",
        ),
        (
            RELEASED,
            "Claims given back unsettled: at shutdown, or claimed too late.",
        ),
        (
            RELEASE_FAILED,
            "Claims not given back; claimable after their lease.",
        ),
        (
            CLAIM_FAILED,
            "Claims that failed; each stops its pass claiming.",
        ),
        (
            LEASE_FAILURES,
            "Lease notifications: lost, recovered or degraded.",
        ),
        (RETENTION_DELETED, "Settled messages deleted by retention."),
        (
            CANCELLED,
            "Messages cancelled while claimed, after their handler or at claim.",
        ),
        (
            SCHEDULE_SLOTS,
            "Slots of periodic schedules tried: enqueued, taken by another process, failed.",
        ),
    ];
    for (name, help) in counters {
        describe_counter!(name, Unit::Count, help);
    }
    describe_histogram!(
        DELIVERY_DURATION,
        Unit::Seconds,
        "Time from handler start to settled outcome."
    );
    describe_histogram!(
        ENQUEUE_TO_DELIVERED,
        Unit::Seconds,
        "Time from enqueue to settled as delivered."
    );
    describe_gauge!(ACTIVE_DELIVERIES, Unit::Count, "Deliveries running now.");
    describe_gauge!(
        PENDING_MESSAGES,
        Unit::Count,
        "Pending messages in the store, sampled after each drain pass."
    );
}

fn name(name: &str) -> SharedString {
    SharedString::from(name.to_owned())
}

fn flag(value: bool) -> &'static str {
    if value { "true" } else { "false" }
}

/// The handles of what every delivery of one kind and name records.
///
/// Taken from the recorder once per name and pass, not once per message:
/// a record through the macros builds its key each time (the labels
/// allocated, the whole hashed), which cost about a twentieth of a fast
/// drain's time. A recorder installed while a pass runs gets these
/// figures from the next pass on.
pub(crate) struct NameMetrics {
    kind: MessageKind,
    name: SharedString,
    claimed: Counter,
    active: Gauge,
    /// Taken at the first delivery: a recorder shows a series from its
    /// first record on, and a name whose messages all fail has none.
    delivered: OnceLock<Delivered>,
}

struct Delivered {
    count: Counter,
    duration: Histogram,
    since_enqueue: Histogram,
}

impl NameMetrics {
    fn new(kind: MessageKind, message_name: &str) -> Self {
        // Shared, so each handle's label is a reference count, not a copy.
        let label = SharedString::from(Arc::<str>::from(message_name));
        NameMetrics {
            claimed: counter!(CLAIMED, "kind" => kind.as_str(), "name" => label.clone()),
            active: gauge!(ACTIVE_DELIVERIES),
            delivered: OnceLock::new(),
            kind,
            name: label,
        }
    }

    fn delivered(&self) -> &Delivered {
        self.delivered.get_or_init(|| {
            let (kind, name) = (self.kind.as_str(), &self.name);
            Delivered {
                count: counter!(DELIVERED, "kind" => kind, "name" => name.clone()),
                duration: histogram!(DELIVERY_DURATION, "kind" => kind, "name" => name.clone(),
                    "outcome" => "delivered"),
                since_enqueue: histogram!(ENQUEUE_TO_DELIVERED, "kind" => kind,
                    "name" => name.clone()),
            }
        })
    }
}

/// One pass's [`NameMetrics`], by kind and name.
#[derive(Default)]
pub(crate) struct PassMetrics {
    by_name: [HashMap<String, Arc<NameMetrics>>; 2],
}

impl PassMetrics {
    /// The handles for messages of `kind` named `name`.
    pub(crate) fn of(&mut self, kind: MessageKind, name: &str) -> Arc<NameMetrics> {
        let names = &mut self.by_name[usize::from(kind == MessageKind::Job)];
        if let Some(metrics) = names.get(name) {
            return metrics.clone();
        }
        let metrics = Arc::new(NameMetrics::new(kind, name));
        names.insert(name.to_owned(), metrics.clone());
        metrics
    }
}

pub(crate) fn claimed(metrics: &NameMetrics) {
    metrics.claimed.increment(1);
    metrics.active.increment(1.0);
}

pub(crate) fn reported(metrics: &NameMetrics) {
    metrics.active.decrement(1.0);
}

pub(crate) fn retried(message: &ClaimedMessage) {
    counter!(RETRIED, "kind" => message.kind.as_str(), "name" => name(&message.name)).increment(1);
}

pub(crate) fn dead_lettered(dead_letter: &DeadLetter) {
    counter!(DEAD_LETTERED, "kind" => dead_letter.kind.as_str(),
        "name" => name(&dead_letter.name), "abandoned" => flag(dead_letter.abandoned))
    .increment(1);
}

pub(crate) fn cancelled(cancelled: &CancelledMessage) {
    counter!(CANCELLED, "kind" => cancelled.kind.as_str(), "name" => name(&cancelled.name),
        "at_claim" => flag(cancelled.at_claim))
    .increment(1);
}

pub(crate) fn settlement_failed(failure: &SettlementFailed) {
    counter!(SETTLEMENT_FAILED, "kind" => failure.kind.as_str(), "name" => name(&failure.name),
        "claim_lost" => flag(failure.claim_lost))
    .increment(1);
}

pub(crate) fn released(message: &ClaimedMessage) {
    counter!(RELEASED, "kind" => message.kind.as_str(), "name" => name(&message.name)).increment(1);
}

pub(crate) fn release_failed(message: &ClaimedMessage) {
    counter!(RELEASE_FAILED, "kind" => message.kind.as_str(), "name" => name(&message.name))
        .increment(1);
}

pub(crate) fn claim_failed() {
    counter!(CLAIM_FAILED).increment(1);
}

pub(crate) fn schedule_slot(schedule: &str, outcome: &'static str) {
    counter!(SCHEDULE_SLOTS, "schedule" => name(schedule), "outcome" => outcome).increment(1);
}

pub(crate) fn retention_deleted(status: outbox::MessageStatus, deleted: u64) {
    counter!(RETENTION_DELETED, "status" => status.as_str()).increment(deleted);
}

pub(crate) fn lease_failure(failure: &LeaseLost) {
    let state = match failure.state {
        LeaseState::Lost => "lost",
        LeaseState::Recovered => "recovered",
        LeaseState::Degraded => "degraded",
    };
    let operation = failure.operation.as_str();
    counter!(LEASE_FAILURES, "kind" => failure.kind.as_str(), "name" => name(&failure.name),
        "state" => state, "operation" => operation)
    .increment(1);
}

/// A settled delivery took `handling` from handler start, and (when
/// delivered) `since_enqueue` from `created_at`.
pub(crate) fn settled(
    metrics: &NameMetrics,
    outcome: Outcome,
    handling: Duration,
    since_enqueue: Duration,
) {
    let label = match outcome {
        Outcome::Delivered => {
            let delivered = metrics.delivered();
            delivered.count.increment(1);
            delivered.duration.record(handling.as_secs_f64());
            delivered.since_enqueue.record(since_enqueue.as_secs_f64());
            return;
        }
        Outcome::Retried => "retried",
        Outcome::DeadLettered => "dead_lettered",
        Outcome::SettlementFailed { .. }
        | Outcome::LeaseLost
        | Outcome::Released
        | Outcome::Cancelled => return,
    };
    histogram!(DELIVERY_DURATION, "kind" => metrics.kind.as_str(),
        "name" => metrics.name.clone(), "outcome" => label)
    .record(handling.as_secs_f64());
}

pub(crate) fn pending(count: u64) {
    // Precision loss starts at 2^53 messages.
    gauge!(PENDING_MESSAGES).set(count as f64);
}
