/**
 * Enforcement decisions as they started and ended (migration 008), so admins can see what enforcing
 * did, or in shadow mode would have done, before and after they turn it on. Every replica writes the
 * same decisions; the table's aggregation collapses them (the earliest start, the latest start and
 * end), and reads aggregate again, so they never depend on merges having run.
 */
import { z } from 'zod';
import { ENFORCEMENT_ACTIONS, type EnforcementAction } from '../enforcement/decisions.ts';
import type { ClickHouse } from './clickhouse.ts';
import { clickHouseTimeToIso, toClickHouseTime } from './event-store.ts';
import type { Tables } from './tables.ts';

export const ENFORCEMENT_MODES = ['shadow', 'enforce'] as const;
export type EnforcementMode = (typeof ENFORCEMENT_MODES)[number];

/** What a decision's records and its history entry share: one key, one alert, one action, in one mode, and why. */
interface DecisionIdentity {
  merchantId: string;
  apiKeyId: string;
  alertId: string;
  action: EnforcementAction;
  mode: EnforcementMode;
  reason: string;
}

/** One replica's sight of a decision starting (endedAt null) or ending. */
export interface DecisionRecord extends DecisionIdentity {
  /** Epoch ms: when this replica saw the decision start (or first saw it, after its own start). */
  startedAt: number;
  /** Epoch ms: when this replica saw it end; null for a start. */
  endedAt: number | null;
  /** ISO 8601: when it was due to lapse without new evidence. */
  expiresAt: string;
}

/** A decision's history, as every replica saw it. */
export interface DecisionHistoryEntry extends DecisionIdentity {
  /** When it first started. */
  startedAt: string;
  /** When it last ended (at its expiry, when it lapsed while no replica ran); null while it is in force. */
  endedAt: string | null;
  /** When it was due to lapse, as last recorded (new evidence extends a live decision beyond this). */
  expiresAt: string;
}

/**
 * Where a page of the history ends: its last entry's place in the list's order (started_at
 * descending, then merchant, key, alert, action and mode), which identifies the entry.
 */
export interface HistoryPosition {
  /** Epoch ms. */
  startedAt: number;
  merchantId: string;
  apiKeyId: string;
  alertId: string;
  action: EnforcementAction;
  mode: EnforcementMode;
}

export interface HistoryFilter {
  /** Decisions in force at some time in [from, to]: started by `to`, not ended before `from`. */
  from: Date;
  to: Date;
  /** Epoch ms: the clock that tells a decision lapsed unseen (EXPIRY_RECORD_STEP_MS); tests move it. */
  now?: number;
  merchantId?: string;
  apiKeyId?: string;
  /** Only the entries after this one in the list's order (the next page). */
  after?: HistoryPosition;
  limit: number;
}

const COLUMNS = ['merchant_id', 'api_key_id', 'alert_id', 'action', 'mode', 'reason', 'latest_reason', 'first_started_at', 'last_started_at', 'last_ended_at', 'expires_at'] as const;

/** last_ended_at of a row that records no end. */
const NO_END = 0;

/**
 * A live decision's expiry moves with its alert's evidence: the source records it again each time it
 * has moved this far past the expiry last recorded (decision-source.ts). So a decision with no end
 * recorded since its last start, whose recorded expiry is more than this in the past, lapsed unseen
 * (no replica ran then): its end is that expiry.
 */
export const EXPIRY_RECORD_STEP_MS = 60_000;

const historyRow = z.object({
  merchant_id: z.string(),
  api_key_id: z.string(),
  alert_id: z.string(),
  action: z.enum(ENFORCEMENT_ACTIONS),
  mode: z.enum(ENFORCEMENT_MODES),
  reason: z.string(),
  started_at: z.string(),
  ended_at: z.string().nullable(),
  expires_at: z.string(),
});

export class EnforcementHistoryStore {
  constructor(
    private readonly db: ClickHouse,
    private readonly tables: Tables,
  ) {}

