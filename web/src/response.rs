//! Pages as HTTP responses: the layout with the headers every page carries,
//! so no page can be served without its Content-Security-Policy.

use actix_web::HttpResponse;
use actix_web::http::StatusCode;
use actix_web::http::header;
use maud::{Markup, html};

use crate::render::layout;
use crate::secret::random_hex;

/// A finished page, with the headers every page carries. The body is built
/// after the nonce is drawn, which the policy and the page's script share.
pub(crate) fn page(
    status: StatusCode,
    title: &str,
    refresh: Option<u64>,
    body: impl FnOnce() -> Markup,
) -> HttpResponse {
    let nonce = random_hex(16);
    let page = layout(title, &nonce, refresh, body());
    HttpResponse::build(status)
        .content_type("text/html; charset=utf-8")
        .insert_header((
            header::CONTENT_SECURITY_POLICY,
            format!(
                "default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline'; \
                 img-src data:; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
            ),
        ))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .insert_header((header::REFERRER_POLICY, "no-referrer"))
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .insert_header((header::X_FRAME_OPTIONS, "DENY"))
        .body(page.into_string())
}

/// The page an action answers with when it went through: what it did.
pub(crate) fn done(what: String) -> HttpResponse {
    page(StatusCode::OK, "Done", None, || {
        html! {
            p.notice #done { (what) }
            p { a href="./" { "Back to the overview" } }
        }
    })
}
