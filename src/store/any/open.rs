//! Opening an [`AnyOutbox`] with settings of the caller's: another table,
//! a SQLite file that must already exist or is only read, the pools. Unlike
//! [`AnyOutbox::connect`], opening never runs `setup`, so a tool can look at
//! a database before (or instead of) changing it.

#[cfg(feature = "postgres")]
use sqlx::postgres::PgPoolOptions;
#[cfg(feature = "sqlite")]
use sqlx::sqlite::SqlitePoolOptions;

use super::{AnyOutbox, backend_for};
use crate::database::DatabaseKind;
use crate::error::Result;
#[cfg(feature = "sqlite")]
use crate::store::connect::connect_failed;
#[cfg(feature = "postgres")]
use crate::store::postgres::PostgresOutbox;
use crate::store::sql::TableName;
#[cfg(feature = "sqlite")]
use crate::store::sqlite::SqliteOutbox;

/// What opening may do to the database, for [`AnyOutboxOptions::mode`].
///
/// The modes differ on SQLite, where the database is a file the opener
/// could create or convert. A PostgreSQL server is reached the same way in
/// every mode: to only read there, connect as a role that may only read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OpenMode {
    /// Create the SQLite file when it is missing, and switch it to WAL
    /// with the store's other settings
    /// (`SqliteOutbox::connect_options`).
    /// What an application that owns the database opens with.
    #[default]
    Create,
    /// Read and write a SQLite file that must exist, leaving its journal
    /// mode as it is: a file that turns out not to be an outbox is not
    /// converted. (`setup` switched every outbox file to WAL for good.)
    Existing,
    /// Only read a SQLite file that must exist: it is opened read-only, so
    /// it is never created or changed, and the store's writes fail
    /// (`SqliteOutbox::read_only_options`).
    /// Counting, listing and showing messages work.
    ReadOnly,
}

/// Settings to open an [`AnyOutbox`] by URL with; start with
/// [`AnyOutbox::options`], finish with [`AnyOutboxOptions::open`].
///
/// ```
/// use outbox::{AnyOutbox, Clock, OpenMode, OutboxAdmin};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> outbox::Result<()> {
/// # let dir = std::env::temp_dir().join(format!("outbox-any-open-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir).unwrap();
/// # let url = format!("sqlite://{}/app.db", dir.display());
/// // An application creates and sets up its table ...
/// let app = AnyOutbox::options().table("jobs").open(&url).await?;
/// app.setup().await?;
/// app.close().await;
///
/// // ... and a tool that only looks at it can never change the file.
/// let reader = AnyOutbox::options()
///     .table("jobs")
///     .mode(OpenMode::ReadOnly)
///     .open(&url)
///     .await?;
/// assert!(reader.table_exists().await?);
/// assert_eq!(reader.stats(outbox::SystemClock.now()).await?.total(), 0);
/// reader.close().await;
/// # std::fs::remove_dir_all(&dir).ok();
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct AnyOutboxOptions {
    /// As given: checked by `open`, after the URL, so a URL of no supported
    /// database is reported first whatever the name.
    table: String,
    mode: OpenMode,
    #[cfg(feature = "sqlite")]
    sqlite_pool: SqlitePoolOptions,
    #[cfg(feature = "postgres")]
    postgres_pool: PgPoolOptions,
}

impl Default for AnyOutboxOptions {
    fn default() -> Self {
        AnyOutboxOptions {
            table: TableName::DEFAULT.to_owned(),
            mode: OpenMode::default(),
            #[cfg(feature = "sqlite")]
            sqlite_pool: SqlitePoolOptions::new(),
            // As `PostgresOutbox::connect`: sqlx would wait 30 s for a
            // connection of a pool that cannot get one.
            #[cfg(feature = "postgres")]
            postgres_pool: PgPoolOptions::new()
                .acquire_timeout(PostgresOutbox::DEFAULT_CONNECT_TIMEOUT),
        }
    }
}

