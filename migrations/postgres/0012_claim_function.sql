-- The first pass of a claim, as a function planned once per connection.
--
-- The claim was a statement whose limit, walk, lease, attempt cap and
-- dead-letter policy were written into its text, so that PostgreSQL would
-- plan it once and reuse the plan rather than plan every run afresh, as it
-- does for the first five runs of a statement with parameters. But each
-- size of claim was then a statement of its own, prepared and planned on
-- each connection of the pool: a drain whose free slots vary claims at
-- every size from one to its concurrency, and a pool hands out its
-- connections in turn. Planning this statement takes 2 to 4 ms, more than
-- running it; at 1 000 messages a second, 193 of 660 claims were planned,
-- and planning was the largest cost of the claim on the server.
--
-- Here the values are parameters and the plan is generic
-- (`plan_cache_mode`): made at the first call on a connection and kept
-- until the table's statistics change. A generic plan cannot see the limit
-- and assumes a tenth of the rows; sequential scans are priced out
-- (`enable_seqscan`) so that a plan made while the table is small, where a
-- scan costs less than an index, still reads the indexes and goes to the
-- claimed rows by address as the table grows. JIT compilation is off: its
-- price for a plan that has priced out a scan would be far above the claim.
--
-- Rows come back as a claim statement's do (see the store's statements):
-- `claimed`; `abandoned` (out of attempts, untouched, for the caller to
-- dead-letter); `keyed` (a head left for a pass holding its key's lock,
-- untouched: every column NULL but `id`, `ordering_key` and `key_hash`); or,
-- alone and with every column NULL, `short` (the walk of keyed rows may have
-- missed a head that belongs in the claim, so it claimed nothing).
--
-- `p_limit` the most rows to claim; `p_walk` the most keyed rows to walk;
-- `p_now` NULL for the database's clock; `p_lease` in microseconds; `p_cap`
-- the attempt cap of rows without their own; `p_block` whether a dead
-- letter holds its key.
CREATE OR REPLACE FUNCTION "outbox_claim"(
    p_limit integer, p_walk integer, p_now timestamptz, p_lease bigint, p_cap bigint,
    p_block boolean)
