/**
 * Findings become alerts here. Contract: one open alert per (merchantId, type, scope); a repeat (a
 * later sighting, or the same judged more severe) raises occurrences and lastSeenAt and may raise
 * (never lower) the severity; a dismissed alert's dedup key stays quiet for the suppression period;
 * a resolved alert whose pattern recurs is reopened. Pure bookkeeping over an in-memory index: the caller persists what apply() returns.
 */
import { randomUUID } from 'node:crypto';
import { KEY_ACTIONS, type AnomalyType, type Finding, type RecommendedAction, type Severity } from '../detect/types.ts';
import { blockEarned, episode, higherSeverity, laterTime, latestEntry, mergeCopies, resolvedAsDuplicate, riskScore, severityRank, stampAfter, sprayKeptOver, strongerAction, SYSTEM_ACTOR, withoutEntry, type Alert, type AlertStatus, type HistoryEntry } from './alert.ts';
import { alertInsights, withoutInsights } from './insights.ts';

export interface RuleInfo {
  id: AnomalyType;
  version: string;
  actions: Record<Severity, RecommendedAction>;
}

/** What a finding did to its alert; 'stale': nothing, as its evidence is no newer than what the alert holds. */
export type AlertChange = 'created' | 'updated' | 'escalated' | 'reopened' | 'suppressed' | 'stale';

export interface AlertManagerOptions {
  /** How long a dismissed alert's dedup key stays quiet. */
  suppressionMs: number;
  /** FEATURE_AI_RISK_SCORING: every alert made or updated here carries insights derived from its evidence; off, none does. */
  aiInsights?: boolean;
  now?: () => number;
  newId?: () => string;
}

/**
 * How long a resolved or dismissed alert is remembered for deduplication at least (longer when the
 * suppression period is): a recurrence within it reopens the alert (or is suppressed), a later one
 * opens a new alert. Start-up loads this much (AlertService.start), and a running replica forgets
 * what is older (forgetClosed), so replicas decide alike whenever they started, in bounded memory.
 */
export const CLOSED_ALERT_MEMORY_MS = 24 * 3_600_000;

/** How long after a duplicate's resolution a replica may not have read the alert kept (a sync every 5 s, read with a minute's overlap). */
const DUPLICATE_GRACE_MS = 60_000;

/** An alert of ours that another replica's, opened for the same pattern at the same time, is kept over. */
export interface Duplicate {
  alert: Alert;
  kept: Alert;
}

export function dedupKey(merchantId: string, type: string, scope: string): string {
  return `${merchantId}\u0000${type}\u0000${scope}`;
}

export class AlertManager {
  /** The latest alert per dedup key (any status). */
  private readonly byKey = new Map<string, Alert>();
  /** The dedup keys whose alert (in byKey) this replica created. */
  private readonly createdHere = new Set<string>();
  /** Alerts of ours that sync found to be duplicates of others (`kept`), for the caller to resolve (takeDuplicates). */
  private duplicates: Duplicate[] = [];
  /** Alerts (by id) whose status change this replica is writing, and the status it moves them to. */
  private readonly changing = new Map<string, AlertStatus>();
  private readonly now: () => number;
  private readonly newId: () => string;

  constructor(private readonly options: AlertManagerOptions) {
    this.now = options.now ?? Date.now;
    this.newId = options.newId ?? randomUUID;
  }

  /** How long resolved and dismissed alerts are remembered (CLOSED_ALERT_MEMORY_MS, or the suppression period if longer). */
  get closedAlertMemoryMs(): number {
    return Math.max(this.options.suppressionMs, CLOSED_ALERT_MEMORY_MS);
  }

  /** Forgets the resolved and dismissed alerts last changed longer ago than closedAlertMemoryMs, as a start would not load them; how many. */
  forgetClosed(): number {
    const before = this.now() - this.closedAlertMemoryMs;
    let forgotten = 0;
    for (const [key, alert] of this.byKey) {
      if ((alert.status === 'resolved' || alert.status === 'dismissed') && Date.parse(alert.updatedAt) < before) {
        this.byKey.delete(key);
        this.createdHere.delete(key);
        forgotten++;
      }
    }
    return forgotten;
  }

