-- The common claim and settlement without the general statements' work.
--
-- A claim of one queue that is not paused, with no expired lease, no
-- pending head of an ordering key and one priority among its pending
-- rows, is the keyless arm alone: its rows in claim order, those at their
-- attempt cap left to the caller as `abandoned`. The general statement
-- reaches the same rows through its levels, arms and merge, which cost
-- the server about a tenth more per message than the rows' own writes.
-- Each condition is an index probe; a claim that meets any other case
-- runs the general statement, as before (see 0017). A row that appears
-- between the probes and the claim (a new priority, a head, a lease that
-- runs out) waits for the next claim, as it would had it come just after.
--
-- A settlement whose writes are all deliveries is one `UPDATE` without
-- the cases of the other writes, the deletions' statement or a
-- cancellation's answer (a delivery never reports one, see 0014).

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
    v_queue text;
    v_top smallint;
BEGIN
    IF cardinality(p_queues) = 1 THEN
        v_queue := p_queues[1];
        v_top := (SELECT m.priority FROM "outbox" AS m
            WHERE m.status = 'pending' AND m.ordering_key IS NULL AND m.queue = v_queue
            ORDER BY m.priority DESC LIMIT 1);
        -- The next priority down, probed from the top: the scan stops at the
        -- first entry, where from the bottom it would pass the entries the
        -- rows just claimed keep until a vacuum. In the order of the pending
        -- index, so a generic plan cannot prefer another index and a filter
        -- over every row.
        IF (SELECT m.priority FROM "outbox" AS m
                WHERE m.status = 'pending' AND m.ordering_key IS NULL AND m.queue = v_queue
                  AND m.priority < v_top
                ORDER BY m.priority DESC LIMIT 1) IS NULL
            AND NOT EXISTS (SELECT 1 FROM "outbox_paused" AS z WHERE z.queue = v_queue)
            AND NOT EXISTS (SELECT 1 FROM "outbox" AS m
                WHERE m.status = 'claimed' AND m.locked_until <= v_now AND m.queue = v_queue)
            AND NOT EXISTS (SELECT 1 FROM "outbox" AS m
                WHERE m.status = 'pending' AND m.head AND m.queue = v_queue)
        THEN
            RETURN QUERY
            WITH picked AS MATERIALIZED (
                SELECT m.id,
                    m.attempts >= (CASE WHEN m.max_attempts_set THEN m.max_attempts
                        ELSE p_caps[1] END) AS abandoned,
                    m.ctid AS tid
                FROM "outbox" AS m
                WHERE m.status = 'pending' AND m.ordering_key IS NULL AND m.queue = v_queue
                  AND m.priority = v_top AND m.available_at <= v_now
                ORDER BY m.available_at, m.created_at, m.seq
                LIMIT least(p_limit, p_limits[1])
                FOR UPDATE SKIP LOCKED),
            claimed AS (
                UPDATE "outbox" AS m SET status = 'claimed', attempts = m.attempts + 1,
                    claim_token = (SELECT gen_random_uuid()::text) || '.' || m.seq,
                    claimed_at = v_now,
                    locked_until = v_now + p_lease * interval '1 microsecond',
                    updated_at = v_now
                WHERE m.ctid = ANY (ARRAY(SELECT p.tid FROM picked AS p WHERE NOT p.abandoned))
                RETURNING m.seq, m.id, m.kind, m.name, m.payload::text, m.trace, m.status,
                    m.attempts, m.max_attempts, m.available_at, m.claim_token, m.claimed_at,
                    m.locked_until, m.last_error, m.created_at, m.updated_at, m.delivered_at,
                    m.ordering_key, m.skipped_at, m.max_attempts_set, m.queue, m.priority,
                    m.cancel_requested_at)
            SELECT 'claimed'::text, NULL::bigint, c.* FROM claimed AS c
            UNION ALL
            SELECT 'abandoned'::text, NULL::bigint, m.seq, m.id, m.kind, m.name,
                m.payload::text, m.trace, m.status, m.attempts, m.max_attempts,
                m.available_at, m.claim_token, m.claimed_at, m.locked_until, m.last_error,
                m.created_at, m.updated_at, m.delivered_at, m.ordering_key, m.skipped_at,
                m.max_attempts_set, m.queue, m.priority, m.cancel_requested_at
            FROM "outbox" AS m JOIN picked AS p ON m.id = p.id
            WHERE p.abandoned;
            RETURN;
        END IF;
    END IF;
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
    keyed_levels (queue, lim, priority, found) AS (
        -- The same levels, of the pending heads (flagged, see above), their
        -- due heads counted only when they pass the head test, so a level
        -- of held keys does not hide the levels below it.
        SELECT s.queue, s.lim,
            (SELECT m.priority FROM "outbox" AS m
              WHERE m.status = 'pending' AND m.head AND m.queue = s.queue
              ORDER BY m.priority DESC LIMIT 1),
            0::bigint
        FROM served AS s
        UNION ALL
        SELECT l.queue, l.lim,
            (SELECT m.priority FROM "outbox" AS m
              WHERE m.status = 'pending' AND m.head AND m.queue = l.queue
                AND m.priority < l.priority
              ORDER BY m.priority DESC LIMIT 1),
            l.found + (SELECT count(*) FROM (SELECT 1 FROM "outbox" AS m
              WHERE m.status = 'pending' AND m.head AND m.queue = l.queue
                AND m.priority = l.priority AND m.available_at <= v_now
                AND (SELECT e.seq FROM "outbox" AS e
                WHERE e.queue = m.queue AND e.ordering_key = m.ordering_key
                  AND e.ordering_key IS NOT NULL
                  AND e.status <> 'delivered' AND e.status <> 'cancelled' AND e.seq < m.seq
                  AND (e.status <> 'dead_lettered' OR (p_block AND e.skipped_at IS NULL))
                ORDER BY e.seq LIMIT 1) IS NULL
                AND NOT EXISTS (SELECT 1 FROM "outbox" AS e
                WHERE e.queue = m.queue AND e.ordering_key = m.ordering_key
                  AND e.ordering_key IS NOT NULL
                  AND e.status = 'claimed' AND e.seq > m.seq AND e.locked_until > v_now)
              LIMIT l.lim) AS d)
        FROM keyed_levels AS l
        WHERE l.priority IS NOT NULL AND l.found < l.lim
          AND EXISTS (SELECT 1 FROM "outbox" AS m
              WHERE m.status = 'pending' AND m.head AND m.queue = l.queue
                AND m.priority < l.priority)),
    walk AS MATERIALIZED (
        -- Each level's due heads in claim order that pass the head test, up
        -- to the queue's limit: the heads a queue can take, and the held
        -- ones before them, never a backlog behind a head.
        SELECT x.* FROM keyed_levels AS l
        CROSS JOIN LATERAL (
            SELECT m.id, m.queue, m.priority, m.available_at, m.created_at, m.seq,
                m.ordering_key
            FROM "outbox" AS m
            WHERE m.status = 'pending' AND m.head AND m.queue = l.queue
              AND m.priority = l.priority AND m.available_at <= v_now
              AND (SELECT e.seq FROM "outbox" AS e
              WHERE e.queue = m.queue AND e.ordering_key = m.ordering_key
                AND e.ordering_key IS NOT NULL
                AND e.status <> 'delivered' AND e.status <> 'cancelled' AND e.seq < m.seq
                AND (e.status <> 'dead_lettered' OR (p_block AND e.skipped_at IS NULL))
              ORDER BY e.seq LIMIT 1) IS NULL
              AND NOT EXISTS (SELECT 1 FROM "outbox" AS e
              WHERE e.queue = m.queue AND e.ordering_key = m.ordering_key
                AND e.ordering_key IS NOT NULL
                AND e.status = 'claimed' AND e.seq > m.seq AND e.locked_until > v_now)
            ORDER BY m.available_at, m.created_at, m.seq LIMIT l.lim) AS x
        WHERE l.priority IS NOT NULL),
    per_queue AS (
        -- Each queue's three arms in claim order, up to its limit.
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
            LIMIT s.lim) AS p),
    picked AS MATERIALIZED (
        -- The queues' rows together, cut to the claim's limit in claim order.
        SELECT * FROM per_queue AS q
        ORDER BY q.priority DESC, q.available_at, q.created_at, q.seq LIMIT p_limit),
    claimed AS (
        -- By the address of the version the arms locked (see 0012).
        UPDATE "outbox" AS m SET status = 'claimed', attempts = m.attempts + 1,
            claim_token = (SELECT gen_random_uuid()::text) || '.' || m.seq,
            claimed_at = v_now,
            locked_until = v_now + p_lease * interval '1 microsecond',
            updated_at = v_now
        WHERE m.ctid = ANY (ARRAY(
            SELECT p.tid FROM picked AS p WHERE NOT p.abandoned AND NOT p.deferred))
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
    WHERE p.abandoned AND NOT p.deferred
    UNION ALL
    SELECT 'keyed'::text, hashtextextended(p.ordering_key, 0), NULL::bigint, p.id, NULL::text,
        NULL::text, NULL::text, NULL::text, NULL::text, NULL::bigint, NULL::bigint,
        NULL::timestamptz, NULL::text, NULL::timestamptz, NULL::timestamptz, NULL::text,
        NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, p.ordering_key,
        NULL::timestamptz, NULL::boolean, p.queue, NULL::smallint, NULL::timestamptz
    FROM picked AS p
    WHERE p.deferred;
END
$$;


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
    ELSIF 'deliver' = ALL (p_op) THEN
        RETURN QUERY
        WITH changed AS (
            UPDATE "outbox" AS m SET status = 'delivered', claim_token = NULL,
                claimed_at = NULL, locked_until = NULL,
                delivered_at = coalesce(v.now, statement_timestamp()),
                updated_at = coalesce(v.now, statement_timestamp())
            FROM unnest(p_id, p_token, p_now) AS v (id, token, now)
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
