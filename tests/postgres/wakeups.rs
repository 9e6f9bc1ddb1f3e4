//! Wake-ups over `LISTEN`/`NOTIFY`: sent at commit only, only when a drain
//! armed, and a listener that reconnects and stops with its last receiver.

use std::time::Duration;

use outbox::{ArmOutcome, OutboxAdmin, OutboxStore, PostgresOutbox, SettlementMode};
use sqlx::AssertSqlSafe;
use sqlx::postgres::PgListener;

use crate::sql_support::{event, t0, unique};
use crate::{backends, database_url, eventually, pool, pool_named, store};

/// What a wake-up's payload is: `arming` for the arming an enqueue
/// announces (a number), else the payload itself (a test's marker).
fn kind(payload: &str) -> String {
    if payload.parse::<i64>().is_ok() {
        "arming".to_owned()
    } else {
        payload.to_owned()
    }
}

/// What `listener` heard, each as its [`kind`], up to a marker sent now.
async fn heard_until_marker(
    listener: &mut PgListener,
    pool: &sqlx::PgPool,
    channel: &str,
) -> Vec<String> {
    sqlx::query("SELECT pg_notify($1, 'marker')")
        .bind(channel)
        .execute(pool)
        .await
        .unwrap();
    let mut heard = Vec::new();
    loop {
        let payload = kind(listener.recv().await.unwrap().payload());
        if payload == "marker" {
            return heard;
        }
        heard.push(payload);
    }
}

/// The store's wake-ups, once its listener listens: a wake-up sent before
/// that is not heard, so not recorded as served either (the listener wakes
/// its drains once it listens, for them to arm again).
async fn listening(outbox: &PostgresOutbox) -> outbox::Wakeups {
    let mut wakeups = outbox.wakeups().unwrap();
    assert!(
        tokio::time::timeout(Duration::from_secs(10), wakeups.changed())
            .await
            .unwrap()
    );
    wakeups
}

/// A listener of the test's own on `outbox`'s channel, the store's
/// wake-ups once its listener listens, and their arming.
async fn watched(outbox: &PostgresOutbox) -> (PgListener, outbox::Wakeups, outbox::ArmWakeups) {
    let mut listener = PgListener::connect(&database_url()).await.unwrap();
    listener.listen(outbox.channel()).await.unwrap();
    let wakeups = listening(outbox).await;
    let arm = wakeups.arm().unwrap();
    (listener, wakeups, arm)
}

/// Wait until the store's listener has recorded the last wake-up as
/// served: until then, enqueues go on notifying.
async fn served(pool: &sqlx::PgPool, outbox: &PostgresOutbox) {
    let sequence = |suffix: &str| match outbox.table().to_string().split_once('.') {
        Some((schema, name)) => format!("'\"{schema}\".\"{name}_{suffix}\"'"),
        None => format!("'\"{}_{suffix}\"'", outbox.table()),
    };
    let query = format!(
        "SELECT coalesce(pg_sequence_last_value({}), 0) \
           <= coalesce(pg_sequence_last_value({}), 0)",
        sequence("armed"),
        sequence("served")
    );
    eventually("the wake-up is recorded as served", || async {
        sqlx::query_scalar::<_, bool>(AssertSqlSafe(query.clone()))
            .fetch_one(pool)
            .await
            .unwrap()
    })
    .await;
}

