import { describe, expect, it } from 'vitest';
import { EVENT_TIME_RANGE, parseRequestEventValue } from '../events/request-event.ts';
import type { ClickHouse } from './clickhouse.ts';
import { EVENT_INSERT_SETTINGS, EventStore, REQUEST_EVENT_COLUMNS, serializeEventRow, storableEventTimes, toClickHouseTime, tsvText } from './event-store.ts';
import { tablesIn } from './tables.ts';

describe('serializeEventRow', () => {
  it('writes every column, in order, one value per tab-separated field, escaping free text', () => {
    const parsed = parseRequestEventValue({
      eventId: 'evt "quoted" \\ \u2028 é',
      timestamp: '2026-11-21T03:04:05.678Z',
      merchantId: 'm_"1"',
      plan: 'pro',
      apiKeyId: 'pk_live_\n',
      environment: 'test',
      ip: '2001:db8::1',
      userAgent: 'Mozilla "x" \t\r',
      method: 'get',
      path: '/v1/verify/sessions/:id?q="a"\\t',
      status: 404,
      responseTimeMs: 1.5,
    });
    if (!parsed.ok) throw new Error('fixture must be valid');
    const line = serializeEventRow(parsed.event, { topic: 't', partition: 3, offset: 42 });
    expect(line).not.toMatch(/[\n\r]/);
    const fields = line.split('\t');
    expect(fields).toHaveLength(REQUEST_EVENT_COLUMNS.length);
    const row = Object.fromEntries(REQUEST_EVENT_COLUMNS.map((column, i) => [column, fields[i]]));
    expect(row).toMatchObject({
      event_id: 'evt "quoted" \\\\ \u2028 é',
      ts: '2026-11-21 03:04:05.678',
      merchant_id: 'm_"1"',
      plan: 'pro',
      api_key_id: 'pk_live_\\n',
      environment: 'test',
      ip: '2001:db8::1',
      user_agent: 'Mozilla "x" \\t\\r',
      method: 'GET',
      path: '/v1/verify/sessions/:id?q="a"\\\\t',
      status: '404',
      response_time_ms: '1.5',
      rate_limit_per_minute: '0', // it carried none
      country: '',
      source_topic: 't',
      source_partition: '3',
      source_offset: '42',
    });
  });

  it('escapes exactly the characters TabSeparated reads specially', () => {
    expect(tsvText('plain text, "quotes" and é')).toBe('plain text, "quotes" and é');
    expect(tsvText('a\tb\nc\rd\\e\0f')).toBe('a\\tb\\nc\\rd\\\\e\\0f');
    expect(tsvText('\\n')).toBe('\\\\n'); // a backslash and an n stay two characters
  });

  it('formats ClickHouse time in UTC with milliseconds', () => {
    expect(toClickHouseTime(Date.UTC(2026, 0, 2, 3, 4, 5, 6))).toBe('2026-01-02 03:04:05.006');
    expect(toClickHouseTime(Date.UTC(2026, 0, 2, 3, 4, 5, 60))).toBe('2026-01-02 03:04:05.060');
    expect(toClickHouseTime(Date.UTC(2026, 0, 2, 3, 4, 6, 999))).toBe('2026-01-02 03:04:06.999');
    expect(toClickHouseTime(Date.UTC(2025, 11, 31, 23, 59, 59, 0))).toBe('2025-12-31 23:59:59.000');
  });
});

describe('storableEventTimes', () => {
  it.each([
    [30, EVENT_TIME_RANGE.max],
    [2228, EVENT_TIME_RANGE.max],
    // The latest time whose TTL, toDateTime(ts) + the days, is still a DateTime (2106-02-07 06:28:15 at most).
    [2229, Date.UTC(2106, 1, 7, 6, 28, 15, 999) - 2229 * 86_400_000],
    [3650, Date.parse('2096-02-09T06:28:15.999Z')],
  ])('with EVENTS_TTL_DAYS=%i holds events up to the time whose TTL still fits a DateTime', (days, latest) => {
    const times = storableEventTimes(days);
    expect(times).toMatchObject({ min: EVENT_TIME_RANGE.min, max: latest });
    expect(times.why === undefined).toBe(latest === EVENT_TIME_RANGE.max);
  });

  it.each([1, 30, 3650])('with EVENTS_TTL_DAYS=%i holds no event dated before the clock minus the days: its raw row would be dropped at insert', (days) => {
    const times = storableEventTimes(days);
    expect(times).toMatchObject({ maxAgeMs: days * 86_400_000, minWhy: expect.stringContaining(`older than the raw events are kept (EVENTS_TTL_DAYS=${days})`) });
  });
});

describe('EventStore.insertRows', () => {
  it("inserts under the flush's deduplication token, with the views deduplicating too", async () => {
    const inserts: { table: string; settings: unknown }[] = [];
    const db = { insert: async (table: string, _columns: unknown, _body: Buffer, _format: string, settings: unknown) => void inserts.push({ table, settings }) } as unknown as ClickHouse;
    const store = new EventStore(db, tablesIn('sc'));
    await store.insertRows(Buffer.from('row\n'), undefined, 'flush-1');
    await store.insertRows(Buffer.from('row\n'));
    expect(inserts).toEqual([
      { table: 'sc.request_events', settings: { ...EVENT_INSERT_SETTINGS, insert_deduplication_token: 'flush-1' } },
      { table: 'sc.request_events', settings: EVENT_INSERT_SETTINGS },
    ]);
    expect(EVENT_INSERT_SETTINGS).toMatchObject({ deduplicate_blocks_in_dependent_materialized_views: 1 });
  });
});

