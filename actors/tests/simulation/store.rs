//! The simulated store: the memory store behind seeded faults, with a
//! ledger that audits every write against the state it found.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox::{
    ClaimBatch, ClaimError, ClaimLoss, ClaimedBatch, Clock, Enqueued, Error, ListMessages,
    MarkDelivered, MarkFailed, MemoryOutbox, MessageStatus, NewMessage, OutboxAdmin, OutboxMessage,
    OutboxStore, ReleaseClaim, RenewClaim, Result, TokioClock, Wakeups,
};

use crate::rng::mix;

/// A store call, for fault draws and the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Op {
    Claim,
    Renew,
    Deliver,
    Fail,
    Release,
}

/// What one call does besides (or instead of) its work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// A transient store error, nothing done.
    Transient,
    /// The work is done, then a transient error is reported (the answer was lost).
    TransientAfter,
    /// The store reports the claim lost without looking (a spurious refusal).
    Claim,
    /// The call waits this long before its work, with the caller's `now`
    /// read before the wait (a slow connection acquire).
    DelayBefore(Duration),
    /// The work is done at once and the answer lags this long.
    DelayAfter(Duration),
    /// The call never answers.
    Hang,
}

/// How often each fault is drawn, per call.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Rates {
    pub transient: f64,
    pub transient_after: f64,
    pub claim: f64,
    pub delay_before: f64,
    pub delay_after: f64,
    pub hang: f64,
    /// Longest delay drawn.
    pub max_delay: Duration,
}

/// The tallies of one coordinator as the store saw them: answers it
/// received that said the work was done.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Answered {
    pub claimed: u64,
    pub abandoned: u64,
    pub delivered: u64,
    pub retried: u64,
    pub dead_lettered: u64,
    pub released: u64,
    /// Claims a release was tried for and never confirmed.
    pub release_failed: u64,
}

/// Counts over a run, for the coverage line.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct FaultCounts {
    pub injected: [u64; 6],
    pub stale_now_writes: u64,
}

#[derive(Default)]
struct Ledger {
    seed: u64,
    rates: Rates,
    calm: bool,
    /// Calls so far per operation and message, so a fault depends on which
    /// call of which message it is, not on how calls interleave.
    calls: HashMap<(Op, String), u32>,
    /// Every claim token the store issued, with its message.
    issued: HashMap<String, String>,
    /// The settlement each token applied.
    settled: HashMap<String, Op>,
    answered: HashMap<usize, Answered>,
    /// Per coordinator, the tokens it tried to release, and whether a
    /// release of each was confirmed.
    releases: HashMap<usize, HashMap<String, bool>>,
    violations: Vec<String>,
    counts: FaultCounts,
}

/// What happened, in order, when a schedule is replayed: every store call
/// and every handler start and end.
pub(crate) type Trace = Option<Arc<Mutex<Vec<String>>>>;

/// Add a line to `trace`, if one is kept.
pub(crate) fn note(trace: &Trace, clock: &TokioClock, line: impl FnOnce() -> String) {
    if let Some(trace) = trace {
        let at = clock.now().format("%H:%M:%S%.3f");
        trace.lock().unwrap().push(format!("{at} {}", line()));
    }
}

/// The memory store behind seeded faults. Clones share the store and its
/// ledger; each coordinator gets its own [`SimStore::owned_by`] handle so
/// the ledger tallies answers per coordinator.
#[derive(Clone)]
pub(crate) struct SimStore {
    inner: MemoryOutbox,
    ledger: Arc<Mutex<Ledger>>,
    clock: TokioClock,
    owner: usize,
    trace: Trace,
}

fn transient(operation: &'static str) -> Error {
    Error::store(operation, std::io::Error::other("injected transient fault"))
}

impl SimStore {
    pub(crate) fn new(seed: u64, rates: Rates, clock: TokioClock, trace: Trace) -> Self {
        SimStore {
            inner: MemoryOutbox::new(),
            ledger: Arc::new(Mutex::new(Ledger {
                seed,
                rates,
                ..Ledger::default()
            })),
            clock,
            owner: 0,
            trace,
        }
    }