/// NOTIFY goes out when the enqueueing transaction commits, never on
/// rollback. Notifications reach a listener in commit order, so a marker
/// sent after the rollback must be the next thing it sees. (A drain waits
/// for a wake-up: it armed; see the test after this one.)
#[tokio::test]
async fn enqueue_notifies_at_commit_only() {
    let pool = pool().await;
    let outbox = store(&pool, &unique("notify"), SettlementMode::default()).await;
    let mut listener = PgListener::connect(&database_url()).await.unwrap();
    listener.listen(outbox.channel()).await.unwrap();
    let wakeups = outbox.wakeups().unwrap();
    let arm = wakeups
        .arm()
        .expect("PostgreSQL wakes only drains that armed");
    assert_eq!(arm.arm().await.unwrap(), ArmOutcome::Armed);

    let mut tx = pool.begin().await.unwrap();
    outbox
        .enqueue_in(&mut tx, event("a", 1, t0()))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    sqlx::query("SELECT pg_notify($1, 'marker')")
        .bind(outbox.channel())
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(listener.recv().await.unwrap().payload(), "marker");

    let mut tx = pool.begin().await.unwrap();
    outbox
        .enqueue_in(&mut tx, event("b", 1, t0()))
        .await
        .unwrap();
    outbox
        .enqueue_in(&mut tx, event("c", 1, t0()))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    sqlx::query("SELECT pg_notify($1, 'marker')")
        .bind(outbox.channel())
        .execute(&pool)
        .await
        .unwrap();
    // One notification for the transaction (PostgreSQL folds duplicates),
    // carrying the arming it answers.
    assert_eq!(kind(listener.recv().await.unwrap().payload()), "arming");
    assert_eq!(listener.recv().await.unwrap().payload(), "marker");

    // Turned off, enqueue sends nothing.
    assert_eq!(arm.arm().await.unwrap(), ArmOutcome::Armed);
    let quiet = PostgresOutbox::builder(pool.clone())
        .table(&outbox.table().to_string())
        .unwrap()
        .notify(false)
        .build();
    quiet.enqueue(event("d", 1, t0())).await.unwrap();
    sqlx::query("SELECT pg_notify($1, 'marker')")
        .bind(outbox.channel())
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(listener.recv().await.unwrap().payload(), "marker");
}

/// Enqueues notify only when a drain armed, until the store's listener
/// heard one; a drain cannot arm while an enqueue is between its insert and
/// its commit; REPEATABLE READ and SERIALIZABLE read the arming as it is
/// now, and an arming changed after the transaction's snapshot fails
/// nothing. On a table in a schema of its own, whose sequences and lock are
/// named after it.
#[tokio::test]
async fn enqueues_notify_only_when_a_drain_armed() {
    let pool = pool().await;
    let table = format!("{}.events", unique("armed"));
    let outbox = store(&pool, &table, SettlementMode::default()).await;
    // Held: the store listens while its wake-ups have a receiver.
    let (mut listener, _wakeups, arm) = watched(&outbox).await;
    let mut n = 0;
    let mut enqueue = || {
        n += 1;
        event(&format!("e{n}"), n, t0())
    };
    // What the listener heard up to a marker sent now.
    let heard = async |listener: &mut PgListener| {
        heard_until_marker(listener, &pool, outbox.channel()).await
    };

    // Nobody armed (the flag's row does not even exist yet): silence.
    outbox.enqueue(enqueue()).await.unwrap();
    assert!(heard(&mut listener).await.is_empty());

    // Armed: the first enqueue notifies; once the store's listener heard
    // it, the next ones do not.
    assert_eq!(arm.arm().await.unwrap(), ArmOutcome::Armed);
    outbox.enqueue(enqueue()).await.unwrap();
    assert_eq!(heard(&mut listener).await, ["arming"]);
    served(&pool, &outbox).await;
    for _ in 0..5 {
        outbox.enqueue(enqueue()).await.unwrap();
    }
    assert!(heard(&mut listener).await.is_empty());

    // An enqueue in flight keeps a drain from arming until it ends.
    let mut tx = pool.begin().await.unwrap();
    outbox.enqueue_in(&mut tx, enqueue()).await.unwrap();
    assert_eq!(arm.arm().await.unwrap(), ArmOutcome::EnqueueInFlight);
    tx.commit().await.unwrap();
    // The arming that could not be made wrote nothing.
    outbox.enqueue(enqueue()).await.unwrap();
    assert!(heard(&mut listener).await.is_empty());
    assert_eq!(arm.arm().await.unwrap(), ArmOutcome::Armed);
    // A rolled-back enqueue leaves the drain armed.
    let mut tx = pool.begin().await.unwrap();
    outbox.enqueue_in(&mut tx, enqueue()).await.unwrap();
    tx.rollback().await.unwrap();
    outbox.enqueue(enqueue()).await.unwrap();
    assert_eq!(heard(&mut listener).await, ["arming"]);
    served(&pool, &outbox).await;

    // The arming is read as it is now, not as the transaction's snapshot
    // saw it, so the stricter isolation levels behave alike.
    for level in ["REPEATABLE READ", "SERIALIZABLE"] {
        let begin = async || {
            let mut tx = pool.begin().await.unwrap();
            sqlx::query(AssertSqlSafe(format!(
                "SET TRANSACTION ISOLATION LEVEL {level}"
            )))
            .execute(&mut *tx)
            .await
            .unwrap();
            sqlx::query("SELECT 1").execute(&mut *tx).await.unwrap();
            tx
        };
        // Armed after the snapshot was taken: the enqueue sees it.
        let mut tx = begin().await;
        assert_eq!(arm.arm().await.unwrap(), ArmOutcome::Armed);
        outbox.enqueue_in(&mut tx, enqueue()).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(heard(&mut listener).await, ["arming"], "{level}");
        served(&pool, &outbox).await;
        // Served after the snapshot was taken (another enqueue notified):
        // it does not notify again, and nothing fails.
        assert_eq!(arm.arm().await.unwrap(), ArmOutcome::Armed);
        let mut tx = begin().await;
        outbox.enqueue(enqueue()).await.unwrap();
        assert_eq!(heard(&mut listener).await, ["arming"], "{level}");
        served(&pool, &outbox).await;
        outbox.enqueue_in(&mut tx, enqueue()).await.unwrap();
        outbox.enqueue_in(&mut tx, enqueue()).await.unwrap();
        tx.commit().await.unwrap();
        assert!(heard(&mut listener).await.is_empty(), "{level}");
    }
    assert_eq!(outbox.stats(t0()).await.unwrap().pending, n - 1);
}

