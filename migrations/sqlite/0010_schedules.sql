-- Periodic schedules: one row per schedule, shared by every process that
-- runs it, beside the outbox table it enqueues into.
--
-- A process enqueues a slot of a schedule in one immediate transaction that
-- first moves `last_slot` forward to the slot (only while it is still
-- behind it) and then inserts the slot's message, so of several processes
-- due at the same slot exactly one writes it. A slot at or before
-- `last_slot` is never enqueued again, even after its message was delivered
-- and deleted, which frees its idempotency key.
--
-- Times are INTEGER microseconds since the Unix epoch, UTC, like the outbox
-- table's.

CREATE TABLE IF NOT EXISTS "outbox_schedules" (
    name             TEXT    NOT NULL PRIMARY KEY,
    -- The cadence as declared: `cron <expression>` or `every <interval>`.
    expression       TEXT    NOT NULL,
    -- An IANA time zone name; cron fields are read on its wall clock.
    time_zone        TEXT    NOT NULL,
    -- The name of the message each slot enqueues.
    message_name     TEXT    NOT NULL,
    -- When the schedule was first declared: its first slot is at or after it.
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    -- The latest slot enqueued (or passed over by a catch-up policy).
    last_slot        INTEGER,
    -- The slot after it, as the process that wrote last computed it.
    next_slot        INTEGER,
    -- Which process enqueued `last_slot`, when, and the message's id.
    last_enqueued_by TEXT,
    last_enqueued_at INTEGER,
    last_message_id  TEXT
);
