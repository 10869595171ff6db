-- Heartbeats of the replicas delivering webhooks. A replica adopts another's message only once the
-- owner has written no heartbeat for a minute (it stopped or died), not merely because the message
-- is overdue: a live owner with a backlog (slow endpoints) starts attempts late, and adopting them
-- would send them twice. Each replica writes its row every few seconds; reads take max(seen_at).
CREATE TABLE IF NOT EXISTS {{db}}.webhook_replicas
(
    owner    String                  COMMENT 'WORKER_ID of the replica (the owner of the messages it creates)',
    seen_at  DateTime64(3, 'UTC')    COMMENT 'its latest heartbeat, by its own clock; the latest row wins'
)
ENGINE = ReplacingMergeTree(seen_at)
ORDER BY owner
TTL toDateTime(seen_at) + INTERVAL 30 DAY
COMMENT 'webhook replicas'' heartbeats: a message is adopted only from an owner silent for a minute';
