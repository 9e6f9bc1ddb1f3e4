//! The periodic schedules' part of the contract: declaring a schedule, and
//! enqueueing each of its slots once, even after the slot's message was
//! deleted. Expanded by [`schedule_suite!`] beside the main suite, on every
//! store that keeps schedules.

use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox::{
    DeclareSchedule, EnqueueOptions, Enqueued, Error, MAX_SCHEDULE_NAME_LEN, OutboxAdmin,
    OutboxStore, ScheduleState, ScheduleStore, SlotOutcome, slot_key,
};

use super::{MINUTE, assert_invalid, at, claim_one, everything, message};

/// Expands to one `#[tokio::test]` per schedule case, each on a fresh store
/// from `$setup`, an `async fn() -> S` where `S: OutboxStore + OutboxAdmin + Clone`.
macro_rules! schedule_suite {
    ($setup:path) => {
        $crate::conformance::schedules::schedule_suite!(@cases $setup;
            conformance_schedule_declared_without_progress => declared_without_progress,
            conformance_schedule_redeclared_keeps_progress => redeclared_keeps_progress,
            conformance_schedule_slot_enqueued_and_recorded => slot_enqueued_and_recorded,
            conformance_schedule_slot_enqueued_once => slot_enqueued_once,
            conformance_schedule_slot_once_after_its_message_is_deleted
                => slot_once_after_its_message_is_deleted,
            conformance_schedule_slot_whose_key_is_held_still_advances
                => slot_whose_key_is_held_still_advances,
            conformance_schedule_undeclared_slot_is_refused => undeclared_slot_is_refused,
            conformance_schedule_bad_input_is_refused => bad_input_is_refused,
        );

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn conformance_schedule_racing_slots_enqueue_once() {
            $crate::conformance::schedules::racing_slots_enqueue_once($setup().await).await;
        }
    };
    (@cases $setup:path; $($test:ident => $case:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $test() {
                $crate::conformance::schedules::$case($setup().await).await;
            }
        )*
    };
}
pub(crate) use schedule_suite;

const NAME: &str = "nightly-report";
const MESSAGE: &str = "report.nightly";

fn declare(name: &str, now: i64) -> DeclareSchedule {
    DeclareSchedule {
        name: name.to_owned(),
        expression: "cron 0 3 * * *".to_owned(),
        time_zone: "Europe/Paris".to_owned(),
        message_name: MESSAGE.to_owned(),
        next_slot: Some(at(now + 10 * MINUTE)),
        now: at(now),
    }
}

/// Slot `slot` of `name`, enqueued at `now` by `by`: an event whose
/// idempotency key names the slot, as the runtime sends it.
fn slot(name: &str, slot: i64, now: i64, by: &str) -> outbox::EnqueueSlot {
    let slot_at = at(slot);
    outbox::EnqueueSlot {
        schedule: name.to_owned(),
        slot: slot_at,
        next_slot: Some(at(slot + 10 * MINUTE)),
        enqueued_by: by.to_owned(),
        message: message(&format!("{name}@{slot}"), MESSAGE, now)
            .with_options(
                EnqueueOptions::new()
                    .run_at(slot_at)
                    .idempotency_key(slot_key(name, slot_at), Duration::from_secs(3600)),
            )
            .with_id(format!("{name}@{slot}")),
    }
}

fn schedules<S: OutboxStore>(store: &S) -> &dyn ScheduleStore {
    store
        .schedules()
        .expect("every bundled store keeps schedules")
}

async fn state<S: OutboxAdmin>(store: &S, name: &str) -> ScheduleState {
    store
        .list_schedules()
        .await
        .expect("list_schedules")
        .into_iter()
        .find(|state| state.name == name)
        .unwrap_or_else(|| panic!("no schedule {name:?} listed"))
}

async fn enqueue<S: OutboxStore>(store: &S, params: outbox::EnqueueSlot) -> SlotOutcome {
    schedules(store)
        .enqueue_slot(params)
        .await
        .expect("enqueue_slot")
}

#[track_caller]
fn assert_taken(outcome: SlotOutcome, last_slot: DateTime<Utc>) {
    assert_eq!(outcome, SlotOutcome::Taken { last_slot });
}

pub(crate) async fn declared_without_progress<S: OutboxStore + OutboxAdmin>(store: S) {
    let declared = schedules(&store)
        .declare_schedule(declare(NAME, 0))
        .await
        .expect("declare");
    assert_eq!(declared.name, NAME);
    assert_eq!(declared.expression, "cron 0 3 * * *");
    assert_eq!(declared.time_zone, "Europe/Paris");
    assert_eq!(declared.message_name, MESSAGE);
    assert_eq!(declared.created_at, at(0));
    assert_eq!(declared.updated_at, at(0));
    assert_eq!(declared.last_slot, None);
    assert_eq!(declared.next_slot, Some(at(10 * MINUTE)));
    assert_eq!(declared.last_enqueued_by, None);
    assert_eq!(declared.last_message_id, None);
    assert_eq!(state(&store, NAME).await, declared);
    assert!(
        everything(&store).await.is_empty(),
        "declaring enqueues nothing"
    );
}

