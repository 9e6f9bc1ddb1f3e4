//! Tracing and metrics of the inbox consumers: one span per message, one
//! hook per outcome that emits its event and records its metrics, so the
//! two never disagree. Each event's name, level and fields are listed in
//! [`events`](crate::events); a hook that changes one changes that list.

use std::time::Duration;

use tracing::Span;

use super::received::Received;
use crate::{events, metrics};

/// The span one message is consumed in: `inbox consume`, a child of the
/// trace the message carries (with the `opentelemetry` feature), else a
/// root span.
pub(crate) fn span(consumer: &str, system: &'static str, message: &Received) -> Span {
    let span = tracing::info_span!(
        target: "outbox::inbox",
        parent: None,
        "inbox consume",
        otel.name = %format_args!("inbox consume {}", message.label()),
        otel.kind = "consumer",
        messaging.system = system,
        messaging.destination.name = %message.source,
        inbox.consumer = %consumer,
        outbox.message_id = %message.id,
        outbox.message_name = message.name.as_deref(),
    );
    if let Some(carrier) = &message.trace
        && let Err(error) = carrier.set_parent_of(&span)
    {
        tracing::debug!(target: "outbox::inbox", parent: &span, event = events::TRACE_INVALID,
            consumer, id = %message.id, %error,
            "the message's trace context is invalid; its consumption starts a new trace");
    }
    span
}

/// A message is about to be recorded. Call inside its span.
pub(crate) fn received(consumer: &str, message: &Received) {
    tracing::trace!(target: "outbox::inbox", event = events::RECEIVED, consumer,
        id = %message.id, name = message.name.as_deref(), source = %message.source,
        payload = message.payload_str(), "inbox message received");
}

pub(crate) fn processed(consumer: &str, message: &Received, took: Duration) {
    tracing::info!(target: "outbox::inbox", event = events::PROCESSED, consumer,
        id = %message.id, name = message.name.as_deref(), source = %message.source,
        deliveries = message.deliveries, "inbox message processed");
    metrics::processed(consumer, took);
}

pub(crate) fn duplicate(consumer: &str, message: &Received, took: Duration) {
    tracing::info!(target: "outbox::inbox", event = events::DUPLICATE, consumer,
        id = %message.id, name = message.name.as_deref(), source = %message.source,
        deliveries = message.deliveries,
        "inbox message already processed; acknowledged without its handler");
    metrics::duplicate(consumer, took);
}

pub(crate) fn failed(
    consumer: &str,
    message: &Received,
    stage: &'static str,
    error: &(dyn std::error::Error + 'static),
    took: Duration,
) {
    tracing::warn!(target: "outbox::inbox", event = events::FAILED, consumer,
        id = %message.id, name = message.name.as_deref(), stage,
        error = %Chain(error), "inbox message failed; rolled back for redelivery");
    metrics::failed(consumer, stage, took);
}

pub(crate) fn refused(consumer: &str, source: &str, reason: &str) {
    tracing::error!(target: "outbox::inbox", event = events::REFUSED, consumer, source,
        reason, "inbox message refused");
    metrics::refused(consumer);
}

pub(crate) fn ack_failed(
    consumer: &str,
    id: Option<&str>,
    operation: &'static str,
    error: &(dyn std::error::Error + 'static),
) {
    tracing::warn!(target: "outbox::inbox", event = events::ACK_FAILED, consumer, id,
        operation, error = %Chain(error),
        "the broker did not take an inbox consumer's acknowledgement");
    metrics::ack_failed(consumer, operation);
}

pub(crate) fn receive_failed(consumer: &str, error: &(dyn std::error::Error + 'static)) {
    tracing::warn!(target: "outbox::inbox", event = events::RECEIVE_FAILED, consumer,
        error = %Chain(error), "an inbox consumer could not receive; trying again");
}

pub(crate) fn retention(consumer: &str, deleted: u64, window: Duration) {
    let window_s = window.as_secs();
    if deleted > 0 {
        tracing::info!(target: "outbox::inbox", event = events::RETENTION, consumer, deleted,
            window_s, "inbox retention deleted old records");
    } else {
        tracing::debug!(target: "outbox::inbox", event = events::RETENTION, consumer, deleted,
            window_s, "inbox retention found nothing to delete");
    }
    metrics::retention_deleted(consumer, deleted);
}

pub(crate) fn retention_failed(consumer: &str, error: &outbox::Error) {
    tracing::warn!(target: "outbox::inbox", event = events::RETENTION_FAILED, consumer,
        error = %Chain(error), "inbox retention failed");
}

/// An error with its causes, `a: b: c`.
struct Chain<'a>(&'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}
