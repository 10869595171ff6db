/**
 * Admin routes of a merchant's critical-alert webhook (contracts section 4):
 *   GET    /admin/anomaly/webhook             the registered endpoint (never its secret)
 *   PUT    /admin/anomaly/webhook  {url}      registers or replaces it; returns a new signing secret, once
 *   DELETE /admin/anomaly/webhook             removes it (pending messages to it are cancelled)
 *   GET    /admin/anomaly/webhook/deliveries  recent messages and their attempts, newest first
 * Contract: a merchant's webhook is changed by its admins, or by an operator naming the merchant
 * (?merchantId=, required for the singleton routes); the URL is checked against the target policy
 * (400 naming body.url); the secret appears in the PUT response only (with Cache-Control: no-store),
 * never in a log, an error or a GET. Merchant roles see their deliveries to their own endpoint;
 * operators also see the on-call deliveries.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { z } from 'zod';
import { merchantScope, type AdminPrincipal } from '../admin/auth.ts';
import { defineRoute, type AdminRoute } from '../admin/route.ts';
import { cursorParam, DEFAULT_PAGE_SIZE, encodeCursor, identifier, limitParam, namedMerchantId } from '../admin/schemas.ts';
import { CARRIES_SECRET, containsSecret } from '../events/secrets.ts';
import { HttpError, validationError } from '../http/errors.ts';
import type { WorkerMetrics } from '../metrics.ts';
import { DESTINATIONS, MESSAGE_STATUSES, type WebhookEndpoint, type WebhookStore } from '../store/webhook-store.ts';
import { BlockedTargetError, checkTarget, type TargetPolicy } from './target-policy.ts';

export interface WebhookRouteDeps {
  store: WebhookStore;
  policy: TargetPolicy;
  /** Counts the messages a removal cancels, as the dispatcher counts the ones it cancels. */
  metrics?: Pick<WorkerMetrics, 'webhookMessages'>;
  now?: () => number;
}

const merchantQuery = z.strictObject({
  merchantId: namedMerchantId.optional().describe('operators: the merchant whose webhook this is (required)'),
});

const endpointView = z.object({
  url: z.string(),
  createdAt: z.string(),
  updatedAt: z.string(),
  createdBy: z.string().describe('the admin user who first registered the endpoint'),
  updatedBy: z.string().describe('the admin user who last registered it (its URL and secret)'),
});

const registeredView = endpointView.extend({
  secret: z.string().describe('the signing secret: shown this once; store it now'),
});

const attemptView = z.object({
  attempt: z.number().int(),
  at: z.string(),
  outcome: z.string(),
  statusCode: z.number().int().nullable(),
  error: z.string().nullable(),
  durationMs: z.number().int(),
});

const deliveryView = z.object({
  id: z.string().describe('the message id, sent as svc-id'),
  alertId: z.string(),
  merchantId: z.string(),
  destination: z.enum(DESTINATIONS),
  target: z.string().describe('where the last attempt went (for on-call: the origin only)'),
  status: z.enum(MESSAGE_STATUSES),
  attempts: z.number().int(),
  nextAttemptAt: z.string().nullable(),
  lastOutcome: z.string().nullable(),
  lastError: z.string().nullable(),
  createdAt: z.string(),
  updatedAt: z.string(),
  attemptLog: z.array(attemptView),
});

const deliveriesQuery = z.strictObject({
  merchantId: identifier.optional().describe('operators: one merchant (default: all)'),
  status: z.enum(MESSAGE_STATUSES).optional(),
  limit: limitParam,
  cursor: cursorParam.optional(),
});

const iso = (ms: number) => new Date(ms).toISOString();

