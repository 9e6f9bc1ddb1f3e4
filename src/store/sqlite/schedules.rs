//! The SQLite store's periodic schedules: a slot's enqueue is one immediate
//! transaction that moves the schedule's `last_slot` and inserts the slot's
//! message, so of several processes on one database file exactly one
//! writes each slot.

use futures_util::future::BoxFuture;
use sqlx::{AssertSqlSafe, Connection, Row};

use super::{SqliteOutbox, micros};
use crate::error::Result;
use crate::message::Enqueued;
use crate::store::schedules::{
    DeclareSchedule, EnqueueSlot, ScheduleState, ScheduleStore, SlotOutcome, check,
};
use crate::store::sql::{StoredTime, db, state_from, states_from};

impl SqliteOutbox {
    async fn declare_now(&self, params: DeclareSchedule) -> Result<ScheduleState> {
        check::declare(&params)?;
        let core = &self.inner.core;
        let _write = core.write.lock().await;
        let row = sqlx::query(AssertSqlSafe(core.schedules.declare.clone()))
            .bind(&params.name)
            .bind(&params.expression)
            .bind(&params.time_zone)
            .bind(&params.message_name)
            .bind(micros(params.now))
            .bind(params.next_slot.map(micros))
            .fetch_one(&core.parts.pool)
            .await
            .map_err(db("declare_schedule"))?;
        state_from::<_, i64>(&row)
    }

    async fn enqueue_slot_now(&self, params: EnqueueSlot) -> Result<SlotOutcome> {
        check::enqueue_slot(&params)?;
        let core = &self.inner.core;
        let mut message = params.message;
        let id = message.resolve_id();
        message.id = Some(id.clone());
        let now = message.now;
        let _write = core.write.lock().await;
        let mut conn = core
            .parts
            .pool
            .acquire()
            .await
            .map_err(db("enqueue_slot"))?;
        // The write lock from the first statement on: two processes on one
        // file cannot both read `last_slot` as behind the slot.
        let mut tx = conn
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(db("enqueue_slot"))?;
        let advanced = sqlx::query(AssertSqlSafe(core.schedules.advance.clone()))
            .bind(&params.schedule)
            .bind(micros(params.slot))
            .bind(params.next_slot.map(micros))
            .bind(&params.enqueued_by)
            .bind(micros(now))
            .bind(&id)
            .execute(&mut *tx)
            .await
            .map_err(db("enqueue_slot"))?
            .rows_affected();
        if advanced == 0 {
            let found = sqlx::query(AssertSqlSafe(core.schedules.last_slot.clone()))
                .bind(&params.schedule)
                .fetch_optional(&mut *tx)
                .await
                .map_err(db("enqueue_slot"))?;
            let last_slot = match found {
                None => return Err(check::undeclared(&params.schedule)),
                Some(row) => row
                    .try_get::<Option<i64>, _>(0)
                    .map_err(db("enqueue_slot"))?
                    .map(StoredTime::load)
                    .transpose()?,
            };
            // Not advanced, so a slot at or before it exists.
            return Ok(SlotOutcome::Taken {
                last_slot: last_slot.unwrap_or(params.slot),
            });
        }
        let enqueued = self.enqueue_in(&mut tx, message).await?;
        if let Enqueued::AlreadyExists(holder) = &enqueued
            && *holder != id
        {
            sqlx::query(AssertSqlSafe(core.schedules.message_id.clone()))
                .bind(&params.schedule)
                .bind(holder)
                .execute(&mut *tx)
                .await
                .map_err(db("enqueue_slot"))?;
        }
        tx.commit().await.map_err(db("enqueue_slot"))?;
        Ok(SlotOutcome::Enqueued(enqueued))
    }

    pub(super) async fn schedules_now(&self) -> Result<Vec<ScheduleState>> {
        let core = &self.inner.core;
        let rows = sqlx::query(AssertSqlSafe(core.schedules.list.clone()))
            .fetch_all(&core.parts.pool)
            .await
            .map_err(db("list_schedules"))?;
        states_from::<_, i64>(&rows)
    }
}

impl ScheduleStore for SqliteOutbox {
    fn declare_schedule(&self, params: DeclareSchedule) -> BoxFuture<'_, Result<ScheduleState>> {
        Box::pin(self.declare_now(params))
    }

    fn enqueue_slot(&self, params: EnqueueSlot) -> BoxFuture<'_, Result<SlotOutcome>> {
        Box::pin(self.enqueue_slot_now(params))
    }
}
