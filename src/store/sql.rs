//! What the SQL stores share: the validated table name, migrations rendered
//! for it, settlement modes, and turning rows back into messages.
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

use std::fmt;

use chrono::{DateTime, Utc};

use crate::error::{AdminError, ClaimError, ClaimLoss, Error, Result};
use crate::message::{
    ClaimedMessage, ErrorRecord, MessageKind, MessageStatus, OutboxMessage, Payload, TraceCarrier,
};

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
/// use outbox::store::sql::TableName;
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
            inner
                .strip_prefix('_')
                .map(|suffix| table.derived(suffix, matches!(dialect, Dialect::Sqlite)))
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
    pub(crate) available_at: DateTime<Utc>,
    pub(crate) claim_token: Option<String>,
    pub(crate) claimed_at: Option<DateTime<Utc>>,
    pub(crate) locked_until: Option<DateTime<Utc>>,
    pub(crate) last_error: Option<String>,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) updated_at: DateTime<Utc>,
    pub(crate) delivered_at: Option<DateTime<Utc>>,
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
    pub(crate) fn into_message(self) -> Result<OutboxMessage> {
        let kind: MessageKind = self
            .kind
            .parse()
            .map_err(|_| self.corrupt(format!("kind is {:?}", self.kind)))?;
        let status: MessageStatus = self
            .status
            .parse()
            .map_err(|_| self.corrupt(format!("status is {:?}", self.status)))?;
        let payload = Payload::from_json(self.payload.clone())
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
            available_at: self.available_at,
            claim_token: self.claim_token,
            claimed_at: self.claimed_at,
            locked_until: self.locked_until,
            last_error: self.last_error.as_deref().map(ErrorRecord::from_json),
            created_at: self.created_at,
            updated_at: self.updated_at,
            delivered_at: self.delivered_at,
        })
    }
}

/// A just-claimed message as a delivery sees it.
pub(crate) fn claimed_view(message: OutboxMessage) -> Result<ClaimedMessage> {
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
        max_attempts: message.max_attempts,
        available_at: message.available_at,
        created_at: message.created_at,
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

/// Why a requeue matched nothing, from the message's status and lease as
/// read afterwards.
pub(crate) fn requeue_refusal(
    id: &str,
    status: MessageStatus,
    locked_until: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Error {
    match locked_until {
        Some(locked_until) if status == MessageStatus::Claimed && locked_until > now => {
            AdminError::ClaimLive {
                id: id.to_owned(),
                locked_until,
            }
            .into()
        }
        // A dead letter that the update missed was requeued in between.
        _ => AdminError::NotDeadLettered {
            id: id.to_owned(),
            status,
        }
        .into(),
    }
}

/// Map a database error of `operation` to the store's transient error.
pub(crate) fn db(operation: &'static str) -> impl FnOnce(sqlx::Error) -> Error {
    move |e| Error::store(operation, e)
}

/// A JSON text column for an optional trace carrier.
pub(crate) fn trace_json(trace: Option<&TraceCarrier>) -> Option<String> {
    trace.map(|t| serde_json::to_string(t).expect("a trace carrier serializes"))
}

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
}
