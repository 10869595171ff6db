/**
 * Metrics' and dashboards' traffic reads on the real engine: trafficTotals and trafficTrend read a
 * range's whole quarter hours from merchant_rollup_15m and its other minutes from request_rollup_1m,
 * and over any range they count what the raw events say, each minute once, per merchant and for all.
 */
import { beforeAll, describe, expect, it } from 'vitest';
import { parseRequestEventValue, type RequestEvent } from '../../src/events/request-event.ts';
import { EventStore, serializeEventRow } from '../../src/store/event-store.ts';
import { useMigratedClickHouse } from '../support/engines.ts';
import { makeEvent } from '../support/events.ts';
import { prng } from '../support/random.ts';

const MINUTE_MS = 60_000;
const QUARTER_MS = 15 * MINUTE_MS;
const DAY_MS = 86_400_000;
/** 22:50 UTC two days ago: the traffic crosses midnight, and starts and ends inside quarter hours. */
const START = Math.floor(Date.now() / DAY_MS) * DAY_MS - 2 * DAY_MS + 22 * 3_600_000 + 50 * MINUTE_MS;
const SPAN_MS = 3 * 3_600_000 + 7 * MINUTE_MS;
const MERCHANTS = ['m_traffic_a', 'm_traffic_b', 'm_traffic_c'];

/** Traffic of three merchants over the span, at random times, from a pool of addresses, with failures. */
function traffic(count: number): RequestEvent[] {
  const random = prng(33);
  return Array.from({ length: count }, (_, i) => {
    const merchantId = MERCHANTS[Math.floor(random() * random() * MERCHANTS.length)]!;
    const fields = {
      merchantId,
      apiKeyId: `pk_live_${merchantId}_${Math.floor(random() * 40)}`,
      ip: `203.0.113.${Math.floor(random() * 200)}`,
      timestamp: START + Math.floor(random() * SPAN_MS),
      status: random() < 0.1 ? 401 : random() < 0.05 ? 503 : 200,
    };
    const parsed = parseRequestEventValue({ ...makeEvent(i, { runId: 'traffic', startMs: START }), ...fields });
    if (!parsed.ok) throw new Error(`fixture ${i} must be valid`);
    return parsed.event;
  });
}

/** What the raw events say of a range: each event counts in it when its minute starts in [from, to). */
function expectedTotals(events: RequestEvent[], range: { from: number; to: number; merchantId?: string }) {
  const inRange = events.filter((event) => {
    const minute = Math.floor(event.timestamp / MINUTE_MS) * MINUTE_MS;
    return minute >= range.from && minute < range.to && (range.merchantId === undefined || event.merchantId === range.merchantId);
  });
  const successes = inRange.filter((event) => event.status < 400).length;
  return {
    requests: inRange.length,
    successes,
    failureRate: inRange.length === 0 ? 0 : (inRange.length - successes) / inRange.length,
    uniqueIps: new Set(inRange.map((event) => event.ip)).size,
  };
}

