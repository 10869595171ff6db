import { connect } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import type { FastifyInstance } from 'fastify';
import { gzipSync } from 'node:zlib';
import { afterEach, describe, expect, it } from 'vitest';
import { makeEvent } from '../../test/support/events.ts';
import { fake } from '../../test/support/fake.ts';
import { EVENT_TIME_RANGE, type RequestEvent } from '../events/request-event.ts';
import { storableEventTimes } from '../store/event-store.ts';
import { createHttpServer } from '../http/server.ts';
import { createLogger } from '../logger.ts';
import { WorkerMetrics } from '../metrics.ts';
import { EventBuffer } from './event-buffer.ts';
import { registerHttpIngest, type HttpIngestOptions } from './http-ingest.ts';
import { RecentEventIds } from './recent-event-ids.ts';

const TOKEN = 'unit-test-ingest-token-0123';

const event = (i: number) => makeEvent(i, { runId: 'unit', startMs: Date.UTC(2026, 10, 21, 10, 0, 0), keys: 2 });

/** Valid events, one that fails the schema, one that carries a secret, and a repeat of the first. */
const MIXED = [event(0), event(1), { ...event(2), status: 'ok' }, { ...event(3), userAgent: 'sdk sk_live_abcdefgh12345678' }, event(0)];

const apps: FastifyInstance[] = [];
const buffers: EventBuffer[] = [];
afterEach(async () => {
  for (const app of apps.splice(0)) await app.close();
  for (const buffer of buffers.splice(0)) await buffer.stop(100);
});

/** A promise that a test settles: storage that answers when the test lets it. */
function deferred() {
  let resolve!: () => void;
  let reject!: (error: Error) => void;
  const promise = new Promise<void>((res, rej) => ((resolve = res), (reject = rej)));
  return { promise, resolve, reject };
}

