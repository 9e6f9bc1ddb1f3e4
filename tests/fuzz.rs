//! Generated input through everything a user or a database hands the core:
//! the JSON configurations and their humantime durations, database URLs,
//! table names, new messages, and rows written behind the store's back.
//! Each parser answers a value or a typed error, never a panic, and nothing
//! is written outside the outbox's own table.
//!
//! Every target counts its cases (see [`fuzz`]); CI adds the counts of all
//! packages up. A failing case is shrunk and printed by proptest: keep it as
//! a plain regression test at the end of this file once the parser is fixed.
//!
//! The PostgreSQL targets need `DATABASE_URL` when the `postgres` feature is
//! on: `scripts/with-postgres cargo test -p outbox --all-features --test fuzz`.

mod fuzzing;

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use outbox::{
    AnyOutbox, ClaimBatch, ClaimedMessage, DrainConfig, EnqueueOptions, Error, ErrorRecord,
    ListMessages, MAX_ERROR_RECORD_BYTES, MarkDelivered, MarkFailed, MessageKind, MessageStatus,
    NewMessage, OnDeadLetter, OpenMode, OutboxAdmin, OutboxMessage, OutboxStore, Payload,
    PurgeMessages, ReleaseClaim, RenewClaim, RequeueDeadLetters, RetentionConfig, RetryNow,
    RetryPolicy, SettlementConfig, SkipDeadLetter, SqliteOutbox, TableName, TraceCarrier,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::Value;
use sqlx::sqlite::{SqlitePool, SqlitePoolOptions};

use fuzzing::{ensure, fuzz};

// ---------------------------------------------------------------------------
// The harness: a runtime (`fuzzing` runs, counts and records).

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

/// A fixed point on the caller's clock; stores are handed `now` explicitly.
fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2030, 1, 1, 12, 0, 0).unwrap()
}

// ---------------------------------------------------------------------------
// Generators.

/// Text a person might type for a duration, valid or nearly so.
fn duration_text() -> impl Strategy<Value = String> {
    let unit = prop::sample::select(vec![
        "", "ns", "us", "µs", "ms", "s", "sec", "secs", "m", "min", "mins", "h", "hr", "hours",
        "d", "days", "w", "weeks", "M", "months", "y", "years", "x", "S", "msec",
    ]);
    let number = prop_oneof![
        (0u64..100).prop_map(|n| n.to_string()),
        any::<u64>().prop_map(|n| n.to_string()),
        "[0-9]{15,30}",
        Just("-1".to_owned()),
        Just("1.5".to_owned()),
        Just(String::new()),
    ];
    let part = (number, unit).prop_map(|(n, u)| format!("{n}{u}"));
    prop_oneof![
        4 => prop::collection::vec(part, 1..4).prop_map(|parts| parts.join(" ")),
        1 => ".{0,12}",
    ]
}

/// A JSON scalar near the values configurations take.
fn json_scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (0u64..10).prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        (0.0f64..3.0).prop_map(Value::from),
        duration_text().prop_map(Value::String),
        prop::sample::select(vec![
            "block",
            "skip",
            "event",
            "job",
            "pending",
            "dead_lettered"
        ])
        .prop_map(|s| Value::String(s.to_owned())),
    ]
}

const CONFIG_KEYS: &[&str] = &[
    "batch_size",
    "concurrency",
    "prefetch",
    "claims_in_flight",
    "lease",
    "heartbeat",
    "max_active",
    "retry",
    "settlement",
    "every",
    "delivery_arbiters",
    "ordering",
    "retention",
    "unknown",
];

const NESTED_KEYS: &[&str] = &[
    "max_attempts",
    "initial_delay",
    "multiplier",
    "max_delay",
    "jitter",
    "seed",
    "attempts",
    "delay",
    "on_dead_letter",
    "delivered",
    "dead_lettered",
    "delete_on_delivery",
    "batch_size",
    "every",
    "vacuum_after",
    "type",
    "message",
    "causes",
    "truncated",
    "traceparent",
    "tracestate",
    "bogus",
];

/// An object with keys drawn from `keys`.
fn object_of(
    keys: &'static [&'static str],
    value: impl Strategy<Value = Value>,
) -> impl Strategy<Value = Value> {
    prop::collection::vec((prop::sample::select(keys), value), 0..7).prop_map(|pairs| {
        Value::Object(pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
    })
}

/// A JSON value of any shape, a few levels deep.
fn json_any() -> impl Strategy<Value = Value> {
    json_scalar().prop_recursive(3, 24, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            object_of(NESTED_KEYS, inner),
        ]
    })
}

/// A configuration document: the right keys with plausible or hostile
/// values, nested sections, and sometimes the text cut or spliced so it is
/// no longer JSON.
fn config_text(keys: &'static [&'static str]) -> impl Strategy<Value = String> {
    let value = prop_oneof![
        3 => json_scalar(),
        2 => object_of(NESTED_KEYS, json_scalar()),
        1 => json_any(),
    ];
    let document = object_of(keys, value).prop_map(|v| v.to_string()).boxed();
    prop_oneof![
        6 => document.clone(),
        2 => (document, any::<prop::sample::Index>(), ".{0,3}").prop_map(|(text, at, splice)| {
            let mut cut = at.index(text.len() + 1);
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            format!("{}{splice}", &text[..cut])
        }),
        1 => ".{0,40}",
    ]
}

// ---------------------------------------------------------------------------
// Configurations.

/// What the runtime does with a configuration it was handed, once valid:
/// none of it may panic.
fn use_config(config: &DrainConfig) {
    let heartbeat = config.heartbeat();
    assert!(
        heartbeat < config.lease,
        "a valid heartbeat is under the lease"
    );
    outbox::kit::lease_end(t0(), config.lease).expect("a valid lease ends");
    use_retry(&config.retry);
    let _ = config.retention.delivered_horizon();
    let _ = config.retention.is_enabled();
}

