/**
 * The admin API's request and response schemas (contracts section 3). They validate requests and
 * generate the OpenAPI document. Query values arrive as strings; every field is bounded, unknown
 * fields are refused, and nothing here ever reaches SQL except as a bound parameter.
 */
import { z } from 'zod';
import { ALERT_STATUSES } from '../alerts/alert.ts';
import { ACTIONS, ANOMALY_TYPES, SEVERITIES } from '../detect/types.ts';
import { CARRIES_SECRET, containsSecret } from '../events/secrets.ts';
import { validationError } from '../http/errors.ts';
import { STORABLE_TIME_MS } from '../store/event-store.ts';

/** Merchant and key ids, any text as request events carry them (1..128 characters); values are bound, never spliced into SQL. */
export const identifier = z.string().min(1).max(128);

const storable = (ms: number) => ms >= STORABLE_TIME_MS.min && ms <= STORABLE_TIME_MS.max;

export const isoDate = z.iso
  .datetime({ offset: true, message: 'an ISO 8601 date-time, e.g. 2026-11-20T12:00:00Z' })
  .transform((text) => new Date(text))
  .refine((date) => storable(date.getTime()), 'a date from 1900 to 2299');

/** `a,b,c` of allowed values (a repeated parameter is refused: use the comma form). */
function commaList<const T extends readonly [string, ...string[]]>(values: T) {
  return z
    .string()
    .max(200)
    .transform((text) => text.split(',').map((part) => part.trim()))
    .pipe(z.array(z.enum(values)).min(1).max(values.length))
    .describe(`one or more of ${values.join(', ')}, comma-separated`);
}

/** An epoch-ms time a page position may hold (storable, like every date the API takes). */
export const positionTime = z.number().int().nonnegative().refine(storable);

/**
 * An opaque page position: base64url of a JSON tuple that `tuple` checks (and may turn into an
 * object). `param` reads one from a query (anything else is "not a cursor from this API"); `encode`
 * writes the next page's.
 */
export function pageCursor<T extends z.ZodType<unknown, readonly unknown[]>>(tuple: T, maxLength = 200) {
  return {
    encode: (position: z.input<T>): string => Buffer.from(JSON.stringify(position)).toString('base64url'),
    param: z
      .string()
      .max(maxLength, 'not a cursor from this API')
      .regex(/^[A-Za-z0-9_-]+$/, 'not a cursor from this API')
      .transform((text, context): z.output<T> => {
        try {
          return tuple.parse(JSON.parse(Buffer.from(text, 'base64url').toString('utf8')));
        } catch {
          context.addIssue({ code: 'custom', message: 'not a cursor from this API' });
          return z.NEVER;
        }
      })
      .describe('nextCursor of the previous page'),
  };
}

/** An alert list's page position: [createdAt epoch ms, id]. */
export interface Cursor {
  createdAt: number;
  id: string;
}

const alertCursor = pageCursor(z.tuple([positionTime, z.uuid()]).transform(([createdAt, id]): Cursor => ({ createdAt, id })));

export function encodeCursor(cursor: Cursor): string {
  return alertCursor.encode([cursor.createdAt, cursor.id]);
}

export const cursorParam = alertCursor.param;

/** The page size of every admin list when the request names none. */
export const DEFAULT_PAGE_SIZE = 50;

export const limitParam = z
  .string()
  .regex(/^\d{1,4}$/, 'an integer from 1 to 200')
  .transform(Number)
  .pipe(z.number().int().min(1, 'an integer from 1 to 200').max(200, 'an integer from 1 to 200'))
  .optional()
  .describe(`page size, 1..200 (default ${DEFAULT_PAGE_SIZE})`);

/** A merchant an operator names, which may be stored (as a webhook endpoint's): never with a secret in it. */
export const namedMerchantId = identifier.refine((merchantId) => !containsSecret(merchantId), CARRIES_SECRET);
const merchantIdParam = namedMerchantId.optional().describe('operators only: the merchant to act on');

/**
 * from must not be after to. Zod runs an object's refinements even when a field failed, and then
 * the field still holds its text: each check here looks at dates that parsed, and at nothing else.
 */
export function rangeInOrder(value: { from?: Date; to?: Date }, context: z.RefinementCtx): void {
  if (value.from instanceof Date && value.to instanceof Date && value.from > value.to) {
    context.addIssue({ code: 'custom', path: ['to'], message: 'must not be before from' });
  }
}

/**
 * A query's range with its defaults filled in (to: now; from: `defaultSpanMs` before to), checked
 * as a whole: a bound given alone may be out of order with the other's default (from tomorrow, to
 * now), or the two too far apart, which the schema, seeing one bound, could not tell. 400 naming
 * the field given.
 */
