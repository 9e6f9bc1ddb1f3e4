//! What the SQL stores share, written once: the validated table name,
//! migrations rendered for it, settlement modes, turning rows back into
//! messages, and every operation that differs between SQLite and PostgreSQL
//! only in its SQL text and in how a time is stored.
//!
//! # The shared half
//!
//! A SQL store's core implements the private `SqlBackend` trait: its sqlx
//! database, how it stores a time, its pool, its statements, the lock its own
//! writes take (if any) and what follows a requeue. `SqlOutbox` builds on
//! that: the fenced writes (renewals and settlements, through the
//! `FencedWriter`), `get_message`, `stats`, `pending_count`, requeues with
//! their refusal, `purge`, and reading rows back. The `sql_store!` macro
//! then writes the public trait impls, the builder's `settlement` setter and
//! the typed `enqueue_*_in` methods for each store, forwarding to the shared
//! half or to the few operations each store does its own way (enqueue, claim,
//! listing, wake-ups).
//!
//! # Custom table names and migrations
//!
//! `sqlx::migrate!` embeds static SQL, so the migration files are written for
//! the default table, `outbox`, and are valid as they stand: the plain
//! `MIGRATOR` of each store runs them unchanged. Every identifier that belongs
//! to the outbox is written double-quoted, `"outbox"` for the table and
//! `"outbox_<suffix>"` for its indexes, and nothing else in the files is. For
//! another table, `setup` rewrites exactly those quoted identifiers with the
//! validated name (see [`TableName`]) and runs the result through sqlx's
//! migration machinery, tracked per table in `"<table>_migrations"`, so
//! several outboxes can live in one database and each is migrated once.
//! No other text is ever spliced into SQL.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::future::Future;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use sqlx::{
    AssertSqlSafe, Column, ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Row,
};

use super::fenced::{FencedBackend, FencedWrite, FencedWriter};
use super::kit::check;
use super::{
    BlockedKey, ListCursor, MarkDelivered, MarkFailed, MessagePage, OutboxStats, PurgeBatch,
    PurgeMessages, ReleaseClaim, RenewClaim, RequeueDeadLetters, SkipDeadLetter,
};
use crate::error::{
    AdminError, ClaimError, ClaimLoss, Error, ErrorRecord, Result, UnreadableMessage,
};
use crate::kind::{MessageKind, MessageStatus};
use crate::message::{ClaimedMessage, Enqueued, NewMessage, OutboxMessage};
use crate::payload::Payload;
use crate::trace::TraceCarrier;

/// The longest table or schema name accepted, in bytes. PostgreSQL truncates
/// identifiers at 63 bytes; this leaves room for the suffixes of the names
/// derived from the table (`_migrations`, `_pending`, ...), which must not
/// collide after truncation.
pub const MAX_TABLE_NAME_PART: usize = 48;

/// A validated outbox table name: `table` or `schema.table`.
///
/// Each part starts with an ASCII letter or underscore and continues with
/// ASCII letters, digits and underscores, at most [`MAX_TABLE_NAME_PART`]
/// bytes. The name is always used double-quoted, exactly as written (so on
/// PostgreSQL `Outbox` and `outbox` are different tables). Anything else is
/// refused with [`Error::InvalidTableName`]; no other text reaches SQL.
///
/// ```
/// use outbox::TableName;
///
/// assert_eq!(TableName::parse("jobs.outbox")?.quoted(), r#""jobs"."outbox""#);
/// assert!(TableName::parse("outbox; drop table orders").is_err());
/// # Ok::<(), outbox::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TableName {
    schema: Option<String>,
    name: String,
}

impl TableName {
    /// The table used when none is configured.
    pub const DEFAULT: &'static str = "outbox";

    /// Validate `name` as `table` or `schema.table`.
    pub fn parse(name: &str) -> Result<Self> {
        let invalid = |reason| Error::InvalidTableName {
            name: name.to_owned(),
            reason,
        };
        if name.is_empty() {
            return Err(invalid("it is empty"));
        }
        let mut parts = name.split('.');
        let first = parts.next().unwrap_or_default();
        let second = parts.next();
        if parts.next().is_some() {
            return Err(invalid("it has more than one dot"));
        }
        for part in std::iter::once(first).chain(second) {
            check_part(part).map_err(invalid)?;
        }
        Ok(match second {
            Some(table) => TableName {
                schema: Some(first.to_owned()),
                name: table.to_owned(),
            },
            None => TableName {
                schema: None,
                name: first.to_owned(),
            },
        })
    }

    /// The schema, when the name is qualified.
    pub fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    /// The table name without its schema.
    pub fn table(&self) -> &str {
        &self.name
    }

    /// The name as SQL: `"table"` or `"schema"."table"`.
    pub fn quoted(&self) -> String {
        match &self.schema {
            Some(schema) => format!("\"{schema}\".\"{}\"", self.name),
            None => format!("\"{}\"", self.name),
        }
    }

    /// The table name alone as SQL, `"table"`.
    pub(crate) fn quoted_bare(&self) -> String {
        format!("\"{}\"", self.name)
    }

    /// An object named after the table (`"table_suffix"`), in the table's
    /// schema when `qualified`.
    pub(crate) fn derived(&self, suffix: &str, qualified: bool) -> String {
        match (&self.schema, qualified) {
            (Some(schema), true) => format!("\"{schema}\".\"{}_{suffix}\"", self.name),
            _ => format!("\"{}_{suffix}\"", self.name),
        }
    }

    /// Whether this is the default, unqualified `outbox` table.
    pub fn is_default(&self) -> bool {
        self.schema.is_none() && self.name == Self::DEFAULT
    }
}

impl Default for TableName {
    fn default() -> Self {
        TableName {
            schema: None,
            name: Self::DEFAULT.to_owned(),
        }
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.schema {
            Some(schema) => write!(f, "{schema}.{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

impl std::str::FromStr for TableName {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Self::parse(s)
    }
}

fn check_part(part: &str) -> Result<(), &'static str> {
    let Some(first) = part.chars().next() else {
        return Err("a part around the dot is empty");
    };
    if part.len() > MAX_TABLE_NAME_PART {
        return Err("a part is longer than 48 bytes");
    }
    if !part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err("it contains a character other than ASCII letters, digits and underscores");
    }
    if first.is_ascii_digit() {
        return Err("a part starts with a digit");
    }
    Ok(())
}

/// How a backend wants the names in its DDL.
#[derive(Debug, Clone, Copy)]
// Each variant exists only with its backend's feature.
#[cfg_attr(not(all(feature = "sqlite", feature = "postgres")), allow(dead_code))]
pub(crate) enum Dialect {
    /// Index names are schema-qualified and the table after `ON` is bare:
    /// `CREATE INDEX "main"."t_x" ON "t" (...)`.
    Sqlite,
    /// Index names are bare (an index lives in its table's schema) and the
    /// table is qualified everywhere.
    Postgres,
}

/// Rewrite the outbox identifiers of a migration written for `"outbox"` so it
/// creates `table` instead. Only the quoted identifiers `"outbox"` and
/// `"outbox_<suffix>"` change; for the default table the text is unchanged,
/// so its checksum matches the embedded migration.
pub(crate) fn render_migration(sql: &str, table: &TableName, dialect: Dialect) -> String {
    const MARK: &str = "\"outbox";
    let mut out = String::with_capacity(sql.len() + 64);
    let mut rest = sql;
    while let Some(at) = rest.find(MARK) {
        let (before, tail) = rest.split_at(at);
        out.push_str(before);
        let after_mark = &tail[MARK.len()..];
        let Some(close) = after_mark.find('"') else {
            out.push_str(tail);
            return out;
        };
        let inner = &after_mark[..close];
        let replacement = if inner.is_empty() {
            let after_on = out
                .trim_end()
                .rsplit(|c: char| c.is_whitespace())
                .next()
                .is_some_and(|word| word.eq_ignore_ascii_case("ON"));
            match dialect {
                Dialect::Sqlite if after_on => Some(table.quoted_bare()),
                _ => Some(table.quoted()),
            }
        } else {
            // PostgreSQL creates an index in its table's schema and refuses
            // a qualified index name; anything else named after the table
            // (a table, a function) is qualified like the table.
            let index = after_mark[close + 1..]
                .split_whitespace()
                .next()
                .is_some_and(|word| word.eq_ignore_ascii_case("ON"));
            let qualified = match dialect {
                Dialect::Sqlite => true,
                Dialect::Postgres => !index,
            };
            inner
                .strip_prefix('_')
                .map(|suffix| table.derived(suffix, qualified))
        };
        match replacement {
            Some(replacement) => out.push_str(&replacement),
            // Some other identifier that happens to start with "outbox".
            None => {
                out.push_str(MARK);
                out.push_str(inner);
                out.push('"');
            }
        }
        rest = &after_mark[close + 1..];
    }
    out.push_str(rest);
    out
}

/// The embedded migrations rendered for `table`, tracked in
/// `"<table>_migrations"` (in the table's schema).
pub(crate) fn migrator_for(
    embedded: &sqlx::migrate::Migrator,
    table: &TableName,
    dialect: Dialect,
) -> sqlx::migrate::Migrator {
    use sqlx::SqlSafeStr;
    let migrations = embedded
        .iter()
        .map(|m| {
            let sql = render_migration(m.sql.as_str(), table, dialect);
            sqlx::migrate::Migration::new(
                m.version,
                m.description.clone(),
                m.migration_type,
                sqlx::AssertSqlSafe(sql).into_sql_str(),
                m.no_tx,
            )
        })
        .collect();
    let mut migrator = sqlx::migrate::Migrator::with_migrations(migrations);
    migrator.dangerous_set_table_name(table.derived("migrations", true));
    migrator
}

/// How settlements (renewals, `mark_delivered`, `mark_failed`,
/// `release_claim`) reach the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettlementMode {
    /// One statement per call.
    PerMessage,
    /// Concurrent calls share one statement of up to `max_rows` rows. Calls
    /// made while a statement runs go out together as soon as it ends; a
    /// call with no statement ahead of it goes out once no other ready
    /// caller joins, and a steady stream of calls is cut every `window`.
    /// Each row is still fenced by its own claim token and lease and gets its
    /// own result: a row whose claim was lost gets [`Error::Claim`], the
    /// others succeed. Under load this turns many commits into one; a call
    /// waits at most `window` plus the statement ahead of it.
    Batched {
        /// The longest a batch keeps gathering after its first call.
        window: std::time::Duration,
        /// Most rows per statement; at least 1.
        max_rows: usize,
    },
}

