/** Findings and alerts as detection would make them, for the alert and webhook tests. */
import type { Finding, Severity } from '../detect/types.ts';
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
