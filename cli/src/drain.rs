//! `drain`: run the actor runtime over the store for operators without an
//! application of their own.
//!
//! The command line cannot know the application's payload types, so it
//! registers a catch-all for both kinds and hands every message on as
//! stored: to `sh -c CMD`, or to stdout as a JSON line. The coordinator does
//! everything else as it does in an application: leases, heartbeats,
//! retries with backoff, dead letters, and giving claims back at shutdown.

use std::pin::{Pin, pin};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use actix::Addr;
use futures_util::FutureExt;
use futures_util::future::LocalBoxFuture;
use outbox::{
    AnyOutbox, ArmOutcome, ConfigError, DeliveryContext, DeliveryResult, DrainConfig, EventBus,
    InProcessBus, InProcessJobs, JobDispatcher, MessageKind, Payload, QueueConfig, RawMessage,
    Registry, RetentionConfig, RetryPolicy, SystemClock, TraceCarrier, Wakeups,
};
use outbox_actors::{Drain, DrainCoordinator, DrainReport, GetStatus, Shutdown};
use serde::Serialize;
use tokio::io::AsyncWriteExt;

use crate::cli::{DrainArgs, RunArgs};
use crate::fail::Failure;
use crate::output::time;

/// How each message is delivered.
#[derive(Clone)]
enum Deliver {
    /// `sh -c CMD` with the payload on stdin.
    Exec(Arc<str>),
    /// One JSON line on stdout.
    Print,
}

/// `drain --once` or `drain --every`.
pub(crate) async fn drain(store: &AnyOutbox, args: DrainArgs) -> Result<(), Failure> {
    let deliver = match (&args.exec, args.print) {
        (Some(command), _) => Deliver::Exec(Arc::from(command.as_str())),
        (None, true) => Deliver::Print,
        (None, false) => return Err(Failure::usage("pass --exec CMD or --print")),
    };
    let to_bus = deliver.clone();
    let bus = InProcessBus::new()
        .on_any(move |message: Arc<RawMessage>, context| to_bus.deliver(&message, &context));
    let jobs = InProcessJobs::new()
        .on_any(move |message: RawMessage, context| deliver.deliver(&message, &context));
    let settings = Defaults {
        batch_size: 100,
        concurrency: 1,
        prefetch: DrainConfig::default().prefetch,
        every: None,
        doing: "draining",
    };
    let stop = pin!(stop_signal()?);
    run_passes(store, &args.run, settings, stop, bus, jobs).await
}

/// What a command runs with when its flags leave a setting out.
pub(crate) struct Defaults {
    pub(crate) batch_size: usize,
    pub(crate) concurrency: usize,
    pub(crate) prefetch: Option<usize>,
    /// The interval without --once or --every; `None` when one is required.
    pub(crate) every: Option<Duration>,
    /// How the command announces itself: `draining`, `relaying to …`.
    pub(crate) doing: &'static str,
}

/// Run passes over the store with `bus` and `jobs` as `args` says: one
/// (`--once`) or every interval until `stop` (Ctrl-C or SIGTERM, see
/// [`stop_signal`]), reporting each pass and the totals at the end.
pub(crate) async fn run_passes(
    store: &AnyOutbox,
    args: &RunArgs,
    defaults: Defaults,
    stop: Pin<&mut impl Future<Output = ()>>,
    bus: impl EventBus,
    jobs: impl JobDispatcher,
) -> Result<(), Failure> {
    let config = config(args, &defaults)?;
    let every = if args.once {
        None
    } else {
        args.every.or(defaults.every)
    };
    if every.is_some_and(|every| every.is_zero()) {
        return Err(Failure::usage("`--every` must be longer than zero"));
    }
    // This process enqueues nothing: only wake-ups from the application's
    // processes are any use.
    let wakeups = every.and_then(|_| store.cross_process_wakeups());
    let coordinator = start(store, config, bus, jobs)?;
    match every {
        None => once(&coordinator, stop, args.grace).await,
        Some(every) => {
            eprintln!(
                "{} table {} every {}{}; Ctrl-C stops",
                defaults.doing,
                store.table(),
                humantime::format_duration(every),
                if wakeups.is_some() {
                    " and on every commit"
                } else {
                    ""
                }
            );
            every_interval(&coordinator, stop, every, wakeups, args.grace).await
        }
    }
}

