/**
 * The admin API over real HTTP on the real ClickHouse engine: each endpoint's success shape, every
 * filter, paging while new alerts arrive, the lifecycle with its history, metrics and dashboard from
 * ingested traffic, the OpenAPI document (and every answer given, errors included, against it), and
 * a detected attack triaged from list to resolution.
 */
import { randomUUID } from 'node:crypto';
import { Validator } from '@seriousme/openapi-schema-validator';
import { Ajv2020 } from 'ajv/dist/2020.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { alertSchema } from '../../src/admin/schemas.ts';
import type { Alert } from '../../src/alerts/alert.ts';
import { createLogger } from '../../src/logger.ts';
import { startWorker, type Worker } from '../../src/main.ts';
import type { ClickHouse } from '../../src/store/clickhouse.ts';
import { tablesIn } from '../../src/store/tables.ts';
import { startClickHouse, type ClickHouseService } from '../services/clickhouse.ts';
import { ADMIN_ENV, adminCall, makeAlert, token, type AdminResponse } from '../support/admin.ts';
import { TEST_INGEST_TOKEN, testConfig, testNames, waitFor } from '../support/worker.ts';

const MINUTE = 60_000;
const names = testNames('admin');
const M = `m_${names.runId}`;
const OTHER = `m_${names.runId}_other`;

