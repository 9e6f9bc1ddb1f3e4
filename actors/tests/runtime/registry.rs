//! The registry: missing transports, undecodable payloads, unknown names,
//! the catch-all, and a job's own retry policy.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::{
    Clock, DeliveryError, InProcessBus, InProcessJobs, Job, MessageKind, MessageStatus, NewMessage,
    OutboxAdmin, OutboxStore, Payload, RawMessage, Registry, RetryPolicy,
};
use outbox_actors::{Drain, DrainCoordinator, Error};
use serde::{Deserialize, Serialize};

use crate::support::{FaultStore, Op, clock, run};
use crate::{Harness, Ping, config, ping, registry};

#[test]
fn a_pass_refuses_to_start_without_a_transport_for_registered_messages() {
    run(|| async {
        let store = FaultStore::new();
        let clock = clock();
        let id = store
            .enqueue(NewMessage::event(&ping(1, 0)).unwrap().at(clock.now()))
            .await
            .unwrap()
            .into_id();
        let coordinator = DrainCoordinator::builder(store.clone())
            .registry(registry())
            .clock(clock)
            .start()
            .unwrap();
        let refused = coordinator.send(Drain).await.unwrap().unwrap_err();
        assert!(
            matches!(
                refused,
                Error::MissingTransport {
                    kind: MessageKind::Event,
                    ..
                }
            ),
            "{refused}"
        );
        assert!(refused.to_string().contains("ping"), "{refused}");
        assert_eq!(
            store.calls(Op::Claim),
            0,
            "refused before claiming anything"
        );
        let message = store.inner().get_message(&id).await.unwrap();
        assert_eq!(
            (message.status, message.attempts),
            (MessageStatus::Pending, 0)
        );
    });
}

