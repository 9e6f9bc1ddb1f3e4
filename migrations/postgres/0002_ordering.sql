-- Ordering keys, skipped dead letters and idempotency keys.
--
-- Messages sharing an ordering_key are delivered one at a time in `seq`
-- order (the identity column). A dead letter an operator skipped keeps its
-- status and gets skipped_at, so the later messages of its key go on. An
-- idempotency key is held by at most one row; the window ends at
-- idempotency_until, after which the next enqueue with the key takes it over.

ALTER TABLE "outbox" ADD COLUMN IF NOT EXISTS ordering_key text COLLATE "C";
ALTER TABLE "outbox" ADD COLUMN IF NOT EXISTS skipped_at timestamptz;
ALTER TABLE "outbox" ADD COLUMN IF NOT EXISTS idempotency_key text COLLATE "C";
ALTER TABLE "outbox" ADD COLUMN IF NOT EXISTS idempotency_until timestamptz;

-- The claim's head test: the unsettled messages of a key, in key order.
-- Delivered rows leave it, so a key costs the same however long its history.
CREATE INDEX IF NOT EXISTS "outbox_ordering"
    ON "outbox" (ordering_key, seq) WHERE ordering_key IS NOT NULL AND status <> 'delivered';

-- The claim's test that no later message of the key is claimed.
CREATE INDEX IF NOT EXISTS "outbox_ordering_claimed"
    ON "outbox" (ordering_key) WHERE ordering_key IS NOT NULL AND status = 'claimed';

-- At most one row holds an idempotency key (NULLs are distinct).
CREATE UNIQUE INDEX IF NOT EXISTS "outbox_idempotency"
    ON "outbox" (idempotency_key);
