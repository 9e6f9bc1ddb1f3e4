//! Which topic a message name maps to, and whether Kafka accepts it.

/// The longest topic name Kafka accepts.
pub const MAX_TOPIC_LEN: usize = 249;

/// A message name whose topic Kafka would refuse.
///
/// Returned by [`KafkaTransport::topic`](super::KafkaTransport::topic),
/// and kept as the source of the permanent [`BrokerError`](crate::BrokerError)
/// a publish of such a message fails with, so the message is dead-lettered
/// at once with a reason naming it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "message name `{name}` maps to Kafka topic `{topic}`, which {reason}: \
     rename it in the name map"
)]
pub struct InvalidTopic {
    /// The message name, as enqueued.
    pub name: String,
    /// The topic the name map gave it.
    pub topic: String,
    /// What Kafka would object to.
    pub reason: &'static str,
}

/// Why Kafka would refuse `topic`, if it would.
pub(crate) fn check(topic: &str) -> Result<(), &'static str> {
    if topic.is_empty() {
        return Err("is empty");
    }
    if topic == "." || topic == ".." {
        return Err("is `.` or `..`");
    }
    if topic.len() > MAX_TOPIC_LEN {
        return Err("is longer than 249 characters");
    }
    if !topic
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err("has a character outside [a-zA-Z0-9._-]");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{MAX_TOPIC_LEN, check};

    #[test]
    fn kafka_topic_rules() {
        assert_eq!(check("events.orders-placed_v2"), Ok(()));
        assert_eq!(check(&"a".repeat(MAX_TOPIC_LEN)), Ok(()));
        assert_eq!(
            check(&"a".repeat(MAX_TOPIC_LEN + 1)),
            Err("is longer than 249 characters")
        );
        assert_eq!(check(""), Err("is empty"));
        assert_eq!(check(".."), Err("is `.` or `..`"));
        for bad in ["orders placed", "orders/placed", "orders:placed", "ordérs"] {
            assert_eq!(
                check(bad),
                Err("has a character outside [a-zA-Z0-9._-]"),
                "{bad}"
            );
        }
    }
}
