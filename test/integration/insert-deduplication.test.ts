/**
 * Insert deduplication on the real engine (010_insert_deduplication.sql, EventStore.insertRows): a
 * flush stored again under its token after an attempt that landed unseen is counted once, by
 * request_events and by every view, whether the engine reads it inline or from a file, over several
 * partitions and blocks; different flushes are all stored, whatever their rows; a retry still adds
 * the view rows its landed attempt missed; a repair of the views is never taken for a repeat, and
 * leaves its token to no later insert.
 */
import { beforeAll, describe, expect, it } from 'vitest';
import { parseRequestEventValue } from '../../src/events/request-event.ts';
import { AlertStore } from '../../src/store/alert-store.ts';
import type { ClickHouse } from '../../src/store/clickhouse.ts';
import { EVENT_INSERT_SETTINGS, EventStore, REQUEST_EVENT_COLUMNS, serializeEventRow } from '../../src/store/event-store.ts';
import type { Tables } from '../../src/store/tables.ts';
import { makeAlert } from '../support/admin.ts';
import { useMigratedClickHouse } from '../support/engines.ts';
import { makeEvent } from '../support/events.ts';

const TOPIC = 'api.request-metadata';
const DAY_MS = 86_400_000;
/** Midnight UTC three days ago: within key_networks_1d's 8 days, and three whole days in the past. */
const FIRST_DAY = Math.floor(Date.now() / DAY_MS) * DAY_MS - 3 * DAY_MS;
/** The embedded engine reads a body of this many bytes or more from a file, a smaller one inline. */
const FILE_INSERT_MIN_BYTES = 16_384;

interface Row {
  line: string;
  partition: number;
}

/**
 * `count` rows of one key, spread over three days (three partitions of request_events and of
 * key_networks_1d), from Kafka partitions 0 and 1 in turn.
 */
function rowsOf(apiKeyId: string, count: number, firstOffset = 0): Row[] {
  return Array.from({ length: count }, (_, i) => {
    const offset = firstOffset + i;
    const timestamp = FIRST_DAY + 12 * 3_600_000 + (i % 3) * DAY_MS + i;
    const parsed = parseRequestEventValue({ ...makeEvent(offset, { runId: 'dedup', startMs: timestamp }), apiKeyId, merchantId: `m_${apiKeyId}`, timestamp });
    if (!parsed.ok) throw new Error(`fixture ${offset} must be valid`);
    const partition = i % 2;
    return { line: serializeEventRow(parsed.event, { topic: TOPIC, partition, offset }), partition };
  });
}

const bodyOf = (rows: readonly Row[]) => Buffer.from(rows.map((row) => `${row.line}\n`).join(''));

