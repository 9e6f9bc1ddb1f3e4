//! Why a command failed, what the operator can do about it, and the exit code.

use std::fmt;
use std::process::ExitCode;

use outbox::{AdminError, Error};

/// Exit code of an operational error: the store failed, an operation was
/// refused as unsafe, a message was not found.
pub(crate) const OPERATIONAL: u8 = 1;

/// Exit code of a usage error: a bad flag or value, an unsupported URL.
/// clap uses the same code for the errors it finds itself.
pub(crate) const USAGE: u8 = 2;

/// A failed command: the reason, what to do, and the exit code.
#[derive(Debug)]
pub(crate) struct Failure {
    code: u8,
    reason: String,
    hint: Option<String>,
}

impl Failure {
    /// A usage error (exit 2).
    pub(crate) fn usage(reason: impl Into<String>) -> Self {
        Failure {
            code: USAGE,
            reason: reason.into(),
            hint: None,
        }
    }

    /// An operational error (exit 1).
    pub(crate) fn operational(reason: impl Into<String>) -> Self {
        Failure {
            code: OPERATIONAL,
            reason: reason.into(),
            hint: None,
        }
    }

    /// A failure with its own exit code.
    pub(crate) fn with_code(code: u8, reason: impl Into<String>) -> Self {
        Failure {
            code,
            reason: reason.into(),
            hint: None,
        }
    }

    /// Say what to do about it.
    pub(crate) fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    /// The process exit code.
    pub(crate) fn exit_code(&self) -> ExitCode {
        ExitCode::from(self.code)
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "error: {}", self.reason)?;
        if let Some(hint) = &self.hint {
            write!(f, "\nhint: {hint}")?;
        }
        Ok(())
    }
}

impl From<Error> for Failure {
    fn from(error: Error) -> Self {
        let reason = error.to_string();
        match &error {
            Error::InvalidInput { .. }
            | Error::InvalidTableName { .. }
            | Error::Config(_)
            | Error::Url(_) => Failure::usage(reason),
            // The message says what to check.
            Error::Connect { .. } => Failure::operational(reason),
            Error::NotSetUp { .. } => Failure::operational(reason)
                .hint("run `outbox migrate` (with the --table your application uses)"),
            Error::Unreadable(row) => Failure::operational(reason).hint(format!(
                "see its raw columns with `outbox show {}`, repair or delete the row with SQL",
                row.id
            )),
            Error::Admin(AdminError::ClaimLive { .. }) => Failure::operational(reason).hint(
                "its worker may still settle it; once the lease has run out, the message is \
                 claimable again by the next drain",
            ),
            Error::Admin(AdminError::NotDeadLettered { id, .. }) => {
                Failure::operational(reason).hint(format!("see its state with `outbox show {id}`"))
            }
            Error::Admin(_) => Failure::operational(reason),
            Error::NotFound { .. } => Failure::operational(reason)
                .hint("check the id; `outbox list` shows the stored messages"),
            Error::Store { .. } => Failure::operational(reason).hint(
                "check that the database is reachable and the table is migrated \
                 (`outbox migrate`), then try again",
            ),
            _ => Failure::operational(reason),
        }
    }
}

impl From<outbox_actors::Error> for Failure {
    fn from(error: outbox_actors::Error) -> Self {
        match error {
            outbox_actors::Error::Outbox(error) => error.into(),
            other => Failure::operational(other.to_string()),
        }
    }
}
