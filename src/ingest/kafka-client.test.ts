import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { rootCertificates } from 'node:tls';
import { afterAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../config.ts';
import { createLogger } from '../logger.ts';
import { kafkaClientConfig } from './kafka-client.ts';

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
