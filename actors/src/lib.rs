//! The actix drain runtime for the [`outbox`] crate.
//!
//! Start a [`DrainCoordinator`] inside your actix system, send it [`Drain`]
//! (or give it a schedule), and subscribe to lease-lost notifications. Each
//! pass claims messages under a lease, delivers each one in its own
//! supervised actor while a heartbeat keeps the lease alive, and settles it
//! only while its claim token still owns it.
//!
//! This crate re-exports [`outbox`], so an application that drains needs
//! this one dependency.
//!
//! # Example
//!
//! ```
//! use actix::prelude::*;
//! use outbox_actors::prelude::*;
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct OrderPlaced { order_id: u64 }
//! impl Event for OrderPlaced { const NAME: &'static str = "order.placed"; }
//!
//! struct Alerts;
//! impl Actor for Alerts { type Context = Context<Self>; }
//! impl Handler<LeaseLost> for Alerts {
//!     type Result = ();
//!     fn handle(&mut self, lost: LeaseLost, _: &mut Context<Self>) {
//!         eprintln!("lease of {} {:?}: {}", lost.id, lost.state, lost.error);
//!     }
//! }
//!
//! #[actix::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let store = MemoryOutbox::new();
//!     store.enqueue(NewMessage::event(&OrderPlaced { order_id: 1 })?).await?;
//!
//!     let coordinator = DrainCoordinator::builder(store)
//!         .event_bus(InProcessBus::new().on(|order: std::sync::Arc<OrderPlaced>, _ctx| async move {
//!             println!("order {} placed", order.order_id);
//!             Ok(())
//!         }))
//!         .config(DrainConfig { every: Some(std::time::Duration::from_secs(1)), ..Default::default() })
//!         .start()?;
//!     coordinator.send(Subscribe::LeaseLost(Alerts.start().recipient())).await?;
//!
//!     let report = coordinator.send(Drain).await??;
//!     println!("{report}");
//!     coordinator.send(Shutdown { grace: std::time::Duration::from_secs(5) }).await?;
//!     Ok(())
//! }
//! ```
//!
//! # Guide
//!
//! The guide explains the runtime at length: its
//! [configuration](https://github.com/outbox-rs/outbox/blob/main/docs/src/configuration.md) (every [`DrainConfig`](outbox::DrainConfig)
//! knob, retries, retention), the [guarantees](https://github.com/outbox-rs/outbox/blob/main/docs/src/guarantees.md) and what
//! each failure costs, the [architecture](https://github.com/outbox-rs/outbox/blob/main/docs/src/architecture.md) of the actors,
//! and [observability](https://github.com/outbox-rs/outbox/blob/main/docs/src/observability.md) (every event and metric).
//!
//! # Layout
//!
//! ```text
//! DrainCoordinator ──Refill/WindDown──▶ Claimer ──starts, Abort──▶ DeliveryActor ──starts, StopAndHandOver──▶ HeartbeatActor
//!        ▲   ▲                            ▲  │                         │   ▲                                   │
//!        │   └──── Abandoned, ClaimerDone ┘  │                         │   └──── lease handed over / lost ─────┘
//!        └──────────── DeliveryFinished { outcome } ───────────────────┘
//!                                            ▲                         │
//!                                            └── HandlerReturned, DeliveryEnded
//! ```
//!
//! Commands travel down the tree and sit at the top of the receiving
//! actor's file; reports travel up as the types of `messages`, to
//! `Recipient`s of the parent. The modules are listed from the top of the
//! tree down, and each module imports only modules listed after it:
//!
//! - `testing` (feature `testing`): [`testing`], helpers for an
//!   application's tests: a paused actix system, draining until idle, and
//!   the core's helpers re-exported.
//! - `coordinator`: [`DrainCoordinator`], long-lived, one per outbox. Runs
//!   passes on [`Drain`], on its schedule and on store wake-ups (never two
//!   at once, and back to back while claims come back full), tallies
//!   [`DrainReport`]s, fans out notifications to [`Subscribe`]rs, and
//!   handles [`Shutdown`]. Its [`DrainCoordinatorBuilder`] checks the
//!   settings, registrations and schedules before it starts; it runs each
//!   periodic schedule as a future of its own and answers [`GetSchedules`].
//! - `schedule`: periodic messages: [`Schedule`] (a cron expression or an
//!   interval, in a time zone) and its [`CatchUp`] policy, when its slots
//!   fall, and the loop that enqueues each slot once through the store
//!   however many processes run it.
//! - `claimer`: one per pass; claims only as many messages as there are free
//!   delivery slots and refills a slot as soon as it frees.
//! - `delivery`: one `DeliveryActor` per message; runs the handler (a panic
//!   is a delivery failure), owns the `max_active` timer, has the
//!   settlement written, and reports how the delivery ended once, in one
//!   place: telemetry, metrics, observers, then the outcome with its
//!   notices (through a drop guard if it dies).
//! - `heartbeat`: the delivery's child `HeartbeatActor`; renews the lease
//!   and hands the last confirmed lease to the settlement.
//! - `settlement`: the settlement protocol as plain async functions: the
//!   fenced writes that end a delivery, returning what happened.
//! - `lease`: the deadline a delivery works to (the end of its last
//!   confirmed lease or of `max_active`, whichever comes first), when to
//!   renew before it, and the loss to report once it has passed.
//! - `retention`: deleting settled messages past their horizon, in bounded
//!   batches beside the passes.
//! - `registrations`: the registry checked against the transports at start,
//!   or derived from their typed handlers.
//! - `recipient`: [`RecipientBus`] and [`RecipientJobs`], delivery to actors.
//! - `telemetry`: the delivery span, and one hook per outcome that emits its
//!   tracing event and records its metrics.
//! - [`metrics`]: the metric names, with their labels and units.
//! - [`events`]: the tracing event names, with the level and fields of each.
//! - `messages`: the internal reports that travel up the tree, and the
//!   claimer's reasons for giving a message back undelivered.
//! - `context`: what the actors of one coordinator share, and the
//!   [`DrainObserver`] hooks.
//! - `notices`: the public notifications: [`LeaseLost`] with
//!   [`HandlerResult`], [`OutcomeNotice`], [`SettlementFailed`],
//!   [`DeadLetter`], [`CancelledMessage`].
//! - `error`: [`Error`], with the errors only a running drain meets
//!   ([`LeaseLostError`], [`MaxActiveDurationError`]).
//! - `report`: what a pass did, [`DrainReport`], and the one [`Outcome`] of
//!   each message it claimed.
//! - `sizing`: how much a drain claims ahead and how many claims it
//!   overlaps when its config leaves them unset, from what it measures and
//!   what the store says suits it.
//!
//! # Tracing
//!
//! Each delivery runs in its own span, `outbox deliver {name}` (the span is
//! named `outbox deliver`; `otel.name` gives exporters the full name), with
//! the fields `outbox.message_kind`, `outbox.message_name`,
//! `outbox.message_id` and `outbox.attempt`, at `info` level, target
//! `outbox`. It is a root span unless the message carries a trace context:
//! with the `opentelemetry` feature its parent is the span that enqueued the
//! message (see [`outbox::TraceCarrier`]), and the handler's
//! [`DeliveryContext::trace`](outbox::DeliveryContext::trace) is the delivery
//! span's own context, to continue the trace downstream. A stored context
//! that does not parse is logged at `debug` ([`events::TRACE_INVALID`]) and the
//! delivery starts a new trace; it never fails the delivery. Without the
//! feature, handlers get the stored context unchanged.
//!
//! Every outcome, and every other thing worth a log line (a failed claim,
//! a retention run, a pass's tally), is one event with target `outbox` and
//! a stable `event` field to match on. [`events`] names them all, with
//! the level and fields of each; [`events::ALL`] is the same list as data.
//! Job messages also emit a job-level record (`job.*`). Payloads are never
//! logged above `trace` level.
//!
//! # Metrics
//!
//! The runtime records counters per outcome, histograms of delivery time
//! and of enqueue-to-delivery latency, and gauges of active deliveries and
//! pending messages through the [`metrics`](https://docs.rs/metrics) facade,
//! into whatever recorder the application installs. The names, labels and
//! units are listed in [`metrics`].
//!
//! # Features
//!
//! - The stores, `sqlite` (default) and `postgres`: forwarded to [`outbox`].
//! - Trace propagation from enqueue to delivery, `opentelemetry`: forwarded
//!   to `outbox/opentelemetry`, as above.
//! - Helpers for an application's tests, `testing`: the [`testing`] module
//!   (and `outbox/testing`); it turns on tokio's `test-util`, so enable it
//!   in `[dev-dependencies]` only.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod claimer;
mod context;
mod coordinator;
mod delivery;
mod error;
pub mod events;
mod heartbeat;
mod lease;
mod messages;
pub mod metrics;
mod notices;
mod recipient;
mod registrations;
mod report;
mod retention;
mod schedule;
mod settlement;
mod sizing;
mod telemetry;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;

