//! `outbox status` shows the periodic schedules the store keeps, on SQLite
//! and on PostgreSQL (at `DATABASE_URL`; run with `scripts/with-postgres
//! cargo test -p outbox-cli --test schedules`). The schedules are written
//! through the library, as the processes that run them write them.

use std::process::{Command, Stdio};

use chrono::{DateTime, Utc};
use outbox::{
    DeclareSchedule, EnqueueOptions, EnqueueSlot, MessageKind, NewMessage, OutboxStore,
    PostgresOutbox, SqliteOutbox, slot_key,
};
use serde_json::Value;

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn ok(self) -> Self {
        assert_eq!(
            self.code, 0,
            "exit code\n--- stdout\n{}\n--- stderr\n{}",
            self.stdout, self.stderr
        );
        self
    }
}

/// One outbox table, reached through the library and through the binary.
struct Fixture<S> {
    url: String,
    table: String,
    store: S,
    /// Removed when the test ends (SQLite's file lives there).
    dir: std::path::PathBuf,
}

impl<S> Drop for Fixture<S> {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl<S: OutboxStore> Fixture<S> {
    fn run(&self, args: &[&str]) -> Run {
        let output = Command::new(env!("CARGO_BIN_EXE_outbox"))
            .env_remove("OUTBOX_DATABASE_URL")
            .env_remove("OUTBOX_TABLE")
            .stdin(Stdio::null())
            .args(["--database", &self.url, "--table", &self.table])
            .args(args)
            .output()
            .expect("the binary runs");
        Run {
            code: output.status.code().expect("the binary exited"),
            stdout: String::from_utf8(output.stdout).unwrap(),
            stderr: String::from_utf8(output.stderr).unwrap(),
        }
    }

    async fn declare(&self, name: &str, expression: &str, next: DateTime<Utc>) {
        self.store
            .schedules()
            .unwrap()
            .declare_schedule(DeclareSchedule {
                name: name.to_owned(),
                expression: expression.to_owned(),
                time_zone: "Europe/Paris".to_owned(),
                message_name: "report.nightly".to_owned(),
                next_slot: Some(next),
                now: Utc::now() - chrono::Duration::days(2),
            })
            .await
            .unwrap();
    }

    async fn enqueue_slot(&self, name: &str, slot: DateTime<Utc>, next: DateTime<Utc>) -> String {
        let message = NewMessage::new(MessageKind::Job, "report.nightly", Value::Null.into())
            .with_options(
                EnqueueOptions::new()
                    .run_at(slot)
                    .idempotency_key(slot_key(name, slot), std::time::Duration::from_secs(60)),
            );
        let outcome = self
            .store
            .schedules()
            .unwrap()
            .enqueue_slot(EnqueueSlot {
                schedule: name.to_owned(),
                slot,
                next_slot: Some(next),
                enqueued_by: "worker-1:4242".to_owned(),
                message,
            })
            .await
            .unwrap();
        match outcome {
            outbox::SlotOutcome::Enqueued(enqueued) => enqueued.into_id(),
            other => panic!("the slot was not enqueued: {other:?}"),
        }
    }
}

fn temp_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "outbox-cli-schedules-{}-{}",
        std::process::id(),
        Utc::now().timestamp_nanos_opt().unwrap_or_default()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn sqlite() -> Fixture<SqliteOutbox> {
    let dir = temp_dir();
    let url = format!("sqlite://{}", dir.join("outbox.db").display());
    let store = SqliteOutbox::builder(
        sqlx::sqlite::SqlitePoolOptions::new()
            .connect_with(SqliteOutbox::connect_options(&url).unwrap())
            .await
            .unwrap(),
    )
    .table("cli_schedules")
    .unwrap()
    .build();
    let fixture = Fixture {
        url,
        table: "cli_schedules".to_owned(),
        store,
        dir,
    };
    fixture.run(&["migrate"]).ok();
    fixture
}

async fn postgres() -> Fixture<PostgresOutbox> {
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| {
        panic!(
            "DATABASE_URL is not set. The PostgreSQL tests of the command line need a server: \
             run them with `scripts/with-postgres cargo test -p outbox-cli --test schedules`"
        )
    });
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&url)
        .await
        .unwrap();
    let table = format!("cli_schedules_{}", std::process::id());
    let store = PostgresOutbox::builder(pool).table(&table).unwrap().build();
    let fixture = Fixture {
        url,
        table,
        store,
        dir: temp_dir(),
    };
    fixture.run(&["migrate"]).ok();
    fixture
}

