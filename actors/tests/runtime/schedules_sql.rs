//! Periodic schedules on real databases, on virtual time: three
//! coordinators, each on a store of its own (its own pool, as three
//! processes would have) over one SQLite file or one PostgreSQL table, run
//! an every-minute schedule for a virtual day, one of them down for six
//! hours; every slot is enqueued once.
//!
//! A paused tokio clock jumps ahead whenever the runtime has nothing to do,
//! which it also has while it waits on a database: a day of minutes would
//! pass during one query. So every store call here runs on a blocking
//! thread (`spawn_blocking`, which holds the clock still while it runs),
//! the query driven there to its end. The three processes' calls still run
//! at once, on threads of their own, and race for each slot for real.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use actix::Addr;
use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use outbox::{
    ClaimBatch, ClaimedBatch, DeclareSchedule, EnqueueSlot, Enqueued, ListMessages, MarkDelivered,
    MarkFailed, NewMessage, OutboxAdmin, OutboxStore, ReleaseClaim, RenewClaim, Result,
    ScheduleState, ScheduleStore, SlotOutcome,
};
use outbox_actors::{DrainCoordinator, Shutdown};

use crate::schedules::{every_minute, minutes, statuses};
use crate::support::{self, run};

/// Run `call` to its end on a blocking thread, the virtual clock held still.
async fn blocking<T, F>(call: F) -> T
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    let handle = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || handle.block_on(call))
        .await
        .expect("a blocking store call")
}

/// A store whose every call runs through [`blocking`].
#[derive(Clone)]
struct Lockstep<S>(S);

impl<S: OutboxStore + Clone> OutboxStore for Lockstep<S> {
    async fn enqueue(&self, message: NewMessage) -> Result<Enqueued> {
        let store = self.0.clone();
        blocking(async move { store.enqueue(message).await }).await
    }

    async fn claim_batch(&self, params: ClaimBatch) -> Result<ClaimedBatch> {
        let store = self.0.clone();
        blocking(async move { store.claim_batch(params).await }).await
    }

    async fn renew_claim(&self, params: RenewClaim) -> Result<DateTime<Utc>> {
        let store = self.0.clone();
        blocking(async move { store.renew_claim(params).await }).await
    }

    async fn mark_delivered(&self, params: MarkDelivered) -> Result<()> {
        let store = self.0.clone();
        blocking(async move { store.mark_delivered(params).await }).await
    }

    async fn mark_failed(&self, params: MarkFailed) -> Result<()> {
        let store = self.0.clone();
        blocking(async move { store.mark_failed(params).await }).await
    }

    async fn release_claim(&self, params: ReleaseClaim) -> Result<()> {
        let store = self.0.clone();
        blocking(async move { store.release_claim(params).await }).await
    }

    fn schedules(&self) -> Option<&dyn ScheduleStore> {
        Some(self)
    }
}

impl<S: OutboxStore + Clone> ScheduleStore for Lockstep<S> {
    fn declare_schedule(&self, params: DeclareSchedule) -> BoxFuture<'_, Result<ScheduleState>> {
        let store = self.0.clone();
        Box::pin(blocking(async move {
            store.schedules().unwrap().declare_schedule(params).await
        }))
    }

    fn enqueue_slot(&self, params: EnqueueSlot) -> BoxFuture<'_, Result<SlotOutcome>> {
        let store = self.0.clone();
        Box::pin(blocking(async move {
            store.schedules().unwrap().enqueue_slot(params).await
        }))
    }
}

fn at(hours: i64, seconds: i64) -> DateTime<Utc> {
    support::epoch() + chrono::Duration::hours(hours) + chrono::Duration::seconds(seconds)
}

async fn sleep_until(clock: &outbox::TokioClock, at: DateTime<Utc>) {
    let wait = (at - outbox::Clock::now(clock))
        .to_std()
        .unwrap_or_default();
    tokio::time::sleep(wait).await;
}

async fn enqueued_by(coordinator: &Addr<DrainCoordinator>) -> u64 {
    statuses(coordinator).await.iter().map(|s| s.enqueued).sum()
}

/// Every message stored, through [`blocking`].
async fn stored<S: OutboxAdmin + Clone>(store: &S) -> Vec<outbox::OutboxMessage> {
    let store = store.clone();
    blocking(async move {
        let mut all = Vec::new();
        let mut after = None;
        loop {
            let page = store
                .list_messages(ListMessages {
                    limit: 10_000,
                    after,
                    ..ListMessages::default()
                })
                .await
                .unwrap();
            all.extend(page.messages);
            match page.next {
                Some(next) => after = Some(next),
                None => return all,
            }
        }
    })
    .await
}

