/**
 * Signing and verification of critical-alert webhooks (contracts section 4, spec 6.4). Contract:
 * `svc-signature: v1,<base64 of HMAC-SHA256(secret, "<svc-id>.<svc-timestamp>.<raw body>")>`, where
 * the key is the secret string exactly as shown once at registration (UTF-8 bytes), svc-id is the
 * message id (the same on every retry) and svc-timestamp the send time in Unix milliseconds.
 *
 * This file is for receivers too: it depends on node:crypto alone, so it can be imported from the
 * package (`security-center-worker/webhooks/verify`, compiled to dist/ by `npm run build`, which
 * npm runs on install) or copied as is. Keep it that way: no imports from the rest of src, and only
 * erasable TypeScript syntax (no parameter properties, enums or namespaces).
 */
import { createHmac, timingSafeEqual } from 'node:crypto';

export const WEBHOOK_HEADERS = { id: 'svc-id', timestamp: 'svc-timestamp', signature: 'svc-signature' } as const;

/** A receiver rejects a timestamp further than this from its own clock. */
export const DEFAULT_TOLERANCE_MS = 5 * 60_000;

const SIGNATURE_VERSION = 'v1';

export type VerificationFailure = 'missing_header' | 'invalid_timestamp' | 'stale_timestamp' | 'invalid_signature';

/** Why a delivery was rejected, with the status the receiver should answer (spec 6.4: 401 or 400). */
export class WebhookVerificationError extends Error {
  readonly reason: VerificationFailure;
  readonly status: 400 | 401;

  constructor(reason: VerificationFailure, message: string) {
    super(message);
    this.name = 'WebhookVerificationError';
    this.reason = reason;
    this.status = reason === 'invalid_signature' ? 401 : 400;
  }
}

/** The body as received: its text, or its bytes (a Buffer, a Uint8Array, or fetch's arrayBuffer()). */
type RawBody = string | Uint8Array | ArrayBuffer;

/** The svc-signature header value for one message at one timestamp. */
export function signWebhook(secret: string, id: string, timestamp: string | number, rawBody: RawBody): string {
  const hmac = createHmac('sha256', secret);
  hmac.update(`${id}.${timestamp}.`);
  hmac.update(isArrayBuffer(rawBody) ? new Uint8Array(rawBody) : rawBody);
  return `${SIGNATURE_VERSION},${hmac.digest('base64')}`;
}

/** Node's IncomingHttpHeaders (lower-case keys), a plain record, or a fetch Headers object. */
export type HeaderSource = { get(name: string): string | null } | Record<string, string | string[] | undefined>;

export interface VerifyOptions {
  /** The signing secret, exactly as it was shown. */
  secret: string;
  /** The request body exactly as received, before any JSON parsing. */
  rawBody: RawBody;
  headers: HeaderSource;
  /** The receiver's clock, Unix ms (default Date.now()). */
  now?: number;
  toleranceMs?: number;
}

export interface VerifiedWebhook {
  /** svc-id: the message id; the same on every retry, so it is the idempotency key. */
  id: string;
  /** svc-timestamp, Unix ms. */
  timestamp: number;
}

/**
 * Checks the three headers, the timestamp's freshness and the signature (compared in constant
 * time). Returns the message id and timestamp; throws WebhookVerificationError otherwise.
 */
export function verifyWebhook(options: VerifyOptions): VerifiedWebhook {
  checkOptions(options);
  const id = header(options.headers, WEBHOOK_HEADERS.id);
  const timestampText = header(options.headers, WEBHOOK_HEADERS.timestamp);
  const signature = header(options.headers, WEBHOOK_HEADERS.signature);
  if (!id || !timestampText || !signature) {
    throw new WebhookVerificationError('missing_header', 'svc-id, svc-timestamp and svc-signature are all required');
  }
  if (!/^\d{1,16}$/.test(timestampText)) {
    throw new WebhookVerificationError('invalid_timestamp', 'svc-timestamp must be Unix milliseconds');
  }
  const timestamp = Number(timestampText);
  const now = options.now ?? Date.now();
  if (Math.abs(now - timestamp) > (options.toleranceMs ?? DEFAULT_TOLERANCE_MS)) {
    throw new WebhookVerificationError('stale_timestamp', 'svc-timestamp is too far from the current time');
  }
  // Compared as text: only the canonical base64 of the HMAC is the signature (no missing or extra
  // padding, no other value of the last character's unused bits).
  const expected = Buffer.from(signWebhook(options.secret, id, timestampText, options.rawBody).slice(SIGNATURE_VERSION.length + 1));
  const [version, encoded] = splitOnce(signature, ',');
  const given = version === SIGNATURE_VERSION && encoded ? Buffer.from(encoded) : undefined;
  // The length of an HMAC-SHA256 is public; only the bytes are compared in constant time.
  if (!given || given.length !== expected.length || !timingSafeEqual(given, expected)) {
    throw new WebhookVerificationError('invalid_signature', 'svc-signature does not match');
  }
  return { id, timestamp };
}

/**
 * A receiver's own mistakes fail loudly (TypeError), never open: an empty secret (an unset variable)
 * would accept a signature anyone can make, and a clock or tolerance that is not a number would
 * turn the freshness check off.
 */
function checkOptions(options: VerifyOptions): void {
  if (typeof options.secret !== 'string' || options.secret.length === 0) throw new TypeError('verifyWebhook: secret must be the non-empty signing secret');
  const body: unknown = options.rawBody;
  if (typeof body !== 'string' && !ArrayBuffer.isView(body) && !isArrayBuffer(body)) {
    throw new TypeError('verifyWebhook: rawBody must be the body as received (a string, Buffer, Uint8Array or ArrayBuffer), before any JSON parsing');
  }
  if (options.headers === null || typeof options.headers !== 'object') throw new TypeError('verifyWebhook: headers must be the request\'s headers');
  if (options.now !== undefined && !Number.isFinite(options.now)) throw new TypeError('verifyWebhook: now must be Unix milliseconds');
  if (options.toleranceMs !== undefined && !(Number.isFinite(options.toleranceMs) && options.toleranceMs >= 0)) throw new TypeError('verifyWebhook: toleranceMs must be a number of milliseconds, 0 or more');
}

/** By its tag, not instanceof: a body made in another realm (a vm context, Jest's environment) is one too. */
function isArrayBuffer(value: unknown): value is ArrayBuffer {
  return Object.prototype.toString.call(value) === '[object ArrayBuffer]';
}

function header(headers: HeaderSource, name: string): string | undefined {
  let value: unknown;
  if (typeof headers.get === 'function') {
    value = (headers as { get(name: string): string | null }).get(name);
  } else {
    const record = headers as Record<string, unknown>;
    value = record[name] ?? record[Object.keys(record).find((key) => key.toLowerCase() === name) ?? ''];
  }
  const single = Array.isArray(value) ? (value.length === 1 ? value[0] : undefined) : value;
  return typeof single === 'string' && single.length > 0 ? single.trim() : undefined;
}

function splitOnce(text: string, separator: string): [string, string | undefined] {
  const at = text.indexOf(separator);
  return at < 0 ? [text, undefined] : [text.slice(0, at), text.slice(at + 1)];
}
