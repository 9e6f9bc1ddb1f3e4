//! The `outbox` binary against real databases: a temporary SQLite file, and
//! PostgreSQL at `DATABASE_URL`.
//!
//! Run with `scripts/with-postgres cargo test -p outbox-cli --test cli`;
//! without `DATABASE_URL` the PostgreSQL tests fail and say so. Every test
//! uses a table of its own (`--table`), so they run in parallel.
//! The tests put messages into each state through the library, with `now`
//! in the past where age matters, then run the binary and read its output,
//! its exit code and the store.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox::{
    ClaimBatch, ClaimedMessage, ErrorRecord, MarkDelivered, MarkFailed, MessageKind, MessageStatus,
    NewMessage, OutboxAdmin, OutboxMessage, OutboxStore, Payload, PostgresOutbox, SqliteOutbox,
};
use serde_json::Value;

/// What one run of the binary did.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    /// Assert the exit code, showing the output when it differs.
    fn code(self, expected: i32) -> Self {
        assert_eq!(
            self.code, expected,
            "exit code\n--- stdout\n{}\n--- stderr\n{}",
            self.stdout, self.stderr
        );
        self
    }

    fn ok(self) -> Self {
        self.code(0)
    }

    /// stdout as one JSON document.
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", self.stdout))
    }
}

fn outbox_command() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_outbox"));
    // Only what a test passes counts.
    command
        .env_remove("OUTBOX_DATABASE_URL")
        .env_remove("OUTBOX_TABLE")
        .env_remove("OUTBOX_WEB_TOKEN")
        .stdin(Stdio::null());
    command
}

fn finish(output: std::process::Output) -> Run {
    Run {
        code: output.status.code().expect("the binary exited, not killed"),
        stdout: String::from_utf8(output.stdout).expect("stdout is UTF-8"),
        stderr: String::from_utf8(output.stderr).expect("stderr is UTF-8"),
    }
}

/// Run the binary with exactly these arguments.
fn outbox(args: &[&str]) -> Run {
    finish(
        outbox_command()
            .args(args)
            .output()
            .expect("the binary runs"),
    )
}

fn random() -> u64 {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos(),
    );
    hasher.finish()
}

/// A directory removed when the test ends.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("outbox-cli-{:016x}", random()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        TempDir(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One outbox table, reached both through the library and through the binary.
struct Fixture<S> {
    url: String,
    table: String,
    store: S,
    dir: TempDir,
}

async fn sqlite() -> Fixture<SqliteOutbox> {
    let dir = TempDir::new();
    let url = format!("sqlite://{}", dir.path().join("outbox.db").display());
    let options = SqliteOutbox::connect_options(&url).unwrap();
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .connect_with(options)
        .await
        .expect("a SQLite file");
    let table = format!("cli_{:016x}", random());
    let store = SqliteOutbox::builder(pool).table(&table).unwrap().build();
    Fixture::migrated(url, table, store, dir)
}

async fn postgres() -> Fixture<PostgresOutbox> {
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| {
        panic!(
            "DATABASE_URL is not set. The PostgreSQL tests of the command line need a server: \
             run them with `scripts/with-postgres cargo test -p outbox-cli --test cli`"
        )
    });
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&url)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to DATABASE_URL: {e}"));
    let table = format!("cli_{:016x}", random());
    let store = PostgresOutbox::builder(pool)
        .table(&table)
        .unwrap()
        // The fixtures settle messages at chosen times, as an operator later sees them.
        .caller_clock(true)
        .build();
    Fixture::migrated(url, table, store, TempDir::new())
}

impl<S: OutboxStore + OutboxAdmin> Fixture<S> {
    /// The fixture, its table created by the binary's `migrate`.
    fn migrated(url: String, table: String, store: S, dir: TempDir) -> Self {
        let fixture = Fixture {
            url,
            table,
            store,
            dir,
        };
        fixture.run(&["migrate"]).ok();
        fixture
    }

    /// Run the binary on this table.
    fn run(&self, args: &[&str]) -> Run {
        finish(self.command(args).output().expect("the binary runs"))
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = outbox_command();
        command
            .args(["--database", &self.url, "--table", &self.table])
            .args(args);
        command
    }

    async fn message(&self, id: &str) -> OutboxMessage {
        self.store.get_message(id).await.unwrap()
    }

    /// A pending message, due at once.
    async fn pending(&self, name: &str, payload: Value) -> String {
        self.store
            .enqueue(NewMessage::new(MessageKind::Event, name, payload.into()))
            .await
            .unwrap()
            .into_id()
    }

    /// A message enqueued and claimed at `at`, under a lease of `lease`.
    async fn claimed(&self, name: &str, at: DateTime<Utc>, lease: Duration) -> ClaimedMessage {
        let message =
            NewMessage::new(MessageKind::Event, name, serde_json::json!({"n": 1}).into()).at(at);
        let id = self.store.enqueue(message).await.unwrap().into_id();
        let mut batch = self
            .store
            .claim_batch(ClaimBatch {
                on_dead_letter: Default::default(),
                limit: 1,
                now: at,
                lease,
                max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
                queues: Vec::new(),
                durable: true,
            })
            .await
            .unwrap();
        let claimed = batch.claimed.pop().expect("the claim takes the message");
        assert_eq!(claimed.id, id, "no other message was eligible at {at}");
        claimed
    }

    /// A message delivered at `at`.
    async fn delivered(&self, name: &str, at: DateTime<Utc>) -> String {
        let claimed = self.claimed(name, at, Duration::from_secs(60)).await;
        self.store
            .mark_delivered(MarkDelivered {
                delete: false,
                id: claimed.id.clone(),
                claim_token: claimed.claim_token,
                now: at,
            })
            .await
            .unwrap();
        claimed.id
    }

    /// A message dead-lettered at `at` with `error`.
    async fn dead_lettered(&self, name: &str, at: DateTime<Utc>, error: ErrorRecord) -> String {
        let claimed = self.claimed(name, at, Duration::from_secs(60)).await;
        self.store
            .mark_failed(MarkFailed {
                id: claimed.id.clone(),
                claim_token: claimed.claim_token,
                error,
                dead_letter: true,
                now: at,
                retry_at: None,
            })
            .await
            .unwrap();
        claimed.id
    }

    async fn count(&self, status: MessageStatus) -> u64 {
        self.store.stats(Utc::now()).await.unwrap().count(status)
    }
}

fn days_ago(days: i64) -> DateTime<Utc> {
    Utc::now() - chrono::Duration::days(days)
}

fn hours_ago(hours: i64) -> DateTime<Utc> {
    Utc::now() - chrono::Duration::hours(hours)
}

fn error(message: &str) -> ErrorRecord {
    ErrorRecord::new("app::DeliveryFailed", message)
}

/// Run each generic test on both stores.
macro_rules! on_every_store {
    ($($test:ident),* $(,)?) => {
        mod on_sqlite {
            $(
                #[tokio::test]
                async fn $test() {
                    super::$test(super::sqlite().await).await
                }
            )*
        }
        mod on_postgres {
            $(
                #[tokio::test]
                async fn $test() {
                    super::$test(super::postgres().await).await
                }
            )*
        }
    };
}

