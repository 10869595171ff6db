/**
 * Schema migrations: numbered SQL files in ./migrations, applied in order and recorded in
 * schema_migrations with a checksum. Safe to run twice and from two replicas at once: every
 * statement is IF NOT EXISTS or otherwise harmless to repeat, and applied versions are skipped. An
 * applied file that has since changed stops start-up: write a new migration instead of editing an
 * old one.
 */
import { createHash } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import type { Logger } from '../logger.ts';
import type { ClickHouse } from './clickhouse.ts';
import type { Tables } from './tables.ts';

const MIGRATIONS_DIR = fileURLToPath(new URL('./migrations/', import.meta.url));
const FILE_NAME = /^(\d{3,})_([a-z0-9_]+)\.sql$/;

export interface Migration {
  version: number;
  name: string;
  checksum: string;
  template: string;
}

export interface MigrateOptions {
  tables: Tables;
  eventsTtlDays: number;
}

export function listMigrations(dir = MIGRATIONS_DIR): Migration[] {
  return readdirSync(dir)
    .flatMap((file) => {
      const match = FILE_NAME.exec(file);
      if (!match) return [];
      const template = readFileSync(`${dir}/${file}`, 'utf8');
      const checksum = createHash('sha256').update(template).digest('hex');
      return [{ version: Number(match[1]), name: match[2]!, checksum, template }];
    })
    .sort((a, b) => a.version - b.version);
}

/** Splits a file into statements: a statement ends with `;` at the end of a line. */
export function splitStatements(sql: string): string[] {
  return sql
    .split(/;\s*$/m)
    .map((chunk) =>
      chunk
        .split('\n')
        .filter((line) => !line.trim().startsWith('--'))
        .join('\n')
        .trim(),
    )
    .filter((statement) => statement.length > 0);
}

export function renderMigration(template: string, options: MigrateOptions): string {
  return template
    .replaceAll('{{db}}', options.tables.database)
    .replaceAll('{{events_ttl_days}}', String(options.eventsTtlDays));
}

export async function migrate(db: ClickHouse, options: MigrateOptions, logger: Logger): Promise<number[]> {
  const { tables } = options;
  await db.command(`CREATE DATABASE IF NOT EXISTS ${tables.database}`);
  await db.command(
    `CREATE TABLE IF NOT EXISTS ${tables.schemaMigrations} (
       version UInt32 COMMENT 'number of the migration file',
       name String COMMENT 'name of the migration file',
       checksum String COMMENT 'sha256 of the file as applied',
       applied_at DateTime64(3, 'UTC') DEFAULT now64(3) COMMENT 'when it was applied'
     ) ENGINE = MergeTree ORDER BY version COMMENT 'schema migrations applied to this database'`,
  );
  const appliedRows = await db.queryRows<{ version: number; checksum: string }>(
    `SELECT version, any(checksum) AS checksum FROM ${tables.schemaMigrations} GROUP BY version`,
  );
  const applied = new Map(appliedRows.map((row) => [Number(row.version), row.checksum]));
  const newlyApplied: number[] = [];
  for (const migration of listMigrations()) {
    const appliedChecksum = applied.get(migration.version);
    if (appliedChecksum !== undefined) {
      if (appliedChecksum !== migration.checksum) {
        throw new Error(
          `migration ${migration.version}_${migration.name} was changed after it was applied; add a new migration instead`,
        );
      }
      continue;
    }
    for (const statement of splitStatements(renderMigration(migration.template, options))) {
      await db.command(statement);
    }
    await db.command(
      `INSERT INTO ${tables.schemaMigrations} (version, name, checksum) VALUES ({version:UInt32}, {name:String}, {checksum:String})`,
      { version: migration.version, name: migration.name, checksum: migration.checksum },
    );
    newlyApplied.push(migration.version);
    logger.info({ version: migration.version, name: migration.name }, 'migration applied');
  }
  await ensureEventsTtl(db, options, logger);
  return newlyApplied;
}

/**
 * Applies a changed EVENTS_TTL_DAYS to the table and to the events already stored; a start with the
 * same value only reads system.tables. ClickHouse expires a part's rows by the TTL info the part was
 * written with, so the change is materialized: otherwise a raised retention would still delete stored
 * events at the old one, and a lowered one would keep raw IPs and user agents past the new one. With
 * materialize_ttl_recalculate_only (migration 009) that reads only `ts` and rewrites each part's TTL
 * info, not its rows; TTL merges then delete what expired. `alter_sync = 0`: the ALTER returns once
 * the TTL is changed and the recalculation queued (a mutation), which runs in the background, so a
 * large table neither holds start-up nor outlasts the client's request timeout (on the embedded
 * engine, whose queries take turns, a waiting ALTER would hold every other query too). Replicas
 * starting together with the same new value may each queue it: the second pass repeats the first.
 */
async function ensureEventsTtl(db: ClickHouse, options: MigrateOptions, logger: Logger): Promise<void> {
  const [table] = await db.queryRows<{ engine_full: string }>(
    'SELECT engine_full FROM system.tables WHERE database = {database:String} AND name = {name:String}',
    { database: options.tables.database, name: 'request_events' },
  );
  const current = /toIntervalDay\((\d+)\)|INTERVAL (\d+) DAY/i.exec(table?.engine_full ?? '');
  const currentDays = current ? Number(current[1] ?? current[2]) : undefined;
  if (currentDays === options.eventsTtlDays) return;
  await db.command(
    `ALTER TABLE ${options.tables.requestEvents} MODIFY TTL toDateTime(ts) + INTERVAL ${options.eventsTtlDays} DAY
     SETTINGS materialize_ttl_after_modify = 1, alter_sync = 0`,
  );
  logger.info({ from: currentDays, to: options.eventsTtlDays }, 'events TTL changed; stored events follow once their parts are recalculated (in the background)');
}