async fn status_lists_schedules<S: OutboxStore>(f: Fixture<S>) {
    let status = f.run(&["status"]).ok().stdout;
    assert!(!status.contains("periodic schedule"), "none yet: {status}");

    // Stores keep microseconds.
    let now = chrono::SubsecRound::trunc_subsecs(Utc::now(), 6);
    let slot = now - chrono::Duration::hours(3);
    let next = now + chrono::Duration::hours(21);
    f.declare("nightly-report", "cron 0 3 * * *", next).await;
    let id = f.enqueue_slot("nightly-report", slot, next).await;
    // Declared long ago, its next slot two hours past: no process runs it.
    f.declare("stale-sync", "every 15m", now - chrono::Duration::hours(2))
        .await;

    let status = f.run(&["status"]).ok().stdout;
    assert!(status.contains("2 periodic schedules:"), "{status}");
    for text in [
        "NAME",
        "CADENCE",
        "NEXT SLOT",
        "LAST ENQUEUED BY",
        "nightly-report",
        "cron 0 3 * * *",
        "Europe/Paris",
        "worker-1:4242",
        "(3h",
        "in 20h",
        "stale-sync",
        "every 15m",
        "none yet",
    ] {
        assert!(status.contains(text), "`{text}` missing from:\n{status}");
    }
    assert!(
        status.contains("overdue: stale-sync"),
        "the stale schedule is called out:\n{status}"
    );
    assert!(!status.contains("overdue: nightly"), "{status}");

    let json: Value = serde_json::from_str(&f.run(&["status", "--json"]).ok().stdout).unwrap();
    let schedules = json["schedules"].as_array().expect("a list of schedules");
    assert_eq!(schedules.len(), 2);
    let nightly = &schedules[0];
    assert_eq!(nightly["name"], "nightly-report");
    assert_eq!(nightly["expression"], "cron 0 3 * * *");
    assert_eq!(nightly["time_zone"], "Europe/Paris");
    assert_eq!(nightly["message_name"], "report.nightly");
    assert_eq!(nightly["last_enqueued_by"], "worker-1:4242");
    assert_eq!(nightly["last_message_id"], id.as_str());
    let last: DateTime<Utc> = nightly["last_slot"].as_str().unwrap().parse().unwrap();
    assert_eq!(last, slot);
    assert_eq!(schedules[1]["name"], "stale-sync");
    assert_eq!(schedules[1]["last_slot"], Value::Null);
}

#[tokio::test]
async fn status_lists_schedules_on_sqlite() {
    status_lists_schedules(sqlite().await).await;
}

#[tokio::test]
async fn status_lists_schedules_on_postgres() {
    status_lists_schedules(postgres().await).await;
}

/// A table set up before schedules existed: `status` still answers, and
/// says how to add them.
#[tokio::test]
async fn status_on_a_table_without_schedules_says_to_migrate() {
    let f = sqlite().await;
    sqlx::query("DROP TABLE \"cli_schedules_schedules\"")
        .execute(f.store.pool())
        .await
        .unwrap();
    let status = f.run(&["status"]).ok().stdout;
    assert!(status.contains("`outbox migrate` adds it"), "{status}");
    let json: Value = serde_json::from_str(&f.run(&["status", "--json"]).ok().stdout).unwrap();
    assert_eq!(json["schedules"], Value::Array(Vec::new()));
}
