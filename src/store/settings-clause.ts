/**
 * A statement's own SETTINGS clause. Kept apart from clickhouse.ts, which loads the client, so that
 * event-store.ts (imported by the analysis thread for its row format) can use it without it.
 */
import type { ClickHouseSettings } from '@clickhouse/client';

/** A ClickHouse string literal. */
export function sqlString(text: string): string {
  return `'${text.replace(/[\\']/g, (special) => `\\${special}`)}'`;
}

/** ` SETTINGS k=v, ...` for a statement ('' without any). */
export function settingsClause(settings: ClickHouseSettings | undefined): string {
  const entries = Object.entries(settings ?? {}).filter(([, value]) => value !== undefined);
  if (entries.length === 0) return '';
  return ` SETTINGS ${entries.map(([name, value]) => `${name}=${typeof value === 'string' ? sqlString(value) : Number(value)}`).join(', ')}`;
}
