/**
 * Critical-alert webhooks end to end, on the real ClickHouse engine: a merchant admin registers an
 * endpoint, an attack tool's request is ingested, the worker raises a critical alert and delivers it,
 * signed, to the on-call receiver and the merchant's receiver (real HTTPS on loopback, a test CA
 * trusted through WEBHOOK_CA_FILE, loopback allowed through WEBHOOK_ALLOW_PRIVATE_TARGETS). Then the
 * admin routes: who may see and change a webhook, validation, the delivery log, and registration
 * refusing every hostile target with the setting off.
 */
import { randomUUID } from 'node:crypto';
import { Writable } from 'node:stream';
import { Validator } from '@seriousme/openapi-schema-validator';
import Fastify, { type FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { registerAdminApi } from '../../src/admin/admin-api.ts';
import { AdminAuthenticator, mintAdminToken, type AdminRole } from '../../src/admin/auth.ts';
import { handleError } from '../../src/http/errors.ts';
import { createLogger } from '../../src/logger.ts';
import type { Worker } from '../../src/main.ts';
import { webhookRoutes } from '../../src/webhooks/webhook-routes.ts';
import { targetPolicy } from '../../src/webhooks/target-policy.ts';
import { verifyWebhook, WebhookVerificationError } from '../../src/webhooks/verify.ts';
import { useEngines } from '../support/engines.ts';
import { makeTestCertificates, startReceiver, type Receiver, type ReceivedRequest, type TestCertificates } from '../support/https-receiver.ts';
import { hostileResolver, hostileTargets } from '../support/ssrf-targets.ts';
import { TEST_INGEST_TOKEN, testConfig, testNames, waitFor } from '../support/worker.ts';

const JWT_SECRET = 'webhooks-test-jwt-secret-0123456789abcdef';
const ONCALL_SECRET = 'oncall-e2e-secret-0123456789abcdefghijk';

describe('critical-alert webhooks', () => {
  const engines = useEngines();
  let certs: TestCertificates;
  let receiver: Receiver;
  let worker: Worker;
  const logLines: string[] = [];
  const runId = randomUUID().slice(0, 8);
  const merchantA = `m_a_${runId}`;
  const merchantB = `m_b_${runId}`;
  const names = testNames('webhooks');

  beforeAll(async () => {
    certs = makeTestCertificates();
    receiver = await startReceiver(certs.server);
    const config = testConfig({
      clickhouse: engines.clickhouse,
      names,
      extra: {
        LOG_LEVEL: 'debug',
        ADMIN_ENABLED: 'true',
        ADMIN_JWT_SECRET: JWT_SECRET,
        ONCALL_WEBHOOK_URL: `https://localhost:${receiver.port}/oncall/T0001/SECRETPATH`,
        ONCALL_WEBHOOK_SECRET: ONCALL_SECRET,
        WEBHOOK_ALLOW_PRIVATE_TARGETS: 'true',
        WEBHOOK_CA_FILE: certs.caFile,
      },
    });
    const capture = new Writable({
      write(chunk: Buffer, _encoding, done) {
        logLines.push(chunk.toString());
        done();
      },
    });
    worker = await engines.startWorker(config, { logger: createLogger('debug', capture) });
  });

  afterAll(async () => {
    await receiver?.close();
    certs?.remove();
  });

  async function token(role: AdminRole, merchantId = merchantA): Promise<string> {
    return mintAdminToken({ secret: JWT_SECRET, userId: `${role}@${merchantId}`, merchantId, role });
  }

  async function call(method: string, path: string, role: AdminRole, options: { merchantId?: string; body?: unknown } = {}) {
    const response = await fetch(`${worker.url}/admin/anomaly${path}`, {
      method,
      headers: {
        authorization: `Bearer ${await token(role, options.merchantId)}`,
        ...(options.body !== undefined ? { 'content-type': 'application/json' } : {}),
      },
      ...(options.body !== undefined ? { body: JSON.stringify(options.body) } : {}),
    });
    const text = await response.text();
    return { status: response.status, headers: response.headers, text, json: text ? JSON.parse(text) : undefined };
  }

  async function ingestAttack(merchantId: string, apiKeyId: string): Promise<void> {
    const response = await fetch(`${worker.url}/v1/ingest/events`, {
      method: 'POST',
      headers: { authorization: `Bearer ${TEST_INGEST_TOKEN}`, 'content-type': 'application/json' },
      body: JSON.stringify([
        {
          eventId: `evt_${randomUUID()}`,
          timestamp: new Date().toISOString(),
          merchantId,
          plan: 'business',
          apiKeyId,
          environment: 'live',
          ip: '198.51.100.23',
          userAgent: 'sqlmap/1.7.2#stable (https://sqlmap.org)',
          method: 'GET',
          path: "/v1/verify/sessions/1' OR '1'='1",
          status: 404,
          responseTimeMs: 12,
          country: 'DE',
        },
      ]),
    });
    expect(response.status).toBe(202);
  }

  const received = (pathPrefix: string): ReceivedRequest[] => receiver.received.filter((request) => request.path.startsWith(pathPrefix));

  it('delivers a critical alert, signed, to on-call and to the merchant endpoint registered by its admin', async () => {
    const registered = await call('PUT', '/webhook', 'admin', { body: { url: `${receiver.origin}/merchant-a/hooks?src=sc` } });
    expect(registered.status).toBe(200);
    const merchantSecret: string = registered.json.data.secret;
    expect(merchantSecret).toMatch(/^whsec_[A-Za-z0-9_-]{40,}$/);

    const apiKeyId = `pk_live_${runId}_tool`;
    await ingestAttack(merchantA, apiKeyId);
    await waitFor(() => received('/merchant-a/').length >= 1 && received('/oncall/').length >= 1, 'both deliveries', 30_000);

    const [toMerchant] = received('/merchant-a/');
    const toOncall = received('/oncall/').find((request) => JSON.parse(request.rawBody).merchantId === merchantA)!;
    expect(toMerchant!.path).toBe('/merchant-a/hooks?src=sc');
    expect(toOncall.path).toBe('/oncall/T0001/SECRETPATH');
    const merchantDelivery = verifyWebhook({ secret: merchantSecret, rawBody: toMerchant!.rawBody, headers: toMerchant!.headers });
    verifyWebhook({ secret: ONCALL_SECRET, rawBody: toOncall.rawBody, headers: toOncall.headers });
    expect(toOncall.headers['svc-id']).not.toBe(toMerchant!.headers['svc-id']); // one message per destination

    const body = JSON.parse(toMerchant!.rawBody);
    const [alert] = (await worker.alertStore.list({ merchantId: merchantA })).filter((a) => a.apiKeyId === apiKeyId);
    expect(body).toMatchObject({ event: 'anomaly.alert.critical', alertId: alert!.id, merchantId: merchantA });
    expect(new Date(body.timestamp).toISOString()).toBe(body.timestamp);
    expect(body.data).toMatchObject({ id: alert!.id, type: 'bot_traffic', severity: 'critical', apiKeyId, status: 'open', recommendedAction: 'block' });
    expect(body.data).not.toHaveProperty('scope');
    expect(toOncall.rawBody).toBe(toMerchant!.rawBody);

    // What a receiver's verifier must reject, on the real delivery.
    const reject = (options: Parameters<typeof verifyWebhook>[0]) => {
      try {
        verifyWebhook(options);
      } catch (error) {
        return (error as WebhookVerificationError).reason;
      }
      return 'accepted';
    };
    const base = { secret: merchantSecret, rawBody: toMerchant!.rawBody, headers: toMerchant!.headers };
    expect(reject({ ...base, rawBody: toMerchant!.rawBody.replace('"critical"', '"low"') })).toBe('invalid_signature');
    expect(reject({ ...base, secret: ONCALL_SECRET })).toBe('invalid_signature');
    expect(reject({ ...base, now: merchantDelivery.timestamp + 5 * 60_000 + 1 })).toBe('stale_timestamp');
    const { ['svc-signature']: _dropped, ...withoutSignature } = toMerchant!.headers;
    expect(reject({ ...base, headers: withoutSignature })).toBe('missing_header');

    // The delivery log: the merchant sees its own delivery; the on-call one is the operator's.
    await waitFor(async () => (await call('GET', '/webhook/deliveries', 'viewer')).json.data.deliveries[0]?.status === 'delivered', 'stored as delivered', 10_000);
    const log = (await call('GET', '/webhook/deliveries', 'viewer')).json.data;
    expect(log.deliveries).toHaveLength(1);
    expect(log.deliveries[0]).toMatchObject({
      id: merchantDelivery.id,
      alertId: alert!.id,
      merchantId: merchantA,
      destination: 'merchant',
      target: `${receiver.origin}/merchant-a/hooks?src=sc`,
      status: 'delivered',
      attempts: 1,
      nextAttemptAt: null,
      lastOutcome: 'delivered',
      lastError: null,
    });
    expect(log.deliveries[0].attemptLog).toEqual([
      { attempt: 1, at: expect.any(String), outcome: 'delivered', statusCode: 200, error: null, durationMs: expect.any(Number) },
    ]);
    const operatorLog = (await call('GET', `/webhook/deliveries?merchantId=${merchantA}`, 'operator', { merchantId: 'm_ops' })).json.data;
    const oncallEntry = operatorLog.deliveries.find((d: { destination: string }) => d.destination === 'oncall');
    expect(oncallEntry).toMatchObject({ status: 'delivered', target: `https://localhost:${receiver.port}` }); // the origin only
  });

  it('shows the signing secret once: GET shows the URL only, and a new PUT issues a new secret', async () => {
    const first = await call('PUT', '/webhook', 'admin', { body: { url: `${receiver.origin}/merchant-a/v2` } });
    expect(first.status).toBe(200);
    expect(first.headers.get('cache-control')).toBe('no-store');
    const secret = first.json.data.secret;
    const shown = await call('GET', '/webhook', 'viewer');
    expect(shown.status).toBe(200);
    expect(shown.json.data).toEqual({
      url: `${receiver.origin}/merchant-a/v2`,
      createdAt: expect.any(String),
      updatedAt: expect.any(String),
      createdBy: `admin@${merchantA}`,
      updatedBy: `admin@${merchantA}`,
    });
    expect(shown.text).not.toContain(secret);
    expect(shown.text).not.toContain('whsec_');
    // Replaced by an operator: when and by whom it was first registered stay; who replaced it shows.
    const second = await call('PUT', `/webhook?merchantId=${merchantA}`, 'operator', { merchantId: 'm_ops', body: { url: `${receiver.origin}/merchant-a/v3` } });
    expect(second.json.data.secret).not.toBe(secret);
    expect(second.json.data).toMatchObject({ createdAt: first.json.data.createdAt, createdBy: `admin@${merchantA}`, updatedBy: 'operator@m_ops' });
    expect((await call('GET', '/webhook', 'viewer')).json.data).toMatchObject({ url: `${receiver.origin}/merchant-a/v3`, createdBy: `admin@${merchantA}`, updatedBy: 'operator@m_ops' });
  });

  it('seals the secrets registered without a key when a worker starts with WEBHOOK_SECRET_KEY, and they still sign', async () => {
    const registered = await call('PUT', '/webhook', 'admin', { body: { url: `${receiver.origin}/merchant-a/sealed` } });
    const secret: string = registered.json.data.secret;
    const storedSecret = async () => {
      const rows = await worker.clickhouse.queryRows<{ secret: string }>(
        `SELECT secret FROM ${engines.clickhouse.database}.webhook_endpoints FINAL WHERE merchant_id = {merchantId:String} AND deleted = 0`,
        { merchantId: merchantA },
      );
      return rows[0]?.secret;
    };
    expect(await storedSecret()).toBe(secret); // this suite's worker has no key

    // Another worker on the same storage, with a key (no Kafka intake: only its start matters).
    const keyed = await engines.startWorker(
      testConfig({ clickhouse: engines.clickhouse, names, extra: { FEATURE_ANOMALY_DETECTION: 'false', WEBHOOK_SECRET_KEY: 'c3'.repeat(32) } }),
    );
    const sealed = await storedSecret();
    expect(sealed).toMatch(/^sealed:v1:/);
    expect(sealed).not.toContain(secret);
    expect((await keyed.webhookStore.endpoint(merchantA))?.secret).toBe(secret);
    await keyed.stop();
    expect((await worker.webhookStore.endpoint(merchantA))?.secret).toBeUndefined(); // a replica without the key cannot open it
  });

  it('lets viewers read but not change, and keeps merchants apart', async () => {
    const url = `${receiver.origin}/merchant-a/v3`;
    expect((await call('PUT', '/webhook', 'admin', { body: { url } })).status).toBe(200);
    expect((await call('PUT', '/webhook', 'viewer', { body: { url: `${receiver.origin}/viewer` } })).status).toBe(403);
    expect((await call('DELETE', '/webhook', 'viewer')).status).toBe(403);

    // Merchant B cannot see or change A's webhook.
    expect((await call('GET', '/webhook', 'admin', { merchantId: merchantB })).status).toBe(404);
    expect((await call('GET', `/webhook?merchantId=${merchantA}`, 'admin', { merchantId: merchantB })).status).toBe(403);
    expect((await call('PUT', `/webhook?merchantId=${merchantA}`, 'admin', { merchantId: merchantB, body: { url: `${receiver.origin}/b` } })).status).toBe(403);
    expect((await call('DELETE', `/webhook?merchantId=${merchantA}`, 'admin', { merchantId: merchantB })).status).toBe(403);
    expect((await call('DELETE', '/webhook', 'admin', { merchantId: merchantB })).status).toBe(404);
    const bLog = (await call('GET', '/webhook/deliveries', 'admin', { merchantId: merchantB })).json.data;
    expect(bLog).toEqual({ deliveries: [], nextCursor: null });
    expect((await call('GET', '/webhook', 'viewer')).json.data.url).toBe(url);

    // Operators name the merchant for the singleton routes.
    const noMerchant = await call('PUT', '/webhook', 'operator', { merchantId: 'm_ops', body: { url } });
    expect(noMerchant.status).toBe(400);
    expect(noMerchant.json).toMatchObject({ code: 'VALIDATION_ERROR', details: [{ path: ['query', 'merchantId'] }] });
    // The merchant named is stored with the endpoint: one that carries a secret is refused.
    const secretMerchant = await call('PUT', '/webhook?merchantId=m_sk_live_MSECRET1', 'operator', { merchantId: 'm_ops', body: { url } });
    expect(secretMerchant.status).toBe(400);
    expect(secretMerchant.json).toMatchObject({ code: 'VALIDATION_ERROR', details: [{ path: ['query', 'merchantId'] }] });
    expect((await call('GET', `/webhook?merchantId=${merchantA}`, 'operator', { merchantId: 'm_ops' })).json.data.url).toBe(url);

    // Delete, then nothing is registered.
    const deleted = await call('DELETE', '/webhook', 'admin');
    expect(deleted).toMatchObject({ status: 200, json: { success: true, data: { deleted: true } } });
    expect((await call('GET', '/webhook', 'viewer')).status).toBe(404);
    expect((await call('DELETE', '/webhook', 'admin')).status).toBe(404);
  });

  it('removes the endpoint for a client that sends Content-Type: application/json on every request, with no body', async () => {
    const merchantD = `m_d_${runId}`;
    const bearer = await token('admin', merchantD);
    const remove = (init: { body?: string }, contentType = 'application/json') =>
      fetch(`${worker.url}/admin/anomaly/webhook`, { method: 'DELETE', headers: { authorization: `Bearer ${bearer}`, 'content-type': contentType }, ...init });
    // An empty body is no body whatever type it is sent as.
    for (const [init, contentType] of [[{}], [{ body: '' }], [{ body: '' }, 'text/plain'], [{ body: '' }, 'application/x-www-form-urlencoded']] as const) {
      expect((await call('PUT', '/webhook', 'admin', { merchantId: merchantD, body: { url: `${receiver.origin}/merchant-d` } })).status).toBe(200);
      const removed = await remove(init, contentType);
      expect(removed.status, `${JSON.stringify(init)} as ${contentType}`).toBe(200);
      expect(await removed.json()).toEqual({ success: true, data: { deleted: true } });
      expect((await call('GET', '/webhook', 'viewer', { merchantId: merchantD })).status).toBe(404);
    }
    // A body that is there is still refused: this route takes none.
    for (const body of ['{"url":"x"}', 'not json', ' ']) {
      const refused = await remove({ body });
      expect(refused.status, body).toBe(400);
      expect(((await refused.json()) as { code: string }).code).toBe('VALIDATION_ERROR');
    }
  });

  it('sends nothing to a merchant whose endpoint was removed, and still tells on-call', async () => {
    const merchantC = `m_c_${runId}`;
    expect((await call('PUT', '/webhook', 'admin', { merchantId: merchantC, body: { url: `${receiver.origin}/merchant-c` } })).status).toBe(200);
    expect((await call('DELETE', '/webhook', 'admin', { merchantId: merchantC })).status).toBe(200);
    await ingestAttack(merchantC, `pk_live_${runId}_c`);
    await waitFor(() => received('/oncall/').some((request) => JSON.parse(request.rawBody).merchantId === merchantC), 'on-call delivery', 30_000);
    expect(received('/merchant-c')).toHaveLength(0);
  });

  it('refuses bad bodies in Format B naming body.url', async () => {
    const cases: [unknown, (string | number)[]][] = [
      [{ url: `http://hooks.example.com/x` }, ['body', 'url']],
      [{ url: 'not a url' }, ['body', 'url']],
      [{ url: 'https://169.254.169.254/latest/meta-data/' }, ['body', 'url']],
      // Short as typed, over 2,048 characters as stored (percent-encoded): every delivery would refuse it.
      [{ url: `${receiver.origin}/${'é'.repeat(400)}` }, ['body', 'url']],
      [{}, ['body', 'url']],
      [{ url: `${receiver.origin}/x`, secret: 'mine' }, ['body', 'secret']],
      // It would be stored, shown and recorded with every delivery.
      [{ url: `${receiver.origin}/hook?token=sk_live_URLSECRET123` }, ['body', 'url']],
      [{ url: `${receiver.origin}/hook?token=s\tk_live_URLSECRET123` }, ['body', 'url']], // the tab goes as it is parsed
    ];
    for (const [body, path] of cases) {
      const response = await call('PUT', '/webhook', 'admin', { body });
      expect(response.status).toBe(400);
      expect(response.json).toMatchObject({ code: 'VALIDATION_ERROR', details: [{ path }] });
      expect(JSON.stringify(response.json)).not.toContain('URLSECRET');
    }
  });

  it('pages the delivery log with a cursor and validates the query', async () => {
    const operator = { merchantId: 'm_ops' };
    const first = (await call('GET', '/webhook/deliveries?limit=1', 'operator', operator)).json.data;
    expect(first.deliveries).toHaveLength(1);
    expect(first.nextCursor).toEqual(expect.any(String));
    const second = (await call('GET', `/webhook/deliveries?limit=1&cursor=${first.nextCursor}`, 'operator', operator)).json.data;
    expect(second.deliveries).toHaveLength(1);
    expect(second.deliveries[0].id).not.toBe(first.deliveries[0].id);
    expect(second.deliveries[0].createdAt <= first.deliveries[0].createdAt).toBe(true);
    for (const query of ['limit=0', 'limit=201', 'limit=1e2', 'limit=0x10', 'cursor=garbage', 'status=lost', 'destination=oncall']) {
      const response = await call('GET', `/webhook/deliveries?${query}`, 'operator', operator);
      expect(response.status).toBe(400);
      expect(response.json.code).toBe('VALIDATION_ERROR');
    }
  });

  it('describes the webhook routes in the OpenAPI document, which is valid', async () => {
    const document: any = await (await fetch(`${worker.url}/admin/anomaly/openapi.json`)).json();
    const result = await new Validator().validate(document);
    expect(result.errors).toBeUndefined();
    expect(result.valid).toBe(true);
    expect(Object.keys(document.paths['/admin/anomaly/webhook']).sort()).toEqual(['delete', 'get', 'put']);
    expect(document.paths['/admin/anomaly/webhook'].put['x-required-roles']).toEqual(['admin', 'operator']);
    expect(document.paths['/admin/anomaly/webhook/deliveries'].get.parameters.map((p: { name: string }) => p.name).sort()).toEqual(['cursor', 'limit', 'merchantId', 'status']);
  });

  it('never logs a signing secret', async () => {
    const secret = (await call('PUT', '/webhook', 'admin', { body: { url: `${receiver.origin}/merchant-a/logs` } })).json.data.secret;
    await worker.alertStore.list({}); // something else to log around it
    const logs = logLines.join('');
    expect(logs).toContain('WEBHOOK_ALLOW_PRIVATE_TARGETS'); // the loud warning is there
    expect(logs).not.toContain(secret);
    expect(logs).not.toContain(ONCALL_SECRET);
    expect(logs).not.toContain('SECRETPATH'); // the on-call URL's path may carry a token
    expect(logs).not.toContain(JWT_SECRET);
  });

  describe('registration with WEBHOOK_ALLOW_PRIVATE_TARGETS off', () => {
    let app: FastifyInstance;
    beforeAll(async () => {
      app = Fastify();
      app.setErrorHandler(handleError);
      await registerAdminApi(app, {
        authenticator: new AdminAuthenticator(JWT_SECRET, ['business', 'enterprise']),
        routes: webhookRoutes({ store: worker.webhookStore, policy: targetPolicy({ resolve: hostileResolver() }) }),
        rateLimitPerMinute: 10_000,
        maxBodyBytes: 16_384,
        version: 'test',
      });
    });
    afterAll(() => app?.close());

    it.each(hostileTargets(8443).filter((target) => !target.passesRegistration))('refuses $name with 400 naming body.url', async ({ url }) => {
      const response = await app.inject({
        method: 'PUT',
        url: '/admin/anomaly/webhook',
        headers: { authorization: `Bearer ${await token('admin', `m_ssrf_${runId}`)}` },
        payload: { url },
      });
      expect(response.statusCode).toBe(400);
      expect(response.json()).toMatchObject({ code: 'VALIDATION_ERROR', details: [{ path: ['body', 'url'], message: expect.any(String) }] });
      expect(await worker.webhookStore.endpoint(`m_ssrf_${runId}`)).toBeUndefined();
    });

    it('refuses the loopback receiver the rest of this suite uses', async () => {
      const response = await app.inject({
        method: 'PUT',
        url: '/admin/anomaly/webhook',
        headers: { authorization: `Bearer ${await token('admin', `m_ssrf_${runId}`)}` },
        payload: { url: `${receiver.origin}/merchant` },
      });
      expect(response.statusCode).toBe(400);
      expect(response.json().details[0].message).toBe('must not point to a loopback address');
    });
  });
});
