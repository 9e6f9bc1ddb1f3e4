//! GET `/message?id=…`: every field of one message, and the actions that
//! apply to it.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use maud::html;
use outbox::{Error, MessageStatus, OutboxAdmin, UnreadableMessage};

use super::{Shared, now};
use crate::guard::{csrf_field, require_access};
use crate::refusal::Refusal;
use crate::render::{self, query_value, status_label, time};
use crate::response;

/// The query of the message page.
#[derive(Debug, serde::Deserialize)]
pub(crate) struct MessageQuery {
    id: String,
}

/// The message's fields, payload, last error and trace; the requeue or
/// retry form when the message takes one and no claim on it is live.
pub(crate) async fn page<S: OutboxAdmin>(
    req: HttpRequest,
    dashboard: Shared<S>,
    query: web::Query<MessageQuery>,
) -> Result<HttpResponse, Refusal> {
    require_access(&req, &dashboard.config)?;
    let message = match dashboard.store.get_message(&query.id).await {
        // A row that does not decode is still shown, so it can be repaired.
        Err(Error::Unreadable(row)) => return Ok(unreadable_page(&row)),
        found => found?,
    };
    let now = now();
    let live = message.has_live_claim(now);
    let show_actions = !dashboard.config.read_only;
    Ok(response::page(
        StatusCode::OK,
        &format!("Message {}", message.id),
        None,
        || {
            html! {
                table #fields {
                    tr { th { "Id" } td { (message.id) } }
                    tr { th { "Kind" } td { (message.kind) } }
                    tr { th { "Name" } td { (message.name) } }
                    tr { th { "Status" } td #status { (message.status) } }
                    tr { th { "Queue" } td #queue { (message.queue) } }
                    tr { th { "Priority" } td #priority { (message.priority) } }
                    @if let Some(at) = message.cancel_requested_at {
                        tr { th { "Cancel requested" } td #cancel-requested { (time(at, now)) } }
                    }
                    tr { th { "Attempts" } td {
                        (message.attempts) " of " (message.effective_max_attempts(dashboard.config.max_attempts))
                        @if !message.max_attempts_set { " " span.muted { "(the drain's cap)" } }
                    } }
                    @if let Some(key) = &message.ordering_key {
                        tr { th { "Ordering key" } td {
                            a href=(format!("messages?key={}", query_value(key))) { (key) }
                            @if message.skipped_at.is_some() { " " span.muted { "(skipped: its key moved on)" } }
                        } }
                    }
                    tr { th { "Available at" } td { (time(message.available_at, now)) } }
                    tr { th { "Created at" } td { (time(message.created_at, now)) } }
                    tr { th { "Updated at" } td { (time(message.updated_at, now)) } }
                    tr { th { "Delivered at" } td { @if let Some(at) = message.delivered_at { (time(at, now)) } @else { "—" } } }
                    tr { th { "Claimed at" } td { @if let Some(at) = message.claimed_at { (time(at, now)) } @else { "—" } } }
                    tr { th { "Locked until" } td {
                        @if let Some(at) = message.locked_until {
                            (time(at, now)) " " (if live { "(live claim)" } else { "(expired)" })
                        } @else { "—" }
                    } }
                    tr { th { "Trace" } td {
                        @if let Some(trace) = &message.trace {
                            @if let Some(id) = render::trace_id(&trace.traceparent) {
                                "trace id " code #trace-id { (id) } br;
                            }
                            "traceparent " code { (trace.traceparent) }
                            @if let Some(state) = &trace.tracestate { br; "tracestate " code { (state) } }
                        } @else { "—" }
                    } }
                }
                h2 { "Payload" }
                pre #payload { (render::pretty_payload(&message)) }
                h2 { "Last error" }
                @if let Some(error) = &message.last_error {
                    p { code { (error.type_name) } }
                    pre #last-error { (error.message) }
                    @if !error.causes.is_empty() {
                        p { "Caused by:" }
                        ol #causes { @for cause in &error.causes { li { pre { (cause) } } } }
                    }
                    @if error.truncated { p.muted { "(cut to fit the stored size bound)" } }
                } @else { p { "none" } }
                @if show_actions && !live {
                    @if message.status == MessageStatus::DeadLettered {
                        form method="post" action="requeue" data-confirm="Requeue this dead letter? It becomes pending with its attempts reset." {
                            (csrf_field())
                            input type="hidden" name="id" value=(message.id);
                            button #requeue type="submit" { "Requeue" }
                        }
                    }
                    @if message.status == MessageStatus::Pending {
                        form method="post" action="retry" data-confirm="Make this message due now?" {
                            (csrf_field())
                            input type="hidden" name="id" value=(message.id);
                            button #retry type="submit" { "Retry now" }
                        }
                    }
                }
                @if show_actions && matches!(message.status, MessageStatus::Pending | MessageStatus::Claimed) && message.cancel_requested_at.is_none() {
                    form method="post" action="cancel" data-confirm=(if live {
                        "Cancel this message? It is being delivered: its handler is told, and it ends cancelled unless the handler succeeds."
                    } else {
                        "Cancel this message? It will not be delivered."
                    }) {
                        (csrf_field())
                        input type="hidden" name="id" value=(message.id);
                        button #cancel type="submit" { "Cancel" }
                    }
                }
                p { a href=(format!("messages?status={}", message.status.as_str())) { "All " (status_label(message.status)) " messages" } }
            }
        },
    ))
}

/// A row the store could not read back as a message: why, and its columns
/// as stored.
fn unreadable_page(row: &UnreadableMessage) -> HttpResponse {
    response::page(
        StatusCode::OK,
        &format!("Message {} (unreadable)", row.id),
        None,
        || {
            html! {
                p.refused { "This row does not read back as a message: " (row.reason) }
                table { @for (column, value) in &row.columns {
                    tr { th { (column) } td { pre { (value.as_deref().unwrap_or("NULL")) } } }
                } }
            }
        },
    )
}