fn use_retry(retry: &RetryPolicy) {
    let cap = retry.attempt_cap();
    for attempts in [0, 1, 2, 30, 1_000, cap, u32::MAX] {
        let delay = retry.delay(attempts, "a-message-id");
        assert!(delay <= retry.nominal_delay(attempts));
    }
    let _ = retry.shortest_total_delay(cap.min(2_000));
}

#[test]
fn drain_config_json() {
    fuzz("drain_config", 30_000, config_text(CONFIG_KEYS), |text| {
        let Ok(config) = serde_json::from_str::<DrainConfig>(&text) else {
            return Ok(());
        };
        match config.validate() {
            Ok(()) => use_config(&config),
            Err(error) => {
                ensure(!error.violations.is_empty(), || {
                    "an error without a violation".into()
                })?;
                for violation in &error.violations {
                    ensure(!violation.field.is_empty(), || {
                        format!("a violation names no field: {violation:?}")
                    })?;
                }
            }
        }
        // What was read writes back and reads the same.
        let again = serde_json::to_string(&config).expect("a config serializes");
        let back: DrainConfig = serde_json::from_str(&again)
            .map_err(|e| TestCaseError::fail(format!("{again} does not read back: {e}")))?;
        ensure(format!("{back:?}") == format!("{config:?}"), || {
            format!("{again} reads back as {back:?}")
        })
    });
}

#[test]
fn other_json_configs() {
    fuzz("sections", 12_000, config_text(NESTED_KEYS), |text| {
        if let Ok(retry) = serde_json::from_str::<RetryPolicy>(&text) {
            let config = DrainConfig {
                retry: retry.clone(),
                ..DrainConfig::default()
            };
            if config.validate().is_ok() {
                use_retry(&retry);
            }
        }
        if let Ok(settlement) = serde_json::from_str::<SettlementConfig>(&text) {
            let _ = DrainConfig {
                settlement,
                ..DrainConfig::default()
            }
            .validate();
        }
        if let Ok(retention) = serde_json::from_str::<RetentionConfig>(&text) {
            let _ = DrainConfig {
                retention,
                ..DrainConfig::default()
            }
            .validate();
        }
        let _ = serde_json::from_str::<OnDeadLetter>(&text);
        let _ = serde_json::from_str::<MessageStatus>(&text);
        let _ = serde_json::from_str::<MessageKind>(&text);
        let _ = serde_json::from_str::<OutboxMessage>(&text);
        let _ = serde_json::from_str::<ClaimedMessage>(&text);
        if let Ok(carrier) = serde_json::from_str::<TraceCarrier>(&text) {
            use_carrier(&carrier);
        }
        let record = ErrorRecord::from_json(&text).bounded();
        ensure(record.to_json().len() <= MAX_ERROR_RECORD_BYTES, || {
            format!("a bounded record is {} bytes", record.to_json().len())
        })?;
        if let Ok(payload) = Payload::from_json(text.clone()) {
            let value: Value = serde_json::from_str(&text).expect("the payload was JSON");
            ensure(payload.to_value() == value, || "a payload changed".into())?;
        }
        Ok(())
    });
}

fn use_carrier(carrier: &TraceCarrier) {
    let span = tracing::info_span!("fuzz");
    let _ = carrier.set_parent_of(&span);
    #[cfg(feature = "opentelemetry")]
    let _ = carrier.to_context();
}

#[test]
fn words_and_durations() {
    let word = prop_oneof![
        prop::sample::select(vec![
            "pending",
            "claimed",
            "delivered",
            "dead_lettered",
            "event",
            "job",
            "block",
            "skip",
            "Pending",
            "dead-lettered",
            "",
        ])
        .prop_map(str::to_owned),
        ".{0,16}",
        duration_text(),
    ];
    fuzz("words", 15_000, word, |text| {
        let _ = text.parse::<MessageStatus>();
        let _ = text.parse::<MessageKind>();
        let _ = text.parse::<OnDeadLetter>();
        // The durations of every JSON config go through humantime.
        let json = serde_json::json!({ "lease": text, "heartbeat": text }).to_string();
        if let Ok(config) = serde_json::from_str::<DrainConfig>(&json)
            && config.validate().is_ok()
        {
            use_config(&config);
        }
        if let Ok(duration) = humantime::parse_duration(&text) {
            let _ = humantime::format_duration(duration).to_string();
        }
        Ok(())
    });
}

// ---------------------------------------------------------------------------
// Table names and URLs.

/// A table name: valid identifiers, qualified or not, and hostile text.
fn table_name() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[A-Za-z_][A-Za-z0-9_]{0,50}",
        2 => "(main|temp|[a-z]{1,6})\\.[A-Za-z_][A-Za-z0-9_]{0,10}",
        2 => prop::sample::select(vec![
            "outbox\"; DROP TABLE sentinel; --",
            "sentinel",
            "sqlite_master",
            "sqlite_schema",
            "sqlite_sequence",
            "main.sentinel",
            "outbox_migrations",
            "x\" (a); --",
            "x'",
            "a..b",
            ".",
            "a.b.c",
            "\u{0}",
            "ünïcode",
            "outbox ",
            " outbox",
            "1outbox",
        ])
        .prop_map(str::to_owned),
        2 => "[A-Za-z0-9_.;\"'` \\-\u{0}()]{0,20}",
        1 => ".{0,60}",
    ]
}

