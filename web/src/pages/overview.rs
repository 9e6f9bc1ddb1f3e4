//! GET `/`: counts per status, claims, the oldest due message, the queues
//! (with their pause and resume buttons), blocked ordering keys and the
//! last hour's activity.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse};
use maud::html;
use outbox::{MessageStatus, OutboxAdmin};

use super::{Shared, now};
use crate::guard::{csrf_field, require_access};
use crate::refusal::Refusal;
use crate::render::{activity_chart, query_value, status_label, time};
use crate::response;

/// Blocked keys listed on the overview; the count covers the rest.
const BLOCKED_SHOWN: usize = 20;

/// The statuses given a card; the settled ones that never need the
/// operator last.
const STATUSES: [MessageStatus; 5] = [
    MessageStatus::Pending,
    MessageStatus::Claimed,
    MessageStatus::DeadLettered,
    MessageStatus::Delivered,
    MessageStatus::Cancelled,
];

/// The overview, reloading itself as often as the configuration says.
pub(crate) async fn page<S: OutboxAdmin>(
    req: HttpRequest,
    dashboard: Shared<S>,
) -> Result<HttpResponse, Refusal> {
    require_access(&req, &dashboard.config)?;
    let now = now();
    let stats = dashboard.store.stats(now).await?;
    let activity = dashboard
        .store
        .activity(now - chrono::Duration::minutes(59))
        .await?;
    let blocked = if stats.blocked_keys > 0 {
        dashboard.store.blocked_keys(BLOCKED_SHOWN).await?
    } else {
        Vec::new()
    };
    let queues = dashboard.store.queues().await?;
    let actions = !dashboard.config.read_only;
    let refresh = dashboard.config.refresh.map(|every| every.as_secs().max(1));
    Ok(response::page(StatusCode::OK, "Overview", refresh, || {
        html! {
            div.cards {
                @for status in STATUSES {
                    div.card id=(format!("count-{}", status.as_str())) {
                        a href=(format!("messages?status={}", status.as_str())) {
                            b { (stats.count(status)) } (status_label(status))
                        }
                    }
                }
            }
            table {
                tr { th { "Oldest due message" } td {
                    @match stats.oldest_due_at {
                        Some(at) => (time(at, now)),
                        None => "none due",
                    }
                } }
                tr { th { "Live claims" } td id="live-claims" { (stats.live_claims) } }
                tr { th { "Expired claims" } td id="expired-claims" {
                    (stats.expired_claims)
                    @if stats.expired_claims > 0 {
                        " " span.muted { "(their workers are gone or stuck; the next claim takes them over)" }
                    }
                } }
                tr { th { "All messages" } td { (stats.total()) } }
                tr { th { "Blocked ordering keys" } td id="blocked-keys" { (stats.blocked_keys) } }
            }
            @if !queues.is_empty() {
                h2 { "Queues" }
                table #queues {
                    tr { th { "Queue" } th { "Pending" } th { "Claimed" } th { "State" } @if actions { th {} } }
                    @for queue in &queues {
                        tr id=(format!("queue-{}", queue.queue)) {
                            td { (queue.queue) }
                            td { (queue.pending) }
                            td { (queue.claimed) }
                            td.state {
                                @match queue.paused_at {
                                    Some(at) => { b.paused { "paused" } " since " (time(at, now)) },
                                    None => "served",
                                }
                            }
                            @if actions {
                                td {
                                    @if queue.is_paused() {
                                        form method="post" action="resume" {
                                            (csrf_field())
                                            input type="hidden" name="queue" value=(queue.queue);
                                            button.resume type="submit" { "Resume" }
                                        }
                                    } @else {
                                        form method="post" action="pause" data-confirm=(format!("Pause queue {}? No drain claims from it until it is resumed.", queue.queue)) {
                                            (csrf_field())
                                            input type="hidden" name="queue" value=(queue.queue);
                                            button.pause type="submit" { "Pause" }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
                p.muted { "A paused queue's running deliveries finish and settle; nothing more is claimed from it, in any process, until it is resumed." }
            }
            @if !blocked.is_empty() {
                h2 { "Blocked ordering keys" }
                p.muted {
                    "Each key waits on a dead letter; requeue it (it runs again) or skip it "
                    "(`outbox skip ID`: the key moves on without it)."
                }
                table #blocked {
                    tr { th { "Key" } th { "Dead letter at its head" } th { "Name" } th { "Waiting" } }
                    @for key in &blocked {
                        tr {
                            td { a href=(format!("messages?key={}", query_value(&key.ordering_key))) { (key.ordering_key) } }
                            td { a href=(format!("message?id={}", query_value(&key.head_id))) { (key.head_id) } }
                            td { (key.head_name) }
                            td { (key.waiting) }
                        }
                    }
                }
                @if stats.blocked_keys > blocked.len() as u64 {
                    p.muted { "The first " (blocked.len()) " of " (stats.blocked_keys) " by key." }
                }
            }
            h2 { "Delivered and dead-lettered per minute" }
            (activity_chart(&activity, now))
            @if let Some(secs) = refresh {
                p.muted { "This page reloads every " (secs) " s." }
            }
        }
    }))
}
