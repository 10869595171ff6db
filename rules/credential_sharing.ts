/**
 * credential_sharing: one key suddenly used from many networks in many countries, compared with the
 * key's own history. The window is cut into intervals of intervalMinutes counted back from `now`;
 * the last one is "recent", the earlier ones are the baseline (the median of distinct networks per
 * interval in which the key was active; 0 when it has no history). The recent networks the key had
 * already used before the window, in the last days the engine remembers (KeyWindow.history), are
 * its own: a daily job from five regions, or a deployment idle for hours, is not sharing; so are
 * new networks at a place it was seen at before the window (the same or a neighbouring one-degree
 * cell, as impossible_travel tells places): a job's cloud regions whose egress /24s change every
 * run. Networks and places count as the key's only once tied to its others (seen within half an
 * hour of one of them, key-history.ts): networks a reseller primed with one request each while the
 * key was idle are still new. The new ones are those it had not, in places it had not (a network
 * without geo: by the network alone). It fires when
 *   new networks >= minNetworks AND recent networks >= baselineMultiplier × max(1, baseline)
 *   AND the new networks' countries >= minCountries;
 * or, over the whole window (a leak that grows a few networks an interval raises its own baseline
 * and never shows the jump), while new networks still come in the recent interval, when
 *   the window's new networks >= max(minNetworks, windowNetworks)
 *   AND >= baselineMultiplier × max(1, baseline, places the key was seen at before the window)
 *   AND their countries >= minCountries.
 * (A key whose end users churn through many places has many places in its history.)
 * Without a history, every network is new.
 * A network is a /24 (IPv4) or /64 (IPv6): address churn inside one is one client. Many networks in
 * ONE or two countries is a mobile carrier or an ISP reassigning addresses (we cannot see carriers),
 * not sharing. A key that always calls from many places (edge functions in many PoPs) has a high
 * baseline and stays quiet.
 * Severity: medium; high from highNetworks new networks or highCountries countries; critical from
 * criticalNetworks new networks in criticalCountries countries (a key published for anyone to use).
 */
import { HISTORY_MS } from '../src/detect/key-history.ts';
import { ValueMinutes, entryAdded, entryRemoved } from '../src/detect/tallies.ts';
import type { Finding, GeoPoint, KeyHistoryView, RuleDefinition, Severity, WindowEvent } from '../src/detect/types.ts';
import { cellOf, nearCells } from './network.ts';

