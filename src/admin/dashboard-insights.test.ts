import { describe, expect, it } from 'vitest';
import { fixtureFinding } from '../alerts/test-findings.ts';
import type { AnomalyType } from '../detect/types.ts';
import type { SeenAlert } from '../store/alert-store.ts';
import { dashboardInsights, type DashboardInsightsInput } from './dashboard-insights.ts';

/** An alert of a key as stored, with the evidence a rule's fixture really gives. */
function seen(apiKeyId: string, type: AnomalyType, fixture: string, merchantId = 'm_1'): SeenAlert {
  const finding = fixtureFinding(type, fixture);
  return { merchantId, apiKeyId, scope: apiKeyId, type, severity: finding.severity, evidence: finding.evidence };
}

const BRUTE_FORCE = '200 of 240 requests unauthorized (someone guessing the secret) is high';
const BRUTE_FORCE_CRITICAL = 'a brute force at volume: 1,200 × 401 out of 1,250 is critical';
const FLOOD = 'two minutes at twice the limit is medium';
const HEADLESS = 'HeadlessChrome walking 60 session ids is medium';

function insights(input: Partial<DashboardInsightsInput>): string[] {
  return dashboardInsights({ alerts: [], truncated: false, criticalActive: 0, range: '24h', acrossMerchants: false, ...input });
}

describe('dashboardInsights', () => {
  it('says nothing when there is nothing', () => {
    expect(insights({})).toEqual([]);
  });

  it('names a pattern once across the keys that show it', () => {
    const lines = insights({
      alerts: [
        seen('pk_a', 'high_failure_rate', BRUTE_FORCE),
        seen('pk_b', 'high_failure_rate', BRUTE_FORCE),
        seen('pk_c', 'high_failure_rate', BRUTE_FORCE),
      ],
    });
    expect(lines).toEqual(['Brute-force attempts on 3 keys in the last 24 h: pk_a, pk_b and pk_c.']);
  });

  it('calls out a key with several kinds of abuse, and the critical alerts still active, most important first', () => {
    const lines = insights({
      range: '1h',
      criticalActive: 2,
      alerts: [
        seen('pk_x', 'high_failure_rate', BRUTE_FORCE_CRITICAL),
        seen('pk_x', 'velocity_attack', FLOOD),
        seen('pk_x', 'bot_traffic', HEADLESS),
        seen('pk_y', 'velocity_attack', FLOOD),
      ],
    });
    expect(lines).toEqual([
      '2 critical alerts still active (open or acknowledged): triage them first.',
      'pk_x shows 3 kinds of abuse in the last hour (failures, velocity and bot traffic): likely automated abuse of one key.',
      'Brute-force attempts on 1 key in the last hour: pk_x.',
      'Request floods from one network on 2 keys in the last hour: pk_x and pk_y.',
      'Headless-browser scraping on 1 key in the last hour: pk_x.',
    ]);
  });

  it('says a key used from far apart places with other abuse is likely compromised', () => {
    const lines = insights({
      alerts: [seen('pk_t', 'impossible_travel', 'us-east then Moscow three minutes later is high'), seen('pk_t', 'velocity_attack', FLOOD)],
    });
    expect(lines).toContain('pk_t shows 2 kinds of abuse in the last 24 h (impossible travel and velocity): likely a compromised key.');
  });

  it('keeps to 5 lines, counts as lower bounds when the alerts were cut, and names merchants across merchants', () => {
    const alerts = [
      seen('pk_1', 'bot_traffic', 'one sqlmap request suffices: critical', 'm_a'),
      seen('pk_2', 'credential_sharing', 'a published key: 60 networks in 12 countries with no history is critical', 'm_b'),
      seen('pk_3', 'high_failure_rate', BRUTE_FORCE, 'm_a'),
      seen('pk_4', 'impossible_travel', 'us-east then Moscow three minutes later is high', 'm_c'),
      seen('pk_5', 'velocity_attack', FLOOD, 'm_a'),
      seen('pk_6', 'bot_traffic', HEADLESS, 'm_b'),
    ];
    const lines = insights({ alerts, truncated: true, acrossMerchants: true, range: '7d' });
    expect(lines).toHaveLength(5);
    expect(lines[0]).toBe('Known attack tools on at least 1 key in the last 7 days: pk_1 (m_a).');
    expect(lines[1]).toBe('Signs of a leaked or published key on at least 1 key in the last 7 days: pk_2 (m_b).');
    for (const line of lines) expect(line.length).toBeLessThanOrEqual(200);
  });
});