RETURNS TABLE (
    outcome text, key_hash bigint, seq bigint, id text, kind text, name text, payload text,
    trace text, status text, attempts bigint, max_attempts bigint,
    available_at timestamptz, claim_token text, claimed_at timestamptz,
    locked_until timestamptz, last_error text, created_at timestamptz,
    updated_at timestamptz, delivered_at timestamptz, ordering_key text,
    skipped_at timestamptz, max_attempts_set boolean)
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
    WITH keyless AS (
        -- Pending keyless rows, from their partial index in claim order.
        SELECT m.id, m.available_at, m.created_at, m.seq, m.ordering_key,
            m.attempts >= (CASE WHEN m.max_attempts_set THEN m.max_attempts ELSE p_cap END)
                AS abandoned,
            m.ctid AS tid
        FROM "outbox" AS m
        WHERE m.status = 'pending' AND m.ordering_key IS NULL AND m.available_at <= v_now
        ORDER BY m.available_at, m.created_at, m.seq LIMIT p_limit FOR UPDATE SKIP LOCKED),
    expired AS (
        -- Claims whose lease ran out, keyed ones only while still heads.
        SELECT m.id, m.available_at, m.created_at, m.seq, m.ordering_key,
            m.attempts >= (CASE WHEN m.max_attempts_set THEN m.max_attempts ELSE p_cap END)
                AS abandoned,
            m.ctid AS tid
        FROM "outbox" AS m
        WHERE m.status = 'claimed' AND m.locked_until <= v_now
          AND (m.ordering_key IS NULL OR (
            (SELECT e.seq FROM "outbox" AS e
              WHERE e.ordering_key = m.ordering_key AND e.ordering_key IS NOT NULL
                AND e.status <> 'delivered' AND e.seq < m.seq
                AND (e.status <> 'dead_lettered' OR (p_block AND e.skipped_at IS NULL))
              ORDER BY e.seq LIMIT 1) IS NULL
            AND NOT EXISTS (SELECT 1 FROM "outbox" AS e
              WHERE e.ordering_key = m.ordering_key AND e.ordering_key IS NOT NULL
                AND e.status = 'claimed' AND e.seq > m.seq AND e.locked_until > v_now)))
        ORDER BY m.available_at, m.created_at, m.seq LIMIT p_limit FOR UPDATE SKIP LOCKED),
    walk AS MATERIALIZED (
        -- Pending keyed rows in claim order, untested, at most `p_walk`.
        SELECT m.id, m.available_at, m.created_at, m.seq, m.ordering_key
        FROM "outbox" AS m
        WHERE m.status = 'pending' AND m.ordering_key IS NOT NULL AND m.available_at <= v_now
        ORDER BY m.available_at, m.created_at, m.seq LIMIT p_walk),
    picked AS (
        -- The three in claim order, walked rows tested for heads only until
        -- the claim is full (`OFFSET 0` keeps the test above the sort).
        SELECT u.id, u.available_at, u.created_at, u.seq, u.ordering_key, u.abandoned, u.tid,
            u.ordering_key IS NOT NULL AS deferred
        FROM (SELECT * FROM (SELECT k.*, false AS walked FROM keyless AS k
                UNION ALL SELECT x.*, false FROM expired AS x
                UNION ALL SELECT w.*, false, NULL::tid, true FROM walk AS w) AS a
              ORDER BY a.available_at, a.created_at, a.seq OFFSET 0) AS u
        WHERE NOT u.walked OR (
            (SELECT e.seq FROM "outbox" AS e
              WHERE e.ordering_key = u.ordering_key AND e.ordering_key IS NOT NULL
                AND e.status <> 'delivered' AND e.seq < u.seq
                AND (e.status <> 'dead_lettered' OR (p_block AND e.skipped_at IS NULL))
              ORDER BY e.seq LIMIT 1) IS NULL
            AND NOT EXISTS (SELECT 1 FROM "outbox" AS e
              WHERE e.ordering_key = u.ordering_key AND e.ordering_key IS NOT NULL
                AND e.status = 'claimed' AND e.seq > u.seq AND e.locked_until > v_now))
        LIMIT p_limit),
    cut AS (
        -- Whether the walk was cut short before every row picked: a head it
        -- did not reach might then belong among them.
        SELECT (SELECT count(*) FROM walk) >= p_walk AND (
            (SELECT count(*) FROM picked) < p_limit
            OR (SELECT ROW(p.available_at, p.created_at, p.seq) FROM picked AS p
                ORDER BY p.available_at DESC, p.created_at DESC, p.seq DESC LIMIT 1)
              > (SELECT ROW(w.available_at, w.created_at, w.seq) FROM walk AS w
                ORDER BY w.available_at DESC, w.created_at DESC, w.seq DESC LIMIT 1))
            AS short),
    claimed AS (
        -- By the address of the version the arms locked: a locked version
        -- cannot move before the transaction ends. The tokens share one
        -- random part and differ by `seq`.
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
            m.ordering_key, m.skipped_at, m.max_attempts_set)
    SELECT 'claimed'::text, NULL::bigint, c.* FROM claimed AS c
    UNION ALL
    SELECT 'abandoned'::text, NULL::bigint, m.seq, m.id, m.kind, m.name, m.payload::text,
        m.trace, m.status, m.attempts, m.max_attempts, m.available_at, m.claim_token,
        m.claimed_at, m.locked_until, m.last_error, m.created_at, m.updated_at,
        m.delivered_at, m.ordering_key, m.skipped_at, m.max_attempts_set
    FROM "outbox" AS m JOIN picked AS p ON m.id = p.id
    WHERE p.abandoned AND NOT p.deferred AND NOT (SELECT c.short FROM cut AS c)
    UNION ALL
    SELECT 'keyed'::text, hashtextextended(p.ordering_key, 0), NULL::bigint, p.id, NULL::text,
        NULL::text, NULL::text, NULL::text, NULL::text, NULL::bigint, NULL::bigint,
        NULL::timestamptz, NULL::text, NULL::timestamptz, NULL::timestamptz, NULL::text,
        NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, p.ordering_key,
        NULL::timestamptz, NULL::boolean
    FROM picked AS p
    WHERE p.deferred AND NOT (SELECT c.short FROM cut AS c)
    UNION ALL
    SELECT 'short'::text, NULL::bigint, NULL::bigint, NULL::text, NULL::text, NULL::text,
        NULL::text, NULL::text, NULL::text, NULL::bigint, NULL::bigint, NULL::timestamptz,
        NULL::text, NULL::timestamptz, NULL::timestamptz, NULL::text, NULL::timestamptz,
        NULL::timestamptz, NULL::timestamptz, NULL::text, NULL::timestamptz, NULL::boolean
    WHERE (SELECT c.short FROM cut AS c);
END
$$;
