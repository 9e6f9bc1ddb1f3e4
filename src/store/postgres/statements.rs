//! The PostgreSQL store's SQL text, rendered once per table.

use std::sync::Arc;

use crate::store::sql::{
    CancelStatements, INSERT_COLUMNS, MESSAGE_COLUMNS, SharedStatements, TableName, blocked_count,
    head_test, key_fronts_cte, levels_cte, oldest_due, pending_count, queues,
};

/// The time a statement judges leases by: the caller's (`$1`, bound when
/// the store runs on the caller's clock) or, when `$1` is NULL, the
/// database's. `statement_timestamp()` rather than `clock_timestamp()`: it
/// is one value for the whole statement and stable, so the claim's range
/// tests still use their indexes; rather than `now()`: a statement inside a
/// longer transaction still reads the time it runs, not the time the
/// transaction began. Each claim and fenced write runs as a transaction of
/// its own, where the two agree.
const NOW: &str = "coalesce($1::timestamptz, statement_timestamp())";

/// The attempt cap of a row `m` a claim's statements test: its own when
/// set at enqueue, else its queue's (`s`, the served queue it is in).
const CAP: &str = "(CASE WHEN m.max_attempts_set THEN m.max_attempts ELSE s.cap END)";

/// [`NOW`] in the claim's statements, written out per claim: the caller's
/// time bound as `$1`, or the database's (see [`Statements::claim_locked`]).
const CLAIM_NOW: &str = "{now}";

/// Put in a claim's `FROM`: its transaction commits without waiting for
/// the flush of its WAL, so a claim costs a round trip, not a disk write.
/// This loses nothing. The claim is visible to every other session at once;
/// only a server crash in the moment before the WAL writer flushes it (a
/// fraction of a second) can undo it, and then its messages are pending
/// again, as if their lease had run out, and are delivered again. Any later
/// commit that waits for its flush (an enqueue, a settlement) flushes the
/// claim with it, so a claim whose messages were settled is never undone,
/// and a crash redelivers no more messages than those it caught in flight.
/// Settlements keep waiting for theirs: a settlement undone would deliver
/// again a message already reported done.
const NO_FLUSH: &str = "set_config('synchronous_commit', 'off', true) AS no_flush";

