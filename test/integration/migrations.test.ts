/** Schema migrations on the real ClickHouse engine: recorded, safe to run twice, TTL changes applied, data carried over. */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLogger } from '../../src/logger.ts';
import { connectClickHouse, type ClickHouse } from '../../src/store/clickhouse.ts';
import { listMigrations, migrate } from '../../src/store/migrate.ts';
import { tablesIn } from '../../src/store/tables.ts';
import { AlertStore } from '../../src/store/alert-store.ts';
import { makeAlert } from '../support/admin.ts';
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

  it('refuses to start when an applied migration has been edited', async () => {
    const tables = tablesIn(service.database);
    await db.command(`ALTER TABLE ${tables.schemaMigrations} UPDATE checksum = 'edited' WHERE version = 1 SETTINGS mutations_sync = 1`);
    await expect(migrate(db, { tables, eventsTtlDays: 7 }, logger)).rejects.toThrow(/was changed after it was applied/);
  });
});
