//! Claims in flight: with `claims_in_flight` above one, a claim goes out for
//! a share of the slots while others still run, and together they never
//! select more than the pass's budget.

use std::time::Duration;

use outbox::DrainConfig;

use crate::support::{Fault, FaultStore, Op, run};
use crate::{Harness, config, ping, report};

#[test]
fn a_slot_that_frees_while_a_claim_runs_is_claimed_beside_it() {
    run(|| async {
        let store = FaultStore::new();
        store.always(Op::Claim, Fault::Delay(Duration::from_millis(50)));
        let h = Harness::start_with(
            store,
            DrainConfig {
                batch_size: 4,
                concurrency: 2,
                claims_in_flight: Some(2),
                ..config()
            },
            |builder| builder,
        );
        for (n, work_ms) in [(0, 100), (1, 110), (2, 100), (3, 100)] {
            h.enqueue(ping(n, work_ms)).await;
        }
        let r = h.drain().await;
        assert_eq!(
            r,
            report(|r| {
                r.claimed = 4;
                r.delivered = 4;
            })
        );
        // The first two claims take a slot each. The slot freed at 150
        // is claimed at once; the one freed at 160 does not wait for that
        // claim (one at a time, it would start at 250).
        assert_eq!(h.probe.start_offsets(), [50, 50, 200, 210]);
    });
}

#[test]
fn claims_in_flight_together_keep_to_the_pass_budget() {
    run(|| async {
        let store = FaultStore::new();
        store.always(Op::Claim, Fault::Delay(Duration::from_millis(50)));
        let h = Harness::start_with(
            store.clone(),
            DrainConfig {
                batch_size: 5,
                concurrency: 4,
                claims_in_flight: Some(4),
                ..config()
            },
            |builder| builder,
        );
        for n in 0..8 {
            h.enqueue(ping(n, 100)).await;
        }
        // Four claims of one each, then one for the last of the budget.
        let r = h.drain().await;
        assert_eq!(
            r,
            report(|r| {
                r.claimed = 5;
                r.delivered = 5;
            })
        );
        assert_eq!(h.probe.start_offsets(), [50, 50, 50, 50, 200]);
    });
}

#[test]
fn an_empty_claim_beside_others_ends_the_pass_once_they_are_back() {
    run(|| async {
        let store = FaultStore::new();
        store.always(Op::Claim, Fault::Delay(Duration::from_millis(50)));
        let h = Harness::start_with(
            store.clone(),
            DrainConfig {
                batch_size: 10,
                concurrency: 4,
                claims_in_flight: Some(4),
                ..config()
            },
            |builder| builder,
        );
        for n in 0..2 {
            h.enqueue(ping(n, 100)).await;
        }
        let r = h.drain().await;
        assert_eq!(
            r,
            report(|r| {
                r.claimed = 2;
                r.delivered = 2;
            })
        );
        assert_eq!(h.probe.start_offsets(), [50, 50]);
        assert_eq!(store.calls(Op::Claim), 4);
    });
}
