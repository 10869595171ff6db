/**
 * Event times storage cannot hold, on the real engines. Raw events expire at toDateTime(ts) +
 * EVENTS_TTL_DAYS, and a ClickHouse DateTime ends in 2106: past it the TTL wraps around into the
 * past, and the engine drops the row as expired at insert while the rollup counts it (an event
 * dated 2099 with 10 years of retention, or any time an ISO string can write). Such an event must be
 * refused at validation, naming its timestamp: dead-lettered from Kafka, rejected over HTTP; intake
 * goes on, and every event accepted is stored, raw and in the rollup.
 */
import { describe, expect, it } from 'vitest';
import { useEngines } from '../support/engines.ts';
import { makeEvent } from '../support/events.ts';
import { groupCaughtUp, readTopic } from '../support/kafka.ts';
import { TEST_INGEST_TOKEN, testConfig, testNames, waitFor } from '../support/worker.ts';

const names = testNames('times');
const TTL_DAYS = 3650;
/** The latest time whose TTL, 3650 days on, still fits a DateTime (2106-02-07 06:28:15 UTC). */
const LATEST = '2096-02-09T06:28:15.999Z';

/** Events of one way in: two storable (now, and the latest time), three not. */
function eventsOf(way: string) {
  const event = (i: number, timestamp: string | number) => ({ ...makeEvent(i, { runId: `${names.runId}_${way}`, startMs: Date.now() }), timestamp });
  return {
    storable: [event(0, new Date().toISOString()), event(1, LATEST)],
    unstorable: [event(2, '2099-06-01T00:00:00.000Z'), event(3, Date.UTC(2099, 5, 1)), event(4, '2150-01-01T00:00:00.000Z'), event(5, '2096-02-09T06:28:16.000Z')],
  };
}

describe('event times storage cannot hold', () => {
  const engines = useEngines();

  it('are refused at validation, over HTTP and from Kafka; every event accepted is stored', async () => {
    const { clickhouse, producer, kafka } = engines;
    const worker = await engines.startWorker(testConfig({ brokers: engines.brokers, clickhouse, names, extra: { EVENTS_TTL_DAYS: String(TTL_DAYS) } }));
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
      expect(error.details).toEqual([{ path: ['timestamp'], message: expect.stringContaining(`to ${LATEST}`) }]);
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
      expect(record.errors).toEqual([{ path: ['timestamp'], message: expect.stringContaining(`to ${LATEST}`) }]);
    }
    expect(await stored(fromKafka.storable.map((event) => event.eventId))).toBe(2);

    // Nothing counted in the rollup that the raw table lost.
    const [rollup] = await worker.clickhouse.queryRows<{ requests: number }>(
      `SELECT sum(requests) AS requests FROM ${clickhouse.database}.request_rollup_1m WHERE api_key_id LIKE {keys:String}`,
      { keys: `pk_live_${names.runId}_%` },
    );
    expect(rollup?.requests).toBe(4);
  });
});