pub(crate) async fn redeclared_keeps_progress<S: OutboxStore + OutboxAdmin>(store: S) {
    schedules(&store)
        .declare_schedule(declare(NAME, 0))
        .await
        .expect("declare");
    enqueue(&store, slot(NAME, MINUTE, MINUTE, "a")).await;
    let mut changed = declare(NAME, 5 * MINUTE);
    changed.expression = "every 15m".to_owned();
    changed.time_zone = "UTC".to_owned();
    changed.next_slot = Some(at(15 * MINUTE));
    let redeclared = schedules(&store)
        .declare_schedule(changed)
        .await
        .expect("declare again");
    assert_eq!(redeclared.expression, "every 15m");
    assert_eq!(redeclared.time_zone, "UTC");
    assert_eq!(redeclared.next_slot, Some(at(15 * MINUTE)));
    assert_eq!(redeclared.updated_at, at(5 * MINUTE));
    assert_eq!(redeclared.created_at, at(0), "the first declaration stays");
    assert_eq!(redeclared.last_slot, Some(at(MINUTE)), "progress is kept");
    assert_eq!(redeclared.last_enqueued_by.as_deref(), Some("a"));
    assert_eq!(state(&store, NAME).await, redeclared);
}

pub(crate) async fn slot_enqueued_and_recorded<S: OutboxStore + OutboxAdmin>(store: S) {
    schedules(&store)
        .declare_schedule(declare(NAME, 0))
        .await
        .expect("declare");
    let outcome = enqueue(&store, slot(NAME, MINUTE, MINUTE + 7, "worker-1")).await;
    let id = format!("{NAME}@{MINUTE}");
    assert_eq!(
        outcome,
        SlotOutcome::Enqueued(Enqueued::Inserted(id.clone()))
    );
    let stored = everything(&store).await;
    let message = stored.get(&id).expect("the slot's message is stored");
    assert_eq!(message.name, MESSAGE);
    assert_eq!(message.available_at, at(MINUTE), "due at its slot");
    assert_eq!(message.created_at, at(MINUTE + 7));
    let state = state(&store, NAME).await;
    assert_eq!(state.last_slot, Some(at(MINUTE)));
    assert_eq!(state.next_slot, Some(at(11 * MINUTE)));
    assert_eq!(state.last_enqueued_by.as_deref(), Some("worker-1"));
    assert_eq!(state.last_enqueued_at, Some(at(MINUTE + 7)));
    assert_eq!(state.last_message_id.as_deref(), Some(id.as_str()));
    assert_eq!(state.updated_at, at(MINUTE + 7));
}

pub(crate) async fn slot_enqueued_once<S: OutboxStore + OutboxAdmin>(store: S) {
    schedules(&store)
        .declare_schedule(declare(NAME, 0))
        .await
        .expect("declare");
    enqueue(&store, slot(NAME, 2 * MINUTE, 2 * MINUTE, "a")).await;
    let before = state(&store, NAME).await;
    // The same slot, from another process, and an earlier one: taken.
    assert_taken(
        enqueue(&store, slot(NAME, 2 * MINUTE, 2 * MINUTE + 1, "b")).await,
        at(2 * MINUTE),
    );
    assert_taken(
        enqueue(&store, slot(NAME, MINUTE, 2 * MINUTE + 2, "b")).await,
        at(2 * MINUTE),
    );
    assert_eq!(everything(&store).await.len(), 1, "one message for slot 2");
    assert_eq!(
        state(&store, NAME).await,
        before,
        "a taken slot writes nothing"
    );
    // The next slot goes on.
    let outcome = enqueue(&store, slot(NAME, 3 * MINUTE, 3 * MINUTE, "b")).await;
    assert!(matches!(
        outcome,
        SlotOutcome::Enqueued(Enqueued::Inserted(_))
    ));
    assert_eq!(state(&store, NAME).await.last_slot, Some(at(3 * MINUTE)));
    assert_eq!(everything(&store).await.len(), 2);
}

pub(crate) async fn slot_once_after_its_message_is_deleted<S: OutboxStore + OutboxAdmin>(store: S) {
    schedules(&store)
        .declare_schedule(declare(NAME, 0))
        .await
        .expect("declare");
    enqueue(&store, slot(NAME, MINUTE, MINUTE, "a")).await;
    let claimed = claim_one(&store, MINUTE + 1, MINUTE).await;
    store
        .mark_delivered(outbox::MarkDelivered {
            id: claimed.id.clone(),
            claim_token: claimed.claim_token.clone(),
            now: at(MINUTE + 2),
            delete: true,
        })
        .await
        .expect("delivered and deleted");
    assert!(everything(&store).await.is_empty());
    // The message is gone and its idempotency key free: only `last_slot`
    // stands between the slot and a second message.
    assert_taken(
        enqueue(&store, slot(NAME, MINUTE, MINUTE + 3, "b")).await,
        at(MINUTE),
    );
    assert!(
        everything(&store).await.is_empty(),
        "the slot came back after its message was deleted"
    );
    let key = slot_key(NAME, at(MINUTE));
    let plain = message("by-hand", MESSAGE, MINUTE + 4)
        .with_options(EnqueueOptions::new().idempotency_key(key, Duration::from_secs(3600)));
    assert!(
        store.enqueue(plain).await.expect("enqueue").is_inserted(),
        "the deleted message freed the slot's key, as every deletion does"
    );
}

