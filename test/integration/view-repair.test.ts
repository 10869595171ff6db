/**
 * The views' repair after a crash, on the real engine: events stored without their key_networks_1d
 * rows (a kill between the raw part and the view's part of one insert) are added to the view by
 * repairViews, so detection's memory of a key's networks (networkSightings) knows them after a
 * restart; a second repair adds nothing, and another partition's events are left to its own repair.
 * Events stored without their merchant_rollup_15m rows, alone or with the other views', are added to
 * it as the per-minute rollup, repaired first, counts them.
 */
import { beforeAll, describe, expect, it } from 'vitest';
import { networkOf } from '../../rules/network.ts';
import type { NetworkSighting } from '../../src/detect/key-history.ts';
import { parseRequestEventValue, type RequestEvent } from '../../src/events/request-event.ts';
import type { ClickHouse } from '../../src/store/clickhouse.ts';
import { EventStore, serializeEventRow } from '../../src/store/event-store.ts';
import type { Tables } from '../../src/store/tables.ts';
import { useMigratedClickHouse } from '../support/engines.ts';
import { makeEvent } from '../support/events.ts';

const TOPIC = 'api.request-metadata';
const DAY_MS = 86_400_000;
/** Midnight UTC two days ago: recent enough for every TTL, and a whole day before today. */
const DAY = Math.floor(Date.now() / DAY_MS) * DAY_MS - 2 * DAY_MS;
const at = (hours: number, minutes = 0, seconds = 0) => DAY + ((hours * 60 + minutes) * 60 + seconds) * 1000;

interface Stored {
  event: RequestEvent;
  partition: number;
  offset: number;
}

/** An event of a key from an address at a time, stored at an offset of a partition. */
function stored(offset: number, apiKeyId: string, ip: string, timestamp: number, partition = 0): Stored {
  const fields = { eventId: `evt_${partition}_${offset}`, merchantId: 'm_1', plan: 'pro', apiKeyId, ip, timestamp };
  const parsed = parseRequestEventValue({ ...makeEvent(offset, { runId: 'repair', startMs: timestamp }), ...fields });
  if (!parsed.ok) throw new Error(`fixture ${offset} must be valid`);
  return { event: parsed.event, partition, offset };
}

// Stored whole before the crash.
const BEFORE = [
  stored(0, 'pk_a', '203.0.113.7', at(10)),
  stored(1, 'pk_a', '203.0.113.9', at(10, 5)),
  stored(2, 'pk_b', '2001:db8:1:2::5', at(11)),
  stored(3, 'pk_b', '2001:db8:1:2::6', at(11, 30)),
];
// Stored raw, without their key_networks_1d rows, by the insert the crash cut short.
const CUT_SHORT = [
  stored(4, 'pk_a', '203.0.113.200', at(23, 59, 59)), // a network known that day: its last request moves, its count grows
  stored(5, 'pk_a', '203.0.113.8', at(24, 0, 1)), // the same network the next day: a day missing entirely
  stored(6, 'pk_a', '198.51.100.23', at(12)), // a network new to the key
  stored(7, 'pk_a', '2001:db8:aa:bb:1::1', at(12, 30)), // a /64 new to the key, from two addresses
  stored(8, 'pk_a', '2001:db8:aa:bb:ffff::2', at(12, 31)),
  stored(9, 'pk_b', '2001:db8:1:2::9', at(9)), // a known network's first request moves earlier
  stored(10, 'pk_c', '192.0.2.1', at(13)), // a key new to the view
];
// Another partition's events cut short alike: its own next owner repairs them, not partition 0's.
const OTHER_PARTITION = [stored(0, 'pk_d', '192.0.2.50', at(14), 1)];

/** The sightings detection should remember from these events: per key and network, first and last request. */
function expectedSightings(events: Stored[]) {
  const byNetwork = new Map<string, { merchantId: string; apiKeyId: string; network: string; first: number; last: number }>();
  for (const { event } of events) {
    const network = networkOf(event.ip);
    const id = `${event.apiKeyId} ${network}`;
    const seen = byNetwork.get(id);
    byNetwork.set(id, {
      merchantId: event.merchantId,
      apiKeyId: event.apiKeyId,
      network,
      first: Math.min(seen?.first ?? Infinity, event.timestamp),
      last: Math.max(seen?.last ?? -Infinity, event.timestamp),
    });
  }
  return sortById([...byNetwork.values()]);
}

