/**
 * Detection's memory on the real engines: the analysis thread runs with a small heap
 * (DETECTION_MAX_HEAP_MB=64) under 400k events from 1,000 keys.
 * - With the default budget, the windows shed their oldest events and stay inside it: nothing is
 *   lost, the worker stays up, and an attack at the end of the stream still alerts. Its enterprise
 *   keys' events carry no limit, and the worker counts them as events velocity_attack cannot judge.
 * - With the budget taken away, the thread runs out of heap: the worker reports it, says it is not
 *   ready, and stops; a restarted worker stores every event once. Before, intake stalled while
 *   /ready still answered 200.
 */
import { describe, expect, it } from 'vitest';
import { windowBudgetFor } from '../../src/detect/engine.ts';
import type { Worker } from '../../src/main.ts';
import { useEngines } from '../support/engines.ts';
import { makeEvent } from '../support/events.ts';
import { groupCaughtUp, produceAll } from '../support/kafka.ts';
import { metricTotal, testConfig, testNames, waitFor, type TestNames } from '../support/worker.ts';

const EVENTS = 400_000;
const HEAP_MB = 64;

describe('detection memory', () => {
  const engines = useEngines();
  const { kafka } = engines;

  /** Produces the stream; returns how many of its events are of enterprise keys, carry no limit (makeEvent's do not) and were not answered 5xx. */
  async function produceStream(names: TestNames, attackKey?: string): Promise<number> {
    const eventOptions = { runId: names.runId, startMs: Date.now() - 10 * 60_000, keys: 1_000 };
    const messages = Array.from({ length: EVENTS }, (_, i) => {
      const event = makeEvent(i, eventOptions);
      return { key: event.apiKeyId, value: JSON.stringify(event) };
    });
    if (attackKey) {
      const attack = { ...makeEvent(EVENTS, eventOptions), apiKeyId: attackKey, plan: 'business', userAgent: 'sqlmap/1.8.4#stable (https://sqlmap.org)' };
      messages.push({ key: attackKey, value: JSON.stringify(attack) });
    }
    await produceAll(engines.producer, names.topic, messages);
    return messages.filter(({ value }) => {
      const event = JSON.parse(value) as { plan: string; rateLimitPerMinute?: number; status: number };
      return event.plan === 'enterprise' && event.rateLimitPerMinute === undefined && event.status < 500;
    }).length;
  }

  async function storedCounts(worker: Worker, names: TestNames): Promise<{ rows: number; ids: number }> {
    const [counts] = await worker.clickhouse.queryRows<{ rows: number; ids: number }>(
      `SELECT count() AS rows, uniqExact(event_id) AS ids FROM ${engines.clickhouse.database}.request_events WHERE source_topic = {topic:String}`,
      { topic: names.topic },
    );
    return { rows: Number(counts?.rows), ids: Number(counts?.ids) };
  }

  it('holds the windows to their budget: nothing is lost and an attack still alerts', async () => {
    const names = testNames('memory_budget');
    const attackKey = `pk_live_${names.runId}_attacker`;
    const enterpriseWithoutLimit = await produceStream(names, attackKey);
    const fatal: Error[] = [];
    const worker = await engines.startWorker(
      testConfig({ brokers: engines.brokers, clickhouse: engines.clickhouse, names, extra: { DETECTION_MAX_HEAP_MB: String(HEAP_MB) } }),
      { onFatal: (error) => fatal.push(error) },
    );
    await waitFor(async () => fatal.length > 0 || (await groupCaughtUp(kafka, names.groupId, names.topic)), 'worker consumes the stream', 90_000);
    expect(fatal).toEqual([]);
    expect(await storedCounts(worker, names)).toEqual({ rows: EVENTS + 1, ids: EVENTS + 1 });

    const budget = windowBudgetFor(HEAP_MB);
    expect(await metricTotal(worker, 'security_center_detection_shed_events_total')).toBeGreaterThan(0);
    expect(await metricTotal(worker, 'security_center_detection_window_events')).toBeLessThanOrEqual(budget);
    expect(await metricTotal(worker, 'security_center_detection_events_per_key_cap')).toBeLessThan(5_000);
    // velocity_attack has no default limit for enterprise, whose events here carry none: each is counted, shed or not.
    expect(enterpriseWithoutLimit).toBeGreaterThan(0);
    expect(await metricTotal(worker, 'security_center_detection_events_without_limit_total')).toBe(enterpriseWithoutLimit);
    await waitFor(async () => (await worker.alertStore.list({})).some((alert) => alert.apiKeyId === attackKey && alert.type === 'bot_traffic'), 'the attack alerts', 20_000);
    expect((await worker.app.inject({ method: 'GET', url: '/ready' })).statusCode).toBe(200);
  });

  it('stops the worker when the analysis thread dies, and a restart stores every event once', async () => {
    const names = testNames('memory_exhausted');
    await produceStream(names);
    const fatal: Error[] = [];
    const config = testConfig({
      brokers: engines.brokers,
      clickhouse: engines.clickhouse,
      names,
      // No budget: the windows grow until the thread's heap is exhausted.
      extra: { DETECTION_MAX_HEAP_MB: String(HEAP_MB), DETECTION_MAX_WINDOW_EVENTS: '1000000000' },
    });
    const first = await engines.startWorker(config, { onFatal: (error) => fatal.push(error) });
    await waitFor(() => fatal.length > 0, 'the worker reports that its analysis thread stopped', 90_000);
    expect(fatal[0]!.message).toMatch(/out of memory/i);
    const ready = await first.app.inject({ method: 'GET', url: '/ready' });
    expect(ready.statusCode).toBe(503);
    expect(ready.body).toMatch(/analysis thread stopped/);
    await first.stop(); // what the process entry does on onFatal, before exiting with 1
    const storedByFirst = await metricTotal(first, 'security_center_events_stored_total');
    expect(storedByFirst).toBeLessThan(EVENTS);

    const second = await engines.startWorker(testConfig({ brokers: engines.brokers, clickhouse: engines.clickhouse, names }));
    await waitFor(() => groupCaughtUp(kafka, names.groupId, names.topic), 'the restarted worker consumes the rest', 90_000);
    expect(await storedCounts(second, names)).toEqual({ rows: EVENTS, ids: EVENTS });
    expect(await metricTotal(second, 'security_center_events_stored_total')).toBe(EVENTS - storedByFirst);
  });
});
