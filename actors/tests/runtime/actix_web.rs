//! The actix-web example, driven over HTTP: orders commit with their events,
//! bad bodies are refused with a reason, the drain ships on wake-up, stats
//! report it, `/metrics` exports the latency histograms with buckets, and a
//! graceful shutdown gives unfinished claims back. On a SQLite file, and
//! (with the `postgres` feature and `DATABASE_URL`) on a PostgreSQL database
//! of its own.
//!
//! Real sockets and real databases, so real time; nothing sleeps to
//! observe: the test waits on the shipping handler's channel, with a
//! deadline that only turns a hang into a failure.

#[path = "../../../examples/actix_web/app.rs"]
#[allow(dead_code, unreachable_pub, missing_docs)]
mod app;

use std::time::Duration;

use outbox::{ListMessages, MessageStatus, OutboxAdmin};
use serde_json::{Value, json};

const PATIENCE: Duration = Duration::from_secs(20);

struct Shop {
    running: app::Running,
    client: awc::Client,
    shipments: tokio::sync::mpsc::UnboundedReceiver<i64>,
    _dir: TempDir,
}

/// A directory removed when dropped.
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn shop() -> Shop {
    let dir = std::env::temp_dir().join(format!("outbox-actix-web-{}", uuid_like()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}/shop.db", dir.display());
    shop_on(&url, TempDir(dir)).await
}

async fn shop_on(url: &str, dir: TempDir) -> Shop {
    let (shipped, shipments) = tokio::sync::mpsc::unbounded_channel();
    let running = app::start(url, "127.0.0.1:0", shipped).await.unwrap();
    Shop {
        running,
        client: awc::Client::default(),
        shipments,
        _dir: dir,
    }
}

fn uuid_like() -> String {
    format!("{}-{:?}", std::process::id(), std::time::SystemTime::now())
        .replace([' ', ':', '.', '{', '}', ','], "")
}

impl Shop {
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.running.addr)
    }

    async fn post(&self, body: &str) -> (u16, Value) {
        let mut response = self
            .client
            .post(self.url("/orders"))
            .insert_header(("content-type", "application/json"))
            .send_body(body.to_owned())
            .await
            .unwrap();
        let status = response.status().as_u16();
        let body = response.json::<Value>().await.unwrap_or(Value::Null);
        (status, body)
    }

    async fn stats(&self) -> Value {
        self.client
            .get(self.url("/outbox/stats"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    async fn shipped(&mut self) -> i64 {
        tokio::time::timeout(PATIENCE, self.shipments.recv())
            .await
            .expect("an order was shipped in time")
            .expect("the shipping handler is alive")
    }
}

#[actix_web::test]
async fn an_order_and_its_event_commit_together_and_ship_on_wake_up() {
    an_order_ships_on_wake_up(shop().await).await;
}

/// The shop on a PostgreSQL database of its own, so its `orders` and
/// `outbox` tables meet no other test's.
#[cfg(feature = "postgres")]
#[actix_web::test]
async fn on_postgres_an_order_and_its_event_commit_together_and_ship_on_wake_up() {
    use sqlx::Connection;
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| {
        panic!(
            "DATABASE_URL is not set. This test needs a PostgreSQL server: run it with \
             `scripts/with-postgres cargo test -p outbox-actors --all-features --test runtime actix_web`"
        )
    });
    let database = format!("shop_{}", uuid::Uuid::new_v4().simple());
    let mut admin = sqlx::PgConnection::connect(&url).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {database}")))
        .execute(&mut admin)
        .await
        .unwrap();
    let (base, query) = url.split_once('?').unwrap_or((&url, ""));
    let (server, _) = base
        .rsplit_once('/')
        .expect("DATABASE_URL names a database");
    let shop_url = if query.is_empty() {
        format!("{server}/{database}")
    } else {
        format!("{server}/{database}?{query}")
    };
    let shop = shop_on(&shop_url, TempDir(std::env::temp_dir().join(&database))).await;
    assert_eq!(shop.running.outbox.kind(), outbox::DatabaseKind::Postgres);
    an_order_ships_on_wake_up(shop).await;
}

async fn an_order_ships_on_wake_up(mut shop: Shop) {
    let (status, body) = shop
        .post(r#"{"customer":"ada","items":[{"sku":"tea","quantity":2}]}"#)
        .await;
    assert_eq!(status, 201, "{body}");
    let order_id = body["order_id"].as_i64().unwrap();
    assert!(body["message_id"].as_str().is_some_and(|id| !id.is_empty()));
    // No Drain was sent and the schedule is 5 s away: the commit woke the drain.
    assert_eq!(shop.shipped().await, order_id);
    // Passes never overlap, so once a Drain answers, the pass that shipped
    // the order has settled it.
    shop.running
        .coordinator
        .send(outbox_actors::Drain)
        .await
        .unwrap()
        .unwrap();
    let stats = shop.stats().await;
    assert_eq!(stats["delivered"], json!(1), "{stats}");
    assert_eq!(stats["pending"], json!(0), "{stats}");
    let mut metrics = shop.client.get(shop.url("/metrics")).send().await.unwrap();
    assert_eq!(metrics.status().as_u16(), 200);
    let text = String::from_utf8(metrics.body().await.unwrap().to_vec()).unwrap();
    assert!(
        text.lines()
            .any(|line| line.starts_with("outbox_delivered_total{")
                && line.contains("name=\"order.placed\"")),
        "{text}"
    );
    // Histograms, not summaries: buckets add up across instances.
    for histogram in [
        "outbox_delivery_duration_seconds",
        "outbox_enqueue_to_delivered_seconds",
    ] {
        let lines: Vec<&str> = text
            .lines()
            .filter(|line| line.starts_with(histogram))
            .collect();
        let has = |suffix: &str| {
            lines.iter().any(|line| {
                line.starts_with(&format!("{histogram}{suffix}"))
                    && line.contains("name=\"order.placed\"")
            })
        };
        assert!(
            lines
                .iter()
                .any(|line| line.starts_with(&format!("{histogram}_bucket{{"))
                    && line.contains("le=\"0.005\"")),
            "{histogram} has no buckets:\n{text}"
        );
        assert!(has("_bucket{") && has("_sum{") && has("_count{"), "{text}");
        assert!(
            lines.iter().any(|line| line.contains("le=\"+Inf\"")),
            "{text}"
        );
        assert!(
            !lines.iter().any(|line| line.contains("quantile=")),
            "{histogram} is exported as a summary:\n{text}"
        );
    }
    shop.running.stop(Duration::from_secs(1)).await;
}

#[actix_web::test]
async fn bad_bodies_get_a_400_with_the_reason_and_write_nothing() {
    let shop = shop().await;
    let cases = [
        ("{not json", "invalid JSON body"),
        (
            r#"{"items":[{"sku":"tea","quantity":1}]}"#,
            "missing field `customer`",
        ),
        (
            r#"{"customer":"ada","items":[{"sku":"tea","quantity":0}]}"#,
            "`items[0].quantity` must be 1 to 1000",
        ),
        (
            r#"{"customer":" ","items":[]}"#,
            "`customer` must be 1 to 100 characters; `items` must list 1 to 50 items",
        ),
        (
            r#"{"customer":"ada","items":[{"sku":"tea","quantity":1}],"coupon":"FREE"}"#,
            "unknown field `coupon`",
        ),
    ];
    for (body, reason) in cases {
        let (status, answer) = shop.post(body).await;
        assert_eq!(status, 400, "{body} -> {answer}");
        let error = answer["error"].as_str().unwrap_or_default();
        assert!(
            error.contains(reason),
            "{body}: expected {reason:?} in {error:?}"
        );
    }
    let orders: Option<i64> = shop
        .running
        .outbox
        .fetch_scalar("SELECT count(*) FROM orders", &[])
        .await
        .unwrap();
    assert_eq!(orders, Some(0));
    assert_eq!(shop.stats().await["pending"], json!(0));
    shop.running.stop(Duration::from_secs(1)).await;
}

#[actix_web::test]
async fn a_graceful_shutdown_releases_claims_of_unfinished_deliveries() {
    let mut shop = shop().await;
    let (status, _) = shop
        .post(r#"{"customer":"slowpoke","items":[{"sku":"anvil","quantity":1}]}"#)
        .await;
    assert_eq!(status, 201);
    let (status, body) = shop
        .post(r#"{"customer":"grace","items":[{"sku":"cobol","quantity":1}]}"#)
        .await;
    assert_eq!(status, 201);
    // The slow order holds its claim while the other one ships.
    assert_eq!(shop.shipped().await, body["order_id"].as_i64().unwrap());

    let report = shop
        .running
        .stop(Duration::from_millis(200))
        .await
        .expect("the drain answered");
    assert_eq!(report.released, 1, "{report}");
    let unfinished = shop
        .running
        .outbox
        .list_messages(ListMessages::default())
        .await
        .unwrap()
        .messages
        .into_iter()
        .filter(|message| message.status != MessageStatus::Delivered)
        .map(|message| (message.status, message.attempts))
        .collect::<Vec<_>>();
    assert_eq!(
        unfinished,
        [(MessageStatus::Pending, 0)],
        "given back, the attempt not counted"
    );
}
