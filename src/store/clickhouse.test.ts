import { execFile } from 'node:child_process';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { createLogger } from '../logger.ts';
import { connectClickHouse, linePages, writableChunks } from './clickhouse.ts';

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

describe("the client's own log", () => {
  const PASSWORD = 'pw-url-0123456789';
  const OTHER_PASSWORD = 'pw-env-0123456789';

  /** A server that fails every request with an error quoting the credentials it was sent. */
  async function failingServer(): Promise<{ url: string; close(): Promise<void> }> {
    const server = createServer((request, response) => {
      const credentials = Buffer.from((request.headers.authorization ?? '').replace(/^Basic /, ''), 'base64').toString();
      response.writeHead(500, { 'content-type': 'text/plain', 'x-clickhouse-exception-code': '516' });
      response.end(`Code: 516. DB::Exception: ${credentials}: Authentication failed. (AUTHENTICATION_FAILED)\n`);
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const { port } = server.address() as AddressInfo;
    return { url: `http://127.0.0.1:${port}`, close: () => new Promise((resolve) => server.close(() => resolve())) };
  }

  afterEach(() => {
    vi.restoreAllMocks();
  });

  async function logOf(level: string): Promise<{ records: Record<string, unknown>[]; text: string; console: number }> {
    const lines: string[] = [];
    const logger = createLogger(level, { write: (line: string) => void lines.push(line) });
    const console = [vi.spyOn(globalThis.console, 'error'), vi.spyOn(globalThis.console, 'warn'), vi.spyOn(globalThis.console, 'info')];
    for (const spy of console) spy.mockImplementation(() => undefined);
    const server = await failingServer();
    try {
      const url = new URL(server.url);
      url.username = 'worker';
      url.password = PASSWORD;
      const db = connectClickHouse({ url: url.href, username: 'default', password: OTHER_PASSWORD, dataDir: '/nonexistent', logger });
      await expect(db.queryRows('SELECT 1')).rejects.toThrow(/Authentication failed/);
      await db.close();
    } finally {
      await server.close();
    }
    const text = lines.join('');
    return { records: lines.map((line) => JSON.parse(line) as Record<string, unknown>), text, console: console.reduce((sum, spy) => sum + spy.mock.calls.length, 0) };
  }

  const requestErrors = (records: Record<string, unknown>[]) => records.filter((record) => /HTTP request error/.test(String(record.msg)));

  it("writes a failed request's own line at debug level (its caller logs the failure), as one JSON record without the password", async () => {
    const { records, text, console } = await logOf('debug');
    expect(console).toBe(0);
    const [failure, ...more] = requestErrors(records);
    expect(more).toEqual([]);
    expect(failure).toMatchObject({ level: 20, component: 'clickhouse', module: 'Connection', msg: 'Query: HTTP request error.' });
    expect(failure?.err).toMatchObject({ message: expect.stringContaining('Authentication failed') });
    expect(text).toContain('[REDACTED]');
    expect(text).not.toContain(PASSWORD);
    expect(text).not.toContain(OTHER_PASSWORD);
  });

  it("keeps the client's other lines at their level: its warnings show at info, its request failures do not", async () => {
    const { records, console } = await logOf('info');
    expect(console).toBe(0);
    expect(requestErrors(records)).toEqual([]);
    // The URL's credentials override the configured ones: said once each, at warn level.
    expect(records.filter((record) => record.level === 40).map((record) => record.msg)).toEqual(
      expect.arrayContaining(['"username" is overridden by a URL parameter.', '"password" is overridden by a URL parameter.']),
    );
  });

  it("writes the client's start-up notice of its own log level at debug, so that a start at info does not print it", async () => {
    const notice = (records: Record<string, unknown>[]) => records.filter((record) => /^Log level is set to /.test(String(record.msg)));
    expect(notice((await logOf('info')).records)).toEqual([]);
    expect(notice((await logOf('debug')).records)).toMatchObject([{ level: 20, component: 'clickhouse', module: 'Connection', msg: 'Log level is set to DEBUG' }]);
  });

  it('follows LOG_LEVEL', async () => {
    const atWarn = await logOf('warn');
    expect(atWarn.console).toBe(0);
    expect(atWarn.records.map((record) => record.level)).toEqual([40, 40]);
    const silent = await logOf('silent');
    expect(silent).toMatchObject({ records: [], console: 0 });
  });
});

describe('writableChunks', () => {
  it('joins runs of small chunks into buffers of about 1 MiB, passes large ones uncopied, and keeps every byte in order', () => {
    const small = (i: number) => Buffer.from(`${i}\t${'x'.repeat(300)}\n`);
    const large = Buffer.alloc(64 * 1024, 0x61);
    const chunks = [...Array.from({ length: 5000 }, (_, i) => small(i)), large, small(5000), small(5001)];
    const written = [...writableChunks(chunks)];
    expect(Buffer.concat(written).equals(Buffer.concat(chunks))).toBe(true);
    // 5,000 chunks of 306-309 bytes: one buffer per 1 MiB reached, the rest before the large chunk, then the last two joined.
    expect(written.map((chunk) => chunk.length >= 1 << 20)).toEqual([true, false, false, false]);
    expect(written[2]).toBe(large);
    const lone = small(1);
    expect([...writableChunks([lone])][0]).toBe(lone);
    expect([...writableChunks(lone)][0]).toBe(lone);
    expect([...writableChunks([])]).toEqual([]);
  });
});

describe('bulk inserts on the embedded engine', () => {
  // A quote and a backslash in DATA_DIR: the insert names its file in SQL.
  const dataDir = mkdtempSync(join(tmpdir(), "sc-it's-a\\dir-"));
  const insertsDir = join(dataDir, 'inserts');
  const leftover = join(insertsDir, 'insert-killed');
  mkdirSync(leftover, { recursive: true });
  writeFileSync(join(leftover, '7'), 'rows of a process killed mid-insert\n');
  // Bodies of 64 bytes or more are read from a file; smaller ones go inline.
  const db = connectClickHouse({ username: 'default', password: '', dataDir, fileInsertMinBytes: 64 });
  const table = 'bulk_insert_probe';
  const filesLeft = () => readdirSync(insertsDir).flatMap((dir) => readdirSync(join(insertsDir, dir)).map((file) => `${dir}/${file}`));

  beforeAll(async () => {
    await db.command(`CREATE TABLE ${table} (id UInt32, text String, ts DateTime64(3, 'UTC')) ENGINE = MergeTree ORDER BY id`);
  });

  afterAll(async () => {
    await db.close();
    rmSync(dataDir, { recursive: true, force: true, maxRetries: 5, retryDelay: 200 });
  });

  it('removes the insert files an earlier process left behind when it connects', () => {
    expect(readdirSync(insertsDir)).not.toContain('insert-killed');
  });

  it('stores every row of a TabSeparated body, escapes included, and keeps no file after', async () => {
    const body = Buffer.from("1\tplain\t2026-11-21 12:00:00.001\n2\ttab\\there, quote ' and é\t2026-11-21 12:00:00.002\n");
    await db.insert(table, ['id', 'text', 'ts'], body, 'TabSeparated');
    expect(await db.queryRows(`SELECT id, text, toString(ts) AS ts FROM ${table} ORDER BY id`)).toEqual([
      { id: 1, text: 'plain', ts: '2026-11-21 12:00:00.001' },
      { id: 2, text: "tab\there, quote ' and é", ts: '2026-11-21 12:00:00.002' },
    ]);
    expect(filesLeft()).toEqual([]);
  });

  it('stores a body of several chunks as one insert, views into larger buffers included, from a file or inline', async () => {
    const within = (text: string) => Buffer.from(`xx${text}yy`).subarray(2, -2);
    const columns = ['id', 'text', 'ts'];
    const fromFile = [within('10\tin a view of a larger buffer\t2026-11-21 12:00:00.010\n'), Buffer.from('11\tsecond\t2026-11-21 12:00:00.011\n')];
    await db.insert(table, columns, fromFile, 'TabSeparated');
    await db.insert(table, columns, [within('12\tone\t2026-11-21 12:00:00.012\n')], 'TabSeparated');
    const inline = [Buffer.from('13\tb\t2026-11-21 12:00:00.013\n'), within('14\tc\t2026-11-21 12:00:00.014\n')];
    expect([Buffer.concat(fromFile).length >= 64, Buffer.concat(inline).length < 64]).toEqual([true, true]);
    await db.insert(table, columns, inline, 'TabSeparated');
    await db.insert(table, columns, [], 'TabSeparated');
    // Thousands of one-row chunks (posts, a quiet partition's batches), and a large one among them.
    const many = Array.from({ length: 5000 }, (_, i) => Buffer.from(`${1000 + i}\tsmall\t2026-11-21 12:00:00.000\n`));
    const large = Buffer.from(Array.from({ length: 3000 }, (_, i) => `${7000 + i}\t${'large '.repeat(4)}\t2026-11-21 12:00:00.000\n`).join(''));
    expect(large.length).toBeGreaterThan(64 * 1024);
    await db.insert(table, columns, [...many.slice(0, 2500), large, ...many.slice(2500)], 'TabSeparated');
    expect(await db.queryRows(`SELECT count() AS rows, uniqExact(id) AS ids, min(id) AS low, max(id) AS high FROM ${table} WHERE id >= 1000`)).toEqual([
      { rows: 8000, ids: 8000, low: 1000, high: 9999 },
    ]);
    expect(await db.queryRows(`SELECT id, text FROM ${table} WHERE id BETWEEN 10 AND 14 ORDER BY id`)).toEqual([
      { id: 10, text: 'in a view of a larger buffer' },
      { id: 11, text: 'second' },
      { id: 12, text: 'one' },
      { id: 13, text: 'b' },
      { id: 14, text: 'c' },
    ]);
    expect(filesLeft()).toEqual([]);
  });

  it("applies an insert's settings to that insert alone", async () => {
    const body = Buffer.from('{"id":3,"text":"json, read from its file","ts":"2026-11-21 12:00:00.003"}\n');
    expect(body.length).toBeGreaterThanOrEqual(64);
    await db.insert(table, ['id', 'text', 'ts'], body, 'JSONEachRow', { optimize_on_insert: 0 });
    expect(await db.queryRows(`SELECT count() AS rows FROM ${table} WHERE id = 3`)).toEqual([{ rows: 1 }]);
    const [setting] = await db.queryRows<{ value: number }>(`SELECT getSetting('optimize_on_insert') AS value`);
    expect(Number(setting?.value)).toBe(1);
  });

  it("fails with the engine's error on a malformed body, stores none of it and keeps no file", async () => {
    const body = Buffer.from('4\tfine\t2026-11-21 12:00:00.004\nnot-a-number\tbad\t2026-11-21 12:00:00.005\n');
    await expect(db.insert(table, ['id', 'text', 'ts'], body, 'TabSeparated')).rejects.toThrow(/not-a-number|Cannot parse/);
    expect(await db.queryRows(`SELECT count() AS rows FROM ${table} WHERE id = 4`)).toEqual([{ rows: 0 }]);
    expect(filesLeft()).toEqual([]);
  });

  it('makes its directory again when another process removed it', async () => {
    const [own] = readdirSync(insertsDir);
    rmSync(join(insertsDir, own!), { recursive: true });
    await db.insert(table, ['id', 'text', 'ts'], Buffer.from('7\tread from a file in a directory made again\t2026-11-21 12:00:00.007\n'), 'TabSeparated');
    expect(await db.queryRows(`SELECT id FROM ${table} WHERE id = 7`)).toEqual([{ id: 7 }]);
    expect(readdirSync(insertsDir)).toEqual([own]);
  });

  it('reads a body of fileInsertMinBytes or more from its file, and takes a smaller one inline', async () => {
    // The connection's own directory of insert files replaced by a plain file: no insert file can be written.
    const [own] = readdirSync(insertsDir);
    const ownDir = join(insertsDir, own!);
    rmSync(ownDir, { recursive: true });
    writeFileSync(ownDir, '');
    try {
      await db.insert(table, ['id', 'text', 'ts'], Buffer.from('5\tinline\t2026-11-21 12:00:00.005\n'), 'TabSeparated');
      const large = Buffer.from('6\tlarge enough to be read from a file, so it fails\t2026-11-21 12:00:00.006\n');
      await expect(db.insert(table, ['id', 'text', 'ts'], large, 'TabSeparated')).rejects.toThrow(/EEXIST|ENOTDIR/);
    } finally {
      rmSync(ownDir);
      mkdirSync(ownDir);
    }
    expect(await db.queryRows(`SELECT id FROM ${table} WHERE id IN (5, 6)`)).toEqual([{ id: 5 }]);
  });
});
