//! A store over a pool of one connection, so a test sees what that
//! connection keeps between calls: statement plans, made once and made again
//! as the table fills, and the claim's commit setting.

use outbox::{ClaimBatch, MarkDelivered, OutboxStore, PostgresOutbox};
use sqlx::AssertSqlSafe;
use sqlx::postgres::{PgPool, PgPoolOptions};

use crate::sql_support::{LEASE, event, t0, unique};
use crate::{database_url, server_clock_store};

/// A store on the server's clock, on a table of its own, over a pool of one
/// connection: every statement is prepared and planned on the one a test
/// inspects.
async fn one_connection_store(prefix: &str) -> (PgPool, String, PostgresOutbox) {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&database_url())
        .await
        .unwrap();
    let table = unique(prefix);
    let outbox = server_clock_store(&pool, &table).await;
    (pool, table, outbox)
}

/// Claim up to `limit` messages now, durable or not (see
/// `ClaimBatch::durable`).
async fn claim_now(
    outbox: &PostgresOutbox,
    limit: usize,
    durable: bool,
) -> outbox::Result<outbox::ClaimedBatch> {
    outbox
        .claim_batch(ClaimBatch {
            on_dead_letter: Default::default(),
            limit,
            now: chrono::Utc::now(),
            lease: LEASE,
            max_attempts: outbox::DEFAULT_MAX_ATTEMPTS,
            queues: Vec::new(),
            durable,
        })
        .await
}

/// The ids of `claimed`, sorted.
fn sorted_ids(claimed: &[outbox::ClaimedMessage]) -> Vec<&str> {
    let mut ids: Vec<_> = claimed.iter().map(|m| m.id.as_str()).collect();
    ids.sort_unstable();
    ids
}

/// A connection keeps a statement's plan until the table's statistics
/// change, and a plan made while the table was empty reads the table whole.
/// Claims and settlements run functions whose plans price sequential scans
/// out, so plans made on the empty table read the indexes as it fills.
#[tokio::test]
async fn a_plan_made_on_an_empty_table_does_not_scan_it_once_it_fills() {
    let (pool, table, outbox) = one_connection_store("replan").await;
    let claim = |limit| claim_now(&outbox, limit, false);
    let deliver = |id: &str, claim_token: &str, delete| {
        outbox.mark_delivered(MarkDelivered {
            delete,
            id: id.to_owned(),
            claim_token: claim_token.to_owned(),
            now: chrono::Utc::now(),
        })
    };
    let seq_scans = async || -> i64 {
        // Flushes this backend's pending counts: the one connection's.
        sqlx::query("SELECT pg_stat_force_next_flush()")
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query_scalar("SELECT seq_scan FROM pg_stat_user_tables WHERE relname = $1")
            .bind(&table)
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    // Every statement planned on the empty table.
    assert!(claim(10).await.unwrap().claimed.is_empty());
    assert!(deliver("gone", "gone", false).await.is_err());
    assert!(deliver("gone", "gone", true).await.is_err());
    // Rows written behind the planner's back: no ANALYZE, so no plan of the
    // connection is thrown away.
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {table} (id, kind, name, payload, max_attempts, available_at, \
           created_at, updated_at) \
         SELECT 'm' || i, 'event', 'backlog', '{{}}', 5, now() - interval '1 hour', now(), now() \
         FROM generate_series(1, 5000) AS i"
    )))
    .execute(&pool)
    .await
    .unwrap();
    let before = seq_scans().await;
    let claimed = claim(1100).await.unwrap().claimed;
    assert_eq!(claimed.len(), 1100);
    for (message, delete) in claimed.iter().zip([false, true]) {
        deliver(&message.id, &message.claim_token, delete)
            .await
            .unwrap();
    }
    assert_eq!(claim(10).await.unwrap().claimed.len(), 10);
    assert_eq!(
        seq_scans().await,
        before,
        "a plan made on the empty table scanned it"
    );
}

