/**
 * Credential stuffing across replicas. Kafka spreads a spray's keys over the partitions, so each
 * replica's tally (source-spray.ts) sees its own partitions' share: with R replicas, a network must
 * try about R times the keys that make an alert. The replica that owns partition 0 therefore reads,
 * every SPRAY_ACROSS_REPLICAS_MS, storage's requests of every partition's keys failing from networks
 * that failed for at least SPRAY_MIN_KEYS keys in all, one of them on another replica's partition
 * (EventStore.sprayedRequests), and its engine judges them as a whole (DetectionEngine.judgeFleetSpray).
 * One replica reads, so each merchant gets one alert; around a rebalance two may each open one for
 * a while, and AlertManager resolves the earlier as a duplicate. A replica that owns every partition
 * gets an empty answer (its own tally sees every key). A failed reading is skipped: detection fails
 * open, and the next reading comes SPRAY_ACROSS_REPLICAS_MS later (logged as one failure while they fail).
 */
import { FailureLog } from '../failure-log.ts';
import type { Detection } from '../ingest/analysis-thread.ts';
import type { Logger } from '../logger.ts';
import { MAX_CLOCK_SKEW_MS } from './admission.ts';
import type { SprayedRequests } from './source-spray.ts';

/** How often the owner of partition 0 reads the sprayed keys of every partition: an alert comes this much (and a store flush) after a spray's keys reach the count. */
export const SPRAY_ACROSS_REPLICAS_MS = 15_000;
/** How far behind the clock storage's newest 401 may be for a reading to be taken as of it. */
const READ_BEHIND_MS = 60 * 60_000;

export interface SprayAcrossReplicasOptions {
  /** The partitions this replica owns now. */
  owned(): ReadonlySet<number>;
  /** Storage's requests of the sprayed keys in the 10 minutes to its newest 401 between `times.notBefore` and `times.until`, as of `times.clock` at the latest (EventStore.sprayedRequests). */
  read(times: { notBefore: Date; clock: Date; until: Date }, owned: readonly number[]): Promise<SprayedRequests[]>;
  /** Hands a reading to the engine, which judges it (AnalysisThread.judgeFleetSpray). */
  judge(requests: SprayedRequests[]): Promise<Detection>;
  onDetection(detection: Detection): void;
  logger: Logger;
  everyMs?: number;
  now?(): number;
}

export class SprayAcrossReplicas {
  private timer: NodeJS.Timeout | undefined;
  private reading: Promise<void> | undefined;
  private stopped = false;
  private readonly failures: FailureLog;

  constructor(private readonly options: SprayAcrossReplicasOptions) {
    this.failures = new FailureLog(
      options.logger,
      'cannot read or judge the keys sprayed across replicas: credential stuffing is judged on this replica\'s keys alone until a reading succeeds',
      'the keys sprayed across replicas are read again',
      { level: 'warn', now: options.now },
    );
  }

  /** Starts the readings, unless stop() came first (a start-up that ends after the stop began). */
  start(): void {
    if (this.stopped) return;
    this.timer ??= setInterval(() => void this.check(), this.options.everyMs ?? SPRAY_ACROSS_REPLICAS_MS);
    this.timer.unref();
  }

  /** Stops the timer, and waits for a reading in progress. */
  async stop(): Promise<void> {
    this.stopped = true;
    clearInterval(this.timer);
    await this.reading;
  }

  /** Reads and judges once (the timer's call), unless a reading is in progress. */
  check(): Promise<void> {
    this.reading ??= this.readAndJudge().finally(() => (this.reading = undefined));
    return this.reading;
  }

  private async readAndJudge(): Promise<void> {
    const { options } = this;
    const owned = options.owned();
    if (!owned.has(0)) return;
    try {
      const now = options.now?.() ?? Date.now();
      // As of storage's newest 401 up to MAX_CLOCK_SKEW_MS ahead (as admission takes events in: a 401
      // dated a day ahead is no spray now), and at most an hour behind (a fleet catching up on its topic).
      const times = { notBefore: new Date(now - READ_BEHIND_MS), clock: new Date(now), until: new Date(now + MAX_CLOCK_SKEW_MS) };
      const requests = await options.read(times, [...owned]);
      options.onDetection(await options.judge(requests));
      this.failures.succeeded();
    } catch (error) {
      this.failures.failed({ err: error });
    }
  }
}
