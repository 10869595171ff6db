/**
 * /ready while the Kafka intake cannot run, on the real broker: with KAFKA_BROKERS set, a worker
 * whose consumer has not joined its group takes in nothing, so it must answer 503 with the reason
 * (here the brokers are unreachable: bootstrap goes through a port that is closed at first), and
 * 200 once the consumer runs (a relay to the broker then opens on that port).
 */
import { describe, expect, it } from 'vitest';
import { createLogger } from '../../src/logger.ts';
import { startWorker } from '../../src/main.ts';
import { useEngines } from '../support/engines.ts';
import { relayToBroker } from '../support/kafka.ts';
import { freePort } from '../support/ports.ts';
import { readiness, testConfig, testNames, waitFor } from '../support/worker.ts';

const names = testNames('readiness');

describe('/ready with a Kafka intake', () => {
  const engines = useEngines();

  it('answers 503 naming the Kafka consumer while the brokers are unreachable, and 200 once it runs', async () => {
    const port = await freePort();
    const config = testConfig({ brokers: [`127.0.0.1:${port}`], clickhouse: engines.clickhouse, names });
    // Not through engines.startWorker: that waits for `ready`, which needs the consumer.
    const worker = await startWorker(config, { logger: createLogger(process.env.TEST_LOG_LEVEL ?? 'silent') });
    let relay: Awaited<ReturnType<typeof relayToBroker>> | undefined;
    try {
      // Storage is migrated first; then the consumer's start fails once kafkajs has retried (about 10 s).
      const state = async () => JSON.stringify(await readiness(worker.url));
      await waitFor(async () => /kafka/.test((await readiness(worker.url)).reason ?? ''), 'the reason turns to Kafka', 60_000, state);
      expect(await readiness(worker.url)).toEqual({ status: 503, reason: expect.stringMatching(/^kafka consumer starting/) });
      await waitFor(async () => /cannot start/.test((await readiness(worker.url)).reason ?? ''), 'the reason says why', 60_000, state);
      const notReady = await readiness(worker.url);
      expect(notReady.status).toBe(503);
      expect(notReady.reason).toMatch(new RegExp(`^kafka consumer cannot start \\(retrying\\): .*ECONNREFUSED 127\\.0\\.0\\.1:${port}`));

      relay = await relayToBroker(port, engines.brokers[0]!);
      await waitFor(async () => (await readiness(worker.url)).status === 200, '/ready turns 200 once the consumer runs', 90_000, state);
      await worker.ready;
    } finally {
      await worker.stop();
      await relay?.close();
    }
  });
});
