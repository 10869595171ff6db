/**
 * bot_traffic: the user agent says what is calling, and some callers have no business holding a key.
 *   - attack tools (scanners, fuzzers, brute forcers) alert at once: one request suffices; critical,
 *     action block. Someone is pointing an offensive tool at the API with this merchant's key.
 *   - headless browsers and scrapers alert only when they ENUMERATE: at least minDistinctResources
 *     distinct paths (resource ids) in the window, or at least minAutomationReads reads (GET, HEAD)
 *     whatever their paths (a fleet that sends route templates, /v1/verify/sessions/:id, as
 *     contracts section 1 asks, shows every session read as one path); medium (investigate), high
 *     (rate_limit) from highDistinctResources or highAutomationReads, or when most of their
 *     requests hit 404 (walking ids that do not exist).
 *   - ordinary HTTP libraries (curl, python-requests, axios, okhttp, Go-http-client, Java, node-fetch,
 *     undici, Ruby, Guzzle, .NET) are how server-side integrations call an API: never an alert.
 *   - an empty user agent is common for hand-written server clients: never an alert by itself.
 * The patterns are data (USER_AGENT_PATTERNS), checked in order, attack tools first; a tool's name
 * counts only as a token of the user agent, never inside a longer word (a product's name), and a tool
 * whose name is also a product's word (Nuclei, Wapiti, commix) counts only in the forms it sends: its
 * name with "/" and a version, or its project's marker. There is no "good bot" list: a crawler's
 * reputation says nothing about whether it should hold an API key.
 */
import { DistinctValues, entryAdded, entryRemoved, FORGOTTEN, MinuteRing, minuteOf, NO_EVENTS } from '../src/detect/tallies.ts';
import type { Finding, RuleDefinition, Severity, WindowEvent } from '../src/detect/types.ts';

export type UserAgentCategory = 'attack_tool' | 'headless' | 'scraper';

export interface UserAgentPattern {
  name: string;
  pattern: RegExp;
  category: UserAgentCategory;
}

/**
 * A tool's name as a token of the user agent, case-insensitive: a letter right before or after it
 * means a longer word, an ordinary product's name ("BusinessUserSync" is not Nessus, "Burpple" not
 * Burp Suite, "Arachnid" not Arachni, "NucleiCount" not Nuclei), and so does a hyphen joining it to
 * another word ("Nmap-Parser/1.2", "python-nmap-report/1.0" and "Nuclei-Sync/2.0" are products
 * built around a tool, not the tool). Anything else around it (start or end, a space, "/", "_",
 * "(", a digit, a hyphen before a digit) is a token's edge, as in "Nikto/2.5.0",
 * "DirBuster-1.0-RC1" or "acunetix_wvs_security_test". An attack tool is critical on a single
 * request: its name must be the product's, not part of someone else's.
 */
function token(names: string): RegExp {
  return new RegExp(`(?<![a-z]|[a-z]-)(?:${names})(?![a-z]|-[a-z])`, 'i');
}

/**
 * A tool whose name a product may also take as a word ("Nuclei Health/1.0", "Commix SDK/2.1",
 * "MyApp (wapiti)") is matched only in the forms the tool itself sends: its name followed by "/" and
 * a version ("nuclei/3.3.7", "Wapiti/3.2.0", "commix/v3.9-stable"), or a marker of its project (its
 * site or GitHub owner, as in "github.com/projectdiscovery/nuclei"), each as a token.
 */
function toolForms(name: string, markers: string): RegExp {
  return token(`${name}/v?\\d|${markers}`);
}

