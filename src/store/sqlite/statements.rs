//! The SQLite store's SQL text, rendered once per table.

use std::sync::Arc;

use crate::store::fenced::FencedOp;
use crate::store::sql::{
    CancelStatements, INSERT_COLUMNS, SharedStatements, TableName, blocked_count, keyed_heads,
    levels_cte, oldest_due, pending_count, queues,
};

/// Every column, in the order rows are read.
pub(super) const COLUMNS: &str = "seq, id, kind, name, payload, trace, status, attempts, max_attempts, \
    available_at, claim_token, claimed_at, locked_until, last_error, created_at, updated_at, \
    delivered_at, ordering_key, skipped_at, max_attempts_set, queue, priority, cancel_requested_at";

/// The columns [`Statements::pick`] writes out for each row, in this
/// order: those a claim leaves as they are (`attempts` goes up by one),
/// and the four the full decode checks though a delivery does not need
/// them (a row with a cancellation request is cancelled, not claimed).
pub(super) const PICKED: [&str; 17] = [
    "id",
    "kind",
    "name",
    "payload",
    "trace",
    "attempts",
    "max_attempts",
    "max_attempts_set",
    "available_at",
    "created_at",
    "ordering_key",
    "last_error",
    "delivered_at",
    "skipped_at",
    "queue",
    "priority",
    "cancel_requested_at",
];

/// The claim's limits, `?3` and `?6`, as expressions rather than
/// bare parameters: SQLite plans a `LIMIT ?N` for the value bound, and so
/// marks the statement to be compiled again whenever `?N` is bound again,
/// which is every claim; the claim, the largest statement of the store, was
/// parsed and planned anew each time. The cast keeps the value and one
/// plan for any limit. Every other `LIMIT` of the store (purge batches,
/// listing pages) is written the same way.
const LIMIT: &str = "CAST(?3 AS INTEGER)";
/// The most rows read from one priority of one queue: the largest of the
/// queues' limits. A limit in SQLite cannot name a column of the query
/// around it, so each queue's own limit is applied after the reads.
const LEVEL: &str = "CAST(?6 AS INTEGER)";

/// The rendered statements for one table.
#[derive(Debug)]
pub(super) struct Statements {
    /// Insert one message unless its id or idempotency key is taken (then
    /// nothing changes): [`Statements::insert`] of one row, kept rendered.
    insert_one: Arc<str>,
    /// [`Statements::insert`] of one row, returning a row only when it
    /// stored one: `1` when the connection has the hooks that wake drains
    /// (its collation [`HOOKED`] is there), else `0`. One row comes back
    /// at most, so the worker thread's row-by-row hand-over costs nothing.
    pub(super) insert_one_in: Arc<str>,
    /// One row: `1` when the connection has the hooks, else `0`.
    pub(super) hooked: Arc<str>,
    /// `INSERT INTO <table> (<columns>) VALUES `, what every insert starts
    /// with.
    insert_into: String,
    /// The rows inserted by one insert, whose `seq` is above `?1` and at
    /// most `?2`, as one JSON array of ids.
    pub(super) inserted: Arc<str>,
    /// Claim in one statement, returning every column of each row it
    /// changed. Binds: `?1` now and `?2` lease end (µs since the epoch),
    /// `?3` limit, `?4` 1 when a dead letter holds its ordering key, else 0,
    /// `?5` the queues served as a JSON array of `[queue, limit, attempt
    /// cap]`, `?6` the largest of the queues' limits.
    /// The store claims with [`Statements::pick`] and
    /// [`Statements::take`] instead, and with this only when the rows it
    /// picked cannot be written out as JSON.
    pub(super) claim: Arc<str>,
    /// The rows a claim takes, as [`Statements::claim`] would pick them
    /// (the same binds), changing nothing: one JSON text, an array with a
    /// `[seq, columns]` pair per row. `columns` is the array
    /// [`PICKED`] lists, or `null` when a column holds a blob (which JSON
    /// cannot hold).
    ///
    /// Why a claim is two statements: SQLite's worker thread hands each
    /// row of a result over on its own, waking the caller per row, which
    /// cost a claim more than its writes; this hands a whole claim over at
    /// once.
    pub(super) pick: Arc<str>,
    /// Claim the rows picked, as [`Statements::claim`] changes them.
    /// Binds: `?1` now and `?2` lease end, `?3` a JSON array of `[seq,
    /// claim token, attempt cap of the row's queue]`.
    pub(super) take: Arc<str>,
    /// Every column of the rows whose `seq` is in the JSON array `?1`.
    pub(super) by_seq: Arc<str>,
    /// Record why a claimed row was dead-lettered. Binds: error, seq.
    pub(super) abandoned: Arc<str>,
    /// Dead-letter an unreadable row. Binds: error, now, seq.
    pub(super) quarantine: Arc<str>,
    /// The fenced writes, one statement per kind.
    pub(super) fenced: FencedWrites,
    /// The fence columns of a JSON array of ids.
    pub(super) fences: Arc<str>,
}

