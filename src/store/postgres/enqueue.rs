//! The PostgreSQL store's enqueue, of one message or a batch: through its
//! pool or on the caller's connection, refusing first what PostgreSQL would
//! refuse, so the caller's transaction is never aborted by a message. Its
//! insert (one statement over arrays, whatever the number of rows) binds
//! here; what both SQL stores do alike (ids, idempotency keys, batches in
//! runs) is in [`crate::store::sql`].

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Connection, Row};

use super::{Core, PostgresOutbox};
use crate::error::{Error, Result};
use crate::message::{Enqueued, NewMessage};
use crate::store::sql::{self, InsertRow, Inserts, KeyHolder, db};

impl PostgresOutbox {
    /// Enqueue on the caller's connection, inside the caller's transaction
    /// when there is one (`&mut *tx`): rolled back, the message is gone;
    /// committed, the next claim sees it and listeners are notified.
    ///
    /// A taken id answers [`Enqueued::AlreadyExists`] and leaves the
    /// transaction usable (`ON CONFLICT DO NOTHING`: no error is raised in
    /// it), so the rows written before and after it still commit. Input
    /// PostgreSQL would refuse (a NUL character in the id or name, `\u0000`
    /// or a lone surrogate escape in the payload, a time before 4713 BC) is
    /// refused here with [`Error::InvalidInput`] before anything is sent,
    /// so it does not abort the transaction either.
    pub async fn enqueue_in(
        &self,
        conn: &mut PgConnection,
        message: NewMessage,
    ) -> Result<Enqueued> {
        message.validate()?;
        storable(&message)?;
        sql::enqueue_one(&*self.inner.core, conn, message).await
    }

    /// Enqueue a batch on the caller's connection, inside the caller's
    /// transaction when there is one (`&mut *tx`), answering each message
    /// in order as
    /// [`OutboxStore::enqueue_batch`](crate::OutboxStore::enqueue_batch)
    /// does: one `INSERT ... SELECT FROM unnest(...)` for a batch whose
    /// messages repeat no id or idempotency key, which wakes drains once.
    /// As with [`PostgresOutbox::enqueue_in`], a taken id or key raises
    /// nothing and input PostgreSQL would refuse is refused before anything
    /// is sent (the error names the message's position), so the transaction
    /// stays usable.
    pub async fn enqueue_batch_in(
        &self,
        conn: &mut PgConnection,
        messages: Vec<NewMessage>,
    ) -> Result<Vec<Enqueued>> {
        storable_batch(&messages)?;
        if messages.is_empty() {
            return Ok(Vec::new());
        }
        sql::enqueue_batch(&*self.inner.core, conn, messages).await
    }

    /// Enqueue through the store's pool, in a transaction of its own.
    pub(super) async fn enqueue_now(&self, message: NewMessage) -> Result<Enqueued> {
        message.validate()?;
        storable(&message)?;
        let mut conn = self.acquire().await?;
        sql::enqueue_one(&*self.inner.core, &mut conn, message).await
    }

    /// A batch through the store's pool, in a transaction of its own, so it
    /// is stored whole or not at all.
    pub(super) async fn enqueue_batch_now(
        &self,
        messages: Vec<NewMessage>,
    ) -> Result<Vec<Enqueued>> {
        storable_batch(&messages)?;
        if messages.is_empty() {
            return Ok(Vec::new());
        }
        let mut conn = self.acquire().await?;
        let mut tx = conn.begin().await.map_err(db("enqueue"))?;
        let answers = sql::enqueue_batch(&*self.inner.core, &mut *tx, messages).await?;
        tx.commit().await.map_err(db("enqueue"))?;
        Ok(answers)
    }

    async fn acquire(&self) -> Result<sqlx::pool::PoolConnection<sqlx::Postgres>> {
        self.inner
            .core
            .parts
            .pool
            .acquire()
            .await
            .map_err(db("enqueue"))
    }
}

impl Inserts for Core {
    type Conn = PgConnection;

