//! Which database a SQL store speaks to, for errors and for code that
//! branches on it ([`AnyOutbox::kind`](crate::AnyOutbox::kind)).

use std::fmt;

/// The kind of database a store speaks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DatabaseKind {
    /// A SQLite file.
    Sqlite,
    /// A PostgreSQL server.
    Postgres,
}

impl DatabaseKind {
    /// What to check when a connection to such a database fails.
    pub fn hint(self) -> &'static str {
        match self {
            DatabaseKind::Sqlite => "check the path, and that its directory exists and is writable",
            DatabaseKind::Postgres => {
                "check the host, the port and the credentials, and that the server runs \
                 and accepts connections"
            }
        }
    }
}

impl fmt::Display for DatabaseKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DatabaseKind::Sqlite => "SQLite",
            DatabaseKind::Postgres => "PostgreSQL",
        })
    }
}
