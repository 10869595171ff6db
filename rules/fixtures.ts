/**
 * Fixture support for rules/<id>.fixtures.ts: the fixture shape the harness (rules/rules.test.ts)
 * runs, and a builder that makes WindowEvents concisely: everything not given is ordinary API traffic
 * (python-requests from one us-east address, 201 on POST /v1/verify/sessions, limit 60/min), the
 * network is derived from the IP as the engine derives it, event ids are numbered in time order.
 * Timestamps are absolute and carry the year.
 */
import { KeyHistory } from '../src/detect/key-history.ts';
import { DroppedRequestTally } from '../src/detect/tallies.ts';
import type { GeoPoint, KeyWindow, Severity, WindowEvent } from '../src/detect/types.ts';
import type { Plan } from '../src/events/request-event.ts';
import { networkOf } from './network.ts';

export type ParamValue = number | string | boolean | readonly string[];

export interface RuleFixture<P extends Record<string, ParamValue> = Record<string, ParamValue>> {
  name: string;
  kind: 'positive' | 'negative';
  window: KeyWindow;
  now: number;
  /** Overrides on top of the rule's defaults. */
  params?: Partial<P>;
  expect: {
    findings: number;
    severity?: Severity;
    /** Checked as a subset (toMatchObject) of the first finding's evidence. */
    evidence?: Record<string, unknown>;
    /** Matched against the first finding's title and summary. */
    title?: RegExp;
    summary?: RegExp;
  };
}

export const SECOND = 1000;
export const MINUTE = 60 * SECOND;
/** Friday 20 November 2026, 12:00:00 UTC: the reference instant of every fixture. */
export const T0 = Date.UTC(2026, 10, 20, 12, 0, 0);

/** Places with the addresses a fixture uses for them (documentation and benchmark ranges). */
export const PLACES = {
  ashburn: place('198.51.100.10', 'US', 'Ashburn', 39.0438, -77.4874, 20),
  newYork: place('198.51.101.10', 'US', 'New York', 40.7128, -74.006, 20),
  montreal: place('198.51.102.10', 'CA', 'Montreal', 45.5019, -73.5674, 20),
  dublin: place('203.0.113.10', 'IE', 'Dublin', 53.3498, -6.2603, 20),
  london: place('203.0.114.10', 'GB', 'London', 51.5072, -0.1276, 20),
  frankfurt: place('203.0.115.10', 'DE', 'Frankfurt', 50.1109, 8.6821, 20),
  madrid: place('203.0.116.10', 'ES', 'Madrid', 40.4168, -3.7038, 20),
  amsterdam: place('203.0.117.10', 'NL', 'Amsterdam', 52.3676, 4.9041, 20),
  moscow: place('192.0.2.10', 'RU', 'Moscow', 55.7558, 37.6173, 50),
  saoPaulo: place('192.0.3.10', 'BR', 'São Paulo', -23.5558, -46.6396, 50),
  singapore: place('192.0.4.10', 'SG', 'Singapore', 1.3521, 103.8198, 20),
  tokyo: place('192.0.5.10', 'JP', 'Tokyo', 35.6762, 139.6503, 20),
  sydney: place('192.0.6.10', 'AU', 'Sydney', -33.8688, 151.2093, 20),
  mumbai: place('192.0.7.10', 'IN', 'Mumbai', 19.076, 72.8777, 50),
  johannesburg: place('192.0.8.10', 'ZA', 'Johannesburg', -26.2041, 28.0473, 50),
  mexicoCity: place('192.0.9.10', 'MX', 'Mexico City', 19.4326, -99.1332, 50),
  seattle: place('198.51.103.10', 'US', 'Seattle', 47.6062, -122.3321, 20),
} as const;

export type PlaceName = keyof typeof PLACES;

function place(ip: string, country: string, city: string, latitude: number, longitude: number, accuracyKm: number) {
  return { ip, country, geo: { latitude, longitude, accuracyKm, country, city } satisfies GeoPoint };
}

