/**
 * Storage as intake sees it, on the real ClickHouse engine, over HTTP: an insert whose events fall
 * on more than 100 days (the server's default max_partitions_per_insert_block) must be stored
 * rather than retried forever.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLogger } from '../../src/logger.ts';
import { startWorker, type Worker } from '../../src/main.ts';
import { startClickHouse, type ClickHouseService } from '../services/clickhouse.ts';
import { makeEvent } from '../support/events.ts';
import { TEST_INGEST_TOKEN, testConfig, testNames } from '../support/worker.ts';

const names = testNames('storage');

describe('storage and intake', () => {
  let clickhouse: ClickHouseService;
  let worker: Worker;

  beforeAll(async () => {
    clickhouse = await startClickHouse();
    const config = testConfig({ clickhouse, names });
    worker = await startWorker(config, { logger: createLogger(process.env.TEST_LOG_LEVEL ?? 'silent') });
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

  it('stores one insert whose events fall on more than 100 days and months, and keeps taking events', async () => {
    await worker.ready;
    // 150 events, each in a month of its own from 2030 on (future: no TTL removes them meanwhile).
    const events = Array.from({ length: 150 }, (_, i) =>
      makeEvent(i, { runId: names.runId, startMs: Date.UTC(2030, i, 15) - i, merchants: 1, keys: 1 }),
    );
    const response = await post(events);
    expect(response.status).toBe(202);
    expect(await response.json()).toMatchObject({ data: { accepted: 150, rejected: 0 } });
    const [raw] = await worker.clickhouse.queryRows<{ rows: number; days: number }>(
      `SELECT count() AS rows, uniqExact(toYYYYMMDD(ts)) AS days FROM ${clickhouse.database}.request_events`,
    );
    expect(raw).toEqual({ rows: 150, days: 150 });
    const [rollup] = await worker.clickhouse.queryRows<{ requests: number; months: number }>(
      `SELECT sum(requests) AS requests, uniqExact(toYYYYMM(minute)) AS months FROM ${clickhouse.database}.request_rollup_1m`,
    );
    expect(rollup).toEqual({ requests: 150, months: 150 });
    expect((await fetch(`${worker.url}/ready`)).status).toBe(200);
    expect((await post([makeEvent(1_000, { runId: names.runId, startMs: Date.UTC(2030, 0, 1) })])).status).toBe(202);
  });
});
