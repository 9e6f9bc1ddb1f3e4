//! The command line as clap sees it: every flag, its help text and how its
//! value is parsed. Values clap can check (numbers, durations, statuses) are
//! checked here, so a bad one is a usage error (exit 2) before anything is
//! opened.

use std::time::Duration;

use clap::{ArgGroup, Args, Parser, Subcommand};
use outbox::MessageStatus;

const ABOUT: &str = "Inspect, repair and drain a transactional outbox in SQLite or PostgreSQL.";

const LONG_ABOUT: &str = "\
Inspect, repair, drain and relay a transactional outbox in SQLite or PostgreSQL.

The database comes from --database or OUTBOX_DATABASE_URL: sqlite://PATH or
postgres://USER:PASSWORD@HOST/DB. The store is picked by the URL's scheme.";

const AFTER_HELP: &str = "\
Examples:
  export OUTBOX_DATABASE_URL=sqlite://app.db
  outbox migrate
  outbox status
  outbox list --status dead_lettered --limit 20
  outbox show 0196a1b2-...
  outbox requeue --all-dead-lettered --name order.placed
  outbox purge --status delivered --older-than 7d --yes
  outbox pause emails
  outbox cancel 0196a1b2-...
  outbox drain --once --print
  outbox relay --to nats://127.0.0.1:4222 --subject-prefix events. --stream EVENTS

Exit codes: 0 success; 1 operational error (the store failed, an operation was
refused as unsafe, a message was not found); 2 usage error (a bad flag or value,
an unsupported database URL or broker); 3 `drain --once` or `relay --once` ran,
but some delivery failed.

status, list and show only read: a SQLite file is opened read-only, never
created, and its journal mode is left as it is.";

/// `outbox`: the admin command line of the transactional outbox.
#[derive(Debug, Parser)]
#[command(
    name = "outbox",
    version,
    about = ABOUT,
    long_about = LONG_ABOUT,
    after_help = AFTER_HELP,
    propagate_version = true
)]
pub(crate) struct Cli {
    /// Database URL: sqlite://PATH or postgres://USER:PASSWORD@HOST/DB.
    #[arg(
        long,
        short = 'd',
        env = "OUTBOX_DATABASE_URL",
        global = true,
        value_name = "URL",
        hide_env_values = true
    )]
    pub(crate) database: Option<String>,

    /// The outbox table: `table` or `schema.table` (letters, digits, underscores).
    #[arg(
        long,
        short = 't',
        env = "OUTBOX_TABLE",
        global = true,
        value_name = "NAME",
        default_value = "outbox",
        hide_env_values = true
    )]
    pub(crate) table: String,

    #[command(subcommand)]
    pub(crate) command: Command,
}

/// What to do.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Create the outbox table, or upgrade it to this version; safe to run again.
    #[command(after_help = MIGRATE_AFTER_HELP)]
    Migrate,

    /// Counts per status, the oldest due message, live claims and expired leases.
    #[command(after_help = STATUS_AFTER_HELP)]
    Status(StatusArgs),

    /// One page of messages, oldest first, with the command for the next page.
    #[command(after_help = LIST_AFTER_HELP)]
    List(ListArgs),

    /// Every field of one message, its payload and last error pretty-printed.
    #[command(after_help = SHOW_AFTER_HELP)]
    Show(ShowArgs),

    /// Make dead-lettered messages pending again, with their attempts reset.
    #[command(after_help = REQUEUE_AFTER_HELP)]
    Requeue(RequeueArgs),

    /// Let an ordering key go on past its dead letter, which stays dead-lettered.
    #[command(after_help = SKIP_AFTER_HELP)]
    Skip(SkipArgs),

    /// Delete delivered, dead-lettered or cancelled messages that last changed before a horizon.
    #[command(after_help = PURGE_AFTER_HELP)]
    Purge(PurgeArgs),

    /// Stop claiming from a queue, in every process, until it is resumed.
    #[command(after_help = PAUSE_AFTER_HELP)]
    Pause(QueueArgs),

    /// Claim from a paused queue again, waking idle drains.
    #[command(after_help = RESUME_AFTER_HELP)]
    Resume(QueueArgs),

    /// Cancel a pending or scheduled message, or every one matching a filter.
    #[command(after_help = CANCEL_AFTER_HELP)]
    Cancel(CancelArgs),

    /// Deliver messages: to a shell command per message, or as JSON lines on stdout.
    #[command(after_help = DRAIN_AFTER_HELP)]
    Drain(DrainArgs),

    /// Publish messages to a broker (NATS JetStream, RabbitMQ, Redis Streams) as stored.
    #[command(after_help = RELAY_AFTER_HELP)]
    Relay(RelayArgs),

    /// Serve the web dashboard: counts, lists, messages, requeue, retry, purge.
    #[command(after_help = WEB_AFTER_HELP)]
    Web(WebArgs),
}

