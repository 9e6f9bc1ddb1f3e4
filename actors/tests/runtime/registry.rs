//! The registry: registrations checked against the handlers at start (every
//! problem at once), the registry derived from the handlers, undecodable
//! payloads, unknown names, the catch-all, and a job's own retry policy.

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

/// The violations of a start refused for its registrations, as
/// `field: rule` lines.
fn refused_registrations(result: Result<actix::Addr<DrainCoordinator>, Error>) -> Vec<String> {
    match result {
        Err(Error::Outbox(outbox::Error::Config(config))) => config
            .violations
            .iter()
            .map(|v| format!("{}: {}", v.field, v.rule))
            .collect(),
        Err(other) => panic!("refused for another reason: {other}"),
        Ok(_) => panic!("started"),
    }
}

#[test]
fn start_refuses_registered_messages_without_a_transport() {
    run(|| async {
        let store = FaultStore::new();
        let clock = clock();
        let id = store
            .enqueue(NewMessage::event(&ping(1, 0)).unwrap().at(clock.now()))
            .await
            .unwrap()
            .into_id();
        let refused = refused_registrations(
            DrainCoordinator::builder(store.clone())
                .registry(registry())
                .clock(clock)
                .start(),
        );
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert!(
            refused[0].starts_with("event_bus: is missing, but events are registered (\"ping\")"),
            "{refused:?}"
        );
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

#[derive(Debug, Serialize, Deserialize)]
struct Audited {
    what: String,
}

impl outbox::Event for Audited {
    const NAME: &'static str = "audited";
}

#[test]
fn start_lists_every_registration_problem_at_once() {
    run(|| async {
        let store = FaultStore::new();
        let result = DrainCoordinator::builder(store.clone())
            .registry(
                Registry::builder()
                    .event::<Ping>()
                    .any(MessageKind::Event)
                    .job::<Reindex>()
                    .build()
                    .unwrap(),
            )
            // Serves `audited`, which is not registered, and not `ping`.
            .event_bus(InProcessBus::new().on(|_: Arc<Audited>, _ctx| async { Ok(()) }))
            .config(outbox::DrainConfig {
                concurrency: 0,
                ..config()
            })
            .clock(clock())
            .start();
        let refused = refused_registrations(result);
        let expected = [
            "concurrency",
            "registry: registers event \"ping\", which no handler on the event_bus serves",
            "registry: accepts any event name (`any`), but the event_bus has no catch-all handler",
            "event_bus: has a handler for event \"audited\", which is not registered",
            "job_dispatcher: is missing, but jobs are registered (\"reindex\")",
        ];
        assert_eq!(refused.len(), expected.len(), "{refused:#?}");
        for (line, start) in refused.iter().zip(expected) {
            assert!(line.contains(start), "{line:?} does not say {start:?}");
        }
        assert_eq!(store.calls(Op::Claim), 0);
    });
}

#[test]
fn without_a_registry_the_handlers_register_their_types() {
    run(|| async {
        let store = FaultStore::new();
        let clock = clock();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (pings, jobs) = (seen.clone(), seen.clone());
        let coordinator = DrainCoordinator::builder(store.clone())
            .event_bus(InProcessBus::new().on(move |ping: Arc<Ping>, _ctx| {
                pings.lock().unwrap().push(format!("ping {}", ping.n));
                async { Ok(()) }
            }))
            .job_dispatcher(InProcessJobs::new().on(move |job: Reindex, _ctx| {
                jobs.lock().unwrap().push(format!("reindex {}", job.shard));
                async { Err(DeliveryError::msg("shard offline")) }
            }))
            .config(config())
            .clock(clock.clone())
            .start()
            .unwrap();
        store
            .enqueue(NewMessage::event(&ping(1, 0)).unwrap().at(clock.now()))
            .await
            .unwrap();
        let job = store
            .enqueue(
                NewMessage::job(&Reindex { shard: 3 })
                    .unwrap()
                    .with_max_attempts(10)
                    .at(clock.now()),
            )
            .await
            .unwrap()
            .into_id();
        let report = coordinator.send(Drain).await.unwrap().unwrap();
        assert_eq!((report.delivered, report.retried), (1, 1), "{report}");
        assert_eq!(*seen.lock().unwrap(), ["ping 1", "reindex 3"]);
        // The derived registration carries the job's own retry policy: a
        // fixed 60 s delay.
        let retried = store.inner().get_message(&job).await.unwrap();
        assert_eq!(
            retried.available_at,
            clock.now() + chrono::Duration::seconds(60)
        );
    });
}

#[test]
fn a_catch_all_handler_serves_every_registered_name() {
    run(|| async {
        let store = FaultStore::new();
        let started = DrainCoordinator::builder(store.clone())
            .registry(
                Registry::builder()
                    .event::<Ping>()
                    .any(MessageKind::Event)
                    .build()
                    .unwrap(),
            )
            .event_bus(InProcessBus::new().on_any(|_: Arc<RawMessage>, _ctx| async { Ok(()) }))
            .config(config())
            .clock(clock())
            .start();
        assert!(started.is_ok());
    });
}

/// A bus of an application's own, which cannot say what it serves.
struct OpaqueBus;

impl outbox::EventBus for OpaqueBus {
    fn publish(
        &self,
        _: outbox::Delivery,
    ) -> futures_util::future::LocalBoxFuture<'static, outbox::DeliveryResult> {
        Box::pin(async { Ok(()) })
    }
}

#[test]
fn a_transport_that_cannot_list_its_names_is_trusted_but_needs_a_registry() {
    run(|| async {
        let store = FaultStore::new();
        let started = DrainCoordinator::builder(store.clone())
            .registry(registry())
            .event_bus(OpaqueBus)
            .config(config())
            .clock(clock())
            .start();
        assert!(started.is_ok());
        let refused = refused_registrations(
            DrainCoordinator::builder(store)
                .event_bus(OpaqueBus)
                .config(config())
                .clock(clock())
                .start(),
        );
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert!(
            refused[0].contains("the event_bus cannot list the events it serves"),
            "{refused:?}"
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
fn a_catch_all_without_its_transport_refuses_to_start() {
    run(|| async {
        let store = FaultStore::new();
        let refused = refused_registrations(
            DrainCoordinator::builder(store.clone())
                .registry(Registry::builder().any(MessageKind::Job).build().unwrap())
                .clock(clock())
                .start(),
        );
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert!(
            refused[0].contains(
                "job_dispatcher: is missing, but jobs are registered (any other job (`any`))"
            ),
            "{refused:?}"
        );
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
