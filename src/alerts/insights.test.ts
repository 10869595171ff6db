/**
 * Insights from real findings: each rule runs on its own fixtures (or on a window built the same way),
 * and every figure an insight quotes is checked against the finding's evidence.
 */
import { describe, expect, it } from 'vitest';
import { keyWindow, MINUTE, perMinute, spread, T0 } from '../../rules/fixtures.ts';
import { ANOMALY_TYPES, type AnomalyType, type Finding, type Severity } from '../detect/types.ts';
import { figure } from './insight-text.ts';
import { testKeyFinding } from '../detect/test-keys.ts';
import { alertInsights, explainAlert, MAX_INSIGHTS, TEST_KEY_INSIGHT, withInsightsShown } from './insights.ts';
import { FIXTURES, fixtureFinding, ruleFinding, testAlert } from './test-findings.ts';

const TEN_MINUTES_AGO = T0 - 10 * MINUTE;

function explain(type: AnomalyType, finding: Finding, severity: Severity = finding.severity) {
  return { ...explainAlert({ type, severity, evidence: finding.evidence }), evidence: finding.evidence as Record<string, any> };
}

describe('insights of high_failure_rate', () => {
  it('names a brute-force attempt with the failed and judged requests of the evidence', () => {
    const { pattern, insights, evidence } = explain('high_failure_rate', fixtureFinding('high_failure_rate', '200 of 240 requests unauthorized (someone guessing the secret) is high'));
    expect(pattern).toBe('brute_force');
    expect(insights[0]).toBe(`Brute-force attempt: ${evidence.authFailures} of ${evidence.judgedRequests} requests in ${evidence.windowMinutes} min failed authentication (401).`);
    expect(insights[0]).toContain('200 of 240 requests in 10 min');
    expect(evidence.distinctIps).toBe(1);
    expect(insights).toContain('All the failures came from a single IP address.');
    // 40 requests succeeded: not the stale-secret picture, so no such caveat.
    expect(insights.join(' ')).not.toMatch(/rotated/);
  });

  it('adds the stale-secret explanation only when every request from one address fails', () => {
    const window = keyWindow(spread(100, TEN_MINUTES_AGO, 10 * MINUTE, { status: 401 }));
    const { pattern, insights, evidence } = explain('high_failure_rate', ruleFinding('high_failure_rate', window, T0));
    expect(pattern).toBe('brute_force');
    expect(evidence).toMatchObject({ authFailures: 100, judgedRequests: 100, distinctIps: 1 });
    expect(insights[0]).toContain('100 of 100 requests');
    expect(insights[2]).toMatch(/old deployment still using the previous secret/);
    // Every request fails, but from 20 addresses: not one deployment's usual traffic.
    const spreadOut = keyWindow(spread(100, TEN_MINUTES_AGO, 10 * MINUTE, (i) => ({ status: 401, ip: `198.18.${i % 20}.9` })));
    const many = explain('high_failure_rate', ruleFinding('high_failure_rate', spreadOut, T0));
    expect(many.evidence).toMatchObject({ authFailures: 100, judgedRequests: 100, distinctIps: 20 });
    expect(many.insights).toEqual([
      'Brute-force attempt: 100 of 100 requests in 10 min failed authentication (401).',
      'The failures came from 20 IP addresses in 20 networks.',
    ]);
  });

  it('names probing for missing resources, the paths and the most requested one', () => {
    const { pattern, insights, evidence } = explain(
      'high_failure_rate',
      fixtureFinding('high_failure_rate', 'probing session ids: 60 of 100 requests are 404 on distinct ids is medium, with the probed paths'),
    );
    expect(pattern).toBe('resource_probing');
    expect(insights[0]).toBe(`Probing for missing resources: ${evidence.notFound} of ${evidence.judgedRequests} requests in 10 min asked for resources that do not exist (404) on 3 paths.`);
    const top = evidence.topNotFoundPaths[0];
    expect(insights[1]).toBe(`Most requested missing path: ${top.path} (${top.count} times).`);
  });

  it('says "more than 5 paths" only when the 404s go beyond the paths the evidence lists', () => {
    const window = keyWindow([
      ...spread(20, TEN_MINUTES_AGO, 10 * MINUTE, { status: 200 }),
      ...spread(80, TEN_MINUTES_AGO, 10 * MINUTE, (i) => ({ method: 'GET', path: `/v1/verify/sessions/ses_${i}`, status: 404, ip: `198.18.${i % 4}.9` })),
    ]);
    const { insights, evidence } = explain('high_failure_rate', ruleFinding('high_failure_rate', window, T0));
    expect(evidence.topNotFoundPaths).toHaveLength(5);
    expect(insights[0]).toContain('80 of 100 requests in 10 min asked for resources that do not exist (404), across more than 5 paths.');
    expect(insights).toContain(`The failures came from ${evidence.distinctIps} IP addresses in ${evidence.distinctNetworks} networks.`);
    expect(evidence.distinctNetworks).toBe(4);
  });
});

