//! Opening the outbox that `--database` and `--table` name, for what a
//! command does to it, with each failure told as what the operator can fix.

use outbox::{AnyOutbox, DatabaseKind, Error, OpenMode, PostgresOutbox, UrlError};
use sqlx::postgres::PgPoolOptions;

use crate::fail::Failure;

/// Open the outbox `table` at `url`; `mode` is what the command may do to a
/// SQLite file (see [`OpenMode`]). Nothing is set up.
pub(crate) async fn open(url: &str, table: &str, mode: OpenMode) -> Result<AnyOutbox, Failure> {
    // A command holds few connections at once; a server's are shared with
    // the applications.
    let postgres = PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(PostgresOutbox::DEFAULT_CONNECT_TIMEOUT);
    AnyOutbox::options()
        .table(table)
        .mode(mode)
        .postgres_pool(postgres)
        .open(url)
        .await
        .map_err(|error| open_failed(url, mode, error))
}

/// The store's refusals in the command line's words, where it has its own.
fn open_failed(url: &str, mode: OpenMode, error: Error) -> Failure {
    match error {
        Error::Url(UrlError::UnsupportedScheme { .. }) => match AnyOutbox::scheme(url) {
            Some(scheme) => Failure::usage(format!("unsupported database URL scheme `{scheme}`"))
                .hint("use sqlite://PATH or postgres://USER:PASSWORD@HOST/DB"),
            None => Failure::usage("the database URL has no scheme").hint(
                "use sqlite://PATH (for example sqlite://app.db) or \
                 postgres://USER:PASSWORD@HOST/DB",
            ),
        },
        Error::Connect {
            url,
            reason,
            database: DatabaseKind::Sqlite,
        } => {
            let failure = Failure::operational(format!("cannot open the database {url}: {reason}"));
            if mode == OpenMode::Create {
                failure.hint("check that the file's directory exists and is writable")
            } else {
                failure.hint(
                    "check the path; to create a new outbox database, run `outbox migrate` first",
                )
            }
        }
        other => other.into(),
    }
}

/// Fail with what to do when the table is missing, before a command would
/// fail on it with a database error.
pub(crate) async fn require_table(outbox: &AnyOutbox) -> Result<(), Failure> {
    if outbox.table_exists().await? {
        return Ok(());
    }
    let table = outbox.table();
    Err(
        Failure::operational(format!("the outbox table `{table}` does not exist")).hint(format!(
            "create it with `outbox --table {table} migrate`, or pass the --table your \
             application uses"
        )),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(url: &str) -> String {
        let error = Error::Url(UrlError::UnsupportedScheme {
            url: outbox::kit::redact_url(url),
        });
        open_failed(url, OpenMode::ReadOnly, error).to_string()
    }

    #[test]
    fn a_url_of_no_supported_database_names_its_scheme() {
        let mysql = refusal("MySQL://u:secret@h/db");
        assert!(
            mysql.contains("unsupported database URL scheme `mysql`")
                && mysql.contains("sqlite://PATH")
                && !mysql.contains("secret"),
            "{mysql}"
        );
        let bare = refusal("app.db");
        assert!(
            bare.contains("has no scheme") && bare.contains("sqlite://app.db"),
            "{bare}"
        );
    }
}
