/**
 * The request event (contracts section 1): one zod schema used by both ways in (Kafka and HTTP).
 * Contract: parseRequestEvent never throws; it returns either a normalized event or a rejection with
 * a stable reason code and field errors. A value carrying an API key secret is rejected, and the
 * rejection only ever holds redacted text.
 */
import { z } from 'zod';
import { containsSecret, REDACTED, redactSecrets } from './secrets.ts';

export const PLANS = ['free', 'pro', 'business', 'enterprise'] as const;
export type Plan = (typeof PLANS)[number];

/** Times an event may carry, in epoch ms, both ends included. */
export interface TimeRange {
  readonly min: number;
  readonly max: number;
  /** Why the range ends where it does, when that is not the rule's own end (said in the rejection). */
  readonly why?: string;
  /**
   * Events dated more than this many ms before the clock are refused too (how long storage keeps
   * them): a bound that moves with the clock. timesAsOf turns it into `min`, once per batch or post.
   */
  readonly maxAgeMs?: number;
  /** Why the range starts where it does, when that is not the rule's own start (said in the rejection). */
  readonly minWhy?: string;
  /** Events dated more than this many ms after the clock are refused too; timesAsOf turns it into `max`. */
  readonly maxAheadMs?: number;
  /** Why, said in the rejection when that bound is the range's end. */
  readonly aheadWhy?: string;
}

/**
 * The times of the rule, in either form a timestamp may take: from 2000 to 2100. Storage may hold
 * less (storableEventTimes in src/store/event-store.ts); the ways in validate with what it holds.
 */
export const EVENT_TIME_RANGE: TimeRange = { min: Date.UTC(2000, 0, 1), max: Date.UTC(2100, 0, 1) };

/**
 * The range as validation applies it at `nowMs`: with `maxAgeMs`, `min` is raised to nowMs minus it;
 * with `maxAheadMs`, `max` is lowered to nowMs plus it (and the result has neither left). The ways in
 * resolve it once per Kafka batch or post, so that checking an event's time stays two number
 * comparisons, without reading the clock per event.
 */
export function timesAsOf(times: TimeRange, nowMs: number): TimeRange {
  if (times.maxAgeMs === undefined && times.maxAheadMs === undefined) return times;
  const { maxAgeMs, minWhy, maxAheadMs, aheadWhy, ...fixed } = times;
  let resolved: TimeRange = fixed;
  const oldest = maxAgeMs === undefined ? -Infinity : nowMs - maxAgeMs;
  if (oldest > fixed.min) resolved = { ...resolved, min: oldest, ...(minWhy !== undefined && { minWhy }) };
  const latest = maxAheadMs === undefined ? Infinity : nowMs + maxAheadMs;
  if (latest < fixed.max) {
    const { why: _rulesWhy, ...rest } = resolved;
    resolved = { ...rest, max: latest, ...(aheadWhy !== undefined && { why: aheadWhy }) };
  }
  return resolved;
}

export const MAX_USER_AGENT_LENGTH = 512;
const TIMESTAMP_FORMS = 'must be an ISO 8601 time (2026-11-20T12:00:00.000Z) or epoch milliseconds';
/** The largest epoch ms a timestamp may be written as (a Date's own limit); the time range narrows it further. */
export const MAX_EPOCH_MS = 8.64e15;
/** Larger values are not request metadata; they are dead-lettered without being parsed. */
export const MAX_EVENT_BYTES = 64 * 1024;

// The schema only checks; normalization happens after it, in plain code (normalizeEvent), because
// zod transforms cost about half a microsecond each and this runs on every event. The timestamp's
// range is checked after both (validateRequestEvent), on the normalized time, whatever its form.
/** The longest path, in characters. */
export const MAX_PATH_LENGTH = 2048;
/** The longest eventId, merchantId and apiKeyId, in characters. */
export const MAX_ID_LENGTH = 128;
const identifier = z.string().min(1).max(MAX_ID_LENGTH).refine(isDistinctText, 'must be well-formed text: a lone surrogate, or U+FFFD (what bytes that were not UTF-8 became), would be stored as the same id as another');

