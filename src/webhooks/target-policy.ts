/**
 * Where a webhook may go (spec 6.5): HTTPS to public internet addresses only. Contract: a target is
 * refused when its URL is not https, carries credentials, names a local or internal host, or when
 * its address (an IP literal, or every address its name resolves to) is loopback, private,
 * link-local, carrier-grade NAT, multicast, reserved, documentation, unspecified or a cloud metadata
 * address, in IPv4 and IPv6, including IPv4 embedded in IPv6 (mapped, NAT64, 6to4). The same check
 * runs at registration and, through `guardedLookup`, on the addresses a delivery actually connects
 * to, so DNS rebinding cannot slip past it.
 *
 * `allowPrivate` (WEBHOOK_ALLOW_PRIVATE_TARGETS, for tests only) lets loopback and private networks
 * (and local names) through; metadata, link-local, multicast and reserved addresses stay refused.
 */
import { lookup as dnsLookup, Resolver as DnsResolver } from 'node:dns/promises';
import { isIP, type LookupFunction } from 'node:net';

export type AddressCategory =
  | 'public'
  | 'loopback'
  | 'private'
  | 'link_local'
  | 'carrier_grade_nat'
  | 'cloud_metadata'
  | 'multicast'
  | 'unspecified'
  | 'documentation'
  | 'reserved';

/** Categories that WEBHOOK_ALLOW_PRIVATE_TARGETS lets through. */
const PRIVATE_CATEGORIES: ReadonlySet<AddressCategory> = new Set(['loopback', 'private']);

export interface ResolvedAddress {
  address: string;
  family: 4 | 6;
}

/** Resolves a host name to all of its addresses (injected in tests). */
export type Resolver = (hostname: string) => Promise<ResolvedAddress[]>;

export interface TargetPolicy {
  /** Lets loopback and private targets through: tests only, never by default. */
  readonly allowPrivate: boolean;
  readonly resolve: Resolver;
}

/**
 * The operating system's resolver (getaddrinfo: /etc/hosts, local names). Node runs it on libuv's
 * small thread pool, where a lookup keeps its thread until the system gives up on it, however long
 * after its caller stopped waiting; so it serves only WEBHOOK_ALLOW_PRIVATE_TARGETS (tests), where
 * targets are local names.
 */
export const systemResolver: Resolver = async (hostname) => {
  const answers = await dnsLookup(hostname, { all: true, verbatim: true });
  return answers.map((answer) => ({ address: answer.address, family: answer.family === 6 ? 6 : 4 }));
};

/** How long one DNS query waits for an answer, and how many times it is sent (c-ares). */
const DNS_QUERY_TIMEOUT_MS = 1_500;
const DNS_QUERY_TRIES = 2;

/**
 * Public targets' names, asked of the DNS servers of /etc/resolv.conf (or `servers`) directly, A and
 * AAAA at once, through c-ares: off libuv's thread pool, and given up on after its timeouts. Through
 * getaddrinfo, a merchant admin registering names whose DNS never answers held the pool's threads,
 * and every other lookup of the worker queued behind them, on-call's deliveries included (/etc/hosts
 * is not read: a public target has a public name).
 */
export function dnsResolver(servers?: readonly string[]): Resolver {
  const resolver = new DnsResolver({ timeout: DNS_QUERY_TIMEOUT_MS, tries: DNS_QUERY_TRIES });
  if (servers) resolver.setServers(servers);
  return async (hostname) => {
    const [v4, v6] = await bothOrOneSoon(resolver.resolve4(hostname), resolver.resolve6(hostname), OTHER_FAMILY_GRACE_MS);
    const addresses: ResolvedAddress[] = [
      ...(v4.status === 'fulfilled' ? v4.value.map((address) => ({ address, family: 4 as const })) : []),
      ...(v6.status === 'fulfilled' ? v6.value.map((address) => ({ address, family: 6 as const })) : []),
    ];
    if (addresses.length === 0) throw v4.status === 'rejected' ? v4.reason : new Error(`${hostname} has no address`);
    return addresses;
  };
}

/**
 * Once one family has its addresses, how long the other may still take: a DNS server that drops
 * AAAA queries (some do) would otherwise hold every lookup for that query's timeouts, past the
 * delivery's 5 s connect limit.
 */
const OTHER_FAMILY_GRACE_MS = 300;

type Settled<T> = PromiseSettledResult<T> | { status: 'pending' };

