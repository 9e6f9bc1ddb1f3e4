//! Which drains a commit on a connection wakes: the registry of every
//! store's drains by database file and table, and what a connection's
//! hooks (set in `enqueue.rs`) note of its open transaction. Imports
//! nothing of the store.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError};

use crate::store::kit::{WakeupSender, WeakWakeupSender};
use crate::store::sql::TableName;

/// The drains to wake for inserts into each outbox table, by
/// [`wake_key`]. Every store registers itself when it is built; an entry
/// lives as long as the process, its senders as long as their stores.
static WAKES: LazyLock<Mutex<HashMap<String, Vec<WeakWakeupSender>>>> =
    LazyLock::new(Default::default);

fn wakes() -> MutexGuard<'static, HashMap<String, Vec<WeakWakeupSender>>> {
    WAKES.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A table as SQLite's update hook names it (`main` when unqualified),
/// within the database file at `database`.
fn wake_key(database: &str, schema: &str, table: &str) -> String {
    format!("{database}\0{schema}\0{table}")
}

/// Wake `wake`'s drains when a connection with the hooks commits an
/// insert into `table` of the database at `database`.
pub(super) fn register(database: &str, table: &TableName, wake: &WakeupSender) {
    let key = wake_key(database, table.schema().unwrap_or("main"), table.table());
    let mut wakes = wakes();
    let senders = wakes.entry(key).or_default();
    senders.retain(|sender| !sender.is_gone());
    senders.push(wake.downgrade());
}

/// What a connection's hooks know: each table it has inserted into, with
/// whether its open transaction has. The list keeps its tables from one
/// transaction to the next, so an insert allocates nothing once its
/// table is known.
pub(super) struct Inserted {
    database: Arc<str>,
    tables: Vec<InsertedInto>,
}

struct InsertedInto {
    schema: String,
    table: String,
    /// Its key in [`WAKES`].
    key: String,
    now: bool,
}

impl Inserted {
    /// Nothing inserted yet, on a connection to the database at `database`.
    pub(super) fn new(database: Arc<str>) -> Self {
        Inserted {
            database,
            tables: Vec::new(),
        }
    }

    /// A row inserted into `schema.table`.
    pub(super) fn insert(&mut self, schema: &str, table: &str) {
        match self
            .tables
            .iter_mut()
            .find(|t| t.table == table && t.schema == schema)
        {
            Some(known) => known.now = true,
            None => self.tables.push(InsertedInto {
                schema: schema.to_owned(),
                table: table.to_owned(),
                key: wake_key(&self.database, schema, table),
                now: true,
            }),
        }
    }

    /// A rollback: nothing it inserted is left to wake for.
    pub(super) fn forget(&mut self) {
        for table in &mut self.tables {
            table.now = false;
        }
    }

    /// The senders of the outboxes inserted into since the last commit or
    /// rollback, which this one ends.
    pub(super) fn end(&mut self) -> Vec<WakeupSender> {
        let mut senders = Vec::new();
        let mut inserted = self.tables.iter_mut().filter(|t| t.now).peekable();
        if inserted.peek().is_none() {
            return senders;
        }
        let wakes = wakes();
        for table in inserted {
            table.now = false;
            if let Some(registered) = wakes.get(&table.key) {
                senders.extend(registered.iter().filter_map(WeakWakeupSender::upgrade));
            }
        }
        senders
    }
}
