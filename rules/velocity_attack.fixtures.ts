import { at, keyWindow, MINUTE, perMinute, SECOND, spread, T0, type RuleFixture } from './fixtures.ts';
import type { rule } from './velocity_attack.ts';

type Fixture = RuleFixture<(typeof rule)['defaults']>;

/** A merchant's worker `n` of 600, on three /24s of its own. */
const WORKER_IP = (n: number) => `198.51.${100 + Math.floor(n / 250)}.${n % 250}`;
/** Yesterday's requests from those three networks: the key's own. */
const WORKER_NETWORKS_YESTERDAY = spread(60, T0 - 24 * 60 * MINUTE, 60 * MINUTE, (i) => ({ ip: WORKER_IP(250 * (i % 3)) }));

// `now` is 30 s into the minute that starts at T0; the five full minutes before it start at T0 - 5 min.
const NOW = T0 + 30 * SECOND;
const FIVE_MINUTES_AGO = T0 - 5 * MINUTE;

export const fixtures: Fixture[] = [
  {
    name: 'sustained 840 requests/min for five minutes on a limit of 60 is critical',
    kind: 'positive',
    window: keyWindow(perMinute([840, 840, 840, 840, 840], FIVE_MINUTES_AGO, { ip: '203.0.113.77' })),
    now: NOW,
    expect: { findings: 1, severity: 'critical', evidence: { observedRequestsPerMinute: 840, limitPerMinute: 60, minutesOver: 5, sustainedRatio: 14 } },
  },
  {
    name: 'an enterprise key at 600 requests/min whose events carry no limit is not judged: enterprise limits are custom, not 60',
    kind: 'negative',
    window: keyWindow(perMinute([600, 600, 600, 600, 600], FIVE_MINUTES_AGO).map((spec) => ({ ...spec, rateLimitPerMinute: 0 })), { plan: 'enterprise' }),
    now: NOW,
    // Red-team round 44: critical, and a block of the enterprise production key, against the 60 of the other plans.
    expect: { findings: 0 },
  },
  {
    name: 'an enterprise key flooding past the limit its events carry (1,000 a minute on 100) is critical',
    kind: 'positive',
    window: keyWindow(perMinute([1000, 1000, 1000, 1000, 1000], FIVE_MINUTES_AGO, { rateLimitPerMinute: 100 }), { plan: 'enterprise' }),
    now: NOW,
    expect: { findings: 1, severity: 'critical', evidence: { limitPerMinute: 100 } },
  },
  {
    name: 'two minutes at twice the limit is medium',
    kind: 'positive',
    window: keyWindow(perMinute([40, 45, 120, 120, 40], FIVE_MINUTES_AGO)),
    now: NOW,
    expect: { findings: 1, severity: 'medium', evidence: { minutesOver: 2, thresholdPerMinute: 90, sustainedRatio: 2 } },
  },
  {
    name: 'a custom limit of 100 held at 3.5x for three minutes is high',
    kind: 'positive',
    window: keyWindow(perMinute([100, 350, 350, 360, 90], FIVE_MINUTES_AGO, { rateLimitPerMinute: 100 })),
    now: NOW,
    expect: { findings: 1, severity: 'high', evidence: { limitPerMinute: 100, minutesOver: 3, sustainedRatio: 3.5 } },
  },
  {
    name: 'the current minute counts once it is already over: 200 last minute, 100 in the first 30 s of this one',
    kind: 'positive',
    window: keyWindow([...perMinute([30, 30, 30, 30, 200], FIVE_MINUTES_AGO), ...spread(100, T0, 30 * SECOND)]),
    now: NOW,
    // Severity follows the second busiest over minute (1.67x), not the peak (3.33x).
    expect: { findings: 1, severity: 'medium', evidence: { minutesOver: 2, observedRequestsPerMinute: 200, sustainedRatio: 1.67 } },
  },
  {
    // The evidence counts the over minutes' counted events only: the quiet minute's address, and the
    // address and user agent of the 503s within an over minute, are left out.
    name: 'a flood from three addresses in two networks and two countries names each, from the over minutes alone',
    kind: 'positive',
    window: keyWindow([
      ...perMinute([30], FIVE_MINUTES_AGO, { ip: '192.0.2.99', country: 'FR' }),
      ...perMinute([200, 200], T0 - 4 * MINUTE).map((spec, i) => ({
        ...spec,
        ...[{ ip: '203.0.113.7', country: 'US' }, { ip: '203.0.113.8', country: 'US' }, { ip: '198.51.100.5', country: 'DE' }][i % 3],
        userAgent: i % 50 === 0 ? 'curl/8.7.1' : 'python-requests/2.32.3',
      })),
      ...perMinute([10], T0 - 4 * MINUTE, { ip: '192.0.2.98', status: 503, userAgent: 'retrying-sdk/1.0' }),
    ]),
    now: NOW,
    expect: {
      findings: 1,
      severity: 'high',
      evidence: {
        minutesOver: 2,
        distinctIps: 3,
        ips: ['203.0.113.7', '203.0.113.8', '198.51.100.5'],
        distinctNetworks: 2,
        networks: ['203.0.113.0/24', '198.51.100.0/24'],
        countries: ['US', 'DE'],
        userAgents: ['curl/8.7.1', 'python-requests/2.32.3'],
      },
    },
  },
  {
    name: 'a flood the rate limiter answers with 429 still counts: 200 requests/min for five minutes is high',
    kind: 'positive',
    window: keyWindow(perMinute([200, 200, 200, 200, 200], FIVE_MINUTES_AGO).map((spec, i) => ({ ...spec, status: i % 200 < 60 ? 201 : 429 }))),
    now: NOW,
    expect: { findings: 1, severity: 'high', evidence: { observedRequestsPerMinute: 200, minutesOver: 5 } },
  },
  {
    name: 'a backfill fanned out to 600 workers on the key\'s own networks, each waiting as Retry-After tells it (about one request a minute, 429 but for the 60 the limit lets through), is high, not critical: blocking would stop the merchant\'s own',
    kind: 'positive',
    window: keyWindow(
      perMinute([660, 660, 660, 660, 660], FIVE_MINUTES_AGO).map((spec, i) => ({ ...spec, ip: WORKER_IP((i % 660) % 600), status: i % 660 < 60 ? 201 : 429 })),
      { history: WORKER_NETWORKS_YESTERDAY },
    ),
    now: NOW,
    // Red-team round 44: critical, and "block the key", at 11x the limit.
    expect: { findings: 1, severity: 'high', evidence: { sustainedRatio: 11, backingOffShare: 0.91 }, summary: /91% of it answered 429 to addresses in the key's own places that each send at most 2 a minute/ },
  },
  {
    name: 'the same from a new address per request, on a network and in a place new to the key (an IPv6 /64 abroad, a proxy pool), is critical: only the key\'s own clients back off',
    kind: 'positive',
    window: keyWindow(
      perMinute([660, 660, 660, 660, 660], FIVE_MINUTES_AGO).map((spec, i) => ({ ...spec, ...at('frankfurt', `2001:db8:66:1::${i.toString(16)}`), status: i % 660 < 60 ? 201 : 429 })),
      { history: WORKER_NETWORKS_YESTERDAY },
    ),
    now: NOW,
    // Review round 44: every flood rotating addresses was taken for clients backing off.
    expect: { findings: 1, severity: 'critical', evidence: { sustainedRatio: 11, backingOffShare: 0 } },
  },
  {
    name: 'the same from New York, primed by one request there three minutes before, beside the key\'s own traffic, is critical: a place is its own only from an hour before',
    kind: 'positive',
    window: keyWindow(
      [
        { at: FIVE_MINUTES_AGO - 3 * MINUTE, ...at('newYork', '2001:db8:66:1::ffff') },
        ...perMinute([660, 660, 660, 660, 660], FIVE_MINUTES_AGO).map((spec, i) => ({ ...spec, ...at('newYork', `2001:db8:66:1::${i.toString(16)}`), status: i % 660 < 60 ? 201 : 429 })),
      ],
      { history: [...WORKER_NETWORKS_YESTERDAY, ...spread(30, T0 - 40 * MINUTE, 30 * MINUTE), { at: FIVE_MINUTES_AGO - 3 * MINUTE, ...at('newYork', '2001:db8:66:1::ffff') }] },
    ),
    now: NOW,
    // Review round 44 (second): high, with backingOffShare 0.91.
    expect: { findings: 1, severity: 'critical', evidence: { backingOffShare: 0 } },
  },
  {
    name: 'the same rate from 20 addresses sending 33 a minute each is critical: a flood, not clients backing off',
    kind: 'positive',
    window: keyWindow(perMinute([660, 660, 660, 660, 660], FIVE_MINUTES_AGO).map((spec, i) => ({ ...spec, ip: `203.0.113.${i % 20}`, status: i % 660 < 60 ? 201 : 429 }))),
    now: NOW,
    expect: { findings: 1, severity: 'critical', evidence: { sustainedRatio: 11, backingOffShare: 0 } },
  },
  {
    name: 'a flood partly answered 503 counts the rest: 300 requests/min, one in five failed by the API, is 240/min (high)',
    kind: 'positive',
    window: keyWindow(perMinute([300, 300, 300], T0 - 3 * MINUTE).map((spec, i) => ({ ...spec, status: i % 5 === 4 ? 503 : 401 }))),
    now: NOW,
    expect: { findings: 1, severity: 'high', evidence: { observedRequestsPerMinute: 240, minutesOver: 3, requestsInOverMinutes: 720 } },
  },
  {
    name: 'retries during our own outage: 40 calls/min each retried 3 times on 503 for five minutes are not an attack',
    kind: 'negative',
    window: keyWindow([
      ...perMinute([40, 40, 40, 40], T0 - 9 * MINUTE),
      ...perMinute([160, 160, 160, 160, 160], FIVE_MINUTES_AGO, { status: 503 }),
      ...spread(20, T0, 30 * SECOND),
    ]),
    now: NOW,
    expect: { findings: 0 },
  },
  {
    name: 'steady integration traffic at 50 requests/min is quiet',
    kind: 'negative',
    window: keyWindow(perMinute([50, 50, 50, 50, 50, 25], FIVE_MINUTES_AGO)),
    now: NOW,
    expect: { findings: 0 },
  },
  {
    name: 'a short legitimate burst to 85/min (over the limit, under 1.5x) is not an attack',
    kind: 'negative',
    window: keyWindow(perMinute([40, 85, 85, 40, 40], FIVE_MINUTES_AGO)),
    now: NOW,
    expect: { findings: 0 },
  },
  {
    name: 'a single spike minute of 900 is not sustained',
    kind: 'negative',
    window: keyWindow(perMinute([30, 30, 900, 30, 30], FIVE_MINUTES_AGO)),
    now: NOW,
    expect: { findings: 0 },
  },
  {
    name: 'a 20-second spike of 240 that straddles a minute boundary (120 in each minute) is one spike, not two minutes',
    kind: 'negative',
    window: keyWindow([...perMinute([30, 30, 30], FIVE_MINUTES_AGO), ...spread(240, T0 - 2 * MINUTE - 10 * SECOND, 20 * SECOND), ...perMinute([30], T0 - MINUTE)]),
    now: NOW,
    expect: { findings: 0 },
  },
  {
    // 720 requests in 5 minutes (2.4x), 4 of them over: one burst taken out, the other is still two minutes at 3x.
    name: 'bursts of 360 straddling a minute boundary every 3 minutes are a flood that skips minutes, not one spike: medium',
    kind: 'positive',
    window: keyWindow([...spread(360, T0 - 4 * MINUTE - 10 * SECOND, 20 * SECOND), ...spread(360, T0 - MINUTE - 10 * SECOND, 20 * SECOND)]),
    now: NOW,
    expect: { findings: 1, severity: 'medium', evidence: { minutesOver: 4, spanMinutes: 5, sustainedRatio: 2 } },
  },
  {
    // The spike's halves are two over minutes at 25x, but the key sustained 150/min (2.5x) beside it.
    name: 'a spike of 3,000 straddling a minute boundary before two minutes at 2.5x is medium, as it is inside one minute',
    kind: 'positive',
    window: keyWindow([...spread(3000, T0 - 4 * MINUTE - 10 * SECOND, 20 * SECOND), ...perMinute([150, 150], T0 - 3 * MINUTE)]),
    now: NOW,
    expect: { findings: 1, severity: 'medium', evidence: { minutesOver: 4, peakRatio: 25, sustainedRatio: 1.67 } },
  },
  {
    name: 'the same spike inside one minute before two minutes at 2.5x is medium',
    kind: 'positive',
    window: keyWindow([...spread(3000, T0 - 4 * MINUTE + 20 * SECOND, 20 * SECOND), ...perMinute([150, 150], T0 - 3 * MINUTE)]),
    now: NOW,
    expect: { findings: 1, severity: 'medium', evidence: { minutesOver: 3, peakRatio: 50 } },
  },
  {
    // The longest stretch is not taken at a lower severity than a shorter one sustained.
    name: 'a flood ramping 100, 200, 400, 800, 1,600 a minute is critical, as its last two minutes are',
    kind: 'positive',
    window: keyWindow(perMinute([100, 200, 400, 800, 1600], FIVE_MINUTES_AGO)),
    now: NOW,
    expect: { findings: 1, severity: 'critical' },
  },
  {
    name: 'with minMinutesOver 3, a spike straddling a minute boundary is still one over minute: with one more, not enough',
    kind: 'negative',
    window: keyWindow([...spread(600, T0 - 3 * MINUTE - 5 * SECOND, 10 * SECOND), ...perMinute([95], T0 - MINUTE)]),
    now: NOW,
    params: { minMinutesOver: 3 },
    expect: { findings: 0 },
  },
  {
    // 100 in the minute it began, 300 in the next: 100 outside its busiest 60 s, over the 90 of a minute.
    name: 'a flood of 300/min that began 20 s before a minute ended is found 80 s in',
    kind: 'positive',
    window: keyWindow(spread(400, T0 - 20 * SECOND, 80 * SECOND)),
    now: T0 + 60 * SECOND,
    expect: { findings: 1, severity: 'medium', evidence: { minutesOver: 2, observedRequestsPerMinute: 300, sustainedRatio: 1.67 } },
  },
  {
    // Both clock minutes are over (100 and 250), but outside its busiest 60 s are only 50 requests.
    name: 'the same flood 70 s in is not yet sustained',
    kind: 'negative',
    window: keyWindow(spread(350, T0 - 20 * SECOND, 70 * SECOND)),
    now: T0 + 50 * SECOND,
    expect: { findings: 0 },
  },
  {
    name: 'exactly at the threshold (90/min for a limit of 60) is not over',
    kind: 'negative',
    window: keyWindow(perMinute([90, 90, 90, 90, 90], FIVE_MINUTES_AGO)),
    now: NOW,
    expect: { findings: 0 },
  },
  {
    name: '500/min on a key whose RateLimit-Limit is 600 (enterprise) is within its limit',
    kind: 'negative',
    window: keyWindow(perMinute([500, 500, 500, 500, 500], FIVE_MINUTES_AGO, { rateLimitPerMinute: 600 }), { plan: 'enterprise' }),
    now: NOW,
    expect: { findings: 0 },
  },
  {
    name: 'an attack that ended ten minutes ago is outside the window',
    kind: 'negative',
    window: keyWindow([...perMinute([800, 800, 800], T0 - 12 * MINUTE), ...perMinute([20, 20, 20], T0 - 3 * MINUTE)]),
    now: NOW,
    expect: { findings: 0 },
  },
  {
    name: 'a lower minMinutesOver makes one spike minute enough (a one-line tuning)',
    kind: 'positive',
    window: keyWindow(perMinute([30, 30, 900, 30, 30], FIVE_MINUTES_AGO)),
    now: NOW,
    params: { minMinutesOver: 1 },
    expect: { findings: 1, severity: 'critical', evidence: { minutesOver: 1, minMinutesOver: 1 } },
  },

  // Sustained means one stretch of minutes over the limit, not over minutes scattered in the window.
  {
    name: 'a cron job bursting once every 5 minutes (100 against 60, quiet in between) is not sustained',
    kind: 'negative',
    window: keyWindow([...perMinute([100], FIVE_MINUTES_AGO), ...spread(100, T0, 20 * SECOND)]),
    now: NOW,
    expect: { findings: 0 },
  },
  {
    name: 'a cron job bursting 100 every other minute (50/min on average, against 60) is not sustained',
    kind: 'negative',
    window: keyWindow(perMinute([100, 0, 100, 0, 100], FIVE_MINUTES_AGO)),
    now: NOW,
    expect: { findings: 0 },
  },
  {
    name: 'a flood that skips every other minute (600, 0, 600, 0, 600: 6x over the stretch) is still sustained: high',
    kind: 'positive',
    window: keyWindow(perMinute([600, 0, 600, 0, 600], FIVE_MINUTES_AGO)),
    now: NOW,
    expect: { findings: 1, severity: 'high', evidence: { minutesOver: 3, spanMinutes: 5, spanRatio: 6, sustainedRatio: 6, observedRequestsPerMinute: 600 } },
  },
  {
    name: 'a lone spike of 900 before three minutes in a row at 2x is medium: the spike does not raise what the key sustained',
    kind: 'positive',
    window: keyWindow(perMinute([900, 30, 120, 120, 120], FIVE_MINUTES_AGO)),
    now: NOW,
    expect: { findings: 1, severity: 'medium', evidence: { minutesOver: 4, spanMinutes: 5, sustainedRatio: 2, observedRequestsPerMinute: 900 } },
  },

  // Events dated ahead of now (a producer's clock a few minutes fast) count in their own minutes.
  {
    name: 'a producer clock 3 minutes fast: its steady 50/min is not piled into the current minute, one real minute at 95 is not sustained',
    kind: 'negative',
    window: keyWindow([...spread(500, T0 - 6 * MINUTE, 10 * MINUTE).filter((e) => e.at <= NOW + 3 * MINUTE), ...perMinute([45], T0 - 3 * MINUTE)]),
    now: NOW,
    expect: { findings: 0 },
  },
  {
    name: 'a flood of 300/min from a producer 3 minutes fast is judged minute by minute: 300 requests/min, high',
    kind: 'positive',
    window: keyWindow(spread(1650, T0 - 2 * MINUTE, 5.5 * MINUTE)),
    now: NOW,
    expect: { findings: 1, severity: 'high', title: /: 300 requests\/min \(limit 60\)/, evidence: { observedRequestsPerMinute: 300, minutesOver: 6 } },
  },

  // Events that carry no limit (rateLimitPerMinute 0: the fleet sent no RateLimit-Limit) are judged against defaultLimitPerMinute.
  {
    name: 'without a RateLimit-Limit, 200 requests/min for three minutes is judged against the plan\'s 60: high',
    kind: 'positive',
    window: keyWindow(perMinute([200, 200, 200], T0 - 3 * MINUTE, { rateLimitPerMinute: 0 }), { plan: 'business' }),
    now: NOW,
    expect: { findings: 1, severity: 'high', evidence: { limitPerMinute: 60, minutesOver: 3 } },
  },
  {
    name: 'without a RateLimit-Limit, 200 requests/min is within a defaultLimitPerMinute of 600 set for the plan',
    kind: 'negative',
    window: keyWindow(perMinute([200, 200, 200], T0 - 3 * MINUTE, { rateLimitPerMinute: 0 }), { plan: 'enterprise' }),
    now: NOW,
    params: { defaultLimitPerMinute: 600 },
    expect: { findings: 0 },
  },
  {
    name: 'a limit the events carry wins over defaultLimitPerMinute: 200/min against a RateLimit-Limit of 100 is medium',
    kind: 'positive',
    window: keyWindow(perMinute([200, 200, 200], T0 - 3 * MINUTE, { rateLimitPerMinute: 100 }), { plan: 'enterprise' }),
    now: NOW,
    params: { defaultLimitPerMinute: 600 },
    expect: { findings: 1, severity: 'medium', evidence: { limitPerMinute: 100, minutesOver: 3 } },
  },
  {
    // The engine's per-key cap held the last 400 requests (about 29 s): the minutes before are
    // counted from what it dropped, so the flood is rated by all its requests, not by what was held.
    name: 'a flood the per-key cap cut, 840 requests/min for five minutes with the last 400 held, is critical by all its requests',
    kind: 'positive',
    window: keyWindow(perMinute([840, 840, 840, 840, 840], FIVE_MINUTES_AGO, { ip: '203.0.113.77' }), { cap: 400 }),
    now: NOW,
    expect: { findings: 1, severity: 'critical', evidence: { observedRequestsPerMinute: 840, minutesOver: 5, sustainedRatio: 14, requestsDroppedByCap: 3_800 } },
  },
  {
    // What the cap dropped is judged against the limit it carried (1,200), not the plan's default.
    name: 'a busy key the per-key cap cut, 1,000 requests/min against its RateLimit-Limit of 1,200, is within its limit',
    kind: 'negative',
    window: keyWindow(perMinute([1_000, 1_000, 1_000, 1_000, 1_000], FIVE_MINUTES_AGO, { rateLimitPerMinute: 1_200 }), { cap: 300 }),
    now: NOW,
    expect: { findings: 0 },
  },
  {
    // Its over minutes are all in what the cap dropped: reported while the window held them, and the
    // window has none of their requests to show now.
    name: 'a flood the per-key cap dropped whole, 600/min for two minutes then 30/min, is not reported again',
    kind: 'negative',
    window: keyWindow([...perMinute([600, 600], FIVE_MINUTES_AGO), ...perMinute([30, 30, 30], T0 - 3 * MINUTE)], { cap: 50 }),
    now: NOW,
    expect: { findings: 0 },
  },
  {
    // The window holds the two minutes at 100/min only: the flood before them, which the cap dropped
    // whole, does not hide them. Reported as one stretch with the flood (1,600 requests in 5 minutes,
    // 5.3x): the key has been over since the flood, and the flood is counted from what the cap dropped.
    name: 'a key over its limit now, 100/min against 60, after a flood of 700/min the per-key cap dropped whole, is still reported',
    kind: 'positive',
    window: keyWindow(perMinute([700, 700, 0, 100, 100], FIVE_MINUTES_AGO), { cap: 200 }),
    now: NOW,
    expect: { findings: 1, severity: 'high', evidence: { minutesOver: 4, requestsDroppedByCap: 1_400 } },
  },
  {
    // The 503s' RateLimit-Limit of 1,000 is not the client's limit: 5xx answers are left out, limits included.
    name: 'a key at 200/min against 60 with a few 503s carrying a higher limit, on a key the per-key cap cut, is judged against 60',
    kind: 'positive',
    window: keyWindow([...perMinute([200, 200, 200], T0 - 3 * MINUTE), ...perMinute([5, 5, 5], T0 - 3 * MINUTE + 30 * SECOND, { status: 503, rateLimitPerMinute: 1_000 })], { cap: 300 }),
    now: NOW,
    expect: { findings: 1, severity: 'high', evidence: { limitPerMinute: 60 } },
  },
  {
    // The engine forgot what the cap dropped (a reloaded allowlist took requests out of the window):
    // the minutes it cut are counted from what the window holds, and judged as whole ones are.
    name: 'a 20-second spike of 240 straddling a minute boundary over 30/min, in minutes the cap cut but whose drops were forgotten, is still one spike',
    kind: 'negative',
    window: {
      ...keyWindow([...perMinute([30, 30, 30], FIVE_MINUTES_AGO), ...spread(240, T0 - 2 * MINUTE - 10 * SECOND, 20 * SECOND), ...perMinute([30], T0 - MINUTE)]),
      cappedAt: T0 - MINUTE - 1,
    },
    now: NOW,
    expect: { findings: 0 },
  },
  {
    // The cap held the last 100 requests: the spike's first 170 and the minutes before are counted
    // from what it dropped, by 10-second step, enough to find the spike's busiest 60 seconds.
    name: 'a 20-second spike of 240 straddling a minute boundary over 30/min, on a key the per-key cap cut to 100, is still one spike',
    kind: 'negative',
    window: keyWindow([...perMinute([30, 30, 30], FIVE_MINUTES_AGO), ...spread(240, T0 - 2 * MINUTE - 10 * SECOND, 20 * SECOND), ...perMinute([30], T0 - MINUTE)], { cap: 100 }),
    now: NOW,
    expect: { findings: 0 },
  },
];
