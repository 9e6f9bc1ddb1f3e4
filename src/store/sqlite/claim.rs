//! The SQLite store's claim, in one `BEGIN IMMEDIATE` transaction: one
//! statement picks the rows of the queues served and hands them over as
//! JSON, a second claims them by rowid (dead-lettering those out of
//! attempts, cancelling expired claims whose cancellation was requested);
//! the rows a delivery gets are decoded straight from what was picked.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use sqlx::sqlite::{SqliteConnection, SqliteRow};
use sqlx::{AssertSqlSafe, Connection, Row};

use super::{Core, Shared, micros};
use crate::error::{AbandonedClaimError, Error, ErrorRecord, Result};
use crate::kind::MessageStatus;
use crate::message::{ClaimedMessage, OnDeadLetter, OutboxMessage, new_claim_token};
use crate::payload::Payload;
use crate::store::kit::{check, lease_end};
use crate::store::sql::{self, db};
use crate::store::{ClaimBatch, ClaimedBatch};

impl Core {
    pub(super) async fn claim(&self, params: ClaimBatch) -> Result<ClaimedBatch> {
        check::claim_batch(&params)?;
        let served = params.served()?;
        let ClaimBatch {
            on_dead_letter,
            limit,
            now,
            lease,
            ..
        } = params;
        let locked_until = lease_end(now, lease)?;
        // Each queue's attempt cap, which `served` resolves for every queue.
        let caps: Caps = served
            .iter()
            .map(|queue| (queue.queue.clone(), queue.max_attempts.unwrap_or(1)))
            .collect();
        let served_json = serde_json::to_string(
            &served
                .iter()
                .map(|queue| (&queue.queue, queue.limit, caps[&queue.queue]))
                .collect::<Vec<_>>(),
        )
        .expect("names and integers serialize");
        let level = served
            .iter()
            .map(|queue| queue.limit)
            .max()
            .unwrap_or(limit);
        let _write = self.write.lock().await;
        let mut conn = self.parts.pool.acquire().await.map_err(db("claim_batch"))?;
        let mut tx = conn
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(db("claim_batch"))?;
        // The claim's binds, in the order of both `claim` and `pick`.
        let bound = |statement: &Arc<str>| {
            sqlx::query(AssertSqlSafe(statement.clone()))
                .bind(micros(now))
                .bind(micros(locked_until))
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .bind(on_dead_letter == OnDeadLetter::Block)
                .bind(served_json.clone())
                .bind(i64::try_from(level).unwrap_or(i64::MAX))
        };
        let picked = match bound(&self.sql.pick).fetch_one(&mut *tx).await {
            Ok(row) => row
                .try_get::<&str, _>(0)
                .ok()
                .and_then(|json| serde_json::from_str::<Vec<Picked>>(json).ok()),
            Err(e) => {
                tracing::debug!(table = %self.parts.table, error = %e,
                    "claim rows not readable as JSON; claiming with one statement");
                None
            }
        };
        let mut selected = Vec::new();
        let rows = match picked {
            Some(picked) => {
                self.take(&mut tx, &picked, now, locked_until, &caps, &mut selected)
                    .await?
            }
            // A value JSON cannot carry (text that is not UTF-8): claim the
            // rows with one statement that reads each value as it is, so
            // the rows below say what is wrong with them.
            None => bound(&self.sql.claim)
                .fetch_all(&mut *tx)
                .await
                .map_err(db("claim_batch"))?,
        };
        for row in &rows {
            if let Some(claimed) = claimed_row(row, &caps) {
                selected.push(claimed);
                continue;
            }
            // Dead-lettered at claim, or unreadable: the full decode says
            // which, and why.
            match Shared::decode(row).and_then(|read| Ok((read.seq, read.into_message()?))) {
                Ok((seq, message)) => selected.push((seq, Selected::Abandoned(message))),
                Err(unreadable) => {
                    let seq: i64 = row.try_get("seq").map_err(db("claim_batch"))?;
                    self.quarantine(&mut tx, seq, &unreadable, now).await?;
                }
            }
        }
        selected.sort_by_key(|(seq, selected)| {
            let (available_at, created_at) = selected.order();
            (available_at, created_at, *seq)
        });
        let mut batch = ClaimedBatch::default();
        for (seq, selected) in selected {
            let mut message = match selected {
                Selected::Claimed(message) => {
                    batch.claimed.push(message);
                    continue;
                }
                Selected::Abandoned(message) => message,
            };
            let cap = cap_of(&caps, &message.queue);
            if message.status == MessageStatus::Cancelled {
                batch.cancelled.push(message);
            } else if message.status == MessageStatus::DeadLettered {
                let record = ErrorRecord::from_error(&AbandonedClaimError {
                    id: message.id.clone(),
                    attempts: message.attempts,
                    max_attempts: message.effective_max_attempts(cap),
                });
                sqlx::query(AssertSqlSafe(self.sql.abandoned.clone()))
                    .bind(record.to_json())
                    .bind(seq)
                    .execute(&mut *tx)
                    .await
                    .map_err(db("claim_batch"))?;
                message.last_error = Some(record);
                batch.dead_lettered.push(message);
            } else {
                batch.claimed.push(sql::claimed_view(message, cap)?);
            }
        }
        tx.commit().await.map_err(db("claim_batch"))?;
        Ok(batch)
    }

