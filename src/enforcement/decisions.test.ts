import { describe, expect, it } from 'vitest';
import { makeAlert } from '../../test/support/admin.ts';
import type { Alert } from '../alerts/alert.ts';
import { DetectionConfig } from '../detect/detection-config.ts';
import { alertDecisions, decisionFor, strongestPerKey, type EnforceableAlert } from './decisions.ts';

const NOW = Date.UTC(2026, 10, 21, 12, 0, 0);
const MINUTE = 60_000;
const POLICY = { blockMinRisk: 0.95, ttlMs: 60 * MINUTE };
const NO_ALLOWLISTS = new DetectionConfig();

/** Every key's decision at NOW: the strongest of its alerts'. */
const decisionsFor = (alerts: EnforceableAlert[]) => strongestPerKey(alertDecisions(alerts, POLICY, NO_ALLOWLISTS, NOW));

function alert(overrides: Partial<Alert> = {}): Alert {
  return makeAlert(0, {
    merchantId: 'm_1',
    createdAtMs: NOW - 10 * MINUTE,
    apiKeyId: 'pk_live_a',
    type: 'velocity_attack',
    severity: 'high',
    riskScore: 0.8,
    recommendedAction: 'rate_limit',
    title: '4.2x the rate limit for 3 minutes',
    lastSeenAt: new Date(NOW - MINUTE).toISOString(),
    ...overrides,
  });
}

