//! The crate's error type, and the errors a delivery fails with.
//!
//! One enum, [`Error`], with the subsystem errors boxed in as their own types.
//! The runtime branches on exactly one distinction: [`Error::Claim`] means the
//! claim token no longer owns the message (confirmed loss, never retried);
//! every other store error is treated as transient.
//!
//! A handler fails with a [`DeliveryError`]; the store keeps it as an
//! [`ErrorRecord`] in `last_error`. Both live here, beside `Error`, because
//! the retry policy, the transports and the stores all name them.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::database::DatabaseKind;
use crate::kind::{MessageKind, MessageStatus};

/// `Result` with this crate's [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The underlying cause of an [`Error`] (a database, I/O or pool error),
/// behind an `Arc` so that it can be shared: errors are `Clone`, so one
/// failure can be handed to every caller waiting on it (coalesced drains
/// share one report). Read it through [`std::error::Error::source`].
pub type SharedError = Arc<dyn std::error::Error + Send + Sync + 'static>;

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
        source: SharedError,
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
    /// A database URL that the store cannot use; the error says which URL
    /// to pass, or which store to use, instead.
    #[error(transparent)]
    Url(#[from] UrlError),
    /// The database could not be reached or opened.
    #[error("cannot connect to the outbox database {url}: {reason}; {}", database.hint())]
    Connect {
        /// The URL, with any password replaced by `***`.
        url: String,
        /// What went wrong, with the operating system's error when there is one.
        reason: String,
        /// Which kind of database it is, which says what to check.
        database: DatabaseKind,
    },
    /// The outbox table (or a column of it) does not exist: the database was
    /// never set up for the outbox, or the table name is wrong.
    #[error(
        "the outbox table is not set up ({detail}) during {operation}; create it with \
         `setup()` on the store (or its MIGRATOR), or `outbox migrate` from the command \
         line, and check that the table name is the one the application uses"
    )]
    NotSetUp {
        /// The store operation that failed.
        operation: &'static str,
        /// The database's own words.
        detail: String,
    },
    /// A stored row does not read back as a message; the error carries the
    /// row's raw columns, so it can still be inspected.
    #[error(
        "stored outbox message {:?} is unreadable: {}; its raw columns come with this error",
        .0.id, .0.reason
    )]
    Unreadable(Box<UnreadableMessage>),
    /// A batch enqueue held more messages than one batch takes; nothing of
    /// it was written.
    #[error(
        "a batch of {messages} messages is over the limit of {max} per batch; nothing was \
         written; split it into batches of at most {max}"
    )]
    BatchTooLarge {
        /// How many messages the batch held.
        messages: usize,
        /// The most one batch takes, [`MAX_ENQUEUE_BATCH`](crate::MAX_ENQUEUE_BATCH).
        max: usize,
    },
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

/// A database URL a store cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UrlError {
    /// A PostgreSQL URL given to the SQLite store.
    #[error(
        "{url} is a PostgreSQL URL, but SqliteOutbox opens SQLite files; use \
         PostgresOutbox::connect for it{}, or pass a sqlite:// URL such as sqlite://app.db",
        if cfg!(feature = "postgres") { "" } else { " (enable the outbox crate's `postgres` feature)" }
    )]
    PostgresUrlForSqlite {
        /// The URL, with any password replaced by `***`.
        url: String,
    },
    /// A SQLite URL given to the PostgreSQL store.
    #[error(
        "{url} is a SQLite URL, but PostgresOutbox connects to PostgreSQL servers; use \
         SqliteOutbox::connect for it{}, or pass a postgres://USER:PASSWORD@HOST/DB URL",
        if cfg!(feature = "sqlite") { "" } else { " (enable the outbox crate's `sqlite` feature)" }
    )]
    SqliteUrlForPostgres {
        /// The URL as given.
        url: String,
    },
    /// A SQLite URL that names no database file.
    #[error(
        "the SQLite URL {url:?} has no path; name the database file, as in sqlite://app.db \
         (relative) or sqlite:///var/lib/app/outbox.db (absolute), or use sqlite::memory:"
    )]
    NoPath {
        /// The URL as given.
        url: String,
    },
    /// A URL whose scheme names no database an outbox store speaks.
    #[error(
        "{url} names no database the outbox supports; pass sqlite://PATH (for example \
         sqlite://app.db) or postgres://USER:PASSWORD@HOST/DB"
    )]
    UnsupportedScheme {
        /// The URL, with any password replaced by `***`.
        url: String,
    },
    /// A URL the store's driver cannot parse.
    #[error("{url} is not a valid {database} URL: {reason}")]
    Malformed {
        /// The URL, with any password replaced by `***`.
        url: String,
        /// The database the URL was meant for.
        database: DatabaseKind,
        /// The parser's words.
        reason: String,
    },
}

