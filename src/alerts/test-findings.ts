/** A finding as a rule would report it, for the alert tests. */
import type { Finding, Severity } from '../detect/types.ts';

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
