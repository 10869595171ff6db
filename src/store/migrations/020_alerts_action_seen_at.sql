-- When an alert's key holders were last seen doing what its action answers (Alert.actionSeenAt): an
-- enforcement decision lasts its TTL from then, not from last_seen_at, which strangers' requests
-- answered 401 move too. Null in alerts stored before this version, and while no finding throttled
-- or blocked: last_seen_at serves. The 003 table, no longer written, gets it too, in the same place:
-- 004 copies it over column by column (SELECT *).
ALTER TABLE {{db}}.alerts_by_time
    ADD COLUMN IF NOT EXISTS action_seen_at Nullable(DateTime64(3, 'UTC')) COMMENT 'end of the latest finding whose own action (without requests answered 401) throttles or blocks' AFTER last_seen_at;
ALTER TABLE {{db}}.alerts
    ADD COLUMN IF NOT EXISTS action_seen_at Nullable(DateTime64(3, 'UTC')) COMMENT 'end of the latest finding whose own action (without requests answered 401) throttles or blocks' AFTER last_seen_at;
