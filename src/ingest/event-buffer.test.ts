import { describe, expect, it } from 'vitest';
import { createLogger } from '../logger.ts';
import { WorkerMetrics } from '../metrics.ts';
import type { DeadLetter } from './dead-letter.ts';
import { EventBuffer, type OffsetMark } from './event-buffer.ts';

function buffer(options: { flushRows?: number; flushIntervalMs?: number; failures?: number; storeGate?: Promise<void> } = {}) {
  const stored: string[][] = [];
  const deadLetters: DeadLetter[] = [];
  const commits: OffsetMark[][] = [];
  const events: string[] = [];
  let failuresLeft = options.failures ?? 0;
  const eventBuffer = new EventBuffer({
    flushRows: options.flushRows ?? 3,
    flushIntervalMs: options.flushIntervalMs ?? 60_000,
    maxBufferedRows: 100,
    retryInitialMs: 1,
    retryMaxMs: 5,
    storeRows: async (body) => {
      await options.storeGate;
      if (failuresLeft-- > 0) {
        events.push('store failed');
        throw new Error('injected');
      }
      events.push('stored');
      stored.push(body.toString('utf8').trim().split('\n'));
    },
    sendDeadLetters: async (records) => {
      events.push('dead letters sent');
      deadLetters.push(...records);
    },
    commit: async (offsets) => {
      events.push('committed');
      commits.push([...offsets]);
    },
    onOutage: () => events.push('outage'),
    onRecovery: () => events.push('recovery'),
    metrics: new WorkerMetrics({ defaultMetrics: false }),
    logger: createLogger('silent'),
  });
  return { eventBuffer, stored, commits, events, deadLetters };
}

function deadLetterOf(partition: number): DeadLetter {
  return {
    reason: 'invalid_json',
    errors: [],
    source: { topic: 't', partition, offset: '1' },
    payload: '{',
    payloadTruncated: false,
    deadLetteredAt: new Date(0).toISOString(),
  };
}

