/**
 * velocity_attack: a key sending more requests per minute than its rate limit allows, sustained.
 * Minutes are UTC clock minutes (as fixed-window rate limiters count them). A minute is "over" when
 * its count exceeds limit × thresholdRatio; the rule fires when at least minMinutesOver of the last
 * windowMinutes full minutes are over (the current, partial minute counts too once it is already
 * over, since its count can only grow). Severity follows the rate the key SUSTAINED — the
 * minMinutesOver-th busiest over minute — so one huge spike next to a mild excess stays medium:
 *   medium >= 1.5x the limit, high >= 3x, critical >= 10x.
 * Requests answered 5xx are not counted: during our own outage, clients retrying failed calls
 * multiply their rate without anything about them changing (high_failure_rate leaves 5xx out too).
 * 429 counts: that is the rate limiter seeing the flood.
 */
import { firstAtOrAfter } from '../src/detect/search.ts';
import { FORGOTTEN, MinuteRing, minuteOf, NO_EVENTS } from '../src/detect/tallies.ts';
import type { Finding, RuleDefinition, Severity, WindowEvent } from '../src/detect/types.ts';

type Params = {
  /** Full clock minutes looked at, before the current one. */
  windowMinutes: number;
  /** How many of them must be over: one spike minute is not an attack. */
  minMinutesOver: number;
  /** A minute is over when its count exceeds limit × thresholdRatio; this is also the medium band. */
  thresholdRatio: number;
  highRatio: number;
  criticalRatio: number;
  /** For an event without a usable limit (the engine normally fills the plan's default, 60). */
  defaultLimitPerMinute: number;
};

const MINUTE = 60_000;
const MAX_SAMPLES = 10;

/**
 * The screen's tally, per clock minute of the last RING_MINUTES: the events, and the lowest limit any
 * of them carried (a minute is judged against its highest limit, which is at least that; it is not
 * raised when events leave). An event without a usable limit counts as limit 0 (evaluate would judge
 * its minute against the default or another event's limit). Events answered 5xx are left out, as
 * evaluate leaves them out.
 */
const RING_MINUTES = 8;
const EVENTS = 0;
const LOWEST_LIMIT = 1;

