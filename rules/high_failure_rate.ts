/**
 * high_failure_rate: most of a key's requests fail in a way that signals abuse: 401 (someone
 * guessing the secret, a revoked or deleted key) or 404 (probing for resources that do not exist,
 * e.g. walking session ids).
 * 403 and 429 are the API's own policy doing its job (403: the monthly live quota used up or a test
 * key on a live-only endpoint, spec §7.3; 429: the rate limiter) and 5xx is the API's own fault: they
 * are neither signal nor part of the denominator, so an outage, a throttled key or a key past its
 * quota does not dilute or fake the share.
 *   share = (401 + 404) / (requests the API judged: everything except 403, 429 and 5xx)
 * The share is judged three ways, and the strongest finding is the key's one finding:
 *   - the key's requests of the last windowMinutes (10): judged >= minRequests and share >= thresholdShare;
 *   - each network (/24, /64) new to the key (not seen in the longWindowMinutes before now, per the
 *     key's history) on its own, with the same minRequests and thresholdShare: a stranger walking
 *     ids or guessing the secret is not hidden under the key's own successful traffic; and the new
 *     networks together, so that a stranger rotating through many networks (a proxy pool, a
 *     botnet), a few requests from each, is not hidden either;
 *   - over longWindowMinutes (60), the key's, each new network's and the new networks' requests: at least
 *     longMinFailures (100) signal failures at thresholdShare or more (low-and-slow guessing that
 *     never reaches minRequests in 10 minutes). Medium at most. The engine may thin a busy key's
 *     events older than detailMs (10 min + 5 min of skew) to the first and the last of each network
 *     and place per minute: a stranger sending a few requests a minute keeps nearly all of them,
 *     while a busy network's older minutes count for less (fewer failures, never a made-up share
 *     for a network whose newest 15 minutes are whole).
 * Severity grows with share and volume: medium from thresholdShare (50%); high at highShare (80%)
 * with at least highFailures signal failures; critical at criticalShare (90%) with criticalFailures,
 * of which at least criticalFailures are strangers': 401s from networks new to the key, or from its
 * own networks while its own requests there still succeed (a deleted key still set in its owner's
 * deployment, every request failing, stops at high), and 404s from networks new to the key and not in
 * a place the key is established at: 404s alone from the key's own networks or places (its own job
 * looking up ids it lacks, also from a fresh egress /24 of its city or cloud region) stop at high
 * (rate_limit), since critical means block.
 */
import { addToMinutes, DistinctValues, entryAdded, entryRemoved, FORGOTTEN, MinuteRing, minuteOf, NO_EVENTS, removeFromMinutes } from '../src/detect/tallies.ts';
import type { Finding, GeoPoint, KeyHistoryView, KeyWindow, RuleDefinition, Severity, WindowEvent } from '../src/detect/types.ts';
import { ownPlaces } from './network.ts';

type Params = {
  windowMinutes: number;
  /** Judged requests (not 429, not 5xx) needed before a share means anything. */
  minRequests: number;
  thresholdShare: number;
  highShare: number;
  highFailures: number;
  criticalShare: number;
  criticalFailures: number;
  /** The longer horizon, for low-and-slow failures; also how far back a network must be unknown to the key to be judged on its own. */
  longWindowMinutes: number;
  /** Signal failures needed over longWindowMinutes (at thresholdShare or more). */
  longMinFailures: number;
};

const MINUTE = 60_000;
const MAX_SAMPLES = 10;

/**
 * The screen's tally: the key's judged requests and signal failures per clock minute for the last
 * RING_MINUTES, the same per block of BLOCK_MINUTES for the longer horizon, and each network's per
 * clock minute (JudgedNetworks).
 */
const RING_MINUTES = 16;
const BLOCK_MINUTES = 5;
const RING_BLOCKS = 16;
const JUDGED = 0;
const FAILURES = 1;

interface Tally {
  minutes: MinuteRing;
  /** A MinuteRing of blocks: it is given timestamps divided by BLOCK_MINUTES, so its "minutes" are blocks. */
  blocks: MinuteRing;
  networks: JudgedNetworks | undefined;
  /** Signal failures in the window. */
  failures: number;
}

/** What one population (the key, or one network) did over one horizon. */
interface Counts {
  judged: number;
  auth: number;
  notFound: number;
}