    async fn insert_rows(
        &self,
        conn: &mut PgConnection,
        messages: &[&NewMessage],
        fresh: bool,
    ) -> Result<HashSet<String>> {
        if let [message] = messages {
            let row = InsertRow::of(message, self.server_clock);
            let statement = if fresh {
                &self.sql.insert_one_fresh
            } else {
                &self.sql.insert_one
            };
            let mut query = sqlx::query(AssertSqlSafe(statement.clone()))
                .bind(row.id)
                .bind(row.kind)
                .bind(row.name)
                .bind(row.payload)
                .bind(row.trace)
                .bind(row.max_attempts)
                .bind(row.available_at)
                .bind(row.now)
                .bind(row.ordering_key)
                .bind(row.idempotency_key)
                .bind(row.idempotency_until)
                .bind(row.max_attempts_set)
                .bind(row.queue)
                .bind(row.priority);
            if self.notify {
                query = query.bind(self.channel.as_str());
            }
            if fresh {
                // Inserted, or failed: it returns no row to tell which.
                query.execute(conn).await.map_err(enqueue_error)?;
                return Ok(HashSet::from([row.id.to_owned()]));
            }
            let stored = query.fetch_optional(conn).await.map_err(enqueue_error)?;
            return Ok(stored.map(|_| row.id.to_owned()).into_iter().collect());
        }
        let n = messages.len();
        let mut ids = Vec::with_capacity(n);
        let mut kinds = Vec::with_capacity(n);
        let mut names = Vec::with_capacity(n);
        let mut payloads = Vec::with_capacity(n);
        let mut traces = Vec::with_capacity(n);
        let mut max_attempts = Vec::with_capacity(n);
        let mut available_at = Vec::with_capacity(n);
        let mut created_at = Vec::with_capacity(n);
        let mut ordering_keys = Vec::with_capacity(n);
        let mut idempotency_keys = Vec::with_capacity(n);
        let mut idempotency_until = Vec::with_capacity(n);
        let mut max_attempts_set = Vec::with_capacity(n);
        let mut queues = Vec::with_capacity(n);
        let mut priorities = Vec::with_capacity(n);
        for message in messages {
            let row = InsertRow::of(message, self.server_clock);
            ids.push(row.id);
            kinds.push(row.kind);
            names.push(row.name);
            payloads.push(row.payload);
            traces.push(row.trace);
            max_attempts.push(row.max_attempts);
            available_at.push(row.available_at);
            created_at.push(row.now);
            ordering_keys.push(row.ordering_key);
            idempotency_keys.push(row.idempotency_key);
            idempotency_until.push(row.idempotency_until);
            max_attempts_set.push(row.max_attempts_set);
            queues.push(row.queue);
            priorities.push(row.priority);
        }
        let statement = if fresh {
            &self.sql.insert_fresh
        } else {
            &self.sql.insert
        };
        let mut query = sqlx::query(AssertSqlSafe(statement.clone()))
            .bind(ids)
            .bind(kinds)
            .bind(names)
            .bind(payloads)
            .bind(traces)
            .bind(max_attempts)
            .bind(available_at)
            .bind(created_at)
            .bind(ordering_keys)
            .bind(idempotency_keys)
            .bind(idempotency_until)
            .bind(max_attempts_set)
            .bind(queues)
            .bind(priorities);
        if self.notify {
            query = query.bind(self.channel.as_str());
        }
        let row = query.fetch_one(conn).await.map_err(enqueue_error)?;
        let stored: Vec<String> = row.try_get(0).map_err(db("enqueue"))?;
        Ok(stored.into_iter().collect())
    }

    async fn key_holders(
        &self,
        conn: &mut PgConnection,
        keys: &[&str],
    ) -> Result<HashMap<String, KeyHolder>> {
        let rows = sqlx::query(AssertSqlSafe(self.parts.shared.idempotency_holders.clone()))
            .bind(keys)
            .fetch_all(&mut *conn)
            .await
            .map_err(db("enqueue"))?;
        rows.iter()
            .map(|row| {
                Ok((
                    row.try_get(0).map_err(db("enqueue"))?,
                    KeyHolder {
                        id: row.try_get(1).map_err(db("enqueue"))?,
                        until: row.try_get(2).map_err(db("enqueue"))?,
                    },
                ))
            })
            .collect()
    }

    async fn release_key(
        &self,
        conn: &mut PgConnection,
        key: &str,
        now: DateTime<Utc>,
    ) -> Result<()> {
        sqlx::query(AssertSqlSafe(self.parts.shared.idempotency_release.clone()))
            .bind(key)
            .bind(now)
            .execute(&mut *conn)
            .await
            .map_err(db("enqueue"))?;
        Ok(())
    }
}

