/**
 * What the engine remembers of a key beyond its window: the networks it was seen from and the
 * places it was seen at over the last days (HISTORY_MS), each with the first and the last time,
 * and for a place when it was vouched for and when it became established (ESTABLISHED_MS).
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

/**
 * A place is established (the key's own, to impossible_travel) once the key was seen there again at
 * least this long after it was first seen there (over half an hour of use, or on two days), or was
 * seen there within this long of a sighting at another of its places: impossible_travel judged
 * that hop (it judges every hop of its window as it arrives), and reported it if it was impossible,
 * so the place is either near the other one or already in an alert. One request of a thief while
 * the key was idle at night is neither; a region that serves for hours, or a ten-minute daily job
 * alternating between its regions, is (and counts once it is also vouched for, below). Sightings
 * warmed from storage (a network's first and last request over the days) count alike: a network
 * seen on two days spans them, and the short sightings of one job's networks overlap.
 */
export const ESTABLISHED_MS = 30 * 60_000;

/*
 * Established is not enough: a place counts as the key's own (to the rules) only once it is also
 * vouched for, so that requests of a thief while the key is idle (two half an hour apart, or hours
 * of them) make nothing the key's. A place is vouched for (from the whole minute after) when it
 * was seen within ESTABLISHED_MS of a sighting at a place already vouched for (impossible_travel
 * judged that hop, and reported it if it was impossible), and the place the key was first seen at,
 * of those remembered, from then (a new key's first site: nothing tells a thief's from it). A hop
 * between two places not vouched for vouches for neither: two exits of one thief, near each other,
 * are not the key's. A network is the key's while its place is; one without a usable point (no
 * GeoIP) is vouched for alike, by a run of it within ESTABLISHED_MS of a network vouched for.
 * What is vouched for is recorded (takeVouched: a network of each place vouched for, once a day
 * it is used, which the engine hands to storage), so that it outlives a restart: a network recalled
 * from storage is vouched for when a record says it was, and the first place recalled (of the 7
 * days) is the key's first. Without the record, what a thief primed before a restart would be as
 * much the key's after it as the key's own sites.
 */

const MINUTE_MS = 60_000;
const DAY_MS = 24 * 60 * MINUTE_MS;
/** `vouchedMinute` of what is not vouched for: later than any time (and, like every minute since 1970, a small integer: no boxed double per entry). */
const NEVER = 2 ** 30 - 1;

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
  /** The earliest time it was recorded as vouched for (takeVouched), if it was. */
  vouched?: number;
}

/** A network of the key's vouched for at `at` (a place of it, or the network itself without one), to record. */
export interface Vouched {
  network: string;
  at: number;
}

/**
 * The entries (networks and places) of the histories that share it, kept up to date as each adds
 * and removes them: the engine weighs its histories against its memory budget by it, without
 * walking them.
 */
export interface HistoryEntryCount {
  entries: number;
}

interface Sighting {
  first: number;
  last: number;
  /**
   * The minute (since 1970, rounded up) from which it is vouched for: its first when it was the
   * key's first, or when a hop tied it to one vouched for, or recorded so; NEVER until then. Minutes
   * and days are small integers, which V8 keeps in the object itself: times in milliseconds would
   * each take a 16-byte box, on every network and place of every key.
   */
  vouchedMinute: number;
  /** The last day (since 1970) it was recorded as vouched for (takeVouched); -1 before. */
  recordedDay: number;
}

interface PlaceSighting extends Sighting {
  geo: GeoPoint;
  /** The earliest time seen at least ESTABLISHED_MS after `first` (as far as known: never earlier than it was); Infinity until then. */
  established: number;
}

interface NetworkEntry extends Sighting {
  /** The place of the network's latest run (undefined without a usable point): the network is the key's while that place is. */
  place: PlaceSighting | undefined;
}

