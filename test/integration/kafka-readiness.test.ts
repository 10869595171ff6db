/**
 * /ready while the Kafka intake cannot run, on the real broker: with KAFKA_BROKERS set, a worker
 * whose consumer has not joined its group takes in nothing, so it must answer 503 with the reason
 * (here the brokers are unreachable: bootstrap goes through a port that is closed at first), and
 * 200 once the consumer runs (a relay to the broker then opens on that port). Meanwhile kafkajs's
 * own lines for each failed attempt are logged once a minute at most, and a broker that refuses the
 * worker's SASL is named as such, with the settings to check.
 */
import { describe, expect, it } from 'vitest';
import { startWorker } from '../../src/main.ts';
import { useEngines } from '../support/engines.ts';
import { relayToBroker } from '../support/kafka.ts';
import { capturedLogs } from '../support/logs.ts';
import { freePort } from '../support/ports.ts';
import { readiness, testConfig, testNames, waitFor } from '../support/worker.ts';

const names = testNames('readiness');

interface LogLine {
  time: string;
  level: number;
  component?: string;
  msg: string;
  err?: { message: string };
}

/** kafkajs's lines of one message (a repeat's "(still; ...)" counted with it) less than a minute after the one before. */
function kafkajsRepeatsWithinAMinute(lines: readonly LogLine[]): string[] {
  const last = new Map<string, number>();
  const repeats: string[] = [];
  for (const line of lines.filter((candidate) => candidate.component === 'kafkajs')) {
    const message = line.msg.replace(/ \(still; logged at most once a minute\)$/, '');
    const at = Date.parse(line.time);
    if (at - (last.get(message) ?? Number.NEGATIVE_INFINITY) < 60_000) repeats.push(message);
    last.set(message, at);
  }
  return repeats;
}

describe('/ready with a Kafka intake', () => {
  const engines = useEngines();

  it('answers 503 naming the Kafka consumer while the brokers are unreachable, and 200 once it runs', async () => {
    const port = await freePort();
    const config = testConfig({ brokers: [`127.0.0.1:${port}`], clickhouse: engines.clickhouse, names });
    const logs = capturedLogs<LogLine>();
    // Not through engines.startWorker: that waits for `ready`, which needs the consumer.
    const worker = await startWorker(config, { logger: logs.logger });
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
      // kafkajs logged two errors per connection retry, each start: each message once (a minute at most).
      const refused = `Connection error: connect ECONNREFUSED 127.0.0.1:${port}`;
      expect(logs.lines.filter((line) => line.component === 'kafkajs').map((line) => line.msg)).toEqual(
        expect.arrayContaining([refused, `Failed to connect to seed broker, trying another broker from the list: ${refused}`]),
      );
      expect(kafkajsRepeatsWithinAMinute(logs.lines)).toEqual([]);
    } finally {
      await worker.stop();
      await relay?.close();
    }
  });

  it('names the SASL settings, never the password, when the brokers refuse SASL, and logs kafkajs\'s refusal once a minute at most', async () => {
    const password = 'Sv6Kp9QzXw3TmL8rJb2N';
    const config = testConfig({
      brokers: engines.brokers,
      clickhouse: engines.clickhouse,
      names: testNames('readiness_sasl'),
      // The run's broker takes no SASL, as a listener that is not the SASL one.
      extra: { KAFKA_SASL_MECHANISM: 'plain', KAFKA_SASL_USERNAME: 'svc', KAFKA_SASL_PASSWORD: password, KAFKA_SSL: 'false' },
    });
    const logs = capturedLogs<LogLine>();
    const worker = await startWorker(config, { logger: logs.logger });
    try {
      const startFailures = () => logs.lines.filter((line) => line.msg === 'starting kafka intake failed');
      await waitFor(() => startFailures().length >= 1, 'a start refused', 60_000, async () => JSON.stringify(await readiness(worker.url)));
      // Retried after 0.5, 1 and 2 s: three more starts refused, logged as the one failure (at most a line a minute).
      await new Promise((resolve) => setTimeout(resolve, 5_000));
      expect(startFailures()).toHaveLength(1);
      expect(startFailures()[0]).toMatchObject({ setting: 'KAFKA_BROKERS' });
      const hint =
        "The Kafka server does not support the requested API version: the brokers refuse this worker's SASL: check KAFKA_SASL_MECHANISM (plain), " +
        'KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD, and that the listener of KAFKA_BROKERS takes SASL without TLS (KAFKA_SSL=false)';
      expect(startFailures()[0]!.err!.message).toBe(hint);
      expect(await readiness(worker.url)).toEqual({ status: 503, reason: `kafka consumer cannot start (retrying): ${hint}` });
      // kafkajs says so at each start: once.
      expect(logs.lines.filter((line) => line.component === 'kafkajs').map((line) => line.msg)).toEqual(['The Kafka server does not support the requested API version']);
      expect(logs.text()).not.toContain(password.slice(0, 6));
    } finally {
      await worker.stop();
    }
  });
});