/// Three processes, each opening its own store with `open`, run an
/// every-minute schedule from 00:00 to 24:00:30; "a" is down from 06:00:30
/// to 12:00:30. Answers the slots each enqueued.
fn three_coordinators_over_a_day<S, F, Fut>(label: &str, open: F) -> BTreeMap<&'static str, u64>
where
    S: OutboxStore + OutboxAdmin + Clone,
    F: Fn() -> Fut,
    Fut: Future<Output = S> + Send + 'static,
{
    let mut counts = BTreeMap::new();
    run(|| async {
        let clock = support::clock();
        let start = |store: S, name: &'static str| {
            DrainCoordinator::builder(Lockstep(store))
                .clock(clock.clone())
                .wake_on_insert(false)
                .process_name(name)
                .schedule(every_minute())
                .start()
                .unwrap()
        };
        let a = start(blocking(open()).await, "a");
        let b = start(blocking(open()).await, "b");
        let c = start(blocking(open()).await, "c");
        let observer = blocking(open()).await;

        sleep_until(&clock, at(6, 30)).await;
        let a_before = enqueued_by(&a).await;
        let a_taken_before: u64 = statuses(&a).await.iter().map(|s| s.taken).sum();
        a.send(Shutdown {
            grace: Duration::ZERO,
        })
        .await
        .unwrap();
        sleep_until(&clock, at(12, 30)).await;
        let a = start(blocking(open()).await, "a");
        sleep_until(&clock, at(24, 30)).await;

        counts.insert("a", a_before + enqueued_by(&a).await);
        counts.insert("b", enqueued_by(&b).await);
        counts.insert("c", enqueued_by(&c).await);
        let taken: u64 = [&a, &b, &c]
            .into_iter()
            .map(|coordinator| async move {
                statuses(coordinator)
                    .await
                    .iter()
                    .map(|s| s.taken)
                    .sum::<u64>()
            })
            .collect::<futures_util::future::JoinAll<_>>()
            .await
            .into_iter()
            .sum::<u64>()
            + a_taken_before;
        println!(
            "schedule slots enqueued per process ({label}, 24 h, every minute, a down \
             06:00-12:00): {counts:?}; slots found taken by another process: {taken}"
        );
        for coordinator in [&a, &b, &c] {
            coordinator
                .send(Shutdown {
                    grace: Duration::ZERO,
                })
                .await
                .unwrap();
        }

        let expected = minutes(at(0, 0), at(24, 0));
        assert_eq!(
            counts.values().sum::<u64>(),
            expected.len() as u64,
            "every slot enqueued once in all: {counts:?}"
        );
        let messages = stored(&observer).await;
        let mut slots: Vec<_> = messages.iter().map(|m| m.available_at).collect();
        slots.sort();
        assert_eq!(slots, expected, "one message per slot, none twice");
        let states = {
            let observer = observer.clone();
            blocking(async move { observer.list_schedules().await.unwrap() }).await
        };
        assert_eq!(states.len(), 1);
        assert_eq!(states[0].last_slot, Some(at(24, 0)));
        assert_eq!(states[0].created_at, at(0, 0));
        let last = messages
            .iter()
            .find(|m| m.available_at == at(24, 0))
            .unwrap();
        assert_eq!(states[0].last_message_id.as_deref(), Some(last.id.as_str()));
    });
    counts
}

#[cfg(feature = "sqlite")]
#[test]
fn schedule_sqlite_three_coordinators_on_one_file_enqueue_every_slot_once() {
    let dir = std::env::temp_dir().join(format!(
        "outbox-schedules-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}/outbox.db", dir.display());
    let counts = three_coordinators_over_a_day("SQLite, one file", || {
        let url = url.clone();
        async move { outbox::SqliteOutbox::connect(&url).await.unwrap() }
    });
    assert!(counts.values().filter(|&&count| count > 0).count() >= 1);
    let _ = std::fs::remove_dir_all(&dir);
}

#[cfg(feature = "postgres")]
#[test]
fn schedule_postgres_three_coordinators_on_one_table_enqueue_every_slot_once() {
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| {
        panic!(
            "DATABASE_URL is not set. The PostgreSQL tests need a server: run them with \
             `scripts/with-postgres cargo test -p outbox-actors --features postgres --test runtime`"
        )
    });
    let table = format!("schedules_{}", uuid::Uuid::new_v4().simple());
    let counts = three_coordinators_over_a_day("PostgreSQL, one table", || {
        let (url, table) = (url.clone(), table.clone());
        async move {
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(4)
                .connect(&url)
                .await
                .unwrap();
            let store = outbox::PostgresOutbox::builder(pool)
                .table(&table)
                .unwrap()
                .build();
            store.setup().await.unwrap();
            store
        }
    });
    assert!(counts.values().filter(|&&count| count > 0).count() >= 1);
}