export const requestEventSchema = z.object({
  eventId: identifier,
  // Epoch ms with a fraction are taken, as an ISO time's digits past the ms are: normalizeEvent truncates.
  timestamp: z.union([z.iso.datetime({ offset: true, error: TIMESTAMP_FORMS }), z.number().min(-MAX_EPOCH_MS).max(MAX_EPOCH_MS)], { error: TIMESTAMP_FORMS }),
  merchantId: identifier,
  plan: z.enum(PLANS),
  apiKeyId: identifier,
  environment: z.enum(['test', 'live']),
  ip: z.union([z.ipv4(), z.ipv6()], { error: 'must be an IPv4 or IPv6 address' }),
  // Long user agents are a bot signal, not an error: normalizeEvent keeps the head.
  userAgent: z.string(),
  method: z.string().regex(/^[A-Za-z]{1,16}$/, 'must be an HTTP method'),
  path: z.string().min(1).max(MAX_PATH_LENGTH),
  status: z.number().int().min(100).max(599),
  responseTimeMs: z.number().min(0).max(86_400_000),
  // Optional fields may also be null, as many producers' JSON writers send an absent value.
  rateLimitPerMinute: z.number().int().min(1).max(100_000_000).nullish(),
  country: z.string().regex(/^[A-Za-z]{2}$/, 'must be an ISO 3166-1 alpha-2 code').nullish(),
});

/** A validated event, normalized: timestamp in epoch ms, method and country upper case, user agent capped. */
export interface RequestEvent {
  eventId: string;
  timestamp: number;
  merchantId: string;
  plan: Plan;
  apiKeyId: string;
  environment: 'test' | 'live';
  ip: string;
  userAgent: string;
  method: string;
  path: string;
  status: number;
  responseTimeMs: number;
  rateLimitPerMinute?: number;
  country?: string;
}

/**
 * An accepted event of a plan detection does not judge, as validation hands it to detection: only
 * its time counts there (a batch is judged as of its newest event, DetectionEngine.processBatch), so
 * no event object is made for it.
 */
export interface UnjudgedEvent {
  plan: Plan;
  timestamp: number;
  unjudged: true;
}

/** What validation hands to detection for an event. */
export type BatchEvent = RequestEvent | UnjudgedEvent;

/**
 * A user agent cut to MAX_USER_AGENT_LENGTH characters, never inside a surrogate pair. A cut can make
 * a benign token look like a secret (the Slovak locale `sk_SK` cut to `sk_S`): the event would then
 * be refused wherever it is read again (from the topic, with Kafka). The cut token goes instead.
 */
function cutUserAgent(userAgent: string): string {
  let end = MAX_USER_AGENT_LENGTH;
  if (isHighSurrogate(userAgent.charCodeAt(end - 1))) end--;
  const cut = userAgent.slice(0, end);
  return containsSecret(cut) ? cut.replace(/[A-Za-z0-9_%\\-]+$/, '') : cut;
}

function isHighSurrogate(code: number): boolean {
  return code >= 0xd800 && code <= 0xdbff;
}

/** Normalizes zod's output in place (it is a fresh object already): one allocation less per event. */
function normalizeEvent(input: z.output<typeof requestEventSchema>): RequestEvent {
  const event = input as unknown as RequestEvent;
  if (typeof input.timestamp !== 'number' || !Number.isInteger(input.timestamp)) event.timestamp = epochMsOf(input.timestamp);
  if (input.userAgent.length > MAX_USER_AGENT_LENGTH) event.userAgent = cutUserAgent(input.userAgent);
  event.method = input.method.toUpperCase();
  // A null optional field is an absent one (rare: the common case, commonEvent, builds a fresh object).
  if (input.rateLimitPerMinute === null) delete event.rateLimitPerMinute;
  if (input.country === null) delete event.country;
  else if (input.country !== undefined) event.country = input.country.toUpperCase();
  return event;
}

/** The schema's way: the event as the schema validates and normalizes it, or its issues. */
export function schemaEvent(value: unknown): { ok: true; event: RequestEvent } | { ok: false; issues: z.core.$ZodIssue[] } {
  const parsed = requestEventSchema.safeParse(value);
  return parsed.success ? { ok: true, event: normalizeEvent(parsed.data) } : { ok: false, issues: parsed.error.issues };
}

