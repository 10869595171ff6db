/**
 * Allowlists and rule parameter overrides, from the JSON file named by DETECTION_CONFIG_FILE,
 * reloaded without a restart. Contract: an allowlisted key, IP, network or user agent never feeds a
 * window, so it never produces an alert (what a reload newly allowlists leaves the windows before
 * the next batch is judged); an invalid file is refused whole and the previous one stays.
 *
 * {
 *   "allowlist": { "keys": ["pk_live_probe"], "ips": ["203.0.113.7", "198.51.100.0/24"], "userAgents": ["^uptime-bot/"] },
 *   "merchants": { "m_1": { "allowlist": { ... }, "rules": { "velocity_attack": { "thresholdRatio": 3 } } } },
 *   "plans": { "enterprise": { "rules": { "velocity_attack": { "thresholdRatio": 2 } } } },
 *   "testKeys": { "maxSeverity": "low" }
 * }
 * testKeys (top level, per plan or per merchant) caps the severity of findings on test keys.
 */
import { readFileSync, unwatchFile, watchFile } from 'node:fs';
import { BlockList, isIP } from 'node:net';
import { z } from 'zod';
import { PLANS } from '../events/request-event.ts';
import { SEVERITIES, type Severity } from './types.ts';

/**
 * The highest severity a finding on a test key is reported at unless the config says otherwise. A test
 * key reaches only mock verifications with fake data, unlimited and not usage-tracked (the spec's
 * section 1), so its abuse puts nothing real at risk, while automation, load tests, CI runners in many
 * regions and a team sharing one key are what test keys are for: low is reported (a leaked test key
 * shows), never enforced, and never pages anyone.
 */
export const DEFAULT_TEST_KEY_MAX_SEVERITY: Severity = 'low';

const ipOrCidr = z.string().refine((value) => {
  const [address, bits, ...rest] = value.split('/');
  if (rest.length > 0 || !address || isIP(address) === 0) return false;
  if (bits === undefined) return true;
  const max = isIP(address) === 4 ? 32 : 128;
  return /^\d+$/.test(bits) && Number(bits) <= max;
}, 'must be an IP address or CIDR');

const pattern = z.string().refine((value) => {
  try {
    new RegExp(value, 'i');
    return true;
  } catch {
    return false;
  }
}, 'must be a valid regular expression');

const allowlistSchema = z.strictObject({
  keys: z.array(z.string().min(1)).default([]),
  ips: z.array(ipOrCidr).default([]),
  userAgents: z.array(pattern).default([]),
});
const ruleOverrides = z.record(z.string(), z.record(z.string(), z.union([z.number(), z.string(), z.boolean()])));
const testKeysSchema = z.strictObject({ maxSeverity: z.enum(SEVERITIES) });

export const detectionConfigSchema = z.strictObject({
  allowlist: allowlistSchema.optional(),
  testKeys: testKeysSchema.optional(),
  merchants: z
    .record(z.string(), z.strictObject({ allowlist: allowlistSchema.optional(), rules: ruleOverrides.optional(), testKeys: testKeysSchema.optional() }))
    .default({}),
  plans: z.record(z.string(), z.strictObject({ rules: ruleOverrides.optional(), testKeys: testKeysSchema.optional() })).default({}),
});
export type DetectionConfigInput = z.input<typeof detectionConfigSchema>;

class CompiledAllowlist {
  readonly keys: Set<string>;
  /** The IPs and CIDRs as written. */
  readonly ips: readonly string[];
  readonly networks = new BlockList();
  /** BlockList.check builds a SocketAddress per call: skip it when no network is listed. */
  private readonly hasNetworks: boolean;
  readonly userAgents: RegExp[];

  constructor(input: z.output<typeof allowlistSchema> | undefined) {
    this.keys = new Set(input?.keys ?? []);
    this.ips = input?.ips ?? [];
    for (const entry of input?.ips ?? []) {
      const [address, bits] = entry.split('/') as [string, string | undefined];
      const family = isIP(address) === 4 ? 'ipv4' : 'ipv6';
      if (bits === undefined) this.networks.addAddress(address, family);
      else this.networks.addSubnet(address, Number(bits), family);
    }
    this.userAgents = (input?.userAgents ?? []).map((source) => new RegExp(source, 'i'));
    this.hasNetworks = (input?.ips ?? []).length > 0;
  }

  /** Whether the allowlist lists anything. */
  get isEmpty(): boolean {
    return this.keys.size === 0 && !this.hasNetworks && this.userAgents.length === 0;
  }

