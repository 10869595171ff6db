/**
 * The alert (contracts section 2) and how a finding's severity and confidence become its risk score.
 */
import { JUDGED_ACROSS_KEYS, SPRAY_JUDGED_FROM, type AnomalyType, type RecommendedAction, type Severity, type SprayJudgedFrom } from '../detect/types.ts';

export const ALERT_STATUSES = ['open', 'acknowledged', 'resolved', 'dismissed'] as const;
export type AlertStatus = (typeof ALERT_STATUSES)[number];

/** One status change (contracts section 2): every entry has all five fields; `from` is null for the first, `note` when none was given. */
export interface HistoryEntry {
  /**
   * When the change was made, by the clock of the replica that made it, but never earlier than the
   * entry before it (stampAfter): replicas' clocks differ by a few seconds, and the order of the
   * entries is the order of the changes (mergeLifecycle).
   */
  at: string;
  actor: string;
  from: AlertStatus | null;
  to: AlertStatus;
  note: string | null;
}

export interface Alert {
  id: string;
  merchantId: string;
  apiKeyId: string | null;
  type: AnomalyType;
  /** Dedup scope within (merchantId, type); not part of the wire format. */
  scope: string;
  severity: Severity;
  riskScore: number;
  recommendedAction: RecommendedAction;
  status: AlertStatus;
  title: string;
  summary: string;
  evidence: Record<string, unknown>;
  ruleId: string;
  ruleVersion: string;
  firstSeenAt: string;
  lastSeenAt: string;
  /**
   * When the key's holders were last seen doing what the alert's action answers: the end of the
   * latest finding whose own action (recommendedActionFor: without the requests answered 401, which
   * anyone who knows the key's id can cause) throttles or blocks. An enforcement decision lasts its
   * TTL from then (decisions.ts), so strangers' 401s keep the alert seen but do not keep its key
   * throttled or blocked. Absent while none came (and in alerts stored before it was kept: then
   * lastSeenAt serves). Not part of the wire format.
   */
  actionSeenAt?: string;
  /**
   * As actionSeenAt, for a block: the end of the latest finding whose own action blocks. A block
   * lasts its TTL from then; the holders' later requests that earn only a throttle keep the key
   * throttled, not blocked (decisions.ts). Absent while none came (and in alerts stored before it was
   * kept: then actionSeenAt, else lastSeenAt, serves). Not part of the wire format.
   */
  blockSeenAt?: string;
  occurrences: number;
  createdAt: string;
  updatedAt: string;
  history: HistoryEntry[];
  aiInsights?: string[];
}

const SEVERITY_RANK: Record<Severity, number> = { low: 0, medium: 1, high: 2, critical: 3 };

/** Risk bands of contracts section 2: low < 0.4 <= medium < 0.7 <= high < 0.9 <= critical. */
const RISK_BANDS: Record<Severity, [number, number]> = {
  low: [0.1, 0.4],
  medium: [0.4, 0.7],
  high: [0.7, 0.9],
  critical: [0.9, 1.0],
};

export function severityRank(severity: Severity): number {
  return SEVERITY_RANK[severity];
}

export function higherSeverity(a: Severity, b: Severity): Severity {
  return SEVERITY_RANK[a] >= SEVERITY_RANK[b] ? a : b;
}

/**
 * Of two descriptions of one credential-stuffing alert at one severity, whether `a`'s is kept over
 * `b`'s; undefined when either is not such a description (another rule's, or one stored before
 * they carried their tally and time), for the caller's own rule: the later finding describes.
 * Credential stuffing (src/detect/source-spray.ts) is judged by two tallies that report one spray
 * in turns (evidence.judgedFrom): each replica's own, from the keys of its partitions, and the
 * reading of storage by the owner of partition 0, from every partition's. A description ranks by
 * its newest 401, a reading's as if a window (10 minutes) later: so the reading is kept over a
 * replica's share of the spray (a share does not overwrite the whole) unless the share is more than
 * a window later (no reading since), the later of two readings or of two shares is kept (a single
 * replica's), and of two that rank alike, the reading, then the one listing more of the merchant's
 * keys, then of the network's, then the greater evidence as text. A rank, so an order (transitive, never both ways,
 * whichever is asked first): replicas merging their copies, and a replica applying findings, end on
 * the same description whatever the order of arrival.
 */