// The schema costs a few microseconds an event. The common case is checked by hand first: the same
// rules as the schema (its own patterns for addresses and times) or stricter ones (an IPv6 address,
// a number out of the safe range, anything unusual is left to the schema), and the same normalized
// event. Whatever it does not accept goes to the schema, which also words the rejection.
const IPV4 = z.regexes.ipv4;
const ISO_DATETIME = z.regexes.datetime({ offset: true });
const METHOD = /^[A-Za-z]{1,16}$/;
const COUNTRY = /^[A-Za-z]{2}$/;
const PLAN_NAMES: ReadonlySet<unknown> = new Set(PLANS);

/** The normalized event for a value the hand-written checks accept (as the schema would); undefined to ask the schema. */
export function commonEvent(value: Record<string, unknown>): RequestEvent | undefined {
  const { eventId, merchantId, plan, apiKeyId, environment, ip, userAgent, method, path, status, responseTimeMs, rateLimitPerMinute, country } = value;
  if (!isName(eventId) || !isName(merchantId) || !isName(apiKeyId)) return undefined;
  const timestamp = epochMs(value.timestamp);
  if (timestamp === undefined) return undefined;
  if (!PLAN_NAMES.has(plan) || (environment !== 'live' && environment !== 'test')) return undefined;
  if (typeof ip !== 'string' || !IPV4.test(ip) || typeof userAgent !== 'string') return undefined;
  if (typeof method !== 'string' || !METHOD.test(method) || typeof path !== 'string' || path.length < 1 || path.length > MAX_PATH_LENGTH) return undefined;
  if (!isIntegerIn(status, 100, 599) || typeof responseTimeMs !== 'number' || !(responseTimeMs >= 0 && responseTimeMs <= 86_400_000)) return undefined;
  if (rateLimitPerMinute != null && !isIntegerIn(rateLimitPerMinute, 1, 100_000_000)) return undefined;
  if (country != null && (typeof country !== 'string' || !COUNTRY.test(country))) return undefined;
  const event = {
    eventId,
    timestamp,
    merchantId,
    plan,
    apiKeyId,
    environment,
    ip,
    userAgent: userAgent.length > MAX_USER_AGENT_LENGTH ? cutUserAgent(userAgent) : userAgent,
    method: method.toUpperCase(),
    path,
    status,
    responseTimeMs,
  } as RequestEvent;
  if (rateLimitPerMinute != null) event.rateLimitPerMinute = rateLimitPerMinute as number;
  if (country != null) event.country = (country as string).toUpperCase();
  return event;
}

/** A timestamp the schema accepts, in epoch ms; undefined for anything else. */
function epochMs(timestamp: unknown): number | undefined {
  if (typeof timestamp === 'number') return Math.abs(timestamp) <= MAX_EPOCH_MS ? Math.floor(timestamp) : undefined;
  if (typeof timestamp !== 'string') return undefined;
  const canonical = canonicalUtcTime(timestamp);
  if (canonical !== undefined) return canonical;
  return ISO_DATETIME.test(timestamp) ? Date.parse(timestamp) : undefined;
}

/**
 * The common form, "YYYY-MM-DDTHH:MM:SS.sssZ" (what toISOString writes) in a year from 1000 on, read by
 * hand: a third of the time of the schema's pattern and Date.parse. Undefined for any other text, and
 * for an impossible date (the pattern's rule: days per month, 29 February in leap years only).
 */
function canonicalUtcTime(text: string): number | undefined {
  if (text.length !== 24 || text[4] !== '-' || text[7] !== '-' || text[10] !== 'T' || text[13] !== ':' || text[16] !== ':' || text[19] !== '.' || text[23] !== 'Z') {
    return undefined;
  }
  const year = digits(text, 0, 4);
  const month = digits(text, 5, 2);
  const day = digits(text, 8, 2);
  const hour = digits(text, 11, 2);
  const minute = digits(text, 14, 2);
  const second = digits(text, 17, 2);
  const millisecond = digits(text, 20, 3);
  if (!(year >= 1000 && month >= 1 && month <= 12 && day >= 1 && day <= daysIn(year, month) && hour <= 23 && minute <= 59 && second <= 59 && millisecond >= 0)) {
    return undefined;
  }
  return Date.UTC(year, month - 1, day, hour, minute, second, millisecond);
}

