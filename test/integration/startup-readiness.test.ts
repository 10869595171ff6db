/**
 * /ready while start-up steps are retried, on the real ClickHouse engine (and the real broker),
 * with reads failing at the storage boundary: a worker whose open alerts cannot be loaded would
 * open a second alert where one is open, so it answers 503 saying so until they are loaded; a
 * webhook dispatcher that cannot start holds back neither intake nor readiness (it is needed for
 * delivery only, and is retried beside them). Events posted meanwhile: without Kafka refused with 503
 * until detection has started (stored earlier, they would be judged by no one if the worker stopped
 * first), then judged as continuing the open alert; with Kafka produced to the topic, and stored
 * and judged once the consumer has started. A stop during start-up ends it before its next step;
 * an analysis thread that dies turns /ready to 503 and posts away. A setting the worker cannot
 * start with stops the process at once: exit 2, every problem named; started in-process, it
 * rejects and releases its thread and storage client.
 */
import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import type { Worker as ThreadWorker } from 'node:worker_threads';
import { afterAll, describe, expect, it, vi } from 'vitest';
import type { Config } from '../../src/config.ts';
import { createLogger } from '../../src/logger.ts';
import { startWorker, type Worker, type WorkerDeps } from '../../src/main.ts';
import type { ClickHouse } from '../../src/store/clickhouse.ts';
import { useEngines } from '../support/engines.ts';
import { makeEvent } from '../support/events.ts';
import { freePort } from '../support/ports.ts';
import { spawnWorker } from '../support/process.ts';
import { readiness, TEST_INGEST_TOKEN, testConfig, testNames, waitFor } from '../support/worker.ts';

// Every analysis thread made, so that a test can end one as a native fault or an exhausted heap would.
const analysisThreads = vi.hoisted(() => [] as ThreadWorker[]);
vi.mock('node:worker_threads', async (importOriginal) => {
  const actual = await importOriginal<typeof import('node:worker_threads')>();
  class RecordedWorker extends actual.Worker {
    constructor(...args: ConstructorParameters<typeof actual.Worker>) {
      super(...args);
      analysisThreads.push(this);
    }
  }
  return { ...actual, default: { ...actual, Worker: RecordedWorker }, Worker: RecordedWorker };
});

/** Storage whose reads that contain `marker` fail while `failing()` says so; counts the failed and the answered ones. */
function failingReads(marker: string, failing: () => boolean) {
  const reads = { failed: 0, answered: 0 };
  const wrapClickHouse = (db: ClickHouse): ClickHouse => ({
    ...db,
    queryRows: async <T,>(query: string, params?: Record<string, unknown>) => {
      if (!query.includes(marker)) return db.queryRows<T>(query, params);
      if (failing()) {
        reads.failed++;
        throw new Error('injected: storage cannot be read');
      }
      const rows = await db.queryRows<T>(query, params);
      reads.answered++;
      return rows;
    },
  });
  return { reads, wrapClickHouse };
}

/** An attack tool's request: a critical bot_traffic alert at once. */
function attackToolRequest(apiKeyId: string) {
  return { eventId: `evt_${randomUUID()}`, timestamp: new Date().toISOString(), merchantId: 'm_posted', plan: 'business', apiKeyId, environment: 'live', ip: '198.51.100.23', userAgent: 'sqlmap/1.7.2#stable (https://sqlmap.org)', method: 'GET', path: '/v1/verify/sessions/:id', status: 404, responseTimeMs: 12, country: 'DE' };
}

function postEvents(url: string, events: readonly unknown[]): Promise<Response> {
  return fetch(`${url}/v1/ingest/events`, { method: 'POST', headers: { authorization: `Bearer ${TEST_INGEST_TOKEN}`, 'content-type': 'application/json' }, body: JSON.stringify(events) });
}

