//! The crash harness: a real worker process (`crash_worker`) drains an
//! outbox, is killed with SIGKILL twenty times at random moments, and is
//! restarted each time; the last run drains what is left. Then the
//! delivery log the worker appends to and the store itself must show:
//!
//! - every message delivered (the store says so and the log has its end),
//!   0 lost;
//! - 0 stuck: nothing pending or claimed at the end;
//! - every duplicate explained by a kill: a message that started again was
//!   in flight when the run that started it was killed (started in that run
//!   and not delivered in the store right after the kill). So duplicates ≤
//!   the sum over the kills of the messages in flight at each kill.
//!
//! SQLite always; PostgreSQL with the `postgres` feature, against
//! `DATABASE_URL` (`scripts/with-postgres cargo test --workspace
//! --all-features`), in a table of its own. Each run prints one summary
//! line; see them with `-- --nocapture`. The kill moments come from a seeded
//! generator; the seed is printed, and `OUTBOX_CRASH_SEED=<seed>` replays
//! the same schedule (the moments, not the machine's timing).
//!
//! Real processes on real time: bounded by the message count and the kill
//! schedule (about 30 s per store on two cores), and by a limit on the last
//! run.
#![cfg(any(feature = "sqlite", feature = "postgres"))]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use outbox::{Clock, MessageKind, NewMessage, OutboxAdmin, OutboxStats, SystemClock};
use outbox_bench::store::fill;
use sqlx::AssertSqlSafe;

/// Messages enqueued before the first run.
const MESSAGES: usize = 2_000;
/// Runs killed with SIGKILL; one more run then finishes the drain.
const KILLS: u32 = 20;
/// Deliveries each worker runs at once.
const CONCURRENCY: usize = 4;
/// The worker's lease: short, so claims of a killed run come back soon.
const LEASE_MS: u64 = 2_000;
/// Each handler takes this long (fixed per message), so the drain outlasts
/// the kill schedule at `CONCURRENCY` and kills land on running handlers.
const WORK_MS: &str = "20-60";
/// A run is killed this long after it was started (uniform, in ms).
const KILL_AFTER_MS: (u64, u64) = (200, 1_200);
/// The last run must drain the rest within this.
const LAST_RUN_LIMIT: Duration = Duration::from_secs(60);
/// Above the number of runs, so that a message claimed by every killed run
/// is still not dead-lettered as an abandoned claim (each claim counts an
/// attempt): the harness checks delivery, not the attempt budget.
const MAX_ATTEMPTS: u32 = KILLS + 5;
/// Messages per enqueue transaction.
const ENQUEUE_CHUNK: u64 = 500;

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn sqlite_survives_twenty_kills() {
    let dir = scratch_dir("sqlite");
    let url = format!("sqlite://{}", dir.join("crash.db").display());
    let store = outbox::SqliteOutbox::connect(&url)
        .await
        .expect("open the harness database");
    let subject = Subject::Sqlite(store);
    subject.fill().await;
    crash_and_verify("sqlite", &subject, &dir, &["--store", &url]).await;
    subject.close().await;
    std::fs::remove_dir_all(&dir).ok();
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn postgres_survives_twenty_kills() {
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| {
        panic!(
            "DATABASE_URL is not set. The PostgreSQL crash harness needs a server: run it with \
             `scripts/with-postgres cargo test -p outbox-bench --all-features --test crash`"
        )
    });
    let dir = scratch_dir("postgres");
    let table = format!("crash_{}_{}", std::process::id(), nanos() % 1_000_000_000);
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&url)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to DATABASE_URL: {e}"));
    let store = outbox::PostgresOutbox::builder(pool)
        .table(&table)
        .expect("a valid table name")
        .build();
    store.setup().await.expect("create the harness table");
    let subject = Subject::Postgres(store);
    subject.fill().await;
    crash_and_verify(
        "postgres",
        &subject,
        &dir,
        &["--store", &url, "--table", &table],
    )
    .await;
    outbox_bench::store::postgres::drop_tables(&url, &table).await;
    subject.close().await;
    std::fs::remove_dir_all(&dir).ok();
}

/// The store under test, as the harness reads it (the worker opens its own).
enum Subject {
    #[cfg(feature = "sqlite")]
    Sqlite(outbox::SqliteOutbox),
    #[cfg(feature = "postgres")]
    Postgres(outbox::PostgresOutbox),
}