on_every_store!(
    migrate_creates_the_table_once_and_commands_need_it,
    status_counts_every_state,
    list_pages_through_messages_with_a_cursor,
    show_prints_every_field_and_the_last_error,
    requeue_takes_dead_letters_and_refuses_the_rest,
    purge_removes_old_settled_messages_after_confirmation,
    drain_once_print_writes_each_message_as_a_json_line,
    drain_once_exec_retries_what_its_command_fails,
    drain_flags_are_validated_before_anything_runs,
    drain_every_stops_on_a_signal_and_releases_claims,
    drain_once_counts_every_pass_and_exits_3_when_a_delivery_failed,
    skip_unblocks_an_ordering_key_that_status_lists,
    drain_deletes_settled_messages_when_asked,
    pause_and_resume_a_queue_that_status_lists_and_drains_honour,
    cancel_one_message_or_a_filtered_set_after_a_count,
);

/// A pending message named `name` in `queue`.
async fn queued<S: OutboxStore + OutboxAdmin>(f: &Fixture<S>, name: &str, queue: &str) -> String {
    let message =
        NewMessage::new(MessageKind::Event, name, serde_json::json!({}).into()).with_queue(queue);
    f.store.enqueue(message).await.unwrap().into_id()
}

async fn pause_and_resume_a_queue_that_status_lists_and_drains_honour<
    S: OutboxStore + OutboxAdmin,
>(
    f: Fixture<S>,
) {
    let mail = queued(&f, "mail.send", "emails").await;
    let paused = f.run(&["pause", "emails"]).ok();
    assert!(
        paused.stdout.starts_with("paused queue \"emails\""),
        "{}",
        paused.stdout
    );
    assert!(paused.stderr.is_empty(), "{}", paused.stderr);
    // A name no message uses is paused, and called out.
    let typo = f.run(&["pause", "emials"]).ok();
    assert!(
        typo.stdout.starts_with("paused queue \"emials\""),
        "{}",
        typo.stdout
    );
    assert!(
        typo.stderr
            .contains("queue \"emials\" holds no pending or claimed message"),
        "{}",
        typo.stderr
    );
    f.run(&["resume", "emials"]).ok();
    let again = f.run(&["pause", "emails"]).ok();
    assert!(again.stdout.contains("already paused"), "{}", again.stdout);
    f.run(&["pause", "two words"]).code(2);

    let status = f.run(&["status"]).ok();
    let row = status
        .stdout
        .lines()
        .find(|line| line.starts_with("emails"))
        .unwrap_or_else(|| panic!("no queue row:\n{}", status.stdout));
    assert!(row.contains("paused since"), "{row}");
    let json = f.run(&["status", "--json"]).ok().json();
    assert_eq!(json["queues"][0]["queue"], "emails");
    assert_eq!(json["queues"][0]["pending"], 1);
    assert!(json["queues"][0]["paused_at"].is_string(), "{json}");

    // A drain serving the queue claims nothing from it while it is paused.
    let run = f
        .run(&["drain", "--once", "--print", "--queue", "emails=2"])
        .ok();
    assert!(run.stdout.is_empty(), "{}", run.stdout);
    assert_eq!(f.message(&mail).await.status, MessageStatus::Pending);

    let resumed = f.run(&["resume", "emails"]).ok();
    assert!(
        resumed.stdout.starts_with("resumed queue"),
        "{}",
        resumed.stdout
    );
    let not = f.run(&["resume", "emails"]).ok();
    assert!(not.stdout.contains("was not paused"), "{}", not.stdout);
    // A drain that does not serve the queue leaves it alone.
    let run = f.run(&["drain", "--once", "--print"]).ok();
    assert!(run.stdout.is_empty(), "{}", run.stdout);
    let run = f
        .run(&["drain", "--once", "--print", "--queue", "emails"])
        .ok();
    assert_eq!(run.stdout.lines().count(), 1, "{}", run.stdout);
    assert_eq!(f.message(&mail).await.status, MessageStatus::Delivered);
    f.run(&["drain", "--once", "--print", "--queue", "emails=0"])
        .code(2);
}

async fn cancel_one_message_or_a_filtered_set_after_a_count<S: OutboxStore + OutboxAdmin>(
    f: Fixture<S>,
) {
    let one = queued(&f, "order.placed", "default").await;
    let two = queued(&f, "order.placed", "emails").await;
    let other = queued(&f, "order.shipped", "emails").await;
    let done = f.delivered("order.placed", hours_ago(1)).await;

    let cancelled = f.run(&["cancel", &one]).ok();
    assert!(
        cancelled.stdout.starts_with(&format!("cancelled {one}")),
        "{}",
        cancelled.stdout
    );
    assert_eq!(f.message(&one).await.status, MessageStatus::Cancelled);
    // Settled messages are refused with their status.
    let refused = f.run(&["cancel", &one]).code(1);
    assert!(
        refused.stderr.contains("is cancelled"),
        "{}",
        refused.stderr
    );
    let refused = f.run(&["cancel", &done]).code(1);
    assert!(
        refused.stderr.contains("is delivered"),
        "{}",
        refused.stderr
    );
    f.run(&["cancel", "no-such-message"]).code(1);
    // Nothing to cancel by, or an id with a filter: usage errors.
    f.run(&["cancel"]).code(2);
    f.run(&["cancel", &two, "--name", "order.placed"]).code(2);

    let dry = f
        .run(&["cancel", "--name", "order.placed", "--dry-run"])
        .ok();
    assert!(
        dry.stdout
            .starts_with("would cancel: 1 pending message to cancel"),
        "{}",
        dry.stdout
    );
    // No terminal to ask on and no --yes: refused, and told to pass --yes.
    let unconfirmed = f.run(&["cancel", "--name", "order.placed"]).code(2);
    assert!(
        unconfirmed.stderr.contains("--yes"),
        "{}",
        unconfirmed.stderr
    );
    assert_eq!(f.message(&two).await.status, MessageStatus::Pending);
    let all = f
        .run(&[
            "cancel",
            "--queue",
            "emails",
            "--name",
            "order.placed",
            "--yes",
        ])
        .ok();
    assert!(
        all.stdout.starts_with("cancelled 1 message;"),
        "{}",
        all.stdout
    );
    assert_eq!(f.message(&two).await.status, MessageStatus::Cancelled);
    assert_eq!(f.message(&other).await.status, MessageStatus::Pending);
    let status = f.run(&["status"]).ok();
    assert!(
        status
            .stdout
            .lines()
            .any(|line| line.starts_with("cancelled") && line.contains('2')),
        "{}",
        status.stdout
    );
    let show = f.run(&["show", &two]).ok();
    assert!(
        show.stdout
            .lines()
            .any(|line| line.starts_with("queue") && line.contains("emails")),
        "{}",
        show.stdout
    );
}

