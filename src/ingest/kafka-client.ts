/**
 * The kafkajs client: TLS and SASL as configured, its own logs to pino at warn and above. The
 * intake's consumer, its producer (dead letters, and HTTP-ingested events) and its admin client (the
 * consumer lag's reads) are all made from this one client, so they reach the brokers with the same
 * settings.
 */
import { Kafka, logLevel, type KafkaConfig, type LogEntry, type Message, type Producer, type SASLOptions } from 'kafkajs';
import { withBundledCas, type Config } from '../config.ts';
import type { Logger } from '../logger.ts';

const LEVELS: Record<number, 'error' | 'warn' | 'info' | 'debug'> = {
  [logLevel.ERROR]: 'error',
  [logLevel.WARN]: 'warn',
  [logLevel.INFO]: 'info',
  [logLevel.DEBUG]: 'debug',
};

export type KafkaClientOptions = Pick<NonNullable<Config['kafka']>, 'clientId' | 'brokers' | 'ssl' | 'sasl'>;

/** The kafkajs settings for these options. */
export function kafkaClientConfig(options: KafkaClientOptions, logger: Logger): KafkaConfig {
  const kafkaLogger = logger.child({ component: 'kafkajs' });
  const { ssl, sasl } = options;
  return {
    clientId: options.clientId,
    brokers: [...options.brokers],
    // kafkajs hands `ssl` to tls.connect.
    ...(ssl && { ssl: ssl.ca ? { ca: withBundledCas(ssl.ca) } : true }),
    // (kafkajs types each mechanism apart; TypeScript cannot match a union of them to its intersections.)
    ...(sasl && { sasl: { mechanism: sasl.mechanism, username: sasl.username, password: sasl.password } as SASLOptions }),
    logLevel: logLevel.WARN,
    logCreator:
      () =>
      ({ level, log }: LogEntry) => {
        const { message, ...rest } = log;
        kafkaLogger[LEVELS[level] ?? 'info'](rest, message);
      },
  };
}

export function createKafka(options: KafkaClientOptions, logger: Logger): Kafka {
  return new Kafka(kafkaClientConfig(options, logger));
}

/**
 * At most this many bytes of message values go in one produce request. Kafka refuses a record batch
 * over the broker's `message.max.bytes` (1 MiB by default) with an error that is not retriable, and
 * messages with one key (a flush's dead letters from one source partition, an HTTP post's events of
 * one API key) all go to one partition: sent at once, a burst would be refused on every retry.
 */
export const MAX_SEND_BYTES = 256 * 1024;

/**
 * Produces messages to a topic in order, in requests of at most MAX_SEND_BYTES, each acknowledged by
 * all in-sync replicas. One request after the other: a retry after a failure sends them all again
 * (at-least-once), never out of order.
 */
export async function sendInRequests(producer: Pick<Producer, 'send'>, topic: string, messages: readonly (Message & { value: string })[]): Promise<void> {
  const sizes = messages.map((message) => Buffer.byteLength(message.value));
  let start = 0;
  while (start < messages.length) {
    let end = start + 1; // one at least, whatever its size
    let bytes = sizes[start]!;
    while (end < messages.length && bytes + sizes[end]! <= MAX_SEND_BYTES) bytes += sizes[end++]!;
    await producer.send({ topic, acks: -1, messages: messages.slice(start, end) });
    start = end;
  }
}
