//! Shared test support: a paused actix system, a scriptable fault store,
//! and recorders for notifications.
#![allow(dead_code, unreachable_pub, missing_docs)]

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use chrono::{DateTime, TimeZone, Utc};
use outbox::{
    ClaimBatch, ClaimError, ClaimLoss, ClaimedBatch, Error, MarkDelivered, MarkFailed,
    MemoryOutbox, NewMessage, OutboxStore, ReleaseClaim, RenewClaim, Result, TokioClock, Wakeups,
};
use outbox_actors::{LeaseLost, OutcomeNotice};

/// The wall time every test clock starts at.
pub fn epoch() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap()
}

/// Run `test` inside an actix system on a paused current-thread tokio
/// runtime: timers fire in virtual time, as soon as everything is idle.
pub fn run<F, Fut>(test: F)
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = ()>,
{
    let system = actix_rt::System::with_tokio_rt(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("a paused runtime builds")
    });
    system.block_on(test());
}

/// A clock tied to the paused tokio clock, starting at [`epoch`].
pub fn clock() -> TokioClock {
    TokioClock::starting_at(epoch())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Claim,
    Renew,
    Deliver,
    Fail,
    Release,
}

/// What a scripted call does instead of (or besides) its normal work.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// Fail with a transient store error without touching the store.
    Transient,
    /// Do the work, then report a transient error (the answer was lost).
    TransientAfter,
    /// Report that the claim token no longer owns the message.
    Claim,
    /// Never answer.
    Hang,
    /// Answer after this much (virtual) time.
    Delay(Duration),
    /// Renew, but answer with a lease that has already ended.
    ExpiredLease,
    /// Panic inside the store call.
    Panic,
    /// Claim one more message than asked for.
    OverClaim,
}

/// How a call ended, as the caller saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Ok,
    ClaimLost,
    Transient,
    Other,
}

#[derive(Debug, Clone)]
pub struct Call {
    pub op: Op,
    pub id: String,
    pub token: String,
    pub now: DateTime<Utc>,
    pub answer: Answer,
    /// For claims and renewals that succeeded: the lease they gave.
    pub locked_until: Option<DateTime<Utc>>,
    /// The store really did it (even if the caller heard otherwise).
    pub applied: bool,
    /// For claims: whether the drain asked for a durable claim.
    pub durable: bool,
}

#[derive(Debug, Clone, Copy)]
pub struct FaultRates {
    pub transient: f64,
    pub transient_after: f64,
    pub claim: f64,
    pub delay: f64,
    pub hang: f64,
}

#[derive(Default)]
struct FaultState {
    script: HashMap<(Op, u32), Fault>,
    always: HashMap<Op, Fault>,
    calls: HashMap<Op, u32>,
    log: Vec<Call>,
    random: Option<(u64, FaultRates)>,
}

/// A `MemoryOutbox` whose calls can be scripted to fail, hang, lag or panic,
/// per operation and per call, and which logs every call.
#[derive(Clone, Default)]
pub struct FaultStore {
    inner: MemoryOutbox,
    state: Arc<Mutex<FaultState>>,
}

fn transient(operation: &'static str) -> Error {
    Error::store(operation, std::io::Error::other("injected transient fault"))
}

