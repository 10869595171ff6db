/**
 * Request events in ClickHouse: how a validated event becomes a row, the bulk insert, and typed
 * queries (one function per question, a zod schema for each result row).
 * Contract: queries take user input only as server-side parameters, never by concatenation.
 */
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { z } from 'zod';
import { EVENT_TIME_RANGE, PLANS, type Plan, type RequestEvent, type TimeRange } from '../events/request-event.ts';
import type { ClickHouseSettings } from '@clickhouse/client';
import { isIP } from 'node:net';
import type { VouchedNetwork } from '../detect/engine.ts';
import type { NetworkSighting } from '../detect/key-history.ts';
import type { SprayedRequests } from '../detect/source-spray.ts';
import { networkOf, sprayNetworkOf } from '../../rules/network.ts';
import type { ClickHouse, InsertBody } from './clickhouse.ts';
import { settingsClause } from './settings-clause.ts';
import type { Tables } from './tables.ts';

export const REQUEST_EVENT_COLUMNS = [
  'event_id',
  'ts',
  'merchant_id',
  'plan',
  'api_key_id',
  'environment',
  'ip',
  'user_agent',
  'method',
  'path',
  'status',
  'response_time_ms',
  'rate_limit_per_minute',
  'country',
  'source_topic',
  'source_partition',
  'source_offset',
] as const;

/** Where an event came from: a Kafka message, or HTTP ingest (partition and offset -1). */
export interface EventSource {
  topic: string;
  partition: number;
  offset: number;
}

export const HTTP_SOURCE: EventSource = { topic: '', partition: -1, offset: -1 };

// Events arrive in time order, so consecutive timestamps share their second: format it once.
let cachedSecond = Number.NaN;
let cachedSecondText = '';

/** The times a DateTime64 column holds (1900-01-01 to 2299-12-31 UTC), as epoch ms; outside it a query fails. */
export const STORABLE_TIME_MS = { min: Date.UTC(1900, 0, 1), max: Date.UTC(2299, 11, 31, 23, 59, 59, 999) } as const;

/** The last second a ClickHouse DateTime holds (2106-02-07 06:28:15 UTC); arithmetic past it wraps around to 1970. */
const DATETIME_MAX_SECOND = 2 ** 32 - 1;

/**
 * How far ahead of the worker's clock an event may be dated: a producer's clock may be off, but a
 * request is not received tomorrow. Raw events are partitioned by day, so every day an insert's
 * events name is a part of its own, kept until that day's TTL: a stream dated over years ahead
 * (a bad clock, or made-up times) would make thousands of them, stalling storage for everyone.
 */
export const MAX_EVENT_AHEAD_MS = 86_400_000;

/**
 * The event times request_events holds with raw events kept `eventsTtlDays`: the rule's
 * (EVENT_TIME_RANGE), ending earlier when the row's TTL, toDateTime(ts) + EVENTS_TTL_DAYS
 * (001_request_events.sql), would pass the end of DateTime (above 2228 days for 2100). Such a TTL
 * wraps into the past: the engine drops the row as expired at insert while the rollup counts it,
 * so validation refuses those times. (The rollup's, minute + 400 days, fits up to 2105.)
 * For the same reason it starts `eventsTtlDays` before the clock (maxAgeMs, applied by timesAsOf):
 * an older event's row has expired already, so the engine drops it at insert while the rollup counts
 * it, and every guard against storing a redelivery twice, which reads raw rows, would miss it.
 * And it ends MAX_EVENT_AHEAD_MS after the clock (maxAheadMs).
 */
export function storableEventTimes(eventsTtlDays: number): TimeRange {
  const kept = {
    maxAgeMs: eventsTtlDays * 86_400_000,
    minWhy: `an earlier event is older than the raw events are kept (EVENTS_TTL_DAYS=${eventsTtlDays}), and would be counted in metrics but not stored`,
    maxAheadMs: MAX_EVENT_AHEAD_MS,
    aheadWhy: "a later event is dated more than a day ahead of this worker's clock (the producer's clock, or this worker's, is off)",
  };
  const latest = (DATETIME_MAX_SECOND - eventsTtlDays * 86_400) * 1000 + 999;
  if (latest >= EVENT_TIME_RANGE.max) return { ...EVENT_TIME_RANGE, ...kept };
  return { ...EVENT_TIME_RANGE, ...kept, max: latest, why: `with EVENTS_TTL_DAYS=${eventsTtlDays}, a later event's retention would end past the last date storage holds (2106-02-07)` };
}

/** ClickHouse DateTime64(3) text in UTC: 'YYYY-MM-DD hh:mm:ss.sss'. */
export function toClickHouseTime(epochMs: number): string {
  const second = Math.floor(epochMs / 1000);
  if (second !== cachedSecond) {
    const iso = new Date(second * 1000).toISOString();
    cachedSecond = second;
    cachedSecondText = `${iso.slice(0, 10)} ${iso.slice(11, 19)}.`;
  }
  const millis = Math.round(epochMs - second * 1000);
  return cachedSecondText + (millis < 10 ? '00' : millis < 100 ? '0' : '') + millis;
}

/** ClickHouse DateTime64 text as results carry it ('2026-11-20 12:00:00.000', UTC) to ISO 8601. */
export function clickHouseTimeToIso(text: string): string {
  return `${text.replace(' ', 'T')}Z`;
}

/** Characters TabSeparated must escape in a value: the separators, the escape itself, CR and NUL. */
const TSV_SPECIAL = /[\t\n\r\\\0]/;
const TSV_SPECIAL_ALL = /[\t\n\r\\\0]/g;
const TSV_ESCAPES: Record<string, string> = { '\t': '\\t', '\n': '\\n', '\r': '\\r', '\\': '\\\\', '\0': '\\0' };

/** A free-text value for a TabSeparated row (ClickHouse's escaping; most values need none). */
export function tsvText(value: string): string {
  return TSV_SPECIAL.test(value) ? value.replace(TSV_SPECIAL_ALL, (special) => TSV_ESCAPES[special]!) : value;
}

const asIs = (value: string) => value;

/**
 * One TabSeparated line for request_events, in REQUEST_EVENT_COLUMNS order, without its newline.
 * Built by hand because it runs on every event: free-text fields are escaped; the others were
 * validated to enums, numbers, letters or IP addresses, none of which can hold a tab, a newline or
 * a backslash.
 * `sourceText` is the JSON the event was parsed from, when the caller has it: JSON writes every
 * character TabSeparated escapes as a backslash sequence, so text without a backslash has none to
 * escape, and one search of it replaces a search of every field.
 */
