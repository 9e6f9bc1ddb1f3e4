-- The outbox table and the indexes of the claim path.
--
-- Every identifier of the outbox is double-quoted ("outbox", "outbox_<suffix>")
-- so a store configured with another table name can render this file for it;
-- nothing else here is quoted.
--
-- Times are INTEGER microseconds since the Unix epoch, UTC: exact round trips
-- and integer comparisons on the claim path.

CREATE TABLE IF NOT EXISTS "outbox" (
    -- Insertion order (the rowid): the claim order's last tie-break.
    seq          INTEGER PRIMARY KEY,
    id           TEXT    NOT NULL UNIQUE,
    kind         TEXT    NOT NULL CHECK (kind IN ('event', 'job')),
    name         TEXT    NOT NULL,
    -- JSON text, as enqueued.
    payload      TEXT    NOT NULL,
    -- JSON of the W3C trace carrier.
    trace        TEXT,
    status       TEXT    NOT NULL DEFAULT 'pending'
                         CHECK (status IN ('pending', 'claimed', 'delivered', 'dead_lettered')),
    attempts     INTEGER NOT NULL DEFAULT 0,
    max_attempts INTEGER NOT NULL CHECK (max_attempts >= 1),
    available_at INTEGER NOT NULL,
    claim_token  TEXT,
    claimed_at   INTEGER,
    locked_until INTEGER,
    -- JSON of the error record.
    last_error   TEXT,
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL,
    delivered_at INTEGER
);

-- The claim's first arm, pending and due, in claim order. Settled rows are
-- not in it, so a claim costs the same with any number of them behind it.
CREATE INDEX IF NOT EXISTS "outbox_pending"
    ON "outbox" (available_at, created_at) WHERE status = 'pending';

-- The claim's second arm, claimed with an expired lease.
CREATE INDEX IF NOT EXISTS "outbox_claimed"
    ON "outbox" (locked_until) WHERE status = 'claimed';

-- Listing, oldest first, with a stable cursor.
CREATE INDEX IF NOT EXISTS "outbox_created"
    ON "outbox" (created_at, id);

-- Counting and purging settled rows, without touching the claim path.
CREATE INDEX IF NOT EXISTS "outbox_settled"
    ON "outbox" (status, updated_at) WHERE status IN ('delivered', 'dead_lettered');
