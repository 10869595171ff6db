/**
 * The dashboard's AI insights (FEATURE_AI_RISK_SCORING): the patterns across a merchant's alerts in
 * the dashboard's range, most important first, at most MAX_DASHBOARD_INSIGHTS lines. Each alert's
 * pattern is read from its evidence by the fixed rules of alerts/insights.ts; no model is involved.
 * Pure: the route hands over the alerts and counts it has read.
 */
import { higherSeverity, severityRank } from '../alerts/alert.ts';
import { line, listed, plural, quoted } from '../alerts/insight-text.ts';
import { ATTACK_PATTERNS, explainAlert, type AttackPattern } from '../alerts/insights.ts';
import type { AnomalyType, Severity } from '../detect/types.ts';
import type { SeenAlert } from '../store/alert-store.ts';

export const MAX_DASHBOARD_INSIGHTS = 5;
/** Keys showing several kinds of abuse get a line each, up to this many. */
const MAX_COMBINED_ABUSE_LINES = 2;

const RANGE_NAMES = { '1h': 'the last hour', '24h': 'the last 24 h', '7d': 'the last 7 days' } as const;

/** Short names of the anomaly types, for a line that lists several. */
const TYPE_NAMES: Record<AnomalyType, string> = {
  velocity_attack: 'velocity',
  impossible_travel: 'impossible travel',
  high_failure_rate: 'failures',
  bot_traffic: 'bot traffic',
  credential_sharing: 'credential sharing',
};

export interface DashboardInsightsInput {
  /** Alerts seen in the range, dismissed ones left out, riskiest first. */
  alerts: readonly SeenAlert[];
  /** The alerts were cut at a limit: counts of keys are then lower bounds. */
  truncated: boolean;
  /** Critical alerts open or acknowledged now. */
  criticalActive: number;
  range: keyof typeof RANGE_NAMES;
  /** The operator's all-merchants view: each key is named with its merchant. */
  acrossMerchants: boolean;
}

interface Candidate {
  text: string;
  /** The worst severity behind the line, then its kind, rank it. */
  severity: Severity;
  kind: 'critical' | 'combined' | 'pattern';
  /** Within one severity and kind: more keys first. */
  keys: number;
}

const KIND_ORDER: Record<Candidate['kind'], number> = { critical: 0, combined: 1, pattern: 2 };

export function dashboardInsights(input: DashboardInsightsInput): string[] {
  const during = RANGE_NAMES[input.range];
  const keyName = (alert: SeenAlert) => {
    const key = quoted(alert.apiKeyId ?? alert.scope, 40);
    return input.acrossMerchants ? `${key} (${quoted(alert.merchantId, 40)})` : key;
  };
  const candidates: Candidate[] = [];

  if (input.criticalActive > 0) {
    candidates.push({
      text: `${plural(input.criticalActive, 'critical alert')} still active (open or acknowledged): triage ${input.criticalActive === 1 ? 'it' : 'them'} first.`,
      severity: 'critical',
      kind: 'critical',
      keys: 0,
    });
  }

  const byPattern = new Map<AttackPattern, { keys: Set<string>; severity: Severity }>();
  const byKey = new Map<string, { types: Set<AnomalyType>; severity: Severity }>();
  for (const alert of input.alerts) {
    const key = keyName(alert);
    const { pattern } = explainAlert(alert);
    const seen = byPattern.get(pattern) ?? { keys: new Set<string>(), severity: alert.severity };
    seen.keys.add(key);
    seen.severity = higherSeverity(seen.severity, alert.severity);
    byPattern.set(pattern, seen);
    const onKey = byKey.get(key) ?? { types: new Set<AnomalyType>(), severity: alert.severity };
    onKey.types.add(alert.type);
    onKey.severity = higherSeverity(onKey.severity, alert.severity);
    byKey.set(key, onKey);
  }

  const atLeast = input.truncated ? 'at least ' : '';
  for (const [pattern, { keys, severity }] of byPattern) {
    candidates.push({
      text: `${ATTACK_PATTERNS[pattern]} on ${atLeast}${plural(keys.size, 'key')} in ${during}: ${listed([...keys])}.`,
      severity,
      kind: 'pattern',
      keys: keys.size,
    });
  }

  const combined = [...byKey]
    .filter(([, { types }]) => types.size >= 2)
    .sort(([, a], [, b]) => b.types.size - a.types.size || severityRank(b.severity) - severityRank(a.severity))
    .slice(0, MAX_COMBINED_ABUSE_LINES);
  for (const [key, { types, severity }] of combined) {
    // Travel and sharing say the key is in other hands; the other three, that something automated holds it.
    const verdict = types.has('impossible_travel') || types.has('credential_sharing') ? 'likely a compromised key' : 'likely automated abuse of one key';
    const names = [...types].map((type) => TYPE_NAMES[type]);
    candidates.push({ text: `${key} shows ${types.size} kinds of abuse in ${during} (${listed(names, 5)}): ${verdict}.`, severity, kind: 'combined', keys: 1 });
  }

  return candidates
    .sort(
      (a, b) =>
        severityRank(b.severity) - severityRank(a.severity) ||
        KIND_ORDER[a.kind] - KIND_ORDER[b.kind] ||
        b.keys - a.keys,
    )
    .slice(0, MAX_DASHBOARD_INSIGHTS)
    .map((candidate) => line(candidate.text));
}
