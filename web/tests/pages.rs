//! The dashboard over a memory store, through actix-web's test harness:
//! pages render, hostile content is escaped, and every change needs access,
//! a writable dashboard and the CSRF token.

use std::time::Duration;

use actix_web::dev::{Service, ServiceResponse};
use actix_web::http::StatusCode;
use actix_web::{App, test};
use chrono::Utc;
use outbox::{
    ClaimBatch, ErrorRecord, MarkFailed, MemoryOutbox, MessageKind, MessageStatus, NewMessage,
    OutboxAdmin, OutboxStore, Payload, TraceCarrier,
};
use outbox_web::WebConfig;

const XSS: &str = "<script>window.__xss=1</script>";

/// A store with a dead letter whose payload and error hold a script tag,
/// a pending job due in an hour, and a delivered event.
async fn seeded() -> MemoryOutbox {
    let store = MemoryOutbox::new();
    let now = Utc::now();
    let dead = NewMessage::new(
        MessageKind::Event,
        "orders.created",
        Payload::from(serde_json::json!({ "note": XSS, "order": 42 })),
    )
    .with_id("dead-1")
    .with_trace(TraceCarrier {
        traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned(),
        tracestate: None,
    })
    .at(now);
    store.enqueue(dead).await.unwrap();
    let claimed = store
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: 10,
            now,
            lease: Duration::from_secs(30),
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
            queues: Vec::new(),
            durable: true,
        })
        .await
        .unwrap();
    let token = claimed.claimed[0].claim_token.clone();
    let mut error = ErrorRecord::new("app::SendError", format!("broker said {XSS}\nsecond line"));
    error.causes.push(format!("connection reset {XSS}"));
    store
        .mark_failed(MarkFailed {
            id: "dead-1".to_owned(),
            claim_token: token,
            error,
            dead_letter: true,
            now,
            retry_at: None,
        })
        .await
        .unwrap();
    let later = NewMessage::new(
        MessageKind::Job,
        "emails.send",
        Payload::from(serde_json::json!({ "to": "a@example.com" })),
    )
    .with_id("pending-1")
    .at(now)
    .available_at(now + chrono::Duration::hours(1));
    store.enqueue(later).await.unwrap();
    store
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

async fn post(
    app: &impl Service<actix_http::Request, Response = ServiceResponse, Error = actix_web::Error>,
    uri: &str,
    form: &[(&str, &str)],
) -> (StatusCode, String) {
    let body: String = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(form)
        .finish();
    let request = test::TestRequest::post()
        .uri(uri)
        .insert_header(("content-type", "application/x-www-form-urlencoded"))
        .set_payload(body)
        .to_request();
    let response = test::call_service(app, request).await;
    let status = response.status();
    let body = test::read_body(response).await;
    (status, String::from_utf8(body.to_vec()).unwrap())
}

/// The CSRF token a page's forms carry.
fn csrf(page: &str) -> String {
    let start = page
        .find("name=\"csrf\" value=\"")
        .expect("the page has an action form")
        + "name=\"csrf\" value=\"".len();
    page[start..start + page[start..].find('"').unwrap()].to_owned()
}

async fn status_of(store: &MemoryOutbox, id: &str) -> MessageStatus {
    store.get_message(id).await.unwrap().status
}

#[actix_web::test]
async fn overview_shows_counts_claims_and_the_last_hour() {
    let app = app(seeded().await, WebConfig::default()).await;
    let (status, page) = get(&app, "/outbox/").await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("id=\"count-dead_lettered\""), "{page}");
    assert!(page.contains("<b>1</b>dead-lettered"), "{page}");
    assert!(page.contains("<b>1</b>pending"), "{page}");
    assert!(page.contains("<svg"), "{page}");
    // SVG elements are not void in HTML: an unclosed one swallows the rest.
    assert!(page.contains("</line>"), "{page}");
    assert!(page.contains("1 dead-lettered"), "{page}");
    assert!(
        page.contains("http-equiv=\"refresh\" content=\"5\""),
        "{page}"
    );
    // Links are relative, so the dashboard works under any prefix.
    assert!(page.contains("href=\"messages?status=dead_lettered\""));
}

#[actix_web::test]
async fn the_bare_prefix_redirects_to_the_directory() {
    let app = app(seeded().await, WebConfig::default()).await;
    let response =
        test::call_service(&app, test::TestRequest::get().uri("/outbox").to_request()).await;
    assert_eq!(response.status(), StatusCode::PERMANENT_REDIRECT);
    assert_eq!(response.headers().get("location").unwrap(), "/outbox/");
}

