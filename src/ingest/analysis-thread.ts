/**
 * The main thread's handle on the analysis thread (validation and detection). Requests are handled
 * in the order they are posted, and each call resolves with its result. If the thread dies (out of
 * heap, a native fault), every pending and later call rejects, `ready` too if it had not resolved,
 * and `onFailure` is called once: the worker then stops and exits for its orchestrator to restart
 * it, and Kafka redelivers from the last commit. A worker without its analysis thread would look
 * alive and consume nothing.
 */
import type { KafkaMessage } from 'kafkajs';
import { setFlagsFromString } from 'node:v8';
import { Worker, type WorkerOptions } from 'node:worker_threads';
import type { EngineFinding, EngineLoad, VouchedNetwork } from '../detect/engine.ts';
import type { SprayedRequests } from '../detect/source-spray.ts';
import type { NetworkSighting } from '../detect/key-history.ts';
import type { RequestEvent, TimeRange } from '../events/request-event.ts';
import type { Logger } from '../logger.ts';
import { MAX_COPIED_KEY_BYTES, MAX_COPIED_VALUE_BYTES, type RawBatch, type ValidatedBatch } from './validate-batch.ts';

export interface AnalysisSettings {
  dedupCacheSize: number;
  /** The event times storage holds (storableEventTimes, its bound that moves with the clock taken as of each batch): validation rejects the others. */
  eventTimes: TimeRange;
  /** Run detection (FEATURE_ANOMALY_DETECTION); validation runs either way. */
  detection: boolean;
  entitledPlans: readonly string[];
  geoCityDb?: string;
  geoAsnDb?: string;
  detectionConfigFile?: string;
  /** The thread's old-generation heap limit in MiB (V8's default when undefined). */
  maxHeapMb?: number;
  /** The detection windows' memory budget (EngineOptions.maxWindowEvents). */
  maxWindowEvents: number;
}

/** Warm-up events go to the thread this many at a time, so the engine sheds between chunks and no copy is large. */
const WARM_CHUNK = 10_000;

/** V8's classic semi-space (each half of the young generation) on 64-bit, in MB: the analysis thread's. */
const ANALYSIS_SEMI_SPACE_MB = 16;

export interface Detection {
  findings: EngineFinding[];
  /** Rules that threw, and the engine itself (ruleId ENGINE_ERROR) when a whole batch's detection failed. */
  ruleErrors: { ruleId: string; message: string }[];
  /** The engine against its memory budget after the batch (undefined without detection). */
  load?: EngineLoad;
  /** The thread's V8 heap after the batch: used, and its limit. */
  heap?: { usedBytes: number; limitBytes: number };
  /** The networks the keys' histories vouched for (engine.takeVouched), for storage to record; handed to onVouched. */
  vouched?: VouchedNetwork[];
}

export type BatchAnalysis = Omit<ValidatedBatch, 'events'> & Detection;

export type AnalysisRequest =
  | { kind: 'batch'; id: number; batch: RawBatch }
  | { kind: 'detect'; id: number; events: RequestEvent[] }
  | { kind: 'warm'; id: number; events: RequestEvent[]; partition: number; asOf: number }
  | { kind: 'recall'; id: number; sightings: NetworkSighting[]; partition: number }
  | { kind: 'recallEventIds'; id: number; eventIds: string[]; partition: number }
  | { kind: 'keepPartitions'; id: number; partitions: number[] }
  | { kind: 'fleetSpray'; id: number; requests: SprayedRequests[] };

export type AnalysisResponse = { id: number; result: BatchAnalysis | Detection } | { id: number; error: string };

/** Detection the thread made unasked: keys judged once their REJUDGE_MS wait was over, with no batch to judge them (engine.judgeDue). */
export type DeferredDetection = { kind: 'detection'; detection: Detection };

type Pending = { resolve(result: BatchAnalysis | Detection): void; reject(error: Error): void };
type DistributiveOmit<T, K extends PropertyKey> = T extends unknown ? Omit<T, K> : never;

