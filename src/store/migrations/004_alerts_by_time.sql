-- Alerts sorted by creation time within a merchant, for the admin API: a page of the newest alerts
-- is read in key order and pages continue from (created_at, id), which never change for an alert
-- (so every version of an alert keeps its sort key and ReplacingMergeTree still collapses them).
-- The bloom filter serves look-ups by id. The alerts of 003 are copied over; running this again
-- copies them again, and the copies collapse (same key, same version). The old table is left in
-- place for a later migration to drop once every replica reads the new one.
CREATE TABLE IF NOT EXISTS {{db}}.alerts_by_time
(
    id                 UUID                     COMMENT 'alert id',
    merchant_id        String                   COMMENT 'tenant; every read and write is scoped by it',
    api_key_id         Nullable(String)         COMMENT 'public key id, null when the alert is about an IP alone',
    type               LowCardinality(String)   COMMENT 'velocity_attack | impossible_travel | high_failure_rate | bot_traffic | credential_sharing',
    scope              String                   COMMENT 'dedup scope within (merchant, type): the key id or ip:<addr>',
    severity           LowCardinality(String)   COMMENT 'low | medium | high | critical',
    risk_score         Float32                  COMMENT '0..1, weighted by severity',
    recommended_action LowCardinality(String)   COMMENT 'monitor | rate_limit | investigate | block',
    status             LowCardinality(String)   COMMENT 'open | acknowledged | resolved | dismissed',
    title              String                   COMMENT 'one line for a list',
    summary            String                   COMMENT 'a sentence a person can act on',
    evidence           String                   COMMENT 'JSON object: observed vs threshold, window, distinct values, sample eventIds',
    rule_id            LowCardinality(String)   COMMENT 'rule that fired',
    rule_version       LowCardinality(String)   COMMENT 'its version',
    first_seen_at      DateTime64(3, 'UTC')     COMMENT 'start of the evidence',
    last_seen_at       DateTime64(3, 'UTC')     COMMENT 'end of the evidence',
    occurrences        UInt32                   COMMENT 'times the dedup key fired while this alert was open',
    created_at         DateTime64(3, 'UTC')     COMMENT 'when the alert was created',
    updated_at         DateTime64(3, 'UTC')     COMMENT 'last change',
    history            String                   COMMENT 'JSON array of {at, actor, from, to, note}',
    ai_insights        Array(String)            COMMENT 'only when FEATURE_AI_RISK_SCORING is on',
    version            UInt64                   COMMENT 'increases with every write; the highest wins',
    INDEX id_bloom id TYPE bloom_filter GRANULARITY 1
)
ENGINE = ReplacingMergeTree(version)
PARTITION BY toYYYYMM(created_at)
ORDER BY (merchant_id, created_at, id)
COMMENT 'anomaly alerts with their lifecycle history';

INSERT INTO {{db}}.alerts_by_time SELECT * FROM {{db}}.alerts;
