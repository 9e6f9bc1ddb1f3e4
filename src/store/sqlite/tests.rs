//! The SQLite store's internals against real database files: the order of
//! its columns, the plans and answers of its fenced writes, and the claim's
//! decode by position.

use std::path::PathBuf;
use std::time::Duration;

use chrono::TimeZone;
use sqlx::AssertSqlSafe;

use super::settle::COUNTED_FROM;
use super::*;
use crate::error::ErrorRecord;
use crate::kind::{MessageKind, MessageStatus};
use crate::message::NewMessage;
use crate::store::fenced::{FencedBackend, FencedOp, FencedWrite};
use crate::store::{ClaimBatch, OutboxAdmin, OutboxStore};

/// The store's statements select the message columns in the order the
/// shared decode reads them by position (any other order is still read,
/// by name, at a cost per row).
#[test]
fn statements_select_the_columns_in_the_decoded_order() {
    assert_eq!(
        statements::COLUMNS.split(", ").collect::<Vec<_>>(),
        crate::store::sql::MESSAGE_COLUMNS
    );
}

/// A database file of its own, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str) -> Self {
        let unique = crate::message::new_claim_token();
        TempFile(std::env::temp_dir().join(format!("outbox-unit-{name}-{unique}.db")))
    }

    fn url(&self) -> String {
        format!("sqlite://{}", self.0.display())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut path = self.0.clone().into_os_string();
            path.push(suffix);
            let _ = std::fs::remove_file(path);
        }
    }
}

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap()
}

/// A store holding `count` claimed messages, and those claims.
async fn claimed(file: &TempFile, count: usize) -> (SqliteOutbox, Vec<crate::ClaimedMessage>) {
    let store = SqliteOutbox::connect(&file.url()).await.unwrap();
    for n in 0..count {
        let payload = crate::Payload::from_json(format!("{{\"n\":{n}}}")).unwrap();
        let message = NewMessage::new(MessageKind::Event, "test", payload).at(t0());
        store.enqueue(message).await.unwrap();
    }
    let batch = store
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: count,
            now: t0(),
            lease: Duration::from_secs(30),
            max_attempts: crate::DEFAULT_MAX_ATTEMPTS,
            queues: Vec::new(),
            durable: true,
        })
        .await
        .unwrap();
    assert_eq!(batch.claimed.len(), count);
    (store, batch.claimed)
}

fn row(op: FencedOp, message: &crate::ClaimedMessage) -> FencedWrite {
    FencedWrite {
        op,
        id: message.id.clone(),
        claim_token: message.claim_token.clone(),
        now: t0() + chrono::Duration::seconds(1),
        error: Some(ErrorRecord::new("test::Failure", "failed").to_json()),
    }
}

/// Every fenced write looks its rows up by id, with statistics of a
/// table of mostly settled rows and few claims.
#[tokio::test]
async fn every_fenced_write_looks_rows_up_by_id() {
    let file = TempFile::new("plans");
    let (store, _) = claimed(&file, 2_000).await;
    sqlx::query("UPDATE \"outbox\" SET status = 'delivered' WHERE seq > 3")
        .execute(store.pool())
        .await
        .unwrap();
    let mut conn = store.pool().acquire().await.unwrap();
    sqlx::query("ANALYZE").execute(&mut *conn).await.unwrap();
    for statement in store.inner.core.sql.fenced.all() {
        let plan: Vec<String> =
            sqlx::query(AssertSqlSafe(format!("EXPLAIN QUERY PLAN {statement}")))
                .bind("[]")
                .fetch_all(&mut *conn)
                .await
                .unwrap()
                .iter()
                .map(|row| row.get::<String, _>("detail"))
                .collect();
        assert!(
            plan.iter()
                .any(|l| l.contains("USING INDEX sqlite_autoindex") && l.contains("(id=?)")),
            "{statement}\ndoes not look rows up by id:\n{}",
            plan.join("\n")
        );
    }
}