/** Days in the month (1-12) of the year, by the Gregorian calendar. */
export function daysIn(year: number, month: number): number {
  if (month !== 2) return month === 4 || month === 6 || month === 9 || month === 11 ? 30 : 31;
  return year % 4 === 0 && (year % 100 !== 0 || year % 400 === 0) ? 29 : 28;
}

/** The number written by `length` decimal digits from `start`; NaN when one is not a digit. */
function digits(text: string, start: number, length: number): number {
  let value = 0;
  for (let i = start; i < start + length; i++) {
    const digit = text.charCodeAt(i) - 48;
    if (digit < 0 || digit > 9) return NaN;
    value = value * 10 + digit;
  }
  return value;
}

function isName(value: unknown): value is string {
  return typeof value === 'string' && value.length >= 1 && value.length <= MAX_ID_LENGTH && isDistinctText(value);
}

const MAYBE_INDISTINCT = /[\uD800-\uDFFF\uFFFD]/;
const INDISTINCT = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]|\uFFFD/;

/**
 * Text storage keeps apart from other text: no lone surrogate (storage writes each as U+FFFD, so
 * `x\uD800` and `x\uD801` would be one id, and an id re-read after a restart would not match its
 * original) and no U+FFFD (what a Kafka value's or a post's bytes that were not UTF-8 became: two
 * different ids would be one). The first test is the cheap one: most text has no surrogate at all.
 */
function isDistinctText(value: string): boolean {
  return !MAYBE_INDISTINCT.test(value) || !INDISTINCT.test(value);
}

function isIntegerIn(value: unknown, min: number, max: number): value is number {
  return Number.isSafeInteger(value) && (value as number) >= min && (value as number) <= max;
}

export type RejectionReason = 'invalid_json' | 'not_an_object' | 'validation_failed' | 'secret_in_event' | 'too_large' | 'empty';

export interface FieldError {
  path: (string | number)[];
  message: string;
}

export interface Rejection {
  reason: RejectionReason;
  errors: FieldError[];
  /** The eventId when one could be read, for reporting; redacted. */
  eventId?: string;
  /**
   * The event re-serialized with its JSON escapes resolved and its secrets redacted: a dead letter's
   * payload when an escape (`sk\u005f…`) hid a secret from a search of the raw text.
   */
  redactedPayload?: string;
  /**
   * A secret_in_event rejection's event with its secrets redacted, when that is a valid event whose
   * secret was not in an identity field: what the key's caller sent (a user agent, a raw path) is
   * theirs to fill, so detection still judges it (it is dead-lettered, not stored). Otherwise anyone
   * could hide an attack by adding `sk_x` to their user agent.
   */
  redactedEvent?: RequestEvent;
}

export type ParseResult = { ok: true; event: RequestEvent } | { ok: false; rejection: Rejection };

/** Parses and validates one event from its raw JSON text (a Kafka value or an NDJSON line), dated within `times`. */
export function parseRequestEventText(text: string, times: TimeRange = EVENT_TIME_RANGE): ParseResult {
  if (text.length === 0) return reject('empty', [{ path: [], message: 'empty message' }]);
  if (isTooLarge(text)) return tooLarge();
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (error) {
    return reject('invalid_json', [{ path: [], message: jsonErrorMessage(error) }]);
  }
  // With a backslash, the escape-resolved value is checked first, even when the raw text shows a
  // secret already: its redacted serialization becomes the dead letter's payload, so that a second
  // secret that JSON escapes hide cannot ride along beside a plain one.
  if (text.includes('\\')) {
    const refused = secretCheck(value, times);
    if (refused) return refused;
  }
  // The secret check runs on the text only when the cheap pre-check inside containsSecret hits.
  if (containsSecret(text)) return rejectSecret(value, times);
  return validateRequestEvent(value, times);
}

