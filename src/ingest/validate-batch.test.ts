import { describe, expect, it } from 'vitest';
import { REQUEST_EVENT_COLUMNS, storableEventTimes, tsvText } from '../store/event-store.ts';
import { MAX_EVENT_BYTES, type BatchEvent, type RequestEvent } from '../events/request-event.ts';
import { packed } from '../../test/support/events.ts';
import { prng } from '../../test/support/random.ts';
import { RecentEventIds } from './recent-event-ids.ts';
import { MAX_COPIED_KEY_BYTES, MAX_COPIED_VALUE_BYTES, validateBatch, type RawBatch } from './validate-batch.ts';

const T0 = Date.UTC(2026, 10, 20, 12, 0, 0);

function event(i: number, userAgent = 'okhttp/4.12.0', apiKeyId = 'pk_live_a'): string {
  return JSON.stringify({
    eventId: `evt_${i}`,
    timestamp: T0 + i,
    merchantId: 'm_1',
    plan: 'business',
    apiKeyId,
    environment: 'live',
    ip: '203.0.113.7',
    userAgent,
    method: 'GET',
    path: '/v1/verify/sessions',
    status: 200,
    responseTimeMs: 12,
  });
}

/** A batch of messages keyed `pk_live_a` (the events' apiKeyId), unless `keys` says otherwise ('' for a message without a key). */
function batchOf(texts: string[], partition = 0, keys: readonly string[] = texts.map(() => 'pk_live_a')): RawBatch {
  const values = packed(texts);
  const messageKeys = packed(keys);
  return {
    topic: 't',
    partition,
    values: values.bytes,
    ends: values.ends,
    keys: messageKeys.bytes,
    keyEnds: messageKeys.ends,
    offsets: Float64Array.from(texts, (_, i) => 100 + i),
    timestamps: Float64Array.from(texts, (_, i) => T0 + i),
  };
}

/** The events, every one whole (none an UnjudgedEvent). */
function whole(events: readonly BatchEvent[]): RequestEvent[] {
  return events.map((e) => {
    if ('unjudged' in e) throw new Error(`an UnjudgedEvent of ${e.plan}`);
    return e;
  });
}

