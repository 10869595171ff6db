-- When an alert's key holders last earned a block (Alert.blockSeenAt): a block lasts its TTL from
-- then, and their later requests that earn only a throttle keep the key throttled, not blocked.
-- Null in alerts stored before this version (action_seen_at, else last_seen_at, serves), and while
-- no finding blocked. In the 003 table too, in the same place, as 020 explains.
ALTER TABLE {{db}}.alerts_by_time
    ADD COLUMN IF NOT EXISTS block_seen_at Nullable(DateTime64(3, 'UTC')) COMMENT 'end of the latest finding whose own action (without requests answered 401) blocks' AFTER action_seen_at;
ALTER TABLE {{db}}.alerts
    ADD COLUMN IF NOT EXISTS block_seen_at Nullable(DateTime64(3, 'UTC')) COMMENT 'end of the latest finding whose own action (without requests answered 401) blocks' AFTER action_seen_at;
