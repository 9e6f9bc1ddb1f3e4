//! Migrations for a table of any name.
//!
//! `sqlx::migrate!` embeds static SQL, so the migration files are written for
//! the default table, `outbox`, and are valid as they stand: the plain
//! `MIGRATOR` of each store runs them unchanged. Every identifier that belongs
//! to the outbox is written double-quoted, `"outbox"` for the table and
//! `"outbox_<suffix>"` for its indexes, and nothing else in the files is. For
//! another table, `setup` rewrites exactly those quoted identifiers with the
//! validated name (see [`TableName`]) and runs the result through sqlx's
//! migration machinery, tracked per table in `"<table>_migrations"`, so
//! several outboxes can live in one database and each is migrated once.
//! No other text is ever spliced into SQL.

use super::table::TableName;

/// How a backend wants the names in its DDL.
#[derive(Debug, Clone, Copy)]
// Each variant exists only with its backend's feature.
#[cfg_attr(not(all(feature = "sqlite", feature = "postgres")), allow(dead_code))]
pub(crate) enum Dialect {
    /// Index names are schema-qualified and the table after `ON` is bare:
    /// `CREATE INDEX "main"."t_x" ON "t" (...)`.
    Sqlite,
    /// Index names are bare (an index lives in its table's schema) and the
    /// table is qualified everywhere.
    Postgres,
}

/// Rewrite the outbox identifiers of a migration written for `"outbox"` so it
/// creates `table` instead. Only the quoted identifiers `"outbox"` and
/// `"outbox_<suffix>"` change; for the default table the text is unchanged,
/// so its checksum matches the embedded migration.
pub(crate) fn render_migration(sql: &str, table: &TableName, dialect: Dialect) -> String {
    const MARK: &str = "\"outbox";
    let bodies = match dialect {
        Dialect::Sqlite => trigger_bodies(sql),
        Dialect::Postgres => Vec::new(),
    };
    let mut out = String::with_capacity(sql.len() + 64);
    let mut rest = sql;
    while let Some(at) = rest.find(MARK) {
        let position = sql.len() - rest.len() + at;
        // SQLite refuses a qualified name in a trigger's body: a trigger
        // lives in its table's database and reads and writes only there.
        let in_body = bodies.iter().any(|body| body.contains(&position));
        let (before, tail) = rest.split_at(at);
        out.push_str(before);
        let after_mark = &tail[MARK.len()..];
        let Some(close) = after_mark.find('"') else {
            out.push_str(tail);
            return out;
        };
        let inner = &after_mark[..close];
        let previous = out.trim_end().rsplit(|c: char| c.is_whitespace()).next();
        let after = |keyword: &str| previous.is_some_and(|word| word.eq_ignore_ascii_case(keyword));
        // SQLite refuses a qualified table after `ON`: the index's own
        // (qualified) name already says which database it lives in.
        let after_on = after("ON");
        let replacement = if inner.is_empty() {
            // A table renamed into place (`RENAME TO`) keeps its schema:
            // neither database takes a qualified new name.
            match dialect {
                _ if after("TO") || in_body => Some(table.quoted_bare()),
                Dialect::Sqlite if after_on => Some(table.quoted_bare()),
                _ => Some(table.quoted()),
            }
        } else {
            // PostgreSQL creates an index in its table's schema and refuses
            // a qualified index name; anything else named after the table
            // (a table, a function) is qualified like the table.
            let index = after_mark[close + 1..]
                .split_whitespace()
                .next()
                .is_some_and(|word| word.eq_ignore_ascii_case("ON"));
            // Neither does it take a qualified trigger name: a trigger
            // lives with its table.
            let qualified = match dialect {
                Dialect::Sqlite => !after_on && !in_body,
                Dialect::Postgres => !index && !after("TRIGGER"),
            };
            inner
                .strip_prefix('_')
                .map(|suffix| table.derived(suffix, qualified))
        };
        match replacement {
            Some(replacement) => out.push_str(&replacement),
            // Some other identifier that happens to start with "outbox".
            None => {
                out.push_str(MARK);
                out.push_str(inner);
                out.push('"');
            }
        }
        rest = &after_mark[close + 1..];
    }
    out.push_str(rest);
    out
}

/// Where the bodies of a migration's `CREATE TRIGGER` statements lie: from
/// a line that opens with `BEGIN` after the statement's head to the next
/// line that opens with `END;`, the way the migrations write them.
fn trigger_bodies(sql: &str) -> Vec<std::ops::Range<usize>> {
    let mut bodies = Vec::new();
    let mut from = 0;
    while let Some(at) = sql[from..].find("CREATE TRIGGER") {
        let head = from + at;
        let Some(begin) = sql[head..].find("\nBEGIN").map(|b| head + b) else {
            break;
        };
        let end = sql[begin..].find("\nEND;").map_or(sql.len(), |e| begin + e);
        bodies.push(begin..end);
        from = end;
    }
    bodies
}

