/**
 * The real engines for one integration file: the run's Kafka-protocol broker (global setup), a
 * ClickHouse of the file's own, a connected producer; workers started through it are stopped after
 * the file.
 */
import type { Kafka, Producer } from 'kafkajs';
import { afterAll, beforeAll, inject } from 'vitest';
import type { Config } from '../../src/config.ts';
import { createLogger } from '../../src/logger.ts';
import { startWorker, type Worker, type WorkerDeps } from '../../src/main.ts';
import { startClickHouse, type ClickHouseService } from '../services/clickhouse.ts';
import { testKafka } from './kafka.ts';

export interface Engines {
  readonly brokers: string[];
  readonly kafka: Kafka;
  readonly clickhouse: ClickHouseService;
  readonly producer: Producer;
  /** Starts a worker (quiet by default) and waits until it is ready. */
  startWorker(config: Config, deps?: WorkerDeps): Promise<Worker>;
}

export function useEngines(): Engines {
  const brokers = inject('kafkaBrokers');
  const kafka = testKafka(brokers);
  const workers: Worker[] = [];
  let clickhouse: ClickHouseService | undefined;
  let producer: Producer | undefined;

  beforeAll(async () => {
    clickhouse = await startClickHouse();
    producer = kafka.producer();
    await producer.connect();
  });

  afterAll(async () => {
    for (const worker of workers) await worker.stop();
    await producer?.disconnect();
    await clickhouse?.stop();
  });

  return {
    brokers,
    kafka,
    get clickhouse() {
      if (!clickhouse) throw new Error('engines are not started yet (use them inside tests)');
      return clickhouse;
    },
    get producer() {
      if (!producer) throw new Error('engines are not started yet (use them inside tests)');
      return producer;
    },
    async startWorker(config, deps = {}) {
      const worker = await startWorker(config, { logger: createLogger(process.env.TEST_LOG_LEVEL ?? 'silent'), ...deps });
      workers.push(worker);
      await worker.ready;
      return worker;
    },
  };
}
