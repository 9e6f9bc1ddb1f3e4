-- The claim's pending arm, split by whether a row has an ordering key.
--
-- Keyless rows are claimed from an index of their own, in claim order, so
-- no backlog of keyed messages stands in front of them. Keyed rows have
-- theirs, which a claim walks only a few rows into, looking for heads (a
-- key's head is its first message, by seq, that is pending or claimed);
-- when those rows hold fewer heads than the claim wants, it looks up each
-- key's head in "outbox_ordering" instead of walking the messages queued
-- behind the heads. Counts of pending rows add the two indexes.

-- The index this replaces. Named like the table (qualified when the table
-- is), so it is dropped from the table's own schema.
DROP INDEX IF EXISTS "outbox_pending";

CREATE INDEX IF NOT EXISTS "outbox_pending_keyless"
    ON "outbox" (available_at, created_at, seq) WHERE status = 'pending' AND ordering_key IS NULL;

CREATE INDEX IF NOT EXISTS "outbox_pending_keyed"
    ON "outbox" (available_at, created_at, seq)
    WHERE status = 'pending' AND ordering_key IS NOT NULL;