/// Every object of a SQLite database's schema, and the sentinel's rows.
async fn schema(pool: &SqlitePool) -> (BTreeSet<(String, String, String)>, Vec<(i64, String)>) {
    let objects: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT type, name, COALESCE(sql, '') FROM sqlite_master \
         UNION ALL SELECT type, name, COALESCE(sql, '') FROM sqlite_temp_master",
    )
    .fetch_all(pool)
    .await
    .expect("the schema reads");
    let rows = sqlx::query_as("SELECT id, note FROM sentinel ORDER BY id")
        .fetch_all(pool)
        .await
        .expect("the sentinel reads");
    (objects.into_iter().collect(), rows)
}

/// A database of one connection with a sentinel table beside the outbox.
async fn sentinel_database() -> SqlitePool {
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect("sqlite::memory:")
        .await
        .expect("an in-memory database");
    sqlx::raw_sql(
        "CREATE TABLE sentinel (id INTEGER PRIMARY KEY, note TEXT NOT NULL); \
         CREATE INDEX sentinel_note ON sentinel (note); \
         INSERT INTO sentinel (note) VALUES ('one'), ('two');",
    )
    .execute(&pool)
    .await
    .expect("the sentinel");
    pool
}

#[test]
fn table_names() {
    let rt = runtime();
    // A lazy pool needs a runtime to drop into.
    let _entered = rt.enter();
    fuzz("table_names", 6_000, table_name(), |text| {
        let parsed = TableName::parse(&text);
        let Ok(name) = parsed else {
            ensure(
                matches!(parsed, Err(Error::InvalidTableName { ref name, .. }) if *name == text),
                || format!("{text:?} refused with {parsed:?}"),
            )?;
            // Every way of naming a table refuses it alike, before any SQL.
            let pool = SqlitePool::connect_lazy("sqlite::memory:").expect("a lazy pool");
            ensure(SqliteOutbox::builder(pool).table(&text).is_err(), || {
                format!("the builder took {text:?}")
            })?;
            return Ok(());
        };
        // Only identifier characters, each part quoted once.
        ensure(
            text.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.'),
            || format!("{text:?} was taken"),
        )?;
        ensure(name.to_string() == text, || {
            format!("{text:?} shows as {name}")
        })?;
        let quotes = name.quoted().matches('"').count();
        ensure(
            quotes == if name.schema().is_some() { 4 } else { 2 },
            || format!("{text:?} quotes as {}", name.quoted()),
        )?;
        rt.block_on(set_up_table(&text, &name))
    });
}

/// Set up the outbox table `text` beside a sentinel table, enqueue into it
/// and read it: the sentinel's rows and schema stay as they were, and
/// every new schema object is the table or named after it.
async fn set_up_table(text: &str, name: &TableName) -> Result<(), TestCaseError> {
    let pool = sentinel_database().await;
    let before = schema(&pool).await;
    // SQLite refuses more than the name's grammar does (its own reserved
    // names): refused alike, before any SQL.
    let store = match SqliteOutbox::builder(pool.clone()).table(text) {
        Ok(builder) => builder.build(),
        Err(Error::InvalidTableName { .. }) => return Ok(()),
        Err(other) => return Err(TestCaseError::fail(format!("{text:?}: {other}"))),
    };
    if store.setup().await.is_ok() {
        let message = NewMessage::new(MessageKind::Event, "n", Payload::from_json("{}").unwrap())
            .with_id("m")
            .at(t0());
        store.enqueue(message).await.map_err(|e| {
            TestCaseError::fail(format!("{text:?} was set up, but enqueue failed: {e}"))
        })?;
        store
            .get_message("m")
            .await
            .map_err(|e| TestCaseError::fail(format!("{text:?}: {e}")))?;
    }
    let after = schema(&pool).await;
    ensure(after.1 == before.1, || {
        format!("{text:?} changed the sentinel's rows")
    })?;
    let table = name.table();
    for object in after.0.difference(&before.0) {
        let (_, object_name, _) = object;
        let derived = object_name == table
            || object_name.starts_with(&format!("{table}_"))
            || object_name.starts_with(&format!("sqlite_autoindex_{table}_"));
        ensure(derived, || format!("{text:?} made {object:?}"))?;
    }
    if let Some(object) = before.0.difference(&after.0).next() {
        return Err(TestCaseError::fail(format!("{text:?} removed {object:?}")));
    }
    pool.close().await;
    Ok(())
}

/// Database URLs: both schemes in every case, other schemes, no scheme,
/// credentials, and query parameters that change how SQLite opens a file.
fn database_url(dir: String) -> impl Strategy<Value = String> {
    let scheme = prop::sample::select(vec![
        "sqlite",
        "SQLite",
        "sqlite3",
        "postgres",
        "postgresql",
        "POSTGRES",
        "mysql",
        "file",
        "",
        "http",
    ]);
    let separator = prop::sample::select(vec!["://", ":", ":/", ":///", ""]);
    let file = "[A-Za-z0-9_.-]{0,12}";
    let query = prop::collection::vec(
        prop::sample::select(vec![
            "mode=rwc",
            "mode=rw",
            "mode=ro",
            "mode=memory",
            "immutable=1",
            "cache=shared",
            "vfs=unix-dotfile",
            "sslmode=require",
            "password=x",
            "=",
            "&",
            "%00",
            "%zz",
        ]),
        0..3,
    )
    .prop_map(|params| params.join("&"));
    let host = prop_oneof![
        Just("127.0.0.1:1".to_owned()),
        Just("user:secret@127.0.0.1:1".to_owned()),
        Just("[::1]:1".to_owned()),
        Just(":99999999".to_owned()),
        "[a-z@:%\\[\\]]{0,10}",
    ];
    let file_url = (scheme.clone(), separator.clone(), file, query.clone())
        .prop_map(move |(s, sep, f, q)| format!("{s}{sep}{dir}/{f}?{q}"));
    let server_url = (scheme, separator, host, "[a-z/]{0,8}", query)
        .prop_map(|(s, sep, h, path, q)| format!("{s}{sep}{h}/{path}?{q}"));
    prop_oneof![3 => file_url, 2 => server_url, 1 => ".{0,30}"]
}

