/**
 * npm run bench:idle — what a worker costs while no traffic comes: a worker with Kafka intake (the
 * test broker, the embedded engine), the worker's default Kafka timings and `npm start`'s V8 flag,
 * measured over BENCH_IDLE_SECONDS (10) after it has been ready for 5 s. Prints the process's CPU per
 * second, by thread (the embedded engine's own background work included), and the timers the main
 * thread starts per second (kafkajs's connections, the worker's periodic reads and writes).
 */
import { createHook } from 'node:async_hooks';
import { access } from 'node:fs/promises';
import { setTimeout as sleep } from 'node:timers/promises';
import { loadConfig } from '../src/config.ts';
import { createLogger } from '../src/logger.ts';
import { startWorker } from '../src/main.ts';
import { startClickHouse } from '../test/services/clickhouse.ts';
import { startKafka } from '../test/services/kafka.ts';
import { testEnv, testNames } from '../test/support/worker.ts';
import { cpuByThread, threadTimes } from './thread-cpu.ts';

const SECONDS = Number(process.env.BENCH_IDLE_SECONDS ?? 10);
const SETTLE_MS = 5_000;

async function main(): Promise<void> {
  const names = testNames('idle');
  const kafkaService = await startKafka({ topics: [names.topic] });
  const clickhouse = await startClickHouse();
  const env = testEnv({ brokers: kafkaService.brokers, clickhouse, names, extra: { LOG_LEVEL: 'warn' } });
  // The worker's own defaults, not the tests' quick timings (a fetch held 100 ms, a heartbeat every 500 ms).
  for (const name of ['KAFKA_SESSION_TIMEOUT_MS', 'KAFKA_HEARTBEAT_INTERVAL_MS', 'KAFKA_MAX_WAIT_MS', 'STORE_FLUSH_INTERVAL_MS']) delete env[name];
  // libuv's pool started before the snapshot: on Node 20, whose threads are all named `node`, a pool
  // thread started with the worker would be counted as its analysis thread.
  await access('.');
  const threadsBefore = threadTimes(); // the analysis thread is one started after this
  const worker = await startWorker(loadConfig(env), { logger: createLogger('warn') });
  try {
    await worker.ready;
    await sleep(SETTLE_MS);
    let timers = 0;
    const hook = createHook({
      init(_id, type) {
        if (type === 'Timeout') timers++;
      },
    }).enable();
    const threadsAtStart = threadTimes();
    const cpu = process.cpuUsage();
    const started = performance.now();
    await sleep(SECONDS * 1000);
    const used = process.cpuUsage(cpu);
    const byThread = cpuByThread(threadsBefore, threadsAtStart, threadTimes());
    const seconds = (performance.now() - started) / 1000;
    hook.disable();
    console.log(`node ${process.version}; ${kafkaService.kind} broker, ${clickhouse.kind} ClickHouse; idle for ${seconds.toFixed(1)} s`);
    console.log(`idle worker: ${((used.user + used.system) / 1000 / seconds).toFixed(1)} ms of CPU per second (the whole process), ${(timers / seconds).toFixed(1)} timers started per second on the main thread`);
    if (byThread) console.log(`cpu by thread over the ${seconds.toFixed(1)} s: ${byThread}`);
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