describe('/ready while start-up steps are retried', () => {
  const engines = useEngines();

  // Not through engines.startWorker: that waits for `ready`, which is what is held back here.
  function start(config: Config, deps: WorkerDeps): Promise<Worker> {
    return startWorker(config, { logger: createLogger(process.env.TEST_LOG_LEVEL ?? 'silent'), ...deps });
  }

  it('answers 503 naming the open alerts until they can be loaded, then 200', async () => {
    let unreadable = true;
    const { reads, wrapClickHouse } = failingReads("WHERE status IN ('open', 'acknowledged') OR updated_at", () => unreadable);
    const worker = await start(testConfig({ clickhouse: engines.clickhouse, names: testNames('startalerts') }), { wrapClickHouse });
    try {
      const state = async () => JSON.stringify(await readiness(worker.url));
      await waitFor(() => reads.failed >= 2, 'the worker retries loading the open alerts', 60_000, state);
      expect(await readiness(worker.url)).toEqual({ status: 503, reason: 'storage unavailable: cannot load the open alerts (retrying): injected: storage cannot be read' });

      unreadable = false;
      await waitFor(async () => (await readiness(worker.url)).status === 200, '/ready turns 200 once the open alerts are loaded', 60_000, state);
      expect(reads.answered).toBe(1);
      await worker.ready;
    } finally {
      await worker.stop();
    }
  });

  it('answers 503 saying why storage cannot be migrated while it is retried, then 200', async () => {
    let unwritable = true;
    let failed = 0;
    const wrapClickHouse = (db: ClickHouse): ClickHouse => ({
      ...db,
      command: async (query, params) => {
        if (!unwritable) return db.command(query, params);
        failed++;
        throw new Error('injected: storage cannot be written');
      },
    });
    const worker = await start(testConfig({ clickhouse: engines.clickhouse, names: testNames('startmigrate') }), { wrapClickHouse });
    try {
      const state = async () => JSON.stringify(await readiness(worker.url));
      await waitFor(() => failed >= 2, 'the worker retries migrating storage', 60_000, state);
      expect(await readiness(worker.url)).toEqual({ status: 503, reason: 'storage not migrated yet (retrying): injected: storage cannot be written' });

      unwritable = false;
      await waitFor(async () => (await readiness(worker.url)).status === 200, '/ready turns 200 once storage is migrated', 60_000, state);
      await worker.ready;
    } finally {
      await worker.stop();
    }
  });

  it('without Kafka, refuses posts with 503 until the open alerts are loaded and detection has started, then judges a retry: the open alert goes on, no second one opens', async () => {
    const names = testNames('startposted');
    const apiKeyId = `pk_live_${names.runId}`;
    const alertsOfKey = async (worker: Worker) => (await worker.alertStore.loadForDedup(new Date(0))).filter((alert) => alert.apiKeyId === apiKeyId);

    const first = await engines.startWorker(testConfig({ clickhouse: engines.clickhouse, names }));
    expect((await postEvents(first.url, [attackToolRequest(apiKeyId)])).status).toBe(202);
    await waitFor(async () => (await alertsOfKey(first)).length === 1, 'the first worker opens the alert', 30_000);
    const [opened] = await alertsOfKey(first);
    await first.stop();

    let unreadable = true;
    const { reads, wrapClickHouse } = failingReads("WHERE status IN ('open', 'acknowledged') OR updated_at", () => unreadable);
    const second = await start(testConfig({ clickhouse: engines.clickhouse, names }), { wrapClickHouse });
    try {
      await waitFor(() => reads.failed >= 1, 'the second worker cannot load the open alerts', 60_000);
      // Neither stored nor held: stored now, it would be judged by no one were this worker stopped before detection starts.
      const attack = attackToolRequest(apiKeyId);
      const refused = await postEvents(second.url, [attack]);
      expect({ status: refused.status, retryAfter: refused.headers.get('retry-after'), body: await refused.json() }).toEqual({
        status: 503,
        retryAfter: '5',
        body: { success: false, error: { code: 'STORAGE_UNAVAILABLE', message: 'Detection has not started yet on this worker; retry later' } },
      });
      unreadable = false;
      await second.ready;
      const retried = await postEvents(second.url, [attack]);
      expect(((await retried.json()) as { data: unknown }).data).toMatchObject({ accepted: 1, duplicates: 0 });
      await waitFor(async () => (await alertsOfKey(second)).some((alert) => alert.occurrences === 2), 'the posted event continues the open alert', 30_000, async () => JSON.stringify(await alertsOfKey(second)));
      const alerts = await alertsOfKey(second);
      expect(alerts.map((alert) => ({ id: alert.id, occurrences: alert.occurrences }))).toEqual([{ id: opened!.id, occurrences: 2 }]);
    } finally {
      await second.stop();
    }
  });

  it('without Kafka, a warm-up of posted events that fails after loading some says so, and start-up goes on', async () => {
    const names = testNames('startwarm');
    const first = await engines.startWorker(testConfig({ clickhouse: engines.clickhouse, names }));
    expect((await postEvents(first.url, [attackToolRequest(`pk_live_${names.runId}`)])).status).toBe(202);
    await first.stop();

    // The keys' networks are read (a page at least), then the events cannot be.
    const wrapClickHouse = (db: ClickHouse): ClickHouse => ({
      ...db,
      queryPages: async (query, ...rest) => {
        if (query.includes('request_events') && !query.includes('key_networks_1d')) throw new Error('injected: storage cannot be read');
        return db.queryPages(query, ...rest);
      },
    });
    const lines: { msg: string; pagesLoaded?: number }[] = [];
    const logger = createLogger('warn', { write: (line: string) => void lines.push(JSON.parse(line)) });
    const second = await startWorker(testConfig({ clickhouse: engines.clickhouse, names }), { logger, wrapClickHouse });
    try {
      await second.ready;
      const warmups = lines.filter((line) => line.msg.startsWith('detection warm-up of HTTP events'));
      expect(warmups.map((line) => line.msg)).toEqual(['detection warm-up of HTTP events failed part-way; their windows hold only the pages loaded']);
      expect(warmups[0]!.pagesLoaded).toBeGreaterThanOrEqual(1);
    } finally {
      await second.stop();
    }
  });

  it('with Kafka, takes posts while the open alerts cannot be loaded, and stores and judges them from the topic once start-up is done', async () => {
    const names = testNames('startpostedkafka');
    const apiKeyId = `pk_live_${names.runId}`;
    let unreadable = true;
    const { reads, wrapClickHouse } = failingReads("WHERE status IN ('open', 'acknowledged') OR updated_at", () => unreadable);
    const worker = await start(testConfig({ brokers: engines.brokers, clickhouse: engines.clickhouse, names }), { wrapClickHouse });
    try {
      await waitFor(() => reads.failed >= 1, 'the worker cannot load the open alerts', 60_000);
      const response = await postEvents(worker.url, [attackToolRequest(apiKeyId)]);
      expect(response.status).toBe(202);
      expect(await readiness(worker.url)).toEqual({ status: 503, reason: 'storage unavailable: cannot load the open alerts (retrying): injected: storage cannot be read' });

      unreadable = false;
      await worker.ready;
      const alertsOfKey = async () => (await worker.alertStore.loadForDedup(new Date(0))).filter((alert) => alert.apiKeyId === apiKeyId);
      await waitFor(async () => (await alertsOfKey()).length === 1, 'the posted event is judged once consumed', 60_000);
      expect(await alertsOfKey()).toEqual([expect.objectContaining({ type: 'bot_traffic', occurrences: 1 })]);
      const stored = async () =>
        (
          await worker.clickhouse.queryRows<{ rows: number; fromTopic: number }>(
            `SELECT count() AS rows, countIf(source_topic = {topic:String}) AS fromTopic FROM ${engines.clickhouse.database}.request_events WHERE api_key_id = {key:String}`,
            { topic: names.topic, key: apiKeyId },
          )
        )[0]!;
      await waitFor(async () => (await stored()).rows > 0, 'the posted event is stored', 30_000);
      expect(await stored()).toEqual({ rows: 1, fromTopic: 1 });
    } finally {
      await worker.stop();
    }
  });

  it('a stop requested while storage migrates ends start-up before its next step: no open alerts read, no warm-up, no Kafka join, never ready', async () => {
    let migrate!: () => void;
    const migrationHeld = new Promise<void>((resolve) => (migrate = resolve));
    let stopRequested = false;
    const readsAfterStop: string[] = [];
    // The reads of the steps after the migration: the open alerts, and the warm-up's events and networks.
    const laterStep = /WHERE status IN \('open', 'acknowledged'\) OR updated_at|request_events|key_networks_1d/;
    const noteRead = (query: string) => {
      if (stopRequested && laterStep.test(query)) readsAfterStop.push(query.replace(/\s+/g, ' ').slice(0, 80));
    };
    const wrapClickHouse = (db: ClickHouse): ClickHouse => ({
      ...db,
      command: async (query, params) => {
        await migrationHeld;
        return db.command(query, params);
      },
      queryRows: async <T,>(query: string, params?: Record<string, unknown>) => {
        noteRead(query);
        await migrationHeld;
        return db.queryRows<T>(query, params);
      },
      queryPages: async (query, ...rest) => {
        noteRead(query);
        return db.queryPages(query, ...rest);
      },
    });
    const lines: { msg: string }[] = [];
    const logger = createLogger('info', { write: (line: string) => void lines.push(JSON.parse(line)) });
    const worker = await startWorker(testConfig({ brokers: engines.brokers, clickhouse: engines.clickhouse, names: testNames('startstop') }), { logger, wrapClickHouse });
    stopRequested = true; // SIGTERM while the migrations run (held here)
    const stopped = worker.stop();
    migrate();
    await stopped;
    const messages = lines.map((line) => line.msg);
    expect({ laterReads: readsAfterStop, ready: messages.includes('ready'), kafkaStarted: messages.includes('kafka intake started'), stopped: messages.includes('stopped') }).toEqual({
      laterReads: [],
      ready: false,
      kafkaStarted: false,
      stopped: true,
    });
  });

  it('a stop requested while a start-up step hangs (storage never answers) is not held by it: the stop goes on after 5 s and ends', async () => {
    const never = new Promise<never>(() => {});
    const wrapClickHouse = (db: ClickHouse): ClickHouse => ({ ...db, command: () => never });
    const lines: { msg: string; step?: string }[] = [];
    const logger = createLogger('info', { write: (line: string) => void lines.push(JSON.parse(line)) });
    const worker = await startWorker(testConfig({ clickhouse: engines.clickhouse, names: testNames('starthang') }), { logger, wrapClickHouse });
    await worker.stop();
    expect(lines.filter((line) => line.step !== undefined || line.msg === 'stopped').map(({ msg, step }) => ({ msg, step }))).toEqual([
      { msg: 'shutdown step did not finish in time; going on', step: 'ending start-up' },
      { msg: 'stopped', step: undefined },
    ]);
  });

  it('without Kafka, once the analysis thread has died, answers /ready and posts with 503 and reports it: nothing is stored that no one would judge', async () => {
    const names = testNames('startthread');
    const fatal: Error[] = [];
    const before = analysisThreads.length;
    const worker = await start(testConfig({ clickhouse: engines.clickhouse, names }), { onFatal: (error) => fatal.push(error) });
    try {
      await worker.ready;
      expect(analysisThreads).toHaveLength(before + 1);
      await analysisThreads[before]!.terminate(); // as a native fault or an exhausted heap would end it
      await waitFor(() => fatal.length === 1, 'onFatal hears that the analysis thread stopped');
      expect(await readiness(worker.url)).toMatchObject({ status: 503, reason: expect.stringMatching(/^analysis thread stopped/) });
      const refused = await postEvents(worker.url, [attackToolRequest(`pk_live_${names.runId}`)]);
      expect({ status: refused.status, body: await refused.json() }).toEqual({
        status: 503,
        body: { success: false, error: { code: 'STORAGE_UNAVAILABLE', message: 'Detection has stopped on this worker; retry later' } },
      });
      const [stored] = await worker.clickhouse.queryRows<{ rows: number }>(`SELECT count() AS rows FROM ${engines.clickhouse.database}.request_events WHERE api_key_id = {key:String}`, {
        key: `pk_live_${names.runId}`,
      });
      expect(stored!.rows).toBe(0);
    } finally {
      await worker.stop();
    }
  });

  it('with Kafka, joins the group and answers 200 while the webhook dispatcher cannot start yet, which is retried until it does', async () => {
    let unreadable = true;
    const { reads, wrapClickHouse } = failingReads('.webhook_breakers FINAL', () => unreadable);
    const config = testConfig({ brokers: engines.brokers, clickhouse: engines.clickhouse, names: testNames('startwebhooks') });
    const worker = await start(config, { wrapClickHouse });
    try {
      const state = async () => `${JSON.stringify(await readiness(worker.url))}, breaker reads failed: ${reads.failed}`;
      await waitFor(async () => (await readiness(worker.url)).status === 200, '/ready turns 200 with webhooks not started', 90_000, state);
      await worker.ready;
      expect(reads).toMatchObject({ answered: 0 });
      expect(reads.failed).toBeGreaterThan(0);

      unreadable = false;
      await waitFor(() => reads.answered === 1, 'the webhook dispatcher starts once storage can be read', 60_000, state);
      expect(await readiness(worker.url)).toEqual({ status: 200 });
    } finally {
      await worker.stop();
    }
  });
});

