//! The README and the guide, built and run as a newcomer would: from a
//! crate of its own, outside this workspace, with nothing but the
//! `[dependencies]` the documents tell the reader to add.
//!
//! Doctests inside the workspace see every dev-dependency of the package
//! they run in, so a snippet that needs a crate the documents never mention
//! still passes there. Here each ```` ```rust ```` block of `README.md` and
//! of the guide (`docs/src/**/*.md`) becomes a binary of a generated crate
//! in `target/readme-crate/`, whose `Cargo.toml` is the `[dependencies]`
//! blocks of the README's Installation section and of the guide's pages,
//! with the repository's git address replaced by this checkout's path. Each
//! block is read as rustdoc reads it (lines hidden with `# ` included, a
//! block without `main` wrapped in one). Blocks marked `no_run` are built,
//! the others are built and run twice in a fresh directory (a first example
//! must survive a second run on its own database file); `ignore` blocks are
//! fragments and skipped. The crate keeps its own target directory, so only
//! the first run on a machine builds the dependencies.
//!
//! The other tests here read the same documents: every relative link, and
//! every link to a file by its address in this repository, resolves (to a
//! file of the checkout, and an `#anchor` to a heading of it), the guide's
//! `SUMMARY.md` names every page, and the observability page lists exactly
//! the tracing events and metrics the runtime's source emits, and the
//! operating page every command and flag of the `outbox` command line.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// The address the Installation section depends on, replaced by a path.
const REPOSITORY: &str = "https://github.com/outbox-rs/outbox";

/// Where each package of the repository lives, relative to its root.
const PACKAGES: &[(&str, &str)] = &[
    ("outbox", "."),
    ("outbox-actors", "actors"),
    ("outbox-brokers", "brokers"),
    ("outbox-web", "web"),
];

/// Longest a snippet may run before it counts as hung.
const RUN_LIMIT: Duration = Duration::from_secs(120);

/// The guide's sources, relative to the repository's root.
const GUIDE: &str = "docs/src";

/// The guide's page that must list every tracing event and metric.
const OBSERVABILITY: &str = "docs/src/observability.md";

/// The guide's page that must describe every command and flag of `outbox`.
const OPERATING: &str = "docs/src/operating.md";

/// The `outbox` command's command line, as clap reads it.
const CLI: &str = "cli/src/cli.rs";

/// A document read for its snippets and links.
struct Document {
    /// Its path relative to the repository's root, to name it in failures.
    path: String,
    text: String,
}

struct Snippet {
    /// The document it comes from.
    source: String,
    /// The line its fence opens on, to name it in failures.
    line: usize,
    /// The binary it becomes: named after its document and line.
    bin: String,
    code: String,
    run: bool,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the examples package sits inside the repository")
        .to_path_buf()
}

fn read(root: &Path, path: &str) -> Document {
    let text = fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("read {path}: {e}"));
    Document {
        path: path.to_owned(),
        text,
    }
}

/// Every markdown file under `dir` (relative to `root`), sorted.
fn markdown_under(root: &Path, dir: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut pending = vec![root.join(dir)];
    while let Some(dir) = pending.pop() {
        let entries = fs::read_dir(&dir).unwrap_or_else(|e| panic!("list {}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|ext| ext == "md") {
                let relative = path.strip_prefix(root).expect("found under the root");
                found.push(relative.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    found.sort();
    found
}

/// The guide's pages (`SUMMARY.md` included).
fn guide(root: &Path) -> Vec<Document> {
    markdown_under(root, GUIDE)
        .iter()
        .map(|path| read(root, path))
        .collect()
}

/// The section of `readme` under `heading`, up to the next `## ` heading.
fn section<'a>(readme: &'a str, heading: &str) -> &'a str {
    let start = readme
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("the README has no `{heading}` section"));
    let body = &readme[start + heading.len() + 2..];
    body.find("\n## ").map_or(body, |end| &body[..end])
}

/// The fenced blocks of `text` as (info string, first line number, body).
fn fences(text: &str) -> Vec<(String, usize, String)> {
    let mut blocks = Vec::new();
    let mut open: Option<(String, usize, String)> = None;
    for (number, line) in text.lines().enumerate() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(info)) => open = Some((info.trim().to_owned(), number + 1, String::new())),
            (Some(_), Some("")) => blocks.extend(open.take()),
            (Some((_, _, body)), _) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "a document ends inside a fenced block");
    blocks
}