type Params = {
  windowMinutes: number;
  /** Length of the recent interval and of each baseline interval. */
  intervalMinutes: number;
  minNetworks: number;
  baselineMultiplier: number;
  minCountries: number;
  /**
   * New networks (in new places) across the whole window that make a finding while more still
   * come: a leak that grows a few networks an interval raises its own baseline. Also at least
   * minNetworks, baselineMultiplier × the baseline and × the places the key had, minCountries countries.
   */
  windowNetworks: number;
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
  version: '1.3.0',
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
    windowNetworks: 10,
    highNetworks: 15,
    highCountries: 6,
    criticalNetworks: 50,
    criticalCountries: 10,
  },
  actions: { low: 'monitor', medium: 'investigate', high: 'investigate', critical: 'block' },
  falsePositives: [
    'Address churn inside one /24 or one /64 (NAT pools, IPv6 privacy addresses): one network.',
    'Many networks in one or two countries (a mobile carrier, an ISP, a cloud region\'s changing egress IPs): below minCountries.',
    'A job in several cloud regions whose egress /24s change every run: a new network in a place (one-degree cell, or a neighbouring one) the key used in the last 7 days is its own.',
    'A key whose users churn through many places (an SDK in end users\' hands): the window\'s test needs new networks many times the places the key had before, and the interval\'s test its usual per interval.',
    'A deployment that always calls from many places (edge functions, multi-region): its baseline is high, so the multiplier is not reached.',
    'A deployment used on and off (a daily or hourly job from several regions, a region idle for hours): networks the key used in the last 7 days, and places it used, are its own, not new, once they were used within 30 minutes of the key\'s other networks or places (or were its first).',
    'Not avoided: strangers in the cities the key already uses (within about 100-200 km) do not count; a leak to other cities still alerts.',
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

    // Full pass: which intervals each network was seen in (bit k = k intervals ago), and whether
    // it is new to the key: neither the network nor its place (the one-degree cell, or one next to
    // it) was seen before the window. A key's own region with a fresh egress /24 is not a stranger.
    const intervals = intervalsOf(params);
    const windowStart = now - intervals * intervalMs;
    const networkIntervals = new Map<string, number>();
    /** Per network of the window: true when it is new (decided at its newest event), false when the key's own. */
    const isNew = new Map<string, boolean>();
    /** The cells of the places the key was seen at before the window; read when first needed. */
    let knownPlaces: GeoPoint[] | undefined;
    let knownCells: Set<number> | undefined;
    /** Countries of the recent events from new networks. */
    const countries = new Set<string>();
    /** The recent events from new networks, newest first. */
    const recent: WindowEvent[] = [];
    /**
     * Countries of the window's events from new networks, and each new network's newest event (the
     * oldest may have been thinned out of a busy key's window: the newest of each network stays).
     */
    const windowCountries = new Set<string>();
    const newestOfNew = new Map<string, WindowEvent>();
    let knownNetworks = 0;
    let inKnownPlaces = 0;
    const active = new Array<boolean>(intervals).fill(false);
    for (let i = events.length - 1; i >= 0; i--) {
      const event = events[i]!;
      if (event.timestamp < windowStart) break;
      // Interval k is [now - (k + 1) × interval, now - k × interval); the recent one includes both ends.
      const k = Math.max(0, Math.min(intervals - 1, Math.ceil((now - event.timestamp) / intervalMs) - 1));
      active[k] = true;
      const network = event.network;
      const bits = networkIntervals.get(network) ?? 0;
      networkIntervals.set(network, bits | (1 << k));
      let newNetwork = isNew.get(network);
      if (newNetwork === undefined) {
        // A network's newest event (newest first) decides whether it is new.
        if (window.history?.knowsNetwork(network, windowStart)) {
          newNetwork = false;
          if (k === 0) knownNetworks++;
        } else if (event.geo && !Number.isNaN(event.geo.latitude) && !Number.isNaN(event.geo.longitude)) {
          if (knownCells === undefined) {
            knownPlaces = window.history?.placesBefore(windowStart) ?? [];
            knownCells = new Set(knownPlaces.map(cellOf));
          }
          newNetwork = !nearCells(knownCells, event.geo);
          if (!newNetwork && k === 0) inKnownPlaces++;
        } else {
          newNetwork = true;
        }
        isNew.set(network, newNetwork);
      }
      if (!newNetwork) continue;
      if (!newestOfNew.has(network)) newestOfNew.set(network, event);
      const country = event.country ?? event.geo?.country;
      if (country) windowCountries.add(country);
      if (k !== 0) continue;
      recent.push(event);
      if (country) countries.add(country);
    }
    const perInterval = new Array<number>(intervals).fill(0);
    let freshRecent = 0;
    for (const [network, bits] of networkIntervals) {
      for (let k = 0; k < intervals; k++) if (bits & (1 << k)) perInterval[k]!++;
      if (bits & 1 && isNew.get(network)) freshRecent++;
    }
    const recentNetworks = perInterval[0]!;
    const freshInWindow = newestOfNew.size;
    const baselineCounts = perInterval.slice(1).filter((_, k) => active[k + 1]);
    const baseline = median(baselineCounts);
    const ratio = recentNetworks / Math.max(1, baseline);
    /** How many places the key was seen at before the window (read only when it counts). */
    const placesBefore = (): number => (knownPlaces ??= window.history?.placesBefore(windowStart) ?? []).length;
    // The recent interval against the key's usual; else the whole window, for a leak that grows
    // interval by interval and so raises its own baseline: new networks in new places across the
    // window, while some still come, many times the key's usual per interval and the places it had.
    const byInterval = freshRecent >= params.minNetworks && ratio >= params.baselineMultiplier && countries.size >= params.minCountries;
    const byWindow =
      !byInterval &&
      freshRecent > 0 &&
      freshInWindow >= Math.max(params.minNetworks, params.windowNetworks) &&
      windowCountries.size >= params.minCountries &&
      freshInWindow >= params.baselineMultiplier * Math.max(1, baseline, placesBefore());
    if (!byInterval && !byWindow) return [];

    const fresh = byInterval ? freshRecent : freshInWindow;
    const judged = byInterval ? countries : windowCountries;
    const severity: Severity =
      fresh >= params.criticalNetworks && judged.size >= params.criticalCountries
        ? 'critical'
        : fresh >= params.highNetworks || judged.size >= params.highCountries
          ? 'high'
          : 'medium';
    // Surer the more new networks (log scale up to criticalNetworks) and the further above the baseline.
    const excessRatio = byInterval ? ratio : freshInWindow / Math.max(1, baseline);
    const spread = Math.log(fresh / params.minNetworks) / Math.log(params.criticalNetworks / params.minNetworks);
    const excess = Math.log(excessRatio / params.baselineMultiplier) / Math.log(10);
    const confidence = round(clamp01(0.4 + 0.3 * clamp01(spread) + 0.3 * clamp01(excess)), 3);

    recent.reverse();
    // One sample event per network: of the recent interval's, the first in order of first
    // appearance; of the window's, the newest of each, oldest first.
    let samples: WindowEvent[];
    if (byInterval) {
      const firstPerNetwork = new Map<string, WindowEvent>();
      for (const event of recent) if (!firstPerNetwork.has(event.network)) firstPerNetwork.set(event.network, event);
      samples = [...firstPerNetwork.values()].slice(0, MAX_SAMPLES);
    } else {
      samples = [...newestOfNew.values()].reverse().slice(0, MAX_SAMPLES);
    }
    const ips = new Set(recent.map((e) => e.ip));
    const key = window.apiKeyId;
    const countryList = [...countries].sort();
    const judgedList = [...judged].sort();
    // Without an earlier active interval there is no baseline to speak of, only its absence.
    // A key without requests earlier in the window has no baseline there; its history (7 days) may
    // still have known some of its networks, and then it was idle rather than new.
    const earlierMinutes = (intervals - 1) * params.intervalMinutes;
    const windowMinutes = intervals * params.intervalMinutes;
    const own = knownNetworks + inKnownPlaces;
    const usually =
      baselineCounts.length > 0 ? `usually ${baseline}` : own > 0 ? `idle in the previous ${earlierMinutes} min` : 'no earlier history';
    const against =
      baselineCounts.length > 0
        ? `against a baseline of ${baseline} per ${params.intervalMinutes} min`
        : own > 0
          ? `after no requests in the previous ${earlierMinutes} min`
          : `with no earlier history in the last ${windowMinutes} min to compare with`;
    // Named only when the key's history knew some of the recent networks or their places: then not all of them are new.
    const networksSeen = own > 0 || !byInterval ? `${fresh} new networks` : `${fresh} networks`;
    const besides = own > 0 ? ` (besides ${own} of its own networks or places)` : '';
    const newTo = `it had not used in the last ${HISTORY_DAYS} days, in places it had not used either`;
    const named = `${judged.size} countries (${judgedList.slice(0, 5).join(', ')}${judged.size > 5 ? ', …' : ''})`;
    const finding: Finding = {
      scope: key,
      apiKeyId: key,
      severity,
      confidence,
      title: byInterval
        ? `Credential sharing on ${key}: ${networksSeen} in ${countries.size} countries in ${params.intervalMinutes} min (${usually})`
        : `Credential sharing on ${key}: ${fresh} new networks in ${windowCountries.size} countries in ${windowMinutes} min, more every interval (${usually} per ${params.intervalMinutes} min)`,
      summary: byInterval
        ? `${key} was used from ${fresh} networks ${newTo}${besides} (${ips.size} IPs) in ${named} ` +
          `in the last ${params.intervalMinutes} min, ${against} and a threshold of ${params.minNetworks}; ` +
          `the key looks shared or leaked: confirm with the merchant and rotate its secret.`
        : `${key} was used from ${fresh} networks ${newTo} in ${named} in the last ${windowMinutes} min, ` +
          `${freshRecent} of them in the last ${params.intervalMinutes} min; it had ${placesBefore()} ${placesBefore() === 1 ? 'place' : 'places'} before, ` +
          `${against} (a threshold of ${Math.max(params.minNetworks, params.windowNetworks)} new networks in the window); ` +
          `the key looks shared or leaked, more parties joining: confirm with the merchant and rotate its secret.`,
      evidence: {
        trigger: byInterval ? 'interval' : 'window',
        recentNetworks,
        newNetworks: freshRecent,
        knownNetworks,
        newNetworksInKnownPlaces: inKnownPlaces,
        minNetworks: params.minNetworks,
        baselineNetworks: baseline,
        baselineIntervals: baselineCounts.length,
        baselineMultiplier: params.baselineMultiplier,
        observedMultiplier: round(ratio, 2),
        networksPerInterval: [...perInterval].reverse(),
        countries: countryList,
        distinctCountries: countries.size,
        minCountries: params.minCountries,
        windowNewNetworks: freshInWindow,
        windowCountries: [...windowCountries].sort(),
        windowNetworks: params.windowNetworks,
        knownPlaces: placesBefore(),
        distinctIps: ips.size,
        sampleIps: samples.map((e) => e.ip),
        networks: samples.map((e) => e.network),
        userAgents: [...new Set(recent.map((e) => e.userAgent))].slice(0, MAX_SAMPLES),
        intervalMinutes: params.intervalMinutes,
        windowMinutes,
        sampleEventIds: samples.map((e) => e.eventId),
        windowMs: intervals * intervalMs,
      },
      firstSeenAt: byInterval ? recent[0]!.timestamp : samples[0]!.timestamp,
      lastSeenAt: recent[recent.length - 1]!.timestamp,
    };
    return [finding];
  },
  screen: {
    create: () => new ValueMinutes<string>(),
    add: (networks, event) => entryAdded(networks.add(event.network, event.timestamp)),
    remove: (networks, event) => entryRemoved(networks.remove(event.network, event.timestamp)),
    entries: (networks) => networks.size,
    // evaluate's tests, with at most its recent networks (those seen since the recent interval began),
    // at most its new networks of the window (all the window's networks), against at least its
    // baseline: a busy key that always calls from many networks (edge functions, several regions)
    // has its window read only when its recent networks outnumber its usual ones, or the window's
    // networks outnumber them and the places it had before many times over.
    mayFire(networks, params, now, history) {
      const needed = Math.max(1, params.minNetworks);
      if (networks.size < needed) return false;
      const recent = networks.countSince(now - params.intervalMinutes * MINUTE);
      if (recent < needed) return false;
      const baseline = baselineAtLeast(networks, params, now);
      if (baseline === undefined || !(recent < params.baselineMultiplier * Math.max(1, baseline))) return true;
      return mayFireByWindow(networks.size, baseline, params, now, history);
    },
  },
};

/** Whether the window's networks (at least its new ones) could reach evaluate's test of the whole window. */
function mayFireByWindow(networks: number, baselineAtLeast: number, params: Params, now: number, history: KeyHistoryView | undefined): boolean {
  if (networks < Math.max(params.minNetworks, params.windowNetworks)) return false;
  if (networks < params.baselineMultiplier * Math.max(1, baselineAtLeast)) return false;
  // Read last: only a key with many networks in its window, above its usual, gets this far.
  const windowStart = now - intervalsOf(params) * params.intervalMinutes * MINUTE;
  return !(networks < params.baselineMultiplier * (history?.placesBefore(windowStart).length ?? 0));
}

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
