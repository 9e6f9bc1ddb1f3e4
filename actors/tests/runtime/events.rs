//! The list of tracing events, `outbox_actors::events`, against the code
//! that emits them, read from `src/`: every `event` field names one of the
//! list's constants (never a name written out), at a level and with fields
//! the list gives it; no other string in the code spells an event name; and
//! every listed event is emitted, at each of its levels and with each of
//! its fields, somewhere.
//!
//! A plain reader of the tracing macros' arguments, not a compiler; it
//! skips comments, so docs may name events freely.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use outbox_actors::events::{self, TracingEvent};
use tracing::Level;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`, in a stable order.
fn sources(dir: &Path, found: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            sources(&path, found);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            found.push(path);
        }
    }
}

/// The length of the string literal that starts `text`, quotes included
/// (`"…"`, `r"…"`, `r#"…"#`), or `None` if none starts there.
fn string_literal(text: &str) -> Option<usize> {
    if let Some(rest) = text.strip_prefix('r') {
        let hashes = rest.chars().take_while(|&c| c == '#').count();
        if !rest[hashes..].starts_with('"') {
            return None;
        }
        let body = 1 + hashes + 1;
        let close = format!("\"{}", "#".repeat(hashes));
        return Some(
            text[body..]
                .find(&close)
                .map_or(text.len(), |end| body + end + close.len()),
        );
    }
    if !text.starts_with('"') {
        return None;
    }
    let bytes = text.as_bytes();
    let mut i = 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return Some(i + 1),
            _ => i += 1,
        }
    }
    Some(text.len())
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The code without its comments; string and char literals kept as they are.
fn without_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        let rest = &text[i..];
        let after_ident = out.chars().last().is_some_and(is_ident_char);
        if rest.starts_with("//") {
            i += rest.find('\n').unwrap_or(rest.len());
        } else if rest.starts_with("/*") {
            i += rest.find("*/").map_or(rest.len(), |end| end + 2);
        } else if let Some(len) = string_literal(rest).filter(|_| !after_ident) {
            out.push_str(&rest[..len]);
            i += len;
        } else if rest.starts_with("'\\")
            || rest.chars().nth(2) == Some('\'') && rest.starts_with('\'')
        {
            // A char literal (a lifetime has no closing quote there).
            let len = rest[1..].find('\'').map_or(rest.len(), |end| end + 2);
            out.push_str(&rest[..len]);
            i += len;
        } else {
            let c = rest.chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// The contents of every string literal in `code`.
fn literals(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut i = 0;
    while i < code.len() {
        let rest = &code[i..];
        let after_ident = code[..i].chars().last().is_some_and(is_ident_char);
        match string_literal(rest).filter(|_| !after_ident) {
            Some(len) => {
                let literal = &rest[..len];
                let open = literal.find('"').unwrap();
                let close = literal.rfind('"').unwrap().max(open + 1);
                found.push(literal[open + 1..close].to_string());
                i += len;
            }
            None => i += rest.chars().next().unwrap().len_utf8(),
        }
    }
    found
}

/// The top-level comma-separated arguments of the macro call whose `(`
/// starts `text`.
fn arguments(text: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut current = String::new();
    let mut depth = 0;
    let mut i = 0;
    while i < text.len() {
        let rest = &text[i..];
        if let Some(len) = string_literal(rest).filter(|_| !current.ends_with(is_ident_char)) {
            current.push_str(&rest[..len]);
            i += len;
            continue;
        }
        let c = rest.chars().next().unwrap();
        i += c.len_utf8();
        match c {
            '(' | '[' | '{' => {
                depth += 1;
                if depth == 1 {
                    continue;
                }
            }
            ')' | ']' | '}' => {
                depth -= 1;
                if depth == 0 {
                    parts.push(std::mem::take(&mut current));
                    break;
                }
            }
            ',' if depth == 1 => {
                parts.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    parts
        .into_iter()
        .map(|part| part.trim().to_string())
        .filter(|part| !part.is_empty())
        .collect()
}

/// One call of a tracing level macro that sets an `event` field.
#[derive(Debug)]
struct Site {
    /// `file:line`.
    place: String,
    level: Level,
    /// What the `event` field is set to, as written.
    event: String,
    /// The other fields, in order.
    fields: Vec<String>,
}

/// Every call of a tracing event macro in `code`, as sites (with or without
/// an `event` field: `event` is empty without one), and the calls whose
/// level cannot be read.
fn sites(file: &str, code: &str) -> (Vec<Site>, Vec<String>) {
    let (mut found, mut unreadable) = (Vec::new(), Vec::new());
    for (at, _) in code.match_indices('!') {
        let name_start = code[..at]
            .rfind(|c: char| !is_ident_char(c))
            .map_or(0, |i| i + 1);
        let macro_name = &code[name_start..at];
        let Some(open) = code[at + 1..].find(|c: char| !c.is_whitespace()) else {
            continue;
        };
        if !code[at + 1 + open..].starts_with('(') {
            continue;
        }
        let place = format!("{file}:{}", code[..at].lines().count());
        let level = match macro_name {
            "trace" => Level::TRACE,
            "debug" => Level::DEBUG,
            "info" => Level::INFO,
            "warn" => Level::WARN,
            "error" => Level::ERROR,
            "event" => {
                unreadable.push(format!("{place}: `event!` (emit through a level macro)"));
                continue;
            }
            _ => continue,
        };
        let mut event = String::new();
        let mut fields = Vec::new();
        for argument in arguments(&code[at + 1 + open..]) {
            if argument.starts_with("target:") || argument.starts_with("parent:") {
                continue;
            }
            // The message and its format arguments follow the fields.
            if string_literal(&argument).is_some() {
                break;
            }
            let (name, value) = match argument.split_once('=') {
                Some((name, value)) if !value.starts_with(['=', '>']) => {
                    (name.trim().to_string(), value.trim().to_string())
                }
                _ => (
                    argument.trim_start_matches(['%', '?']).to_string(),
                    String::new(),
                ),
            };
            if name == "event" {
                event = value;
            } else {
                fields.push(name);
            }
        }
        found.push(Site {
            place,
            level,
            event,
            fields,
        });
    }
    (found, unreadable)
}

/// The constants `events.rs` defines, by name: `DELIVERED` → `outbox.delivered`.
fn constants(code: &str) -> Vec<(String, String)> {
    code.lines()
        .filter_map(|line| {
            let (constant, rest) = line.trim().split_once(" = \"")?;
            let (name, rest) = rest.split_once('"')?;
            (constant.chars().all(|c| c.is_ascii_uppercase() || c == '_')
                && rest.starts_with(" at "))
            .then(|| (constant.to_string(), name.to_string()))
        })
        .collect()
}

fn levels(event: &TracingEvent) -> Vec<Level> {
    std::iter::once(event.level)
        .chain(event.other_levels.iter().copied())
        .collect()
}

/// `part` in the order of `whole`, gaps allowed.
fn is_subsequence(part: &[String], whole: &[&str]) -> bool {
    let mut whole = whole.iter();
    part.iter().all(|field| whole.any(|listed| listed == field))
}

fn looks_like_an_event_name(text: &str) -> bool {
    ["outbox.", "job."].iter().any(|prefix| {
        text.strip_prefix(prefix).is_some_and(|rest| {
            !rest.is_empty() && rest.chars().all(|c| c.is_ascii_lowercase() || c == '_')
        })
    })
}

#[test]
fn the_code_emits_the_events_listed_and_only_those() {
    let events_file = src().join("events.rs");
    let constants = constants(&without_comments(
        &fs::read_to_string(&events_file).unwrap(),
    ));
    let listed: Vec<&str> = events::ALL.iter().map(|event| event.name).collect();
    let read: Vec<&str> = constants.iter().map(|(_, name)| name.as_str()).collect();
    assert_eq!(
        read, listed,
        "the reader of events.rs disagrees with `events::ALL`"
    );
    let by_constant: BTreeMap<&str, &TracingEvent> = constants
        .iter()
        .map(|(constant, name)| {
            let event = events::ALL.iter().find(|event| event.name == name).unwrap();
            (constant.as_str(), event)
        })
        .collect();

    let mut failures = Vec::new();
    for (constant, name) in &constants {
        let expected = name
            .trim_start_matches("outbox.")
            .replace('.', "_")
            .to_uppercase();
        if *constant != expected {
            failures.push(format!(
                "events::{constant} for {name:?}: name it {expected}"
            ));
        }
    }
    let names: BTreeSet<&str> = listed.iter().copied().collect();
    if names.len() != listed.len() {
        failures.push("an event is listed twice".to_string());
    }

    let mut files = Vec::new();
    sources(&src(), &mut files);
    let mut emitted_at: BTreeSet<(&str, Level)> = BTreeSet::new();
    let mut emitted_fields: BTreeSet<(&str, String)> = BTreeSet::new();
    let mut named_sites = 0;
    for file in files.iter().filter(|file| **file != events_file) {
        let shown = file.strip_prefix(src()).unwrap().display().to_string();
        let code = without_comments(&fs::read_to_string(file).unwrap());
        for literal in literals(&code) {
            if names.contains(literal.as_str()) || looks_like_an_event_name(&literal) {
                failures.push(format!(
                    "{shown}: the string {literal:?} spells an event name; use `events`"
                ));
            }
        }
        let (sites, unreadable) = sites(&shown, &code);
        failures.extend(unreadable);
        for site in sites.into_iter().filter(|site| !site.event.is_empty()) {
            named_sites += 1;
            let constant = site
                .event
                .strip_prefix("crate::")
                .unwrap_or(&site.event)
                .strip_prefix("events::");
            let Some(event) = constant.and_then(|constant| by_constant.get(constant)) else {
                failures.push(format!(
                    "{}: `event = {}` is not a constant of `events`",
                    site.place, site.event
                ));
                continue;
            };
            if !levels(event).contains(&site.level) {
                let listed: Vec<String> = levels(event).iter().map(Level::to_string).collect();
                failures.push(format!(
                    "{}: {} emitted at {}, listed at {}",
                    site.place,
                    event.name,
                    site.level,
                    listed.join(" or ")
                ));
            }
            if !is_subsequence(&site.fields, event.fields) {
                failures.push(format!(
                    "{}: {} emitted with fields {:?}, listed with {:?} (in that order)",
                    site.place, event.name, site.fields, event.fields
                ));
            }
            emitted_at.insert((event.name, site.level));
            for field in site.fields {
                emitted_fields.insert((event.name, field));
            }
        }
    }
    assert!(named_sites > 0, "the reader found no event in src/");

    for event in events::ALL {
        for level in levels(event) {
            if !emitted_at.contains(&(event.name, level)) {
                failures.push(format!(
                    "{} is listed at {level} but never emitted so",
                    event.name
                ));
            }
        }
        for field in event.fields {
            if !emitted_fields.contains(&(event.name, field.to_string())) {
                failures.push(format!(
                    "{} is listed with the field `{field}` but never emitted with it",
                    event.name
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "events and code disagree:\n{}",
        failures.join("\n")
    );
}

#[test]
fn every_listed_event_is_described() {
    for event in events::ALL {
        assert!(
            !event.description.is_empty() && event.description.ends_with('.'),
            "{}: {:?}",
            event.name,
            event.description
        );
        assert!(!event.fields.is_empty(), "{}", event.name);
        assert!(
            !event.other_levels.contains(&event.level),
            "{}: its level is listed twice",
            event.name
        );
    }
}

#[test]
fn the_reader_finds_literal_and_unlisted_event_names() {
    let code = without_comments(
        r#"
        // tracing::info!(event = "outbox.commented_out");
        fn emit(message: &str) {
            tracing::warn!(target: "outbox", event = "outbox.delivered", id = %message, "text {}", 1);
            tracing::info!(target: "outbox", event = events::NOT_LISTED, %error);
            let event = "job.started";
        }
        "#,
    );
    let (sites, unreadable) = sites("example.rs", &code);
    assert!(unreadable.is_empty());
    let found: Vec<_> = sites
        .iter()
        .map(|site| (site.level, site.event.as_str(), site.fields.clone()))
        .collect();
    assert_eq!(
        found,
        [
            (Level::WARN, "\"outbox.delivered\"", vec!["id".to_string()]),
            (Level::INFO, "events::NOT_LISTED", vec!["error".to_string()]),
        ]
    );
    let spelled: Vec<_> = literals(&code)
        .into_iter()
        .filter(|literal| looks_like_an_event_name(literal))
        .collect();
    assert_eq!(spelled, ["outbox.delivered", "job.started"]);
}
