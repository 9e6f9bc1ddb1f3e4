//! How times, ages and tables are shown to an operator.

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};

/// A timestamp as RFC 3339 in UTC, to the millisecond.
pub(crate) fn time(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// `at` relative to `now`, to the second: `3m 12s ago`, `in 20s`, `now`.
pub(crate) fn relative(now: DateTime<Utc>, at: DateTime<Utc>) -> String {
    relative_with(now, at, usize::MAX)
}

/// [`relative`] cut to its two largest units (`1h 4m ago`), for tables.
pub(crate) fn relative_short(now: DateTime<Utc>, at: DateTime<Utc>) -> String {
    relative_with(now, at, 2)
}

fn relative_with(now: DateTime<Utc>, at: DateTime<Utc>, units: usize) -> String {
    let (span, past) = match (now - at).to_std() {
        Ok(span) => (span, true),
        Err(_) => ((at - now).to_std().unwrap_or_default(), false),
    };
    let span = age(span, units);
    match (span.as_str(), past) {
        ("0s", _) => "now".to_owned(),
        (_, true) => format!("{span} ago"),
        (_, false) => format!("in {span}"),
    }
}

/// A duration to the second, in at most `units` humantime units (`2h 5m`).
pub(crate) fn age(span: Duration, units: usize) -> String {
    let whole = Duration::from_secs(span.as_secs());
    let text = humantime::format_duration(whole).to_string();
    text.split(' ').take(units).collect::<Vec<_>>().join(" ")
}

/// `text` cut to `max` characters, with `…` when something was cut, on one line.
pub(crate) fn truncate(text: &str, max: usize) -> String {
    let line = text.lines().next().unwrap_or_default();
    let cut = line.chars().count() > max || text.lines().nth(1).is_some();
    if !cut {
        return line.to_owned();
    }
    let kept: String = line.chars().take(max.saturating_sub(1)).collect();
    format!("{kept}…")
}

/// Valid JSON text indented by two spaces per level, keys in their stored
/// order. (`serde_json::Value` would sort them, and pretty-printing a raw
/// payload inside a document leaves it on one line.)
pub(crate) fn pretty_json(json: &str) -> String {
    let mut out = String::with_capacity(json.len() * 2);
    let mut depth = 0usize;
    let mut chars = json.chars().peekable();
    let (mut in_string, mut escaped) = (false, false);
    let newline = |out: &mut String, depth: usize| {
        out.push('\n');
        out.extend(std::iter::repeat_n("  ", depth));
    };
    while let Some(c) = chars.next() {
        if in_string {
            out.push(c);
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                out.push(c);
            }
            '{' | '[' => {
                out.push(c);
                while chars.next_if(|c| c.is_whitespace()).is_some() {}
                match chars.peek() {
                    Some('}' | ']') => out.push(chars.next().expect("peeked")),
                    _ => {
                        depth += 1;
                        newline(&mut out, depth);
                    }
                }
            }
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                newline(&mut out, depth);
                out.push(c);
            }
            ',' => {
                out.push(c);
                newline(&mut out, depth);
            }
            ':' => out.push_str(": "),
            c if c.is_whitespace() => {}
            c => out.push(c),
        }
    }
    out
}

/// A document as pretty JSON, stored payloads included, keys in order.
pub(crate) fn pretty(document: &impl serde::Serialize) -> String {
    pretty_json(&serde_json::to_string(document).expect("a document serializes"))
}

/// A plain text table: a header row and left-aligned columns two spaces apart.
pub(crate) struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column titles.
    pub(crate) fn new(header: &[&str]) -> Self {
        Table {
            rows: vec![header.iter().map(|title| (*title).to_owned()).collect()],
        }
    }

    /// Add a row (as many cells as the header).
    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as text, one line per row, trailing spaces trimmed.
    pub(crate) fn render(&self) -> String {
        let columns = self.rows[0].len();
        let widths: Vec<usize> = (0..columns)
            .map(|i| {
                self.rows
                    .iter()
                    .map(|row| row.get(i).map_or(0, |cell| cell.chars().count()))
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = String::new();
        for row in &self.rows {
            let mut line = String::new();
            for (cell, width) in row.iter().zip(&widths) {
                line.push_str(cell);
                let pad = width - cell.chars().count() + 2;
                line.extend(std::iter::repeat_n(' ', pad));
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_times_read_naturally() {
        let now = DateTime::from_timestamp(1_000_000, 0).unwrap();
        let at = |secs: i64| DateTime::from_timestamp(1_000_000 + secs, 500_000).unwrap();
        assert_eq!(relative(now, at(-192)), "3m 11s ago");
        assert_eq!(relative(now, at(20)), "in 20s");
        assert_eq!(relative(now, at(0)), "now");
        assert_eq!(relative_short(now, at(-3_725)), "1h 2m ago");
    }

    #[test]
    fn json_is_indented_in_its_own_key_order() {
        let text = r#"{"z":1, "a":[1,{"b":"x,{\"y\":[]}"}],"e":{},"f":[ ]}"#;
        assert_eq!(
            pretty_json(text),
            "{\n  \"z\": 1,\n  \"a\": [\n    1,\n    {\n      \"b\": \"x,{\\\"y\\\":[]}\"\n    }\n  ],\n  \"e\": {},\n  \"f\": []\n}"
        );
        let value: serde_json::Value = serde_json::from_str(&pretty_json(text)).unwrap();
        assert_eq!(
            value,
            serde_json::from_str::<serde_json::Value>(text).unwrap()
        );
        assert_eq!(pretty_json("\"a b\""), "\"a b\"");
    }

    #[test]
    fn tables_align_and_truncate() {
        let mut table = Table::new(&["ID", "NAME"]);
        table.row(vec!["1".into(), "order.placed".into()]);
        table.row(vec!["22".into(), truncate("a long\nsecond line", 20)]);
        assert_eq!(table.render(), "ID  NAME\n1   order.placed\n22  a long…\n");
        assert_eq!(truncate("abcdef", 4), "abc…");
    }
}