/// A batch wakes an armed drain as one message does, from one statement
/// however many rows it stores; keeps a drain from arming while its
/// transaction is open; and wakes nobody when it stored nothing.
#[tokio::test]
async fn a_batch_notifies_when_it_stored_a_message() {
    let pool = pool().await;
    let outbox = store(&pool, &unique("batch_wake"), SettlementMode::default()).await;
    // Held: the store listens while its wake-ups have a receiver.
    let (mut listener, _wakeups, arm) = watched(&outbox).await;
    let heard = async |listener: &mut PgListener| {
        heard_until_marker(listener, &pool, outbox.channel()).await
    };
    let batch = |from: u64| -> Vec<outbox::NewMessage> {
        (from..from + 50)
            .map(|n| event(&format!("b{n}"), n, t0()))
            .collect()
    };

    assert_eq!(arm.arm().await.unwrap(), ArmOutcome::Armed);
    outbox.enqueue_batch(batch(0)).await.unwrap();
    assert_eq!(heard(&mut listener).await, ["arming"]);
    served(&pool, &outbox).await;

    // Every id taken: nothing stored, no wake-up, the drain still armed.
    assert_eq!(arm.arm().await.unwrap(), ArmOutcome::Armed);
    let answers = outbox.enqueue_batch(batch(0)).await.unwrap();
    assert!(answers.iter().all(|answer| !answer.is_inserted()));
    assert!(heard(&mut listener).await.is_empty());

    // In a transaction: no arming until it ends, one wake-up at commit.
    let mut tx = pool.begin().await.unwrap();
    outbox.enqueue_batch_in(&mut tx, batch(50)).await.unwrap();
    assert_eq!(arm.arm().await.unwrap(), ArmOutcome::EnqueueInFlight);
    tx.commit().await.unwrap();
    assert_eq!(heard(&mut listener).await, ["arming"]);
    assert_eq!(outbox.stats(t0()).await.unwrap().pending, 100);
}

