//! Driving the actor runtime through a timed drain, and the plain Tokio
//! runtime the sides without actors run on.

use std::time::{Duration, Instant};

use actix::Addr;
use outbox_actors::{Drain, DrainCoordinator, GetStatus};

/// A current-thread Tokio runtime with timers and I/O, for a part of a
/// benchmark that runs outside the actix system.
///
/// # Panics
///
/// When the runtime cannot be built.
pub fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

/// Sends `Drain` until the coordinator has delivered `messages`; the time
/// it took. Must run inside the coordinator's actix system.
///
/// # Panics
///
/// When a pass fails, a message is not delivered, or the store runs dry
/// before `messages` were delivered.
pub async fn drain_loop(coordinator: &Addr<DrainCoordinator>, messages: u64) -> Duration {
    let started = Instant::now();
    loop {
        let report = coordinator
            .send(Drain)
            .await
            .expect("coordinator")
            .expect("pass");
        assert_eq!(
            report.delivered, report.claimed,
            "every message delivered: {report}"
        );
        // A pass that spent its batch starts the next by itself, so a Drain
        // answers for the pass it joined, not for every pass since the last
        // one: count from the totals.
        let totals = coordinator
            .send(GetStatus)
            .await
            .expect("coordinator")
            .totals;
        if totals.delivered >= messages {
            break started.elapsed();
        }
        assert!(
            report.claimed > 0,
            "the store ran dry after {}",
            totals.delivered
        );
    }
}
