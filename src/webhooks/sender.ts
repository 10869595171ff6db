/**
 * One delivery attempt over HTTPS (spec 6.5). Contract: the request goes only to an address the
 * target policy allowed (IP literal checked before, names checked in the connection's own `lookup`,
 * the connected peer checked again), with certificate validation and TLS 1.2 or higher, a 5 s
 * connect timeout (TCP and TLS) and a 10 s limit on the whole attempt; redirects are not followed
 * (a 3xx is a failure like any non-2xx). It never throws: every way an attempt ends is an outcome.
 */
import { request } from 'node:https';
import type { TLSSocket } from 'node:tls';
import { addressRefusal, BlockedTargetError, checkTargetUrl, guardedLookup, type TargetPolicy } from './target-policy.ts';

export const CONNECT_TIMEOUT_MS = 5_000;
export const REQUEST_TIMEOUT_MS = 10_000;

/** delivered: 2xx; http_error: any other status, 3xx included. */
export const ATTEMPT_OUTCOMES = ['delivered', 'http_error', 'timeout', 'connect_error', 'tls_error', 'blocked_target'] as const;
export type AttemptOutcome = (typeof ATTEMPT_OUTCOMES)[number];

export interface AttemptResult {
  outcome: AttemptOutcome;
  statusCode?: number;
  /** A short reason for the admin's delivery log; never a secret or a resolved internal address. */
  error?: string;
  durationMs: number;
}

export interface SendOptions {
  policy: TargetPolicy;
  /** Trusted CAs (default: Node's bundled roots). */
  ca?: readonly string[];
  connectTimeoutMs?: number;
  requestTimeoutMs?: number;
  /** Aborts the attempt (its result is then a connect_error nobody should record). */
  signal?: AbortSignal;
}

export interface WebhookRequest {
  url: string;
  body: string;
  headers: Record<string, string>;
}

const USER_AGENT = 'security-center-webhooks/1';
const TLS_ERROR = /CERT|SSL|TLS|UNABLE_TO_(GET|VERIFY)|SELF_SIGNED|HOSTNAME|ALTNAME|EPROTO/i;

class TimeoutError extends Error {
  readonly code = 'ETIMEDOUT';
}

export async function sendWebhook(message: WebhookRequest, options: SendOptions): Promise<AttemptResult> {
  const started = performance.now();
  const elapsed = () => Math.round(performance.now() - started);
  let target;
  try {
    target = checkTargetUrl(message.url, options.policy);
  } catch (error) {
    return { outcome: 'blocked_target', error: (error as Error).message, durationMs: elapsed() };
  }
  const { url, host } = target;
  return new Promise<AttemptResult>((resolve) => {
    let settled = false;
    const finish = (result: Omit<AttemptResult, 'durationMs'>) => {
      if (settled) return;
      settled = true;
      clearTimeout(connectTimer);
      clearTimeout(requestTimer);
      resolve({ ...result, durationMs: elapsed() });
    };
    const body = Buffer.from(message.body);
    const req = request({
      method: 'POST',
      host,
      port: url.port || 443,
      path: `${url.pathname}${url.search}`,
      headers: {
        ...message.headers,
        'content-type': 'application/json',
        'content-length': String(body.length),
        'user-agent': USER_AGENT,
      },
      agent: false, // a fresh connection per attempt: nothing pooled bypasses the checks
      lookup: guardedLookup(options.policy),
      servername: target.literal ? undefined : host,
      minVersion: 'TLSv1.2',
      rejectUnauthorized: true,
      ...(options.ca ? { ca: [...options.ca] } : {}),
      ...(options.signal ? { signal: options.signal } : {}),
    });
    const connectTimer = setTimeout(
      () => req.destroy(new TimeoutError(`no TLS connection within ${(options.connectTimeoutMs ?? CONNECT_TIMEOUT_MS) / 1000} s`)),
      options.connectTimeoutMs ?? CONNECT_TIMEOUT_MS,
    );
    const requestTimer = setTimeout(
      () => req.destroy(new TimeoutError(`no response within ${(options.requestTimeoutMs ?? REQUEST_TIMEOUT_MS) / 1000} s`)),
      options.requestTimeoutMs ?? REQUEST_TIMEOUT_MS,
    );
    req.once('socket', (socket) => {
      socket.once('connect', () => {
        // The lookup already checked this address; the peer is checked once more, in case any
        // path connected without it.
        const refusal = socket.remoteAddress ? addressRefusal(socket.remoteAddress, options.policy) : 'an unknown address';
        if (refusal) req.destroy(new BlockedTargetError(`connected to ${refusal}`));
      });
      (socket as TLSSocket).once('secureConnect', () => clearTimeout(connectTimer));
    });
    req.once('response', (response) => {
      const statusCode = response.statusCode ?? 0;
      // Only the status matters; the body is not read (it could be large or slow).
      response.destroy();
      req.destroy();
      if (statusCode >= 200 && statusCode < 300) finish({ outcome: 'delivered', statusCode });
      else finish({ outcome: 'http_error', statusCode, error: statusCode >= 300 && statusCode < 400 ? `HTTP ${statusCode} (redirects are not followed)` : `HTTP ${statusCode}` });
    });
    // `on`, not `once`: a destroyed request may report more than one error.
    req.on('error', (error: NodeJS.ErrnoException) => finish(failure(error)));
    req.end(body);
  });
}

function failure(error: NodeJS.ErrnoException): Omit<AttemptResult, 'durationMs'> {
  if (error instanceof BlockedTargetError || error.code === 'ERR_WEBHOOK_TARGET_BLOCKED') {
    return { outcome: 'blocked_target', error: error.message };
  }
  if (error instanceof TimeoutError) return { outcome: 'timeout', error: error.message };
  const code = error.code ?? '';
  const text = `${code ? `${code}: ` : ''}${error.message}`.slice(0, 200);
  if (TLS_ERROR.test(code) || TLS_ERROR.test(error.message)) return { outcome: 'tls_error', error: text };
  return { outcome: 'connect_error', error: text };
}
