/**
 * Error catalogue and the two body formats of the spec (section 7.2). One error handler maps every
 * thrown error to them, so no request, however malformed, gets a 500 with internals in it.
 */
import type { FastifyError, FastifyReply, FastifyRequest } from 'fastify';

export type ErrorCode =
  | 'UNAUTHORIZED'
  | 'FORBIDDEN'
  | 'PLAN_UPGRADE_REQUIRED'
  | 'NOT_FOUND'
  | 'INVALID_TRANSITION'
  | 'VALIDATION_ERROR'
  | 'PAYLOAD_TOO_LARGE'
  | 'UNSUPPORTED_MEDIA_TYPE'
  | 'RATE_LIMITED'
  | 'STORAGE_UNAVAILABLE'
  | 'SERVICE_UNAVAILABLE'
  | 'BAD_REQUEST'
  | 'REQUEST_TIMEOUT'
  | 'HEADERS_TOO_LARGE'
  | 'NOT_IMPLEMENTED'
  | 'EXPECTATION_FAILED'
  | 'INTERNAL_ERROR';

export interface FieldIssue {
  path: (string | number)[];
  message: string;
}

/** An error with a stable code and status; the HTTP layer renders it in Format A (or B for validation). */
export class HttpError extends Error {
  constructor(
    readonly statusCode: number,
    readonly code: ErrorCode,
    message: string,
    readonly details?: FieldIssue[] | Record<string, unknown>,
    readonly headers: Record<string, string> = {},
  ) {
    super(message);
    this.name = 'HttpError';
  }
}

export function validationError(details: FieldIssue[], message = 'Request validation failed'): HttpError {
  return new HttpError(400, 'VALIDATION_ERROR', message, details);
}

/** 429 RATE_LIMITED: Retry-After, and `retryAfterSeconds` in the body (spec section 7.3). */
export function rateLimitedError(retryAfterSeconds: number): HttpError {
  const seconds = Math.max(1, Math.ceil(retryAfterSeconds));
  return new HttpError(429, 'RATE_LIMITED', `Too many requests; retry in ${seconds} s`, { retryAfterSeconds: seconds }, { 'retry-after': String(seconds) });
}

/**
 * Format A: `{success:false, error:{code, message, details?}}`. Format B: `{error, code, details:[...]}`.
 * A 429 also carries `retryAfterSeconds` at the top of the body, where the spec puts it (and in details).
 */
export function renderError(error: HttpError): unknown {
  if (error.code === 'VALIDATION_ERROR') {
    return { error: error.message, code: error.code, details: Array.isArray(error.details) ? error.details : [] };
  }
  const retryAfterSeconds = error.code === 'RATE_LIMITED' && error.details && !Array.isArray(error.details) ? error.details.retryAfterSeconds : undefined;
  return {
    success: false,
    error: { code: error.code, message: error.message, ...(error.details ? { details: error.details } : {}) },
    ...(retryAfterSeconds !== undefined ? { retryAfterSeconds } : {}),
  };
}

/** Maps Fastify's own errors (body limit, content type, bad JSON) to the catalogue. */
export function toHttpError(error: FastifyError | Error): HttpError {
  if (error instanceof HttpError) return error;
  const fastifyError = error as FastifyError;
  switch (fastifyError.code) {
    case 'FST_ERR_CTP_BODY_TOO_LARGE':
      return new HttpError(413, 'PAYLOAD_TOO_LARGE', 'Request body is larger than the limit');
    case 'FST_ERR_CTP_INVALID_MEDIA_TYPE':
      return new HttpError(415, 'UNSUPPORTED_MEDIA_TYPE', 'Send application/json or application/x-ndjson');
    case 'FST_ERR_CTP_EMPTY_JSON_BODY':
      return validationError([{ path: ['body'], message: 'body is empty' }]);
    case 'FST_ERR_CTP_INVALID_CONTENT_LENGTH':
      return validationError([{ path: ['body'], message: 'content-length does not match the body' }]);
  }
  if (fastifyError.statusCode === 400 || error instanceof SyntaxError) {
    return validationError([{ path: ['body'], message: 'body is not valid JSON' }]);
  }
  if (fastifyError.statusCode && fastifyError.statusCode >= 400 && fastifyError.statusCode < 500) {
    return new HttpError(fastifyError.statusCode, 'VALIDATION_ERROR', 'Bad request', [{ path: [], message: 'bad request' }]);
  }
  return new HttpError(500, 'INTERNAL_ERROR', 'Internal error');
}

export function handleError(error: FastifyError | Error, request: FastifyRequest, reply: FastifyReply): void {
  const httpError = toHttpError(error);
  if (isUnexpected(error, httpError)) request.log.error({ err: error }, 'request failed');
  else if (httpError.statusCode >= 500) warnRefused(request, httpError);
  void reply.code(httpError.statusCode).headers(httpError.headers).send(renderError(httpError));
}

/** A 500: an error no code path chose to answer with (a deliberate 503 such as STORAGE_UNAVAILABLE is expected). */
function isUnexpected(error: Error, httpError: HttpError): boolean {
  return httpError.statusCode >= 500 && (!(error instanceof HttpError) || error.statusCode === 500);
}

const REFUSAL_WARNING_INTERVAL_MS = 60_000;

/** Per server and code: when the last warning was logged, and the refusals since then. */
const refusalTallies = new WeakMap<object, Map<ErrorCode, { loggedAt: number; refused: number }>>();

/**
 * A deliberate 5xx (503 STORAGE_UNAVAILABLE while storage is down or slow) is logged as a warning
 * without a stack, at most once a minute per code with the count since the last such line: a line
 * per refused request would flood the log just when on-call reads it. What refuses them (the
 * buffer's outage, a Kafka failure) logs its own cause.
 */
function warnRefused(request: FastifyRequest, error: HttpError): void {
  let tallies = refusalTallies.get(request.server);
  if (!tallies) refusalTallies.set(request.server, (tallies = new Map()));
  const tally = tallies.get(error.code) ?? { loggedAt: Number.NEGATIVE_INFINITY, refused: 0 };
  tallies.set(error.code, tally);
  tally.refused++;
  const now = Date.now();
  if (now - tally.loggedAt < REFUSAL_WARNING_INTERVAL_MS) return;
  request.log.warn({ status: error.statusCode, code: error.code, reason: error.message, refused: tally.refused }, 'requests refused (logged at most once a minute)');
  tally.loggedAt = now;
  tally.refused = 0;
}
