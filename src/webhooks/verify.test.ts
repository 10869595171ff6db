import { execFile } from 'node:child_process';
import { createHmac } from 'node:crypto';
import { existsSync, statSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { createContext, runInContext } from 'node:vm';
import { describe, expect, it } from 'vitest';
import { signWebhook, verifyWebhook, WebhookVerificationError, type VerifyOptions } from './verify.ts';

const SECRET = 'whsec_test_0123456789abcdefghijklmnopqrstuv';
const ID = '2f1c4b1e-8d7a-4c55-9a57-0d8f3b0e6a11';
const NOW = Date.UTC(2026, 10, 21, 10, 0, 0);
const BODY = '{"event":"anomaly.alert.critical","alertId":"a1","merchantId":"m_1","data":{},"timestamp":"2026-11-21T10:00:00.000Z"}';

function signed(overrides: Partial<VerifyOptions> = {}, headerOverrides: Record<string, string | undefined> = {}): VerifyOptions {
  return {
    secret: SECRET,
    rawBody: BODY,
    now: NOW,
    headers: {
      'svc-id': ID,
      'svc-timestamp': String(NOW),
      'svc-signature': signWebhook(SECRET, ID, NOW, BODY),
      ...headerOverrides,
    },
    ...overrides,
  };
}

function failure(options: VerifyOptions): WebhookVerificationError {
  try {
    verifyWebhook(options);
  } catch (error) {
    if (error instanceof WebhookVerificationError) return error;
    throw error;
  }
  throw new Error('verification passed');
}

/** The same signature bytes in a base64 that is not canonical: the last character before the padding with its two unused bits changed. */
function withUnusedBitsSet(signature: string): string {
  const alphabet = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/';
  const at = signature.length - 2; // 32 bytes: 43 characters and one '='; the 43rd holds 4 bits of data
  const changed = alphabet[alphabet.indexOf(signature[at]!) ^ 0b01]!;
  const result = signature.slice(0, at) + changed + signature.slice(at + 1);
  // The same bytes, decoded leniently.
  expect(Buffer.from(result.slice(3), 'base64')).toEqual(Buffer.from(signature.slice(3), 'base64'));
  return result;
}

describe('signWebhook', () => {
  it('is v1, base64 of HMAC-SHA256(secret, "<id>.<timestamp>.<raw body>") (contracts section 4)', () => {
    const expected = createHmac('sha256', SECRET).update(`${ID}.${NOW}.${BODY}`).digest('base64');
    expect(signWebhook(SECRET, ID, String(NOW), BODY)).toBe(`v1,${expected}`);
    expect(signWebhook(SECRET, ID, NOW, Buffer.from(BODY))).toBe(`v1,${expected}`);
  });
});

describe('the README test vector', () => {
  it('signs and verifies as documented', () => {
    const secret = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
    const id = '6f1c0e7a-3d5e-4b8f-9a51-2c7d8e9f0a1b';
    const body =
      '{"event":"anomaly.alert.critical","alertId":"0b6d9c52-6a1e-4f0e-9d43-8d2f1c7a5e10","merchantId":"m_123","data":{},"timestamp":"2026-11-21T10:00:00.123Z"}';
    const signature = 'v1,sAkLxPIBp/bpYhBefjPw9a98YWlhdritez3EYO5mXGs=';
    expect(signWebhook(secret, id, '1795257600123', body)).toBe(signature);
    const headers = { 'svc-id': id, 'svc-timestamp': '1795257600123', 'svc-signature': signature };
    expect(verifyWebhook({ secret, rawBody: body, headers, now: 1795257600123 }).id).toBe(id);
  });
});

describe('verifyWebhook', () => {
  it('accepts a signed delivery and returns its id and timestamp', () => {
    expect(verifyWebhook(signed())).toEqual({ id: ID, timestamp: NOW });
  });

  it('accepts a raw Buffer body, a fetch Headers object, and mixed-case header names', () => {
    const headers = new Headers({ 'svc-id': ID, 'svc-timestamp': String(NOW), 'svc-signature': signWebhook(SECRET, ID, NOW, BODY) });
    expect(verifyWebhook({ ...signed(), rawBody: Buffer.from(BODY), headers }).id).toBe(ID);
    const mixed = { 'Svc-Id': ID, 'SVC-Timestamp': String(NOW), 'Svc-Signature': signWebhook(SECRET, ID, NOW, BODY) };
    expect(verifyWebhook({ ...signed(), headers: mixed }).id).toBe(ID);
  });

  it('accepts a timestamp up to five minutes off either way', () => {
    expect(() => verifyWebhook(signed({ now: NOW + 5 * 60_000 }))).not.toThrow();
    expect(() => verifyWebhook(signed({ now: NOW - 5 * 60_000 }))).not.toThrow();
  });

  it.each([
    ['a tampered body', signed({ rawBody: BODY.replace('m_1', 'm_2') }), 'invalid_signature', 401],
    ['a body re-serialized after parsing', signed({ rawBody: JSON.stringify(JSON.parse(BODY), null, 1) }), 'invalid_signature', 401],
    ['the wrong secret', signed({ secret: `${SECRET}x` }), 'invalid_signature', 401],
    ['another message id', signed({}, { 'svc-id': 'other' }), 'invalid_signature', 401],
    ['a timestamp changed after signing', signed({ now: NOW + 1 }, { 'svc-timestamp': String(NOW + 1) }), 'invalid_signature', 401],
    ['a signature of another version', signed({}, { 'svc-signature': signWebhook(SECRET, ID, NOW, BODY).replace('v1,', 'v2,') }), 'invalid_signature', 401],
    ['a truncated signature', signed({}, { 'svc-signature': signWebhook(SECRET, ID, NOW, BODY).slice(0, -4) }), 'invalid_signature', 401],
    ['a signature that is not base64', signed({}, { 'svc-signature': 'v1,not base64!' }), 'invalid_signature', 401],
    ['a signature without its padding', signed({}, { 'svc-signature': signWebhook(SECRET, ID, NOW, BODY).replace(/=+$/, '') }), 'invalid_signature', 401],
    ['a signature with extra padding', signed({}, { 'svc-signature': `${signWebhook(SECRET, ID, NOW, BODY)}==` }), 'invalid_signature', 401],
    ['a signature whose last character differs in its unused bits only', signed({}, { 'svc-signature': withUnusedBitsSet(signWebhook(SECRET, ID, NOW, BODY)) }), 'invalid_signature', 401],
    ['a timestamp older than five minutes', signed({ now: NOW + 5 * 60_000 + 1 }), 'stale_timestamp', 400],
    ['a timestamp from the future', signed({ now: NOW - 5 * 60_000 - 1 }), 'stale_timestamp', 400],
    ['a timestamp in seconds, not milliseconds', signed({}, { 'svc-timestamp': String(NOW / 1000) }), 'stale_timestamp', 400],
    ['a timestamp that is not a number', signed({}, { 'svc-timestamp': '2026-11-21T10:00:00Z' }), 'invalid_timestamp', 400],
    ['no svc-id', signed({}, { 'svc-id': undefined }), 'missing_header', 400],
    ['no svc-timestamp', signed({}, { 'svc-timestamp': undefined }), 'missing_header', 400],
    ['no svc-signature', signed({}, { 'svc-signature': undefined }), 'missing_header', 400],
    ['an empty svc-signature', signed({}, { 'svc-signature': '' }), 'missing_header', 400],
  ] as const)('rejects %s', (_name, options, reason, status) => {
    const error = failure(options);
    expect(error.reason).toBe(reason);
    expect(error.status).toBe(status);
    expect(error.message).not.toContain(SECRET);
  });
});

describe('verifyWebhook and a receiver\'s own mistakes', () => {
  it('accepts bodies made in another realm (a vm context, as Jest\'s environment makes them)', () => {
    const bytes = [...new TextEncoder().encode(BODY)];
    const context = createContext({ bytes });
    const view = runInContext('new Uint8Array(bytes)', context) as Uint8Array;
    const buffer = runInContext('new Uint8Array(bytes).buffer', context) as ArrayBuffer;
    expect(view instanceof Uint8Array).toBe(false);
    expect(verifyWebhook({ ...signed(), rawBody: view }).id).toBe(ID);
    expect(verifyWebhook({ ...signed(), rawBody: buffer }).id).toBe(ID);
  });

  it('accepts the body as fetch\'s arrayBuffer() gives it', () => {
    const bytes = new TextEncoder().encode(BODY);
    expect(verifyWebhook({ ...signed(), rawBody: bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength) as ArrayBuffer }).id).toBe(ID);
  });

  it.each([
    ['an empty secret (an unset variable), even with a signature made with it', { ...signed({}, { 'svc-signature': signWebhook('', ID, NOW, BODY) }), secret: '' }, /secret/],
    ['a parsed body', { ...signed(), rawBody: JSON.parse(BODY) }, /rawBody/],
    ['no headers', { ...signed(), headers: null }, /headers/],
    ['a clock that is not a number', { ...signed(), now: Number.NaN }, /now/],
    ['a tolerance that is not a number, which would turn the freshness check off', { ...signed({ now: NOW + 10 * 60_000 }), toleranceMs: Number.NaN }, /toleranceMs/],
  ])('throws a TypeError for %s, never accepting', (_name, options, message) => {
    expect(() => verifyWebhook(options as unknown as VerifyOptions)).toThrow(TypeError);
    expect(() => verifyWebhook(options as unknown as VerifyOptions)).toThrow(message);
  });
});

