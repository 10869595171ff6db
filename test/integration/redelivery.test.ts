/**
 * Redelivery and replicas on the real engines: messages delivered again from an older offset (as
 * after a crash between store and commit) are not stored twice; two replicas in one consumer group
 * split the partitions and store every event once between them.
 */
import { describe, expect, it } from 'vitest';
import type { Worker } from '../../src/main.ts';
import { useEngines } from '../support/engines.ts';
import { makeEvent } from '../support/events.ts';
import { groupCaughtUp, produceAll } from '../support/kafka.ts';
import { testConfig, testNames, waitFor } from '../support/worker.ts';

const names = testNames('redeliver');
const eventOptions = { runId: names.runId, startMs: Date.UTC(2026, 10, 20, 14, 0, 0) };

function counterValue(worker: Worker, name: string): Promise<number> {
  return worker.metrics.registry.getMetricsAsJSON().then((metrics) => {
    const metric = metrics.find((m) => m.name === name);
    return (metric?.values ?? []).reduce((sum, v) => sum + v.value, 0);
  });
}

describe('redelivery and replicas', () => {
  const engines = useEngines();
  const { kafka } = engines;

  async function countRows(worker: Worker): Promise<{ rows: number; ids: number }> {
    const [row] = await worker.clickhouse.queryRows<{ rows: number; ids: number }>(
      `SELECT count() AS rows, uniqExact(event_id) AS ids FROM ${engines.clickhouse.database}.request_events`,
    );
    return row!;
  }

  it('two replicas in one group split the partitions and store every event once', async () => {
    const events = Array.from({ length: 20_000 }, (_, i) => makeEvent(i, eventOptions));
    const config = testConfig({ brokers: engines.brokers, clickhouse: engines.clickhouse, names });
    const workers = [await engines.startWorker(config), await engines.startWorker(config)];
    // Produce once the group has settled with both members owning partitions.
    const owned = () => Promise.all(workers.map((worker) => counterValue(worker, 'security_center_assigned_partitions')));
    await waitFor(
      async () => (await owned()).every((count) => count > 0),
      'both replicas own partitions',
      60_000,
      async () => `partitions owned: ${(await owned()).join(' and ')}`,
    );
    await produceAll(engines.producer, names.topic, events.map((event) => ({ key: event.apiKeyId, value: JSON.stringify(event) })), 1000);
    await waitFor(() => groupCaughtUp(kafka, names.groupId, names.topic), 'both replicas commit to the end', 90_000);

    const consumed = await Promise.all(workers.map((worker) => counterValue(worker, 'security_center_events_consumed_total')));
    expect(consumed.every((count) => count > 0)).toBe(true); // each replica owned partitions
    expect(consumed[0]! + consumed[1]!).toBe(20_000);
    expect(await countRows(workers[0]!)).toEqual({ rows: 20_000, ids: 20_000 });
  });

  it('skips messages already stored when they are delivered again from an older offset', async () => {
    // A topic of its own, stored once by a first group; a second group then starts from the
    // beginning, so every message it reads is a redelivery of a stored one.
    const own = testNames('replay');
    const startMs = Date.UTC(2026, 10, 20, 16, 0, 0); // an hour of its own, for the rollup total below
    const events = Array.from({ length: 5_000 }, (_, i) => makeEvent(i, { runId: own.runId, startMs }));
    await produceAll(engines.producer, own.topic, events.map((event) => ({ key: event.apiKeyId, value: JSON.stringify(event) })), 1000);
    const first = await engines.startWorker(testConfig({ brokers: engines.brokers, clickhouse: engines.clickhouse, names: own }));
    await waitFor(() => groupCaughtUp(kafka, own.groupId, own.topic), 'the first group stores the topic', 90_000);
    await first.stop();

    const replayGroup = `${own.groupId}.replay`;
    const worker = await engines.startWorker(testConfig({ brokers: engines.brokers, clickhouse: engines.clickhouse, names: { ...own, groupId: replayGroup } }));
    await waitFor(() => groupCaughtUp(kafka, replayGroup, own.topic), 'replay group reaches the end', 90_000);
    expect(await counterValue(worker, 'security_center_events_duplicate_total')).toBe(5_000);
    expect(await counterValue(worker, 'security_center_events_stored_total')).toBe(0);
    const [row] = await worker.clickhouse.queryRows<{ rows: number; ids: number }>(
      `SELECT count() AS rows, uniqExact(event_id) AS ids FROM ${engines.clickhouse.database}.request_events WHERE source_topic = {topic:String}`,
      { topic: own.topic },
    );
    expect(row).toEqual({ rows: 5_000, ids: 5_000 });
    const totals = await worker.store.trafficTotals({ from: new Date(startMs - 60_000), to: new Date(startMs + 60_000) });
    expect(totals.requests).toBe(5_000);
  });
});
