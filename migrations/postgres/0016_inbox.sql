-- The inbox: the ids of the messages each consumer has applied.
--
-- A consumer of relayed messages inserts (consumer, message_id) in the same
-- transaction as the message's effects. The primary key makes a second
-- copy of a message conflict with the first, and the insert's
-- `ON CONFLICT DO NOTHING` turns that conflict into "already processed"
-- without an error, so the consumer's transaction stays usable. A copy
-- arriving while the first is still uncommitted waits for that transaction
-- and then sees its row (or, had it rolled back, inserts its own).
--
-- Named after the outbox table ("<table>_inbox"), in its schema, so a
-- database holding several outboxes holds an inbox beside each.

CREATE TABLE IF NOT EXISTS "outbox_inbox" (
    -- Who applied the message: one name per consuming application or
    -- handler, so two consumers of one message each apply it once.
    consumer     text        COLLATE "C" NOT NULL,
    -- The outbox message id (the `Outbox-Message-Id` header).
    message_id   text        COLLATE "C" NOT NULL,
    processed_at timestamptz NOT NULL,
    PRIMARY KEY (consumer, message_id)
);

-- Retention: a consumer's oldest rows first, deleted in bounded batches.
CREATE INDEX IF NOT EXISTS "outbox_inbox_retention"
    ON "outbox_inbox" (consumer, processed_at);