describe('the package export for receivers (security-center-worker/webhooks/verify)', () => {
  const root = fileURLToPath(new URL('../../', import.meta.url));
  const source = fileURLToPath(new URL('./verify.ts', import.meta.url));
  const built = fileURLToPath(new URL('../../dist/webhooks/verify.js', import.meta.url));

  // A receiver's module: plain JavaScript, signs the way the worker does with node:crypto alone, and
  // imports the verifier by the package name (Node resolves a package's own name through "exports").
  const receiver = `
    import { createHmac } from 'node:crypto';
    import { verifyWebhook, WebhookVerificationError } from 'security-center-worker/webhooks/verify';
    const secret = ${JSON.stringify(SECRET)};
    const id = ${JSON.stringify(ID)};
    const timestamp = String(Date.now());
    const body = ${JSON.stringify(BODY)};
    const signature = 'v1,' + createHmac('sha256', secret).update(id + '.' + timestamp + '.' + body).digest('base64');
    const headers = { 'svc-id': id, 'svc-timestamp': timestamp, 'svc-signature': signature };
    const accepted = verifyWebhook({ secret, rawBody: Buffer.from(body), headers });
    let rejected;
    try {
      verifyWebhook({ secret, rawBody: body.replace('m_1', 'm_2'), headers });
    } catch (error) {
      rejected = { isVerificationError: error instanceof WebhookVerificationError, reason: error.reason, status: error.status };
    }
    console.log(JSON.stringify({ accepted, rejected, expectedTimestamp: Number(timestamp) }));
  `;

  it('loads in plain Node (no tsx), accepts a signed delivery and rejects a tampered body', async () => {
    // dist/ is built by `npm run build`, which npm runs on install (the `prepare` script).
    const stale = !existsSync(built) || statSync(built).mtimeMs < statSync(source).mtimeMs;
    expect(stale, 'dist/webhooks/verify.js is missing or older than src/webhooks/verify.ts: run `npm run build`').toBe(false);

    const env = { ...process.env };
    delete env.NODE_OPTIONS; // no loader (tsx) inherited: this is what a receiver runs
    const { stdout } = await promisify(execFile)(process.execPath, ['--input-type=module', '--eval', receiver], { cwd: root, env, timeout: 30_000 });
    const result = JSON.parse(stdout) as { accepted: unknown; rejected: unknown; expectedTimestamp: number };
    expect(result.accepted).toEqual({ id: ID, timestamp: result.expectedTimestamp });
    expect(result.rejected).toEqual({ isVerificationError: true, reason: 'invalid_signature', status: 401 });
  });
});
