/**
 * The write path to storage. Rows from Kafka batches and HTTP posts accumulate here and are stored
 * in large inserts, by count (STORE_FLUSH_ROWS) or age (STORE_FLUSH_INTERVAL_MS), one insert at a time
 * while the next rows keep accumulating: the engine's throughput depends on large inserts, and the
 * consumer keeps fetching while one is in flight. One exception to the age rule: when intake reports
 * that it has caught up with the end of a backlog (BufferInput.endsBacklog) right after a full insert,
 * the rows waiting are stored at once rather than a second later; at most one such early insert
 * follows each full one, so inserts stay large and few.
 *
 * Contract: a flush's dead letters are produced first, then its rows are stored, then its offsets
 * committed. The order of the first two matters: a restarted consumer skips every offset up to the
 * highest one stored (kafka-consumer.ts), so a dead letter still unsent when its flush's rows were
 * stored would be lost by a crash at that moment. A failed flush is retried with backoff until it succeeds or the buffer is stopped;
 * meanwhile `healthy` is false, onOutage has been called once (the consumer pauses), and nothing is
 * committed. add() resolves when its rows are durable.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import type { Logger } from '../logger.ts';
import type { WorkerMetrics } from '../metrics.ts';
import type { DeadLetter } from './dead-letter.ts';
import { RowBuffer, type RowRange } from './row-buffer.ts';

/** The next offset to consume on a partition, to be committed once everything before it is stored. */
export interface OffsetMark {
  topic: string;
  partition: number;
  offset: number;
}

export interface BufferInput {
  /** Event rows (serializeEventRow lines, without newlines). */
  lines?: readonly string[];
  /** Rows already encoded as newline-terminated bytes (from the analysis thread). */
  encodedRows?: { bytes: Uint8Array; count: number };
  deadLetters?: readonly DeadLetter[];
  offsets?: readonly OffsetMark[];
  /** Intake has just caught up with the end of a backlog: nothing more is waiting to be fetched. */
  endsBacklog?: boolean;
}

export interface EventBufferOptions {
  flushRows: number;
  flushIntervalMs: number;
  /** add() callers wait (waitForCapacity) while this many rows are waiting for the next flush. */
  maxBufferedRows: number;
  storeRows(body: Buffer): Promise<void>;
  sendDeadLetters(records: readonly DeadLetter[]): Promise<void>;
  commit(offsets: readonly OffsetMark[]): Promise<void>;
  onOutage?(): void;
  onRecovery?(): void;
  metrics: WorkerMetrics;
  logger: Logger;
  retryInitialMs?: number;
  retryMaxMs?: number;
}

/** Whether a Kafka source (HTTP ingest has partition -1) is a partition of `topic` no longer owned. */
function isLost(source: { topic: string; partition: number }, topic: string, owned: ReadonlySet<number>): boolean {
  return source.topic === topic && source.partition >= 0 && !owned.has(source.partition);
}

class PendingFlush {
  readonly rows = new RowBuffer();
  deadLetters: DeadLetter[] = [];
  readonly offsets = new Map<string, OffsetMark>();
  /** The rows of each Kafka batch added (an add with one offset mark), by partition. */
  partitionRows: (RowRange & { topic: string; partition: number })[] = [];
  firstAddedAt = 0;
  endsBacklog = false;
  readonly durable: Promise<void>;
  resolve!: () => void;
  reject!: (error: Error) => void;

  constructor() {
    this.durable = new Promise<void>((resolve, reject) => {
      this.resolve = resolve;
      this.reject = reject;
    });
    this.durable.catch(() => undefined); // callers that do not wait must not cause unhandled rejections
  }

  get isEmpty(): boolean {
    return this.rows.rows === 0 && this.deadLetters.length === 0 && this.offsets.size === 0;
  }

  /** Drops the offsets of partitions of `topic` not owned, so they are not committed. */
  releaseOffsets(topic: string, owned: ReadonlySet<number>): void {
    for (const [key, mark] of this.offsets) if (isLost(mark, topic, owned)) this.offsets.delete(key);
  }

  /** Drops the offsets, rows and dead letters of partitions of `topic` not owned; returns the rows dropped. */
  release(topic: string, owned: ReadonlySet<number>): number {
    this.releaseOffsets(topic, owned);
    const lost = (source: { topic: string; partition: number }) => isLost(source, topic, owned);
    this.deadLetters = this.deadLetters.filter((record) => !lost(record.source));
    const dropped = this.partitionRows.filter(lost);
    if (dropped.length === 0) return 0;
    this.rows.remove(dropped);
    // The rows kept moved down by the bytes dropped before them.
    let shift = 0;
    const kept: typeof this.partitionRows = [];
    for (const range of this.partitionRows) {
      if (lost(range)) shift += range.end - range.start;
      else kept.push({ ...range, start: range.start - shift, end: range.end - shift });
    }
    this.partitionRows = kept;
    return dropped.reduce((sum, range) => sum + range.rows, 0);
  }
}

