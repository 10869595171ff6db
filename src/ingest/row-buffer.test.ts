import { describe, expect, it } from 'vitest';
import { RowBuffer, RowChunks } from './row-buffer.ts';

describe('RowBuffer', () => {
  it('keeps rows newline-terminated, in order, across growth, with multi-byte text intact', () => {
    const buffer = new RowBuffer(8);
    const rows = ['{"a":1}', '{"b":"é😀"}', '{"c":"' + 'x'.repeat(100) + '"}'];
    for (const row of rows) buffer.append(row);
    expect(buffer.rows).toBe(3);
    expect(buffer.bytes().toString('utf8')).toBe(rows.map((row) => `${row}\n`).join(''));
  });

  it('is empty until a row is appended', () => {
    const buffer = new RowBuffer(8);
    expect([buffer.rows, buffer.byteLength, buffer.bytes().length]).toEqual([0, 0, 0]);
    buffer.append('b');
    expect(buffer.bytes().toString('utf8')).toBe('b\n');
  });

  it('takes a row written into its reservation, and refuses one that ran past it', () => {
    const buffer = new RowBuffer(4);
    let at = buffer.reserveRow(10);
    buffer.target.write('0123456789', at, 'latin1');
    buffer.commitRow(at + 10);
    at = buffer.reserveRow(3);
    expect(() => buffer.commitRow(at + 4)).toThrow(/outside its reservation/);
    expect(buffer.bytes().toString('latin1')).toBe('0123456789\n');
    expect(buffer.rows).toBe(1);
  });

  it('trims its rows into memory of their size when it has much more room than they take, and only then', () => {
    const roomy = new RowBuffer(65_536);
    roomy.append('a row');
    const trimmed = roomy.trimmedBytes();
    expect([trimmed.toString('utf8'), trimmed.buffer.byteLength]).toEqual(['a row\n', 6]);
    // Trimmed past max(4 KiB, a quarter of the rows) of room, not at it.
    for (const [rowBytes, room, trims] of [[99, 4096, false], [99, 4097, true], [40_000, 10_000, false], [40_000, 10_001, true]] as const) {
      const buffer = new RowBuffer(rowBytes + room);
      const at = buffer.reserveRow(rowBytes - 1); // exactly: append() makes room for its worst case
      buffer.target.fill(0x78, at, at + rowBytes - 1);
      buffer.commitRow(at + rowBytes - 1);
      expect(buffer.trimmedBytes().buffer === buffer.target.buffer, `${rowBytes} bytes of rows, ${room} of room`).toBe(!trims);
    }
  });

  it('hands its rows to another thread by moving them, however small: its memory is its own, not the shared Buffer pool', () => {
    const { port1, port2 } = new MessageChannel();
    try {
      for (const initialBytes of [8, 1024, 65_536]) {
        const buffer = new RowBuffer(initialBytes);
        buffer.append('a row');
        const rows = buffer.trimmedBytes(); // a copy from the roomiest, the buffer's own memory from the others
        // A pooled ArrayBuffer is copied instead (Node 20) or refused (Node 22 and later).
        port1.postMessage(rows, [rows.buffer as ArrayBuffer]);
        expect(rows.buffer.byteLength, `initial ${initialBytes} bytes`).toBe(0);
      }
    } finally {
      port1.close();
      port2.close();
    }
  });
});

describe('RowChunks', () => {
  /** Chunks of rows appended one call each, with the byte range each took. */
  function chunksOf(rows: readonly string[][]) {
    const chunks = new RowChunks();
    const ranges = rows.map((lines) => {
      const start = chunks.byteLength;
      chunks.appendLines(lines);
      return { start, end: chunks.byteLength, rows: lines.length };
    });
    return { chunks, ranges };
  }
  const text = (chunks: RowChunks) => Buffer.concat(chunks.bytes()).toString('utf8');

  it('keeps encoded rows as the very buffers given, in order, and encodes lines, multi-byte text intact', () => {
    const chunks = new RowChunks();
    const batch = Buffer.from('1\n2\n');
    chunks.appendEncoded(batch, 2);
    chunks.appendLines(['é😀', 'x'.repeat(100)]);
    chunks.appendEncoded(new Uint8Array(0), 0);
    chunks.appendLines([]);
    expect(chunks.bytes()).toHaveLength(2);
    expect(chunks.bytes()[0]).toBe(batch);
    expect(chunks.bytes()[1]!.buffer.byteLength).toBe(Buffer.byteLength(`é😀\n${'x'.repeat(100)}\n`)); // memory of the lines' size
    expect(text(chunks)).toBe(`1\n2\né😀\n${'x'.repeat(100)}\n`);
    expect([chunks.rows, chunks.byteLength]).toEqual([4, Buffer.byteLength(text(chunks))]);
  });

  it('removes the rows of whole appends by byte range, leaving a view taken before whole', () => {
    const { chunks, ranges } = chunksOf([['a1'], ['b22', 'b2'], ['c333'], ['d4444'], ['e5', 'e55']]);
    const before = chunks.bytes();
    chunks.remove([ranges[1]!, ranges[3]!, ranges[4]!]);
    expect(text(chunks)).toBe('a1\nc333\n');
    expect([chunks.rows, chunks.byteLength]).toEqual([2, 8]);
    expect(Buffer.concat(before).toString('utf8')).toBe('a1\nb22\nb2\nc333\nd4444\ne5\ne55\n');
    chunks.appendLines(['f6']);
    expect(text(chunks)).toBe('a1\nc333\nf6\n');
  });

  it('removes rows a range takes from inside or across chunks, keeping the rest of those chunks', () => {
    const { chunks, ranges } = chunksOf([['a1'], ['b22'], ['c333', 'c4', 'c55'], ['d6']]);
    const c4 = { start: ranges[2]!.start + 5, end: ranges[2]!.start + 8, rows: 1 };
    chunks.remove([{ start: ranges[0]!.start, end: ranges[1]!.end, rows: 2 }, c4]);
    expect(text(chunks)).toBe('c333\nc55\nd6\n');
    expect([chunks.rows, chunks.byteLength]).toEqual([3, 12]);
    const { chunks: across, ranges: acrossRanges } = chunksOf([['a1', 'a2'], ['b3', 'b4']]);
    across.remove([{ start: acrossRanges[0]!.start + 3, end: acrossRanges[1]!.start + 3, rows: 2 }]);
    expect(text(across)).toBe('a1\nb4\n');
    expect(across.rows).toBe(2);
  });

  it('gives a list of its chunks that later appends and removals leave as it was', () => {
    const { chunks, ranges } = chunksOf([['a1'], ['b2']]);
    const taken = chunks.bytes();
    chunks.appendLines(['c3']);
    chunks.remove([ranges[0]!]);
    expect(Buffer.concat(taken).toString('utf8')).toBe('a1\nb2\n');
    expect(text(chunks)).toBe('b2\nc3\n');
  });
});
