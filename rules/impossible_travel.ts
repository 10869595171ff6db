/**
 * impossible_travel: two consecutive geolocated requests of one key, from places so far apart that
 * nobody could have travelled between them in the time between the requests.
 *   adjusted distance = haversine(a, b) − a.accuracyKm − b.accuracyKm (never below 0)
 *   speed = adjusted distance / gap; a hop is impossible when speed > maxSpeedKmh (900, an airliner)
 *   and adjusted distance > minDistanceKm (500).
 * Only hops that ended in the last recentMinutes are judged (older ones were judged by earlier
 * evaluations); the rest of the window is the key's memory of places: a hop between two places the
 * key was already known at (the same or a neighbouring one-degree cell, within about 100-200 km) is a
 * multi-region deployment alternating between known sites, not travel; a hop into or out of a place
 * the key was not known at is judged. Known: the places the key was established at before the
 * window, in the last days the engine remembers (KeyWindow.history: seen there over at least half an
 * hour, or on two days, and tied to the key's own by a hop within half an hour), so a region that
 * serves only in European hours, or a daily job, is not new when it wakes; and the places the key
 * reached in the window from a known one. What a thief does while the key is idle (one request at
 * night, or hours of them) does not make his place known. So a key served from
 * us-east and eu-west never alerts once it is established there (a new key on that fleet alerts
 * once, high at most); a key that suddenly also appears in a third, far place alerts when
 * that place is new, also when that place's request came first after the key was idle (the hop out of
 * it is judged as soon as the key's own place answers).
 * With an ASN database (GEOIP_ASN_DB), the evidence and summary name each end's operator (its
 * autonomous system), and say so when both ends are one operator's in one country: a mobile
 * carrier moving a device between address pools, or a dual-stack client, looks like that. It is
 * said, not acted on: a thief calling through the key owner's carrier or cloud looks the same.
 * Severity: medium up to highSpeedKmh (GeoIP error or a VPN exit is plausible), high above it,
 * critical when the places new to the key in the impossible hops are in at least criticalCountries
 * countries other than those it is established in, in use at once (a country used for a while and
 * then left for the next, as a VPN's exits are, is one pair of hands with it; one seen once counts
 * on its own), and in at least as many as it is established in. A key at home in globalCountries
 * countries, two of its places globalSpanKm apart (an edge deployment, a global fleet), is in
 * far-apart places at once by design: short of critical its hops are low (one that launches in 3
 * more countries of its 11 is low).
 * The known end's country does not count, nor a
 * new region in the key's own country: a key at home in the US whose engineer's VPN
 * exit moves London -> Frankfurt is two new countries, high (so is a thief with exits in two new
 * countries). Never critical while the key has no place established before the window (a new key,
 * one idle for the 7 days the history keeps, or one whose history was shed): its first place is
 * taken as known only for want of anything better, so a freshly rotated key on a multi-region
 * fleet is high, investigated, not blocked. Nor while the key was first seen less than
 * minKeyAgeMinutes (a day) before the window: a new key rolled out region by region (us-east for
 * two hours, then the fleet's three other regions at once) is high too; so is a key stolen in its
 * first day of use.
 */
import { addToMinutes, removeFromMinutes, seenInMinutes } from '../src/detect/tallies.ts';
import type { Finding, GeoPoint, RuleDefinition, Severity, WindowEvent } from '../src/detect/types.ts';
import { cellOf, nearCells as nearKnown } from './network.ts';

type Params = {
  /** History the rule remembers places over. */
  windowMinutes: number;
  /** Hops that ended this recently are judged; the engine evaluates far more often than this. */
  recentMinutes: number;
  maxSpeedKmh: number;
  minDistanceKm: number;
  /** Above this speed a hop is clearly impossible (high); between maxSpeedKmh and it, medium. */
  highSpeedKmh: number;
  /** Distinct countries of the places new to the key, across the impossible hops, that make it critical (an established key only). */
  criticalCountries: number;
  /** A key established in this many countries or more, globalSpanKm apart, is global (edge, worldwide fleet): short of critical, its hops are low. */
  globalCountries: number;
  /** How far apart (km) two of a global key's places must be. */
  globalSpanKm: number;
  /**
   * Critical also only for a key first seen at least this long before the window (as far as its
   * memory of 7 days goes): a new key rolled out region by region over a day is high at most.
   */
  minKeyAgeMinutes: number;
  /** When a GeoPoint carries no usable accuracy. */
  defaultAccuracyKm: number;
};

