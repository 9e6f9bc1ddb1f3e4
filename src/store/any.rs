//! One store type for both SQL databases, picked by URL at start-up.
//!
//! An application that runs on SQLite in development and PostgreSQL in
//! production holds an [`AnyOutbox`], begins an [`AnyTransaction`] from it,
//! writes its own rows in that transaction (through [`SqlValue`] binds and
//! `$1, $2, …` placeholders, which both databases read, or through the
//! backend's own connection), and enqueues in the same transaction. Every
//! call delegates to [`SqliteOutbox`](crate::SqliteOutbox) or
//! [`PostgresOutbox`](crate::PostgresOutbox) unchanged: a [`NewMessage`]
//! reaches the backend's `enqueue_in` exactly as given.
//!
//! The enum has one variant per enabled store feature, so a build with only
//! `sqlite` carries no PostgreSQL code, and the reverse.
//!
//! Two child modules add what a tool that inspects an outbox needs, beside
//! an application: `open` opens a given table without setting it up, and
//! read-only on SQLite ([`AnyOutboxOptions`]); `schema` answers whether the
//! table exists and which of its migrations ran.

use chrono::{DateTime, Utc};

use super::connect;
use super::kit::redact_url;
use crate::database::DatabaseKind;
use crate::error::{Error, Result, UrlError};
use crate::message::{Enqueued, NewMessage, OutboxMessage};
use crate::payload::{Event, Job};
#[cfg(feature = "postgres")]
use crate::store::postgres::PostgresOutbox;
use crate::store::schedules::{ScheduleState, ScheduleStore};
use crate::store::sql::TableName;
#[cfg(feature = "sqlite")]
use crate::store::sqlite::SqliteOutbox;
use crate::store::{
    BlockedKey, CancelMessages, CancelReport, ClaimBatch, ClaimedBatch, Lease, ListMessages,
    MarkDelivered, MarkFailed, MessagePage, MinuteActivity, OutboxAdmin, OutboxStats, OutboxStore,
    PauseQueue, PurgeBatch, PurgeMessages, QueueState, ReleaseClaim, RenewClaim,
    RequeueDeadLetters, RetryNow, SkipDeadLetter, Wakeups,
};

/// A SQL outbox on SQLite or PostgreSQL, chosen by URL at start-up.
///
/// [`AnyOutbox::connect`] reads the scheme: `sqlite:` opens a SQLite file,
/// `postgres://` or `postgresql://` connects to a PostgreSQL server; any
/// other URL is refused with [`UrlError`]. A store built with its own
/// settings converts with `From` (`AnyOutbox::from(sqlite_outbox)`).
///
/// ```
/// use outbox::prelude::*;
/// use outbox::{AnyOutbox, SqlValue};
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct OrderPlaced { order_id: i64 }
/// impl Event for OrderPlaced { const NAME: &'static str = "order.placed"; }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> outbox::Result<()> {
/// // `postgres://app@db/app` takes the same code path on PostgreSQL.
/// let outbox = AnyOutbox::connect("sqlite::memory:").await?;
/// outbox
///     .execute("CREATE TABLE IF NOT EXISTS orders (id BIGINT PRIMARY KEY, customer TEXT)", &[])
///     .await?;
///
/// let mut tx = outbox.begin().await?;
/// tx.execute(
///     "INSERT INTO orders (id, customer) VALUES ($1, $2)",
///     &[SqlValue::from(7_i64), SqlValue::from("ada")],
/// )
/// .await?;
/// outbox.enqueue_event_in(&mut tx, &OrderPlaced { order_id: 7 }).await?;
/// tx.commit().await?;
///
/// assert_eq!(outbox.stats(outbox::SystemClock.now()).await?.pending, 1);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum AnyOutbox {
    /// A SQLite file.
    #[cfg(feature = "sqlite")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
    Sqlite(SqliteOutbox),
    /// A PostgreSQL server.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    Postgres(PostgresOutbox),
}

