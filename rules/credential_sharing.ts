/**
 * credential_sharing: one key suddenly used from many networks in many countries, compared with the
 * key's own history. The window is cut into intervals of intervalMinutes counted back from `now`;
 * the last one is "recent", the earlier ones are the baseline (the median of distinct networks per
 * interval in which the key was active; 0 when it has no history). The recent networks the key had
 * already used before the window, in the last days the engine remembers (KeyWindow.history), are
 * its own: a daily job from five regions, or a deployment idle for hours, is not sharing. The new
 * ones are those it had not. It fires when
 *   new networks >= minNetworks AND recent networks >= baselineMultiplier × max(1, baseline)
 *   AND the new networks' countries >= minCountries.
 * Without a history, every recent network is new.
 * A network is a /24 (IPv4) or /64 (IPv6): address churn inside one is one client. Many networks in
 * ONE or two countries is a mobile carrier or an ISP reassigning addresses (we cannot see carriers),
 * not sharing. A key that always calls from many places (edge functions in many PoPs) has a high
 * baseline and stays quiet.
 * Severity: medium; high from highNetworks new networks or highCountries countries; critical from
 * criticalNetworks new networks in criticalCountries countries (a key published for anyone to use).
 */
import { HISTORY_MS } from '../src/detect/key-history.ts';
import { ValueMinutes, entryAdded, entryRemoved } from '../src/detect/tallies.ts';
import type { Finding, RuleDefinition, Severity, WindowEvent } from '../src/detect/types.ts';

type Params = {
  windowMinutes: number;
  /** Length of the recent interval and of each baseline interval. */
  intervalMinutes: number;
  minNetworks: number;
  baselineMultiplier: number;
  minCountries: number;
  highNetworks: number;
  highCountries: number;
  criticalNetworks: number;
  criticalCountries: number;
};

const MINUTE = 60_000;
const MAX_SAMPLES = 10;
const HISTORY_DAYS = HISTORY_MS / (24 * 60 * MINUTE);

/** The screen's tally: the window's networks, each with the time it was last seen and the minutes it was seen in. */
type Tally = ValueMinutes<string>;

