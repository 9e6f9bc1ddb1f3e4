//! Passes: claiming into free slots, refilling them, coalescing and
//! scheduling passes, chaining passes while claims come back full,
//! wake-ups, arbiters and configuration checks.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use actix::prelude::*;
use outbox::{
    Clock, DrainConfig, Error as CoreError, Event, InProcessBus, MessageStatus, NewMessage,
    OutboxAdmin, OutboxStore, Registry,
};
use outbox_actors::{Drain, DrainCoordinator, DrainReport, Error, GetStatus, Shutdown};
use serde::{Deserialize, Serialize};

use crate::support::{Fault, FaultStore, Op, run};
use crate::{Harness, Ping, config, ping, registry, report, settle};

#[test]
fn delivers_every_message_and_reports_it() {
    run(|| async {
        let h = Harness::start(DrainConfig {
            concurrency: 2,
            ..config()
        });
        let ids = [
            h.enqueue(ping(1, 10)).await,
            h.enqueue(ping(2, 10)).await,
            h.enqueue(ping(3, 10)).await,
        ];
        let r = h.drain().await;
        assert_eq!(
            r,
            report(|r| {
                r.claimed = 3;
                r.delivered = 3;
            })
        );
        for id in &ids {
            let message = h.message(id).await;
            assert_eq!(message.status, MessageStatus::Delivered);
            assert!(message.claim_token.is_none() && message.delivered_at.is_some());
        }
        assert!(h.leases().is_empty());
        assert_eq!(h.drain().await, DrainReport::default());
    });
}

#[test]
fn drains_during_a_pass_are_coalesced_into_one_follow_up() {
    run(|| async {
        let h = Harness::start(DrainConfig {
            batch_size: 2,
            ..config()
        });
        for n in 0..3 {
            h.enqueue(ping(n, 1_000)).await;
        }
        let sends: Vec<_> = (0..5).map(|_| h.coordinator.send(Drain)).collect();
        let reports: Vec<DrainReport> = futures_util::future::join_all(sends)
            .await
            .into_iter()
            .map(|r| r.unwrap().unwrap())
            .collect();
        assert_eq!(reports[0].delivered, 2);
        for follow_up in &reports[1..] {
            assert_eq!(follow_up.delivered, 1, "{reports:?}");
        }
        assert_eq!(h.coordinator.send(GetStatus).await.unwrap().passes, 2);
        assert_eq!(
            h.probe.max_in_flight.load(Ordering::SeqCst),
            1,
            "passes never overlap"
        );
    });
}

#[test]
fn the_schedule_skips_ticks_while_a_pass_runs() {
    run(|| async {
        let h = Harness::start(DrainConfig {
            batch_size: 1,
            every: Some(Duration::from_secs(1)),
            ..config()
        });
        for n in 0..10 {
            h.enqueue(ping(n, 3_500)).await;
        }
        tokio::time::sleep(Duration::from_secs(10)).await;
        // Each pass spends its batch of one on a full claim, so the next
        // starts as it ends, at 3.5 s and 7 s; the ticks at 1-9 s all found
        // a pass running and started none: two finished, the third is running.
        let status = h.coordinator.send(GetStatus).await.unwrap();
        assert_eq!(status.passes, 2);
        assert!(status.running);
        assert_eq!(h.probe.max_in_flight.load(Ordering::SeqCst), 1);
        let starts = h.probe.start_offsets();
        assert_eq!(starts, [0, 3_500, 7_000]);
        // A Drain can still be sent at any time.
        assert_eq!(h.drain().await.delivered, 1);
    });
}

#[test]
fn concurrency_is_never_exceeded() {
    run(|| async {
        let h = Harness::start(DrainConfig {
            concurrency: 4,
            batch_size: 40,
            ..config()
        });
        for n in 0..40 {
            h.enqueue(ping(n, u64::from(n * 7919 % 5_000))).await;
        }
        let r = h.drain().await;
        assert_eq!(r.delivered, 40);
        assert_eq!(h.probe.max_in_flight.load(Ordering::SeqCst), 4);
    });
}

