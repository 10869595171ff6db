/**
 * Configuration: one zod schema over the environment, parsed once at start-up.
 * Contract: an invalid setting stops start-up with one message that lists every problem;
 * the parsed result is frozen and passed to the parts that need it (nothing reads process.env later).
 * A setting left blank (`PORT=`, as a compose file or a shell may leave it) is an unset one.
 */
import { X509Certificate } from 'node:crypto';
import { accessSync, closeSync, constants, fstatSync, openSync, readFileSync, readSync, statSync } from 'node:fs';
import { isIP } from 'node:net';
import { hostname } from 'node:os';
import { dirname, resolve } from 'node:path';
import { rootCertificates } from 'node:tls';
// The `maxmind` reader's own decoder, pinned in package.json to the version `maxmind` pins, so the
// start-up check reads a database's metadata as the analysis thread's reader will.
import { parseMetadata } from 'mmdb-lib/lib/metadata.js';
import { z } from 'zod';
import { RULES } from '../rules/index.ts';
import { DetectionConfig } from './detect/detection-config.ts';
import { parseSecretKey } from './webhooks/secret-box.ts';
import { checkTargetUrl } from './webhooks/target-policy.ts';

const TRUE_WORDS = ['true', '1', 'yes', 'on'] as const;
const FALSE_WORDS = ['false', '0', 'no', 'off'] as const;

/** Env booleans: "true"/"1"/"yes"/"on" and "false"/"0"/"no"/"off" (case-insensitive). Anything else is an error. */
const envBoolean = (defaultValue: boolean) =>
  z
    .string()
    .trim()
    .toLowerCase()
    .pipe(z.enum([...TRUE_WORDS, ...FALSE_WORDS], { error: 'expected true or false' }))
    .optional()
    .transform((value) => (value === undefined ? defaultValue : isTrueWord(value)));

/** A setting that is one of a few words, in any case as booleans are ("Shadow", "WARN"); anything else is an error naming them. */
const envWord = <const W extends readonly [string, ...string[]]>(words: W) =>
  z
    .string()
    .trim()
    .toLowerCase()
    .pipe(z.enum(words, { error: `expected one of ${words.join(', ')}` }));

/** Whether a raw setting says true (before the schema: for checks across settings). */
function isTrueWord(value: string | undefined): boolean {
  return (TRUE_WORDS as readonly string[]).includes((value ?? '').trim().toLowerCase());
}

const envInt = (defaultValue: number, min: number, max: number) =>
  z.coerce.number().int().min(min).max(max).default(defaultValue);

/** A key for sealing secrets (parseSecretKey); its value is never quoted in an error. */
const secretKeySetting = () =>
  z
    .string()
    .optional()
    .superRefine((value, ctx) => {
      if (value === undefined) return;
      try {
        parseSecretKey(value);
      } catch (error) {
        ctx.addIssue({ code: 'custom', message: (error as Error).message });
      }
    });

const commaList = z
  .string()
  .transform((value) => value.split(',').map((item) => item.trim()).filter((item) => item.length > 0));

const PEM_CERTIFICATE = /-----BEGIN CERTIFICATE-----[^-]+-----END CERTIFICATE-----/g;

/** Why a setting's file cannot be read: its path and the error's code (ENOENT, EACCES), never its contents. */
function cannotRead(path: string, error: unknown): string {
  return `cannot read ${path} (${(error as NodeJS.ErrnoException).code ?? (error as Error).message})`;
}

/**
 * A setting naming a text file, read now: `check` reports what is wrong with its text and gives the
 * setting's value. A file that cannot be read is reported by its path and the error's code.
 */
function textFileSetting<T>(check: (path: string, text: string, ctx: z.RefinementCtx) => T) {
  return z
    .string()
    .trim()
    .min(1)
    .transform((path, ctx) => {
      let text: string;
      try {
        text = readFileSync(path, 'utf8');
      } catch (error) {
        ctx.addIssue({ code: 'custom', message: cannotRead(path, error) });
        return z.NEVER;
      }
      return check(path, text, ctx);
    });
}

