//! Generated requests through the dashboard mounted over a SQLite outbox:
//! query strings, form bodies, methods, paths and credentials. Bad input is
//! answered 2xx, 3xx or 4xx, never 5xx and never a panic, and no request
//! writes outside the outbox's table.
//!
//! Every target counts its cases; CI adds the counts of all packages up.

#[path = "../../tests/fuzzing/mod.rs"]
mod fuzzing;

use std::fmt::Debug;
use std::path::PathBuf;
use std::time::Duration;

use actix_web::App;
use actix_web::dev::{Service, ServiceResponse};
use actix_web::test as served;
use base64::Engine as _;
use chrono::Utc;
use outbox::sqlx;
use outbox::{
    ClaimBatch, ErrorRecord, MarkDelivered, MarkFailed, MessageKind, NewMessage, OutboxStore,
    Payload, SqliteOutbox,
};
use outbox_web::WebConfig;
use proptest::prelude::*;

use fuzzing::{ensure, fuzz};

const TOKEN: &str = "s3cret";

/// One generated request.
#[derive(Debug, Clone)]
struct Request {
    /// Whether the dashboard asks for a token and refuses changes.
    guarded: bool,
    method: &'static str,
    path: String,
    query: String,
    content_type: Option<&'static str>,
    body: Vec<u8>,
    authorization: Option<Vec<u8>>,
}

/// A value an operator, a stale link or an attacker might send.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "pending",
            "claimed",
            "delivered",
            "dead_lettered",
            "event",
            "job",
            "dead-1",
            "pending-1",
            "done-1",
            "bad-1",
            "7d",
            "0s",
            "-1d",
            "400d",
            "1h 30m",
            "2026-01-31T12:00:00Z",
            "2026-01-31T12:00",
            "2026-01-31 12:00:00",
            "+262143-12-31T23:59:59Z",
            "-262144-01-01T00:00:00Z",
            "9999-12-31T23:59:59.999999999+14:00",
            "1970-01-01T00:00",
            "<script>alert(1)</script>",
            "\"",
            "'",
            "",
            " ",
            "on",
            "1",
        ])
        .prop_map(str::to_owned),
        "[0-9T:+-]{0,25}",
        ".{0,16}",
    ]
}

/// A field name: the dashboard's and others.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => prop::sample::select(vec![
            "status", "name", "kind", "key", "from", "to", "after_at", "after_id", "id",
            "older_than", "horizon", "all", "csrf", "",
        ])
        .prop_map(str::to_owned),
        1 => ".{0,6}",
    ]
}

/// Pairs encoded as a form would send them, or raw text with escapes that
/// decode to bytes that are not UTF-8.
fn encoded() -> impl Strategy<Value = String> {
    let pairs = prop::collection::vec((key(), value()), 0..6).prop_map(|pairs| {
        form_urlencoded::Serializer::new(String::new())
            .extend_pairs(pairs)
            .finish()
    });
    let raw = prop::collection::vec(
        prop_oneof![
            "[A-Za-z0-9=&_.~+-]{1,6}",
            any::<u8>().prop_map(|b| format!("%{b:02X}")),
            Just("%".to_owned()),
            Just("%zz".to_owned()),
        ],
        0..8,
    )
    .prop_map(|parts| parts.concat());
    prop_oneof![3 => pairs, 1 => raw]
}

fn request() -> impl Strategy<Value = Request> {
    let route = prop::sample::select(vec![
        ("GET", "/"),
        ("GET", "/messages"),
        ("GET", "/messages"),
        ("GET", "/message"),
        ("GET", "/purge"),
        ("POST", "/requeue"),
        ("POST", "/retry"),
        ("POST", "/purge"),
    ])
    .prop_map(|(method, path)| (method, path.to_owned()));
    let stray = (
        prop::sample::select(vec!["GET", "POST", "HEAD", "PUT", "DELETE"]),
        prop_oneof![
            prop::sample::select(vec![
                "",
                "/nope",
                "//",
                "/%2e%2e/",
                "/messages/",
                "/message%00",
                "/requeue",
            ])
            .prop_map(str::to_owned),
            "(/[a-z%0-9.]{0,6}){0,3}",
        ],
    );
    let method_and_path = prop_oneof![4 => route, 1 => stray];
    let content_type = prop::option::of(prop::sample::select(vec![
        "application/x-www-form-urlencoded",
        "application/x-www-form-urlencoded; charset=utf-8",
        "application/json",
        "text/plain",
        "multipart/form-data; boundary=x",
        "x/y;;=",
    ]));
    let body = prop_oneof![
        4 => encoded().prop_map(String::into_bytes),
        1 => prop::collection::vec(any::<u8>(), 0..40),
    ];
    let authorization = prop::option::of(prop_oneof![
        4 => Just(format!("Bearer {TOKEN}").into_bytes()),
        1 => value().prop_map(|v| format!("Bearer {v}").into_bytes()),
        1 => value().prop_map(|v| {
            let basic = base64::engine::general_purpose::STANDARD.encode(format!("{v}:{TOKEN}"));
            format!("Basic {basic}").into_bytes()
        }),
        1 => value().prop_map(|v| format!("Basic {v}").into_bytes()),
        1 => prop::collection::vec(32u8..127, 0..20),
    ]);
    (
        prop::bool::weighted(0.25),
        method_and_path,
        encoded(),
        content_type,
        body,
        authorization,
    )
        .prop_map(
            |(guarded, (method, path), query, content_type, body, authorization)| Request {
                guarded,
                method,
                path,
                query,
                content_type,
                body,
                authorization,
            },
        )
}

