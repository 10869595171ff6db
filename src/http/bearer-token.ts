/**
 * `Authorization: Bearer <token>` against one configured token, for the fleet's endpoints (ingest,
 * enforcement decisions). Digests are compared, so the comparison takes the same time whatever the
 * length of the guess; the token never appears in an error.
 */
import { createHash, timingSafeEqual } from 'node:crypto';
import type { FastifyRequest } from 'fastify';
import { HttpError } from './errors.ts';

/** A check that throws 401 UNAUTHORIZED ("Missing or invalid <name>") unless the request carries the token. */
export function bearerTokenCheck(token: string, name: string): (request: FastifyRequest) => void {
  const expected = digest(token);
  return (request) => {
    const header = request.headers.authorization;
    const match = typeof header === 'string' ? /^Bearer (.+)$/i.exec(header) : null;
    if (!match || !timingSafeEqual(digest(match[1]!), expected)) throw new HttpError(401, 'UNAUTHORIZED', `Missing or invalid ${name}`);
  };
}

function digest(value: string): Buffer {
  return createHash('sha256').update(value).digest();
}
