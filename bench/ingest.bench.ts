/**
 * npm run bench:ingest — one run, the same 500k request events of about 300 bytes, three ways:
 *  1. a plain kafkajs eachBatch consumer that only counts messages (the consumer ceiling), with the
 *     fix the worker's kafkajs has (src/ingest/kafka-request-queue.ts);
 *  2. the storage ceiling: the same rows inserted straight into the ClickHouse engine in large raw
 *     JSONEachRow inserts, through the worker's own insert primitive, with the engine's default
 *     settings (the ceiling the target is measured against); and, for comparison, the same in
 *     TabSeparated with EVENT_INSERT_SETTINGS, the format and settings the worker itself stores
 *     events with (src/store/clickhouse.ts and event-store.ts say why);
 *  3. the worker's full path: consume, validate, store, commit.
 * The engine is warmed first by one untimed pass of the ceiling's inserts (a process's first inserts
 * run far slower than its later ones, and the worker, timed last, runs warm).
 * Run by `npm run bench:ingest` with the V8 flag `npm start` gives Node (`--max-semi-space-size=64`),
 * as the worker runs in this process; the first line names Node's version and flags.
 * Prints the rates, the worker's ratio to each, its CPU by thread (Linux's /proc), and peak RSS. Uses the test services: the
 * mock broker (or KAFKA_BROKERS) and the embedded engine (or CLICKHOUSE_URL).
 * Env: BENCH_EVENTS (default 500000); BENCH_PLANS (a comma list the keys' plans cycle through, default
 * all four, half of the keys entitled to detection; `pro` leaves detection nothing to judge, which
 * measures the path without it: the worker's whole cost of detection is the difference; the fast path
 * of validation then makes no event objects either, UnjudgedEvent); BENCH_PAIRS (default 1): the
 * JSONEachRow ceiling and the worker again, as pairs, this many in all, and each pair's ratio with
 * their median (the machine's speed drifts within minutes: a ratio to a ceiling measured next to
 * the worker says more than one run's).
 */
import { Kafka, logLevel } from 'kafkajs';
import { loadConfig } from '../src/config.ts';
import { parseRequestEventText, PLANS } from '../src/events/request-event.ts';
import { stopIdleRequestQueueTimers } from '../src/ingest/kafka-request-queue.ts';
import { createLogger } from '../src/logger.ts';
import { startWorker } from '../src/main.ts';
import { connectClickHouse } from '../src/store/clickhouse.ts';
import type { Plan, RequestEvent } from '../src/events/request-event.ts';
import type { ClickHouse, RowFormat } from '../src/store/clickhouse.ts';
import { EVENT_INSERT_SETTINGS, REQUEST_EVENT_COLUMNS, serializeEventRow, toClickHouseTime, type EventSource } from '../src/store/event-store.ts';
import { migrate } from '../src/store/migrate.ts';
import { tablesIn } from '../src/store/tables.ts';
import { startClickHouse, type ClickHouseService } from '../test/services/clickhouse.ts';
import { mockBrokerConsumerDefaults, startKafka } from '../test/services/kafka.ts';
import { makeEvent } from '../test/support/events.ts';
import { groupCaughtUp, produceAll } from '../test/support/kafka.ts';
import { testEnv, testNames, waitFor, type TestNames } from '../test/support/worker.ts';
import { cpuByThread, threadTimes } from './thread-cpu.ts';

const EVENTS = Number(process.env.BENCH_EVENTS ?? 500_000);
/** BENCH_PAIRS: after the first run, the JSONEachRow ceiling and the worker again, this many times in all, each pair on databases of its own. */
const PAIRS = Math.max(1, Math.floor(Number(process.env.BENCH_PAIRS ?? 1)));
const CEILING_INSERT_ROWS = 100_000;

function rate(count: number, ms: number): number {
  return Math.round((count / ms) * 1000);
}