describe('decisionFor', () => {
  it('throttles a live rate_limit alert until the TTL after its last evidence', () => {
    const source = alert();
    expect(decisionFor(source, POLICY, NO_ALLOWLISTS, NOW)).toEqual({
      apiKeyId: 'pk_live_a',
      merchantId: 'm_1',
      action: 'throttle',
      reason: 'velocity_attack alert, high, risk 0.8: 4.2x the rate limit for 3 minutes',
      alertId: source.id,
      expiresAt: new Date(NOW - MINUTE + 60 * MINUTE).toISOString(),
      exemptIps: [],
    });
  });

  it('blocks only a critical alert at or above the block risk threshold; below it, throttles', () => {
    const critical = (riskScore: number) => alert({ severity: 'critical', riskScore, recommendedAction: 'block' });
    expect(decisionFor(critical(0.95), POLICY, NO_ALLOWLISTS, NOW)?.action).toBe('block');
    expect(decisionFor(critical(0.99), POLICY, NO_ALLOWLISTS, NOW)?.action).toBe('block');
    const under = decisionFor(critical(0.94), POLICY, NO_ALLOWLISTS, NOW);
    expect(under?.action).toBe('throttle');
    expect(under?.reason).toMatch(/block recommended; under the block risk threshold/);
    // A block recommended by a non-critical alert (a rule may declare one) never blocks.
    expect(decisionFor(alert({ severity: 'high', riskScore: 0.99, recommendedAction: 'block' }), POLICY, NO_ALLOWLISTS, NOW)?.action).toBe('throttle');
    expect(decisionFor(critical(0.9), { ...POLICY, blockMinRisk: 0.9 }, NO_ALLOWLISTS, NOW)?.action).toBe('block');
  });

  it('enforces nothing for monitor and investigate', () => {
    expect(decisionFor(alert({ recommendedAction: 'monitor' }), POLICY, NO_ALLOWLISTS, NOW)).toBeUndefined();
    expect(decisionFor(alert({ recommendedAction: 'investigate' }), POLICY, NO_ALLOWLISTS, NOW)).toBeUndefined();
  });

  it('follows the lifecycle: open and acknowledged enforce, resolved and dismissed do not', () => {
    expect(decisionFor(alert({ status: 'acknowledged' }), POLICY, NO_ALLOWLISTS, NOW)?.action).toBe('throttle');
    expect(decisionFor(alert({ status: 'resolved' }), POLICY, NO_ALLOWLISTS, NOW)).toBeUndefined();
    expect(decisionFor(alert({ status: 'dismissed' }), POLICY, NO_ALLOWLISTS, NOW)).toBeUndefined();
  });

  it('ends when the TTL has passed since the last evidence', () => {
    const lastSeenAt = (ms: number) => alert({ lastSeenAt: new Date(ms).toISOString() });
    expect(decisionFor(lastSeenAt(NOW - 60 * MINUTE + 1), POLICY, NO_ALLOWLISTS, NOW)).toBeDefined();
    expect(decisionFor(lastSeenAt(NOW - 60 * MINUTE), POLICY, NO_ALLOWLISTS, NOW)).toBeUndefined();
    // Counted from when the key's holders last earned the action, when known: strangers' 401s since do not extend it.
    const earnedAt = (ms: number) => alert({ lastSeenAt: new Date(NOW).toISOString(), actionSeenAt: new Date(ms).toISOString() });
    expect(decisionFor(earnedAt(NOW - 60 * MINUTE + 1), POLICY, NO_ALLOWLISTS, NOW)?.expiresAt).toBe(new Date(NOW + 1).toISOString());
    expect(decisionFor(earnedAt(NOW - 60 * MINUTE), POLICY, NO_ALLOWLISTS, NOW)).toBeUndefined();
  });

  it('blocks until the TTL after the holders last earned a block, then throttles while what they earned since lasts', () => {
    const iso = (ms: number) => new Date(ms).toISOString();
    const blocked = (blockSeenAt: number, actionSeenAt: number) =>
      alert({ severity: 'critical', riskScore: 0.97, recommendedAction: 'block', lastSeenAt: iso(NOW), actionSeenAt: iso(actionSeenAt), blockSeenAt: iso(blockSeenAt) });
    const later = blocked(NOW - 50 * MINUTE, NOW - 5 * MINUTE);
    expect(decisionFor(later, POLICY, NO_ALLOWLISTS, NOW)).toMatchObject({ action: 'block', expiresAt: iso(NOW + 10 * MINUTE) });
    // Both are candidates: when the block lapses between two reads, the throttle takes its place (DecisionSource.current).
    expect(alertDecisions([later], POLICY, NO_ALLOWLISTS, NOW).map(({ action, expiresAt }) => ({ action, expiresAt }))).toEqual([
      { action: 'block', expiresAt: iso(NOW + 10 * MINUTE) },
      { action: 'throttle', expiresAt: iso(NOW + 55 * MINUTE) },
    ]);
    const lapsed = decisionFor(blocked(NOW - 60 * MINUTE, NOW - 5 * MINUTE), POLICY, NO_ALLOWLISTS, NOW);
    expect(lapsed).toMatchObject({ action: 'throttle', expiresAt: iso(NOW + 55 * MINUTE) });
    expect(lapsed?.reason).toMatch(/\(block last earned at 2026-11-21T11:00:00.000Z; the key's requests that passed authentication since then earn a throttle, so throttled\)$/);
    // Earned together: one block, nothing after it.
    expect(alertDecisions([blocked(NOW - 5 * MINUTE, NOW - 5 * MINUTE)], POLICY, NO_ALLOWLISTS, NOW).map((decision) => decision.action)).toEqual(['block']);
    expect(decisionFor(blocked(NOW - 60 * MINUTE, NOW - 60 * MINUTE), POLICY, NO_ALLOWLISTS, NOW)).toBeUndefined();
    // An alert stored before blockSeenAt was kept blocks as long as its action was earned.
    const { blockSeenAt: _none, ...stored } = later;
    expect(decisionFor(stored, POLICY, NO_ALLOWLISTS, NOW)).toMatchObject({ action: 'block', expiresAt: iso(NOW + 55 * MINUTE) });
  });

  it('never enforces an allowlisted key (global or the merchant\'s), and carries the merchant\'s allowlisted IPs', () => {
    const config = DetectionConfig.parse(
      JSON.stringify({
        allowlist: { keys: ['pk_live_global'], ips: ['203.0.113.7'] },
        merchants: { m_1: { allowlist: { keys: ['pk_live_own'], ips: ['198.51.100.0/24', '203.0.113.7'] } } },
      }),
    );
    expect(decisionFor(alert({ apiKeyId: 'pk_live_global' }), POLICY, config, NOW)).toBeUndefined();
    expect(decisionFor(alert({ apiKeyId: 'pk_live_own' }), POLICY, config, NOW)).toBeUndefined();
    // Another merchant's key of the same id is not on m_1's allowlist.
    expect(decisionFor(alert({ apiKeyId: 'pk_live_own', merchantId: 'm_2' }), POLICY, config, NOW)?.exemptIps).toEqual(['203.0.113.7']);
    expect(decisionFor(alert(), POLICY, config, NOW)?.exemptIps).toEqual(['203.0.113.7', '198.51.100.0/24']);
  });

  it('enforces nothing for an alert about an IP alone', () => {
    expect(decisionFor(alert({ apiKeyId: null, scope: 'ip:203.0.113.9' }), POLICY, NO_ALLOWLISTS, NOW)).toBeUndefined();
  });
});

describe('strongestPerKey of alertDecisions', () => {
  it('gives each key its strongest decision (block over throttle, then the longest), ordered by merchant and key', () => {
    const throttleLong = alert({ apiKeyId: 'pk_live_b', lastSeenAt: new Date(NOW).toISOString() });
    const throttleShort = alert({ apiKeyId: 'pk_live_b', type: 'high_failure_rate', lastSeenAt: new Date(NOW - 30 * MINUTE).toISOString() });
    const block = alert({ apiKeyId: 'pk_live_a', type: 'bot_traffic', severity: 'critical', riskScore: 0.97, recommendedAction: 'block', lastSeenAt: new Date(NOW - 50 * MINUTE).toISOString() });
    const throttleA = alert({ apiKeyId: 'pk_live_a' });
    const otherMerchant = alert({ merchantId: 'm_0', apiKeyId: 'pk_live_b' });
    const decisions = decisionsFor([throttleShort, throttleA, throttleLong, block, otherMerchant]);
    expect(decisions.map(({ merchantId, apiKeyId, action, alertId }) => ({ merchantId, apiKeyId, action, alertId }))).toEqual([
      { merchantId: 'm_0', apiKeyId: 'pk_live_b', action: 'throttle', alertId: otherMerchant.id },
      { merchantId: 'm_1', apiKeyId: 'pk_live_a', action: 'block', alertId: block.id },
      { merchantId: 'm_1', apiKeyId: 'pk_live_b', action: 'throttle', alertId: throttleLong.id },
    ]);
  });

  it('decides a tie (same action and expiry) by alert id, whatever order storage returns the alerts in', () => {
    const seen = new Date(NOW - MINUTE).toISOString();
    const first = alert({ id: '00000000-0000-4000-8000-00000000000a', type: 'velocity_attack', lastSeenAt: seen });
    const second = alert({ id: '00000000-0000-4000-8000-00000000000b', type: 'high_failure_rate', lastSeenAt: seen });
    for (const order of [[first, second], [second, first]]) {
      expect(decisionsFor(order).map((decision) => decision.alertId)).toEqual([first.id]);
    }
  });

  it('says why a block recommendation is throttled: under the risk threshold, or not critical', () => {
    const reason = (overrides: Partial<Alert>) => decisionFor(alert({ recommendedAction: 'block', ...overrides }), { ...POLICY, blockMinRisk: 0.5 }, NO_ALLOWLISTS, NOW)?.reason;
    expect(reason({ severity: 'critical', riskScore: 0.45 })).toMatch(/\(block recommended; under the block risk threshold, so throttled\)$/);
    expect(reason({ severity: 'high', riskScore: 0.89 })).toMatch(/\(block recommended; only a critical alert blocks, so throttled\)$/);
    expect(reason({ severity: 'critical', riskScore: 0.95 })).not.toMatch(/recommended/);
  });
});