const WEB_AFTER_HELP: &str = "\
Binds to loopback unless told otherwise. Every change is a POST carrying a CSRF
token; --read-only serves no action forms and refuses every POST. A bind address
other than loopback needs --auth-token (or --allow-remote, when a proxy in front
authenticates).

Examples:
  outbox --database sqlite://app.db web
  outbox --database postgres://app@db/app web --bind 127.0.0.1:9000 --read-only
  OUTBOX_WEB_TOKEN=s3cret outbox web --bind 0.0.0.0:8089";

/// `web` flags.
#[derive(Debug, Args)]
pub(crate) struct WebArgs {
    /// Address and port to listen on.
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:8089")]
    pub(crate) bind: String,

    /// Require this token: `Authorization: Bearer TOKEN`, or basic auth with it as password.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "OUTBOX_WEB_TOKEN",
        hide_env_values = true
    )]
    pub(crate) auth_token: Option<String>,

    /// Serve no action forms and refuse every POST; opens the database read-only.
    #[arg(long)]
    pub(crate) read_only: bool,

    /// Allow a non-loopback bind without --auth-token (a proxy in front authenticates).
    #[arg(long)]
    pub(crate) allow_remote: bool,

    /// The attempt cap of the drains (their `retry.max_attempts`), which
    /// messages enqueued without a cap of their own are held to; shown as
    /// their limit.
    #[arg(long, value_name = "N", default_value_t = outbox::DEFAULT_MAX_ATTEMPTS,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) max_attempts: u32,
}

const RELAY_AFTER_HELP: &str = "\
Every message is published as stored (its JSON payload) to PREFIX + name, with
the headers Nats-Msg-Id and Outbox-Message-Id (the message id), Outbox-Name,
Outbox-Kind, Outbox-Attempt and traceparent/tracestate when it has a trace
context; it is delivered once the broker acknowledged it. JetStream drops a
redelivered id inside the stream's duplicate window (2 minutes by default).
A stream that is missing or does not cover PREFIX> stops the command at start.
Failures the broker calls permanent (no stream for a subject, a message over
the size limit, a permissions violation) dead-letter the message at once.

Example:
  outbox relay --database sqlite://app.db --to nats://127.0.0.1:4222 \\
      --subject-prefix events. --stream EVENTS

Runs until Ctrl-C or SIGTERM, then prints the totals; --once runs one pass.
Published messages stay in the outbox as delivered unless --delete-on-delivery
or --retain-delivered says otherwise.";

const MIGRATE_AFTER_HELP: &str = "\
Prints which migrations it applied, or that the table was already up to date.

Examples:
  outbox --database sqlite://app.db migrate
  outbox --database postgres://app@db/app --table jobs.outbox migrate";

const PAUSE_AFTER_HELP: &str = "\
The pause is stored with the outbox: every drain, in every process, stops
claiming from the queue at its next claim, and it stays paused across restarts.
Messages already claimed finish and settle as usual; other queues are not
affected. A queue need not hold messages to be paused. `outbox status` lists
paused queues.

