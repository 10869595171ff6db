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
 * with Retry-After, and a retry of the same events is not counted twice. Without Kafka, posts are
 * also answered 503 until this replica's detection has started, and once its thread has stopped:
 * nothing is stored that no one would judge.
 *
 * Without Kafka, an event counts as a duplicate only once its rows are durable: a retry of events
 * still being stored (a post answered 503 whose rows stayed buffered) waits for them as their own
 * post did, and gets 503 again if they are not stored in time, never a 202 for rows a stop could
 * still lose. A post whose events would take the rows waiting for storage past `maxBufferedRows` is
 * refused (503) without buffering them: slow storage slows intake rather than fill memory.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import {
  parseRequestEventText,
  parseRequestEventValue,
  timesAsOf,
  type FieldError,
  type ParseResult,
  type RejectionReason,
  type RequestEvent,
  type TimeRange,
} from '../events/request-event.ts';
import { FailureLog, INTERLEAVED_QUIET_MS } from '../failure-log.ts';
import { bearerTokenCheck } from '../http/bearer-token.ts';
import { HttpError, validationError } from '../http/errors.ts';
import type { Logger } from '../logger.ts';
import type { WorkerMetrics } from '../metrics.ts';
import { HTTP_SOURCE, serializeEventRow } from '../store/event-store.ts';
import type { EventBuffer } from './event-buffer.ts';
import type { RecentEventIds } from './recent-event-ids.ts';

export interface HttpIngestOptions {
  token: string;
  maxEvents: number;
  /** The event times storage holds (storableEventTimes, its bound that moves with the clock taken as of each post): validation rejects the others. */
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
  /** How long a request waits for its events to be stored (or acknowledged), or for start-up, before answering 503. */
  storeTimeoutMs?: number;
  /**
   * Without Kafka: how long posted events may wait in the buffer before their insert begins
   * (STORE_FLUSH_INTERVAL_MS). That wait is by design: a post's time for storage starts after it.
   */
  flushWaitMs?: number;
  /** Receives the accepted events (for detection), and the rejected ones detection still judges (Rejection.redactedEvent), before the response waits for storage; not called with `publish`. */
  onAccepted?(events: RequestEvent[]): void;
  /**
   * Settles once `recentIds` holds the ids stored before this process started (see
   * EventStore.recentEventIds): until then a retry of a post the previous process stored cannot be
   * told from a new post, so a post waits for it (up to storeTimeoutMs, then 503).
   */
  recalled?: Promise<void>;
  /**
   * Without Kafka: settles once detection has started (the open alerts loaded, the windows warmed).
   * Until then a post waits for it (up to storeTimeoutMs, then 503): events stored before it would be
   * judged by no one if the worker stopped first, as the next start warms its windows with them.
   */
  detectionStarted?: Promise<void>;
  /** Without Kafka: set when detection can judge nothing more (its thread stopped); posts are refused with 503 then, not stored unjudged. */
  detectionStopped?(): boolean;
  /**
   * Without Kafka: the most rows `buffer` holds waiting for the next flush (the buffer's
   * maxBufferedRows, STORE_MAX_BUFFERED_ROWS). A post whose accepted events would take it past this
   * is refused with 503 and Retry-After, neither buffered nor remembered; a post of more events than
   * this could never be taken and is refused with 400. Without it, posts are not limited by the buffer.
   */
  maxBufferedRows?: number;
  /** The clock of the once-a-minute bound on failure lines (Date.now; tests move it). */
  logClock?: () => number;
}

export interface IngestReport {
  accepted: number;
  rejected: number;
  duplicates: number;
  /** `index`: the event's position in a JSON array, or its line's (from 0, blank lines counted) in NDJSON. */
  errors: { index: number; eventId?: string; reason: RejectionReason; details: FieldError[] }[];
}

/** One event of a body: where it is (an array index, or a line index in NDJSON) and what it parsed to. */
interface BodyEvent {
  index: number;
  result: ParseResult;
}

/** How a post's events are answered: the report, the events to store or publish, and the stores still under way of those it repeats. */
interface Classified {
  report: IngestReport;
  accepted: RequestEvent[];
  /** The promises for events this post repeats that are not durable yet (see `storing`). */
  stillStoring: Set<Promise<void>>;
  /** Rejected events detection still judges (Rejection.redactedEvent); it counts a repeat of one once. */
  judgedOnly: RequestEvent[];
}