#[test]
fn the_next_handlers_run_while_earlier_deliveries_settle_within_the_batch() {
    run(|| async {
        let store = FaultStore::new();
        store.always(Op::Deliver, Fault::Delay(Duration::from_secs(5)));
        let h = Harness::start_with(
            store,
            DrainConfig {
                concurrency: 2,
                batch_size: 4,
                ..config()
            },
            |b| b,
        );
        for n in 0..6 {
            h.enqueue(ping(n, 10)).await;
        }
        // Two handlers at a time; the second pair runs while the first pair
        // settles (5 s each). The pass holds no more claims than its batch,
        // so the last pair waits for the next pass, which its full claims
        // start as it ends.
        assert_eq!(h.drain().await.delivered, 4);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(h.probe.start_offsets(), [0, 0, 10, 10, 5_020, 5_020]);
        assert_eq!(h.probe.max_in_flight.load(Ordering::SeqCst), 2);
    });
}

#[test]
fn claiming_waits_when_too_many_deliveries_are_settling() {
    run(|| async {
        let store = FaultStore::new();
        store.always(Op::Deliver, Fault::Delay(Duration::from_secs(10)));
        let h = Harness::start_with(
            store,
            DrainConfig {
                concurrency: 4,
                batch_size: 40,
                ..config()
            },
            |b| b,
        );
        for n in 0..40 {
            h.enqueue(ping(n, 1)).await;
        }
        assert_eq!(h.drain().await.delivered, 40);
        let starts = h.probe.start_offsets();
        // Four handlers at a time, and no more than four deliveries settling
        // behind them: the next claim waits for the first settlements.
        let before_first_settled = starts.iter().filter(|&&at| at < 10_000).count();
        assert_eq!(before_first_settled, 8, "{starts:?}");
    });
}

#[test]
fn a_freed_slot_is_refilled_at_once_not_in_waves() {
    run(|| async {
        let h = Harness::start(DrainConfig {
            concurrency: 2,
            batch_size: 10,
            ..config()
        });
        let slow = h.enqueue(ping(0, 10_000)).await;
        for n in 1..10 {
            h.enqueue(ping(n, 1_000)).await;
        }
        assert_eq!(h.drain().await.delivered, 10);
        let completed = h.probe.completed();
        let slow_done = completed.iter().find(|(id, _)| *id == slow).unwrap().1;
        let before = completed.iter().filter(|(_, at)| *at < slow_done).count();
        // The other slot delivered all nine 1 s messages while the slow one ran.
        assert_eq!(before, 9, "{completed:?}");
    });
}

#[test]
fn a_slow_delivery_does_not_hold_back_messages_committed_meanwhile() {
    run(|| async {
        let h = Harness::start_with(
            FaultStore::new(),
            DrainConfig {
                concurrency: 2,
                ..config()
            },
            |b| b.wake_on_insert(true),
        );
        settle().await;
        let slow = h.enqueue(ping(1, 60_000)).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        // The pass's claim came back empty long ago; the slow delivery keeps
        // it open. A new commit wakes it to use its idle slot.
        let quick = h.enqueue(ping(2, 10)).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(h.status(&quick).await, MessageStatus::Delivered);
        assert_eq!(h.status(&slow).await, MessageStatus::Claimed);
        let status = h.coordinator.send(GetStatus).await.unwrap();
        assert_eq!(
            (status.passes, status.running),
            (0, true),
            "still the first pass"
        );
    });
}

#[test]
fn a_tick_during_a_long_pass_lets_it_claim_for_idle_slots() {
    run(|| async {
        let h = Harness::start(DrainConfig {
            concurrency: 2,
            every: Some(Duration::from_secs(1)),
            ..config()
        });
        h.enqueue(ping(1, 60_000)).await;
        settle().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let quick = h.enqueue(ping(2, 10)).await;
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        assert_eq!(
            h.status(&quick).await,
            MessageStatus::Delivered,
            "claimed at the 1 s tick"
        );
        let status = h.coordinator.send(GetStatus).await.unwrap();
        assert_eq!((status.passes, status.running), (0, true));
    });
}

