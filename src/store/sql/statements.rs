//! SQL text both stores render the same way for their table: the slots of
//! the statements the shared half runs, the parts of a claim (the ordering
//! keys' head test, the skip scan of a queue's priorities, the walk of
//! keyed rows, the lookup of each key's first row), the counts that read
//! only unsettled rows, and the operator's statements on queues and
//! cancellations.

use std::sync::Arc;

/// The columns an enqueue writes, in the order both stores' inserts list
/// their values: those of [`InsertRow`](super::InsertRow), with the status
/// (`pending`), the attempts (0) and `updated_at` (the enqueue's `now`)
/// where they fall.
pub(crate) const INSERT_COLUMNS: &str = "id, kind, name, payload, trace, status, attempts, \
    max_attempts, available_at, created_at, updated_at, ordering_key, idempotency_key, \
    idempotency_until, max_attempts_set, queue, priority";

/// The statements every SQL store runs the same way, rendered for its table
/// in its dialect.
#[derive(Debug)]
pub(crate) struct SharedStatements {
    /// The table, quoted.
    pub(crate) table: Arc<str>,
    /// One message by id. Binds: id.
    pub(crate) get: Arc<str>,
    /// Counts per status, live claims, oldest due. Binds: now.
    pub(crate) stats: Arc<str>,
    /// Requeue one dead letter. Binds: id, now.
    pub(crate) requeue_one: Arc<str>,
    /// Requeue every dead letter (of a name). Binds: now, name or NULL.
    pub(crate) requeue_all: Arc<str>,
    /// Status and lease of one message, to name a refused requeue. Binds: id.
    pub(crate) requeue_state: Arc<str>,
    /// Delete a batch of terminal messages of one status, oldest first.
    /// Binds: status, horizon, limit.
    pub(crate) purge_batch: Arc<str>,
    /// Count the terminal messages a purge would delete. Binds: status or
    /// NULL, horizon.
    pub(crate) count_purgeable: Arc<str>,
    /// Mark one dead letter skipped. Binds: id, now.
    pub(crate) skip: Arc<str>,
    /// Blocked ordering keys with their heads. Binds: limit.
    pub(crate) blocked: Arc<str>,
    /// The rows holding idempotency keys: key, id and window's end. Binds:
    /// the keys, as the store binds a list.
    pub(crate) idempotency_holders: Arc<str>,
    /// Free an idempotency key whose window ended. Binds: key, now.
    pub(crate) idempotency_release: Arc<str>,
    /// Make the space of deleted rows reusable, where the database does not
    /// do so by itself as rows go. Binds nothing.
    pub(crate) vacuum: Option<Arc<str>>,
    /// Before the vacuum, where the store keeps a row per ordering key: one
    /// batch of rows of keys with nothing pending or claimed deleted,
    /// skipping rows a writer holds. Binds: the batch's size.
    pub(crate) prune_keys: Option<Arc<str>>,
    /// Pause a queue unless it is paused; changes a row when it paused it.
    /// Binds: queue, now.
    pub(crate) pause: Arc<str>,
    /// Resume a queue; changes a row when it was paused. Binds: queue.
    pub(crate) resume: Arc<str>,
    /// Every queue with pending or claimed messages, and every paused one:
    /// name, pending, claimed, paused at. Binds nothing.
    pub(crate) queues: Arc<str>,
    /// The statements of a cancel; see [`CancelStatements`].
    pub(crate) cancel: CancelStatements,
}

/// The statements of a cancel, by id or by filters, dry or not.
///
/// A cancel changes a pending message, or a claimed one whose lease ran
/// out, to `cancelled` (claim cleared, `updated_at` now); on a live claim
/// it sets only `cancel_requested_at` (once), leaving the fence columns to
/// its worker. Each returns the status of every row it changed
/// (`cancelled`, or `claimed` for a request); the dry ones count the two
/// kinds instead, changing nothing.
#[derive(Debug)]
pub(crate) struct CancelStatements {
    /// Binds: id, now.
    pub(crate) one: Arc<str>,
    /// Binds: name, ordering key, queue (each or NULL), now.
    pub(crate) matching: Arc<str>,
    /// [`CancelStatements::one`], counted. Binds: id, now.
    pub(crate) count_one: Arc<str>,
    /// [`CancelStatements::matching`], counted. Binds as it.
    pub(crate) count_matching: Arc<str>,
}