/// `docs/src/stores.md` → `guide_stores`, `README.md` → `readme`: a name
/// a binary may take.
fn bin_prefix(path: &str) -> String {
    let stem = path
        .strip_prefix(GUIDE)
        .map(|page| format!("guide{page}"))
        .unwrap_or_else(|| path.to_owned());
    let stem = stem.strip_suffix(".md").unwrap_or(&stem);
    stem.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect()
}

fn snippets(document: &Document) -> Vec<Snippet> {
    fences(&document.text)
        .into_iter()
        .filter_map(|(info, line, code)| {
            let mut words = info.split(',').map(str::trim);
            if words.next() != Some("rust") {
                return None;
            }
            let words: Vec<&str> = words.collect();
            if words.contains(&"ignore") {
                return None;
            }
            Some(Snippet {
                source: document.path.clone(),
                line,
                bin: format!("{}_line_{line}", bin_prefix(&document.path)),
                code: as_program(&code),
                run: !words.contains(&"no_run"),
            })
        })
        .collect()
}

/// The program a snippet stands for, read the way rustdoc reads it: lines
/// hidden with `# ` are part of it, and a snippet without a `main` is the
/// body of one.
fn as_program(code: &str) -> String {
    let mut program = String::new();
    for line in code.lines() {
        let trimmed = line.trim_start();
        let shown = if trimmed == "#" {
            ""
        } else if let Some(hidden) = trimmed.strip_prefix("# ") {
            hidden
        } else {
            line
        };
        program.push_str(shown);
        program.push('\n');
    }
    if program.contains("fn main") {
        program
    } else {
        format!("fn main() {{\n{program}}}\n")
    }
}

/// One `name = value` line of a `[dependencies]` table, with its features
/// parsed out so two blocks naming one crate can be merged.
#[derive(Debug)]
struct Dependency {
    /// The value without its `features = [...]` entry.
    rest: String,
    features: Vec<String>,
}

/// The `[dependencies]` a reader is told to add: every ```` ```toml ````
/// block opening with that table in the README's Installation section and
/// in the guide's pages, merged by crate (features added up), with the
/// repository's git address replaced by this checkout's path. A guide
/// page's `[dev-dependencies]` block counts too (a test's helpers belong
/// there): the snippets are binaries, so here they are dependencies.
fn dependencies(readme: &str, guide: &[Document], root: &Path) -> String {
    let mut sources = vec![(
        "the README's Installation section",
        section(readme, "## Installation"),
    )];
    sources.extend(
        guide
            .iter()
            .map(|page| (page.path.as_str(), page.text.as_str())),
    );
    let mut table: BTreeMap<String, Dependency> = BTreeMap::new();
    for (source, text) in sources {
        for (info, line, body) in fences(text) {
            let table_name = body.lines().next();
            if info != "toml"
                || !matches!(table_name, Some("[dependencies]" | "[dev-dependencies]"))
            {
                continue;
            }
            for entry in body.lines().skip(1).filter(|l| !l.trim().is_empty()) {
                let (name, value) = entry.split_once(" = ").unwrap_or_else(|| {
                    panic!("{source}, block at its line {line}: cannot read `{entry}`")
                });
                let (rest, features) = split_features(value.trim());
                let dependency = table.entry(name.trim().to_owned()).or_insert(Dependency {
                    rest: rest.clone(),
                    features: Vec::new(),
                });
                dependency.rest = rest;
                for feature in features {
                    if !dependency.features.contains(&feature) {
                        dependency.features.push(feature);
                    }
                }
            }
        }
    }
    assert!(
        table.contains_key("outbox-actors"),
        "the Installation section must list outbox-actors"
    );
    let mut toml = String::from("[dependencies]\n");
    for (name, dependency) in &table {
        let mut value = dependency.rest.clone();
        if value.contains(REPOSITORY) {
            let dir = PACKAGES
                .iter()
                .find(|(package, _)| package == name)
                .map(|(_, dir)| root.join(dir))
                .unwrap_or_else(|| panic!("{name} is not a package of this repository"));
            value = value.replace(
                &format!("git = \"{REPOSITORY}\""),
                &format!("path = {:?}", dir.display().to_string()),
            );
        }
        if !dependency.features.is_empty() {
            let list: Vec<String> = dependency
                .features
                .iter()
                .map(|f| format!("{f:?}"))
                .collect();
            value = match value.strip_suffix('}') {
                Some(open) => format!("{}, features = [{}] }}", open.trim_end(), list.join(", ")),
                None => format!("{{ version = {value}, features = [{}] }}", list.join(", ")),
            };
        }
        toml.push_str(&format!("{name} = {value}\n"));
    }
    toml
}

