/**
 * The alert routes of the admin API (contracts section 3): the list with filters and cursor paging,
 * one alert, its status change, metrics and the dashboard. Contract: every read and write is scoped
 * by the caller's merchant (merchantScope), and an alert of another merchant answers exactly as an
 * unknown id does: the same 404, after the same single query.
 */
import { z } from 'zod';
import type { AlertService } from '../alerts/alert-service.ts';
import { toWireAlert, type Alert } from '../alerts/alert.ts';
import { withInsightsShown } from '../alerts/insights.ts';
import { ANOMALY_TYPES, SEVERITIES } from '../detect/types.ts';
import { HttpError, validationError } from '../http/errors.ts';
import type { AlertStore } from '../store/alert-store.ts';
import type { EventStore } from '../store/event-store.ts';
import { merchantScope } from './auth.ts';
import { dashboardInsights } from './dashboard-insights.ts';
import type { ResponseCache } from './response-cache.ts';
import { defineRoute, type AdminRoute } from './route.ts';
import {
  alertIdParams,
  alertPageSchema,
  alertSchema,
  DASHBOARD_RANGES,
  DEFAULT_PAGE_SIZE,
  dashboardQuery,
  dashboardSchema,
  encodeCursor,
  listAlertsQuery,
  merchantQuery,
  metricsQuery,
  metricsSchema,
  MAX_METRICS_RANGE_MS,
  patchAlertBody,
  rangeWithDefaults,
} from './schemas.ts';

export interface AlertRoutesDeps {
  alertStore: AlertStore;
  eventStore: EventStore;
  alerts: AlertService;
  /** Shares metrics and dashboard answers for a few seconds (keys include the merchant). */
  cache: ResponseCache;
  /** FEATURE_AI_RISK_SCORING: alerts show aiInsights and the dashboard names attack patterns; off, neither. */
  aiInsights?: boolean;
  now?: () => number;
}

const DEFAULT_METRICS_RANGE_MS = 24 * 3_600_000;
const TOP_KEYS = 10;
const RECENT_ALERTS = 10;
/** The riskiest alerts of the range the dashboard's insights are read from: bounded, so the dashboard stays fast. */
const INSIGHT_ALERTS = 200;

function notFound(): HttpError {
  return new HttpError(404, 'NOT_FOUND', 'Alert not found');
}

const UUID = z.uuid();

/** The alert id of a path, or 404 for one that cannot name an alert (the same answer as an unknown id). */
function alertId(id: string): string {
  if (!UUID.safeParse(id).success) throw notFound();
  return id.toLowerCase();
}