/// A directory removed when the test ends.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("fuzz-{name}-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        TempDir(dir)
    }

    fn is_empty(&self) -> bool {
        std::fs::read_dir(&self.0)
            .map(|mut entries| entries.next().is_none())
            .unwrap_or(false)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn database_urls() {
    let rt = runtime();
    let dir = TempDir::new("urls");
    let strategy = database_url(dir.0.display().to_string());
    fuzz("database_urls", 4_000, strategy, |url| {
        let _ = AnyOutbox::scheme(&url);
        let redacted = outbox::kit::redact_url(&url);
        if url.contains("://user:secret@") {
            ensure(!redacted.contains("secret"), || {
                format!("{url:?} redacted as {redacted:?}")
            })?;
        }
        let _ = SqliteOutbox::connect_options(&url);
        let _ = SqliteOutbox::read_only_options(&url);
        #[cfg(feature = "postgres")]
        let _ = outbox::PostgresOutbox::connect_options(&url);
        // Only a PostgreSQL URL would reach out to a server (and wait for
        // it); every other opens or fails here, and read-only creates no
        // file whatever the URL asks for.
        let server = matches!(
            AnyOutbox::scheme(&url).as_deref(),
            Some("postgres" | "postgresql")
        );
        if !server {
            let opened = rt.block_on(AnyOutbox::options().mode(OpenMode::ReadOnly).open(&url));
            if let Ok(store) = opened {
                rt.block_on(store.close());
            }
            ensure(dir.is_empty(), || {
                format!("read-only {url:?} created a file")
            })?;
        }
        Ok(())
    });
}

// ---------------------------------------------------------------------------
// New messages.

/// A time from the distant past to the distant future, with its edges.
fn any_time() -> impl Strategy<Value = DateTime<Utc>> {
    prop_oneof![
        Just(DateTime::<Utc>::MIN_UTC),
        Just(DateTime::<Utc>::MAX_UTC),
        Just(DateTime::<Utc>::UNIX_EPOCH),
        (-3_600_000_000i64..3_600_000_000).prop_map(|d| t0() + chrono::Duration::microseconds(d)),
        (DateTime::<Utc>::MIN_UTC.timestamp()..=DateTime::<Utc>::MAX_UTC.timestamp())
            .prop_map(|s| DateTime::from_timestamp(s, 0).unwrap()),
    ]
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-z0-9._-]{0,12}",
        1 => ".{0,24}",
        1 => Just("\u{0}".to_owned()),
        1 => Just(" ".to_owned()),
        1 => "x{300}",
    ]
}

#[derive(Debug, Clone)]
struct GeneratedMessage {
    kind: MessageKind,
    name: String,
    id: Option<String>,
    payload: String,
    trace: Option<(String, Option<String>)>,
    ordering_key: Option<String>,
    idempotency: Option<(String, Duration)>,
    max_attempts: Option<u32>,
    delay: Option<Duration>,
    run_at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
}

fn new_message() -> impl Strategy<Value = GeneratedMessage> {
    let payload = prop_oneof![3 => json_any().prop_map(|v| v.to_string()), 1 => ".{0,20}"];
    let duration = prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::MAX),
        (0u64..400 * 86_400).prop_map(Duration::from_secs),
        any::<u64>().prop_map(Duration::from_nanos),
    ];
    (
        (
            prop_oneof![Just(MessageKind::Event), Just(MessageKind::Job)],
            text(),
            prop::option::of(text()),
            payload,
            prop::option::of((text(), prop::option::of(text()))),
        ),
        (
            prop::option::of(text()),
            prop::option::of((text(), duration.clone())),
            prop::option::of(any::<u32>()),
            prop::option::of(duration),
            prop::option::of(any_time()),
            any_time(),
        ),
    )
        .prop_map(
            |(
                (kind, name, id, payload, trace),
                (ordering_key, idempotency, max_attempts, delay, run_at, now),
            )| GeneratedMessage {
                kind,
                name,
                id,
                payload,
                trace,
                ordering_key,
                idempotency,
                max_attempts,
                delay,
                run_at,
                now,
            },
        )
}

impl GeneratedMessage {
    /// The message, or `None` when its payload is not JSON (refused there).
    fn build(&self) -> Option<NewMessage> {
        let payload = Payload::from_json(self.payload.clone()).ok()?;
        let mut message = NewMessage::new(self.kind, self.name.clone(), payload).at(self.now);
        if let Some(id) = &self.id {
            message = message.with_id(id.clone());
        }
        if let Some((traceparent, tracestate)) = &self.trace {
            message = message.with_trace(TraceCarrier {
                traceparent: traceparent.clone(),
                tracestate: tracestate.clone(),
            });
        }
        let mut options = EnqueueOptions::new();
        if let Some(key) = &self.ordering_key {
            options = options.ordering_key(key.clone());
        }
        if let Some((key, window)) = &self.idempotency {
            options = options.idempotency_key(key.clone(), *window);
        }
        if let Some(n) = self.max_attempts {
            options = options.max_attempts(n);
        }
        if let Some(delay) = self.delay {
            options = options.delay(delay);
        }
        if let Some(at) = self.run_at {
            options = options.run_at(at);
        }
        Some(message.with_options(options))
    }
}