describe('insights of velocity_attack', () => {
  it('names a scripted flood: times the limit, minutes over, peak, and one source', () => {
    const { pattern, insights, evidence } = explain('velocity_attack', fixtureFinding('velocity_attack', 'sustained 840 requests/min for five minutes on a limit of 60 is critical'));
    expect(pattern).toBe('single_source_flood');
    expect(insights[0]).toBe(
      `Scripted request flood: ${evidence.sustainedRatio}x the key's limit of ${evidence.limitPerMinute}/min, held in ${evidence.minutesOver} of the last ${evidence.windowMinutes + 1} minutes (peak ${evidence.observedRequestsPerMinute}/min).`,
    );
    expect(insights[0]).toContain('14x the key\'s limit of 60/min');
    expect(insights[1]).toMatch(/^It all came from a single IP address/);
  });

  it('calls a flood from many networks distributed, with its IPs, networks and countries', () => {
    const countries = ['BR', 'RU', 'IN', 'VN', 'NG'];
    const window = keyWindow(
      [0, 1, 2].flatMap((m) => spread(300, T0 - (3 - m) * MINUTE, MINUTE, (i) => ({ ip: `198.18.${i % 6}.${10 + (i % 12)}`, country: countries[i % 5], geo: undefined }))),
    );
    const { pattern, insights, evidence } = explain('velocity_attack', ruleFinding('velocity_attack', window, T0));
    expect(pattern).toBe('distributed_flood');
    expect(evidence).toMatchObject({ distinctIps: 12, distinctNetworks: 6 });
    expect(insights[1]).toBe(`Distributed: it came from 12 IP addresses in 6 networks and ${evidence.countries.length} countries, so blocking one address will not stop it.`);
  });

  it('makes no distributed claim for two networks (a client with IPv4 and IPv6, say)', () => {
    const window = keyWindow(perMinute([200, 200, 200], T0 - 3 * MINUTE).map((spec, i) => ({ ...spec, ip: i % 2 ? '2001:db8:1:2::7' : '198.51.100.10' })));
    const { pattern, insights } = explain('velocity_attack', ruleFinding('velocity_attack', window, T0));
    expect(pattern).toBe('request_flood');
    expect(insights[1]).toBe('The requests came from 2 IP addresses in 2 networks.');
  });
});

describe('insights of bot_traffic', () => {
  it('names a known attack tool, what it is, and whether it got answers', () => {
    const { pattern, insights, evidence } = explain('bot_traffic', fixtureFinding('bot_traffic', 'a Nikto scan among ordinary traffic is critical'));
    expect(pattern).toBe('attack_tool');
    expect(insights[0]).toBe(`Known attack tool: Nikto (vulnerability scanner) probed the API with this key (${evidence.requests} requests in 10 min).`);
    expect(evidence.succeeded).toBe(0);
    expect(insights[1]).toBe('None of its requests succeeded so far.');
    expect(insights[2]).toMatch(/penetration test/);
  });

  it('names several tools, each with what it is, and the answered requests', () => {
    const { insights, evidence } = explain('bot_traffic', fixtureFinding('bot_traffic', 'attack tools by their default user agents: ffuf, Nuclei, zgrab, THC Hydra'));
    expect(insights[0]).toMatch(/^Known attack tools: ffuf \(path fuzzer\), Nuclei \(vulnerability scanner\), zgrab \(network scanner\) and 1 more probed/);
    expect(insights[1]).toBe(`The API answered ${evidence.succeeded} of its requests with success.`);
  });

  it('names headless-browser scraping and enumeration of ids that do not exist', () => {
    const headless = explain('bot_traffic', fixtureFinding('bot_traffic', 'HeadlessChrome walking 60 session ids is medium'));
    expect(headless.pattern).toBe('headless_scraping');
    expect(headless.insights).toEqual([`Headless-browser scraping: HeadlessChrome fetched ${headless.evidence.distinctResources} distinct resources in 10 min (60 requests).`]);
    const walking = explain('bot_traffic', fixtureFinding('bot_traffic', 'PhantomJS walking ids that mostly do not exist (404) is high'));
    expect(walking.insights[1]).toBe('100% of them were not found (404): it is walking through ids that do not exist.');
    expect(explain('bot_traffic', fixtureFinding('bot_traffic', 'Scrapy walking 200 session ids is high')).pattern).toBe('scraping');
  });

  it('never copies a raw user agent, however long', () => {
    const userAgent = `Mozilla/5.0 (X11; Linux x86_64) sqlmap/1.8.2#stable (https://sqlmap.org) ${'x'.repeat(400)}`;
    const window = keyWindow(spread(3, T0 - MINUTE, MINUTE, { userAgent }));
    const { insights, evidence } = explain('bot_traffic', ruleFinding('bot_traffic', window, T0));
    expect(evidence.userAgents).toEqual([userAgent]);
    expect(insights.join(' ')).not.toContain('Mozilla');
    expect(insights[0]).toMatch(/^Known attack tool: sqlmap \(SQL injection tool\)/);
  });
});