/// The drain settings from the flags, validated; errors name the flag.
fn config(args: &RunArgs, defaults: &Defaults) -> Result<DrainConfig, Failure> {
    let concurrency = args.concurrency.unwrap_or(defaults.concurrency);
    let config = DrainConfig {
        batch_size: args.batch_size.unwrap_or(defaults.batch_size),
        concurrency,
        queues: args
            .queue
            .iter()
            .map(|(name, n)| (name.clone(), QueueConfig::new(n.unwrap_or(concurrency))))
            .collect(),
        prefetch: args.prefetch.or(defaults.prefetch),
        lease: args.lease,
        heartbeat: args.heartbeat,
        max_active: args.max_active,
        retry: RetryPolicy::exponential(args.retry_delay, 2.0, args.retry_max_delay)
            .with_max_attempts(args.max_attempts),
        // The command line asks for each pass itself, to report each one.
        every: None,
        retention: RetentionConfig {
            delivered: args.retain_delivered,
            dead_lettered: args.retain_dead_lettered,
            delete_on_delivery: args.delete_on_delivery,
            every: args.retention_every,
            ..RetentionConfig::default()
        },
        ..DrainConfig::default()
    };
    config.validate().map_err(invalid_settings)?;
    Ok(config)
}

fn invalid_settings(error: ConfigError) -> Failure {
    let rules: Vec<String> = error
        .violations
        .iter()
        .map(|violation| format!("`{}` {}", flag(violation.field), violation.rule))
        .collect();
    Failure::usage(format!("invalid drain settings: {}", rules.join("; ")))
        .hint("see `outbox drain --help` for each flag's range")
}

/// The flag that sets a `DrainConfig` field.
fn flag(field: &str) -> String {
    match field {
        "retry.initial_delay" => "--retry-delay".to_owned(),
        "retry.max_delay" => "--retry-max-delay".to_owned(),
        "retry.max_attempts" => "--max-attempts".to_owned(),
        "retention.delivered" => "--retain-delivered".to_owned(),
        "retention.dead_lettered" => "--retain-dead-lettered".to_owned(),
        "retention.delete_on_delivery" => "--delete-on-delivery".to_owned(),
        "queues" | "queues.concurrency" => "--queue".to_owned(),
        field => format!("--{}", field.replace(['_', '.'], "-")),
    }
}

fn start(
    store: &AnyOutbox,
    config: DrainConfig,
    bus: impl EventBus,
    jobs: impl JobDispatcher,
) -> Result<Addr<DrainCoordinator>, Failure> {
    let registry = Registry::builder()
        .any(MessageKind::Event)
        .any(MessageKind::Job)
        .build()?;
    Ok(DrainCoordinator::builder(store.clone())
        .registry(registry)
        .event_bus(bus)
        .job_dispatcher(jobs)
        .config(config)
        .clock(SystemClock)
        // Passes start only when this command asks, so it reports each one.
        .wake_on_insert(false)
        .start()?)
}

enum PassEnd {
    /// It ran to its end.
    Finished(outbox_actors::Result<DrainReport>),
    /// A stop signal came while it ran: the coordinator wound it down and is
    /// shut down.
    Interrupted {
        /// What the pass did.
        result: outbox_actors::Result<DrainReport>,
        /// Passes the coordinator ran, this one included.
        passes: u64,
        /// Their totals.
        totals: DrainReport,
    },
}