async function main(): Promise<void> {
  const names = testNames('bench');
  const kafkaService = await startKafka({ topics: [names.topic] });
  const clickhouse = await startClickHouse();
  stopIdleRequestQueueTimers();
  const kafka = new Kafka({ clientId: 'bench', brokers: kafkaService.brokers, logLevel: logLevel.NOTHING });
  const plans = process.env.BENCH_PLANS?.split(',') as Plan[] | undefined;
  const unknown = plans?.filter((plan) => !(PLANS as readonly string[]).includes(plan));
  if (unknown?.length) throw new Error(`BENCH_PLANS: unknown plan ${unknown.join(', ')} (plans: ${PLANS.join(', ')})`);
  const eventOptions = { runId: names.runId, startMs: Date.now() - 3_600_000, keys: 10_000, merchants: 500, plans };
  try {
    // The input, produced once: 500k events keyed by API key, in sends of 5,000.
    const keys: string[] = [];
    const values = Array.from({ length: EVENTS }, (_, i) => {
      const event = makeEvent(i, eventOptions);
      keys.push(event.apiKeyId);
      return JSON.stringify(event);
    });
    const averageBytes = Math.round(values.reduce((sum, value) => sum + value.length, 0) / values.length);
    const producer = kafka.producer();
    await producer.connect();
    const produceStarted = performance.now();
    await produceAll(producer, names.topic, values.map((value, i) => ({ key: keys[i]!, value })), 5000);
    keys.length = 0;
    const produceMs = performance.now() - produceStarted;
    await producer.disconnect();
    const nodeFlags = [...process.execArgv.filter((arg) => !arg.startsWith('--import') && !arg.startsWith('--require') && !/tsx/.test(arg)), ...(process.env.NODE_OPTIONS ? [`NODE_OPTIONS=${process.env.NODE_OPTIONS}`] : [])];
    console.log(`node ${process.version}, flags: ${nodeFlags.join(' ') || 'none'}`);
    console.log(`input: ${EVENTS} events of plans ${(plans ?? ['all four']).join(', ')}, ${averageBytes} bytes on average, produced in ${(produceMs / 1000).toFixed(1)} s (${kafkaService.kind} broker, ${clickhouse.kind} ClickHouse)`);

    // 1. Plain consumer: counts messages, nothing else.
    const plainMs = await timePlainConsumer(kafka, names.topic, EVENTS);
    console.log(`plain kafkajs eachBatch consumer: ${rate(EVENTS, plainMs)} msg/s`);

    // 2. Storage ceilings: the worker's rows, pre-built, in large raw inserts, as JSONEachRow with
    // default settings (the target's ceiling) and as TabSeparated with the worker's insert settings.
    const db = connectClickHouse({ url: clickhouse.url, username: clickhouse.username, password: clickhouse.password, dataDir: clickhouse.dataDir });
    const parsedEvents = values.map((value) => {
      const parsed = parseRequestEventText(value);
      if (!parsed.ok) throw new Error('bench input must be valid');
      return parsed.event;
    });
    const source = (offset: number): EventSource => ({ topic: names.topic, partition: 0, offset });
    const formats = (process.env.CEILINGS ?? 'JSONEachRow,TabSeparated').split(',') as RowFormat[];
    if (PAIRS > 1 && !formats.includes('JSONEachRow')) throw new Error('BENCH_PAIRS needs the JSONEachRow ceiling: CEILINGS must include it');
    // The insert bodies are built before the clock starts: the ceiling times the engine alone.
    const bodies = new Map<RowFormat, Buffer[]>();
    for (const format of formats) bodies.set(format, insertBodies(parsedEvents, format, source));
    // Free the input before timing anything: a large old heap makes every GC slower.
    parsedEvents.length = 0;
    values.length = 0;
    // Untimed first: one pass of the first format's bodies into a scratch database. A process's first
    // inserts run slower than its later ones (three JSONEachRow ceilings back to back, cold, in three
    // runs: the first 9-35% slower than each of the two after it), and the worker, timed after the
    // ceilings, always ran warm: a cold ceiling made its ratio look better than it was.
    const warmUp = `${clickhouse.database}_warm_up`;
    await timeCeiling(db, warmUp, formats[0]!, bodies.get(formats[0]!)!);
    await db.command(`DROP DATABASE ${warmUp} SYNC`);
    const ceilings: Partial<Record<RowFormat, number>> = {};
    for (const format of formats) {
      const { ms, cores } = await timeCeiling(db, `${clickhouse.database}_ceiling_${format.toLowerCase()}`, format, bodies.get(format)!);
      ceilings[format] = ms;
      console.log(`storage ceiling (raw ${format} inserts of ${CEILING_INSERT_ROWS} rows${format === 'TabSeparated' ? ', the worker\'s settings' : ''}): ${rate(EVENTS, ms)} rows/s, ${cores.toFixed(2)} cores`);
    }
    // Later pairs insert the JSONEachRow bodies again: they stay alive through every worker run of a
    // BENCH_PAIRS run, pair 1's included (Buffers, outside the V8 heap but counted as its external
    // memory, about 180 MB; not measured for their effect on the worker); the rest go.
    for (const format of formats) if (PAIRS === 1 || format !== 'JSONEachRow') bodies.delete(format);

    // 3. The worker's full path, in this process, on the same engine.
    const workerMs = await timeWorker(kafka, kafkaService.brokers, clickhouse, names, ceilings.JSONEachRow);
    const workerRate = rate(EVENTS, workerMs);
    console.log(`worker full path (consume, validate, store, commit): ${workerRate} events/s`);

    const plainRate = rate(EVENTS, plainMs);
    const ceilingRate = rate(EVENTS, ceilings.JSONEachRow ?? Number.NaN);
    const tsvCeilingRate = rate(EVENTS, ceilings.TabSeparated ?? Number.NaN);
    console.log('');
    console.log(`| path | rate (/s) | worker ratio |`);
    console.log(`|---|---|---|`);
    console.log(`| plain kafkajs consumer | ${plainRate} | ${(workerRate / plainRate).toFixed(2)}x |`);
    // A ceiling left out by CEILINGS keeps its row, saying so.
    const ceilingRow = (label: string, ceiling: number) =>
      Number.isNaN(ceiling) ? `| ${label} | not measured (CEILINGS) | |` : `| ${label} | ${ceiling} | ${(workerRate / ceiling).toFixed(2)}x |`;
    console.log(ceilingRow('storage ceiling (JSONEachRow)', ceilingRate));
    console.log(ceilingRow(`storage ceiling in the worker's format and settings (TabSeparated)`, tsvCeilingRate));
    console.log(`| worker full path | ${workerRate} | 1.00x |`);
    if (PAIRS > 1) await timeMorePairs(db, kafka, kafkaService.brokers, clickhouse, names, bodies.get('JSONEachRow')!, { ceilingMs: ceilings.JSONEachRow!, workerMs });
    await db.close();
    console.log(`peak RSS: ${Math.round(process.resourceUsage().maxRSS / 1024)} MiB (whole benchmark process)`);
  } finally {
    await kafkaService.stop();
    await clickhouse.stop();
  }
}

