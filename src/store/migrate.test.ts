import { describe, expect, it } from 'vitest';
import { listMigrations, renderMigration, splitStatements } from './migrate.ts';
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
});
