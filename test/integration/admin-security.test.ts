/**
 * The admin API's security suite, over real HTTP on the real ClickHouse engine: forged, expired,
 * premature and unsigned tokens; each role against each endpoint; merchant A probing merchant B's
 * alert ids, filters and cursors; malformed and hostile input in every parameter; the per-user
 * rate limit. Each case asserts the exact status and error code, and that nothing of B leaks to A.
 */
import { SignJWT, UnsecuredJWT } from 'jose';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AdminRole } from '../../src/admin/auth.ts';
import { encodeCursor } from '../../src/admin/schemas.ts';
import type { Alert } from '../../src/alerts/alert.ts';
import { createLogger } from '../../src/logger.ts';
import { startWorker, type Worker } from '../../src/main.ts';
import { startClickHouse, type ClickHouseService } from '../services/clickhouse.ts';
import { ADMIN_ENV, adminCall, makeAlert, TEST_ADMIN_SECRET, token, type AdminResponse } from '../support/admin.ts';

/** A well-formed cursor whose time no date can hold. */
const FAR_FUTURE_CURSOR = Buffer.from('[9000000000000000,"00000000-0000-4000-8000-000000000001"]').toString('base64url');
import { testConfig, testNames } from '../support/worker.ts';

const names = testNames('adminsec');
const A = `m_${names.runId}_a`;
const B = `m_${names.runId}_b`;
const RATE_LIMIT = 60;
const MISSING_ID = '00000000-0000-4000-8000-000000000000';
/** The secret being rotated out: its tokens are still let in until they expire. */
const PREVIOUS_SECRET = 'previous-admin-jwt-secret-0123456789abcdef';

