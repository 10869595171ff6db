/**
 * One attempt against real HTTPS servers on loopback, with a test CA made at test time. Loopback is
 * reached only through allowPrivate (the tests' setting); with it off, the same servers are refused.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  makeTestCertificates,
  startInternalListener,
  startReceiver,
  type InternalListener,
  type Receiver,
  type TestCertificates,
} from '../../test/support/https-receiver.ts';
import { freePort } from '../../test/support/ports.ts';
import { hostileResolver, hostileTargets } from '../../test/support/ssrf-targets.ts';
import { sendWebhook, type SendOptions } from './sender.ts';
import { targetPolicy, type Resolver } from './target-policy.ts';
import { signWebhook, verifyWebhook } from './verify.ts';

const SECRET = 'whsec_sender_test_secret_0123456789abcdef';
const BODY = JSON.stringify({ event: 'anomaly.alert.critical', alertId: 'a', merchantId: 'm', data: {}, timestamp: '2026-11-21T10:00:00.000Z' });

let certs: TestCertificates;
let receiver: Receiver;
let untrusted: Receiver;
let internal: InternalListener;

beforeAll(async () => {
  certs = makeTestCertificates();
  receiver = await startReceiver(certs.server);
  untrusted = await startReceiver(certs.untrusted);
  internal = await startInternalListener();
});

afterAll(async () => {
  await Promise.all([receiver.close(), untrusted.close(), internal.close()]);
  certs.remove();
});

const testResolver: Resolver = async (hostname) => {
  if (hostname === 'receiver.test' || hostname === 'localhost') return [{ address: '127.0.0.1', family: 4 }];
  throw Object.assign(new Error('ENOTFOUND'), { code: 'ENOTFOUND' });
};

function options(overrides: Partial<SendOptions> = {}): SendOptions {
  return { policy: targetPolicy({ allowPrivate: true, resolve: testResolver }), ca: [certs.caPem], ...overrides };
}

function message(url: string, timestamp = Date.now()) {
  const id = crypto.randomUUID();
  return { url, body: BODY, headers: { 'svc-id': id, 'svc-timestamp': String(timestamp), 'svc-signature': signWebhook(SECRET, id, timestamp, BODY) } };
}

describe('sendWebhook', () => {
  it('delivers over TLS to a name, with the body and headers a receiver can verify', async () => {
    receiver.answer(204);
    const before = receiver.received.length;
    const sent = message(`https://receiver.test:${receiver.port}/hooks/critical?team=sec`);
    const result = await sendWebhook(sent, options());
    expect(result).toMatchObject({ outcome: 'delivered', statusCode: 204 });
    const got = receiver.received[before]!;
    expect(got).toMatchObject({ method: 'POST', path: '/hooks/critical?team=sec', rawBody: BODY });
    expect(got.headers['content-type']).toBe('application/json');
    expect(verifyWebhook({ secret: SECRET, rawBody: got.rawBody, headers: got.headers }).id).toBe(sent.headers['svc-id']);
  });

  it.each([
    [500, 'http_error'],
    [404, 'http_error'],
    [429, 'http_error'],
  ] as const)('counts %s as a failure', async (status, outcome) => {
    receiver.answer(status);
    expect(await sendWebhook(message(`${receiver.origin}/x`), options())).toMatchObject({ outcome, statusCode: status });
  });

  it('does not follow a redirect to an internal address: a 3xx is a failure', async () => {
    const internalUrl = `https://127.0.0.1:${internal.port}/admin`;
    receiver.answer({ status: 302, headers: { location: internalUrl } });
    const result = await sendWebhook(message(`${receiver.origin}/x`), options());
    expect(result).toMatchObject({ outcome: 'http_error', statusCode: 302 });
    expect(result.error).toMatch(/redirects are not followed/);
    expect(internal.accepted()).toBe(0);
  });

  it('times out when the receiver does not answer', async () => {
    receiver.answer('hang');
    const result = await sendWebhook(message(`${receiver.origin}/x`), options({ requestTimeoutMs: 300 }));
    expect(result.outcome).toBe('timeout');
    expect(result.durationMs).toBeGreaterThanOrEqual(250);
    expect(result.durationMs).toBeLessThan(5_000);
  });

  it('times out a connection that never completes the TLS handshake', async () => {
    // A listener that accepts TCP and never speaks: only the connect timeout can end this.
    const silent = await startInternalListener();
    try {
      const result = await sendWebhook(message(`https://127.0.0.1:${silent.port}/x`), options({ connectTimeoutMs: 300, requestTimeoutMs: 5_000 }));
      expect(result).toMatchObject({ outcome: 'timeout' });
      expect(result.error).toMatch(/no TLS connection/);
      expect(result.durationMs).toBeLessThan(2_000);
      expect(silent.accepted()).toBe(1);
    } finally {
      await silent.close();
    }
  });

  it('reports a refused connection', async () => {
    const result = await sendWebhook(message(`https://127.0.0.1:${await freePort()}/x`), options());
    expect(result.outcome).toBe('connect_error');
    expect(result.error).toMatch(/ECONNREFUSED/);
  });

  it('refuses a certificate from a CA it does not trust', async () => {
    const result = await sendWebhook(message(`${untrusted.origin}/x`), options());
    expect(result.outcome).toBe('tls_error');
    expect(untrusted.received).toHaveLength(0);
  });

  it('refuses the test CA itself when it is not configured (only the bundled roots)', async () => {
    const result = await sendWebhook(message(`${receiver.origin}/x`), options({ ca: undefined }));
    expect(result.outcome).toBe('tls_error');
  });

  it('refuses a certificate for another name', async () => {
    const resolve: Resolver = async () => [{ address: '127.0.0.1', family: 4 }];
    const result = await sendWebhook(message(`https://other.test:${receiver.port}/x`), options({ policy: targetPolicy({ allowPrivate: true, resolve }) }));
    expect(result.outcome).toBe('tls_error');
  });

  it('without WEBHOOK_ALLOW_PRIVATE_TARGETS, refuses the loopback receiver before connecting', async () => {
    const connections = receiver.connections();
    const strict = options({ policy: targetPolicy({ resolve: testResolver }) });
    expect(await sendWebhook(message(`${receiver.origin}/x`), strict)).toMatchObject({ outcome: 'blocked_target' });
    expect(await sendWebhook(message(`https://receiver.test:${receiver.port}/x`), strict)).toMatchObject({ outcome: 'blocked_target' });
    expect(receiver.connections()).toBe(connections);
  });
});

describe('sendWebhook refuses every hostile target, and none reaches the internal listener', () => {
  const resolve = hostileResolver();
  // The rebinding name needs the registration-time question asked first.
  beforeAll(async () => void (await resolve('rebind.example')));

  it.each(hostileTargets(0).map((target) => target.name))('%s', async (name) => {
    const target = hostileTargets(internal.port).find((candidate) => candidate.name === name)!;
    const result = await sendWebhook(message(target.url), { policy: targetPolicy({ resolve }), ca: [certs.caPem] });
    expect(result.outcome).toBe('blocked_target');
    expect(internal.accepted()).toBe(0);
  });
});
