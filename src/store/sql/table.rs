//! The outbox table's name: validated once, then only ever written into SQL
//! double-quoted.

use std::fmt;

use crate::error::{Error, Result};

/// The longest table or schema name accepted, in bytes. PostgreSQL truncates
/// identifiers at 63 bytes; this leaves room for the suffixes of the names
/// derived from the table (`_migrations`, `_pending`, ...), which must not
/// collide after truncation.
pub const MAX_TABLE_NAME_PART: usize = 48;

/// A validated outbox table name: `table` or `schema.table`.
///
/// Each part starts with an ASCII letter or underscore and continues with
/// ASCII letters, digits and underscores, at most [`MAX_TABLE_NAME_PART`]
/// bytes. The name is always used double-quoted, exactly as written (so on
/// PostgreSQL `Outbox` and `outbox` are different tables). Anything else is
/// refused with [`Error::InvalidTableName`]; no other text reaches SQL.
///
/// ```
/// use outbox::TableName;
///
/// assert_eq!(TableName::parse("jobs.outbox")?.quoted(), r#""jobs"."outbox""#);
/// assert!(TableName::parse("outbox; drop table orders").is_err());
/// # Ok::<(), outbox::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TableName {
    schema: Option<String>,
    name: String,
}

impl TableName {
    /// The table used when none is configured.
    pub const DEFAULT: &'static str = "outbox";

    /// Validate `name` as `table` or `schema.table`.
    pub fn parse(name: &str) -> Result<Self> {
        let invalid = |reason| Error::InvalidTableName {
            name: name.to_owned(),
            reason,
        };
        if name.is_empty() {
            return Err(invalid("it is empty"));
        }
        let mut parts = name.split('.');
        let first = parts.next().unwrap_or_default();
        let second = parts.next();
        if parts.next().is_some() {
            return Err(invalid("it has more than one dot"));
        }
        for part in std::iter::once(first).chain(second) {
            check_part(part).map_err(invalid)?;
        }
        Ok(match second {
            Some(table) => TableName {
                schema: Some(first.to_owned()),
                name: table.to_owned(),
            },
            None => TableName {
                schema: None,
                name: first.to_owned(),
            },
        })
    }

    /// The schema, when the name is qualified.
    pub fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    /// The table name without its schema.
    pub fn table(&self) -> &str {
        &self.name
    }

    /// The name as SQL: `"table"` or `"schema"."table"`.
    pub fn quoted(&self) -> String {
        match &self.schema {
            Some(schema) => format!("\"{schema}\".\"{}\"", self.name),
            None => format!("\"{}\"", self.name),
        }
    }

    /// The table name alone as SQL, `"table"`.
    pub(crate) fn quoted_bare(&self) -> String {
        format!("\"{}\"", self.name)
    }

    /// An object named after the table (`"table_suffix"`), in the table's
    /// schema when `qualified`.
    pub(crate) fn derived(&self, suffix: &str, qualified: bool) -> String {
        match (&self.schema, qualified) {
            (Some(schema), true) => format!("\"{schema}\".\"{}_{suffix}\"", self.name),
            _ => format!("\"{}_{suffix}\"", self.name),
        }
    }

    /// Whether this is the default, unqualified `outbox` table.
    pub fn is_default(&self) -> bool {
        self.schema.is_none() && self.name == Self::DEFAULT
    }
}

impl Default for TableName {
    fn default() -> Self {
        TableName {
            schema: None,
            name: Self::DEFAULT.to_owned(),
        }
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.schema {
            Some(schema) => write!(f, "{schema}.{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

impl std::str::FromStr for TableName {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Self::parse(s)
    }
}

fn check_part(part: &str) -> Result<(), &'static str> {
    let Some(first) = part.chars().next() else {
        return Err("a part around the dot is empty");
    };
    if part.len() > MAX_TABLE_NAME_PART {
        return Err("a part is longer than 48 bytes");
    }
    if !part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err("it contains a character other than ASCII letters, digits and underscores");
    }
    if first.is_ascii_digit() {
        return Err("a part starts with a digit");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_and_qualified_names() {
        let plain = TableName::parse("outbox_2").unwrap();
        assert_eq!(plain.quoted(), "\"outbox_2\"");
        assert_eq!(plain.schema(), None);
        let qualified = TableName::parse("_app.Events").unwrap();
        assert_eq!(qualified.quoted(), "\"_app\".\"Events\"");
        assert_eq!(qualified.to_string(), "_app.Events");
        assert!(TableName::default().is_default());
    }

    #[test]
    fn refuses_anything_else() {
        let long = "a".repeat(MAX_TABLE_NAME_PART + 1);
        for bad in [
            "",
            "x; drop table y",
            "a.b.c",
            "\"quoted\"",
            "`tick`",
            "1st",
            "s.",
            ".t",
            "with space",
            "dash-ed",
            "ünicode",
            long.as_str(),
        ] {
            match TableName::parse(bad) {
                Err(Error::InvalidTableName { name, .. }) => assert_eq!(name, bad),
                other => panic!("{bad:?} gave {other:?}"),
            }
        }
    }
}
