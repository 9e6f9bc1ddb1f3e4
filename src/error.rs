//! The crate's error type.
//!
//! One enum, [`Error`], with the subsystem errors boxed in as their own types.
//! The runtime branches on exactly one distinction: [`Error::Claim`] means the
//! claim token no longer owns the message (confirmed loss, never retried);
//! every other store error is treated as transient.

use std::fmt;
use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::message::{MessageKind, MessageStatus};

/// `Result` with this crate's [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A shareable source error. Errors are `Clone` so one failure can be handed
/// to every caller waiting on it (coalesced drains share one report).
pub type SharedSource = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong in the outbox core and its stores.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The claim token no longer owns the message; the caller must not settle it.
    #[error(transparent)]
    Claim(#[from] ClaimError),
    /// A message used up its attempts without ever reaching a terminal state.
    #[error(transparent)]
    AbandonedClaim(#[from] AbandonedClaimError),
    /// A message name or payload does not match the registry.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// An admin operation was refused because it is unsafe.
    #[error(transparent)]
    Admin(#[from] AdminError),
    /// A configuration value breaks a rule; every violation is listed.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A parameter passed to a store operation is out of range.
    #[error("invalid `{field}`: {reason}")]
    InvalidInput {
        /// The parameter that was rejected.
        field: &'static str,
        /// What the parameter must be instead.
        reason: String,
    },
    /// A message with this id is already stored; the stored one is untouched.
    #[error(
        "an outbox message with id {id:?} already exists and was left untouched; \
         use a fresh id, or none to have one generated"
    )]
    DuplicateId {
        /// The id that is taken.
        id: String,
    },
    /// No message has this id.
    #[error("no outbox message has id {id:?}")]
    NotFound {
        /// The id that was looked up.
        id: String,
    },
    /// A configured SQL table name is not a plain (optionally schema-qualified)
    /// identifier, so it was not used.
    #[error(
        "invalid outbox table name {name:?}: {reason}; use letters, digits and \
         underscores, optionally as `schema.table`"
    )]
    InvalidTableName {
        /// The name as configured.
        name: String,
        /// The rule it breaks.
        reason: &'static str,
    },
    /// The store failed; the operation may or may not have taken effect and
    /// can be retried.
    #[error("outbox store failed during {operation}: {source}")]
    Store {
        /// The store operation that failed.
        operation: &'static str,
        /// The underlying error (database, I/O, pool).
        source: SharedSource,
    },
    /// A stored row could not be read back into a message.
    #[error("stored outbox message {id:?} is unreadable: {reason}")]
    CorruptRow {
        /// The message id, when it could be read.
        id: String,
        /// What is wrong with the row.
        reason: String,
    },
    /// A store broke its contract (for example returned more messages than asked).
    #[error("outbox store broke its contract: {0}")]
    StoreContract(String),
}

impl Error {
    /// Wrap a store failure (database error, I/O error) for `operation`.
    pub fn store(
        operation: &'static str,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error::Store {
            operation,
            source: Arc::new(source),
        }
    }

    /// Build an [`Error::InvalidInput`].
    pub fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidInput {
            field,
            reason: reason.into(),
        }
    }

    /// `true` when the claim token is confirmed to no longer own the message.
    pub fn is_claim_lost(&self) -> bool {
        matches!(self, Error::Claim(_))
    }
}

/// Why a claim token was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClaimLoss {
    /// The message does not exist (it was purged).
    Missing,
    /// The message is not in the `Claimed` state any more.
    NotClaimed,
    /// Another claim token owns the message now.
    TokenMismatch,
    /// The lease ran out (`locked_until <= now`), even if nobody re-claimed it yet.
    LeaseExpired,
    /// The store only reports that the fenced write matched no row.
    Unknown,
}

impl fmt::Display for ClaimLoss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ClaimLoss::Missing => "the message no longer exists",
            ClaimLoss::NotClaimed => "the message is not claimed",
            ClaimLoss::TokenMismatch => "another claim token owns it",
            ClaimLoss::LeaseExpired => "its lease has expired",
            ClaimLoss::Unknown => "the claim no longer matches",
        })
    }
}

/// The claim token no longer owns the message.
///
/// This is the only store error the runtime treats as *confirmed* loss: the
/// message is not settled by this worker, since another may own it now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "outbox message {id:?} is no longer owned by this claim token ({reason}); it must not be settled by this worker"
)]
pub struct ClaimError {
    /// The message id.
    pub id: String,
    /// Why the token was refused.
    pub reason: ClaimLoss,
}

