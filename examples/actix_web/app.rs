//! The shop: an HTTP API whose orders and their events commit together, and
//! the drain that ships them. Shared by the example's `main` and its test.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use actix::prelude::*;
use actix_web::dev::ServerHandle;
use actix_web::{App, HttpResponse, HttpServer, error, web};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use outbox::{AnyOutbox, Clock, DatabaseKind, OutboxAdmin, SqlValue, SystemClock};
use outbox_actors::prelude::*;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

/// The event every order emits, committed with the order.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct OrderPlaced {
    pub(crate) order_id: i64,
    pub(crate) customer: String,
    pub(crate) items: Vec<Item>,
}

impl Event for OrderPlaced {
    const NAME: &'static str = "order.placed";
}

/// One line of an order.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Item {
    pub(crate) sku: String,
    pub(crate) quantity: u32,
}

/// The body of `POST /orders`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewOrder {
    pub(crate) customer: String,
    pub(crate) items: Vec<Item>,
}

impl NewOrder {
    /// Every rule a body must meet, as one readable reason.
    fn validate(&self) -> Result<(), String> {
        let mut problems = Vec::new();
        let customer = self.customer.trim();
        if customer.is_empty() || customer.len() > 100 {
            problems.push("`customer` must be 1 to 100 characters".to_owned());
        }
        if self.items.is_empty() || self.items.len() > 50 {
            problems.push("`items` must list 1 to 50 items".to_owned());
        }
        for (n, item) in self.items.iter().enumerate() {
            if item.sku.trim().is_empty() {
                problems.push(format!("`items[{n}].sku` must not be empty"));
            }
            if !(1..=1_000).contains(&item.quantity) {
                problems.push(format!("`items[{n}].quantity` must be 1 to 1000"));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }
}

#[derive(Serialize)]
struct Problem {
    error: String,
}

fn bad_request(reason: impl Into<String>) -> HttpResponse {
    HttpResponse::BadRequest().json(Problem {
        error: reason.into(),
    })
}

struct Shop {
    outbox: AnyOutbox,
}

async fn place_order(
    shop: web::Data<Shop>,
    body: web::Json<NewOrder>,
) -> actix_web::Result<HttpResponse> {
    let order = body.into_inner();
    if let Err(reason) = order.validate() {
        return Ok(bad_request(reason));
    }
    let internal = |e: &dyn std::fmt::Display| error::ErrorInternalServerError(e.to_string());
    // The order row and its event: one transaction, so neither exists without the other.
    // `$N` placeholders and `RETURNING` read the same on SQLite and PostgreSQL.
    let mut tx = shop.outbox.begin().await.map_err(|e| internal(&e))?;
    let items = serde_json::to_string(&order.items).map_err(|e| internal(&e))?;
    let order_id: i64 = tx
        .fetch_scalar(
            "INSERT INTO orders (customer, items) VALUES ($1, $2) RETURNING id",
            &[SqlValue::from(order.customer.trim()), SqlValue::from(items)],
        )
        .await
        .map_err(|e| internal(&e))?
        .ok_or_else(|| internal(&"the insert returned no id"))?;
    let event = OrderPlaced {
        order_id,
        customer: order.customer.trim().to_owned(),
        items: order.items,
    };
    let message_id = shop
        .outbox
        .enqueue_event_in(&mut tx, &event)
        .await
        .map_err(|e| internal(&e))?
        // A generated id is never taken.
        .into_id();
    tx.commit().await.map_err(|e| internal(&e))?;
    Ok(HttpResponse::Created()
        .json(serde_json::json!({ "order_id": order_id, "message_id": message_id })))
}

/// Bucket bounds, in seconds, of the delivery histograms: from a fast
/// in-process handler (1 ms) to a delivery that waited out retries (1 h).
pub(crate) const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    300.0, 900.0, 3600.0,
];

/// The process's Prometheus registry: one per process, since the `metrics`
/// facade has one global recorder.
///
/// The exporter renders a histogram as a summary of quantiles unless it is
/// given buckets; quantiles cannot be added up across instances, buckets
/// can. So the two latency histograms get explicit buckets, and export as
/// `_bucket{le=…}`, `_sum` and `_count`.
pub(crate) fn prometheus() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let mut builder = PrometheusBuilder::new();
        for histogram in [
            "outbox_delivery_duration_seconds",
            "outbox_enqueue_to_delivered_seconds",
        ] {
            builder = builder
                .set_buckets_for_metric(Matcher::Full(histogram.to_owned()), LATENCY_BUCKETS)
                // Only an empty list fails, and this one is not.
                .expect("non-empty buckets");
        }
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        // Only fails if another recorder was installed first; then that one
        // gets the figures and this endpoint shows none.
        let _ = metrics::set_global_recorder(recorder);
        handle
    })
}