/// Run one pass. A stop signal during it shuts the coordinator down, which
/// lets deliveries finish within `grace` and releases the rest; the pass's
/// `Drain` still answers, once the wind-down has ended the pass, so its
/// report is never lost.
async fn pass(
    coordinator: &Addr<DrainCoordinator>,
    stop: &mut Pin<&mut impl Future<Output = ()>>,
    grace: Duration,
) -> Result<PassEnd, Failure> {
    let mut drain = pin!(coordinator.send(Drain));
    tokio::select! {
        // A pass that has ended counts as finished, whatever else is ready.
        biased;
        result = &mut drain => Ok(PassEnd::Finished(result.map_err(mailbox)?)),
        () = stop.as_mut() => {
            announce_stop(grace);
            let (passes, totals) = shut_down(coordinator, grace).await?;
            // Answered when the pass ended, before the shutdown's answer; a
            // request the coordinator dropped as it stopped did nothing.
            let result = drain.await.unwrap_or_else(|_| Ok(DrainReport::default()));
            Ok(PassEnd::Interrupted { result, passes, totals })
        }
    }
}

/// One pass, unless a stop signal comes first, and whatever passes the
/// coordinator started by itself before the shutdown (retries that came
/// due): the totals count them all. Fails with [`FAILED_DELIVERIES`] when
/// any delivery failed.
async fn once(
    coordinator: &Addr<DrainCoordinator>,
    mut stop: Pin<&mut impl Future<Output = ()>>,
    grace: Duration,
) -> Result<(), Failure> {
    match pass(coordinator, &mut stop, grace).await? {
        PassEnd::Finished(result) => {
            let outcome = report_pass(result);
            let (passes, totals) = shut_down(coordinator, grace).await?;
            if passes > 1 {
                eprintln!(
                    "all {passes} passes ({} started by the coordinator itself, for \
                     retries that came due or messages left over): {totals}",
                    passes - 1
                );
            }
            outcome?;
            deliveries_failed(&totals)
        }
        PassEnd::Interrupted {
            result,
            passes,
            totals,
        } => {
            stopped(passes, totals, Some(result));
            Ok(())
        }
    }
}

/// Shut the coordinator down; the number of passes it ran and their totals,
/// including the passes it started by itself and the one the shutdown
/// interrupted, if any.
async fn shut_down(
    coordinator: &Addr<DrainCoordinator>,
    grace: Duration,
) -> Result<(u64, DrainReport), Failure> {
    // Both messages are queued now, one right behind the other: the status
    // has every pass that finished before the shutdown, and the shutdown
    // answers with the pass it interrupted (an empty report when none ran).
    let status = coordinator.send(GetStatus);
    let shutdown = coordinator.send(Shutdown { grace });
    let status = status.await.map_err(mailbox)?;
    let interrupted = shutdown.await.map_err(mailbox)?;
    let mut totals = status.totals;
    totals += interrupted;
    let passes = status.passes + u64::from(interrupted != DrainReport::default());
    Ok((passes, totals))
}

/// The exit code of a `--once` drain in which some delivery failed
/// (retried, dead-lettered, not settled, or its lease lost).
pub(crate) const FAILED_DELIVERIES: u8 = 3;

fn deliveries_failed(totals: &DrainReport) -> Result<(), Failure> {
    let failed =
        totals.retried + totals.dead_lettered + totals.settlement_failed + totals.lease_lost;
    if failed == 0 {
        return Ok(());
    }
    Err(Failure::with_code(
        FAILED_DELIVERIES,
        format!(
            "{failed} deliver{} failed",
            if failed == 1 { "y" } else { "ies" }
        ),
    )
    .hint("the messages are retried with backoff, or dead-lettered; see them with `outbox list`"))
}

/// A pass per tick (and per wake-up) until a stop signal. The totals printed
/// at the end are the coordinator's, so they include the passes it started
/// by itself between ticks.
async fn every_interval(
    coordinator: &Addr<DrainCoordinator>,
    mut stop: Pin<&mut impl Future<Output = ()>>,
    every: Duration,
    mut wakeups: Option<Wakeups>,
    grace: Duration,
) -> Result<(), Failure> {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut arming = Arming::default();
    loop {
        tokio::select! {
            biased;
            () = stop.as_mut() => {
                announce_stop(grace);
                let (passes, totals) = shut_down(coordinator, grace).await?;
                stopped(passes, totals, None);
                return Ok(());
            }
            _ = ticks.tick() => {}
            () = woken(&mut wakeups) => arming.armed = false,
            () = arming.retry() => {}
        }
        arming.arm(wakeups.as_ref()).await;
        match pass(coordinator, &mut stop, grace).await? {
            PassEnd::Finished(result) => report_tick(result),
            PassEnd::Interrupted {
                result,
                passes,
                totals,
            } => {
                stopped(passes, totals, Some(result));
                return Ok(());
            }
        }
    }
}