fn splitmix(seed: &mut u64) -> f64 {
    *seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *seed;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

impl FaultStore {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn inner(&self) -> &MemoryOutbox {
        &self.inner
    }

    /// Make call number `call` (1-based) of `op` do `fault`.
    pub fn fault(&self, op: Op, call: u32, fault: Fault) -> &Self {
        self.state.lock().unwrap().script.insert((op, call), fault);
        self
    }

    /// Make every call of `op` do `fault`.
    pub fn always(&self, op: Op, fault: Fault) -> &Self {
        self.state.lock().unwrap().always.insert(op, fault);
        self
    }

    /// Stop every scripted and random fault.
    pub fn calm(&self) {
        let mut state = self.state.lock().unwrap();
        state.script.clear();
        state.always.clear();
        state.random = None;
    }

    /// Draw faults at random for every call, from `seed`.
    pub fn randomize(&self, seed: u64, rates: FaultRates) {
        self.state.lock().unwrap().random = Some((seed, rates));
    }

    pub fn calls(&self, op: Op) -> u32 {
        self.state
            .lock()
            .unwrap()
            .calls
            .get(&op)
            .copied()
            .unwrap_or(0)
    }

    pub fn log(&self) -> Vec<Call> {
        self.state.lock().unwrap().log.clone()
    }

    fn next_fault(&self, op: Op) -> Option<Fault> {
        let mut state = self.state.lock().unwrap();
        let call = {
            let n = state.calls.entry(op).or_insert(0);
            *n += 1;
            *n
        };
        if let Some(fault) = state.script.remove(&(op, call)) {
            return Some(fault);
        }
        if let Some(fault) = state.always.get(&op) {
            return Some(fault.clone());
        }
        let (seed, rates) = state.random.as_mut()?;
        let roll = splitmix(seed);
        let mut edge = rates.transient;
        if roll < edge {
            return Some(Fault::Transient);
        }
        edge += rates.transient_after;
        if roll < edge {
            return Some(Fault::TransientAfter);
        }
        edge += rates.claim;
        if roll < edge && op != Op::Claim {
            return Some(Fault::Claim);
        }
        edge += rates.delay;
        if roll < edge {
            let millis = (splitmix(seed) * 20_000.0) as u64;
            return Some(Fault::Delay(Duration::from_millis(millis)));
        }
        edge += rates.hang;
        if roll < edge {
            return Some(Fault::Hang);
        }
        None
    }

    fn record(&self, call: Call) {
        self.state.lock().unwrap().log.push(call);
    }

    /// Run `work` under the fault for `op`, logging what the caller saw.
    async fn faulted<T>(
        &self,
        op: Op,
        operation: &'static str,
        id: &str,
        token: &str,
        now: DateTime<Utc>,
        work: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        let fault = self.next_fault(op);
        let mut applied = false;
        let result = match fault {
            Some(Fault::Transient) => Err(transient(operation)),
            Some(Fault::Claim) => Err(ClaimError::new(id, ClaimLoss::Unknown).into()),
            Some(Fault::Hang) => std::future::pending().await,
            Some(Fault::Panic) => panic!("injected panic in {operation}"),
            Some(Fault::Delay(delay)) => {
                tokio::time::sleep(delay).await;
                let result = work.await;
                applied = result.is_ok();
                result
            }
            Some(Fault::TransientAfter) => {
                let result = work.await;
                applied = result.is_ok();
                result.and_then(|_| Err(transient(operation)))
            }
            _ => {
                let result = work.await;
                applied = result.is_ok();
                result
            }
        };
        let answer = match &result {
            Ok(_) => Answer::Ok,
            Err(error) if error.is_claim_lost() => Answer::ClaimLost,
            Err(Error::Store { .. }) => Answer::Transient,
            Err(_) => Answer::Other,
        };
        self.record(Call {
            op,
            id: id.to_owned(),
            token: token.to_owned(),
            now,
            answer,
            locked_until: None,
            applied,
            durable: false,
        });
        result
    }
}

impl OutboxStore for FaultStore {
    async fn enqueue(&self, message: NewMessage) -> Result<outbox::Enqueued> {
        self.inner.enqueue(message).await
    }

    async fn claim_batch(&self, params: ClaimBatch) -> Result<ClaimedBatch> {
        let fault = self.next_fault(Op::Claim);
        let params = match fault {
            // One more than asked, overall and from each queue.
            Some(Fault::OverClaim) => ClaimBatch {
                on_dead_letter: Default::default(),
                limit: params.limit + 1,
                queues: params
                    .queues
                    .iter()
                    .map(|queue| outbox::QueueLimit {
                        limit: queue.limit + 1,
                        ..queue.clone()
                    })
                    .collect(),
                ..params
            },
            _ => params,
        };
        let (applied, answer) = match fault {
            Some(Fault::Transient) => return Err(transient("claim_batch")),
            Some(Fault::Hang) => std::future::pending().await,
            Some(Fault::Panic) => panic!("injected panic in claim_batch"),
            Some(Fault::Delay(delay)) => {
                tokio::time::sleep(delay).await;
                (self.inner.claim_batch(params.clone()).await, Answer::Ok)
            }
            Some(Fault::TransientAfter) => (
                self.inner.claim_batch(params.clone()).await,
                Answer::Transient,
            ),
            _ => (self.inner.claim_batch(params.clone()).await, Answer::Ok),
        };
        let batch = applied?;
        let mut state = self.state.lock().unwrap();
        for message in &batch.claimed {
            state.log.push(Call {
                op: Op::Claim,
                id: message.id.clone(),
                token: message.claim_token.clone(),
                now: params.now,
                answer,
                locked_until: Some(message.locked_until),
                applied: true,
                durable: params.durable,
            });
        }
        match answer {
            Answer::Ok => Ok(batch),
            _ => Err(transient("claim_batch")),
        }
    }

    async fn renew_claim(&self, params: RenewClaim) -> Result<DateTime<Utc>> {
        let fault = self.next_fault(Op::Renew);
        let (id, token, now) = (params.id.clone(), params.claim_token.clone(), params.now);
        let result = match fault {
            Some(Fault::Transient) => Err(transient("renew_claim")),
            Some(Fault::Claim) => Err(ClaimError::new(&id, ClaimLoss::Unknown).into()),
            Some(Fault::Hang) => std::future::pending().await,
            Some(Fault::Panic) => panic!("injected panic in renew_claim"),
            Some(Fault::Delay(delay)) => {
                tokio::time::sleep(delay).await;
                self.inner.renew_claim(params).await
            }
            Some(Fault::TransientAfter) => self
                .inner
                .renew_claim(params)
                .await
                .and_then(|_| Err(transient("renew_claim"))),
            Some(Fault::ExpiredLease) => self.inner.renew_claim(params).await.map(|_| now),
            _ => self.inner.renew_claim(params).await,
        };
        let answer = match &result {
            Ok(_) => Answer::Ok,
            Err(error) if error.is_claim_lost() => Answer::ClaimLost,
            Err(Error::Store { .. }) => Answer::Transient,
            Err(_) => Answer::Other,
        };
        self.record(Call {
            op: Op::Renew,
            id,
            token,
            now,
            answer,
            locked_until: result.as_ref().ok().copied(),
            applied: false,
            durable: false,
        });
        result
    }

    async fn mark_delivered(&self, params: MarkDelivered) -> Result<()> {
        let (id, token, now) = (params.id.clone(), params.claim_token.clone(), params.now);
        self.faulted(
            Op::Deliver,
            "mark_delivered",
            &id,
            &token,
            now,
            self.inner.mark_delivered(params),
        )
        .await
    }

    async fn mark_failed(&self, params: MarkFailed) -> Result<()> {
        let (id, token, now) = (params.id.clone(), params.claim_token.clone(), params.now);
        self.faulted(
            Op::Fail,
            "mark_failed",
            &id,
            &token,
            now,
            self.inner.mark_failed(params),
        )
        .await
    }

    async fn release_claim(&self, params: ReleaseClaim) -> Result<()> {
        let (id, token, now) = (params.id.clone(), params.claim_token.clone(), params.now);
        self.faulted(
            Op::Release,
            "release_claim",
            &id,
            &token,
            now,
            self.inner.release_claim(params),
        )
        .await
    }

    fn wakeups(&self) -> Option<Wakeups> {
        OutboxStore::wakeups(&self.inner)
    }

    async fn pending_count(&self) -> Result<Option<u64>> {
        self.inner.pending_count().await
    }
}

/// An actor that records every notification it receives.
#[derive(Clone, Default)]
pub struct Recorder {
    pub leases: Arc<Mutex<Vec<LeaseLost>>>,
    pub outcomes: Arc<Mutex<Vec<OutcomeNotice>>>,
}

impl Recorder {
    pub fn leases(&self) -> Vec<LeaseLost> {
        self.leases.lock().unwrap().clone()
    }

    pub fn outcomes(&self) -> Vec<OutcomeNotice> {
        self.outcomes.lock().unwrap().clone()
    }
}

impl Actor for Recorder {
    type Context = Context<Self>;
}

impl Handler<LeaseLost> for Recorder {
    type Result = ();
    fn handle(&mut self, lost: LeaseLost, _: &mut Context<Self>) {
        self.leases.lock().unwrap().push(lost);
    }
}

impl Handler<OutcomeNotice> for Recorder {
    type Result = ();
    fn handle(&mut self, notice: OutcomeNotice, _: &mut Context<Self>) {
        self.outcomes.lock().unwrap().push(notice);
    }
}

/// Let every actor process what is in its mailbox (no virtual time passes
/// unless something is waiting on a timer).
pub async fn settle_mailboxes() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}
