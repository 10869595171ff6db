/**
 * Admin API helpers for tests and the admin benchmark: tokens, a small HTTP client, and alerts made
 * to measure (stored straight through the AlertStore, as detection would store them).
 */
import { randomUUID } from 'node:crypto';
import { mintAdminToken, type AdminRole } from '../../src/admin/auth.ts';
import type { Alert } from '../../src/alerts/alert.ts';
import { ANOMALY_TYPES, SEVERITIES } from '../../src/detect/types.ts';

export const TEST_ADMIN_SECRET = 'test-admin-jwt-secret-0123456789abcdef';

/** Environment that turns the admin API on (merge into testEnv's extra). */
export const ADMIN_ENV = { ADMIN_ENABLED: 'true', ADMIN_JWT_SECRET: TEST_ADMIN_SECRET } as const;

export function token(merchantId: string, role: AdminRole, overrides: { plan?: string; userId?: string; ttlSeconds?: number; secret?: string } = {}) {
  return mintAdminToken({
    secret: overrides.secret ?? TEST_ADMIN_SECRET,
    userId: overrides.userId ?? `user_${role}_${merchantId}`,
    merchantId,
    role,
    plan: overrides.plan,
    ttlSeconds: overrides.ttlSeconds,
  });
}

export interface AdminResponse {
  status: number;
  headers: Headers;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any -- shapes are asserted by the tests
  body: any;
  text: string;
}

/** One call to the admin API; path is under /admin/anomaly. */
export async function adminCall(
  baseUrl: string,
  bearer: string | undefined,
  path: string,
  init: { method?: string; body?: unknown; rawBody?: string; headers?: Record<string, string> } = {},
): Promise<AdminResponse> {
  const hasBody = init.body !== undefined || init.rawBody !== undefined;
  const response = await fetch(`${baseUrl}/admin/anomaly${path}`, {
    method: init.method ?? 'GET',
    headers: {
      ...(bearer ? { authorization: `Bearer ${bearer}` } : {}),
      ...(hasBody ? { 'content-type': 'application/json' } : {}),
      ...init.headers,
    },
    ...(hasBody ? { body: init.rawBody ?? JSON.stringify(init.body) } : {}),
  });
  const text = await response.text();
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    body = undefined;
  }
  return { status: response.status, headers: response.headers, body, text };
}

/** An alert as detection would have stored it; i varies type, severity, key and time. */
export function makeAlert(i: number, options: { merchantId: string; createdAtMs: number; keys?: number } & Partial<Omit<Alert, 'merchantId'>>): Alert {
  const { merchantId, createdAtMs: createdAt, keys = 20, ...overrides } = options;
  const type = ANOMALY_TYPES[i % ANOMALY_TYPES.length]!;
  const severity = SEVERITIES[(i >> 1) % SEVERITIES.length]!;
  const apiKeyId = `pk_live_${merchantId}_${i % keys}`;
  const at = new Date(createdAt).toISOString();
  return {
    id: randomUUID(),
    merchantId,
    apiKeyId,
    type,
    scope: `${apiKeyId}#${i}`,
    severity,
    riskScore: { low: 0.2, medium: 0.5, high: 0.8, critical: 0.95 }[severity],
    recommendedAction: { low: 'monitor', medium: 'rate_limit', high: 'investigate', critical: 'block' }[severity] as Alert['recommendedAction'],
    status: 'open',
    title: `${type} on ${apiKeyId}`,
    summary: `Test alert ${i} of ${merchantId}.`,
    evidence: { sampleEventIds: [`evt_${i}`], windowMs: 60_000, observed: i },
    ruleId: type,
    ruleVersion: '1.0.0',
    firstSeenAt: new Date(createdAt - 60_000).toISOString(),
    lastSeenAt: at,
    occurrences: 1,
    createdAt: at,
    updatedAt: at,
    history: [{ at, actor: 'system', from: null, to: 'open', note: 'created by detection' }],
    ...overrides,
  };
}