/// The collation that marks a connection whose hooks wake drains at its
/// commit (see `enqueue.rs`). A statement can ask a connection for its
/// collations, so an insert can tell at no round trip of its own; and a
/// collation, unlike a temporary table, outlives a rolled-back
/// transaction.
pub(super) const HOOKED: &str = "outbox_wakes";

/// Whether the connection running it has the collation [`HOOKED`].
fn is_hooked() -> String {
    format!("EXISTS (SELECT 1 FROM pragma_collation_list WHERE name = '{HOOKED}')")
}

/// `prefix` (see [`Statements::insert_into`]) and `rows` rows of values,
/// each binding 15 values in order: those of
/// [`InsertRow`](crate::store::sql::InsertRow), with its `now` twice
/// (`created_at`, then `updated_at`) after `available_at`; each row is
/// inserted unless its id or idempotency key is taken.
///
/// Anonymous `?` placeholders, not numbered ones: sqlx binds a statement's
/// values by asking SQLite for each parameter's name, which walks the list
/// of names, so a thousand rows of numbered parameters spent nine tenths of
/// their insert binding them.
///
/// A taken id or key skips its row (`ON CONFLICT DO NOTHING`) and raises
/// nothing. No `RETURNING`: SQLite's worker thread hands each returned row
/// over on its own (see [`Statements::pick`]); the rows one statement
/// inserts get consecutive `seq`s instead (the next rowid is the largest
/// plus one, and the statement holds the write lock throughout), so
/// [`Statements::inserted`] finds them when some were skipped.
fn insert(prefix: &str, rows: usize) -> String {
    const ROW: &str = "(?, ?, ?, ?, ?, 'pending', 0, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
    let mut sql = String::with_capacity(prefix.len() + rows * (ROW.len() + 2) + 32);
    sql.push_str(prefix);
    for row in 0..rows {
        if row > 0 {
            sql.push_str(", ");
        }
        sql.push_str(ROW);
    }
    sql.push_str(" ON CONFLICT DO NOTHING");
    sql
}

impl Statements {
    /// The insert of `rows` messages; see [`insert`].
    pub(super) fn insert(&self, rows: usize) -> Arc<str> {
        match rows {
            1 => self.insert_one.clone(),
            rows => insert(&self.insert_into, rows).into(),
        }
    }

