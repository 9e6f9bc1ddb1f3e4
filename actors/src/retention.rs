//! Retention: deleting settled messages past their horizon, in bounded
//! batches beside the drain passes.

use std::sync::atomic::Ordering;
use std::time::Duration;

use outbox::{MessageStatus, PurgeBatch, RetentionConfig};

use crate::context::DrainContext;
use crate::telemetry;

/// Most batches one run deletes per status. A backlog larger than this
/// (after retention is first turned on over a large table) goes over
/// several runs, so one run never keeps the store busy for long.
pub(crate) const MAX_BATCHES_PER_RUN: usize = 100;

/// One retention run: for each status with a horizon, delete batches of at
/// most `batch_size` rows settled before `now - horizon`, until a batch
/// comes back short or [`MAX_BATCHES_PER_RUN`] ran; then vacuum the store
/// if `vacuum_after` rows went since it last was. Returns the rows deleted.
/// A failing store ends the run; the next one tries again.
pub(crate) async fn run(drain: &DrainContext) -> u64 {
    let retention: RetentionConfig = drain.config.retention;
    // Cancelled messages go with delivered ones: both are done with.
    let horizons = [
        (MessageStatus::Delivered, retention.delivered_horizon()),
        (MessageStatus::Cancelled, retention.delivered_horizon()),
        (MessageStatus::DeadLettered, retention.dead_lettered),
    ];
    let mut total = 0;
    for (status, horizon) in horizons {
        let Some(horizon) = horizon else { continue };
        let older_than = crate::context::before(drain.now(), horizon);
        let mut deleted = 0;
        for _ in 0..MAX_BATCHES_PER_RUN {
            let batch = PurgeBatch {
                status,
                older_than,
                limit: retention.batch_size,
            };
            match drain.store.purge_batch(batch).await {
                Ok(done) => {
                    deleted += done;
                    if done < retention.batch_size as u64 {
                        break;
                    }
                }
                Err(error) => {
                    telemetry::retention_failed(status, &error);
                    break;
                }
            }
            // Let claims and settlements waiting on the store go first.
            tokio::task::yield_now().await;
        }
        telemetry::retention_deleted(status, deleted, horizon);
        total += deleted;
    }
    let pending = drain
        .deleted_since_vacuum
        .fetch_add(total, Ordering::Relaxed)
        + total;
    let after = retention.vacuum_after;
    if after > 0 && pending >= after {
        match drain.store.vacuum().await {
            // Rows deleted at delivery while it ran count towards the next.
            Ok(()) => {
                drain
                    .deleted_since_vacuum
                    .fetch_sub(pending, Ordering::Relaxed);
                telemetry::retention_vacuumed(pending);
            }
            Err(error) => telemetry::retention_vacuum_failed(&error),
        }
    }
    total
}

/// A delivery deleted its message as it settled: one more row towards the
/// next vacuum, and towards the retention metric.
pub(crate) fn deleted_at_delivery(drain: &DrainContext) {
    drain.deleted_since_vacuum.fetch_add(1, Ordering::Relaxed);
    telemetry::deleted_at_delivery();
}

/// The interval between runs.
pub(crate) fn every(retention: &RetentionConfig) -> Option<Duration> {
    retention.is_enabled().then_some(retention.every)
}
