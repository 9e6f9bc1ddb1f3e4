//! What the SQL stores share, written once: the validated table name,
//! migrations rendered for it, settlement modes, turning rows back into
//! messages, and every operation that differs between SQLite and PostgreSQL
//! only in its SQL text and in how a time is stored.
//!
//! # The shared half
//!
//! A SQL store's core implements the private `SqlBackend` trait: its sqlx
//! database, how it stores a time, its pool, its statements, the lock its own
//! writes take (if any) and what follows a requeue. `SqlOutbox` builds on
//! that: the fenced writes (renewals and settlements, through the
//! `FencedWriter`), `get_message`, `stats`, `pending_count`, requeues with
//! their refusal, `purge`, and reading rows back; `enqueue.rs` the enqueue
//! of one message or a batch. The `sql_store!` macro
//! then writes the public trait impls, the builder's `settlement` setter and
//! the typed `enqueue_*_in` methods for each store, forwarding to the shared
//! half or to the few operations each store does its own way (enqueue, claim,
//! listing, wake-ups).
//!
//! # Layout
//!
//! Each file imports only files listed before it; this module only
//! declares them and re-exports what the stores use, so their paths
//! (`crate::store::sql::X`) do not depend on the split.
//!
//! - `table.rs`: [`TableName`], validated.
//! - `migrate.rs`: the embedded migrations rendered for any table (how a
//!   custom table name reaches SQL, and nothing else does).
//! - `statements.rs`: SQL text both stores render alike (claim parts,
//!   counts, the shared statements' slots).
//! - `backend.rs`: the `SqlBackend` trait a store's core implements, the
//!   parts every core holds, stored times.
//! - `row.rs`: message rows, their columns and decoding into messages.
//! - `enqueue.rs`: enqueue of one message or a batch, with ids and
//!   idempotency keys honoured per message, over the `Inserts` trait a
//!   store's core implements (its insert statement, its key lookups).
//! - `errors.rs`: database errors, claim losses and admin refusals.
//! - `store.rs`: `SqlOutbox`, the shared half itself.
//! - `schedules.rs`: the periodic schedules' table: its statements and its
//!   rows read back (each store runs them around its own enqueue).
//! - `facade.rs`: the `sql_store!` macro, the public impls of each store.
//!
//! The switch for fenced writes, [`SettlementMode`], lives with the writer in
//! `store/fenced.rs` and is re-exported here.

mod backend;
mod enqueue;
mod errors;
mod facade;
mod migrate;
mod row;
mod schedules;
mod statements;
mod store;
mod table;

#[cfg(feature = "postgres")]
pub(crate) use backend::PgTime;
#[cfg(feature = "sqlite")]
pub(crate) use backend::StoredTime;
pub(crate) use backend::{SqlBackend, SqlParts};
pub(crate) use enqueue::{InsertRow, Inserts, KeyHolder, enqueue_batch, enqueue_one};
pub(crate) use errors::{db, lost_claim};
pub(crate) use facade::sql_store;
pub(crate) use migrate::{Dialect, migrator_for};
#[cfg(feature = "postgres")]
pub(crate) use row::ColumnPositions;
#[cfg(any(feature = "postgres", test))]
pub(crate) use row::MESSAGE_COLUMNS;
pub(crate) use row::{activity_rows, claimed_view};
pub(crate) use schedules::{ScheduleStatements, state_from, states_from};
pub(crate) use statements::{
    CancelStatements, INSERT_COLUMNS, SharedStatements, blocked_count, blocked_keys, oldest_due,
    pending_count, queues,
};
#[cfg(feature = "sqlite")]
pub(crate) use statements::{head_test, keyed_heads, levels_cte};
pub(crate) use store::SqlOutbox;
pub use table::{MAX_TABLE_NAME_PART, TableName};

pub use super::fenced::SettlementMode;
