//! Fenced writes to claimed messages, sent one by one or coalesced.
//!
//! Every renewal and settlement is a row of the same shape: which message,
//! which claim token must still own it, the caller's `now`, and what to do.
//! A backend applies any number of such rows in one statement, each fenced by
//! its own token and lease, and answers per row. [`Settler`] either sends each
//! call alone ([`SettlementMode::PerMessage`]) or gathers the calls that
//! arrive within a short window into one statement
//! ([`SettlementMode::Batched`]); both go through the same statement, so they
//! decide every row the same way.

use std::collections::HashSet;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, oneshot};

use super::sql::SettlementMode;
use crate::error::{Error, Result};

/// What a fenced write does to a message its token still owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SettleOp {
    /// `locked_until = ...`; still claimed.
    Renew { locked_until: DateTime<Utc> },
    /// Delivered at `now`.
    Deliver,
    /// Pending again from `available_at`, with `last_error`.
    Retry { available_at: DateTime<Utc> },
    /// Dead-lettered, with `last_error`.
    DeadLetter,
    /// Pending again now, the attempt given back.
    Release,
}

impl SettleOp {
    /// The code the settlement statements switch on.
    pub(crate) fn code(self) -> &'static str {
        match self {
            SettleOp::Renew { .. } => "renew",
            SettleOp::Deliver => "deliver",
            SettleOp::Retry { .. } => "retry",
            SettleOp::DeadLetter => "dead",
            SettleOp::Release => "release",
        }
    }

    /// The store operation, as named in errors.
    pub(crate) fn operation(self) -> &'static str {
        match self {
            SettleOp::Renew { .. } => "renew_claim",
            SettleOp::Deliver => "mark_delivered",
            SettleOp::Retry { .. } | SettleOp::DeadLetter => "mark_failed",
            SettleOp::Release => "release_claim",
        }
    }

    /// The new `locked_until` of a renewal.
    pub(crate) fn locked_until(self) -> Option<DateTime<Utc>> {
        match self {
            SettleOp::Renew { locked_until } => Some(locked_until),
            _ => None,
        }
    }

    /// The new `available_at` of a retry.
    pub(crate) fn available_at(self) -> Option<DateTime<Utc>> {
        match self {
            SettleOp::Retry { available_at } => Some(available_at),
            _ => None,
        }
    }
}

/// One fenced write.
#[derive(Debug, Clone)]
pub(crate) struct Settle {
    pub(crate) op: SettleOp,
    pub(crate) id: String,
    pub(crate) claim_token: String,
    pub(crate) now: DateTime<Utc>,
    /// `last_error` as JSON, for retries and dead letters.
    pub(crate) error: Option<String>,
}

/// A store that can apply fenced writes in bulk.
pub(crate) trait SettleBackend: Send + Sync + 'static {
    /// Apply `rows` (distinct ids) in one statement. Per row: `Ok` when its
    /// token owned the message with a live lease, else [`Error::Claim`].
    /// `Err` when the statement itself failed (nothing is known to be applied).
    fn settle(&self, rows: &[Settle]) -> impl Future<Output = Result<Vec<Result<()>>>> + Send;
}

struct Pending {
    row: Settle,
    reply: oneshot::Sender<Result<()>>,
}

/// Sends fenced writes to a backend, alone or in batches.
pub(crate) struct Settler<B> {
    backend: Arc<B>,
    mode: SettlementMode,
    queue: Mutex<Option<mpsc::UnboundedSender<Pending>>>,
}

impl<B> std::fmt::Debug for Settler<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settler").field("mode", &self.mode).finish()
    }
}

impl<B: SettleBackend> Settler<B> {
    pub(crate) fn new(backend: Arc<B>, mode: SettlementMode) -> Self {
        Settler {
            backend,
            mode,
            queue: Mutex::new(None),
        }
    }

    pub(crate) fn mode(&self) -> SettlementMode {
        self.mode
    }

    /// Apply one fenced write.
    pub(crate) async fn run(&self, row: Settle) -> Result<()> {
        let operation = row.op.operation();
        let SettlementMode::Batched { window, max_rows } = self.mode else {
            let mut results = self
                .backend
                .settle(std::slice::from_ref(&row))
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
        let mut pending = Pending { row, reply };
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

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<mpsc::UnboundedSender<Pending>>> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn queue(&self, window: Duration, max_rows: usize) -> mpsc::UnboundedSender<Pending> {
        let mut queue = self.lock();
        if let Some(sender) = queue.as_ref().filter(|s| !s.is_closed()) {
            return sender.clone();
        }
        let (sender, receiver) = mpsc::unbounded_channel();
        tokio::spawn(batch_loop(self.backend.clone(), receiver, window, max_rows));
        *queue = Some(sender.clone());
        sender
    }
}

/// Gather rows for `window` after the first (or until `max_rows`), apply
/// them, repeat; ends when the store is dropped.
async fn batch_loop<B: SettleBackend>(
    backend: Arc<B>,
    mut queue: mpsc::UnboundedReceiver<Pending>,
    window: Duration,
    max_rows: usize,
) {
    let mut carried: Option<Pending> = None;
    loop {
        let first = match carried.take() {
            Some(pending) => pending,
            None => match queue.recv().await {
                Some(pending) => pending,
                None => return,
            },
        };
        let deadline = tokio::time::Instant::now() + window;
        let mut ids = HashSet::from([first.row.id.clone()]);
        let mut batch = vec![first];
        while batch.len() < max_rows {
            let Ok(Some(next)) = tokio::time::timeout_at(deadline, queue.recv()).await else {
                break;
            };
            // Two writes to one message must run in call order; the second
            // waits for the next batch.
            if !ids.insert(next.row.id.clone()) {
                carried = Some(next);
                break;
            }
            batch.push(next);
        }
        flush(&*backend, batch).await;
    }
}

async fn flush<B: SettleBackend>(backend: &B, batch: Vec<Pending>) {
    let (rows, replies): (Vec<Settle>, Vec<_>) =
        batch.into_iter().map(|p| (p.row, p.reply)).unzip();
    match backend.settle(&rows).await {
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