/** A file of PEM certificates, read now: its path and its text. Paths are quoted in errors, contents never. */
const pemCertificatesFile = textFileSetting((path, pem, ctx) => {
  const certificates = pem.match(PEM_CERTIFICATE) ?? [];
  if (certificates.length === 0) ctx.addIssue({ code: 'custom', message: `${path} holds no PEM certificate (-----BEGIN CERTIFICATE-----)` });
  certificates.forEach((certificate, index) => {
    try {
      new X509Certificate(certificate);
    } catch {
      ctx.addIssue({ code: 'custom', message: `certificate ${index + 1} in ${path} is not a valid X.509 certificate` });
    }
  });
  return { path, pem };
});

/** The bytes that open a MaxMind DB's metadata section (0xABCDEF, then "MaxMind.com"). */
const MMDB_METADATA_MARKER = Buffer.from('abcdef4d61784d696e642e636f6d', 'hex');
/** The metadata section, marker included, lies in a MaxMind DB's last 128 KiB (MaxMind DB format, version 2). */
const MMDB_METADATA_MAX_BYTES = 128 * 1024 + MMDB_METADATA_MARKER.length;

/**
 * What each setting's database must not be: for GEOIP_CITY_DB, one without coordinates (an ASN,
 * ISP, country, anonymous-IP, connection-type or domain database: no address would be placed, and
 * impossible travel would be blind); for GEOIP_ASN_DB, one without autonomous systems (a city,
 * country or such database: no point would carry an operator). Judged by the metadata's
 * database_type, only when it plainly names such a kind ("GeoLite2-Country", "asn ipv4",
 * "GeoIP2-Anonymous-IP") and not also one that has what is needed (City, Enterprise and DB-IP's
 * Location databases have coordinates; ASN, ISP, Enterprise and IPinfo's, operators). A type that
 * names neither passes.
 */
const WRONG_KIND = {
  city: (type: string) => /asn|isp|country|anonymous|connection|domain/i.test(type) && !/city|enterprise|location/i.test(type),
  asn: (type: string) => /city|country|anonymous|connection|domain/i.test(type) && !/asn|isp|enterprise|ipinfo/i.test(type),
};

/**
 * A MaxMind DB file (GEOIP_CITY_DB, GEOIP_ASN_DB), checked now, cheaply: readable, its last 128 KiB
 * hold the metadata every MaxMind DB has, and that metadata reads as the `maxmind` reader will read
 * it and names a database of the right kind. Otherwise the analysis thread's reader would fail only
 * once detection starts, after the migrations, and the worker would exit 1 (and be restarted, for
 * ever). Only the file's end is read: a city database is 60 MB or more. Its path is quoted in errors.
 */
const maxMindDbFile = (kind: keyof typeof WRONG_KIND) =>
  z
    .string()
    .trim()
    .min(1)
    .superRefine((path, ctx) => {
      let tail: Buffer;
      let fd: number | undefined;
      try {
        fd = openSync(path, 'r');
        const { size } = fstatSync(fd);
        tail = Buffer.alloc(Math.min(size, MMDB_METADATA_MAX_BYTES));
        for (let read = 0, got = -1; read < tail.length && got !== 0; read += got) {
          got = readSync(fd, tail, read, tail.length - read, size - tail.length + read);
        }
      } catch (error) {
        ctx.addIssue({ code: 'custom', message: cannotRead(path, error) });
        return;
      } finally {
        if (fd !== undefined) closeSync(fd);
      }
      if (tail.lastIndexOf(MMDB_METADATA_MARKER) < 0) {
        ctx.addIssue({ code: 'custom', message: `${path} is not a MaxMind DB (.mmdb; a .gz or .tar.gz download must be unpacked first)` });
        return;
      }
      let databaseType: unknown;
      try {
        databaseType = parseMetadata(tail).databaseType;
      } catch (error) {
        ctx.addIssue({ code: 'custom', message: `${path} is a damaged MaxMind DB: its metadata does not read (${error instanceof Error ? error.message : String(error)})` });
        return;
      }
      if (typeof databaseType === 'string' && WRONG_KIND[kind](databaseType)) {
        ctx.addIssue({ code: 'custom', message: `${path} is a "${databaseType}" database, not ${kind === 'city' ? 'a city' : 'an ASN'} database` });
      }
    });

/**
 * DETECTION_CONFIG_FILE, read and checked now as the worker will read it: started without its
 * allowlists, allowlisted keys and addresses would alert, and be throttled or blocked. Once running,
 * a bad edit is refused and the previous file's content stays (followDetectionConfig).
 */