impl CancelStatements {
    /// The statements over table `t`: by id with `[id, now]` the SQL of
    /// their binds, by filters with `[name, key, queue, now]`.
    pub(crate) fn new(t: &str, [id, id_now]: [&str; 2], filters: [&str; 4]) -> Self {
        let [name, key, queue, filter_now] = filters;
        let by_id = (format!("id = {id}"), id_now);
        let by_filter = (
            format!(
                "({name} IS NULL OR name = {name}) AND ({key} IS NULL OR ordering_key = {key}) \
                 AND ({queue} IS NULL OR queue = {queue})"
            ),
            filter_now,
        );
        let live = |now: &str| format!("(status = 'claimed' AND locked_until > {now})");
        let change = |(target, now): &(String, &str)| -> Arc<str> {
            let live = live(now);
            format!(
                "UPDATE {t} SET \
                   status = CASE WHEN {live} THEN status ELSE 'cancelled' END, \
                   cancel_requested_at = CASE WHEN {live} \
                     THEN coalesce(cancel_requested_at, {now}) ELSE cancel_requested_at END, \
                   claim_token = CASE WHEN {live} THEN claim_token END, \
                   claimed_at = CASE WHEN {live} THEN claimed_at END, \
                   locked_until = CASE WHEN {live} THEN locked_until END, \
                   updated_at = CASE WHEN {live} THEN updated_at ELSE {now} END \
                 WHERE status IN ('pending', 'claimed') AND {target} \
                 RETURNING status"
            )
            .into()
        };
        let count = |(target, now): &(String, &str)| -> Arc<str> {
            let live = live(now);
            format!(
                "SELECT coalesce(sum(CASE WHEN {live} THEN 0 ELSE 1 END), 0), \
                   coalesce(sum(CASE WHEN {live} THEN 1 ELSE 0 END), 0) \
                 FROM {t} WHERE status IN ('pending', 'claimed') AND {target}"
            )
            .into()
        };
        CancelStatements {
            one: change(&by_id),
            matching: change(&by_filter),
            count_one: count(&by_id),
            count_matching: count(&by_filter),
        }
    }
}

/// The statement listing the queues of table `t` with paused queues in
/// `paused`: per queue, its pending and claimed messages and when it was
/// paused, by name. `no_time` is a NULL of the time column's type. Counts
/// read only the partial indexes of unsettled rows.
pub(crate) fn queues(t: &str, paused: &str, no_time: &str) -> Arc<str> {
    format!(
        "SELECT queue, CAST(sum(pending) AS BIGINT), CAST(sum(claimed) AS BIGINT), \
           max(paused_at) FROM ( \
           SELECT queue, count(*) AS pending, 0 AS claimed, {no_time} AS paused_at FROM {t} \
           WHERE status = 'pending' AND ordering_key IS NULL GROUP BY queue \
           UNION ALL \
           SELECT queue, count(*), 0, {no_time} FROM {t} \
           WHERE status = 'pending' AND ordering_key IS NOT NULL GROUP BY queue \
           UNION ALL \
           SELECT queue, 0, count(*), {no_time} FROM {t} WHERE status = 'claimed' GROUP BY queue \
           UNION ALL \
           SELECT queue, 0, 0, paused_at FROM {paused}) AS q \
         GROUP BY queue ORDER BY queue"
    )
    .into()
}

