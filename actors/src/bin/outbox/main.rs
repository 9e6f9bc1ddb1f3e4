//! `outbox`: see and repair an outbox without writing SQL, and drain it
//! without an application.
//!
//! Built with the `cli` feature of `outbox-actors` (which brings both SQL
//! stores):
//!
//! ```text
//! cargo run -p outbox-actors --features cli -- --help
//! cargo install --path actors --features cli      # puts `outbox` on the PATH
//! ```
//!
//! The database comes from `--database URL` or `OUTBOX_DATABASE_URL`:
//! `sqlite://PATH` or `postgres://USER:PASSWORD@HOST/DB`; the store is picked
//! by the scheme. `--table NAME` (or `OUTBOX_TABLE`) names the outbox table,
//! `outbox` by default. Every command has `--help` with examples.
//!
//! # Commands
//!
//! | command | what it does |
//! |---|---|
//! | `migrate` | create the table, or upgrade it; says which migrations ran; safe to run again |
//! | `status [--json]` | counts per status, the oldest due message's age, live claims, claims past their lease |
//! | `list [--status S] [--name N] [--limit L] [--after CURSOR] [--json]` | one page, oldest first, and the command for the next page |
//! | `show ID [--json]` | every field, the payload and the last error (type, message, causes) pretty-printed |
//! | `requeue ID`, `requeue --all-dead-lettered [--name N]` | dead letters become pending with their attempts reset |
//! | `purge --status delivered\|dead_lettered --older-than 7d [--yes]` | delete settled messages older than the horizon |
//! | `drain --once\|--every 1s --exec CMD\|--print` | deliver messages as stored, with the actor runtime |
//!
//! Operations the store considers unsafe are refused with its reason:
//! requeueing a message under a live claim or one that is not dead-lettered,
//! purging pending or claimed messages. `purge` asks for confirmation on a
//! terminal and, without `--yes`, refuses to run when its input is not one.
//!
//! # Drain
//!
//! The command line cannot know an application's payload types, so `drain`
//! registers a catch-all ([`outbox::RegistryBuilder::any`]) and hands every
//! message on as stored. `--exec CMD` runs `sh -c CMD` once per message with
//! the payload JSON on stdin and `OUTBOX_ID`, `OUTBOX_NAME`, `OUTBOX_KIND`,
//! `OUTBOX_ATTEMPT` and `OUTBOX_MAX_ATTEMPTS` in the environment: exit status
//! 0 is delivered, anything else a failure whose last stderr lines become the
//! message's `last_error` (retried with backoff, dead-lettered when out of
//! attempts). `--print` writes each message to stdout as a JSON line. The
//! flags `--batch-size`, `--concurrency`, `--lease`, `--heartbeat`,
//! `--max-active`, `--retry-delay` and `--retry-max-delay` map onto
//! `DrainConfig` and are validated like it. `--every` drains until Ctrl-C or
//! SIGTERM, then gives deliveries in flight `--grace` to finish and releases
//! the claims of the rest. Pass reports go to stderr.
//!
//! # Exit codes
//!
//! `0` success; `1` operational error (the store failed, an operation was
//! refused, a message was not found); `2` usage error (a bad flag or value,
//! an unsupported database URL). Errors go to stderr with the reason and a
//! hint saying what to do.
//!
//! # A short tour
//!
//! ```text
//! TOUR
//! ```

mod admin;
mod cli;
mod db;
mod drain;
mod fail;
mod output;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command};
use crate::db::Store;
use crate::fail::Failure;

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
    let migrating = matches!(cli.command, Command::Migrate);
    let store = Store::open(url, &cli.table, migrating).await?;
    if !migrating {
        store.require_table().await?;
    }
    // Only a table other than the default needs repeating in printed commands.
    let table_flag = (cli.table != "outbox").then_some(cli.table.as_str());
    match cli.command {
        Command::Migrate => admin::migrate(&store).await,
        Command::Status(args) => admin::status(&store, args).await,
        Command::List(args) => admin::list(&store, table_flag, args).await,
        Command::Show(args) => admin::show(&store, args).await,
        Command::Requeue(args) => admin::requeue(&store, args).await,
        Command::Purge(args) => admin::purge(&store, args).await,
        Command::Drain(args) => drain::drain(&store, args).await,
    }
}