describe('the worker process with a setting it cannot start with', () => {
  const dir = mkdtempSync(join(tmpdir(), 'startup-refused-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  /** Runs `npm start`'s process to its exit (killed after a minute): its exit code and output. */
  async function runToExit(env: Record<string, string>): Promise<{ code: number | null; output: string }> {
    const worker = await spawnWorker(env);
    const timer = setTimeout(() => worker.child.kill('SIGKILL'), 60_000);
    const { code } = await worker.exited;
    clearTimeout(timer);
    return { code, output: worker.output() };
  }

  const STACK_LINE = /\n\s+at /;
  const REPO_ROOT = fileURLToPath(new URL('../../', import.meta.url));

  it('exits 2 with one message naming every invalid setting, DETECTION_CONFIG_FILE and DATA_DIR among them, and no stack', async () => {
    const notADirectory = join(dir, 'not-a-directory');
    writeFileSync(notADirectory, '');
    const missing = join(dir, 'missing.json');
    const { code, output } = await runToExit({ LOG_LEVEL: 'loud', HOST: 'no such host!', DATA_DIR: notADirectory, DETECTION_CONFIG_FILE: missing, KAFKA_TOPIC: 'api request metadata' });
    expect(code, output).toBe(2);
    expect(output).toMatch(/^invalid configuration:\n/);
    const problems = output.split('\n').filter((line) => line.startsWith('  - '));
    expect(problems.map((line) => line.slice(4).split(':')[0])).toEqual(['LOG_LEVEL', 'HOST', 'KAFKA_TOPIC', 'DETECTION_CONFIG_FILE', 'DATA_DIR']);
    expect(problems).toContain(`  - DETECTION_CONFIG_FILE: cannot read ${missing} (ENOENT)`);
    expect(problems).toContain(`  - DATA_DIR: cannot use ${notADirectory} (ENOTDIR)`);
    expect(output).not.toMatch(STACK_LINE);
  });

  it('exits 2 naming HOST, without a stack, when the server cannot listen on it', async () => {
    // A well-formed address that is not this machine's (TEST-NET-1): only listening can tell.
    const { code, output } = await runToExit({ HOST: '192.0.2.1', DATA_DIR: join(dir, 'data') });
    expect(code, output).toBe(2);
    expect(output).toMatch(/\ninvalid configuration:\n {2}- HOST: cannot listen on HOST 192\.0\.2\.1, PORT \d+ \(EADDRNOTAVAIL: not an address of this machine\)\n/);
    expect(output).not.toMatch(STACK_LINE);
  });

  it('exits 2 naming DATA_DIR, without a stack, when another worker holds it', async () => {
    const dataDir = join(dir, 'shared');
    const holder = await spawnWorker({ DATA_DIR: dataDir, LOG_LEVEL: 'info' });
    try {
      await waitFor(() => holder.output().includes('"msg":"migration applied"') || holder.child.exitCode !== null, `the first worker opens ${dataDir}`, 60_000);
      const { code, output } = await runToExit({ DATA_DIR: dataDir });
      expect(code, output).toBe(2);
      expect(output).toContain(`\ninvalid configuration:\n  - DATA_DIR: ${dataDir} is in use by another process (PID ${holder.child.pid}) whose embedded ClickHouse engine holds ${join(dataDir, 'clickhouse')}: run one worker per directory\n`);
      expect(output).not.toMatch(STACK_LINE);
    } finally {
      holder.child.kill('SIGKILL');
      await holder.exited;
    }
  });

  /**
   * `npm start` in its own process group (so that whatever npm leaves behind can be killed after the
   * test, by `killGroup`), on a free port, with these settings over config/dev.env's.
   */
  async function npmStart(env: Record<string, string>) {
    const port = await freePort();
    const npm = spawn('npm', ['start'], {
      cwd: REPO_ROOT,
      env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? dir, PORT: String(port), ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
      detached: true,
    });
    let output = '';
    npm.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
    npm.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()));
    const killGroup = () => {
      try {
        process.kill(-npm.pid!, 'SIGKILL');
      } catch {
        // the group has ended
      }
    };
    return { npm, url: `http://127.0.0.1:${port}`, output: () => output, killGroup };
  }

  it('under `npm start`, a SIGTERM sent to npm alone (as an orchestrator sends it) stops the worker cleanly', async () => {
    const { npm, url, output, killGroup } = await npmStart({ DATA_DIR: join(dir, 'npm-start'), FEATURE_ANOMALY_DETECTION: 'false' });
    const health = () => fetch(`${url}/health`).then((response) => response.status, () => 0);
    try {
      await waitFor(async () => (await health()) === 200, 'npm start answers /health', 60_000, output);
      npm.kill('SIGTERM');
      await waitFor(async () => (await health()) === 0 && npm.exitCode !== null, 'the worker stops with npm', 20_000, output);
      expect(output()).toMatch(/"reason":"SIGTERM"[^\n]*"msg":"shutdown requested"[\s\S]*"msg":"stopped"/);
    } finally {
      killGroup();
    }
  });

  it('under `npm start`, a SIGTERM that arrives while large posts are being read stops the worker cleanly, the posts answered', async () => {
    // tsx's own runner, which `npm start` used before, killed the worker (SIGKILL) when it did not
    // acknowledge a relayed signal within 60 ms, as it cannot while it parses a post of 10,000 events.
    const { npm, url, output, killGroup } = await npmStart({ DATA_DIR: join(dir, 'npm-start-busy'), LOG_LEVEL: 'info' });
    const exited = once(npm, 'exit') as Promise<[number | null, NodeJS.Signals | null]>;
    try {
      const ready = () => fetch(`${url}/ready`).then((response) => response.status, () => 0);
      await waitFor(async () => (await ready()) === 200, 'npm start is ready', 90_000, output);
      const token = readFileSync(join(REPO_ROOT, 'config/dev.env'), 'utf8').match(/^INGEST_TOKEN=(.*)$/m)![1]!;
      const body = (post: number) =>
        Array.from({ length: 10_000 }, (_, i) => JSON.stringify({ ...makeEvent(i, { runId: `busy${post}_${randomUUID().slice(0, 8)}`, startMs: Date.now() - 600_000 }), userAgent: 'x'.repeat(200) })).join('\n');
      const posts = [0, 1, 2].map(body).map((payload) =>
        fetch(`${url}/v1/ingest/events`, { method: 'POST', headers: { authorization: `Bearer ${token}`, 'content-type': 'application/x-ndjson' }, body: payload }).then(
          (response) => response.status,
          () => 0,
        ),
      );
      await sleep(150);
      npm.kill('SIGTERM');
      const [code, signal] = await exited;
      expect({ code, signal }, output()).toEqual({ code: 0, signal: null });
      expect(output()).toMatch(/"reason":"SIGTERM"[^\n]*"msg":"shutdown requested"[\s\S]*"msg":"stopped"/);
      // Each post is answered: stored (202), or refused as the stop began (503); none is cut off.
      for (const status of await Promise.all(posts)) expect([202, 503]).toContain(status);
    } finally {
      killGroup();
    }
  });

  it('started in-process on a port in use, rejects naming PORT and releases what it made: the embedding process exits by itself', async () => {
    // The analysis thread and the storage client are made before the server listens; left open,
    // they would keep the process alive.
    const script = join(dir, 'embed.mts');
    writeFileSync(
      script,
      `import { createServer } from 'node:net';
import { loadConfig } from ${JSON.stringify(join(REPO_ROOT, 'src/config.ts'))};
import { startWorker } from ${JSON.stringify(join(REPO_ROOT, 'src/main.ts'))};
const taken = createServer();
await new Promise((resolve) => taken.listen(0, '127.0.0.1', resolve));
const env = { FEATURE_ANOMALY_DETECTION: 'true', HOST: '127.0.0.1', PORT: String(taken.address().port), DATA_DIR: ${JSON.stringify(join(dir, 'embedded'))}, LOG_LEVEL: 'silent' };
await startWorker(loadConfig(env)).then(() => console.log('started'), (error) => console.log('refused: ' + error.message));
taken.close();
`,
    );
    const child = spawn(process.execPath, ['--import', 'tsx', script], { cwd: REPO_ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()));
    const timer = setTimeout(() => child.kill('SIGKILL'), 30_000);
    const [code, signal] = (await once(child, 'exit')) as [number | null, NodeJS.Signals | null];
    clearTimeout(timer);
    expect({ code, signal }, output).toEqual({ code: 0, signal: null });
    expect(output).toMatch(/^refused: invalid configuration:\n {2}- PORT: cannot listen on HOST 127\.0\.0\.1, PORT \d+ \(EADDRINUSE/);
  });
});
