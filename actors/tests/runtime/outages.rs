//! Store outages: claims that come back too late to deliver, and claiming
//! that backs off while settlements fail, so an outage does not end in a
//! storm of duplicate deliveries.

use std::time::Duration;

use outbox::{DrainConfig, MessageStatus};
use outbox_actors::GetStatus;

use crate::support::{Fault, FaultStore, Op, run};
use crate::{Harness, config, ping, report};

#[test]
fn a_claim_that_took_longer_than_the_lease_it_left_starts_no_handler() {
    run(|| async {
        let store = FaultStore::new();
        // The first claim answers after 20 s of its 30 s lease (a store
        // waiting for a connection, say): 10 s are left, less than it took.
        store.fault(Op::Claim, 1, Fault::Delay(Duration::from_secs(20)));
        let h = Harness::start_with(store, config(), |b| b);
        let id = h.enqueue(ping(1, 10)).await;
        let r = h.drain().await;
        assert_eq!(
            r,
            report(|r| {
                r.claimed = 2;
                r.released = 1;
                r.delivered = 1;
            })
        );
        // Given back at once, then claimed again after a short pause and
        // delivered once.
        assert_eq!(h.store.calls(Op::Release), 1);
        assert_eq!(h.probe.start_offsets(), [20_100]);
        let message = h.message(&id).await;
        assert_eq!(
            (message.status, message.attempts),
            (MessageStatus::Delivered, 1),
            "the given-back claim's attempt is not counted"
        );
    });
}

#[test]
fn a_claim_that_took_less_than_the_lease_it_left_is_delivered() {
    run(|| async {
        let store = FaultStore::new();
        store.fault(Op::Claim, 1, Fault::Delay(Duration::from_secs(14)));
        let h = Harness::start_with(store, config(), |b| b);
        h.enqueue(ping(1, 10)).await;
        let r = h.drain().await;
        assert_eq!((r.claimed, r.delivered, r.released), (1, 1, 0));
        assert_eq!(h.probe.start_offsets(), [14_000]);
        assert_eq!(h.store.calls(Op::Release), 0);
    });
}

#[test]
fn a_claim_left_with_less_than_a_heartbeat_renews_before_its_lease_ends() {
    run(|| async {
        let store = FaultStore::new();
        // The claim answers after 14 s of its 30 s lease: 16 s are left,
        // less than the 20 s heartbeat. A first renewal one heartbeat after
        // the start (34 s) would come after the lease ended (30 s), with the
        // handler still running while the message is claimable again.
        store.fault(Op::Claim, 1, Fault::Delay(Duration::from_secs(14)));
        let h = Harness::start_with(
            store,
            DrainConfig {
                heartbeat: Some(Duration::from_secs(20)),
                ..config()
            },
            |b| b,
        );
        h.enqueue(ping(1, 25_000)).await;
        let r = h.drain().await;
        // Renewed halfway to the lease's end (22 s), then every heartbeat.
        assert_eq!((r.claimed, r.delivered, r.lease_lost), (1, 1, 0));
        assert_eq!(h.store.calls(Op::Renew), 1);
        assert_eq!(h.probe.start_offsets(), [14_000]);
    });
}

#[test]
fn claiming_backs_off_while_settlements_fail() {
    run(|| async {
        let store = FaultStore::new();
        store.always(Op::Deliver, Fault::Transient);
        let h = Harness::start_with(
            store,
            DrainConfig {
                concurrency: 2,
                batch_size: 12,
                ..config()
            },
            |b| b,
        );
        for n in 0..12 {
            h.enqueue(ping(n, 1)).await;
        }
        let r = h.drain().await;
        assert_eq!((r.claimed, r.settlement_failed, r.lease_lost), (12, 12, 0));
        // Two handlers and two settlements at a time; each settlement gives
        // up after its three writes (0, 100 ms, 300 ms), and every one that
        // failed doubles the pause before the next claim: 100 ms, 200 ms,
        // 400 ms, 800 ms, then 1.6 s, 3.2 s, and at most 5 s. Without the
        // pause the next pair would start at 302 ms.
        assert_eq!(
            h.probe.start_offsets(),
            [
                0, 0, 1, 1, 1_102, 1_102, 1_103, 1_103, 6_404, 6_404, 6_405, 6_405
            ]
        );
    });
}

#[test]
fn claiming_picks_up_at_once_after_a_clean_settlement() {
    run(|| async {
        let store = FaultStore::new();
        // The first three settlement writes fail; every later one succeeds.
        for call in 1..=3 {
            store.fault(Op::Deliver, call, Fault::Transient);
        }
        let h = Harness::start_with(
            store,
            DrainConfig {
                concurrency: 1,
                batch_size: 4,
                ..config()
            },
            |b| b,
        );
        for n in 0..4 {
            h.enqueue(ping(n, 1)).await;
        }
        let r = h.drain().await;
        assert_eq!((r.delivered, r.settlement_failed), (4, 0));
        // The second message settles on its second write at 102 ms: its
        // failed first write pauses claiming for 100 ms. The third settles
        // cleanly at once, which ends the backoff: the fourth is claimed
        // straight after, though the first is still retrying its writes.
        assert_eq!(h.probe.start_offsets(), [0, 1, 202, 203]);
    });
}

#[test]
fn a_full_pass_that_ended_in_a_store_fault_pause_is_followed_after_the_pause() {
    run(|| async {
        let store = FaultStore::new();
        store.always(Op::Deliver, Fault::Transient);
        let h = Harness::start_with(
            store,
            DrainConfig {
                concurrency: 2,
                batch_size: 2,
                ..config()
            },
            |b| b,
        );
        for n in 0..4 {
            h.enqueue(ping(n, 1)).await;
        }
        let r = h.drain().await;
        assert_eq!((r.claimed, r.settlement_failed), (2, 2));
        tokio::time::sleep(Duration::from_secs(10)).await;
        // Both settlements give up after their writes at 1, 101 and 301 ms;
        // the two failures pause claiming for 100 ms, then 200 ms. The pass
        // spent its batch, so the next follows by itself, but only once the
        // pause is over (501 ms, revisits round up to 10 ms), not at 301 ms.
        assert_eq!(h.probe.start_offsets(), [0, 0, 510, 510]);
        let status = h.coordinator.send(GetStatus).await.unwrap();
        // The third pass, after the second's pause, found nothing claimable.
        assert_eq!((status.passes, status.running), (3, false));
        assert_eq!(status.totals.settlement_failed, 4);
    });
}