const NDJSON_TYPES = ['application/x-ndjson', 'application/ndjson', 'application/jsonl'];

/** How long a post waits for storage (or the brokers, or start-up) by default. */
const STORE_TIMEOUT_MS = 10_000;

export function registerHttpIngest(app: FastifyInstance, options: HttpIngestOptions): void {
  const authenticate = bearerTokenCheck(options.token, 'ingest token');
  const { publish, buffer, recentIds, metrics, maxBufferedRows } = options;
  const timeoutMs = options.storeTimeoutMs ?? STORE_TIMEOUT_MS;
  // Aborted when the server begins to close (the worker stops): a post parked on a start-up step is
  // answered at once (shuttingDown), not at its deadline (up to storeTimeoutMs later), which would
  // hold the server's close past the stop's 5 s cap for it (main.ts). A stop ends start-up, so the
  // step it waits for would not settle in this process anyway.
  const closing = new AbortController();
  app.addHook('preClose', async () => closing.abort());
  const recalled = options.recalled && startupGate(options.recalled, closing.signal);
  const detectionStarted = options.detectionStarted && startupGate(options.detectionStarted, closing.signal);
  /**
   * Posts whose events the brokers had not acknowledged by their deadline and still have not: while
   * there are any, Kafka is not taking writes, and posts are refused at once rather than pile up
   * more events behind them (the producer retries those until the brokers take them).
   */
  let overdue = 0;
  /**
   * The ids of accepted events not yet durable, with the promise for them: without Kafka the buffer's
   * for their rows, with it the brokers' acknowledgement. An id moves to `recentIds` once durable, and
   * leaves at once if they are given up (the buffer stopped, or the brokers refused them). Without
   * Kafka it never holds more ids than the buffer holds posted rows; with it, no more than the
   * producer holds unacknowledged.
   */
  const storing = new Map<string, Promise<void>>();
  /**
   * With Kafka: failed publishes, logged as one failure rather than per post (with the brokers
   * refusing, every post fails): when it starts, with the cause, then at most once a minute with
   * a count, and once when the brokers acknowledge again. Each post's failure is at debug.
   * (app.log is the worker's pino logger, as the server was made with it.)
   */
  const publishFailures = new FailureLog(
    app.log as Logger,
    'producing HTTP-ingested events to Kafka failed; posts are answered 503 until the brokers acknowledge them',
    'Kafka acknowledges HTTP-ingested events again',
    // Some partitions' leaders may refuse while others take posts: not over until none has failed for a while.
    { quietMs: INTERLEAVED_QUIET_MS, now: options.logClock },
  );
  app.addContentTypeParser(NDJSON_TYPES, { parseAs: 'string' }, (_request, body, done) => done(null, body));

  /**
   * Produces the accepted events; they are remembered once the brokers have them, however late, so a
   * retry after a failure is produced again. Meanwhile their ids are in `storing`, as posted rows are
   * without Kafka: a concurrent post of one of them is a duplicate that waits for it. Runs in the same
   * synchronous stretch as `classify`, up to its wait.
   */
  async function produce(publish: NonNullable<HttpIngestOptions['publish']>, { accepted, stillStoring }: Classified, request: FastifyRequest) {
    const waits = [...stillStoring];
    const published = accepted.length > 0 ? publish(accepted) : undefined;
    if (published) {
      holdUntilDurable(accepted, published);
      published.then(
        () => {
          metrics.eventsProduced.inc(accepted.length);
          publishFailures.succeeded();
        },
        (error: unknown) => {
          request.log.debug({ err: error, events: accepted.length }, 'producing HTTP-ingested events to Kafka failed');
          publishFailures.failed({ err: error });
        },
      );
      waits.push(published);
    }
    if (waits.length === 0) return 'done';
    const outcome = await settleWithin(Promise.all(waits).then(() => undefined), timeoutMs);
    if (outcome === 'timeout' && published) {
      overdue++;
      const settled = () => overdue--;
      published.then(settled, settled);
    }
    return outcome;
  }

  /**
   * Buffers the events; their ids are in `storing` until the rows are durable, then remembered. So
   * after a 503 the rows stay buffered, and a retry waits for them instead of being stored again.
   * Runs in the same synchronous stretch as `classify`: two concurrent posts of an event cannot both take it.
   */
  function store(events: RequestEvent[], judgedOnly: readonly RequestEvent[] = []): Promise<void> {
    options.onAccepted?.(judgedOnly.length > 0 ? [...events, ...judgedOnly] : events);
    const durable = buffer.add({ lines: events.map((event) => serializeEventRow(event, HTTP_SOURCE)) });
    holdUntilDurable(events, durable);
    return durable;
  }

  /** Keeps the events' ids in `storing` until `durable` settles: then remembered in `recentIds`, or (it failed) forgotten. */
  function holdUntilDurable(events: readonly RequestEvent[], durable: Promise<void>): void {
    const ids = events.map((event) => event.eventId);
    for (const id of ids) storing.set(id, durable);
    durable.then(
      () => {
        for (const id of ids) {
          recentIds.checkAndAdd(id);
          storing.delete(id);
        }
      },
      () => {
        for (const id of ids) storing.delete(id);
      },
    );
  }

  /** Without Kafka: stores the accepted events and waits, within the timeout, for them and for those still being stored that the post repeats. */
  function storeAndWait({ accepted, stillStoring, judgedOnly }: Classified): Promise<'done' | 'failed' | 'timeout'> | 'done' {
    const waits = [...stillStoring];
    if (accepted.length > 0) waits.push(store(accepted, judgedOnly));
    else if (judgedOnly.length > 0) options.onAccepted?.(judgedOnly);
    if (waits.length === 0) return 'done';
    return settleWithin(
      Promise.all(waits).then(() => undefined),
      (options.flushWaitMs ?? 0) + timeoutMs,
      (listener) => buffer.onOutage(listener),
    );
  }

  /** Sorts the events into rejected, duplicates (remembered, repeated in this post, or still being stored) and accepted. */
  function classify(events: readonly BodyEvent[]): Classified {
    const report: IngestReport = { accepted: 0, rejected: 0, duplicates: 0, errors: [] };
    const accepted: RequestEvent[] = [];
    const stillStoring = new Set<Promise<void>>();
    const inRequest = new Set<string>();
    const judgedOnly: RequestEvent[] = [];
    for (const { index, result } of events) {
      if (!result.ok) {
        report.rejected++;
        const { reason, errors, eventId, redactedEvent } = result.rejection;
        report.errors.push({ index, ...(eventId === undefined ? {} : { eventId }), reason, details: errors });
        // Judged, not stored (detection counts a repeat once); its id is not taken: a copy without the secret is stored.
        if (redactedEvent !== undefined) judgedOnly.push(redactedEvent);
        continue;
      }
      const { eventId } = result.event;
      const beingStored = storing.get(eventId);
      if (inRequest.has(eventId) || recentIds.has(eventId)) {
        report.duplicates++;
      } else if (beingStored) {
        // A duplicate once durable: the post waits for it (storeAndWait, produce).
        report.duplicates++;
        stillStoring.add(beingStored);
      } else {
        inRequest.add(eventId);
        report.accepted++;
        accepted.push(result.event);
      }
    }
    return { report, accepted, stillStoring, judgedOnly };
  }

  /** Without Kafka: whether `rows` more would take the rows waiting for the next flush past the buffer's limit. */
  function wouldOverfillBuffer(rows: number): boolean {
    return maxBufferedRows !== undefined && buffer.bufferedRows + rows > maxBufferedRows;
  }

  function countOutcomes({ report, accepted }: Classified, events: number): void {
    for (const { reason } of report.errors) metrics.eventsRejected.inc({ reason });
    // Each event is counted once as consumed: with Kafka, an accepted one by the replica that
    // consumes it from the topic (here it counts as produced once acknowledged); the others end here.
    metrics.eventsConsumed.inc({ source: 'http' }, publish ? events - accepted.length : events);
    if (report.duplicates > 0) metrics.eventsDuplicate.inc({ source: 'http' }, report.duplicates);
  }

  // The token is checked before the body is read: a caller without it gets 401, whatever it sent,
  // and never has the worker read and parse up to INGEST_MAX_BODY_BYTES. Then, still unread, a body
  // the parsers would misread is refused (415).
  const onRequest = async (request: FastifyRequest) => {
    authenticate(request);
    refuseUndecodedBody(request);
  };
  const ingest = async (request: FastifyRequest, reply: FastifyReply) => {
    // With Kafka, storage is the consumer's business: the topic holds the events through its outage.
    if (publish ? overdue > 0 : !buffer.healthy) throw unavailable(publish !== undefined);
    if (options.detectionStopped?.()) throw detectionNotJudging('has stopped');
    // Start-up: one deadline for both waits (at most storeTimeoutMs in all, then 503).
    const startDeadline = Date.now() + timeoutMs;
    if (recalled && !(await recalled(startDeadline))) throw closing.signal.aborted ? shuttingDown() : stillStarting();
    if (detectionStarted && !(await detectionStarted(startDeadline))) throw closing.signal.aborted ? shuttingDown() : detectionNotJudging('has not started yet');
    if (options.detectionStopped?.()) throw detectionNotJudging('has stopped');
    // The bound that moves with the clock (events older than the raw events are kept) as of this post.
    const events = parseBody(request.body, isJsonType(request.headers['content-type']), options.maxEvents, timesAsOf(options.eventTimes, Date.now()));
    if (!publish && maxBufferedRows !== undefined && events.length > maxBufferedRows) throw moreThanBuffered(maxBufferedRows);
    const classified = classify(events);
    // Refused before anything is counted, buffered or remembered: the retry is a new post.
    if (!publish && wouldOverfillBuffer(classified.accepted.length)) throw bufferFull();
    countOutcomes(classified, events.length);
    const { report } = classified;
    const outcome = publish ? await produce(publish, classified, request) : await storeAndWait(classified);
    if (outcome !== 'done') throw unavailable(publish !== undefined);
    return reply.code(202).send({ success: true, data: report });
  };
  void app.register(async (scope) => {
    // JSON is read as Kafka intake and text/plain posts read it (JSON.parse): Fastify's parser refuses
    // the whole post for one event's "__proto__" or "constructor" key, which validation drops as it
    // drops any field it does not know. An empty or malformed body is refused as before.
    const parseJson = scope.getDefaultJsonParser('ignore', 'ignore');
    scope.removeContentTypeParser('application/json');
    scope.addContentTypeParser('application/json', { parseAs: 'string' }, parseJson);
    scope.post('/v1/ingest/events', { onRequest }, ingest);
  });
}

