//! The workspace's layout rules, read from the source files themselves:
//!
//! - no module imports a module that imports it back, in any package (a
//!   parent declaring or re-exporting its children does not count: that is
//!   composition, not use);
//! - where a crate's `# Layout` notes promise that each module imports only
//!   modules listed before (or after) it, the `use` lines agree, and every
//!   top-level module is in the list;
//! - no library file is over 800 lines.
//!
//! A plain reader of `use crate::…`, `super::…` and `self::…` paths (and of
//! paths through a child module's name), not a compiler: it skips comments
//! and a file's trailing `#[cfg(test)] mod tests { … }`, which may use
//! anything.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The packages whose library sources are checked, relative to the workspace
/// root. A folder that does not exist is skipped, so the list can name a
/// package before it lands.
const PACKAGES: &[&str] = &[
    "src",
    "actors/src",
    "brokers/src",
    "cli/src",
    "web/src",
    "bench/src",
];

/// The longest a library file may grow before it is split by concern.
const MAX_LINES: usize = 800;

type ModPath = Vec<String>;

struct Module {
    file: PathBuf,
    code: String,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every module file under `src`, by module path (`lib.rs`/`main.rs` is the
/// root, `a/mod.rs` and `a.rs` are `a`). Binaries under `src/bin` are crates
/// of their own and are left out.
fn modules(src: &Path) -> BTreeMap<ModPath, Module> {
    let mut found = BTreeMap::new();
    walk(src, src, &mut found);
    found
}

fn walk(src: &Path, dir: &Path, found: &mut BTreeMap<ModPath, Module>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        let relative = path.strip_prefix(src).unwrap();
        if path.is_dir() {
            if relative != Path::new("bin") {
                walk(src, &path, found);
            }
            continue;
        }
        if path.extension().is_none_or(|ext| ext != "rs") {
            continue;
        }
        let mut segments: ModPath = relative
            .with_extension("")
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if segments == ["lib"]
            || segments == ["main"]
            || segments.last().is_some_and(|s| s == "mod")
        {
            segments.pop();
        }
        let text = fs::read_to_string(&path).unwrap();
        found.insert(
            segments,
            Module {
                code: strip(&text),
                file: path,
            },
        );
    }
}

/// The file's code without comments, string contents and its trailing test
/// module.
fn strip(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let rest = &text[i..];
        if rest.starts_with("//") {
            let end = rest.find('\n').unwrap_or(rest.len());
            i += end;
        } else if rest.starts_with("/*") {
            let end = rest.find("*/").map_or(rest.len(), |e| e + 2);
            i += end;
        } else if rest.starts_with("r#\"") || rest.starts_with("r\"") {
            let hashes = rest[1..].chars().take_while(|&c| c == '#').count();
            let close = format!("\"{}", "#".repeat(hashes));
            let start = 2 + hashes;
            let end = rest[start..]
                .find(&close)
                .map_or(rest.len(), |e| start + e + close.len());
            out.push_str("\"\"");
            i += end;
        } else if rest.starts_with('"') {
            let mut j = 1;
            while j < rest.len() {
                match rest.as_bytes()[j] {
                    b'\\' => j += 2,
                    b'"' => break,
                    _ => j += 1,
                }
            }
            out.push_str("\"\"");
            i += (j + 1).min(rest.len());
        } else if rest.starts_with("'\"'") {
            i += 3;
        } else {
            let c = rest.chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    // A trailing unit-test module may reach anything it tests.
    if let Some(at) = out.rfind("#[cfg(test)]") {
        let after = out[at + "#[cfg(test)]".len()..].trim_start();
        if after.starts_with("mod ") && after.contains('{') {
            out.truncate(at);
        }
    }
    out
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The paths a use tree names: `a::{b, c::{d, e}}` gives `a::b`, `a::c::d`,
/// `a::c::e`.
fn expand_tree(tree: &str) -> Vec<Vec<String>> {
    let tree = tree
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace(" as ", "|");
    let tree: String = tree.chars().filter(|c| !c.is_whitespace()).collect();
    let mut paths = Vec::new();
    expand_into(&tree, Vec::new(), &mut paths);
    paths
}

fn expand_into(tree: &str, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    for item in split_top(tree) {
        let mut path = prefix.clone();
        let mut rest = item;
        loop {
            if let Some(inner) = rest.strip_prefix('{') {
                expand_into(inner.strip_suffix('}').unwrap_or(inner), path.clone(), out);
                break;
            }
            let end = rest.find("::").unwrap_or(rest.len());
            let segment: String = rest[..end]
                .chars()
                .take_while(|&c| is_ident_char(c))
                .collect();
            if !segment.is_empty() {
                path.push(segment);
            }
            if end == rest.len() {
                out.push(path);
                break;
            }
            rest = &rest[end + 2..];
        }
    }
}

/// Splits at the commas outside braces.
fn split_top(tree: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in tree.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&tree[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&tree[start..]);
    parts.into_iter().filter(|p| !p.is_empty()).collect()
}

/// The paths a module's code names, each with whether it sits in a `pub use`
/// (a re-export).
fn named_paths(code: &str) -> Vec<(Vec<String>, bool)> {
    let mut found = Vec::new();
    // The code with its use statements blanked, for the second pass: a
    // `pub use child::Item;` is a re-export, read here, not a use.
    let mut rest_of_code = code.to_string();
    // Use statements, braces expanded.
    let mut search = 0;
    while let Some(at) = code[search..].find("use ") {
        let start = search + at;
        search = start + 4;
        let before = code[..start].trim_end();
        let boundary = code[..start]
            .chars()
            .last()
            .is_none_or(|c| !is_ident_char(c));
        if !boundary {
            continue;
        }
        let reexport = before.ends_with("pub") || before.ends_with(')') && before.contains("pub(");
        let Some(end) = code[search..].find(';') else {
            break;
        };
        for path in expand_tree(&code[search..search + end]) {
            found.push((path, reexport));
        }
        rest_of_code.replace_range(start..search + end, &" ".repeat(search + end - start));
    }
    // Paths in code: `crate::a::b`, `super::x`, `child::y`.
    let chars: Vec<char> = rest_of_code.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let preceded = i > 0 && (is_ident_char(chars[i - 1]) || chars[i - 1] == ':');
        if !preceded && is_ident_char(chars[i]) {
            let mut path = Vec::new();
            let mut j = i;
            loop {
                let start = j;
                while j < chars.len() && is_ident_char(chars[j]) {
                    j += 1;
                }
                path.push(chars[start..j].iter().collect::<String>());
                if j + 2 < chars.len()
                    && chars[j] == ':'
                    && chars[j + 1] == ':'
                    && is_ident_char(chars[j + 2])
                {
                    j += 2;
                } else {
                    break;
                }
            }
            if path.len() > 1 {
                found.push((path, false));
            }
            i = j.max(i + 1);
        } else {
            i += 1;
        }
    }
    found
}

/// The module a path lands in, as seen from `from`: the longest known
/// module prefix. `None` for paths outside the crate.
fn resolve(from: &ModPath, path: &[String], known: &BTreeMap<ModPath, Module>) -> Option<ModPath> {
    let mut base: ModPath;
    let mut rest = path;
    match path.first().map(String::as_str) {
        Some("crate") => {
            base = Vec::new();
            rest = &path[1..];
        }
        Some("self") => {
            base = from.clone();
            rest = &path[1..];
        }
        Some("super") => {
            base = from.clone();
            while rest.first().is_some_and(|s| s == "super") {
                base.pop();
                rest = &rest[1..];
            }
        }
        Some(first) => {
            let mut child = from.clone();
            child.push(first.to_string());
            if !known.contains_key(&child) {
                return None;
            }
            base = from.clone();
        }
        None => return None,
    }
    let mut best = base.clone();
    for segment in rest {
        base.push(segment.clone());
        if known.contains_key(&base) {
            best = base.clone();
        } else {
            break;
        }
    }
    Some(best)
}

fn edges(known: &BTreeMap<ModPath, Module>) -> BTreeMap<ModPath, BTreeSet<ModPath>> {
    let mut graph: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
    for (from, module) in known {
        let out = graph.entry(from.clone()).or_default();
        for (path, reexport) in named_paths(&module.code) {
            let Some(to) = resolve(from, &path, known) else {
                continue;
            };
            let descendant = to.len() > from.len() && to.starts_with(from);
            if to == *from || (descendant && reexport) {
                continue;
            }
            // The crate root declares and re-exports everything.
            if from.is_empty() {
                continue;
            }
            out.insert(to);
        }
    }
    graph
}

fn name(path: &ModPath) -> String {
    if path.is_empty() {
        "crate".to_string()
    } else {
        path.join("::")
    }
}

/// The groups of modules that reach each other (strongly connected
/// components of more than one module), each with one circle through it.
fn circles(graph: &BTreeMap<ModPath, BTreeSet<ModPath>>) -> Vec<(Vec<ModPath>, Vec<ModPath>)> {
    let reach = |from: &ModPath| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(node) = todo.pop() {
            for next in graph.get(&node).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<_, _> = graph.keys().map(|n| (n.clone(), reach(n))).collect();
    let mut grouped = BTreeSet::new();
    let mut found = Vec::new();
    for node in graph.keys() {
        if grouped.contains(node) || !reached[node].contains(node) {
            continue;
        }
        let group: Vec<ModPath> = graph
            .keys()
            .filter(|other| reached[node].contains(*other) && reached[*other].contains(node))
            .cloned()
            .collect();
        grouped.extend(group.iter().cloned());
        // A shortest circle from `node` back to itself, by breadth-first search.
        let mut parent: BTreeMap<ModPath, ModPath> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([node.clone()]);
        'search: while let Some(at) = queue.pop_front() {
            for next in graph.get(&at).into_iter().flatten() {
                if next == node {
                    let mut circle = vec![at.clone()];
                    while circle.last() != Some(node) {
                        let back = parent[circle.last().unwrap()].clone();
                        circle.push(back);
                    }
                    circle.reverse();
                    circle.push(node.clone());
                    found.push((circle, group.clone()));
                    break 'search;
                }
                if !parent.contains_key(next) {
                    parent.insert(next.clone(), at.clone());
                    queue.push_back(next.clone());
                }
            }
        }
    }
    found
}

/// The top-level modules a crate root's `# Layout` notes list, in order, and
/// which way the promise runs: `true` when each imports only modules listed
/// before it. `None` when the notes make no such promise.
fn layout_order(root_file: &Path) -> Option<(Vec<String>, bool)> {
    let text = fs::read_to_string(root_file).unwrap();
    let docs: String = text
        .lines()
        .filter_map(|l| l.strip_prefix("//!"))
        .collect::<Vec<_>>()
        .join("\n");
    let flat = docs.split_whitespace().collect::<Vec<_>>().join(" ");
    let before = flat.contains("imports only modules listed before it");
    let after = flat.contains("imports only modules listed after it");
    if !before && !after {
        return None;
    }
    let mut order = Vec::new();
    for line in text.lines() {
        let Some(item) = line.strip_prefix("//! - ") else {
            continue;
        };
        let item = item.trim_start_matches('[');
        let Some(rest) = item.strip_prefix('`') else {
            continue;
        };
        let Some(end) = rest.find('`') else { continue };
        let module = &rest[..end];
        if module.chars().all(is_ident_char) {
            order.push(module.to_string());
        }
    }
    Some((order, before))
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let mut failures = Vec::new();
    for package in PACKAGES {
        let src = root().join(package);
        if !src.is_dir() {
            continue;
        }
        let known = modules(&src);
        let graph = edges(&known);
        for (circle, group) in circles(&graph) {
            let names: Vec<_> = circle.iter().map(name).collect();
            let members: Vec<_> = group.iter().map(name).collect();
            failures.push(format!(
                "{package}: {} (all of {} reach each other)",
                names.join(" → "),
                members.join(", ")
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "import circles:\n{}",
        failures.join("\n")
    );
}

#[test]
fn each_module_imports_only_what_the_layout_notes_allow() {
    let mut failures = Vec::new();
    for package in PACKAGES {
        let src = root().join(package);
        let lib = src.join("lib.rs");
        if !lib.is_file() {
            continue;
        }
        let Some((order, leaves_first)) = layout_order(&lib) else {
            continue;
        };
        let known = modules(&src);
        let position = |module: &str| order.iter().position(|m| m == module);
        for top in known.keys().filter(|p| p.len() == 1) {
            if position(&top[0]).is_none() {
                failures.push(format!(
                    "{package}: module `{}` is not in the layout notes",
                    top[0]
                ));
            }
        }
        for (from, targets) in edges(&known) {
            for to in targets {
                let (Some(a), Some(b)) = (from.first(), to.first()) else {
                    continue;
                };
                if a == b {
                    continue;
                }
                let (Some(pa), Some(pb)) = (position(a), position(b)) else {
                    continue;
                };
                let allowed = if leaves_first { pb < pa } else { pb > pa };
                if !allowed {
                    failures.push(format!(
                        "{package}: `{}` imports `{}`, listed {} it",
                        name(&from),
                        name(&to),
                        if leaves_first { "after" } else { "before" }
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "layout notes contradicted:\n{}",
        failures.join("\n")
    );
}

#[test]
fn no_library_file_is_over_800_lines() {
    let mut failures = Vec::new();
    for package in PACKAGES {
        let src = root().join(package);
        if !src.is_dir() {
            continue;
        }
        for module in modules(&src).values() {
            let lines = fs::read_to_string(&module.file).unwrap().lines().count();
            if lines > MAX_LINES {
                failures.push(format!("{}: {lines} lines", module.file.display()));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "files over {MAX_LINES} lines:\n{}",
        failures.join("\n")
    );
}

#[test]
fn the_reader_expands_use_trees() {
    let paths = expand_tree("crate::{a::B, c::{d, e::F as G}, h}");
    let expected: Vec<Vec<String>> = [
        vec!["crate", "a", "B"],
        vec!["crate", "c", "d"],
        vec!["crate", "c", "e", "F"],
        vec!["crate", "h"],
    ]
    .into_iter()
    .map(|p| p.into_iter().map(String::from).collect())
    .collect();
    assert_eq!(paths, expected);
}
