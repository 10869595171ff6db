-- Enforcement decisions as they started and ended, in shadow mode as in enforce mode: what enforcing
-- did, or would have done, over the last 90 days. DecisionSource writes a row when a decision starts
-- (or a replica first sees it) and when it ends (or changes action, which ends one and starts another).
-- Every replica derives the same decisions and writes the same rows, at slightly different times:
-- rows of one (merchant, key, alert, action, mode) collapse into the earliest start, the latest start
-- and the latest end, so replicas add nothing. A decision that ended and started again for the same
-- alert and action is one row: ended when its latest end is not before its latest start.
CREATE TABLE IF NOT EXISTS {{db}}.enforcement_history
(
    merchant_id      String                                                 COMMENT 'tenant',
    api_key_id       String                                                 COMMENT 'the key the decision is about',
    alert_id         UUID                                                   COMMENT 'the alert behind the decision',
    action           LowCardinality(String)                                 COMMENT 'throttle or block',
    mode             LowCardinality(String)                                 COMMENT 'shadow (not applied) or enforce',
    reason           SimpleAggregateFunction(anyLast, String)               COMMENT 'the alert behind it: type, severity, risk and title',
    first_started_at SimpleAggregateFunction(min, DateTime64(3, 'UTC'))    COMMENT 'when a replica first saw the decision',
    last_started_at  SimpleAggregateFunction(max, DateTime64(3, 'UTC'))    COMMENT 'the latest start a replica saw',
    last_ended_at    SimpleAggregateFunction(max, DateTime64(3, 'UTC'))    COMMENT 'the latest end a replica saw; 1970 when none',
    expires_at       SimpleAggregateFunction(max, DateTime64(3, 'UTC'))    COMMENT 'when it was due to lapse, as last written'
)
ENGINE = AggregatingMergeTree
ORDER BY (merchant_id, api_key_id, alert_id, action, mode)
TTL toDateTime(greatest(last_started_at, last_ended_at)) + INTERVAL 90 DAY
COMMENT 'enforcement decisions, applied or shadow, as they started and ended';
