/**
 * The worker's composition root: the one place where parts are built and wired together, started
 * in order and stopped in reverse. Run directly (`npm start`), it reads the environment, starts,
 * and on SIGTERM or SIGINT drains and exits.
 */
import { readFileSync } from 'node:fs';
import { getHeapStatistics } from 'node:v8';
import { pathToFileURL } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { doneWithin } from './deadlines.ts';
import type { FastifyInstance } from 'fastify';
import { RULES } from '../rules/index.ts';
import { registerAdminApi } from './admin/admin-api.ts';
import { alertRoutes } from './admin/alert-routes.ts';
import { AdminAuthenticator } from './admin/auth.ts';
import { ResponseCache } from './admin/response-cache.ts';
import { AlertManager } from './alerts/alert-manager.ts';
import { AlertService } from './alerts/alert-service.ts';
import { DetectionConfig, followDetectionConfig } from './detect/detection-config.ts';
import { warmUpLimit, windowBudgetFor } from './detect/engine.ts';
import { HISTORY_MS } from './detect/key-history.ts';
import { DetectionLoadMonitor } from './detect/load-monitor.ts';
import { MAX_KEYS_PER_NETWORK, SPRAY_MIN_KEYS, SPRAY_WINDOW_MS } from './detect/source-spray.ts';
import { SprayAcrossReplicas } from './detect/spray-across-replicas.ts';
import { describeConfig, listenConfigError, loadConfig, withBundledCas, ConfigError, type Config } from './config.ts';
import { enforcementAdminRoutes, registerDecisionRoutes } from './enforcement/decision-routes.ts';
import { DecisionSource } from './enforcement/decision-source.ts';
import { FailureLog } from './failure-log.ts';
import { createHttpServer } from './http/server.ts';
import { AnalysisThread, type Detection } from './ingest/analysis-thread.ts';
import { EventBuffer } from './ingest/event-buffer.ts';
import { registerHttpIngest } from './ingest/http-ingest.ts';
import { createKafka } from './ingest/kafka-client.ts';
import { KafkaIntake, RECALL_EVENT_IDS_MS } from './ingest/kafka-consumer.ts';
import { RecentEventIds } from './ingest/recent-event-ids.ts';
import { createLogger, type Logger } from './logger.ts';
import { WorkerMetrics } from './metrics.ts';
import { AlertStore } from './store/alert-store.ts';
import { connectClickHouse, StorageDirectoryInUse, type ClickHouse } from './store/clickhouse.ts';
import { EnforcementHistoryStore } from './store/enforcement-history-store.ts';
import { EventStore, HTTP_SOURCE, storableEventTimes } from './store/event-store.ts';
import { migrate } from './store/migrate.ts';
import { tablesIn } from './store/tables.ts';
import { VouchedWriter } from './store/vouched-writer.ts';
import { WebhookStore } from './store/webhook-store.ts';
import { WebhookDispatcher, type WebhookDispatcherOptions } from './webhooks/dispatcher.ts';
import { parseSecretKey, SecretBox } from './webhooks/secret-box.ts';
import { targetPolicy, type Resolver } from './webhooks/target-policy.ts';
import { webhookRoutes } from './webhooks/webhook-routes.ts';

/**
 * How long stop() may take: the process entry exits after 30 s regardless. Each step that waits on
 * Kafka or storage has a deadline within it (the step after one cut short runs all the same), so
 * that the consumer leaves its group and every component is stopped in time.
 */
const STOP_BUDGET_MS = 27_000;
/** Of the budget, the most the HTTP server's close and the hand-off of fetched batches may each wait; the buffer's drain has its own 10 s. */
const STOP_STEP_MS = 5_000;
const BUFFER_STOP_MS = 12_000;
/**
 * What one reading of the keys sprayed across replicas (spray-across-replicas.ts) reads: networks
 * that failed for SPRAY_MIN_KEYS keys, at most as many keys a network as a tally holds, and bounds on
 * what it hands to detection (each row a key's requests from one address and user agent).
 */
const SPRAY_READING = { windowMs: SPRAY_WINDOW_MS, minKeys: SPRAY_MIN_KEYS, keysPerNetwork: MAX_KEYS_PER_NETWORK, maxKeys: 5_000, rowsPerKey: 3 } as const;

const VERSION: string = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')).version;

/** Inserts serialized event rows; the signal aborts the insert at the buffer's stop deadline (event-buffer.ts). */
type StoreRows = (body: readonly Uint8Array[], signal?: AbortSignal, dedupToken?: string) => Promise<void>;