    /// Claim the rows `picked` in `tx`, pushing onto `selected` each one
    /// claimed whose picked columns decode; returns the rest (out of
    /// attempts and so dead-lettered, cancelled, or with a column the
    /// delivery cannot read) as stored after the claim, for the full decode
    /// to sort out.
    async fn take(
        &self,
        tx: &mut SqliteConnection,
        picked: &[Picked],
        now: DateTime<Utc>,
        locked_until: DateTime<Utc>,
        caps: &Caps,
        selected: &mut Vec<(i64, Selected)>,
    ) -> Result<Vec<SqliteRow>> {
        if picked.is_empty() {
            return Ok(Vec::new());
        }
        let tokens: Vec<String> = picked.iter().map(|_| new_claim_token()).collect();
        // Each row's columns, read once: its queue names its attempt cap. A
        // row whose columns do not read gets the lowest cap of the claim;
        // the full decode then says what it is.
        let columns: Vec<Option<PickedColumns>> = picked
            .iter()
            .map(|Picked(_, columns)| serde_json::from_str(columns.as_deref()?.get()).ok())
            .collect();
        let row_caps: Vec<u32> = columns
            .iter()
            .map(|columns| match columns {
                Some(columns) => cap_of(caps, &columns.queue),
                None => caps.values().copied().min().unwrap_or(1),
            })
            .collect();
        let rows = serde_json::to_string(
            &picked
                .iter()
                .zip(&tokens)
                .zip(&row_caps)
                .map(|((picked, token), cap)| (picked.0, token, cap))
                .collect::<Vec<_>>(),
        )
        .expect("integers and strings serialize");
        let done = sqlx::query(AssertSqlSafe(self.sql.take.clone()))
            .bind(micros(now))
            .bind(micros(locked_until))
            .bind(rows)
            .execute(&mut *tx)
            .await
            .map_err(db("claim_batch"))?;
        // The write lock has been held since the rows were picked, so
        // nothing else can have changed them.
        if usize::try_from(done.rows_affected()) != Ok(picked.len()) {
            return Err(Error::store(
                "claim_batch",
                std::io::Error::other(format!(
                    "{} rows picked, {} claimed",
                    picked.len(),
                    done.rows_affected()
                )),
            ));
        }
        // The times as stored, to the microsecond.
        let claimed_at = DateTime::from_timestamp_micros(micros(now));
        let until = DateTime::from_timestamp_micros(micros(locked_until));
        let mut rest = Vec::new();
        let rows = picked.iter().zip(columns).zip(tokens).zip(row_caps);
        for (((Picked(seq, _), columns), token), cap) in rows {
            let claimed =
                columns
                    .zip(claimed_at.zip(until))
                    .and_then(|(columns, (claimed_at, until))| {
                        picked_claim(columns, cap, token, claimed_at, until)
                    });
            match claimed {
                Some(message) => selected.push((*seq, Selected::Claimed(message))),
                None => rest.push(*seq),
            }
        }
        if rest.is_empty() {
            return Ok(Vec::new());
        }
        sqlx::query(AssertSqlSafe(self.sql.by_seq.clone()))
            .bind(serde_json::to_string(&rest).expect("integers serialize"))
            .fetch_all(&mut *tx)
            .await
            .map_err(db("claim_batch"))
    }

