import { at, keyWindow, MINUTE, spread, T0, type RuleFixture } from './fixtures.ts';
import type { rule } from './high_failure_rate.ts';

type Fixture = RuleFixture<(typeof rule)['defaults']>;

const TEN_MINUTES_AGO = T0 - 10 * MINUTE;
const HOUR_AGO = T0 - 60 * MINUTE;
const DAY = 24 * 60 * MINUTE;
const OK = { status: 201 };
const LOOKUP = { method: 'GET', path: '/v1/verify/sessions/:id' };
/** Yesterday's traffic from the key's usual address (Ashburn): the key's history knows its network. */
const USUAL = spread(48, T0 - DAY, 8 * 60 * MINUTE);
/** Yesterday's traffic from the merchant's two sites: Ashburn and a second one in New York. */
const TWO_SITES = [...USUAL, ...spread(48, T0 - DAY, 8 * 60 * MINUTE, at('newYork'))];

export const fixtures: Fixture[] = [
  {
    name: '200 of 240 requests unauthorized (someone guessing the secret) is high',
    kind: 'positive',
    window: keyWindow([...spread(40, TEN_MINUTES_AGO, 10 * MINUTE, OK), ...spread(200, TEN_MINUTES_AGO, 10 * MINUTE, { status: 401, ip: '192.0.2.66' })]),
    now: T0,
    expect: { findings: 1, severity: 'high', evidence: { signalFailures: 200, authFailures: 200, judgedRequests: 240, observedShare: 0.833, countsByStatus: { 401: 200, 201: 40 } } },
  },
  {
    name: 'probing session ids: 60 of 100 requests are 404 on distinct ids is medium, with the probed paths',
    kind: 'positive',
    window: keyWindow([
      ...spread(40, TEN_MINUTES_AGO, 10 * MINUTE, { method: 'GET', path: '/v1/verify/sessions/ses_live_1', status: 200 }),
      ...spread(60, TEN_MINUTES_AGO, 10 * MINUTE, (i) => ({ method: 'GET', path: `/v1/verify/sessions/ses_${1000 + (i % 3)}`, status: 404 })),
    ]),
    now: T0,
    expect: {
      findings: 1,
      severity: 'medium',
      evidence: { notFound: 60, observedShare: 0.6, topNotFoundPaths: [{ path: '/v1/verify/sessions/ses_1000', count: 20 }, { path: '/v1/verify/sessions/ses_1001', count: 20 }, { path: '/v1/verify/sessions/ses_1002', count: 20 }] },
    },
  },
  {
    name: 'a brute force at volume: 1,200 × 401 out of 1,250 is critical',
    kind: 'positive',
    window: keyWindow([...spread(50, TEN_MINUTES_AGO, 10 * MINUTE, OK), ...spread(1200, TEN_MINUTES_AGO, 10 * MINUTE, { status: 401, ip: '192.0.2.66' })]),
    now: T0,
    expect: { findings: 1, severity: 'critical', evidence: { signalFailures: 1200, judgedRequests: 1250 } },
  },
  {
    name: 'a throttled brute force: 900 × 429 neither dilute nor count; 40 × 401 of 50 judged is medium',
    kind: 'positive',
    window: keyWindow([
      ...spread(10, TEN_MINUTES_AGO, 10 * MINUTE, OK),
      ...spread(40, TEN_MINUTES_AGO, 10 * MINUTE, { status: 401 }),
      ...spread(900, TEN_MINUTES_AGO, 10 * MINUTE, { status: 429 }),
    ]),
    now: T0,
    expect: { findings: 1, severity: 'medium', evidence: { judgedRequests: 50, observedShare: 0.8, excluded: { rateLimited: 900, serverErrors: 0 } } },
  },
  {
    // 403 is the API's policy (QUOTA_EXCEEDED, ENVIRONMENT_MISMATCH), not a wrong secret: it is not judged.
    name: 'a key past its monthly live quota: 200 × 403 in 10 minutes (20 a minute, from its usual address) is not a failure alert',
    kind: 'negative',
    window: keyWindow(spread(200, TEN_MINUTES_AGO, 10 * MINUTE, { status: 403 }), { history: USUAL }),
    now: T0,
    expect: { findings: 0 },
  },
  {
    name: 'a stranger guessing the secret of a key past its quota: 500 × 403 neither dilute nor count; 40 × 401 of 50 judged is medium',
    kind: 'positive',
    window: keyWindow([
      ...spread(10, TEN_MINUTES_AGO, 10 * MINUTE, OK),
      ...spread(40, TEN_MINUTES_AGO, 10 * MINUTE, { status: 401, ip: '192.0.2.66' }),
      ...spread(500, TEN_MINUTES_AGO, 10 * MINUTE, { status: 403 }),
    ]),
    now: T0,
    expect: { findings: 1, severity: 'medium', evidence: { authFailures: 40, judgedRequests: 50, observedShare: 0.8, excluded: { rateLimited: 0, serverErrors: 0, forbidden: 500 } } },
  },
  {
    name: 'an outage: 300 × 503 and 100 successes is not a security alert',
    kind: 'negative',
    window: keyWindow([...spread(100, TEN_MINUTES_AGO, 10 * MINUTE, OK), ...spread(300, T0 - 6 * MINUTE, 3 * MINUTE, { status: 503 })]),
    now: T0,
    expect: { findings: 0 },
  },
  {
    name: 'an outage where nearly everything fails with 500/502/504 is not a security alert either',
    kind: 'negative',
    window: keyWindow([
      ...spread(5, TEN_MINUTES_AGO, 10 * MINUTE, OK),
      ...spread(400, TEN_MINUTES_AGO, 10 * MINUTE, (i) => ({ status: [500, 502, 504][i % 3]! })),
    ]),
    now: T0,
    expect: { findings: 0 },
  },
  {
    name: 'a burst of 429s (the rate limiter working) is not a failure alert',
    kind: 'negative',
    window: keyWindow([...spread(50, TEN_MINUTES_AGO, 10 * MINUTE, OK), ...spread(500, T0 - 4 * MINUTE, 2 * MINUTE, { status: 429 })]),
    now: T0,
    expect: { findings: 0 },
  },
  {
    // 0.14 × 50 is 7.000000000000001 in floating point, yet 7 / 50 is 0.14: the bar is met exactly.
    name: 'a merchant\'s own bar (14% of at least 50 requests) met exactly: 7 × 401 of 50 is medium',
    kind: 'positive',
    window: keyWindow([...spread(43, TEN_MINUTES_AGO, 10 * MINUTE, OK), ...spread(7, TEN_MINUTES_AGO, 10 * MINUTE, { status: 401 })]),
    now: T0,
    params: { minRequests: 50, thresholdShare: 0.14 },
    expect: { findings: 1, severity: 'medium', evidence: { signalFailures: 7, judgedRequests: 50, observedShare: 0.14 } },
  },
  {
    name: '3 failures out of 5 requests is below minRequests',
    kind: 'negative',
    window: keyWindow([...spread(2, TEN_MINUTES_AGO, 10 * MINUTE, OK), ...spread(3, TEN_MINUTES_AGO, 10 * MINUTE, { status: 401 })]),
    now: T0,
    expect: { findings: 0 },
  },
  {
    name: 'validation errors (422) are the integration\'s bugs, not abuse',
    kind: 'negative',
    window: keyWindow([...spread(50, TEN_MINUTES_AGO, 10 * MINUTE, OK), ...spread(200, TEN_MINUTES_AGO, 10 * MINUTE, { status: 422 })]),
    now: T0,
    expect: { findings: 0 },
  },
  {
    name: 'ordinary traffic with a few 404s (lookups of expired sessions) is quiet',
    kind: 'negative',
    window: keyWindow(spread(300, TEN_MINUTES_AGO, 10 * MINUTE, (i) => ({ method: 'GET', path: `/v1/verify/sessions/ses_${i}`, status: i % 20 === 0 ? 404 : 200 }))),
    now: T0,
    expect: { findings: 0 },
  },
  {
    name: 'a storm of 401s that ended 65 minutes ago is outside both windows',
    kind: 'negative',
    window: keyWindow([...spread(500, T0 - 75 * MINUTE, 10 * MINUTE, { status: 401 }), ...spread(100, TEN_MINUTES_AGO, 10 * MINUTE, OK)]),
    now: T0,
    expect: { findings: 0 },
  },
  {
    // It alerted (high) while it lasted; within the hour it is still the key's failures (the engine
    // takes such a finding, no newer than the alert, as no repeat).
    name: 'a storm of 401s that ended 15 minutes ago is still within the hour: medium',
    kind: 'positive',
    window: keyWindow([...spread(500, T0 - 25 * MINUTE, 10 * MINUTE, { status: 401 }), ...spread(100, TEN_MINUTES_AGO, 10 * MINUTE, OK)]),
    now: T0,
    expect: { findings: 1, severity: 'medium', evidence: { horizon: 'long', judgedBy: 'key', windowMinutes: 60, signalFailures: 500 } },
  },

  // A stranger hidden under the key's own traffic: each network new to the key is judged on its own.
  {
    name: 'a stranger walking ids: 400 × 404 from one new address under the key\'s own 1,200 successes is high',
    kind: 'positive',
    window: keyWindow(
      [...spread(1200, TEN_MINUTES_AGO, 10 * MINUTE, { ...LOOKUP, status: 200 }), ...spread(400, TEN_MINUTES_AGO, 10 * MINUTE, { ...LOOKUP, status: 404, ...at('moscow') })],
      { history: USUAL },
    ),
    now: T0,
    expect: {
      findings: 1,
      severity: 'high',
      title: /from 192\.0\.2\.0\/24/,
      evidence: { judgedBy: 'network', network: '192.0.2.0/24', notFound: 400, judgedRequests: 400, observedShare: 1, keyJudgedRequests: 1600, horizon: 'short' },
    },
  },
  {
    name: 'a stranger guessing the secret: 60 × 401 from a new network among the key\'s 2,000 successes is medium',
    kind: 'positive',
    window: keyWindow([...spread(2000, TEN_MINUTES_AGO, 10 * MINUTE, OK), ...spread(60, TEN_MINUTES_AGO, 10 * MINUTE, { status: 401, ...at('saoPaulo') })], { history: USUAL }),
    now: T0,
    expect: { findings: 1, severity: 'medium', evidence: { judgedBy: 'network', network: '192.0.3.0/24', authFailures: 60, keyJudgedRequests: 2060 } },
  },
  {
    // A proxy pool: no network sends minRequests, but the networks new to the key fail together.
    name: 'a stranger rotating through 40 new networks, 2 × 401 from each, among the key\'s 1,200 successes is medium',
    kind: 'positive',
    window: keyWindow([...spread(1200, TEN_MINUTES_AGO, 10 * MINUTE, OK), ...spread(80, TEN_MINUTES_AGO, 10 * MINUTE, (i) => ({ status: 401, ip: `203.0.${i % 40}.7` }))], {
      history: USUAL,
    }),
    now: T0,
    expect: {
      findings: 1,
      severity: 'medium',
      title: /from 40 networks new to the key/,
      evidence: { judgedBy: 'new_networks', newNetworks: 40, authFailures: 80, judgedRequests: 80, distinctNetworks: 40, keyJudgedRequests: 1280, horizon: 'short' },
    },
  },
  {
    name: 'the key\'s end users on 60 new networks, 1 in 5 of their lookups missing (404), among its successes is quiet',
    kind: 'negative',
    window: keyWindow(
      [
        ...spread(1200, TEN_MINUTES_AGO, 10 * MINUTE, OK),
        ...spread(300, TEN_MINUTES_AGO, 10 * MINUTE, (i) => ({ ...LOOKUP, status: i % 5 === 0 ? 404 : 200, ip: `203.0.${i % 60}.7` })),
      ],
      { history: USUAL },
    ),
    now: T0,
    expect: { findings: 0 },
  },
  {
    name: 'the key\'s own network failing at a low share (300 × 404 among 1,500 lookups) is quiet',
    kind: 'negative',
    window: keyWindow(spread(1500, TEN_MINUTES_AGO, 10 * MINUTE, (i) => ({ ...LOOKUP, status: i % 5 === 0 ? 404 : 200 })), { history: USUAL }),
    now: T0,
    expect: { findings: 0 },
  },
  {
    name: 'a new network of the merchant\'s failing at a low share (40 × 404 of 200) among the key\'s traffic is quiet',
    kind: 'negative',
    window: keyWindow(
      [...spread(1000, TEN_MINUTES_AGO, 10 * MINUTE, OK), ...spread(200, TEN_MINUTES_AGO, 10 * MINUTE, (i) => ({ ...LOOKUP, status: i % 5 === 0 ? 404 : 200, ...at('dublin') }))],
      { history: USUAL },
    ),
    now: T0,
    expect: { findings: 0 },
  },
  {
    // Its network was the key's yesterday: it is judged with the key (14%), not on its own.
    name: 'the merchant\'s second site (seen yesterday) whose lookups mostly miss (200 × 404 of 220), among the key\'s successes, is quiet',
    kind: 'negative',
    window: keyWindow(
      [
        ...spread(1200, TEN_MINUTES_AGO, 10 * MINUTE, OK),
        ...spread(220, TEN_MINUTES_AGO, 10 * MINUTE, (i) => ({ ...LOOKUP, status: i % 11 === 0 ? 200 : 404, ...at('newYork') })),
      ],
      { history: TWO_SITES },
    ),
    now: T0,
    expect: { findings: 0 },
  },

  // Low and slow: the hour, for guessing that never reaches minRequests in ten minutes.
  {
    name: 'low-and-slow guessing: 25 × 401 every 10 minutes for an hour (150 failures, 100%) is medium',
    kind: 'positive',
    window: keyWindow(spread(150, HOUR_AGO, 60 * MINUTE, { status: 401, ...at('moscow') })),
    now: T0,
    expect: { findings: 1, severity: 'medium', evidence: { horizon: 'long', judgedBy: 'key', authFailures: 150, judgedRequests: 150, windowMinutes: 60, longMinFailures: 100 } },
  },
  {
    name: 'low-and-slow guessing from a stranger among the key\'s own 6,000 successes an hour is medium',
    kind: 'positive',
    window: keyWindow([...spread(6000, HOUR_AGO, 60 * MINUTE, OK), ...spread(150, HOUR_AGO, 60 * MINUTE, { status: 401, ...at('moscow') })], { history: USUAL }),
    now: T0,
    expect: { findings: 1, severity: 'medium', evidence: { horizon: 'long', judgedBy: 'network', network: '192.0.2.0/24', authFailures: 150, keyJudgedRequests: 6150 } },
  },
  {
    name: 'low-and-slow guessing through a proxy pool: 150 × 401 an hour from 50 new networks among the key\'s 6,000 successes is medium',
    kind: 'positive',
    window: keyWindow([...spread(6000, HOUR_AGO, 60 * MINUTE, OK), ...spread(150, HOUR_AGO, 60 * MINUTE, (i) => ({ status: 401, ip: `203.0.${i % 50}.7` }))], {
      history: USUAL,
    }),
    now: T0,
    expect: { findings: 1, severity: 'medium', evidence: { horizon: 'long', judgedBy: 'new_networks', newNetworks: 50, authFailures: 150, keyJudgedRequests: 6150 } },
  },
  {
    name: 'a few scattered 401s an hour (10, from the key\'s own address) among its ordinary traffic are quiet',
    kind: 'negative',
    window: keyWindow([...spread(1800, HOUR_AGO, 60 * MINUTE, OK), ...spread(10, HOUR_AGO, 60 * MINUTE, { status: 401 })], { history: USUAL }),
    now: T0,
    expect: { findings: 0 },
  },
  {
    name: 'a stranger\'s 90 × 401 in an hour (under longMinFailures) among a quiet key\'s traffic is quiet',
    kind: 'negative',
    window: keyWindow([...spread(120, HOUR_AGO, 60 * MINUTE, OK), ...spread(90, HOUR_AGO, 60 * MINUTE, { status: 401, ...at('moscow') })], { history: USUAL }),
    now: T0,
    expect: { findings: 0 },
  },

  // 404s alone from the key's own network never block it.
  {
    name: 'the merchant\'s own job (its usual address and library) looking up 1,200 ids, 1,100 unknown (404), is high, not critical',
    kind: 'positive',
    window: keyWindow([...spread(100, TEN_MINUTES_AGO, 10 * MINUTE, { ...LOOKUP, status: 200 }), ...spread(1100, TEN_MINUTES_AGO, 10 * MINUTE, { ...LOOKUP, status: 404 })], {
      history: USUAL,
    }),
    now: T0,
    // Its summary does not accuse anyone: the key's own networks send them (red-team round 44: "someone is enumerating").
    expect: { findings: 1, severity: 'high', evidence: { judgedBy: 'key', notFound: 1100, judgedRequests: 1200 }, summary: /most come from the key's own networks: its integration asking for ids that no longer exist/ },
  },
  {
    name: 'the same 1,100 × 404 of 1,200 from a network new to the key is critical',
    kind: 'positive',
    window: keyWindow(
      [...spread(100, TEN_MINUTES_AGO, 10 * MINUTE, { ...LOOKUP, status: 200, ...at('moscow') }), ...spread(1100, TEN_MINUTES_AGO, 10 * MINUTE, { ...LOOKUP, status: 404, ...at('moscow') })],
      { history: USUAL },
    ),
    now: T0,
    expect: { findings: 1, severity: 'critical', evidence: { notFound: 1100, judgedRequests: 1200 }, summary: /someone is enumerating resources with this key/ },
  },
  {
    // A fresh egress /24 in the key's own city (a new NAT gateway, a new cloud address) is the key's, as in credential_sharing.
    name: 'the merchant\'s own job from a fresh /24 in its own city looking up 1,200 ids, 1,100 unknown (404), is high, not critical',
    kind: 'positive',
    window: keyWindow(
      [
        ...spread(100, TEN_MINUTES_AGO, 10 * MINUTE, { ...LOOKUP, status: 200, ...at('ashburn', '198.51.200.17') }),
        ...spread(1100, TEN_MINUTES_AGO, 10 * MINUTE, { ...LOOKUP, status: 404, ...at('ashburn', '198.51.200.17') }),
      ],
      { history: USUAL },
    ),
    now: T0,
    expect: { findings: 1, severity: 'high', evidence: { notFound: 1100, judgedRequests: 1200 } },
  },
  {
    // Only a place the key is established at is its own: a stranger's lone request from his city earlier is not.
    name: 'the same 1,100 × 404 of 1,200 from a stranger whose one request from another /24 of his city came two hours earlier is critical',
    kind: 'positive',
    window: keyWindow(
      [
        ...spread(100, TEN_MINUTES_AGO, 10 * MINUTE, { ...LOOKUP, status: 200, ...at('moscow') }),
        ...spread(1100, TEN_MINUTES_AGO, 10 * MINUTE, { ...LOOKUP, status: 404, ...at('moscow') }),
      ],
      { history: [...USUAL, { at: T0 - 2 * 60 * MINUTE, ...LOOKUP, status: 404, ...at('moscow', '192.0.20.10') }] },
    ),
    now: T0,
    expect: { findings: 1, severity: 'critical', evidence: { notFound: 1100, judgedRequests: 1200 }, summary: /someone is enumerating resources with this key/ },
  },
  {
    name: 'a brute force at volume from the key\'s own network (1,200 × 401 of 1,250) is still critical',
    kind: 'positive',
    window: keyWindow([...spread(50, TEN_MINUTES_AGO, 10 * MINUTE, OK), ...spread(1200, TEN_MINUTES_AGO, 10 * MINUTE, { status: 401 })], { history: USUAL }),
    now: T0,
    expect: { findings: 1, severity: 'critical', evidence: { judgedBy: 'key', authFailures: 1200 } },
  },
  {
    name: 'a deleted key still set in its owner\'s pods (1,000 × 401 from the key\'s own network, nothing succeeding) is high, not critical: no stranger, nothing to page on-call for',
    kind: 'positive',
    window: keyWindow(spread(1000, TEN_MINUTES_AGO, 10 * MINUTE, { status: 401 }), { history: USUAL }),
    now: T0,
    // Red-team round 44: critical, paging on-call, for the merchant's own stale deployment.
    expect: { findings: 1, severity: 'high', evidence: { judgedBy: 'key', authFailures: 1000 } },
  },
  {
    name: 'the same 1,000 × 401 from a network new to the key is critical',
    kind: 'positive',
    window: keyWindow(spread(1000, TEN_MINUTES_AGO, 10 * MINUTE, { status: 401, ip: '192.0.2.66' }), { history: USUAL }),
    now: T0,
    expect: { findings: 1, severity: 'critical', evidence: { authFailures: 1000 } },
  },
];
