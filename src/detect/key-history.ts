/**
 * What the engine remembers of a key beyond its window: the networks it was seen from and the
 * places it was seen at over the last days (HISTORY_MS), each with the first and the last time.
 * A window holds an hour; this is what tells a key's own networks and sites, used on and off (a
 * daily job from five regions, a region that serves only in European hours), from new ones.
 * Rules read it through KeyWindow.history (KeyHistoryView in types.ts). It outlives the key's
 * window (the engine keeps it while the key is idle) and is warmed from storage after a restart.
 */
import type { GeoPoint, KeyHistoryView } from './types.ts';

/** How long a network or place is remembered after the key was last seen there. */
export const HISTORY_MS = 7 * 24 * 60 * 60_000;

/**
 * Most networks (and, apart, most places) remembered per key. A key seen from more (an SDK used by
 * end users) keeps the ones seen most recently; such a key has a high baseline in its window anyway.
 */
export const MAX_SIGHTINGS = 256;

/** Sightings last seen more than HISTORY_MS ago are looked for at most this often per key. */
const EXPIRE_EVERY_MS = 60 * 60_000;

/** What storage remembers of a key's network (a day's first and last request from it), for warming the memory. */
export interface NetworkSighting {
  merchantId: string;
  apiKeyId: string;
  /** One address of the network. */
  ip: string;
  first: number;
  last: number;
}

interface Sighting {
  first: number;
  last: number;
}

interface PlaceSighting extends Sighting {
  geo: GeoPoint;
}

export class KeyHistory implements KeyHistoryView {
  private readonly networks = new Map<string, Sighting>();
  private readonly places = new Map<string, PlaceSighting>();
  /** The last network and place seen, with their sightings: consecutive events usually share them. */
  private lastNetwork: string | undefined;
  private lastNetworkSighting: Sighting | undefined;
  private lastGeo: GeoPoint | undefined;
  private lastPlace: PlaceSighting | undefined;
  /** The latest time the key was seen anywhere. */
  newest = -Infinity;
  private expiredAt = -Infinity;

  saw(network: string, geo: GeoPoint | undefined, timestamp: number): void {
    if (timestamp > this.newest) this.newest = timestamp;
    if (network !== this.lastNetwork) {
      this.lastNetwork = network;
      this.lastNetworkSighting = this.networks.get(network);
      if (this.lastNetworkSighting === undefined) {
        this.networks.set(network, (this.lastNetworkSighting = { first: timestamp, last: timestamp }));
        if (this.networks.size > MAX_SIGHTINGS * 1.25) this.keepLatest(this.networks);
      }
    }
    widen(this.lastNetworkSighting!, timestamp);
    if (geo === undefined || Number.isNaN(geo.latitude) || Number.isNaN(geo.longitude)) return;
    if (geo !== this.lastGeo) {
      this.lastGeo = geo;
      const key = `${geo.latitude},${geo.longitude}`;
      this.lastPlace = this.places.get(key);
      if (this.lastPlace === undefined) {
        this.places.set(key, (this.lastPlace = { first: timestamp, last: timestamp, geo }));
        if (this.places.size > MAX_SIGHTINGS * 1.25) this.keepLatest(this.places);
      }
    }
    widen(this.lastPlace!, timestamp);
  }

  knowsNetwork(network: string, before: number): boolean {
    const sighting = this.networks.get(network);
    return sighting !== undefined && sighting.first < before;
  }

  placesBefore(before: number): GeoPoint[] {
    const geos: GeoPoint[] = [];
    for (const place of this.places.values()) if (place.first < before) geos.push(place.geo);
    return geos;
  }

  /** Forgets the networks and places last seen more than HISTORY_MS before `now` (looked for once an hour). */
  expire(now: number): void {
    if (now - this.expiredAt < EXPIRE_EVERY_MS) return;
    this.expiredAt = now;
    const cutoff = now - HISTORY_MS;
    for (const sightings of [this.networks, this.places]) {
      for (const [key, sighting] of sightings) if (sighting.last < cutoff) sightings.delete(key);
    }
    this.forgetLast();
  }

  get size(): number {
    return this.networks.size + this.places.size;
  }

  /** Keeps the MAX_SIGHTINGS seen most recently (a quarter more are let in before this runs again). */
  private keepLatest(sightings: Map<string, Sighting>): void {
    const lasts = [...sightings.values()].map((sighting) => sighting.last).sort((a, b) => b - a);
    const cutoff = lasts[MAX_SIGHTINGS - 1]!;
    let kept = 0;
    for (const [key, sighting] of sightings) {
      if (sighting.last >= cutoff && kept < MAX_SIGHTINGS) kept++;
      else sightings.delete(key);
    }
    this.forgetLast();
  }

  /** The cached last network and place may have been deleted: look them up again next time. */
  private forgetLast(): void {
    this.lastNetwork = undefined;
    this.lastGeo = undefined;
  }
}

function widen(sighting: Sighting, timestamp: number): void {
  if (timestamp < sighting.first) sighting.first = timestamp;
  if (timestamp > sighting.last) sighting.last = timestamp;
}