describe('EventBuffer', () => {
  it('flushes when enough rows wait, storing before committing the highest offset per partition', async () => {
    const { eventBuffer, stored, commits, events } = buffer({ flushRows: 3 });
    void eventBuffer.add({ lines: ['{"a":1}'], offsets: [{ topic: 't', partition: 0, offset: 5 }] });
    const durable = eventBuffer.add({ lines: ['{"a":2}', '{"a":3}'], offsets: [{ topic: 't', partition: 0, offset: 9 }, { topic: 't', partition: 1, offset: 2 }] });
    await durable;
    expect(stored).toEqual([['{"a":1}', '{"a":2}', '{"a":3}']]);
    expect(commits).toEqual([[{ topic: 't', partition: 0, offset: 9 }, { topic: 't', partition: 1, offset: 2 }]]);
    expect(events).toEqual(['stored', 'committed']);
  });

  it('flushes on age when few rows wait', async () => {
    const { eventBuffer, stored } = buffer({ flushRows: 1000, flushIntervalMs: 20 });
    const started = Date.now();
    await eventBuffer.add({ lines: ['{"a":1}'] });
    expect(stored).toHaveLength(1);
    expect(Date.now() - started).toBeGreaterThanOrEqual(15);
  });

  it('stores the tail of a backlog at once after a full insert, and only then', async () => {
    const { eventBuffer, stored } = buffer({ flushRows: 2, flushIntervalMs: 60_000 });
    // Not behind before: a caught-up batch waits for the interval like any other.
    void eventBuffer.add({ lines: ['{"a":0}'], endsBacklog: true });
    await new Promise((resolve) => setTimeout(resolve, 20));
    expect(stored).toEqual([]);
    await eventBuffer.add({ lines: ['{"a":1}'] }); // a full insert: intake was behind
    expect(stored).toEqual([['{"a":0}', '{"a":1}']]);
    const tail = eventBuffer.add({ lines: ['{"a":2}'], endsBacklog: true });
    await tail; // long before the 60 s interval
    expect(stored).toEqual([['{"a":0}', '{"a":1}'], ['{"a":2}']]);
    // That early insert was not full: the next caught-up batch waits again (one early insert per full one).
    void eventBuffer.add({ lines: ['{"a":3}'], endsBacklog: true });
    await new Promise((resolve) => setTimeout(resolve, 20));
    expect(stored).toHaveLength(2);
  });

  it('retries a failed store, reports the outage once, commits only after it succeeds', async () => {
    const { eventBuffer, stored, events } = buffer({ flushRows: 1, failures: 3 });
    await eventBuffer.add({ lines: ['{"a":1}'], deadLetters: [], offsets: [{ topic: 't', partition: 0, offset: 1 }] });
    expect(events).toEqual(['store failed', 'outage', 'store failed', 'store failed', 'stored', 'recovery', 'committed']);
    expect(stored).toEqual([['{"a":1}']]);
    expect(eventBuffer.healthy).toBe(true);
  });

  it('after a rebalance, drops the rows, dead letters and offsets it holds of partitions it no longer owns', async () => {
    const { eventBuffer, stored, commits, deadLetters } = buffer({ flushRows: 1000 });
    const mark = (partition: number, offset: number) => ({ topic: 't', partition, offset });
    void eventBuffer.add({ lines: ['p0 a', 'p0 b'], offsets: [mark(0, 2)] });
    void eventBuffer.add({ lines: ['http'] });
    void eventBuffer.add({ lines: ['p1 a'], deadLetters: [deadLetterOf(1)], offsets: [mark(1, 2)] });
    void eventBuffer.add({ lines: ['p2 a'], deadLetters: [deadLetterOf(2)], offsets: [mark(2, 1)] });
    void eventBuffer.add({ lines: ['p1 b', 'p1 c'], offsets: [mark(1, 4)] });
    void eventBuffer.add({ lines: ['p0 c'], offsets: [mark(0, 3)] });

    expect(eventBuffer.releasePartitions('t', new Set([0, 2]))).toBe(3);
    expect(eventBuffer.bufferedRows).toBe(5);
    expect(eventBuffer.releasePartitions('other-topic', new Set())).toBe(0);
    await eventBuffer.drain();
    expect(stored).toEqual([['p0 a', 'p0 b', 'http', 'p2 a', 'p0 c']]);
    expect(commits).toEqual([[mark(0, 3), mark(2, 1)]]);
    expect(deadLetters.map((record) => record.source.partition)).toEqual([2]);
  });

  it('a flush being stored when its partitions move stores its rows but commits none of their offsets', async () => {
    let openGate!: () => void;
    const { eventBuffer, stored, commits } = buffer({ flushRows: 1, storeGate: new Promise<void>((resolve) => (openGate = resolve)) });
    const durable = eventBuffer.add({ lines: ['p1 a'], offsets: [{ topic: 't', partition: 1, offset: 5 }] });
    expect(eventBuffer.releasePartitions('t', new Set([0]))).toBe(0); // nothing waits: the row is in flight
    openGate();
    await durable;
    expect(stored).toEqual([['p1 a']]);
    expect(commits).toEqual([]);
  });

  it('sends a flush\'s dead letters before storing its rows, and not again when the store is retried', async () => {
    // A restart skips offsets up to the highest stored one: a dead letter must never trail its rows.
    const { eventBuffer, events } = buffer({ flushRows: 1, failures: 1 });
    await eventBuffer.add({ lines: ['{"a":1}'], deadLetters: [deadLetterOf(0)], offsets: [{ topic: 't', partition: 0, offset: 2 }] });
    expect(events).toEqual(['dead letters sent', 'store failed', 'outage', 'stored', 'recovery', 'committed']);
  });

  it('drains what it holds on stop, and refuses rows afterwards', async () => {
    const { eventBuffer, stored } = buffer({ flushRows: 1000 });
    void eventBuffer.add({ lines: ['{"a":1}', '{"a":2}'] });
    await eventBuffer.stop();
    expect(stored).toEqual([['{"a":1}', '{"a":2}']]);
    await expect(eventBuffer.add({ lines: ['{"a":3}'] })).rejects.toThrow(/stopped/);
    // A caller that does not wait (a Kafka batch that finishes during shutdown) must not cause an
    // unhandled rejection, which would end the process in the middle of its shutdown.
    const unhandled: unknown[] = [];
    const onUnhandled = (reason: unknown) => unhandled.push(reason);
    process.on('unhandledRejection', onUnhandled);
    try {
      void eventBuffer.add({ lines: ['{"a":4}'], offsets: [{ topic: 't', partition: 0, offset: 4 }] });
      await new Promise((resolve) => setTimeout(resolve, 20));
    } finally {
      process.off('unhandledRejection', onUnhandled);
    }
    expect(unhandled).toEqual([]);
    expect(stored).toEqual([['{"a":1}', '{"a":2}']]);
  });

  it('gives up at the stop deadline during an outage without committing', async () => {
    const { eventBuffer, commits } = buffer({ flushRows: 1, failures: Number.POSITIVE_INFINITY });
    const durable = eventBuffer.add({ lines: ['{"a":1}'], offsets: [{ topic: 't', partition: 0, offset: 1 }] });
    await eventBuffer.stop(50);
    await expect(durable).rejects.toThrow();
    expect(commits).toEqual([]);
  });
});
