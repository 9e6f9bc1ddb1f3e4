//! Fenced writes to claimed messages, sent one by one or coalesced.
//!
//! Every renewal and settlement is a row of the same shape: which message,
//! which claim token must still own it, the caller's `now`, and what to do.
//! A backend applies any number of such rows in one statement, each fenced by
//! its own token and lease, and answers per row. [`FencedWriter`] either sends each
//! call alone ([`SettlementMode::PerMessage`]) or gathers the calls that
//! arrive within a short window into one statement
//! ([`SettlementMode::Batched`]); both go through the same statement, so they
//! decide every row the same way.
//!
//! The public switch, [`SettlementMode`], is defined here, with the writer it
//! configures, so this module sits below the SQL stores' shared half
//! (`sql/`), which builds a writer for each store and re-exports the switch.
//! It keeps the name `SettlementMode` (and the builders their `settlement`
//! setter): settlements are most of these writes, and the names also appear
//! in configuration errors (`settlement.max_rows`).

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use foldhash::{HashMap, HashSet};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;

use super::kit::{check, lease_end};
use super::{MarkDelivered, MarkFailed, ReleaseClaim, RenewClaim};
use crate::error::{Error, Result};

/// How settlements (renewals, `mark_delivered`, `mark_failed`,
/// `release_claim`) reach the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettlementMode {
    /// One statement per call.
    PerMessage,
    /// Concurrent calls share one statement of up to `max_rows` rows. Calls
    /// made while a statement runs go out together as soon as it ends; a
    /// call with no statement ahead of it goes out once no other ready
    /// caller joins, and a steady stream of calls is cut every `window`.
    /// Each row is still fenced by its own claim token and lease and gets its
    /// own result: a row whose claim was lost gets [`Error::Claim`], the
    /// others succeed. Under load this turns many commits into one; a call
    /// waits at most `window` plus the statement ahead of it.
    Batched {
        /// The longest a batch keeps gathering after its first call.
        window: std::time::Duration,
        /// Most rows per statement; at least 1.
        max_rows: usize,
    },
}

impl SettlementMode {
    /// Batched, up to 1 ms or 128 rows per statement.
    pub const DEFAULT_BATCHED: SettlementMode = SettlementMode::Batched {
        window: std::time::Duration::from_millis(1),
        max_rows: 128,
    };

    pub(crate) fn validate(self) -> Result<Self> {
        if let SettlementMode::Batched { window, max_rows } = self {
            if max_rows == 0 {
                return Err(Error::invalid("settlement.max_rows", "must be at least 1"));
            }
            if window > std::time::Duration::from_secs(1) {
                return Err(Error::invalid(
                    "settlement.window",
                    "must be at most 1s; every settlement waits up to this long",
                ));
            }
        }
        Ok(self)
    }
}

impl Default for SettlementMode {
    fn default() -> Self {
        Self::DEFAULT_BATCHED
    }
}

/// What a fenced write does to a message its token still owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FencedOp {
    /// `locked_until = now + lease`; still claimed. `locked_until` is on
    /// the caller's clock; a store that keeps time itself adds `lease` to
    /// its own.
    Renew {
        locked_until: DateTime<Utc>,
        lease: Duration,
    },
    /// Delivered at `now`.
    Deliver,
    /// Delivered at `now` and deleted in the same write
    /// ([`MarkDelivered::delete`]).
    Delete,
    /// Pending again from `available_at`, with `last_error`.
    Retry { available_at: DateTime<Utc> },
    /// Dead-lettered, with `last_error`.
    DeadLetter,
    /// Pending again now, the attempt given back.
    Release,
}