/// `{ a = 1, features = ["x", "y"] }` → (`{ a = 1 }`, [x, y]).
fn split_features(value: &str) -> (String, Vec<String>) {
    let Some(start) = value.find("features = [") else {
        return (value.to_owned(), Vec::new());
    };
    let end = start + value[start..].find(']').expect("a closed features list") + 1;
    let features = value[start + "features = [".len()..end - 1]
        .split(',')
        .map(|f| f.trim().trim_matches('"').to_owned())
        .filter(|f| !f.is_empty())
        .collect();
    let rest = format!("{}{}", &value[..start], &value[end..]);
    let rest = rest
        .replace(", ,", ",")
        .replace(",  }", " }")
        .replace(", }", " }");
    (rest, features)
}

/// The README line the first example's fence opens on: the first `rust`
/// block under `## A first delivery`.
fn first_example_line(readme: &str) -> usize {
    let heading = readme
        .lines()
        .position(|line| line == "## A first delivery")
        .expect("the README has a `## A first delivery` section");
    readme
        .lines()
        .enumerate()
        .skip(heading)
        .find(|(_, line)| line.starts_with("```rust"))
        .map(|(number, _)| number + 1)
        .expect("`## A first delivery` has a rust block")
}

fn cargo() -> Command {
    let mut command = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    // What the outer `cargo test` set for its own build must not steer the
    // inner one.
    for var in [
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET_DIR",
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
    ] {
        command.env_remove(var);
    }
    // The snippets' crate keeps a target directory of its own; without debug
    // info it takes about a third of the disk (0.7 GB against 1.9 GB).
    command.env("CARGO_PROFILE_DEV_DEBUG", "false");
    command
}

