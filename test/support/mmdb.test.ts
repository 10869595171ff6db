import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { open } from 'maxmind';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildMmdb, writeMmdb, type MmdbNetwork, type MmdbOptions } from './mmdb.ts';

let dir: string;
let fileCount = 0;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'mmdb-test-'));
});

afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

/** Writes the networks to a fresh file and opens it with the `maxmind` reader. */
async function openBuilt(networks: MmdbNetwork[], options: MmdbOptions) {
  const path = join(dir, `db-${++fileCount}.mmdb`);
  await writeMmdb(path, networks, options);
  return open(path);
}

const asnExample = { autonomous_system_number: 64500, autonomous_system_organization: 'Example Net' };
const rich = {
  country: { iso_code: 'NL', names: { en: 'Netherlands', de: 'Niederlande' } },
  long_name: 'a string that is longer than 29 bytes, so it needs one size byte',
  very_long: 'x'.repeat(300),
  big: 4_200_000_000,
  small: 443,
  zero: 0,
  latitude: 52.3676,
  negative: -7,
  anycast: true,
  unicast: false,
  tags: ['cdn', 'hosting', 42],
};

describe('buildMmdb, IPv4 database', () => {
  const networks: MmdbNetwork[] = [
    { cidr: '203.0.113.0/24', record: asnExample },
    { cidr: '198.51.100.0/25', record: rich },
    { cidr: '192.0.2.7/32', record: 'single host' },
  ];

  it('returns each network its record, and null outside them', async () => {
    const reader = await openBuilt(networks, { databaseType: 'GeoLite2-ASN', ipVersion: 4 });
    expect(reader.get('203.0.113.0')).toEqual(asnExample);
    expect(reader.get('203.0.113.255')).toEqual(asnExample);
    expect(reader.get('198.51.100.1')).toEqual(rich);
    expect(reader.get('198.51.100.127')).toEqual(rich);
    expect(reader.get('192.0.2.7')).toBe('single host');

    expect(reader.get('198.51.100.128')).toBeNull();
    expect(reader.get('203.0.112.255')).toBeNull();
    expect(reader.get('203.0.114.0')).toBeNull();
    expect(reader.get('192.0.2.6')).toBeNull();
    expect(reader.get('10.0.0.1')).toBeNull();
    expect(reader.get('255.255.255.255')).toBeNull();
  });

  it('gives the prefix length of the matching network', async () => {
    const reader = await openBuilt(networks, { databaseType: 'GeoLite2-ASN', ipVersion: 4 });
    expect(reader.getWithPrefixLength('203.0.113.9')).toEqual([asnExample, 24]);
    expect(reader.getWithPrefixLength('198.51.100.9')).toEqual([rich, 25]);
    expect(reader.getWithPrefixLength('192.0.2.7')).toEqual(['single host', 32]);
  });

  it('writes the metadata', async () => {
    const before = Math.floor(Date.now() / 1000);
    const reader = await openBuilt(networks, { databaseType: 'GeoLite2-ASN', ipVersion: 4 });
    expect(reader.metadata).toMatchObject({
      databaseType: 'GeoLite2-ASN',
      ipVersion: 4,
      recordSize: 24,
      binaryFormatMajorVersion: 2,
      binaryFormatMinorVersion: 0,
      languages: [],
      description: {},
    });
    expect(reader.metadata.buildEpoch.getTime() / 1000).toBeGreaterThanOrEqual(before);
  });

  it('opens an empty database', async () => {
    const reader = await openBuilt([], { databaseType: 'Empty', ipVersion: 4 });
    expect(reader.get('203.0.113.1')).toBeNull();
  });

  it('rejects IPv6 networks', () => {
    expect(() => buildMmdb([{ cidr: '2001:db8::/32', record: 'x' }], { databaseType: 'T', ipVersion: 4 })).toThrow(
      /Invalid CIDR "2001:db8::\/32".*ipVersion 4/,
    );
  });
});