/** Default user agents of the tools; case-insensitive. Add a line to add a tool. */
export const USER_AGENT_PATTERNS: readonly UserAgentPattern[] = [
  { name: 'sqlmap', pattern: token('sqlmap'), category: 'attack_tool' },
  { name: 'Nikto', pattern: token('nikto'), category: 'attack_tool' },
  { name: 'Nuclei', pattern: toolForms('nuclei', 'projectdiscovery'), category: 'attack_tool' },
  { name: 'zgrab', pattern: token('zgrab'), category: 'attack_tool' },
  { name: 'masscan', pattern: token('masscan'), category: 'attack_tool' },
  { name: 'Nmap', pattern: token('nmap'), category: 'attack_tool' },
  { name: 'ZMap', pattern: token('zmap'), category: 'attack_tool' },
  { name: 'DirBuster', pattern: token('dirbuster'), category: 'attack_tool' },
  { name: 'gobuster', pattern: token('gobuster'), category: 'attack_tool' },
  { name: 'feroxbuster', pattern: token('feroxbuster'), category: 'attack_tool' },
  { name: 'ffuf', pattern: token('ffuf|fuzz faster u fool'), category: 'attack_tool' },
  { name: 'wfuzz', pattern: token('wfuzz'), category: 'attack_tool' },
  { name: 'Acunetix', pattern: token('acunetix'), category: 'attack_tool' },
  { name: 'Nessus', pattern: token('nessus'), category: 'attack_tool' },
  // OpenVAS scans as "OpenVAS-VT" (older) or "Greenbone OS" (its current user agent).
  { name: 'OpenVAS', pattern: token('openvas(?:-vt)?|greenbone os'), category: 'attack_tool' },
  { name: 'w3af', pattern: token('w3af'), category: 'attack_tool' },
  { name: 'Burp Suite', pattern: token('burp(?:[ _-]?suite|collaborator)?'), category: 'attack_tool' },
  // THC Hydra sends "Mozilla/4.0 (Hydra)"; a bare "hydra" would also match Ory Hydra, an OAuth server.
  { name: 'THC Hydra', pattern: /\(hydra\)|thc-hydra/i, category: 'attack_tool' },
  { name: 'ZmEu', pattern: token('zmeu'), category: 'attack_tool' },
  { name: 'WPScan', pattern: token('wpscan'), category: 'attack_tool' },
  { name: 'Arachni', pattern: token('arachni'), category: 'attack_tool' },
  { name: 'Netsparker', pattern: token('netsparker|invicti'), category: 'attack_tool' },
  { name: 'Wapiti', pattern: toolForms('wapiti', 'wapiti-scanner'), category: 'attack_tool' },
  { name: 'skipfish', pattern: token('skipfish'), category: 'attack_tool' },
  { name: 'commix', pattern: toolForms('commix', 'commixproject'), category: 'attack_tool' },
  { name: 'Havij', pattern: token('havij'), category: 'attack_tool' },
  { name: 'Metasploit', pattern: token('metasploit'), category: 'attack_tool' },
  { name: 'Jorgee', pattern: token('jorgee'), category: 'attack_tool' },
  { name: 'WhatWeb', pattern: token('whatweb'), category: 'attack_tool' },
  { name: 'GoLismero', pattern: token('golismero'), category: 'attack_tool' },
  // kiterunner's default is a Chrome user agent with "Chrome. " put before it, which no browser sends.
  { name: 'kiterunner', pattern: /^chrome\. mozilla\/5\.0 /i, category: 'attack_tool' },
  // Vega's default ends an old Internet Explorer user agent with "; Vega/1.0", its parenthesis left
  // unclosed; "vega" alone is a product's word ("(tvOS; Vega/1.0)").
  { name: 'Vega', pattern: /; vega\/1\.0$/i, category: 'attack_tool' },
  // Not listed: tools whose default user agent is a browser's, fixed or picked at random (OWASP ZAP,
  // dirsearch, Arjun, Jaeles, katana, x8, dalfox, XSStrike, gospider): no pattern can tell them apart.
  // Headless browsers: Puppeteer's and Playwright's default user agents say HeadlessChrome.
  { name: 'HeadlessChrome', pattern: /headlesschrome/i, category: 'headless' },
  { name: 'PhantomJS', pattern: /phantomjs/i, category: 'headless' },
  { name: 'Puppeteer', pattern: /puppeteer/i, category: 'headless' },
  { name: 'Playwright', pattern: /playwright/i, category: 'headless' },
  { name: 'Selenium', pattern: /selenium|webdriver/i, category: 'headless' },
  { name: 'SlimerJS', pattern: /slimerjs/i, category: 'headless' },
  { name: 'HtmlUnit', pattern: /htmlunit/i, category: 'headless' },
  { name: 'jsdom', pattern: /jsdom/i, category: 'headless' },
  // Scrapers and crawlers.
  // As tokens: a product whose name holds the word ("ScrapyardPOS", "Broccolly") is not the tool.
  { name: 'Scrapy', pattern: token('scrapy'), category: 'scraper' },
  { name: 'HTTrack', pattern: /httrack/i, category: 'scraper' },
  { name: 'Colly', pattern: token('colly'), category: 'scraper' },
  { name: 'Apify', pattern: token('apify'), category: 'scraper' },
  // The end of a word ("Baiduspider", "webcrawler"), not its start ("SpiderOakONE", a backup client),
  // nor a word joined on by a hyphen ("Spider-Man Unlimited", a game); "crawl" only as a word of its
  // own ("PubCrawl" is an app).
  { name: 'crawler', pattern: /(?<![a-z])crawl(?![a-z]|-[a-z])|(?:crawler|spider|scraper)(?![a-z]|-[a-z])/i, category: 'scraper' },
];

