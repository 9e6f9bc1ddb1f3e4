//! `outbox`: see and repair an outbox without writing SQL, and drain it
//! without an application.
//!
//! The package `outbox-cli`, built with both SQL stores:
//!
//! ```text
//! cargo run -p outbox-cli -- --help
//! cargo install --path cli      # puts `outbox` on the PATH
//! ```
//!
//! The database comes from `--database URL` or `OUTBOX_DATABASE_URL`:
//! `sqlite://PATH` or `postgres://USER:PASSWORD@HOST/DB`; the store is picked
//! by the scheme. `--table NAME` (or `OUTBOX_TABLE`) names the outbox table,
//! `outbox` by default. Every command has `--help` with examples.
//!
//! # Layout
//!
//! - `main.rs`: parses the command line, opens the store, runs one command
//!   and turns its outcome into an exit code.
//! - `cli.rs`: the command line as clap sees it; values clap can check are
//!   checked there, as usage errors.
//! - `db.rs`: opening the store a URL names, and the schema questions the
//!   store port does not answer.
//! - `admin.rs`: `migrate`, `status`, `list`, `show`, `requeue`, `skip`, `purge`.
//! - `drain.rs`: `drain`, the actor runtime for operators without an
//!   application.
//! - `fail.rs`: why a command failed, the hint, and the exit code.
//! - `output.rs`: how times, ages and tables are shown.
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
//! | `skip ID` | a dead letter stops holding its ordering key; the key's next message goes on |
//! | `purge --status delivered\|dead_lettered --older-than 7d [--yes]` | delete settled messages older than the horizon |
//! | `drain --once\|--every 1s --exec CMD\|--print` | deliver messages as stored, with the actor runtime |
//! | `relay --to nats://…\|amqp://…\|redis://… --subject-prefix P [--once]` | publish messages as stored to NATS JetStream, RabbitMQ or Redis Streams |
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
//! flags `--batch-size`, `--concurrency`, `--prefetch`, `--lease`,
//! `--heartbeat`, `--max-active`, `--retry-delay` and `--retry-max-delay` map onto
//! `DrainConfig` and are validated like it. `--once` runs one pass (at most
//! `--batch-size` messages), and the passes the coordinator starts by itself
//! before it is shut down, and reports the totals over all of them. `--every` runs a pass at that interval, and on
//! PostgreSQL as soon as a message is committed, until Ctrl-C or SIGTERM;
//! then it gives deliveries in flight `--grace` to finish and releases the
//! claims of the rest. Pass reports go to stderr (with `--every`, only those
//! of passes that found something).
//!
//! # Relay
//!
//! `relay` runs the same passes with a broker transport of `outbox-brokers`
//! in place of a command; the scheme of `--to` picks it. Each message is
//! published as stored to `--subject-prefix` + name, and is delivered once
//! the broker acknowledged it: `nats://` publishes to JetStream with
//! `Nats-Msg-Id` = its id (`--stream` is checked at start: missing, or not
//! covering the prefix, is a usage error); `amqp://` publishes to
//! `--exchange` with publisher confirms, `message_id` = its id and
//! `mandatory` set; `redis://` appends to a stream, skipping an id already
//! appended within `--dedup-window`. Without `--once` it runs a pass every
//! second (`--every`) until Ctrl-C or SIGTERM, then prints the totals.
//!
//! # Exit codes
//!
//! `0` success; `1` operational error (the store failed, an operation was
//! refused, a message was not found); `2` usage error (a bad flag or value,
//! an unsupported database URL); `3` `drain --once` ran but some delivery
//! failed (retried, dead-lettered, not settled, or its lease lost). Errors go
//! to stderr with the reason and a hint saying what to do.
//!
//! # A short tour
//!
//! A SQLite outbox with five messages waiting, and a script that posts each
//! one to a webhook (it fails for `order.shipped`, and for the first attempt
//! of `invoice.render`). Real output, with the ids of that run:
//!
//! ```text
//! $ export OUTBOX_DATABASE_URL=sqlite://shop.db
//! $ outbox status
//! outbox table outbox
//! pending        5  oldest due message waiting 59s (since 2026-11-29T16:36:24.753Z)
//! claimed        0  0 live, 0 past their lease
//! delivered      0
//! dead_lettered  0
//! total          5
//!
//! $ outbox drain --once --exec ./deliver.sh
//! 34484d94-5a6d-4073-a6d3-531dfbf2b297 (event order.shipped, attempt 1 of 1) failed: the command exited with status 22: POST /hooks/order.shipped: 404 Not Found
//! c679ec63-1fc2-4866-8209-bab52a5f242c (job invoice.render, attempt 1 of 5) failed: the command exited with status 75: renderer busy, try later
//! pass: claimed 5, delivered 3, retried 1, dead-lettered 1 (0 abandoned), settlement failed 0, lease lost 0, released 0
//!
//! $ outbox list --limit 4
//! ID                                    NAME           KIND   STATUS         ATTEMPTS  AVAILABLE  UPDATED  LAST ERROR
//! 7a529e71-3df6-4f83-9a2f-094588c749a0  order.placed   event  delivered      1/5       59s ago    now      -
//! ca289af9-22a1-42ff-9973-311c446eb954  order.placed   event  delivered      1/5       58s ago    now      -
//! 0d5ad4f3-0c44-48bc-8aa1-75562c5bdda4  order.placed   event  delivered      1/5       57s ago    now      -
//! 34484d94-5a6d-4073-a6d3-531dfbf2b297  order.shipped  event  dead_lettered  1/1       50s ago    now      the command exited with status 22: POST /hooks/order.shippe…
//!
//! 4 messages shown; next page: outbox list --limit 4 --after 1795970193753531-34484d94-5a6d-4073-a6d3-531dfbf2b297
//!
//! $ outbox show 34484d94-5a6d-4073-a6d3-531dfbf2b297
//! id            34484d94-5a6d-4073-a6d3-531dfbf2b297
//! kind          event
//! name          order.shipped
//! status        dead_lettered
//! attempts      1 of 1
//! available at  2026-11-29T16:36:33.753Z  (52s ago)
//! created at    2026-11-29T16:36:33.753Z  (52s ago)
//! updated at    2026-11-29T16:37:23.805Z  (2s ago)
//! delivered at  -
//! claim         -
//! trace         -
//!
//! payload:
//!   {
//!     "order_id": 1,
//!     "carrier": "dhl"
//!   }
//!
//! last error:
//!   type     outbox::drain::CommandFailed
//!   message  the command exited with status 22: POST /hooks/order.shipped: 404 Not Found
//!
//! $ outbox requeue c679ec63-1fc2-4866-8209-bab52a5f242c
//! error: outbox message "c679ec63-1fc2-4866-8209-bab52a5f242c" is pending, not dead-lettered; only dead letters can be requeued
//! hint: see its state with `outbox show c679ec63-1fc2-4866-8209-bab52a5f242c`
//! [exit 1]
//!
//! $ outbox requeue --all-dead-lettered
//! requeued 1 dead-lettered message; pending again with their attempts reset
//!
//! $ outbox purge --status delivered --older-than 1s
//! error: refusing to purge without confirmation: standard input is not a terminal
//! hint: pass --yes to purge without being asked
//! [exit 2]
//!
//! $ outbox purge --status delivered --older-than 1s --yes
//! purged 3 delivered messages that last changed before 2026-11-29T16:37:25.700Z
//!
//! $ outbox drain --once --print
//! {"id":"c679ec63-1fc2-4866-8209-bab52a5f242c","kind":"job","name":"invoice.render","attempt":2,"max_attempts":5,"created_at":"2026-11-29T16:36:43.753531Z","payload":{"order_id":2}}
//! {"id":"34484d94-5a6d-4073-a6d3-531dfbf2b297","kind":"event","name":"order.shipped","attempt":1,"max_attempts":1,"created_at":"2026-11-29T16:36:33.753531Z","payload":{"order_id":1,"carrier":"dhl"}}
//! pass: claimed 2, delivered 2, retried 0, dead-lettered 0 (0 abandoned), settlement failed 0, lease lost 0, released 0
//! ```
//!
//! A drain that runs until Ctrl-C, and a requeue that would race it:
//!
//! ```text
//! $ outbox drain --every 1s --exec 'sleep 30'
//! draining table outbox every 1s; Ctrl-C stops
//!
//! $ outbox requeue de36c825-567e-4237-987b-38c02ba60710      # from another terminal
//! error: outbox message "de36c825-567e-4237-987b-38c02ba60710" is claimed until 2026-11-29 16:38:00.735357 UTC; wait for its lease to end before changing it
//! hint: its worker may still settle it; once the lease has run out, the message is claimable again by the next drain
//! [exit 1]
//!
//! ^C (back in the drain's terminal)
//! stopping: deliveries in flight get 10s to finish, then their claims are given back
//! interrupted pass: claimed 1, delivered 0, retried 0, dead-lettered 0 (0 abandoned), settlement failed 0, lease lost 0, released 1
//! stopped after 1 pass: claimed 1, delivered 0, retried 0, dead-lettered 0 (0 abandoned), settlement failed 0, lease lost 0, released 1
//! ```

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
mod db;
mod drain;
mod fail;
mod output;
mod relay;
mod web;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command};
use crate::db::{Access, Store};
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
    let access = match cli.command {
        Command::Migrate => Access::Create,
        Command::Status(_) | Command::List(_) | Command::Show(_) => Access::Read,
        Command::Requeue(_)
        | Command::Skip(_)
        | Command::Purge(_)
        | Command::Drain(_)
        | Command::Relay(_) => Access::Write,
        Command::Web(ref args) if args.read_only => Access::Read,
        Command::Web(_) => Access::Write,
    };
    // Refuse an unsafe bind before touching the database.
    let bind = match &cli.command {
        Command::Web(args) => Some(web::bind_address(args)?),
        _ => None,
    };
    let store = Store::open(url, &cli.table, access).await?;
    if access != Access::Create {
        store.require_table().await?;
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