#[tokio::test]
async fn wakeups_listen_reconnect_and_stop_with_the_last_receiver() {
    let name = unique("wake");
    let pool = pool_named(&name).await;
    let outbox = store(&pool, &name, SettlementMode::default()).await;
    let bound = Duration::from_secs(10);
    let mut wakeups = outbox.wakeups().expect("a runtime is running");
    // Once listening, it wakes once: anything sent before was missed.
    assert!(
        tokio::time::timeout(bound, wakeups.changed())
            .await
            .unwrap()
    );
    // The listener's connection: its last statement is its `LISTEN`, or
    // the record of a wake-up it heard.
    let listening =
        "(query LIKE 'LISTEN%' OR (query LIKE 'SELECT setval(%' AND query LIKE '%served%'))";
    assert_eq!(backends(&pool, &name, listening).await.len(), 1);

    // A committed enqueue from another process wakes it, once it armed.
    let arm = wakeups.arm().unwrap();
    assert_eq!(arm.arm().await.unwrap(), ArmOutcome::Armed);
    let other_pool = pool_named("outbox-tests-other").await;
    let other = PostgresOutbox::builder(other_pool)
        .table(&name)
        .unwrap()
        .build();
    other.enqueue(event("a", 1, t0())).await.unwrap();
    assert!(
        tokio::time::timeout(bound, wakeups.changed())
            .await
            .unwrap()
    );

    // The listener's connection is killed: it reconnects and wakes once.
    for pid in backends(&pool, &name, listening).await {
        sqlx::query("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .execute(&pool)
            .await
            .unwrap();
    }
    assert!(
        tokio::time::timeout(bound, wakeups.changed())
            .await
            .unwrap()
    );
    eventually("the listener listens again", || async {
        backends(&pool, &name, listening).await.len() == 1
    })
    .await;
    assert_eq!(arm.arm().await.unwrap(), ArmOutcome::Armed);
    other.enqueue(event("b", 1, t0())).await.unwrap();
    assert!(
        tokio::time::timeout(bound, wakeups.changed())
            .await
            .unwrap()
    );

    // A second receiver shares the listener; dropping every receiver stops it.
    let second = outbox.wakeups().unwrap();
    assert_eq!(backends(&pool, &name, listening).await.len(), 1);
    drop(wakeups);
    drop(second);
    eventually("the listener has stopped", || async {
        backends(&pool, &name, listening).await.is_empty()
    })
    .await;
    // Subscribing again starts a new one.
    let mut again = outbox.wakeups().unwrap();
    assert!(tokio::time::timeout(bound, again.changed()).await.unwrap());
}

/// Messages whose ids the store generates, without idempotency keys, are
/// inserted without a conflict clause (nothing stored can hold what they
/// take); they are stored, answered and wake a drain exactly as the others,
/// alone or in a batch, in the caller's transaction or not, and with
/// notifications off.
#[tokio::test]
async fn generated_ids_are_stored_and_wake_as_given_ones_do() {
    let pool = pool().await;
    let outbox = store(&pool, &unique("fresh_wake"), SettlementMode::default()).await;
    // Held: the store listens while its wake-ups have a receiver.
    let (mut listener, _wakeups, arm) = watched(&outbox).await;
    let heard = async |listener: &mut PgListener| {
        heard_until_marker(listener, &pool, outbox.channel()).await
    };
    let fresh = |n: u64| {
        outbox::NewMessage::new(
            outbox::MessageKind::Event,
            "test.event",
            outbox::Payload::from(serde_json::json!({ "n": n })),
        )
        .at(t0())
    };
    let inserted = |answers: &[outbox::Enqueued]| -> Vec<String> {
        answers
            .iter()
            .map(|answer| match answer {
                outbox::Enqueued::Inserted(id) => id.clone(),
                other => panic!("not inserted: {other:?}"),
            })
            .collect()
    };

    // Nobody armed: stored, and silence.
    let first = outbox.enqueue(fresh(0)).await.unwrap();
    assert!(first.is_inserted());
    assert!(heard(&mut listener).await.is_empty());

    // Armed: a wake-up for the first, none for the next once it was heard.
    assert_eq!(arm.arm().await.unwrap(), ArmOutcome::Armed);
    outbox.enqueue(fresh(1)).await.unwrap();
    assert_eq!(heard(&mut listener).await, ["arming"]);
    served(&pool, &outbox).await;
    outbox.enqueue(fresh(2)).await.unwrap();
    assert!(heard(&mut listener).await.is_empty());

    // In the caller's transaction: no arming while it is open, the
    // transaction still usable after, one wake-up at commit.
    assert_eq!(arm.arm().await.unwrap(), ArmOutcome::Armed);
    let mut tx = pool.begin().await.unwrap();
    let one = outbox.enqueue_in(&mut tx, fresh(3)).await.unwrap();
    let batch: Vec<_> = (4..54).map(fresh).collect();
    let answers = outbox.enqueue_batch_in(&mut tx, batch).await.unwrap();
    assert_eq!(arm.arm().await.unwrap(), ArmOutcome::EnqueueInFlight);
    let still_usable: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    assert_eq!(still_usable, 1);
    tx.commit().await.unwrap();
    assert_eq!(heard(&mut listener).await, ["arming"]);
    served(&pool, &outbox).await;
    let mut ids = inserted(&answers);
    ids.push(inserted(&[one])[0].clone());
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 51, "every id its own");

    // A rolled-back one stores nothing and leaves the drain armed.
    assert_eq!(arm.arm().await.unwrap(), ArmOutcome::Armed);
    let mut tx = pool.begin().await.unwrap();
    outbox
        .enqueue_batch_in(&mut tx, (54..60).map(fresh).collect())
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert!(heard(&mut listener).await.is_empty());
    outbox.enqueue(fresh(60)).await.unwrap();
    assert_eq!(heard(&mut listener).await, ["arming"]);
    assert_eq!(outbox.stats(t0()).await.unwrap().pending, 55);

    // With notifications off, the same statements without the wake-up.
    let quiet = PostgresOutbox::builder(pool.clone())
        .table(&unique("fresh_quiet"))
        .unwrap()
        .caller_clock(true)
        .notify(false)
        .build();
    quiet.setup().await.unwrap();
    assert!(quiet.enqueue(fresh(0)).await.unwrap().is_inserted());
    let answers = quiet
        .enqueue_batch((1..11).map(fresh).collect())
        .await
        .unwrap();
    assert_eq!(inserted(&answers).len(), 10);
    let mut tx = pool.begin().await.unwrap();
    assert!(
        quiet
            .enqueue_in(&mut tx, fresh(11))
            .await
            .unwrap()
            .is_inserted()
    );
    tx.commit().await.unwrap();
    assert_eq!(quiet.stats(t0()).await.unwrap().pending, 12);
}