/// A stored row that does not read back as an [`OutboxMessage`](crate::OutboxMessage):
/// its raw columns, and why it does not decode.
///
/// Listings return such rows beside the readable ones
/// ([`MessagePage::unreadable`](crate::MessagePage::unreadable)), and
/// [`OutboxAdmin::get_message`](crate::OutboxAdmin::get_message) returns one
/// inside [`Error::Unreadable`], so an operator can still see, and repair,
/// the row. The in-memory store keeps typed messages and never has any.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct UnreadableMessage {
    /// The message id (`<unreadable>` when the id column itself is not text).
    pub id: String,
    /// `created_at`, when it reads as a time; listings order by it.
    pub created_at: Option<DateTime<Utc>>,
    /// Why the row does not decode: the column and what is wrong with it.
    pub reason: String,
    /// Every column as stored, as text: `None` for SQL `NULL`, bytes that
    /// are not UTF-8 shown lossily, times as the database stores them.
    pub columns: std::collections::BTreeMap<String, Option<String>>,
}

impl UnreadableMessage {
    /// A row `id` that does not decode because of `reason`, with its raw `columns`.
    pub fn new(
        id: impl Into<String>,
        created_at: Option<DateTime<Utc>>,
        reason: impl Into<String>,
        columns: std::collections::BTreeMap<String, Option<String>>,
    ) -> Self {
        UnreadableMessage {
            id: id.into(),
            created_at,
            reason: reason.into(),
            columns,
        }
    }

    /// One raw column; `None` when it is missing or `NULL`.
    pub fn column(&self, name: &str) -> Option<&str> {
        self.columns.get(name).and_then(|v| v.as_deref())
    }

    /// The raw payload text.
    pub fn payload(&self) -> Option<&str> {
        self.column("payload")
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
#[non_exhaustive]
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
#[non_exhaustive]
pub struct AbandonedClaimError {
    /// The message id.
    pub id: String,
    /// Claims already made.
    pub attempts: u32,
    /// The message's attempt budget.
    pub max_attempts: u32,
}

impl AbandonedClaimError {
    /// The error for message `id`, claimed `attempts` times of `max_attempts`.
    pub fn new(id: impl Into<String>, attempts: u32, max_attempts: u32) -> Self {
        AbandonedClaimError {
            id: id.into(),
            attempts,
            max_attempts,
        }
    }
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
    /// Only pending messages can be retried now.
    #[error(
        "outbox message {id:?} is {status}, not pending; only pending messages can be retried now"
    )]
    NotPending {
        /// The message id.
        id: String,
        /// Its current status.
        status: MessageStatus,
    },
    /// Only pending and claimed messages can be cancelled.
    #[error("outbox message {id:?} is {status}; only pending or claimed messages can be cancelled")]
    NotCancellable {
        /// The message id.
        id: String,
        /// Its current status.
        status: MessageStatus,
    },
    /// Purging pending or claimed messages would lose work.
    #[error(
        "refusing to purge {status} messages: only delivered, dead-lettered and cancelled messages can be purged"
    )]
    UnsafePurge {
        /// The status that was asked for.
        status: MessageStatus,
    },
}

