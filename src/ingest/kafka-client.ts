/** A kafkajs client whose own logs go to pino, at warn and above. */
import { Kafka, logLevel, type LogEntry } from 'kafkajs';
import type { Logger } from '../logger.ts';

const LEVELS: Record<number, 'error' | 'warn' | 'info' | 'debug'> = {
  [logLevel.ERROR]: 'error',
  [logLevel.WARN]: 'warn',
  [logLevel.INFO]: 'info',
  [logLevel.DEBUG]: 'debug',
};

export function createKafka(options: { clientId: string; brokers: readonly string[] }, logger: Logger): Kafka {
  const kafkaLogger = logger.child({ component: 'kafkajs' });
  return new Kafka({
    clientId: options.clientId,
    brokers: [...options.brokers],
    logLevel: logLevel.WARN,
    logCreator:
      () =>
      ({ level, log }: LogEntry) => {
        const { message, ...rest } = log;
        kafkaLogger[LEVELS[level] ?? 'info'](rest, message);
      },
  });
}