impl FencedOp {
    /// The code the settlement statements switch on.
    pub(crate) fn code(self) -> &'static str {
        match self {
            FencedOp::Renew { .. } => "renew",
            FencedOp::Deliver => "deliver",
            FencedOp::Delete => "delete",
            FencedOp::Retry { .. } => "retry",
            FencedOp::DeadLetter => "dead",
            FencedOp::Release => "release",
        }
    }

    /// The store operation, as named in errors.
    pub(crate) fn operation(self) -> &'static str {
        match self {
            FencedOp::Renew { .. } => "renew_claim",
            FencedOp::Deliver | FencedOp::Delete => "mark_delivered",
            FencedOp::Retry { .. } | FencedOp::DeadLetter => "mark_failed",
            FencedOp::Release => "release_claim",
        }
    }

    /// The lease of a renewal, in whole microseconds (the database's
    /// resolution).
    #[cfg(feature = "postgres")]
    pub(crate) fn lease_micros(self) -> Option<i64> {
        match self {
            FencedOp::Renew { lease, .. } => {
                Some(i64::try_from(lease.as_micros()).unwrap_or(i64::MAX))
            }
            _ => None,
        }
    }

    /// The new `available_at` of a retry.
    #[cfg(feature = "postgres")]
    pub(crate) fn available_at(self) -> Option<DateTime<Utc>> {
        match self {
            FencedOp::Retry { available_at } => Some(available_at),
            _ => None,
        }
    }
}

/// One fenced write.
#[derive(Debug, Clone)]
pub(crate) struct FencedWrite {
    pub(crate) op: FencedOp,
    pub(crate) id: String,
    pub(crate) claim_token: String,
    pub(crate) now: DateTime<Utc>,
    /// `last_error` as JSON, for retries and dead letters.
    pub(crate) error: Option<String>,
}

impl FencedWrite {
    /// The renewal `params` asks for, checked, with the `locked_until` it
    /// sets.
    pub(crate) fn renew(params: RenewClaim) -> Result<(FencedWrite, DateTime<Utc>)> {
        check::fence(&params.id, &params.claim_token)?;
        check::positive_lease(params.lease)?;
        let locked_until = lease_end(params.now, params.lease)?;
        let row = FencedWrite {
            op: FencedOp::Renew {
                locked_until,
                lease: params.lease,
            },
            id: params.id,
            claim_token: params.claim_token,
            now: params.now,
            error: None,
        };
        Ok((row, locked_until))
    }
}

impl From<MarkDelivered> for FencedWrite {
    fn from(params: MarkDelivered) -> Self {
        FencedWrite {
            op: if params.delete {
                FencedOp::Delete
            } else {
                FencedOp::Deliver
            },
            id: params.id,
            claim_token: params.claim_token,
            now: params.now,
            error: None,
        }
    }
}

impl From<MarkFailed> for FencedWrite {
    fn from(params: MarkFailed) -> Self {
        let op = if params.dead_letter {
            FencedOp::DeadLetter
        } else {
            FencedOp::Retry {
                available_at: params.retry_at.unwrap_or(params.now),
            }
        };
        FencedWrite {
            op,
            id: params.id,
            claim_token: params.claim_token,
            now: params.now,
            error: Some(params.error.bounded().to_json()),
        }
    }
}

impl From<ReleaseClaim> for FencedWrite {
    fn from(params: ReleaseClaim) -> Self {
        FencedWrite {
            op: FencedOp::Release,
            id: params.id,
            claim_token: params.claim_token,
            now: params.now,
            error: None,
        }
    }
}

/// What a fenced write found on the message it changed: whether an
/// operator had asked to cancel it. For a renewal, its handler should hear
/// of it; for a failure or a release, the message was cancelled instead.
/// Always `false` for a delivery.
pub(crate) type CancelRequested = bool;

/// A store that can apply fenced writes in bulk.
pub(crate) trait FencedBackend: Send + Sync + 'static {
    /// Apply `rows` (distinct ids), in one statement or one per kind of
    /// write. Per row: `Ok` when its token owned the message with a live
    /// lease, with whether the message carries a cancellation request;
    /// [`Error::Claim`] when it did not; or the error of a statement that
    /// failed. `Err` when nothing is known to be applied.
    fn apply(
        &self,
        rows: &[FencedWrite],
    ) -> impl Future<Output = Result<Vec<Result<CancelRequested>>>> + Send;
}

/// A call's fenced write waiting for a batch, and where its answer goes.
struct QueuedWrite {
    row: FencedWrite,
    reply: oneshot::Sender<Result<CancelRequested>>,
    /// When the call was made: its wait for a batch counts from here.
    arrived: tokio::time::Instant,
}

/// Sends fenced writes to a backend, alone or in batches.
pub(crate) struct FencedWriter<B> {
    backend: Arc<B>,
    mode: SettlementMode,
    /// Most batched statements in flight at once.
    statements: usize,
    queue: Mutex<Option<mpsc::UnboundedSender<QueuedWrite>>>,
}

