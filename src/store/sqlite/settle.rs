//! The SQLite store's fenced writes: one statement per kind of write in a
//! batch, each row fenced on its own, and for the rows a statement did not
//! change, why their claims were lost.

use sqlx::{AssertSqlSafe, Connection};

use super::statements::FencedWrites;
use super::{Core, Shared, micros};
use crate::error::{Error, Result};
use crate::store::fenced::{CancelRequested, FencedBackend, FencedOp, FencedWrite};
use crate::store::sql;

impl FencedBackend for Core {
    /// One statement per kind of write in the batch (a batch of renewals is
    /// one statement, renewals and deliveries are two), each row fenced on
    /// its own. A statement that fails fails its rows only.
    async fn apply(&self, rows: &[FencedWrite]) -> Result<Vec<Result<CancelRequested>>> {
        let mut results: Vec<Option<Result<CancelRequested>>> = vec![None; rows.len()];
        let mut lost = Vec::new();
        {
            let _write = self.write.lock().await;
            for kind in FencedWrites::KINDS {
                let group: Vec<usize> = (0..rows.len())
                    .filter(|&i| rows[i].op.code() == kind)
                    .collect();
                let Some(&first) = group.first() else {
                    continue;
                };
                let op = rows[first].op;
                let json = fenced_json(group.iter().map(|&i| &rows[i]));
                match self.write_group(op, &json, group.len()).await {
                    Ok(None) => {
                        for &i in &group {
                            results[i] = Some(Ok(false));
                        }
                    }
                    Ok(Some(changed)) => {
                        for &i in &group {
                            match changed.get(&rows[i].id) {
                                Some(&cancel) => results[i] = Some(Ok(cancel)),
                                None => lost.push(i),
                            }
                        }
                    }
                    Err(e) => {
                        let error = Error::store(op.operation(), e);
                        for &i in &group {
                            results[i] = Some(Err(error.clone()));
                        }
                    }
                }
            }
        }
        if !lost.is_empty() {
            let ids: Vec<&str> = lost.iter().map(|&i| rows[i].id.as_str()).collect();
            let json = serde_json::to_string(&ids).expect("ids serialize");
            let fences = Shared::fences(&self.parts, &self.sql.fences, json).await;
            for i in lost {
                results[i] = Some(sql::lost_claim(&rows[i], &fences).map(|()| false));
            }
        }
        Ok(results
            .into_iter()
            .map(|result| result.expect("every row belongs to one kind of write"))
            .collect())
    }
}

/// From how many rows a fenced write is counted rather than returning its
/// ids: each id comes back from SQLite's worker as a row of its own, which
/// past a few rows costs more than the transaction's two extra commands.
pub(super) const COUNTED_FROM: usize = 8;

impl Core {
    /// Apply one kind of write, `op`, to the `count` rows of `json`: `None`
    /// when every row applied (and none carries a cancellation request),
    /// else the ids of the rows that did, each with whether it carries
    /// one.
    async fn write_group(
        &self,
        op: FencedOp,
        json: &str,
        count: usize,
    ) -> sqlx::Result<Option<std::collections::HashMap<String, CancelRequested>>> {
        let mut conn = self.parts.pool.acquire().await?;
        // Only a delivery's answer cannot depend on a cancellation request.
        let counted = matches!(op, FencedOp::Deliver | FencedOp::Delete);
        if counted && count >= COUNTED_FROM {
            // Ids are distinct, so each row changes at most one message: a
            // full count means every row applied. A short one is undone and
            // the write run again, returning which rows it changed.
            let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
            let done = sqlx::query(AssertSqlSafe(self.sql.fenced.counted(op).clone()))
                .bind(json)
                .execute(&mut *tx)
                .await?;
            if usize::try_from(done.rows_affected()) == Ok(count) {
                tx.commit().await?;
                return Ok(None);
            }
            tx.rollback().await?;
        }
        let changed: Vec<(String, CancelRequested)> =
            sqlx::query_as(AssertSqlSafe(self.sql.fenced.get(op).clone()))
                .bind(json)
                .fetch_all(&mut *conn)
                .await?;
        Ok(Some(changed.into_iter().collect()))
    }
}

/// The JSON array of rows a fenced write reads, each `[id, token, now]`
/// (`now` in µs), then what the write sets (the new lease end, or the retry
/// time and the error record). Written straight to text, one row at a time.
fn fenced_json<'a>(rows: impl Iterator<Item = &'a FencedWrite>) -> String {
    let mut json = Vec::with_capacity(128);
    json.push(b'[');
    for (n, row) in rows.enumerate() {
        if n > 0 {
            json.push(b',');
        }
        let fence = (row.id.as_str(), row.claim_token.as_str(), micros(row.now));
        let (id, token, now) = fence;
        let error = row.error.as_deref();
        let written = match row.op {
            FencedOp::Renew { locked_until, .. } => {
                serde_json::to_writer(&mut json, &(id, token, now, micros(locked_until)))
            }
            FencedOp::Retry { available_at } => {
                serde_json::to_writer(&mut json, &(id, token, now, micros(available_at), error))
            }
            FencedOp::DeadLetter => serde_json::to_writer(&mut json, &(id, token, now, error)),
            FencedOp::Deliver | FencedOp::Delete | FencedOp::Release => {
                serde_json::to_writer(&mut json, &fence)
            }
        };
        written.expect("strings and integers serialize");
    }
    json.push(b']');
    String::from_utf8(json).expect("serde_json writes UTF-8")
}
