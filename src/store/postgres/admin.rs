//! The PostgreSQL store's own part of the operator path: listing. The rest
//! of it (stats, requeue, purge, inspect) is shared with SQLite.

use sqlx::AssertSqlSafe;

use super::statements::columns;
use super::{Core, Shared};
use crate::error::Result;
use crate::store::kit::check;
use crate::store::sql::activity_rows;
use crate::store::sql::db;
use crate::store::{ListMessages, MessagePage, MessageStatus, MinuteActivity};
use chrono::{DateTime, Utc};

impl Core {
    /// One page of messages. Only the filters that apply are bound,
    /// numbered in order.
    ///
    /// The listing index leaves claimed rows out (migration 0011), so a page
    /// is read in up to two arms, each in listing order: unclaimed rows from
    /// that index, claimed rows from theirs; the page is the first rows of
    /// both.
    pub(super) async fn list(&self, params: ListMessages) -> Result<MessagePage> {
        check::list(&params)?;
        let mut filters = String::new();
        let mut n = 0;
        let mut next_param = || {
            n += 1;
            n
        };
        if params.status.is_some() {
            filters.push_str(&format!(" AND status = ${}", next_param()));
        }
        if params.name.is_some() {
            filters.push_str(&format!(" AND name = ${}", next_param()));
        }
        if params.after.is_some() {
            let (a, b) = (next_param(), next_param());
            filters.push_str(&format!(" AND (created_at, id) > (${a}, ${b})"));
        }
        let order = format!("ORDER BY created_at, id LIMIT ${}", next_param());
        let arm = |status: &str| {
            format!(
                "SELECT {} FROM {} WHERE {status}{filters} {order}",
                columns(""),
                self.parts.shared.table
            )
        };
        let (unclaimed, claimed) = (arm("status <> 'claimed'"), arm("status = 'claimed'"));
        let query = match params.status {
            Some(MessageStatus::Claimed) => claimed,
            Some(_) => unclaimed,
            None => format!("SELECT * FROM (({unclaimed}) UNION ALL ({claimed})) AS page {order}"),
        };
        let mut q = sqlx::query(AssertSqlSafe(query));
        if let Some(status) = params.status {
            q = q.bind(status.as_str());
        }
        if let Some(name) = &params.name {
            q = q.bind(name.as_str());
        }
        if let Some(after) = &params.after {
            q = q.bind(after.created_at).bind(after.id.as_str());
        }
        let rows = q
            .bind(i64::try_from(params.limit).unwrap_or(i64::MAX) + 1)
            .fetch_all(&self.parts.pool)
            .await
            .map_err(db("list_messages"))?;
        Shared::page(&rows, params.limit)
    }

    /// Delivered and dead-lettered per minute since `since`, from the
    /// index of settled rows.
    pub(super) async fn activity(&self, since: DateTime<Utc>) -> Result<Vec<MinuteActivity>> {
        let query = format!(
            "SELECT status, floor(extract(epoch FROM updated_at) / 60)::bigint AS minute, count(*) \
             FROM {} WHERE status IN ('delivered', 'dead_lettered') AND updated_at >= $1 \
             GROUP BY status, minute",
            self.parts.shared.table
        );
        let rows: Vec<(String, i64, i64)> = sqlx::query_as(AssertSqlSafe(query))
            .bind(since)
            .fetch_all(&self.parts.pool)
            .await
            .map_err(db("activity"))?;
        activity_rows(rows)
    }

    /// Makes a pending message due: never later than it already was.
    pub(super) fn retry_statement(&self) -> String {
        format!(
            "UPDATE {} SET \
               available_at = LEAST(available_at, coalesce($2::timestamptz, statement_timestamp())), \
               updated_at = coalesce($2::timestamptz, statement_timestamp()) \
             WHERE id = $1 AND status = 'pending'",
            self.parts.shared.table
        )
    }
}