/** Requests per key, network and UTC day, as `key network day` -> count. */
function expectedRequests(events: Stored[]): Record<string, number> {
  const counts: Record<string, number> = {};
  for (const { event } of events) {
    const id = `${event.apiKeyId} ${networkOf(event.ip)} ${new Date(event.timestamp).toISOString().slice(0, 10)}`;
    counts[id] = (counts[id] ?? 0) + 1;
  }
  return counts;
}

function sortById<T extends { apiKeyId: string; network: string }>(rows: T[]): T[] {
  return rows.sort((a, b) => `${a.apiKeyId} ${a.network}`.localeCompare(`${b.apiKeyId} ${b.network}`));
}

describe('repairing the views after a crash between the raw part and the views\' parts', () => {
  const clickhouse = useMigratedClickHouse();
  let db: ClickHouse;
  let tables: Tables;
  let store: EventStore;

  beforeAll(() => {
    ({ db, tables } = clickhouse);
    store = new EventStore(db, tables);
  });

  const insert = (events: Stored[]) =>
    store.insertRows(Buffer.from(events.map(({ event, partition, offset }) => `${serializeEventRow(event, { topic: TOPIC, partition, offset })}\n`).join('')));

  /** What networkSightings hands over for a partition, with each address checked against its network's events and then named by its network. */
  async function sightingsOf(partition: number, events: Stored[]) {
    const sightings: NetworkSighting[] = [];
    await store.networkSightings({ since: new Date(DAY - DAY_MS), topic: TOPIC, partition }, async (page) => void sightings.push(...page));
    for (const sighting of sightings) {
      const addresses = events.filter(({ event }) => event.apiKeyId === sighting.apiKeyId && networkOf(event.ip) === networkOf(sighting.ip)).map(({ event }) => event.ip);
      expect(addresses).toContain(sighting.ip);
    }
    return sortById(sightings.map(({ ip, ...sighting }) => ({ ...sighting, network: networkOf(ip) })));
  }

  /** key_networks_1d's request counts of a partition, as `key network day` -> count. */
  async function viewRequests(partition: number): Promise<Record<string, number>> {
    const rows = await db.queryRows<{ api_key_id: string; network: string; day: string; requests: number }>(
      `SELECT api_key_id, toString(network) AS network, toString(day) AS day, sum(requests) AS requests
         FROM ${tables.keyNetworks1d}
        WHERE source_topic = {topic:String} AND source_partition = {partition:Int32}
        GROUP BY api_key_id, network, day`,
      { topic: TOPIC, partition },
    );
    return Object.fromEntries(rows.map((row) => [`${row.api_key_id} ${networkOf(row.network)} ${row.day}`, row.requests]));
  }

  it('adds the networks, times and counts of the events stored without their key_networks_1d rows, once', async () => {
    await insert(BEFORE);
    const view = `${tables.keyNetworks1d}_mv`;
    await db.command(`DETACH TABLE ${view}`);
    try {
      await insert([...CUT_SHORT, ...OTHER_PARTITION]);
    } finally {
      await db.command(`ATTACH TABLE ${view}`);
    }
    const everything = [...BEFORE, ...CUT_SHORT];
    expect(await sightingsOf(0, everything)).toEqual(expectedSightings(BEFORE)); // the forced gap is there

    // The next owner of partition 0 resumes from the offset committed before the cut-short insert.
    expect(await store.repairViews({ topic: TOPIC, partition: 0, fromOffset: CUT_SHORT[0]!.offset }, 10)).toEqual({ rollup: 0, keyNetworks: CUT_SHORT.length, merchantRollup: 0 });
    expect(await sightingsOf(0, everything)).toEqual(expectedSightings(everything));
    expect(await viewRequests(0)).toEqual(expectedRequests(everything));
    expect(await sightingsOf(1, OTHER_PARTITION)).toEqual([]); // not partition 0's to repair

    expect(await store.repairViews({ topic: TOPIC, partition: 0, fromOffset: CUT_SHORT[0]!.offset }, 10)).toEqual({ rollup: 0, keyNetworks: 0, merchantRollup: 0 });
    expect(await viewRequests(0)).toEqual(expectedRequests(everything));

    expect(await store.repairViews({ topic: TOPIC, partition: 1, fromOffset: 0 }, 10)).toEqual({ rollup: 0, keyNetworks: 1, merchantRollup: 0 });
    expect(await sightingsOf(1, OTHER_PARTITION)).toEqual(expectedSightings(OTHER_PARTITION));
  });

  /** Each merchant's quarter hours in merchant_rollup_15m, or as the raw events of partition 2 make them, every column. */
  const perQuarterHour = (from: 'rollup' | 'raw') =>
    db.queryRows(
      from === 'rollup'
        ? `SELECT merchant_id, quarter_hour, sum(requests) AS requests, sum(successes) AS ok, sum(client_errors) AS c4,
                  sum(server_errors) AS c5, sum(auth_failures) AS auth, sum(not_found) AS nf, sum(rate_limited) AS rl,
                  sum(response_time_sum) AS rt, max(response_time_max) AS rt_max, uniqMerge(unique_ips) AS ips
             FROM ${tables.merchantRollup15m} WHERE merchant_id LIKE 'm_quarter_%'
            GROUP BY merchant_id, quarter_hour ORDER BY merchant_id, quarter_hour`
        : `SELECT merchant_id, toStartOfFifteenMinutes(ts) AS quarter_hour, count() AS requests, countIf(status < 400) AS ok,
                  countIf(status BETWEEN 400 AND 499) AS c4, countIf(status >= 500) AS c5, countIf(status IN (401, 403)) AS auth,
                  countIf(status = 404) AS nf, countIf(status = 429) AS rl, sum(toFloat64(response_time_ms)) AS rt,
                  max(response_time_ms) AS rt_max, uniq(ip) AS ips
             FROM ${tables.requestEvents} WHERE source_topic = '${TOPIC}' AND source_partition = 2
            GROUP BY merchant_id, quarter_hour ORDER BY merchant_id, quarter_hour`,
    );

  it('adds to merchant_rollup_15m what it missed, after its own view\'s part or every view\'s, as the repaired per-minute rollup counts it', async () => {
    // Partition 2: two merchants' events over an hour, stored in three inserts.
    const quarterEvents = Array.from({ length: 90 }, (_, i) => {
      const event = stored(i, `pk_q${i % 3}`, `198.51.100.${i % 7}`, at(15, i % 60, i % 50), 2);
      event.event = { ...event.event, merchantId: `m_quarter_${i % 2}`, status: [200, 201, 401, 404, 429, 503][i % 6]! };
      return event;
    });
    const [whole, rollupWhole, allShort] = [quarterEvents.slice(0, 30), quarterEvents.slice(30, 60), quarterEvents.slice(60)];
    const cutShort = async (views: string[], events: Stored[]) => {
      for (const view of views) await db.command(`DETACH TABLE ${view}`);
      try {
        await insert(events);
      } finally {
        for (const view of views) await db.command(`ATTACH TABLE ${view}`);
      }
    };
    await insert(whole);
    // A kill after the per-minute rollup's part, before merchant_rollup_15m's.
    await cutShort([`${tables.merchantRollup15m}_mv`], rollupWhole);
    expect(await store.repairViews({ topic: TOPIC, partition: 2, fromOffset: 30 }, 10)).toEqual({ rollup: 0, keyNetworks: 0, merchantRollup: 30 });
    expect(await perQuarterHour('rollup')).toEqual(await perQuarterHour('raw'));

    // A kill before every view's part: merchant_rollup_15m is compared with the rollup once the rollup is repaired.
    await cutShort([`${tables.requestRollup1m}_mv`, `${tables.keyNetworks1d}_mv`, `${tables.merchantRollup15m}_mv`], allShort);
    expect(await store.repairViews({ topic: TOPIC, partition: 2, fromOffset: 60 }, 10)).toEqual({ rollup: 30, keyNetworks: 30, merchantRollup: 30 });
    expect(await perQuarterHour('rollup')).toEqual(await perQuarterHour('raw'));

    expect(await store.repairViews({ topic: TOPIC, partition: 2, fromOffset: 0 }, 10)).toEqual({ rollup: 0, keyNetworks: 0, merchantRollup: 0 });
    expect(await perQuarterHour('rollup')).toHaveLength(8);
  });
});