/** Both outcomes once both settle, or once one has a value and `graceMs` more have passed (the other then 'pending'). */
async function bothOrOneSoon<A, B>(a: Promise<A>, b: Promise<B>, graceMs: number): Promise<[Settled<A>, Settled<B>]> {
  const outcomes: [Settled<A>, Settled<B>] = [{ status: 'pending' }, { status: 'pending' }];
  const track = <T,>(promise: Promise<T>, at: 0 | 1) =>
    promise.then(
      (value) => void (outcomes[at] = { status: 'fulfilled', value } as never),
      (reason: unknown) => void (outcomes[at] = { status: 'rejected', reason } as never),
    );
  const both = Promise.all([track(a, 0), track(b, 1)]);
  let timer: NodeJS.Timeout | undefined;
  const oneThenGrace = Promise.any([a, b]).then(
    () => new Promise<void>((resolve) => (timer = setTimeout(resolve, graceMs))),
    () => both, // neither has a value: wait for both to fail
  );
  await Promise.race([both, oneThenGrace]);
  clearTimeout(timer);
  return outcomes;
}

export function targetPolicy(options: { allowPrivate?: boolean; resolve?: Resolver } = {}): TargetPolicy {
  const allowPrivate = options.allowPrivate ?? false;
  return { allowPrivate, resolve: options.resolve ?? (allowPrivate ? systemResolver : dnsResolver()) };
}

/** A refused target; the message names the reason, never a resolved internal address. */
export class BlockedTargetError extends Error {
  readonly code = 'ERR_WEBHOOK_TARGET_BLOCKED';

  constructor(message: string) {
    super(message);
    this.name = 'BlockedTargetError';
  }
}

// ---------------------------------------------------------------------------------------------
// Address classification

type Range = readonly [prefix: string, bits: number, category: AddressCategory];

/** IPv4 special-purpose ranges (IANA registry, RFC 6890 and successors); first match wins. */
const IPV4_RANGES: readonly Range[] = [
  ['169.254.169.254', 32, 'cloud_metadata'], // AWS, GCP, Azure, OpenStack, Oracle
  ['100.100.100.200', 32, 'cloud_metadata'], // Alibaba Cloud
  ['192.0.0.192', 32, 'cloud_metadata'], // Oracle Cloud (legacy)
  ['0.0.0.0', 8, 'unspecified'], // "this network"
  ['10.0.0.0', 8, 'private'],
  ['100.64.0.0', 10, 'carrier_grade_nat'],
  ['127.0.0.0', 8, 'loopback'],
  ['169.254.0.0', 16, 'link_local'],
  ['172.16.0.0', 12, 'private'],
  ['192.0.0.0', 24, 'reserved'], // IETF protocol assignments
  ['192.0.2.0', 24, 'documentation'],
  ['192.88.99.0', 24, 'reserved'], // 6to4 relay anycast (deprecated)
  ['192.168.0.0', 16, 'private'],
  ['198.18.0.0', 15, 'reserved'], // benchmarking
  ['198.51.100.0', 24, 'documentation'],
  ['203.0.113.0', 24, 'documentation'],
  ['224.0.0.0', 4, 'multicast'],
  ['240.0.0.0', 4, 'reserved'], // includes 255.255.255.255
];

/** IPv6 ranges; first match wins. Ranges that embed an IPv4 address are classified by that address. */
const IPV6_RANGES: readonly Range[] = [
  ['fd00:ec2::254', 128, 'cloud_metadata'], // AWS (IPv6 instance metadata)
  ['::', 128, 'unspecified'],
  ['::1', 128, 'loopback'],
  ['64:ff9b:1::', 48, 'private'], // local-use NAT64 (RFC 8215)
  ['100::', 64, 'reserved'], // discard-only
  ['2001:db8::', 32, 'documentation'],
  ['2001::', 23, 'reserved'], // IETF protocol assignments: Teredo, benchmarking, ORCHID
  ['3fff::', 20, 'documentation'],
  ['fc00::', 7, 'private'], // unique local
  ['fe80::', 10, 'link_local'],
  ['fec0::', 10, 'private'], // site-local (deprecated)
  ['ff00::', 8, 'multicast'],
];

/** IPv6 prefixes that carry an IPv4 address: the prefix, its length, the byte offset of the IPv4. */
const IPV4_EMBEDDING: readonly (readonly [prefix: string, bits: number, offset: number, name: string])[] = [
  ['::ffff:0:0', 96, 12, 'IPv4-mapped'],
  ['64:ff9b::', 96, 12, 'NAT64'],
  ['2002::', 16, 2, '6to4'],
];

/** Only global unicast (2000::/3) is public in IPv6; everything else left is reserved. */
const IPV6_GLOBAL_UNICAST: readonly [string, number] = ['2000::', 3];

export interface AddressClass {
  category: AddressCategory;
  /** How the address was read when it embeds an IPv4 address ('IPv4-mapped', 'NAT64', '6to4'). */
  via?: string;
}

