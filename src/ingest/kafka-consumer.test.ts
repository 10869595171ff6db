import type { Batch, EachBatchPayload, Kafka, KafkaMessage, ProducerRecord } from 'kafkajs';
import { describe, expect, it } from 'vitest';
import { makeEvent } from '../../test/support/events.ts';
import { parseRequestEventText, parseRequestEventValue, type RequestEvent } from '../events/request-event.ts';
import { createLogger } from '../logger.ts';
import { WorkerMetrics } from '../metrics.ts';
import type { EventStore } from '../store/event-store.ts';
import type { AnalysisThread } from './analysis-thread.ts';
import type { EventBuffer } from './event-buffer.ts';
import { BacklogWatch, KafkaIntake } from './kafka-consumer.ts';

describe('BacklogWatch', () => {
  it('says the replica caught up on the batch that ends the last partition behind, once', () => {
    const watch = new BacklogWatch();
    expect(watch.note(0, 5000)).toBe(false);
    expect(watch.note(1, 2000)).toBe(false);
    expect(watch.note(0, 0)).toBe(false); // partition 1 is still behind
    expect(watch.note(1, 0)).toBe(true);
    expect(watch.note(1, 0)).toBe(false); // already caught up: no backlog ended
  });

  it('never reports a backlog on a consumer that was never behind', () => {
    const watch = new BacklogWatch();
    for (let i = 0; i < 5; i++) expect(watch.note(i % 2, 0)).toBe(false);
  });

  it('forgets partitions behind before a rebalance', () => {
    const watch = new BacklogWatch();
    watch.note(3, 100);
    watch.reset();
    expect(watch.note(0, 10)).toBe(false);
    expect(watch.note(0, 0)).toBe(true); // partition 3 went elsewhere; it does not hold the backlog open
  });
});

describe('KafkaIntake', () => {
  /** An intake over a stand-in consumer: the test hands it batches of partition 0 as kafkajs would. */
  async function intakeWithBatches() {
    let eachBatch: ((payload: EachBatchPayload) => Promise<void>) | undefined;
    let onJoin: ((event: unknown) => void) | undefined;
    const analysed: number[][] = [];
    const made: string[] = [];
    const sent: ProducerRecord[] = [];
    const metrics = new WorkerMetrics({ defaultMetrics: false });
    const consumer = {
      events: { GROUP_JOIN: 'join', CRASH: 'crash' },
      on: (name: string, listener: (event: unknown) => void) => {
        if (name === 'join') onJoin = listener;
      },
      connect: async () => undefined,
      subscribe: async () => undefined,
      run: async (options: { eachBatch: (payload: EachBatchPayload) => Promise<void> }) => {
        eachBatch = options.eachBatch;
      },
    };
    const intake = new KafkaIntake({
      kafka: {
        consumer: () => (made.push('consumer'), consumer),
        producer: () => (made.push('producer'), { connect: async () => undefined, send: async (record: ProducerRecord) => (sent.push(record), []) }),
      } as unknown as Kafka,
      topic: 't',
      dlqTopic: 't.dlq',
      groupId: 'g',
      fromBeginning: true,
      sessionTimeoutMs: 6_000,
      heartbeatIntervalMs: 500,
      maxWaitMs: 100,
      // Nothing stored yet when the partition is assigned; the rows of offsets 0-99 once they are.
      store: {
        storedOffsets: async () => new Map(analysed.length > 0 ? [[0, 99]] : []),
        eventIdsAtFirstStoredOffset: async () => ({ offset: 0, eventIds: ['evt_0'] }),
        repairViews: async () => ({ rollup: 0, keyNetworks: 0 }),
      } as unknown as EventStore,
      analysis: {
        analyzeBatch: async (_topic: string, _partition: number, messages: KafkaMessage[]) => {
          analysed.push(messages.map((message) => Number(message.offset)));
          return { rows: Buffer.alloc(0), rowCount: messages.length, rejections: [], duplicates: 0, findings: [], ruleErrors: [] };
        },
        keepPartitions: async () => ({ findings: [], ruleErrors: [] }),
      } as unknown as AnalysisThread,
      onDetection: () => undefined,
      buffer: { add: () => Promise.resolve(), waitForCapacity: async () => undefined, releasePartitions: () => 0 } as unknown as EventBuffer,
      metrics,
      logger: createLogger('silent'),
    });
    await intake.start();
    onJoin!({ payload: { memberAssignment: { t: [0] } } });
    /** Hands the intake a batch of these offsets (each message an event `evt_<prefix><offset>`) and waits until it took it. */
    const deliver = async (offsets: number[], highWatermark: number, prefix: string) => {
      const messages = offsets.map((offset) => ({ offset: String(offset), value: Buffer.from(JSON.stringify({ eventId: `evt_${prefix}${offset}` })) }) as KafkaMessage);
      const batch = {
        topic: 't',
        partition: 0,
        highWatermark: String(highWatermark),
        messages,
        isEmpty: () => messages.length === 0,
        firstOffset: () => messages[0]!.offset,
        lastOffset: () => messages.at(-1)!.offset,
      } as unknown as Batch;
      await eachBatch!({ batch, resolveOffset: () => undefined, heartbeat: async () => undefined, isRunning: () => true, isStale: () => false } as unknown as EachBatchPayload);
      await intake.settle();
    };
    return { intake, deliver, analysed, made, sent, metrics };
  }

  it('makes its consumer and its dead-letter producer from the one client it is given, with its TLS and SASL settings', async () => {
    expect((await intakeWithBatches()).made.sort()).toEqual(['consumer', 'producer']);
  });

  it('publishes events posted over HTTP to its topic, keyed by API key, acknowledged by all in-sync replicas, as the consumer reads them back', async () => {
    const { intake, sent } = await intakeWithBatches();
    const events = [0, 1, 2].map((i) => (parseRequestEventValue(makeEvent(i, { runId: 'unit', startMs: Date.UTC(2026, 10, 21), keys: 2 })) as { event: RequestEvent }).event);
    await intake.publish(events);
    expect(sent).toEqual([{ topic: 't', acks: -1, messages: events.map((event) => ({ key: event.apiKeyId, value: expect.any(String) })) }]);
    expect(sent[0]!.messages.map((message) => parseRequestEventText(message.value as string))).toEqual(events.map((event) => ({ ok: true, event })));
  });

  const range = (from: number, count: number) => Array.from({ length: count }, (_, i) => from + i);

  it('takes the messages of a partition whose log started again under what it handed off for new ones, not for redeliveries', async () => {
    const { deliver, analysed, metrics } = await intakeWithBatches();
    await deliver(range(0, 100), 100, '');
    // The broker comes back without its data (or the topic is created again) while this replica
    // owns the partition: offsets 0-9 again, other events, and the partition ends at 10.
    await deliver(range(0, 10), 10, 'new_');
    expect(analysed).toEqual([range(0, 100), range(0, 10)]);
    const duplicates = await metrics.eventsDuplicate.get();
    expect(duplicates.values.reduce((sum, value) => sum + value.value, 0)).toBe(0);
    expect((await metrics.staleStoredOffsets.get()).values).toEqual([{ value: 1, labels: { reason: 'beyond_end' } }]);
  });

  it('still skips a redelivery below what it handed off', async () => {
    const { deliver, analysed } = await intakeWithBatches();
    await deliver(range(0, 100), 200, '');
    await deliver(range(50, 100), 200, ''); // offsets 50-99 again, then 100-149
    expect(analysed).toEqual([range(0, 100), range(100, 50)]);
  });
});
