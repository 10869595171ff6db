/**
 * A real Kafka-protocol broker for tests and benchmarks, from the best source at hand:
 *
 *  1. `env`:       KAFKA_BROKERS="host:port,..." names servers that are already running
 *                  (stop() is a no-op; topics are created if missing).
 *  2. `container`: a Docker engine answers -> apache/kafka:3.9.0 (KRaft, single node)
 *                  through testcontainers, imported lazily.
 *  3. `mock`:      otherwise librdkafka's mock cluster as a local process
 *                  (scripts/build-mock-broker.sh builds it once, ~70 s, then caches it).
 *
 * Set KAFKA_SERVICE=mock to skip the Docker probe and always use the mock.
 *
 * The first call may build the mock broker, so call startKafka() from a hook with a
 * long timeout, e.g. `beforeAll(async () => { kafka = await startKafka(...) }, 180_000)`.
 *
 * Mock broker facts (see /work/shared/services.md and test/services/mock-broker.c):
 *  - speaks the Kafka protocol on 127.0.0.1 with random ports; all state is in memory and
 *    lost on stop(); each startKafka() call gets its own, empty cluster;
 *  - unknown topics are auto-created with 4 partitions on first produce/subscribe;
 *  - no admin createTopics/deleteTopics/describeGroups/listGroups/resetOffsets/setOffsets;
 *  - every rebalance after the first join waits sessionTimeout - 1 s (the mock ignores
 *    rebalanceTimeout), so consumers must use MOCK_BROKER_CONSUMER_DEFAULTS below;
 *  - a fetch returns one producer batch per partition: consumer batch sizes follow the
 *    producer's send sizes.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { existsSync } from 'node:fs';
import { dockerAvailable } from './docker.ts';

export interface KafkaService {
  brokers: string[];
  kind: 'env' | 'container' | 'mock';
  stop(): Promise<void>;
}

export interface StartKafkaOptions {
  topics: string[];
  /** Partitions of each pre-created topic (default 4). */
  partitions?: number;
}

/**
 * Consumer settings every test must use (they are valid on all three kinds):
 *  - sessionTimeout 6000: the mock makes every rebalance after the first join wait
 *    sessionTimeout - 1000 ms, so keep it small; 6000 is also the smallest value a real
 *    broker accepts (group.min.session.timeout.ms defaults to 6000).
 *  - rebalanceTimeout 6000: the mock ignores it; on real Kafka it bounds the join phase.
 *  - heartbeatInterval 500: members learn about a rebalance on their next heartbeat,
 *    and the mock evicts a member that is silent for sessionTimeout.
 *  - maxWaitTimeInMs 100: the mock holds an empty fetch for this long; a short wait keeps
 *    rebalances, pauses and shutdowns (consumer.disconnect) quick.
 */
export const MOCK_BROKER_CONSUMER_DEFAULTS = Object.freeze({
  sessionTimeout: 6000,
  rebalanceTimeout: 6000,
  heartbeatInterval: 500,
  maxWaitTimeInMs: 100,
});

/** A fresh copy of MOCK_BROKER_CONSUMER_DEFAULTS, to spread into kafka.consumer({...}). */
export function mockBrokerConsumerDefaults(): {
  sessionTimeout: number;
  rebalanceTimeout: number;
  heartbeatInterval: number;
  maxWaitTimeInMs: number;
} {
  return { ...MOCK_BROKER_CONSUMER_DEFAULTS };
}

const REPO_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
const BUILD_SCRIPT = resolve(REPO_ROOT, 'scripts', 'build-mock-broker.sh');
const KAFKA_IMAGE = 'apache/kafka:3.9.0';
const BOOTSTRAP_TIMEOUT_MS = 10_000;

export async function startKafka(opts: StartKafkaOptions): Promise<KafkaService> {
  const partitions = opts.partitions ?? 4;
  if (!Number.isInteger(partitions) || partitions < 1) throw new Error(`invalid partitions: ${partitions}`);
  for (const t of opts.topics) {
    if (!/^[A-Za-z0-9._-]+$/.test(t)) throw new Error(`invalid topic name: ${JSON.stringify(t)}`);
  }

  const fromEnv = process.env.KAFKA_BROKERS?.trim();
  if (fromEnv) {
    const brokers = fromEnv.split(',').map((b) => b.trim()).filter(Boolean);
    await ensureTopics(brokers, opts.topics, partitions, 30_000, true);
    return { brokers, kind: 'env', stop: async () => {} };
  }
  if (process.env.KAFKA_SERVICE !== 'mock' && (await dockerAvailable())) {
    return startContainer(opts.topics, partitions);
  }
  return startMock(opts.topics, partitions);
}

