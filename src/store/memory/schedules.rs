//! The memory store's periodic schedules: a map by name beside the
//! messages, under a lock of its own that a slot's enqueue holds across the
//! insert, so the move of `last_slot` and the message go together.

use std::sync::PoisonError;

use futures_util::future::BoxFuture;

use super::MemoryOutbox;
use crate::error::Result;
use crate::store::schedules::{
    DeclareSchedule, EnqueueSlot, ScheduleState, ScheduleStore, SlotOutcome, check,
};

impl MemoryOutbox {
    fn declare_now(&self, params: DeclareSchedule) -> Result<ScheduleState> {
        check::declare(&params)?;
        let mut schedules = self
            .schedules
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let state = match schedules.remove(&params.name) {
            Some(state) => state.redeclared(&params),
            None => ScheduleState::declared(&params),
        };
        schedules.insert(params.name, state.clone());
        Ok(state)
    }

    fn enqueue_slot_now(&self, params: EnqueueSlot) -> Result<SlotOutcome> {
        check::enqueue_slot(&params)?;
        let mut schedules = self
            .schedules
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let state = schedules
            .get_mut(&params.schedule)
            .ok_or_else(|| check::undeclared(&params.schedule))?;
        if let Some(last_slot) = state.last_slot.filter(|&last| last >= params.slot) {
            return Ok(SlotOutcome::Taken { last_slot });
        }
        let now = params.message.now;
        // Under the schedules' lock: no other slot's enqueue can pass the
        // check above until this one has written both.
        let enqueued = self.enqueue_now(params.message)?;
        state.last_slot = Some(params.slot);
        state.next_slot = params.next_slot;
        state.last_enqueued_by = Some(params.enqueued_by);
        state.last_enqueued_at = Some(now);
        state.last_message_id = Some(enqueued.id().to_owned());
        state.updated_at = now;
        Ok(SlotOutcome::Enqueued(enqueued))
    }

    /// Every schedule, by name.
    pub(super) fn schedules_now(&self) -> Vec<ScheduleState> {
        self.schedules
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect()
    }
}

impl ScheduleStore for MemoryOutbox {
    fn declare_schedule(&self, params: DeclareSchedule) -> BoxFuture<'_, Result<ScheduleState>> {
        Box::pin(std::future::ready(self.declare_now(params)))
    }

    fn enqueue_slot(&self, params: EnqueueSlot) -> BoxFuture<'_, Result<SlotOutcome>> {
        Box::pin(std::future::ready(self.enqueue_slot_now(params)))
    }
}