/// The embedded migrations rendered for `table`, tracked in
/// `"<table>_migrations"` (in the table's schema).
pub(crate) fn migrator_for(
    embedded: &sqlx::migrate::Migrator,
    table: &TableName,
    dialect: Dialect,
) -> sqlx::migrate::Migrator {
    use sqlx::SqlSafeStr;
    let migrations = embedded
        .iter()
        .map(|m| {
            let sql = render_migration(m.sql.as_str(), table, dialect);
            sqlx::migrate::Migration::new(
                m.version,
                m.description.clone(),
                m.migration_type,
                sqlx::AssertSqlSafe(sql).into_sql_str(),
                m.no_tx,
            )
        })
        .collect();
    let mut migrator = sqlx::migrate::Migrator::with_migrations(migrations);
    migrator.dangerous_set_table_name(table.derived("migrations", true));
    migrator
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendering_the_default_table_changes_nothing() {
        let sql = "CREATE TABLE \"outbox\" (id text);\n\
                   CREATE INDEX \"outbox_pending\" ON \"outbox\" (id);";
        for dialect in [Dialect::Sqlite, Dialect::Postgres] {
            assert_eq!(render_migration(sql, &TableName::default(), dialect), sql);
        }
    }

    #[test]
    fn rendering_rewrites_only_outbox_identifiers() {
        let sql = "CREATE TABLE IF NOT EXISTS \"outbox\" (id text, note text DEFAULT 'outbox');\n\
                   CREATE INDEX IF NOT EXISTS \"outbox_pending\" ON \"outbox\" (id);\n\
                   SELECT \"outboxed\" FROM \"outbox\";";
        let table = TableName::parse("app.jobs").unwrap();
        assert_eq!(
            render_migration(sql, &table, Dialect::Sqlite),
            "CREATE TABLE IF NOT EXISTS \"app\".\"jobs\" (id text, note text DEFAULT 'outbox');\n\
             CREATE INDEX IF NOT EXISTS \"app\".\"jobs_pending\" ON \"jobs\" (id);\n\
             SELECT \"outboxed\" FROM \"app\".\"jobs\";"
        );
        assert_eq!(
            render_migration(sql, &table, Dialect::Postgres),
            "CREATE TABLE IF NOT EXISTS \"app\".\"jobs\" (id text, note text DEFAULT 'outbox');\n\
             CREATE INDEX IF NOT EXISTS \"jobs_pending\" ON \"app\".\"jobs\" (id);\n\
             SELECT \"outboxed\" FROM \"app\".\"jobs\";"
        );
    }

    #[test]
    fn a_table_renamed_into_place_is_named_bare() {
        let sql = "ALTER TABLE \"outbox_rebuilt\" RENAME TO \"outbox\";";
        let table = TableName::parse("app.jobs").unwrap();
        for dialect in [Dialect::Sqlite, Dialect::Postgres] {
            assert_eq!(
                render_migration(sql, &table, dialect),
                "ALTER TABLE \"app\".\"jobs_rebuilt\" RENAME TO \"jobs\";"
            );
        }
    }

    #[test]
    fn sqlite_names_a_derived_table_bare_after_on() {
        let sql = "CREATE TABLE \"outbox_inbox\" (id text);\n\
                   CREATE INDEX \"outbox_inbox_at\" ON \"outbox_inbox\" (id);";
        let table = TableName::parse("main.jobs").unwrap();
        assert_eq!(
            render_migration(sql, &table, Dialect::Sqlite),
            "CREATE TABLE \"main\".\"jobs_inbox\" (id text);\n\
             CREATE INDEX \"main\".\"jobs_inbox_at\" ON \"jobs_inbox\" (id);"
        );
        assert_eq!(
            render_migration(sql, &table, Dialect::Postgres),
            "CREATE TABLE \"main\".\"jobs_inbox\" (id text);\n\
             CREATE INDEX \"jobs_inbox_at\" ON \"main\".\"jobs_inbox\" (id);"
        );
    }

    #[test]
    fn sqlite_names_the_table_bare_in_a_trigger_body() {
        let sql = "CREATE TRIGGER IF NOT EXISTS \"outbox_head\" AFTER DELETE ON \"outbox\"\n\
                   BEGIN\n    UPDATE \"outbox\" SET head = 1;\nEND;\n\
                   UPDATE \"outbox\" SET head = 0;";
        let table = TableName::parse("main.jobs").unwrap();
        assert_eq!(
            render_migration(sql, &table, Dialect::Sqlite),
            "CREATE TRIGGER IF NOT EXISTS \"main\".\"jobs_head\" AFTER DELETE ON \"jobs\"\n\
             BEGIN\n    UPDATE \"jobs\" SET head = 1;\nEND;\n\
             UPDATE \"main\".\"jobs\" SET head = 0;"
        );
    }

    #[test]
    fn postgres_names_a_trigger_bare() {
        let sql = "CREATE CONSTRAINT TRIGGER \"outbox_head\" AFTER INSERT ON \"outbox\"\n\
                   EXECUTE FUNCTION \"outbox_head\"();";
        let table = TableName::parse("app.jobs").unwrap();
        assert_eq!(
            render_migration(sql, &table, Dialect::Postgres),
            "CREATE CONSTRAINT TRIGGER \"jobs_head\" AFTER INSERT ON \"app\".\"jobs\"\n\
             EXECUTE FUNCTION \"app\".\"jobs_head\"();"
        );
    }

    #[test]
    fn postgres_qualifies_every_derived_name_but_an_index() {
        let sql = "CREATE TABLE \"outbox_drains\" (id int);\n\
                   CREATE INDEX \"outbox_at\"\n  ON \"outbox\" (id);\n\
                   SELECT \"outbox_wake\"('c'), '\"outbox_drains\"'::regclass;";
        let table = TableName::parse("app.jobs").unwrap();
        assert_eq!(
            render_migration(sql, &table, Dialect::Postgres),
            "CREATE TABLE \"app\".\"jobs_drains\" (id int);\n\
             CREATE INDEX \"jobs_at\"\n  ON \"app\".\"jobs\" (id);\n\
             SELECT \"app\".\"jobs_wake\"('c'), '\"app\".\"jobs_drains\"'::regclass;"
        );
    }
}
