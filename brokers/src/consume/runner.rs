//! The loop every inbox consumer runs, whatever its broker: receive, run
//! the message through the inbox, then acknowledge, have it redelivered or
//! refuse it, as the broker's [`Source`] does those; and retention beside
//! it.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use outbox::{InboxRetention, InboxStore, MAX_CONSUMER_LEN};
use tokio::time::MissedTickBehavior;

use super::apply::{Applied, apply};
use super::handler::InboxHandler;
use super::received::Received;
use super::telemetry;
use crate::{BrokerError, FailureClass};

/// A message a source cannot hand to a handler, and why.
pub(crate) struct Refusal {
    /// Where it came from.
    pub(crate) source: String,
    /// Why it cannot be consumed.
    pub(crate) reason: &'static str,
}

/// One broker's side of a consumer.
///
/// `next` is raced against shutdown only: what it took from the broker
/// when it is dropped goes back when the source closes (NATS and RabbitMQ
/// redeliver unacknowledged messages; Redis hands a member's pending
/// entries to it again, or to another member after `claim_idle`).
pub(crate) trait Source: Send + 'static {
    /// One message as the broker handed it over.
    type Delivery: Send;
    /// The broker, for spans: `nats`, `rabbitmq`, `redis`, `kafka`.
    const SYSTEM: &'static str;

    /// The next message; an error when the broker failed (the runner waits
    /// its retry delay, then calls again, and the source reconnects).
    fn next(&mut self) -> impl Future<Output = Result<Self::Delivery, BrokerError>> + Send;

    /// The message as a handler sees it, or why it is refused.
    fn read(&self, delivery: &Self::Delivery) -> Result<Received, Refusal>;

    /// Done with it: it was committed, or was a duplicate.
    fn ack(
        &mut self,
        delivery: Self::Delivery,
    ) -> impl Future<Output = Result<(), BrokerError>> + Send;

    /// It failed and was rolled back: have the broker deliver it again, not
    /// sooner than `delay` where the broker can wait.
    fn retry(
        &mut self,
        delivery: Self::Delivery,
        delay: Duration,
    ) -> impl Future<Output = Result<(), BrokerError>> + Send;

    /// It cannot be consumed: take it out of the way for good, the
    /// broker's way (dead-letter it, or terminate it).
    fn refuse(
        &mut self,
        delivery: Self::Delivery,
        reason: &'static str,
    ) -> impl Future<Output = Result<(), BrokerError>> + Send;

    /// The consumer stops: let go of the broker (what was received and not
    /// acknowledged goes back to it).
    fn close(&mut self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// What a consumer did from its start to its shutdown.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConsumerReport {
    /// Messages applied and committed.
    pub processed: u64,
    /// Copies of committed messages, acknowledged without the handler.
    pub duplicates: u64,
    /// Messages rolled back and handed back for redelivery.
    pub failed: u64,
    /// Messages refused for want of an id.
    pub refused: u64,
    /// Receives the broker failed.
    pub receive_failures: u64,
    /// Inbox rows deleted by retention.
    pub retention_deleted: u64,
}

/// The settings every consumer shares.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// The consumer's name in the inbox.
    pub(crate) consumer: String,
    /// How long inbox rows of this consumer are kept; `None` keeps them.
    pub(crate) retention: Option<InboxRetention>,
    /// How long a failed message waits before it is delivered again, and
    /// a failed receive before the next.
    pub(crate) retry_delay: Duration,
}

impl Settings {
    /// The defaults for a consumer named `consumer`: 7 days of retention,
    /// a retry delay of 1 s. A name the inbox would refuse is refused now,
    /// rather than with every message.
    pub(crate) fn new(
        broker: &'static str,
        consumer: impl Into<String>,
    ) -> Result<Self, BrokerError> {
        let consumer = consumer.into();
        let refuse = |reason: String| {
            Err(BrokerError::new(
                broker,
                "configure",
                FailureClass::Permanent,
                format!("the consumer name {consumer:?} {reason}"),
            ))
        };
        if consumer.trim().is_empty() {
            return refuse("is empty; name the consuming application".into());
        }
        if consumer.len() > MAX_CONSUMER_LEN || consumer.contains('\0') {
            return refuse(format!(
                "must be at most {MAX_CONSUMER_LEN} bytes, without NUL characters"
            ));
        }
        Ok(Settings {
            consumer,
            retention: Some(InboxRetention::default()),
            retry_delay: Duration::from_secs(1),
        })
    }
}

