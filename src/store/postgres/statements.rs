//! The PostgreSQL store's SQL text, rendered once per table.

use std::sync::Arc;

use crate::store::sql::{
    CancelStatements, INSERT_COLUMNS, MESSAGE_COLUMNS, SharedStatements, TableName, blocked_count,
    oldest_due, pending_count, queues,
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

/// Put in a claim's `FROM`, with the number of the parameter that says
/// whether the claim must be durable ([`ClaimBatch::durable`]): when it
/// need not, its transaction commits without waiting for the flush of its
/// WAL, so the claim costs a round trip, not a disk write. The drain asks
/// for that only when it has an idle handler for every message it claims.
/// The claim is visible to every other session at once; only a server crash
/// in the moment before the WAL writer flushes it (a fraction of a second)
/// can undo it, and then its messages are pending again and delivered
/// again, but they were running already. Any later commit that waits for
/// its flush (an enqueue, a settlement) flushes the claim with it, so a
/// claim whose messages were settled is never undone. A claim whose
/// messages may wait for a handler keeps the session's setting: had a crash
/// undone it, they would run after it, each one then delivered twice.
/// Settlements always wait for their flush: a settlement undone would
/// deliver again a message already reported done.
///
/// [`ClaimBatch::durable`]: crate::ClaimBatch::durable
fn no_flush(durable: &str) -> String {
    format!(
        "set_config('synchronous_commit', CASE WHEN {durable} \
         THEN current_setting('synchronous_commit') ELSE 'off' END, true) AS no_flush"
    )
}

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
    /// [`insert_one`](Self::insert_one) for a row that can take nothing
    /// already taken (see [`Inserts::insert_rows`]): no `ON CONFLICT`, whose
    /// check of each unique index ahead of the insert is a share of a
    /// one-row transaction's cost; it always inserts or fails.
    ///
    /// [`Inserts::insert_rows`]: crate::store::sql::Inserts::insert_rows
    pub(super) insert_one_fresh: Arc<str>,
    /// [`insert`](Self::insert) for rows that can take nothing already
    /// taken, as [`insert_one_fresh`](Self::insert_one_fresh).
    pub(super) insert_fresh: Arc<str>,
    /// The first pass of a claim: a call of the table's `claim` function
    /// (`migrations/postgres/0017_key_heads.sql`). Binds: `$1` the queues,
    /// `$2` their limits, `$3` their attempt caps, `$4` the limit, `$5` a
    /// number the function no longer reads, `$6` now (NULL for the
    /// database's), `$7` the lease in µs, `$8` whether a dead letter holds
    /// its key, `$9` whether the claim must be durable (see [`no_flush`]).
    pub(super) claim_first: Arc<str>,
    /// The second pass of a claim that found keyed heads: a call of the
    /// table's `claim_heads` function.
    pub(super) claim_heads: Arc<str>,
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
    /// `migrations/postgres/0020_wake_sequences.sql`); returns a row when it
    /// armed, none when an enqueue was in flight.
    pub(super) arm: Arc<str>,
    /// Record that a wake-up carrying arming `$1` was heard, unless a later
    /// one was: the enqueues after it stop notifying.
    pub(super) served: Arc<str>,
}

/// The first key of the advisory lock that keeps a drain from arming while
/// an enqueue is in flight (the second is the oid of the arming sequence).
/// Two keys, so it never meets the one-key locks a claim takes per
/// ordering key.
const DRAINS_LOCK_CLASS: i32 = 1_869_574_768;

/// How long an arming holds, in milliseconds, unless renewed: a waiting
/// drain's listener renews it well before (see `listener.rs`). It bounds how
/// long enqueues go on notifying once every listener is gone.
pub(super) const ARMING_LAPSES_MS: i64 = 60_000;