pub use outbox;

pub use context::{DrainObserver, ObserverResult};
pub use coordinator::{
    CoordinatorStatus, Drain, DrainCoordinator, DrainCoordinatorBuilder, GetSchedules, GetStatus,
    Shutdown, Subscribe,
};
pub use error::{Error, LeaseLostError, MaxActiveDurationError, Result, ScheduleError};
pub use notices::{
    CancelledMessage, DeadLetter, HandlerResult, LeaseLost, LeaseOperation, LeaseState,
    OutcomeNotice, SettleOperation, SettlementFailed,
};
pub use recipient::{DeliverEvent, DeliverJob, RecipientBus, RecipientJobs};
pub use report::{DrainReport, Outcome};
pub use schedule::{CatchUp, DEFAULT_CATCH_UP_WITHIN, Schedule, ScheduleStatus};

/// The names most drain programs need: `use outbox_actors::prelude::*;`.
pub mod prelude {
    pub use crate::{
        CatchUp, CoordinatorStatus, DeadLetter, DeliverEvent, DeliverJob, Drain, DrainCoordinator,
        DrainObserver, DrainReport, GetSchedules, GetStatus, HandlerResult, LeaseLost,
        LeaseOperation, LeaseState, OutcomeNotice, RecipientBus, RecipientJobs, Schedule, Shutdown,
        Subscribe,
    };
    pub use outbox::prelude::*;
}
