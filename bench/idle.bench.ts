/**
 * tsx bench/idle.bench.ts (npm run bench:idle) — what a worker costs while no traffic comes: a worker
 * with Kafka intake (the test broker, the embedded engine), measured over BENCH_IDLE_SECONDS (10)
 * after it has been ready for 5 s. Prints the process's CPU per second (the embedded engine's own
 * background work included) and the timers it starts per second (kafkajs's connections, the
 * worker's periodic reads and writes).
 */
import { createHook } from 'node:async_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { loadConfig } from '../src/config.ts';
import { createLogger } from '../src/logger.ts';
import { startWorker } from '../src/main.ts';
import { startClickHouse } from '../test/services/clickhouse.ts';
import { startKafka } from '../test/services/kafka.ts';
import { testEnv, testNames } from '../test/support/worker.ts';

const SECONDS = Number(process.env.BENCH_IDLE_SECONDS ?? 10);
const SETTLE_MS = 5_000;

async function main(): Promise<void> {
  const names = testNames('idle');
  const kafkaService = await startKafka({ topics: [names.topic] });
  const clickhouse = await startClickHouse();
  const worker = await startWorker(loadConfig(testEnv({ brokers: kafkaService.brokers, clickhouse, names, extra: { LOG_LEVEL: 'warn' } })), { logger: createLogger('warn') });
  try {
    await worker.ready;
    await sleep(SETTLE_MS);
    let timers = 0;
    const hook = createHook({
      init(_id, type) {
        if (type === 'Timeout') timers++;
      },
    }).enable();
    const cpu = process.cpuUsage();
    const started = performance.now();
    await sleep(SECONDS * 1000);
    const used = process.cpuUsage(cpu);
    const seconds = (performance.now() - started) / 1000;
    hook.disable();
    console.log(`node ${process.version}; ${kafkaService.kind} broker, ${clickhouse.kind} ClickHouse; idle for ${seconds.toFixed(1)} s`);
    console.log(`idle worker: ${((used.user + used.system) / 1000 / seconds).toFixed(1)} ms of CPU per second (the whole process), ${(timers / seconds).toFixed(1)} timers started per second`);
  } finally {
    await worker.stop();
    await kafkaService.stop();
    await clickhouse.stop();
  }
}

main().then(
  () => process.exit(0),
  (error: unknown) => {
    console.error(error);
    process.exit(1);
  },
);
