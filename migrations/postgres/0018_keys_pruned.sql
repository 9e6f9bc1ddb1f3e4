-- The rows of "outbox_keys" of keys with nothing pending or claimed can
-- go. Keys are often entities (an order, an account), so a row kept for
-- every key ever used grows the table without bound.
--
-- The row is only what the writers of a key lock to take turns (see
-- 0017); nothing is read from it. The store's vacuum (which retention
-- runs call) deletes the rows of idle keys, skipping rows a writer holds,
-- and the next writer of such a key inserts its row again. Not the move
-- that leaves a key idle: a key between two messages would then lose its
-- row every time. Enqueues that insert the rows of the same keys wait on
-- each other, and two business transactions inserting them in opposite
-- orders deadlock at commit; that should stay as rare as a key's first
-- use after a vacuum, not come with every key that went idle.
--
-- An enqueue whose key row went between its insert and its lock (a vacuum
-- deleted it and committed) goes round again, so it never flags its
-- message without the lock.

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
    LOOP
        INSERT INTO "outbox_keys" (queue, ordering_key) VALUES (NEW.queue, NEW.ordering_key)
        ON CONFLICT DO NOTHING;
        PERFORM 1 FROM "outbox_keys" AS k
        WHERE k.queue = NEW.queue AND k.ordering_key = NEW.ordering_key FOR SHARE;
        EXIT WHEN FOUND;
    END LOOP;
    PERFORM "outbox_flag_head"(NEW.queue, NEW.ordering_key);
    RETURN NULL;
END
$$;

-- The rows kept until now for keys with nothing pending or claimed.
DELETE FROM "outbox_keys" AS k
WHERE NOT EXISTS (SELECT 1 FROM "outbox" AS m
    WHERE m.queue = k.queue AND m.ordering_key = k.ordering_key
      AND m.ordering_key IS NOT NULL AND m.status IN ('pending', 'claimed'));
