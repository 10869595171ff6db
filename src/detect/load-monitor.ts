/**
 * Reports how the detection engine stands against its memory budget (EngineLoad, sent back by the
 * analysis thread with each batch): gauges and counters for /metrics, and a warning when the
 * windows start losing events to the budget, then a note when they are whole again. Idle keys'
 * histories dropped for the budget are counted, with a warning at most every WARNING_INTERVAL_MS:
 * this happens in steps (each brings the cost to 90% of the budget), so a warning and a note at
 * each step would flood the log. Events dated too far ahead of the clock, which detection leaves
 * out, and events thinned out of busy keys' history are counted too. So are events velocity_attack
 * may not judge for want of a limit (EngineLoad.eventsWithoutLimit), with a warning at most every
 * WARNING_INTERVAL_MS naming merchants they came from since the last: a fleet that sends no
 * rateLimitPerMinute for enterprise keys otherwise leaves them without velocity alerts, and nothing
 * says so.
 */
import type { Logger } from '../logger.ts';
import type { WorkerMetrics } from '../metrics.ts';
import { MERCHANTS_WITHOUT_LIMIT, type EngineLoad } from './engine.ts';

/** Shed histories, and events without the limit a rule needs, are warned about at most this often; the counters have each. */
export const WARNING_INTERVAL_MS = 10 * 60_000;

export class DetectionLoadMonitor {
  private reported = { shedEvents: 0, forgottenKeys: 0, shedHistories: 0, thinnedEvents: 0, futureEvents: 0, eventsWithoutLimit: 0 };
  private shedding = false;
  /** Histories shed since the last warning about them, and when that was. */
  private shedHistoriesUnwarned = 0;
  private historyWarnedAt = -Infinity;
  /** The same for events without a limit, with (some of) their merchants. */
  private withoutLimitUnwarned = 0;
  private readonly merchantsUnwarned = new Set<string>();
  private withoutLimitWarnedAt = -Infinity;

  constructor(
    private readonly metrics: WorkerMetrics,
    private readonly logger: Logger,
    private readonly clock: () => number = Date.now,
  ) {}

  record(load: EngineLoad, heap?: { usedBytes: number; limitBytes: number }): void {
    const { metrics } = this;
    if (heap) {
      metrics.detectionHeapUsed.set(heap.usedBytes);
      metrics.detectionHeapLimit.set(heap.limitBytes);
    }
    metrics.detectionWindowEvents.set(load.windowEvents);
    metrics.detectionTrackedKeys.set(load.trackedKeys);
    metrics.detectionIdleHistories.set(load.idleHistories);
    metrics.detectionHistoryEntries.set(load.historyEntries);
    metrics.detectionTallyEntries.set(load.tallyEntries);
    metrics.detectionSprayEntries.set(load.sprayEntries);
    metrics.detectionEventsPerKeyCap.set(load.eventsPerKeyCap);
    // The engine counts since its start: a count lower than the last one is a new engine's.
    const since = (count: number, last: number) => (count >= last ? count - last : count);
    const shed = since(load.shedEvents, this.reported.shedEvents);
    const forgotten = since(load.forgottenKeys, this.reported.forgottenKeys);
    const shedHistories = since(load.shedHistories, this.reported.shedHistories);
    const thinned = since(load.thinnedEvents, this.reported.thinnedEvents);
    const future = since(load.futureEvents, this.reported.futureEvents);
    const withoutLimit = since(load.eventsWithoutLimit, this.reported.eventsWithoutLimit);
    if (shed > 0) metrics.detectionShedEvents.inc(shed);
    if (forgotten > 0) metrics.detectionForgottenKeys.inc(forgotten);
    if (shedHistories > 0) metrics.detectionShedHistories.inc(shedHistories);
    if (thinned > 0) metrics.detectionThinnedEvents.inc(thinned);
    if (future > 0) metrics.detectionFutureEvents.inc(future);
    if (withoutLimit > 0) metrics.detectionEventsWithoutLimit.inc(withoutLimit);
    this.reported = {
      shedEvents: load.shedEvents,
      forgottenKeys: load.forgottenKeys,
      shedHistories: load.shedHistories,
      thinnedEvents: load.thinnedEvents,
      futureEvents: load.futureEvents,
      eventsWithoutLimit: load.eventsWithoutLimit,
    };
    this.warnOfShedHistories(shedHistories, load);
    this.warnOfEventsWithoutLimit(withoutLimit, load);

    const shedding = load.eventsPerKeyCap < load.maxEventsPerKey || forgotten > 0;
    if (shedding && !this.shedding) {
      this.logger.warn(
        { windowEvents: load.windowEvents, trackedKeys: load.trackedKeys, historyEntries: load.historyEntries, maxWindowEvents: load.maxWindowEvents, eventsPerKeyCap: load.eventsPerKeyCap, forgottenKeys: forgotten },
        'detection windows are over their memory budget: the busiest keys keep only their newest events (raise DETECTION_MAX_HEAP_MB or add replicas)',
      );
    } else if (!shedding && this.shedding) {
      this.logger.info({ windowEvents: load.windowEvents, trackedKeys: load.trackedKeys }, 'detection windows are within their memory budget again');
    }
    this.shedding = shedding;
  }

  private warnOfShedHistories(shed: number, load: EngineLoad): void {
    this.shedHistoriesUnwarned += shed;
    const now = this.clock();
    if (this.shedHistoriesUnwarned === 0 || now - this.historyWarnedAt < WARNING_INTERVAL_MS) return;
    this.logger.warn(
      { shedHistories: this.shedHistoriesUnwarned, idleHistories: load.idleHistories, historyEntries: load.historyEntries, maxWindowEvents: load.maxWindowEvents },
      'idle keys\' histories were dropped to stay within the detection memory budget: their next networks and places look new (raise DETECTION_MAX_HEAP_MB or add replicas)',
    );
    this.shedHistoriesUnwarned = 0;
    this.historyWarnedAt = now;
  }

  private warnOfEventsWithoutLimit(count: number, load: EngineLoad): void {
    if (count > 0) {
      this.withoutLimitUnwarned += count;
      // A load sent without a batch processed (after a deferred judgement) repeats the last batch's merchants: only new events bring any.
      for (const merchant of load.merchantsWithoutLimit) if (this.merchantsUnwarned.size < MERCHANTS_WITHOUT_LIMIT) this.merchantsUnwarned.add(merchant);
    }
    const now = this.clock();
    if (this.withoutLimitUnwarned === 0 || now - this.withoutLimitWarnedAt < WARNING_INTERVAL_MS) return;
    this.logger.warn(
      { events: this.withoutLimitUnwarned, merchants: [...this.merchantsUnwarned] },
      'events of keys without a default limit (enterprise\'s by default: its limits are custom) carried no rateLimitPerMinute: velocity_attack judges a minute of them only when another of its events not answered 5xx carries one. ' +
        'Have the fleet send each key\'s limit (RateLimit-Limit), or set velocity_attack\'s defaultLimitPerMinute for the plan or merchant in the detection config (a default set high on purpose also stops this count and warning)',
    );
    this.withoutLimitUnwarned = 0;
    this.merchantsUnwarned.clear();
    this.withoutLimitWarnedAt = now;
  }
}