async fn skip_unblocks_an_ordering_key_that_status_lists<S: OutboxStore + OutboxAdmin>(
    f: Fixture<S>,
) {
    let at = hours_ago(1);
    let keyed = |n: u64| {
        NewMessage::new(
            MessageKind::Event,
            "order.step",
            serde_json::json!({ "n": n }).into(),
        )
        .with_ordering_key("order-7")
        .at(at)
    };
    let head = f.store.enqueue(keyed(1)).await.unwrap().into_id();
    let next = f.store.enqueue(keyed(2)).await.unwrap().into_id();
    let mut batch = f
        .store
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: 10,
            now: at,
            lease: Duration::from_secs(60),
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
            queues: Vec::new(),
            durable: true,
        })
        .await
        .unwrap();
    let claimed = batch.claimed.pop().unwrap();
    assert_eq!(
        (claimed.id.as_str(), batch.claimed.len()),
        (head.as_str(), 0)
    );
    f.store
        .mark_failed(MarkFailed {
            id: head.clone(),
            claim_token: claimed.claim_token,
            error: error("rejected"),
            dead_letter: true,
            now: at,
            retry_at: None,
        })
        .await
        .unwrap();

    let status = f.run(&["status"]).ok().stdout;
    assert!(
        status.contains("1 ordering key held by a dead letter"),
        "{status}"
    );
    assert!(
        status.contains("order-7") && status.contains(&head),
        "{status}"
    );
    let json = f.run(&["status", "--json"]).ok().json();
    assert_eq!(json["blocked_keys"], 1);
    assert_eq!(json["blocked"][0]["head_id"], head.as_str());
    assert_eq!(json["blocked"][0]["waiting"], 1);
    let list = f.run(&["list"]).ok().stdout;
    assert!(list.lines().next().unwrap().contains("KEY"), "{list}");
    assert!(list.contains("order-7"), "{list}");

    // Only a dead letter can be skipped.
    let refused = f.run(&["skip", &next]).code(1);
    assert!(
        refused.stderr.contains("not dead-lettered"),
        "{}",
        refused.stderr
    );
    let skipped = f.run(&["skip", &head]).ok().stdout;
    assert!(skipped.contains("\"order-7\""), "{skipped}");
    let show = f.run(&["show", &head]).ok().stdout;
    assert!(
        show.contains("skipped at") && show.contains("order-7"),
        "{show}"
    );
    let status = f.run(&["status"]).ok().stdout;
    assert!(!status.contains("held by a dead letter"), "{status}");
    let batch = f
        .store
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: 10,
            now: Utc::now(),
            lease: Duration::from_secs(60),
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
            queues: Vec::new(),
            durable: true,
        })
        .await
        .unwrap();
    assert_eq!(batch.claimed.len(), 1);
    assert_eq!(batch.claimed[0].id, next);
}

async fn migrate_creates_the_table_once_and_commands_need_it<S: OutboxStore + OutboxAdmin>(
    f: Fixture<S>,
) {
    // The fixture migrated its table; a second run has nothing to do.
    let again = f.run(&["migrate"]).ok();
    assert!(
        again
            .stdout
            .contains(&format!("table {} is up to date", f.table)),
        "{}",
        again.stdout
    );

    // Another table in the same database: created, then usable.
    let other = format!("{}_b", f.table);
    let args = |command: &str| {
        [
            "--database",
            f.url.as_str(),
            "--table",
            other.as_str(),
            command,
        ]
        .map(String::from)
    };
    let status = |args: &[String]| finish(outbox_command().args(args).output().unwrap());
    let missing = status(&args("status")).code(1);
    assert!(
        missing.stderr.contains("does not exist") && missing.stderr.contains("migrate"),
        "{}",
        missing.stderr
    );
    let created = status(&args("migrate")).ok();
    assert!(
        created
            .stdout
            .starts_with(&format!("created table {other}: applied ")),
        "{}",
        created.stdout
    );
    assert!(created.stdout.contains("0001 outbox"), "{}", created.stdout);
    assert!(
        created.stdout.contains("0002 ordering"),
        "{}",
        created.stdout
    );
    status(&args("status")).ok();
}

#[test]
fn migrate_creates_a_missing_sqlite_file_and_other_commands_do_not() {
    let dir = TempDir::new();
    let path = dir.path().join("new.db");
    let url = format!("sqlite://{}", path.display());
    let refused = outbox(&["--database", &url, "status"]).code(1);
    assert!(
        refused.stderr.contains("outbox migrate"),
        "{}",
        refused.stderr
    );
    assert!(!path.exists(), "status must not create a database");
    let created = outbox(&["--database", &url, "migrate"]).ok();
    assert!(
        created.stdout.starts_with("created table outbox"),
        "{}",
        created.stdout
    );
    let status = outbox(&["--database", &url, "status", "--json"]).ok();
    assert_eq!(status.json()["total"], 0);
}

async fn status_counts_every_state<S: OutboxStore + OutboxAdmin>(f: Fixture<S>) {
    // Claims first, latest first: each claim must find only its own message
    // eligible (an expired claim is eligible to any later claim).
    f.claimed("live", Utc::now(), Duration::from_secs(3600))
        .await;
    f.claimed("expired", hours_ago(2), Duration::from_secs(3600))
        .await;
    f.delivered("done", days_ago(1)).await;
    f.dead_lettered("dead", days_ago(1), error("no")).await;
    let old = NewMessage::new(MessageKind::Job, "due", Payload::from_json("{}").unwrap())
        .at(Utc::now())
        .available_at(hours_ago(3));
    f.store.enqueue(old).await.unwrap();
    f.pending("fresh", serde_json::json!({})).await;

    let human = f.run(&["status"]).ok().stdout;
    for line in [
        "pending        2  oldest due message waiting 3h",
        "claimed        2  1 live, 1 past their lease",
        "delivered      1",
        "dead_lettered  1",
        "total          6",
    ] {
        assert!(human.contains(line), "{line:?} in\n{human}");
    }
    assert!(human.contains("outlived its lease"), "{human}");

    let json = f.run(&["status", "--json"]).ok().json();
    assert_eq!(json["table"], f.table.as_str());
    for (field, expected) in [
        ("pending", 2),
        ("claimed", 2),
        ("delivered", 1),
        ("dead_lettered", 1),
        ("total", 6),
        ("live_claims", 1),
        ("expired_claims", 1),
    ] {
        assert_eq!(json[field], expected, "{field} in {json:#}");
    }
    let age = json["oldest_due_age_seconds"].as_f64().unwrap();
    assert!((3.0 * 3600.0..4.0 * 3600.0).contains(&age), "{age}");
    let oldest: DateTime<Utc> = json["oldest_due_at"].as_str().unwrap().parse().unwrap();
    assert!((oldest - hours_ago(3)).num_seconds().abs() < 60, "{oldest}");
}