    /// A handle whose answers count for coordinator `owner`.
    pub(crate) fn owned_by(&self, owner: usize) -> Self {
        SimStore {
            owner,
            ..self.clone()
        }
    }

    pub(crate) fn inner(&self) -> &MemoryOutbox {
        &self.inner
    }

    /// Stop injecting faults.
    pub(crate) fn calm(&self) {
        self.ledger.lock().unwrap().calm = true;
    }

    pub(crate) fn answered(&self, owner: usize) -> Answered {
        let ledger = self.ledger.lock().unwrap();
        let mut answered = ledger.answered.get(&owner).copied().unwrap_or_default();
        answered.release_failed = ledger.releases.get(&owner).map_or(0, |tokens| {
            tokens.values().filter(|confirmed| !**confirmed).count()
        }) as u64;
        answered
    }

    pub(crate) fn violations(&self) -> Vec<String> {
        self.ledger.lock().unwrap().violations.clone()
    }

    pub(crate) fn counts(&self) -> FaultCounts {
        self.ledger.lock().unwrap().counts
    }

    pub(crate) async fn all_messages(&self) -> Vec<OutboxMessage> {
        self.inner
            .list_messages(ListMessages {
                limit: 10_000,
                ..ListMessages::default()
            })
            .await
            .expect("the memory store lists")
            .messages
    }

    fn violation(&self, text: String) {
        self.ledger.lock().unwrap().violations.push(text);
    }

    fn draw(&self, op: Op, id: &str) -> Option<Fault> {
        let mut ledger = self.ledger.lock().unwrap();
        if ledger.calm {
            return None;
        }
        let call = {
            let n = ledger.calls.entry((op, id.to_owned())).or_insert(0);
            *n += 1;
            *n
        };
        let mut hash = mix(ledger.seed ^ mix(op as u64 + 1) ^ mix(call as u64));
        for byte in id.bytes() {
            hash = mix(hash ^ byte as u64);
        }
        let roll = (hash >> 11) as f64 / (1u64 << 53) as f64;
        let r = ledger.rates;
        let delay = Duration::from_millis(mix(hash) % (r.max_delay.as_millis().max(1) as u64));
        let table = [
            (r.transient, Fault::Transient),
            (r.transient_after, Fault::TransientAfter),
            (if op == Op::Claim { 0.0 } else { r.claim }, Fault::Claim),
            (r.delay_before, Fault::DelayBefore(delay)),
            (r.delay_after, Fault::DelayAfter(delay)),
            (r.hang, Fault::Hang),
        ];
        let mut edge = 0.0;
        for (index, (rate, fault)) in table.into_iter().enumerate() {
            edge += rate;
            if roll < edge {
                ledger.counts.injected[index] += 1;
                return Some(fault);
            }
        }
        None
    }