  /**
   * Loads alerts from storage at start-up (the latest per dedup key wins). Of two open (or
   * acknowledged) for one key, the earlier is a duplicate its creator did not resolve (killed before
   * it could, see sync): this replica resolves it (takeDuplicates), as any replica starting then
   * does; their writes are compare-and-set, so one of them stands.
   */
  load(alerts: Iterable<Alert>): void {
    for (const alert of alerts) {
      const known = this.byKey.get(dedupKey(alert.merchantId, alert.type, alert.scope));
      const kept = this.sync(alert);
      if (!known || known.id === alert.id) continue;
      const earlier = kept.id === alert.id ? known : alert;
      if (earlier.status === 'open' || earlier.status === 'acknowledged') this.duplicates.push({ alert: earlier, kept });
    }
  }

  /**
   * Learns a stored alert, which another replica may have written, or an admin's change once stored
   * (so dedup sees dismissals and resolutions): an alert known here gets the lifecycle and the
   * detection fields of both copies (merge: an admin's dismissal made elsewhere silences its key here
   * too, and a copy made before our escalation does not lower it). Of two alerts for one dedup key,
   * the one created later is the key's, on every replica alike: it follows the other (opened after a
   * dismissal, or after the other was forgotten), or the two are duplicates, opened at once by two
   * replicas that each saw the pattern before reading the other's alert (a network trying the keys of
   * several replicas). The earlier duplicate, if still open or acknowledged, is resolved by the
   * replica that created it (no other writes to it: no two replicas resolve it twice, and no finding
   * of its creator's lands after the resolution), and that replica's later findings go to the other.
   * Returns the alert the key now has.
   */
  sync(stored: Alert): Alert {
    const key = dedupKey(stored.merchantId, stored.type, stored.scope);
    const known = this.byKey.get(key);
    let next = stored;
    if (known?.id === stored.id) next = this.bothCopies(known, stored);
    else if (known && createdLater(known, stored)) next = known;
    else if (known) {
      if (this.createdHere.has(key) && (known.status === 'open' || known.status === 'acknowledged')) this.duplicates.push({ alert: known, kept: stored });
      this.createdHere.delete(key);
    }
    this.byKey.set(key, next);
    return next;
  }

  /** The alerts of ours sync found to be duplicates since the last call, to be resolved (see sync and duplicateResolution). */
  takeDuplicates(): Duplicate[] {
    const duplicates = this.duplicates;
    this.duplicates = [];
    return duplicates;
  }

  /**
   * The newest state of a stored alert: detection here may have updated it since it was stored, and
   * the stored copy may carry a status change made through another replica since the last sync (our
   * copy being newer says nothing about its status). So both copies count, as in sync().
   */
  current(stored: Alert): Alert {
    const known = this.byKey.get(dedupKey(stored.merchantId, stored.type, stored.scope));
    return known?.id === stored.id ? this.bothCopies(known, stored) : stored;
  }

  /**
   * A change of ours that lost to a conflicting one stored through another replica (the stored copy
   * holds the other move out of the same status): the stored lifecycle is taken, and our entry
   * forgotten, so that no later write of ours brings it back (the history would show two moves out
   * of one status). The detection fields of both copies stay. Returns the alert the key now has.
   */
  adoptLifecycle(stored: Alert, lost: HistoryEntry): Alert {
    const key = dedupKey(stored.merchantId, stored.type, stored.scope);
    const known = this.byKey.get(key);
    if (known?.id !== stored.id) return this.sync(stored);
    const next = this.merge(withoutEntry(known, lost), stored);
    this.byKey.set(key, next);
    return next;
  }

