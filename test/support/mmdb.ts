/**
 * A minimal MaxMind DB (MMDB v2) writer, so tests can build tiny databases (say, GeoLite2-ASN-like)
 * that the `maxmind` reader opens. Format: https://maxmind.github.io/MaxMind-DB/
 *
 * Layout of the file: search tree, 16 zero bytes, data section, metadata marker, metadata map.
 * Kept small on purpose: 24-bit records, no pointers (no deduplication), disjoint networks only.
 */
import { writeFile } from 'node:fs/promises';
import { isIPv4, isIPv6 } from 'node:net';

export type MmdbValue = string | number | boolean | MmdbValue[] | { [key: string]: MmdbValue };

export interface MmdbNetwork {
  /** e.g. '203.0.113.0/24' or '2001:db8::/32'. */
  cidr: string;
  record: MmdbValue;
}

export interface MmdbOptions {
  /** The metadata's database_type, e.g. 'GeoLite2-ASN'. */
  databaseType: string;
  /** 4: a 32-bit tree of IPv4 networks. 6: a 128-bit tree; IPv4 networks go at ::a.b.c.d. */
  ipVersion: 4 | 6;
}

export function buildMmdb(networks: MmdbNetwork[], options: MmdbOptions): Buffer {
  if (options.ipVersion !== 4 && options.ipVersion !== 6) {
    throw new Error(`ipVersion must be 4 or 6, got ${String(options.ipVersion)}`);
  }
  const nodes: TreeNode[] = [emptyNode()];
  const data: Buffer[] = [];
  let dataSize = 0;
  for (const network of networks) {
    const { bytes, prefixLength } = parseNetwork(network.cidr, options.ipVersion);
    const encoded = encodeValue(network.record);
    insert(nodes, bytes, prefixLength, { kind: 'data', cidr: network.cidr, offset: dataSize });
    data.push(encoded);
    dataSize += encoded.length;
  }
  const nodeCount = nodes.length;
  // The largest record value is a data pointer: node_count + 16 + its offset in the data section.
  if (nodeCount + DATA_SEPARATOR.length + dataSize > MAX_RECORD) {
    throw new Error(`MMDB too large for 24-bit records (${nodeCount} nodes, ${dataSize} data bytes)`);
  }
  return Buffer.concat([
    encodeTree(nodes),
    DATA_SEPARATOR,
    ...data,
    METADATA_MARKER,
    encodeMetadata(nodeCount, options),
  ]);
}

export async function writeMmdb(path: string, networks: MmdbNetwork[], options: MmdbOptions): Promise<void> {
  await writeFile(path, buildMmdb(networks, options));
}

// ---------------------------------------------------------------------------------------------
// Search tree

const RECORD_BYTES = 3; // record size 24 bits; a node is a left and a right record
const MAX_RECORD = 2 ** 24 - 1;
const DATA_SEPARATOR = Buffer.alloc(16);
const METADATA_MARKER = Buffer.concat([Buffer.from([0xab, 0xcd, 0xef]), Buffer.from('MaxMind.com')]);

type TreeRecord =
  | { kind: 'empty' }
  | { kind: 'node'; index: number }
  | { kind: 'data'; cidr: string; offset: number };

/** records[0] is followed for a 0 bit, records[1] for a 1 bit. */
interface TreeNode {
  records: [TreeRecord, TreeRecord];
}

function emptyNode(): TreeNode {
  return { records: [{ kind: 'empty' }, { kind: 'empty' }] };
}

/** Walks the network's prefix from the root, adding nodes as needed, and sets its last record to `leaf`. */
function insert(nodes: TreeNode[], bytes: Buffer, prefixLength: number, leaf: TreeRecord & { kind: 'data' }): void {
  let node = nodes[0]!;
  for (let depth = 0; depth < prefixLength - 1; depth++) {
    const bit = bitAt(bytes, depth);
    let record = node.records[bit];
    if (record.kind === 'data') throw overlapError(leaf.cidr, record.cidr);
    if (record.kind === 'empty') {
      record = { kind: 'node', index: nodes.push(emptyNode()) - 1 };
      node.records[bit] = record;
    }
    node = nodes[record.index]!;
  }
  const bit = bitAt(bytes, prefixLength - 1);
  const existing = node.records[bit];
  if (existing.kind === 'data') throw overlapError(leaf.cidr, existing.cidr);
  if (existing.kind === 'node') throw overlapError(leaf.cidr, anyCidrUnder(nodes, existing.index));
  node.records[bit] = leaf;
}