export class EventBuffer {
  private pending = new PendingFlush();
  /** The flush being stored, if any. */
  private inFlight: PendingFlush | undefined;
  private flushLoop: Promise<void> | undefined;
  private timer: NodeJS.Timeout | undefined;
  private draining = false;
  private stopped = false;
  private readonly stopController = new AbortController();
  private capacityWaiters: (() => void)[] = [];
  private readonly outageListeners = new Set<() => void>();
  private _healthy = true;
  /** Whether the last insert was a full one (STORE_FLUSH_ROWS rows): intake was behind. */
  private lastFlushWasFull = false;

  constructor(private readonly options: EventBufferOptions) {}

  /** False while stores are failing. */
  get healthy(): boolean {
    return this._healthy;
  }

  /** Calls the listener when an outage begins; returns a function that removes it. */
  onOutage(listener: () => void): () => void {
    this.outageListeners.add(listener);
    return () => this.outageListeners.delete(listener);
  }

  get bufferedRows(): number {
    return this.pending.rows.rows;
  }

  add(input: BufferInput): Promise<void> {
    if (this.stopped) {
      // Refused, not stored: the caller commits nothing for it. Handled here, like `durable`, for
      // callers that do not wait (a batch that finishes during shutdown).
      const refused = Promise.reject(new Error('event buffer is stopped'));
      refused.catch(() => undefined);
      return refused;
    }
    const pending = this.pending;
    if (pending.isEmpty) pending.firstAddedAt = Date.now();
    const start = pending.rows.byteLength;
    const rowsBefore = pending.rows.rows;
    if (input.lines) for (const line of input.lines) pending.rows.append(line);
    if (input.encodedRows && input.encodedRows.count > 0) pending.rows.appendEncoded(input.encodedRows.bytes, input.encodedRows.count);
    const source = input.offsets?.length === 1 ? input.offsets[0]! : undefined;
    if (source && pending.rows.rows > rowsBefore) {
      pending.partitionRows.push({ topic: source.topic, partition: source.partition, start, end: pending.rows.byteLength, rows: pending.rows.rows - rowsBefore });
    }
    if (input.deadLetters) for (const record of input.deadLetters) pending.deadLetters.push(record);
    if (input.endsBacklog) pending.endsBacklog = true;
    if (input.offsets) {
      for (const mark of input.offsets) {
        const key = `${mark.topic}\u0000${mark.partition}`;
        const previous = pending.offsets.get(key);
        if (!previous || previous.offset < mark.offset) pending.offsets.set(key, mark);
      }
    }
    this.options.metrics.bufferedRows.set(pending.rows.rows);
    this.schedule();
    return pending.durable;
  }

  /**
   * After a rebalance: forgets what it holds for partitions of `topic` this replica no longer owns.
   * Their offsets were not committed, so their new owner reads and stores those messages again;
   * stored here too, they would be counted twice, and committing their old offsets here could move
   * the new owner's committed offset back. Rows and dead letters waiting for the next flush are
   * dropped; a flush already being stored keeps its rows but commits no offset of those partitions.
   * Returns how many rows it dropped.
   */
  releasePartitions(topic: string, owned: ReadonlySet<number>): number {
    this.inFlight?.releaseOffsets(topic, owned);
    const dropped = this.pending.release(topic, owned);
    this.options.metrics.bufferedRows.set(this.pending.rows.rows);
    return dropped;
  }

  /** Waits while the buffer is full (storage slow or down); onWait runs about once a second (heartbeats). */
  async waitForCapacity(onWait?: () => Promise<void>): Promise<void> {
    while (!this.stopped && this.pending.rows.rows >= this.options.maxBufferedRows) {
      await Promise.race([new Promise<void>((resolve) => this.capacityWaiters.push(resolve)), sleep(1_000)]);
      if (onWait) await onWait();
    }
  }

  /** Stores everything added so far (and what is added meanwhile); resolves when it is stored. */
  async drain(): Promise<void> {
    this.draining = true;
    try {
      while (!this.stopped && (!this.pending.isEmpty || this.flushLoop)) {
        this.kick();
        await this.flushLoop;
      }
    } finally {
      this.draining = false;
    }
  }

