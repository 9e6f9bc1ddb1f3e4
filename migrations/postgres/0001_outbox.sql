-- The outbox table and the indexes of the claim path.
--
-- Every identifier of the outbox is double-quoted ("outbox", "outbox_<suffix>")
-- so a store configured with another table name can render this file for it;
-- nothing else here is quoted.

CREATE TABLE IF NOT EXISTS "outbox" (
    -- Insertion order: the claim order's last tie-break.
    seq          bigint      GENERATED ALWAYS AS IDENTITY,
    -- Byte order, like every other store, whatever the database's collation.
    id           text        COLLATE "C" NOT NULL PRIMARY KEY,
    kind         text        NOT NULL CHECK (kind IN ('event', 'job')),
    name         text        NOT NULL,
    payload      jsonb       NOT NULL,
    -- JSON of the W3C trace carrier.
    trace        text,
    status       text        NOT NULL DEFAULT 'pending'
                             CHECK (status IN ('pending', 'claimed', 'delivered', 'dead_lettered')),
    attempts     bigint      NOT NULL DEFAULT 0,
    max_attempts bigint      NOT NULL CHECK (max_attempts >= 1),
    available_at timestamptz NOT NULL,
    claim_token  text,
    claimed_at   timestamptz,
    locked_until timestamptz,
    -- JSON of the error record. Text, not jsonb: jsonb refuses "\u0000",
    -- which an error message may well contain.
    last_error   text,
    created_at   timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL,
    delivered_at timestamptz
);

-- The claim's first arm, pending and due, in claim order. Settled rows are
-- not in it, so a claim costs the same with any number of them behind it.
CREATE INDEX IF NOT EXISTS "outbox_pending"
    ON "outbox" (available_at, created_at, seq) WHERE status = 'pending';

-- The claim's second arm, claimed with an expired lease.
CREATE INDEX IF NOT EXISTS "outbox_claimed"
    ON "outbox" (locked_until) WHERE status = 'claimed';

-- Listing, oldest first, with a stable cursor.
CREATE INDEX IF NOT EXISTS "outbox_created"
    ON "outbox" (created_at, id);

-- Counting and purging settled rows, without touching the claim path.
CREATE INDEX IF NOT EXISTS "outbox_settled"
    ON "outbox" (status, updated_at) WHERE status IN ('delivered', 'dead_lettered');
