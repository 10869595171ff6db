-- Per-minute rollups per merchant and key, filled by a materialized view on every insert into
-- request_events, so that metrics and dashboards over days never scan raw events.
-- The worker drops redelivered eventIds before they are inserted, so these sums count each once.
CREATE TABLE IF NOT EXISTS {{db}}.request_rollup_1m
(
    merchant_id        String                                  COMMENT 'tenant',
    api_key_id         String                                  COMMENT 'public key id',
    minute             DateTime('UTC')                         COMMENT 'start of the minute (UTC)',
    requests           SimpleAggregateFunction(sum, UInt64)    COMMENT 'all requests',
    successes          SimpleAggregateFunction(sum, UInt64)    COMMENT 'status < 400',
    client_errors      SimpleAggregateFunction(sum, UInt64)    COMMENT 'status 400..499',
    server_errors      SimpleAggregateFunction(sum, UInt64)    COMMENT 'status >= 500',
    auth_failures      SimpleAggregateFunction(sum, UInt64)    COMMENT 'status 401 or 403',
    not_found          SimpleAggregateFunction(sum, UInt64)    COMMENT 'status 404 (probing)',
    rate_limited       SimpleAggregateFunction(sum, UInt64)    COMMENT 'status 429',
    response_time_sum  SimpleAggregateFunction(sum, Float64)   COMMENT 'sum of response_time_ms, for averages',
    response_time_max  SimpleAggregateFunction(max, Float32)   COMMENT 'slowest response in the minute',
    unique_ips         AggregateFunction(uniq, IPv6)           COMMENT 'distinct client IPs, mergeable across minutes'
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(minute)
ORDER BY (merchant_id, minute, api_key_id)
TTL minute + INTERVAL 400 DAY
COMMENT 'per-minute traffic rollup for metrics and dashboards';

CREATE MATERIALIZED VIEW IF NOT EXISTS {{db}}.request_rollup_1m_mv TO {{db}}.request_rollup_1m AS
SELECT
    merchant_id,
    api_key_id,
    toStartOfMinute(ts)                 AS minute,
    count()                             AS requests,
    countIf(status < 400)               AS successes,
    countIf(status >= 400 AND status < 500) AS client_errors,
    countIf(status >= 500)              AS server_errors,
    countIf(status IN (401, 403))       AS auth_failures,
    countIf(status = 404)               AS not_found,
    countIf(status = 429)               AS rate_limited,
    sum(toFloat64(response_time_ms))    AS response_time_sum,
    max(response_time_ms)               AS response_time_max,
    uniqState(ip)                       AS unique_ips
FROM {{db}}.request_events
GROUP BY merchant_id, api_key_id, minute;