export function serializeEventRow(event: RequestEvent, source: EventSource, sourceText?: string): string {
  const text = sourceText === undefined || sourceText.includes('\\') ? tsvText : asIs;
  // 0: the event carried no limit (velocity_attack then judges it against the plan's or merchant's default).
  const rateLimit = event.rateLimitPerMinute ?? 0;
  return (
    `${text(event.eventId)}\t${toClickHouseTime(event.timestamp)}\t${text(event.merchantId)}\t${event.plan}` +
    `\t${text(event.apiKeyId)}\t${event.environment}\t${event.ip}\t${text(event.userAgent)}\t${event.method}` +
    `\t${text(event.path)}\t${event.status}\t${event.responseTimeMs}\t${rateLimit}\t${event.country ?? ''}` +
    `\t${tsvText(source.topic)}\t${source.partition}\t${source.offset}`
  );
}

/**
 * Settings of every insert into request_events (partitioned by day) and, through its views,
 * request_rollup_1m and merchant_rollup_15m (by month) and key_networks_1d (by day).
 * - An event may carry any time from 2000 to 2100 (a backfill, a producer with a bad clock), so one
 *   insert may touch more than the server's max_partitions_per_insert_block (100) partitions.
 *   Refused, such an insert would be retried forever with intake paused; past the limit the server
 *   logs a warning instead, and the insert is stored.
 * - optimize_on_insert off: by default the engine runs each table's merge (Replacing, Aggregating)
 *   over every inserted block before writing it, which finds nothing here: the worker drops a
 *   repeated eventId before it stores (recent-event-ids.ts), and the views' GROUP BY has already
 *   aggregated their blocks. Rows that meet later (a redelivery after a restart) still collapse on
 *   merge, as they always had to across inserts. Measured: 10-12% more rows/s per insert (50k-row
 *   TabSeparated inserts of 500k events, embedded engine, alternating runs: 169-180k against 150-160k).
 * - deduplicate_blocks_in_dependent_materialized_views on: these tables keep the ids of their latest
 *   inserted blocks (010_insert_deduplication.sql), so an insert repeated under the same
 *   insert_deduplication_token (insertRows) is dropped by the views as well as by request_events.
 *   Off (the default before ClickHouse 26.2), the views still count the block request_events drops.
 */
export const EVENT_INSERT_SETTINGS: ClickHouseSettings = {
  throw_on_max_partitions_per_insert_block: 0,
  optimize_on_insert: 0,
  deduplicate_blocks_in_dependent_materialized_views: 1,
};

/** The rollup's minute is a DateTime: seconds since 1970 in 32 bits, up to 2106-02-07T06:28:15Z. */
const ROLLUP_MINUTES_MS = { min: 0, max: 4_294_967_295_000 } as const;

/** merchant_rollup_15m's period. */
const QUARTER_HOUR_MS = 15 * 60_000;

/** A range as the traffic queries bind it (rollupSpan). */
interface RollupSpan {
  from: string;
  to: string;
  quartersFrom: string;
  quartersTo: string;
}

/**
 * A range as the traffic queries bind it: its minutes, [from, to), within the times the rollups'
 * columns can hold (a bound beyond them would be wrapped around by the comparison, and match the
 * wrong rows); and the whole quarter hours in it, [quartersFrom, quartersTo), which are read from
 * merchant_rollup_15m, the rest from request_rollup_1m. Without `wholeQuarters`, or with no whole
 * quarter hour in the range, that part is empty. Undefined when the range lies wholly outside the
 * rollups' times (no traffic can be there).
 */
function rollupSpan(range: { from: Date; to: Date }, wholeQuarters = true): RollupSpan | undefined {
  const from = Math.max(range.from.getTime(), ROLLUP_MINUTES_MS.min);
  const to = Math.min(range.to.getTime(), ROLLUP_MINUTES_MS.max);
  if (from > to) return undefined;
  let quartersFrom = Math.ceil(from / QUARTER_HOUR_MS) * QUARTER_HOUR_MS;
  let quartersTo = Math.floor(to / QUARTER_HOUR_MS) * QUARTER_HOUR_MS;
  if (!wholeQuarters || quartersFrom >= quartersTo) quartersFrom = quartersTo = from;
  return {
    from: toClickHouseTime(from),
    to: toClickHouseTime(to),
    quartersFrom: toClickHouseTime(quartersFrom),
    quartersTo: toClickHouseTime(quartersTo),
  };
}

/** The rollup's sum columns (002_request_rollup_1m.sql). */
const ROLLUP_SUMS = ['requests', 'successes', 'client_errors', 'server_errors', 'auth_failures', 'not_found', 'rate_limited', 'response_time_sum'];

/** The rollup's sum columns, each summed under its own name: a group's sums, in a repair's query. */
const SUMMED_ROLLUP_SUMS = ROLLUP_SUMS.map((column) => `sum(${column}) AS ${column}`).join(', ');

/** Each rollup sum of the subquery `whole` less that of `rolled`, under its own name, never below 0: a repair's rows. */
function rollupSumShortfalls(whole: string, rolled: string): string {
  return ROLLUP_SUMS.map((column) => `greatest(${whole}.${column} - ${rolled}.${column}, 0) AS ${column}`).join(', ');
}

/**
 * The views that repairViews makes whole after a crash, in stages, each stage's shortfalls read once
 * the stage before it is repaired: the per-minute rollup and key_networks_1d, compared with the raw
 * events; then merchant_rollup_15m (016_merchant_rollup_15m.sql), compared with the per-minute rollup,
 * which holds the same sums per key and minute, in fewer rows than the raw events, once it is whole.
 */
const VIEW_STAGES = [['rollup', 'keyNetworks'], ['merchantRollup']] as const;
type ViewStage = (typeof VIEW_STAGES)[number];
type View = ViewStage[number];

/** How many events each view missed (repairViews). */
export type ViewShortfalls = Record<View, number>;

/** A view's repair: the table and columns to insert into, and the query of the rows it misses. */
interface ViewRepair {
  into: string;
  rows: string;
}

const shortfallCount = z.coerce.number();

/**
 * Reads the shortfalls of a stage's views until two readings `settleMs` apart agree, or five were
 * taken; one with nothing missing is taken at once. A shortfall that changes between readings was
 * another writer's insert still landing its view parts.
 */
