//! The PostgreSQL store's fenced writes: a batch of renewals and
//! settlements in one call of the table's `settle` function, and, for the
//! rows it did not change, why their claims were lost.

use chrono::{DateTime, Utc};
use sqlx::AssertSqlSafe;

use super::{Core, Shared};
use crate::error::Result;
use crate::store::fenced::{CancelRequested, FencedBackend, FencedOp, FencedWrite};
use crate::store::sql::{self, db};

impl Core {
    /// The server's time, when the store judges leases by it, to name why
    /// a fenced write missed; `None` on the caller's clock, or when it
    /// cannot be read (the reason is then judged on the caller's clock).
    async fn server_now(&self) -> Option<DateTime<Utc>> {
        if !self.server_clock {
            return None;
        }
        sqlx::query_scalar("SELECT statement_timestamp()")
            .fetch_one(&self.parts.pool)
            .await
            .ok()
    }

    /// A batch of fenced writes; `deletions_only` when every row is a
    /// deletion, which then sends no ops and none of the columns they would
    /// write (where delivered messages are deleted, most batches are).
    pub(super) fn settle<'q>(
        &self,
        rows: &'q [FencedWrite],
        deletions_only: bool,
    ) -> sqlx::query::QueryAs<'q, sqlx::Postgres, (String, String), sqlx::postgres::PgArguments>
    {
        let mut ids = Vec::with_capacity(rows.len());
        let mut tokens = Vec::with_capacity(rows.len());
        let mut nows = Vec::with_capacity(rows.len());
        for row in rows {
            ids.push(row.id.as_str());
            tokens.push(row.claim_token.as_str());
            nows.push(self.bound_now(row.now));
        }
        let (mut ops, mut leases, mut availables, mut errors) = (None, None, None, None);
        if !deletions_only {
            ops = Some(rows.iter().map(|row| row.op.code()).collect::<Vec<_>>());
            leases = Some(
                rows.iter()
                    .map(|row| row.op.lease_micros())
                    .collect::<Vec<_>>(),
            );
            availables = Some(
                rows.iter()
                    .map(|row| row.op.available_at())
                    .collect::<Vec<_>>(),
            );
            errors = Some(
                rows.iter()
                    .map(|row| row.error.as_deref())
                    .collect::<Vec<_>>(),
            );
        }
        sqlx::query_as(AssertSqlSafe(self.sql.settle.clone()))
            .bind(ops)
            .bind(ids)
            .bind(tokens)
            .bind(nows)
            .bind(leases)
            .bind(availables)
            .bind(errors)
    }
}

impl FencedBackend for Core {
    async fn apply(&self, rows: &[FencedWrite]) -> Result<Vec<Result<CancelRequested>>> {
        let deletions_only = rows.iter().all(|row| row.op == FencedOp::Delete);
        let marked = self
            .settle(rows, deletions_only)
            .fetch_all(&self.parts.pool)
            .await
            .map_err(db("settle"))?;
        if marked.is_empty() {
            return Ok(rows.iter().map(|_| Ok(false)).collect());
        }
        let mut lost = Vec::new();
        let mut cancel = std::collections::HashSet::new();
        for (id, outcome) in marked {
            if outcome == "cancel" {
                cancel.insert(id);
            } else {
                lost.push(id);
            }
        }
        if lost.is_empty() {
            return Ok(rows
                .iter()
                .map(|row| Ok(cancel.contains(&row.id)))
                .collect());
        }
        let lost_ids: std::collections::HashSet<String> = lost.iter().cloned().collect();
        let fences = Shared::fences(&self.parts, &self.sql.fences, lost).await;
        let server_now = self.server_now().await;
        Ok(rows
            .iter()
            .map(|row| {
                if !lost_ids.contains(&row.id) {
                    return Ok(cancel.contains(&row.id));
                }
                match server_now {
                    // The write judged the lease by the server's clock:
                    // name the reason the same way, with the lease moved
                    // onto the writer's clock.
                    Some(server_now) => {
                        let mut fences = fences.clone();
                        if let Some((_, _, Some(until))) = fences.get_mut(&row.id) {
                            *until = row.now + (*until - server_now);
                        }
                        sql::lost_claim(row, &fences).map(|()| false)
                    }
                    None => sql::lost_claim(row, &fences).map(|()| false),
                }
            })
            .collect())
    }
}
