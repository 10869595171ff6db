/**
 * AI insights of an alert (FEATURE_AI_RISK_SCORING, contracts section 2): the attack pattern behind
 * it, named in words a Business admin understands, with the figures of its evidence that support it.
 * These are fixed rules over the evidence each rule records (rules/*.ts), not a trained model. Every
 * figure is read from the evidence; when the evidence lacks what a sharper pattern needs, the insight
 * stays plain. At most MAX_INSIGHTS lines, each at most MAX_LINE_CHARS; no raw user agent is copied
 * (tools are named by the rule's own short names).
 */
import { USER_AGENT_PATTERNS } from '../../rules/bot_traffic.ts';
import { JUDGED_ACROSS_KEYS, SEVERITIES, type Severity } from '../detect/types.ts';
import type { Alert } from './alert.ts';
import { figure, line, listed, percent, plural, quoted, readEvidence, type EvidenceReader } from './insight-text.ts';

export const MAX_INSIGHTS = 3;

/** The patterns an alert can show; the dashboard groups keys by them. */
export const ATTACK_PATTERNS = {
  attack_tool: 'Known attack tools',
  leaked_key: 'Signs of a leaked or published key',
  brute_force: 'Brute-force attempts',
  credential_stuffing: 'Credential stuffing across keys',
  impossible_travel: 'Impossible travel',
  distributed_flood: 'Distributed request floods',
  shared_key: 'Signs of a shared key',
  resource_probing: 'Probing for missing resources',
  headless_scraping: 'Headless-browser scraping',
  scraping: 'Scraping',
  single_source_flood: 'Request floods from one network',
  request_flood: 'Request floods',
  failed_requests: 'Unusual failure rates',
  automation: 'Automated clients',
} as const;
export type AttackPattern = keyof typeof ATTACK_PATTERNS;

export type AlertFacts = Pick<Alert, 'type' | 'severity' | 'evidence'>;

export interface Explanation {
  pattern: AttackPattern;
  insights: string[];
}

/** The last line of a test key's insights (src/detect/test-keys.ts). */
export const TEST_KEY_INSIGHT =
  'This is a test key: it reaches only mock verifications with fake data, so nothing real is at risk, but a stranger using it suggests the merchant\'s keys have leaked.';
/** The last line of the insights of credential stuffing in which the merchant's keys are all test keys. */
export const TEST_KEYS_INSIGHT =
  'The merchant\'s keys it tried are all test keys: they reach only mock verifications with fake data, so nothing real is at risk, but a stranger holding them suggests the merchant\'s keys have leaked.';

export function explainAlert(alert: AlertFacts): Explanation {
  const evidence = readEvidence(alert.evidence);
  const testKey = evidence.text('keyEnvironment') === 'test';
  // A test key's finding lowered to its ceiling is explained as the rule judged it; its last line says why it is reported lower.
  const judged = SEVERITIES.find((severity) => severity === evidence.text('judgedSeverity'));
  const explained = EXPLAIN[alert.type](evidence, testKey && judged ? judged : alert.severity);
  const testKeyInsight = evidence.text('judgedBy') === JUDGED_ACROSS_KEYS ? TEST_KEYS_INSIGHT : TEST_KEY_INSIGHT;
  const insights = testKey ? [...explained.insights.slice(0, MAX_INSIGHTS - 1), testKeyInsight] : explained.insights.slice(0, MAX_INSIGHTS);
  return { pattern: explained.pattern, insights: insights.map(line) };
}

export function alertInsights(alert: AlertFacts): string[] {
  return explainAlert(alert).insights;
}

/**
 * The alert as a reader of the admin API sees it: with FEATURE_AI_RISK_SCORING on, with insights
 * (those stored with it, or derived now for an alert stored while the flag was off); off, without.
 */
export function withInsightsShown(alert: Alert, enabled: boolean): Alert {
  if (!enabled) return withoutInsights(alert);
  return alert.aiInsights ? alert : { ...alert, aiInsights: alertInsights(alert) };
}

export function withoutInsights(alert: Alert): Alert {
  if (!('aiInsights' in alert)) return alert;
  const { aiInsights: _insights, ...rest } = alert;
  return rest;
}

type Explain = (evidence: EvidenceReader, severity: Severity) => Explanation;

const EXPLAIN: Record<Alert['type'], Explain> = {
  high_failure_rate: explainFailures,
  velocity_attack: explainVelocity,
  bot_traffic: explainBot,
  credential_sharing: explainSharing,
  impossible_travel: explainTravel,
};

/** " in 10 min", or nothing when the evidence does not say. */
function within(minutes: number | undefined): string {
  return minutes === undefined ? '' : ` in ${figure(minutes)} min`;
}

