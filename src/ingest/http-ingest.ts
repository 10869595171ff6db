/**
 * HTTP intake: POST /v1/ingest/events with `Authorization: Bearer <INGEST_TOKEN>`, a JSON array (or
 * one object) or NDJSON of request events. Each event is validated with the same schema as Kafka's;
 * the 202 response reports per event what was accepted, rejected (with field errors) or dropped as a
 * duplicate. Contract: a 202 means the accepted events are stored; during a storage outage the
 * answer is 503 with Retry-After, and a retry of the same events is not counted twice.
 */
import { createHash, timingSafeEqual } from 'node:crypto';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import {
  parseRequestEventText,
  parseRequestEventValue,
  type FieldError,
  type ParseResult,
  type RejectionReason,
  type RequestEvent,
  type TimeRange,
} from '../events/request-event.ts';
import { HttpError, validationError } from '../http/errors.ts';
import type { WorkerMetrics } from '../metrics.ts';
import { HTTP_SOURCE, serializeEventRow } from '../store/event-store.ts';
import type { EventBuffer } from './event-buffer.ts';
import type { RecentEventIds } from './recent-event-ids.ts';

export interface HttpIngestOptions {
  token: string;
  maxEvents: number;
  /** The event times storage holds (storableEventTimes): validation rejects the others. */
  eventTimes: TimeRange;
  buffer: EventBuffer;
  recentIds: RecentEventIds;
  metrics: WorkerMetrics;
  /** How long a request waits for its events to be stored before answering 503. */
  storeTimeoutMs?: number;
  /** Receives the accepted events (for detection), before the response waits for storage. */
  onAccepted?(events: RequestEvent[]): void;
}

export interface IngestReport {
  accepted: number;
  rejected: number;
  duplicates: number;
  errors: { index: number; eventId?: string; reason: RejectionReason; details: FieldError[] }[];
}

const NDJSON_TYPES = ['application/x-ndjson', 'application/ndjson', 'application/jsonl'];

export function registerHttpIngest(app: FastifyInstance, options: HttpIngestOptions): void {
  const expectedToken = digest(options.token);
  app.addContentTypeParser(NDJSON_TYPES, { parseAs: 'string' }, (_request, body, done) => done(null, body));

  app.post('/v1/ingest/events', async (request, reply) => {
    authenticate(request, expectedToken);
    if (!options.buffer.healthy) throw storageUnavailable();
    const results = parseBody(request.body, options.maxEvents, options.eventTimes);
    const report: IngestReport = { accepted: 0, rejected: 0, duplicates: 0, errors: [] };
    const lines: string[] = [];
    const accepted: RequestEvent[] = [];
    results.forEach((result, index) => {
      if (!result.ok) {
        report.rejected++;
        const { reason, errors, eventId } = result.rejection;
        report.errors.push({ index, ...(eventId === undefined ? {} : { eventId }), reason, details: errors });
        options.metrics.eventsRejected.inc({ reason });
      } else if (options.recentIds.checkAndAdd(result.event.eventId)) {
        report.duplicates++;
      } else {
        report.accepted++;
        lines.push(serializeEventRow(result.event, HTTP_SOURCE));
        accepted.push(result.event);
      }
    });
    options.metrics.eventsConsumed.inc({ source: 'http' }, results.length);
    if (report.duplicates > 0) options.metrics.eventsDuplicate.inc({ source: 'http' }, report.duplicates);
    if (accepted.length > 0) options.onAccepted?.(accepted);
    if (lines.length > 0) {
      const outcome = await waitUntilStored(options.buffer, options.buffer.add({ lines }), options.storeTimeoutMs ?? 10_000);
      if (outcome !== 'stored') throw storageUnavailable();
    }
    return reply.code(202).send({ success: true, data: report });
  });
}

/**
 * Waits for the rows to be stored, but answers early when storage fails or takes too long. The rows
 * stay buffered either way; a client retry after a 503 is dropped as a duplicate.
 */
async function waitUntilStored(buffer: EventBuffer, stored: Promise<void>, timeoutMs: number): Promise<'stored' | 'unavailable'> {
  let timer: NodeJS.Timeout | undefined;
  let removeListener: (() => void) | undefined;
  const unavailable = new Promise<'unavailable'>((resolve) => {
    timer = setTimeout(() => resolve('unavailable'), timeoutMs);
    removeListener = buffer.onOutage(() => resolve('unavailable'));
  });
  try {
    return await Promise.race([stored.then(() => 'stored' as const, () => 'unavailable' as const), unavailable]);
  } finally {
    clearTimeout(timer);
    removeListener?.();
  }
}

function parseBody(body: unknown, maxEvents: number, times: TimeRange): ParseResult[] {
  let results: ParseResult[];
  if (typeof body === 'string' && body.trimStart().startsWith('[')) {
    // A JSON array sent as NDJSON or text/plain: read as the array it is, not as one bad line.
    body = parseJsonArray(body);
  }
  if (typeof body === 'string') {
    const lines = body.split('\n').filter((line) => line.trim().length > 0);
    if (lines.length > maxEvents) throw tooMany(maxEvents);
    results = lines.map((line) => parseRequestEventText(line.trim(), times));
  } else if (Array.isArray(body)) {
    if (body.length > maxEvents) throw tooMany(maxEvents);
    results = body.map((item) => parseRequestEventValue(item, times));
  } else if (body !== null && typeof body === 'object') {
    results = [parseRequestEventValue(body, times)];
  } else {
    throw validationError([{ path: ['body'], message: 'expected a JSON array of events, one event object, or NDJSON' }]);
  }
  if (results.length === 0) throw validationError([{ path: ['body'], message: 'no events in the body' }]);
  return results;
}

function parseJsonArray(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    // Never quote the input: it may hold a secret (see request-event.ts).
    throw validationError([{ path: ['body'], message: 'body starts as a JSON array but is not valid JSON' }]);
  }
}

function authenticate(request: FastifyRequest, expectedToken: Buffer): void {
  const header = request.headers.authorization;
  const match = typeof header === 'string' ? /^Bearer (.+)$/i.exec(header) : null;
  // Compare digests, so the comparison takes the same time whatever the length of the guess.
  if (!match || !timingSafeEqual(digest(match[1]!), expectedToken)) {
    throw new HttpError(401, 'UNAUTHORIZED', 'Missing or invalid ingest token');
  }
}

function digest(value: string): Buffer {
  return createHash('sha256').update(value).digest();
}

function tooMany(maxEvents: number): HttpError {
  return validationError([{ path: ['body'], message: `at most ${maxEvents} events per request` }]);
}

function storageUnavailable(): HttpError {
  return new HttpError(503, 'STORAGE_UNAVAILABLE', 'Storage is unavailable; retry later', undefined, { 'retry-after': '5' });
}
