/**
 * Enforcement decisions (contracts section 5), derived from alerts. Pure: the alerts, the policy,
 * the allowlists and the time in; the decisions out.
 *
 * - Only a live alert decides: open or acknowledged (an admin looking into it does not lift it),
 *   about a key, and seen within the policy's TTL: the decision expires `ttlMs` after the key's
 *   holders were last seen doing what the action answers (Alert.actionSeenAt; lastSeenAt in alerts
 *   that predate it), so an attack that stops is let through again without anyone's action, one that
 *   goes on keeps extending it, and strangers' requests answered 401 do not. A block lasts its TTL
 *   from the holders' last evidence that earned a block (Alert.blockSeenAt); their later evidence
 *   that earns only a throttle keeps the key throttled after it, not blocked. Resolving or
 *   dismissing the alert ends it at once.
 * - `rate_limit` throttles. `block` blocks only a critical alert whose risk score is at least
 *   `blockMinRisk`; below that it throttles (the softer of the two, as the rule asked for more).
 *   `monitor` and `investigate` enforce nothing.
 * - An allowlisted key is never enforced, whatever its alerts say (the allowlist may have been
 *   extended after the alert opened). Allowlisted IPs and networks travel with each decision as
 *   `exemptIps`: the worker decides per key, and only the fleet sees each request's address.
 *   Allowlisted user agents are not exempt: the client chooses its user agent, so exempting one
 *   would let whoever holds a blocked key through by sending it.
 * - One decision per key: the strongest of its alerts' (block over throttle, then the one that
 *   lasts longest, then the lowest alert id), so the fleet applies a single lookup's answer. When
 *   it expires, the next strongest takes its place (DecisionSource.current).
 */
import type { Alert } from '../alerts/alert.ts';
import type { DetectionConfig } from '../detect/detection-config.ts';

export const ENFORCEMENT_ACTIONS = ['throttle', 'block'] as const;
export type EnforcementAction = (typeof ENFORCEMENT_ACTIONS)[number];

/** The wire format of contracts section 5, with the key's merchant and the addresses never to enforce. */
export interface EnforcementDecision {
  apiKeyId: string;
  merchantId: string;
  action: EnforcementAction;
  reason: string;
  alertId: string;
  /** ISO 8601 UTC. */
  expiresAt: string;
  /** IPs and CIDRs allowlisted for the merchant: their requests are let through whatever the decision. */
  exemptIps: string[];
}

export interface EnforcementPolicy {
  /** ENFORCEMENT_BLOCK_MIN_RISK: the lowest risk score of a critical alert that blocks. */
  blockMinRisk: number;
  /** ENFORCEMENT_TTL_MINUTES: how long after the key holders' last evidence (Alert.actionSeenAt) its decision lasts. */
  ttlMs: number;
}

/** What a decision is derived from: an alert's fields that enforcement reads (AlertStore.enforceable). */
export type EnforceableAlert = Pick<Alert, 'id' | 'merchantId' | 'apiKeyId' | 'type' | 'severity' | 'riskScore' | 'recommendedAction' | 'status' | 'title' | 'lastSeenAt' | 'actionSeenAt' | 'blockSeenAt'>;

/** The alert's decision at `now`, or undefined when it enforces nothing (the first of decisionsOf). */
export function decisionFor(alert: EnforceableAlert, policy: EnforcementPolicy, config: DetectionConfig, now: number): EnforcementDecision | undefined {
  return decisionsOf(alert, policy, config, now)[0];
}

/**
 * The alert's decisions at `now`, the one in force first: a block, then the throttle that follows it
 * when the holders earned one since (lasting past the block); otherwise its one decision, or none.
 */
function decisionsOf(alert: EnforceableAlert, policy: EnforcementPolicy, config: DetectionConfig, now: number): EnforcementDecision[] {
  if (alert.status !== 'open' && alert.status !== 'acknowledged') return [];
  const apiKeyId = alert.apiKeyId;
  if (apiKeyId === null || config.isKeyAllowlisted(alert.merchantId, apiKeyId)) return [];
  const action = actionFor(alert, policy);
  if (action === undefined) return [];
  const decision = (action: EnforcementAction, expiresAt: number, reason: string): EnforcementDecision => ({
    apiKeyId,
    merchantId: alert.merchantId,
    action,
    reason,
    alertId: alert.id,
    expiresAt: new Date(expiresAt).toISOString(),
    exemptIps: config.allowlistedIps(alert.merchantId),
  });
  const actionSeenAt = alert.actionSeenAt ?? alert.lastSeenAt;
  const actionExpires = Date.parse(actionSeenAt) + policy.ttlMs;
  if (action !== 'block') return actionExpires > now ? [decision(action, actionExpires, reasonFor(alert, action))] : [];
  const blockSeenAt = alert.blockSeenAt ?? actionSeenAt;
  const blockExpires = Date.parse(blockSeenAt) + policy.ttlMs;
  const decisions = blockExpires > now ? [decision('block', blockExpires, reasonFor(alert, 'block'))] : [];
  if (actionExpires > Math.max(now, blockExpires)) {
    const reason = `${reasonFor(alert, 'block')} (block last earned at ${blockSeenAt}; the key's requests that passed authentication since then earn a throttle, so throttled)`;
    decisions.push(decision('throttle', actionExpires, reason));
  }
  return decisions;
}

/** Every alert's decisions at `now` (a key may have several; strongestPerKey picks its one). */
export function alertDecisions(alerts: Iterable<EnforceableAlert>, policy: EnforcementPolicy, config: DetectionConfig, now: number): EnforcementDecision[] {
  const decisions: EnforcementDecision[] = [];
  for (const alert of alerts) decisions.push(...decisionsOf(alert, policy, config, now));
  return decisions;
}

/** Each key's strongest decision, ordered by merchant and key. */
export function strongestPerKey(decisions: Iterable<EnforcementDecision>): EnforcementDecision[] {
  const byKey = new Map<string, EnforcementDecision>();
  for (const decision of decisions) {
    const key = `${decision.merchantId}\u0000${decision.apiKeyId}`;
    const known = byKey.get(key);
    if (known === undefined || stronger(decision, known)) byKey.set(key, decision);
  }
  return [...byKey.values()].sort((a, b) => compare(a.merchantId, b.merchantId) || compare(a.apiKeyId, b.apiKeyId));
}

function actionFor(alert: EnforceableAlert, policy: EnforcementPolicy): EnforcementAction | undefined {
  switch (alert.recommendedAction) {
    case 'rate_limit':
      return 'throttle';
    case 'block':
      return alert.severity === 'critical' && alert.riskScore >= policy.blockMinRisk ? 'block' : 'throttle';
    default:
      return undefined;
  }
}

function reasonFor(alert: EnforceableAlert, action: EnforcementAction): string {
  const base = `${alert.type} alert, ${alert.severity}, risk ${alert.riskScore}: ${alert.title}`;
  if (action !== 'throttle' || alert.recommendedAction !== 'block') return base;
  return `${base} (block recommended; ${alert.severity === 'critical' ? 'under the block risk threshold' : 'only a critical alert blocks'}, so throttled)`;
}

/** Block over throttle, then the later expiry; then the alert id, so that a tie is decided alike on every read. */
function stronger(a: EnforcementDecision, b: EnforcementDecision): boolean {
  if (a.action !== b.action) return a.action === 'block';
  if (a.expiresAt !== b.expiresAt) return a.expiresAt > b.expiresAt;
  return a.alertId < b.alertId;
}

function compare(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}
