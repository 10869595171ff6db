/**
 * The backbone on the real engines: request events from a Kafka-protocol broker into ClickHouse.
 * 100k events with 1% malformed and some published twice: every valid one is stored and counted once
 * by the metrics (rollup) and detection (raw) queries; every malformed one is dead-lettered with its
 * reason and without secrets.
 */
import { describe, expect, it } from 'vitest';
import type { RequestEvent } from '../../src/events/request-event.ts';
import type { EventStore } from '../../src/store/event-store.ts';
import { useEngines } from '../support/engines.ts';
import { asOfToday, makeEvent, makeMixedStream } from '../support/events.ts';
import { groupCaughtUp, produceAll, readTopic } from '../support/kafka.ts';
import { capturedLogs } from '../support/logs.ts';
import { testConfig, testNames, waitFor } from '../support/worker.ts';

const TOTAL = 100_000;
const names = testNames('ingest');
const eventOptions = { runId: names.runId, startMs: asOfToday(Date.UTC(2026, 10, 20, 12, 0, 0)) };

describe('Kafka intake into ClickHouse', () => {
  const engines = useEngines();
  const { kafka } = engines;

  it('stores each valid event once and dead-letters each malformed one with its reason', async () => {
    const { clickhouse, producer } = engines;
    const { messages, expectedDeadLetters, valid, validByMerchant } = makeMixedStream(TOTAL, eventOptions);
    // The fleet publishes some events twice (a producer retry): same eventId, a later offset.
    const republished = messages.filter((_, i) => i % 200 === 1);
    await produceAll(producer, names.topic, [...messages, ...republished]);

    const worker = await engines.startWorker(testConfig({ brokers: engines.brokers, clickhouse, names }));
    await waitFor(() => groupCaughtUp(kafka, names.groupId, names.topic), 'worker commits every partition to its end', 90_000);

    const { store, clickhouse: db } = worker;
    const [raw] = await db.queryRows<{ rows: number; distinct_ids: number }>(
      `SELECT count() AS rows, uniqExact(event_id) AS distinct_ids FROM ${clickhouse.database}.request_events`,
    );
    expect(raw).toEqual({ rows: valid, distinct_ids: valid });

    const totals = await store.trafficTotals({ from: new Date(eventOptions.startMs - 60_000), to: new Date(eventOptions.startMs + TOTAL + 60_000) });
    expect(totals.requests).toBe(valid);
    const recent = await recentEvents(store, { since: new Date(eventOptions.startMs - 60_000), limit: 1_000_000 });
    expect(recent).toHaveLength(valid);
    // Warm-up takes the newest events of the entitled plans, oldest first, a page at a time.
    const pages: number[] = [];
    const newest = await recentEvents(store, { since: new Date(eventOptions.startMs - 60_000), plans: ['business', 'enterprise'], limit: 1_000 }, 300, pages);
    expect(pages).toEqual([300, 300, 300, 100]);
    const entitled = recent.filter((event) => event.plan === 'business' || event.plan === 'enterprise');
    expect(newest.map((event) => event.eventId).sort()).toEqual(
      entitled
        .sort((a, b) => b.timestamp - a.timestamp)
        .slice(0, 1_000)
        .map((event) => event.eventId)
        .sort(),
    );
    expect(newest.map((event) => event.timestamp)).toEqual(newest.map((event) => event.timestamp).sort((a, b) => a - b));
    // Read in queries of fewer rows (each after the last one's), the same events in the same order.
    const inQueries: number[] = [];
    expect(await recentEvents(store, { since: new Date(eventOptions.startMs - 60_000), plans: ['business', 'enterprise'], limit: 1_000 }, 300, inQueries, 350)).toEqual(newest);
    expect(inQueries).toEqual([300, 50, 300, 50, 300]);
    const merchantTotals = await store.trafficTotals({ merchantId: 'm_7', from: new Date(0), to: new Date(Date.UTC(2100, 0)) });
    expect(merchantTotals.requests).toBe(validByMerchant.get('m_7'));

    const deadLetters = (await readTopic(kafka, names.dlqTopic, expectedDeadLetters.size)).map((value) => JSON.parse(value));
    expect(deadLetters).toHaveLength(expectedDeadLetters.size);
    for (const record of deadLetters) {
      expect(expectedDeadLetters.get(record.payload)).toBe(record.reason);
      expect(record.source.topic).toBe(names.topic);
      expect(Number(record.source.offset)).toBeGreaterThanOrEqual(0);
      expect(record.errors.length).toBeGreaterThan(0);
      expect(JSON.stringify(record)).not.toMatch(/sk_live_SECRET/);
    }
    expect(new Set(deadLetters.map((record) => record.payload)).size).toBe(expectedDeadLetters.size);

    const metrics = await worker.metrics.registry.getMetricsAsJSON();
    const stored = metrics.find((metric) => metric.name === 'security_center_events_stored_total');
    expect(stored?.values[0]?.value).toBe(valid);
    const misrouted = metrics.find((metric) => metric.name === 'security_center_events_misrouted_total');
    expect(misrouted?.values[0]?.value).toBe(0);
  });

  it('stores events keyed by something other than their apiKeyId, counts them and says so', async () => {
    const { clickhouse, producer } = engines;
    const own = testNames('misrouted');
    const events = Array.from({ length: 4 }, (_, i) => makeEvent(i, { runId: own.runId, startMs: eventOptions.startMs, keys: 1 }));
    // Keyed by apiKeyId, by the merchant, without a key, by apiKeyId.
    const keys = [events[0]!.apiKeyId, events[1]!.merchantId, null, events[3]!.apiKeyId];
    await producer.send({ topic: own.topic, messages: events.map((event, i) => ({ key: keys[i], value: JSON.stringify(event) })) });
    const logs = capturedLogs<{ msg: string; events?: number }>();

    const worker = await engines.startWorker(testConfig({ brokers: engines.brokers, clickhouse, names: own }), { logger: logs.logger });
    await waitFor(() => groupCaughtUp(kafka, own.groupId, own.topic), 'worker commits every partition to its end', 60_000);

    const [raw] = await worker.clickhouse.queryRows<{ rows: number }>(`SELECT count() AS rows FROM ${clickhouse.database}.request_events WHERE event_id LIKE 'evt_${own.runId}_%'`);
    expect(raw?.rows).toBe(4);
    const metrics = await worker.metrics.registry.getMetricsAsJSON();
    expect(metrics.find((metric) => metric.name === 'security_center_events_misrouted_total')?.values[0]?.value).toBe(2);
    const warnings = logs.lines.filter((line) => line.msg.startsWith('events whose Kafka message key is not their apiKeyId'));
    // One line for the state, however many batches the two came in.
    expect(warnings).toHaveLength(1);
    expect(warnings[0]!.events).toBeGreaterThan(0);
  });
});

/** EventStore.recentEvents's pages, joined; the size of each page goes to `pageSizes`. */
async function recentEvents(store: EventStore, range: Parameters<EventStore['recentEvents']>[0], pageSize?: number, pageSizes: number[] = [], queryRows?: number): Promise<RequestEvent[]> {
  const events: RequestEvent[] = [];
  const handed = await store.recentEvents(
    range,
    async (page) => {
      pageSizes.push(page.length);
      events.push(...page);
    },
    pageSize,
    queryRows,
  );
  expect(handed).toBe(events.length);
  return events;
}
