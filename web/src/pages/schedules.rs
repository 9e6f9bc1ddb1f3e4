//! GET `/schedules`: the periodic schedules of the outbox, as the store
//! keeps them: cadence, zone, message, the last slot (when, by which
//! process, its message) and the next.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse};
use chrono::{DateTime, Utc};
use maud::{Markup, html};
use outbox::OutboxAdmin;

use super::{Shared, now};
use crate::guard::require_access;
use crate::refusal::Refusal;
use crate::render::{query_value, time};
use crate::response;

/// How late a next slot may be before the page says no process seems to
/// run the schedule: slots are enqueued as they fall due.
const OVERDUE_AFTER: chrono::Duration = chrono::Duration::minutes(1);

/// Every schedule, by name.
pub(crate) async fn page<S: OutboxAdmin>(
    req: HttpRequest,
    dashboard: Shared<S>,
) -> Result<HttpResponse, Refusal> {
    require_access(&req, &dashboard.config)?;
    let now = now();
    let schedules = dashboard.store.list_schedules().await?;
    let when = |at: Option<DateTime<Utc>>| -> Markup {
        match at {
            Some(at) => time(at, now),
            None => html! { span.muted { "none yet" } },
        }
    };
    Ok(response::page(StatusCode::OK, "Schedules", None, || {
        html! {
            @if schedules.is_empty() {
                p.muted {
                    "No periodic schedule. A drain declares its schedules here when it starts "
                    "(`Schedule::cron` or `Schedule::every` on the coordinator's builder)."
                }
            } @else {
                p.muted {
                    "Each slot is enqueued once, by whichever process running the schedule "
                    "gets there first."
                }
                table #schedules {
                    tr {
                        th { "Name" } th { "Cadence" } th { "Zone" } th { "Message" }
                        th { "Last slot" } th { "Next slot" } th { "Last enqueued by" }
                    }
                    @for schedule in &schedules {
                        tr id=(format!("schedule-{}", schedule.name)) {
                            td { (schedule.name) }
                            td { code { (schedule.expression) } }
                            td { (schedule.time_zone) }
                            td {
                                a href=(format!("messages?name={}", query_value(&schedule.message_name))) {
                                    (schedule.message_name)
                                }
                            }
                            td {
                                (when(schedule.last_slot))
                                @if let Some(id) = &schedule.last_message_id {
                                    br;
                                    a href=(format!("message?id={}", query_value(id))) { "its message" }
                                }
                            }
                            td {
                                (when(schedule.next_slot))
                                @if schedule.next_slot.is_some_and(|next| next + OVERDUE_AFTER < now) {
                                    br;
                                    span.overdue { "overdue: is a drain running with this schedule?" }
                                }
                            }
                            td {
                                @match &schedule.last_enqueued_by {
                                    Some(by) => {
                                        (by)
                                        @if let Some(at) = schedule.last_enqueued_at {
                                            br; span.muted { "at " (time(at, now)) }
                                        }
                                    }
                                    None => span.muted { "-" },
                                }
                            }
                        }
                    }
                }
            }
        }
    }))
}