/** An event as a fixture writes it: when, and whatever differs from ordinary traffic. */
export type EventSpec = Partial<Omit<WindowEvent, 'timestamp'>> & { at: number };

/** The fields of an event at a place: its IP, country and geo. */
export function at(name: PlaceName, ip?: string): Pick<WindowEvent, 'ip' | 'country' | 'geo'> {
  const p = PLACES[name];
  return { ip: ip ?? p.ip, country: p.country, geo: { ...p.geo } };
}

/** `count` events evenly spread over [from, from + spanMs); fields may depend on the index. */
export function spread(
  count: number,
  from: number,
  spanMs: number,
  fields: Partial<Omit<WindowEvent, 'timestamp'>> | ((i: number) => Partial<Omit<WindowEvent, 'timestamp'>>) = {},
): EventSpec[] {
  return Array.from({ length: count }, (_, i) => ({
    at: from + Math.floor((i * spanMs) / count),
    ...(typeof fields === 'function' ? fields(i) : fields),
  }));
}

/** One block of events per minute starting at `fromMinute`: counts[k] events in minute k. */
export function perMinute(counts: readonly number[], fromMinute: number, fields: Partial<Omit<WindowEvent, 'timestamp'>> = {}): EventSpec[] {
  return counts.flatMap((count, k) => spread(count, fromMinute + k * MINUTE, MINUTE, fields));
}

const ORDINARY: Omit<WindowEvent, 'eventId' | 'timestamp' | 'network'> = {
  ip: PLACES.ashburn.ip,
  userAgent: 'python-requests/2.32.3',
  method: 'POST',
  path: '/v1/verify/sessions',
  status: 201,
  responseTimeMs: 140,
  rateLimitPerMinute: 60,
  country: 'US',
  geo: PLACES.ashburn.geo,
};

/**
 * A key's window: the specs in time order, completed with ordinary values, ids numbered evt_0001….
 * `history`: requests the engine remembers from before the window (KeyWindow.history), completed
 * the same way. `cap`: the window holds the newest `cap` events only, as the engine's per-key cap
 * leaves it (KeyWindow.cappedAt, KeyWindow.dropped).
 */
export function keyWindow(
  specs: readonly EventSpec[],
  key: { merchantId?: string; apiKeyId?: string; plan?: Plan; history?: readonly EventSpec[]; cap?: number } = {},
): KeyWindow {
  let events = windowEvents(specs);
  const capped: Pick<KeyWindow, 'cappedAt' | 'dropped'> = {};
  if (key.cap !== undefined && events.length > key.cap) {
    const dropped = new DroppedRequestTally();
    const cut = events.slice(0, events.length - key.cap);
    for (const event of cut) dropped.add(event);
    events = events.slice(cut.length);
    Object.assign(capped, { cappedAt: cut.at(-1)!.timestamp, dropped });
  }
  const window: KeyWindow = { merchantId: key.merchantId ?? 'm_acme', apiKeyId: key.apiKeyId ?? 'pk_live_abc', plan: key.plan ?? 'business', events, ...capped };
  if (key.history) {
    const history = new KeyHistory();
    for (const event of windowEvents(key.history)) history.saw(event.network, event.geo, event.timestamp);
    history.endRun(); // settled before the harness freezes it: a rule's reads then change nothing
    window.history = history;
  }
  return window;
}

function windowEvents(specs: readonly EventSpec[]): WindowEvent[] {
  const sorted = [...specs].sort((a, b) => a.at - b.at);
  return sorted.map(({ at: timestamp, ...fields }, i): WindowEvent => {
    const event: WindowEvent = { ...ORDINARY, eventId: `evt_${String(i + 1).padStart(4, '0')}`, timestamp, network: '', ...fields };
    if (event.geo) event.geo = { ...event.geo };
    if (!fields.network) event.network = networkOf(event.ip);
    // An explicit `geo: undefined` means "no geo" (a private or unknown address).
    if ('geo' in fields && fields.geo === undefined) delete event.geo;
    if ('country' in fields && fields.country === undefined) delete event.country;
    return event;
  });
}
