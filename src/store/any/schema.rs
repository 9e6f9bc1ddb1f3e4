//! What an [`AnyOutbox`] can tell about its table before it is used: whether
//! it exists, which migrations this version ships, which of them ran. The
//! store port does not ask; a tool that sets up or inspects a database does,
//! to say what it did or what is missing instead of failing on a query.

use sqlx::AssertSqlSafe;

use super::AnyOutbox;
use crate::error::{Error, Result};

impl AnyOutbox {
    /// The migrations of this outbox's table, tracked in
    /// `"<table>_migrations"` (in the table's schema);
    /// [`AnyOutbox::setup`] runs them. Its `iter()` lists each version with
    /// its description, for saying what a run applied.
    pub fn migrator(&self) -> sqlx::migrate::Migrator {
        on_backend!(self, AnyOutbox, |store| store.migrator())
    }

    /// Whether the outbox's table exists (it may still lack migrations; see
    /// [`AnyOutbox::applied_migrations`]). Asks the database's catalog, so
    /// it works on a database opened with
    /// [`OpenMode::ReadOnly`](crate::OpenMode::ReadOnly) and never fails
    /// for want of the table.
    pub async fn table_exists(&self) -> Result<bool> {
        let table = self.table();
        self.relation_exists(table.schema(), table.table()).await
    }

    /// The versions of the table's migrations that ran, oldest first; empty
    /// when none ever did (no table, or one set up by other means). Compare
    /// them with [`AnyOutbox::migrator`] to see what
    /// [`AnyOutbox::setup`] would apply.
    pub async fn applied_migrations(&self) -> Result<Vec<i64>> {
        let table = self.table();
        let tracker = format!("{}_migrations", table.table());
        if !self.relation_exists(table.schema(), &tracker).await? {
            return Ok(Vec::new());
        }
        // The name derives from a validated one: quoting it is enough.
        let query = format!(
            "SELECT version FROM {} WHERE success ORDER BY version",
            table.derived("migrations", true)
        );
        let failed = |e: sqlx::Error| Error::store("inspect migrations", e);
        on_backend!(self, AnyOutbox, |store| {
            sqlx::query_scalar(AssertSqlSafe(query))
                .fetch_all(store.pool())
                .await
                .map_err(failed)
        })
    }

    /// Whether `schema.name` (or `name`, in the default schema) is a table
    /// (on PostgreSQL, any relation: a view of that name counts).
    async fn relation_exists(&self, schema: Option<&str>, name: &str) -> Result<bool> {
        let failed = |e: sqlx::Error| Error::store("inspect schema", e);
        match self {
            #[cfg(feature = "sqlite")]
            AnyOutbox::Sqlite(store) => {
                // A schema on SQLite is an attached database, each with its
                // own catalog; both parts are validated identifiers.
                let catalog = format!(
                    "SELECT 1 FROM \"{}\".sqlite_master WHERE type = 'table' AND name = ?1",
                    schema.unwrap_or("main")
                );
                let found: Option<i64> = sqlx::query_scalar(AssertSqlSafe(catalog))
                    .bind(name)
                    .fetch_optional(store.pool())
                    .await
                    .map_err(failed)?;
                Ok(found.is_some())
            }
            #[cfg(feature = "postgres")]
            AnyOutbox::Postgres(store) => {
                let quoted = match schema {
                    Some(schema) => format!("\"{schema}\".\"{name}\""),
                    None => format!("\"{name}\""),
                };
                sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
                    .bind(quoted)
                    .fetch_one(store.pool())
                    .await
                    .map_err(failed)
            }
        }
    }
}
