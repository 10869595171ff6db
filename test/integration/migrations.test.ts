/** Schema migrations on the real ClickHouse engine: recorded, safe to run twice, TTL changes applied, data carried over. */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseRequestEventValue } from '../../src/events/request-event.ts';
import { createLogger } from '../../src/logger.ts';
import { connectClickHouse, type ClickHouse } from '../../src/store/clickhouse.ts';
import type { NetworkSighting } from '../../src/detect/key-history.ts';
import type { SprayedRequests } from '../../src/detect/source-spray.ts';
import { EventStore, REQUEST_EVENT_COLUMNS, serializeEventRow } from '../../src/store/event-store.ts';
import { networkOf } from '../../rules/network.ts';
import { listMigrations, migrate, renderMigration, splitStatements, type Migration } from '../../src/store/migrate.ts';
import { tablesIn, type Tables } from '../../src/store/tables.ts';
import { AlertStore } from '../../src/store/alert-store.ts';
import { WebhookStore } from '../../src/store/webhook-store.ts';
import { makeAlert } from '../support/admin.ts';
import { makeEvent } from '../support/events.ts';
import { waitFor } from '../support/worker.ts';
import { startClickHouse, type ClickHouseService } from '../services/clickhouse.ts';

describe('migrations', () => {
  let service: ClickHouseService;
  let db: ClickHouse;
  const logger = createLogger('silent');

  beforeAll(async () => {
    service = await startClickHouse();
    db = connectClickHouse({ url: service.url, username: service.username, password: service.password, dataDir: service.dataDir });
  });

  afterAll(async () => {
    await db?.close();
    await service?.stop();
  });

  it('applies every migration once, records it, and does nothing the second time', async () => {
    const tables = tablesIn(service.database);
    const all = listMigrations().map((migration) => migration.version);
    expect(await migrate(db, { tables, eventsTtlDays: 30 }, logger)).toEqual(all);
    expect(await migrate(db, { tables, eventsTtlDays: 30 }, logger)).toEqual([]);
    const recorded = await db.queryRows<{ version: number }>(`SELECT version FROM ${tables.schemaMigrations} ORDER BY version`);
    expect(recorded.map((row) => row.version)).toEqual(all);
    const existing = await db.queryRows<{ name: string }>(
      'SELECT name FROM system.tables WHERE database = {database:String} ORDER BY name',
      { database: service.database },
    );
    expect(existing.map((row) => row.name)).toEqual(
      expect.arrayContaining(['alerts', 'alerts_by_time', 'request_events', 'request_rollup_1m', 'request_rollup_1m_mv', 'schema_migrations']),
    );
    // A fresh install has no events: 012's backfill of key_networks_1d adds nothing.
    const [networks] = await db.queryRows<{ rows: number }>(`SELECT count() AS rows FROM ${tables.keyNetworks1d}`);
    expect(Number(networks!.rows)).toBe(0);
  });

  it('applies a changed EVENTS_TTL_DAYS to the existing table', async () => {
    const tables = tablesIn(service.database);
    await migrate(db, { tables, eventsTtlDays: 7 }, logger);
    const [table] = await db.queryRows<{ engine_full: string }>(
      "SELECT engine_full FROM system.tables WHERE database = {database:String} AND name = 'request_events'",
      { database: service.database },
    );
    expect(table?.engine_full).toMatch(/toIntervalDay\(7\)/);
  });

  // ClickHouse expires a part's rows by the TTL info stored with the part, not by the table's TTL:
  // a change that does not reach that info leaves stored events at the old retention.
  it('applies a changed EVENTS_TTL_DAYS to the events already stored, raised and lowered', async () => {
    const ttl = ttlTable(db, tablesIn(`${service.database}_ttl`));
    await migrate(db, { tables: ttl.tables, eventsTtlDays: 30 }, logger);
    await ttl.stopTtlMerges();
    await ttl.insert('d70', 70); // expired under every retention here: shows that TTL merges ran
    await ttl.insert('d40', 40); // expired under 30 days, kept under 60
    await ttl.insert('d20', 20); // kept under 30 and 60, expired under 7
    await ttl.insert('d2', 2); // kept under all three

    // Raised: the parts stored under 30 days get 60, and keep what 60 days keep.
    await migrate(db, { tables: ttl.tables, eventsTtlDays: 60 }, logger);
    await ttl.recalculated();
    expect(await ttl.storedTtl()).toEqual(await ttl.expectedTtl(60));
    // Recalculating rewrote no rows (it deleted nothing itself); TTL merges delete what expired.
    expect(await ttl.eventIds()).toEqual(['d2', 'd20', 'd40', 'd70']);
    await ttl.startTtlMerges();
    await waitFor(async () => !(await ttl.eventIds()).includes('d70'), 'a TTL merge deletes d70', 20_000);
    expect(await ttl.eventIds()).toEqual(['d2', 'd20', 'd40']);

    // Lowered: what 7 days expire goes, though stored under 60.
    await ttl.stopTtlMerges();
    await migrate(db, { tables: ttl.tables, eventsTtlDays: 7 }, logger);
    await ttl.recalculated();
    expect(await ttl.storedTtl()).toEqual(await ttl.expectedTtl(7));
    expect(await ttl.eventIds()).toEqual(['d2', 'd20', 'd40']);
    await ttl.startTtlMerges();
    const left = async () => (await ttl.eventIds()).join();
    await waitFor(async () => (await left()) === 'd2', 'TTL merges delete d20 and d40', 20_000, left);
  });

  it('recalculates, once, the parts a worker before 009 left at an earlier EVENTS_TTL_DAYS', async () => {
    const ttl = ttlTable(db, tablesIn(`${service.database}_ttl_before_009`));
    await migrate(db, { tables: ttl.tables, eventsTtlDays: 30 }, logger);
    await ttl.stopTtlMerges();
    await ttl.insert('d70', 70); // expired under 60 days: shows that TTL merges ran
    await ttl.insert('d40', 40);
    await ttl.insert('d20', 20);
    // As the worker changed the TTL before 009: the table says 60, the parts still say 30.
    await db.command(
      `ALTER TABLE ${ttl.tables.requestEvents} MODIFY TTL toDateTime(ts) + INTERVAL 60 DAY SETTINGS materialize_ttl_after_modify = 0`,
    );
    expect(await ttl.storedTtl()).toEqual(await ttl.expectedTtl(30));
    await db.command(`ALTER TABLE ${ttl.tables.schemaMigrations} DELETE WHERE version = 9 SETTINGS mutations_sync = 1`);
    expect(await migrate(db, { tables: ttl.tables, eventsTtlDays: 60 }, logger)).toEqual([9]);
    await ttl.recalculated();
    expect(await ttl.storedTtl()).toEqual(await ttl.expectedTtl(60));
    await ttl.startTtlMerges();
    await waitFor(async () => !(await ttl.eventIds()).includes('d70'), 'a TTL merge deletes d70', 20_000);
    expect(await ttl.eventIds()).toEqual(['d20', 'd40']);
  });

  it('carries alerts stored before 004 over to alerts_by_time, and collapses copies when 004 runs again', async () => {
    const tables = tablesIn(service.database);
    // An alert written by a worker that still used the 003 table.
    const before = new AlertStore(db, { ...tables, alerts: `${service.database}.alerts` });
    const alert = makeAlert(1, { merchantId: 'm_upgrade', createdAtMs: Date.UTC(2026, 10, 20, 12) });
    await before.save([alert]);
    const forget004 = () =>
      db.command(`ALTER TABLE ${tables.schemaMigrations} DELETE WHERE version = 4 SETTINGS mutations_sync = 1`);
    for (let run = 0; run < 2; run++) {
      await forget004();
      expect(await migrate(db, { tables, eventsTtlDays: 30 }, logger)).toEqual([4]);
    }
    const after = new AlertStore(db, tables);
    expect(await after.get(alert.id, 'm_upgrade')).toMatchObject({ id: alert.id, title: alert.title, status: 'open' });
    expect(await after.list({ merchantId: 'm_upgrade' })).toHaveLength(1);
  });

  it('fills key_networks_1d from the events stored before 007 (012), so detection warms its memory of them, and adds nothing twice when run again', async () => {
    // A worker of before 007: migrations 001-006 applied, and events of two days ago stored.
    const tables = tablesIn(`${service.database}_before_007`);
    const options = { tables, eventsTtlDays: 30 };
    await db.command(`CREATE DATABASE IF NOT EXISTS ${tables.database}`);
    await db.command(`CREATE TABLE IF NOT EXISTS ${tables.schemaMigrations} (version UInt32, name String, checksum String, applied_at DateTime64(3, 'UTC') DEFAULT now64(3)) ENGINE = MergeTree ORDER BY version`);
    const apply = async (versions: (version: number) => boolean) => {
      for (const migration of listMigrations().filter((m) => versions(m.version))) {
        for (const statement of splitStatements(renderMigration(migration.template, options))) await db.command(statement);
        await db.command(`INSERT INTO ${tables.schemaMigrations} (version, name, checksum) VALUES ({v:UInt32}, {n:String}, {c:String})`, { v: migration.version, n: migration.name, c: migration.checksum });
      }
    };
    await apply((version) => version <= 6);
    const startMs = Date.now() - 2 * 86_400_000;
    const insertEvents = async (events: Record<string, unknown>[]) => {
      const lines = events.map((event, i) => {
        const parsed = parseRequestEventValue(event);
        if (!parsed.ok) throw new Error('fixture must be valid');
        return `${serializeEventRow(parsed.event, { topic: 'api.request-metadata', partition: 0, offset: i })}\n`;
      });
      await db.insert(tables.requestEvents, REQUEST_EVENT_COLUMNS, Buffer.from(lines.join('')), 'TabSeparated', {});
    };
    const before = Array.from({ length: 100 }, (_, i) => makeEvent(i, { runId: 'mig', startMs: startMs + i * 60_000 }));
    await insertEvents(before);
    await insertEvents(Array.from({ length: 10 }, (_, i) => makeEvent(i, { runId: 'mig_expired', startMs: Date.now() - 12 * 86_400_000 }))); // older than key_networks_1d keeps
    // 007 applied by an earlier start, and the view then counted a second event in 20 of those groups (same key, network and day).
    await apply((version) => version === 7);
    await insertEvents(before.slice(0, 20).map((event) => ({ ...event, eventId: `${event.eventId}_again`, timestamp: new Date(Date.parse(String(event.timestamp)) + 1_000).toISOString() })));
    const networks = async () => {
      await db.command(`OPTIMIZE TABLE ${tables.keyNetworks1d} FINAL`);
      const [row] = await db.queryRows<{ requests: number; rows: number }>(`SELECT sum(requests) AS requests, count() AS rows FROM ${tables.keyNetworks1d}`);
      return { requests: Number(row!.requests), rows: Number(row!.rows) };
    };
    expect(await networks()).toEqual({ requests: 20, rows: 20 });

    // The upgrade: the 100 events stored before 007 are added, the 20 the view counted are not added again.
    expect(await migrate(db, options, logger)).toEqual(listMigrations().filter((m) => m.version > 7).map((m) => m.version));
    expect(await networks()).toEqual({ requests: 120, rows: 100 });
    const sightings: NetworkSighting[] = [];
    await new EventStore(db, tables).networkSightings({ since: new Date(Date.now() - 7 * 86_400_000), topic: 'api.request-metadata', partition: 0 }, async (page) => void sightings.push(...page));
    expect(sightings).toHaveLength(100);
    // 015: every network the worker knew before the upgrade (and so trusted) is recorded as vouched for, from its first request.
    expect(sightings.filter((sighting) => sighting.vouched !== sighting.first)).toEqual([]);

    // Events stored since go through the view; 012 run again (a crash before it was recorded) adds nothing, theirs or the earlier ones.
    await insertEvents(Array.from({ length: 50 }, (_, i) => makeEvent(i, { runId: 'mig_after', startMs: Date.now() - 60 * 60_000 })));
    expect(await networks()).toEqual({ requests: 170, rows: 150 });
    await db.command(`ALTER TABLE ${tables.schemaMigrations} DELETE WHERE version = 12 SETTINGS mutations_sync = 1`);
    expect(await migrate(db, options, logger)).toEqual([12]);
    expect(await networks()).toEqual({ requests: 170, rows: 150 });
  });

  it('fills merchant_rollup_15m from the rollup rows before 016 (its backfill), counting once what its view counted, and adds nothing run again', async () => {
    // A worker of before 016: migrations 001-015 applied, and events of two days ago stored, of two merchants.
    const { tables, options, record } = await migratedUpTo(15, 'before_016');
    const [v016] = listMigrations().filter((m) => m.version === 16);
    const startMs = Date.now() - 2 * 86_400_000;
    let offset = 0;
    const insertEvents = async (count: number, runId: string) => {
      const lines = Array.from({ length: count }, (_, i) => {
        const parsed = parseRequestEventValue({ ...makeEvent(i, { runId, startMs, merchants: 2, keys: 6 }), timestamp: new Date(startMs + i * 37_000).toISOString(), status: i % 7 === 0 ? 404 : 200 });
        if (!parsed.ok) throw new Error('fixture must be valid');
        return `${serializeEventRow(parsed.event, { topic: 'api.request-metadata', partition: 0, offset: offset++ })}\n`;
      });
      await db.insert(tables.requestEvents, REQUEST_EVENT_COLUMNS, Buffer.from(lines.join('')), 'TabSeparated', {});
    };
    await insertEvents(120, 'before_016');
    // Every column of each merchant's quarter hours, in merchant_rollup_15m and as the rollup's minutes add up.
    const quarterHours = async (from: 'merchant' | 'minutes') => {
      await db.command(`OPTIMIZE TABLE ${tables.merchantRollup15m} FINAL`);
      return db.queryRows(
        from === 'merchant'
          ? `SELECT merchant_id, quarter_hour, sum(requests) AS requests, sum(successes) AS ok, sum(client_errors) AS c4, sum(not_found) AS nf,
                    sum(response_time_sum) AS rt, max(response_time_max) AS rt_max, uniqMerge(unique_ips) AS ips, count() AS rows
               FROM ${tables.merchantRollup15m} GROUP BY merchant_id, quarter_hour ORDER BY merchant_id, quarter_hour`
          : `SELECT merchant_id, toStartOfFifteenMinutes(minute) AS quarter_hour, sum(requests) AS requests, sum(successes) AS ok,
                    sum(client_errors) AS c4, sum(not_found) AS nf, sum(response_time_sum) AS rt, max(response_time_max) AS rt_max,
                    uniqMerge(unique_ips) AS ips, 1 AS rows
               FROM ${tables.requestRollup1m} GROUP BY merchant_id, quarter_hour ORDER BY merchant_id, quarter_hour`,
      );
    };

    // The upgrade, statement by statement: once 016's view exists, another replica stores events
    // (in the same quarter hours as the earlier ones, and later) before its backfill runs.
    const statements = splitStatements(renderMigration(v016!.template, options));
    expect(statements).toHaveLength(3);
    await db.command(statements[0]!);
    await db.command(statements[1]!);
    await insertEvents(40, 'during_016');
    await db.command(statements[2]!);
    await record(v016!);
    const filled = await quarterHours('merchant');
    expect(filled.length).toBeGreaterThan(6);
    expect(filled).toEqual(await quarterHours('minutes'));
    const total = (rows: Record<string, unknown>[]) => rows.reduce((sum, row) => sum + Number(row.requests), 0);
    expect(total(filled)).toBe(160);

    // Events stored since go through the view; 016 run again (a crash before it was recorded) adds nothing.
    await insertEvents(20, 'after_016');
    await db.command(`ALTER TABLE ${tables.schemaMigrations} DELETE WHERE version = 16 SETTINGS mutations_sync = 1`);
    // (With the later migrations, which this database has not had yet.)
    expect(await migrate(db, options, logger)).toEqual(listMigrations().filter((m) => m.version >= 16).map((m) => m.version));
    expect(total(await quarterHours('merchant'))).toBe(180);
    expect(await quarterHours('merchant')).toEqual(await quarterHours('minutes'));
  });

  it('reads a webhook endpoint registered before 017 as last registered by who registered it', async () => {
    const { tables, options } = await migratedUpTo(16, 'before_017');
    await db.command(
      `INSERT INTO ${tables.webhookEndpoints} (merchant_id, endpoint_id, url, secret, created_by, created_at, updated_at, deleted, version)
       VALUES ('m_old', generateUUIDv4(), 'https://hooks.example.com/sc', 'whsec_old', 'alice', now64(3), now64(3), 0, 1)`,
    );
    expect(await migrate(db, options, logger)).toEqual(listMigrations().filter((m) => m.version >= 17).map((m) => m.version));
    expect(await new WebhookStore(db, tables).endpoint('m_old')).toMatchObject({ url: 'https://hooks.example.com/sc', createdBy: 'alice', updatedBy: 'alice' });
  });

  it('hands back with each network sighting its earliest record as vouched for, IPv4 and IPv6, each key\'s in order of first request', async () => {
    const tables = tablesIn(service.database);
    const store = new EventStore(db, tables);
    const topic = 'api.vouched';
    const day = 86_400_000;
    const start = Date.now() - 3 * day;
    const at = (ip: string, offsetMs: number, i: number) => {
      const parsed = parseRequestEventValue({ ...makeEvent(i, { runId: 'vouch', startMs: start }), apiKeyId: 'pk_live_vouch', merchantId: 'm_vouch', plan: 'business', ip, timestamp: new Date(start + offsetMs).toISOString() });
      if (!parsed.ok) throw new Error('fixture must be valid');
      return `${serializeEventRow(parsed.event, { topic, partition: 2, offset: i })}\n`;
    };
    // Three networks, first seen in this order: an IPv4 /24, an IPv6 /64, another IPv4 /24.
    const ips = ['203.0.113.7', '2001:db8:5:6::9', '198.51.100.20'];
    await db.insert(tables.requestEvents, REQUEST_EVENT_COLUMNS, Buffer.from(ips.map((ip, n) => at(ip, n * 60_000, n) + at(ip, day + n * 60_000, 10 + n)).join('')), 'TabSeparated', {});
    // The first two recorded on two days (the earliest counts), on the partition's topic; the third not; another partition's record does not count.
    const vouched = (ip: string, offsetMs: number, partition = 2) => ({ merchantId: 'm_vouch', apiKeyId: 'pk_live_vouch', partition, network: networkOf(ip), at: start + offsetMs });
    await store.insertVouchedNetworks(topic, [vouched(ips[0]!, day), vouched(ips[1]!, 2 * day), vouched(ips[2]!, 0, 3)]);
    await store.insertVouchedNetworks(topic, [vouched(ips[0]!, 1_000), vouched(ips[1]!, day + 5_000)]);
    const sightings: NetworkSighting[] = [];
    await store.networkSightings({ since: new Date(start - day), topic, partition: 2 }, async (page) => void sightings.push(...page));
    expect(sightings.map(({ ip, first, vouched }) => ({ network: networkOf(ip), first: first - start, vouched: vouched === undefined ? undefined : vouched - start }))).toEqual([
      { network: networkOf(ips[0]!), first: 0, vouched: 1_000 },
      { network: networkOf(ips[1]!), first: 60_000, vouched: day + 5_000 },
      { network: networkOf(ips[2]!), first: 120_000, vouched: undefined },
    ]);
  });

  it('reads the requests of the keys that failed from a network that failed for many keys, one of them on another replica\'s partition, by address and user agent', async () => {
    const tables = tablesIn(service.database);
    const store = new EventStore(db, tables);
    const topic = 'api.spray';
    const now = Date.now();
    let offset = 0;
    const row = (apiKeyId: string, partition: number, atMs: number, fields: Record<string, unknown>) => {
      const parsed = parseRequestEventValue({
        ...makeEvent(offset, { runId: 'spray', startMs: atMs }),
        eventId: `spray_${offset}`,
        merchantId: `m_spray_${partition % 2}`,
        apiKeyId,
        plan: 'business',
        timestamp: new Date(atMs).toISOString(),
        userAgent: 'okhttp/4.12.0',
        ...fields,
      });
      if (!parsed.ok) throw new Error('fixture must be valid');
      return `${serializeEventRow(parsed.event, { topic, partition, offset: offset++ })}\n`;
    };
    const key = (k: number) => `pk_live_spray_${k}`;
    const lines: string[] = [];
    // 20 keys (key k on partition k % 4; key 8 on the enterprise plan, the others business) get a 401 each from
    // 203.0.113.0/24, a second apart. Keys 2, 4 and 5 say they are test keys in those requests.
    for (let k = 0; k < 20; k++) {
      const fields = { ip: `203.0.113.${k + 1}`, status: 401, userAgent: 'curl/8.5.0', country: 'NL', ...(k === 8 && { plan: 'enterprise' }), ...([2, 4, 5].includes(k) && { environment: 'test' }) };
      lines.push(row(key(k), k % 4, now - 5 * 60_000 + k * 1_000, fields));
    }
    // Key 2 answered 200 from another address of the network three times, as a live key; key 10 twice, while it was on a plan detection does not evaluate.
    for (let i = 0; i < 3; i++) lines.push(row(key(2), 2, now - 4 * 60_000 + i, { ip: '203.0.113.50', status: 200 }));
    for (let i = 0; i < 2; i++) lines.push(row(key(10), 2, now - 8 * 60_000 + i, { ip: '203.0.113.50', status: 200, plan: 'pro' }));
    // Key 3's 429 and 503 from the network are not judged (as the engine's failedFrom), and its 200 from another network is not read.
    lines.push(row(key(3), 3, now - 4 * 60_000, { ip: '203.0.113.51', status: 429 }), row(key(3), 3, now - 4 * 60_000 + 1, { ip: '203.0.113.51', status: 503 }));
    lines.push(row(key(3), 3, now - 4 * 60_000 + 2, { ip: '10.1.2.3', status: 200 }));
    // Key 4 made a live request from another network.
    lines.push(row(key(4), 0, now - 4 * 60_000, { ip: '10.4.4.4', status: 200 }));
    // Key 6 failed from the network before the window too: that 401 is not read.
    lines.push(row(key(6), 2, now - 30 * 60_000, { ip: '203.0.113.7', status: 401, userAgent: 'curl/8.5.0' }));
    // A pro key, and a key whose 401 is dated two hours ahead, do not count towards the network's keys; another network failed for 5 keys only.
    lines.push(row('pk_live_spray_pro', 2, now - 60_000, { plan: 'pro', ip: '203.0.113.70', status: 401 }));
    lines.push(row('pk_live_spray_ahead', 2, now + 2 * 3_600_000, { ip: '203.0.113.71', status: 401 }));
    for (let k = 0; k < 5; k++) lines.push(row(key(100 + k), 2, now - 60_000, { ip: '198.51.100.9', status: 401 }));
    await db.insert(tables.requestEvents, REQUEST_EVENT_COLUMNS, Buffer.from(lines.join('')), 'TabSeparated', {});

    const read = (minKeys: number, owned: number[], limits: { keysPerNetwork?: number; rowsPerKey?: number } = {}) =>
      store.sprayedRequests({
        notBefore: new Date(now - 60 * 60_000),
        clock: new Date(now),
        until: new Date(now + 5 * 60_000),
        windowMs: 10 * 60_000,
        topic,
        owned,
        minKeys,
        plans: ['business', 'enterprise'],
        keysPerNetwork: limits.keysPerNetwork ?? 100,
        maxKeys: 1_000,
        rowsPerKey: limits.rowsPerKey ?? 10,
      });
    const described = (requests: SprayedRequests[]) =>
      requests.map((r) => `${r.apiKeyId} ${r.ip} ${r.failures}/${r.judged} of ${r.keyRows} ${r.keyFailures}/${r.keyJudged}`).sort();
    const tried = (k: number) => `${key(k)} 203.0.113.${k + 1} 1/1 of ${k === 2 || k === 3 ? 2 : 1} 1/${k === 2 ? 4 : 1}`;
    // Every partition's keys of the network (one of them on a partition not owned), each key's rows with its totals.
    const requests = await read(20, [0, 1]);
    expect(described(requests)).toEqual(
      [...Array.from({ length: 20 }, (_, k) => tried(k)), `${key(2)} 203.0.113.50 0/3 of 2 1/4`, `${key(3)} 203.0.113.51 0/0 of 2 1/1`].sort(),
    );
    expect(requests.find((r) => r.apiKeyId === key(6))).toEqual({
      network: '203.0.113.0/24',
      merchantId: 'm_spray_0',
      apiKeyId: key(6),
      partition: 2,
      ip: '203.0.113.7',
      userAgent: 'curl/8.5.0',
      failures: 1,
      judged: 1,
      first: now - 5 * 60_000 + 6_000,
      newest: now - 5 * 60_000 + 6_000,
      newestEventId: expect.stringMatching(/^spray_\d+$/),
      country: 'NL',
      plan: 'business',
      keyRows: 1,
      keyFailures: 1,
      keyJudged: 1,
      keyLive: true,
    });
    expect(requests.find((r) => r.apiKeyId === key(8))?.plan).toBe('enterprise');
    // A key is live when any of its requests in the window says so, from any network, in the rows read or not.
    expect(requests.filter((r) => !r.keyLive).map((r) => r.apiKeyId)).toEqual([key(5)]);
    expect((await read(20, [0, 1], { rowsPerKey: 1 })).filter((r) => r.apiKeyId === key(2))).toMatchObject([{ ip: '203.0.113.3', keyRows: 2, keyLive: true }]);
    expect(requests.find((r) => r.ip === '203.0.113.50')).toMatchObject({ userAgent: 'okhttp/4.12.0', first: 0, newest: 0, newestEventId: '', country: undefined });
    // Neither the pro key nor the one ahead makes a 21st; the 5-key network (on partition 2) is read from 5 when
    // partition 2 is another's; nothing is read of networks whose keys are all the replica's own.
    expect(await read(21, [0, 1])).toEqual([]);
    expect([...new Set((await read(5, [0, 1, 3])).map((r) => r.network))].sort()).toEqual(['198.51.100.0/24', '203.0.113.0/24']);
    expect([...new Set((await read(5, [0, 1, 2])).map((r) => r.network))]).toEqual(['203.0.113.0/24']);
    expect(await read(20, [0, 1, 2, 3])).toEqual([]);
    // The keys that failed last, of each network; of each key, the rows with the newest 401s, with the totals of all.
    expect(described(await read(20, [], { keysPerNetwork: 3 }))).toEqual([17, 18, 19].map(tried));
    expect(described(await read(20, [0, 1], { rowsPerKey: 1 }))).toEqual(Array.from({ length: 20 }, (_, k) => tried(k)).sort());

    // A fleet half an hour behind on its topic: read as of its newest 401, not the clock.
    const lateTopic = 'api.spray.late';
    const late = Array.from({ length: 20 }, (_, k) => row(key(200 + k), k % 4, now - 30 * 60_000 + k * 1_000, { ip: '192.0.2.9', status: 401 }).replace(`\t${topic}\t`, `\t${lateTopic}\t`));
    await db.insert(tables.requestEvents, REQUEST_EVENT_COLUMNS, Buffer.from(late.join('')), 'TabSeparated', {});
    const lateQuery = {
      notBefore: new Date(now - 60 * 60_000),
      clock: new Date(now),
      until: new Date(now + 5 * 60_000),
      windowMs: 10 * 60_000,
      topic: lateTopic,
      owned: [0],
      minKeys: 20,
      plans: ['business'],
      keysPerNetwork: 100,
      maxKeys: 1_000,
      rowsPerKey: 10,
    };
    const lateRead = await store.sprayedRequests(lateQuery);
    expect(lateRead.map((r) => `${r.network} ${r.failures}`)).toEqual(Array.from({ length: 20 }, () => '192.0.2.0/24 1'));
    // Nothing when no 401 came since notBefore.
    expect(await store.sprayedRequests({ ...lateQuery, topic: lateTopic, notBefore: new Date(now - 20 * 60_000) })).toEqual([]);
    // A 401 dated 4 minutes ahead (within what admission takes) does not move the window past the clock.
    const aheadTopic = 'api.spray.ahead';
    const ahead = [
      ...Array.from({ length: 20 }, (_, k) => row(key(300 + k), k % 4, now - 8 * 60_000 + k * 1_000, { ip: '192.0.2.9', status: 401 })),
      row(key(400), 2, now + 4 * 60_000, { ip: '198.51.100.9', status: 401 }),
    ];
    await db.insert(tables.requestEvents, REQUEST_EVENT_COLUMNS, Buffer.from(ahead.map((line) => line.replace(`\t${topic}\t`, `\t${aheadTopic}\t`)).join('')), 'TabSeparated', {});
    expect((await store.sprayedRequests({ ...lateQuery, topic: aheadTopic })).map((r) => r.network)).toEqual(Array.from({ length: 20 }, () => '192.0.2.0/24'));
    // IPv6 by the /48 (sprayNetworkOf): a new /64 for every key is one network; a key's 200 from another /64 of it counts in its totals.
    const v6Topic = 'api.spray.v6';
    const v6 = [
      ...Array.from({ length: 20 }, (_, k) => row(key(500 + k), k % 4, now - 5 * 60_000 + k * 1_000, { ip: `2001:db8:7:${k.toString(16)}::9`, status: 401 })),
      row(key(500), 0, now - 4 * 60_000, { ip: '2001:db8:7:ff::1', status: 200 }),
    ];
    await db.insert(tables.requestEvents, REQUEST_EVENT_COLUMNS, Buffer.from(v6.map((line) => line.replace(`\t${topic}\t`, `\t${v6Topic}\t`)).join('')), 'TabSeparated', {});
    const v6Read = await store.sprayedRequests({ ...lateQuery, topic: v6Topic });
    expect(new Set(v6Read.map((r) => r.network))).toEqual(new Set(['2001:db8:7::/48']));
    expect(new Set(v6Read.map((r) => r.apiKeyId)).size).toBe(20);
    expect(v6Read.find((r) => r.ip === '2001:db8:7:ff::1')).toMatchObject({ apiKeyId: key(500), keyRows: 2, keyFailures: 1, keyJudged: 2 });
    // A key's requests from a network of its own (vouched for before the window) are left out, as the engine's failedFrom
    // leaves them out: key 0, deleted but still set where it worked, is no stranger's try; key 500's 200 from its own /64 goes.
    await store.insertVouchedNetworks(topic, [{ merchantId: 'm_spray_0', apiKeyId: key(0), partition: 0, network: '203.0.113.0/24', at: now - 24 * 3_600_000 }]);
    await store.insertVouchedNetworks(v6Topic, [{ merchantId: 'm_spray_0', apiKeyId: key(500), partition: 0, network: '2001:db8:7:ff::/64', at: now - 24 * 3_600_000 }]);
    expect(await read(20, [0, 1])).toEqual([]);
    expect(new Set((await read(19, [0, 1])).map((r) => r.apiKeyId)).has(key(0))).toBe(false);
    expect((await store.sprayedRequests({ ...lateQuery, topic: v6Topic })).filter((r) => r.apiKeyId === key(500))).toMatchObject([{ ip: '2001:db8:7::9', keyRows: 1, keyJudged: 1 }]);
  });

  it('hands back a partition\'s newest events once each, oldest first, across queries: ties of time in eventId order, a repeat not merged yet collapsed', async () => {
    const tables = tablesIn(service.database);
    const store = new EventStore(db, tables);
    const topic = 'api.warm';
    const start = Date.now() - 3_600_000;
    // Four instants, three events at each; one more event on another partition.
    const row = (i: number, partition = 1) => {
      const parsed = parseRequestEventValue({ ...makeEvent(i, { runId: 'warm', startMs: start }), eventId: `warm_${String(i).padStart(2, '0')}`, timestamp: new Date(start + Math.floor(i / 3) * 1_000).toISOString() });
      if (!parsed.ok) throw new Error('fixture must be valid');
      return `${serializeEventRow(parsed.event, { topic, partition, offset: i })}\n`;
    };
    const ids = Array.from({ length: 12 }, (_, i) => `warm_${String(i).padStart(2, '0')}`);
    await db.insert(tables.requestEvents, REQUEST_EVENT_COLUMNS, Buffer.from(ids.map((_, i) => row(i)).join('') + row(12, 2)), 'TabSeparated', {});
    await db.insert(tables.requestEvents, REQUEST_EVENT_COLUMNS, Buffer.from(row(4)), 'TabSeparated', {}); // redelivered, not merged yet
    const read = async (limit: number | undefined, queryRows: number) => {
      const pages: string[][] = [];
      const handed = await store.recentEvents({ since: new Date(start - 1), topic, partition: 1, limit }, async (page) => void pages.push(page.map((event) => event.eventId)), 2, queryRows);
      expect(handed).toBe(pages.flat().length);
      return pages;
    };
    // Queries of two rows end inside each instant's three events.
    expect((await read(undefined, 2)).flat()).toEqual(ids);
    expect(await read(undefined, 5)).toEqual([ids.slice(0, 2), ids.slice(2, 4), [ids[4]], ids.slice(5, 7), ids.slice(7, 9), [ids[9]], ids.slice(10, 12)]);
    // The newest five rows begin at the third instant: its three events come too.
    expect((await read(5, 2)).flat()).toEqual(ids.slice(6));
  });

  /** A database of its own, as a worker of before `version` + 1 left it: migrations up to `version` applied and recorded. */
  async function migratedUpTo(version: number, suffix: string) {
    const tables = tablesIn(`${service.database}_${suffix}`);
    const options = { tables, eventsTtlDays: 30 };
    await db.command(`CREATE DATABASE IF NOT EXISTS ${tables.database}`);
    await db.command(`CREATE TABLE IF NOT EXISTS ${tables.schemaMigrations} (version UInt32, name String, checksum String, applied_at DateTime64(3, 'UTC') DEFAULT now64(3)) ENGINE = MergeTree ORDER BY version`);
    const record = (migration: Migration) =>
      db.command(`INSERT INTO ${tables.schemaMigrations} (version, name, checksum) VALUES ({v:UInt32}, {n:String}, {c:String})`, { v: migration.version, n: migration.name, c: migration.checksum });
    for (const migration of listMigrations().filter((m) => m.version <= version)) {
      for (const statement of splitStatements(renderMigration(migration.template, options))) await db.command(statement);
      await record(migration);
    }
    return { tables, options, record };
  }

  it('refuses to start when an applied migration has been edited', async () => {
    const tables = tablesIn(service.database);
    await db.command(`ALTER TABLE ${tables.schemaMigrations} UPDATE checksum = 'edited' WHERE version = 1 SETTINGS mutations_sync = 1`);
    await expect(migrate(db, { tables, eventsTtlDays: 7 }, logger)).rejects.toThrow(/was changed after it was applied/);
  });
});