export class AnalysisThread {
  private readonly worker: Worker;
  private readonly pending = new Map<number, Pending>();
  private nextId = 0;
  private failure: Error | undefined;
  private rejectReady: (error: Error) => void = () => undefined;
  private died = false;
  /** Resolves when the thread has loaded its rules and GeoIP database. */
  readonly ready: Promise<void>;
  /**
   * Receives the detections the thread makes unasked (DeferredDetection), as those of batches are
   * handled; without it, they are dropped.
   */
  onDeferredDetection?: (detection: Detection) => void;
  /** Receives the networks detection vouched for, for storage to record (key-history.ts); without it, they are dropped. */
  onVouched?: (vouched: VouchedNetwork[]) => void;

  constructor(
    settings: AnalysisSettings,
    logger: Logger,
    private readonly onFailure: (error: Error) => void = () => undefined,
  ) {
    // The .mjs entry registers the TypeScript loader in the thread, however the main thread was started.
    this.worker = startWorkerThread(new URL('./analysis-thread.mjs', import.meta.url), {
      workerData: settings,
      // Out of heap, the thread alone ends (ERR_WORKER_OUT_OF_MEMORY), not the process.
      ...(settings.maxHeapMb !== undefined && { resourceLimits: { maxOldGenerationSizeMb: settings.maxHeapMb } }),
    });
    let markReady!: () => void;
    this.ready = new Promise<void>((resolve, reject) => {
      markReady = resolve;
      this.rejectReady = reject;
    });
    this.ready.catch(() => undefined); // a caller that never awaits it is told through onFailure
    this.worker.on('message', (message: AnalysisResponse | DeferredDetection | { kind: 'ready' } | { kind: 'log'; level: 'info' | 'warn' | 'error'; message: string }) => {
      if ('kind' in message) {
        if (message.kind === 'ready') markReady();
        else if (message.kind === 'detection') this.onDeferredDetection?.(message.detection);
        else logger[message.level]({ component: 'analysis' }, message.message);
        return;
      }
      const pending = this.pending.get(message.id);
      this.pending.delete(message.id);
      if (!pending) return;
      if ('error' in message) return pending.reject(new Error(`analysis thread: ${message.error}`));
      if (message.result.vouched !== undefined && message.result.vouched.length > 0) this.onVouched?.(message.result.vouched);
      pending.resolve(message.result);
    });
    this.worker.on('error', (error) => this.fail(error));
    this.worker.on('exit', (code) => this.fail(new Error(`analysis thread exited with code ${code}`)));
  }

  /** Validates a Kafka batch, stores nothing, and runs detection on its accepted events. */
  analyzeBatch(topic: string, partition: number, messages: readonly KafkaMessage[]): Promise<BatchAnalysis> {
    const batch = packBatch(topic, partition, messages);
    return this.request({ kind: 'batch', batch }, [batch.values.buffer as ArrayBuffer, batch.keys.buffer as ArrayBuffer]) as Promise<BatchAnalysis>;
  }

  /** Runs detection on events validated elsewhere (HTTP ingest). */
  detect(events: RequestEvent[]): Promise<Detection> {
    return this.request({ kind: 'detect', events });
  }

  /** Loads history into the windows without judging it, as of `asOf` (the partition's newest stored event: DetectionEngine.warm). */
  async warm(events: readonly RequestEvent[], partition: number, asOf: number): Promise<void> {
    for (let start = 0; start < events.length; start += WARM_CHUNK) {
      await this.request({ kind: 'warm', events: events.slice(start, start + WARM_CHUNK), partition, asOf });
    }
  }

  /** Loads what storage remembers of keys' networks into detection's memory of them. */
  async recall(sightings: NetworkSighting[], partition: number): Promise<void> {
    await this.request({ kind: 'recall', sightings, partition });
  }

  /**
   * Remembers the eventIds storage holds of a partition an assignment brought, as validation
   * remembers those it accepts, so that a re-publish of one of them is dropped as a repeat.
   */
  async recallEventIds(eventIds: string[], partition: number): Promise<void> {
    await this.request({ kind: 'recallEventIds', eventIds, partition });
  }

  keepPartitions(partitions: number[]): Promise<Detection> {
    return this.request({ kind: 'keepPartitions', partitions });
  }