/// A claim the drain does not need durable commits without waiting for its
/// WAL to be flushed, whichever pass claims; one it needs durable waits, as
/// enqueues and settlements do, and the setting never outlives the claim's
/// transaction on its pooled connection.
#[tokio::test]
async fn only_claims_for_idle_handlers_commit_without_waiting_for_the_disk() {
    let (pool, table, outbox) = one_connection_store("no_flush").await;
    // The test cluster turns synchronous commits off for speed; its one
    // connection turns them back on, as a production server has them.
    sqlx::query("SET synchronous_commit = on")
        .execute(&pool)
        .await
        .unwrap();
    // A deferred trigger runs at commit, under the setting that commit obeys.
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE TABLE {table}_commits (op text, status text, mode text); \
         CREATE FUNCTION {table}_commit_mode() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN \
             INSERT INTO {table}_commits VALUES (TG_OP, \
                 CASE TG_OP WHEN 'DELETE' THEN OLD.status ELSE NEW.status END, \
                 current_setting('synchronous_commit')); \
             RETURN NULL; \
         END $$; \
         CREATE CONSTRAINT TRIGGER commit_mode AFTER INSERT OR UPDATE OR DELETE ON {table} \
             DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {table}_commit_mode()"
    )))
    .execute(&pool)
    .await
    .unwrap();
    let commits = async || -> Vec<(String, String, String)> {
        let rows = sqlx::query_as(AssertSqlSafe(format!(
            "DELETE FROM {table}_commits RETURNING op, status, mode"
        )))
        .fetch_all(&pool)
        .await
        .unwrap();
        let mut rows: Vec<(String, String, String)> = rows;
        rows.sort_unstable();
        rows.dedup();
        rows
    };
    let row = |op: &str, status: &str, mode: &str| (op.into(), status.into(), mode.into());
    // Settles every other message by deleting it, the rest by an update;
    // both kinds wait for their flush.
    let settle = async |claimed: Vec<outbox::ClaimedMessage>| {
        for (n, message) in claimed.into_iter().enumerate() {
            outbox
                .mark_delivered(MarkDelivered {
                    delete: n % 2 == 1,
                    id: message.id,
                    claim_token: message.claim_token,
                    now: chrono::Utc::now(),
                })
                .await
                .unwrap();
        }
        // A settled head flags the next message of its key, in the
        // settlement's own transaction.
        let mut settled = commits().await;
        settled.retain(|commit| *commit != row("UPDATE", "pending", "on"));
        assert_eq!(
            settled,
            [
                row("DELETE", "claimed", "on"),
                row("UPDATE", "delivered", "on")
            ]
        );
    };

    // The first pass claims the keyless rows; the key's head goes to the
    // second, `claim_heads`.
    for n in 0..2 {
        outbox
            .enqueue(event(&format!("x{n}"), n, t0()))
            .await
            .unwrap();
    }
    outbox
        .enqueue(event("k0", 2, t0()).with_ordering_key("key"))
        .await
        .unwrap();
    assert_eq!(commits().await, [row("INSERT", "pending", "on")]);
    let claimed = claim_now(&outbox, 10, false).await.unwrap().claimed;
    assert_eq!(claimed.len(), 3);
    assert_eq!(commits().await, [row("UPDATE", "claimed", "off")]);
    settle(claimed).await;

    // Keys with backlogs, and a keyless row: the second pass claims the
    // heads under their keys' locks, without waiting for the disk either.
    for n in 0..60 {
        outbox
            .enqueue(event(&format!("k{n:02}"), n, t0()).with_ordering_key(format!("key{}", n % 3)))
            .await
            .unwrap();
    }
    outbox.enqueue(event("x9", 60, t0())).await.unwrap();
    commits().await;
    let claimed = claim_now(&outbox, 10, false).await.unwrap().claimed;
    assert_eq!(sorted_ids(&claimed), ["k00", "k01", "k02", "x9"]);
    assert_eq!(commits().await, [row("UPDATE", "claimed", "off")]);
    settle(claimed).await;

    // A claim whose messages may wait for a handler waits for its flush,
    // in both passes.
    outbox.enqueue(event("x10", 61, t0())).await.unwrap();
    commits().await;
    let claimed = claim_now(&outbox, 10, true).await.unwrap().claimed;
    assert_eq!(sorted_ids(&claimed), ["k03", "k04", "k05", "x10"]);
    assert_eq!(commits().await, [row("UPDATE", "claimed", "on")]);
    settle(claimed).await;
    let session: String = sqlx::query_scalar("SHOW synchronous_commit")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(session, "on");
}
