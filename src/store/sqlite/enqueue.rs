//! The SQLite store's enqueue, of one message or a batch: through its pool,
//! or on the caller's connection with a commit hook that wakes drains when
//! (and only if) the caller's transaction commits. Its insert statement
//! and how a row binds to it are here and in `statements.rs`; what both
//! SQL stores do alike (ids, idempotency keys, batches in runs) is in
//! [`crate::store::sql`].

use std::collections::{HashMap, HashSet};
use std::sync::{LazyLock, Mutex, MutexGuard, PoisonError};

use chrono::{DateTime, Utc};
use sqlx::sqlite::SqliteConnection;
use sqlx::{AssertSqlSafe, Connection, Row};

use super::{Core, SqliteOutbox, micros};
use crate::error::{Error, Result};
use crate::message::{Enqueued, NewMessage};
use crate::store::kit::WakeupSender;
use crate::store::sql::{self, InsertRow, Inserts, KeyHolder, StoredTime, db};

/// The stores armed on each connection in its transaction, by the address
/// of the connection's SQLite handle. An entry lives from a connection's
/// first arming to its commit or rollback. A connection closed in the
/// middle of a transaction (SQLite calls no hook then) leaves its entry,
/// and a later connection at the same address then wakes those stores once
/// more at its next commit: a wake-up too many, which costs a drain one
/// claim that finds nothing.
static ARMED: LazyLock<Mutex<HashMap<usize, Vec<WakeupSender>>>> = LazyLock::new(Default::default);

fn armed() -> MutexGuard<'static, HashMap<usize, Vec<WakeupSender>>> {
    ARMED.lock().unwrap_or_else(PoisonError::into_inner)
}

impl SqliteOutbox {
    /// Enqueue on the caller's connection, inside the caller's transaction
    /// when there is one (`&mut *tx`): rolled back, the message is gone;
    /// committed, the next claim sees it and [`OutboxStore::wakeups`](crate::OutboxStore::wakeups) fires.
    pub async fn enqueue_in(
        &self,
        conn: &mut SqliteConnection,
        message: NewMessage,
    ) -> Result<Enqueued> {
        message.validate()?;
        self.arm_wakeup(conn).await?;
        sql::enqueue_one(&*self.inner.core, conn, message).await
    }

    /// Enqueue a batch on the caller's connection, inside the caller's
    /// transaction when there is one (`&mut *tx`), answering each message
    /// in order as
    /// [`OutboxStore::enqueue_batch`](crate::OutboxStore::enqueue_batch)
    /// does: one multi-row `INSERT` for a batch whose messages repeat no
    /// id or idempotency key, and one wake-up at commit. A taken id or key
    /// raises nothing, so the transaction stays usable.
    pub async fn enqueue_batch_in(
        &self,
        conn: &mut SqliteConnection,
        messages: Vec<NewMessage>,
    ) -> Result<Vec<Enqueued>> {
        NewMessage::validate_batch(&messages)?;
        if messages.is_empty() {
            return Ok(Vec::new());
        }
        self.arm_wakeup(conn).await?;
        sql::enqueue_batch(&*self.inner.core, conn, messages).await
    }

    /// Wake on this connection's next commit, not on a rollback.
    ///
    /// A connection has one commit hook, and the caller's transaction may
    /// enqueue into several outboxes (tables) on it: the hook wakes every
    /// store armed on the connection since its last commit or rollback.
    async fn arm_wakeup(&self, conn: &mut SqliteConnection) -> Result<()> {
        let mut handle = conn.lock_handle().await.map_err(db("enqueue"))?;
        let connection = handle.as_raw_handle().as_ptr().addr();
        {
            let wake = &self.inner.core.wake;
            let mut armed = armed();
            let stores = armed.entry(connection).or_default();
            if !stores.iter().any(|store| store.same(wake)) {
                stores.push(wake.clone());
            }
        }
        handle.set_commit_hook(move || {
            let stores = armed().remove(&connection);
            for store in stores.into_iter().flatten() {
                store.wake();
            }
            true
        });
        handle.set_rollback_hook(move || {
            armed().remove(&connection);
        });
        Ok(())
    }

    /// Enqueue through the store's own pool, in a transaction of its own.
    pub(super) async fn enqueue_now(&self, message: NewMessage) -> Result<Enqueued> {
        message.validate()?;
        let core = &self.inner.core;
        let enqueued = {
            let _write = core.write.lock().await;
            let mut conn = core.parts.pool.acquire().await.map_err(db("enqueue"))?;
            sql::enqueue_one(&**core, &mut conn, message).await?
        };
        // Autocommit: the row is committed now.
        if enqueued.is_inserted() {
            core.wake.wake();
        }
        Ok(enqueued)
    }

