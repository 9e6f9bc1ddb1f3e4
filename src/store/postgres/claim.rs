//! The PostgreSQL store's claim: a first pass through the table's `claim`
//! function over the queues served, and the heads of ordering keys it left
//! claimed in a second round trip under their keys' locks; then the rows
//! out of attempts dead-lettered, expired claims with a cancellation
//! request cancelled, and unreadable rows quarantined.

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, Column, Row};

use super::{Core, Shared};
use crate::error::{AbandonedClaimError, Error, ErrorRecord, Result};
use crate::kind::MessageStatus;
use crate::message::{ClaimedMessage, OnDeadLetter, OutboxMessage};
use crate::store::kit::{check, lease_end};
use crate::store::sql::{self, ColumnPositions, db};
use crate::store::{ClaimBatch, ClaimedBatch, QueueLimit};

/// What a claim did with `row` (see `Statements::claim_first`): read by position,
/// since a claim's statements all select it first, and without a copy,
/// since it is read for every row a claim returns.
fn claim_outcome(row: &PgRow) -> Result<&str> {
    match row.columns().first() {
        Some(column) if column.name() == "outcome" => row.try_get(0),
        _ => row.try_get("outcome"),
    }
    .map_err(db("claim_batch"))
}

/// A statement with its binds, as `sqlx::query` makes it.
type PgQuery<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

/// The queues a claim serves, as the arrays its statements bind: names,
/// limits and attempt caps, in one order.
#[derive(Debug, Default, Clone)]
pub(super) struct Served {
    queues: Vec<String>,
    limits: Vec<i32>,
    caps: Vec<i64>,
}

impl Served {
    fn of(served: &[QueueLimit]) -> Self {
        let mut arrays = Served::default();
        for queue in served {
            arrays.queues.push(queue.queue.clone());
            arrays
                .limits
                .push(i32::try_from(queue.limit).unwrap_or(i32::MAX));
            arrays.caps.push(i64::from(queue.max_attempts.unwrap_or(1)));
        }
        arrays
    }

    /// The attempt cap of messages of `queue` without their own.
    fn cap(&self, queue: &str) -> u32 {
        let caps = self.queues.iter().zip(&self.caps);
        let cap = caps
            .filter(|(name, _)| name.as_str() == queue)
            .map(|(_, &cap)| cap)
            .next()
            .or_else(|| self.caps.iter().copied().min())
            .unwrap_or(1);
        u32::try_from(cap).unwrap_or(u32::MAX)
    }
}

