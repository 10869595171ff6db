import { SignJWT } from 'jose';
import { describe, expect, it } from 'vitest';
import { HttpError } from '../http/errors.ts';
import { AdminAuthenticator, mintAdminToken } from './auth.ts';

const PLANS = ['business', 'enterprise'];
const CURRENT = 'current-admin-jwt-secret-0123456789abcdef';
const PREVIOUS = 'previous-admin-jwt-secret-0123456789abcdef';
const UNRELATED = 'someone-elses-jwt-secret-0123456789abcdef';

function tokenSignedWith(secret: string, ttlSeconds = 3600): Promise<string> {
  return mintAdminToken({ secret, userId: 'u_1', merchantId: 'm_1', role: 'admin', plan: 'business', ttlSeconds });
}

async function failureOf(authenticator: AdminAuthenticator, token: string): Promise<HttpError> {
  const caught = await authenticator.authenticate(`Bearer ${token}`).then(() => undefined, (error: unknown) => error);
  expect(caught).toBeInstanceOf(HttpError);
  return caught as HttpError;
}

describe('AdminAuthenticator: rotating ADMIN_JWT_SECRET', () => {
  it('accepts tokens signed with the current secret or, while it is set, the previous one', async () => {
    const rotating = new AdminAuthenticator(CURRENT, PLANS, PREVIOUS);
    await expect(rotating.authenticate(`Bearer ${await tokenSignedWith(CURRENT)}`)).resolves.toMatchObject({ userId: 'u_1', merchantId: 'm_1' });
    await expect(rotating.authenticate(`Bearer ${await tokenSignedWith(PREVIOUS)}`)).resolves.toMatchObject({ userId: 'u_1', merchantId: 'm_1' });
  });

  it('refuses a token of the previous secret once that is no longer set, and one of any other secret', async () => {
    const rotated = new AdminAuthenticator(CURRENT, PLANS);
    expect(await failureOf(rotated, await tokenSignedWith(PREVIOUS))).toMatchObject({ statusCode: 401, message: 'Token is invalid' });
    const rotating = new AdminAuthenticator(CURRENT, PLANS, PREVIOUS);
    expect(await failureOf(rotating, await tokenSignedWith(UNRELATED))).toMatchObject({ statusCode: 401, message: 'Token is invalid' });
  });

  it('says an expired token of the previous secret has expired', async () => {
    const rotating = new AdminAuthenticator(CURRENT, PLANS, PREVIOUS);
    expect(await failureOf(rotating, await tokenSignedWith(PREVIOUS, -60))).toMatchObject({ statusCode: 401, message: 'Token has expired' });
  });

  it('holds the previous secret to the same rules as the current one (HS256 only, exp required)', async () => {
    const rotating = new AdminAuthenticator(CURRENT, PLANS, PREVIOUS);
    const claims = { merchantId: 'm_1', plan: 'business', role: 'admin' };
    const key = new TextEncoder().encode(PREVIOUS);
    const hs512 = await new SignJWT(claims).setProtectedHeader({ alg: 'HS512' }).setSubject('u_1').setExpirationTime('1h').sign(key);
    const withoutExp = await new SignJWT(claims).setProtectedHeader({ alg: 'HS256' }).setSubject('u_1').sign(key);
    for (const token of [hs512, withoutExp]) {
      expect(await failureOf(rotating, token)).toMatchObject({ statusCode: 401, message: 'Token is invalid' });
    }
  });
});

describe('AdminAuthenticator: the worker\'s own name', () => {
  it('refuses a token whose sub is "system", the actor of the worker\'s own history entries', async () => {
    const authenticator = new AdminAuthenticator(CURRENT, PLANS);
    const system = await mintAdminToken({ secret: CURRENT, userId: 'system', merchantId: 'm_1', role: 'admin', plan: 'business', ttlSeconds: 3600 });
    expect(await failureOf(authenticator, system)).toMatchObject({ statusCode: 403, code: 'FORBIDDEN', message: expect.stringContaining('reserved') });
    const similar = await mintAdminToken({ secret: CURRENT, userId: 'system-admin', merchantId: 'm_1', role: 'admin', plan: 'business', ttlSeconds: 3600 });
    await expect(authenticator.authenticate(`Bearer ${similar}`)).resolves.toMatchObject({ userId: 'system-admin' });
  });

  it('refuses a token whose sub or merchantId carries an API key secret: both are stored (alert histories, webhook endpoints)', async () => {
    const authenticator = new AdminAuthenticator(CURRENT, PLANS);
    for (const [userId, merchantId] of [['admin sk_live_SUBSECRET', 'm_1'], ['u_1', 'm_1%2Fsk_live_MSECRET']]) {
      const token = await mintAdminToken({ secret: CURRENT, userId: userId!, merchantId: merchantId!, role: 'admin', plan: 'business', ttlSeconds: 3600 });
      const failure = await failureOf(authenticator, token);
      expect(failure).toMatchObject({ statusCode: 401 });
      expect(failure.message).not.toMatch(/SECRET/);
    }
  });
});
