/**
 * The OpenAPI 3.1 document of the admin API, generated from the same zod schemas that validate the
 * requests (route.ts), so the two cannot drift apart.
 */
import { z } from 'zod';
import { ADMIN_ROLES } from './auth.ts';
import { ADMIN_PREFIX, type AdminRoute } from './route.ts';

type JsonSchema = Record<string, unknown>;

const ERROR_DESCRIPTIONS: Record<number, string> = {
  400: 'Invalid query, path or body (Format B, naming each field)',
  401: 'Missing, malformed, expired or badly signed token',
  403: 'FORBIDDEN (role) or PLAN_UPGRADE_REQUIRED (plan not entitled)',
  404: 'Unknown id, or another merchant\'s: the two are indistinguishable',
  409: 'INVALID_TRANSITION: the lifecycle does not allow the move',
  429: 'RATE_LIMITED: too many requests for this token; see Retry-After',
  503: 'STORAGE_UNAVAILABLE (storage cannot be reached) or SERVICE_UNAVAILABLE (the worker is stopping); see Retry-After',
};
// Every route can answer 503: registerRoute (admin-api.ts) turns a storage failure into STORAGE_UNAVAILABLE.
const COMMON_ERRORS = [400, 401, 403, 429, 503];
/** The error bodies not in Format A's plain schema, `Error`. */
const ERROR_SCHEMAS: Record<number, string> = { 400: 'ValidationError', 429: 'RateLimited' };
/** The statuses sent with Retry-After (seconds). */
const RETRY_AFTER_STATUSES = new Set([429, 503]);

const formatA = z.object({
  success: z.literal(false),
  error: z.object({ code: z.string(), message: z.string(), details: z.unknown().optional() }),
});
/** 429 RATE_LIMITED: Format A with `retryAfterSeconds` at the top, where the spec puts it (renderError). */
const rateLimited = formatA.extend({ retryAfterSeconds: z.number().int().min(1) });
const formatB = z.object({
  error: z.string(),
  code: z.literal('VALIDATION_ERROR'),
  details: z.array(z.object({ path: z.array(z.union([z.string(), z.number()])), message: z.string() })),
});

function jsonSchema(schema: z.ZodType, io: 'input' | 'output'): JsonSchema {
  const { $schema: _ignored, ...rest } = z.toJSONSchema(schema, { io, unrepresentable: 'any' }) as JsonSchema;
  return rest;
}

/** Fastify's '/alerts/:id' as OpenAPI's '/alerts/{id}'. */
function openApiPath(path: string): string {
  return path.replace(/:([A-Za-z0-9_]+)/g, '{$1}');
}

function parameters(route: AdminRoute): JsonSchema[] {
  const result: JsonSchema[] = [];
  for (const [location, schema] of [['path', route.params], ['query', route.query]] as const) {
    if (!schema) continue;
    const object = jsonSchema(schema, 'input') as { properties?: Record<string, JsonSchema>; required?: string[] };
    for (const [name, property] of Object.entries(object.properties ?? {})) {
      const { description, ...propertySchema } = property;
      result.push({
        name,
        in: location,
        required: location === 'path' || (object.required ?? []).includes(name),
        ...(description ? { description } : {}),
        schema: propertySchema,
      });
    }
  }
  return result;
}

export function buildOpenApiDocument(routes: readonly AdminRoute[], version: string): JsonSchema {
  const paths: Record<string, Record<string, JsonSchema>> = {};
  for (const route of routes) {
    const status = route.status ?? 200;
    const responses: Record<string, JsonSchema> = {
      [String(status)]: {
        description: 'Success',
        content: {
          'application/json': {
            schema: {
              type: 'object',
              required: ['success', 'data'],
              properties: { success: { const: true }, data: jsonSchema(route.response, 'output') },
            },
          },
        },
      },
    };
    for (const code of [...new Set([...COMMON_ERRORS, ...(route.errors ?? [])])].sort()) {
      responses[String(code)] = {
        description: ERROR_DESCRIPTIONS[code] ?? 'Error',
        ...(RETRY_AFTER_STATUSES.has(code) ? { headers: { 'Retry-After': { description: 'seconds to wait before retrying', schema: { type: 'integer', minimum: 1 } } } } : {}),
        content: { 'application/json': { schema: { $ref: `#/components/schemas/${ERROR_SCHEMAS[code] ?? 'Error'}` } } },
      };
    }
    (paths[`${ADMIN_PREFIX}${openApiPath(route.path)}`] ??= {})[route.method.toLowerCase()] = {
      operationId: route.operationId,
      summary: route.summary,
      ...(route.description ? { description: route.description } : {}),
      ...(route.changes ? { 'x-required-roles': ['admin', 'operator'] } : {}),
      parameters: parameters(route),
      ...(route.body
        ? { requestBody: { required: true, content: { 'application/json': { schema: jsonSchema(route.body, 'input') } } } }
        : {}),
      responses,
      security: [{ bearer: [] }],
    };
  }
  return {
    openapi: '3.1.0',
    info: {
      title: 'Security Center admin API',
      version,
      description:
        `Alerts, lifecycle, metrics and dashboard of the anomaly worker. Authenticate with an HS256 JWT ` +
        `carrying sub, merchantId, plan, role (${ADMIN_ROLES.join(', ')}) and exp.`,
    },
    paths,
    components: {
      securitySchemes: { bearer: { type: 'http', scheme: 'bearer', bearerFormat: 'JWT' } },
      schemas: { Error: jsonSchema(formatA, 'output'), RateLimited: jsonSchema(rateLimited, 'output'), ValidationError: jsonSchema(formatB, 'output') },
    },
  };
}