  matches(apiKeyId: string, ip: string, userAgent: string): boolean {
    if (this.keys.has(apiKeyId)) return true;
    if (this.hasNetworks) {
      const family = isIP(ip);
      if (family !== 0 && this.networks.check(ip, family === 4 ? 'ipv4' : 'ipv6')) return true;
    }
    return this.userAgents.length > 0 && this.userAgents.some((regex) => regex.test(userAgent));
  }
}

/** The compiled configuration: fast allowlist checks and merged parameters. */
export class DetectionConfig {
  private readonly global: CompiledAllowlist;
  private readonly merchantAllowlists = new Map<string, CompiledAllowlist>();

  constructor(private readonly input: z.output<typeof detectionConfigSchema> = detectionConfigSchema.parse({})) {
    this.global = new CompiledAllowlist(input.allowlist);
    for (const [merchantId, merchant] of Object.entries(input.merchants)) {
      if (merchant.allowlist) this.merchantAllowlists.set(merchantId, new CompiledAllowlist(merchant.allowlist));
    }
  }

  /**
   * Parses a file's text; throws a readable error naming each bad field. Given the rules, every
   * override is checked against them too: a misspelt rule, parameter or plan, or a value of the
   * wrong type, would otherwise change nothing, silently, while its author believes a noisy rule
   * was tuned.
   */
  static parse(text: string, rules?: readonly TunableRule[]): DetectionConfig {
    const parsed = detectionConfigSchema.safeParse(parseJson(text));
    if (!parsed.success) {
      throw new Error(`invalid detection config: ${parsed.error.issues.map((issue) => `${issue.path.join('.')}: ${issue.message}`).join('; ')}`);
    }
    const problems = rules ? overrideProblems(parsed.data, rules) : [];
    if (problems.length > 0) throw new Error(`invalid detection config: ${problems.join('; ')}`);
    return new DetectionConfig(parsed.data);
  }

  isAllowlisted(merchantId: string, apiKeyId: string, ip: string, userAgent: string): boolean {
    return this.global.matches(apiKeyId, ip, userAgent) || (this.merchantAllowlists.get(merchantId)?.matches(apiKeyId, ip, userAgent) ?? false);
  }

  /** Whether the key itself is allowlisted (all its events are). */
  isKeyAllowlisted(merchantId: string, apiKeyId: string): boolean {
    return this.global.keys.has(apiKeyId) || (this.merchantAllowlists.get(merchantId)?.keys.has(apiKeyId) ?? false);
  }

  /** The IPs and CIDRs allowlisted for the merchant's traffic: its own and the global ones. */
  allowlistedIps(merchantId: string): string[] {
    const own = this.merchantAllowlists.get(merchantId)?.ips ?? [];
    return own.length === 0 ? [...this.global.ips] : [...new Set([...this.global.ips, ...own])];
  }

  /** Whether any allowlist lists anything: without one, no event is allowlisted. */
  get hasAllowlists(): boolean {
    return !this.global.isEmpty || [...this.merchantAllowlists.values()].some((allowlist) => !allowlist.isEmpty);
  }

  /** Rule defaults, then the plan's overrides, then the merchant's (parse with the rules refuses unknown names; without them, they are ignored). */
  parameters<P extends Record<string, unknown>>(ruleId: string, defaults: P, plan: string, merchantId: string): P {
    const planOverrides = this.input.plans[plan]?.rules?.[ruleId];
    const merchantOverrides = this.input.merchants[merchantId]?.rules?.[ruleId];
    if (!planOverrides && !merchantOverrides) return defaults;
    const merged: Record<string, unknown> = { ...defaults };
    for (const overrides of [planOverrides, merchantOverrides]) {
      for (const [name, value] of Object.entries(overrides ?? {})) {
        if (name in defaults && typeof value === typeof defaults[name]) merged[name] = value;
      }
    }
    return merged as P;
  }

  /** The highest severity of a finding on the merchant's test keys: the merchant's setting, else its plan's, else the file's, else low. */
  testKeyMaxSeverity(plan: string, merchantId: string): Severity {
    return (
      this.input.merchants[merchantId]?.testKeys?.maxSeverity ??
      this.input.plans[plan]?.testKeys?.maxSeverity ??
      this.input.testKeys?.maxSeverity ??
      DEFAULT_TEST_KEY_MAX_SEVERITY
    );
  }
}

