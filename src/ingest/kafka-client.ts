/**
 * The kafkajs client: TLS and SASL as configured, its own logs to pino at warn and above. The
 * intake's consumer and its dead-letter producer are both made from this one client, so they
 * reach the brokers with the same settings.
 */
import { rootCertificates } from 'node:tls';
import { Kafka, logLevel, type KafkaConfig, type LogEntry, type SASLOptions } from 'kafkajs';
import type { Config } from '../config.ts';
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
    // kafkajs hands `ssl` to tls.connect, where `ca` replaces the default CAs: extra ones go beside them.
    ...(ssl && { ssl: ssl.ca ? { ca: [...rootCertificates, ssl.ca] } : true }),
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