impl Subject {
    /// Enqueue `MESSAGES` messages with known ids, a few transactions of
    /// `ENQUEUE_CHUNK`.
    async fn fill(&self) {
        let range = 0..MESSAGES as u64;
        let messages = |n: u64| message(&message_id(n as usize));
        match self {
            #[cfg(feature = "sqlite")]
            Subject::Sqlite(store) => fill(store, range, ENQUEUE_CHUNK, messages).await,
            #[cfg(feature = "postgres")]
            Subject::Postgres(store) => fill(store, range, ENQUEUE_CHUNK, messages).await,
        }
        let stats = self.stats().await;
        assert_eq!(
            stats.pending, MESSAGES as u64,
            "the harness starts from {MESSAGES} pending messages: {stats:?}"
        );
    }

    /// Ids of the messages that are not delivered.
    async fn not_delivered(&self) -> HashSet<String> {
        let ids: Vec<String> = match self {
            #[cfg(feature = "sqlite")]
            Subject::Sqlite(store) => {
                sqlx::query_scalar(AssertSqlSafe(not_delivered_sql(&store.table().quoted())))
                    .fetch_all(store.pool())
                    .await
                    .expect("read the undelivered messages")
            }
            #[cfg(feature = "postgres")]
            Subject::Postgres(store) => {
                sqlx::query_scalar(AssertSqlSafe(not_delivered_sql(&store.table().quoted())))
                    .fetch_all(store.pool())
                    .await
                    .expect("read the undelivered messages")
            }
        };
        ids.into_iter().collect()
    }

    /// Close the harness's own connections.
    async fn close(self) {
        match self {
            #[cfg(feature = "sqlite")]
            Subject::Sqlite(store) => store.pool().close().await,
            #[cfg(feature = "postgres")]
            Subject::Postgres(store) => store.pool().close().await,
        }
    }

    async fn stats(&self) -> OutboxStats {
        let now = SystemClock.now();
        match self {
            #[cfg(feature = "sqlite")]
            Subject::Sqlite(store) => store.stats(now).await,
            #[cfg(feature = "postgres")]
            Subject::Postgres(store) => store.stats(now).await,
        }
        .expect("read the store's counts")
    }
}

fn not_delivered_sql(table: &str) -> String {
    format!("SELECT id FROM {table} WHERE status <> 'delivered'")
}

fn message_id(n: usize) -> String {
    format!("crash-{n:05}")
}

/// A message the worker handles (`crash.tick`, its registered event).
fn message(id: &str) -> NewMessage {
    NewMessage::new(
        MessageKind::Event,
        "crash.tick",
        serde_json::json!({ "n": id.trim_start_matches("crash-").parse::<u64>().unwrap() }).into(),
    )
    .with_id(id)
    .with_max_attempts(MAX_ATTEMPTS)
}

