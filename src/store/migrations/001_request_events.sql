-- Raw request events, one row per API request seen by the fleet.
-- Duplicates of an eventId (redelivery) collapse on merge: the sorting key ends in event_id and a
-- redelivered event carries the same merchant, key and timestamp. Queries that must count exactly
-- before merges use uniqExact(event_id) or FINAL; the worker also drops redeliveries before insert.
-- {{events_ttl_days}} is replaced at migration time; a changed setting is applied by ALTER afterwards.
CREATE TABLE IF NOT EXISTS {{db}}.request_events
(
    event_id              String                   COMMENT 'unique per request (fleet-assigned)',
    ts                    DateTime64(3, 'UTC')     COMMENT 'when the API received the request',
    merchant_id           String                   COMMENT 'tenant; every query filters on it first',
    plan                  LowCardinality(String)   COMMENT 'free | pro | business | enterprise at the time of the request',
    api_key_id            String                   COMMENT 'public key id (pk_...), never the secret',
    environment           LowCardinality(String)   COMMENT 'test | live',
    ip                    IPv6                     COMMENT 'client address; IPv4 stored as IPv4-mapped IPv6',
    user_agent            String                   COMMENT 'as sent by the client, truncated to 512 chars',
    method                LowCardinality(String)   COMMENT 'HTTP method',
    path                  String                   COMMENT 'route template where the fleet sends one',
    status                UInt16                   COMMENT 'HTTP response status',
    response_time_ms      Float32                  COMMENT 'time to respond',
    rate_limit_per_minute UInt32                   COMMENT 'limit in force for the key (RateLimit-Limit), plan default when absent',
    country               LowCardinality(String)   COMMENT 'ISO 3166-1 alpha-2 from the edge, empty when unknown',
    received_at           DateTime64(3, 'UTC') DEFAULT now64(3) COMMENT 'when the worker stored the event',
    source_topic          LowCardinality(String)   COMMENT 'Kafka topic, empty for HTTP ingest',
    source_partition      Int32                    COMMENT 'Kafka partition, -1 for HTTP ingest',
    source_offset         Int64                    COMMENT 'Kafka offset, -1 for HTTP ingest; restart dedup reads its maximum',
    INDEX received_at_minmax received_at TYPE minmax GRANULARITY 1
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMMDD(ts)
ORDER BY (merchant_id, api_key_id, ts, event_id)
TTL toDateTime(ts) + INTERVAL {{events_ttl_days}} DAY
COMMENT 'raw request metadata, partitioned by day, kept for EVENTS_TTL_DAYS';