    /// Dead-letter a row a claim selected but cannot read, so it does not
    /// stop every claim after it; an operator finds the reason in `last_error`.
    async fn quarantine(
        &self,
        conn: &mut SqliteConnection,
        seq: i64,
        unreadable: &Error,
        now: DateTime<Utc>,
    ) -> Result<()> {
        tracing::error!(table = %self.parts.table, seq, error = %unreadable,
            "outbox row is unreadable; dead-lettered");
        sqlx::query(AssertSqlSafe(self.sql.quarantine.clone()))
            .bind(ErrorRecord::from_error(unreadable).to_json())
            .bind(micros(now))
            .bind(seq)
            .execute(conn)
            .await
            .map_err(db("claim_batch"))?;
        Ok(())
    }
}

/// The attempt cap of each queue a claim serves.
type Caps = HashMap<String, u32>;

/// The cap of `queue`'s messages without their own; a queue the claim did
/// not serve (which no row it took is in) gets the lowest.
fn cap_of(caps: &Caps, queue: &str) -> u32 {
    caps.get(queue)
        .copied()
        .unwrap_or_else(|| caps.values().copied().min().unwrap_or(1))
}

/// A row a claim selected: claimed, or dead-lettered (out of attempts) or
/// cancelled at claim, which the caller gets as the full stored message.
enum Selected {
    Claimed(ClaimedMessage),
    Abandoned(OutboxMessage),
}

impl Selected {
    /// Where the row stands in claim order, before its `seq`.
    fn order(&self) -> (DateTime<Utc>, DateTime<Utc>) {
        match self {
            Selected::Claimed(m) => (m.available_at, m.created_at),
            Selected::Abandoned(m) => (m.available_at, m.created_at),
        }
    }
}

/// A row the claim returned as claimed, decoded by position (the order of
/// [`statements::COLUMNS`](super::statements::COLUMNS)) straight into the message a delivery gets, with
/// `caps` the claim's attempt caps. `None` for any other row, or one with a
/// column the full decode ([`SqlOutbox::decode`](crate::store::sql::SqlOutbox::decode)) would refuse: that decode
/// then says what the row is, or why it cannot be read. Columns the
/// delivery does not need are still checked, not copied.
fn claimed_row(row: &SqliteRow, caps: &Caps) -> Option<(i64, Selected)> {
    let text = |i: usize| row.try_get::<&str, _>(i).ok();
    let optional_text = |i: usize| row.try_get::<Option<&str>, _>(i).ok();
    let time = |i: usize| DateTime::from_timestamp_micros(row.try_get::<i64, _>(i).ok()?);
    let optional_time = |i: usize| match row.try_get::<Option<i64>, _>(i).ok()? {
        Some(micros) => DateTime::from_timestamp_micros(micros).map(Some),
        None => Some(None),
    };
    let count = |i: usize| u32::try_from(row.try_get::<i64, _>(i).ok()?).ok();
    if text(6)? != MessageStatus::Claimed.as_str() {
        return None;
    }
    let trace = match optional_text(5)? {
        Some(text) => Some(serde_json::from_str(text).ok()?),
        None => None,
    };
    // Read only to be checked, as the full decode would.
    optional_text(13)?;
    time(15)?;
    optional_time(16)?;
    optional_time(18)?;
    optional_time(22)?;
    let max_attempts_set: bool = row.try_get(19).ok()?;
    let max_attempts = count(8)?;
    let queue = text(20)?.to_owned();
    let cap = cap_of(caps, &queue);
    let message = ClaimedMessage {
        id: text(1)?.to_owned(),
        kind: text(2)?.parse().ok()?,
        name: text(3)?.to_owned(),
        payload: Payload::from_json(text(4)?).ok()?,
        trace,
        attempts: count(7)?,
        max_attempts: if max_attempts_set { max_attempts } else { cap },
        max_attempts_set,
        available_at: time(9)?,
        created_at: time(14)?,
        ordering_key: optional_text(17)?.map(str::to_owned),
        priority: row.try_get(21).ok()?,
        queue,
        claim_token: optional_text(10)??.to_owned(),
        claimed_at: optional_time(11)??,
        locked_until: optional_time(12)??,
    };
    Some((row.try_get(0).ok()?, Selected::Claimed(message)))
}