export function sprayKeptOver(a: Record<string, unknown>, b: Record<string, unknown>): boolean | undefined {
  const [ar, br] = [sprayRankOf(a), sprayRankOf(b)];
  if (ar === undefined || br === undefined) return undefined;
  if (ar !== br) return ar > br;
  if (a.judgedFrom !== b.judgedFrom) return a.judgedFrom === 'all_partitions';
  for (const count of [keyCountOf, networkKeyCountOf]) {
    const [ac, bc] = [count(a), count(b)];
    if (ac !== bc) return ac > bc;
  }
  return JSON.stringify(a) > JSON.stringify(b);
}

/** A credential-stuffing description's rank (sprayKeptOver, epoch ms); undefined for any other evidence. */
function sprayRankOf(evidence: Record<string, unknown>): number | undefined {
  const { judgedBy, judgedFrom, lastFailureAt, windowMs } = evidence;
  if (judgedBy !== JUDGED_ACROSS_KEYS || !SPRAY_JUDGED_FROM.includes(judgedFrom as SprayJudgedFrom)) return undefined;
  if (typeof lastFailureAt !== 'string' || typeof windowMs !== 'number') return undefined;
  const at = Date.parse(lastFailureAt);
  if (Number.isNaN(at)) return undefined;
  return judgedFrom === 'all_partitions' ? at + windowMs : at;
}

function keyCountOf(evidence: Record<string, unknown>): number {
  return typeof evidence.merchantKeyCount === 'number' ? evidence.merchantKeyCount : 0;
}

function networkKeyCountOf(evidence: Record<string, unknown>): number {
  return typeof evidence.distinctKeys === 'number' ? evidence.distinctKeys : 0;
}

/** A score inside the severity's band, growing with confidence; never reaches the next band. */
export function riskScore(severity: Severity, confidence: number): number {
  const [low, high] = RISK_BANDS[severity];
  const clamped = Math.min(1, Math.max(0, Number.isFinite(confidence) ? confidence : 0));
  const top = severity === 'critical' ? high : high - 0.001;
  return Math.round((low + (top - low) * clamped) * 1000) / 1000;
}

/** Moves an admin may make (contracts section 2). */
export function isAllowedTransition(from: AlertStatus, to: AlertStatus): boolean {
  switch (from) {
    case 'open':
      return to === 'acknowledged' || to === 'dismissed';
    case 'acknowledged':
      return to === 'resolved' || to === 'dismissed';
    default:
      return false;
  }
}

export type StatusChange = { ok: true; alert: Alert } | { ok: false; reason: 'not_allowed' | 'note_required' };

/**
 * The time of a change made on top of a copy that records `previous` (its latest history entry, its
 * updatedAt): the clock's, or 1 ms after `previous` when the clock is not past it. Replicas' clocks
 * differ, and a change must sort after what it was decided on, whichever replica's clock stamped
 * that; so a time can be ahead of the clock of the replica that made the change, by at most how far
 * another replica's clock is ahead of it.
 */
export function stampAfter(previous: string | undefined, now: number): string {
  const after = previous === undefined ? Number.NEGATIVE_INFINITY : Date.parse(previous);
  return new Date(now > after ? now : after + 1).toISOString();
}

/** Who the worker's own history entries are by (creation, reopening, a duplicate's resolution); no admin may be called so. */
export const SYSTEM_ACTOR = 'system';

/** How a duplicate's resolution note begins (before 'system' was refused as an admin's name, an admin could have been called so). */
const DUPLICATE_NOTE = 'a duplicate of alert ';

/**
 * Whether the alert's latest change is the worker's resolution of a duplicate (AlertManager.sync):
 * no recurrence reopens it, as its pattern's findings belong to the alert kept.
 */
export function resolvedAsDuplicate(alert: Alert): boolean {
  const latest = latestEntry(alert);
  return alert.status === 'resolved' && latest?.to === 'resolved' && latest.actor === SYSTEM_ACTOR && latest.note?.startsWith(DUPLICATE_NOTE) === true;
}

/** The alert resolved by the worker as a duplicate of `kept` (see AlertManager.sync), from its status now. */
export function duplicateResolution(alert: Alert, kept: Alert, now: number): Alert {
  const at = stampAfter(latestEntry(alert)?.at, now);
  return {
    ...alert,
    status: 'resolved',
    updatedAt: stampAfter(alert.updatedAt, Date.parse(at)),
    history: [
      ...alert.history,
      { at, actor: SYSTEM_ACTOR, from: alert.status, to: 'resolved', note: `${DUPLICATE_NOTE}${kept.id}, opened for the same pattern by another replica at the same time; its findings go there` },
    ],
  };
}

