-- A key's row in "outbox_keys" lives only while the key has a pending or
-- claimed message. Keys are often entities (an order, an account), so a
-- row kept for every key ever used grows the table without bound.
--
-- The row is only what the writers of a key lock to take turns (see
-- 0017); nothing is read from it. The move that leaves its key with no
-- pending or claimed message deletes it, holding its lock, and the next
-- writer of the key inserts it again. An enqueue that finds the row gone
-- between its insert and its lock (a move deleted it and committed) goes
-- round again, so it never flags its message without the lock.

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
    -- A fresh snapshot under READ COMMITTED: an enqueue of the key that
    -- committed while this move waited for the lock keeps the row.
    DELETE FROM "outbox_keys" AS k
    WHERE k.queue = v_row.queue AND k.ordering_key = v_row.ordering_key
      AND NOT EXISTS (SELECT 1 FROM "outbox" AS m
          WHERE m.queue = v_row.queue AND m.ordering_key = v_row.ordering_key
            AND m.ordering_key IS NOT NULL AND m.status IN ('pending', 'claimed'));
    RETURN NULL;
END
$$;

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
