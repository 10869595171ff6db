import { describe, expect, it } from 'vitest';
import { linePages } from './clickhouse.ts';

async function* chunks(...parts: (string | Buffer)[]): AsyncGenerator<Buffer> {
  for (const part of parts) yield Buffer.isBuffer(part) ? part : Buffer.from(part);
}

async function pagesOf(stream: AsyncIterable<Buffer>, pageSize: number): Promise<string[][]> {
  const pages: string[][] = [];
  for await (const page of linePages(stream, pageSize)) pages.push(page);
  return pages;
}

describe('linePages', () => {
  it('splits lines across chunk boundaries into pages of at most pageSize', async () => {
    const pages = await pagesOf(chunks('{"a":1}\n{"a"', ':2}\n', '{"a":3}\n{"a":4}\n{"a":5}\n'), 2);
    expect(pages).toEqual([['{"a":1}', '{"a":2}'], ['{"a":3}', '{"a":4}'], ['{"a":5}']]);
  });

  it('decodes a character whose bytes are split between two chunks', async () => {
    const bytes = Buffer.from('{"ua":"Zoë ✓"}\n');
    const split = bytes.indexOf(0xc3) + 1; // inside the two bytes of ë
    const pages = await pagesOf(chunks(bytes.subarray(0, split), bytes.subarray(split)), 10);
    expect(pages).toEqual([['{"ua":"Zoë ✓"}']]);
  });

  it('keeps a last line without its newline, and yields nothing for an empty stream', async () => {
    expect(await pagesOf(chunks('one\ntwo'), 10)).toEqual([['one', 'two']]);
    expect(await pagesOf(chunks(), 10)).toEqual([]);
    expect(await pagesOf(chunks(''), 10)).toEqual([]);
  });

  it('decodes only the page in hand: a consumer that stops early leaves the rest unread', async () => {
    let pulled = 0;
    async function* counted(): AsyncGenerator<Buffer> {
      for (let i = 0; i < 100; i++) {
        pulled++;
        yield Buffer.from(`line ${i}\n`);
      }
    }
    for await (const page of linePages(counted(), 5)) {
      expect(page).toHaveLength(5);
      break;
    }
    expect(pulled).toBe(5);
  });
});
