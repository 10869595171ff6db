/** Schema migrations on the real ClickHouse engine: recorded, safe to run twice, TTL changes applied. */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLogger } from '../../src/logger.ts';
import { connectClickHouse, type ClickHouse } from '../../src/store/clickhouse.ts';
import { listMigrations, migrate } from '../../src/store/migrate.ts';
import { tablesIn } from '../../src/store/tables.ts';
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
      expect.arrayContaining(['alerts', 'request_events', 'request_rollup_1m', 'request_rollup_1m_mv', 'schema_migrations']),
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

  it('refuses to start when an applied migration has been edited', async () => {
    const tables = tablesIn(service.database);
    await db.command(`ALTER TABLE ${tables.schemaMigrations} UPDATE checksum = 'edited' WHERE version = 1 SETTINGS mutations_sync = 1`);
    await expect(migrate(db, { tables, eventsTtlDays: 7 }, logger)).rejects.toThrow(/was changed after it was applied/);
  });
});