/// A transaction on an [`AnyOutbox`]'s database, from [`AnyOutbox::begin`].
///
/// Dropped without [`commit`](AnyTransaction::commit), it rolls back, and
/// the messages enqueued in it are gone with the application's rows.
#[derive(Debug)]
#[non_exhaustive]
pub enum AnyTransaction {
    /// A SQLite transaction.
    #[cfg(feature = "sqlite")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
    Sqlite(sqlx::Transaction<'static, sqlx::Sqlite>),
    /// A PostgreSQL transaction.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    Postgres(sqlx::Transaction<'static, sqlx::Postgres>),
}

/// A value bound to a `$N` placeholder in [`AnyTransaction::execute`] and
/// its siblings. Each variant holds an `Option`, so a SQL `NULL` keeps its
/// type (PostgreSQL refuses an untyped `NULL` in a typed column).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum SqlValue {
    /// `BOOLEAN` (an integer 0/1 on SQLite).
    Bool(Option<bool>),
    /// `BIGINT` (`INTEGER` on SQLite).
    Int(Option<i64>),
    /// `DOUBLE PRECISION` (`REAL` on SQLite).
    Float(Option<f64>),
    /// `TEXT`.
    Text(Option<String>),
}

macro_rules! sql_value_from {
    ($($ty:ty => $variant:ident($target:ty)),* $(,)?) => {$(
        impl From<$ty> for SqlValue {
            fn from(value: $ty) -> Self {
                SqlValue::$variant(Some(<$target>::from(value)))
            }
        }
        impl From<Option<$ty>> for SqlValue {
            fn from(value: Option<$ty>) -> Self {
                SqlValue::$variant(value.map(<$target>::from))
            }
        }
    )*};
}

sql_value_from!(
    bool => Bool(bool),
    i16 => Int(i64),
    i32 => Int(i64),
    i64 => Int(i64),
    u16 => Int(i64),
    u32 => Int(i64),
    f32 => Float(f64),
    f64 => Float(f64),
    String => Text(String),
);

impl From<&str> for SqlValue {
    fn from(value: &str) -> Self {
        SqlValue::Text(Some(value.to_owned()))
    }
}

impl From<Option<&str>> for SqlValue {
    fn from(value: Option<&str>) -> Self {
        SqlValue::Text(value.map(str::to_owned))
    }
}

/// A column type both enabled databases decode, for
/// [`AnyTransaction::fetch_scalar`]: `i64`, `i32`, `bool`, `f64`, `String`
/// and the other types sqlx maps on both.
#[cfg(all(feature = "sqlite", feature = "postgres"))]
pub trait AnyColumn:
    for<'r> sqlx::Decode<'r, sqlx::Sqlite>
    + sqlx::Type<sqlx::Sqlite>
    + for<'r> sqlx::Decode<'r, sqlx::Postgres>
    + sqlx::Type<sqlx::Postgres>
    + Send
    + Unpin
{
}
#[cfg(all(feature = "sqlite", feature = "postgres"))]
impl<T> AnyColumn for T where
    T: for<'r> sqlx::Decode<'r, sqlx::Sqlite>
        + sqlx::Type<sqlx::Sqlite>
        + for<'r> sqlx::Decode<'r, sqlx::Postgres>
        + sqlx::Type<sqlx::Postgres>
        + Send
        + Unpin
{
}

/// A column type the enabled database decodes, for
/// [`AnyTransaction::fetch_scalar`].
#[cfg(all(feature = "sqlite", not(feature = "postgres")))]
pub trait AnyColumn:
    for<'r> sqlx::Decode<'r, sqlx::Sqlite> + sqlx::Type<sqlx::Sqlite> + Send + Unpin
{
}
#[cfg(all(feature = "sqlite", not(feature = "postgres")))]
impl<T> AnyColumn for T where
    T: for<'r> sqlx::Decode<'r, sqlx::Sqlite> + sqlx::Type<sqlx::Sqlite> + Send + Unpin
{
}

/// A column type the enabled database decodes, for
/// [`AnyTransaction::fetch_scalar`].
#[cfg(all(feature = "postgres", not(feature = "sqlite")))]
pub trait AnyColumn:
    for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send + Unpin
{
}
#[cfg(all(feature = "postgres", not(feature = "sqlite")))]
impl<T> AnyColumn for T where
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send + Unpin
{
}

/// Bind `args` in order onto a query of either database.
macro_rules! bind_all {
    ($query:expr, $args:expr) => {{
        let mut query = $query;
        for arg in $args {
            query = match arg.clone() {
                SqlValue::Bool(v) => query.bind(v),
                SqlValue::Int(v) => query.bind(v),
                SqlValue::Float(v) => query.bind(v),
                SqlValue::Text(v) => query.bind(v),
            };
        }
        query
    }};
}

