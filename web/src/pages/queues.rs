//! POST `/pause` and `/resume`: a queue, by the form's `queue`; POST
//! `/cancel`: a message, by the form's `id`.

use actix_web::{HttpRequest, HttpResponse, web};
use outbox::{CancelMessages, OutboxAdmin, PauseQueue};

use super::{Shared, now};
use crate::guard::accept_post;
use crate::refusal::Refusal;
use crate::response;

/// The form's `field`, or the refusal that names it.
fn required<'a>(form: &'a crate::input::Form, field: &str) -> Result<&'a str, Refusal> {
    form.field(field)
        .ok_or_else(|| Refusal::BadForm(format!("the form has no `{field}`; nothing was changed")))
}

/// Pauses the form's queue: no drain claims from it until it is resumed.
pub(crate) async fn pause<S: OutboxAdmin>(
    req: HttpRequest,
    dashboard: Shared<S>,
    body: web::Bytes,
) -> Result<HttpResponse, Refusal> {
    let form = accept_post(&req, &dashboard.config, &body)?;
    let queue = required(&form, "queue")?;
    let params = PauseQueue {
        queue: queue.to_owned(),
        now: now(),
    };
    Ok(response::done(
        if dashboard.store.pause_queue(params).await? {
            format!(
                "Queue {queue:?} is paused: no drain claims from it until it is resumed; messages \
             already claimed finish as usual."
            )
        } else {
            format!("Queue {queue:?} was already paused.")
        },
    ))
}

/// Resumes the form's queue, waking drains that wait for work.
pub(crate) async fn resume<S: OutboxAdmin>(
    req: HttpRequest,
    dashboard: Shared<S>,
    body: web::Bytes,
) -> Result<HttpResponse, Refusal> {
    let form = accept_post(&req, &dashboard.config, &body)?;
    let queue = required(&form, "queue")?;
    Ok(response::done(
        if dashboard.store.resume_queue(queue).await? {
            format!("Queue {queue:?} is served again.")
        } else {
            format!("Queue {queue:?} was not paused.")
        },
    ))
}

/// Cancels the form's message: at once when it is pending, by request when
/// it is being delivered.
pub(crate) async fn cancel<S: OutboxAdmin>(
    req: HttpRequest,
    dashboard: Shared<S>,
    body: web::Bytes,
) -> Result<HttpResponse, Refusal> {
    let form = accept_post(&req, &dashboard.config, &body)?;
    let id = required(&form, "id")?;
    let done = dashboard
        .store
        .cancel_messages(CancelMessages::id(id, now()))
        .await?;
    Ok(response::done(if done.requested > 0 {
        format!(
            "Message {id:?} is being delivered: its handler is told at the next renewal, and it \
             ends cancelled unless the handler succeeds."
        )
    } else {
        format!("Message {id:?} is cancelled: it will not be delivered.")
    }))
}
