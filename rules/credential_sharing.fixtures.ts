import type { WindowEvent } from '../src/detect/types.ts';
import type { rule } from './credential_sharing.ts';
import { at, keyWindow, MINUTE, spread, T0, type EventSpec, type PlaceName, type RuleFixture } from './fixtures.ts';

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

const NINE = ['BR', 'RU', 'IN', 'VN', 'NG', 'DE', 'FR', 'ID', 'TR'];
const PLACE_NAMES = ['ashburn', 'newYork', 'montreal', 'dublin', 'london', 'frankfurt', 'madrid', 'amsterdam', 'moscow', 'saoPaulo', 'singapore', 'tokyo', 'sydney', 'mumbai', 'johannesburg', 'mexicoCity'] as const;

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
      summary: /used from 6 networks it had not used in the last 7 days, in places it had not used either \(besides 6 of its own networks or places\) .* after no requests in the previous 50 min and/,
    },
  },
  {
    name: 'networks first seen inside the window are not history: the hour before decides',
    kind: 'positive',
    window: keyWindow([...HOME, ...networks(4, ['DE', 'FR'])], { history: networks(4, ['DE', 'FR'], T0 - 30 * MINUTE) }),
    now: T0,
    expect: { findings: 1, severity: 'medium', evidence: { recentNetworks: 5, newNetworks: 5, knownNetworks: 0 } },
  },
  // Finding 2: a network is new only when its place is new too. A job's cloud regions churn their
  // egress /24s; strangers in other cities still count.
  {
    name: 'a nightly job in three cloud regions whose egress /24s churn: new /24s in the same cities as last night are its own',
    kind: 'negative',
    window: keyWindow(cloudJob(2), { history: cloudJob(1, TEN_MINUTES_AGO - DAY) }),
    now: T0,
    expect: { findings: 0 },
  },
  {
    name: 'the churning cloud job with six strangers in cities it never used: the strangers alert, the job\'s fresh /24s do not count',
    kind: 'positive',
    window: keyWindow([...cloudJob(2), ...strangers(6, ['tokyo', 'sydney', 'mumbai', 'saoPaulo', 'johannesburg', 'moscow'])], { history: cloudJob(1, TEN_MINUTES_AGO - DAY) }),
    now: T0,
    expect: {
      findings: 1,
      severity: 'high',
      evidence: { trigger: 'interval', recentNetworks: 12, newNetworks: 6, knownNetworks: 0, newNetworksInKnownPlaces: 6, distinctCountries: 6 },
      summary: /\(besides 6 of its own networks or places\)/,
    },
  },
  // Finding 3: a leak that grows a few networks an interval raises its own baseline; the window's
  // new networks, many times the key's usual and the places it had, still tell it.
  {
    name: 'a key leaked gradually (2, 3, 4, 5, 6, 7 never-seen networks per 10 min, 9 countries) beside its own network is reported',
    kind: 'positive',
    window: keyWindow([...HOME, ...leak([2, 3, 4, 5, 6, 7], NINE)], { history: spread(60, T0 - DAY, 60 * MINUTE) }),
    now: T0,
    expect: {
      findings: 1,
      severity: 'high',
      evidence: { trigger: 'window', windowNewNetworks: 27, knownPlaces: 1, recentNetworks: 8, newNetworks: 7, baselineNetworks: 5 },
      title: /: 27 new networks in 9 countries in 60 min, more every interval \(usually 5 per 10 min\)$/,
    },
  },
  {
    name: 'a mobile carrier\'s churn growing over the hour (27 /24s) in one country is not sharing',
    kind: 'negative',
    window: keyWindow([...HOME, ...leak([2, 3, 4, 5, 6, 7], ['BR'])], { history: spread(60, T0 - DAY, 60 * MINUTE) }),
    now: T0,
    expect: { findings: 0 },
  },
  {
    name: 'a key whose users churn (six new networks every interval, 4 countries) and that had 16 places this week: its usual, not a leak',
    kind: 'negative',
    window: keyWindow([...HOME, ...leak([6, 6, 6, 6, 6, 6], ['BR', 'IN', 'DE', 'US'])], {
      history: spread(160, T0 - DAY, 160 * MINUTE, (i) => at(PLACE_NAMES[i % PLACE_NAMES.length]!, `198.19.${i % PLACE_NAMES.length}.7`)),
    }),
    now: T0,
    expect: { findings: 0 },
  },
  // A resale primed over the day before: each buyer's network made one request while the key was
  // idle, so each was seen before the window. Seen is not the key's: none was ever tied to its own.
  {
    name: 'a resale primed over 28 hours (30 networks in 14 countries, one request each while the key was idle), then all at once: reported',
    kind: 'positive',
    window: keyWindow([...HOME, ...buyers(30, TEN_MINUTES_AGO, 10 * MINUTE)], { history: [...spread(60, T0 - 40 * 60 * MINUTE, 60 * MINUTE, at('ashburn')), ...buyers(30, T0 - 30 * 60 * MINUTE, 28 * 60 * MINUTE, 1)] }),
    now: T0,
    expect: { findings: 1, severity: 'high', evidence: { trigger: 'interval', newNetworks: 30, knownNetworks: 1, newNetworksInKnownPlaces: 0 } },
  },
  {
    name: 'the same resale without GeoIP (countries only): reported',
    kind: 'positive',
    window: keyWindow([...spread(60, T0 - 60 * MINUTE, 60 * MINUTE, from(0, 'US')), ...networks(30, NINE, TEN_MINUTES_AGO, 10 * MINUTE, 100)], {
      history: [...spread(60, T0 - 40 * 60 * MINUTE, 60 * MINUTE, from(0, 'US')), ...spread(30, T0 - 30 * 60 * MINUTE, 28 * 60 * MINUTE, (i) => from(100 + i, NINE[i % NINE.length]!))],
    }),
    now: T0,
    expect: { findings: 1, severity: 'high', evidence: { trigger: 'interval', newNetworks: 30, knownNetworks: 1 } },
  },
];

