-- Wake-ups only for drains that wait for one.
--
-- NOTIFY takes a database-wide lock from before a transaction's commit until
-- the commit is flushed, so transactions that send one cannot share a flush:
-- an enqueue that always notified capped durable enqueues at one flush each.
-- So an enqueue notifies only when a drain waits: a drain about to wait sets
-- `idle` (under the exclusive advisory lock below, taken without waiting),
-- and the first enqueue to see it set clears it and notifies every listener.
--
-- UNLOGGED: the flag is worth nothing after a crash (the listeners'
-- connections are gone too, and a drain re-arms after reconnecting), and
-- setting it then needs no flush. One row, id 1.

CREATE UNLOGGED TABLE IF NOT EXISTS "outbox_drains" (
    id smallint PRIMARY KEY CHECK (id = 1),
    idle boolean NOT NULL
);

-- Called by every enqueue that inserted, in its transaction, with the
-- table's channel; returns whether it notified.
--
-- The shared advisory lock, held until the enqueue commits or rolls back,
-- keeps a drain from arming while an enqueue is between its insert and its
-- commit: arming then could be followed by a claim that does not see the
-- insert, and the enqueue, having read the flag before it was set, would not
-- notify. The flag is read by a statement after the lock is taken: in a
-- volatile function each statement takes a new snapshot under READ
-- COMMITTED, so it sees an arming that committed while the lock was waited for.
--
-- Under REPEATABLE READ and SERIALIZABLE the snapshot is the transaction's,
-- possibly older than the arming; reading the flag could miss it, and
-- writing it could fail the caller's transaction with a serialization
-- error. So those always notify, as every enqueue did before.
--
-- The flag is cleared without waiting (SKIP LOCKED): a long transaction
-- that cleared it first must not hold every other enqueue up. An enqueue
-- that finds the flag set notifies whether or not it cleared it, since the
-- one that did may commit late or roll back.
CREATE OR REPLACE FUNCTION "outbox_wake"(channel text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
        PERFORM pg_notify(channel, '');
        RETURN true;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(1869574768, '"outbox_drains"'::regclass::oid::integer);
    IF NOT EXISTS (SELECT FROM "outbox_drains" WHERE idle) THEN
        RETURN false;
    END IF;
    UPDATE "outbox_drains" SET idle = false
        WHERE id IN (SELECT id FROM "outbox_drains" WHERE idle FOR UPDATE SKIP LOCKED);
    PERFORM pg_notify(channel, '');
    RETURN true;
END
$$;
