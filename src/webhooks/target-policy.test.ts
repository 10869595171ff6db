import { execFileSync } from 'node:child_process';
import { closeSync, constants, mkdtempSync, openSync, rmSync } from 'node:fs';
import { open } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { startDnsServer } from '../../test/support/dns-server.ts';
import { hostileResolver, hostileTargets } from '../../test/support/ssrf-targets.ts';
import {
  addressRefusal,
  BlockedTargetError,
  checkTarget,
  checkTargetUrl,
  classifyAddress,
  dnsResolver,
  guardedLookup,
  parseAddress,
  systemResolver,
  targetPolicy,
  UNRESOLVED_OR_INTERNAL,
  type AddressCategory,
} from './target-policy.ts';

describe('classifyAddress', () => {
  it.each<[string, AddressCategory, string?]>([
    // IPv4
    ['0.0.0.0', 'unspecified'],
    ['0.255.255.255', 'unspecified'],
    ['10.0.0.1', 'private'],
    ['10.255.255.255', 'private'],
    ['11.0.0.1', 'public'],
    ['100.63.255.255', 'public'],
    ['100.64.0.1', 'carrier_grade_nat'],
    ['100.127.255.255', 'carrier_grade_nat'],
    ['100.128.0.0', 'public'],
    ['100.100.100.200', 'cloud_metadata'],
    ['127.0.0.1', 'loopback'],
    ['127.255.255.254', 'loopback'],
    ['169.254.169.254', 'cloud_metadata'],
    ['169.254.0.1', 'link_local'],
    ['172.15.255.255', 'public'],
    ['172.16.0.1', 'private'],
    ['172.31.255.255', 'private'],
    ['172.32.0.0', 'public'],
    ['192.0.0.8', 'reserved'],
    ['192.0.0.192', 'cloud_metadata'],
    ['192.0.2.1', 'documentation'],
    ['192.88.99.1', 'reserved'],
    ['192.167.255.255', 'public'],
    ['192.168.0.1', 'private'],
    ['192.169.0.0', 'public'],
    ['198.17.255.255', 'public'],
    ['198.18.0.1', 'reserved'],
    ['198.19.255.255', 'reserved'],
    ['198.20.0.0', 'public'],
    ['198.51.100.7', 'documentation'],
    ['203.0.113.7', 'documentation'],
    ['223.255.255.255', 'public'],
    ['224.0.0.1', 'multicast'],
    ['239.255.255.255', 'multicast'],
    ['240.0.0.1', 'reserved'],
    ['255.255.255.255', 'reserved'],
    ['1.1.1.1', 'public'],
    ['8.8.8.8', 'public'],
    // IPv6
    ['::', 'unspecified'],
    ['::1', 'loopback'],
    ['0:0:0:0:0:0:0:1', 'loopback'],
    ['::ffff:127.0.0.1', 'loopback', 'IPv4-mapped'],
    ['::ffff:7f00:1', 'loopback', 'IPv4-mapped'],
    ['::ffff:10.1.2.3', 'private', 'IPv4-mapped'],
    ['::ffff:a9fe:a9fe', 'cloud_metadata', 'IPv4-mapped'],
    ['::ffff:8.8.8.8', 'public', 'IPv4-mapped'],
    ['::127.0.0.1', 'reserved'], // IPv4-compatible (deprecated)
    ['::ffff:0:7f00:1', 'reserved'], // IPv4-translated
    ['64:ff9b::7f00:1', 'loopback', 'NAT64'],
    ['64:ff9b::192.168.1.1', 'private', 'NAT64'],
    ['64:ff9b::8.8.8.8', 'public', 'NAT64'],
    ['64:ff9b:1::1', 'private'],
    ['100::1', 'reserved'],
    ['2001::1', 'reserved'], // Teredo
    ['2001:2::1', 'reserved'], // benchmarking
    ['2001:db8::1', 'documentation'],
    ['2002:7f00:1::', 'loopback', '6to4'],
    ['2002:a00:1::', 'private', '6to4'],
    ['2002:808:808::1', 'public', '6to4'],
    ['2606:4700:4700::1111', 'public'],
    ['2a00:1450:4001:81b::200e', 'public'],
    ['3fff::1', 'documentation'],
    ['4000::1', 'reserved'],
    ['fc00::1', 'private'],
    ['fd12:3456::1', 'private'],
    ['fd00:ec2::254', 'cloud_metadata'],
    ['fe80::1', 'link_local'],
    ['febf::1', 'link_local'],
    ['fec0::1', 'private'],
    ['ff02::1', 'multicast'],
    ['ff05::1:3', 'multicast'],
    // Not plain addresses
    ['fe80::1%eth0', 'reserved'],
    ['not an address', 'reserved'],
    ['127.0.0.1.5', 'reserved'],
  ])('%s is %s', (address, category, via) => {
    expect(classifyAddress(address)).toEqual(via ? { category, via } : { category });
  });

  it('parses IPv6 with an embedded IPv4 the same as in hex', () => {
    expect(parseAddress('::ffff:1.2.3.4')).toEqual(parseAddress('::ffff:102:304'));
    expect(parseAddress('1:2:3:4:5:6:7:8')).toEqual(Uint8Array.from([0, 1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0, 7, 0, 8]));
  });
});

