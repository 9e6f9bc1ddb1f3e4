//! POST `/requeue`: dead letters by id (one, or those ticked on a list), or
//! every dead letter of a name.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use maud::html;
use outbox::{OutboxAdmin, RequeueDeadLetters};

use super::{Shared, now};
use crate::guard::accept_post;
use crate::refusal::Refusal;
use crate::render::query_value;
use crate::response;

/// Requeues the form's `id`s one by one, each refused on its own (a live
/// claim, not a dead letter) without holding back the others; or, with
/// `all`, every dead letter of the form's `name` (of every name without
/// one).
pub(crate) async fn action<S: OutboxAdmin>(
    req: HttpRequest,
    dashboard: Shared<S>,
    body: web::Bytes,
) -> Result<HttpResponse, Refusal> {
    let form = accept_post(&req, &dashboard.config, &body)?;
    let now = now();
    let ids = form.all("id");
    if form.field("all").is_some() {
        if !ids.is_empty() {
            return Err(Refusal::BadForm(
                "give either ids or `all`, not both; nothing was changed".to_owned(),
            ));
        }
        let name = form.field("name").map(str::to_owned);
        let params = RequeueDeadLetters {
            id: None,
            name: name.clone(),
            now,
        };
        let requeued = dashboard.store.requeue_dead_letters(params).await?;
        return Ok(response::done(match name {
            Some(name) => format!("Requeued {requeued} dead letter(s) named {name:?}."),
            None => format!("Requeued {requeued} dead letter(s)."),
        }));
    }
    if ids.is_empty() {
        return Err(Refusal::BadForm(
            "no dead letter was selected; tick at least one, or requeue all of a name".to_owned(),
        ));
    }
    let mut requeued = Vec::new();
    let mut refused = Vec::new();
    for id in ids {
        let params = RequeueDeadLetters {
            id: Some(id.to_owned()),
            name: None,
            now,
        };
        match dashboard.store.requeue_dead_letters(params).await {
            Ok(_) => requeued.push(id.to_owned()),
            Err(e) => refused.push(e.to_string()),
        }
    }
    let status = if requeued.is_empty() {
        StatusCode::CONFLICT
    } else {
        StatusCode::OK
    };
    Ok(response::page(status, "Requeue", None, || {
        html! {
            @if !requeued.is_empty() {
                p.notice #done { "Requeued " (requeued.len()) " dead letter(s): "
                    @for (i, id) in requeued.iter().enumerate() {
                        @if i > 0 { ", " }
                        a href=(format!("message?id={}", query_value(id))) { (id) }
                    }
                }
            }
            @for why in &refused { p.refused { (why) } }
            p { a href="./" { "Back to the overview" } " · " a href="messages?status=dead_lettered" { "Dead letters" } }
        }
    }))
}
