-- A decision's reason as of its latest record: the one with the latest expiry (which moves with the
-- alert's evidence), then the latest end. `reason` is anyLast, the row ClickHouse merged or read
-- last: a replica's retried write of an earlier record would put the earlier reason back. A tuple's
-- max compares its elements in order, so this column keeps the latest record's reason through merges.
-- Rows written before this version take their own expiry, end and reason.
ALTER TABLE {{db}}.enforcement_history
    ADD COLUMN IF NOT EXISTS latest_reason SimpleAggregateFunction(max, Tuple(DateTime64(3, 'UTC'), DateTime64(3, 'UTC'), String))
        DEFAULT (expires_at, last_ended_at, reason)
        COMMENT 'the reason of the record with the latest expiry, then end: (expires_at, last_ended_at, reason)';