describe('addressRefusal', () => {
  it('refuses everything but public addresses by default', () => {
    expect(addressRefusal('8.8.8.8', { allowPrivate: false })).toBeUndefined();
    expect(addressRefusal('127.0.0.1', { allowPrivate: false })).toBe('a loopback address');
    expect(addressRefusal('::ffff:127.0.0.1', { allowPrivate: false })).toBe('a loopback address (IPv4-mapped)');
  });

  it('with allowPrivate, lets loopback and private networks through, and nothing else', () => {
    const policy = { allowPrivate: true };
    expect(addressRefusal('127.0.0.1', policy)).toBeUndefined();
    expect(addressRefusal('::1', policy)).toBeUndefined();
    expect(addressRefusal('10.1.2.3', policy)).toBeUndefined();
    expect(addressRefusal('169.254.169.254', policy)).toBe('a cloud-metadata address');
    expect(addressRefusal('fd00:ec2::254', policy)).toBe('a cloud-metadata address');
    expect(addressRefusal('169.254.1.1', policy)).toBe('a link-local address');
    expect(addressRefusal('224.0.0.1', policy)).toBe('a multicast address');
    expect(addressRefusal('0.0.0.0', policy)).toBe('an unspecified address');
  });
});

describe('checkTargetUrl', () => {
  it.each([
    ['https://hooks.example.com/alerts?team=sec', 'hooks.example.com'],
    ['https://HOOKS.Example.com./x', 'hooks.example.com'],
    ['https://8.8.8.8:8443/x', '8.8.8.8'],
    ['https://[2606:4700:4700::1111]/x', '2606:4700:4700::1111'],
  ])('accepts %s', (url, host) => {
    expect(checkTargetUrl(url, { allowPrivate: false }).host).toBe(host);
  });

  it('refuses a URL longer than 2,048 characters as typed or as stored (url.href, percent-encoded)', () => {
    const policy = { allowPrivate: false };
    const typed = `https://hooks.example.com/${'é'.repeat(970)}`; // 996 characters, 5,846 once encoded
    expect(() => checkTargetUrl(typed, policy)).toThrow('must be at most 2048 characters');
    expect(() => checkTargetUrl(`https://hooks.example.com/${'a'.repeat(2048)}`, policy)).toThrow('must be at most 2048 characters');
    const longest = `https://hooks.example.com/${'é'.repeat(337)}`; // 2,048 once encoded: accepted, and again as stored
    expect(checkTargetUrl(longest, policy).url.href).toHaveLength(2048);
    expect(() => checkTargetUrl(checkTargetUrl(longest, policy).url.href, policy)).not.toThrow();
  });

  it('refuses port 0, which no delivery could reach, and takes the default port written out', () => {
    expect(() => checkTargetUrl('https://8.8.8.8:0/x', { allowPrivate: false })).toThrow('must not use port 0');
    expect(() => checkTargetUrl('https://hooks.example.com:00/x', { allowPrivate: false })).toThrow('must not use port 0');
    expect(checkTargetUrl('https://hooks.example.com:443/x', { allowPrivate: false }).url.port).toBe('');
  });

  it('names the reason without echoing the URL', () => {
    const secretUrl = 'http://hooks.example.com/T000/B000/XXXXSECRET';
    expect(() => checkTargetUrl(secretUrl, { allowPrivate: false })).toThrow(BlockedTargetError);
    try {
      checkTargetUrl(secretUrl, { allowPrivate: false });
    } catch (error) {
      expect((error as Error).message).toBe('must use https');
    }
  });

  it('with allowPrivate, accepts loopback and local names but still only https', () => {
    expect(checkTargetUrl('https://127.0.0.1:8443/x', { allowPrivate: true }).literal).toBe('127.0.0.1');
    expect(checkTargetUrl('https://localhost:8443/x', { allowPrivate: true }).host).toBe('localhost');
    expect(() => checkTargetUrl('http://127.0.0.1:8443/x', { allowPrivate: true })).toThrow('must use https');
    expect(() => checkTargetUrl('https://169.254.169.254/x', { allowPrivate: true })).toThrow('cloud-metadata');
  });
});

