/**
 * The ClickHouse connection: a server by URL, or the embedded engine (chdb) under DATA_DIR.
 * Contract: everything goes through one @clickhouse/client instance with the same pinned settings,
 * so code that passes on the embedded engine passes on a server. Bulk inserts differ by engine: a
 * server gets the bytes over HTTP; the embedded engine reads a large one from a file under
 * DATA_DIR/inserts (INSERT ... FROM INFILE), deleted once the insert returns, and takes a small one
 * inline (FILE_INSERT_MIN_BYTES says where and why). The engine takes rows from a file
 * faster, and for less CPU, than inline in the statement, as the client's generic insert and chdb's
 * own raw insert hand them over. Measured: 500k request events in 50k-row TabSeparated inserts, 2
 * cores, alternating runs: 254-324k rows/s from a file against 165-190k with the raw insert, at
 * 4.2-5.5 µs of CPU per row against 6.3-7.1 (the generic insert: 35-40k rows/s).
 * Request events, the bulk of every insert, travel as TabSeparated: the engine parses it about twice
 * as fast as JSONEachRow (measured: 142k vs 75k rows/s for the same 500k rows in 50k-row inserts,
 * embedded engine, 2 cores). Alerts and webhooks, few and nested, stay JSONEachRow.
 * chdb is loaded only for the embedded engine: loading it maps its native library (about 140 MB
 * resident), and on platforms without a chdb build it throws, so a worker with a server URL never
 * loads it. It is a CommonJS package, loaded with require, so connecting stays synchronous.
 */
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { mkdir, rm, writeFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { join, resolve } from 'node:path';
import { Readable } from 'node:stream';
import {
  ClickHouseLogLevel,
  createClient,
  type ClickHouseClient,
  type ClickHouseSettings,
  type Logger as ClientLogger,
  type LogParams,
} from '@clickhouse/client';
import type { ChdbConnection } from 'chdb/connection';
import { pino } from 'pino';
import type { Logger } from '../logger.ts';
import { settingsClause, sqlString } from './settings-clause.ts';

const require = createRequire(import.meta.url);

/** Settings the code relies on, pinned because the embedded engine's defaults differ from a server's. */
export const PINNED_SETTINGS: ClickHouseSettings = {
  async_insert: 0, // an insert has landed when it returns: offsets are committed after it
  date_time_input_format: 'basic', // rows carry 'YYYY-MM-DD hh:mm:ss.sss' in UTC
  date_time_output_format: 'simple', // and so do results: the stores parse that form (a profile's 'iso' would break them)
  output_format_json_quote_64bit_integers: 0, // counts and offsets come back as JSON numbers
  input_format_skip_unknown_fields: 0, // a column-name mistake fails loudly
  session_timezone: 'UTC', // DateTime64 parameters say 'UTC' all the same
  join_use_nulls: 0, // a row missing from a LEFT JOIN's right side reads as zeros (the views' repair relies on it)
};

/** Row formats the bulk insert accepts (both are raw-insert formats of the embedded engine too). */
export type RowFormat = 'JSONEachRow' | 'TabSeparated';

/** An insert's rows: one buffer, or several to be stored in order as one (a flush's batches, not copied into one). */
export type InsertBody = Uint8Array | readonly Uint8Array[];

function chunksOf(body: InsertBody): readonly Uint8Array[] {
  return body instanceof Uint8Array ? [body] : body;
}

function byteLengthOf(body: InsertBody): number {
  return chunksOf(body).reduce((bytes, chunk) => bytes + chunk.length, 0);
}

/** Chunks smaller than this are written joined with their small neighbours (writableChunks). */
const SMALL_CHUNK_BYTES = 64 * 1024;
const JOINED_CHUNK_BYTES = 1 << 20;

/**
 * A body's chunks as they are written: runs of small ones (a post's rows, a quiet partition's
 * batches) joined into buffers of about 1 MiB, so that a flush of thousands of small batches is not
 * written a few hundred bytes per call (each a trip to the thread pool, or a socket write); large
 * ones as they are, uncopied. Joined as they are written, so at most one joined buffer is alive.
 */
export function* writableChunks(body: InsertBody): Generator<Uint8Array> {
  let run: Uint8Array[] = [];
  let runBytes = 0;
  for (const chunk of chunksOf(body)) {
    if (chunk.length < SMALL_CHUNK_BYTES) {
      run.push(chunk);
      runBytes += chunk.length;
      if (runBytes < JOINED_CHUNK_BYTES) continue;
    }
    if (run.length > 0) yield run.length === 1 ? run[0]! : Buffer.concat(run, runBytes);
    if (chunk.length >= SMALL_CHUNK_BYTES) yield chunk;
    run = [];
    runBytes = 0;
  }
  if (run.length > 0) yield run.length === 1 ? run[0]! : Buffer.concat(run, runBytes);
}

type ClientConnection = NonNullable<NonNullable<Parameters<typeof createClient>[0]>['connection']>;

export interface ClickHouseOptions {
  url?: string;
  username: string;
  password: string;
  /** Embedded engine data directory, used when url is unset. */
  dataDir: string;
  /** Where the client's own log goes; without one it prints plain text to the console. */
  logger?: Logger;
  /** Embedded engine: bulk inserts of this many bytes or more are read from a file (default FILE_INSERT_MIN_BYTES). */
  fileInsertMinBytes?: number;
}

/**
 * From this size on, the embedded engine reads a bulk insert from a file; a smaller one goes inline
 * (chdb's raw insert). Reading a file costs about 2.5 ms more per insert and less per row: measured
 * with 180-byte rows, 1 row 4.3-5.4 ms from a file against 2.2-2.7 ms inline, 3,000 rows 6.6-7.4
 * against 5.2-6.4 ms; the two are even at about 5,000 rows (1 MB). For 50k-row inserts, see above.
 */
export const FILE_INSERT_MIN_BYTES = 1 << 20;

export interface ClickHouse {
  readonly client: ClickHouseClient;
  readonly kind: 'server' | 'embedded';
  /**
   * Inserts rows (one per line, in `format`, values in `columns` order; the body's chunks in order,
   * as one insert) into a table; `settings`
   * apply to this insert (and the materialized views it feeds) on top of the pinned ones.
   * `signal` gives up on it: a server's request is aborted (the server may still have stored the
   * rows if it had the whole body); the embedded engine's native write cannot be stopped, so the
   * promise settles early (an inline insert) or the signal is ignored (an insert from a file, whose
   * file must outlive the write). Either way the caller cannot tell whether the rows landed.
   */
  insert(table: string, columns: readonly string[], body: InsertBody, format: RowFormat, settings?: ClickHouseSettings, signal?: AbortSignal): Promise<void>;
  /** Runs a query and returns its rows (JSONEachRow). */
  queryRows<T = Record<string, unknown>>(query: string, params?: Record<string, unknown>): Promise<T[]>;
  /**
   * Runs a query and hands its rows (JSONEachRow) to `onPage` in pages of at most `pageSize`, each
   * awaited before the next is decoded: a large result never sits on the heap whole. (The embedded
   * engine returns the result as one buffer, outside the heap; a server streams it.)
   */
  queryPages<T = Record<string, unknown>>(query: string, params: Record<string, unknown>, pageSize: number, onPage: (rows: T[]) => Promise<void>): Promise<void>;
  /**
   * Runs a statement. A statement that needs settings of its own carries them in its SETTINGS clause
   * (settingsClause): the embedded engine would SET settings given to the client on its session, for
   * every later query of this process (a repair's insert_deduplication_token made every later insert
   * without a token of its own, such as detection's alert writes, a repeat to be dropped).
   */
  command(query: string, params?: Record<string, unknown>): Promise<void>;
  ping(): Promise<boolean>;
  close(): Promise<void>;
}

export function connectClickHouse(options: ClickHouseOptions): ClickHouse {
  if (options.url) {
    const client = createClient({
      url: options.url,
      username: options.username,
      password: options.password,
      clickhouse_settings: PINNED_SETTINGS,
      request_timeout: 60_000,
      log: options.logger && clientLog(options.logger, secretsOf(options)),
    });
    return wrap(client, 'server', async (table, columns, body, format, settings, signal) => {
      const result = await client.exec({
        query: `INSERT INTO ${table} (${columns.join(', ')}) FORMAT ${format}`,
        values: Readable.from(writableChunks(body), { objectMode: false }),
        clickhouse_settings: settings,
        abort_signal: signal,
      });
      result.stream.resume();
    });
  }
  const path = resolve(options.dataDir, 'clickhouse');
  mkdirSync(path, { recursive: true });
  const { createChdbConnection } = require('chdb/connection') as typeof import('chdb/connection');
  let connection: ChdbConnection;
  try {
    connection = createChdbConnection({ path });
  } catch (error) {
    throw engineHolder(path) ?? error;
  }
  // chdb declares the same Connection interface against its own copy of client-common's types.
  const client = createClient({
    connection: connection as unknown as ClientConnection,
    clickhouse_settings: PINNED_SETTINGS,
    log: options.logger && clientLog(options.logger, []),
  });
  const inserts = insertFiles(resolve(options.dataDir, 'inserts'));
  const fileInsertMinBytes = options.fileInsertMinBytes ?? FILE_INSERT_MIN_BYTES;
  return wrap(client, 'embedded', async (table, columns, body, format, settings, signal) => {
    if (byteLengthOf(body) < fileInsertMinBytes) {
      const values = Buffer.concat(chunksOf(body)); // under fileInsertMinBytes: a small copy
      // Aborted, it settles at once; the native write still runs to its end (the body stays pinned).
      await connection.chdb.rawInsert({ table, columns: [...columns], format, values, settings: { ...PINNED_SETTINGS, ...settings } as Record<string, string | number | boolean>, signal });
      return;
    }
    // No signal here: settled early, the finally below would delete the file the engine still reads.
    const file = await inserts.write(body);
    try {
      // The insert's own settings in its SETTINGS clause: the client's clickhouse_settings would be
      // SET on the engine's session, and stay in force for every later query.
      await client.command({ query: `INSERT INTO ${table} (${columns.join(', ')}) FROM INFILE ${sqlString(file)}${settingsClause(settings)} FORMAT ${format}` });
    } finally {
      await inserts.remove(file);
    }
  });
}

/**
 * The embedded engine's directory is locked by another live process (a second worker started on the
 * same DATA_DIR): chdb then fails with a bare "Failed to create connection" and prints the reason
 * ("Cannot lock file .../status") to stderr only.
 */
export class StorageDirectoryInUse extends Error {
  constructor(
    readonly path: string,
    readonly pid: number,
  ) {
    super(`in use by another process (PID ${pid}) whose embedded ClickHouse engine holds ${path}: run one worker per directory`);
    this.name = 'StorageDirectoryInUse';
  }
}

/**
 * Who holds the engine's directory, read from the `status` file the engine writes when it takes the
 * lock (and leaves behind when it exits): another process that is still alive, or undefined.
 */
function engineHolder(path: string): StorageDirectoryInUse | undefined {
  let status: string;
  try {
    status = readFileSync(join(path, 'status'), 'utf8');
  } catch {
    return undefined;
  }
  const pid = Number(/^PID: (\d+)$/m.exec(status)?.[1]);
  if (!Number.isSafeInteger(pid) || pid <= 0 || pid === process.pid) return undefined;
  try {
    process.kill(pid, 0);
  } catch (error) {
    // EPERM: alive, but another user's.
    if ((error as NodeJS.ErrnoException).code !== 'EPERM') return undefined;
  }
  return new StorageDirectoryInUse(path, pid);
}

/** Directories of insert files this process made (a process may connect more than once). */
const ownInsertDirs = new Set<string>();

/**
 * Files for the embedded engine's bulk inserts, in a directory of this connection's own under
 * `root`. Directories left by an earlier process (killed mid-insert) are removed on connect; a
 * directory removed under a live connection (a second process started on the same DATA_DIR by
 * mistake) is made again at its next insert.
 */
function insertFiles(root: string): { write(body: InsertBody): Promise<string>; remove(file: string): Promise<void> } {
  mkdirSync(root, { recursive: true });
  for (const entry of readdirSync(root)) {
    const dir = join(root, entry);
    if (!ownInsertDirs.has(dir)) rmSync(dir, { recursive: true, force: true });
  }
  const dir = mkdtempSync(join(root, 'insert-'));
  ownInsertDirs.add(dir);
  let sequence = 0;
  return {
    async write(body) {
      await mkdir(dir, { recursive: true });
      const file = join(dir, `${++sequence}`);
      await writeFile(file, writableChunks(body), { mode: 0o600 });
      return file;
    },
    remove: (file) => rm(file, { force: true }),
  };
}

/** The passwords a client may come to hold: CLICKHOUSE_PASSWORD and the URL's, as given and decoded. */
function secretsOf(options: ClickHouseOptions): string[] {
  const fromUrl = options.url ? new URL(options.url).password : '';
  const secrets = [options.password, fromUrl];
  try {
    secrets.push(decodeURIComponent(fromUrl));
  } catch {
    // not percent-encoding: the password as given is the one
  }
  return [...new Set(secrets.filter((secret) => secret.length > 0))];
}

/** Client log levels by pino level: the client does no work for records pino would drop. */
const CLIENT_LOG_LEVELS: Record<string, ClickHouseLogLevel> = {
  trace: ClickHouseLogLevel.TRACE,
  debug: ClickHouseLogLevel.DEBUG,
  info: ClickHouseLogLevel.INFO,
  warn: ClickHouseLogLevel.WARN,
  error: ClickHouseLogLevel.ERROR,
  fatal: ClickHouseLogLevel.OFF,
  silent: ClickHouseLogLevel.OFF,
};

/**
 * The client's per-request failure line ("Query: HTTP request error."): the caller gets the same
 * error and logs the failure it acts on, once while it lasts; at error level this line alone came
 * to hundreds a minute while a server was down.
 */
const REQUEST_ERROR = /: HTTP request error\.$/;

/**
 * The client's notice of its own log level, at info each time a client is made ("Log level is set to
 * INFO"): it says nothing LOG_LEVEL does not, so it is written at debug.
 */
const LOG_LEVEL_NOTICE = /^Log level is set to [A-Z]+$/;

/**
 * The client's own log, as records of `logger` at the same level (one JSON line each, where the
 * client's default prints several lines of plain text), but its per-request failure lines and its
 * log-level notice at debug (REQUEST_ERROR, LOG_LEVEL_NOTICE). What it logs (a message, arguments
 * such as query ids and settings, an error that may quote the server's answer) carries no password
 * that we know of; any of `secrets` found in it all the same is replaced by [REDACTED].
 */
function clientLog(logger: Logger, secrets: readonly string[]): { LoggerClass: new () => ClientLogger; level: ClickHouseLogLevel } {
  const redact = (text: string) => secrets.reduce((redacted, secret) => redacted.replaceAll(secret, '[REDACTED]'), text);
  const scrub = (value: unknown): unknown => {
    if (typeof value === 'string') return redact(value);
    if (Array.isArray(value)) return value.map(scrub);
    if (value && typeof value === 'object') return Object.fromEntries(Object.entries(value).map(([key, item]) => [key, scrub(item)]));
    return value;
  };
  const out = logger.child({ component: 'clickhouse' }, { serializers: { err: (error: Error) => scrub(pino.stdSerializers.err(error)) } });
  const write =
    (level: 'trace' | 'debug' | 'info' | 'warn' | 'error') =>
    ({ module, message, args, err }: LogParams & { err?: Error }): void => {
      if (!out.isLevelEnabled(level)) return;
      out[level]({ module, ...(args && { args: scrub(args) }), ...(err && { err }) }, redact(message));
    };
  const writeDebug = write('debug');
  const writeInfo = write('info');
  const writeError = write('error');
  class PinoLogger implements ClientLogger {
    trace = write('trace');
    debug = writeDebug;
    info = (params: LogParams) => (LOG_LEVEL_NOTICE.test(params.message) ? writeDebug : writeInfo)(params);
    warn = write('warn');
    error = (params: LogParams & { err?: Error }) => (REQUEST_ERROR.test(params.message) ? writeDebug : writeError)(params);
  }
  return { LoggerClass: PinoLogger, level: CLIENT_LOG_LEVELS[logger.level] ?? ClickHouseLogLevel.WARN };
}

function wrap(
  client: ClickHouseClient,
  kind: ClickHouse['kind'],
  insert: ClickHouse['insert'],
): ClickHouse {
  return {
    client,
    kind,
    insert: (table, columns, body, format, settings, signal) => (byteLengthOf(body) === 0 ? Promise.resolve() : insert(table, columns, body, format, settings, signal)),
    async queryRows<T>(query: string, params?: Record<string, unknown>) {
      const result = await client.query({ query, query_params: params, format: 'JSONEachRow' });
      return result.json<T>();
    },
    async queryPages<T>(query: string, params: Record<string, unknown>, pageSize: number, onPage: (rows: T[]) => Promise<void>) {
      // exec, not query: ResultSet.stream() decodes a whole chunk into row strings at once, and the
      // embedded engine's result is a single chunk.
      const result = await client.exec({ query: `${query}\nFORMAT JSONEachRow`, query_params: params });
      for await (const texts of linePages(result.stream, pageSize)) await onPage(texts.map((text) => JSON.parse(text) as T));
    },
    async command(query, params) {
      await client.command({ query, query_params: params });
    },
    async ping() {
      const result = await client.ping();
      return result.success;
    },
    close: () => client.close(),
  };
}

/**
 * The lines of a byte stream (UTF-8, newline-terminated), in pages of at most `pageSize`; only the
 * page in hand is decoded. A last line without its newline still counts.
 */
export async function* linePages(stream: AsyncIterable<Buffer>, pageSize: number): AsyncGenerator<string[]> {
  let page: string[] = [];
  let rest: Buffer | undefined;
  for await (const chunk of stream) {
    const bytes = rest ? Buffer.concat([rest, chunk]) : chunk;
    let start = 0;
    for (let end = bytes.indexOf(NEWLINE); end !== -1; end = bytes.indexOf(NEWLINE, start)) {
      page.push(bytes.toString('utf8', start, end));
      start = end + 1;
      if (page.length >= pageSize) {
        yield page;
        page = [];
      }
    }
    rest = start < bytes.length ? bytes.subarray(start) : undefined;
  }
  if (rest) page.push(rest.toString('utf8'));
  if (page.length > 0) yield page;
}
const NEWLINE = 0x0a;