const MINUTE = 60_000;
const EARTH_RADIUS_KM = 6371;

interface Hop {
  from: WindowEvent & { geo: GeoPoint };
  to: WindowEvent & { geo: GeoPoint };
  distanceKm: number;
  adjustedKm: number;
  gapMs: number;
  speedKmh: number;
}

/** A point the key was seen at (exact coordinates): its events in the window, newest time, and events per minute. */
interface Place {
  latitude: number;
  longitude: number;
  events: number;
  newest: number;
  /** [minute, events, ...] in minute order (tallies.ts): a flood from a new place every event costs a few numbers each. */
  minutes: number[];
}

/** The screen's tally: the window's geolocated points. */
interface Tally {
  places: Map<string, Place>;
  /** The place of the last event added or removed: consecutive events usually share one. */
  last: Place | undefined;
  /** Events whose coordinates are not numbers: never the same point as anything, so the screen steps aside. */
  unplaceable: number;
}

export const rule: RuleDefinition<Params, Tally> = {
  id: 'impossible_travel',
  version: '1.8.0',
  title: 'Impossible travel',
  description:
    'A key is used from two places farther apart than anyone could travel in the time between the requests: ' +
    'the key is in more than one pair of hands.',
  windowMs: 60 * MINUTE,
  // Hops are judged between consecutive events of the recent part; earlier, only the places the key
  // was seen at count, and thinning keeps every place of every minute.
  detailMs: 10 * MINUTE,
  defaults: {
    windowMinutes: 60,
    recentMinutes: 10,
    maxSpeedKmh: 900,
    minDistanceKm: 500,
    highSpeedKmh: 2000,
    criticalCountries: 3,
    globalCountries: 5,
    globalSpanKm: 3000,
    minKeyAgeMinutes: 24 * 60,
    defaultAccuracyKm: 50,
  },
  actions: { low: 'monitor', medium: 'investigate', high: 'investigate', critical: 'block' },
  falsePositives: [
    'Multi-region deployment (e.g. us-east and eu-west) alternating all day: a hop between places already seen in the window is not travel.',
    'Address churn: two addresses of the same IP or the same network never count, whatever GeoIP says about them.',
    'Not avoided: a mobile carrier moving a device between address pools GeoIP places in different cities (San Jose, then Boston), a dual-stack client whose IPv4 and IPv6 addresses GeoIP places apart, or a cloud address GeoIP misplaces, is reported (high at most: investigate, never block). With an ASN database (GEOIP_ASN_DB) the summary says when both addresses are one operator\'s in one country.',
    'GeoIP imprecision: each point\'s accuracy radius is subtracted from the distance; hops under minDistanceKm never count.',
    'Private or unknown addresses have no geo and are skipped.',
    'A region idle for longer than the window (eu-west only in European hours, a daily job): a place the key was established at in the last 7 days (seen there over at least 30 minutes, or on two days, and within 30 minutes of another of its places once) is known.',
    'Not avoided: a region used only while the key\'s other regions are idle (eu-west 06:00-12:00, us-east from 13:00) is reported at its first hop with them, once (high at most): a thief using the key while its owner is idle looks the same until then.',
    'Not avoided: a region the key never used in the last 7 days (a new region comes online) alerts once; dismiss it with a note, or allowlist the key\'s networks.',
    'A freshly rotated key deployed to a multi-region fleet alerts once, high at most (investigate, never block): until the key has a place established before its window, its first place is a guess.',
    'An engineer\'s VPN exit moving between two countries (London, then Frankfurt) on an established key is high, not critical: the key\'s own country does not count towards criticalCountries. So is one moving through three (Frankfurt, Amsterdam, London) with a few requests at each: a country left for the next is not in use at once with it.',
    'Not avoided: a VPN exit moving through three new countries with one request at each is critical, as a pool of thieves taking turns would be; a synthetic monitor started on a production key from three or more new countries at once is critical once (allowlist its published address ranges).',
    'A new key rolled out region by region (one region for hours, then the fleet\'s others at once) is high, not critical: a key first seen less than minKeyAgeMinutes (a day) before its window is never critical.',
    'An edge deployment or global fleet at home in many countries that starts serving from three new ones at once (a market launch through new edge locations) is low, not critical: critical needs as many new countries as the key is at home in, and at least criticalCountries; and a key at home in globalCountries (5) countries or more, at least globalSpanKm (3,000) apart, is in far-apart places at once by design, so its hops short of that are low (monitor): one shopper arriving through a new edge location is how it grows. Accepted: so is a thief in fewer new countries than the key is at home in.',
    'Not avoided: a fleet at home in one or two countries that moves to three new ones at once (a failover to standby regions abroad) is critical; allowlist the key for a drill, or dismiss the alert with a note.',
    'Accepted: a thief with exits in only two new countries, or in fewer new countries than the key is at home in (three for a key used in five), or a key stolen in its first day of use (or after 7 idle days), is high (investigate), not critical (block).',
    'Not avoided: a region the key used only briefly before (a job of a few minutes, on one day) is not established yet: its next hop with the key\'s other sites alerts again, once; from its second day it is known.',
  ],
  evaluate(window, params, now) {
    const { events } = window;
    const windowStart = now - params.windowMinutes * MINUTE;
    const recentStart = now - params.recentMinutes * MINUTE;

    // Walk back over the recent part to find its first event and the geolocated event before it.
    let first = events.length;
    while (first > 0 && events[first - 1]!.timestamp >= recentStart) first--;
    let previous: (WindowEvent & { geo: GeoPoint }) | undefined;
    for (let i = first - 1; i >= 0 && events[i]!.timestamp >= windowStart; i--) {
      if (events[i]!.geo) {
        previous = events[i] as WindowEvent & { geo: GeoPoint };
        break;
      }
    }

    let candidates: { hop: Hop; index: number }[] | undefined;
    for (let i = first; i < events.length; i++) {
      const event = events[i]!;
      if (!event.geo) continue;
      const current = event as WindowEvent & { geo: GeoPoint };
      // Cheapest checks first: most consecutive requests come from the same place.
      if (previous && !samePoint(previous.geo, current.geo) && previous.network !== current.network && previous.ip !== current.ip) {
        const hop = measure(previous, current, params.defaultAccuracyKm);
        if (hop.speedKmh > params.maxSpeedKmh && hop.adjustedKm > params.minDistanceKm) (candidates ??= []).push({ hop, index: i });
      }
      previous = current;
    }
    if (!candidates) return [];

    // Keep only hops into or out of a place the key was not known at before the hop. Known: the
    // places the key was established at before the window (its history: seen there over at least
    // half an hour, or on two days, and tied to its own places; what the attacker did while the key
    // was idle is not), and a place the key arrived at from a known one (a possible move, or an impossible hop:
    // reported here, or by an earlier evaluation). The window's first place is known when it is near
    // an established one, or when the key has no established place at all (a new key, or no memory):
    // then the window itself is all there is to go by. Not after the key was idle otherwise: the
    // first request may be the attacker's, and taken as known it would make every later hop into it
    // (the key's own site, then the attacker again) look like alternation between the key's sites.
    const hops: Hop[] = [];
    /** Per hop kept: how many places (cells) the key was known at before it, its known end included. */
    const knownBefore: number[] = [];
    /** Per hop kept: which of its ends was not known before it. */
    const newEnds: ('to' | 'from' | 'both')[] = [];
    const known = new Set<number>();
    /** The countries the key is established in: a new place there (a new region of its fleet) is no sign of more hands. */
    const homeCountries = new Set<string>();
    const homePlaces = window.history?.establishedPlacesBefore(windowStart) ?? [];
    for (const geo of homePlaces) {
      known.add(cellOf(geo));
      if (geo.country) homeCountries.add(geo.country);
    }
    // Established: the key has a place of its own from before the window. Otherwise its known places
    // are a guess (the window's first one), and a hop is never critical (a new key on a fleet). Nor
    // for a key first seen less than minKeyAgeMinutes before the window: a rotation that brings the
    // new key to one region, then hours later to the fleet's others, looks like three new countries.
    const keyEstablished = known.size > 0;
    const firstSeen = window.history?.firstSeen ?? Infinity;
    const keyAgeMinutes = firstSeen < windowStart ? Math.floor((windowStart - firstSeen) / MINUTE) : 0;
    const blockable = keyEstablished && keyAgeMinutes >= params.minKeyAgeMinutes;
    let lastGeo: GeoPoint | undefined;
    let next = 0;
    let start = first;
    while (start > 0 && events[start - 1]!.timestamp >= windowStart) start--;
    // The window's first, partial clock minute counts as one: whether the key was seen at a known
    // place in it, not in what order (a busy key's history keeps, of each place in each minute, only
    // its first and last event: the window's start may cut between them).
    let atKnownPlace = known.size === 0;
    const firstWholeMinute = Math.ceil(windowStart / MINUTE) * MINUTE;
    for (let i = start; !atKnownPlace && i < events.length && events[i]!.timestamp < firstWholeMinute; i++) {
      const geo = events[i]!.geo;
      if (geo && nearKnown(known, geo)) atKnownPlace = true;
    }
    // Known too: the window's first place when it was already the key's own (established, and vouched
    // for, a minute's rounding aside) by its first request in the window. The hop that made it so came
    // before that request, from a place before the window: the window's start has just passed the
    // last request at the key's old places (the whole fleet failed over to other regions a moment
    // after). Without this, the places it moved to would look new for as long as that moment, and
    // hops between them would be reported again, an hour later (reopening an alert resolved meanwhile).
    // A thief's place first seen while the key was idle is not: it is tied to the key's own only later.
    if (!atKnownPlace && keyEstablished) {
      let i = start;
      while (i < events.length && !events[i]!.geo) i++;
      const first = events[i];
      if (first?.geo) {
        const cell = cellOf(first.geo);
        atKnownPlace = window.history!.establishedPlacesBefore(first.timestamp + MINUTE + 1).some((place) => cellOf(place) === cell);
      }
    }
    for (let i = start; i < events.length && next < candidates.length; i++) {
      const geo = events[i]!.geo;
      if (!geo) continue;
      if (i === candidates[next]!.index) {
        const hop = candidates[next++]!.hop;
        const toKnown = nearKnown(known, hop.to.geo);
        const fromKnown = atKnownPlace && nearKnown(known, hop.from.geo);
        if (!toKnown || !fromKnown) {
          hops.push(hop);
          knownBefore.push(known.size);
          newEnds.push(toKnown ? 'from' : fromKnown ? 'to' : 'both');
        }
        atKnownPlace = true;
      } else if (geo === lastGeo) {
        continue; // the previous event's place, known or not as it was
      } else {
        atKnownPlace ||= nearKnown(known, geo);
      }
      lastGeo = geo;
      if (atKnownPlace) known.add(cellOf(geo));
    }
    if (hops.length === 0) return [];

    const worstIndex = hops.reduce((w, hop, i) => (hop.speedKmh > hops[w]!.speedKmh ? i : w), 0);
    const worst = hops[worstIndex]!;
    // Every country of the hops' ends (evidence), and those of the ends new to the key outside the
    // countries it is established in: only these count towards critical (more hands).
    const countries = new Set<string>();
    const newCountries = new Set<string>();
    hops.forEach((hop, i) => {
      for (const [end, isNew] of [[hop.from, newEnds[i] !== 'to'], [hop.to, newEnds[i] !== 'from']] as const) {
        const country = countryOf(end);
        if (!country) continue;
        countries.add(country);
        if (isNew && !homeCountries.has(country)) newCountries.add(country);
      }
    });
    const newCountriesAtOnce = handsAmong(newCountries, events, first);
    // Critical (block) only for an established key seen for a day; otherwise what would be critical is high.
    // A key at home in many countries (an edge deployment, a global fleet) needs as many new ones:
    // three new countries are a market launch through new edge locations for it, more hands for a key
    // at home in one or two.
    const criticalCountries = Math.max(params.criticalCountries, homeCountries.size);
    // A key at home in globalCountries countries or more, globalSpanKm apart, is in far-apart places at
    // once by design (an edge deployment, a global fleet): a hop into one more country is how it grows.
    // Low (monitor), short of critical. Five neighbours (Germany and the four beside it) are not: a thief
    // could make them the key's with a request each, too near to be travel.
    const global = homeCountries.size >= params.globalCountries && spansAtLeast(homePlaces, params.globalSpanKm);
    const severity: Severity =
      newCountriesAtOnce >= criticalCountries
        ? blockable
          ? 'critical'
          : 'high'
        : global
          ? 'low'
          : worst.speedKmh > params.highSpeedKmh
            ? 'high'
            : 'medium';
    // Surer the faster (log scale up to 20x the limit) and the smaller the GeoIP uncertainty.
    const speedScore = Math.min(1, Math.log(worst.speedKmh / params.maxSpeedKmh) / Math.log(20));
    const certainty = worst.distanceKm > 0 ? worst.adjustedKm / worst.distanceKm : 0;
    const confidence = round(clamp01(0.6 * speedScore + 0.4 * certainty), 3);

    const key = window.apiKeyId;
    const fromName = placeName(worst.from);
    const toName = placeName(worst.to);
    const gapMinutes = round(worst.gapMs / MINUTE, 1);
    const newEnd = newEnds[worstIndex]!;
    const newToKey =
      newEnd === 'to' ? `${toName} is new to the key` : newEnd === 'from' ? `${fromName} is new to the key` : 'neither place is one the key is known at';
    const samples = new Set<string>();
    for (const hop of hops) {
      if (samples.size >= 10) break;
      samples.add(hop.from.eventId);
      samples.add(hop.to.eventId);
    }
    // Within a minute (as evidence.gapMinutes rounds it), a speed says less than the word: a gap of
    // seconds makes millions of km/h.
    const simultaneous = gapMinutes < 1;
    // With GEOIP_ASN_DB: both ends of the worst hop announced by one operator in one country. Said, not
    // acted on: a thief calling through the key owner's carrier or cloud looks the same.
    const oneOperator = sameOperator(worst.from, worst.to);
    const seconds = Math.round(worst.gapMs / 1000);
    const finding: Finding = {
      scope: key,
      apiKeyId: key,
      severity,
      confidence,
      title: simultaneous
        ? `Impossible travel on ${key}: ${fromName} to ${toName}, ${Math.round(worst.adjustedKm)} km apart, within ${seconds} s (simultaneous use)`
        : `Impossible travel on ${key}: ${fromName} to ${toName} at ${Math.round(worst.speedKmh)} km/h (max ${params.maxSpeedKmh})`,
      summary:
        `${key} was used from ${worst.from.ip} (${fromName}${operatorName(worst.from)}) and ${simultaneous ? `${seconds} s` : `${gapMinutes} min`} later from ${worst.to.ip} (${toName}${operatorName(worst.to)}), ` +
        `${Math.round(worst.adjustedKm)} km apart after GeoIP accuracy: ${simultaneous ? 'in use in both places at once' : `${Math.round(worst.speedKmh)} km/h against a maximum of ${params.maxSpeedKmh}`} (${newToKey}); ` +
        (oneOperator
          ? `both addresses are AS${worst.to.geo.asn}'s, in ${countryOf(worst.to)}: a mobile carrier moving a device between its address pools, or a dual-stack client's IPv4 and IPv6, looks the same (GeoIP places such addresses far apart), so check whether the key's other requests come through that operator too; `
          : '') +
        `confirm with the merchant that both locations are theirs, otherwise ${severity === 'critical' ? 'block the key and ' : ''}rotate its secret.`,
      evidence: {
        from: point(worst.from),
        to: point(worst.to),
        distanceKm: Math.round(worst.distanceKm),
        adjustedDistanceKm: Math.round(worst.adjustedKm),
        gapMinutes,
        speedKmh: Math.round(worst.speedKmh),
        maxSpeedKmh: params.maxSpeedKmh,
        minDistanceKm: params.minDistanceKm,
        impossibleHops: hops.length,
        ...(worst.from.geo.asn === undefined || worst.to.geo.asn === undefined ? {} : { sameOperator: oneOperator }),
        countries: [...countries].sort(),
        newCountries: [...newCountries].sort(),
        newCountriesAtOnce,
        criticalCountries,
        homeCountries: homeCountries.size,
        keyEstablished,
        keyAgeMinutes,
        minKeyAgeMinutes: params.minKeyAgeMinutes,
        knownLocations: knownBefore[worstIndex]!,
        newLocation: newEnd,
        recentMinutes: params.recentMinutes,
        sampleEventIds: [...samples].slice(0, 10),
        windowMs: params.windowMinutes * MINUTE,
      },
      firstSeenAt: hops[0]!.from.timestamp,
      lastSeenAt: hops[hops.length - 1]!.to.timestamp,
    };
    return [finding];
  },
  screen: {
    create: () => ({ places: new Map(), last: undefined, unplaceable: 0 }),
    add(tally, event) {
      const geo = event.geo;
      if (!geo) return 0;
      if (Number.isNaN(geo.latitude) || Number.isNaN(geo.longitude)) {
        tally.unplaceable++;
        return 0;
      }
      let place = placeOf(tally, geo);
      if (!place) {
        place = { latitude: geo.latitude, longitude: geo.longitude, events: 0, newest: -Infinity, minutes: [] };
        tally.places.set(placeKey(geo), (tally.last = place));
      }
      place.events++;
      if (event.timestamp > place.newest) place.newest = event.timestamp;
      addToMinutes(place.minutes, event.timestamp);
      return place.events === 1 ? 1 : 0;
    },
    remove(tally, event) {
      const geo = event.geo;
      if (!geo) return 0;
      if (Number.isNaN(geo.latitude) || Number.isNaN(geo.longitude)) {
        tally.unplaceable--;
        return 0;
      }
      const place = placeOf(tally, geo)!;
      removeFromMinutes(place.minutes, event.timestamp);
      if (--place.events > 0) return 0;
      tally.places.delete(placeKey(geo));
      tally.last = undefined;
      return 1;
    },
    entries: (tally) => tally.places.size,
    // A finding needs a recent hop (two geolocated events since the window start, at different points)
    // into or out of a point not known before the hop; both ends of a recent hop were seen in the
    // recent part. With no established place in the history, a point also seen in a whole minute
    // between the window start and the recent part was known before any recent hop into or out of
    // it. With one, a point of the window may be unknown (reached only from the window's first
    // place), so that holds only when every point of the window is near an established place of the
    // history: then none is new.
    mayFire(tally, params, now, history) {
      const windowStart = now - params.windowMinutes * MINUTE;
      const recentStart = now - params.recentMinutes * MINUTE;
      if (tally.unplaceable > 0 || !(recentStart >= windowStart)) return true;
      if (tally.places.size < 2) return false;
      let points = 0;
      for (const place of tally.places.values()) if (place.newest >= windowStart && ++points === 2) break;
      if (points < 2) return false;
      const firstWholeMinute = Math.ceil(windowStart / MINUTE);
      const lastWholeMinute = Math.floor(recentStart / MINUTE) - 1;
      for (const place of tally.places.values()) {
        if (place.newest >= recentStart && !seenInMinutes(place.minutes, firstWholeMinute, lastWholeMinute)) return true;
      }
      const before = history?.establishedPlacesBefore(windowStart) ?? [];
      if (before.length === 0) return false;
      const known = new Set(before.map(cellOf));
      for (const place of tally.places.values()) if (place.newest >= windowStart && !nearKnown(known, place)) return true;
      return false;
    },
  },
};

