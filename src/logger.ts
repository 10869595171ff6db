/**
 * Structured logging with pino. Contract: no secret reaches a log line. Known secret paths are
 * redacted by pino; free text that may carry an API key secret goes through redactSecrets first.
 */
import { pino, type Logger } from 'pino';

export type { Logger };

const REDACTED_PATHS = [
  'password',
  'token',
  'secret',
  'authorization',
  '*.password',
  '*.token',
  '*.secret',
  '*.authorization',
  '*.sasl.password',
  'req.headers.authorization',
  'config.clickhouse.password',
  'config.ingest.token',
  'config.admin.jwtSecret',
  'config.admin.previousJwtSecret',
  'config.webhooks.oncall.secret',
  'config.kafka.sasl.password',
];

export function createLogger(level: string, destination?: pino.DestinationStream): Logger {
  return pino(
    {
      level,
      base: { service: 'security-center-worker' },
      redact: { paths: REDACTED_PATHS, censor: '[REDACTED]' },
      timestamp: pino.stdTimeFunctions.isoTime,
    },
    destination,
  );
}
