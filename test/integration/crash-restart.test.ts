/**
 * The worker as a real process: killed with SIGKILL mid-stream and restarted, it still stores each
 * valid event once (and every view counts it once) and dead-letters each malformed one; on SIGTERM it drains, commits and exits 0,
 * and a SIGTERM repeated while it drains does not cut the drain short.
 */
import { connect } from 'node:net';
import type { Producer } from 'kafkajs';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { connectClickHouse } from '../../src/store/clickhouse.ts';
import { EventStore } from '../../src/store/event-store.ts';
import { tablesIn } from '../../src/store/tables.ts';
import { startClickHouse, type ClickHouseService } from '../services/clickhouse.ts';
import { asOfToday, makeMixedStream } from '../support/events.ts';
import { groupCaughtUp, produceAll, readTopic, testKafka } from '../support/kafka.ts';
import { spawnWorker, type WorkerProcess } from '../support/process.ts';
import { scrapeMetric, TEST_INGEST_TOKEN, testEnv, testNames, waitFor } from '../support/worker.ts';

const TOTAL = 100_000;
const names = testNames('crash');
const eventOptions = { runId: names.runId, startMs: asOfToday(Date.UTC(2026, 10, 20, 15, 0, 0)) };

describe('worker process killed mid-stream', () => {
  const kafka = testKafka(inject('kafkaBrokers'));
  let clickhouse: ClickHouseService;
  let producer: Producer;
  const processes: WorkerProcess[] = [];

  beforeAll(async () => {
    clickhouse = await startClickHouse();
    producer = kafka.producer();
    await producer.connect();
  });

  afterAll(async () => {
    for (const worker of processes) worker.child.kill('SIGKILL');
    await producer?.disconnect();
    await clickhouse?.stop();
  });

  it('after SIGKILL and a restart, every valid event is stored once and every malformed one dead-lettered', async () => {
    const { messages, expectedDeadLetters, valid } = makeMixedStream(TOTAL, eventOptions);
    // Small flushes, so the kill lands between flushes with some stored and some not.
    const env = testEnv({ brokers: inject('kafkaBrokers'), clickhouse, names, extra: { STORE_FLUSH_ROWS: '2000', STORE_FLUSH_INTERVAL_MS: '100' } });

    await produceAll(producer, names.topic, messages.slice(0, TOTAL / 2), 1000);
    const first = await spawnWorker(env);
    processes.push(first);
    await waitFor(async () => (await scrapeMetric(first.url, 'security_center_events_stored_total')) >= 10_000, 'first run stores some', 90_000, () => first.output().slice(-3000));
    first.child.kill('SIGKILL');
    expect((await first.exited).signal).toBe('SIGKILL');

    // The rest of the stream arrives while the worker is down.
    await produceAll(producer, names.topic, messages.slice(TOTAL / 2), 1000);
    const second = await spawnWorker(env);
    processes.push(second);
    await waitFor(() => groupCaughtUp(kafka, names.groupId, names.topic), 'restarted worker commits to the end', 120_000, () => second.output().slice(-3000));

    second.child.kill('SIGTERM');
    const exit = await second.exited;
    expect(exit.code, second.output()).toBe(0);

    const db = connectClickHouse({ username: clickhouse.username, password: clickhouse.password, url: clickhouse.url, dataDir: clickhouse.dataDir });
    try {
      const [raw] = await db.queryRows<{ rows: number; ids: number }>(
        `SELECT count() AS rows, uniqExact(event_id) AS ids FROM ${clickhouse.database}.request_events`,
      );
      expect(raw).toEqual({ rows: valid, ids: valid });
      const store = new EventStore(db, tablesIn(clickhouse.database));
      const totals = await store.trafficTotals({ from: new Date(eventOptions.startMs - 60_000), to: new Date(eventOptions.startMs + TOTAL + 60_000) });
      expect(totals.requests).toBe(valid);
      // key_networks_1d, detection's memory of each key's networks, is a second view of the same
      // inserts: a kill between its part and the raw part would leave it short or doubled.
      const perKeyNetwork = (from: string, network: string, columns: string) =>
        db.queryRows(
          `SELECT api_key_id, ${network} AS net, ${columns} FROM ${clickhouse.database}.${from} GROUP BY api_key_id, net ORDER BY api_key_id, net`,
        );
      const [networks, rawNetworks] = await Promise.all([
        perKeyNetwork('key_networks_1d', 'network', 'sum(requests) AS requests, min(first_seen) AS first, max(last_seen) AS last'),
        perKeyNetwork(
          'request_events',
          "IPv6CIDRToRange(ip, if(ip BETWEEN toIPv6('::ffff:0.0.0.0') AND toIPv6('::ffff:255.255.255.255'), 120, 64)).1",
          'count() AS requests, min(ts) AS first, max(ts) AS last',
        ),
      ]);
      expect(networks.length).toBeGreaterThan(0);
      expect(networks).toEqual(rawNetworks);
      // So is merchant_rollup_15m, from which metrics over whole quarter hours are read (the range
      // above has none: these two hours have eight).
      const wide = await store.trafficTotals({ from: new Date(eventOptions.startMs - 3_600_000), to: new Date(eventOptions.startMs + 3_600_000) });
      expect(wide.requests).toBe(valid);
      const perMerchant = (from: string, quarterHour: string, requests: string) =>
        db.queryRows(`SELECT merchant_id, ${quarterHour} AS q, ${requests} AS requests FROM ${clickhouse.database}.${from} GROUP BY merchant_id, q ORDER BY merchant_id, q`);
      const [quarterHours, rawQuarterHours] = await Promise.all([
        perMerchant('merchant_rollup_15m', 'quarter_hour', 'sum(requests)'),
        perMerchant('request_events', 'toStartOfFifteenMinutes(ts)', 'count()'),
      ]);
      expect(quarterHours.length).toBeGreaterThan(0);
      expect(quarterHours).toEqual(rawQuarterHours);
    } finally {
      await db.close();
    }

    // Dead letters are at-least-once too: a malformed message may appear twice, but each appears.
    const distinctPayloads = (values: string[]) => new Set(values.map((value) => JSON.parse(value).payload)).size;
    const deadLetters = (
      await readTopic(kafka, names.dlqTopic, expectedDeadLetters.size, (values) => distinctPayloads(values) >= expectedDeadLetters.size)
    ).map((value) => JSON.parse(value));
    const seen = new Map(deadLetters.map((record) => [record.payload as string, record.reason as string]));
    expect(seen).toEqual(expectedDeadLetters);
    // Longer than its waits (90 s, then 120 s): one that runs out then says which, with the worker's output.
  }, 300_000);

  it('a SIGTERM repeated while the first one drains is ignored: the drain ends, and the process exits 0', async () => {
    const worker = await spawnWorker(testEnv({ clickhouse, names: testNames('crashsig'), extra: { LOG_LEVEL: 'info' } }));
    processes.push(worker);
    await waitFor(async () => (await fetch(`${worker.url}/ready`).catch(() => undefined))?.status === 200, `ready\n${worker.output()}`, 90_000);

    // A post whose body is still arriving keeps the drain's first step (closing the HTTP server) busy.
    const socket = connect(Number(new URL(worker.url).port), '127.0.0.1');
    socket.on('error', () => undefined);
    await new Promise((resolve) => socket.once('connect', resolve));
    socket.write(`POST /v1/ingest/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${TEST_INGEST_TOKEN}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n[`);
    await new Promise((resolve) => setTimeout(resolve, 300));

    worker.child.kill('SIGTERM');
    await waitFor(() => worker.output().includes('"msg":"stopping"'), 'the first SIGTERM starts the drain', 10_000);
    worker.child.kill('SIGTERM'); // an orchestrator or an operator repeating the signal
    const exit = await worker.exited;
    socket.destroy();
    expect({ exit, stopped: worker.output().includes('"msg":"stopped"') }, worker.output().slice(-2000)).toEqual({ exit: { code: 0, signal: null }, stopped: true });
  });
});