/** Classifies an IP address (either family, as text). Anything that does not parse is 'reserved'. */
export function classifyAddress(text: string): AddressClass {
  const bytes = parseAddress(text);
  if (!bytes) return { category: 'reserved' };
  if (bytes.length === 4) return { category: match(bytes, IPV4_RANGES_PARSED) ?? 'public' };
  for (const [prefix, bits, offset, name] of IPV4_EMBEDDING_PARSED) {
    if (inPrefix(bytes, prefix, bits)) {
      const embedded = bytes.subarray(offset, offset + 4);
      return { category: match(embedded, IPV4_RANGES_PARSED) ?? 'public', via: name };
    }
  }
  const special = match(bytes, IPV6_RANGES_PARSED);
  if (special) return { category: special };
  return { category: inPrefix(bytes, GLOBAL_UNICAST_PARSED[0], GLOBAL_UNICAST_PARSED[1]) ? 'public' : 'reserved' };
}

/** Undefined when the policy allows the address; else why not ('a loopback address'). */
export function addressRefusal(address: string, policy: Pick<TargetPolicy, 'allowPrivate'>): string | undefined {
  const { category, via } = classifyAddress(address);
  if (category === 'public' || (policy.allowPrivate && PRIVATE_CATEGORIES.has(category))) return undefined;
  const name = category.replaceAll('_', '-');
  return `${/^[aeiou]/.test(name) ? 'an' : 'a'} ${name} address${via ? ` (${via})` : ''}`;
}

// ---------------------------------------------------------------------------------------------
// URLs and names

/** Host names that are local or internal by definition (RFC 6761, 6762, 8375; ICANN's .internal). */
const LOCAL_NAME = /(^|\.)(localhost|localdomain|local|internal|intranet|lan|home\.arpa)$/;
const MAX_URL_LENGTH = 2048;
const TOO_LONG = `must be at most ${MAX_URL_LENGTH} characters`;

export interface CheckedUrl {
  url: URL;
  /** The host without brackets or a trailing dot, lower case. */
  host: string;
  /** Set when the host is an IP literal. */
  literal?: string;
}

/**
 * Checks what can be checked without the network: https, no credentials, and the host (an IP
 * literal's class, or a name that is not local). Throws BlockedTargetError. The WHATWG URL parser
 * has already turned decimal, octal and hex IPv4 forms (2130706433, 0177.0.0.1, 0x7f.1) into
 * dotted quads.
 */
export function checkTargetUrl(text: string, policy: Pick<TargetPolicy, 'allowPrivate'>): CheckedUrl {
  if (text.length > MAX_URL_LENGTH) throw new BlockedTargetError(TOO_LONG);
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    throw new BlockedTargetError('must be an absolute URL');
  }
  // Also as parsed: the href (stored at registration, checked at delivery) can be longer, percent-encoded.
  if (url.href.length > MAX_URL_LENGTH) throw new BlockedTargetError(TOO_LONG);
  if (url.protocol !== 'https:') throw new BlockedTargetError('must use https');
  if (url.username || url.password) throw new BlockedTargetError('must not carry credentials');
  // Port 0 reaches no server (a connect to it fails), so deliveries could never succeed.
  if (url.port === '0') throw new BlockedTargetError('must not use port 0');
  const host = url.hostname.replace(/^\[|\]$/g, '').replace(/\.$/, '').toLowerCase();
  if (host.length === 0) throw new BlockedTargetError('must name a host');
  if (isIP(host)) {
    const refusal = addressRefusal(host, policy);
    if (refusal) throw new BlockedTargetError(`must not point to ${refusal}`);
    return { url, host, literal: host };
  }
  if (!policy.allowPrivate && (LOCAL_NAME.test(host) || !host.includes('.'))) {
    throw new BlockedTargetError('must name a public host');
  }
  return { url, host };
}

/**
 * The one refusal of a name by what it resolves to. One message for a name that does not resolve and
 * one that resolves to an internal address: two would tell a merchant admin which internal host names
 * exist (the resolver is the operator's, which may answer for internal zones).
 */
export const UNRESOLVED_OR_INTERNAL = 'host name does not resolve, or resolves to an address that is not public';

/** Resolves a host name and refuses it unless every address it resolves to is allowed. */
export async function resolveTarget(host: string, policy: TargetPolicy, family?: number): Promise<ResolvedAddress[]> {
  let addresses: ResolvedAddress[];
  try {
    addresses = await policy.resolve(host);
  } catch {
    throw new BlockedTargetError(UNRESOLVED_OR_INTERNAL);
  }
  if (family === 4 || family === 6) addresses = addresses.filter((address) => address.family === family);
  if (addresses.length === 0) throw new BlockedTargetError(UNRESOLVED_OR_INTERNAL);
  // Refuse the name as a whole: one internal answer means the name cannot be trusted.
  if (addresses.some(({ address }) => addressRefusal(address, policy))) throw new BlockedTargetError(UNRESOLVED_OR_INTERNAL);
  return addresses;
}

