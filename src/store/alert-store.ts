/**
 * Alerts in ClickHouse. Every save writes the whole alert with a higher version (see save); reads
 * take the latest (FINAL, or the highest version per id). Contract: every read is scoped by
 * merchant unless the caller is the engine loading its own state, or a replica learning what the
 * others wrote.
 * The reads every replica repeats in the background (changedSince, enforceable) pick their ids with
 * a narrow scan first and take the latest version of only those: FINAL on an id filter still merges
 * every part of the table (`npm run bench:admin`, 1M alerts: 236-250 ms and 87-93 ms a read with
 * FINAL, 72 ms and 60 ms so).
 */
import { z } from 'zod';
import type { Alert, HistoryEntry } from '../alerts/alert.ts';
import type { EnforceableAlert } from '../enforcement/decisions.ts';
import type { ClickHouse } from './clickhouse.ts';
import { clickHouseTimeToIso, toClickHouseTime } from './event-store.ts';
import type { Tables } from './tables.ts';

const COLUMNS = [
  'id', 'merchant_id', 'api_key_id', 'type', 'scope', 'severity', 'risk_score', 'recommended_action', 'status', 'title',
  'summary', 'evidence', 'rule_id', 'rule_version', 'first_seen_at', 'last_seen_at', 'action_seen_at', 'block_seen_at', 'occurrences', 'created_at',
  'updated_at', 'history', 'ai_insights', 'version',
] as const;

const alertRow = z.object({
  id: z.string(),
  merchant_id: z.string(),
  api_key_id: z.string().nullable(),
  type: z.string(),
  scope: z.string(),
  severity: z.string(),
  risk_score: z.coerce.number(),
  recommended_action: z.string(),
  status: z.string(),
  title: z.string(),
  summary: z.string(),
  evidence: z.string(),
  rule_id: z.string(),
  rule_version: z.string(),
  first_seen_at: z.string(),
  last_seen_at: z.string(),
  action_seen_at: z.string().nullable(),
  block_seen_at: z.string().nullable(),
  occurrences: z.coerce.number(),
  created_at: z.string(),
  updated_at: z.string(),
  history: z.string(),
  ai_insights: z.array(z.string()),
});

/** A row with its version, for a write that must replace it (see save). */
const storedRow = alertRow.extend({ version: z.coerce.number() });

/** An alert as stored, with the version of its row. */
export interface StoredAlert {
  alert: Alert;
  version: number;
}

/** The columns enforcement reads (EnforceableAlert). */
const enforceableRow = alertRow.pick({
  id: true,
  merchant_id: true,
  api_key_id: true,
  type: true,
  severity: true,
  risk_score: true,
  recommended_action: true,
  status: true,
  title: true,
  last_seen_at: true,
  action_seen_at: true,
  block_seen_at: true,
});

/** A stored history; entries stored before every entry carried its note read with `note: null`. */
function historyOf(json: string): HistoryEntry[] {
  const entries = JSON.parse(json) as (Omit<HistoryEntry, 'note'> & { note?: string | null })[];
  return entries.map((entry) => ({ ...entry, note: entry.note ?? null }));
}

function enforceableFromRow(row: z.output<typeof enforceableRow>): EnforceableAlert {
  return {
    id: row.id,
    merchantId: row.merchant_id,
    apiKeyId: row.api_key_id,
    type: row.type as Alert['type'],
    severity: row.severity as Alert['severity'],
    riskScore: Math.round(row.risk_score * 1000) / 1000,
    recommendedAction: row.recommended_action as Alert['recommendedAction'],
    status: row.status as Alert['status'],
    title: row.title,
    lastSeenAt: clickHouseTimeToIso(row.last_seen_at),
    ...(row.action_seen_at === null ? {} : { actionSeenAt: clickHouseTimeToIso(row.action_seen_at) }),
    ...(row.block_seen_at === null ? {} : { blockSeenAt: clickHouseTimeToIso(row.block_seen_at) }),
  };
}

function fromRow(row: z.output<typeof alertRow>): Alert {
  return {
    ...enforceableFromRow(row),
    scope: row.scope,
    summary: row.summary,
    evidence: JSON.parse(row.evidence) as Record<string, unknown>,
    ruleId: row.rule_id,
    ruleVersion: row.rule_version,
    firstSeenAt: clickHouseTimeToIso(row.first_seen_at),
    occurrences: row.occurrences,
    createdAt: clickHouseTimeToIso(row.created_at),
    updatedAt: clickHouseTimeToIso(row.updated_at),
    history: historyOf(row.history),
    ...(row.ai_insights.length > 0 ? { aiInsights: row.ai_insights } : {}),
  };
}