const detectionConfigFile = textFileSetting((path, text, ctx) => {
  try {
    DetectionConfig.parse(text, RULES);
  } catch (error) {
    ctx.addIssue({ code: 'custom', message: `${path}: ${(error as Error).message}` });
  }
  return path;
});

/** An RFC 1123 host name: dot-separated labels of letters, digits and inner hyphens, at most 253 characters. */
const HOST_NAME = /^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$/;

/** A Kafka topic name, as the broker accepts it: 1 to 249 of letters, digits, '.', '_' and '-', but not '.' or '..'. */
const kafkaTopic = z
  .string()
  .trim()
  .regex(/^[A-Za-z0-9._-]{1,249}$/, 'must be a Kafka topic name: 1 to 249 letters, digits, ., _ or -')
  .refine((topic) => topic !== '.' && topic !== '..', 'must be a Kafka topic name, not . or ..');

/** KAFKA_BROKERS' entries: host:port, the host a name, an IPv4 address or a bracketed IPv6 one. */
const KAFKA_BROKER = /^(?:[^\s:/]+|\[[0-9A-Fa-f:.]+\]):(\d{1,5})$/;

/**
 * CLICKHOUSE_URL: the server's origin only. @clickhouse/client reads a path as the database (beside
 * CLICKHOUSE_DATABASE), `ch_*` query parameters as settings over the pinned ones, other parameters as
 * client options, and credentials over CLICKHOUSE_USER and CLICKHOUSE_PASSWORD. No part of the URL is
 * quoted in an error: it may hold a password.
 */
const clickHouseUrl = z.url({ protocol: /^https?$/, error: 'must be an http:// or https:// URL' }).pipe(z.string().superRefine((value, ctx) => {
  const url = new URL(value);
  const problem = (message: string) => ctx.addIssue({ code: 'custom', message });
  if (url.username || url.password) problem('must not carry credentials: set CLICKHOUSE_USER and CLICKHOUSE_PASSWORD instead');
  if (url.pathname !== '/' && url.pathname !== '') problem('must not have a path (the client would take it for the database): set CLICKHOUSE_DATABASE instead');
  if (url.search || url.hash || /[?#]/.test(value)) {
    problem('must not have a query string or fragment (the client would read them as settings and options over the worker\'s own): use CLICKHOUSE_DATABASE, CLICKHOUSE_USER and CLICKHOUSE_PASSWORD');
  }
}));

/**
 * The CAs TLS is to trust with a CA file's PEM (KAFKA_SSL_CA_FILE, WEBHOOK_CA_FILE): Node's bundled
 * ones and the file's. A `ca` given to TLS replaces the bundled CAs: the extra ones go beside them.
 */
export function withBundledCas(pem: string): string[] {
  return [...rootCertificates, pem];
}

export const KAFKA_SASL_MECHANISMS = ['plain', 'scram-sha-256', 'scram-sha-512'] as const;
export type KafkaSaslMechanism = (typeof KAFKA_SASL_MECHANISMS)[number];

const identifier = z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'must be a plain identifier (letters, digits, _)');

const PLANS = ['free', 'pro', 'business', 'enterprise'] as const;

