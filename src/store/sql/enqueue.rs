//! Enqueue, written once for both SQL stores: one message, or a batch in as
//! few statements as its messages allow, with ids and idempotency keys
//! honoured per message. What differs between the databases (the insert
//! statement and how it binds a row, the lookup of key holders) is behind
//! [`Inserts`], which each store's core implements in its `enqueue.rs`.
//!
//! Every statement here is a plain insert, select or update that raises
//! nothing on a taken id or key (`ON CONFLICT DO NOTHING`), so an enqueue in
//! the caller's transaction never aborts it. The one exception is an insert
//! of generated ids without keys (see [`Inserts::insert_rows`]), which has
//! nothing to conflict with.

use std::collections::{HashMap, HashSet};
use std::future::Future;

use chrono::{DateTime, Utc};

use super::row::trace_json;
use crate::error::Result;
use crate::message::{Enqueued, NewMessage};

/// A stored message that holds an idempotency key.
#[derive(Debug)]
pub(crate) struct KeyHolder {
    /// Its id.
    pub(crate) id: String,
    /// When its window ends; `None` reads as never.
    pub(crate) until: Option<DateTime<Utc>>,
}

impl KeyHolder {
    /// `true` while the key is held for an enqueue made at `now`.
    fn holds_at(&self, now: DateTime<Utc>) -> bool {
        self.until.is_none_or(|until| until > now)
    }
}

/// What a SQL store's core does its own way when it enqueues.
pub(crate) trait Inserts: Send + Sync {
    /// The connection an enqueue runs on (the caller's, or the pool's).
    type Conn: Send;

    /// Insert `messages` (ids resolved, no two sharing an id or an
    /// idempotency key) in one statement, in the order given, each unless
    /// its id or key is taken; returns the ids it stored. Where the store
    /// wakes drains from the inserting statement (PostgreSQL), it does so
    /// once, and only if it stored a row.
    ///
    /// `fresh` says that no message can take what a stored one holds:
    /// every id was generated for this enqueue and none carries an
    /// idempotency key. The store may then insert without its conflict
    /// handling; a generated id found taken, which no one should ever see,
    /// is then an error rather than a message answered as already there
    /// and never stored.
    fn insert_rows(
        &self,
        conn: &mut Self::Conn,
        messages: &[&NewMessage],
        fresh: bool,
    ) -> impl Future<Output = Result<HashSet<String>>> + Send;

    /// The messages that hold `keys` (distinct), by key.
    fn key_holders(
        &self,
        conn: &mut Self::Conn,
        keys: &[&str],
    ) -> impl Future<Output = Result<HashMap<String, KeyHolder>>> + Send;

    /// Free `key` if its window ended by `now`.
    fn release_key(
        &self,
        conn: &mut Self::Conn,
        key: &str,
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<()>> + Send;
}

/// The values of one inserted row, as both stores bind them (times still
/// on the calendar; each store stores them its way).
pub(crate) struct InsertRow<'a> {
    pub(crate) id: &'a str,
    pub(crate) kind: &'static str,
    pub(crate) name: &'a str,
    pub(crate) payload: &'a str,
    pub(crate) trace: Option<String>,
    pub(crate) max_attempts: i64,
    /// `None` only when the store fills in the database's time.
    pub(crate) available_at: Option<DateTime<Utc>>,
    /// `created_at` and `updated_at`.
    pub(crate) now: DateTime<Utc>,
    pub(crate) ordering_key: Option<&'a str>,
    pub(crate) idempotency_key: Option<&'a str>,
    pub(crate) idempotency_until: Option<DateTime<Utc>>,
    pub(crate) max_attempts_set: bool,
    pub(crate) queue: &'a str,
    pub(crate) priority: i16,
}

