//! The periodic schedules' table (`"<table>_schedules"`, created by the
//! migrations beside the outbox table) as both SQL stores use it: its
//! statements, rendered once per table in the store's dialect, and its rows
//! read back. Each store runs them in a transaction of its own (see its
//! `schedules.rs`), around its own enqueue.

use std::sync::Arc;

use sqlx::{ColumnIndex, Decode, Row, Type};

use super::backend::StoredTime;
use super::migrate::Dialect;
use super::table::TableName;
use crate::error::Result;
use crate::store::schedules::ScheduleState;

/// The columns of a schedule's row, in the order [`state_from`] reads them.
const COLUMNS: &str = "name, expression, time_zone, message_name, created_at, updated_at, \
     last_slot, next_slot, last_enqueued_by, last_enqueued_at, last_message_id";

/// The schedules' statements for one table.
#[derive(Debug)]
pub(crate) struct ScheduleStatements {
    /// Create a schedule, or update its definition and keep its progress;
    /// returns the row. Binds: name, expression, time zone, message name,
    /// now, next slot.
    pub(crate) declare: Arc<str>,
    /// Move `last_slot` to a slot while it is still before it (the row's
    /// lock serializes racing processes), with who and when. Binds: name,
    /// slot, next slot, enqueued by, now, message id.
    pub(crate) advance: Arc<str>,
    /// The schedule's `last_slot`, to tell a slot taken from a schedule
    /// never declared. Binds: name.
    pub(crate) last_slot: Arc<str>,
    /// Correct the message id of the slot just advanced to, when the
    /// enqueue found the slot's message already stored. Binds: name, id.
    pub(crate) message_id: Arc<str>,
    /// Every schedule, by name. Binds nothing.
    pub(crate) list: Arc<str>,
}

impl ScheduleStatements {
    pub(crate) fn new(table: &TableName, dialect: Dialect) -> Self {
        let t = table.derived("schedules", true);
        // SQLite reads `?N` as the N-th bind, PostgreSQL `$N`.
        let p = |n: u8| match dialect {
            Dialect::Sqlite => format!("?{n}"),
            Dialect::Postgres => format!("${n}"),
        };
        let (p1, p2, p3, p4, p5, p6) = (p(1), p(2), p(3), p(4), p(5), p(6));
        ScheduleStatements {
            declare: format!(
                "INSERT INTO {t} (name, expression, time_zone, message_name, created_at, \
                 updated_at, next_slot) VALUES ({p1}, {p2}, {p3}, {p4}, {p5}, {p5}, {p6}) \
                 ON CONFLICT (name) DO UPDATE SET expression = excluded.expression, \
                 time_zone = excluded.time_zone, message_name = excluded.message_name, \
                 next_slot = excluded.next_slot, updated_at = excluded.updated_at \
                 RETURNING {COLUMNS}"
            )
            .into(),
            advance: format!(
                "UPDATE {t} SET last_slot = {p2}, next_slot = {p3}, last_enqueued_by = {p4}, \
                 last_enqueued_at = {p5}, updated_at = {p5}, last_message_id = {p6} \
                 WHERE name = {p1} AND (last_slot IS NULL OR last_slot < {p2})"
            )
            .into(),
            last_slot: format!("SELECT last_slot FROM {t} WHERE name = {p1}").into(),
            message_id: format!("UPDATE {t} SET last_message_id = {p2} WHERE name = {p1}").into(),
            list: format!("SELECT {COLUMNS} FROM {t} ORDER BY name").into(),
        }
    }
}

/// A schedule's row (its [`COLUMNS`], in order) read back; `T` is how the
/// database stores a time.
pub(crate) fn state_from<R, T>(row: &R) -> Result<ScheduleState>
where
    R: Row,
    usize: ColumnIndex<R>,
    T: StoredTime + Type<R::Database> + for<'r> Decode<'r, R::Database>,
    String: Type<R::Database> + for<'r> Decode<'r, R::Database>,
{
    let corrupt = |e: sqlx::Error| crate::error::Error::CorruptRow {
        id: String::new(),
        reason: format!("a schedule's row does not read back: {e}"),
    };
    let text = |i: usize| row.try_get::<String, _>(i).map_err(corrupt);
    let maybe_text = |i: usize| row.try_get::<Option<String>, _>(i).map_err(corrupt);
    let time = |i: usize| row.try_get::<T, _>(i).map_err(corrupt)?.load();
    let maybe_time = |i: usize| {
        row.try_get::<Option<T>, _>(i)
            .map_err(corrupt)?
            .map(StoredTime::load)
            .transpose()
    };
    Ok(ScheduleState {
        name: text(0)?,
        expression: text(1)?,
        time_zone: text(2)?,
        message_name: text(3)?,
        created_at: time(4)?,
        updated_at: time(5)?,
        last_slot: maybe_time(6)?,
        next_slot: maybe_time(7)?,
        last_enqueued_by: maybe_text(8)?,
        last_enqueued_at: maybe_time(9)?,
        last_message_id: maybe_text(10)?,
    })
}

/// The rows of a listing, read back.
pub(crate) fn states_from<R, T>(rows: &[R]) -> Result<Vec<ScheduleState>>
where
    R: Row,
    usize: ColumnIndex<R>,
    T: StoredTime + Type<R::Database> + for<'r> Decode<'r, R::Database>,
    String: Type<R::Database> + for<'r> Decode<'r, R::Database>,
{
    rows.iter().map(state_from::<R, T>).collect()
}
