/**
 * velocity_attack: a key sending more requests per minute than its rate limit allows, sustained.
 * Minutes are UTC clock minutes (as fixed-window rate limiters count them). A minute is "over" when
 * its count exceeds limit × thresholdRatio. The minutes judged are the last windowMinutes (5) full
 * minutes, the current one, and any later minute the key's events are dated in (a producer's clock a
 * little fast: admission takes events up to 5 minutes ahead), each minute with its own events; the
 * current and later minutes are partial, and count once they are already over, since their counts
 * can only grow. The rule fires when at least minMinutesOver (2) over minutes lie in one stretch of
 * minutes whose own rate is over too: its requests above thresholdRatio × its minutes' limits. Back
 * to back over minutes always are; a job bursting once every few minutes, quiet in between, is not
 * (its stretch's rate is under the limit), while a flood that skips every other minute still is. Two
 * adjacent over minutes must be over without their busiest 60 seconds too, so a burst of seconds
 * that straddles a minute boundary is one spike, however the clock cuts it.
 * Severity follows the rate the key SUSTAINED over that stretch — the minMinutesOver-th busiest
 * over minute, or the stretch's own rate, or its over minutes' rate without their busiest 60
 * seconds, whichever is lowest — so one huge spike next to a mild excess stays medium, straddling a
 * minute boundary or not: medium >= 1.5x the limit, high >= 3x, critical >= 10x. Of several such stretches, the
 * finding reports the most severe, then the one with the most over minutes.
 * A key busier than the engine's per-key cap: the minutes it cut count the requests it dropped too
 * (window.dropped), so a flood is rated by all its requests, not by the part the window holds.
 * A minute's limit is the highest an event of it carried (RateLimit-Limit); an event without one
 * (rateLimitPerMinute 0) leaves it to defaultLimitPerMinute, the plan's default unless overridden.
 * Requests answered 5xx are not counted: during our own outage, clients retrying failed calls
 * multiply their rate without anything about them changing (high_failure_rate leaves 5xx out too).
 * 429 counts: that is the rate limiter seeing the flood. But a critical rate mostly answered 429 to
 * addresses in the key's own places (established an hour before the window) that each send at most
 * patientPerMinute a minute (clients honouring Retry-After, hundreds of them) is high: held to the
 * limit already, it is throttled, not blocked.
 */
import { firstAtOrAfter } from '../src/detect/search.ts';
import { FORGOTTEN, MinuteRing, minuteOf, NO_EVENTS } from '../src/detect/tallies.ts';
import type { Finding, RuleDefinition, Severity, WindowEvent } from '../src/detect/types.ts';
import { ownPlaces } from './network.ts';

type Params = {
  /** Full clock minutes looked at, before the current one. */
  windowMinutes: number;
  /** How many over minutes one stretch must hold: one spike minute is not an attack. */
  minMinutesOver: number;
  /** A minute is over when its count exceeds limit × thresholdRatio; this is also the medium band. */
  thresholdRatio: number;
  highRatio: number;
  criticalRatio: number;
  /** An address sending at most this many requests a minute, on average over the over minutes, is a client backing off (Retry-After) when answered 429. */
  patientPerMinute: number;
  /** The limit of a minute whose events carry none (the fleet sends no RateLimit-Limit): the plan's default, 60, unless overridden per plan or merchant; 0 leaves such a minute unjudged (enterprise by default: its limits are custom). */
  defaultLimitPerMinute: number;
};

const MINUTE = 60_000;
const MAX_SAMPLES = 10;
/** How long before the window a place must have been the key's for its clients to count as backing off. */
const OWN_PLACE_LEAD_MS = 60 * MINUTE;
/**
 * Minutes after the current one that are judged, each on its own: admission takes events dated up
 * to 5 minutes ahead of the clock (MAX_CLOCK_SKEW_MS), and a batch is judged as of its newest event,
 * at most the clock. An event dated later still (judged as of an earlier batch's time) is left for
 * the judgements as of its own time.
 */
const FUTURE_MINUTES = 5;

