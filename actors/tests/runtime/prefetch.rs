//! Prefetch: messages claimed ahead of free slots wait in claim order,
//! start as slots free, and are given back undelivered when their lease ran
//! low while waiting or when the drain shuts down.

use std::time::Duration;

use outbox::{DrainConfig, MessageStatus};
use outbox_actors::{Drain, Shutdown};

use crate::support::{self, Fault, FaultStore, Op, run};
use crate::{Harness, config, ping, report};

#[test]
fn prefetched_messages_start_as_slots_free_without_waiting_for_a_claim() {
    run(|| async {
        let store = FaultStore::new();
        store.always(Op::Claim, Fault::Delay(Duration::from_millis(50)));
        let h = Harness::start_with(
            store,
            DrainConfig {
                batch_size: 10,
                concurrency: 2,
                prefetch: Some(2),
                ..config()
            },
            |builder| builder,
        );
        for n in 0..6 {
            h.enqueue(ping(n, 100)).await;
        }
        let r = h.drain().await;
        assert_eq!(
            r,
            report(|r| {
                r.claimed = 6;
                r.delivered = 6;
            })
        );
        // Without prefetch each pair would wait for a 50 ms claim after the
        // pair before it: 50, 50, 200, 200, 350, 350.
        assert_eq!(h.probe.start_offsets(), [50, 50, 150, 150, 250, 250]);
        assert_eq!(
            h.probe
                .max_in_flight
                .load(std::sync::atomic::Ordering::SeqCst),
            2
        );
    });
}

#[test]
fn prefetched_messages_are_given_back_at_shutdown() {
    run(|| async {
        let h = Harness::start(DrainConfig {
            concurrency: 1,
            prefetch: Some(2),
            ..config()
        });
        let mut ids = Vec::new();
        for n in 0..3 {
            ids.push(h.enqueue(ping(n, 2_000)).await);
        }
        let drain = h.coordinator.send(Drain);
        tokio::time::sleep(Duration::from_secs(1)).await;
        let shutdown = h
            .coordinator
            .send(Shutdown {
                grace: Duration::from_secs(5),
            })
            .await
            .unwrap();
        assert_eq!(
            shutdown,
            report(|r| {
                r.claimed = 3;
                r.delivered = 1;
                r.released = 2;
            })
        );
        assert_eq!(drain.await.unwrap().unwrap(), shutdown);
        assert_eq!(h.probe.start_offsets(), [0], "only the running one started");
        assert_eq!(h.status(&ids[0]).await, MessageStatus::Delivered);
        for id in &ids[1..] {
            let message = h.message(id).await;
            assert_eq!(
                (message.status, message.attempts),
                (MessageStatus::Pending, 0),
                "given back with the attempt not counted"
            );
            assert!(message.claim_token.is_none());
        }
    });
}

#[test]
fn a_prefetched_message_whose_lease_ran_low_is_given_back_unstarted() {
    run(|| async {
        let h = Harness::start(DrainConfig {
            batch_size: 2,
            concurrency: 1,
            prefetch: Some(1),
            lease: Duration::from_secs(3),
            ..config()
        });
        let first = h.enqueue(ping(0, 2_500)).await;
        let second = h.enqueue(ping(1, 10)).await;
        let r = h.drain().await;
        // It waited 2.5 s of its 3 s lease: less than the heartbeat's first
        // interval (1 s) was left.
        assert_eq!(
            r,
            report(|r| {
                r.claimed = 2;
                r.delivered = 1;
                r.released = 1;
            })
        );
        // It was given back (the attempt not counted), and the pass that
        // follows a spent budget claimed it again and delivered it.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(h.probe.start_offsets(), [0, 2_500]);
        let calls = |op| {
            h.store
                .log()
                .iter()
                .filter(|c| c.op == op && c.id == second)
                .map(|c| (c.now - support::epoch()).num_milliseconds())
                .collect::<Vec<_>>()
        };
        assert_eq!(calls(Op::Claim), [0, 2_500]);
        assert_eq!(calls(Op::Release), [2_500]);
        assert_eq!(h.status(&first).await, MessageStatus::Delivered);
        let message = h.message(&second).await;
        assert_eq!(
            (message.status, message.attempts),
            (MessageStatus::Delivered, 1)
        );
    });
}

