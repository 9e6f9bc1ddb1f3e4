//! An inbox consumer made to be killed: the process the inbox crash harness
//! (`bench/tests/inbox_crash.rs`) runs, SIGKILLs and restarts.
//!
//! ```text
//! inbox_consumer --broker nats --url nats://127.0.0.1:4222 --source STREAM/DURABLE \
//!     --database postgres://postgres@127.0.0.1:5432/postgres --table crash_1 --run 3
//! inbox_consumer --broker kafka --url kafka://127.0.0.1:9092 --source TOPIC/GROUP \
//!     --set session.timeout.ms=6000 --database ... --table crash_1 --run 3
//! ```
//!
//! Flags: `--broker nats|kafka`, `--url URL`, `--source A/B` (NATS: the
//! stream and its durable pull consumer, which must exist; Kafka: the topic
//! and the consumer group), `--database URL` (PostgreSQL), `--table NAME`
//! (the outbox table whose inbox is used; set up by the harness) and
//! `--run ID` are required; `--work-ms MIN-MAX` (0-2: time spent inside
//! each message's transaction, after its effect and before its commit, so
//! kills land mid-transaction), `--set KEY=VALUE` (Kafka consumer
//! properties, repeatable).
//!
//! It consumes as `crash` through a [`PostgresInbox`], and for each new
//! message inserts one row into `"<table>_effects"`: the message id, this
//! run, and the payload's `key` and `n`. The effects table has no unique
//! key: a message applied twice would show as two rows, which is what the
//! harness counts. It runs until it is killed; it logs the consumers'
//! warnings to standard error.
//!
//! Exit status: 1 when it cannot start, 2 for bad arguments.

use std::time::Duration;

use outbox::PostgresInbox;
use outbox::sqlx::{self, AssertSqlSafe, Postgres, Transaction};
use outbox_bench::args::{Flags, refuse};
use outbox_brokers::consume::{
    ConsumerReport, InboxHandler, KafkaInboxConsumer, NatsInboxConsumer, Received, handler_fn,
};

const USAGE: &str = "usage: inbox_consumer --broker nats|kafka --url URL --source A/B \
                     --database URL --table NAME --run ID [--work-ms MIN-MAX] [--set KEY=VALUE]...";

/// The consumer's name in the inbox.
const CONSUMER: &str = "crash";

struct Args {
    broker: String,
    url: String,
    /// NATS: stream and durable; Kafka: topic and group.
    source: (String, String),
    database: String,
    table: String,
    run: i64,
    work_ms: (u64, u64),
    properties: Vec<(String, String)>,
}

fn parse_args(mut flags: Flags) -> Result<Args, String> {
    let (mut broker, mut url, mut source, mut database, mut table, mut run) =
        (None, None, None, None, None, None);
    let mut work_ms = (0, 2);
    let mut properties = Vec::new();
    while let Some(flag) = flags.next_flag() {
        match flag.as_str() {
            "--broker" => broker = Some(flags.value(&flag)?),
            "--url" => url = Some(flags.value(&flag)?),
            "--source" => {
                let text = flags.value(&flag)?;
                let (a, b) = text
                    .split_once('/')
                    .ok_or_else(|| format!("--source takes A/B, not {text:?}"))?;
                source = Some((a.to_owned(), b.to_owned()));
            }
            "--database" => database = Some(flags.value(&flag)?),
            "--table" => table = Some(flags.value(&flag)?),
            "--run" => run = Some(flags.parse(&flag)?),
            "--work-ms" => {
                let text = flags.value(&flag)?;
                let (min, max) = text
                    .split_once('-')
                    .ok_or_else(|| format!("--work-ms takes MIN-MAX, not {text:?}"))?;
                let parse = |part: &str| part.parse::<u64>().map_err(|e| format!("--work-ms: {e}"));
                work_ms = (parse(min)?, parse(max)?);
                if work_ms.0 > work_ms.1 {
                    return Err(format!("--work-ms {text}: MIN is above MAX"));
                }
            }
            "--set" => {
                let text = flags.value(&flag)?;
                let (key, value) = text
                    .split_once('=')
                    .ok_or_else(|| format!("--set takes KEY=VALUE, not {text:?}"))?;
                properties.push((key.to_owned(), value.to_owned()));
            }
            "--help" | "-h" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other:?}; {USAGE}")),
        }
    }
    let missing = |name: &str| format!("{name} is required; {USAGE}");
    Ok(Args {
        broker: broker.ok_or_else(|| missing("--broker"))?,
        url: url.ok_or_else(|| missing("--url"))?,
        source: source.ok_or_else(|| missing("--source"))?,
        database: database.ok_or_else(|| missing("--database"))?,
        table: table.ok_or_else(|| missing("--table"))?,
        run: run.ok_or_else(|| missing("--run"))?,
        work_ms,
        properties,
    })
}

