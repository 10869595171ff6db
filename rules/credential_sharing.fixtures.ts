import type { WindowEvent } from '../src/detect/types.ts';
import type { rule } from './credential_sharing.ts';
import { keyWindow, MINUTE, spread, T0, type EventSpec, type RuleFixture } from './fixtures.ts';

type Fixture = RuleFixture<(typeof rule)['defaults']>;

const TEN_MINUTES_AGO = T0 - 10 * MINUTE;
const DAY = 24 * 60 * MINUTE;
/** The key's usual life: one request a minute from one us-east address, for the whole hour. */
const HOME = spread(60, T0 - 60 * MINUTE, 60 * MINUTE);

/** Network n (a /24 of the benchmark range) in a country, without geo: the rule counts countries. */
const from = (n: number, country: string): Partial<WindowEvent> => ({ ip: `198.18.${n}.${7 + (n % 100)}`, country, geo: undefined });

/** Each of `count` networks makes three requests within [start, start + spanMs); countries rotate. */
function networks(count: number, countries: readonly string[], start = TEN_MINUTES_AGO, spanMs = 10 * MINUTE, offset = 0): EventSpec[] {
  return spread(count * 3, start, spanMs, (i) => from(offset + (i % count), countries[(i % count) % countries.length]!));
}

export const fixtures: Fixture[] = [
  {
    name: 'a key that lived in one network now used from 13 networks in 6 countries is high',
    kind: 'positive',
    window: keyWindow([...HOME, ...networks(12, ['BR', 'RU', 'IN', 'VN', 'NG'])]),
    now: T0,
    expect: {
      findings: 1,
      severity: 'high',
      evidence: { recentNetworks: 13, baselineNetworks: 1, distinctCountries: 6, countries: ['BR', 'IN', 'NG', 'RU', 'US', 'VN'] },
      title: /\(usually 1\)$/,
      summary: /against a baseline of 1 per 10 min/,
    },
  },
  {
    name: 'five networks in three countries against a baseline of one is medium',
    kind: 'positive',
    window: keyWindow([...HOME, ...networks(4, ['DE', 'FR'])]),
    now: T0,
    expect: { findings: 1, severity: 'medium', evidence: { recentNetworks: 5, baselineNetworks: 1, observedMultiplier: 5, distinctCountries: 3 } },
  },
  {
    name: 'a published key: 60 networks in 12 countries with no history is critical',
    kind: 'positive',
    window: keyWindow(networks(60, ['US', 'BR', 'RU', 'IN', 'VN', 'NG', 'DE', 'FR', 'ID', 'TR', 'PK', 'EG'])),
    now: T0,
    expect: {
      findings: 1,
      severity: 'critical',
      evidence: { recentNetworks: 60, baselineNetworks: 0, baselineIntervals: 0, distinctCountries: 12 },
      // Not "usually 0": the key has no history in the window at all.
      title: /\(no earlier history\)$/,
      summary: /with no earlier history in the last 60 min to compare with/,
    },
  },
  {
    name: 'NAT churn: 40 addresses in one /24 are one network',
    kind: 'negative',
    window: keyWindow([...HOME, ...spread(40, TEN_MINUTES_AGO, 10 * MINUTE, (i) => ({ ip: `198.51.100.${20 + i}` }))]),
    now: T0,
    expect: { findings: 0 },
  },
  {
    name: 'IPv6 privacy addresses: 40 addresses in one /64 are one network',
    kind: 'negative',
    window: keyWindow([...HOME, ...spread(40, TEN_MINUTES_AGO, 10 * MINUTE, (i) => ({ ip: `2001:db8:1:2:${(i * 331).toString(16)}:5:6:${i.toString(16)}` }))]),
    now: T0,
    expect: { findings: 0 },
  },
  {
    name: 'a mobile carrier: 20 /24s all in one country are address churn, not sharing',
    kind: 'negative',
    window: keyWindow(networks(20, ['BR'])),
    now: T0,
    expect: { findings: 0 },
  },
  {
    name: 'ten networks in two countries (US and Canada) are below minCountries',
    kind: 'negative',
    window: keyWindow([...HOME, ...networks(10, ['US', 'CA'])]),
    now: T0,
    expect: { findings: 0 },
  },
  {
    name: 'four networks in four countries are below minNetworks',
    kind: 'negative',
    window: keyWindow([...HOME, ...networks(3, ['DE', 'JP', 'BR'])]),
    now: T0,
    expect: { findings: 0 },
  },
  {
    name: 'edge functions calling from 8 networks in 5 countries every interval: the baseline is 8',
    kind: 'negative',
    window: keyWindow(
      [0, 1, 2, 3, 4, 5].flatMap((k) => networks(8, ['US', 'DE', 'SG', 'BR', 'AU'], T0 - (60 - 10 * k) * MINUTE, 10 * MINUTE)),
    ),
    now: T0,
    expect: { findings: 0 },
  },
  {
    name: 'a daily job from six networks in four countries, idle since yesterday: the key used them all then',
    kind: 'negative',
    window: keyWindow(networks(6, ['US', 'DE', 'SG', 'BR']), { history: networks(6, ['US', 'DE', 'SG', 'BR'], TEN_MINUTES_AGO - DAY) }),
    now: T0,
    expect: { findings: 0 },
  },
  {
    name: 'the daily job\'s six networks and six it never used, in four countries: the new ones alert',
    kind: 'positive',
    window: keyWindow([...networks(6, ['US', 'DE', 'SG', 'BR']), ...networks(6, ['RU', 'VN', 'NG', 'IN'], TEN_MINUTES_AGO, 10 * MINUTE, 50)], {
      history: networks(6, ['US', 'DE', 'SG', 'BR'], TEN_MINUTES_AGO - DAY),
    }),
    now: T0,
    expect: {
      findings: 1,
      severity: 'medium',
      evidence: { recentNetworks: 12, newNetworks: 6, knownNetworks: 6, countries: ['IN', 'NG', 'RU', 'VN'], distinctCountries: 4 },
      title: /: 6 new networks in 4 countries in 10 min \(idle in the previous 50 min\)$/,
      summary: /used from 6 networks it had not used in the last 7 days \(besides 6 it had\) .* after no requests in the previous 50 min and/,
    },
  },
  {
    name: 'networks first seen inside the window are not history: the hour before decides',
    kind: 'positive',
    window: keyWindow([...HOME, ...networks(4, ['DE', 'FR'])], { history: networks(4, ['DE', 'FR'], T0 - 30 * MINUTE) }),
    now: T0,
    expect: { findings: 1, severity: 'medium', evidence: { recentNetworks: 5, newNetworks: 5, knownNetworks: 0 } },
  },
];