impl<B> std::fmt::Debug for FencedWriter<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FencedWriter")
            .field("mode", &self.mode)
            .field("statements", &self.statements)
            .finish()
    }
}

impl<B: FencedBackend> FencedWriter<B> {
    /// A writer sending batches of `mode` through `backend`, at most
    /// `statements` (at least 1) at a time.
    pub(crate) fn new(backend: Arc<B>, mode: SettlementMode, statements: usize) -> Self {
        FencedWriter {
            backend,
            mode,
            statements: statements.max(1),
            queue: Mutex::new(None),
        }
    }

    pub(crate) fn mode(&self) -> SettlementMode {
        self.mode
    }

    /// Apply one fenced write.
    pub(crate) async fn run(&self, row: FencedWrite) -> Result<CancelRequested> {
        let operation = row.op.operation();
        let SettlementMode::Batched { window, max_rows } = self.mode else {
            let mut results = self
                .backend
                .apply(std::slice::from_ref(&row))
                .await
                .map_err(|e| for_operation(e, operation))?;
            return results.pop().unwrap_or_else(|| {
                Err(Error::StoreContract(format!(
                    "{operation} of {:?} returned no result",
                    row.id
                )))
            });
        };
        let (reply, answer) = oneshot::channel();
        let mut pending = QueuedWrite {
            row,
            reply,
            arrived: tokio::time::Instant::now(),
        };
        // The batch task lives on the runtime of the call that started it; if
        // that runtime has shut down since, start a new one here.
        for _ in 0..2 {
            match self.queue(window, max_rows).send(pending) {
                Ok(()) => {
                    return answer.await.unwrap_or_else(|_| Err(batch_lost(operation)));
                }
                Err(mpsc::error::SendError(returned)) => {
                    pending = returned;
                    self.lock().take();
                }
            }
        }
        Err(batch_lost(operation))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<mpsc::UnboundedSender<QueuedWrite>>> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn queue(&self, window: Duration, max_rows: usize) -> mpsc::UnboundedSender<QueuedWrite> {
        let mut queue = self.lock();
        if let Some(sender) = queue.as_ref().filter(|s| !s.is_closed()) {
            return sender.clone();
        }
        let (sender, receiver) = mpsc::unbounded_channel();
        tokio::spawn(batch_loop(
            self.backend.clone(),
            receiver,
            window,
            max_rows,
            self.statements,
        ));
        *queue = Some(sender.clone());
        sender
    }
}

/// Gather rows into batches and apply them, up to `statements` at a time;
/// ends when the store is dropped.
///
/// A batch closes at `max_rows`, or `window` after its first row arrived, or
/// as soon as a statement may start and no other caller is ready to add a
/// row (checked by letting the runtime run every task that is ready first).
/// So a lone caller does not wait for a window that nobody else will use,
/// while callers that arrive together, or while every statement slot is
/// taken, share the next one. Each statement is a commit: on a durable
/// PostgreSQL it waits for the WAL flush, which concurrent commits share, so
/// several statements in flight settle more rows per flush than one. No id is
/// in two statements at once: a write to a message whose earlier write is
/// still in flight waits for that statement, so writes to one message apply
/// in call order.
async fn batch_loop<B: FencedBackend>(
    backend: Arc<B>,
    mut queue: mpsc::UnboundedReceiver<QueuedWrite>,
    window: Duration,
    max_rows: usize,
    statements: usize,
) {
    /// How many times the batch lets other tasks run without any of them
    /// adding a row before it decides nobody else is coming.
    const QUIET_YIELDS: u32 = 2;
    let mut carried: Option<QueuedWrite> = None;
    let mut running = InFlight::default();
    loop {
        let first = match carried.take() {
            Some(pending) => pending,
            None => match queue.recv().await {
                Some(pending) => pending,
                None => break,
            },
        };
        running.reap_finished();
        // An earlier write to this message is in flight: it goes first.
        while running.holds(&first.row.id) {
            running.join_next().await;
        }
        let deadline = first.arrived + window;
        let mut ids = HashSet::from_iter([first.row.id.clone()]);
        let mut batch = vec![first];
        let mut quiet = 0;
        while batch.len() < max_rows {
            let next = match queue.try_recv() {
                Ok(next) => Some(next),
                Err(mpsc::error::TryRecvError::Disconnected) => break,
                Err(mpsc::error::TryRecvError::Empty) if running.len() >= statements => {
                    // Every statement slot is taken: gather until one frees
                    // (this batch cannot start before that anyway).
                    tokio::select! {
                        next = queue.recv() => next,
                        () = running.join_next() => None,
                    }
                }
                Err(mpsc::error::TryRecvError::Empty)
                    if quiet < QUIET_YIELDS && tokio::time::Instant::now() < deadline =>
                {
                    quiet += 1;
                    tokio::task::yield_now().await;
                    continue;
                }
                Err(mpsc::error::TryRecvError::Empty) => break,
            };
            let Some(next) = next else { continue };
            quiet = 0;
            // Two writes to one message must run in call order; the second
            // waits for the next statement after the one holding the first.
            if running.holds(&next.row.id) || !ids.insert(next.row.id.clone()) {
                carried = Some(next);
                break;
            }
            batch.push(next);
            if tokio::time::Instant::now() >= deadline && running.len() < statements {
                break;
            }
        }
        while running.len() >= statements {
            running.join_next().await;
        }
        let backend = backend.clone();
        running.spawn(ids, async move { flush(&*backend, batch).await });
    }
    while running.len() > 0 {
        running.join_next().await;
    }
}

/// The statements in flight and the ids each one writes.
#[derive(Default)]
struct InFlight {
    tasks: JoinSet<()>,
    ids: HashMap<tokio::task::Id, HashSet<String>>,
    /// Every id of a statement in flight.
    busy: HashSet<String>,
}

impl InFlight {
    fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Whether a statement in flight writes `id`.
    fn holds(&self, id: &str) -> bool {
        self.busy.contains(id)
    }