/// Every column, each after `prefix`, in the order rows are read.
pub(super) fn columns(prefix: &str) -> String {
    MESSAGE_COLUMNS
        .iter()
        .map(|c| match *c {
            "payload" => format!("{prefix}payload::text AS payload"),
            c => format!("{prefix}{c}"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The rendered statements for one table.
#[derive(Debug)]
pub(super) struct Statements {
    /// Insert one message unless its id or idempotency key is taken (and,
    /// when the store notifies and it inserted, wake a drain that waits);
    /// returns a row when it inserted. A NULL `available_at` is the
    /// database's time. Binds: `$1` id ... `$14` priority, the values of
    /// [`InsertRow`](crate::store::sql::InsertRow) in its order; `$15` the
    /// channel.
    pub(super) insert_one: Arc<str>,
    /// Insert messages, each unless its id or idempotency key is taken
    /// (and, when the store notifies and it inserted any, wake a drain that
    /// waits); returns one row: the array of the ids it inserted. A NULL
    /// `available_at` is the database's time. Binds fourteen arrays of
    /// equal length, one per column of
    /// [`InsertRow`](crate::store::sql::InsertRow), in its order: `$1` ids
    /// ... `$14` the priorities; `$15` the channel.
    pub(super) insert: Arc<str>,
    /// The first pass of a claim: a call of the table's `claim` function
    /// (`migrations/postgres/0014_queues.sql`). Binds: `$1` the queues,
    /// `$2` their limits, `$3` their attempt caps, `$4` the limit, `$5` the
    /// most keyed rows to walk per queue and priority, `$6` now (NULL for
    /// the database's), `$7` the lease in µs, `$8` whether a dead letter
    /// holds its key.
    pub(super) claim_first: Arc<str>,
    /// The second pass of a claim that found keyed heads: a call of the
    /// table's `claim_heads` function.
    pub(super) claim_heads: Arc<str>,
    /// The claim after a short first pass, with `{limit}`, `{block}` and
    /// its binds to write out; see [`Statements::claim_locked`].
    claim_locked: Arc<str>,
    /// The heads of keys beyond a claim's walk, with `{limit}`, `{block}`
    /// and its binds to write out; see [`Statements::key_heads`].
    key_heads: Arc<str>,
    /// Take the advisory lock of each key hash, in the order given (sorted,
    /// so two claimers never wait on each other in a cycle). Binds: `$1` the
    /// hashes.
    pub(super) lock_keys: Arc<str>,
    /// Dead-letter rows out of attempts if they still are, and cancel
    /// expired claims whose cancellation was requested. Binds: now (NULL
    /// for the database's), then arrays of ids, attempts, errors and each
    /// row's attempt cap (its queue's).
    pub(super) abandoned: Arc<str>,
    /// Dead-letter an unreadable row. Binds: error, now (NULL for the
    /// database's), seq, token.
    pub(super) quarantine: Arc<str>,
    /// Every fenced write: a call of the table's `settle` function
    /// (`migrations/postgres/0013_settle_function.sql`). Binds seven arrays
    /// of equal length: `$1` op (`renew`, `deliver`, `retry`, `dead`,
    /// `release`, `delete`; NULL when every row is a deletion), `$2` id,
    /// `$3` token, `$4` now (NULL for the database's), `$5` lease in µs
    /// (renew), `$6` new `available_at` (retry), `$7` `last_error` JSON (the
    /// last three may be NULL with `$1`); returns each id it did not change
    /// (the claims lost, `lost`), and each it changed that carries a
    /// cancellation request (`cancel`), usually none.
    pub(super) settle: Arc<str>,
    /// The fence columns of an array of ids.
    pub(super) fences: Arc<str>,
    /// Wake listeners. Binds: the channel.
    pub(super) notify: Arc<str>,
    /// Ask for a wake-up on the next committed insert (see
    /// `migrations/postgres/0004_idle_drains.sql`); returns a row when it
    /// armed, none when an enqueue was in flight.
    pub(super) arm: Arc<str>,
}

/// The first key of the advisory lock that keeps a drain from arming while
/// an enqueue is in flight (the second is the flag table's oid), as
/// `migrations/postgres/0004_idle_drains.sql` takes it. Two keys, so it
/// never meets the one-key locks a claim takes per ordering key.
const DRAINS_LOCK_CLASS: i32 = 1_869_574_768;

impl Statements {
    /// The store's own statements, and those it runs the shared way.
    pub(super) fn new(table: &TableName, notify: bool) -> (Self, SharedStatements) {
        let t = table.quoted();
        let paused = table.derived("paused", true);
        let all = columns("");
        let m_all = columns("m.");
        // Every column NULL but the id and the key, for a keyed row a pass
        // leaves to the next: the claim reads only those, and the rest would
        // cost a lookup and its transfer per row.
        let key_only = m_all
            .split(", ")
            .map(|column| match column {
                "m.id" | "m.ordering_key" => column.replace("m.", "picked."),
                other => other.to_owned(),
            })
            .collect::<Vec<_>>()
            .join(", ");
        // `{block}` is written out per claim, like `{limit}`.
        let head = head_test(&t, "{block}", CLAIM_NOW, true);
        // The queues a claim serves that are not paused, each with its
        // limit and attempt cap, bound as arrays (`{queues}` and so on are
        // written out per claim: see `ClaimValues::write`).
        let served = format!(
            "served AS MATERIALIZED ( \
               SELECT s.queue, s.lim, s.cap \
               FROM unnest({{queues}}, {{limits}}, {{caps}}) AS s (queue, lim, cap) \
               WHERE NOT EXISTS (SELECT 1 FROM {paused} AS z WHERE z.queue = s.queue))"
        );
        // After the rows the locked pass picked: claim them, except those
        // out of attempts or with a cancellation request (returned
        // untouched as `abandoned`) and keyed rows of keys it does not hold
        // (returned untouched as `keyed`: their id, key and key hash only).
        //
        // The claim's tokens share one random part, drawn once per
        // statement, and differ by the row's `seq`: unique for each claim
        // of each row, as fencing needs, and cheaper than a random UUID
        // per row, which was about a tenth of the cost of claiming it.
        //
        // The rows to claim are found by the physical address (`ctid`) of
        // the version the arm locked, not by id: a lookup in the text
        // primary key per row was a third of the claim's time on the
        // server. A locked version cannot move before the transaction ends,
        // so the address is still that row's. The one version it may miss
        // is a row released and pending again after the statement's
        // snapshot was taken: its lock is on a version the snapshot cannot
        // see, so it is left pending, unclaimed, for the next claim.
        let settle_picked = format!(
            "claimed AS ( \
                   UPDATE {t} AS m SET status = 'claimed', attempts = m.attempts + 1, \
                     claim_token = (SELECT gen_random_uuid()::text) || '.' || m.seq, \
                     claimed_at = {CLAIM_NOW}, \
                     locked_until = {CLAIM_NOW} + {{lease}}::bigint * interval '1 microsecond', \
                     updated_at = {CLAIM_NOW} \
                   WHERE m.ctid = ANY (ARRAY( \
                       SELECT tid FROM picked WHERE NOT abandoned AND NOT deferred)) \
                   RETURNING {m_all}) \
                 SELECT 'claimed' AS outcome, NULL::bigint AS key_hash, * FROM claimed \
                 UNION ALL \
                 SELECT 'abandoned', NULL::bigint, {m_all} \
                 FROM {t} AS m JOIN picked ON m.id = picked.id \
                 WHERE picked.abandoned AND NOT picked.deferred \
                 UNION ALL \
                 SELECT 'keyed', hashtextextended(picked.ordering_key, 0), {key_only} \
                 FROM picked LEFT JOIN {t} AS m ON false \
                 WHERE picked.deferred"
        );
        // The arms every claim of keyless rows reads, skipping rows another
        // claimer holds: each served queue's pending keyless rows, one
        // priority at a time, each a prefix of the partial index in claim
        // order; and claimed rows of those queues with an expired lease
        // that pass the head test.
        let keyless_levels = levels_cte("keyless_levels", &t, None, CLAIM_NOW, "s.lim", "s.lim");
        let arms = format!(
            "{keyless_levels}, \
             keyless AS ( \
               SELECT x.* FROM keyless_levels AS l JOIN served AS s ON s.queue = l.queue \
               CROSS JOIN LATERAL ( \
                 SELECT m.id, m.queue, m.priority, m.available_at, m.created_at, m.seq, \
                   m.ordering_key, m.attempts >= {CAP} AS abandoned, m.ctid AS tid \
                 FROM {t} AS m \
                 WHERE m.status = 'pending' AND m.ordering_key IS NULL AND m.queue = l.queue \
                   AND m.priority = l.priority AND m.available_at <= {CLAIM_NOW} \
                 ORDER BY m.available_at, m.created_at, m.seq LIMIT s.lim \
                 FOR UPDATE SKIP LOCKED) AS x \
               WHERE l.priority IS NOT NULL), \
             expired AS ( \
               SELECT m.id, m.queue, m.priority, m.available_at, m.created_at, m.seq, \
                 m.ordering_key, \
                 (m.attempts >= {CAP} OR m.cancel_requested_at IS NOT NULL) AS abandoned, \
                 m.ctid AS tid \
               FROM {t} AS m JOIN served AS s ON s.queue = m.queue \
               WHERE m.status = 'claimed' AND m.locked_until <= {CLAIM_NOW} AND {head} \
               ORDER BY m.priority DESC, m.available_at, m.created_at, m.seq LIMIT {{limit}} \
               FOR UPDATE OF m SKIP LOCKED)"
        );
        // The heads of the keys `{keys}` (in the queues `{key_queues}`),
        // whose locks the transaction holds: each key's first pending or
        // claimed row in its queue, looked up in the key's index, no walk
        // however long its queue. A lateral join rather than a scalar
        // subquery: PostgreSQL ran that subquery three times per key
        // (grouping, cache key, index condition).
        let fronts = format!(
            "fronts AS ( \
               SELECT m.id, m.queue, m.priority, m.available_at, m.created_at, m.seq, \
                 m.ordering_key, \
                 (m.attempts >= {CAP} OR m.cancel_requested_at IS NOT NULL) AS abandoned, \
                 m.ctid AS tid \
               FROM {t} AS m JOIN served AS s ON s.queue = m.queue \
               WHERE m.id IN (SELECT f.id \
                 FROM unnest({{key_queues}}, {{keys}}) AS k (q, k) \
                 CROSS JOIN LATERAL (SELECT e.id FROM {t} AS e \
                   WHERE e.queue = k.q AND e.ordering_key = k.k AND e.ordering_key IS NOT NULL \
                     AND e.status <> 'delivered' AND e.status <> 'cancelled' \
                     AND e.status IN ('pending', 'claimed') \
                   ORDER BY e.seq LIMIT 1) AS f) \
               AND ((m.status = 'pending' AND m.available_at <= {CLAIM_NOW}) \
                 OR (m.status = 'claimed' AND m.locked_until <= {CLAIM_NOW})) \
               AND {head} \
               FOR UPDATE OF m SKIP LOCKED)"
        );
        let key_fronts = key_fronts_cte(&t, "id", "true");
        // The rows come as one array per column, so the statement is the
        // same for any number of rows and prepared once. `ORDER BY n`: the
        // rows take their `seq` (evaluated after the sort) in the order
        // given, which is enqueue order for their ordering keys.
        let insert = format!(
            "INSERT INTO {t} ({INSERT_COLUMNS}) \
             SELECT id, kind, name, payload::jsonb, trace, 'pending', 0, max_attempts, \
               coalesce(available_at, statement_timestamp()), created_at, created_at, \
               ordering_key, idempotency_key, idempotency_until, max_attempts_set, queue, \
               priority \
             FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], \
               $6::int8[], $7::timestamptz[], $8::timestamptz[], $9::text[], $10::text[], \
               $11::timestamptz[], $12::bool[], $13::text[], $14::int2[]) WITH ORDINALITY \
               AS r(id, kind, name, payload, trace, max_attempts, available_at, created_at, \
                 ordering_key, idempotency_key, idempotency_until, max_attempts_set, queue, \
                 priority, n) \
             ORDER BY n \
             ON CONFLICT DO NOTHING RETURNING id"
        );
        // One row, its values bound as they are: in a transaction with one
        // enqueue, the batch's form (arrays, a sort) cost nearly as much
        // again as the insert itself.
        let insert_one = format!(
            "INSERT INTO {t} ({INSERT_COLUMNS}) \
             VALUES ($1, $2, $3, $4::jsonb, $5, 'pending', 0, $6, \
               coalesce($7, statement_timestamp()), $8, $8, $9, $10, $11, $12, $13, $14) \
             ON CONFLICT DO NOTHING RETURNING 1"
        );
        let wake = table.derived("wake", true);
        let drains = table.derived("drains", true);
        let own = Statements {
            // The wake-up in the inserting statement, so it costs no round
            // trip: a NOTIFY (when a drain waits for one) is delivered at
            // commit, never for a rollback. Either form returns a row only
            // when it inserted.
            insert_one: if notify {
                format!("WITH inserted AS ({insert_one}) SELECT {wake}($15) FROM inserted")
            } else {
                insert_one
            }
            .into(),
            // As `insert_one`, and once per statement however many rows it
            // stored. The ids come back as one array, one row to transfer.
            insert: if notify {
                format!(
                    "WITH inserted AS ({insert}) \
                     SELECT ARRAY(SELECT id FROM inserted), \
                       CASE WHEN EXISTS (SELECT FROM inserted) THEN {wake}($15) END"
                )
            } else {
                format!("WITH inserted AS ({insert}) SELECT ARRAY(SELECT id FROM inserted)")
            }
            .into(),
            // One statement, so the advisory lock is held only while it
            // runs: taken without waiting (an enqueue in flight holds it
            // shared until its commit, and waiting would queue every later
            // enqueue behind that transaction), and the flag set only if it
            // was got. An upsert: a crash empties the unlogged table.
            arm: format!(
                "INSERT INTO {drains} (id, idle) SELECT 1, true \
                 WHERE pg_try_advisory_xact_lock({DRAINS_LOCK_CLASS}, \
                   '{drains}'::regclass::oid::integer) \
                 ON CONFLICT (id) DO UPDATE SET idle = true RETURNING 1"
            )
            .into(),
            // The first pass, in the table's `claim` function: for each
            // queue served and not paused, its keyless rows and expired
            // claims, and keyed heads from a bounded walk of its keyed rows,
            // one priority at a time, in claim order; each queue cut to its
            // limit, testing walked rows for heads in claim order only until
            // it is (where keys are many, most walked rows are heads, and
            // the queue is full long before the walk ends); all of them cut
            // to the claim's limit.
            //
            // Keyed rows need more than row locks: the head test reads the
            // statement's snapshot, which a concurrent claim of the same key
            // may have changed since. So the first pass claims keyless rows
            // only and returns the keyed heads it saw as `keyed`; the second
            // pass takes an advisory lock per key hash before its claim
            // statement begins, so that statement's snapshot holds every
            // claim of those keys (`claim_heads`).
            //
            // A head the walk did not reach comes after every row it walked,
            // in claim order. So when a walk was cut short and the rows its
            // queue picked do not all come before its last row, a head it
            // missed might belong among them: the pass then claims nothing
            // and returns one row, `short` (every column NULL), and the
            // claim looks each key's head up (`key_heads`) and claims again
            // with those keys locked (`claim_locked`). The lookup is a
            // statement of its own, run only then: its recursive scan makes
            // PostgreSQL price a statement above the default
            // `jit_above_cost`, and compiling it costs more than any claim.
            //
            // A claim commits without waiting for its WAL to reach disk
            // (`synchronous_commit` off for its transaction alone; see
            // `NO_FLUSH`).
            claim_first: format!(
                "SELECT c.* FROM {NO_FLUSH}, {}($1, $2, $3, $4, $5, $6, $7, $8) AS c",
                table.derived("claim", true)
            )
            .into(),
            // The heads a first pass left, by id, claimed with their keys
            // locked, in one round trip: see
            // `migrations/postgres/0014_queues.sql`. Binds: `$1` the key
            // hashes in ascending order, `$2` the ids, `$3` the queues
            // served and `$4` their attempt caps, `$5` now (NULL for the
            // database's), `$6` the lease in µs, `$7` whether a dead
            // letter holds its key.
            claim_heads: format!(
                "SELECT c.* FROM {NO_FLUSH}, {}($1, $2, $3, $4, $5, $6, $7) AS c",
                table.derived("claim_heads", true)
            )
            .into(),
            // After a `short` first pass: keyless rows, expired claims and
            // the heads of the locked keys, each queue cut to its limit in
            // claim order, then all to the claim's. Keyed rows of other keys
            // (expired claims) are left for a later claim, returned as
            // `keyed`.
            claim_locked: format!(
                "WITH RECURSIVE {served}, {arms}, {fronts}, \
                 candidates AS ( \
                   SELECT * FROM keyless \
                   UNION ALL (SELECT * FROM expired UNION SELECT * FROM fronts)), \
                 picked AS ( \
                   SELECT c.*, c.ordering_key IS NOT NULL \
                       AND (c.queue, c.ordering_key) NOT IN ( \
                         SELECT * FROM unnest({{key_queues}}, {{keys}})) AS deferred \
                   FROM (SELECT c.*, row_number() OVER (PARTITION BY c.queue \
                       ORDER BY c.priority DESC, c.available_at, c.created_at, c.seq) AS n \
                     FROM candidates AS c) AS c \
                   JOIN served AS s ON s.queue = c.queue \
                   WHERE c.n <= s.lim \
                   ORDER BY c.priority DESC, c.available_at, c.created_at, c.seq \
                   LIMIT {{limit}}), \
                 {settle_picked}"
            )
            .into(),
            lock_keys: "SELECT count(pg_advisory_xact_lock(h)) FROM unnest($1::bigint[]) AS h"
                .into(),
            // Each served queue's keys with unsettled rows, looked up in the
            // key index; a key whose first pending or claimed row is a due
            // head is returned with its queue and hash, each queue's up to
            // its limit, in its head's claim order. Locks nothing: the claim
            // locks the keys and claims.
            key_heads: format!(
                "WITH RECURSIVE {served}, {key_fronts}, \
                 heads AS ( \
                   SELECT m.queue, m.ordering_key, m.priority, m.available_at, m.created_at, \
                     m.seq, row_number() OVER (PARTITION BY m.queue \
                       ORDER BY m.priority DESC, m.available_at, m.created_at, m.seq) AS n \
                   FROM key_fronts JOIN {t} AS m ON m.id = key_fronts.r \
                   WHERE m.status = 'pending' AND m.available_at <= {CLAIM_NOW} AND {head}) \
                 SELECT h.queue, h.ordering_key, hashtextextended(h.ordering_key, 0) AS key_hash \
                 FROM heads AS h JOIN served AS s ON s.queue = h.queue \
                 WHERE h.n <= s.lim \
                 ORDER BY h.priority DESC, h.available_at, h.created_at, h.seq LIMIT {{limit}}"
            )
            .into(),
            abandoned: format!(
                "UPDATE {t} AS m SET \
                   status = CASE WHEN m.cancel_requested_at IS NOT NULL THEN 'cancelled' \
                     ELSE 'dead_lettered' END, \
                   claim_token = NULL, claimed_at = NULL, locked_until = NULL, \
                   last_error = CASE WHEN m.cancel_requested_at IS NOT NULL THEN m.last_error \
                     ELSE v.error END, \
                   updated_at = {NOW} \
                 FROM unnest($2::text[], $3::bigint[], $4::text[], $5::bigint[]) \
                   AS v(id, attempts, error, cap) \
                 WHERE m.id = v.id AND m.attempts = v.attempts \
                   AND (m.attempts >= (CASE WHEN m.max_attempts_set THEN m.max_attempts \
                       ELSE v.cap END) \
                     OR m.cancel_requested_at IS NOT NULL) \
                   AND ((m.status = 'pending' AND m.available_at <= {NOW}) \
                     OR (m.status = 'claimed' AND m.locked_until <= {NOW})) \
                 RETURNING {m_all}"
            )
            .into(),
            quarantine: format!(
                "UPDATE {t} SET status = 'dead_lettered', claim_token = NULL, claimed_at = NULL, \
                   locked_until = NULL, last_error = $1, \
                   updated_at = coalesce($2::timestamptz, statement_timestamp()) \
                 WHERE seq = $3 AND status IN ('pending', 'claimed') \
                   AND claim_token IS NOT DISTINCT FROM $4"
            )
            .into(),
            settle: format!(
                "SELECT * FROM {}($1, $2, $3, $4, $5, $6, $7)",
                table.derived("settle", true)
            )
            .into(),
            fences: format!(
                "SELECT id, status, claim_token, locked_until FROM {t} WHERE id = ANY($1)"
            )
            .into(),
            notify: "SELECT pg_notify($1, '')".into(),
        };
        let pending = pending_count(&t);
        let oldest_due = oldest_due(&t, NOW);
        let blocked = blocked_count(&t);
        let shared = SharedStatements {
            get: format!("SELECT {all} FROM {t} WHERE id = $1").into(),
            stats: format!(
                "SELECT \
                   {pending}, \
                   (SELECT count(*) FROM {t} WHERE status = 'claimed'), \
                   (SELECT count(*) FROM {t} WHERE status = 'delivered'), \
                   (SELECT count(*) FROM {t} WHERE status = 'dead_lettered'), \
                   (SELECT count(*) FROM {t} WHERE status = 'claimed' AND locked_until > {NOW}), \
                   {oldest_due}, \
                   {blocked}, \
                   (SELECT count(*) FROM {t} WHERE status = 'cancelled')"
            )
            .into(),
            // `now` (`$2` here, `$1` in the next) is NULL on the database's
            // clock, like a claim's.
            requeue_one: format!(
                "UPDATE {t} SET status = 'pending', attempts = 0, \
                   available_at = coalesce($2::timestamptz, statement_timestamp()), \
                   updated_at = coalesce($2::timestamptz, statement_timestamp()), skipped_at = NULL \
                 WHERE id = $1 AND status = 'dead_lettered'"
            )
            .into(),
            requeue_all: format!(
                "UPDATE {t} SET status = 'pending', attempts = 0, available_at = {NOW}, \
                   updated_at = {NOW}, skipped_at = NULL \
                 WHERE status = 'dead_lettered' AND ($2::text IS NULL OR name = $2)"
            )
            .into(),
            requeue_state: format!("SELECT status, locked_until FROM {t} WHERE id = $1").into(),
            // The literal status list is the index of settled rows' own
            // predicate, so the planner reads that index; rows another
            // transaction holds are left for the next batch.
            purge_batch: format!(
                "DELETE FROM {t} WHERE id IN ( \
                   SELECT id FROM {t} \
                   WHERE status IN ('delivered', 'dead_lettered', 'cancelled') \
                   AND status = $1 AND updated_at < $2 \
                   ORDER BY status, updated_at LIMIT $3 FOR UPDATE SKIP LOCKED)"
            )
            .into(),
            // The purge's predicate, without its batch limit.
            count_purgeable: format!(
                "SELECT count(*) FROM {t} \
                 WHERE status IN ('delivered', 'dead_lettered', 'cancelled') \
                 AND ($1::text IS NULL OR status = $1) AND updated_at < $2"
            )
            .into(),
            skip: format!(
                "UPDATE {t} SET skipped_at = coalesce($2::timestamptz, statement_timestamp()), \
                   updated_at = coalesce($2::timestamptz, statement_timestamp()) \
                 WHERE id = $1 AND status = 'dead_lettered'"
            )
            .into(),
            blocked: crate::store::sql::blocked_keys(&t, "$1"),
            idempotency_holders: format!(
                "SELECT idempotency_key, id, idempotency_until FROM {t} \
                 WHERE idempotency_key = ANY ($1::text[])"
            )
            .into(),
            idempotency_release: format!(
                "UPDATE {t} SET idempotency_key = NULL \
                 WHERE idempotency_key = $1 AND idempotency_until <= $2"
            )
            .into(),
            // Plain VACUUM: no lock that blocks reads or writes; it skips
            // the table when another vacuum (autovacuum, another worker's
            // retention run) holds it, rather than wait.
            vacuum: Some(format!("VACUUM (SKIP_LOCKED) {t}").into()),
            pause: format!(
                "INSERT INTO {paused} (queue, paused_at) \
                 VALUES ($1, coalesce($2::timestamptz, statement_timestamp())) \
                 ON CONFLICT (queue) DO NOTHING"
            )
            .into(),
            resume: format!("DELETE FROM {paused} WHERE queue = $1").into(),
            queues: queues(&t, &paused, "NULL::timestamptz"),
            cancel: CancelStatements::new(
                &t,
                ["$1", "coalesce($2::timestamptz, statement_timestamp())"],
                [
                    "$1::text",
                    "$2::text",
                    "$3::text",
                    "coalesce($4::timestamptz, statement_timestamp())",
                ],
            ),
            table: t.into(),
        };
        (own, shared)
    }
}

impl Statements {
    /// The claim after a `short` first pass, of up to `limit` messages,
    /// with the dead-letter policy `block`. Numbers, booleans and the name
    /// of a function of the database's are all that is written into it.
    ///
    /// The limit is written into the statement rather than bound: PostgreSQL
    /// cannot see a bound `LIMIT` when it plans a statement for reuse and
    /// assumes a tenth of the table, so it planned every claim afresh. With
    /// the limit written out, each size of claim is a prepared statement of
    /// its own whose plan is reused. (The first pass, which runs far more
    /// often, is a function with a plan forced generic instead: see
    /// `migrations/postgres/0012_claim_function.sql`.)
    ///
    /// The lease (`values`) is written out too, and so is the time on the
    /// database's clock. Binds: `$1` now when the store runs on the
    /// caller's clock; then the queues served, their limits and their
    /// attempt caps, and the queues and keys whose locks the transaction
    /// holds. Each row comes back with its `outcome`: `claimed`;
    /// `abandoned` (out of attempts, or with a cancellation request;
    /// untouched); or `keyed` (a row of a key the transaction does not
    /// hold, untouched: every column NULL but its `id`, `ordering_key` and
    /// `key_hash`).
    pub(super) fn claim_locked(&self, limit: usize, block: bool, values: ClaimValues) -> String {
        values.write(
            &self
                .claim_locked
                .replace("{limit}", &limit.to_string())
                .replace("{block}", if block { "true" } else { "false" }),
        )
    }

    /// The statement that looks up the heads of up to `limit` keys, for a
    /// claim whose first pass came back `short`, with the dead-letter policy
    /// `block`. It costs a probe or two per key with unsettled rows, so it
    /// runs only after a `short` first pass; and with JIT compilation off
    /// (see `claim_first`). Binds as [`Statements::claim_locked`] up to the
    /// queues' attempt caps: `$1` now on the caller's clock, then the
    /// queues, their limits and their caps. Each row is a head's queue, key
    /// and key hash.
    pub(super) fn key_heads(&self, limit: usize, block: bool, values: ClaimValues) -> String {
        values.write(
            &self
                .key_heads
                .replace("{limit}", &limit.to_string())
                .replace("{block}", if block { "true" } else { "false" }),
        )
    }
}

/// What a claim's statements take from the claim, written into their text
/// (see [`Statements::claim_locked`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ClaimValues {
    /// The lease, in whole microseconds.
    pub(super) lease_micros: i64,
    /// Whether `now` is the caller's, bound as `$1`; else the database's.
    pub(super) caller_now: bool,
}

impl ClaimValues {
    /// `statement` with its `{now}` and `{lease}` written out, and its
    /// arrays (`{queues}`, `{limits}`, `{caps}`, `{key_queues}`, `{keys}`)
    /// numbered as the binds after `now`.
    fn write(self, statement: &str) -> String {
        // `statement_timestamp()` is what a NULL `now` meant (see `NOW`).
        let (now, first) = if self.caller_now {
            ("$1::timestamptz", 2)
        } else {
            ("statement_timestamp()", 1)
        };
        let arrays = [
            ("{queues}", "text[]"),
            ("{limits}", "integer[]"),
            ("{caps}", "bigint[]"),
            ("{key_queues}", "text[]"),
            ("{keys}", "text[]"),
        ];
        let mut written = statement
            .replace("{now}", now)
            .replace("{lease}", &self.lease_micros.to_string());
        for (n, (slot, kind)) in arrays.into_iter().enumerate() {
            written = written.replace(slot, &format!("${}::{kind}", first + n));
        }
        written
    }
}

/// The channel of `table`: readable when it fits in an identifier.
pub(super) fn channel_of(table: &TableName) -> String {
    let readable = format!("outbox:{table}");
    if readable.len() <= 63 {
        return readable;
    }
    // FNV-1a: stable across processes and builds, unlike std's hasher.
    let hash = table
        .to_string()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    format!("outbox:{hash:016x}")
}