/**
 * Waits for `done`, but answers early when it takes longer than `timeoutMs` or an outage is reported
 * meanwhile: 'done', 'failed' (it failed, or an outage) or 'timeout'. What it waits for goes on either way.
 */
/**
 * A start-up step posts wait for: resolves true once `step` has settled (at once after that), or
 * false at `deadline` or once `closing` aborts, whichever comes first. A waiter that times out
 * leaves nothing behind (a reaction per post on a step that never settles, a start-up held by a
 * storage outage, would grow the heap with every retry).
 */
function startupGate(step: Promise<void>, closing: AbortSignal): (deadline: number) => Promise<boolean> {
  let settled = false;
  const waiters = new Set<(open: boolean) => void>();
  const releaseAll = (open: boolean) => {
    for (const release of waiters) release(open);
  };
  const open = () => {
    settled = true;
    releaseAll(true);
  };
  step.then(open, open);
  closing.addEventListener('abort', () => releaseAll(false), { once: true });
  return (deadline) =>
    settled || closing.aborted
      ? Promise.resolve(settled)
      : new Promise<boolean>((resolve) => {
          const release = (open: boolean) => {
            clearTimeout(timer);
            waiters.delete(release);
            resolve(open);
          };
          const timer = setTimeout(() => release(false), Math.max(0, deadline - Date.now()));
          waiters.add(release);
        });
}

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

