-- The second pass of a claim that found keyed heads, in one round trip.
--
-- The first pass of a claim leaves the heads it found to this function, by
-- id, with the hashes of their keys in ascending order (so two claimers
-- never wait on each other in a cycle). It takes each key's advisory lock,
-- then claims the heads that are still due heads. In a volatile function
-- each statement takes a new snapshot under READ COMMITTED, so the claim
-- sees every claim of those keys that committed while their locks were
-- waited for: the head test reads a snapshot, which must hold every claim
-- of its key. Before, this took a transaction of its own: `BEGIN` with the
-- locks, the claim, `COMMIT`, three round trips.
--
-- Rows come back as a claim statement's do (see the store's statements):
-- `claimed`, or `abandoned` (out of attempts, untouched, for the caller to
-- dead-letter). `p_now` NULL is the database's clock; `p_cap` the attempt
-- cap of rows without their own; `p_block` whether a dead letter holds its
-- key.
CREATE OR REPLACE FUNCTION "outbox_claim_heads"(
    p_hashes bigint[], p_ids text[], p_now timestamptz, p_lease bigint, p_cap bigint,
    p_block boolean)
RETURNS TABLE (
    outcome text, key_hash bigint, seq bigint, id text, kind text, name text, payload text,
    trace text, status text, attempts bigint, max_attempts bigint,
    available_at timestamptz, claim_token text, claimed_at timestamptz,
    locked_until timestamptz, last_error text, created_at timestamptz,
    updated_at timestamptz, delivered_at timestamptz, ordering_key text,
    skipped_at timestamptz, max_attempts_set boolean)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
    PERFORM pg_advisory_xact_lock(h) FROM unnest(p_hashes) AS h;
    RETURN QUERY
    WITH fronts AS (
        SELECT m.id, m.attempts >= (CASE WHEN m.max_attempts_set THEN m.max_attempts
            ELSE p_cap END) AS abandoned
        FROM "outbox" AS m
        WHERE m.id = ANY(p_ids)
          AND ((m.status = 'pending' AND m.available_at <= coalesce(p_now, statement_timestamp()))
            OR (m.status = 'claimed' AND m.locked_until <= coalesce(p_now, statement_timestamp())))
          AND m.ordering_key IS NOT NULL
          -- No earlier message of the key pending or claimed, nor a dead
          -- letter that holds it; no later one claimed.
          AND (SELECT e.seq FROM "outbox" AS e
              WHERE e.ordering_key = m.ordering_key AND e.ordering_key IS NOT NULL
                AND e.status <> 'delivered' AND e.seq < m.seq
                AND (e.status <> 'dead_lettered' OR (p_block AND e.skipped_at IS NULL))
              ORDER BY e.seq LIMIT 1) IS NULL
          AND NOT EXISTS (SELECT 1 FROM "outbox" AS e
              WHERE e.ordering_key = m.ordering_key AND e.ordering_key IS NOT NULL
                AND e.status = 'claimed' AND e.seq > m.seq
                AND e.locked_until > coalesce(p_now, statement_timestamp()))
        FOR UPDATE SKIP LOCKED),
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
            m.ordering_key, m.skipped_at, m.max_attempts_set)
    SELECT 'claimed'::text, NULL::bigint, c.* FROM claimed AS c
    UNION ALL
    SELECT 'abandoned'::text, NULL::bigint, m.seq, m.id, m.kind, m.name, m.payload::text,
        m.trace, m.status, m.attempts, m.max_attempts, m.available_at, m.claim_token,
        m.claimed_at, m.locked_until, m.last_error, m.created_at, m.updated_at,
        m.delivered_at, m.ordering_key, m.skipped_at, m.max_attempts_set
    FROM "outbox" AS m JOIN fronts ON m.id = fronts.id WHERE fronts.abandoned;
END
$$;