async function settledShortfalls(stage: ViewStage, read: () => Promise<Partial<ViewShortfalls>>, settleMs: number): Promise<Partial<ViewShortfalls>> {
  let shortfalls = await read();
  for (let reading = 1; stage.some((view) => shortfalls[view]! > 0) && reading < 5; reading++) {
    await sleep(settleMs);
    const again = await read();
    if (stage.every((view) => again[view] === shortfalls[view])) break;
    shortfalls = again;
  }
  return shortfalls;
}

const offsetRow = z.object({ partition: z.coerce.number(), max_offset: z.coerce.number() });
const storedIdsRow = z.object({ offset: z.coerce.number(), event_ids: z.array(z.string()) });
const newestRow = z.object({ newest: z.coerce.number(), events: z.coerce.number() });
const trafficRow = z.object({
  requests: z.coerce.number(),
  successes: z.coerce.number(),
  unique_ips: z.coerce.number(),
});
/** The rows of one query of recentEvents (a restart's warm-up): its memory at the peak, against the queries' number. */
export const WARM_UP_QUERY_ROWS = 100_000;

const storedEventRow = z.object({
  event_id: z.string(),
  ts: z.string(),
  merchant_id: z.string(),
  plan: z.string(),
  api_key_id: z.string(),
  environment: z.string(),
  ip: z.string(),
  user_agent: z.string(),
  method: z.string(),
  path: z.string(),
  status: z.coerce.number(),
  response_time_ms: z.coerce.number(),
  rate_limit_per_minute: z.coerce.number(),
  country: z.string(),
});
type StoredEvent = z.output<typeof storedEventRow>;

const sightingRow = z.object({
  merchant_id: z.string(),
  api_key_id: z.string(),
  ip: z.string(),
  first: z.coerce.number(),
  last: z.coerce.number(),
  /** 0 when no record says it was vouched for. */
  vouched: z.coerce.number(),
});

const sprayedRequestsRow = z.object({
  merchant_id: z.string(),
  api_key_id: z.string(),
  partition: z.coerce.number(),
  address: z.string(),
  user_agent: z.string(),
  failures: z.coerce.number(),
  judged: z.coerce.number(),
  first: z.coerce.number(),
  newest: z.coerce.number(),
  event_id: z.string(),
  country: z.string(),
  newest_plan: z.enum(PLANS),
  key_rows: z.coerce.number(),
  key_failures: z.coerce.number(),
  key_judged: z.coerce.number(),
  key_live: z.coerce.number(),
});

/** The network (/24 or /64, as network_auth_failures_1m and key_vouched_networks_1d hold it) of a stored address `column`. */
const KEY_NETWORK_OF = (column: string) => `IPv6CIDRToRange(${column}, if(${column} BETWEEN toIPv6('::ffff:0.0.0.0') AND toIPv6('::ffff:255.255.255.255'), 120, 64)).1`;

/** The network credential stuffing is counted by (rules/network.ts sprayNetworkOf) of a stored address or network `column`: a /24 as it is, a /64 widened to its /48. */
const SPRAY_NETWORK_OF = (column: string) => `IPv6CIDRToRange(${column}, if(${column} BETWEEN toIPv6('::ffff:0.0.0.0') AND toIPv6('::ffff:255.255.255.255'), 120, 48)).1`;

const VOUCHED_COLUMNS = ['source_topic', 'source_partition', 'day', 'merchant_id', 'api_key_id', 'network', 'vouched_at'] as const;

const trendRow = z.object({ t: z.coerce.number(), requests: z.coerce.number(), successes: z.coerce.number() });

/** One bucket of a traffic chart; t is the bucket's start in epoch ms. */
export interface TrafficPoint {
  t: number;
  requests: number;
  successes: number;
}

export interface TrafficTotals {
  requests: number;
  successes: number;
  failureRate: number;
  uniqueIps: number;
}

export class EventStore {
  constructor(
    private readonly db: ClickHouse,
    private readonly tables: Tables,
  ) {}

  /**
   * Inserts pre-serialized rows (serializeEventRow lines, each ending in '\n'). `signal` gives up on
   * the insert (ClickHouse.insert says how far it is cancelled).
   * `dedupToken` names the rows across retries (the buffer's flush): an insert that landed although
   * it was reported failed (a timeout, a connection reset after the commit) and is repeated under the
   * same token stores nothing more, neither in request_events nor in its views. Two inserts under
   * different tokens are both stored, whatever their rows.
   */
  insertRows(body: InsertBody, signal?: AbortSignal, dedupToken?: string): Promise<void> {
    const settings = dedupToken === undefined ? EVENT_INSERT_SETTINGS : { ...EVENT_INSERT_SETTINGS, insert_deduplication_token: dedupToken };
    return this.db.insert(this.tables.requestEvents, REQUEST_EVENT_COLUMNS, body, 'TabSeparated', settings, signal);
  }

  /**
   * The highest Kafka offset already stored per partition, looking back `lookbackHours` of arrivals.
   * A consumer that resumes from an older committed offset (after a crash or a rebalance) skips up to
   * here, so a redelivered message is not inserted, and counted, twice.
   */
  async storedOffsets(topic: string, partitions: readonly number[], lookbackHours = 48): Promise<Map<number, number>> {
    if (partitions.length === 0) return new Map();
    const rows = await this.db.queryRows(
      `SELECT source_partition AS partition, max(source_offset) AS max_offset
         FROM ${this.tables.requestEvents}
        WHERE source_topic = {topic:String}
          AND source_partition IN {partitions:Array(Int32)}
          AND received_at >= now64(3) - toIntervalHour({hours:UInt32})
        GROUP BY source_partition`,
      { topic, partitions: [...partitions], hours: lookbackHours },
    );
    return new Map(rows.map((row) => offsetRow.parse(row)).map((row) => [row.partition, row.max_offset]));
  }

  /**
   * The eventIds stored from the lowest offset of a partition in [fromOffset, toOffset] at which
   * any is stored (two incarnations of a recreated topic may each have stored one there), looking
   * back as storedOffsets does; undefined when none is stored in that range. Comparing them with the
   * message now at that offset tells whether what storedOffsets found is this topic's progress or an
   * earlier incarnation's (a topic deleted and created again, a new cluster).
   */
  async eventIdsAtFirstStoredOffset(
    source: { topic: string; partition: number; fromOffset: number; toOffset: number },
    lookbackHours = 48,
  ): Promise<{ offset: number; eventIds: string[] } | undefined> {
    const rows = await this.db.queryRows(
      `SELECT source_offset AS offset, groupUniqArray(event_id) AS event_ids
         FROM ${this.tables.requestEvents}
        WHERE source_topic = {topic:String} AND source_partition = {partition:Int32}
          AND source_offset BETWEEN {fromOffset:Int64} AND {toOffset:Int64}
          AND received_at >= now64(3) - toIntervalHour({hours:UInt32})
        GROUP BY source_offset
        ORDER BY source_offset
        LIMIT 1`,
      { ...source, hours: lookbackHours },
    );
    if (rows.length === 0) return undefined;
    const row = storedIdsRow.parse(rows[0]);
    return { offset: row.offset, eventIds: row.event_ids };
  }