#[test]
fn an_undecodable_payload_is_dead_lettered_at_once() {
    run(|| async {
        let h = Harness::start(config());
        let raw = NewMessage::new(
            MessageKind::Event,
            "ping",
            Payload::from_json(r#"{"n":"not a number","work_ms":0}"#).unwrap(),
        )
        .at(h.clock.now());
        let id = h.store.enqueue(raw).await.unwrap().into_id();
        let r = h.drain().await;
        assert_eq!((r.dead_lettered, r.retried), (1, 0));
        let message = h.message(&id).await;
        assert_eq!(
            (message.status, message.attempts),
            (MessageStatus::DeadLettered, 1)
        );
        assert!(
            message
                .last_error
                .unwrap()
                .message
                .contains("does not decode")
        );
    });
}

#[test]
fn an_unknown_name_is_retried_for_a_worker_that_knows_it() {
    run(|| async {
        let h = Harness::start(config());
        let raw = NewMessage::new(
            MessageKind::Event,
            "pong",
            Payload::from_json("{}").unwrap(),
        )
        .at(h.clock.now());
        let id = h.store.enqueue(raw).await.unwrap().into_id();
        assert_eq!(h.drain().await.retried, 1);
        let message = h.message(&id).await;
        assert_eq!(message.status, MessageStatus::Pending);
        assert!(
            message
                .last_error
                .unwrap()
                .message
                .contains("no event named \"pong\"")
        );
    });
}

#[test]
fn a_catch_all_delivers_unknown_names_as_stored_after_typed_ones() {
    run(|| async {
        let store = FaultStore::new();
        let clock = clock();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (typed, any, jobs) = (seen.clone(), seen.clone(), seen.clone());
        let coordinator = DrainCoordinator::builder(store.clone())
            .registry(
                Registry::builder()
                    .event::<Ping>()
                    .any(MessageKind::Event)
                    .any(MessageKind::Job)
                    .build()
                    .unwrap(),
            )
            .event_bus(
                InProcessBus::new()
                    .on(move |ping: Arc<Ping>, _ctx| {
                        typed.lock().unwrap().push(format!("ping {}", ping.n));
                        async { Ok(()) }
                    })
                    .on_any(move |message: Arc<RawMessage>, _ctx| {
                        any.lock().unwrap().push(format!(
                            "{} {} {}",
                            message.kind,
                            message.name,
                            message.payload.as_str()
                        ));
                        async { Ok(()) }
                    }),
            )
            .job_dispatcher(InProcessJobs::new().on_any(move |job: RawMessage, _ctx| {
                jobs.lock()
                    .unwrap()
                    .push(format!("{} {}", job.kind, job.name));
                async { Err(DeliveryError::msg("no worker for it here")) }
            }))
            .config(config())
            .clock(clock.clone())
            .start()
            .unwrap();
        let raw = |kind, name: &str, json: &str| {
            NewMessage::new(kind, name, Payload::from_json(json).unwrap()).at(clock.now())
        };
        store
            .enqueue(NewMessage::event(&ping(1, 0)).unwrap().at(clock.now()))
            .await
            .unwrap();
        store
            .enqueue(raw(MessageKind::Event, "pong", r#"{"n":2}"#))
            .await
            .unwrap();
        let job = store
            .enqueue(raw(MessageKind::Job, "reindex", "{}"))
            .await
            .unwrap()
            .into_id();
        let report = coordinator.send(Drain).await.unwrap().unwrap();
        assert_eq!((report.delivered, report.retried), (2, 1), "{report}");
        assert_eq!(
            *seen.lock().unwrap(),
            ["ping 1", r#"event pong {"n":2}"#, "job reindex"]
        );
        let failed = store.inner().get_message(&job).await.unwrap();
        assert_eq!(failed.status, MessageStatus::Pending);
        assert_eq!(failed.last_error.unwrap().message, "no worker for it here");
    });
}

#[test]
fn a_catch_all_without_its_transport_refuses_the_pass() {
    run(|| async {
        let store = FaultStore::new();
        let clock = clock();
        store
            .enqueue(
                NewMessage::new(
                    MessageKind::Job,
                    "reindex",
                    Payload::from_json("{}").unwrap(),
                )
                .at(clock.now()),
            )
            .await
            .unwrap();
        let coordinator = DrainCoordinator::builder(store.clone())
            .registry(Registry::builder().any(MessageKind::Job).build().unwrap())
            .clock(clock)
            .start()
            .unwrap();
        let refused = coordinator.send(Drain).await.unwrap().unwrap_err();
        assert!(
            matches!(
                refused,
                Error::MissingTransport {
                    kind: MessageKind::Job,
                    ..
                }
            ),
            "{refused}"
        );
        assert!(refused.to_string().contains("any other name"), "{refused}");
        assert_eq!(store.calls(Op::Claim), 0);
    });
}

#[derive(Debug, Serialize, Deserialize)]
struct Reindex {
    shard: u32,
}

impl Job for Reindex {
    const NAME: &'static str = "reindex";
    fn retry_policy() -> Option<RetryPolicy> {
        Some(RetryPolicy::fixed(Duration::from_secs(60)).with_max_attempts(2))
    }
}

#[test]
fn a_jobs_own_retry_policy_governs_its_retries() {
    run(|| async {
        let store = FaultStore::new();
        let clock = clock();
        let runs = Arc::new(AtomicUsize::new(0));
        let counter = runs.clone();
        let coordinator = DrainCoordinator::builder(store.clone())
            .registry(Registry::builder().job::<Reindex>().build().unwrap())
            .job_dispatcher(InProcessJobs::new().on(move |job: Reindex, _ctx| {
                counter.fetch_add(1, Ordering::SeqCst);
                async move { Err(DeliveryError::msg(format!("shard {} offline", job.shard))) }
            }))
            .config(config())
            .clock(clock.clone())
            .start()
            .unwrap();
        let message = NewMessage::job(&Reindex { shard: 3 })
            .unwrap()
            .at(clock.now());
        assert_eq!(message.max_attempts, Some(2), "the job's budget");
        let id = store.enqueue(message).await.unwrap().into_id();
        assert_eq!(coordinator.send(Drain).await.unwrap().unwrap().retried, 1);
        let pending = store.inner().get_message(&id).await.unwrap();
        assert_eq!(
            pending.available_at - pending.updated_at,
            chrono::Duration::seconds(60)
        );
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(
            coordinator
                .send(Drain)
                .await
                .unwrap()
                .unwrap()
                .dead_lettered,
            1
        );
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    });
}
