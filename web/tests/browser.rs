//! The dashboard in a real browser: headless Chromium driven over WebDriver
//! (chromedriver), against the dashboard served over a SQLite store.
//!
//! Needs /usr/bin/chromium and /usr/bin/chromedriver; `scripts/install-browser`
//! installs them (Debian `chromium`, `chromium-driver`) when missing. With
//! `OUTBOX_WEB_SCREENSHOT=1` it also writes the overview to
//! `docs/src/dashboard.png` and its queues table, one queue just paused, to
//! `docs/src/dashboard-queues.png`: the screenshots the guide shows.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use actix_web::{App, HttpServer};
use chrono::Utc;
use fantoccini::{Client, ClientBuilder, Locator};
use outbox::{
    CancelMessages, ClaimBatch, ErrorRecord, MarkDelivered, MarkFailed, MessageKind, NewMessage,
    OutboxAdmin, OutboxStore, PauseQueue, Payload, QueueLimit, SqliteOutbox,
};
use outbox_web::WebConfig;

const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";
const XSS: &str = "<script>window.__xss=1</script>";

/// Kills chromedriver and removes the scratch directory, however the test ends.
struct Scratch {
    dir: PathBuf,
    driver: Option<Child>,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some(mut driver) = self.driver.take() {
            let _ = driver.kill();
            let _ = driver.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// Settle `count` messages named `name` as delivered (or dead-lettered),
/// `minutes_ago` minutes ago.
async fn settle(store: &SqliteOutbox, name: &str, count: usize, minutes_ago: i64, dead: bool) {
    let at = Utc::now() - chrono::Duration::minutes(minutes_ago);
    for i in 0..count {
        let id = format!("{name}-{minutes_ago}-{i}");
        let message = NewMessage::new(
            MessageKind::Event,
            name,
            Payload::from(serde_json::json!({ "seq": i })),
        )
        .with_id(&id)
        .at(at);
        store.enqueue(message).await.unwrap();
    }
    let batch = store
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: count,
            now: at,
            lease: Duration::from_secs(60),
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
            queues: Vec::new(),
            durable: true,
        })
        .await
        .unwrap();
    for claimed in batch.claimed {
        if dead {
            store
                .mark_failed(MarkFailed {
                    id: claimed.id,
                    claim_token: claimed.claim_token,
                    error: ErrorRecord::new("app::Refused", "the consumer refused the payload"),
                    dead_letter: true,
                    now: at,
                    retry_at: None,
                })
                .await
                .unwrap();
        } else {
            store
                .mark_delivered(MarkDelivered {
                    delete: false,
                    id: claimed.id,
                    claim_token: claimed.claim_token,
                    now: at,
                })
                .await
                .unwrap();
        }
    }
}

/// A store with an hour of deliveries, a few failures, some waiting work in
/// three queues (`reports` paused), a cancelled job, and the hostile dead
/// letter the test follows.
async fn seeded(url: &str) -> SqliteOutbox {
    let store = SqliteOutbox::connect(url).await.unwrap();
    for minutes_ago in (0..60).step_by(3) {
        let count = 3 + (minutes_ago as usize * 7) % 11;
        settle(&store, "order.placed", count, minutes_ago, false).await;
    }
    for minutes_ago in [4, 17, 33] {
        settle(&store, "invoice.sent", 1, minutes_ago, true).await;
    }
    let now = Utc::now();
    let hostile = NewMessage::new(
        MessageKind::Event,
        "order.placed",
        Payload::from(serde_json::json!({ "order": 7, "note": XSS })),
    )
    .with_id("hostile")
    .at(now);
    store.enqueue(hostile).await.unwrap();
    let batch = store
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: 1,
            now,
            lease: Duration::from_secs(60),
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
            queues: Vec::new(),
            durable: true,
        })
        .await
        .unwrap();
    let mut error = ErrorRecord::new("app::BrokerError", format!("broker rejected {XSS}"));
    error.causes.push(format!("upstream said {XSS}"));
    store
        .mark_failed(MarkFailed {
            id: "hostile".to_owned(),
            claim_token: batch.claimed[0].claim_token.clone(),
            error,
            dead_letter: true,
            now,
            retry_at: None,
        })
        .await
        .unwrap();
    for i in 0..4 {
        let job = NewMessage::new(
            MessageKind::Job,
            "email.send",
            Payload::from(serde_json::json!({ "to": format!("user{i}@example.com") })),
        )
        .at(now)
        .available_at(now + chrono::Duration::minutes(5 * i));
        store.enqueue(job).await.unwrap();
    }
    for (queue, jobs) in [("mail", 6), ("reports", 3)] {
        for i in 0..jobs {
            let job = NewMessage::new(
                MessageKind::Job,
                format!("{queue}.run"),
                Payload::from(serde_json::json!({ "n": i })),
            )
            .with_id(format!("{queue}-{i}"))
            .with_queue(queue)
            .with_priority(i % 3)
            .at(now);
            store.enqueue(job).await.unwrap();
        }
    }
    store
        .pause_queue(PauseQueue {
            queue: "reports".to_owned(),
            now: now - chrono::Duration::minutes(12),
        })
        .await
        .unwrap();
    store
        .cancel_messages(CancelMessages::id("mail-5", now))
        .await
        .unwrap();
    store
}

