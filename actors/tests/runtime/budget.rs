//! The attempt cap: the drain's `retry.max_attempts` raises or lowers it for
//! messages without their own, which keeps theirs; the default budget
//! outlasts a day.

use std::time::Duration;

use outbox::{
    Clock, DEFAULT_MAX_ATTEMPTS, DrainConfig, MessageStatus, NewMessage, OutboxStore, RetryPolicy,
};

use crate::support::run;
use crate::{Harness, Ping, ping};

fn failing() -> Ping {
    Ping {
        fail: Some("the broker is down".into()),
        ..ping(1, 0)
    }
}

/// Drain `id` until it is dead-lettered, waking for each retry on virtual
/// time; returns how many times the handler ran and how long it all took.
async fn until_dead(h: &Harness, id: &str) -> (usize, chrono::Duration) {
    let started = h.clock.now();
    loop {
        h.drain().await;
        let message = h.message(id).await;
        match message.status {
            MessageStatus::DeadLettered => break,
            MessageStatus::Pending => {
                let wait = (message.available_at - h.clock.now())
                    .to_std()
                    .unwrap_or_default();
                tokio::time::sleep(wait).await;
            }
            other => panic!("{id} is {other:?} between passes"),
        }
    }
    (h.probe.completed().len(), h.clock.now() - started)
}

fn capped(max_attempts: Option<u32>) -> DrainConfig {
    let mut retry = RetryPolicy::fixed(Duration::from_secs(5));
    retry.max_attempts = max_attempts;
    DrainConfig {
        retry,
        ..DrainConfig::default()
    }
}

#[test]
fn a_drain_cap_raised_to_25_runs_the_handler_25_times() {
    run(|| async {
        let h = Harness::start(capped(Some(25)));
        let id = h.enqueue(failing()).await;
        let (runs, _) = until_dead(&h, &id).await;
        assert_eq!(runs, 25);
        let dead = h.message(&id).await;
        assert_eq!((dead.attempts, dead.effective_max_attempts(25)), (25, 25));
    });
}

#[test]
fn a_drain_cap_above_the_default_raises_it_and_below_lowers_it() {
    run(|| async {
        let h = Harness::start(capped(Some(40)));
        let id = h.enqueue(failing()).await;
        assert_eq!(until_dead(&h, &id).await.0, 40);
    });
    run(|| async {
        let h = Harness::start(capped(Some(3)));
        let id = h.enqueue(failing()).await;
        assert_eq!(until_dead(&h, &id).await.0, 3);
    });
}

#[test]
fn a_messages_own_cap_wins_over_the_drains() {
    run(|| async {
        let h = Harness::start(capped(Some(40)));
        let message = NewMessage::event(&failing())
            .unwrap()
            .with_max_attempts(2)
            .at(h.clock.now());
        let id = h.store.enqueue(message).await.unwrap().into_id();
        assert_eq!(until_dead(&h, &id).await.0, 2);
    });
}

#[test]
fn the_default_budget_retries_for_more_than_a_day() {
    run(|| async {
        let h = Harness::start(DrainConfig::default());
        let id = h.enqueue(failing()).await;
        let (runs, took) = until_dead(&h, &id).await;
        assert_eq!(runs, DEFAULT_MAX_ATTEMPTS as usize);
        assert!(
            took >= chrono::Duration::hours(24),
            "dead-lettered after {took}"
        );
    });
}
