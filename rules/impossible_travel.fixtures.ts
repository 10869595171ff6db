import type { WindowEvent } from '../src/detect/types.ts';
import { at, keyWindow, MINUTE, SECOND, spread, T0, type PlaceName, type RuleFixture } from './fixtures.ts';
import type { rule } from './impossible_travel.ts';

type Fixture = RuleFixture<(typeof rule)['defaults']>;

const DAY = 24 * 60 * MINUTE;

// The key's ordinary life: one request a minute from us-east for the 50 minutes before T0 - 10 min.
const HOME = spread(50, T0 - 60 * MINUTE, 50 * MINUTE, at('ashburn'));
/** An hour of us-east two days ago: Ashburn is a place the key was established at before its window, a key seen for over a day. */
const ESTABLISHED_IN_ASHBURN = spread(60, T0 - 2 * DAY, 60 * MINUTE, at('ashburn'));

/** The fleet after a failover: from T0 - 60 min + 5 s, Dublin, Singapore and São Paulo in turn every 20 s. */
const MOVED = spread(180, T0 - 60 * MINUTE + 5 * SECOND, 60 * MINUTE - 5 * SECOND, (i) => at((['dublin', 'singapore', 'saoPaulo'] as const)[i % 3]!));

/** An edge deployment: its requests come through five countries' edge locations in turn, every 20 s. */
const EDGE = ['ashburn', 'dublin', 'frankfurt', 'singapore', 'tokyo'] as const;
const edgeTraffic = (count: number, from: number, spanMs: number) => spread(count, from, spanMs, (i) => at(EDGE[i % EDGE.length]!));

/** A place's event, its address announced by autonomous system `asn` (as with GEOIP_ASN_DB). */
const viaOperator = (name: PlaceName, asn: number, asOrganization: string, ip?: string): Pick<WindowEvent, 'ip' | 'country' | 'geo'> => {
  const fields = at(name, ip);
  return { ...fields, geo: { ...fields.geo!, asn, asOrganization } };
};

/** Title and summary of a hop out of Moscow, the place new to the key, into its own Ashburn. */
const OUT_OF_MOSCOW = { title: /: Moscow, RU to Ashburn, US at /, summary: /\(Moscow, RU is new to the key\)/ };