async fn count(client: &Client, status: &str) -> u64 {
    let text = client
        .find(Locator::Css(&format!("#count-{status} b")))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.trim().parse().expect("a count")
}

async fn start_driver(scratch: &mut Scratch) -> u16 {
    let port = free_port();
    let log = std::fs::File::create(scratch.dir.join("chromedriver.log")).unwrap();
    let driver = Command::new(CHROMEDRIVER)
        .arg(format!("--port={port}"))
        .stdout(Stdio::from(log.try_clone().unwrap()))
        .stderr(Stdio::from(log))
        .spawn()
        .expect("chromedriver starts");
    scratch.driver = Some(driver);
    // Waiting for a real process to listen: a bounded poll.
    for _ in 0..200 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return port;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("chromedriver did not listen on port {port} within 10 s");
}

#[actix_web::test]
async fn a_browser_follows_a_dead_letter_requeues_it_and_no_injected_script_runs() {
    assert!(
        Path::new(CHROMEDRIVER).exists() && Path::new(CHROMIUM).exists(),
        "{CHROMIUM} and {CHROMEDRIVER} are needed: run scripts/install-browser \
         (Debian packages chromium and chromium-driver)"
    );
    let dir = std::env::temp_dir().join(format!(
        "outbox-web-browser-{}-{}",
        std::process::id(),
        Utc::now().timestamp_micros()
    ));
    std::fs::create_dir_all(dir.join("profile")).unwrap();
    let mut scratch = Scratch { dir, driver: None };

    let url = format!("sqlite://{}", scratch.dir.join("outbox.db").display());
    let store = seeded(&url).await;
    println!("step 1: seeded a SQLite store with a dead letter whose payload and error hold {XSS}");

    let served = store.clone();
    let server = HttpServer::new(move || {
        App::new().service(
            outbox_web::scope(served.clone(), WebConfig::default().refresh(None)).at("/outbox"),
        )
    })
    .workers(1)
    .bind(("127.0.0.1", 0))
    .unwrap();
    let addr = server.addrs()[0];
    let server = server.run();
    let server_handle = server.handle();
    actix_rt::spawn(server);
    let base = format!("http://{addr}/outbox/");
    println!("step 2: serving the dashboard at {base}");

    let port = start_driver(&mut scratch).await;
    let mut capabilities = serde_json::Map::new();
    capabilities.insert(
        "goog:chromeOptions".to_owned(),
        serde_json::json!({
            "binary": CHROMIUM,
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--window-size=1280,1000",
                format!("--user-data-dir={}", scratch.dir.join("profile").display()),
            ],
        }),
    );
    let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(capabilities)
        .connect(&format!("http://127.0.0.1:{port}"))
        .await
        .expect("a Chromium session through chromedriver");
    println!("step 3: headless Chromium started through chromedriver on port {port}");

    client.goto(&base).await.unwrap();
    let dead_before = count(&client, "dead_lettered").await;
    let pending_before = count(&client, "pending").await;
    println!(
        "step 4: overview loaded: {dead_before} dead-lettered, {pending_before} pending, \
         {} delivered",
        count(&client, "delivered").await
    );
    assert_eq!(dead_before, 4);
    assert!(
        client.find(Locator::Css("svg rect")).await.is_ok(),
        "the chart has bars"
    );

    if std::env::var("OUTBOX_WEB_SCREENSHOT").as_deref() == Ok("1") {
        let png = client.screenshot().await.unwrap();
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/src/dashboard.png");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &png).unwrap();
        println!(
            "step 4b: wrote the overview to docs/src/dashboard.png ({} bytes)",
            png.len()
        );
    }

    client
        .find(Locator::Css("#count-dead_lettered a"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    client
        .find(Locator::LinkText("hostile"))
        .await
        .expect("the dead letter is listed")
        .click()
        .await
        .unwrap();
    let payload = client
        .find(Locator::Id("payload"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        payload.contains(XSS),
        "the payload shows as text: {payload}"
    );
    let error = client
        .find(Locator::Id("last-error"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(error.contains(XSS), "the error shows as text: {error}");
    println!(
        "step 5: followed the dead letter to its page; its payload and error show {XSS} as text"
    );

    let xss = client
        .execute("return typeof window.__xss;", vec![])
        .await
        .unwrap();
    assert_eq!(xss, serde_json::json!("undefined"));
    println!("step 6: typeof window.__xss is {xss}: the injected script did not run");

    client
        .find(Locator::Id("requeue"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let question = client
        .get_alert_text()
        .await
        .expect("a confirmation dialog");
    client.accept_alert().await.unwrap();
    let done = client
        .wait()
        .for_element(Locator::Id("done"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(done.contains("Requeued 1 dead letter"), "{done}");
    println!("step 7: requeued it after accepting the confirmation {question:?}: {done:?}");

    client
        .find(Locator::LinkText("Overview"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let dead_after = count(&client, "dead_lettered").await;
    let pending_after = count(&client, "pending").await;
    println!(
        "step 8: overview again: {dead_after} dead-lettered (was {dead_before}), \
         {pending_after} pending (was {pending_before})"
    );
    assert_eq!(dead_after, dead_before - 1);
    assert_eq!(pending_after, pending_before + 1);
    assert_eq!(count(&client, "cancelled").await, 1);

    let reports = client
        .find(Locator::Css("#queue-reports .state"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(reports.starts_with("paused since"), "{reports}");
    client
        .find(Locator::Css("#queue-mail button.pause"))
        .await
        .expect("a served queue has a Pause button")
        .click()
        .await
        .unwrap();
    let question = client
        .get_alert_text()
        .await
        .expect("a confirmation dialog");
    client.accept_alert().await.unwrap();
    let done = client
        .wait()
        .for_element(Locator::Id("done"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(done.contains("is paused"), "{done}");
    println!("step 9: paused queue mail after accepting the confirmation {question:?}: {done:?}");

    client
        .find(Locator::LinkText("Overview"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let mail = client
        .find(Locator::Css("#queue-mail .state"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(mail.starts_with("paused since"), "{mail}");
    assert!(
        client
            .find(Locator::Css("#queue-mail button.resume"))
            .await
            .is_ok()
    );
    let claimed = store
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: 10,
            now: Utc::now(),
            lease: Duration::from_secs(60),
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
            queues: vec![QueueLimit::new("mail", 10), QueueLimit::new("reports", 10)],
            durable: true,
        })
        .await
        .unwrap();
    assert!(claimed.claimed.is_empty(), "{:?}", claimed.claimed);
    println!(
        "step 10: the overview shows mail {mail:?}, and a claim from mail and reports takes nothing"
    );

    if std::env::var("OUTBOX_WEB_SCREENSHOT").as_deref() == Ok("1") {
        let png = client.screenshot().await.unwrap();
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/src/dashboard-queues.png");
        std::fs::write(&path, &png).unwrap();
        println!(
            "step 10b: wrote the overview's queues to docs/src/dashboard-queues.png ({} bytes)",
            png.len()
        );
    }

    client.close().await.unwrap();
    server_handle.stop(true).await;
    drop(scratch);
}
