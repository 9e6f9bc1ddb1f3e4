//! The runtime's error type.

use crate::messages::DrainReport;

/// `Result` with this crate's [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong starting or running drains.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An error from the outbox core or its store (invalid config, missing
    /// transport, store failure).
    #[error(transparent)]
    Outbox(#[from] outbox::Error),
    /// The pass stopped claiming because the store failed; the deliveries it
    /// had already started finished, and `report` counts them. The next pass
    /// picks up where this one stopped.
    #[error("drain pass stopped claiming: {source} (finished before stopping: {report})")]
    Pass {
        /// Why claiming stopped.
        source: outbox::Error,
        /// What the pass did before it stopped.
        report: Box<DrainReport>,
    },
    /// The coordinator is shutting down and starts no new passes.
    #[error("the drain coordinator is shutting down and starts no new passes")]
    ShuttingDown,
    /// The coordinator stopped before it could answer.
    #[error("the drain coordinator stopped before answering")]
    Stopped,
}

impl Error {
    /// The report of the pass this error ended, if it ended one.
    pub fn report(&self) -> Option<&DrainReport> {
        match self {
            Error::Pass { report, .. } => Some(report),
            _ => None,
        }
    }
}
