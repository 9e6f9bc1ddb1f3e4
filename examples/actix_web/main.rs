//! An actix-web shop that writes each order and its event in one transaction
//! and drains the events on wake-up and on a schedule.
//!
//! ```text
//! cargo run --example actix_web -- --database sqlite://shop.db --bind 127.0.0.1:8080
//! curl -si -XPOST localhost:8080/orders -H 'content-type: application/json' \
//!      -d '{"customer":"ada","items":[{"sku":"tea","quantity":2}]}'
//! curl -s localhost:8080/outbox/stats
//! curl -s localhost:8080/metrics        # Prometheus text format
//! ```
//!
//! Ctrl-C stops the server, gives deliveries in flight five seconds, and
//! releases the claims of the rest.

mod app;

use std::time::Duration;

#[actix_web::main]
async fn main() {
    let mut database = "sqlite://shop.db".to_owned();
    let mut bind = "127.0.0.1:8080".to_owned();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        match (flag.as_str(), args.next()) {
            ("--database", Some(value)) => database = value,
            ("--bind", Some(value)) => bind = value,
            _ => {
                eprintln!("usage: actix_web [--database sqlite://PATH] [--bind HOST:PORT]");
                std::process::exit(2);
            }
        }
    }
    let (shipped, mut shipments) = tokio::sync::mpsc::unbounded_channel();
    let running = match app::start(&database, &bind, shipped).await {
        Ok(running) => running,
        Err(error) => {
            eprintln!("could not start: {error}");
            std::process::exit(1);
        }
    };
    println!("listening on http://{} (Ctrl-C to stop)", running.addr);
    loop {
        tokio::select! {
            Some(order) = shipments.recv() => println!("shipped order {order}"),
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    println!("stopping: finishing deliveries in flight, releasing the rest");
    let report = running.stop(Duration::from_secs(5)).await;
    if let Some(report) = report {
        println!("last pass: {report}");
    }
    use outbox::{Clock, OutboxAdmin};
    if let Ok(stats) = running.outbox.stats(outbox::SystemClock.now()).await {
        println!(
            "outbox: {} delivered, {} pending, {} dead-lettered",
            stats.delivered, stats.pending, stats.dead_lettered
        );
    }
}
