/**
 * Event times storage must not take, on the real engines. Raw events are partitioned by day and kept
 * until toDateTime(ts) + EVENTS_TTL_DAYS: an event dated far ahead (a producer's clock off, or a
 * made-up time up to 2100) would make a part of its own for its day, kept for years, and a stream of
 * them thousands, stalling storage for every client (and a DateTime ends in 2106: past it a TTL
 * wraps into the past, and the engine would drop the row at insert while the rollup counts it). So
 * an event dated more than a day ahead of the worker's clock is refused at validation, naming its
 * timestamp: dead-lettered from Kafka, rejected over HTTP; intake goes on, and every event accepted
 * is stored, raw and in the rollup. The same holds for an event dated more than EVENTS_TTL_DAYS
 * ago, whose raw row has expired already: the engine would drop it at insert while the rollup counts
 * it, and every guard against a redelivery (they read raw rows) would miss it, so it would be
 * counted again each time it is delivered again.
 */
import { describe, expect, it } from 'vitest';
import { useEngines } from '../support/engines.ts';
import { makeEvent } from '../support/events.ts';
import { groupCaughtUp, produceAll, readTopic } from '../support/kafka.ts';
import { TEST_INGEST_TOKEN, testConfig, testNames, waitFor } from '../support/worker.ts';

const names = testNames('times');
const HOUR = 3_600_000;
const TOO_FAR_AHEAD = "a later event is dated more than a day ahead of this worker's clock";

/** Events of one way in: two storable (now, and 23 hours ahead), four not (a day and an hour ahead, and the years a timestamp may still name). */
function eventsOf(way: string) {
  const event = (i: number, timestamp: string | number) => ({ ...makeEvent(i, { runId: `${names.runId}_${way}`, startMs: Date.now() }), timestamp });
  return {
    storable: [event(0, new Date().toISOString()), event(1, new Date(Date.now() + 23 * HOUR).toISOString())],
    unstorable: [event(2, '2099-06-01T00:00:00.000Z'), event(3, Date.UTC(2099, 5, 1)), event(4, '2150-01-01T00:00:00.000Z'), event(5, Date.now() + 25 * HOUR)],
  };
}

