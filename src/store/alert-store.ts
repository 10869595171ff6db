/**
 * Alerts in ClickHouse. Every save writes the whole alert with a higher version; reads take the
 * latest (FINAL). Contract: every read is scoped by merchant unless the caller is the engine
 * loading its own state.
 */
import { z } from 'zod';
import type { Alert } from '../alerts/alert.ts';
import type { ClickHouse } from './clickhouse.ts';
import { toClickHouseTime } from './event-store.ts';
import type { Tables } from './tables.ts';

const COLUMNS = [
  'id', 'merchant_id', 'api_key_id', 'type', 'scope', 'severity', 'risk_score', 'recommended_action', 'status', 'title',
  'summary', 'evidence', 'rule_id', 'rule_version', 'first_seen_at', 'last_seen_at', 'occurrences', 'created_at',
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
  occurrences: z.coerce.number(),
  created_at: z.string(),
  updated_at: z.string(),
  history: z.string(),
  ai_insights: z.array(z.string()),
});

/** ClickHouse DateTime64 text ('2026-11-20 12:00:00.000', UTC) to ISO 8601. */
function toIso(text: string): string {
  return `${text.replace(' ', 'T')}Z`;
}

function fromRow(row: z.output<typeof alertRow>): Alert {
  return {
    id: row.id,
    merchantId: row.merchant_id,
    apiKeyId: row.api_key_id,
    type: row.type as Alert['type'],
    scope: row.scope,
    severity: row.severity as Alert['severity'],
    riskScore: Math.round(row.risk_score * 1000) / 1000,
    recommendedAction: row.recommended_action as Alert['recommendedAction'],
    status: row.status as Alert['status'],
    title: row.title,
    summary: row.summary,
    evidence: JSON.parse(row.evidence) as Record<string, unknown>,
    ruleId: row.rule_id,
    ruleVersion: row.rule_version,
    firstSeenAt: toIso(row.first_seen_at),
    lastSeenAt: toIso(row.last_seen_at),
    occurrences: row.occurrences,
    createdAt: toIso(row.created_at),
    updatedAt: toIso(row.updated_at),
    history: JSON.parse(row.history) as Alert['history'],
    ...(row.ai_insights.length > 0 ? { aiInsights: row.ai_insights } : {}),
  };
}

export class AlertStore {
  private version = Date.now() * 1000;

  constructor(
    private readonly db: ClickHouse,
    private readonly tables: Tables,
  ) {}

  async save(alerts: readonly Alert[]): Promise<void> {
    if (alerts.length === 0) return;
    const lines = alerts.map((alert) =>
      JSON.stringify({
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
        occurrences: alert.occurrences,
        created_at: toClickHouseTime(Date.parse(alert.createdAt)),
        updated_at: toClickHouseTime(Date.parse(alert.updatedAt)),
        history: JSON.stringify(alert.history),
        ai_insights: alert.aiInsights ?? [],
        // Monotonic across saves in this process; wall-clock based across restarts.
        version: (this.version = Math.max(this.version + 1, Date.now() * 1000)),
      }),
    );
    await this.db.insertJsonEachRow(this.tables.alerts, COLUMNS, Buffer.from(`${lines.join('\n')}\n`));
  }

  /** Alerts the engine must know at start: not closed, or closed recently enough to matter for dedup. */
  async loadForDedup(since: Date): Promise<Alert[]> {
    const rows = await this.db.queryRows(
      `SELECT * EXCEPT version FROM ${this.tables.alerts} FINAL
        WHERE status IN ('open', 'acknowledged') OR updated_at >= {since:DateTime64(3)}`,
      { since: toClickHouseTime(since.getTime()) },
    );
    return rows.map((row) => fromRow(alertRow.parse(row)));
  }

  /** Alerts of one merchant (or all when undefined), newest first. */
  async list(options: { merchantId?: string; limit?: number } = {}): Promise<Alert[]> {
    const rows = await this.db.queryRows(
      `SELECT * EXCEPT version FROM ${this.tables.alerts} FINAL
        WHERE ({merchantId:String} = '' OR merchant_id = {merchantId:String})
        ORDER BY created_at DESC, id
        LIMIT {limit:UInt32}`,
      { merchantId: options.merchantId ?? '', limit: options.limit ?? 1000 },
    );
    return rows.map((row) => fromRow(alertRow.parse(row)));
  }
}