function storedFromRow(raw: unknown): StoredAlert {
  const { version, ...row } = storedRow.parse(raw);
  return { alert: fromRow(row), version };
}

export class AlertStore {
  /** The last version this store wrote. */
  private version: number;

  constructor(
    private readonly db: ClickHouse,
    private readonly tables: Tables,
    /** This replica's clock (tests give replicas clocks apart). */
    private readonly now: () => number = Date.now,
  ) {
    this.version = now() * 1000;
  }

  /**
   * Writes whole alerts. Each row's version is above every version this store wrote before and, for
   * an alert made from a stored copy (`over`: id -> the version that copy was read with, see
   * getMany), above that copy's: so a write replaces the copy it was made from, whatever the clocks
   * of the replicas that wrote the two (replicas' clocks differ by seconds; with the clock alone, a
   * replica whose clock is behind lost every write, an admin's change too, to one ahead). The clock
   * (in µs) is only a floor, which keeps versions growing across restarts. Two writes made from the
   * same copy, at the same time, on two replicas still land in either order, except for an admin's
   * change (`change`), which is a compare-and-set: see saveChange.
   */
  async save(alerts: readonly Alert[], over?: ReadonlyMap<string, number>, change?: { decidedOn: number }): Promise<void> {
    if (alerts.length === 0) return;
    if (change) return this.saveChange(alerts, change.decidedOn);
    const lines = alerts.map((alert) => this.line(alert, (this.version = Math.max(this.version + 1, this.now() * 1000, (over?.get(alert.id) ?? 0) + 1))));
    await this.db.insert(this.tables.alerts, COLUMNS, Buffer.from(`${lines.join('\n')}\n`), 'JSONEachRow');
  }

  /**
   * An admin's change of one alert, decided on its stored copy of version `decidedOn`: it stands only
   * if no other change decided on that copy was stored before it, and no other write landed over that
   * copy since it was read. Its insert carries the insert_deduplication_token
   * `status:<id>:<decidedOn>`, and the table keeps the tokens of its latest blocks
   * (non_replicated_deduplication_window, migration 013; a replicated table keeps them in Keeper), so
   * of two changes decided on the same copy the one that lands second is dropped, whenever it lands,
   * though its insert succeeds. Its version is
   * decidedOn + 1, not floored by the clock: a write that landed over the copy since it was read (a
   * detection update, with a clock-based version) stands over it. Either way the change is missing
   * from what a read finds: the caller reads the alert back to know whether its change stands.
   */
  private async saveChange(alerts: readonly Alert[], decidedOn: number): Promise<void> {
    const [alert] = alerts;
    if (alerts.length !== 1 || !alert) throw new Error('an admin\'s change writes one alert');
    await this.db.insert(this.tables.alerts, COLUMNS, Buffer.from(`${this.line(alert, decidedOn + 1)}\n`), 'JSONEachRow', {
      insert_deduplicate: 1, // the default, here whatever a server's profile says: without it no change is ever dropped
      insert_deduplication_token: `status:${alert.id}:${decidedOn}`,
    });
  }

  /** One alert as a JSONEachRow line. */
  private line(alert: Alert, version: number): string {
    return JSON.stringify({
      id: alert.id,
      merchant_id: alert.merchantId,
      api_key_id: alert.apiKeyId,
      type: alert.type,
      scope: alert.scope,
      severity: alert.severity,
      risk_score: alert.riskScore,
      recommended_action: alert.recommendedAction,
      status: alert.status,
      title: alert.title,
      summary: alert.summary,
      evidence: JSON.stringify(alert.evidence),
      rule_id: alert.ruleId,
      rule_version: alert.ruleVersion,
      first_seen_at: toClickHouseTime(Date.parse(alert.firstSeenAt)),
      last_seen_at: toClickHouseTime(Date.parse(alert.lastSeenAt)),
      action_seen_at: alert.actionSeenAt === undefined ? null : toClickHouseTime(Date.parse(alert.actionSeenAt)),
      block_seen_at: alert.blockSeenAt === undefined ? null : toClickHouseTime(Date.parse(alert.blockSeenAt)),
      occurrences: alert.occurrences,
      created_at: toClickHouseTime(Date.parse(alert.createdAt)),
      updated_at: toClickHouseTime(Date.parse(alert.updatedAt)),
      history: JSON.stringify(alert.history),
      ai_insights: alert.aiInsights ?? [],
      version,
    });
  }