describe('traffic from the rollups', () => {
  const clickhouse = useMigratedClickHouse();
  const events = traffic(6_000);
  let store: EventStore;

  beforeAll(async () => {
    store = new EventStore(clickhouse.db, clickhouse.tables);
    // In several inserts, as a worker stores them: each one's rows reach both rollups.
    for (let from = 0; from < events.length; from += 1_500) {
      const rows = events.slice(from, from + 1_500).map((event, i) => `${serializeEventRow(event, { topic: 'api.request-metadata', partition: 0, offset: from + i })}\n`);
      await store.insertRows(Buffer.from(rows.join('')));
    }
  });

  it('counts, over any range, what the raw events hold: whole quarter hours, their edges, and ranges within one', async () => {
    const random = prng(7);
    const at = () => START - 20 * MINUTE_MS + Math.floor(random() * (SPAN_MS + 40 * MINUTE_MS));
    const ranges = [
      { from: START - DAY_MS, to: START + DAY_MS }, // all of it
      { from: START + 10 * MINUTE_MS, to: START + 10 * MINUTE_MS + QUARTER_MS }, // exactly one quarter hour
      { from: START + 3 * MINUTE_MS, to: START + 8 * MINUTE_MS + 1 }, // within one
      ...Array.from({ length: 60 }, () => {
        const [from, to] = [at(), at()].sort((a, b) => a - b);
        return { from: from!, to: to! };
      }),
    ];
    for (const [i, range] of ranges.entries()) {
      const merchantId = i % 4 === 3 ? undefined : MERCHANTS[i % 4];
      const totals = await store.trafficTotals({ from: new Date(range.from), to: new Date(range.to), merchantId });
      expect(totals, `range ${i} ${new Date(range.from).toISOString()}..${new Date(range.to).toISOString()} ${merchantId ?? 'all'}`).toEqual(
        expectedTotals(events, { ...range, merchantId }),
      );
    }
  });

  it('charts buckets of minutes, of quarter hours and of hours as the raw events hold them, the last one cut short', async () => {
    const random = prng(11);
    for (const bucketSeconds of [60, 900, 3600]) {
      for (let round = 0; round < 6; round++) {
        const from = START - 30 * MINUTE_MS + Math.floor(random() * 60 * MINUTE_MS);
        const to = from + 30 * MINUTE_MS + Math.floor(random() * SPAN_MS);
        const merchantId = round % 3 === 2 ? undefined : MERCHANTS[round % 3];
        const points = await store.trafficTrend({ from: new Date(from), to: new Date(to), merchantId, bucketSeconds });
        const bucketMs = bucketSeconds * 1000;
        const expected = [];
        for (let t = Math.floor(from / bucketMs) * bucketMs; t < to; t += bucketMs) {
          const { requests, successes } = expectedTotals(events, { from: Math.max(t, from), to: Math.min(t + bucketMs, to), merchantId });
          expected.push({ t, requests, successes });
        }
        expect(points, `${bucketSeconds} s buckets, round ${round}`).toEqual(expected);
      }
    }
  });

  it('reads a range\'s whole quarter hours from merchant_rollup_15m, and the minutes of the rest from request_rollup_1m', async () => {
    // A merchant without traffic, with different counts in the two tables for the same quarter hour: 7 in
    // merchant_rollup_15m, 3 in request_rollup_1m (in its fourth minute). Which count a read gives shows which table it read.
    const quarter = Math.floor(START / QUARTER_MS) * QUARTER_MS - 2 * QUARTER_MS;
    const { db, tables } = clickhouse;
    const sums = (requests: number) => `${requests}, ${requests}, 0, 0, 0, 0, 0, ${requests * 100}, 100, arrayReduce('uniqState', [toIPv6('192.0.2.1')])`;
    const time = (ms: number) => `toDateTime(${ms / 1000}, 'UTC')`;
    await db.command(`INSERT INTO ${tables.merchantRollup15m} SELECT 'm_probe', ${time(quarter)}, ${sums(7)}`);
    await db.command(`INSERT INTO ${tables.requestRollup1m} SELECT 'm_probe', 'pk_probe', ${time(quarter + 3 * MINUTE_MS)}, ${sums(3)}`);
    const requests = async (from: number, to: number, bucketSeconds?: number) => {
      const range = { from: new Date(from), to: new Date(to), merchantId: 'm_probe' };
      if (bucketSeconds === undefined) return (await store.trafficTotals(range)).requests;
      return (await store.trafficTrend({ ...range, bucketSeconds })).reduce((sum, point) => sum + point.requests, 0);
    };
    expect(await requests(quarter, quarter + QUARTER_MS)).toBe(7); // the whole quarter hour: its row
    expect(await requests(quarter - 1, quarter + QUARTER_MS + 1)).toBe(7);
    expect(await requests(quarter, quarter + QUARTER_MS - 1)).toBe(3); // not whole: its minutes
    expect(await requests(quarter + 1, quarter + QUARTER_MS)).toBe(3);
    expect(await requests(quarter + 3 * MINUTE_MS + 1, quarter + QUARTER_MS)).toBe(0); // the minute starts before the range
    expect(await requests(quarter, quarter + QUARTER_MS, 900)).toBe(7);
    expect(await requests(quarter, quarter + QUARTER_MS, 3600)).toBe(7);
    expect(await requests(quarter, quarter + QUARTER_MS, 60)).toBe(3); // buckets shorter than a quarter hour: the minutes
    expect(await requests(quarter, quarter + QUARTER_MS, 300)).toBe(3);
  });
});