fn announce_stop(grace: Duration) {
    eprintln!(
        "stopping: deliveries in flight get {} to finish, then their claims are given back",
        humantime::format_duration(grace)
    );
}

/// Report the pass that a stop interrupted, if any, and the totals (which
/// count it already).
fn stopped(
    passes: u64,
    totals: DrainReport,
    interrupted: Option<outbox_actors::Result<DrainReport>>,
) {
    if let Some(result) = interrupted {
        let report = match result {
            Ok(report) => report,
            Err(error) => {
                eprintln!("the interrupted pass failed: {error}");
                error.report().copied().unwrap_or_default()
            }
        };
        eprintln!("interrupted pass: {report}");
    }
    eprintln!(
        "stopped after {passes} pass{}: {totals}",
        if passes == 1 { "" } else { "es" }
    );
}

/// Print the pass's report; a pass whose claim failed is an operational
/// error (what it finished before failing is printed first).
fn report_pass(result: outbox_actors::Result<DrainReport>) -> Result<DrainReport, Failure> {
    match result {
        Ok(report) => {
            eprintln!("pass: {report}");
            Ok(report)
        }
        Err(error) => {
            if let Some(report) = error.report() {
                eprintln!("pass: {report}");
            }
            Err(Failure::from(error))
        }
    }
}

/// Print a scheduled pass's report, stamped. Passes that found nothing are
/// not printed (a drain that runs every second would print little else); a
/// failed pass is printed, not fatal: the next tick tries again.
fn report_tick(result: outbox_actors::Result<DrainReport>) {
    let now = time(chrono::Utc::now());
    match result {
        Ok(report) if report.selected() == 0 && report.released == 0 => {}
        Ok(report) => eprintln!("{now} pass: {report}"),
        Err(error) => eprintln!("{now} pass failed, trying again at the next tick: {error}"),
    }
}

fn mailbox(error: actix::MailboxError) -> Failure {
    Failure::operational(format!(
        "the drain coordinator stopped unexpectedly: {error}"
    ))
}

/// Asking the store for a wake-up on the next commit, where commits wake
/// only drains that asked (PostgreSQL): the command starts every pass
/// itself, so it arms as the coordinator would for its own. It arms before
/// a pass claims, so what committed before the arming that pass sees, and
/// what commits after wakes the command; a wake-up uses the arming up.
#[derive(Default)]
struct Arming {
    /// ArmOutcome, and no wake-up since.
    armed: bool,
    /// When arming last failed or found an enqueue in flight (so not
    /// armed): the next pass comes this soon, since no wake-up will.
    retry_in: Option<Duration>,
}

impl Arming {
    /// The first wait before claiming again when arming found an enqueue
    /// in flight; it doubles up to [`Arming::MAX_RETRY`].
    const FIRST_RETRY: Duration = Duration::from_millis(1);
    const MAX_RETRY: Duration = Duration::from_millis(25);
    /// The wait after arming failed: a store that cannot answer gets no
    /// faster pace than this.
    const AFTER_FAILURE: Duration = Duration::from_secs(1);