export class KeyHistory implements KeyHistoryView {
  private readonly networks = new Map<string, NetworkEntry>();
  private readonly places = new Map<string, PlaceSighting>();
  /**
   * The current run: consecutive events from one network at one point (most of a key's events) only
   * move these times, kept in this object; its network's and place's sightings, entered when the run
   * began, take them when the run ends or is read. Every event of every key passes here, and each
   * other object touched would cost a cache miss. Entering them at once keeps what the history holds
   * (its count) the same whenever a run ends: reads end it, and rules read some histories only.
   */
  private runNetwork: string | undefined;
  private runGeo: GeoPoint | undefined;
  private runSighting: NetworkEntry | undefined;
  private runPlace: PlaceSighting | undefined;
  private runFirst = Infinity;
  private runLast = -Infinity;
  /** The run's place becomes established at the run's earliest event from this time (its first + ESTABLISHED_MS when the run began). */
  private runEstablishAt = Infinity;
  private runEstablished = Infinity;
  /** The place of the last run that had one, and that run's times: the other end of a hop into the next place. */
  private lastPlace: PlaceSighting | undefined;
  private lastPlaceFirst = Infinity;
  private lastPlaceLast = -Infinity;
  /** The network of the last run, and that run's times: the other end of a hop into the next network. */
  private lastNetwork: NetworkEntry | undefined;
  private lastNetworkFirst = Infinity;
  private lastNetworkLast = -Infinity;
  private latest = -Infinity;
  /**
   * When the key was first seen since it was last idle for HISTORY_MS: kept apart from the sightings'
   * times, which let the ones seen longest ago go (MAX_SIGHTINGS), so a key whose networks churn, or
   * one an attacker floods with networks, does not look young (impossible_travel's minKeyAgeMinutes).
   */
  private firstSeenAt = Infinity;
  private expiredAt = -Infinity;
  /** Sightings recalled from storage are coming in: their runs are no hops, and vouch for nothing. */
  private recalling = false;
  /** What was vouched for since the last takeVouched; undefined when nothing was (most of the time). */
  private vouched: Vouched[] | undefined;

  constructor(private count: HistoryEntryCount = { entries: 0 }) {}

  saw(network: string, geo: GeoPoint | undefined, timestamp: number): void {
    // After HISTORY_MS idle, the key starts again, as its forgotten sightings would have it.
    if (timestamp < this.firstSeenAt || timestamp - this.newest > HISTORY_MS) this.firstSeenAt = timestamp;
    if (network !== this.runNetwork || geo !== this.runGeo) this.startRun(network, geo, timestamp);
    if (timestamp < this.runFirst) this.runFirst = timestamp;
    if (timestamp > this.runLast) this.runLast = timestamp;
    if (timestamp >= this.runEstablishAt && timestamp < this.runEstablished) this.runEstablished = timestamp;
  }

  get firstSeen(): number {
    return this.firstSeenAt;
  }

  /** The latest time the key was seen anywhere. */
  get newest(): number {
    return Math.max(this.latest, this.runLast);
  }

  knowsNetwork(network: string, before: number): boolean {
    this.endRun();
    const sighting = this.networks.get(network);
    if (sighting === undefined || !(sighting.first < before)) return false;
    // A place no longer remembered (one of more than MAX_SIGHTINGS) is taken as the key's, as its network is.
    const place = sighting.place;
    if (place === undefined) return vouchedBefore(sighting, before);
    return this.places.get(placeKey(place.geo)) !== place || vouchedBefore(place, before);
  }

  placesBefore(before: number): GeoPoint[] {
    // Read without ending the current run (a screen reads it on most judgements of keys seen at two
    // places): the run's place takes its first time from the run, where a late event may have moved it.
    const geos: GeoPoint[] = [];
    for (const place of this.places.values()) {
      const first = place === this.runPlace && this.runFirst < place.first ? this.runFirst : place.first;
      if (first < before && vouchedBefore(place, before)) geos.push(place.geo);
    }
    return geos;
  }