fn text(output: &Output) -> String {
    format!(
        "status {}\n--- stdout\n{}--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Run `binary` in `dir`, killed if it outlives [`RUN_LIMIT`].
fn run(binary: &Path, dir: &Path) -> Output {
    let mut child = Command::new(binary)
        .current_dir(dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start a snippet");
    let started = Instant::now();
    while child.try_wait().expect("poll the snippet").is_none() {
        if started.elapsed() > RUN_LIMIT {
            child.kill().ok();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child
        .wait_with_output()
        .expect("collect the snippet's output")
}

#[test]
fn every_readme_and_guide_snippet_builds_and_runs_outside_the_workspace() {
    let root = root();
    let readme = read(&root, "README.md");
    let guide = guide(&root);
    let mut snippets = snippets(&readme);
    let first_example = first_example_line(&readme.text);
    assert!(
        snippets.iter().any(|s| s.line == first_example && s.run),
        "the first example must be a snippet that runs"
    );
    for page in &guide {
        snippets.extend(self::snippets(page));
    }

    let krate = root.join("target/readme-crate");
    let bins = krate.join("src/bin");
    // Snippets removed from the documents must not linger as binaries.
    let _ = fs::remove_dir_all(&bins);
    fs::create_dir_all(&bins).expect("create the snippet crate");
    let manifest = format!(
        "[package]\nname = \"readme-snippets\"\nversion = \"0.0.0\"\nedition = \"2024\"\n\
         publish = false\n\n# Not a member of the repository's workspace.\n[workspace]\n\n{}",
        dependencies(&readme.text, &guide, &root)
    );
    fs::write(krate.join("Cargo.toml"), manifest).expect("write the snippet crate's manifest");
    // The workspace's lock file, so the snippets build against the versions
    // the repository is tested with.
    if !krate.join("Cargo.lock").exists() {
        fs::copy(root.join("Cargo.lock"), krate.join("Cargo.lock")).expect("copy Cargo.lock");
    }
    for snippet in &snippets {
        fs::write(bins.join(format!("{}.rs", snippet.bin)), &snippet.code)
            .expect("write a snippet");
    }

    let build = cargo()
        .args(["build", "--bins", "--quiet", "--manifest-path"])
        .arg(krate.join("Cargo.toml"))
        .output()
        .expect("run cargo");
    assert!(
        build.status.success(),
        "the snippets do not build from a crate with only the dependencies the README and \
         the guide list (binaries are named after the document and line of their fence):\n{}",
        text(&build)
    );

    for snippet in &snippets {
        if !snippet.run {
            continue;
        }
        let binary = krate.join("target/debug").join(&snippet.bin);
        let dir = krate.join("runs").join(&snippet.bin);
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("create a run directory");
        for round in 1..=2 {
            let output = run(&binary, &dir);
            assert!(
                output.status.success(),
                "{} line {}: run {round} of the snippet failed:\n{}",
                snippet.source,
                snippet.line,
                text(&output)
            );
            let stdout = String::from_utf8_lossy(&output.stdout);
            println!(
                "{} line {} run {round}: {}",
                snippet.source,
                snippet.line,
                stdout.trim()
            );
            if snippet.source == readme.path && snippet.line == first_example {
                // Each run places one order on the same database file and
                // its pass delivers exactly that one.
                assert!(
                    stdout.contains(&format!("shipping order {round}\n"))
                        && stdout.contains("claimed 1, delivered 1,"),
                    "README line {}: run {round} should ship order {round} in a pass that \
                     delivers one message:\n{}",
                    snippet.line,
                    text(&output)
                );
            }
        }
    }
}

/// `text` without its fenced blocks: their lines are kept empty, so line
/// numbers still count from the top.
fn prose(text: &str) -> Vec<String> {
    let mut fenced = false;
    text.lines()
        .map(|line| {
            let fence =
                line.trim_start().starts_with("```") || line.trim_start().starts_with("~~~");
            if fence {
                fenced = !fenced;
                return String::new();
            }
            if fenced {
                String::new()
            } else {
                without_code_spans(line)
            }
        })
        .collect()
}

/// `line` with its inline code spans removed: what is inside backticks is
/// not a link.
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let ticks = rest[start..].len() - rest[start..].trim_start_matches('`').len();
        let after = &rest[start + ticks..];
        let closing = "`".repeat(ticks);
        match after.find(&closing) {
            Some(end) => rest = &after[end + ticks..],
            // An unclosed run of backticks is literal text.
            None => {
                out.push_str(&rest[start..]);
                return out;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The targets of the links of `text`, with the line of each: inline links
/// and images (`[text](target "title")`) and reference definitions
/// (`[label]: target`).
fn links(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (index, line) in prose(text).iter().enumerate() {
        let number = index + 1;
        let trimmed = line.trim_start();
        if trimmed.starts_with('[')
            && let Some(close) = trimmed.find("]:")
            && !trimmed[..close].contains('(')
        {
            if let Some(target) = trimmed[close + 2..].split_whitespace().next() {
                found.push((number, target.trim_matches(['<', '>']).to_owned()));
            }
            continue;
        }
        let mut rest = line.as_str();
        while let Some(start) = rest.find("](") {
            let after = &rest[start + 2..];
            let mut depth = 0;
            let mut end = after.len();
            for (i, c) in after.char_indices() {
                match c {
                    '(' => depth += 1,
                    ')' if depth == 0 => {
                        end = i;
                        break;
                    }
                    ')' => depth -= 1,
                    _ => {}
                }
            }
            let target = after[..end].trim();
            let target = target.split_whitespace().next().unwrap_or("");
            found.push((number, target.trim_matches(['<', '>']).to_owned()));
            rest = &after[end.min(after.len())..];
        }
    }
    found
}

/// The anchor a heading gets, as GitHub and mdBook make it: lower case,
/// letters, digits, `-` and `_` kept, spaces turned into `-`, the rest
/// dropped.
fn slug(heading: &str) -> String {
    heading
        .chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '-' || c == '_' {
                Some(c.to_lowercase().collect::<String>())
            } else if c.is_whitespace() {
                Some("-".to_owned())
            } else {
                None
            }
        })
        .collect()
}

/// Every anchor the headings of a markdown text define; a heading that
/// repeats gets `-1`, `-2`, ... after the first.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut anchors = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") || line.trim_start().starts_with("~~~") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let hashes = line.len() - line.trim_start_matches('#').len();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(line[hashes..].trim());
        let count = seen.entry(base.clone()).or_insert(0);
        anchors.insert(if *count == 0 {
            base.clone()
        } else {
            format!("{base}-{count}")
        });
        *count += 1;
    }
    anchors
}

#[test]
fn every_relative_link_resolves_to_a_file_and_its_anchor_to_a_heading() {
    let root = root();
    let mut documents = vec![read(&root, "README.md"), read(&root, "BENCHMARKS.md")];
    documents.extend(guide(&root));
    let mut broken = Vec::new();
    let mut checked = 0;
    for document in &documents {
        let dir = Path::new(&document.path)
            .parent()
            .expect("a document's folder")
            .to_path_buf();
        for (line, target) in links(&document.text) {
            if target.is_empty() {
                broken.push(format!("{}:{line}: a link with no target", document.path));
                continue;
            }
            // The book links to files outside it by their address in the
            // repository, which must name a file of this checkout too.
            let in_repository = target.strip_prefix(&format!("{REPOSITORY}/blob/main/"));
            if in_repository.is_none() && (target.contains("://") || target.starts_with("mailto:"))
            {
                continue;
            }
            checked += 1;
            let local = in_repository.unwrap_or(&target);
            let (path, anchor) = local.split_once('#').unwrap_or((local, ""));
            let file = if in_repository.is_some() {
                PathBuf::from(path)
            } else if path.is_empty() {
                PathBuf::from(&document.path)
            } else {
                dir.join(path)
            };
            let on_disk = root.join(&file);
            if !on_disk.exists() {
                broken.push(format!(
                    "{}:{line}: `{target}`: no file {}",
                    document.path,
                    file.display()
                ));
                continue;
            }
            if anchor.is_empty() {
                continue;
            }
            if on_disk.extension().is_none_or(|ext| ext != "md") {
                broken.push(format!(
                    "{}:{line}: `{target}`: an anchor into a file that is not markdown",
                    document.path
                ));
                continue;
            }
            let text = fs::read_to_string(&on_disk).expect("read a linked document");
            if !anchors(&text).contains(anchor) {
                broken.push(format!(
                    "{}:{line}: `{target}`: {} has no heading `#{anchor}`",
                    document.path,
                    file.display()
                ));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    assert!(
        checked > 50,
        "only {checked} links into the repository found: is the reader broken?"
    );
}

#[test]
fn the_guide_summary_names_every_page() {
    let root = root();
    let summary = read(&root, &format!("{GUIDE}/SUMMARY.md"));
    let listed: BTreeSet<String> = links(&summary.text)
        .into_iter()
        .map(|(_, target)| format!("{GUIDE}/{target}"))
        .collect();
    let missing: Vec<String> = markdown_under(&root, GUIDE)
        .into_iter()
        .filter(|page| !page.ends_with("/SUMMARY.md") && !listed.contains(page))
        .collect();
    assert!(
        missing.is_empty(),
        "pages that SUMMARY.md does not list (mdbook would not render them): {missing:?}"
    );
}

/// The string literals of the runtime's sources that `wanted` accepts.
fn runtime_literals(root: &Path, wanted: impl Fn(&str) -> bool) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut pending = vec![root.join("actors/src")];
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir).expect("list the runtime's sources") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                pending.push(path);
                continue;
            }
            if path.extension().is_none_or(|ext| ext != "rs") {
                continue;
            }
            let source = fs::read_to_string(&path).expect("read a runtime source");
            for (i, piece) in source.split('"').enumerate() {
                // Odd pieces sit between quotes; the names have no escapes.
                if i % 2 == 1 && wanted(piece) {
                    found.insert(piece.to_owned());
                }
            }
        }
    }
    found
}

/// A metric name: `outbox_` and lower-case words.
fn is_metric_name(text: &str) -> bool {
    text.strip_prefix("outbox_")
        .is_some_and(|w| !w.is_empty() && w.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
}

/// The first cells of the table rows under `heading` (up to the next
/// heading of the same level), without their backticks.
fn first_cells(page: &str, heading: &str) -> BTreeSet<String> {
    let start = page
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("{OBSERVABILITY} has no `{heading}` section"));
    let body = &page[start + heading.len() + 2..];
    let body = body.find("\n## ").map_or(body, |end| &body[..end]);
    body.lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|cell| cell.split_once('`').map(|(name, _)| name.to_owned()))
        .collect()
}

