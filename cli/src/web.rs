//! `web`: the dashboard of `outbox-web`, served on its own.

use std::net::SocketAddr;

use actix_web::{App, HttpServer};
use outbox::AnyOutbox;
use outbox_web::WebConfig;

use crate::cli::WebArgs;
use crate::fail::Failure;

/// The address to listen on, refused when it would expose an unauthenticated
/// dashboard, which can requeue and purge, beyond this machine.
pub(crate) fn bind_address(args: &WebArgs) -> Result<SocketAddr, Failure> {
    let addr: SocketAddr = args.bind.parse().map_err(|_| {
        Failure::usage(format!("`--bind {}` is not an address and port", args.bind))
            .hint("give an IP address and a port, such as 127.0.0.1:8089 or [::1]:8089")
    })?;
    let token = args.auth_token.as_deref().filter(|t| !t.is_empty());
    if !addr.ip().is_loopback() && token.is_none() && !args.allow_remote {
        return Err(Failure::usage(format!(
            "refusing to serve the dashboard on {addr} without --auth-token: anyone who can \
             reach that address could requeue and purge messages"
        ))
        .hint(
            "pass --auth-token TOKEN (or set OUTBOX_WEB_TOKEN), bind 127.0.0.1, or pass \
             --allow-remote when a proxy in front authenticates",
        ));
    }
    if args.auth_token.as_deref() == Some("") {
        return Err(Failure::usage(
            "`--auth-token` is empty; give a secret, or leave it out",
        ));
    }
    Ok(addr)
}

/// Serve until Ctrl-C or SIGTERM.
pub(crate) async fn serve(
    store: &AnyOutbox,
    args: WebArgs,
    addr: SocketAddr,
) -> Result<(), Failure> {
    let mut config = WebConfig::default()
        .read_only(args.read_only)
        .max_attempts(args.max_attempts);
    if let Some(token) = args.auth_token {
        config = config.auth_token(token);
    }
    let store = store.clone();
    let server = HttpServer::new(move || {
        App::new().service(outbox_web::scope(store.clone(), config.clone()).at("/"))
    })
    .workers(2)
    .bind(addr)
    .map_err(|e| Failure::operational(format!("cannot listen on {addr}: {e}")))?;
    eprintln!(
        "outbox dashboard on http://{addr}/{}{}",
        if args.read_only { " (read-only)" } else { "" },
        if addr.ip().is_loopback() {
            ""
        } else {
            " (remote access allowed)"
        },
    );
    server
        .run()
        .await
        .map_err(|e| Failure::operational(format!("the dashboard stopped: {e}")))
}
