//! The settlement protocol: the fenced writes that end a delivery.
//!
//! Plain async functions over the [`DrainContext`]: they only write, and
//! return what happened as a [`Settlement`] (or a [`Release`]) for the
//! delivery actor to report in one place. Nothing here logs an outcome,
//! records a metric or calls an observer, so a settlement reads as the
//! sequence of store calls it makes.
//!
//! The heartbeat hands over the last lease it confirmed; the first
//! settlement write is then fenced on the claim token and on a live lease at
//! the moment it is made. A renewal just before it would confirm only what
//! that fence confirms, so the write stands in for it, with the renewal's
//! outcomes: a claim error is confirmed loss and settles nothing; a
//! transient failure with lease left settles under the last confirmed
//! lease, reported as degraded; earlier renewal errors are reported as
//! recovered once it succeeds.

use std::ops::Deref;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use outbox::{
    ClaimedMessage, DeliveryError, DeliveryResult, ErrorRecord, MarkDelivered, MarkFailed,
    MessageStatus, ReleaseClaim,
};

use crate::context::{DrainContext, after, until};
use crate::error::{Error, LeaseLostError};
use crate::lease::Deadline;
use crate::messages::HandOver;
use crate::notices::{
    DeadLetter, HandlerResult, LeaseLost, LeaseOperation, LeaseState, SettleOperation,
    SettlementFailed,
};
use crate::report::Outcome;

/// What a settlement did.
#[derive(Debug)]
// One per settled message, moved once to the delivery that reports it:
// boxing the common variant would allocate on every settlement to save a
// copy of a few hundred bytes.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Settlement {
    /// The claim was lost before the first write could be made: nothing
    /// was written.
    Lost(LeaseLost),
    /// The first write was made: the outcome was written, or writing it
    /// failed for good.
    Written {
        /// Renewals recovered; or the first write failed and the rest ran
        /// under the last confirmed lease (degraded); or the first write was
        /// refused or missed its deadline, losing the claim (lost).
        renewal: Option<LeaseLost>,
        /// The claim lost by a later attempt, after a first write that only
        /// degraded the lease: subscribers hear of every lost claim, since a
        /// second delivery is coming, and of how the handler had ended.
        lost: Option<Box<LeaseLost>>,
        /// The handler's error, when it failed.
        delivery_error: Option<DeliveryError>,
        /// What the writes ended in.
        end: End,
        /// The first write failed without being refused, or never answered:
        /// the store is failing, not the claim.
        store_faulted: bool,
        /// The store's transient errors, by attempt number, once the first
        /// write had failed and the rest ran under the last confirmed lease:
        /// for the logs, so that a settlement that ends badly can be read
        /// back.
        failed_attempts: Vec<(u32, outbox::Error)>,
    },
}

/// How the writes of a settlement ended.
#[derive(Debug)]
pub(crate) enum End {
    /// Stored as delivered.
    Delivered {
        /// The store deleted the message as it settled it
        /// (`delete_on_delivery`).
        deleted: bool,
    },
    /// Stored as failed, pending again at `retry_at`.
    Retried {
        /// The error stored with it.
        error: ErrorRecord,
        /// The retry policy's delay.
        delay: Duration,
        /// When it is due again.
        retry_at: Option<DateTime<Utc>>,
    },
    /// Stored as dead-lettered.
    DeadLettered(DeadLetter),
    /// The handler failed after an operator cancelled the message: the
    /// store recorded the failure as the cancellation.
    Cancelled,
    /// The outcome could not be stored.
    Unsettled(SettlementFailed),
}

impl Settlement {
    /// Whether a write failed for the store's sake (an error other than a
    /// lost claim, or no answer): the claimer then pauses claiming.
    pub(crate) fn store_faulted(&self) -> bool {
        matches!(
            self,
            Settlement::Written {
                store_faulted: true,
                ..
            }
        )
    }

    /// The one outcome this settlement counts as.
    pub(crate) fn outcome(&self) -> Outcome {
        match self {
            Settlement::Lost(_) => Outcome::LeaseLost,
            Settlement::Written { end, .. } => match end {
                End::Delivered { .. } => Outcome::Delivered,
                End::Retried { .. } => Outcome::Retried,
                End::DeadLettered(_) => Outcome::DeadLettered,
                End::Cancelled => Outcome::Cancelled,
                End::Unsettled(failure) => Outcome::SettlementFailed {
                    claim_lost: failure.claim_lost,
                },
            },
        }
    }
}

/// The settlement write to make.
enum Write {
    Delivered,
    Failed {
        error: ErrorRecord,
        dead_letter: bool,
        retry_at: Option<DateTime<Utc>>,
        retry_delay: Duration,
    },
}

impl Write {
    fn operation(&self) -> SettleOperation {
        match self {
            Write::Delivered => SettleOperation::MarkDelivered,
            Write::Failed { .. } => SettleOperation::MarkFailed,
        }
    }
}

