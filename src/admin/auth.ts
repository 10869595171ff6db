/**
 * Who is calling the admin API (contracts section 3): an HS256 JWT in `Authorization: Bearer`, with
 * the claims sub, merchantId, plan, role and exp. Contract: a missing, malformed, expired, not yet
 * valid or badly signed token, or one with `alg: none` or any algorithm but HS256, is 401
 * UNAUTHORIZED; a plan that is not entitled is 403 PLAN_UPGRADE_REQUIRED; a role that may not do
 * something is 403 FORBIDDEN. Error messages never echo the token.
 */
import { createHash } from 'node:crypto';
import type { FastifyRequest } from 'fastify';
import { errors as joseErrors, jwtVerify, SignJWT } from 'jose';
import { z } from 'zod';
import { SYSTEM_ACTOR } from '../alerts/alert.ts';
import { containsSecret } from '../events/secrets.ts';
import { HttpError } from '../http/errors.ts';

export const ADMIN_ROLES = ['viewer', 'admin', 'operator'] as const;
export type AdminRole = (typeof ADMIN_ROLES)[number];

export interface AdminPrincipal {
  /** The admin user (the token's sub). */
  userId: string;
  merchantId: string;
  plan: string;
  role: AdminRole;
  /**
   * The rate limiter's key: a digest of the user and its merchant. Not of the token's text: one
   * signature can be spelled several ways (base64url's spare bits, padding), each a bucket of its own.
   */
  limitKey: string;
}

// sub and merchantId are stored (alert histories, webhook endpoints): neither may carry a secret.
const claimsSchema = z.object({
  sub: z.string().min(1).max(200).refine((sub) => !containsSecret(sub)),
  // As long as request events may carry it (1..128 characters).
  merchantId: z.string().min(1).max(128).refine((merchantId) => !containsSecret(merchantId)),
  plan: z.string().min(1).max(50),
  role: z.string().min(1).max(50),
  exp: z.number(),
});

const ALGORITHM = 'HS256';
/** Clock skew allowed between the token issuer and this worker. */
const CLOCK_TOLERANCE_SECONDS = 5;
const MAX_TOKEN_LENGTH = 4096;

export class AdminAuthenticator {
  /** The current secret first, then (while ADMIN_JWT_SECRET is being rotated) the previous one. */
  private readonly keys: readonly Uint8Array[];
  private readonly entitledPlans: ReadonlySet<string>;
  /** The 403 PLAN_UPGRADE_REQUIRED message, naming the plans that are entitled (ENTITLED_PLANS). */
  private readonly upgradeMessage: string;

  constructor(secret: string, entitledPlans: readonly string[], previousSecret?: string) {
    const encoder = new TextEncoder();
    this.keys = [secret, ...(previousSecret === undefined || previousSecret === secret ? [] : [previousSecret])].map((text) => encoder.encode(text));
    this.entitledPlans = new Set(entitledPlans);
    this.upgradeMessage = planUpgradeMessage([...this.entitledPlans]);
  }

  /** Verifies the bearer token of a request; throws HttpError 401 or 403. */
  async authenticate(authorization: string | undefined): Promise<AdminPrincipal> {
    const payload = await this.verify(bearerToken(authorization));
    const claims = claimsSchema.safeParse(payload);
    if (!claims.success) throw unauthorized('Token lacks the claims sub, merchantId, plan and role');
    const { sub, merchantId, plan, role } = claims.data;
    // Alert histories name the worker's own changes so; an admin by that name would pass for it.
    if (sub === SYSTEM_ACTOR) throw new HttpError(403, 'FORBIDDEN', `The token's sub "${SYSTEM_ACTOR}" is reserved for the worker's own changes`);
    if (!this.entitledPlans.has(plan)) {
      throw new HttpError(403, 'PLAN_UPGRADE_REQUIRED', this.upgradeMessage);
    }
    // A well-signed token whose role is none of ours is authenticated but not authorized.
    if (!isAdminRole(role)) throw new HttpError(403, 'FORBIDDEN', 'The token\'s role has no access to the Security Center');
    const limitKey = createHash('sha256').update(`${merchantId}\u0000${sub}`).digest('base64url').slice(0, 22);
    return { userId: sub, merchantId, plan, role, limitKey };
  }