  /**
   * Adds to the views (the per-minute rollup, key_networks_1d, merchant_rollup_15m) what they miss
   * for the events of one partition from `fromOffset` on, and returns how many events each missed.
   * Why: ClickHouse commits an insert's raw part and its materialized views' parts one after the
   * other, not atomically. A process killed in between leaves events stored without their view
   * rows; their offsets were not committed, so they come again, and storedOffsets skips them as
   * already stored. Without this metrics would never count them, and detection's memory of the
   * key's networks (warmed from key_networks_1d) would not know the networks seen in them.
   * Every group of a view those events fall in is compared with all raw events of that group (for
   * merchant_rollup_15m, with the rollup's rows of the group: see VIEW_STAGES), and only a shortfall
   * is added: the sums by the difference, the other columns (max, min, any, uniq) by their whole
   * value (merging them again changes nothing). Run again, it adds nothing.
   * Another writer's insert may be between its commits right now (a replica that just lost the
   * partition, or this one's own buffer): a shortfall is added only once two readings `settleMs`
   * apart agree, or after the fifth reading.
   */
  async repairViews(source: { topic: string; partition: number; fromOffset: number }, settleMs = 1_000, lookbackHours = 48): Promise<ViewShortfalls> {
    const params = { ...source, hours: lookbackHours };
    const repairs: Record<View, ViewRepair> = {
      rollup: this.rollupRepair(),
      keyNetworks: this.keyNetworksRepair(),
      merchantRollup: this.merchantRollupRepair(),
    };
    const shortfalls: ViewShortfalls = { rollup: 0, keyNetworks: 0, merchantRollup: 0 };
    for (const stage of VIEW_STAGES) {
      const found = await settledShortfalls(stage, () => this.viewShortfalls(repairs, stage, params), settleMs);
      for (const view of stage) {
        shortfalls[view] = found[view]!;
        if (shortfalls[view] <= 0) continue;
        // A token of its own: the views' tables deduplicate inserts (010_insert_deduplication.sql), and
        // without one a repair with the same rows as an earlier one could be dropped as its repeat (a
        // 25.8 server deduplicates an INSERT ... SELECT by its rows).
        const settings = { ...EVENT_INSERT_SETTINGS, insert_deduplication_token: randomUUID() };
        await this.db.command(`INSERT INTO ${repairs[view].into}${settingsClause(settings)} ${repairs[view].rows}`, params);
      }
    }
    return shortfalls;
  }

  /** How many events each of a stage's views misses (see repairViews), read in one query. */
  private async viewShortfalls(repairs: Record<View, ViewRepair>, stage: ViewStage, params: Record<string, unknown>): Promise<Partial<ViewShortfalls>> {
    const [row] = await this.db.queryRows<Record<string, unknown>>(
      `SELECT ${stage.map((view) => `(SELECT sum(requests) FROM (${repairs[view].rows})) AS ${view}`).join(', ')}`,
      params,
    );
    return Object.fromEntries(stage.map((view) => [view, shortfallCount.parse(row?.[view])]));
  }

  /**
   * The rollup rows that make up for a shortfall (see repairViews). The raw aggregates must be the
   * ones the view in 002_request_rollup_1m.sql writes.
   */
  private rollupRepair(): ViewRepair {
    const { requestEvents, requestRollup1m } = this.tables;
    return {
      into: `${requestRollup1m} (merchant_id, api_key_id, minute, ${ROLLUP_SUMS.join(', ')}, response_time_max, unique_ips)`,
      rows: `
      WITH touched AS (
        SELECT DISTINCT merchant_id, api_key_id, toStartOfMinute(ts) AS minute
          FROM ${requestEvents}
         WHERE source_topic = {topic:String} AND source_partition = {partition:Int32} AND source_offset >= {fromOffset:Int64}
           AND received_at >= now64(3) - toIntervalHour({hours:UInt32})
      )
      SELECT merchant_id, api_key_id, minute,
             ${rollupSumShortfalls('raw', 'rolled')},
             raw.response_time_max AS response_time_max, raw.unique_ips AS unique_ips
        FROM (
          SELECT merchant_id, api_key_id, toStartOfMinute(ts) AS minute,
                 count() AS requests, countIf(status < 400) AS successes,
                 countIf(status >= 400 AND status < 500) AS client_errors, countIf(status >= 500) AS server_errors,
                 countIf(status IN (401, 403)) AS auth_failures, countIf(status = 404) AS not_found,
                 countIf(status = 429) AS rate_limited, sum(toFloat64(response_time_ms)) AS response_time_sum,
                 max(response_time_ms) AS response_time_max, uniqState(ip) AS unique_ips
            FROM ${requestEvents}
           WHERE (merchant_id, api_key_id, toStartOfMinute(ts)) IN touched
           GROUP BY merchant_id, api_key_id, minute
        ) AS raw
        LEFT JOIN (
          SELECT merchant_id, api_key_id, minute, ${SUMMED_ROLLUP_SUMS}
            FROM ${requestRollup1m}
           WHERE (merchant_id, api_key_id, minute) IN touched
           GROUP BY merchant_id, api_key_id, minute
        ) AS rolled USING (merchant_id, api_key_id, minute)
       WHERE raw.requests > rolled.requests`,
    };
  }