/// Why a settlement did not happen.
struct Unsettled {
    error: Error,
    claim_lost: bool,
}

/// Why one settlement write did not apply.
enum Unwritten {
    /// The deadline had passed before it could be made.
    Expired,
    /// It was made, but did not answer before the deadline.
    Deadline,
    Failed(outbox::Error),
}

/// One settlement write under the claim token, bounded by `deadline`;
/// answers `true` when the store recorded a failure as the message's
/// cancellation (an operator asked for it while it was claimed).
async fn write_once(
    drain: &DrainContext,
    message: &ClaimedMessage,
    write: &Write,
    deadline: DateTime<Utc>,
) -> Result<bool, Unwritten> {
    let now = drain.now();
    let remaining = until(now, deadline);
    if remaining.is_zero() {
        return Err(Unwritten::Expired);
    }
    let delete = drain.config.retention.delete_on_delivery;
    let call: BoxFuture<'_, outbox::Result<bool>> = match write {
        Write::Delivered => {
            let delivered = drain.store.mark_delivered(MarkDelivered {
                id: message.id.clone(),
                claim_token: message.claim_token.clone(),
                now,
                delete,
            });
            Box::pin(async move { delivered.await.map(|()| false) })
        }
        Write::Failed {
            error,
            dead_letter,
            retry_at,
            ..
        } => {
            let failed = drain.store.settle_failure(MarkFailed {
                id: message.id.clone(),
                claim_token: message.claim_token.clone(),
                error: error.clone(),
                dead_letter: *dead_letter,
                now,
                retry_at: *retry_at,
            });
            Box::pin(async move { Ok(failed.await? == MessageStatus::Cancelled) })
        }
    };
    match tokio::time::timeout(remaining, call).await {
        Err(_) => Err(Unwritten::Deadline),
        Ok(Err(error)) => Err(Unwritten::Failed(error)),
        Ok(Ok(cancelled)) => Ok(cancelled),
    }
}

/// The settlement attempts after the first write failed with
/// `first_error`: up to the configured attempts in all, with doubling
/// delay, each bounded by `deadline`. The errors of the attempts that were
/// followed by another go to `failed_attempts`. Answers as [`write_once`].
async fn retry_settlement(
    drain: &DrainContext,
    message: &ClaimedMessage,
    deadline: DateTime<Utc>,
    write: &Write,
    first_error: outbox::Error,
    failed_attempts: &mut Vec<(u32, outbox::Error)>,
) -> Result<bool, Unsettled> {
    let missed_deadline = || Unsettled {
        error: LeaseLostError::new(
            &message.id,
            format!(
                "{} did not complete before its settlement deadline",
                match write.operation() {
                    SettleOperation::MarkDelivered => "mark_delivered",
                    SettleOperation::MarkFailed => "mark_failed",
                }
            ),
            None,
        )
        .into(),
        claim_lost: true,
    };
    failed_attempts.push((1, first_error.clone()));
    let mut last_error = first_error;
    for attempt in 2..=drain.config.settlement.attempts {
        let remaining = until(drain.now(), deadline);
        if remaining.is_zero() {
            break;
        }
        let backoff = drain
            .config
            .settlement
            .delay
            .saturating_mul(1 << (attempt - 2).min(20));
        tokio::time::sleep(backoff.min(remaining).max(Duration::from_millis(1))).await;
        match write_once(drain, message, write, deadline).await {
            Ok(cancelled) => return Ok(cancelled),
            Err(Unwritten::Expired | Unwritten::Deadline) => return Err(missed_deadline()),
            Err(Unwritten::Failed(error)) if error.is_claim_lost() => {
                return Err(Unsettled {
                    error: error.into(),
                    claim_lost: true,
                });
            }
            Err(Unwritten::Failed(error)) => {
                failed_attempts.push((attempt, error.clone()));
                last_error = error;
            }
        }
    }
    Err(Unsettled {
        error: last_error.into(),
        claim_lost: false,
    })
}

/// The write a handler's `result` calls for, and the handler's error.
fn write_for(
    drain: &DrainContext,
    message: &ClaimedMessage,
    result: DeliveryResult,
) -> (Write, Option<DeliveryError>) {
    match result {
        Ok(()) => (Write::Delivered, None),
        Err(error) => {
            let failed_at = drain.now();
            let policy = drain.retry_policy(message);
            let retry = !error.is_permanent()
                && policy.allows_retry(message.attempts, policy.max_attempts_for(message), &error);
            let retry_delay = if retry {
                policy.delay(message.attempts, &message.id)
            } else {
                Duration::ZERO
            };
            let write = Write::Failed {
                error: error.to_record(),
                dead_letter: !retry,
                retry_at: retry.then(|| after(failed_at, retry_delay)),
                retry_delay,
            };
            (write, Some(error))
        }
    }
}

