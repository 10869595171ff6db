/**
 * The admin API under /admin/anomaly (contracts section 3). Contract: every route is authenticated
 * (auth.ts), rate limited per user (429 RATE_LIMITED with Retry-After), validated with its zod
 * schemas (400 in Format B naming each bad field) and answered in the `{success:true, data}`
 * envelope; routes that change something refuse viewers with 403. The OpenAPI document of the same
 * routes is served at /admin/anomaly/openapi.json without authentication.
 */
import rateLimit from '@fastify/rate-limit';
import type { FastifyError, FastifyInstance, FastifyRequest } from 'fastify';
import { z } from 'zod';
import { FailureLog, INTERLEAVED_QUIET_MS } from '../failure-log.ts';
import { handleError, HttpError, rateLimitedError, validationError } from '../http/errors.ts';
import type { Logger } from '../logger.ts';
import { attachPrincipal, principalOf, requireChangeRole, type AdminAuthenticator } from './auth.ts';
import { buildOpenApiDocument } from './openapi.ts';
import { ADMIN_PREFIX, type AdminRoute } from './route.ts';
import { parseInput } from './validation.ts';

export interface AdminApiOptions {
  authenticator: AdminAuthenticator;
  routes: readonly AdminRoute[];
  /** Requests per user per minute. */
  rateLimitPerMinute: number;
  maxBodyBytes: number;
  version: string;
}

export async function registerAdminApi(app: FastifyInstance, options: AdminApiOptions): Promise<void> {
  const document = buildOpenApiDocument(options.routes, options.version);
  await app.register(
    async (scope) => {
      scope.get('/openapi.json', async () => document);

      await scope.register(async (secured) => {
        secured.setErrorHandler((error: FastifyError, request, reply) => handleError(adminBodyError(error, options.maxBodyBytes) ?? error, request, reply));
        // Many clients send Content-Type: application/json on every request, a bodiless DELETE too: an
        // empty body is no body (Fastify's parser refuses it), which a route without a body schema
        // accepts and one with a schema refuses naming its fields. Any other body is parsed as before.
        // The same holds whatever type an empty body is sent as; a body that is there must be JSON
        // (Fastify's text/plain parser would hand a route a string, refused as "expected object").
        const parseJson = secured.getDefaultJsonParser('error', 'error'); // as the server's (server.ts)
        secured.removeAllContentTypeParsers();
        secured.addContentTypeParser<string>('application/json', { parseAs: 'string' }, (request, body, done) => {
          if (body.length === 0) done(null, undefined);
          else parseJson(request, body, done);
        });
        secured.addContentTypeParser<string>('*', { parseAs: 'string' }, (_request, body, done) => {
          if (body.length === 0) done(null, undefined);
          else done(notJson());
        });
        secured.addHook('onRequest', async (request) => {
          attachPrincipal(request, await options.authenticator.authenticate(request.headers.authorization));
        });
        // After authentication, so the limit is per user and unauthenticated calls are not counted;
        // before the body is read, so a request over the limit is refused without reading it, and
        // one whose body cannot be read (a 400) is counted too.
        await secured.register(rateLimit, {
          hook: 'preParsing',
          max: options.rateLimitPerMinute,
          timeWindow: 60_000,
          keyGenerator: (request: FastifyRequest) => principalOf(request).limitKey,
          // RateLimit-Limit, -Remaining, -Reset (seconds) on every response, as the API fleet's own.
          enableDraftSpec: true,
          errorResponseBuilder: (_request, context) => rateLimitedError(context.ttl / 1000),
        });
        for (const route of options.routes) registerRoute(secured, route, options.maxBodyBytes);
      });
    },
    { prefix: ADMIN_PREFIX },
  );
}

function registerRoute(scope: FastifyInstance, route: AdminRoute, bodyLimit: number): void {
  // Past validation, what fails is storage, for every request while it is down (a dashboard polls):
  // logged per route (a route that does not read storage, or a bug in another, must not hide it)
  // when it starts, once a minute while it lasts, and at a success 10 s after its last failure (a
  // cached answer among failing ones does not end it).
  const failures = new FailureLog(scope.log as Logger, 'admin request failed', 'admin requests succeed again', {
    quietMs: INTERLEAVED_QUIET_MS,
  });
  scope.route({
    method: route.method,
    url: route.path,
    bodyLimit,
    handler: async (request, reply) => {
      const principal = principalOf(request);
      if (route.changes) requireChangeRole(principal);
      const query = parseInput(route.query ?? emptyObject, request.query, 'query');
      const params = parseInput(route.params ?? emptyObject, request.params, 'params');
      // A route without a body schema takes no body: anything but an empty one is refused.
      const body = parseInput(route.body ?? emptyObject, request.body, 'body');
      const data = await route.handle({ principal, query, params, body, request, reply }).catch((error: unknown) => {
        if (error instanceof HttpError) throw error;
        // Past validation, what fails is storage: the caller may retry; the details go to the log only.
        failures.failed({ err: error, route: route.operationId });
        throw new HttpError(503, 'STORAGE_UNAVAILABLE', 'Storage is unavailable; retry shortly', undefined, { 'retry-after': '5' });
      });
      failures.succeeded({ route: route.operationId });
      return reply.code(route.status ?? 200).send({ success: true, data });
    },
  });
}

const emptyObject = z.strictObject({});

/**
 * A body the admin API cannot read (too large, or not JSON) is a bad body: 400 in Format B naming
 * it, as contracts section 3 has it for any bad query or body.
 */
function adminBodyError(error: FastifyError, maxBodyBytes: number): HttpError | undefined {
  if (error.code === 'FST_ERR_CTP_BODY_TOO_LARGE') return validationError([{ path: ['body'], message: `larger than ${maxBodyBytes} bytes` }], 'Invalid body');
  if (error.code === 'FST_ERR_CTP_INVALID_MEDIA_TYPE') return notJson();
  return undefined;
}

function notJson(): HttpError {
  return validationError([{ path: ['body'], message: 'must be sent as application/json' }], 'Invalid body');
}