/**
 * The screen's tally, per clock minute of the last RING_MINUTES: the events, and the lowest limit any
 * of them carried (a minute is judged against its highest limit, which is at least that; it is not
 * raised when events leave); Infinity while none carried one (the minute is then judged against
 * defaultLimitPerMinute). Events answered 5xx are left out, as evaluate leaves them out.
 */
const RING_MINUTES = 16;
const EVENTS = 0;
const LOWEST_LIMIT = 1;

interface Over {
  slot: number;
  count: number;
  limit: number;
  ratio: number;
}

/** The limit of a minute whose events carry none: defaultLimitPerMinute, or Infinity (never over: not judged) when it is 0 or less. */
function defaultLimit(params: Params): number {
  return params.defaultLimitPerMinute > 0 ? params.defaultLimitPerMinute : Infinity;
}

export const rule: RuleDefinition<Params, MinuteRing> = {
  id: 'velocity_attack',
  version: '1.6.0',
  title: 'Velocity attack',
  description:
    'A key sends well above its per-minute rate limit for several minutes: a script hammering the API, ' +
    'a leaked key being used at scale, or an integration stuck in a retry loop.',
  windowMs: 6 * MINUTE,
  defaults: {
    windowMinutes: 5,
    minMinutesOver: 2,
    thresholdRatio: 1.5,
    highRatio: 3,
    criticalRatio: 10,
    patientPerMinute: 2,
    defaultLimitPerMinute: 60,
  },
  // The spec's enterprise limits are custom: its minutes whose events carry no limit (RateLimit-Limit)
  // are not judged against 60, which would block an enterprise key at its own contracted rate.
  planDefaults: { enterprise: { defaultLimitPerMinute: 0 } },
  // A minute none of whose events carries a limit is then left unjudged (the engine counts such events).
  needsLimit: (params) => defaultLimit(params) === Infinity,
  actions: { low: 'monitor', medium: 'rate_limit', high: 'rate_limit', critical: 'block' },
  falsePositives: [
    'A short legitimate burst (a batch job, a backfill) under limit × thresholdRatio: never over.',
    'Hundreds of clients honouring Retry-After (a backfill fanned out to a worker per message, each waiting as told after its 429): most of a critical rate answered 429 to addresses in places the key was established at an hour before the window, sending at most patientPerMinute (2) a minute is high (throttle), not critical: the limiter holds it, and a block would stop the merchant\'s own. Below critical it counts as any excess does.',
    'Accepted: a flood from a new address per request (an IPv6 /64, a proxy pool) in a city or cloud region the key was established at an hour before looks like its clients backing off, and is high (throttled), not critical (blocked); so is one from a place primed there over an hour before. From anywhere else it is critical.',
    'A single spike minute: one minute over is not sustained (minMinutesOver = 2), nor is a spike of seconds that straddles a minute boundary (outside its busiest 60 seconds, nothing is over).',
    'A cron job bursting once every few minutes, quiet in between: its over minutes are not one stretch over the limit.',
    'A producer whose clock runs a few minutes fast: its events count in their own minutes, never piled into the current one.',
    'A raised limit (plan upgrade, custom RateLimit-Limit): each minute is judged against the highest limit its events carry.',
    'A fleet that sends no RateLimit-Limit for a plan whose real limit is higher: set defaultLimitPerMinute for that plan or merchant. Enterprise limits are custom (the spec): its minutes without a carried limit are not judged unless a default is set for it.',
    'Retries during our own outage (a client retrying each 503 three times): requests answered 5xx are not counted.',
    'A nightly batch deliberately above the limit is still reported; allowlist the key or raise its limit.',
  ],
  evaluate(window, params, now) {
    const { events } = window;
    const minutes = Math.max(1, Math.floor(params.windowMinutes));
    const currentMinute = Math.floor(now / MINUTE);
    const firstMinute = currentMinute - minutes;
    // Slot i counts minute firstMinute + i: the full minutes, the current one, then the minutes ahead.
    const slots = minutes + 1 + FUTURE_MINUTES;
    const counts = new Array<number>(slots).fill(0);
    const limits = new Array<number>(slots).fill(0);
    // Events are in time order, so each minute's counted events lie in one run: from its first to
    // its last counted event (events answered 5xx, not counted, may sit among them).
    const starts = new Array<number>(slots).fill(0);
    const ends = new Array<number>(slots).fill(0);
    const windowStart = firstMinute * MINUTE;
    const windowEnd = windowStart + slots * MINUTE;
    const first = firstAtOrAfter(events, windowStart);
    let slot = 0;
    let slotEnd = windowStart + MINUTE;
    for (let i = first; i < events.length; i++) {
      const event = events[i]!;
      if (event.timestamp >= windowEnd) break;
      if (!counted(event)) continue;
      while (event.timestamp >= slotEnd) {
        slot++;
        slotEnd += MINUTE;
      }
      if (counts[slot]!++ === 0) starts[slot] = i;
      ends[slot] = i + 1;
      if (event.rateLimitPerMinute > limits[slot]!) limits[slot] = event.rateLimitPerMinute;
    }
    // A key busier than the engine's per-key cap: the minutes it cut hold their newest requests only,
    // and the rest are counted from what the cap dropped (so the minutes it holds whole and the
    // minutes it cut are judged alike: a flood is not rated by the part of it the cap could hold).
    const { dropped } = window;
    const droppedIn = (slot: number) => (dropped ? dropped.count(firstMinute + slot) - dropped.serverErrors(firstMinute + slot) : 0);
    for (let slot = 0; dropped && slot < slots; slot++) {
      const more = droppedIn(slot);
      if (!(more > 0)) continue;
      counts[slot]! += more;
      limits[slot] = Math.max(limits[slot]!, dropped.highestLimit(firstMinute + slot));
    }
    /**
     * At least how many counted requests the busiest 60 seconds of the two minutes from `slot` hold,
     * where the cap cut them: the most that any 60 seconds on a 10-second boundary hold of the
     * requests the cap dropped (kept by 10-second step) and of the window's events (see oneBurst).
     */
    const busiestAtLeast = (slot: number) => {
      const from = windowStart + slot * MINUTE;
      let most = 0;
      for (let start = from; start <= from + MINUTE; start += 10_000) {
        let held = dropped!.answeredBetween(start, start + MINUTE);
        const end = firstAtOrAfter(events, start + MINUTE);
        for (let i = firstAtOrAfter(events, start); i < end; i++) if (counted(events[i]!)) held++;
        if (held > most) most = held;
      }
      return most;
    };
    // No limit carried and none by default (0: the plan's is custom): the minute is not judged.
    const limitOf = (slot: number) => (limits[slot]! > 0 ? limits[slot]! : defaultLimit(params));

    const over: Over[] = [];
    for (let slot = 0; slot < slots; slot++) {
      const limit = limitOf(slot);
      const count = counts[slot]!;
      if (count > limit * params.thresholdRatio) over.push({ slot, count, limit, ratio: count / limit });
    }
    const needed = Math.max(1, Math.floor(params.minMinutesOver));
    if (over.length < needed) return [];

    // A minute the engine's per-key cap cut (window.cappedAt) holds part of its requests only: the
    // rest are known by 10-second step (window.dropped), not one by one. Without that record (the
    // engine forgets it when a reloaded allowlist takes requests out of the window), a minute is
    // counted from what the window holds, and judged as a whole one is.
    const whole = (o: Over) => dropped === undefined || windowStart + o.slot * MINUTE > (window.cappedAt ?? -Infinity);
    // Two adjacent over minutes that are one burst of seconds straddling the boundary between them (60
    // seconds touch at most two clock minutes; without their busiest 60 seconds, of time, not a clock
    // minute, they are not over): one over minute, as they would be had the burst fallen within one.
    // (When a bound found by binary search already leaves enough, the events need not be read.) Where
    // the cap cut the first, what the cap dropped is known by 10-second step: the busiest 60 seconds
    // on a 10-second boundary are counted instead, which any burst of 50 seconds or less fills.
    const oneBurst = over.map((o, i) => {
      const next = over[i + 1];
      if (next === undefined || next.slot !== o.slot + 1) return false;
      const rest = (params.thresholdRatio * (o.limit + next.limit)) / 2;
      const requests = o.count + next.count;
      if (!whole(o)) return !(requests - busiestAtLeast(o.slot) > rest);
      const from = windowStart + o.slot * MINUTE;
      if (requests - busiestMinuteBound(events, from, from + 2 * MINUTE) > rest) return false;
      return !(requests - new BusiestMinute(events, starts[o.slot]!, () => true).upTo(ends[next.slot]!) > rest);
    });
    /** The over minutes among over[a..b], a pair that is one burst counting once. */
    const distinctOver = (a: number, b: number) => {
      let distinct = 0;
      for (let i = a; i <= b; i++, distinct++) if (i < b && oneBurst[i]) i++;
      return distinct;
    };
    const isOver = new Array<boolean>(slots).fill(false);
    for (const o of over) isOver[o.slot] = true;
    const inOverMinute = (event: WindowEvent) => isOver[Math.floor((event.timestamp - windowStart) / MINUTE)] === true;

    // The stretch from one over minute to another whose own rate is over, with the highest severity,
    // then the most over minutes, then the highest sustained rate, then the latest; at most a dozen
    // minutes, so every pair is tried. What a stretch sustained is its minMinutesOver-th busiest over
    // minute, or its own rate, or its over minutes' rate without their busiest 60 seconds (one spike,
    // straddling a boundary or not, never rates a stretch), whichever is lowest. A stretch the cap
    // dropped whole is a flood over since (the window holds none of it to show), reported while the
    // window held it: it is left out, and a stretch that reaches minutes the window holds is judged.
    const band = (ratio: number) => (ratio >= params.criticalRatio ? 2 : ratio >= params.highRatio ? 1 : 0);
    let best: { from: number; to: number; ratio: number; sustained: number } | undefined;
    for (let a = 0; a + needed - 1 < over.length; a++) {
      let requests = 0;
      let allowed = 0;
      let overRequests = 0;
      let overAllowed = 0;
      let slot = over[a]!.slot;
      let busiest: BusiestMinute | undefined;
      let held = false;
      for (let b = a; b < over.length; b++) {
        held ||= ends[over[b]!.slot]! > starts[over[b]!.slot]!;
        for (; slot <= over[b]!.slot; slot++) {
          requests += counts[slot]!;
          allowed += limitOf(slot);
        }
        overRequests += over[b]!.count;
        overAllowed += over[b]!.limit;
        const ratio = requests / allowed;
        if (!held || distinctOver(a, b) < needed || !(ratio > params.thresholdRatio)) continue;
        const overMinutes = b - a + 1;
        let outsideBusiest = Infinity;
        if (overMinutes > 1 && whole(over[a]!)) {
          busiest ??= new BusiestMinute(events, starts[over[a]!.slot]!, inOverMinute);
          outsideBusiest = (overRequests - busiest.upTo(ends[over[b]!.slot]!)) / ((overAllowed * (overMinutes - 1)) / overMinutes);
        }
        const sustained = Math.min(kthRatio(over, a, b, needed), ratio, outsideBusiest);
        const better =
          !best ||
          band(sustained) > band(best.sustained) ||
          (band(sustained) === band(best.sustained) &&
            (b - a > best.to - best.from || (b - a === best.to - best.from && sustained >= best.sustained)));
        if (better) best = { from: a, to: b, ratio, sustained };
      }
    }
    if (!best) return [];
    const stretch = over.slice(best.from, best.to + 1);
    const spanMinutes = stretch[stretch.length - 1]!.slot - stretch[0]!.slot + 1;
    const peak = stretch.reduce((top, o) => (o.ratio > top.ratio ? o : top));
    const sustainedRatio = best.sustained;
    const byRate: Severity = sustainedRatio >= params.criticalRatio ? 'critical' : sustainedRatio >= params.highRatio ? 'high' : 'medium';
    // The over minutes' events are runs of the window: read in place, not copied out.
    const runs = stretch.map((o) => ({ start: starts[o.slot]!, end: ends[o.slot]! }));
    // Most of a critical rate answered 429 to addresses in the key's own places that each wait between
    // tries (Retry-After): many clients backing off (a backfill fanned out to hundreds of
    // workers), held to the limit already; blocking the key would stop the merchant's own. High:
    // throttled, not blocked. Not from elsewhere: a flood from a new address per request (an IPv6
    // /64, a proxy pool) would look patient too.
    // Established an hour before the window: a place primed by one request beside the key's own traffic
    // just before a flood (established by being near the key's places in time) does not count.
    const atOwnPlace = ownPlaces(window.history, windowStart - OWN_PLACE_LEAD_MS);
    const backingOff = byRate === 'critical' ? backingOffShare(events, runs, stretch.length, params.patientPerMinute, (event) => atOwnPlace(event.geo)) : 0;
    const severity: Severity = backingOff > 0.5 ? 'high' : byRate;
    // Within the band, on a log scale; the critical band is read as 10x..30x the limit.
    const [low, high] =
      severity === 'critical'
        ? [params.criticalRatio, params.criticalRatio * 3]
        : severity === 'high'
          ? [params.highRatio, params.criticalRatio]
          : [params.thresholdRatio, params.highRatio];
    const inBand = Math.log(sustainedRatio / low) / Math.log(high / low);
    const persistence = stretch.length / (minutes + 1);
    const confidence = round(clamp01(0.5 * clamp01(inBand) + 0.5 * clamp01(persistence)), 3);

    // Evidence: only the events of the over minutes.
    const { ips, networks, countries, userAgents } = distinctValues(events, runs);
    const lastRun = runs[runs.length - 1]!;
    const threshold = Math.floor(peak.limit * params.thresholdRatio);
    const key = window.apiKeyId;
    const advice =
      rule.actions[severity] === 'block'
        ? 'block the key and rotate its secret unless the merchant confirms the traffic'
        : 'throttle the key and ask the merchant whether this traffic is theirs';
    const where =
      spanMinutes === stretch.length
        ? `${stretch.length} minutes in a row`
        : `${stretch.length} of ${spanMinutes} minutes, ${round(best.ratio, 1)}x its limit over those ${spanMinutes}`;

    const finding: Finding = {
      scope: key,
      apiKeyId: key,
      severity,
      confidence,
      title: `Velocity attack on ${key}: ${peak.count} requests/min (limit ${peak.limit})`,
      summary:
        `${key} exceeded ${round(params.thresholdRatio, 2)}x its rate limit in ${where} ` +
        `(sustained ${round(sustainedRatio, 1)}x, peak ${peak.count} requests/min against a limit of ${peak.limit}) ` +
        `from ${ips.count} IP(s) in ${networks.count} network(s)` +
        (backingOff > 0.5 ? `, ${Math.round(backingOff * 100)}% of it answered 429 to addresses in the key's own places that each send at most ${params.patientPerMinute} a minute (clients backing off, held to the limit already, so not blocked)` : '') +
        `; ${advice}.`,
      evidence: {
        observedRequestsPerMinute: peak.count,
        limitPerMinute: peak.limit,
        thresholdPerMinute: threshold,
        thresholdRatio: params.thresholdRatio,
        peakRatio: round(peak.ratio, 2),
        sustainedRatio: round(sustainedRatio, 2),
        minutesOver: stretch.length,
        minMinutesOver: needed,
        spanMinutes,
        spanRatio: round(best.ratio, 2),
        windowMinutes: minutes,
        perMinute: stretch.map((o) => ({ minute: new Date((firstMinute + o.slot) * MINUTE).toISOString(), requests: o.count, limit: o.limit })),
        requestsInOverMinutes: stretch.reduce((sum, o) => sum + o.count, 0),
        // Of those, the requests counted from what the engine's per-key cap dropped (not in the samples).
        ...(dropped ? { requestsDroppedByCap: stretch.reduce((sum, o) => sum + droppedIn(o.slot), 0) } : {}),
        ...(byRate === 'critical' ? { backingOffShare: round(backingOff, 2) } : {}),
        distinctIps: ips.count,
        ips: ips.values,
        distinctNetworks: networks.count,
        networks: networks.values,
        countries: countries.values,
        userAgents: userAgents.values,
        sampleEventIds: lastEventIds(events, runs, MAX_SAMPLES),
        windowMs: (minutes + 1) * MINUTE,
      },
      // The first over minute's earliest request may be one the cap dropped; the last one's latest is
      // one the window holds, unless the cap dropped that whole minute.
      firstSeenAt: droppedIn(stretch[0]!.slot) > 0 ? dropped!.earliest(firstMinute + stretch[0]!.slot) : events[runs[0]!.start]!.timestamp,
      lastSeenAt: lastRun.end > lastRun.start ? events[lastRun.end - 1]!.timestamp : dropped!.latest(firstMinute + stretch[stretch.length - 1]!.slot),
    };
    return [finding];
  },
  screen: {
    create: () => new MinuteRing(RING_MINUTES, [0, Infinity]),
    add(ring, event) {
      if (!counted(event)) return;
      const at = ring.claim(event.timestamp);
      if (at === FORGOTTEN) return;
      ring.add(at, EVENTS, 1);
      if (event.rateLimitPerMinute > 0) ring.lower(at, LOWEST_LIMIT, event.rateLimitPerMinute);
    },
    remove(ring, event) {
      if (!counted(event)) return;
      const at = ring.find(minuteOf(event.timestamp));
      if (at >= 0) ring.add(at, EVENTS, -1);
    },
    // The minutes evaluate counts, each judged against a limit no higher than evaluate's (its lowest
    // carried limit, or the default when lower: evaluate takes the highest carried, else the default):
    // never fewer minutes over, and evaluate needs minMinutesOver of them. The cap's dropped requests
    // left the ring as they left the window; they count here as they do in evaluate.
    mayFire(ring, params, now, _history, dropped) {
      const minutes = Math.max(1, Math.floor(params.windowMinutes));
      const needed = Math.max(1, Math.floor(params.minMinutesOver));
      const currentMinute = minuteOf(now);
      const firstMinute = currentMinute - minutes;
      const lastMinute = Math.min(Math.max(currentMinute, ring.newestMinute), currentMinute + FUTURE_MINUTES);
      if (lastMinute - firstMinute >= ring.size || !(params.thresholdRatio >= 0)) return true;
      const fallback = defaultLimit(params);
      let over = 0;
      for (let minute = firstMinute; minute <= lastMinute; minute++) {
        const at = ring.find(minute);
        if (at === FORGOTTEN) return true;
        const droppedCount = dropped ? dropped.count(minute) - dropped.serverErrors(minute) : 0;
        if (at === NO_EVENTS && !(droppedCount > 0)) continue;
        const droppedLimit = droppedCount > 0 && dropped!.highestLimit(minute) > 0 ? dropped!.highestLimit(minute) : Infinity;
        const limit = Math.min(at === NO_EVENTS ? Infinity : ring.get(at, LOWEST_LIMIT), droppedLimit, fallback);
        if ((at === NO_EVENTS ? 0 : ring.get(at, EVENTS)) + droppedCount > limit * params.thresholdRatio) over++;
      }
      return over >= needed;
    },
  },
};

