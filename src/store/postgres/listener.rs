//! Wake-ups over `LISTEN`/`NOTIFY`: one listening connection per store
//! (shared by its clones) while anyone subscribes.
//!
//! It knows the store only by the pool, channel and statements it is
//! given, so the store builds on it and not the other way round.
//!
//! Besides waking its subscribers, the listener keeps the store's arming
//! state (see `migrations/postgres/0020_wake_sequences.sql`): each
//! wake-up it hears is recorded as served, so the enqueues after it stop
//! notifying, and an arming that waits unwoken is renewed before it lapses.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use sqlx::AssertSqlSafe;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use tokio::time::Instant;

use crate::store::kit::WakeupSender;
use crate::store::{ArmOutcome, ArmWakeups, Wakeups};

/// The longest wait between attempts to re-establish the wake-up listener.
const MAX_LISTEN_BACKOFF: Duration = Duration::from_secs(5);

/// How often the listener looks for an arming to renew.
const RENEW_CHECK: Duration = Duration::from_secs(10);

/// The age at which an arming still unwoken is renewed: a third of its
/// lapse (`statements::ARMING_LAPSES_MS`), so two more checks come before
/// it would lapse.
const RENEW_AFTER: Duration = Duration::from_secs(20);

/// The longest a renewal may take before the drains are told to arm again
/// themselves.
const RENEW_TIMEOUT: Duration = Duration::from_secs(10);

/// The age past which an arming may have lapsed on the server's clock
/// (`statements::ARMING_LAPSES_MS`, less a margin for the arming's round
/// trip and the checks' lateness): enqueues committed since may not have
/// notified, so it is not renewed but the drains are woken, to claim and
/// then arm again.
const MAY_HAVE_LAPSED: Duration = Duration::from_secs(45);

/// What to do about an arming made `age` ago and not woken since.
#[derive(Debug, PartialEq, Eq)]
enum Renewal {
    /// Nothing yet.
    Wait,
    /// Arm again, before it lapses.
    Renew,
    /// Wake the drains: it may have lapsed (the process was stalled, or a
    /// renewal came too late).
    Wake,
}

fn renewal(age: Duration) -> Renewal {
    if age >= MAY_HAVE_LAPSED {
        Renewal::Wake
    } else if age >= RENEW_AFTER {
        Renewal::Renew
    } else {
        Renewal::Wait
    }
}

/// The wake-up listener's state, shared by the store's clones.
pub(super) struct Listener {
    wake: WakeupSender,
    /// Whether a listener task runs. Checked and set under this lock
    /// together with subscribing, so a task never stops while a subscriber
    /// it should serve exists.
    running: Mutex<bool>,
    /// When a drain of this store last armed, while no wake-up has been
    /// heard since: the arming to renew.
    armed_at: Mutex<Option<Instant>>,
}

/// What the listener task runs besides listening.
#[derive(Clone)]
pub(super) struct Statements {
    /// Arms the store's wake-ups, as a drain does.
    pub(super) arm: ArmWakeups,
    /// Records a heard arming as served; binds the arming.
    pub(super) served: Arc<str>,
}