/**
 * `count` buyers' networks (198.18.100.x up), each in one of the 15 places other than Ashburn, making
 * `requests` requests each within [start, start + spanMs).
 */
function buyers(count: number, start: number, spanMs: number, requests = 3): EventSpec[] {
  const places = PLACE_NAMES.slice(1);
  return spread(count * requests, start, spanMs, (i) => at(places[i % count % places.length]!, `198.18.${100 + (i % count)}.9`));
}

/** A ten-minute run of a job in Ashburn, Dublin and Singapore: two egress /24s per region, new ones each night. */
function cloudJob(night: number, start = TEN_MINUTES_AGO): EventSpec[] {
  const regions: PlaceName[] = ['ashburn', 'dublin', 'singapore'];
  return spread(60, start, 10 * MINUTE, (i) => at(regions[i % 3]!, `198.18.${night * 10 + (i % 6)}.${7 + (i % 5)}`));
}

/** `count` new networks at these places, three requests each, in the recent interval (/24s never used by a fixture's key). */
function strangers(count: number, places: readonly PlaceName[]): EventSpec[] {
  return spread(count * 3, TEN_MINUTES_AGO, 10 * MINUTE, (i) => at(places[i % count % places.length]!, `198.18.${200 + (i % count)}.9`));
}


/** counts[k] never-seen networks joining in the k-th interval of the hour (oldest first), three requests each; countries rotate. */
function leak(counts: readonly number[], countries: readonly string[]): EventSpec[] {
  let offset = 0;
  return counts.flatMap((count, k) => {
    const specs = networks(count, countries.slice(offset % countries.length).concat(countries.slice(0, offset % countries.length)), T0 - (60 - 10 * k) * MINUTE, 10 * MINUTE, offset);
    offset += count;
    return specs;
  });
}