Examples:
  outbox pause emails
  outbox resume emails";

const RESUME_AFTER_HELP: &str = "\
Drains waiting for work are woken, so due messages of the queue are claimed at
once (a drain in another process on SQLite claims at its next tick).

Examples:
  outbox resume emails";

const CANCEL_AFTER_HELP: &str = "\
A pending message (due, or scheduled for later) becomes `cancelled` at once and
is never delivered; it is kept for the record until purged or removed by
retention. A message being delivered keeps running: its handler sees the
cancellation at the lease's next renewal, and if it then fails (or its claim is
given back) the message ends cancelled instead of being retried; if it succeeds
anyway, it is recorded as delivered. A delivered, dead-lettered or cancelled
message is refused with its status (exit 1).

With filters, every pending and claimed message matching all of them is
cancelled; --dry-run only counts them. On a terminal it asks for confirmation
unless --yes is given; when standard input is not a terminal, cancelling by
filter without --yes is refused (exit 2).

Examples:
  outbox cancel 0196a1b2-7c3d-7e4f-8a9b-0c1d2e3f4a5b
  outbox cancel --queue emails --name newsletter.send --dry-run
  outbox cancel --key order-7 --yes";

const STATUS_AFTER_HELP: &str = "\
Examples:
  outbox status
  outbox status --json | jq .pending";

const LIST_AFTER_HELP: &str = "\
Columns: id, name, kind, status, attempts/max, when it is (or was) available, when
it last changed, the first line of its last error.

Examples:
  outbox list
  outbox list --status dead_lettered --name order.placed --limit 20
  outbox list --limit 20 --after CURSOR     (CURSOR as printed under the previous page)
  outbox list --json | jq -r '.messages[].id'";

const SHOW_AFTER_HELP: &str = "\
Examples:
  outbox show 0196a1b2-7c3d-7e4f-8a9b-0c1d2e3f4a5b
  outbox show 0196a1b2-7c3d-7e4f-8a9b-0c1d2e3f4a5b --json";

