//! Checking a database URL before a store connects with it, and turning the
//! driver's failures to connect, or to find the table, into errors that name
//! the cause and the fix. The drivers' own words mislead here: SQLite calls
//! a PostgreSQL URL "unable to open database file", PostgreSQL looks up a
//! SQLite path as a host name, and a pool that cannot connect only says it
//! timed out.

use super::kit::redact_url;
use crate::database::DatabaseKind;
use crate::error::{Error, UrlError};

/// The scheme of `url`, lowercased, if it has one.
pub(crate) fn scheme(url: &str) -> Option<String> {
    let (scheme, _) = url.split_once(':')?;
    let valid = !scheme.is_empty()
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    valid.then(|| scheme.to_ascii_lowercase())
}

#[cfg(feature = "sqlite")]
fn is_postgres(url: &str) -> bool {
    matches!(scheme(url).as_deref(), Some("postgres" | "postgresql"))
}

fn is_sqlite(url: &str) -> bool {
    scheme(url).as_deref() == Some("sqlite")
}

#[cfg(feature = "sqlite")]
/// Refuse a URL the SQLite store cannot mean: another database's, or one
/// without a file (SQLite would open a private temporary database, and every
/// command on it would then fail for want of a table).
pub(crate) fn check_sqlite_url(url: &str) -> Result<(), Error> {
    if is_postgres(url) {
        return Err(UrlError::PostgresUrlForSqlite {
            url: redact_url(url),
        }
        .into());
    }
    let Some(rest) = url.strip_prefix("sqlite:").or_else(|| {
        // The scheme is case-insensitive.
        is_sqlite(url).then(|| &url["sqlite:".len()..])
    }) else {
        return Ok(());
    };
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    let in_memory = query.split('&').any(|pair| pair == "mode=memory");
    if path.is_empty() && !in_memory {
        return Err(UrlError::NoPath {
            url: url.to_owned(),
        }
        .into());
    }
    Ok(())
}

#[cfg(feature = "postgres")]
/// Refuse a SQLite URL given to the PostgreSQL store, which would look its
/// path up as a host name.
pub(crate) fn check_postgres_url(url: &str) -> Result<(), Error> {
    if is_sqlite(url) {
        return Err(UrlError::SqliteUrlForPostgres {
            url: url.to_owned(),
        }
        .into());
    }
    Ok(())
}

/// A URL the driver could not parse.
pub(crate) fn malformed(url: &str, backend: DatabaseKind, error: impl std::fmt::Display) -> Error {
    UrlError::Malformed {
        url: redact_url(url),
        database: backend,
        reason: error.to_string(),
    }
    .into()
}

/// A failure to open or reach the database, with the driver's (and the
/// operating system's) reason and what to check.
pub(crate) fn connect_failed(url: &str, error: &sqlx::Error, backend: DatabaseKind) -> Error {
    let reason = match error {
        // The I/O error is the operating system's, e.g. "Connection refused
        // (os error 111)"; sqlx's wrapper adds nothing.
        sqlx::Error::Io(io) => io.to_string(),
        other => other.to_string(),
    };
    Error::Connect {
        url: redact_url(url),
        reason,
        database: backend,
    }
}

/// Whether `error` says the table (or a column of it) does not exist:
/// SQLite's "no such table"/"no such column", PostgreSQL's `42P01`
/// (undefined table), `42703` (undefined column) and `42883` (undefined
/// function: the claim runs the table's own, which a table set up by an
/// older version lacks until its migrations run).
pub(crate) fn missing_table(error: &sqlx::Error) -> Option<String> {
    let database = error.as_database_error()?;
    let message = database.message();
    let code = database.code();
    let missing = message.starts_with("no such table")
        || message.starts_with("no such column")
        || matches!(code.as_deref(), Some("42P01" | "42703" | "42883"));
    missing.then(|| message.to_owned())
}

#[cfg(all(test, feature = "sqlite", feature = "postgres"))]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact_url("postgres://app:s3cret@db:5432/app?sslmode=require"),
            "postgres://app:***@db:5432/app?sslmode=require"
        );
        assert_eq!(redact_url("postgres://app@db/app"), "postgres://app@db/app");
        assert_eq!(redact_url("sqlite://data/app.db"), "sqlite://data/app.db");
    }

    #[test]
    fn urls_for_the_other_store_are_named() {
        assert!(matches!(
            check_sqlite_url("postgres://app:pw@db/app"),
            Err(Error::Url(UrlError::PostgresUrlForSqlite { url })) if url == "postgres://app:***@db/app"
        ));
        assert!(matches!(
            check_postgres_url("SQLite://x.db"),
            Err(Error::Url(UrlError::SqliteUrlForPostgres { .. }))
        ));
        assert!(check_postgres_url("postgresql://db/app").is_ok());
    }

    #[test]
    fn a_sqlite_url_needs_a_path() {
        for url in ["sqlite://", "sqlite:", "sqlite://?mode=rwc"] {
            assert!(
                matches!(
                    check_sqlite_url(url),
                    Err(Error::Url(UrlError::NoPath { .. }))
                ),
                "{url}"
            );
        }
        for url in [
            "sqlite://app.db",
            "sqlite:app.db",
            "sqlite:///tmp/x.db",
            "sqlite::memory:",
            "sqlite://?mode=memory",
        ] {
            assert!(check_sqlite_url(url).is_ok(), "{url}");
        }
    }
}