impl Core {
    /// A claim's first pass: see `Statements::claim_first`.
    pub(super) fn claim_first(
        &self,
        served: &Served,
        limit: usize,
        now: Option<DateTime<Utc>>,
        lease_micros: i64,
        block: bool,
        durable: bool,
    ) -> PgQuery<'static> {
        sqlx::query(AssertSqlSafe(self.sql.claim_first.clone()))
            .bind(served.queues.clone())
            .bind(served.limits.clone())
            .bind(served.caps.clone())
            .bind(i32::try_from(limit).unwrap_or(i32::MAX))
            // The function's walk of keyed rows, which it no longer reads
            // (`migrations/postgres/0017_key_heads.sql`).
            .bind(i32::try_from(limit).unwrap_or(i32::MAX))
            .bind(now)
            .bind(lease_micros)
            .bind(block)
            .bind(durable)
    }

    /// A claim's first pass that claims nothing, to plan the function on a
    /// connection (see `Core::warm_up`).
    pub(super) fn claim_nothing(&self) -> PgQuery<'static> {
        self.claim_first(&Served::default(), 0, None, 1, false, false)
    }

    pub(super) async fn claim(&self, params: ClaimBatch) -> Result<ClaimedBatch> {
        check::claim_batch(&params)?;
        let served = Served::of(&params.served()?);
        let ClaimBatch {
            on_dead_letter,
            limit,
            now,
            lease,
            durable,
            ..
        } = params;
        let locked_until = lease_end(now, lease)?;
        let lease_micros = i64::try_from(lease.as_micros())
            .map_err(|_| Error::invalid("lease", "is too long to add to now"))?;
        let block = on_dead_letter == OnDeadLetter::Block;
        let mut claimed = Vec::with_capacity(limit);
        let mut abandoned = Vec::new();
        let rows = self
            .claim_first(
                &served,
                limit,
                self.bound_now(now),
                lease_micros,
                block,
                durable,
            )
            .fetch_all(&self.parts.pool)
            .await
            .map_err(db("claim_batch"))?;
        // The heads the first pass left to the second, with the hashes of
        // their keys.
        let mut heads = Vec::new();
        for row in &rows {
            if claim_outcome(row)? == "keyed" {
                let hash: i64 = row.try_get("key_hash").map_err(db("claim_batch"))?;
                let id: String = row.try_get("id").map_err(db("claim_batch"))?;
                heads.push((hash, id));
            }
        }
        self.read_claimed(
            &rows,
            now,
            locked_until,
            &served,
            &mut claimed,
            &mut abandoned,
        )
        .await?;
        if !heads.is_empty() {
            // One round trip locks their keys and claims those still heads
            // (`migrations/postgres/0017_key_heads.sql`).
            let (hashes, ids) = lock_order(heads);
            let rows = sqlx::query(AssertSqlSafe(self.sql.claim_heads.clone()))
                .bind(&hashes)
                .bind(&ids)
                .bind(&served.queues)
                .bind(&served.caps)
                .bind(self.bound_now(now))
                .bind(lease_micros)
                .bind(block)
                .bind(durable)
                .fetch_all(&self.parts.pool)
                .await
                .map_err(db("claim_batch"))?;
            self.read_claimed(
                &rows,
                now,
                locked_until,
                &served,
                &mut claimed,
                &mut abandoned,
            )
            .await?;
        }
        claimed.sort_by_key(|(seq, m)| (m.available_at, m.created_at, *seq));
        let mut batch = ClaimedBatch {
            claimed: claimed.into_iter().map(|(_, m)| m).collect(),
            ..ClaimedBatch::default()
        };
        if !abandoned.is_empty() {
            for message in self.dead_letter_abandoned(abandoned, now, &served).await? {
                if message.status == MessageStatus::Cancelled {
                    batch.cancelled.push(message);
                } else {
                    batch.dead_lettered.push(message);
                }
            }
        }
        Ok(batch)
    }

    /// Sort the rows of one pass into claimed and abandoned, quarantining
    /// unreadable ones; rows left for the second pass are skipped.
    async fn read_claimed(
        &self,
        rows: &[PgRow],
        now: DateTime<Utc>,
        locked_until: DateTime<Utc>,
        served: &Served,
        claimed: &mut Vec<(i64, ClaimedMessage)>,
        abandoned: &mut Vec<(i64, OutboxMessage)>,
    ) -> Result<()> {
        // Every row of a result has the same columns: found once.
        let Some(at) = rows.first().map(ColumnPositions::of) else {
            return Ok(());
        };
        for row in rows {
            let outcome = claim_outcome(row)?;
            if outcome == "keyed" {
                continue;
            }
            let decoded = Shared::decode_at(row, &at).and_then(|r| Ok((r.seq, r.into_message()?)));
            match decoded {
                Ok((seq, message)) if outcome == "abandoned" => abandoned.push((seq, message)),
                Ok((seq, message)) => {
                    let cap = served.cap(&message.queue);
                    let mut message = sql::claimed_view(message, cap)?;
                    if self.server_clock {
                        // The lease began on the server no earlier than
                        // the caller read `now`, so it ends no earlier than
                        // `now + lease` on the caller's clock, whatever the
                        // skew between the two: a deadline the caller can
                        // keep with its own clock. The row keeps the
                        // server's times.
                        message.claimed_at = now;
                        message.locked_until = locked_until;
                    }
                    claimed.push((seq, message));
                }
                Err(unreadable) => self.quarantine(row, unreadable, now).await?,
            }
        }
        Ok(())
    }

    /// Dead-letter the rows a claim found out of attempts, if they still
    /// are, and cancel those with a cancellation request; answers them as
    /// they are now.
    async fn dead_letter_abandoned(
        &self,
        abandoned: Vec<(i64, OutboxMessage)>,
        now: DateTime<Utc>,
        served: &Served,
    ) -> Result<Vec<OutboxMessage>> {
        let mut ids = Vec::with_capacity(abandoned.len());
        let mut attempts = Vec::with_capacity(abandoned.len());
        let mut errors = Vec::with_capacity(abandoned.len());
        let mut caps = Vec::with_capacity(abandoned.len());
        for (_, message) in &abandoned {
            let cap = served.cap(&message.queue);
            ids.push(message.id.clone());
            attempts.push(i64::from(message.attempts));
            caps.push(i64::from(cap));
            errors.push(
                ErrorRecord::from_error(&AbandonedClaimError {
                    id: message.id.clone(),
                    attempts: message.attempts,
                    max_attempts: message.effective_max_attempts(cap),
                })
                .to_json(),
            );
        }
        let rows = sqlx::query(AssertSqlSafe(self.sql.abandoned.clone()))
            .bind(self.bound_now(now))
            .bind(ids)
            .bind(attempts)
            .bind(errors)
            .bind(caps)
            .fetch_all(&self.parts.pool)
            .await
            .map_err(db("claim_batch"))?;
        let mut dead = rows
            .iter()
            .map(|row| {
                let row = Shared::decode(row)?;
                Ok((row.seq, row.into_message()?))
            })
            .collect::<Result<Vec<_>>>()?;
        dead.sort_by_key(|(seq, m)| (m.available_at, m.created_at, *seq));
        Ok(dead.into_iter().map(|(_, m)| m).collect())
    }

    /// Dead-letter a row a claim selected but cannot read, so it does not
    /// stop every claim after it; an operator finds the reason in `last_error`.
    async fn quarantine(&self, row: &PgRow, unreadable: Error, now: DateTime<Utc>) -> Result<()> {
        let seq: i64 = row.try_get("seq").map_err(db("claim_batch"))?;
        let token: Option<String> = row.try_get("claim_token").map_err(db("claim_batch"))?;
        tracing::error!(table = %self.parts.table, seq, error = %unreadable,
            "outbox row is unreadable; dead-lettered");
        sqlx::query(AssertSqlSafe(self.sql.quarantine.clone()))
            .bind(ErrorRecord::from_error(&unreadable).to_json())
            .bind(self.bound_now(now))
            .bind(seq)
            .bind(token)
            .execute(&self.parts.pool)
            .await
            .map_err(db("claim_batch"))?;
        Ok(())
    }
}

/// The key hashes of `keys` (hash, a head's id) in the one order
/// every claimer takes their locks, each once (two keys may share a hash;
/// one lock serves both), and the keys or ids.
fn lock_order(keys: impl IntoIterator<Item = (i64, String)>) -> (Vec<i64>, Vec<String>) {
    let mut keys: Vec<(i64, String)> = keys.into_iter().collect();
    keys.sort_unstable();
    keys.dedup();
    let (mut hashes, keys): (Vec<i64>, Vec<String>) = keys.into_iter().unzip();
    hashes.dedup();
    (hashes, keys)
}