  /**
   * The merchant_rollup_15m rows that make up for a shortfall against the rollup (see repairViews),
   * in the merchants' quarter hours of the partition's events. The rollup's sums per merchant and
   * quarter hour are what the view in 016_merchant_rollup_15m.sql writes from the raw events.
   */
  private merchantRollupRepair(): ViewRepair {
    const { requestEvents, requestRollup1m, merchantRollup15m } = this.tables;
    return {
      into: `${merchantRollup15m} (merchant_id, quarter_hour, ${ROLLUP_SUMS.join(', ')}, response_time_max, unique_ips)`,
      rows: `
      WITH touched AS (
        SELECT DISTINCT merchant_id, toStartOfFifteenMinutes(ts) AS quarter_hour
          FROM ${requestEvents}
         WHERE source_topic = {topic:String} AND source_partition = {partition:Int32} AND source_offset >= {fromOffset:Int64}
           AND received_at >= now64(3) - toIntervalHour({hours:UInt32})
      )
      SELECT merchant_id, quarter_hour,
             ${rollupSumShortfalls('whole', 'rolled')},
             whole.response_time_max AS response_time_max, whole.unique_ips AS unique_ips
        FROM (
          SELECT merchant_id, toStartOfFifteenMinutes(minute) AS quarter_hour,
                 ${SUMMED_ROLLUP_SUMS},
                 max(response_time_max) AS response_time_max, uniqMergeState(unique_ips) AS unique_ips
            FROM ${requestRollup1m}
           WHERE (merchant_id, toStartOfFifteenMinutes(minute)) IN touched
           GROUP BY merchant_id, quarter_hour
        ) AS whole
        LEFT JOIN (
          SELECT merchant_id, quarter_hour, ${SUMMED_ROLLUP_SUMS}
            FROM ${merchantRollup15m}
           WHERE (merchant_id, quarter_hour) IN touched
           GROUP BY merchant_id, quarter_hour
        ) AS rolled USING (merchant_id, quarter_hour)
       WHERE whole.requests > rolled.requests`,
    };
  }

  /**
   * The key_networks_1d rows that make up for a shortfall (see repairViews). The grouping, the
   * network and the raw aggregates must be the ones the view in 007_key_networks.sql writes. A group
   * the view lacks entirely joins as zeros (join_use_nulls off, pinned in clickhouse.ts): it is added whole.
   */
  private keyNetworksRepair(): ViewRepair {
    const { requestEvents, keyNetworks1d } = this.tables;
    const network = `IPv6CIDRToRange(ip, if(ip BETWEEN toIPv6('::ffff:0.0.0.0') AND toIPv6('::ffff:255.255.255.255'), 120, 64)).1`;
    const ofPartition = 'source_topic = {topic:String} AND source_partition = {partition:Int32}';
    return {
      into: `${keyNetworks1d} (source_topic, source_partition, day, merchant_id, api_key_id, plan, network, sample_ip, first_seen, last_seen, requests)`,
      rows: `
      WITH touched AS (
        SELECT DISTINCT merchant_id, api_key_id, toDate(ts) AS day, plan, ${network} AS network
          FROM ${requestEvents}
         WHERE ${ofPartition} AND source_offset >= {fromOffset:Int64}
           AND received_at >= now64(3) - toIntervalHour({hours:UInt32})
      )
      SELECT source_topic, source_partition, day, merchant_id, api_key_id, plan, network,
             raw.sample_ip AS sample_ip, raw.first_seen AS first_seen, raw.last_seen AS last_seen,
             greatest(raw.requests - seen.requests, 0) AS requests
        FROM (
          SELECT source_topic, source_partition, toDate(ts) AS day, merchant_id, api_key_id, plan, ${network} AS network,
                 any(ip) AS sample_ip, min(ts) AS first_seen, max(ts) AS last_seen, count() AS requests
            FROM ${requestEvents}
           WHERE ${ofPartition} AND (merchant_id, api_key_id, toDate(ts), plan, ${network}) IN touched
           GROUP BY source_topic, source_partition, day, merchant_id, api_key_id, plan, network
        ) AS raw
        LEFT JOIN (
          SELECT source_topic, source_partition, day, merchant_id, api_key_id, plan, network, sum(requests) AS requests
            FROM ${keyNetworks1d}
           WHERE ${ofPartition} AND (merchant_id, api_key_id, day, plan, network) IN touched
           GROUP BY source_topic, source_partition, day, merchant_id, api_key_id, plan, network
        ) AS seen USING (source_topic, source_partition, day, merchant_id, api_key_id, plan, network)
       WHERE raw.requests > seen.requests`,
    };
  }

  /**
   * The rollups' rows of a span (rollupSpan), `columns` of each and its `start` (its minute or quarter
   * hour): its whole quarter hours from merchant_rollup_15m, its other minutes from request_rollup_1m,
   * so every minute is read once. The two tables' columns have the same names and types.
   */
  private rollupRows(columns: string): string {
    const ofMerchant = "({merchantId:String} = '' OR merchant_id = {merchantId:String})";
    return `
        SELECT quarter_hour AS start, ${columns}
          FROM ${this.tables.merchantRollup15m}
         WHERE quarter_hour >= {quartersFrom:DateTime64(3, 'UTC')} AND quarter_hour < {quartersTo:DateTime64(3, 'UTC')}
           AND ${ofMerchant}
        UNION ALL
        SELECT minute AS start, ${columns}
          FROM ${this.tables.requestRollup1m}
         WHERE minute >= {from:DateTime64(3, 'UTC')} AND minute < {to:DateTime64(3, 'UTC')}
           AND (minute < {quartersFrom:DateTime64(3, 'UTC')} OR minute >= {quartersTo:DateTime64(3, 'UTC')})
           AND ${ofMerchant}`;
  }

  /**
   * Traffic totals from the rollups (never raw events); merchantId undefined = all.
   * A minute counts in the range its start falls in, [from, to): so ranges that meet share no minute,
   * and a range ending now includes the minute in progress.
   */
  async trafficTotals(range: { from: Date; to: Date; merchantId?: string }): Promise<TrafficTotals> {
    const span = rollupSpan(range);
    const rows = !span ? [] : await this.db.queryRows(
      `SELECT sum(requests) AS requests, sum(successes) AS successes, uniqMerge(unique_ips) AS unique_ips
         FROM (${this.rollupRows('requests, successes, unique_ips')})`,
      { ...span, merchantId: range.merchantId ?? '' },
    );
    const totals = trafficRow.parse(rows[0] ?? { requests: 0, successes: 0, unique_ips: 0 });
    return {
      requests: totals.requests,
      successes: totals.successes,
      failureRate: totals.requests === 0 ? 0 : (totals.requests - totals.successes) / totals.requests,
      uniqueIps: totals.unique_ips,
    };
  }

