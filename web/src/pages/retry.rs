//! POST `/retry`: make a pending message due now.

use actix_web::{HttpRequest, HttpResponse, web};
use outbox::{OutboxAdmin, RetryNow};

use super::{Shared, now};
use crate::guard::accept_post;
use crate::refusal::Refusal;
use crate::response;

/// Cuts the backoff of the message in the form's `id` short.
pub(crate) async fn action<S: OutboxAdmin>(
    req: HttpRequest,
    dashboard: Shared<S>,
    body: web::Bytes,
) -> Result<HttpResponse, Refusal> {
    let form = accept_post(&req, &dashboard.config, &body)?;
    let id = form.field("id").ok_or_else(|| {
        Refusal::BadForm("the form has no message `id`; nothing was changed".to_owned())
    })?;
    let params = RetryNow {
        id: id.to_owned(),
        now: now(),
    };
    dashboard.store.retry_now(params).await?;
    Ok(response::done(format!("Message {id:?} is due now.")))
}