/** The requests a verdict judged: the key's, one new network's, or those of every network new to the key. */
type Population = { kind: 'key' } | { kind: 'network'; network: string } | { kind: 'new_networks'; networks: number };

const KEY: Population = { kind: 'key' };

interface Verdict {
  severity: Severity;
  population: Population;
  minutes: number;
  counts: Counts;
  /** The key's counts over the same horizon. */
  key: Counts;
  long: boolean;
}

const SEVERITY_RANK: Record<Severity, number> = { low: 0, medium: 1, high: 2, critical: 3 };

export const rule: RuleDefinition<Params, Tally> = {
  id: 'high_failure_rate',
  version: '1.5.0',
  title: 'High failure rate',
  description:
    'Most of a key\'s requests are refused (401: credential guessing or a revoked key) or hit resources ' +
    'that do not exist (404: probing), over a window long enough to rule out a glitch; or most of the requests ' +
    'of a network new to the key, however busy the key is otherwise; or, more slowly, over an hour.',
  windowMs: 60 * MINUTE,
  // The short horizon reads every event; the hour only counts, and tolerates a busy key's thinned minutes.
  detailMs: 10 * MINUTE,
  defaults: {
    windowMinutes: 10,
    minRequests: 30,
    thresholdShare: 0.5,
    highShare: 0.8,
    highFailures: 100,
    criticalShare: 0.9,
    criticalFailures: 1000,
    longWindowMinutes: 60,
    longMinFailures: 100,
  },
  actions: { low: 'monitor', medium: 'investigate', high: 'rate_limit', critical: 'block' },
  falsePositives: [
    'An outage (a burst of 5xx): 5xx is excluded from both numerator and denominator.',
    'A throttled key (a burst of 429): 429 is excluded from both numerator and denominator; velocity_attack covers the excess.',
    'A key past its monthly live quota (403 QUOTA_EXCEEDED) or a test key on a live-only endpoint (403 ENVIRONMENT_MISMATCH): 403 is the API\'s policy, not a wrong secret, and is excluded from both numerator and denominator.',
    'A handful of failures (3 of 5): no share is judged below minRequests judged requests.',
    'Validation errors (400, 422) are the integration\'s bugs, not abuse: they count as judged requests, not as failures.',
    'An old deployment still calling with a key deleted after a rotation (spec: create new, deploy, verify, delete old) fails 100% with 401 at its usual rate: it is reported because the merchant must fix it (medium, high at volume), never critical from the key\'s own networks while none of its requests there succeed: no stranger, nothing to page on-call for; dismiss it once fixed. From networks new to the key, or beside its own requests that still succeed there (a stranger behind the same cloud NAT), 401s at volume are critical.',
    'Accepted: a brute force from a network the key uses (a shared corporate egress, a former insider) while none of the key\'s own requests there succeed is high, not critical: it looks like the key\'s own deployment with a deleted key.',
    'A second site of the merchant whose lookups mostly miss (404), among the key\'s successes: a network the key used before the last hour is judged with the key, not on its own.',
    'The merchant\'s own job looking up ids it does not have (404) from the key\'s usual networks, or from a fresh /24 in a place the key is established at: at most high (rate_limit), never critical (block).',
    'The key\'s end users arriving from many new networks (a mobile app, a browser integration): their networks are judged together only at thresholdShare, so a few missing lookups among their successes stay quiet.',
    'A few scattered 401s an hour among ordinary traffic: the hour needs longMinFailures (100) failures at thresholdShare.',
  ],
  evaluate(window, params, now) {
    const { events } = window;
    const shortStart = now - params.windowMinutes * MINUTE;
    const longStart = now - params.longWindowMinutes * MINUTE;
    const scanStart = Math.min(shortStart, longStart);
    // First pass: the key's counters, for both horizons; the evidence is built when the rule fires.
    const short: Counts = { judged: 0, auth: 0, notFound: 0 };
    const long: Counts = { judged: 0, auth: 0, notFound: 0 };
    let first = events.length;
    for (let i = events.length - 1; i >= 0; i--) {
      const event = events[i]!;
      if (event.timestamp < scanStart) break;
      first = i;
      if (event.timestamp >= shortStart) count(short, event.status);
      if (event.timestamp >= longStart) count(long, event.status);
    }
    const isNew = newNetworks(window.history, longStart);
    let best: Verdict | undefined;
    const consider = (verdict: Verdict | undefined) => {
      if (verdict && (!best || SEVERITY_RANK[verdict.severity] > SEVERITY_RANK[best.severity])) best = verdict;
    };
    const atOwnPlace = ownPlaces(window.history, longStart);
    /** The failures of a population's short window that may make it critical (asked only when the rest of the bar is met). */
    const strong = (population: Population) => () => strongFailures(events, first, shortStart, memberOf(population, isNew), isNew, atOwnPlace);
    consider(judge(short, params, false, strong(KEY), KEY, short, params.windowMinutes));
    if (best?.severity !== 'critical') {
      // Networks new to the key, on their own: only when the key has the failures one of them would need.
      const networkMin = perNetworkMinimum(params);
      const fresh =
        failuresOf(short) >= networkMin || (failuresOf(long) >= networkMin && failuresOf(long) >= params.longMinFailures)
          ? networkCounts(events, first, shortStart, longStart, isNew)
          : undefined;
      // The new networks together only when there are several: one is judged on its own already.
      const together: Population | undefined = fresh && fresh.networks > 1 ? { kind: 'new_networks', networks: fresh.networks } : undefined;
      // At equal severity the key's short window first, then a network's, then the new networks', then the hour's.
      for (const [network, counts] of fresh?.failing ?? []) {
        const population: Population = { kind: 'network', network };
        consider(judge(counts.short, params, false, strong(population), population, short, params.windowMinutes));
      }
      if (together) consider(judge(fresh!.all.short, params, false, strong(together), together, short, params.windowMinutes));
      if (!best) consider(judge(long, params, true, () => failuresOf(long), KEY, long, params.longWindowMinutes));
      if (!best) {
        for (const [network, counts] of fresh?.failing ?? []) {
          consider(judge(counts.long, params, true, () => failuresOf(counts.long), { kind: 'network', network }, long, params.longWindowMinutes));
        }
        if (together) consider(judge(fresh!.all.long, params, true, () => failuresOf(fresh!.all.long), together, long, params.longWindowMinutes));
      }
    }
    return best ? [finding(window, params, now, best, first, isNew)] : [];
  },
  screen: {
    create: () => ({ minutes: new MinuteRing(RING_MINUTES, [0, 0]), blocks: new MinuteRing(RING_BLOCKS, [0, 0]), networks: undefined, failures: 0 }),
    add(tally, event) {
      const at = tally.minutes.claim(event.timestamp);
      if (at !== FORGOTTEN) countIn(tally.minutes, at, event.status, 1);
      const block = tally.blocks.claim(event.timestamp / BLOCK_MINUTES);
      if (block !== FORGOTTEN) countIn(tally.blocks, block, event.status, 1);
      if (!isJudged(event.status)) return 0;
      const signal = isSignal(event.status);
      if (signal) tally.failures++;
      return entryAdded((tally.networks ??= new JudgedNetworks()).addRequest(event.network, event.timestamp, signal));
    },
    remove(tally, event) {
      const at = tally.minutes.find(minuteOf(event.timestamp));
      if (at >= 0) countIn(tally.minutes, at, event.status, -1);
      const block = tally.blocks.find(minuteOf(event.timestamp / BLOCK_MINUTES));
      if (block >= 0) countIn(tally.blocks, block, event.status, -1);
      if (!isJudged(event.status)) return 0;
      const signal = isSignal(event.status);
      if (signal) tally.failures--;
      return entryRemoved(tally.networks!.removeRequest(event.network, event.timestamp, signal));
    },
    entries: (tally) => tally.networks?.size ?? 0,
    // Each horizon's window starts inside a minute (a block): its counts lie between those of the
    // minutes wholly inside it (at least) and of every minute it touches (at most), and so does the share.
    mayFire(tally, params, now, history) {
      // Every finding needs at least thresholdShare × minRequests failures: most keys stop here.
      const networkMin = perNetworkMinimum(params);
      if (!(tally.failures >= networkMin)) return false;
      const shortStart = now - params.windowMinutes * MINUTE;
      const short = bounds(tally.minutes, shortStart);
      if (short === undefined || mayReach(short, params, false)) return true;
      const longStart = now - params.longWindowMinutes * MINUTE;
      const long = bounds(tally.blocks, longStart / BLOCK_MINUTES);
      if (long === undefined || mayReach(long, params, true)) return true;
      if (!(long.failuresAtMost >= networkMin) && !(short.failuresAtMost >= networkMin)) return false;
      // A network new to the key on its own, or the new networks together: a busy young key's
      // networks are all new, and together they fail as the key does.
      return tally.networks?.newMayReach(params, shortStart, longStart, newNetworks(history, longStart)) ?? false;
    },
  },
};
/** Counts an event of a population over a horizon, as the share counts it. */
function count(counts: Counts, status: number): void {
  if (!isJudged(status)) return;
  counts.judged++;
  if (status === 401) counts.auth++;
  else if (status === 404) counts.notFound++;
}