/** The most counted events that `counts` takes in any 60 seconds of time (not a clock minute) among events[from, end), `end` growing call by call. */
class BusiestMinute {
  private oldest: number;
  private scanned: number;
  private inMinute = 0;
  private most = 0;

  constructor(
    private readonly events: readonly WindowEvent[],
    from: number,
    private readonly counts: (event: WindowEvent) => boolean,
  ) {
    this.oldest = from;
    this.scanned = from;
  }

  upTo(end: number): number {
    const { events, counts } = this;
    for (; this.scanned < end; this.scanned++) {
      const event = events[this.scanned]!;
      if (!counted(event) || !counts(event)) continue;
      this.inMinute++;
      for (; events[this.oldest]!.timestamp <= event.timestamp - MINUTE; this.oldest++) {
        if (counted(events[this.oldest]!) && counts(events[this.oldest]!)) this.inMinute--;
      }
      if (this.inMinute > this.most) this.most = this.inMinute;
    }
    return this.most;
  }
}

/**
 * At least as many events (counted or not) as any 60 seconds of [from, to) hold: the most in seven
 * consecutive 10-second steps (any 60 seconds lie within seven), each step's start found by binary
 * search: a few dozen reads where counting exactly reads every event, up to 20,000 under attack.
 */
function busiestMinuteBound(events: readonly WindowEvent[], from: number, to: number): number {
  const STEP = 10_000;
  const STEPS_PER_MINUTE = 7;
  const starts: number[] = [];
  for (let at = from; at < to; at += STEP) starts.push(firstAtOrAfter(events, at));
  starts.push(firstAtOrAfter(events, to));
  let most = 0;
  for (let k = 0; k < starts.length - 1; k++) most = Math.max(most, starts[Math.min(k + STEPS_PER_MINUTE, starts.length - 1)]! - starts[k]!);
  return most;
}

