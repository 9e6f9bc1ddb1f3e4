//! The commands on queues and cancellations: `pause`, `resume`, `cancel`.

use outbox::kit::check;
use outbox::{AnyOutbox, CancelMessages, Clock, OutboxAdmin, PauseQueue, SystemClock};

use crate::admin::confirm;
use crate::cli::{CancelArgs, QueueArgs};
use crate::fail::Failure;

type Outcome = Result<(), Failure>;

/// `pause`: every drain stops claiming from the queue.
pub(crate) async fn pause(store: &AnyOutbox, args: QueueArgs) -> Outcome {
    // A queue exists by use, so a mistyped name would be paused without a
    // word; a name that holds nothing is paused (a queue may be paused
    // before its first message) but called out.
    let in_use = store
        .queues()
        .await?
        .iter()
        .any(|queue| queue.queue == args.queue);
    let paused = store
        .pause_queue(PauseQueue {
            queue: args.queue.clone(),
            now: SystemClock.now(),
        })
        .await?;
    if paused {
        outln!(
            "paused queue {:?}: no drain claims from it until `outbox resume {}`; messages \
             already claimed finish as usual",
            args.queue,
            args.queue
        );
    } else {
        outln!("queue {:?} was already paused", args.queue);
    }
    if !in_use {
        eprintln!(
            "note: queue {:?} holds no pending or claimed message; check the name \
             (`outbox status` lists the queues in use)",
            args.queue
        );
    }
    Ok(())
}

/// `resume`: drains claim from the queue again.
pub(crate) async fn resume(store: &AnyOutbox, args: QueueArgs) -> Outcome {
    if store.resume_queue(&args.queue).await? {
        outln!("resumed queue {:?}: drains claim from it again", args.queue);
    } else {
        outln!("queue {:?} was not paused", args.queue);
    }
    Ok(())
}

/// `cancel`: one message by id, or every pending and claimed one matching
/// the filters, after a count and (on a terminal) a confirmation.
pub(crate) async fn cancel(store: &AnyOutbox, args: CancelArgs) -> Outcome {
    let now = SystemClock.now();
    let params = match &args.id {
        Some(id) => CancelMessages::id(id.clone(), now),
        None => CancelMessages {
            name: args.name.clone(),
            ordering_key: args.key.clone(),
            queue: args.queue.clone(),
            ..CancelMessages::matching(now)
        },
    };
    // Refuse what the store would refuse before counting or asking.
    check::cancel(&params)?;
    let filtered = args.id.is_none();
    if args.dry_run || (filtered && !args.yes) {
        let count = store.cancel_messages(params.clone().dry_run(true)).await?;
        let summary = format!(
            "{} pending message{} to cancel, {} being delivered to ask to stop",
            count.cancelled,
            plural(count.cancelled),
            count.requested
        );
        if args.dry_run {
            outln!("would cancel: {summary} (dry run: nothing was changed)");
            return Ok(());
        }
        if count.total() == 0 {
            outln!("no pending or claimed message matches; nothing to cancel");
            return Ok(());
        }
        confirm(
            &format!("Cancel {summary} in table {}?", store.table()),
            "cancel",
        )?;
    }
    let done = store.cancel_messages(params).await?;
    match &args.id {
        Some(id) if done.requested > 0 => outln!(
            "cancellation of {id} requested: it is being delivered; its handler sees the \
             request at the next renewal, and the message ends cancelled unless the handler \
             succeeds"
        ),
        Some(id) => outln!("cancelled {id}: it will not be delivered"),
        None => outln!(
            "cancelled {} message{}; asked {} being delivered to stop",
            done.cancelled,
            plural(done.cancelled),
            done.requested
        ),
    }
    Ok(())
}

fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}