  /**
   * Requests and successes per bucket from the rollups, oldest first, with empty buckets filled in
   * as zeros so a chart has one point per bucket: those starting in [floor(from), to).
   * Minutes count as in trafficTotals, so the points add up to its requests over a range whose from
   * starts a bucket. Buckets are aligned to the epoch, as quarter hours are: a bucket of whole
   * quarter hours reads them from merchant_rollup_15m; a shorter one reads minutes only.
   */
  async trafficTrend(range: { from: Date; to: Date; merchantId?: string; bucketSeconds: number }): Promise<TrafficPoint[]> {
    const bucketMs = range.bucketSeconds * 1000;
    const span = rollupSpan(range, bucketMs % QUARTER_HOUR_MS === 0);
    const rows = !span ? [] : await this.db.queryRows(
      `SELECT toUnixTimestamp(toStartOfInterval(start, INTERVAL {bucket:UInt32} SECOND)) AS t,
              sum(requests) AS requests, sum(successes) AS successes
         FROM (${this.rollupRows('requests, successes')})
        GROUP BY t`,
      { ...span, merchantId: range.merchantId ?? '', bucket: range.bucketSeconds },
    );
    const byBucket = new Map(rows.map((raw) => {
      const row = trendRow.parse(raw);
      return [row.t * 1000, row] as const;
    }));
    const points: TrafficPoint[] = [];
    for (let t = Math.floor(range.from.getTime() / bucketMs) * bucketMs; t < range.to.getTime(); t += bucketMs) {
      const row = byBucket.get(t);
      points.push({ t, requests: row?.requests ?? 0, successes: row?.successes ?? 0 });
    }
    return points;
  }

  /**
   * The eventIds of one source (topic and partition; HTTP_SOURCE for events posted without Kafka)
   * stored since a time, the newest `limit` of them, oldest first. A worker that starts remembers
   * these, so that a client retrying a post the previous process stored (its answer lost in the
   * restart) is told it is a duplicate rather than counted twice by the rollup.
   */
  async recentEventIds(source: { topic: string; partition: number }, since: Date, limit: number): Promise<string[]> {
    const rows = await this.db.queryRows<{ event_id: string }>(
      `SELECT event_id FROM (
         SELECT event_id, received_at
           FROM ${this.tables.requestEvents}
          WHERE source_topic = {topic:String} AND source_partition = {partition:Int32}
            AND received_at >= {since:DateTime64(3, 'UTC')}
          ORDER BY received_at DESC
          LIMIT {limit:UInt64})
       ORDER BY received_at`,
      { topic: source.topic, partition: source.partition, since: toClickHouseTime(since.getTime()), limit },
    );
    return rows.map((row) => row.event_id);
  }

  /**
   * When the newest event stored from a partition (partition -1: events that came over HTTP) is
   * dated, of those dated up to `notAfter`, looking back as storedOffsets does; undefined when none
   * is. Detection warms a partition's windows as of it: a replica catching up on a backlog judges the
   * backlog as of its own times, not the clock's. An event dated ahead of `notAfter` (a producer's
   * clock off by a day) does not move it.
   */
  async newestEventTime(source: { topic: string; partition: number }, notAfter: Date, lookbackHours = 48): Promise<number | undefined> {
    const rows = await this.db.queryRows(
      `SELECT toUnixTimestamp64Milli(max(ts)) AS newest, count() AS events
         FROM ${this.tables.requestEvents}
        WHERE source_topic = {topic:String} AND source_partition = {partition:Int32}
          AND received_at >= now64(3) - toIntervalHour({hours:UInt32})
          AND ts <= {notAfter:DateTime64(3, 'UTC')}`,
      { ...source, notAfter: toClickHouseTime(notAfter.getTime()), hours: lookbackHours },
    );
    const row = newestRow.parse(rows[0]);
    return row.events > 0 ? row.newest : undefined;
  }

  /**
   * Raw events since a time, each eventId once (duplicates not yet merged away are collapsed here):
   * the newest `limit` rows of them (a repeat not merged yet counts among them, so a few fewer events
   * may come), handed to `onPage` oldest first in pages of at most `pageSize`, each page awaited
   * before the next is read. Detection warms its windows from this; topic and partition select the
   * events a replica owns (partition -1: events that came over HTTP), plans the plans it evaluates.
   * Returns how many events it handed over.
   * Read in queries of `queryRows`, each after the last one's (ts, event_id): the embedded
   * engine, in this process, answers a query with its whole result at once, and a million rows in one
   * query took 2.5 GB more memory at its peak (a restart's warm-up; 0.7 GB in queries of 100,000).
   */
  async recentEvents(
    range: {
      since: Date;
      topic?: string;
      partition?: number;
      merchantId?: string;
      plans?: readonly string[];
      limit?: number;
    },
    onPage: (events: RequestEvent[]) => Promise<void>,
    pageSize = 10_000,
    queryRows = WARM_UP_QUERY_ROWS,
  ): Promise<number> {
    const table = this.tables.requestEvents;
    const filter = `ts >= {since:DateTime64(3, 'UTC')}
            AND ({merchantId:String} = '' OR merchant_id = {merchantId:String})
            AND ({anySource:Bool} OR (source_topic = {topic:String} AND source_partition = {partition:Int32}))
            AND (empty({plans:Array(String)}) OR has({plans:Array(String)}, toString(plan)))`;
    const params = {
      since: toClickHouseTime(range.since.getTime()),
      merchantId: range.merchantId ?? '',
      anySource: range.partition === undefined,
      topic: range.topic ?? '',
      partition: range.partition ?? -1,
      plans: range.plans ?? [],
    };
    // Where the newest `limit` rows begin; none when fewer match.
    const [newest] = await this.db.queryRows<{ first: string }>(
      `SELECT toString(ts) AS first FROM ${table} WHERE ${filter} ORDER BY ts DESC LIMIT 1 OFFSET {skip:UInt64}`,
      { ...params, skip: Math.max(0, (range.limit ?? 1_000_000) - 1) },
    );
    // Every eventId is longer than '': the first query starts at the first row's time, inclusive.
    let after = { ts: newest?.first ?? params.since, eventId: '' };
    let handed = 0;
    for (;;) {
      let read = 0;
      let last: StoredEvent | undefined;
      await this.db.queryPages(
        `SELECT event_id, ts, merchant_id, plan, api_key_id, environment, ip, user_agent, method, path, status,
                response_time_ms, rate_limit_per_minute, country
           FROM ${table}
          WHERE ${filter}
            AND ts >= {afterTs:DateTime64(3, 'UTC')} -- the same bound, as the engine reads it to skip data
            AND (ts, event_id) > ({afterTs:DateTime64(3, 'UTC')}, {afterId:String})
          ORDER BY ts, event_id
          LIMIT 1 BY event_id
          LIMIT {rows:UInt64}`,
        { ...params, afterTs: after.ts, afterId: after.eventId, rows: queryRows },
        pageSize,
        async (rows) => {
          const stored = rows.map((row) => storedEventRow.parse(row));
          read += stored.length;
          handed += stored.length;
          last = stored.at(-1);
          await onPage(stored.map(toRequestEvent));
        },
      );
      // LIMIT counts the rows LIMIT BY left, one per event: a query that returned fewer was the last.
      if (!last || read < queryRows) return handed;
      after = { ts: last.ts, eventId: last.event_id };
    }
  }