describe('buildMmdb, IPv6 database', () => {
  const networks: MmdbNetwork[] = [
    { cidr: '203.0.113.0/24', record: asnExample },
    { cidr: '2001:db8::/32', record: { autonomous_system_number: 64501, autonomous_system_organization: 'Six' } },
  ];

  it('looks up IPv4 addresses in the IPv4 subtree at ::a.b.c.d', async () => {
    const reader = await openBuilt(networks, { databaseType: 'GeoLite2-ASN', ipVersion: 6 });
    expect(reader.metadata.ipVersion).toBe(6);
    expect(reader.get('203.0.113.77')).toEqual(asnExample);
    expect(reader.getWithPrefixLength('203.0.113.77')).toEqual([asnExample, 24]);
    expect(reader.get('::203.0.113.77')).toEqual(asnExample);
    expect(reader.get('203.0.114.1')).toBeNull();
  });

  it('looks up IPv6 networks', async () => {
    const reader = await openBuilt(networks, { databaseType: 'GeoLite2-ASN', ipVersion: 6 });
    const six = { autonomous_system_number: 64501, autonomous_system_organization: 'Six' };
    expect(reader.get('2001:db8::1')).toEqual(six);
    expect(reader.get('2001:db8:ffff:ffff:ffff:ffff:ffff:ffff')).toEqual(six);
    expect(reader.getWithPrefixLength('2001:db8:1::1')).toEqual([six, 32]);
    expect(reader.get('2001:db9::1')).toBeNull();
    expect(reader.get('2001:db7:ffff::1')).toBeNull();
    expect(reader.get('::1')).toBeNull();
  });

  it('reads IPv6 CIDRs written with an embedded IPv4 tail', async () => {
    const reader = await openBuilt([{ cidr: '64:ff9b::198.51.100.0/120', record: 'nat64' }], {
      databaseType: 'T',
      ipVersion: 6,
    });
    expect(reader.get('64:ff9b::c633:64ff')).toBe('nat64');
    expect(reader.get('64:ff9b::c633:6500')).toBeNull();
  });

  it('finds no IPv4 address when there are no IPv4 networks', async () => {
    const reader = await openBuilt(networks.slice(1), { databaseType: 'T', ipVersion: 6 });
    expect(reader.get('203.0.113.77')).toBeNull();
  });
});

describe('buildMmdb, data encoding', () => {
  it('round-trips the size boundaries of strings, maps and arrays', async () => {
    const lengths = [0, 28, 29, 284, 285, 65_820, 65_821, 70_000];
    const record: Record<string, string | number[] | Record<string, number>> = {};
    for (const length of lengths) record[`s${length}`] = 'é'.repeat(Math.floor(length / 2)) + 'a'.repeat(length % 2);
    record.array300 = Array.from({ length: 300 }, (_, i) => i);
    record.map40 = Object.fromEntries(Array.from({ length: 40 }, (_, i) => [`k${i}`, i]));
    const reader = await openBuilt([{ cidr: '198.51.100.0/24', record }], { databaseType: 'T', ipVersion: 4 });
    const read = reader.get('198.51.100.1') as typeof record;
    for (const length of lengths) expect(Buffer.byteLength(read[`s${length}`] as string)).toBe(length);
    expect(read).toEqual(record);
  });

  it('round-trips numbers: uint16, uint32, and doubles for the rest', async () => {
    const numbers = [0, 1, 255, 256, 65_535, 65_536, 4_200_000_000, 4_294_967_295, 4_294_967_296, -1, 1.5, -0.25, 2 ** 53];
    const reader = await openBuilt([{ cidr: '198.51.100.0/24', record: numbers }], { databaseType: 'T', ipVersion: 4 });
    expect(reader.get('198.51.100.1')).toEqual(numbers);
  });
});

describe('buildMmdb, invalid input', () => {
  const build = (cidrs: string[], ipVersion: 4 | 6 = 4) =>
    buildMmdb(
      cidrs.map((cidr) => ({ cidr, record: 'x' })),
      { databaseType: 'T', ipVersion },
    );

  it('rejects overlapping networks, naming both', () => {
    expect(() => build(['203.0.113.0/24', '203.0.113.128/25'])).toThrow(
      'Overlapping networks: 203.0.113.128/25 overlaps 203.0.113.0/24',
    );
    expect(() => build(['203.0.113.128/25', '203.0.113.0/24'])).toThrow(
      'Overlapping networks: 203.0.113.0/24 overlaps 203.0.113.128/25',
    );
    expect(() => build(['203.0.113.0/24', '203.0.113.0/24'])).toThrow(/Overlapping networks/);
    expect(() => build(['203.0.113.0/24', '::cb00:7100/120'], 6)).toThrow(/Overlapping networks/);
  });

  it('accepts adjacent networks', () => {
    expect(() => build(['203.0.113.0/25', '203.0.113.128/25', '203.0.112.0/24'])).not.toThrow();
  });

  it.each([
    'not-an-ip/8',
    '203.0.113.0',
    '203.0.113.0/33',
    '203.0.113.0/0',
    '203.0.113.0/-1',
    '203.0.113.0/24/1',
    '203.0.113.5/24',
    '256.0.0.0/8',
    '2001:db8::/129',
    '2001:db8::1/32',
    'fe80::%eth0/64',
  ])('rejects %s, naming it', (cidr) => {
    expect(() => build([cidr], 6)).toThrow(`Invalid CIDR ${JSON.stringify(cidr)}`);
  });
});
