//! What a SQL store's core gives the shared half (`SqlBackend`), what every
//! core holds (`SqlParts`), and how each database stores a time and counts
//! the rows a statement changed.

use std::collections::BTreeMap;
use std::future::Future;

use chrono::{DateTime, Utc};
use sqlx::{Database, Decode, Encode};

use super::statements::SharedStatements;
use super::table::TableName;
use crate::error::Result;
use crate::store::fenced::FencedBackend;

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
        DateTime::from_timestamp_micros(self).ok_or_else(|| crate::error::Error::CorruptRow {
            id: String::new(),
            reason: format!("{self} µs since the epoch is out of range"),
        })
    }
}

/// PostgreSQL's `timestamptz`, read without trusting it to fit chrono's
/// calendar: PostgreSQL's runs to the year 294276 and has `infinity`, and
/// sqlx's own decoding of a `DateTime` panics past chrono's last year
/// (262143). A row another writer put there is an unreadable row, not a
/// crash.
#[cfg(feature = "postgres")]
#[derive(Debug, Clone, Copy)]
pub(crate) struct PgTime(pub(crate) DateTime<Utc>);

#[cfg(feature = "postgres")]
impl StoredTime for PgTime {
    fn store(at: DateTime<Utc>) -> Self {
        PgTime(at)
    }

    fn load(self) -> Result<DateTime<Utc>> {
        Ok(self.0)
    }
}

#[cfg(feature = "postgres")]
impl sqlx::Type<sqlx::Postgres> for PgTime {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        <DateTime<Utc> as sqlx::Type<sqlx::Postgres>>::type_info()
    }

    fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
        <DateTime<Utc> as sqlx::Type<sqlx::Postgres>>::compatible(ty)
    }
}

#[cfg(feature = "postgres")]
impl Encode<'_, sqlx::Postgres> for PgTime {
    fn encode_by_ref(
        &self,
        buf: &mut sqlx::postgres::PgArgumentBuffer,
    ) -> std::result::Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
        Encode::<sqlx::Postgres>::encode_by_ref(&self.0, buf)
    }

    fn size_hint(&self) -> usize {
        Encode::<sqlx::Postgres>::size_hint(&self.0)
    }
}

#[cfg(feature = "postgres")]
impl<'r> Decode<'r, sqlx::Postgres> for PgTime {
    fn decode(
        value: sqlx::postgres::PgValueRef<'r>,
    ) -> std::result::Result<Self, sqlx::error::BoxDynError> {
        /// 2000-01-01, from which PostgreSQL counts its microseconds.
        const POSTGRES_EPOCH_MICROS: i64 = 946_684_800_000_000;
        match value.format() {
            sqlx::postgres::PgValueFormat::Binary => {
                let micros: i64 = Decode::<sqlx::Postgres>::decode(value)?;
                micros
                    .checked_add(POSTGRES_EPOCH_MICROS)
                    .and_then(DateTime::from_timestamp_micros)
                    .map(PgTime)
                    .ok_or_else(|| {
                        let shown = match micros {
                            i64::MAX => "infinity".to_owned(),
                            i64::MIN => "-infinity".to_owned(),
                            _ => format!("{micros} µs from 2000-01-01"),
                        };
                        format!("the time {shown} is out of range").into()
                    })
            }
            // Text is parsed, never added to: out of range is an error there.
            sqlx::postgres::PgValueFormat::Text => {
                Decode::<sqlx::Postgres>::decode(value).map(PgTime)
            }
        }
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
