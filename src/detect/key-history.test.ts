import { describe, expect, it } from 'vitest';
import { ESTABLISHED_MS, HISTORY_MS, KeyHistory, MAX_SIGHTINGS } from './key-history.ts';
import type { GeoPoint } from './types.ts';

const T0 = Date.UTC(2026, 10, 20, 12, 0, 0);
const HOUR = 3_600_000;
const dublin: GeoPoint = { latitude: 53.35, longitude: -6.26, accuracyKm: 20, country: 'IE' };
const tokyo: GeoPoint = { latitude: 35.68, longitude: 139.65, accuracyKm: 20, country: 'JP' };

describe('KeyHistory', () => {
  it('knows a network from the first time it was seen (vouched for, from the whole minute after), whatever order the sightings came in', () => {
    const history = new KeyHistory();
    history.saw('203.0.113.0/24', dublin, T0);
    history.saw('198.51.100.0/24', undefined, T0 + 1000); // tied to the key's first network: from T0 + 1 min
    history.recalled('203.0.113.0/24', dublin, T0 - HOUR, T0 - HOUR, T0 - HOUR); // an older sighting, recorded, warmed later
    expect(history.knowsNetwork('203.0.113.0/24', T0 - HOUR + 1)).toBe(true);
    expect(history.knowsNetwork('203.0.113.0/24', T0 - HOUR)).toBe(false);
    expect(history.knowsNetwork('198.51.100.0/24', T0 + 60_000)).toBe(false);
    expect(history.knowsNetwork('198.51.100.0/24', T0 + 60_001)).toBe(true);
    expect(history.knowsNetwork('192.0.2.0/24', Infinity)).toBe(false);
    expect(history.newest).toBe(T0 + 1000);
    expect(history.firstSeen).toBe(T0 - HOUR);
    expect(new KeyHistory().firstSeen).toBe(Infinity);
  });

  it('knows the places seen (and vouched for) before a time, each once, and skips events without a usable point', () => {
    const history = new KeyHistory();
    history.saw('203.0.113.0/24', dublin, T0);
    history.saw('203.0.113.0/24', { ...dublin }, T0 + 1000); // the same point, another object
    history.saw('192.0.2.0/24', tokyo, T0 + 2000); // within half an hour of Dublin: vouched for by it
    history.saw('192.0.3.0/24', { latitude: NaN, longitude: NaN, accuracyKm: 50 }, T0);
    expect(history.placesBefore(T0)).toEqual([]);
    expect(history.placesBefore(T0 + 1)).toEqual([dublin]);
    expect(history.placesBefore(T0 + 60_000)).toEqual([dublin]); // vouched for from the whole minute after the hop
    expect(history.placesBefore(T0 + 60_001)).toEqual([dublin, tokyo]);
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

  it('keeps when the key was first seen through its networks\' churn, and starts it again after HISTORY_MS idle', () => {
    const history = new KeyHistory();
    // Two days ago from one network; then hundreds of others (a serverless fleet's egress, or an attacker's /64s), each once.
    history.saw('home', dublin, T0 - 48 * HOUR);
    for (let n = 0; n < MAX_SIGHTINGS * 3; n++) history.saw(`net${n}`, undefined, T0 + n);
    expect(history.knowsNetwork('home', Infinity)).toBe(false);
    expect(history.firstSeen).toBe(T0 - 48 * HOUR);
    // An event from before, arriving late, moves it back.
    history.saw('home', dublin, T0 - 50 * HOUR);
    expect(history.firstSeen).toBe(T0 - 50 * HOUR);
    // Idle for longer than the history keeps: the key starts again at its next request.
    const back = T0 + MAX_SIGHTINGS * 3 + HISTORY_MS + 1;
    history.saw('home', dublin, back);
    expect(history.firstSeen).toBe(back);
    // And forgotten whole, it remembers no first time.
    history.expire(back + HISTORY_MS + HOUR);
    expect(history.firstSeen).toBe(Infinity);
  });

  it('forgets what was last seen more than HISTORY_MS ago, looking at most once an hour', () => {
    const history = new KeyHistory();
    history.recalled('old', dublin, T0, T0);
    history.recalled('recent', tokyo, T0 + 2 * HOUR, T0 + 2 * HOUR, T0 + 2 * HOUR);
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
    history.recalled('old', dublin, T0 + HISTORY_MS + HOUR, T0 + HISTORY_MS + HOUR, T0 + HISTORY_MS + HOUR);
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
    expect(history.knowsNetwork('m', T0)).toBe(false);
    expect(history.placesBefore(T0)).toEqual([ashburn]);
    expect(history.establishedPlacesBefore(T0)).toEqual([ashburn]);
    // Back in the morning, half a minute after the owner: established from then on (that hop was judged).
    history.saw('a', ashburn, T0);
    history.saw('m', moscow, T0 + 30_000);
    expect(history.establishedPlacesBefore(T0 + 60_000)).toEqual([ashburn]);
    expect(history.establishedPlacesBefore(T0 + 60_001)).toEqual([ashburn, moscow]); // the whole minute after the hop
    expect(history.knowsNetwork('m', T0 + 60_001)).toBe(true);
  });

  it('does not take a place used only while the key was idle as the key\'s own, however long it was used, until a hop ties it to one', () => {
    const history = new KeyHistory();
    for (let m = 0; m < 8 * 60; m++) history.saw('a', ashburn, T0 - 24 * HOUR + m * MINUTE);
    // Two requests of a thief 31 minutes apart at night, then four hours of his traffic.
    history.saw('m', moscow, T0 - 8 * HOUR);
    history.saw('m', moscow, T0 - 8 * HOUR + 31 * MINUTE);
    for (let m = 0; m < 4 * 60; m++) history.saw('m2', moscow, T0 - 6 * HOUR + m * MINUTE);
    expect(history.establishedPlacesBefore(T0)).toEqual([ashburn]);
    expect(history.placesBefore(T0)).toEqual([ashburn]);
    expect(history.knowsNetwork('m', T0)).toBe(false);
    // The key's own traffic resumes over an hour after his last request: no hop, still not its own.
    history.saw('a', ashburn, T0);
    expect(history.establishedPlacesBefore(T0 + HOUR)).toEqual([ashburn]);
    // Within half an hour of the key's own request: that hop ties it (and was judged).
    history.saw('m', moscow, T0 + 20 * MINUTE);
    expect(history.establishedPlacesBefore(T0 + 20 * MINUTE)).toEqual([ashburn]);
    expect(history.establishedPlacesBefore(T0 + 20 * MINUTE + 1)).toEqual([ashburn, moscow]);
  });

  it('takes a hop between two places not vouched for as tying neither, and a hop from a place vouched for as tying the next', () => {
    const dublinPoint: GeoPoint = { ...dublin };
    const history = new KeyHistory();
    for (let m = 0; m <= 40; m++) history.saw('a', ashburn, T0 - 24 * HOUR + m * MINUTE);
    // Hours later, two exits of one thief alternating for an hour: both established, neither the key's.
    for (let i = 0; i < 60; i++) history.saw(i % 2 ? 'm' : 'd', i % 2 ? moscow : dublinPoint, T0 + i * MINUTE);
    expect(history.establishedPlacesBefore(T0 + 2 * HOUR)).toEqual([ashburn]);
    // The key's own Ashburn, then Dublin 10 minutes later (ties Dublin), then Moscow (tied by Dublin).
    history.saw('a', ashburn, T0 + 2 * HOUR);
    history.saw('d', dublinPoint, T0 + 2 * HOUR + 10 * MINUTE);
    history.saw('m', moscow, T0 + 2 * HOUR + 20 * MINUTE);
    expect(history.establishedPlacesBefore(T0 + 3 * HOUR)).toEqual([ashburn, dublinPoint, moscow]);
  });

  it('takes the first place of a key as its own, and the earliest left once that one is forgotten', () => {
    const history = new KeyHistory();
    history.saw('m', moscow, T0);
    history.saw('m', moscow, T0 + 40 * MINUTE);
    expect(history.establishedPlacesBefore(T0 + 41 * MINUTE)).toEqual([moscow]);
    for (let m = 0; m <= 40; m++) history.saw('a', ashburn, T0 + 3 * HOUR + m * MINUTE);
    expect(history.establishedPlacesBefore(T0 + 4 * HOUR)).toEqual([moscow]);
    // Moscow forgotten (last seen over HISTORY_MS ago): Ashburn is now the earliest place remembered.
    history.expire(T0 + 40 * MINUTE + HISTORY_MS + 1);
    expect(history.establishedPlacesBefore(T0 + 4 * HOUR)).toEqual([ashburn]);
  });

  it('takes what is recalled from storage as vouched for when recorded so, and the first recalled as the key\'s first, without tying what is recalled', () => {
    const history = new KeyHistory();
    // In order of first: Ashburn over five days, a thief's Moscow primed two days ago (no record),
    // a network without a point recorded, Dublin recorded, one without a point next to Dublin (no record).
    history.recalled('a', ashburn, T0 - 5 * 24 * HOUR, T0);
    history.recalled('m', moscow, T0 - 2 * 24 * HOUR, T0 - 2 * 24 * HOUR + 40 * MINUTE);
    history.recalled('p', undefined, T0 - 2 * HOUR, T0 - HOUR, T0 - HOUR);
    history.recalled('d', dublin, T0 - 2 * HOUR, T0 - HOUR, T0 - 2 * HOUR);
    history.recalled('q', undefined, T0 - 2 * HOUR, T0 - 2 * HOUR);
    expect(history.establishedPlacesBefore(T0 + 1)).toEqual([ashburn, dublin]);
    expect(history.knowsNetwork('m', T0)).toBe(false);
    expect(history.knowsNetwork('d', T0)).toBe(true);
    expect(history.knowsNetwork('p', T0)).toBe(true);
    expect(history.knowsNetwork('q', T0)).toBe(false);
    expect(history.takeVouched()).toBeUndefined(); // recalled: recorded already
    // The key's own Ashburn again: recorded (once a day it is used), and a hop from it ties Moscow.
    history.saw('a', ashburn, T0 + HOUR);
    history.saw('m', moscow, T0 + HOUR + MINUTE);
    history.saw('a', ashburn, T0 + HOUR + 2 * MINUTE);
    history.saw('m', moscow, T0 + HOUR + 3 * MINUTE);
    expect(history.takeVouched()).toEqual([
      { network: 'a', at: T0 + HOUR },
      { network: 'm', at: T0 + HOUR + MINUTE },
    ]);
    expect(history.knowsNetwork('m', T0 + HOUR + MINUTE + 1)).toBe(true);
  });

  it('vouches for a network without a usable point (no GeoIP) by its runs, as for places', () => {
    const history = new KeyHistory();
    for (let m = 0; m <= 40; m++) history.saw('own', undefined, T0 + m * MINUTE); // the key's first network
    history.saw('fresh', undefined, T0 + 50 * MINUTE); // within half an hour of it
    history.saw('night', undefined, T0 + 5 * HOUR); // hours after any other
    history.saw('night', undefined, T0 + 5 * HOUR + 31 * MINUTE);
    history.saw('night2', undefined, T0 + 5 * HOUR + 32 * MINUTE); // tied only to one not vouched for
    expect(history.knowsNetwork('own', T0 + 1)).toBe(true);
    expect(history.knowsNetwork('fresh', T0 + 50 * MINUTE + 1)).toBe(true);
    expect(history.knowsNetwork('night', T0 + 6 * HOUR)).toBe(false);
    expect(history.knowsNetwork('night2', T0 + 6 * HOUR)).toBe(false);
    history.saw('own', undefined, T0 + 6 * HOUR);
    history.saw('night', undefined, T0 + 6 * HOUR + MINUTE);
    expect(history.knowsNetwork('night', T0 + 6 * HOUR + MINUTE + 1)).toBe(true);
  });

  it('does not let a network without a point vouch for a place, nor a place not vouched for vouch for such a network', () => {
    const history = new KeyHistory();
    history.saw('a', ashburn, T0);
    history.saw('lan', undefined, T0 + MINUTE); // tied by Ashburn
    history.saw('m', moscow, T0 + 5 * HOUR); // the thief, hours later
    history.saw('lan', undefined, T0 + 5 * HOUR + MINUTE);
    history.saw('lan2', undefined, T0 + 5 * HOUR + 2 * MINUTE);
    history.saw('m', moscow, T0 + 5 * HOUR + 3 * MINUTE);
    history.saw('lan3', undefined, T0 + 5 * HOUR + 4 * MINUTE);
    expect(history.knowsNetwork('lan', T0 + MINUTE + 1)).toBe(true);
    expect(history.knowsNetwork('lan2', T0 + 6 * HOUR)).toBe(true); // after 'lan', vouched for
    expect(history.placesBefore(T0 + 6 * HOUR)).toEqual([ashburn]);
    expect(history.knowsNetwork('m', T0 + 6 * HOUR)).toBe(false);
    expect(history.knowsNetwork('lan3', T0 + 6 * HOUR)).toBe(false); // after Moscow only
  });

  it('takes places seen within half an hour of each other as established: a short job alternating between regions', () => {
    const history = new KeyHistory();
    for (let i = 0; i < 60; i++) history.saw(i % 2 ? 'd' : 'a', i % 2 ? moscow : ashburn, T0 + i * 10_000);
    expect(history.establishedPlacesBefore(T0 + 60_001)).toEqual([ashburn, moscow]);
    expect(history.establishedPlacesBefore(T0 + 60_000)).toEqual([ashburn]); // Moscow vouched for from the whole minute after the hop
    expect(history.establishedPlacesBefore(T0 + 10_000)).toEqual([]);
  });

  it('takes the overlapping short sightings warmed from storage as established, in any order, and a lone one among days of another not', () => {
    const warmed = new KeyHistory();
    warmed.recalled('d', moscow, T0 + 600_000, T0, T0);
    warmed.recalled('a', ashburn, T0, T0 + 600_000, T0);
    expect(warmed.establishedPlacesBefore(T0 + 600_001)).toEqual([moscow, ashburn]);
    // Ashburn over five days (one sighting: the first and the last), Moscow once in between.
    const lone = new KeyHistory();
    lone.recalled('a', ashburn, T0 - 5 * 24 * HOUR, T0);
    lone.recalled('m', moscow, T0 - 2 * 24 * HOUR, T0 - 2 * 24 * HOUR);
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