export function alertRoutes(deps: AlertRoutesDeps): AdminRoute[] {
  const now = deps.now ?? Date.now;
  const aiInsights = deps.aiInsights ?? false;
  const wire = (alert: Alert) => toWireAlert(withInsightsShown(alert, aiInsights));

  async function metrics(range: { from: Date; to: Date; merchantId?: string }) {
    const [traffic, counts] = await Promise.all([deps.eventStore.trafficTotals(range), deps.alertStore.counts(range)]);
    return {
      from: range.from.toISOString(),
      to: range.to.toISOString(),
      totalRequests: traffic.requests,
      failureRate: Math.round(traffic.failureRate * 10_000) / 10_000,
      uniqueIps: traffic.uniqueIps,
      activeAlerts: counts.activeAlerts,
      criticalAlerts: counts.criticalAlerts,
      alertsByType: Object.fromEntries(ANOMALY_TYPES.map((type) => [type, counts.alertsByType[type] ?? 0])),
      alertsBySeverity: Object.fromEntries(SEVERITIES.map((severity) => [severity, counts.alertsBySeverity[severity] ?? 0])),
    };
  }

  async function dashboard(range: keyof typeof DASHBOARD_RANGES, merchantId: string | undefined) {
    const { rangeMs, bucketSeconds } = DASHBOARD_RANGES[range];
    // The range ends with the bucket in progress and starts at the start of the bucket that holds
    // now - range, so the whole range is covered (one bucket more than the range holds) and every
    // point of the trends but the last is a whole bucket (a first point cut short would read as a drop).
    const bucketMs = bucketSeconds * 1000;
    const to = new Date(now());
    const from = new Date(Math.floor((to.getTime() - rangeMs) / bucketMs) * bucketMs);
    const [summary, trend, topKeys, recent, seen] = await Promise.all([
      metrics({ from, to, merchantId }),
      deps.eventStore.trafficTrend({ from, to, merchantId, bucketSeconds }),
      deps.alertStore.topKeysByRisk({ from, to, merchantId, limit: TOP_KEYS }),
      // The newest alerts created in the range, as metrics' alertsByType counts them.
      deps.alertStore.list({ merchantId, from, to, limit: RECENT_ALERTS }),
      aiInsights ? deps.alertStore.riskiestSeen({ from, to, merchantId, limit: INSIGHT_ALERTS }) : [],
    ]);
    return {
      range,
      metrics: summary,
      trafficTrend: trend.map((point) => ({ t: new Date(point.t).toISOString(), requests: point.requests })),
      // No requests, no rate: null, which a chart draws as a gap (0 would read as a total outage).
      successTrend: trend.map((point) => ({
        t: new Date(point.t).toISOString(),
        successRate: point.requests === 0 ? null : Math.round((point.successes / point.requests) * 10_000) / 10_000,
      })),
      topKeys,
      recentAlerts: recent.map(wire),
      aiInsights: aiInsights
        ? dashboardInsights({
            alerts: seen,
            truncated: seen.length >= INSIGHT_ALERTS,
            criticalActive: summary.criticalAlerts,
            range,
            acrossMerchants: merchantId === undefined,
          })
        : [],
    };
  }

  return [
    defineRoute({
      method: 'GET',
      path: '/alerts',
      operationId: 'listAlerts',
      summary: 'List alerts, newest first',
      description:
        'Filters combine with AND; status, severity, type and recommendedAction take comma-separated values. Pages are stable: ' +
        'pass nextCursor to get the next page; alerts created meanwhile never shift a page.',
      query: listAlertsQuery,
      response: alertPageSchema,
      handle: async ({ principal, query }) => {
        const limit = query.limit ?? DEFAULT_PAGE_SIZE;
        // One row more than the page tells whether there is a next page.
        const rows = await deps.alertStore.list({
          merchantId: merchantScope(principal, query.merchantId),
          status: query.status,
          severity: query.severity,
          type: query.type,
          recommendedAction: query.recommendedAction,
          apiKeyId: query.apiKeyId,
          from: query.from,
          to: query.to,
          after: query.cursor,
          limit: limit + 1,
        });
        const page = rows.slice(0, limit);
        const last = page[page.length - 1];
        return {
          alerts: page.map(wire),
          nextCursor: rows.length > limit && last ? encodeCursor({ createdAt: Date.parse(last.createdAt), id: last.id }) : null,
        };
      },
    }),

    defineRoute({
      method: 'GET',
      path: '/alerts/:id',
      operationId: 'getAlert',
      summary: 'One alert with its evidence and history',
      params: alertIdParams,
      query: merchantQuery,
      response: alertSchema,
      errors: [404],
      handle: async ({ principal, params, query }) => {
        const merchantId = merchantScope(principal, query.merchantId);
        const alert = await deps.alertStore.get(alertId(params.id), merchantId);
        if (!alert) throw notFound();
        return wire(alert);
      },
    }),

    defineRoute({
      method: 'PATCH',
      path: '/alerts/:id',
      operationId: 'changeAlertStatus',
      summary: 'Move an alert through its lifecycle',
      description:
        'open -> acknowledged -> resolved; open or acknowledged -> dismissed (needs a note: a false positive, ' +
        'which silences the same pattern for a while). Any other move is 409 INVALID_TRANSITION, and so is a move that ' +
        'lost to a conflicting change of the same alert made at the same time (through another replica): of two changes ' +
        'decided on the same stored alert, the first stored stands. ' +
        'Every change is recorded in the alert history with the caller and the note. The same move sent again by ' +
        'the same caller with the same note while it is the latest (a retry after a lost answer or a 503) answers 200 with the alert ' +
        'and is not recorded twice; with another note it is a move from the status the alert has, 409.',
      changes: true,
      params: alertIdParams,
      query: merchantQuery,
      body: patchAlertBody,
      response: alertSchema,
      errors: [404, 409],
      handle: async ({ principal, params, query, body }) => {
        const merchantId = merchantScope(principal, query.merchantId);
        const outcome = await deps.alerts.changeStatus(alertId(params.id), merchantId, {
          to: body.status,
          actor: principal.userId,
          note: body.note ?? undefined,
        });
        if (!outcome) throw notFound();
        if (!outcome.ok && outcome.reason === 'note_required') {
          throw validationError([{ path: ['body', 'note'], message: 'a note is required to dismiss an alert' }]);
        }
        if (!outcome.ok) throw new HttpError(409, 'INVALID_TRANSITION', `This alert cannot move to ${body.status} from its current status`);
        // The counts and recent alerts cached for the dashboard no longer hold (on this replica).
        deps.cache.invalidate(outcome.alert.merchantId);
        return wire(outcome.alert);
      },
    }),

    defineRoute({
      method: 'GET',
      path: '/metrics',
      operationId: 'getMetrics',
      summary: 'Traffic and alert counts over a range (default: the last 24 h)',
      description:
        'Traffic comes from the per-minute rollups, each minute counted in the range its start falls in, [from, to). activeAlerts and criticalAlerts count the alerts open or ' +
        'acknowledged now; alertsByType and alertsBySeverity count the alerts created in the range, [from, to) too. ' +
        'from must be within the last 400 days (the rollups\' retention). ' +
        'Answers are shared for a few seconds (ADMIN_CACHE_TTL_MS); a status change drops its merchant\'s.',
      query: metricsQuery,
      response: metricsSchema,
      handle: async ({ principal, query }) => {
        const merchantId = merchantScope(principal, query.merchantId);
        const key = `metrics\u0000${query.from?.getTime() ?? ''}\u0000${query.to?.getTime() ?? ''}`;
        const range = rangeWithDefaults(query, now(), DEFAULT_METRICS_RANGE_MS, MAX_METRICS_RANGE_MS);
        return deps.cache.get(merchantId, key, () => metrics({ ...range, merchantId }));
      },
    }),

    defineRoute({
      method: 'GET',
      path: '/dashboard',
      operationId: 'getDashboard',
      summary: 'Metrics, traffic and success trends, riskiest keys, recent alerts and AI insights for a range',
      description:
        'Trends have one point per minute for 1h, per 15 minutes for 24h and per hour for 7d, from the start of the ' +
        'bucket that holds the range\'s start (metrics.from) to the bucket in progress, the only one not whole; a point without ' +
        'requests has successRate null (no rate, not 0%). ' +
        'recentAlerts are the 10 newest alerts created in the range. ' +
        'With FEATURE_AI_RISK_SCORING on, aiInsights names the attack patterns across the alerts seen in the range ' +
        '(fixed rules over their evidence, no trained model); off, it is empty. ' +
        'Answers are shared for a few seconds (ADMIN_CACHE_TTL_MS); a status change drops its merchant\'s.',
      query: dashboardQuery,
      response: dashboardSchema,
      handle: async ({ principal, query }) => {
        const range = query.range ?? '24h';
        const merchantId = merchantScope(principal, query.merchantId);
        return deps.cache.get(merchantId, `dashboard\u0000${range}`, () => dashboard(range, merchantId));
      },
    }),
  ];
}
