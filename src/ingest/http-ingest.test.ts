import type { FastifyInstance } from 'fastify';
import { afterEach, describe, expect, it } from 'vitest';
import { makeEvent } from '../../test/support/events.ts';
import { EVENT_TIME_RANGE, type RequestEvent } from '../events/request-event.ts';
import { createHttpServer } from '../http/server.ts';
import { createLogger } from '../logger.ts';
import { WorkerMetrics } from '../metrics.ts';
import type { EventBuffer } from './event-buffer.ts';
import { registerHttpIngest, type HttpIngestOptions } from './http-ingest.ts';
import { RecentEventIds } from './recent-event-ids.ts';

const TOKEN = 'unit-test-ingest-token-0123';

const event = (i: number) => makeEvent(i, { runId: 'unit', startMs: Date.UTC(2026, 10, 21, 10, 0, 0), keys: 2 });

/** Valid events, one that fails the schema, one that carries a secret, and a repeat of the first. */
const MIXED = [event(0), event(1), { ...event(2), status: 'ok' }, { ...event(3), userAgent: 'sdk sk_live_abcdefgh12345678' }, event(0)];

const apps: FastifyInstance[] = [];
afterEach(async () => {
  for (const app of apps.splice(0)) await app.close();
});

/** A server with HTTP ingest, storing directly (a buffer that takes everything) or publishing through `publish`. */
async function server(options: Partial<HttpIngestOptions> = {}) {
  const metrics = new WorkerMetrics({ defaultMetrics: false });
  const stored: string[][] = [];
  const detected: RequestEvent[][] = [];
  const app = createHttpServer({ logger: createLogger('silent'), metrics, version: 'test', bodyLimit: 1 << 20, notReadyReason: () => undefined });
  const buffer = {
    healthy: true,
    add: async ({ lines }: { lines: string[] }) => void stored.push(lines),
    onOutage: () => () => undefined,
  } as unknown as EventBuffer;
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

  it('refuses a JSON string, which is not NDJSON however it reads', async () => {
    const app = await server();
    const answer = await send(app, JSON.stringify(JSON.stringify(event(0))), 'application/json; charset=utf-8', `Bearer ${TOKEN}`);
    expect(answer.status).toBe(400);
    expect(JSON.stringify(answer.body)).toContain('expected a JSON array of events, one event object, or NDJSON');
    expect(app.stored).toEqual([]);
    // The same text as NDJSON is one event.
    expect((await send(app, JSON.stringify(event(0)), 'application/x-ndjson', `Bearer ${TOKEN}`)).body.data).toMatchObject({ accepted: 1 });
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