export function webhookRoutes(deps: WebhookRouteDeps): AdminRoute[] {
  const now = deps.now ?? Date.now;
  const view = (endpoint: WebhookEndpoint) => ({
    url: endpoint.url,
    createdAt: iso(endpoint.createdAt),
    updatedAt: iso(endpoint.updatedAt),
    createdBy: endpoint.createdBy,
    updatedBy: endpoint.updatedBy,
  });

  return [
    defineRoute({
      method: 'GET',
      path: '/webhook',
      operationId: 'getWebhook',
      summary: 'The registered critical-alert webhook endpoint (without its secret)',
      query: merchantQuery,
      response: endpointView,
      errors: [404],
      async handle({ principal, query }) {
        const endpoint = await deps.store.endpoint(singleMerchant(principal, query.merchantId));
        if (!endpoint) throw new HttpError(404, 'NOT_FOUND', 'No webhook endpoint is registered');
        return view(endpoint);
      },
    }),
    defineRoute({
      method: 'PUT',
      path: '/webhook',
      operationId: 'putWebhook',
      summary: 'Register or replace the critical-alert webhook endpoint',
      description:
        'The URL must be https and reach a public address. Every call issues a new signing secret, returned ' +
        'in this response only; deliveries are signed with it from now on.',
      changes: true,
      query: merchantQuery,
      body: z.strictObject({ url: z.string().min(1).max(2048) }),
      response: registeredView,
      async handle({ principal, query, body, reply }) {
        const merchantId = singleMerchant(principal, query.merchantId);
        let url: string;
        try {
          url = (await checkTarget(body.url, deps.policy)).url.href;
        } catch (error) {
          if (error instanceof BlockedTargetError) throw validationError([{ path: ['body', 'url'], message: error.message }], 'Invalid body');
          throw error;
        }
        // A secret in the URL would be stored, shown and kept with every delivery's record. Checked as
        // stored: parsing drops tabs and newlines, which would hide `s\tk_…` in the text sent.
        if (containsSecret(url)) {
          throw validationError([{ path: ['body', 'url'], message: CARRIES_SECRET }], 'Invalid body');
        }
        const at = now();
        const previous = await deps.store.endpoint(merchantId);
        const endpoint: WebhookEndpoint & { secret: string } = {
          merchantId,
          endpointId: randomUUID(),
          url,
          secret: `whsec_${randomBytes(32).toString('base64url')}`,
          // A replacement is a new endpoint (id, secret, breaker) for the same merchant: when and by
          // whom it was first registered stay.
          createdBy: previous?.createdBy ?? principal.userId,
          updatedBy: principal.userId,
          createdAt: previous?.createdAt ?? at,
          updatedAt: at,
        };
        await deps.store.putEndpoint(endpoint);
        void reply.header('cache-control', 'no-store');
        return { ...view(endpoint), secret: endpoint.secret };
      },
    }),
    defineRoute({
      method: 'DELETE',
      path: '/webhook',
      operationId: 'deleteWebhook',
      summary: 'Remove the critical-alert webhook endpoint',
      changes: true,
      query: merchantQuery,
      response: z.object({ deleted: z.literal(true) }),
      errors: [404],
      async handle({ principal, query }) {
        const removed = await deps.store.removeEndpoint(singleMerchant(principal, query.merchantId), now(), principal.userId);
        if (!removed) throw new HttpError(404, 'NOT_FOUND', 'No webhook endpoint is registered');
        deps.metrics?.webhookMessages.inc({ destination: 'merchant', status: 'cancelled' }, removed.cancelledMessages);
        return { deleted: true as const };
      },
    }),
    defineRoute({
      method: 'GET',
      path: '/webhook/deliveries',
      operationId: 'listWebhookDeliveries',
      summary: 'Recent critical-alert webhook messages and their attempts, newest first',
      query: deliveriesQuery,
      response: z.object({ deliveries: z.array(deliveryView), nextCursor: z.string().nullable() }),
      async handle({ principal, query }) {
        const merchantId = merchantScope(principal, query.merchantId);
        const limit = query.limit ?? DEFAULT_PAGE_SIZE;
        const deliveries = await deps.store.deliveries({
          merchantId,
          // The on-call endpoint is the operator's, not the merchant's.
          destination: principal.role === 'operator' ? undefined : 'merchant',
          status: query.status,
          limit: limit + 1,
          after: query.cursor,
        });
        const page = deliveries.slice(0, limit);
        const last = page[page.length - 1];
        return {
          deliveries: page.map((delivery) => ({
            id: delivery.id,
            alertId: delivery.alertId,
            merchantId: delivery.merchantId,
            destination: delivery.destination,
            target: delivery.target,
            status: delivery.status,
            attempts: delivery.attempts,
            nextAttemptAt: delivery.status === 'pending' ? iso(delivery.nextAttemptAt) : null,
            lastOutcome: delivery.lastOutcome || null,
            lastError: delivery.lastError || null,
            createdAt: iso(delivery.createdAt),
            updatedAt: iso(delivery.updatedAt),
            attemptLog: delivery.attemptLog.map((attempt) => ({
              attempt: attempt.attempt,
              at: iso(attempt.at),
              outcome: attempt.outcome,
              statusCode: attempt.statusCode ?? null,
              error: attempt.error || null,
              durationMs: attempt.durationMs,
            })),
          })),
          nextCursor: deliveries.length > limit && last ? encodeCursor(last) : null,
        };
      },
    }),
  ];
}

/** The one merchant a singleton route acts on: an operator must name it. */
function singleMerchant(principal: AdminPrincipal, requested: string | undefined): string {
  const merchantId = merchantScope(principal, requested);
  if (merchantId === undefined) throw validationError([{ path: ['query', 'merchantId'], message: 'operators must name the merchant' }], 'Invalid query');
  return merchantId;
}