describe('validateBatch', () => {
  it('hands over its rows in memory about their size, which the write buffer holds until they are stored, written there without a copy', () => {
    const recentIds = new RecentEventIds(100_000);
    // Events whose rows are most of their messages (a long user agent), as the fleet's often are.
    const batch = (from: number) => batchOf(Array.from({ length: 2_000 }, (_, i) => event(from + i, `Mozilla/5.0 ${'x'.repeat(200)}`)));
    const first = validateBatch(batch(0), recentIds);
    const repeats = validateBatch(batch(0), recentIds); // all repeats: no rows
    const mostlyRepeats = validateBatch(batch(1), recentIds); // one new event
    const next = validateBatch(batch(2_001), recentIds);
    expect([first.rowCount, repeats.rowCount, mostlyRepeats.rowCount, next.rowCount]).toEqual([2_000, 0, 1, 2_000]);
    // Rows are shorter than their messages: memory sized to the messages is trimmed (a copy of the rows).
    expect(first.rows.buffer.byteLength).toBeLessThanOrEqual(1.05 * first.rows.length + 4096);
    expect(repeats.rows.buffer.byteLength).toBe(0);
    // The next batch's memory is sized by the rows before it, per byte of the messages they were read
    // from (repeats say nothing of it): some of it is left over, so the rows are in the memory they were written in.
    expect(next.rows.buffer.byteLength).toBeGreaterThan(next.rows.length);
    expect(next.rows.buffer.byteLength).toBeLessThanOrEqual(1.05 * next.rows.length + 4096);
  });

  it('takes a lost partition\'s messages, delivered again when it comes back, for new events', () => {
    const recentIds = new RecentEventIds(100);
    const first = [event(1), event(2)];
    const other = [event(3)];
    expect(validateBatch(batchOf(first, 0), recentIds).rowCount).toBe(2);
    expect(validateBatch(batchOf(other, 1), recentIds).rowCount).toBe(1);
    // Partition 0 goes to another replica (its unstored rows are dropped) and comes back.
    recentIds.keepPartitions(new Set([1]));
    const again = validateBatch(batchOf(first, 0), recentIds);
    expect(again.rowCount).toBe(2);
    expect(again.duplicates).toBe(0);
    // Partition 1 stayed: a repeat there is still a repeat.
    expect(validateBatch(batchOf(other, 1), recentIds).duplicates).toBe(1);
  });

  it.each([
    ['ASCII', 'okhttp/4.12.0'],
    ['UTF-8', 'Mozilla/5.0 (Linux; Android 14; Pixel 8) Café/1.0 ✓'],
    ['escapes', 'tab\there, back\\slash'],
  ])('reads each message of a batch (%s): accepted, duplicate, rejected', (_, userAgent) => {
    const result = validateBatch(batchOf([event(1, userAgent), event(2), event(1, userAgent), '{"eventId":"evt_3", trunc', event(4)]), new RecentEventIds(100));
    expect(whole(result.events).map((e) => e.eventId)).toEqual(['evt_1', 'evt_2', 'evt_4']);
    expect(whole(result.events)[0]!.userAgent).toBe(userAgent);
    expect(result.rowCount).toBe(3);
    expect(result.duplicates).toBe(1);
    expect(result.rejections.map((r) => [r.index, r.rejection.reason, r.text, r.offset, r.timestamp])).toEqual([[3, 'invalid_json', '{"eventId":"evt_3", trunc', '103', String(T0 + 3)]]);
    const firstRow = new TextDecoder().decode(result.rows).split('\n')[0]!.split('\t');
    expect(firstRow).toHaveLength(REQUEST_EVENT_COLUMNS.length);
    expect(firstRow[REQUEST_EVENT_COLUMNS.indexOf('user_agent')]).toBe(tsvText(userAgent));
    expect(firstRow[REQUEST_EVENT_COLUMNS.indexOf('source_offset')]).toBe('100');
  });
});

describe('validateBatch and its fast path', () => {
  it('hands detection an UnjudgedEvent, its plan and time, for an event of a plan it does not judge, and stores it the same', () => {
    const pro = event(2).replace('"plan":"business"', '"plan":"pro"');
    const judged = validateBatch(batchOf([event(1), pro]), new RecentEventIds(100), undefined, T0, new Set(['business']));
    const all = validateBatch(batchOf([event(1), pro]), new RecentEventIds(100), undefined, T0);
    expect(judged.events).toEqual([all.events[0], { plan: 'pro', timestamp: T0 + 2, unjudged: true }]);
    expect(whole(all.events).map((e) => e.plan)).toEqual(['business', 'pro']);
    expect(Buffer.from(judged.rows).equals(Buffer.from(all.rows))).toBe(true);
  });

  it('stores in UTF-8, and hands whole to detection, an event that is ASCII on the wire but not once its escapes are read', () => {
    const escaped = event(1, 'Caf\u00e9 \u2713').replace('\u00e9', '\\u00e9').replace('\u2713', '\\u2713');
    expect(escaped).toMatch(/^[\x00-\x7f]*$/);
    const result = validateBatch(batchOf([escaped, event(2)]), new RecentEventIds(100), undefined, T0, new Set());
    const userAgents = new TextDecoder().decode(result.rows).trimEnd().split('\n').map((row) => row.split('\t')[REQUEST_EVENT_COLUMNS.indexOf('user_agent')]);
    expect(userAgents).toEqual(['Caf\u00e9 \u2713', 'okhttp/4.12.0']);
    // The slow path read it: a whole event, though its plan is not judged; the other one a stand-in.
    expect(result.events.map((e) => 'unjudged' in e)).toEqual([false, true]);
  });
});