/**
 * The alert kept for a pattern (see duplicateResolution) with what its duplicate saw, as if the
 * duplicate's findings had gone to it: the higher severity with what describes it and its score
 * (mergeDetection), the earlier firstSeenAt, and the findings of both (two alerts' findings are told
 * apart, so they are summed). Its own lastSeenAt stays: a later one would pass, beside a resolution
 * an admin made meanwhile, for a recurrence (AlertManager.merge), and reopen it. Only an alert kept
 * still open (or acknowledged) in its first episode takes anything: once resolved, what the
 * duplicate saw belongs to a closed episode. Stamped `now`, for the others to read it; `kept` itself
 * when it takes nothing.
 */
export function withDuplicateFindings(kept: Alert, duplicate: Alert, now: number): Alert {
  if (!(kept.status === 'open' || kept.status === 'acknowledged') || episode(kept) > 0) return kept;
  // The holders' later time, within the kept alert's span: enforcement reads alerts seen within its TTL by lastSeenAt.
  const withinSpan = (holdersSeen: string | undefined) => (holdersSeen !== undefined && holdersSeen > kept.lastSeenAt ? kept.lastSeenAt : holdersSeen);
  const actionSeenAt = withinSpan(laterTime(kept.actionSeenAt, duplicate.actionSeenAt));
  const blockSeenAt = kept.blockSeenAt === undefined && duplicate.blockSeenAt === undefined ? undefined : withinSpan(laterTime(blockEarned(kept), blockEarned(duplicate)));
  const asKept: Alert = { ...kept, ...detectionOf(duplicate), riskScore: duplicate.riskScore, lastSeenAt: kept.lastSeenAt, actionSeenAt, blockSeenAt };
  const merged = mergeDetection(kept, asKept);
  return { ...merged, occurrences: kept.occurrences + duplicate.occurrences, updatedAt: stampAfter(kept.updatedAt, now) };
}

/** The latest entry of a history (the last in the order mergeLifecycle keeps). */
export function latestEntry(alert: Alert): HistoryEntry | undefined {
  return alert.history.reduce<HistoryEntry | undefined>((latest, entry) => (latest && compareEntries(latest, entry) >= 0 ? latest : entry), undefined);
}

/**
 * An admin's status change: the lifecycle move, recorded in history with who, when and why.
 * Dismissing needs a note (it marks a false positive and silences the dedup key for a while).
 */
export function changeStatus(alert: Alert, to: AlertStatus, actor: string, note: string | undefined, now: number): StatusChange {
  if (!isAllowedTransition(alert.status, to)) return { ok: false, reason: 'not_allowed' };
  if (to === 'dismissed' && !note) return { ok: false, reason: 'note_required' };
  const at = stampAfter(latestEntry(alert)?.at, now);
  // updatedAt only moves forward, so the newest write also wins in the dedup index.
  const updatedAt = stampAfter(alert.updatedAt, Date.parse(at));
  return {
    ok: true,
    alert: {
      ...alert,
      status: to,
      updatedAt,
      history: [...alert.history, { at, actor, from: alert.status, to, note: note ?? null }],
    },
  };
}

/**
 * Is this change the latest move of the alert already, made by the same actor with the same note
 * (none is null)? Then it is a repeat of that request (a retry after an answer that was lost), not
 * a new move. With another note it is a move from the status the alert has, refused as such: answered
 * as a repeat, its note would be dropped without a word.
 */
export function isRepeatedChange(alert: Alert, to: AlertStatus, actor: string, note: string | null): boolean {
  const latest = latestEntry(alert);
  return alert.status === to && latest?.to === to && latest.actor === actor && latest.note === note && latest.from !== null && isAllowedTransition(latest.from, to);
}

/**
 * A move made, unknown to `ours`, out of the status `entry` moved the alert out of: a conflicting
 * change made through another replica at the same time (both decided on the same status: on the
 * same stored copy, of which the compare-and-set keeps the first stored; or on a copy a racing write
 * had left without the other). Undefined when there is none.
 */
export function conflictingMove(stored: Alert, ours: Alert, entry: HistoryEntry): HistoryEntry | undefined {
  const known = new Set(ours.history.map(historyKey));
  return stored.history.find((other) => other.from === entry.from && !known.has(historyKey(other)));
}

