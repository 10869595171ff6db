/**
 * Allowlists and rule parameter overrides, from the JSON file named by DETECTION_CONFIG_FILE,
 * reloaded without a restart. Contract: an allowlisted key, IP, network or user agent never feeds a
 * window, so it never produces an alert; an invalid file is refused whole and the previous one stays.
 *
 * {
 *   "allowlist": { "keys": ["pk_live_probe"], "ips": ["203.0.113.7", "198.51.100.0/24"], "userAgents": ["^uptime-bot/"] },
 *   "merchants": { "m_1": { "allowlist": { ... }, "rules": { "velocity_attack": { "thresholdRatio": 3 } } } },
 *   "plans": { "enterprise": { "rules": { "velocity_attack": { "thresholdRatio": 2 } } } }
 * }
 */
import { BlockList, isIP } from 'node:net';
import { z } from 'zod';

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

export const detectionConfigSchema = z.strictObject({
  allowlist: allowlistSchema.optional(),
  merchants: z.record(z.string(), z.strictObject({ allowlist: allowlistSchema.optional(), rules: ruleOverrides.optional() })).default({}),
  plans: z.record(z.string(), z.strictObject({ rules: ruleOverrides.optional() })).default({}),
});
export type DetectionConfigInput = z.input<typeof detectionConfigSchema>;

class CompiledAllowlist {
  readonly keys: Set<string>;
  readonly networks = new BlockList();
  /** BlockList.check builds a SocketAddress per call: skip it when no network is listed. */
  private readonly hasNetworks: boolean;
  readonly userAgents: RegExp[];

  constructor(input: z.output<typeof allowlistSchema> | undefined) {
    this.keys = new Set(input?.keys ?? []);
    for (const entry of input?.ips ?? []) {
      const [address, bits] = entry.split('/') as [string, string | undefined];
      const family = isIP(address) === 4 ? 'ipv4' : 'ipv6';
      if (bits === undefined) this.networks.addAddress(address, family);
      else this.networks.addSubnet(address, Number(bits), family);
    }
    this.userAgents = (input?.userAgents ?? []).map((source) => new RegExp(source, 'i'));
    this.hasNetworks = (input?.ips ?? []).length > 0;
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

  /** Parses a file's text; throws a readable error naming each bad field. */
  static parse(text: string): DetectionConfig {
    const parsed = detectionConfigSchema.safeParse(JSON.parse(text));
    if (!parsed.success) {
      throw new Error(`invalid detection config: ${parsed.error.issues.map((issue) => `${issue.path.join('.')}: ${issue.message}`).join('; ')}`);
    }
    return new DetectionConfig(parsed.data);
  }

  isAllowlisted(merchantId: string, apiKeyId: string, ip: string, userAgent: string): boolean {
    return this.global.matches(apiKeyId, ip, userAgent) || (this.merchantAllowlists.get(merchantId)?.matches(apiKeyId, ip, userAgent) ?? false);
  }

  /** Rule defaults, then the plan's overrides, then the merchant's. Unknown parameter names are ignored. */
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
}