function placeOf(tally: Tally, geo: GeoPoint): Place | undefined {
  const last = tally.last;
  if (last && last.latitude === geo.latitude && last.longitude === geo.longitude) return last;
  const place = tally.places.get(placeKey(geo));
  if (place) tally.last = place;
  return place;
}

function placeKey(geo: GeoPoint): string {
  return `${geo.latitude},${geo.longitude}`;
}

function measure(from: Hop['from'], to: Hop['to'], defaultAccuracyKm: number): Hop {
  const distanceKm = haversineKm(from.geo, to.geo);
  const adjustedKm = Math.max(0, distanceKm - accuracy(from.geo, defaultAccuracyKm) - accuracy(to.geo, defaultAccuracyKm));
  // Two requests in the same millisecond: count one second, so the speed stays a finite number.
  const gapMs = Math.max(1000, to.timestamp - from.timestamp);
  return { from, to, distanceKm, adjustedKm, gapMs, speedKmh: adjustedKm / (gapMs / 3_600_000) };
}

function accuracy(geo: GeoPoint, fallback: number): number {
  return Number.isFinite(geo.accuracyKm) && geo.accuracyKm >= 0 ? geo.accuracyKm : fallback;
}

function haversineKm(a: GeoPoint, b: GeoPoint): number {
  const rad = Math.PI / 180;
  const dLat = (b.latitude - a.latitude) * rad;
  const dLon = (b.longitude - a.longitude) * rad;
  const h = Math.sin(dLat / 2) ** 2 + Math.cos(a.latitude * rad) * Math.cos(b.latitude * rad) * Math.sin(dLon / 2) ** 2;
  return 2 * EARTH_RADIUS_KM * Math.asin(Math.min(1, Math.sqrt(h)));
}

