//! The store contract, run on [`MemoryOutbox`].

mod conformance;

use outbox::MemoryOutbox;

async fn setup() -> MemoryOutbox {
    MemoryOutbox::new()
}

conformance::conformance_suite!(setup);
conformance::schedules::schedule_suite!(setup);
