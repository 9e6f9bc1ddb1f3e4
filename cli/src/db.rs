//! Opening the store a URL names, and the few questions about the schema
//! that the store port does not answer (does the table exist, which
//! migrations are applied).

use chrono::{DateTime, Utc};
use outbox::TableName;
use outbox::kit::redact_url;
use outbox::{
    BlockedKey, ListMessages, MessagePage, MinuteActivity, OutboxAdmin, OutboxMessage, OutboxStats,
    PostgresOutbox, PurgeMessages, RequeueDeadLetters, Result, RetryNow, SkipDeadLetter,
    SqliteOutbox,
};
use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::SqlitePoolOptions;
use sqlx::{AssertSqlSafe, Row};

use crate::fail::Failure;

/// The two stores the command line speaks to, picked by URL scheme.
#[derive(Clone)]
pub(crate) enum Store {
    Sqlite(SqliteOutbox),
    Postgres(PostgresOutbox),
}

/// What a command does to the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// Creates the file and the table (`migrate`).
    Create,
    /// Changes messages in an existing outbox (`requeue`, `purge`, `drain`).
    Write,
    /// Only reads (`status`, `list`, `show`): a SQLite file is opened
    /// read-only, so it is never created or changed.
    Read,
}

/// The backend a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Sqlite,
    Postgres,
}

fn backend(url: &str) -> Result<Backend, Failure> {
    let scheme = url.split_once(':').map(|(scheme, _)| scheme);
    match scheme.map(str::to_ascii_lowercase).as_deref() {
        Some("sqlite") => Ok(Backend::Sqlite),
        Some("postgres" | "postgresql") => Ok(Backend::Postgres),
        Some(other) if !other.is_empty() => Err(Failure::usage(format!(
            "unsupported database URL scheme `{other}`"
        ))
        .hint("use sqlite://PATH or postgres://USER:PASSWORD@HOST/DB")),
        _ => Err(Failure::usage("the database URL has no scheme").hint(
            "use sqlite://PATH (for example sqlite://app.db) or postgres://USER:PASSWORD@HOST/DB",
        )),
    }
}

impl Store {
    /// Open the outbox `table` in the database at `url`, for `access`.
    pub(crate) async fn open(url: &str, table: &str, access: Access) -> Result<Store, Failure> {
        let backend = backend(url)?;
        // Validate the name before connecting: a bad one is a usage error.
        TableName::parse(table).map_err(Failure::from)?;
        match backend {
            Backend::Sqlite => {
                let options = match access {
                    Access::Create => SqliteOutbox::connect_options(url)?,
                    // Not the store's WAL switch: a file that turns out not
                    // to be an outbox is left as it was. setup() put every
                    // outbox file in WAL mode once, for good.
                    Access::Write => SqliteOutbox::read_only_options(url)?.read_only(false),
                    Access::Read => SqliteOutbox::read_only_options(url)?,
                };
                let pool = SqlitePoolOptions::new()
                    .connect_with(options)
                    .await
                    .map_err(|e| {
                        let failure = Failure::operational(format!(
                            "cannot open the database {}: {e}",
                            redact_url(url)
                        ));
                        if access == Access::Create {
                            failure.hint("check that the file's directory exists and is writable")
                        } else {
                            failure.hint(
                                "check the path; to create a new outbox database, run \
                                 `outbox migrate` first",
                            )
                        }
                    })?;
                let store = SqliteOutbox::builder(pool).table(table)?.build();
                Ok(Store::Sqlite(store))
            }
            Backend::Postgres => {
                let pool = PgPoolOptions::new()
                    .max_connections(4)
                    .acquire_timeout(PostgresOutbox::DEFAULT_CONNECT_TIMEOUT);
                let pool = PostgresOutbox::connect_pool(url, pool).await?;
                let store = PostgresOutbox::builder(pool).table(table)?.build();
                Ok(Store::Postgres(store))
            }
        }
    }

    /// Close the pool: wait for every connection to be returned, and close them.
    pub(crate) async fn close(&self) {
        match self {
            Store::Sqlite(store) => store.pool().close().await,
            Store::Postgres(store) => store.pool().close().await,
        }
    }

    /// The table's validated name.
    pub(crate) fn table(&self) -> &TableName {
        match self {
            Store::Sqlite(store) => store.table(),
            Store::Postgres(store) => store.table(),
        }
    }

    /// Fail with what to do when the table is missing, before a command
    /// would fail on it with a database error.
    pub(crate) async fn require_table(&self) -> Result<(), Failure> {
        let table = self.table();
        if self.exists(table.schema(), table.table()).await? {
            return Ok(());
        }
        Err(
            Failure::operational(format!("the outbox table `{table}` does not exist")).hint(
                format!(
                    "create it with `outbox --table {table} migrate`, or pass the --table \
                     your application uses"
                ),
            ),
        )
    }

    /// Whether `schema.name` (or `name`) is a table in this database.
    async fn exists(&self, schema: Option<&str>, name: &str) -> Result<bool, Failure> {
        let failed = |e: sqlx::Error| Failure::from(outbox::Error::store("inspect schema", e));
        match self {
            Store::Sqlite(store) => {
                // Both parts are validated identifiers, so quoting them is enough.
                let master = format!(
                    "SELECT 1 FROM \"{}\".sqlite_master WHERE type = 'table' AND name = ?1",
                    schema.unwrap_or("main")
                );
                let row = sqlx::query(AssertSqlSafe(master))
                    .bind(name)
                    .fetch_optional(store.pool())
                    .await
                    .map_err(failed)?;
                Ok(row.is_some())
            }
            Store::Postgres(store) => {
                let quoted = match schema {
                    Some(schema) => format!("\"{schema}\".\"{name}\""),
                    None => format!("\"{name}\""),
                };
                let row = sqlx::query("SELECT to_regclass($1) IS NOT NULL")
                    .bind(quoted)
                    .fetch_one(store.pool())
                    .await
                    .map_err(failed)?;
                row.try_get(0).map_err(failed)
            }
        }
    }