/// Messages per claim, in the order the claims were made.
fn claim_sizes(store: &FaultStore) -> Vec<usize> {
    claims(store).into_iter().map(|(size, _)| size).collect()
}

/// Messages per claim and whether the drain asked it to be durable, in the
/// order the claims were made.
fn claims(store: &FaultStore) -> Vec<(usize, bool)> {
    let mut claims: Vec<(chrono::DateTime<chrono::Utc>, usize, bool)> = Vec::new();
    for call in store.log().iter().filter(|c| c.op == Op::Claim) {
        match claims.iter_mut().find(|(at, ..)| *at == call.now) {
            Some((_, size, durable)) => {
                *size += 1;
                *durable |= call.durable;
            }
            None => claims.push((call.now, 1, call.durable)),
        }
    }
    claims
        .into_iter()
        .map(|(_, size, durable)| (size, durable))
        .collect()
}

/// The claims of a drain of six messages of 100 ms by two handlers, with
/// `prefetch` and claims of 5 ms (see [`claims`]).
async fn claims_of_six(prefetch: usize) -> Vec<(usize, bool)> {
    let store = FaultStore::new();
    store.always(Op::Claim, Fault::Delay(Duration::from_millis(5)));
    let h = Harness::start_with(
        store,
        DrainConfig {
            batch_size: 6,
            concurrency: 2,
            prefetch: Some(prefetch),
            ..config()
        },
        |builder| builder,
    );
    for n in 0..6 {
        h.enqueue(ping(n, 100)).await;
    }
    assert_eq!(h.drain().await.delivered, 6);
    claims(&h.store)
}

#[test]
fn a_claim_for_idle_handlers_alone_need_not_be_durable() {
    run(|| async {
        // Every message claimed starts at once: a store crash that undid
        // such a claim would deliver again only what was already running.
        let claims = claims_of_six(0).await;
        assert_eq!(claims.iter().map(|&(size, _)| size).sum::<usize>(), 6);
        assert!(claims.iter().all(|&(_, durable)| !durable), "{claims:?}");
    });
}

#[test]
fn a_claim_whose_messages_may_wait_for_a_handler_is_durable() {
    run(|| async {
        // The first claim takes two messages for idle handlers and two to
        // wait. Undone by a crash after they started, the two waiting would
        // run while pending again, and be delivered twice.
        let claims = claims_of_six(2).await;
        assert_eq!(claims.first(), Some(&(4, true)), "{claims:?}");
    });
}

#[test]
fn an_unset_prefetch_claims_far_ahead_of_fast_handlers() {
    run(|| async {
        let store = FaultStore::new();
        store.always(Op::Claim, Fault::Delay(Duration::from_millis(5)));
        let h = Harness::start_with(
            store,
            DrainConfig {
                batch_size: 2_000,
                concurrency: 4,
                prefetch: None,
                ..config()
            },
            |builder| builder,
        );
        for n in 0..2_000 {
            h.enqueue(ping(n, 1)).await;
        }
        let r = h.drain().await;
        assert_eq!((r.delivered, r.released), (2_000, 0));
        // Four handlers of 1 ms start 4 000 messages a second; 5 ms claims
        // claiming for free slots alone would take four at a time, 500
        // claims. Sized by the drain, the claims grow to hundreds.
        let sizes = claim_sizes(&h.store);
        assert!(sizes.len() < 50, "{} claims: {sizes:?}", sizes.len());
        assert!(sizes.iter().any(|&size| size >= 200), "{sizes:?}");
    });
}

#[test]
fn an_unset_prefetch_claims_nothing_ahead_of_handlers_as_long_as_a_lease() {
    run(|| async {
        let store = FaultStore::new();
        store.always(Op::Claim, Fault::Delay(Duration::from_millis(5)));
        let h = Harness::start_with(
            store,
            DrainConfig {
                batch_size: 12,
                concurrency: 2,
                prefetch: None,
                lease: Duration::from_secs(3),
                ..config()
            },
            |builder| builder,
        );
        for n in 0..12 {
            h.enqueue(ping(n, 2_000)).await;
        }
        let r = h.drain().await;
        // A message claimed to wait 2 s of a 3 s lease would be given back
        // stale; none was claimed to wait.
        assert_eq!((r.delivered, r.released), (12, 0));
        assert!(claim_sizes(&h.store).iter().all(|&size| size <= 2));
    });
}