const envSchema = z
  .object({
    LOG_LEVEL: envWord(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info'),
    HOST: z
      .string()
      .trim()
      .refine((host) => isIP(host) !== 0 || HOST_NAME.test(host), 'must be an IP address or a host name')
      .default('0.0.0.0'),
    PORT: envInt(8080, 0, 65535),
    WORKER_ID: z.string().trim().min(1).max(200).optional(),

    FEATURE_ANOMALY_DETECTION: envBoolean(false),
    FEATURE_AI_RISK_SCORING: envBoolean(false),
    ADMIN_ENABLED: envBoolean(false),

    // host:port each; a list without one is a mistake, not a way to turn Kafka off (leave it unset).
    KAFKA_BROKERS: commaList
      .pipe(
        z
          .array(
            z
              .string()
              .regex(KAFKA_BROKER, 'each broker must be host:port')
              // (An entry that is not host:port at all is reported by the regex alone.)
              .refine((broker) => {
                const port = KAFKA_BROKER.exec(broker)?.[1];
                return port === undefined || (Number(port) >= 1 && Number(port) <= 65535);
              }, 'each broker\'s port must be 1 to 65535'),
          )
          .min(1, 'lists no broker (leave it unset for no Kafka)'),
      )
      .optional(),
    KAFKA_CLIENT_ID: z.string().min(1).default('security-center-worker'),
    KAFKA_GROUP_ID: z.string().min(1).default('security-center-worker'),
    KAFKA_TOPIC: kafkaTopic.default('api.request-metadata'),
    KAFKA_DLQ_TOPIC: kafkaTopic.default('api.request-metadata.dlq'),
    KAFKA_FROM_BEGINNING: envBoolean(true),
    // At least a stock broker's group.min.session.timeout.ms: it refuses a shorter one, but only when the consumer joins.
    KAFKA_SESSION_TIMEOUT_MS: envInt(30_000, 6_000, 600_000),
    KAFKA_HEARTBEAT_INTERVAL_MS: envInt(3_000, 100, 60_000),
    KAFKA_MAX_WAIT_MS: envInt(500, 10, 10_000),
    KAFKA_SSL: envBoolean(false),
    KAFKA_SSL_CA_FILE: pemCertificatesFile.optional(),
    KAFKA_SASL_MECHANISM: envWord(KAFKA_SASL_MECHANISMS).optional(),
    KAFKA_SASL_USERNAME: z.string().max(1024).optional(),
    KAFKA_SASL_PASSWORD: z.string().max(4096).optional(),

    CLICKHOUSE_URL: clickHouseUrl.optional(),
    CLICKHOUSE_USER: z.string().default('default'),
    CLICKHOUSE_PASSWORD: z.string().default(''),
    CLICKHOUSE_DATABASE: identifier.default('security_center'),
    DATA_DIR: z.string().min(1).default('./data'),
    EVENTS_TTL_DAYS: envInt(30, 1, 3650),

    STORE_FLUSH_ROWS: envInt(50_000, 1, 1_000_000),
    STORE_FLUSH_INTERVAL_MS: envInt(1_000, 10, 60_000),
    STORE_MAX_BUFFERED_ROWS: envInt(200_000, 1, 10_000_000),
    // Fewer would forget an eventId before a re-published copy arrives (0 would drop none), and count it twice.
    DEDUP_CACHE_SIZE: envInt(1_000_000, 1_000, 10_000_000),

    // Trimmed: HTTP trims header values, so a token ending in a newline (a secret file written by echo)
    // would never match. Not so the HMAC keys below (ADMIN_JWT_SECRET, ONCALL_WEBHOOK_SECRET): they
    // are shared byte for byte with other systems.
    INGEST_TOKEN: z.string().trim().min(16, 'must be at least 16 characters').optional(),
    INGEST_MAX_BODY_BYTES: envInt(5 * 1024 * 1024, 1024, 100 * 1024 * 1024),
    INGEST_MAX_EVENTS: envInt(10_000, 1, 1_000_000),

    DETECTION_CONFIG_FILE: detectionConfigFile.optional(),
    GEOIP_CITY_DB: maxMindDbFile('city').optional(),
    GEOIP_ASN_DB: maxMindDbFile('asn').optional(),
    // At least a minute: with 0 a dismissed alert's pattern would open a new alert at once.
    ALERT_SUPPRESSION_MINUTES: envInt(60, 1, 60 * 24 * 30),
    DETECTION_MAX_HEAP_MB: z.coerce.number().int().min(64).max(1_048_576).optional(),
    DETECTION_MAX_WINDOW_EVENTS: z.coerce.number().int().min(1_000).max(1_000_000_000).optional(),

    ADMIN_JWT_SECRET: z.string().min(32, 'must be at least 32 characters').optional(),
    ADMIN_JWT_SECRET_PREVIOUS: z.string().min(32, 'must be at least 32 characters').optional(),
    ADMIN_RATE_LIMIT_PER_MINUTE: envInt(600, 1, 1_000_000),
    ADMIN_MAX_BODY_BYTES: envInt(16 * 1024, 256, 1024 * 1024),
    ADMIN_CACHE_TTL_MS: envInt(5_000, 0, 300_000),
    ENTITLED_PLANS: commaList.pipe(z.array(z.enum(PLANS)).min(1)).default(['business', 'enterprise']),
    ENFORCEMENT_MODE: envWord(['off', 'shadow', 'enforce']).default('off'),
    ENFORCEMENT_BLOCK_MIN_RISK: z.coerce.number().min(0).max(1).default(0.95),
    ENFORCEMENT_TTL_MINUTES: envInt(60, 1, 7 * 24 * 60),

    ONCALL_WEBHOOK_URL: z.url().optional(),
    ONCALL_WEBHOOK_SECRET: z.string().min(32, 'must be at least 32 characters').optional(),
    WEBHOOK_ALLOW_PRIVATE_TARGETS: envBoolean(false),
    WEBHOOK_CA_FILE: pemCertificatesFile.optional(),
    WEBHOOK_CONCURRENCY: envInt(16, 1, 256),
    WEBHOOK_SECRET_KEY: secretKeySetting(),
    WEBHOOK_SECRET_KEY_PREVIOUS: secretKeySetting(),
  });

/** Rules across variables, checked on the raw environment so they are reported with every other problem. */
function crossFieldProblems(source: NodeJS.ProcessEnv): string[] {
  const problems: string[] = [];
  const adminEnabled = isTrueWord(source.ADMIN_ENABLED);
  if (adminEnabled && !source.ADMIN_JWT_SECRET) problems.push('ADMIN_JWT_SECRET: is required when ADMIN_ENABLED=true');
  if (!source.ONCALL_WEBHOOK_URL !== !source.ONCALL_WEBHOOK_SECRET) {
    problems.push('ONCALL_WEBHOOK_URL, ONCALL_WEBHOOK_SECRET: set both or neither');
  }
  // The worker consumes one and produces dead letters to the other: one topic would feed its dead letters back to itself.
  // (Each setting as the schema reads it, its default included; one it refuses is reported there.)
  const setting = <K extends keyof typeof envSchema.shape>(name: K) => envSchema.shape[name].safeParse(source[name]).data;
  const topic = setting('KAFKA_TOPIC');
  if (topic !== undefined && topic === setting('KAFKA_DLQ_TOPIC')) problems.push('KAFKA_TOPIC, KAFKA_DLQ_TOPIC: must differ (dead letters would be consumed again, for ever)');
  // kafkajs refuses a heartbeat interval not below the session timeout, but only once the consumer joins.
  const heartbeat = setting('KAFKA_HEARTBEAT_INTERVAL_MS');
  const sessionTimeout = setting('KAFKA_SESSION_TIMEOUT_MS');
  if (heartbeat !== undefined && sessionTimeout !== undefined && heartbeat >= sessionTimeout) {
    problems.push('KAFKA_HEARTBEAT_INTERVAL_MS: must be lower than KAFKA_SESSION_TIMEOUT_MS (a third of it or less is usual)');
  }
  const kafkaSsl = isTrueWord(source.KAFKA_SSL);
  if (source.KAFKA_SSL_CA_FILE && !kafkaSsl) problems.push('KAFKA_SSL_CA_FILE: is used only with KAFKA_SSL=true; set it too');
  const saslMechanism = source.KAFKA_SASL_MECHANISM;
  const saslCredentials = ['KAFKA_SASL_USERNAME', 'KAFKA_SASL_PASSWORD'] as const;
  if (saslMechanism) {
    const missing = saslCredentials.filter((name) => !source[name]);
    if (missing.length > 0) problems.push(`${missing.join(', ')}: required when KAFKA_SASL_MECHANISM is set`);
  } else if (saslCredentials.some((name) => source[name])) {
    problems.push(`KAFKA_SASL_MECHANISM: required when KAFKA_SASL_USERNAME or KAFKA_SASL_PASSWORD is set (${KAFKA_SASL_MECHANISMS.join(', ')})`);
  }
  // The embedded engine writes under DATA_DIR (clickhouse/, inserts/): one it cannot use would fail only once storage opens.
  if (!source.CLICKHOUSE_URL) {
    const problem = unusableDirectory(envSchema.shape.DATA_DIR.parse(source.DATA_DIR));
    if (problem) problems.push(`DATA_DIR: ${problem}`);
  }
  if (source.ONCALL_WEBHOOK_URL) {
    const allowPrivate = isTrueWord(source.WEBHOOK_ALLOW_PRIVATE_TARGETS);
    try {
      checkTargetUrl(source.ONCALL_WEBHOOK_URL, { allowPrivate });
    } catch (error) {
      problems.push(`ONCALL_WEBHOOK_URL: ${(error as Error).message}`);
    }
  }
  return problems;
}

/**
 * Why a directory the worker is to write in cannot be used: it, or (when it does not exist yet) the
 * nearest folder above it that does, must be a directory the worker may write to. Its path is quoted, nothing more.
 */
function unusableDirectory(dir: string): string | undefined {
  for (let path = resolve(dir); ; path = dirname(path)) {
    try {
      if (!statSync(path).isDirectory()) return `cannot use ${dir} (ENOTDIR)`;
      accessSync(path, constants.W_OK | constants.X_OK);
      return undefined;
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code;
      if (code === 'ENOENT' && path !== dirname(path)) continue;
      return `cannot use ${dir} (${code ?? (error as Error).message})`;
    }
  }
}

export type Env = z.output<typeof envSchema>;

export interface Config {
  readonly logLevel: Env['LOG_LEVEL'];
  readonly http: { readonly host: string; readonly port: number };
  readonly features: { readonly anomalyDetection: boolean; readonly aiRiskScoring: boolean; readonly admin: boolean };
  readonly kafka?: {
    readonly brokers: readonly string[];
    readonly clientId: string;
    readonly groupId: string;
    readonly topic: string;
    readonly dlqTopic: string;
    readonly fromBeginning: boolean;
    readonly sessionTimeoutMs: number;
    readonly heartbeatIntervalMs: number;
    readonly maxWaitMs: number;
    /** TLS to the brokers (KAFKA_SSL); `ca` is KAFKA_SSL_CA_FILE's PEM, trusted besides Node's own CAs. */
    readonly ssl?: { readonly caFile?: string; readonly ca?: string };
    /** SASL authentication; the password is a secret, never logged (describeConfig, logger.ts). */
    readonly sasl?: { readonly mechanism: KafkaSaslMechanism; readonly username: string; readonly password: string };
  };
  readonly clickhouse: {
    /** Server URL; undefined means the embedded engine under dataDir. */
    readonly url?: string;
    readonly username: string;
    readonly password: string;
    readonly database: string;
    readonly dataDir: string;
    readonly eventsTtlDays: number;
  };
  readonly store: { readonly flushRows: number; readonly flushIntervalMs: number; readonly maxBufferedRows: number };
  readonly ingest: { readonly token?: string; readonly maxBodyBytes: number; readonly maxEvents: number; readonly dedupCacheSize: number };
  readonly admin: {
    readonly jwtSecret?: string;
    /** While rotating ADMIN_JWT_SECRET: the old secret, whose tokens are still accepted until they expire. */
    readonly previousJwtSecret?: string;
    readonly entitledPlans: readonly string[];
    readonly rateLimitPerMinute: number;
    readonly maxBodyBytes: number;
    readonly cacheTtlMs: number;
  };
  readonly detection: { readonly configFile?: string; readonly geoCityDb?: string; readonly geoAsnDb?: string; readonly suppressionMs: number; readonly maxHeapMb?: number; readonly maxWindowEvents?: number };
  readonly enforcement: { readonly mode: Env['ENFORCEMENT_MODE']; readonly blockMinRisk: number; readonly ttlMs: number };
  readonly webhooks: {
    /** The operator's on-call endpoint; undefined when not configured. */
    readonly oncall?: { readonly url: string; readonly secret: string };
    /** Tests only: lets deliveries reach loopback and private networks. */
    readonly allowPrivateTargets: boolean;
    /** WEBHOOK_CA_FILE, a PEM file of extra trusted CAs (tests' own CA), and its PEM, read and checked at start. */
    readonly caFile?: string;
    readonly ca?: string;
    readonly concurrency: number;
    /** Seals merchants' signing secrets at rest (32 bytes, hex or base64); unset stores them as they are. */
    readonly secretKey?: string;
    /** The key before a rotation: opens secrets sealed with it, never seals. */
    readonly previousSecretKey?: string;
    /**
     * This replica's stable id (WORKER_ID, else the hostname): it attempts the messages it created,
     * and another replica's only once they are overdue, so one alert is not sent once per replica.
     */
    readonly owner: string;
  };
}

export class ConfigError extends Error {
  constructor(readonly problems: string[]) {
    super(`invalid configuration:\n${problems.map((problem) => `  - ${problem}`).join('\n')}`);
    this.name = 'ConfigError';
  }
}

/** The listen failures a setting causes: the variable to change, and why. */
const LISTEN_PROBLEMS: Record<string, [variable: string, why: string]> = {
  EADDRINUSE: ['PORT', 'another process listens on it'],
  EACCES: ['PORT', 'not permitted: a port below 1024 needs privileges'],
  EADDRNOTAVAIL: ['HOST', 'not an address of this machine'],
  ENOTFOUND: ['HOST', 'the host name does not resolve'],
};

/**
 * The HTTP server's listen failure as the configuration problem it is (exit 2, as an invalid
 * setting), naming HOST or PORT; undefined for any other failure.
 */
export function listenConfigError(error: unknown, http: Config['http']): ConfigError | undefined {
  const code = (error as NodeJS.ErrnoException | undefined)?.code;
  const problem = code === undefined ? undefined : LISTEN_PROBLEMS[code];
  if (!problem) return undefined;
  const [variable, why] = problem;
  return new ConfigError([`${variable}: cannot listen on HOST ${http.host}, PORT ${http.port} (${code}: ${why})`]);
}

/** The environment without its blank settings: each of those is unset, and takes its default. */
function withoutBlanks(environment: NodeJS.ProcessEnv): NodeJS.ProcessEnv {
  return Object.fromEntries(Object.entries(environment).filter(([, value]) => value?.trim()));
}

/** Parses the environment; throws ConfigError listing every problem at once. */
export function loadConfig(environment: NodeJS.ProcessEnv = process.env): Config {
  const source = withoutBlanks(environment);
  const parsed = envSchema.safeParse(source);
  // Name the variable and the problem, never the value: it may be a secret.
  const problems = [
    ...(parsed.success ? [] : parsed.error.issues.map((issue) => `${issue.path.join('.') || '(environment)'}: ${issue.message}`)),
    ...crossFieldProblems(source),
  ];
  if (!parsed.success || problems.length > 0) throw new ConfigError(problems);
  const env = parsed.data;
  return deepFreeze({
    logLevel: env.LOG_LEVEL,
    http: { host: env.HOST, port: env.PORT },
    features: {
      anomalyDetection: env.FEATURE_ANOMALY_DETECTION,
      aiRiskScoring: env.FEATURE_AI_RISK_SCORING,
      admin: env.ADMIN_ENABLED,
    },
    kafka:
      env.KAFKA_BROKERS && env.KAFKA_BROKERS.length > 0
        ? {
            brokers: env.KAFKA_BROKERS,
            clientId: env.KAFKA_CLIENT_ID,
            groupId: env.KAFKA_GROUP_ID,
            topic: env.KAFKA_TOPIC,
            dlqTopic: env.KAFKA_DLQ_TOPIC,
            fromBeginning: env.KAFKA_FROM_BEGINNING,
            sessionTimeoutMs: env.KAFKA_SESSION_TIMEOUT_MS,
            heartbeatIntervalMs: env.KAFKA_HEARTBEAT_INTERVAL_MS,
            maxWaitMs: env.KAFKA_MAX_WAIT_MS,
            ssl: env.KAFKA_SSL ? { caFile: env.KAFKA_SSL_CA_FILE?.path, ca: env.KAFKA_SSL_CA_FILE?.pem } : undefined,
            sasl:
              env.KAFKA_SASL_MECHANISM && env.KAFKA_SASL_USERNAME && env.KAFKA_SASL_PASSWORD
                ? { mechanism: env.KAFKA_SASL_MECHANISM, username: env.KAFKA_SASL_USERNAME, password: env.KAFKA_SASL_PASSWORD }
                : undefined,
          }
        : undefined,
    clickhouse: {
      url: env.CLICKHOUSE_URL,
      username: env.CLICKHOUSE_USER,
      password: env.CLICKHOUSE_PASSWORD,
      database: env.CLICKHOUSE_DATABASE,
      dataDir: env.DATA_DIR,
      eventsTtlDays: env.EVENTS_TTL_DAYS,
    },
    store: {
      flushRows: env.STORE_FLUSH_ROWS,
      flushIntervalMs: env.STORE_FLUSH_INTERVAL_MS,
      maxBufferedRows: Math.max(env.STORE_MAX_BUFFERED_ROWS, env.STORE_FLUSH_ROWS),
    },
    ingest: {
      token: env.INGEST_TOKEN,
      maxBodyBytes: env.INGEST_MAX_BODY_BYTES,
      maxEvents: env.INGEST_MAX_EVENTS,
      dedupCacheSize: env.DEDUP_CACHE_SIZE,
    },
    admin: {
      jwtSecret: env.ADMIN_JWT_SECRET,
      previousJwtSecret: env.ADMIN_JWT_SECRET_PREVIOUS,
      entitledPlans: env.ENTITLED_PLANS,
      rateLimitPerMinute: env.ADMIN_RATE_LIMIT_PER_MINUTE,
      maxBodyBytes: env.ADMIN_MAX_BODY_BYTES,
      cacheTtlMs: env.ADMIN_CACHE_TTL_MS,
    },
    detection: {
      configFile: env.DETECTION_CONFIG_FILE,
      geoCityDb: env.GEOIP_CITY_DB,
      geoAsnDb: env.GEOIP_ASN_DB,
      suppressionMs: env.ALERT_SUPPRESSION_MINUTES * 60_000,
      maxHeapMb: env.DETECTION_MAX_HEAP_MB,
      maxWindowEvents: env.DETECTION_MAX_WINDOW_EVENTS,
    },
    enforcement: { mode: env.ENFORCEMENT_MODE, blockMinRisk: env.ENFORCEMENT_BLOCK_MIN_RISK, ttlMs: env.ENFORCEMENT_TTL_MINUTES * 60_000 },
    webhooks: {
      oncall: env.ONCALL_WEBHOOK_URL && env.ONCALL_WEBHOOK_SECRET ? { url: env.ONCALL_WEBHOOK_URL, secret: env.ONCALL_WEBHOOK_SECRET } : undefined,
      allowPrivateTargets: env.WEBHOOK_ALLOW_PRIVATE_TARGETS,
      caFile: env.WEBHOOK_CA_FILE?.path,
      ca: env.WEBHOOK_CA_FILE?.pem,
      concurrency: env.WEBHOOK_CONCURRENCY,
      secretKey: env.WEBHOOK_SECRET_KEY,
      previousSecretKey: env.WEBHOOK_SECRET_KEY_PREVIOUS,
      owner: env.WORKER_ID ?? hostname(),
    },
  });
}

/** What the logs may say about the configuration: no secrets, no credentials in URLs. */
export function describeConfig(config: Config): Record<string, unknown> {
  let clickhouse = `embedded engine in ${config.clickhouse.dataDir}`;
  if (config.clickhouse.url) {
    const url = new URL(config.clickhouse.url);
    clickhouse = `${url.protocol}//${url.host}${url.pathname}`;
  }
  const { kafka } = config;
  return {
    features: config.features,
    kafka: kafka
      ? {
          brokers: kafka.brokers,
          topic: kafka.topic,
          groupId: kafka.groupId,
          ssl: kafka.ssl ? { extraCaFile: kafka.ssl.caFile ?? 'none' } : 'off',
          // The mechanism and the user name; never the password.
          sasl: kafka.sasl ? { mechanism: kafka.sasl.mechanism, username: kafka.sasl.username } : 'off',
        }
      : 'off',
    // How POST /v1/ingest/events takes events: produced to the Kafka topic (stored and detected by the
    // replica that owns the key), stored directly and detected by this replica, or not at all.
    httpIngest: !config.features.anomalyDetection || !config.ingest.token ? 'off' : kafka ? 'kafka' : 'direct',
    clickhouse,
    enforcement: config.enforcement.mode,
    // The on-call URL may carry a token in its path: its origin only.
    webhooks: {
      oncall: config.webhooks.oncall ? new URL(config.webhooks.oncall.url).origin : 'off',
      allowPrivateTargets: config.webhooks.allowPrivateTargets,
      secretsSealed: config.webhooks.secretKey !== undefined,
    },
  };
}

function deepFreeze<T>(value: T): T {
  if (value && typeof value === 'object') {
    for (const child of Object.values(value)) deepFreeze(child);
    Object.freeze(value);
  }
  return value;
}