const SKIP_AFTER_HELP: &str = "\
Messages with an ordering key are delivered one at a time, in enqueue order.
Under the default policy (ordering.on_dead_letter = \"block\") a dead letter
holds the later messages of its key; `outbox status` lists such blocked keys
with their head. `skip` marks the dead letter as skipped (it keeps its status,
payload and error, and `show` prints when it was skipped) so the next message
of the key is delivered. `outbox requeue ID` instead retries the dead letter
itself as the head of its key. Only dead letters can be skipped (exit 1 otherwise).

Examples:
  outbox skip 0196a1b2-7c3d-7e4f-8a9b-0c1d2e3f4a5b";

const REQUEUE_AFTER_HELP: &str = "\
Only dead letters are requeued; a message under a live claim, or in any other
status, is refused with the reason (exit 1).

Examples:
  outbox requeue 0196a1b2-7c3d-7e4f-8a9b-0c1d2e3f4a5b
  outbox requeue --all-dead-lettered
  outbox requeue --all-dead-lettered --name order.placed";

const PURGE_AFTER_HELP: &str = "\
Pending and claimed messages are never purged: asking for them is refused (exit 1).
On a terminal, asks for confirmation unless --yes is given; when standard input is
not a terminal, a purge without --yes is refused (exit 2).

Examples:
  outbox purge --status delivered --older-than 7d
  outbox purge --status dead_lettered --older-than 30d --yes";

const DRAIN_AFTER_HELP: &str = "\
This command cannot know the application's payload types: it hands each message
on as stored. With --exec CMD, `sh -c CMD` runs once per message with the payload
JSON on its standard input and OUTBOX_ID, OUTBOX_NAME, OUTBOX_KIND (event or job),
OUTBOX_ATTEMPT and OUTBOX_MAX_ATTEMPTS in its environment; exit status 0 means
delivered, anything else failed (the last lines of its stderr become the
message's last error, and it is retried with backoff or dead-lettered when out of
attempts). With --print each message is written to stdout as one JSON line and
counts as delivered. The command's own stdout is passed through; the pass reports
go to stderr.

--once runs one pass (at most --batch-size messages), and whatever passes the
coordinator starts by itself before it is shut down (retries that came due,
messages left over), prints the totals over all of them and exits: with status 3
when any delivery failed (retried, dead-lettered, not settled, or its lease lost),
0 when all were delivered. --every runs a pass
at that interval (and on PostgreSQL as soon as a message is committed) until
Ctrl-C or SIGTERM, then stops claiming, lets deliveries finish within --grace, and
gives the remaining claims back. Passes that find nothing are not reported.

Settled messages are kept unless told otherwise: --delete-on-delivery deletes
each delivered message as it settles; --retain-delivered and
--retain-dead-lettered delete settled messages past that age while the command
runs (every --retention-every).

Examples:
  outbox drain --once --print
  outbox drain --every 1s --exec './deliver.sh'
  outbox drain --every 1s --exec './deliver.sh' --retain-delivered 7d --retain-dead-lettered 30d
  outbox drain --every 5s --concurrency 8 --lease 1m \\
      --exec 'curl -sf -X POST -H content-type:application/json \\
              --data-binary @- \"https://hooks.example/$OUTBOX_NAME\"'";

/// `status` flags.
#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// Print one JSON document instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `list` flags.
#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    /// Only messages in this status: pending, claimed, delivered, dead_lettered or cancelled.
    #[arg(long, short = 's', value_parser = parse_status)]
    pub(crate) status: Option<MessageStatus>,

    /// Only messages with this name.
    #[arg(long, short = 'n')]
    pub(crate) name: Option<String>,

    /// Messages per page, 1 to 10000.
    #[arg(long, short = 'l', default_value_t = 50,
          value_parser = clap::value_parser!(u16).range(1..=10_000))]
    pub(crate) limit: u16,

    /// Continue after this cursor, as printed under the previous page.
    #[arg(long, value_name = "CURSOR")]
    pub(crate) after: Option<String>,

    /// The attempt cap of the drains (their `retry.max_attempts`), which
    /// messages enqueued without a cap of their own are held to; shown as
    /// their limit.
    #[arg(long, value_name = "N", default_value_t = outbox::DEFAULT_MAX_ATTEMPTS,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) max_attempts: u32,

    /// Print one JSON document: the messages and the cursor of the next page.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `show` flags.
#[derive(Debug, Args)]
pub(crate) struct ShowArgs {
    /// The message id.
    pub(crate) id: String,

    /// The attempt cap of the drains (their `retry.max_attempts`), which
    /// messages enqueued without a cap of their own are held to; shown as
    /// their limit.
    #[arg(long, value_name = "N", default_value_t = outbox::DEFAULT_MAX_ATTEMPTS,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) max_attempts: u32,

    /// Print the message as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `pause` and `resume` flags.
#[derive(Debug, Args)]
pub(crate) struct QueueArgs {
    /// The queue.
    pub(crate) queue: String,
}

/// `cancel` flags.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("which").required(true).multiple(true)
    .args(["id", "name", "key", "queue"])))]
pub(crate) struct CancelArgs {
    /// The message to cancel.
    #[arg(conflicts_with_all = ["name", "key", "queue"])]
    pub(crate) id: Option<String>,

    /// Only messages with this name.
    #[arg(long, short = 'n')]
    pub(crate) name: Option<String>,

    /// Only messages with this ordering key.
    #[arg(long, short = 'k')]
    pub(crate) key: Option<String>,

    /// Only messages in this queue.
    #[arg(long, short = 'q')]
    pub(crate) queue: Option<String>,

    /// Count what would be cancelled; change nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,

    /// Do not ask for confirmation.
    #[arg(long, short = 'y')]
    pub(crate) yes: bool,
}

/// `skip` flags.
#[derive(Debug, Args)]
pub(crate) struct SkipArgs {
    /// The dead-lettered message to skip.
    pub(crate) id: String,
}

