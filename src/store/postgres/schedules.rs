//! The PostgreSQL store's periodic schedules: a slot's enqueue is one
//! transaction that first moves the schedule's `last_slot` (taking the
//! schedule row's lock) and then inserts the slot's message. Processes due
//! at the same slot queue on that lock; once the first commits, the others'
//! update finds `last_slot` already at the slot and matches nothing, so they
//! write nothing.

use futures_util::future::BoxFuture;
use sqlx::{AssertSqlSafe, Row};

use super::PostgresOutbox;
use crate::error::Result;
use crate::message::Enqueued;
use crate::store::schedules::{
    DeclareSchedule, EnqueueSlot, ScheduleState, ScheduleStore, SlotOutcome, check,
};
use crate::store::sql::{db, state_from, states_from};

type Time = crate::store::sql::PgTime;

impl PostgresOutbox {
    async fn declare_now(&self, params: DeclareSchedule) -> Result<ScheduleState> {
        check::declare(&params)?;
        let core = &self.inner.core;
        let row = sqlx::query(AssertSqlSafe(core.schedules.declare.clone()))
            .bind(&params.name)
            .bind(&params.expression)
            .bind(&params.time_zone)
            .bind(&params.message_name)
            .bind(params.now)
            .bind(params.next_slot)
            .fetch_one(&core.parts.pool)
            .await
            .map_err(db("declare_schedule"))?;
        state_from::<_, Time>(&row)
    }

    async fn enqueue_slot_now(&self, params: EnqueueSlot) -> Result<SlotOutcome> {
        check::enqueue_slot(&params)?;
        let core = &self.inner.core;
        let mut message = params.message;
        let id = message.resolve_id();
        message.id = Some(id.clone());
        let now = message.now;
        let mut tx = core.parts.pool.begin().await.map_err(db("enqueue_slot"))?;
        let advanced = sqlx::query(AssertSqlSafe(core.schedules.advance.clone()))
            .bind(&params.schedule)
            .bind(params.slot)
            .bind(params.next_slot)
            .bind(&params.enqueued_by)
            .bind(now)
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
                    .try_get::<Option<Time>, _>(0)
                    .map_err(db("enqueue_slot"))?
                    .map(|at| at.0),
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
        states_from::<_, Time>(&rows)
    }
}

impl ScheduleStore for PostgresOutbox {
    fn declare_schedule(&self, params: DeclareSchedule) -> BoxFuture<'_, Result<ScheduleState>> {
        Box::pin(self.declare_now(params))
    }

    fn enqueue_slot(&self, params: EnqueueSlot) -> BoxFuture<'_, Result<SlotOutcome>> {
        Box::pin(self.enqueue_slot_now(params))
    }
}