// ---------------------------------------------------------------------------------------
// (b) apache/kafka in Docker. The client-facing advertised listener must carry the host
// port Docker maps to 9092, which is only known after the container starts. So (as the
// testcontainers Kafka modules do) the container first idles in a loop, then we copy in a
// starter script that exports KAFKA_ADVERTISED_LISTENERS and execs the image's own
// /etc/kafka/docker/run. A separate ready flag, copied after the script, keeps the loop
// from running a half-written script.

async function startContainer(topics: string[], partitions: number): Promise<KafkaService> {
  const { GenericContainer, Wait } = await import('testcontainers');
  const script = '/tmp/testcontainers_start.sh';
  const ready = '/tmp/testcontainers_start.ready';
  const container = await new GenericContainer(KAFKA_IMAGE)
    .withExposedPorts(9092)
    .withEnvironment({
      CLUSTER_ID: '4L6g3nShT-eMCtK--X86sw',
      KAFKA_NODE_ID: '1',
      KAFKA_PROCESS_ROLES: 'broker,controller',
      KAFKA_LISTENERS: 'PLAINTEXT://:9092,BROKER://:9093,CONTROLLER://:9094',
      KAFKA_LISTENER_SECURITY_PROTOCOL_MAP: 'PLAINTEXT:PLAINTEXT,BROKER:PLAINTEXT,CONTROLLER:PLAINTEXT',
      KAFKA_INTER_BROKER_LISTENER_NAME: 'BROKER',
      KAFKA_CONTROLLER_LISTENER_NAMES: 'CONTROLLER',
      KAFKA_CONTROLLER_QUORUM_VOTERS: '1@localhost:9094',
      KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR: '1',
      KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS: '1',
      KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR: '1',
      KAFKA_TRANSACTION_STATE_LOG_MIN_ISR: '1',
      KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS: '0',
      KAFKA_NUM_PARTITIONS: String(partitions), // for auto-created topics
    })
    .withCommand([
      'sh',
      '-c',
      `echo 'Waiting for starter script'; while [ ! -f ${ready} ]; do sleep 0.1; done; exec sh ${script}`,
    ])
    .withWaitStrategy(Wait.forLogMessage('Waiting for starter script'))
    .withStartupTimeout(120_000)
    .start();
  try {
    const brokers = [`${container.getHost()}:${container.getMappedPort(9092)}`];
    const advertised = `PLAINTEXT://${brokers[0]},BROKER://localhost:9093`;
    await container.copyContentToContainer([
      { content: `export KAFKA_ADVERTISED_LISTENERS='${advertised}'\nexec /etc/kafka/docker/run\n`, target: script, mode: 0o755 },
    ]);
    await container.copyContentToContainer([{ content: '', target: ready }]);
    await ensureTopics(brokers, topics, partitions, 90_000);
    return { brokers, kind: 'container', stop: async () => void (await container.stop()) };
  } catch (err) {
    await container.stop().catch(() => {});
    throw err;
  }
}

/**
 * Waits until the cluster answers, then creates the missing topics. With `bestEffort`
 * (KAFKA_BROKERS may also point at a mock broker, which has no CreateTopics), a failed
 * creation is only a warning: the topics are then auto-created on first use.
 */
