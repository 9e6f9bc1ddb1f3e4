//! One message through the inbox: begin, record, apply, commit. What the
//! broker is told afterwards is the consumer's business; this returns what
//! happened.

use std::panic::AssertUnwindSafe;
use std::time::Instant;

use futures_util::FutureExt;
use outbox::{InboxStore, Recorded};
use tracing::Instrument;

use super::handler::{HandlerError, InboxHandler};
use super::received::Received;
use super::telemetry;

/// What became of one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Applied {
    /// New: applied and committed. Acknowledge it.
    Processed,
    /// A copy of a committed message: nothing written. Acknowledge it.
    Duplicate,
    /// Rolled back at some stage: have the broker redeliver it.
    Failed,
}

/// Run `message` through the inbox in a transaction of its own, in its span.
pub(crate) async fn apply<I, H>(
    inbox: &I,
    consumer: &str,
    system: &'static str,
    handler: &H,
    message: &Received,
) -> Applied
where
    I: InboxStore,
    H: InboxHandler<I::Database>,
{
    let span = telemetry::span(consumer, system, message);
    in_transaction(inbox, consumer, handler, message)
        .instrument(span)
        .await
}

async fn in_transaction<I, H>(inbox: &I, consumer: &str, handler: &H, message: &Received) -> Applied
where
    I: InboxStore,
    H: InboxHandler<I::Database>,
{
    telemetry::received(consumer, message);
    let started = Instant::now();
    let failed = |stage, error: &(dyn std::error::Error + 'static)| {
        telemetry::failed(consumer, message, stage, error, started.elapsed());
        Applied::Failed
    };
    let mut tx = match inbox.begin().await {
        Ok(tx) => tx,
        Err(error) => return failed("begin", &error),
    };
    match inbox.record_in(&mut *tx, consumer, &message.id).await {
        Ok(Recorded::New) => {}
        Ok(Recorded::AlreadyProcessed) => {
            // Nothing was written: dropping the transaction rolls it back
            // without another round trip.
            drop(tx);
            telemetry::duplicate(consumer, message, started.elapsed());
            return Applied::Duplicate;
        }
        Err(error) => return failed("record", &error),
    }
    // A panicking handler is a failed one: its transaction is dropped, so
    // rolled back, and the message redelivered.
    let handled = AssertUnwindSafe(handler.handle(&mut tx, message))
        .catch_unwind()
        .await
        .unwrap_or_else(|panic| Err(panicked(panic)));
    if let Err(error) = handled {
        drop(tx);
        return failed("handler", &*error);
    }
    match tx.commit().await {
        Ok(()) => {
            telemetry::processed(consumer, message, started.elapsed());
            Applied::Processed
        }
        // A commit whose answer was lost may have committed: the
        // redelivered copy then finds the record and is a duplicate.
        Err(error) => failed("commit", &error),
    }
}

fn panicked(panic: Box<dyn std::any::Any + Send>) -> HandlerError {
    let text = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned());
    format!("the handler panicked: {text}").into()
}
