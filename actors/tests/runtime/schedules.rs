//! Periodic schedules on the memory store, on virtual time: every slot
//! enqueued once by several coordinators, delivered once even when
//! delivered messages are deleted, the catch-up policies, daylight saving
//! time end to end, and the builder's refusals.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use chrono::{DateTime, TimeZone, Utc};
use outbox::{
    Clock, DeliveryContext, DrainConfig, Event, InProcessBus, MemoryOutbox, OutboxAdmin,
    OutboxMessage, RetentionConfig, TokioClock,
};
use outbox_actors::{
    CatchUp, DrainCoordinator, Error, GetSchedules, Schedule, ScheduleError, ScheduleStatus,
    Shutdown,
};
use serde::{Deserialize, Serialize};

use crate::support::{self, FaultStore, run};

/// The message every test schedule enqueues.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Tick;

impl Event for Tick {
    const NAME: &'static str = "tick";
}

/// The slots delivered, each with how many times it was.
pub(crate) type Deliveries = Arc<Mutex<BTreeMap<DateTime<Utc>, u32>>>;

/// A bus whose `Tick` handler counts deliveries per slot (a scheduled
/// message's `available_at` is its slot).
pub(crate) fn counting_bus(deliveries: &Deliveries) -> InProcessBus {
    let deliveries = deliveries.clone();
    InProcessBus::new().on(move |_: Arc<Tick>, context: DeliveryContext| {
        *deliveries
            .lock()
            .unwrap()
            .entry(context.message().available_at)
            .or_default() += 1;
        std::future::ready(Ok(()))
    })
}

pub(crate) fn every_minute() -> Schedule {
    Schedule::cron("every-minute", "* * * * *")
        .event(&Tick)
        .catch_up(CatchUp::All)
}

/// The slots of an every-minute schedule from `from` to `to`, both in.
pub(crate) fn minutes(from: DateTime<Utc>, to: DateTime<Utc>) -> Vec<DateTime<Utc>> {
    let mut slots = Vec::new();
    let mut at = from;
    while at <= to {
        slots.push(at);
        at += chrono::Duration::minutes(1);
    }
    slots
}

pub(crate) async fn statuses(coordinator: &Addr<DrainCoordinator>) -> Vec<ScheduleStatus> {
    coordinator.send(GetSchedules).await.unwrap()
}

async fn enqueued_by(coordinator: &Addr<DrainCoordinator>) -> u64 {
    statuses(coordinator).await.iter().map(|s| s.enqueued).sum()
}

async fn sleep_until(clock: &TokioClock, at: DateTime<Utc>) {
    let wait = (at - clock.now()).to_std().unwrap_or_default();
    tokio::time::sleep(wait).await;
}

fn at(hours: i64, minutes: i64, seconds: i64) -> DateTime<Utc> {
    support::epoch()
        + chrono::Duration::hours(hours)
        + chrono::Duration::minutes(minutes)
        + chrono::Duration::seconds(seconds)
}

fn stored_slots(messages: &[OutboxMessage]) -> Vec<DateTime<Utc>> {
    let mut slots: Vec<_> = messages.iter().map(|m| m.available_at).collect();
    slots.sort();
    slots
}

fn start(
    store: &MemoryOutbox,
    clock: &TokioClock,
    name: &str,
    deliveries: &Deliveries,
    schedule: Schedule,
) -> Addr<DrainCoordinator> {
    DrainCoordinator::builder(store.clone())
        .event_bus(counting_bus(deliveries))
        .config(DrainConfig {
            retention: RetentionConfig {
                delete_on_delivery: true,
                ..RetentionConfig::default()
            },
            ..DrainConfig::default()
        })
        .clock(clock.clone())
        .process_name(name)
        .schedule(schedule)
        .start()
        .unwrap()
}