describe('EventStore.repairViews', () => {
  type Reading = { rollup: number; keyNetworks: number };
  /**
   * A storage whose shortfall readings come from lists, one for the views of request_events and one
   * for merchant_rollup_15m; records the tables it inserts into, each insert's token, and every step in order.
   */
  function storageReading(shortfalls: Reading[], merchantShortfalls: number[] = [0]) {
    const inserts: string[] = [];
    const tokens: (string | undefined)[] = [];
    const steps: string[] = [];
    let readings = 0;
    let merchantReadings = 0;
    const db = {
      queryRows: async (query: string) => {
        if (/ AS merchantRollup\b/.test(query)) {
          steps.push('read merchantRollup');
          return [{ merchantRollup: merchantShortfalls[Math.min(merchantReadings++, merchantShortfalls.length - 1)] }];
        }
        steps.push('read rollup, keyNetworks');
        return [shortfalls[Math.min(readings++, shortfalls.length - 1)]];
      },
      command: async (query: string) => {
        const table = /^INSERT INTO (\S+) /.exec(query)?.[1] ?? query;
        inserts.push(table);
        steps.push(`insert ${table}`);
        tokens.push(/ SETTINGS [^\n]*\binsert_deduplication_token='([^']+)'/.exec(query)?.[1]);
      },
    } as unknown as ClickHouse;
    return { store: new EventStore(db, tablesIn('sc')), inserts, tokens, steps, readings: () => readings };
  }
  const source = { topic: 't', partition: 0, fromOffset: 100 };
  const complete = { rollup: 0, keyNetworks: 0 };
  const none = { ...complete, merchantRollup: 0 };

  it('adds nothing and reads each stage once when the views are complete', async () => {
    const storage = storageReading([complete]);
    expect(await storage.store.repairViews(source, 1)).toEqual(none);
    expect(storage.steps).toEqual(['read rollup, keyNetworks', 'read merchantRollup']);
    expect(storage.inserts).toEqual([]);
  });

  it('reads merchant_rollup_15m\'s shortfall against the rollup only once the rollup is repaired', async () => {
    const storage = storageReading([{ rollup: 300, keyNetworks: 0 }], [300]);
    expect(await storage.store.repairViews(source, 1)).toEqual({ rollup: 300, keyNetworks: 0, merchantRollup: 300 });
    expect(storage.steps).toEqual([
      'read rollup, keyNetworks',
      'read rollup, keyNetworks',
      'insert sc.request_rollup_1m',
      'read merchantRollup',
      'read merchantRollup',
      'insert sc.merchant_rollup_15m',
    ]);
  });

  it('adds each view its shortfall once two readings agree', async () => {
    const storage = storageReading([{ rollup: 700, keyNetworks: 700 }, { rollup: 300, keyNetworks: 300 }, { rollup: 300, keyNetworks: 300 }]);
    expect(await storage.store.repairViews(source, 1)).toEqual({ rollup: 300, keyNetworks: 300, merchantRollup: 0 });
    expect(storage.readings()).toBe(3);
    expect(storage.inserts).toEqual(['sc.request_rollup_1m', 'sc.key_networks_1d']);
  });

  it('waits until both views agree, and adds only to the one short', async () => {
    // The rollup's part had landed; key_networks_1d's was still landing at the first reading.
    const storage = storageReading([{ rollup: 0, keyNetworks: 500 }, { rollup: 0, keyNetworks: 200 }, { rollup: 0, keyNetworks: 200 }]);
    expect(await storage.store.repairViews(source, 1)).toEqual({ rollup: 0, keyNetworks: 200, merchantRollup: 0 });
    expect(storage.readings()).toBe(3);
    expect(storage.inserts).toEqual(['sc.key_networks_1d']);
  });

  it('takes the fifth reading when readings keep changing', async () => {
    const storage = storageReading([1, 2, 3, 4, 5, 6].map((n) => ({ rollup: n, keyNetworks: 0 })));
    expect(await storage.store.repairViews(source, 1)).toEqual({ rollup: 5, keyNetworks: 0, merchantRollup: 0 });
    expect(storage.readings()).toBe(5);
    expect(storage.inserts).toEqual(['sc.request_rollup_1m']);
  });

  it('gives every repair a deduplication token of its own, so that none is taken for the repeat of another', async () => {
    // The same shortfall twice (two crashes in the same minute) gives the same rows to insert.
    const storage = storageReading([{ rollup: 1, keyNetworks: 1 }], [1]);
    await storage.store.repairViews(source, 1);
    await storage.store.repairViews(source, 1);
    const tokens = storage.tokens;
    expect(tokens).toHaveLength(6);
    expect(tokens.every((token) => typeof token === 'string' && token.length > 0)).toBe(true);
    expect(new Set(tokens).size).toBe(6);
  });

  it('adds nothing when the shortfall was another insert landing', async () => {
    const storage = storageReading([{ rollup: 700, keyNetworks: 40 }, complete], [20, 0]);
    expect(await storage.store.repairViews(source, 1)).toEqual(none);
    expect(storage.inserts).toEqual([]);
  });
});