  establishedPlacesBefore(before: number): GeoPoint[] {
    // Read without ending the current run, as placesBefore: the run's place is judged with the run's times.
    const geos: GeoPoint[] = [];
    for (const place of this.places.values()) {
      const established =
        place === this.runPlace ? establishedWith(place, this.runFirst, this.runLast, this.runEstablished) : place.established;
      if (established < before && vouchedBefore(place, before)) geos.push(place.geo);
    }
    return geos;
  }

  /**
   * A network's first and last request over the days, recalled from storage after a start or a
   * rebalance, before the window's events (the earliest first: then the first recalled is the key's
   * first): seen, and with its place vouched for from when a record says it was (`vouched`).
   */
  recalled(network: string, geo: GeoPoint | undefined, first: number, last: number, vouched?: number): void {
    this.recalling = true;
    this.saw(network, geo, first);
    this.saw(network, geo, last);
    this.recalling = false;
    if (vouched === undefined) return;
    for (const sighting of [this.runSighting, this.runPlace]) if (sighting !== undefined) vouchFrom(sighting, minuteOf(vouched));
  }

  /** The networks vouched for since the last call, to record (each place once a day it is used); undefined when none. */
  takeVouched(): Vouched[] | undefined {
    const vouched = this.vouched;
    this.vouched = undefined;
    return vouched;
  }

  /** Forgets the networks and places last seen more than HISTORY_MS before `now` (looked for once an hour). */
  expire(now: number): void {
    if (now - this.expiredAt < EXPIRE_EVERY_MS) return;
    this.expiredAt = now;
    this.endRun();
    const cutoff = now - HISTORY_MS;
    const before = this.size;
    for (const sightings of [this.networks, this.places]) {
      for (const [key, sighting] of sightings) {
        if (sighting.last >= cutoff) continue;
        sightings.delete(key);
        this.count.entries--;
      }
    }
    if (this.size < before) this.findEarliest();
    if (this.size === 0) this.firstSeenAt = Infinity;
  }

  /** Networks and places remembered (the current run's included). */
  get size(): number {
    return this.networks.size + this.places.size;
  }

  /** Takes this history's entries off its count, which no longer follows it (its holder let go of it). */
  release(): void {
    this.count.entries -= this.size;
    this.count = { entries: 0 };
  }

  /** The current run's times go into its network's and its place's sightings (every read does this first). */
  endRun(): void {
    if (this.runNetwork === undefined) return;
    const { runSighting: sighting, runPlace: place, runFirst: first, runLast: last, runEstablished: established } = this;
    this.runNetwork = undefined;
    this.runGeo = undefined;
    this.runSighting = undefined;
    this.runPlace = undefined;
    this.runFirst = Infinity;
    this.runLast = -Infinity;
    this.runEstablishAt = Infinity;
    this.runEstablished = Infinity;
    if (last > this.latest) this.latest = last;
    widen(sighting!, first, last);
    this.lastNetwork = sighting;
    this.lastNetworkFirst = first;
    this.lastNetworkLast = last;
    if (place !== undefined) {
      place.established = establishedWith(place, first, last, established); // before widen: it reads the place's own times
      widen(place, first, last);
      this.lastPlace = place;
      this.lastPlaceFirst = first;
      this.lastPlaceLast = last;
    }
  }

  private startRun(network: string, geo: GeoPoint | undefined, timestamp: number): void {
    this.endRun();
    this.runNetwork = network;
    this.runGeo = geo;
    const sighting = (this.runSighting = this.networkSighting(network, timestamp));
    const place = (this.runPlace = sighting.place = this.placeSighting(geo, timestamp));
    if (place === undefined) {
      if (!this.recalling) this.networkRunBegan(sighting, network, timestamp);
      return;
    }
    this.runEstablishAt = place.first + ESTABLISHED_MS;
    // A hop from the last place to this one: both are established when it is near that place's run.
    const otherPlace = this.lastPlace;
    const at = otherPlace === undefined || otherPlace === place ? undefined : hopAt(timestamp, this.lastPlaceFirst, this.lastPlaceLast);
    if (at !== undefined) {
      if (at < otherPlace!.established) otherPlace!.established = at;
      if (at < place.established) place.established = at;
    }
    if (!this.recalling) this.placeRunBegan(place, otherPlace, at, network, timestamp);
  }

