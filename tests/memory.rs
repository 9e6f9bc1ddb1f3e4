//! The store contract, run on [`MemoryOutbox`].

mod conformance;

use outbox::MemoryOutbox;

async fn setup() -> MemoryOutbox {
    MemoryOutbox::new()
}

conformance::conformance_suite!(setup);
conformance::schedules::schedule_suite!(setup);

/// In process, a claim costs only CPU the handlers share: a drain sizing
/// itself claims nothing ahead and one claim at a time.
#[tokio::test]
async fn a_self_sizing_drain_claims_nothing_ahead() {
    use outbox::OutboxStore;
    let store = setup().await;
    assert!(!store.claims_ahead());
    assert_eq!(store.claim_parallelism(), 1);
}