/** The charsets the parsers read a body in: they read UTF-8 (`utf8` is a common label of it), and US-ASCII is a part of it. */
const READABLE_CHARSETS = new Set(['utf-8', 'utf8', 'us-ascii']);

/**
 * 415 UNSUPPORTED_MEDIA_TYPE for a body the parsers would misread: one in a content coding (they do
 * not decode gzip or any other, and would call it invalid JSON), with `Accept-Encoding: identity` as
 * RFC 9110 (15.5.16) asks; or in a charset other than UTF-8 (they read every body as UTF-8: UTF-16
 * would be invalid JSON, Latin-1's accented letters U+FFFD). The header values are not echoed.
 */
function refuseUndecodedBody(request: FastifyRequest): void {
  // Node's parser undoes chunked alone and hands on the body of `gzip, chunked` still compressed
  // (RFC 9112 6.1: a transfer coding the server does not understand is a 501).
  const transfer = request.headers['transfer-encoding'];
  if (transfer !== undefined && !transfer.split(',').every((coding) => ['', 'chunked', 'identity'].includes(coding.trim().toLowerCase()))) {
    throw new HttpError(501, 'NOT_IMPLEMENTED', 'Transfer-Encoding other than chunked is not supported: send the body uncompressed');
  }
  const encoding = request.headers['content-encoding'];
  if (encoding !== undefined && !isIdentity(encoding)) {
    throw new HttpError(415, 'UNSUPPORTED_MEDIA_TYPE', 'Content-Encoding is not supported: send the body uncompressed', undefined, { 'accept-encoding': 'identity' });
  }
  const contentType = request.headers['content-type'];
  if (contentType !== undefined && charsetsOf(contentType).some((charset) => !READABLE_CHARSETS.has(charset))) {
    throw new HttpError(415, 'UNSUPPORTED_MEDIA_TYPE', 'Only UTF-8 bodies are read: send charset=utf-8, or no charset');
  }
}

