-- Fills key_networks_1d (007) from the events request_events held before 007 created its view: a
-- worker upgraded across 007 had up to 7 days of events stored, and its view sees only inserts made
-- after it exists, so detection's memory of keys' networks and places (warmed from this table) found
-- none of them, and every key's usual networks looked new for up to 7 days.
-- Which groups: those the view would have written (source, day, key, plan, network: the same
-- grouping, network and aggregates as 007's view and as EventStore.repairViews) for an event stored
-- before 007 was applied (received_at, the server's clock at insert, before 007's applied_at, the
-- same clock) and dated in the 8 days the table keeps (TTL day + 8 days: an older day's row would be
-- dropped at insert). A database where 007 was applied long ago has no such event in those days,
-- and a fresh install none at all: this adds nothing there.
-- How much: for each such group, the shortfall of the table's requests against the raw events' count,
-- and only when there is one, as repairViews adds it; first_seen, last_seen and sample_ip are merged
-- as min, max and any, so adding them again changes nothing. Run again (a crash before this file is
-- recorded), it finds no shortfall and adds nothing; nor where the view has counted the group's
-- later events, whose count is not missing. The fixed insert_deduplication_token (migration 010 gave
-- the table a window of 10,000 blocks) drops the repeat of an attempt that landed although it was
-- reported failed (a client timeout on a large table, after which the start is retried), and the
-- insert of a second replica migrating at the same moment, which computed the same rows.
-- What remains: an insert by another replica whose raw rows are committed and its view's rows not
-- yet, at the very moment this reads both, is added here and by the view (a group counted twice for
-- those rows) -- only for groups with events stored before 007, so only in the start that applies 007.
INSERT INTO {{db}}.key_networks_1d
    (source_topic, source_partition, day, merchant_id, api_key_id, plan, network, sample_ip, first_seen, last_seen, requests)
SETTINGS insert_deduplication_token = '012_key_networks_backfill', throw_on_max_partitions_per_insert_block = 0
WITH touched AS (
    SELECT DISTINCT source_topic, source_partition, toDate(ts) AS day, merchant_id, api_key_id, plan,
           IPv6CIDRToRange(ip, if(ip BETWEEN toIPv6('::ffff:0.0.0.0') AND toIPv6('::ffff:255.255.255.255'), 120, 64)).1 AS network
      FROM {{db}}.request_events
     WHERE toDate(ts) >= toDate(now('UTC')) - 7
       AND received_at < (SELECT min(applied_at) FROM {{db}}.schema_migrations WHERE version = 7)
)
SELECT source_topic, source_partition, day, merchant_id, api_key_id, plan, network,
       raw.sample_ip AS sample_ip, raw.first_seen AS first_seen, raw.last_seen AS last_seen,
       greatest(raw.requests - seen.requests, 0) AS requests
  FROM (
    SELECT source_topic, source_partition, toDate(ts) AS day, merchant_id, api_key_id, plan,
           IPv6CIDRToRange(ip, if(ip BETWEEN toIPv6('::ffff:0.0.0.0') AND toIPv6('::ffff:255.255.255.255'), 120, 64)).1 AS network,
           any(ip) AS sample_ip, min(ts) AS first_seen, max(ts) AS last_seen, count() AS requests
      FROM {{db}}.request_events
     WHERE toDate(ts) >= toDate(now('UTC')) - 7
       AND (source_topic, source_partition, toDate(ts), merchant_id, api_key_id, plan,
            IPv6CIDRToRange(ip, if(ip BETWEEN toIPv6('::ffff:0.0.0.0') AND toIPv6('::ffff:255.255.255.255'), 120, 64)).1) IN touched
     GROUP BY source_topic, source_partition, day, merchant_id, api_key_id, plan, network
  ) AS raw
  LEFT JOIN (
    SELECT source_topic, source_partition, day, merchant_id, api_key_id, plan, network, sum(requests) AS requests
      FROM {{db}}.key_networks_1d
     WHERE day >= toDate(now('UTC')) - 7
       AND (source_topic, source_partition, day, merchant_id, api_key_id, plan, network) IN touched
     GROUP BY source_topic, source_partition, day, merchant_id, api_key_id, plan, network
  ) AS seen USING (source_topic, source_partition, day, merchant_id, api_key_id, plan, network)
 WHERE raw.requests > seen.requests;
