import { describe, expect, it } from 'vitest';
import { ESTABLISHED_MS, HISTORY_MS, KeyHistory, MAX_SIGHTINGS } from './key-history.ts';
import type { GeoPoint } from './types.ts';

const T0 = Date.UTC(2026, 10, 20, 12, 0, 0);
const HOUR = 3_600_000;
const dublin: GeoPoint = { latitude: 53.35, longitude: -6.26, accuracyKm: 20, country: 'IE' };
const tokyo: GeoPoint = { latitude: 35.68, longitude: 139.65, accuracyKm: 20, country: 'JP' };

describe('KeyHistory', () => {
  it('knows a network from the first time it was seen, whatever order the sightings came in', () => {
    const history = new KeyHistory();
    history.saw('203.0.113.0/24', dublin, T0);
    history.saw('198.51.100.0/24', undefined, T0 + 1000);
    history.saw('203.0.113.0/24', dublin, T0 - HOUR); // an older sighting, warmed from storage later
    expect(history.knowsNetwork('203.0.113.0/24', T0 - HOUR + 1)).toBe(true);
    expect(history.knowsNetwork('203.0.113.0/24', T0 - HOUR)).toBe(false);
    expect(history.knowsNetwork('198.51.100.0/24', T0 + 1000)).toBe(false);
    expect(history.knowsNetwork('198.51.100.0/24', T0 + 1001)).toBe(true);
    expect(history.knowsNetwork('192.0.2.0/24', Infinity)).toBe(false);
    expect(history.newest).toBe(T0 + 1000);
  });

  it('knows the places seen before a time, each once, and skips events without a usable point', () => {
    const history = new KeyHistory();
    history.saw('203.0.113.0/24', dublin, T0);
    history.saw('203.0.113.0/24', { ...dublin }, T0 + 1000); // the same point, another object
    history.saw('192.0.2.0/24', tokyo, T0 + HOUR);
    history.saw('192.0.3.0/24', { latitude: NaN, longitude: NaN, accuracyKm: 50 }, T0);
    expect(history.placesBefore(T0 + 1)).toEqual([dublin]);
    expect(history.placesBefore(T0 + HOUR + 1)).toEqual([dublin, tokyo]);
    expect(history.size).toBe(3 + 2);
  });

  it('keeps the networks seen most recently when a key is seen from more than it remembers', () => {
    const history = new KeyHistory();
    const count = MAX_SIGHTINGS * 3;
    for (let n = 0; n < count; n++) history.saw(`net${n}`, undefined, T0 + n);
    // Whenever it trims, it keeps the latest MAX_SIGHTINGS, letting a quarter more in before the next trim.
    expect(history.size).toBeLessThanOrEqual(MAX_SIGHTINGS * 1.25);
    expect(history.knowsNetwork(`net${count - 1}`, Infinity)).toBe(true);
    expect(history.knowsNetwork(`net${count - MAX_SIGHTINGS}`, Infinity)).toBe(true);
    expect(history.knowsNetwork('net0', Infinity)).toBe(false);
    expect(history.knowsNetwork(`net${count - MAX_SIGHTINGS * 1.25 - 1}`, Infinity)).toBe(false);
  });

  it('forgets what was last seen more than HISTORY_MS ago, looking at most once an hour', () => {
    const history = new KeyHistory();
    history.saw('recent', tokyo, T0 + 2 * HOUR);
    history.saw('old', dublin, T0);
    history.expire(T0 + HISTORY_MS - 1);
    expect(history.knowsNetwork('old', Infinity)).toBe(true);
    // Within the hour after a look, nothing is looked at again.
    history.expire(T0 + HISTORY_MS + 1);
    expect(history.knowsNetwork('old', Infinity)).toBe(true);
    history.expire(T0 + HISTORY_MS + HOUR);
    expect(history.knowsNetwork('old', Infinity)).toBe(false);
    expect(history.placesBefore(Infinity)).toEqual([tokyo]);
    expect(history.knowsNetwork('recent', Infinity)).toBe(true);
    // A network forgotten, then seen again (the last one seen before), is remembered from then on.
    history.saw('old', dublin, T0 + HISTORY_MS + HOUR);
    expect(history.knowsNetwork('old', T0 + HISTORY_MS + HOUR)).toBe(false);
    expect(history.knowsNetwork('old', T0 + HISTORY_MS + HOUR + 1)).toBe(true);
    expect(history.placesBefore(Infinity)).toEqual([tokyo, dublin]);
  });
});