async fn metrics_text() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(prometheus().render())
}

async fn outbox_stats(shop: web::Data<Shop>) -> actix_web::Result<HttpResponse> {
    let stats = shop
        .outbox
        .stats(SystemClock.now())
        .await
        .map_err(error::ErrorServiceUnavailable)?;
    Ok(HttpResponse::Ok().json(stats))
}

/// Ships orders. A customer named `slowpoke` makes the courier API hang, to
/// show a graceful shutdown giving its claim back.
pub(crate) fn shipping(shipped: mpsc::UnboundedSender<i64>) -> InProcessBus {
    InProcessBus::new().on(move |order: Arc<OrderPlaced>, context: DeliveryContext| {
        let shipped = shipped.clone();
        async move {
            if order.customer == "slowpoke" {
                std::future::pending::<()>().await;
            }
            tracing::info!(
                order = order.order_id,
                message_id = context.id(),
                "shipping"
            );
            let _ = shipped.send(order.order_id);
            Ok(())
        }
    })
}

/// A running shop: its address, and what stops it.
pub(crate) struct Running {
    pub(crate) addr: SocketAddr,
    pub(crate) server: ServerHandle,
    pub(crate) coordinator: Addr<DrainCoordinator>,
    pub(crate) outbox: AnyOutbox,
}

impl Running {
    /// Stop taking requests, then stop the drain: deliveries in flight get
    /// `grace` to finish, the rest give their claims back.
    pub(crate) async fn stop(&self, grace: Duration) -> Option<DrainReport> {
        self.server.stop(true).await;
        self.coordinator.send(Shutdown { grace }).await.ok()
    }
}

/// The orders table, in each database's words for a generated key.
fn orders_table(backend: DatabaseKind) -> &'static str {
    match backend {
        DatabaseKind::Postgres => {
            "CREATE TABLE IF NOT EXISTS orders (
                id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                customer TEXT NOT NULL, items TEXT NOT NULL)"
        }
        // SQLite: an INTEGER PRIMARY KEY is the row id, generated on insert.
        _ => {
            "CREATE TABLE IF NOT EXISTS orders (
                id INTEGER PRIMARY KEY, customer TEXT NOT NULL, items TEXT NOT NULL)"
        }
    }
}

/// Open the database (SQLite or PostgreSQL, by the URL's scheme), start the
/// drain (on wake-ups and every few seconds) and the HTTP server on `bind`.
pub(crate) async fn start(
    database_url: &str,
    bind: &str,
    shipped: mpsc::UnboundedSender<i64>,
) -> Result<Running, Box<dyn std::error::Error>> {
    let outbox = AnyOutbox::connect(database_url).await?;
    outbox.execute(orders_table(outbox.kind()), &[]).await?;
    tracing::info!(backend = %outbox.kind(), "outbox ready");

    // Install the recorder before anything records: figures recorded
    // before it exists go nowhere.
    prometheus();
    // The shipping handler names the one event, so no registry is needed.
    let coordinator = DrainCoordinator::builder(outbox.clone())
        .event_bus(shipping(shipped))
        .config(DrainConfig {
            concurrency: 8,
            batch_size: 200,
            every: Some(Duration::from_secs(5)),
            ..DrainConfig::default()
        })
        .start()?;

    let shop = web::Data::new(Shop {
        outbox: outbox.clone(),
    });
    let json = web::JsonConfig::default()
        .limit(64 * 1024)
        .error_handler(|err, _| {
            let reason = format!("invalid JSON body: {err}");
            error::InternalError::from_response(err, bad_request(reason)).into()
        });
    let server = HttpServer::new(move || {
        App::new()
            .app_data(shop.clone())
            .app_data(json.clone())
            .route("/orders", web::post().to(place_order))
            .route("/outbox/stats", web::get().to(outbox_stats))
            .route("/metrics", web::get().to(metrics_text))
    })
    .disable_signals()
    // Idle keep-alive connections would otherwise hold a graceful stop open.
    .shutdown_timeout(2)
    .bind(bind)?;
    let addr = server.addrs()[0];
    let server = server.run();
    let handle = server.handle();
    actix_web::rt::spawn(server);
    Ok(Running {
        addr,
        server: handle,
        coordinator,
        outbox,
    })
}
