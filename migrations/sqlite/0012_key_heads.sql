-- Each ordering key's head, flagged on its row and kept current by
-- triggers, so a keyed claim reads the heads in claim order instead of
-- walking the messages queued behind them or looking up every key.
--
-- A key's head is its first message by `seq` (in its queue) that is
-- pending or claimed. `head` is 1 on that row and 0 on every other; the
-- triggers below move it in the transaction of the write that moves the
-- head, whichever statement that is (enqueue, settlement, delete on
-- delivery, cancel, dead letter, requeue), so no write path of the store
-- has to know about it. A claim still runs the full head test on each
-- flagged row (a dead letter may hold the key, a later message may be
-- claimed), so the flag only chooses which rows it tests.

ALTER TABLE "outbox" ADD COLUMN head INTEGER NOT NULL DEFAULT 0;

-- Each key's pending and claimed rows by `seq`: its head is the first,
-- found with one probe however many dead letters come before it.
CREATE INDEX IF NOT EXISTS "outbox_live_keyed"
    ON "outbox" (queue, ordering_key, seq)
    WHERE ordering_key IS NOT NULL AND status IN ('pending', 'claimed');

-- The claim's keyed arm: pending heads by queue, priority and claim order,
-- one entry per key however long its backlog.
CREATE INDEX IF NOT EXISTS "outbox_pending_heads"
    ON "outbox" (queue, priority, available_at, created_at)
    WHERE status = 'pending' AND head = 1;

-- The heads of the rows stored before this migration.
UPDATE "outbox" AS m SET head = 1
WHERE m.ordering_key IS NOT NULL AND m.status IN ('pending', 'claimed')
  AND NOT EXISTS (SELECT 1 FROM "outbox" AS e
    WHERE e.queue = m.queue AND e.ordering_key = m.ordering_key
      AND e.ordering_key IS NOT NULL AND e.status IN ('pending', 'claimed')
      AND e.seq < m.seq);

-- A keyed message enqueued into a key with no pending or claimed message
-- is its head. Its `seq` is the largest, so it never displaces one.
CREATE TRIGGER IF NOT EXISTS "outbox_head_enqueued" AFTER INSERT ON "outbox"
WHEN NEW.ordering_key IS NOT NULL AND NEW.status IN ('pending', 'claimed')
BEGIN
    UPDATE "outbox" SET head = 1
    WHERE seq = NEW.seq AND NOT EXISTS (SELECT 1 FROM "outbox" AS e
        WHERE e.queue = NEW.queue AND e.ordering_key = NEW.ordering_key
          AND e.ordering_key IS NOT NULL AND e.status IN ('pending', 'claimed')
          AND e.seq < NEW.seq);
END;

-- A head that is settled (delivered, dead-lettered, cancelled) hands the
-- flag to its key's next pending or claimed message.
CREATE TRIGGER IF NOT EXISTS "outbox_head_settled" AFTER UPDATE OF status ON "outbox"
WHEN OLD.head = 1 AND NEW.status NOT IN ('pending', 'claimed')
BEGIN
    UPDATE "outbox" SET head = 0 WHERE seq = NEW.seq;
    UPDATE "outbox" SET head = 1
    WHERE seq = (SELECT e.seq FROM "outbox" AS e
        WHERE e.queue = NEW.queue AND e.ordering_key = NEW.ordering_key
          AND e.ordering_key IS NOT NULL AND e.status IN ('pending', 'claimed')
        ORDER BY e.seq LIMIT 1);
END;

-- A settled message pending again (a dead letter requeued) is its key's
-- head when no earlier message of the key is pending or claimed; the head
-- it comes before loses the flag.
CREATE TRIGGER IF NOT EXISTS "outbox_head_requeued" AFTER UPDATE OF status ON "outbox"
WHEN NEW.ordering_key IS NOT NULL AND OLD.status NOT IN ('pending', 'claimed')
  AND NEW.status IN ('pending', 'claimed')
BEGIN
    UPDATE "outbox" SET head = 0
    WHERE seq > NEW.seq AND seq = (SELECT e.seq FROM "outbox" AS e
        WHERE e.queue = NEW.queue AND e.ordering_key = NEW.ordering_key
          AND e.ordering_key IS NOT NULL AND e.status IN ('pending', 'claimed')
          AND e.seq <> NEW.seq
        ORDER BY e.seq LIMIT 1);
    UPDATE "outbox" SET head = 1
    WHERE seq = NEW.seq AND NOT EXISTS (SELECT 1 FROM "outbox" AS e
        WHERE e.queue = NEW.queue AND e.ordering_key = NEW.ordering_key
          AND e.ordering_key IS NOT NULL AND e.status IN ('pending', 'claimed')
          AND e.seq < NEW.seq);
END;

-- A head deleted (on delivery) hands the flag on as a settled one does.
-- Purges delete settled rows only, which hold no flag.
CREATE TRIGGER IF NOT EXISTS "outbox_head_deleted" AFTER DELETE ON "outbox"
WHEN OLD.head = 1
BEGIN
    UPDATE "outbox" SET head = 1
    WHERE seq = (SELECT e.seq FROM "outbox" AS e
        WHERE e.queue = OLD.queue AND e.ordering_key = OLD.ordering_key
          AND e.ordering_key IS NOT NULL AND e.status IN ('pending', 'claimed')
        ORDER BY e.seq LIMIT 1);
END;