  async record(records: readonly DecisionRecord[]): Promise<void> {
    if (records.length === 0) return;
    const lines = records.map((record) => {
      const lastEndedAt = toClickHouseTime(record.endedAt ?? NO_END);
      const expiresAt = toClickHouseTime(Date.parse(record.expiresAt));
      return JSON.stringify({
        merchant_id: record.merchantId,
        api_key_id: record.apiKeyId,
        alert_id: record.alertId,
        action: record.action,
        mode: record.mode,
        reason: record.reason,
        latest_reason: [expiresAt, lastEndedAt, record.reason],
        first_started_at: toClickHouseTime(record.startedAt),
        last_started_at: toClickHouseTime(record.startedAt),
        last_ended_at: lastEndedAt,
        expires_at: expiresAt,
      });
    });
    await this.db.insert(this.tables.enforcementHistory, COLUMNS, Buffer.from(`${lines.join('\n')}\n`), 'JSONEachRow');
  }

  /**
   * Decisions in force at some time in the range, the latest started first (ties in merchant, key,
   * alert, action and mode order), from after `filter.after` on. Decisions that start while an
   * admin pages sort before the first page, so paging neither repeats nor misses an entry; the rare
   * exception: a replica that writes an earlier start of a decision late moves its entry down, and
   * the entry may then show twice. The reason is its latest record's (by expiry, then end: migration
   * 019), not the one written last: a replica's retried write may bring an older reason after a newer one.
   */
  async list(filter: HistoryFilter): Promise<DecisionHistoryEntry[]> {
    const after = filter.after;
    const rows = await this.db.queryRows(
      `SELECT merchant_id, api_key_id, alert_id, action, mode, reason, started_at,
              multiIf(last_ended >= last_started, last_ended,
                      expires_at < {lapsedBefore:DateTime64(3, 'UTC')}, expires_at,
                      NULL) AS ended_at,
              expires_at
         FROM (
           SELECT merchant_id, api_key_id, toString(alert_id) AS alert_id, action, mode, tupleElement(max(latest_reason), 3) AS reason,
                  min(first_started_at) AS started_at, max(last_started_at) AS last_started,
                  max(last_ended_at) AS last_ended, max(expires_at) AS expires_at
             FROM ${this.tables.enforcementHistory}
            WHERE ({merchantId:String} = '' OR merchant_id = {merchantId:String})
              AND ({apiKeyId:String} = '' OR api_key_id = {apiKeyId:String})
            GROUP BY merchant_id, api_key_id, alert_id, action, mode)
        WHERE started_at <= {to:DateTime64(3, 'UTC')}
          AND (ended_at IS NULL OR ended_at >= {from:DateTime64(3, 'UTC')})
          AND ({paged:Bool} = false
               OR started_at < {afterStarted:DateTime64(3, 'UTC')}
               OR (started_at = {afterStarted:DateTime64(3, 'UTC')}
                   AND (merchant_id, api_key_id, alert_id, action, mode)
                     > ({afterMerchant:String}, {afterKey:String}, {afterAlert:String}, {afterAction:String}, {afterMode:String})))
        ORDER BY started_at DESC, merchant_id, api_key_id, alert_id, action, mode
        LIMIT {limit:UInt32}`,
      {
        merchantId: filter.merchantId ?? '',
        apiKeyId: filter.apiKeyId ?? '',
        from: toClickHouseTime(filter.from.getTime()),
        to: toClickHouseTime(filter.to.getTime()),
        lapsedBefore: toClickHouseTime((filter.now ?? Date.now()) - EXPIRY_RECORD_STEP_MS),
        limit: filter.limit,
        paged: after !== undefined,
        afterStarted: toClickHouseTime(after?.startedAt ?? 0),
        afterMerchant: after?.merchantId ?? '',
        afterKey: after?.apiKeyId ?? '',
        afterAlert: after?.alertId ?? '',
        afterAction: after?.action ?? '',
        afterMode: after?.mode ?? '',
      },
    );
    return rows.map((raw) => {
      const row = historyRow.parse(raw);
      return {
        merchantId: row.merchant_id,
        apiKeyId: row.api_key_id,
        alertId: row.alert_id,
        action: row.action,
        mode: row.mode,
        reason: row.reason,
        startedAt: clickHouseTimeToIso(row.started_at),
        endedAt: row.ended_at === null ? null : clickHouseTimeToIso(row.ended_at),
        expiresAt: clickHouseTimeToIso(row.expires_at),
      };
    });
  }
}