/** The k-th highest ratio among over[a..b]. */
function kthRatio(over: readonly Over[], a: number, b: number, k: number): number {
  const ratios: number[] = [];
  for (let i = a; i <= b; i++) ratios.push(over[i]!.ratio);
  ratios.sort((x, y) => y - x);
  return ratios[k - 1]!;
}

/** Whether the event counts toward the key's rate: not when the API failed it (5xx), which clients retry. */
function counted(event: WindowEvent): boolean {
  return event.status < 500;
}

/** The counted events of a minute lie in events[start, end). */
interface Run {
  start: number;
  end: number;
}

interface Distinct {
  count: number;
  values: string[];
}

/** One field's distinct values, fed event by event. */
class DistinctField {
  private readonly seen = new Set<string>();
  private last: string | undefined;

  add(value: string | undefined): void {
    // Runs of one value are the rule, not the exception: skip the set for them.
    if (value === this.last || value === undefined) return;
    this.last = value;
    this.seen.add(value);
  }

  result(): Distinct {
    return { count: this.seen.size, values: [...this.seen].slice(0, MAX_SAMPLES) };
  }
}

/**
 * The distinct addresses, networks, countries and user agents of the runs' counted events, in one
 * pass: under attack the runs hold up to the window's whole 20,000 events, read on every judgement.
 */
