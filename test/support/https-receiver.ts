/**
 * Real HTTPS webhook receivers on loopback for tests: a test CA made at test time with openssl,
 * server certificates for localhost / 127.0.0.1 / ::1 / receiver.test signed by it (and by a second,
 * untrusted CA), receivers that record what they get and answer as told, and a listener that only
 * counts the connections that reach it (the "internal service" SSRF tests must never touch).
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import type { IncomingHttpHeaders } from 'node:http';
import { createServer as createHttpsServer, type Server } from 'node:https';
import { createServer as createTcpServer, type AddressInfo, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export interface KeyPair {
  cert: string;
  key: string;
}

export interface TestCertificates {
  /** The test CA, trusted through WEBHOOK_CA_FILE (or the `ca` option). */
  caFile: string;
  caPem: string;
  /** Signed by the test CA, for localhost, receiver.test, 127.0.0.1 and ::1. */
  server: KeyPair;
  /** Same names, signed by a CA nobody trusts. */
  untrusted: KeyPair;
  remove(): void;
}

const SERVER_NAMES = 'subjectAltName=DNS:localhost,DNS:receiver.test,IP:127.0.0.1,IP:::1';

export function makeTestCertificates(): TestCertificates {
  const dir = mkdtempSync(join(tmpdir(), 'sc-webhook-ca-'));
  const openssl = (...args: string[]) => execFileSync('openssl', args, { cwd: dir, stdio: 'pipe' });
  const makeCa = (name: string) =>
    openssl('req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-days', '2',
      '-keyout', `${name}.key`, '-out', `${name}.crt`, '-subj', `/CN=${name}`,
      '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign');
  const makeServer = (name: string, ca: string): KeyPair => {
    writeFileSync(join(dir, `${name}.ext`), `${SERVER_NAMES}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n`);
    openssl('req', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-keyout', `${name}.key`, '-out', `${name}.csr`, '-subj', '/CN=localhost');
    openssl('x509', '-req', '-in', `${name}.csr`, '-CA', `${ca}.crt`, '-CAkey', `${ca}.key`, '-CAcreateserial', '-days', '2',
      '-out', `${name}.crt`, '-extfile', `${name}.ext`);
    return { cert: readFileSync(join(dir, `${name}.crt`), 'utf8'), key: readFileSync(join(dir, `${name}.key`), 'utf8') };
  };
  makeCa('test-ca');
  makeCa('untrusted-ca');
  return {
    caFile: join(dir, 'test-ca.crt'),
    caPem: readFileSync(join(dir, 'test-ca.crt'), 'utf8'),
    server: makeServer('server', 'test-ca'),
    untrusted: makeServer('untrusted', 'untrusted-ca'),
    remove: () => rmSync(dir, { recursive: true, force: true }),
  };
}

export interface ReceivedRequest {
  method: string;
  path: string;
  headers: IncomingHttpHeaders;
  /** The raw body, as a receiver must verify it. */
  rawBody: string;
}

/** What the receiver answers: a status (with optional headers), or 'hang' to never answer. */
export type Answer = number | { status: number; headers?: Record<string, string> } | 'hang';

export interface Receiver {
  readonly port: number;
  /** https://<host>:<port> */
  readonly origin: string;
  readonly received: ReceivedRequest[];
  /** TCP connections accepted so far. */
  connections(): number;
  /** Changes how the receiver answers from now on. */
  answer(how: Answer | ((request: ReceivedRequest) => Answer)): void;
  close(): Promise<void>;
}

export async function startReceiver(keys: KeyPair, options: { host?: string; answer?: Answer } = {}): Promise<Receiver> {
  const host = options.host ?? '127.0.0.1';
  const received: ReceivedRequest[] = [];
  const sockets = new Set<Socket>();
  let connections = 0;
  let decide: (request: ReceivedRequest) => Answer = () => options.answer ?? 200;
  const server: Server = createHttpsServer({ ...keys, minVersion: 'TLSv1.2' }, (req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => {
      const request = { method: req.method ?? '', path: req.url ?? '', headers: req.headers, rawBody: Buffer.concat(chunks).toString('utf8') };
      received.push(request);
      const how = decide(request);
      if (how === 'hang') return;
      const { status, headers } = typeof how === 'number' ? { status: how, headers: {} } : how;
      res.writeHead(status, headers).end('ok');
    });
  });
  server.on('connection', (socket: Socket) => {
    connections++;
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
  });
  server.on('tlsClientError', () => undefined); // a client refusing our certificate is what some tests want
  await new Promise<void>((resolve) => server.listen(0, host, resolve));
  const port = (server.address() as AddressInfo).port;
  return {
    port,
    origin: `https://${host.includes(':') ? `[${host}]` : host}:${port}`,
    received,
    connections: () => connections,
    answer(how) {
      decide = typeof how === 'function' ? how : () => how;
    },
    async close() {
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

export interface InternalListener {
  readonly port: number;
  /** Connections accepted, over IPv4 and IPv6 loopback. */
  accepted(): number;
  close(): Promise<void>;
}

/**
 * A stand-in for an internal service: listens on the same port on 127.0.0.1 and ::1 and counts every
 * connection it accepts (it never answers). SSRF tests assert that count stays 0.
 */
export async function startInternalListener(): Promise<InternalListener> {
  let accepted = 0;
  const sockets = new Set<Socket>();
  const onConnection = (socket: Socket) => {
    accepted++;
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
  };
  const v4 = createTcpServer(onConnection);
  await new Promise<void>((resolve) => v4.listen(0, '127.0.0.1', resolve));
  const port = (v4.address() as AddressInfo).port;
  const v6 = createTcpServer(onConnection);
  await new Promise<void>((resolve, reject) => v6.once('error', reject).listen(port, '::1', resolve));
  return {
    port,
    accepted: () => accepted,
    async close() {
      for (const socket of sockets) socket.destroy();
      await Promise.all([v4, v6].map((server) => new Promise<void>((resolve) => server.close(() => resolve()))));
    },
  };
}