/** Polls until the condition holds (a generous deadline: it fails only if it never does). */
async function until(condition: () => boolean | Promise<boolean>, what: string): Promise<void> {
  const deadline = Date.now() + 10_000;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`never happened: ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

/** A buffer whose add() resolves (the rows are durable) when `durable` does; records each add's lines. */
function slowBuffer(durable: Promise<void>) {
  const adds: string[][] = [];
  const buffer = fake<EventBuffer>({
    healthy: true,
    add: ({ lines }: { lines: string[] }) => (adds.push(lines), durable),
    onOutage: () => () => undefined,
  });
  return { buffer, adds };
}

/** The real buffer over `storeRows`, flushing at once (10 ms) and retrying fast. */
function realBuffer(storeRows: (body: readonly Uint8Array[]) => Promise<void>, { flushRows = 1000, maxBufferedRows = 1000 } = {}): EventBuffer {
  const buffer = new EventBuffer({
    flushRows,
    flushIntervalMs: 10,
    maxBufferedRows,
    storeRows,
    sendDeadLetters: async () => undefined,
    commit: async () => undefined,
    metrics: new WorkerMetrics({ defaultMetrics: false }),
    logger: createLogger('silent'),
    retryInitialMs: 10,
    retryMaxMs: 20,
  });
  buffers.push(buffer);
  return buffer;
}

/** The eventIds of the rows in an insert's body. */
const idsIn = (body: readonly Uint8Array[]) => Buffer.concat(body).toString().split('\n').filter((row) => row.length > 0).map((row) => row.split('\t')[0]!);

const events = (from: number, count: number) => Array.from({ length: count }, (_, i) => event(from + i));

/** A server with HTTP ingest, storing directly (a buffer that takes everything) or publishing through `publish`. */
async function server(options: Partial<HttpIngestOptions> = {}, logger = createLogger('silent')) {
  const metrics = new WorkerMetrics({ defaultMetrics: false });
  const stored: string[][] = [];
  const detected: RequestEvent[][] = [];
  const app = createHttpServer({ logger, metrics, version: 'test', bodyLimit: 1 << 20, notReadyReason: () => undefined });
  const buffer = fake<EventBuffer>({
    healthy: true,
    add: async ({ lines }: { lines: string[] }) => void stored.push(lines),
    onOutage: () => () => undefined,
  });
  registerHttpIngest(app, { token: TOKEN, maxEvents: 100, eventTimes: EVENT_TIME_RANGE, buffer, recentIds: new RecentEventIds(100), metrics, onAccepted: (events) => detected.push(events), ...options });
  apps.push(app);
  const post = async (events: unknown[]) => {
    const response = await app.inject({ method: 'POST', url: '/v1/ingest/events', headers: { authorization: `Bearer ${TOKEN}` }, payload: events });
    return { status: response.statusCode, headers: response.headers, text: response.body, body: response.json() };
  };
  return { app, post, stored, detected, metrics };
}

describe('HTTP ingest: the request', () => {
  const send = async ({ app }: Awaited<ReturnType<typeof server>>, payload: string | Buffer, contentType: string, authorization?: string) => {
    const response = await app.inject({ method: 'POST', url: '/v1/ingest/events', headers: { 'content-type': contentType, ...(authorization && { authorization }) }, payload });
    return { status: response.statusCode, body: response.json() as { error?: { code: string }; data?: { accepted: number } } };
  };

  it('checks the token before it reads the body: 401 whatever the body, never 400, 413 or 415', async () => {
    const app = await server();
    const bodies: [string, string | Buffer][] = [
      ['malformed JSON', '{bad'],
      ['an unknown content type', '<events/>'],
      ['a body over the limit', Buffer.alloc(2 << 20, 'a')],
    ];
    for (const [what, payload] of bodies) {
      const contentType = what === 'an unknown content type' ? 'application/xml' : 'application/json';
      for (const authorization of [undefined, 'Bearer not-the-token']) {
        const answer = await send(app, payload, contentType, authorization);
        expect({ what, status: answer.status, code: answer.body.error?.code }).toEqual({ what, status: 401, code: 'UNAUTHORIZED' });
      }
    }
    // With the token, the same bodies get what they deserve.
    expect((await send(app, '{bad', 'application/json', `Bearer ${TOKEN}`)).status).toBe(400);
    expect((await send(app, '<events/>', 'application/xml', `Bearer ${TOKEN}`)).status).toBe(415);
    expect((await send(app, Buffer.alloc(2 << 20, 'a'), 'application/json', `Bearer ${TOKEN}`)).status).toBe(413);
    expect(app.stored).toEqual([]);
  });

  it('refuses (415) a body in a content coding or charset it does not read, without reading it; Accept-Encoding: identity for a coding; 401 first', async () => {
    const app = await server();
    /** `authorization` '' sends none. */
    const post = async (headers: Record<string, string>, payload: string | Buffer, authorization = `Bearer ${TOKEN}`) => {
      const response = await app.app.inject({ method: 'POST', url: '/v1/ingest/events', headers: { 'content-type': 'application/json', ...headers, ...(authorization && { authorization }) }, payload });
      return { status: response.statusCode, acceptEncoding: response.headers['accept-encoding'], body: response.json() as unknown };
    };
    const json = JSON.stringify([event(50)]);
    for (const encoding of ['gzip', 'GZIP', 'x-gzip', 'br', 'deflate', 'identity, gzip', 'gzip, identity']) {
      expect({ encoding, ...(await post({ 'content-encoding': encoding }, gzipSync(json))) }).toEqual({
        encoding,
        status: 415,
        acceptEncoding: 'identity',
        body: { success: false, error: { code: 'UNSUPPORTED_MEDIA_TYPE', message: 'Content-Encoding is not supported: send the body uncompressed' } },
      });
    }
    for (const contentType of [
      'application/json; charset=utf-16le',
      'application/json; charset="UTF-16"',
      'application/json;charset=ISO-8859-1',
      'text/plain; charset=latin1',
      'application/x-ndjson; profile=x; charset=windows-1252',
      'application/json; charset=utf-8; charset=utf-16',
      'application/json; charset=""',
    ]) {
      expect({ contentType, ...(await post({ 'content-type': contentType }, Buffer.from(json, 'utf16le'))) }).toEqual({
        contentType,
        status: 415,
        body: { success: false, error: { code: 'UNSUPPORTED_MEDIA_TYPE', message: 'Only UTF-8 bodies are read: send charset=utf-8, or no charset' } },
      });
    }
    // Without the token, 401 whatever the body is in.
    for (const [headers, authorization] of [[{ 'content-encoding': 'gzip' }, ''], [{ 'content-type': 'application/json; charset=utf-16le' }, 'Bearer not-the-token']] as const) {
      expect((await post(headers, 'x', authorization)).status).toBe(401);
    }
    expect(app.stored).toEqual([]);
    // What it reads: no coding but identity, and UTF-8 or US-ASCII named in any case, quoted or not.
    const readable: Record<string, string>[] = [
      { 'content-encoding': 'identity' },
      { 'content-encoding': 'IDENTITY' },
      { 'content-encoding': 'identity, ' },
      { 'content-type': 'application/json; charset=UTF-8' },
      { 'content-type': 'application/json;charset="utf-8"' },
      { 'content-type': 'application/json; charset=us-ascii' },
      { 'content-type': 'application/json; charset=utf8' },
      { 'content-type': 'application/x-ndjson; charset="US-ASCII"' },
      { 'content-type': 'application/json; note="a;charset=utf-16"; charset=utf-8' },
    ];
    for (const [i, headers] of readable.entries()) {
      const answer = await post(headers, JSON.stringify([event(51 + i)]));
      expect({ headers, status: answer.status, body: answer.body }).toMatchObject({ headers, status: 202, body: { data: { accepted: 1 } } });
    }
    expect(app.stored.flat()).toHaveLength(readable.length);
  });

  it('refuses (501) a transfer coding other than chunked, which Node hands on undecoded; chunked alone is read', async () => {
    const app = await server();
    await app.app.listen({ host: '127.0.0.1', port: 0 });
    const { port } = app.app.server.address() as { port: number };
    /** One chunked post with this Transfer-Encoding, over a socket of its own; its status line and body. */
    const post = (transferEncoding: string, payload: Buffer) =>
      new Promise<{ status: string; body: unknown }>((resolve, reject) => {
        const socket = connect(port, '127.0.0.1');
        let received = '';
        socket.on('data', (chunk: Buffer) => (received += chunk.toString()));
        socket.on('error', reject);
        socket.on('end', () => {
          const [head, body] = received.split('\r\n\r\n') as [string, string];
          const chunkedBody = /transfer-encoding: chunked/i.test(head) ? body.split('\r\n').slice(1, -3).join('') : body;
          resolve({ status: head.split('\r\n')[0]!, body: JSON.parse(chunkedBody) });
        });
        socket.write(
          `POST /v1/ingest/events HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer ${TOKEN}\r\n` +
            `Content-Type: application/x-ndjson\r\nTransfer-Encoding: ${transferEncoding}\r\n\r\n${payload.length.toString(16)}\r\n`,
        );
        socket.write(payload);
        socket.write('\r\n0\r\n\r\n');
      });
    const ndjson = `${JSON.stringify(event(70))}\n${JSON.stringify(event(71))}\n`;
    for (const coding of ['gzip, chunked', 'deflate, chunked', 'x-custom, chunked']) {
      expect({ coding, ...(await post(coding, gzipSync(ndjson))) }).toEqual({
        coding,
        status: 'HTTP/1.1 501 Not Implemented',
        body: { success: false, error: { code: 'NOT_IMPLEMENTED', message: 'Transfer-Encoding other than chunked is not supported: send the body uncompressed' } },
      });
    }
    expect(app.stored).toEqual([]);
    expect(await post('chunked', Buffer.from(ndjson))).toMatchObject({ status: 'HTTP/1.1 202 Accepted', body: { data: { accepted: 2 } } });
    await app.app.close();
  });

  it('refuses a JSON string, which is not NDJSON however it reads', async () => {
    const app = await server();
    const answer = await send(app, JSON.stringify(JSON.stringify(event(0))), 'application/json; charset=utf-8', `Bearer ${TOKEN}`);
    expect(answer.status).toBe(400);
    expect(JSON.stringify(answer.body)).toContain('expected a JSON array of events, one event object, or NDJSON');
    expect(app.stored).toEqual([]);
    // The same text as NDJSON is one event.
    expect((await send(app, JSON.stringify(event(0)), 'application/x-ndjson', `Bearer ${TOKEN}`)).body.data).toMatchObject({ accepted: 1 });
  });

  it('reads one pretty-printed object sent as NDJSON or plain text as the one event it is', async () => {
    const app = await server();
    for (const [i, contentType] of ['application/x-ndjson', 'text/plain'].entries()) {
      const answer = await send(app, `\uFEFF${JSON.stringify(event(20 + i), null, 2)}\n`, contentType, `Bearer ${TOKEN}`);
      expect({ contentType, status: answer.status, data: answer.body.data }).toEqual({ contentType, status: 202, data: { accepted: 1, rejected: 0, duplicates: 0, errors: [] } });
    }
    expect(app.stored.flat()).toHaveLength(2);
    // Checked as an array item is: a secret in it is refused, and not echoed.
    const leaked = await send(app, JSON.stringify({ ...event(22), userAgent: 'sdk sk_live_abcdefgh12345678' }, null, 2), 'text/plain', `Bearer ${TOKEN}`);
    expect(leaked.body.data).toMatchObject({ accepted: 0, rejected: 1, errors: [{ index: 0, reason: 'secret_in_event' }] });
    expect(JSON.stringify(leaked.body)).not.toContain('abcdefgh12345678');
    // Lines that are not one object together are NDJSON still: one answer per line.
    const twoLines = await send(app, `${JSON.stringify(event(23))}\n${JSON.stringify(event(24))}`, 'application/x-ndjson', `Bearer ${TOKEN}`);
    expect(twoLines.body.data).toMatchObject({ accepted: 2, rejected: 0 });
  });

  it('reads NDJSON whose first line is a JSON array line by line, and refuses a malformed array whole', async () => {
    const app = await server();
    const body = `[${JSON.stringify(event(40))}]\n${JSON.stringify(event(41))}\n`;
    const answer = await send(app, body, 'application/x-ndjson', `Bearer ${TOKEN}`);
    expect(answer.status).toBe(202);
    expect(answer.body.data).toMatchObject({ accepted: 1, rejected: 1, errors: [{ index: 0, reason: 'not_an_object' }] });
    expect(app.stored.flat()).toHaveLength(1);
    // A pretty-printed array cut short, or one line that is not JSON: one clear 400, not a rejection per line.
    for (const cut of [JSON.stringify([event(42), event(43)], null, 2).slice(0, -10), `[${JSON.stringify(event(44))}\n${JSON.stringify(event(45))}`]) {
      const refused = await send(app, cut, 'application/x-ndjson', `Bearer ${TOKEN}`);
      expect(refused.status).toBe(400);
      expect(JSON.stringify(refused.body)).toContain('body starts as a JSON array but is not valid JSON');
    }
    expect(app.stored.flat()).toHaveLength(1);
  });

  it('reports an NDJSON line by its index in the body, blank lines counted', async () => {
    const app = await server();
    const body = `${JSON.stringify(event(30))}\n\n  \r\n{broken\r\n${JSON.stringify({ ...event(31), status: 'ok' })}\n\n`;
    const answer = await send(app, body, 'application/x-ndjson', `Bearer ${TOKEN}`);
    expect(answer.body.data).toMatchObject({ accepted: 1, rejected: 2, errors: [{ index: 3, reason: 'invalid_json' }, { index: 4, eventId: 'evt_unit_31', reason: 'validation_failed' }] });
  });

  it('rejects per event, naming the timestamp, an event older than EVENTS_TTL_DAYS before now, and takes the others', async () => {
    const app = await server({ eventTimes: storableEventTimes(30) });
    const dated = (i: number, ageDays: number) => ({ ...event(40 + i), timestamp: new Date(Date.now() - ageDays * 86_400_000).toISOString() });
    const answer = await app.post([dated(0, 29), dated(1, 31), dated(2, 0)]);
    expect(answer.status).toBe(202);
    expect(answer.body.data).toMatchObject({
      accepted: 2,
      rejected: 1,
      errors: [{ index: 1, reason: 'validation_failed', details: [{ path: ['timestamp'], message: expect.stringContaining('older than the raw events are kept (EVENTS_TTL_DAYS=30)') }] }],
    });
    expect(app.stored.flat()).toHaveLength(2);
  });

  it('reads events holding "__proto__" or "constructor" keys alike whatever the content type (the keys dropped as unknown fields); an empty or malformed JSON body is still refused', async () => {
    const app = await server();
    const poisoned = (i: number) =>
      `{"__proto__":{"polluted":"yes"},${JSON.stringify({ ...event(50 + i), extra: 'x' }).slice(1, -1).replace('"extra":"x"', '"extra":{"constructor":{"prototype":{"polluted":"yes"}}}')}}`;
    for (const [i, contentType] of ['application/json', 'text/plain', 'application/x-ndjson'].entries()) {
      const answer = await send(app, `[${poisoned(i)}]`, contentType, `Bearer ${TOKEN}`);
      expect({ contentType, status: answer.status, accepted: answer.body.data?.accepted }).toEqual({ contentType, status: 202, accepted: 1 });
    }
    expect(app.detected.flat().map((stored) => [stored.eventId, Object.getPrototypeOf(stored), Object.keys(stored).includes('extra')])).toEqual(
      [50, 51, 52].map((i) => [event(i).eventId, Object.prototype, false]),
    );
    expect(({} as { polluted?: string }).polluted).toBeUndefined();
    for (const payload of ['', '[{"eventId":', '{"__proto__":']) {
      const answer = await send(app, payload, 'application/json', `Bearer ${TOKEN}`);
      expect({ payload, status: answer.status, body: answer.body }).toMatchObject({ payload, status: 400, body: { code: 'VALIDATION_ERROR' } });
    }
  });

  it('rejects an event with a secret in its user agent, and hands its redacted copy to detection with the post\'s accepted ones, not to storage', async () => {
    const app = await server();
    const leaked = { ...event(60), userAgent: 'sqlmap/1.8.2#stable (https://sqlmap.org) sk_1' };
    const answer = await app.post([leaked, event(61)]);
    expect(answer.body.data).toMatchObject({ accepted: 1, rejected: 1, errors: [{ index: 0, reason: 'secret_in_event' }] });
    expect(app.stored.flat()).toHaveLength(1);
    expect(app.detected.map((batch) => batch.map((e) => [e.eventId, e.userAgent]))).toEqual([
      [
        [event(61).eventId, event(61).userAgent],
        [leaked.eventId, 'sqlmap/1.8.2#stable (https://sqlmap.org) sk_[REDACTED]'],
      ],
    ]);
    // Alone in a post, too; and its id is not taken: the copy without the secret is stored.
    expect((await app.post([leaked])).body.data).toMatchObject({ accepted: 0, rejected: 1 });
    expect(app.detected).toHaveLength(2);
    expect((await app.post([{ ...leaked, userAgent: 'sqlmap/1.8.2#stable (https://sqlmap.org)' }])).body.data).toMatchObject({ accepted: 1, duplicates: 0 });
    expect(app.stored.flat()).toHaveLength(2);
  });

  it('reads a JSON array after a byte-order mark whatever the content type says', async () => {
    const app = await server();
    for (const [i, contentType] of ['text/plain', 'application/x-ndjson', 'application/json'].entries()) {
      const answer = await send(app, `\uFEFF${JSON.stringify([event(10 + i)])}`, contentType, `Bearer ${TOKEN}`);
      expect({ contentType, status: answer.status, accepted: answer.body.data?.accepted }).toEqual({ contentType, status: 202, accepted: 1 });
    }
    expect(app.stored).toHaveLength(3);
  });
});

describe('HTTP ingest with Kafka (publish)', () => {
  it('answers each event as without Kafka, and publishes the accepted ones instead of storing and detecting them here', async () => {
    const published: RequestEvent[][] = [];
    const viaKafka = await server({ publish: async (events) => void published.push([...events]) });
    const direct = await server();
    const answer = await viaKafka.post(MIXED);
    expect(answer.status).toBe(202);
    expect(answer.body).toEqual((await direct.post(MIXED)).body);
    expect(answer.body.data).toMatchObject({ accepted: 2, rejected: 2, duplicates: 1 });
    expect(answer.text).not.toContain('abcdefgh12345678');
    expect(published.map((events) => events.map((e) => e.eventId))).toEqual([['evt_unit_0', 'evt_unit_1']]);
    expect(viaKafka.stored).toEqual([]);
    expect(viaKafka.detected).toEqual([]);
    expect((await viaKafka.metrics.eventsProduced.get()).values[0]?.value).toBe(2);
    // The brokers have them: a retry to this replica is a duplicate, and is not published again.
    expect((await viaKafka.post([event(0)])).body.data).toMatchObject({ accepted: 0, duplicates: 1 });
    expect(published).toHaveLength(1);
  });

  it('answers 503 with Retry-After when the brokers refuse the events, and publishes them again on the retry', async () => {
    let attempts = 0;
    const published: string[][] = [];
    const { post, metrics } = await server({
      publish: async (events) => {
        if (++attempts === 1) throw new Error('KafkaJSNumberOfRetriesExceeded');
        published.push(events.map((e) => e.eventId));
      },
    });
    const refused = await post([event(0), event(1)]);
    expect(refused.status).toBe(503);
    expect(refused.headers['retry-after']).toBe('5');
    expect(refused.body).toEqual({ success: false, error: { code: 'STORAGE_UNAVAILABLE', message: expect.any(String) } });
    expect(refused.text).not.toContain('evt_unit');
    expect((await metrics.eventsProduced.get()).values[0]?.value).toBe(0);
    const retry = await post([event(0), event(1)]);
    expect(retry.status).toBe(202);
    expect(retry.body.data).toMatchObject({ accepted: 2, duplicates: 0 });
    expect(published).toEqual([['evt_unit_0', 'evt_unit_1']]);
  });

  it('answers a repeat posted while the brokers have not acknowledged the first a duplicate once they do, and publishes the event once', async () => {
    const brokers = deferred();
    const published: string[][] = [];
    const { post, metrics } = await server({
      publish: (events) => {
        published.push(events.map((e) => e.eventId));
        return brokers.promise;
      },
      storeTimeoutMs: 60_000,
    });
    let acknowledged = false;
    const answered = (answer: Awaited<ReturnType<typeof post>>) => ({ status: answer.status, data: answer.body.data, acknowledged });
    const first = post([event(0), event(1)]).then(answered);
    await until(() => published.length === 1, 'the first post is published');
    const repeat = post([event(1), event(2)]).then(answered);
    await until(async () => (await metrics.eventsDuplicate.get()).values[0]?.value === 1, 'the repeat is read');
    acknowledged = true;
    brokers.resolve();
    expect(await first).toMatchObject({ status: 202, data: { accepted: 2, duplicates: 0 }, acknowledged: true });
    expect(await repeat).toMatchObject({ status: 202, data: { accepted: 1, duplicates: 1 }, acknowledged: true });
    expect(published).toEqual([['evt_unit_0', 'evt_unit_1'], ['evt_unit_2']]);
  });

  it('answers a repeat of events the brokers then refuse 503 with the first post, and publishes them again on the retry', async () => {
    const brokers = deferred();
    let attempts = 0;
    const { post, metrics } = await server({
      publish: (events) => (++attempts === 1 ? brokers.promise : Promise.resolve(void events)),
      storeTimeoutMs: 60_000,
    });
    const first = post([event(0)]);
    await until(() => attempts === 1, 'the first post is published');
    const repeat = post([event(0)]);
    await until(async () => (await metrics.eventsDuplicate.get()).values[0]?.value === 1, 'the repeat is read');
    brokers.reject(new Error('KafkaJSNumberOfRetriesExceeded'));
    expect((await first).status).toBe(503);
    expect((await repeat).status).toBe(503);
    const retry = await post([event(0)]);
    expect({ status: retry.status, data: retry.body.data }).toMatchObject({ status: 202, data: { accepted: 1, duplicates: 0 } });
    expect(attempts).toBe(2);
  });

  it('logs failing publishes as one failure: at its start with the cause, at most once a minute with a count, and once when the brokers acknowledge 10 s after the last refusal', async () => {
    const lines: { level: number; msg: string; occurrences?: number; failures?: number; err?: { message: string } }[] = [];
    const logger = createLogger('info', { write: (line: string) => void lines.push(JSON.parse(line)) });
    let clock = 0;
    let refusing = true;
    const { post } = await server(
      {
        logClock: () => clock,
        publish: async () => {
          if (refusing) throw new Error('The Kafka server does not support the requested API version');
        },
      },
      logger,
    );
    // 70 posts 1 s apart, each refused: lines at 0 s and at 60 s (60 failures since the first line).
    for (let i = 0; i < 70; i++, clock += 1_000) expect((await post([event(0)])).status).toBe(503);
    refusing = false;
    expect((await post([event(0)])).status).toBe(202);
    // Acknowledged 1 s after the last refusal: other partitions may still refuse, so not the end yet ...
    expect(lines.filter((line) => /acknowledges/.test(line.msg))).toEqual([]);
    clock += 10_000;
    // ... 10 s after it, the end.
    expect((await post([event(1)])).status).toBe(202);
    const kafkaLines = lines.filter((line) => /Kafka/.test(line.msg)).map(({ level, msg, occurrences, failures, err }) => ({ level, msg, occurrences, failures, err: err?.message }));
    expect(kafkaLines).toEqual([
      { level: 50, msg: 'producing HTTP-ingested events to Kafka failed; posts are answered 503 until the brokers acknowledge them', occurrences: 1, failures: undefined, err: 'The Kafka server does not support the requested API version' },
      { level: 50, msg: 'producing HTTP-ingested events to Kafka failed; posts are answered 503 until the brokers acknowledge them (still; logged at most once a minute)', occurrences: 60, failures: undefined, err: 'The Kafka server does not support the requested API version' },
      { level: 30, msg: 'Kafka acknowledges HTTP-ingested events again', occurrences: undefined, failures: 70, err: undefined },
    ]);
  });

  it('answers 503 when the brokers take too long, refuses posts at once until they acknowledge, and then counts the late ones as stored', async () => {
    let acknowledge!: () => void;
    let calls = 0;
    const { post } = await server({
      storeTimeoutMs: 50,
      publish: (events) => {
        calls++;
        return calls === 1 ? new Promise<void>((resolve) => (acknowledge = resolve)) : Promise.resolve(void events);
      },
    });
    expect((await post([event(0)])).status).toBe(503);
    // Still unacknowledged: the next post is refused without publishing anything.
    expect((await post([event(1)])).status).toBe(503);
    expect(calls).toBe(1);
    acknowledge();
    await new Promise((resolve) => setImmediate(resolve));
    expect((await post([event(1)])).body.data).toMatchObject({ accepted: 1 });
    // The first event reached the brokers after all: its retry is a duplicate.
    expect((await post([event(0)])).body.data).toMatchObject({ accepted: 0, duplicates: 1 });
    expect(calls).toBe(2);
  });
});

describe('HTTP ingest without Kafka: a repeat counts as a duplicate only once its rows are durable', () => {
  it('answers a retry of events still being stored 503 while they are not durable, and a duplicate once they are, never buffering them twice', async () => {
    const storage = deferred();
    const { buffer, adds } = slowBuffer(storage.promise);
    const { post } = await server({ buffer, storeTimeoutMs: 100 });
    expect((await post([event(0)])).status).toBe(503);
    // Storage is slow, not down: the rows stay buffered but are not durable, so a stop could still lose them.
    const retry = await post([event(0)]);
    expect(retry.status).toBe(503);
    expect(retry.headers['retry-after']).toBe('5');
    expect(adds).toHaveLength(1);
    storage.resolve();
    await storage.promise;
    const late = await post([event(0), event(1)]);
    expect(late.status).toBe(202);
    expect(late.body.data).toMatchObject({ accepted: 1, duplicates: 1 });
    expect(adds.map((lines) => lines.length)).toEqual([1, 1]);
  });

  it('answers a repeat posted while the first post waits 202 once the rows are durable, and takes the event once', async () => {
    const storage = deferred();
    const { buffer, adds } = slowBuffer(storage.promise);
    const { post, metrics } = await server({ buffer, storeTimeoutMs: 60_000 });
    let durable = false;
    const answered = (answer: Awaited<ReturnType<typeof post>>) => ({ status: answer.status, data: answer.body.data, durable });
    const first = post([event(0)]).then(answered);
    const repeat = post([event(0)]).then(answered);
    // Both posts are read (the repeat counted as a duplicate) before storage answers.
    await until(() => adds.length === 1, 'the first post is buffered');
    await until(async () => (await metrics.eventsDuplicate.get()).values[0]?.value === 1, 'the repeat is read');
    durable = true;
    storage.resolve();
    expect(await first).toMatchObject({ status: 202, data: { accepted: 1, duplicates: 0 }, durable: true });
    expect(await repeat).toMatchObject({ status: 202, data: { accepted: 0, duplicates: 1 }, durable: true });
    expect(adds).toHaveLength(1);
  });

  it('after an outage, answers a retry 503 while the flush holding its events is not stored yet, though the buffer is healthy again', async () => {
    const failFirstAttempt = deferred();
    const holdLaterFlush = deferred();
    const stored: string[] = [];
    let attempts = 0;
    const waiting = event(1).eventId;
    const buffer = realBuffer(async (body) => {
      const ids = idsIn(body);
      if (++attempts === 1) {
        await failFirstAttempt.promise;
        throw new Error('injected storage outage');
      }
      if (ids.includes(waiting)) await holdLaterFlush.promise;
      stored.push(...ids);
    });
    const { post } = await server({ buffer, storeTimeoutMs: 1_000 });
    const before = post([event(0)]);
    await until(() => attempts === 1, "the first post's insert has begun");
    const caught = post([event(1)]);
    await until(() => buffer.bufferedRows === 1, 'the second post waits for the next flush');
    failFirstAttempt.resolve(); // the insert fails: an outage, reported to both posts
    expect((await before).status).toBe(503);
    expect((await caught).status).toBe(503);
    await until(() => buffer.healthy && attempts === 3, "storage is back, and the second post's flush is being stored");
    const retry = await post([event(1)]);
    expect({ status: retry.status, code: retry.body.error?.code }).toEqual({ status: 503, code: 'STORAGE_UNAVAILABLE' });
    holdLaterFlush.resolve();
    await until(() => stored.includes(waiting), 'the flush is stored');
    expect((await post([event(1)])).body.data).toMatchObject({ accepted: 0, duplicates: 1 });
    expect(stored.sort()).toEqual([event(0).eventId, waiting]);
  });
});

describe('HTTP ingest without Kafka: back-pressure', () => {
  it('refuses (503) a post that would take the rows waiting for storage past maxBufferedRows, without buffering, detecting or remembering its events', async () => {
    const storage = deferred();
    let inserts = 0;
    const buffer = realBuffer(async () => (inserts++, storage.promise), { flushRows: 5, maxBufferedRows: 8 });
    const { post, detected } = await server({ buffer, maxBufferedRows: 8, storeTimeoutMs: 10_000 });
    const stored = post(events(0, 5)); // a full flush: its insert begins at once, and hangs
    await until(() => inserts === 1, 'the first insert has begun');
    const waiting = post(events(5, 5));
    await until(() => buffer.bufferedRows === 5, 'the second post waits for the next flush');
    const refused = await post(events(10, 4)); // 5 + 4 > 8
    expect({ status: refused.status, code: refused.body.error?.code, retryAfter: refused.headers['retry-after'] }).toEqual({ status: 503, code: 'STORAGE_UNAVAILABLE', retryAfter: '5' });
    expect(buffer.bufferedRows).toBe(5);
    const fits = post(events(14, 3)); // 5 + 3 = 8
    await until(() => buffer.bufferedRows === 8, 'a post that fits is buffered');
    expect(detected.flat()).toHaveLength(13);
    storage.resolve();
    for (const [answer, accepted] of [[stored, 5], [waiting, 5], [fits, 3]] as const) expect((await answer).body.data).toMatchObject({ accepted });
    // Nothing of the refused post was kept: its retry is taken, not dropped as a duplicate.
    expect((await post(events(10, 4))).body.data).toMatchObject({ accepted: 4, duplicates: 0 });
  });

  it('refuses with 400, saying why, a post of more events than the buffer may hold, and takes one of exactly that many', async () => {
    const buffer = realBuffer(async () => undefined, { flushRows: 5, maxBufferedRows: 8 });
    const { post, detected } = await server({ buffer, maxBufferedRows: 8 });
    const tooMany = await post(events(0, 9));
    expect(tooMany.status).toBe(400);
    expect(tooMany.body).toMatchObject({ code: 'VALIDATION_ERROR', details: [{ path: ['body'], message: expect.stringContaining('at most 8 events per request') }] });
    expect(tooMany.body.details[0].message).toContain('STORE_MAX_BUFFERED_ROWS');
    expect(detected).toEqual([]);
    expect((await post(events(0, 8))).body.data).toMatchObject({ accepted: 8 });
  });
});

describe('HTTP ingest without Kafka: while the worker starts', () => {
  const pending = () => new Promise<void>(() => {});

  it('waits storeTimeoutMs in all for both start-up steps (recalled ids, then detection), not for each', async () => {
    // The ids are recalled 400 ms into the post's wait; detection never starts.
    const { post, stored } = await server({ storeTimeoutMs: 600, recalled: sleep(400), detectionStarted: pending() });
    const started = performance.now();
    const refused = await post([event(0)]);
    const waitedMs = performance.now() - started;
    expect(refused).toMatchObject({ status: 503, headers: { 'retry-after': '5' } });
    expect(refused.body.error.message).toBe('Detection has not started yet on this worker; retry later');
    // 600 ms in all; each step its own 600 ms would be 1,000 ms.
    expect(waitedMs).toBeLessThan(850);
    expect(stored).toEqual([]);
  });

  it('gives a post flushWaitMs (the buffer\'s flush interval) more to be stored, and start-up no more than storeTimeoutMs', async () => {
    // Stored 300 ms after the post: past its 100 ms for storage, within the flush wait added to them.
    const { buffer } = slowBuffer(sleep(300));
    const patient = await server({ buffer, storeTimeoutMs: 100, flushWaitMs: 1_000 });
    expect((await patient.post([event(0)])).status).toBe(202);
    const impatient = await server({ buffer: slowBuffer(sleep(300)).buffer, storeTimeoutMs: 100 });
    expect((await impatient.post([event(0)])).status).toBe(503);
    // Detection never starts: refused after storeTimeoutMs, the flush wait not added.
    const starting = await server({ storeTimeoutMs: 100, flushWaitMs: 5_000, detectionStarted: pending() });
    const started = performance.now();
    expect((await starting.post([event(0)])).status).toBe(503);
    expect(performance.now() - started).toBeLessThan(1_000);
  });

  it('answers at once that detection has stopped, without waiting for it to start', async () => {
    const { post, stored } = await server({ storeTimeoutMs: 5_000, detectionStarted: pending(), detectionStopped: () => true });
    const refused = await post([event(0)]);
    expect(refused).toMatchObject({ status: 503, body: { error: { code: 'STORAGE_UNAVAILABLE', message: 'Detection has stopped on this worker; retry later' } } });
    expect(stored).toEqual([]);
  });

  it('answers a post parked on start-up as soon as the server begins to close, with Connection: close, so that its kept-alive socket does not hold the close', async () => {
    const metrics = new WorkerMetrics({ defaultMetrics: false });
    const app = createHttpServer({ logger: createLogger('silent'), metrics, version: 'test', bodyLimit: 1 << 20, notReadyReason: () => undefined });
    const { buffer, adds } = slowBuffer(Promise.resolve());
    registerHttpIngest(app, { token: TOKEN, maxEvents: 100, eventTimes: EVENT_TIME_RANGE, buffer, recentIds: new RecentEventIds(100), metrics, storeTimeoutMs: 5_000, detectionStarted: pending() });
    let parked!: () => void;
    const reachedHandler = new Promise<void>((resolve) => (parked = resolve));
    app.addHook('preHandler', async () => parked());
    await app.listen({ host: '127.0.0.1', port: 0 });
    const { port } = app.server.address() as { port: number };
    const socket = connect(port, '127.0.0.1');
    try {
      let received = '';
      socket.on('data', (chunk: Buffer) => (received += chunk.toString()));
      const socketClosed = new Promise<void>((resolve) => socket.on('close', () => resolve()));
      const body = JSON.stringify([event(0)]);
      socket.write(
        `POST /v1/ingest/events HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\nAuthorization: Bearer ${TOKEN}\r\n` +
          `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
      );
      await reachedHandler;
      // Well before the post's own deadline (5 s), and the keep-alive timeout (72 s).
      const closedInTime = await Promise.race([app.close().then(() => true), sleep(2_000).then(() => false)]);
      expect(closedInTime).toBe(true);
      await socketClosed;
      const [head, answer] = received.split('\r\n\r\n') as [string, string];
      expect(head).toMatch(/^HTTP\/1\.1 503 /);
      expect(head.toLowerCase()).toContain('\r\nconnection: close');
      expect(head.toLowerCase()).toContain('\r\nretry-after: 1');
      expect(JSON.parse(answer)).toEqual({ success: false, error: { code: 'SERVICE_UNAVAILABLE', message: 'The worker is shutting down; retry' } });
      expect(adds).toEqual([]);
    } finally {
      socket.destroy();
      await app.close();
    }
  });

  it('takes posts once detection has started, however long a post waited for it', async () => {
    let started!: () => void;
    const { post, detected } = await server({ storeTimeoutMs: 5_000, detectionStarted: new Promise<void>((resolve) => (started = resolve)) });
    const waiting = post([event(0)]);
    setTimeout(started, 100);
    expect((await waiting).body.data).toMatchObject({ accepted: 1 });
    expect((await post([event(1)])).body.data).toMatchObject({ accepted: 1 });
    expect(detected).toHaveLength(2);
  });
});
