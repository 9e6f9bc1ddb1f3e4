//! The SQLite store's enqueue, of one message or a batch: through its pool,
//! or on the caller's connection, whose hooks wake drains when (and only
//! if) the caller's transaction commits. Its insert statement
//! and how a row binds to it are here and in `statements.rs`; what both
//! SQL stores do alike (ids, idempotency keys, batches in runs) is in
//! [`crate::store::sql`].

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use chrono::{DateTime, Utc};
use sqlx::sqlite::{SqliteArguments, SqliteConnection, SqliteOperation};
use sqlx::{AssertSqlSafe, Connection, Row};

use super::statements::HOOKED;
use super::wakes::Inserted;
use super::{Core, SqliteOutbox, micros};
use crate::error::{Error, Result};
use crate::message::{Enqueued, NewMessage};
use crate::store::sql::{self, InsertRow, Inserts, KeyHolder, StoredTime, db};

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
        let core = OnCallers {
            core: &self.inner.core,
            unhooked: AtomicBool::new(false),
        };
        let enqueued = sql::enqueue_one(&core, conn, message).await?;
        if core.unhooked.load(Ordering::Relaxed) {
            self.hook(conn, true).await?;
        }
        Ok(enqueued)
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
        // A batch's insert does not say whether its connection has the
        // hooks (its rows would come back one by one to say it): ask first,
        // so the hooks see the insert.
        let hooked: bool = sqlx::query_scalar(AssertSqlSafe(self.inner.core.sql.hooked.clone()))
            .fetch_one(&mut *conn)
            .await
            .map_err(db("enqueue"))?;
        if !hooked {
            self.hook(conn, false).await?;
        }
        sql::enqueue_batch(&*self.inner.core, conn, messages).await
    }

    /// Give `conn` the hooks that wake drains when it commits inserts
    /// into an outbox table, and not when it rolls them back; `inserted`
    /// when its transaction has inserted into this store's table already.
    ///
    /// SQLite keeps one update, commit and rollback hook per connection,
    /// so these are set once for the connection's life and serve every
    /// outbox: the update hook notes each table the transaction inserts
    /// into, and the commit hook wakes the stores registered for those
    /// tables in this database (see `wakes.rs`). Setting them takes a
    /// round trip to the connection's thread, which an enqueue then no
    /// longer pays.
    async fn hook(&self, conn: &mut SqliteConnection, inserted: bool) -> Result<()> {
        let core = &self.inner.core;
        let mut state = Inserted::new(core.database.clone());
        if inserted {
            let table = &core.parts.table;
            state.insert(table.schema().unwrap_or("main"), table.table());
        }
        let state = Arc::new(Mutex::new(state));
        let mut handle = conn.lock_handle().await.map_err(db("enqueue"))?;
        let on_insert = state.clone();
        handle.set_update_hook(move |change| {
            if matches!(change.operation, SqliteOperation::Insert) {
                on_insert
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(change.database, change.table);
            }
        });
        let on_commit = state.clone();
        handle.set_commit_hook(move || {
            let senders = on_commit
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .end();
            for sender in senders {
                sender.wake();
            }
            true
        });
        handle.set_rollback_hook(move || {
            state
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .forget();
        });
        // Last: a connection whose hooks failed to be set is hooked again.
        handle
            .create_collation(HOOKED, |a, b| a.cmp(b))
            .map_err(db("enqueue"))
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

/// Binds `message`'s row to one row of an insert's placeholders (see
/// `statements.rs`).
fn bind_row<'q>(
    query: sqlx::query::Query<'q, sqlx::Sqlite, SqliteArguments>,
    message: &'q NewMessage,
) -> sqlx::query::Query<'q, sqlx::Sqlite, SqliteArguments> {
    let row = InsertRow::of(message, false);
    query
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
        .bind(row.priority)
}

/// The core enqueueing on a caller's connection: a single message's insert
/// also says whether the connection has the hooks that wake drains at its
/// commit, and notes it in `unhooked` when it does not.
struct OnCallers<'a> {
    core: &'a Core,
    unhooked: AtomicBool,
}

impl Inserts for OnCallers<'_> {
    type Conn = SqliteConnection;

    async fn insert_rows(
        &self,
        conn: &mut SqliteConnection,
        messages: &[&NewMessage],
        fresh: bool,
    ) -> Result<HashSet<String>> {
        let [message] = messages else {
            return self.core.insert_rows(conn, messages, fresh).await;
        };
        let query = sqlx::query(AssertSqlSafe(self.core.sql.insert_one_in.clone()));
        let hooked: Option<bool> = bind_row(query, message)
            .fetch_optional(&mut *conn)
            .await
            .map_err(db("enqueue"))?
            .map(|row| row.try_get(0))
            .transpose()
            .map_err(db("enqueue"))?;
        match hooked {
            None => Ok(HashSet::new()),
            Some(hooked) => {
                if !hooked {
                    self.unhooked.store(true, Ordering::Relaxed);
                }
                Ok(HashSet::from([message.resolve_id()]))
            }
        }
    }

    async fn key_holders(
        &self,
        conn: &mut SqliteConnection,
        keys: &[&str],
    ) -> Result<HashMap<String, KeyHolder>> {
        self.core.key_holders(conn, keys).await
    }

    async fn release_key(
        &self,
        conn: &mut SqliteConnection,
        key: &str,
        now: DateTime<Utc>,
    ) -> Result<()> {
        self.core.release_key(conn, key, now).await
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
            query = bind_row(query, message);
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
