import { parseRequestEventText } from '../src/events/request-event.ts';
import { createLogger } from '../src/logger.ts';
import { connectClickHouse, type RowFormat } from '../src/store/clickhouse.ts';
import { serializeEventRow, REQUEST_EVENT_COLUMNS, toClickHouseTime } from '../src/store/event-store.ts';
import { migrate } from '../src/store/migrate.ts';
import { tablesIn } from '../src/store/tables.ts';
import { startClickHouse } from '../test/services/clickhouse.ts';
import { makeEvent } from '../test/support/events.ts';
const N = 500_000;
const ROWS = Number(process.env.ROWS ?? 100_000);
const ch = await startClickHouse();
const db = connectClickHouse({ url: ch.url, username: ch.username, password: ch.password, dataDir: ch.dataDir });
const opts = { runId: 'r', startMs: Date.now() - 3_600_000, keys: 10_000, merchants: 500 };
const events = Array.from({ length: N }, (_, i) => { const p = parseRequestEventText(JSON.stringify(makeEvent(i, opts))); if (!p.ok) throw 1; return p.event; });
const json = (e: any, o: number) => JSON.stringify({ event_id: e.eventId, ts: toClickHouseTime(e.timestamp), merchant_id: e.merchantId, plan: e.plan, api_key_id: e.apiKeyId, environment: e.environment, ip: e.ip, user_agent: e.userAgent, method: e.method, path: e.path, status: e.status, response_time_ms: e.responseTimeMs, rate_limit_per_minute: 60, country: '', source_topic: 't', source_partition: 0, source_offset: o });
for (const fmt of (process.env.FMTS ?? 'JSONEachRow,TabSeparated,JSONEachRow,TabSeparated').split(',') as RowFormat[]) {
  const tables = tablesIn(`${ch.database}_${Math.random().toString(36).slice(2, 8)}`);
  await migrate(db, { tables, eventsTtlDays: 30 }, createLogger('silent'));
  const lines = events.map((e, i) => fmt === 'TabSeparated' ? serializeEventRow(e, { topic: 't', partition: 0, offset: i }) : json(e, i));
  const t = performance.now(); const cpu = process.cpuUsage();
  for (let s = 0; s < N; s += ROWS) await db.insert(tables.requestEvents, REQUEST_EVENT_COLUMNS, Buffer.from(lines.slice(s, s + ROWS).join('\n') + '\n'), fmt);
  const ms = performance.now() - t; const c = process.cpuUsage(cpu);
  console.log(fmt, ROWS, 'insert', ms.toFixed(0), 'ms', Math.round(N / ms * 1000), 'rows/s; cpu', ((c.user + c.system) / 1000 / ms).toFixed(2));
}
await db.close(); await ch.stop();