describe('event times storage must not take', () => {
  const engines = useEngines();

  it('are refused at validation, over HTTP and from Kafka; every event accepted is stored', async () => {
    const { clickhouse, producer, kafka } = engines;
    const worker = await engines.startWorker(testConfig({ brokers: engines.brokers, clickhouse, names }));
    const stored = async (eventIds: string[]) => {
      const [row] = await worker.clickhouse.queryRows<{ raw: number }>(
        `SELECT count() AS raw FROM ${clickhouse.database}.request_events WHERE event_id IN {ids:Array(String)}`,
        { ids: eventIds },
      );
      return row?.raw;
    };

    const http = eventsOf('http');
    const response = await fetch(`${worker.url}/v1/ingest/events`, {
      method: 'POST',
      headers: { authorization: `Bearer ${TEST_INGEST_TOKEN}`, 'content-type': 'application/json' },
      body: JSON.stringify([...http.storable, ...http.unstorable]),
    });
    expect(response.status).toBe(202);
    const { data } = (await response.json()) as { data: { accepted: number; rejected: number; errors: { index: number; reason: string; details: { path: string[]; message: string }[] }[] } };
    expect(data).toMatchObject({ accepted: 2, rejected: 4 });
    expect(data.errors.map((error) => error.index)).toEqual([2, 3, 4, 5]);
    for (const error of data.errors) {
      expect(error.reason).toBe('validation_failed');
      expect(error.details).toEqual([{ path: ['timestamp'], message: expect.stringContaining(TOO_FAR_AHEAD) }]);
    }
    // With Kafka, posted events go through the topic: stored once the consumer has them.
    await waitFor(async () => (await stored(http.storable.map((event) => event.eventId))) === 2, 'the posted events are stored');

    const fromKafka = eventsOf('kafka');
    await producer.send({
      topic: names.topic,
      messages: [...fromKafka.unstorable, ...fromKafka.storable].map((event) => ({ key: event.apiKeyId, value: JSON.stringify(event) })),
    });
    await waitFor(() => groupCaughtUp(kafka, names.groupId, names.topic), 'the worker commits past every message');
    const deadLetters = (await readTopic(kafka, names.dlqTopic, fromKafka.unstorable.length)).map((value) => JSON.parse(value));
    expect(deadLetters.map((record) => JSON.parse(record.payload).eventId).sort()).toEqual(fromKafka.unstorable.map((event) => event.eventId).sort());
    for (const record of deadLetters) {
      expect(record.reason).toBe('validation_failed');
      expect(record.errors).toEqual([{ path: ['timestamp'], message: expect.stringContaining(TOO_FAR_AHEAD) }]);
    }
    expect(await stored(fromKafka.storable.map((event) => event.eventId))).toBe(2);

    // Nothing counted in the rollup that the raw table lost.
    const [rollup] = await worker.clickhouse.queryRows<{ requests: number }>(
      `SELECT sum(requests) AS requests FROM ${clickhouse.database}.request_rollup_1m WHERE api_key_id LIKE {keys:String}`,
      { keys: `pk_live_${names.runId}_%` },
    );
    expect(rollup?.requests).toBe(4);
  });

  it('refuses an event older than EVENTS_TTL_DAYS over HTTP and from Kafka, delivered again or not, so the rollup counts only what is stored', async () => {
    const { clickhouse, kafka } = engines;
    const own = testNames('expired');
    const config = testConfig({ brokers: engines.brokers, clickhouse, names: own, extra: { EVENTS_TTL_DAYS: '30' } });
    const dated = (i: number, ageDays: number) => makeEvent(i, { runId: own.runId, startMs: Date.now() - ageDays * 86_400_000 });
    // A backlog, a backfill or a producer whose clock is 40 days behind; and two events of today.
    const old = Array.from({ length: 20 }, (_, i) => dated(i, 40));
    const recent = [dated(20, 0), dated(21, 0)];
    await produceAll(engines.producer, own.topic, [...old, ...recent].map((event) => ({ key: event.apiKeyId, value: JSON.stringify(event) })), 100);
    const first = await engines.startWorker(config);
    await waitFor(() => groupCaughtUp(kafka, own.groupId, own.topic), 'the first group commits past every message', 90_000);

    const posted = [dated(30, 40), dated(31, 0)];
    const response = await fetch(`${first.url}/v1/ingest/events`, {
      method: 'POST',
      headers: { authorization: `Bearer ${TEST_INGEST_TOKEN}`, 'content-type': 'application/json' },
      body: JSON.stringify(posted),
    });
    expect(response.status).toBe(202);
    const { data } = (await response.json()) as { data: { accepted: number; rejected: number; errors: { index: number; reason: string; details: unknown[] }[] } };
    expect(data).toMatchObject({ accepted: 1, rejected: 1 });
    expect(data.errors).toEqual([
      { index: 0, eventId: posted[0]!.eventId, reason: 'validation_failed', details: [{ path: ['timestamp'], message: expect.stringContaining('older than the raw events are kept (EVENTS_TTL_DAYS=30)') }] },
    ]);
    await waitFor(() => groupCaughtUp(kafka, own.groupId, own.topic), 'the posted event is stored', 90_000);
    await first.stop();

    // A group reading from the beginning gets every message again (as a crash between store and commit would deliver them).
    const replayGroup = `${own.groupId}.replay`;
    const worker = await engines.startWorker(testConfig({ brokers: engines.brokers, clickhouse, names: { ...own, groupId: replayGroup }, extra: { EVENTS_TTL_DAYS: '30' } }));
    await waitFor(() => groupCaughtUp(kafka, replayGroup, own.topic), 'the replay group reaches the end', 90_000);

    // Dead-lettered by the first group; the replay group skips those below an offset stored since, and
    // dead-letters the others again. So the topic holds each at least once, and some twice: it is read
    // until it has given every one (its partitions come in any order, a repeat before another's first).
    const eventIdOf = (value: string): string => JSON.parse(JSON.parse(value).payload).eventId;
    const values = await readTopic(kafka, own.dlqTopic, old.length, (read) => new Set(read.map(eventIdOf)).size >= old.length);
    const deadLetters = values.map((value) => JSON.parse(value));
    expect(new Set(values.map(eventIdOf))).toEqual(new Set(old.map((event) => event.eventId)));
    for (const record of deadLetters) {
      expect(record.reason).toBe('validation_failed');
      expect(record.errors).toEqual([{ path: ['timestamp'], message: expect.stringContaining('older than the raw events are kept (EVENTS_TTL_DAYS=30)') }]);
    }
    const [row] = await worker.clickhouse.queryRows<{ raw: number; rollup: number }>(
      `SELECT (SELECT count() FROM ${clickhouse.database}.request_events WHERE api_key_id LIKE {keys:String}) AS raw,
              (SELECT sum(requests) FROM ${clickhouse.database}.request_rollup_1m WHERE api_key_id LIKE {keys:String}) AS rollup`,
      { keys: `pk_live_${own.runId}_%` },
    );
    // The three events of today, once each, raw and in the rollup; nothing of the old ones in either.
    expect({ raw: Number(row!.raw), rollup: Number(row!.rollup) }).toEqual({ raw: 3, rollup: 3 });
  });
});