  /**
   * One alert as two copies have it, made one (mergeCopies: the detection fields and the lifecycle of
   * both, `ours` winning ties). A copy resolved while the other, not knowing of the resolution, counted
   * evidence seen after it (the key's owner applies findings as repeats of the open alert until it
   * hears of a resolution made through another replica) is a recurrence, as apply() would have found
   * it: the alert is reopened (the system's entry, stamped after the resolution), its occurrences
   * those the resolution did not know of.
   */
  merge(ours: Alert, theirs: Alert): Alert {
    const merged = mergeCopies(ours, theirs);
    // A duplicate's resolution is no recurrence's to undo: a replica that went on counting findings
    // on it had not heard of the alert kept, where they belong.
    const resolution = merged.status === 'resolved' && !resolvedAsDuplicate(merged) ? latestEntry(merged) : undefined;
    if (!resolution) return merged;
    // Nor is an alert that a later one of its dedup key is kept over (a duplicate an admin closed
    // before its creator could, see sync): the pattern's findings go to that one.
    const current = this.byKey.get(dedupKey(merged.merchantId, merged.type, merged.scope));
    if (current && current.id !== merged.id && createdLater(current, merged)) return merged;
    const knows = (copy: Alert) => copy.history.some((entry) => entry.at === resolution.at && entry.actor === resolution.actor && entry.to === resolution.to);
    const [resolver, unaware] = knows(ours) ? [ours, theirs] : [theirs, ours];
    if (knows(unaware) || episode(unaware) !== episode(resolver)) return merged;
    if (unaware.lastSeenAt <= resolver.lastSeenAt || Date.parse(unaware.lastSeenAt) <= Date.parse(resolution.at)) return merged;
    const at = stampAfter(resolution.at, this.now());
    return this.withInsights({
      ...merged,
      status: 'open',
      occurrences: Math.max(1, unaware.occurrences - resolver.occurrences),
      updatedAt: stampAfter(merged.updatedAt, Date.parse(at)),
      history: [...merged.history, { at, actor: SYSTEM_ACTOR, from: 'resolved', to: 'open', note: 'the pattern recurred' }],
    });
  }

  /**
   * A status change this replica is writing: until it ends (changeDone), a dismissal already silences
   * the key here, as it will once stored (a finding meanwhile must not notify on-call of an alert
   * being dismissed).
   */
  changeStarted(alertId: string, to: AlertStatus): void {
    this.changing.set(alertId, to);
  }

  /** The status change is stored and learned (sync), or failed or lost: see changeStarted. */
  changeDone(alertId: string): void {
    this.changing.delete(alertId);
  }

  /** Two copies of one alert (see merge); of two copies alike, the newer's. */
  private bothCopies(a: Alert, b: Alert): Alert {
    const [newer, older] = a.updatedAt >= b.updatedAt ? [a, b] : [b, a];
    return this.merge(newer, older);
  }

