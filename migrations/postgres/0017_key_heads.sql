-- Each ordering key's head, flagged on its row and kept current by
-- triggers, so a keyed claim reads the heads in claim order instead of
-- walking the messages queued behind them or looking up every key.
--
-- A key's head is its first message by `seq` (in its queue) that is
-- pending or claimed. The triggers below flag it in the transaction of
-- the write that moves it, whichever statement that is (enqueue,
-- settlement, delete on delivery, cancel, dead letter, requeue), so no
-- write path of the store has to know about it. A claim still runs the
-- full head test on each flagged row, so the flag only chooses which rows
-- it tests: another row may carry a stale flag for a while (see below),
-- which costs a claim one failed test and is cleared at the key's next
-- move; the head itself is never left without one.
--
-- Writers of one key are put in order on its row in "outbox_keys". A
-- write that moves a head (a message of the key settled, deleted,
-- cancelled or requeued) locks that row and bumps it, then flags the head
-- as a fresh snapshot shows it. An enqueue flags its own message only at
-- commit (a deferred trigger), after share-locking the row: a move of the
-- head that has not committed yet is waited for, and one that committed
-- while the enqueue ran is seen (under READ COMMITTED each statement of
-- the trigger takes a new snapshot; under REPEATABLE READ or SERIALIZABLE
-- it cannot be seen, and the message is flagged whatever it is, so a head
-- is never missed). Enqueues of one key never wait for each other, and a
-- settlement waits only for enqueues of its key that are committing.

ALTER TABLE "outbox" ADD COLUMN IF NOT EXISTS head boolean NOT NULL DEFAULT false;

-- One row per (queue, ordering key) that has had a message since this
-- migration (or a pending or claimed one at it): what the writers of the
-- key lock. `moves` counts the moves of its head.
CREATE TABLE IF NOT EXISTS "outbox_keys" (
    queue        text   COLLATE "C" NOT NULL,
    ordering_key text   COLLATE "C" NOT NULL,
    moves        bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, ordering_key)
);

-- Each key's pending and claimed rows by `seq`: its head is the first,
-- found with one probe however many dead letters come before it.
CREATE INDEX IF NOT EXISTS "outbox_live_keyed"
    ON "outbox" (queue, ordering_key, seq)
    WHERE ordering_key IS NOT NULL AND status IN ('pending', 'claimed');

-- The flagged rows of a key, to clear a stale flag.
CREATE INDEX IF NOT EXISTS "outbox_key_head"
    ON "outbox" (queue, ordering_key) WHERE head;

-- The claim's keyed arm: pending heads by queue, priority and claim order,
-- one entry per key however long its backlog.
CREATE INDEX IF NOT EXISTS "outbox_pending_heads"
    ON "outbox" (queue, priority, available_at, created_at, seq)
    WHERE status = 'pending' AND head;

-- The heads and keys of the rows stored before this migration.
UPDATE "outbox" AS m SET head = true
WHERE m.ordering_key IS NOT NULL AND m.status IN ('pending', 'claimed') AND NOT m.head
  AND NOT EXISTS (SELECT 1 FROM "outbox" AS e
    WHERE e.queue = m.queue AND e.ordering_key = m.ordering_key
      AND e.ordering_key IS NOT NULL AND e.status IN ('pending', 'claimed')
      AND e.seq < m.seq);

INSERT INTO "outbox_keys" (queue, ordering_key)
SELECT DISTINCT m.queue, m.ordering_key FROM "outbox" AS m
WHERE m.ordering_key IS NOT NULL AND m.status IN ('pending', 'claimed')
ON CONFLICT DO NOTHING;

