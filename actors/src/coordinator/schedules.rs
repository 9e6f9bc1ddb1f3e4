//! The coordinator's periodic schedules: each runs as a future of the
//! coordinator's, started with it and dropped at its shutdown, and
//! [`GetSchedules`] answers what this process did for each.

use actix::prelude::*;

use super::DrainCoordinator;
use crate::schedule::ScheduleStatus;

/// Ask what this process did for each of its periodic schedules: slots
/// enqueued, slots another process had already enqueued, failures, the
/// last slot it knows and the next one it waits for. Answers in the order
/// the schedules were given to the builder.
#[derive(Debug, Clone, Copy, Default, Message)]
#[rtype(result = "Vec<ScheduleStatus>")]
pub struct GetSchedules;

impl DrainCoordinator {
    /// Start one future per schedule, cancelled with the other background
    /// work at shutdown.
    pub(super) fn start_schedules(&mut self, ctx: &mut Context<Self>) {
        for runner in &self.schedules {
            let run = runner.clone().run(self.drain.clone());
            self.background.push(ctx.spawn(run.into_actor(self)));
        }
    }
}

impl Handler<GetSchedules> for DrainCoordinator {
    type Result = MessageResult<GetSchedules>;

    fn handle(&mut self, _: GetSchedules, _: &mut Context<Self>) -> Self::Result {
        MessageResult(
            self.schedules
                .iter()
                .map(|runner| runner.status())
                .collect(),
        )
    }
}
