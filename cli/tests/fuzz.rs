//! Generated command lines through the `outbox` command: many parsed in
//! process by its clap definition, and a few run by the binary against a
//! SQLite file with hostile table names. A bad argument is a usage error,
//! never a panic, and nothing is written outside the outbox's own table.
//!
//! Every target counts its cases; CI adds the counts of all packages up.

// The command line's definition, compiled into this test as it is into the
// binary: the binary has no library to call it through.
#[path = "../src/cli.rs"]
#[allow(dead_code, unreachable_pub)]
mod cli;

#[path = "../../tests/fuzzing/mod.rs"]
mod fuzzing;

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::{CommandFactory, Parser};
use proptest::prelude::*;

use crate::cli::Cli;

use fuzzing::{ensure, fuzz};

/// Every subcommand and every flag the command line defines, read from the
/// definition itself so the fuzzer follows it when flags are added.
fn vocabulary() -> (Vec<String>, Vec<String>) {
    let command = Cli::command();
    let mut subcommands = Vec::new();
    let mut flags = BTreeSet::new();
    let mut add_flags = |command: &clap::Command| {
        for arg in command.get_arguments() {
            if let Some(long) = arg.get_long() {
                flags.insert(format!("--{long}"));
            }
            if let Some(short) = arg.get_short() {
                flags.insert(format!("-{short}"));
            }
        }
    };
    add_flags(&command);
    for sub in command.get_subcommands() {
        subcommands.push(sub.get_name().to_owned());
        add_flags(sub);
    }
    for extra in ["--help", "-h", "--version", "-V", "--", "-", "--=", "-x"] {
        flags.insert(extra.to_owned());
    }
    subcommands.push("help".to_owned());
    (subcommands, flags.into_iter().collect())
}

/// A value a flag might be given.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "0",
            "1",
            "10000",
            "10001",
            "-1",
            "4294967296",
            "18446744073709551616",
            "30s",
            "0s",
            "1ms",
            "7d",
            "366d",
            "1h 30m",
            "5 m",
            "1e3",
            "pending",
            "claimed",
            "delivered",
            "dead_lettered",
            "DEAD_LETTERED",
            "nats://127.0.0.1:1",
            "redis://[::1]:1",
            "amqp://u:p@h:1/%2f",
            "kafka://x",
            "127.0.0.1:0",
            "[::1]:99999",
            "0.0.0.0:1",
            "sqlite://",
            "sqlite::memory:",
            "postgres://u:secret@127.0.0.1:1/db",
            "",
            " ",
            "=",
            "\u{0}",
        ])
        .prop_map(str::to_owned),
        "[0-9]{1,25}(ns|us|ms|s|m|h|d|w|y)?",
        ".{0,12}",
    ]
}

/// One word of a command line.
fn token(subcommands: Vec<String>, flags: Vec<String>) -> impl Strategy<Value = OsString> {
    let flag = prop::sample::select(flags);
    prop_oneof![
        3 => flag.clone().prop_map(OsString::from),
        2 => prop::sample::select(subcommands).prop_map(OsString::from),
        3 => value().prop_map(OsString::from),
        2 => (flag, value()).prop_map(|(f, v)| OsString::from(format!("{f}={v}"))),
        1 => prop::collection::vec(any::<u8>(), 0..6).prop_map(not_utf8),
    ]
}

/// Bytes as an argument, as a shell hands them over, UTF-8 or not.
fn not_utf8(bytes: Vec<u8>) -> OsString {
    use std::os::unix::ffi::OsStringExt;
    OsString::from_vec(bytes.into_iter().filter(|b| *b != 0).collect())
}

#[test]
fn command_lines_in_process() {
    let (subcommands, flags) = vocabulary();
    let argv = (
        prop::sample::select(subcommands.clone()),
        prop::collection::vec(token(subcommands, flags), 0..8),
        any::<prop::sample::Index>(),
    )
        .prop_map(|(sub, mut words, at)| {
            // Mostly a subcommand somewhere, as people write them.
            let at = at.index(words.len() + 1);
            words.insert(at, OsString::from(sub));
            words
        });
    fuzz("argv", 20_000, argv, |words| {
        let argv = std::iter::once(OsString::from("outbox")).chain(words.iter().cloned());
        match Cli::try_parse_from(argv) {
            Ok(cli) => {
                // What parsed holds to what the flags promise.
                if let cli::Command::List(list) = &cli.command {
                    ensure((1..=10_000).contains(&list.limit), || {
                        format!("{words:?} lists {} messages", list.limit)
                    })?;
                }
                let _ = format!("{cli:?}");
            }
            Err(error) => {
                let code = error.exit_code();
                ensure(code == 0 || code == 2, || {
                    format!("{words:?} exits with {code}: {error}")
                })?;
                let _ = error.render().to_string();
            }
        }
        Ok(())
    });
}

/// Hostile and valid table names, as `--table` takes them.
fn table_name() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => "[a-z_][a-z0-9_]{0,12}",
        2 => prop::sample::select(vec![
            "outbox\"; DROP TABLE sentinel; --",
            "sentinel",
            "sqlite_master",
            "main.outbox",
            "temp.jobs",
            "x'",
            "a.b.c",
            "",
            "outbox ",
            "ünïcode",
        ])
        .prop_map(str::to_owned),
        1 => "[A-Za-z0-9_.;\"' -]{0,16}",
    ]
}

