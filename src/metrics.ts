/**
 * Prometheus metrics of the worker (served at /metrics). One registry per worker instance, so two
 * workers in one test process do not share counters.
 */
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';

export class WorkerMetrics {
  readonly registry = new Registry();

  readonly eventsConsumed = new Counter({
    name: 'security_center_events_consumed_total',
    help: 'Request events taken in, by source: kafka (messages consumed from the input topic), http (events posted to this replica; with Kafka configured only those rejected or dropped as duplicates, since the accepted ones are produced to the topic and counted as kafka by the replica that consumes them)',
    labelNames: ['source'] as const,
    registers: [this.registry],
  });
  readonly eventsStored = new Counter({
    name: 'security_center_events_stored_total',
    help: 'Request events stored in ClickHouse',
    registers: [this.registry],
  });
  readonly eventsDuplicate = new Counter({
    name: 'security_center_events_duplicate_total',
    help: 'Request events dropped as redeliveries of an already stored eventId or Kafka offset',
    labelNames: ['source'] as const,
    registers: [this.registry],
  });
  readonly eventsMisrouted = new Counter({
    name: 'security_center_events_misrouted_total',
    help: 'Kafka events stored whose message key is not their apiKeyId (without a key too): producers must key messages by apiKeyId, or with several replicas one key\'s events are split between them and detection sees part of each',
    registers: [this.registry],
  });
  readonly eventsDeadLettered = new Counter({
    name: 'security_center_events_dead_lettered_total',
    help: 'Kafka messages sent to the dead-letter topic, by reason',
    labelNames: ['reason'] as const,
    registers: [this.registry],
  });
  readonly eventsRejected = new Counter({
    name: 'security_center_events_rejected_total',
    help: 'HTTP-ingested events rejected in the response, by reason',
    labelNames: ['reason'] as const,
    registers: [this.registry],
  });
  readonly eventsProduced = new Counter({
    name: 'security_center_events_produced_total',
    help: 'HTTP-ingested events produced to the input topic and acknowledged by the brokers (with Kafka configured: the replica that owns their key then stores them, and counts them as consumed with source kafka)',
    registers: [this.registry],
  });
  readonly batchDuration = new Histogram({
    name: 'security_center_batch_duration_seconds',
    help: 'Time to decode and validate one Kafka batch (storage is asynchronous)',
    buckets: [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5],
    registers: [this.registry],
  });
  readonly flushDuration = new Histogram({
    name: 'security_center_store_flush_duration_seconds',
    help: 'Time from the start of a flush until its rows are stored, retries included',
    buckets: [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30],
    registers: [this.registry],
  });
  readonly flushFailures = new Counter({
    name: 'security_center_store_flush_failures_total',
    help: 'Failed attempts to store a flush\'s rows (each is retried with backoff)',
    registers: [this.registry],
  });
  readonly deadLetterFailures = new Counter({
    name: 'security_center_dead_letter_failures_total',
    help: 'Failed attempts to produce a flush\'s dead letters to the dead-letter topic (each is retried with backoff)',
    registers: [this.registry],
  });
  /** Whether storage is up (migrated, and the last write succeeded): read at every scrape. */
  private storageState: () => boolean = () => false;
  readonly storageUp: Gauge = new Gauge({
    name: 'security_center_storage_up',
    help: '1 once storage is migrated while its writes succeed; 0 before (at start, while migrations fail) and during an outage',
    registers: [this.registry],
    collect: () => {
      this.storageUp.set(this.storageState() ? 1 : 0);
    },
  });
  readonly bufferedRows = new Gauge({
    name: 'security_center_buffered_rows',
    help: 'Validated rows waiting to be stored: those waiting for the next insert and those of the insert being stored (or retried through an outage)',
    registers: [this.registry],
  });
  readonly consumerLag = new Gauge({
    name: 'security_center_consumer_lag',
    help: 'Messages of a partition this replica owns not yet stored and committed: its end (high watermark) minus the group\'s committed offset; read from the brokers every 5 s, so it keeps growing while intake is paused (a storage outage)',
    labelNames: ['topic', 'partition'] as const,
    registers: [this.registry],
  });

