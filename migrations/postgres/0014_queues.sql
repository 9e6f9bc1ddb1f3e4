-- Named queues, priorities and cancellation.
--
-- Every message has a queue (existing rows join `default`) and a priority
-- (0 for existing rows; higher is claimed first within a queue). A claim
-- serves a set of queues, each with its own limit, skips the paused ones
-- (a table of their own, read in the claim's statement), and reads each
-- queue's pending rows level by level of priority from its partial index:
-- within a level the due rows are a prefix of the index, so no scheduled
-- row is ever walked, whatever its priority. An ordering key's order holds
-- within its queue, so the key indexes lead with the queue.
--
-- A message can be cancelled: pending, it becomes `cancelled` at once;
-- under a live claim, `cancel_requested_at` records the request (the fence
-- columns are left alone), renewals report it, and a settlement that
-- would retry, dead-letter or release the message cancels it instead. A
-- cancelled row is settled like a delivered one: out of the claim's and
-- the keys' indexes, purged by retention.
--
-- The new columns have constant defaults, so adding them rewrites nothing;
-- the indexes whose columns change are rebuilt under the table's lock, in
-- the migration's transaction.

ALTER TABLE "outbox" ADD COLUMN IF NOT EXISTS queue text COLLATE "C" NOT NULL DEFAULT 'default';
ALTER TABLE "outbox" ADD COLUMN IF NOT EXISTS priority smallint NOT NULL DEFAULT 0;
ALTER TABLE "outbox" ADD COLUMN IF NOT EXISTS cancel_requested_at timestamptz;

-- The status check of 0001 knows four statuses. Its name is PostgreSQL's
-- choice (the table's name and `status_check`, shortened for a long name),
-- so it is found by what it checks.
DO $$
DECLARE
    c record;
BEGIN
    FOR c IN SELECT conname FROM pg_constraint
        WHERE conrelid = '"outbox"'::regclass AND contype = 'c'
          AND pg_get_constraintdef(oid) LIKE '%status%'
    LOOP
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', '"outbox"'::regclass, c.conname);
    END LOOP;
END
$$;

ALTER TABLE "outbox" ADD CHECK
    (status IN ('pending', 'claimed', 'delivered', 'dead_lettered', 'cancelled'));

-- The paused queues, named like the table. Logged: a pause survives a
-- restart.
CREATE TABLE IF NOT EXISTS "outbox_paused" (
    queue     text        COLLATE "C" PRIMARY KEY,
    paused_at timestamptz NOT NULL
);

-- The claim's pending arms, by queue, then priority, then claim order.
DROP INDEX IF EXISTS "outbox_pending_keyless";
DROP INDEX IF EXISTS "outbox_pending_keyed";

CREATE INDEX IF NOT EXISTS "outbox_pending_keyless"
    ON "outbox" (queue, priority, available_at, created_at, seq)
    WHERE status = 'pending' AND ordering_key IS NULL;

CREATE INDEX IF NOT EXISTS "outbox_pending_keyed"
    ON "outbox" (queue, priority, available_at, created_at, seq)
    WHERE status = 'pending' AND ordering_key IS NOT NULL;

-- The head test's probes, within a key's queue; cancelled rows hold no key.
DROP INDEX IF EXISTS "outbox_ordering";
DROP INDEX IF EXISTS "outbox_ordering_claimed";

CREATE INDEX IF NOT EXISTS "outbox_ordering"
    ON "outbox" (queue, ordering_key, seq)
    WHERE ordering_key IS NOT NULL AND status <> 'delivered' AND status <> 'cancelled';

CREATE INDEX IF NOT EXISTS "outbox_ordering_claimed"
    ON "outbox" (queue, ordering_key) WHERE ordering_key IS NOT NULL AND status = 'claimed';

-- Counting and purging settled rows, cancelled ones among them.
DROP INDEX IF EXISTS "outbox_settled";

CREATE INDEX IF NOT EXISTS "outbox_settled"
    ON "outbox" (status, updated_at)
    WHERE status IN ('delivered', 'dead_lettered', 'cancelled');

-- The functions of 0009, 0012 and 0013 return or take other columns now.
DROP FUNCTION IF EXISTS "outbox_claim"(integer, integer, timestamptz, bigint, bigint, boolean);
DROP FUNCTION IF EXISTS "outbox_claim_heads"(bigint[], text[], timestamptz, bigint, bigint, boolean);
DROP FUNCTION IF EXISTS "outbox_settle"(text[], text[], text[], timestamptz[], bigint[], timestamptz[], text[]);

-- The first pass of a claim (see 0012 for why it is a function with a
-- generic plan), over the queues `p_queues`, each with its limit
-- (`p_limits`) and the attempt cap of its rows without their own
-- (`p_caps`); `p_limit` the most rows in all, `p_walk` the most keyed rows
-- walked per queue and priority.
--
-- For each served queue that is not paused, its priorities are found one
-- by one, highest first, each a probe of the pending index (a skip scan:
-- one probe per priority in use, however many rows each has), until the
-- due rows of the priorities found can fill the queue's limit (keyless
-- rows) or the walk (keyed ones); each priority's due rows are read in
-- claim order up to that limit or walk. A queue of one priority costs two
-- probes more than before, and no count. Within each queue, keyless
-- rows, expired claims and walked keyed rows are taken in claim order
-- (priority, then due time) up to its limit, walked rows tested for heads
-- only until then; the queues' rows are then cut to `p_limit` in the same
-- order. A walk cut short in some queue and priority, where the rows that
-- queue picked do not all come before the walk's last row, may have missed
-- a head that belongs among them: the pass then claims nothing and answers
-- `short`, as before.
--
-- Rows come back as in 0012: `claimed`, `abandoned` (out of attempts, or
-- an expired claim whose cancellation was requested; untouched), `keyed`
-- (left for the second pass) or `short`.
CREATE OR REPLACE FUNCTION "outbox_claim"(
    p_queues text[], p_limits integer[], p_caps bigint[], p_limit integer, p_walk integer,
    p_now timestamptz, p_lease bigint, p_block boolean)
RETURNS TABLE (
    outcome text, key_hash bigint, seq bigint, id text, kind text, name text, payload text,
    trace text, status text, attempts bigint, max_attempts bigint,
    available_at timestamptz, claim_token text, claimed_at timestamptz,
    locked_until timestamptz, last_error text, created_at timestamptz,
    updated_at timestamptz, delivered_at timestamptz, ordering_key text,
    skipped_at timestamptz, max_attempts_set boolean, queue text, priority smallint,
    cancel_requested_at timestamptz)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    -- Statement time, not transaction time: one value for the whole claim.
    v_now timestamptz := coalesce(p_now, statement_timestamp());
BEGIN
    RETURN QUERY
    WITH RECURSIVE served AS MATERIALIZED (
        -- The queues served and not paused, each with its limit and cap.
        SELECT s.queue, s.lim, s.cap
        FROM unnest(p_queues, p_limits, p_caps) AS s (queue, lim, cap)
        WHERE NOT EXISTS (SELECT 1 FROM "outbox_paused" AS z WHERE z.queue = s.queue)),
    keyless_levels (queue, lim, cap, priority, found) AS (
        -- Each served queue's priorities in use by pending keyless rows,
        -- highest first, with the due rows of those above (each counted up
        -- to the limit), until they can fill the queue.
        SELECT s.queue, s.lim, s.cap,
            (SELECT m.priority FROM "outbox" AS m
              WHERE m.status = 'pending' AND m.ordering_key IS NULL AND m.queue = s.queue
              ORDER BY m.priority DESC LIMIT 1),
            0::bigint
        FROM served AS s
        UNION ALL
        SELECT l.queue, l.lim, l.cap,
            (SELECT m.priority FROM "outbox" AS m
              WHERE m.status = 'pending' AND m.ordering_key IS NULL AND m.queue = l.queue
                AND m.priority < l.priority
              ORDER BY m.priority DESC LIMIT 1),
            l.found + (SELECT count(*) FROM (SELECT 1 FROM "outbox" AS m
              WHERE m.status = 'pending' AND m.ordering_key IS NULL AND m.queue = l.queue
                AND m.priority = l.priority AND m.available_at <= v_now LIMIT l.lim) AS d)
        FROM keyless_levels AS l
        WHERE l.priority IS NOT NULL AND l.found < l.lim
          -- A last level is not counted: one priority costs no count.
          AND EXISTS (SELECT 1 FROM "outbox" AS m
              WHERE m.status = 'pending' AND m.ordering_key IS NULL AND m.queue = l.queue
                AND m.priority < l.priority)),
    keyless AS (
        -- Each level's due rows in claim order, up to the queue's limit.
        SELECT x.* FROM keyless_levels AS l
        CROSS JOIN LATERAL (
            SELECT m.id, m.queue, m.priority, m.available_at, m.created_at, m.seq,
                m.ordering_key,
                m.attempts >= (CASE WHEN m.max_attempts_set THEN m.max_attempts ELSE l.cap END)
                    AS abandoned,
                m.ctid AS tid
            FROM "outbox" AS m
            WHERE m.status = 'pending' AND m.ordering_key IS NULL AND m.queue = l.queue
              AND m.priority = l.priority AND m.available_at <= v_now
            ORDER BY m.available_at, m.created_at, m.seq LIMIT l.lim
            FOR UPDATE SKIP LOCKED) AS x
        WHERE l.priority IS NOT NULL),
    expired AS (
        -- Claims whose lease ran out, in served queues, keyed ones only
        -- while still heads; those whose cancellation was requested are
        -- left to the caller to cancel, as `abandoned`.
        SELECT m.id, m.queue, m.priority, m.available_at, m.created_at, m.seq, m.ordering_key,
            (m.attempts >= (CASE WHEN m.max_attempts_set THEN m.max_attempts ELSE s.cap END)
              OR m.cancel_requested_at IS NOT NULL) AS abandoned,
            m.ctid AS tid
        FROM "outbox" AS m JOIN served AS s ON s.queue = m.queue
        WHERE m.status = 'claimed' AND m.locked_until <= v_now
          AND (m.ordering_key IS NULL OR (
            (SELECT e.seq FROM "outbox" AS e
              WHERE e.queue = m.queue AND e.ordering_key = m.ordering_key
                AND e.ordering_key IS NOT NULL
                AND e.status <> 'delivered' AND e.status <> 'cancelled' AND e.seq < m.seq
                AND (e.status <> 'dead_lettered' OR (p_block AND e.skipped_at IS NULL))
              ORDER BY e.seq LIMIT 1) IS NULL
            AND NOT EXISTS (SELECT 1 FROM "outbox" AS e
              WHERE e.queue = m.queue AND e.ordering_key = m.ordering_key
                AND e.ordering_key IS NOT NULL
                AND e.status = 'claimed' AND e.seq > m.seq AND e.locked_until > v_now)))
        ORDER BY m.priority DESC, m.available_at, m.created_at, m.seq LIMIT p_limit
        FOR UPDATE OF m SKIP LOCKED),
    keyed_levels (queue, priority, found) AS (
        -- The same levels, of pending keyed rows, until they can fill the
        -- walk: a walk cut short there either finds the queue its heads or
        -- sends the claim to look each key up.
        SELECT s.queue,
            (SELECT m.priority FROM "outbox" AS m
              WHERE m.status = 'pending' AND m.ordering_key IS NOT NULL AND m.queue = s.queue
              ORDER BY m.priority DESC LIMIT 1),
            0::bigint
        FROM served AS s
        UNION ALL
        SELECT l.queue,
            (SELECT m.priority FROM "outbox" AS m
              WHERE m.status = 'pending' AND m.ordering_key IS NOT NULL AND m.queue = l.queue
                AND m.priority < l.priority
              ORDER BY m.priority DESC LIMIT 1),
            l.found + (SELECT count(*) FROM (SELECT 1 FROM "outbox" AS m
              WHERE m.status = 'pending' AND m.ordering_key IS NOT NULL AND m.queue = l.queue
                AND m.priority = l.priority AND m.available_at <= v_now LIMIT p_walk) AS d)
        FROM keyed_levels AS l
        WHERE l.priority IS NOT NULL AND l.found < p_walk
          AND EXISTS (SELECT 1 FROM "outbox" AS m
              WHERE m.status = 'pending' AND m.ordering_key IS NOT NULL AND m.queue = l.queue
                AND m.priority < l.priority)),
    walk AS MATERIALIZED (
        -- Each level's due keyed rows in claim order, untested, at most
        -- `p_walk`.
        SELECT x.* FROM keyed_levels AS l
        CROSS JOIN LATERAL (
            SELECT m.id, m.queue, m.priority, m.available_at, m.created_at, m.seq,
                m.ordering_key
            FROM "outbox" AS m
            WHERE m.status = 'pending' AND m.ordering_key IS NOT NULL AND m.queue = l.queue
              AND m.priority = l.priority AND m.available_at <= v_now
            ORDER BY m.available_at, m.created_at, m.seq LIMIT p_walk) AS x
        WHERE l.priority IS NOT NULL),
    per_queue AS (
        -- Each queue's three arms in claim order, walked rows tested for
        -- heads only until the queue is full (`OFFSET 0` keeps the test
        -- above the sort).
        SELECT p.* FROM served AS s
        CROSS JOIN LATERAL (
            SELECT u.id, u.queue, u.priority, u.available_at, u.created_at, u.seq,
                u.ordering_key, u.abandoned, u.tid, u.ordering_key IS NOT NULL AS deferred
            FROM (SELECT * FROM (
                    SELECT k.id, k.queue, k.priority, k.available_at, k.created_at, k.seq,
                        k.ordering_key, k.abandoned, k.tid, false AS walked
                    FROM keyless AS k WHERE k.queue = s.queue
                    UNION ALL
                    SELECT x.id, x.queue, x.priority, x.available_at, x.created_at, x.seq,
                        x.ordering_key, x.abandoned, x.tid, false
                    FROM expired AS x WHERE x.queue = s.queue
                    UNION ALL
                    SELECT w.id, w.queue, w.priority, w.available_at, w.created_at, w.seq,
                        w.ordering_key, false, NULL::tid, true
                    FROM walk AS w WHERE w.queue = s.queue) AS a
                  ORDER BY a.priority DESC, a.available_at, a.created_at, a.seq OFFSET 0) AS u
            WHERE NOT u.walked OR (
                (SELECT e.seq FROM "outbox" AS e
                  WHERE e.queue = u.queue AND e.ordering_key = u.ordering_key
                    AND e.ordering_key IS NOT NULL
                    AND e.status <> 'delivered' AND e.status <> 'cancelled' AND e.seq < u.seq
                    AND (e.status <> 'dead_lettered' OR (p_block AND e.skipped_at IS NULL))
                  ORDER BY e.seq LIMIT 1) IS NULL
                AND NOT EXISTS (SELECT 1 FROM "outbox" AS e
                  WHERE e.queue = u.queue AND e.ordering_key = u.ordering_key
                    AND e.ordering_key IS NOT NULL
                    AND e.status = 'claimed' AND e.seq > u.seq AND e.locked_until > v_now))
            LIMIT s.lim) AS p),
    picked AS MATERIALIZED (
        -- The queues' rows together, cut to the claim's limit in claim order.
        SELECT * FROM per_queue AS q
        ORDER BY q.priority DESC, q.available_at, q.created_at, q.seq LIMIT p_limit),
    walk_ends AS (
        -- Per queue and priority: how many rows the walk read, and its last.
        SELECT DISTINCT ON (w.queue, w.priority) w.queue, w.priority, w.available_at,
            w.created_at, w.seq, count(*) OVER (PARTITION BY w.queue, w.priority) AS walked
        FROM walk AS w
        ORDER BY w.queue, w.priority, w.available_at DESC, w.created_at DESC, w.seq DESC),
    cut AS (
        -- Whether some walk was cut short before every row its queue
        -- picked: a head it did not reach might then belong among them.
        SELECT EXISTS (
            SELECT 1 FROM walk_ends AS e JOIN served AS s ON s.queue = e.queue
            WHERE e.walked >= p_walk AND (
                (SELECT count(*) FROM picked AS p WHERE p.queue = e.queue) < s.lim
                OR EXISTS (SELECT 1 FROM picked AS p WHERE p.queue = e.queue
                    AND ROW(-p.priority, p.available_at, p.created_at, p.seq)
                      > ROW(-e.priority, e.available_at, e.created_at, e.seq)))) AS short),
    claimed AS (
        -- By the address of the version the arms locked (see 0012).
        UPDATE "outbox" AS m SET status = 'claimed', attempts = m.attempts + 1,
            claim_token = (SELECT gen_random_uuid()::text) || '.' || m.seq,
            claimed_at = v_now,
            locked_until = v_now + p_lease * interval '1 microsecond',
            updated_at = v_now
        WHERE m.ctid = ANY (ARRAY(
            SELECT p.tid FROM picked AS p WHERE NOT p.abandoned AND NOT p.deferred))
          AND NOT (SELECT c.short FROM cut AS c)
        RETURNING m.seq, m.id, m.kind, m.name, m.payload::text, m.trace, m.status,
            m.attempts, m.max_attempts, m.available_at, m.claim_token, m.claimed_at,
            m.locked_until, m.last_error, m.created_at, m.updated_at, m.delivered_at,
            m.ordering_key, m.skipped_at, m.max_attempts_set, m.queue, m.priority,
            m.cancel_requested_at)
    SELECT 'claimed'::text, NULL::bigint, c.* FROM claimed AS c
    UNION ALL
    SELECT 'abandoned'::text, NULL::bigint, m.seq, m.id, m.kind, m.name, m.payload::text,
        m.trace, m.status, m.attempts, m.max_attempts, m.available_at, m.claim_token,
        m.claimed_at, m.locked_until, m.last_error, m.created_at, m.updated_at,
        m.delivered_at, m.ordering_key, m.skipped_at, m.max_attempts_set, m.queue,
        m.priority, m.cancel_requested_at
    FROM "outbox" AS m JOIN picked AS p ON m.id = p.id
    WHERE p.abandoned AND NOT p.deferred AND NOT (SELECT c.short FROM cut AS c)
    UNION ALL
    SELECT 'keyed'::text, hashtextextended(p.ordering_key, 0), NULL::bigint, p.id, NULL::text,
        NULL::text, NULL::text, NULL::text, NULL::text, NULL::bigint, NULL::bigint,
        NULL::timestamptz, NULL::text, NULL::timestamptz, NULL::timestamptz, NULL::text,
        NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, p.ordering_key,
        NULL::timestamptz, NULL::boolean, p.queue, NULL::smallint, NULL::timestamptz
    FROM picked AS p
    WHERE p.deferred AND NOT (SELECT c.short FROM cut AS c)
    UNION ALL
    SELECT 'short'::text, NULL::bigint, NULL::bigint, NULL::text, NULL::text, NULL::text,
        NULL::text, NULL::text, NULL::text, NULL::bigint, NULL::bigint, NULL::timestamptz,
        NULL::text, NULL::timestamptz, NULL::timestamptz, NULL::text, NULL::timestamptz,
        NULL::timestamptz, NULL::timestamptz, NULL::text, NULL::timestamptz, NULL::boolean,
        NULL::text, NULL::smallint, NULL::timestamptz
    WHERE (SELECT c.short FROM cut AS c);
END
$$;

-- The second pass (see 0009), with the head test within a key's queue and
-- each row's attempt cap its queue's: `p_queues` and `p_caps` name them.
-- An expired claim whose cancellation was requested comes back
-- `abandoned`, like one out of attempts.
CREATE OR REPLACE FUNCTION "outbox_claim_heads"(
    p_hashes bigint[], p_ids text[], p_queues text[], p_caps bigint[], p_now timestamptz,
    p_lease bigint, p_block boolean)
RETURNS TABLE (
    outcome text, key_hash bigint, seq bigint, id text, kind text, name text, payload text,
    trace text, status text, attempts bigint, max_attempts bigint,
    available_at timestamptz, claim_token text, claimed_at timestamptz,
    locked_until timestamptz, last_error text, created_at timestamptz,
    updated_at timestamptz, delivered_at timestamptz, ordering_key text,
    skipped_at timestamptz, max_attempts_set boolean, queue text, priority smallint,
    cancel_requested_at timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
    PERFORM pg_advisory_xact_lock(h) FROM unnest(p_hashes) AS h;
    RETURN QUERY
    WITH fronts AS (
        SELECT m.id,
            (m.attempts >= (CASE WHEN m.max_attempts_set THEN m.max_attempts ELSE s.cap END)
              OR m.cancel_requested_at IS NOT NULL) AS abandoned
        FROM "outbox" AS m JOIN unnest(p_queues, p_caps) AS s (queue, cap) ON s.queue = m.queue
        WHERE m.id = ANY(p_ids)
          AND ((m.status = 'pending' AND m.available_at <= coalesce(p_now, statement_timestamp()))
            OR (m.status = 'claimed' AND m.locked_until <= coalesce(p_now, statement_timestamp())))
          AND m.ordering_key IS NOT NULL
          AND NOT EXISTS (SELECT 1 FROM "outbox_paused" AS z WHERE z.queue = m.queue)
          -- No earlier message of the key in its queue pending or claimed,
          -- nor a dead letter that holds it; no later one claimed.
          AND (SELECT e.seq FROM "outbox" AS e
              WHERE e.queue = m.queue AND e.ordering_key = m.ordering_key
                AND e.ordering_key IS NOT NULL
                AND e.status <> 'delivered' AND e.status <> 'cancelled' AND e.seq < m.seq
                AND (e.status <> 'dead_lettered' OR (p_block AND e.skipped_at IS NULL))
              ORDER BY e.seq LIMIT 1) IS NULL
          AND NOT EXISTS (SELECT 1 FROM "outbox" AS e
              WHERE e.queue = m.queue AND e.ordering_key = m.ordering_key
                AND e.ordering_key IS NOT NULL
                AND e.status = 'claimed' AND e.seq > m.seq
                AND e.locked_until > coalesce(p_now, statement_timestamp()))
        FOR UPDATE OF m SKIP LOCKED),
    claimed AS (
        UPDATE "outbox" AS m SET status = 'claimed', attempts = m.attempts + 1,
            claim_token = gen_random_uuid()::text,
            claimed_at = coalesce(p_now, statement_timestamp()),
            locked_until = coalesce(p_now, statement_timestamp())
                + p_lease * interval '1 microsecond',
            updated_at = coalesce(p_now, statement_timestamp())
        FROM fronts WHERE m.id = fronts.id AND NOT fronts.abandoned
        RETURNING m.seq, m.id, m.kind, m.name, m.payload::text, m.trace, m.status,
            m.attempts, m.max_attempts, m.available_at, m.claim_token, m.claimed_at,
            m.locked_until, m.last_error, m.created_at, m.updated_at, m.delivered_at,
            m.ordering_key, m.skipped_at, m.max_attempts_set, m.queue, m.priority,
            m.cancel_requested_at)
    SELECT 'claimed'::text, NULL::bigint, c.* FROM claimed AS c
    UNION ALL
    SELECT 'abandoned'::text, NULL::bigint, m.seq, m.id, m.kind, m.name, m.payload::text,
        m.trace, m.status, m.attempts, m.max_attempts, m.available_at, m.claim_token,
        m.claimed_at, m.locked_until, m.last_error, m.created_at, m.updated_at,
        m.delivered_at, m.ordering_key, m.skipped_at, m.max_attempts_set, m.queue,
        m.priority, m.cancel_requested_at
    FROM "outbox" AS m JOIN fronts ON m.id = fronts.id WHERE fronts.abandoned;
END
$$;

-- Fenced writes (see 0013), where a retry, a dead letter or a release of
-- a message whose cancellation was requested cancels it instead. Returns
-- one row per id it did not change (`lost`, the claims lost), and one per
-- row it changed that carries a cancellation request (`cancel`: a renewal
-- that should tell its handler, or a failure or release that cancelled
-- it); usually none.
CREATE OR REPLACE FUNCTION "outbox_settle"(
    p_op text[], p_id text[], p_token text[], p_now timestamptz[], p_lease bigint[],
    p_available timestamptz[], p_error text[])
RETURNS TABLE (id text, outcome text)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    IF p_op IS NULL THEN
        -- Deletions only (see 0013).
        RETURN QUERY
        WITH changed AS (
            DELETE FROM "outbox" AS m
            USING unnest(p_id, p_token, p_now) AS v (id, token, now)
            WHERE m.id = v.id AND coalesce(m.status, '') = 'claimed'
              AND m.claim_token = v.token
              AND m.locked_until > coalesce(v.now, statement_timestamp())
            RETURNING m.id)
        SELECT s.id, 'lost'::text FROM unnest(p_id) AS s (id)
        WHERE s.id NOT IN (SELECT c.id FROM changed AS c);
    ELSE
        RETURN QUERY
        WITH deleted AS (
            DELETE FROM "outbox" AS m
            USING unnest(p_op, p_id, p_token, p_now) AS v (op, id, token, now)
            WHERE v.op = 'delete' AND m.id = v.id AND coalesce(m.status, '') = 'claimed'
              AND m.claim_token = v.token
              AND m.locked_until > coalesce(v.now, statement_timestamp())
            RETURNING m.id, false AS cancel),
        updated AS (
            UPDATE "outbox" AS m SET
                status = CASE
                    WHEN v.op = 'renew' THEN 'claimed'
                    WHEN v.op = 'deliver' THEN 'delivered'
                    WHEN m.cancel_requested_at IS NOT NULL THEN 'cancelled'
                    WHEN v.op = 'dead' THEN 'dead_lettered'
                    ELSE 'pending' END,
                attempts = CASE v.op WHEN 'release' THEN greatest(m.attempts - 1, 0)
                    ELSE m.attempts END,
                available_at = CASE v.op WHEN 'retry' THEN v.available
                    WHEN 'release' THEN coalesce(v.now, statement_timestamp())
                    ELSE m.available_at END,
                claim_token = CASE v.op WHEN 'renew' THEN m.claim_token END,
                claimed_at = CASE v.op WHEN 'renew' THEN m.claimed_at END,
                locked_until = CASE v.op WHEN 'renew'
                    THEN coalesce(v.now, statement_timestamp()) + v.lease * interval '1 microsecond'
                    END,
                last_error = CASE WHEN v.op IN ('retry', 'dead') THEN v.error
                    ELSE m.last_error END,
                delivered_at = CASE v.op WHEN 'deliver' THEN coalesce(v.now, statement_timestamp())
                    ELSE m.delivered_at END,
                updated_at = coalesce(v.now, statement_timestamp())
            FROM unnest(p_op, p_id, p_token, p_now, p_lease, p_available, p_error)
                AS v (op, id, token, now, lease, available, error)
            WHERE v.op <> 'delete' AND m.id = v.id AND coalesce(m.status, '') = 'claimed'
              AND m.claim_token = v.token
              AND m.locked_until > coalesce(v.now, statement_timestamp())
            RETURNING m.id, v.op <> 'deliver' AND m.cancel_requested_at IS NOT NULL AS cancel),
        changed AS (SELECT d.id, d.cancel FROM deleted AS d
            UNION ALL SELECT u.id, u.cancel FROM updated AS u)
        SELECT s.id, 'lost'::text FROM unnest(p_id) AS s (id)
        WHERE s.id NOT IN (SELECT c.id FROM changed AS c)
        UNION ALL
        SELECT c.id, 'cancel'::text FROM changed AS c WHERE c.cancel;
    END IF;
END
$$;
