/**
 * /ready while start-up steps are retried, on the real ClickHouse engine (and the real broker),
 * with reads failing at the storage boundary: a worker whose open alerts cannot be loaded would
 * open a second alert where one is open, so it answers 503 saying so until they are loaded; a
 * webhook dispatcher that cannot start holds back neither intake nor readiness (it is needed for
 * delivery only, and is retried beside them).
 */
import { describe, expect, it } from 'vitest';
import type { Config } from '../../src/config.ts';
import { createLogger } from '../../src/logger.ts';
import { startWorker, type Worker, type WorkerDeps } from '../../src/main.ts';
import type { ClickHouse } from '../../src/store/clickhouse.ts';
import { useEngines } from '../support/engines.ts';
import { readiness, testConfig, testNames, waitFor } from '../support/worker.ts';

/** Storage whose reads that contain `marker` fail while `failing()` says so; counts the failed and the answered ones. */
function failingReads(marker: string, failing: () => boolean) {
  const reads = { failed: 0, answered: 0 };
  const wrapClickHouse = (db: ClickHouse): ClickHouse => ({
    ...db,
    queryRows: async <T,>(query: string, params?: Record<string, unknown>) => {
      if (!query.includes(marker)) return db.queryRows<T>(query, params);
      if (failing()) {
        reads.failed++;
        throw new Error('injected: storage cannot be read');
      }
      const rows = await db.queryRows<T>(query, params);
      reads.answered++;
      return rows;
    },
  });
  return { reads, wrapClickHouse };
}

describe('/ready while start-up steps are retried', () => {
  const engines = useEngines();

  // Not through engines.startWorker: that waits for `ready`, which is what is held back here.
  function start(config: Config, deps: WorkerDeps): Promise<Worker> {
    return startWorker(config, { logger: createLogger(process.env.TEST_LOG_LEVEL ?? 'silent'), ...deps });
  }

  it('answers 503 naming the open alerts until they can be loaded, then 200', async () => {
    let unreadable = true;
    const { reads, wrapClickHouse } = failingReads("WHERE status IN ('open', 'acknowledged') OR updated_at", () => unreadable);
    const worker = await start(testConfig({ clickhouse: engines.clickhouse, names: testNames('startalerts') }), { wrapClickHouse });
    try {
      const state = async () => JSON.stringify(await readiness(worker.url));
      await waitFor(() => reads.failed >= 2, 'the worker retries loading the open alerts', 60_000, state);
      expect(await readiness(worker.url)).toEqual({ status: 503, reason: 'storage unavailable: cannot load the open alerts (retrying)' });

      unreadable = false;
      await waitFor(async () => (await readiness(worker.url)).status === 200, '/ready turns 200 once the open alerts are loaded', 60_000, state);
      expect(reads.answered).toBe(1);
      await worker.ready;
    } finally {
      await worker.stop();
    }
  });

  it('with Kafka, joins the group and answers 200 while the webhook dispatcher cannot start yet, which is retried until it does', async () => {
    let unreadable = true;
    const { reads, wrapClickHouse } = failingReads('.webhook_breakers FINAL', () => unreadable);
    const config = testConfig({ brokers: engines.brokers, clickhouse: engines.clickhouse, names: testNames('startwebhooks') });
    const worker = await start(config, { wrapClickHouse });
    try {
      const state = async () => `${JSON.stringify(await readiness(worker.url))}, breaker reads failed: ${reads.failed}`;
      await waitFor(async () => (await readiness(worker.url)).status === 200, '/ready turns 200 with webhooks not started', 90_000, state);
      await worker.ready;
      expect(reads).toMatchObject({ answered: 0 });
      expect(reads.failed).toBeGreaterThan(0);

      unreadable = false;
      await waitFor(() => reads.answered === 1, 'the webhook dispatcher starts once storage can be read', 60_000, state);
      expect(await readiness(worker.url)).toEqual({ status: 200 });
    } finally {
      await worker.stop();
    }
  });
});