/// Run `$body` with `$conn` bound to the connection of whichever backend
/// `$value` (an [`AnyOutbox`] pool or an [`AnyTransaction`]) holds.
macro_rules! on_backend {
    ($value:expr, $enum:ident, |$conn:ident| $body:expr) => {
        match $value {
            #[cfg(feature = "sqlite")]
            $enum::Sqlite($conn) => $body,
            #[cfg(feature = "postgres")]
            $enum::Postgres($conn) => $body,
        }
    };
}

fn failed(operation: &'static str) -> impl FnOnce(sqlx::Error) -> Error {
    move |e| match connect::missing_table(&e) {
        Some(detail) => Error::NotSetUp { operation, detail },
        None => Error::store(operation, e),
    }
}

/// The refusal of a transaction on another database than the store's.
#[cfg_attr(not(all(feature = "sqlite", feature = "postgres")), allow(dead_code))]
fn other_database(store: &AnyOutbox, tx: &AnyTransaction) -> Error {
    Error::invalid(
        "tx",
        format!(
            "a {} transaction cannot enqueue into a {} outbox; begin it with this outbox's \
             `begin()`",
            tx.kind(),
            store.kind()
        ),
    )
}

/// The database `url` names by its scheme. A store whose feature is not
/// enabled is still named: its URL then goes to the other store, whose
/// check refuses it with the error that names the missing feature.
fn backend_for(url: &str) -> Result<DatabaseKind> {
    match connect::scheme(url).as_deref() {
        Some("sqlite") => Ok(DatabaseKind::Sqlite),
        Some("postgres" | "postgresql") => Ok(DatabaseKind::Postgres),
        _ => Err(UrlError::UnsupportedScheme {
            url: redact_url(url),
        }
        .into()),
    }
}

// After the macros and helpers above, which they use.
mod open;
mod schema;

pub use open::{AnyOutboxOptions, OpenMode};

impl AnyOutbox {
    /// Connect to `url` and set up the default table: `sqlite:…` through
    /// `SqliteOutbox::connect`, `postgres://…`/`postgresql://…` through
    /// `PostgresOutbox::connect` (each with its store's feature). A URL of
    /// another database, or without a scheme, is refused with
    /// [`UrlError::UnsupportedScheme`]; one whose store feature is not
    /// enabled with the error that names the feature.
    ///
    /// To open another table, only read a SQLite file, or open without
    /// setting anything up, use [`AnyOutbox::options`].
    pub async fn connect(url: &str) -> Result<Self> {
        match backend_for(url)? {
            DatabaseKind::Sqlite => Self::sqlite(url).await,
            DatabaseKind::Postgres => Self::postgres(url).await,
        }
    }

    /// Settings to open an outbox by URL with: which table, whether a
    /// SQLite file may be created or changed, the pools' settings. See
    /// [`AnyOutboxOptions`].
    pub fn options() -> AnyOutboxOptions {
        AnyOutboxOptions::default()
    }

    /// The scheme of a database URL, lowercased, as [`AnyOutbox::connect`]
    /// and [`AnyOutboxOptions::open`] read it to pick the database
    /// (`sqlite`, `postgres`, `postgresql`, or another database's, which
    /// they refuse); `None` when the URL has none, as a bare file path. For
    /// a program that reports a URL it cannot use in its own words.
    ///
    /// ```
    /// use outbox::AnyOutbox;
    ///
    /// assert_eq!(AnyOutbox::scheme("PostgreSQL://app@db/app").as_deref(), Some("postgresql"));
    /// assert_eq!(AnyOutbox::scheme("mysql://app@db/app").as_deref(), Some("mysql"));
    /// assert_eq!(AnyOutbox::scheme("app.db"), None);
    /// ```
    pub fn scheme(url: &str) -> Option<String> {
        connect::scheme(url)
    }

    #[cfg(feature = "sqlite")]
    async fn sqlite(url: &str) -> Result<Self> {
        SqliteOutbox::connect(url).await.map(AnyOutbox::Sqlite)
    }

    #[cfg(not(feature = "sqlite"))]
    async fn sqlite(url: &str) -> Result<Self> {
        // The PostgreSQL store's check names the missing feature.
        PostgresOutbox::connect(url).await.map(AnyOutbox::Postgres)
    }

    #[cfg(feature = "postgres")]
    async fn postgres(url: &str) -> Result<Self> {
        PostgresOutbox::connect(url).await.map(AnyOutbox::Postgres)
    }

