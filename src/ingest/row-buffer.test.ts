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

  it('is empty until a row is appended', () => {
    expect(new RowBuffer().bytes().length).toBe(0);
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
});