  apply(merchantId: string, rule: RuleInfo, finding: Finding): { alert: Alert | undefined; change: AlertChange } {
    const key = dedupKey(merchantId, rule.id, finding.scope);
    const existing = this.byKey.get(key);
    const now = this.now();
    const nowIso = new Date(now).toISOString();

    // Rules judge a key's whole window on every batch that touches it, so the same evidence comes back
    // until it leaves the window (and again after a warm-up). It is not a repeat, nor a recurrence of
    // a resolved or dismissed pattern: only evidence seen after the alert's last sighting (or after
    // the admin's resolution or dismissal) counts.
    if (existing && this.changing.get(existing.id) === 'dismissed') return { alert: undefined, change: 'suppressed' };
    if (existing?.status === 'dismissed') {
      const dismissedAt = Date.parse(existing.updatedAt);
      if (now - dismissedAt < this.options.suppressionMs) return { alert: undefined, change: 'suppressed' };
      if (finding.lastSeenAt <= dismissedAt) return { alert: undefined, change: 'stale' };
    }
    if (existing?.status === 'resolved' && resolvedAsDuplicate(existing)) {
      // Resolved as a duplicate by the replica that opened it: this replica has not read the alert
      // kept yet (it will at its next sync), and the pattern's findings go there, not here. Long
      // after (a start that loaded the duplicate but not the alert kept, closed and forgotten by
      // then), a new alert opens.
      if (now - resolvedAt(existing) < DUPLICATE_GRACE_MS) return { alert: undefined, change: 'suppressed' };
    } else if (existing?.status === 'resolved') {
      if (finding.lastSeenAt <= resolvedAt(existing)) return { alert: undefined, change: 'stale' };
      return { alert: this.reopen(existing, rule, finding, now), change: 'reopened' };
    }
    if (existing && (existing.status === 'open' || existing.status === 'acknowledged')) {
      const severity = higherSeverity(existing.severity, finding.severity);
      const escalated = severityRank(severity) > severityRank(existing.severity);
      const rank = severityRank(finding.severity) - severityRank(existing.severity);
      const later = finding.lastSeenAt > Date.parse(existing.lastSeenAt);
      // The finding describes the alert from now on: of a higher severity, or of the same and seen
      // later, or for credential stuffing of the same and kept over the alert's (sprayKeptOver, as
      // merged copies keep it): a replica's share after the reading's whole adds its sighting only,
      // and a reading without a share's newest 401 (stored after it) may still describe it. Never
      // evidence from before a resolution the alert was reopened after: it was dealt with.
      const describes = rank > 0 || (rank === 0 && (sprayKeptOver(finding.evidence, existing.evidence) ?? later));
      const dealtWith = episode(existing) > 0 && finding.lastSeenAt <= resolvedAt(existing);
      if ((!escalated && !later && !describes) || dealtWith) return { alert: undefined, change: 'stale' };
      // The stronger of the alert's and the finding's: a repeat answered 401 (a stranger's) neither
      // lifts an action the key's holders earned nor raises it (recommendedActionFor).
      const findingAction = recommendedActionFor(rule, finding);
      const action = strongerAction(existing.recommendedAction, findingAction);
      // Nor does it raise the score within the alert's band, which decides a block (ENFORCEMENT_BLOCK_MIN_RISK).
      const byStrangers = findingAction !== rule.actions[finding.severity];
      const updated: Alert = this.withInsights({
        ...existing,
        severity,
        // The finding's confidence places it within its own severity's band: a weaker repeat's
        // confidence says nothing about where in the alert's higher band it belongs.
        riskScore: byStrangers && !escalated ? existing.riskScore : Math.max(existing.riskScore, riskScore(finding.severity, finding.confidence)),
        recommendedAction: action,
        title: describes ? finding.title : existing.title,
        summary: withActionNote(describes ? finding.summary : withoutActionNote(existing.summary), rule, severity, action),
        evidence: describes ? finding.evidence : existing.evidence,
        ruleVersion: rule.version,
        lastSeenAt: new Date(Math.max(Date.parse(existing.lastSeenAt), finding.lastSeenAt)).toISOString(),
        // Only the holders' own requests keep the key throttled or blocked (decisions.ts).
        actionSeenAt: KEY_ACTIONS.has(findingAction) ? laterTime(earnedBefore(existing), holdersSeenAt(finding)) : earnedBefore(existing),
        // And only their requests that earn a block keep it a block; the others keep a throttle.
        blockSeenAt: findingAction === 'block' ? laterTime(blockEarned(existing), holdersSeenAt(finding)) : blockEarned(existing),
        // A sighting, or the same judged more severe; a better description of what was seen is not one.
        occurrences: existing.occurrences + (later || escalated ? 1 : 0),
        // Forward only, as an admin's change (changeStatus): this copy is newer than the one it was made
        // from (sync, current) even when that one was stamped by a replica whose clock is ahead.
        updatedAt: stampAfter(existing.updatedAt, now),
      });
      this.byKey.set(key, updated);
      return { alert: updated, change: escalated ? 'escalated' : 'updated' };
    }
    // No alert yet, or a dismissal whose suppression has ended: a new alert.
    const alert: Alert = this.withInsights({
      id: this.newId(),
      merchantId,
      apiKeyId: finding.apiKeyId,
      type: rule.id,
      scope: finding.scope,
      ...describedBy(rule, finding),
      status: 'open',
      ruleId: rule.id,
      occurrences: 1,
      createdAt: nowIso,
      updatedAt: nowIso,
      history: [{ at: nowIso, actor: SYSTEM_ACTOR, from: null, to: 'open', note: 'created by detection' }],
    });
    this.byKey.set(key, alert);
    this.createdHere.add(key);
    return { alert, change: 'created' };
  }

  /**
   * A resolved alert whose pattern recurred: open again, described by the new finding alone (its
   * severity, evidence and span), since the old evidence was dealt with when it was resolved.
   */
  private reopen(existing: Alert, rule: RuleInfo, finding: Finding, now: number): Alert {
    // After the resolution it follows, whichever replica's clock stamped that (stampAfter).
    const at = stampAfter(latestEntry(existing)?.at, now);
    const reopened: Alert = this.withInsights({
      ...existing,
      ...describedBy(rule, finding),
      status: 'open',
      occurrences: 1,
      updatedAt: stampAfter(existing.updatedAt, Date.parse(at)),
      history: [...existing.history, { at, actor: SYSTEM_ACTOR, from: 'resolved', to: 'open', note: 'the pattern recurred' }],
    });
    this.byKey.set(dedupKey(existing.merchantId, existing.type, existing.scope), reopened);
    return reopened;
  }

  /**
   * Insights are derived again on every update, since its evidence may have changed; with the flag
   * off, an alert stored while it was on loses them at its next update.
   */
  private withInsights(alert: Alert): Alert {
    return this.options.aiInsights ? { ...alert, aiInsights: alertInsights(alert) } : withoutInsights(alert);
  }
}

