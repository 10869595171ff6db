/**
 * The analysis thread (started through analysis-thread.mjs): validates Kafka batches and runs
 * detection off the main thread, in the order work arrives, so that parsing, validation and rules
 * use one core while the main thread fetches from Kafka and the storage engine inserts on the other.
 * It owns the RecentEventIds of the Kafka path and the detection windows.
 */
import { getHeapStatistics } from 'node:v8';
import { parentPort, workerData } from 'node:worker_threads';
import { RULES } from '../../rules/index.ts';
import { DetectionConfig, followDetectionConfig } from '../detect/detection-config.ts';
import { DetectionEngine, ENGINE_ERROR, REJUDGE_MS, type EngineFinding } from '../detect/engine.ts';
import { openGeoLookup } from '../detect/geo.ts';
import type { BatchEvent } from '../events/request-event.ts';
import type { AnalysisRequest, AnalysisResponse, AnalysisSettings, DeferredDetection } from './analysis-thread.ts';
import { RecentEventIds } from './recent-event-ids.ts';
import { validateBatch } from './validate-batch.ts';

const settings = workerData as AnalysisSettings;
const recentIds = new RecentEventIds(settings.dedupCacheSize);
const port = parentPort!;

let config = new DetectionConfig();
const ruleErrors: { ruleId: string; message: string }[] = [];
if (settings.detectionConfigFile) {
  const file = settings.detectionConfigFile;
  followDetectionConfig(file, RULES, {
    loaded(loaded) {
      config = loaded;
      port.postMessage({ kind: 'log', level: 'info', message: 'detection config loaded', file });
    },
    refused(error) {
      port.postMessage({ kind: 'log', level: 'error', message: `detection config refused, keeping the previous one: ${error.message}` });
    },
  });
}

const geo = settings.detection ? await openGeoLookup({ cityDb: settings.geoCityDb, asnDb: settings.geoAsnDb }) : undefined;
for (const file of geo?.ipv4OnlyFiles ?? []) {
  port.postMessage({ kind: 'log', level: 'warn', message: `${file} holds IPv4 addresses only: requests from IPv6 addresses get no place or operator from it; use a database that covers both` });
}
const engine = settings.detection
  ? new DetectionEngine({
      rules: RULES,
      entitledPlans: settings.entitledPlans,
      geo,
      config: () => config,
      maxWindowEvents: settings.maxWindowEvents,
      // The clock `detect` caps its `now` with: events dated more than MAX_CLOCK_SKEW_MS ahead of it stay out of the windows.
      clock: Date.now,
      onRuleError: (ruleId, error) => ruleErrors.push({ ruleId, message: error instanceof Error ? error.message : String(error) }),
    })
  : undefined;
/** Plans whose events detection judges: validation's fast path makes event objects for these alone (UnjudgedEvent). */
const judgedPlans: ReadonlySet<string> = new Set(engine ? settings.entitledPlans : []);

/**
 * A key a rule found something for waits REJUDGE_MS before that rule judges it again, and a batch
 * judges it once the wait is over. When no batch comes (the ingest went quiet), this timer does: at
 * the end of the earliest wait, for the keys of partitions that have had no batch for REJUDGE_MS
 * (by the clock: the waits are in event time, which lags it when events reach detection late), and
 * sends its detections to the main thread unasked (a DeferredDetection). Unref'd, it never keeps
 * the thread alive; it is not set while no key waits.
 */
let deferredTimer: NodeJS.Timeout | undefined;
let deferredTimerAt = Infinity;
/** By partition, when its last batch reached detection (the clock). */
const lastBatchAt = new Map<number, number>();
const quietPartition = (partition: number) => Date.now() - (lastBatchAt.get(partition) ?? Number.NEGATIVE_INFINITY) >= REJUDGE_MS;

function scheduleDeferredJudgement(): void {
  const due = engine?.nextDeferredDue();
  // Not before a partition that just had a batch can be quiet.
  const at = due === undefined ? undefined : Math.max(due, Date.now() + REJUDGE_MS);
  if (at !== undefined && deferredTimer !== undefined && deferredTimerAt <= at) return; // set for then or sooner
  clearTimeout(deferredTimer);
  deferredTimer = undefined;
  if (at === undefined) return;
  deferredTimerAt = at;
  deferredTimer = setTimeout(judgeDeferredKeys, at - Date.now()).unref();
}

