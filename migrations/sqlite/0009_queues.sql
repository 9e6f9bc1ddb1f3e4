-- Named queues, priorities and cancellation.
--
-- Every message has a queue (existing rows join `default`) and a priority
-- (0 for existing rows; higher is claimed first within a queue). A claim
-- serves a set of queues, each with its own limit, skips the paused ones
-- (a table of their own, read in the claim's statement), and reads each
-- queue's pending rows level by level of priority from its partial index:
-- within a level the due rows are a prefix of the index, so no scheduled
-- row is ever walked, whatever its priority. An ordering key's order holds
-- within its queue, so the key indexes lead with the queue.
--
-- A message can be cancelled: pending, it becomes `cancelled` at once;
-- under a live claim, `cancel_requested_at` records the request (the fence
-- columns are left alone), renewals report it, and a settlement that
-- would retry, dead-letter or release the message cancels it instead.
--
-- SQLite cannot change a CHECK constraint, and the status check of 0001
-- knows four statuses: the table is rebuilt with the new columns and
-- copied over, rowids (`seq`) kept, in the migration's transaction. The
-- copy reads and writes every row once.

CREATE TABLE "outbox_rebuilt" (
    seq                 INTEGER PRIMARY KEY,
    id                  TEXT    NOT NULL UNIQUE,
    kind                TEXT    NOT NULL CHECK (kind IN ('event', 'job')),
    name                TEXT    NOT NULL,
    payload             TEXT    NOT NULL,
    trace               TEXT,
    status              TEXT    NOT NULL DEFAULT 'pending'
                                CHECK (status IN ('pending', 'claimed', 'delivered',
                                                  'dead_lettered', 'cancelled')),
    attempts            INTEGER NOT NULL DEFAULT 0,
    max_attempts        INTEGER NOT NULL CHECK (max_attempts >= 1),
    available_at        INTEGER NOT NULL,
    claim_token         TEXT,
    claimed_at          INTEGER,
    locked_until        INTEGER,
    last_error          TEXT,
    created_at          INTEGER NOT NULL,
    updated_at          INTEGER NOT NULL,
    delivered_at        INTEGER,
    ordering_key        TEXT,
    skipped_at          INTEGER,
    idempotency_key     TEXT,
    idempotency_until   INTEGER,
    max_attempts_set    INTEGER NOT NULL DEFAULT 0 CHECK (max_attempts_set IN (0, 1)),
    queue               TEXT    NOT NULL DEFAULT 'default',
    priority            INTEGER NOT NULL DEFAULT 0,
    cancel_requested_at INTEGER
);

INSERT INTO "outbox_rebuilt" (seq, id, kind, name, payload, trace, status, attempts,
    max_attempts, available_at, claim_token, claimed_at, locked_until, last_error, created_at,
    updated_at, delivered_at, ordering_key, skipped_at, idempotency_key, idempotency_until,
    max_attempts_set)
SELECT seq, id, kind, name, payload, trace, status, attempts, max_attempts, available_at,
    claim_token, claimed_at, locked_until, last_error, created_at, updated_at, delivered_at,
    ordering_key, skipped_at, idempotency_key, idempotency_until, max_attempts_set
FROM "outbox";

DROP TABLE "outbox";

ALTER TABLE "outbox_rebuilt" RENAME TO "outbox";

-- The claim's pending arms, by queue, then priority, then claim order (the
-- rowid, `seq`, is the last column of every index).
CREATE INDEX IF NOT EXISTS "outbox_pending_keyless"
    ON "outbox" (queue, priority, available_at, created_at)
    WHERE status = 'pending' AND ordering_key IS NULL;

CREATE INDEX IF NOT EXISTS "outbox_pending_keyed"
    ON "outbox" (queue, priority, available_at, created_at)
    WHERE status = 'pending' AND ordering_key IS NOT NULL;

-- The claim's expired arm.
CREATE INDEX IF NOT EXISTS "outbox_claimed"
    ON "outbox" (locked_until) WHERE status = 'claimed';

-- Listing, oldest first, with a stable cursor.
CREATE INDEX IF NOT EXISTS "outbox_created"
    ON "outbox" (created_at, id);

-- Counting and purging settled rows, cancelled ones among them.
CREATE INDEX IF NOT EXISTS "outbox_settled"
    ON "outbox" (status, updated_at)
    WHERE status IN ('delivered', 'dead_lettered', 'cancelled');

-- The head test's probes, within a key's queue; cancelled rows hold no key.
CREATE INDEX IF NOT EXISTS "outbox_ordering"
    ON "outbox" (queue, ordering_key, seq)
    WHERE ordering_key IS NOT NULL AND status <> 'delivered' AND status <> 'cancelled';

CREATE INDEX IF NOT EXISTS "outbox_ordering_claimed"
    ON "outbox" (queue, ordering_key) WHERE ordering_key IS NOT NULL AND status = 'claimed';

-- At most one row holds an idempotency key.
CREATE UNIQUE INDEX IF NOT EXISTS "outbox_idempotency"
    ON "outbox" (idempotency_key) WHERE idempotency_key IS NOT NULL;

-- The paused queues, named like the table; `paused_at` in µs since the
-- epoch.
CREATE TABLE IF NOT EXISTS "outbox_paused" (
    queue     TEXT    PRIMARY KEY,
    paused_at INTEGER NOT NULL
);