/** Whether a Content-Encoding value names no coding but identity (empty list elements are allowed, RFC 9110 5.6.1). */
function isIdentity(encoding: string): boolean {
  return encoding.split(',').every((coding) => {
    const name = coding.trim().toLowerCase();
    return name === '' || name === 'identity';
  });
}

/**
 * One parameter of a Content-Type value, from its `;` on: its name, and its value, a quoted string
 * (a `;` in it is the value's; the closing quote may be missing) or a token. It matches at any `;`
 * without backtracking: a header of 16 KiB (Node's limit) is read in one pass.
 */
const PARAMETER = /;\s*([^;=\s]*)\s*(?:=\s*(?:"((?:[^"\\]|\\.)*)"?|([^;]*)))?/y;

/** The charset parameters of a Content-Type value, lower case, a quoted one unquoted (`"UTF-8"` is `utf-8`). */
function charsetsOf(contentType: string): string[] {
  const charsets: string[] = [];
  for (let at = contentType.indexOf(';'); at !== -1; at = contentType.indexOf(';', PARAMETER.lastIndex)) {
    PARAMETER.lastIndex = at;
    const [, name, quoted, token] = PARAMETER.exec(contentType)!;
    if (name!.toLowerCase() === 'charset') charsets.push((quoted?.replace(/\\(.)/g, '$1') ?? token ?? '').trim().toLowerCase());
  }
  return charsets;
}

/** Whether the body was read as JSON (application/json): a string then is a JSON string, not NDJSON text. */
function isJsonType(contentType: string | undefined): boolean {
  return contentType !== undefined && /^\s*application\/json\s*(;|$)/i.test(contentType);
}

function parseBody(body: unknown, readAsJson: boolean, maxEvents: number, times: TimeRange): BodyEvent[] {
  let events: BodyEvent[];
  if (typeof body === 'string' && !readAsJson) body = readAsJsonWhenItIs(body);
  if (typeof body === 'string' && !readAsJson) {
    events = parseNdjson(body, maxEvents, times);
  } else if (Array.isArray(body)) {
    if (body.length > maxEvents) throw tooMany(maxEvents);
    events = body.map((item, index) => ({ index, result: parseRequestEventValue(item, times) }));
  } else if (body !== null && typeof body === 'object') {
    events = [{ index: 0, result: parseRequestEventValue(body, times) }];
  } else {
    throw validationError([{ path: ['body'], message: 'expected a JSON array of events, one event object, or NDJSON' }]);
  }
  if (events.length === 0) throw validationError([{ path: ['body'], message: 'no events in the body' }]);
  return events;
}