  /** A run at a place began (`at`: when it hopped from `other`, if it did): ties and records (apart, as most runs need neither). */
  private placeRunBegan(place: PlaceSighting, other: PlaceSighting | undefined, at: number | undefined, network: string, timestamp: number): void {
    if (at !== undefined) tie(other!, place, at);
    this.record(place, network, timestamp);
  }

  /** A run of a network without a usable point began: it is the key's by its own ties (the others, by their places'). */
  private networkRunBegan(sighting: NetworkEntry, network: string, timestamp: number): void {
    const other = this.lastNetwork;
    const at = other === undefined || other === sighting ? undefined : hopAt(timestamp, this.lastNetworkFirst, this.lastNetworkLast);
    // After a network with a place, by that place (which this one cannot vouch for: it has none).
    if (at !== undefined && other!.place === undefined) tie(other!, sighting, at);
    else if (at !== undefined && other!.place!.vouchedMinute <= minuteOf(at)) vouchFrom(sighting, minuteOf(at));
    this.record(sighting, network, timestamp);
  }

  /** A run at a network or place vouched for: recorded once a day (`network` stands for a place). */
  private record(sighting: Sighting, network: string, timestamp: number): void {
    if (sighting.vouchedMinute === NEVER || timestamp < (sighting.recordedDay + 1) * DAY_MS) return;
    sighting.recordedDay = Math.floor(timestamp / DAY_MS);
    (this.vouched ??= []).push({ network, at: Math.max(timestamp, sighting.vouchedMinute * MINUTE_MS) });
  }

  /** After networks or places were let go: those first seen earliest of the ones left are the key's first, vouched for. */
  private findEarliest(): void {
    vouchEarliest(this.networks);
    vouchEarliest(this.places);
  }

  /** The network's sighting, entered (seen at `timestamp`) if it is new. */
  private networkSighting(network: string, timestamp: number): NetworkEntry {
    const known = this.networks.get(network);
    if (known !== undefined) return known;
    // The key's first network, of those remembered (none is, after 7 idle days): vouched for.
    const vouchedMinute = this.networks.size === 0 ? minuteOf(timestamp) : NEVER;
    const sighting: NetworkEntry = { first: timestamp, last: timestamp, vouchedMinute, recordedDay: -1, place: undefined };
    this.networks.set(network, sighting);
    if (this.entered(this.networks)) this.findEarliest();
    return sighting;
  }

  /** The point's sighting, entered (seen at `timestamp`) if it is new; none without a usable point. */
  private placeSighting(geo: GeoPoint | undefined, timestamp: number): PlaceSighting | undefined {
    if (geo === undefined || Number.isNaN(geo.latitude) || Number.isNaN(geo.longitude)) return undefined;
    const key = placeKey(geo);
    const known = this.places.get(key);
    if (known !== undefined) return known;
    const vouchedMinute = this.places.size === 0 ? minuteOf(timestamp) : NEVER; // the key's first place
    const place = { first: timestamp, last: timestamp, geo, established: Infinity, vouchedMinute, recordedDay: -1 };
    this.places.set(key, place);
    if (this.entered(this.places)) this.findEarliest();
    return place;
  }

  /** One more entry in `sightings`: counted, and the ones seen longest ago let go when there are too many (then true). */
  private entered(sightings: Map<string, Sighting>): boolean {
    this.count.entries++;
    if (sightings.size <= MAX_SIGHTINGS * 1.25) return false;
    this.count.entries -= keepLatest(sightings);
    return true;
  }
}

