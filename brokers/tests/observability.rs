//! The guide's observability page lists exactly the events and metrics the
//! inbox consumers emit, with each event's levels and fields: the section
//! `## Inbox consumers` of `docs/src/observability.md`, checked against
//! [`outbox_brokers::events::ALL`] and [`outbox_brokers::metrics::ALL`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

const PAGE: &str = "docs/src/observability.md";

fn page() -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    std::fs::read_to_string(root.join(PAGE)).unwrap_or_else(|e| panic!("cannot read {PAGE}: {e}"))
}

/// The text under `heading` (a line of its own), up to the next heading
/// of the same level or above.
fn section<'a>(text: &'a str, heading: &str) -> &'a str {
    let start = text
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("{PAGE} has no `{heading}` section"));
    let body = &text[start + heading.len() + 2..];
    let level = heading.split(' ').next().unwrap_or("#");
    let end = (1..=level.len())
        .filter_map(|n| body.find(&format!("\n{} ", "#".repeat(n))))
        .min();
    end.map_or(body, |end| &body[..end])
}

/// The rows of a table, keyed by their first cell without backticks.
fn rows(table: &str) -> BTreeMap<String, Vec<String>> {
    table
        .lines()
        .filter(|line| line.starts_with("| `"))
        .map(|line| {
            let mut cells = line
                .trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().to_owned());
            let first = cells.next().unwrap_or_default();
            (first.trim_matches('`').to_owned(), cells.collect())
        })
        .collect()
}

#[test]
fn the_observability_page_lists_every_event_and_metric_of_the_inbox_consumers() {
    let text = page();
    let inbox = section(&text, "## Inbox consumers");

    let events = rows(section(inbox, "### Events"));
    let mut wrong = Vec::new();
    for event in outbox_brokers::events::ALL {
        let Some(cells) = events.get(event.name) else {
            wrong.push(format!("`{}` is emitted but not listed", event.name));
            continue;
        };
        let (level, fields) = (&cells[0], &cells[1]);
        for expected in std::iter::once(&event.level).chain(event.other_levels) {
            let expected = expected.as_str().to_ascii_lowercase();
            if !level
                .split(|c: char| !c.is_ascii_alphabetic())
                .any(|word| word == expected)
            {
                wrong.push(format!(
                    "`{}` is emitted at {expected}; the page says {level:?}",
                    event.name
                ));
            }
        }
        for field in event.fields {
            if !fields.contains(&format!("`{field}`")) {
                wrong.push(format!(
                    "`{}` carries `{field}`; the page does not list it",
                    event.name
                ));
            }
        }
    }
    for listed in events.keys() {
        if !outbox_brokers::events::ALL.iter().any(|e| e.name == listed) {
            wrong.push(format!("`{listed}` is listed but never emitted"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{PAGE}'s inbox events are out of date:\n{}",
        wrong.join("\n")
    );

    let listed: BTreeSet<String> = rows(section(inbox, "### Metrics")).into_keys().collect();
    let recorded: BTreeSet<String> = outbox_brokers::metrics::ALL
        .iter()
        .map(|name| (*name).to_owned())
        .collect();
    assert_eq!(listed, recorded, "{PAGE}'s inbox metrics are out of date");
}

#[test]
fn the_consumers_emit_only_the_listed_names() {
    // Every `event = ...` in the consumers' sources names a constant of
    // `events`, never a string written out.
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/consume");
    for entry in std::fs::read_dir(&root).expect("the consumers' sources") {
        let path = entry.expect("an entry").path();
        let source = std::fs::read_to_string(&path).expect("a source file");
        for (n, line) in source.lines().enumerate() {
            if let Some(at) = line.find("event = ") {
                let value = line[at + "event = ".len()..].trim_start();
                assert!(
                    value.starts_with("events::"),
                    "{}:{}: an event named other than by a constant of `events`: {line}",
                    path.display(),
                    n + 1
                );
            }
        }
    }
}