/** Validates an already-parsed value (HTTP JSON array items), dated within `times`; its size is that of its JSON. */
export function parseRequestEventValue(value: unknown, times: TimeRange = EVENT_TIME_RANGE): ParseResult {
  if (value !== null && typeof value === 'object') {
    const refused = secretCheck(value, times, { checkSize: true });
    if (refused) return refused;
  }
  return validateRequestEvent(value, times);
}

/** Whether the text is over MAX_EVENT_BYTES in UTF-8. */
function isTooLarge(text: string): boolean {
  // A string's UTF-16 length is at most its UTF-8 size, and at least a third of it: bytes are
  // counted only in between, which the events of ordinary traffic never reach.
  return text.length > MAX_EVENT_BYTES || (text.length > MAX_EVENT_BYTES / 3 && Buffer.byteLength(text) > MAX_EVENT_BYTES);
}

export function tooLarge(): ParseResult {
  return reject('too_large', [{ path: [], message: `event larger than ${MAX_EVENT_BYTES} bytes` }]);
}

/**
 * The secret check of a parsed value, whose strings have their JSON escapes resolved. Refuses too a
 * value too deeply nested to serialize (it could not be an event anyway), and with `checkSize` one
 * whose JSON is over MAX_EVENT_BYTES.
 */
function secretCheck(value: unknown, times: TimeRange, { checkSize = false } = {}): ParseResult | undefined {
  let text: string;
  try {
    text = JSON.stringify(value) ?? '';
  } catch {
    return reject('validation_failed', [{ path: [], message: 'event is nested too deeply' }]);
  }
  if (checkSize && isTooLarge(text)) return tooLarge();
  if (!containsSecret(text)) return undefined;
  const refused = rejectSecret(value, times);
  if (!refused.ok) refused.rejection.redactedPayload = redactSecrets(text);
  return refused;
}

/**
 * JSON.parse's message without the excerpt of the input that V8 quotes in some messages
 * (`Unexpected token 'x', "…" is not valid JSON`): the excerpt may hold the tail of a secret, which
 * redaction cannot recognise without its `sk_`.
 */
function jsonErrorMessage(error: unknown): string {
  const message = error instanceof Error ? error.message : 'not valid JSON';
  const quote = message.indexOf('"');
  return quote === -1 ? message : `${message.slice(0, quote).replace(/[\s,]+$/, '')}: not valid JSON`;
}

function validateRequestEvent(value: unknown, times: TimeRange): ParseResult {
  // A range not resolved by the caller (timesAsOf, once per batch) is resolved here, per event.
  if (times.maxAgeMs !== undefined || times.maxAheadMs !== undefined) times = timesAsOf(times, Date.now());
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    return reject('not_an_object', [{ path: [], message: 'event must be a JSON object' }]);
  }
  const common = commonEvent(value as Record<string, unknown>);
  const parsed = common ? { ok: true as const, event: common } : schemaEvent(value);
  // Checked on a rejection too, so that it lists every problem, unless the schema refused the timestamp itself.
  const time = parsed.ok
    ? parsed.event.timestamp
    : parsed.issues.some((issue) => issue.path[0] === 'timestamp')
      ? undefined
      : epochMsOf((value as Record<string, unknown>).timestamp);
  const outside = time === undefined ? undefined : timeOutside(time, times);
  if (parsed.ok && !outside) return parsed;
  const errors: FieldError[] = parsed.ok
    ? []
    : parsed.issues.map((issue) => ({
        path: issue.path.filter((key): key is string | number => typeof key !== 'symbol'),
        message: redactSecrets(issue.message),
      }));
  if (outside) errors.push(outside);
  return reject('validation_failed', errors, readEventId(value));
}

/** A timestamp the schema took (epoch ms, or an ISO string), in epoch ms (whole), as normalizeEvent reads it. */
function epochMsOf(timestamp: unknown): number {
  return typeof timestamp === 'number' ? Math.floor(timestamp) : Date.parse(String(timestamp));
}