/// [`storable`] for each message of a batch, after the checks every store
/// makes; a refusal names the message's position.
fn storable_batch(messages: &[NewMessage]) -> Result<()> {
    NewMessage::validate_batch(messages)?;
    for (index, message) in messages.iter().enumerate() {
        storable(message).map_err(|e| NewMessage::refused_in_batch(e, index))?;
    }
    Ok(())
}

/// The earliest time a `timestamptz` holds: 4714-11-24 BC (year -4713).
fn earliest_timestamptz() -> DateTime<Utc> {
    use chrono::TimeZone;
    Utc.with_ymd_and_hms(-4713, 11, 24, 0, 0, 0)
        .single()
        .expect("a valid date")
}

/// Refuse what PostgreSQL would refuse, before it is sent: a refused
/// statement aborts the caller's transaction, and its commit then rolls
/// back everything else the transaction wrote.
fn storable(message: &NewMessage) -> Result<()> {
    let nul = "contains a NUL character (\\0), which PostgreSQL cannot store in text; remove it";
    if message.id.as_deref().is_some_and(|id| id.contains('\0')) {
        return Err(Error::invalid("id", nul));
    }
    if message.name.contains('\0') {
        return Err(Error::invalid("name", nul));
    }
    if let Some(reason) = jsonb_refuses(message.payload.as_str()) {
        return Err(Error::invalid("payload", reason));
    }
    let earliest = earliest_timestamptz();
    if message.now < earliest {
        return Err(Error::invalid(
            "now",
            "is before 4713 BC, which PostgreSQL cannot store; use a real enqueue time",
        ));
    }
    if message.available_at.is_some_and(|at| at < earliest) {
        return Err(Error::invalid(
            "available_at",
            "is before 4713 BC, which PostgreSQL cannot store; leave it unset to make the \
             message available now",
        ));
    }
    Ok(())
}

/// Why `jsonb` would refuse this JSON text, if it would: `\u0000` in a
/// string (jsonb strings cannot hold NUL), or a `\u` escape of half a
/// surrogate pair.
fn jsonb_refuses(json: &str) -> Option<&'static str> {
    let bytes = json.as_bytes();
    let hex = |at: usize| -> Option<u32> {
        let digits = std::str::from_utf8(bytes.get(at..at + 4)?).ok()?;
        u32::from_str_radix(digits, 16).ok()
    };
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            0 => return Some(NUL_IN_JSON),
            b'\\' if bytes.get(i + 1) == Some(&b'u') => {
                let unit = hex(i + 2)?;
                match unit {
                    0 => return Some(NUL_IN_JSON),
                    0xD800..=0xDBFF => {
                        let low = (bytes.get(i + 6..i + 8) == Some(b"\\u"))
                            .then(|| hex(i + 8))
                            .flatten();
                        if !matches!(low, Some(0xDC00..=0xDFFF)) {
                            return Some(LONE_SURROGATE);
                        }
                        i += 12;
                    }
                    0xDC00..=0xDFFF => return Some(LONE_SURROGATE),
                    _ => i += 6,
                }
            }
            // Any other escape is two bytes; skipping both keeps an escaped
            // backslash from being read as the start of an escape.
            b'\\' => i += 2,
            _ => i += 1,
        }
    }
    None
}

const NUL_IN_JSON: &str = "contains \"\\u0000\" (a NUL character), which PostgreSQL's jsonb cannot \
     store; remove it or encode the bytes (for example as base64)";
const LONE_SURROGATE: &str = "contains a \"\\u\" escape of half a UTF-16 surrogate pair, which \
     PostgreSQL's jsonb refuses; send the whole pair or the character itself";

fn enqueue_error(e: sqlx::Error) -> Error {
    let Some(database) = e.as_database_error() else {
        return Error::store("enqueue", e);
    };
    match database.code().as_deref() {
        // Text PostgreSQL cannot store: a NUL character, or "\u0000" in jsonb.
        Some("22021" | "22P05" | "22P02") => Error::invalid(
            "message",
            format!("PostgreSQL cannot store it: {}", database.message()),
        ),
        _ => Error::store("enqueue", e),
    }
}