function failuresOf(counts: Counts): number {
  return counts.auth + counts.notFound;
}

/**
 * The fewest signal failures any verdict needs (of the key, a network, the new networks): the fewest
 * at thresholdShare of minRequests judged, as judge divides (0.14 × 50 is 7.000000000000001, yet
 * 7 / 50 is 0.14).
 */
function perNetworkMinimum(params: Params): number {
  const judged = Math.max(1, Math.ceil(params.minRequests));
  let failures = Math.max(1, Math.ceil(params.thresholdShare * judged));
  while (failures > 1 && (failures - 1) / judged >= params.thresholdShare) failures--;
  return failures;
}

/**
 * Whether a network is new to the key: not seen before `since` in the key's history. Without a
 * history (a unit test) every network is. The verdicts of the last network asked are kept at hand.
 */
function newNetworks(history: KeyHistoryView | undefined, since: number): (network: string) => boolean {
  if (!history) return () => true;
  let last: string | undefined;
  let verdict = true;
  return (network) => {
    if (network !== last) {
      last = network;
      verdict = !history.knowsNetwork(network, since);
    }
    return verdict;
  };
}

/**
 * The severity a population's counts earn, or undefined when they do not fire. `strong` counts the
 * failures that may make it critical (401s, and 404s from strangers' networks); it is only
 * asked when the rest of the critical bar is met. The long horizon is medium at most.
 */