/**
 * BENCH_PAIRS: the machine's speed drifts by 10-20% within minutes, so one run's ratio of the worker
 * to a ceiling measured a minute earlier says little. Each further pair measures the JSONEachRow
 * ceiling and, right after it, the worker (a new consumer group reading the same topic into a
 * database of its own), after dropping the last pair's databases so that their background merges do
 * not run beside it. Prints each pair's ratio, and their median and mean, and the median of the later
 * pairs alone: the first pair's worker is the process's first (its JavaScript not optimized yet, its
 * TabSeparated inserts never run when CEILINGS leaves them out), and ran 2-10% slower than the later
 * ones in this session's runs, while the warm-up has warmed the first ceiling.
 */
async function timeMorePairs(
  db: ClickHouse,
  kafka: Kafka,
  brokers: string[],
  clickhouse: ClickHouseService,
  names: TestNames,
  jsonBodies: readonly Buffer[],
  first: { ceilingMs: number; workerMs: number },
): Promise<void> {
  const pairs = [first];
  let dropAfter = [`${clickhouse.database}_ceiling_jsoneachrow`, `${clickhouse.database}_ceiling_tabseparated`, clickhouse.database];
  for (let pair = 2; pair <= PAIRS; pair++) {
    for (const database of dropAfter) await db.command(`DROP DATABASE IF EXISTS ${database} SYNC`);
    console.log('');
    console.log(`pair ${pair} of ${PAIRS}:`);
    const ceilingDatabase = `${clickhouse.database}_ceiling_jsoneachrow_${pair}`;
    const { ms: ceilingMs, cores } = await timeCeiling(db, ceilingDatabase, 'JSONEachRow', jsonBodies);
    console.log(`storage ceiling (raw JSONEachRow inserts of ${CEILING_INSERT_ROWS} rows): ${rate(EVENTS, ceilingMs)} rows/s, ${cores.toFixed(2)} cores`);
    const workerDatabase = `${clickhouse.database}_worker_${pair}`;
    const pairNames = { ...names, groupId: `${names.groupId}.${pair}` };
    const workerMs = await timeWorker(kafka, brokers, clickhouse, pairNames, ceilingMs, workerDatabase);
    console.log(`worker full path (consume, validate, store, commit): ${rate(EVENTS, workerMs)} events/s, ${(ceilingMs / workerMs).toFixed(2)}x the ceiling just before it`);
    pairs.push({ ceilingMs, workerMs });
    dropAfter = [ceilingDatabase, workerDatabase];
  }
  const ratios = pairs.map(({ ceilingMs, workerMs }) => ceilingMs / workerMs);
  const mean = ratios.reduce((sum, ratio) => sum + ratio, 0) / ratios.length;
  console.log('');
  console.log(
    `${PAIRS} pairs, the worker against the JSONEachRow ceiling measured before it: ${ratios.map((ratio) => `${ratio.toFixed(2)}x`).join(', ')}; ` +
      `median ${median(ratios).toFixed(2)}x, mean ${mean.toFixed(2)}x, median of pairs 2 to ${PAIRS} ${median(ratios.slice(1)).toFixed(2)}x ` +
      `(worker ${pairs.map(({ workerMs }) => rate(EVENTS, workerMs)).join(', ')} events/s; ceiling ${pairs.map(({ ceilingMs }) => rate(EVENTS, ceilingMs)).join(', ')} rows/s)`,
  );
}

