/**
 * The kafkajs client: TLS and SASL as configured, its own logs to pino at warn and above, each
 * distinct line once and then at most once a minute with a count. The intake's consumer, its
 * producer (dead letters, and HTTP-ingested events) and its admin client (the consumer lag's reads)
 * are all made from this one client, so they reach the brokers with the same settings.
 */
import { Kafka, logLevel, type KafkaConfig, type LogEntry, type Message, type Producer, type SASLOptions } from 'kafkajs';
import { withBundledCas, type Config } from '../config.ts';
import { FailureLog } from '../failure-log.ts';
import { registerKafkaCodecs } from './kafka-compression.ts';
import { stopIdleRequestQueueTimers } from './kafka-request-queue.ts';
import type { Logger } from '../logger.ts';

const LEVELS: Record<number, 'error' | 'warn' | 'info' | 'debug'> = {
  [logLevel.ERROR]: 'error',
  [logLevel.WARN]: 'warn',
  [logLevel.INFO]: 'info',
  [logLevel.DEBUG]: 'debug',
};

export type KafkaClientOptions = Pick<NonNullable<Config['kafka']>, 'clientId' | 'brokers' | 'ssl' | 'sasl'>;

/** Distinct kafkajs lines counted at once; past this the oldest is forgotten, and logged at once, as new, when it comes again. */
const MAX_REPEATED_LINES = 1_000;

/**
 * The kafkajs settings for these options. kafkajs logs every failed attempt: two errors per
 * connection retry with the brokers unreachable, one per post with SASL refused. So each distinct
 * warning or error (its namespace, level, message, broker and error) is logged the first time, then at most once
 * a minute with the occurrences since (FailureLog): a new kind still shows at once. At
 * LOG_LEVEL=debug every line is logged. `now` is the clock of that bound (tests move it).
 */
export function kafkaClientConfig(options: KafkaClientOptions, logger: Logger, now: () => number = Date.now): KafkaConfig {
  const kafkaLogger = logger.child({ component: 'kafkajs' });
  const repeated = new Map<string, FailureLog>();
  const logRepeated = (level: 'error' | 'warn', namespace: string | undefined, message: string, fields: Record<string, unknown>) => {
    // kafkajs puts the broker and the broker's error in fields ("Response Produce(...)" with `error`):
    // a new error, or another broker failing, is a new kind of line.
    const key = `${level}\0${namespace}\0${message}\0${String(fields.broker ?? '')}\0${String(fields.error ?? '')}`;
    let lines = repeated.get(key);
    if (!lines) {
      if (repeated.size >= MAX_REPEATED_LINES) repeated.delete(repeated.keys().next().value!);
      // No recovery line: kafkajs says nothing when a failure ends (the worker's own lines do).
      lines = new FailureLog(kafkaLogger, message, '', { level, now });
      repeated.set(key, lines);
    }
    lines.failed(fields);
  };
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
      ({ namespace, level, log }: LogEntry) => {
        const { message, ...rest } = log;
        const pinoLevel = LEVELS[level] ?? 'info';
        if ((pinoLevel === 'error' || pinoLevel === 'warn') && !kafkaLogger.isLevelEnabled('debug')) logRepeated(pinoLevel, namespace, message, rest);
        else kafkaLogger[pinoLevel](rest, message);
      },
  };
}

/**
 * The worker's client, which reads record batches in every compression Kafka defines
 * (kafka-compression.ts), and whose connections wake up only when they have something to do
 * (kafka-request-queue.ts).
 */
export function createKafka(options: KafkaClientOptions, logger: Logger): Kafka {
  registerKafkaCodecs();
  stopIdleRequestQueueTimers();
  return new Kafka(kafkaClientConfig(options, logger));
}

/** kafkajs's errors for SASL refused: by a listener without SASL (no SaslHandshake API, or ILLEGAL_SASL_STATE), for the mechanism, or for the credentials. */
const SASL_APIS = new Set(['SaslHandshake', 'SaslAuthenticate']);
const SASL_ERROR_TYPES = new Set(['UNSUPPORTED_SASL_MECHANISM', 'ILLEGAL_SASL_STATE', 'SASL_AUTHENTICATION_FAILED']);

function isSaslRefusal(error: unknown): boolean {
  // kafkajs wraps the broker's error after its retries (KafkaJSNumberOfRetriesExceeded): its `cause`.
  for (let cause = error, depth = 0; cause instanceof Error && depth < 5; cause = cause.cause, depth++) {
    const { name, apiName, type } = cause as Error & { apiName?: unknown; type?: unknown };
    if (name === 'KafkaJSSASLAuthenticationError' || SASL_APIS.has(String(apiName)) || SASL_ERROR_TYPES.has(String(type))) return true;
  }
  return false;
}

/** The brokers refused this worker's SASL; the message names the settings to check (never the password). */
export class KafkaSaslRefusedError extends Error {
  override name = 'KafkaSaslRefusedError';
}

/**
 * The error, unless it says the brokers refused SASL: then one that also names the settings to
 * check. kafkajs's own message for a listener that does not take SASL is only "The Kafka server
 * does not support the requested API version".
 */
export function explainSaslRefusal(error: unknown, { sasl, ssl }: Pick<KafkaClientOptions, 'sasl' | 'ssl'>): unknown {
  if (!sasl || error instanceof KafkaSaslRefusedError || !isSaslRefusal(error)) return error;
  return new KafkaSaslRefusedError(
    `${(error as Error).message}: the brokers refuse this worker's SASL: check KAFKA_SASL_MECHANISM (${sasl.mechanism}), ` +
      `KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD, and that the listener of KAFKA_BROKERS takes SASL ${ssl ? 'over TLS (KAFKA_SSL=true)' : 'without TLS (KAFKA_SSL=false)'}`,
  );
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