/** A network inside the subtree: every node was added on the way to some network, so one is found. */
function anyCidrUnder(nodes: TreeNode[], index: number): string {
  for (const record of nodes[index]!.records) {
    if (record.kind === 'data') return record.cidr;
    if (record.kind === 'node') return anyCidrUnder(nodes, record.index);
  }
  throw new Error('MMDB writer bug: a tree node with no network under it');
}

function overlapError(cidr: string, other: string): Error {
  return new Error(`Overlapping networks: ${cidr} overlaps ${other} (the MMDB writer takes disjoint networks only)`);
}

function bitAt(bytes: Buffer, index: number): 0 | 1 {
  return ((bytes.readUInt8(index >> 3) >> (7 - (index & 7))) & 1) as 0 | 1;
}

function encodeTree(nodes: TreeNode[]): Buffer {
  const nodeCount = nodes.length;
  const tree = Buffer.alloc(nodeCount * 2 * RECORD_BYTES);
  nodes.forEach((node, index) => {
    const offset = index * 2 * RECORD_BYTES;
    tree.writeUIntBE(recordValue(node.records[0], nodeCount), offset, RECORD_BYTES);
    tree.writeUIntBE(recordValue(node.records[1], nodeCount), offset + RECORD_BYTES, RECORD_BYTES);
  });
  return tree;
}

/** < node_count: a node; == node_count: no data; > node_count: node_count + 16 + data offset. */
function recordValue(record: TreeRecord, nodeCount: number): number {
  switch (record.kind) {
    case 'node':
      return record.index;
    case 'empty':
      return nodeCount;
    case 'data':
      return nodeCount + DATA_SEPARATOR.length + record.offset;
  }
}

// ---------------------------------------------------------------------------------------------
// Networks

/** The network's address as 4 (ipVersion 4) or 16 (ipVersion 6) bytes, and its prefix length in that tree. */
function parseNetwork(cidr: string, ipVersion: 4 | 6): { bytes: Buffer; prefixLength: number } {
  const invalid = (why: string): Error => new Error(`Invalid CIDR ${JSON.stringify(cidr)}: ${why}`);
  const match = /^([^/]+)\/(\d{1,3})$/.exec(cidr);
  if (!match) throw invalid('expected address/prefix-length');
  const [, address = '', prefix = ''] = match;
  let bytes: Buffer;
  if (isIPv4(address)) bytes = Buffer.from(address.split('.').map(Number));
  else if (isIPv6(address) && !address.includes('%')) bytes = ipv6Bytes(address);
  else throw invalid('not an IPv4 or IPv6 address');

  let prefixLength = Number(prefix);
  if (prefixLength < 1 || prefixLength > bytes.length * 8) {
    throw invalid(`prefix length must be 1 to ${bytes.length * 8}`);
  }
  if (hasHostBits(bytes, prefixLength)) throw invalid('address has bits set past the prefix length');
  if (ipVersion === 4 && bytes.length === 16) throw invalid('IPv6 network in an ipVersion 4 database');
  if (ipVersion === 6 && bytes.length === 4) {
    // IPv4 networks live in the first /96 of an IPv6 tree (::a.b.c.d); readers find the IPv4
    // subtree by following 96 zero bits from the root.
    bytes = Buffer.concat([Buffer.alloc(12), bytes]);
    prefixLength += 96;
  }
  return { bytes, prefixLength };
}

/** For an address node:net already accepted as IPv6: '::' expanded and a dotted IPv4 tail included. */
function ipv6Bytes(address: string): Buffer {
  const groupsOf = (part: string): string[] => (part === '' ? [] : part.split(':').flatMap(ipv4TailToGroups));
  const [head = '', tail] = address.split('::');
  const headGroups = groupsOf(head);
  const tailGroups = tail === undefined ? [] : groupsOf(tail);
  const zeros = new Array<string>(8 - headGroups.length - tailGroups.length).fill('0');
  const bytes = Buffer.alloc(16);
  [...headGroups, ...zeros, ...tailGroups].forEach((group, i) => bytes.writeUInt16BE(parseInt(group, 16), i * 2));
  return bytes;
}

/** '1.2.3.4' as the two hex groups it stands for; any other group unchanged. */
function ipv4TailToGroups(group: string): string[] {
  if (!group.includes('.')) return [group];
  const [a = 0, b = 0, c = 0, d = 0] = group.split('.').map(Number);
  return [((a << 8) | b).toString(16), ((c << 8) | d).toString(16)];
}