-- Flag the head of (`p_queue`, `p_key`) as this statement's snapshot
-- shows it, and clear any other flag of the key. These functions price
-- sequential scans out, as the claim does (see 0012): a plan kept from
-- when the table was nearly empty would otherwise scan it on every write
-- of a key, and a backlog of one key enqueued in one transaction would
-- cost its square. A flag held under
-- another transaction's row lock is left for the key's next move rather
-- than waited for: a stale flag costs a claim a failed head test, a wait
-- could close a cycle with that transaction.
CREATE OR REPLACE FUNCTION "outbox_flag_head"(p_queue text, p_key text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off
AS $$
DECLARE
    v_seq bigint;
    v_id text;
    v_flagged boolean;
BEGIN
    SELECT m.seq, m.id, m.head INTO v_seq, v_id, v_flagged FROM "outbox" AS m
    WHERE m.queue = p_queue AND m.ordering_key = p_key AND m.ordering_key IS NOT NULL
      AND m.status IN ('pending', 'claimed')
    ORDER BY m.seq LIMIT 1;
    UPDATE "outbox" AS m SET head = false
    WHERE m.id IN (SELECT f.id FROM "outbox" AS f
        WHERE f.queue = p_queue AND f.ordering_key = p_key AND f.head
          AND f.seq IS DISTINCT FROM v_seq
        FOR UPDATE SKIP LOCKED);
    IF v_id IS NOT NULL AND NOT v_flagged THEN
        UPDATE "outbox" AS m SET head = true WHERE m.id = v_id;
    END IF;
END
$$;

-- A message that moves its key's head: one that stops being pending or
-- claimed while flagged, one that is pending again (a dead letter
-- requeued), or a flagged one deleted.
CREATE OR REPLACE FUNCTION "outbox_head_moved"()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off
AS $$
DECLARE
    v_row "outbox";
BEGIN
    IF TG_OP = 'DELETE' THEN
        v_row := OLD;
    ELSE
        v_row := NEW;
    END IF;
    INSERT INTO "outbox_keys" AS k (queue, ordering_key)
    VALUES (v_row.queue, v_row.ordering_key)
    ON CONFLICT (queue, ordering_key) DO UPDATE SET moves = k.moves + 1;
    PERFORM "outbox_flag_head"(v_row.queue, v_row.ordering_key);
    RETURN NULL;
END
$$;

-- A keyed message enqueued, before it is stored: flagged when its
-- statement sees no pending or claimed message of its key (earlier rows
-- of the same statement included), so that most enqueues need no second
-- write of their row. A guess, which the check at commit corrects.
CREATE OR REPLACE FUNCTION "outbox_head_guessed"()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off
AS $$
BEGIN
    NEW.head := NEW.status IN ('pending', 'claimed') AND NOT EXISTS (SELECT 1 FROM "outbox" AS e
        WHERE e.queue = NEW.queue AND e.ordering_key = NEW.ordering_key
          AND e.ordering_key IS NOT NULL AND e.status IN ('pending', 'claimed'));
    RETURN NEW;
END
$$;

-- A keyed message enqueued, at its transaction's commit. Under
-- REPEATABLE READ or SERIALIZABLE the transaction's snapshot may predate
-- a move of the head that committed since, and the lock would fail with a
-- serialization error: the message is flagged instead, a flag the claim's
-- head test passes over until the key's next move clears it if stale.
CREATE OR REPLACE FUNCTION "outbox_head_enqueued"()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off
AS $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        UPDATE "outbox" AS m SET head = true
        WHERE m.id = NEW.id AND NOT m.head AND m.status IN ('pending', 'claimed');
        RETURN NULL;
    END IF;
    INSERT INTO "outbox_keys" (queue, ordering_key) VALUES (NEW.queue, NEW.ordering_key)
    ON CONFLICT DO NOTHING;
    PERFORM 1 FROM "outbox_keys" AS k
    WHERE k.queue = NEW.queue AND k.ordering_key = NEW.ordering_key FOR SHARE;
    PERFORM "outbox_flag_head"(NEW.queue, NEW.ordering_key);
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS "outbox_head_settled" ON "outbox";
CREATE TRIGGER "outbox_head_settled" AFTER UPDATE OF status ON "outbox"
FOR EACH ROW
WHEN (NEW.ordering_key IS NOT NULL
    AND (OLD.status IN ('pending', 'claimed')) <> (NEW.status IN ('pending', 'claimed'))
    AND (OLD.head OR NEW.status IN ('pending', 'claimed')))
EXECUTE FUNCTION "outbox_head_moved"();

DROP TRIGGER IF EXISTS "outbox_head_deleted" ON "outbox";
CREATE TRIGGER "outbox_head_deleted" AFTER DELETE ON "outbox"
FOR EACH ROW WHEN (OLD.head)
EXECUTE FUNCTION "outbox_head_moved"();

DROP TRIGGER IF EXISTS "outbox_head_guessed" ON "outbox";
CREATE TRIGGER "outbox_head_guessed" BEFORE INSERT ON "outbox"
FOR EACH ROW WHEN (NEW.ordering_key IS NOT NULL)
EXECUTE FUNCTION "outbox_head_guessed"();

DROP TRIGGER IF EXISTS "outbox_head_enqueued" ON "outbox";
CREATE CONSTRAINT TRIGGER "outbox_head_enqueued" AFTER INSERT ON "outbox"
DEFERRABLE INITIALLY DEFERRED
FOR EACH ROW WHEN (NEW.ordering_key IS NOT NULL)
EXECUTE FUNCTION "outbox_head_enqueued"();

-- The first pass of a claim (see 0014), whose keyed arm reads the pending
-- heads of each served queue, level by level of priority as the keyless
-- arm does, up to the queue's limit of those that pass the head test;
-- they are left to the second pass, as before. It never answers `short`
-- now: a walk of tested heads cannot miss one that belongs in the claim,
-- so the lookup of every key's head is no longer needed. `p_walk` is no
-- longer read; the function keeps its signature.
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

-- The second pass (see 0014), as the first claims: one random part for
-- the claim's tokens, each row's `seq` after it, and the rows claimed by
-- the address of the version `fronts` locked rather than by a lookup of
-- each id; its plan made once per connection, sequential scans and JIT
-- compilation priced out (see 0012).
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
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    PERFORM pg_advisory_xact_lock(h) FROM unnest(p_hashes) AS h;
    RETURN QUERY
    WITH fronts AS (
        SELECT m.id, m.ctid AS tid,
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
            claim_token = (SELECT gen_random_uuid()::text) || '.' || m.seq,
            claimed_at = coalesce(p_now, statement_timestamp()),
            locked_until = coalesce(p_now, statement_timestamp())
                + p_lease * interval '1 microsecond',
            updated_at = coalesce(p_now, statement_timestamp())
        WHERE m.ctid = ANY (ARRAY(SELECT f.tid FROM fronts AS f WHERE NOT f.abandoned))
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