/**
 * A body sent as NDJSON or text/plain that is in fact one JSON document: a JSON array (a byte-order
 * mark before it too, which trimStart takes off and JSON.parse refuses), or one object spread over
 * several lines (pretty-printed), which split into lines would be one rejection per line. Returns
 * the parsed value, or the text itself when it is NDJSON.
 */
function readAsJsonWhenItIs(text: string): unknown {
  const trimmed = text.trimStart();
  if (trimmed.startsWith('[')) return parseJsonArray(trimmed) ?? text;
  // One line (with or without a final newline) is NDJSON's one event, read as such.
  if (trimmed.startsWith('{') && trimmed.trimEnd().includes('\n')) return parsedObject(trimmed) ?? text;
  return text;
}

/** The object the text is, or undefined when it is not one JSON object (NDJSON fails at its second line's start, so this is cheap). */
function parsedObject(text: string): object | undefined {
  const value = parsedJson(text);
  return value !== null && typeof value === 'object' && !Array.isArray(value) ? value : undefined;
}

const NOT_JSON = Symbol('not JSON');

/** The value the text is as JSON, or NOT_JSON. */
function parsedJson(text: string): unknown {
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return NOT_JSON;
  }
}

/** One event per non-blank line; an event's index is its line's in the body, blank lines counted, so a client can find it. */
function parseNdjson(text: string, maxEvents: number, times: TimeRange): BodyEvent[] {
  const lines: { index: number; line: string }[] = [];
  text.split('\n').forEach((line, index) => {
    const trimmed = line.trim();
    if (trimmed.length > 0) lines.push({ index, line: trimmed });
  });
  if (lines.length > maxEvents) throw tooMany(maxEvents);
  return lines.map(({ index, line }) => ({ index, result: parseRequestEventText(line, times) }));
}

/**
 * The JSON the text is; undefined when it is NDJSON whose first line is a JSON document of its own
 * (an array: that line is one event rejected, the others go on). A body that is neither, a cut or
 * malformed array, is refused whole.
 */
function parseJsonArray(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    const lineEnd = text.indexOf('\n');
    if (lineEnd > 0 && text.slice(lineEnd).trim().length > 0 && parsedJson(text.slice(0, lineEnd)) !== NOT_JSON) return undefined;
    // Never quote the input: it may hold a secret (see request-event.ts).
    throw validationError([{ path: ['body'], message: 'body starts as a JSON array but is not valid JSON' }]);
  }
}

function tooMany(maxEvents: number): HttpError {
  return validationError([{ path: ['body'], message: `at most ${maxEvents} events per request` }]);
}

/** A post no buffer state could take: 400, not a 503 a client would retry for ever. */
function moreThanBuffered(maxBufferedRows: number): HttpError {
  return validationError([{ path: ['body'], message: `at most ${maxBufferedRows} events per request: the worker holds at most that many waiting for storage (STORE_MAX_BUFFERED_ROWS)` }]);
}

/** 503 with Retry-After: the same code whichever way events are stored, so clients retry alike. */
function stillStarting(): HttpError {
  return new HttpError(503, 'STORAGE_UNAVAILABLE', 'Storage has not yet said which events were stored before this worker started; retry later', undefined, { 'retry-after': '5' });
}

/**
 * A post that waited on start-up when the worker began to stop: as the server answers a request that
 * arrives then (http/server.ts), with the connection closed, so that the client retries on another
 * replica and its kept-alive socket does not hold the server's close.
 */
function shuttingDown(): HttpError {
  return new HttpError(503, 'SERVICE_UNAVAILABLE', 'The worker is shutting down; retry', undefined, { 'retry-after': '1', connection: 'close' });
}

function detectionNotJudging(state: string): HttpError {
  return new HttpError(503, 'STORAGE_UNAVAILABLE', `Detection ${state} on this worker; retry later`, undefined, { 'retry-after': '5' });
}

function bufferFull(): HttpError {
  return new HttpError(503, 'STORAGE_UNAVAILABLE', 'Storage is not keeping up with intake; retry later', undefined, { 'retry-after': '5' });
}

function unavailable(viaKafka: boolean): HttpError {
  const message = viaKafka ? 'Kafka did not acknowledge the events; retry later' : 'Storage is unavailable; retry later';
  return new HttpError(503, 'STORAGE_UNAVAILABLE', message, undefined, { 'retry-after': '5' });
}