/** Where the failing or flooding requests came from, when the evidence counts it. */
function sources(what: 'failures' | 'requests', ips: number | undefined, networks: number | undefined): string | undefined {
  if (ips === undefined) return undefined;
  if (ips === 1) return `All the ${what} came from a single IP address.`;
  const inNetworks = networks === undefined ? '' : ` in ${plural(networks, 'network')}`;
  return `The ${what} came from ${figure(ips)} IP addresses${inNetworks}.`;
}

function explainFailures(evidence: EvidenceReader): Explanation {
  if (evidence.text('judgedBy') === JUDGED_ACROSS_KEYS) return explainStuffing(evidence);
  const auth = evidence.count('authFailures');
  const notFound = evidence.count('notFound');
  const judged = evidence.count('judgedRequests');
  const window = within(evidence.count('windowMinutes'));
  const ips = evidence.count('distinctIps');
  const from = sources('failures', ips, evidence.count('distinctNetworks'));
  const insights: string[] = [];

  if (auth !== undefined && auth > 0 && judged !== undefined && auth >= (notFound ?? 0)) {
    insights.push(`Brute-force attempt: ${figure(auth)} of ${figure(judged)} requests${window} failed authentication (401).`);
    if (from) insights.push(from);
    // A deployment still calling with a rotated secret fails every request, from its usual address.
    if (auth === judged && ips === 1) {
      insights.push('If this key\'s secret was rotated recently, an old deployment still using the previous secret fails the same way.');
    }
    return { pattern: 'brute_force', insights };
  }

  if (notFound !== undefined && notFound > 0 && judged !== undefined) {
    const paths = evidence.items('topNotFoundPaths').flatMap((item) => {
      const path = item.text('path');
      const count = item.count('count');
      return path !== undefined && count !== undefined ? [{ path, count }] : [];
    });
    const listedCount = paths.reduce((sum, p) => sum + p.count, 0);
    // The rule lists the 5 most requested paths; 404s beyond them mean more paths than listed.
    const spread =
      paths.length >= 5 && listedCount < notFound
        ? `, across more than ${paths.length} paths`
        : paths.length > 0 && listedCount === notFound
          ? ` on ${plural(paths.length, 'path')}`
          : '';
    insights.push(`Probing for missing resources: ${figure(notFound)} of ${figure(judged)} requests${window} asked for resources that do not exist (404)${spread}.`);
    const top = paths[0];
    if (top) insights.push(`Most requested missing path: ${quoted(top.path)} (${plural(top.count, 'time')}).`);
    if (from) insights.push(from);
    return { pattern: 'resource_probing', insights };
  }

  const share = evidence.count('observedShare');
  insights.push(
    share === undefined
      ? 'Unusually many of this key\'s requests were refused; the evidence does not say whether by authentication or as not found.'
      : `Unusually many of this key's requests were refused: ${percent(share)}${window}.`,
  );
  return { pattern: 'failed_requests', insights };
}

/** One network failing authentication with many keys (source-spray.ts): an alert about the network, not a key. */
function explainStuffing(evidence: EvidenceReader): Explanation {
  const keys = evidence.count('distinctKeys');
  const yours = evidence.count('merchantKeyCount');
  const window = within(evidence.count('windowMinutes'));
  const network = evidence.text('network');
  const insights = [
    keys === undefined
      ? 'Credential stuffing: one network failed authentication with many API keys.'
      : `Credential stuffing: ${network ? `${network} ` : 'one network '}failed authentication with ${plural(keys, 'API key')}${window}${yours === undefined ? '' : `, ${figure(yours)} of them yours`}.`,
    'A list of stolen or guessed keys is being tried: no one key\'s own traffic shows it.',
  ];
  const from = sources('failures', evidence.strings('ips').length || undefined, undefined);
  if (from) insights.push(from);
  return { pattern: 'credential_stuffing', insights };
}