    /// A batch through the store's own pool, in a transaction of its own,
    /// so it is stored whole or not at all. `BEGIN IMMEDIATE`, as a claim
    /// does: a batch that reads key holders before it writes would
    /// otherwise fail to upgrade its read when another writer got in
    /// between, instead of waiting for it.
    pub(super) async fn enqueue_batch_now(
        &self,
        messages: Vec<NewMessage>,
    ) -> Result<Vec<Enqueued>> {
        NewMessage::validate_batch(&messages)?;
        if messages.is_empty() {
            return Ok(Vec::new());
        }
        let core = &self.inner.core;
        let answers = {
            let _write = core.write.lock().await;
            let mut conn = core.parts.pool.acquire().await.map_err(db("enqueue"))?;
            let mut tx = conn
                .begin_with("BEGIN IMMEDIATE")
                .await
                .map_err(db("enqueue"))?;
            let answers = sql::enqueue_batch(&**core, &mut *tx, messages).await?;
            tx.commit().await.map_err(db("enqueue"))?;
            answers
        };
        if answers.iter().any(Enqueued::is_inserted) {
            core.wake.wake();
        }
        Ok(answers)
    }
}

impl Inserts for Core {
    type Conn = SqliteConnection;

    /// One multi-row insert. When it stored every row, that is the answer;
    /// when it stored fewer, the rows it stored are read back by their
    /// consecutive `seq`s (see `statements.rs`).
    async fn insert_rows(
        &self,
        conn: &mut SqliteConnection,
        messages: &[&NewMessage],
        // SQLite checks each unique index the same way with or without a
        // conflict clause: skipping it would save nothing.
        _fresh: bool,
    ) -> Result<HashSet<String>> {
        let mut query = sqlx::query(AssertSqlSafe(self.sql.insert(messages.len())));
        for message in messages {
            let row = InsertRow::of(message, false);
            query = query
                .bind(row.id)
                .bind(row.kind)
                .bind(row.name)
                .bind(row.payload)
                .bind(row.trace)
                .bind(row.max_attempts)
                .bind(row.available_at.map(micros))
                .bind(micros(row.now))
                .bind(micros(row.now))
                .bind(row.ordering_key)
                .bind(row.idempotency_key)
                .bind(row.idempotency_until.map(micros))
                .bind(row.max_attempts_set)
                .bind(row.queue)
                .bind(row.priority);
        }
        let done = query.execute(&mut *conn).await.map_err(db("enqueue"))?;
        let stored = done.rows_affected();
        if stored == messages.len() as u64 {
            return Ok(messages.iter().map(|m| m.resolve_id()).collect());
        }
        if stored == 0 {
            return Ok(HashSet::new());
        }
        let last = done.last_insert_rowid();
        let ids: String = sqlx::query_scalar(AssertSqlSafe(self.sql.inserted.clone()))
            .bind(last - stored as i64)
            .bind(last)
            .fetch_one(&mut *conn)
            .await
            .map_err(db("enqueue"))?;
        let ids: HashSet<String> =
            serde_json::from_str(&ids).map_err(|e| Error::store("enqueue", e))?;
        if ids.len() as u64 != stored {
            return Err(Error::StoreContract(format!(
                "an insert stored {stored} rows, but {} have the sequence numbers it gave out",
                ids.len()
            )));
        }
        Ok(ids)
    }

    async fn key_holders(
        &self,
        conn: &mut SqliteConnection,
        keys: &[&str],
    ) -> Result<HashMap<String, KeyHolder>> {
        let keys = serde_json::to_string(keys).map_err(|e| Error::store("enqueue", e))?;
        let rows = sqlx::query(AssertSqlSafe(self.parts.shared.idempotency_holders.clone()))
            .bind(keys)
            .fetch_all(&mut *conn)
            .await
            .map_err(db("enqueue"))?;
        rows.iter()
            .map(|row| {
                let until: Option<i64> = row.try_get(2).map_err(db("enqueue"))?;
                Ok((
                    row.try_get(0).map_err(db("enqueue"))?,
                    KeyHolder {
                        id: row.try_get(1).map_err(db("enqueue"))?,
                        until: until.map(StoredTime::load).transpose()?,
                    },
                ))
            })
            .collect()
    }

    async fn release_key(
        &self,
        conn: &mut SqliteConnection,
        key: &str,
        now: DateTime<Utc>,
    ) -> Result<()> {
        sqlx::query(AssertSqlSafe(self.parts.shared.idempotency_release.clone()))
            .bind(key)
            .bind(micros(now))
            .execute(&mut *conn)
            .await
            .map_err(db("enqueue"))?;
        Ok(())
    }
}
