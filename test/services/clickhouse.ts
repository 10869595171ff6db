/**
 * A ClickHouse for tests and benchmarks, from the best source at hand:
 *  1. `env`:       CLICKHOUSE_URL names a running server;
 *  2. `container`: a Docker engine answers -> clickhouse/clickhouse-server through testcontainers;
 *  3. `embedded`:  otherwise the embedded engine (chdb) in a fresh temporary directory.
 * Every call gets its own database name, so suites sharing a server do not see each other's rows.
 * The embedded engine binds one data directory per process: use one service per test file.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { dockerAvailable } from './docker.ts';

export interface ClickHouseService {
  kind: 'env' | 'container' | 'embedded';
  /** Server URL; undefined for the embedded engine. */
  url?: string;
  username: string;
  password: string;
  /** Data directory for the embedded engine (also set for servers, unused there). */
  dataDir: string;
  /** A database name of this service's own. */
  database: string;
  stop(): Promise<void>;
}

const CLICKHOUSE_IMAGE = 'clickhouse/clickhouse-server:25.8';

export async function startClickHouse(): Promise<ClickHouseService> {
  const dataDir = mkdtempSync(join(tmpdir(), 'sc-clickhouse-'));
  const database = `sc_test_${randomBytes(4).toString('hex')}`;
  // The embedded engine lives as long as the process and may still be merging parts into the
  // directory: retry, and leave a temporary directory behind rather than fail the suite over it.
  const removeDir = async () => {
    try {
      rmSync(dataDir, { recursive: true, force: true, maxRetries: 5, retryDelay: 200 });
    } catch {
      // left for the OS to clean up with the rest of the temporary directory
    }
  };
  const fromEnv = process.env.CLICKHOUSE_URL?.trim();
  if (fromEnv) {
    return {
      kind: 'env',
      url: fromEnv,
      username: process.env.CLICKHOUSE_USER ?? 'default',
      password: process.env.CLICKHOUSE_PASSWORD ?? '',
      dataDir,
      database,
      stop: removeDir,
    };
  }
  if (process.env.CLICKHOUSE_SERVICE !== 'embedded' && (await dockerAvailable())) {
    const { GenericContainer, Wait } = await import('testcontainers');
    const container = await new GenericContainer(CLICKHOUSE_IMAGE)
      .withExposedPorts(8123)
      .withEnvironment({ CLICKHOUSE_USER: 'test', CLICKHOUSE_PASSWORD: 'test', CLICKHOUSE_DEFAULT_ACCESS_MANAGEMENT: '1' })
      .withWaitStrategy(Wait.forHttp('/ping', 8123).forStatusCode(200))
      .withStartupTimeout(120_000)
      .start();
    return {
      kind: 'container',
      url: `http://${container.getHost()}:${container.getMappedPort(8123)}`,
      username: 'test',
      password: 'test',
      dataDir,
      database,
      stop: async () => {
        await container.stop();
        await removeDir();
      },
    };
  }
  return { kind: 'embedded', username: 'default', password: '', dataDir, database, stop: removeDir };
}