/**
 * The action an alert recommends for a finding: its rule's for the finding's severity, but acting on
 * the key (rate_limit, block) only as far as the requests that passed authentication show it
 * (Finding.keyHolderSeverity). Anyone who knows a key's public id can send requests that are
 * answered 401; throttling or blocking the key for them would lock out its owner, and the API refuses
 * them already. Without the holders' own evidence, it is at most investigate.
 */
export function recommendedActionFor(rule: RuleInfo, finding: Finding): RecommendedAction {
  const action = rule.actions[finding.severity];
  const holder = finding.keyHolderSeverity;
  if (holder === undefined || !KEY_ACTIONS.has(action)) return action;
  const holderAction = holder === null ? 'monitor' : rule.actions[severityRank(holder) < severityRank(finding.severity) ? holder : finding.severity];
  return strongerAction(KEY_ACTIONS.has(holderAction) ? holderAction : 'monitor', 'investigate');
}

const ACTION_NOTE = ' Recommended: ';

/** A summary, saying why when the alert recommends less than its rule's action for its severity (recommendedActionFor). */
function withActionNote(summary: string, rule: RuleInfo, severity: Severity, action: RecommendedAction): string {
  const ruleAction = rule.actions[severity];
  if (strongerAction(action, ruleAction) === action) return summary;
  return (
    `${summary}${ACTION_NOTE}${action}, not ${ruleAction}: the key's requests that passed authentication do not show that much; ` +
    `the rest were answered 401, which anyone who knows the key's id can cause, so the key is not ${ruleAction === 'block' ? 'blocked' : 'throttled'} for them: that would hit its owner.`
  );
}

/** The summary without the note withActionNote added: an update says it again, for the action it leaves. */
function withoutActionNote(summary: string): string {
  const at = summary.lastIndexOf(ACTION_NOTE);
  return at < 0 ? summary : summary.slice(0, at);
}

/** When the finding's requests that passed authentication end (the 401s after them extend nothing). */
function holdersSeenAt(finding: Finding): string {
  return new Date(finding.keyHolderLastSeenAt ?? finding.lastSeenAt).toISOString();
}

/**
 * When the alert's holders last earned its action: an alert stored before that was kept, acting on
 * the key, has its lastSeenAt as it was stored (from then on, only the holders move it).
 */
function earnedBefore(alert: Alert): string | undefined {
  return alert.actionSeenAt ?? (KEY_ACTIONS.has(alert.recommendedAction) ? alert.lastSeenAt : undefined);
}

/** What an alert made from this finding alone says: severity, risk, action, texts, evidence and span. */
function describedBy(rule: RuleInfo, finding: Finding) {
  const action = recommendedActionFor(rule, finding);
  return {
    severity: finding.severity,
    riskScore: riskScore(finding.severity, finding.confidence),
    recommendedAction: action,
    title: finding.title,
    summary: withActionNote(finding.summary, rule, finding.severity, action),
    evidence: finding.evidence,
    ruleVersion: rule.version,
    firstSeenAt: new Date(finding.firstSeenAt).toISOString(),
    lastSeenAt: new Date(finding.lastSeenAt).toISOString(),
    // Set, or cleared (a reopened alert's earlier episode earned nothing now).
    actionSeenAt: KEY_ACTIONS.has(action) ? holdersSeenAt(finding) : undefined,
    blockSeenAt: action === 'block' ? holdersSeenAt(finding) : undefined,
  } satisfies Partial<Alert>;
}

/** When the alert was last resolved (its latest move to resolved; its last update when none is recorded). */
function resolvedAt(alert: Alert): number {
  for (let i = alert.history.length - 1; i >= 0; i--) if (alert.history[i]!.to === 'resolved') return Date.parse(alert.history[i]!.at);
  return Date.parse(alert.updatedAt);
}

/**
 * For sort(): the alerts created later first. Synced in that order, a dedup key's alert is learned
 * before an earlier one it is kept over, which is then not merged (and not reopened) as the key's.
 */
export function laterCreatedFirst(a: Alert, b: Alert): number {
  return a.id === b.id ? 0 : createdLater(a, b) ? -1 : 1;
}

/** Whether `a` was created after `b` (ties, to the millisecond, by id): of two alerts of one dedup key, `a` is the key's. */
function createdLater(a: Alert, b: Alert): boolean {
  return a.createdAt !== b.createdAt ? a.createdAt > b.createdAt : a.id > b.id;
}
