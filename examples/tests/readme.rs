//! The README, built and run as a newcomer would: from a crate of its own,
//! outside this workspace, with nothing but the `[dependencies]` the README's
//! Installation section lists.
//!
//! Doctests inside the workspace see every dev-dependency of the package
//! they run in, so a snippet that needs a crate the README never mentions
//! still passes there. Here each ```` ```rust ```` block becomes a binary of a
//! generated crate in `target/readme-crate/`, whose `Cargo.toml` is the
//! Installation section's blocks with the repository's git address replaced
//! by this checkout's path. Each block is read as rustdoc reads it (lines
//! hidden with `# ` included, a block without `main` wrapped in one). Blocks
//! marked `no_run` are built, the others are built and run twice in a fresh
//! directory (a first example must survive a second run on its own database
//! file); `ignore` blocks are fragments and skipped. The crate keeps its own target directory, so only the first run
//! on a machine builds the dependencies.

use std::collections::BTreeMap;
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

struct Snippet {
    /// The README line its fence opens on, to name it in failures.
    line: usize,
    code: String,
    run: bool,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the examples package sits inside the repository")
        .to_path_buf()
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
    assert!(open.is_none(), "the README ends inside a fenced block");
    blocks
}

fn snippets(readme: &str) -> Vec<Snippet> {
    fences(readme)
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
                line,
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

/// The `[dependencies]` of the Installation section: every ```` ```toml ````
/// block opening with that table, merged by crate (features added up), with
/// the repository's git address replaced by this checkout's path.
fn dependencies(readme: &str, root: &Path) -> String {
    let mut table: BTreeMap<String, Dependency> = BTreeMap::new();
    for (info, line, body) in fences(section(readme, "## Installation")) {
        if info != "toml" || body.lines().next() != Some("[dependencies]") {
            continue;
        }
        for entry in body.lines().skip(1).filter(|l| !l.trim().is_empty()) {
            let (name, value) = entry.split_once(" = ").unwrap_or_else(|| {
                panic!("Installation section, block at its line {line}: cannot read `{entry}`")
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
        .expect("start a README snippet");
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
fn every_readme_snippet_builds_and_runs_outside_the_workspace() {
    let root = root();
    let readme = fs::read_to_string(root.join("README.md")).expect("read README.md");
    let snippets = snippets(&readme);
    let first_example = first_example_line(&readme);
    assert!(
        snippets.iter().any(|s| s.line == first_example && s.run),
        "the first example must be a snippet that runs"
    );

    let krate = root.join("target/readme-crate");
    let bins = krate.join("src/bin");
    // Snippets removed from the README must not linger as binaries.
    let _ = fs::remove_dir_all(&bins);
    fs::create_dir_all(&bins).expect("create the snippet crate");
    let manifest = format!(
        "[package]\nname = \"readme-snippets\"\nversion = \"0.0.0\"\nedition = \"2024\"\n\
         publish = false\n\n# Not a member of the repository's workspace.\n[workspace]\n\n{}",
        dependencies(&readme, &root)
    );
    fs::write(krate.join("Cargo.toml"), manifest).expect("write the snippet crate's manifest");
    // The workspace's lock file, so the snippets build against the versions
    // the repository is tested with.
    if !krate.join("Cargo.lock").exists() {
        fs::copy(root.join("Cargo.lock"), krate.join("Cargo.lock")).expect("copy Cargo.lock");
    }
    let names: Vec<String> = snippets
        .iter()
        .map(|snippet| format!("readme_line_{}", snippet.line))
        .collect();
    for (snippet, name) in snippets.iter().zip(&names) {
        fs::write(bins.join(format!("{name}.rs")), &snippet.code).expect("write a snippet");
    }

    let build = cargo()
        .args(["build", "--bins", "--quiet", "--manifest-path"])
        .arg(krate.join("Cargo.toml"))
        .output()
        .expect("run cargo");
    assert!(
        build.status.success(),
        "the README's snippets do not build from a crate with only the Installation \
         section's dependencies (binaries are named after the README line of their fence):\n{}",
        text(&build)
    );

    for (snippet, name) in snippets.iter().zip(&names) {
        if !snippet.run {
            continue;
        }
        let binary = krate.join("target/debug").join(name);
        let dir = krate.join("runs").join(name);
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("create a run directory");
        for round in 1..=2 {
            let output = run(&binary, &dir);
            assert!(
                output.status.success(),
                "README line {}: run {round} of the snippet failed:\n{}",
                snippet.line,
                text(&output)
            );
            let stdout = String::from_utf8_lossy(&output.stdout);
            println!(
                "README line {} run {round}: {}",
                snippet.line,
                stdout.trim()
            );
            if snippet.line == first_example {
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