function judge(
  counts: Counts,
  params: Params,
  long: boolean,
  strong: () => number,
  population: Population,
  key: Counts,
  minutes: number,
): Verdict | undefined {
  const failures = failuresOf(counts);
  if (counts.judged < params.minRequests || failures === 0) return undefined;
  const share = failures / counts.judged;
  if (share < params.thresholdShare) return undefined;
  if (long && failures < params.longMinFailures) return undefined;
  const severity: Severity = long
    ? 'medium'
    : share >= params.criticalShare && failures >= params.criticalFailures && strong() >= params.criticalFailures
      ? 'critical'
      : share >= params.highShare && failures >= params.highFailures
        ? 'high'
        : 'medium';
  return { severity, population, minutes, counts, key, long };
}

/**
 * A population's failures in the short window that strangers make: 401s from a network new to the key,
 * or from its own networks while its own requests there still succeed (a stranger behind the same
 * cloud NAT); not while every one of them fails, as when a deleted or rotated key is still set in its
 * owner's deployment. And 404s from a network new to the key that is not in a place the key is
 * established at either (a fresh egress /24 of its own city or cloud region is its own, as
 * credential_sharing takes it).
 */
function strongFailures(
  events: readonly WindowEvent[],
  first: number,
  since: number,
  inPopulation: (event: WindowEvent) => boolean,
  isNew: (network: string) => boolean,
  atOwnPlace: (geo: GeoPoint | undefined) => boolean,
): number {
  let strong = 0;
  let ownAuthFailures = 0;
  let ownSuccesses = false;
  for (let i = first; i < events.length; i++) {
    const event = events[i]!;
    if (event.timestamp < since || !inPopulation(event)) continue;
    const { status } = event;
    if (isNew(event.network)) {
      if (status === 401 || (status === 404 && !atOwnPlace(event.geo))) strong++;
    } else if (status === 401) {
      ownAuthFailures++;
    } else if (status !== 404 && isJudged(status)) {
      ownSuccesses = true;
    }
  }
  return ownSuccesses ? strong + ownAuthFailures : strong;
}

/** Whether an event is one of a population's. */
function memberOf(population: Population, isNew: (network: string) => boolean): (event: WindowEvent) => boolean {
  if (population.kind === 'key') return () => true;
  if (population.kind === 'network') return (event) => event.network === population.network;
  return (event) => isNew(event.network);
}

interface Horizons {
  short: Counts;
  long: Counts;
}

