import { beforeAll, describe, expect, it } from 'vitest';
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
