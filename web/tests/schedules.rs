//! The dashboard's schedules page over a memory store: each schedule with
//! its cadence, zone, last and next slot and the process that enqueued the
//! last, overdue ones called out, names escaped, access required.

use actix_web::dev::{Service, ServiceResponse};
use actix_web::http::StatusCode;
use actix_web::{App, test};
use chrono::{DateTime, Utc};
use outbox::{
    DeclareSchedule, EnqueueOptions, EnqueueSlot, MemoryOutbox, MessageKind, NewMessage,
    OutboxStore, Payload, SlotOutcome, slot_key,
};
use outbox_web::WebConfig;

const XSS: &str = "<script>window.__xss=1</script>";

async fn declare(store: &MemoryOutbox, name: &str, expression: &str, next: DateTime<Utc>) {
    store
        .schedules()
        .unwrap()
        .declare_schedule(DeclareSchedule {
            name: name.to_owned(),
            expression: expression.to_owned(),
            time_zone: "Europe/Paris".to_owned(),
            message_name: "report.nightly".to_owned(),
            next_slot: Some(next),
            now: Utc::now() - chrono::Duration::days(1),
        })
        .await
        .unwrap();
}

/// Two schedules: `nightly-report` with a slot enqueued three hours ago by
/// `worker-1`, and `stale-sync`, never run, its next slot two hours past.
async fn seeded() -> (MemoryOutbox, String) {
    let store = MemoryOutbox::new();
    let now = Utc::now();
    let slot = now - chrono::Duration::hours(3);
    let next = now + chrono::Duration::hours(21);
    declare(&store, "nightly-report", "cron 0 3 * * *", next).await;
    declare(
        &store,
        "stale-sync",
        "every 15m",
        now - chrono::Duration::hours(2),
    )
    .await;
    let message = NewMessage::new(
        MessageKind::Job,
        "report.nightly",
        Payload::from(serde_json::Value::Null),
    )
    .with_options(EnqueueOptions::new().run_at(slot).idempotency_key(
        slot_key("nightly-report", slot),
        std::time::Duration::from_secs(60),
    ));
    let outcome = store
        .schedules()
        .unwrap()
        .enqueue_slot(EnqueueSlot {
            schedule: "nightly-report".to_owned(),
            slot,
            next_slot: Some(next),
            enqueued_by: "worker-1".to_owned(),
            message,
        })
        .await
        .unwrap();
    let SlotOutcome::Enqueued(enqueued) = outcome else {
        panic!("the slot was not enqueued: {outcome:?}");
    };
    (store, enqueued.into_id())
}

async fn app(
    store: MemoryOutbox,
    config: WebConfig,
) -> impl Service<actix_http::Request, Response = ServiceResponse, Error = actix_web::Error> {
    test::init_service(App::new().service(outbox_web::scope(store, config).at("/outbox"))).await
}

async fn get(
    app: &impl Service<actix_http::Request, Response = ServiceResponse, Error = actix_web::Error>,
    uri: &str,
) -> (StatusCode, String) {
    let response = test::call_service(app, test::TestRequest::get().uri(uri).to_request()).await;
    let status = response.status();
    let body = test::read_body(response).await;
    (status, String::from_utf8(body.to_vec()).unwrap())
}

#[actix_web::test]
async fn schedules_page_shows_each_schedule_with_its_last_and_next_slot() {
    let (store, id) = seeded().await;
    let app = app(store, WebConfig::default()).await;
    let (status, page) = get(&app, "/outbox/schedules").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    for text in [
        "id=\"schedule-nightly-report\"",
        "cron 0 3 * * *",
        "Europe/Paris",
        "worker-1",
        "3h ago",
        "in 20h",
        "href=\"messages?name=report.nightly\"",
        "none yet",
        "id=\"schedule-stale-sync\"",
        "every 15m",
    ] {
        assert!(page.contains(text), "`{text}` missing from:\n{page}");
    }
    assert!(
        page.contains(&format!("href=\"message?id={id}\"")),
        "{page}"
    );
    assert_eq!(
        page.matches("overdue: is a drain running").count(),
        1,
        "only the stale schedule is overdue:\n{page}"
    );
    let (_, overview) = get(&app, "/outbox/").await;
    assert!(
        overview.contains("href=\"schedules\""),
        "the header links to it"
    );
}

#[actix_web::test]
async fn schedules_page_without_schedules_says_how_they_appear() {
    let app = app(MemoryOutbox::new(), WebConfig::default()).await;
    let (status, page) = get(&app, "/outbox/schedules").await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("No periodic schedule"), "{page}");
    assert!(!page.contains("id=\"schedules\""), "{page}");
}

#[actix_web::test]
async fn schedules_page_escapes_names_and_needs_access() {
    let store = MemoryOutbox::new();
    declare(&store, XSS, "every 1m", Utc::now()).await;
    let app = app(store, WebConfig::default().auth_token("s3cret")).await;
    let (status, _) = get(&app, "/outbox/schedules").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let request = test::TestRequest::get()
        .uri("/outbox/schedules")
        .insert_header(("Authorization", "Bearer s3cret"))
        .to_request();
    let response = test::call_service(&app, request).await;
    assert_eq!(response.status(), StatusCode::OK);
    let page = String::from_utf8(test::read_body(response).await.to_vec()).unwrap();
    assert!(!page.contains(XSS), "a schedule's name is escaped:\n{page}");
    assert!(page.contains("&lt;script&gt;"), "{page}");
}
