//! The Redis Streams consumer, on a PostgreSQL inbox.

use std::sync::Arc;
use std::time::Duration;

use outbox::{Clock, MemoryOutbox, PostgresInbox};
use outbox_brokers::NameMap;
use outbox_brokers::consume::RedisInboxConsumer;
use outbox_brokers::redis::{RedisConfig, RedisTransport};
use redis::Value;
use redis::aio::MultiplexedConnection;

use crate::harness::{self, coordinator, enqueue, service_url, shutdown, unique, wait_for};
use crate::{Behaviour, Running, WAIT, applied, assert_once, postgres, postgres_handler, stopped};

async fn connection() -> MultiplexedConnection {
    redis::Client::open(service_url("REDIS_URL"))
        .expect("a Redis URL")
        .get_multiplexed_async_connection()
        .await
        .expect("connect to REDIS_URL")
}

async fn xadd(connection: &mut MultiplexedConnection, stream: &str, fields: &[(&str, &str)]) {
    let mut command = redis::cmd("XADD");
    command.arg(stream).arg("*");
    for (name, value) in fields {
        command.arg(*name).arg(*value);
    }
    let _: String = command.query_async(connection).await.expect("XADD");
}

/// `(pending, lag)` of `group`: entries delivered and not acknowledged,
/// and entries not delivered yet.
async fn group_state(
    connection: &mut MultiplexedConnection,
    stream: &str,
    group: &str,
) -> (i64, i64) {
    let groups: Vec<Value> = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(stream)
        .query_async(connection)
        .await
        .expect("XINFO GROUPS");
    for fields in groups {
        let pairs: Vec<(String, Value)> = match fields {
            Value::Array(flat) => flat
                .chunks(2)
                .filter_map(|kv| Some((redis::from_redis_value(&kv[0]).ok()?, kv.get(1)?.clone())))
                .collect(),
            Value::Map(map) => map
                .into_iter()
                .filter_map(|(k, v)| Some((redis::from_redis_value(&k).ok()?, v)))
                .collect(),
            _ => continue,
        };
        let field = |name: &str| {
            pairs
                .iter()
                .find(|(key, _)| key == name)
                .and_then(|(_, value)| redis::from_redis_value::<i64>(value).ok())
        };
        let name: Option<String> = pairs
            .iter()
            .find(|(key, _)| key == "name")
            .and_then(|(_, value)| redis::from_redis_value(value).ok());
        if name.as_deref() == Some(group) {
            // An unknown lag counts as entries left.
            return (field("pending").unwrap_or(-1), field("lag").unwrap_or(-1));
        }
    }
    panic!("no group {group} on {stream}");
}

#[test]
fn stream_entries_and_their_copies_are_applied_once_through_failures() {
    harness::run(|| async {
        const N: usize = 30;
        let prefix = format!("inbox:{}:", unique());
        let stream = format!("{prefix}orders.placed");
        let mut connection = connection().await;
        let (inbox, effects) = postgres().await;

        let store = MemoryOutbox::new();
        let ids = enqueue(&store, "orders.placed", N).await;
        let transport = RedisTransport::connect(
            &service_url("REDIS_URL"),
            RedisConfig::new().streams(NameMap::new(&prefix)),
        )
        .await
        .expect("connect the transport");
        let relay = coordinator(&store, transport);
        wait_for("the relay to publish everything", WAIT, || async {
            harness::count(&store, outbox::MessageStatus::Delivered).await == N
        })
        .await;
        shutdown(relay).await;
        // A second copy of each, as an append after the dedup key expired
        // would make.
        for id in &ids {
            xadd(
                &mut connection,
                &stream,
                &[("payload", "{\"copy\":true}"), ("Outbox-Message-Id", id)],
            )
            .await;
        }

        let consumer = RedisInboxConsumer::connect(
            &service_url("REDIS_URL"),
            &stream,
            "billing",
            inbox.clone(),
            "billing",
            postgres_handler(&effects, Behaviour::FailFirst),
        )
        .await
        .expect("connect the consumer")
        .block(Duration::from_millis(100))
        .retry_delay(Duration::from_millis(50));
        let running = Running::start(|signal| consumer.run(stopped(signal)));
        wait_for("every entry to be consumed", WAIT, || async {
            let (inbox, effects, stream) = (&inbox, &effects, &stream);
            let mut connection = connection.clone();
            applied(inbox.pool(), effects).await.len() == N
                && group_state(&mut connection, stream, "billing").await == (0, 0)
        })
        .await;
        let report = running.stop().await;

        assert_once(&applied(inbox.pool(), &effects).await, &ids);
        assert_eq!(
            (report.processed, report.duplicates, report.failed),
            (N as u64, N as u64, N as u64),
            "{report:?}"
        );
    });
}

