//! The inbox in a SQLite database.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use sqlx::sqlite::{SqliteConnection, SqlitePool};
use sqlx::{AssertSqlSafe, Sqlite};

use super::statements::{Statements, inbox_table};
use super::{InboxStore, PurgeInbox, Recorded, check_purge, check_record, system_clock};
use crate::clock::SharedClock;
use crate::error::{Error, Result};
use crate::store::sql::{TableName, db};
use crate::store::sqlite::SqliteOutbox;

/// The inbox of a SQLite outbox table: `"<table>_inbox"`, created by the
/// outbox's migrations. Cheap to clone.
///
/// ```
/// use outbox::{Recorded, SqliteInbox};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> outbox::Result<()> {
/// let inbox = SqliteInbox::connect("sqlite::memory:").await?;
/// sqlx::query("CREATE TABLE shipments (order_id INTEGER)").execute(inbox.pool()).await.unwrap();
///
/// for _copy in 0..2 {
///     let mut tx = inbox.pool().begin().await.unwrap();
///     if inbox.record_in(&mut tx, "shipping", "msg-7").await? == Recorded::New {
///         sqlx::query("INSERT INTO shipments VALUES (7)").execute(&mut *tx).await.unwrap();
///     }
///     tx.commit().await.unwrap();
/// }
///
/// let shipped: i64 = sqlx::query_scalar("SELECT count(*) FROM shipments")
///     .fetch_one(inbox.pool()).await.unwrap();
/// assert_eq!(shipped, 1);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct SqliteInbox {
    pool: SqlitePool,
    table: TableName,
    sql: Arc<Statements>,
    clock: SharedClock,
}

impl std::fmt::Debug for SqliteInbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteInbox")
            .field("table", &inbox_table(&self.table))
            .finish_non_exhaustive()
    }
}

/// Settings for a [`SqliteInbox`]; start with [`SqliteInbox::builder`].
#[derive(Debug, Clone)]
pub struct SqliteInboxBuilder {
    pool: SqlitePool,
    table: TableName,
    clock: SharedClock,
}

impl SqliteInboxBuilder {
    /// The outbox table the inbox belongs to (`table` or `schema.table`);
    /// the inbox is `"<table>_inbox"`. `outbox` by default.
    pub fn table(mut self, name: &str) -> Result<Self> {
        let table = TableName::parse(name)?;
        if table.table().to_ascii_lowercase().starts_with("sqlite_") {
            return Err(Error::InvalidTableName {
                name: name.to_owned(),
                reason: "SQLite reserves names starting with `sqlite_`",
            });
        }
        self.table = table;
        Ok(self)
    }

    /// The clock records are stamped with and retention measures from;
    /// the system's by default.
    pub fn clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// The inbox. Call [`SqliteInbox::setup`] once before using a new
    /// database.
    pub fn build(self) -> SqliteInbox {
        SqliteInbox {
            sql: Arc::new(Statements::sqlite(&self.table)),
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

impl SqliteInbox {
    /// The inbox of the default outbox table on `pool`.
    pub fn new(pool: SqlitePool) -> Self {
        Self::builder(pool).build()
    }

    /// Settings for an inbox on `pool`.
    pub fn builder(pool: SqlitePool) -> SqliteInboxBuilder {
        SqliteInboxBuilder {
            pool,
            table: TableName::default(),
            clock: system_clock(),
        }
    }

    /// Open (creating it if missing) the database at `url` as
    /// [`SqliteOutbox::connect`] does, and set up the default tables.
    pub async fn connect(url: &str) -> Result<Self> {
        let outbox = SqliteOutbox::connect(url).await?;
        Ok(Self::new(outbox.pool().clone()))
    }

    /// Create or upgrade the outbox table and its inbox: the outbox's
    /// migrations, tracked per table. Safe to run any number of times.
    pub async fn setup(&self) -> Result<()> {
        SqliteOutbox::builder(self.pool.clone())
            .table(&self.table.to_string())?
            .build()
            .setup()
            .await
    }

    /// The pool, to begin the transactions records go in.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The outbox table this inbox belongs to.
    pub fn outbox_table(&self) -> &TableName {
        &self.table
    }

    /// The inbox table, quoted as SQL: `"<table>_inbox"`.
    pub fn inbox_table(&self) -> String {
        inbox_table(&self.table)
    }

    /// Record that `consumer` processed `message_id`, on the caller's
    /// connection: inside the caller's transaction (`&mut tx`), rolled
    /// back with it. [`Recorded::AlreadyProcessed`] when a committed
    /// transaction recorded it before; the statement is then a no-op and
    /// the transaction goes on. See [`InboxStore::record_in`] for what is
    /// refused.
    pub async fn record_in(
        &self,
        conn: &mut SqliteConnection,
        consumer: &str,
        message_id: &str,
    ) -> Result<Recorded> {
        check_record(consumer, message_id)?;
        let done = sqlx::query(AssertSqlSafe(self.sql.record.clone()))
            .bind(consumer)
            .bind(message_id)
            .bind(self.clock.now().timestamp_micros())
            .execute(conn)
            .await
            .map_err(db("inbox record"))?;
        Ok(if done.rows_affected() > 0 {
            Recorded::New
        } else {
            Recorded::AlreadyProcessed
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
    /// returns how many went.
    pub async fn purge_batch(&self, params: PurgeInbox) -> Result<u64> {
        check_purge(&params)?;
        let done = sqlx::query(AssertSqlSafe(self.sql.purge.clone()))
            .bind(&params.consumer)
            .bind(params.older_than.timestamp_micros())
            .bind(params.limit as i64)
            .execute(&self.pool)
            .await
            .map_err(db("inbox purge"))?;
        Ok(done.rows_affected())
    }
}

impl SqliteOutbox {
    /// The inbox beside this outbox's table, on the same pool: for a
    /// service that both consumes relayed messages and enqueues its own.
    pub fn inbox(&self) -> SqliteInbox {
        SqliteInbox::builder(self.pool().clone())
            .with_table(self.table().clone())
            .build()
    }
}

impl InboxStore for SqliteInbox {
    type Database = Sqlite;

    async fn begin(&self) -> Result<sqlx::Transaction<'static, Sqlite>> {
        self.pool.begin().await.map_err(db("inbox begin"))
    }

    fn record_in<'a>(
        &'a self,
        conn: &'a mut SqliteConnection,
        consumer: &'a str,
        message_id: &'a str,
    ) -> impl Future<Output = Result<Recorded>> + Send + 'a {
        SqliteInbox::record_in(self, conn, consumer, message_id)
    }

    fn is_processed(
        &self,
        consumer: &str,
        message_id: &str,
    ) -> impl Future<Output = Result<bool>> + Send {
        SqliteInbox::is_processed(self, consumer, message_id)
    }

    fn purge_batch(&self, params: PurgeInbox) -> impl Future<Output = Result<u64>> + Send {
        SqliteInbox::purge_batch(self, params)
    }

    fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }
}