pub(crate) async fn slot_whose_key_is_held_still_advances<S: OutboxStore + OutboxAdmin>(store: S) {
    schedules(&store)
        .declare_schedule(declare(NAME, 0))
        .await
        .expect("declare");
    let key = slot_key(NAME, at(MINUTE));
    let by_hand = message("by-hand", MESSAGE, 30 * 1_000)
        .with_options(EnqueueOptions::new().idempotency_key(key, Duration::from_secs(3600)));
    store.enqueue(by_hand).await.expect("enqueue by hand");
    let outcome = enqueue(&store, slot(NAME, MINUTE, MINUTE, "a")).await;
    assert_eq!(
        outcome,
        SlotOutcome::Enqueued(Enqueued::AlreadyExists("by-hand".to_owned()))
    );
    let state = state(&store, NAME).await;
    assert_eq!(state.last_slot, Some(at(MINUTE)));
    assert_eq!(
        state.last_message_id.as_deref(),
        Some("by-hand"),
        "the slot's message is the one holding its key"
    );
    assert_eq!(everything(&store).await.len(), 1);
}

pub(crate) async fn undeclared_slot_is_refused<S: OutboxStore + OutboxAdmin>(store: S) {
    assert_invalid(
        schedules(&store)
            .enqueue_slot(slot("never-declared", MINUTE, MINUTE, "a"))
            .await,
        "schedule",
    );
    assert!(everything(&store).await.is_empty());
    assert!(store.list_schedules().await.expect("list").is_empty());
}

pub(crate) async fn bad_input_is_refused<S: OutboxStore + OutboxAdmin>(store: S) {
    let long = "n".repeat(MAX_SCHEDULE_NAME_LEN + 1);
    for name in ["", "  ", long.as_str(), "tab\there", " padded"] {
        assert_invalid(
            schedules(&store).declare_schedule(declare(name, 0)).await,
            "name",
        );
    }
    let mut no_zone = declare(NAME, 0);
    no_zone.time_zone = String::new();
    assert_invalid(
        schedules(&store).declare_schedule(no_zone).await,
        "time_zone",
    );
    assert!(store.list_schedules().await.expect("list").is_empty());

    schedules(&store)
        .declare_schedule(declare(NAME, 0))
        .await
        .expect("declare");
    let mut nameless = slot(NAME, MINUTE, MINUTE, "a");
    nameless.message.name = String::new();
    assert_invalid(schedules(&store).enqueue_slot(nameless).await, "name");
    assert_invalid(
        schedules(&store)
            .enqueue_slot(slot(&long, MINUTE, MINUTE, "a"))
            .await,
        "schedule",
    );
    assert_eq!(
        state(&store, NAME).await.last_slot,
        None,
        "a refused slot moves nothing"
    );
    assert!(everything(&store).await.is_empty());
}

pub(crate) async fn racing_slots_enqueue_once<S: OutboxStore + OutboxAdmin + Clone>(store: S) {
    schedules(&store)
        .declare_schedule(declare(NAME, 0))
        .await
        .expect("declare");
    // Eight processes reach the same ten slots at once, each in its own
    // order of arrival.
    let mut tasks = Vec::new();
    for worker in 0..8 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut won = 0;
            for n in 1..=10 {
                let slot_ms = n * MINUTE;
                let mut params = slot(NAME, slot_ms, slot_ms, &format!("w{worker}"));
                // Fresh ids, so a second message of a slot would not be
                // stopped by its id.
                params.message.id = None;
                match schedules(&store).enqueue_slot(params).await {
                    Ok(SlotOutcome::Enqueued(_)) => won += 1,
                    Ok(SlotOutcome::Taken { .. }) => {}
                    Ok(other) => panic!("unexpected outcome {other:?}"),
                    Err(Error::Store { .. }) => {} // a busy database: this process lost
                    Err(e) => panic!("enqueue_slot failed: {e}"),
                }
            }
            won
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await.expect("a worker");
    }
    let stored = everything(&store).await;
    assert_eq!(total, stored.len(), "every win wrote one message");
    assert_eq!(total, 10, "every slot was won once");
    let mut slots: Vec<_> = stored.values().map(|m| m.available_at).collect();
    slots.sort();
    slots.dedup();
    assert_eq!(slots.len(), stored.len(), "no slot twice");
    assert_eq!(
        state(&store, NAME).await.last_slot,
        Some(at(10 * MINUTE)),
        "the last slot was reached"
    );
}