export const rule: RuleDefinition<Params, Tally> = {
  id: 'credential_sharing',
  version: '1.1.0',
  title: 'Credential sharing',
  description:
    'A key is used from many more networks and countries than it usually is: it has been shared, leaked or ' +
    'published, and several parties are calling with it.',
  windowMs: 60 * MINUTE,
  // The recent interval's requests give the evidence (IPs, user agents); of earlier intervals only
  // which networks were seen in them counts, and thinning keeps every network of every minute.
  detailMs: 10 * MINUTE,
  defaults: {
    windowMinutes: 60,
    intervalMinutes: 10,
    minNetworks: 5,
    baselineMultiplier: 3,
    minCountries: 3,
    highNetworks: 15,
    highCountries: 6,
    criticalNetworks: 50,
    criticalCountries: 10,
  },
  actions: { low: 'monitor', medium: 'investigate', high: 'investigate', critical: 'block' },
  falsePositives: [
    'Address churn inside one /24 or one /64 (NAT pools, IPv6 privacy addresses): one network.',
    'Many networks in one or two countries (a mobile carrier, an ISP, a cloud region\'s changing egress IPs): below minCountries.',
    'A deployment that always calls from many places (edge functions, multi-region): its baseline is high, so the multiplier is not reached.',
    'A deployment used on and off (a daily or hourly job from several regions, a region idle for hours): networks the key used in the last 7 days are its own, not new.',
    'A key that just moved to a global edge platform alerts once; dismiss it with a note: its new networks are its own from then on.',
  ],
  evaluate(window, params, now) {
    const { events } = window;
    const intervalMs = params.intervalMinutes * MINUTE;
    const recentStart = now - intervalMs;
    const needed = Math.max(1, params.minNetworks);

    // Cheap pass: stop as soon as the recent interval shows minNetworks networks. Most keys show one,
    // so nothing is allocated until a second network appears.
    let count = 0;
    let first: string | undefined;
    let last: string | undefined;
    let others: string[] | undefined;
    for (let i = events.length - 1; i >= 0 && count < needed; i--) {
      const event = events[i]!;
      if (event.timestamp < recentStart) break;
      const network = event.network;
      if (network === last) continue;
      last = network;
      if (first === undefined) {
        first = network;
        count = 1;
      } else if (network !== first && !(others ??= []).includes(network)) {
        others.push(network);
        count++;
      }
    }
    if (count < needed) return [];

    // Full pass: which intervals each network was seen in (bit k = k intervals ago).
    const intervals = intervalsOf(params);
    const windowStart = now - intervals * intervalMs;
    const networkIntervals = new Map<string, number>();
    /** Countries of the recent events from new networks. */
    const countries = new Set<string>();
    /** The recent events from new networks, newest first. */
    const recent: WindowEvent[] = [];
    const newNetworks = new Set<string>();
    let knownNetworks = 0;
    const active = new Array<boolean>(intervals).fill(false);
    for (let i = events.length - 1; i >= 0; i--) {
      const event = events[i]!;
      if (event.timestamp < windowStart) break;
      // Interval k is [now - (k + 1) × interval, now - k × interval); the recent one includes both ends.
      const k = Math.max(0, Math.min(intervals - 1, Math.ceil((now - event.timestamp) / intervalMs) - 1));
      active[k] = true;
      const bits = networkIntervals.get(event.network) ?? 0;
      networkIntervals.set(event.network, bits | (1 << k));
      if (k !== 0) continue;
      // A network's first recent event (newest first) decides whether it is new.
      if (!(bits & 1)) {
        if (window.history?.knowsNetwork(event.network, windowStart)) knownNetworks++;
        else newNetworks.add(event.network);
      }
      if (!newNetworks.has(event.network)) continue;
      recent.push(event);
      const country = event.country ?? event.geo?.country;
      if (country) countries.add(country);
    }
    const perInterval = new Array<number>(intervals).fill(0);
    for (const bits of networkIntervals.values()) {
      for (let k = 0; k < intervals; k++) if (bits & (1 << k)) perInterval[k]!++;
    }
    const recentNetworks = perInterval[0]!;
    const fresh = newNetworks.size;
    const baselineCounts = perInterval.slice(1).filter((_, k) => active[k + 1]);
    const baseline = median(baselineCounts);
    const ratio = recentNetworks / Math.max(1, baseline);
    if (fresh < params.minNetworks || ratio < params.baselineMultiplier || countries.size < params.minCountries) return [];

    const severity: Severity =
      fresh >= params.criticalNetworks && countries.size >= params.criticalCountries
        ? 'critical'
        : fresh >= params.highNetworks || countries.size >= params.highCountries
          ? 'high'
          : 'medium';
    // Surer the more new networks (log scale up to criticalNetworks) and the further above the baseline.
    const spread = Math.log(fresh / params.minNetworks) / Math.log(params.criticalNetworks / params.minNetworks);
    const excess = Math.log(ratio / params.baselineMultiplier) / Math.log(10);
    const confidence = round(clamp01(0.4 + 0.3 * clamp01(spread) + 0.3 * clamp01(excess)), 3);

    recent.reverse();
    // One sample event per network, in order of first appearance.
    const firstPerNetwork = new Map<string, WindowEvent>();
    for (const event of recent) if (!firstPerNetwork.has(event.network)) firstPerNetwork.set(event.network, event);
    const samples = [...firstPerNetwork.values()].slice(0, MAX_SAMPLES);
    const ips = new Set(recent.map((e) => e.ip));
    const key = window.apiKeyId;
    const countryList = [...countries].sort();
    // Without an earlier active interval there is no baseline to speak of, only its absence.
    // A key without requests earlier in the window has no baseline there; its history (7 days) may
    // still have known some of its networks, and then it was idle rather than new.
    const earlierMinutes = (intervals - 1) * params.intervalMinutes;
    const usually =
      baselineCounts.length > 0 ? `usually ${baseline}` : knownNetworks > 0 ? `idle in the previous ${earlierMinutes} min` : 'no earlier history';
    const against =
      baselineCounts.length > 0
        ? `against a baseline of ${baseline} per ${params.intervalMinutes} min`
        : knownNetworks > 0
          ? `after no requests in the previous ${earlierMinutes} min`
          : `with no earlier history in the last ${intervals * params.intervalMinutes} min to compare with`;
    // Named only when the key's history knew some of the recent networks: then not all of them are new.
    const networksSeen = knownNetworks > 0 ? `${fresh} new networks` : `${fresh} networks`;
    const besides = knownNetworks > 0 ? ` it had not used in the last ${HISTORY_DAYS} days (besides ${knownNetworks} it had)` : '';
    const finding: Finding = {
      scope: key,
      apiKeyId: key,
      severity,
      confidence,
      title: `Credential sharing on ${key}: ${networksSeen} in ${countries.size} countries in ${params.intervalMinutes} min (${usually})`,
      summary:
        `${key} was used from ${fresh} networks${besides} (${ips.size} IPs) in ${countries.size} countries (${countryList.slice(0, 5).join(', ')}${countries.size > 5 ? ', …' : ''}) ` +
        `in the last ${params.intervalMinutes} min, ${against} and a threshold of ${params.minNetworks}; ` +
        `the key looks shared or leaked: confirm with the merchant and rotate its secret.`,
      evidence: {
        recentNetworks,
        newNetworks: fresh,
        knownNetworks,
        minNetworks: params.minNetworks,
        baselineNetworks: baseline,
        baselineIntervals: baselineCounts.length,
        baselineMultiplier: params.baselineMultiplier,
        observedMultiplier: round(ratio, 2),
        networksPerInterval: [...perInterval].reverse(),
        countries: countryList,
        distinctCountries: countries.size,
        minCountries: params.minCountries,
        distinctIps: ips.size,
        sampleIps: samples.map((e) => e.ip),
        networks: samples.map((e) => e.network),
        userAgents: [...new Set(recent.map((e) => e.userAgent))].slice(0, MAX_SAMPLES),
        intervalMinutes: params.intervalMinutes,
        windowMinutes: intervals * params.intervalMinutes,
        sampleEventIds: samples.map((e) => e.eventId),
        windowMs: intervals * intervalMs,
      },
      firstSeenAt: recent[0]!.timestamp,
      lastSeenAt: recent[recent.length - 1]!.timestamp,
    };
    return [finding];
  },
  screen: {
    create: () => new ValueMinutes<string>(),
    add: (networks, event) => entryAdded(networks.add(event.network, event.timestamp)),
    remove: (networks, event) => entryRemoved(networks.remove(event.network, event.timestamp)),
    entries: (networks) => networks.size,
    // evaluate's test, with at most its recent networks (those seen since the recent interval began)
    // against at least its baseline: a busy key that always calls from many networks (edge functions,
    // several regions) has its window read only when its recent networks outnumber its usual ones.
    mayFire(networks, params, now) {
      const needed = Math.max(1, params.minNetworks);
      if (networks.size < needed) return false;
      const recent = networks.countSince(now - params.intervalMinutes * MINUTE);
      if (recent < needed) return false;
      const baseline = baselineAtLeast(networks, params, now);
      return baseline === undefined || !(recent < params.baselineMultiplier * Math.max(1, baseline));
    },
  },
};

