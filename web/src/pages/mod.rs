//! One file per page, each with its handlers: a GET handler is `page`, a
//! POST handler `action`. Every handler passes the guard first.

use actix_web::web;
use chrono::{DateTime, Utc};

use crate::Dashboard;

pub(crate) mod message;
pub(crate) mod messages;
pub(crate) mod not_found;
pub(crate) mod overview;
pub(crate) mod purge;
pub(crate) mod queues;
pub(crate) mod requeue;
pub(crate) mod retry;
pub(crate) mod schedules;

/// What every handler is given: the dashboard it serves.
type Shared<S> = web::Data<Dashboard<S>>;

/// The time a page is rendered at, which its times are shown against and
/// its actions are stamped with.
fn now() -> DateTime<Utc> {
    Utc::now()
}