export interface WorkerDeps {
  logger?: Logger;
  /** Called when a part stops for good (the Kafka intake, the analysis thread); the process entry then exits with 1. */
  onFatal?(error: Error): void;
  /** Wraps the storage connection, so tests inject faults into its reads at the storage boundary. */
  wrapClickHouse?(clickhouse: ClickHouse): ClickHouse;
  /** Wraps the storage write, so tests inject faults at the storage boundary. */
  wrapStoreRows?(storeRows: StoreRows): StoreRows;
  /** Webhook test hooks: a clock to move, a resolver, faster polling and timeouts. */
  /** How often the owner of partition 0 reads the keys sprayed across replicas (SPRAY_ACROSS_REPLICAS_MS by default). */
  sprayAcrossReplicasMs?: number;
  webhooks?: { resolve?: Resolver } & Pick<
    WebhookDispatcherOptions,
    'now' | 'pollIntervalMs' | 'rescanIntervalMs' | 'connectTimeoutMs' | 'requestTimeoutMs'
  >;
}

export interface Worker {
  readonly app: FastifyInstance;
  /** http://host:port the server listens on. */
  readonly url: string;
  readonly clickhouse: ClickHouse;
  readonly store: EventStore;
  readonly alertStore: AlertStore;
  readonly webhookStore: WebhookStore;
  /** Critical-alert webhooks; undefined when FEATURE_ANOMALY_DETECTION is off. */
  readonly webhooks?: WebhookDispatcher;
  readonly metrics: WorkerMetrics;
  /**
   * Resolves when start-up is done: storage migrated, the open alerts loaded, detection started, and
   * the Kafka intake (if any) started. The webhook dispatcher's start may still be retried then.
   */
  readonly ready: Promise<void>;
  stop(): Promise<void>;
}