/// The arming a waiting drain relies on lapses after a minute (so enqueues
/// stop notifying once nobody listens), and its store's listener renews it
/// before then while no wake-up came; a renewal an enqueue in flight keeps
/// from arming wakes the drain instead, for it to arm again itself. Runs in
/// real time: about half a minute.
#[tokio::test]
async fn a_waiting_arming_is_renewed_before_it_lapses() {
    let pool = pool().await;
    let outbox = store(&pool, &unique("renew"), SettlementMode::default()).await;
    let armed = format!(
        "SELECT coalesce(pg_sequence_last_value('\"{}_armed\"'), 0)",
        outbox.table()
    );
    let arming = async || -> i64 {
        sqlx::query_scalar(AssertSqlSafe(armed.clone()))
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    let (mut listener, mut wakeups, arm) = watched(&outbox).await;
    let heard = async |listener: &mut PgListener| {
        heard_until_marker(listener, &pool, outbox.channel()).await
    };

    // A lapsed arming wakes nobody.
    assert_eq!(arm.arm().await.unwrap(), ArmOutcome::Armed);
    let first = arming().await;
    let now_ms = chrono::Utc::now().timestamp_millis();
    assert!(
        (now_ms + 50_000..now_ms + 70_000).contains(&first),
        "an arming lapses a minute after it is made: {first} at {now_ms}"
    );
    sqlx::query(AssertSqlSafe(format!(
        "SELECT setval('\"{}_armed\"', $1)",
        outbox.table()
    )))
    .bind(now_ms - 1)
    .execute(&pool)
    .await
    .unwrap();
    outbox.enqueue(event("lapsed", 1, t0())).await.unwrap();
    assert!(heard(&mut listener).await.is_empty());
    // The store's listener heard the marker too, and woke its drains (they
    // arm again before their next claim): wait for that before arming.
    tokio::time::timeout(Duration::from_secs(10), wakeups.changed())
        .await
        .unwrap();

    // Armed and unwoken: renewed within half a minute, to a later lapse.
    assert_eq!(arm.arm().await.unwrap(), ArmOutcome::Armed);
    let armed_at = arming().await;
    eventually_within(
        Duration::from_secs(45),
        "the arming is renewed",
        async || arming().await > armed_at,
    )
    .await;
    assert!(arming().await >= armed_at + 15_000);

    // A renewal that finds an enqueue in flight wakes the drain instead.
    let mut tx = pool.begin().await.unwrap();
    outbox
        .enqueue_in(&mut tx, event("in flight", 1, t0()))
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(45), wakeups.changed())
        .await
        .expect("woken when the renewal could not arm");
    tx.commit().await.unwrap();
    // That enqueue saw the arming still live, and notified at its commit.
    assert_eq!(heard(&mut listener).await, ["arming"]);
}

/// Wait up to `bound` for `check`, polling twice a second.
async fn eventually_within(bound: Duration, what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + bound;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {bound:?} waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
