import { describe, expect, it } from 'vitest';
import { EVENT_TIME_RANGE, parseRequestEventText, type TimeRange } from '../events/request-event.ts';
import { containsSecret } from '../events/secrets.ts';
import { serializeEventRow, tsvText } from '../store/event-store.ts';
import { prng } from '../../test/support/random.ts';
import { EventScanner } from './event-scanner.ts';
import { RowBuffer } from './row-buffer.ts';

const T0 = Date.UTC(2026, 10, 20, 12, 0, 0);
const SOURCE = { topic: 'api.request-metadata', partition: 3, offset: 4_242 };

function event(overrides: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    eventId: 'evt_1',
    timestamp: new Date(T0).toISOString(),
    merchantId: 'm_1',
    plan: 'business',
    apiKeyId: 'pk_live_a',
    environment: 'live',
    ip: '203.0.113.7',
    userAgent: 'okhttp/4.12.0',
    method: 'get',
    path: '/v1/verify/sessions',
    status: 200,
    responseTimeMs: 12,
    ...overrides,
  };
}

const scanner = new EventScanner();
const encoder = new TextEncoder();

/** The fast path's reading of `text`: undefined when it declines, else its row and event. */
function fast(text: string, times: TimeRange = EVENT_TIME_RANGE) {
  // Another message before and after it, as in a batch: the scanner must keep to its own bytes.
  const before = encoder.encode('{"eventId":"evt_before"}');
  const message = encoder.encode(text);
  const bytes = new Uint8Array([...before, ...message, ...encoder.encode('"x"}')]);
  if (!scanner.read(bytes, before.length, before.length + message.length, times)) return undefined;
  // As validateBatch: a hint of a secret is searched for in the text, and a secret found goes the slow way.
  if (scanner.mayHoldSecret && containsSecret(text)) return undefined;
  const rows = new RowBuffer(16);
  scanner.writeRow(rows, tsvText(SOURCE.topic), SOURCE.partition, SOURCE.offset);
  return { row: rows.bytes().toString('utf8'), event: scanner.event(Buffer.from(bytes)) };
}

/** The slow path's verdict on `text`, and the row it stores. */
function slow(text: string, times: TimeRange = EVENT_TIME_RANGE) {
  const result = parseRequestEventText(text, times);
  return result.ok ? { row: `${serializeEventRow(result.event, SOURCE, text)}\n`, event: result.event } : undefined;
}