async fn list_pages_through_messages_with_a_cursor<S: OutboxStore + OutboxAdmin>(f: Fixture<S>) {
    let dead = f
        .dead_lettered("order.placed", days_ago(2), error("card declined"))
        .await;
    let mut ids = vec![dead.clone()];
    for n in 0..4 {
        let name = if n % 2 == 0 {
            "order.placed"
        } else {
            "order.shipped"
        };
        ids.push(f.pending(name, serde_json::json!({ "n": n })).await);
    }

    // The table, and the command for the next page.
    let first = f.run(&["list", "--limit", "2"]).ok().stdout;
    let header = first.lines().next().unwrap();
    for column in [
        "ID",
        "NAME",
        "KIND",
        "STATUS",
        "ATTEMPTS",
        "AVAILABLE",
        "UPDATED",
        "LAST ERROR",
    ] {
        assert!(header.contains(column), "{header}");
    }
    let row = first.lines().nth(1).unwrap();
    for cell in [
        &*dead,
        "order.placed",
        "event",
        "dead_lettered",
        "1/25",
        "card declined",
    ] {
        assert!(row.contains(cell), "{cell:?} in {row}");
    }
    let next = first
        .lines()
        .find_map(|line| line.split_once("next page: "))
        .map(|(_, command)| command.to_owned())
        .unwrap_or_else(|| panic!("a next-page command in\n{first}"));
    assert!(
        next.starts_with(&format!(
            "outbox --table {} list --limit 2 --after ",
            f.table
        )),
        "{next}"
    );

    // Following the printed commands visits every message once, in order.
    let mut seen: Vec<String> = first.lines().skip(1).take(2).map(first_cell).collect();
    let mut command = Some(next);
    while let Some(line) = command.take() {
        let args: Vec<&str> = line.split(' ').skip(3).collect();
        let page = f.run(&args).ok().stdout;
        seen.extend(
            page.lines()
                .skip(1)
                .take_while(|line| !line.is_empty())
                .map(first_cell),
        );
        command = page
            .lines()
            .find_map(|line| line.split_once("next page: "))
            .map(|(_, command)| command.to_owned());
        if command.is_none() {
            assert!(page.contains("no more pages"), "{page}");
        }
    }
    assert_eq!(seen, ids);

    // The same pages as JSON documents.
    let mut cursor: Option<String> = None;
    let mut pages = Vec::new();
    loop {
        let mut args = vec!["list", "--limit", "2", "--json"];
        if let Some(cursor) = &cursor {
            args.extend(["--after", cursor.as_str()]);
        }
        let json = f.run(&args).ok().json();
        let page: Vec<String> = json["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap().to_owned())
            .collect();
        pages.push(page);
        match json["next"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(pages.concat(), ids);
    assert_eq!(pages.len(), 3);

    // Filters.
    let placed = f
        .run(&[
            "list",
            "--name",
            "order.placed",
            "--status",
            "pending",
            "--json",
        ])
        .ok()
        .json();
    let placed: Vec<&str> = placed["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(placed, [&*ids[1], &*ids[3]]);
    let empty = f.run(&["list", "--name", "nothing"]).ok();
    assert!(empty.stdout.starts_with("no messages"), "{}", empty.stdout);

    // Bad values are usage errors.
    let bad = f.run(&["list", "--after", "not-a-cursor"]).code(2);
    assert!(bad.stderr.contains("--after"), "{}", bad.stderr);
    f.run(&["list", "--limit", "0"]).code(2);
    f.run(&["list", "--status", "lost"]).code(2);
}

fn first_cell(line: &str) -> String {
    line.split_whitespace().next().unwrap().to_owned()
}

async fn show_prints_every_field_and_the_last_error<S: OutboxStore + OutboxAdmin>(f: Fixture<S>) {
    let record = ErrorRecord {
        type_name: "app::PaymentError".to_owned(),
        message: "card declined".to_owned(),
        causes: vec![
            "gateway answered 402".to_owned(),
            "issuer refused".to_owned(),
        ],
        truncated: false,
    };
    let id = f
        .dead_lettered("order.placed", days_ago(1), record.clone())
        .await;

    let human = f.run(&["show", &id]).ok().stdout;
    for expected in [
        format!("id            {id}"),
        "kind          event".to_owned(),
        "name          order.placed".to_owned(),
        "status        dead_lettered".to_owned(),
        "attempts      1 of 25 (the drain's cap)".to_owned(),
        "payload:\n  {\n    \"n\": 1\n  }".to_owned(),
        "last error:\n  type     app::PaymentError\n  message  card declined".to_owned(),
        "  caused by: gateway answered 402\n  caused by: issuer refused".to_owned(),
    ] {
        assert!(human.contains(&expected), "{expected:?} in\n{human}");
    }

    // The limit of a message without its own cap is the drains'.
    let lowered = f.run(&["show", &id, "--max-attempts", "7"]).ok().stdout;
    assert!(
        lowered.contains("attempts      1 of 7 (the drain's cap)"),
        "{lowered}"
    );

    let json = f.run(&["show", &id, "--json"]).ok().stdout;
    // Read from the text: a payload is kept as raw JSON, which a `Value` cannot give.
    let mut shown: OutboxMessage = serde_json::from_str(&json).unwrap();
    let stored = f.message(&id).await;
    // The payload is the same JSON, indented for reading.
    assert_eq!(shown.payload.to_value(), stored.payload.to_value());
    shown.payload = stored.payload.clone();
    assert_eq!(shown, stored);
    assert_eq!(shown.last_error, Some(record));

    let missing = f.run(&["show", "no-such-id"]).code(1);
    assert!(
        missing
            .stderr
            .contains("no outbox message has id \"no-such-id\""),
        "{}",
        missing.stderr
    );
}

async fn requeue_takes_dead_letters_and_refuses_the_rest<S: OutboxStore + OutboxAdmin>(
    f: Fixture<S>,
) {
    let a = f.dead_lettered("x", days_ago(3), error("a")).await;
    let b = f.dead_lettered("y", days_ago(2), error("b")).await;
    let c = f.dead_lettered("x", days_ago(1), error("c")).await;
    let live = f
        .claimed("live", Utc::now(), Duration::from_secs(3600))
        .await;
    let pending = f.pending("p", serde_json::json!({})).await;
    let before = (f.message(&live.id).await, f.message(&pending).await);

    // Refusals: exit 1 with the store's reason, and nothing changes.
    let refused = f.run(&["requeue", &live.id]).code(1);
    assert!(
        refused.stderr.contains("is claimed until")
            && refused.stderr.contains("wait for its lease to end"),
        "{}",
        refused.stderr
    );
    let refused = f.run(&["requeue", &pending]).code(1);
    assert!(
        refused.stderr.contains("is pending, not dead-lettered"),
        "{}",
        refused.stderr
    );
    f.run(&["requeue", "no-such-id"]).code(1);
    assert_eq!(
        (f.message(&live.id).await, f.message(&pending).await),
        before
    );
    assert_eq!(f.count(MessageStatus::DeadLettered).await, 3);

    // Usage errors.
    f.run(&["requeue"]).code(2);
    f.run(&["requeue", &a, "--name", "x"]).code(2);
    f.run(&["requeue", &a, "--all-dead-lettered"]).code(2);

    let one = f.run(&["requeue", &a]).ok();
    assert!(
        one.stdout.contains(&format!("requeued 1 message: {a}")),
        "{}",
        one.stdout
    );
    let named = f
        .run(&["requeue", "--all-dead-lettered", "--name", "x"])
        .ok();
    assert!(
        named
            .stdout
            .contains("requeued 1 dead-lettered message named \"x\""),
        "{}",
        named.stdout
    );
    let rest = f.run(&["requeue", "--all-dead-lettered"]).ok();
    assert!(
        rest.stdout.contains("requeued 1 dead-lettered message;"),
        "{}",
        rest.stdout
    );
    let none = f.run(&["requeue", "--all-dead-lettered"]).ok();
    assert!(
        none.stdout.contains("no dead-lettered messages"),
        "{}",
        none.stdout
    );
    for id in [&a, &b, &c] {
        let message = f.message(id).await;
        assert_eq!(
            (message.status, message.attempts),
            (MessageStatus::Pending, 0),
            "{id}"
        );
    }
}

async fn purge_removes_old_settled_messages_after_confirmation<S: OutboxStore + OutboxAdmin>(
    f: Fixture<S>,
) {
    let old = [
        f.delivered("a", days_ago(10)).await,
        f.delivered("b", days_ago(9)).await,
    ];
    let old_dead = f.dead_lettered("c", days_ago(8), error("gone")).await;
    let recent = f.delivered("d", days_ago(1)).await;
    let pending = f.pending("e", serde_json::json!({})).await;
    let total = || async { f.store.stats(Utc::now()).await.unwrap().total() };
    assert_eq!(total().await, 5);

    // Unsafe: refused with the store's reason (exit 1), even with --yes.
    let refused = f
        .run(&[
            "purge",
            "--status",
            "pending",
            "--older-than",
            "1s",
            "--yes",
        ])
        .code(1);
    assert!(
        refused
            .stderr
            .contains("refusing to purge pending messages"),
        "{}",
        refused.stderr
    );
    // No terminal to ask on and no --yes: refused, and told to pass --yes.
    let unconfirmed = f
        .run(&["purge", "--status", "delivered", "--older-than", "7d"])
        .code(2);
    assert!(
        unconfirmed.stderr.contains("--yes"),
        "{}",
        unconfirmed.stderr
    );
    f.run(&[
        "purge",
        "--status",
        "delivered",
        "--older-than",
        "7x",
        "--yes",
    ])
    .code(2);
    f.run(&["purge", "--older-than", "7d", "--yes"]).code(2);
    assert_eq!(total().await, 5, "nothing changed after the refusals");

    let purged = f
        .run(&[
            "purge",
            "--status",
            "delivered",
            "--older-than",
            "7d",
            "--yes",
        ])
        .ok();
    assert!(
        purged.stdout.starts_with("purged 2 delivered messages"),
        "{}",
        purged.stdout
    );
    for id in &old {
        assert!(f.store.get_message(id).await.is_err(), "{id} purged");
    }
    let purged = f
        .run(&[
            "purge",
            "--status",
            "dead_lettered",
            "--older-than",
            "7d",
            "--yes",
        ])
        .ok();
    assert!(
        purged.stdout.starts_with("purged 1 dead_lettered message "),
        "{}",
        purged.stdout
    );
    assert!(f.store.get_message(&old_dead).await.is_err());
    f.message(&recent).await;
    f.message(&pending).await;
    assert_eq!(total().await, 2);
}

async fn drain_once_print_writes_each_message_as_a_json_line<S: OutboxStore + OutboxAdmin>(
    f: Fixture<S>,
) {
    let event = f
        .pending("order.placed", serde_json::json!({"order_id": 7}))
        .await;
    let job = NewMessage::new(
        MessageKind::Job,
        "report.build",
        Payload::from_json(r#"{"day":"2026-05-01"}"#).unwrap(),
    )
    .with_max_attempts(2);
    let job = f.store.enqueue(job).await.unwrap().into_id();

    let run = f.run(&["drain", "--once", "--print"]).ok();
    let lines: Vec<Value> = run
        .stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{}", run.stdout);
    assert_eq!(lines[0]["id"], event.as_str());
    assert_eq!(lines[0]["kind"], "event");
    assert_eq!(lines[0]["name"], "order.placed");
    assert_eq!(lines[0]["attempt"], 1);
    assert_eq!(lines[0]["payload"], serde_json::json!({"order_id": 7}));
    assert_eq!(lines[1]["id"], job.as_str());
    assert_eq!(lines[1]["kind"], "job");
    assert_eq!(lines[1]["max_attempts"], 2);
    assert_eq!(lines[1]["payload"]["day"], "2026-05-01");
    assert!(
        run.stderr
            .contains("pass: claimed 2, delivered 2, retried 0"),
        "{}",
        run.stderr
    );
    for id in [&event, &job] {
        assert_eq!(f.message(id).await.status, MessageStatus::Delivered);
    }

    let idle = f.run(&["drain", "--once", "--print"]).ok();
    assert!(idle.stdout.is_empty(), "{}", idle.stdout);
    assert!(
        idle.stderr.contains("pass: claimed 0, delivered 0"),
        "{}",
        idle.stderr
    );
}

async fn drain_once_exec_retries_what_its_command_fails<S: OutboxStore + OutboxAdmin>(
    f: Fixture<S>,
) {
    let good = f.pending("good", serde_json::json!({"n": 1})).await;
    let bad = f.pending("bad", serde_json::json!({"n": 2})).await;
    let last_chance = NewMessage::new(
        MessageKind::Job,
        "bad",
        Payload::from_json(r#"{"n":3}"#).unwrap(),
    )
    .with_max_attempts(1);
    let last_chance = f.store.enqueue(last_chance).await.unwrap().into_id();

    let out = f.dir.path().join("delivered");
    std::fs::create_dir_all(&out).unwrap();
    // Saves what it got; refuses the name `bad` with two lines on stderr.
    let script = format!(
        r#"if [ "$OUTBOX_NAME" = bad ]; then
             echo "looking at $OUTBOX_ID" >&2
             echo "cannot deliver $OUTBOX_KIND $OUTBOX_ID" >&2
             exit 3
           fi
           cat > "{out}/$OUTBOX_ID.json"
           echo "$OUTBOX_NAME $OUTBOX_KIND $OUTBOX_ATTEMPT $OUTBOX_MAX_ATTEMPTS" > "{out}/$OUTBOX_ID.env"
           echo "delivered $OUTBOX_ID""#,
        out = out.display()
    );
    // Exit 3: some delivery failed.
    let run = f.run(&["drain", "--once", "--exec", &script]).code(3);
    assert!(
        run.stderr
            .contains("pass: claimed 3, delivered 1, retried 1, dead-lettered 1 (0 abandoned)"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr
            .contains(&format!("{bad} (event bad, attempt 1 of 25) failed")),
        "{}",
        run.stderr
    );
    // The command's stdout is passed through.
    assert_eq!(run.stdout.trim(), format!("delivered {good}"));

    // Compared as JSON: PostgreSQL's jsonb gives back its own spacing.
    let payload = std::fs::read_to_string(out.join(format!("{good}.json"))).unwrap();
    let payload: Value = serde_json::from_str(&payload).unwrap();
    assert_eq!(payload, serde_json::json!({"n": 1}));
    let env = std::fs::read_to_string(out.join(format!("{good}.env"))).unwrap();
    assert_eq!(env.trim(), "good event 1 25");

    assert_eq!(f.message(&good).await.status, MessageStatus::Delivered);
    let retried = f.message(&bad).await;
    assert_eq!(
        (retried.status, retried.attempts),
        (MessageStatus::Pending, 1)
    );
    assert!(retried.available_at > Utc::now() - chrono::Duration::seconds(1));
    let error = retried.last_error.unwrap();
    assert_eq!(
        error.message,
        format!("the command exited with status 3: looking at {bad}\ncannot deliver event {bad}")
    );
    let dead = f.message(&last_chance).await;
    assert_eq!(dead.status, MessageStatus::DeadLettered);
    assert!(
        dead.last_error
            .unwrap()
            .message
            .contains(&format!("cannot deliver job {last_chance}"))
    );
}

async fn drain_flags_are_validated_before_anything_runs<S: OutboxStore + OutboxAdmin>(
    f: Fixture<S>,
) {
    let id = f.pending("p", serde_json::json!({})).await;
    let invalid = f
        .run(&[
            "drain",
            "--once",
            "--print",
            "--batch-size",
            "2",
            "--concurrency",
            "5",
        ])
        .code(2);
    assert!(
        invalid
            .stderr
            .contains("`--concurrency` must not exceed batch_size (5 > 2)"),
        "{}",
        invalid.stderr
    );
    let invalid = f
        .run(&["drain", "--once", "--print", "--prefetch", "5000"])
        .code(2);
    assert!(
        invalid
            .stderr
            .contains("`--prefetch` must be at most 4096 (5000 given)"),
        "{}",
        invalid.stderr
    );
    let invalid = f
        .run(&[
            "drain",
            "--once",
            "--print",
            "--lease",
            "10s",
            "--heartbeat",
            "10s",
        ])
        .code(2);
    assert!(
        invalid.stderr.contains("`--heartbeat`"),
        "{}",
        invalid.stderr
    );
    // The heartbeat nobody set is derived from the lease: only the lease is wrong.
    let invalid = f
        .run(&["drain", "--once", "--print", "--lease", "0s"])
        .code(2);
    assert!(
        invalid.stderr.contains("`--lease` must be at least")
            && !invalid.stderr.contains("heartbeat"),
        "{}",
        invalid.stderr
    );
    for args in [
        &["drain", "--once"][..],
        &["drain", "--print"],
        &["drain", "--once", "--every", "1s", "--print"],
        &["drain", "--once", "--print", "--exec", "true"],
        &["drain", "--once", "--print", "--lease", "soon"],
        &["drain", "--once", "--print", "--batch-size", "-1"],
        &["drain", "--every", "0s", "--print"],
    ] {
        f.run(args).code(2);
    }
    let untouched = f.message(&id).await;
    assert_eq!(
        (untouched.status, untouched.attempts),
        (MessageStatus::Pending, 0)
    );
}

/// `--delete-on-delivery` keeps no delivered row; `--retain-delivered` and
/// `--retain-dead-lettered` delete settled rows past their age while the
/// command runs, and keep the younger ones.
async fn drain_deletes_settled_messages_when_asked<S: OutboxStore + OutboxAdmin>(f: Fixture<S>) {
    f.pending("p", serde_json::json!({})).await;
    let run = f
        .run(&["drain", "--once", "--print", "--delete-on-delivery"])
        .ok();
    assert_eq!(run.stdout.lines().count(), 1, "{}", run.stdout);
    assert!(
        run.stderr.contains("pass: claimed 1, delivered 1"),
        "{}",
        run.stderr
    );
    assert_eq!(f.count(MessageStatus::Pending).await, 0);
    assert_eq!(f.count(MessageStatus::Delivered).await, 0);

    for (args, says) in [
        (
            &["drain", "--once", "--print", "--retain-delivered", "1d"][..],
            "--once",
        ),
        (
            &[
                "drain",
                "--every",
                "1h",
                "--print",
                "--delete-on-delivery",
                "--retain-delivered",
                "1d",
            ],
            "--delete-on-delivery",
        ),
        (
            &[
                "drain",
                "--every",
                "1h",
                "--print",
                "--retain-dead-lettered",
                "1d",
                "--retention-every",
                "0s",
            ],
            "`--retention-every` must be longer than zero",
        ),
    ] {
        let refused = f.run(args).code(2);
        assert!(
            refused.stderr.contains(says),
            "{args:?}: {}",
            refused.stderr
        );
    }

    let recent = f.delivered("recent", hours_ago(1)).await;
    f.delivered("old", days_ago(2)).await;
    f.dead_lettered("dead", days_ago(40), error("gone")).await;
    let kept_dead = f.dead_lettered("dead", days_ago(2), error("kept")).await;
    let child = f
        .command(&[
            "drain",
            "--every",
            "1h",
            "--print",
            "--retain-delivered",
            "1d",
            "--retain-dead-lettered",
            "30d",
            "--retention-every",
            "100ms",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id().to_string();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while (
        f.count(MessageStatus::Delivered).await,
        f.count(MessageStatus::DeadLettered).await,
    ) != (1, 1)
    {
        if std::time::Instant::now() > deadline {
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
            panic!("the old settled messages were not deleted within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let sent = Command::new("kill").args(["-INT", &pid]).status().unwrap();
    assert!(sent.success(), "kill -INT");
    wait(child, &pid).code(0);
    assert_eq!(f.message(&recent).await.status, MessageStatus::Delivered);
    assert_eq!(
        f.message(&kept_dead).await.status,
        MessageStatus::DeadLettered
    );
}

async fn drain_every_stops_on_a_signal_and_releases_claims<S: OutboxStore + OutboxAdmin>(
    f: Fixture<S>,
) {
    let id = f.pending("slow", serde_json::json!({})).await;
    let fifo = f.dir.path().join("started");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success(), "mkfifo");
    // The delivery says it started (opening the FIFO waits for this test to
    // read it), then runs until it is killed.
    let script = format!("echo started > '{}'; exec sleep 600", fifo.display());
    let child = f
        .command(&["drain", "--every", "1h", "--grace", "0s", "--exec", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id().to_string();

    let mut started = String::new();
    std::fs::File::open(&fifo)
        .unwrap()
        .read_to_string(&mut started)
        .unwrap();
    assert_eq!(started.trim(), "started");
    let claimed = f.message(&id).await;
    assert_eq!(
        (claimed.status, claimed.attempts),
        (MessageStatus::Claimed, 1)
    );

    let sent = Command::new("kill").args(["-INT", &pid]).status().unwrap();
    assert!(sent.success(), "kill -INT");
    let run = wait(child, &pid).code(0);
    assert!(
        run.stderr.contains("draining table") && run.stderr.contains("Ctrl-C stops"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr
            .contains("interrupted pass: claimed 1, delivered 0, retried 0, dead-lettered 0 (0 abandoned), settlement failed 0, lease lost 0, released 1"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("stopped after"), "{}", run.stderr);
    let released = f.message(&id).await;
    assert_eq!(
        (released.status, released.attempts, released.claim_token),
        (MessageStatus::Pending, 0, None),
        "the claim was given back without counting the attempt"
    );
}

/// On PostgreSQL a committed message wakes `drain --every` at once: with an
/// hour between ticks, only a wake-up (the listener's first look, or a
/// notification) delivers the later messages. Commits notify only a drain
/// that asked, so each message is enqueued once the command has asked
/// (and asked again after the wake-up the previous one used up).
#[tokio::test]
async fn postgres_drain_every_drains_a_committed_message_without_waiting_for_a_tick() {
    let f = postgres().await;
    let mut child = f
        .command(&["drain", "--every", "1h", "--print"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id().to_string();
    let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let (line, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for text in stdout.lines() {
            if line.send(text.unwrap()).is_err() {
                return;
            }
        }
    });
    let next_line = || {
        lines
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| {
                let _ = Command::new("kill").args(["-KILL", &pid]).status();
                panic!("no message was printed within 60 s")
            })
    };

    // An arming is live and no wake-up has served it yet.
    let armed = format!(
        "SELECT coalesce(pg_sequence_last_value('\"{t}_armed\"'), 0) \
           > greatest(coalesce(pg_sequence_last_value('\"{t}_served\"'), 0), \
             (date_part('epoch', clock_timestamp()) * 1000)::int8)",
        t = f.table
    );
    for name in ["first", "second", "third"] {
        let asked = async {
            while !sqlx::query_scalar::<_, bool>(sqlx::AssertSqlSafe(armed.clone()))
                .fetch_one(f.store.pool())
                .await
                .unwrap_or(false)
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        if tokio::time::timeout(Duration::from_secs(60), asked)
            .await
            .is_err()
        {
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
            panic!("the drain did not ask for a wake-up within 60 s (before {name})");
        }
        let id = f.pending(name, serde_json::json!({ "name": name })).await;
        let printed: Value = serde_json::from_str(&next_line()).unwrap();
        assert_eq!(printed["id"], id.as_str());
    }

    let sent = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(sent.success(), "kill -TERM");
    let run = wait(child, &pid).ok();
    assert!(run.stderr.contains("and on every commit"), "{}", run.stderr);
    assert!(run.stderr.contains("delivered 3"), "{}", run.stderr);
}

/// Wait for `child`; a child that hangs is killed so the test fails instead.
fn wait(child: std::process::Child, pid: &str) -> Run {
    let (done, result) = std::sync::mpsc::channel();
    std::thread::spawn(move || done.send(child.wait_with_output()));
    match result.recv_timeout(Duration::from_secs(120)) {
        Ok(output) => finish(output.unwrap()),
        Err(_) => {
            let _ = Command::new("kill").args(["-KILL", pid]).status();
            panic!("the drain did not stop within 120 s of SIGINT");
        }
    }
}

#[test]
fn usage_errors_exit_2_with_what_to_do() {
    let none = outbox(&["status"]).code(2);
    assert!(
        none.stderr
            .contains("--database URL or set OUTBOX_DATABASE_URL"),
        "{}",
        none.stderr
    );
    let scheme = outbox(&["--database", "mysql://u:secret@h/db", "status"]).code(2);
    assert!(
        scheme
            .stderr
            .contains("unsupported database URL scheme `mysql`")
            && scheme.stderr.contains("sqlite://PATH"),
        "{}",
        scheme.stderr
    );
    assert!(!scheme.stderr.contains("secret"), "{}", scheme.stderr);
    let table = outbox(&[
        "--database",
        "sqlite://unused.db",
        "--table",
        "orders; drop table orders",
        "status",
    ])
    .code(2);
    assert!(
        table.stderr.contains("invalid outbox table name"),
        "{}",
        table.stderr
    );
    outbox(&["--database", "sqlite://unused.db", "frobnicate"]).code(2);
    outbox(&["--database", "sqlite://unused.db", "show"]).code(2);
    assert!(!Path::new("unused.db").exists());
    let help = outbox(&["--help"]).ok();
    assert!(help.stdout.contains("Examples:"), "{}", help.stdout);
    let help = outbox(&["drain", "--help"]).ok();
    assert!(help.stdout.contains("OUTBOX_ATTEMPT"), "{}", help.stdout);
}

#[test]
fn the_environment_gives_the_database_and_the_table() {
    let dir = TempDir::new();
    let url = format!("sqlite://{}", dir.path().join("env.db").display());
    let run = |args: &[&str]| {
        finish(
            outbox_command()
                .env("OUTBOX_DATABASE_URL", &url)
                .env("OUTBOX_TABLE", "from_env")
                .args(args)
                .output()
                .unwrap(),
        )
    };
    let created = run(&["migrate"]).ok();
    assert!(
        created.stdout.starts_with("created table from_env"),
        "{}",
        created.stdout
    );
    assert_eq!(run(&["status", "--json"]).ok().json()["table"], "from_env");
}

/// `retried` plus `dead-lettered` of a report line.
fn failures_in(report: &str) -> u64 {
    let after = |label: &str| -> u64 {
        let at = report
            .find(label)
            .unwrap_or_else(|| panic!("no {label:?} in {report:?}"))
            + label.len();
        report[at..]
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    after("retried ") + after("dead-lettered ")
}

async fn drain_once_counts_every_pass_and_exits_3_when_a_delivery_failed<
    S: OutboxStore + OutboxAdmin,
>(
    f: Fixture<S>,
) {
    for n in 0..5 {
        f.pending("failing", serde_json::json!({ "n": n })).await;
    }
    // Small batches and retries due at once: the coordinator runs passes
    // of its own while the requested one ends, and they count too.
    let run = f
        .run(&[
            "drain",
            "--once",
            "--batch-size",
            "2",
            "--concurrency",
            "1",
            "--retry-delay",
            "1ms",
            "--retry-max-delay",
            "1ms",
            "--exec",
            "exit 3",
        ])
        .code(3);
    let failed_lines = run
        .stderr
        .lines()
        .filter(|l| l.contains(") failed: "))
        .count() as u64;
    let totals = run
        .stderr
        .lines()
        .rfind(|l| l.starts_with("pass: ") || l.starts_with("all "))
        .unwrap_or_else(|| panic!("no report:\n{}", run.stderr));
    assert_eq!(failures_in(totals), failed_lines, "{}", run.stderr);
    assert!(
        run.stderr
            .contains(&format!("error: {failed_lines} deliveries failed")),
        "{}",
        run.stderr
    );
    // Every one printed a failure, and nothing was left claimed.
    assert_eq!(f.count(MessageStatus::Claimed).await, 0);
}

#[tokio::test]
async fn drain_once_never_panics_at_exit() {
    let f = sqlite().await;
    for round in 0..100 {
        f.pending("failing", serde_json::json!({ "round": round }))
            .await;
        let run = f.run(&["drain", "--once", "--exec", "exit 3"]);
        assert!(
            !run.stderr.contains("panicked"),
            "round {round}:\n{}",
            run.stderr
        );
        assert_eq!(run.code, 3, "round {round}:\n{}", run.stderr);
    }
}

/// A SQLite file that is not an outbox: one table, rollback journal.
async fn plain_sqlite_file(path: &Path) {
    use std::str::FromStr;
    let options =
        sqlx::sqlite::SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))
            .unwrap()
            .create_if_missing(true);
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .connect_with(options)
        .await
        .unwrap();
    sqlx::query("CREATE TABLE notes (body TEXT)")
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
}

fn siblings(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn read_only_commands_never_change_a_sqlite_file() {
    let dir = TempDir::new();
    let file = dir.path().join("notes.db");
    plain_sqlite_file(&file).await;
    let before = std::fs::read(&file).unwrap();
    let url = format!("sqlite://{}", file.display());
    for args in [
        &["status"][..],
        &["status", "--json"],
        &["list"],
        &["show", "some-id"],
    ] {
        let run = outbox(&[&["--database", &url][..], args].concat()).code(1);
        assert!(
            run.stderr
                .contains("the outbox table `outbox` does not exist"),
            "{}",
            run.stderr
        );
    }
    // Same bytes (so still in rollback-journal mode), and no -wal/-shm.
    assert_eq!(std::fs::read(&file).unwrap(), before);
    assert_eq!(siblings(dir.path()), ["notes.db"]);

    let missing = dir.path().join("missing.db");
    let url = format!("sqlite://{}", missing.display());
    for args in [&["status"][..], &["list"], &["show", "some-id"]] {
        let run = outbox(&[&["--database", &url][..], args].concat()).code(1);
        assert!(
            run.stderr.contains("cannot open the database") && run.stderr.contains("migrate"),
            "{}",
            run.stderr
        );
    }
    assert_eq!(siblings(dir.path()), ["notes.db"]);
}

#[tokio::test]
async fn unreadable_rows_are_listed_and_shown_with_their_raw_columns() {
    let f = sqlite().await;
    let good = f.pending("good", serde_json::json!({"n": 1})).await;
    let bad = f.pending("bad", serde_json::json!({"n": 2})).await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE \"{}\" SET payload = 'not json {{' WHERE id = ?1",
        f.table
    )))
    .bind(&bad)
    .execute(f.store.pool())
    .await
    .unwrap();

    let list = f.run(&["list"]).ok();
    let lines: Vec<&str> = list.stdout.lines().collect();
    assert!(lines[1].starts_with(&good), "{}", list.stdout);
    assert!(
        lines[2].starts_with(&bad)
            && lines[2].contains("UNREADABLE")
            && lines[2].contains("does not decode: payload"),
        "{}",
        list.stdout
    );
    assert!(
        list.stdout.contains("1 row cannot be read as a message")
            && list.stdout.contains("2 messages; no more pages"),
        "{}",
        list.stdout
    );
    let json = f.run(&["list", "--json"]).ok().json();
    assert_eq!(json["messages"].as_array().unwrap().len(), 1);
    assert_eq!(json["unreadable"][0]["id"], Value::from(bad.clone()));
    assert_eq!(
        json["unreadable"][0]["columns"]["payload"],
        Value::from("not json {")
    );

    let show = f.run(&["show", &bad]).ok();
    assert!(
        show.stdout
            .contains("UNREADABLE  the row does not decode: payload")
            && show.stdout.contains("payload, as stored:\n  not json {")
            && show.stdout.lines().any(|line| {
                let cells: Vec<&str> = line.split_whitespace().collect();
                cells == ["name", "bad"]
            }),
        "{}",
        show.stdout
    );
    let json = f.run(&["show", &bad, "--json"]).ok().json();
    assert_eq!(json["unreadable"], Value::from(true));
    assert_eq!(json["columns"]["payload"], Value::from("not json {"));
}

#[test]
fn connection_errors_name_the_cause() {
    let no_path = outbox(&["--database", "sqlite://", "status"]).code(2);
    assert!(
        no_path.stderr.contains("has no path") && no_path.stderr.contains("sqlite://app.db"),
        "{}",
        no_path.stderr
    );
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let started = std::time::Instant::now();
    let refused = outbox(&[
        "--database",
        &format!("postgres://app:secret@127.0.0.1:{port}/app"),
        "status",
    ])
    .code(1);
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        refused.stderr.contains("Connection refused") && !refused.stderr.contains("secret"),
        "{}",
        refused.stderr
    );
}

#[tokio::test]
async fn a_reader_that_goes_away_ends_the_output_without_a_panic() {
    let f = sqlite().await;
    let mut last = String::new();
    for n in 0..50 {
        last = f
            .pending("order.placed", serde_json::json!({ "n": n }))
            .await;
    }
    for args in [vec!["list", "--limit", "50"], vec!["show", &last]] {
        let mut child = f
            .command(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the binary runs");
        // Closed before the command has opened its database, so its first
        // write meets a pipe with no reader, as `outbox list | head` does
        // once head has its lines.
        drop(child.stdout.take());
        let run = finish(child.wait_with_output().expect("the binary ends"));
        assert!(
            !run.stderr.contains("panicked"),
            "{args:?}:\n{}",
            run.stderr
        );
        assert_eq!(run.code, 0, "{args:?}:\n{}", run.stderr);
    }
}

#[test]
fn web_refuses_an_unauthenticated_remote_bind_before_opening_the_database() {
    let dir = TempDir::new();
    let url = format!("sqlite://{}", dir.path().join("none.db").display());
    let refused = outbox(&["--database", &url, "web", "--bind", "0.0.0.0:8089"]).code(2);
    assert!(
        refused.stderr.contains("without --auth-token")
            && refused.stderr.contains("--allow-remote"),
        "{}",
        refused.stderr
    );
    let garbage = outbox(&["--database", &url, "web", "--bind", "localhost"]).code(2);
    assert!(
        garbage.stderr.contains("not an address and port"),
        "{}",
        garbage.stderr
    );
    assert!(!dir.path().join("none.db").exists());
}

/// One HTTP/1.0 request to the dashboard: its status line and body.
fn http(port: u16, request: &str) -> std::io::Result<String> {
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.write_all(request.as_bytes())?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    Ok(response)
}

#[test]
fn web_serves_the_dashboard_and_read_only_refuses_changes() {
    let dir = TempDir::new();
    let url = format!("sqlite://{}", dir.path().join("web.db").display());
    outbox(&["--database", &url, "migrate"]).ok();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let bind = format!("127.0.0.1:{port}");
    let mut server = outbox_command()
        .args(["--database", &url, "web", "--bind", &bind, "--read-only"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("outbox web starts");
    // Waiting for a real process to listen: a bounded poll.
    let mut overview = None;
    for _ in 0..200 {
        if let Ok(response) = http(port, "GET / HTTP/1.0\r\n\r\n") {
            overview = Some(response);
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let refused = http(
        port,
        "POST /requeue HTTP/1.0\r\nContent-Type: application/x-www-form-urlencoded\r\n\
         Content-Length: 4\r\n\r\nid=x",
    );
    let _ = server.kill();
    let _ = server.wait();
    let overview = overview.expect("the dashboard answered within 10 s");
    assert!(overview.starts_with("HTTP/1.0 200"), "{overview}");
    assert!(overview.contains("<b>0</b>dead-lettered"), "{overview}");
    let refused = refused.unwrap();
    assert!(refused.starts_with("HTTP/1.0 403"), "{refused}");
    assert!(refused.contains("read-only"), "{refused}");
}
