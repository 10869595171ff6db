import { execFile } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
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

describe('connectClickHouse', () => {
  /**
   * Connects in a fresh process (to `url`, or the embedded engine) and reports what of chdb that
   * process holds: its JavaScript modules, and the native library's mappings (Linux).
   */
  async function chdbLoadedBy(url: string | undefined): Promise<{ modules: string[]; mappings: number }> {
    const dir = mkdtempSync(join(tmpdir(), 'sc-chdb-probe-'));
    try {
      const script = join(dir, 'probe.mts');
      writeFileSync(
        script,
        `import { createRequire } from 'node:module';
         import { existsSync, readFileSync } from 'node:fs';
         const { connectClickHouse } = await import(${JSON.stringify(new URL('./clickhouse.ts', import.meta.url).href)});
         const db = connectClickHouse({ url: ${JSON.stringify(url)}, username: 'default', password: '', dataDir: ${JSON.stringify(dir)} });
         const modules = Object.keys(createRequire(import.meta.url).cache).filter((path) => /[\\/]@?chdb[\\/]/.test(path));
         const maps = existsSync('/proc/self/maps') ? readFileSync('/proc/self/maps', 'utf8') : '';
         console.log(JSON.stringify({ modules, mappings: maps.split('\\n').filter((line) => line.includes('chdb')).length }));
         await db.close();`,
      );
      const root = fileURLToPath(new URL('../..', import.meta.url));
      const { stdout } = await promisify(execFile)(process.execPath, ['--import', 'tsx', script], { cwd: root, timeout: 60_000 });
      return JSON.parse(stdout.trim().split('\n').at(-1)!);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }

  it('loads no part of the embedded engine for a server URL', async () => {
    expect(await chdbLoadedBy('http://127.0.0.1:1')).toEqual({ modules: [], mappings: 0 });
  });

  it('loads the embedded engine without a URL (the probe sees it)', async () => {
    const loaded = await chdbLoadedBy(undefined);
    expect(loaded.modules.length).toBeGreaterThan(0);
    if (process.platform === 'linux') expect(loaded.mappings).toBeGreaterThan(0);
  });
});

describe('queries of src/store', () => {
  it('declare every DateTime64 parameter in UTC, whatever the session time zone', () => {
    const dir = fileURLToPath(new URL('.', import.meta.url));
    const undeclared = readdirSync(dir)
      .filter((name) => name.endsWith('.ts') && !name.endsWith('.test.ts'))
      .flatMap((name) => (readFileSync(join(dir, name), 'utf8').match(/\{\w+:DateTime64\([^)]*\)\}/g) ?? []).map((param) => `${name}: ${param}`))
      .filter((param) => !param.endsWith(":DateTime64(3, 'UTC')}"));
    expect(undeclared).toEqual([]);
  });
});