describe('EventScanner', () => {
  it.each([
    ['an ISO timestamp', event()],
    ['epoch milliseconds', event({ timestamp: T0 + 17 })],
    ['every optional field', event({ rateLimitPerMinute: 600, country: 'de' })],
    ['optional fields null', event({ rateLimitPerMinute: null, country: null })],
    ['a fractional response time', event({ responseTimeMs: 12.5 })],
    ['fields the event does not have', event({ traceId: 'abc', retries: 2, cached: false, parent: null })],
    ['an empty user agent', event({ userAgent: '' })],
    ['a percent-encoded path', event({ path: '/v1/search?q=a%20b' })],
    ['hints of a secret that are none', event({ userAgent: 'FBLC/sk_SK/FBAV svc_live_a', path: '/v1/desk_lamp' })],
  ])('reads an event in the common form (%s) as the slow path does, and writes the same row', (_, value) => {
    const text = JSON.stringify(value);
    const read = fast(text);
    expect(read).toBeDefined();
    expect(read).toEqual(slow(text));
  });

  it('reads JSON whitespace anywhere between tokens', () => {
    const fields = Object.entries(event({ rateLimitPerMinute: null })).map(([name, value]) => `\t${JSON.stringify(name)} :\r\n ${JSON.stringify(value)} `);
    const text = ` {\n${fields.join(',\n')}}\n `;
    expect(fast(text)).toEqual(slow(text));
    expect(fast(text)).toBeDefined();
  });

  it.each([
    ['an escape', JSON.stringify(event({ userAgent: 'tab\there' }))],
    ['a secret hint', JSON.stringify(event({ path: '/v1/keys/sk_live_abc' }))],
    ['a service key', JSON.stringify(event({ userAgent: 'svc_live_a.b1c2' }))],
    ['a percent-encoded secret', JSON.stringify(event({ path: '/v1/a?key=sk%5Flive_abc' }))],
    ['a field given twice', JSON.stringify(event()).replace('{', '{"status":500,')],
    ['a nested value', JSON.stringify(event({ extra: { a: 1 } }))],
    ['an IPv6 address', JSON.stringify(event({ ip: '2001:db8::1' }))],
    ['a long user agent', JSON.stringify(event({ userAgent: 'x'.repeat(600) }))],
    ['non-ASCII text', JSON.stringify(event({ userAgent: 'Café' }))],
    ['a response time in more digits than a number needs', JSON.stringify(event()).replace('"responseTimeMs":12', `"responseTimeMs":12.${'0'.repeat(60_000)}`)],
  ])('declines what the slow path must decide (%s)', (_, text) => {
    expect(fast(text)).toBeUndefined();
  });

  it('declines an event outside the time range given, as the slow path rejects it', () => {
    const times = { min: T0 - 1_000, max: T0 + 1_000 };
    for (const timestamp of [T0 - 1_001, T0 + 1_001, new Date(T0 + 5_000).toISOString()]) {
      const text = JSON.stringify(event({ timestamp }));
      expect(fast(text, times)).toBeUndefined();
      expect(slow(text, times)).toBeUndefined();
    }
    expect(fast(JSON.stringify(event({ timestamp: T0 + 1_000 })), times)).toEqual(slow(JSON.stringify(event({ timestamp: T0 + 1_000 })), times));
  });

  it('never takes what the slow path refuses, and takes what it does with the same row and event (differential, seeded)', () => {
    const random = prng(45);
    const pick = <T>(values: readonly T[]): T => values[Math.floor(random() * values.length)]!;
    const odd: Record<string, readonly unknown[]> = {
      eventId: ['', 'e', 'x'.repeat(128), 'x'.repeat(129), 7, null],
      timestamp: [T0, -1, 0, 1.5, 8.64e15, 8.64e15 + 1, 1e16, '2026-02-29T00:00:00.000Z', '2028-02-29T00:00:00.000Z', '2026-11-20T12:00:00Z', '2026-11-20T12:00:00.000+00:00', '2026-11-20T24:00:00.000Z', '0999-01-01T00:00:00.000Z', '2026-13-01T00:00:00.000Z', 'yesterday', null, true],
      merchantId: ['', 'm', 'x'.repeat(129), false],
      plan: ['free', 'pro', 'enterprise', 'Business', 'gold', ''],
      apiKeyId: ['', 'pk_test_b', 1],
      environment: ['test', 'live', 'LIVE', 'prod'],
      ip: ['1.2.3.4', '0.0.0.0', '255.255.255.255', '256.1.1.1', '01.2.3.4', '1.2.3', '1.2.3.4.5', '1.2.3.04', ' 1.2.3.4', '::1', '1..2.3', 12],
      userAgent: ['', 'x'.repeat(512), 'x'.repeat(513), 'curl/8.5.0', 'sk_live_abc', 'FBLC/sk_SK', 'a%41b', 'svc_live_k.s3cr3t', 'desk_lamp svc_x', 5, null],
      method: ['GET', 'post', 'PaTcH', '', 'G3T', 'x'.repeat(16), 'x'.repeat(17), 'GET '],
      path: ['', '/', 'x'.repeat(2048), 'x'.repeat(2049), '/v1/a?b=c', '/v1/a%2Fb', '/v1/key/sk_test_1', '/v1/a?k=sk%5Ftest_1', null],
      status: [100, 599, 99, 600, 200.5, -200, '200', 2e2, null],
      responseTimeMs: [0, 86_400_000, 86_400_001, 0.25, 1e-7, -0, -1, 1e3, '5', null, 12.0],
      rateLimitPerMinute: [1, 100_000_000, 100_000_001, 0, -5, 1.5, 6e1, null, '60', undefined],
      country: ['us', 'DE', 'usa', 'u', '', 'u1', null, 7, undefined],
      extra: [1, -0.5, 1e400, true, false, null, 'text', [], {}, undefined],
    };
    const mangle = (text: string): string => {
      const at = Math.floor(random() * text.length);
      switch (Math.floor(random() * 8)) {
        case 0: return text.slice(0, at); // truncated
        case 1: return text.slice(0, at) + pick(['{', '}', ',', ':', '"', ' ', '0', '-', '.', 'e', 'n', '[', '\u0001', '\\']) + text.slice(at); // a stray character
        case 2: return text.slice(0, at) + text.slice(at + 1 + Math.floor(random() * 3)); // characters lost
        case 3: return `${text}${pick([' ', '\n', 'x', '{}', ','])}`; // after the object
        case 4: return text.replace(/:(\d+)/, (_, digits: string) => `:${pick(['0', '-', '00', ''])}${digits}${pick(['', '.0', 'e0', 'E+1', '.'])}`); // a number's forms
        default: return text;
      }
    };
    let taken = 0;
    let agreed = 0;
    for (let i = 0; i < 20_000; i++) {
      const value = event();
      for (let changes = Math.floor(random() * 3); changes > 0; changes--) {
        const field = pick(Object.keys(odd));
        const replacement = pick(odd[field]!);
        if (replacement === undefined) delete value[field];
        else value[field] = replacement;
      }
      if (random() < 0.1) delete value[pick(Object.keys(value))];
      const text = mangle(JSON.stringify(value));
      const read = fast(text);
      const expected = slow(text);
      if (read !== undefined) {
        taken++;
        expect(read, text).toEqual(expected);
      } else if (expected === undefined) {
        agreed++;
      }
    }
    // Both ways were exercised: many events taken fast, many refused by both.
    expect(taken).toBeGreaterThan(3_000);
    expect(agreed).toBeGreaterThan(3_000);
  });
});