describe('admin API security', () => {
  let clickhouse: ClickHouseService;
  let worker: Worker;
  let alertsOfA: Alert[];
  let alertsOfB: Alert[];
  let tokenCount = 0;

  /** A user of its own for each use, so the per-user rate limit never couples two cases. */
  const fresh = (merchantId: string, role: AdminRole, plan?: string) => token(merchantId, role, { userId: `u${tokenCount++}`, plan });
  const call = (bearer: string | undefined, path: string, init?: Parameters<typeof adminCall>[3]) => adminCall(worker.url, bearer, path, init);

  function expectFormatA(response: AdminResponse, status: number, code: string): void {
    expect(response.status, response.text).toBe(status);
    expect(response.body).toEqual({ success: false, error: { code, message: expect.any(String) } });
  }

  function expectValidation(response: AdminResponse, path: (string | number)[]): void {
    expect(response.status, response.text).toBe(400);
    expect(response.body).toMatchObject({ code: 'VALIDATION_ERROR', error: expect.any(String) });
    expect(response.body.details.map((issue: { path: unknown[] }) => issue.path)).toContainEqual(path);
  }

  /** Nothing of merchant B appears anywhere in a response to A. */
  function expectNothingOfB(response: AdminResponse): void {
    expect(response.text).not.toContain(B);
    for (const alert of alertsOfB) expect(response.text).not.toContain(alert.id);
  }

  beforeAll(async () => {
    clickhouse = await startClickHouse();
    const config = testConfig({ clickhouse, names, extra: { ...ADMIN_ENV, ADMIN_JWT_SECRET_PREVIOUS: PREVIOUS_SECRET, ADMIN_RATE_LIMIT_PER_MINUTE: String(RATE_LIMIT) } });
    worker = await startWorker(config, { logger: createLogger('silent') });
    await worker.ready;
    const now = Date.now();
    alertsOfA = Array.from({ length: 6 }, (_, i) => makeAlert(i, { merchantId: A, createdAtMs: now - (10 - i) * 60_000 }));
    // B's alerts are newer than A's and share A's key names' shapes: a leak would show at once.
    alertsOfB = Array.from({ length: 6 }, (_, i) => makeAlert(i, { merchantId: B, createdAtMs: now - (5 - i) * 60_000 }));
    await worker.alertStore.save([...alertsOfA, ...alertsOfB]);
  });

  afterAll(async () => {
    await worker?.stop();
    await clickhouse?.stop();
  });

  describe('tokens', () => {
    const secret = new TextEncoder().encode(TEST_ADMIN_SECRET);
    const claims = () => ({ merchantId: A, plan: 'business', role: 'admin' });
    const signed = (builder: SignJWT, key = secret, alg = 'HS256') => builder.setProtectedHeader({ alg }).sign(key);

    it('refuses missing, malformed, forged, expired, premature and unsigned tokens with 401', async () => {
      const hour = Math.floor(Date.now() / 1000) + 3600;
      const cases: [string, string | undefined][] = [
        ['no token', undefined],
        ['not a JWT', 'not-a-jwt'],
        ['garbage segments', 'aaa.bbb.ccc'],
        ['another key', await signed(new SignJWT(claims()).setSubject('x').setExpirationTime(hour), new TextEncoder().encode('another-secret-another-secret-123456'))],
        ['expired', await token(A, 'admin', { ttlSeconds: -120 })],
        ['not yet valid', await signed(new SignJWT(claims()).setSubject('x').setExpirationTime(hour).setNotBefore(hour - 60))],
        ['alg none', new UnsecuredJWT(claims()).setSubject('x').setExpirationTime(hour).encode()],
        ['HS512 with the same secret', await signed(new SignJWT(claims()).setSubject('x').setExpirationTime(hour), secret, 'HS512')],
        ['no exp', await signed(new SignJWT(claims()).setSubject('x'))],
        ['no sub', await signed(new SignJWT(claims()).setExpirationTime(hour))],
        ['no merchantId', await signed(new SignJWT({ plan: 'business', role: 'admin' }).setSubject('x').setExpirationTime(hour))],
        ['tampered payload', (await fresh(A, 'viewer')).replace(/^([^.]+)\.([^.]+)\./, (_m, h: string, p: string) => {
          const payload = JSON.parse(Buffer.from(p, 'base64url').toString()) as Record<string, unknown>;
          return `${h}.${Buffer.from(JSON.stringify({ ...payload, role: 'operator' })).toString('base64url')}.`;
        })],
      ];
      for (const [name, bearer] of cases) {
        for (const path of ['/alerts', `/alerts/${alertsOfA[0]!.id}`, '/metrics', '/dashboard']) {
          const response = await call(bearer, path);
          expectFormatA(response, 401, 'UNAUTHORIZED');
          expect(response.headers.get('www-authenticate'), name).toBe('Bearer');
          if (bearer) expect(response.text, name).not.toContain(bearer);
        }
      }
      // Other schemes and a token in the query string are not accepted either; the scheme's case does not matter.
      const good = await fresh(A, 'admin');
      expect((await call(undefined, '/alerts', { headers: { authorization: `bearer ${good}` } })).status).toBe(200);
      expectFormatA(await call(undefined, '/alerts', { headers: { authorization: `Basic ${good}` } }), 401, 'UNAUTHORIZED');
      expectFormatA(await call(undefined, `/alerts?access_token=${good}`), 401, 'UNAUTHORIZED');
    });

    it('lets in tokens of the previous secret while ADMIN_JWT_SECRET is rotated, and still refuses their forgeries', async () => {
      const ofPrevious = await token(A, 'viewer', { userId: `u${tokenCount++}`, secret: PREVIOUS_SECRET });
      const listed = await call(ofPrevious, '/alerts');
      expect(listed.status, listed.text).toBe(200);
      expect(listed.body.data.alerts.map((one: Alert) => one.id).sort()).toEqual(alertsOfA.map((one) => one.id).sort());
      const [header, payload] = ofPrevious.split('.') as [string, string, string];
      const forged = await token(A, 'viewer', { userId: 'forger', secret: 'another-admin-jwt-secret-0123456789abcdef' });
      expectFormatA(await call(`${header}.${payload}.${forged.split('.')[2]}`, '/alerts'), 401, 'UNAUTHORIZED');
      expectFormatA(await call(await token(A, 'viewer', { secret: PREVIOUS_SECRET, ttlSeconds: -60 }), '/alerts'), 401, 'UNAUTHORIZED');
    });

    it('lets in the admins of a merchant whose id is as long as request events may carry, and operators name it', async () => {
      const longest = `m_${'x'.repeat(126)}`; // 128 characters
      const alert = makeAlert(0, { merchantId: longest, createdAtMs: Date.now() - 60_000 });
      await worker.alertStore.save([alert]);
      const listed = await call(await fresh(longest, 'admin'), '/alerts');
      expect(listed.status, listed.text).toBe(200);
      expect(listed.body.data.alerts.map((one: Alert) => one.id)).toEqual([alert.id]);
      const operator = await fresh('ops', 'operator');
      expect((await call(operator, `/alerts?merchantId=${longest}`)).body.data.alerts).toHaveLength(1);
      expectFormatA(await call(operator, `/webhook?merchantId=${longest}`), 404, 'NOT_FOUND'); // none registered
      expect((await call(operator, `/webhook/deliveries?merchantId=${longest}`)).status).toBe(200);
      expectValidation(await call(operator, `/alerts?merchantId=${longest}x`), ['query', 'merchantId']);
    });

    it('refuses a well-signed token whose role is none of ours with 403 FORBIDDEN', async () => {
      const bearer = await signed(new SignJWT({ ...claims(), role: 'root' }).setSubject('x').setExpirationTime('1h'));
      for (const path of ['/alerts', '/metrics', '/dashboard']) expectFormatA(await call(bearer, path), 403, 'FORBIDDEN');
    });

    it('refuses plans that are not entitled with 403 PLAN_UPGRADE_REQUIRED', async () => {
      for (const plan of ['free', 'pro', 'starter', '']) {
        const bearer = plan === '' ? await signed(new SignJWT({ merchantId: A, plan, role: 'admin' }).setSubject('x').setExpirationTime('1h')) : await fresh(A, 'admin', plan);
        const response = await call(bearer, '/alerts');
        if (plan === '') expectFormatA(response, 401, 'UNAUTHORIZED');
        else expectFormatA(response, 403, 'PLAN_UPGRADE_REQUIRED');
      }
      expect((await call(await fresh(A, 'admin', 'enterprise'), '/alerts')).status).toBe(200);
    });
  });

  describe('roles', () => {
    it('lets viewers read and nothing more', async () => {
      const viewer = await fresh(A, 'viewer');
      for (const path of ['/alerts', `/alerts/${alertsOfA[0]!.id}`, '/metrics', '/dashboard']) {
        expect((await call(viewer, path)).status, path).toBe(200);
      }
      const patch = await call(viewer, `/alerts/${alertsOfA[0]!.id}`, { method: 'PATCH', body: { status: 'acknowledged' } });
      expectFormatA(patch, 403, 'FORBIDDEN');
      expect((await worker.alertStore.get(alertsOfA[0]!.id, A))?.status).toBe('open');
      // The role check comes before anything about the alert: an unknown id is 403 too.
      expectFormatA(await call(viewer, `/alerts/${MISSING_ID}`, { method: 'PATCH', body: { status: 'acknowledged' } }), 403, 'FORBIDDEN');
    });

    it('lets admins read and change their own merchant only', async () => {
      const admin = await fresh(A, 'admin');
      const patch = await call(admin, `/alerts/${alertsOfA[1]!.id}`, { method: 'PATCH', body: { status: 'acknowledged' } });
      expect(patch.status).toBe(200);
      for (const path of ['/alerts', '/metrics', '/dashboard', `/alerts/${alertsOfB[0]!.id}`]) {
        const response = await call(admin, `${path}?merchantId=${B}`);
        expectFormatA(response, 403, 'FORBIDDEN');
        expectNothingOfB(response);
      }
      expect((await call(admin, `/alerts?merchantId=${A}`)).status).toBe(200);
    });

    it('lets operators work on any merchant they name, and across all without one', async () => {
      const operator = await fresh(A, 'operator');
      const listB = await call(operator, `/alerts?merchantId=${B}`);
      expect(listB.status).toBe(200);
      expect(new Set(listB.body.data.alerts.map((alert: Alert) => alert.merchantId))).toEqual(new Set([B]));
      const patch = await call(operator, `/alerts/${alertsOfB[2]!.id}?merchantId=${B}`, { method: 'PATCH', body: { status: 'acknowledged', note: 'on-call' } });
      expect(patch.status).toBe(200);
      expect(patch.body.data.history.at(-1).actor).toMatch(/^u\d+$/);
      // Naming the wrong merchant for an id finds nothing.
      expectFormatA(await call(operator, `/alerts/${alertsOfB[2]!.id}?merchantId=${A}`), 404, 'NOT_FOUND');
      const all = await call(operator, '/alerts?limit=200');
      const merchants = new Set(all.body.data.alerts.map((alert: Alert) => alert.merchantId));
      expect(merchants.has(A) && merchants.has(B)).toBe(true);
      expect((await call(operator, `/metrics?merchantId=${B}`)).status).toBe(200);
    });
  });

  describe('tenant isolation', () => {
    it('answers another merchant\'s alert id exactly as an unknown one, for reads and writes', async () => {
      const admin = await fresh(A, 'admin');
      for (const method of ['GET', 'PATCH'] as const) {
        const body = method === 'PATCH' ? { status: 'acknowledged' } : undefined;
        const foreign = await call(admin, `/alerts/${alertsOfB[0]!.id}`, { method, body });
        const unknown = await call(admin, `/alerts/${MISSING_ID}`, { method, body });
        expectFormatA(foreign, 404, 'NOT_FOUND');
        expect(foreign.text).toBe(unknown.text);
        expect([...foreign.headers.keys()].filter((name) => !['date', 'ratelimit-remaining', 'ratelimit-reset'].includes(name))).toEqual(
          [...unknown.headers.keys()].filter((name) => !['date', 'ratelimit-remaining', 'ratelimit-reset'].includes(name)),
        );
        expectNothingOfB(foreign);
      }
      expect((await worker.alertStore.get(alertsOfB[0]!.id, B))?.status).toBe('open');
    });

    it('never returns another merchant\'s alerts through filters, cursors or dashboards', async () => {
      const admin = await fresh(A, 'admin');
      const probes = [
        `/alerts?apiKeyId=${alertsOfB[0]!.apiKeyId}`,
        `/alerts?limit=200`,
        `/alerts?cursor=${encodeCursor({ createdAt: Date.parse(alertsOfB[5]!.createdAt) + 1, id: alertsOfB[5]!.id })}`,
        `/alerts?cursor=${encodeCursor({ createdAt: Date.now() + 3_600_000, id: MISSING_ID })}`,
        '/dashboard?range=7d',
        '/metrics',
      ];
      for (const probe of probes) {
        const response = await call(admin, probe);
        expect(response.status, probe).toBe(200);
        expectNothingOfB(response);
      }
      const keyOfB = await call(admin, `/alerts?apiKeyId=${alertsOfB[0]!.apiKeyId}`);
      expect(keyOfB.body.data.alerts).toEqual([]);
      // A cursor from B's listing pages A's own alerts only.
      const fromB = await call(admin, `/alerts?cursor=${encodeCursor({ createdAt: Date.parse(alertsOfB[5]!.createdAt) + 1, id: alertsOfB[5]!.id })}`);
      expect(fromB.body.data.alerts.map((alert: Alert) => alert.id).sort()).toEqual(alertsOfA.map((alert) => alert.id).sort());
    });
  });

  describe('hostile input', () => {
    it('answers every bad query parameter with 400 naming it, and never a 500', async () => {
      const bearer = await fresh(A, 'admin');
      const cases: [string, (string | number)[]][] = [
        ['limit=0', ['query', 'limit']],
        ['limit=201', ['query', 'limit']],
        ['limit=-1', ['query', 'limit']],
        ['limit=1e2', ['query', 'limit']],
        ['limit=abc', ['query', 'limit']],
        ['limit=', ['query', 'limit']],
        ['limit=1&limit=2', ['query', 'limit']],
        ["status=open'--", ['query', 'status', 0]],
        ['status=open,bogus', ['query', 'status', 1]],
        ['severity=CRITICAL', ['query', 'severity', 0]],
        ['type=velocity_attack%00', ['query', 'type', 0]],
        [`apiKeyId=${'k'.repeat(5000)}`, ['query', 'apiKeyId']],
        ['from=2026-13-45T00:00:00Z', ['query', 'from']],
        // Valid ISO 8601, but outside what a DateTime64 column holds: a 400, not a failed query.
        ['to=9999-12-31T23:59:59-23:59', ['query', 'to']],
        ['from=0000-01-01T00:00:00Z', ['query', 'from']],
        [`cursor=${FAR_FUTURE_CURSOR}`, ['query', 'cursor']],
        ['from=yesterday', ['query', 'from']],
        ['from=2026-11-20T00:00:00Z&to=2026-11-19T00:00:00Z', ['query', 'to']],
        ['cursor=not*a*cursor', ['query', 'cursor']],
        [`cursor=${Buffer.from('{"a":1}').toString('base64url')}`, ['query', 'cursor']],
        [`cursor=${Buffer.from('[1,"1\' OR 1=1"]').toString('base64url')}`, ['query', 'cursor']],
        [`cursor=${'A'.repeat(300)}`, ['query', 'cursor']],
        [`merchantId=${'m'.repeat(129)}`, ['query', 'merchantId']],
        ['unknown=1', ['query', 'unknown']],
        ['__proto__=1', ['query', '__proto__']],
        ['constructor[prototype][x]=1', ['query', 'constructor[prototype][x]']],
      ];
      for (const [query, path] of cases) expectValidation(await call(bearer, `/alerts?${query}`), path);
      expectValidation(await call(bearer, '/dashboard?range=30d'), ['query', 'range']);
      expectValidation(await call(bearer, '/metrics?to=9999-12-31T23:59:59-23:59'), ['query', 'to']);
      expectValidation(await call(bearer, `/webhook/deliveries?cursor=${FAR_FUTURE_CURSOR}`), ['query', 'cursor']);
      expectValidation(await call(bearer, '/metrics?from=2020-01-01T00:00:00Z&to=2026-01-01T00:00:00Z'), ['query', 'from']);
      // One date valid, the other not: the range checks must not read the text as a date.
      expectValidation(await call(bearer, '/metrics?from=2026-11-20T00:00:00Z&to=%E2%80%AE'), ['query', 'to']);
      expectValidation(await call(bearer, '/metrics?from=yesterday&to=2026-11-20T00:00:00Z'), ['query', 'from']);
      expectValidation(await call(bearer, '/alerts?from=2026-11-20T00:00:00Z&to=tomorrow'), ['query', 'to']);
      expectValidation(await call(bearer, '/alerts/%E0%A4%A'), ['url']);
    });

    it('answers hostile values that are well-formed with what they match: nothing', async () => {
      const bearer = await fresh(A, 'admin');
      // Key ids are any text of 1..128 characters, as events carry them; values are bound, never spliced into SQL.
      for (const query of ["apiKeyId=' OR 1=1 --", 'apiKeyId=%F0%9F%92%A3', `apiKeyId=${alertsOfB[0]!.apiKeyId}'--`]) {
        const response = await call(bearer, `/alerts?${query}`);
        expect(response.status, query).toBe(200);
        expect(response.body.data.alerts, query).toEqual([]);
      }
      // An alert id that is not a UUID names no alert: 404, as an unknown one (contracts section 3).
      for (const path of ["/alerts/1'%20OR%20'1'='1", `/alerts/${'9'.repeat(2000)}`, '/alerts/not-an-id']) {
        expectFormatA(await call(bearer, path), 404, 'NOT_FOUND');
        expectFormatA(await call(bearer, path, { method: 'PATCH', body: { status: 'acknowledged' } }), 404, 'NOT_FOUND');
      }
      // A non-operator naming another merchant is refused, whatever the name.
      expectFormatA(await call(bearer, '/alerts?merchantId=../../etc/passwd'), 403, 'FORBIDDEN');
    });

    it('answers bad bodies (too large or not JSON included) with 400 naming the body, and changes nothing', async () => {
      const bearer = await fresh(A, 'admin');
      const target = `/alerts/${alertsOfA[3]!.id}`;
      const patch = (init: Parameters<typeof adminCall>[3]) => call(bearer, target, { method: 'PATCH', ...init });
      expectValidation(await patch({ body: { status: 5 } }), ['body', 'status']);
      expectValidation(await patch({ body: { status: 'acknowledged', note: { $gt: '' } } }), ['body', 'note']);
      expectValidation(await patch({ body: { status: 'acknowledged', note: 'x'.repeat(2001) } }), ['body', 'note']);
      expectValidation(await patch({ body: { status: 'acknowledged', role: 'operator' } }), ['body', 'role']);
      expectValidation(await patch({ body: { status: 'acknowledged', __proto__x: 1 } }), ['body', '__proto__x']);
      expectValidation(await patch({ body: {} }), ['body', 'status']);
      expectValidation(await patch({ body: ['acknowledged'] }), ['body']);
      expectValidation(await patch({ rawBody: '"acknowledged"' }), ['body']);
      expectValidation(await patch({ rawBody: '{"status": "acknowledged",' }), ['body']);
      expect((await patch({ rawBody: '{"__proto__": {"admin": true}, "status": "acknowledged"}' })).status).toBe(400);
      const deep = `${'{"a":'.repeat(2000)}1${'}'.repeat(2000)}`;
      expect((await patch({ rawBody: deep })).status).toBe(400);
      const huge = await patch({ body: { status: 'acknowledged', note: 'x'.repeat(100_000) } });
      expectValidation(huge, ['body']);
      // Not JSON: named as such, JSON sent as text/plain too (never read as a string the schema then refuses).
      for (const rawBody of ['status=acknowledged', '{"status":"acknowledged"}']) {
        const plain = await patch({ rawBody, headers: { 'content-type': 'text/plain' } });
        expectValidation(plain, ['body']);
        expect(plain.body.details).toEqual([{ path: ['body'], message: 'must be sent as application/json' }]);
      }
      const xml = await patch({ rawBody: '<status>acknowledged</status>', headers: { 'content-type': 'application/xml' } });
      expectValidation(xml, ['body']);
      expectValidation(await patch({ rawBody: '{"status":"acknowledged"}', headers: { 'content-type': 'application/x-www-form-urlencoded' } }), ['body']);
      expectValidation(await patch({ body: { status: 'acknowledged', id: MISSING_ID } }), ['body', 'id']);
      expect((await worker.alertStore.get(alertsOfA[3]!.id, A))?.status).toBe('open');
    });
  });

  it('limits each token to its rate with 429 RATE_LIMITED and Retry-After, leaving other tokens alone', async () => {
    const busy = await fresh(A, 'viewer');
    const statuses: number[] = [];
    for (let i = 0; i <= RATE_LIMIT; i++) statuses.push((await call(busy, '/metrics')).status);
    expect(statuses.slice(0, RATE_LIMIT).every((status) => status === 200)).toBe(true);
    const limited = await call(busy, '/alerts');
    expect(limited.status).toBe(429);
    const retryAfter = Number(limited.headers.get('retry-after'));
    expect(retryAfter).toBeGreaterThan(0);
    expect(retryAfter).toBeLessThanOrEqual(60);
    // Spec 7.3: retryAfterSeconds (number) in the body, here also in Format A's details.
    expect(limited.body).toEqual({
      success: false,
      error: { code: 'RATE_LIMITED', message: expect.any(String), details: { retryAfterSeconds: retryAfter } },
      retryAfterSeconds: retryAfter,
    });
    expect(limited.headers.get('ratelimit-limit')).toBe(String(RATE_LIMIT));
    expect(limited.headers.get('ratelimit-remaining')).toBe('0');
    expect((await call(await fresh(A, 'viewer'), '/alerts')).status).toBe(200);
  });

  it('limits a user, not a spelling of its token: the signature\'s spare bits and padding give no fresh bucket, nor does a second token', async () => {
    const busy = await fresh(A, 'viewer');
    for (let i = 0; i < RATE_LIMIT; i++) expect((await call(busy, '/metrics')).status).toBe(200);
    expect((await call(busy, '/metrics')).status).toBe(429);
    // HS256's 32 bytes leave 2 unused bits in the last base64url character; jose also takes padding.
    const [header, payload, signature] = busy.split('.') as [string, string, string];
    const alphabet = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_';
    const last = alphabet.indexOf(signature.at(-1)!);
    const spellings = [0, 1, 2, 3].flatMap((low) => {
      const spelled = signature.slice(0, -1) + alphabet[(last & ~3) | low];
      return [spelled, `${spelled}=`];
    });
    const statuses: number[] = [];
    for (const spelled of spellings.filter((s) => s !== signature)) statuses.push((await call(`${header}.${payload}.${spelled}`, '/metrics')).status);
    expect(statuses).toEqual(Array(7).fill(429));
    const sameUser = await token(A, 'viewer', { userId: JSON.parse(Buffer.from(payload, 'base64url').toString()).sub as string, ttlSeconds: 1800 });
    expect(sameUser).not.toBe(busy);
    expect((await call(sameUser, '/metrics')).status).toBe(429);
  });

  it('counts requests whose body cannot be read, and refuses them over the limit before reading it', async () => {
    const busy = await fresh(A, 'operator');
    const target = `/alerts/${alertsOfA[0]!.id}`;
    const statuses: number[] = [];
    for (let i = 0; i < RATE_LIMIT; i++) statuses.push((await call(busy, target, { method: 'PATCH', rawBody: '{"status": ' })).status);
    expect(new Set(statuses)).toEqual(new Set([400]));
    // Over the limit, a body too large to read gets 429, not the 400 reading it would give.
    const limited = await call(busy, target, { method: 'PATCH', rawBody: `{"note":"${'x'.repeat(100_000)}"}` });
    expect(limited.status).toBe(429);
    expect(limited.body).toMatchObject({ error: { code: 'RATE_LIMITED' } });
  });
});
