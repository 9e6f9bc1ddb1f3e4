//! An actix-web shop that writes each order and its event in one transaction
//! and drains the events on wake-up and on a schedule, on SQLite or
//! PostgreSQL (picked by the `--database` URL's scheme).
//!
//! ```text
//! cargo run --example actix_web -- --database sqlite://shop.db --bind 127.0.0.1:8080
//! cargo run --example actix_web --features postgres -- --database postgres://app@localhost/shop
//! curl -si -XPOST localhost:8080/orders -H 'content-type: application/json' \
//!      -d '{"customer":"ada","items":[{"sku":"tea","quantity":2}]}'
//! curl -s localhost:8080/outbox/stats
//! curl -s localhost:8080/metrics        # Prometheus text format
//! ```
//!
//! Logs go to stderr, filtered by `RUST_LOG` (default `info`). With
//! `--otel-stdout` (or `OUTBOX_EXAMPLE_OTEL=stdout`) the spans are also
//! exported as OpenTelemetry spans to stdout, through the SDK's stdout
//! exporter; swap in an OTLP exporter to ship them to a collector.
//!
//! Ctrl-C stops the server, gives deliveries in flight five seconds, and
//! releases the claims of the rest.

mod app;

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

const USAGE: &str = "usage: actix_web [--database sqlite://PATH | postgres://USER@HOST/DB] \
                     [--bind HOST:PORT] [--otel-stdout]";

/// Install the log output (and, when asked, the OpenTelemetry export);
/// returns the tracer provider to flush at exit.
fn install_tracing(
    otel: bool,
) -> Result<Option<opentelemetry_sdk::trace::SdkTracerProvider>, String> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(directives) => EnvFilter::try_new(&directives)
            .map_err(|e| format!("RUST_LOG={directives:?} is not a valid filter: {e}"))?,
        Err(_) => EnvFilter::new("info"),
    };
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(filter);
    if !otel {
        tracing_subscriber::registry().with(fmt).init();
        return Ok(None);
    }
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_simple_exporter(opentelemetry_stdout::SpanExporter::default())
        .build();
    let otel = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("outbox-actix-web-example"))
        // The export follows RUST_LOG's levels too, from its own copy.
        .with_filter(
            std::env::var("RUST_LOG")
                .ok()
                .and_then(|directives| EnvFilter::try_new(directives).ok())
                .unwrap_or_else(|| EnvFilter::new("info")),
        );
    tracing_subscriber::registry().with(fmt).with(otel).init();
    Ok(Some(provider))
}

#[actix_web::main]
async fn main() {
    let mut database = "sqlite://shop.db".to_owned();
    let mut bind = "127.0.0.1:8080".to_owned();
    let mut otel = std::env::var("OUTBOX_EXAMPLE_OTEL").is_ok_and(|value| value == "stdout");
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        match flag.as_str() {
            "--otel-stdout" => otel = true,
            "--database" | "--bind" => {
                let Some(value) = args.next() else {
                    eprintln!("{flag} needs a value\n{USAGE}");
                    std::process::exit(2);
                };
                if flag == "--database" {
                    database = value;
                } else {
                    bind = value;
                }
            }
            other => {
                eprintln!("unknown argument {other:?}\n{USAGE}");
                std::process::exit(2);
            }
        }
    }
    let provider = match install_tracing(otel) {
        Ok(provider) => provider,
        Err(error) => {
            eprintln!("{error}");
            std::process::exit(2);
        }
    };
    let (shipped, mut shipments) = tokio::sync::mpsc::unbounded_channel();
    let running = match app::start(&database, &bind, shipped).await {
        Ok(running) => running,
        Err(error) => {
            eprintln!("could not start: {error}");
            std::process::exit(1);
        }
    };
    tracing::info!(addr = %running.addr, "listening (Ctrl-C to stop)");
    loop {
        tokio::select! {
            Some(order) = shipments.recv() => tracing::info!(order, "shipped"),
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    tracing::info!("stopping: finishing deliveries in flight, releasing the rest");
    let report = running.stop(Duration::from_secs(5)).await;
    if let Some(report) = report {
        tracing::info!(%report, "last pass");
    }
    use outbox::{Clock, OutboxAdmin};
    if let Ok(stats) = running.outbox.stats(outbox::SystemClock.now()).await {
        tracing::info!(
            delivered = stats.delivered,
            pending = stats.pending,
            dead_lettered = stats.dead_lettered,
            "outbox"
        );
    }
    if let Some(provider) = provider {
        // Spans still buffered would be lost otherwise.
        let _ = provider.shutdown();
    }
}
