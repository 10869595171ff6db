-- Critical-alert webhooks (contracts section 4). Endpoints, messages and breakers are rewritten whole
-- with a higher version on every change; ReplacingMergeTree keeps the latest and reads use FINAL.
-- A message carries its own attempt log (at most three entries), so an attempt is one write.
-- Messages are kept 30 days.
CREATE TABLE IF NOT EXISTS {{db}}.webhook_endpoints
(
    merchant_id  String                  COMMENT 'the merchant whose endpoint this is; one endpoint per merchant',
    endpoint_id  UUID                    COMMENT 'new on every registration, so a new URL starts with a closed breaker',
    url          String                  COMMENT 'https URL, checked against the target policy at registration',
    secret       String                  COMMENT 'signing secret (shown once at registration); never logged or returned again',
    created_by   String                  COMMENT 'admin user who registered it',
    created_at   DateTime64(3, 'UTC')    COMMENT 'when it was registered',
    updated_at   DateTime64(3, 'UTC')    COMMENT 'last change (registration or removal)',
    deleted      UInt8                   COMMENT '1 once removed; reads skip it',
    version      UInt64                  COMMENT 'increases with every write; the highest wins'
)
ENGINE = ReplacingMergeTree(version)
ORDER BY merchant_id
COMMENT 'merchant webhook endpoints for critical alerts';

CREATE TABLE IF NOT EXISTS {{db}}.webhook_messages
(
    id               UUID                             COMMENT 'message id, sent as svc-id on every attempt',
    alert_id         UUID                             COMMENT 'the critical alert',
    merchant_id      String                           COMMENT 'the alert''s merchant',
    destination      LowCardinality(String)           COMMENT 'oncall (ONCALL_WEBHOOK_URL) | merchant (its registered endpoint)',
    endpoint_id      String                           COMMENT 'breaker key of the endpoint last attempted (empty before the first attempt)',
    target           String                           COMMENT 'where the last attempt went: the merchant URL, or the on-call origin only',
    body             String                           COMMENT 'the exact JSON body, the same on every attempt',
    status           LowCardinality(String)           COMMENT 'pending | delivered | failed | cancelled',
    attempts         UInt8                            COMMENT 'attempts made (skipped ones included)',
    next_attempt_at  DateTime64(3, 'UTC')             COMMENT 'when the next attempt is due (pending only)',
    last_outcome     LowCardinality(String)           COMMENT 'outcome of the last attempt; empty before the first',
    last_error       String                           COMMENT 'short reason of the last failure; empty when none',
    attempt_log      String                           COMMENT 'JSON array of {attempt, at, outcome, statusCode?, error, durationMs}; outcome: delivered | http_error | timeout | connect_error | tls_error | blocked_target | circuit_open (skipped: endpoint paused)',
    created_at       DateTime64(3, 'UTC')             COMMENT 'when the message was created: attempts are due 0, 1 and 5 minutes after, none after 15',
    updated_at       DateTime64(3, 'UTC')             COMMENT 'last change',
    version          UInt64                           COMMENT 'increases with every write; the highest wins'
)
ENGINE = ReplacingMergeTree(version)
PARTITION BY toYYYYMM(created_at)
ORDER BY (merchant_id, id)
TTL toDateTime(created_at) + INTERVAL 30 DAY
COMMENT 'critical-alert webhook messages and their delivery state';

CREATE TABLE IF NOT EXISTS {{db}}.webhook_breakers
(
    endpoint_id           String                  COMMENT 'merchant endpoint id, or oncall:<hash of the URL>',
    consecutive_failures  UInt32                  COMMENT 'failed attempts since the last success',
    paused_until          DateTime64(3, 'UTC')    COMMENT 'deliveries to the endpoint are paused until then (epoch when not paused)',
    updated_at            DateTime64(3, 'UTC')    COMMENT 'last change',
    version               UInt64                  COMMENT 'increases with every write; the highest wins'
)
ENGINE = ReplacingMergeTree(version)
ORDER BY endpoint_id
COMMENT 'circuit breaker state per webhook endpoint: 10 consecutive failures pause it for 1 hour';
