-- A changed EVENTS_TTL_DAYS must reach the events already stored. ClickHouse deletes a part's expired
-- rows, or drops the whole part, by the TTL info the part was written with, not by the table's
-- current TTL: so the worker recalculates that info when it changes the TTL (ensureEventsTtl in
-- migrate.ts). With this setting the recalculation reads only `ts` and rewrites each part's TTL
-- info, not its rows; the usual TTL merges then delete what the new TTL expires.
ALTER TABLE {{db}}.request_events MODIFY SETTING materialize_ttl_recalculate_only = 1;
-- Parts stored before this migration may still carry the TTL of an earlier EVENTS_TTL_DAYS (the
-- worker used to change it without recalculating them): recalculate them once, in the background.
ALTER TABLE {{db}}.request_events MATERIALIZE TTL SETTINGS mutations_sync = 0;