// One alternation rejects an ordinary user agent in a single regex run; the list is consulted only on a hit.
const ANY_PATTERN = new RegExp(USER_AGENT_PATTERNS.map((p) => `(?:${p.pattern.source})`).join('|'), 'i');

/** The first pattern a user agent matches, or undefined for an ordinary (or empty) user agent. */
export function classifyUserAgent(userAgent: string): UserAgentPattern | undefined {
  if (userAgent === '' || !ANY_PATTERN.test(userAgent)) return undefined;
  return USER_AGENT_PATTERNS.find((p) => p.pattern.test(userAgent));
}

type Params = {
  windowMinutes: number;
  /** Distinct paths (resource ids) a headless browser or scraper must fetch to count as enumerating. */
  minDistinctResources: number;
  highDistinctResources: number;
  /** Reads (GET, HEAD) by headless browsers and scrapers that count as enumerating, whatever their paths (route templates hide the ids). */
  minAutomationReads: number;
  highAutomationReads: number;
  /** Share of the automation's requests answered 404 that makes enumeration high. */
  highNotFoundShare: number;
};

const MINUTE = 60_000;
const MAX_SAMPLES = 10;

/** The screen's tally: when an attack tool was last seen, and the distinct paths and reads per minute of headless browsers and scrapers. */
interface Tally {
  attackEvents: number;
  newestAttack: number;
  automationPaths: DistinctValues<string> | undefined;
  /** Reads by headless browsers and scrapers per clock minute (the last READ_MINUTES); made with the first. */
  automationReads: MinuteRing | undefined;
}

const READ_MINUTES = 16;

