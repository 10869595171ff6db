/**
 * Webhook delivery on the real ClickHouse engine and real HTTPS receivers on loopback (a test CA
 * made at test time), with an injected clock so the 1- and 5-minute steps, the 15-minute budget and
 * the breaker's hour take no real time: the schedule, every kind of failure, the breaker, a restart
 * between attempts, replicas sharing storage, a storage write whose answer is lost, and a burst of
 * 1,000 critical alerts with bounded memory. Each test has a database of its own.
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
import { ADOPT_AFTER_MS, BREAKER_REFRESH_MS, WebhookDispatcher, type WebhookDispatcherOptions } from '../../src/webhooks/dispatcher.ts';
import { SecretBox } from '../../src/webhooks/secret-box.ts';
import { targetPolicy } from '../../src/webhooks/target-policy.ts';
import { verifyWebhook } from '../../src/webhooks/verify.ts';
import { useEngines } from '../support/engines.ts';
import { makeTestCertificates, startReceiver, type Answer, type Receiver, type TestCertificates } from '../support/https-receiver.ts';
import { freePort } from '../support/ports.ts';
import { waitFor } from '../support/worker.ts';

const MINUTE = 60_000;
const ONCALL_SECRET = 'oncall-secret-0123456789abcdefghijklmnop';
const logger = createLogger(process.env.TEST_LOG_LEVEL ?? 'silent');

interface LogLine {
  level: number;
  msg: string;
  [field: string]: unknown;
}

/** A logger that keeps what it writes at `level` and above, for a test to read. */
function capturedLog(level: string) {
  const lines: LogLine[] = [];
  return { logger: createLogger(level, { write: (line: string) => void lines.push(JSON.parse(line)) }), lines };
}
const STILL = ' (still; logged at most once a minute)';

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

  interface HarnessOptions extends Partial<WebhookDispatcherOptions> {
    database?: string;
    secrets?: SecretBox;
    /** Wraps the store's connection, to inject faults. */
    wrap?: (db: ClickHouse, tables: Tables) => ClickHouse;
    /** Leaves the dispatcher unstarted: it stores notifications but attempts nothing. */
    noStart?: boolean;
  }

  /** Connects to a database (new unless named), migrates it, and starts a dispatcher on it. */
  async function startDispatcher(options: HarnessOptions = {}): Promise<Harness> {
    const { clickhouse } = engines;
    const tables = tablesIn(options.database ?? `${clickhouse.database}_${++databases}`);
    const db = connectClickHouse({ url: clickhouse.url, username: clickhouse.username, password: clickhouse.password, dataDir: clickhouse.dataDir });
    await migrate(db, { tables, eventsTtlDays: 30 }, logger);
    const store = new WebhookStore(options.wrap ? options.wrap(db, tables) : db, tables, options.secrets);
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
    if (!options.noStart) await dispatcher.start();
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
    await store.putEndpoint({ merchantId, endpointId: randomUUID(), url, secret, createdBy: 'test', updatedBy: 'test', createdAt, updatedAt: now });
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
    const log = capturedLog('info');
    const h = await startDispatcher({ now: clock.now, requestTimeoutMs: 300, connectTimeoutMs: 300, logger: log.logger });
    const refusedPort = await freePort();
    try {
      await registerEndpoint(h.store, 'm_timeout', `${hanging.origin}/hook`, t0);
      await registerEndpoint(h.store, 'm_refused', `https://127.0.0.1:${refusedPort}/hook`, t0);
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

      // Each endpoint's failure is logged when it starts, with its cause, host and next attempt; then
      // once a minute at most (here each attempt, a minute or more apart); its end once.
      const logOf = (merchantId: string) =>
        log.lines.filter((line) => line.merchantId === merchantId).map(({ level, msg, host, outcome, error, nextAttemptAt, occurrences, failures }) => ({ level, msg, host, outcome, error, nextAttemptAt, occurrences, failures }));
      const failure = (host: string, outcome: string, error: unknown) => ({ level: 40, msg: 'webhook attempt failed', host, outcome, error, nextAttemptAt: new Date(t0 + MINUTE).toISOString(), occurrences: 1 });
      const still = (host: string, outcome: string, error: unknown, nextAttemptAt?: number) =>
        ({ level: 40, msg: `webhook attempt failed${STILL}`, host, outcome, error, nextAttemptAt: nextAttemptAt && new Date(nextAttemptAt).toISOString(), occurrences: 1 });
      const hangingHost = new URL(hanging.origin).host;
      expect(logOf('m_timeout')).toEqual([
        failure(hangingHost, 'timeout', expect.stringMatching(/\S/)),
        still(hangingHost, 'timeout', expect.stringMatching(/\S/), t0 + 5 * MINUTE),
        { level: 30, msg: 'webhook endpoint delivers again', host: hangingHost, failures: 2 },
      ]);
      const refused = expect.stringContaining('ECONNREFUSED');
      const refusedHost = `127.0.0.1:${refusedPort}`;
      // A message given up is said once whatever the endpoint's lines, with its alert.
      const givenUp = (host: string, outcome: string, error: unknown) => ({ level: 40, msg: 'webhook message given up: not delivered within 15 minutes of attempts', host, outcome, error, nextAttemptAt: undefined, occurrences: undefined, failures: undefined });
      expect(logOf('m_refused')).toEqual([
        failure(refusedHost, 'connect_error', refused),
        still(refusedHost, 'connect_error', refused, t0 + 5 * MINUTE),
        still(refusedHost, 'connect_error', refused),
        givenUp(refusedHost, 'connect_error', refused),
      ]);
      const untrustedHost = new URL(untrusted.origin).host;
      const untrustedCa = expect.stringMatching(/certificate/i);
      expect(logOf('m_tls')).toEqual([
        failure(untrustedHost, 'tls_error', untrustedCa),
        still(untrustedHost, 'tls_error', untrustedCa, t0 + 5 * MINUTE),
        still(untrustedHost, 'tls_error', untrustedCa),
        givenUp(untrustedHost, 'tls_error', untrustedCa),
      ]);
      expect(log.lines.filter((line) => line.msg.startsWith('webhook message given up')).map((line) => line.alertId)).toHaveLength(2);
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
    expect(await h.store.removeEndpoint('m_leaves', t0 + 1, 'test')).toEqual({ cancelledMessages: 1 });
    expect((await deliveries(h.store, 'm_leaves'))[0]).toMatchObject({ status: 'cancelled', lastOutcome: 'cancelled', lastError: 'the merchant endpoint was removed', updatedAt: t0 + 1 });
    // Removed while an attempt was in flight, whose retry is recorded after the removal, then
    // registered again before that retry: the removal still cancels it (a registration within a few
    // seconds of the message might be the replicas' clocks apart).
    const [inFlight] = (await h.store.pendingMessages(10, [], { owner: 'test', adoptAfterMs: 0 })).filter((message) => message.merchantId === 'm_returns');
    expect(await h.store.removeEndpoint('m_returns', t0 + 1, 'test')).toEqual({ cancelledMessages: 1 });
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
    // (Back after 5 minutes, the second attempts are late: the third come the 4-minute step later.)
    const second = await startDispatcher({ now: clock.now, concurrency: 1, database });
    clock.set(t0 + 5 * MINUTE);
    await waitFor(async () => (await deliveries(second.store)).filter((d) => d.attempts === 2).length === 12, 'all twelve skipped', 20_000);
    clock.set(t0 + 9 * MINUTE);
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

  it('logs a failing endpoint once a minute, its pause once (on-call\'s as an error), its closing once, and the attempts skipped meanwhile at debug only', async () => {
    const clock = testClock();
    const t0 = clock.now();
    const path = `/paused-${randomUUID()}`;
    let answer: Answer = 500;
    receiver.answer((request) => (request.path.startsWith(path) ? answer : 200));
    const log = capturedLog('debug');
    // Tokens in the URLs' paths and queries, which no line may show: only the endpoint's host.
    const oncall = { url: `${receiver.origin}${path}/oncall/PATHTOKEN1234?token=QUERYTOKEN1234`, secret: ONCALL_SECRET };
    const h = await startDispatcher({ now: clock.now, oncall, logger: log.logger });
    const attempted = async (attempts: number) => (await deliveries(h.store)).filter((d) => d.attempts === attempts).length === 10;
    try {
      await registerEndpoint(h.store, 'm_paused', `${receiver.origin}${path}/merchant?key=MERCHANTTOKEN1234`, t0);
      for (let i = 0; i < 5; i++) h.dispatcher.notify(alert('m_paused', i)); // five messages to each endpoint
      await waitFor(() => attempted(1), 'ten failed first attempts', 20_000);
      clock.set(t0 + MINUTE);
      await waitFor(() => attempted(2), 'ten failed second attempts: each endpoint paused at its tenth failure', 20_000);
      clock.set(t0 + 5 * MINUTE);
      await waitFor(() => attempted(3), 'ten third attempts, skipped', 20_000);
      expect(receiver.received.filter((request) => request.path.startsWith(path))).toHaveLength(20);
      answer = 200;
      clock.set(t0 + 62 * MINUTE);
      h.dispatcher.notify(alert('m_paused', 99));
      await waitFor(async () => (await deliveries(h.store)).filter((d) => d.status === 'delivered').length === 2, 'delivered to both after the hour', 10_000);
    } finally {
      await h.stop();
    }
    const host = new URL(receiver.origin).host;
    const pausedUntil = new Date(t0 + MINUTE + 60 * MINUTE).toISOString();
    const logged = (destination: string) =>
      log.lines
        .filter((line) => line.destination === destination && line.level >= 30)
        .map(({ level, msg, merchantId, host, statusCode, error, nextAttemptAt, occurrences, consecutiveFailures, lastError, pausedUntil }) =>
          ({ level, msg, merchantId, host, statusCode, error, nextAttemptAt, occurrences, consecutiveFailures, lastError, pausedUntil }));
    const failure = { msg: 'webhook attempt failed', level: 40, host, statusCode: 500, error: 'HTTP 500', nextAttemptAt: new Date(t0 + MINUTE).toISOString(), occurrences: 1 };
    const still = { ...failure, msg: `webhook attempt failed${STILL}`, nextAttemptAt: new Date(t0 + 5 * MINUTE).toISOString(), occurrences: 5 };
    const paused = { host, consecutiveFailures: 10, lastError: 'HTTP 500', pausedUntil };
    const closed = { level: 30, msg: 'webhook endpoint delivers again: its breaker closed', host };
    // The third attempts, skipped at 5 minutes, come after the last scheduled one: each message is given up, and said so once.
    const givenUp = { level: 40, msg: 'webhook message given up: not delivered within 15 minutes of attempts', host, error: expect.stringMatching(/^endpoint paused until /) };
    // 20 failed attempts and 10 skipped ones: 3 lines per endpoint, one per message given up, and one when it delivers again.
    expect(logged('oncall')).toEqual([
      failure,
      still,
      { ...paused, level: 50, msg: 'on-call webhook endpoint paused for an hour after failed attempts: critical alerts do not page on-call until pausedUntil' },
      ...Array.from({ length: 5 }, () => givenUp),
      closed,
    ]);
    const merchant = { merchantId: 'm_paused' };
    expect(logged('merchant')).toEqual([
      { ...failure, ...merchant },
      { ...still, ...merchant },
      { ...paused, ...merchant, level: 40, msg: "merchant's webhook endpoint paused for an hour after failed attempts: its critical alerts are not delivered until pausedUntil" },
      ...Array.from({ length: 5 }, () => ({ ...givenUp, ...merchant })),
      { ...closed, ...merchant },
    ]);
    // The attempts skipped while paused (5 to each endpoint, at 5 minutes) are at debug, with the endpoint.
    const skipped = log.lines.filter((line) => line.msg === 'webhook attempt skipped: its endpoint is paused');
    expect(skipped.map((line) => [line.level, line.destination, line.host, line.outcome])).toEqual(Array.from({ length: 10 }, () => [20, expect.any(String), host, 'circuit_open']));
    const text = JSON.stringify(log.lines);
    for (const token of ['PATHTOKEN1234', 'QUERYTOKEN1234', 'MERCHANTTOKEN1234', ONCALL_SECRET]) expect(text).not.toContain(token);
  });

  it('retries a storage write whose answer was lost (the rows landed) as the same message: one svc-id, and the attempt made meanwhile stands', async () => {
    const path = `/oncall-lost-answer-${randomUUID()}`;
    receiver.answer(200);
    let newMessageWrites = 0;
    let h: Harness | undefined;
    // The first write of the new message lands, then its answer is lost (a client timeout, a reset
    // connection) only after a rescan found the stored message and delivered it.
    const wrap = (db: ClickHouse, tables: Tables): ClickHouse => ({
      ...db,
      async insert(table, columns, body, format, settings, signal) {
        await db.insert(table, columns, body, format, settings, signal);
        if (table !== tables.webhookMessages || !Buffer.concat(body instanceof Uint8Array ? [body] : body).toString('utf8').includes('"attempts":0')) return;
        if (++newMessageWrites > 1) return;
        await waitFor(async () => (await deliveries(h!.store))[0]?.status === 'delivered', 'delivered before the write answers', 10_000);
        throw new Error('Timeout error.');
      },
    });
    h = await startDispatcher({ wrap, oncall: { url: `${receiver.origin}${path}`, secret: ONCALL_SECRET }, rescanIntervalMs: 50 });
    try {
      h.dispatcher.notify(alert('m_lost_answer'));
      await waitFor(() => newMessageWrites === 2 && h.dispatcher.stats().unsaved === 0, 'the write retried', 10_000);
      await settle(500); // rescans every 50 ms: a message made pending again would be sent again
      const stored = await deliveries(h.store);
      expect(stored.map((d) => [d.status, d.attempts])).toEqual([['delivered', 1]]);
      expect(requestsTo(path).map((request) => request.headers['svc-id'])).toEqual([stored[0]!.id]);
    } finally {
      await h.stop();
    }
  });

  it('does not adopt the messages of a live owner whose attempts queue up behind a slow endpoint', async () => {
    // In real time, scaled down: attempts time out after 1 s and adoption waits 3 s. The owner
    // attempts one message at a time, so its last first attempt starts about 5 s late.
    const path = `/oncall-slow-${randomUUID()}`;
    receiver.answer((request) => (request.path === path ? 'hang' : 200));
    const oncall = { url: `${receiver.origin}${path}`, secret: ONCALL_SECRET };
    const timing = { requestTimeoutMs: 1_000, connectTimeoutMs: 1_000, adoptAfterMs: 3_000, rescanIntervalMs: 50 };
    const a = await startDispatcher({ ...timing, oncall, owner: 'replica-a', concurrency: 1 });
    const b = await startDispatcher({ ...timing, oncall, owner: 'replica-b', concurrency: 8, database: a.tables.database });
    try {
      for (let i = 0; i < 6; i++) a.dispatcher.notify(alert('m_backlog', i));
      await waitFor(async () => {
        const all = await deliveries(a.store);
        return all.length === 6 && all.every((d) => d.attempts >= 1);
      }, 'every first attempt recorded', 30_000);
      await settle(1_500); // an attempt by the other replica would be answered (timed out) by now
      const sends = new Map<string, number>();
      for (const request of requestsTo(path)) sends.set(String(request.headers['svc-id']), (sends.get(String(request.headers['svc-id'])) ?? 0) + 1);
      const owners = (await deliveries(a.store)).map((d) => d.owner);
      expect({ messages: sends.size, sentTwice: [...sends.values()].filter((count) => count > 1).length, owners: new Set(owners) }).toEqual({
        messages: 6,
        sentTwice: 0,
        owners: new Set(['replica-a']),
      });
    } finally {
      await a.stop();
      await b.stop();
    }
  }, 60_000);

  /** A connection whose storage calls fail while `fault.down` (only heartbeats with `fault.heartbeatsOnly`). */
  function faulty(fault: { down: boolean; heartbeatsOnly?: boolean }) {
    return (db: ClickHouse, tables: Tables): ClickHouse => {
      const fail = (table?: string) => {
        if (fault.down && (!fault.heartbeatsOnly || table === tables.webhookReplicas)) throw new Error('ECONNREFUSED (storage outage)');
      };
      return {
        ...db,
        async insert(...args: Parameters<ClickHouse['insert']>) {
          fail(args[0]);
          return db.insert(...args);
        },
        async queryRows(...args: Parameters<ClickHouse['queryRows']>) {
          if (!fault.heartbeatsOnly) fail();
          return db.queryRows(...args);
        },
      } as ClickHouse;
    };
  }

  /** Sends per svc-id on one path. */
  const sendsPerMessage = (path: string) => {
    const sends = new Map<string, number>();
    for (const request of requestsTo(path)) sends.set(String(request.headers['svc-id']), (sends.get(String(request.headers['svc-id'])) ?? 0) + 1);
    return [...sends.values()];
  };

  it('an owner restarted with the same WORKER_ID while another replica makes the attempt it adopted does not make that attempt too', async () => {
    const clock = testClock();
    const t0 = clock.now();
    const path = `/oncall-owner-back-${randomUUID()}`;
    let answer: Answer = 503;
    receiver.answer((request) => (request.path === path ? answer : 200));
    const oncall = { url: `${receiver.origin}${path}`, secret: ONCALL_SECRET };
    const a = await startDispatcher({ now: clock.now, oncall, owner: 'replica-a' });
    a.dispatcher.notify(alert('m_owner_back'));
    await waitFor(async () => (await deliveries(a.store))[0]?.attempts === 1, 'first attempt stored', 10_000);
    await a.stop(); // down for more than a minute (a deploy, a crash loop)

    answer = 'hang'; // the receiver is slow to answer the adopted attempt
    const timing = { requestTimeoutMs: 2_000, connectTimeoutMs: 2_000, rescanIntervalMs: 50 };
    const b = await startDispatcher({ now: clock.now, oncall, owner: 'replica-b', database: a.tables.database, ...timing });
    clock.set(t0 + MINUTE + ADOPT_AFTER_MS);
    await waitFor(() => requestsTo(path).length === 2, 'the adopted second attempt sent', 10_000);
    const back = await startDispatcher({ now: clock.now, oncall, owner: 'replica-a', database: a.tables.database, ...timing });
    try {
      // B's attempt times out, and its outcome is stored; the owner, back meanwhile, sent nothing.
      await waitFor(async () => (await deliveries(b.store))[0]?.attempts === 2, 'the adopted attempt stored', 10_000);
      await settle(500);
      expect(sendsPerMessage(path)).toEqual([2]);
      expect((await deliveries(b.store))[0]).toMatchObject({ status: 'pending', attempts: 2, owner: 'replica-b', lastOutcome: 'timeout' });
    } finally {
      await back.stop();
      await b.stop();
    }
  }, 60_000);

  it.each([
    // Storage answers A again while B's adopted attempt is in flight: A must not send it too.
    ['a live owner whose storage was unreachable for two minutes (its heartbeats failed)', { down: false }, 'in flight'],
    // A could have sent its due attempt all along: it must not, as long as it looks gone to others.
    ['an owner that could not store its heartbeats for two minutes, while its reads and other writes succeeded', { down: false, heartbeatsOnly: true }, 'stored'],
  ] as const)('%s does not make the attempt another replica adopted meanwhile', async (_case, faultMode, restoreOnce) => {
    const fault: { down: boolean; heartbeatsOnly?: boolean } = { ...faultMode };
    const clock = testClock();
    const t0 = clock.now();
    const path = `/oncall-outage-owner-${randomUUID()}`;
    let answer: Answer = 503;
    receiver.answer((request) => (request.path === path ? answer : 200));
    const oncall = { url: `${receiver.origin}${path}`, secret: ONCALL_SECRET };
    const timing = { requestTimeoutMs: 2_000, connectTimeoutMs: 2_000, rescanIntervalMs: 50 };
    const a = await startDispatcher({ now: clock.now, oncall, owner: 'replica-a', wrap: faulty(fault), ...timing });
    const b = await startDispatcher({ now: clock.now, oncall, owner: 'replica-b', database: a.tables.database, ...timing });
    try {
      a.dispatcher.notify(alert('m_outage_owner'));
      await waitFor(async () => (await deliveries(a.store))[0]?.attempts === 1, 'first attempt stored', 10_000);
      fault.down = true; // to B, A looks gone; A's second attempt falls due meanwhile
      answer = 'hang';
      clock.set(t0 + 2 * MINUTE);
      await waitFor(() => requestsTo(path).length === 2, 'the second attempt sent', 10_000);
      if (restoreOnce === 'in flight') fault.down = false;
      await waitFor(async () => (await deliveries(b.store))[0]?.attempts === 2, 'the second attempt stored', 10_000);
      await settle(500);
      fault.down = false;
      expect(sendsPerMessage(path)).toEqual([2]);
      expect((await deliveries(b.store))[0]).toMatchObject({ attempts: 2, owner: 'replica-b' });
      await waitFor(() => a.dispatcher.up, 'A up again', 5_000);
    } finally {
      await a.stop();
      await b.stop();
    }
  }, 60_000);

  /**
   * Replica A makes the first attempt of an on-call message and stops; replica B, a minute later,
   * reads it as due and adopts the second. Between that read and B's claim, A comes back (same
   * WORKER_ID) and sends the second attempt itself, answered with `answer`; then `beforeClaim` runs.
   */
  async function ownerBackBeforeClaim(answer: Answer, beforeClaim: (owner: Harness) => Promise<void>) {
    const clock = testClock();
    const t0 = clock.now();
    const adoptAt = t0 + MINUTE + ADOPT_AFTER_MS;
    const path = `/oncall-before-claim-${randomUUID()}`;
    let answering: Answer = 503;
    receiver.answer((request) => (request.path === path ? answering : 200));
    const oncall = { url: `${receiver.origin}${path}`, secret: ONCALL_SECRET };
    const timing = { requestTimeoutMs: 2_000, connectTimeoutMs: 2_000, rescanIntervalMs: 50 };
    const a = await startDispatcher({ now: clock.now, oncall, owner: 'replica-a', ...timing });
    a.dispatcher.notify(alert('m_before_claim'));
    await waitFor(async () => (await deliveries(a.store))[0]?.attempts === 1, 'first attempt stored', 10_000);
    await a.stop();
    answering = answer;
    let a2: Harness | undefined;
    let adopterReads = 0;
    let claimChecks = 0;
    const wrap = (db: ClickHouse): ClickHouse => ({
      ...db,
      async queryRows<T>(...args: Parameters<ClickHouse['queryRows']>) {
        const startedAt = clock.now(); // B's clock as it reads, so whether the message is due to it
        const rows = await db.queryRows<T>(...args);
        if (args[0].includes('CROSS JOIN')) claimChecks++; // B reads its claim back
        // B's first read of due messages made once the message is a minute overdue with A silent.
        if (args[0].includes('AS due_at') && startedAt >= adoptAt && rows.length > 0 && adopterReads++ === 0) {
          a2 = await startDispatcher({ now: clock.now, oncall, owner: 'replica-a', database: a.tables.database, ...timing });
          await waitFor(() => requestsTo(path).length === 2, 'the owner, back, sent the second attempt', 10_000);
          await beforeClaim(a2);
        }
        return rows;
      },
    } as ClickHouse);
    const b = await startDispatcher({ now: clock.now, oncall, owner: 'replica-b', database: a.tables.database, wrap, ...timing });
    clock.set(adoptAt);
    await waitFor(() => claimChecks > 0, 'B read its claim back', 20_000);
    return { clock, path, b, a2: a2!, stop: async () => (await a2?.stop(), await b.stop()) };
  }

  it('an adopter whose claim lands after the owner came back and read the message does not send it: the owner does', async () => {
    const { path, b, a2, stop } = await ownerBackBeforeClaim('hang', async () => undefined);
    try {
      // B found the owner alive and sent nothing; the owner's attempt times out and is stored.
      await waitFor(async () => (await deliveries(b.store))[0]?.attempts === 2, 'the owner\'s attempt stored', 10_000);
      await settle(500);
      expect(sendsPerMessage(path)).toEqual([2]);
      expect((await deliveries(a2.store))[0]).toMatchObject({ attempts: 2, owner: 'replica-a', lastOutcome: 'timeout' });
    } finally {
      await stop();
    }
  }, 60_000);

  it('an adopter\'s claim made from a read that the owner\'s stored outcome has since overtaken loses to that outcome, whatever comes after', async () => {
    const { clock, path, b, stop } = await ownerBackBeforeClaim(200, async (owner) => {
      await waitFor(async () => (await deliveries(owner.store))[0]?.status === 'delivered', 'the owner\'s delivery stored', 10_000);
    });
    try {
      clock.advance(10 * MINUTE); // past any lease the claim could have taken
      await settle(1_000);
      expect(sendsPerMessage(path)).toEqual([2]);
      expect((await deliveries(b.store))[0]).toMatchObject({ status: 'delivered', attempts: 2, owner: 'replica-a' });
    } finally {
      await stop();
    }
  }, 60_000);

  it('makes the first attempt of a critical alert stored only after a storage outage longer than the 15-minute budget (no retry after it)', async () => {
    const clock = testClock();
    const t0 = clock.now();
    const path = `/late-store-${randomUUID()}`;
    receiver.answer((request) => (request.path === `${path}/merchant` ? 503 : 200));
    const fault = { down: false };
    const h = await startDispatcher({ now: clock.now, oncall: { url: `${receiver.origin}${path}/oncall`, secret: ONCALL_SECRET }, wrap: faulty(fault), rescanIntervalMs: 50 });
    try {
      await registerEndpoint(h.store, 'm_late_store', `${receiver.origin}${path}/merchant`, t0);
      fault.down = true;
      h.dispatcher.notify(alert('m_late_store'));
      await settle(500);
      clock.set(t0 + 16 * MINUTE); // storage is back 16 minutes later
      fault.down = false;
      await waitFor(async () => {
        const all = await deliveries(h.store);
        return all.length === 2 && all.every((d) => d.status !== 'pending');
      }, 'both messages final', 15_000);
      const byDestination = Object.fromEntries((await deliveries(h.store)).map((d) => [d.destination, d]));
      expect(byDestination.oncall).toMatchObject({ status: 'delivered', attempts: 1, lastOutcome: 'delivered', createdAt: t0 });
      // The merchant's endpoint failed that late first attempt: a retry would start past the budget.
      expect(byDestination.merchant).toMatchObject({ status: 'failed', attempts: 1, lastOutcome: 'http_error' });
      clock.advance(5 * MINUTE);
      await settle();
      expect(receiver.received.filter((request) => request.path.startsWith(path)).map((request) => request.path).sort()).toEqual([`${path}/merchant`, `${path}/oncall`]);
      // The body still says when the alert was raised.
      expect(JSON.parse(requestsTo(`${path}/oncall`)[0]!.rawBody).timestamp).toBe(new Date(t0).toISOString());
    } finally {
      await h.stop();
    }
  }, 60_000);

  it('makes the first attempt of a message stored before the worker went down past the budget, not expiring it unsent', async () => {
    const clock = testClock();
    const t0 = clock.now();
    const path = `/oncall-never-tried-${randomUUID()}`;
    receiver.answer(200);
    const oncall = { url: `${receiver.origin}${path}`, secret: ONCALL_SECRET };
    const first = await startDispatcher({ now: clock.now, oncall, noStart: true });
    first.dispatcher.notify(alert('m_never_tried'));
    await waitFor(async () => (await deliveries(first.store)).length === 1, 'message stored', 10_000);
    await first.stop(); // down before its first attempt, for 20 minutes
    clock.set(t0 + 20 * MINUTE);
    const second = await startDispatcher({ now: clock.now, oncall, database: first.tables.database });
    try {
      await waitFor(async () => (await deliveries(second.store))[0]?.status === 'delivered', 'delivered late', 10_000);
      expect(requestsTo(path)).toHaveLength(1);
    } finally {
      await second.stop();
    }
  });

  it('makes the attempt after a late one (adopted from a replica that died before it) a schedule step later, not at once', async () => {
    const clock = testClock();
    const t0 = clock.now();
    const path = `/oncall-late-${randomUUID()}`;
    receiver.answer((request) => (request.path === path ? 503 : 200));
    const oncall = { url: `${receiver.origin}${path}`, secret: ONCALL_SECRET };
    const a = await startDispatcher({ now: clock.now, oncall, owner: 'replica-a', noStart: true });
    a.dispatcher.notify(alert('m_late'));
    await waitFor(async () => (await deliveries(a.store)).length === 1, 'message stored', 10_000);
    await a.stop(); // died before its first attempt
    const b = await startDispatcher({ now: clock.now, oncall, owner: 'replica-b', rescanIntervalMs: 50, database: a.tables.database });
    try {
      clock.set(t0 + ADOPT_AFTER_MS);
      await waitFor(async () => (await deliveries(b.store))[0]?.attempts === 1, 'adopted first attempt', 10_000);
      await settle();
      expect(requestsTo(path)).toHaveLength(1);
      expect((await deliveries(b.store))[0]!.nextAttemptAt - t0).toBe(ADOPT_AFTER_MS + MINUTE);
      clock.set(t0 + ADOPT_AFTER_MS + MINUTE);
      await waitFor(async () => (await deliveries(b.store))[0]?.attempts === 2, 'second attempt', 10_000);
      expect((await deliveries(b.store))[0]!.nextAttemptAt - t0).toBe(ADOPT_AFTER_MS + MINUTE + 4 * MINUTE); // the 1-to-5-minute step
      clock.set(t0 + ADOPT_AFTER_MS + 5 * MINUTE);
      await waitFor(async () => (await deliveries(b.store))[0]?.status === 'failed', 'third attempt, the last', 10_000);
      const stamps = requestsTo(path).map((request) => Number(request.headers['svc-timestamp']) - t0);
      expect(stamps).toEqual([ADOPT_AFTER_MS, ADOPT_AFTER_MS + MINUTE, ADOPT_AFTER_MS + 5 * MINUTE]);
    } finally {
      await b.stop();
    }
  });

  it('shares a breaker between replicas: another replica\'s failure does not write over a pause, and its next read of the breakers honours it', async () => {
    const clock = testClock();
    const t0 = clock.now();
    const path = `/merchant-shared-breaker-${randomUUID()}`;
    receiver.answer((request) => (request.path === path ? 500 : 200));
    // Both replicas run, and have read the breakers, before the endpoint starts failing.
    const a = await startDispatcher({ now: clock.now, owner: 'replica-a', concurrency: 1 });
    const b = await startDispatcher({ now: clock.now, owner: 'replica-b', concurrency: 1, database: a.tables.database });
    const firstAttempts = async () => (await deliveries(a.store)).filter((d) => d.attempts === 1);
    try {
      await registerEndpoint(a.store, 'm_shared_down', `${receiver.origin}${path}`, t0);
      for (let i = 0; i < 10; i++) a.dispatcher.notify(alert('m_shared_down', i));
      await waitFor(async () => (await firstAttempts()).length === 10, 'ten failed first attempts', 20_000);
      expect(await a.store.loadBreakers()).toMatchObject([{ consecutiveFailures: 10, pausedUntil: t0 + 60 * MINUTE }]);

      // B has not read the breakers since: it still sends, and its one failure leaves the pause stored.
      b.dispatcher.notify(alert('m_shared_down', 10));
      await waitFor(async () => (await firstAttempts()).length === 11, 'B\'s attempt recorded', 10_000);
      expect(requestsTo(path)).toHaveLength(11);
      expect(await a.store.loadBreakers()).toMatchObject([{ pausedUntil: t0 + 60 * MINUTE }]);

      // Once its breakers are BREAKER_REFRESH_MS old, B reads them again: the endpoint is paused there too.
      clock.advance(BREAKER_REFRESH_MS);
      b.dispatcher.notify(alert('m_shared_down', 11));
      await waitFor(async () => (await firstAttempts()).length === 12, 'B\'s second attempt recorded', 10_000);
      await settle();
      expect(requestsTo(path)).toHaveLength(11);
      const [last] = (await deliveries(b.store)).filter((d) => d.owner === 'replica-b' && d.createdAt === t0 + BREAKER_REFRESH_MS);
      expect(last).toMatchObject({ lastOutcome: 'circuit_open', lastError: `endpoint paused until ${new Date(t0 + 60 * MINUTE).toISOString()}` });
    } finally {
      await a.stop();
      await b.stop();
    }
  });

  it('counts attempts in flight toward the breaker: a burst sends 10 to a failing endpoint, and after the hour one probe decides', async () => {
    const clock = testClock();
    const t0 = clock.now();
    const path = `/merchant-burst-breaker-${randomUUID()}`;
    receiver.answer((request) => (request.path === path ? 500 : 200));
    const h = await startDispatcher({ now: clock.now, noStart: true }); // default concurrency (16)
    const outcomesSince = async (at: number) => (await deliveries(h.store)).filter((d) => d.createdAt >= at && d.attempts === 1).map((d) => d.lastOutcome);
    try {
      await registerEndpoint(h.store, 'm_burst_down', `${receiver.origin}${path}`, t0);
      for (let i = 0; i < 20; i++) h.dispatcher.notify(alert('m_burst_down', i));
      await waitFor(async () => (await deliveries(h.store)).length === 20, 'the burst stored', 10_000);
      await h.dispatcher.start(); // all twenty due at once
      await waitFor(async () => (await outcomesSince(t0)).length === 20, 'twenty first attempts', 20_000);
      const burst = await outcomesSince(t0);
      expect({ requests: requestsTo(path).length, skipped: burst.filter((o) => o === 'circuit_open').length }).toEqual({ requests: 10, skipped: 10 });

      // After the hour, five alerts at once: one probe fails and pauses the endpoint again, the rest are skipped.
      const after = t0 + 61 * MINUTE;
      clock.set(after);
      for (let i = 0; i < 5; i++) h.dispatcher.notify(alert('m_burst_down', 100 + i));
      await waitFor(async () => (await outcomesSince(after)).length === 5, 'five first attempts after the hour', 20_000);
      const probe = await outcomesSince(after);
      expect({ requests: requestsTo(path).length - 10, skipped: probe.filter((o) => o === 'circuit_open').length }).toEqual({ requests: 1, skipped: 4 });
    } finally {
      await h.stop();
    }
  });

  it('keeps the messages over an endpoint\'s limit of attempts in flight queued, and attempts other endpoints\' meanwhile', async () => {
    const clock = testClock();
    const t0 = clock.now();
    const path = `/merchant-open-${randomUUID()}`;
    receiver.answer(200);
    const hanging = await startReceiver(certs.server, { answer: 'hang' });
    const h = await startDispatcher({ now: clock.now, noStart: true, requestTimeoutMs: 60_000 }); // default concurrency (16)
    try {
      await registerEndpoint(h.store, 'm_slow', `${hanging.origin}/hook`, t0);
      await registerEndpoint(h.store, 'm_open', `${receiver.origin}${path}`, t0);
      for (let i = 0; i < 20; i++) h.dispatcher.notify(alert('m_slow', i));
      clock.advance(1); // made after the twenty: read after them
      h.dispatcher.notify(alert('m_open'));
      await waitFor(async () => (await deliveries(h.store)).length === 21, 'all stored', 10_000);
      await h.dispatcher.start();
      await waitFor(async () => (await deliveries(h.store, 'm_open'))[0]?.status === 'delivered', 'the other merchant delivered while the slow endpoint hangs', 10_000);
      // A merchant's endpoint has a quarter of the slots at most.
      expect(hanging.received).toHaveLength(4);
      const slow = await deliveries(h.store, 'm_slow');
      expect(slow.every((d) => d.status === 'pending' && d.attempts === 0)).toBe(true); // queued, not skipped
    } finally {
      await h.stop();
      await hanging.close();
    }
  });

  it('keeps a quarter of the slots for on-call: merchants\' endpoints that hang hold the rest, and pages still go out', async () => {
    const path = `/oncall-reserved-${randomUUID()}`;
    receiver.answer(200);
    const hanging = await startReceiver(certs.server, { answer: 'hang' });
    const h = await startDispatcher({ oncall: { url: `${receiver.origin}${path}`, secret: ONCALL_SECRET }, requestTimeoutMs: 60_000 }); // default concurrency (16)
    try {
      const merchants = ['m_hang_1', 'm_hang_2', 'm_hang_3', 'm_hang_4'];
      for (const merchantId of merchants) await registerEndpoint(h.store, merchantId, `${hanging.origin}/${merchantId}`, Date.now());
      // Their endpoints take every slot merchants may have (4 each, 12 in all); on-call's pages go through the rest.
      for (const merchantId of merchants) for (let i = 0; i < 10; i++) h.dispatcher.notify(alert(merchantId, i));
      await waitFor(() => hanging.received.length === 12 && requestsTo(path).length === 40, 'twelve attempts hang, and on-call got all 40 pages', 20_000);
      h.dispatcher.notify(alert('m_paged'));
      await waitFor(() => requestsTo(path).length === 41, 'on-call paged again while the merchants hang', 10_000);
      expect(hanging.received).toHaveLength(12);
    } finally {
      await h.stop();
      await hanging.close();
    }
  });

  it('keeps no slot for on-call when none is configured: merchants may take them all', async () => {
    receiver.answer(200);
    const hanging = await startReceiver(certs.server, { answer: 'hang' });
    const h = await startDispatcher({ requestTimeoutMs: 60_000 }); // default concurrency (16), no on-call
    try {
      const merchants = ['m_all_1', 'm_all_2', 'm_all_3', 'm_all_4'];
      for (const merchantId of merchants) await registerEndpoint(h.store, merchantId, `${hanging.origin}/${merchantId}`, Date.now());
      for (const merchantId of merchants) for (let i = 0; i < 5; i++) h.dispatcher.notify(alert(merchantId, i));
      await waitFor(() => hanging.received.length === 16, 'sixteen attempts hang, four per endpoint', 15_000);
    } finally {
      await h.stop();
      await hanging.close();
    }
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