/** How long registration waits for a name to resolve (the system resolver may retry for much longer). */
export const REGISTRATION_RESOLVE_TIMEOUT_MS = 5_000;

/**
 * The full check of a URL at registration: the URL itself and, for a name, what it resolves to now.
 * A name that does not resolve within `timeoutMs` is refused, so the admin's request does not hang
 * on a slow or silent DNS server (deliveries are bounded by their own connect timeout).
 */
export async function checkTarget(text: string, policy: TargetPolicy, timeoutMs = REGISTRATION_RESOLVE_TIMEOUT_MS): Promise<CheckedUrl> {
  const checked = checkTargetUrl(text, policy);
  if (checked.literal) return checked;
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new BlockedTargetError(`host name did not resolve within ${timeoutMs / 1000} s`)), timeoutMs);
  });
  try {
    await Promise.race([resolveTarget(checked.host, policy), timeout]);
  } finally {
    clearTimeout(timer);
  }
  return checked;
}

/**
 * A `lookup` for http(s).request / net.connect: the connection goes only to addresses this function
 * returned, and it returns only checked ones, so the address checked is the address connected to.
 */
export function guardedLookup(policy: TargetPolicy): LookupFunction {
  return (hostname, options, callback) => {
    resolveTarget(hostname, policy, options.family === 'IPv4' ? 4 : options.family === 'IPv6' ? 6 : options.family).then(
      (addresses) => {
        if (options.all) callback(null, addresses);
        else callback(null, addresses[0]!.address, addresses[0]!.family);
      },
      (error: Error) => callback(Object.assign(error, { code: 'ERR_WEBHOOK_TARGET_BLOCKED' }) as NodeJS.ErrnoException, '', 0),
    );
  };
}

// ---------------------------------------------------------------------------------------------
// Parsing

/** 4 or 16 bytes, or undefined when the text is not a plain IP address (zone ids are refused). */
export function parseAddress(text: string): Uint8Array | undefined {
  const family = isIP(text);
  if (family === 4) return Uint8Array.from(text.split('.').map(Number));
  if (family !== 6 || text.includes('%')) return undefined;
  let hex = text;
  const dotted = /(\d+)\.(\d+)\.(\d+)\.(\d+)$/.exec(hex);
  if (dotted) {
    const [a, b, c, d] = dotted.slice(1).map(Number) as [number, number, number, number];
    hex = `${hex.slice(0, dotted.index)}${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`;
  }
  const halves = hex.split('::');
  if (halves.length > 2) return undefined;
  const words = (part: string) => (part === '' ? [] : part.split(':').map((word) => parseInt(word, 16)));
  const left = words(halves[0]!);
  const right = halves.length === 2 ? words(halves[1]!) : [];
  const all = halves.length === 2 ? [...left, ...new Array<number>(Math.max(0, 8 - left.length - right.length)).fill(0), ...right] : left;
  if (all.length !== 8 || all.some((word) => !(word >= 0 && word <= 0xffff))) return undefined;
  const bytes = new Uint8Array(16);
  all.forEach((word, i) => {
    bytes[2 * i] = word >> 8;
    bytes[2 * i + 1] = word & 0xff;
  });
  return bytes;
}

function inPrefix(bytes: Uint8Array, prefix: Uint8Array, bits: number): boolean {
  if (bytes.length !== prefix.length) return false;
  const whole = bits >> 3;
  for (let i = 0; i < whole; i++) if (bytes[i] !== prefix[i]) return false;
  const rest = bits & 7;
  if (rest === 0) return true;
  const mask = (0xff << (8 - rest)) & 0xff;
  return (bytes[whole]! & mask) === (prefix[whole]! & mask);
}

type ParsedRange = readonly [Uint8Array, number, AddressCategory];

function parseRanges(ranges: readonly Range[]): ParsedRange[] {
  return ranges.map(([prefix, bits, category]) => [mustParse(prefix), bits, category] as const);
}

function mustParse(text: string): Uint8Array {
  const bytes = parseAddress(text);
  if (!bytes) throw new Error(`bad range ${text}`);
  return bytes;
}

function match(bytes: Uint8Array, ranges: readonly ParsedRange[]): AddressCategory | undefined {
  return ranges.find(([prefix, bits]) => inPrefix(bytes, prefix, bits))?.[2];
}

const IPV4_RANGES_PARSED = parseRanges(IPV4_RANGES);
const IPV6_RANGES_PARSED = parseRanges(IPV6_RANGES);
const IPV4_EMBEDDING_PARSED = IPV4_EMBEDDING.map(([prefix, bits, offset, name]) => [mustParse(prefix), bits, offset, name] as const);
const GLOBAL_UNICAST_PARSED = [mustParse(IPV6_GLOBAL_UNICAST[0]), IPV6_GLOBAL_UNICAST[1]] as const;