/**
 * One alert as two replicas have it: `ours` (the copy about to be written) and `theirs` (another
 * replica's, say with an admin's change). The result keeps our detection fields (mergeDetection
 * merges those) and the lifecycle of both: the histories are merged (an entry is its time, actor and
 * target status) and the status is the target of the latest entry, so a change made on another
 * replica is never written back over.
 * A change is stamped after the entries it was decided on (stampAfter), so the order of the entries
 * is the order of the changes whatever the replicas' clocks; ties are broken alike on every replica.
 * Returns `ours` itself when `theirs` adds nothing.
 */
export function mergeLifecycle(ours: Alert, theirs: Alert): Alert {
  if (ours.id !== theirs.id) return ours;
  const known = new Set(ours.history.map(historyKey));
  const missing = theirs.history.filter((entry) => !known.has(historyKey(entry)));
  if (missing.length === 0) return ours;
  const history = [...ours.history, ...missing].sort(compareEntries);
  return {
    ...ours,
    status: history[history.length - 1]!.to,
    updatedAt: ours.updatedAt > theirs.updatedAt ? ours.updatedAt : theirs.updatedAt,
    history,
  };
}

/**
 * How many times the alert was reopened (its resolved -> open entries): copies with the same count
 * describe the same episode of the pattern; a reopen starts a new one, described by its own evidence.
 */
export function episode(alert: Alert): number {
  let reopens = 0;
  for (const entry of alert.history) if (entry.from === 'resolved' && entry.to === 'open') reopens++;
  return reopens;
}

/**
 * One alert as two replicas have it, for its detection fields (mergeLifecycle does its lifecycle):
 * `ours` with what `theirs` knows that ours does not. Within one episode (see episode) neither copy
 * is written back over: the higher severity with what describes it (title, summary, evidence,
 * recommendedAction, ruleVersion, insights; of two copies of one severity, the one seen later, or
 * for credential stuffing the one sprayKeptOver keeps), its highest riskScore (scores band by
 * severity, so the score always fits the severity kept), the latest lastSeenAt, actionSeenAt and blockSeenAt, the most occurrences (increments counted on two replicas at once cannot be
 * told apart, so they are not summed: the count never goes back, and may miss some) and the
 * earliest firstSeenAt. A copy of a later episode gives all of its detection fields; one of an
 * earlier episode, none (what was resolved does not come back). updatedAt is the later one's.
 * Returns `ours` itself when `theirs` adds nothing.
 */
export function mergeDetection(ours: Alert, theirs: Alert): Alert {
  if (ours.id !== theirs.id) return ours;
  const [mine, other] = [episode(ours), episode(theirs)];
  if (other < mine) return ours;
  const detection = other > mine ? { ...detectionOf(theirs), riskScore: theirs.riskScore } : mergedDetection(ours, theirs);
  const changed = (Object.keys(detection) as (keyof typeof detection)[]).some((field) => detection[field] !== ours[field]);
  if (!changed) return ours;
  const merged: Alert = { ...ours, ...detection, updatedAt: ours.updatedAt > theirs.updatedAt ? ours.updatedAt : theirs.updatedAt };
  if (detection.aiInsights === undefined) delete merged.aiInsights;
  if (detection.actionSeenAt === undefined) delete merged.actionSeenAt;
  if (detection.blockSeenAt === undefined) delete merged.blockSeenAt;
  return merged;
}

/** The fields that describe what was detected, as one copy has them. */
function detectionOf(alert: Alert) {
  return {
    severity: alert.severity,
    recommendedAction: alert.recommendedAction,
    title: alert.title,
    summary: alert.summary,
    evidence: alert.evidence,
    ruleVersion: alert.ruleVersion,
    aiInsights: alert.aiInsights,
    firstSeenAt: alert.firstSeenAt,
    lastSeenAt: alert.lastSeenAt,
    actionSeenAt: alert.actionSeenAt,
    blockSeenAt: alert.blockSeenAt,
    occurrences: alert.occurrences,
  };
}

const ACTION_STRENGTH: readonly RecommendedAction[] = ['monitor', 'investigate', 'rate_limit', 'block'];

/** The stronger of two recommended actions (monitor < investigate < rate_limit < block); `a` when they are the same. */
export function strongerAction(a: RecommendedAction, b: RecommendedAction): RecommendedAction {
  return ACTION_STRENGTH.indexOf(a) >= ACTION_STRENGTH.indexOf(b) ? a : b;
}