    #[cfg(not(feature = "postgres"))]
    async fn postgres(url: &str) -> Result<Self> {
        // The SQLite store's check names the missing feature.
        SqliteOutbox::connect(url).await.map(AnyOutbox::Sqlite)
    }

    /// Which database this is.
    pub fn kind(&self) -> DatabaseKind {
        match self {
            #[cfg(feature = "sqlite")]
            AnyOutbox::Sqlite(_) => DatabaseKind::Sqlite,
            #[cfg(feature = "postgres")]
            AnyOutbox::Postgres(_) => DatabaseKind::Postgres,
        }
    }

    /// The table the outbox uses.
    pub fn table(&self) -> &TableName {
        on_backend!(self, AnyOutbox, |store| store.table())
    }

    /// Close the pool: wait until every connection is back, then close
    /// them all. Call it before the async runtime stops, when a task may
    /// still hold a connection: one dropped after the runtime is gone
    /// cannot be returned. Clones share the pool, so it closes theirs too.
    pub async fn close(&self) {
        on_backend!(self, AnyOutbox, |store| store.pool().close().await)
    }

    /// Wake-ups on inserts committed by any process, where the database
    /// tells every connection about them: PostgreSQL (`LISTEN`/`NOTIFY`).
    /// `None` on SQLite, whose wake-ups ([`OutboxStore::wakeups`]) come from
    /// this process's own commits only, so a drain in a process that does
    /// not enqueue must poll.
    pub fn cross_process_wakeups(&self) -> Option<Wakeups> {
        match self {
            #[cfg(feature = "sqlite")]
            AnyOutbox::Sqlite(_) => None,
            #[cfg(feature = "postgres")]
            AnyOutbox::Postgres(store) => store.wakeups(),
        }
    }

    /// The SQLite store, when it is one.
    #[cfg(feature = "sqlite")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
    pub fn as_sqlite(&self) -> Option<&SqliteOutbox> {
        #[allow(irrefutable_let_patterns)]
        if let AnyOutbox::Sqlite(store) = self {
            Some(store)
        } else {
            None
        }
    }

