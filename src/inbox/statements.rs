//! The inbox's SQL text, rendered once per table. Only the validated table
//! name is ever spliced in; everything else is bound.

use std::sync::Arc;

use crate::store::sql::TableName;

/// The statements of one inbox table.
#[derive(Debug)]
pub(super) struct Statements {
    /// Insert a record unless one is there. Binds: consumer, message id,
    /// time. Changes one row when the record is new, none for a duplicate.
    pub(super) record: Arc<str>,
    /// Whether a record exists. Binds: consumer, message id.
    pub(super) processed: Arc<str>,
    /// Delete one batch of a consumer's oldest rows. Binds: consumer,
    /// horizon, limit.
    pub(super) purge: Arc<str>,
}

impl Statements {
    /// The SQLite text for the inbox of `outbox` (times as µs integers).
    #[cfg(feature = "sqlite")]
    pub(super) fn sqlite(outbox: &TableName) -> Self {
        let t = inbox_table(outbox);
        Statements {
            record: format!(
                "INSERT INTO {t} (consumer, message_id, processed_at) VALUES (?1, ?2, ?3) \
                 ON CONFLICT DO NOTHING"
            )
            .into(),
            processed: format!(
                "SELECT EXISTS (SELECT 1 FROM {t} WHERE consumer = ?1 AND message_id = ?2)"
            )
            .into(),
            // The cast keeps one plan for any limit (see the store's own
            // statements for why).
            purge: format!(
                "DELETE FROM {t} WHERE rowid IN ( \
                   SELECT rowid FROM {t} WHERE consumer = ?1 AND processed_at < ?2 \
                   ORDER BY processed_at LIMIT CAST(?3 AS INTEGER))"
            )
            .into(),
        }
    }

    /// The PostgreSQL text for the inbox of `outbox`.
    #[cfg(feature = "postgres")]
    pub(super) fn postgres(outbox: &TableName) -> Self {
        let t = inbox_table(outbox);
        Statements {
            // A row comes back only when the insert happened, so the answer
            // needs no second statement.
            record: format!(
                "INSERT INTO {t} (consumer, message_id, processed_at) VALUES ($1, $2, $3) \
                 ON CONFLICT DO NOTHING RETURNING true"
            )
            .into(),
            processed: format!(
                "SELECT EXISTS (SELECT 1 FROM {t} WHERE consumer = $1 AND message_id = $2)"
            )
            .into(),
            // Rows a consumer's transaction holds are left for the next
            // batch rather than waited for.
            purge: format!(
                "DELETE FROM {t} WHERE consumer = $1 AND message_id IN ( \
                   SELECT message_id FROM {t} WHERE consumer = $1 AND processed_at < $2 \
                   ORDER BY processed_at LIMIT $3 FOR UPDATE SKIP LOCKED)"
            )
            .into(),
        }
    }
}

/// The inbox table of `outbox`, quoted: `"<table>_inbox"` in the outbox
/// table's schema.
pub(super) fn inbox_table(outbox: &TableName) -> String {
    outbox.derived("inbox", true)
}