/** Two copies of one episode: see mergeDetection. */
function mergedDetection(ours: Alert, theirs: Alert) {
  const rank = severityRank(theirs.severity) - severityRank(ours.severity);
  const describer = rank !== 0 ? (rank > 0 ? theirs : ours) : betterDescribed(ours, theirs);
  // Only a copy of the severity kept gives the score: each copy's score is in its severity's band.
  // Scores are kept to 3 decimals, and stored as Float32: a smaller difference is none.
  const riskScore = rank === 0 ? (theirs.riskScore > ours.riskScore + 0.0005 ? theirs.riskScore : ours.riskScore) : describer.riskScore;
  return {
    ...detectionOf(describer),
    // As the alert manager keeps it: a copy raised by requests answered 401 (Finding.keyHolderSeverity)
    // does not take away the action the key's holders earned on the other.
    recommendedAction: strongerAction(ours.recommendedAction, theirs.recommendedAction),
    riskScore,
    firstSeenAt: ours.firstSeenAt < theirs.firstSeenAt ? ours.firstSeenAt : theirs.firstSeenAt,
    lastSeenAt: ours.lastSeenAt > theirs.lastSeenAt ? ours.lastSeenAt : theirs.lastSeenAt,
    actionSeenAt: laterTime(ours.actionSeenAt, theirs.actionSeenAt),
    // Beside a copy that has one, a copy written before blockSeenAt was kept (a replica still on the code before it) gives its fallback.
    blockSeenAt: ours.blockSeenAt === undefined && theirs.blockSeenAt === undefined ? undefined : laterTime(blockEarned(ours), blockEarned(theirs)),
    occurrences: Math.max(ours.occurrences, theirs.occurrences),
  };
}

/**
 * When the alert's holders last earned a block: its blockSeenAt; for one stored before that was kept
 * that recommends block, when its action was earned (actionSeenAt, else lastSeenAt), as decisions.ts reads it.
 */
export function blockEarned(alert: Pick<Alert, 'blockSeenAt' | 'actionSeenAt' | 'lastSeenAt' | 'recommendedAction'>): string | undefined {
  return alert.blockSeenAt ?? (alert.recommendedAction === 'block' ? (alert.actionSeenAt ?? alert.lastSeenAt) : undefined);
}

/** The later of two ISO times, either of them absent. */
export function laterTime(a: string | undefined, b: string | undefined): string | undefined {
  return a === undefined ? b : b === undefined || a >= b ? a : b;
}

/** Of two copies of one severity, the one whose description is kept (sprayKeptOver), else the one seen later. */
function betterDescribed(ours: Alert, theirs: Alert): Alert {
  const theirsKept = sprayKeptOver(theirs.evidence, ours.evidence);
  if (theirsKept !== undefined) return theirsKept ? theirs : ours;
  return theirs.lastSeenAt > ours.lastSeenAt ? theirs : ours;
}

/**
 * Two copies of one alert made one: the detection fields of both (mergeDetection), then the
 * lifecycle of both (mergeLifecycle). Returns `ours` itself when `theirs` adds nothing.
 */
export function mergeCopies(ours: Alert, theirs: Alert): Alert {
  return mergeLifecycle(mergeDetection(ours, theirs), theirs);
}

/** The alert without one entry of its history (a change that lost): its status is then its latest entry's. */
export function withoutEntry(alert: Alert, lost: HistoryEntry): Alert {
  const history = alert.history.filter((entry) => historyKey(entry) !== historyKey(lost));
  if (history.length === alert.history.length) return alert;
  const latest = history.reduce<HistoryEntry | undefined>((last, entry) => (last && compareEntries(last, entry) >= 0 ? last : entry), undefined);
  return { ...alert, history, status: latest?.to ?? alert.status };
}

function historyKey(entry: HistoryEntry): string {
  return `${entry.at}\u0000${entry.actor}\u0000${entry.to}`;
}

function compareEntries(a: HistoryEntry, b: HistoryEntry): number {
  const [x, y] = a.at === b.at ? [historyKey(a), historyKey(b)] : [a.at, b.at];
  return x < y ? -1 : x > y ? 1 : 0;
}

/** The alert as the wire format of contracts section 2 has it (the dedup scope, actionSeenAt and blockSeenAt are internal). */
export type WireAlert = Omit<Alert, 'scope' | 'actionSeenAt' | 'blockSeenAt'>;

export function toWireAlert(alert: Alert): WireAlert {
  const { scope: _scope, actionSeenAt: _actionSeenAt, blockSeenAt: _blockSeenAt, ...wire } = alert;
  return wire;
}
