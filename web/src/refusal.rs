//! Why a request is not served, as one error type that renders itself:
//! handlers return it with `?`, and actix-web answers with its
//! [`ResponseError::error_response`].

use std::fmt;

use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderValue};
use actix_web::{HttpResponse, ResponseError};
use maud::html;

use crate::response;

/// Why a request was not served. Every variant but [`Refusal::Unauthorized`]
/// renders as a dashboard page saying why (its `Display`), titled by what
/// was refused; nothing was changed by a refused request.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// The dashboard has a token and the request does not carry it: a
    /// plain-text 401 whose challenge makes a browser ask for the token.
    Unauthorized,
    /// A POST to a read-only dashboard: 403.
    ReadOnly,
    /// A POST with no CSRF field: 403.
    NoCsrfToken,
    /// A POST whose CSRF token is not this process's: 403.
    WrongCsrfToken,
    /// A list's filters do not parse: 400, with why.
    BadFilter(String),
    /// A requeue or retry form lacks what it needs: 400, with why.
    BadForm(String),
    /// A purge's status or horizon does not parse: 400, with why.
    BadPurge(String),
    /// Nothing is served at this path (the request's path): 404.
    NoSuchPage(String),
    /// The store refused or failed; the status follows the error (see
    /// [`Refusal::status_code`]).
    Store(outbox::Error),
}

impl Refusal {
    /// The page's title: what kind of request was refused.
    fn title(&self) -> &'static str {
        match self {
            Refusal::ReadOnly => "Read-only",
            Refusal::BadFilter(_) => "Bad filter",
            Refusal::BadForm(_) => "Bad request",
            Refusal::BadPurge(_) => "Bad purge",
            Refusal::NoSuchPage(_) => "Not found",
            Refusal::Unauthorized
            | Refusal::NoCsrfToken
            | Refusal::WrongCsrfToken
            | Refusal::Store(_) => "Refused",
        }
    }
}

impl From<outbox::Error> for Refusal {
    fn from(error: outbox::Error) -> Self {
        Refusal::Store(error)
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Unauthorized => f.write_str(
                "401 Unauthorized: this dashboard needs its token, as `Authorization: Bearer \
                 <token>` or as the password of basic auth (any user name).",
            ),
            Refusal::ReadOnly => {
                f.write_str("403 Forbidden: this dashboard is read-only; nothing was changed.")
            }
            Refusal::NoCsrfToken => f.write_str(
                "403 Forbidden: the request has no CSRF token; changes must be sent from the \
                 dashboard's own forms. Nothing was changed.",
            ),
            Refusal::WrongCsrfToken => f.write_str(
                "403 Forbidden: the form's CSRF token is wrong (the dashboard restarted since \
                 the page was loaded, or the request did not come from the dashboard); reload \
                 the page and try again. Nothing was changed.",
            ),
            Refusal::BadFilter(why) | Refusal::BadForm(why) | Refusal::BadPurge(why) => {
                f.write_str(why)
            }
            Refusal::NoSuchPage(path) => write!(f, "There is no dashboard page at {path}."),
            Refusal::Store(error) => error.fmt(f),
        }
    }
}

impl ResponseError for Refusal {
    fn status_code(&self) -> StatusCode {
        match self {
            Refusal::Unauthorized => StatusCode::UNAUTHORIZED,
            Refusal::ReadOnly | Refusal::NoCsrfToken | Refusal::WrongCsrfToken => {
                StatusCode::FORBIDDEN
            }
            Refusal::BadFilter(_) | Refusal::BadForm(_) | Refusal::BadPurge(_) => {
                StatusCode::BAD_REQUEST
            }
            Refusal::NoSuchPage(_) => StatusCode::NOT_FOUND,
            Refusal::Store(error) => match error {
                outbox::Error::NotFound { .. } => StatusCode::NOT_FOUND,
                // What the store refuses as unsafe, such as touching a live claim.
                outbox::Error::Admin(_) => StatusCode::CONFLICT,
                outbox::Error::InvalidInput { .. } => StatusCode::BAD_REQUEST,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            },
        }
    }

    fn error_response(&self) -> HttpResponse {
        let status = self.status_code();
        if let Refusal::Unauthorized = self {
            // Plain text: the browser shows it only if its login prompt is
            // cancelled, and a script asking without a token reads it as is.
            return HttpResponse::build(status)
                .insert_header((
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Basic realm=\"outbox\", charset=\"UTF-8\""),
                ))
                .content_type("text/plain; charset=utf-8")
                .body(format!("{self}\n"));
        }
        let why = self.to_string();
        response::page(status, self.title(), None, || {
            html! { p.refused { (why) } p { a href="./" { "Back to the overview" } } }
        })
    }
}

#[cfg(test)]
mod tests {
    use actix_web::ResponseError;
    use actix_web::http::StatusCode;
    use actix_web::http::header;
    use outbox::{AdminError, MessageStatus};

    use super::Refusal;

    #[test]
    fn store_errors_answer_with_the_status_that_fits() {
        let cases = [
            (
                outbox::Error::NotFound { id: "x".to_owned() },
                StatusCode::NOT_FOUND,
            ),
            (
                AdminError::NotDeadLettered {
                    id: "x".to_owned(),
                    status: MessageStatus::Pending,
                }
                .into(),
                StatusCode::CONFLICT,
            ),
            (
                outbox::Error::InvalidInput {
                    field: "limit",
                    reason: "too big".to_owned(),
                },
                StatusCode::BAD_REQUEST,
            ),
            (
                outbox::Error::CorruptRow {
                    id: "x".to_owned(),
                    reason: "no status".to_owned(),
                },
                StatusCode::INTERNAL_SERVER_ERROR,
            ),
        ];
        for (error, status) in cases {
            let response = Refusal::from(error).error_response();
            assert_eq!(response.status(), status);
            assert_eq!(
                response.headers().get(header::CONTENT_TYPE).unwrap(),
                "text/html; charset=utf-8"
            );
            assert!(
                response
                    .headers()
                    .contains_key(header::CONTENT_SECURITY_POLICY)
            );
        }
    }

    #[test]
    fn a_missing_token_is_answered_with_a_challenge() {
        let response = Refusal::Unauthorized.error_response();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(
            response.headers().get(header::WWW_AUTHENTICATE).unwrap(),
            "Basic realm=\"outbox\", charset=\"UTF-8\""
        );
    }
}
