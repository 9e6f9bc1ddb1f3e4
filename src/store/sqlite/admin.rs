//! The SQLite store's own part of the operator path: listing. The rest of
//! it (stats, requeue, purge, inspect) is shared with PostgreSQL.

use sqlx::AssertSqlSafe;

use super::statements::COLUMNS;
use super::{Core, Shared, micros};
use crate::error::Result;
use crate::kind::MessageStatus;
use crate::store::kit::check;
use crate::store::sql::activity_rows;
use crate::store::sql::db;
use crate::store::{ListMessages, MessagePage, MinuteActivity};
use chrono::{DateTime, Utc};

impl Core {
    /// One page of messages. Every filter is bound, as NULL when unset, so
    /// the statement text only says which filters apply.
    pub(super) async fn list(&self, params: ListMessages) -> Result<MessagePage> {
        check::list(&params)?;
        let mut query = format!(
            "SELECT {COLUMNS} FROM {} WHERE 1 = 1",
            self.parts.shared.table
        );
        if params.status.is_some() {
            query.push_str(" AND status = ?1");
        }
        if params.name.is_some() {
            query.push_str(" AND name = ?2");
        }
        if params.after.is_some() {
            query.push_str(" AND (created_at, id) > (?3, ?4)");
        }
        // A cast, not a bare `?5`, so the page size does not make SQLite
        // compile the statement again on every call (see the claim's limits).
        query.push_str(" ORDER BY created_at, id LIMIT CAST(?5 AS INTEGER)");
        let rows = sqlx::query(AssertSqlSafe(query))
            .bind(params.status.map(MessageStatus::as_str))
            .bind(params.name.as_deref())
            .bind(params.after.as_ref().map(|c| micros(c.created_at)))
            .bind(params.after.as_ref().map(|c| c.id.as_str()))
            .bind(i64::try_from(params.limit).unwrap_or(i64::MAX) + 1)
            .fetch_all(&self.parts.pool)
            .await
            .map_err(db("list_messages"))?;
        Shared::page(&rows, params.limit)
    }

    /// Delivered and dead-lettered per minute since `since`, from the
    /// index of settled rows; times are stored in microseconds.
    pub(super) async fn activity(&self, since: DateTime<Utc>) -> Result<Vec<MinuteActivity>> {
        let query = format!(
            "SELECT status, updated_at / 60000000 AS minute, count(*) FROM {} \
             WHERE status IN ('delivered', 'dead_lettered') AND updated_at >= ?1 \
             GROUP BY status, minute",
            self.parts.shared.table
        );
        let rows: Vec<(String, i64, i64)> = sqlx::query_as(AssertSqlSafe(query))
            .bind(micros(since))
            .fetch_all(&self.parts.pool)
            .await
            .map_err(db("activity"))?;
        activity_rows(rows)
    }

    /// Makes a pending message due: never later than it already was.
    pub(super) fn retry_statement(&self) -> String {
        format!(
            "UPDATE {} SET available_at = min(available_at, ?2), updated_at = ?2 \
             WHERE id = ?1 AND status = 'pending'",
            self.parts.shared.table
        )
    }
}