fn main() {
    let args = parse_args(Flags::from_env())
        .unwrap_or_else(|message| refuse(format!("inbox_consumer: {message}")));
    // The consumers' warnings (a failed message, a receive or an
    // acknowledgement that failed) go to standard error, which the harness
    // shows when a run goes wrong.
    tracing_subscriber::fmt()
        .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    if let Err(error) = runtime.block_on(consume(args)) {
        eprintln!("inbox_consumer: {error}");
        std::process::exit(1);
    }
}

type BoxError = Box<dyn std::error::Error>;

async fn consume(args: Args) -> Result<ConsumerReport, BoxError> {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&args.database)
        .await?;
    let inbox = PostgresInbox::builder(pool).table(&args.table)?.build();
    let handler = effect_handler(&args);
    // Until the harness kills it.
    let forever = std::future::pending::<()>();
    let (first, second) = args.source.clone();
    match args.broker.as_str() {
        "nats" => {
            let client = async_nats::connect(&args.url).await?;
            let durable: async_nats::jetstream::consumer::PullConsumer =
                async_nats::jetstream::new(client)
                    .get_stream(&first)
                    .await?
                    .get_consumer(&second)
                    .await
                    .map_err(|e| e.to_string())?;
            let consumer = NatsInboxConsumer::new(durable, inbox, CONSUMER, handler)?
                .batch(20)
                .retry_delay(Duration::from_millis(100));
            Ok(consumer.run(forever).await)
        }
        "kafka" => {
            let mut builder = KafkaInboxConsumer::builder(&args.url, &second, &[&first]);
            for (key, value) in &args.properties {
                builder = builder.set(key, value);
            }
            let consumer = builder
                .connect(inbox, CONSUMER, handler)?
                .retry_delay(Duration::from_millis(100));
            Ok(consumer.run(forever).await)
        }
        other => Err(format!("--broker {other:?} is neither nats nor kafka").into()),
    }
}

/// Inserts the message's effect, then spends its work time inside the
/// transaction.
fn effect_handler(args: &Args) -> impl InboxHandler<Postgres> {
    let sql = format!(
        "INSERT INTO \"{}_effects\" (message_id, run, key, n) VALUES ($1, $2, $3, $4)",
        args.table
    );
    let (run, work_ms) = (args.run, args.work_ms);
    handler_fn(
        move |tx: &mut Transaction<'static, Postgres>, message: &Received| {
            let sql = sql.clone();
            Box::pin(async move {
                let payload: serde_json::Value = message.json()?;
                sqlx::query(AssertSqlSafe(sql))
                    .bind(&message.id)
                    .bind(run)
                    .bind(payload["key"].as_str())
                    .bind(payload["n"].as_i64())
                    .execute(&mut **tx)
                    .await?;
                let work = work_for(&message.id, work_ms);
                if work > 0 {
                    tokio::time::sleep(Duration::from_millis(work)).await;
                }
                Ok(())
            })
        },
    )
}

/// Milliseconds of work for message `id`: fixed per message, spread over
/// `min..=max` (FNV-1a of the id).
fn work_for(id: &str, (min, max): (u64, u64)) -> u64 {
    let hash = id.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    min + hash % (max - min + 1)
}
