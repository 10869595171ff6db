-- Per-merchant traffic per quarter hour: request_rollup_1m's sums without the key, so that metrics
-- and dashboards over days cost the same whatever a merchant's number of keys. A day of a merchant
-- is 96 rows here, against one row per key and minute there (20,000 keys active all day: 28.8M rows,
-- 839 ms for the operators' all-merchants 24h dashboard on the embedded engine).
-- EventStore.trafficTotals and trafficTrend read the whole quarter hours of a range here and its
-- edges (the minutes before the first whole quarter hour and after the last) from request_rollup_1m.
-- Filled by a materialized view of request_events with request_rollup_1m's aggregates, grouped by
-- merchant and quarter hour, so each merchant's quarter hour here holds the sums of its minutes
-- there. (A view of request_rollup_1m would follow it by construction, but merging the minutes' uniq
-- states costs the insert about twice what this view's own aggregation does.) A crash between the
-- views' parts of one insert leaves this table short of request_rollup_1m: EventStore.repairViews
-- adds the difference once that table is whole. The same deduplication window as the other views'
-- tables (010).
CREATE TABLE IF NOT EXISTS {{db}}.merchant_rollup_15m
(
    merchant_id        String                                  COMMENT 'tenant',
    quarter_hour       DateTime('UTC')                         COMMENT 'start of the quarter hour (UTC)',
    requests           SimpleAggregateFunction(sum, UInt64)    COMMENT 'all requests',
    successes          SimpleAggregateFunction(sum, UInt64)    COMMENT 'status < 400',
    client_errors      SimpleAggregateFunction(sum, UInt64)    COMMENT 'status 400..499',
    server_errors      SimpleAggregateFunction(sum, UInt64)    COMMENT 'status >= 500',
    auth_failures      SimpleAggregateFunction(sum, UInt64)    COMMENT 'status 401 or 403',
    not_found          SimpleAggregateFunction(sum, UInt64)    COMMENT 'status 404 (probing)',
    rate_limited       SimpleAggregateFunction(sum, UInt64)    COMMENT 'status 429',
    response_time_sum  SimpleAggregateFunction(sum, Float64)   COMMENT 'sum of response_time_ms, for averages',
    response_time_max  SimpleAggregateFunction(max, Float32)   COMMENT 'slowest response in the quarter hour',
    unique_ips         AggregateFunction(uniq, IPv6)           COMMENT 'distinct client IPs, mergeable with request_rollup_1m''s'
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(quarter_hour)
ORDER BY (merchant_id, quarter_hour)
TTL quarter_hour + INTERVAL 400 DAY
SETTINGS non_replicated_deduplication_window = 10000
COMMENT 'per-merchant traffic per quarter hour, for metrics and dashboards over days';

CREATE MATERIALIZED VIEW IF NOT EXISTS {{db}}.merchant_rollup_15m_mv TO {{db}}.merchant_rollup_15m AS
SELECT
    merchant_id,
    toStartOfFifteenMinutes(ts)         AS quarter_hour,
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
GROUP BY merchant_id, quarter_hour;

-- The backfill: the view sees only what is inserted into request_events after it exists. For each
-- merchant and quarter hour of request_rollup_1m, the shortfall of this table's requests against its
-- sum, added only when there is one (as repairViews adds it): the sums by the difference, the
-- maximum and the distinct IPs by their whole value (merging them again changes nothing). So rows the
-- view already counted (another replica's inserts since the view was created) are not added again,
-- and run again (a crash before this file is recorded) it adds nothing. The fixed token drops the
-- repeat of an attempt that landed although it was reported failed, as in 012. It reads the whole of
-- request_rollup_1m once (up to its 400 days); the grouping spills to disk rather than exhaust memory.
-- What remains, as in 012: an insert whose request_rollup_1m rows are committed and this table's not
-- yet, at the very moment this reads both, is counted here twice -- only in the start that applies 016.
INSERT INTO {{db}}.merchant_rollup_15m
    (merchant_id, quarter_hour, requests, successes, client_errors, server_errors, auth_failures, not_found,
     rate_limited, response_time_sum, response_time_max, unique_ips)
SETTINGS insert_deduplication_token = '016_merchant_rollup_15m', throw_on_max_partitions_per_insert_block = 0,
         max_bytes_before_external_group_by = 1000000000
SELECT merchant_id, quarter_hour,
       greatest(whole.requests - rolled.requests, 0), greatest(whole.successes - rolled.successes, 0),
       greatest(whole.client_errors - rolled.client_errors, 0), greatest(whole.server_errors - rolled.server_errors, 0),
       greatest(whole.auth_failures - rolled.auth_failures, 0), greatest(whole.not_found - rolled.not_found, 0),
       greatest(whole.rate_limited - rolled.rate_limited, 0), greatest(whole.response_time_sum - rolled.response_time_sum, 0),
       whole.response_time_max, whole.unique_ips
  FROM (
    SELECT merchant_id, toStartOfFifteenMinutes(minute) AS quarter_hour,
           sum(requests) AS requests, sum(successes) AS successes, sum(client_errors) AS client_errors,
           sum(server_errors) AS server_errors, sum(auth_failures) AS auth_failures, sum(not_found) AS not_found,
           sum(rate_limited) AS rate_limited, sum(response_time_sum) AS response_time_sum,
           max(response_time_max) AS response_time_max, uniqMergeState(unique_ips) AS unique_ips
      FROM {{db}}.request_rollup_1m
     GROUP BY merchant_id, quarter_hour
  ) AS whole
  LEFT JOIN (
    SELECT merchant_id, quarter_hour,
           sum(requests) AS requests, sum(successes) AS successes, sum(client_errors) AS client_errors,
           sum(server_errors) AS server_errors, sum(auth_failures) AS auth_failures, sum(not_found) AS not_found,
           sum(rate_limited) AS rate_limited, sum(response_time_sum) AS response_time_sum
      FROM {{db}}.merchant_rollup_15m
     GROUP BY merchant_id, quarter_hour
  ) AS rolled USING (merchant_id, quarter_hour)
 WHERE whole.requests > rolled.requests;