impl<'a> InsertRow<'a> {
    /// The row of `message`, whose id is resolved. Its `available_at` is
    /// the message's, else its `now`, else (with `server_default`) `None`,
    /// for the statement to fill in the database's time.
    pub(crate) fn of(message: &'a NewMessage, server_default: bool) -> Self {
        let now = message.now;
        InsertRow {
            id: id_of(message),
            kind: message.kind.as_str(),
            name: &message.name,
            payload: message.payload.as_str(),
            trace: trace_json(message.trace.as_ref()),
            max_attempts: i64::from(
                message
                    .max_attempts
                    .unwrap_or(crate::limits::DEFAULT_MAX_ATTEMPTS),
            ),
            available_at: match message.available_at {
                Some(at) => Some(at),
                None if server_default => None,
                None => Some(now),
            },
            now,
            ordering_key: message.ordering_key.as_deref(),
            idempotency_key: key_of(message),
            idempotency_until: message
                .idempotency
                .as_ref()
                .map(|i| crate::store::kit::window_end(now, i.window)),
            max_attempts_set: message.max_attempts.is_some(),
            queue: &message.queue,
            priority: message.priority,
        }
    }
}

/// `message` with its id resolved: the caller's, or a generated one.
fn with_id(message: NewMessage) -> NewMessage {
    let id = message.resolve_id();
    NewMessage {
        id: Some(id),
        ..message
    }
}

fn id_of(message: &NewMessage) -> &str {
    message
        .id
        .as_deref()
        .expect("ids are resolved before insert")
}

fn key_of(message: &NewMessage) -> Option<&str> {
    message.idempotency.as_ref().map(|i| i.key.as_str())
}

/// Enqueue one validated message on `conn`.
pub(crate) async fn enqueue_one<B: Inserts>(
    core: &B,
    conn: &mut B::Conn,
    message: NewMessage,
) -> Result<Enqueued> {
    let fresh = is_fresh(&message);
    insert_idempotent(core, conn, &with_id(message), fresh).await
}

/// `true` for a message that can take nothing a stored one holds: its id
/// is still to be generated, and it has no idempotency key.
fn is_fresh(message: &NewMessage) -> bool {
    message.id.is_none() && message.idempotency.is_none()
}

/// Enqueue a validated batch on `conn`, answering each message as one
/// enqueue after another would (see
/// [`OutboxStore::enqueue_batch`](crate::OutboxStore::enqueue_batch)).
///
/// The messages go in runs: a run is written by one statement, and ends
/// before a message that repeats an earlier one's id or idempotency key,
/// whose answer depends on what the earlier ones did. That message is
/// written alone once they are, and the next run starts after it. So a
/// batch without repeats is one statement (two when it carries
/// idempotency keys: their holders are looked up first), and a message
/// that only repeats the id of an earlier one without a key needs none,
/// since that id is taken by the time it would go in, whatever happened
/// before.
pub(crate) async fn enqueue_batch<B: Inserts>(
    core: &B,
    conn: &mut B::Conn,
    messages: Vec<NewMessage>,
) -> Result<Vec<Enqueued>> {
    let fresh: Vec<bool> = messages.iter().map(is_fresh).collect();
    let messages: Vec<NewMessage> = messages.into_iter().map(with_id).collect();
    let mut answers: Vec<Option<Enqueued>> = vec![None; messages.len()];
    // Each id seen, with whether a message of it without a key came first.
    let mut ids: HashMap<&str, bool> = HashMap::with_capacity(messages.len());
    let mut keys: HashSet<&str> = HashSet::new();
    let mut run = Vec::with_capacity(messages.len());
    for (i, message) in messages.iter().enumerate() {
        let (id, key) = (id_of(message), key_of(message));
        let seen = ids.get(id).copied();
        if key.is_none() && seen == Some(true) {
            answers[i] = Some(Enqueued::AlreadyExists(id.to_owned()));
            continue;
        }
        if seen.is_some() || key.is_some_and(|key| keys.contains(key)) {
            insert_run(core, conn, &messages, &fresh, &mut run, &mut answers).await?;
            answers[i] = Some(insert_idempotent(core, conn, message, false).await?);
        } else {
            run.push(i);
        }
        *ids.entry(id).or_default() |= key.is_none();
        if let Some(key) = key {
            keys.insert(key);
        }
    }
    insert_run(core, conn, &messages, &fresh, &mut run, &mut answers).await?;
    Ok(answers
        .into_iter()
        .map(|answer| answer.expect("every message of the batch is answered"))
        .collect())
}

