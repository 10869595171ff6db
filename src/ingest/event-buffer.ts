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
 * meanwhile `healthy` is false (`failure` says whether storage or the dead-letter topic fails),
 * onOutage has been called once (the consumer pauses), and nothing is committed. Partitions lost in
 * a rebalance while a flush is retried leave it between two attempts (releasePartitions). At stop's
 * deadline the attempt in flight is aborted and given up. add() resolves when its rows are durable.
 * Every attempt of a flush is stored under the flush's own deduplication token: when an attempt
 * landed although it was reported failed (a timeout, a connection reset), storage drops the retry
 * that repeats it, where the views would otherwise count the flush twice (EventStore.insertRows).
 */
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { doneWithin, unlessAborted } from '../deadlines.ts';
import type { Logger } from '../logger.ts';
import type { WorkerMetrics } from '../metrics.ts';
import type { DeadLetter } from './dead-letter.ts';
import { RowChunks, type RowRange } from './row-buffer.ts';

/** The next offset to consume on a partition, to be committed once everything before it is stored. */
export interface OffsetMark {
  topic: string;
  partition: number;
  offset: number;
}

export interface BufferInput {
  /** Event rows (serializeEventRow lines, without newlines). */
  lines?: readonly string[];
  /** Rows already encoded as newline-terminated bytes (from the analysis thread): kept as they are, not copied. */
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
  /**
   * Stores rows (newline-terminated, in chunks to be stored in order, as ClickHouse.insert takes
   * them); `signal` aborts when the buffer gives up on the insert (stop's deadline).
   * `dedupToken` is the same on every attempt of one flush and differs between flushes.
   */
  storeRows(body: readonly Uint8Array[], signal: AbortSignal, dedupToken: string): Promise<void>;
  sendDeadLetters(records: readonly DeadLetter[]): Promise<void>;
  /** The topic sendDeadLetters produces to, named when it fails. */
  deadLetterTopic?: string;
  commit(offsets: readonly OffsetMark[]): Promise<void>;
  onOutage?(): void;
  onRecovery?(): void;
  metrics: WorkerMetrics;
  logger: Logger;
  retryInitialMs?: number;
  retryMaxMs?: number;
}

type Source = { topic: string; partition: number };

/** Whether a Kafka source (HTTP ingest has partition -1) is a partition of `topic` no longer owned. */
function isLost(source: Source, topic: string, owned: ReadonlySet<number>): boolean {
  return source.topic === topic && source.partition >= 0 && !owned.has(source.partition);
}

function partitionKey(source: Source): string {
  return `${source.topic}\u0000${source.partition}`;
}

/** What a flush failing to be stored fails at: producing its dead letters, or storing its rows. */
export type FlushFailure = 'dead letters' | 'storage';

/** Rejects with an AbortError as soon as `signal` aborts, leaving `work` to settle unobserved. */
/** Waits for `work`; an AbortError once the stop deadline aborts `signal`, whether or not `work` is done. */
async function untilAborted(work: Promise<unknown>, signal: AbortSignal): Promise<void> {
  await unlessAborted(work, signal);
  if (signal.aborted) throw new DOMException('given up at the stop deadline', 'AbortError');
}