  /** Alerts the engine must know at start: not closed, or closed recently enough to matter for dedup. */
  async loadForDedup(since: Date): Promise<Alert[]> {
    const rows = await this.db.queryRows(
      `SELECT * EXCEPT version FROM ${this.tables.alerts} FINAL
        WHERE status IN ('open', 'acknowledged') OR updated_at >= {since:DateTime64(3, 'UTC')}`,
      { since: toClickHouseTime(since.getTime()) },
    );
    return rows.map((row) => fromRow(alertRow.parse(row)));
  }

  /**
   * Alerts that may decide enforcement (every merchant's): open or acknowledged, about a key,
   * recommending rate_limit or block, with evidence seen at or after `since`.
   */
  async enforceable(since: Date): Promise<EnforceableAlert[]> {
    // Any version seen since then recommending rate_limit or block names the candidates; their
    // latest versions decide (one that moved on to resolved or monitor drops out here).
    const rows = await this.db.queryRows(
      `SELECT id, latest.1 AS merchant_id, latest.2 AS api_key_id, latest.3 AS type, latest.4 AS severity, latest.5 AS risk_score,
              latest.6 AS recommended_action, latest.7 AS status, latest.8 AS title, latest.9 AS last_seen_at, latest.10 AS action_seen_at,
              latest.11 AS block_seen_at
         FROM (
           SELECT id, argMax((merchant_id, api_key_id, type, severity, risk_score, recommended_action, status, title, last_seen_at, action_seen_at, block_seen_at), version) AS latest
             FROM ${this.tables.alerts}
            WHERE id IN (SELECT id FROM ${this.tables.alerts}
                          WHERE last_seen_at >= {since:DateTime64(3, 'UTC')} AND recommended_action IN ('rate_limit', 'block'))
            GROUP BY id)
        WHERE status IN ('open', 'acknowledged') AND recommended_action IN ('rate_limit', 'block')
          AND api_key_id IS NOT NULL AND last_seen_at >= {since:DateTime64(3, 'UTC')}`,
      { since: toClickHouseTime(since.getTime()) },
    );
    return rows.map((row) => enforceableFromRow(enforceableRow.parse(row)));
  }

  /**
   * A page of alerts, newest first, ordered by (createdAt, id), which never change: a page that starts
   * after a cursor sees neither repeats nor gaps while new alerts arrive (they sort before page one).
   */
  async list(filter: AlertFilter = {}): Promise<Alert[]> {
    const limit = filter.limit ?? 1000;
    // A busy merchant's page is usually found among its last day of alerts: look there first, which
    // reads a fraction of the rows. Everything outside that window is older than everything in it,
    // so when the window holds a full page, that page is exactly the page of the whole range.
    const newest = filter.after?.createdAt ?? filter.to?.getTime() ?? Date.now();
    const windowStart = new Date(newest - RECENT_WINDOW_MS);
    if (!filter.from || filter.from < windowStart) {
      const recent = await this.query({ ...filter, from: windowStart }, limit);
      if (recent.length >= limit) return recent;
    }
    return this.query(filter, limit);
  }

  private async query(filter: AlertFilter, limit: number): Promise<Alert[]> {
    const { where, params } = filterClause(filter);
    const rows = await this.db.queryRows(
      `SELECT * EXCEPT version FROM ${this.tables.alerts} FINAL
        WHERE ${where}
        ORDER BY created_at DESC, id DESC
        LIMIT {limit:UInt32}`,
      { ...params, limit },
    );
    return rows.map((row) => fromRow(alertRow.parse(row)));
  }

  /** One alert, only if it belongs to the merchant (any merchant when merchantId is undefined). */
  async get(id: string, merchantId: string | undefined): Promise<Alert | undefined> {
    return (await this.getStored(id, merchantId))?.alert;
  }

  /** get, with the version of the row (for a change made from it: save's `over`). */
  async getStored(id: string, merchantId: string | undefined): Promise<StoredAlert | undefined> {
    const rows = await this.db.queryRows(
      `SELECT * FROM ${this.tables.alerts} FINAL
        WHERE id = {id:UUID} AND ({merchantId:String} = '' OR merchant_id = {merchantId:String})
        LIMIT 1`,
      { id, merchantId: merchantId ?? '' },
    );
    return rows[0] ? storedFromRow(rows[0]) : undefined;
  }

