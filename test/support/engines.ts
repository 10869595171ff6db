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
import { connectClickHouse, type ClickHouse } from '../../src/store/clickhouse.ts';
import { migrate } from '../../src/store/migrate.ts';
import { tablesIn, type Tables } from '../../src/store/tables.ts';
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

export interface MigratedClickHouse {
  readonly db: ClickHouse;
  readonly tables: Tables;
}

/**
 * A ClickHouse of the file's own (the real engine, or CLICKHOUSE_URL), connected and migrated before
 * the file's tests and closed after them, for tests of the stores without a worker.
 */
export function useMigratedClickHouse(options: { eventsTtlDays?: number; fileInsertMinBytes?: number } = {}): MigratedClickHouse {
  let service: ClickHouseService | undefined;
  let connected: MigratedClickHouse | undefined;

  beforeAll(async () => {
    service = await startClickHouse();
    const db = connectClickHouse({ url: service.url, username: service.username, password: service.password, dataDir: service.dataDir, fileInsertMinBytes: options.fileInsertMinBytes });
    const tables = tablesIn(service.database);
    await migrate(db, { tables, eventsTtlDays: options.eventsTtlDays ?? 30 }, createLogger('silent'));
    connected = { db, tables };
  });

  afterAll(async () => {
    await connected?.db.close();
    await service?.stop();
  });

  return {
    get db() {
      if (!connected) throw new Error('ClickHouse is not started yet (use it inside tests)');
      return connected.db;
    },
    get tables() {
      if (!connected) throw new Error('ClickHouse is not started yet (use it inside tests)');
      return connected.tables;
    },
  };
}
