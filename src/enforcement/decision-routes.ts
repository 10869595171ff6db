/**
 * Enforcement decisions over HTTP, both served from memory (DecisionSource): for the API fleet, and
 * for the admins whose keys they concern.
 *
 * GET /v1/enforcement/decisions: how the API fleet reads enforcement decisions (contracts section 5),
 * with the fleet's token (`Authorization: Bearer <INGEST_TOKEN>`).
 *
 *   200 {success:true, data:{mode, generatedAt, staleAfter, decisions:[Decision], shadowDecisions?}}
 *   503 STORAGE_UNAVAILABLE with Retry-After when the decisions are stale or not read yet
 *
 * In `enforce` mode `decisions` holds what to apply. In `shadow` mode `decisions` is always empty,
 * so a fleet that reads only it applies nothing, and what enforcing would apply is in
 * `shadowDecisions`. Optional `?apiKeyId=` (and `merchantId=`) narrows the answer to one key.
 * The fleet must let traffic through when this answer is slow, fails, or is past `staleAfter`.
 *
 * GET /admin/anomaly/enforcement: the same decisions in the admin API (any role; a merchant's own
 * keys, an operator's choice of merchant or all), so an admin can tell why a key is throttled or
 * blocked, or would be in shadow mode, and which alert to resolve or dismiss to end it. With
 * enforcement off it answers mode `off` and no decisions; while the decisions are stale, 503.
 * Allowlisted addresses (exemptIps) are left out: the global ones are the operators' business.
 *
 * GET /admin/anomaly/enforcement/history: the decisions in force at some time in a range (default
 * the last 7 days), from storage, with when each started and ended: what enforcing did, or in
 * shadow mode would have done, to judge before turning enforcement on. Readable in any mode; paged
 * by nextCursor.
 */
import type { FastifyInstance } from 'fastify';
import { z } from 'zod';
import { merchantScope } from '../admin/auth.ts';
import { defineRoute, type AdminRoute } from '../admin/route.ts';
import { DEFAULT_PAGE_SIZE, identifier, isoDate, limitParam, pageCursor, positionTime, rangeInOrder, rangeWithDefaults } from '../admin/schemas.ts';
import { parseInput } from '../admin/validation.ts';
import { bearerTokenCheck } from '../http/bearer-token.ts';
import { HttpError } from '../http/errors.ts';
import { ENFORCEMENT_MODES, type DecisionHistoryEntry, type EnforcementHistoryStore, type HistoryPosition } from '../store/enforcement-history-store.ts';
import type { DecisionSource } from './decision-source.ts';
import { ENFORCEMENT_ACTIONS, type EnforcementDecision } from './decisions.ts';

export const DECISIONS_PATH = '/v1/enforcement/decisions';

const decisionsQuery = z.strictObject({
  apiKeyId: identifier.optional(),
  merchantId: identifier.optional(),
});

/** The decisions about one key or merchant, or all of them (each filter optional). */
function narrowed(decisions: readonly EnforcementDecision[], filter: { apiKeyId?: string; merchantId?: string }): EnforcementDecision[] {
  return decisions.filter(
    (decision) => (filter.apiKeyId === undefined || decision.apiKeyId === filter.apiKeyId) && (filter.merchantId === undefined || decision.merchantId === filter.merchantId),
  );
}

/** A decision's identity in the history: one key, one alert, one action. */
function decisionId(decision: { merchantId: string; apiKeyId: string; alertId: string; action: string }): string {
  return `${decision.merchantId}\u0000${decision.apiKeyId}\u0000${decision.alertId}\u0000${decision.action}`;
}

function unavailable(): HttpError {
  return new HttpError(503, 'STORAGE_UNAVAILABLE', 'Enforcement decisions are not available (storage has not been read recently); let traffic through', undefined, { 'retry-after': '2' });
}

export function registerDecisionRoutes(app: FastifyInstance, options: { token: string; source: DecisionSource }): void {
  const authenticate = bearerTokenCheck(options.token, 'token');
  app.get(DECISIONS_PATH, async (request, reply) => {
    authenticate(request);
    const query = parseInput(decisionsQuery, request.query, 'query');
    const snapshot = options.source.current();
    if (snapshot === undefined) throw unavailable();
    const decisions = narrowed(snapshot.decisions, query);
    const { mode } = options.source;
    reply.header('cache-control', 'no-store');
    return {
      success: true,
      data: {
        mode,
        generatedAt: new Date(snapshot.generatedAt).toISOString(),
        staleAfter: new Date(snapshot.staleAfter).toISOString(),
        decisions: mode === 'enforce' ? decisions : [],
        ...(mode === 'shadow' ? { shadowDecisions: decisions } : {}),
      },
    };
  });
}

const adminEnforcementQuery = z.strictObject({
  apiKeyId: identifier.optional().describe('one key'),
  merchantId: identifier.optional().describe('operators only: one merchant (default: all)'),
});

const adminDecisionView = z.object({
  apiKeyId: z.string(),
  merchantId: z.string(),
  action: z.enum(ENFORCEMENT_ACTIONS),
  reason: z.string().describe('the alert behind it: type, severity, risk and title'),
  alertId: z.uuid().describe('resolve or dismiss this alert to end the decision'),
  expiresAt: z.string().describe('when the decision lapses unless the key holders earn its action again'),
});

const adminEnforcementView = z.object({
  mode: z.enum(['off', 'shadow', 'enforce']),
  applied: z.boolean().describe('whether the API fleet is told to apply these decisions (mode enforce)'),
  generatedAt: z.string().nullable().describe('when storage was read; null when enforcement is off'),
  decisions: z.array(adminDecisionView).describe('in shadow mode: what enforcing would apply'),
});

