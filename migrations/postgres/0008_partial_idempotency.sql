-- The idempotency index holds only rows that have a key.
--
-- The index of 0002 held every row, NULL keys included, and a claim or a
-- settlement changes a row's status, which no update can do in place (the
-- status is in the partial indexes' predicates): each of them wrote a new
-- entry into every index of the table, this one too. Rows without a key now
-- write none into it. Uniqueness among the keys is unchanged, and the
-- enqueue's `ON CONFLICT DO NOTHING` (no conflict target) still uses it.
--
-- Rebuilt under the table's lock, in the migration's transaction: enqueues
-- and claims wait for the build, one read of the table.

DROP INDEX IF EXISTS "outbox_idempotency";

CREATE UNIQUE INDEX IF NOT EXISTS "outbox_idempotency"
    ON "outbox" (idempotency_key) WHERE idempotency_key IS NOT NULL;
