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
});
