//! The protocol alone: a paused tokio runtime, a memory store whose
//! settlement writes fail as scripted, and no actix system.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use outbox::{
    ClaimBatch, ClaimError, ClaimLoss, ClaimedBatch, Clock, DrainConfig, MemoryOutbox, MessageKind,
    MessageStatus, NewMessage, OutboxAdmin, OutboxStore, Payload, Registry, RenewClaim, TokioClock,
};

use super::*;
use crate::sizing::Sizing;

/// What a settlement write meets instead of the store.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// The store fails; the write may be retried.
    Transient,
    /// Another claim token owns the message.
    ClaimLost,
    /// The store never answers.
    Hang,
}

/// A settlement write as the store saw it: which, and its `now`.
type WriteSeen = (&'static str, DateTime<Utc>);

/// A memory store whose `mark_*` writes meet the scripted faults, one
/// per write, and which records when each write was made.
#[derive(Clone, Default)]
struct FaultStore {
    inner: MemoryOutbox,
    faults: Arc<Mutex<VecDeque<Fault>>>,
    writes: Arc<Mutex<Vec<WriteSeen>>>,
}

impl FaultStore {
    fn fail_next(&self, faults: &[Fault]) {
        self.faults.lock().unwrap().extend(faults);
    }

    fn writes(&self) -> Vec<WriteSeen> {
        self.writes.lock().unwrap().clone()
    }

    async fn status(&self, id: &str) -> MessageStatus {
        self.inner.get_message(id).await.unwrap().status
    }

    async fn write(
        &self,
        operation: &'static str,
        id: &str,
        now: DateTime<Utc>,
    ) -> outbox::Result<()> {
        self.writes.lock().unwrap().push((operation, now));
        let fault = self.faults.lock().unwrap().pop_front();
        match fault {
            None => Ok(()),
            Some(Fault::Transient) => Err(outbox::Error::store(
                operation,
                std::io::Error::other("connection reset"),
            )),
            Some(Fault::ClaimLost) => Err(ClaimError::new(id, ClaimLoss::TokenMismatch).into()),
            Some(Fault::Hang) => std::future::pending().await,
        }
    }
}

impl OutboxStore for FaultStore {
    async fn enqueue(&self, message: NewMessage) -> outbox::Result<outbox::Enqueued> {
        self.inner.enqueue(message).await
    }

    async fn claim_batch(&self, params: ClaimBatch) -> outbox::Result<ClaimedBatch> {
        self.inner.claim_batch(params).await
    }

    async fn renew_claim(&self, params: RenewClaim) -> outbox::Result<DateTime<Utc>> {
        self.inner.renew_claim(params).await
    }

    async fn mark_delivered(&self, params: MarkDelivered) -> outbox::Result<()> {
        self.write("mark_delivered", &params.id, params.now).await?;
        self.inner.mark_delivered(params).await
    }

    async fn mark_failed(&self, params: MarkFailed) -> outbox::Result<()> {
        self.write("mark_failed", &params.id, params.now).await?;
        self.inner.mark_failed(params).await
    }

    async fn release_claim(&self, params: ReleaseClaim) -> outbox::Result<()> {
        self.inner.release_claim(params).await
    }
}

/// A drain over a fresh store, and one message it claimed now.
async fn claimed(max_attempts: u32) -> (DrainContext, FaultStore, ClaimedMessage) {
    let store = FaultStore::default();
    let clock = TokioClock::new();
    let config = DrainConfig::default();
    let payload = Payload::from_json("{}").unwrap();
    let message = NewMessage::new(MessageKind::Event, "ping", payload)
        .with_max_attempts(max_attempts)
        .at(clock.now());
    store.inner.enqueue(message).await.unwrap();
    let mut batch = store
        .inner
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: 1,
            now: clock.now(),
            lease: config.lease,
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
            queues: Vec::new(),
            durable: true,
        })
        .await
        .unwrap();
    let message = batch.claimed.pop().expect("the message is due");
    let drain = DrainContext {
        sizing: Sizing::new(&config, 1, false, 4096),
        store: Arc::new(store.clone()),
        registry: Registry::default(),
        events: None,
        jobs: None,
        heartbeat: config.heartbeat(),
        config,
        clock: Arc::new(clock),
        observers: Vec::new(),
        deleted_since_vacuum: Default::default(),
    };
    (drain, store, message)
}

