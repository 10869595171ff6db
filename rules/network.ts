import type { GeoPoint, KeyHistoryView } from '../src/detect/types.ts';

/**
 * The network of a client address, as the rules count it: the /24 for IPv4 ("203.0.113.0/24") and
 * the /64 for IPv6 ("2001:db8:1:2::/64", in RFC 5952 form). Address churn inside one
 * network (a NAT pool, a provider's DHCP range, IPv6 privacy addresses inside one /64) is one client.
 * An IPv4-mapped IPv6 address ("::ffff:198.51.100.7") counts as its IPv4 address. Pure; a string that
 * is not an address is returned as it is. Used by the engine to fill WindowEvent.network and by the
 * rule fixtures.
 */
export function networkOf(ip: string): string {
  const address = stripZone(ip);
  if (!address.includes(':')) return ipv4Network(address) ?? address;
  const hextets = expandIpv6(address);
  if (!hextets) return address;
  if (hextets[5] === 0xffff && hextets.slice(0, 5).every((h) => h === 0)) {
    return `${hextets[6]! >> 8}.${hextets[6]! & 255}.${hextets[7]! >> 8}.0/24`;
  }
  // RFC 5952: the trailing zeros (at least the last four groups) are the longest run, written "::".
  let end = 4;
  while (end > 0 && hextets[end - 1] === 0) end--;
  return `${hextets.slice(0, end).map((h) => h.toString(16)).join(':')}::/64`;
}

/**
 * The network credential stuffing is counted by (source-spray.ts): an IPv4 /24 as it is, an IPv6 /64
 * widened to its /48 ("2001:db8:1::/48"). A /48 is one site's (a provider hands one out per
 * customer, a tunnel broker for free), and holds 65,536 /64s: counted by /64, a spray that takes a
 * new /64 for every key would never fail for two keys from one network.
 */
export function sprayNetworkOf(network: string): string {
  if (!network.endsWith('::/64')) return network;
  // The first three of the /64's groups ("a:b:c:d::/64" as networkOf writes it), without the zero
  // groups that end them (RFC 5952 writes those as the "::"). Read without splitting: it runs per event.
  const groups = network.length - '::/64'.length;
  let cut = groups;
  for (let i = 0, colons = 0; i < groups; i++) {
    if (network.charCodeAt(i) === 58 && ++colons === 3) {
      cut = i;
      break;
    }
  }
  let head = network.slice(0, cut);
  while (head.endsWith(':0')) head = head.slice(0, -2);
  return `${head === '0' ? '' : head}::/48`;
}

function stripZone(ip: string): string {
  const zone = ip.indexOf('%');
  return zone === -1 ? ip : ip.slice(0, zone);
}

function ipv4Network(address: string): string | undefined {
  const lastDot = address.lastIndexOf('.');
  if (lastDot === -1) return undefined;
  return `${address.slice(0, lastDot)}.0/24`;
}

/** The eight 16-bit groups of an IPv6 address, or undefined when it is not one. */
function expandIpv6(address: string): number[] | undefined {
  const halves = address.split('::');
  if (halves.length > 2) return undefined;
  const parse = (part: string): number[] | undefined => {
    if (part === '') return [];
    const groups: number[] = [];
    for (const group of part.split(':')) {
      // An embedded IPv4 tail ("64:ff9b::192.0.2.1") fills the last two groups.
      if (group.includes('.')) {
        const octets = group.split('.').map(Number);
        if (octets.length !== 4 || octets.some((o) => !Number.isInteger(o) || o < 0 || o > 255)) return undefined;
        groups.push((octets[0]! << 8) | octets[1]!, (octets[2]! << 8) | octets[3]!);
        continue;
      }
      if (!/^[0-9a-f]{1,4}$/i.test(group)) return undefined;
      groups.push(parseInt(group, 16));
    }
    return groups;
  };
  const head = parse(halves[0]!);
  const tail = halves.length === 2 ? parse(halves[1]!) : [];
  if (!head || !tail) return undefined;
  const missing = 8 - head.length - tail.length;
  if (halves.length === 2 ? missing < 1 : missing !== 0) return undefined;
  return [...head, ...new Array<number>(missing).fill(0), ...tail];
}

/**
 * The one-degree grid cell (about 100 km) of a point, as one number: how impossible_travel and
 * credential_sharing tell a place the key knows from a new one. Pure.
 */
export function cellOf(point: { latitude: number; longitude: number }): number {
  return (Math.round(point.latitude) + 90) * 1000 + ((Math.round(point.longitude) + 540) % 360);
}

/** Whether a point is in one of `cells` (cellOf) or a cell next to it: within about 100-200 km of a known place. */
export function nearCells(cells: ReadonlySet<number>, point: { latitude: number; longitude: number }): boolean {
  const lat = Math.round(point.latitude);
  const lon = Math.round(point.longitude);
  for (let dLat = -1; dLat <= 1; dLat++) {
    for (let dLon = -1; dLon <= 1; dLon++) {
      if (cells.has((lat + dLat + 90) * 1000 + ((lon + dLon + 540) % 360))) return true;
    }
  }
  return false;
}

/**
 * Whether a point is at a place the key was established at before `since` (its one-degree cell or
 * one next to it). Established, not merely seen: a stranger's lone earlier request does not make his
 * place the key's. Without a history (a unit test) no place is the key's.
 */
export function ownPlaces(history: KeyHistoryView | undefined, since: number): (geo: GeoPoint | undefined) => boolean {
  let cells: Set<number> | undefined;
  return (geo) => {
    if (!history || !geo || Number.isNaN(geo.latitude) || Number.isNaN(geo.longitude)) return false;
    cells ??= new Set(history.establishedPlacesBefore(since).map(cellOf));
    return nearCells(cells, geo);
  };
}
