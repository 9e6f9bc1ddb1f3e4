//! The SQLite store's enqueue: through its pool, or on the caller's
//! connection with a commit hook that wakes drains when (and only if) the
//! caller's transaction commits.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use sqlx::sqlite::SqliteConnection;

use super::{Core, Shared, SqliteOutbox};
use crate::error::Result;
use crate::message::{Enqueued, NewMessage};
use crate::store::sql::db;

impl SqliteOutbox {
    /// Enqueue on the caller's connection, inside the caller's transaction
    /// when there is one (`&mut *tx`): rolled back, the message is gone;
    /// committed, the next claim sees it and [`OutboxStore::wakeups`](crate::OutboxStore::wakeups) fires.
    pub async fn enqueue_in(
        &self,
        conn: &mut SqliteConnection,
        message: NewMessage,
    ) -> Result<Enqueued> {
        message.validate()?;
        self.arm_wakeup(conn).await?;
        self.inner.core.insert(conn, message).await
    }

    /// Wake on this connection's next commit, not on a rollback.
    async fn arm_wakeup(&self, conn: &mut SqliteConnection) -> Result<()> {
        let mut handle = conn.lock_handle().await.map_err(db("enqueue"))?;
        let armed = Arc::new(AtomicBool::new(true));
        let disarm = armed.clone();
        let wake = self.inner.core.wake.clone();
        handle.set_commit_hook(move || {
            if armed.swap(false, Ordering::AcqRel) {
                wake.wake();
            }
            true
        });
        handle.set_rollback_hook(move || disarm.store(false, Ordering::Release));
        Ok(())
    }

    /// Enqueue through the store's own pool, in a transaction of its own.
    pub(super) async fn enqueue_now(&self, message: NewMessage) -> Result<Enqueued> {
        message.validate()?;
        let core = &self.inner.core;
        let enqueued = {
            let _write = core.write.lock().await;
            let mut conn = core.parts.pool.acquire().await.map_err(db("enqueue"))?;
            core.insert(&mut conn, message).await?
        };
        // Autocommit: the row is committed now.
        if enqueued.is_inserted() {
            core.wake.wake();
        }
        Ok(enqueued)
    }
}

impl Core {
    /// Insert unless the id is taken. A taken id is not a constraint
    /// violation (`ON CONFLICT DO NOTHING`), so the caller's transaction
    /// goes on as if the statement had not run.
    async fn insert(&self, conn: &mut SqliteConnection, message: NewMessage) -> Result<Enqueued> {
        let id = message.resolve_id();
        let message = NewMessage {
            id: Some(id.clone()),
            ..message
        };
        let sql = self.sql.insert.clone();
        Shared::insert_idempotent(&self.parts, conn, &message, id, |conn| {
            let (_, query) = Shared::insert(&sql, &message, false);
            Box::pin(async move {
                let done = query.execute(conn).await.map_err(db("enqueue"))?;
                Ok(done.rows_affected() > 0)
            })
        })
        .await
    }
}
