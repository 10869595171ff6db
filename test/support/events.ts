/**
 * Request events for tests and benchmarks: ordinary traffic of about 300 bytes an event, and
 * malformed messages of every kind the worker must dead-letter, each with the reason it expects.
 */
import type { Plan, RejectionReason } from '../../src/events/request-event.ts';
import { redactSecrets } from '../../src/events/secrets.ts';

const USER_AGENTS = [
  'okhttp/4.12.0',
  'python-requests/2.32.3',
  'axios/1.7.7',
  'Go-http-client/2.0',
  'Mozilla/5.0 (Macintosh; Intel Mac OS X 14_5) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.5 Safari/605.1.15',
];
const PATHS = ['/v1/verify/sessions', '/v1/verify/sessions/:id'];
const PLANS: readonly Plan[] = ['business', 'enterprise', 'pro', 'free'];

const DAY_MS = 86_400_000;
/** The day these suites' fixed event times were written against. */
const WRITTEN_ON = Date.UTC(2026, 10, 22);

/**
 * A fixed event time, as written in a test (November 2026), moved forward by the whole days since:
 * the same time of day, as many days before today. Workers refuse events older than EVENTS_TTL_DAYS,
 * so times written as constants must follow the clock to stay storable whatever day the suite runs.
 */
export function asOfToday(writtenMs: number): number {
  return writtenMs + Math.max(0, Math.floor((Date.now() - WRITTEN_ON) / DAY_MS)) * DAY_MS;
}

export interface EventOptions {
  runId: string;
  /** Epoch ms of event 0; event i is i ms later. */
  startMs: number;
  merchants?: number;
  keys?: number;
  /** The plans keys are on, in turn (default all four: half of the keys entitled to detection). */
  plans?: readonly Plan[];
}

export type RequestEventInput = Record<string, unknown> & { eventId: string; apiKeyId: string; merchantId: string; status: number };

export function makeEvent(i: number, options: EventOptions): RequestEventInput {
  const key = i % (options.keys ?? 1000);
  return {
    eventId: `evt_${options.runId}_${i}`,
    timestamp: new Date(options.startMs + i).toISOString(),
    merchantId: `m_${key % (options.merchants ?? 50)}`,
    plan: (options.plans ?? PLANS)[key % (options.plans ?? PLANS).length],
    apiKeyId: `pk_live_${options.runId}_${key}`,
    environment: 'live',
    // A server-side integration calls from a few addresses of its own network.
    ip: `198.51.${(key >> 8) & 255}.${(key & 255) ^ (i % 3)}`,
    userAgent: USER_AGENTS[key % USER_AGENTS.length]!,
    method: i % 3 === 0 ? 'GET' : 'POST',
    path: PATHS[i % 2]!,
    status: i % 17 === 0 ? 401 : i % 5 === 0 ? 200 : 201,
    responseTimeMs: 20 + (i % 180),
  };
}

/** The i-th malformed message (a Kafka value) and the dead-letter reason it must get. */
export function makeMalformed(i: number, options: EventOptions): { value: string; reason: RejectionReason } {
  const event = makeEvent(i, options);
  switch (i % 5) {
    case 0:
      return { value: `{"eventId":"${event.eventId}", truncated`, reason: 'invalid_json' };
    case 1:
      return { value: JSON.stringify({ ...event, ip: '300.1.2.3' }), reason: 'validation_failed' };
    case 2: {
      const { status: _status, ...withoutStatus } = event;
      return { value: JSON.stringify(withoutStatus), reason: 'validation_failed' };
    }
    case 3:
      return { value: JSON.stringify({ ...event, apiKeyId: `svc_live_pk_x.sk_live_SECRET${i}abcdef` }), reason: 'secret_in_event' };
    default:
      return { value: JSON.stringify([event]), reason: 'not_an_object' };
  }
}

export interface MixedStream {
  /** Kafka messages keyed by API key, in order. */
  messages: { key: string; value: string }[];
  /** Redacted value of each malformed message -> the dead-letter reason it must get. */
  expectedDeadLetters: Map<string, string>;
  /** Valid events per merchant. */
  validByMerchant: Map<string, number>;
  valid: number;
}

/** `total` messages of which one in a hundred is malformed (rotating through every kind). */
export function makeMixedStream(total: number, options: EventOptions): MixedStream {
  const stream: MixedStream = { messages: [], expectedDeadLetters: new Map(), validByMerchant: new Map(), valid: 0 };
  for (let i = 0; i < total; i++) {
    const event = makeEvent(i, options);
    if (i % 100 === 50) {
      const malformed = makeMalformed(i, options);
      stream.expectedDeadLetters.set(redactSecrets(malformed.value), malformed.reason);
      stream.messages.push({ key: event.apiKeyId, value: malformed.value });
    } else {
      stream.valid++;
      stream.validByMerchant.set(event.merchantId, (stream.validByMerchant.get(event.merchantId) ?? 0) + 1);
      stream.messages.push({ key: event.apiKeyId, value: JSON.stringify(event) });
    }
  }
  return stream;
}

/** Texts in UTF-8 back to back, and where each ends: message values or keys as a Kafka batch carries them to validation (RawBatch). */
export function packed(texts: readonly string[]): { bytes: Uint8Array; ends: Uint32Array } {
  const encoder = new TextEncoder();
  const encoded = texts.map((text) => encoder.encode(text));
  const bytes = new Uint8Array(encoded.reduce((sum, text) => sum + text.length, 0));
  const ends = new Uint32Array(texts.length);
  let position = 0;
  encoded.forEach((text, i) => {
    bytes.set(text, position);
    ends[i] = position += text.length;
  });
  return { bytes, ends };
}