#[test]
fn a_retried_message_is_revisited_when_due_without_a_schedule() {
    run(|| async {
        let h = Harness::start(config());
        let id = h
            .enqueue(Ping {
                fail_until: 1,
                ..ping(1, 10)
            })
            .await;
        assert_eq!(h.drain().await.retried, 1);
        // No schedule, no wake-ups, no Drain: the coordinator comes back at
        // the retry time (5 s) by itself.
        tokio::time::sleep(Duration::from_millis(5_100)).await;
        let message = h.message(&id).await;
        assert_eq!(
            (message.status, message.attempts),
            (MessageStatus::Delivered, 2)
        );
    });
}

#[test]
fn slots_freed_together_are_refilled_by_one_claim() {
    run(|| async {
        let h = Harness::start(DrainConfig {
            concurrency: 4,
            batch_size: 8,
            ..config()
        });
        for n in 0..8 {
            h.enqueue(ping(n, 1_000)).await;
        }
        assert_eq!(h.drain().await.delivered, 8);
        settle().await;
        // The first four deliveries end at the same instant: one claim for
        // their four slots, not one for the first slot and one for the rest.
        // The third is the empty claim of the pass the full batch started.
        assert_eq!(h.store.calls(Op::Claim), 3);
    });
}

#[test]
fn a_committed_message_wakes_an_idle_coordinator() {
    run(|| async {
        let h = Harness::start_with(FaultStore::new(), config(), |b| b.wake_on_insert(true));
        settle().await;
        let id = h.enqueue(ping(1, 0)).await;
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(h.status(&id).await, MessageStatus::Delivered);
        // A burst while a pass runs becomes one follow-up pass.
        for n in 0..20 {
            h.enqueue(ping(n, 100)).await;
        }
        tokio::time::sleep(Duration::from_secs(10)).await;
        let status = h.coordinator.send(GetStatus).await.unwrap();
        assert_eq!(status.totals.delivered, 21);
        assert!(status.passes <= 3, "{status:?}");
    });
}

#[test]
fn invalid_configuration_is_refused_at_start_naming_each_field() {
    run(|| async {
        let error = DrainCoordinator::builder(FaultStore::new())
            .config(DrainConfig {
                batch_size: 2,
                concurrency: 3,
                lease: Duration::from_millis(1),
                ..DrainConfig::default()
            })
            .start()
            .unwrap_err();
        let Error::Outbox(CoreError::Config(config)) = &error else {
            panic!("{error}")
        };
        assert!(
            config.names("concurrency") && config.names("lease"),
            "{error}"
        );
    });
}

/// A coordinator started on another arbiter answers like any other.
#[test]
fn a_coordinator_runs_on_a_given_arbiter() {
    actix::System::new().block_on(async {
        let arbiter = Arbiter::new();
        let store = FaultStore::new();
        store
            .enqueue(NewMessage::event(&ping(1, 0)).unwrap())
            .await
            .unwrap();
        let coordinator = DrainCoordinator::builder(store.clone())
            .registry(registry())
            .event_bus(InProcessBus::new().on(|_: Arc<Ping>, _| async { Ok(()) }))
            .start_in(&arbiter.handle())
            .unwrap();
        assert_eq!(coordinator.send(Drain).await.unwrap().unwrap().delivered, 1);
        coordinator
            .send(Shutdown {
                grace: Duration::ZERO,
            })
            .await
            .unwrap();
        arbiter.stop();
    });
}

