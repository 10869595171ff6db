import { keyWindow, MINUTE, spread, T0, type RuleFixture } from './fixtures.ts';
import type { rule } from './high_failure_rate.ts';

type Fixture = RuleFixture<(typeof rule)['defaults']>;

const TEN_MINUTES_AGO = T0 - 10 * MINUTE;
const OK = { status: 201 };

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
    name: 'a storm of 401s that ended 15 minutes ago is outside the window',
    kind: 'negative',
    window: keyWindow([...spread(500, T0 - 25 * MINUTE, 10 * MINUTE, { status: 401 }), ...spread(100, TEN_MINUTES_AGO, 10 * MINUTE, OK)]),
    now: T0,
    expect: { findings: 0 },
  },
];
