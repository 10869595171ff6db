/**
 * The enforcement decisions this replica serves to the fleet: every key's decision, derived from the
 * alerts in storage (which every replica shares, so any replica answers for all keys) and refreshed
 * every `refreshMs`. Answers come from memory, never wait for storage, and never serve what is
 * stale: when storage has not answered for `staleAfterMs`, there is no answer (the fleet then lets
 * traffic through, contracts section 5).
 *
 * Decisions are recorded as they change: each one that starts, changes action or ends is logged
 * and written to the history (in `shadow` mode too, where nothing is applied: that record is what
 * enforcing would have done); so is one whose alert changed severity while its action stayed (a
 * throttle whose alert escalated to critical under the block risk threshold), with its new reason.
 * Every replica derives the same decisions, so every replica logs them; the history collapses their
 * identical writes. Writing the history never holds up the decisions:
 * a failed write is kept (up to a bound) and tried again after the next read.
 */
import type { DetectionConfig } from '../detect/detection-config.ts';
import type { Logger } from '../logger.ts';
import type { WorkerMetrics } from '../metrics.ts';
import { EXPIRY_RECORD_STEP_MS, type DecisionRecord } from '../store/enforcement-history-store.ts';
import { alertDecisions, strongestPerKey, type EnforceableAlert, type EnforcementDecision, type EnforcementPolicy } from './decisions.ts';

export interface DecisionSnapshot {
  /** When storage was read for these decisions. */
  generatedAt: number;
  /** After this, the decisions must not be applied (the fleet lets traffic through). */
  staleAfter: number;
  decisions: EnforcementDecision[];
}

export interface DecisionSourceOptions {
  mode: 'shadow' | 'enforce';
  policy: EnforcementPolicy;
  /** Alerts that may decide: open or acknowledged, recommending rate_limit or block, last seen at or after `since`. */
  readAlerts(since: Date): Promise<EnforceableAlert[]>;
  /** The current allowlists (reloaded without a restart). */
  config(): DetectionConfig;
  /** Where decisions that start and end are written (EnforcementHistoryStore.record); none: only logged. */
  writeHistory?: (records: DecisionRecord[]) => Promise<void>;
  metrics: WorkerMetrics;
  logger: Logger;
  refreshMs?: number;
  staleAfterMs?: number;
  now?: () => number;
}

const REFRESH_MS = 2_000;
const STALE_AFTER_MS = 30_000;
/** History records kept while writing them fails; the oldest go first. */
const MAX_UNWRITTEN = 10_000;

export class DecisionSource {
  private snapshot: DecisionSnapshot | undefined;
  /** Every alert's decision as of the snapshot: when a key's strongest expires before the next read, the next strongest takes its place. */
  private candidates: EnforcementDecision[] = [];
  private timer: NodeJS.Timeout | undefined;
  private refreshing: Promise<void> | undefined;
  private failing = false;
  /** When this replica saw each key's current decision start, by keyOf. */
  private readonly startedAt = new Map<string, number>();
  /** Per key with a decision in force: the expiry its history last recorded (epoch ms). */
  private readonly recordedExpiry = new Map<string, number>();
  private unwritten: DecisionRecord[] = [];
  /** The severity of each alert of the last read (those behind decisions among them), by alert id. */
  private severities = new Map<string, EnforceableAlert['severity']>();
  private writing: Promise<void> | undefined;
  private historyFailing = false;
  private readonly now: () => number;
  private readonly staleAfterMs: number;

  constructor(private readonly options: DecisionSourceOptions) {
    this.now = options.now ?? Date.now;
    this.staleAfterMs = options.staleAfterMs ?? STALE_AFTER_MS;
    options.metrics.reportEnforcementDecisions(() => this.current());
  }

  get mode(): 'shadow' | 'enforce' {
    return this.options.mode;
  }

  /** Reads the decisions now, then every refreshMs. */
  start(): void {
    void this.refresh();
    this.timer = setInterval(() => void this.refresh(), this.options.refreshMs ?? REFRESH_MS);
    this.timer.unref();
  }

  /**
   * Stops reading. What the replica knows that its history lacks is written once more (main.ts bounds
   * the wait): the decisions that lapsed since the last read, records queued behind a write in
   * flight, and those kept after a failed write. Otherwise each would stay "in force" in the history.
   */
  async stop(): Promise<void> {
    clearInterval(this.timer);
    await this.refreshing;
    const snapshot = this.snapshot;
    const current = this.current();
    if (snapshot !== undefined && current !== undefined && current !== snapshot) {
      this.record(current.decisions, this.now());
      this.snapshot = { ...snapshot, decisions: current.decisions };
    }
    await this.writing;
    await this.writeHistory();
  }

  /** The decisions as of the last read, without those expired since; undefined when there is none or it is stale. */
  current(): DecisionSnapshot | undefined {
    const snapshot = this.snapshot;
    const now = this.now();
    if (snapshot === undefined || now > snapshot.staleAfter) return undefined;
    if (snapshot.decisions.every((decision) => isLive(decision, now))) return snapshot;
    return { ...snapshot, decisions: strongestPerKey(this.candidates.filter((decision) => isLive(decision, now))) };
  }

  /** One read of storage (a read still running is waited for, not doubled); never rejects. */
  refresh(): Promise<void> {
    this.refreshing ??= this.read().finally(() => (this.refreshing = undefined));
    return this.refreshing;
  }