  /**
   * The token's verified claims. A signature that does not match the current secret is tried with the
   * previous one, so that rotating ADMIN_JWT_SECRET across replicas and issuers signs no one out.
   */
  private async verify(token: string): Promise<unknown> {
    for (const [index, key] of this.keys.entries()) {
      try {
        const { payload } = await jwtVerify(token, key, {
          algorithms: [ALGORITHM],
          requiredClaims: ['exp', 'sub'],
          clockTolerance: CLOCK_TOLERANCE_SECONDS,
        });
        return payload;
      } catch (error) {
        const anotherKeyMayMatch = error instanceof joseErrors.JWSSignatureVerificationFailed && index < this.keys.length - 1;
        if (!anotherKeyMayMatch) throw unauthorized(error instanceof joseErrors.JWTExpired ? 'Token has expired' : 'Token is invalid');
      }
    }
    throw unauthorized('Token is invalid'); // not reached: the last key's failure is thrown above
  }
}

/** "The Security Center is available on the Business and Enterprise plans", for the plans given (in their order). */
export function planUpgradeMessage(plans: readonly string[]): string {
  const names = plans.map((plan) => plan.charAt(0).toUpperCase() + plan.slice(1));
  const list = names.length > 1 ? `${names.slice(0, -1).join(', ')} and ${names.at(-1)}` : (names[0] ?? '');
  return `The Security Center is available on the ${list} plan${names.length > 1 ? 's' : ''}`;
}

function isAdminRole(role: string): role is AdminRole {
  return (ADMIN_ROLES as readonly string[]).includes(role);
}

function bearerToken(authorization: string | undefined): string {
  // The scheme is case-insensitive (RFC 9110, section 11.1).
  const match = /^Bearer ([A-Za-z0-9_.=-]+)$/i.exec(authorization ?? '');
  if (!match || match[1]!.length > MAX_TOKEN_LENGTH) throw unauthorized('Send Authorization: Bearer <token>');
  return match[1]!;
}

function unauthorized(message: string): HttpError {
  return new HttpError(401, 'UNAUTHORIZED', message, undefined, { 'www-authenticate': 'Bearer' });
}

/** Viewers read; admins and operators also change. */
export function requireChangeRole(principal: AdminPrincipal): void {
  if (principal.role === 'viewer') throw new HttpError(403, 'FORBIDDEN', 'Your role may read but not change');
}

/**
 * The merchant a request acts on. Everyone acts on their own merchant; an operator may name another
 * with ?merchantId=, and without it acts across all merchants (undefined).
 * A non-operator naming another merchant gets 403 whether or not that merchant exists.
 */
export function merchantScope(principal: AdminPrincipal, requested: string | undefined): string | undefined {
  if (principal.role === 'operator') return requested;
  if (requested !== undefined && requested !== principal.merchantId) {
    throw new HttpError(403, 'FORBIDDEN', 'Only operators may choose a merchant');
  }
  return principal.merchantId;
}

/** The principal the admin API's authentication hook attached to the request. */
export function principalOf(request: FastifyRequest): AdminPrincipal {
  const principal = (request as FastifyRequest & { adminPrincipal?: AdminPrincipal }).adminPrincipal;
  if (!principal) throw new HttpError(401, 'UNAUTHORIZED', 'Send Authorization: Bearer <token>');
  return principal;
}

export function attachPrincipal(request: FastifyRequest, principal: AdminPrincipal): void {
  (request as FastifyRequest & { adminPrincipal?: AdminPrincipal }).adminPrincipal = principal;
}

export interface MintOptions {
  secret: string;
  userId: string;
  merchantId: string;
  role: AdminRole;
  plan?: string;
  /** Lifetime in seconds (default one hour). */
  ttlSeconds?: number;
}

/** Mints a token as the identity provider would (the `npm run token` command and tests use it). */
export async function mintAdminToken(options: MintOptions): Promise<string> {
  return new SignJWT({ merchantId: options.merchantId, plan: options.plan ?? 'business', role: options.role })
    .setProtectedHeader({ alg: ALGORITHM, typ: 'JWT' })
    .setSubject(options.userId)
    .setIssuedAt()
    .setExpirationTime(Math.floor(Date.now() / 1000) + (options.ttlSeconds ?? 3600))
    .sign(new TextEncoder().encode(options.secret));
}
