//! `SqlOutbox`, the half both SQL stores share: over a store's core, the
//! fenced writes (through a `FencedWriter`), the counts, one message by id,
//! requeues and skips with their refusals, purges, and reading rows back,
//! each written once for both databases.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use sqlx::{AssertSqlSafe, ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Row};

use super::backend::{RowsAffected, SqlBackend, SqlParts, StoredTime};
use super::errors::{Fence, Refusal, cancel_refusal, db, requeue_refusal, retry_refusal};
use super::row::{ColumnPositions, MESSAGE_COLUMNS, MessageRow};
use super::statements::pending_count;
use crate::error::{Error, Result, UnreadableMessage};
use crate::kind::MessageStatus;
use crate::message::OutboxMessage;
use crate::store::fenced::{FencedWrite, FencedWriter, SettlementMode};
use crate::store::kit::check;
use crate::store::{
    BlockedKey, CancelMessages, CancelReport, Lease, ListCursor, MarkDelivered, MarkFailed,
    MessagePage, OutboxStats, PauseQueue, PurgeBatch, PurgeMessages, QueueState, ReleaseClaim,
    RenewClaim, RequeueDeadLetters, SkipDeadLetter,
};

/// What a cancel did, from the status of each row it changed: `cancelled`,
/// or still `claimed` with the request recorded.
fn cancel_report(statuses: &[String]) -> CancelReport {
    let requested = statuses
        .iter()
        .filter(|status| status.as_str() == MessageStatus::Claimed.as_str())
        .count() as u64;
    CancelReport::new(statuses.len() as u64 - requested, requested)
}

/// The half both SQL stores share: their core and its fenced writer.
pub(crate) struct SqlOutbox<B> {
    pub(crate) core: Arc<B>,
    writer: Arc<FencedWriter<B>>,
}

impl<B> Clone for SqlOutbox<B> {
    fn clone(&self) -> Self {
        SqlOutbox {
            core: self.core.clone(),
            writer: self.writer.clone(),
        }
    }
}

