//! The tracing events the inbox consumers emit: one constant per event
//! name, and [`ALL`], the list of them with their levels and fields.
//!
//! Every event has target `outbox::inbox` and a stable `event` field
//! holding one of these names, so log pipelines can match on it rather than
//! on the message text. The events of one message are emitted inside its
//! span, `inbox consume` (see the `consume` module). A payload
//! appears in one event only, [`RECEIVED`], at `trace` level.
//!
//! The consumers emit these constants, never a name written out: each name
//! is written once, here, with the level and fields it is emitted with, and
//! a test checks the guide's observability page against this list.
//!
//! ```
//! use outbox_brokers::events;
//!
//! let duplicate = events::ALL
//!     .iter()
//!     .find(|event| event.name == events::DUPLICATE)
//!     .expect("listed");
//! assert_eq!(duplicate.level, tracing::Level::INFO);
//! assert!(duplicate.fields.contains(&"consumer"));
//! ```

use tracing::Level;

/// One tracing event of the inbox consumers, as [`ALL`] lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct TracingEvent {
    /// The value of its `event` field: one of this module's constants.
    pub name: &'static str,
    /// The level it is emitted at.
    pub level: Level,
    /// The levels it is emitted at in the cases its description names
    /// instead; empty for most events.
    pub other_levels: &'static [Level],
    /// Its fields besides `event`, in the order they are recorded; a field
    /// the description calls optional is left out when it has no value.
    pub fields: &'static [&'static str],
    /// When it is emitted, in a sentence or two.
    pub description: &'static str,
}

/// Writes each event once: its constant, with a doc comment made of its
/// description, level and fields, and its entry in [`ALL`].
macro_rules! events {
    ($(
        $constant:ident = $name:literal at $level:ident $(or $other:ident)*,
        fields [$first:ident $(, $field:ident)*]:
        $description:literal;
    )*) => {
        $(
            #[doc = $description]
            #[doc = ""]
            #[doc = concat!(
                "Name `", $name, "`, level `", stringify!($level), "`",
                $(" (`", stringify!($other), "` as described)",)*
                ", fields `", stringify!($first), "`", $(", `", stringify!($field), "`",)*
                "."
            )]
            pub const $constant: &str = $name;
        )*

        /// Every event the inbox consumers emit: about one message first,
        /// then about the broker, then retention.
        pub const ALL: &[TracingEvent] = &[$(
            TracingEvent {
                name: $constant,
                level: Level::$level,
                other_levels: &[$(Level::$other),*],
                fields: &[stringify!($first) $(, stringify!($field))*],
                description: $description,
            },
        )*];
    };
}

events! {
    RECEIVED = "inbox.received" at TRACE,
        fields [consumer, id, name, source, payload]:
        "A message was taken from the broker and is about to be recorded. The only \
         event that carries the payload (as text, when it is UTF-8).";
    PROCESSED = "inbox.processed" at INFO,
        fields [consumer, id, name, source, deliveries]:
        "A message was new: the handler applied it and its record committed with its \
         effects; it is acknowledged next. `deliveries` when the broker counts them.";
    DUPLICATE = "inbox.duplicate" at INFO,
        fields [consumer, id, name, source, deliveries]:
        "A copy of a message this consumer already committed: acknowledged without \
         running the handler.";
    FAILED = "inbox.failed" at WARN,
        fields [consumer, id, name, stage, error]:
        "A message could not be applied: `stage` is `begin`, `record`, `handler` or \
         `commit`. The transaction rolled back and the broker redelivers the message.";
    TRACE_INVALID = "inbox.trace_invalid" at DEBUG,
        fields [consumer, id, error]:
        "A message's `traceparent` does not parse: its span starts a trace of its own. \
         Never fails the message.";
    REFUSED = "inbox.refused" at ERROR,
        fields [consumer, source, reason]:
        "A message carries no id to record, so its copies cannot be told apart: it is \
         refused without reaching a handler (each broker's consumer says how).";
    ACK_FAILED = "inbox.ack_failed" at WARN,
        fields [consumer, id, operation, error]:
        "The broker did not take an acknowledgement (`operation`: `ack`, `nak`, \
         `reject`, `commit`): after a commit, the redelivered copy is a duplicate and \
         acknowledged then.";
    RECEIVE_FAILED = "inbox.receive_failed" at WARN,
        fields [consumer, error]:
        "Receiving from the broker failed: the consumer connects and receives again after \
         its retry delay.";
    RETENTION = "inbox.retention" at INFO or DEBUG,
        fields [consumer, deleted, window_s]:
        "A retention run deleted `deleted` inbox rows of the consumer recorded more than \
         `window_s` ago; at `DEBUG` when it found none.";
    RETENTION_FAILED = "inbox.retention_failed" at WARN,
        fields [consumer, error]:
        "A retention run failed: the next one tries again.";
}
