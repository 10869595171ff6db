/**
 * high_failure_rate: most of a key's requests fail in a way that signals abuse: 401/403 (someone
 * guessing the secret, a revoked key, a key used outside its permissions) or 404 (probing for
 * resources that do not exist, e.g. walking session ids).
 * 429 is the rate limiter doing its job and 5xx is the API's own fault: they are neither signal nor
 * part of the denominator, so an outage or a throttled key does not dilute or fake the share.
 *   share = (401 + 403 + 404) / (requests the API judged: everything except 429 and 5xx)
 * The rule fires when judged requests >= minRequests and share >= thresholdShare.
 * Severity grows with share and volume: medium from thresholdShare (50%); high at highShare (80%)
 * with at least highFailures signal failures; critical at criticalShare (90%) with criticalFailures.
 */
import { FORGOTTEN, MinuteRing, minuteOf, NO_EVENTS } from '../src/detect/tallies.ts';
import type { Finding, RuleDefinition, Severity } from '../src/detect/types.ts';

type Params = {
  windowMinutes: number;
  /** Judged requests (not 429, not 5xx) needed before a share means anything. */
  minRequests: number;
  thresholdShare: number;
  highShare: number;
  highFailures: number;
  criticalShare: number;
  criticalFailures: number;
};

const MINUTE = 60_000;
const MAX_SAMPLES = 10;

/** The screen's tally: judged requests and signal failures per clock minute, for the last RING_MINUTES. */
const RING_MINUTES = 16;
const JUDGED = 0;
const FAILURES = 1;

