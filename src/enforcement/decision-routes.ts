/**
 * GET /v1/enforcement/decisions: how the API fleet reads enforcement decisions (contracts section 5),
 * with the fleet's token (`Authorization: Bearer <INGEST_TOKEN>`). Served from memory (DecisionSource).
 *
 *   200 {success:true, data:{mode, generatedAt, staleAfter, decisions:[Decision], shadowDecisions?}}
 *   503 STORAGE_UNAVAILABLE with Retry-After when the decisions are stale or not read yet
 *
 * In `enforce` mode `decisions` holds what to apply. In `shadow` mode `decisions` is always empty,
 * so a fleet that reads only it applies nothing, and what enforcing would apply is in
 * `shadowDecisions`. Optional `?apiKeyId=` (and `merchantId=`) narrows the answer to one key.
 * The fleet must let traffic through when this answer is slow, fails, or is past `staleAfter`.
 */
import type { FastifyInstance } from 'fastify';
import { z } from 'zod';
import { identifier } from '../admin/schemas.ts';
import { parseInput } from '../admin/validation.ts';
import { bearerTokenCheck } from '../http/bearer-token.ts';
import { HttpError } from '../http/errors.ts';
import type { DecisionSource } from './decision-source.ts';
import type { EnforcementDecision } from './decisions.ts';

export const DECISIONS_PATH = '/v1/enforcement/decisions';

const decisionsQuery = z.strictObject({
  apiKeyId: identifier.optional(),
  merchantId: identifier.optional(),
});

export function registerDecisionRoutes(app: FastifyInstance, options: { token: string; source: DecisionSource }): void {
  const authenticate = bearerTokenCheck(options.token, 'token');
  app.get(DECISIONS_PATH, async (request, reply) => {
    authenticate(request);
    const query = parseInput(decisionsQuery, request.query, 'query');
    const snapshot = options.source.current();
    if (snapshot === undefined) {
      throw new HttpError(503, 'STORAGE_UNAVAILABLE', 'Enforcement decisions are not available (storage has not been read recently); let traffic through', undefined, { 'retry-after': '2' });
    }
    const wanted = (decision: EnforcementDecision) =>
      (query.apiKeyId === undefined || decision.apiKeyId === query.apiKeyId) && (query.merchantId === undefined || decision.merchantId === query.merchantId);
    const decisions = snapshot.decisions.filter(wanted);
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
