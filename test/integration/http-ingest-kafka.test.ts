/**
 * HTTP ingest with Kafka configured, on the real broker and ClickHouse, with replicas in one
 * consumer group: posted events go through the topic, keyed by API key, so each key's events meet
 * on the replica that owns its partition. A client's retry that lands on another replica is stored
 * and counted once; an attack posted half to one replica and half to the other is still detected;
 * while the broker is down, a post is answered 503 with Retry-After, never 202; while the brokers
 * refuse the worker, that is logged once, not per post.
 */
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { createLogger } from '../../src/logger.ts';
import { startWorker, type Worker } from '../../src/main.ts';
import { startKafka, type KafkaService } from '../services/kafka.ts';
import { useEngines } from '../support/engines.ts';
import { asOfToday, makeEvent, type RequestEventInput } from '../support/events.ts';
import { groupCaughtUp } from '../support/kafka.ts';
import { TEST_INGEST_TOKEN, metricTotal, scrapeMetric, testConfig, testNames, waitFor, waitForPartitionsSplit } from '../support/worker.ts';

async function post(worker: Worker, events: readonly unknown[]) {
  const response = await fetch(`${worker.url}/v1/ingest/events`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${TEST_INGEST_TOKEN}` },
    body: JSON.stringify(events),
  });
  const text = await response.text();
  // eslint-disable-next-line @typescript-eslint/no-explicit-any -- response shapes are asserted below
  return { status: response.status, headers: response.headers, text, body: JSON.parse(text) as any };
}

describe('HTTP ingest through Kafka', () => {
  const engines = useEngines();
  const { kafka } = engines;
  const names = testNames('httpkafka');
  let replicas: Worker[];

  beforeAll(async () => {
    const config = testConfig({ brokers: engines.brokers, clickhouse: engines.clickhouse, names });
    replicas = [await engines.startWorker(config), await engines.startWorker(config)];
    await waitForPartitionsSplit(replicas);
  });

  async function stored(worker: Worker, runId: string): Promise<{ rows: number; ids: number; fromTopic: number }> {
    const [row] = await worker.clickhouse.queryRows<{ rows: number; ids: number; fromTopic: number }>(
      `SELECT count() AS rows, uniqExact(event_id) AS ids, countIf(source_topic = {topic:String}) AS fromTopic
         FROM ${engines.clickhouse.database}.request_events WHERE startsWith(event_id, {prefix:String})`,
      { topic: names.topic, prefix: `evt_${runId}_` },
    );
    return row!;
  }

  it('stores events posted to one replica and again to the other once, through the topic, and the rollup counts them once', async () => {
    const runId = `${names.runId}_retry`;
    const startMs = asOfToday(Date.UTC(2026, 10, 21, 9, 0, 0));
    const events = Array.from({ length: 40 }, (_, i) => makeEvent(i, { runId, startMs, keys: 8 }));
    // The client posts to one replica, and retries the same events on the other (its answer was lost).
    for (const replica of replicas) {
      const response = await post(replica, events);
      expect(response.status).toBe(202);
      expect(response.body.data).toMatchObject({ accepted: 40, rejected: 0 });
    }
    await waitFor(() => groupCaughtUp(kafka, names.groupId, names.topic), 'the replicas consume what was posted', 60_000);
    await waitFor(async () => (await stored(replicas[0]!, runId)).ids === 40, 'every event stored', 30_000, async () => JSON.stringify(await stored(replicas[0]!, runId)));

    // Stored once each, by the consumer (rows record the topic they came from).
    expect(await stored(replicas[0]!, runId)).toEqual({ rows: 40, ids: 40, fromTopic: 40 });
    const totals = await replicas[0]!.store.trafficTotals({ from: new Date(startMs - 60_000), to: new Date(startMs + 60_000) });
    expect(totals.requests).toBe(40);
    const produced = await Promise.all(replicas.map((replica) => metricTotal(replica, 'security_center_events_produced_total')));
    expect(produced).toEqual([40, 40]);
  });

  it('counts each posted event once as consumed: an accepted one where it is consumed from the topic, a rejected or repeated one where it was posted', async () => {
    await waitFor(() => groupCaughtUp(kafka, names.groupId, names.topic), 'the replicas consumed what came before', 60_000);
    const counts = () =>
      Promise.all(
        replicas.map(async (replica) => ({
          produced: await scrapeMetric(replica.url, 'security_center_events_produced_total'),
          consumedHttp: await scrapeMetric(replica.url, 'security_center_events_consumed_total', { source: 'http' }),
          consumedKafka: await scrapeMetric(replica.url, 'security_center_events_consumed_total', { source: 'kafka' }),
        })),
      );
    const before = await counts();
    const runId = `${names.runId}_counted`;
    const events = Array.from({ length: 10 }, (_, i) => makeEvent(i, { runId, startMs: asOfToday(Date.UTC(2026, 10, 21, 10, 0, 0)), keys: 4 }));
    const invalid = { ...makeEvent(10, { runId, startMs: asOfToday(Date.UTC(2026, 10, 21, 10, 0, 0)) }), ip: 'not-an-ip' };
    const response = await post(replicas[0]!, [...events, invalid, events[0]]);
    expect(response.body.data).toMatchObject({ accepted: 10, rejected: 1, duplicates: 1 });
    await waitFor(() => groupCaughtUp(kafka, names.groupId, names.topic), 'the replicas consume what was posted', 60_000);
    await waitFor(async () => (await stored(replicas[0]!, runId)).ids === 10, 'every accepted event stored', 30_000);

    const after = await counts();
    const added = (key: 'produced' | 'consumedHttp' | 'consumedKafka') => after.map((count, i) => count[key] - before[i]![key]);
    expect(added('produced')).toEqual([10, 0]);
    expect(added('consumedHttp')).toEqual([2, 0]); // the rejected event and the repeat end where they were posted
    expect(added('consumedKafka').reduce((sum, count) => sum + count, 0)).toBe(10);
  });

  it('detects an attack posted half to one replica and half to the other', async () => {
    const key = `pk_live_${names.runId}_guessing`;
    const now = Date.now();
    // 40 refused requests in 40 s: high_failure_rate needs 30; each replica gets 20 of them.
    const attack = Array.from({ length: 40 }, (_, i): RequestEventInput => ({
      ...makeEvent(i, { runId: `${names.runId}_guess`, startMs: now - 40_000 }),
      timestamp: new Date(now - 40_000 + i * 1000).toISOString(),
      apiKeyId: key,
      merchantId: 'm_guessing',
      plan: 'business',
      status: 401,
    }));
    for (const [index, replica] of replicas.entries()) {
      const response = await post(replica, attack.filter((_, i) => i % 2 === index));
      expect(response.body.data).toMatchObject({ accepted: 20 });
    }
    const alertsOfKey = async () => (await replicas[0]!.alertStore.list({ merchantId: 'm_guessing' })).filter((alert) => alert.apiKeyId === key);
    await waitFor(async () => (await alertsOfKey()).length > 0, 'an alert on the key', 30_000);
    expect(await alertsOfKey()).toEqual([expect.objectContaining({ type: 'high_failure_rate', status: 'open' })]);
  });

  describe('while the broker is down', () => {
    // A broker of its own, to stop; one named by KAFKA_BROKERS cannot be stopped from here.
    const ownBroker = inject('kafkaKind') !== 'env';
    let broker: KafkaService | undefined;
    let worker: Worker;
    const own = testNames('httpkafka_outage');
    const startMs = asOfToday(Date.UTC(2026, 10, 21, 11, 0, 0));

    beforeAll(async () => {
      if (!ownBroker) return;
      broker = await startKafka({ topics: [] });
      worker = await engines.startWorker(testConfig({ brokers: broker.brokers, clickhouse: engines.clickhouse, names: own }));
    });

    afterAll(async () => {
      await broker?.stop();
    });

    it.runIf(ownBroker)('answers 503 with Retry-After, never a 202 for what the broker did not acknowledge', async () => {
      const before = makeEvent(0, { runId: own.runId, startMs });
      expect((await post(worker, [before])).status).toBe(202);
      await waitFor(async () => (await stored(worker, own.runId)).ids === 1, 'the event posted before the outage is stored');

      await broker!.stop();
      const during = Array.from({ length: 10 }, (_, i) => makeEvent(1 + i, { runId: own.runId, startMs }));
      for (const attempt of [1, 2]) {
        const response = await post(worker, during);
        expect(response.status, `attempt ${attempt}`).toBe(503);
        expect(response.headers.get('retry-after')).toBe('5');
        expect(response.body).toEqual({ success: false, error: { code: 'STORAGE_UNAVAILABLE', message: expect.any(String) } });
        expect(response.text).not.toContain(own.runId);
      }
      await new Promise((resolve) => setTimeout(resolve, 500));
      expect(await stored(worker, own.runId)).toMatchObject({ ids: 1 });
      expect(await metricTotal(worker, 'security_center_events_produced_total')).toBe(1);
    });
  });

  describe('while the brokers refuse the worker', () => {
    it('answers each post 503, and logs it once with the cause (the SASL settings to check), not per post', async () => {
      const password = 'Sv6Kp9QzXw3TmL8rJb2N';
      const lines: { component?: string; level: number; msg: string; err?: { message: string } }[] = [];
      let text = '';
      const logger = createLogger('info', { write: (line: string) => void ((text += line), lines.push(JSON.parse(line))) });
      const own = testNames('httpkafka_refused');
      // The run's broker takes no SASL: it refuses the worker at once, as it would a rotated password.
      const config = testConfig({
        brokers: engines.brokers,
        clickhouse: engines.clickhouse,
        names: own,
        extra: { KAFKA_SASL_MECHANISM: 'plain', KAFKA_SASL_USERNAME: 'svc', KAFKA_SASL_PASSWORD: password, KAFKA_SSL: 'false' },
      });
      // Not through engines.startWorker: the consumer never starts, so the worker is never ready.
      const worker = await startWorker(config, { logger });
      try {
        const startMs = asOfToday(Date.UTC(2026, 10, 21, 12, 0, 0));
        // 100 posts, 10 at a time.
        for (let round = 0; round < 10; round++) {
          const answers = await Promise.all(Array.from({ length: 10 }, (_, i) => post(worker, [makeEvent(round * 10 + i, { runId: own.runId, startMs })])));
          expect(answers.map((answer) => answer.status)).toEqual(Array.from({ length: 10 }, () => 503));
        }
        const failed = lines.filter((line) => line.component === 'http' && /Kafka failed/.test(line.msg));
        expect(failed).toHaveLength(1);
        expect(failed[0]).toMatchObject({ level: 50, msg: 'producing HTTP-ingested events to Kafka failed; posts are answered 503 until the brokers acknowledge them' });
        expect(failed[0]!.err!.message).toMatch(/^The Kafka server does not support the requested API version: the brokers refuse this worker's SASL: check KAFKA_SASL_MECHANISM \(plain\), KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD/);
        // kafkajs's own line for each refused connection: once (the intake's failed starts say the same).
        expect(lines.filter((line) => line.component === 'kafkajs').map((line) => line.msg)).toEqual(['The Kafka server does not support the requested API version']);
        expect(text).not.toContain(password.slice(0, 6));
      } finally {
        await worker.stop();
      }
    });
  });
});