export const rule: RuleDefinition<Params, MinuteRing> = {
  id: 'high_failure_rate',
  version: '1.0.0',
  title: 'High failure rate',
  description:
    'Most of a key\'s requests are refused (401/403: credential guessing or a revoked key) or hit resources ' +
    'that do not exist (404: probing), over a window long enough to rule out a glitch.',
  windowMs: 10 * MINUTE,
  defaults: {
    windowMinutes: 10,
    minRequests: 30,
    thresholdShare: 0.5,
    highShare: 0.8,
    highFailures: 100,
    criticalShare: 0.9,
    criticalFailures: 1000,
  },
  actions: { low: 'monitor', medium: 'investigate', high: 'rate_limit', critical: 'block' },
  falsePositives: [
    'An outage (a burst of 5xx): 5xx is excluded from both numerator and denominator.',
    'A throttled key (a burst of 429): 429 is excluded from both numerator and denominator; velocity_attack covers the excess.',
    'A handful of failures (3 of 5): no share is judged below minRequests judged requests.',
    'Validation errors (400, 422) are the integration\'s bugs, not abuse: they count as judged requests, not as failures.',
    'An old deployment still using a rotated secret fails 100% with 401 at its usual rate: it is reported (medium, or high at volume) because the merchant must fix it; dismiss it once fixed.',
  ],
  evaluate(window, params, now) {
    const { events } = window;
    const windowStart = now - params.windowMinutes * MINUTE;
    // First pass: counters only; the evidence is built when the rule fires.
    let first = events.length;
    let judged = 0;
    let auth = 0;
    let notFound = 0;
    let rateLimited = 0;
    let serverErrors = 0;
    for (let i = events.length - 1; i >= 0; i--) {
      const status = events[i]!.status;
      if (events[i]!.timestamp < windowStart) break;
      first = i;
      if (status === 429) rateLimited++;
      else if (status >= 500) serverErrors++;
      else {
        judged++;
        if (status === 401 || status === 403) auth++;
        else if (status === 404) notFound++;
      }
    }
    const failures = auth + notFound;
    if (judged < params.minRequests || failures === 0) return [];
    const share = failures / judged;
    if (share < params.thresholdShare) return [];

    const severity: Severity =
      share >= params.criticalShare && failures >= params.criticalFailures
        ? 'critical'
        : share >= params.highShare && failures >= params.highFailures
          ? 'high'
          : 'medium';
    // How far past the threshold the share is, and how much volume stands behind it (log scale).
    const shareScore = (share - params.thresholdShare) / Math.max(1e-9, 1 - params.thresholdShare);
    const volumeScore = Math.log(failures / params.minRequests) / Math.log(params.criticalFailures / params.minRequests);
    const confidence = round(clamp01(0.5 * clamp01(shareScore) + 0.5 * clamp01(volumeScore)), 3);

    const windowEvents = events.slice(first);
    const failing = windowEvents.filter((e) => isSignal(e.status));
    const countsByStatus: Record<string, number> = {};
    for (const event of windowEvents) countsByStatus[event.status] = (countsByStatus[event.status] ?? 0) + 1;
    const topNotFoundPaths = top(failing.filter((e) => e.status === 404).map((e) => e.path), 5);
    const ips = distinct(failing.map((e) => e.ip));
    const networks = distinct(failing.map((e) => e.network));
    const kind = auth >= notFound ? 'authentication failures (401/403)' : 'probing for missing resources (404)';
    const key = window.apiKeyId;
    const percent = Math.round(share * 100);
    const advice =
      auth >= notFound
        ? 'check whether the merchant rotated or revoked this key; if not, someone is guessing its secret: rotate it'
        : 'someone is enumerating resources with this key: check the paths and the source IPs with the merchant';

    const finding: Finding = {
      scope: key,
      apiKeyId: key,
      severity,
      confidence,
      title: `High failure rate on ${key}: ${percent}% of ${judged} requests failed (${failures} × 401/403/404)`,
      summary:
        `${failures} of the ${judged} requests ${key} made in the last ${params.windowMinutes} min that the API judged failed with 401/403/404 ` +
        `(${percent}% against a threshold of ${Math.round(params.thresholdShare * 100)}%), mostly ${kind}, ` +
        `from ${ips.count} IP(s); ${advice}.`,
      evidence: {
        observedShare: round(share, 3),
        thresholdShare: params.thresholdShare,
        signalFailures: failures,
        authFailures: auth,
        notFound,
        judgedRequests: judged,
        minRequests: params.minRequests,
        excluded: { rateLimited, serverErrors },
        countsByStatus,
        topNotFoundPaths,
        distinctIps: ips.count,
        ips: ips.values,
        distinctNetworks: networks.count,
        networks: networks.values,
        userAgents: distinct(failing.map((e) => e.userAgent)).values,
        windowMinutes: params.windowMinutes,
        sampleEventIds: failing.slice(-MAX_SAMPLES).map((e) => e.eventId),
        windowMs: params.windowMinutes * MINUTE,
      },
      firstSeenAt: failing[0]!.timestamp,
      lastSeenAt: failing[failing.length - 1]!.timestamp,
    };
    return [finding];
  },
  screen: {
    create: () => new MinuteRing(RING_MINUTES, [0, 0]),
    add(ring, event) {
      const at = ring.claim(event.timestamp);
      if (at !== FORGOTTEN) count(ring, at, event.status, 1);
    },
    remove(ring, event) {
      const at = ring.find(minuteOf(event.timestamp));
      if (at >= 0) count(ring, at, event.status, -1);
    },
    // The window starts inside a minute: its counts lie between those of the minutes wholly inside it
    // (at least) and of every minute it touches (at most), and so does the share.
    mayFire(ring, params, now) {
      const windowStart = now - params.windowMinutes * MINUTE;
      const firstMinute = minuteOf(windowStart);
      const firstWholeMinute = Math.ceil(windowStart / MINUTE);
      if (ring.newestMinute - firstMinute >= ring.size) return true;
      let judgedAtMost = 0;
      let judgedAtLeast = 0;
      let failuresAtMost = 0;
      for (let minute = firstMinute; minute <= ring.newestMinute; minute++) {
        const at = ring.find(minute);
        if (at === NO_EVENTS) continue;
        if (at === FORGOTTEN) return true;
        judgedAtMost += ring.get(at, JUDGED);
        failuresAtMost += ring.get(at, FAILURES);
        if (minute >= firstWholeMinute) judgedAtLeast += ring.get(at, JUDGED);
      }
      if (judgedAtMost < params.minRequests || failuresAtMost === 0) return false;
      return judgedAtLeast === 0 || !(failuresAtMost / judgedAtLeast < params.thresholdShare);
    },
  },
};

/** Counts an event in (sign 1) or out (sign -1) of its minute, as evaluate counts it. */
function count(ring: MinuteRing, at: number, status: number, sign: 1 | -1): void {
  if (status === 429 || status >= 500) return;
  ring.add(at, JUDGED, sign);
  if (isSignal(status)) ring.add(at, FAILURES, sign);
}

function isSignal(status: number): boolean {
  return status === 401 || status === 403 || status === 404;
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