function samePoint(a: GeoPoint, b: GeoPoint): boolean {
  return a === b || (a.latitude === b.latitude && a.longitude === b.longitude);
}

/** Both ends announced by one autonomous system, in one country (GEOIP_ASN_DB). */
function sameOperator(a: WindowEvent & { geo: GeoPoint }, b: WindowEvent & { geo: GeoPoint }): boolean {
  if (a.geo.asn === undefined || a.geo.asn !== b.geo.asn) return false;
  const country = countryOf(a);
  return country !== undefined && country === countryOf(b);
}

/** ", AS7922 Comcast Cable" when the point has an autonomous system (GEOIP_ASN_DB), else nothing. */
function operatorName(event: WindowEvent & { geo: GeoPoint }): string {
  const { asn, asOrganization } = event.geo;
  return asn === undefined ? '' : `, AS${asn}${asOrganization ? ` ${asOrganization}` : ''}`;
}

function countryOf(event: WindowEvent & { geo: GeoPoint }): string | undefined {
  return event.country ?? event.geo.country;
}

function placeName(event: WindowEvent & { geo: GeoPoint }): string {
  const country = countryOf(event);
  if (event.geo.city && country) return `${event.geo.city}, ${country}`;
  return event.geo.city ?? country ?? `${round(event.geo.latitude, 2)},${round(event.geo.longitude, 2)}`;
}