    /// The store's own statements, and those it runs the shared way.
    pub(super) fn new(table: &TableName) -> (Self, SharedStatements) {
        let t = table.quoted();
        let paused = table.derived("paused", true);
        let head = head(&t, "?4");
        let keyed = keyed_heads(&t, &head, "?1", LEVEL);
        let keyless_levels = levels_cte("keyless_levels", &t, None, "?1", LEVEL, "s.lim");
        // The queues served that are not paused; each queue's pending
        // keyless rows, one priority at a time, each a prefix of the
        // index; the expired claims of those queues; the keyed heads of
        // `keyed_heads`. Each queue's rows are cut to its limit in claim
        // order (higher priority first), then all to the claim's limit.
        // Each arm is materialized: pushed into the arms, the join of the
        // ranking with the queues served made some versions of SQLite
        // index the whole table by queue for every claim. The head test
        // reads the state before the claim, so a claim
        // takes at most one message per ordering key.
        let ctes = format!(
            "WITH RECURSIVE \
             served (queue, lim, cap) AS MATERIALIZED ( \
               SELECT value ->> 0, value ->> 1, value ->> 2 FROM json_each(?5) \
               WHERE NOT EXISTS (SELECT 1 FROM {paused} AS z WHERE z.queue = value ->> 0)), \
             {keyless_levels}, \
             keyless AS MATERIALIZED ( \
               SELECT m.seq, m.queue, m.priority, m.available_at, m.created_at \
               FROM keyless_levels AS l CROSS JOIN {t} AS m \
               WHERE l.priority IS NOT NULL AND m.seq IN ( \
                 SELECT u.seq FROM {t} AS u \
                 WHERE u.status = 'pending' AND u.ordering_key IS NULL AND u.queue = l.queue \
                   AND u.priority = l.priority AND u.available_at <= ?1 \
                 ORDER BY u.available_at, u.created_at, u.seq LIMIT {LEVEL})), \
             expired AS MATERIALIZED ( \
               SELECT m.seq, m.queue, m.priority, m.available_at, m.created_at \
               FROM {t} AS m CROSS JOIN served AS s \
               WHERE m.status = 'claimed' AND m.locked_until <= ?1 AND s.queue = m.queue \
                 AND {head} \
               ORDER BY m.priority DESC, m.available_at, m.created_at, m.seq LIMIT {LIMIT}), \
             {keyed}, \
             ranked AS ( \
               SELECT c.seq, c.priority, c.available_at, c.created_at, s.lim, \
                 row_number() OVER (PARTITION BY c.queue \
                   ORDER BY c.priority DESC, c.available_at, c.created_at, c.seq) AS n \
               FROM ( \
                 SELECT seq, queue, priority, available_at, created_at FROM keyless \
                 UNION ALL SELECT seq, queue, priority, available_at, created_at FROM expired \
                 UNION ALL SELECT seq, queue, priority, available_at, created_at FROM keyed) AS c \
               JOIN served AS s ON s.queue = c.queue)"
        );
        let picked = format!(
            "SELECT seq FROM ranked WHERE n <= lim \
             ORDER BY priority DESC, available_at, created_at, seq LIMIT {LIMIT}"
        );
        // What a claim sets, with `cap` the attempt cap of rows without
        // their own and `token` the new claim token: a row out of attempts
        // is dead-lettered instead, and an expired claim whose
        // cancellation was requested is cancelled.
        let claim_set = |cap: &str, token: &str| {
            let out = format!(
                "attempts >= (CASE WHEN max_attempts_set THEN max_attempts ELSE {cap} END)"
            );
            let ended = format!("(cancel_requested_at IS NOT NULL OR {out})");
            format!(
                "status = CASE WHEN cancel_requested_at IS NOT NULL THEN 'cancelled' \
                   WHEN {out} THEN 'dead_lettered' ELSE 'claimed' END, \
                 attempts = CASE WHEN {ended} THEN attempts ELSE attempts + 1 END, \
                 claim_token = CASE WHEN {ended} THEN NULL ELSE {token} END, \
                 claimed_at = CASE WHEN {ended} THEN NULL ELSE ?1 END, \
                 locked_until = CASE WHEN {ended} THEN NULL ELSE ?2 END, \
                 updated_at = ?1"
            )
        };
        let no_blob = PICKED
            .iter()
            .map(|c| format!("typeof({c})"))
            .collect::<Vec<_>>()
            .join(", ");
        let picked_columns = PICKED.join(", ");
        let insert_into = format!("INSERT INTO {t} ({INSERT_COLUMNS}) VALUES ");
        let own = Statements {
            insert_one: insert(&insert_into, 1).into(),
            insert_one_in: format!("{} RETURNING {}", insert(&insert_into, 1), is_hooked()).into(),
            hooked: format!("SELECT {}", is_hooked()).into(),
            // One row handed over, however many ids: the worker thread
            // hands rows over one by one.
            inserted: format!("SELECT json_group_array(id) FROM {t} WHERE seq > ?1 AND seq <= ?2")
                .into(),
            insert_into,
            claim: format!(
                "{ctes} \
                 UPDATE {t} AS m SET {set} WHERE m.seq IN ({picked}) RETURNING {COLUMNS}",
                set = claim_set(
                    "(SELECT s.cap FROM served AS s WHERE s.queue = m.queue)",
                    "lower(hex(randomblob(16)))"
                ),
            )
            .into(),
            pick: format!(
                "{ctes} \
                 SELECT json_group_array(json_array(seq, \
                   CASE WHEN 'blob' NOT IN ({no_blob}) THEN json_array({picked_columns}) END)) \
                 FROM {t} WHERE seq IN ({picked})"
            )
            .into(),
            // Each row found by its `seq`, the table's rowid.
            take: format!(
                "UPDATE {t} AS m SET {set} \
                 FROM (SELECT value ->> 0 AS seq, value ->> 1 AS token, value ->> 2 AS cap \
                   FROM json_each(?3)) AS v \
                 WHERE m.seq = v.seq",
                set = claim_set("v.cap", "v.token"),
            )
            .into(),
            by_seq: format!(
                "SELECT {COLUMNS} FROM {t} WHERE seq IN (SELECT value FROM json_each(?1))"
            )
            .into(),
            abandoned: format!("UPDATE {t} SET last_error = ?1 WHERE seq = ?2").into(),
            quarantine: format!(
                "UPDATE {t} SET status = 'dead_lettered', claim_token = NULL, claimed_at = NULL, \
                 locked_until = NULL, last_error = ?1, updated_at = ?2 WHERE seq = ?3"
            )
            .into(),
            fenced: FencedWrites::new(&t),
            fences: format!(
                "SELECT id, status, claim_token, locked_until FROM {t} \
                 WHERE id IN (SELECT value FROM json_each(?1))"
            )
            .into(),
        };
        let pending = pending_count(&t);
        let oldest_due = oldest_due(&t, "?1");
        let blocked = blocked_count(&t);
        let shared = SharedStatements {
            get: format!("SELECT {COLUMNS} FROM {t} WHERE id = ?1").into(),
            stats: format!(
                "SELECT \
                   {pending}, \
                   (SELECT count(*) FROM {t} WHERE status = 'claimed'), \
                   (SELECT count(*) FROM {t} WHERE status = 'delivered'), \
                   (SELECT count(*) FROM {t} WHERE status = 'dead_lettered'), \
                   (SELECT count(*) FROM {t} WHERE status = 'claimed' AND locked_until > ?1), \
                   {oldest_due}, \
                   {blocked}, \
                   (SELECT count(*) FROM {t} WHERE status = 'cancelled')"
            )
            .into(),
            requeue_one: format!(
                "UPDATE {t} SET status = 'pending', attempts = 0, available_at = ?2, updated_at = ?2, \
                   skipped_at = NULL \
                 WHERE id = ?1 AND status = 'dead_lettered'"
            )
            .into(),
            requeue_all: format!(
                "UPDATE {t} SET status = 'pending', attempts = 0, available_at = ?1, updated_at = ?1, \
                   skipped_at = NULL \
                 WHERE status = 'dead_lettered' AND (?2 IS NULL OR name = ?2)"
            )
            .into(),
            requeue_state: format!("SELECT status, locked_until FROM {t} WHERE id = ?1").into(),
            // The literal status list is the index of settled rows' own
            // predicate, which SQLite needs to see to use that index.
            purge_batch: format!(
                "DELETE FROM {t} WHERE seq IN ( \
                   SELECT seq FROM {t} WHERE status IN ('delivered', 'dead_lettered', 'cancelled') \
                   AND status = ?1 AND updated_at < ?2 \
                   ORDER BY status, updated_at LIMIT CAST(?3 AS INTEGER))"
            )
            .into(),
            // The purge's predicate, without its batch limit.
            count_purgeable: format!(
                "SELECT count(*) FROM {t} WHERE status IN ('delivered', 'dead_lettered', 'cancelled') \
                 AND (?1 IS NULL OR status = ?1) AND updated_at < ?2"
            )
            .into(),
            skip: format!(
                "UPDATE {t} SET skipped_at = ?2, updated_at = ?2 \
                 WHERE id = ?1 AND status = 'dead_lettered'"
            )
            .into(),
            blocked: crate::store::sql::blocked_keys(&t, "?1"),
            idempotency_holders: format!(
                "SELECT idempotency_key, id, idempotency_until FROM {t} \
                 WHERE idempotency_key IN (SELECT value FROM json_each(?1))"
            )
            .into(),
            idempotency_release: format!(
                "UPDATE {t} SET idempotency_key = NULL \
                 WHERE idempotency_key = ?1 AND idempotency_until <= ?2"
            )
            .into(),
            // Freed pages go back to the file's free list as rows go.
            vacuum: None,
            prune_keys: None,
            pause: format!(
                "INSERT INTO {paused} (queue, paused_at) VALUES (?1, ?2) \
                 ON CONFLICT (queue) DO NOTHING"
            )
            .into(),
            resume: format!("DELETE FROM {paused} WHERE queue = ?1").into(),
            queues: queues(&t, &paused, "NULL"),
            cancel: CancelStatements::new(&t, ["?1", "?2"], ["?1", "?2", "?3", "?4"]),
            table: t.into(),
        };
        (own, shared)
    }
}