/** What parse needs to know of a rule to check the overrides of it. */
/**
 * Reads the file now and again whenever it changes (polled every 2 s, so an edit over NFS or a
 * ConfigMap's swapped symlink is seen too): `loaded` gets each valid version, `refused` each invalid
 * one, and the caller keeps the previous config then. Returns what stops following it.
 */
export function followDetectionConfig(
  file: string,
  rules: readonly TunableRule[],
  handlers: { loaded(config: DetectionConfig): void; refused(error: Error): void },
): () => void {
  const load = () => {
    try {
      handlers.loaded(DetectionConfig.parse(readFileSync(file, 'utf8'), rules));
    } catch (error) {
      handlers.refused(error instanceof Error ? error : new Error(String(error)));
    }
  };
  load();
  watchFile(file, { interval: 2_000, persistent: false }, load);
  return () => unwatchFile(file, load);
}

export interface TunableRule {
  id: string;
  defaults: Record<string, unknown>;
  windowMs: number;
}

/**
 * What is wrong with a numeric parameter's value, by the naming convention every rule follows: a
 * count, threshold or distance is never negative, a `…Share` is a fraction (0.5 is half: 50 would
 * never fire), a `…Minutes` is a whole number of minutes, and a window (`windowMinutes`, or one
 * named `…WindowMinutes`, such as high_failure_rate's `longWindowMinutes`) is at most the history
 * the engine keeps (a longer one would be cut short without a word).
 */
function numberProblem(name: string, value: number, historyMinutes: number): string | undefined {
  if (name.endsWith('Minutes')) {
    if (!Number.isInteger(value) || value < 1) return 'must be a whole number of minutes, at least 1';
    if (/^(?:w|.+W)indowMinutes$/.test(name) && value > historyMinutes) return `at most ${historyMinutes} (the engine keeps ${historyMinutes} minutes of history)`;
    return undefined;
  }
  if (value < 0) return 'must not be negative';
  if (name.endsWith('Share') && value > 1) return `must be a share from 0 to 1 (0.5 is half), not ${value}`;
  return undefined;
}

/** Every override that names an unknown plan, rule or parameter, has the wrong type, or a value out of its range. */
function overrideProblems(input: z.output<typeof detectionConfigSchema>, rules: readonly TunableRule[]): string[] {
  const byId = new Map(rules.map((rule) => [rule.id, rule]));
  // The engine keeps the longest rule window for every key; a longer windowMinutes would be cut short without a word.
  const historyMinutes = Math.max(...rules.map((rule) => rule.windowMs)) / 60_000;
  const problems: string[] = [];
  const scopes: (readonly [path: string, overrides: z.output<typeof ruleOverrides> | undefined])[] = [
    ...Object.entries(input.plans).map(([plan, entry]) => [`plans.${plan}`, entry.rules] as const),
    ...Object.entries(input.merchants).map(([merchantId, entry]) => [`merchants.${merchantId}`, entry.rules] as const),
  ];
  for (const plan of Object.keys(input.plans)) {
    if (!(PLANS as readonly string[]).includes(plan)) problems.push(`plans.${plan}: unknown plan (plans: ${PLANS.join(', ')})`);
  }
  for (const [scope, overrides] of scopes) {
    for (const [ruleId, parameters] of Object.entries(overrides ?? {})) {
      const rule = byId.get(ruleId);
      const path = `${scope}.rules.${ruleId}`;
      if (!rule) {
        problems.push(`${path}: unknown rule (rules: ${[...byId.keys()].join(', ')})`);
        continue;
      }
      for (const [name, value] of Object.entries(parameters)) {
        const fallback = rule.defaults[name];
        if (!(name in rule.defaults)) problems.push(`${path}.${name}: unknown parameter (parameters: ${Object.keys(rule.defaults).join(', ')})`);
        else if (typeof value !== typeof fallback) problems.push(`${path}.${name}: must be a ${typeof fallback}, like its default ${JSON.stringify(fallback)}`);
        else if (typeof value === 'number') {
          const outOfRange = numberProblem(name, value, historyMinutes);
          if (outOfRange) problems.push(`${path}.${name}: ${outOfRange}`);
        }
      }
    }
  }
  return problems;
}

/**
 * JSON.parse, whose error says where the text stops being JSON but quotes none of it (V8's quotes
 * some of the text): a file named by mistake may be a mounted secret, and the error is logged.
 */
function parseJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch (error) {
    const position = jsonErrorPosition(text, (error as Error).message);
    if (position === undefined) throw new Error('not valid JSON');
    const { line, column } = lineAndColumn(text, position);
    throw new Error(`not valid JSON at line ${line}, column ${column}`);
  }
}

/**
 * Where JSON.parse's error is in `text`: the position its message states ("at position 7", followed
 * on Node 22 and later by "(line 1 column 8)"), else the one the syntax check finds. V8 states none
 * for an unexpected token (its message quotes the text around it instead) or an early end.
 */
export function jsonErrorPosition(text: string, message: string): number | undefined {
  const stated = /at position (\d+)/.exec(message)?.[1];
  return stated === undefined ? firstNonJsonOffset(text) : Number(stated);
}

/** The 1-based line and column of a position in `text`, lines ending at \n (so also at \r\n). */
export function lineAndColumn(text: string, position: number): { line: number; column: number } {
  const before = text.slice(0, position).split('\n');
  return { line: before.length, column: before.at(-1)!.length + 1 };
}

/** Thrown by firstNonJsonOffset's scan where the text stops being JSON. */
class NotJsonAt {
  constructor(readonly offset: number) {}
}

const JSON_WHITESPACE = new Set([' ', '\t', '\n', '\r']);
const JSON_ESCAPES = new Set(['"', '\\', '/', 'b', 'f', 'n', 'r', 't']);
const isDigit = (char: string | undefined) => char !== undefined && char >= '0' && char <= '9';
const isHexDigit = (char: string | undefined) => char !== undefined && /^[0-9A-Fa-f]$/.test(char);

/**
 * The offset of the first character at which `text` stops being JSON (RFC 8259, as JSON.parse
 * reads it): the character no JSON text could go on with, or text.length if it ends too early.
 * Undefined if it is JSON, or nests too deep to check. Only the syntax is checked, only after
 * JSON.parse has refused the text, to say where.
 */
export function firstNonJsonOffset(text: string): number | undefined {
  let at = 0;
  const stop = (): never => {
    throw new NotJsonAt(at);
  };
  const skipWhitespace = () => {
    while (JSON_WHITESPACE.has(text[at]!)) at++;
  };
  const expect = (char: string) => {
    if (text[at] !== char) stop();
    at++;
  };
  const digits = () => {
    if (!isDigit(text[at])) stop();
    while (isDigit(text[at])) at++;
  };
  const string = () => {
    expect('"');
    for (;;) {
      const char = text[at];
      if (char === undefined || char < ' ') stop(); // unterminated, or a raw control character
      at++;
      if (char === '"') return;
      if (char !== '\\') continue;
      if (text[at] === 'u') {
        at++;
        for (let i = 0; i < 4; i++) {
          if (!isHexDigit(text[at])) stop();
          at++;
        }
      } else if (JSON_ESCAPES.has(text[at]!)) at++;
      else stop();
    }
  };
  const number = () => {
    if (text[at] === '-') at++;
    if (text[at] === '0') at++;
    else digits();
    if (text[at] === '.') {
      at++;
      digits();
    }
    if (text[at] === 'e' || text[at] === 'E') {
      at++;
      if (text[at] === '+' || text[at] === '-') at++;
      digits();
    }
  };
  // Members and elements: `open`, then none or items separated by commas, then `close`.
  const sequence = (open: string, close: string, item: () => void) => {
    expect(open);
    skipWhitespace();
    if (text[at] === close) {
      at++;
      return;
    }
    for (;;) {
      item();
      skipWhitespace();
      if (text[at] !== ',') break;
      at++;
    }
    expect(close);
  };
  const value = (): void => {
    skipWhitespace();
    const char = text[at];
    if (char === '{') {
      sequence('{', '}', () => {
        skipWhitespace();
        string();
        skipWhitespace();
        expect(':');
        value();
      });
    } else if (char === '[') sequence('[', ']', value);
    else if (char === '"') string();
    else if (char === '-' || isDigit(char)) number();
    else if (char === 't') [...'true'].forEach(expect);
    else if (char === 'f') [...'false'].forEach(expect);
    else if (char === 'n') [...'null'].forEach(expect);
    else stop();
    skipWhitespace();
  };
  try {
    value();
    return at < text.length ? at : undefined;
  } catch (error) {
    if (error instanceof NotJsonAt) return error.offset;
    if (error instanceof RangeError) return undefined; // nested deeper than the stack allows
    throw error;
  }
}
