/** Builds a worker configuration for tests: real broker and ClickHouse, topics and group of its own. */
import { randomBytes } from 'node:crypto';
import { loadConfig, type Config } from '../../src/config.ts';
import type { Worker } from '../../src/main.ts';
import type { ClickHouseService } from '../services/clickhouse.ts';

export const TEST_INGEST_TOKEN = 'test-ingest-token-0123456789';

export interface TestNames {
  runId: string;
  topic: string;
  dlqTopic: string;
  groupId: string;
}

export function testNames(prefix: string): TestNames {
  const runId = `${prefix}_${randomBytes(3).toString('hex')}`;
  return { runId, topic: `events.${runId}`, dlqTopic: `events.${runId}.dlq`, groupId: `worker.${runId}` };
}

/** Environment variables for a worker under test (also used to spawn it as a process). */
export function testEnv(options: {
  brokers?: string[];
  clickhouse: ClickHouseService;
  names: TestNames;
  extra?: Record<string, string>;
}): Record<string, string> {
  const { clickhouse, names } = options;
  return {
    FEATURE_ANOMALY_DETECTION: 'true',
    HOST: '127.0.0.1',
    PORT: '0',
    LOG_LEVEL: 'warn',
    INGEST_TOKEN: TEST_INGEST_TOKEN,
    DATA_DIR: clickhouse.dataDir,
    CLICKHOUSE_DATABASE: clickhouse.database,
    ...(clickhouse.url ? { CLICKHOUSE_URL: clickhouse.url, CLICKHOUSE_USER: clickhouse.username, CLICKHOUSE_PASSWORD: clickhouse.password } : {}),
    ...(options.brokers
      ? {
          KAFKA_BROKERS: options.brokers.join(','),
          KAFKA_TOPIC: names.topic,
          KAFKA_DLQ_TOPIC: names.dlqTopic,
          KAFKA_GROUP_ID: names.groupId,
          // The mock broker makes each rebalance wait sessionTimeout - 1 s: keep it short.
          KAFKA_SESSION_TIMEOUT_MS: '6000',
          KAFKA_HEARTBEAT_INTERVAL_MS: '500',
          KAFKA_MAX_WAIT_MS: '100',
        }
      : {}),
    STORE_FLUSH_INTERVAL_MS: '200',
    ...options.extra,
  };
}

export function testConfig(options: Parameters<typeof testEnv>[0]): Config {
  return loadConfig(testEnv(options));
}

/** Polls every `intervalMs` until the check returns true, or fails with the message (and what `state` says then) after the timeout. */
export async function waitFor(
  check: () => Promise<boolean> | boolean,
  message: string,
  timeoutMs = 60_000,
  state?: () => Promise<string> | string,
  intervalMs = 100,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms: ${message}${state ? ` (${await state()})` : ''}`);
    await new Promise((resolve) => setTimeout(resolve, intervalMs));
  }
}

/** What a worker's /ready answers: its status and, when not ready, the reason. */
export async function readiness(url: string): Promise<{ status: number; reason?: string }> {
  const response = await fetch(`${url}/ready`);
  return { status: response.status, reason: ((await response.json()) as { reason?: string }).reason };
}

/** A metric's value summed over its labels (0 when it has none yet). */
export async function metricTotal(worker: Worker, name: string): Promise<number> {
  const metric = (await worker.metrics.registry.getMetricsAsJSON()).find((m) => m.name === name);
  return metric?.values.reduce((sum, value) => sum + value.value, 0) ?? 0;
}

/**
 * A metric as a worker's /metrics serves it: the sum of its series whose labels include `labels`
 * (all of them by default); 0 when it has none, or the worker cannot be reached.
 */
export async function scrapeMetric(url: string, name: string, labels: Record<string, string> = {}): Promise<number> {
  const wanted = Object.entries(labels).map(([label, value]) => `${label}="${value}"`);
  try {
    const text = await (await fetch(`${url}/metrics`)).text();
    return text
      .split('\n')
      .filter((line) => line.startsWith(`${name}{`) || line.startsWith(`${name} `))
      .filter((line) => wanted.every((pair) => line.slice(0, line.lastIndexOf(' ')).includes(pair)))
      .reduce((sum, line) => sum + Number(line.slice(line.lastIndexOf(' ') + 1)), 0);
  } catch {
    return 0;
  }
}

/** Waits until every one of these workers (replicas in one consumer group) owns partitions: the group has settled. */
export async function waitForPartitionsSplit(workers: readonly Worker[]): Promise<void> {
  const owned = () => Promise.all(workers.map((worker) => metricTotal(worker, 'security_center_assigned_partitions')));
  await waitFor(
    async () => (await owned()).every((count) => count > 0),
    'every replica owns partitions',
    60_000,
    async () => `partitions owned: ${(await owned()).join(' and ')}`,
  );
}