function point(event: WindowEvent & { geo: GeoPoint }): Record<string, unknown> {
  return {
    eventId: event.eventId,
    ip: event.ip,
    network: event.network,
    country: event.country ?? event.geo.country ?? null,
    city: event.geo.city ?? null,
    latitude: event.geo.latitude,
    longitude: event.geo.longitude,
    accuracyKm: event.geo.accuracyKm,
    ...(event.geo.asn === undefined ? {} : { asn: event.geo.asn, asOrganization: event.geo.asOrganization ?? null }),
    at: new Date(event.timestamp).toISOString(),
  };
}

function clamp01(x: number): number {
  return Number.isFinite(x) ? Math.min(1, Math.max(0, x)) : 0;
}

function round(x: number, digits: number): number {
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}

/** Whether two of the places are at least `km` apart. */
function spansAtLeast(places: readonly GeoPoint[], km: number): boolean {
  for (let i = 0; i < places.length; i++) for (let j = i + 1; j < places.length; j++) if (haversineKm(places[i]!, places[j]!) >= km) return true;
  return false;
}

/**
 * How many of the new countries are in use at once, from the key's events in them since `first`
 * (the recent part): one VPN exit after another, each used for a while and then left for the next
 * (Frankfurt, then Amsterdam, then London), is one pair of hands however many countries. A country
 * seen once says nothing about how long it was in use: it counts as a pair of its own, as before.
 */
