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
//! message, live and expired claims, the queues with their pause and
//! resume buttons, delivered and dead-lettered per minute over the last
//! hour, refreshed every few seconds), a list per status with
//! filters and keyset pagination (`messages`), one message (`message?id=…`),
//! the periodic schedules with their last and next slot (`schedules`) and
//! the purge page (`purge`). Every link is relative to the mount point,
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
//! claim is never requeued or retried, only settled messages are ever
//! purged, and only pending and claimed ones cancelled. The guide's [operating page](https://github.com/outbox-rs/outbox/blob/main/docs/src/operating.md)
//! shows the dashboard beside the `outbox` command.
//!
//! # Layout
//!
//! One concept per file. Each module imports only modules listed before it
//! (and the crate root's [`WebConfig`] and [`Dashboard`]), so the list reads
//! from the leaves up to the pages.
//!
//! - `lib.rs` (this file): [`WebConfig`], [`scope`] and [`Dashboard`], which
//!   holds the store and the configuration and maps each path to its page.
//! - `secret`: random secrets (the CSRF token, script nonces) and comparing
//!   secrets in constant time.
//! - `input`: what the operator sends: a POSTed form's fields, blank values,
//!   times.
//! - `render`: the HTML layout, the activity chart and the formatting the
//!   pages share.
//! - `response`: a page as an HTTP response, with the security headers every
//!   page carries.
//! - `refusal`: `Refusal`, why a request is not served; it renders itself
//!   (actix-web's `ResponseError`), so handlers refuse with `?`.
//! - `guard`: the access token, read-only mode and the CSRF token, checked
//!   before a handler reads anything else.
//! - `pages`: one file per page, with its GET handler and its POST action:
//!   `overview`, `messages` (a list), `message` (one), `schedules`, `purge`,
//!   `requeue`, `retry`, `queues` (pause, resume and cancel) and `not_found`.

use std::sync::Arc;
use std::time::Duration;

use actix_web::{HttpResponse, Scope, web};
use outbox::OutboxAdmin;

use pages::{message, messages, not_found, overview, purge, queues, requeue, retry, schedules};

mod guard;
mod input;
mod pages;
mod refusal;
mod render;
mod response;
mod secret;

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
/// Once mounted, every handler is given it.
pub struct Dashboard<S> {
    /// The store every page reads and every action writes.
    store: Arc<S>,
    /// How the pages look and what they allow.
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
        let home = format!("{path}/");
        let mut scope = web::scope(&path).app_data(web::Data::new(self));
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
            .route("/", web::get().to(overview::page::<S>))
            .route("/messages", web::get().to(messages::page::<S>))
            .route("/message", web::get().to(message::page::<S>))
            .route("/purge", web::get().to(purge::page::<S>))
            .route("/schedules", web::get().to(schedules::page::<S>))
            .route("/requeue", web::post().to(requeue::action::<S>))
            .route("/retry", web::post().to(retry::action::<S>))
            .route("/purge", web::post().to(purge::action::<S>))
            .route("/pause", web::post().to(queues::pause::<S>))
            .route("/resume", web::post().to(queues::resume::<S>))
            .route("/cancel", web::post().to(queues::cancel::<S>))
            .default_service(web::to(not_found::page::<S>))
    }
}