    /// Whether the table exists.
    pub(crate) async fn table_exists(&self) -> Result<bool, Failure> {
        let table = self.table();
        self.exists(table.schema(), table.table()).await
    }

    /// The migration versions applied to this table, oldest first; empty when
    /// none ever ran. `setup` tracks them in `"<table>_migrations"`, in the
    /// table's schema.
    pub(crate) async fn applied_migrations(&self) -> Result<Vec<i64>, Failure> {
        let table = self.table();
        let tracker = format!("{}_migrations", table.table());
        if !self.exists(table.schema(), &tracker).await? {
            return Ok(Vec::new());
        }
        let quoted = match table.schema() {
            Some(schema) => format!("\"{schema}\".\"{tracker}\""),
            None => format!("\"{tracker}\""),
        };
        let query = format!("SELECT version FROM {quoted} WHERE success ORDER BY version");
        let failed = |e: sqlx::Error| Failure::from(outbox::Error::store("inspect migrations", e));
        let rows = match self {
            Store::Sqlite(store) => sqlx::query(AssertSqlSafe(query))
                .fetch_all(store.pool())
                .await
                .map_err(failed)?
                .iter()
                .map(|row| row.try_get::<i64, _>(0))
                .collect::<Result<Vec<_>, _>>(),
            Store::Postgres(store) => sqlx::query(AssertSqlSafe(query))
                .fetch_all(store.pool())
                .await
                .map_err(failed)?
                .iter()
                .map(|row| row.try_get::<i64, _>(0))
                .collect::<Result<Vec<_>, _>>(),
        };
        rows.map_err(failed)
    }

    /// The migrations this version ships: version and description.
    pub(crate) fn known_migrations(&self) -> Vec<(i64, String)> {
        let migrator = match self {
            Store::Sqlite(store) => store.migrator(),
            Store::Postgres(store) => store.migrator(),
        };
        migrator
            .iter()
            .map(|m| (m.version, m.description.to_string()))
            .collect()
    }

    /// Create or upgrade the table.
    pub(crate) async fn setup(&self) -> Result<()> {
        match self {
            Store::Sqlite(store) => store.setup().await,
            Store::Postgres(store) => store.setup().await,
        }
    }
}

impl OutboxAdmin for Store {
    async fn stats(&self, now: DateTime<Utc>) -> Result<OutboxStats> {
        match self {
            Store::Sqlite(store) => store.stats(now).await,
            Store::Postgres(store) => store.stats(now).await,
        }
    }

    async fn list_messages(&self, params: ListMessages) -> Result<MessagePage> {
        match self {
            Store::Sqlite(store) => store.list_messages(params).await,
            Store::Postgres(store) => store.list_messages(params).await,
        }
    }

    async fn get_message(&self, id: &str) -> Result<OutboxMessage> {
        match self {
            Store::Sqlite(store) => store.get_message(id).await,
            Store::Postgres(store) => store.get_message(id).await,
        }
    }

    async fn requeue_dead_letters(&self, params: RequeueDeadLetters) -> Result<u64> {
        match self {
            Store::Sqlite(store) => store.requeue_dead_letters(params).await,
            Store::Postgres(store) => store.requeue_dead_letters(params).await,
        }
    }

    async fn purge(&self, params: PurgeMessages) -> Result<u64> {
        match self {
            Store::Sqlite(store) => store.purge(params).await,
            Store::Postgres(store) => store.purge(params).await,
        }
    }
    async fn count_purgeable(&self, params: PurgeMessages) -> Result<u64> {
        match self {
            Store::Sqlite(store) => store.count_purgeable(params).await,
            Store::Postgres(store) => store.count_purgeable(params).await,
        }
    }

    async fn activity(&self, since: DateTime<Utc>) -> Result<Vec<MinuteActivity>> {
        match self {
            Store::Sqlite(store) => store.activity(since).await,
            Store::Postgres(store) => store.activity(since).await,
        }
    }

    async fn retry_now(&self, params: RetryNow) -> Result<()> {
        match self {
            Store::Sqlite(store) => store.retry_now(params).await,
            Store::Postgres(store) => store.retry_now(params).await,
        }
    }

    async fn skip_dead_letter(&self, params: SkipDeadLetter) -> Result<()> {
        match self {
            Store::Sqlite(store) => store.skip_dead_letter(params).await,
            Store::Postgres(store) => store.skip_dead_letter(params).await,
        }
    }

    async fn blocked_keys(&self, limit: usize) -> Result<Vec<BlockedKey>> {
        match self {
            Store::Sqlite(store) => store.blocked_keys(limit).await,
            Store::Postgres(store) => store.blocked_keys(limit).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scheme_picks_the_store() {
        assert_eq!(backend("sqlite://app.db").unwrap(), Backend::Sqlite);
        assert_eq!(backend("sqlite::memory:").unwrap(), Backend::Sqlite);
        assert_eq!(backend("postgres://u@h/db").unwrap(), Backend::Postgres);
        assert_eq!(backend("PostgreSQL://u@h/db").unwrap(), Backend::Postgres);
        assert!(backend("mysql://u@h/db").is_err());
        assert!(backend("app.db").is_err());
    }
}