impl SettlementMode {
    /// Batched, up to 1 ms or 128 rows per statement.
    pub const DEFAULT_BATCHED: SettlementMode = SettlementMode::Batched {
        window: std::time::Duration::from_millis(1),
        max_rows: 128,
    };

    pub(crate) fn validate(self) -> Result<Self> {
        if let SettlementMode::Batched { window, max_rows } = self {
            if max_rows == 0 {
                return Err(Error::invalid("settlement.max_rows", "must be at least 1"));
            }
            if window > std::time::Duration::from_secs(1) {
                return Err(Error::invalid(
                    "settlement.window",
                    "must be at most 1s; every settlement waits up to this long",
                ));
            }
        }
        Ok(self)
    }
}

impl Default for SettlementMode {
    fn default() -> Self {
        Self::DEFAULT_BATCHED
    }
}

/// A stored row with its columns decoded to plain values, before the values
/// are checked.
#[derive(Debug)]
pub(crate) struct MessageRow {
    pub(crate) seq: i64,
    pub(crate) id: String,
    pub(crate) kind: String,
    pub(crate) name: String,
    pub(crate) payload: String,
    pub(crate) trace: Option<String>,
    pub(crate) status: String,
    pub(crate) attempts: i64,
    pub(crate) max_attempts: i64,
    pub(crate) max_attempts_set: bool,
    pub(crate) available_at: DateTime<Utc>,
    pub(crate) claim_token: Option<String>,
    pub(crate) claimed_at: Option<DateTime<Utc>>,
    pub(crate) locked_until: Option<DateTime<Utc>>,
    pub(crate) last_error: Option<String>,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) updated_at: DateTime<Utc>,
    pub(crate) delivered_at: Option<DateTime<Utc>>,
    pub(crate) ordering_key: Option<String>,
    pub(crate) skipped_at: Option<DateTime<Utc>>,
}

impl MessageRow {
    fn corrupt(&self, reason: impl Into<String>) -> Error {
        Error::CorruptRow {
            id: self.id.clone(),
            reason: reason.into(),
        }
    }

    fn count(&self, column: &str, value: i64) -> Result<u32> {
        u32::try_from(value).map_err(|_| self.corrupt(format!("{column} is {value}")))
    }

    /// Check the values and build the message.
    pub(crate) fn into_message(mut self) -> Result<OutboxMessage> {
        let kind: MessageKind = self
            .kind
            .parse()
            .map_err(|_| self.corrupt(format!("kind is {:?}", self.kind)))?;
        let status: MessageStatus = self
            .status
            .parse()
            .map_err(|_| self.corrupt(format!("status is {:?}", self.status)))?;
        // Taken, not copied: an error names the row by its id alone.
        let payload = Payload::from_json(std::mem::take(&mut self.payload))
            .map_err(|e| self.corrupt(format!("payload: {e}")))?;
        let trace = match &self.trace {
            Some(text) => Some(
                serde_json::from_str::<TraceCarrier>(text)
                    .map_err(|e| self.corrupt(format!("trace: {e}")))?,
            ),
            None => None,
        };
        let attempts = self.count("attempts", self.attempts)?;
        let max_attempts = self.count("max_attempts", self.max_attempts)?;
        Ok(OutboxMessage {
            id: self.id,
            kind,
            name: self.name,
            payload,
            trace,
            status,
            attempts,
            max_attempts,
            max_attempts_set: self.max_attempts_set,
            available_at: self.available_at,
            claim_token: self.claim_token,
            claimed_at: self.claimed_at,
            locked_until: self.locked_until,
            last_error: self.last_error.as_deref().map(ErrorRecord::from_json),
            created_at: self.created_at,
            updated_at: self.updated_at,
            delivered_at: self.delivered_at,
            ordering_key: self.ordering_key,
            skipped_at: self.skipped_at,
        })
    }
}

/// A just-claimed message as a delivery sees it, under the claim's attempt
/// cap `cap` when the message has none of its own.
pub(crate) fn claimed_view(message: OutboxMessage, cap: u32) -> Result<ClaimedMessage> {
    let max_attempts = message.effective_max_attempts(cap);
    let (Some(claim_token), Some(claimed_at), Some(locked_until)) = (
        message.claim_token,
        message.claimed_at,
        message.locked_until,
    ) else {
        return Err(Error::CorruptRow {
            id: message.id,
            reason: "claimed without a token, claim time or lease".into(),
        });
    };
    Ok(ClaimedMessage {
        id: message.id,
        kind: message.kind,
        name: message.name,
        payload: message.payload,
        trace: message.trace,
        attempts: message.attempts,
        max_attempts,
        max_attempts_set: message.max_attempts_set,
        available_at: message.available_at,
        created_at: message.created_at,
        ordering_key: message.ordering_key,
        claim_token,
        claimed_at,
        locked_until,
    })
}

/// Why a fenced write matched no row, from the row as it is now.
pub(crate) fn claim_loss(
    id: &str,
    row: Option<(String, Option<String>, Option<DateTime<Utc>>)>,
    claim_token: &str,
    now: DateTime<Utc>,
) -> ClaimError {
    let reason = match row {
        None => ClaimLoss::Missing,
        Some((status, _, _)) if status != MessageStatus::Claimed.as_str() => ClaimLoss::NotClaimed,
        Some((_, token, _)) if token.as_deref() != Some(claim_token) => ClaimLoss::TokenMismatch,
        Some((_, _, until)) if until.is_none_or(|until| until <= now) => ClaimLoss::LeaseExpired,
        // The row matches now, so it changed between the write and this read.
        Some(_) => ClaimLoss::Unknown,
    };
    ClaimError::new(id, reason)
}

