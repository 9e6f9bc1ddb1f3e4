//! SQL text both stores render the same way for their table: the slots of
//! the statements the shared half runs, and the parts of a claim (the
//! ordering keys' head test, the walk of keyed rows, the lookup of each
//! key's first row) and of the counts that read only unsettled rows.

use std::sync::Arc;

/// The columns an enqueue writes, in the order both stores' inserts list
/// their values: those of [`InsertRow`](super::InsertRow), with the status
/// (`pending`), the attempts (0) and `updated_at` (the enqueue's `now`)
/// where they fall.
pub(crate) const INSERT_COLUMNS: &str = "id, kind, name, payload, trace, status, attempts, \
    max_attempts, available_at, created_at, updated_at, ordering_key, idempotency_key, \
    idempotency_until, max_attempts_set";

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
}

/// The claim's test that the row `m` is the head of its ordering key (or has
/// no key): no earlier message of the key is pending or claimed, or a dead
/// letter not skipped while `block` (a bound boolean) holds; and no later
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
pub(crate) fn head_test(t: &str, block: &str, now: &str, key_order: bool) -> String {
    let earlier = format!(
        "FROM {t} AS e \
         WHERE e.ordering_key = m.ordering_key AND e.ordering_key IS NOT NULL \
           AND e.status <> 'delivered' AND e.seq < m.seq \
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
             WHERE e.ordering_key = m.ordering_key AND e.ordering_key IS NOT NULL \
               AND e.status = 'claimed' AND e.seq > m.seq AND e.locked_until > {now})))"
    )
}

/// The keyed arm of a claim, as common table expressions (the statement
/// needs `WITH RECURSIVE`) of which the last, `keyed`, holds up to `limit`
/// pending keyed rows that are due at `now` and pass the `head` test, in
/// claim order, locking nothing.
///
/// A key has at most one such row, its first pending or claimed message by
/// `seq`, however many are queued behind it, so walking the keyed rows in
/// claim order finds few heads among many rows when there are few keys.
/// The walk ([`keyed_walk_cte`]) stops after `walk` rows; when it found
/// fewer than `limit` heads and more rows remain, each key's first live row
/// is looked up instead ([`key_fronts_cte`]). Either way a claim costs
/// about the rows it takes, the keys, or both, never the backlog. `row` is
/// the column a key's first row is joined back on (indexed).
#[cfg(feature = "sqlite")]
pub(crate) fn keyed_heads(
    t: &str,
    head: &str,
    now: &str,
    limit: &str,
    walk: &str,
    row: &str,
) -> String {
    let walked = keyed_walk_cte(t, head, now, walk);
    let fronts = key_fronts_cte(
        t,
        row,
        &format!(
            "(SELECT count(*) FROM walk) >= {walk} \
             AND (SELECT count(*) FROM walk WHERE head) < {limit}"
        ),
    );
    format!(
        "{walked}, {fronts}, \
         keyed AS ( \
           SELECT id, available_at, created_at, seq, ordering_key FROM walk WHERE head \
           UNION \
           SELECT m.id, m.available_at, m.created_at, m.seq, m.ordering_key \
           FROM key_fronts JOIN {t} AS m ON m.{row} = key_fronts.r \
           WHERE m.status = 'pending' AND m.available_at <= {now} AND {head} \
           ORDER BY available_at, created_at, seq LIMIT {limit})"
    )
}

/// The common table expression `walk`: the first `walk` pending keyed rows
/// due at `now`, in claim order, locking nothing, each with whether it
/// passes the `head` test (column `head`).
#[cfg(feature = "sqlite")]
fn keyed_walk_cte(t: &str, head: &str, now: &str, walk: &str) -> String {
    format!(
        "walk AS MATERIALIZED ( \
           SELECT id, available_at, created_at, seq, ordering_key, {head} AS head \
           FROM {t} AS m \
           WHERE status = 'pending' AND ordering_key IS NOT NULL AND available_at <= {now} \
           ORDER BY available_at, created_at, seq LIMIT {walk})"
    )
}

/// Two common table expressions (the statement needs `WITH RECURSIVE`):
/// `key_scan`, every key with unsettled rows, and `key_fronts`, each key's
/// first pending or claimed row by `seq` (its `row` column), both empty
/// unless `gate` holds. A skip scan of the `(ordering_key, seq)` index: one
/// probe per key, then one for its first live row, however many rows are
/// queued behind it. The gate is tested before the first probe: as a
/// condition of the probe's own scan, SQLite tested it on every entry of
/// the index when it failed.
pub(crate) fn key_fronts_cte(t: &str, row: &str, gate: &str) -> String {
    format!(
        "key_scan (k) AS ( \
           SELECT (SELECT ordering_key FROM {t} \
             WHERE ordering_key IS NOT NULL AND status <> 'delivered' \
             ORDER BY ordering_key LIMIT 1) \
           WHERE {gate} \
           UNION ALL \
           SELECT (SELECT ordering_key FROM {t} \
             WHERE ordering_key IS NOT NULL AND status <> 'delivered' \
               AND ordering_key > key_scan.k \
             ORDER BY ordering_key LIMIT 1) \
           FROM key_scan WHERE key_scan.k IS NOT NULL), \
         key_fronts (r) AS ( \
           SELECT (SELECT e.{row} FROM {t} AS e \
             WHERE e.ordering_key = key_scan.k AND e.ordering_key IS NOT NULL \
               AND e.status <> 'delivered' AND e.status IN ('pending', 'claimed') \
             ORDER BY e.seq LIMIT 1) \
           FROM key_scan WHERE key_scan.k IS NOT NULL)"
    )
}

/// How many keyed rows a claim of `limit` walks in claim order before it
/// looks up each key's head instead (see [`keyed_heads`]): enough to find
/// `limit` heads where keys are many and most due rows are heads, few
/// enough that where keys are few the walk costs little beside the lookups.
/// At most [`MAX_KEYED_WALK`], so the largest claims stay cheap to plan.
pub(crate) fn keyed_walk(limit: usize) -> usize {
    limit
        .saturating_mul(2)
        .saturating_add(16)
        .min(MAX_KEYED_WALK)
}

/// The most keyed rows a claim walks. Each costs PostgreSQL's planner two
/// probes, and past its `jit_above_cost` a claim is compiled before it runs,
/// which takes longer than the claim; a larger claim finds the rest of its
/// heads by key.
const MAX_KEYED_WALK: usize = 1024;

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

/// Blocked ordering keys: each key's earliest dead letter not skipped, with
/// the count of unsettled messages after it, by key, up to `limit`.
pub(crate) fn blocked_keys(t: &str, limit: &str) -> Arc<str> {
    format!(
        "SELECT d.ordering_key, d.id, d.name, \
           (SELECT count(*) FROM {t} AS w WHERE w.ordering_key = d.ordering_key \
             AND w.ordering_key IS NOT NULL AND w.status <> 'delivered' \
             AND w.status IN ('pending', 'claimed') AND w.seq > d.seq) AS waiting \
         FROM {t} AS d \
         WHERE d.ordering_key IS NOT NULL AND d.status = 'dead_lettered' AND d.skipped_at IS NULL \
           AND NOT EXISTS (SELECT 1 FROM {t} AS e WHERE e.ordering_key = d.ordering_key \
             AND e.ordering_key IS NOT NULL AND e.status <> 'delivered' \
             AND e.status = 'dead_lettered' AND e.skipped_at IS NULL AND e.seq < d.seq) \
         ORDER BY d.ordering_key LIMIT {limit}"
    )
    .into()
}