/// A write of many rows is counted rather than returning ids: when
/// every row applies, all are answered `Ok`; when some do not, the
/// count is short, the write is undone and run again returning ids, so
/// each row still gets its own answer and the others still apply.
#[tokio::test]
async fn a_counted_write_answers_each_row() {
    let file = TempFile::new("counted");
    let (store, claims) = claimed(&file, 2 * COUNTED_FROM).await;
    let (first, second) = claims.split_at(COUNTED_FROM);
    let rows: Vec<_> = first.iter().map(|c| row(FencedOp::Deliver, c)).collect();
    let results = store.inner.core.apply(&rows).await.unwrap();
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let mut rows: Vec<_> = second.iter().map(|c| row(FencedOp::Deliver, c)).collect();
    rows[1].claim_token = "not-the-token".into();
    rows[4].claim_token = "not-the-token".into();
    let results = store.inner.core.apply(&rows).await.unwrap();
    for (n, (result, claim)) in results.iter().zip(second).enumerate() {
        let stored = store.get_message(&claim.id).await.unwrap();
        if n == 1 || n == 4 {
            assert!(
                matches!(result, Err(Error::Claim(_))),
                "row {n}: {result:?}"
            );
            assert_eq!(stored.status, MessageStatus::Claimed);
        } else {
            assert!(result.is_ok(), "row {n}: {result:?}");
            assert_eq!(stored.status, MessageStatus::Delivered);
        }
    }
}

/// The claim's decode by position gives what the full decode of the
/// same row gives.
#[tokio::test]
async fn a_claimed_row_decodes_as_the_full_decode_does() {
    let file = TempFile::new("decode");
    let store = SqliteOutbox::connect(&file.url()).await.unwrap();
    let payload = crate::Payload::from_json(r#"{"n": [1, "two"]}"#).unwrap();
    let message = NewMessage::new(MessageKind::Job, "decode", payload)
        .at(t0())
        .with_ordering_key("k");
    store.enqueue(message).await.unwrap();
    let cap = 7;
    let batch = store
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit: 1,
            now: t0(),
            lease: Duration::from_secs(30),
            max_attempts: cap,
            queues: Vec::new(),
            durable: true,
        })
        .await
        .unwrap();
    let claimed = &batch.claimed[0];
    let row = sqlx::query(AssertSqlSafe(format!(
        "SELECT {} FROM \"outbox\"",
        statements::COLUMNS
    )))
    .fetch_one(store.pool())
    .await
    .unwrap();
    let full = Shared::decode(&row).unwrap().into_message().unwrap();
    assert_eq!(*claimed, sql::claimed_view(full, cap).unwrap());
    assert_eq!(claimed.ordering_key.as_deref(), Some("k"));
    assert_eq!(claimed.max_attempts, cap);
}

/// A batch mixing kinds of writes runs one statement per kind; one that
/// fails fails its own rows, and the others still apply.
#[tokio::test]
async fn a_failed_kind_of_write_fails_only_its_rows() {
    let file = TempFile::new("partial");
    let (store, claims) = claimed(&file, 3).await;
    sqlx::query(
        "CREATE TRIGGER no_dead_letters BEFORE UPDATE OF status ON \"outbox\" \
         WHEN NEW.status = 'dead_lettered' BEGIN SELECT RAISE(ABORT, 'refused'); END",
    )
    .execute(store.pool())
    .await
    .unwrap();
    let until = t0() + chrono::Duration::seconds(31);
    let rows = [
        row(FencedOp::Deliver, &claims[0]),
        row(FencedOp::DeadLetter, &claims[1]),
        row(
            FencedOp::Renew {
                locked_until: until,
                lease: std::time::Duration::from_secs(31),
            },
            &claims[2],
        ),
    ];
    let results = store.inner.core.apply(&rows).await.unwrap();
    assert!(results[0].is_ok(), "{:?}", results[0]);
    match &results[1] {
        Err(Error::Store { operation, .. }) => assert_eq!(*operation, "mark_failed"),
        other => panic!("the refused dead letter: {other:?}"),
    }
    assert!(results[2].is_ok(), "{:?}", results[2]);
    let status = |id: &str| {
        let store = store.clone();
        let id = id.to_owned();
        async move { store.get_message(&id).await.unwrap() }
    };
    assert_eq!(status(&claims[0].id).await.status, MessageStatus::Delivered);
    assert_eq!(status(&claims[1].id).await.status, MessageStatus::Claimed);
    assert_eq!(status(&claims[2].id).await.locked_until, Some(until));
}