/// Three processes run one every-minute schedule for a virtual day; "a" is
/// down from 06:00 to 12:00. Each slot is enqueued once and delivered once,
/// although every delivered message is deleted at once (which frees its
/// idempotency key), and no process that comes back enqueues a slot again.
#[test]
fn schedule_memory_three_coordinators_enqueue_every_slot_once() {
    run(|| async {
        let store = MemoryOutbox::new();
        let clock = support::clock();
        let deliveries = Deliveries::default();
        let a = start(&store, &clock, "a", &deliveries, every_minute());
        let b = start(&store, &clock, "b", &deliveries, every_minute());
        let c = start(&store, &clock, "c", &deliveries, every_minute());

        sleep_until(&clock, at(6, 0, 30)).await;
        let a_before = enqueued_by(&a).await;
        a.send(Shutdown {
            grace: Duration::from_secs(5),
        })
        .await
        .unwrap();
        sleep_until(&clock, at(12, 0, 30)).await;
        let a = start(&store, &clock, "a", &deliveries, every_minute());
        sleep_until(&clock, at(24, 0, 30)).await;

        let mut counts = BTreeMap::new();
        counts.insert("a", a_before + enqueued_by(&a).await);
        counts.insert("b", enqueued_by(&b).await);
        counts.insert("c", enqueued_by(&c).await);
        println!(
            "schedule slots enqueued per process (memory, 24 h, every minute, a down 06:00-12:00): {counts:?}"
        );

        let expected = minutes(at(0, 0, 0), at(24, 0, 0));
        assert_eq!(
            counts.values().sum::<u64>(),
            expected.len() as u64,
            "every slot enqueued once in all"
        );
        assert!(
            counts["a"] < expected.len() as u64,
            "another process enqueued while `a` was down: {counts:?}"
        );
        let delivered = deliveries.lock().unwrap().clone();
        assert_eq!(
            delivered.keys().copied().collect::<Vec<_>>(),
            expected,
            "every slot delivered"
        );
        assert!(
            delivered.values().all(|&times| times == 1),
            "no slot delivered twice"
        );
        assert!(store.is_empty(), "every delivered message was deleted");

        let states = store.list_schedules().await.unwrap();
        assert_eq!(states.len(), 1);
        assert_eq!(states[0].last_slot, Some(at(24, 0, 0)));
        assert_eq!(states[0].next_slot, Some(at(24, 1, 0)));
        assert_eq!(states[0].created_at, at(0, 0, 0));
        assert_eq!(states[0].expression, "cron * * * * *");
        assert_eq!(states[0].time_zone, "UTC");
        assert_eq!(states[0].message_name, "tick");
        for coordinator in [&a, &b, &c] {
            let status = &statuses(coordinator).await[0];
            assert_eq!(status.last_slot, Some(at(24, 0, 0)));
            assert_eq!(status.next_slot, Some(at(24, 1, 0)));
            assert_eq!(status.failures, 0);
        }
    });
}

/// Run one every-minute schedule with `policy` from 00:00 to 00:10:30,
/// stop, come back at 02:00:30 and run to 02:05:30: what was enqueued.
fn after_two_hours_down(policy: CatchUp, within: Duration) -> (Vec<DateTime<Utc>>, ScheduleStatus) {
    let mut result = None;
    run(|| async {
        let store = MemoryOutbox::new();
        let clock = support::clock();
        let schedule = || every_minute().catch_up(policy).catch_up_within(within);
        let first = DrainCoordinator::builder(store.clone())
            .clock(clock.clone())
            .wake_on_insert(false)
            .schedule(schedule())
            .start()
            .unwrap();
        sleep_until(&clock, at(0, 10, 30)).await;
        first
            .send(Shutdown {
                grace: Duration::ZERO,
            })
            .await
            .unwrap();
        sleep_until(&clock, at(2, 0, 30)).await;
        let second = DrainCoordinator::builder(store.clone())
            .clock(clock.clone())
            .wake_on_insert(false)
            .schedule(schedule())
            .start()
            .unwrap();
        sleep_until(&clock, at(2, 5, 30)).await;
        let status = statuses(&second).await.remove(0);
        result = Some((stored_slots(&store.snapshot()), status));
    });
    result.unwrap()
}

