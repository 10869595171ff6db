import { connect } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { createLogger } from '../logger.ts';
import { WorkerMetrics } from '../metrics.ts';
import { createHttpServer } from './server.ts';

const closers: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const close of closers.splice(0)) await close();
});

function newServer() {
  return createHttpServer({ logger: createLogger('silent'), metrics: new WorkerMetrics({ defaultMetrics: false }), version: 'test', bodyLimit: 1024, notReadyReason: () => undefined });
}

describe('the HTTP server on a path no route serves', () => {
  it('answers 404 NOT_FOUND in Format A whatever the method and body, before the body is parsed', async () => {
    const app = newServer();
    app.post('/echo', async (request) => request.body);
    closers.push(() => app.close());
    const json = { 'content-type': 'application/json' };
    const requests: { method: 'GET' | 'PATCH' | 'POST' | 'DELETE' | 'OPTIONS'; url: string; headers?: Record<string, string>; payload?: string }[] = [
      { method: 'GET', url: '/nowhere' },
      { method: 'OPTIONS', url: '/nowhere' },
      // Bodies the JSON parser refuses: they must not turn the 404 into its 400.
      { method: 'PATCH', url: '/admin/anomaly/alerts/x', headers: json, payload: '' },
      { method: 'POST', url: '/v1/nowhere', headers: json, payload: '{"status":' },
      { method: 'DELETE', url: '/nowhere', headers: json, payload: '' },
      { method: 'POST', url: '/nowhere', headers: { 'content-type': 'application/x-unknown' }, payload: 'x' },
    ];
    for (const request of requests) {
      const response = await app.inject(request);
      expect({ ...request, status: response.statusCode, body: response.json() }).toEqual({
        ...request,
        status: 404,
        body: { success: false, error: { code: 'NOT_FOUND', message: 'Not found' } },
      });
    }
    // HEAD: a GET route still answers it, an unknown path is 404 (with no body, as for any HEAD).
    expect((await app.inject({ method: 'HEAD', url: '/health' })).statusCode).toBe(200);
    const head = await app.inject({ method: 'HEAD', url: '/nowhere' });
    expect({ status: head.statusCode, body: head.body }).toEqual({ status: 404, body: '' });
    // A route that exists still has its body parsed, and refused when malformed.
    expect((await app.inject({ method: 'POST', url: '/echo', headers: json, payload: '{"status":' })).statusCode).toBe(400);
    expect((await app.inject({ method: 'POST', url: '/echo', headers: json, payload: '{"a":1}' })).json()).toEqual({ a: 1 });
  });
});

describe('the HTTP server while it closes', () => {
  it('lets a running request finish and turns a new one on the same connection away in Format A with Retry-After', async () => {
    const app = newServer();
    let entered!: () => void;
    const running = new Promise<void>((resolve) => (entered = resolve));
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    app.get('/slow', async () => {
      entered();
      await released;
      return { done: true };
    });
    await app.listen({ host: '127.0.0.1', port: 0 });
    closers.push(() => app.close());
    const { port } = app.server.address() as { port: number };

    const socket = connect(port, '127.0.0.1');
    let received = '';
    socket.on('data', (chunk: Buffer) => (received += chunk.toString()));
    const ended = new Promise<void>((resolve) => socket.on('close', () => resolve()));
    socket.write('GET /slow HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n');
    await running;
    const closed = app.close();
    // A kept-alive connection's next request, sent once close() has begun.
    socket.write('GET /health HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n');
    await new Promise((resolve) => setTimeout(resolve, 50));
    release();
    await closed;
    await ended;

    const responses = received.split(/(?=HTTP\/1\.1 )/);
    expect(responses).toHaveLength(2);
    expect(responses[0]).toMatch(/^HTTP\/1\.1 200 /);
    expect(responses[0]).toContain('{"done":true}');
    const [head, body] = responses[1]!.split('\r\n\r\n') as [string, string];
    expect(head).toMatch(/^HTTP\/1\.1 503 /);
    expect(head.toLowerCase()).toContain('retry-after: 1');
    expect(head.toLowerCase()).toContain('connection: close');
    expect(JSON.parse(body)).toEqual({ success: false, error: { code: 'SERVICE_UNAVAILABLE', message: 'The worker is shutting down; retry' } });
  });
});
