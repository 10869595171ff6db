/**
 * Vitest global setup: one Kafka-protocol broker for the whole run (suites use topics and groups of
 * their own), handed to the suites with provide/inject. ClickHouse is started per test file
 * (test/services/clickhouse.ts), because the embedded engine binds one directory per process.
 */
import type { TestProject } from 'vitest/node';
import { startKafka } from './kafka.ts';

declare module 'vitest' {
  export interface ProvidedContext {
    kafkaBrokers: string[];
    kafkaKind: string;
  }
}

export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  const kafka = await startKafka({ topics: [] });
  project.provide('kafkaBrokers', kafka.brokers);
  project.provide('kafkaKind', kafka.kind);
  return () => kafka.stop();
}