/// The claim's test that the row `m` is the head of its ordering key within
/// its queue (or has no key): no earlier message of the key in that queue
/// is pending or claimed, or a dead letter not skipped while `block` (a
/// bound boolean) holds; and no later
/// one is claimed under a lease still running at `now` (an earlier one can
/// appear after a later one was claimed: a requeued dead letter, or on
/// PostgreSQL a transaction that committed after a later one). A later
/// claim whose lease ran out does not hold the key: that message waits,
/// claimable, behind the earlier one, and holding the key for it would stop
/// both for good. Both probes are answered from the partial indexes of
/// unsettled and claimed keyed rows.
///
/// With `key_order` the first probe is a scalar subquery in key order
/// rather than `NOT EXISTS`: where a few keys hold many rows, PostgreSQL
/// planned `NOT EXISTS` as a sequential scan, which reads the whole table
/// for a head (nothing earlier to find); in key order it reads the index
/// from the key's first row. SQLite takes the other form: given the order
/// by `seq`, it walks the rowid from the table's start instead.
#[cfg(feature = "sqlite")]
pub(crate) fn head_test(t: &str, block: &str, now: &str, key_order: bool) -> String {
    let earlier = format!(
        "FROM {t} AS e \
         WHERE e.queue = m.queue AND e.ordering_key = m.ordering_key \
           AND e.ordering_key IS NOT NULL \
           AND e.status <> 'delivered' AND e.status <> 'cancelled' AND e.seq < m.seq \
           AND (e.status <> 'dead_lettered' OR ({block} AND e.skipped_at IS NULL))"
    );
    let no_earlier = if key_order {
        format!("(SELECT e.seq {earlier} ORDER BY e.seq LIMIT 1) IS NULL")
    } else {
        format!("NOT EXISTS (SELECT 1 {earlier})")
    };
    format!(
        "(m.ordering_key IS NULL OR ( \
           {no_earlier} \
           AND NOT EXISTS (SELECT 1 FROM {t} AS e \
             WHERE e.queue = m.queue AND e.ordering_key = m.ordering_key \
               AND e.ordering_key IS NOT NULL \
               AND e.status = 'claimed' AND e.seq > m.seq AND e.locked_until > {now})))"
    )
}

/// A recursive common table expression `name (queue, priority, found)`:
/// for each queue of `served` (a common table expression with `queue` and
/// `lim` columns), the priorities in use by its pending rows, keyless, or
/// keyed when `head` is the head test of a row `m`, highest first, one probe of their partial index
/// each (a skip scan), ending with a NULL priority. The claim reads each
/// level's due rows at `now` as a prefix of the index, so scheduled rows of
/// any priority are never walked.
///
/// `found` counts the due rows of the levels above (each counted up to
/// `bound`); the scan stops once they reach `need` (an expression of `s`,
/// the served queue), so a claim reads the levels that can fill it and one
/// more, not every level in use. A level is counted only when a lower one
/// exists: a queue of one priority costs two probes and no count.
///
/// Keyed levels are those of the keys' flagged heads (see [`keyed_heads`]),
/// and their due rows are counted only when they pass the head test: a
/// level whose heads are all held (by a dead letter, say) must not stop
/// the scan before the levels below it.
#[cfg(feature = "sqlite")]
pub(crate) fn levels_cte(
    name: &str,
    t: &str,
    head: Option<&str>,
    now: &str,
    bound: &str,
    need: &str,
) -> String {
    let (pending, tested) = match head {
        Some(head) => (
            "u.status = 'pending' AND u.head = 1",
            format!(
                "SELECT 1 FROM {t} AS m WHERE m.status = 'pending' AND m.head = 1 \
                 AND m.queue = l.queue AND m.priority = l.priority AND m.available_at <= {now} \
                 AND {head}"
            ),
        ),
        None => (
            "u.status = 'pending' AND u.ordering_key IS NULL",
            format!(
                "SELECT 1 FROM {t} AS u WHERE u.status = 'pending' AND u.ordering_key IS NULL \
                 AND u.queue = l.queue AND u.priority = l.priority AND u.available_at <= {now}"
            ),
        ),
    };
    // `ORDER BY ... LIMIT 1` rather than `max()`: the index's order
    // answers it with one probe, which the aggregate is not sure to.
    let top = format!(
        "(SELECT u.priority FROM {t} AS u WHERE {pending} AND u.queue = s.queue \
           ORDER BY u.priority DESC LIMIT 1)"
    );
    let next = format!(
        "(SELECT u.priority FROM {t} AS u WHERE {pending} AND u.queue = l.queue \
           AND u.priority < l.priority ORDER BY u.priority DESC LIMIT 1)"
    );
    let due = format!("(SELECT count(*) FROM ({tested} LIMIT {bound}) AS d)");
    format!(
        "{name} (queue, priority, found) AS ( \
           SELECT s.queue, {top}, CAST(0 AS BIGINT) FROM served AS s \
           UNION ALL \
           SELECT l.queue, {next}, l.found + {due} \
           FROM {name} AS l JOIN served AS s ON s.queue = l.queue \
           WHERE l.priority IS NOT NULL AND l.found < {need} AND {next} IS NOT NULL)"
    )
}

