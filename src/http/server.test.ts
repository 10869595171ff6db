import { connect } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { createLogger } from '../logger.ts';
import { WorkerMetrics } from '../metrics.ts';
import { createHttpServer } from './server.ts';

const closers: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const close of closers.splice(0).reverse()) await close(); // the last opened first: sockets before their server
});

function newServer(options: { requestTimeoutMs?: number } = {}) {
  return createHttpServer({ logger: createLogger('silent'), metrics: new WorkerMetrics({ defaultMetrics: false }), version: 'test', bodyLimit: 1024, notReadyReason: () => undefined, ...options });
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

/** Waits for the first of `promise` and `ms` milliseconds; says which came first. */
function settlesWithin(promise: Promise<unknown>, ms: number): Promise<boolean> {
  return Promise.race([promise.then(() => true), new Promise<boolean>((resolve) => setTimeout(() => resolve(false), ms))]);
}

/** A raw client socket, to see the exact response heads and whether the server ends the connection. */
function rawSocket(port: number) {
  const socket = connect(port, '127.0.0.1');
  let received = '';
  socket.on('data', (chunk: Buffer) => (received += chunk.toString()));
  const endedByServer = new Promise<void>((resolve) => socket.on('end', () => resolve()));
  closers.push(async () => void socket.destroy());
  return {
    send: (path: string) => socket.write(`GET ${path} HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n`),
    write: (text: string) => socket.write(text),
    received: () => received,
    endedByServer,
  };
}

/** The responses with a body that `socket` has received, once there are `count` of them or after 2 s. */
async function responses(socket: ReturnType<typeof rawSocket>, count: number): Promise<{ head: string; body: string }[]> {
  const parse = () =>
    socket
      .received()
      .split(/(?=HTTP\/1\.1 )/)
      .map((response) => response.split('\r\n\r\n') as [string, string])
      .filter(([, body]) => body)
      .map(([head, body]) => ({ head: head.toLowerCase(), body }));
  const deadline = Date.now() + 2_000;
  while (parse().length < count && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 5));
  return parse();
}

describe('the HTTP server with a client that does not finish, or leaves Host out', () => {
  /** A listening server with an /echo route (a request timeout of 300 ms), and its port. */
  async function listening() {
    const app = newServer({ requestTimeoutMs: 300 });
    app.post('/echo', async (request) => request.body);
    await app.listen({ host: '127.0.0.1', port: 0 });
    closers.push(() => app.close());
    return (app.server.address() as { port: number }).port;
  }

  it('answers a request whose body has not all arrived in time with 408 REQUEST_TIMEOUT in Format A, and closes it', async () => {
    const socket = rawSocket(await listening());
    socket.write('POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"status"');
    // Node looks for requests past their time every connectionsCheckingInterval (here 300 ms).
    expect(await settlesWithin(socket.endedByServer, 3_000)).toBe(true);
    const [response] = await responses(socket, 1);
    expect(response!.head).toMatch(/^http\/1\.1 408 /);
    expect(JSON.parse(response!.body)).toEqual({ success: false, error: { code: 'REQUEST_TIMEOUT', message: expect.any(String) } });
  });

  it('keeps the connection of a post whose body it read, and of one answered before its body arrived once the body has', async () => {
    const socket = rawSocket(await listening());
    const post = (path: string, body: string, sent = body) =>
      socket.write(`POST ${path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${sent}`);
    post('/echo', '{"a":1}');
    const [read] = await responses(socket, 1);
    expect(read!.head).toMatch(/^http\/1\.1 200 /);
    expect(read!.head).toContain('connection: keep-alive');
    // Answered 404 on its head alone; the rest of its body follows, then the next request.
    post('/nowhere', '{"status":"late"}', '{"status"');
    await responses(socket, 2);
    socket.write(':"late"}');
    socket.send('/health');
    const answers = await responses(socket, 3);
    expect(answers.map((answer) => answer.head.slice(0, 12))).toEqual(['http/1.1 200', 'http/1.1 404', 'http/1.1 200']);
    expect(answers[2]!.head).toContain('connection: keep-alive');
  });

  it('closes, with no second answer, a request answered before its body arrived whose body then never comes', async () => {
    const socket = rawSocket(await listening());
    socket.write('POST /nowhere HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"status"');
    expect(await settlesWithin(socket.endedByServer, 3_000)).toBe(true);
    // (A second answer would follow the first's body on the same line.)
    expect(socket.received().match(/HTTP\/1\.1 \d{3}/g)).toEqual(['HTTP/1.1 404']);
  });

  it('answers an HTTP/1.1 request without Host with 400 BAD_REQUEST in Format A, and takes one of HTTP/1.0 without it', async () => {
    const port = await listening();
    const noHost = rawSocket(port);
    noHost.write('GET /health HTTP/1.1\r\nConnection: close\r\n\r\n');
    const [refused] = await responses(noHost, 1);
    expect(refused!.head).toMatch(/^http\/1\.1 400 /);
    expect(JSON.parse(refused!.body)).toEqual({ success: false, error: { code: 'BAD_REQUEST', message: 'The request has no Host header' } });
    const http10 = rawSocket(port);
    http10.write('GET /health HTTP/1.0\r\n\r\n');
    const [answered] = await responses(http10, 1);
    expect(answered!.head).toMatch(/^http\/1\.1 200 /);
    expect(JSON.parse(answered!.body)).toMatchObject({ status: 'ok' });
  });

  it('answers 417 EXPECTATION_FAILED in Format A, not Node\'s bare 417', async () => {
    const port = await listening();
    const socket = rawSocket(port);
    socket.write('POST /v1/ingest/events HTTP/1.1\r\nHost: x\r\nExpect: nonsense\r\nContent-Length: 2\r\n\r\n[]');
    const [answer] = await responses(socket, 1);
    expect(answer!.head).toMatch(/^http\/1\.1 417 /);
    expect(JSON.parse(answer!.body)).toEqual({ success: false, error: { code: 'EXPECTATION_FAILED', message: 'The only Expect header taken is 100-continue' } });
  });
});

