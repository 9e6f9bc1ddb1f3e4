-- Fenced writes (settlements and lease renewals), as a function planned
-- once per connection.
--
-- A batch of fenced writes binds its rows as arrays. PostgreSQL plans a
-- statement with parameters afresh for each of its first five runs on a
-- connection, and after that whenever the plan for the values at hand
-- costs less than the one it would reuse: for the arrays of one to five
-- rows a drain sends at a steady rate, it always did. At 1 000 messages a
-- second, 1 280 of 1 444 batches were planned, each about as costly as the
-- write. A generic plan cannot see the arrays' lengths and assumes ten rows
-- each; while the table held a few thousand rows, that plan joined them by
-- hashing a sequential scan of the table.
--
-- Here the plan is generic (`plan_cache_mode`), made at the first call on a
-- connection and kept until the table's statistics change, and sequential
-- scans are priced out (`enable_seqscan`): each row is found by primary
-- key, so a batch costs the same however large the table and however many
-- claims are out. The status test is written (`coalesce`) so that the
-- index of claimed rows does not match it: reading every claim for each
-- batch is what the planner picks otherwise.
--
-- Binds seven arrays of equal length: `p_op` (`renew`, `deliver`, `retry`,
-- `dead`, `release`, `delete`), `p_id`, `p_token`, `p_now` (NULL entries
-- for the database's clock), `p_lease` in microseconds (renew),
-- `p_available` the new `available_at` (retry), `p_error` the
-- `last_error` JSON. A NULL `p_op` means every row is a deletion, and the
-- arrays after `p_now` may then be NULL too. Returns the ids it did not
-- change (the claims lost), usually none; an id sent twice counts as
-- changed if either row was.
CREATE OR REPLACE FUNCTION "outbox_settle"(
    p_op text[], p_id text[], p_token text[], p_now timestamptz[], p_lease bigint[],
    p_available timestamptz[], p_error text[])
RETURNS SETOF text
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    IF p_op IS NULL THEN
        -- Deletions only: where delivered messages are deleted, most
        -- batches are, and the update beside them would run for nothing.
        RETURN QUERY
        WITH changed AS (
            DELETE FROM "outbox" AS m
            USING unnest(p_id, p_token, p_now) AS v (id, token, now)
            WHERE m.id = v.id AND coalesce(m.status, '') = 'claimed'
              AND m.claim_token = v.token
              AND m.locked_until > coalesce(v.now, statement_timestamp())
            RETURNING m.id)
        SELECT s.id FROM unnest(p_id) AS s (id) WHERE s.id NOT IN (SELECT c.id FROM changed AS c);
    ELSE
        -- One statement may not change a row twice: the rows to delete are
        -- left to the delete beside the update, under the same fence. In a
        -- batch without deletions, that delete joins nothing.
        RETURN QUERY
        WITH deleted AS (
            DELETE FROM "outbox" AS m
            USING unnest(p_op, p_id, p_token, p_now) AS v (op, id, token, now)
            WHERE v.op = 'delete' AND m.id = v.id AND coalesce(m.status, '') = 'claimed'
              AND m.claim_token = v.token
              AND m.locked_until > coalesce(v.now, statement_timestamp())
            RETURNING m.id),
        updated AS (
            UPDATE "outbox" AS m SET
                status = CASE v.op WHEN 'renew' THEN 'claimed' WHEN 'deliver' THEN 'delivered'
                    WHEN 'dead' THEN 'dead_lettered' ELSE 'pending' END,
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
            RETURNING m.id),
        changed AS (SELECT d.id FROM deleted AS d UNION ALL SELECT u.id FROM updated AS u)
        SELECT s.id FROM unnest(p_id) AS s (id) WHERE s.id NOT IN (SELECT c.id FROM changed AS c);
    END IF;
END
$$;