describe('checkTarget (registration) refuses every hostile target of the table', () => {
  const policy = targetPolicy({ resolve: hostileResolver() });
  it.each(hostileTargets(8443).filter((target) => !target.passesRegistration))('$name: $url', async ({ url }) => {
    await expect(checkTarget(url, policy)).rejects.toBeInstanceOf(BlockedTargetError);
  });

  it('accepts a name that resolves to public addresses only', async () => {
    const resolve = async () => [{ address: '93.184.215.14', family: 4 as const }, { address: '2606:2800:21f:cb07:6820:80da:af6b:8b2c', family: 6 as const }];
    await expect(checkTarget('https://hooks.example.com/a', targetPolicy({ resolve }))).resolves.toMatchObject({ host: 'hooks.example.com' });
  });

  it('refuses an internal name and a name that does not resolve in the same words, telling a merchant admin nothing of the operator\'s internal zones', async () => {
    const resolve = async (host: string) => {
      if (host === 'db.corp.example.com') return [{ address: '10.2.3.4', family: 4 as const }];
      if (host === 'mixed.example.com') return [{ address: '93.184.215.14', family: 4 as const }, { address: 'fd00::1', family: 6 as const }];
      if (host === 'empty.example.com') return [];
      throw Object.assign(new Error(`queryA ENOTFOUND ${host}`), { code: 'ENOTFOUND' });
    };
    const policy = targetPolicy({ resolve });
    const refusals = await Promise.all(
      ['db.corp.example.com', 'mixed.example.com', 'empty.example.com', 'no-such-name.example.com'].map((host) =>
        checkTarget(`https://${host}/hook`, policy).then(
          () => 'accepted',
          (error: Error) => error.message,
        ),
      ),
    );
    expect(refusals).toEqual(Array(4).fill(UNRESOLVED_OR_INTERNAL));
  });

  it('refuses a name that does not resolve in time, instead of waiting on the resolver', async () => {
    const resolve = () => new Promise<never>(() => undefined); // a DNS server that never answers
    const started = Date.now();
    await expect(checkTarget('https://hooks.example.com/a', targetPolicy({ resolve }), 50)).rejects.toThrow(
      new BlockedTargetError('host name did not resolve within 0.05 s'),
    );
    expect(Date.now() - started).toBeLessThan(2_000);
  });
});