    fn spawn(
        &mut self,
        ids: HashSet<String>,
        statement: impl Future<Output = ()> + Send + 'static,
    ) {
        self.busy.extend(ids.iter().cloned());
        let task = self.tasks.spawn(statement);
        self.ids.insert(task.id(), ids);
    }

    /// Wait for the next statement to end (at once when none runs) and free
    /// its ids.
    async fn join_next(&mut self) {
        if let Some(done) = self.tasks.join_next_with_id().await {
            self.free(done);
        }
    }

    /// Free the ids of every statement that has ended.
    fn reap_finished(&mut self) {
        while let Some(done) = self.tasks.try_join_next_with_id() {
            self.free(done);
        }
    }

    fn free(&mut self, done: Result<(tokio::task::Id, ()), tokio::task::JoinError>) {
        // A statement that panicked answered nobody (its callers see the
        // batch lost); its ids are free again all the same.
        let task = match done {
            Ok((task, ())) => task,
            Err(error) => error.id(),
        };
        for id in self.ids.remove(&task).into_iter().flatten() {
            self.busy.remove(&id);
        }
    }
}

async fn flush<B: FencedBackend>(backend: &B, batch: Vec<QueuedWrite>) {
    let (rows, replies): (Vec<FencedWrite>, Vec<_>) =
        batch.into_iter().map(|p| (p.row, p.reply)).unzip();
    match backend.apply(&rows).await {
        Ok(results) if results.len() == rows.len() => {
            for (reply, result) in replies.into_iter().zip(results) {
                // A caller that stopped waiting no longer needs its answer.
                let _ = reply.send(result);
            }
        }
        Ok(results) => {
            let error = Error::StoreContract(format!(
                "a settlement batch of {} rows returned {} results",
                rows.len(),
                results.len()
            ));
            for reply in replies {
                let _ = reply.send(Err(error.clone()));
            }
        }
        Err(error) => {
            for (reply, row) in replies.into_iter().zip(&rows) {
                let _ = reply.send(Err(for_operation(error.clone(), row.op.operation())));
            }
        }
    }
}

/// Name the caller's operation in a store error raised for a whole batch.
fn for_operation(error: Error, operation: &'static str) -> Error {
    match error {
        Error::Store { source, .. } => Error::Store { operation, source },
        other => other,
    }
}

#[derive(Debug, thiserror::Error)]
#[error("the settlement batch stopped before answering (its runtime shut down)")]
struct BatchLost;

fn batch_lost(operation: &'static str) -> Error {
    Error::store(operation, BatchLost)
}

#[cfg(test)]
mod tests;
