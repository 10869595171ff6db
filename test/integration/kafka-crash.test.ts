/**
 * A Kafka consumer that crashes for good, on the real broker: kafkajs restarts a consumer after
 * retriable errors only, and after any other error the intake must say that it stopped (so /ready
 * turns 503 and the process exits for its orchestrator to restart it) rather than look alive.
 * The analysis part is replaced by one that fails beyond retry; the broker and kafkajs are real.
 */
import { describe, expect, inject, it } from 'vitest';
import type { AnalysisThread } from '../../src/ingest/analysis-thread.ts';
import { EventBuffer } from '../../src/ingest/event-buffer.ts';
import { createKafka } from '../../src/ingest/kafka-client.ts';
import { KafkaIntake } from '../../src/ingest/kafka-consumer.ts';
import { createLogger } from '../../src/logger.ts';
import { WorkerMetrics } from '../../src/metrics.ts';
import type { EventStore } from '../../src/store/event-store.ts';
import { asOfToday, makeEvent } from '../support/events.ts';
import { fake } from '../support/fake.ts';
import { testKafka } from '../support/kafka.ts';
import { testNames, waitFor } from '../support/worker.ts';

describe('Kafka intake after a crash kafkajs will not restart', () => {
  it('reports that it stopped, once, with the reason', async () => {
    const brokers = inject('kafkaBrokers');
    const names = testNames('crash_for_good');
    const logger = createLogger('silent');
    const metrics = new WorkerMetrics({ defaultMetrics: false });
    const stopped: Error[] = [];
    const unrecoverable = Object.assign(new Error('analysis is broken beyond retry'), { retriable: false });
    const intake = new KafkaIntake({
      kafka: createKafka({ clientId: 'crash-test', brokers }, logger),
      topic: names.topic,
      dlqTopic: names.dlqTopic,
      groupId: names.groupId,
      fromBeginning: true,
      sessionTimeoutMs: 6_000,
      heartbeatIntervalMs: 500,
      maxWaitMs: 100,
      store: fake<EventStore>({ storedOffsets: async () => new Map<number, number>() }),
      analysis: fake<AnalysisThread>({
        analyzeBatch: () => {
          throw unrecoverable;
        },
        keepPartitions: async () => ({ findings: [], ruleErrors: [] }),
      }),
      onDetection: () => undefined,
      buffer: new EventBuffer({
        flushRows: 1000,
        flushIntervalMs: 100,
        maxBufferedRows: 10_000,
        storeRows: async () => undefined,
        sendDeadLetters: async () => undefined,
        commit: async () => undefined,
        metrics,
        logger,
      }),
      onStopped: (error) => stopped.push(error),
      metrics,
      logger,
    });
    const producer = testKafka(brokers).producer();
    await producer.connect();
    try {
      await intake.start();
      expect(intake.stoppedReason).toBeUndefined();
      const event = makeEvent(0, { runId: names.runId, startMs: asOfToday(Date.UTC(2026, 10, 21, 9, 0, 0)) });
      await producer.send({ topic: names.topic, messages: [{ key: event.apiKeyId, value: JSON.stringify(event) }] });
      await waitFor(() => stopped.length > 0, 'the intake reports that it stopped', 30_000);
      expect(stopped).toHaveLength(1);
      expect(intake.stoppedReason).toMatch(/kafka consumer stopped: .*broken beyond retry/);
    } finally {
      await intake.disconnect().catch(() => undefined);
      await producer.disconnect();
    }
  });
});
