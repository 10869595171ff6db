/** Kafka helpers for suites: produce in large sends, read a topic back, read a group's progress, a relay to a broker. */
import { createServer, connect, type Socket } from 'node:net';
import { Kafka, logLevel, type Producer } from 'kafkajs';
import { stopIdleRequestQueueTimers } from '../../src/ingest/kafka-request-queue.ts';
import { mockBrokerConsumerDefaults } from '../services/kafka.ts';

/** The suites' own client, with the fix the worker's has (kafka-request-queue.ts): no 1 ms timer per idle connection. */
export function testKafka(brokers: string[]): Kafka {
  stopIdleRequestQueueTimers();
  return new Kafka({ clientId: 'test-suite', brokers, logLevel: logLevel.NOTHING });
}

/** Sends values keyed by API key, in sends of `chunk` messages (the mock's fetch size follows it). */
export async function produceAll(
  producer: Producer,
  topic: string,
  messages: { key: string; value: string }[],
  chunk = 5000,
): Promise<void> {
  for (let start = 0; start < messages.length; start += chunk) {
    await producer.send({ topic, acks: -1, messages: messages.slice(start, start + chunk) });
  }
}

/** Reads a topic from the beginning until `count` messages arrived, or `until` holds (or the timeout). */
export async function readTopic(
  kafka: Kafka,
  topic: string,
  count: number,
  until: (values: string[]) => boolean = (values) => values.length >= count,
  timeoutMs = 60_000,
): Promise<string[]> {
  const consumer = kafka.consumer({ groupId: `reader.${topic}.${Date.now()}`, ...mockBrokerConsumerDefaults() });
  const values: string[] = [];
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  const done = new Promise<void>((resolve, reject) => {
    // Says how many messages the topic holds, to tell a short topic from a stalled reader.
    const timer = setTimeout(() => {
      void topicSize(kafka, topic)
        .catch(() => 'unknown')
        .then((size) => reject(new Error(`read ${values.length} of ${count} messages from ${topic} (it holds ${size})`)));
    }, timeoutMs);
    void consumer.run({
      eachBatch: async ({ batch }) => {
        for (const message of batch.messages) values.push(message.value?.toString('utf8') ?? '');
        if (until(values)) {
          clearTimeout(timer);
          resolve();
        }
      },
    });
  });
  try {
    await done;
  } finally {
    await consumer.disconnect();
  }
  return values;
}

/** Messages a topic holds, over all partitions. */
export async function topicSize(kafka: Kafka, topic: string): Promise<number> {
  const admin = kafka.admin();
  await admin.connect();
  try {
    const offsets = await admin.fetchTopicOffsets(topic);
    return offsets.reduce((sum, p) => sum + Number(p.high) - Number(p.low), 0);
  } finally {
    await admin.disconnect();
  }
}

/** True when the group has committed every partition of the topic up to its end. */
export async function groupCaughtUp(kafka: Kafka, groupId: string, topic: string): Promise<boolean> {
  const admin = kafka.admin();
  await admin.connect();
  try {
    const ends = await admin.fetchTopicOffsets(topic);
    const [committed] = await admin.fetchOffsets({ groupId, topics: [topic] });
    const byPartition = new Map(committed?.partitions.map((p) => [p.partition, Number(p.offset)]) ?? []);
    // An empty partition has nothing to commit.
    return ends.every((end) => Number(end.high) === Number(end.low) || (byPartition.get(end.partition) ?? -1) >= Number(end.high));
  } finally {
    await admin.disconnect();
  }
}

/** Committed offsets of a group, summed over partitions (-1 for none counts as 0). */
export async function committedTotal(kafka: Kafka, groupId: string, topic: string): Promise<number> {
  const admin = kafka.admin();
  await admin.connect();
  try {
    const [committed] = await admin.fetchOffsets({ groupId, topics: [topic] });
    return (committed?.partitions ?? []).reduce((sum, p) => sum + Math.max(0, Number(p.offset)), 0);
  } finally {
    await admin.disconnect();
  }
}

/**
 * Rewinds (or moves on) an idle group's committed offsets, as a member of the group would commit
 * them. kafkajs's admin.setOffsets needs DescribeGroups, which the mock broker lacks.
 */
export async function commitGroupOffsets(
  kafka: Kafka,
  groupId: string,
  topic: string,
  partitions: { partition: number; offset: string }[],
): Promise<void> {
  const consumer = kafka.consumer({ groupId, ...mockBrokerConsumerDefaults() });
  await consumer.connect();
  try {
    const joined = new Promise<void>((resolve) => consumer.on(consumer.events.GROUP_JOIN, () => resolve()));
    await consumer.subscribe({ topic });
    await consumer.run({ autoCommit: false, eachBatchAutoResolve: false, eachBatch: async () => undefined });
    await joined;
    await consumer.commitOffsets(partitions.map(({ partition, offset }) => ({ topic, partition, offset })));
  } finally {
    await consumer.disconnect();
  }
}

/**
 * A TCP relay from 127.0.0.1:port to a broker, to bootstrap through (a port that was closed at first,
 * say). Only bootstrap goes through it: the broker's metadata sends clients to its own address.
 */
export async function relayToBroker(port: number, broker: string): Promise<{ close(): Promise<void> }> {
  const separator = broker.lastIndexOf(':');
  const host = broker.slice(0, separator);
  const brokerPort = Number(broker.slice(separator + 1));
  const sockets = new Set<Socket>();
  const server = createServer((client) => {
    const upstream = connect(brokerPort, host);
    for (const socket of [client, upstream]) {
      sockets.add(socket);
      socket.once('close', () => sockets.delete(socket));
      socket.on('error', () => undefined); // the other side's close ends both
    }
    client.pipe(upstream).pipe(client);
    client.once('close', () => upstream.destroy());
    upstream.once('close', () => client.destroy());
  });
  await new Promise<void>((resolve, reject) => server.once('error', reject).listen(port, '127.0.0.1', resolve));
  return {
    async close() {
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