class PendingFlush {
  deadLetters: DeadLetter[] = [];
  readonly offsets = new Map<string, OffsetMark>();
  /** The rows of each Kafka batch added (an add with one offset mark), by partition. */
  partitionRows: (RowRange & { topic: string; partition: number })[] = [];
  firstAddedAt = 0;
  endsBacklog = false;
  /**
   * Partitions (partitionKey) lost in a rebalance while this flush was being stored: their rows and
   * dead letters not yet sent leave it before its next attempt (dropLost), never during one.
   */
  readonly lostPartitions = new Set<string>();
  /**
   * Storage's deduplication token for every attempt of this flush, kept when dropLost removes rows
   * between attempts: the body only ever shrinks, so an earlier attempt that landed unseen stored
   * every row still in it, and a repeat under the same token adds nothing (ClickHouse tracks the
   * token per partition). A new token would store those rows, and count them, a second time.
   */
  readonly dedupToken = randomUUID();
  readonly rows = new RowChunks();
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
    return this.drop((source) => isLost(source, topic, owned));
  }

  /**
   * For a flush being stored: drops the offsets of partitions of `topic` not owned at once (nothing
   * reads them before the commit), and marks those partitions for dropLost; returns the rows marked.
   */
  markLost(topic: string, owned: ReadonlySet<number>): number {
    this.releaseOffsets(topic, owned);
    let rows = 0;
    for (const range of this.partitionRows) {
      if (isLost(range, topic, owned)) {
        this.lostPartitions.add(partitionKey(range));
        rows += range.rows;
      }
    }
    for (const record of this.deadLetters) if (isLost(record.source, topic, owned)) this.lostPartitions.add(partitionKey(record.source));
    return rows;
  }

  /** Drops the rows and dead letters of partitions marked lost; returns how many of each. */
  dropLost(): { rows: number; deadLetters: number } {
    if (this.lostPartitions.size === 0) return { rows: 0, deadLetters: 0 };
    const deadLettersBefore = this.deadLetters.length;
    const rows = this.drop((source) => this.lostPartitions.has(partitionKey(source)));
    this.lostPartitions.clear();
    return { rows, deadLetters: deadLettersBefore - this.deadLetters.length };
  }

  /** Drops the rows and dead letters of the sources `lost` says; returns the rows dropped. */
  private drop(lost: (source: Source) => boolean): number {
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
  /** What the flush in hand fails at, until it succeeds. */
  private _failure: FlushFailure | undefined;
  /**
   * The kind of the last storage failure while storage fails (errorKind), for `/ready`: never the
   * error's message, which may quote the rows it refused.
   */
  private storageCause: string | undefined;
  /** Whether the last insert was a full one (STORE_FLUSH_ROWS rows): intake was behind. */
  private lastFlushWasFull = false;

  constructor(private readonly options: EventBufferOptions) {}

  /** False while flushes are failing: storage, or the dead-letter topic (see `failure`). */
  get healthy(): boolean {
    return this._failure === undefined;
  }

  /** What flushes are failing at, while they are. */
  get failure(): FlushFailure | undefined {
    return this._failure;
  }

  /** False while inserts into storage (ClickHouse) are failing; a failing dead-letter topic leaves it true. */
  get storageUp(): boolean {
    return this._failure !== 'storage';
  }

  /** Why flushes are not going through, for `/ready`; undefined while they are. */
  get unhealthyReason(): string | undefined {
    if (this._failure === 'storage') return this.storageCause ? `storage unavailable: ${this.storageCause}` : 'storage unavailable';
    if (this._failure === 'dead letters') return `dead-letter topic unavailable: cannot produce dead letters to ${this.deadLetterTopic}`;
    return undefined;
  }

  private get deadLetterTopic(): string {
    return this.options.deadLetterTopic ?? 'the dead-letter topic';
  }

  /** Calls the listener when an outage begins; returns a function that removes it. */
  onOutage(listener: () => void): () => void {
    this.outageListeners.add(listener);
    return () => this.outageListeners.delete(listener);
  }

  /**
   * Rows waiting for the next flush, not those of the flush being stored: what maxBufferedRows caps
   * (add() callers wait at it, posts are refused at it), so that the next rows keep accumulating
   * while one flush is stored, up to a full one when the cap is STORE_FLUSH_ROWS.
   */
  get bufferedRows(): number {
    return this.pending.rows.rows;
  }

  /**
   * Sets security_center_buffered_rows: every validated row not stored yet, those waiting for the
   * next flush and those of the flush being stored (retried through an outage, it may hold
   * everything that piled up), so that the gauge does not read 0 while storage is out.
   */
  private reportBufferedRows(): void {
    this.options.metrics.bufferedRows.set(this.pending.rows.rows + (this.inFlight?.rows.rows ?? 0));
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
    if (input.lines) pending.rows.appendLines(input.lines);
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
    this.reportBufferedRows();
    this.schedule();
    return pending.durable;
  }

  /**
   * After a rebalance: forgets what it holds for partitions of `topic` this replica no longer owns.
   * Their offsets were not committed, so their new owner reads and stores those messages again;
   * stored here too, they would be counted twice, and committing their old offsets here could move
   * the new owner's committed offset back. Rows and dead letters waiting for the next flush are
   * dropped. A flush already being stored commits no offset of those partitions; its rows of them
   * (and dead letters not sent yet) leave it before its next attempt if the one running fails (a
   * storage outage: the new owner may store them meanwhile), while the attempt running keeps them.
   * `owned` is what the replica keeps through the rebalance: a partition the group gives back to a
   * replica it had dropped meanwhile (a session that timed out) is left out of it, as lost, since
   * another replica may have stored and committed it since (kafka-consumer.ts).
   * Returns how many rows it dropped from those waiting.
   */
  releasePartitions(topic: string, owned: ReadonlySet<number>): number {
    this.inFlight?.markLost(topic, owned);
    const dropped = this.pending.release(topic, owned);
    this.reportBufferedRows();
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
    const inTime = await doneWithin(this.drain(), deadlineMs);
    this.stopped = true;
    // Cuts a retry's sleep short and gives up on the insert (or dead-letter send) in flight: its
    // offsets are not committed, so its rows are delivered again.
    this.stopController.abort();
    clearTimeout(this.timer);
    if (!inTime) {
      const rows = this.pending.rows.rows + (this.inFlight?.rows.rows ?? 0);
      this.options.logger.error({ rows }, 'buffer stopped before its rows were stored');
    }
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
        this.reportBufferedRows(); // stored, or given up at the stop deadline
      }
    }
  }

  private async flushWithRetry(flush: PendingFlush): Promise<void> {
    const { metrics, logger } = this.options;
    const started = performance.now();
    const signal = this.stopController.signal;
    let rowsStored = false;
    let deadLettersSent = false;
    for (let attempt = 1; ; attempt++) {
      // Between attempts, never during one: an attempt's body is a view of the flush's rows.
      const dropped = flush.dropLost();
      if (dropped.rows > 0 || dropped.deadLetters > 0) {
        logger.info(dropped, 'dropped rows of a retried flush whose partitions moved to another replica');
        this.reportBufferedRows();
      }
      const rowCount = flush.rows.rows;
      if (rowCount === 0) rowsStored = true;
      if (flush.deadLetters.length === 0) deadLettersSent = true;
      let stage: FlushFailure = 'dead letters';
      try {
        if (!deadLettersSent) {
          await untilAborted(this.options.sendDeadLetters(flush.deadLetters), signal);
          deadLettersSent = true;
          for (const record of flush.deadLetters) metrics.eventsDeadLettered.inc({ reason: record.reason });
        }
        stage = 'storage';
        if (!rowsStored) {
          await untilAborted(this.options.storeRows(flush.rows.bytes(), signal, flush.dedupToken), signal);
          rowsStored = true;
          metrics.eventsStored.inc(rowCount);
        }
        break;
      } catch (error) {
        if (signal.aborted) throw error; // given up at the stop deadline, not a failure of storage
        (stage === 'storage' ? metrics.flushFailures : metrics.deadLetterFailures).inc();
        if (stage === 'storage') {
          const cause = errorKind(error);
          // The first failure is logged below; a new kind of failure during the outage (the server
          // refusing connections, then out of memory) is news to on-call too.
          if (this._failure === 'storage' && cause !== this.storageCause) logger.warn({ err: error, rows: rowCount, was: this.storageCause }, 'storing a flush still fails, now for another reason; retrying');
          this.storageCause = cause;
        }
        if (this._failure !== stage) {
          const wasHealthy = this._failure === undefined;
          this._failure = stage;
          if (stage === 'storage') {
            logger.error({ err: error, rows: rowCount }, 'storing a flush failed; pausing intake and retrying');
          } else {
            logger.error(
              { err: error, deadLetters: flush.deadLetters.length, topic: this.options.deadLetterTopic },
              `producing dead letters to ${this.deadLetterTopic} failed; pausing intake and retrying (nothing is committed until they are produced)`,
            );
          }
          if (wasHealthy) {
            this.options.onOutage?.();
            for (const listener of this.outageListeners) listener();
          }
        }
        if (this.stopped) throw error;
        const backoff = Math.min(this.options.retryMaxMs ?? 5_000, (this.options.retryInitialMs ?? 100) * 2 ** (attempt - 1));
        // Jitter keeps replicas from retrying in lockstep against a recovering server.
        await sleep(backoff * (0.5 + Math.random() / 2), undefined, { signal }).catch(() => undefined);
        if (this.stopped) throw error;
      }
    }
    if (this._failure) {
      logger.info(this._failure === 'storage' ? 'storage is back; resuming intake' : `dead letters are produced to ${this.deadLetterTopic} again; resuming intake`);
      this._failure = undefined;
      this.storageCause = undefined;
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

/**
 * An error's kind, without its message: a ClickHouse error's type (MEMORY_LIMIT_EXCEEDED), a
 * network error's code (ECONNREFUSED), or its class's name.
 */
export function errorKind(error: unknown): string | undefined {
  if (!(error instanceof Error)) return undefined;
  const { type, code } = error as Error & { type?: unknown; code?: unknown };
  if (typeof type === 'string' && /^[A-Z0-9_]{1,64}$/.test(type)) return type;
  if (typeof code === 'string' && /^[A-Z0-9_]{1,64}$/.test(code)) return code;
  return error.name !== 'Error' && /^[A-Za-z]{1,64}$/.test(error.name) ? error.name : undefined;
}