/// Kill the worker `KILLS` times, let the last run finish, and check the
/// log and the store. `store_args` tell the worker where the outbox is.
async fn crash_and_verify(label: &str, subject: &Subject, dir: &Path, store_args: &[&str]) {
    let seed = seed();
    println!(
        "crash harness ({label}): seed {seed}; replay the schedule with \
         OUTBOX_CRASH_SEED={seed} cargo test -p outbox-bench --all-features --test crash"
    );
    let mut rng = SplitMix64(seed);
    let log = dir.join("deliveries.log");
    let stderr = dir.join("worker.stderr");
    let started = Instant::now();

    // Messages in flight at each kill: started by that run (the log), not
    // delivered right after it died (the store).
    let mut in_flight: BTreeMap<u32, HashSet<String>> = BTreeMap::new();
    for run in 0..KILLS {
        let mut child = spawn_worker(store_args, &log, &stderr, run);
        let after = rng.between(KILL_AFTER_MS.0, KILL_AFTER_MS.1);
        tokio::time::sleep(Duration::from_millis(after)).await;
        if let Some(status) = child.try_wait().expect("poll the worker") {
            panic!(
                "run {run} exited by itself ({status}) before its kill at {after} ms: the \
                 store drained after {run} kills, or the worker failed (seed {seed}); its \
                 stderr: {}",
                read_or_empty(&stderr)
            );
        }
        // `Child::kill` is SIGKILL on Unix: no shutdown, no released claims.
        child.kill().expect("SIGKILL the worker");
        child.wait().expect("reap the worker");
        let started_here: HashSet<String> = read_log(&log)
            .into_iter()
            .filter(|line| line.event == LogEvent::Start && line.run == run)
            .map(|line| line.id)
            .collect();
        let undelivered = subject.not_delivered().await;
        in_flight.insert(
            run,
            started_here
                .into_iter()
                .filter(|id| undelivered.contains(id))
                .collect(),
        );
    }

    let mut last = spawn_worker(store_args, &log, &stderr, KILLS);
    let deadline = Instant::now() + LAST_RUN_LIMIT;
    let status = loop {
        if let Some(status) = last.try_wait().expect("poll the worker") {
            break status;
        }
        if Instant::now() > deadline {
            last.kill().ok();
            last.wait().ok();
            panic!(
                "the last run did not drain within {LAST_RUN_LIMIT:?} (seed {seed}): {:?}; \
                 its stderr: {}",
                subject.stats().await,
                read_or_empty(&stderr)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        status.success(),
        "the last run failed ({status}, seed {seed}); its stderr: {}",
        read_or_empty(&stderr)
    );

    let verdict = Verdict::judge(&read_log(&log), &in_flight, subject).await;
    println!(
        "crash harness ({label}): N={MESSAGES} delivered={} lost={} stuck={} duplicates={} \
         kills={KILLS} bound={} (messages in flight at the kills: {} mid-handler, {} \
         finished but unsettled; at most {} at one kill, concurrency {CONCURRENCY}) \
         seed={seed} in {:.1}s",
        verdict.delivered,
        verdict.lost,
        verdict.stuck,
        verdict.duplicates,
        verdict.bound,
        verdict.bound - verdict.finished_unsettled,
        verdict.finished_unsettled,
        verdict.max_in_flight,
        started.elapsed().as_secs_f64()
    );
    assert_eq!(
        verdict.lost, 0,
        "lost messages (seed {seed}): {:?}",
        verdict.lost_ids
    );
    assert_eq!(
        verdict.stuck, 0,
        "messages still pending or claimed (seed {seed})"
    );
    assert!(
        verdict.unexplained.is_empty(),
        "duplicates no kill explains, as (message, run that started it before): {:?} \
         (seed {seed}; log {})",
        verdict.unexplained,
        log.display()
    );
    assert!(
        verdict.duplicates <= verdict.bound,
        "{} duplicates, more than the {} messages in flight at the kills (seed {seed})",
        verdict.duplicates,
        verdict.bound
    );
}

/// What the log and the store say after the last run.
struct Verdict {
    /// Messages the store holds as delivered whose handler ran to its end.
    delivered: usize,
    /// Messages not delivered, or delivered without a finished handler.
    lost: usize,
    lost_ids: Vec<String>,
    /// Pending plus claimed at the end.
    stuck: u64,
    /// Handler starts beyond the first, over all messages.
    duplicates: usize,
    /// The sum over the kills of the messages in flight at each.
    bound: usize,
    /// The most messages in flight at one kill.
    max_in_flight: usize,
    /// Of `bound`: messages whose handler had finished in the killed run
    /// (the rest were cut mid-handler), their settlement not yet stored.
    finished_unsettled: usize,
    /// Restarts of a message that was not in flight when the run that
    /// started it before was killed: (message, that run).
    unexplained: Vec<(String, u32)>,
}

impl Verdict {
    async fn judge(
        log: &[LogLine],
        in_flight: &BTreeMap<u32, HashSet<String>>,
        subject: &Subject,
    ) -> Self {
        let mut starts: HashMap<&str, Vec<u32>> = HashMap::new();
        let mut ended: HashSet<&str> = HashSet::new();
        let mut ended_in_run: HashSet<(u32, &str)> = HashSet::new();
        for line in log {
            match line.event {
                LogEvent::Start => starts.entry(&line.id).or_default().push(line.run),
                LogEvent::End => {
                    ended.insert(&line.id);
                    ended_in_run.insert((line.run, &line.id));
                }
            }
        }
        let finished_unsettled = in_flight
            .iter()
            .flat_map(|(run, ids)| ids.iter().map(move |id| (*run, id.as_str())))
            .filter(|key| ended_in_run.contains(key))
            .count();
        let undelivered = subject.not_delivered().await;
        let stats = subject.stats().await;
        let lost_ids: Vec<String> = (0..MESSAGES)
            .map(message_id)
            .filter(|id| undelivered.contains(id) || !ended.contains(id.as_str()))
            .collect();
        let mut duplicates = 0;
        let mut unexplained = Vec::new();
        for (id, runs) in &starts {
            duplicates += runs.len() - 1;
            // Each start but the last must have been cut short by a kill
            // of its run, in a later run, while in flight.
            for pair in runs.windows(2) {
                let (before, after) = (pair[0], pair[1]);
                let killed_in_flight = in_flight.get(&before).is_some_and(|ids| ids.contains(*id));
                if !(killed_in_flight && after > before) {
                    unexplained.push(((*id).to_owned(), before));
                }
            }
        }
        unexplained.sort();
        Verdict {
            delivered: MESSAGES - lost_ids.len(),
            lost: lost_ids.len(),
            lost_ids,
            stuck: stats.pending + stats.claimed,
            duplicates,
            bound: in_flight.values().map(HashSet::len).sum(),
            max_in_flight: in_flight.values().map(HashSet::len).max().unwrap_or(0),
            finished_unsettled,
            unexplained,
        }
    }
}

fn spawn_worker(store_args: &[&str], log: &Path, stderr: &Path, run: u32) -> Child {
    let stderr = OpenOptions::new()
        .create(true)
        .append(true)
        .open(stderr)
        .expect("open the worker's stderr file");
    Command::new(env!("CARGO_BIN_EXE_crash_worker"))
        .args(store_args)
        .arg("--log")
        .arg(log)
        .args(["--run", &run.to_string()])
        .args(["--concurrency", &CONCURRENCY.to_string()])
        .args(["--lease-ms", &LEASE_MS.to_string()])
        .args(["--work-ms", WORK_MS])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("start crash_worker")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LogEvent {
    Start,
    End,
}

/// One line of the worker's delivery log.
#[derive(Debug)]
struct LogLine {
    event: LogEvent,
    run: u32,
    id: String,
}

/// Every line of the log; a line that does not parse fails the test, since
/// the worker writes each line whole.
fn read_log(path: &Path) -> Vec<LogLine> {
    let text = read_or_empty(path);
    text.lines()
        .enumerate()
        .map(|(n, line)| {
            parse_line(line)
                .unwrap_or_else(|| panic!("line {} of {} is torn: {line:?}", n + 1, path.display()))
        })
        .collect()
}

/// `start|end <run> <id> <attempt> <µs>`.
fn parse_line(line: &str) -> Option<LogLine> {
    let mut fields = line.split(' ');
    let event = match fields.next()? {
        "start" => LogEvent::Start,
        "end" => LogEvent::End,
        _ => return None,
    };
    let run = fields.next()?.parse().ok()?;
    let id = fields.next()?.to_owned();
    let _attempt: u32 = fields.next()?.parse().ok()?;
    let _micros: u64 = fields.next()?.parse().ok()?;
    fields
        .next()
        .is_none()
        .then_some(LogLine { event, run, id })
}

fn read_or_empty(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// A fresh directory for one harness run's database, log and stderr. Left
/// behind when the test fails, for a look at the log.
fn scratch_dir(label: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "outbox-crash-{label}-{}-{}",
        std::process::id(),
        nanos() % 1_000_000_000
    ));
    std::fs::create_dir_all(&dir).expect("create the harness directory");
    dir
}

fn nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_nanos()
}

/// `OUTBOX_CRASH_SEED`, else a new one from the clock.
fn seed() -> u64 {
    match std::env::var("OUTBOX_CRASH_SEED") {
        Ok(text) => text
            .parse()
            .unwrap_or_else(|e| panic!("OUTBOX_CRASH_SEED={text:?} is not a u64 seed: {e}")),
        Err(_) => nanos() as u64,
    }
}

/// SplitMix64: a small seeded generator, so the kill schedule replays.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `low..=high`.
    fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.next() % (high - low + 1)
    }
}
