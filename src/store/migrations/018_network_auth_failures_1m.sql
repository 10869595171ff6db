-- The 401s of every network per key and minute, for credential stuffing across replicas: each
-- replica's own tally (src/detect/source-spray.ts) sees the keys of its partitions only, about 1/R of
-- a spray's keys with R replicas. The replica that owns partition 0 finds here, every
-- SPRAY_ACROSS_REPLICAS_MS, the keys of every partition that failed from a network that failed for
-- many keys (one of them on another replica's partition), then reads those keys' requests from the
-- network in request_events (EventStore.sprayedRequests), and judges the whole spray. Only 401s come here, so the view
-- costs an insert next to nothing. Kept a day: the spray window is 10 minutes. A crash between the
-- views' parts of one insert may leave it short of a few 401s, which repairViews does not add back
-- (they matter for minutes only). The same deduplication window as the other views' tables (010).
-- A network is the /24 of an IPv4 address (stored IPv4-mapped, so a /120) or the /64 of an IPv6 one,
-- as in key_networks_1d (007) and rules/network.ts.
CREATE TABLE IF NOT EXISTS {{db}}.network_auth_failures_1m
(
    minute           DateTime('UTC')                                     COMMENT 'start of the minute (UTC) of the 401s',
    network          IPv6                                                COMMENT 'first address of the /24 (IPv4-mapped) or /64',
    source_topic     LowCardinality(String)                              COMMENT 'Kafka topic, empty for HTTP ingest',
    source_partition Int32                                               COMMENT 'Kafka partition, -1 for HTTP ingest',
    merchant_id      String                                              COMMENT 'tenant',
    api_key_id       String                                              COMMENT 'public key id',
    plan             LowCardinality(String)                              COMMENT 'plan at the time of the requests',
    failures         SimpleAggregateFunction(sum, UInt64)                COMMENT '401s in the minute',
    first_failure    SimpleAggregateFunction(min, DateTime64(3, 'UTC')) COMMENT 'first 401 in the minute',
    last_failure     SimpleAggregateFunction(max, DateTime64(3, 'UTC')) COMMENT 'last 401 in the minute'
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMMDD(minute)
ORDER BY (minute, network, merchant_id, api_key_id, plan, source_topic, source_partition)
TTL minute + INTERVAL 1 DAY
SETTINGS non_replicated_deduplication_window = 10000
COMMENT '401s per network, key and minute, for credential stuffing across replicas';

CREATE MATERIALIZED VIEW IF NOT EXISTS {{db}}.network_auth_failures_1m_mv TO {{db}}.network_auth_failures_1m AS
SELECT
    toStartOfMinute(ts)                 AS minute,
    IPv6CIDRToRange(ip, if(ip BETWEEN toIPv6('::ffff:0.0.0.0') AND toIPv6('::ffff:255.255.255.255'), 120, 64)).1 AS network,
    source_topic,
    source_partition,
    merchant_id,
    api_key_id,
    plan,
    count()                             AS failures,
    min(ts)                             AS first_failure,
    max(ts)                             AS last_failure
FROM {{db}}.request_events
WHERE status = 401
GROUP BY minute, network, source_topic, source_partition, merchant_id, api_key_id, plan;
