import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { writeMmdb, type MmdbNetwork } from '../../test/support/mmdb.ts';
import { openGeoLookup, type GeoLookup } from './geo.ts';

describe('geo lookup (DB-IP Lite city database)', () => {
  let geo: GeoLookup;
  beforeAll(async () => {
    geo = await openGeoLookup();
  });

  it.each([
    ['81.2.69.142', 'GB'],
    ['8.8.8.8', 'US'],
    ['::ffff:81.2.69.142', 'GB'],
  ])('places %s in %s with coordinates', (ip, country) => {
    const point = geo.lookup(ip);
    expect(point?.country).toBe(country);
    expect(point?.latitude).toBeTypeOf('number');
    expect(point?.accuracyKm).toBeGreaterThan(0);
  });

  it.each(['10.0.0.1', '127.0.0.1', 'not-an-ip', ''])('gives nothing for %j', (ip) => {
    expect(geo.lookup(ip)).toBeUndefined();
  });
});

describe('geo lookup with a city database of its own (GEOIP_CITY_DB)', () => {
  it('places IPv4 addresses only, when the database holds IPv4 networks only', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'geo-city-'));
    try {
      const path = join(dir, 'city.mmdb');
      const record = { city: { names: { en: 'Mountain View' } }, country: { iso_code: 'US' }, location: { latitude: 37.4, longitude: -122.08, accuracy_radius: 1000 } };
      await writeMmdb(path, [{ cidr: '32.0.0.0/8', record }], { databaseType: 'GeoLite2-City', ipVersion: 4 });
      const geo = await openGeoLookup({ cityDb: path });
      expect(geo.lookup('32.1.72.96')).toEqual({ latitude: 37.4, longitude: -122.08, accuracyKm: 1000, country: 'US', city: 'Mountain View', asn: undefined, asOrganization: undefined });
      expect(geo.lookup('2001:4860:4860::8888')).toBeUndefined();
      // A record whose coordinates are not numbers places nothing.
      const odd = join(dir, 'odd.mmdb');
      await writeMmdb(odd, [{ cidr: '32.0.0.0/8', record: { location: { latitude: 'north', longitude: -122 } } }], { databaseType: 'GeoLite2-City', ipVersion: 4 });
      expect((await openGeoLookup({ cityDb: odd })).lookup('32.1.72.96')).toBeUndefined();
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});

describe('geo lookup with an ASN database (GEOIP_ASN_DB)', () => {
  let dir: string;
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'geo-asn-'));
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  async function lookupWith(networks: MmdbNetwork[], ipVersion: 4 | 6 = 6): Promise<GeoLookup> {
    const path = join(dir, `asn-${networks.length}-${ipVersion}-${Math.random().toString(36).slice(2)}.mmdb`);
    await writeMmdb(path, networks, { databaseType: 'GeoLite2-ASN', ipVersion });
    return openGeoLookup({ asnDb: path });
  }

  it('adds the autonomous system (MaxMind layout) to the city point, for IPv4, mapped and IPv6 addresses', async () => {
    const geo = await lookupWith([
      { cidr: '8.8.8.0/24', record: { autonomous_system_number: 15169, autonomous_system_organization: 'GOOGLE' } },
      { cidr: '2001:4860::/32', record: { autonomous_system_number: 15169, autonomous_system_organization: 'GOOGLE' } },
    ]);
    for (const ip of ['8.8.8.8', '::ffff:8.8.8.8', '2001:4860:4860::8888']) {
      const point = geo.lookup(ip);
      expect(point, ip).toMatchObject({ asn: 15169, asOrganization: 'GOOGLE' });
      expect(point?.latitude, ip).toBeTypeOf('number');
    }
  });

  it('reads an Enterprise database\'s layout (under traits)', async () => {
    const geo = await lookupWith([{ cidr: '8.8.8.0/24', record: { traits: { autonomous_system_number: 15169, autonomous_system_organization: 'GOOGLE' } } }]);
    expect(geo.lookup('8.8.8.8')).toMatchObject({ asn: 15169, asOrganization: 'GOOGLE' });
  });

  it('reads IPinfo\'s layout ("AS13335" and as_name)', async () => {
    const geo = await lookupWith([{ cidr: '1.1.1.0/24', record: { asn: 'AS13335', as_name: 'Cloudflare, Inc.', country_code: 'AU' } }], 4);
    expect(geo.lookup('1.1.1.1')).toMatchObject({ asn: 13335, asOrganization: 'Cloudflare, Inc.' });
  });

  it('leaves the point without one when the database has no usable number for the address', async () => {
    const geo = await lookupWith([
      { cidr: '8.8.8.0/24', record: { autonomous_system_number: 0 } },
      { cidr: '1.1.1.0/24', record: { asn: 'unknown', as_name: 'nobody' } },
      { cidr: '81.2.69.0/24', record: { autonomous_system_number: 20712 } },
    ]);
    for (const ip of ['8.8.8.8', '1.1.1.1', '9.9.9.9']) {
      const point = geo.lookup(ip);
      expect(point, ip).toBeDefined();
      expect(point?.asn, ip).toBeUndefined();
    }
    // A number without an organization is still an operator.
    expect(geo.lookup('81.2.69.142')).toMatchObject({ country: 'GB', asn: 20712, asOrganization: undefined });
  });

  it('asks an IPv4-only database nothing of IPv6 addresses, which its reader would answer for an unrelated IPv4 network', async () => {
    // 2001:4860:: starts with the bits of 32.1.72.96: an IPv4-only tree walked with them answers for 32.0.0.0/8.
    const geo = await lookupWith([{ cidr: '32.0.0.0/8', record: { autonomous_system_number: 174, autonomous_system_organization: 'Cogent' } }], 4);
    expect(geo.lookup('32.1.72.96')).toMatchObject({ asn: 174 });
    const v6 = geo.lookup('2001:4860:4860::8888');
    expect(v6?.latitude).toBeTypeOf('number');
    expect(v6?.asn).toBeUndefined();
    // Said, so that the thread can warn at start.
    expect(geo.ipv4OnlyFiles).toEqual([expect.stringMatching(/asn-1-4-.*\.mmdb$/)]);
    expect((await lookupWith([{ cidr: '32.0.0.0/8', record: { autonomous_system_number: 174 } }], 6)).ipv4OnlyFiles).toEqual([]);
  });

  it('reads an IPv4-mapped IPv6 address in any spelling as its IPv4 address', async () => {
    const geo = await lookupWith([{ cidr: '8.8.8.0/24', record: { autonomous_system_number: 15169 } }]);
    const plain = geo.lookup('8.8.8.8');
    for (const ip of ['::ffff:8.8.8.8', '::FFFF:808:808', '0:0:0:0:0:ffff:8.8.8.8', '0:0:0:0:0:ffff:0808:0808']) {
      expect(geo.lookup(ip), ip).toEqual(plain);
    }
    expect(plain).toMatchObject({ country: 'US', asn: 15169 });
  });

  it('gives nothing for an address the city database cannot place, whatever its autonomous system', async () => {
    const geo = await lookupWith([{ cidr: '10.0.0.0/8', record: { autonomous_system_number: 64512 } }], 4);
    expect(geo.lookup('10.1.2.3')).toBeUndefined();
  });
});
