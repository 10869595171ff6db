/**
 * HTTP intake and the process endpoints over real HTTP, storing into the real ClickHouse engine:
 * directly, and through the real Kafka broker (KAFKA_BROKERS set), where the worker's own consumer
 * stores what was posted. The answers are the same both ways; only what a 202 waits for differs.
 */
import { gzipSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { createLogger } from '../../src/logger.ts';
import { startWorker, type Worker } from '../../src/main.ts';
import { startClickHouse, type ClickHouseService } from '../services/clickhouse.ts';
import { asOfToday, makeEvent } from '../support/events.ts';
import { groupCaughtUp, testKafka } from '../support/kafka.ts';
import { TEST_INGEST_TOKEN, metricTotal, testConfig, testNames, waitFor } from '../support/worker.ts';

const auth = { authorization: `Bearer ${TEST_INGEST_TOKEN}` };
const kafka = testKafka(inject('kafkaBrokers'));
// The embedded engine binds one directory per process: one ClickHouse for both ways.
let clickhouse: ClickHouseService;
beforeAll(async () => {
  clickhouse = await startClickHouse();
});
afterAll(async () => {
  await clickhouse?.stop();
});

describe.each([
  { way: 'stored directly', viaKafka: false },
  { way: 'through Kafka', viaKafka: true },
])('HTTP ingest, $way', ({ viaKafka }) => {
  const names = testNames(viaKafka ? 'httpk' : 'http');
  const eventOptions = { runId: names.runId, startMs: asOfToday(Date.UTC(2026, 10, 20, 16, 0, 0)) };
  let worker: Worker;
  let outage = false;
  /** Runs before each insert: a test holds or fails the inserts of the rows it names. */
  let beforeStore: ((body: readonly Uint8Array[]) => Promise<void>) | undefined;

  beforeAll(async () => {
    const config = testConfig({
      clickhouse,
      names,
      ...(viaKafka ? { brokers: inject('kafkaBrokers') } : {}),
      extra: { INGEST_MAX_BODY_BYTES: '65536', INGEST_MAX_EVENTS: '100' },
    });
    worker = await startWorker(config, {
      logger: createLogger('silent'),
      wrapStoreRows: (storeRows) => async (...args) => {
        if (outage) throw new Error('injected storage outage');
        await beforeStore?.(args[0]);
        return storeRows(...args);
      },
    });
    await worker.ready;
  });

  afterAll(async () => {
    await worker?.stop();
  });

  async function post(body: string, headers: Record<string, string> = {}) {
    const response = await fetch(`${worker.url}/v1/ingest/events`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...auth, ...headers },
      body,
    });
    // eslint-disable-next-line @typescript-eslint/no-explicit-any -- response shapes are asserted below
    return { status: response.status, headers: response.headers, body: (await response.json()) as any };
  }

  /** Through Kafka, a 202 means the broker has the events: waits until the consumer has stored (and committed) all of them. */
  async function consumed(): Promise<void> {
    if (viaKafka) await waitFor(() => groupCaughtUp(kafka, names.groupId, names.topic), 'the consumer stores what was posted', 30_000);
  }

  async function storedIds(): Promise<string[]> {
    await consumed();
    const rows = await worker.clickhouse.queryRows<{ event_id: string }>(
      `SELECT event_id FROM ${clickhouse.database}.request_events WHERE position(event_id, {runId:String}) > 0 ORDER BY event_id`,
      { runId: names.runId },
    );
    return rows.map((row) => row.event_id);
  }

  it('answers /health and /ready', async () => {
    const health = (await (await fetch(`${worker.url}/health`)).json()) as { timestamp: string };
    expect(health).toMatchObject({ status: 'ok', version: expect.any(String), uptime: expect.any(Number) });
    expect(Date.parse(health.timestamp)).not.toBeNaN();
    expect((await fetch(`${worker.url}/ready`)).status).toBe(200);
  });

  it('stores valid events, reports each rejected one, and drops duplicates', async () => {
    const events = [0, 1, 2].map((i) => makeEvent(i, eventOptions));
    const invalid = { ...makeEvent(3, eventOptions), ip: 'not-an-ip', status: 'ok' };
    const leaked = { ...makeEvent(4, eventOptions), userAgent: 'sdk sk_live_abcdefgh12345678' };
    // A short test key in the path is a secret too.
    const leakedInPath = { ...makeEvent(5, eventOptions), path: '/v1/keys/sk_live_x' };
    const response = await post(JSON.stringify([...events, invalid, leaked, leakedInPath, events[0]]));
    expect(response.status).toBe(202);
    expect(response.body.data).toMatchObject({ accepted: 3, rejected: 3, duplicates: 1 });
    const [invalidReport, leakedReport, leakedInPathReport] = response.body.data.errors;
    expect(invalidReport).toMatchObject({ index: 3, eventId: invalid.eventId, reason: 'validation_failed' });
    expect(invalidReport.details.map((detail: { path: string[] }) => detail.path[0]).sort()).toEqual(['ip', 'status']);
    expect(leakedReport).toMatchObject({ index: 4, reason: 'secret_in_event' });
    expect(leakedInPathReport).toMatchObject({ index: 5, reason: 'secret_in_event' });
    expect(JSON.stringify(response.body)).not.toMatch(/abcdefgh12345678|sk_live_x/);
    expect(await storedIds()).toEqual(events.map((event) => event.eventId).sort());
  });

  it('accepts NDJSON, and reports a line by its index in the body, blank lines counted', async () => {
    const events = [10, 11].map((i) => makeEvent(i, eventOptions));
    const response = await post(`${events.map((event) => JSON.stringify(event)).join('\n\n')}\n{broken\n`, { 'content-type': 'application/x-ndjson' });
    expect(response.status).toBe(202);
    expect(response.body.data).toMatchObject({ accepted: 2, rejected: 1, errors: [{ index: 3, reason: 'invalid_json' }] });
    expect(await storedIds()).toEqual(expect.arrayContaining(events.map((event) => event.eventId)));
  });

  it('reads a JSON array sent as NDJSON or plain text as the array it is', async () => {
    const events = [12, 13].map((i) => makeEvent(i, eventOptions));
    for (const contentType of ['application/x-ndjson', 'text/plain']) {
      const response = await post(`  ${JSON.stringify(events, null, 2)}\n`, { 'content-type': contentType });
      expect(response.status, contentType).toBe(202);
      // The second post repeats the first one's events: duplicates this time.
      expect(response.body.data, contentType).toMatchObject(contentType === 'text/plain' ? { accepted: 0, duplicates: 2, rejected: 0 } : { accepted: 2, rejected: 0 });
    }
    expect(await storedIds()).toEqual(expect.arrayContaining(events.map((event) => event.eventId)));
    const broken = await post('[{"eventId": "x"', { 'content-type': 'text/plain' });
    expect(broken.status).toBe(400);
    expect(broken.body).toMatchObject({ code: 'VALIDATION_ERROR', details: [{ path: ['body'] }] });
  });

  it('reads one pretty-printed object sent as NDJSON or plain text as the one event it is', async () => {
    const event = makeEvent(15, eventOptions);
    for (const contentType of ['application/x-ndjson', 'text/plain']) {
      const response = await post(JSON.stringify(event, null, 2), { 'content-type': contentType });
      expect(response.status, contentType).toBe(202);
      // The second post repeats the first one's event: a duplicate this time.
      expect(response.body.data, contentType).toEqual(contentType === 'text/plain' ? { accepted: 0, rejected: 0, duplicates: 1, errors: [] } : { accepted: 1, rejected: 0, duplicates: 0, errors: [] });
    }
    expect(await storedIds()).toContain(event.eventId);
  });

  it('stores free text exactly as sent: tabs, newlines, backslashes, quotes and non-ASCII survive the row format', async () => {
    const texts = ['tab\there', 'new\nline', 'carriage\rreturn', 'back\\slash \\t \\n \\\\', 'nul\u0000byte', '"quoted" \'single\'', 'é ü 漢字 😀 \u2028'];
    const events = texts.map((text, i) => ({ ...makeEvent(20 + i, eventOptions), eventId: `${names.runId}\t${i}\\${text}`, userAgent: text, path: `/v1/${text}` }));
    const response = await post(JSON.stringify(events));
    expect(response.body.data).toMatchObject({ accepted: texts.length, rejected: 0 });
    await consumed();
    const rows = await worker.clickhouse.queryRows<{ event_id: string; user_agent: string; path: string; status: number }>(
      `SELECT event_id, user_agent, path, status FROM ${clickhouse.database}.request_events WHERE event_id IN {ids:Array(String)}`,
      { ids: events.map((event) => event.eventId) },
    );
    const stored = new Map(rows.map((row) => [row.event_id, row]));
    for (const event of events) {
      expect(stored.get(event.eventId)).toEqual({ event_id: event.eventId, user_agent: event.userAgent, path: event.path, status: event.status });
    }
  });

  it.each([
    ['no token', {}],
    ['a wrong token', { authorization: 'Bearer wrong-token-wrong-token' }],
    ['another scheme', { authorization: `Basic ${TEST_INGEST_TOKEN}` }],
  ])('refuses %s with 401', async (_name, headers) => {
    const response = await fetch(`${worker.url}/v1/ingest/events`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...headers },
      body: '[]',
    });
    expect(response.status).toBe(401);
    expect(await response.json()).toEqual({ success: false, error: { code: 'UNAUTHORIZED', message: expect.any(String) } });
  });

  it.each([
    ['a body that is not JSON', '{"events": [', 400, 'VALIDATION_ERROR'],
    ['a JSON number', '42', 400, 'VALIDATION_ERROR'],
    ['an empty array', '[]', 400, 'VALIDATION_ERROR'],
    ['more events than allowed', JSON.stringify(Array.from({ length: 101 }, () => ({}))), 400, 'VALIDATION_ERROR'],
    ['a body over the size limit', JSON.stringify([{ padding: 'x'.repeat(70_000) }]), 413, 'PAYLOAD_TOO_LARGE'],
  ])('answers %s with %s %s', async (_name, body, status, code) => {
    const response = await post(body);
    expect(response.status).toBe(status);
    const errorCode = response.body.code ?? response.body.error?.code;
    expect(errorCode).toBe(code);
    if (code === 'VALIDATION_ERROR') expect(response.body.details[0].path).toEqual(['body']);
  });

  it('answers a prototype-poisoning body per event, as Kafka intake reads it: the keys are not fields, and nothing is polluted', async () => {
    const response = await post('[{"__proto__": {"admin": true}}, {"constructor": {"prototype": {"admin": true}}}]');
    expect(response.status).toBe(202);
    expect(response.body.data).toMatchObject({ accepted: 0, rejected: 2, errors: [{ index: 0, reason: 'validation_failed' }, { index: 1, reason: 'validation_failed' }] });
    expect(({} as { admin?: boolean }).admin).toBeUndefined();
  });

  it('answers a deeply nested body with a rejected event, never a 500', async () => {
    const depth = 10_000; // deeper than JSON.stringify can go (about 5,000 here), within the body limit
    const nested = `${'['.repeat(depth)}1${']'.repeat(depth)}`;
    const asArray = await post(nested); // an array of one item that is not an event
    expect(asArray.status).toBe(202);
    expect(asArray.body.data).toMatchObject({ accepted: 0, rejected: 1 });
    const asField = await post(`[{"eventId":"evt_deep","userAgent":${nested}}]`);
    expect(asField.status).toBe(202);
    expect(asField.body.data).toMatchObject({ accepted: 0, rejected: 1 });
    const asLine = await post(`{"eventId":"evt_deep","userAgent":${nested}}\n`, { 'content-type': 'application/x-ndjson' });
    expect(asLine.status).toBe(202);
    expect(asLine.body.data).toMatchObject({ accepted: 0, rejected: 1 });
    expect((await fetch(`${worker.url}/ready`)).status).toBe(200);
  });

  it('answers an unsupported content type with 415', async () => {
    const response = await post('a,b,c', { 'content-type': 'text/csv' });
    expect(response.status).toBe(415);
    expect(response.body.error.code).toBe('UNSUPPORTED_MEDIA_TYPE');
  });

  it('answers a body in a content coding or charset it does not read with 415 (Accept-Encoding: identity for a coding), after the token check, and stores nothing of it', async () => {
    const event = makeEvent(60, eventOptions);
    const body = JSON.stringify([event]);
    const send = async (headers: Record<string, string>, payload: string | Buffer, token = auth) => {
      const response = await fetch(`${worker.url}/v1/ingest/events`, { method: 'POST', headers: { 'content-type': 'application/json', ...token, ...headers }, body: payload });
      // eslint-disable-next-line @typescript-eslint/no-explicit-any -- response shapes are asserted below
      return { status: response.status, acceptEncoding: response.headers.get('accept-encoding'), body: (await response.json()) as any };
    };
    const refused = { success: false, error: { code: 'UNSUPPORTED_MEDIA_TYPE', message: expect.any(String) } };
    expect(await send({ 'content-encoding': 'gzip' }, gzipSync(body))).toEqual({ status: 415, acceptEncoding: 'identity', body: refused });
    expect(await send({ 'content-type': 'application/json; charset=utf-16le' }, Buffer.from(body, 'utf16le'))).toEqual({ status: 415, acceptEncoding: null, body: refused });
    expect(await send({ 'content-type': 'text/plain; charset="ISO-8859-1"' }, Buffer.from(body, 'latin1'))).toEqual({ status: 415, acceptEncoding: null, body: refused });
    // A caller without the token learns nothing more: 401.
    expect((await send({ 'content-encoding': 'gzip' }, gzipSync(body), { authorization: 'Bearer wrong-token-wrong-token' })).status).toBe(401);
    expect(await storedIds()).not.toContain(event.eventId);
    // The same body as it reads it: no coding but identity, UTF-8 named in any case, quoted or not.
    const taken = await send({ 'content-type': 'application/json; charset="UTF-8"', 'content-encoding': 'identity' }, body);
    expect({ status: taken.status, data: taken.body.data }).toMatchObject({ status: 202, data: { accepted: 1 } });
    expect((await storedIds()).filter((id) => id === event.eventId)).toHaveLength(1);
  });

  it.skipIf(viaKafka)('answers 503 with Retry-After while storage is down, and a retry is not counted twice', async () => {
    outage = true;
    const event = makeEvent(20, eventOptions);
    const first = await post(JSON.stringify([event]));
    expect(first.status).toBe(503);
    expect(first.headers.get('retry-after')).toBe('5');
    expect(first.body.error.code).toBe('STORAGE_UNAVAILABLE');
    outage = false;
    // The event stayed buffered and is stored on recovery; the client's retry is a duplicate.
    await waitFor(async () => (await fetch(`${worker.url}/ready`)).status === 200, 'storage recovers', 15_000);
    const retry = await post(JSON.stringify([event]));
    expect(retry.status).toBe(202);
    expect(retry.body.data).toMatchObject({ accepted: 0, duplicates: 1 });
    const ids = await storedIds();
    expect(ids.filter((id) => id === event.eventId)).toHaveLength(1);
  });

  it.skipIf(viaKafka)('answers 202 only once the events are stored: after an outage, a retry of events whose insert has not finished waits for it', async () => {
    const [before, caught] = [40, 41].map((i) => makeEvent(i, eventOptions)) as [ReturnType<typeof makeEvent>, ReturnType<typeof makeEvent>];
    const holds = (body: readonly Uint8Array[], id: string) => Buffer.concat(body).toString().split('\n').some((row) => row.startsWith(`${id}\t`));
    let firstInsertBegun = false;
    let caughtInsertBegun = false;
    let failFirstInsert!: () => void;
    const firstInsertFails = new Promise<void>((resolve) => (failFirstInsert = resolve));
    let finishCaughtInsert!: () => void;
    const caughtInsertFinishes = new Promise<void>((resolve) => (finishCaughtInsert = resolve));
    beforeStore = async (body) => {
      if (holds(body, before.eventId) && !firstInsertBegun) {
        firstInsertBegun = true;
        await firstInsertFails;
        throw new Error('injected storage outage');
      }
      if (holds(body, caught.eventId)) {
        caughtInsertBegun = true;
        await caughtInsertFinishes;
      }
    };
    try {
      const beforeAnswer = post(JSON.stringify([before]));
      await waitFor(() => firstInsertBegun, 'the first insert has begun');
      // Posted while the first insert is under way: its rows wait for the next flush.
      const caughtAnswer = post(JSON.stringify([caught]));
      // The gauge counts the first post's row, in the insert under way, and the second's, waiting for the next.
      await waitFor(async () => (await metricTotal(worker, 'security_center_buffered_rows')) === 2, 'the second post is buffered');
      failFirstInsert(); // an outage: both posts get 503, and their rows stay buffered
      expect((await beforeAnswer).status).toBe(503);
      expect((await caughtAnswer).status).toBe(503);
      await waitFor(async () => caughtInsertBegun && (await fetch(`${worker.url}/ready`)).status === 200, 'storage is back, and the second post is being stored');
      // The client retries while that insert is still running; it finishes a second later.
      setTimeout(finishCaughtInsert, 1_000);
      const retry = await post(JSON.stringify([caught]));
      const storedWhenAnswered = (await storedIds()).filter((id) => id === caught.eventId);
      expect(retry.status).toBe(202);
      expect(retry.body.data).toMatchObject({ accepted: 0, duplicates: 1 });
      expect(storedWhenAnswered).toEqual([caught.eventId]);
    } finally {
      beforeStore = undefined;
    }
  });

  it.skipIf(viaKafka)('is not ready while the rows waiting for storage are at STORE_MAX_BUFFERED_ROWS, so posts go to another replica; ready again once they are stored', async () => {
    let finishInsert!: () => void;
    const insertFinishes = new Promise<void>((resolve) => (finishInsert = resolve));
    let insertBegun = false;
    const slow = await startWorker(testConfig({ clickhouse, names, extra: { STORE_FLUSH_ROWS: '2', STORE_MAX_BUFFERED_ROWS: '2' } }), {
      logger: createLogger('silent'),
      wrapStoreRows: (storeRows) => async (...args) => {
        insertBegun = true;
        await insertFinishes;
        return storeRows(...args);
      },
    });
    try {
      await slow.ready;
      const postTo = (first: number) =>
        fetch(`${slow.url}/v1/ingest/events`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', ...auth },
          body: JSON.stringify([makeEvent(first, eventOptions), makeEvent(first + 1, eventOptions)]),
        });
      const inserted = postTo(50); // two rows: flushed at once, and the insert held
      await waitFor(() => insertBegun, 'the first insert has begun');
      expect((await fetch(`${slow.url}/ready`)).status).toBe(200);
      const waiting = postTo(52); // two more wait for the next flush: the buffer is at its limit
      // The gauge counts the two rows of the insert held and the two waiting for the next.
      await waitFor(async () => (await metricTotal(slow, 'security_center_buffered_rows')) === 4, 'the second post is buffered');
      const notReady = await fetch(`${slow.url}/ready`);
      expect(notReady.status).toBe(503);
      expect(((await notReady.json()) as { reason: string }).reason).toContain('STORE_MAX_BUFFERED_ROWS');
      expect((await postTo(54)).status).toBe(503);
      finishInsert();
      expect((await inserted).status).toBe(202);
      expect((await waiting).status).toBe(202);
      expect((await fetch(`${slow.url}/ready`)).status).toBe(200);
    } finally {
      finishInsert();
      await slow.stop();
    }
  });

  it.skipIf(viaKafka)('answers 202 for a post whose events wait out a STORE_FLUSH_INTERVAL_MS longer than its 10 s for storage', async () => {
    const patient = await startWorker(testConfig({ clickhouse, names, extra: { STORE_FLUSH_INTERVAL_MS: '11000' } }), { logger: createLogger('silent') });
    try {
      await patient.ready;
      const event = makeEvent(70, eventOptions);
      const started = Date.now();
      const response = await fetch(`${patient.url}/v1/ingest/events`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...auth },
        body: JSON.stringify([event]),
      });
      expect(response.status).toBe(202);
      // The insert waited for the interval: the 202 came after it, not from some earlier flush.
      expect(Date.now() - started).toBeGreaterThanOrEqual(10_000);
      expect(await storedIds()).toContain(event.eventId);
    } finally {
      await patient.stop();
    }
  });

  it.runIf(viaKafka)('takes events while storage is down (the topic holds them), stores them once it is back, and a retry is not counted twice', async () => {
    outage = true;
    const event = makeEvent(20, eventOptions);
    expect((await post(JSON.stringify([event]))).status).toBe(202);
    const retry = await post(JSON.stringify([event]));
    expect(retry.status).toBe(202);
    expect(retry.body.data).toMatchObject({ accepted: 0, duplicates: 1 });
    await waitFor(async () => (await fetch(`${worker.url}/ready`)).status === 503, 'the consumer meets the outage', 15_000);
    outage = false;
    expect((await storedIds()).filter((id) => id === event.eventId)).toHaveLength(1);
  });

  it.skipIf(viaKafka)('tells a retry sent after a restart from a new post: the ids the previous process stored are recalled, and the rollup counts the event once', async () => {
    const event = makeEvent(30, eventOptions);
    expect((await post(JSON.stringify([event]))).body.data).toMatchObject({ accepted: 1 });
    await waitFor(async () => (await storedIds()).includes(event.eventId), 'the event is stored');
    // The client's answer was lost in the restart: it posts again, to the worker that replaced this one.
    const restarted = await startWorker(testConfig({ clickhouse, names, extra: { INGEST_MAX_BODY_BYTES: '65536', INGEST_MAX_EVENTS: '100' } }), { logger: createLogger('silent') });
    try {
      const response = await fetch(`${restarted.url}/v1/ingest/events`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...auth },
        body: JSON.stringify([event, makeEvent(31, eventOptions)]),
      });
      expect(((await response.json()) as { data: unknown }).data).toMatchObject({ accepted: 1, duplicates: 1 });
      await restarted.ready;
    } finally {
      await restarted.stop();
    }
    const [rollup] = await worker.clickhouse.queryRows<{ requests: string }>(
      `SELECT sum(requests) AS requests FROM ${clickhouse.database}.request_rollup_1m WHERE api_key_id = {key:String}`,
      { key: event.apiKeyId },
    );
    expect(Number(rollup!.requests)).toBe(1);
  });

  it('serves Prometheus metrics and a Format A 404 for unknown paths', async () => {
    const metrics = await (await fetch(`${worker.url}/metrics`)).text();
    expect(metrics).toMatch(/security_center_events_consumed_total\{source="http"\} \d+/);
    expect(metrics).toMatch(/security_center_events_rejected_total\{reason="secret_in_event"\} 2/);
    const missing = await fetch(`${worker.url}/nope`);
    expect(missing.status).toBe(404);
    expect(await missing.json()).toMatchObject({ success: false, error: { code: 'NOT_FOUND' } });
  });
});