const horizons = (): Horizons => ({ short: { judged: 0, auth: 0, notFound: 0 }, long: { judged: 0, auth: 0, notFound: 0 } });

/**
 * The counts of the networks new to the key, over both horizons: of each one that sent a signal
 * failure (`failing`), and of all of them together (`all`, over `networks` networks).
 */
function networkCounts(
  events: readonly WindowEvent[],
  first: number,
  shortStart: number,
  longStart: number,
  isNew: (network: string) => boolean,
): { failing: Map<string, Horizons>; all: Horizons; networks: number } {
  const failing = new Map<string, Horizons>();
  const all = horizons();
  let lastNetwork: string | undefined;
  let last: Horizons | undefined;
  for (let i = first; i < events.length; i++) {
    const event = events[i]!;
    if (event.network !== lastNetwork) {
      lastNetwork = event.network;
      last = failing.get(event.network);
      if (last === undefined && isNew(event.network)) {
        last = horizons();
        failing.set(event.network, last);
      }
    }
    if (last === undefined) continue;
    if (event.timestamp >= shortStart) count(last.short, event.status);
    if (event.timestamp >= longStart) count(last.long, event.status);
  }
  const networks = failing.size;
  for (const [network, counts] of failing) {
    add(all.short, counts.short);
    add(all.long, counts.long);
    if (failuresOf(counts.long) === 0 && failuresOf(counts.short) === 0) failing.delete(network);
  }
  return { failing, all, networks };
}

function add(total: Counts, counts: Counts): void {
  total.judged += counts.judged;
  total.auth += counts.auth;
  total.notFound += counts.notFound;
}

/** The finding of a verdict, its evidence read from the population's events over its horizon. */
function finding(window: KeyWindow, params: Params, now: number, verdict: Verdict, first: number, isNew: (network: string) => boolean): Finding {
  const { events } = window;
  const since = now - verdict.minutes * MINUTE;
  const { population, counts, severity } = verdict;
  const inPopulation = memberOf(population, isNew);
  const windowEvents: WindowEvent[] = [];
  for (let i = first; i < events.length; i++) {
    const event = events[i]!;
    if (event.timestamp >= since && inPopulation(event)) windowEvents.push(event);
  }
  const auth = counts.auth;
  const notFound = counts.notFound;
  const failures = auth + notFound;
  const judged = counts.judged;
  const share = failures / judged;
  // How far past the threshold the share is, and how much volume stands behind it (log scale).
  const shareScore = (share - params.thresholdShare) / Math.max(1e-9, 1 - params.thresholdShare);
  const floor = verdict.long ? params.longMinFailures : params.minRequests;
  const volumeScore = Math.log(failures / floor) / Math.log(params.criticalFailures / floor);
  const confidence = round(clamp01(0.5 * clamp01(shareScore) + 0.5 * clamp01(volumeScore)), 3);

  const failing = windowEvents.filter((e) => isSignal(e.status));
  const countsByStatus: Record<string, number> = {};
  let rateLimited = 0;
  let serverErrors = 0;
  let forbidden = 0;
  for (const event of windowEvents) {
    countsByStatus[event.status] = (countsByStatus[event.status] ?? 0) + 1;
    if (event.status === 429) rateLimited++;
    else if (event.status >= 500) serverErrors++;
    else if (event.status === 403) forbidden++;
  }
  const topNotFoundPaths = top(failing.filter((e) => e.status === 404).map((e) => e.path), 5);
  const ips = distinct(failing.map((e) => e.ip));
  const networks = distinct(failing.map((e) => e.network));
  const kind = auth >= notFound ? 'authentication failures (401)' : 'probing for missing resources (404)';
  const key = window.apiKeyId;
  const percent = Math.round(share * 100);
  const minutes = verdict.minutes;
  // 404s mostly from the key's own networks are as likely its own integration asking for ids that are gone.
  const ownNotFound = auth >= notFound ? 0 : failing.filter((e) => e.status === 404 && !isNew(e.network)).length;
  const advice =
    auth >= notFound
      ? 'check whether the merchant rotated or revoked this key; if not, someone is guessing its secret: rotate it'
      : ownNotFound * 2 > notFound
        ? "most come from the key's own networks: its integration asking for ids that no longer exist (purged sessions, a stale reference), or someone there enumerating resources; check the paths with the merchant"
        : 'someone is enumerating resources with this key: check the paths and the source IPs with the merchant';
  const keyFailures = failuresOf(verdict.key);
  const source =
    population.kind === 'key' ? '' : population.kind === 'network' ? ` from ${population.network}` : ` from ${population.networks} networks new to the key`;
  const keyShare = `the key as a whole failed ${keyFailures} of ${verdict.key.judged} (${Math.round((keyFailures / Math.max(1, verdict.key.judged)) * 100)}%)`;
  const hidden =
    population.kind === 'key'
      ? ''
      : population.kind === 'network'
        ? ` The network is new to the key; ${keyShare}.`
        : ` None of these networks sent enough on its own to be judged, together they failed: one party rotating addresses (a proxy pool, a botnet); ${keyShare}.`;
  const slow = verdict.long ? ` (at least ${params.longMinFailures} over ${minutes} min: slow and steady)` : '';

  return {
    scope: key,
    apiKeyId: key,
    severity,
    confidence,
    title: `High failure rate on ${key}: ${percent}% of ${judged} requests${source} failed (${failures} × 401/404${verdict.long ? ` in ${minutes} min` : ''})`,
    summary:
      `${failures} of the ${judged} requests ${key} made${source} in the last ${minutes} min that the API judged failed with 401/404 ` +
      `(${percent}% against a threshold of ${Math.round(params.thresholdShare * 100)}%${slow}), mostly ${kind}, ` +
      `from ${ips.count} IP(s); ${advice}.${hidden}`,
    evidence: {
      judgedBy: population.kind,
      ...(population.kind === 'network' ? { network: population.network } : {}),
      ...(population.kind === 'new_networks' ? { newNetworks: population.networks } : {}),
      ...(population.kind === 'key' ? {} : { keyJudgedRequests: verdict.key.judged, keySignalFailures: keyFailures }),
      horizon: verdict.long ? 'long' : 'short',
      observedShare: round(share, 3),
      thresholdShare: params.thresholdShare,
      signalFailures: failures,
      authFailures: auth,
      notFound,
      judgedRequests: judged,
      minRequests: params.minRequests,
      ...(verdict.long ? { longMinFailures: params.longMinFailures } : {}),
      excluded: { rateLimited, serverErrors, forbidden },
      countsByStatus,
      topNotFoundPaths,
      distinctIps: ips.count,
      ips: ips.values,
      distinctNetworks: networks.count,
      networks: networks.values,
      userAgents: distinct(failing.map((e) => e.userAgent)).values,
      windowMinutes: minutes,
      sampleEventIds: failing.slice(-MAX_SAMPLES).map((e) => e.eventId),
      windowMs: minutes * MINUTE,
    },
    firstSeenAt: failing[0]!.timestamp,
    lastSeenAt: failing[failing.length - 1]!.timestamp,
  };
}

