/**
 * A topic created again (deleted and recreated, or a new cluster: `docker compose down` and `up`
 * with Kafka's data gone) starts its partitions at offset 0 again, under offsets ClickHouse already
 * holds rows for. Those rows are an earlier incarnation's: the new messages at those offsets must be
 * stored, not skipped as redeliveries. Real broker and ClickHouse; the earlier incarnation's rows
 * are written through the event store, as a worker would have stored them.
 */
import type { Producer } from 'kafkajs';
import { describe, expect, it } from 'vitest';
import type { RequestEvent } from '../../src/events/request-event.ts';
import type { Worker } from '../../src/main.ts';
import { serializeEventRow } from '../../src/store/event-store.ts';
import { useEngines } from '../support/engines.ts';
import { asOfToday, makeEvent } from '../support/events.ts';
import { groupCaughtUp } from '../support/kafka.ts';
import { testConfig, testNames, waitFor, type TestNames } from '../support/worker.ts';

const PARTITIONS = 4;

async function metricValues(worker: Worker, name: string): Promise<Record<string, number>> {
  const metric = (await worker.metrics.registry.getMetricsAsJSON()).find((m) => m.name === name);
  return Object.fromEntries((metric?.values ?? []).map((value) => [String(value.labels.reason ?? value.labels.source ?? ''), value.value]));
}

describe('a topic created again', () => {
  const engines = useEngines();
  const { kafka } = engines;

  /** Rows as a worker stores them, of events `evt_old_<runId>_<i>` at these partitions and offsets of the topic. */
  async function storeEarlierIncarnation(worker: Worker, names: TestNames, offsets: { partition: number; offset: number }[]): Promise<void> {
    const rows = offsets.map(({ partition, offset }, i) => {
      const input = makeEvent(i, { runId: `old_${names.runId}`, startMs: asOfToday(Date.UTC(2026, 10, 19, 8, 0, 0)) });
      const event = { ...input, timestamp: Date.parse(String(input.timestamp)) } as unknown as RequestEvent;
      return `${serializeEventRow(event, { topic: names.topic, partition, offset })}\n`;
    });
    await worker.store.insertRows(Buffer.from(rows.join('')));
  }

  /** `count` new events, spread evenly over the partitions. */
  async function produceNew(producer: Producer, names: TestNames, count: number): Promise<void> {
    const events = Array.from({ length: count }, (_, i) => makeEvent(i, { runId: names.runId, startMs: asOfToday(Date.UTC(2026, 10, 19, 10, 0, 0)) }));
    for (let start = 0; start < count; start += 1000) {
      const messages = events.slice(start, start + 1000).map((event, i) => ({ partition: (start + i) % PARTITIONS, key: event.apiKeyId, value: JSON.stringify(event) }));
      await producer.send({ topic: names.topic, acks: -1, messages });
    }
  }

  /**
   * A worker over a topic whose earlier incarnation stored rows at these offsets of every partition,
   * once it has read the `count` events of the new incarnation to the end.
   */
  async function workerOverRecreatedTopic(names: TestNames, earlierOffsets: number[], count: number): Promise<Worker> {
    const worker = await engines.startWorker(testConfig({ brokers: engines.brokers, clickhouse: engines.clickhouse, names }));
    const offsets = earlierOffsets.flatMap((offset) => Array.from({ length: PARTITIONS }, (_, partition) => ({ partition, offset })));
    await storeEarlierIncarnation(worker, names, offsets);
    await produceNew(engines.producer, names, count);
    await waitFor(() => groupCaughtUp(kafka, names.groupId, names.topic), 'the worker commits every partition to its end', 90_000);
    return worker;
  }

  async function storedNew(worker: Worker, names: TestNames): Promise<{ rows: number; ids: number }> {
    const [row] = await worker.clickhouse.queryRows<{ rows: number; ids: number }>(
      `SELECT count() AS rows, uniqExact(event_id) AS ids FROM ${engines.clickhouse.database}.request_events
        WHERE source_topic = {topic:String} AND startsWith(event_id, {prefix:String})`,
      { topic: names.topic, prefix: `evt_${names.runId}_` },
    );
    return { rows: Number(row!.rows), ids: Number(row!.ids) };
  }

  it('stores every new event when the stored offsets reach past the partitions\' end', async () => {
    const names = testNames('recreated_short');
    // The earlier incarnation's rows are at offsets 5000-5009 of every partition; the new one holds 100 a partition.
    const worker = await workerOverRecreatedTopic(names, Array.from({ length: 10 }, (_, i) => 5000 + i), 400);

    expect(await storedNew(worker, names)).toEqual({ rows: 400, ids: 400 });
    expect(await metricValues(worker, 'security_center_events_duplicate_total')).toEqual({});
    expect(await metricValues(worker, 'security_center_stale_stored_offsets_total')).toEqual({ beyond_end: PARTITIONS });
  });

  it('stores every new event when the topic has already grown past the stored offsets, and still skips true redeliveries', async () => {
    const names = testNames('recreated_long');
    // The earlier incarnation stored offsets 0-99 of every partition; the new one holds 500 a partition.
    const worker = await workerOverRecreatedTopic(names, Array.from({ length: 100 }, (_, i) => i), 2_000);

    expect(await storedNew(worker, names)).toEqual({ rows: 2_000, ids: 2_000 });
    expect(await metricValues(worker, 'security_center_events_duplicate_total')).toEqual({});
    expect(await metricValues(worker, 'security_center_stale_stored_offsets_total')).toEqual({ other_events: PARTITIONS });
    await worker.stop();

    // A group that reads the topic again from the start gets every new event a second time, at
    // offsets where both incarnations stored rows: all of them are redeliveries.
    const replay = { ...names, groupId: `${names.groupId}.replay` };
    const again = await engines.startWorker(testConfig({ brokers: engines.brokers, clickhouse: engines.clickhouse, names: replay }));
    await waitFor(() => groupCaughtUp(kafka, replay.groupId, names.topic), 'the replay group reaches the end', 90_000);
    expect(await metricValues(again, 'security_center_events_duplicate_total')).toEqual({ kafka: 2_000 });
    expect(await metricValues(again, 'security_center_stale_stored_offsets_total')).toEqual({});
    expect(await storedNew(again, names)).toEqual({ rows: 2_000, ids: 2_000 });
  });
});