function handsAmong(newCountries: ReadonlySet<string>, events: readonly WindowEvent[], first: number): number {
  if (newCountries.size < 2) return newCountries.size;
  const spans = new Map<string, [number, number]>();
  for (let i = first; i < events.length; i++) {
    const event = events[i]!;
    const country = event.geo ? countryOf(event as WindowEvent & { geo: GeoPoint }) : undefined;
    if (country === undefined || !newCountries.has(country)) continue;
    const span = spans.get(country);
    if (span === undefined) spans.set(country, [event.timestamp, event.timestamp]);
    else [span[0], span[1]] = [Math.min(span[0], event.timestamp), Math.max(span[1], event.timestamp)];
  }
  const stretches = [...spans.values()].filter(([from, to]) => to > from);
  return newCountries.size - stretches.length + mostAtOnce(stretches);
}

/** The most spans (from, to; both ends included) that share an instant. */
function mostAtOnce(spans: readonly (readonly [number, number])[]): number {
  // Starts before ends at the same instant: spans that touch share it.
  const edges = spans.flatMap(([from, to]) => [[from, 1], [to, -1]] as const).sort((a, b) => a[0] - b[0] || b[1] - a[1]);
  let open = 0;
  let most = 0;
  for (const [, change] of edges) most = Math.max(most, (open += change));
  return most;
}