/**
 * When a place is established, with a run's times merged in: the earliest of the times known to
 * have been seen there (the place's first, last and established time, the run's first, last and
 * established time) that is ESTABLISHED_MS after the earliest of them. Only these few times are
 * kept, so it may come out later than the truth (the place then counts as new for a while longer:
 * a sighting that comes in late, as warm-up's do), never earlier.
 */
function establishedWith(place: PlaceSighting, runFirst: number, runLast: number, runEstablished: number): number {
  const from = Math.min(place.first, runFirst) + ESTABLISHED_MS;
  return earliestFrom(from, earliestFrom(from, earliestFrom(from, place.established, place.first, place.last), runFirst, runLast), runEstablished, runEstablished);
}

/** The earliest of `earliest`, `a` and `b` that is at or after `from` (`earliest` is, or is Infinity). */
function earliestFrom(from: number, earliest: number, a: number, b: number): number {
  if (a >= from && a < earliest) earliest = a;
  if (b >= from && b < earliest) earliest = b;
  return earliest;
}

/**
 * When a run that begins at `timestamp` makes a hop from the last run (from `first` to `last`): near
 * it, within ESTABLISHED_MS. Of a long run (hours of traffic from one site), only of its last event:
 * a lone request hours after it, or one among days of a site's sightings warmed from storage, is
 * not near it in time. Undefined when it is not.
 */
function hopAt(timestamp: number, first: number, last: number): number | undefined {
  const from = last - first < ESTABLISHED_MS ? first - ESTABLISHED_MS : last - ESTABLISHED_MS;
  if (timestamp < from || timestamp > last + ESTABLISHED_MS) return undefined;
  return Math.max(timestamp, last);
}

/** A hop at `at` between two networks or two places: either one vouched for by then vouches for the other. */
function tie(a: Sighting, b: Sighting, at: number): void {
  // Most hops are between places vouched for long before: compared in milliseconds, nothing divided.
  if (a.vouchedMinute * MINUTE_MS < at + MINUTE_MS) {
    if (b.vouchedMinute * MINUTE_MS > at) vouchFrom(b, minuteOf(at));
  } else if (b.vouchedMinute * MINUTE_MS < at + MINUTE_MS) vouchFrom(a, minuteOf(at));
}

function vouchFrom(sighting: Sighting, minute: number): void {
  if (minute < sighting.vouchedMinute) sighting.vouchedMinute = minute;
}

/** Whether it was vouched for before `before` (epoch ms). */
function vouchedBefore(sighting: Sighting, before: number): boolean {
  return sighting.vouchedMinute * MINUTE_MS < before;
}

/** The minute since 1970 of a time, rounded up: vouched for never earlier than it was. */
function minuteOf(at: number): number {
  return Math.min(NEVER, Math.ceil(at / MINUTE_MS));
}

/** Those of these networks or places first seen earliest are the key's first: vouched for from then. */
function vouchEarliest(sightings: Map<string, Sighting>): void {
  let earliest = Infinity;
  for (const sighting of sightings.values()) if (sighting.first < earliest) earliest = sighting.first;
  for (const sighting of sightings.values()) if (sighting.first === earliest) vouchFrom(sighting, minuteOf(earliest));
}

function placeKey(geo: GeoPoint): string {
  return `${geo.latitude},${geo.longitude}`;
}

function widen(sighting: Sighting, first: number, last: number): void {
  if (first < sighting.first) sighting.first = first;
  if (last > sighting.last) sighting.last = last;
}

/** Keeps the MAX_SIGHTINGS seen most recently (a quarter more are let in before this runs again); returns how many went. */
function keepLatest(sightings: Map<string, Sighting>): number {
  const lasts = [...sightings.values()].map((sighting) => sighting.last).sort((a, b) => b - a);
  const cutoff = lasts[MAX_SIGHTINGS - 1]!;
  const before = sightings.size;
  let kept = 0;
  for (const [key, sighting] of sightings) {
    if (sighting.last >= cutoff && kept < MAX_SIGHTINGS) kept++;
    else sightings.delete(key);
  }
  return before - sightings.size;
}