/** Counts an event in (sign 1) or out (sign -1) of its minute or block, as evaluate counts it. */
function countIn(ring: MinuteRing, at: number, status: number, sign: 1 | -1): void {
  if (!isJudged(status)) return;
  ring.add(at, JUDGED, sign);
  if (isSignal(status)) ring.add(at, FAILURES, sign);
}

interface Bounds {
  judgedAtMost: number;
  judgedAtLeast: number;
  failuresAtMost: number;
}

const noBounds = (): Bounds => ({ judgedAtMost: 0, judgedAtLeast: 0, failuresAtMost: 0 });

/**
 * What a ring says of the counts from `start` on (a ring of blocks is given `start` scaled as its
 * timestamps are); undefined when it cannot say (the span is longer than
 * the ring, or a slot it needs was taken over).
 */
function bounds(ring: MinuteRing, start: number): Bounds | undefined {
  const firstSlot = minuteOf(start);
  const firstWholeSlot = Math.ceil(start / MINUTE);
  if (ring.newestMinute - firstSlot >= ring.size) return undefined;
  const result = noBounds();
  for (let slot = firstSlot; slot <= ring.newestMinute; slot++) {
    const at = ring.find(slot);
    if (at === NO_EVENTS) continue;
    if (at === FORGOTTEN) return undefined;
    result.judgedAtMost += ring.get(at, JUDGED);
    result.failuresAtMost += ring.get(at, FAILURES);
    if (slot >= firstWholeSlot) result.judgedAtLeast += ring.get(at, JUDGED);
  }
  return result;
}