/** The timestamp's error when the time is outside `times`; undefined inside. */
function timeOutside(ms: number, times: TimeRange): FieldError | undefined {
  if (ms >= times.min && ms <= times.max) return undefined;
  const range = `must be a time from ${new Date(times.min).toISOString()} to ${new Date(times.max).toISOString()}`;
  const why = ms < times.min ? times.minWhy : times.why;
  return { path: ['timestamp'], message: why ? `${range}: ${why}` : range };
}

function rejectSecret(value: unknown, times: TimeRange): ParseResult {
  const refused = reject(
    'secret_in_event',
    [{ path: [], message: 'event carries an API key secret (sk_...); it was redacted and the event rejected' }],
    readEventId(value),
  );
  const redactedEvent = judgeableWithoutSecrets(value, times);
  if (!refused.ok && redactedEvent) refused.rejection.redactedEvent = redactedEvent;
  return refused;
}

const IDENTITY_FIELDS = ['eventId', 'merchantId', 'apiKeyId'] as const;

/**
 * The value with every string field's secrets redacted, validated; undefined when that fails, an
 * identity field held a secret, or what is left still reads as one to the check that refused it.
 */
function judgeableWithoutSecrets(value: unknown, times: TimeRange): RequestEvent | undefined {
  if (value === null || typeof value !== 'object' || Array.isArray(value)) return undefined;
  // fromEntries defines each field as its own (a "__proto__" field stays a field, as JSON.parse made it).
  const redacted: Record<string, unknown> = Object.fromEntries(Object.entries(value).map(([field, fieldValue]) => [field, typeof fieldValue === 'string' ? redactedField(fieldValue) : fieldValue]));
  if (IDENTITY_FIELDS.some((field) => redacted[field] !== (value as Record<string, unknown>)[field])) return undefined;
  // Each `sk_1` becomes the longer `sk_[REDACTED]`: a path padded with them would pass its bound.
  if (typeof redacted.path === 'string' && redacted.path.length > MAX_PATH_LENGTH) redacted.path = redacted.path.slice(0, MAX_PATH_LENGTH);
  // A field that still reads as a secret (the cut made `sk_SK` into `sk_S`) goes whole, not the event:
  // dropping it would let a crafted path hide the request from detection.
  for (const field of CALLER_FIELDS) {
    if (typeof redacted[field] === 'string' && containsSecret(JSON.stringify(redacted[field]))) redacted[field] = REDACTED;
  }
  const result = validateRequestEvent(redacted, times);
  return result.ok && !containsSecret(JSON.stringify(result.event)) ? result.event : undefined;
}

/** The fields whose text the key's caller chooses. */
const CALLER_FIELDS = ['userAgent', 'path'] as const;

/**
 * A field's text redacted as the check that refused it reads it: in its JSON form, where an escape
 * written out in the text (`\u0073k_…` as six characters) reads as one too.
 */
function redactedField(text: string): string {
  const json = JSON.stringify(text);
  const redacted = redactSecrets(json);
  if (redacted === json) return redactSecrets(text);
  // A secret that began inside an escape (`\\u0073k_…`: an escaped backslash, then `u0073k_…`) leaves
  // that escape's backslash before the marker, which JSON does not read: it goes. Else the whole field does.
  for (const candidate of [redacted, redacted.replace(/\\+(?=sk_\[REDACTED\])/g, '')]) {
    try {
      const parsed: unknown = JSON.parse(candidate);
      if (typeof parsed === 'string') return parsed;
    } catch {
      // the next candidate
    }
  }
  return REDACTED;
}

function reject(reason: RejectionReason, errors: FieldError[], eventId?: string): ParseResult {
  return { ok: false, rejection: eventId === undefined ? { reason, errors } : { reason, errors, eventId } };
}

function readEventId(value: unknown): string | undefined {
  if (value === null || typeof value !== 'object') return undefined;
  const eventId = (value as Record<string, unknown>).eventId;
  // Redacted whole, then cut: cut first, a secret across the cut could leave its head (`sk_AB`), which redaction no longer recognises.
  return typeof eventId === 'string' ? redactSecrets(eventId).slice(0, 128) : undefined;
}