export async function startWorker(config: Config, deps: WorkerDeps = {}): Promise<Worker> {
  const logger = deps.logger ?? createLogger(config.logLevel);
  // The detection windows are held to a budget that fits the analysis thread's heap
  // (DETECTION_MAX_HEAP_MB, else V8's default limit, read on this thread: the same old generation as
  // the analysis thread's, with a young generation 144 MiB larger under the start commands' 64 MB
  // semi-spaces: 3.5% where V8's default is 4 GiB, as here, more under a smaller default; the budget's
  // half of the heap leaves room for it).
  const maxWindowEvents = config.detection.maxWindowEvents ?? windowBudgetFor(config.detection.maxHeapMb ?? getHeapStatistics().heap_size_limit / 2 ** 20);
  logger.info({ version: VERSION, ...describeConfig(config), detectionWindowBudget: maxWindowEvents }, 'starting');
  const metrics = new WorkerMetrics();
  const tables = tablesIn(config.clickhouse.database);
  const connection = connectStorage(config, logger);
  const clickhouse = deps.wrapClickHouse ? deps.wrapClickHouse(connection) : connection;
  const store = new EventStore(clickhouse, tables);
  const recentIds = new RecentEventIds(config.ingest.dedupCacheSize);
  const alertStore = new AlertStore(clickhouse, tables);
  const enforcementHistory = new EnforcementHistoryStore(clickhouse, tables);
  const ingestEnabled = config.features.anomalyDetection;
  // Both ways in refuse events dated where the raw table's TTL cannot reach.
  const eventTimes = storableEventTimes(config.clickhouse.eventsTtlDays);
  const { secretKey, previousSecretKey } = config.webhooks;
  const secrets = new SecretBox(secretKey ? parseSecretKey(secretKey) : undefined, previousSecretKey ? [parseSecretKey(previousSecretKey)] : []);
  const webhookStore = new WebhookStore(clickhouse, tables, secrets);
  if (ingestEnabled && !config.webhooks.secretKey) {
    logger.warn({ setting: 'WEBHOOK_SECRET_KEY' }, 'merchants\' webhook signing secrets are stored unsealed; set WEBHOOK_SECRET_KEY to seal them');
  }
  const { resolve, ...webhookTiming } = deps.webhooks ?? {};
  const webhookPolicy = targetPolicy({ allowPrivate: config.webhooks.allowPrivateTargets, resolve });
  if (config.kafka?.sasl?.mechanism === 'plain' && !config.kafka.ssl) {
    logger.warn({ setting: 'KAFKA_SSL' }, 'KAFKA_SASL_MECHANISM=plain without KAFKA_SSL=true sends the Kafka password unencrypted');
  }
  if (config.webhooks.allowPrivateTargets) {
    logger.warn({ setting: 'WEBHOOK_ALLOW_PRIVATE_TARGETS' }, 'WEBHOOKS MAY REACH LOOPBACK AND PRIVATE NETWORKS: a test setting, never for production');
  }
  const webhooks = ingestEnabled
    ? new WebhookDispatcher({
        store: webhookStore,
        oncall: config.webhooks.oncall,
        owner: config.webhooks.owner,
        policy: webhookPolicy,
        ca: config.webhooks.ca ? withBundledCas(config.webhooks.ca) : undefined,
        concurrency: config.webhooks.concurrency,
        metrics,
        logger: logger.child({ component: 'webhooks' }),
        ...webhookTiming,
      })
    : undefined;

  if (webhooks) metrics.reportWebhookDispatcherUp(() => webhooks.up);

  // Validation of Kafka batches and detection run in one thread of their own.
  const analysis = ingestEnabled
    ? new AnalysisThread(
        {
          dedupCacheSize: config.ingest.dedupCacheSize,
          eventTimes,
          detection: true,
          entitledPlans: config.admin.entitledPlans,
          geoCityDb: config.detection.geoCityDb,
          geoAsnDb: config.detection.geoAsnDb,
          detectionConfigFile: config.detection.configFile,
          maxHeapMb: config.detection.maxHeapMb,
          maxWindowEvents,
        },
        logger,
        (error) => {
          logger.error({ err: error }, 'analysis thread stopped; the worker stops too');
          deps.onFatal?.(error);
        },
      )
    : undefined;
  const alerts = new AlertService(
    new AlertManager({ suppressionMs: config.detection.suppressionMs, aiInsights: config.features.aiRiskScoring }),
    alertStore,
    RULES,
    metrics,
    logger.child({ component: 'alerts' }),
    { onCritical: (alert) => webhooks?.notify(alert) },
  );
  // Enforcement decisions (contracts section 5) are derived from the stored alerts with the current
  // allowlists; the analysis thread follows the same file for detection, and logs its refusals.
  let allowlists = new DetectionConfig();
  const { configFile } = config.detection;
  const unfollowConfig =
    config.enforcement.mode !== 'off' && configFile
      ? followDetectionConfig(configFile, RULES, {
          loaded: (loaded) => (allowlists = loaded),
          refused: (error) => {
            if (!analysis) logger.error({ err: error }, 'detection config refused; enforcement keeps the previous allowlists');
          },
        })
      : undefined;
  const enforcement =
    config.enforcement.mode === 'off'
      ? undefined
      : new DecisionSource({
          mode: config.enforcement.mode,
          policy: { blockMinRisk: config.enforcement.blockMinRisk, ttlMs: config.enforcement.ttlMs },
          readAlerts: (since) => alertStore.enforceable(since),
          writeHistory: (records) => enforcementHistory.record(records),
          config: () => allowlists,
          metrics,
          logger: logger.child({ component: 'enforcement' }),
        });
  if (enforcement && !analysis) {
    // A deliberate topology (replicas that serve decisions beside those that detect), but not what an
    // operator who turned detection off to silence it may expect: ENFORCEMENT_MODE is the switch.
    logger.warn({ setting: 'ENFORCEMENT_MODE', mode: config.enforcement.mode }, 'FEATURE_ANOMALY_DETECTION is off, but enforcement serves the decisions of the alerts stored; set ENFORCEMENT_MODE=off to stop it');
  }
  if (config.kafka && !analysis) {
    // The consumer stores and judges, so it runs with detection only: a worker that looks alive beside a topic it never reads must say so.
    logger.warn({ setting: 'FEATURE_ANOMALY_DETECTION' }, 'KAFKA_BROKERS is set but FEATURE_ANOMALY_DETECTION is off: nothing is consumed from Kafka; set FEATURE_ANOMALY_DETECTION=true to consume it');
  }
  const detectionLoad = new DetectionLoadMonitor(metrics, logger.child({ component: 'detection' }));
  const onDetection = (detection: Detection) => {
    if (detection.load) detectionLoad.record(detection.load, detection.heap);
    alerts.handle(detection);
  };
  // Keys judged by the thread itself once their REJUDGE_MS wait is over, when no batch came to do it.
  if (analysis) analysis.onDeferredDetection = onDetection;
  // What detection vouched for is recorded, so that a key's own places outlive a restart (key-history.ts).
  const vouchedWriter = new VouchedWriter({ store, topicOf: (partition) => (partition < 0 ? HTTP_SOURCE.topic : (config.kafka?.topic ?? HTTP_SOURCE.topic)), logger: logger.child({ component: 'detection' }) });
  if (analysis) analysis.onVouched = (vouched) => vouchedWriter.add(vouched);
  const detectionWindowMs = Math.max(...RULES.map((rule) => rule.windowMs));
  const storeRows: StoreRows = (body, signal, dedupToken) => store.insertRows(body, signal, dedupToken);

  // Built now, started last (see `ready` below): with Kafka, posts go to the topic from the start,
  // and are consumed once the consumer starts.
  let intake: KafkaIntake | undefined;
  // Aborted by stop(): a start-up still under way ends before its next step (or warm-up page), and retries end.
  const abort = new AbortController();
  const stopIfRequested = () => abort.signal.throwIfAborted();
  const buffer = new EventBuffer({
    ...config.store,
    storeRows: deps.wrapStoreRows ? deps.wrapStoreRows(storeRows) : storeRows,
    sendDeadLetters: (records) => (intake ? intake.sendDeadLetters(records) : Promise.resolve()),
    commit: (offsets) => (intake ? intake.commit(offsets) : Promise.resolve()),
    onOutage: () => intake?.pause(),
    onRecovery: () => {
      if (!abort.signal.aborted) intake?.resume(); // storage back while draining at shutdown: intake stays paused
    },
    deadLetterTopic: config.kafka?.dlqTopic,
    metrics,
    logger: logger.child({ component: 'buffer' }),
  });

  let migrated = false;
  /** Why the last attempt to migrate storage failed, while it is retried. */
  let migrationFailure: string | undefined;
  /** A storage error's message, fit for `/ready`. */
  const storageCauseOf = (error: unknown) => storageCause(error, config.clickhouse.password);
  /** Once storage is migrated, the start-up step not done yet (see `ready` below); undefined once start-up is done. */
  let startingUp: string | undefined = 'start-up not finished';
  metrics.reportStorageUp(() => migrated && buffer.storageUp);
  const app = createHttpServer({
    logger,
    metrics,
    version: VERSION,
    bodyLimit: config.ingest.maxBodyBytes,
    // With KAFKA_BROKERS set, a worker whose consumer does not run (yet) takes in nothing: not ready.
    notReadyReason: () =>
      analysis?.failureReason ??
      (!migrated ? notMigratedReason(migrationFailure) : (buffer.unhealthyReason ?? startingUp ?? intake?.notReadyReason ?? postsRefusedReason())),
  });
  // Without Kafka, posts are refused while the rows waiting for storage are at STORE_MAX_BUFFERED_ROWS:
  // not ready then, so that a load balancer sends them to another replica. (With Kafka, posts go to
  // the topic, whatever the buffer holds: the consumer waits instead.)
  const postsRefusedReason = () =>
    !config.kafka && buffer.bufferedRows >= config.store.maxBufferedRows
      ? `storage is not keeping up: ${buffer.bufferedRows} rows wait for it (STORE_MAX_BUFFERED_ROWS), and posts are refused`
      : undefined;
  // Without Kafka, posts wait (then get 503) until detection has started: judged earlier, an event
  // could open a second alert (the open alerts are not loaded) or find a key's usual networks new (the
  // windows are not warmed); stored and held in memory instead, it would be judged by no one were the
  // worker stopped first, as the next start warms its windows with it.
  let detectionStarted: () => void = () => {};
  const postsJudged = config.kafka ? undefined : new Promise<void>((resolve) => (detectionStarted = resolve));
  // The networks the partition's keys were seen from over the days detection remembers (a few rows
  // per key and network, with which of them it vouched for), so that a key's habits outlive a
  // restart; first, so that a key's first network is the first of those days, not of its window.
  // Then the partition's newest events of the plans detection evaluates, at most its share of the
  // windows' budget (warmUpLimit), read and handed over a page at a time (a million events at once
  // would hold about a gigabyte of the analysis thread's heap).
  const warm = async (analysis: AnalysisThread, topic: string, partition: number, heartbeat?: () => Promise<void>, partitionsOwned = 1) => {
    // As of the partition's newest stored event, not the clock: a replica that restarts behind (a
    // backlog after an outage) judges the backlog as of its own times, and needs the hour before them.
    const asOf = (await store.newestEventTime({ topic, partition }, new Date())) ?? Date.now();
    await store.networkSightings({ since: new Date(asOf - HISTORY_MS), topic, partition, plans: config.admin.entitledPlans }, async (sightings) => {
      await analysis.recall(sightings, partition);
      await heartbeat?.();
    });
    await store.recentEvents(
      { since: new Date(asOf - detectionWindowMs), topic, partition, plans: config.admin.entitledPlans, limit: warmUpLimit(maxWindowEvents, partitionsOwned) },
      async (events) => {
        await analysis.warm(events, partition, asOf);
        await heartbeat?.();
      },
    );
  };
  if (config.kafka && analysis) {
    const kafkaConfig = config.kafka;
    intake = new KafkaIntake({
      kafka: createKafka(kafkaConfig, logger),
      ...kafkaConfig,
      store,
      analysis,
      onDetection,
      warmPartition: (partition, heartbeat, partitionsOwned) => warm(analysis, kafkaConfig.topic, partition, heartbeat, partitionsOwned),
      // Every partition an assignment brings recalls the ids of its recently stored events (any plan).
      dedupCacheSize: config.ingest.dedupCacheSize,
      syncAlerts: () => alerts.syncWithStore(),
      buffer,
      onStopped: (error) => deps.onFatal?.(error),
      metrics,
      logger: logger.child({ component: 'kafka' }),
    });
  }
  // Credential stuffing spread over the replicas is judged whole by the owner of partition 0 (spray-across-replicas.ts).
  const sprayAcrossReplicas =
    intake && analysis
      ? new SprayAcrossReplicas({
          owned: () => intake.ownedPartitions,
          read: (times, owned) => store.sprayedRequests({ ...times, topic: config.kafka!.topic, owned, plans: config.admin.entitledPlans, ...SPRAY_READING }),
          judge: (requests) => analysis.judgeFleetSpray(requests),
          onDetection,
          everyMs: deps.sprayAcrossReplicasMs,
          logger: logger.child({ component: 'detection' }),
        })
      : undefined;
  // Without Kafka, posted events are stored with HTTP_SOURCE: the ids of those the previous process
  // stored are recalled once storage is migrated (with Kafka, the consumer recalls a partition's
  // when an assignment brings it, before its first batch: kafka-consumer.ts). A failed read fails open.
  let postedIdsRecalled: () => void = () => {};
  const recalled = config.kafka ? undefined : new Promise<void>((resolve) => (postedIdsRecalled = resolve));
  const recallPostedIds = async () => {
    try {
      const ids = await store.recentEventIds(HTTP_SOURCE, new Date(Date.now() - RECALL_EVENT_IDS_MS), Math.ceil(config.ingest.dedupCacheSize / 2));
      for (const id of ids) recentIds.checkAndAdd(id);
      logger.info({ eventIds: ids.length }, 'recalled the ids of recently posted events');
    } catch (error) {
      logger.warn({ err: error }, 'cannot read the ids of recently posted events: a retry of one stored before this start is counted twice');
    } finally {
      postedIdsRecalled();
    }
  };
  if (analysis && config.ingest.token) {
    registerHttpIngest(app, {
      recalled,
      detectionStarted: postsJudged,
      detectionStopped: () => analysis.failureReason !== undefined,
      maxBufferedRows: config.store.maxBufferedRows,
      token: config.ingest.token,
      maxEvents: config.ingest.maxEvents,
      eventTimes,
      buffer,
      flushWaitMs: config.store.flushIntervalMs,
      recentIds,
      metrics,
      // With Kafka, posted events go through the topic as the fleet's do: the replica that owns a
      // key's partition stores and detects all of its events, and drops a retry sent elsewhere.
      publish: intake && ((events) => intake!.publish(events)),
      onAccepted: (events) => {
        analysis.detect(events).then(onDetection, (error: unknown) => logger.error({ err: error }, 'detection failed'));
      },
    });
  } else if (ingestEnabled) {
    logger.warn('INGEST_TOKEN is not set: POST /v1/ingest/events is off');
  }
  if (enforcement && config.ingest.token) registerDecisionRoutes(app, { token: config.ingest.token, source: enforcement });
  else if (enforcement) logger.warn('INGEST_TOKEN is not set: enforcement decisions are logged, but GET /v1/enforcement/decisions is off');
  if (config.features.admin && config.admin.jwtSecret) {
    await registerAdminApi(app, {
      authenticator: new AdminAuthenticator(config.admin.jwtSecret, config.admin.entitledPlans, config.admin.previousJwtSecret),
      routes: [
        ...alertRoutes({
          alertStore,
          eventStore: store,
          alerts,
          cache: new ResponseCache(config.admin.cacheTtlMs),
          aiInsights: config.features.aiRiskScoring,
        }),
        ...webhookRoutes({ store: webhookStore, policy: webhookPolicy, metrics, now: deps.webhooks?.now }),
        ...enforcementAdminRoutes(enforcement, enforcementHistory),
      ],
      rateLimitPerMinute: config.admin.rateLimitPerMinute,
      maxBodyBytes: config.admin.maxBodyBytes,
      version: VERSION,
    });
  }
  await app.listen({ host: config.http.host, port: config.http.port }).catch(async (error: unknown) => {
    // Nothing has started yet but the analysis thread, the config file's watch and the storage
    // client: released, so that a process that starts the worker in-process can go on or exit.
    unfollowConfig?.();
    await Promise.allSettled([app.close(), analysis?.close(), clickhouse.close()]);
    throw listenConfigError(error, config.http) ?? error;
  });
  const address = app.server.address();
  const url = typeof address === 'object' && address ? `http://${formatHost(address.address)}:${address.port}` : '';
  logger.info({ url }, 'http server listening');

  let webhooksStarted: Promise<void> | undefined;
  // Start-up: /ready answers 503 until every step here is done, each saying why (`startingUp`).
  const ready = (async () => {
    await retryUntilDone('migrating storage', logger, abort.signal, () => migrate(clickhouse, { tables, eventsTtlDays: config.clickhouse.eventsTtlDays }, logger), {
      onFailure: (error) => (migrationFailure = storageCauseOf(error)),
    });
    migrated = true;
    stopIfRequested();
    if (recalled) void recallPostedIds();
    enforcement?.start();
    if (secretKey) await resealWebhookSecrets(webhookStore, previousSecretKey !== undefined, logger);
    if (!analysis) return;
    stopIfRequested();
    // Webhook start-up (the breakers' states, then attempting what is due) is needed for delivery
    // only: until it is done, critical alerts' notifications are stored all the same, and attempted
    // once it is. So it holds back neither the steps below nor readiness (taking traffic away from
    // this worker would deliver nothing sooner); it is retried beside them.
    webhooksStarted = webhooks && retryUntilDone('starting webhooks', logger, abort.signal, () => webhooks.start()).catch(() => undefined);
    // Without the open alerts (and recent dismissals), a finding would open a second alert where
    // one is open, and a dismissed pattern would not stay quiet: not ready until they are loaded,
    // and the Kafka consumer starts only then (events posted before then wait: with Kafka in the
    // topic, without it in the client, which is answered once detection has started or with 503).
    startingUp = 'open alerts not loaded yet';
    await retryUntilDone('loading alerts', logger, abort.signal, () => alerts.start(), {
      onFailure: (error) => (startingUp = `storage unavailable: cannot load the open alerts (retrying): ${storageCauseOf(error)}`),
    });
    stopIfRequested();
    startingUp = 'detection starting';
    await analysis.ready;
    // Events posted over HTTP and stored directly (without Kafka) belong to no partition: every
    // replica warms them. Like a partition's, a failed warm-up is not fatal: those windows hold the
    // pages loaded before it failed. A stop ends it at the next page.
    let pagesLoaded = 0;
    await warm(analysis, '', -1, async () => {
      pagesLoaded++;
      stopIfRequested();
    }).catch((error: unknown) => {
      stopIfRequested();
      logger.warn(
        { err: error, pagesLoaded },
        pagesLoaded === 0 ? 'detection warm-up of HTTP events failed; their windows start empty' : 'detection warm-up of HTTP events failed part-way; their windows hold only the pages loaded',
      );
    });
    stopIfRequested();
    detectionStarted();
    if (intake) {
      startingUp = undefined; // the consumer's start says why it is not consuming yet (intake.notReadyReason)
      await startKafkaIntake(intake, config.kafka!.brokers, logger, abort.signal);
      sprayAcrossReplicas?.start();
    }
  })().then(() => {
    startingUp = undefined;
    logger.info('ready');
  });
  ready.catch((error: unknown) => {
    if (abort.signal.aborted || analysis?.failureReason) return; // stopped while starting, or already reported
    // Every step above retries or fails open; anything else must not leave a worker that looks
    // alive and consumes nothing.
    logger.error({ err: error }, 'start-up failed');
    deps.onFatal?.(error instanceof Error ? error : new Error(String(error)));
  });

  let stopping: Promise<void> | undefined;
  const stop = () =>
    (stopping ??= (async () => {
      logger.info('stopping');
      abort.abort();
      const stopBy = Date.now() + STOP_BUDGET_MS;
      /** Waits for a step until it ends, `capMs` passes or the budget runs out; a step cut short is logged, and the stop goes on. */
      const within = async (what: string, step: Promise<unknown> | undefined, capMs = Number.POSITIVE_INFINITY) => {
        const ms = Math.max(0, Math.min(capMs, stopBy - Date.now()));
        const inTime = await doneWithin(Promise.resolve(step), ms);
        if (!inTime) {
          step?.catch((error: unknown) => logger.error({ err: error }, `${what} failed`));
          logger.error({ step: what, waitedMs: ms }, 'shutdown step did not finish in time; going on');
        }
      };
      // A start-up step that hangs (a storage call that never answers) must not hold the stop: the
      // steps after it do not run (the abort), and what it holds is closed below.
      await within('ending start-up', ready.catch(() => undefined), STOP_STEP_MS);
      await within('closing the HTTP server', app.close(), STOP_STEP_MS); // no new requests; in-flight ones finish
      intake?.stopFetching(); // a batch still waiting on storage gives up: Kafka delivers it again to the next owner
      await within('handing fetched batches to the buffer', intake?.settle(), STOP_STEP_MS); // batches fetched before the pause reach the buffer
      await within('ending the reading of the keys sprayed across replicas', sprayAcrossReplicas?.stop(), STOP_STEP_MS);
      await within('draining the buffer', buffer.stop(), BUFFER_STOP_MS); // stores what is in hand and commits it while still in the group
      await intake?.disconnect(); // leaves the group, within its own deadline (5 s)
      await within('closing the analysis thread', analysis?.close());
      await within('recording what detection vouched for', vouchedWriter.stop(), STOP_STEP_MS);
      await within('stopping alerts', alerts.stop());
      unfollowConfig?.();
      await within('stopping enforcement', enforcement?.stop());
      await within('starting webhooks', webhooksStarted); // a start in progress ends before the stop
      await within('stopping webhooks', webhooks?.stop()); // after alerts: stores the notifications in hand
      await within('closing storage', clickhouse.close());
      logger.info('stopped');
    })());

  return { app, url, clickhouse, store, alertStore, webhookStore, webhooks, metrics, ready, stop };
}