/// Everything after the handler returned: store its `result` under the
/// claim token, within the lease the heartbeat handed over and before
/// `active_until`.
///
/// The first write is the final extension as well as the acknowledgement.
/// When it is refused or does not answer in time the claim is lost, and the
/// handler's result could not be acknowledged: that is reported both ways,
/// as a lost lease that says how the handler ended and as a failed
/// settlement with the claim lost (counted `settlement_failed` and
/// `lease_lost`, as the reference counts a failed acknowledgement). Only a
/// lease that had already ended before the first write could be made, or
/// one the heartbeat could not hand over, is a plain lease loss.
///
/// A delivery makes the two steps itself ([`prepare`], then
/// [`write_settlement`]), to settle a lost hand-over without a future.
#[cfg(test)]
pub(crate) async fn settle_delivery(
    drain: &DrainContext,
    message: &ClaimedMessage,
    active_until: DateTime<Utc>,
    hand_over: HandOver,
    result: DeliveryResult,
) -> Settlement {
    match prepare(drain, message, active_until, hand_over, result) {
        Ok(written) => write_settlement(drain, message, written).await,
        Err(lost) => Settlement::Lost(*lost),
    }
}

/// The first step of a settlement (see `settle_delivery` above), before
/// any write: the write the handler's `result` calls for, under the lease
/// `hand_over` confirms; or, when the heartbeat could not hand a lease
/// over, the loss that settles the delivery at once.
pub(crate) fn prepare(
    drain: &DrainContext,
    message: &ClaimedMessage,
    active_until: DateTime<Utc>,
    hand_over: HandOver,
    result: DeliveryResult,
) -> Result<Written, Box<LeaseLost>> {
    let handler = HandlerResult::of(&result);
    let (locked_until, renewal_error) = match hand_over {
        HandOver::Lost(failure) => return Err(Box::new(failure.after(handler))),
        HandOver::Held {
            locked_until,
            renewal_error,
        } => (locked_until, renewal_error),
    };
    let (write, delivery_error) = write_for(drain, message, result);
    Ok(Written {
        handler,
        renewal_error,
        write,
        delivery_error,
        deadline: Deadline::new(locked_until, active_until),
        failed_attempts: Vec::new(),
    })
}

/// The writes of a settlement, once [`prepare`]d, and the settlement
/// they make. It takes the drain and the message by anything that derefs to
/// them, so a delivery can hand over its `Arc`s and the future holds what
/// it settles only once.
pub(crate) async fn write_settlement(
    drain: impl Deref<Target = DrainContext>,
    message: impl Deref<Target = ClaimedMessage>,
    mut written: Written,
) -> Settlement {
    let (drain, message) = (&*drain, &*message);
    let deadline = written.deadline.at;
    let first = write_once(drain, message, &written.write, deadline).await;
    // The first write failed, but the last confirmed lease is still
    // running: settle under it, the failed write counting as the first
    // attempt. Boxed, since it is rare: every settlement's future would
    // otherwise carry its timers and writes.
    let retried = match &first {
        Err(Unwritten::Failed(error)) if !error.is_claim_lost() && drain.now() < deadline => {
            let retry = retry_settlement(
                drain,
                message,
                deadline,
                &written.write,
                error.clone(),
                &mut written.failed_attempts,
            );
            Some(Box::pin(retry).await)
        }
        _ => None,
    };
    written.conclude(drain, message, first, retried)
}

/// What a settlement knows before its writes, and uses once they are done;
/// kept apart from the writes so that the future that awaits them stays
/// small (it was over a kilobyte, an allocation glibc serves slowly, once
/// per message).
pub(crate) struct Written {
    handler: HandlerResult,
    renewal_error: Option<Error>,
    write: Write,
    delivery_error: Option<DeliveryError>,
    deadline: Deadline,
    failed_attempts: Vec<(u32, outbox::Error)>,
}