impl<B> SqlOutbox<B>
where
    B: SqlBackend,
    for<'c> &'c mut <B::Db as Database>::Connection: Executor<'c, Database = B::Db>,
    <B::Db as Database>::Arguments: IntoArguments<B::Db>,
    for<'q> &'q str: Encode<'q, B::Db> + sqlx::Type<B::Db>,
    for<'q> Option<&'q str>: Encode<'q, B::Db>,
    for<'q> Option<String>: Encode<'q, B::Db>,
    for<'q> String: Encode<'q, B::Db>,
    for<'q> i64: Encode<'q, B::Db>,
    for<'q> Option<B::Time>: Encode<'q, B::Db>,
    for<'r> String: Decode<'r, B::Db> + sqlx::Type<B::Db>,
    for<'r> i64: Decode<'r, B::Db> + sqlx::Type<B::Db>,
    for<'r> i16: Decode<'r, B::Db> + sqlx::Type<B::Db>,
    for<'q> i16: Encode<'q, B::Db>,
    for<'q> bool: Encode<'q, B::Db> + Decode<'q, B::Db> + sqlx::Type<B::Db>,
    for<'a> &'a str: ColumnIndex<<B::Db as Database>::Row>,
    usize: ColumnIndex<<B::Db as Database>::Row>,
{
    /// The shared half over `core`, sending fenced writes as `mode` says,
    /// at most `statements` batches at a time.
    pub(crate) fn new(core: B, mode: SettlementMode, statements: usize) -> Self {
        let core = Arc::new(core);
        SqlOutbox {
            writer: Arc::new(FencedWriter::new(core.clone(), mode, statements)),
            core,
        }
    }

    /// How fenced writes are sent.
    pub(crate) fn mode(&self) -> SettlementMode {
        self.writer.mode()
    }

    /// The pool, table and statements of the store.
    pub(crate) fn parts(&self) -> &SqlParts<B::Db> {
        self.core.parts()
    }

    /// Apply one fenced write; answers whether the message carries a
    /// cancellation request.
    async fn fenced(&self, row: FencedWrite) -> Result<bool> {
        check::fence(&row.id, &row.claim_token)?;
        self.writer.run(row).await
    }

    pub(crate) async fn renew_lease(&self, params: RenewClaim) -> Result<Lease> {
        let (row, locked_until) = FencedWrite::renew(params)?;
        let cancel_requested = self.fenced(row).await?;
        Ok(Lease::new(locked_until, cancel_requested))
    }

    pub(crate) async fn mark_delivered(&self, params: MarkDelivered) -> Result<()> {
        self.fenced(params.into()).await.map(drop)
    }

    pub(crate) async fn settle_failure(&self, params: MarkFailed) -> Result<MessageStatus> {
        let dead_letter = params.dead_letter;
        Ok(if self.fenced(params.into()).await? {
            MessageStatus::Cancelled
        } else if dead_letter {
            MessageStatus::DeadLettered
        } else {
            MessageStatus::Pending
        })
    }

    pub(crate) async fn release_claim(&self, params: ReleaseClaim) -> Result<()> {
        self.fenced(params.into()).await.map(drop)
    }

    /// Counts from the partial indexes of pending rows, never touching
    /// settled ones.
    pub(crate) async fn pending_count(&self) -> Result<Option<u64>> {
        let sql = format!("SELECT {}", pending_count(&self.core.parts().shared.table));
        let count: i64 = sqlx::query_scalar(AssertSqlSafe(sql))
            .fetch_one(&self.core.parts().pool)
            .await
            .map_err(db("pending_count"))?;
        Ok(Some(u64::try_from(count).unwrap_or(0)))
    }

    pub(crate) async fn stats(&self, now: DateTime<Utc>) -> Result<OutboxStats> {
        let now = (!self.core.server_clock()).then(|| B::Time::store(now));
        let row = sqlx::query(AssertSqlSafe(self.core.parts().shared.stats.clone()))
            .bind(now)
            .fetch_one(&self.core.parts().pool)
            .await
            .map_err(db("stats"))?;
        let count = |i: usize| -> Result<u64> {
            let n: i64 = row.try_get(i).map_err(db("stats"))?;
            Ok(u64::try_from(n).unwrap_or(0))
        };
        let claimed = count(1)?;
        let live_claims = count(4)?;
        let oldest: Option<B::Time> = row.try_get(5).map_err(db("stats"))?;
        let blocked_keys = count(6)?;
        Ok(OutboxStats {
            pending: count(0)?,
            claimed,
            delivered: count(2)?,
            dead_lettered: count(3)?,
            cancelled: count(7)?,
            live_claims,
            expired_claims: claimed.saturating_sub(live_claims),
            oldest_due_at: oldest.map(StoredTime::load).transpose()?,
            blocked_keys,
        })
    }

    pub(crate) async fn get_message(&self, id: &str) -> Result<OutboxMessage> {
        let row = sqlx::query(AssertSqlSafe(self.core.parts().shared.get.clone()))
            .bind(id)
            .fetch_optional(&self.core.parts().pool)
            .await
            .map_err(db("get_message"))?
            .ok_or_else(|| Error::NotFound { id: id.to_owned() })?;
        Self::decode(&row)
            .and_then(MessageRow::into_message)
            .map_err(|error| Error::Unreadable(Box::new(Self::unreadable(&row, error))))
    }

    /// The time an admin change writes: the caller's `now`, or NULL where
    /// the store judges leases by the database's clock (the statement then
    /// reads that clock). A requeue stamped by a caller whose clock runs
    /// ahead would otherwise leave the message waiting out the skew.
    fn admin_now(&self, now: DateTime<Utc>) -> Option<B::Time> {
        (!self.core.server_clock()).then(|| B::Time::store(now))
    }

    pub(crate) async fn requeue_dead_letters(&self, params: RequeueDeadLetters) -> Result<u64> {
        check::requeue(&params)?;
        let sql = &self.core.parts().shared;
        let now = self.admin_now(params.now);
        let requeued = {
            let _write = self.core.write_lock().await;
            match &params.id {
                Some(id) => {
                    let done = sqlx::query(AssertSqlSafe(sql.requeue_one.clone()))
                        .bind(id.as_str())
                        .bind(now)
                        .execute(&self.core.parts().pool)
                        .await
                        .map_err(db("requeue_dead_letters"))?;
                    if done.count() == 0 {
                        return Err(self.refusal(id, params.now, requeue_refusal).await);
                    }
                    done.count()
                }
                None => {
                    let done = sqlx::query(AssertSqlSafe(sql.requeue_all.clone()))
                        .bind(now)
                        .bind(params.name.as_deref())
                        .execute(&self.core.parts().pool)
                        .await
                        .map_err(db("requeue_dead_letters"))?;
                    done.count()
                }
            }
        };
        if requeued > 0 {
            self.core.after_requeue().await;
        }
        Ok(requeued)
    }

    /// Make a pending message due now with `statement` (the backend's
    /// spelling of it: id bound first, then `now`), or say why not.
    pub(crate) async fn retry_now(
        &self,
        statement: String,
        id: &str,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let done = {
            let _write = self.core.write_lock().await;
            sqlx::query(AssertSqlSafe(statement))
                .bind(id)
                .bind(self.admin_now(now))
                .execute(&self.core.parts().pool)
                .await
                .map_err(db("retry_now"))?
        };
        if done.count() == 0 {
            return Err(self.refusal(id, now, retry_refusal).await);
        }
        self.core.after_requeue().await;
        Ok(())
    }

    /// How many messages the purge would delete.
    pub(crate) async fn count_purgeable(&self, params: PurgeMessages) -> Result<u64> {
        check::purge(&params)?;
        let sql = self.core.parts().shared.count_purgeable.clone();
        let count: i64 = sqlx::query_scalar(AssertSqlSafe(sql))
            .bind(params.status.map(MessageStatus::as_str))
            .bind(B::Time::store(params.older_than))
            .fetch_one(&self.core.parts().pool)
            .await
            .map_err(db("count_purgeable"))?;
        Ok(u64::try_from(count).unwrap_or(0))
    }

    /// Why an admin change to one message did not apply, from its state
    /// read back; `refuse` names the refusal for that state.
    async fn refusal(&self, id: &str, now: DateTime<Utc>, refuse: Refusal) -> Error {
        let row = sqlx::query(AssertSqlSafe(
            self.core.parts().shared.requeue_state.clone(),
        ))
        .bind(id)
        .fetch_optional(&self.core.parts().pool)
        .await;
        let row = match row {
            Ok(Some(row)) => row,
            Ok(None) => return Error::NotFound { id: id.to_owned() },
            Err(e) => return Error::store("requeue_dead_letters", e),
        };
        let status: Result<MessageStatus> = row
            .try_get::<String, _>(0)
            .map_err(db("requeue_dead_letters"))
            .and_then(|s| s.parse());
        let status = match status {
            Ok(status) => status,
            Err(e) => return e,
        };
        let until: Option<DateTime<Utc>> = row
            .try_get::<Option<B::Time>, _>(1)
            .ok()
            .flatten()
            .and_then(|stored| stored.load().ok());
        refuse(id, status, until, now)
    }

    pub(crate) async fn skip_dead_letter(&self, params: SkipDeadLetter) -> Result<()> {
        check::skip(&params.id)?;
        let done = {
            let _write = self.core.write_lock().await;
            sqlx::query(AssertSqlSafe(self.core.parts().shared.skip.clone()))
                .bind(params.id.as_str())
                .bind(self.admin_now(params.now))
                .execute(&self.core.parts().pool)
                .await
                .map_err(db("skip_dead_letter"))?
        };
        if done.count() == 0 {
            return Err(self.refusal(&params.id, params.now, requeue_refusal).await);
        }
        // The key's next message may be claimable now.
        self.core.after_requeue().await;
        Ok(())
    }

    pub(crate) async fn blocked_keys(&self, limit: usize) -> Result<Vec<BlockedKey>> {
        check::blocked_keys(limit)?;
        let rows = sqlx::query(AssertSqlSafe(self.core.parts().shared.blocked.clone()))
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.core.parts().pool)
            .await
            .map_err(db("blocked_keys"))?;
        rows.iter()
            .map(|row| {
                let waiting: i64 = row.try_get(4).map_err(db("blocked_keys"))?;
                let key = BlockedKey::new(
                    row.try_get(1).map_err(db("blocked_keys"))?,
                    row.try_get(2).map_err(db("blocked_keys"))?,
                    row.try_get(3).map_err(db("blocked_keys"))?,
                    u64::try_from(waiting).unwrap_or(0),
                );
                Ok(key.in_queue(row.try_get(0).map_err(db("blocked_keys"))?))
            })
            .collect()
    }

    pub(crate) async fn pause_queue(&self, params: PauseQueue) -> Result<bool> {
        check::queue(&params.queue)?;
        let done = sqlx::query(AssertSqlSafe(self.core.parts().shared.pause.clone()))
            .bind(params.queue.as_str())
            .bind(self.admin_now(params.now))
            .execute(&self.core.parts().pool)
            .await
            .map_err(db("pause_queue"))?;
        Ok(done.count() > 0)
    }

    pub(crate) async fn resume_queue(&self, queue: &str) -> Result<bool> {
        check::queue(queue)?;
        let done = sqlx::query(AssertSqlSafe(self.core.parts().shared.resume.clone()))
            .bind(queue)
            .execute(&self.core.parts().pool)
            .await
            .map_err(db("resume_queue"))?;
        let resumed = done.count() > 0;
        if resumed {
            // Its messages may be due: drains waiting for work should claim.
            self.core.after_requeue().await;
        }
        Ok(resumed)
    }

    pub(crate) async fn queues(&self) -> Result<Vec<QueueState>> {
        let rows = sqlx::query(AssertSqlSafe(self.core.parts().shared.queues.clone()))
            .fetch_all(&self.core.parts().pool)
            .await
            .map_err(db("queues"))?;
        rows.iter()
            .map(|row| {
                let count = |i: usize| -> Result<u64> {
                    let n: i64 = row.try_get(i).map_err(db("queues"))?;
                    Ok(u64::try_from(n).unwrap_or(0))
                };
                let paused_at: Option<B::Time> = row.try_get(3).map_err(db("queues"))?;
                Ok(QueueState::new(
                    row.try_get(0).map_err(db("queues"))?,
                    count(1)?,
                    count(2)?,
                    paused_at.map(StoredTime::load).transpose()?,
                ))
            })
            .collect()
    }

    pub(crate) async fn cancel_messages(&self, params: CancelMessages) -> Result<CancelReport> {
        check::cancel(&params)?;
        let statements = &self.core.parts().shared.cancel;
        let now = self.admin_now(params.now);
        let report = match (&params.id, params.dry_run) {
            (Some(id), true) => {
                let counted = sqlx::query(AssertSqlSafe(statements.count_one.clone()))
                    .bind(id.as_str())
                    .bind(now);
                self.counted(counted).await?
            }
            (None, true) => {
                let counted = sqlx::query(AssertSqlSafe(statements.count_matching.clone()))
                    .bind(params.name.as_deref())
                    .bind(params.ordering_key.as_deref())
                    .bind(params.queue.as_deref())
                    .bind(now);
                self.counted(counted).await?
            }
            (Some(id), false) => {
                let _write = self.core.write_lock().await;
                let statuses: Vec<String> =
                    sqlx::query_scalar(AssertSqlSafe(statements.one.clone()))
                        .bind(id.as_str())
                        .bind(now)
                        .fetch_all(&self.core.parts().pool)
                        .await
                        .map_err(db("cancel_messages"))?;
                cancel_report(&statuses)
            }
            (None, false) => {
                let _write = self.core.write_lock().await;
                let statuses: Vec<String> =
                    sqlx::query_scalar(AssertSqlSafe(statements.matching.clone()))
                        .bind(params.name.as_deref())
                        .bind(params.ordering_key.as_deref())
                        .bind(params.queue.as_deref())
                        .bind(now)
                        .fetch_all(&self.core.parts().pool)
                        .await
                        .map_err(db("cancel_messages"))?;
                cancel_report(&statuses)
            }
        };
        if let Some(id) = &params.id
            && report.total() == 0
        {
            return Err(self.refusal(id, params.now, cancel_refusal).await);
        }
        Ok(report)
    }

    /// The two counts a dry cancel's `query` selects.
    async fn counted(
        &self,
        query: sqlx::query::Query<'_, B::Db, <B::Db as Database>::Arguments>,
    ) -> Result<CancelReport> {
        let row = query
            .fetch_one(&self.core.parts().pool)
            .await
            .map_err(db("cancel_messages"))?;
        let count = |i: usize| -> Result<u64> {
            let n: i64 = row.try_get(i).map_err(db("cancel_messages"))?;
            Ok(u64::try_from(n).unwrap_or(0))
        };
        Ok(CancelReport::new(count(0)?, count(1)?))
    }

    /// A purge in batches, each a statement of its own, so no lock is held
    /// for long however many rows go.
    pub(crate) async fn purge(&self, params: PurgeMessages) -> Result<u64> {
        check::purge(&params)?;
        const BATCH: usize = 10_000;
        let statuses = match params.status {
            Some(status) => vec![status],
            None => MessageStatus::TERMINAL.to_vec(),
        };
        let mut deleted = 0;
        for status in statuses {
            loop {
                let batch = PurgeBatch {
                    status,
                    older_than: params.older_than,
                    limit: BATCH,
                };
                let done = self.purge_batch(batch).await?;
                deleted += done;
                if done < BATCH as u64 {
                    break;
                }
            }
        }
        Ok(deleted)
    }

    /// One bounded delete; see [`OutboxStore::purge_batch`](crate::OutboxStore::purge_batch).
    pub(crate) async fn purge_batch(&self, params: PurgeBatch) -> Result<u64> {
        check::purge_batch(&params)?;
        let _write = self.core.write_lock().await;
        let done = sqlx::query(AssertSqlSafe(self.core.parts().shared.purge_batch.clone()))
            .bind(params.status.as_str())
            .bind(B::Time::store(params.older_than))
            .bind(i64::try_from(params.limit).unwrap_or(i64::MAX))
            .execute(&self.core.parts().pool)
            .await
            .map_err(db("purge"))?;
        Ok(done.count())
    }

    /// See [`OutboxStore::vacuum`](crate::OutboxStore::vacuum).
    pub(crate) async fn vacuum(&self) -> Result<()> {
        self.prune_keys().await?;
        let Some(sql) = self.core.parts().shared.vacuum.clone() else {
            return Ok(());
        };
        // The simple protocol: VACUUM refuses to run in a transaction, and
        // the extended protocol may wrap a statement in one.
        sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(&self.core.parts().pool)
            .await
            .map_err(db("vacuum"))?;
        Ok(())
    }

    /// Delete the rows of idle ordering keys, batch after batch, a bounded
    /// number per call so a vacuum stays short: the next one deletes more.
    async fn prune_keys(&self) -> Result<()> {
        const BATCH: i64 = 10_000;
        const MOST_BATCHES: usize = 10;
        let Some(sql) = self.core.parts().shared.prune_keys.clone() else {
            return Ok(());
        };
        for _ in 0..MOST_BATCHES {
            let done = sqlx::query(AssertSqlSafe(sql.clone()))
                .bind(BATCH)
                .execute(&self.core.parts().pool)
                .await
                .map_err(db("vacuum"))?;
            if done.count() < BATCH as u64 {
                break;
            }
        }
        Ok(())
    }

    /// A page of messages out of up to `limit + 1` rows. A row that does
    /// not decode goes to [`MessagePage::unreadable`] with its raw columns
    /// instead of failing the page. The cursor is the last row's, readable
    /// or not; a last row whose `created_at` or id cannot be read ends the
    /// listing there, since no cursor can point past it.
    pub(crate) fn page(rows: &[<B::Db as Database>::Row], limit: usize) -> Result<MessagePage> {
        let more = rows.len() > limit;
        let mut messages = Vec::new();
        let mut unreadable = Vec::new();
        let mut last = None;
        for row in rows.iter().take(limit) {
            match Self::decode(row).and_then(MessageRow::into_message) {
                Ok(message) => {
                    last = Some(ListCursor {
                        created_at: message.created_at,
                        id: message.id.clone(),
                    });
                    messages.push(message);
                }
                Err(error) => {
                    let row = Self::unreadable(row, error);
                    last = row.created_at.map(|created_at| ListCursor {
                        created_at,
                        id: row.id.clone(),
                    });
                    if row.column("id").is_none() {
                        last = None;
                    }
                    unreadable.push(row);
                }
            }
        }
        let next = if more { last } else { None };
        Ok(MessagePage::new(messages, next).with_unreadable(unreadable))
    }

    /// A row that does not decode, as raw text, with why.
    pub(crate) fn unreadable(row: &<B::Db as Database>::Row, error: Error) -> UnreadableMessage {
        let (id, reason) = match error {
            Error::CorruptRow { id, reason } => (id, reason),
            other => (String::from("<unreadable>"), other.to_string()),
        };
        let created_at = row
            .try_get::<B::Time, _>("created_at")
            .ok()
            .and_then(|stored| stored.load().ok());
        UnreadableMessage::new(id, created_at, reason, B::raw_columns(row))
    }

    /// The fence columns (status, claim token, `locked_until`) of the
    /// messages `ids` names, as they are now, by id, to name why a fenced
    /// write missed. Only on that failure path; a read error, or a row that
    /// cannot be read, leaves the reason unknown (the write already proved
    /// the claim lost).
    pub(crate) async fn fences<T>(
        parts: &SqlParts<B::Db>,
        statement: &Arc<str>,
        ids: T,
    ) -> HashMap<String, Fence>
    where
        T: for<'q> Encode<'q, B::Db> + sqlx::Type<B::Db> + Send + 'static,
    {
        let rows = sqlx::query(AssertSqlSafe(statement.clone()))
            .bind(ids)
            .fetch_all(&parts.pool)
            .await
            .unwrap_or_default();
        rows.iter()
            .filter_map(|row| {
                let id: String = row.try_get(0).ok()?;
                let status: String = row.try_get(1).ok()?;
                let token: Option<String> = row.try_get(2).ok()?;
                let until: Option<B::Time> = row.try_get(3).ok()?;
                let until = match until {
                    Some(stored) => Some(stored.load().ok()?),
                    None => None,
                };
                Some((id, (status, token, until)))
            })
            .collect()
    }

    /// A stored row with its columns decoded, or why it cannot be.
    pub(crate) fn decode(row: &<B::Db as Database>::Row) -> Result<MessageRow> {
        Self::decode_at(row, &ColumnPositions::of(row))
    }

    /// [`SqlOutbox::decode`] with the columns where `at` found them in
    /// another row of the same result (all its rows share one layout).
    pub(crate) fn decode_at(
        row: &<B::Db as Database>::Row,
        at: &ColumnPositions,
    ) -> Result<MessageRow> {
        let id: String = at.get(row, 1).map_err(|e| Error::CorruptRow {
            id: String::from("<unreadable>"),
            reason: e.to_string(),
        })?;
        let corrupt = |e: sqlx::Error| Error::CorruptRow {
            id: id.clone(),
            reason: e.to_string(),
        };
        let off_calendar = |k: usize, e: Error| Error::CorruptRow {
            id: id.clone(),
            reason: format!("{}: {e}", MESSAGE_COLUMNS[k]),
        };
        let time = |k: usize| -> Result<DateTime<Utc>> {
            let stored: B::Time = at.get(row, k).map_err(corrupt)?;
            stored.load().map_err(|e| off_calendar(k, e))
        };
        let optional_time = |k: usize| -> Result<Option<DateTime<Utc>>> {
            let stored: Option<B::Time> = at.get(row, k).map_err(corrupt)?;
            stored
                .map(|stored| stored.load().map_err(|e| off_calendar(k, e)))
                .transpose()
        };
        Ok(MessageRow {
            seq: at.get(row, 0).map_err(corrupt)?,
            kind: at.get(row, 2).map_err(corrupt)?,
            name: at.get(row, 3).map_err(corrupt)?,
            payload: at.get(row, 4).map_err(corrupt)?,
            trace: at.get(row, 5).map_err(corrupt)?,
            status: at.get(row, 6).map_err(corrupt)?,
            attempts: at.get(row, 7).map_err(corrupt)?,
            max_attempts: at.get(row, 8).map_err(corrupt)?,
            available_at: time(9)?,
            claim_token: at.get(row, 10).map_err(corrupt)?,
            claimed_at: optional_time(11)?,
            locked_until: optional_time(12)?,
            last_error: at.get(row, 13).map_err(corrupt)?,
            created_at: time(14)?,
            updated_at: time(15)?,
            delivered_at: optional_time(16)?,
            ordering_key: at.get(row, 17).map_err(corrupt)?,
            skipped_at: optional_time(18)?,
            max_attempts_set: at.get(row, 19).map_err(corrupt)?,
            queue: at.get(row, 20).map_err(corrupt)?,
            priority: at.get(row, 21).map_err(corrupt)?,
            cancel_requested_at: optional_time(22)?,
            id: id.clone(),
        })
    }
}