export const rule: RuleDefinition<Params, Tally> = {
  id: 'bot_traffic',
  version: '1.2.3',
  title: 'Bot traffic',
  description:
    'A key is used by an attack tool (scanner, fuzzer, brute forcer), or by a headless browser or scraper that ' +
    'walks through many resources or reads them at volume.',
  windowMs: 10 * MINUTE,
  defaults: {
    windowMinutes: 10,
    minDistinctResources: 30,
    highDistinctResources: 150,
    minAutomationReads: 100,
    highAutomationReads: 600,
    highNotFoundShare: 0.5,
  },
  actions: { low: 'monitor', medium: 'investigate', high: 'rate_limit', critical: 'block' },
  falsePositives: [
    'Server-side integrations using HTTP libraries (curl, python-requests, axios, okhttp, Go-http-client, Java, node-fetch, undici, Ruby, Guzzle, .NET): never matched.',
    'An empty user agent (common for hand-written clients): never an alert by itself.',
    'A product whose name contains a tool\'s (BusinessUserSync, Burpple, Arachnid, NucleiCount): a tool\'s name counts only as a token of the user agent, never inside a longer word.',
    'Headless browsers in a merchant\'s end-to-end tests: a few paths and a few dozen reads, under minDistinctResources and minAutomationReads.',
    'A product built around a tool\'s name (Nmap-Parser, python-nmap-report, Nuclei-Sync): a name joined to another word by a hyphen is not the tool.',
    'A product that takes Nuclei, Wapiti or commix as a word of its name (Nuclei Health/1.0, Commix SDK/2.1): these count only as the tool sends them, the name with "/" and a version or the project\'s marker (projectdiscovery, wapiti-scanner, commixproject).',
    'A merchant\'s own headless automation reading at volume (a PDF renderer fetching results) is reported (medium): allowlist its key or address.',
    'A merchant\'s own penetration test with a live key alerts as an attack tool, by design: dismiss it with a note or allowlist the key for the test.',
  ],
  evaluate(window, params, now) {
    const { events } = window;
    const windowStart = now - params.windowMinutes * MINUTE;
    // Classify each distinct user agent once per call; consecutive events usually share one, so the
    // map of verdicts is only made when a second user agent shows up.
    let verdicts: Map<string, UserAgentPattern | undefined> | undefined;
    let lastUserAgent: string | undefined;
    let lastVerdict: UserAgentPattern | undefined;
    let attacks: WindowEvent[] | undefined;
    let automation: WindowEvent[] | undefined;
    for (let i = events.length - 1; i >= 0; i--) {
      const event = events[i]!;
      if (event.timestamp < windowStart) break;
      const userAgent = event.userAgent;
      if (userAgent !== lastUserAgent) {
        if (lastUserAgent !== undefined) (verdicts ??= new Map()).set(lastUserAgent, lastVerdict);
        lastUserAgent = userAgent;
        lastVerdict = verdicts?.has(userAgent) ? verdicts.get(userAgent) : classifyUserAgent(userAgent);
      }
      if (!lastVerdict) continue;
      if (lastVerdict.category === 'attack_tool') (attacks ??= []).push(event);
      else (automation ??= []).push(event);
    }
    if (!attacks && !automation) return [];
    const named = (verdicts ??= new Map()).set(lastUserAgent!, lastVerdict);
    if (attacks) return [attackFinding(window.apiKeyId, attacks.reverse(), named, params)];
    if (!automation) return [];

    automation.reverse();
    const paths = new Set<string>();
    let notFound = 0;
    let reads = 0;
    for (const event of automation) {
      paths.add(event.path);
      if (event.status === 404) notFound++;
      if (isRead(event)) reads++;
    }
    const walking = paths.size >= params.minDistinctResources;
    const reading = reads >= params.minAutomationReads;
    if (!walking && !reading) return [];
    const notFoundShare = notFound / automation.length;
    const severity: Severity =
      paths.size >= params.highDistinctResources || reads >= params.highAutomationReads || notFoundShare >= params.highNotFoundShare ? 'high' : 'medium';
    const score = (value: number, low: number, high: number) => (value >= low ? clamp01(Math.log(value / low) / Math.log(high / low)) : 0);
    const confidence = round(
      clamp01(0.5 + 0.5 * Math.max(score(paths.size, params.minDistinctResources, params.highDistinctResources), score(reads, params.minAutomationReads, params.highAutomationReads))),
      3,
    );
    const tools = countBy(automation, (e) => named.get(e.userAgent)!.name);
    const key = window.apiKeyId;
    const toolNames = Object.keys(tools).join(', ');
    const what = walking
      ? `fetched ${paths.size} distinct resources in ${params.windowMinutes} min (threshold ${params.minDistinctResources})`
      : `read ${reads} times in ${params.windowMinutes} min (threshold ${params.minAutomationReads} reads)`;
    const finding: Finding = {
      scope: key,
      apiKeyId: key,
      severity,
      confidence,
      title: `Bot enumeration on ${key}: ${toolNames} ${what}`,
      summary:
        `${key} was used by ${toolNames} to request ${paths.size} distinct resources (${automation.length} requests, ${reads} reads, ` +
        `${Math.round(notFoundShare * 100)}% not found) in ${params.windowMinutes} min, against thresholds of ${params.minDistinctResources} resources or ${params.minAutomationReads} reads; ` +
        `ask the merchant whether this automation is theirs, otherwise ${severity === 'high' ? 'throttle the key and ' : ''}rotate its secret.`,
      evidence: {
        category: 'automation',
        tools,
        distinctResources: paths.size,
        minDistinctResources: params.minDistinctResources,
        highDistinctResources: params.highDistinctResources,
        requests: automation.length,
        reads,
        minAutomationReads: params.minAutomationReads,
        notFoundShare: round(notFoundShare, 3),
        samplePaths: [...paths].slice(0, MAX_SAMPLES),
        ...distinctValues(automation),
        windowMinutes: params.windowMinutes,
        sampleEventIds: automation.slice(-MAX_SAMPLES).map((e) => e.eventId),
        windowMs: params.windowMinutes * MINUTE,
      },
      firstSeenAt: automation[0]!.timestamp,
      lastSeenAt: automation[automation.length - 1]!.timestamp,
    };
    return [finding];
  },
  screen: {
    create: () => ({ attackEvents: 0, newestAttack: -Infinity, automationPaths: undefined, automationReads: undefined }),
    add(tally, event) {
      const verdict = rememberedVerdict(event.userAgent);
      if (!verdict) return 0;
      if (verdict.category !== 'attack_tool') {
        if (isRead(event)) {
          const reads = (tally.automationReads ??= new MinuteRing(READ_MINUTES, [0]));
          const at = reads.claim(event.timestamp);
          if (at !== FORGOTTEN) reads.add(at, 0, 1);
        }
        return entryAdded((tally.automationPaths ??= new DistinctValues()).add(event.path, event.timestamp));
      }
      tally.attackEvents++;
      if (event.timestamp > tally.newestAttack) tally.newestAttack = event.timestamp;
      return 0;
    },
    remove(tally, event) {
      const verdict = rememberedVerdict(event.userAgent);
      if (!verdict) return 0;
      if (verdict.category !== 'attack_tool') {
        if (isRead(event)) {
          const at = tally.automationReads!.find(minuteOf(event.timestamp));
          if (at >= 0) tally.automationReads!.add(at, 0, -1);
        }
        return entryRemoved(tally.automationPaths!.remove(event.path, event.timestamp));
      }
      if (--tally.attackEvents === 0) tally.newestAttack = -Infinity;
      return 0;
    },
    entries: (tally) => tally.automationPaths?.size ?? 0,
    // An attack tool in the window fires at once; automation needs its distinct paths since the window
    // start, which are at most the automation paths of the whole window, or its reads since then, at
    // most those of every minute the window touches.
    mayFire(tally, params, now) {
      const windowStart = now - params.windowMinutes * MINUTE;
      if (tally.newestAttack >= windowStart) return true;
      const paths = tally.automationPaths;
      if (paths === undefined || paths.countSince(windowStart, 1) === 0) return false;
      if (!(paths.size < params.minDistinctResources)) return true;
      const reads = tally.automationReads;
      if (reads === undefined) return false;
      const firstMinute = minuteOf(windowStart);
      if (reads.newestMinute - firstMinute >= reads.size) return true;
      let readsAtMost = 0;
      for (let minute = firstMinute; minute <= reads.newestMinute; minute++) {
        const at = reads.find(minute);
        if (at === NO_EVENTS) continue;
        if (at === FORGOTTEN) return true;
        readsAtMost += reads.get(at, 0);
      }
      return !(readsAtMost < params.minAutomationReads);
    },
  },
};