describe('guardedLookup', () => {
  const call = (lookup: ReturnType<typeof guardedLookup>, host: string, options: object) =>
    new Promise<{ error: NodeJS.ErrnoException | null; address: unknown; family?: number }>((resolve) =>
      lookup(host, options as never, (error, address, family) => resolve({ error, address, family })),
    );

  it('returns checked addresses, one or all as asked', async () => {
    const resolve = async () => [{ address: '93.184.215.14', family: 4 as const }, { address: '2606:2800:220:1::1', family: 6 as const }];
    const lookup = guardedLookup(targetPolicy({ resolve }));
    expect(await call(lookup, 'hooks.example.com', {})).toEqual({ error: null, address: '93.184.215.14', family: 4 });
    expect(await call(lookup, 'hooks.example.com', { family: 6 })).toEqual({ error: null, address: '2606:2800:220:1::1', family: 6 });
    expect((await call(lookup, 'hooks.example.com', { all: true })).address).toHaveLength(2);
  });

  it('fails the connection when the name rebinds to an internal address after registration', async () => {
    const resolve = hostileResolver();
    const policy = targetPolicy({ resolve });
    await checkTarget('https://rebind.example/hook', policy); // registration sees the public answer
    const result = await call(guardedLookup(policy), 'rebind.example', { all: true });
    expect(result.error).toBeInstanceOf(BlockedTargetError);
    expect(result.error?.code).toBe('ERR_WEBHOOK_TARGET_BLOCKED');
    expect(result.error?.message).toBe(UNRESOLVED_OR_INTERNAL);
    expect(resolve.calls).toEqual(['rebind.example', 'rebind.example']);
  });
});

describe('dnsResolver (public targets\' names)', () => {
  it('asks the DNS servers for A and AAAA at once, and refuses a name with neither', async () => {
    const server = await startDnsServer({ 'hooks.example.com': ['93.184.215.14', '2606:2800:21f:cb07:6820:80da:af6b:8b2c'], 'v6only.example.com': ['2001:4860:4860::8888'] });
    try {
      const resolve = dnsResolver([server.address]);
      expect(await resolve('hooks.example.com')).toEqual([
        { address: '93.184.215.14', family: 4 },
        { address: '2606:2800:21f:cb07:6820:80da:af6b:8b2c', family: 6 },
      ]);
      expect(await resolve('v6only.example.com')).toEqual([{ address: '2001:4860:4860::8888', family: 6 }]);
      await expect(resolve('nothing.example.com')).rejects.toThrow();
      const policy = targetPolicy({ resolve });
      await expect(checkTarget('https://hooks.example.com/hook', policy)).resolves.toMatchObject({ host: 'hooks.example.com' });
    } finally {
      await server.close();
    }
  });

  it('answers with one family\'s addresses soon after they come when the server never answers the other', async () => {
    const server = await startDnsServer({ 'hooks.example.com': ['93.184.215.14'] }, { unanswered: [28] });
    try {
      const started = performance.now();
      expect(await dnsResolver([server.address])('hooks.example.com')).toEqual([{ address: '93.184.215.14', family: 4 }]);
      // Not the AAAA query's timeouts (1.5 s, then longer).
      expect(performance.now() - started).toBeLessThan(1_400);
      expect(server.queries).toContain('hooks.example.com 28');
    } finally {
      await server.close();
    }
  });

  it('answers while libuv\'s thread pool is held (where getaddrinfo, and the webhooks\' lookups before, wait)', async () => {
    const server = await startDnsServer({ 'hooks.example.com': ['93.184.215.14'] });
    // Every thread of the pool blocks opening a FIFO that no one writes, as lookups that never answer did.
    const dir = mkdtempSync(join(tmpdir(), 'pool-'));
    const fifos = Array.from({ length: Number(process.env.UV_THREADPOOL_SIZE ?? 4) }, (_, i) => join(dir, `fifo-${i}`));
    for (const fifo of fifos) execFileSync('mkfifo', [fifo]);
    const held = fifos.map((fifo) => open(fifo, 'r'));
    try {
      await new Promise((resolve) => setTimeout(resolve, 100)); // the opens have taken the threads
      let systemAnswered = false;
      const system = systemResolver('localhost').then(() => (systemAnswered = true));
      expect(await dnsResolver([server.address])('hooks.example.com')).toEqual([{ address: '93.184.215.14', family: 4 }]);
      expect(systemAnswered).toBe(false); // the pool is held indeed
      for (const fifo of fifos) closeSync(openSync(fifo, constants.O_WRONLY | constants.O_NONBLOCK));
      await system;
    } finally {
      for (const handle of await Promise.allSettled(held)) if (handle.status === 'fulfilled') await handle.value.close();
      rmSync(dir, { recursive: true, force: true });
      await server.close();
    }
  });
});