/** This thread's V8 heap, the worker's largest (its windows and histories), against its limit (DETECTION_MAX_HEAP_MB). */
function heap(): { usedBytes: number; limitBytes: number } {
  const statistics = getHeapStatistics();
  return { usedBytes: statistics.used_heap_size, limitBytes: statistics.heap_size_limit };
}

function judgeDeferredKeys(): void {
  deferredTimer = undefined;
  let findings: EngineFinding[] = [];
  try {
    findings = engine!.judgeDue(Date.now(), quietPartition);
  } catch (error) {
    ruleErrors.push({ ruleId: ENGINE_ERROR, message: error instanceof Error ? error.message : String(error) });
  }
  if (findings.length > 0 || ruleErrors.length > 0) {
    const message: DeferredDetection = { kind: 'detection', detection: { findings, ruleErrors: ruleErrors.splice(0), load: engine!.load, heap: heap() } };
    port.postMessage(message);
  }
  scheduleDeferredJudgement();
}

/**
 * Rules judge windows as of the batch's events (never later than the clock), a minute of event time
 * at a time, so a consumer catching up on a backlog still sees the attacks in it (processBatch). An
 * event dated far ahead does not move `now` past the clock, and the engine keeps it out of the
 * windows (admission.ts).
 */
function detect(events: readonly BatchEvent[], partition: number): EngineFinding[] {
  if (!engine || events.length === 0) return [];
  lastBatchAt.set(partition, Date.now());
  try {
    return engine.processBatch(events, Date.now(), partition);
  } catch (error) {
    // Rules are isolated inside the engine; this is the engine itself. Detection fails open: the
    // batch's events are still stored, and the failure is counted and logged like a rule's.
    ruleErrors.push({ ruleId: ENGINE_ERROR, message: error instanceof Error ? error.message : String(error) });
    return [];
  } finally {
    scheduleDeferredJudgement();
  }
}

port.on('message', (request: AnalysisRequest) => {
  let response: AnalysisResponse;
  try {
    switch (request.kind) {
      case 'batch': {
        const { events, ...result } = validateBatch(request.batch, recentIds, settings.eventTimes, Date.now(), judgedPlans);
        const findings = detect(events, request.batch.partition);
        response = { id: request.id, result: { ...result, findings, ruleErrors: ruleErrors.splice(0), load: engine?.load, heap: heap(), vouched: engine?.takeVouched() } };
        port.postMessage(response, [result.rows.buffer as ArrayBuffer]);
        return;
      }
      case 'detect':
        response = { id: request.id, result: { findings: detect(request.events, -1), ruleErrors: ruleErrors.splice(0), load: engine?.load, heap: heap(), vouched: engine?.takeVouched() } };
        break;
      case 'warm':
        engine?.warm(request.events, request.partition, request.asOf);
        response = { id: request.id, result: { findings: [], ruleErrors: [], vouched: engine?.takeVouched() } };
        break;
      case 'recall':
        engine?.recall(request.sightings, request.partition);
        response = { id: request.id, result: { findings: [], ruleErrors: [] } };
        break;
      case 'recallEventIds':
        // Stored by another replica, or by this one before a restart: a re-publish is a repeat.
        for (const eventId of request.eventIds) recentIds.checkAndAdd(eventId, request.partition);
        response = { id: request.id, result: { findings: [], ruleErrors: [] } };
        break;
      case 'keepPartitions': {
        const owned = new Set(request.partitions);
        // Rows of a lost partition not yet stored are dropped; if it comes back, they are delivered
        // again and must not be taken for repeats.
        recentIds.keepPartitions(owned);
        engine?.keepPartitions(owned);
        response = { id: request.id, result: { findings: [], ruleErrors: [] } };
        break;
      }
      case 'fleetSpray':
        response = { id: request.id, result: { findings: engine?.judgeFleetSpray(request.requests, Date.now()) ?? [], ruleErrors: ruleErrors.splice(0) } };
        break;
    }
  } catch (error) {
    response = { id: request.id, error: error instanceof Error ? error.message : String(error) };
  }
  port.postMessage(response);
});
port.postMessage({ kind: 'ready' });