function distinctValues(events: readonly WindowEvent[], runs: readonly Run[]): Record<'ips' | 'networks' | 'countries' | 'userAgents', Distinct> {
  const ips = new DistinctField();
  const networks = new DistinctField();
  const countries = new DistinctField();
  const userAgents = new DistinctField();
  for (const run of runs) {
    for (let i = run.start; i < run.end; i++) {
      const event = events[i]!;
      if (!counted(event)) continue;
      ips.add(event.ip);
      networks.add(event.network);
      countries.add(event.country);
      userAgents.add(event.userAgent);
    }
  }
  return { ips: ips.result(), networks: networks.result(), countries: countries.result(), userAgents: userAgents.result() };
}

/**
 * The share of the runs' counted events answered 429 to addresses of the key's own (`isOwn`) that
 * sent at most `patientPerMinute` a minute on average over the runs' `minutes`: its clients honouring Retry-After.
 */
function backingOffShare(events: readonly WindowEvent[], runs: readonly Run[], minutes: number, patientPerMinute: number, isOwn: (event: WindowEvent) => boolean): number {
  const perIp = new Map<string, { requests: number; limited: number }>();
  let total = 0;
  for (const run of runs) {
    for (let i = run.start; i < run.end; i++) {
      const event = events[i]!;
      if (!counted(event)) continue;
      total++;
      if (!isOwn(event)) continue;
      let tally = perIp.get(event.ip);
      if (tally === undefined) perIp.set(event.ip, (tally = { requests: 0, limited: 0 }));
      tally.requests++;
      if (event.status === 429) tally.limited++;
    }
  }
  let patientLimited = 0;
  for (const tally of perIp.values()) if (tally.requests <= patientPerMinute * minutes) patientLimited += tally.limited;
  return total === 0 ? 0 : patientLimited / total;
}

/** The ids of the last `count` counted events of the runs, oldest first. */
function lastEventIds(events: readonly WindowEvent[], runs: readonly Run[], count: number): string[] {
  const ids: string[] = [];
  for (let r = runs.length - 1; r >= 0 && ids.length < count; r--) {
    for (let i = runs[r]!.end - 1; i >= runs[r]!.start && ids.length < count; i--) if (counted(events[i]!)) ids.push(events[i]!.eventId);
  }
  return ids.reverse();
}

function clamp01(x: number): number {
  return Number.isFinite(x) ? Math.min(1, Math.max(0, x)) : 0;
}

function round(x: number, digits: number): number {
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}
