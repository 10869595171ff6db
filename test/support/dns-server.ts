/**
 * A DNS server on loopback UDP for tests: answers A and AAAA queries for the names it is given, and
 * nothing else (an empty answer). Just enough of RFC 1035 for c-ares's queries.
 */
import { createSocket } from 'node:dgram';
import { parseAddress } from '../../src/webhooks/target-policy.ts';

const TYPE_A = 1;
const TYPE_AAAA = 28;

export interface DnsServer {
  /** 127.0.0.1:<port>, for Resolver.setServers. */
  readonly address: string;
  /** Queries received, as "<name> <type>". */
  readonly queries: string[];
  close(): Promise<void>;
}

/** `unanswered`: query types it never answers (a server that drops AAAA queries: 28). */
export async function startDnsServer(records: Record<string, string[]>, options: { unanswered?: number[] } = {}): Promise<DnsServer> {
  const socket = createSocket('udp4');
  const queries: string[] = [];
  socket.on('message', (query, from) => {
    const { name, type, end } = question(query);
    queries.push(`${name} ${type}`);
    if (options.unanswered?.includes(type)) return;
    const wanted = (records[name] ?? []).map(parseAddress).filter((bytes) => bytes?.length === (type === TYPE_A ? 4 : type === TYPE_AAAA ? 16 : -1)) as Uint8Array[];
    const header = Buffer.alloc(12);
    query.copy(header, 0, 0, 2); // the query's id
    header.writeUInt16BE(0x8180, 2); // a response, recursion desired and available, no error
    header.writeUInt16BE(1, 4); // one question
    header.writeUInt16BE(wanted.length, 6);
    const answers = wanted.map((bytes) => {
      const answer = Buffer.alloc(12);
      answer.writeUInt16BE(0xc00c, 0); // the name: a pointer to the question's
      answer.writeUInt16BE(type, 2);
      answer.writeUInt16BE(1, 4); // class IN
      answer.writeUInt32BE(60, 6); // TTL
      answer.writeUInt16BE(bytes.length, 10);
      return Buffer.concat([answer, bytes]);
    });
    socket.send(Buffer.concat([header, query.subarray(12, end), ...answers]), from.port, from.address);
  });
  await new Promise<void>((resolve) => socket.bind(0, '127.0.0.1', resolve));
  return {
    address: `127.0.0.1:${socket.address().port}`,
    queries,
    close: () => new Promise((resolve) => socket.close(() => resolve())),
  };
}

/** The first question's name (lower case, without the root dot) and type, and where it ends. */
function question(query: Buffer): { name: string; type: number; end: number } {
  const labels: string[] = [];
  let at = 12;
  while (query[at]! > 0) {
    labels.push(query.toString('latin1', at + 1, at + 1 + query[at]!));
    at += 1 + query[at]!;
  }
  return { name: labels.join('.').toLowerCase(), type: query.readUInt16BE(at + 1), end: at + 5 };
}