    /// The PostgreSQL store, when it is one.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub fn as_postgres(&self) -> Option<&PostgresOutbox> {
        #[allow(irrefutable_let_patterns)]
        if let AnyOutbox::Postgres(store) = self {
            Some(store)
        } else {
            None
        }
    }

    /// Create or upgrade the store's table; see `SqliteOutbox::setup` and
    /// `PostgresOutbox::setup`. [`AnyOutbox::connect`] already ran it.
    pub async fn setup(&self) -> Result<()> {
        on_backend!(self, AnyOutbox, |store| store.setup().await)
    }

    /// Begin a transaction on the store's pool, for the application's rows
    /// and the messages enqueued with them.
    ///
    /// On an in-memory SQLite database (one connection), commit or drop it
    /// before calling the store's own operations, which wait for that
    /// connection.
    pub async fn begin(&self) -> Result<AnyTransaction> {
        Ok(match self {
            #[cfg(feature = "sqlite")]
            AnyOutbox::Sqlite(store) => {
                AnyTransaction::Sqlite(store.pool().begin().await.map_err(failed("begin"))?)
            }
            #[cfg(feature = "postgres")]
            AnyOutbox::Postgres(store) => {
                AnyTransaction::Postgres(store.pool().begin().await.map_err(failed("begin"))?)
            }
        })
    }

    /// Enqueue `message` inside `tx`, unchanged, with the backend's
    /// `enqueue_in`: rolled back, the message is gone; committed, the drain
    /// sees it. A transaction of the other database is refused with
    /// [`Error::InvalidInput`] before anything is written.
    pub async fn enqueue_in(
        &self,
        tx: &mut AnyTransaction,
        message: NewMessage,
    ) -> Result<Enqueued> {
        match (self, tx) {
            #[cfg(feature = "sqlite")]
            (AnyOutbox::Sqlite(store), AnyTransaction::Sqlite(tx)) => {
                store.enqueue_in(tx, message).await
            }
            #[cfg(feature = "postgres")]
            (AnyOutbox::Postgres(store), AnyTransaction::Postgres(tx)) => {
                store.enqueue_in(tx, message).await
            }
            #[allow(unreachable_patterns)]
            (store, tx) => Err(other_database(store, tx)),
        }
    }

    /// Enqueue `messages` inside `tx` as one batch, unchanged, with the
    /// backend's `enqueue_batch_in`: one statement for a batch whose
    /// messages repeat no id or idempotency key, each message answered in
    /// order (see [`OutboxStore::enqueue_batch`]). A transaction of the
    /// other database is refused as by [`AnyOutbox::enqueue_in`].
    pub async fn enqueue_batch_in(
        &self,
        tx: &mut AnyTransaction,
        messages: Vec<NewMessage>,
    ) -> Result<Vec<Enqueued>> {
        match (self, tx) {
            #[cfg(feature = "sqlite")]
            (AnyOutbox::Sqlite(store), AnyTransaction::Sqlite(tx)) => {
                store.enqueue_batch_in(tx, messages).await
            }
            #[cfg(feature = "postgres")]
            (AnyOutbox::Postgres(store), AnyTransaction::Postgres(tx)) => {
                store.enqueue_batch_in(tx, messages).await
            }
            #[allow(unreachable_patterns)]
            (store, tx) => Err(other_database(store, tx)),
        }
    }

    /// [`AnyOutbox::enqueue_batch_in`] for events of registered type `E`,
    /// one per payload.
    pub async fn enqueue_events_in<'p, E: Event + 'p>(
        &self,
        tx: &mut AnyTransaction,
        payloads: impl IntoIterator<Item = &'p E>,
    ) -> Result<Vec<Enqueued>> {
        let messages = payloads
            .into_iter()
            .map(NewMessage::event)
            .collect::<Result<Vec<_>>>()?;
        self.enqueue_batch_in(tx, messages).await
    }

    /// [`AnyOutbox::enqueue_batch_in`] for jobs of registered type `J`, one
    /// per payload.
    pub async fn enqueue_jobs_in<'p, J: Job + 'p>(
        &self,
        tx: &mut AnyTransaction,
        payloads: impl IntoIterator<Item = &'p J>,
    ) -> Result<Vec<Enqueued>> {
        let messages = payloads
            .into_iter()
            .map(NewMessage::job)
            .collect::<Result<Vec<_>>>()?;
        self.enqueue_batch_in(tx, messages).await
    }

    /// [`AnyOutbox::enqueue_in`] for an event of registered type `E`.
    pub async fn enqueue_event_in<E: Event>(
        &self,
        tx: &mut AnyTransaction,
        payload: &E,
    ) -> Result<Enqueued> {
        self.enqueue_in(tx, NewMessage::event(payload)?).await
    }

    /// [`AnyOutbox::enqueue_in`] for a job of registered type `J`.
    pub async fn enqueue_job_in<J: Job>(
        &self,
        tx: &mut AnyTransaction,
        payload: &J,
    ) -> Result<Enqueued> {
        self.enqueue_in(tx, NewMessage::job(payload)?).await
    }

    /// Run one statement on the store's pool, outside any transaction;
    /// returns the rows it changed. See [`AnyTransaction::execute`].
    pub async fn execute(&self, sql: impl sqlx::SqlSafeStr, args: &[SqlValue]) -> Result<u64> {
        let sql = sql.into_sql_str();
        on_backend!(self, AnyOutbox, |store| {
            Ok(bind_all!(sqlx::query(sql), args)
                .execute(store.pool())
                .await
                .map_err(failed("execute"))?
                .rows_affected())
        })
    }

    /// The first column of the first row of a query on the store's pool;
    /// `None` when it returns no row. See [`AnyTransaction::fetch_scalar`].
    pub async fn fetch_scalar<T: AnyColumn>(
        &self,
        sql: impl sqlx::SqlSafeStr,
        args: &[SqlValue],
    ) -> Result<Option<T>> {
        let sql = sql.into_sql_str();
        on_backend!(self, AnyOutbox, |store| {
            bind_all!(sqlx::query_scalar(sql), args)
                .fetch_optional(store.pool())
                .await
                .map_err(failed("fetch"))
        })
    }
}

#[cfg(feature = "sqlite")]
impl From<SqliteOutbox> for AnyOutbox {
    fn from(store: SqliteOutbox) -> Self {
        AnyOutbox::Sqlite(store)
    }
}

#[cfg(feature = "postgres")]
impl From<PostgresOutbox> for AnyOutbox {
    fn from(store: PostgresOutbox) -> Self {
        AnyOutbox::Postgres(store)
    }
}

