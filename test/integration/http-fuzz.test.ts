/**
 * Random requests against every HTTP route of a worker on the real ClickHouse engine (admin API,
 * webhooks, HTTP ingest, enforcement decisions, health): seeded, so a failure repeats. Values are drawn from the kinds of
 * input that break parsers (empty, huge, control and bidi characters, bad percent-encoding, numbers
 * out of range, prototype keys, dates half valid), mostly under valid tokens and methods so they
 * reach validation and the handlers. No request may get a 5xx, and the worker must stay healthy.
 * The hand-written cases of each rule are in admin-security, http-ingest and webhooks; this finds
 * the combinations nobody wrote (it found `from` valid with `to` not crashing the metrics range check).
 */
import { connect } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AdminRole } from '../../src/admin/auth.ts';
import { createLogger } from '../../src/logger.ts';
import { startWorker, type Worker } from '../../src/main.ts';
import { startClickHouse, type ClickHouseService } from '../services/clickhouse.ts';
import { ADMIN_ENV, token } from '../support/admin.ts';
import { prng } from '../support/random.ts';
import { TEST_INGEST_TOKEN, testConfig, testNames, waitFor } from '../support/worker.ts';

const REQUESTS = 2_000;
const SEEDS = [11, 12];

const WEIRD = [
  '', ' ', '%00', '%ff', '%E0%A4%A', '..', '../../etc/passwd', 'null', 'undefined', '[]', '{}', '-1', '0', '1e309', 'NaN',
  '9'.repeat(400), '%E2%80%AE', '%F0%9F%98%80', 'a'.repeat(5000), "'", '%22', '%5C', 'true', '2026-13-45', '2026-11-21T00:00:00Z',
  '2020-01-01T00:00:00Z', 'open', 'critical', 'bot_traffic', 'velocity_attack,bogus', '00000000-0000-4000-8000-000000000001', 'eyJ',
  '1h', '7d', 'oncall', 'merchant', '50', '201', '9999-12-31T23:59:59-23:59', '0000-01-01T00:00:00Z',
  Buffer.from('[9000000000000000,"00000000-0000-4000-8000-000000000001"]').toString('base64url'),
];
const QUERY_KEYS = ['status', 'severity', 'type', 'apiKeyId', 'from', 'to', 'limit', 'cursor', 'range', 'merchantId', 'destination', 'status[]', '__proto__', 'constructor', 'from[a]'];
const ROUTES: { path: string; methods: string[] }[] = [
  { path: '/admin/anomaly/alerts', methods: ['GET'] },
  { path: '/admin/anomaly/alerts/ID', methods: ['GET', 'PATCH'] },
  { path: '/admin/anomaly/metrics', methods: ['GET'] },
  { path: '/admin/anomaly/dashboard', methods: ['GET'] },
  { path: '/admin/anomaly/webhook', methods: ['GET', 'PUT', 'DELETE'] },
  { path: '/admin/anomaly/webhook/deliveries', methods: ['GET'] },
  { path: '/admin/anomaly/enforcement', methods: ['GET'] },
  { path: '/admin/anomaly/openapi.json', methods: ['GET'] },
  { path: '/v1/ingest/events', methods: ['POST'] },
  { path: '/v1/enforcement/decisions', methods: ['GET'] },
  { path: '/health', methods: ['GET'] },
  { path: '/ready', methods: ['GET'] },
  { path: '/metrics', methods: ['GET'] },
];
const ANY_METHOD = ['GET', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS', 'HEAD'];
const CONTENT_TYPES = ['application/x-ndjson', 'text/plain', '', 'application/json; charset=latin1', 'multipart/form-data'];

describe('HTTP routes under random input', () => {
  const names = testNames('fuzz');
  let clickhouse: ClickHouseService;
  let worker: Worker;
  let bearers: string[];

  beforeAll(async () => {
    clickhouse = await startClickHouse();
    const config = testConfig({
      clickhouse,
      names,
      extra: { ...ADMIN_ENV, ADMIN_RATE_LIMIT_PER_MINUTE: '1000000', WEBHOOK_SECRET_KEY: 'ab'.repeat(32), ENFORCEMENT_MODE: 'enforce', LOG_LEVEL: 'silent' },
    });
    worker = await startWorker(config, { logger: createLogger('silent') });
    await worker.ready;
    // Enforcement decisions answer 503 until storage was first read for them: a 5xx meant, not one found.
    await waitFor(async () => (await fetch(`${worker.url}/v1/enforcement/decisions`, { headers: { authorization: `Bearer ${TEST_INGEST_TOKEN}` } })).status === 200, 'decisions are served', 30_000);
    const roles: AdminRole[] = ['viewer', 'admin', 'operator'];
    bearers = await Promise.all(roles.map((role) => token('m_fuzz', role)));
  });

  afterAll(async () => {
    await worker?.stop();
    await clickhouse?.stop();
  });

  it.each(SEEDS)('answers %i-seeded requests without a 5xx, and stays healthy', async (seed) => {
    const random = prng(seed);
    const pick = <T>(values: readonly T[]): T => values[Math.floor(random() * values.length)]!;
    const body = (): string | undefined =>
      pick([
        undefined, '', 'null', '{', '[]', '{}', '[{}]', '"x"', '1', '{"__proto__":{"x":1}}', '\n\n{"a":1}\n{', 'x'.repeat(20_000),
        JSON.stringify({ status: pick(WEIRD), note: pick(WEIRD) }),
        JSON.stringify({ status: pick(['dismissed', 'acknowledged', 'resolved', 'open']), ...(random() < 0.5 ? { note: pick(WEIRD) } : {}) }),
        JSON.stringify({ url: pick(['https://example.com/hook', 'http://example.com/', 'https://[::1]/', 'https://user:pw@example.com/', pick(WEIRD)]) }),
        JSON.stringify([{ eventId: pick(WEIRD), apiKeyId: pick(WEIRD), merchantId: pick(WEIRD), timestamp: pick(WEIRD), ip: pick(WEIRD), status: pick(WEIRD) }]),
      ]);

    const failures: string[] = [];
    for (let i = 0; i < REQUESTS; i++) {
      const route = pick(ROUTES);
      let path = route.path.replace('ID', pick(WEIRD));
      const query = Array.from({ length: Math.floor(random() * 4) }, () => `${pick(QUERY_KEYS)}=${pick(WEIRD)}`).join('&');
      if (query) path += `?${query}`;
      const method = random() < 0.8 ? pick(route.methods) : pick(ANY_METHOD);
      const valid = path.startsWith('/v1/') ? `Bearer ${TEST_INGEST_TOKEN}` : `Bearer ${pick(bearers)}`;
      const authorization = random() < 0.8 ? valid : pick(['Bearer x', '', `Basic ${pick(bearers)}`, `${valid}x`]);
      const contentType = random() < 0.7 ? 'application/json' : pick(CONTENT_TYPES);
      const sent = method === 'GET' || method === 'HEAD' ? undefined : body();
      const response = await fetch(`${worker.url}${path}`, {
        method,
        headers: { ...(authorization ? { authorization } : {}), ...(contentType ? { 'content-type': contentType } : {}) },
        body: sent,
      });
      const text = await response.text();
      if (response.status >= 500) failures.push(`${response.status} ${method} ${path.slice(0, 200)} (${contentType}) ${String(sent).slice(0, 100)} -> ${text.slice(0, 200)}`);
    }
    expect(failures).toEqual([]);
    expect((await fetch(`${worker.url}/health`)).status).toBe(200);
    expect((await fetch(`${worker.url}/ready`)).status).toBe(200);
  });

  it('answers requests that are not valid HTTP in Format A, and stays healthy', async () => {
    const { port } = new URL(worker.url);
    const raw = (request: string) =>
      new Promise<{ status: number; body: unknown }>((resolve, reject) => {
        const socket = connect(Number(port), '127.0.0.1', () => socket.end(request));
        let text = '';
        socket.on('data', (chunk) => (text += chunk.toString('latin1')));
        socket.on('error', reject);
        socket.on('close', () => {
          const [head = '', body = ''] = text.split('\r\n\r\n');
          resolve({ status: Number(head.split(' ')[1]), body: JSON.parse(body) });
        });
      });
    const cases: [string, string, number, string][] = [
      ['a header name with a space', 'GET /health HTTP/1.1\r\nHost: x\r\nBad Header: y\r\n\r\n', 400, 'BAD_REQUEST'],
      ['both Transfer-Encoding and Content-Length', 'POST /v1/ingest/events HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n', 400, 'BAD_REQUEST'],
      ['a URL over the header size limit', `GET /admin/anomaly/alerts?apiKeyId=${'k'.repeat(20_000)} HTTP/1.1\r\nHost: x\r\n\r\n`, 431, 'HEADERS_TOO_LARGE'],
    ];
    for (const [name, request, status, code] of cases) {
      const response = await raw(request);
      expect(response.status, name).toBe(status);
      expect(response.body, name).toEqual({ success: false, error: { code, message: expect.any(String) } });
    }
    expect((await fetch(`${worker.url}/health`)).status).toBe(200);
  });
});