export const rule: RuleDefinition<Params, MinuteRing> = {
  id: 'velocity_attack',
  version: '1.1.0',
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
    defaultLimitPerMinute: 60,
  },
  actions: { low: 'monitor', medium: 'rate_limit', high: 'rate_limit', critical: 'block' },
  falsePositives: [
    'A short legitimate burst (a batch job, a backfill) under limit × thresholdRatio: never over.',
    'A single spike minute: one minute over is not sustained (minMinutesOver = 2).',
    'A raised limit (plan upgrade, custom RateLimit-Limit): each minute is judged against the highest limit its events carry.',
    'Retries during our own outage (a client retrying each 503 three times): requests answered 5xx are not counted.',
    'A nightly batch deliberately above the limit is still reported; allowlist the key or raise its limit.',
  ],
  evaluate(window, params, now) {
    const { events } = window;
    const minutes = Math.max(1, Math.floor(params.windowMinutes));
    const currentMinute = Math.floor(now / MINUTE);
    const firstMinute = currentMinute - minutes;
    // Slot i counts minute firstMinute + i; the last slot is the current, partial minute.
    const counts = new Array<number>(minutes + 1).fill(0);
    const limits = new Array<number>(minutes + 1).fill(0);
    // Events are in time order, so each minute's counted events lie in one run: from its first to
    // its last counted event (events answered 5xx, not counted, may sit among them).
    const starts = new Array<number>(minutes + 1).fill(0);
    const ends = new Array<number>(minutes + 1).fill(0);
    const windowStart = firstMinute * MINUTE;
    const first = firstAtOrAfter(events, windowStart);
    let slot = 0;
    let slotEnd = windowStart + MINUTE;
    for (let i = first; i < events.length; i++) {
      const event = events[i]!;
      if (!counted(event)) continue;
      // Events are in time order; one later than `now` counts in the current minute.
      while (event.timestamp >= slotEnd && slot < minutes) {
        slot++;
        slotEnd += MINUTE;
      }
      if (counts[slot]!++ === 0) starts[slot] = i;
      ends[slot] = i + 1;
      if (event.rateLimitPerMinute > limits[slot]!) limits[slot] = event.rateLimitPerMinute;
    }

    const over: { slot: number; count: number; limit: number; ratio: number }[] = [];
    for (let slot = 0; slot <= minutes; slot++) {
      const limit = limits[slot]! > 0 ? limits[slot]! : params.defaultLimitPerMinute;
      const count = counts[slot]!;
      if (count > limit * params.thresholdRatio) over.push({ slot, count, limit, ratio: count / limit });
    }
    const needed = Math.max(1, Math.floor(params.minMinutesOver));
    if (over.length < needed) return [];

    const byRatio = [...over].sort((a, b) => b.ratio - a.ratio);
    const peak = byRatio[0]!;
    const sustainedRatio = byRatio[needed - 1]!.ratio;
    const severity: Severity =
      sustainedRatio >= params.criticalRatio ? 'critical' : sustainedRatio >= params.highRatio ? 'high' : 'medium';
    // Within the band, on a log scale; the critical band is read as 10x..30x the limit.
    const [low, high] =
      severity === 'critical'
        ? [params.criticalRatio, params.criticalRatio * 3]
        : severity === 'high'
          ? [params.highRatio, params.criticalRatio]
          : [params.thresholdRatio, params.highRatio];
    const inBand = Math.log(sustainedRatio / low) / Math.log(high / low);
    const persistence = over.length / (minutes + 1);
    const confidence = round(clamp01(0.5 * clamp01(inBand) + 0.5 * persistence), 3);

    // Evidence: only the events of the over minutes.
    // The over minutes' events are runs of the window: read in place, not copied out.
    const runs = over.map((o) => ({ start: starts[o.slot]!, end: ends[o.slot]! }));
    const { ips, networks, countries, userAgents } = distinctValues(events, runs);
    const lastRun = runs[runs.length - 1]!;
    const threshold = Math.floor(peak.limit * params.thresholdRatio);
    const key = window.apiKeyId;
    const advice =
      rule.actions[severity] === 'block'
        ? 'block the key and rotate its secret unless the merchant confirms the traffic'
        : 'throttle the key and ask the merchant whether this traffic is theirs';

    const finding: Finding = {
      scope: key,
      apiKeyId: key,
      severity,
      confidence,
      title: `Velocity attack on ${key}: ${peak.count} requests/min (limit ${peak.limit})`,
      summary:
        `${key} exceeded ${round(params.thresholdRatio, 2)}x its rate limit in ${over.length} of the last ${minutes + 1} minutes ` +
        `(sustained ${round(sustainedRatio, 1)}x, peak ${peak.count} requests/min against a limit of ${peak.limit}) ` +
        `from ${ips.count} IP(s) in ${networks.count} network(s); ${advice}.`,
      evidence: {
        observedRequestsPerMinute: peak.count,
        limitPerMinute: peak.limit,
        thresholdPerMinute: threshold,
        thresholdRatio: params.thresholdRatio,
        peakRatio: round(peak.ratio, 2),
        sustainedRatio: round(sustainedRatio, 2),
        minutesOver: over.length,
        minMinutesOver: needed,
        windowMinutes: minutes,
        perMinute: over.map((o) => ({ minute: new Date((firstMinute + o.slot) * MINUTE).toISOString(), requests: o.count, limit: o.limit })),
        requestsInOverMinutes: over.reduce((sum, o) => sum + o.count, 0),
        distinctIps: ips.count,
        ips: ips.values,
        distinctNetworks: networks.count,
        networks: networks.values,
        countries: countries.values,
        userAgents: userAgents.values,
        sampleEventIds: lastEventIds(events, runs, MAX_SAMPLES),
        windowMs: (minutes + 1) * MINUTE,
      },
      firstSeenAt: events[runs[0]!.start]!.timestamp,
      lastSeenAt: events[lastRun.end - 1]!.timestamp,
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
      ring.lower(at, LOWEST_LIMIT, event.rateLimitPerMinute > 0 ? event.rateLimitPerMinute : 0);
    },
    remove(ring, event) {
      if (!counted(event)) return;
      const at = ring.find(minuteOf(event.timestamp));
      if (at >= 0) ring.add(at, EVENTS, -1);
    },
    // The minutes evaluate counts, each judged against its lowest limit: never fewer minutes over.
    mayFire(ring, params, now) {
      const minutes = Math.max(1, Math.floor(params.windowMinutes));
      const needed = Math.max(1, Math.floor(params.minMinutesOver));
      const currentMinute = minuteOf(now);
      const firstMinute = currentMinute - minutes;
      // Events later than now count in the current minute, as in evaluate.
      const lastMinute = Math.max(currentMinute, ring.newestMinute);
      if (lastMinute - firstMinute >= ring.size || !(params.thresholdRatio >= 0)) return true;
      let over = 0;
      let currentEvents = 0;
      let currentLimit = Infinity;
      for (let minute = firstMinute; minute <= lastMinute; minute++) {
        const at = ring.find(minute);
        if (at === NO_EVENTS) continue;
        if (at === FORGOTTEN) return true;
        if (minute < currentMinute) {
          if (ring.get(at, EVENTS) > ring.get(at, LOWEST_LIMIT) * params.thresholdRatio) over++;
        } else {
          currentEvents += ring.get(at, EVENTS);
          currentLimit = Math.min(currentLimit, ring.get(at, LOWEST_LIMIT));
        }
      }
      if (currentEvents > currentLimit * params.thresholdRatio) over++;
      return over >= needed;
    },
  },
};

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
