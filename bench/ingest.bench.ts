/**
 * npm run bench:ingest — one run, the same 500k request events of about 300 bytes, three ways:
 *  1. a plain kafkajs eachBatch consumer that only counts messages (the consumer ceiling);
 *  2. the storage ceiling: the same rows inserted straight into the ClickHouse engine in large raw
 *     JSONEachRow inserts, through the worker's own insert primitive;
 *  3. the worker's full path: consume, validate, store, commit.
 * Prints the three rates, the worker's ratio to each, and peak RSS. Uses the test services: the
 * mock broker (or KAFKA_BROKERS) and the embedded engine (or CLICKHOUSE_URL).
 * Env: BENCH_EVENTS (default 500000).
 */
import { Kafka, logLevel } from 'kafkajs';
import { loadConfig } from '../src/config.ts';
import { parseRequestEventText } from '../src/events/request-event.ts';
import { createLogger } from '../src/logger.ts';
import { startWorker } from '../src/main.ts';
import { connectClickHouse } from '../src/store/clickhouse.ts';
import { EventStore, serializeEventRow } from '../src/store/event-store.ts';
import { migrate } from '../src/store/migrate.ts';
import { tablesIn } from '../src/store/tables.ts';
import { startClickHouse } from '../test/services/clickhouse.ts';
import { mockBrokerConsumerDefaults, startKafka } from '../test/services/kafka.ts';
import { makeEvent } from '../test/support/events.ts';
import { groupCaughtUp, produceAll } from '../test/support/kafka.ts';
import { testEnv, testNames, waitFor } from '../test/support/worker.ts';

const EVENTS = Number(process.env.BENCH_EVENTS ?? 500_000);
const CEILING_INSERT_ROWS = 100_000;

function rate(count: number, ms: number): number {
  return Math.round((count / ms) * 1000);
}