/** Where a retried step's failed attempts, and its success after them, are logged. */
export interface AttemptLog {
  failed(fields: Record<string, unknown>): void;
  succeeded(): void;
}

export interface RetryOptions {
  /** Hears of each failed attempt, with its error. */
  onFailure?(error: unknown): void;
  /**
   * Logs the failed attempts: by default as one failure (FailureLog), "<what> failed" at once, then
   * at most a line a minute with how many followed, and "<what> done after failed attempts".
   */
  failures?: AttemptLog;
  /** The wait after the nth failed attempt: by default 0.5 s, doubling up to 30 s. */
  backoffMs?(attempt: number): number;
}

const startUpBackoffMs = (attempt: number) => Math.min(30_000, 500 * 2 ** (attempt - 1));

/** Retries a start-up step with backoff (a server may come up after the worker does) until it is done or `signal` aborts. */
export async function retryUntilDone(
  what: string,
  logger: Logger,
  signal: AbortSignal,
  step: () => Promise<unknown>,
  { onFailure, failures = new FailureLog(logger, `${what} failed`, `${what} done after failed attempts`), backoffMs = startUpBackoffMs }: RetryOptions = {},
): Promise<void> {
  for (let attempt = 1; ; attempt++) {
    signal.throwIfAborted();
    try {
      await step();
      failures.succeeded();
      return;
    } catch (error) {
      if (signal.aborted) throw error;
      onFailure?.(error);
      const delay = backoffMs(attempt);
      failures.failed({ err: error, attempt, retryInMs: delay });
      await sleep(delay, undefined, { signal });
    }
  }
}