describe('admin API', () => {
  let clickhouse: ClickHouseService;
  let worker: Worker;
  let adminToken: string;
  /** Seeded alerts of M, newest first (the order the API must give). */
  let seeded: Alert[];
  /** The next alert write is stored, then fails as if its answer were lost (a timeout, a reset connection). */
  let loseNextAlertWriteAnswer = false;

  const call = (path: string, init?: Parameters<typeof adminCall>[3], bearer = adminToken) => adminCall(worker.url, bearer, path, init);

  /** Posts request events through HTTP ingest; the status of the answer. */
  async function ingest(events: unknown[]): Promise<number> {
    const response = await fetch(`${worker.url}/v1/ingest/events`, {
      method: 'POST',
      headers: { authorization: `Bearer ${TEST_INGEST_TOKEN}`, 'content-type': 'application/json' },
      body: JSON.stringify(events),
    });
    return response.status;
  }

  async function pageThrough(query: string, limit: number, between?: () => Promise<void>): Promise<string[]> {
    const ids: string[] = [];
    let cursor: string | null = null;
    do {
      const response = await call(`/alerts?limit=${limit}${query}${cursor ? `&cursor=${cursor}` : ''}`);
      expect(response.status).toBe(200);
      ids.push(...response.body.data.alerts.map((alert: Alert) => alert.id));
      cursor = response.body.data.nextCursor;
      await between?.();
    } while (cursor);
    return ids;
  }

  beforeAll(async () => {
    clickhouse = await startClickHouse();
    const config = testConfig({ clickhouse, names, extra: { ...ADMIN_ENV, ADMIN_RATE_LIMIT_PER_MINUTE: '100000' } });
    worker = await startWorker(config, {
      logger: createLogger('silent'),
      wrapClickHouse: (db) => ({
        ...db,
        insert: async (table, columns, body, format, settings, signal) => {
          await db.insert(table, columns, body, format, settings, signal);
          if (loseNextAlertWriteAnswer && table === tablesIn(clickhouse.database).alerts) {
            loseNextAlertWriteAnswer = false;
            throw new Error('socket hang up');
          }
        },
      }),
    });
    await worker.ready;
    adminToken = await token(M, 'admin');
    const base = Date.now() - 3 * 24 * 3_600_000;
    const alerts = Array.from({ length: 150 }, (_, i) =>
      makeAlert(i, {
        merchantId: M,
        // Some share a creation time: the id breaks the tie.
        createdAtMs: base + Math.floor(i / 3) * MINUTE,
        ...(i % 7 === 0 ? { status: 'acknowledged' as const } : {}),
      }),
    );
    const others = Array.from({ length: 40 }, (_, i) => makeAlert(i, { merchantId: OTHER, createdAtMs: base + i * MINUTE }));
    await worker.alertStore.save([...alerts, ...others]);
    // Ties in createdAt are broken by id in ClickHouse's UUID order: ask the engine for that order.
    const order = await worker.clickhouse.queryRows<{ id: string }>(
      `SELECT id FROM ${tablesIn(clickhouse.database).alerts} WHERE merchant_id = {m:String} ORDER BY created_at DESC, id DESC`,
      { m: M },
    );
    const byId = new Map(alerts.map((alert) => [alert.id, alert]));
    seeded = order.map((row) => byId.get(row.id)!);
    expect(seeded).toHaveLength(150);
  });

  afterAll(async () => {
    await worker?.stop();
    await clickhouse?.stop();
  });

  it('lists alerts newest first, in the contract shape, without internal fields', async () => {
    const response = await call('/alerts?limit=10');
    expect(response.status).toBe(200);
    expect(response.body.success).toBe(true);
    const { alerts, nextCursor } = response.body.data;
    expect(alerts.map((alert: Alert) => alert.id)).toEqual(seeded.slice(0, 10).map((alert) => alert.id));
    for (const alert of alerts) {
      expect(() => alertSchema.parse(alert)).not.toThrow();
      expect(alert).not.toHaveProperty('scope');
      expect(alert.merchantId).toBe(M);
    }
    expect(typeof nextCursor).toBe('string');
    expect((await call('/alerts')).body.data.alerts).toHaveLength(50); // the default page size
  });

  it('applies every filter, alone and combined', async () => {
    const cases: [string, (alert: Alert) => boolean][] = [
      ['status=acknowledged', (a) => a.status === 'acknowledged'],
      ['status=open,acknowledged', (a) => a.status === 'open' || a.status === 'acknowledged'],
      ['severity=critical', (a) => a.severity === 'critical'],
      ['severity=low,high', (a) => a.severity === 'low' || a.severity === 'high'],
      ['type=impossible_travel', (a) => a.type === 'impossible_travel'],
      ['recommendedAction=rate_limit,block', (a) => a.recommendedAction === 'rate_limit' || a.recommendedAction === 'block'],
      ['recommendedAction=investigate&type=bot_traffic', (a) => a.recommendedAction === 'investigate' && a.type === 'bot_traffic'],
      [`apiKeyId=pk_live_${M}_3`, (a) => a.apiKeyId === `pk_live_${M}_3`],
      [`from=${seeded[40]!.createdAt}`, (a) => a.createdAt >= seeded[40]!.createdAt],
      [`to=${seeded[100]!.createdAt}`, (a) => a.createdAt <= seeded[100]!.createdAt],
      [
        `type=bot_traffic&severity=medium,critical&from=${seeded[120]!.createdAt}&to=${seeded[10]!.createdAt}`,
        (a) => a.type === 'bot_traffic' && ['medium', 'critical'].includes(a.severity) && a.createdAt >= seeded[120]!.createdAt && a.createdAt <= seeded[10]!.createdAt,
      ],
    ];
    for (const [query, keep] of cases) {
      const expected = seeded.filter(keep).map((alert) => alert.id);
      expect(expected.length, query).toBeGreaterThan(0);
      expect(await pageThrough(`&${query}`, 200), query).toEqual(expected);
    }
  });

  it('pages through more alerts than one page while new alerts arrive, skipping and repeating none', async () => {
    let arrivals = 0;
    const ids = await pageThrough('', 25, async () => {
      // New alerts are created between page requests, as detection would.
      const batch = arrivals++;
      await worker.alertStore.save(Array.from({ length: 5 }, (_, i) => makeAlert(1000 + batch * 5 + i, { merchantId: M, createdAtMs: Date.now() })));
    });
    expect(arrivals).toBe(6);
    expect(ids).toEqual(seeded.map((alert) => alert.id));
    // The new ones are on a fresh first page.
    const fresh = (await call('/alerts?limit=30')).body.data.alerts as Alert[];
    expect(fresh.filter((alert) => Number((alert.evidence as { observed: number }).observed) >= 1000)).toHaveLength(30);
  });

  it('returns one alert, and 404 for an unknown id and for another merchant\'s id alike', async () => {
    const one = await call(`/alerts/${seeded[5]!.id}`);
    expect(one.status).toBe(200);
    expect(one.body.data).toMatchObject({ id: seeded[5]!.id, merchantId: M, title: seeded[5]!.title, evidence: seeded[5]!.evidence });
    const otherId = (await worker.alertStore.list({ merchantId: OTHER, limit: 1 }))[0]!.id;
    const unknown = await call('/alerts/00000000-0000-4000-8000-000000000000');
    const foreign = await call(`/alerts/${otherId}`);
    expect(unknown.status).toBe(404);
    expect(foreign.status).toBe(404);
    expect(foreign.text).toBe(unknown.text);
  });

  it('moves an alert through its lifecycle, refuses other moves, and records each change in history', async () => {
    const open = seeded.find((alert) => alert.status === 'open')!;
    const patch = (id: string, body: unknown) => call(`/alerts/${id}`, { method: 'PATCH', body });

    const acknowledged = await patch(open.id, { status: 'acknowledged', note: 'looking into it' });
    expect(acknowledged.status).toBe(200);
    expect(acknowledged.body.data.status).toBe('acknowledged');
    expect((await patch(open.id, { status: 'open' })).body.error.code).toBe('INVALID_TRANSITION');
    const resolved = await patch(open.id, { status: 'resolved' });
    expect(resolved.status).toBe(200);
    for (const to of ['acknowledged', 'dismissed', 'open']) {
      const refused = await patch(open.id, { status: to, note: 'x' });
      expect(refused.status, to).toBe(409);
      expect(refused.body).toEqual({ success: false, error: { code: 'INVALID_TRANSITION', message: expect.any(String) } });
    }

    const history = (await call(`/alerts/${open.id}`)).body.data.history;
    expect(history.slice(1)).toEqual([
      { at: expect.any(String), actor: `user_admin_${M}`, from: 'open', to: 'acknowledged', note: 'looking into it' },
      { at: expect.any(String), actor: `user_admin_${M}`, from: 'acknowledged', to: 'resolved', note: null },
    ]);
    expect(Date.parse(history[2].at)).toBeGreaterThanOrEqual(Date.parse(history[1].at));

    // open -> resolved skips a step; dismissal needs a note.
    const another = seeded.filter((alert) => alert.status === 'open')[1]!;
    expect((await patch(another.id, { status: 'resolved' })).status).toBe(409);
    const noNote = await patch(another.id, { status: 'dismissed' });
    expect(noNote.status).toBe(400);
    expect(noNote.body).toMatchObject({ code: 'VALIDATION_ERROR', details: [{ path: ['body', 'note'] }] });
    // A note that carries an API key secret is refused, naming the field and not quoting it: it would be stored and shown.
    const secretNote = await patch(another.id, { status: 'dismissed', note: 'rotated svc_live_pk_1.sk_live_NOTESECRET123' });
    expect(secretNote.status).toBe(400);
    expect(secretNote.body).toMatchObject({ code: 'VALIDATION_ERROR', details: [{ path: ['body', 'note'], message: expect.stringContaining('API key secret') }] });
    expect(JSON.stringify(secretNote.body)).not.toContain('NOTESECRET');
    const dismissed = await patch(another.id, { status: 'dismissed', note: 'our own load test' });
    expect(dismissed.status).toBe(200);
    expect(dismissed.body.data.history.at(-1)).toMatchObject({ from: 'open', to: 'dismissed', note: 'our own load test' });
    // An acknowledged alert may be dismissed too.
    const acked = seeded.find((alert) => alert.status === 'acknowledged')!;
    expect((await patch(acked.id, { status: 'dismissed', note: 'known partner' })).status).toBe(200);
  });

  it('accepts the retry of a change answered 503 though it was stored, without recording it twice', async () => {
    const merchantId = `${M}_retry`;
    const bearer = await token(merchantId, 'admin', { userId: 'carol' });
    const alert = makeAlert(0, { merchantId, createdAtMs: Date.now() - MINUTE });
    await worker.alertStore.save([alert]);
    const dismiss = { method: 'PATCH', body: { status: 'dismissed', note: 'our load test' } };

    loseNextAlertWriteAnswer = true;
    const failed = await call(`/alerts/${alert.id}`, dismiss, bearer);
    expect(failed.status).toBe(503);
    expect(failed.body.error.code).toBe('STORAGE_UNAVAILABLE');
    const retried = await call(`/alerts/${alert.id}`, dismiss, bearer);
    expect(retried.status).toBe(200);
    expect(retried.body.data.status).toBe('dismissed');
    const history = (await call(`/alerts/${alert.id}`, {}, bearer)).body.data.history;
    expect(history.map((entry: Alert['history'][number]) => `${entry.actor}:${entry.from}->${entry.to}`)).toEqual(['system:null->open', 'carol:open->dismissed']);
    // The same move by someone else is a move from dismissed: refused.
    expect((await call(`/alerts/${alert.id}`, dismiss, await token(merchantId, 'admin', { userId: 'dave' }))).status).toBe(409);
  });

  it('refuses a status change with an empty body naming body.status, whatever its Content-Type says', async () => {
    const open = seeded.filter((alert) => alert.status === 'open')[2]!;
    for (const init of [{}, { rawBody: '' }]) {
      const response = await call(`/alerts/${open.id}`, { method: 'PATCH', headers: { 'content-type': 'application/json' }, ...init });
      expect(response.status).toBe(400);
      expect(response.body).toMatchObject({ code: 'VALIDATION_ERROR', details: [{ path: ['body', 'status'] }] });
    }
    for (const rawBody of [' ', 'not json', '{"status":']) {
      const response = await call(`/alerts/${open.id}`, { method: 'PATCH', rawBody });
      expect(response.status, rawBody).toBe(400);
      expect(response.body).toMatchObject({ code: 'VALIDATION_ERROR', details: [{ path: ['body'] }] });
    }
    expect((await call(`/alerts/${open.id}`)).body.data.status).toBe('open');
  });

  it('gives every history entry all five fields: note is null when none was given, also in alerts stored before', async () => {
    const merchantId = `${M}_notes`;
    const bearer = await token(merchantId, 'admin', { userId: 'bob' });
    const fresh = makeAlert(0, { merchantId, createdAtMs: Date.now() - MINUTE });
    // As alerts were stored before every entry carried its note.
    const stored = makeAlert(1, { merchantId, createdAtMs: Date.now() - 2 * MINUTE });
    const { note: _note, ...withoutNote } = stored.history[0]!;
    await worker.alertStore.save([fresh, { ...stored, history: [withoutNote as Alert['history'][number]] }]);

    const acknowledged = await call(`/alerts/${fresh.id}`, { method: 'PATCH', body: { status: 'acknowledged' } }, bearer);
    expect(acknowledged.status).toBe(200);
    expect(acknowledged.body.data.history.at(-1)).toStrictEqual({ at: expect.any(String), actor: 'bob', from: 'open', to: 'acknowledged', note: null });
    // null is no note in a request too.
    const resolved = await call(`/alerts/${fresh.id}`, { method: 'PATCH', body: { status: 'resolved', note: null } }, bearer);
    expect(resolved.status).toBe(200);
    expect(resolved.body.data.history.at(-1)).toMatchObject({ to: 'resolved', note: null });
    expect((await call(`/alerts/${stored.id}`, {}, bearer)).body.data.history).toStrictEqual([{ ...withoutNote, note: null }]);
    for (const alert of (await call('/alerts', {}, bearer)).body.data.alerts as Alert[]) {
      for (const entry of alert.history) expect(Object.keys(entry).sort()).toEqual(['actor', 'at', 'from', 'note', 'to']);
    }
  });

  it('serves metrics and the dashboard from the rollups of ingested traffic', async () => {
    const merchantId = `${M}_traffic`;
    const now = Date.now();
    // 240 requests over the last 40 minutes from 12 addresses; every 6th fails.
    const events = Array.from({ length: 240 }, (_, i) => ({
      eventId: `evt_${names.runId}_traffic_${i}`,
      timestamp: new Date(now - 40 * MINUTE + i * 10_000).toISOString(),
      merchantId,
      plan: i % 2 ? 'free' : 'business', // every plan counts in metrics
      apiKeyId: `pk_live_${merchantId}_${i % 3}`,
      environment: 'live',
      ip: `203.0.113.${i % 12}`,
      userAgent: 'okhttp/4.12.0',
      method: 'POST',
      path: '/v1/verify/sessions',
      status: i % 6 === 0 ? 500 : 201,
      responseTimeMs: 50,
    }));
    expect(await ingest(events)).toBe(202);
    const critical = makeAlert(3, { merchantId, createdAtMs: now - 5 * MINUTE, severity: 'critical', type: 'bot_traffic', riskScore: 0.97 });
    const low = makeAlert(4, { merchantId, createdAtMs: now - 4 * MINUTE, severity: 'low', type: 'velocity_attack', riskScore: 0.2, apiKeyId: 'pk_live_quiet' });
    await worker.alertStore.save([critical, low]);
    const bearer = await token(merchantId, 'viewer');

    const metrics = await call('/metrics', {}, bearer);
    expect(metrics.status).toBe(200);
    expect(metrics.body.data).toMatchObject({
      totalRequests: 240,
      failureRate: Math.round((40 / 240) * 10_000) / 10_000, // every 6th failed
      uniqueIps: 12,
      activeAlerts: 2,
      criticalAlerts: 1,
      alertsByType: { bot_traffic: 1, velocity_attack: 1, impossible_travel: 0, high_failure_rate: 0, credential_sharing: 0 },
      alertsBySeverity: { critical: 1, low: 1, medium: 0, high: 0 },
    });
    const past = await call(`/metrics?from=${new Date(now - 30 * 24 * 3_600_000).toISOString()}&to=${new Date(now - 29 * 24 * 3_600_000).toISOString()}`, {}, bearer);
    expect(past.body.data).toMatchObject({ totalRequests: 0, activeAlerts: 2, alertsBySeverity: { critical: 0, low: 0 } });
    // Past the rollup's minutes (a 32-bit DateTime, to 2106-02-07): no traffic, not today's by a wrapped comparison.
    const beyond = await call('/metrics?from=2106-02-08T00:00:00Z&to=2106-02-09T00:00:00Z', {}, bearer);
    expect(beyond.body.data).toMatchObject({ totalRequests: 0, uniqueIps: 0 });
    // A bound given alone is checked against the other's default (to: now; from: 24 h before to).
    const day = 24 * 3_600_000;
    const fromTomorrow = await call(`/metrics?from=${new Date(now + day).toISOString()}`, {}, bearer);
    expect({ status: fromTomorrow.status, details: fromTomorrow.body.details }).toEqual({ status: 400, details: [{ path: ['query', 'from'], message: 'must not be after to (default: now)' }] });
    const fromLongAgo = await call(`/metrics?from=${new Date(now - 500 * day).toISOString()}`, {}, bearer);
    expect({ status: fromLongAgo.status, path: fromLongAgo.body.details?.[0]?.path }).toEqual({ status: 400, path: ['query', 'from'] });
    const toYesterday = await call(`/metrics?to=${new Date(now - 2 * day).toISOString()}`, {}, bearer);
    expect(toYesterday.body.data).toMatchObject({ totalRequests: 0, from: new Date(now - 3 * day).toISOString() });

    /**
     * A dashboard's range starts at the start of the bucket that holds `to` - range, so its first point
     * covers the range's start: one point more than the range holds, each a whole bucket but the last
     * (in progress); one fewer when `to` falls exactly on a bucket's start.
     */
    const expectRange = (data: { metrics: { from: string; to: string }; trafficTrend: { t: string }[] }, rangeMs: number, bucketMs: number, points: number) => {
      const from = Date.parse(data.metrics.from);
      const to = Date.parse(data.metrics.to);
      expect(from % bucketMs).toBe(0);
      expect(to - rangeMs - from).toBeGreaterThanOrEqual(0);
      expect(to - rangeMs - from).toBeLessThan(bucketMs);
      expect(data.trafficTrend).toHaveLength(to % bucketMs === 0 ? points - 1 : points);
      expect(data.trafficTrend[0]!.t).toBe(data.metrics.from);
    };
    const dashboard = await call('/dashboard?range=1h', {}, bearer);
    expect(dashboard.status).toBe(200);
    const data = dashboard.body.data;
    expect(data.range).toBe('1h');
    expect(data.metrics.totalRequests).toBe(240);
    expectRange(data, 60 * MINUTE, MINUTE, 61);
    expect(data.trafficTrend.reduce((sum: number, point: { requests: number }) => sum + point.requests, 0)).toBe(240);
    const step = Date.parse(data.trafficTrend[1].t) - Date.parse(data.trafficTrend[0].t);
    expect(step).toBe(MINUTE);
    // Each minute's success rate, worked out from the events themselves.
    const perMinute = new Map<string, { requests: number; successes: number }>();
    for (const event of events) {
      const t = new Date(Math.floor(Date.parse(event.timestamp) / MINUTE) * MINUTE).toISOString();
      const bucket = perMinute.get(t) ?? { requests: 0, successes: 0 };
      bucket.requests++;
      if (event.status < 400) bucket.successes++;
      perMinute.set(t, bucket);
    }
    for (const point of data.successTrend as { t: string; successRate: number | null }[]) {
      const bucket = perMinute.get(point.t);
      expect(point.successRate, point.t).toBe(bucket ? Math.round((bucket.successes / bucket.requests) * 10_000) / 10_000 : null);
    }
    // One point per bucket in both trends; a bucket without requests has no rate (a gap in a chart, not 0%).
    expect(data.successTrend.map((point: { t: string }) => point.t)).toEqual(data.trafficTrend.map((point: { t: string }) => point.t));
    expect(data.successTrend.filter((point: { successRate: number | null }) => point.successRate === null).length).toBeGreaterThan(0);
    expect(data.topKeys[0]).toMatchObject({ apiKeyId: critical.apiKeyId, riskScore: 0.97, activeAlerts: 1 });
    expect(data.topKeys.map((key: { riskScore: number }) => key.riskScore)).toEqual([0.97, 0.2]);
    expect(data.recentAlerts.map((alert: Alert) => alert.id)).toEqual([low.id, critical.id]);
    expect(data.aiInsights).toEqual([]);

    const week = (await call('/dashboard?range=7d', {}, bearer)).body.data;
    expect(Date.parse(week.trafficTrend[1].t) - Date.parse(week.trafficTrend[0].t)).toBe(60 * MINUTE);
    expectRange(week, 7 * 24 * 60 * MINUTE, 60 * MINUTE, 169);
    const today = (await call('/dashboard?range=24h', {}, bearer)).body.data;
    expectRange(today, 24 * 60 * MINUTE, 15 * MINUTE, 97);
    expect(today.trafficTrend.reduce((sum: number, point: { requests: number }) => sum + point.requests, 0)).toBe(240);
  });

  it('counts each minute of traffic, and each alert created, in the range its start falls in, so ranges that meet share none', async () => {
    const merchantId = `${M}_edges`;
    const hour = 60 * MINUTE;
    const base = Math.floor(Date.now() / hour) * hour - 2 * hour;
    const at = (ms: number) => new Date(ms).toISOString();
    const event = (i: number, timestamp: number) => ({
      eventId: `evt_${names.runId}_edge_${i}`, timestamp: at(timestamp), merchantId, plan: 'free', apiKeyId: `pk_live_${merchantId}`,
      environment: 'live', ip: '203.0.113.9', userAgent: 'okhttp/4.12.0', method: 'GET', path: '/v1/verify/sessions', status: 200, responseTimeMs: 20,
    });
    // One request half a minute before the hour, one half a minute after.
    expect(await ingest([event(0, base - 30_000), event(1, base + 30_000)])).toBe(202);
    // And an alert created on the hour (before any answer is cached).
    await worker.alertStore.save([makeAlert(0, { merchantId, createdAtMs: base, status: 'resolved' })]);
    const bearer = await token(merchantId, 'viewer');
    const requests = async (from: number, to: number) => {
      const response = await call(`/metrics?from=${at(from)}&to=${at(to)}`, {}, bearer);
      expect(response.status).toBe(200);
      return response.body.data.totalRequests;
    };
    expect([await requests(base - hour, base), await requests(base, base + hour)]).toEqual([1, 1]);
    expect(await requests(base - hour, base + hour)).toBe(2);
    // Bounds inside a minute: the minute belongs to the range its start falls in.
    expect(await requests(base - hour, base - 40_000)).toBe(1);
    expect(await requests(base - 40_000, base + hour)).toBe(1);
    expect(await requests(base + 10_000, base + hour)).toBe(0);
    // The alert created on the hour: in the range that starts there, not the one that ends there.
    const created = async (from: number, to: number) => {
      const response = await call(`/metrics?from=${at(from)}&to=${at(to)}`, {}, bearer);
      expect(response.status).toBe(200);
      return Object.values(response.body.data.alertsByType as Record<string, number>).reduce((sum, count) => sum + count, 0);
    };
    expect([await created(base - hour, base), await created(base, base + hour)]).toEqual([0, 1]);
  });

  it('refuses metrics for a range older than the rollups keep, naming the bound, rather than answering no traffic', async () => {
    const day = 24 * 60 * MINUTE;
    const at = (ms: number) => new Date(ms).toISOString();
    const longAgo = Date.now() - 450 * day;
    const response = await call(`/metrics?from=${at(longAgo)}&to=${at(longAgo + day)}`);
    expect(response.status).toBe(400);
    expect(response.body).toMatchObject({ code: 'VALIDATION_ERROR', details: [{ path: ['query', 'from'], message: 'must be within the last 400 days: older figures are not kept' }] });
    // A client's "400 days ago", computed a moment before the worker's clock, is taken.
    expect((await call(`/metrics?from=${at(Date.now() - 400 * day - MINUTE)}&to=${at(Date.now() - day)}`)).status).toBe(200);
  });

  it('shows an alert\'s status change in metrics and the dashboard at once, though their answers are cached', async () => {
    const merchantId = `${M}_cached`;
    const critical = makeAlert(5, { merchantId, createdAtMs: Date.now() - 2 * MINUTE, severity: 'critical', type: 'bot_traffic', riskScore: 0.97 });
    await worker.alertStore.save([critical]);
    const bearer = await token(merchantId, 'admin');
    const operator = await token('ops', 'operator');
    const summary = async () => {
      const [metrics, dashboard, everyone] = await Promise.all([call('/metrics', {}, bearer), call('/dashboard?range=1h', {}, bearer), call(`/metrics`, {}, operator)]);
      return { ...metrics.body.data, recent: dashboard.body.data.recentAlerts.map((alert: Alert) => alert.status), everyoneCritical: everyone.body.data.criticalAlerts };
    };
    const before = await summary();
    expect(before).toMatchObject({ activeAlerts: 1, criticalAlerts: 1, recent: ['open'] });
    expect((await call(`/alerts/${critical.id}`, { method: 'PATCH', body: { status: 'acknowledged' } }, bearer)).status).toBe(200);
    expect((await call(`/alerts/${critical.id}`, { method: 'PATCH', body: { status: 'resolved' } }, bearer)).status).toBe(200);
    const after = await summary();
    expect(after).toMatchObject({ activeAlerts: 0, criticalAlerts: 0, recent: ['resolved'], everyoneCritical: before.everyoneCritical - 1 });
  });

  it('lists as the dashboard\'s recentAlerts only the merchant\'s alerts created in the range', async () => {
    const merchantId = `${M}_recent`;
    const now = Date.now();
    const ago = (ms: number, i: number) => makeAlert(i, { merchantId, createdAtMs: now - ms });
    const [minutes, hours, days, weeks] = [ago(5 * MINUTE, 0), ago(2 * 60 * MINUTE, 1), ago(2 * 24 * 60 * MINUTE, 2), ago(10 * 24 * 60 * MINUTE, 3)];
    const neighbours = makeAlert(4, { merchantId: `${merchantId}_neighbour`, createdAtMs: now - MINUTE });
    await worker.alertStore.save([minutes, hours, days, weeks, neighbours]);
    const bearer = await token(merchantId, 'viewer');
    const recent = async (range: string) => (await call(`/dashboard?range=${range}`, {}, bearer)).body.data.recentAlerts.map((alert: Alert) => alert.id);
    expect(await recent('1h')).toEqual([minutes.id]);
    expect(await recent('24h')).toEqual([minutes.id, hours.id]);
    expect(await recent('7d')).toEqual([minutes.id, hours.id, days.id]);
  });

  it('never serves a merchant the operator\'s all-merchants view from the cache, whatever its id', async () => {
    const operator = await token('ops', 'operator');
    const everyone = await call('/metrics', {}, operator);
    expect(everyone.status).toBe(200);
    expect(everyone.body.data.activeAlerts).toBeGreaterThan(0);
    expect((await call('/dashboard?range=7d', {}, operator)).body.data.recentAlerts.length).toBeGreaterThan(0);
    // A token's merchantId is free text: these must be merchants of their own, with nothing.
    for (const merchantId of ['*', 'all', '']) {
      const bearer = await token(merchantId, 'admin');
      const metrics = await call('/metrics', {}, bearer);
      if (metrics.status !== 200) {
        expect(metrics.status).toBe(401); // refused as a token, never answered with someone else's data
        continue;
      }
      expect(metrics.body.data.activeAlerts).toBe(0);
      expect((await call('/dashboard?range=7d', {}, bearer)).body.data.recentAlerts).toEqual([]);
    }
  });

  it('shows no aiInsights while FEATURE_AI_RISK_SCORING is off, not even those stored while it was on', async () => {
    const merchantId = `${M}_insights_off`;
    const stored = makeAlert(0, { merchantId, createdAtMs: Date.now() - MINUTE, aiInsights: ['Brute-force attempt: stored while the flag was on.'] });
    await worker.alertStore.save([stored]);
    expect((await worker.alertStore.get(stored.id, merchantId))?.aiInsights).toEqual(stored.aiInsights);
    const bearer = await token(merchantId, 'admin');
    const listed = (await call('/alerts', {}, bearer)).body.data.alerts;
    expect(listed.map((alert: Alert) => alert.id)).toEqual([stored.id]);
    expect(listed[0]).not.toHaveProperty('aiInsights');
    expect((await call(`/alerts/${stored.id}`, {}, bearer)).body.data).not.toHaveProperty('aiInsights');
    const patched = await call(`/alerts/${stored.id}`, { method: 'PATCH', body: { status: 'acknowledged' } }, bearer);
    expect(patched.status).toBe(200);
    expect(patched.body.data).not.toHaveProperty('aiInsights');
    const dashboard = (await call('/dashboard?range=1h', {}, bearer)).body.data;
    expect(dashboard.recentAlerts[0]).not.toHaveProperty('aiInsights');
    expect(dashboard.aiInsights).toEqual([]);
  });

  it('serves an OpenAPI 3.1 document of every endpoint that validates', async () => {
    const response = await fetch(`${worker.url}/admin/anomaly/openapi.json`);
    expect(response.status).toBe(200);
    const document = (await response.json()) as { paths: Record<string, Record<string, { operationId: string }>> };
    const result = await new Validator().validate(document as Parameters<Validator['validate']>[0]);
    expect(result.errors ?? []).toEqual([]);
    expect(result.valid).toBe(true);
    const operations = Object.values(document.paths).flatMap((methods) => Object.values(methods).map((op) => op.operationId));
    expect(operations).toEqual(expect.arrayContaining(['listAlerts', 'getAlert', 'changeAlertStatus', 'getMetrics', 'getDashboard', 'listEnforcementDecisions']));
  });

  it('takes a detected attack from the list to resolution', async () => {
    const merchantId = `${M}_attack`;
    const key = `pk_live_${names.runId}_attack`;
    const minute = Math.floor(Date.now() / MINUTE) * MINUTE;
    // Three minutes at 200 requests a minute against a limit of 60: a velocity attack.
    const events = [3, 2, 1].flatMap((ago) =>
      Array.from({ length: 200 }, (_, i) => ({
        eventId: `evt_${names.runId}_attack_${ago}_${i}`,
        timestamp: new Date(minute - ago * MINUTE + i * 300).toISOString(),
        merchantId,
        plan: 'business',
        apiKeyId: key,
        environment: 'live',
        ip: '198.51.100.7',
        userAgent: 'okhttp/4.12.0',
        method: 'POST',
        path: '/v1/verify/sessions',
        status: 201,
        responseTimeMs: 40,
      })),
    );
    expect(await ingest(events)).toBe(202);
    const bearer = await token(merchantId, 'admin', { userId: 'alice' });
    let alert: Alert | undefined;
    await waitFor(async () => {
      alert = (await call('/alerts?type=velocity_attack&status=open', {}, bearer)).body.data.alerts[0];
      return alert !== undefined;
    }, 'the attack is detected and listed', 30_000);
    expect(alert).toMatchObject({ apiKeyId: key, type: 'velocity_attack', status: 'open' });
    expect(alert).not.toHaveProperty('aiInsights'); // FEATURE_AI_RISK_SCORING is off

    const ack = await call(`/alerts/${alert!.id}`, { method: 'PATCH', body: { status: 'acknowledged', note: 'paging the merchant' } }, bearer);
    expect(ack.body.data.status).toBe('acknowledged');
    const done = await call(`/alerts/${alert!.id}`, { method: 'PATCH', body: { status: 'resolved', note: 'key rotated' } }, bearer);
    expect(done.body.data).toMatchObject({ status: 'resolved', occurrences: expect.any(Number) });
    expect(done.body.data).not.toHaveProperty('aiInsights');
    expect(done.body.data.history.map((entry: { actor: string; to: string }) => `${entry.actor}:${entry.to}`)).toEqual([
      'system:open',
      'alice:acknowledged',
      'alice:resolved',
    ]);
    // The change is stored, not only remembered: a fresh read shows it.
    expect((await worker.alertStore.get(alert!.id, merchantId))?.status).toBe('resolved');
  });
});