impl AnyOutboxOptions {
    /// The outbox table: `table` or `schema.table`; `outbox` by default.
    /// [`open`](AnyOutboxOptions::open) refuses a name that is not a plain
    /// identifier (see [`TableName`]), or that a SQLite store cannot use,
    /// with [`Error::InvalidTableName`](crate::Error::InvalidTableName).
    pub fn table(mut self, name: impl Into<String>) -> Self {
        self.table = name.into();
        self
    }

    /// What opening may do to the database; [`OpenMode::Create`] by default.
    pub fn mode(mut self, mode: OpenMode) -> Self {
        self.mode = mode;
        self
    }

    /// The pool settings when the URL names a SQLite file; sqlx's defaults
    /// otherwise. An in-memory database lives only as long as its
    /// connections: keep one open for good, as [`AnyOutbox::connect`] does.
    #[cfg(feature = "sqlite")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
    pub fn sqlite_pool(mut self, pool: SqlitePoolOptions) -> Self {
        self.sqlite_pool = pool;
        self
    }

    /// The pool settings when the URL names a PostgreSQL server; by default
    /// sqlx's, with an acquire timeout of
    /// [`PostgresOutbox::DEFAULT_CONNECT_TIMEOUT`](crate::PostgresOutbox::DEFAULT_CONNECT_TIMEOUT).
    /// The connection is made as by
    /// [`PostgresOutbox::connect_pool`](crate::PostgresOutbox::connect_pool),
    /// so a server that refuses it is reported at once.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub fn postgres_pool(mut self, pool: PgPoolOptions) -> Self {
        self.postgres_pool = pool;
        self
    }

    /// Open the outbox at `url` with these settings. Nothing is set up:
    /// call [`AnyOutbox::setup`] to create or upgrade the table, or ask
    /// [`AnyOutbox::table_exists`] first.
    ///
    /// Refused, in this order and before anything connects: a URL of no
    /// supported database ([`UrlError::UnsupportedScheme`](crate::UrlError::UnsupportedScheme)),
    /// a bad table name, a URL its store cannot use (another [`Error::Url`](crate::Error::Url)).
    /// A database that cannot be opened or reached fails with
    /// [`Error::Connect`](crate::Error::Connect): on SQLite in
    /// [`OpenMode::Existing`] and [`OpenMode::ReadOnly`], a missing file.
    pub async fn open(&self, url: &str) -> Result<AnyOutbox> {
        let backend = backend_for(url)?;
        TableName::parse(&self.table)?;
        match backend {
            DatabaseKind::Sqlite => self.open_sqlite(url).await,
            DatabaseKind::Postgres => self.open_postgres(url).await,
        }
    }

    #[cfg(feature = "sqlite")]
    async fn open_sqlite(&self, url: &str) -> Result<AnyOutbox> {
        let options = match self.mode {
            OpenMode::Create => SqliteOutbox::connect_options(url)?,
            OpenMode::Existing => SqliteOutbox::read_only_options(url)?.read_only(false),
            OpenMode::ReadOnly => SqliteOutbox::read_only_options(url)?,
        };
        let pool = self
            .sqlite_pool
            .clone()
            .connect_with(options)
            .await
            .map_err(|e| connect_failed(url, &e, DatabaseKind::Sqlite))?;
        let store = SqliteOutbox::builder(pool).table(&self.table)?.build();
        Ok(AnyOutbox::Sqlite(store))
    }

    #[cfg(not(feature = "sqlite"))]
    async fn open_sqlite(&self, url: &str) -> Result<AnyOutbox> {
        // The PostgreSQL store's check names the missing feature.
        self.open_postgres(url).await
    }

    #[cfg(feature = "postgres")]
    async fn open_postgres(&self, url: &str) -> Result<AnyOutbox> {
        let pool = PostgresOutbox::connect_pool(url, self.postgres_pool.clone()).await?;
        let store = PostgresOutbox::builder(pool).table(&self.table)?.build();
        Ok(AnyOutbox::Postgres(store))
    }

    #[cfg(not(feature = "postgres"))]
    async fn open_postgres(&self, url: &str) -> Result<AnyOutbox> {
        // The SQLite store's check names the missing feature.
        self.open_sqlite(url).await
    }
}