describe('validateBatch and secrets', () => {
  it('dead-letters an event with a secret in its user agent, and hands its redacted copy to detection, not to storage', () => {
    const recentIds = new RecentEventIds(100);
    const tool = 'sqlmap/1.8.2#stable (https://sqlmap.org) sk_1';
    const result = validateBatch(batchOf([event(1, tool), event(2)]), recentIds);
    expect(result.rowCount).toBe(1);
    expect(result.rejections.map((r) => [r.index, r.rejection.reason, 'redactedEvent' in r.rejection])).toEqual([[0, 'secret_in_event', false]]);
    expect(whole(result.events).map((e) => [e.eventId, e.userAgent])).toEqual([['evt_1', 'sqlmap/1.8.2#stable (https://sqlmap.org) sk_[REDACTED]'], ['evt_2', 'okhttp/4.12.0']]);
    // Its id is not taken: the fleet's copy without the secret is stored (detection counts the two as one).
    expect(validateBatch(batchOf([event(1, 'sqlmap/1.8.2#stable (https://sqlmap.org)')]), recentIds)).toMatchObject({ rowCount: 1, duplicates: 0, rejections: [] });
  });
});

describe('validateBatch and message keys', () => {
  it('counts the accepted events whose message key is not their apiKeyId, or that have none', () => {
    const texts = [event(1), event(2, undefined, 'pk_live_b'), event(3), event(4), event(5, undefined, 'pk_live_é'), event(6, undefined, 'pk_live_é'), event(1), 'not json'];
    const keys = ['pk_live_a', 'pk_live_b', 'pk_live_b', '', 'pk_live_é', 'pk_live_e', 'pk_live_b', 'pk_live_b'];
    const result = validateBatch(batchOf(texts, 0, keys), new RecentEventIds(100));
    // evt_3 (another key), evt_4 (no key), evt_6 (a key of other characters); a duplicate and a rejection are not counted.
    expect(result.misrouted).toBe(3);
    expect(result.rowCount).toBe(6);
  });

  it('counts a key with a byte-order mark before the apiKeyId as misrouted (its bytes are partitioned as they are), whether the batch is ASCII or not', () => {
    const keys = ['\ufeffpk_live_a', 'pk_live_a', 'pk_live_a'];
    const ascii = validateBatch(batchOf([event(1), event(2), event(3)], 0, keys), new RecentEventIds(100));
    const notAscii = validateBatch(batchOf([event(1), event(2), event(3, 'Café')], 0, keys), new RecentEventIds(100));
    expect([ascii.misrouted, notAscii.misrouted]).toEqual([1, 1]);
    expect([ascii.rowCount, notAscii.rowCount]).toEqual([3, 3]);
  });

  it('stores a topic name that is not ASCII in UTF-8 (Kafka allows none; a row must still be right)', () => {
    const result = validateBatch({ ...batchOf([event(1)]), topic: 'tøpic' }, new RecentEventIds(100));
    const row = new TextDecoder().decode(result.rows).trimEnd().split('\t');
    expect(row[REQUEST_EVENT_COLUMNS.indexOf('source_topic')]).toBe('tøpic');
  });
});

describe('validateBatch and event times', () => {
  it('rejects, naming the timestamp, an event older than EVENTS_TTL_DAYS as of the batch, which storage would drop at insert while the rollup counts it', () => {
    const times = storableEventTimes(30);
    const dayMs = 86_400_000;
    // Validated 29 days after the events: all taken. 31 days after: the first is older than the raw events are kept.
    const batch = () => batchOf([event(0), event(1)]);
    const early = validateBatch(batch(), new RecentEventIds(100), times, T0 + 29 * dayMs);
    expect({ rows: early.rowCount, rejections: early.rejections.length }).toEqual({ rows: 2, rejections: 0 });
    const late = validateBatch(batch(), new RecentEventIds(100), times, T0 + 30 * dayMs + 1);
    expect(late.rowCount).toBe(1);
    expect(late.rejections.map(({ index, rejection }) => ({ index, reason: rejection.reason, errors: rejection.errors }))).toEqual([
      {
        index: 0,
        reason: 'validation_failed',
        errors: [{ path: ['timestamp'], message: expect.stringContaining('older than the raw events are kept (EVENTS_TTL_DAYS=30)') }],
      },
    ]);
  });
});

