//! A relayed message as a consumer received it, read from the headers the
//! relay set.

use outbox::TraceCarrier;

use crate::{
    HEADER_ATTEMPT, HEADER_ID, HEADER_KIND, HEADER_NAME, HEADER_TRACEPARENT, HEADER_TRACESTATE,
};

/// A message a consumer took from its broker, as the handler sees it.
///
/// The id is the outbox message id, from the `Outbox-Message-Id` header
/// (or the broker's own id field, where the relay sets one too); it is
/// what the inbox records. A message without one is refused before it
/// reaches a handler (see each broker's consumer for how).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Received {
    /// The outbox message id.
    pub id: String,
    /// The message name as enqueued (`Outbox-Name`), when the producer set
    /// it.
    pub name: Option<String>,
    /// `event` or `job` (`Outbox-Kind`), when set.
    pub kind: Option<String>,
    /// The relay's delivery attempt that published this copy
    /// (`Outbox-Attempt`), when set.
    pub attempt: Option<u32>,
    /// The body as published: the stored JSON, for messages of the relay.
    pub payload: Vec<u8>,
    /// The trace context of the enqueuing request (`traceparent`,
    /// `tracestate`), when it had one. The handler runs inside the
    /// consumer's span, a child of this context with the `opentelemetry`
    /// feature: `TraceCarrier::current()` in the handler gives the span's
    /// own context, to carry further.
    pub trace: Option<TraceCarrier>,
    /// Where it came from: the NATS subject, the AMQP queue, the Redis
    /// stream key or the Kafka topic.
    pub source: String,
    /// How many times the broker handed this message to a consumer,
    /// counting this time, where the broker counts (NATS, Redis); `None`
    /// elsewhere.
    pub deliveries: Option<u64>,
    /// Every header (field, for Redis Streams) as received, the payload
    /// aside.
    pub headers: Vec<(String, String)>,
}

impl Received {
    /// Read a message from its headers; `fallback_id` is the broker's own
    /// id field, used when the header is missing. `Err` says why the
    /// message cannot be consumed.
    pub(crate) fn from_headers(
        headers: Vec<(String, String)>,
        payload: Vec<u8>,
        source: String,
        fallback_id: Option<String>,
    ) -> Result<Received, &'static str> {
        let find = |name: &str| {
            headers
                .iter()
                .find(|(key, _)| key.eq_ignore_ascii_case(name))
                .map(|(_, value)| value.clone())
        };
        let id = find(HEADER_ID)
            .or(fallback_id)
            .filter(|id| !id.trim().is_empty())
            .ok_or(
                "it has no `Outbox-Message-Id` header, so the inbox cannot tell its copies apart",
            )?;
        let trace = find(HEADER_TRACEPARENT).map(|traceparent| TraceCarrier {
            traceparent,
            tracestate: find(HEADER_TRACESTATE),
        });
        Ok(Received {
            id,
            name: find(HEADER_NAME),
            kind: find(HEADER_KIND),
            attempt: find(HEADER_ATTEMPT).and_then(|attempt| attempt.parse().ok()),
            trace,
            payload,
            source,
            deliveries: None,
            headers,
        })
    }

    /// The payload as text, when it is UTF-8.
    pub fn payload_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.payload).ok()
    }

    /// The payload decoded from JSON.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> serde_json::Result<T> {
        serde_json::from_slice(&self.payload)
    }

    /// The first header named `name` (ASCII case ignored).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    /// The name for logs and spans: the message name, else the source.
    pub(crate) fn label(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.source)
    }
}

#[cfg(test)]
mod tests {
    use super::Received;

    fn headers(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn reads_the_relays_headers() {
        let received = Received::from_headers(
            headers(&[
                ("outbox-message-id", "m-1"),
                ("Outbox-Name", "order.placed"),
                ("Outbox-Kind", "event"),
                ("Outbox-Attempt", "2"),
                (
                    "traceparent",
                    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                ),
            ]),
            br#"{"n":1}"#.to_vec(),
            "events.order.placed".to_owned(),
            Some("ignored".to_owned()),
        )
        .unwrap();
        assert_eq!(received.id, "m-1");
        assert_eq!(received.name.as_deref(), Some("order.placed"));
        assert_eq!(received.attempt, Some(2));
        assert_eq!(received.trace.as_ref().unwrap().tracestate, None);
        assert_eq!(received.json::<serde_json::Value>().unwrap()["n"], 1);
    }

    #[test]
    fn falls_back_on_the_brokers_id_and_refuses_a_message_without_either() {
        let fallback = Received::from_headers(
            Vec::new(),
            Vec::new(),
            "q".to_owned(),
            Some("m-2".to_owned()),
        )
        .unwrap();
        assert_eq!(fallback.id, "m-2");
        assert_eq!(fallback.label(), "q");
        assert!(Received::from_headers(Vec::new(), Vec::new(), "q".to_owned(), None).is_err());
        assert!(
            Received::from_headers(
                headers(&[("Outbox-Message-Id", " ")]),
                Vec::new(),
                "q".to_owned(),
                None
            )
            .is_err()
        );
    }
}
