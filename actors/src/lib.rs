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
//! # Layout
//!
//! ```text
//! DrainCoordinator ──starts──▶ Claimer ──one per message──▶ DeliveryActor ──child──▶ HeartbeatActor
//!        ▲                                                        │                        │
//!        └───────── outcome messages (settled, lease lost, max active, released) ──────────┘
//! ```
//!
//! - `coordinator`: [`DrainCoordinator`], long-lived, one per outbox. Runs
//!   passes on [`Drain`], on its schedule and on store wake-ups (never two at
//!   once), tallies [`DrainReport`]s, fans out notifications to
//!   [`Subscribe`]rs, and handles [`Shutdown`].
//! - `claimer`: one per pass; claims only as many messages as there are free
//!   delivery slots and refills a slot as soon as it frees.
//! - `delivery`: one `DeliveryActor` per message; runs the handler (a panic
//!   is a delivery failure), owns the `max_active` timer, settles, and
//!   reports exactly one outcome, through a drop guard if it dies.
//! - `heartbeat`: the delivery's child `HeartbeatActor`; renews the lease
//!   and gives the final extension before settlement.
//! - `messages`: what several actors exchange and what subscribers receive:
//!   [`DrainReport`], [`Outcome`], [`LeaseLost`], [`OutcomeNotice`].
//! - `context`: what the actors of one coordinator share, and the
//!   [`DrainObserver`] hooks.
//! - `recipient`: [`RecipientBus`] and [`RecipientJobs`], delivery to actors.
//! - `telemetry`: the delivery span, and one hook per outcome that emits its
//!   tracing event and records its metrics.
//! - [`metrics`]: the metric names, with their labels and units.
//! - `error`: [`Error`].
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
//!         .registry(Registry::builder().event::<OrderPlaced>().build()?)
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
#![cfg_attr(docsrs, feature(doc_cfg))]

mod claimer;
mod context;
mod coordinator;
mod delivery;
mod error;
mod heartbeat;
mod messages;
pub mod metrics;
mod recipient;
mod telemetry;

pub use outbox;

pub use context::{DrainObserver, ObserverResult};
pub use coordinator::{
    CoordinatorStatus, Drain, DrainCoordinator, DrainCoordinatorBuilder, GetStatus, Shutdown,
    Subscribe,
};
pub use error::{Error, Result};
pub use messages::{
    DeadLetter, DrainReport, LeaseLost, LeaseOperation, LeaseState, Outcome, OutcomeNotice,
    SettleOperation, SettlementFailed,
};
pub use recipient::{DeliverEvent, DeliverJob, RecipientBus, RecipientJobs};

/// The names most drain programs need: `use outbox_actors::prelude::*;`.
pub mod prelude {
    pub use crate::{
        CoordinatorStatus, DeadLetter, DeliverEvent, DeliverJob, Drain, DrainCoordinator,
        DrainObserver, DrainReport, GetStatus, LeaseLost, LeaseOperation, LeaseState,
        OutcomeNotice, RecipientBus, RecipientJobs, Shutdown, Subscribe,
    };
    pub use outbox::prelude::*;
}
