use std::fmt;

use outbox::DeliveryError;

/// Whether retrying a failed publish can succeed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FailureClass {
    /// The broker was unreachable, slow or pushing back: the message is
    /// retried with its backoff, like any failed delivery.
    Transient,
    /// The broker refused the message for a reason a retry cannot change
    /// (authorization, an unknown stream, exchange or topic, a message too
    /// large): the message is dead-lettered at once with the broker's
    /// reason.
    Permanent,
}

/// A publish the broker did not acknowledge.
///
/// Transports return it through [`BrokerError::into_delivery_error`].
#[derive(Debug, thiserror::Error)]
#[error("{broker} {operation} failed ({class:?}): {reason}")]
pub struct BrokerError {
    /// `nats`, `amqp`, `redis` or `kafka`.
    pub broker: &'static str,
    /// What was being done: `publish`, `connect`, `confirm`, ...
    pub operation: &'static str,
    /// Transient or permanent.
    pub class: FailureClass,
    /// The broker's reason, as it gave it.
    pub reason: String,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl BrokerError {
    /// A failure of `operation` on `broker`.
    pub fn new(
        broker: &'static str,
        operation: &'static str,
        class: FailureClass,
        reason: impl fmt::Display,
    ) -> Self {
        BrokerError {
            broker,
            operation,
            class,
            reason: reason.to_string(),
            source: None,
        }
    }

    /// The same failure, keeping the client library's error as its source.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// `true` when a retry cannot help.
    pub fn is_permanent(&self) -> bool {
        self.class == FailureClass::Permanent
    }

    /// The delivery error a transport returns: it keeps this error
    /// (observers can `downcast_ref::<BrokerError>()`) and is marked
    /// [`DeliveryError::permanent`] when the failure is.
    pub fn into_delivery_error(self) -> DeliveryError {
        let permanent = self.is_permanent();
        let delivery = DeliveryError::from(self);
        if permanent {
            delivery.permanent()
        } else {
            delivery
        }
    }
}

/// `url` without its password, for messages. Clients also take credentials
/// with no `//` after the scheme (`nats:user:pass@host`) or no scheme at
/// all (`user:pass@host`), and quote a URL they cannot parse: whatever
/// follows the scheme (or the user name) up to the last `@` is hidden.
#[cfg(any(feature = "nats", feature = "amqp"))]
pub(crate) fn redact(url: &str) -> String {
    let Some(at) = url.rfind('@') else {
        return url.to_owned();
    };
    let start = match url.find("://") {
        Some(scheme) if scheme < at => scheme + 3,
        _ => url[..at].find(':').map_or(0, |colon| colon + 1),
    };
    format!("{}***{}", &url[..start], &url[at..])
}
