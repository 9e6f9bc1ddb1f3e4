-- Periodic schedules: one row per schedule, shared by every process that
-- runs it, beside the outbox table it enqueues into.
--
-- A process enqueues a slot of a schedule in one transaction that first
-- moves `last_slot` forward to the slot (only while it is still behind it)
-- and then inserts the slot's message. The update takes the row's lock, so
-- of several processes due at the same slot one moves it and the others,
-- once the lock is released, find it moved and write nothing. A slot at or
-- before `last_slot` is never enqueued again, even after its message was
-- delivered and deleted, which frees its idempotency key.
--
-- Slot times are the draining processes' clock, not the server's: they are
-- compared only with each other.

CREATE TABLE IF NOT EXISTS "outbox_schedules" (
    name             text        PRIMARY KEY,
    -- The cadence as declared: `cron <expression>` or `every <interval>`.
    expression       text        NOT NULL,
    -- An IANA time zone name; cron fields are read on its wall clock.
    time_zone        text        NOT NULL,
    -- The name of the message each slot enqueues.
    message_name     text        NOT NULL,
    -- When the schedule was first declared: its first slot is at or after it.
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    -- The latest slot enqueued (or passed over by a catch-up policy).
    last_slot        timestamptz,
    -- The slot after it, as the process that wrote last computed it.
    next_slot        timestamptz,
    -- Which process enqueued `last_slot`, when, and the message's id.
    last_enqueued_by text,
    last_enqueued_at timestamptz,
    last_message_id  text
);