describe('insert deduplication', () => {
  const clickhouse = useMigratedClickHouse({ eventsTtlDays: 3650, fileInsertMinBytes: FILE_INSERT_MIN_BYTES });
  let db: ClickHouse;
  let tables: Tables;
  let store: EventStore;

  beforeAll(() => {
    ({ db, tables } = clickhouse);
    store = new EventStore(db, tables);
  });

  /**
   * A key's events as request_events holds them (FINAL: each eventId once), and as each view counts
   * them (merchant_rollup_15m by the key's own merchant, m_<key>).
   */
  async function counted(apiKeyId: string): Promise<{ events: number; rollup: number; merchantRollup: number; keyNetworks: number }> {
    const [row] = await db.queryRows<{ events: number; rollup: number; merchantRollup: number; keyNetworks: number }>(
      `SELECT (SELECT count() FROM ${tables.requestEvents} FINAL WHERE api_key_id = {key:String}) AS events,
              (SELECT sum(requests) FROM ${tables.requestRollup1m} WHERE api_key_id = {key:String}) AS rollup,
              (SELECT sum(requests) FROM ${tables.merchantRollup15m} WHERE merchant_id = concat('m_', {key:String})) AS merchantRollup,
              (SELECT sum(requests) FROM ${tables.keyNetworks1d} WHERE api_key_id = {key:String}) AS keyNetworks`,
      { key: apiKeyId },
    );
    return { events: Number(row?.events), rollup: Number(row?.rollup), merchantRollup: Number(row?.merchantRollup), keyNetworks: Number(row?.keyNetworks) };
  }

  it('counts a flush stored again under its token once, read inline or from a file', async () => {
    const inline = bodyOf(rowsOf('pk_inline', 6));
    const fromFile = bodyOf(rowsOf('pk_file', 100));
    expect(inline.length).toBeLessThan(FILE_INSERT_MIN_BYTES);
    expect(fromFile.length).toBeGreaterThanOrEqual(FILE_INSERT_MIN_BYTES);
    for (const [body, token] of [[inline, 'flush-inline'], [fromFile, 'flush-file']] as const) {
      await store.insertRows(body, undefined, token);
      await store.insertRows(body, undefined, token); // the retry of an attempt that landed unseen
    }
    expect(await counted('pk_inline')).toEqual({ events: 6, rollup: 6, merchantRollup: 6, keyNetworks: 6 });
    expect(await counted('pk_file')).toEqual({ events: 100, rollup: 100, merchantRollup: 100, keyNetworks: 100 });
  });

  it('stores an insert split into several blocks whole, and drops its repeat whole', async () => {
    // 5-row blocks (a flush is one block below about a million rows and 256 MiB): the token applies
    // to each block, numbered within the insert. Inline, as the embedded engine reads a file in
    // blocks of its own whatever the insert's settings.
    const settings = { ...EVENT_INSERT_SETTINGS, insert_deduplication_token: 'flush-blocks', max_insert_block_size: '5', min_insert_block_size_rows: '5', min_insert_block_size_bytes: '0' };
    const body = bodyOf(rowsOf('pk_blocks', 38));
    expect(body.length).toBeLessThan(FILE_INSERT_MIN_BYTES);
    await db.insert(tables.requestEvents, REQUEST_EVENT_COLUMNS, body, 'TabSeparated', settings);
    expect(await counted('pk_blocks')).toEqual({ events: 38, rollup: 38, merchantRollup: 38, keyNetworks: 38 });
    await db.insert(tables.requestEvents, REQUEST_EVENT_COLUMNS, body, 'TabSeparated', settings);
    expect(await counted('pk_blocks')).toEqual({ events: 38, rollup: 38, merchantRollup: 38, keyNetworks: 38 });
  });

  it('stores every flush, even two with the same rows, and equal view rows of different flushes', async () => {
    const body = bodyOf(rowsOf('pk_twice', 6));
    await store.insertRows(body, undefined, 'flush-one');
    await store.insertRows(body, undefined, 'flush-two');
    // request_events collapses the copies by eventId (FINAL); the views count what was inserted.
    expect(await counted('pk_twice')).toEqual({ events: 6, rollup: 12, merchantRollup: 12, keyNetworks: 12 });

    // Two events alike but for their eventId: each flush's view rows are the same, and both count.
    const [first, second] = [0, 1].map((n) => rowsOf('pk_alike', 1, 0)[0]!.line.replace('evt_dedup_0', `evt_alike_${n}`));
    await store.insertRows(Buffer.from(`${first}\n`), undefined, 'flush-alike-1');
    await store.insertRows(Buffer.from(`${second}\n`), undefined, 'flush-alike-2');
    expect(await counted('pk_alike')).toEqual({ events: 2, rollup: 2, merchantRollup: 2, keyNetworks: 2 });
  });

  it('counts once a flush that landed and then lost partitions before its retry, under the same token', async () => {
    // The buffer keeps a flush's token when dropLost removes the rows of partitions that moved.
    const rows = rowsOf('pk_shrunk', 12);
    await store.insertRows(bodyOf(rows), undefined, 'flush-shrunk');
    await store.insertRows(bodyOf(rows.filter((row) => row.partition === 0)), undefined, 'flush-shrunk');
    expect(await counted('pk_shrunk')).toEqual({ events: 12, rollup: 12, merchantRollup: 12, keyNetworks: 12 });

    // Its first attempt failed before landing: the shrunk retry is stored.
    const lost = rowsOf('pk_shrunk_first', 12);
    await store.insertRows(bodyOf(lost.filter((row) => row.partition === 0)), undefined, 'flush-shrunk-first');
    expect(await counted('pk_shrunk_first')).toEqual({ events: 6, rollup: 6, merchantRollup: 6, keyNetworks: 6 });
  });

  it('adds on the retry the view rows its landed attempt missed, and nothing twice', async () => {
    // The first attempt stores request_events and the rollup, and fails before key_networks_1d.
    const body = bodyOf(rowsOf('pk_partial', 9));
    const view = `${tables.keyNetworks1d}_mv`;
    await db.command(`DETACH TABLE ${view}`);
    try {
      await store.insertRows(body, undefined, 'flush-partial');
    } finally {
      await db.command(`ATTACH TABLE ${view}`);
    }
    expect(await counted('pk_partial')).toEqual({ events: 9, rollup: 9, merchantRollup: 9, keyNetworks: 0 });
    await store.insertRows(body, undefined, 'flush-partial');
    expect(await counted('pk_partial')).toEqual({ events: 9, rollup: 9, merchantRollup: 9, keyNetworks: 9 });
  });

  it('stores a repair of the views with the same rows as an earlier repair', async () => {
    // Two inserts cut short before the rollup, of events alike (one minute, one address, one status):
    // both repairs add the same rollup row, and the second is no repeat of the first. (This engine
    // never deduplicates such an INSERT ... SELECT; a 25.8 server would, but for the repair's token.)
    const view = `${tables.requestRollup1m}_mv`;
    const alike = (offset: number) => rowsOf('pk_repair', 1, 0)[0]!.line.replace('evt_dedup_0', `evt_repair_${offset}`).replace(/\t0\t0$/, `\t0\t${offset}`);
    for (const offset of [100, 200]) {
      await db.command(`DETACH TABLE ${view}`);
      try {
        await store.insertRows(Buffer.from(`${alike(offset)}\n`), undefined, `flush-repair-${offset}`);
      } finally {
        await db.command(`ATTACH TABLE ${view}`);
      }
      expect(await store.repairViews({ topic: TOPIC, partition: 0, fromOffset: offset }, 10)).toEqual({ rollup: 1, keyNetworks: 0, merchantRollup: 0 });
    }
    expect(await counted('pk_repair')).toEqual({ events: 2, rollup: 2, merchantRollup: 2, keyNetworks: 2 });
  });

  it('leaves a repair\'s token to no later insert: alerts saved after it, which carry none, are each stored', async () => {
    // The embedded engine keeps settings given to the client for the rest of the session: a repair's
    // token given that way made every later insert without one of its own a repeat of the first.
    const view = `${tables.requestRollup1m}_mv`;
    await db.command(`DETACH TABLE ${view}`);
    try {
      await store.insertRows(bodyOf(rowsOf('pk_after_repair', 1, 300)), undefined, 'flush-after-repair');
    } finally {
      await db.command(`ATTACH TABLE ${view}`);
    }
    expect(await store.repairViews({ topic: TOPIC, partition: 0, fromOffset: 300 }, 10)).toMatchObject({ rollup: 1 });
    const alerts = new AlertStore(db, tables);
    const createdAtMs = Date.now();
    for (let i = 0; i < 3; i++) await alerts.save([makeAlert(i, { merchantId: 'm_after_repair', createdAtMs })]);
    expect(await alerts.list({ merchantId: 'm_after_repair' })).toHaveLength(3);
  });
});
