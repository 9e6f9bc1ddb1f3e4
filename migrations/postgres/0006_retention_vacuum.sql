-- Autovacuum settings for a table whose rows are inserted, updated twice and
-- deleted within minutes. With the defaults a table is vacuumed only once a
-- fifth of it is dead, and then slowly (throttled by cost_delay), so a
-- churning outbox grows to several times the size its live rows need.
--
-- A fixed threshold of dead rows starts autovacuum as soon as a few
-- thousand rows churned, and a zero cost delay lets it finish quickly; the
-- table's live rows are few (pending, claimed and retained settled rows),
-- so each run is short. The launcher still visits a database only once per
-- autovacuum_naptime (1 minute by default, a server-wide setting), which
-- is why the retention run also issues a plain VACUUM of its own (see
-- `retention.vacuum_after`).
--
-- Storage parameters only: nothing is rewritten and no data is read.

ALTER TABLE "outbox" SET (
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0
);
