-- The idempotency index holds only rows that have a key.
--
-- The index of 0002 held every row, NULL keys included: every enqueue wrote
-- an entry into it. Rows without a key now write none. Uniqueness among the
-- keys is unchanged, and the enqueue's `ON CONFLICT DO NOTHING` (no
-- conflict target) still uses it.

DROP INDEX IF EXISTS "outbox_idempotency";

CREATE UNIQUE INDEX IF NOT EXISTS "outbox_idempotency"
    ON "outbox" (idempotency_key) WHERE idempotency_key IS NOT NULL;
