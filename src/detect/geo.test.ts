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
      expect(point, ip).not.toHaveProperty('asn');
    }
    // A number without an organization is still an operator.
    expect(geo.lookup('81.2.69.142')).toMatchObject({ country: 'GB', asn: 20712 });
    expect(geo.lookup('81.2.69.142')).not.toHaveProperty('asOrganization');
  });

  it('gives nothing for an address the city database cannot place, whatever its autonomous system', async () => {
    const geo = await lookupWith([{ cidr: '10.0.0.0/8', record: { autonomous_system_number: 64512 } }], 4);
    expect(geo.lookup('10.1.2.3')).toBeUndefined();
  });
});
