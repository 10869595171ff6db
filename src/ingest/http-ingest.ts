/**
 * HTTP intake: POST /v1/ingest/events with `Authorization: Bearer <INGEST_TOKEN>`, a JSON array (or
 * one object) or NDJSON of request events. Each event is validated with the same schema as Kafka's;
 * the 202 response reports per event what was accepted, rejected (with field errors) or dropped as a
 * duplicate.
 *
 * Contract: without Kafka, a 202 means the accepted events are stored (and handed to this replica's
 * detection). With Kafka (`publish`), a 202 means the brokers have acknowledged them on the input
 * topic, keyed by apiKeyId as the fleet keys its events: the replica that owns the key's partition
 * stores and detects them, so a key's events meet in one place and a retry sent to another replica
 * is dropped there as a redelivery. Either way, when that cannot be done in time the answer is 503
 * with Retry-After, and a retry of the same events is not counted twice.
 */
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
import { bearerTokenCheck } from '../http/bearer-token.ts';
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
  /**
   * With Kafka: produces the accepted events to the input topic and resolves once the brokers have
   * acknowledged them all. Without it, the accepted events are stored through `buffer` and handed to
   * `onAccepted`.
   */
  publish?(events: readonly RequestEvent[]): Promise<void>;
  /** How long a request waits for its events to be stored (or acknowledged) before answering 503. */
  storeTimeoutMs?: number;
  /** Receives the accepted events (for detection), before the response waits for storage; not called with `publish`. */
  onAccepted?(events: RequestEvent[]): void;
  /**
   * Settles once `recentIds` holds the ids stored before this process started (see
   * EventStore.recentEventIds): until then a retry of a post the previous process stored cannot be
   * told from a new post, so a post waits for it (up to storeTimeoutMs, then 503).
   */
  recalled?: Promise<void>;
}

export interface IngestReport {
  accepted: number;
  rejected: number;
  duplicates: number;
  errors: { index: number; eventId?: string; reason: RejectionReason; details: FieldError[] }[];
}

const NDJSON_TYPES = ['application/x-ndjson', 'application/ndjson', 'application/jsonl'];

export function registerHttpIngest(app: FastifyInstance, options: HttpIngestOptions): void {
  const authenticate = bearerTokenCheck(options.token, 'ingest token');
  const { publish, buffer, recentIds, metrics, recalled } = options;
  const timeoutMs = options.storeTimeoutMs ?? 10_000;
  /**
   * Posts whose events the brokers had not acknowledged by their deadline and still have not: while
   * there are any, Kafka is not taking writes, and posts are refused at once rather than pile up
   * more events behind them (the producer retries those until the brokers take them).
   */
  let overdue = 0;
  app.addContentTypeParser(NDJSON_TYPES, { parseAs: 'string' }, (_request, body, done) => done(null, body));

  /** Produces the events; they are remembered once the brokers have them, however late, so a retry after a failure is produced again. */
  async function produce(publish: NonNullable<HttpIngestOptions['publish']>, events: RequestEvent[], request: FastifyRequest) {
    const published = publish(events);
    published.then(
      () => {
        for (const event of events) recentIds.checkAndAdd(event.eventId);
        metrics.eventsProduced.inc(events.length);
      },
      (error: unknown) => request.log.error({ err: error, events: events.length }, 'producing HTTP-ingested events to Kafka failed'),
    );
    const outcome = await settleWithin(published, timeoutMs);
    if (outcome === 'timeout') {
      overdue++;
      const settled = () => overdue--;
      published.then(settled, settled);
    }
    return outcome;
  }

  /** Stores the events; they are remembered at once: after a 503 the rows stay buffered and are stored, so a retry is a duplicate. */
  function store(events: RequestEvent[]) {
    for (const event of events) recentIds.checkAndAdd(event.eventId);
    options.onAccepted?.(events);
    const lines = events.map((event) => serializeEventRow(event, HTTP_SOURCE));
    return settleWithin(buffer.add({ lines }), timeoutMs, (listener) => buffer.onOutage(listener));
  }

  // The token is checked before the body is read: a caller without it gets 401, whatever it sent,
  // and never has the worker read and parse up to INGEST_MAX_BODY_BYTES.
  app.post('/v1/ingest/events', { onRequest: async (request) => authenticate(request) }, async (request, reply) => {
    // With Kafka, storage is the consumer's business: the topic holds the events through its outage.
    if (publish ? overdue > 0 : !buffer.healthy) throw unavailable(publish !== undefined);
    if (recalled && (await settleWithin(recalled, timeoutMs)) === 'timeout') throw stillStarting();
    const results = parseBody(request.body, isJsonType(request.headers['content-type']), options.maxEvents, options.eventTimes);
    const report: IngestReport = { accepted: 0, rejected: 0, duplicates: 0, errors: [] };
    const accepted: RequestEvent[] = [];
    const inRequest = new Set<string>();
    results.forEach((result, index) => {
      if (!result.ok) {
        report.rejected++;
        const { reason, errors, eventId } = result.rejection;
        report.errors.push({ index, ...(eventId === undefined ? {} : { eventId }), reason, details: errors });
        metrics.eventsRejected.inc({ reason });
      } else if (inRequest.has(result.event.eventId) || recentIds.has(result.event.eventId)) {
        report.duplicates++;
      } else {
        inRequest.add(result.event.eventId);
        report.accepted++;
        accepted.push(result.event);
      }
    });
    // Each event is counted once as consumed: with Kafka, an accepted one by the replica that
    // consumes it from the topic (here it counts as produced once acknowledged); the others end here.
    metrics.eventsConsumed.inc({ source: 'http' }, publish ? results.length - accepted.length : results.length);
    if (report.duplicates > 0) metrics.eventsDuplicate.inc({ source: 'http' }, report.duplicates);
    if (accepted.length > 0) {
      const outcome = publish ? await produce(publish, accepted, request) : await store(accepted);
      if (outcome !== 'done') throw unavailable(publish !== undefined);
    }
    return reply.code(202).send({ success: true, data: report });
  });
}