function explainVelocity(evidence: EvidenceReader): Explanation {
  const sustained = evidence.count('sustainedRatio');
  const limit = evidence.count('limitPerMinute');
  const peak = evidence.count('observedRequestsPerMinute');
  const minutesOver = evidence.count('minutesOver');
  const windowMinutes = evidence.count('windowMinutes');
  const ips = evidence.count('distinctIps');
  const networks = evidence.count('distinctNetworks');
  // The rule keeps at most 10 countries: 10 means "10 or more".
  const countries = evidence.strings('countries').length;
  const pattern: AttackPattern =
    networks === undefined ? 'request_flood' : networks >= 3 ? 'distributed_flood' : networks === 1 ? 'single_source_flood' : 'request_flood';

  const insights: string[] = [];
  if (sustained !== undefined && limit !== undefined) {
    const held =
      minutesOver === undefined
        ? ''
        : windowMinutes === undefined
          ? `, held for ${plural(minutesOver, 'minute')}`
          : `, held in ${figure(minutesOver)} of the last ${figure(windowMinutes + 1)} minutes`;
    const top = peak === undefined ? '' : ` (peak ${figure(peak)}/min)`;
    insights.push(`Scripted request flood: ${figure(sustained)}x the key's limit of ${figure(limit)}/min${held}${top}.`);
  } else {
    insights.push('Request flood: this key sent well above its rate limit for several minutes.');
  }
  if (pattern === 'distributed_flood') {
    const inCountries = countries >= 10 ? ' and 10 or more countries' : countries >= 2 ? ` and ${figure(countries)} countries` : '';
    insights.push(
      `Distributed: it came from ${ips === undefined ? 'many IP addresses' : `${figure(ips)} IP addresses`} in ${figure(networks!)} networks${inCountries}, so blocking one address will not stop it.`,
    );
  } else if (pattern === 'single_source_flood') {
    const who = ips === 1 ? 'a single IP address' : ips === undefined ? 'one network' : `${figure(ips)} IP addresses in one network`;
    insights.push(`It all came from ${who}: one client, a script or an integration stuck in a retry loop.`);
  } else if (ips !== undefined) {
    insights.push(sources('requests', ips, networks)!);
  }
  return { pattern, insights };
}

/** What each attack tool of rules/bot_traffic.ts is, for an admin who does not know the name. */
const TOOL_KINDS: Record<string, string> = {
  sqlmap: 'SQL injection tool',
  Havij: 'SQL injection tool',
  commix: 'command injection tool',
  'THC Hydra': 'password brute-forcer',
  Metasploit: 'exploitation framework',
  ...Object.fromEntries(['zgrab', 'masscan', 'Nmap', 'ZMap'].map((name) => [name, 'network scanner'])),
  ...Object.fromEntries(['DirBuster', 'gobuster', 'feroxbuster', 'ffuf', 'wfuzz'].map((name) => [name, 'path fuzzer'])),
};

function toolCategory(name: string): string | undefined {
  return USER_AGENT_PATTERNS.find((pattern) => pattern.name === name)?.category;
}

function explainBot(evidence: EvidenceReader): Explanation {
  const tools = evidence.counts('tools');
  const names = tools.map(([name]) => name);
  // The category is in the evidence; an older alert without it is judged by its tools' names.
  const category =
    evidence.text('category') ?? (names.some((name) => toolCategory(name) === 'attack_tool') ? 'attack_tool' : names.length > 0 ? 'automation' : undefined);
  const requests = evidence.count('requests');
  const window = within(evidence.count('windowMinutes'));

  if (category === 'attack_tool' && names.length > 0) {
    const described = names.map((name) => {
      const kind = TOOL_KINDS[name] ?? (toolCategory(name) === 'attack_tool' ? 'vulnerability scanner' : undefined);
      return kind ? `${quoted(name, 30)} (${kind})` : quoted(name, 30);
    });
    const volume = requests === undefined ? '' : ` (${plural(requests, 'request')}${window})`;
    const insights = [`Known attack tool${names.length > 1 ? 's' : ''}: ${listed(described)} probed the API with this key${volume}.`];
    const succeeded = evidence.count('succeeded');
    if (succeeded !== undefined) {
      insights.push(succeeded === 0 ? 'None of its requests succeeded so far.' : `The API answered ${figure(succeeded)} of its requests with success.`);
    }
    insights.push('Unless the merchant is running a penetration test, treat the key as compromised.');
    return { pattern: 'attack_tool', insights };
  }

  const resources = evidence.count('distinctResources');
  if (category === 'automation' && names.length > 0 && resources !== undefined) {
    const headless = names.some((name) => toolCategory(name) === 'headless');
    const volume = requests === undefined ? '' : ` (${plural(requests, 'request')})`;
    const insights = [
      `${headless ? 'Headless-browser scraping' : 'Scraping'}: ${listed(names.map((name) => quoted(name, 30)))} fetched ${figure(resources)} distinct resources${window}${volume}.`,
    ];
    const notFoundShare = evidence.count('notFoundShare');
    if (notFoundShare !== undefined && notFoundShare >= 0.5) {
      insights.push(`${percent(notFoundShare)} of them were not found (404): it is walking through ids that do not exist.`);
    }
    return { pattern: headless ? 'headless_scraping' : 'scraping', insights };
  }

  return { pattern: 'automation', insights: ['An automated client (its user agent names a bot or a scanning tool) is using this key.'] };
}

