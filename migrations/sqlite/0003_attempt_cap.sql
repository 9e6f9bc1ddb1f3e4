-- Whether a message's attempt cap was given at enqueue. A message without
-- one takes the cap of the worker that claims it (its drain's
-- `retry.max_attempts`, or the library default), so raising the drain's cap
-- raises it for every such message, queued or not.
--
-- Rows enqueued before this column existed stored the old default of 5
-- whenever no cap was given: those follow the drain from now on, and any
-- other value is kept as the message's own.

ALTER TABLE "outbox" ADD COLUMN max_attempts_set INTEGER NOT NULL DEFAULT 0
    CHECK (max_attempts_set IN (0, 1));

UPDATE "outbox" SET max_attempts_set = 1 WHERE max_attempts <> 5;
