//! An operator's web dashboard for a transactional outbox: an actix-web
//! [`Scope`] that an application mounts in its own `App`, over any store
//! implementing [`OutboxAdmin`] (memory, SQLite, PostgreSQL).
//!
//! ```no_run
//! use actix_web::{App, HttpServer};
//! use outbox::SqliteOutbox;
//! use outbox_web::WebConfig;
//!
//! # async fn run() -> std::io::Result<()> {
//! let store = SqliteOutbox::connect("sqlite://app.db").await.expect("store");
//! HttpServer::new(move || {
//!     App::new().service(
//!         outbox_web::scope(store.clone(), WebConfig::default()).at("/outbox"),
//!     )
//! })
//! .bind(("127.0.0.1", 8080))?
//! .run()
//! .await
//! # }
//! ```
//!
//! Pages: the overview (`/outbox/`: counts per status, the oldest due
//! message, live and expired claims, delivered and dead-lettered per minute
//! over the last hour, refreshed every few seconds), a list per status with
//! filters and keyset pagination (`messages`), one message (`message?id=…`)
//! and the purge page (`purge`). Every link is relative to the mount point,
//! so any prefix works.
//!
//! Safe by default:
//! - every state-changing request is a POST carrying a CSRF token (a
//!   per-process random secret in a hidden field); a missing or wrong token
//!   is answered 403 and changes nothing;
//! - [`WebConfig::auth_token`] asks for `Authorization: Bearer <token>` or
//!   HTTP basic auth with the token as password (any user name); the mounting
//!   application may instead put its own guard or middleware on the scope;
//! - everything from the store is HTML-escaped, and pages carry a
//!   `Content-Security-Policy` that only runs the dashboard's own script (by
//!   nonce), so a payload holding `<script>` neither renders as markup nor runs;
//! - [`WebConfig::read_only`] shows no action forms and refuses every POST.
//!
//! Actions take the same refusals as the `outbox` CLI: a message under a live
//! claim is never requeued or retried, and only delivered and dead-lettered
//! messages are ever purged.
//!
//! # Layout
//!
//! - `lib.rs` (this file): [`WebConfig`], [`scope`] and [`Dashboard`] (the
//!   routes), access checks and the CSRF token;
//! - `handlers.rs`: one function per page and per action;
//! - `render.rs`: the layout, the activity chart and the formatting the
//!   pages share.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use actix_web::{HttpRequest, HttpResponse, Scope, web};
use outbox::OutboxAdmin;

mod handlers;
mod render;

/// How the dashboard behaves.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct WebConfig {
    /// When set, every request must carry `Authorization: Bearer <token>` or
    /// basic auth whose password is the token; others get 401.
    pub auth_token: Option<String>,
    /// No action forms; every POST is refused with 403.
    pub read_only: bool,
    /// How often the overview reloads itself; `None` never.
    pub refresh: Option<Duration>,
    /// Messages per page of a list; 1 to 1 000.
    pub page_size: usize,
    /// The attempt cap the drains give messages enqueued without their own
    /// (their `retry.max_attempts`), so pages show the cap that applies.
    /// Default [`outbox::DEFAULT_MAX_ATTEMPTS`].
    pub max_attempts: u32,
}

impl Default for WebConfig {
    fn default() -> Self {
        WebConfig {
            auth_token: None,
            read_only: false,
            refresh: Some(Duration::from_secs(5)),
            page_size: 50,
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
        }
    }
}

impl WebConfig {
    /// Require this token (bearer, or basic-auth password).
    pub fn auth_token(mut self, token: impl Into<String>) -> Self {
        self.auth_token = Some(token.into());
        self
    }

    /// Show no action forms and refuse every POST.
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    /// Reload the overview this often; `None` never.
    pub fn refresh(mut self, every: Option<Duration>) -> Self {
        self.refresh = every;
        self
    }

    /// Messages per page of a list, clamped to 1 to 1 000.
    pub fn page_size(mut self, size: usize) -> Self {
        self.page_size = size.clamp(1, 1_000);
        self
    }

    /// The drains' attempt cap for messages without their own (at least 1).
    pub fn max_attempts(mut self, cap: u32) -> Self {
        self.max_attempts = cap.max(1);
        self
    }
}

/// The dashboard over one store, ready to be mounted with [`Dashboard::at`].
pub struct Dashboard<S> {
    store: Arc<S>,
    config: WebConfig,
}

/// The dashboard over `store`; mount it with [`Dashboard::at`]. `store` may
/// be the store itself or an `Arc` of it.
pub fn scope<S: OutboxAdmin>(store: impl Into<Arc<S>>, config: WebConfig) -> Dashboard<S> {
    Dashboard {
        store: store.into(),
        config,
    }
}

impl<S: OutboxAdmin> Dashboard<S> {
    /// The actix-web scope serving the dashboard under `path` (such as
    /// `/outbox`); add it to an `App` with `.service(...)`, and wrap it in
    /// the application's own middleware if it has any.
    pub fn at(self, path: &str) -> Scope {
        let path = path.trim_end_matches('/').to_owned();
        let ctx = web::Data::new(Ctx {
            store: self.store,
            config: self.config,
        });
        let home = format!("{path}/");
        let mut scope = web::scope(&path).app_data(ctx);
        if !path.is_empty() {
            // Relative links resolve against the last `/`: the bare prefix
            // must become the directory before anything else is served.
            scope = scope.route(
                "",
                web::get().to(move || {
                    let home = home.clone();
                    async move {
                        HttpResponse::PermanentRedirect()
                            .insert_header(("Location", home))
                            .finish()
                    }
                }),
            );
        }
        scope
            .route("/", web::get().to(handlers::overview::<S>))
            .route("/messages", web::get().to(handlers::list::<S>))
            .route("/message", web::get().to(handlers::message::<S>))
            .route("/purge", web::get().to(handlers::purge_page::<S>))
            .route("/requeue", web::post().to(handlers::requeue::<S>))
            .route("/retry", web::post().to(handlers::retry::<S>))
            .route("/purge", web::post().to(handlers::purge::<S>))
            .default_service(web::to(handlers::not_found::<S>))
    }
}

/// What every handler sees.
pub(crate) struct Ctx<S> {
    pub(crate) store: Arc<S>,
    pub(crate) config: WebConfig,
}

/// The process's CSRF token: random, made once, the same for every worker.
pub(crate) fn csrf_token() -> &'static str {
    static TOKEN: OnceLock<String> = OnceLock::new();
    TOKEN.get_or_init(|| random_hex(32))
}

/// `bytes` random bytes from the operating system, in hex.
pub(crate) fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf).expect("the operating system has no random source");
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// Equal without telling by its timing how much of a secret matched.
pub(crate) fn same_secret(given: &[u8], expected: &[u8]) -> bool {
    given.len() == expected.len()
        && given
            .iter()
            .zip(expected)
            .fold(0u8, |diff, (a, b)| diff | (a ^ b))
            == 0
}

/// Whether the request carries the configured token, if one is configured.
pub(crate) fn authorized(req: &HttpRequest, config: &WebConfig) -> bool {
    use base64::Engine;
    let Some(token) = &config.auth_token else {
        return true;
    };
    let Some(header) = req
        .headers()
        .get(actix_web::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    if let Some(bearer) = header.strip_prefix("Bearer ") {
        return same_secret(bearer.trim().as_bytes(), token.as_bytes());
    }
    if let Some(basic) = header.strip_prefix("Basic ") {
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