/** A request_events table of its own, and what the TTL tests read of it. */
function ttlTable(db: ClickHouse, tables: Tables) {
  const events = tables.requestEvents;
  const database = tables.database;
  return {
    tables,
    insert: (eventId: string, daysAgo: number) =>
      db.command(
        `INSERT INTO ${events} (event_id, ts, merchant_id, plan, api_key_id, environment, ip, user_agent, method, path, status, response_time_ms, rate_limit_per_minute, country, source_topic, source_partition, source_offset)
         VALUES ({eventId:String}, now64(3) - INTERVAL {daysAgo:UInt32} DAY, 'm_ttl', 'business', 'pk_ttl', 'live', '::1', 'ua', 'GET', '/', 200, 1, 60, '', '', -1, -1)`,
        { eventId, daysAgo },
      ),
    // TTL merges when the test says, and then at once (by default, 4 h after a partition's last one).
    stopTtlMerges: async () => {
      await db.command(`ALTER TABLE ${events} MODIFY SETTING merge_with_ttl_timeout = 1`);
      await db.command(`SYSTEM STOP TTL MERGES ${events}`);
    },
    startTtlMerges: () => db.command(`SYSTEM START TTL MERGES ${events}`),
    eventIds: async () => (await db.queryRows<{ event_id: string }>(`SELECT event_id FROM ${events} ORDER BY event_id`)).map((row) => row.event_id),
    /** Waits until the parts' TTL info is recalculated (a mutation, run in the background). */
    recalculated: () =>
      waitFor(
        async () =>
          (await db.queryRows(
            "SELECT 1 FROM system.mutations WHERE database = {database:String} AND table = 'request_events' AND NOT is_done",
            { database },
          )).length === 0,
        'the TTL recalculation is done',
        20_000,
      ),
    /** Each event's expiry as its part stores it (every event here is alone in its day's partition). */
    storedTtl: async () => {
      const parts = await db.queryRows<{ partition_id: string; expires: string }>(
        `SELECT partition_id, toString(delete_ttl_info_max) AS expires FROM system.parts
         WHERE database = {database:String} AND table = 'request_events' AND active AND rows > 0`,
        { database },
      );
      const byPartition = new Map(parts.map((part) => [part.partition_id, part.expires]));
      const rows = await db.queryRows<{ event_id: string; partition_id: string }>(`SELECT event_id, _partition_id AS partition_id FROM ${events}`);
      return Object.fromEntries(rows.map((row) => [row.event_id, byPartition.get(row.partition_id)]));
    },
    /** Each event's expiry under a retention of `days`. */
    expectedTtl: async (days: number) => {
      const rows = await db.queryRows<{ event_id: string; expires: string }>(
        `SELECT event_id, toString(toDateTime(ts) + toIntervalDay({days:UInt32})) AS expires FROM ${events}`,
        { days },
      );
      return Object.fromEntries(rows.map((row) => [row.event_id, row.expires]));
    },
  };
}