async function ensureTopics(
  brokers: string[],
  topics: string[],
  partitions: number,
  timeoutMs: number,
  bestEffort = false,
): Promise<void> {
  const { Kafka, logLevel } = await import('kafkajs');
  const { stopIdleRequestQueueTimers } = await import('../../src/ingest/kafka-request-queue.ts');
  stopIdleRequestQueueTimers();
  const admin = new Kafka({ clientId: 'test-services', brokers, logLevel: logLevel.NOTHING, retry: { retries: 0 } }).admin();
  const deadline = Date.now() + timeoutMs;
  try {
    let existing: Set<string>;
    for (;;) {
      try {
        await admin.connect();
        existing = new Set(await admin.listTopics());
        break;
      } catch (err) {
        await admin.disconnect().catch(() => {});
        if (Date.now() > deadline) throw new Error(`Kafka at ${brokers.join(',')} not ready: ${String(err)}`);
        await new Promise((r) => setTimeout(r, 500));
      }
    }
    const missing = topics.filter((t) => !existing.has(t));
    if (missing.length === 0) return;
    try {
      await admin.createTopics({
        waitForLeaders: true,
        timeout: 30_000,
        topics: missing.map((topic) => ({ topic, numPartitions: partitions, replicationFactor: 1 })),
      });
    } catch (err) {
      if (!bestEffort) throw err;
      console.warn(`startKafka: could not create ${missing.join(',')} on ${brokers.join(',')}: ${String(err)}`);
    }
  } finally {
    await admin.disconnect().catch(() => {});
  }
}

// ---------------------------------------------------------------------------------------
// (c) librdkafka mock cluster as a child process.

/** Runs the (idempotent, cached) build script; resolves to the binary path. */
async function buildMockBroker(): Promise<string> {
  return new Promise<string>((resolveBuild, reject) => {
    // Build progress goes to our stderr; stdout's last line is the binary path.
    const child = spawn('bash', [BUILD_SCRIPT], { cwd: REPO_ROOT, stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => (out += d));
    child.on('error', reject);
    child.on('exit', (code) => {
      const path = out.trim().split('\n').pop() ?? '';
      if (code === 0 && path && existsSync(path)) resolveBuild(path);
      else reject(new Error(`${BUILD_SCRIPT} failed (exit ${code}); see .cache/mock-broker/build.log`));
    });
  });
}

async function startMock(topics: string[], partitions: number): Promise<KafkaService> {
  const bin = await buildMockBroker();
  const args = ['--partitions', String(partitions), '--exit-on-stdin-eof'];
  if (topics.length > 0) args.push('--topics', topics.join(','));
  // stdin stays an open pipe: if this process dies, the broker sees EOF and exits
  // (it also asks the kernel for SIGTERM on parent death).
  const child = spawn(bin, args, { stdio: ['pipe', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr.setEncoding('utf8').on('data', (d: string) => {
    stderr = (stderr + d).slice(-4000);
  });
  const exited = new Promise<void>((r) => child.once('exit', () => r()));

  let brokers: string[];
  try {
    brokers = await readBootstrap(child, () => stderr);
  } catch (err) {
    child.kill('SIGKILL');
    throw err;
  }
  child.stdout.resume(); // nothing more is expected on stdout; discard it
  // Do not keep the test process alive because of the broker.
  child.unref();
  for (const s of [child.stdin, child.stdout, child.stderr]) (s as unknown as { unref?: () => void }).unref?.();

  let stopping: Promise<void> | undefined;
  const stop = (): Promise<void> =>
    (stopping ??= (async () => {
      if (child.exitCode !== null || child.signalCode !== null) return;
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 5000);
      await exited;
      clearTimeout(timer);
    })());
  return { brokers, kind: 'mock', stop };
}

function readBootstrap(child: ChildProcess, stderr: () => string): Promise<string[]> {
  return new Promise<string[]>((resolveLine, reject) => {
    let buf = '';
    const fail = (msg: string): void => {
      cleanup();
      reject(new Error(`mock-broker ${msg}${stderr() ? `\nstderr:\n${stderr()}` : ''}`));
    };
    const onData = (d: string): void => {
      buf += d;
      const m = /^BOOTSTRAP (\S+)$/m.exec(buf);
      if (m?.[1]) {
        cleanup();
        resolveLine(m[1].split(','));
      }
    };
    const onExit = (code: number | null, sig: string | null): void => fail(`exited (code ${code}, signal ${sig}) before printing BOOTSTRAP`);
    const onError = (err: Error): void => fail(`failed to start: ${err.message}`);
    const timer = setTimeout(() => fail(`printed no BOOTSTRAP line within ${BOOTSTRAP_TIMEOUT_MS / 1000} s`), BOOTSTRAP_TIMEOUT_MS);
    const cleanup = (): void => {
      clearTimeout(timer);
      child.stdout?.off('data', onData);
      child.off('exit', onExit);
      child.off('error', onError);
    };
    child.stdout?.setEncoding('utf8').on('data', onData);
    child.once('exit', onExit);
    child.once('error', onError);
  });
}