#[actix_web::test]
async fn payloads_and_errors_render_as_text() {
    let app = app(seeded().await, WebConfig::default()).await;
    let (status, page) = get(&app, "/outbox/message?id=dead-1").await;
    assert_eq!(status, StatusCode::OK);
    assert!(!page.contains("<script>window"), "{page}");
    assert!(
        page.contains("&lt;script&gt;window.__xss=1&lt;/script&gt;"),
        "{page}"
    );
    assert!(page.contains("connection reset &lt;script&gt;"), "{page}");
    assert!(page.contains("app::SendError"));
    assert!(page.contains("4bf92f3577b34da6a3ce929d0e0e4736"), "{page}");
    assert!(
        page.contains("&quot;order&quot;: 42"),
        "pretty-printed payload: {page}"
    );

    let (_, list) = get(&app, "/outbox/messages?status=dead_lettered").await;
    assert!(!list.contains("<script>window"), "{list}");
    assert!(list.contains("broker said &lt;script&gt;"), "{list}");
    assert!(!list.contains("second line"), "only the first line: {list}");
}

#[actix_web::test]
async fn pages_forbid_scripts_other_than_their_own() {
    let app = app(seeded().await, WebConfig::default()).await;
    let response = test::call_service(
        &app,
        test::TestRequest::get()
            .uri("/outbox/message?id=dead-1")
            .to_request(),
    )
    .await;
    let policy = response
        .headers()
        .get("content-security-policy")
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    assert!(policy.contains("script-src 'nonce-"), "{policy}");
    assert!(!policy.contains("unsafe-inline';") || !policy.contains("script-src 'unsafe"));
}