/// A consumer: a source, an inbox, a handler and the settings.
pub(crate) struct Runner<S, I, H> {
    pub(crate) source: S,
    pub(crate) inbox: I,
    pub(crate) handler: H,
    pub(crate) settings: Settings,
}

impl<S, I, H> Runner<S, I, H>
where
    S: Source,
    I: InboxStore,
    H: InboxHandler<I::Database>,
{
    /// Consume until `shutdown` completes; a message being applied when it
    /// does is finished and acknowledged first. Retention runs beside the
    /// loop, in the same task, so it never cuts a receive short.
    pub(crate) async fn run(self, shutdown: impl Future<Output = ()> + Send) -> ConsumerReport {
        let Runner {
            mut source,
            inbox,
            handler,
            settings,
        } = self;
        let mut report = ConsumerReport::default();
        let deleted = AtomicU64::new(0);
        {
            let consuming = consume(
                &mut source,
                &inbox,
                &handler,
                &settings,
                &mut report,
                shutdown,
            );
            let retaining = retain(&inbox, &settings, &deleted);
            tokio::select! {
                biased;
                () = consuming => {}
                () = retaining => {}
            }
        }
        source.close().await;
        report.retention_deleted = deleted.load(Ordering::Relaxed);
        report
    }
}

/// The receive loop, until `shutdown`.
async fn consume<S, I, H>(
    source: &mut S,
    inbox: &I,
    handler: &H,
    settings: &Settings,
    report: &mut ConsumerReport,
    shutdown: impl Future<Output = ()> + Send,
) where
    S: Source,
    I: InboxStore,
    H: InboxHandler<I::Database>,
{
    let mut shutdown = pin!(shutdown);
    loop {
        let next = tokio::select! {
            biased;
            () = &mut shutdown => return,
            next = source.next() => next,
        };
        match next {
            Ok(delivery) => one(source, inbox, handler, settings, report, delivery).await,
            Err(error) => {
                report.receive_failures += 1;
                telemetry::receive_failed(&settings.consumer, &error);
                tokio::select! {
                    biased;
                    () = &mut shutdown => return,
                    () = tokio::time::sleep(settings.retry_delay) => {}
                }
            }
        }
    }
}

/// One delivery: refused, or run through the inbox and then acknowledged
/// or handed back.
async fn one<S, I, H>(
    source: &mut S,
    inbox: &I,
    handler: &H,
    settings: &Settings,
    report: &mut ConsumerReport,
    delivery: S::Delivery,
) where
    S: Source,
    I: InboxStore,
    H: InboxHandler<I::Database>,
{
    let consumer = &settings.consumer;
    let message = match source.read(&delivery) {
        Ok(message) => message,
        Err(refusal) => {
            report.refused += 1;
            telemetry::refused(consumer, &refusal.source, refusal.reason);
            if let Err(error) = source.refuse(delivery, refusal.reason).await {
                telemetry::ack_failed(consumer, None, error.operation, &error);
            }
            return;
        }
    };
    let answered = match apply(inbox, consumer, S::SYSTEM, handler, &message).await {
        Applied::Processed => {
            report.processed += 1;
            source.ack(delivery).await
        }
        Applied::Duplicate => {
            report.duplicates += 1;
            source.ack(delivery).await
        }
        Applied::Failed => {
            report.failed += 1;
            source.retry(delivery, settings.retry_delay).await
        }
    };
    if let Err(error) = answered {
        telemetry::ack_failed(consumer, Some(&message.id), error.operation, &error);
    }
}

/// Retention runs, the first at once (a consumer that was down a while
/// catches up), then every `retention.every`; never returns. Without
/// retention, waits forever.
async fn retain<I: InboxStore>(inbox: &I, settings: &Settings, deleted: &AtomicU64) {
    let Some(retention) = settings.retention else {
        return std::future::pending().await;
    };
    let consumer = &settings.consumer;
    let mut timer = tokio::time::interval(retention.every);
    timer.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        timer.tick().await;
        match inbox.purge_expired(consumer, &retention).await {
            Ok(done) => {
                deleted.fetch_add(done, Ordering::Relaxed);
                telemetry::retention(consumer, done, retention.window);
            }
            Err(error) => telemetry::retention_failed(consumer, &error),
        }
    }
}