impl Statements {
    /// The store's own statements, and those it runs the shared way.
    pub(super) fn new(table: &TableName, notify: bool) -> (Self, SharedStatements) {
        let t = table.quoted();
        let paused = table.derived("paused", true);
        let keys = table.derived("keys", true);
        let all = columns("");
        let m_all = columns("m.");
        // The rows come as one array per column, so the statement is the
        // same for any number of rows and prepared once. `ORDER BY n`: the
        // rows take their `seq` (evaluated after the sort) in the order
        // given, which is enqueue order for their ordering keys.
        let insert = |on_conflict: &str| {
            format!(
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
                 ORDER BY n{on_conflict} RETURNING id"
            )
        };
        // The batch's keys' rows (see `migrations/postgres/0018_keys_pruned.sql`),
        // inserted by the batch's statement in one order for every batch,
        // sorted. At commit each keyed row's trigger inserts its key's row
        // in the batch's order: two batches with some of the same new keys
        // in opposite orders would each wait for a row the other inserted,
        // a deadlock the server ends by failing one. Inserted here, a
        // batch's new keys' rows are taken in the order every batch takes
        // them, and the triggers find them already there. Under READ
        // COMMITTED only, as the triggers take them: under a snapshot that
        // predates a concurrent key's row, the insert would fail the
        // transaction with a serialization error.
        let key_rows = format!(
            "key_rows AS (INSERT INTO {keys} (queue, ordering_key) \
               SELECT DISTINCT k.queue, k.ordering_key \
               FROM unnest($13::text[], $9::text[]) AS k(queue, ordering_key) \
               WHERE k.ordering_key IS NOT NULL \
                 AND current_setting('transaction_isolation') = 'read committed' \
               ORDER BY 1, 2 \
               ON CONFLICT DO NOTHING)"
        );
        // One row, its values bound as they are: in a transaction with one
        // enqueue, the batch's form (arrays, a sort) cost nearly as much
        // again as the insert itself.
        let insert_one = |on_conflict: &str| {
            format!(
                "INSERT INTO {t} ({INSERT_COLUMNS}) \
                 VALUES ($1, $2, $3, $4::jsonb, $5, 'pending', 0, $6, \
                   coalesce($7, statement_timestamp()), $8, $8, $9, $10, $11, $12, $13, $14)\
                 {on_conflict}"
            )
        };
        const SKIP_TAKEN: &str = " ON CONFLICT DO NOTHING";
        let armed = table.derived("armed", true);
        let served = table.derived("served", true);
        let lock_key = format!("{DRAINS_LOCK_CLASS}, '{armed}'::regclass::oid::integer");
        let last = |sequence: &str| format!("coalesce(pg_sequence_last_value('{sequence}'), 0)");
        // The wake-up, an expression of the inserting statement (see
        // `migrations/postgres/0020_wake_sequences.sql`): the shared lock
        // first, held until the transaction ends, then the sequences, read
        // as they are now. `CASE` evaluates its branches in order, so the
        // reads come after the lock. While the lock is held no drain can
        // arm, so the arming read in the last branch is the one compared.
        // Yields whether it notified.
        let wake = format!(
            "CASE WHEN pg_advisory_xact_lock_shared({lock_key}) IS NULL THEN false \
               WHEN {armed_now} <= {served_now} THEN false \
               WHEN {armed_now} <= date_part('epoch', statement_timestamp()) * 1000 THEN false \
               ELSE pg_notify($15::text, {armed_now}::text) IS NOT NULL END",
            armed_now = last(&armed),
            served_now = last(&served),
        );
        // As `insert_one`, and once per statement however many rows it
        // stored. The ids come back as one array, one row to transfer.
        let batch = |insert: &str| {
            if notify {
                format!(
                    "WITH {key_rows}, inserted AS ({insert}) \
                     SELECT ARRAY(SELECT id FROM inserted), \
                       CASE WHEN EXISTS (SELECT FROM inserted) THEN {wake} END"
                )
            } else {
                format!(
                    "WITH {key_rows}, inserted AS ({insert}) \
                     SELECT ARRAY(SELECT id FROM inserted)"
                )
            }
        };
        let own = Statements {
            // The wake-up in the inserting statement, so it costs no round
            // trip: a NOTIFY (when a drain waits for one) is delivered at
            // commit, never for a rollback. Either form returns a row only
            // when it inserted.
            insert_one: if notify {
                format!("{} RETURNING {wake}", insert_one(SKIP_TAKEN))
            } else {
                format!("{} RETURNING 1", insert_one(SKIP_TAKEN))
            }
            .into(),
            insert_one_fresh: if notify {
                format!("{} RETURNING {wake}", insert_one(""))
            } else {
                insert_one("")
            }
            .into(),
            insert: batch(&insert(SKIP_TAKEN)).into(),
            insert_fresh: batch(&insert("")).into(),
            // One statement, so the advisory lock is held only while it
            // runs: taken without waiting (an enqueue in flight holds it
            // shared until its commit, and waiting would queue every later
            // enqueue behind that transaction), and the arming written only
            // if it was got. The lock also makes the read and the write of
            // the sequence one step among drains arming at once.
            arm: format!(
                "SELECT setval('{armed}', greatest({armed_last} + 1, \
                   (date_part('epoch', statement_timestamp()) * 1000)::int8 \
                     + {ARMING_LAPSES_MS})) \
                 WHERE pg_try_advisory_xact_lock({lock_key})",
                armed_last = last(&armed),
            )
            .into(),
            // Listeners of several processes hear the same wake-up and may
            // race here; a lower value written last only makes the next
            // enqueue notify once more.
            served: format!(
                "SELECT setval('{served}', $1) WHERE $1 > {served_last}",
                served_last = last(&served),
            )
            .into(),
            // The first pass, in the table's `claim` function: for each
            // queue served and not paused, its keyless rows, its expired
            // claims, and its keys' flagged heads that pass the head test
            // (`migrations/postgres/0017_key_heads.sql`), one priority at a
            // time, in claim order; each queue cut to its limit, all of them
            // to the claim's.
            //
            // Keyed rows need more than row locks: the head test reads the
            // statement's snapshot, which a concurrent claim of the same key
            // may have changed since. So the first pass claims keyless rows
            // only and returns the keyed heads it saw as `keyed`; the second
            // pass takes an advisory lock per key hash before its claim
            // statement begins, so that statement's snapshot holds every
            // claim of those keys (`claim_heads`).
            //
            // A claim for idle handlers commits without waiting for its WAL
            // to reach disk (`synchronous_commit` off for its transaction
            // alone; see `no_flush`).
            claim_first: format!(
                "SELECT c.* FROM {}, {}($1, $2, $3, $4, $5, $6, $7, $8) AS c",
                no_flush("$9"),
                table.derived("claim", true)
            )
            .into(),
            // The heads a first pass left, by id, claimed with their keys
            // locked, in one round trip: see
            // `migrations/postgres/0017_key_heads.sql`. Binds: `$1` the key
            // hashes in ascending order, `$2` the ids, `$3` the queues
            // served and `$4` their attempt caps, `$5` now (NULL for the
            // database's), `$6` the lease in µs, `$7` whether a dead
            // letter holds its key, `$8` whether the claim must be durable.
            claim_heads: format!(
                "SELECT c.* FROM {}, {}($1, $2, $3, $4, $5, $6, $7) AS c",
                no_flush("$8"),
                table.derived("claim_heads", true)
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
            // The key rows' reason to be is in
            // `migrations/postgres/0018_keys_pruned.sql`. The probe reads
            // the index of each key's live messages (its predicate,
            // literally).
            prune_keys: Some(
                format!(
                    "DELETE FROM {keys} WHERE (queue, ordering_key) IN ( \
                       SELECT k.queue, k.ordering_key FROM {keys} AS k \
                       WHERE NOT EXISTS (SELECT 1 FROM {t} AS m \
                         WHERE m.queue = k.queue AND m.ordering_key = k.ordering_key \
                           AND m.ordering_key IS NOT NULL AND m.status IN ('pending', 'claimed')) \
                       LIMIT $1 FOR UPDATE SKIP LOCKED)"
                )
                .into(),
            ),
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