function explainSharing(evidence: EvidenceReader, severity: Severity): Explanation {
  // A finding over the whole window (a leak growing interval by interval) is quoted with the window's
  // new networks, countries and minutes; the last interval's figures alone would understate it.
  const byWindow = evidence.text('trigger') === 'window';
  const networks = evidence.count(byWindow ? 'windowNewNetworks' : 'recentNetworks');
  const countries = evidence.strings(byWindow ? 'windowCountries' : 'countries');
  const listedCountries = countries.length > 0 ? countries.length : undefined;
  const countryCount = byWindow ? listedCountries : (evidence.count('distinctCountries') ?? listedCountries);
  // distinctIps counts the last interval's addresses: quoted only beside that interval's networks.
  const ips = byWindow ? undefined : evidence.count('distinctIps');
  const interval = within(evidence.count(byWindow ? 'windowMinutes' : 'intervalMinutes'));
  // The rule's critical band is a key used from so many networks and countries that it is public.
  const pattern: AttackPattern = severity === 'critical' ? 'leaked_key' : 'shared_key';
  if (networks === undefined || countryCount === undefined) {
    return { pattern, insights: ['This key is used from many more networks and countries than usual: it looks shared or leaked.'] };
  }

  const addresses = ips === undefined ? '' : ` (${plural(ips, 'IP address', 'IP addresses')})`;
  const named = countries.length > 0 ? ` (${listed(countries.map((c) => quoted(c, 10)), 5)})` : '';
  const lead = pattern === 'leaked_key' ? 'Leaked or published key' : 'Key in several hands';
  const fresh = byWindow ? ' new' : '';
  const insights = [`${lead}: used from ${figure(networks)}${fresh} networks${addresses} in ${plural(countryCount, 'country', 'countries')}${named}${interval}.`];
  if (byWindow) {
    const recent = evidence.count('newNetworks');
    const perInterval = evidence.count('intervalMinutes');
    if (recent !== undefined && perInterval !== undefined) insights.push(`New parties keep joining: ${plural(recent, 'new network')} in the last ${figure(perInterval)} min alone.`);
  }

  const baseline = evidence.count('baselineNetworks');
  const baselineIntervals = evidence.count('baselineIntervals');
  const perInterval = evidence.count('intervalMinutes');
  const windowMinutes = evidence.count('windowMinutes');
  if (baselineIntervals === 0 && windowMinutes !== undefined) {
    insights.push(`It has no earlier use in the last ${figure(windowMinutes)} min to compare with: the key may be new, or newly exposed.`);
  } else if (baseline !== undefined && perInterval !== undefined) {
    insights.push(`It usually calls from ${plural(baseline, 'network')} per ${figure(perInterval)} min: it now looks shared by several parties.`);
  }
  return { pattern, insights };
}

/** "Moscow, RU", or the country, or the address, as the evidence has it. */
function placeOf(point: EvidenceReader): string | undefined {
  const city = point.text('city');
  const country = point.text('country');
  const name = city && country ? `${city}, ${country}` : (city ?? country ?? point.text('ip'));
  return name === undefined ? undefined : quoted(name, 40);
}

function explainTravel(evidence: EvidenceReader, severity: Severity): Explanation {
  const from = placeOf(evidence.nested('from'));
  const to = placeOf(evidence.nested('to'));
  const speed = evidence.count('speedKmh');
  const gap = evidence.count('gapMinutes');
  const km = evidence.count('adjustedDistanceKm');
  if (from === undefined || to === undefined || speed === undefined) {
    return { pattern: 'impossible_travel', insights: ['This key was used from two places too far apart to travel between in the time between the requests.'] };
  }

  const later = gap === undefined ? 'then' : gap < 1 ? 'less than a minute later' : `${figure(gap)} min later`;
  const apart = km === undefined ? '' : `, ${figure(km)} km apart`;
  const pace = gap !== undefined && gap < 1 ? 'simultaneous use' : `${figure(speed)} km/h`;
  const insights = [`Impossible travel: used in ${from} and ${later} in ${to}${apart} (${pace}): likely a stolen or shared key.`];
  // The rule rates a hop medium when it is fast but a VPN exit or GeoIP error could explain it.
  if (severity === 'medium') insights.push(`At ${figure(speed)} km/h, a VPN exit or an imprecise GeoIP location could also explain it.`);
  const hops = evidence.count('impossibleHops');
  const countries = evidence.strings('countries');
  if (hops !== undefined && hops > 1 && countries.length >= 3) {
    insights.push(`${figure(hops)} such hops across ${countries.length} countries (${listed(countries.map((c) => quoted(c, 10)), 5)}): the key is in use in several places at once.`);
  }
  return { pattern: 'impossible_travel', insights };
}