  /** Judges storage's reading of the keys sprayed across replicas (DetectionEngine.judgeFleetSpray). */
  judgeFleetSpray(requests: SprayedRequests[]): Promise<Detection> {
    return this.request({ kind: 'fleetSpray', requests });
  }

  async close(): Promise<void> {
    this.failure ??= new Error('analysis thread closed');
    await this.worker.terminate();
  }

  private request(request: DistributiveOmit<AnalysisRequest, 'id'>, transfer: ArrayBuffer[] = []): Promise<BatchAnalysis | Detection> {
    if (this.failure) return Promise.reject(this.failure);
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      this.worker.postMessage({ ...request, id }, transfer);
    });
  }

  /** Why the thread stopped, if it died rather than being closed. */
  get failureReason(): string | undefined {
    return this.died ? `analysis thread stopped: ${this.failure!.message}` : undefined;
  }

  private fail(error: Error): void {
    const unexpected = this.failure === undefined;
    this.failure ??= error;
    this.rejectReady(this.failure);
    for (const pending of this.pending.values()) pending.reject(this.failure);
    this.pending.clear();
    if (unexpected) {
      this.died = true;
      this.onFailure(error);
    }
  }
}

/**
 * Starts a worker thread with semi-spaces of 16 MB, whatever the process was started with. The
 * start commands give Node semi-spaces of 64 MB (`--max-semi-space-size=64`, which Node 24 also
 * chooses by default on these machines) for the main thread, whose scavenges copy the Kafka fetch
 * in hand: fewer of them, the larger they are. V8 applies that size to every thread, over
 * `resourceLimits`, and with detection the analysis thread ran slower with it (README,
 * Performance). So the flag is set before the thread starts: V8 reads it when a thread's heap is
 * made, and the main thread keeps the heap it was made with. It stays set: a thread started later
 * gets 16 MB too. Node calls changing V8 flags after start-up undefined behaviour in general; this
 * one, before a thread starts, is checked by a test on the Node versions CI runs (20 and 24).
 */
export function startWorkerThread(script: URL | string, options: WorkerOptions): Worker {
  setFlagsFromString(`--max-semi-space-size=${ANALYSIS_SEMI_SPACE_MB}`);
  return new Worker(script, options);
}

/**
 * Copies what the thread needs of the messages into typed arrays (the values into one transferable
 * buffer), so the caller need not keep the messages while the batch waits for analysis: kept, the
 * in-flight batches' message objects survived every young-generation collection of the main thread.
 */
function packBatch(topic: string, partition: number, messages: readonly KafkaMessage[]): RawBatch {
  let total = 0;
  let keysTotal = 0;
  for (const message of messages) {
    total += Math.min(message.value?.length ?? 0, MAX_COPIED_VALUE_BYTES);
    keysTotal += Math.min(message.key?.length ?? 0, MAX_COPIED_KEY_BYTES);
  }
  const values = new Uint8Array(total);
  const ends = new Uint32Array(messages.length);
  const keys = new Uint8Array(keysTotal);
  const keyEnds = new Uint32Array(messages.length);
  const offsets = new Float64Array(messages.length);
  const timestamps = new Float64Array(messages.length);
  let position = 0;
  let keyPosition = 0;
  messages.forEach((message, index) => {
    if (message.value) {
      const copied = message.value.length > MAX_COPIED_VALUE_BYTES ? message.value.subarray(0, MAX_COPIED_VALUE_BYTES) : message.value;
      values.set(copied, position);
      position += copied.length;
    }
    if (message.key) {
      const copied = message.key.length > MAX_COPIED_KEY_BYTES ? message.key.subarray(0, MAX_COPIED_KEY_BYTES) : message.key;
      keys.set(copied, keyPosition);
      keyPosition += copied.length;
    }
    ends[index] = position;
    keyEnds[index] = keyPosition;
    offsets[index] = Number(message.offset);
    timestamps[index] = Number(message.timestamp);
  });
  return { topic, partition, values, ends, keys, keyEnds, offsets, timestamps };
}
