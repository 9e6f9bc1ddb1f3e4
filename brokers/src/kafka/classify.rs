//! Which Kafka failures a retry can fix.

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use crate::FailureClass;

/// Refusals that stay refusals however often the message is published
/// again: dead-letter at once. Everything else (a broker down or moving, a
/// leader election, a timeout, a full local queue, back-pressure) is
/// retried with the message's backoff.
pub(crate) fn class_of(code: RDKafkaErrorCode) -> FailureClass {
    use RDKafkaErrorCode as E;
    match code {
        // The topic is not in the cluster and the broker does not create
        // topics on demand (librdkafka's own code after
        // `topic.metadata.propagation.max.ms`, or the broker's).
        E::UnknownTopic
        | E::UnknownTopicOrPartition
        | E::UnknownPartition
        | E::InvalidTopic
        // Too large for the client's `message.max.bytes` or the topic's
        // `max.message.bytes`.
        | E::MessageSizeTooLarge
        | E::InvalidMessageSize
        | E::MessageBatchTooLarge
        | E::InvalidRecord
        | E::UnsupportedForMessageFormat
        | E::PolicyViolation
        // Authorization and authentication.
        | E::TopicAuthorizationFailed
        | E::ClusterAuthorizationFailed
        | E::TransactionalIdAuthorizationFailed
        | E::SaslAuthenticationFailed
        | E::Authentication
        | E::UnsupportedSASLMechanism
        | E::IllegalSASLState
        // The producer's settings.
        | E::InvalidRequiredAcks
        | E::InvalidArgument => FailureClass::Permanent,
        _ => FailureClass::Transient,
    }
}

/// Whether a failed publish leaves the producer session in doubt: records
/// timed out with their fate unknown, or the broker lost track of the
/// producer or its sequence. librdkafka then bumps the session's epoch on
/// its own; the transport starts a new session instead.
pub(crate) fn ends_session(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode as E;
    matches!(
        code,
        E::MessageTimedOut
            | E::Unknown
            | E::UnknownProducerId
            | E::OutOfOrderSequenceNumber
            | E::InvalidProducerEpoch
            | E::InvalidProducerIdMapping
            | E::Fatal
    )
}

/// The class of a client error; one without a code (the client could not
/// even be created, say) is permanent when it is about configuration.
pub(crate) fn class_of_error(error: &KafkaError) -> FailureClass {
    match error {
        KafkaError::ClientConfig(..) | KafkaError::ClientCreation(_) => FailureClass::Permanent,
        _ => error
            .rdkafka_error_code()
            .map_or(FailureClass::Transient, class_of),
    }
}

#[cfg(test)]
mod tests {
    use rdkafka::error::{KafkaError, RDKafkaErrorCode as E};

    use super::{class_of, class_of_error, ends_session};
    use crate::FailureClass::{Permanent, Transient};

    #[test]
    fn refusals_are_permanent_and_outages_transient() {
        for code in [
            E::UnknownTopicOrPartition,
            E::MessageSizeTooLarge,
            E::TopicAuthorizationFailed,
            E::InvalidTopic,
        ] {
            assert_eq!(class_of(code), Permanent, "{code:?}");
        }
        for code in [
            E::MessageTimedOut,
            E::AllBrokersDown,
            E::NotLeaderForPartition,
            E::LeaderNotAvailable,
            E::RequestTimedOut,
            E::NotEnoughReplicas,
            E::QueueFull,
            E::PurgeInflight,
            E::Fatal,
        ] {
            assert_eq!(class_of(code), Transient, "{code:?}");
        }
        assert_eq!(
            class_of_error(&KafkaError::MessageProduction(E::MessageSizeTooLarge)),
            Permanent
        );
        assert_eq!(
            class_of_error(&KafkaError::ClientCreation("bad".into())),
            Permanent
        );
        assert_eq!(class_of_error(&KafkaError::Canceled), Transient);
    }

    #[test]
    fn a_session_in_doubt_ends() {
        for code in [E::MessageTimedOut, E::Unknown, E::OutOfOrderSequenceNumber] {
            assert!(ends_session(code), "{code:?}");
        }
        for code in [E::MessageSizeTooLarge, E::QueueFull, E::PurgeInflight] {
            assert!(!ends_session(code), "{code:?}");
        }
    }
}
