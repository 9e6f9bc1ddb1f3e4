//! The inbox in a PostgreSQL database.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnection, PgPool};
use sqlx::{AssertSqlSafe, Postgres};

use super::statements::{Statements, inbox_table};
use super::{InboxStore, PurgeInbox, Recorded, check_purge, check_record, system_clock};
use crate::clock::SharedClock;
use crate::error::Result;
use crate::store::postgres::PostgresOutbox;
use crate::store::sql::{TableName, db};

/// The inbox of a PostgreSQL outbox table: `"<table>_inbox"` in the table's
/// schema, created by the outbox's migrations. Cheap to clone.
///
/// Two copies of one message recorded at once by two transactions do not
/// both go through: the second waits for the first to commit or roll back,
/// then answers [`Recorded::AlreadyProcessed`] or records it itself.
///
/// ```no_run
/// use outbox::{PostgresInbox, Recorded};
///
/// # async fn consume(pool: sqlx::PgPool, message_id: &str) -> Result<(), Box<dyn std::error::Error>> {
/// let inbox = PostgresInbox::new(pool);
/// inbox.setup().await?;
///
/// let mut tx = inbox.pool().begin().await?;
/// if inbox.record_in(&mut tx, "shipping", message_id).await? == Recorded::New {
///     sqlx::query("INSERT INTO shipments (message_id) VALUES ($1)")
///         .bind(message_id)
///         .execute(&mut *tx)
///         .await?;
/// }
/// tx.commit().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct PostgresInbox {
    pool: PgPool,
    table: TableName,
    sql: Arc<Statements>,
    clock: SharedClock,
}

impl std::fmt::Debug for PostgresInbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresInbox")
            .field("table", &inbox_table(&self.table))
            .finish_non_exhaustive()
    }
}

/// Settings for a [`PostgresInbox`]; start with [`PostgresInbox::builder`].
#[derive(Debug, Clone)]
pub struct PostgresInboxBuilder {
    pool: PgPool,
    table: TableName,
    clock: SharedClock,
}

impl PostgresInboxBuilder {
    /// The outbox table the inbox belongs to (`table` or `schema.table`);
    /// the inbox is `"<table>_inbox"` in the same schema. `outbox` by
    /// default.
    pub fn table(mut self, name: &str) -> Result<Self> {
        self.table = TableName::parse(name)?;
        Ok(self)
    }

    /// The clock records are stamped with and retention measures from;
    /// the system's by default (the application's, not the server's, so
    /// retention can be tested on a clock of the test's own).
    pub fn clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// The inbox. Call [`PostgresInbox::setup`] once before using a new
    /// database.
    pub fn build(self) -> PostgresInbox {
        PostgresInbox {
            sql: Arc::new(Statements::postgres(&self.table)),
            pool: self.pool,
            table: self.table,
            clock: self.clock,
        }
    }

    fn with_table(mut self, table: TableName) -> Self {
        self.table = table;
        self
    }
}

impl PostgresInbox {
    /// The inbox of the default outbox table on `pool`.
    pub fn new(pool: PgPool) -> Self {
        Self::builder(pool).build()
    }

    /// Settings for an inbox on `pool`.
    pub fn builder(pool: PgPool) -> PostgresInboxBuilder {
        PostgresInboxBuilder {
            pool,
            table: TableName::default(),
            clock: system_clock(),
        }
    }

    /// Create or upgrade the outbox table and its inbox: the outbox's
    /// migrations, tracked per table. Safe to run any number of times.
    pub async fn setup(&self) -> Result<()> {
        PostgresOutbox::builder(self.pool.clone())
            .table(&self.table.to_string())?
            .build()
            .setup()
            .await
    }

    /// The pool, to begin the transactions records go in.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The outbox table this inbox belongs to.
    pub fn outbox_table(&self) -> &TableName {
        &self.table
    }

    /// The inbox table, quoted as SQL: `"<table>_inbox"`, qualified when
    /// the outbox table is.
    pub fn inbox_table(&self) -> String {
        inbox_table(&self.table)
    }

    /// Record that `consumer` processed `message_id`, on the caller's
    /// connection: inside the caller's transaction (`&mut tx`), rolled
    /// back with it. [`Recorded::AlreadyProcessed`] when a committed
    /// transaction recorded it before: the insert is `ON CONFLICT DO
    /// NOTHING`, so no error is raised and the transaction goes on. See
    /// [`InboxStore::record_in`] for what is refused.
    pub async fn record_in(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        message_id: &str,
    ) -> Result<Recorded> {
        check_record(consumer, message_id)?;
        let inserted: Option<bool> = sqlx::query_scalar(AssertSqlSafe(self.sql.record.clone()))
            .bind(consumer)
            .bind(message_id)
            .bind(self.clock.now())
            .fetch_optional(conn)
            .await
            .map_err(db("inbox record"))?;
        Ok(match inserted {
            Some(_) => Recorded::New,
            None => Recorded::AlreadyProcessed,
        })
    }

    /// Whether `consumer` has a committed record of `message_id`.
    pub async fn is_processed(&self, consumer: &str, message_id: &str) -> Result<bool> {
        check_record(consumer, message_id)?;
        sqlx::query_scalar(AssertSqlSafe(self.sql.processed.clone()))
            .bind(consumer)
            .bind(message_id)
            .fetch_one(&self.pool)
            .await
            .map_err(db("inbox lookup"))
    }

    /// Delete one batch of a consumer's rows recorded before the horizon;
    /// returns how many went. Rows a transaction holds are skipped.
    pub async fn purge_batch(&self, params: PurgeInbox) -> Result<u64> {
        check_purge(&params)?;
        let done = sqlx::query(AssertSqlSafe(self.sql.purge.clone()))
            .bind(&params.consumer)
            .bind(params.older_than)
            .bind(params.limit as i64)
            .execute(&self.pool)
            .await
            .map_err(db("inbox purge"))?;
        Ok(done.rows_affected())
    }
}

impl PostgresOutbox {
    /// The inbox beside this outbox's table, on the same pool: for a
    /// service that both consumes relayed messages and enqueues its own.
    pub fn inbox(&self) -> PostgresInbox {
        PostgresInbox::builder(self.pool().clone())
            .with_table(self.table().clone())
            .build()
    }
}

impl InboxStore for PostgresInbox {
    type Database = Postgres;

    async fn begin(&self) -> Result<sqlx::Transaction<'static, Postgres>> {
        self.pool.begin().await.map_err(db("inbox begin"))
    }

    fn record_in<'a>(
        &'a self,
        conn: &'a mut PgConnection,
        consumer: &'a str,
        message_id: &'a str,
    ) -> impl Future<Output = Result<Recorded>> + Send + 'a {
        PostgresInbox::record_in(self, conn, consumer, message_id)
    }

    fn is_processed(
        &self,
        consumer: &str,
        message_id: &str,
    ) -> impl Future<Output = Result<bool>> + Send {
        PostgresInbox::is_processed(self, consumer, message_id)
    }

    fn purge_batch(&self, params: PurgeInbox) -> impl Future<Output = Result<u64>> + Send {
        PostgresInbox::purge_batch(self, params)
    }

    fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }
}