  /** The stored copies of these alerts, of any merchant, with their versions (for merging before a write). */
  async getMany(ids: readonly string[]): Promise<StoredAlert[]> {
    if (ids.length === 0) return [];
    const rows = await this.db.queryRows(`SELECT * FROM ${this.tables.alerts} FINAL WHERE id IN {ids:Array(UUID)}`, { ids });
    return rows.map(storedFromRow);
  }

  /** Alerts of any merchant written since a time, by any replica (for replicas to learn each other's changes). */
  async changedSince(since: Date): Promise<Alert[]> {
    // The ids first (one column scanned); then the latest version of only those.
    const rows = await this.db.queryRows(
      `SELECT * EXCEPT version FROM ${this.tables.alerts}
        WHERE id IN (SELECT id FROM ${this.tables.alerts} WHERE updated_at >= {since:DateTime64(3, 'UTC')})
        ORDER BY version DESC, updated_at DESC
        LIMIT 1 BY id`,
      { since: toClickHouseTime(since.getTime()) },
    );
    return rows.map((row) => fromRow(alertRow.parse(row)));
  }

  /**
   * Counts for metrics: active (open or acknowledged, whenever created) and active critical alerts,
   * and the alerts created in the range by type and by severity, [from, to) as traffic is counted:
   * ranges that meet count no alert twice.
   */
  async counts(range: { from: Date; to: Date; merchantId?: string }): Promise<AlertCounts> {
    const rows = await this.db.queryRows(
      `SELECT type, severity,
              countIf(status IN ('open', 'acknowledged')) AS active,
              countIf(created_at >= {from:DateTime64(3, 'UTC')} AND created_at < {to:DateTime64(3, 'UTC')}) AS created
         FROM ${this.tables.alerts} FINAL
        WHERE ({merchantId:String} = '' OR merchant_id = {merchantId:String})
          AND (status IN ('open', 'acknowledged') OR (created_at >= {from:DateTime64(3, 'UTC')} AND created_at < {to:DateTime64(3, 'UTC')}))
        GROUP BY type, severity`,
      rangeParams(range),
    );
    const counts: AlertCounts = { activeAlerts: 0, criticalAlerts: 0, alertsByType: {}, alertsBySeverity: {} };
    for (const row of rows.map((raw) => countRow.parse(raw))) {
      counts.activeAlerts += row.active;
      if (row.severity === 'critical') counts.criticalAlerts += row.active;
      if (row.created > 0) {
        counts.alertsByType[row.type] = (counts.alertsByType[row.type] ?? 0) + row.created;
        counts.alertsBySeverity[row.severity] = (counts.alertsBySeverity[row.severity] ?? 0) + row.created;
      }
    }
    return counts;
  }

  /** The keys with the riskiest alerts active or seen in the range, riskiest first. */
  async topKeysByRisk(range: { from: Date; to: Date; merchantId?: string; limit: number }): Promise<KeyRisk[]> {
    const rows = await this.db.queryRows(
      `SELECT merchant_id, api_key_id, max(risk_score) AS max_risk, count() AS alerts,
              countIf(status IN ('open', 'acknowledged')) AS active, argMax(type, risk_score) AS top_type
         FROM ${this.tables.alerts} FINAL
        WHERE ({merchantId:String} = '' OR merchant_id = {merchantId:String})
          AND api_key_id IS NOT NULL AND status != 'dismissed'
          AND (status IN ('open', 'acknowledged') OR last_seen_at >= {from:DateTime64(3, 'UTC')})
          AND first_seen_at <= {to:DateTime64(3, 'UTC')}
        GROUP BY merchant_id, api_key_id
        ORDER BY max_risk DESC, active DESC, api_key_id
        LIMIT {limit:UInt32}`,
      { ...rangeParams(range), limit: range.limit },
    );
    return rows.map((raw) => {
      const row = keyRiskRow.parse(raw);
      return {
        merchantId: row.merchant_id,
        apiKeyId: row.api_key_id,
        riskScore: Math.round(row.max_risk * 1000) / 1000,
        alerts: row.alerts,
        activeAlerts: row.active,
        topType: row.top_type,
      };
    });
  }