/** Whether counts within these bounds may make a verdict: minRequests judged at thresholdShare, and longMinFailures over the long horizon. */
function mayReach(b: Bounds, params: Params, long: boolean): boolean {
  if (b.judgedAtMost < params.minRequests || b.failuresAtMost < perNetworkMinimum(params)) return false;
  if (long && b.failuresAtMost < params.longMinFailures) return false;
  return b.judgedAtLeast === 0 || !(b.failuresAtMost / b.judgedAtLeast < params.thresholdShare);
}

/** What a judged request adds to its minute in a network's list: [judged, failures]. */
const JUDGED_ONLY = [1, 0];
const JUDGED_FAILURE = [1, 1];

interface NetworkTally {
  /** Judged requests in the window. */
  events: number;
  newest: number;
  /** [minute, judged, failures, ...] in minute order. */
  minutes: number[];
}

/** The networks that sent judged requests in the window, each with its judged requests and signal failures per clock minute. */
class JudgedNetworks extends DistinctValues<string, NetworkTally> {
  addRequest(network: string, timestamp: number, failure: boolean): NetworkTally {
    const tally = this.add(network, timestamp);
    addToMinutes(tally.minutes, timestamp, failure ? JUDGED_FAILURE : JUDGED_ONLY);
    return tally;
  }

  removeRequest(network: string, timestamp: number, failure: boolean): NetworkTally | undefined {
    const tally = this.remove(network, timestamp);
    if (tally) removeFromMinutes(tally.minutes, timestamp, failure ? JUDGED_FAILURE : JUDGED_ONLY);
    return tally;
  }

  /** Whether a network new to the key, on its own, or the new networks together may make a verdict over either horizon. */
  newMayReach(params: Params, shortStart: number, longStart: number, isNew: (network: string) => boolean): boolean {
    const since = Math.min(shortStart, longStart);
    const together = { short: noBounds(), long: noBounds() };
    for (const [network, tally] of this.values) {
      if (tally.newest < since || !isNew(network)) continue;
      const short = minuteBounds(tally.minutes, shortStart);
      const long = minuteBounds(tally.minutes, longStart);
      if (mayReach(short, params, false) || mayReach(long, params, true)) return true;
      addBounds(together.short, short);
      addBounds(together.long, long);
    }
    return mayReach(together.short, params, false) || mayReach(together.long, params, true);
  }

  protected override newTally(timestamp: number): NetworkTally {
    return { events: 1, newest: timestamp, minutes: [] };
  }
}

/** What a network's minute list says of its counts from `start` on, as bounds says it of a ring. */
function minuteBounds(minutes: readonly number[], start: number): Bounds {
  const firstSlot = minuteOf(start);
  const firstWholeSlot = Math.ceil(start / MINUTE);
  const result = noBounds();
  for (let at = minutes.length - 3; at >= 0 && minutes[at]! >= firstSlot; at -= 3) {
    result.judgedAtMost += minutes[at + 1]!;
    result.failuresAtMost += minutes[at + 2]!;
    if (minutes[at]! >= firstWholeSlot) result.judgedAtLeast += minutes[at + 1]!;
  }
  return result;
}

function addBounds(total: Bounds, b: Bounds): void {
  total.judgedAtMost += b.judgedAtMost;
  total.judgedAtLeast += b.judgedAtLeast;
  total.failuresAtMost += b.failuresAtMost;
}

/**
 * Whether the API judged the request on its merits: not 403 (quota used up, test key on a live-only
 * endpoint: its own policy), not 429 (its rate limiter), not 5xx (its own fault).
 */
function isJudged(status: number): boolean {
  return status !== 403 && status !== 429 && status < 500;
}

/** A failure that signals abuse: a wrong or revoked secret (401), or a resource that does not exist (404). */
function isSignal(status: number): boolean {
  return status === 401 || status === 404;
}

function top(values: readonly string[], n: number): { path: string; count: number }[] {
  const counts = new Map<string, number>();
  for (const value of values) counts.set(value, (counts.get(value) ?? 0) + 1);
  return [...counts]
    .sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1))
    .slice(0, n)
    .map(([path, count]) => ({ path, count }));
}

function distinct(values: readonly string[]): { count: number; values: string[] } {
  const seen = new Set(values);
  return { count: seen.size, values: [...seen].slice(0, MAX_SAMPLES) };
}

function clamp01(x: number): number {
  return Number.isFinite(x) ? Math.min(1, Math.max(0, x)) : 0;
}

function round(x: number, digits: number): number {
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}