/// Deliveries spread over several arbiters: a handler that hogs its thread
/// does not stall a delivery on another. Real threads, so real time; the
/// time bound only turns a hang into a failure.
#[test]
fn a_busy_handler_does_not_stall_deliveries_on_other_arbiters() {
    use std::sync::atomic::AtomicBool;

    #[derive(Debug, Serialize, Deserialize)]
    struct Spin {
        hog: bool,
    }
    impl Event for Spin {
        const NAME: &'static str = "spin";
    }

    let system = actix::System::new();
    system.block_on(async {
        let store = FaultStore::new();
        let flag = Arc::new(AtomicBool::new(false));
        let saw_flag = Arc::new(AtomicBool::new(false));
        let (flag_in, saw_in) = (flag.clone(), saw_flag.clone());
        let bus = InProcessBus::new().on(move |spin: Arc<Spin>, _ctx| {
            let (flag, saw) = (flag_in.clone(), saw_in.clone());
            async move {
                if spin.hog {
                    let deadline = std::time::Instant::now() + Duration::from_secs(20);
                    while std::time::Instant::now() < deadline {
                        if flag.load(Ordering::SeqCst) {
                            saw.store(true, Ordering::SeqCst);
                            break;
                        }
                        std::hint::spin_loop();
                    }
                } else {
                    flag.store(true, Ordering::SeqCst);
                }
                Ok(())
            }
        });
        let coordinator = DrainCoordinator::builder(store.clone())
            .registry(Registry::builder().event::<Spin>().build().unwrap())
            .event_bus(bus)
            .config(DrainConfig {
                concurrency: 2,
                delivery_arbiters: 2,
                ..DrainConfig::default()
            })
            .start()
            .unwrap();
        store
            .enqueue(NewMessage::event(&Spin { hog: true }).unwrap())
            .await
            .unwrap();
        store
            .enqueue(NewMessage::event(&Spin { hog: false }).unwrap())
            .await
            .unwrap();
        let r = coordinator.send(Drain).await.unwrap().unwrap();
        assert_eq!(r.delivered, 2);
        assert!(
            saw_flag.load(Ordering::SeqCst),
            "the hog's arbiter stalled the other delivery"
        );
        coordinator
            .send(Shutdown {
                grace: Duration::from_secs(1),
            })
            .await
            .unwrap();
    });
}

/// A store holding `messages` pings of `work_ms`, all due at the epoch.
async fn backlog(messages: u32, work_ms: u64) -> FaultStore {
    let store = FaultStore::new();
    for n in 0..messages {
        store
            .enqueue(
                NewMessage::event(&ping(n, work_ms))
                    .unwrap()
                    .at(crate::support::epoch()),
            )
            .await
            .unwrap();
    }
    store
}

const HOUR: Duration = Duration::from_secs(3_600);

#[test]
fn a_backlog_drains_on_full_claims_without_waiting_for_the_schedule() {
    run(|| async {
        let store = backlog(100, 10).await;
        let h = Harness::start_with(
            store,
            DrainConfig {
                concurrency: 2,
                batch_size: 10,
                every: Some(HOUR),
                ..config()
            },
            |b| b,
        );
        // The schedule starts one pass at once; no tick and no Drain come
        // after it. Ten passes of ten (five rounds of two 10 ms handlers
        // each) follow one another, then an eleventh finds the store empty.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let stats = h.store.inner().stats(h.clock.now()).await.unwrap();
        assert_eq!(stats.count(MessageStatus::Delivered), 100, "{stats:?}");
        let status = h.coordinator.send(GetStatus).await.unwrap();
        assert_eq!(
            (status.passes, status.running, status.totals.delivered),
            (11, false, 100),
            "{status:?}"
        );
        assert_eq!(status.last_report, Some(DrainReport::default()));
        assert_eq!(h.probe.max_in_flight.load(Ordering::SeqCst), 2);
        let starts = h.probe.start_offsets();
        assert_eq!(starts.last(), Some(&490), "back to back: {starts:?}");
        // And the chain stopped there: nothing more until the next tick.
        let claims = h.store.calls(Op::Claim);
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(h.store.calls(Op::Claim), claims);
        assert_eq!(h.coordinator.send(GetStatus).await.unwrap().passes, 11);
    });
}

