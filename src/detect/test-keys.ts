/**
 * Findings on test keys. A test key reaches only mock verifications with fake data, unlimited and not
 * usage-tracked (the spec's section 1): its abuse puts nothing real at risk, and automation, load
 * tests, CI runners in many regions and a team sharing one key are what test keys are for. So a
 * finding on one is reported at no more than the merchant's test-key ceiling (low unless the
 * detection config raises it: DetectionConfig.testKeyMaxSeverity), which no enforcement acts on and
 * no webhook pages anyone for; it is still reported, since a test key used from a stranger's network
 * says where the merchant's keys have leaked.
 */
import { SEVERITIES, type Finding, type Severity } from './types.ts';

/**
 * The finding as reported for a test key, or about a network (apiKeyId null: credential stuffing)
 * whose keys of the merchant's are all test keys: marked as such, and lowered to `maxSeverity` if
 * above it, saying what it was judged.
 */
export function testKeyFinding(finding: Finding, maxSeverity: Severity): Finding {
  const evidence = { ...finding.evidence, keyEnvironment: 'test' };
  if (SEVERITIES.indexOf(finding.severity) <= SEVERITIES.indexOf(maxSeverity)) return { ...finding, evidence };
  const why =
    finding.apiKeyId === null
      ? 'your keys among them are all test keys: they reach only mock verifications, so nothing real is at risk; rotate them if this traffic is not yours.'
      : `${finding.apiKeyId} is a test key: it reaches only mock verifications, so nothing real is at risk; rotate it if this traffic is not the merchant's.`;
  return {
    ...finding,
    severity: maxSeverity,
    evidence: { ...evidence, judgedSeverity: finding.severity },
    summary: `${finding.summary} Reported as ${maxSeverity}, not ${finding.severity}, because ${why}`,
  };
}