/// The rows of the table under `heading` (up to the next heading of the
/// same level), keyed by their first cell without its backticks, each with
/// its other cells.
fn table_rows(page: &str, heading: &str) -> BTreeMap<String, Vec<String>> {
    let start = page
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("{OBSERVABILITY} has no `{heading}` section"));
    let body = &page[start + heading.len() + 2..];
    let body = body.find("\n## ").map_or(body, |end| &body[..end]);
    body.lines()
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
fn the_observability_page_lists_every_event_and_metric_the_runtime_emits() {
    let root = root();
    let page = read(&root, OBSERVABILITY).text;

    // Events: the runtime's own list, with each one's levels and fields.
    let rows = table_rows(&page, "## Events");
    let mut wrong = Vec::new();
    for event in outbox_actors::events::ALL {
        let Some(cells) = rows.get(event.name) else {
            wrong.push(format!("`{}` is emitted but not listed", event.name));
            continue;
        };
        let (level, fields) = (&cells[0], &cells[1]);
        for expected in std::iter::once(&event.level).chain(event.other_levels) {
            let expected = expected.as_str().to_ascii_lowercase();
            if !level
                .split(|c: char| !c.is_ascii_alphabetic())
                .any(|w| w == expected)
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
    for listed in rows.keys() {
        if !outbox_actors::events::ALL.iter().any(|e| e.name == listed) {
            wrong.push(format!(
                "`{listed}` is listed but the runtime never emits it"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{OBSERVABILITY}'s events table is out of date:\n{}",
        wrong.join("\n")
    );

    // Metrics: every name the runtime's sources record.
    let metrics = runtime_literals(&root, is_metric_name);
    assert!(
        metrics.contains("outbox_delivered_total"),
        "the runtime's metric names were not found in actors/src"
    );
    let listed_metrics = first_cells(&page, "## Metrics");
    let unlisted: Vec<_> = metrics.difference(&listed_metrics).collect();
    let stale: Vec<_> = listed_metrics.difference(&metrics).collect();
    assert!(
        unlisted.is_empty() && stale.is_empty(),
        "{OBSERVABILITY}'s metrics table is out of date: recorded but not listed {unlisted:?}; \
         listed but not recorded {stale:?}"
    );
}

/// The subcommands and the long flags `outbox` declares in [`CLI`]: each
/// variant of `enum Command` lower-cased, and each field of its argument
/// structs as `--field-name` (positional ids and flattened groups aside).
fn cli_commands_and_flags(source: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut commands = BTreeSet::new();
    let mut flags = BTreeSet::new();
    let mut in_commands = false;
    for line in source.lines() {
        let line = line.trim();
        if line.starts_with("pub(crate) enum Command") {
            in_commands = true;
            continue;
        }
        if in_commands {
            if line == "}" {
                in_commands = false;
            } else if line.starts_with(|c: char| c.is_ascii_uppercase()) {
                let name: String = line
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric())
                    .collect();
                commands.insert(name.to_ascii_lowercase());
            }
            continue;
        }
        if let Some(field) = line.strip_prefix("pub(crate) ")
            && let Some((name, _)) = field.split_once(':')
            && !name.contains(' ')
            && !["command", "run", "id"].contains(&name)
        {
            flags.insert(format!("--{}", name.replace('_', "-")));
        }
    }
    (commands, flags)
}

#[test]
fn the_operating_page_describes_every_command_and_flag_of_the_cli() {
    let root = root();
    let page = read(&root, OPERATING).text;
    let (commands, flags) = cli_commands_and_flags(&read(&root, CLI).text);
    assert!(
        commands.contains("drain") && flags.contains("--database") && flags.contains("--to"),
        "the commands and flags of {CLI} were not found: {commands:?} {flags:?}"
    );
    let missing_commands: Vec<_> = commands
        .iter()
        .filter(|command| !page.contains(&format!("\n### {command}\n")))
        .collect();
    // A flag is described where it stands in backticks, alone or with its
    // value: `--lease DURATION`, `--json`.
    let missing_flags: Vec<_> = flags
        .iter()
        .filter(|flag| !page.contains(&format!("`{flag}`")) && !page.contains(&format!("`{flag} ")))
        .collect();
    assert!(
        missing_commands.is_empty() && missing_flags.is_empty(),
        "{OPERATING} does not describe every command and flag of {CLI}: commands without a \
         `### name` section {missing_commands:?}, flags never shown {missing_flags:?}"
    );
}

#[test]
fn the_link_reader_finds_links_and_anchors_as_renderers_do() {
    let text = "# Top\n\nSee [a](b.md#x-y) and ![img](pic.png \"title\"), \
                not `[c](d.md)`.\n\n```text\n[e](f.md)\n```\n\n[label]: g.md\n\n\
                ## The `outbox` command: every flag\n## Top\n";
    let targets: Vec<String> = links(text).into_iter().map(|(_, t)| t).collect();
    assert_eq!(targets, ["b.md#x-y", "pic.png", "g.md"]);
    let anchors = anchors(text);
    assert!(
        anchors.contains("top") && anchors.contains("top-1"),
        "{anchors:?}"
    );
    assert!(
        anchors.contains("the-outbox-command-every-flag"),
        "{anchors:?}"
    );
    assert_eq!(bin_prefix("docs/src/stores.md"), "guide_stores");
    assert_eq!(bin_prefix("README.md"), "readme");
}
