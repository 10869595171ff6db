/** Findings and alerts as detection would make them, for the alert and webhook tests. */
import { fixtures as botFixtures } from '../../rules/bot_traffic.fixtures.ts';
import { fixtures as sharingFixtures } from '../../rules/credential_sharing.fixtures.ts';
import type { ParamValue, RuleFixture } from '../../rules/fixtures.ts';
import { fixtures as failureFixtures } from '../../rules/high_failure_rate.fixtures.ts';
import { fixtures as travelFixtures } from '../../rules/impossible_travel.fixtures.ts';
import { RULES } from '../../rules/index.ts';
import { fixtures as velocityFixtures } from '../../rules/velocity_attack.fixtures.ts';
import type { AnomalyType, Finding, KeyWindow, RuleDefinition, Severity } from '../detect/types.ts';
import type { Alert } from './alert.ts';

export function finding(severity: Severity, at: number, scope = 'pk_live_a'): Finding {
  return {
    scope,
    apiKeyId: scope,
    severity,
    confidence: 0.5,
    title: `${severity} finding`,
    summary: 'summary',
    evidence: { sampleEventIds: ['e1'], windowMs: 60_000 },
    firstSeenAt: at - 60_000,
    lastSeenAt: at,
  };
}

/** An open critical bot_traffic alert of pk_live_a, created at `at`, with the given fields changed. */
export function testAlert(at: number, fields: Partial<Alert> = {}): Alert {
  const iso = new Date(at).toISOString();
  const apiKeyId = fields.apiKeyId ?? 'pk_live_a';
  return {
    id: '00000000-0000-4000-8000-000000000001',
    merchantId: 'm_1',
    apiKeyId,
    type: 'bot_traffic',
    scope: apiKeyId,
    severity: 'critical',
    riskScore: 0.95,
    recommendedAction: 'block',
    status: 'open',
    title: `Attack tool on ${apiKeyId}`,
    summary: 'sqlmap holds this key',
    evidence: { tools: { sqlmap: 1 }, sampleEventIds: ['e1'] },
    ruleId: 'bot_traffic',
    ruleVersion: '1.0.0',
    firstSeenAt: iso,
    lastSeenAt: iso,
    occurrences: 1,
    createdAt: iso,
    updatedAt: iso,
    history: [{ at: iso, actor: 'system', from: null, to: 'open', note: 'created by detection' }],
    ...fields,
  };
}

/** Each rule's fixtures (rules/<type>.fixtures.ts). */
export const FIXTURES: Record<AnomalyType, readonly RuleFixture[]> = {
  velocity_attack: velocityFixtures,
  impossible_travel: travelFixtures,
  high_failure_rate: failureFixtures,
  bot_traffic: botFixtures,
  credential_sharing: sharingFixtures,
};

/** The finding a rule makes of a window (its defaults, with overrides). */
export function ruleFinding(type: AnomalyType, window: KeyWindow, now: number, params: Partial<Record<string, ParamValue>> = {}): Finding {
  const rule = RULES.find((r) => r.id === type)! as unknown as RuleDefinition<Record<string, ParamValue>>;
  const findings = rule.evaluate(window, { ...rule.defaults, ...params } as Record<string, ParamValue>, now);
  if (findings.length !== 1) throw new Error(`${type}: ${findings.length} findings, expected 1`);
  return findings[0]!;
}

/** The finding a rule makes of one of its own fixtures (rules/<type>.fixtures.ts), named by the fixture's name. */
export function fixtureFinding(type: AnomalyType, name: string): Finding {
  const fixture = FIXTURES[type].find((f) => f.name === name);
  if (!fixture) throw new Error(`${type}: no fixture named "${name}"`);
  return ruleFinding(type, fixture.window, fixture.now, fixture.params);
}