const HISTORY_DEFAULT_RANGE_MS = 7 * 24 * 3_600_000;

/** A history page's position: its last entry's [startedAt epoch ms, merchantId, apiKeyId, alertId, action, mode]. */
const historyCursor = pageCursor(
  z
    .tuple([positionTime, identifier, identifier, z.uuid(), z.enum(ENFORCEMENT_ACTIONS), z.enum(ENFORCEMENT_MODES)])
    .transform(([startedAt, merchantId, apiKeyId, alertId, action, mode]): HistoryPosition => ({ startedAt, merchantId, apiKeyId, alertId, action, mode })),
  // Two identifiers of up to 128 characters, a character up to 6 bytes of JSON (\u0001), in base64url.
  3_000,
);

function cursorAfter(entry: DecisionHistoryEntry): string {
  return historyCursor.encode([Date.parse(entry.startedAt), entry.merchantId, entry.apiKeyId, entry.alertId, entry.action, entry.mode]);
}

const historyQuery = z
  .strictObject({
    from: isoDate.optional().describe('default: 7 days before to'),
    to: isoDate.optional().describe('default: now'),
    apiKeyId: identifier.optional().describe('one key'),
    merchantId: identifier.optional().describe('operators only: one merchant (default: all)'),
    limit: limitParam,
    cursor: historyCursor.param.optional(),
  })
  .superRefine(rangeInOrder);

const historyEntryView = z.object({
  apiKeyId: z.string(),
  merchantId: z.string(),
  action: z.enum(ENFORCEMENT_ACTIONS),
  mode: z.enum(ENFORCEMENT_MODES).describe('shadow: recorded, not applied'),
  reason: z.string().describe('the alert behind it: type, severity, risk and title'),
  alertId: z.uuid(),
  startedAt: z.string().describe('when a replica first saw the decision'),
  endedAt: z.string().nullable().describe('when it last ended (its expiry, when it lapsed while no replica ran); null while in force'),
  expiresAt: z.string().describe('when it was due to lapse as last recorded; new evidence extends a decision in force'),
  active: z.boolean().nullable().describe('whether it is among the decisions now; null when that is not known (enforcement off or stale)'),
});

const historyView = z.object({
  from: z.string(),
  to: z.string(),
  entries: z.array(historyEntryView).describe('the latest started first, at most limit (default 50)'),
  nextCursor: z.string().nullable().describe('pass as cursor (with the same filters) for the next page; null on the last'),
});

/**
 * The admin API's view of the decisions; `source` is undefined when ENFORCEMENT_MODE=off (the
 * history of earlier decisions stays readable).
 */
export function enforcementAdminRoutes(source: DecisionSource | undefined, history: EnforcementHistoryStore): AdminRoute[] {
  return [
    defineRoute({
      method: 'GET',
      path: '/enforcement',
      operationId: 'listEnforcementDecisions',
      summary: 'Keys throttled or blocked now (or that would be, in shadow mode), and the alerts behind them',
      description:
        'One decision per key, the strongest of its open or acknowledged alerts; it ends when that alert is resolved ' +
        'or dismissed, the key is allowlisted, or expiresAt passes without new evidence (another live alert of the key ' +
        'then decides). 503 while the decisions are stale.',
      query: adminEnforcementQuery,
      response: adminEnforcementView,
      handle: async ({ principal, query, reply }) => {
        const merchantId = merchantScope(principal, query.merchantId);
        reply.header('cache-control', 'no-store');
        if (source === undefined) return { mode: 'off', applied: false, generatedAt: null, decisions: [] };
        const snapshot = source.current();
        if (snapshot === undefined) throw unavailable();
        const decisions = narrowed(snapshot.decisions, { apiKeyId: query.apiKeyId, merchantId }).map(({ exemptIps: _exemptIps, ...decision }) => decision);
        return { mode: source.mode, applied: source.mode === 'enforce', generatedAt: new Date(snapshot.generatedAt).toISOString(), decisions };
      },
    }),
    defineRoute({
      method: 'GET',
      path: '/enforcement/history',
      operationId: 'listEnforcementHistory',
      summary: 'Keys throttled or blocked (or that would have been, in shadow mode) over a range, with when each started and ended',
      description:
        'Every decision in force at some time in the range (default the last 7 days), the latest started first. ' +
        'A decision is one key, one alert and one action: a change of action ends one and starts another.',
      query: historyQuery,
      response: historyView,
      handle: async ({ principal, query, reply }) => {
        const merchantId = merchantScope(principal, query.merchantId);
        const { from, to } = rangeWithDefaults(query, Date.now(), HISTORY_DEFAULT_RANGE_MS);
        const limit = query.limit ?? DEFAULT_PAGE_SIZE;
        // One more than a page: whether another page follows.
        const rows = await history.list({ from, to, merchantId, apiKeyId: query.apiKeyId, after: query.cursor, limit: limit + 1 });
        const entries = rows.slice(0, limit);
        // Which of them are in force now, when that is known (enforcement on, decisions fresh).
        const snapshot = source?.current();
        const current = new Set(snapshot?.decisions.map(decisionId));
        reply.header('cache-control', 'no-store');
        return {
          from: from.toISOString(),
          to: to.toISOString(),
          entries: entries.map((entry) => ({ ...entry, active: snapshot === undefined ? null : entry.mode === source?.mode && current.has(decisionId(entry)) })),
          nextCursor: rows.length > limit ? cursorAfter(entries[entries.length - 1]!) : null,
        };
      },
    }),
  ];
}
