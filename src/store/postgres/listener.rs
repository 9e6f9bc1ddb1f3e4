//! Wake-ups over `LISTEN`/`NOTIFY`: one listening connection per store
//! (shared by its clones) while anyone subscribes.
//!
//! It knows the store only by the pool and channel it is given, so the
//! store builds on it and not the other way round.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};

use crate::store::kit::WakeupSender;
use crate::store::{ArmWakeups, Wakeups};

/// The longest wait between attempts to re-establish the wake-up listener.
const MAX_LISTEN_BACKOFF: Duration = Duration::from_secs(5);

/// The wake-up listener's state, shared by the store's clones.
pub(super) struct Listener {
    wake: WakeupSender,
    /// Whether a listener task runs. Checked and set under this lock
    /// together with subscribing, so a task never stops while a subscriber
    /// it should serve exists.
    running: Mutex<bool>,
}

impl Listener {
    pub(super) fn new() -> Self {
        Listener {
            wake: WakeupSender::new(),
            running: Mutex::new(false),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, bool> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A receiver of the wake-ups on `channel`, which a drain asks for
    /// through `arm`; while any receiver lives, a task listens on a
    /// connection made with `pool`'s options. `None` outside a tokio
    /// runtime.
    pub(super) fn subscribe(
        self: &Arc<Self>,
        arm: ArmWakeups,
        pool: &PgPool,
        channel: &str,
    ) -> Option<Wakeups> {
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let mut running = self.lock();
        let wakeups = self.wake.subscribe_armed(arm);
        if !*running {
            *running = true;
            // The listener gets a connection of its own, outside the store's
            // pool, so it never takes a connection from claims and settlements.
            let options = (*pool.connect_options()).clone();
            runtime.spawn(listen(options, channel.to_owned(), self.clone()));
        }
        Some(wakeups)
    }
}

/// Listen on `channel` until the last subscriber is gone.
async fn listen(options: PgConnectOptions, channel: String, shared: Arc<Listener>) {
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
        wake.wake();
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
                Some(Ok(Some(_))) => wake.wake(),
                // The connection dropped and the listener reconnected (and
                // listens again); anything sent in between is lost.
                Some(Ok(None)) => wake.wake(),
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