/**
 * Starts the Kafka intake, retried until it runs, its failed starts logged as one failure
 * (FailureLog), as every start-up step's are: the first at once with its error, then a line a minute
 * at most with how many followed, and one when the intake starts. While the brokers cannot be
 * reached, the start is retried every 30 s for as long as that lasts, and a line each time would
 * bury the first. Each line names KAFKA_BROKERS and its host:port entries (never a credential: those are KAFKA_SASL_*,
 * not read here). `timing` is for tests.
 */
export function startKafkaIntake(
  intake: Pick<KafkaIntake, 'start'>,
  brokers: readonly string[],
  logger: Logger,
  signal: AbortSignal,
  timing: { backoffMs?(attempt: number): number; now?(): number } = {},
): Promise<void> {
  const starts = new FailureLog(logger, 'starting kafka intake failed', 'kafka intake started after failed starts', { now: timing.now });
  const failures: AttemptLog = {
    failed: (fields) => starts.failed({ ...fields, setting: 'KAFKA_BROKERS', brokers }),
    succeeded: () => starts.succeeded(),
  };
  return retryUntilDone('starting kafka intake', logger, signal, () => intake.start(), { failures, backoffMs: timing.backoffMs });
}

/** /ready's reason before storage is migrated: with the last attempt's cause once one has failed. */
function notMigratedReason(cause: string | undefined): string {
  return cause === undefined ? 'storage not migrated yet' : `storage not migrated yet (retrying): ${cause}`;
}

