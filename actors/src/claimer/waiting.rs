//! Messages a claim brought back that may have to go back undelivered: a
//! fresh claim that came back with too little of its lease left, and a
//! prefetched message that waited for a slot until its lease ran low.

use std::time::Duration;

use crate::context::until;
use crate::messages::GiveBack;

/// A prefetched message waiting for a free slot.
pub(super) struct Waiting {
    /// The claimed message, its lease running.
    pub(super) message: outbox::ClaimedMessage,
    /// Its queue's lane.
    pub(super) lane: usize,
    /// How long its claim took.
    pub(super) took: Duration,
    /// When its claim returned.
    pub(super) returned: tokio::time::Instant,
}

impl Waiting {
    /// Whether to give the message back rather than start its handler now,
    /// with a heartbeat renewing every `heartbeat`.
    pub(super) fn give_back(&self, heartbeat: Duration) -> Option<GiveBack> {
        // Measured as `late` measures a fresh claim, with the wait added.
        let granted = until(self.message.claimed_at, self.message.locked_until);
        let waited = self.returned.elapsed();
        let left = granted.saturating_sub(self.took + waited);
        // The heartbeat's first renewal comes one interval after the
        // handler starts, and may take as long as the claim did.
        (left < self.took + heartbeat || left.is_zero()).then_some(GiveBack::Stale { waited, left })
    }
}

/// Whether to give a fresh claim back rather than deliver it: the lease
/// left when the claim returned, against how long it `took`. A store slow
/// enough that the lease it gave is mostly spent would leave a handler too
/// little time to finish and settle before the message goes to another
/// worker. The lease is measured on the store's clock (it stamped both
/// ends), the time taken on the runtime's, so a skewed clock between them
/// cannot make every claim look late, or none.
pub(super) fn late_claim(message: &outbox::ClaimedMessage, took: Duration) -> Option<GiveBack> {
    let granted = until(message.claimed_at, message.locked_until);
    let left = granted.saturating_sub(took);
    (left < took || left.is_zero()).then_some(GiveBack::Late { took, left })
}
