import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { rootCertificates } from 'node:tls';
import {
  KafkaJSConnectionError,
  KafkaJSNumberOfRetriesExceeded,
  KafkaJSProtocolError,
  KafkaJSSASLAuthenticationError,
  KafkaJSServerDoesNotSupportApiKey,
  logLevel,
  type LogEntry,
} from 'kafkajs';
import { afterAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../config.ts';
import { createLogger } from '../logger.ts';
import { explainSaslRefusal, kafkaClientConfig } from './kafka-client.ts';

const logger = createLogger('silent');
const dir = mkdtempSync(join(tmpdir(), 'kafka-client-test-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** The kafkajs settings built from these environment variables (with a broker). */
function clientConfigFor(env: Record<string, string>) {
  const kafka = loadConfig({ KAFKA_BROKERS: 'b-1.example.com:9096,b-2.example.com:9096', ...env }).kafka!;
  return kafkaClientConfig(kafka, logger);
}

describe('kafkaClientConfig', () => {
  it('is plaintext without authentication by default', () => {
    const config = clientConfigFor({});
    expect(config).toMatchObject({ clientId: 'security-center-worker', brokers: ['b-1.example.com:9096', 'b-2.example.com:9096'] });
    expect(config).not.toHaveProperty('ssl');
    expect(config).not.toHaveProperty('sasl');
  });

  it('turns TLS on, trusting the CAs Node ships', () => {
    expect(clientConfigFor({ KAFKA_SSL: 'true' }).ssl).toBe(true);
  });

  it('trusts the extra CAs of KAFKA_SSL_CA_FILE besides Node\'s own, not instead of them', () => {
    const caFile = join(dir, 'ca.pem');
    const pem = `${rootCertificates[5]}\n`;
    writeFileSync(caFile, pem);
    const ssl = clientConfigFor({ KAFKA_SSL: 'true', KAFKA_SSL_CA_FILE: caFile }).ssl;
    expect(ssl).toEqual({ ca: [...rootCertificates, pem] });
  });

  it.each(['plain', 'scram-sha-256', 'scram-sha-512'])('authenticates with SASL %s', (mechanism) => {
    const config = clientConfigFor({ KAFKA_SSL: 'true', KAFKA_SASL_MECHANISM: mechanism, KAFKA_SASL_USERNAME: 'worker', KAFKA_SASL_PASSWORD: 'pass-word' });
    expect(config.sasl).toEqual({ mechanism, username: 'worker', password: 'pass-word' });
    expect(config.ssl).toBe(true);
  });
});

describe('kafkajs\'s log lines', () => {
  /** kafkajs's log function under the client's logCreator, over a logger at `level` that keeps its lines, with a clock the test moves. */
  function kafkajsLog(level = 'info') {
    const lines: { level: number; msg: string; component: string; occurrences?: number; broker?: string }[] = [];
    const logger = createLogger(level, { write: (line: string) => void lines.push(JSON.parse(line)) });
    let clock = 0;
    const config = kafkaClientConfig(loadConfig({ KAFKA_BROKERS: '127.0.0.1:9' }).kafka!, logger, () => clock);
    const log = config.logCreator!(logLevel.WARN);
    /** One line as kafkajs makes it (loggers/index.js). */
    const entry = (namespace: string, level: logLevel, message: string, extra: object = {}): LogEntry => ({
      namespace,
      level,
      label: logLevel[level],
      log: { timestamp: new Date(clock).toISOString(), logger: 'kafkajs', message, ...extra },
    });
    const summary = () => lines.map(({ level, msg, component, occurrences }) => ({ level, component, msg, occurrences }));
    return { log, entry, summary, lines, advance: (ms: number) => (clock += ms) };
  }

  it('logs each distinct warning or error the first time, then at most once a minute with a count; a new one at once', () => {
    const { log, entry, summary, lines, advance } = kafkajsLog();
    const refused = 'Connection error: connect ECONNREFUSED 127.0.0.1:9';
    // The brokers unreachable: two errors per connection retry, every 500 ms for 70 s.
    for (let i = 0; i < 140; i++, advance(500)) {
      log(entry('Connection', logLevel.ERROR, refused, { broker: '127.0.0.1:9' }));
      log(entry('BrokerPool', logLevel.ERROR, `Failed to connect to seed broker, trying another broker from the list: ${refused}`));
    }
    log(entry('BrokerPool', logLevel.ERROR, 'The Kafka server does not support the requested API version'));
    log(entry('Consumer', logLevel.WARN, 'Restarting the consumer in 300ms'));
    expect(summary()).toEqual([
      { level: 50, component: 'kafkajs', msg: refused, occurrences: 1 },
      { level: 50, component: 'kafkajs', msg: `Failed to connect to seed broker, trying another broker from the list: ${refused}`, occurrences: 1 },
      { level: 50, component: 'kafkajs', msg: `${refused} (still; logged at most once a minute)`, occurrences: 120 },
      { level: 50, component: 'kafkajs', msg: `Failed to connect to seed broker, trying another broker from the list: ${refused} (still; logged at most once a minute)`, occurrences: 120 },
      { level: 50, component: 'kafkajs', msg: 'The Kafka server does not support the requested API version', occurrences: 1 },
      { level: 40, component: 'kafkajs', msg: 'Restarting the consumer in 300ms', occurrences: 1 },
    ]);
    expect(lines[0]).toMatchObject({ broker: '127.0.0.1:9' }); // kafkajs's fields are kept
  });

  it('takes another broker, or another broker error under the same message, for a new kind of line', () => {
    const { log, entry, summary } = kafkajsLog();
    // kafkajs's "Response <api>" line carries the broker's error in `error` (network/connection.js).
    const response = (broker: string, error: string) => entry('Connection', logLevel.ERROR, 'Response Produce(key: 0, version: 7)', { broker, error });
    log(response('b1:9092', 'This server is not the leader for that topic-partition'));
    log(response('b1:9092', 'This server is not the leader for that topic-partition'));
    log(response('b1:9092', 'Not authorized to access topics: [Topic authorization failed]'));
    log(response('b2:9092', 'This server is not the leader for that topic-partition'));
    expect(summary().map(({ occurrences }) => occurrences)).toEqual([1, 1, 1]);
  });

  it('logs every line at LOG_LEVEL=debug', () => {
    const { log, entry, summary } = kafkajsLog('debug');
    for (let i = 0; i < 3; i++) log(entry('Connection', logLevel.ERROR, 'Connection error: connect ECONNREFUSED 127.0.0.1:9'));
    expect(summary()).toEqual(Array.from({ length: 3 }, () => ({ level: 50, component: 'kafkajs', msg: 'Connection error: connect ECONNREFUSED 127.0.0.1:9', occurrences: undefined })));
  });
});

describe('explainSaslRefusal', () => {
  const sasl = { KAFKA_SASL_MECHANISM: 'scram-sha-512', KAFKA_SASL_USERNAME: 'worker', KAFKA_SASL_PASSWORD: 'pass-word-secret' };
  const kafkaOf = (env: Record<string, string>) => loadConfig({ KAFKA_BROKERS: 'b-1.example.com:9096', ...env }).kafka!;
  const noSaslHandshake = () => new KafkaJSServerDoesNotSupportApiKey('The Kafka server does not support the requested API version', { apiKey: 17, apiName: 'SaslHandshake' });

  it.each([
    ['a listener without SASL (no SaslHandshake API: the mock broker, some proxies)', noSaslHandshake()],
    ['a listener without SASL (Kafka answers ILLEGAL_SASL_STATE)', new KafkaJSProtocolError({ type: 'ILLEGAL_SASL_STATE', code: 34, message: 'Request is not valid given the current SASL state', retriable: false } as unknown as Error)],
    [
      'credentials refused, after kafkajs\'s retries',
      new KafkaJSNumberOfRetriesExceeded(new (KafkaJSSASLAuthenticationError as unknown as new (message: string) => Error)('SASL SCRAM SHA512 authentication failed: SASL Authentication failed'), { retryCount: 5, retryTime: 800 }),
    ],
  ])('names the SASL settings, not the password, for %s', (_case, error) => {
    const explained = explainSaslRefusal(error, kafkaOf({ ...sasl, KAFKA_SSL: 'true' })) as Error;
    expect(explained.message).toBe(
      `${error.message}: the brokers refuse this worker's SASL: check KAFKA_SASL_MECHANISM (scram-sha-512), KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD, and that the listener of KAFKA_BROKERS takes SASL over TLS (KAFKA_SSL=true)`,
    );
    expect(explained.message).not.toContain('pass-word');
    // Explained once, however often it passes through.
    expect(explainSaslRefusal(explained, kafkaOf(sasl))).toBe(explained);
  });

  it('leaves other errors, and any error without SASL set, as they are', () => {
    const unreachable = new KafkaJSConnectionError('Connection error: connect ECONNREFUSED 127.0.0.1:9');
    const otherApi = new KafkaJSServerDoesNotSupportApiKey('The Kafka server does not support the requested API version', { apiKey: 15, apiName: 'DescribeGroups' });
    expect(explainSaslRefusal(unreachable, kafkaOf(sasl))).toBe(unreachable);
    expect(explainSaslRefusal(otherApi, kafkaOf(sasl))).toBe(otherApi);
    const handshake = noSaslHandshake();
    expect(explainSaslRefusal(handshake, kafkaOf({}))).toBe(handshake);
  });
});