function hasHostBits(bytes: Buffer, prefixLength: number): boolean {
  for (let i = prefixLength; i < bytes.length * 8; i++) {
    if (bitAt(bytes, i)) return true;
  }
  return false;
}

// ---------------------------------------------------------------------------------------------
// Data section encoding

const Type = {
  Utf8String: 2,
  Double: 3,
  Uint16: 5,
  Uint32: 6,
  Map: 7,
  Uint64: 9,
  Array: 11,
  Boolean: 14,
} as const;

function encodeValue(value: MmdbValue): Buffer {
  if (typeof value === 'string') return encodeString(value);
  if (typeof value === 'boolean') return controlBytes(Type.Boolean, value ? 1 : 0); // the value is the size
  if (typeof value === 'number') return encodeNumber(value);
  if (Array.isArray(value)) {
    return Buffer.concat([controlBytes(Type.Array, value.length), ...value.map(encodeValue)]);
  }
  return encodeMap(Object.entries(value).map(([key, item]) => [key, encodeValue(item)]));
}

function encodeString(value: string): Buffer {
  const bytes = Buffer.from(value, 'utf8');
  return Buffer.concat([controlBytes(Type.Utf8String, bytes.length), bytes]);
}

/**
 * Integers 0..2^32-1 as uint16/uint32; anything else (fractions, negatives, larger) as a double,
 * which reads back as the same JS number. (mmdb-lib reads a short int32 as unsigned, and a uint64
 * as a BigInt, so neither would round-trip.)
 */
function encodeNumber(value: number): Buffer {
  if (Number.isInteger(value) && value >= 0 && value <= 0xffff_ffff) {
    return encodeUint(value <= 0xffff ? Type.Uint16 : Type.Uint32, BigInt(value));
  }
  const bytes = Buffer.alloc(8);
  bytes.writeDoubleBE(value);
  return Buffer.concat([controlBytes(Type.Double, 8), bytes]);
}

/** Unsigned integers are big-endian with leading zero bytes dropped (0 has no payload at all). */
function encodeUint(type: number, value: bigint): Buffer {
  const bytes: number[] = [];
  for (let rest = value; rest > 0n; rest >>= 8n) bytes.unshift(Number(rest & 0xffn));
  return Buffer.concat([controlBytes(type, bytes.length), Buffer.from(bytes)]);
}

/** A map's size is its number of pairs; keys are strings. */
function encodeMap(entries: [string, Buffer][]): Buffer {
  return Buffer.concat([
    controlBytes(Type.Map, entries.length),
    ...entries.flatMap(([key, value]) => [encodeString(key), value]),
  ]);
}

/**
 * The control byte (3 bits type, 5 bits size), the extended type byte for types above 7, then
 * any extra size bytes: a size under 29 fits the 5 bits; 29, 30 and 31 say that 1, 2 or 3 bytes
 * follow, holding the size minus 29, 285 or 65,821.
 */
function controlBytes(type: number, size: number): Buffer {
  const extended = type > 7;
  const typeBits = (extended ? 0 : type) << 5;
  const extendedType = extended ? [type - 7] : [];
  let sizeBits: number;
  let sizeBytes: Buffer;
  if (size < 29) {
    sizeBits = size;
    sizeBytes = Buffer.alloc(0);
  } else if (size < 285) {
    sizeBits = 29;
    sizeBytes = Buffer.from([size - 29]);
  } else if (size < 65_821) {
    sizeBits = 30;
    sizeBytes = Buffer.alloc(2);
    sizeBytes.writeUInt16BE(size - 285);
  } else if (size < 65_821 + 2 ** 24) {
    sizeBits = 31;
    sizeBytes = Buffer.alloc(3);
    sizeBytes.writeUIntBE(size - 65_821, 0, 3);
  } else {
    throw new Error(`MMDB field too large: ${size}`);
  }
  return Buffer.concat([Buffer.from([typeBits | sizeBits, ...extendedType]), sizeBytes]);
}

function encodeMetadata(nodeCount: number, options: MmdbOptions): Buffer {
  return encodeMap([
    ['node_count', encodeValue(nodeCount)],
    ['record_size', encodeValue(RECORD_BYTES * 8)],
    ['ip_version', encodeValue(options.ipVersion)],
    ['database_type', encodeValue(options.databaseType)],
    ['languages', encodeValue([])],
    ['binary_format_major_version', encodeValue(2)],
    ['binary_format_minor_version', encodeValue(0)],
    ['build_epoch', encodeUint(Type.Uint64, BigInt(Math.floor(Date.now() / 1000)))],
    ['description', encodeValue({})],
  ]);
}