/// The lease as claimed, with no renewal error along the way.
fn held(message: &ClaimedMessage) -> HandOver {
    HandOver::Held {
        locked_until: message.locked_until,
        renewal_error: None,
    }
}

/// `max_active` from now: later than the lease, unless a test says so.
fn active_until(drain: &DrainContext) -> DateTime<Utc> {
    after(drain.now(), drain.config.max_active)
}

/// Settle the handler's `result` under the lease as claimed, with
/// `max_active` ending after it.
async fn settle(
    drain: &DrainContext,
    message: &ClaimedMessage,
    result: DeliveryResult,
) -> Settlement {
    settle_delivery(drain, message, active_until(drain), held(message), result).await
}

#[tokio::test(start_paused = true)]
async fn a_delivered_message_is_settled_in_one_write() {
    let (drain, store, message) = claimed(3).await;
    let start = drain.now();
    let settlement = settle(&drain, &message, Ok(())).await;
    assert!(
        matches!(
            settlement,
            Settlement::Written {
                renewal: None,
                lost: None,
                delivery_error: None,
                end: End::Delivered { deleted: false },
                store_faulted: false,
                ref failed_attempts,
            } if failed_attempts.is_empty()
        ),
        "{settlement:?}"
    );
    assert_eq!(store.writes(), [("mark_delivered", start)]);
    assert_eq!(store.status(&message.id).await, MessageStatus::Delivered);
}

