//! Helpers for an application's own tests (feature `testing`): run the
//! test in an actix system on paused time, drain until nothing is left to
//! do, and the core's helpers ([`enqueued`], [`assert_enqueued`],
//! [`RecordingHandler`], ...), re-exported.
//!
//! On paused time (a tokio runtime started paused, as [`run_paused`]
//! builds), tokio's clock jumps ahead whenever every task waits on a
//! timer, so a test that waits for a retry's backoff, a lease or a
//! schedule's next slot takes microseconds and never depends on the
//! machine's speed. Give the coordinator a [`TokioClock`](outbox::TokioClock)
//! so the times it writes to the store move with it.
//!
//! Enable the feature for tests only; it turns on tokio's `test-util`:
//!
//! ```toml
//! [dev-dependencies]
//! outbox-actors = { version = "0.1", features = ["testing"] }
//! ```
//!
//! The guide's testing page shows a whole test.

use std::future::Future;
use std::time::Duration;

use actix::Addr;
use outbox::{Clock, ListMessages, MessageStatus, OutboxAdmin};

pub use outbox::testing::*;

use crate::coordinator::{Drain, DrainCoordinator};
use crate::error::{Error, Result};
use crate::report::DrainReport;

/// Run `test` to its end inside a fresh actix system whose tokio runtime
/// (one thread) starts paused: timers fire in virtual time as soon as
/// every task waits, so hours of backoffs, leases and schedules pass at
/// once.
///
/// ```
/// use std::time::Duration;
///
/// let waited = outbox_actors::testing::run_paused(async {
///     let start = tokio::time::Instant::now();
///     tokio::time::sleep(Duration::from_secs(3600)).await;
///     start.elapsed()
/// });
/// assert_eq!(waited, Duration::from_secs(3600));
/// ```
///
/// # Panics
///
/// When called inside another actix system or tokio runtime.
pub fn run_paused<F: Future>(test: F) -> F::Output {
    let system = actix_rt::System::with_tokio_rt(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("a paused tokio runtime builds")
    });
    system.block_on(test)
}

/// Drain until the outbox is idle: run passes while they claim something,
/// and then, while messages are still waiting (a retry's backoff, a
/// delayed message, a lost lease), sleep until the first of them is due
/// and drain again, as long as it is due within `within` of the start.
/// Answers the sum of the passes' reports.
///
/// Idle means that nothing pending or claimed is due within `within`, or
/// that a pass claimed nothing although something was due (a message held
/// behind a dead letter of its ordering key waits for an operator). `clock`
/// must be the coordinator's clock; on paused time
/// ([`run_paused`]) the sleeping costs nothing.
///
/// # Errors
///
/// The first failed pass's error, or [`Error::Stopped`] when the
/// coordinator is gone; a store that fails to list messages, as
/// [`Error::Outbox`].
pub async fn drain_until_idle(
    coordinator: &Addr<DrainCoordinator>,
    store: &impl OutboxAdmin,
    clock: &impl Clock,
    within: Duration,
) -> Result<DrainReport> {
    let deadline = crate::context::after(clock.now(), within);
    let mut total = DrainReport::default();
    loop {
        let report = coordinator
            .send(Drain)
            .await
            .map_err(|_| Error::Stopped)??;
        total += report;
        if report.claimed > 0 || report.dead_lettered > 0 {
            continue;
        }
        let now = clock.now();
        match next_due(store).await? {
            Some(at) if at > now && at <= deadline => {
                tokio::time::sleep(crate::context::until(now, at)).await;
            }
            _ => return Ok(total),
        }
    }
}

/// When the first waiting message becomes claimable: the earliest
/// `available_at` of the pending ones, or `locked_until` of the claimed.
async fn next_due(store: &impl OutboxAdmin) -> Result<Option<chrono::DateTime<chrono::Utc>>> {
    let mut first = None;
    for status in [MessageStatus::Pending, MessageStatus::Claimed] {
        let mut after = None;
        loop {
            let page = store
                .list_messages(ListMessages {
                    status: Some(status),
                    name: None,
                    limit: 1_000,
                    after,
                })
                .await?;
            for message in &page.messages {
                let at = match status {
                    MessageStatus::Claimed => message.locked_until,
                    _ => Some(message.available_at),
                };
                if let Some(at) = at {
                    first = Some(
                        first.map_or(at, |first: chrono::DateTime<chrono::Utc>| first.min(at)),
                    );
                }
            }
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
    }
    Ok(first)
}
