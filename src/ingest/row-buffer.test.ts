import { describe, expect, it } from 'vitest';
import { RowBuffer } from './row-buffer.ts';

describe('RowBuffer', () => {
  it('keeps rows newline-terminated, in order, across growth, with multi-byte text intact', () => {
    const buffer = new RowBuffer(8);
    const rows = ['{"a":1}', '{"b":"é😀"}', '{"c":"' + 'x'.repeat(100) + '"}'];
    for (const row of rows) buffer.append(row);
    expect(buffer.rows).toBe(3);
    expect(buffer.bytes().toString('utf8')).toBe(rows.map((row) => `${row}\n`).join(''));
  });

  it('is empty until a row is appended, and again once cleared', () => {
    expect(new RowBuffer().bytes().length).toBe(0);
    const buffer = new RowBuffer(8);
    buffer.append('a row');
    buffer.clear();
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

  it('removes rows by byte range and keeps the others in order', () => {
    const buffer = new RowBuffer(8);
    const ranges = ['a1', 'b22', 'c333', 'd4444', 'e55555'].map((row) => {
      const start = buffer.byteLength;
      buffer.append(row);
      return { start, end: buffer.byteLength, rows: 1 };
    });
    buffer.remove([ranges[1]!, ranges[3]!, ranges[4]!]);
    expect(buffer.rows).toBe(2);
    expect(buffer.bytes().toString('utf8')).toBe('a1\nc333\n');
    buffer.append('f6');
    expect(buffer.bytes().toString('utf8')).toBe('a1\nc333\nf6\n');
  });

  it('hands its rows to another thread by moving them, however small: its memory is its own, not the shared Buffer pool', () => {
    const { port1, port2 } = new MessageChannel();
    try {
      for (const initialBytes of [8, 1024]) {
        const buffer = new RowBuffer(initialBytes);
        buffer.append('a row');
        const rows = buffer.bytes();
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