  private async read(): Promise<void> {
    const startedAt = this.now();
    try {
      const alerts = await this.options.readAlerts(new Date(startedAt - this.options.policy.ttlMs));
      const candidates = alertDecisions(alerts, this.options.policy, this.options.config(), startedAt);
      const decisions = strongestPerKey(candidates);
      const severities = new Map(alerts.map((alert) => [alert.id, alert.severity]));
      this.record(decisions, startedAt, severities);
      this.severities = severities;
      this.snapshot = { generatedAt: startedAt, staleAfter: startedAt + this.staleAfterMs, decisions };
      this.candidates = candidates;
      if (this.failing) this.options.logger.info('enforcement decisions can be read again');
      this.failing = false;
      this.writing ??= this.writeHistory().finally(() => (this.writing = undefined));
    } catch (error) {
      if (!this.failing) this.options.logger.warn({ err: error }, `reading enforcement decisions failed; they are served until ${this.staleAfterMs / 1000} s old, then none (the fleet lets traffic through)`);
      this.failing = true;
    }
  }

  /**
   * Logs the decisions that started, changed action, changed severity (`severities`: of each alert
   * now; undefined, at stop: unchanged) or ended since the last read, and queues them for the history.
   */
  private record(decisions: readonly EnforcementDecision[], now: number, severities = this.severities): void {
    const { logger, mode } = this.options;
    const before = new Map((this.snapshot?.decisions ?? []).map((decision) => [keyOf(decision), decision]));
    // A decision seen to end now may have ended earlier: at its expiry, or (after failed reads) when
    // the last answer went stale and nothing was served any more.
    const servedUntil = Math.min(now, this.snapshot?.staleAfter ?? now);
    const endOf = (decision: EnforcementDecision) => Math.min(servedUntil, Date.parse(decision.expiresAt));
    for (const decision of decisions) {
      const key = keyOf(decision);
      const known = before.get(key);
      before.delete(key);
      if (known?.action === decision.action && known.alertId === decision.alertId) {
        const severity = severities.get(decision.alertId);
        const previousSeverity = this.severities.get(decision.alertId);
        if (severity !== previousSeverity) {
          // The same action for another reason: the history shows the reason of its latest record (the latest expiry).
          logger.info({ mode, apiKeyId: decision.apiKeyId, merchantId: decision.merchantId, alertId: decision.alertId, action: decision.action, reason: decision.reason, severity, previousSeverity }, `enforcement decision kept: its alert is now ${severity}`);
          this.queue(decision, null);
          continue;
        }
        // New evidence extends it: recorded again once it has moved a step, so that the history can
        // tell a decision still in force from one that lapsed while no replica ran.
        if (Date.parse(decision.expiresAt) - (this.recordedExpiry.get(key) ?? 0) >= EXPIRY_RECORD_STEP_MS) this.queue(decision, null);
        continue;
      }
      const { exemptIps: _exemptIps, ...logged } = decision;
      logger.info({ mode, ...logged, previous: known?.action }, mode === 'enforce' ? `enforcement: ${decision.action} key` : `enforcement (shadow, not applied): would ${decision.action} key`);
      // A change of action or alert ends one decision and starts another.
      if (known) this.queue(known, endOf(known));
      this.startedAt.set(key, now);
      this.queue(decision, null);
    }
    for (const ended of before.values()) {
      logger.info({ mode, apiKeyId: ended.apiKeyId, merchantId: ended.merchantId, alertId: ended.alertId, action: ended.action }, 'enforcement decision ended');
      this.queue(ended, endOf(ended));
      this.startedAt.delete(keyOf(ended));
    }
  }

  private queue(decision: EnforcementDecision, endedAt: number | null): void {
    if (this.options.writeHistory === undefined) return;
    const { apiKeyId, merchantId, alertId, action, reason, expiresAt } = decision;
    const startedAt = this.startedAt.get(keyOf(decision)) ?? endedAt ?? this.now();
    if (endedAt === null) this.recordedExpiry.set(keyOf(decision), Date.parse(expiresAt));
    else this.recordedExpiry.delete(keyOf(decision));
    this.unwritten.push({ merchantId, apiKeyId, alertId, action, mode: this.options.mode, reason, startedAt, endedAt, expiresAt });
    if (this.unwritten.length > MAX_UNWRITTEN) this.unwritten.splice(0, this.unwritten.length - MAX_UNWRITTEN);
  }

  /** Writes the queued history records; on failure keeps them for the next try. Never rejects. */
  private async writeHistory(): Promise<void> {
    const records = this.unwritten;
    if (records.length === 0 || this.options.writeHistory === undefined) return;
    this.unwritten = [];
    try {
      await this.options.writeHistory(records);
      if (this.historyFailing) this.options.logger.info('enforcement history can be written again');
      this.historyFailing = false;
    } catch (error) {
      if (!this.historyFailing) this.options.logger.warn({ err: error }, `writing enforcement history failed; its records are kept (up to ${MAX_UNWRITTEN}) and written after the next read`);
      this.historyFailing = true;
      this.unwritten = [...records, ...this.unwritten].slice(-MAX_UNWRITTEN);
    }
  }
}

function isLive(decision: EnforcementDecision, now: number): boolean {
  return Date.parse(decision.expiresAt) > now;
}

function keyOf(decision: EnforcementDecision): string {
  return `${decision.merchantId}\u0000${decision.apiKeyId}`;
}
