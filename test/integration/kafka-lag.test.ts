/**
 * The Kafka intake through a storage outage and a shutdown, on the real broker: the consumer lag
 * keeps growing while the topic is paused and nothing is consumed, and falls back to 0 once storage
 * is back; a worker stopped while a batch waits on a storage read that does not answer leaves its
 * group and stops every component well within the process's 30 s.
 */
import { describe, expect, it } from 'vitest';
import { createLogger } from '../../src/logger.ts';
import type { ClickHouse } from '../../src/store/clickhouse.ts';
import { useEngines } from '../support/engines.ts';
import { asOfToday, makeEvent } from '../support/events.ts';
import { groupCaughtUp, produceAll } from '../support/kafka.ts';
import { metricTotal, testConfig, testNames, waitFor } from '../support/worker.ts';

describe('Kafka intake: consumer lag during an outage, and shutdown', () => {
  const engines = useEngines();
  const { kafka } = engines;

  it('reports the lag growing during a storage outage, with no batch consumed, and 0 again after it', async () => {
    const own = testNames('lag');
    const startMs = asOfToday(Date.UTC(2026, 10, 21, 5, 0, 0));
    const events = Array.from({ length: 6_000 }, (_, i) => makeEvent(i, { runId: own.runId, startMs, keys: 200 }));
    const messages = events.map((event) => ({ key: event.apiKeyId, value: JSON.stringify(event) }));
    let outage = false;
    let failed = 0;
    const worker = await engines.startWorker(testConfig({ brokers: engines.brokers, clickhouse: engines.clickhouse, names: own }), {
      // The outage at the storage boundary: every insert fails while it lasts.
      wrapStoreRows: (storeRows) => async (body) => {
        if (outage) {
          failed++;
          throw new Error('injected: storage outage');
        }
        return storeRows(body);
      },
    });
    const lag = () => metricTotal(worker, 'security_center_consumer_lag');
    const consumed = () => metricTotal(worker, 'security_center_events_consumed_total');

    await produceAll(engines.producer, own.topic, messages.slice(0, 2_000), 1000);
    await waitFor(() => groupCaughtUp(kafka, own.groupId, own.topic), 'the first part is stored and committed', 60_000);
    await waitFor(async () => (await lag()) === 0, 'no lag before the outage', 15_000, async () => `lag ${await lag()}`);

    outage = true;
    await produceAll(engines.producer, own.topic, messages.slice(2_000, 2_400), 400);
    await waitFor(() => failed >= 2, 'the outage is seen (intake pauses)', 30_000);
    const consumedBefore = await consumed();
    const n = 3_600;
    await produceAll(engines.producer, own.topic, messages.slice(2_400), 1000);
    // Nothing is consumed while paused, yet the lag reaches the messages produced meanwhile (and the
    // 400 taken before the pause, not committed either).
    await waitFor(async () => (await lag()) >= n, `the lag reaches the ${n} messages produced during the outage`, 30_000, async () => `lag ${await lag()}`);
    expect(await consumed()).toBe(consumedBefore);
    expect(await lag()).toBeLessThanOrEqual(n + 400);

    outage = false;
    await waitFor(() => groupCaughtUp(kafka, own.groupId, own.topic), 'storage back: everything is stored and committed', 90_000);
    await waitFor(async () => (await lag()) === 0, 'the lag falls back to 0', 15_000, async () => `lag ${await lag()}`);
    expect(await metricTotal(worker, 'security_center_events_stored_total')).toBe(6_000);
  });

  it('a worker stopped while a batch waits on a storage read that does not answer leaves its group and stops within the budget', async () => {
    const own = testNames('stophang');
    const startMs = asOfToday(Date.UTC(2026, 10, 21, 7, 0, 0));
    const events = Array.from({ length: 1_000 }, (_, i) => makeEvent(i, { runId: own.runId, startMs, keys: 100 }));
    let hanging = 0;
    let release: () => void = () => undefined;
    const released = new Promise<void>((resolve) => (release = resolve));
    const logs: { msg: string }[] = [];
    const config = testConfig({ brokers: engines.brokers, clickhouse: engines.clickhouse, names: own });
    const worker = await engines.startWorker(config, {
      logger: createLogger('info', { write: (line: string) => void logs.push(JSON.parse(line)) }),
      // A black-holed server: the read of how far a partition is stored does not answer (the client's
      // request timeout is 60 s), so the partition's first batch waits on it.
      wrapClickHouse: (db): ClickHouse => ({
        ...db,
        queryRows: async <T,>(query: string, params?: Record<string, unknown>) => {
          if (query.includes('AS max_offset')) {
            hanging++;
            await released;
            throw new Error('injected: request timeout');
          }
          return db.queryRows<T>(query, params);
        },
      }),
    });
    try {
      await produceAll(engines.producer, own.topic, events.map((event) => ({ key: event.apiKeyId, value: JSON.stringify(event) })), 1000);
      await waitFor(() => hanging >= 1, 'a batch waits on the stored-offset read', 30_000);
      const started = Date.now();
      await worker.stop();
      const took = Date.now() - started;
      expect(took).toBeLessThan(15_000);
      const messages = logs.map((entry) => entry.msg);
      expect(messages).toContain('kafka intake stopped'); // left the group, not cut short by its deadline
      expect(messages).toContain('stopped'); // alerts, enforcement, webhooks and storage stopped after it
      expect(messages).not.toContain('shutdown step did not finish in time; going on');
    } finally {
      release();
    }
    // Nothing of the batch was committed: the next worker stores every event once.
    const next = await engines.startWorker(config);
    await waitFor(() => groupCaughtUp(kafka, own.groupId, own.topic), 'the next worker commits to the end', 90_000);
    expect(await metricTotal(next, 'security_center_events_stored_total')).toBe(1_000);
  });
});
