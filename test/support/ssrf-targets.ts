/**
 * Hostile webhook targets: internal, private and reserved addresses in both families and in every
 * spelling, local names, names that resolve (or rebind) to internal addresses, plain http. Each is
 * refused at registration and at delivery; `port` is an internal listener that must see no connection.
 */
import type { ResolvedAddress, Resolver } from '../../src/webhooks/target-policy.ts';

export interface HostileTarget {
  name: string;
  url: string;
  /** True when registration cannot see it coming (a name that rebinds after the check). */
  passesRegistration?: boolean;
}

const PUBLIC_V4 = '93.184.215.14';

function answers(...addresses: string[]): ResolvedAddress[] {
  return addresses.map((address) => ({ address, family: address.includes(':') ? 6 : 4 }));
}

/**
 * The test resolver: names of the hostile table resolve to what they are meant to; `rebind.example`
 * answers a public address to the first question (registration) and loopback to every later one.
 */
export function hostileResolver(): Resolver & { calls: string[] } {
  const calls: string[] = [];
  let rebindCalls = 0;
  const fixed: Record<string, ResolvedAddress[]> = {
    'internal-name.example': answers('127.0.0.1'),
    'private-name.example': answers('10.20.30.40'),
    'mixed.example': answers(PUBLIC_V4, '192.168.1.20'),
    'mapped.example': answers('::ffff:127.0.0.1'),
    'v6-loopback.example': answers('::1'),
    'metadata.example': answers('169.254.169.254'),
    'nat64.example': answers('64:ff9b::a9fe:a9fe'),
  };
  const resolver = async (hostname: string) => {
    calls.push(hostname);
    if (hostname === 'rebind.example') return answers(rebindCalls++ === 0 ? PUBLIC_V4 : '127.0.0.1');
    const found = fixed[hostname];
    if (!found) throw Object.assign(new Error(`getaddrinfo ENOTFOUND ${hostname}`), { code: 'ENOTFOUND' });
    return found;
  };
  return Object.assign(resolver, { calls });
}

export function hostileTargets(port: number): HostileTarget[] {
  const at = (host: string, path = '/hook') => `https://${host}:${port}${path}`;
  return [
    // Loopback, in every spelling the URL parser accepts.
    { name: 'IPv4 loopback', url: at('127.0.0.1') },
    { name: 'IPv4 loopback, elsewhere in 127/8', url: at('127.10.20.30') },
    { name: 'IPv4 loopback, decimal', url: at('2130706433') },
    { name: 'IPv4 loopback, hex', url: at('0x7f.1') },
    { name: 'IPv4 loopback, hex dword', url: at('0x7f000001') },
    { name: 'IPv4 loopback, octal', url: at('0177.0.0.1') },
    { name: 'IPv4 loopback, short form', url: at('127.1') },
    { name: 'unspecified IPv4 (reaches the host)', url: at('0.0.0.0') },
    { name: 'IPv6 loopback', url: at('[::1]') },
    { name: 'unspecified IPv6', url: at('[::]') },
    { name: 'IPv4-mapped IPv6 loopback, dotted', url: at('[::ffff:127.0.0.1]') },
    { name: 'IPv4-mapped IPv6 loopback, hex', url: at('[::ffff:7f00:1]') },
    { name: 'IPv4-mapped IPv6 loopback, long form', url: at('[0:0:0:0:0:ffff:127.0.0.1]') },
    { name: 'NAT64 of IPv4 loopback', url: at('[64:ff9b::127.0.0.1]') },
    { name: 'NAT64 of a private IPv4', url: at('[64:ff9b::10.0.0.1]') },
    { name: '6to4 of IPv4 loopback', url: at('[2002:7f00:1::1]') },
    // Private, shared and link-local ranges.
    { name: 'RFC 1918 10/8', url: at('10.0.0.1') },
    { name: 'RFC 1918 172.16/12', url: at('172.16.5.4') },
    { name: 'RFC 1918 192.168/16', url: at('192.168.1.1') },
    { name: 'carrier-grade NAT', url: at('100.64.0.1') },
    { name: 'IPv4 link-local', url: at('169.254.10.10') },
    { name: 'IPv6 unique local', url: at('[fc00::1]') },
    { name: 'IPv6 link-local', url: at('[fe80::1]') },
    { name: 'IPv6 site-local (deprecated)', url: at('[fec0::1]') },
    // Cloud metadata.
    { name: 'cloud metadata 169.254.169.254', url: at('169.254.169.254', '/latest/meta-data/') },
    { name: 'cloud metadata, decimal', url: at('2852039166') },
    { name: 'cloud metadata, IPv4-mapped', url: at('[::ffff:a9fe:a9fe]') },
    { name: 'AWS IPv6 metadata fd00:ec2::254', url: at('[fd00:ec2::254]') },
    { name: 'Alibaba metadata 100.100.100.200', url: at('100.100.100.200') },
    // Multicast, broadcast, reserved, documentation.
    { name: 'IPv4 multicast', url: at('224.0.0.1') },
    { name: 'IPv6 multicast', url: at('[ff02::1]') },
    { name: 'IPv4 reserved 240/4', url: at('240.0.0.1') },
    { name: 'IPv4 broadcast', url: at('255.255.255.255') },
    { name: 'IPv4 benchmarking 198.18/15', url: at('198.18.0.1') },
    { name: 'IPv4 documentation', url: at('192.0.2.10') },
    { name: 'IPv6 documentation', url: at('[2001:db8::1]') },
    { name: 'IPv6 Teredo', url: at('[2001:0:4136:e378:8000:63bf:3fff:fdd2]') },
    { name: 'IPv6 outside global unicast', url: at('[4000::1]') },
    // Local and internal names.
    { name: 'localhost', url: at('localhost') },
    { name: 'localhost, upper case with a trailing dot', url: at('LOCALHOST.') },
    { name: 'a *.localhost name', url: at('api.localhost') },
    { name: 'a .internal name', url: at('metadata.google.internal', '/computeMetadata/v1/') },
    { name: 'a single-label name', url: at('intranet') },
    // Names whose addresses are internal.
    { name: 'a name resolving to loopback', url: at('internal-name.example') },
    { name: 'a name resolving to a private address', url: at('private-name.example') },
    { name: 'a name with one private answer among public ones', url: at('mixed.example') },
    { name: 'a name resolving to IPv4-mapped loopback', url: at('mapped.example') },
    { name: 'a name resolving to IPv6 loopback', url: at('v6-loopback.example') },
    { name: 'a name resolving to cloud metadata', url: at('metadata.example') },
    { name: 'a name resolving to NAT64 cloud metadata', url: at('nat64.example') },
    { name: 'a name that does not resolve', url: at('nowhere.example') },
    { name: 'a public name that rebinds to loopback on connect', url: at('rebind.example'), passesRegistration: true },
    // Not https, or not a plain URL.
    { name: 'plain http to a public name', url: 'http://hooks.example.com/alerts' },
    { name: 'plain http to loopback', url: `http://127.0.0.1:${port}/hook` },
    { name: 'credentials in the URL', url: 'https://user:password@hooks.example.com/alerts' },
    { name: 'another scheme', url: `ftp://127.0.0.1:${port}/hook` },
    { name: 'not a URL', url: 'hooks.example.com/alerts' },
  ];
}