#[test]
fn new_messages() {
    let rt = runtime();
    let dir = TempDir::new("enqueue");
    let url = format!("sqlite://{}/outbox.db", dir.0.display());
    let sqlite = rt.block_on(SqliteOutbox::connect(&url)).expect("a store");
    let memory = outbox::MemoryOutbox::new();
    fuzz("new_messages", 3_000, new_message(), |generated| {
        let Some(message) = generated.build() else {
            return Ok(());
        };
        let valid = message.validate();
        rt.block_on(async {
            let stored = sqlite.enqueue(message.clone()).await;
            let kept = memory.enqueue(message).await;
            ensure(stored.is_ok() == kept.is_ok() || valid.is_ok(), || {
                format!("stores disagree on an invalid message: {stored:?} / {kept:?}")
            })?;
            if let Ok(enqueued) = stored {
                let read = sqlite.get_message(enqueued.id()).await.map_err(|e| {
                    TestCaseError::fail(format!("an enqueued message does not read back: {e}"))
                })?;
                if enqueued.is_inserted() {
                    ensure(read.name == generated.name, || {
                        format!("name {:?} read back as {:?}", generated.name, read.name)
                    })?;
                }
            }
            Ok(())
        })
    });
}

// ---------------------------------------------------------------------------
// Stored rows written behind the store's back.

/// One SQLite value of any storage class.
#[derive(Debug, Clone)]
enum Cell {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

fn cell_of(text: impl Strategy<Value = String>) -> impl Strategy<Value = Cell> {
    prop_oneof![
        4 => text.prop_map(Cell::Text),
        1 => Just(Cell::Null),
        1 => any::<i64>().prop_map(Cell::Int),
        1 => any::<f64>().prop_map(Cell::Real),
        1 => prop::collection::vec(any::<u8>(), 0..8).prop_map(Cell::Blob),
    ]
}

fn int_cell() -> impl Strategy<Value = Cell> {
    prop_oneof![
        4 => prop_oneof![
            (-2i64..30),
            Just(i64::MAX),
            Just(i64::MIN),
            Just(i64::from(u32::MAX)),
            Just(i64::from(u32::MAX) + 1),
        ]
        .prop_map(Cell::Int),
        1 => cell_of("[0-9a-z-]{0,4}"),
    ]
}

/// Microseconds since the epoch, as the SQLite store keeps times.
fn time_cell() -> impl Strategy<Value = Cell> {
    let t = t0().timestamp_micros();
    prop_oneof![
        4 => (t - 86_400_000_000..t + 86_400_000_000).prop_map(Cell::Int),
        2 => prop_oneof![
            Just(i64::MAX),
            Just(i64::MIN),
            Just(0),
            Just(-1),
            Just(DateTime::<Utc>::MAX_UTC.timestamp_micros()),
            Just(DateTime::<Utc>::MAX_UTC.timestamp_micros() + 1),
            Just(DateTime::<Utc>::MIN_UTC.timestamp_micros()),
            Just(DateTime::<Utc>::MIN_UTC.timestamp_micros() - 1),
        ]
        .prop_map(Cell::Int),
        1 => cell_of(prop_oneof![
            Just("2030-01-01T12:00:00Z".to_owned()),
            Just("tomorrow".to_owned()),
            "[0-9]{1,20}",
        ]),
    ]
}

fn word_cell(words: &'static [&'static str]) -> impl Strategy<Value = Cell> {
    prop_oneof![
        6 => prop::sample::select(words).prop_map(|w| Cell::Text(w.to_owned())),
        1 => cell_of(".{0,8}"),
    ]
}

const STATUSES: &[&str] = &["pending", "claimed", "delivered", "dead_lettered"];