    /// The part of a fault that comes before the work: an answer without
    /// it, or a wait.
    async fn before(fault: Option<Fault>, id: &str, operation: &'static str) -> Result<()> {
        match fault {
            Some(Fault::Transient) => Err(transient(operation)),
            Some(Fault::Claim) => Err(ClaimError::new(id, ClaimLoss::Unknown).into()),
            Some(Fault::Hang) => std::future::pending().await,
            Some(Fault::DelayBefore(delay)) => {
                tokio::time::sleep(delay).await;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// The part of a fault that comes after the work: a lagging or lost answer.
    async fn after<T>(
        fault: Option<Fault>,
        operation: &'static str,
        result: Result<T>,
    ) -> Result<T> {
        match fault {
            Some(Fault::DelayAfter(delay)) => {
                tokio::time::sleep(delay).await;
                result
            }
            Some(Fault::TransientAfter) => result.and_then(|_| Err(transient(operation))),
            _ => result,
        }
    }

    /// Check a fenced write against the row it found, and record it.
    fn audit_fenced(
        &self,
        op: Op,
        id: &str,
        token: &str,
        now: DateTime<Utc>,
        before: Option<&OutboxMessage>,
        applied: bool,
    ) {
        let true_now = self.clock.now();
        let owned_live = before.is_some_and(|row| {
            row.status == MessageStatus::Claimed
                && row.claim_token.as_deref() == Some(token)
                && row.locked_until.is_some_and(|until| until > now)
        });
        let mut ledger = self.ledger.lock().unwrap();
        if now > true_now {
            ledger.violations.push(format!(
                "{op:?} of {id} at {now}, ahead of the clock ({true_now})"
            ));
        }
        if applied {
            if !owned_live {
                ledger.violations.push(format!(
                    "{op:?} of {id} with token {token} succeeded at {now} without a live \
                     claim of that token (row: {:?})",
                    before.map(|row| (row.status, &row.claim_token, row.locked_until))
                ));
            }
            if !ledger.issued.contains_key(token) {
                ledger.violations.push(format!(
                    "{op:?} of {id} with a token the store never issued"
                ));
            }
            if before
                .and_then(|row| row.locked_until)
                .is_some_and(|until| until <= true_now)
            {
                ledger.counts.stale_now_writes += 1;
            }
            if op != Op::Renew
                && let Some(first) = ledger.settled.insert(token.to_owned(), op)
            {
                ledger.violations.push(format!(
                    "{op:?} of {id} applied after {first:?} had settled the same claim"
                ));
            }
        } else if owned_live {
            ledger.violations.push(format!(
                "the store refused {op:?} of {id} while its token held a live claim"
            ));
        }
    }

    fn count_answer(&self, op: Op, token: &str, dead_letter: bool) {
        let mut ledger = self.ledger.lock().unwrap();
        if op == Op::Release {
            ledger
                .releases
                .entry(self.owner)
                .or_default()
                .insert(token.to_owned(), true);
        }
        let answered = ledger.answered.entry(self.owner).or_default();
        match (op, dead_letter) {
            (Op::Deliver, _) => answered.delivered += 1,
            (Op::Fail, false) => answered.retried += 1,
            (Op::Fail, true) => answered.dead_lettered += 1,
            (Op::Release, _) => answered.released += 1,
            (Op::Claim | Op::Renew, _) => {}
        }
    }

    /// Run one fenced write under its fault, auditing what it did.
    async fn fenced<T>(
        &self,
        op: Op,
        operation: &'static str,
        (id, token, now): (String, String, DateTime<Utc>),
        dead_letter: bool,
        work: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        if op == Op::Release {
            self.ledger
                .lock()
                .unwrap()
                .releases
                .entry(self.owner)
                .or_default()
                .entry(token.clone())
                .or_insert(false);
        }
        let fault = self.draw(op, &id);
        let short = &token[..token.len().min(8)];
        note(&self.trace, &self.clock, || {
            format!(
                "c{} {op:?} {id} token {short} now {} fault {fault:?}",
                self.owner,
                now.format("%H:%M:%S%.3f")
            )
        });
        Self::before(fault, &id, operation).await?;
        // The memory store works under a mutex without awaiting, and this
        // runtime has one thread: nothing runs between these three steps.
        let before = self.inner.get_message(&id).await.ok();
        let result = work.await;
        note(&self.trace, &self.clock, || {
            format!(
                "c{} {op:?} {id} token {short}: {:?}",
                self.owner,
                result.as_ref().map(|_| ()).map_err(ToString::to_string)
            )
        });
        self.audit_fenced(op, &id, &token, now, before.as_ref(), result.is_ok());
        if let Err(error) = &result
            && !error.is_claim_lost()
        {
            self.violation(format!("{op:?} of {id} failed unexpectedly: {error}"));
        }
        let result = Self::after(fault, operation, result).await;
        if result.is_ok() {
            self.count_answer(op, &token, dead_letter);
        }
        result
    }
}

impl OutboxStore for SimStore {
    async fn enqueue(&self, message: NewMessage) -> Result<Enqueued> {
        self.inner.enqueue(message).await
    }

    async fn claim_batch(&self, params: ClaimBatch) -> Result<ClaimedBatch> {
        let fault = self.draw(Op::Claim, "");
        Self::before(fault, "", "claim_batch").await?;
        let true_now = self.clock.now();
        let before: HashMap<String, OutboxMessage> = self
            .all_messages()
            .await
            .into_iter()
            .map(|row| (row.id.clone(), row))
            .collect();
        let result = self.inner.claim_batch(params.clone()).await;
        note(&self.trace, &self.clock, || match &result {
            Ok(batch) => format!(
                "c{} claim now {} fault {fault:?}: {:?}, abandoned {:?}",
                self.owner,
                params.now.format("%H:%M:%S%.3f"),
                batch
                    .claimed
                    .iter()
                    .map(|m| format!(
                        "{} token {} until {}",
                        m.id,
                        &m.claim_token[..8],
                        m.locked_until.format("%H:%M:%S%.3f")
                    ))
                    .collect::<Vec<_>>(),
                batch
                    .dead_lettered
                    .iter()
                    .map(|m| &m.id)
                    .collect::<Vec<_>>()
            ),
            Err(error) => format!("c{} claim: {error}", self.owner),
        });
        {
            let mut ledger = self.ledger.lock().unwrap();
            if params.now > true_now {
                ledger.violations.push(format!(
                    "a claim at {}, ahead of the clock ({true_now})",
                    params.now
                ));
            }
            match &result {
                Ok(batch) => {
                    for message in &batch.claimed {
                        let row = &before[&message.id];
                        if !row.is_claimable(params.now) {
                            ledger.violations.push(format!(
                                "{} claimed at {} while {:?} under {:?} until {:?}",
                                message.id,
                                params.now,
                                row.status,
                                row.claim_token,
                                row.locked_until
                            ));
                        }
                        ledger
                            .issued
                            .insert(message.claim_token.clone(), message.id.clone());
                    }
                    for message in &batch.dead_lettered {
                        let row = &before[&message.id];
                        if !row.is_claimable(params.now) || row.attempts < row.max_attempts {
                            ledger.violations.push(format!(
                                "{} dead-lettered at claim with {} of {} attempts",
                                message.id, row.attempts, row.max_attempts
                            ));
                        }
                    }
                }
                Err(error) => ledger
                    .violations
                    .push(format!("a claim failed unexpectedly: {error}")),
            }
        }
        let result = Self::after(fault, "claim_batch", result).await;
        if let Ok(batch) = &result {
            let mut ledger = self.ledger.lock().unwrap();
            let answered = ledger.answered.entry(self.owner).or_default();
            answered.claimed += batch.claimed.len() as u64;
            answered.abandoned += batch.dead_lettered.len() as u64;
        }
        result
    }

    async fn renew_claim(&self, params: RenewClaim) -> Result<DateTime<Utc>> {
        let key = (params.id.clone(), params.claim_token.clone(), params.now);
        self.fenced(
            Op::Renew,
            "renew_claim",
            key,
            false,
            self.inner.renew_claim(params),
        )
        .await
    }

    async fn mark_delivered(&self, params: MarkDelivered) -> Result<()> {
        let key = (params.id.clone(), params.claim_token.clone(), params.now);
        self.fenced(
            Op::Deliver,
            "mark_delivered",
            key,
            false,
            self.inner.mark_delivered(params),
        )
        .await
    }

    async fn mark_failed(&self, params: MarkFailed) -> Result<()> {
        let key = (params.id.clone(), params.claim_token.clone(), params.now);
        let dead_letter = params.dead_letter;
        self.fenced(
            Op::Fail,
            "mark_failed",
            key,
            dead_letter,
            self.inner.mark_failed(params),
        )
        .await
    }

    async fn release_claim(&self, params: ReleaseClaim) -> Result<()> {
        let key = (params.id.clone(), params.claim_token.clone(), params.now);
        self.fenced(
            Op::Release,
            "release_claim",
            key,
            false,
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

/// The fault names, in the order of [`FaultCounts::injected`].
pub(crate) const FAULT_NAMES: [&str; 6] = [
    "transient",
    "transient after the work",
    "claim refused",
    "delay before",
    "delay after",
    "hang",
];
