import { describe, expect, it } from 'vitest';
import type { RequestEvent } from '../events/request-event.ts';
import { DetectionConfig } from './detection-config.ts';
import { DetectionEngine, type AnyRule } from './engine.ts';

const T0 = Date.UTC(2026, 10, 20, 12, 0, 0);

/** Fires when a key has at least `min` events in its window, reporting how many it saw. */
const countingRule: AnyRule = {
  id: 'velocity_attack',
  version: 'test',
  title: 'count',
  description: 'counts events',
  windowMs: 60_000,
  defaults: { min: 3 },
  actions: { low: 'monitor', medium: 'rate_limit', high: 'rate_limit', critical: 'block' },
  falsePositives: [],
  evaluate: (window, params: { min: number }) =>
    window.events.length >= params.min
      ? [
          {
            scope: window.apiKeyId,
            apiKeyId: window.apiKeyId,
            severity: 'medium',
            confidence: 0.5,
            title: `count ${window.events.length}`,
            summary: 's',
            evidence: { count: window.events.length, networks: window.events.map((e) => e.network), sampleEventIds: [], windowMs: 60_000 },
            firstSeenAt: window.events[0]!.timestamp,
            lastSeenAt: window.events.at(-1)!.timestamp,
          },
        ]
      : [],
};

const throwingRule: AnyRule = { ...countingRule, id: 'bot_traffic', evaluate: () => { throw new Error('boom'); } };

function event(i: number, overrides: Partial<RequestEvent> = {}): RequestEvent {
  return {
    eventId: `e${i}`,
    timestamp: T0 + i * 1000,
    merchantId: 'm_1',
    plan: 'business',
    apiKeyId: 'pk_live_a',
    environment: 'live',
    ip: `203.0.113.${i}`,
    userAgent: 'okhttp/4.12.0',
    method: 'POST',
    path: '/v1/verify/sessions',
    status: 201,
    responseTimeMs: 50,
    ...overrides,
  };
}

function engine(rules: AnyRule[] = [countingRule], config = new DetectionConfig()) {
  const errors: string[] = [];
  const detection = new DetectionEngine({
    rules,
    entitledPlans: ['business', 'enterprise'],
    config: () => config,
    onRuleError: (ruleId) => errors.push(ruleId),
  });
  return { detection, errors };
}

describe('DetectionEngine', () => {
  it('evaluates the keys a batch touched, with networks filled in', () => {
    const { detection } = engine();
    const findings = detection.process([event(1), event(2), event(3)], T0 + 3000);
    expect(findings).toHaveLength(1);
    expect(findings[0]).toMatchObject({ merchantId: 'm_1', ruleId: 'velocity_attack', finding: { apiKeyId: 'pk_live_a' } });
    expect(findings[0]!.finding.evidence.networks).toEqual(['203.0.113.0/24', '203.0.113.0/24', '203.0.113.0/24']);
  });

  it('counts a redelivered eventId once', () => {
    const { detection } = engine();
    expect(detection.process([event(1), event(2), event(1), event(2)], T0)).toHaveLength(0);
  });

  it('ignores plans that are not entitled', () => {
    const { detection } = engine();
    expect(detection.process([1, 2, 3, 4].map((i) => event(i, { plan: 'pro' })), T0)).toHaveLength(0);
    expect(detection.trackedKeys).toBe(0);
  });

  it('keeps only the longest rule window of history per key', () => {
    const { detection } = engine();
    detection.process([event(1), event(2)], T0);
    // 120 s later: the first two fell out of the 60 s window.
    const findings = detection.process([event(120), event(121)], T0 + 121_000);
    expect(findings).toHaveLength(0);
  });

  it('isolates a rule that throws: the others still run', () => {
    const { detection, errors } = engine([throwingRule, countingRule]);
    const findings = detection.process([event(1), event(2), event(3)], T0);
    expect(findings.map((f) => f.ruleId)).toEqual(['velocity_attack']);
    expect(errors).toEqual(['bot_traffic']);
    expect(detection.ruleErrors).toBe(1);
  });

  it('never lets an allowlisted key, network or user agent feed a window', () => {
    const config = DetectionConfig.parse(
      JSON.stringify({ allowlist: { ips: ['198.51.100.0/24'], userAgents: ['^uptime-probe'] }, merchants: { m_1: { allowlist: { keys: ['pk_live_ok'] } } } }),
    );
    const { detection } = engine([countingRule], config);
    const fromNetwork = [1, 2, 3].map((i) => event(i, { ip: `198.51.100.${i}` }));
    const fromProbe = [4, 5, 6].map((i) => event(i, { userAgent: 'uptime-probe/1.0' }));
    const fromKey = [7, 8, 9].map((i) => event(i, { apiKeyId: 'pk_live_ok' }));
    expect(detection.process([...fromNetwork, ...fromProbe, ...fromKey], T0)).toHaveLength(0);
  });

  it('merges plan and merchant parameter overrides over the defaults', () => {
    const config = DetectionConfig.parse(
      JSON.stringify({ plans: { business: { rules: { velocity_attack: { min: 10 } } } }, merchants: { m_2: { rules: { velocity_attack: { min: 2 } } } } }),
    );
    const { detection } = engine([countingRule], config);
    expect(detection.process([1, 2, 3].map((i) => event(i)), T0)).toHaveLength(0); // plan raised it to 10
    expect(detection.process([1, 2].map((i) => event(i, { merchantId: 'm_2', eventId: `x${i}` })), T0)).toHaveLength(1);
  });

  it('refuses an invalid config naming the field', () => {
    expect(() => DetectionConfig.parse(JSON.stringify({ allowlist: { ips: ['not-an-ip'] } }))).toThrow(/allowlist\.ips\.0/);
    expect(() => DetectionConfig.parse(JSON.stringify({ allowlist: { userAgents: ['('] } }))).toThrow(/userAgents/);
  });
});