impl Written {
    /// The settlement that the first write's result (`first`) and the
    /// retries after it (`retried`, when they ran) make.
    fn conclude(
        self,
        drain: &DrainContext,
        message: &ClaimedMessage,
        first: Result<bool, Unwritten>,
        retried: Option<Result<bool, Unsettled>>,
    ) -> Settlement {
        let Written {
            handler,
            renewal_error,
            write,
            delivery_error,
            deadline,
            failed_attempts,
        } = self;
        let lease = |state, confirmed_lost, error: Error| {
            LeaseLost::new(message, LeaseOperation::Renew, state, confirmed_lost, error)
                .after(handler.clone())
        };
        // The first write failed and took the claim with it.
        let lost = |failure: LeaseLost, error: Error| {
            (
                Some(failure),
                Err(Unsettled {
                    error,
                    claim_lost: true,
                }),
            )
        };
        // A write that failed without being refused, or never answered: the
        // store is in trouble, and claiming more would only queue behind it.
        let store_faulted = match &first {
            Err(Unwritten::Deadline) => true,
            Err(Unwritten::Failed(error)) => !error.is_claim_lost(),
            Ok(_) | Err(Unwritten::Expired) => false,
        };
        let (renewal, settled) = match first {
            Ok(cancelled) => (
                renewal_error.map(|error| lease(LeaseState::Recovered, false, error)),
                Ok(cancelled),
            ),
            Err(Unwritten::Expired) => {
                // Nothing was written: as a final extension found too late.
                let confirmed_lost = !deadline.max_active_first;
                return Settlement::Lost(
                    deadline
                        .passed(
                            drain,
                            message,
                            confirmed_lost,
                            "the lease ran out before the delivery's outcome could be written",
                            None,
                        )
                        .after(handler),
                );
            }
            Err(Unwritten::Deadline) => {
                let failure = deadline
                    .passed(
                        drain,
                        message,
                        false,
                        "the extension write did not complete before the lease deadline",
                        None,
                    )
                    .after(handler.clone());
                let error = failure.error.clone();
                lost(failure, error)
            }
            Err(Unwritten::Failed(error)) if error.is_claim_lost() => {
                let error = Error::from(error);
                lost(lease(LeaseState::Lost, true, error.clone()), error)
            }
            Err(Unwritten::Failed(error)) if retried.is_some() => (
                Some(lease(LeaseState::Degraded, false, error.into())),
                retried.expect("the retries ran"),
            ),
            Err(Unwritten::Failed(error)) => {
                let error = Error::from(error);
                let failure = if deadline.max_active_first {
                    // `max_active` names the failure; no lease reason is read.
                    deadline
                        .passed(drain, message, false, "", None)
                        .after(handler.clone())
                } else {
                    lease(LeaseState::Lost, false, error.clone())
                };
                lost(failure, error)
            }
        };

        // Only the degraded branch can lose the claim in a later attempt; the
        // other losses already carry their notice in `renewal`.
        let lost = match (&renewal, &settled) {
            (Some(degraded), Err(unsettled))
                if degraded.state == LeaseState::Degraded && unsettled.claim_lost =>
            {
                Some(Box::new(lease(
                    LeaseState::Lost,
                    unsettled.error.is_claim_lost(),
                    unsettled.error.clone(),
                )))
            }
            _ => None,
        };
        let end = match (settled, write) {
            (Err(unsettled), write) => End::Unsettled(SettlementFailed {
                id: message.id.clone(),
                kind: message.kind,
                name: message.name.clone(),
                attempt: message.attempts,
                operation: write.operation(),
                delivery_succeeded: delivery_error.is_none(),
                delivery_error: delivery_error.clone(),
                error: unsettled.error,
                claim_lost: unsettled.claim_lost,
            }),
            (Ok(_), Write::Delivered) => End::Delivered {
                deleted: drain.config.retention.delete_on_delivery,
            },
            (Ok(true), Write::Failed { .. }) => End::Cancelled,
            (
                Ok(false),
                Write::Failed {
                    error,
                    dead_letter: true,
                    ..
                },
            ) => End::DeadLettered(DeadLetter::delivered(message, error)),
            (
                Ok(false),
                Write::Failed {
                    error,
                    retry_at,
                    retry_delay,
                    ..
                },
            ) => End::Retried {
                error,
                delay: retry_delay,
                retry_at,
            },
        };
        Settlement::Written {
            renewal,
            lost,
            delivery_error,
            end,
            store_faulted,
            failed_attempts,
        }
    }
}

/// How giving a claim back ended.
#[derive(Debug)]
pub(crate) enum Release {
    /// The claim was given back; the message is claimable at once.
    Released,
    /// The store refused or failed; the message is claimable after its lease.
    Failed(outbox::Error),
    /// The store did not answer within a lease.
    TimedOut,
}

impl Release {
    /// Whether the store failed (rather than refused) the release.
    pub(crate) fn store_faulted(&self) -> bool {
        match self {
            Release::Released => false,
            Release::Failed(error) => !error.is_claim_lost(),
            Release::TimedOut => true,
        }
    }
}

/// Give the claim on `message` back unsettled, bounded by a lease.
pub(crate) async fn release_claim(drain: &DrainContext, message: &ClaimedMessage) -> Release {
    let call = drain.store.release_claim(ReleaseClaim {
        id: message.id.clone(),
        claim_token: message.claim_token.clone(),
        now: drain.now(),
    });
    match tokio::time::timeout(drain.config.lease, call).await {
        Ok(Ok(())) => Release::Released,
        Ok(Err(error)) => Release::Failed(error),
        Err(_) => Release::TimedOut,
    }
}

#[cfg(test)]
mod tests;
