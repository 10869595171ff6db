/**
 * Storage as intake sees it, on the real ClickHouse engine, over HTTP: the storage gauge while
 * storage cannot be migrated at start and during a write outage, and an insert whose events fall on
 * more than 100 days (the server's default max_partitions_per_insert_block; a backfill with
 * EVENTS_TTL_DAYS above 100), which must be stored rather than retried forever.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLogger } from '../../src/logger.ts';
import { startWorker, type Worker } from '../../src/main.ts';
import { AlertStore } from '../../src/store/alert-store.ts';
import type { ClickHouse } from '../../src/store/clickhouse.ts';
import { tablesIn } from '../../src/store/tables.ts';
import { makeAlert } from '../support/admin.ts';
import { startClickHouse, type ClickHouseService } from '../services/clickhouse.ts';
import { makeEvent } from '../support/events.ts';
import { TEST_INGEST_TOKEN, scrapeMetric, testConfig, testNames, waitFor } from '../support/worker.ts';

const names = testNames('storage');
const DAY = 86_400_000;
/** A time of this run: an hour ago, in whole seconds (events may be dated at most a day ahead, and no earlier than EVENTS_TTL_DAYS). */
const RECENT = Math.floor(Date.now() / 1000) * 1000 - 3_600_000;

describe('storage and intake', () => {
  let clickhouse: ClickHouseService;
  let worker: Worker;
  let unreachable = true;
  let refusedStatements = 0;
  let writesFail = false;

  beforeAll(async () => {
    clickhouse = await startClickHouse();
    const config = testConfig({ clickhouse, names, extra: { EVENTS_TTL_DAYS: '365' } });
    // Storage that refuses every statement until `unreachable` is cleared (migrations fail).
    const refuse = () => {
      refusedStatements++;
      return Promise.reject(new Error('injected: storage unreachable'));
    };
    const wrapClickHouse = (db: ClickHouse): ClickHouse => ({
      ...db,
      command: (query, params) => (unreachable ? refuse() : db.command(query, params)),
      queryRows: (query, params) => (unreachable ? refuse() : db.queryRows(query, params)),
    });
    worker = await startWorker(config, {
      logger: createLogger(process.env.TEST_LOG_LEVEL ?? 'silent'),
      wrapClickHouse,
      wrapStoreRows: (storeRows) => (body) => (writesFail ? Promise.reject(new Error('injected write outage')) : storeRows(body)),
    });
  });

  afterAll(async () => {
    await worker?.stop();
    await clickhouse?.stop();
  });

  function post(events: unknown[]): Promise<Response> {
    return fetch(`${worker.url}/v1/ingest/events`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${TEST_INGEST_TOKEN}` },
      body: JSON.stringify(events),
    });
  }

  const storageUp = () => scrapeMetric(worker.url, 'security_center_storage_up');

  it('reports storage down until it is migrated, and during a write outage', async () => {
    await waitFor(() => refusedStatements >= 1, 'the worker tries to migrate');
    expect(await storageUp()).toBe(0);
    expect((await fetch(`${worker.url}/ready`)).status).toBe(503);
    unreachable = false;
    await worker.ready;
    expect(await storageUp()).toBe(1);

    writesFail = true;
    expect((await post([makeEvent(0, { runId: `${names.runId}_outage`, startMs: RECENT })])).status).toBe(503);
    expect(await storageUp()).toBe(0);
    writesFail = false;
    await waitFor(async () => (await storageUp()) === 1, 'storage up again once the write succeeds');
    expect((await fetch(`${worker.url}/ready`)).status).toBe(200);
  });

  it('stores one insert whose events fall on more than 100 days, and keeps taking events', async () => {
    unreachable = false;
    writesFail = false;
    await worker.ready;
    // 150 events, each on a day of its own, over the last 150 days.
    const events = Array.from({ length: 150 }, (_, i) => makeEvent(i, { runId: names.runId, startMs: RECENT - (i + 1) * DAY, merchants: 1, keys: 1 }));
    const response = await post(events);
    expect(response.status).toBe(202);
    expect(await response.json()).toMatchObject({ data: { accepted: 150, rejected: 0 } });
    const [raw] = await worker.clickhouse.queryRows<{ rows: number; days: number }>(
      `SELECT count() AS rows, uniqExact(toYYYYMMDD(ts)) AS days FROM ${clickhouse.database}.request_events WHERE api_key_id = {key:String}`,
      { key: events[0]!.apiKeyId },
    );
    expect(raw).toEqual({ rows: 150, days: 150 });
    const [rollup] = await worker.clickhouse.queryRows<{ requests: number; days: number }>(
      `SELECT sum(requests) AS requests, uniqExact(toDate(minute)) AS days FROM ${clickhouse.database}.request_rollup_1m WHERE api_key_id = {key:String}`,
      { key: events[0]!.apiKeyId },
    );
    expect(rollup).toEqual({ requests: 150, days: 150 });
    expect((await fetch(`${worker.url}/ready`)).status).toBe(200);
    expect((await post([makeEvent(1_000, { runId: names.runId, startMs: RECENT })])).status).toBe(202);
  });

  it('reads times back when the server would answer in another date_time_output_format', async () => {
    unreachable = false;
    writesFail = false;
    await worker.ready;
    // A server profile's default, as far as the engine lets a test set one: the embedded engine
    // keeps a SET for the session; on a server it lasts one request, and this test proves less.
    await worker.clickhouse.command("SET date_time_output_format = 'iso'");
    const startMs = RECENT;
    const event = makeEvent(0, { runId: `${names.runId}_iso`, startMs });
    expect((await post([event])).status).toBe(202);
    const read: number[] = [];
    await worker.store.recentEvents({ since: new Date(startMs - 1), merchantId: event.merchantId as string }, async (events) => {
      read.push(...events.filter((stored) => stored.eventId === event.eventId).map((stored) => stored.timestamp));
    });
    expect(read).toEqual([startMs]);
    const alerts = new AlertStore(worker.clickhouse, tablesIn(clickhouse.database));
    const alert = makeAlert(1, { merchantId: 'm_iso', createdAtMs: startMs });
    await alerts.save([alert]);
    expect(await alerts.get(alert.id, 'm_iso')).toMatchObject({ createdAt: alert.createdAt, firstSeenAt: alert.firstSeenAt });
  });

  it('keeps which events carried no rate limit, so that they are warmed back without one', async () => {
    unreachable = false;
    writesFail = false;
    await worker.ready;
    const startMs = RECENT;
    const runId = `${names.runId}_limits`;
    const none = makeEvent(0, { runId, startMs, keys: 1 });
    const sixty = { ...makeEvent(1, { runId, startMs, keys: 1 }), rateLimitPerMinute: 60 };
    expect((await post([none, sixty])).status).toBe(202);
    const read = new Map<unknown, number | undefined>();
    await worker.store.recentEvents({ since: new Date(startMs - 1), merchantId: none.merchantId as string }, async (events) => {
      for (const stored of events) if (stored.eventId.startsWith(`evt_${runId}_`)) read.set(stored.eventId, stored.rateLimitPerMinute);
    });
    expect(read).toEqual(new Map([[none.eventId, undefined], [sixty.eventId, 60]]));
  });
});
