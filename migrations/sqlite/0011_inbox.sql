-- The inbox: the ids of the messages each consumer has applied.
--
-- A consumer of relayed messages inserts (consumer, message_id) in the same
-- transaction as the message's effects. The primary key makes a second
-- copy of a message conflict with the first, and the insert's
-- `ON CONFLICT DO NOTHING` turns that conflict into "already processed"
-- without an error, so the consumer's transaction stays usable.
--
-- Named after the outbox table ("<table>_inbox"), so a database holding
-- several outboxes holds an inbox beside each. Times are INTEGER
-- microseconds since the Unix epoch, UTC, as in the outbox table.

CREATE TABLE IF NOT EXISTS "outbox_inbox" (
    -- Who applied the message: one name per consuming application or
    -- handler, so two consumers of one message each apply it once.
    consumer     TEXT    NOT NULL,
    -- The outbox message id (the `Outbox-Message-Id` header).
    message_id   TEXT    NOT NULL,
    processed_at INTEGER NOT NULL,
    PRIMARY KEY (consumer, message_id)
);

-- Retention: a consumer's oldest rows first, deleted in bounded batches.
CREATE INDEX IF NOT EXISTS "outbox_inbox_retention"
    ON "outbox_inbox" (consumer, processed_at);
