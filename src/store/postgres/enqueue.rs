//! The PostgreSQL store's enqueue: through its pool or on the caller's
//! connection, refusing first what PostgreSQL would refuse, so the caller's
//! transaction is never aborted by a message.

use chrono::{DateTime, Utc};
use sqlx::postgres::PgConnection;

use super::{Core, PostgresOutbox, Shared};
use crate::error::{Error, Result};
use crate::message::{Enqueued, NewMessage};
use crate::store::sql::db;

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
        self.inner.core.insert(conn, message).await
    }

    /// Enqueue through the store's pool, in a transaction of its own.
    pub(super) async fn enqueue_now(&self, message: NewMessage) -> Result<Enqueued> {
        message.validate()?;
        storable(&message)?;
        let mut conn = self
            .inner
            .core
            .parts
            .pool
            .acquire()
            .await
            .map_err(db("enqueue"))?;
        self.inner.core.insert(&mut conn, message).await
    }
}

impl Core {
    /// Insert unless the id is taken. A taken id is not a unique violation
    /// (`ON CONFLICT DO NOTHING`), which would abort the caller's
    /// transaction; the statement returns a row only when it inserted.
    async fn insert(&self, conn: &mut PgConnection, message: NewMessage) -> Result<Enqueued> {
        let id = message.resolve_id();
        let message = NewMessage {
            id: Some(id.clone()),
            ..message
        };
        let sql = self.sql.insert.clone();
        Shared::insert_idempotent(&self.parts, conn, &message, id, |conn| {
            let (_, mut query) = Shared::insert(&sql, &message, self.server_clock);
            if self.notify {
                query = query.bind(self.channel.clone());
            }
            Box::pin(async move {
                Ok(query
                    .fetch_optional(conn)
                    .await
                    .map_err(enqueue_error)?
                    .is_some())
            })
        })
        .await
    }
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