export function rangeWithDefaults(query: { from?: Date; to?: Date }, now: number, defaultSpanMs: number, maxSpanMs = Infinity): { from: Date; to: Date } {
  const to = query.to ?? new Date(now);
  const from = query.from ?? new Date(to.getTime() - defaultSpanMs);
  const named = query.from ? 'from' : 'to';
  if (from > to) throw validationError([{ path: ['query', named], message: query.from ? 'must not be after to (default: now)' : 'must not be before from' }], 'Invalid query');
  const maxDays = Math.round(maxSpanMs / 86_400_000);
  if (to.getTime() - from.getTime() > maxSpanMs) {
    throw validationError([{ path: ['query', 'from'], message: `the range may span at most ${maxDays} days` }], 'Invalid query');
  }
  // What is kept reaches back as far as a range may span (the rollups' retention): a range before
  // that would answer zeros that read as "no traffic". A day's grace for a client's "400 days ago".
  if (from.getTime() < now - maxSpanMs - 86_400_000) {
    throw validationError([{ path: ['query', named], message: `must be within the last ${maxDays} days: older figures are not kept` }], 'Invalid query');
  }
  return { from, to };
}

export const listAlertsQuery = z
  .strictObject({
    status: commaList(ALERT_STATUSES).optional(),
    severity: commaList(SEVERITIES).optional(),
    type: commaList(ANOMALY_TYPES).optional(),
    recommendedAction: commaList(ACTIONS).optional(),
    apiKeyId: identifier.optional(),
    from: isoDate.optional().describe('created at or after'),
    to: isoDate.optional().describe('created at or before'),
    limit: limitParam,
    cursor: cursorParam.optional(),
    merchantId: merchantIdParam,
  })
  .superRefine(rangeInOrder);

// Any text: an id that is not a UUID names no alert, so it is 404 like any unknown id (contracts section 3).
export const alertIdParams = z.strictObject({ id: z.string().describe('the alert id (a UUID)') });

export const merchantQuery = z.strictObject({ merchantId: merchantIdParam });

export const patchAlertBody = z.strictObject({
  status: z.enum(ALERT_STATUSES),
  // null is no note, as history entries show it.
  note: z.string().trim().min(1, 'must not be empty').max(2000).refine((note) => !containsSecret(note), CARRIES_SECRET).nullish(),
});

/** Longest range metrics may cover: the rollups' retention. */
export const MAX_METRICS_RANGE_MS = 400 * 24 * 3_600_000;

export const metricsQuery = z
  .strictObject({
    from: isoDate.optional().describe('default: 24 h before to'),
    to: isoDate.optional().describe('default: now'),
    merchantId: merchantIdParam,
  })
  // Its span (at most MAX_METRICS_RANGE_MS) is checked with the defaults filled in: rangeWithDefaults.
  .superRefine(rangeInOrder);

/** Dashboard ranges and the chart resolution that fits each. */
export const DASHBOARD_RANGES = {
  '1h': { rangeMs: 3_600_000, bucketSeconds: 60 },
  '24h': { rangeMs: 24 * 3_600_000, bucketSeconds: 15 * 60 },
  '7d': { rangeMs: 7 * 24 * 3_600_000, bucketSeconds: 3_600 },
} as const;

export const dashboardQuery = z.strictObject({
  range: z.enum(['1h', '24h', '7d']).optional().describe('default 24h'),
  merchantId: merchantIdParam,
});

// ---- responses ----

export const alertSchema = z.object({
  id: z.uuid(),
  merchantId: z.string(),
  apiKeyId: z.string().nullable(),
  type: z.enum(ANOMALY_TYPES),
  severity: z.enum(SEVERITIES),
  riskScore: z.number().min(0).max(1),
  recommendedAction: z.enum(ACTIONS),
  status: z.enum(ALERT_STATUSES),
  title: z.string(),
  summary: z.string(),
  evidence: z.record(z.string(), z.unknown()),
  ruleId: z.string(),
  ruleVersion: z.string(),
  firstSeenAt: z.string(),
  lastSeenAt: z.string(),
  occurrences: z.number().int(),
  createdAt: z.string(),
  updatedAt: z.string(),
  history: z.array(
    z.object({
      at: z.string(),
      actor: z.string(),
      from: z.enum(ALERT_STATUSES).nullable(),
      to: z.enum(ALERT_STATUSES),
      note: z.string().nullable().describe('why, as the caller gave it; null when no note was given'),
    }),
  ),
  aiInsights: z.array(z.string()).optional(),
});

export const alertPageSchema = z.object({ alerts: z.array(alertSchema), nextCursor: z.string().nullable() });

export const metricsSchema = z.object({
  from: z.string(),
  to: z.string(),
  totalRequests: z.number().int(),
  failureRate: z.number(),
  uniqueIps: z.number().int(),
  activeAlerts: z.number().int(),
  criticalAlerts: z.number().int(),
  alertsByType: z.record(z.string(), z.number().int()),
  alertsBySeverity: z.record(z.string(), z.number().int()),
});

export const dashboardSchema = z.object({
  range: z.enum(['1h', '24h', '7d']),
  metrics: metricsSchema,
  trafficTrend: z.array(z.object({ t: z.string(), requests: z.number().int() })),
  successTrend: z.array(
    z.object({
      t: z.string(),
      successRate: z.number().nullable().describe('share of the bucket\'s requests answered below 400, 0..1; null when it had none (no rate, not 0%)'),
    }),
  ),
  topKeys: z.array(
    z.object({
      merchantId: z.string(),
      apiKeyId: z.string(),
      riskScore: z.number(),
      alerts: z.number().int(),
      activeAlerts: z.number().int(),
      topType: z.string(),
    }),
  ),
  recentAlerts: z.array(alertSchema),
  aiInsights: z.array(z.string()),
});