/// The refusal every admin change to one message shares: its live claim.
fn live_claim(
    id: &str,
    status: MessageStatus,
    locked_until: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Option<Error> {
    locked_until
        .filter(|&until| status == MessageStatus::Claimed && until > now)
        .map(|locked_until| {
            AdminError::ClaimLive {
                id: id.to_owned(),
                locked_until,
            }
            .into()
        })
}

/// Why a requeue matched nothing, from the message's status and lease as
/// read afterwards.
pub(crate) fn requeue_refusal(
    id: &str,
    status: MessageStatus,
    locked_until: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Error {
    // A dead letter that the update missed was requeued in between.
    live_claim(id, status, locked_until, now).unwrap_or_else(|| {
        AdminError::NotDeadLettered {
            id: id.to_owned(),
            status,
        }
        .into()
    })
}

/// `(status, minute since the epoch, count)` rows as per-minute activity.
pub(crate) fn activity_rows(
    rows: Vec<(String, i64, i64)>,
) -> Result<Vec<crate::store::MinuteActivity>> {
    let mut merged = Vec::with_capacity(rows.len());
    for (status, minute, count) in rows {
        let status: MessageStatus = status.parse()?;
        let minute = DateTime::from_timestamp(minute.saturating_mul(60), 0).ok_or_else(|| {
            Error::store(
                "activity",
                std::io::Error::other(format!("minute {minute} is out of range")),
            )
        })?;
        merged.push((minute, status, u64::try_from(count).unwrap_or(0)));
    }
    Ok(crate::store::merge_activity(merged))
}

/// Names the refusal of an admin change to one message from its id, its
/// status, its lease (if any) and the caller's clock.
type Refusal = fn(&str, MessageStatus, Option<DateTime<Utc>>, DateTime<Utc>) -> Error;

/// Why a message could not be retried now: its live claim, or its status.
pub(crate) fn retry_refusal(
    id: &str,
    status: MessageStatus,
    locked_until: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Error {
    live_claim(id, status, locked_until, now).unwrap_or_else(|| {
        AdminError::NotPending {
            id: id.to_owned(),
            status,
        }
        .into()
    })
}

/// Map a database error of `operation` to the store's transient error, or,
/// when the table is missing, to [`Error::NotSetUp`] with the fix.
pub(crate) fn db(operation: &'static str) -> impl FnOnce(sqlx::Error) -> Error {
    move |e| match super::connect::missing_table(&e) {
        Some(detail) => Error::NotSetUp { operation, detail },
        None => Error::store(operation, e),
    }
}

/// A JSON text column for an optional trace carrier.
pub(crate) fn trace_json(trace: Option<&TraceCarrier>) -> Option<String> {
    trace.map(|t| serde_json::to_string(t).expect("a trace carrier serializes"))
}

/// The statements every SQL store runs the same way, rendered for its table
/// in its dialect.
#[derive(Debug)]
pub(crate) struct SharedStatements {
    /// The table, quoted.
    pub(crate) table: Arc<str>,
    /// One message by id. Binds: id.
    pub(crate) get: Arc<str>,
    /// Counts per status, live claims, oldest due. Binds: now.
    pub(crate) stats: Arc<str>,
    /// Requeue one dead letter. Binds: id, now.
    pub(crate) requeue_one: Arc<str>,
    /// Requeue every dead letter (of a name). Binds: now, name or NULL.
    pub(crate) requeue_all: Arc<str>,
    /// Status and lease of one message, to name a refused requeue. Binds: id.
    pub(crate) requeue_state: Arc<str>,
    /// Delete a batch of terminal messages of one status, oldest first.
    /// Binds: status, horizon, limit.
    pub(crate) purge_batch: Arc<str>,
    /// Count the terminal messages a purge would delete. Binds: status or
    /// NULL, horizon.
    pub(crate) count_purgeable: Arc<str>,
    /// Mark one dead letter skipped. Binds: id, now.
    pub(crate) skip: Arc<str>,
    /// Blocked ordering keys with their heads. Binds: limit.
    pub(crate) blocked: Arc<str>,
    /// The row holding an idempotency key and its window's end. Binds: key.
    pub(crate) idempotency_holder: Arc<str>,
    /// Free an idempotency key whose window ended. Binds: key, now.
    pub(crate) idempotency_release: Arc<str>,
    /// Make the space of deleted rows reusable, where the database does not
    /// do so by itself as rows go. Binds nothing.
    pub(crate) vacuum: Option<Arc<str>>,
}

/// The claim's test that the row `m` is the head of its ordering key (or has
/// no key): no earlier message of the key is pending or claimed, or a dead
/// letter not skipped while `block` (a bound boolean) holds; and no later
/// one is claimed under a lease still running at `now` (an earlier one can
/// appear after a later one was claimed: a requeued dead letter, or on
/// PostgreSQL a transaction that committed after a later one). A later
/// claim whose lease ran out does not hold the key: that message waits,
/// claimable, behind the earlier one, and holding the key for it would stop
/// both for good. Both probes are answered from the partial indexes of
/// unsettled and claimed keyed rows.
///
/// With `key_order` the first probe is a scalar subquery in key order
/// rather than `NOT EXISTS`: where a few keys hold many rows, PostgreSQL
/// planned `NOT EXISTS` as a sequential scan, which reads the whole table
/// for a head (nothing earlier to find); in key order it reads the index
/// from the key's first row. SQLite takes the other form: given the order
/// by `seq`, it walks the rowid from the table's start instead.
pub(crate) fn head_test(t: &str, block: &str, now: &str, key_order: bool) -> String {
    let earlier = format!(
        "FROM {t} AS e \
         WHERE e.ordering_key = m.ordering_key AND e.ordering_key IS NOT NULL \
           AND e.status <> 'delivered' AND e.seq < m.seq \
           AND (e.status <> 'dead_lettered' OR ({block} AND e.skipped_at IS NULL))"
    );
    let no_earlier = if key_order {
        format!("(SELECT e.seq {earlier} ORDER BY e.seq LIMIT 1) IS NULL")
    } else {
        format!("NOT EXISTS (SELECT 1 {earlier})")
    };
    format!(
        "(m.ordering_key IS NULL OR ( \
           {no_earlier} \
           AND NOT EXISTS (SELECT 1 FROM {t} AS e \
             WHERE e.ordering_key = m.ordering_key AND e.ordering_key IS NOT NULL \
               AND e.status = 'claimed' AND e.seq > m.seq AND e.locked_until > {now})))"
    )
}

/// The keyed arm of a claim, as common table expressions (the statement
/// needs `WITH RECURSIVE`) of which the last, `keyed`, holds up to `limit`
/// pending keyed rows that are due at `now` and pass the `head` test, in
/// claim order, locking nothing.
///
/// A key has at most one such row, its first pending or claimed message by
/// `seq`, however many are queued behind it, so walking the keyed rows in
/// claim order finds few heads among many rows when there are few keys.
/// The walk ([`keyed_walk_cte`]) stops after `walk` rows; when it found
/// fewer than `limit` heads and more rows remain, each key's first live row
/// is looked up instead ([`key_fronts_cte`]). Either way a claim costs
/// about the rows it takes, the keys, or both, never the backlog. `row` is
/// the column a key's first row is joined back on (indexed).
pub(crate) fn keyed_heads(
    t: &str,
    head: &str,
    now: &str,
    limit: &str,
    walk: &str,
    row: &str,
) -> String {
    let walked = keyed_walk_cte(t, head, now, walk);
    let fronts = key_fronts_cte(
        t,
        row,
        &format!(
            "(SELECT count(*) FROM walk) >= {walk} \
             AND (SELECT count(*) FROM walk WHERE head) < {limit}"
        ),
    );
    format!(
        "{walked}, {fronts}, \
         keyed AS ( \
           SELECT id, available_at, created_at, seq, ordering_key FROM walk WHERE head \
           UNION \
           SELECT m.id, m.available_at, m.created_at, m.seq, m.ordering_key \
           FROM key_fronts JOIN {t} AS m ON m.{row} = key_fronts.r \
           WHERE m.status = 'pending' AND m.available_at <= {now} AND {head} \
           ORDER BY available_at, created_at, seq LIMIT {limit})"
    )
}

/// The common table expression `walk`: the first `walk` pending keyed rows
/// due at `now`, in claim order, locking nothing, each with whether it
/// passes the `head` test (column `head`).
fn keyed_walk_cte(t: &str, head: &str, now: &str, walk: &str) -> String {
    format!(
        "walk AS MATERIALIZED ( \
           SELECT id, available_at, created_at, seq, ordering_key, {head} AS head \
           FROM {t} AS m \
           WHERE status = 'pending' AND ordering_key IS NOT NULL AND available_at <= {now} \
           ORDER BY available_at, created_at, seq LIMIT {walk})"
    )
}

/// Two common table expressions (the statement needs `WITH RECURSIVE`):
/// `key_scan`, every key with unsettled rows, and `key_fronts`, each key's
/// first pending or claimed row by `seq` (its `row` column), both empty
/// unless `gate` holds. A skip scan of the `(ordering_key, seq)` index: one
/// probe per key, then one for its first live row, however many rows are
/// queued behind it. The gate is tested before the first probe: as a
/// condition of the probe's own scan, SQLite tested it on every entry of
/// the index when it failed.
pub(crate) fn key_fronts_cte(t: &str, row: &str, gate: &str) -> String {
    format!(
        "key_scan (k) AS ( \
           SELECT (SELECT ordering_key FROM {t} \
             WHERE ordering_key IS NOT NULL AND status <> 'delivered' \
             ORDER BY ordering_key LIMIT 1) \
           WHERE {gate} \
           UNION ALL \
           SELECT (SELECT ordering_key FROM {t} \
             WHERE ordering_key IS NOT NULL AND status <> 'delivered' \
               AND ordering_key > key_scan.k \
             ORDER BY ordering_key LIMIT 1) \
           FROM key_scan WHERE key_scan.k IS NOT NULL), \
         key_fronts (r) AS ( \
           SELECT (SELECT e.{row} FROM {t} AS e \
             WHERE e.ordering_key = key_scan.k AND e.ordering_key IS NOT NULL \
               AND e.status <> 'delivered' AND e.status IN ('pending', 'claimed') \
             ORDER BY e.seq LIMIT 1) \
           FROM key_scan WHERE key_scan.k IS NOT NULL)"
    )
}

/// How many keyed rows a claim of `limit` walks in claim order before it
/// looks up each key's head instead (see [`keyed_heads`]): enough to find
/// `limit` heads where keys are many and most due rows are heads, few
/// enough that where keys are few the walk costs little beside the lookups.
/// At most [`MAX_KEYED_WALK`], so the largest claims stay cheap to plan.
pub(crate) fn keyed_walk(limit: usize) -> usize {
    limit
        .saturating_mul(2)
        .saturating_add(16)
        .min(MAX_KEYED_WALK)
}

/// The most keyed rows a claim walks. Each costs PostgreSQL's planner two
/// probes, and past its `jit_above_cost` a claim is compiled before it runs,
/// which takes longer than the claim; a larger claim finds the rest of its
/// heads by key.
const MAX_KEYED_WALK: usize = 1024;

/// The count of pending rows, from the two partial indexes of pending rows
/// (keyless and keyed), never touching settled ones.
pub(crate) fn pending_count(t: &str) -> String {
    format!(
        "(SELECT count(*) FROM {t} WHERE status = 'pending' AND ordering_key IS NULL) + \
         (SELECT count(*) FROM {t} WHERE status = 'pending' AND ordering_key IS NOT NULL)"
    )
}

/// The earliest `available_at` of a pending row due at `now`, from the two
/// partial indexes of pending rows; NULL when none is due.
pub(crate) fn oldest_due(t: &str, now: &str) -> String {
    format!(
        "(SELECT min(due) FROM ( \
           SELECT min(available_at) AS due FROM {t} \
           WHERE status = 'pending' AND ordering_key IS NULL AND available_at <= {now} \
           UNION ALL \
           SELECT min(available_at) FROM {t} \
           WHERE status = 'pending' AND ordering_key IS NOT NULL AND available_at <= {now}) \
           AS arms)"
    )
}

/// Blocked ordering keys: each key's earliest dead letter not skipped, with
/// the count of unsettled messages after it, by key, up to `limit`.
pub(crate) fn blocked_keys(t: &str, limit: &str) -> Arc<str> {
    format!(
        "SELECT d.ordering_key, d.id, d.name, \
           (SELECT count(*) FROM {t} AS w WHERE w.ordering_key = d.ordering_key \
             AND w.ordering_key IS NOT NULL AND w.status <> 'delivered' \
             AND w.status IN ('pending', 'claimed') AND w.seq > d.seq) AS waiting \
         FROM {t} AS d \
         WHERE d.ordering_key IS NOT NULL AND d.status = 'dead_lettered' AND d.skipped_at IS NULL \
           AND NOT EXISTS (SELECT 1 FROM {t} AS e WHERE e.ordering_key = d.ordering_key \
             AND e.ordering_key IS NOT NULL AND e.status <> 'delivered' \
             AND e.status = 'dead_lettered' AND e.skipped_at IS NULL AND e.seq < d.seq) \
         ORDER BY d.ordering_key LIMIT {limit}"
    )
    .into()
}

/// What a SQL store's core gives the shared half.
pub(crate) trait SqlBackend: FencedBackend {
    /// The sqlx database.
    type Db: Database<QueryResult: RowsAffected>;
    /// A time as the database stores it.
    type Time: StoredTime
        + for<'q> Encode<'q, Self::Db>
        + for<'r> Decode<'r, Self::Db>
        + sqlx::Type<Self::Db>;

    /// The pool, table and statements of the store.
    fn parts(&self) -> &SqlParts<Self::Db>;

    /// Taken around the store's own requeues and purges where the database
    /// wants its writers queued in process; `None` where it does not.
    fn write_lock(&self) -> impl Future<Output = Option<tokio::sync::MutexGuard<'_, ()>>> + Send;

    /// Runs after a requeue changed rows, to wake drains.
    fn after_requeue(&self) -> impl Future<Output = ()> + Send;

    /// Every column of `row` as text (`None` for `NULL`), to show a row
    /// that does not decode as it is stored.
    fn raw_columns(row: &<Self::Db as Database>::Row) -> BTreeMap<String, Option<String>>;

    /// `true` when the store judges leases by the database's clock: the
    /// shared statements then get NULL for `now` and read the time
    /// themselves.
    fn server_clock(&self) -> bool {
        false
    }
}

/// What every SQL store's core holds.
pub(crate) struct SqlParts<DB: Database> {
    /// The store's pool.
    pub(crate) pool: sqlx::Pool<DB>,
    /// The store's table.
    pub(crate) table: TableName,
    /// The statements the shared half runs.
    pub(crate) shared: SharedStatements,
}

/// How a database stores a time.
pub(crate) trait StoredTime: Send + Sync + Sized + 'static {
    /// `at` as stored.
    fn store(at: DateTime<Utc>) -> Self;
    /// Back on the calendar; an error when it is off it.
    fn load(self) -> Result<DateTime<Utc>>;
}

/// Microseconds since the epoch (SQLite's INTEGER times).
#[cfg(feature = "sqlite")]
impl StoredTime for i64 {
    fn store(at: DateTime<Utc>) -> Self {
        at.timestamp_micros()
    }

    fn load(self) -> Result<DateTime<Utc>> {
        DateTime::from_timestamp_micros(self).ok_or_else(|| Error::CorruptRow {
            id: String::new(),
            reason: format!("{self} µs since the epoch is out of range"),
        })
    }
}

/// A time the database decodes itself (PostgreSQL's `timestamptz`).
#[cfg(feature = "postgres")]
impl StoredTime for DateTime<Utc> {
    fn store(at: DateTime<Utc>) -> Self {
        at
    }

    fn load(self) -> Result<DateTime<Utc>> {
        Ok(self)
    }
}

/// How many rows a statement changed, whatever the database.
pub(crate) trait RowsAffected {
    /// The count the database reported.
    fn count(&self) -> u64;
}

#[cfg(feature = "sqlite")]
impl RowsAffected for sqlx::sqlite::SqliteQueryResult {
    fn count(&self) -> u64 {
        self.rows_affected()
    }
}

#[cfg(feature = "postgres")]
impl RowsAffected for sqlx::postgres::PgQueryResult {
    fn count(&self) -> u64 {
        self.rows_affected()
    }
}

/// The columns that fence a write, as read back to name why it missed:
/// status, claim token, `locked_until`.
pub(crate) type Fence = (String, Option<String>, Option<DateTime<Utc>>);

/// The half both SQL stores share: their core and its fenced writer.
pub(crate) struct SqlOutbox<B> {
    pub(crate) core: Arc<B>,
    writer: Arc<FencedWriter<B>>,
}

impl<B> Clone for SqlOutbox<B> {
    fn clone(&self) -> Self {
        SqlOutbox {
            core: self.core.clone(),
            writer: self.writer.clone(),
        }
    }
}

impl<B> SqlOutbox<B>
where
    B: SqlBackend,
    for<'c> &'c mut <B::Db as Database>::Connection: Executor<'c, Database = B::Db>,
    <B::Db as Database>::Arguments: IntoArguments<B::Db>,
    for<'q> &'q str: Encode<'q, B::Db> + sqlx::Type<B::Db>,
    for<'q> Option<&'q str>: Encode<'q, B::Db>,
    for<'q> Option<String>: Encode<'q, B::Db>,
    for<'q> i64: Encode<'q, B::Db>,
    for<'q> Option<B::Time>: Encode<'q, B::Db>,
    for<'r> String: Decode<'r, B::Db> + sqlx::Type<B::Db>,
    for<'r> i64: Decode<'r, B::Db> + sqlx::Type<B::Db>,
    for<'q> bool: Encode<'q, B::Db> + Decode<'q, B::Db> + sqlx::Type<B::Db>,
    for<'a> &'a str: ColumnIndex<<B::Db as Database>::Row>,
    usize: ColumnIndex<<B::Db as Database>::Row>,
{
    /// The shared half over `core`, sending fenced writes as `mode` says,
    /// at most `statements` batches at a time.
    pub(crate) fn new(core: B, mode: SettlementMode, statements: usize) -> Self {
        let core = Arc::new(core);
        SqlOutbox {
            writer: Arc::new(FencedWriter::new(core.clone(), mode, statements)),
            core,
        }
    }

    /// How fenced writes are sent.
    pub(crate) fn mode(&self) -> SettlementMode {
        self.writer.mode()
    }

    async fn fenced(&self, row: FencedWrite) -> Result<()> {
        check::fence(&row.id, &row.claim_token)?;
        self.writer.run(row).await
    }

    pub(crate) async fn renew_claim(&self, params: RenewClaim) -> Result<DateTime<Utc>> {
        let (row, locked_until) = FencedWrite::renew(params)?;
        self.fenced(row).await?;
        Ok(locked_until)
    }

    pub(crate) async fn mark_delivered(&self, params: MarkDelivered) -> Result<()> {
        self.fenced(params.into()).await
    }

    pub(crate) async fn mark_failed(&self, params: MarkFailed) -> Result<()> {
        self.fenced(params.into()).await
    }

    pub(crate) async fn release_claim(&self, params: ReleaseClaim) -> Result<()> {
        self.fenced(params.into()).await
    }

    /// Counts from the partial indexes of pending rows, never touching
    /// settled ones.
    pub(crate) async fn pending_count(&self) -> Result<Option<u64>> {
        let sql = format!("SELECT {}", pending_count(&self.core.parts().shared.table));
        let count: i64 = sqlx::query_scalar(AssertSqlSafe(sql))
            .fetch_one(&self.core.parts().pool)
            .await
            .map_err(db("pending_count"))?;
        Ok(Some(u64::try_from(count).unwrap_or(0)))
    }

    pub(crate) async fn stats(&self, now: DateTime<Utc>) -> Result<OutboxStats> {
        let now = (!self.core.server_clock()).then(|| B::Time::store(now));
        let row = sqlx::query(AssertSqlSafe(self.core.parts().shared.stats.clone()))
            .bind(now)
            .fetch_one(&self.core.parts().pool)
            .await
            .map_err(db("stats"))?;
        let count = |i: usize| -> Result<u64> {
            let n: i64 = row.try_get(i).map_err(db("stats"))?;
            Ok(u64::try_from(n).unwrap_or(0))
        };
        let claimed = count(1)?;
        let live_claims = count(4)?;
        let oldest: Option<B::Time> = row.try_get(5).map_err(db("stats"))?;
        let blocked_keys = count(6)?;
        Ok(OutboxStats {
            pending: count(0)?,
            claimed,
            delivered: count(2)?,
            dead_lettered: count(3)?,
            live_claims,
            expired_claims: claimed.saturating_sub(live_claims),
            oldest_due_at: oldest.map(StoredTime::load).transpose()?,
            blocked_keys,
        })
    }

    pub(crate) async fn get_message(&self, id: &str) -> Result<OutboxMessage> {
        let row = sqlx::query(AssertSqlSafe(self.core.parts().shared.get.clone()))
            .bind(id)
            .fetch_optional(&self.core.parts().pool)
            .await
            .map_err(db("get_message"))?
            .ok_or_else(|| Error::NotFound { id: id.to_owned() })?;
        Self::decode(&row)
            .and_then(MessageRow::into_message)
            .map_err(|error| Error::Unreadable(Box::new(Self::unreadable(&row, error))))
    }

    /// The time an admin change writes: the caller's `now`, or NULL where
    /// the store judges leases by the database's clock (the statement then
    /// reads that clock). A requeue stamped by a caller whose clock runs
    /// ahead would otherwise leave the message waiting out the skew.
    fn admin_now(&self, now: DateTime<Utc>) -> Option<B::Time> {
        (!self.core.server_clock()).then(|| B::Time::store(now))
    }

    pub(crate) async fn requeue_dead_letters(&self, params: RequeueDeadLetters) -> Result<u64> {
        check::requeue(&params)?;
        let sql = &self.core.parts().shared;
        let now = self.admin_now(params.now);
        let requeued = {
            let _write = self.core.write_lock().await;
            match &params.id {
                Some(id) => {
                    let done = sqlx::query(AssertSqlSafe(sql.requeue_one.clone()))
                        .bind(id.as_str())
                        .bind(now)
                        .execute(&self.core.parts().pool)
                        .await
                        .map_err(db("requeue_dead_letters"))?;
                    if done.count() == 0 {
                        return Err(self.refusal(id, params.now, requeue_refusal).await);
                    }
                    done.count()
                }
                None => {
                    let done = sqlx::query(AssertSqlSafe(sql.requeue_all.clone()))
                        .bind(now)
                        .bind(params.name.as_deref())
                        .execute(&self.core.parts().pool)
                        .await
                        .map_err(db("requeue_dead_letters"))?;
                    done.count()
                }
            }
        };
        if requeued > 0 {
            self.core.after_requeue().await;
        }
        Ok(requeued)
    }

    /// Make a pending message due now with `statement` (the backend's
    /// spelling of it: id bound first, then `now`), or say why not.
    pub(crate) async fn retry_now(
        &self,
        statement: String,
        id: &str,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let done = {
            let _write = self.core.write_lock().await;
            sqlx::query(AssertSqlSafe(statement))
                .bind(id)
                .bind(self.admin_now(now))
                .execute(&self.core.parts().pool)
                .await
                .map_err(db("retry_now"))?
        };
        if done.count() == 0 {
            return Err(self.refusal(id, now, retry_refusal).await);
        }
        self.core.after_requeue().await;
        Ok(())
    }

    /// How many messages the purge would delete.
    pub(crate) async fn count_purgeable(&self, params: PurgeMessages) -> Result<u64> {
        check::purge(&params)?;
        let sql = self.core.parts().shared.count_purgeable.clone();
        let count: i64 = sqlx::query_scalar(AssertSqlSafe(sql))
            .bind(params.status.map(MessageStatus::as_str))
            .bind(B::Time::store(params.older_than))
            .fetch_one(&self.core.parts().pool)
            .await
            .map_err(db("count_purgeable"))?;
        Ok(u64::try_from(count).unwrap_or(0))
    }

    /// Why an admin change to one message did not apply, from its state
    /// read back; `refuse` names the refusal for that state.
    async fn refusal(&self, id: &str, now: DateTime<Utc>, refuse: Refusal) -> Error {
        let row = sqlx::query(AssertSqlSafe(
            self.core.parts().shared.requeue_state.clone(),
        ))
        .bind(id)
        .fetch_optional(&self.core.parts().pool)
        .await;
        let row = match row {
            Ok(Some(row)) => row,
            Ok(None) => return Error::NotFound { id: id.to_owned() },
            Err(e) => return Error::store("requeue_dead_letters", e),
        };
        let status: Result<MessageStatus> = row
            .try_get::<String, _>(0)
            .map_err(db("requeue_dead_letters"))
            .and_then(|s| s.parse());
        let status = match status {
            Ok(status) => status,
            Err(e) => return e,
        };
        let until: Option<DateTime<Utc>> = row
            .try_get::<Option<B::Time>, _>(1)
            .ok()
            .flatten()
            .and_then(|stored| stored.load().ok());
        refuse(id, status, until, now)
    }

    pub(crate) async fn skip_dead_letter(&self, params: SkipDeadLetter) -> Result<()> {
        check::skip(&params.id)?;
        let done = {
            let _write = self.core.write_lock().await;
            sqlx::query(AssertSqlSafe(self.core.parts().shared.skip.clone()))
                .bind(params.id.as_str())
                .bind(self.admin_now(params.now))
                .execute(&self.core.parts().pool)
                .await
                .map_err(db("skip_dead_letter"))?
        };
        if done.count() == 0 {
            return Err(self.refusal(&params.id, params.now, requeue_refusal).await);
        }
        // The key's next message may be claimable now.
        self.core.after_requeue().await;
        Ok(())
    }

    pub(crate) async fn blocked_keys(&self, limit: usize) -> Result<Vec<BlockedKey>> {
        check::blocked_keys(limit)?;
        let rows = sqlx::query(AssertSqlSafe(self.core.parts().shared.blocked.clone()))
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.core.parts().pool)
            .await
            .map_err(db("blocked_keys"))?;
        rows.iter()
            .map(|row| {
                let waiting: i64 = row.try_get(3).map_err(db("blocked_keys"))?;
                Ok(BlockedKey::new(
                    row.try_get(0).map_err(db("blocked_keys"))?,
                    row.try_get(1).map_err(db("blocked_keys"))?,
                    row.try_get(2).map_err(db("blocked_keys"))?,
                    u64::try_from(waiting).unwrap_or(0),
                ))
            })
            .collect()
    }

    /// Run `insert` (which answers whether it stored a row), honouring the
    /// message's idempotency key: a key held by a row whose window is still
    /// open answers that row's id; a key whose window ended is freed and the
    /// insert tried once more. Every statement is a plain insert, select or
    /// update that raises nothing on a taken id or key, so the caller's
    /// transaction stays usable.
    pub(crate) async fn insert_idempotent<F>(
        parts: &SqlParts<B::Db>,
        conn: &mut <B::Db as Database>::Connection,
        message: &NewMessage,
        id: String,
        mut insert: F,
    ) -> Result<Enqueued>
    where
        F: for<'c> FnMut(
            &'c mut <B::Db as Database>::Connection,
        ) -> futures_util::future::BoxFuture<'c, Result<bool>>,
    {
        let shared = &parts.shared;
        for _ in 0..2 {
            if insert(&mut *conn).await? {
                return Ok(Enqueued::Inserted(id));
            }
            let Some(idempotency) = &message.idempotency else {
                return Ok(Enqueued::AlreadyExists(id));
            };
            let holder = sqlx::query(AssertSqlSafe(shared.idempotency_holder.clone()))
                .bind(idempotency.key.as_str())
                .fetch_optional(&mut *conn)
                .await
                .map_err(db("enqueue"))?;
            let Some(holder) = holder else {
                // The id was taken, not the key.
                return Ok(Enqueued::AlreadyExists(id));
            };
            let holder_id: String = holder.try_get(0).map_err(db("enqueue"))?;
            let until: Option<B::Time> = holder.try_get(1).map_err(db("enqueue"))?;
            let until = until.map(StoredTime::load).transpose()?;
            if until.is_none_or(|until| until > message.now) {
                return Ok(Enqueued::AlreadyExists(holder_id));
            }
            sqlx::query(AssertSqlSafe(shared.idempotency_release.clone()))
                .bind(idempotency.key.as_str())
                .bind(B::Time::store(message.now))
                .execute(&mut *conn)
                .await
                .map_err(db("enqueue"))?;
        }
        // Freed and taken again by a concurrent enqueue between our two
        // tries: that enqueue's message is the one within the window.
        let holder = match &message.idempotency {
            Some(idempotency) => {
                sqlx::query_scalar::<_, String>(AssertSqlSafe(shared.idempotency_holder.clone()))
                    .bind(idempotency.key.as_str())
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err(db("enqueue"))?
            }
            None => None,
        };
        Ok(Enqueued::AlreadyExists(holder.unwrap_or(id)))
    }

    /// A purge in batches, each a statement of its own, so no lock is held
    /// for long however many rows go.
    pub(crate) async fn purge(&self, params: PurgeMessages) -> Result<u64> {
        check::purge(&params)?;
        const BATCH: usize = 10_000;
        let statuses = match params.status {
            Some(status) => vec![status],
            None => vec![MessageStatus::Delivered, MessageStatus::DeadLettered],
        };
        let mut deleted = 0;
        for status in statuses {
            loop {
                let batch = PurgeBatch {
                    status,
                    older_than: params.older_than,
                    limit: BATCH,
                };
                let done = self.purge_batch(batch).await?;
                deleted += done;
                if done < BATCH as u64 {
                    break;
                }
            }
        }
        Ok(deleted)
    }

    /// One bounded delete; see [`OutboxStore::purge_batch`](crate::OutboxStore::purge_batch).
    pub(crate) async fn purge_batch(&self, params: PurgeBatch) -> Result<u64> {
        check::purge_batch(&params)?;
        let _write = self.core.write_lock().await;
        let done = sqlx::query(AssertSqlSafe(self.core.parts().shared.purge_batch.clone()))
            .bind(params.status.as_str())
            .bind(B::Time::store(params.older_than))
            .bind(i64::try_from(params.limit).unwrap_or(i64::MAX))
            .execute(&self.core.parts().pool)
            .await
            .map_err(db("purge"))?;
        Ok(done.count())
    }

    /// See [`OutboxStore::vacuum`](crate::OutboxStore::vacuum).
    pub(crate) async fn vacuum(&self) -> Result<()> {
        let Some(sql) = self.core.parts().shared.vacuum.clone() else {
            return Ok(());
        };
        // The simple protocol: VACUUM refuses to run in a transaction, and
        // the extended protocol may wrap a statement in one.
        sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(&self.core.parts().pool)
            .await
            .map_err(db("vacuum"))?;
        Ok(())
    }

    /// The insert of `message` with its twelve common binds, and the id it
    /// gets: id, kind, name, payload, trace, max attempts, available at, now,
    /// ordering key, idempotency key, idempotency window end, whether the
    /// max attempts were set.
    /// `available_at` is the message's, else its `now`, else (when
    /// `server_default`) NULL, for the statement to fill in the database's
    /// time.
    pub(crate) fn insert(
        sql: &Arc<str>,
        message: &NewMessage,
        server_default: bool,
    ) -> (
        String,
        sqlx::query::Query<'static, B::Db, <B::Db as Database>::Arguments>,
    )
    where
        for<'q> Option<B::Time>: Encode<'q, B::Db>,
    {
        let id = message.resolve_id();
        let now = message.now;
        let available_at = match message.available_at {
            Some(at) => Some(at),
            None if server_default => None,
            None => Some(now),
        };
        let query = sqlx::query(AssertSqlSafe(sql.clone()))
            .bind(id.as_str())
            .bind(message.kind.as_str())
            .bind(message.name.as_str())
            .bind(message.payload.as_str())
            .bind(trace_json(message.trace.as_ref()))
            .bind(i64::from(
                message
                    .max_attempts
                    .unwrap_or(crate::limits::DEFAULT_MAX_ATTEMPTS),
            ))
            .bind(available_at.map(B::Time::store))
            .bind(B::Time::store(now))
            .bind(message.ordering_key.clone())
            .bind(message.idempotency.as_ref().map(|i| i.key.clone()))
            .bind(
                message
                    .idempotency
                    .as_ref()
                    .map(|i| B::Time::store(super::kit::window_end(now, i.window))),
            )
            .bind(message.max_attempts.is_some());
        (id, query)
    }

    /// A page of messages out of up to `limit + 1` rows. A row that does
    /// not decode goes to [`MessagePage::unreadable`] with its raw columns
    /// instead of failing the page. The cursor is the last row's, readable
    /// or not; a last row whose `created_at` or id cannot be read ends the
    /// listing there, since no cursor can point past it.
    pub(crate) fn page(rows: &[<B::Db as Database>::Row], limit: usize) -> Result<MessagePage> {
        let more = rows.len() > limit;
        let mut messages = Vec::new();
        let mut unreadable = Vec::new();
        let mut last = None;
        for row in rows.iter().take(limit) {
            match Self::decode(row).and_then(MessageRow::into_message) {
                Ok(message) => {
                    last = Some(ListCursor {
                        created_at: message.created_at,
                        id: message.id.clone(),
                    });
                    messages.push(message);
                }
                Err(error) => {
                    let row = Self::unreadable(row, error);
                    last = row.created_at.map(|created_at| ListCursor {
                        created_at,
                        id: row.id.clone(),
                    });
                    if row.column("id").is_none() {
                        last = None;
                    }
                    unreadable.push(row);
                }
            }
        }
        let next = if more { last } else { None };
        Ok(MessagePage::new(messages, next).with_unreadable(unreadable))
    }

    /// A row that does not decode, as raw text, with why.
    pub(crate) fn unreadable(row: &<B::Db as Database>::Row, error: Error) -> UnreadableMessage {
        let (id, reason) = match error {
            Error::CorruptRow { id, reason } => (id, reason),
            other => (String::from("<unreadable>"), other.to_string()),
        };
        let created_at = row
            .try_get::<B::Time, _>("created_at")
            .ok()
            .and_then(|stored| stored.load().ok());
        UnreadableMessage::new(id, created_at, reason, B::raw_columns(row))
    }

    /// The fence columns (status, claim token, `locked_until`) of the
    /// messages `ids` names, as they are now, by id, to name why a fenced
    /// write missed. Only on that failure path; a read error, or a row that
    /// cannot be read, leaves the reason unknown (the write already proved
    /// the claim lost).
    pub(crate) async fn fences<T>(
        parts: &SqlParts<B::Db>,
        statement: &Arc<str>,
        ids: T,
    ) -> HashMap<String, Fence>
    where
        T: for<'q> Encode<'q, B::Db> + sqlx::Type<B::Db> + Send + 'static,
    {
        let rows = sqlx::query(AssertSqlSafe(statement.clone()))
            .bind(ids)
            .fetch_all(&parts.pool)
            .await
            .unwrap_or_default();
        rows.iter()
            .filter_map(|row| {
                let id: String = row.try_get(0).ok()?;
                let status: String = row.try_get(1).ok()?;
                let token: Option<String> = row.try_get(2).ok()?;
                let until: Option<B::Time> = row.try_get(3).ok()?;
                let until = match until {
                    Some(stored) => Some(stored.load().ok()?),
                    None => None,
                };
                Some((id, (status, token, until)))
            })
            .collect()
    }

    /// A stored row with its columns decoded, or why it cannot be.
    pub(crate) fn decode(row: &<B::Db as Database>::Row) -> Result<MessageRow> {
        Self::decode_at(row, &ColumnPositions::of(row))
    }

    /// [`SqlOutbox::decode`] with the columns where `at` found them in
    /// another row of the same result (all its rows share one layout).
    pub(crate) fn decode_at(
        row: &<B::Db as Database>::Row,
        at: &ColumnPositions,
    ) -> Result<MessageRow> {
        let id: String = at.get(row, 1).map_err(|e| Error::CorruptRow {
            id: String::from("<unreadable>"),
            reason: e.to_string(),
        })?;
        let corrupt = |e: sqlx::Error| Error::CorruptRow {
            id: id.clone(),
            reason: e.to_string(),
        };
        let off_calendar = |k: usize, e: Error| Error::CorruptRow {
            id: id.clone(),
            reason: format!("{}: {e}", MESSAGE_COLUMNS[k]),
        };
        let time = |k: usize| -> Result<DateTime<Utc>> {
            let stored: B::Time = at.get(row, k).map_err(corrupt)?;
            stored.load().map_err(|e| off_calendar(k, e))
        };
        let optional_time = |k: usize| -> Result<Option<DateTime<Utc>>> {
            let stored: Option<B::Time> = at.get(row, k).map_err(corrupt)?;
            stored
                .map(|stored| stored.load().map_err(|e| off_calendar(k, e)))
                .transpose()
        };
        Ok(MessageRow {
            seq: at.get(row, 0).map_err(corrupt)?,
            kind: at.get(row, 2).map_err(corrupt)?,
            name: at.get(row, 3).map_err(corrupt)?,
            payload: at.get(row, 4).map_err(corrupt)?,
            trace: at.get(row, 5).map_err(corrupt)?,
            status: at.get(row, 6).map_err(corrupt)?,
            attempts: at.get(row, 7).map_err(corrupt)?,
            max_attempts: at.get(row, 8).map_err(corrupt)?,
            available_at: time(9)?,
            claim_token: at.get(row, 10).map_err(corrupt)?,
            claimed_at: optional_time(11)?,
            locked_until: optional_time(12)?,
            last_error: at.get(row, 13).map_err(corrupt)?,
            created_at: time(14)?,
            updated_at: time(15)?,
            delivered_at: optional_time(16)?,
            ordering_key: at.get(row, 17).map_err(corrupt)?,
            skipped_at: optional_time(18)?,
            max_attempts_set: at.get(row, 19).map_err(corrupt)?,
            id: id.clone(),
        })
    }
}

