import { describe, expect, it } from 'vitest';
import { createLogger } from '../logger.ts';
import { WorkerMetrics } from '../metrics.ts';
import type { DeadLetter } from './dead-letter.ts';
import { EventBuffer, type OffsetMark } from './event-buffer.ts';

/** A body's rows as text. */
function text(body: readonly Uint8Array[]): string {
  return Buffer.concat(body).toString('utf8');
}

interface BufferTestOptions {
  flushRows?: number;
  flushIntervalMs?: number;
  failures?: number;
  storeGate?: Promise<void>;
  /** Replaces the store (after the gate and the counted failures). */
  storeRows?: (body: readonly Uint8Array[], signal: AbortSignal, dedupToken: string) => Promise<void>;
  /** Dead letters fail to be produced while this says so. */
  deadLettersFail?: () => boolean;
  deadLetterTopic?: string;
}

function buffer(options: BufferTestOptions = {}) {
  const stored: string[][] = [];
  const deadLetters: DeadLetter[] = [];
  const commits: OffsetMark[][] = [];
  const events: string[] = [];
  const logs: { msg: string; level: number }[] = [];
  /** The deduplication token of every attempt to store, failed ones included. */
  const tokens: string[] = [];
  let failuresLeft = options.failures ?? 0;
  const metrics = new WorkerMetrics({ defaultMetrics: false });
  const eventBuffer = new EventBuffer({
    flushRows: options.flushRows ?? 3,
    flushIntervalMs: options.flushIntervalMs ?? 60_000,
    maxBufferedRows: 100,
    retryInitialMs: 1,
    retryMaxMs: 5,
    storeRows: async (body, signal, dedupToken) => {
      await options.storeGate;
      tokens.push(dedupToken);
      if (failuresLeft-- > 0) {
        events.push('store failed');
        throw new Error('injected');
      }
      if (options.storeRows) return options.storeRows(body, signal, dedupToken);
      events.push('stored');
      stored.push(text(body).trim().split('\n'));
    },
    sendDeadLetters: async (records) => {
      if (options.deadLettersFail?.()) {
        events.push('dead letters failed');
        throw new Error('injected: the topic refuses');
      }
      events.push('dead letters sent');
      deadLetters.push(...records);
    },
    deadLetterTopic: options.deadLetterTopic,
    commit: async (offsets) => {
      events.push('committed');
      commits.push([...offsets]);
    },
    onOutage: () => events.push('outage'),
    onRecovery: () => events.push('recovery'),
    metrics,
    logger: createLogger('info', { write: (line: string) => logs.push(JSON.parse(line) as { msg: string; level: number }) }),
  });
  return { eventBuffer, stored, commits, events, deadLetters, logs, metrics, tokens };
}