describe('insights of credential_sharing', () => {
  it('names a key in several hands: networks, IPs, countries against its own baseline', () => {
    const { pattern, insights, evidence } = explain(
      'credential_sharing',
      fixtureFinding('credential_sharing', 'a key that lived in one network now used from 13 networks in 6 countries is high'),
    );
    expect(pattern).toBe('shared_key');
    expect(insights[0]).toBe(
      `Key in several hands: used from ${evidence.recentNetworks} networks (${evidence.distinctIps} IP addresses) in ${evidence.distinctCountries} countries (BR, IN, NG, RU, US and 1 more) in 10 min.`,
    );
    expect(insights[1]).toBe(`It usually calls from ${evidence.baselineNetworks} network per 10 min: it now looks shared by several parties.`);
  });

  it('names a leaked or published key, and says there was nothing to compare with', () => {
    const { pattern, insights, evidence } = explain('credential_sharing', fixtureFinding('credential_sharing', 'a published key: 60 networks in 12 countries with no history is critical'));
    expect(pattern).toBe('leaked_key');
    expect(insights[0]).toMatch(new RegExp(`^Leaked or published key: used from ${evidence.recentNetworks} networks .* in 12 countries`));
    expect(insights[1]).toBe(`It has no earlier use in the last ${evidence.windowMinutes} min to compare with: the key may be new, or newly exposed.`);
  });
  it('explains a test key\'s finding as the rule judged it, and says last that it is a test key', () => {
    const published = fixtureFinding('credential_sharing', 'a published key: 60 networks in 12 countries with no history is critical');
    const asTestKey = testKeyFinding(published, 'low');
    const { pattern, insights } = explain('credential_sharing', asTestKey);
    expect(asTestKey.severity).toBe('low');
    expect(pattern).toBe('leaked_key');
    expect(insights).toEqual([...explain('credential_sharing', published).insights.slice(0, MAX_INSIGHTS - 1), TEST_KEY_INSIGHT]);
    // Not lowered (its ceiling is critical): marked all the same.
    expect(explain('credential_sharing', testKeyFinding(published, 'critical')).insights.at(-1)).toBe(TEST_KEY_INSIGHT);
  });

  it('quotes a leak growing over the window with the window\'s new networks, countries and minutes', () => {
    const { pattern, insights, evidence } = explain(
      'credential_sharing',
      fixtureFinding('credential_sharing', 'a key leaked gradually (2, 3, 4, 5, 6, 7 never-seen networks per 10 min, 9 countries) beside its own network is reported'),
    );
    expect(evidence).toMatchObject({ trigger: 'window', windowNewNetworks: 27, newNetworks: 7, windowMinutes: 60 });
    expect(pattern).toBe('shared_key');
    expect(insights).toEqual([
      `Key in several hands: used from 27 new networks in 9 countries (${evidence.windowCountries.slice(0, 5).join(', ')} and 4 more) in 60 min.`,
      'New parties keep joining: 7 new networks in the last 10 min alone.',
      `It usually calls from ${evidence.baselineNetworks} networks per 10 min: it now looks shared by several parties.`,
    ]);
  });
});