#[test]
fn an_empty_store_or_a_short_claim_starts_no_follow_up() {
    run(|| async {
        let h = Harness::start(DrainConfig {
            concurrency: 4,
            batch_size: 10,
            every: Some(HOUR),
            ..config()
        });
        tokio::time::sleep(Duration::from_secs(60)).await;
        let status = h.coordinator.send(GetStatus).await.unwrap();
        assert_eq!((status.passes, status.running), (1, false));
        assert_eq!(h.store.calls(Op::Claim), 1, "an empty store never spins");

        for n in 0..3 {
            h.enqueue(ping(n, 10)).await;
        }
        assert_eq!(h.drain().await.delivered, 3);
        tokio::time::sleep(Duration::from_secs(60)).await;
        // A claim of three for four slots came back short; the claim for the
        // freed slots came back empty; no pass followed.
        let status = h.coordinator.send(GetStatus).await.unwrap();
        assert_eq!((status.passes, status.running), (2, false));
        assert_eq!(h.store.calls(Op::Claim), 3);
    });
}

#[test]
fn one_due_message_with_a_batch_of_one_ends_the_chain_on_the_next_empty_claim() {
    run(|| async {
        let h = Harness::start(DrainConfig {
            batch_size: 1,
            ..config()
        });
        h.enqueue(ping(1, 10)).await;
        assert_eq!(h.drain().await.delivered, 1);
        // Its one claim was full, so one more pass looks; it finds nothing.
        tokio::time::sleep(Duration::from_secs(60)).await;
        let status = h.coordinator.send(GetStatus).await.unwrap();
        assert_eq!((status.passes, status.running), (2, false));
        assert_eq!(status.last_report, Some(DrainReport::default()));
        assert_eq!(h.store.calls(Op::Claim), 2);
    });
}

#[test]
fn a_drain_during_a_chain_joins_its_next_pass_and_gets_that_report() {
    run(|| async {
        let store = backlog(30, 100).await;
        let h = Harness::start_with(
            store,
            DrainConfig {
                concurrency: 5,
                batch_size: 10,
                ..config()
            },
            |b| b,
        );
        // The Drain's own pass, then (started by its full claims) the
        // second; a Drain sent meanwhile joins the third.
        assert_eq!(h.drain().await.delivered, 10);
        settle().await;
        let status = h.coordinator.send(GetStatus).await.unwrap();
        assert_eq!((status.passes, status.running), (1, true));
        let third = h.drain().await;
        assert_eq!(third.delivered, 10);
        // The third's full claims started a fourth, which found nothing.
        settle().await;
        let status = h.coordinator.send(GetStatus).await.unwrap();
        assert_eq!((status.passes, status.running), (4, false));
        assert_eq!(status.totals.delivered, 30);
        assert_eq!(h.probe.max_in_flight.load(Ordering::SeqCst), 5);
    });
}

#[test]
fn shutdown_in_the_middle_of_a_chain_ends_it() {
    run(|| async {
        let store = backlog(100, 1_000).await;
        let h = Harness::start_with(
            store,
            DrainConfig {
                concurrency: 2,
                batch_size: 10,
                every: Some(HOUR),
                ..config()
            },
            |b| b,
        );
        // Passes of 5 s back to back: the third started at 10 s and has
        // started six handlers by 12.5 s, two of them still running.
        tokio::time::sleep(Duration::from_millis(12_500)).await;
        let status = h.coordinator.send(GetStatus).await.unwrap();
        assert_eq!((status.passes, status.running), (2, true));
        let shutdown = h
            .coordinator
            .send(Shutdown {
                grace: Duration::from_secs(10),
            })
            .await
            .unwrap();
        assert_eq!(
            shutdown,
            report(|r| {
                r.claimed = 6;
                r.delivered = 6;
            })
        );
        tokio::time::sleep(Duration::from_secs(60)).await;
        let stats = h.store.inner().stats(h.clock.now()).await.unwrap();
        assert_eq!(
            (
                stats.count(MessageStatus::Delivered),
                stats.count(MessageStatus::Pending)
            ),
            (26, 74)
        );
        assert_eq!(h.probe.start_offsets().len(), 26);
        assert!(h.coordinator.send(GetStatus).await.is_err(), "stopped");
    });
}
