/**
 * One admin route, described once: its zod schemas validate the request and generate the OpenAPI
 * document (openapi.ts), and the admin API (admin-api.ts) does the common work around `handle`:
 * authentication, the role check, rate limiting, validation and the `{success:true, data}` envelope.
 */
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { z } from 'zod';
import type { AdminPrincipal } from './auth.ts';

export const ADMIN_PREFIX = '/admin/anomaly';

export type HttpMethod = 'GET' | 'PUT' | 'PATCH' | 'DELETE' | 'POST';

export interface RouteInput<Q extends z.ZodType, P extends z.ZodType, B extends z.ZodType> {
  principal: AdminPrincipal;
  query: z.output<Q>;
  params: z.output<P>;
  body: z.output<B>;
  request: FastifyRequest;
  reply: FastifyReply;
}

export interface AdminRoute<Q extends z.ZodType = z.ZodType, P extends z.ZodType = z.ZodType, B extends z.ZodType = z.ZodType> {
  method: HttpMethod;
  /** Under /admin/anomaly, in Fastify's form: '/alerts/:id'. */
  path: string;
  /** OpenAPI operationId. */
  operationId: string;
  summary: string;
  description?: string;
  /** True when only the admin and operator roles may call it (viewers get 403). */
  changes?: boolean;
  query?: Q;
  params?: P;
  body?: B;
  /** The schema of `data` in the success envelope. */
  response: z.ZodType;
  /** Success status (200 by default). */
  status?: number;
  /** Error statuses this route can answer besides 400, 401, 403, 429 and 503 (for the document). */
  errors?: readonly number[];
  handle(input: RouteInput<Q, P, B>): Promise<unknown>;
}

/** Keeps the schemas' types flowing into `handle` while the route list stays homogeneous. */
export function defineRoute<Q extends z.ZodType, P extends z.ZodType, B extends z.ZodType>(route: AdminRoute<Q, P, B>): AdminRoute {
  return route as unknown as AdminRoute;
}