/// The schema of a SQLite file and its sentinel's rows, through the
/// `sqlite3`-free way: a read-only connection of the library's driver.
fn schema(path: &Path) -> Snapshot {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let options = sqlx::sqlite::SqliteConnectOptions::new()
                .filename(path)
                .read_only(true);
            let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
            let objects: Vec<(String, String)> =
                sqlx::query_as("SELECT type, name FROM sqlite_master")
                    .fetch_all(&pool)
                    .await
                    .unwrap();
            let rows = sqlx::query_as("SELECT id, note FROM sentinel ORDER BY id")
                .fetch_all(&pool)
                .await
                .unwrap();
            pool.close().await;
            (objects.into_iter().collect(), rows)
        })
}

/// A database's schema objects (type, name) and its sentinel's rows.
type Snapshot = (BTreeSet<(String, String)>, Vec<(i64, String)>);

/// A command the binary runs briefly; `drain` and `relay` only once.
fn command() -> impl Strategy<Value = Vec<String>> {
    let words = |w: &[&str]| w.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    prop_oneof![
        Just(words(&["migrate"])),
        Just(words(&["status"])),
        Just(words(&["status", "--json"])),
        Just(words(&["list", "--json"])),
        Just(words(&["requeue", "--all-dead-lettered"])),
        Just(words(&[
            "purge",
            "--status",
            "delivered",
            "--older-than",
            "1d",
            "--yes"
        ])),
        Just(words(&["drain", "--once", "--print"])),
        Just(words(&["relay", "--once", "--to", "mqtt://127.0.0.1:1"])),
        Just(words(&["web", "--bind", "0.0.0.0:1"])),
        value().prop_map(|id| vec!["show".to_owned(), id]),
        value().prop_map(|id| vec!["skip".to_owned(), id]),
        value().prop_map(|id| vec!["list".to_owned(), "--after".to_owned(), id]),
    ]
}

#[test]
fn the_binary_with_hostile_tables() {
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("fuzz-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("outbox.db");
    let url = format!("sqlite://{}", file.display());
    let run = |args: &[String]| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_outbox"))
            .arg("--database")
            .arg(&url)
            .args(args)
            .env_remove("OUTBOX_TABLE")
            .env_remove("OUTBOX_DATABASE_URL")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the outbox binary");
        // A command that goes on (a dashboard that did bind) is stopped:
        // only its exit, not its running, is under test.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                let mut stderr = String::new();
                use std::io::Read;
                child
                    .stderr
                    .take()
                    .unwrap()
                    .read_to_string(&mut stderr)
                    .unwrap();
                return (status.code(), stderr);
            }
            if Instant::now() > deadline {
                child.kill().unwrap();
                child.wait().unwrap();
                return (Some(0), String::new());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let (code, stderr) = run(&["migrate".to_owned()]);
    assert_eq!(code, Some(0), "{stderr}");
    {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
            sqlx::raw_sql(
                "CREATE TABLE sentinel (id INTEGER PRIMARY KEY, note TEXT NOT NULL); \
                 INSERT INTO sentinel (note) VALUES ('one'), ('two');",
            )
            .execute(&pool)
            .await
            .unwrap();
            pool.close().await;
        });
    }
    // What the previous case left: each case is judged by what it changed.
    let last = std::cell::RefCell::new(schema(&file));
    fuzz(
        "binary",
        200,
        (table_name(), command()),
        |(table, command)| {
            let mut args = vec!["--table".to_owned(), table.clone()];
            args.extend(command.iter().cloned());
            // A NUL cannot travel in an argument: the shell never hands one over.
            let args: Vec<String> = args.into_iter().map(|a| a.replace('\0', "")).collect();
            let table = &args[1];
            let (code, stderr) = run(&args);
            ensure(matches!(code, Some(0..=3)), || {
                format!("`outbox {}` exited with {code:?}: {stderr}", args.join(" "))
            })?;
            ensure(!stderr.contains("panicked"), || {
                format!("`outbox {}` panicked: {stderr}", args.join(" "))
            })?;
            let after = schema(&file);
            let before = last.replace(after.clone());
            ensure(after.1 == before.1, || {
                format!("`outbox {}` changed the sentinel", args.join(" "))
            })?;
            let bare = table.rsplit('.').next().unwrap_or_default();
            for (kind, name) in after.0.difference(&before.0) {
                let named_after = name == bare
                    || name.starts_with(&format!("{bare}_"))
                    || name.starts_with(&format!("sqlite_autoindex_{bare}_"));
                ensure(
                    named_after && outbox::TableName::parse(table).is_ok(),
                    || format!("`outbox {}` made the {kind} {name}", args.join(" ")),
                )?;
            }
            ensure(before.0.is_subset(&after.0), || {
                format!("`outbox {}` removed a schema object", args.join(" "))
            })?;
            Ok(())
        },
    );
    let _ = std::fs::remove_dir_all(&dir);
}