/** Waits until `condition` holds, polling every millisecond or so. */
async function until(condition: () => boolean): Promise<void> {
  const deadline = Date.now() + 5_000;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error('condition not met in time');
    await new Promise((resolve) => setTimeout(resolve, 1));
  }
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

  it('stores the rows of each add as they came, in order, without copying them into one buffer', async () => {
    const bodies: (readonly Uint8Array[])[] = [];
    const { eventBuffer } = buffer({ flushRows: 3, storeRows: async (body) => void bodies.push(body) });
    const batch = Buffer.from('1\n2\n');
    void eventBuffer.add({ encodedRows: { bytes: batch, count: 2 } });
    await eventBuffer.add({ lines: ['3', '4'] });
    expect(bodies).toHaveLength(1);
    expect(bodies[0]![0]).toBe(batch); // the batch's own memory, not a copy of it
    expect(text(bodies[0]!)).toBe('1\n2\n3\n4\n');
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

  it('stores every attempt of a flush under one deduplication token, and each flush under its own', async () => {
    // An attempt may land although it failed (a timeout): storage drops its retry by the token.
    const { eventBuffer, stored, tokens } = buffer({ flushRows: 1, failures: 2 });
    await eventBuffer.add({ lines: ['{"a":1}'] });
    await eventBuffer.add({ lines: ['{"a":2}'] });
    expect(stored).toEqual([['{"a":1}'], ['{"a":2}']]);
    expect(tokens).toHaveLength(4);
    const [first, ...retries] = tokens.slice(0, 3);
    expect(first).toMatch(/^[0-9a-f-]{36}$/);
    expect(retries).toEqual([first, first]);
    expect(tokens[3]).not.toBe(first);
  });

  it("keeps a flush's token when rows of partitions it lost leave it between attempts", async () => {
    // Its first attempt may have landed: a new token would store the rows left, and count them, again.
    let storageDown = true;
    const attempts: { body: string; token: string }[] = [];
    const { eventBuffer, stored } = buffer({
      flushRows: 1000,
      storeRows: async (body, _signal, token) => {
        attempts.push({ body: text(body), token });
        if (storageDown) throw new Error('injected: the answer was lost');
        stored.push(text(body).trim().split('\n'));
      },
    });
    void eventBuffer.add({ lines: ['p0 a'], offsets: [{ topic: 't', partition: 0, offset: 1 }] });
    void eventBuffer.add({ lines: ['p1 a'], offsets: [{ topic: 't', partition: 1, offset: 1 }] });
    const drained = eventBuffer.drain();
    await until(() => attempts.length >= 1);
    eventBuffer.releasePartitions('t', new Set([0]));
    storageDown = false;
    await drained;
    expect(stored).toEqual([['p0 a']]);
    expect(attempts[0]!.body).toBe('p0 a\np1 a\n');
    expect(attempts.at(-1)!.body).toBe('p0 a\n');
    expect(new Set(attempts.map((attempt) => attempt.token)).size).toBe(1);
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

  it('a flush that loses partitions at two of its attempts stores only the rows of those still owned', async () => {
    let attempts = 0;
    const rebalances: (() => void)[] = [];
    const { eventBuffer, stored, commits } = buffer({
      flushRows: 1000,
      storeRows: async (body) => {
        rebalances.shift()?.(); // lands while this attempt runs: its rows leave before the next
        if (++attempts < 3) throw new Error('injected: storage down');
        stored.push(text(body).trim().split('\n'));
      },
    });
    const mark = (partition: number, offset: number) => ({ topic: 't', partition, offset });
    void eventBuffer.add({ lines: ['p0 a'], offsets: [mark(0, 1)] });
    void eventBuffer.add({ lines: ['p1 a', 'p1 b'], offsets: [mark(1, 2)] });
    void eventBuffer.add({ lines: ['http'] });
    void eventBuffer.add({ encodedRows: { bytes: Buffer.from('p2 a\n'), count: 1 }, offsets: [mark(2, 1)] });
    void eventBuffer.add({ lines: ['p0 b'], offsets: [mark(0, 3)] });
    rebalances.push(
      () => eventBuffer.releasePartitions('t', new Set([0, 2])),
      () => eventBuffer.releasePartitions('t', new Set([0])),
    );
    await eventBuffer.drain();
    expect(attempts).toBe(3);
    expect(stored).toEqual([['p0 a', 'http', 'p0 b']]);
    expect(commits).toEqual([[mark(0, 3)]]);
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
  it('a flush retried after its partitions moved stores none of their rows and commits none of their offsets', async () => {
    // Storage is down while a rebalance gives partition 1 to another replica, which stores it from
    // the committed offset: the retry once storage is back must leave it out. The attempt running at
    // the rebalance keeps its body whole (it is a view of the flush's rows).
    let storageDown = true;
    let releaseNow: (() => void) | undefined;
    const attempts: { before: string; after: string }[] = [];
    const { eventBuffer, stored, commits, deadLetters, events } = buffer({
      flushRows: 1000,
      storeRows: async (body) => {
        const before = text(body);
        releaseNow?.(); // the rebalance lands while this attempt runs
        releaseNow = undefined;
        attempts.push({ before, after: text(body) });
        if (storageDown) throw new Error('injected: storage down');
        stored.push(text(body).trim().split('\n'));
      },
    });
    const mark = (partition: number, offset: number) => ({ topic: 't', partition, offset });
    void eventBuffer.add({ lines: ['p0 a'], deadLetters: [deadLetterOf(0)], offsets: [mark(0, 2)] });
    void eventBuffer.add({ lines: ['p1 a', 'p1 b'], deadLetters: [deadLetterOf(1)], offsets: [mark(1, 3)] });
    void eventBuffer.add({ lines: ['http'] });
    void eventBuffer.add({ lines: ['p0 b'], offsets: [mark(0, 4)] });
    let droppedFromWaiting: number | undefined;
    releaseNow = () => (droppedFromWaiting = eventBuffer.releasePartitions('t', new Set([0])));
    const drained = eventBuffer.drain();
    await until(() => attempts.length >= 2);
    storageDown = false;
    await drained;

    expect(droppedFromWaiting).toBe(0); // nothing waited: all was in flight
    expect(attempts[0]).toEqual({ before: 'p0 a\np1 a\np1 b\nhttp\np0 b\n', after: 'p0 a\np1 a\np1 b\nhttp\np0 b\n' });
    expect(attempts.slice(1).every((attempt) => attempt.before === 'p0 a\nhttp\np0 b\n')).toBe(true);
    expect(stored).toEqual([['p0 a', 'http', 'p0 b']]);
    expect(commits).toEqual([[mark(0, 4)]]);
    // Its dead letters went before the rows, at the first attempt: sent is sent.
    expect(deadLetters.map((record) => record.source.partition)).toEqual([0, 1]);
    expect(events.filter((event) => event === 'recovery')).toHaveLength(1);
  });

  it('counts in security_center_buffered_rows the rows of a flush retried through a storage outage, less those of partitions it lost, until they are stored', async () => {
    let storageDown = true;
    let attempts = 0;
    const { eventBuffer, metrics } = buffer({
      flushRows: 3,
      storeRows: async () => {
        attempts++;
        if (storageDown) throw new Error('injected: storage down');
      },
    });
    const gauge = async () => (await metrics.registry.getSingleMetric('security_center_buffered_rows')!.get()).values[0]!.value;
    void eventBuffer.add({ lines: ['p0 a', 'p0 b'], offsets: [{ topic: 't', partition: 0, offset: 2 }] });
    void eventBuffer.add({ lines: ['p1 a'], offsets: [{ topic: 't', partition: 1, offset: 1 }] }); // a full flush: it starts
    await until(() => attempts >= 3);
    expect(await gauge()).toBe(3); // not 0: those rows still wait to be stored
    void eventBuffer.add({ lines: ['p0 c'], offsets: [{ topic: 't', partition: 0, offset: 3 }] });
    expect(await gauge()).toBe(4); // and the rows added meanwhile
    expect(eventBuffer.bufferedRows).toBe(1); // what STORE_MAX_BUFFERED_ROWS caps: those waiting for the next flush
    eventBuffer.releasePartitions('t', new Set([0])); // partition 1 moves to another replica: its row leaves the flush before the next attempt
    const before = attempts;
    await until(() => attempts >= before + 2);
    expect(await gauge()).toBe(3);
    storageDown = false;
    await eventBuffer.drain();
    expect(await gauge()).toBe(0);
  });

  it('a flush whose dead letters keep failing sends none of partitions it lost, and commits only the others', async () => {
    let topicDown = true;
    const { eventBuffer, stored, commits, deadLetters, events } = buffer({ flushRows: 1000, deadLettersFail: () => topicDown });
    const mark = (partition: number, offset: number) => ({ topic: 't', partition, offset });
    void eventBuffer.add({ lines: ['p0 a'], deadLetters: [deadLetterOf(0)], offsets: [mark(0, 2)] });
    void eventBuffer.add({ lines: ['p1 a'], deadLetters: [deadLetterOf(1)], offsets: [mark(1, 2)] });
    void eventBuffer.add({ deadLetters: [deadLetterOf(2)], offsets: [mark(2, 7)] }); // a batch of dead letters only
    const drained = eventBuffer.drain();
    await until(() => events.includes('dead letters failed'));
    eventBuffer.releasePartitions('t', new Set([0]));
    topicDown = false;
    await drained;
    expect(deadLetters.map((record) => record.source.partition)).toEqual([0]);
    expect(stored).toEqual([['p0 a']]);
    expect(commits).toEqual([[mark(0, 2)]]);
  });

  it('a flush of partitions all lost meanwhile stores and commits nothing, and recovers', async () => {
    let storageDown = true;
    let attempts = 0;
    const { eventBuffer, stored, commits } = buffer({
      flushRows: 1,
      storeRows: async (body) => {
        attempts++;
        if (storageDown) throw new Error('injected: storage down');
        stored.push(text(body).trim().split('\n'));
      },
    });
    const durable = eventBuffer.add({ lines: ['p1 a'], offsets: [{ topic: 't', partition: 1, offset: 5 }] });
    await until(() => attempts > 0);
    eventBuffer.releasePartitions('t', new Set());
    storageDown = false;
    await durable;
    expect(stored).toEqual([]);
    expect(commits).toEqual([]);
    expect(eventBuffer.healthy).toBe(true);
  });

  it('gives up at the stop deadline on an insert that hangs, aborting it, and commits nothing', async () => {
    let signalSeen: AbortSignal | undefined;
    const { eventBuffer, commits } = buffer({
      flushRows: 1,
      storeRows: (_body, signal) => {
        signalSeen = signal;
        return new Promise<void>(() => undefined); // a black-holed server: never answers
      },
    });
    const durable = eventBuffer.add({ lines: ['{"a":1}'], offsets: [{ topic: 't', partition: 0, offset: 1 }] });
    await until(() => signalSeen !== undefined);
    const started = Date.now();
    await eventBuffer.stop(100);
    expect(Date.now() - started).toBeLessThan(1_000);
    expect(signalSeen?.aborted).toBe(true);
    await expect(durable).rejects.toThrow();
    expect(commits).toEqual([]);
  }, 5_000);

  it('reports failing dead letters as the dead-letter topic failing, not storage, and holds the offsets', async () => {
    let topicDown = true;
    const { eventBuffer, stored, commits, events, logs, metrics } = buffer({ flushRows: 1, deadLettersFail: () => topicDown, deadLetterTopic: 'requests.dlq' });
    const durable = eventBuffer.add({ lines: ['{"a":1}'], deadLetters: [deadLetterOf(0)], offsets: [{ topic: 't', partition: 0, offset: 2 }] });
    await until(() => events.filter((event) => event === 'dead letters failed').length >= 2);
    expect(eventBuffer.healthy).toBe(false);
    expect(eventBuffer.failure).toBe('dead letters');
    expect(eventBuffer.storageUp).toBe(true);
    expect(eventBuffer.unhealthyReason).toMatch(/dead-letter topic.*requests\.dlq/);
    expect(eventBuffer.unhealthyReason).not.toMatch(/storage/);
    const errors = logs.filter((line) => line.level >= 50).map((line) => line.msg);
    expect(errors).toHaveLength(1);
    expect(errors[0]).toMatch(/dead letters to requests\.dlq failed/);
    expect(errors[0]).not.toMatch(/storing/);
    expect(stored).toEqual([]);
    expect(commits).toEqual([]);
    expect(events.filter((event) => event === 'outage')).toHaveLength(1);
    // Counted as the topic's failures: storage's counter, which its alerts watch, stays at 0.
    expect((await metrics.deadLetterFailures.get()).values[0]?.value).toBeGreaterThanOrEqual(2);
    expect((await metrics.flushFailures.get()).values[0]?.value ?? 0).toBe(0);

    topicDown = false;
    await durable;
    expect(events.slice(-4)).toEqual(['dead letters sent', 'stored', 'recovery', 'committed']);
    expect(eventBuffer.healthy).toBe(true);
    expect(eventBuffer.unhealthyReason).toBeUndefined();
  });

  it('names the kind of storage failure in the reason, never its message, and logs a new kind during the outage', async () => {
    // The server refuses connections, then (up again) is out of memory, then takes the rows.
    const failures = [
      Object.assign(new Error('connect ECONNREFUSED 10.0.0.7:8123'), { code: 'ECONNREFUSED' }),
      Object.assign(new Error('Code: 241. DB::Exception: Memory limit exceeded while inserting row pk_live_secretish'), { code: '241', type: 'MEMORY_LIMIT_EXCEEDED' }),
      Object.assign(new Error('Code: 241. DB::Exception: Memory limit exceeded again'), { code: '241', type: 'MEMORY_LIMIT_EXCEEDED' }),
    ];
    const reasons: (string | undefined)[] = [];
    let gate: () => void = () => {};
    const { eventBuffer, logs } = buffer({
      flushRows: 1,
      storeRows: async () => {
        const failure = failures.shift();
        if (failure) {
          reasons.push(eventBuffer.unhealthyReason);
          throw failure;
        }
        reasons.push(eventBuffer.unhealthyReason);
        gate();
      },
    });
    const stored = new Promise<void>((resolve) => (gate = resolve));
    void eventBuffer.add({ lines: ['{"a":1}'], offsets: [{ topic: 't', partition: 0, offset: 1 }] });
    await stored;
    // Seen by the next attempt: the reason of the failure before it.
    expect(reasons).toEqual([undefined, 'storage unavailable: ECONNREFUSED', 'storage unavailable: MEMORY_LIMIT_EXCEEDED', 'storage unavailable: MEMORY_LIMIT_EXCEEDED']);
    await until(() => eventBuffer.unhealthyReason === undefined);
    expect(logs.filter((line) => line.level >= 40).map((line) => line.msg)).toEqual([
      'storing a flush failed; pausing intake and retrying',
      'storing a flush still fails, now for another reason; retrying',
    ]);
    await eventBuffer.stop(10);
  });

  it('reports a failing insert as storage unavailable', async () => {
    const { eventBuffer, events } = buffer({ flushRows: 1, failures: Number.POSITIVE_INFINITY });
    void eventBuffer.add({ lines: ['{"a":1}'], offsets: [{ topic: 't', partition: 0, offset: 1 }] });
    await until(() => events.includes('store failed'));
    expect(eventBuffer.failure).toBe('storage');
    expect(eventBuffer.storageUp).toBe(false);
    expect(eventBuffer.unhealthyReason).toBe('storage unavailable');
    await eventBuffer.stop(10);
  });
});