impl Listener {
    pub(super) fn new() -> Self {
        Listener {
            wake: WakeupSender::new(),
            running: Mutex::new(false),
            armed_at: Mutex::new(None),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, bool> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn armed_at(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.armed_at.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A drain of this store armed just now.
    pub(super) fn armed(&self) {
        *self.armed_at() = Some(Instant::now());
    }

    /// Wake every subscriber: the drains arm again before their next
    /// claim, so no arming is left to renew.
    fn wake(&self) {
        *self.armed_at() = None;
        self.wake.wake();
    }

    /// A receiver of the wake-ups on `channel`, which a drain asks for
    /// through `statements.arm`; while any receiver lives, a task listens on
    /// a connection made with `pool`'s options. `None` outside a tokio
    /// runtime.
    pub(super) fn subscribe(
        self: &Arc<Self>,
        statements: &Statements,
        pool: &PgPool,
        channel: &str,
    ) -> Option<Wakeups> {
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let mut running = self.lock();
        let wakeups = self.wake.subscribe_armed(statements.arm.clone());
        if !*running {
            *running = true;
            // The listener gets a connection of its own, outside the store's
            // pool, so it never takes a connection from claims and settlements.
            let options = (*pool.connect_options()).clone();
            runtime.spawn(listen(
                options,
                channel.to_owned(),
                statements.clone(),
                self.clone(),
            ));
        }
        Some(wakeups)
    }
}

/// Aborts its task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Renew an arming that waited unwoken for [`RENEW_AFTER`], as long as the
/// listener runs. A renewal that cannot arm (an enqueue in flight, an
/// error), and an arming that may have lapsed already, wake the drains
/// instead, which then claim and arm again themselves, and claim again
/// shortly while they cannot arm: the arming they rely on would lapse, or
/// did.
async fn keep_armed(shared: Arc<Listener>, arm: ArmWakeups) {
    let mut checks = tokio::time::interval(RENEW_CHECK);
    checks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        checks.tick().await;
        let age = *shared.armed_at();
        match age.map_or(Renewal::Wait, |at| renewal(at.elapsed())) {
            Renewal::Wait => continue,
            Renewal::Wake => {
                shared.wake();
                continue;
            }
            Renewal::Renew => {}
        }
        // An arming answered `Armed` records itself (see the store's
        // `subscribe`).
        match tokio::time::timeout(RENEW_TIMEOUT, arm.arm()).await {
            Ok(Ok(ArmOutcome::Armed)) => {}
            Ok(Ok(ArmOutcome::EnqueueInFlight)) => shared.wake(),
            Ok(Err(error)) => {
                tracing::warn!(%error, "outbox wake-ups could not be armed again");
                shared.wake();
            }
            Err(_) => {
                tracing::warn!(timeout = ?RENEW_TIMEOUT, "outbox wake-ups could not be armed again in time");
                shared.wake();
            }
        }
    }
}

/// Listen on `channel` until the last subscriber is gone.
async fn listen(
    options: PgConnectOptions,
    channel: String,
    statements: Statements,
    shared: Arc<Listener>,
) {
    let _renewing = AbortOnDrop(tokio::spawn(keep_armed(
        shared.clone(),
        statements.arm.clone(),
    )));
    let wake = shared.wake.clone();
    let mut backoff = Duration::from_millis(50);
    loop {
        let connected = tokio::select! {
            () = wake.closed() => None,
            connected = connect_listener(&options, &channel) => Some(connected),
        };
        let mut listener = match connected {
            None if stop(&shared) => return,
            None => continue,
            Some(Ok(listener)) => listener,
            Some(Err(e)) => {
                tracing::warn!(%channel, error = %e, retry_in = ?backoff,
                    "outbox wake-up listener cannot connect");
                tokio::select! {
                    () = wake.closed() => if stop(&shared) { return },
                    () = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(MAX_LISTEN_BACKOFF);
                continue;
            }
        };
        backoff = Duration::from_millis(50);
        // Notifications sent while nobody listened are lost: look once.
        shared.wake();
        loop {
            let received = tokio::select! {
                () = wake.closed() => None,
                received = listener.try_recv() => Some(received),
            };
            match received {
                // A cancelled receive may leave the connection mid-message:
                // start over on a fresh one if subscribers came back.
                None if stop(&shared) => return,
                None => break,
                Some(Ok(Some(notification))) => {
                    shared.wake();
                    // The arming it carries (an enqueue's payload); an empty
                    // one comes from a requeue, or from an earlier version.
                    if let Ok(arming) = notification.payload().parse::<i64>() {
                        let served = sqlx::query(AssertSqlSafe(statements.served.clone()))
                            .bind(arming)
                            .execute(&mut listener)
                            .await;
                        if let Err(e) = served {
                            // The next enqueues notify again, and the
                            // next wake-up heard records it.
                            tracing::warn!(%channel, error = %e, "outbox wake-up could not be recorded as served");
                        }
                    }
                }
                // The connection dropped and the listener reconnected (and
                // listens again); anything sent in between is lost.
                Some(Ok(None)) => shared.wake(),
                Some(Err(e)) => {
                    tracing::warn!(%channel, error = %e, "outbox wake-up listener lost its connection");
                    break;
                }
            }
        }
    }
}

/// `true` (and the task marked stopped) when no subscriber is left.
fn stop(shared: &Listener) -> bool {
    let mut running = shared.lock();
    if shared.wake.has_subscribers() {
        return false;
    }
    *running = false;
    true
}

async fn connect_listener(options: &PgConnectOptions, channel: &str) -> sqlx::Result<PgListener> {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .idle_timeout(None)
        .max_lifetime(None)
        .connect_lazy_with(options.clone());
    let mut listener = PgListener::connect_with(&pool).await?;
    listener.ignore_pool_close_event(true);
    listener.listen(channel).await?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_arming_is_renewed_well_before_it_lapses_and_never_after() {
        let lapse = Duration::from_millis(
            super::super::statements::ARMING_LAPSES_MS
                .try_into()
                .expect("positive"),
        );
        assert_eq!(renewal(Duration::ZERO), Renewal::Wait);
        assert_eq!(
            renewal(RENEW_AFTER - Duration::from_millis(1)),
            Renewal::Wait
        );
        assert_eq!(renewal(RENEW_AFTER), Renewal::Renew);
        // Checked every RENEW_CHECK: at least two chances before the margin.
        assert!(RENEW_AFTER + 2 * RENEW_CHECK < MAY_HAVE_LAPSED);
        assert_eq!(
            renewal(MAY_HAVE_LAPSED - Duration::from_millis(1)),
            Renewal::Renew
        );
        assert_eq!(renewal(MAY_HAVE_LAPSED), Renewal::Wake);
        assert_eq!(renewal(lapse * 10), Renewal::Wake);
        // A renewal that starts just short of the margin ends, or is
        // abandoned and the drains woken, seconds before the lapse.
        assert!(MAY_HAVE_LAPSED + RENEW_TIMEOUT + Duration::from_secs(5) <= lapse);
    }
}