export const fixtures: Fixture[] = [
  {
    name: 'us-east then Moscow 5 seconds later is simultaneous use, said as such rather than as millions of km/h',
    kind: 'positive',
    window: keyWindow([...HOME, ...spread(7, T0 - 10 * MINUTE, 7 * MINUTE, at('ashburn')), { at: T0 - 4 * MINUTE + 5 * SECOND, ...at('moscow') }]),
    now: T0,
    expect: {
      findings: 1,
      severity: 'high',
      title: /: Ashburn, US to Moscow, RU, \d+ km apart, within 5 s \(simultaneous use\)$/,
      summary: /and 5 s later from 192\.0\.2\.10 \(Moscow, RU\), \d+ km apart after GeoIP accuracy: in use in both places at once \(/,
      evidence: { gapMinutes: 0.1 },
    },
  },
  {
    name: 'us-east then Moscow three minutes later is high',
    kind: 'positive',
    window: keyWindow([...HOME, ...spread(7, T0 - 10 * MINUTE, 7 * MINUTE, at('ashburn')), { at: T0 - 2 * MINUTE, ...at('moscow') }]),
    now: T0,
    expect: {
      findings: 1,
      severity: 'high',
      // Ashburn was the one place known before the hop; Moscow is where it went.
      evidence: { from: { ip: '198.51.100.10', country: 'US', city: 'Ashburn' }, to: { ip: '192.0.2.10', country: 'RU', city: 'Moscow' }, gapMinutes: 2, impossibleHops: 1, knownLocations: 1 },
    },
  },
  {
    name: 'São Paulo, Frankfurt and Singapore within ten minutes of a key established in us-east is critical (three new countries)',
    kind: 'positive',
    window: keyWindow(
      [
        ...HOME,
        { at: T0 - 9 * MINUTE, ...at('saoPaulo') },
        { at: T0 - 6 * MINUTE, ...at('frankfurt') },
        { at: T0 - 3 * MINUTE, ...at('singapore') },
      ],
      { history: ESTABLISHED_IN_ASHBURN },
    ),
    now: T0,
    expect: {
      findings: 1,
      severity: 'critical',
      evidence: { countries: ['BR', 'DE', 'SG', 'US'], newCountries: ['BR', 'DE', 'SG'], keyEstablished: true, impossibleHops: 3 },
    },
  },
  {
    name: 'a thief pool in Moscow, Tokyo and São Paulo, each between requests of the key\'s own us-east, is critical (three new countries)',
    kind: 'positive',
    window: keyWindow(
      [
        ...HOME,
        ...spread(10, T0 - 10 * MINUTE, 10 * MINUTE, at('ashburn')),
        { at: T0 - 8 * MINUTE - 30 * SECOND, ...at('moscow') },
        { at: T0 - 5 * MINUTE - 30 * SECOND, ...at('tokyo') },
        { at: T0 - 2 * MINUTE - 30 * SECOND, ...at('saoPaulo') },
      ],
      { history: ESTABLISHED_IN_ASHBURN },
    ),
    now: T0,
    // The hops back into Ashburn are between places already known by then: only the hops out count.
    expect: { findings: 1, severity: 'critical', evidence: { newCountries: ['BR', 'JP', 'RU'], impossibleHops: 3 } },
  },
  {
    name: 'an engineer\'s VPN exit moving London -> Frankfurt on a key established in us-east is high: the key\'s own country is not a third',
    kind: 'positive',
    window: keyWindow(
      [
        ...HOME,
        ...spread(10, T0 - 10 * MINUTE, 10 * MINUTE, at('ashburn')),
        ...spread(6, T0 - 9 * MINUTE, 2 * MINUTE, { ...at('london'), userAgent: 'curl/8.5.0' }),
        ...spread(6, T0 - 3 * MINUTE, 2 * MINUTE, { ...at('frankfurt'), userAgent: 'curl/8.5.0' }),
      ],
      { history: ESTABLISHED_IN_ASHBURN },
    ),
    now: T0,
    // Red-team F4: with the known end's US counted, three countries made it critical, and blocked the key.
    expect: { findings: 1, severity: 'high', evidence: { countries: ['DE', 'GB', 'US'], newCountries: ['DE', 'GB'], keyEstablished: true } },
  },
  {
    name: 'an engineer\'s VPN exit moving Frankfurt -> Amsterdam -> London, a few requests at each, on a key established in us-east is high: one exit after another is one pair of hands',
    kind: 'positive',
    window: keyWindow(
      [
        ...HOME,
        ...spread(10, T0 - 10 * MINUTE, 10 * MINUTE, at('ashburn')),
        ...spread(5, T0 - 9 * MINUTE, 100 * SECOND, { ...at('frankfurt'), userAgent: 'curl/8.5.0' }),
        ...spread(5, T0 - 6 * MINUTE - 30 * SECOND, 100 * SECOND, { ...at('amsterdam'), userAgent: 'curl/8.5.0' }),
        ...spread(5, T0 - 4 * MINUTE, 100 * SECOND, { ...at('london'), userAgent: 'curl/8.5.0' }),
      ],
      { history: ESTABLISHED_IN_ASHBURN },
    ),
    now: T0,
    // Red-team round 44: three new countries made it critical, and blocked the production key.
    expect: { findings: 1, severity: 'high', evidence: { newCountries: ['DE', 'GB', 'NL'], newCountriesAtOnce: 1, keyEstablished: true } },
  },
  {
    name: 'thieves in Moscow, Tokyo and São Paulo using the key in the same minutes, a few requests each, are critical: three new countries at once',
    kind: 'positive',
    window: keyWindow(
      [
        ...HOME,
        ...spread(10, T0 - 10 * MINUTE, 10 * MINUTE, at('ashburn')),
        ...spread(5, T0 - 9 * MINUTE, 5 * MINUTE, at('moscow')),
        ...spread(5, T0 - 8 * MINUTE, 5 * MINUTE, at('tokyo')),
        ...spread(5, T0 - 7 * MINUTE, 5 * MINUTE, at('saoPaulo')),
      ],
      { history: ESTABLISHED_IN_ASHBURN },
    ),
    now: T0,
    expect: { findings: 1, severity: 'critical', evidence: { newCountries: ['BR', 'JP', 'RU'], newCountriesAtOnce: 3 } },
  },
  {
    name: 'the same VPN exits, and a new us-west region of the fleet in the same minutes, are high: a new place in the key\'s own country is not a third',
    kind: 'positive',
    window: keyWindow(
      [
        ...HOME,
        ...spread(10, T0 - 10 * MINUTE, 10 * MINUTE, at('ashburn')),
        ...spread(3, T0 - 9 * MINUTE, 2 * MINUTE, { ...at('london'), userAgent: 'curl/8.5.0' }),
        ...spread(3, T0 - 6 * MINUTE, 2 * MINUTE, { ...at('frankfurt'), userAgent: 'curl/8.5.0' }),
        ...spread(3, T0 - 3 * MINUTE, 2 * MINUTE, at('seattle')),
      ],
      { history: ESTABLISHED_IN_ASHBURN },
    ),
    now: T0,
    // Seattle is new to the key, but in the US, where it is established: counted, it made three countries, and blocked the key.
    expect: { findings: 1, severity: 'high', evidence: { newCountries: ['DE', 'GB'], keyEstablished: true } },
  },
  {
    name: 'an edge key at home in five countries that starts serving from three new ones at once (a market launch) is low, not critical',
    kind: 'positive',
    window: keyWindow(
      [
        ...edgeTraffic(150, T0 - 60 * MINUTE, 50 * MINUTE),
        ...spread(30, T0 - 10 * MINUTE, 10 * MINUTE, (i) => at((['ashburn', 'saoPaulo', 'frankfurt', 'mexicoCity', 'tokyo', 'sydney'] as const)[i % 6]!)),
      ],
      { history: edgeTraffic(180, T0 - 2 * DAY, 60 * MINUTE) },
    ),
    now: T0,
    // Red-team round 31: critical, risk 1.0, and a block of the merchant's production key; round 44: high, reopened at every new edge location.
    expect: { findings: 1, severity: 'low', evidence: { newCountries: ['AU', 'BR', 'MX'], criticalCountries: 5, homeCountries: 5, keyEstablished: true } },
  },
  {
    name: 'a key at home in five European countries, none 3,000 km apart, is not global: a thief in Moscow beside it is high, not low',
    kind: 'positive',
    window: keyWindow(
      [
        ...spread(150, T0 - 60 * MINUTE, 50 * MINUTE, (i) => at((['frankfurt', 'amsterdam', 'london', 'dublin', 'madrid'] as const)[i % 5]!)),
        ...spread(30, T0 - 10 * MINUTE, 10 * MINUTE, (i) => at((['frankfurt', 'moscow'] as const)[i % 2]!)),
      ],
      { history: spread(180, T0 - 2 * DAY, 60 * MINUTE, (i) => at((['frankfurt', 'amsterdam', 'london', 'dublin', 'madrid'] as const)[i % 5]!)) },
    ),
    now: T0,
    // Review round 44: five neighbours, a request each, made a key "global", and a thief low.
    expect: { findings: 1, severity: 'high', evidence: { newCountries: ['RU'], homeCountries: 5 } },
  },
  {
    name: 'the same edge key used from five new countries at once is critical: as many as it is at home in',
    kind: 'positive',
    window: keyWindow(
      [
        ...edgeTraffic(150, T0 - 60 * MINUTE, 50 * MINUTE),
        ...spread(30, T0 - 10 * MINUTE, 10 * MINUTE, (i) => at((['ashburn', 'saoPaulo', 'moscow', 'mexicoCity', 'johannesburg', 'sydney', 'mumbai'] as const)[i % 7]!)),
      ],
      { history: edgeTraffic(180, T0 - 2 * DAY, 60 * MINUTE) },
    ),
    now: T0,
    expect: { findings: 1, severity: 'critical', evidence: { newCountries: ['AU', 'BR', 'IN', 'MX', 'RU', 'ZA'], criticalCountries: 5, keyEstablished: true } },
  },
  {
    name: 'a freshly rotated key on a four-region fleet (us-east, eu-west, ap-southeast, ap-northeast) is high, never critical: nothing is established yet',
    kind: 'positive',
    window: keyWindow(
      spread(300, T0 - 10 * MINUTE, 10 * MINUTE, (i) => at((['ashburn', 'dublin', 'singapore', 'tokyo'] as const)[i % 4]!)),
      { apiKeyId: 'pk_live_new', history: [] }, // the engine's history of a key it never saw: empty
    ),
    now: T0,
    // Red-team F3: the first place was taken as known, the three others as new countries: critical, block.
    expect: { findings: 1, severity: 'high', evidence: { newCountries: ['IE', 'JP', 'SG'], keyEstablished: false } },
  },
  {
    name: 'a key rotated region by region (us-east alone for two hours, then eu-west, ap-southeast and ap-northeast at once) is high: the key is not a day old',
    kind: 'positive',
    window: keyWindow(
      [...HOME, ...spread(300, T0 - 10 * MINUTE, 10 * MINUTE, (i) => at((['ashburn', 'dublin', 'singapore', 'tokyo'] as const)[i % 4]!))],
      { apiKeyId: 'pk_live_rotated', history: spread(60, T0 - 3 * 60 * MINUTE, 2 * 60 * MINUTE, at('ashburn')) },
    ),
    now: T0,
    // Red-team: established in us-east after 30 minutes, its fleet's three other regions were three new countries: critical, block.
    expect: { findings: 1, severity: 'high', evidence: { newCountries: ['IE', 'JP', 'SG'], keyEstablished: true, keyAgeMinutes: 120, minKeyAgeMinutes: 1440 } },
  },
  {
    name: 'Frankfurt, then Madrid 50 minutes later (about 1,600 km/h) is medium: fast, but GeoIP or a VPN could explain it',
    kind: 'positive',
    window: keyWindow([{ at: T0 - 55 * MINUTE, ...at('frankfurt') }, { at: T0 - 5 * MINUTE, ...at('madrid') }]),
    now: T0,
    expect: { findings: 1, severity: 'medium', evidence: { from: { city: 'Frankfurt' }, to: { city: 'Madrid' }, gapMinutes: 50 } },
  },
  {
    name: 'IPv6: two addresses in different /64s, Tokyo then Sydney one minute apart',
    kind: 'positive',
    window: keyWindow([
      ...spread(30, T0 - 40 * MINUTE, 30 * MINUTE, at('tokyo', '2001:db8:aa:1::10')),
      { at: T0 - 4 * MINUTE, ...at('tokyo', '2001:db8:aa:1::11') },
      { at: T0 - 3 * MINUTE, ...at('sydney', '2001:db8:bb:2::10') },
    ]),
    now: T0,
    expect: { findings: 1, severity: 'high', evidence: { from: { network: '2001:db8:aa:1::/64' }, to: { network: '2001:db8:bb:2::/64' } } },
  },
  {
    name: 'multi-region deployment: us-east and eu-west alternating all hour is not travel',
    kind: 'negative',
    window: keyWindow(spread(120, T0 - 60 * MINUTE, 60 * MINUTE, (i) => at(i % 2 === 0 ? 'ashburn' : 'dublin'))),
    now: T0,
    expect: { findings: 0 },
  },
  {
    name: 'multi-region deployment with a burst of regional failover in the last minutes is still not travel',
    kind: 'negative',
    window: keyWindow([
      ...spread(40, T0 - 60 * MINUTE, 40 * MINUTE, (i) => at(i % 3 === 0 ? 'dublin' : 'ashburn')),
      ...spread(20, T0 - 5 * MINUTE, 5 * MINUTE, (i) => at(i % 2 === 0 ? 'dublin' : 'ashburn')),
    ]),
    now: T0,
    expect: { findings: 0 },
  },
  {
    name: 'the same IP placed elsewhere by GeoIP (a database update) never counts',
    kind: 'negative',
    window: keyWindow([...HOME, { at: T0 - 2 * MINUTE, ...at('moscow', '198.51.100.10') }]),
    now: T0,
    expect: { findings: 0 },
  },
  // GEOIP_ASN_DB: the operators are named, and one operator in one country is said, not acted on.
  {
    name: 'a mobile carrier moving a device from a CGNAT pool GeoIP places in Seattle to one in New York is still high, the summary saying both are the carrier\'s',
    kind: 'positive',
    window: keyWindow([
      ...spread(50, T0 - 60 * MINUTE, 50 * MINUTE, viaOperator('seattle', 21928, 'T-Mobile USA, Inc.')),
      ...spread(5, T0 - 5 * MINUTE, 5 * MINUTE, (i) => viaOperator(i % 2 === 0 ? 'newYork' : 'seattle', 21928, 'T-Mobile USA, Inc.')),
    ]),
    now: T0,
    expect: {
      findings: 1,
      severity: 'high',
      summary: /\(Seattle, US, AS21928 T-Mobile USA, Inc\.\) .* \(New York, US, AS21928 T-Mobile USA, Inc\.\), .*; both addresses are AS21928's, in US: a mobile carrier moving a device between its address pools/,
      evidence: { sameOperator: true, to: { city: 'New York', asn: 21928, asOrganization: 'T-Mobile USA, Inc.' } },
    },
  },
  {
    name: 'one request through the key owner\'s operator in "Seattle", then a cloud there, between the owner\'s requests in Ashburn: high, the operator hint no excuse',
    kind: 'positive',
    window: keyWindow(
      [
        ...spread(50, T0 - 60 * MINUTE, 50 * MINUTE, viaOperator('ashburn', 7922, 'Comcast')),
        { at: T0 - 9 * MINUTE, ...viaOperator('ashburn', 7922, 'Comcast') },
        { at: T0 - 8 * MINUTE - 30 * SECOND, ...viaOperator('seattle', 7922, 'Comcast') },
        { at: T0 - 8 * MINUTE, ...viaOperator('ashburn', 7922, 'Comcast') },
        { at: T0 - 5 * MINUTE, ...viaOperator('seattle', 14061, 'DigitalOcean, LLC', '198.51.104.10') },
        { at: T0 - 4 * MINUTE, ...viaOperator('ashburn', 7922, 'Comcast') },
      ],
      { history: ESTABLISHED_IN_ASHBURN },
    ),
    now: T0,
    expect: { findings: 1, severity: 'high', evidence: { sameOperator: true, to: { city: 'Seattle', asn: 7922 }, newLocation: 'to' } },
  },
  {
    name: 'one ASN in two countries is not one operator\'s move: a cloud\'s us-east then its Frankfurt region two minutes later is high, both ends named',
    kind: 'positive',
    window: keyWindow([
      ...spread(57, T0 - 60 * MINUTE, 57 * MINUTE, viaOperator('ashburn', 16509, 'Amazon.com, Inc.')),
      { at: T0 - 2 * MINUTE, ...viaOperator('frankfurt', 16509, 'Amazon.com, Inc.') },
    ]),
    now: T0,
    expect: {
      findings: 1,
      severity: 'high',
      summary: /\(Ashburn, US, AS16509 Amazon\.com, Inc\.\) and 2 min later from 203\.0\.115\.10 \(Frankfurt, DE, AS16509 Amazon\.com, Inc\.\), [^;]+\(Frankfurt, DE is new to the key\); confirm with/,
      evidence: { sameOperator: false, from: { asn: 16509, asOrganization: 'Amazon.com, Inc.' }, to: { city: 'Frankfurt', asn: 16509 } },
    },
  },
  {
    name: 'two operators in one country: a key on Comcast in Ashburn, then on a cloud in Seattle a minute later, is high',
    kind: 'positive',
    window: keyWindow([
      ...spread(58, T0 - 60 * MINUTE, 58 * MINUTE, viaOperator('ashburn', 7922, 'Comcast Cable Communications, LLC')),
      { at: T0 - MINUTE, ...viaOperator('seattle', 14061, 'DigitalOcean, LLC') },
    ]),
    now: T0,
    expect: { findings: 1, severity: 'high', evidence: { sameOperator: false, from: { asn: 7922 }, to: { asn: 14061, asOrganization: 'DigitalOcean, LLC' } } },
  },
  {
    name: 'a short hop, us-east to New York in one minute, is under minDistanceKm',
    kind: 'negative',
    window: keyWindow([...HOME, { at: T0 - 2 * MINUTE, ...at('newYork') }]),
    now: T0,
    expect: { findings: 0 },
  },
  {
    name: 'a plausible flight: London, then Frankfurt 58 minutes later (about 620 km/h)',
    kind: 'negative',
    window: keyWindow([{ at: T0 - 59 * MINUTE, ...at('london') }, { at: T0 - 1 * MINUTE, ...at('frankfurt') }]),
    now: T0,
    expect: { findings: 0 },
  },
  {
    name: 'large GeoIP accuracy radii swallow the distance: London and Amsterdam, 200 km each',
    kind: 'negative',
    window: keyWindow([
      { at: T0 - 3 * MINUTE, ...at('london'), geo: { latitude: 51.5072, longitude: -0.1276, accuracyKm: 200, country: 'GB' } },
      { at: T0 - 2 * MINUTE, ...at('amsterdam'), geo: { latitude: 52.3676, longitude: 4.9041, accuracyKm: 200, country: 'NL' } },
    ]),
    now: T0,
    expect: { findings: 0 },
  },
  {
    name: 'events without geo (private or unknown addresses) are skipped',
    kind: 'negative',
    window: keyWindow([...HOME, { at: T0 - 3 * MINUTE, ip: '10.0.0.7', country: undefined, geo: undefined }, { at: T0 - 2 * MINUTE, ...at('ashburn') }]),
    now: T0,
    expect: { findings: 0 },
  },
  {
    name: 'a hop older than recentMinutes was reported by an earlier evaluation and is not repeated',
    kind: 'negative',
    window: keyWindow([...spread(10, T0 - 50 * MINUTE, 10 * MINUTE, at('ashburn')), { at: T0 - 39 * MINUTE, ...at('moscow') }, ...spread(30, T0 - 35 * MINUTE, 35 * MINUTE, at('ashburn'))]),
    now: T0,
    expect: { findings: 0 },
  },
  {
    name: 'eu-west waking in the morning after a night of us-east only: the key used Dublin yesterday',
    kind: 'negative',
    window: keyWindow([...HOME, ...spread(7, T0 - 10 * MINUTE, 7 * MINUTE, at('ashburn')), ...spread(3, T0 - 3 * MINUTE, 3 * MINUTE, at('dublin'))], {
      history: spread(60, T0 - DAY - 60 * MINUTE, 60 * MINUTE, (i) => at(i % 2 === 0 ? 'ashburn' : 'dublin')),
    }),
    now: T0,
    expect: { findings: 0 },
  },
  {
    name: 'a key that used Dublin yesterday, now in Tokyo: a place it never used is still travel',
    kind: 'positive',
    window: keyWindow([...HOME, ...spread(7, T0 - 10 * MINUTE, 7 * MINUTE, at('ashburn')), { at: T0 - 2 * MINUTE, ...at('tokyo') }], {
      history: spread(60, T0 - DAY - 60 * MINUTE, 60 * MINUTE, (i) => at(i % 2 === 0 ? 'ashburn' : 'dublin')),
    }),
    now: T0,
    // Ashburn and Dublin (yesterday) were known before the hop.
    expect: { findings: 1, severity: 'high', evidence: { to: { city: 'Tokyo' }, knownLocations: 2 } },
  },
  {
    name: 'after an idle hour the attacker comes first: Moscow, then the key\'s own Ashburn, then Moscow again is travel',
    kind: 'positive',
    window: keyWindow(
      [
        { at: T0 - 9 * MINUTE, ...at('moscow') },
        { at: T0 - 7 * MINUTE, ...at('ashburn') },
        { at: T0 - 5 * MINUTE, ...at('moscow') },
        { at: T0 - 3 * MINUTE, ...at('ashburn') },
      ],
      { history: spread(60, T0 - DAY - 60 * MINUTE, 60 * MINUTE, at('ashburn')) },
    ),
    now: T0,
    // Moscow came first, from nowhere the key was established: the hop out of it into Ashburn, and
    // the hop back into it, are the attack (the first is the fastest, as fast as the second).
    expect: {
      findings: 1,
      severity: 'high',
      evidence: { from: { city: 'Moscow' }, to: { city: 'Ashburn' }, impossibleHops: 2, knownLocations: 1, newLocation: 'from' },
      ...OUT_OF_MOSCOW,
    },
  },
  {
    name: 'the attacker first after an idle hour, the key\'s own Ashburn back 10 minutes later, then Moscow again is travel',
    kind: 'positive',
    window: keyWindow(
      [
        ...spread(5, T0 - 25 * MINUTE, 5 * MINUTE, at('moscow')),
        ...spread(10, T0 - 15 * MINUTE, 10 * MINUTE, at('ashburn')),
        { at: T0 - 3 * MINUTE, ...at('ashburn') },
        { at: T0 - 2 * MINUTE, ...at('moscow') },
      ],
      { history: spread(60, T0 - DAY - 60 * MINUTE, 60 * MINUTE, at('ashburn')) },
    ),
    now: T0,
    // Moscow was seen before the recent part, but only before the key's own traffic resumed: still new.
    expect: { findings: 1, severity: 'high', evidence: { from: { city: 'Ashburn' }, to: { city: 'Moscow' }, impossibleHops: 1 } },
  },
  {
    name: 'after an idle night the key\'s second region answers first: Dublin, then Ashburn, both used yesterday, is not travel',
    kind: 'negative',
    window: keyWindow(spread(8, T0 - 9 * MINUTE, 8 * MINUTE, (i) => at(i % 2 === 0 ? 'dublin' : 'ashburn')), {
      history: spread(60, T0 - DAY - 60 * MINUTE, 60 * MINUTE, (i) => at(i % 2 === 0 ? 'ashburn' : 'dublin')),
    }),
    now: T0,
    expect: { findings: 0 },
  },
  // A thief's lone request while the key was idle makes his place part of the key's history, not
  // one of its places: a place is the key's own once it was used over half an hour, on two days, or
  // within half an hour of another of its places (a hop the rule judged then).
  {
    name: 'a thief whose one request at 06:00, while the key was idle, is in its history is still reported in the morning',
    kind: 'positive',
    window: keyWindow([...spread(20, T0 - 20 * MINUTE, 20 * MINUTE, at('ashburn')), { at: T0 - 30 * SECOND, ...at('moscow') }], {
      history: [...spread(8 * 60, T0 - DAY, 8 * 60 * MINUTE, at('ashburn')), { at: T0 - 6 * 60 * MINUTE, ...at('moscow') }],
    }),
    now: T0,
    expect: { findings: 1, severity: 'high', evidence: { from: { city: 'Ashburn' }, to: { city: 'Moscow' }, newLocation: 'to', knownLocations: 1 } },
  },
  {
    name: 'the thief first after an idle hour, the key\'s own Ashburn 5 minutes later: the hop out of his place is reported at once',
    kind: 'positive',
    window: keyWindow([{ at: T0 - 5 * MINUTE, ...at('moscow') }, { at: T0, ...at('ashburn') }], {
      history: spread(60, T0 - DAY, 60 * MINUTE, at('ashburn')),
    }),
    now: T0,
    expect: {
      findings: 1,
      severity: 'high',
      evidence: { from: { city: 'Moscow' }, to: { city: 'Ashburn' }, gapMinutes: 5, impossibleHops: 1, newLocation: 'from' },
      ...OUT_OF_MOSCOW,
    },
  },
  {
    name: 'the thief first after an idle hour, again 55 minutes later among the key\'s own requests: his first request does not make his place known',
    kind: 'positive',
    window: keyWindow(
      [{ at: T0 - 55 * MINUTE - 30 * SECOND, ...at('moscow') }, ...spread(50, T0 - 50 * MINUTE, 50 * MINUTE, at('ashburn')), { at: T0 - 30 * SECOND, ...at('moscow') }],
      { history: spread(60, T0 - DAY, 60 * MINUTE, at('ashburn')) },
    ),
    now: T0,
    expect: { findings: 1, severity: 'high', evidence: { from: { city: 'Ashburn' }, to: { city: 'Moscow' }, impossibleHops: 1, newLocation: 'to' } },
  },
  {
    name: 'the thief seen once last night, then first after an idle hour and again 55 minutes later: his place in the history is not the key\'s',
    kind: 'positive',
    window: keyWindow(
      [{ at: T0 - 55 * MINUTE - 30 * SECOND, ...at('moscow') }, ...spread(50, T0 - 50 * MINUTE, 50 * MINUTE, at('ashburn')), { at: T0 - 30 * SECOND, ...at('moscow') }],
      { history: [...spread(60, T0 - DAY, 60 * MINUTE, at('ashburn')), { at: T0 - 10 * 60 * MINUTE, ...at('moscow') }] },
    ),
    now: T0,
    expect: { findings: 1, severity: 'high', evidence: { from: { city: 'Ashburn' }, to: { city: 'Moscow' }, impossibleHops: 1, newLocation: 'to' } },
  },
  {
    name: 'a ten-minute daily job alternating between Ashburn and Dublin yesterday: today both are the key\'s own',
    kind: 'negative',
    window: keyWindow([...HOME, ...spread(60, T0 - 10 * MINUTE, 10 * MINUTE, (i) => at(i % 2 === 0 ? 'ashburn' : 'dublin'))], {
      history: spread(60, T0 - DAY - 10 * MINUTE, 10 * MINUTE, (i) => at(i % 2 === 0 ? 'ashburn' : 'dublin')),
    }),
    now: T0,
    expect: { findings: 0 },
  },
  // A place used only while the key's own were idle is not tied to them, however long it was used:
  // a thief's hours at night look the same. Its first hop with the key's own is judged, once.
  {
    name: 'a region that served alone for hours yesterday (Dublin, while Ashburn was idle) is reported at its first hop with Ashburn, as a thief would be',
    kind: 'positive',
    window: keyWindow([...HOME, ...spread(7, T0 - 10 * MINUTE, 7 * MINUTE, at('ashburn')), ...spread(3, T0 - 3 * MINUTE, 3 * MINUTE, at('dublin'))], {
      history: [...spread(120, T0 - DAY - 12 * 60 * MINUTE, 2 * 60 * MINUTE, at('ashburn')), ...spread(240, T0 - DAY - 6 * 60 * MINUTE, 4 * 60 * MINUTE, at('dublin'))],
    }),
    now: T0,
    expect: { findings: 1, severity: 'high', evidence: { from: { city: 'Ashburn' }, to: { city: 'Dublin' }, newLocation: 'to', keyEstablished: true } },
  },
  {
    name: 'a thief\'s two requests 31 minutes apart at night, then his requests among the key\'s own in the morning, are reported',
    kind: 'positive',
    window: keyWindow(
      [...HOME, ...spread(10, T0 - 10 * MINUTE, 10 * MINUTE, at('ashburn')), { at: T0 - 5 * MINUTE - 30 * SECOND, ...at('moscow') }, { at: T0 - 2 * MINUTE - 30 * SECOND, ...at('moscow') }],
      { history: [...spread(8 * 60, T0 - DAY, 8 * 60 * MINUTE, at('ashburn')), { at: T0 - 6 * 60 * MINUTE, ...at('moscow') }, { at: T0 - 6 * 60 * MINUTE + 31 * MINUTE, ...at('moscow') }] },
    ),
    now: T0,
    expect: { findings: 1, severity: 'high', evidence: { from: { city: 'Ashburn' }, to: { city: 'Moscow' }, newLocation: 'to', impossibleHops: 1 } },
  },
  {
    name: 'a region that served alone for hours yesterday but began within half an hour of Ashburn\'s last request is the key\'s own today',
    kind: 'negative',
    window: keyWindow([...HOME, ...spread(7, T0 - 10 * MINUTE, 7 * MINUTE, at('ashburn')), ...spread(3, T0 - 3 * MINUTE, 3 * MINUTE, at('dublin'))], {
      history: [...spread(120, T0 - DAY - 12 * 60 * MINUTE, 2 * 60 * MINUTE, at('ashburn')), ...spread(240, T0 - DAY - 10 * 60 * MINUTE + 20 * MINUTE, 4 * 60 * MINUTE, at('dublin'))],
    }),
    now: T0,
    expect: { findings: 0 },
  },
  {
    name: 'the key\'s own second region first after an idle night, then Ashburn: a hop out of a known place is not travel',
    kind: 'negative',
    window: keyWindow([{ at: T0 - 5 * MINUTE, ...at('dublin') }, { at: T0, ...at('ashburn') }], {
      history: [...spread(120, T0 - DAY - 12 * 60 * MINUTE, 2 * 60 * MINUTE, at('ashburn')), ...spread(240, T0 - DAY - 10 * 60 * MINUTE + 20 * MINUTE, 4 * 60 * MINUTE, at('dublin'))],
    }),
    now: T0,
    expect: { findings: 0 },
  },
  // A failover: the whole fleet left Ashburn for Dublin, Singapore and São Paulo an hour ago (that
  // hop was judged, and reported, then). When the window's start passes Ashburn's last request, the
  // places the fleet moved to were established by that hop a few seconds after it: they are the
  // key's own, not new places to report again (nor to reopen a resolved alert with).
  {
    name: 'a fleet that moved from Ashburn to three regions an hour ago is not reported again when Ashburn leaves the window',
    kind: 'negative',
    window: keyWindow(MOVED, { history: [...ESTABLISHED_IN_ASHBURN, ...spread(180, T0 - 2 * 60 * MINUTE, 60 * MINUTE - SECOND, at('ashburn')), ...MOVED] }),
    now: T0,
    expect: { findings: 0 },
  },
];