    async fn arm(&mut self, wakeups: Option<&Wakeups>) {
        let Some(arm) = wakeups.and_then(Wakeups::arm) else {
            return;
        };
        if self.armed {
            return;
        }
        match arm.arm().await {
            Ok(ArmOutcome::Armed) => {
                self.armed = true;
                self.retry_in = None;
            }
            Ok(ArmOutcome::EnqueueInFlight) => {
                let wait = self
                    .retry_in
                    .map_or(Self::FIRST_RETRY, |wait| (wait * 2).min(Self::MAX_RETRY));
                self.retry_in = Some(wait);
            }
            Err(error) => {
                eprintln!(
                    "{} cannot ask the database for wake-ups, passing again in {}: {error}",
                    time(chrono::Utc::now()),
                    humantime::format_duration(Self::AFTER_FAILURE)
                );
                self.retry_in = Some(Self::AFTER_FAILURE);
            }
        }
    }

    /// Resolves when a pass is due because arming did not succeed; never
    /// while armed or without wake-ups.
    async fn retry(&self) {
        match self.retry_in {
            Some(wait) => tokio::time::sleep(wait).await,
            None => std::future::pending().await,
        }
    }
}

/// Resolves on the next committed insert; never, without wake-ups.
async fn woken(wakeups: &mut Option<Wakeups>) {
    if let Some(receiver) = wakeups
        && receiver.changed().await
    {
        return;
    }
    // The store stopped sending wake-ups: ticks alone drive passes now.
    *wakeups = None;
    std::future::pending().await
}

/// Resolves on Ctrl-C (SIGINT) or SIGTERM. The handlers are installed when
/// this is called, before any pass starts, so a signal never kills the
/// process mid-delivery.
#[cfg(unix)]
pub(crate) fn stop_signal() -> Result<impl Future<Output = ()>, Failure> {
    use tokio::signal::unix::{SignalKind, signal};
    let install = |kind| {
        signal(kind)
            .map_err(|e| Failure::operational(format!("cannot install the Ctrl-C handler: {e}")))
    };
    let mut interrupt = install(SignalKind::interrupt())?;
    let mut terminate = install(SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
    })
}

/// Resolves on Ctrl-C.
#[cfg(not(unix))]
pub(crate) fn stop_signal() -> Result<impl Future<Output = ()>, Failure> {
    Ok(async {
        let _ = tokio::signal::ctrl_c().await;
    })
}

impl Deliver {
    /// Deliver one message; the future is what the runtime races against
    /// the lease and `max_active` (dropping it kills the command).
    fn deliver(
        &self,
        message: &RawMessage,
        context: &DeliveryContext,
    ) -> LocalBoxFuture<'static, DeliveryResult> {
        let delivery = match self {
            Deliver::Print => std::future::ready(print(message, context)).boxed_local(),
            Deliver::Exec(command) => exec(command.clone(), message, context).boxed_local(),
        };
        reported(delivery, context)
    }
}

/// `delivery`, saying on stderr when it fails, with the message's label.
pub(crate) fn reported(
    delivery: LocalBoxFuture<'static, DeliveryResult>,
    context: &DeliveryContext,
) -> LocalBoxFuture<'static, DeliveryResult> {
    let label = label(context);
    delivery
        .map(move |result| {
            if let Err(error) = &result {
                eprintln!("{label} failed: {error}");
            }
            result
        })
        .boxed_local()
}

/// How a failed delivery names its message on stderr.
fn label(context: &DeliveryContext) -> String {
    let claimed = context.message();
    format!(
        "{} ({} {}, attempt {} of {})",
        claimed.id, claimed.kind, claimed.name, claimed.attempts, claimed.max_attempts
    )
}

/// A message as `--print` writes it.
#[derive(Serialize)]
struct Printed<'a> {
    id: &'a str,
    kind: MessageKind,
    name: &'a str,
    attempt: u32,
    max_attempts: u32,
    created_at: chrono::DateTime<chrono::Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    trace: Option<&'a TraceCarrier>,
    payload: &'a Payload,
}

fn print(message: &RawMessage, context: &DeliveryContext) -> DeliveryResult {
    use std::io::Write;
    let claimed = context.message();
    let line = serde_json::to_string(&Printed {
        id: &claimed.id,
        kind: message.kind,
        name: &message.name,
        attempt: claimed.attempts,
        max_attempts: claimed.max_attempts,
        created_at: claimed.created_at,
        trace: claimed.trace.as_ref(),
        payload: &message.payload,
    })?;
    // Delivered only once the line is out: a closed stdout fails the attempt.
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}