describe('insights of impossible_travel', () => {
  it('names both places, the gap, the distance and the speed', () => {
    const { pattern, insights, evidence } = explain('impossible_travel', fixtureFinding('impossible_travel', 'us-east then Moscow three minutes later is high'));
    expect(pattern).toBe('impossible_travel');
    expect(insights).toEqual([
      `Impossible travel: used in Ashburn, US and ${evidence.gapMinutes} min later in Moscow, RU, ${figure(evidence.adjustedDistanceKm)} km apart (${figure(evidence.speedKmh)} km/h): likely a stolen or shared key.`,
    ]);
  });

  it('says simultaneous use, not a speed, for a hop within a minute', () => {
    const { insights, evidence } = explain('impossible_travel', fixtureFinding('impossible_travel', 'us-east then Moscow 5 seconds later is simultaneous use, said as such rather than as millions of km/h'));
    expect(insights[0]).toBe(`Impossible travel: used in Ashburn, US and less than a minute later in Moscow, RU, ${figure(evidence.adjustedDistanceKm)} km apart (simultaneous use): likely a stolen or shared key.`);
  });

  it('says when a VPN or GeoIP could explain a medium hop, and counts hops across countries', () => {
    const medium = explain(
      'impossible_travel',
      fixtureFinding('impossible_travel', 'Frankfurt, then Madrid 50 minutes later (about 1,600 km/h) is medium: fast, but GeoIP or a VPN could explain it'),
    );
    expect(medium.insights[1]).toBe(`At ${figure(medium.evidence.speedKmh)} km/h, a VPN exit or an imprecise GeoIP location could also explain it.`);
    const many = explain('impossible_travel', fixtureFinding('impossible_travel', 'São Paulo, Frankfurt and Singapore within ten minutes of a key established in us-east is critical (three new countries)'));
    expect(many.insights[1]).toBe('3 such hops across 4 countries (BR, DE, SG and US): the key is in use in several places at once.');
  });
});

describe('plain insights where the evidence supports no sharper pattern', () => {
  // Evidence as a minimal or older producer leaves it: no figure to quote.
  const bare = { sampleEventIds: ['e1'], windowMs: 60_000 };

  it.each([
    ['high_failure_rate', 'failed_requests'],
    ['velocity_attack', 'request_flood'],
    ['bot_traffic', 'automation'],
    ['credential_sharing', 'shared_key'],
    ['impossible_travel', 'impossible_travel'],
  ] as const)('%s gives a plain %s line and quotes no figure', (type, pattern) => {
    const explained = explainAlert({ type, severity: 'high', evidence: bare });
    expect(explained.pattern).toBe(pattern);
    expect(explained.insights).toHaveLength(1);
    expect(explained.insights[0]).not.toMatch(/\d/);
  });

  it('ignores malformed figures instead of quoting them', () => {
    const insights = alertInsights({ type: 'high_failure_rate', severity: 'medium', evidence: { authFailures: 'many', judgedRequests: -3, notFound: null } });
    expect(insights).toHaveLength(1);
    expect(insights[0]).not.toMatch(/\d/);
  });

  it('judges an alert without a category by its tools\' names', () => {
    expect(explainAlert(testAlert(T0)).pattern).toBe('attack_tool');
  });
});

describe('every finding of every fixture', () => {
  it('gets at most 3 lines of at most 200 characters', () => {
    for (const type of ANOMALY_TYPES) {
      for (const fixture of FIXTURES[type].filter((f) => f.kind === 'positive')) {
        const insights = alertInsights({ type, severity: fixture.expect.severity ?? 'medium', evidence: ruleFinding(type, fixture.window, fixture.now, fixture.params).evidence });
        expect(insights.length, fixture.name).toBeGreaterThan(0);
        expect(insights.length, fixture.name).toBeLessThanOrEqual(MAX_INSIGHTS);
        for (const insight of insights) expect(insight.length, insight).toBeLessThanOrEqual(200);
      }
    }
  });
});

describe('withInsightsShown', () => {
  it('keeps stored insights, derives missing ones when on, and removes them when off', () => {
    const stored = testAlert(T0, { aiInsights: ['stored line'] });
    expect(withInsightsShown(stored, true).aiInsights).toEqual(['stored line']);
    const bare = testAlert(T0);
    expect(withInsightsShown(bare, true).aiInsights).toEqual(alertInsights(bare));
    expect(withInsightsShown(stored, false)).not.toHaveProperty('aiInsights');
  });
});