/// One broken configuration rule.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConfigViolation {
    /// The field, as named in configuration files (`settlement.attempts`).
    pub field: &'static str,
    /// The rule it breaks, including the value given.
    pub rule: String,
}

impl ConfigViolation {
    /// `field` breaks `rule`.
    pub fn new(field: &'static str, rule: impl Into<String>) -> Self {
        ConfigViolation {
            field,
            rule: rule.into(),
        }
    }
}

impl fmt::Display for ConfigViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}` {}", self.field, self.rule)
    }
}

/// A configuration that breaks one or more rules. Lists every violation.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConfigError {
    /// What is wrong, one entry per broken rule.
    pub violations: Vec<ConfigViolation>,
}

impl ConfigError {
    /// An error of these violations, for checks outside this crate (the
    /// runtime's check of registrations against handlers).
    pub fn new(violations: Vec<ConfigViolation>) -> Self {
        ConfigError { violations }
    }

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

/// The error a delivery failed with: any error type, or a plain message.
///
/// Handlers return `Result<(), DeliveryError>` and can use `?` on any
/// `std::error::Error`; the type name and cause chain are kept for
/// `last_error`. It is cheap to clone, so observers can keep it.
#[derive(Clone)]
pub struct DeliveryError {
    type_name: &'static str,
    error: Arc<dyn std::error::Error + Send + Sync + 'static>,
    /// No retry can succeed: the runtime dead-letters at once.
    permanent: bool,
}

impl DeliveryError {
    /// A delivery error that is just a message.
    pub fn msg(message: impl fmt::Display) -> Self {
        DeliveryError {
            type_name: "message",
            error: Arc::new(MessageError(message.to_string())),
            permanent: false,
        }
    }

    /// Mark this error as one no retry can fix (a broker that refuses the
    /// credentials, an unknown destination, a message too large): the
    /// runtime dead-letters the message at once, keeping this error as its
    /// `last_error`, instead of spending the remaining attempts.
    pub fn permanent(mut self) -> Self {
        self.permanent = true;
        self
    }

    /// Turn a caught panic into a delivery error.
    pub fn panic(payload: &(dyn Any + Send)) -> Self {
        let text = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a handler panicked with a non-string payload".to_owned());
        DeliveryError {
            type_name: "panic",
            error: Arc::new(MessageError(format!("handler panicked: {text}"))),
            permanent: false,
        }
    }

    /// The Rust type name of the wrapped error (`message` or `panic` for those).
    pub fn type_name(&self) -> &'static str {
        self.type_name
    }

    /// The wrapped error.
    pub fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.error
    }

    /// The wrapped error, if it is a `T`.
    pub fn downcast_ref<T: std::error::Error + 'static>(&self) -> Option<&T> {
        self.error.downcast_ref::<T>()
    }

    /// `true` when the payload did not decode into its registered type:
    /// retrying cannot help, so the runtime dead-letters at once.
    pub fn is_undecodable(&self) -> bool {
        matches!(
            self.downcast_ref::<Error>(),
            Some(Error::Registry(RegistryError::Decode { .. }))
        )
    }

    /// `true` when retrying cannot help: the error was marked
    /// [`permanent`](Self::permanent), or the payload did not decode.
    pub fn is_permanent(&self) -> bool {
        self.permanent || self.is_undecodable()
    }

    /// `true` for a panic caught in a handler.
    pub fn is_panic(&self) -> bool {
        self.type_name == "panic"
    }

    /// The error as stored in `last_error`.
    pub fn to_record(&self) -> ErrorRecord {
        ErrorRecord::from_dyn(self.type_name, self.as_error())
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for DeliveryError {
    fn from(error: E) -> Self {
        DeliveryError {
            type_name: std::any::type_name::<E>(),
            error: Arc::new(error),
            permanent: false,
        }
    }
}

impl fmt::Display for DeliveryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl fmt::Debug for DeliveryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeliveryError({}: {})", self.type_name, self.error)
    }
}

#[derive(Debug)]
struct MessageError(String);

impl fmt::Display for MessageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for MessageError {}

/// Largest serialized [`ErrorRecord`], in bytes. A larger error is truncated
/// so one pathological error cannot bloat a row.
pub const MAX_ERROR_RECORD_BYTES: usize = 8 * 1024;

const TRUNCATION_MARKER: &str = "…[truncated]";

/// A delivery error as stored in `last_error`: type name, message and cause
/// chain, bounded to [`MAX_ERROR_RECORD_BYTES`] when serialized.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorRecord {
    /// The Rust type of the error, or a label such as `panic`.
    #[serde(rename = "type")]
    pub type_name: String,
    /// The error's `Display` output.
    pub message: String,
    /// The `Display` output of each `source()`, outermost first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub causes: Vec<String>,
    /// `true` when something was cut to fit the size bound.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

impl ErrorRecord {
    /// A record with no causes, bounded.
    pub fn new(type_name: impl Into<String>, message: impl Into<String>) -> Self {
        ErrorRecord {
            type_name: type_name.into(),
            message: message.into(),
            causes: Vec::new(),
            truncated: false,
        }
        .bounded()
    }

    /// Record `error` and its `source()` chain, bounded.
    pub fn from_error<E: std::error::Error + ?Sized>(error: &E) -> Self {
        Self::from_dyn(std::any::type_name::<E>(), error)
    }

    /// Record a type-erased error under an explicit type name, bounded.
    pub fn from_dyn(
        type_name: impl Into<String>,
        error: &(impl std::error::Error + ?Sized),
    ) -> Self {
        let mut causes = Vec::new();
        let mut source = error.source();
        // A cyclic or absurdly deep chain must not hang or bloat the record.
        while let Some(cause) = source {
            if causes.len() >= 32 {
                break;
            }
            causes.push(cause.to_string());
            source = cause.source();
        }
        ErrorRecord {
            type_name: type_name.into(),
            message: error.to_string(),
            causes,
            truncated: false,
        }
        .bounded()
    }

    /// The record as JSON, as stores keep it.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("an error record serializes")
    }

    /// Read a stored record; text that is not a record is kept as the message.
    pub fn from_json(json: &str) -> Self {
        serde_json::from_str(json).unwrap_or_else(|_| ErrorRecord::new("unknown", json))
    }

    /// Cut the record down until its JSON fits [`MAX_ERROR_RECORD_BYTES`].
    pub fn bounded(mut self) -> Self {
        if self.to_json().len() <= MAX_ERROR_RECORD_BYTES {
            return self;
        }
        self.truncated = true;
        // Escaping can grow text up to six-fold (`\u0000`), so cut, measure,
        // and cut again: drop causes from the innermost, then halve strings.
        truncate_str(&mut self.type_name, 256);
        for cause in &mut self.causes {
            truncate_str(cause, 1024);
        }
        truncate_str(&mut self.message, MAX_ERROR_RECORD_BYTES / 2);
        while self.to_json().len() > MAX_ERROR_RECORD_BYTES {
            if self.causes.pop().is_some() {
                continue;
            }
            let half = self.message.len() / 2;
            truncate_str(&mut self.message, half);
        }
        self
    }
}

impl fmt::Display for ErrorRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.type_name, self.message)?;
        for cause in &self.causes {
            write!(f, "\n  caused by: {cause}")?;
        }
        Ok(())
    }
}

fn truncate_str(s: &mut String, max: usize) {
    if s.len() <= max {
        return;
    }
    let mut cut = max.saturating_sub(TRUNCATION_MARKER.len());
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    s.truncate(cut);
    s.push_str(TRUNCATION_MARKER);
}