/// An outbox in every state, with rows another writer broke, beside a
/// sentinel table.
async fn seeded(url: &str) -> SqliteOutbox {
    let store = SqliteOutbox::connect(url).await.expect("a store");
    let now = Utc::now();
    for (id, kind, key) in [
        ("dead-1", MessageKind::Event, Some("k")),
        ("done-1", MessageKind::Job, None),
        ("pending-1", MessageKind::Event, Some("k")),
    ] {
        let mut message = NewMessage::new(
            kind,
            "orders.created",
            Payload::from(serde_json::json!({ "note": "<script>x</script>" })),
        )
        .with_id(id)
        .at(now - chrono::Duration::hours(2));
        if let Some(key) = key {
            message = message.with_ordering_key(key);
        }
        store.enqueue(message).await.expect("a message");
    }
    // The first of key `k` and the message without a key.
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
        .expect("a claim");
    for message in claimed.claimed {
        let (id, claim_token) = (message.id.clone(), message.claim_token.clone());
        if id == "dead-1" {
            store
                .mark_failed(MarkFailed {
                    id,
                    claim_token,
                    error: ErrorRecord::new("app::Error", "<b>broken</b>"),
                    dead_letter: true,
                    now,
                    retry_at: None,
                })
                .await
                .expect("a dead letter");
        } else {
            store
                .mark_delivered(MarkDelivered {
                    id,
                    claim_token,
                    now,
                    delete: false,
                })
                .await
                .expect("a delivery");
        }
    }
    sqlx::raw_sql(
        "CREATE TABLE sentinel (id INTEGER PRIMARY KEY, note TEXT NOT NULL); \
         INSERT INTO sentinel (note) VALUES ('one'), ('two'); \
         INSERT INTO outbox (id, kind, name, payload, trace, max_attempts, available_at, \
             created_at, updated_at) \
         VALUES ('bad-1', 'event', '<i>x</i>', 'not json', '{broken', 3, 0, 1, 1), \
                ('bad-2', 'job', 'y', '{}', NULL, 3, 'tomorrow', 9223372036854775807, 2);",
    )
    .execute(store.pool())
    .await
    .expect("the sentinel and the broken rows");
    store
}

/// The sentinel's rows and the database's schema.
async fn untouched(store: &SqliteOutbox) -> (Vec<(i64, String)>, Vec<(String, String)>) {
    let rows = sqlx::query_as("SELECT id, note FROM sentinel ORDER BY id")
        .fetch_all(store.pool())
        .await
        .expect("the sentinel");
    let schema = sqlx::query_as("SELECT type, name FROM sqlite_master ORDER BY name")
        .fetch_all(store.pool())
        .await
        .expect("the schema");
    (rows, schema)
}

async fn call(
    app: &impl Service<actix_http::Request, Response = ServiceResponse, Error = actix_web::Error>,
    request: served::TestRequest,
) -> (u16, String) {
    let response = served::call_service(app, request.to_request()).await;
    let status = response.status().as_u16();
    let body = served::read_body(response).await;
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[test]
fn requests() {
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("fuzz-web-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}/outbox.db", dir.display());
    let system = actix_rt::System::new();
    let (store, open, guarded, csrf, before) = system.block_on(async {
        let store = seeded(&url).await;
        let open = served::init_service(
            App::new()
                .service(outbox_web::scope(store.clone(), WebConfig::default()).at("/outbox")),
        )
        .await;
        let config = WebConfig::default().auth_token(TOKEN).read_only(true);
        let guarded = served::init_service(
            App::new().service(outbox_web::scope(store.clone(), config).at("/outbox")),
        )
        .await;
        let (_, page) = call(
            &open,
            served::TestRequest::get().uri("/outbox/messages?status=dead_lettered"),
        )
        .await;
        let start = page.find("name=\"csrf\" value=\"").expect("a form") + 19;
        let csrf = page[start..start + page[start..].find('"').unwrap()].to_owned();
        let before = untouched(&store).await;
        (store, open, guarded, csrf, before)
    });
    // What the dashboard answered, so a run shows the actions were reached.
    let answers = std::cell::RefCell::new(std::collections::BTreeMap::<u16, u64>::new());
    fuzz("requests", 15_000, request(), |request| {
        let mut uri = format!("/outbox{}", request.path);
        if !request.query.is_empty() {
            uri = format!("{uri}?{}", request.query);
        }
        // Only what reaches a server as a request line is under test.
        if uri.parse::<actix_web::http::Uri>().is_err() {
            return Ok(());
        }
        let mut body = request.body.clone();
        // Half the forms carry the right CSRF token, so the actions run.
        if request.body.len() % 2 == 0 {
            body.extend_from_slice(format!("&csrf={csrf}").as_bytes());
        }
        let mut call_request = served::TestRequest::default()
            .method(request.method.parse().unwrap())
            .uri(&uri)
            .set_payload(body);
        if let Some(content_type) = request.content_type {
            call_request = call_request.insert_header(("content-type", content_type));
        }
        if let Some(authorization) = &request.authorization
            && let Ok(value) = actix_web::http::header::HeaderValue::from_bytes(authorization)
        {
            call_request = call_request.insert_header(("authorization", value));
        }
        system.block_on(async {
            let (status, page) = if request.guarded {
                call(&guarded, call_request).await
            } else {
                call(&open, call_request).await
            };
            *answers.borrow_mut().entry(status).or_default() += 1;
            ensure(status < 500, || {
                format!("{} {uri} answered {status}: {page}", request.method)
            })?;
            ensure(!page.contains("<script>x</script>"), || {
                format!("{} {uri} rendered a stored script: {page}", request.method)
            })?;
            let after = untouched(&store).await;
            ensure(after == before, || {
                format!("{} {uri} wrote outside the outbox", request.method)
            })
        })
    });
    println!("fuzz: outbox-web answers by status: {:?}", answers.borrow());
    let _ = std::fs::remove_dir_all(&dir);
}