/// A row as [`Statements::pick`](super::statements::Statements) writes it out: its
/// `seq` and its [`statements::PICKED`](super::statements::PICKED) columns, `None` when one held a
/// blob.
#[derive(serde::Deserialize)]
struct Picked(i64, Option<Box<serde_json::value::RawValue>>);

/// The [`statements::PICKED`](super::statements::PICKED) columns, in their order, as JSON carries
/// them (an array, read field by field): a column of another type (an
/// integer stored as text, say) fails to decode, as it would from the row.
#[derive(serde::Deserialize)]
struct PickedColumns {
    id: String,
    kind: String,
    name: String,
    payload: String,
    trace: Option<String>,
    attempts: i64,
    max_attempts: i64,
    max_attempts_set: i64,
    available_at: i64,
    created_at: i64,
    ordering_key: Option<String>,
    /// Read only to be checked, as the full decode would.
    #[allow(dead_code)]
    last_error: Option<String>,
    delivered_at: Option<i64>,
    skipped_at: Option<i64>,
    queue: String,
    priority: i64,
    cancel_requested_at: Option<i64>,
}

/// The message a delivery gets for a picked row that the claim took, with
/// `cap` its queue's attempt cap and the claim's `token` and times. `None`
/// when the row was out of attempts (the claim dead-lettered it), had a
/// cancellation request (the claim cancelled it), or has a column the full
/// decode would refuse, as [`claimed_row`] decides.
fn picked_claim(
    columns: PickedColumns,
    cap: u32,
    token: String,
    claimed_at: DateTime<Utc>,
    locked_until: DateTime<Utc>,
) -> Option<ClaimedMessage> {
    let PickedColumns {
        id,
        kind,
        name,
        payload,
        trace,
        attempts,
        max_attempts,
        max_attempts_set,
        available_at,
        created_at,
        ordering_key,
        last_error: _,
        delivered_at,
        skipped_at,
        queue,
        priority,
        cancel_requested_at,
    } = columns;
    if cancel_requested_at.is_some() {
        return None;
    }
    let max_attempts_set = max_attempts_set != 0;
    // As the claim's own test, on the stored integers.
    if attempts
        >= (if max_attempts_set {
            max_attempts
        } else {
            i64::from(cap)
        })
    {
        return None;
    }
    let time = DateTime::from_timestamp_micros;
    for micros in [delivered_at, skipped_at].into_iter().flatten() {
        time(micros)?;
    }
    let trace = match trace {
        Some(text) => Some(serde_json::from_str(&text).ok()?),
        None => None,
    };
    let max_attempts = u32::try_from(max_attempts).ok()?;
    Some(ClaimedMessage {
        id,
        kind: kind.parse().ok()?,
        name,
        payload: Payload::from_json(payload).ok()?,
        trace,
        attempts: u32::try_from(attempts.checked_add(1)?).ok()?,
        max_attempts: if max_attempts_set { max_attempts } else { cap },
        max_attempts_set,
        available_at: time(available_at)?,
        created_at: time(created_at)?,
        ordering_key,
        queue,
        priority: i16::try_from(priority).ok()?,
        claim_token: token,
        claimed_at,
        locked_until,
    })
}