  /**
   * Drains within the deadline, then stops. Rows not stored by then are given up (their offsets
   * were not committed, so Kafka delivers them again to the next owner).
   */
  async stop(deadlineMs = 10_000): Promise<void> {
    const drained = this.drain().then(() => true);
    const inTime = await Promise.race([drained, sleep(deadlineMs, false, { ref: false })]);
    this.stopped = true;
    this.stopController.abort();
    clearTimeout(this.timer);
    if (!inTime) this.options.logger.error({ rows: this.pending.rows.rows }, 'buffer stopped before its rows were stored');
    this.pending.reject(new Error('event buffer stopped before the rows were stored'));
    for (const wake of this.capacityWaiters.splice(0)) wake();
    await this.flushLoop?.catch(() => undefined);
  }

  private isDue(pending: PendingFlush): boolean {
    if (pending.isEmpty) return false;
    return (
      this.draining ||
      pending.rows.rows >= this.options.flushRows ||
      Date.now() - pending.firstAddedAt >= this.options.flushIntervalMs ||
      // The tail of a backlog: the full inserts before it show intake was behind, and nothing more
      // is coming soon, so waiting out the interval would only delay these rows.
      (pending.endsBacklog && this.lastFlushWasFull)
    );
  }

  private schedule(): void {
    if (this.flushLoop) return; // the loop looks again when the flush in flight ends
    if (this.isDue(this.pending)) {
      this.kick();
    } else if (!this.timer && !this.pending.isEmpty) {
      const wait = Math.max(0, this.options.flushIntervalMs - (Date.now() - this.pending.firstAddedAt));
      this.timer = setTimeout(() => {
        this.timer = undefined;
        this.kick();
      }, wait);
      this.timer.unref();
    }
  }

  private kick(): void {
    if (this.flushLoop || this.stopped) return;
    clearTimeout(this.timer);
    this.timer = undefined;
    this.flushLoop = this.runFlushes().finally(() => {
      this.flushLoop = undefined;
      this.schedule();
    });
  }

  private async runFlushes(): Promise<void> {
    while (this.isDue(this.pending) && !this.stopped) {
      const flush = this.pending;
      this.pending = new PendingFlush();
      this.lastFlushWasFull = flush.rows.rows >= this.options.flushRows;
      this.options.metrics.bufferedRows.set(0);
      for (const wake of this.capacityWaiters.splice(0)) wake();
      this.inFlight = flush;
      try {
        await this.flushWithRetry(flush);
        flush.resolve();
      } catch (error) {
        flush.reject(error as Error);
        return;
      } finally {
        this.inFlight = undefined;
      }
    }
  }

  private async flushWithRetry(flush: PendingFlush): Promise<void> {
    const { metrics, logger } = this.options;
    const started = performance.now();
    const rowCount = flush.rows.rows;
    const body = flush.rows.bytes();
    let rowsStored = rowCount === 0;
    let deadLettersSent = flush.deadLetters.length === 0;
    for (let attempt = 1; ; attempt++) {
      try {
        if (!deadLettersSent) {
          await this.options.sendDeadLetters(flush.deadLetters);
          deadLettersSent = true;
          for (const record of flush.deadLetters) metrics.eventsDeadLettered.inc({ reason: record.reason });
        }
        if (!rowsStored) {
          await this.options.storeRows(body);
          rowsStored = true;
          metrics.eventsStored.inc(rowCount);
        }
        break;
      } catch (error) {
        metrics.flushFailures.inc();
        if (this._healthy) {
          this._healthy = false;
          logger.error({ err: error, rows: rowCount }, 'storing a flush failed; pausing intake and retrying');
          this.options.onOutage?.();
          for (const listener of this.outageListeners) listener();
        }
        if (this.stopped) throw error;
        const backoff = Math.min(this.options.retryMaxMs ?? 5_000, (this.options.retryInitialMs ?? 100) * 2 ** (attempt - 1));
        // Jitter keeps replicas from retrying in lockstep against a recovering server.
        await sleep(backoff * (0.5 + Math.random() / 2), undefined, { signal: this.stopController.signal }).catch(() => undefined);
        if (this.stopped) throw error;
      }
    }
    if (!this._healthy) {
      this._healthy = true;
      logger.info('storage is back; resuming intake');
      this.options.onRecovery?.();
    }
    metrics.flushDuration.observe((performance.now() - started) / 1000);
    if (flush.offsets.size > 0) {
      try {
        await this.options.commit([...flush.offsets.values()]);
      } catch (error) {
        // The rows are stored; a redelivery of these offsets is skipped by their stored offsets.
        logger.warn({ err: error }, 'offset commit failed after the rows were stored');
      }
    }
  }
}