#[actix_web::test]
async fn posts_without_the_csrf_token_change_nothing() {
    let store = seeded().await;
    let app = app(store.clone(), WebConfig::default()).await;
    let (status, page) = post(&app, "/outbox/requeue", &[("id", "dead-1")]).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(page.contains("no CSRF token"), "{page}");
    let (status, page) = post(
        &app,
        "/outbox/requeue",
        &[("id", "dead-1"), ("csrf", "forged")],
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(page.contains("CSRF token is wrong"), "{page}");
    assert_eq!(
        status_of(&store, "dead-1").await,
        MessageStatus::DeadLettered
    );
}

#[actix_web::test]
async fn requeue_one_dead_letter() {
    let store = seeded().await;
    let app = app(store.clone(), WebConfig::default()).await;
    let (_, page) = get(&app, "/outbox/message?id=dead-1").await;
    assert!(page.contains("data-confirm="), "{page}");
    let token = csrf(&page);
    let (status, page) = post(
        &app,
        "/outbox/requeue",
        &[("id", "dead-1"), ("csrf", &token)],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("Requeued 1 dead letter"), "{page}");
    let message = store.get_message("dead-1").await.unwrap();
    assert_eq!(message.status, MessageStatus::Pending);
    assert_eq!(message.attempts, 0);
    // Requeueing it again is refused the way the CLI refuses it.
    let (status, page) = post(
        &app,
        "/outbox/requeue",
        &[("id", "dead-1"), ("csrf", &token)],
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(page.contains("not dead-lettered"), "{page}");
}

#[actix_web::test]
async fn requeue_all_dead_letters_of_a_name() {
    let store = seeded().await;
    let app = app(store.clone(), WebConfig::default()).await;
    let (_, page) = get(&app, "/outbox/messages?status=dead_lettered").await;
    assert!(page.contains("type=\"checkbox\" name=\"id\" value=\"dead-1\""));
    let token = csrf(&page);
    let (status, page) = post(
        &app,
        "/outbox/requeue",
        &[("all", "1"), ("name", "other.name"), ("csrf", &token)],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("Requeued 0 dead letter"), "{page}");
    let (_, page) = post(
        &app,
        "/outbox/requeue",
        &[("all", "1"), ("name", "orders.created"), ("csrf", &token)],
    )
    .await;
    assert!(page.contains("Requeued 1 dead letter"), "{page}");
    assert_eq!(status_of(&store, "dead-1").await, MessageStatus::Pending);
}

#[actix_web::test]
async fn retry_now_makes_a_backed_off_message_due_and_refuses_live_claims() {
    let store = seeded().await;
    let app = app(store.clone(), WebConfig::default()).await;
    let (_, page) = get(&app, "/outbox/message?id=pending-1").await;
    assert!(page.contains("Retry now"), "{page}");
    let token = csrf(&page);
    let before = Utc::now();
    let (status, page) = post(
        &app,
        "/outbox/retry",
        &[("id", "pending-1"), ("csrf", &token)],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let message = store.get_message("pending-1").await.unwrap();
    assert!(message.available_at <= Utc::now() && message.available_at >= before);

    let claimed = store
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: 10,
            now: Utc::now(),
            lease: Duration::from_secs(600),
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
            queues: Vec::new(),
            durable: true,
        })
        .await
        .unwrap();
    assert_eq!(claimed.claimed.len(), 1);
    let (status, page) = post(
        &app,
        "/outbox/retry",
        &[("id", "pending-1"), ("csrf", &token)],
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(page.contains("wait for its lease to end"), "{page}");
    let (_, page) = get(&app, "/outbox/message?id=pending-1").await;
    assert!(page.contains("(live claim)"), "{page}");
    assert!(
        !page.contains("Retry now"),
        "no action under a live claim: {page}"
    );
}

#[actix_web::test]
async fn purge_counts_first_then_deletes_the_same_messages() {
    let store = seeded().await;
    let app = app(store.clone(), WebConfig::default()).await;
    let (_, page) = get(&app, "/outbox/purge").await;
    assert!(page.contains("Count (dry run)"));
    // Everything settled before one second from now.
    let (status, page) = get(&app, "/outbox/purge?older_than=0s&status=both").await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("1 message(s) last changed before"), "{page}");
    assert_eq!(store.stats(Utc::now()).await.unwrap().total(), 2, "dry run");
    let token = csrf(&page);
    let horizon = {
        let at = page.find("name=\"horizon\" value=\"").unwrap() + 22;
        page[at..at + page[at..].find('"').unwrap()].to_owned()
    };
    let (status, page) = post(
        &app,
        "/outbox/purge",
        &[("status", "both"), ("horizon", &horizon), ("csrf", &token)],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("Purged 1 message"), "{page}");
    let stats = store.stats(Utc::now()).await.unwrap();
    assert_eq!((stats.dead_lettered, stats.pending), (0, 1));

    let (status, page) = get(&app, "/outbox/purge?older_than=soon").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(page.contains("not a duration"), "{page}");
    let (status, page) = post(
        &app,
        "/outbox/purge",
        &[
            ("status", "pending"),
            ("horizon", &horizon),
            ("csrf", &token),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        page.contains("only delivered, dead_lettered, cancelled or both"),
        "{page}"
    );
}

#[actix_web::test]
async fn read_only_shows_no_forms_and_refuses_posts() {
    let store = seeded().await;
    let app = app(store.clone(), WebConfig::default().read_only(true)).await;
    let (_, page) = get(&app, "/outbox/message?id=dead-1").await;
    assert!(!page.contains("<form method=\"post\""), "{page}");
    let (_, list) = get(&app, "/outbox/messages?status=dead_lettered").await;
    assert!(!list.contains("<form method=\"post\""), "{list}");
    let (_, overview) = get(&app, "/outbox/").await;
    assert!(overview.contains("id=\"queue-default\""), "{overview}");
    assert!(!overview.contains("<form method=\"post\""), "{overview}");
    let (status, _) = post(&app, "/outbox/pause", &[("queue", "default")]).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = post(&app, "/outbox/cancel", &[("id", "pending-1")]).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(status_of(&store, "pending-1").await, MessageStatus::Pending);
    let (status, page) = post(&app, "/outbox/requeue", &[("id", "dead-1")]).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(page.contains("read-only"), "{page}");
    assert_eq!(
        status_of(&store, "dead-1").await,
        MessageStatus::DeadLettered
    );
}

#[actix_web::test]
async fn the_auth_token_is_required_when_set() {
    let app = app(seeded().await, WebConfig::default().auth_token("s3cret")).await;
    let response =
        test::call_service(&app, test::TestRequest::get().uri("/outbox/").to_request()).await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert!(
        response
            .headers()
            .get("www-authenticate")
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("Basic")
    );
    for (header, expected) in [
        ("Bearer s3cret", StatusCode::OK),
        ("Bearer wrong", StatusCode::UNAUTHORIZED),
        // admin:s3cret
        ("Basic YWRtaW46czNjcmV0", StatusCode::OK),
        // admin:nope
        ("Basic YWRtaW46bm9wZQ==", StatusCode::UNAUTHORIZED),
        ("Basic !!!", StatusCode::UNAUTHORIZED),
    ] {
        let request = test::TestRequest::get()
            .uri("/outbox/messages")
            .insert_header(("authorization", header))
            .to_request();
        let response = test::call_service(&app, request).await;
        assert_eq!(response.status(), expected, "{header}");
    }
    // POSTs too, before anything else is looked at.
    let (status, _) = post(&app, "/outbox/requeue", &[("id", "dead-1")]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[actix_web::test]
async fn lists_filter_and_page_by_keyset() {
    let store = seeded().await;
    let now = Utc::now();
    for i in 0..5 {
        store
            .enqueue(
                NewMessage::new(
                    MessageKind::Event,
                    "page.me",
                    Payload::from(serde_json::json!({ "i": i })),
                )
                .with_id(format!("p-{i}"))
                .at(now + chrono::Duration::milliseconds(i)),
            )
            .await
            .unwrap();
    }
    let app = app(store, WebConfig::default().page_size(2)).await;
    let mut seen = Vec::new();
    let mut uri = "/outbox/messages?status=pending&name=page.me".to_owned();
    loop {
        let (status, page) = get(&app, &uri).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        for i in 0..5 {
            if page.contains(&format!(">p-{i}</a>")) {
                seen.push(i);
            }
        }
        let Some(at) = page.find("id=\"next\" href=\"") else {
            break;
        };
        let at = at + "id=\"next\" href=\"".len();
        let href = page[at..at + page[at..].find('"').unwrap()].replace("&amp;", "&");
        uri = format!("/outbox/{href}");
    }
    assert_eq!(seen, vec![0, 1, 2, 3, 4]);

    let (_, jobs) = get(&app, "/outbox/messages?status=pending&kind=job").await;
    assert!(
        jobs.contains(">pending-1</a>") && !jobs.contains(">p-0</a>"),
        "{jobs}"
    );
    let (status, page) = get(&app, "/outbox/messages?kind=sms").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(page.contains("give event or job"), "{page}");
    let (status, page) = get(&app, "/outbox/messages?from=yesterday").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(page.contains("not a time"), "{page}");
    let future = (now + chrono::Duration::hours(2)).to_rfc3339();
    let (_, page) = get(
        &app,
        &format!(
            "/outbox/messages?from={}",
            form_urlencoded::byte_serialize(future.as_bytes()).collect::<String>()
        ),
    )
    .await;
    assert!(page.contains("No messages match."), "{page}");
}

#[actix_web::test]
async fn unknown_ids_and_pages_are_not_found() {
    let app = app(seeded().await, WebConfig::default()).await;
    let (status, page) = get(&app, "/outbox/message?id=%3Cb%3Enope").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(page.contains("&lt;b&gt;nope"), "{page}");
    let (status, _) = get(&app, "/outbox/nothing-here").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[actix_web::test]
async fn blocked_keys_show_on_the_overview_and_lists_filter_by_key() {
    let store = MemoryOutbox::new();
    let now = Utc::now();
    for (id, key) in [
        ("k1-a", "order-1"),
        ("k1-b", "order-1"),
        ("k2-a", "order-2"),
    ] {
        let message = NewMessage::new(
            MessageKind::Event,
            "orders.step",
            Payload::from(serde_json::json!({ "id": id })),
        )
        .with_id(id)
        .with_options(
            outbox::EnqueueOptions::new()
                .ordering_key(key)
                .max_attempts(1),
        )
        .at(now);
        store.enqueue(message).await.unwrap();
    }
    // The head of order-1 fails its only attempt: the key is blocked.
    let claimed = store
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: 10,
            now,
            lease: Duration::from_secs(60),
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
            queues: Vec::new(),
            durable: true,
        })
        .await
        .unwrap();
    let head = claimed.claimed.iter().find(|m| m.id == "k1-a").unwrap();
    store
        .mark_failed(MarkFailed {
            id: head.id.clone(),
            claim_token: head.claim_token.clone(),
            now,
            error: ErrorRecord::new("test", "boom"),
            dead_letter: true,
            retry_at: None,
        })
        .await
        .unwrap();

    let app = app(store, WebConfig::default()).await;
    let (_, page) = get(&app, "/outbox/").await;
    assert!(page.contains("<td id=\"blocked-keys\">1</td>"), "{page}");
    assert!(page.contains("href=\"messages?key=order-1\""), "{page}");
    assert!(page.contains("href=\"message?id=k1-a\""), "{page}");

    let (status, page) = get(&app, "/outbox/messages?key=order-2").await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("k2-a"), "{page}");
    assert!(!page.contains("k1-b"), "{page}");
    let (_, page) = get(&app, "/outbox/message?id=k1-b").await;
    assert!(page.contains("Ordering key"), "{page}");
    assert!(page.contains("0 of 1"), "its own cap: {page}");
}

/// A claim of up to ten from `queue` alone, now.
async fn claim_from(store: &MemoryOutbox, queue: &str) -> usize {
    store
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: 10,
            now: Utc::now(),
            lease: Duration::from_secs(600),
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
            queues: vec![outbox::QueueLimit::new(queue, 10)],
            durable: true,
        })
        .await
        .unwrap()
        .claimed
        .len()
}