describe('validateBatch on mangled messages', () => {
  it('rejects a value over MAX_EVENT_BYTES as too large from its size, reading only its head', () => {
    const huge = `{"eventId":"e_big","userAgent":"${'é'.repeat(200_000)}"}`;
    const result = validateBatch(batchOf([huge, event(1)]), new RecentEventIds(10));
    expect(result.rowCount).toBe(1);
    expect(result.rejections).toEqual([expect.objectContaining({ index: 0, rejection: expect.objectContaining({ reason: 'too_large' }) })]);
    // The head's bytes, 2 a character: half of MAX_COPIED_VALUE_BYTES characters.
    expect(result.rejections[0]!.text).toBe(new TextDecoder().decode(new TextEncoder().encode(huge).subarray(0, MAX_COPIED_VALUE_BYTES)));
    // One byte over: its own bytes only, none of the next message's.
    const justOver = 'x'.repeat(MAX_EVENT_BYTES + 1);
    expect(validateBatch(batchOf([justOver, 'NEXT']), new RecentEventIds(10)).rejections.map((rejection) => rejection.text)).toEqual([justOver, 'NEXT']);
  });

  it('counts a message key longer than any apiKeyId could be as misrouted', () => {
    const result = validateBatch(batchOf([event(1), event(2)], 0, ['é'.repeat(MAX_COPIED_KEY_BYTES), 'pk_live_a']), new RecentEventIds(10));
    expect({ rows: result.rowCount, misrouted: result.misrouted }).toEqual({ rows: 2, misrouted: 1 });
  });

  it('accounts for every message (stored, duplicate or rejected), never throws, and keeps every row whole', () => {
    const random = prng(5);
    const pick = <T>(values: readonly T[]): T => values[Math.floor(random() * values.length)]!;
    const oddValues = [null, true, -1, 1e309, 2 ** 53, '', 'x'.repeat(3000), '\t\n\r\\\u0000', '\ud800', '😀', [], {}, { a: [1] }, '__proto__'];
    const mangle = (text: string): string => {
      const at = Math.floor(random() * text.length);
      switch (Math.floor(random() * 6)) {
        case 0: return text.slice(0, at); // truncated
        case 1: return text.slice(0, at) + String.fromCharCode(Math.floor(random() * 0x10000)) + text.slice(at); // a stray character
        case 2: return text.slice(0, at) + text.slice(at + 1 + Math.floor(random() * 5)); // characters lost
        case 3: { // one field with a value of another kind
          const event = JSON.parse(text) as Record<string, unknown>;
          event[pick(Object.keys(event))] = pick(oddValues);
          return JSON.stringify(event);
        }
        case 4: return JSON.stringify({ ...(JSON.parse(text) as object), userAgent: pick(oddValues), path: `/v1/${pick(['a\tb', 'a\nb', 'a\\b', 'é', '%00'])}` }); // free text of every kind
        default: return text; // left as it is (a duplicate when its id was seen)
      }
    };
    const texts = Array.from({ length: 3_000 }, (_, i) => mangle(event(Math.floor(i / 2))));
    const bytes = batchOf(texts);
    // Some raw bytes that are not UTF-8 at all.
    bytes.values[Math.floor(bytes.values.length / 2)] = 0xff;

    const result = validateBatch(bytes, new RecentEventIds(10_000));
    expect(result.rowCount + result.duplicates + result.rejections.length).toBe(texts.length);
    expect(result.rowCount).toBeGreaterThan(100);
    expect(result.rejections.length).toBeGreaterThan(100);
    const lines = new TextDecoder().decode(result.rows).split('\n');
    expect(lines.pop()).toBe(''); // newline-terminated
    expect(lines).toHaveLength(result.rowCount);
    for (const line of lines) expect(line.split('\t')).toHaveLength(REQUEST_EVENT_COLUMNS.length);
  });
});
