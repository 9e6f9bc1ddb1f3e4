//! The inbox against real databases: SQLite files always, PostgreSQL with
//! the `postgres` feature against `DATABASE_URL`
//! (`scripts/with-postgres cargo test -p outbox --all-features --test
//! inbox`).
//!
//! One suite, [`inbox_suite!`], runs the same contract on both databases;
//! each database's module adds what only it has (concurrent transactions
//! and skipped locks on PostgreSQL, SQLite's reserved names). Times come
//! from a clock the test sets by hand, so a week of retention passes
//! without waiting, and each test uses tables of its own, so they run in
//! parallel against one database.
#![cfg(any(feature = "sqlite", feature = "postgres"))]

use std::sync::{Arc, Mutex};

use chrono::{DateTime, TimeZone, Utc};
use outbox::Clock;

/// The contract every SQL inbox keeps, for the module's `Inbox` type.
/// `$setup` is an async function returning `(inbox, clock)`: an inbox set
/// up on tables of a new, unique name, stamping its records with the
/// clock, which starts at [`t0`].
macro_rules! inbox_suite {
    ($setup:path) => {
        // Paths in full: the module invoking the suite imports what it likes.
        #[allow(unused_imports)]
        use outbox::InboxStore as _;

        /// A table of effects of its own, named after the inbox's table.
        async fn effects(inbox: &Inbox) -> String {
            let name = format!("{}_effects", inbox.outbox_table().table());
            let qualified = match inbox.outbox_table().schema() {
                Some(schema) => format!("\"{schema}\".\"{name}\""),
                None => format!("\"{name}\""),
            };
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "CREATE TABLE {qualified} (message_id text NOT NULL)"
            )))
            .execute(inbox.pool())
            .await
            .unwrap();
            qualified
        }

        fn apply(effects: &str, id: &str) -> String {
            format!("INSERT INTO {effects} (message_id) VALUES ('{id}')")
        }

        async fn applied(inbox: &Inbox, effects: &str, id: &str) -> i64 {
            sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "SELECT count(*) FROM {effects} WHERE message_id = '{id}'"
            )))
            .fetch_one(inbox.pool())
            .await
            .unwrap()
        }

        /// Receive one copy of `id` as a consumer does: record, apply if
        /// new, commit.
        async fn consume(
            inbox: &Inbox,
            effects: &str,
            consumer: &str,
            id: &str,
        ) -> outbox::Recorded {
            let mut tx = inbox.pool().begin().await.unwrap();
            let recorded = inbox.record_in(&mut tx, consumer, id).await.unwrap();
            if recorded.is_new() {
                sqlx::raw_sql(sqlx::AssertSqlSafe(apply(effects, id)))
                    .execute(&mut *tx)
                    .await
                    .unwrap();
            }
            tx.commit().await.unwrap();
            recorded
        }

        #[tokio::test]
        async fn records_each_message_once() {
            let (inbox, _clock) = $setup().await;
            let effects = effects(&inbox).await;
            assert!(!inbox.is_processed("billing", "m-1").await.unwrap());
            for copy in 0..3 {
                let recorded = consume(&inbox, &effects, "billing", "m-1").await;
                let expected = if copy == 0 {
                    outbox::Recorded::New
                } else {
                    outbox::Recorded::AlreadyProcessed
                };
                assert_eq!(recorded, expected, "copy {copy}");
            }
            assert_eq!(applied(&inbox, &effects, "m-1").await, 1);
            assert!(inbox.is_processed("billing", "m-1").await.unwrap());
        }

        #[tokio::test]
        async fn a_duplicate_leaves_the_transaction_usable() {
            let (inbox, _clock) = $setup().await;
            let effects = effects(&inbox).await;
            assert!(consume(&inbox, &effects, "billing", "m-1").await.is_new());

            let mut tx = inbox.pool().begin().await.unwrap();
            sqlx::raw_sql(sqlx::AssertSqlSafe(apply(&effects, "before")))
                .execute(&mut *tx)
                .await
                .unwrap();
            let recorded = inbox.record_in(&mut tx, "billing", "m-1").await.unwrap();
            assert_eq!(recorded, outbox::Recorded::AlreadyProcessed);
            sqlx::raw_sql(sqlx::AssertSqlSafe(apply(&effects, "after")))
                .execute(&mut *tx)
                .await
                .unwrap();
            tx.commit().await.unwrap();
            assert_eq!(applied(&inbox, &effects, "before").await, 1);
            assert_eq!(applied(&inbox, &effects, "after").await, 1);
        }

        #[tokio::test]
        async fn a_rolled_back_record_is_forgotten() {
            let (inbox, _clock) = $setup().await;
            let effects = effects(&inbox).await;
            let mut tx = inbox.pool().begin().await.unwrap();
            assert_eq!(
                inbox.record_in(&mut tx, "billing", "m-1").await.unwrap(),
                outbox::Recorded::New
            );
            sqlx::raw_sql(sqlx::AssertSqlSafe(apply(&effects, "m-1")))
                .execute(&mut *tx)
                .await
                .unwrap();
            tx.rollback().await.unwrap();
            assert!(!inbox.is_processed("billing", "m-1").await.unwrap());
            assert_eq!(applied(&inbox, &effects, "m-1").await, 0);
            // The redelivered copy is the first to commit.
            assert_eq!(
                consume(&inbox, &effects, "billing", "m-1").await,
                outbox::Recorded::New
            );
            assert_eq!(applied(&inbox, &effects, "m-1").await, 1);
        }

        #[tokio::test]
        async fn each_consumer_applies_a_message_once() {
            let (inbox, _clock) = $setup().await;
            let effects = effects(&inbox).await;
            for consumer in ["billing", "shipping"] {
                assert_eq!(
                    consume(&inbox, &effects, consumer, "m-1").await,
                    outbox::Recorded::New
                );
                assert_eq!(
                    consume(&inbox, &effects, consumer, "m-1").await,
                    outbox::Recorded::AlreadyProcessed
                );
            }
            assert_eq!(applied(&inbox, &effects, "m-1").await, 2);
        }

        #[tokio::test]
        async fn refused_input_leaves_the_transaction_usable() {
            let (inbox, _clock) = $setup().await;
            let effects = effects(&inbox).await;
            let mut tx = inbox.pool().begin().await.unwrap();
            for (consumer, id) in [("billing", "m\0"), ("", "m-2"), ("billing", " ")] {
                match inbox.record_in(&mut tx, consumer, id).await {
                    Err(outbox::Error::InvalidInput { .. }) => {}
                    other => panic!("{consumer:?}/{id:?}: {other:?}"),
                }
            }
            assert!(
                inbox
                    .record_in(&mut tx, "billing", "m-2")
                    .await
                    .unwrap()
                    .is_new()
            );
            sqlx::raw_sql(sqlx::AssertSqlSafe(apply(&effects, "m-2")))
                .execute(&mut *tx)
                .await
                .unwrap();
            tx.commit().await.unwrap();
            assert_eq!(applied(&inbox, &effects, "m-2").await, 1);
        }

        #[tokio::test]
        async fn retention_deletes_a_consumers_rows_past_the_window_in_batches() {
            let (inbox, clock) = $setup().await;
            let effects = effects(&inbox).await;
            for n in 0..25 {
                assert!(
                    consume(&inbox, &effects, "billing", &format!("old-{n}"))
                        .await
                        .is_new()
                );
            }
            assert!(
                consume(&inbox, &effects, "shipping", "old-0")
                    .await
                    .is_new()
            );
            clock.set(crate::t0() + crate::days(6));
            for n in 0..5 {
                assert!(
                    consume(&inbox, &effects, "billing", &format!("new-{n}"))
                        .await
                        .is_new()
                );
            }
            let retention = outbox::InboxRetention {
                batch_size: 10,
                ..outbox::InboxRetention::default()
            };
            // Seven days have not passed since any record: nothing goes.
            assert_eq!(inbox.purge_expired("billing", &retention).await.unwrap(), 0);

            clock.set(crate::t0() + crate::days(8));
            assert_eq!(
                inbox.purge_expired("billing", &retention).await.unwrap(),
                25
            );
            assert!(!inbox.is_processed("billing", "old-3").await.unwrap());
            assert!(inbox.is_processed("billing", "new-3").await.unwrap());
            // Another consumer's rows wait for its own run.
            assert!(inbox.is_processed("shipping", "old-0").await.unwrap());
            assert_eq!(
                inbox.purge_expired("shipping", &retention).await.unwrap(),
                1
            );

            // Past the window, a copy is new again: why the window must
            // outlast redeliveries.
            assert_eq!(
                consume(&inbox, &effects, "billing", "old-3").await,
                outbox::Recorded::New
            );

            let invalid = outbox::InboxRetention {
                batch_size: 0,
                ..retention
            };
            assert!(matches!(
                inbox.purge_expired("billing", &invalid).await,
                Err(outbox::Error::Config(_))
            ));
        }
    };
}

#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

/// The time every test starts at; far from the machine's clock, so only the
/// inbox's clock can have stamped the rows.
fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2030, 1, 1, 12, 0, 0).unwrap()
}

fn days(n: i64) -> chrono::Duration {
    chrono::Duration::days(n)
}

/// A clock set by hand.
#[derive(Debug)]
struct HandClock(Mutex<DateTime<Utc>>);

impl HandClock {
    fn new() -> Arc<Self> {
        Arc::new(HandClock(Mutex::new(t0())))
    }

    fn set(&self, at: DateTime<Utc>) {
        *self.0.lock().unwrap() = at;
    }
}

impl Clock for HandClock {
    fn now(&self) -> DateTime<Utc> {
        *self.0.lock().unwrap()
    }
}

/// A short random suffix, so parallel tests use tables of their own.
fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}
