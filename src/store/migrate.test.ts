import { describe, expect, it } from 'vitest';
import { createLogger } from '../logger.ts';
import type { ClickHouse } from './clickhouse.ts';
import { listMigrations, migrate, renderMigration, splitStatements } from './migrate.ts';
import { tablesIn } from './tables.ts';

describe('migrations', () => {
  it('are numbered uniquely and in order', () => {
    const versions = listMigrations().map((migration) => migration.version);
    expect(versions.length).toBeGreaterThan(0);
    expect(new Set(versions).size).toBe(versions.length);
    expect([...versions].sort((a, b) => a - b)).toEqual(versions);
  });

  it('render every placeholder', () => {
    for (const migration of listMigrations()) {
      const sql = renderMigration(migration.template, { tables: tablesIn('sc'), eventsTtlDays: 7 });
      expect(sql).not.toMatch(/\{\{/);
    }
  });

  it('split a file into statements, ignoring comments and semicolons inside lines', () => {
    const statements = splitStatements("-- note;\nCREATE TABLE a (x String COMMENT 'a;b');\n\n-- two\nCREATE VIEW v AS SELECT 1;\n");
    expect(statements).toEqual(["CREATE TABLE a (x String COMMENT 'a;b')", 'CREATE VIEW v AS SELECT 1']);
  });

  describe('EVENTS_TTL_DAYS', () => {
    /** A database where every migration is applied and request_events keeps events `days` days: the statements migrate runs. */
    const migrateOver = async (days: number, eventsTtlDays: number) => {
      const commands: string[] = [];
      const db = {
        command: async (query: string) => void commands.push(query),
        queryRows: async (query: string) =>
          query.includes('schema_migrations')
            ? listMigrations().map((migration) => ({ version: migration.version, checksum: migration.checksum }))
            : [{ engine_full: `ReplacingMergeTree PARTITION BY toYYYYMMDD(ts) ORDER BY (ts) TTL toDateTime(ts) + toIntervalDay(${days}) SETTINGS index_granularity = 8192` }],
      } as unknown as ClickHouse;
      await migrate(db, { tables: tablesIn('sc'), eventsTtlDays }, createLogger('silent'));
      return commands.filter((command) => command.includes('MODIFY TTL'));
    };

    it('unchanged: the table is left alone', async () => {
      expect(await migrateOver(30, 30)).toEqual([]);
    });

    // Stored parts keep the TTL they were written with until it is recalculated; start-up must not wait
    // for that on a large table (nor, on the embedded engine, hold every other query meanwhile).
    it('changed: recalculated for the parts already stored, in the background', async () => {
      const [alter, ...more] = await migrateOver(30, 60);
      expect(more).toEqual([]);
      expect(alter).toMatch(/^ALTER TABLE sc\.request_events MODIFY TTL toDateTime\(ts\) \+ INTERVAL 60 DAY\s+SETTINGS /);
      expect(alter).toMatch(/materialize_ttl_after_modify = 1/);
      expect(alter).toMatch(/alter_sync = 0/);
    });
  });
});
