/**
 * Storage faults, injected at the storage boundary (the worker's row write), on the real engines:
 * during an outage the worker stores nothing, commits nothing and reports not ready; once storage
 * is back every event is stored exactly once and the offsets are committed. What fails per request
 * is logged once while it lasts, not per request.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { mintAdminToken } from '../../src/admin/auth.ts';
import { INTERLEAVED_QUIET_MS } from '../../src/failure-log.ts';
import { createLogger } from '../../src/logger.ts';
import { useEngines } from '../support/engines.ts';
import { asOfToday, makeEvent } from '../support/events.ts';
import { committedTotal, groupCaughtUp, produceAll } from '../support/kafka.ts';
import { testConfig, testNames, waitFor } from '../support/worker.ts';

const names = testNames('outage');
const eventOptions = { runId: names.runId, startMs: asOfToday(Date.UTC(2026, 10, 20, 13, 0, 0)) };

describe('storage outage', () => {
  const engines = useEngines();
  const { kafka } = engines;
  let outage = true;
  let failedWrites = 0;

  it('loses nothing and commits nothing until storage is back', async () => {
    const { clickhouse, producer } = engines;
    const first = Array.from({ length: 5_000 }, (_, i) => makeEvent(i, eventOptions));
    await produceAll(producer, names.topic, first.map((event) => ({ key: event.apiKeyId, value: JSON.stringify(event) })), 1000);

    const config = testConfig({ brokers: engines.brokers, clickhouse, names, extra: { STORE_FLUSH_ROWS: '1000' } });
    const worker = await engines.startWorker(config, {
      wrapStoreRows: (storeRows) => async (body) => {
        if (outage) {
          failedWrites++;
          throw new Error('injected storage outage');
        }
        return storeRows(body);
      },
    });
    await waitFor(() => failedWrites >= 3, 'the worker retries the failing write');

    const ready = await fetch(`${worker.url}/ready`);
    expect(ready.status).toBe(503);
    expect(await ready.json()).toMatchObject({ reason: 'storage unavailable' });
    // More events arrive during the outage; the paused worker must not lose them either.
    const second = Array.from({ length: 5_000 }, (_, i) => makeEvent(5_000 + i, eventOptions));
    await produceAll(producer, names.topic, second.map((event) => ({ key: event.apiKeyId, value: JSON.stringify(event) })), 1000);
    await new Promise((resolve) => setTimeout(resolve, 1_500));
    expect(await committedTotal(kafka, names.groupId, names.topic)).toBe(0);
    const [during] = await worker.clickhouse.queryRows<{ rows: number }>(`SELECT count() AS rows FROM ${clickhouse.database}.request_events`);
    expect(during?.rows).toBe(0);
    const ingest = await fetch(`${worker.url}/v1/ingest/events`, { method: 'POST' });
    expect(ingest.status).toBe(401); // auth is still checked first

    outage = false;
    await waitFor(() => groupCaughtUp(kafka, names.groupId, names.topic), 'offsets committed after recovery', 60_000);
    expect((await fetch(`${worker.url}/ready`)).status).toBe(200);
    const [after] = await worker.clickhouse.queryRows<{ rows: number; ids: number }>(
      `SELECT count() AS rows, uniqExact(event_id) AS ids FROM ${clickhouse.database}.request_events`,
    );
    expect(after).toEqual({ rows: 10_000, ids: 10_000 });
    const totals = await worker.store.trafficTotals({ from: new Date(eventOptions.startMs - 60_000), to: new Date(eventOptions.startMs + 60_000) });
    expect(totals.requests).toBe(10_000);
  });

  it('when storage cannot be read at a partition\'s first batch, waits, says so on /ready, and loses nothing', async () => {
    const { clickhouse, producer } = engines;
    const own = testNames('unreadable');
    const startMs = asOfToday(Date.UTC(2026, 10, 20, 15, 0, 0));
    const events = Array.from({ length: 3_000 }, (_, i) => makeEvent(i, { runId: own.runId, startMs }));
    await produceAll(producer, own.topic, events.map((event) => ({ key: event.apiKeyId, value: JSON.stringify(event) })), 1000);
    // Reads of how far partitions are stored fail; everything else works.
    let unreadable = true;
    let failedReads = 0;
    const worker = await engines.startWorker(testConfig({ brokers: engines.brokers, clickhouse, names: own }), {
      wrapClickHouse: (db) => ({
        ...db,
        queryRows: async (query, params) => {
          if (unreadable && query.includes('max(source_offset)')) {
            failedReads++;
            throw new Error('injected: storage cannot be read');
          }
          return db.queryRows(query, params);
        },
      }),
    });
    await waitFor(() => failedReads >= 3, 'the worker retries the failing read');
    const ready = await fetch(`${worker.url}/ready`);
    expect(ready.status).toBe(503);
    expect(((await ready.json()) as { reason: string }).reason).toMatch(/cannot read how far partitions are stored/);
    expect(await committedTotal(kafka, own.groupId, own.topic)).toBe(0);

    unreadable = false;
    await waitFor(() => groupCaughtUp(kafka, own.groupId, own.topic), 'offsets committed once storage can be read', 60_000);
    expect((await fetch(`${worker.url}/ready`)).status).toBe(200);
    const [stored] = await worker.clickhouse.queryRows<{ rows: number; ids: number }>(
      `SELECT count() AS rows, uniqExact(event_id) AS ids FROM ${clickhouse.database}.request_events WHERE source_topic = {topic:String}`,
      { topic: own.topic },
    );
    expect(stored).toEqual({ rows: 3_000, ids: 3_000 });
  });
  it('counts once a flush whose insert landed although it was reported failed', async () => {
    // A server's request timeout or a connection reset after the commit: the rows are stored, the
    // worker is told the insert failed and stores the flush again. The repeat is dropped by
    // request_events and by both views (010_insert_deduplication.sql), so metrics count each event once.
    const { clickhouse, producer } = engines;
    const own = testNames('lostanswer');
    const startMs = Date.now() - 3_600_000; // within key_networks_1d's 8 days
    const events = Array.from({ length: 2_000 }, (_, i) => makeEvent(i, { runId: own.runId, startMs, keys: 100 }));
    let answersLost = 0;
    let inserts = 0;
    const worker = await engines.startWorker(testConfig({ brokers: engines.brokers, clickhouse, names: own }), {
      wrapStoreRows: (storeRows) => async (...args) => {
        inserts++;
        await storeRows(...args);
        if (answersLost === 0) {
          answersLost++;
          throw new Error('injected: the insert landed, its answer was lost');
        }
      },
    });
    await produceAll(producer, own.topic, events.map((event) => ({ key: event.apiKeyId, value: JSON.stringify(event) })), 1000);
    await waitFor(() => groupCaughtUp(kafka, own.groupId, own.topic), 'offsets committed after the retry', 60_000);
    expect(answersLost).toBe(1);
    expect(inserts).toBeGreaterThanOrEqual(2);
    const [counted] = await worker.clickhouse.queryRows<{ events: number; rollup: number; keyNetworks: number }>(
      `SELECT (SELECT uniqExact(event_id) FROM ${clickhouse.database}.request_events WHERE source_topic = {topic:String}) AS events,
              (SELECT sum(requests) FROM ${clickhouse.database}.request_rollup_1m WHERE startsWith(api_key_id, {keys:String})) AS rollup,
              (SELECT sum(requests) FROM ${clickhouse.database}.key_networks_1d WHERE source_topic = {topic:String}) AS keyNetworks`,
      { topic: own.topic, keys: `pk_live_${own.runId}_` },
    );
    expect(counted).toEqual({ events: 2_000, rollup: 2_000, keyNetworks: 2_000 });
  });

  it('a worker stopped while an insert hangs stops within the drain deadline, and the next one stores every event once', async () => {
    // A black-holed server: the insert does not answer before the client's request timeout (60 s;
    // 30 s here), unless aborted, as the client's is. The buffer aborts it at its 10 s drain
    // deadline and commits nothing of it; the events are delivered again to the next worker.
    const { clickhouse, producer } = engines;
    const own = testNames('hanging');
    const startMs = asOfToday(Date.UTC(2026, 10, 20, 16, 0, 0));
    const events = Array.from({ length: 1_000 }, (_, i) => makeEvent(i, { runId: own.runId, startMs, keys: 100 }));
    const config = testConfig({ brokers: engines.brokers, clickhouse, names: own });
    let inserts = 0;
    let aborted = 0;
    const worker = await engines.startWorker(config, {
      wrapStoreRows: () => (_body: readonly Uint8Array[], signal?: AbortSignal) => {
        inserts++;
        return new Promise<void>((_resolve, reject) => {
          const timeout = setTimeout(() => reject(new Error('injected: request timeout')), 30_000).unref();
          signal?.addEventListener('abort', () => {
            aborted++;
            clearTimeout(timeout);
            reject(new Error('injected: insert aborted'));
          });
        });
      },
    });
    await produceAll(producer, own.topic, events.map((event) => ({ key: event.apiKeyId, value: JSON.stringify(event) })), 1000);
    await waitFor(() => inserts >= 1, 'an insert is in flight', 30_000);
    const started = Date.now();
    await worker.stop();
    const took = Date.now() - started;
    expect(took).toBeLessThan(10_000 + 5_000);
    expect(aborted).toBe(1); // the insert in flight was given up on, not left to run on
    expect(await committedTotal(kafka, own.groupId, own.topic)).toBe(0);

    const next = await engines.startWorker(config);
    await waitFor(() => groupCaughtUp(kafka, own.groupId, own.topic), 'the next worker commits to the end', 60_000);
    const [stored] = await next.clickhouse.queryRows<{ rows: number; ids: number }>(
      `SELECT count() AS rows, uniqExact(event_id) AS ids FROM ${clickhouse.database}.request_events WHERE source_topic = {topic:String}`,
      { topic: own.topic },
    );
    expect(stored).toEqual({ rows: 1_000, ids: 1_000 });
  });

  it('logs admin requests failing on storage when it starts, with the cause, not once per request, and once when one succeeds 10 s after the last failure', async () => {
    const { clickhouse } = engines;
    const secret = 'admin-jwt-secret-0123456789abcdefghij';
    const lines: { level: number; msg: string; route?: string; occurrences?: number; failures?: number; err?: { message: string } }[] = [];
    const logger = createLogger('info', { write: (line: string) => void lines.push(JSON.parse(line)) });
    let down = false;
    const refused = () => Promise.reject(new Error('connect ECONNREFUSED 10.0.0.9:8123'));
    const worker = await engines.startWorker(testConfig({ clickhouse, names: testNames('adminoutage'), extra: { ADMIN_ENABLED: 'true', ADMIN_JWT_SECRET: secret } }), {
      logger,
      wrapClickHouse: (db) => ({
        ...db,
        queryRows: (query, params) => (down ? refused() : db.queryRows(query, params)),
        queryPages: (query, params, pageSize, onPage) => (down ? refused() : db.queryPages(query, params, pageSize, onPage)),
      }),
    });
    const token = await mintAdminToken({ secret, userId: 'ops@m_1', merchantId: 'm_1', role: 'admin' });
    const listAlerts = async () => (await fetch(`${worker.url}/admin/anomaly/alerts?limit=5`, { headers: { authorization: `Bearer ${token}` } })).status;
    const adminLines = () => lines.filter((line) => line.msg.startsWith('admin request'));

    expect(await listAlerts()).toBe(200);
    down = true;
    const enforcement = async () => (await fetch(`${worker.url}/admin/anomaly/enforcement`, { headers: { authorization: `Bearer ${token}` } })).status;
    for (let i = 0; i < 20; i++) {
      expect(await listAlerts()).toBe(503);
      expect(await enforcement()).toBe(200); // a route that reads no storage: its success is no end of the outage
    }
    down = false;
    expect(await listAlerts()).toBe(200);
    // A success right after the failures may be a cached answer among failing ones: not the end yet.
    expect(adminLines().map(({ msg }) => msg)).toEqual(['admin request failed']);
    await sleep(INTERLEAVED_QUIET_MS);
    expect(await listAlerts()).toBe(200);
    expect(adminLines().map(({ level, msg, route, occurrences, failures, err }) => ({ level, msg, route, occurrences, failures, err: err?.message }))).toEqual([
      { level: 50, msg: 'admin request failed', route: 'listAlerts', occurrences: 1, err: 'connect ECONNREFUSED 10.0.0.9:8123' },
      { level: 30, msg: 'admin requests succeed again', route: 'listAlerts', failures: 20 },
    ]);
  });
});