#[actix_web::test]
async fn a_queue_is_paused_and_resumed_from_the_overview() {
    let store = seeded().await;
    let mail = NewMessage::new(
        MessageKind::Job,
        "emails.send",
        Payload::from(serde_json::json!({ "to": "b@example.com" })),
    )
    .with_id("mail-1")
    .with_queue("mail");
    store.enqueue(mail).await.unwrap();
    let app = app(store.clone(), WebConfig::default()).await;
    let (_, page) = get(&app, "/outbox/").await;
    assert!(page.contains("id=\"queue-mail\""), "{page}");
    assert!(page.contains("id=\"queue-default\""), "{page}");
    assert!(page.contains("class=\"pause\""), "{page}");
    assert!(!page.contains("class=\"paused\""), "{page}");
    let token = csrf(&page);

    // Without the token nothing is paused.
    let (status, _) = post(&app, "/outbox/pause", &[("queue", "mail")]).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, page) = post(
        &app,
        "/outbox/pause",
        &[("queue", "mail"), ("csrf", &token)],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("is paused"), "{page}");
    let (_, page) = post(
        &app,
        "/outbox/pause",
        &[("queue", "mail"), ("csrf", &token)],
    )
    .await;
    assert!(page.contains("was already paused"), "{page}");
    assert_eq!(claim_from(&store, "mail").await, 0);

    let (_, page) = get(&app, "/outbox/").await;
    assert!(page.contains("class=\"paused\""), "{page}");
    assert!(page.contains("class=\"resume\""), "{page}");
    let (status, page) = post(
        &app,
        "/outbox/resume",
        &[("queue", "mail"), ("csrf", &token)],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("is served again"), "{page}");
    assert_eq!(claim_from(&store, "mail").await, 1);

    // A name no queue could have is refused before the store is asked.
    let (status, page) = post(
        &app,
        "/outbox/pause",
        &[("queue", "no spaces"), ("csrf", &token)],
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{page}");
    let (status, _) = post(&app, "/outbox/pause", &[("csrf", &token)]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[actix_web::test]
async fn cancel_a_pending_message_and_ask_a_claimed_one_to_stop() {
    let store = seeded().await;
    let app = app(store.clone(), WebConfig::default()).await;
    let (_, page) = get(&app, "/outbox/message?id=pending-1").await;
    assert!(page.contains("id=\"queue\">default<"), "{page}");
    assert!(page.contains("id=\"cancel\""), "{page}");
    let token = csrf(&page);
    let (status, _) = post(&app, "/outbox/cancel", &[("id", "pending-1")]).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(status_of(&store, "pending-1").await, MessageStatus::Pending);
    let (status, page) = post(
        &app,
        "/outbox/cancel",
        &[("id", "pending-1"), ("csrf", &token)],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("is cancelled"), "{page}");
    assert_eq!(
        status_of(&store, "pending-1").await,
        MessageStatus::Cancelled
    );
    let (_, page) = get(&app, "/outbox/message?id=pending-1").await;
    assert!(!page.contains("id=\"cancel\""), "{page}");
    let (_, page) = get(&app, "/outbox/").await;
    assert!(page.contains("id=\"count-cancelled\""), "{page}");
    let (_, list) = get(&app, "/outbox/messages?status=cancelled").await;
    assert!(list.contains("pending-1"), "{list}");

    // A settled message is refused, the way the CLI refuses it.
    let (status, page) = post(
        &app,
        "/outbox/cancel",
        &[("id", "pending-1"), ("csrf", &token)],
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{page}");
    let (status, _) = post(
        &app,
        "/outbox/cancel",
        &[("id", "dead-1"), ("csrf", &token)],
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT);

    // A claimed message is asked to stop; its status waits for its handler.
    let live = NewMessage::new(
        MessageKind::Job,
        "emails.send",
        Payload::from(serde_json::json!({ "to": "c@example.com" })),
    )
    .with_id("live-1");
    store.enqueue(live).await.unwrap();
    assert_eq!(claim_from(&store, "default").await, 1);
    let (status, page) = post(
        &app,
        "/outbox/cancel",
        &[("id", "live-1"), ("csrf", &token)],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("is being delivered"), "{page}");
    assert_eq!(status_of(&store, "live-1").await, MessageStatus::Claimed);
    let (_, page) = get(&app, "/outbox/message?id=live-1").await;
    assert!(page.contains("id=\"cancel-requested\""), "{page}");
    assert!(!page.contains("id=\"cancel\""), "{page}");
}