  readonly staleStoredOffsets = new Counter({
    name: 'security_center_stale_stored_offsets_total',
    help: 'Partitions (each counted once per replica) whose offsets stored in ClickHouse were found to be an earlier incarnation\'s of the topic (deleted and created again, a new cluster), by reason (other_events: other events are stored at the offsets of its messages; beyond_end: stored past the partition\'s end); their messages are stored, not skipped as redeliveries',
    labelNames: ['reason'] as const,
    registers: [this.registry],
  });

  readonly assignedPartitions = new Gauge({
    name: 'security_center_assigned_partitions',
    help: 'Kafka partitions of the input topic this replica owns',
    registers: [this.registry],
  });
  readonly alertChanges = new Counter({
    name: 'security_center_alert_changes_total',
    help: 'Findings applied to alerts, by anomaly type and outcome (created, updated, escalated, reopened, suppressed, stale: evidence already counted)',
    labelNames: ['type', 'change'] as const,
    registers: [this.registry],
  });
  readonly duplicateAlertsResolved = new Counter({
    name: 'security_center_duplicate_alerts_resolved_total',
    help: 'Alerts this replica resolved as duplicates of one another replica opened for the same pattern at the same time, by anomaly type',
    labelNames: ['type'] as const,
    registers: [this.registry],
  });
  readonly detectionWindowEvents = new Gauge({
    name: 'security_center_detection_window_events',
    help: 'Events held in the detection windows of all keys',
    registers: [this.registry],
  });
  readonly detectionTrackedKeys = new Gauge({
    name: 'security_center_detection_tracked_keys',
    help: 'API keys with a detection window in memory',
    registers: [this.registry],
  });
  readonly detectionIdleHistories = new Gauge({
    name: 'security_center_detection_idle_key_histories',
    help: 'API keys without a detection window whose networks and places of the last 7 days detection remembers',
    registers: [this.registry],
  });
  readonly detectionHistoryEntries = new Gauge({
    name: 'security_center_detection_key_history_entries',
    help: 'Networks and places of the last 7 days that detection remembers for all keys, with a window or idle (about 125 bytes each, counted against the memory budget)',
    registers: [this.registry],
  });
  readonly detectionSprayEntries = new Gauge({
    name: 'security_center_detection_spray_entries',
    help: 'The (network, key) pairs the credential-stuffing tally holds: 401s per network across keys in the last 10 minutes, at most 200,000',
    registers: [this.registry],
  });
  readonly detectionTallyEntries = new Gauge({
    name: 'security_center_detection_tally_entries',
    help: 'Distinct networks, places and paths the rules\' running tallies hold for the keys with a window (about a window event\'s memory each, counted against the memory budget)',
    registers: [this.registry],
  });
  readonly detectionHeapUsed = new Gauge({
    name: 'security_center_detection_heap_used_bytes',
    help: 'V8 heap used by the analysis thread (validation, detection windows and histories), after its last batch',
    registers: [this.registry],
  });
  readonly detectionHeapLimit = new Gauge({
    name: 'security_center_detection_heap_limit_bytes',
    help: 'Heap limit of the analysis thread (DETECTION_MAX_HEAP_MB, else V8\'s default): out of it, the thread ends and the worker exits 1',
    registers: [this.registry],
  });
  readonly detectionEventsPerKeyCap = new Gauge({
    name: 'security_center_detection_events_per_key_cap',
    help: 'Events a key may keep in its window: lower than usual while the windows are over their memory budget',
    registers: [this.registry],
  });
  readonly detectionShedEvents = new Counter({
    name: 'security_center_detection_shed_events_total',
    help: 'Events dropped from detection windows early to stay within the memory budget (they are stored all the same)',
    registers: [this.registry],
  });
  readonly detectionForgottenKeys = new Counter({
    name: 'security_center_detection_forgotten_keys_total',
    help: 'Active keys whose detection window was dropped to stay within the memory budget',
    registers: [this.registry],
  });
  readonly detectionShedHistories = new Counter({
    name: 'security_center_detection_shed_key_histories_total',
    help: 'Idle keys\' histories (networks and places of the last 7 days) dropped to stay within the memory budget: such a key\'s next networks and places look new to credential_sharing and impossible_travel',
    registers: [this.registry],
  });
  readonly detectionThinnedEvents = new Counter({
    name: 'security_center_detection_thinned_events_total',
    help: 'Events thinned out of the history of keys busier than their window holds (of each network and place, the first and last of each minute stay)',
    registers: [this.registry],
  });
  readonly detectionFutureEvents = new Counter({
    name: 'security_center_detection_future_events_total',
    help: 'Events dated more than 5 minutes ahead of the worker\'s clock, left out of detection windows (they are stored all the same)',
    registers: [this.registry],
  });
  readonly detectionEventsWithoutLimit = new Counter({
    name: 'security_center_detection_events_without_limit_total',
    help: 'Events not answered 5xx that carried no rateLimitPerMinute, of keys velocity_attack has no default limit for (enterprise by default): a minute of them is judged only when another of its events not answered 5xx carries one',
    registers: [this.registry],
  });
  readonly ruleErrors = new Counter({
    name: 'security_center_rule_errors_total',
    help: 'Rule evaluations that threw (the rule is skipped for that key and batch); rule="engine": a batch whose detection failed outside any rule (its events are stored)',
    labelNames: ['rule'] as const,
    registers: [this.registry],
  });

