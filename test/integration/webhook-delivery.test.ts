/**
 * Webhook delivery on the real ClickHouse engine and real HTTPS receivers on loopback (a test CA
 * made at test time), with an injected clock so the 1- and 5-minute steps, the 15-minute budget and
 * the breaker's hour take no real time: the schedule, every kind of failure, the breaker, a restart
 * between attempts, and a burst of 1,000 critical alerts with bounded memory. Each test has a
 * database of its own.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Alert } from '../../src/alerts/alert.ts';
import { testAlert } from '../../src/alerts/test-findings.ts';
import { createLogger } from '../../src/logger.ts';
import { WorkerMetrics } from '../../src/metrics.ts';
import { connectClickHouse, type ClickHouse } from '../../src/store/clickhouse.ts';
import { migrate } from '../../src/store/migrate.ts';
import { tablesIn, type Tables } from '../../src/store/tables.ts';
import { WebhookStore, type DeliveryRecord } from '../../src/store/webhook-store.ts';
import { ADOPT_AFTER_MS, WebhookDispatcher, type WebhookDispatcherOptions } from '../../src/webhooks/dispatcher.ts';
import { SecretBox } from '../../src/webhooks/secret-box.ts';
import { targetPolicy } from '../../src/webhooks/target-policy.ts';
import { verifyWebhook } from '../../src/webhooks/verify.ts';
import { useEngines } from '../support/engines.ts';
import { makeTestCertificates, startReceiver, type Receiver, type TestCertificates } from '../support/https-receiver.ts';
import { freePort } from '../support/ports.ts';
import { waitFor } from '../support/worker.ts';

const MINUTE = 60_000;
const ONCALL_SECRET = 'oncall-secret-0123456789abcdefghijklmnop';
const logger = createLogger(process.env.TEST_LOG_LEVEL ?? 'silent');

describe('webhook delivery', () => {
  const engines = useEngines();
  let certs: TestCertificates;
  let receiver: Receiver;
  let databases = 0;

  beforeAll(async () => {
    certs = makeTestCertificates();
    receiver = await startReceiver(certs.server);
  });
  afterAll(async () => {
    await receiver?.close();
    certs?.remove();
  });

  /** A clock the test moves; it starts at the real time so ClickHouse TTLs do not drop the rows. */
  function testClock() {
    let now = Date.now();
    return { now: () => now, set: (at: number) => (now = at), advance: (ms: number) => (now += ms) };
  }

  interface Harness {
    db: ClickHouse;
    store: WebhookStore;
    tables: Tables;
    metrics: WorkerMetrics;
    dispatcher: WebhookDispatcher;
    stop(): Promise<void>;
  }

  /** Connects to a database (new unless named), migrates it, and starts a dispatcher on it. */
  async function startDispatcher(options: Partial<WebhookDispatcherOptions> & { database?: string; secrets?: SecretBox } = {}): Promise<Harness> {
    const { clickhouse } = engines;
    const tables = tablesIn(options.database ?? `${clickhouse.database}_${++databases}`);
    const db = connectClickHouse({ url: clickhouse.url, username: clickhouse.username, password: clickhouse.password, dataDir: clickhouse.dataDir });
    await migrate(db, { tables, eventsTtlDays: 30 }, logger);
    const store = new WebhookStore(db, tables, options.secrets);
    const metrics = new WorkerMetrics({ defaultMetrics: false });
    const dispatcher = new WebhookDispatcher({
      store,
      policy: targetPolicy({ allowPrivate: true }),
      ca: [certs.caPem],
      metrics,
      logger,
      pollIntervalMs: 20,
      rescanIntervalMs: 60 * MINUTE,
      ...options,
    });
    await dispatcher.start();
    return {
      db,
      store,
      tables,
      metrics,
      dispatcher,
      async stop() {
        await dispatcher.stop();
        await db.close();
      },
    };
  }

  function alert(merchantId: string, index = 0): Alert {
    return testAlert(Date.now(), { id: randomUUID(), merchantId, apiKeyId: `pk_live_${merchantId}_${index}` });
  }

  /** As PUT /admin/anomaly/webhook does: a replacement keeps the registration's createdAt. */
  async function registerEndpoint(store: WebhookStore, merchantId: string, url: string, now: number): Promise<string> {
    const secret = `whsec_${merchantId}_${randomUUID()}`;
    const createdAt = (await store.endpoint(merchantId))?.createdAt ?? now;
    await store.putEndpoint({ merchantId, endpointId: randomUUID(), url, secret, createdBy: 'test', createdAt, updatedAt: now });
    return secret;
  }

  async function deliveries(store: WebhookStore, merchantId?: string): Promise<DeliveryRecord[]> {
    return store.deliveries({ merchantId, limit: 5_000 });
  }

  /** Requests the receiver got on one path. */
  const requestsTo = (path: string) => receiver.received.filter((request) => request.path === path);
  const settle = (ms = 300) => new Promise((resolve) => setTimeout(resolve, ms));

  it('retries a 500 at 1 and 5 minutes with the same svc-id and body, then gives up for good', async () => {
    const clock = testClock();
    const t0 = clock.now();
    const path = `/oncall-${randomUUID()}`;
    receiver.answer((request) => (request.path === path ? 500 : 200));
    const h = await startDispatcher({ now: clock.now, oncall: { url: `${receiver.origin}${path}`, secret: ONCALL_SECRET } });
    h.dispatcher.notify(alert('m_retry'));

    await waitFor(() => requestsTo(path).length === 1, 'first attempt at once', 10_000);
    clock.set(t0 + MINUTE - 1);
    await settle();
    expect(requestsTo(path)).toHaveLength(1); // not early
    clock.set(t0 + MINUTE);
    await waitFor(() => requestsTo(path).length === 2, 'second attempt at 1 minute', 10_000);
    clock.set(t0 + 5 * MINUTE - 1);
    await settle();
    expect(requestsTo(path)).toHaveLength(2);
    clock.set(t0 + 5 * MINUTE);
    await waitFor(() => requestsTo(path).length === 3, 'third attempt at 5 minutes', 10_000);
    await waitFor(async () => (await deliveries(h.store))[0]?.status === 'failed', 'message failed after the third attempt', 10_000);
    clock.set(t0 + 20 * MINUTE);
    await settle();
    expect(requestsTo(path)).toHaveLength(3); // the last is final

    const requests = requestsTo(path);
    const verified = requests.map((request) =>
      verifyWebhook({ secret: ONCALL_SECRET, rawBody: request.rawBody, headers: request.headers, now: Number(request.headers['svc-timestamp']) }),
    );
    expect(verified.map((v) => v.timestamp)).toEqual([t0, t0 + MINUTE, t0 + 5 * MINUTE]);
    expect(new Set(verified.map((v) => v.id)).size).toBe(1);
    expect(new Set(requests.map((request) => request.rawBody)).size).toBe(1);

    const [delivery] = await deliveries(h.store);
    expect(delivery).toMatchObject({ id: verified[0]!.id, destination: 'oncall', status: 'failed', attempts: 3, lastOutcome: 'http_error', target: receiver.origin });
    expect(delivery!.attemptLog.map((a) => [a.attempt, a.outcome, a.statusCode, a.at - t0])).toEqual([
      [1, 'http_error', 500, 0],
      [2, 'http_error', 500, MINUTE],
      [3, 'http_error', 500, 5 * MINUTE],
    ]);
    await h.stop();
  });

  it('records timeouts, refused connections and TLS failures as failed attempts, retries them, and delivers once the endpoint answers', async () => {
    const clock = testClock();
    const t0 = clock.now();
    const hanging = await startReceiver(certs.server, { answer: 'hang' });
    const untrusted = await startReceiver(certs.untrusted);
    const h = await startDispatcher({ now: clock.now, requestTimeoutMs: 300, connectTimeoutMs: 300 });
    try {
      await registerEndpoint(h.store, 'm_timeout', `${hanging.origin}/hook`, t0);
      await registerEndpoint(h.store, 'm_refused', `https://127.0.0.1:${await freePort()}/hook`, t0);
      await registerEndpoint(h.store, 'm_tls', `${untrusted.origin}/hook`, t0);
      for (const merchantId of ['m_timeout', 'm_refused', 'm_tls']) h.dispatcher.notify(alert(merchantId));

      const outcomes = async (attempt: number) =>
        Object.fromEntries((await deliveries(h.store)).map((d) => [d.merchantId, d.attemptLog.find((a) => a.attempt === attempt)?.outcome]));
      const expected = { m_timeout: 'timeout', m_refused: 'connect_error', m_tls: 'tls_error' };
      const recorded = async (attempt: number) => Object.values(await outcomes(attempt)).filter(Boolean).length === 3;
      await waitFor(() => recorded(1), 'first attempts recorded', 15_000);
      expect(await outcomes(1)).toEqual(expected);
      for (const d of await deliveries(h.store)) expect(d).toMatchObject({ status: 'pending', attempts: 1, nextAttemptAt: t0 + MINUTE });

      clock.set(t0 + MINUTE);
      await waitFor(() => recorded(2), 'second attempts recorded', 15_000);
      expect(await outcomes(2)).toEqual(expected);

      hanging.answer(200); // the slow endpoint recovers
      clock.set(t0 + 5 * MINUTE);
      await waitFor(async () => (await deliveries(h.store)).filter((d) => d.status !== 'pending').length === 3, 'all messages final', 15_000);
      const byMerchant = Object.fromEntries((await deliveries(h.store)).map((d) => [d.merchantId, d]));
      expect(byMerchant.m_timeout).toMatchObject({ status: 'delivered', attempts: 3, lastOutcome: 'delivered' });
      expect(byMerchant.m_refused).toMatchObject({ status: 'failed', attempts: 3, lastOutcome: 'connect_error' });
      expect(byMerchant.m_tls).toMatchObject({ status: 'failed', attempts: 3, lastOutcome: 'tls_error' });
      expect(untrusted.received).toHaveLength(0); // no request was sent over the refused TLS session
      expect(hanging.received).toHaveLength(3);
    } finally {
      await h.stop();
      await hanging.close();
      await untrusted.close();
    }
  });

  it('stores merchants\' signing secrets sealed when a key is set, and still signs with them (and with older unsealed ones)', async () => {
    const path = `/sealed-${randomUUID()}`;
    receiver.answer(() => 200);
    const h = await startDispatcher({ secrets: new SecretBox(randomBytes(32)) });
    const t0 = Date.now();
    const secret = await registerEndpoint(h.store, 'm_sealed', `${receiver.origin}${path}/sealed`, t0);
    // Registered before WEBHOOK_SECRET_KEY was set: stored as it is, and still read.
    const older = await registerEndpoint(new WebhookStore(h.db, h.tables), 'm_older', `${receiver.origin}${path}/older`, t0);
    const rows = await h.db.queryRows<{ merchant_id: string; secret: string }>(`SELECT merchant_id, secret FROM ${h.tables.webhookEndpoints} FINAL`);
    const storedSecret = (merchantId: string) => rows.find((row) => row.merchant_id === merchantId)?.secret;
    expect(storedSecret('m_sealed')).toMatch(/^sealed:v1:/);
    expect(storedSecret('m_sealed')).not.toContain(secret);
    expect(storedSecret('m_older')).toBe(older);

    h.dispatcher.notify(alert('m_sealed'));
    h.dispatcher.notify(alert('m_older'));
    await waitFor(() => receiver.received.filter((request) => request.path.startsWith(path)).length === 2, 'both delivered', 10_000);
    for (const [merchant, key] of [['sealed', secret], ['older', older]] as const) {
      const [request] = receiver.received.filter((received) => received.path === `${path}/${merchant}`);
      expect(verifyWebhook({ secret: key, rawBody: request!.rawBody, headers: request!.headers, now: Number(request!.headers['svc-timestamp']) }).id).toBe(request!.headers['svc-id']);
    }
    await h.stop();
  });

  it('keeps delivering when one merchant\'s secret no longer opens (the key changed), and signs it again once the old key is given as previous', async () => {
    const path = `/rotated-${randomUUID()}`;
    receiver.answer(() => 200);
    const oldKey = randomBytes(32);
    const before = await startDispatcher({ secrets: new SecretBox(oldKey) });
    const t0 = Date.now();
    const lostSecret = await registerEndpoint(before.store, 'm_lost', `${receiver.origin}${path}/lost`, t0);
    await before.stop();

    // Restarted with a new key and without the old one: m_lost's stored secret opens with no key.
    const oncall = { url: `${receiver.origin}${path}/oncall`, secret: ONCALL_SECRET };
    const after = await startDispatcher({ secrets: new SecretBox(randomBytes(32)), database: before.tables.database, oncall });
    expect((await after.store.endpoint('m_lost'))?.secret).toBeUndefined(); // read, not thrown
    const keptSecret = await registerEndpoint(after.store, 'm_kept', `${receiver.origin}${path}/kept`, t0);
    after.dispatcher.notify(alert('m_lost'));
    after.dispatcher.notify(alert('m_kept'));
    await waitFor(async () => (await deliveries(after.store, 'm_lost')).some((d) => d.destination === 'merchant' && d.attempts === 1), 'the unreadable attempt is recorded', 10_000);
    await waitFor(() => requestsTo(`${path}/oncall`).length === 2 && requestsTo(`${path}/kept`).length === 1, 'on-call and the other merchant delivered', 10_000);
    expect(requestsTo(`${path}/lost`)).toHaveLength(0); // nothing sent unsigned or wrongly signed
    const [lost] = (await deliveries(after.store, 'm_lost')).filter((d) => d.destination === 'merchant');
    expect(lost).toMatchObject({ status: 'pending', lastOutcome: 'secret_unreadable' });
    expect(lost!.lastError).toMatch(/WEBHOOK_SECRET_KEY_PREVIOUS/);
    const [kept] = requestsTo(`${path}/kept`);
    expect(verifyWebhook({ secret: keptSecret, rawBody: kept!.rawBody, headers: kept!.headers, now: Number(kept!.headers['svc-timestamp']) }).id).toBe(kept!.headers['svc-id']);
    await after.stop();

    // The operator gives the old key as WEBHOOK_SECRET_KEY_PREVIOUS: the old secret signs again.
    const newKey = randomBytes(32);
    const rotated = await startDispatcher({ secrets: new SecretBox(newKey, [oldKey]), database: before.tables.database });
    expect((await rotated.store.endpoint('m_lost'))?.secret).toBe(lostSecret);
    rotated.dispatcher.notify(alert('m_lost', 1));
    await waitFor(() => requestsTo(`${path}/lost`).length >= 1, 'delivered with the old secret', 10_000);
    const [request] = requestsTo(`${path}/lost`);
    expect(verifyWebhook({ secret: lostSecret, rawBody: request!.rawBody, headers: request!.headers, now: Number(request!.headers['svc-timestamp']) }).id).toBe(request!.headers['svc-id']);

    // Sealed again with the new key (what a worker does at start), the old key is no longer needed;
    // m_kept's secret, sealed with a key given to neither, is counted and left alone.
    expect(await rotated.store.resealSecrets()).toEqual({ resealed: 1, unreadable: 1 });
    expect(await rotated.store.resealSecrets()).toEqual({ resealed: 0, unreadable: 1 });
    await rotated.stop();
    const { url, username, password, dataDir } = engines.clickhouse;
    const reopened = connectClickHouse({ url, username, password, dataDir });
    const onlyNewKey = new WebhookStore(reopened, rotated.tables, new SecretBox(newKey));
    expect((await onlyNewKey.endpoint('m_lost'))?.secret).toBe(lostSecret);
    expect((await onlyNewKey.endpoint('m_kept'))?.secret).toBeUndefined();
    await reopened.close();
  });

  it('sends a retry to the endpoint registered at the time of the attempt, and cancels it when the endpoint was removed', async () => {
    const clock = testClock();
    const t0 = clock.now();
    const base = `/moved-${randomUUID()}`;
    receiver.answer((request) => (request.path.startsWith(`${base}/old`) ? 500 : 200));
    const h = await startDispatcher({ now: clock.now });
    await registerEndpoint(h.store, 'm_moves', `${receiver.origin}${base}/old`, t0);
    await registerEndpoint(h.store, 'm_leaves', `${receiver.origin}${base}/old-leaves`, t0);
    await registerEndpoint(h.store, 'm_returns', `${receiver.origin}${base}/old-returns`, t0);
    // Registered through a replica whose clock is a second ahead of this one's: the message is its.
    await registerEndpoint(h.store, 'm_skewed', `${receiver.origin}${base}/skewed`, t0 + 1_000);
    h.dispatcher.notify(alert('m_moves'));
    h.dispatcher.notify(alert('m_leaves'));
    h.dispatcher.notify(alert('m_returns'));
    h.dispatcher.notify(alert('m_skewed'));
    await waitFor(async () => (await deliveries(h.store)).filter((d) => d.attempts === 1).length === 4, 'first attempts', 10_000);

    const newSecret = await registerEndpoint(h.store, 'm_moves', `${receiver.origin}${base}/new`, t0 + 1);
    // The removal cancels the pending message at once: the log shows it before its retry is due.
    expect(await h.store.removeEndpoint('m_leaves', t0 + 1)).toEqual({ cancelledMessages: 1 });
    expect((await deliveries(h.store, 'm_leaves'))[0]).toMatchObject({ status: 'cancelled', lastOutcome: 'cancelled', lastError: 'the merchant endpoint was removed', updatedAt: t0 + 1 });
    // Removed while an attempt was in flight, whose retry is recorded after the removal, then
    // registered again before that retry: the removal still cancels it (a registration within a few
    // seconds of the message might be the replicas' clocks apart).
    const [inFlight] = (await h.store.pendingMessages(10, [], { owner: 'test', adoptAfterMs: 0 })).filter((message) => message.merchantId === 'm_returns');
    expect(await h.store.removeEndpoint('m_returns', t0 + 1)).toEqual({ cancelledMessages: 1 });
    const { endpoint: _endpoint, dueAt: _dueAt, ...retry } = inFlight!;
    await h.store.saveMessages([{ ...retry, updatedAt: t0 + 2 }]);
    await registerEndpoint(h.store, 'm_returns', `${receiver.origin}${base}/new-returns`, t0 + 10_000);
    clock.set(t0 + MINUTE);
    await waitFor(async () => (await deliveries(h.store)).every((d) => d.status !== 'pending'), 'both final', 10_000);

    const byMerchant = Object.fromEntries((await deliveries(h.store)).map((d) => [d.merchantId, d]));
    expect(byMerchant.m_moves).toMatchObject({ status: 'delivered', attempts: 2, target: `${receiver.origin}${base}/new` });
    expect(byMerchant.m_leaves).toMatchObject({ status: 'cancelled', attempts: 1, lastOutcome: 'cancelled' });
    expect(byMerchant.m_returns).toMatchObject({ status: 'cancelled', attempts: 1, lastOutcome: 'cancelled' });
    expect(byMerchant.m_skewed).toMatchObject({ status: 'delivered', attempts: 1 });
    expect(receiver.received.filter((request) => request.path === `${base}/new-returns`)).toHaveLength(0);
    const moved = receiver.received.filter((request) => request.path === `${base}/new`);
    expect(moved).toHaveLength(1);
    expect(verifyWebhook({ secret: newSecret, rawBody: moved[0]!.rawBody, headers: moved[0]!.headers, now: t0 + MINUTE }).id).toBe(byMerchant.m_moves!.id);
    expect(receiver.received.filter((request) => request.path === `${base}/old-leaves`)).toHaveLength(1); // no retry after removal
    expect(await h.store.endpoint('m_leaves')).toBeUndefined();
    await h.stop();
  });

  /**
   * A dispatcher makes the first attempt of one on-call message (answered with `status`) and stops;
   * returns what a second dispatcher on the same storage needs.
   */
  async function firstAttemptThenStop(status: number) {
    const clock = testClock();
    const path = `/oncall-${randomUUID()}`;
    receiver.answer((request) => (request.path === path ? status : 200));
    const oncall = { url: `${receiver.origin}${path}`, secret: ONCALL_SECRET };
    const first = await startDispatcher({ now: clock.now, oncall });
    first.dispatcher.notify(alert('m_restart'));
    await waitFor(async () => (await deliveries(first.store))[0]?.attempts === 1, 'first attempt stored', 10_000);
    await first.stop();
    return { clock, t0: clock.now(), path, restart: () => startDispatcher({ now: clock.now, oncall, database: first.tables.database }) };
  }

  it('resumes after a restart between attempts: the next attempt is on schedule, with the same svc-id', async () => {
    const { clock, t0, path, restart } = await firstAttemptThenStop(503);
    receiver.answer(200);
    const second = await restart();
    await settle();
    expect(requestsTo(path)).toHaveLength(1); // not due yet
    clock.set(t0 + MINUTE);
    await waitFor(() => requestsTo(path).length === 2, 'second attempt after the restart', 10_000);
    await waitFor(async () => (await deliveries(second.store))[0]?.status === 'delivered', 'delivered', 10_000);

    const [firstTry, secondTry] = requestsTo(path);
    expect(secondTry!.headers['svc-id']).toBe(firstTry!.headers['svc-id']);
    expect(secondTry!.rawBody).toBe(firstTry!.rawBody);
    expect(Number(secondTry!.headers['svc-timestamp'])).toBe(t0 + MINUTE);
    expect((await deliveries(second.store))[0]).toMatchObject({ status: 'delivered', attempts: 2 });
    await second.stop();
  });

  it('gives up without a request when the worker was down past the 15-minute budget', async () => {
    const { clock, t0, path, restart } = await firstAttemptThenStop(500);
    clock.set(t0 + 15 * MINUTE);
    const second = await restart();
    await waitFor(async () => (await deliveries(second.store))[0]?.status === 'failed', 'expired', 10_000);
    expect((await deliveries(second.store))[0]).toMatchObject({ status: 'failed', attempts: 1, lastOutcome: 'expired' });
    expect(requestsTo(path)).toHaveLength(1);
    await second.stop();
  });

  it('with two replicas on one storage, attempts each message once: by the replica that created it, or after it stopped by the other, one minute late', async () => {
    const clock = testClock();
    const t0 = clock.now();
    const path = `/oncall-${randomUUID()}`;
    receiver.answer((request) => (request.path === path ? 503 : 200));
    const oncall = { url: `${receiver.origin}${path}`, secret: ONCALL_SECRET };
    // Both read storage every 50 ms, so the second replica would attempt anything it considered due.
    const a = await startDispatcher({ now: clock.now, oncall, owner: 'replica-a', rescanIntervalMs: 50 });
    const b = await startDispatcher({ now: clock.now, oncall, owner: 'replica-b', rescanIntervalMs: 50, database: a.tables.database });
    a.dispatcher.notify(alert('m_replicas'));

    await waitFor(async () => (await deliveries(a.store))[0]?.attempts === 1, 'first attempt stored', 10_000);
    clock.set(t0 + MINUTE);
    await waitFor(async () => (await deliveries(a.store))[0]?.attempts === 2, 'second attempt stored', 10_000);
    await settle();
    expect(requestsTo(path)).toHaveLength(2); // not one per replica

    await a.stop(); // the owner is gone before the third attempt
    receiver.answer(200);
    clock.set(t0 + 5 * MINUTE + ADOPT_AFTER_MS - 1);
    await settle();
    expect(requestsTo(path)).toHaveLength(2); // not adopted before it is ADOPT_AFTER_MS overdue
    clock.set(t0 + 5 * MINUTE + ADOPT_AFTER_MS);
    await waitFor(async () => (await deliveries(b.store))[0]?.status === 'delivered', 'adopted and delivered', 10_000);

    const requests = requestsTo(path);
    expect(requests).toHaveLength(3);
    expect(new Set(requests.map((request) => request.headers['svc-id'])).size).toBe(1);
    expect(requests.map((request) => Number(request.headers['svc-timestamp']) - t0)).toEqual([0, MINUTE, 5 * MINUTE + ADOPT_AFTER_MS]);
    expect((await deliveries(b.store))[0]).toMatchObject({ status: 'delivered', attempts: 3, owner: 'replica-b' });
    await b.stop();
  });

  it('pauses an endpoint for an hour after 10 consecutive failures, across a restart, then resumes', async () => {
    const clock = testClock();
    const t0 = clock.now();
    const path = `/merchant-${randomUUID()}`;
    receiver.answer((request) => (request.path === path ? 500 : 200));
    const first = await startDispatcher({ now: clock.now, concurrency: 1 });
    await registerEndpoint(first.store, 'm_breaker', `${receiver.origin}${path}`, t0);
    for (let i = 0; i < 12; i++) first.dispatcher.notify(alert('m_breaker', i));
    await waitFor(async () => (await deliveries(first.store)).filter((d) => d.attempts === 1).length === 12, 'twelve first attempts', 20_000);
    expect(requestsTo(path)).toHaveLength(10);
    const skipped = (await deliveries(first.store)).filter((d) => d.lastOutcome === 'circuit_open');
    expect(skipped).toHaveLength(2);
    expect(skipped[0]!.lastError).toBe(`endpoint paused until ${new Date(t0 + 60 * MINUTE).toISOString()}`);
    expect((await first.metrics.webhookEndpointsPaused.get()).values[0]?.value).toBe(1);
    const database = first.tables.database;
    await first.stop();

    // Still paused after a restart: the retries of all twelve are skipped, and the messages fail.
    const second = await startDispatcher({ now: clock.now, concurrency: 1, database });
    clock.set(t0 + 5 * MINUTE);
    await waitFor(async () => (await deliveries(second.store)).filter((d) => d.status === 'failed').length === 12, 'all twelve failed', 20_000);
    expect(requestsTo(path)).toHaveLength(10);

    // After the hour, the next message goes through and closes the breaker.
    receiver.answer(200);
    clock.set(t0 + 61 * MINUTE);
    second.dispatcher.notify(alert('m_breaker', 99));
    await waitFor(() => requestsTo(path).length === 11, 'delivery after the pause', 10_000);
    await waitFor(async () => (await deliveries(second.store)).some((d) => d.status === 'delivered'), 'delivered', 10_000);
    expect((await second.metrics.webhookEndpointsPaused.get()).values[0]?.value).toBe(0);
    await second.stop();
  });

  it('delivers a burst of 1,000 critical alerts completely, to on-call and to the merchant that registered, with bounded memory', async () => {
    const path = `/burst-${randomUUID()}`;
    receiver.answer(200);
    const concurrency = 16;
    const h = await startDispatcher({ oncall: { url: `${receiver.origin}${path}/oncall`, secret: ONCALL_SECRET }, concurrency, maxUnsaved: 1_000 });
    const merchants = Array.from({ length: 5 }, (_, i) => `m_burst_${i}`);
    await registerEndpoint(h.store, merchants[0]!, `${receiver.origin}${path}/${merchants[0]}`, Date.now()); // the others have none
    const alerts = Array.from({ length: 1_000 }, (_, i) => alert(merchants[i % merchants.length]!, i));
    for (const a of alerts) h.dispatcher.notify(a);
    const got = () => receiver.received.filter((request) => request.path.startsWith(path));
    let maxBusy = 0;
    await waitFor(
      () => {
        maxBusy = Math.max(maxBusy, h.dispatcher.stats().busy);
        return new Set(got().map((request) => request.headers['svc-id'])).size >= 1_200;
      },
      'twelve hundred deliveries',
      180_000,
    );
    const alertIdsAt = (suffix: string) => new Set(got().filter((r) => r.path.endsWith(suffix)).map((r) => JSON.parse(r.rawBody).alertId));
    expect(alertIdsAt('/oncall').size).toBe(1_000);
    expect(alertIdsAt(`/${merchants[0]}`).size).toBe(200);
    expect(got().filter((r) => !r.path.endsWith('/oncall') && !r.path.endsWith(`/${merchants[0]}`))).toHaveLength(0);
    // At most `concurrency` attempts in flight, and twice that many messages held in memory.
    expect(h.dispatcher.stats().maxSending).toBeLessThanOrEqual(concurrency);
    expect(h.dispatcher.stats().maxBusy).toBeLessThanOrEqual(2 * concurrency);
    expect(maxBusy).toBeLessThanOrEqual(2 * concurrency);
    expect(h.dispatcher.stats().maxUnsaved).toBeLessThanOrEqual(1_000);
    expect((await h.metrics.webhookNotificationsDropped.get()).values[0]?.value ?? 0).toBe(0);
    await waitFor(async () => (await deliveries(h.store)).filter((d) => d.status === 'delivered').length === 1_200, 'all stored as delivered', 30_000);
    await h.stop();
  }, 240_000);
});