function median(values: readonly number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = sorted.length >> 1;
  return sorted.length % 2 === 1 ? sorted[middle]! : (sorted[middle - 1]! + sorted[middle]!) / 2;
}

/**
 * The worker's full path over the topic's EVENTS events, in this process, on the same engine: from
 * its first event consumed to its last stored (both polled every 5 ms). Prints its CPU, where its
 * time went and how busy storage was; returns the time. `database` gives it a database of its own
 * (a later pair's), instead of the service's.
 */
async function timeWorker(kafka: Kafka, brokers: string[], clickhouse: ClickHouseService, names: TestNames, jsonCeilingMs: number | undefined, database?: string): Promise<number> {
  const env = testEnv({
    brokers,
    clickhouse,
    names,
    extra: {
      LOG_LEVEL: 'warn',
      STORE_FLUSH_INTERVAL_MS: process.env.STORE_FLUSH_INTERVAL_MS ?? '1000',
      STORE_FLUSH_ROWS: process.env.STORE_FLUSH_ROWS ?? '50000',
      ...(database ? { CLICKHOUSE_DATABASE: database } : {}),
    },
  });
  const threadsBefore = threadTimes(); // the analysis thread is one started after this
  const worker = await startWorker(loadConfig(env), { logger: createLogger('warn') });
  await worker.ready;
  let firstConsumedAt = 0;
  const threadsAtStart = threadTimes();
  const workerCpu = process.cpuUsage();
  const workerStarted = performance.now();
  // Polled every 5 ms: the window's two ends are known to within that (at 100 ms, a run of 4-5 s
  // was up to 0.1 s off at each end). A poll reads two counters, about a microsecond of the main thread.
  await waitFor(
    async () => {
      if (!firstConsumedAt && (await counter(worker.metrics, 'security_center_events_consumed_total')) > 0) firstConsumedAt = performance.now();
      return (await counter(worker.metrics, 'security_center_events_stored_total')) >= EVENTS;
    },
    'worker stores every event',
    600_000,
    undefined,
    5,
  );
  const storedAt = performance.now();
  const workerCpuUsed = process.cpuUsage(workerCpu);
  console.log(`worker cpu: ${((workerCpuUsed.user + workerCpuUsed.system) / 1000 / (storedAt - workerStarted)).toFixed(2)} cores`);
  const byThread = cpuByThread(threadsBefore, threadsAtStart, threadTimes());
  if (byThread) console.log(`worker cpu by thread: ${byThread}`);
  await waitFor(() => groupCaughtUp(kafka, names.groupId, names.topic), 'worker commits', 60_000);
  const workerMs = storedAt - (firstConsumedAt || workerStarted);
  const histograms = await Promise.all(
    ['security_center_store_flush_duration_seconds', 'security_center_batch_duration_seconds'].map(async (name) => {
      const metric = (await worker.metrics.registry.getSingleMetric(name)?.get()) as { values: { metricName?: string; value: number }[] };
      const sum = metric.values.find((v) => v.metricName?.endsWith('_sum'))?.value ?? 0;
      const count = metric.values.find((v) => v.metricName?.endsWith('_count'))?.value ?? 0;
      return { name: name.replace('security_center_', ''), sum, count };
    }),
  );
  const breakdown = histograms.map(({ name, sum, count }) => `${name}: ${count} x ${((sum / Math.max(count, 1)) * 1000).toFixed(1)} ms = ${sum.toFixed(2)} s`);
  console.log(`worker time: ${(workerMs / 1000).toFixed(2)} s; ${breakdown.join('; ')}`);
  // Inserts run one at a time: the time no insert runs is the pipeline's edges (filling the first
  // insert, the last rows waiting out STORE_FLUSH_INTERVAL_MS) and any stall between inserts.
  const flushSeconds = histograms[0]!.sum;
  const whileStoring = EVENTS / flushSeconds;
  console.log(
    `storage busy ${flushSeconds.toFixed(2)} s of ${(workerMs / 1000).toFixed(2)} s (${((flushSeconds * 100_000) / workerMs).toFixed(0)}%); ` +
      `rows per second of insert time: ${Math.round(whileStoring)} (${(whileStoring / rate(EVENTS, jsonCeilingMs ?? Number.NaN)).toFixed(2)}x the JSONEachRow ceiling)`,
  );
  await worker.stop();
  return workerMs;
}