/// The keyed arm of a claim, as common table expressions (the statement
/// needs `WITH RECURSIVE`, and a `served (queue, lim)` expression of the
/// queues it serves) of which the last, `keyed`, holds the pending keyed
/// rows of those queues that are due at `now` and pass the `head` test,
/// locking nothing (each queue's own limit is applied to them with the
/// other arms).
///
/// A key has at most one such row in its queue, its first pending or
/// claimed message by `seq`, however many are queued behind it; the
/// table flags that row (`head`, kept by triggers: see
/// `migrations/sqlite/0012_key_heads.sql`), and a partial index holds the
/// pending flagged rows in claim order. The arm reads each queue's
/// priorities of those ([`levels_cte`]) and of each the first `walk` due
/// flagged rows that pass the head test. So a claim reads about the heads
/// it takes, whatever the number of keys and however long any key's
/// backlog; beyond those, only heads that fail the test (a key held by a
/// dead letter, or with a later message claimed) are read and passed over.
#[cfg(feature = "sqlite")]
pub(crate) fn keyed_heads(t: &str, head: &str, now: &str, walk: &str) -> String {
    let levels = levels_cte("keyed_levels", t, Some(head), now, walk, walk);
    format!(
        "{levels}, \
         keyed AS MATERIALIZED ( \
           SELECT k.id, k.queue, k.priority, k.available_at, k.created_at, k.seq \
           FROM keyed_levels AS l CROSS JOIN {t} AS k \
           WHERE l.priority IS NOT NULL AND k.seq IN ( \
             SELECT m.seq FROM {t} AS m \
             WHERE m.status = 'pending' AND m.head = 1 AND m.queue = l.queue \
               AND m.priority = l.priority AND m.available_at <= {now} AND {head} \
             ORDER BY m.available_at, m.created_at, m.seq LIMIT {walk}))"
    )
}

/// The count of pending rows, from the two partial indexes of pending rows
/// (keyless and keyed), never touching settled ones.
pub(crate) fn pending_count(t: &str) -> String {
    format!(
        "(SELECT count(*) FROM {t} WHERE status = 'pending' AND ordering_key IS NULL) + \
         (SELECT count(*) FROM {t} WHERE status = 'pending' AND ordering_key IS NOT NULL)"
    )
}

/// The earliest `available_at` of a pending row due at `now`, from the two
/// partial indexes of pending rows; NULL when none is due.
pub(crate) fn oldest_due(t: &str, now: &str) -> String {
    format!(
        "(SELECT min(due) FROM ( \
           SELECT min(available_at) AS due FROM {t} \
           WHERE status = 'pending' AND ordering_key IS NULL AND available_at <= {now} \
           UNION ALL \
           SELECT min(available_at) FROM {t} \
           WHERE status = 'pending' AND ordering_key IS NOT NULL AND available_at <= {now}) \
           AS arms)"
    )
}

/// Blocked ordering keys: each key's earliest dead letter not skipped (in
/// its queue), with the count of unsettled messages after it, by key and
/// queue, up to `limit`. Columns: queue, key, id, name, waiting.
pub(crate) fn blocked_keys(t: &str, limit: &str) -> Arc<str> {
    format!(
        "SELECT d.queue, d.ordering_key, d.id, d.name, \
           (SELECT count(*) FROM {t} AS w WHERE w.queue = d.queue \
             AND w.ordering_key = d.ordering_key \
             AND w.ordering_key IS NOT NULL AND w.status <> 'delivered' \
             AND w.status <> 'cancelled' \
             AND w.status IN ('pending', 'claimed') AND w.seq > d.seq) AS waiting \
         FROM {t} AS d \
         WHERE d.ordering_key IS NOT NULL AND d.status = 'dead_lettered' AND d.skipped_at IS NULL \
           AND NOT EXISTS (SELECT 1 FROM {t} AS e WHERE e.queue = d.queue \
             AND e.ordering_key = d.ordering_key \
             AND e.ordering_key IS NOT NULL AND e.status <> 'delivered' \
             AND e.status <> 'cancelled' \
             AND e.status = 'dead_lettered' AND e.skipped_at IS NULL AND e.seq < d.seq) \
         ORDER BY d.ordering_key, d.queue LIMIT {limit}"
    )
    .into()
}

/// The count of ordering keys (in their queues) held by a dead letter not
/// skipped.
pub(crate) fn blocked_count(t: &str) -> String {
    format!(
        "(SELECT count(*) FROM (SELECT DISTINCT queue, ordering_key FROM {t} \
           WHERE ordering_key IS NOT NULL AND status = 'dead_lettered' AND skipped_at IS NULL) \
           AS blocked)"
    )
}