  /**
   * Records the networks detection vouched for (key_vouched_networks_1d, read back by
   * networkSightings): `topic` is the Kafka topic of their partitions ('' for HTTP, partition -1).
   */
  async insertVouchedNetworks(topic: string, vouched: readonly VouchedNetwork[]): Promise<void> {
    const lines: string[] = [];
    for (const { merchantId, apiKeyId, partition, network, at } of vouched) {
      const address = network.slice(0, network.indexOf('/')); // rules/network.ts names a network by its first address
      const family = isIP(address);
      if (family === 0) continue; // a name that is not a range (an address that was not one): nothing to match it with
      const time = toClickHouseTime(at);
      lines.push(
        JSON.stringify({
          source_topic: topic,
          source_partition: partition,
          day: time.slice(0, 10),
          merchant_id: merchantId,
          api_key_id: apiKeyId,
          network: family === 4 ? `::ffff:${address}` : address,
          vouched_at: time,
        }),
      );
    }
    if (lines.length === 0) return;
    await this.db.insert(this.tables.keyVouchedNetworks1d, VOUCHED_COLUMNS, Buffer.from(`${lines.join('\n')}\n`), 'JSONEachRow');
  }

  /**
   * The networks keys were seen from since a time (key_networks_1d, by whole days from that of
   * `since`): one sighting per key and network, its first and last request, one of its addresses,
   * and the earliest record of it as vouched for (key_vouched_networks_1d), handed to `onPage` a page
   * at a time, each key's in order of first request (the first is the key's first network).
   * Detection warms its memory of keys' networks and places (KeyHistory) from this; topic and
   * partition select the keys a replica owns (partition -1: HTTP), plans the plans it evaluates.
   * Returns how many it handed over.
   */
  async networkSightings(
    range: { since: Date; topic: string; partition: number; plans?: readonly string[] },
    onPage: (sightings: NetworkSighting[]) => Promise<void>,
    pageSize = 10_000,
  ): Promise<number> {
    let handed = 0;
    await this.db.queryPages(
      `SELECT seen.merchant_id AS merchant_id, seen.api_key_id AS api_key_id, seen.ip AS ip, seen.first AS first, seen.last AS last,
              toUnixTimestamp64Milli(vouched.at) AS vouched
         FROM (
           SELECT merchant_id, api_key_id, network, toString(any(sample_ip)) AS ip,
                  toUnixTimestamp64Milli(min(first_seen)) AS first, toUnixTimestamp64Milli(max(last_seen)) AS last
             FROM ${this.tables.keyNetworks1d}
            WHERE source_topic = {topic:String} AND source_partition = {partition:Int32}
              AND day >= toDate({since:DateTime64(3, 'UTC')})
              AND (empty({plans:Array(String)}) OR has({plans:Array(String)}, toString(plan)))
            GROUP BY merchant_id, api_key_id, network
         ) AS seen
         LEFT JOIN (
           SELECT merchant_id, api_key_id, network, min(vouched_at) AS at
             FROM ${this.tables.keyVouchedNetworks1d}
            WHERE source_topic = {topic:String} AND source_partition = {partition:Int32}
              AND day >= toDate({since:DateTime64(3, 'UTC')})
            GROUP BY merchant_id, api_key_id, network
         ) AS vouched
           ON seen.merchant_id = vouched.merchant_id AND seen.api_key_id = vouched.api_key_id AND seen.network = vouched.network
        ORDER BY merchant_id, api_key_id, first`,
      { since: toClickHouseTime(range.since.getTime()), topic: range.topic, partition: range.partition, plans: range.plans ?? [] },
      pageSize,
      async (rows) => {
        handed += rows.length;
        await onPage(
          rows.map((raw) => {
            const row = sightingRow.parse(raw);
            const sighting: NetworkSighting = { merchantId: row.merchant_id, apiKeyId: row.api_key_id, ip: fromStoredIp(row.ip), first: row.first, last: row.last };
            if (row.vouched > 0) sighting.vouched = row.vouched; // a LEFT JOIN without a match gives 1970
            return sighting;
          }),
        );
      },
    );
    return handed;
  }
  /**
   * Credential stuffing across replicas (018_network_auth_failures_1m.sql): the requests of the
   * `windowMs` up to storage's newest 401 between `notBefore` and `until` (as of storage's time, so
   * that a fleet behind on its topic is read whole; never as of a time past `clock`, nor when no 401
   * came since `notBefore`), of the plans detection
   * evaluates, of the keys that failed with 401 from a
   * network that failed so for at least `minKeys` keys in all, one of them on a partition not in
   * `owned` (a network whose keys are all this replica's, its own tally judges whole). One row per
   * key, network, address and user agent, so that detection leaves out what its allowlists cover and
   * judges the rest as its windows would (sprayedKeysOf). Of each network the `keysPerNetwork` keys
   * that failed last, `maxKeys` in all; of each key and network the `rowsPerKey` rows with the newest
   * 401s, then the most requests (an attacker's addresses and user agents could make many), each row
   * with the totals of all of them. A key's requests from a network of its own (vouched for before
   * the window, key_vouched_networks_1d) are left out, as the engine's failedFrom leaves them out.
   */
  async sprayedRequests(query: {
    notBefore: Date;
    clock: Date;
    until: Date;
    windowMs: number;
    topic: string;
    owned: readonly number[];
    minKeys: number;
    plans?: readonly string[];
    keysPerNetwork: number;
    maxKeys: number;
    rowsPerKey: number;
  }): Promise<SprayedRequests[]> {
    const rows = await this.db.queryRows(
      `WITH (SELECT max(last_failure) FROM ${this.tables.networkAuthFailures1m}
              WHERE minute >= toStartOfMinute({notBefore:DateTime64(3, 'UTC')}) AND minute <= {until:DateTime64(3, 'UTC')}
                AND last_failure <= {until:DateTime64(3, 'UTC')} AND source_topic = {topic:String}) AS as_of,
            least(as_of, {clock:DateTime64(3, 'UTC')}) - toIntervalMillisecond({windowMs:UInt32}) AS since,
       -- Each key's own networks (/24, /64) detection vouched for before the window: its requests from
       -- them are left out, as the engine's failedFrom leaves them out (a deleted key still set where it worked).
       own_networks AS (
         SELECT network, merchant_id, api_key_id FROM ${this.tables.keyVouchedNetworks1d}
          WHERE day >= toDate(since) - 8 AND source_topic = {topic:String}
          GROUP BY network, merchant_id, api_key_id
         HAVING min(vouched_at) < since
       ),
       failing AS (
         SELECT ${SPRAY_NETWORK_OF('network')} AS spray_network, merchant_id, api_key_id, source_partition AS partition, max(last_failure) AS newest_at
           FROM ${this.tables.networkAuthFailures1m}
          WHERE as_of >= {notBefore:DateTime64(3, 'UTC')}
            AND minute >= toStartOfMinute(since) AND minute <= {until:DateTime64(3, 'UTC')}
            AND source_topic = {topic:String}
            AND (empty({plans:Array(String)}) OR has({plans:Array(String)}, toString(plan)))
            AND (network, merchant_id, api_key_id) NOT IN (SELECT network, merchant_id, api_key_id FROM own_networks)
          GROUP BY spray_network, merchant_id, api_key_id, partition
         HAVING newest_at >= since AND min(first_failure) <= {until:DateTime64(3, 'UTC')}
       ),
       sprayed AS (
         SELECT spray_network, merchant_id, api_key_id FROM failing
          WHERE spray_network IN (
            SELECT spray_network FROM failing GROUP BY spray_network
            HAVING uniqExact(merchant_id, api_key_id) >= {minKeys:UInt32} AND countIf(NOT has({owned:Array(Int32)}, partition)) > 0)
          ORDER BY newest_at DESC, spray_network, merchant_id, api_key_id
          LIMIT {keysPerNetwork:UInt32} BY spray_network
          LIMIT {maxKeys:UInt32}
       ),
       -- Live keys, by any of their requests in the window from any network (as detection holds a key live once an event says so).
       live_keys AS (
         SELECT DISTINCT merchant_id, api_key_id FROM ${this.tables.requestEvents}
          WHERE (merchant_id, api_key_id) IN (SELECT merchant_id, api_key_id FROM sprayed)
            AND ts >= since AND ts <= {until:DateTime64(3, 'UTC')} AND source_topic = {topic:String} AND environment = 'live'
       )
       SELECT merchant_id, api_key_id, source_partition AS partition, ${SPRAY_NETWORK_OF('ip')} AS spray_network, toString(ip) AS address, user_agent,
              countIf(status = 401) AS failures, countIf(status NOT IN (403, 429) AND status < 500) AS judged,
              toUnixTimestamp64Milli(minIf(ts, status = 401)) AS first, toUnixTimestamp64Milli(maxIf(ts, status = 401)) AS newest,
              argMaxIf(event_id, ts, status = 401) AS event_id, argMaxIf(toString(country), ts, status = 401) AS country,
              argMax(toString(plan), ts) AS newest_plan, (merchant_id, api_key_id) IN (SELECT merchant_id, api_key_id FROM live_keys) AS key_live,
              count() OVER key AS key_rows, sum(failures) OVER key AS key_failures, sum(judged) OVER key AS key_judged
         FROM ${this.tables.requestEvents}
        -- (merchant, key) first: the primary key's prefix, so only those keys' granules are read.
        WHERE (merchant_id, api_key_id) IN (SELECT merchant_id, api_key_id FROM sprayed)
          AND ts >= since AND ts <= {until:DateTime64(3, 'UTC')} AND source_topic = {topic:String}
          AND (empty({plans:Array(String)}) OR has({plans:Array(String)}, toString(plan)))
          AND (spray_network, merchant_id, api_key_id) IN (SELECT spray_network, merchant_id, api_key_id FROM sprayed)
          AND (${KEY_NETWORK_OF('ip')}, merchant_id, api_key_id) NOT IN (SELECT network, merchant_id, api_key_id FROM own_networks)
        GROUP BY merchant_id, api_key_id, source_partition, ip, user_agent
       WINDOW key AS (PARTITION BY merchant_id, api_key_id, spray_network)
        ORDER BY merchant_id, api_key_id, spray_network, newest DESC, judged DESC, address, user_agent
        LIMIT {rowsPerKey:UInt32} BY merchant_id, api_key_id, spray_network`,
      {
        notBefore: toClickHouseTime(query.notBefore.getTime()),
        clock: toClickHouseTime(query.clock.getTime()),
        until: toClickHouseTime(query.until.getTime()),
        windowMs: query.windowMs,
        topic: query.topic,
        owned: [...query.owned],
        minKeys: query.minKeys,
        plans: query.plans ?? [],
        keysPerNetwork: query.keysPerNetwork,
        maxKeys: query.maxKeys,
        rowsPerKey: query.rowsPerKey,
      },
    );
    return rows.map((raw) => {
      const row = sprayedRequestsRow.parse(raw);
      const ip = fromStoredIp(row.address);
      return {
        network: sprayNetworkOf(networkOf(ip)),
        merchantId: row.merchant_id,
        apiKeyId: row.api_key_id,
        partition: row.partition,
        ip,
        userAgent: row.user_agent,
        failures: row.failures,
        judged: row.judged,
        first: row.first,
        newest: row.newest,
        newestEventId: row.event_id,
        country: row.country === '' ? undefined : row.country,
        plan: row.newest_plan,
        keyRows: row.key_rows,
        keyFailures: row.key_failures,
        keyJudged: row.key_judged,
        keyLive: row.key_live > 0,
      };
    });
  }
}

/** IPv4 is stored IPv4-mapped; give it back in the form it arrived in. */
function fromStoredIp(ip: string): string {
  return ip.startsWith('::ffff:') && ip.includes('.') ? ip.slice(7) : ip;
}

function toRequestEvent(row: StoredEvent): RequestEvent {
  const event: RequestEvent = {
    eventId: row.event_id,
    timestamp: Date.parse(`${row.ts.replace(' ', 'T')}Z`),
    merchantId: row.merchant_id,
    plan: row.plan as Plan,
    apiKeyId: row.api_key_id,
    environment: row.environment as RequestEvent['environment'],
    ip: fromStoredIp(row.ip),
    userAgent: row.user_agent,
    method: row.method,
    path: row.path,
    status: row.status,
    responseTimeMs: row.response_time_ms,
  };
  // 0 is "carried none" (rows stored before migration 014 hold the plan's default, 60, instead).
  if (row.rate_limit_per_minute > 0) event.rateLimitPerMinute = row.rate_limit_per_minute;
  if (row.country) event.country = row.country;
  return event;
}
