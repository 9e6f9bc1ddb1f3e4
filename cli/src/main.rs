//! `outbox`, the command of the `outbox-cli` package: see and repair a
//! transactional outbox in SQLite or PostgreSQL without writing SQL, drain
//! it to a shell command or relay it to a broker without an application, and
//! serve its dashboard. Its reference is the guide's "Operating" page
//! (`docs/src/operating.md`) and, in the terminal, `outbox --help` and each
//! command's `--help`.
//!
//! # Layout
//!
//! - `main.rs`: opens the outbox, runs one command, turns its outcome into
//!   an exit code.
//! - `cli.rs`: the command line as clap sees it, with every `--help` text.
//! - `open.rs`: opening the outbox the flags name, and its failures.
//! - `admin.rs`: `migrate`, `status`, `list`, `show`, `requeue`, `skip`, `purge`.
//! - `queues.rs`: `pause`, `resume`, `cancel`.
//! - `schedules.rs`: the periodic schedules `status` shows.
//! - `drain.rs`: `drain`, and the passes `relay` runs too.
//! - `relay.rs`: `relay`, to a broker of `outbox-brokers`.
//! - `web.rs`: `web`, the dashboard of `outbox-web`.
//! - `fail.rs`: why a command failed, the hint, and the exit code.
//! - `output.rs`: how times, ages and tables are shown.

/// `print!` for the read-only commands. A reader that went away (`outbox
/// list | head`) is not an error: the rest of the output has no one to go
/// to, so the command ends there with status 0, as `ls | head` does, instead
/// of panicking the way `print!` does on a closed pipe.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        match write!(std::io::stdout().lock(), $($arg)*) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
            // Any other stdout failure (a full disk) is as fatal as before.
            Err(e) => panic!("cannot write to standard output: {e}"),
            Ok(()) => {}
        }
    }};
}

/// [`out!`] with a line ending.
macro_rules! outln {
    () => { out!("\n") };
    ($($arg:tt)*) => {{ out!($($arg)*); out!("\n"); }};
}

mod admin;
mod cli;
mod drain;
mod fail;
mod open;
mod output;
mod queues;
mod relay;
mod schedules;
mod web;

use std::process::ExitCode;

use clap::Parser;
use outbox::OpenMode;

use crate::cli::{Cli, Command};
use crate::fail::Failure;

// A drain or relay allocates a few dozen small objects per message (actors,
// mailbox messages, the store's rows); mimalloc serves them for about a
// fifth less CPU than glibc's allocator (BENCHMARKS.md, "The allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // One current-thread actix system runs every command: `drain` needs it,
    // and the other commands are a few queries each.
    let result = actix_rt::System::new().block_on(run(cli));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("{failure}");
            failure.exit_code()
        }
    }
}

async fn run(cli: Cli) -> Result<(), Failure> {
    let url = cli.database.as_deref().ok_or_else(|| {
        Failure::usage("no database given").hint(
            "pass --database URL or set OUTBOX_DATABASE_URL \
             (sqlite://PATH or postgres://USER:PASSWORD@HOST/DB)",
        )
    })?;
    let mode = match cli.command {
        Command::Migrate => OpenMode::Create,
        // Only read: a SQLite file is never created or changed.
        Command::Status(_) | Command::List(_) | Command::Show(_) => OpenMode::ReadOnly,
        Command::Requeue(_)
        | Command::Skip(_)
        | Command::Purge(_)
        | Command::Pause(_)
        | Command::Resume(_)
        | Command::Cancel(_)
        | Command::Drain(_)
        | Command::Relay(_) => OpenMode::Existing,
        Command::Web(ref args) if args.read_only => OpenMode::ReadOnly,
        Command::Web(_) => OpenMode::Existing,
    };
    // Refuse an unsafe bind before touching the database.
    let bind = match &cli.command {
        Command::Web(args) => Some(web::bind_address(args)?),
        _ => None,
    };
    let store = open::open(url, &cli.table, mode).await?;
    if mode != OpenMode::Create {
        open::require_table(&store).await?;
    }
    // Only a table other than the default needs repeating in printed commands.
    let table_flag = (cli.table != "outbox").then_some(cli.table.as_str());
    let outcome = match cli.command {
        Command::Migrate => admin::migrate(&store).await,
        Command::Status(args) => admin::status(&store, args).await,
        Command::List(args) => admin::list(&store, table_flag, args).await,
        Command::Show(args) => admin::show(&store, args).await,
        Command::Requeue(args) => admin::requeue(&store, args).await,
        Command::Skip(args) => admin::skip(&store, args).await,
        Command::Purge(args) => admin::purge(&store, args).await,
        Command::Pause(args) => queues::pause(&store, args).await,
        Command::Resume(args) => queues::resume(&store, args).await,
        Command::Cancel(args) => queues::cancel(&store, args).await,
        Command::Drain(args) => drain::drain(&store, args).await,
        Command::Relay(args) => relay::relay(&store, args).await,
        Command::Web(args) => web::serve(&store, args, bind.expect("checked above")).await,
    };
    // Tasks still running on this runtime (a drain's last store calls) are
    // dropped with it, after it has stopped; a pooled connection dropped
    // then panics, since returning it needs the runtime. Closing the pool
    // while the runtime runs waits for every connection to come back.
    store.close().await;
    outcome
}