describe('the HTTP server while it closes', () => {
  it('answers a request running when close() begins, with Connection: close, so that its kept-alive socket does not hold close()', async () => {
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
    const socket = rawSocket((app.server.address() as { port: number }).port);

    socket.send('/slow');
    await running;
    const closed = app.close();
    // The request ends only once close() has begun: the server no longer listens.
    while (app.server.listening) await new Promise((resolve) => setTimeout(resolve, 5));
    release();

    // With keep-alive instead, the socket would stay open for Fastify's 72 s, and close() with it.
    expect(await settlesWithin(closed, 1_000)).toBe(true);
    expect(await settlesWithin(socket.endedByServer, 1_000)).toBe(true);
    const [response] = await responses(socket, 1);
    expect(response!.head).toMatch(/^http\/1\.1 200 /);
    expect(response!.head).toContain('connection: close');
    expect(JSON.parse(response!.body)).toEqual({ done: true });
  });

  it('turns a request arriving on a kept-alive connection once close() has begun away in Format A with Retry-After', async () => {
    const app = newServer();
    // Holds close() between its start and the server's own close, as a slow part's preClose would.
    let entered!: () => void;
    const closing = new Promise<void>((resolve) => (entered = resolve));
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    app.addHook('preClose', async () => {
      entered();
      await released;
    });
    await app.listen({ host: '127.0.0.1', port: 0 });
    closers.push(() => app.close());
    const socket = rawSocket((app.server.address() as { port: number }).port);
    socket.send('/health');
    const [before] = await responses(socket, 1);
    expect(before!.head).toMatch(/^http\/1\.1 200 /);
    expect(before!.head).toContain('connection: keep-alive');

    const closed = app.close();
    await closing;
    socket.send('/health');
    const [, refused] = await responses(socket, 2);
    release();
    await closed;

    expect(refused!.head).toMatch(/^http\/1\.1 503 /);
    expect(refused!.head).toContain('retry-after: 1');
    expect(refused!.head).toContain('connection: close');
    expect(JSON.parse(refused!.body)).toEqual({ success: false, error: { code: 'SERVICE_UNAVAILABLE', message: 'The worker is shutting down; retry' } });
    expect(await settlesWithin(socket.endedByServer, 1_000)).toBe(true);
  });
});