/// The columns of a message row, in the order the stores' statements
/// select them (after any columns of their own, such as a claim's outcome).
pub(crate) const MESSAGE_COLUMNS: [&str; 20] = [
    "seq",
    "id",
    "kind",
    "name",
    "payload",
    "trace",
    "status",
    "attempts",
    "max_attempts",
    "available_at",
    "claim_token",
    "claimed_at",
    "locked_until",
    "last_error",
    "created_at",
    "updated_at",
    "delivered_at",
    "ordering_key",
    "skipped_at",
    "max_attempts_set",
];

/// Where a row holds the [`MESSAGE_COLUMNS`].
///
/// A column read by name is a hashed lookup in the row's column map; read
/// by position it is not, and a claim reads twenty columns of every row it
/// claims. Positions are taken from the column named `seq` when every one of
/// the columns follows it in order, checked by name once per result; a
/// statement that selects them in another order is still read right, by
/// name.
pub(crate) struct ColumnPositions {
    /// The position of `seq`, when the columns follow it in order.
    first: Option<usize>,
}

impl ColumnPositions {
    /// Where `row`, and every row of the same result, holds the columns.
    pub(crate) fn of<R: Row>(row: &R) -> Self {
        let columns = row.columns();
        let first = columns
            .iter()
            .position(|c| c.name() == MESSAGE_COLUMNS[0])
            .filter(|&first| {
                MESSAGE_COLUMNS
                    .iter()
                    .enumerate()
                    .all(|(k, name)| columns.get(first + k).is_some_and(|c| c.name() == *name))
            });
        ColumnPositions { first }
    }

