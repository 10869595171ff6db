import { connect } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { createLogger } from '../logger.ts';
import { WorkerMetrics } from '../metrics.ts';
import { createHttpServer } from './server.ts';

const closers: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const close of closers.splice(0)) await close();
});

describe('the HTTP server while it closes', () => {
  it('lets a running request finish and turns a new one on the same connection away in Format A with Retry-After', async () => {
    const app = createHttpServer({ logger: createLogger('silent'), metrics: new WorkerMetrics({ defaultMetrics: false }), version: 'test', bodyLimit: 1024, notReadyReason: () => undefined });
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
