//! The guard in front of every page: the access token, and for every change
//! read-only mode and the CSRF token, checked before anything else is read.

use std::sync::OnceLock;

use actix_web::HttpRequest;
use actix_web::http::header;
use maud::{Markup, html};

use crate::WebConfig;
use crate::input::Form;
use crate::refusal::Refusal;
use crate::secret::{random_hex, same_secret};

/// The process's CSRF token: random, made once, the same for every worker.
fn csrf_token() -> &'static str {
    static TOKEN: OnceLock<String> = OnceLock::new();
    TOKEN.get_or_init(|| random_hex(32))
}

/// The hidden CSRF field every action form carries.
pub(crate) fn csrf_field() -> Markup {
    html! { input type="hidden" name="csrf" value=(csrf_token()); }
}

/// Whether the request carries the configured token, if one is configured.
fn carries_token(req: &HttpRequest, config: &WebConfig) -> bool {
    use base64::Engine;
    let Some(token) = &config.auth_token else {
        return true;
    };
    let Some(value) = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    if let Some(bearer) = value.strip_prefix("Bearer ") {
        return same_secret(bearer.trim().as_bytes(), token.as_bytes());
    }
    if let Some(basic) = value.strip_prefix("Basic ") {
        let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(basic.trim()) else {
            return false;
        };
        let password = match decoded.iter().position(|&b| b == b':') {
            Some(colon) => &decoded[colon + 1..],
            None => return false,
        };
        return same_secret(password, token.as_bytes());
    }
    false
}

/// Refused as unauthorized unless the request carries the configured token.
pub(crate) fn require_access(req: &HttpRequest, config: &WebConfig) -> Result<(), Refusal> {
    if carries_token(req, config) {
        Ok(())
    } else {
        Err(Refusal::Unauthorized)
    }
}

/// The fields of a POSTed form, once access, read-only mode and the CSRF
/// token are checked, in that order.
pub(crate) fn accept_post(
    req: &HttpRequest,
    config: &WebConfig,
    body: &[u8],
) -> Result<Form, Refusal> {
    require_access(req, config)?;
    if config.read_only {
        return Err(Refusal::ReadOnly);
    }
    let form = Form::parse(body);
    match form.raw("csrf") {
        Some(token) if same_secret(token.as_bytes(), csrf_token().as_bytes()) => Ok(form),
        Some(_) => Err(Refusal::WrongCsrfToken),
        None => Err(Refusal::NoCsrfToken),
    }
}
