-- Which of each key's networks detection vouched for (src/detect/key-history.ts): a network of a
-- place tied to the key's own within 30 minutes, or of its first place; recorded by the worker once
-- a day a place vouched for is used. Detection's memory warmed after a start or a rebalance
-- (key_networks_1d) counts a network as the key's only when it is recorded here (or is the first the
-- key was seen from): otherwise what a thief primed while the key was idle would be the key's own
-- after every restart. Kept 8 days, as key_networks_1d; a network recorded on several days keeps
-- its earliest time.
CREATE TABLE IF NOT EXISTS {{db}}.key_vouched_networks_1d
(
    source_topic     LowCardinality(String)                              COMMENT 'Kafka topic, empty for HTTP ingest',
    source_partition Int32                                               COMMENT 'Kafka partition, -1 for HTTP ingest',
    day              Date                                                COMMENT 'UTC day of the record',
    merchant_id      String                                              COMMENT 'tenant',
    api_key_id       String                                              COMMENT 'public key id',
    network          IPv6                                                COMMENT 'first address of the /24 (IPv4-mapped) or /64, as in key_networks_1d',
    vouched_at       SimpleAggregateFunction(min, DateTime64(3, 'UTC')) COMMENT 'when detection vouched for it (that day: the first use)'
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMMDD(day)
ORDER BY (source_topic, source_partition, day, merchant_id, api_key_id, network)
TTL day + INTERVAL 8 DAY
COMMENT 'networks detection vouched for per key per day, for its memory of the last 7 days';

-- A worker upgraded to this version trusted every network key_networks_1d holds (its memory counted
-- any network seen before as the key's): they stay trusted, so the upgrade raises no alert for a
-- key's own regions. Run again, it adds rows whose minimum is already there (the aggregate keeps it).
INSERT INTO {{db}}.key_vouched_networks_1d (source_topic, source_partition, day, merchant_id, api_key_id, network, vouched_at)
SETTINGS throw_on_max_partitions_per_insert_block = 0
SELECT source_topic, source_partition, day, merchant_id, api_key_id, network, min(first_seen)
  FROM {{db}}.key_networks_1d
 GROUP BY source_topic, source_partition, day, merchant_id, api_key_id, network;