/// `sh -c COMMAND` exited unsuccessfully.
#[derive(Debug)]
struct CommandFailed {
    status: std::process::ExitStatus,
    stderr: String,
}

impl std::fmt::Display for CommandFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.status.code() {
            Some(code) => write!(f, "the command exited with status {code}")?,
            // Killed by a signal: the status says which.
            None => write!(f, "the command failed ({})", self.status)?,
        }
        if self.stderr.is_empty() {
            f.write_str(" and wrote nothing to stderr")
        } else {
            write!(f, ": {}", self.stderr)
        }
    }
}

impl std::error::Error for CommandFailed {}

/// Most of a failed command's stderr kept as its error: the last lines,
/// where the reason usually is.
const STDERR_LINES: usize = 10;
const STDERR_BYTES: usize = 2048;

fn stderr_tail(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim_end)
        .filter(|line| !line.is_empty())
        .collect();
    let tail = lines[lines.len().saturating_sub(STDERR_LINES)..].join("\n");
    if tail.len() <= STDERR_BYTES {
        return tail;
    }
    let mut start = tail.len() - STDERR_BYTES;
    while !tail.is_char_boundary(start) {
        start += 1;
    }
    format!("…{}", &tail[start..])
}

fn exec(
    command: Arc<str>,
    message: &RawMessage,
    context: &DeliveryContext,
) -> impl Future<Output = DeliveryResult> + 'static {
    let claimed = context.message();
    let mut shell = tokio::process::Command::new("sh");
    shell
        .arg("-c")
        .arg(&*command)
        .env("OUTBOX_ID", &claimed.id)
        .env("OUTBOX_NAME", &message.name)
        .env("OUTBOX_KIND", message.kind.as_str())
        .env("OUTBOX_ATTEMPT", claimed.attempts.to_string())
        .env("OUTBOX_MAX_ATTEMPTS", claimed.max_attempts.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::inherit())
        .stderr(Stdio::piped())
        // An aborted delivery (lease lost, max_active, shutdown) drops this
        // future: the command must not run on unowned.
        .kill_on_drop(true);
    let payload = message.payload.as_str().as_bytes().to_vec();
    run(shell, payload)
}

async fn run(mut shell: tokio::process::Command, payload: Vec<u8>) -> DeliveryResult {
    let mut child = shell.spawn()?;
    let mut stdin = child.stdin.take().expect("stdin is piped");
    let feed = async move {
        // A command that does not read its input closes the pipe early;
        // that is its business, and its exit status still decides.
        let _ = stdin.write_all(&payload).await;
    };
    let ((), output) = tokio::join!(feed, child.wait_with_output());
    let output = output?;
    if output.status.success() {
        return Ok(());
    }
    Err(CommandFailed {
        status: output.status,
        stderr: stderr_tail(&output.stderr),
    }
    .into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_errors_name_the_flag() {
        assert_eq!(flag("batch_size"), "--batch-size");
        assert_eq!(flag("max_active"), "--max-active");
        assert_eq!(flag("retry.initial_delay"), "--retry-delay");
        assert_eq!(flag("settlement.attempts"), "--settlement-attempts");
        assert_eq!(flag("retention.delivered"), "--retain-delivered");
        assert_eq!(flag("retention.delete_on_delivery"), "--delete-on-delivery");
        assert_eq!(flag("retention.every"), "--retention-every");
    }

    #[test]
    fn the_error_is_the_end_of_stderr() {
        let many: String = (1..=20).map(|n| format!("line {n}\n\n")).collect();
        let tail = stderr_tail(many.as_bytes());
        assert!(
            tail.starts_with("line 11\n") && tail.ends_with("line 20"),
            "{tail}"
        );
        let long = "é".repeat(3000);
        let tail = stderr_tail(long.as_bytes());
        assert!(tail.starts_with('…') && tail.len() <= STDERR_BYTES + 3);
    }
}