impl ClaimError {
    /// A claim error for `id`.
    pub fn new(id: impl Into<String>, reason: ClaimLoss) -> Self {
        ClaimError {
            id: id.into(),
            reason,
        }
    }
}

/// Recorded when an eligible message has used up its attempts without a
/// terminal settlement (its workers kept losing their leases).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "outbox message {id:?} used {attempts} of {max_attempts} claim attempts without a terminal settlement"
)]
pub struct AbandonedClaimError {
    /// The message id.
    pub id: String,
    /// Claims already made.
    pub attempts: u32,
    /// The message's attempt budget.
    pub max_attempts: u32,
}

/// A message name or payload does not match the registry.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// No registration for this kind and name (a newer worker may know it, so
    /// the runtime retries such messages).
    #[error(
        "the outbox registry has no {kind} named {name:?}; register it, or deploy the worker that knows it"
    )]
    UnknownName {
        /// The message kind.
        kind: MessageKind,
        /// The unknown name.
        name: String,
    },
    /// The stored payload does not decode into the registered type (the
    /// runtime dead-letters such messages at once: retrying cannot help).
    #[error("payload of {kind} {name:?} does not decode into {type_name}: {source}")]
    Decode {
        /// The message kind.
        kind: MessageKind,
        /// The message name.
        name: String,
        /// The registered payload type.
        type_name: &'static str,
        /// The decoder's error.
        source: Arc<serde_json::Error>,
    },
    /// A payload could not be serialized at enqueue.
    #[error("payload of {kind} {name:?} does not serialize to JSON: {source}")]
    Encode {
        /// The message kind.
        kind: MessageKind,
        /// The message name.
        name: String,
        /// The serializer's error.
        source: Arc<serde_json::Error>,
    },
    /// Two registrations share a kind and name.
    #[error(
        "the outbox registry already has a {kind} named {name:?}; names must be unique per kind"
    )]
    DuplicateName {
        /// The message kind.
        kind: MessageKind,
        /// The duplicated name.
        name: String,
    },
    /// A handler was registered for a different payload type than the registry's.
    #[error(
        "{kind} {name:?} is registered with payload {registered} but its handler expects {expected}"
    )]
    TypeMismatch {
        /// The message kind.
        kind: MessageKind,
        /// The message name.
        name: String,
        /// The payload type in the registry.
        registered: &'static str,
        /// The payload type the handler takes.
        expected: &'static str,
    },
    /// A transport has no handler for this name.
    #[error("no handler is registered for {kind} {name:?}")]
    NoHandler {
        /// The message kind.
        kind: MessageKind,
        /// The name without a handler.
        name: String,
    },
}

/// An admin operation was refused because it is unsafe or does not apply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    /// The message is claimed by a live lease; changing it would race its worker.
    #[error(
        "outbox message {id:?} is claimed until {locked_until}; wait for its lease to end before changing it"
    )]
    ClaimLive {
        /// The message id.
        id: String,
        /// When the live lease ends.
        locked_until: DateTime<Utc>,
    },
    /// Only dead-lettered messages can be requeued.
    #[error(
        "outbox message {id:?} is {status}, not dead-lettered; only dead letters can be requeued"
    )]
    NotDeadLettered {
        /// The message id.
        id: String,
        /// Its current status.
        status: MessageStatus,
    },
    /// Purging pending or claimed messages would lose work.
    #[error(
        "refusing to purge {status} messages: only delivered and dead-lettered messages can be purged"
    )]
    UnsafePurge {
        /// The status that was asked for.
        status: MessageStatus,
    },
}

/// One broken configuration rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigViolation {
    /// The field, as named in configuration files (`settlement.attempts`).
    pub field: &'static str,
    /// The rule it breaks, including the value given.
    pub rule: String,
}

impl fmt::Display for ConfigViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}` {}", self.field, self.rule)
    }
}

/// A configuration that breaks one or more rules. Lists every violation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// What is wrong, one entry per broken rule.
    pub violations: Vec<ConfigViolation>,
}

impl ConfigError {
    /// `true` when some violation names `field`.
    pub fn names(&self, field: &str) -> bool {
        self.violations.iter().any(|v| v.field == field)
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("invalid outbox configuration: ")?;
        for (i, v) in self.violations.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{v}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}