#[test]
fn schedule_catch_up_all_enqueues_every_missed_slot_oldest_first() {
    let (slots, status) = after_two_hours_down(CatchUp::All, Duration::from_secs(24 * 3600));
    assert_eq!(slots, minutes(at(0, 0, 0), at(2, 5, 0)));
    assert_eq!(
        status.enqueued,
        110 + 5,
        "the missed 00:11 to 02:00, then 02:01 on"
    );
}

#[test]
fn schedule_catch_up_latest_enqueues_only_the_last_missed_slot() {
    let (slots, status) = after_two_hours_down(CatchUp::Latest, Duration::from_secs(24 * 3600));
    let mut expected = minutes(at(0, 0, 0), at(0, 10, 0));
    expected.extend(minutes(at(2, 0, 0), at(2, 5, 0)));
    assert_eq!(
        slots, expected,
        "02:00 is the latest missed slot at 02:00:30"
    );
    assert_eq!(status.enqueued, 6);
}

#[test]
fn schedule_catch_up_never_reaches_past_its_horizon() {
    let (slots, status) = after_two_hours_down(CatchUp::All, Duration::from_secs(30 * 60));
    let mut expected = minutes(at(0, 0, 0), at(0, 10, 0));
    expected.extend(minutes(at(1, 31, 0), at(2, 5, 0)));
    assert_eq!(slots, expected, "nothing older than 30 minutes at 02:00:30");
    assert_eq!(status.enqueued, 30 + 5);
}

/// A schedule declared for the first time starts at its declaration: the
/// slots before it are not missed slots.
#[test]
fn schedule_starts_at_its_first_declaration() {
    run(|| async {
        let store = MemoryOutbox::new();
        let clock = TokioClock::starting_at(at(0, 0, 20));
        let coordinator = DrainCoordinator::builder(store.clone())
            .clock(clock.clone())
            .wake_on_insert(false)
            .schedule(every_minute())
            .start()
            .unwrap();
        sleep_until(&clock, at(0, 3, 10)).await;
        assert_eq!(
            stored_slots(&store.snapshot()),
            minutes(at(0, 1, 0), at(0, 3, 0))
        );
        assert_eq!(statuses(&coordinator).await[0].enqueued, 3);
    });
}

/// A slot's message is an ordinary one: due at its slot, with the slot's
/// idempotency key, the schedule's payload and no trace.
#[test]
fn schedule_slot_messages_are_due_at_their_slot() {
    run(|| async {
        let store = MemoryOutbox::new();
        let clock = support::clock();
        let _coordinator = DrainCoordinator::builder(store.clone())
            .clock(clock.clone())
            .wake_on_insert(false)
            .process_name("worker-7")
            .schedule(Schedule::every("quarter-hour", Duration::from_secs(15 * 60)).event(&Tick))
            .start()
            .unwrap();
        sleep_until(&clock, at(0, 20, 0)).await;
        let messages = store.snapshot();
        assert_eq!(messages.len(), 2, "00:00 and 00:15");
        let last = messages.last().unwrap();
        assert_eq!(last.available_at, at(0, 15, 0));
        assert_eq!(last.created_at, at(0, 15, 0));
        assert_eq!(last.name, "tick");
        assert_eq!(last.payload.as_str(), "null");
        assert_eq!(last.trace, None);
        let state = &store.list_schedules().await.unwrap()[0];
        assert_eq!(state.expression, "every 15m");
        assert_eq!(state.last_enqueued_by.as_deref(), Some("worker-7"));
        assert_eq!(state.last_message_id.as_deref(), Some(last.id.as_str()));
        assert_eq!(state.next_slot, Some(at(0, 30, 0)));
        // The key is the slot's: enqueueing it by hand finds the message.
        let again = outbox::NewMessage::event(&Tick)
            .unwrap()
            .at(clock.now())
            .with_options(outbox::EnqueueOptions::new().idempotency_key(
                outbox::slot_key("quarter-hour", at(0, 15, 0)),
                Duration::from_secs(60),
            ));
        assert_eq!(
            outbox::OutboxStore::enqueue(&store, again).await.unwrap(),
            outbox::Enqueued::AlreadyExists(last.id.clone())
        );
    });
}