/// The columns of a stored row and the values written into them.
#[derive(Debug, Clone)]
struct GarbageRow(Vec<(&'static str, Cell)>);

fn garbage_row() -> impl Strategy<Value = GarbageRow> {
    let json_text = || {
        prop_oneof![
            3 => json_any().prop_map(|v| v.to_string()),
            1 => ".{0,16}",
            1 => Just("{\"traceparent\":\"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\"}".to_owned()),
        ]
    };
    (
        (
            cell_of("x-[a-z0-9]{1,6}"),
            word_cell(&["event", "job"]),
            cell_of(".{0,10}"),
            cell_of(json_text()),
            cell_of(json_text()),
            word_cell(STATUSES),
            int_cell(),
            int_cell(),
        ),
        (
            time_cell(),
            cell_of("[a-z0-9-]{0,12}"),
            time_cell(),
            time_cell(),
            cell_of(json_text()),
            time_cell(),
            time_cell(),
            time_cell(),
        ),
        (
            cell_of("k[0-3]"),
            time_cell(),
            cell_of("i[0-3]"),
            time_cell(),
            int_cell(),
        ),
    )
        .prop_map(|(a, b, c)| {
            GarbageRow(vec![
                ("id", a.0),
                ("kind", a.1),
                ("name", a.2),
                ("payload", a.3),
                ("trace", a.4),
                ("status", a.5),
                ("attempts", a.6),
                ("max_attempts", a.7),
                ("available_at", b.0),
                ("claim_token", b.1),
                ("claimed_at", b.2),
                ("locked_until", b.3),
                ("last_error", b.4),
                ("created_at", b.5),
                ("updated_at", b.6),
                ("delivered_at", b.7),
                ("ordering_key", c.0),
                ("skipped_at", c.1),
                ("idempotency_key", c.2),
                ("idempotency_until", c.3),
                ("max_attempts_set", c.4),
            ])
        })
}

impl GarbageRow {
    fn id(&self) -> Option<&str> {
        match &self.0[0].1 {
            Cell::Text(id) => Some(id),
            _ => None,
        }
    }
}

/// Three delivered messages that every case must leave as they are, one
/// of them under an ordering key that garbage rows may share.
async fn seed(store: &(impl OutboxStore + OutboxAdmin)) -> Vec<OutboxMessage> {
    let mut seeded = Vec::new();
    for (n, key) in [(1, None), (2, Some("k1")), (3, None)] {
        let mut message = NewMessage::new(
            MessageKind::Event,
            "good",
            Payload::from(serde_json::json!({ "n": n })),
        )
        .with_id(format!("good-{n}"))
        .at(t0() - chrono::Duration::hours(2));
        if let Some(key) = key {
            message = message.with_ordering_key(key);
        }
        store.enqueue(message).await.expect("a good message");
    }
    let claimed = store
        .claim_batch(claim(t0() - chrono::Duration::hours(1)))
        .await
        .expect("the good messages claimed");
    for message in claimed.claimed {
        store
            .mark_delivered(MarkDelivered {
                id: message.id.clone(),
                claim_token: message.claim_token,
                now: t0() - chrono::Duration::hours(1),
                delete: false,
            })
            .await
            .expect("a good message delivered");
    }
    for n in 1..=3 {
        seeded.push(store.get_message(&format!("good-{n}")).await.unwrap());
    }
    seeded
}

fn claim(now: DateTime<Utc>) -> ClaimBatch {
    ClaimBatch {
        on_dead_letter: OnDeadLetter::Block,
        limit: 10,
        now,
        lease: Duration::from_secs(30),
        queues: Vec::new(),
        max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
        durable: true,
    }
}

/// Everything an operator and a drain do to an outbox holding a row that
/// may not decode. Errors are answers; only a panic (or a good message
/// changed) fails the case.
async fn exercise(
    store: &(impl OutboxStore + OutboxAdmin),
    id: Option<&str>,
    good: &[OutboxMessage],
) -> Result<(), TestCaseError> {
    let now = t0();
    let listed = store
        .list_messages(ListMessages {
            limit: 1_000,
            ..ListMessages::default()
        })
        .await;
    // One bad row is shown as unreadable; it never hides the others.
    let page = listed.map_err(|e| TestCaseError::fail(format!("the list failed: {e}")))?;
    for message in good {
        ensure(page.messages.iter().any(|m| m.id == message.id), || {
            format!("{} is missing from the list", message.id)
        })?;
    }
    let mut after = None;
    for _ in 0..8 {
        let Ok(page) = store
            .list_messages(ListMessages {
                limit: 1,
                after: after.take(),
                status: None,
                name: None,
            })
            .await
        else {
            break;
        };
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    for status in [MessageStatus::Pending, MessageStatus::DeadLettered] {
        let _ = store
            .list_messages(ListMessages {
                status: Some(status),
                ..ListMessages::default()
            })
            .await;
    }
    let _ = store.stats(now).await;
    let _ = store.activity(now - chrono::Duration::hours(3)).await;
    let _ = store.blocked_keys(100).await;
    let _ = store
        .count_purgeable(PurgeMessages {
            status: None,
            older_than: now,
        })
        .await;
    if let Some(id) = id {
        let _ = store.get_message(id).await;
        let _ = store
            .retry_now(RetryNow {
                id: id.to_owned(),
                now,
            })
            .await;
        let _ = store
            .skip_dead_letter(SkipDeadLetter {
                id: id.to_owned(),
                now,
            })
            .await;
        let _ = store
            .requeue_dead_letters(RequeueDeadLetters {
                id: Some(id.to_owned()),
                name: None,
                now,
            })
            .await;
    }
    for (round, at) in [now, now + chrono::Duration::days(400)]
        .into_iter()
        .enumerate()
    {
        let Ok(batch) = store.claim_batch(claim(at)).await else {
            continue;
        };
        for (n, message) in batch.claimed.into_iter().enumerate() {
            let (id, claim_token) = (message.id.clone(), message.claim_token.clone());
            let _ = store
                .renew_claim(RenewClaim {
                    id: id.clone(),
                    claim_token: claim_token.clone(),
                    now: at,
                    lease: Duration::from_secs(30),
                })
                .await;
            let _ = match (n + round) % 4 {
                0 => {
                    store
                        .mark_delivered(MarkDelivered {
                            id,
                            claim_token,
                            now: at,
                            delete: false,
                        })
                        .await
                }
                1 => {
                    store
                        .mark_failed(MarkFailed {
                            id,
                            claim_token,
                            error: ErrorRecord::new("fuzz", "failed"),
                            dead_letter: false,
                            now: at,
                            retry_at: Some(at + chrono::Duration::seconds(1)),
                        })
                        .await
                }
                2 => {
                    store
                        .mark_failed(MarkFailed {
                            id,
                            claim_token,
                            error: ErrorRecord::new("fuzz", "dead"),
                            dead_letter: true,
                            now: at,
                            retry_at: None,
                        })
                        .await
                }
                _ => {
                    store
                        .release_claim(ReleaseClaim {
                            id,
                            claim_token,
                            now: at,
                        })
                        .await
                }
            };
        }
    }
    for message in good {
        let read = store
            .get_message(&message.id)
            .await
            .map_err(|e| TestCaseError::fail(format!("{} no longer reads: {e}", message.id)))?;
        ensure(read == *message, || {
            format!("{} changed: {read:?}", message.id)
        })?;
    }
    Ok(())
}

#[test]
fn stored_rows_sqlite() {
    let rt = runtime();
    let dir = TempDir::new("rows");
    let url = format!("sqlite://{}/outbox.db", dir.0.display());
    let (store, good, before) = rt.block_on(async {
        let store = SqliteOutbox::connect(&url).await.expect("a store");
        sqlx::raw_sql(
            "CREATE TABLE sentinel (id INTEGER PRIMARY KEY, note TEXT NOT NULL); \
             INSERT INTO sentinel (note) VALUES ('one'), ('two');",
        )
        .execute(store.pool())
        .await
        .expect("the sentinel");
        let good = seed(&store).await;
        let before = schema(store.pool()).await;
        (store, good, before)
    });
    fuzz("stored_rows_sqlite", 2_500, garbage_row(), |row| {
        rt.block_on(async {
            let columns: Vec<&str> = row.0.iter().map(|(c, _)| *c).collect();
            let marks: Vec<String> = (1..=columns.len()).map(|n| format!("?{n}")).collect();
            let sql = format!(
                "INSERT INTO outbox ({}) VALUES ({})",
                columns.join(", "),
                marks.join(", ")
            );
            let mut insert = sqlx::query(sqlx::AssertSqlSafe(sql));
            for (_, cell) in &row.0 {
                insert = match cell.clone() {
                    Cell::Null => insert.bind(None::<String>),
                    Cell::Int(n) => insert.bind(n),
                    Cell::Real(x) => insert.bind(x),
                    Cell::Text(t) => insert.bind(t),
                    Cell::Blob(b) => insert.bind(b),
                };
            }
            // The table's own constraints refuse some rows: nothing to read.
            let inserted = insert.execute(store.pool()).await.is_ok();
            let outcome = if inserted {
                exercise(&store, row.id(), &good).await
            } else {
                Ok(())
            };
            sqlx::query("DELETE FROM outbox WHERE id NOT LIKE 'good-%' OR typeof(id) <> 'text'")
                .execute(store.pool())
                .await
                .expect("the garbage removed");
            let after = schema(store.pool()).await;
            ensure(after == before, || {
                "a write reached another table or the schema".into()
            })?;
            outcome
        })
    });
}

#[cfg(feature = "postgres")]
mod postgres {
    //! The same rows on PostgreSQL, whose column types refuse more of them:
    //! every value is written as text and cast by the server.

    use super::*;
    use outbox::PostgresOutbox;
    use sqlx::PgPool;

    /// What `pg_tables` and the sentinel hold.
    async fn snapshot(pool: &PgPool, schema: &str) -> (Vec<String>, Vec<(i64, String)>) {
        let tables = sqlx::query_scalar(
            "SELECT tablename::text FROM pg_tables WHERE schemaname = $1 ORDER BY 1",
        )
        .bind(schema)
        .fetch_all(pool)
        .await
        .expect("pg_tables");
        let rows = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT id, note FROM \"{schema}\".sentinel ORDER BY id"
        )))
        .fetch_all(pool)
        .await
        .expect("the sentinel");
        (tables, rows)
    }

    fn pg_time() -> impl Strategy<Value = Option<String>> {
        let t = t0().timestamp();
        prop_oneof![
            4 => (t - 86_400..t + 86_400).prop_map(|s| {
                Some(DateTime::from_timestamp(s, 0).unwrap().to_rfc3339())
            }),
            2 => prop::sample::select(vec![
                "infinity",
                "-infinity",
                "epoch",
                "294276-12-31 23:59:59+00",
                "4713-01-01 00:00:00+00 BC",
                "262143-12-31 23:59:59+00",
                "262144-01-01 00:00:00+00",
                "-262144-01-01 00:00:00+00",
                "0001-01-01 00:00:00+00",
                "tomorrow",
            ])
            .prop_map(|s| Some(s.to_owned())),
            1 => Just(None),
            1 => ".{0,6}".prop_map(Some),
        ]
    }

    fn pg_text(inner: impl Strategy<Value = String>) -> impl Strategy<Value = Option<String>> {
        prop_oneof![4 => inner.prop_map(Some), 1 => Just(None)]
    }

    fn pg_int() -> impl Strategy<Value = Option<String>> {
        prop_oneof![
            4 => prop_oneof![
                (-2i64..30),
                Just(i64::MAX),
                Just(i64::MIN),
                Just(i64::from(u32::MAX) + 1),
            ]
            .prop_map(|n| Some(n.to_string())),
            1 => pg_text("[0-9a-z.-]{0,4}"),
        ]
    }

    /// A row as text per column, with the cast each column takes.
    #[derive(Debug, Clone)]
    struct PgRow(Vec<(&'static str, &'static str, Option<String>)>);

    fn pg_row() -> impl Strategy<Value = PgRow> {
        let json_text = || {
            prop_oneof![
                3 => json_any().prop_map(|v| v.to_string()),
                1 => ".{0,16}",
            ]
        };
        let word = |words: &'static [&'static str]| {
            prop_oneof![
                6 => prop::sample::select(words).prop_map(|w| Some(w.to_owned())),
                1 => pg_text(".{0,8}"),
            ]
        };
        (
            (
                pg_text("x-[a-z0-9]{1,6}"),
                word(&["event", "job"]),
                pg_text(".{0,10}"),
                pg_text(json_text()),
                pg_text(json_text()),
                word(STATUSES),
                pg_int(),
                pg_int(),
            ),
            (
                pg_time(),
                pg_text("[a-z0-9-]{0,12}"),
                pg_time(),
                pg_time(),
                pg_text(json_text()),
                pg_time(),
                pg_time(),
                pg_time(),
            ),
            (
                pg_text("k[0-3]"),
                pg_time(),
                pg_text("i[0-3]"),
                pg_time(),
                word(&["true", "false", "1", "maybe"]),
            ),
        )
            .prop_map(|(a, b, c)| {
                PgRow(vec![
                    ("id", "text", a.0),
                    ("kind", "text", a.1),
                    ("name", "text", a.2),
                    ("payload", "jsonb", a.3),
                    ("trace", "text", a.4),
                    ("status", "text", a.5),
                    ("attempts", "bigint", a.6),
                    ("max_attempts", "bigint", a.7),
                    ("available_at", "timestamptz", b.0),
                    ("claim_token", "text", b.1),
                    ("claimed_at", "timestamptz", b.2),
                    ("locked_until", "timestamptz", b.3),
                    ("last_error", "text", b.4),
                    ("created_at", "timestamptz", b.5),
                    ("updated_at", "timestamptz", b.6),
                    ("delivered_at", "timestamptz", b.7),
                    ("ordering_key", "text", c.0),
                    ("skipped_at", "timestamptz", c.1),
                    ("idempotency_key", "text", c.2),
                    ("idempotency_until", "timestamptz", c.3),
                    ("max_attempts_set", "boolean", c.4),
                ])
            })
    }

    #[test]
    fn stored_rows_postgres() {
        let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| {
            panic!(
                "DATABASE_URL is not set. Run this test under a server: \
                 `scripts/with-postgres cargo test -p outbox --all-features --test fuzz`"
            )
        });
        let rt = runtime();
        let schema = format!("fuzz_{}", uuid::Uuid::new_v4().simple());
        let table = format!("{schema}.outbox");
        let (pool, store, good, before) = rt.block_on(async {
            let pool = PostgresOutbox::connect_pool(
                &url,
                sqlx::postgres::PgPoolOptions::new().max_connections(2),
            )
            .await
            .expect("a pool");
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "CREATE SCHEMA \"{schema}\"; \
                 CREATE TABLE \"{schema}\".sentinel (id bigint PRIMARY KEY, note text NOT NULL); \
                 INSERT INTO \"{schema}\".sentinel VALUES (1, 'one'), (2, 'two');"
            )))
            .execute(&pool)
            .await
            .expect("the sentinel");
            let store = PostgresOutbox::builder(pool.clone())
                .table(&table)
                .expect("a table name")
                .caller_clock(true)
                .build();
            store.setup().await.expect("the table");
            let good = seed(&store).await;
            let before = snapshot(&pool, &schema).await;
            (pool, store, good, before)
        });
        fuzz("stored_rows_postgres", 1_500, pg_row(), |row| {
            rt.block_on(async {
                let columns: Vec<&str> = row.0.iter().map(|(c, _, _)| *c).collect();
                let values: Vec<String> = row
                    .0
                    .iter()
                    .enumerate()
                    .map(|(n, (_, cast, _))| format!("${}::{cast}", n + 1))
                    .collect();
                let sql = format!(
                    "INSERT INTO \"{schema}\".outbox ({}) VALUES ({})",
                    columns.join(", "),
                    values.join(", ")
                );
                let mut insert = sqlx::query(sqlx::AssertSqlSafe(sql));
                for (_, _, value) in &row.0 {
                    insert = insert.bind(value.clone());
                }
                let inserted = insert.execute(&pool).await.is_ok();
                let id = row.0[0].2.as_deref();
                let outcome = if inserted {
                    exercise(&store, id, &good).await
                } else {
                    Ok(())
                };
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "DELETE FROM \"{schema}\".outbox WHERE id NOT LIKE 'good-%'"
                )))
                .execute(&pool)
                .await
                .expect("the garbage removed");
                let after = snapshot(&pool, &schema).await;
                ensure(after == before, || {
                    format!("a write reached another table: {after:?}")
                })?;
                outcome
            })
        });
        rt.block_on(async {
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "DROP SCHEMA \"{schema}\" CASCADE"
            )))
            .execute(&pool)
            .await
            .expect("the schema dropped");
        });
    }

    /// Found by `stored_rows_postgres`: a `timestamptz` past chrono's last
    /// year, or `infinity`, panicked in the driver's decoding.
    #[tokio::test]
    async fn times_off_chronos_calendar_are_unreadable_rows() {
        let url = std::env::var("DATABASE_URL").expect("DATABASE_URL");
        let pool = PostgresOutbox::connect_pool(
            &url,
            sqlx::postgres::PgPoolOptions::new().max_connections(2),
        )
        .await
        .unwrap();
        let table = format!("fuzz_times_{}", uuid::Uuid::new_v4().simple());
        let store = PostgresOutbox::builder(pool.clone())
            .table(&table)
            .unwrap()
            .build();
        store.setup().await.unwrap();
        for id in ["a", "b", "c", "d"] {
            let message =
                NewMessage::new(MessageKind::Event, "x", Payload::from_json("{}").unwrap())
                    .with_id(id);
            store.enqueue(message).await.unwrap();
        }
        for (id, column, value) in [
            ("b", "available_at", "infinity"),
            ("c", "updated_at", "294276-12-31 23:59:59+00"),
            ("d", "locked_until", "-infinity"),
        ] {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "UPDATE \"{table}\" SET {column} = $1::timestamptz WHERE id = $2"
            )))
            .bind(value)
            .bind(id)
            .execute(&pool)
            .await
            .unwrap();
        }
        let page = store.list_messages(ListMessages::default()).await.unwrap();
        let shown: Vec<&str> = page.messages.iter().map(|m| m.id.as_str()).collect();
        let unreadable: Vec<&str> = page.unreadable.iter().map(|m| m.id.as_str()).collect();
        assert_eq!((shown, unreadable), (vec!["a"], vec!["b", "c", "d"]));
        assert!(
            page.unreadable[0].reason.contains("infinity"),
            "{:?}",
            page.unreadable[0]
        );
        for id in ["b", "c", "d"] {
            match store.get_message(id).await {
                Err(Error::Unreadable(row)) => assert_eq!(row.id, id),
                other => panic!("{id}: {other:?}"),
            }
        }
        let _ = store.stats(Utc::now()).await;
        let _ = store.claim_batch(claim(Utc::now())).await;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DROP TABLE \"{table}\", \"{table}_migrations\" CASCADE"
        )))
        .execute(&pool)
        .await
        .unwrap();
    }
}