impl AnyTransaction {
    /// Which database the transaction is on.
    pub fn kind(&self) -> DatabaseKind {
        match self {
            #[cfg(feature = "sqlite")]
            AnyTransaction::Sqlite(_) => DatabaseKind::Sqlite,
            #[cfg(feature = "postgres")]
            AnyTransaction::Postgres(_) => DatabaseKind::Postgres,
        }
    }

    /// The SQLite connection inside the transaction, when it is one, for
    /// statements only SQLite speaks.
    #[cfg(feature = "sqlite")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
    pub fn as_sqlite(&mut self) -> Option<&mut sqlx::SqliteConnection> {
        #[allow(irrefutable_let_patterns)]
        if let AnyTransaction::Sqlite(tx) = self {
            Some(&mut **tx)
        } else {
            None
        }
    }

    /// The PostgreSQL connection inside the transaction, when it is one, for
    /// statements only PostgreSQL speaks.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub fn as_postgres(&mut self) -> Option<&mut sqlx::PgConnection> {
        #[allow(irrefutable_let_patterns)]
        if let AnyTransaction::Postgres(tx) = self {
            Some(&mut **tx)
        } else {
            None
        }
    }

    /// Run one statement in the transaction; returns the rows it changed.
    ///
    /// Write placeholders as `$1, $2, …`: PostgreSQL's form, which SQLite
    /// reads too; `args` bind to them in order. Keep to SQL both databases
    /// share (`RETURNING`, `ON CONFLICT … DO NOTHING`, `BIGINT`, `TEXT`), or
    /// branch on [`kind`](AnyTransaction::kind).
    pub async fn execute(&mut self, sql: impl sqlx::SqlSafeStr, args: &[SqlValue]) -> Result<u64> {
        let sql = sql.into_sql_str();
        on_backend!(self, AnyTransaction, |tx| {
            Ok(bind_all!(sqlx::query(sql), args)
                .execute(&mut **tx)
                .await
                .map_err(failed("execute"))?
                .rows_affected())
        })
    }

    /// The first column of the first row of a query in the transaction
    /// (`INSERT … RETURNING id`, `SELECT count(*) …`); `None` when it
    /// returns no row. Placeholders as in [`AnyTransaction::execute`].
    pub async fn fetch_scalar<T: AnyColumn>(
        &mut self,
        sql: impl sqlx::SqlSafeStr,
        args: &[SqlValue],
    ) -> Result<Option<T>> {
        let sql = sql.into_sql_str();
        on_backend!(self, AnyTransaction, |tx| {
            bind_all!(sqlx::query_scalar(sql), args)
                .fetch_optional(&mut **tx)
                .await
                .map_err(failed("fetch"))
        })
    }

    /// Commit the application's rows and the messages enqueued with them.
    pub async fn commit(self) -> Result<()> {
        on_backend!(self, AnyTransaction, |tx| tx
            .commit()
            .await
            .map_err(failed("commit")))
    }

    /// Roll back: the rows and the messages are gone.
    pub async fn rollback(self) -> Result<()> {
        on_backend!(self, AnyTransaction, |tx| tx
            .rollback()
            .await
            .map_err(failed("rollback")))
    }
}

impl OutboxStore for AnyOutbox {
    async fn enqueue(&self, message: NewMessage) -> Result<Enqueued> {
        on_backend!(self, AnyOutbox, |store| store.enqueue(message).await)
    }

    async fn enqueue_batch(&self, messages: Vec<NewMessage>) -> Result<Vec<Enqueued>> {
        on_backend!(self, AnyOutbox, |store| store.enqueue_batch(messages).await)
    }

    async fn claim_batch(&self, params: ClaimBatch) -> Result<ClaimedBatch> {
        on_backend!(self, AnyOutbox, |store| store.claim_batch(params).await)
    }

    async fn renew_claim(&self, params: RenewClaim) -> Result<DateTime<Utc>> {
        on_backend!(self, AnyOutbox, |store| store.renew_claim(params).await)
    }

    async fn renew_lease(&self, params: RenewClaim) -> Result<Lease> {
        on_backend!(self, AnyOutbox, |store| store.renew_lease(params).await)
    }

    async fn mark_delivered(&self, params: MarkDelivered) -> Result<()> {
        on_backend!(self, AnyOutbox, |store| store.mark_delivered(params).await)
    }

    async fn mark_failed(&self, params: MarkFailed) -> Result<()> {
        on_backend!(self, AnyOutbox, |store| store.mark_failed(params).await)
    }