/// Europe/Paris skips 02:00 to 03:00 on 29 March 2026 and repeats 02:00 to
/// 03:00 on 25 October 2026. A daily 02:30 runs right after the gap, and
/// once on the repeated night; a half-hourly one skips the gap and runs in
/// both passes of the repeat.
#[test]
fn schedule_follows_daylight_saving_time_in_its_zone() {
    let utc = |text: &str| {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .with_timezone(&Utc)
    };
    let run_over = |from: &str, to: &str, schedule: Schedule| {
        let (from, to) = (utc(from), utc(to));
        let mut result = None;
        run(|| async {
            let store = MemoryOutbox::new();
            let clock = TokioClock::starting_at(from);
            let _coordinator = DrainCoordinator::builder(store.clone())
                .clock(clock.clone())
                .wake_on_insert(false)
                .schedule(schedule)
                .start()
                .unwrap();
            sleep_until(&clock, to).await;
            result = Some(
                stored_slots(&store.snapshot())
                    .into_iter()
                    .map(|slot| slot.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                    .collect::<Vec<_>>(),
            );
        });
        result.unwrap()
    };
    let daily = || {
        Schedule::cron("daily", "30 2 * * *")
            .time_zone("Europe/Paris")
            .event(&Tick)
    };
    let half_hourly = || {
        Schedule::cron("half-hourly", "*/30 1-3 * * *")
            .time_zone("Europe/Paris")
            .event(&Tick)
    };
    assert_eq!(
        run_over("2026-03-28T12:00:00Z", "2026-03-30T12:00:00Z", daily()),
        ["2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"]
    );
    assert_eq!(
        run_over("2026-10-24T12:00:00Z", "2026-10-26T12:00:00Z", daily()),
        ["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"]
    );
    assert_eq!(
        run_over(
            "2026-03-28T23:50:00Z",
            "2026-03-29T02:00:00Z",
            half_hourly()
        ),
        [
            "2026-03-29T00:00:00Z", // 01:00 CET
            "2026-03-29T00:30:00Z", // 01:30 CET
            "2026-03-29T01:00:00Z", // 03:00 CEST
            "2026-03-29T01:30:00Z", // 03:30 CEST
        ]
    );
    assert_eq!(
        run_over(
            "2026-10-24T22:50:00Z",
            "2026-10-25T03:00:00Z",
            half_hourly()
        ),
        [
            "2026-10-24T23:00:00Z", // 01:00 CEST
            "2026-10-24T23:30:00Z", // 01:30 CEST
            "2026-10-25T00:00:00Z", // 02:00 CEST
            "2026-10-25T00:30:00Z", // 02:30 CEST
            "2026-10-25T01:00:00Z", // 02:00 CET
            "2026-10-25T01:30:00Z", // 02:30 CET
            "2026-10-25T02:00:00Z", // 03:00 CET
            "2026-10-25T02:30:00Z", // 03:30 CET
        ]
    );
}

/// A shut-down coordinator's schedules stop with it.
#[test]
fn schedule_stops_at_shutdown() {
    run(|| async {
        let store = MemoryOutbox::new();
        let clock = support::clock();
        let coordinator = DrainCoordinator::builder(store.clone())
            .clock(clock.clone())
            .wake_on_insert(false)
            .schedule(every_minute())
            .start()
            .unwrap();
        sleep_until(&clock, at(0, 2, 30)).await;
        coordinator
            .send(Shutdown {
                grace: Duration::ZERO,
            })
            .await
            .unwrap();
        sleep_until(&clock, at(1, 0, 0)).await;
        assert_eq!(store.len(), 3, "00:00, 00:01 and 00:02");
    });
}

/// Every bad schedule is refused at start with an error that names its
/// field, and nothing starts.
#[test]
fn schedule_errors_name_their_field() {
    run(|| async {
        let store = MemoryOutbox::new();
        let refused = |schedules: Vec<Schedule>| {
            let mut builder = DrainCoordinator::builder(store.clone());
            for schedule in schedules {
                builder = builder.schedule(schedule);
            }
            match builder.start() {
                Err(Error::Schedule(error)) => error,
                Err(other) => panic!("expected a schedule error, got {other}"),
                Ok(_) => panic!("a bad schedule started"),
            }
        };
        let tick = |schedule: Schedule| schedule.event(&Tick);
        let cases = [
            (vec![tick(Schedule::cron("bad-cron", "61 * * * *"))], "cron"),
            (vec![tick(Schedule::cron("words", "every tuesday"))], "cron"),
            (
                vec![tick(
                    Schedule::cron("zoned", "* * * * *").time_zone("Mars/Olympus"),
                )],
                "time_zone",
            ),
            (
                vec![tick(Schedule::every("zero", Duration::ZERO))],
                "interval",
            ),
            (vec![tick(Schedule::cron("", "* * * * *"))], "name"),
            (
                vec![tick(Schedule::cron(
                    "n".repeat(outbox::MAX_SCHEDULE_NAME_LEN + 1),
                    "* * * * *",
                ))],
                "name",
            ),
            (
                vec![
                    tick(Schedule::cron("twice", "* * * * *")),
                    tick(Schedule::every("twice", Duration::from_secs(60))),
                ],
                "name",
            ),
            (vec![Schedule::cron("no-message", "* * * * *")], "message"),
            (
                vec![tick(
                    Schedule::cron("no-horizon", "* * * * *").catch_up_within(Duration::ZERO),
                )],
                "catch_up_within",
            ),
        ];
        for (schedules, field) in cases {
            let names: Vec<String> = schedules.iter().map(|s| s.name().to_owned()).collect();
            let error = refused(schedules);
            assert_eq!(error.field(), field, "{names:?}: {error}");
            assert!(
                error.to_string().contains(&format!("`{field}`")),
                "the message names `{field}`: {error}"
            );
        }
        assert!(matches!(
            refused(vec![tick(Schedule::cron("twice", "* * * * *")), tick(Schedule::cron("twice", "0 * * * *"))]),
            ScheduleError::DuplicateName { name } if name == "twice"
        ));
        assert!(matches!(
            refused(vec![tick(Schedule::cron("zoned", "* * * * *").time_zone("Europe/Pariss"))]),
            ScheduleError::UnknownTimeZone { zone, .. } if zone == "Europe/Pariss"
        ));
        let validated = tick(Schedule::every("ok", Duration::from_secs(1))).validate();
        assert_eq!(validated, Ok(()));

        // A store that keeps no schedules.
        let error = match DrainCoordinator::builder(FaultStore::new())
            .schedule(every_minute())
            .start()
        {
            Err(Error::Schedule(error)) => error,
            other => panic!("expected a schedule error, got {:?}", other.map(|_| ())),
        };
        assert_eq!(error, ScheduleError::Unsupported);
        assert_eq!(error.field(), "store");
        assert!(store.list_schedules().await.unwrap().is_empty());
        assert!(store.is_empty());
    });
}

/// The clock the store sees is the coordinator's: a schedule declared at
/// the clock's start has that as its first declaration.
#[test]
fn schedule_declaration_uses_the_coordinators_clock() {
    run(|| async {
        let store = MemoryOutbox::new();
        let origin = Utc.with_ymd_and_hms(2030, 6, 1, 12, 0, 0).unwrap();
        let clock = TokioClock::starting_at(origin);
        let _coordinator = DrainCoordinator::builder(store.clone())
            .clock(clock.clone())
            .wake_on_insert(false)
            .schedule(Schedule::cron("hourly", "0 * * * *").event(&Tick))
            .start()
            .unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let state = &store.list_schedules().await.unwrap()[0];
        assert_eq!(state.created_at, origin);
        assert_eq!(state.last_slot, Some(origin), "12:00 is at the declaration");
        assert_eq!(state.next_slot, Some(origin + chrono::Duration::hours(1)));
    });
}