/// The claim's test that `m` is the head of its ordering key, or has none;
/// `block` is the parameter that says whether a dead letter holds its key.
fn head(t: &str, block: &str) -> String {
    crate::store::sql::head_test(t, block, "?1", false)
}

/// The fenced write statements, one per kind of write.
///
/// Each sets only the columns its write changes: SQLite maintains only the
/// indexes over the columns an `UPDATE` assigns, so one statement that
/// assigned every column (to serve every kind of write) cost about twice
/// as much per row. Every row is looked up by id and applied only while
/// its token still holds a live claim. The unary `+` keeps the planner off
/// the index of claimed rows, which statistics taken while few rows were
/// claimed make look free, and which would then be scanned once per row of
/// the batch.
///
/// Each comes twice: returning the id of every row it changed, and
/// returning nothing (the count of changed rows says whether every row
/// applied, without a row per message coming back from SQLite's worker).
#[derive(Debug)]
pub(super) struct FencedWrites {
    returning: [Arc<str>; 6],
    counted: [Arc<str>; 6],
}

impl FencedWrites {
    /// Every kind, by [`FencedOp::code`], in the order a batch applies them.
    pub(super) const KINDS: [&'static str; 6] =
        ["renew", "deliver", "delete", "retry", "dead", "release"];

    fn new(t: &str) -> Self {
        let rows = |fields: &[&str]| {
            let columns = fields
                .iter()
                .enumerate()
                .map(|(i, field)| format!("value ->> {i} AS {field}"))
                .collect::<Vec<_>>()
                .join(", ");
            format!("(SELECT {columns} FROM json_each(?1)) AS v")
        };
        const WHERE: &str = "m.id = v.id AND +m.status = 'claimed' AND m.claim_token = v.token \
                             AND +m.locked_until > v.now";
        // What a failure or a release leaves instead of `otherwise` when
        // the message's cancellation was requested while it was claimed.
        let unless_cancelled = |otherwise: &str| {
            format!(
                "status = CASE WHEN m.cancel_requested_at IS NULL THEN '{otherwise}' \
                 ELSE 'cancelled' END"
            )
        };
        let write = |fields: &[&str], set: &str| {
            let rows = rows(fields);
            format!("UPDATE {t} AS m SET {set} FROM {rows} WHERE {WHERE}")
        };
        const FENCE: [&str; 3] = ["id", "token", "now"];
        // SQLite's DELETE has no FROM: the fenced ids are found the way the
        // updates find theirs (by id), then deleted by rowid.
        let delete = format!(
            "DELETE FROM {t} WHERE id IN (SELECT m.id FROM {t} AS m, {rows} WHERE {WHERE})",
            rows = rows(&FENCE)
        );
        const CLEAR: &str = "claim_token = NULL, claimed_at = NULL, locked_until = NULL";
        // In the order of `KINDS`.
        let counted = [
            write(
                &[&FENCE[..], &["until"]].concat(),
                "locked_until = v.until, updated_at = v.now",
            ),
            write(
                &FENCE,
                &format!("status = 'delivered', {CLEAR}, delivered_at = v.now, updated_at = v.now"),
            ),
            delete,
            write(
                &[&FENCE[..], &["available", "error"]].concat(),
                &format!(
                    "{}, available_at = v.available, {CLEAR}, \
                     last_error = v.error, updated_at = v.now",
                    unless_cancelled("pending")
                ),
            ),
            write(
                &[&FENCE[..], &["error"]].concat(),
                &format!(
                    "{}, {CLEAR}, last_error = v.error, updated_at = v.now",
                    unless_cancelled("dead_lettered")
                ),
            ),
            write(
                &FENCE,
                &format!(
                    "{}, attempts = max(m.attempts - 1, 0), available_at = v.now, \
                     {CLEAR}, updated_at = v.now",
                    unless_cancelled("pending")
                ),
            ),
        ];
        FencedWrites {
            returning: counted
                .clone()
                .map(|sql| format!("{sql} RETURNING id, cancel_requested_at IS NOT NULL").into()),
            counted: counted.map(Arc::from),
        }
    }

    /// The statement for `op`, returning the id of each row it changed and
    /// whether it carries a cancellation request (for a failure or a
    /// release: whether it was cancelled).
    pub(super) fn get(&self, op: FencedOp) -> &Arc<str> {
        &self.returning[Self::index(op)]
    }

    /// The statement for `op`, returning nothing: only for writes whose
    /// answer does not depend on a cancellation request (deliveries).
    pub(super) fn counted(&self, op: FencedOp) -> &Arc<str> {
        &self.counted[Self::index(op)]
    }

    fn index(op: FencedOp) -> usize {
        let kind = Self::KINDS.iter().position(|&kind| kind == op.code());
        kind.expect("every kind of write has a statement")
    }

    /// Every statement returning ids, in the order of `KINDS`.
    #[cfg(test)]
    pub(super) fn all(&self) -> &[Arc<str>] {
        &self.returning
    }
}