/** How many intervals the window is cut into: the recent one and the baseline's. */
function intervalsOf(params: Params): number {
  return Math.max(1, Math.min(30, Math.floor(params.windowMinutes / params.intervalMinutes)));
}

/**
 * At least the baseline evaluate computes (the median of distinct networks per earlier interval in
 * which the key was active), from the minutes each network was seen in: a network surely counts in
 * an interval when it was seen in a minute wholly inside it. Undefined when that cannot tell
 * whether an interval was active at all (its only events fall in minutes it shares with another).
 */
function baselineAtLeast(networks: Tally, params: Params, now: number): number | undefined {
  const intervalMs = params.intervalMinutes * MINUTE;
  const intervals = intervalsOf(params);
  if (!(intervalMs > 0)) return undefined;
  if (intervals < 2) return 0;
  // Interval k holds the times t with k = ceil((now - t) / interval) - 1, as evaluate cuts them.
  const surely = new Array<number>(intervals).fill(0);
  const touched = new Array<boolean>(intervals).fill(false);
  for (const { minutes } of networks.minuteLists()) {
    let seen = 0; // bit k: seen in a minute wholly inside interval k
    for (let at = 0; at < minutes.length; at += 2) {
      const start = minutes[at]! * MINUTE;
      const earliest = Math.ceil((now - start) / intervalMs) - 1; // the interval of the minute's first instant
      const latest = Math.floor((now - start - MINUTE) / intervalMs); // of its last
      if (earliest === latest) {
        if (earliest >= 1 && earliest < intervals) seen |= 1 << earliest;
      } else {
        for (let k = Math.max(1, latest); k <= Math.min(intervals - 1, earliest); k++) touched[k] = true;
      }
    }
    for (let k = 1; k < intervals; k++) if (seen & (1 << k)) surely[k]!++;
  }
  const history: number[] = [];
  for (let k = 1; k < intervals; k++) {
    if (surely[k]! > 0) history.push(surely[k]!);
    else if (touched[k]) return undefined;
  }
  return median(history);
}

function median(values: readonly number[]): number {
  if (values.length === 0) return 0;
  const sorted = [...values].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
}

function clamp01(x: number): number {
  return Number.isFinite(x) ? Math.min(1, Math.max(0, x)) : 0;
}

function round(x: number, digits: number): number {
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}