describe('KeyHistory established places', () => {
  const MINUTE = 60_000;
  const ashburn: GeoPoint = { latitude: 39.04, longitude: -77.49, accuracyKm: 20, country: 'US' };
  const moscow: GeoPoint = { latitude: 55.76, longitude: 37.62, accuracyKm: 50, country: 'RU' };

  it('takes a place as established once seen there half an hour after its first sighting, not before', () => {
    const history = new KeyHistory();
    for (let m = 0; m <= 40; m++) history.saw('a', ashburn, T0 + m * MINUTE);
    expect(history.establishedPlacesBefore(T0 + ESTABLISHED_MS)).toEqual([]);
    expect(history.establishedPlacesBefore(T0 + ESTABLISHED_MS + 1)).toEqual([ashburn]);
    history.endRun();
    expect(history.establishedPlacesBefore(T0 + ESTABLISHED_MS + 1)).toEqual([ashburn]);
  });

  it('does not take a lone request hours away from the key\'s other places as established, until it comes back', () => {
    const history = new KeyHistory();
    for (let m = 0; m < 8 * 60; m++) history.saw('a', ashburn, T0 - 24 * HOUR + m * MINUTE);
    history.saw('m', moscow, T0 - 6 * HOUR); // at night, the key idle
    expect(history.placesBefore(T0)).toEqual([ashburn, moscow]);
    expect(history.establishedPlacesBefore(T0)).toEqual([ashburn]);
    // Back in the morning, half a minute after the owner: established from then on (that hop was judged).
    history.saw('a', ashburn, T0);
    history.saw('m', moscow, T0 + 30_000);
    expect(history.establishedPlacesBefore(T0 + 30_000)).toEqual([ashburn]);
    expect(history.establishedPlacesBefore(T0 + 30_001)).toEqual([ashburn, moscow]);
  });

  it('takes places seen within half an hour of each other as established: a short job alternating between regions', () => {
    const history = new KeyHistory();
    for (let i = 0; i < 60; i++) history.saw(i % 2 ? 'd' : 'a', i % 2 ? moscow : ashburn, T0 + i * 10_000);
    expect(history.establishedPlacesBefore(T0 + 10_001)).toEqual([ashburn, moscow]);
    expect(history.establishedPlacesBefore(T0 + 10_000)).toEqual([]);
  });

  it('takes the overlapping short sightings warmed from storage as established, in any order, and a lone one among days of another not', () => {
    const warmed = new KeyHistory();
    warmed.saw('d', moscow, T0 + 600_000);
    warmed.saw('d', moscow, T0);
    warmed.saw('a', ashburn, T0);
    warmed.saw('a', ashburn, T0 + 600_000);
    expect(warmed.establishedPlacesBefore(T0 + 600_001)).toEqual([moscow, ashburn]);
    // Ashburn over five days (one sighting: the first and the last), Moscow once in between.
    const lone = new KeyHistory();
    lone.saw('a', ashburn, T0 - 5 * 24 * HOUR);
    lone.saw('a', ashburn, T0);
    lone.saw('m', moscow, T0 - 2 * 24 * HOUR);
    lone.saw('m', moscow, T0 - 2 * 24 * HOUR);
    expect(lone.establishedPlacesBefore(T0 + 1)).toEqual([ashburn]);
  });
});

describe('KeyHistory entry count', () => {
  it('keeps the count it shares right as entries are added, capped and expired, and leaves it when released', () => {
    const count = { entries: 0 };
    const capped = new KeyHistory(count);
    const placed = new KeyHistory(count);
    for (let n = 0; n < MAX_SIGHTINGS * 2; n++) capped.saw(`net${n}`, undefined, T0 + n);
    placed.saw('203.0.113.0/24', dublin, T0);
    placed.saw('192.0.2.0/24', tokyo, T0 + 2 * HOUR);
    expect(capped.size).toBeLessThanOrEqual(MAX_SIGHTINGS * 1.25);
    expect(count.entries).toBe(capped.size + 4);
    placed.expire(T0 + HISTORY_MS + HOUR);
    expect(count.entries).toBe(capped.size + 2);
    capped.release();
    expect(count.entries).toBe(2);
    capped.saw('later', undefined, T0 + HISTORY_MS);
    expect(count.entries).toBe(2);
  });

  it('counts a network and a place as soon as a run of events from them begins, so reads change nothing', () => {
    const count = { entries: 0 };
    const history = new KeyHistory(count);
    history.saw('203.0.113.0/24', dublin, T0);
    expect(count.entries).toBe(2);
    history.saw('203.0.113.0/24', dublin, T0 + 1000);
    expect(count.entries).toBe(2);
    expect(history.knowsNetwork('203.0.113.0/24', T0 + 1)).toBe(true);
    expect(count.entries).toBe(2);
    history.saw('192.0.2.0/24', dublin, T0 + 2000);
    expect(count.entries).toBe(3);
    expect(history.size).toBe(3);
  });
});