/// `requeue` flags.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("which").required(true).args(["id", "all_dead_lettered"])))]
pub(crate) struct RequeueArgs {
    /// The dead-lettered message to requeue.
    pub(crate) id: Option<String>,

    /// Requeue every dead-lettered message (of --name, if given).
    #[arg(long)]
    pub(crate) all_dead_lettered: bool,

    /// With --all-dead-lettered: only dead letters with this name.
    #[arg(long, short = 'n', requires = "all_dead_lettered")]
    pub(crate) name: Option<String>,
}

/// `purge` flags.
#[derive(Debug, Args)]
pub(crate) struct PurgeArgs {
    /// Which messages: delivered, dead_lettered or cancelled.
    #[arg(long, short = 's', value_parser = parse_status)]
    pub(crate) status: MessageStatus,

    /// Only messages that last changed longer ago than this (7d, 12h, 30m).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) older_than: Duration,

    /// Do not ask for confirmation.
    #[arg(long, short = 'y')]
    pub(crate) yes: bool,
}

/// `drain` flags.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("schedule").required(true).args(["once", "every"])))]
#[command(group(ArgGroup::new("delivery").required(true).args(["exec", "print"])))]
pub(crate) struct DrainArgs {
    /// Deliver each message to `sh -c CMD` (payload JSON on stdin; exit 0 = delivered).
    #[arg(long, value_name = "CMD")]
    pub(crate) exec: Option<String>,

    /// Deliver each message by writing it to stdout as a JSON line.
    #[arg(long)]
    pub(crate) print: bool,

    #[command(flatten)]
    pub(crate) run: RunArgs,
}

/// `relay` flags.
#[derive(Debug, Args)]
pub(crate) struct RelayArgs {
    /// The broker: nats://HOST:PORT (JetStream), amqp://USER:PASS@HOST:PORT/VHOST
    /// (RabbitMQ), redis://HOST:PORT (Redis Streams) or
    /// kafka://HOST:PORT[,HOST:PORT...] (Kafka).
    #[arg(
        long,
        value_name = "URL",
        env = "OUTBOX_RELAY_TO",
        hide_env_values = true
    )]
    pub(crate) to: String,

    /// Prepended to each message name to make its destination: the NATS
    /// subject, the AMQP routing key, the Redis stream key or the Kafka topic
    /// (`events.` sends `orders.placed` to `events.orders.placed`).
    #[arg(long, value_name = "PREFIX", default_value = "")]
    pub(crate) subject_prefix: String,

    /// The JetStream stream that stores the subjects; it must exist and
    /// cover `PREFIX>`.
    #[arg(long, value_name = "NAME", default_value = "OUTBOX")]
    pub(crate) stream: String,

    /// RabbitMQ: the exchange to publish to; it must exist (`""`, the
    /// default exchange, routes to the queue named by the routing key).
    #[arg(long, value_name = "NAME", default_value = "")]
    pub(crate) exchange: String,

    /// Redis: how long a published id is remembered, so a redelivery
    /// within it appends nothing.
    #[arg(long, default_value = "24h", value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) dedup_window: Duration,

    /// Redis: trim each stream to about N entries (`MAXLEN ~ N`).
    #[arg(long, value_name = "N")]
    pub(crate) max_len: Option<u64>,

    /// How long a publish waits for the broker's acknowledgement (Kafka:
    /// the producer's delivery timeout, its own retries included).
    #[arg(long, default_value = "5s", value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) ack_timeout: Duration,

    #[command(flatten)]
    pub(crate) run: RunArgs,
}

