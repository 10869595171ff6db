-- The networks each key was seen from, per day: the first and last request from each, and one of its
-- addresses. Filled by a materialized view on every insert into request_events. Detection warms its
-- memory of a key's networks and places (the last 7 days) from it after a start or a rebalance,
-- reading a few rows per key instead of a week of raw events. Source topic and partition lead the
-- sorting key: a replica reads the partitions it owns.
-- A network is the /24 of an IPv4 address (stored IPv4-mapped, so a /120) or the /64 of an IPv6
-- one, as rules/network.ts counts them; the worker derives the network's name from sample_ip.
CREATE TABLE IF NOT EXISTS {{db}}.key_networks_1d
(
    source_topic     LowCardinality(String)                              COMMENT 'Kafka topic, empty for HTTP ingest',
    source_partition Int32                                               COMMENT 'Kafka partition, -1 for HTTP ingest',
    day              Date                                                COMMENT 'UTC day of the requests',
    merchant_id      String                                              COMMENT 'tenant',
    api_key_id       String                                              COMMENT 'public key id',
    plan             LowCardinality(String)                              COMMENT 'plan at the time of the requests',
    network          IPv6                                                COMMENT 'first address of the /24 (IPv4-mapped) or /64',
    sample_ip        SimpleAggregateFunction(any, IPv6)                  COMMENT 'one address of the network seen that day',
    first_seen       SimpleAggregateFunction(min, DateTime64(3, 'UTC')) COMMENT 'first request from the network that day',
    last_seen        SimpleAggregateFunction(max, DateTime64(3, 'UTC')) COMMENT 'last request from the network that day',
    requests         SimpleAggregateFunction(sum, UInt64)                COMMENT 'requests from the network that day'
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMMDD(day)
ORDER BY (source_topic, source_partition, day, merchant_id, api_key_id, plan, network)
TTL day + INTERVAL 8 DAY
COMMENT 'networks per key per day, for detection''s memory of the last 7 days';

CREATE MATERIALIZED VIEW IF NOT EXISTS {{db}}.key_networks_1d_mv TO {{db}}.key_networks_1d AS
SELECT
    source_topic,
    source_partition,
    toDate(ts)                          AS day,
    merchant_id,
    api_key_id,
    plan,
    IPv6CIDRToRange(ip, if(ip BETWEEN toIPv6('::ffff:0.0.0.0') AND toIPv6('::ffff:255.255.255.255'), 120, 64)).1 AS network,
    any(ip)                             AS sample_ip,
    min(ts)                             AS first_seen,
    max(ts)                             AS last_seen,
    count()                             AS requests
FROM {{db}}.request_events
GROUP BY source_topic, source_partition, day, merchant_id, api_key_id, plan, network;