#[tokio::test]
async fn a_dead_members_pending_entries_are_claimed_and_applied() {
    let stream = format!("inbox:{}:orders", unique());
    let mut connection = connection().await;
    let (inbox, effects) = postgres().await;
    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&stream)
        .arg("billing")
        .arg("0")
        .arg("MKSTREAM")
        .query_async(&mut connection)
        .await
        .expect("create the group");
    let ids: Vec<String> = (0..5).map(|n| format!("m-{n}")).collect();
    for id in &ids {
        xadd(
            &mut connection,
            &stream,
            &[("payload", "{}"), ("Outbox-Message-Id", id)],
        )
        .await;
    }
    // A member reads them all and dies before acknowledging any.
    let _: Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("billing")
        .arg("dead-member")
        .arg("STREAMS")
        .arg(&stream)
        .arg(">")
        .query_async(&mut connection)
        .await
        .expect("read as the dead member");
    assert_eq!(
        group_state(&mut connection, &stream, "billing").await,
        (5, 0)
    );

    let consumer = RedisInboxConsumer::connect(
        &service_url("REDIS_URL"),
        &stream,
        "billing",
        inbox.clone(),
        "billing",
        postgres_handler(&effects, Behaviour::Apply),
    )
    .await
    .expect("connect the consumer")
    .block(Duration::from_millis(100))
    .claim_idle(Duration::from_millis(200));
    let running = Running::start(|signal| consumer.run(stopped(signal)));
    wait_for("the dead member's entries to be applied", WAIT, || async {
        let mut connection = connection.clone();
        applied(inbox.pool(), &effects).await.len() == 5
            && group_state(&mut connection, &stream, "billing").await == (0, 0)
    })
    .await;
    let report = running.stop().await;
    assert_once(&applied(inbox.pool(), &effects).await, &ids);
    assert_eq!(report.processed, 5, "{report:?}");
}

#[tokio::test]
async fn an_entry_without_an_id_goes_to_the_dead_letter_stream() {
    let stream = format!("inbox:{}:orders", unique());
    let dead = format!("{stream}:refused");
    let mut connection = connection().await;
    let (inbox, effects) = postgres().await;
    xadd(
        &mut connection,
        &stream,
        &[("payload", "{\"anonymous\":true}")],
    )
    .await;
    xadd(
        &mut connection,
        &stream,
        &[("payload", "{}"), ("Outbox-Message-Id", "m-1")],
    )
    .await;
    let consumer = RedisInboxConsumer::connect(
        &service_url("REDIS_URL"),
        &stream,
        "billing",
        inbox.clone(),
        "billing",
        postgres_handler(&effects, Behaviour::Apply),
    )
    .await
    .expect("connect the consumer")
    .block(Duration::from_millis(100))
    .dead_letter(&dead);
    let running = Running::start(|signal| consumer.run(stopped(signal)));
    wait_for("both entries to be done", WAIT, || async {
        let mut connection = connection.clone();
        applied(inbox.pool(), &effects).await.len() == 1
            && group_state(&mut connection, &stream, "billing").await == (0, 0)
    })
    .await;
    let report = running.stop().await;
    assert_eq!((report.processed, report.refused), (1, 1), "{report:?}");
    let refused: Vec<Value> = redis::cmd("XRANGE")
        .arg(&dead)
        .arg("-")
        .arg("+")
        .query_async(&mut connection)
        .await
        .expect("XRANGE");
    assert_eq!(refused.len(), 1, "{refused:?}");
    let text = format!("{refused:?}");
    assert!(
        text.contains("anonymous") && text.contains("refused"),
        "{text}"
    );
}

/// A clock set by hand, for the retention test.
#[derive(Debug)]
struct HandClock(std::sync::Mutex<chrono::DateTime<chrono::Utc>>);

impl Clock for HandClock {
    fn now(&self) -> chrono::DateTime<chrono::Utc> {
        *self.0.lock().unwrap()
    }
}

#[tokio::test]
async fn retention_deletes_the_consumers_old_records_as_it_starts() {
    let stream = format!("inbox:{}:orders", unique());
    let (plain, effects) = postgres().await;
    let t0 = chrono::Utc::now();
    let clock = Arc::new(HandClock(std::sync::Mutex::new(t0)));
    let inbox = PostgresInbox::builder(plain.pool().clone())
        .table(&plain.outbox_table().to_string())
        .unwrap()
        .clock(clock.clone())
        .build();
    for (consumer, id) in [
        ("billing", "old-1"),
        ("billing", "old-2"),
        ("shipping", "old-1"),
    ] {
        let mut tx = inbox.pool().begin().await.unwrap();
        assert!(
            inbox
                .record_in(&mut tx, consumer, id)
                .await
                .unwrap()
                .is_new()
        );
        tx.commit().await.unwrap();
    }
    *clock.0.lock().unwrap() = t0 + chrono::Duration::days(8);

    let consumer = RedisInboxConsumer::connect(
        &service_url("REDIS_URL"),
        &stream,
        "billing",
        inbox.clone(),
        "billing",
        postgres_handler(&effects, Behaviour::Apply),
    )
    .await
    .expect("connect the consumer")
    .block(Duration::from_millis(100));
    let running = Running::start(|signal| consumer.run(stopped(signal)));
    wait_for("the first retention run", WAIT, || async {
        !inbox.is_processed("billing", "old-2").await.unwrap()
    })
    .await;
    let report = running.stop().await;
    assert_eq!(report.retention_deleted, 2, "{report:?}");
    assert!(!inbox.is_processed("billing", "old-1").await.unwrap());
    // Another consumer's records follow its own window.
    assert!(inbox.is_processed("shipping", "old-1").await.unwrap());
}