/** The longest cause a /ready reason quotes: a server's exception can run on with a stack trace. */
const REASON_CAUSE_MAX_CHARS = 300;

/**
 * A storage error's message as a /ready reason quotes it, which anyone who reaches the port may
 * read: its first line, at most REASON_CAUSE_MAX_CHARS, without the credentials of any URL in it
 * (CLICKHOUSE_URL carries none, but a message may quote another) or the ClickHouse password.
 */
export function storageCause(error: unknown, password: string): string {
  let message = error instanceof Error ? error.message || error.name : String(error);
  if (password) message = message.replaceAll(password, '[REDACTED]');
  message = message.replace(/\b([a-z][a-z0-9+.-]*:\/\/)[^\s/?#]*@/gi, '$1').split('\n', 1)[0]!.trim();
  return message.length > REASON_CAUSE_MAX_CHARS ? `${message.slice(0, REASON_CAUSE_MAX_CHARS)}…` : message;
}

/**
 * Seals with WEBHOOK_SECRET_KEY the merchants' secrets that still need WEBHOOK_SECRET_KEY_PREVIOUS
 * (or were stored before a key was set), and says when the previous key can go. Never stops the
 * start: the secrets still open meanwhile, and the next start tries again.
 */
async function resealWebhookSecrets(store: WebhookStore, hasPreviousKey: boolean, logger: Logger): Promise<void> {
  try {
    const { resealed, unreadable } = await store.resealSecrets();
    if (resealed > 0) logger.info({ resealed }, 'webhook signing secrets sealed again with WEBHOOK_SECRET_KEY');
    if (unreadable > 0) {
      logger.warn({ unreadable }, 'webhook signing secrets that open with no configured key: those merchants get no webhooks until the old key is given as WEBHOOK_SECRET_KEY_PREVIOUS or they register again');
    } else if (hasPreviousKey) {
      logger.info('every webhook signing secret opens with WEBHOOK_SECRET_KEY: once every replica runs with it, WEBHOOK_SECRET_KEY_PREVIOUS can be removed');
    }
  } catch (error) {
    logger.warn({ err: error }, 'sealing webhook signing secrets again failed; they still open, and the next start tries again');
  }
}

/** The storage connection; a DATA_DIR in use by another worker stops the start as an invalid setting does. */
function connectStorage(config: Config, logger: Logger): ClickHouse {
  try {
    return connectClickHouse({
      url: config.clickhouse.url,
      username: config.clickhouse.username,
      password: config.clickhouse.password,
      dataDir: config.clickhouse.dataDir,
      logger,
    });
  } catch (error) {
    if (error instanceof StorageDirectoryInUse) throw new ConfigError([`DATA_DIR: ${config.clickhouse.dataDir} is ${error.message}`]);
    throw error;
  }
}

function formatHost(host: string): string {
  return host.includes(':') ? `[${host}]` : host;
}

async function main(): Promise<void> {
  let config: Config;
  try {
    config = loadConfig();
  } catch (error) {
    if (error instanceof ConfigError) {
      process.stderr.write(`${error.message}\n`);
      process.exit(2);
    }
    throw error;
  }
  const logger = createLogger(config.logLevel);
  const started = startWorker(config, {
    logger,
    // Stop cleanly and exit non-zero, so the orchestrator starts a fresh worker.
    onFatal: (error) => shutdown(`fatal: ${error.message}`, 1),
  });
  let shuttingDown = false;
  function shutdown(reason: string, exitCode = 0): void {
    if (shuttingDown) return;
    shuttingDown = true;
    logger.info({ reason }, 'shutdown requested');
    const forceExit = setTimeout(() => {
      logger.error('shutdown took too long; exiting');
      process.exit(1);
    }, 30_000);
    forceExit.unref();
    started
      .then((worker) => worker.stop())
      .then(
        () => process.exit(exitCode),
        (error: unknown) => {
          logger.error({ err: error }, 'shutdown failed');
          process.exit(1);
        },
      );
  }
  await started;
  // `on`, not `once`: a repeated signal while stopping must not fall back to Node's default (dying
  // mid-drain); shutdown() ignores repeats, and its 30 s timer bounds the stop.
  process.on('SIGTERM', () => shutdown('SIGTERM'));
  process.on('SIGINT', () => shutdown('SIGINT'));
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  main().catch((error: unknown) => {
    if (error instanceof ConfigError) {
      process.stderr.write(`${error.message}\n`);
      process.exit(2);
    }
    process.stderr.write(`fatal: ${error instanceof Error ? error.stack : String(error)}\n`);
    process.exit(1);
  });
}