describe('admin API with FEATURE_AI_RISK_SCORING on', () => {
  let clickhouse: ClickHouseService;
  let worker: Worker;
  const MERCHANT = `m_${names.runId}_ai`;
  const NEIGHBOUR = `m_${names.runId}_ai_neighbour`;
  const call = (path: string, bearer: string, init?: Parameters<typeof adminCall>[3]) => adminCall(worker.url, bearer, path, init);

  beforeAll(async () => {
    clickhouse = await startClickHouse();
    const config = testConfig({
      clickhouse,
      names: testNames('admin_ai'),
      extra: { ...ADMIN_ENV, FEATURE_AI_RISK_SCORING: 'true', ADMIN_RATE_LIMIT_PER_MINUTE: '100000', ADMIN_CACHE_TTL_MS: '0' },
    });
    worker = await startWorker(config, { logger: createLogger('silent') });
    await worker.ready;
  });

  afterAll(async () => {
    await worker?.stop();
    await clickhouse?.stop();
  });

  /** 40 requests refused with 401 and 10 answered, from one address, over the last 5 minutes. */
  function bruteForce(merchantId: string, apiKeyId: string) {
    const now = Date.now();
    return Array.from({ length: 50 }, (_, i) => ({
      eventId: `evt_${apiKeyId}_${i}`,
      timestamp: new Date(now - 5 * MINUTE + i * 5_000).toISOString(),
      merchantId,
      plan: 'business',
      apiKeyId,
      environment: 'live',
      ip: '192.0.2.66',
      userAgent: 'okhttp/4.12.0',
      method: 'POST',
      path: '/v1/verify/sessions',
      status: i % 5 === 0 ? 201 : 401,
      responseTimeMs: 30,
    }));
  }

  async function ingest(events: unknown[]): Promise<void> {
    const response = await fetch(`${worker.url}/v1/ingest/events`, {
      method: 'POST',
      headers: { authorization: `Bearer ${TEST_INGEST_TOKEN}`, 'content-type': 'application/json' },
      body: JSON.stringify(events),
    });
    expect(response.status).toBe(202);
  }

  it('gives detected alerts insights in the list, one alert and a status change, and names the pattern on the dashboard', async () => {
    const key = `pk_live_${names.runId}_guessed`;
    const neighbourKey = `pk_live_${names.runId}_neighbour`;
    await ingest([...bruteForce(MERCHANT, key), ...bruteForce(NEIGHBOUR, neighbourKey)]);
    const bearer = await token(MERCHANT, 'admin');
    let alert: Alert | undefined;
    await waitFor(async () => {
      alert = (await call('/alerts?type=high_failure_rate', bearer)).body.data.alerts[0];
      return alert !== undefined;
    }, 'the brute force is detected and listed', 30_000);

    const evidence = alert!.evidence as { authFailures: number; judgedRequests: number };
    expect(evidence).toMatchObject({ authFailures: 40, judgedRequests: 50 });
    expect(alert!.aiInsights).toEqual([
      'Brute-force attempt: 40 of 50 requests in 10 min failed authentication (401).',
      'All the failures came from a single IP address.',
    ]);
    expect((await call(`/alerts/${alert!.id}`, bearer)).body.data.aiInsights).toEqual(alert!.aiInsights);
    const acknowledged = await call(`/alerts/${alert!.id}`, bearer, { method: 'PATCH', body: { status: 'acknowledged' } });
    expect(acknowledged.body.data).toMatchObject({ status: 'acknowledged', aiInsights: alert!.aiInsights });
    // Stored with the alert, as detection made them.
    expect((await worker.alertStore.get(alert!.id, MERCHANT))?.aiInsights).toEqual(alert!.aiInsights);

    // The merchant's dashboard names its own key only; the operator's view names both, with their merchants.
    expect((await call('/dashboard?range=1h', bearer)).body.data.aiInsights).toEqual([`Brute-force attempts on 1 key in the last hour: ${key}.`]);
    await waitFor(async () => (await worker.alertStore.list({ merchantId: NEIGHBOUR })).length > 0, 'the neighbour\'s brute force is stored', 30_000);
    const operator = await token('ops', 'operator');
    expect((await call('/dashboard?range=1h', operator)).body.data.aiInsights).toEqual([
      expect.stringMatching(new RegExp(`^Brute-force attempts on 2 keys in the last hour: .*${key} \\(${MERCHANT}\\)`)),
    ]);
    expect((await call('/dashboard?range=1h', operator)).body.data.aiInsights[0]).toContain(`${neighbourKey} (${NEIGHBOUR})`);
  });

  it('derives insights for an alert stored while the flag was off', async () => {
    const stored = makeAlert(1, { merchantId: MERCHANT, createdAtMs: Date.now() - 2 * 24 * 3_600_000, type: 'high_failure_rate' });
    expect(stored).not.toHaveProperty('aiInsights');
    await worker.alertStore.save([stored]);
    const one = (await call(`/alerts/${stored.id}`, await token(MERCHANT, 'viewer'))).body.data;
    // Its evidence holds no failure figures: a plain insight, quoting none.
    expect(one.aiInsights).toHaveLength(1);
    expect(one.aiInsights[0]).toMatch(/^Unusually many of this key's requests were refused/);
    expect(one.aiInsights[0]).not.toMatch(/\d/);
  });
});

describe('admin API switched off', () => {
  it('answers 404 on every /admin path when ADMIN_ENABLED is false', async () => {
    const clickhouse = await startClickHouse();
    const worker = await startWorker(testConfig({ clickhouse, names: testNames('admin_off') }), { logger: createLogger('silent') });
    try {
      await worker.ready;
      for (const path of ['/alerts', '/metrics', '/dashboard', '/openapi.json']) {
        const response = await adminCall(worker.url, await token('m_1', 'admin'), path);
        expect(response.status, path).toBe(404);
        expect(response.body.error.code).toBe('NOT_FOUND');
      }
      // Whatever the body: an empty or malformed JSON one is not parsed, so it is 404 too, not 400.
      const malformed: [method: string, path: string, rawBody: string][] = [['PATCH', `/alerts/${randomUUID()}`, ''], ['PATCH', `/alerts/${randomUUID()}`, '{"status":'], ['DELETE', '/webhook', '']];
      for (const [method, path, rawBody] of malformed) {
        const response = await adminCall(worker.url, await token('m_1', 'admin'), path, { method, rawBody });
        expect({ method, rawBody, status: response.status, body: response.body }).toEqual({
          method,
          rawBody,
          status: 404,
          body: { success: false, error: { code: 'NOT_FOUND', message: 'Not found' } },
        });
      }
    } finally {
      await worker.stop();
      await clickhouse.stop();
    }
  });
});

describe('the OpenAPI document against the answers the admin API gives', () => {
  const names = testNames('admin_doc');
  const merchantId = `m_${names.runId}`;
  let clickhouse: ClickHouseService;
  let worker: Worker;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any -- the document is read as JSON
  let document: any;
  let alertId: string;
  /** While set, every storage call fails, as in an outage. */
  let storageDown = false;
  // OpenAPI 3.1's schemas are JSON Schema 2020-12.
  const ajv = new Ajv2020({ strict: false, validateFormats: false, allErrors: true });

  /** A token of its own for each call: the rate limit (3 a minute) is reached only where meant. */
  const fresh = (role: 'viewer' | 'admin' = 'admin') => token(merchantId, role, { userId: `u_${randomUUID()}` });

  /** What is wrong with an answer by the document: its status undocumented, its body or its Retry-After not as documented. */
  function undocumented(method: string, template: string, response: AdminResponse): string[] {
    const operation = document.paths[`/admin/anomaly${template}`]?.[method.toLowerCase()];
    if (!operation) return [`${method} ${template}: no such operation`];
    const documented = operation.responses[String(response.status)];
    if (!documented) return [`${method} ${template}: answered ${response.status}, documented ${Object.keys(operation.responses).join(',')}`];
    const problems: string[] = [];
    const validate = ajv.compile({ ...documented.content['application/json'].schema, components: document.components });
    if (!validate(response.body)) problems.push(`${method} ${template} ${response.status}: ${ajv.errorsText(validate.errors)} in ${response.text.slice(0, 300)}`);
    if (response.headers.has('retry-after') && !documented.headers?.['Retry-After']) problems.push(`${method} ${template} ${response.status}: Retry-After sent, not documented`);
    return problems;
  }

  beforeAll(async () => {
    clickhouse = await startClickHouse();
    const extra = { ...ADMIN_ENV, ADMIN_RATE_LIMIT_PER_MINUTE: '3', ADMIN_CACHE_TTL_MS: '0', WEBHOOK_ALLOW_PRIVATE_TARGETS: 'true' };
    worker = await startWorker(testConfig({ clickhouse, names, extra }), {
      logger: createLogger('silent'),
      wrapClickHouse: (db): ClickHouse => {
        const down = () => Promise.reject(new Error('connect ECONNREFUSED (injected)'));
        return {
          ...db,
          insert: (...args) => (storageDown ? down() : db.insert(...args)),
          queryRows: (...args) => (storageDown ? down() : db.queryRows(...args)),
          queryPages: (...args) => (storageDown ? down() : db.queryPages(...args)),
          command: (...args) => (storageDown ? down() : db.command(...args)),
        };
      },
    });
    await worker.ready;
    document = await (await fetch(`${worker.url}/admin/anomaly/openapi.json`)).json();
    const alert = makeAlert(0, { merchantId, createdAtMs: Date.now() - MINUTE });
    alertId = alert.id;
    await worker.alertStore.save([alert]);
  });

  afterAll(async () => {
    await worker?.stop();
    await clickhouse?.stop();
  });

  /** Every operation, called as [method, path template, path, request]. */
  const operations = (): [string, string, string, Parameters<typeof adminCall>[3]?][] => [
    ['GET', '/alerts', '/alerts'],
    ['GET', '/alerts/{id}', `/alerts/${alertId}`],
    ['PATCH', '/alerts/{id}', `/alerts/${alertId}`, { method: 'PATCH', body: { status: 'acknowledged' } }],
    ['GET', '/metrics', '/metrics'],
    ['GET', '/dashboard', '/dashboard?range=1h'],
    ['GET', '/webhook', '/webhook'],
    ['PUT', '/webhook', '/webhook', { method: 'PUT', body: { url: 'https://127.0.0.1/hooks' } }],
    ['GET', '/webhook/deliveries', '/webhook/deliveries'],
    ['DELETE', '/webhook', '/webhook', { method: 'DELETE' }],
    ['GET', '/enforcement', '/enforcement'],
    ['GET', '/enforcement/history', '/enforcement/history'],
  ];

  it('documents every success, 400, 401, 403, 404 and 409 answer as it is sent', async () => {
    const calls: [string, string, string, Parameters<typeof adminCall>[3]?][] = [
      ...operations(),
      ['PATCH', '/alerts/{id}', `/alerts/${alertId}`, { method: 'PATCH', body: { status: 'open' } }], // 409
      ['PATCH', '/alerts/{id}', `/alerts/${alertId}`, { method: 'PATCH', body: { status: 'nope' } }], // 400
      ['GET', '/alerts/{id}', `/alerts/${randomUUID()}`], // 404
      ['DELETE', '/webhook', '/webhook', { method: 'DELETE' }], // 404: deleted already
      ['GET', '/alerts', '/alerts?limit=0'], // 400
    ];
    const statuses = new Set<number>();
    const problems: string[] = [];
    for (const [method, template, path, init] of calls) {
      const response = await adminCall(worker.url, await fresh(), path, init);
      statuses.add(response.status);
      problems.push(...undocumented(method, template, response));
    }
    const unauthorized = await adminCall(worker.url, 'not-a-jwt', '/alerts');
    const forbidden = await adminCall(worker.url, await fresh('viewer'), `/alerts/${alertId}`, { method: 'PATCH', body: { status: 'resolved' } });
    problems.push(...undocumented('GET', '/alerts', unauthorized), ...undocumented('PATCH', '/alerts/{id}', forbidden));
    expect(problems).toEqual([]);
    expect([...statuses, unauthorized.status, forbidden.status]).toEqual(expect.arrayContaining([200, 400, 401, 403, 404, 409]));
  });

  it('documents the 429 RATE_LIMITED answer as it is sent: retryAfterSeconds at the top of the body, and Retry-After', async () => {
    const bearer = await fresh();
    let response: AdminResponse | undefined;
    for (let i = 0; i < 4; i++) response = await adminCall(worker.url, bearer, '/metrics');
    expect(response!.status).toBe(429);
    expect(response!.body.retryAfterSeconds).toBeGreaterThan(0);
    expect(response!.headers.get('retry-after')).toBe(String(response!.body.retryAfterSeconds));
    expect(undocumented('GET', '/metrics', response!)).toEqual([]);
  });

  it('documents the 503 STORAGE_UNAVAILABLE answer, with Retry-After, of every operation', async () => {
    const problems: string[] = [];
    storageDown = true;
    try {
      // GET /enforcement answers from memory: with ENFORCEMENT_MODE off, it never reads storage.
      for (const [method, template, path, init] of operations().filter(([, template]) => template !== '/enforcement')) {
        const response = await adminCall(worker.url, await fresh(), path, init);
        expect(response.status, `${method} ${path}: ${response.text}`).toBe(503);
        expect(response.body.error.code).toBe('STORAGE_UNAVAILABLE');
        expect(response.headers.get('retry-after')).toBe('5');
        problems.push(...undocumented(method, template, response));
      }
    } finally {
      storageDown = false;
    }
    expect(problems).toEqual([]);
    // And every operation, that one included, documents both answers that carry Retry-After.
    for (const [path, methods] of Object.entries(document.paths as Record<string, Record<string, { responses: Record<string, { headers?: object }> }>>)) {
      for (const [method, operation] of Object.entries(methods)) {
        for (const status of ['429', '503']) expect(operation.responses[status]?.headers, `${method} ${path} ${status}`).toHaveProperty('Retry-After');
      }
    }
  });
});
