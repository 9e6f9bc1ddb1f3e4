//! `/purge`: the form and its dry run (GET), and the purge itself (POST).
//! The POST carries the horizon the dry run counted with, so it deletes the
//! messages the operator saw counted, not those of a later `now`.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use chrono::{DateTime, SecondsFormat, Utc};
use maud::html;
use outbox::{MessageStatus, OutboxAdmin, PurgeMessages};

use super::{Shared, now};
use crate::guard::{accept_post, csrf_field, require_access};
use crate::input::{non_blank, parse_time};
use crate::refusal::Refusal;
use crate::render::time;
use crate::response;

/// The purge form's fields.
#[derive(Debug, Default, serde::Deserialize)]
pub(crate) struct PurgeQuery {
    older_than: Option<String>,
    status: Option<String>,
}

/// `delivered`, `dead_lettered`, `cancelled`, or all three (`None`, asked
/// for as `both`, the name the form gave it before cancelled messages
/// existed), from a form value.
fn purged_status(text: Option<&str>) -> Result<Option<MessageStatus>, String> {
    match text.unwrap_or("both") {
        "both" => Ok(None),
        "delivered" => Ok(Some(MessageStatus::Delivered)),
        "dead_lettered" => Ok(Some(MessageStatus::DeadLettered)),
        "cancelled" => Ok(Some(MessageStatus::Cancelled)),
        other => Err(format!(
            "`status` is {other:?}: only delivered, dead_lettered, cancelled or both (all \
             three) can be purged"
        )),
    }
}

/// `now - older_than`, for a human duration such as `7d` or `12h`.
fn horizon(older_than: &str) -> Result<DateTime<Utc>, String> {
    let span = humantime::parse_duration(older_than).map_err(|e| {
        format!("`older than` is {older_than:?}, which is not a duration ({e}): give one such as 7d or 12h")
    })?;
    let span = chrono::Duration::from_std(span)
        .map_err(|_| format!("`older than` is {older_than:?}, which is too long"))?;
    now().checked_sub_signed(span).ok_or_else(|| {
        format!("`older than` is {older_than:?}, which reaches before the calendar starts")
    })
}

/// The form; once it is sent (it has `older_than`), also how many messages
/// it would delete and, on a writable dashboard, the confirmation.
pub(crate) async fn page<S: OutboxAdmin>(
    req: HttpRequest,
    dashboard: Shared<S>,
    query: web::Query<PurgeQuery>,
) -> Result<HttpResponse, Refusal> {
    require_access(&req, &dashboard.config)?;
    let older_than = non_blank(&query.older_than).unwrap_or("30d").to_owned();
    let status_text = non_blank(&query.status).unwrap_or("both").to_owned();
    let mut counted = None;
    if query.older_than.is_some() {
        let status = purged_status(Some(&status_text)).map_err(Refusal::BadPurge)?;
        let horizon = horizon(&older_than).map_err(Refusal::BadPurge)?;
        let params = PurgeMessages {
            status,
            older_than: horizon,
        };
        counted = Some((dashboard.store.count_purgeable(params).await?, horizon));
    }
    let show_actions = !dashboard.config.read_only;
    let now = now();
    Ok(response::page(
        StatusCode::OK,
        "Purge settled messages",
        None,
        || {
            html! {
                p { "Deletes delivered, dead-lettered and cancelled messages whose last change is older than the horizon. Pending and claimed messages are never purged." }
                form method="get" action="purge" {
                    label { "Older than " input type="text" name="older_than" value=(older_than); } " "
                    label { "Status " select name="status" {
                        option value="both" selected[status_text == "both"] { "delivered, dead-lettered and cancelled" }
                        option value="delivered" selected[status_text == "delivered"] { "delivered" }
                        option value="dead_lettered" selected[status_text == "dead_lettered"] { "dead-lettered" }
                        option value="cancelled" selected[status_text == "cancelled"] { "cancelled" }
                    } } " "
                    button type="submit" { "Count (dry run)" }
                }
                @if let Some((n, horizon)) = counted {
                    p.notice #count { (n) " message(s) last changed before " (time(horizon, now)) " would be purged." }
                    @if show_actions && n > 0 {
                        form method="post" action="purge"
                            data-confirm=(format!("Delete {n} message(s) for good? This cannot be undone.")) {
                            (csrf_field())
                            input type="hidden" name="status" value=(status_text);
                            input type="hidden" name="horizon" value=(horizon.to_rfc3339_opts(SecondsFormat::AutoSi, true));
                            button #purge type="submit" { "Purge" }
                        }
                    }
                }
            }
        },
    ))
}

/// Deletes what the dry run counted, by the form's `status` and `horizon`.
pub(crate) async fn action<S: OutboxAdmin>(
    req: HttpRequest,
    dashboard: Shared<S>,
    body: web::Bytes,
) -> Result<HttpResponse, Refusal> {
    let form = accept_post(&req, &dashboard.config, &body)?;
    let status = purged_status(form.field("status")).map_err(Refusal::BadPurge)?;
    let horizon = form.field("horizon").ok_or_else(|| {
        Refusal::BadPurge(
            "the form has no `horizon`; count first on the purge page; nothing was changed"
                .to_owned(),
        )
    })?;
    let horizon = parse_time("horizon", horizon).map_err(Refusal::BadPurge)?;
    let params = PurgeMessages {
        status,
        older_than: horizon,
    };
    let purged = dashboard.store.purge(params).await?;
    Ok(response::done(format!(
        "Purged {purged} message(s) last changed before {}.",
        horizon.to_rfc3339_opts(SecondsFormat::Millis, true)
    )))
}