// The screen classifies every event's user agent; the verdicts of the user agents seen lately are
// remembered (a cache of a pure function: it changes no result).
const VERDICTS_REMEMBERED = 10_000;
let verdicts = new Map<string, UserAgentPattern | null>();

function rememberedVerdict(userAgent: string): UserAgentPattern | undefined {
  let verdict = verdicts.get(userAgent);
  if (verdict === undefined) {
    if (verdicts.size >= VERDICTS_REMEMBERED) verdicts = new Map();
    verdict = classifyUserAgent(userAgent) ?? null;
    verdicts.set(userAgent, verdict);
  }
  return verdict ?? undefined;
}

function attackFinding(key: string, attacks: WindowEvent[], verdicts: Map<string, UserAgentPattern | undefined>, params: Params): Finding {
  const tools = countBy(attacks, (e) => verdicts.get(e.userAgent)!.name);
  const succeeded = attacks.filter((e) => e.status < 400).length;
  const toolNames = Object.keys(tools).join(', ');
  // One request is already certain enough to act on; volume and answered requests make it surer.
  const confidence = round(clamp01(0.6 + 0.2 * Math.min(1, Math.log10(attacks.length) / 2) + (succeeded > 0 ? 0.2 : 0)), 3);
  return {
    scope: key,
    apiKeyId: key,
    severity: 'critical',
    confidence,
    title: `Attack tool on ${key}: ${toolNames}, ${attacks.length} request(s)`,
    summary:
      `${key} was used by ${toolNames} (${attacks.length} request(s) in ${params.windowMinutes} min, ${succeeded} answered with success): ` +
      `an offensive tool holds this key; block it and rotate its secret unless the merchant confirms a penetration test.`,
    evidence: {
      category: 'attack_tool',
      tools,
      requests: attacks.length,
      succeeded,
      samplePaths: [...new Set(attacks.map((e) => e.path))].slice(0, MAX_SAMPLES),
      ...distinctValues(attacks),
      windowMinutes: params.windowMinutes,
      sampleEventIds: attacks.slice(-MAX_SAMPLES).map((e) => e.eventId),
      windowMs: params.windowMinutes * MINUTE,
    },
    firstSeenAt: attacks[0]!.timestamp,
    lastSeenAt: attacks[attacks.length - 1]!.timestamp,
  };
}

/** A read of a resource: what enumerating a resource's ids is made of. */
function isRead(event: WindowEvent): boolean {
  return event.method === 'GET' || event.method === 'HEAD';
}

function distinctValues(events: readonly WindowEvent[]): Record<string, unknown> {
  const ips = new Set(events.map((e) => e.ip));
  const networks = new Set(events.map((e) => e.network));
  return {
    distinctIps: ips.size,
    ips: [...ips].slice(0, MAX_SAMPLES),
    distinctNetworks: networks.size,
    countries: [...new Set(events.flatMap((e) => (e.country ? [e.country] : [])))].slice(0, MAX_SAMPLES),
    userAgents: [...new Set(events.map((e) => e.userAgent))].slice(0, MAX_SAMPLES),
  };
}

function countBy(events: readonly WindowEvent[], pick: (e: WindowEvent) => string): Record<string, number> {
  const counts: Record<string, number> = {};
  for (const event of events) {
    const name = pick(event);
    counts[name] = (counts[name] ?? 0) + 1;
  }
  return counts;
}

function clamp01(x: number): number {
  return Number.isFinite(x) ? Math.min(1, Math.max(0, x)) : 0;
}

function round(x: number, digits: number): number {
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}
