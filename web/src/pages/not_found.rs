//! Anything else under the mount point.

use actix_web::{HttpRequest, HttpResponse};
use outbox::OutboxAdmin;

use super::Shared;
use crate::guard::require_access;
use crate::refusal::Refusal;

/// Any method, any path the dashboard does not serve: 404, once access is
/// checked (so the dashboard's paths are not told to a stranger).
pub(crate) async fn page<S: OutboxAdmin>(
    req: HttpRequest,
    dashboard: Shared<S>,
) -> Result<HttpResponse, Refusal> {
    require_access(&req, &dashboard.config)?;
    Err(Refusal::NoSuchPage(req.path().to_owned()))
}