    async fn settle_failure(&self, params: MarkFailed) -> Result<crate::kind::MessageStatus> {
        on_backend!(self, AnyOutbox, |store| store.settle_failure(params).await)
    }

    async fn release_claim(&self, params: ReleaseClaim) -> Result<()> {
        on_backend!(self, AnyOutbox, |store| store.release_claim(params).await)
    }

    fn wakeups(&self) -> Option<Wakeups> {
        on_backend!(self, AnyOutbox, |store| store.wakeups())
    }

    async fn pending_count(&self) -> Result<Option<u64>> {
        on_backend!(self, AnyOutbox, |store| store.pending_count().await)
    }

    async fn purge_batch(&self, params: PurgeBatch) -> Result<u64> {
        on_backend!(self, AnyOutbox, |store| store.purge_batch(params).await)
    }

    async fn vacuum(&self) -> Result<()> {
        on_backend!(self, AnyOutbox, |store| store.vacuum().await)
    }

    async fn warm_up(&self, claims: usize) -> Result<()> {
        on_backend!(self, AnyOutbox, |store| store.warm_up(claims).await)
    }

    fn claim_parallelism(&self) -> usize {
        on_backend!(self, AnyOutbox, |store| OutboxStore::claim_parallelism(
            store
        ))
    }

    fn claims_ahead(&self) -> bool {
        on_backend!(self, AnyOutbox, |store| OutboxStore::claims_ahead(store))
    }

    fn prefetch_limit(&self) -> usize {
        on_backend!(self, AnyOutbox, |store| OutboxStore::prefetch_limit(store))
    }

    fn schedules(&self) -> Option<&dyn ScheduleStore> {
        on_backend!(self, AnyOutbox, |store| OutboxStore::schedules(store))
    }
}

impl OutboxAdmin for AnyOutbox {
    async fn stats(&self, now: DateTime<Utc>) -> Result<OutboxStats> {
        on_backend!(self, AnyOutbox, |store| store.stats(now).await)
    }

    async fn list_messages(&self, params: ListMessages) -> Result<MessagePage> {
        on_backend!(self, AnyOutbox, |store| store.list_messages(params).await)
    }

    async fn get_message(&self, id: &str) -> Result<OutboxMessage> {
        on_backend!(self, AnyOutbox, |store| store.get_message(id).await)
    }

    async fn requeue_dead_letters(&self, params: RequeueDeadLetters) -> Result<u64> {
        on_backend!(self, AnyOutbox, |store| store
            .requeue_dead_letters(params)
            .await)
    }

    async fn purge(&self, params: PurgeMessages) -> Result<u64> {
        on_backend!(self, AnyOutbox, |store| store.purge(params).await)
    }

    async fn count_purgeable(&self, params: PurgeMessages) -> Result<u64> {
        on_backend!(self, AnyOutbox, |store| store.count_purgeable(params).await)
    }

    async fn activity(&self, since: DateTime<Utc>) -> Result<Vec<MinuteActivity>> {
        on_backend!(self, AnyOutbox, |store| store.activity(since).await)
    }

    async fn retry_now(&self, params: RetryNow) -> Result<()> {
        on_backend!(self, AnyOutbox, |store| store.retry_now(params).await)
    }

    async fn skip_dead_letter(&self, params: SkipDeadLetter) -> Result<()> {
        on_backend!(self, AnyOutbox, |store| store
            .skip_dead_letter(params)
            .await)
    }

    async fn list_schedules(&self) -> Result<Vec<ScheduleState>> {
        on_backend!(self, AnyOutbox, |store| store.list_schedules().await)
    }

    async fn blocked_keys(&self, limit: usize) -> Result<Vec<BlockedKey>> {
        on_backend!(self, AnyOutbox, |store| store.blocked_keys(limit).await)
    }

    async fn pause_queue(&self, params: PauseQueue) -> Result<bool> {
        on_backend!(self, AnyOutbox, |store| store.pause_queue(params).await)
    }

    async fn resume_queue(&self, queue: &str) -> Result<bool> {
        on_backend!(self, AnyOutbox, |store| store.resume_queue(queue).await)
    }

    async fn queues(&self) -> Result<Vec<QueueState>> {
        on_backend!(self, AnyOutbox, |store| store.queues().await)
    }

    async fn cancel_messages(&self, params: CancelMessages) -> Result<CancelReport> {
        on_backend!(self, AnyOutbox, |store| store.cancel_messages(params).await)
    }
}