/// Write the messages of `run` (indexes into `messages`, none repeating
/// another's id or key) with one insert, answer each, and empty `run`.
///
/// Keys held by stored messages are looked up before the insert: a window
/// still open answers at once; an ended one is freed first, so its new
/// message goes in with the others, in its place in the run (freeing it
/// after a refused insert and trying again would put it after the run's
/// later messages, out of enqueue order).
async fn insert_run<B: Inserts>(
    core: &B,
    conn: &mut B::Conn,
    messages: &[NewMessage],
    fresh: &[bool],
    run: &mut Vec<usize>,
    answers: &mut [Option<Enqueued>],
) -> Result<()> {
    let keys: Vec<&str> = run.iter().filter_map(|&i| key_of(&messages[i])).collect();
    if !keys.is_empty() {
        let holders = core.key_holders(conn, &keys).await?;
        let mut kept = Vec::with_capacity(run.len());
        for &i in run.iter() {
            let message = &messages[i];
            let key = key_of(message);
            match key.and_then(|key| holders.get(key)) {
                Some(holder) if holder.holds_at(message.now) => {
                    answers[i] = Some(Enqueued::AlreadyExists(holder.id.clone()));
                }
                Some(_) => {
                    core.release_key(conn, key.unwrap_or_default(), message.now)
                        .await?;
                    kept.push(i);
                }
                None => kept.push(i),
            }
        }
        *run = kept;
    }
    if run.is_empty() {
        return Ok(());
    }
    let rows: Vec<&NewMessage> = run.iter().map(|&i| &messages[i]).collect();
    let all_fresh = run.iter().all(|&i| fresh[i]);
    let stored = core.insert_rows(conn, &rows, all_fresh).await?;
    for &i in run.iter() {
        let message = &messages[i];
        let id = id_of(message);
        answers[i] = Some(if stored.contains(id) {
            Enqueued::Inserted(id.to_owned())
        } else if message.idempotency.is_none() {
            Enqueued::AlreadyExists(id.to_owned())
        } else {
            // The id was taken, or another transaction took the key since
            // the lookup: the one-message path says which.
            insert_idempotent(core, conn, message, false).await?
        });
    }
    run.clear();
    Ok(())
}

/// Insert one message (id resolved), honouring its idempotency key: a key
/// held by a row whose window is still open answers that row's id; a key
/// whose window ended is freed and the insert tried once more.
async fn insert_idempotent<B: Inserts>(
    core: &B,
    conn: &mut B::Conn,
    message: &NewMessage,
    fresh: bool,
) -> Result<Enqueued> {
    let id = id_of(message);
    for _ in 0..2 {
        if core
            .insert_rows(conn, &[message], fresh)
            .await?
            .contains(id)
        {
            return Ok(Enqueued::Inserted(id.to_owned()));
        }
        let Some(key) = key_of(message) else {
            return Ok(Enqueued::AlreadyExists(id.to_owned()));
        };
        let Some(holder) = core.key_holders(conn, &[key]).await?.remove(key) else {
            // The id was taken, not the key.
            return Ok(Enqueued::AlreadyExists(id.to_owned()));
        };
        if holder.holds_at(message.now) {
            return Ok(Enqueued::AlreadyExists(holder.id));
        }
        core.release_key(conn, key, message.now).await?;
    }
    // Freed and taken again by a concurrent enqueue between our two tries:
    // that enqueue's message is the one within the window.
    let holder = match key_of(message) {
        Some(key) => core.key_holders(conn, &[key]).await?.remove(key),
        None => None,
    };
    Ok(Enqueued::AlreadyExists(
        holder.map_or_else(|| id.to_owned(), |holder| holder.id),
    ))
}