/**
 * Waits for `done`, but answers early when it takes longer than `timeoutMs` or an outage is reported
 * meanwhile: 'done', 'failed' (it failed, or an outage) or 'timeout'. What it waits for goes on either way.
 */
async function settleWithin(done: Promise<void>, timeoutMs: number, onOutage?: (listener: () => void) => () => void): Promise<'done' | 'failed' | 'timeout'> {
  let timer: NodeJS.Timeout | undefined;
  let removeListener: (() => void) | undefined;
  const cutShort = new Promise<'failed' | 'timeout'>((resolve) => {
    timer = setTimeout(() => resolve('timeout'), timeoutMs);
    removeListener = onOutage?.(() => resolve('failed'));
  });
  try {
    return await Promise.race([done.then(() => 'done' as const, () => 'failed' as const), cutShort]);
  } finally {
    clearTimeout(timer);
    removeListener?.();
  }
}

/** Whether the body was read as JSON (application/json): a string then is a JSON string, not NDJSON text. */
function isJsonType(contentType: string | undefined): boolean {
  return contentType !== undefined && /^\s*application\/json\s*(;|$)/i.test(contentType);
}

function parseBody(body: unknown, readAsJson: boolean, maxEvents: number, times: TimeRange): ParseResult[] {
  let results: ParseResult[];
  if (typeof body === 'string' && !readAsJson && body.trimStart().startsWith('[')) {
    // A JSON array sent as NDJSON or text/plain: read as the array it is, not as one bad line (a
    // byte-order mark before it too, which trimStart takes off and JSON.parse refuses).
    body = parseJsonArray(body.trimStart());
  }
  if (typeof body === 'string' && !readAsJson) {
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

function tooMany(maxEvents: number): HttpError {
  return validationError([{ path: ['body'], message: `at most ${maxEvents} events per request` }]);
}

/** 503 with Retry-After: the same code whichever way events are stored, so clients retry alike. */
function stillStarting(): HttpError {
  return new HttpError(503, 'STORAGE_UNAVAILABLE', 'Storage has not yet said which events were stored before this worker started; retry later', undefined, { 'retry-after': '5' });
}

function unavailable(viaKafka: boolean): HttpError {
  const message = viaKafka ? 'Kafka did not acknowledge the events; retry later' : 'Storage is unavailable; retry later';
  return new HttpError(503, 'STORAGE_UNAVAILABLE', message, undefined, { 'retry-after': '5' });
}