  /**
   * The riskiest alerts seen in the range (not dismissed: those are false positives), with what
   * their pattern is read from, riskiest first, at most `limit`: the dashboard's insights read these.
   */
  async riskiestSeen(range: { from: Date; to: Date; merchantId?: string; limit: number }): Promise<SeenAlert[]> {
    const rows = await this.db.queryRows(
      `SELECT merchant_id, api_key_id, scope, type, severity, evidence
         FROM ${this.tables.alerts} FINAL
        WHERE ({merchantId:String} = '' OR merchant_id = {merchantId:String})
          AND status != 'dismissed'
          AND last_seen_at >= {from:DateTime64(3, 'UTC')} AND first_seen_at <= {to:DateTime64(3, 'UTC')}
        ORDER BY risk_score DESC, last_seen_at DESC
        LIMIT {limit:UInt32}`,
      { ...rangeParams(range), limit: range.limit },
    );
    return rows.map((raw) => {
      const row = seenRow.parse(raw);
      return {
        merchantId: row.merchant_id,
        apiKeyId: row.api_key_id,
        scope: row.scope,
        type: row.type as Alert['type'],
        severity: row.severity as Alert['severity'],
        evidence: JSON.parse(row.evidence) as Record<string, unknown>,
      };
    });
  }
}

/** How far back list() looks first (see there). */
const RECENT_WINDOW_MS = 24 * 3_600_000;

export interface AlertFilter {
  /** Undefined: every merchant (the engine, or an operator). */
  merchantId?: string;
  status?: readonly string[];
  severity?: readonly string[];
  type?: readonly string[];
  recommendedAction?: readonly string[];
  apiKeyId?: string;
  /** Created at or after. */
  from?: Date;
  /** Created at or before. */
  to?: Date;
  /** Only alerts that sort after this one (older, or as old with a smaller id). */
  after?: { createdAt: number; id: string };
  limit?: number;
}

export interface AlertCounts {
  activeAlerts: number;
  criticalAlerts: number;
  alertsByType: Record<string, number>;
  alertsBySeverity: Record<string, number>;
}

export interface KeyRisk {
  merchantId: string;
  apiKeyId: string;
  riskScore: number;
  alerts: number;
  activeAlerts: number;
  topType: string;
}

/** An alert as the dashboard's insights read it. */
export type SeenAlert = Pick<Alert, 'merchantId' | 'apiKeyId' | 'scope' | 'type' | 'severity' | 'evidence'>;

const countRow = z.object({ type: z.string(), severity: z.string(), active: z.coerce.number(), created: z.coerce.number() });
const keyRiskRow = z.object({
  merchant_id: z.string(),
  api_key_id: z.string(),
  max_risk: z.coerce.number(),
  alerts: z.coerce.number(),
  active: z.coerce.number(),
  top_type: z.string(),
});

const seenRow = alertRow.pick({ merchant_id: true, api_key_id: true, scope: true, type: true, severity: true, evidence: true });

/** The bound parameters of a range query: its times, and its merchant ('' for every merchant). */
function rangeParams(range: { from: Date; to: Date; merchantId?: string }): Record<string, unknown> {
  return { from: toClickHouseTime(range.from.getTime()), to: toClickHouseTime(range.to.getTime()), merchantId: range.merchantId ?? '' };
}

/** Every filter is a bound parameter; an absent one is a condition that is always true. */
function filterClause(filter: AlertFilter): { where: string; params: Record<string, unknown> } {
  const conditions = ['1'];
  const params: Record<string, unknown> = {};
  if (filter.merchantId !== undefined) {
    conditions.push('merchant_id = {merchantId:String}');
    params.merchantId = filter.merchantId;
  }
  for (const [column, values] of [['status', filter.status], ['severity', filter.severity], ['type', filter.type], ['recommended_action', filter.recommendedAction]] as const) {
    if (values && values.length > 0) {
      conditions.push(`${column} IN {${column}:Array(String)}`);
      params[column] = values;
    }
  }
  if (filter.apiKeyId !== undefined) {
    conditions.push('api_key_id = {apiKeyId:String}');
    params.apiKeyId = filter.apiKeyId;
  }
  if (filter.from) {
    conditions.push(`created_at >= {from:DateTime64(3, 'UTC')}`);
    params.from = toClickHouseTime(filter.from.getTime());
  }
  if (filter.to) {
    conditions.push(`created_at <= {to:DateTime64(3, 'UTC')}`);
    params.to = toClickHouseTime(filter.to.getTime());
  }
  if (filter.after) {
    conditions.push(`(created_at, id) < ({afterCreatedAt:DateTime64(3, 'UTC')}, {afterId:UUID})`);
    params.afterCreatedAt = toClickHouseTime(filter.after.createdAt);
    params.afterId = filter.after.id;
  }
  return { where: conditions.join(' AND '), params };
}