  readonly webhookMessages = new Counter({
    name: 'security_center_webhook_messages_total',
    help: 'Critical-alert webhook messages, by destination (oncall, merchant) and status (created, delivered, failed, cancelled)',
    labelNames: ['destination', 'status'] as const,
    registers: [this.registry],
  });
  readonly webhookAttempts = new Counter({
    name: 'security_center_webhook_attempts_total',
    help: 'Webhook delivery attempts, by destination and outcome (delivered, http_error, timeout, connect_error, tls_error, blocked_target, circuit_open, secret_unreadable)',
    labelNames: ['destination', 'outcome'] as const,
    registers: [this.registry],
  });
  readonly webhookNotificationsDropped = new Counter({
    name: 'security_center_webhook_notifications_dropped_total',
    help: 'Critical-alert notifications dropped because too many were waiting to be stored',
    registers: [this.registry],
  });
  readonly webhookEndpointsPaused = new Gauge({
    name: 'security_center_webhook_endpoints_paused',
    help: 'Webhook endpoints whose circuit breaker is open (deliveries paused)',
    registers: [this.registry],
  });

  constructor(options: { defaultMetrics?: boolean } = {}) {
    if (options.defaultMetrics ?? true) collectDefaultMetrics({ register: this.registry });
  }

  /** Where security_center_storage_up comes from (until this is called it is 0). */
  reportStorageUp(state: () => boolean): void {
    this.storageState = state;
  }

  /**
   * Registers security_center_webhook_dispatcher_up, read from `state` at every scrape. Only a
   * worker with a dispatcher (FEATURE_ANOMALY_DETECTION) reports it, so none reports it down.
   */
  reportWebhookDispatcherUp(state: () => boolean): void {
    const gauge: Gauge = new Gauge({
      name: 'security_center_webhook_dispatcher_up',
      help: '1 while the webhook dispatcher delivers: started (breakers loaded) and its storage reads and writes succeed; 0 before its start-up is done and while its storage fails',
      registers: [this.registry],
      collect: () => gauge.set(state() ? 1 : 0),
    });
  }

  /**
   * Enforcement (ENFORCEMENT_MODE shadow or enforce): the decisions this replica serves, by action
   * (every replica serves the same ones), and whether it serves any answer at all.
   */
  reportEnforcementDecisions(current: () => { decisions: readonly { action: string }[] } | undefined): void {
    const decisions: Gauge<'action'> = new Gauge({
      name: 'security_center_enforcement_decisions',
      help: 'Keys with an enforcement decision now, by action (throttle, block); in shadow mode, the decisions recorded but not applied',
      labelNames: ['action'] as const,
      registers: [this.registry],
      collect: () => {
        const counts = { throttle: 0, block: 0 };
        for (const decision of current()?.decisions ?? []) if (decision.action === 'throttle' || decision.action === 'block') counts[decision.action]++;
        for (const [action, count] of Object.entries(counts)) decisions.set({ action }, count);
      },
    });
    const fresh: Gauge = new Gauge({
      name: 'security_center_enforcement_decisions_fresh',
      help: '1 while the enforcement decisions served are fresh (storage read within 30 s); 0 while there are none to serve, and the fleet lets traffic through',
      registers: [this.registry],
      collect: () => fresh.set(current() ? 1 : 0),
    });
  }
}