/// How `drain` and `relay` run. They map onto the runtime's `DrainConfig`.
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// Run one pass, print its report and exit (status 3 if a delivery failed).
    #[arg(long, conflicts_with = "every")]
    pub(crate) once: bool,

    /// Run a pass at this interval until Ctrl-C or SIGTERM (1s, 30s, 5m);
    /// `relay` runs every 1s unless --once.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) every: Option<Duration>,

    /// Most messages one pass claims [default: 100 for drain, 10000 for relay].
    #[arg(long, value_name = "N")]
    pub(crate) batch_size: Option<usize>,

    /// Deliveries in flight at once; at most --batch-size [default: 1 for
    /// drain, 256 for relay].
    #[arg(long, short = 'c', value_name = "N")]
    pub(crate) concurrency: Option<usize>,

    /// Serve this queue, with N deliveries of it in flight at once
    /// [default N: --concurrency]; repeat for more queues. Without it, the
    /// `default` queue alone is served; with it, only the queues named.
    #[arg(long = "queue", value_name = "NAME[=N]", value_parser = parse_queue)]
    pub(crate) queue: Vec<(String, Option<usize>)>,

    /// Messages claimed ahead of free delivery slots (at most 4096), so a
    /// slot that frees starts the next message without waiting for a claim
    /// [default: sized by the drain as it runs for drain, 256 for relay].
    #[arg(long, value_name = "N")]
    pub(crate) prefetch: Option<usize>,

    /// How long a claim owns a message unless renewed.
    #[arg(long, default_value = "30s", value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) lease: Duration,

    /// Renewal interval, shorter than --lease [default: a third of the lease].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) heartbeat: Option<Duration>,

    /// Longest one delivery may run before it is stopped (and its command killed).
    #[arg(long, default_value = "5m", value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) max_active: Duration,

    /// Delay before the first retry of a failed message, doubling after each failure.
    #[arg(long, default_value = "1s", value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) retry_delay: Duration,

    /// Longest delay between retries.
    #[arg(long, default_value = "3h", value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) retry_max_delay: Duration,

    /// Attempts in all for messages enqueued without a cap of their own
    /// (raises or lowers the default; a message's own cap wins).
    #[arg(long, value_name = "N", default_value_t = outbox::DEFAULT_MAX_ATTEMPTS,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) max_attempts: u32,

    /// At Ctrl-C, how long deliveries in flight may still finish before their
    /// claims are given back.
    #[arg(long, default_value = "10s", value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) grace: Duration,

    /// Delete each delivered message in the write that settles it, so no
    /// delivered row is kept.
    #[arg(long, conflicts_with = "retain_delivered")]
    pub(crate) delete_on_delivery: bool,

    /// While the command runs, delete delivered messages this long after
    /// they were delivered (7d, 12h); without it they are kept until
    /// `outbox purge`. With --once, use `outbox purge` instead.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, conflicts_with = "once")]
    pub(crate) retain_delivered: Option<Duration>,

    /// While the command runs, delete dead-lettered messages this long
    /// after they were dead-lettered (30d).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, conflicts_with = "once")]
    pub(crate) retain_dead_lettered: Option<Duration>,

    /// Time between the deletions that --retain-delivered and
    /// --retain-dead-lettered ask for.
    #[arg(long, default_value = "1m", value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) retention_every: Duration,
}

fn parse_status(value: &str) -> Result<MessageStatus, String> {
    value.parse().map_err(|_| {
        format!(
            "{value:?} is not a status; use pending, claimed, delivered, dead_lettered or cancelled"
        )
    })
}

fn parse_queue(value: &str) -> Result<(String, Option<usize>), String> {
    let (name, concurrency) = match value.split_once('=') {
        Some((name, n)) => {
            let n = n.parse().ok().filter(|&n| n >= 1).ok_or_else(|| {
                format!("{n:?} is not a number of deliveries; write NAME=N with N at least 1")
            })?;
            (name, Some(n))
        }
        None => (value, None),
    };
    if name.is_empty() {
        return Err("the queue's name is empty; write NAME or NAME=N".into());
    }
    Ok((name.to_owned(), concurrency))
}

fn parse_duration(value: &str) -> Result<Duration, String> {
    humantime::parse_duration(value)
        .map_err(|e| format!("{e}; write a duration such as 500ms, 30s, 5m, 12h or 7d"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
