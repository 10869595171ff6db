import { hostname } from 'node:os';
import { describe, expect, it } from 'vitest';
import { ConfigError, loadConfig } from './config.ts';

describe('loadConfig', () => {
  it('has safe defaults: every flag off, embedded storage, no Kafka', () => {
    const config = loadConfig({});
    expect(config.features).toEqual({ anomalyDetection: false, aiRiskScoring: false, admin: false });
    expect(config.kafka).toBeUndefined();
    expect(config.clickhouse.url).toBeUndefined();
    expect(config.clickhouse.dataDir).toBe('./data');
    expect(config.http.port).toBe(8080);
    expect(config.enforcement.mode).toBe('off');
    expect(Object.isFrozen(config.clickhouse)).toBe(true);
  });

  it.each([
    ['true', true],
    ['TRUE', true],
    ['1', true],
    ['false', false],
    ['0', false],
    ['off', false],
  ])('parses FEATURE_ANOMALY_DETECTION=%s as %s', (value, expected) => {
    expect(loadConfig({ FEATURE_ANOMALY_DETECTION: value }).features.anomalyDetection).toBe(expected);
  });

  it('reads Kafka settings when brokers are given', () => {
    const config = loadConfig({ KAFKA_BROKERS: 'a:9092, b:9092', KAFKA_TOPIC: 't' });
    expect(config.kafka?.brokers).toEqual(['a:9092', 'b:9092']);
    expect(config.kafka?.topic).toBe('t');
    expect(config.kafka?.dlqTopic).toBe('api.request-metadata.dlq');
  });

  it('reads the analysis thread\'s heap limit and the detection windows\' budget, unset by default', () => {
    expect(loadConfig({}).detection).toMatchObject({ maxHeapMb: undefined, maxWindowEvents: undefined });
    expect(loadConfig({ DETECTION_MAX_HEAP_MB: '512', DETECTION_MAX_WINDOW_EVENTS: '250000' }).detection).toMatchObject({ maxHeapMb: 512, maxWindowEvents: 250_000 });
    expect(() => loadConfig({ DETECTION_MAX_HEAP_MB: '16' })).toThrow(/DETECTION_MAX_HEAP_MB/);
    expect(() => loadConfig({ DETECTION_MAX_WINDOW_EVENTS: 'lots' })).toThrow(/DETECTION_MAX_WINDOW_EVENTS/);
  });

  it('lists every problem in one error, naming variables but not secret values', () => {
    let error: unknown;
    try {
      loadConfig({
        PORT: 'eighty',
        FEATURE_ANOMALY_DETECTION: 'maybe',
        ADMIN_ENABLED: 'true',
        INGEST_TOKEN: 'short-secret',
        CLICKHOUSE_URL: 'not a url',
        ENFORCEMENT_MODE: 'always',
      });
    } catch (caught) {
      error = caught;
    }
    expect(error).toBeInstanceOf(ConfigError);
    const problems = (error as ConfigError).problems.join('\n');
    for (const name of ['PORT', 'FEATURE_ANOMALY_DETECTION', 'ADMIN_JWT_SECRET', 'INGEST_TOKEN', 'CLICKHOUSE_URL', 'ENFORCEMENT_MODE']) {
      expect(problems).toContain(name);
    }
    expect((error as ConfigError).message).not.toContain('short-secret');
  });
});

describe('loadConfig: webhooks', () => {
  const SECRET = 'oncall-secret-0123456789abcdefghijklmnop';

  it('is off by default: no on-call endpoint, private targets refused', () => {
    expect(loadConfig({}).webhooks).toEqual({ oncall: undefined, allowPrivateTargets: false, caFile: undefined, concurrency: 16, owner: hostname() });
  });

  it('names the replica that owns the webhooks it creates by WORKER_ID, else the hostname', () => {
    expect(loadConfig({ WORKER_ID: ' worker-2 ' }).webhooks.owner).toBe('worker-2');
    expect(() => loadConfig({ WORKER_ID: '  ' })).toThrow('WORKER_ID');
  });

  it('reads the on-call endpoint', () => {
    const config = loadConfig({ ONCALL_WEBHOOK_URL: 'https://oncall.example.com/hook', ONCALL_WEBHOOK_SECRET: SECRET });
    expect(config.webhooks.oncall).toEqual({ url: 'https://oncall.example.com/hook', secret: SECRET });
  });

  it.each([
    [{ ONCALL_WEBHOOK_URL: 'https://oncall.example.com/hook' }, 'set both or neither'],
    [{ ONCALL_WEBHOOK_SECRET: SECRET }, 'set both or neither'],
    [{ ONCALL_WEBHOOK_URL: 'http://oncall.example.com/hook', ONCALL_WEBHOOK_SECRET: SECRET }, 'must use https'],
    [{ ONCALL_WEBHOOK_URL: 'https://127.0.0.1/hook', ONCALL_WEBHOOK_SECRET: SECRET }, 'loopback'],
    [{ ONCALL_WEBHOOK_URL: 'https://localhost/hook', ONCALL_WEBHOOK_SECRET: SECRET }, 'must name a public host'],
    [{ ONCALL_WEBHOOK_URL: 'https://oncall.example.com/hook', ONCALL_WEBHOOK_SECRET: 'short' }, 'at least 32'],
    [{ WEBHOOK_ALLOW_PRIVATE_TARGETS: 'sometimes' }, 'expected true or false'],
    [{ WEBHOOK_SECRET_KEY: 'short' }, 'WEBHOOK_SECRET_KEY: must be 32 bytes'],
    [{ WEBHOOK_SECRET_KEY: 'a1'.repeat(32), WEBHOOK_SECRET_KEY_PREVIOUS: 'short' }, 'WEBHOOK_SECRET_KEY_PREVIOUS: must be 32 bytes'],
  ])('refuses %j', (env, problem) => {
    expect(() => loadConfig(env)).toThrow(problem);
    try {
      loadConfig(env);
    } catch (error) {
      expect((error as ConfigError).message).not.toContain(SECRET);
      expect((error as ConfigError).message).not.toContain('short');
    }
  });

  it('reads the key that seals merchants\' signing secrets, as hex or base64', () => {
    const hex = 'a1'.repeat(32);
    expect(loadConfig({ WEBHOOK_SECRET_KEY: hex }).webhooks.secretKey).toBe(hex);
    const base64 = Buffer.alloc(32, 7).toString('base64');
    expect(loadConfig({ WEBHOOK_SECRET_KEY: base64 }).webhooks.secretKey).toBe(base64);
    expect(loadConfig({ WEBHOOK_SECRET_KEY: hex, WEBHOOK_SECRET_KEY_PREVIOUS: base64 }).webhooks.previousSecretKey).toBe(base64);
  });

  it('accepts a loopback on-call endpoint only with WEBHOOK_ALLOW_PRIVATE_TARGETS=true', () => {
    const env = { ONCALL_WEBHOOK_URL: 'https://127.0.0.1:8443/hook', ONCALL_WEBHOOK_SECRET: SECRET };
    expect(() => loadConfig({ ...env, WEBHOOK_ALLOW_PRIVATE_TARGETS: 'false' })).toThrow(ConfigError);
    expect(loadConfig({ ...env, WEBHOOK_ALLOW_PRIVATE_TARGETS: 'true' }).webhooks).toMatchObject({ allowPrivateTargets: true, oncall: { url: env.ONCALL_WEBHOOK_URL } });
  });
});
