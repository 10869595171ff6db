/**
 * Records the networks detection vouched for (key-history.ts; EventStore.insertVouchedNetworks), a
 * few seconds' worth at a time: at most one per key's place a day, so few rows. It fails open: a
 * write that fails is logged (FailureLog) and its rows are tried again with the next one, up to
 * MAX_HELD rows; beyond that the newest are dropped. A place whose record is lost is not the key's
 * own after a restart until it is tied to the key's own again (its first hop with them is reported
 * once): a false positive, never a missed thief. On a stop, what is held is written once.
 */
import type { VouchedNetwork } from '../detect/engine.ts';
import { FailureLog } from '../failure-log.ts';
import type { Logger } from '../logger.ts';
import type { EventStore } from './event-store.ts';

const FLUSH_EVERY_MS = 5_000;
export const MAX_HELD = 100_000;

export interface VouchedWriterOptions {
  store: Pick<EventStore, 'insertVouchedNetworks'>;
  /** The Kafka topic of a partition's records ('' for HTTP ingest, partition -1). */
  topicOf: (partition: number) => string;
  logger: Logger;
  flushEveryMs?: number;
}

export class VouchedWriter {
  private held: VouchedNetwork[] = [];
  private timer: NodeJS.Timeout | undefined;
  private writing: Promise<void> | undefined;
  private stopped = false;
  private readonly failures: FailureLog;

  constructor(private readonly options: VouchedWriterOptions) {
    this.failures = new FailureLog(options.logger, 'recording the networks detection vouched for failed (kept, tried again)', 'recording the networks detection vouched for works again', { level: 'warn' });
  }

  add(vouched: readonly VouchedNetwork[]): void {
    for (const record of vouched) if (this.held.length < MAX_HELD) this.held.push(record);
    this.flushSoon();
  }

  /** A flush within flushEveryMs, while anything is held (and not after stop). */
  private flushSoon(): void {
    if (this.stopped || this.held.length === 0) return;
    this.timer ??= setTimeout(() => {
      this.timer = undefined;
      void this.flush();
    }, this.options.flushEveryMs ?? FLUSH_EVERY_MS).unref();
  }

  /** Rows held, not yet written. */
  get pending(): number {
    return this.held.length;
  }

  /** Writes what is held (after a write in progress); never rejects. */
  async flush(): Promise<void> {
    while (this.writing) await this.writing;
    if (this.held.length === 0) return;
    const rows = this.held;
    this.held = [];
    this.writing = this.write(rows).finally(() => (this.writing = undefined));
    await this.writing;
  }

  /** Stops the timer and writes what is held, once. */
  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.timer);
    this.timer = undefined;
    await this.flush();
  }

  private async write(rows: VouchedNetwork[]): Promise<void> {
    const byTopic = new Map<string, VouchedNetwork[]>();
    for (const row of rows) {
      const topic = this.options.topicOf(row.partition);
      let group = byTopic.get(topic);
      if (group === undefined) byTopic.set(topic, (group = []));
      group.push(row);
    }
    try {
      for (const [topic, group] of byTopic) await this.options.store.insertVouchedNetworks(topic, group);
      this.failures.succeeded();
    } catch (error) {
      this.failures.failed({ err: error, rows: rows.length });
      // Tried again with the next write (a repeat of rows that did land changes nothing: the table keeps the earliest).
      this.held = rows.concat(this.held).slice(0, MAX_HELD);
      this.flushSoon();
    }
  }
}