/**
 * The events' rows in `format`, as insert bodies of CEILING_INSERT_ROWS rows each. A function of its
 * own so the row strings die with it: a suspended async function keeps its dead variables alive,
 * and 500k row strings left on the heap halve the worker's rate measured after them.
 */
function insertBodies(events: readonly RequestEvent[], format: RowFormat, source: (offset: number) => EventSource): Buffer[] {
  const lines = events.map((event, offset) => (format === 'JSONEachRow' ? jsonEachRowLine(event, source(offset)) : serializeEventRow(event, source(offset))));
  const bodies: Buffer[] = [];
  for (let start = 0; start < lines.length; start += CEILING_INSERT_ROWS) bodies.push(Buffer.from(`${lines.slice(start, start + CEILING_INSERT_ROWS).join('\n')}\n`));
  return bodies;
}

/**
 * Inserts the bodies into a fresh copy of the schema; the time and the cores used. JSONEachRow, the
 * target's ceiling, with the engine's defaults; TabSeparated with the worker's own settings.
 */
async function timeCeiling(db: ClickHouse, database: string, format: RowFormat, bodies: readonly Buffer[]): Promise<{ ms: number; cores: number }> {
  const tables = tablesIn(database);
  await migrate(db, { tables, eventsTtlDays: 30 }, createLogger('silent'));
  const cpu = process.cpuUsage();
  const started = performance.now();
  const settings = format === 'TabSeparated' ? EVENT_INSERT_SETTINGS : undefined;
  for (const body of bodies) await db.insert(tables.requestEvents, REQUEST_EVENT_COLUMNS, body, format, settings);
  const ms = performance.now() - started;
  const used = process.cpuUsage(cpu);
  const [stored] = await db.queryRows<{ rows: number }>(`SELECT count() AS rows FROM ${tables.requestEvents}`);
  if (Number(stored?.rows) !== EVENTS) throw new Error(`${format} ceiling stored ${stored?.rows} of ${EVENTS} rows`);
  return { ms, cores: (used.user + used.system) / 1000 / ms };
}

/** The worker's row for an event (serializeEventRow's values) as one JSONEachRow line. */
function jsonEachRowLine(event: RequestEvent, source: EventSource): string {
  return JSON.stringify({
    event_id: event.eventId,
    ts: toClickHouseTime(event.timestamp),
    merchant_id: event.merchantId,
    plan: event.plan,
    api_key_id: event.apiKeyId,
    environment: event.environment,
    ip: event.ip,
    user_agent: event.userAgent,
    method: event.method,
    path: event.path,
    status: event.status,
    response_time_ms: event.responseTimeMs,
    rate_limit_per_minute: event.rateLimitPerMinute ?? 0,
    country: event.country ?? '',
    source_topic: source.topic,
    source_partition: source.partition,
    source_offset: source.offset,
  });
}

async function timePlainConsumer(kafka: Kafka, topic: string, expected: number): Promise<number> {
  const consumer = kafka.consumer({ groupId: `plain.${topic}`, ...mockBrokerConsumerDefaults() });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  let count = 0;
  let startedAt = 0;
  const done = new Promise<number>((resolve) => {
    void consumer.run({
      eachBatch: async ({ batch }) => {
        if (!startedAt) startedAt = performance.now();
        count += batch.messages.length;
        if (count >= expected) resolve(performance.now() - startedAt);
      },
    });
  });
  const ms = await done;
  await consumer.disconnect();
  return ms;
}

async function counter(metrics: { registry: { getSingleMetric(name: string): unknown } }, name: string): Promise<number> {
  const metric = metrics.registry.getSingleMetric(name) as { get(): Promise<{ values: { value: number }[] }> } | undefined;
  if (!metric) return 0;
  return (await metric.get()).values.reduce((sum, value) => sum + value.value, 0);
}

main().then(
  () => process.exit(0),
  (error: unknown) => {
    console.error(error);
    process.exit(1);
  },
);