async function main(): Promise<void> {
  const names = testNames('bench');
  const kafkaService = await startKafka({ topics: [names.topic] });
  const clickhouse = await startClickHouse();
  const kafka = new Kafka({ clientId: 'bench', brokers: kafkaService.brokers, logLevel: logLevel.NOTHING });
  const eventOptions = { runId: names.runId, startMs: Date.now() - 3_600_000, keys: 10_000, merchants: 500 };
  try {
    // The input, produced once: 500k events keyed by API key, in sends of 5,000.
    const values = Array.from({ length: EVENTS }, (_, i) => JSON.stringify(makeEvent(i, eventOptions)));
    const averageBytes = Math.round(values.reduce((sum, value) => sum + value.length, 0) / values.length);
    const producer = kafka.producer();
    await producer.connect();
    const produceStarted = performance.now();
    await produceAll(producer, names.topic, values.map((value, i) => ({ key: `pk_${i % 10_000}`, value })), 5000);
    const produceMs = performance.now() - produceStarted;
    await producer.disconnect();
    console.log(`input: ${EVENTS} events, ${averageBytes} bytes on average, produced in ${(produceMs / 1000).toFixed(1)} s (${kafkaService.kind} broker, ${clickhouse.kind} ClickHouse)`);

    // 1. Plain consumer: counts messages, nothing else.
    const plainMs = await timePlainConsumer(kafka, names.topic, EVENTS);
    console.log(`plain kafkajs eachBatch consumer: ${rate(EVENTS, plainMs)} msg/s`);

    // 2. Storage ceiling: the worker's rows, pre-built, in large raw inserts.
    const db = connectClickHouse({ url: clickhouse.url, username: clickhouse.username, password: clickhouse.password, dataDir: clickhouse.dataDir });
    const ceilingTables = tablesIn(`${clickhouse.database}_ceiling`);
    await migrate(db, { tables: ceilingTables, eventsTtlDays: 30 }, createLogger('silent'));
    const lines = values.map((value, offset) => {
      const parsed = parseRequestEventText(value);
      if (!parsed.ok) throw new Error('bench input must be valid');
      return serializeEventRow(parsed.event, { topic: names.topic, partition: 0, offset });
    });
    const ceilingStore = new EventStore(db, ceilingTables);
    const ceilingCpu = process.cpuUsage();
    const ceilingStarted = performance.now();
    for (let start = 0; start < lines.length; start += CEILING_INSERT_ROWS) {
      await ceilingStore.insertRows(Buffer.from(lines.slice(start, start + CEILING_INSERT_ROWS).join('\n')));
    }
    const ceilingMs = performance.now() - ceilingStarted;
    const ceilingCpuUsed = process.cpuUsage(ceilingCpu);
    console.log(`ceiling cpu: ${((ceilingCpuUsed.user + ceilingCpuUsed.system) / 1000 / ceilingMs).toFixed(2)} cores`);
    console.log(`storage ceiling (raw JSONEachRow inserts of ${CEILING_INSERT_ROWS} rows): ${rate(EVENTS, ceilingMs)} rows/s`);
    // Free the input before measuring the worker: a large old heap makes every GC slower.
    lines.length = 0;
    values.length = 0;

    // 3. The worker's full path, in this process, on the same engine.
    const env = testEnv({ brokers: kafkaService.brokers, clickhouse, names, extra: { LOG_LEVEL: 'warn', STORE_FLUSH_INTERVAL_MS: process.env.STORE_FLUSH_INTERVAL_MS ?? '1000', STORE_FLUSH_ROWS: process.env.STORE_FLUSH_ROWS ?? '50000' } });
    const worker = await startWorker(loadConfig(env), { logger: createLogger('warn') });
    await worker.ready;
    let firstConsumedAt = 0;
    const workerCpu = process.cpuUsage();
    const workerStarted = performance.now();
    await waitFor(async () => {
      if (!firstConsumedAt && (await counter(worker.metrics, 'security_center_events_consumed_total')) > 0) firstConsumedAt = performance.now();
      return (await counter(worker.metrics, 'security_center_events_stored_total')) >= EVENTS;
    }, 'worker stores every event', 600_000);
    const storedAt = performance.now();
    const workerCpuUsed = process.cpuUsage(workerCpu);
    console.log(`worker cpu: ${((workerCpuUsed.user + workerCpuUsed.system) / 1000 / (storedAt - workerStarted)).toFixed(2)} cores`);
    await waitFor(() => groupCaughtUp(kafka, names.groupId, names.topic), 'worker commits', 60_000);
    const workerMs = storedAt - (firstConsumedAt || workerStarted);
    const breakdown = await Promise.all(
      ['security_center_store_flush_duration_seconds', 'security_center_batch_duration_seconds'].map(async (name) => {
        const metric = (await worker.metrics.registry.getSingleMetric(name)?.get()) as { values: { metricName?: string; value: number }[] };
        const sum = metric.values.find((v) => v.metricName?.endsWith('_sum'))?.value ?? 0;
        const count = metric.values.find((v) => v.metricName?.endsWith('_count'))?.value ?? 0;
        return `${name.replace('security_center_', '')}: ${count} x ${((sum / Math.max(count, 1)) * 1000).toFixed(1)} ms = ${sum.toFixed(2)} s`;
      }),
    );
    console.log(`worker time: ${(workerMs / 1000).toFixed(2)} s; ${breakdown.join('; ')}`);
    await worker.stop();
    await db.close();
    const workerRate = rate(EVENTS, workerMs);
    console.log(`worker full path (consume, validate, store, commit): ${workerRate} events/s`);

    const plainRate = rate(EVENTS, plainMs);
    const ceilingRate = rate(EVENTS, ceilingMs);
    console.log('');
    console.log(`| path | rate (/s) | worker ratio |`);
    console.log(`|---|---|---|`);
    console.log(`| plain kafkajs consumer | ${plainRate} | ${(workerRate / plainRate).toFixed(2)}x |`);
    console.log(`| storage ceiling | ${ceilingRate} | ${(workerRate / ceilingRate).toFixed(2)}x |`);
    console.log(`| worker full path | ${workerRate} | 1.00x |`);
    console.log(`peak RSS: ${Math.round(process.resourceUsage().maxRSS / 1024)} MiB (whole benchmark process)`);
  } finally {
    await kafkaService.stop();
    await clickhouse.stop();
  }
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