#[tokio::test(start_paused = true)]
async fn a_message_deleted_as_it_settles_says_so() {
    let (mut drain, store, message) = claimed(3).await;
    drain.config.retention.delete_on_delivery = true;
    let settlement = settle(&drain, &message, Ok(())).await;
    assert!(
        matches!(
            settlement,
            Settlement::Written {
                end: End::Delivered { deleted: true },
                ..
            }
        ),
        "{settlement:?}"
    );
    assert_eq!(store.writes().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_failed_delivery_with_attempts_left_is_retried() {
    let (drain, store, message) = claimed(3).await;
    let start = drain.now();
    let result = Err(DeliveryError::msg("downstream said no"));
    let settlement = settle(&drain, &message, result).await;
    assert_eq!(settlement.outcome(), Outcome::Retried);
    let Settlement::Written {
        renewal: None,
        lost: None,
        delivery_error: Some(error),
        end:
            End::Retried {
                error: record,
                delay,
                retry_at: Some(retry_at),
            },
        store_faulted: false,
        failed_attempts,
    } = settlement
    else {
        panic!("{settlement:?}")
    };
    assert_eq!(error.to_string(), "downstream said no");
    assert_eq!(record.message, "downstream said no");
    assert_eq!(retry_at, after(start, delay));
    assert!(failed_attempts.is_empty(), "{failed_attempts:?}");
    assert_eq!(store.writes(), [("mark_failed", start)]);
    assert_eq!(store.status(&message.id).await, MessageStatus::Pending);
}

#[tokio::test(start_paused = true)]
async fn a_failed_delivery_without_attempts_left_is_dead_lettered() {
    let (drain, store, message) = claimed(1).await;
    let result = Err(DeliveryError::msg("downstream said no"));
    let settlement = settle(&drain, &message, result).await;
    let Settlement::Written {
        end: End::DeadLettered(dead_letter),
        delivery_error: Some(_),
        ..
    } = settlement
    else {
        panic!("{settlement:?}")
    };
    assert!(!dead_letter.abandoned);
    assert_eq!((dead_letter.attempts, dead_letter.max_attempts), (1, 1));
    assert_eq!(store.status(&message.id).await, MessageStatus::DeadLettered);
}

#[tokio::test(start_paused = true)]
async fn a_permanent_error_is_dead_lettered_with_attempts_left() {
    let (drain, store, message) = claimed(3).await;
    let result = Err(DeliveryError::msg("no such stream").permanent());
    let settlement = settle(&drain, &message, result).await;
    let Settlement::Written {
        end: End::DeadLettered(dead_letter),
        delivery_error: Some(error),
        ..
    } = settlement
    else {
        panic!("{settlement:?}")
    };
    assert!(error.is_permanent());
    assert_eq!((dead_letter.attempts, dead_letter.max_attempts), (1, 3));
    assert_eq!(store.status(&message.id).await, MessageStatus::DeadLettered);
}

/// The lease lost and the acknowledgement failed, both said of one
/// first write that did not apply.
fn unacknowledged(settlement: Settlement) -> (LeaseLost, SettlementFailed) {
    assert_eq!(
        settlement.outcome(),
        Outcome::SettlementFailed { claim_lost: true }
    );
    let Settlement::Written {
        renewal: Some(lease),
        end: End::Unsettled(failure),
        ..
    } = settlement
    else {
        panic!("{settlement:?}")
    };
    assert_eq!(lease.state, LeaseState::Lost);
    assert!(failure.claim_lost);
    (lease, failure)
}

#[tokio::test(start_paused = true)]
async fn a_claim_error_on_the_first_write_loses_the_lease_after_the_handler_finished() {
    let (drain, store, message) = claimed(3).await;
    store.fail_next(&[Fault::ClaimLost]);
    let settlement = settle(&drain, &message, Ok(())).await;
    assert!(!settlement.store_faulted(), "refused, not failed");
    let (failure, settlement) = unacknowledged(settlement);
    assert_eq!(failure.operation, LeaseOperation::Renew);
    assert!(failure.confirmed_lost && failure.error.is_claim_lost());
    assert!(failure.handler.finished() && failure.handler.succeeded());
    assert!(settlement.delivery_succeeded && settlement.error.is_claim_lost());
    assert_eq!(settlement.operation, SettleOperation::MarkDelivered);
    assert_eq!(store.writes().len(), 1, "a lost claim is not retried");
    assert_eq!(store.status(&message.id).await, MessageStatus::Claimed);
}

#[tokio::test(start_paused = true)]
async fn a_transient_error_then_success_settles_under_the_last_lease() {
    let (drain, store, message) = claimed(3).await;
    store.fail_next(&[Fault::Transient]);
    let start = drain.now();
    let settlement = settle(&drain, &message, Ok(())).await;
    let Settlement::Written {
        renewal: Some(renewal),
        end: End::Delivered { .. },
        failed_attempts,
        ..
    } = settlement
    else {
        panic!("{settlement:?}")
    };
    assert_eq!(renewal.state, LeaseState::Degraded);
    assert!(!renewal.confirmed_lost);
    let attempts: Vec<u32> = failed_attempts.iter().map(|(at, _)| *at).collect();
    assert_eq!(attempts, [1], "the failed first write is logged");
    let second = after(start, drain.config.settlement.delay);
    assert_eq!(
        store.writes(),
        [("mark_delivered", start), ("mark_delivered", second)]
    );
    assert_eq!(store.status(&message.id).await, MessageStatus::Delivered);
}

#[tokio::test(start_paused = true)]
async fn a_claim_refused_after_a_transient_error_is_heard_as_lost_after_the_handler() {
    let (drain, store, message) = claimed(3).await;
    store.fail_next(&[Fault::Transient, Fault::ClaimLost]);
    let settlement = settle(&drain, &message, Ok(())).await;
    assert_eq!(
        settlement.outcome(),
        Outcome::SettlementFailed { claim_lost: true }
    );
    let Settlement::Written {
        renewal: Some(degraded),
        lost: Some(lost),
        end: End::Unsettled(failure),
        ..
    } = settlement
    else {
        panic!("{settlement:?}")
    };
    // The lease degraded at the first write and was lost at the second;
    // subscribers hear both, and that the handler had succeeded.
    assert_eq!(degraded.state, LeaseState::Degraded);
    assert_eq!(lost.state, LeaseState::Lost);
    assert!(lost.confirmed_lost && lost.handler.succeeded());
    assert!(failure.claim_lost && failure.delivery_succeeded);
}

#[tokio::test(start_paused = true)]
async fn transient_errors_to_the_last_attempt_leave_the_outcome_unsettled() {
    let (drain, store, message) = claimed(3).await;
    store.fail_next(&[Fault::Transient; 3]);
    let settlement = settle(&drain, &message, Ok(())).await;
    assert_eq!(
        settlement.outcome(),
        Outcome::SettlementFailed { claim_lost: false }
    );
    let Settlement::Written {
        end: End::Unsettled(failure),
        failed_attempts,
        ..
    } = settlement
    else {
        panic!("{settlement:?}")
    };
    let attempts: Vec<u32> = failed_attempts.iter().map(|(at, _)| *at).collect();
    assert_eq!(attempts, [1, 2, 3], "every failed attempt is logged");
    assert!(failure.delivery_succeeded && !failure.claim_lost);
    assert_eq!(failure.operation, SettleOperation::MarkDelivered);
    assert_eq!(store.writes().len(), 3, "the configured attempts");
    assert_eq!(store.status(&message.id).await, MessageStatus::Claimed);
}

#[tokio::test(start_paused = true)]
async fn a_first_write_past_the_lease_deadline_loses_the_lease() {
    let (drain, store, message) = claimed(3).await;
    store.fail_next(&[Fault::Hang]);
    let result = Err(DeliveryError::msg("downstream said no"));
    let settlement = settle(&drain, &message, result).await;
    assert!(settlement.store_faulted(), "no answer is the store's fault");
    let (failure, settlement) = unacknowledged(settlement);
    assert_eq!(failure.operation, LeaseOperation::Renew);
    assert!(!failure.confirmed_lost);
    assert!(matches!(failure.error, Error::LeaseLost(_)), "{failure:?}");
    let error = failure.handler.error().expect("the handler's error");
    assert_eq!(error.to_string(), "downstream said no");
    assert!(!failure.handler.succeeded());
    assert!(!settlement.delivery_succeeded);
    assert_eq!(settlement.operation, SettleOperation::MarkFailed);
    assert_eq!(drain.now(), message.locked_until, "bounded by the lease");
    assert_eq!(store.writes().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_lease_over_before_the_first_write_is_confirmed_lost_and_writes_nothing() {
    let (drain, store, message) = claimed(3).await;
    // Handed over with the lease ending now: the worker's clock says it
    // is over, as the reference's final extension does.
    let hand_over = HandOver::Held {
        locked_until: drain.now(),
        renewal_error: None,
    };
    let settlement =
        settle_delivery(&drain, &message, active_until(&drain), hand_over, Ok(())).await;
    assert_eq!(settlement.outcome(), Outcome::LeaseLost);
    let Settlement::Lost(failure) = settlement else {
        panic!("{settlement:?}")
    };
    assert_eq!(
        (failure.operation, failure.state),
        (LeaseOperation::Renew, LeaseState::Lost)
    );
    assert!(failure.confirmed_lost, "ran out on this worker's clock");
    assert!(failure.handler.succeeded());
    assert!(store.writes().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_deadline_set_by_max_active_is_a_max_active_failure() {
    let (drain, store, message) = claimed(3).await;
    store.fail_next(&[Fault::Hang]);
    let active_until = after(drain.now(), Duration::from_secs(5));
    let settlement = settle_delivery(&drain, &message, active_until, held(&message), Ok(())).await;
    let (failure, _) = unacknowledged(settlement);
    assert_eq!(failure.operation, LeaseOperation::MaxActive);
    assert!(failure.handler.succeeded());
    assert!(
        matches!(failure.error, Error::MaxActiveDuration(_)),
        "{failure:?}"
    );
    assert_eq!(drain.now(), active_until);
}

#[tokio::test(start_paused = true)]
async fn renewal_errors_are_recovered_by_a_first_write_that_succeeds() {
    let (drain, _store, message) = claimed(3).await;
    let hand_over = HandOver::Held {
        locked_until: message.locked_until,
        renewal_error: Some(
            outbox::Error::store("renew_claim", std::io::Error::other("busy")).into(),
        ),
    };
    let settlement =
        settle_delivery(&drain, &message, active_until(&drain), hand_over, Ok(())).await;
    let Settlement::Written {
        renewal: Some(renewal),
        end: End::Delivered { .. },
        ..
    } = settlement
    else {
        panic!("{settlement:?}")
    };
    assert_eq!(renewal.state, LeaseState::Recovered);
}

#[tokio::test(start_paused = true)]
async fn a_lease_handed_over_lost_writes_nothing() {
    let (drain, store, message) = claimed(3).await;
    let error = LeaseLostError::new(&message.id, "renewals ran out", None);
    let failure = LeaseLost::new(
        &message,
        LeaseOperation::Renew,
        LeaseState::Lost,
        false,
        error.into(),
    );
    let settlement = settle_delivery(
        &drain,
        &message,
        active_until(&drain),
        HandOver::Lost(failure),
        Ok(()),
    )
    .await;
    assert_eq!(settlement.outcome(), Outcome::LeaseLost);
    let Settlement::Lost(failure) = settlement else {
        panic!("{settlement:?}")
    };
    assert!(failure.handler.succeeded(), "the handler had finished");
    assert!(store.writes().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_released_claim_is_claimable_at_once() {
    let (drain, store, message) = claimed(3).await;
    assert!(matches!(
        release_claim(&drain, &message).await,
        Release::Released
    ));
    assert_eq!(store.status(&message.id).await, MessageStatus::Pending);
}