    /// The value of the `k`th of [`MESSAGE_COLUMNS`].
    fn get<'r, R, T>(&self, row: &'r R, k: usize) -> sqlx::Result<T>
    where
        R: Row,
        T: Decode<'r, R::Database> + sqlx::Type<R::Database>,
        usize: ColumnIndex<R>,
        for<'a> &'a str: ColumnIndex<R>,
    {
        let name = MESSAGE_COLUMNS[k];
        match self.first {
            // Named as a read by name names it: an unreadable row's reason
            // says which column to fix.
            Some(first) => row.try_get(first + k).map_err(|e| match e {
                sqlx::Error::ColumnDecode { source, .. } => sqlx::Error::ColumnDecode {
                    index: format!("{name:?}"),
                    source,
                },
                other => other,
            }),
            None => row.try_get(name),
        }
    }
}

/// The answer for each fenced write a statement did not change: why its
/// claim was lost, from the fences read back.
pub(crate) fn lost_claim(row: &FencedWrite, fences: &HashMap<String, Fence>) -> Result<()> {
    let fence = fences.get(&row.id).cloned();
    Err(claim_loss(&row.id, fence, &row.claim_token, row.now).into())
}

/// The public face of a SQL store, written once for both: the
/// [`OutboxStore`](crate::OutboxStore) and [`OutboxAdmin`](crate::OutboxAdmin)
/// impls, the builder's `settlement` setter, `pool`, `table`, and the typed
/// `enqueue_event_in`/`enqueue_job_in`.
///
/// The store is a struct with a field `inner: SqlOutbox<Core>`, and has the
/// inherent methods `enqueue_now` (enqueue through the store's own pool),
/// `subscribe` (its wake-ups) and `enqueue_in`; its `Core` has `claim` and
/// `list`. The builder has a field `settlement`.
macro_rules! sql_store {
    ($store:ident, $builder:ident, $pool:ty, $conn:ty) => {
        impl $builder {
            /// How renewals and settlements are sent; batched by default
            /// ([`SettlementMode::DEFAULT_BATCHED`]).
            pub fn settlement(mut self, mode: $crate::store::sql::SettlementMode) -> $crate::Result<Self> {
                self.settlement = mode.validate()?;
                Ok(self)
            }
        }

        impl $store {
            /// The pool the store uses.
            pub fn pool(&self) -> &$pool {
                &$crate::store::sql::SqlBackend::parts(&*self.inner.core).pool
            }

            /// The table the store uses.
            pub fn table(&self) -> &$crate::store::sql::TableName {
                &$crate::store::sql::SqlBackend::parts(&*self.inner.core).table
            }

            #[doc = concat!("[`", stringify!($store), "::enqueue_in`] for an event of registered type `E`.")]
            pub async fn enqueue_event_in<E: $crate::Event>(
                &self,
                conn: &mut $conn,
                payload: &E,
            ) -> $crate::Result<$crate::Enqueued> {
                self.enqueue_in(conn, $crate::NewMessage::event(payload)?).await
            }

            #[doc = concat!("[`", stringify!($store), "::enqueue_in`] for an event of registered type `E`, with [`EnqueueOptions`](crate::EnqueueOptions).")]
            pub async fn enqueue_event_with<E: $crate::Event>(
                &self,
                conn: &mut $conn,
                payload: &E,
                options: $crate::EnqueueOptions,
            ) -> $crate::Result<$crate::Enqueued> {
                self.enqueue_in(conn, $crate::NewMessage::event(payload)?.with_options(options))
                    .await
            }

            #[doc = concat!("[`", stringify!($store), "::enqueue_in`] for a job of registered type `J`, with [`EnqueueOptions`](crate::EnqueueOptions).")]
            pub async fn enqueue_job_with<J: $crate::Job>(
                &self,
                conn: &mut $conn,
                payload: &J,
                options: $crate::EnqueueOptions,
            ) -> $crate::Result<$crate::Enqueued> {
                self.enqueue_in(conn, $crate::NewMessage::job(payload)?.with_options(options))
                    .await
            }

            #[doc = concat!("[`", stringify!($store), "::enqueue_in`] for a job of registered type `J`.")]
            pub async fn enqueue_job_in<J: $crate::Job>(
                &self,
                conn: &mut $conn,
                payload: &J,
            ) -> $crate::Result<$crate::Enqueued> {
                self.enqueue_in(conn, $crate::NewMessage::job(payload)?).await
            }
        }

        impl $crate::OutboxStore for $store {
            async fn enqueue(&self, message: $crate::NewMessage) -> $crate::Result<$crate::Enqueued> {
                self.enqueue_now(message).await
            }

            async fn claim_batch(
                &self,
                params: $crate::ClaimBatch,
            ) -> $crate::Result<$crate::ClaimedBatch> {
                self.inner.core.claim(params).await
            }

            async fn renew_claim(
                &self,
                params: $crate::RenewClaim,
            ) -> $crate::Result<chrono::DateTime<chrono::Utc>> {
                self.inner.renew_claim(params).await
            }

            async fn mark_delivered(&self, params: $crate::MarkDelivered) -> $crate::Result<()> {
                self.inner.mark_delivered(params).await
            }

            async fn mark_failed(&self, params: $crate::MarkFailed) -> $crate::Result<()> {
                self.inner.mark_failed(params).await
            }

            async fn release_claim(&self, params: $crate::ReleaseClaim) -> $crate::Result<()> {
                self.inner.release_claim(params).await
            }

            fn wakeups(&self) -> Option<$crate::Wakeups> {
                self.subscribe()
            }

            async fn purge_batch(&self, params: $crate::PurgeBatch) -> $crate::Result<u64> {
                self.inner.purge_batch(params).await
            }

            async fn vacuum(&self) -> $crate::Result<()> {
                self.inner.vacuum().await
            }

            /// Counts from the partial indexes of pending rows, never
            /// touching settled ones.
            async fn pending_count(&self) -> $crate::Result<Option<u64>> {
                self.inner.pending_count().await
            }

            async fn warm_up(&self, claims: usize) -> $crate::Result<()> {
                self.inner.core.warm_up(claims).await
            }
        }

        impl $crate::OutboxAdmin for $store {
            async fn stats(
                &self,
                now: chrono::DateTime<chrono::Utc>,
            ) -> $crate::Result<$crate::OutboxStats> {
                self.inner.stats(now).await
            }

            async fn list_messages(
                &self,
                params: $crate::ListMessages,
            ) -> $crate::Result<$crate::MessagePage> {
                self.inner.core.list(params).await
            }

            async fn get_message(&self, id: &str) -> $crate::Result<$crate::OutboxMessage> {
                self.inner.get_message(id).await
            }

            async fn requeue_dead_letters(
                &self,
                params: $crate::RequeueDeadLetters,
            ) -> $crate::Result<u64> {
                self.inner.requeue_dead_letters(params).await
            }

            async fn purge(&self, params: $crate::PurgeMessages) -> $crate::Result<u64> {
                self.inner.purge(params).await
            }

            async fn count_purgeable(&self, params: $crate::PurgeMessages) -> $crate::Result<u64> {
                self.inner.count_purgeable(params).await
            }

            async fn activity(
                &self,
                since: chrono::DateTime<chrono::Utc>,
            ) -> $crate::Result<Vec<$crate::MinuteActivity>> {
                self.inner.core.activity(since).await
            }

            async fn retry_now(&self, params: $crate::RetryNow) -> $crate::Result<()> {
                self.inner
                    .retry_now(self.inner.core.retry_statement(), &params.id, params.now)
                    .await
            }

            async fn skip_dead_letter(&self, params: $crate::SkipDeadLetter) -> $crate::Result<()> {
                self.inner.skip_dead_letter(params).await
            }

            async fn blocked_keys(&self, limit: usize) -> $crate::Result<Vec<$crate::BlockedKey>> {
                self.inner.blocked_keys(limit).await
            }
        }
    };
}
pub(crate) use sql_store;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_and_qualified_names() {
        let plain = TableName::parse("outbox_2").unwrap();
        assert_eq!(plain.quoted(), "\"outbox_2\"");
        assert_eq!(plain.schema(), None);
        let qualified = TableName::parse("_app.Events").unwrap();
        assert_eq!(qualified.quoted(), "\"_app\".\"Events\"");
        assert_eq!(qualified.to_string(), "_app.Events");
        assert!(TableName::default().is_default());
    }

    #[test]
    fn refuses_anything_else() {
        let long = "a".repeat(MAX_TABLE_NAME_PART + 1);
        for bad in [
            "",
            "x; drop table y",
            "a.b.c",
            "\"quoted\"",
            "`tick`",
            "1st",
            "s.",
            ".t",
            "with space",
            "dash-ed",
            "ünicode",
            long.as_str(),
        ] {
            match TableName::parse(bad) {
                Err(Error::InvalidTableName { name, .. }) => assert_eq!(name, bad),
                other => panic!("{bad:?} gave {other:?}"),
            }
        }
    }

    #[test]
    fn rendering_the_default_table_changes_nothing() {
        let sql = "CREATE TABLE \"outbox\" (id text);\n\
                   CREATE INDEX \"outbox_pending\" ON \"outbox\" (id);";
        for dialect in [Dialect::Sqlite, Dialect::Postgres] {
            assert_eq!(render_migration(sql, &TableName::default(), dialect), sql);
        }
    }

    #[test]
    fn rendering_rewrites_only_outbox_identifiers() {
        let sql = "CREATE TABLE IF NOT EXISTS \"outbox\" (id text, note text DEFAULT 'outbox');\n\
                   CREATE INDEX IF NOT EXISTS \"outbox_pending\" ON \"outbox\" (id);\n\
                   SELECT \"outboxed\" FROM \"outbox\";";
        let table = TableName::parse("app.jobs").unwrap();
        assert_eq!(
            render_migration(sql, &table, Dialect::Sqlite),
            "CREATE TABLE IF NOT EXISTS \"app\".\"jobs\" (id text, note text DEFAULT 'outbox');\n\
             CREATE INDEX IF NOT EXISTS \"app\".\"jobs_pending\" ON \"jobs\" (id);\n\
             SELECT \"outboxed\" FROM \"app\".\"jobs\";"
        );
        assert_eq!(
            render_migration(sql, &table, Dialect::Postgres),
            "CREATE TABLE IF NOT EXISTS \"app\".\"jobs\" (id text, note text DEFAULT 'outbox');\n\
             CREATE INDEX IF NOT EXISTS \"jobs_pending\" ON \"app\".\"jobs\" (id);\n\
             SELECT \"outboxed\" FROM \"app\".\"jobs\";"
        );
    }

    #[test]
    fn postgres_qualifies_every_derived_name_but_an_index() {
        let sql = "CREATE TABLE \"outbox_drains\" (id int);\n\
                   CREATE INDEX \"outbox_at\"\n  ON \"outbox\" (id);\n\
                   SELECT \"outbox_wake\"('c'), '\"outbox_drains\"'::regclass;";
        let table = TableName::parse("app.jobs").unwrap();
        assert_eq!(
            render_migration(sql, &table, Dialect::Postgres),
            "CREATE TABLE \"app\".\"jobs_drains\" (id int);\n\
             CREATE INDEX \"jobs_at\"\n  ON \"app\".\"jobs\" (id);\n\
             SELECT \"app\".\"jobs_wake\"('c'), '\"app\".\"jobs_drains\"'::regclass;"
        );
    }
}
