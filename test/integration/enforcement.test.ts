/**
 * Enforcement decisions end to end, on the real ClickHouse engine: an attack posted over HTTP opens
 * an alert, the alert becomes a decision that any replica serves to the fleet, and the decision ends
 * when an admin dismisses the alert or the key is allowlisted (the file reloaded without a restart).
 * Shadow mode records the same decisions without offering them for applying; off serves nothing.
 * Admins see their own keys' decisions in the admin API, whatever the mode, and their history:
 * replicas' identical records of one decision collapse into one entry, with when it started and ended.
 */
import { randomUUID } from 'node:crypto';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { ConfigError } from '../../src/config.ts';
import { createLogger } from '../../src/logger.ts';
import { connectClickHouse } from '../../src/store/clickhouse.ts';
import { EnforcementHistoryStore, EXPIRY_RECORD_STEP_MS, type DecisionHistoryEntry, type DecisionRecord } from '../../src/store/enforcement-history-store.ts';
import { migrate } from '../../src/store/migrate.ts';
import { tablesIn } from '../../src/store/tables.ts';
import { ADMIN_ENV, adminCall, token } from '../support/admin.ts';
import { useEngines } from '../support/engines.ts';
import { TEST_INGEST_TOKEN, testConfig, testNames, waitFor } from '../support/worker.ts';

const MERCHANT = 'm_enforce';

/** One request of an attack tool: a critical bot_traffic alert at once. */
async function postAttack(url: string, apiKeyId: string, status = 404): Promise<void> {
  const event = { eventId: `evt_${randomUUID()}`, timestamp: new Date().toISOString(), merchantId: MERCHANT, plan: 'business', apiKeyId, environment: 'live', ip: '198.51.100.23', userAgent: 'sqlmap/1.7.2#stable (https://sqlmap.org)', method: 'GET', path: '/v1/verify/sessions/:id', status, responseTimeMs: 12, country: 'DE' };
  const response = await fetch(`${url}/v1/ingest/events`, { method: 'POST', headers: { authorization: `Bearer ${TEST_INGEST_TOKEN}`, 'content-type': 'application/json' }, body: JSON.stringify([event]) });
  expect(response.status).toBe(202);
}

async function readDecisions(url: string, query = '', bearer = TEST_INGEST_TOKEN) {
  const response = await fetch(`${url}/v1/enforcement/decisions${query}`, { headers: bearer ? { authorization: `Bearer ${bearer}` } : {} });
  // eslint-disable-next-line @typescript-eslint/no-explicit-any -- shapes are asserted below
  return { status: response.status, headers: response.headers, body: (await response.json()) as any };
}

describe('enforcement decisions', () => {
  const engines = useEngines();

  it('serves a block for a critical attack from every replica, and ends it when the key is allowlisted or the alert dismissed', async () => {
    const names = testNames('enforce');
    const blocked = `pk_live_${names.runId}_a`;
    const dismissed = `pk_live_${names.runId}_b`;
    const configFile = join(mkdtempSync(join(tmpdir(), 'enforce-')), 'detection.json');
    writeFileSync(configFile, JSON.stringify({ merchants: { [MERCHANT]: { allowlist: { ips: ['192.0.2.0/24'] } } } }));
    const extra = { ...ADMIN_ENV, ENFORCEMENT_MODE: 'enforce', ENFORCEMENT_BLOCK_MIN_RISK: '0.9', DETECTION_CONFIG_FILE: configFile };
    const detecting = await engines.startWorker(testConfig({ clickhouse: engines.clickhouse, names, extra }));
    // A second replica on the same storage, which detects none of these events.
    const other = await engines.startWorker(testConfig({ clickhouse: engines.clickhouse, names, extra }));
    try {
      // A stranger who knows a key's id only: every request of the tool is answered 401.
      const refused = `pk_live_${names.runId}_c`;
      await postAttack(detecting.url, refused, 401);
      await postAttack(detecting.url, blocked);
      await postAttack(detecting.url, dismissed);
      const decisionsOf = async (url: string) => ((await readDecisions(url)).body.data?.decisions ?? []) as { apiKeyId: string }[];
      const ours = (decisions: { apiKeyId: string }[]) => decisions.filter((decision) => decision.apiKeyId.includes(names.runId));
      await waitFor(async () => ours(await decisionsOf(other.url)).length === 2, 'the other replica serves both decisions', 30_000);
      // The stranger's alert is there, critical, and recommends looking into it, not acting on the key.
      const [strangers] = (await detecting.alertStore.loadForDedup(new Date(0))).filter((stored) => stored.apiKeyId === refused);
      expect(strangers).toMatchObject({ type: 'bot_traffic', severity: 'critical', recommendedAction: 'investigate' });
      expect(ours(await decisionsOf(other.url)).map((decision) => decision.apiKeyId).sort()).toEqual([blocked, dismissed].sort());

      const [alert] = (await detecting.alertStore.loadForDedup(new Date(0))).filter((stored) => stored.apiKeyId === blocked);
      const answer = await readDecisions(other.url, `?apiKeyId=${blocked}`);
      expect(answer.status).toBe(200);
      expect(answer.headers.get('cache-control')).toBe('no-store');
      expect(answer.body.data).toMatchObject({ mode: 'enforce' });
      expect(answer.body.data).not.toHaveProperty('shadowDecisions');
      expect(Date.parse(answer.body.data.staleAfter)).toBeGreaterThan(Date.parse(answer.body.data.generatedAt));
      expect(answer.body.data.decisions).toEqual([
        {
          apiKeyId: blocked,
          merchantId: MERCHANT,
          action: 'block',
          reason: `bot_traffic alert, critical, risk ${alert!.riskScore}: ${alert!.title}`,
          alertId: alert!.id,
          expiresAt: new Date(Date.parse(alert!.lastSeenAt) + 60 * 60_000).toISOString(),
          exemptIps: ['192.0.2.0/24'],
        },
      ]);

      // The merchant's admins (any role) see it, without the allowlisted addresses; other merchants do not.
      const adminView = await adminCall(other.url, await token(MERCHANT, 'viewer'), '/enforcement');
      expect(adminView.status).toBe(200);
      expect(adminView.body.data).toMatchObject({ mode: 'enforce', applied: true });
      const { exemptIps: _exemptIps, ...withoutExempt } = answer.body.data.decisions[0];
      expect(ours(adminView.body.data.decisions)).toEqual(expect.arrayContaining([withoutExempt]));
      expect(ours(adminView.body.data.decisions)).toHaveLength(2);
      expect((await adminCall(other.url, await token('m_someone_else', 'admin'), '/enforcement')).body.data.decisions).toEqual([]);
      const operatorView = await adminCall(other.url, await token('m_ops', 'operator'), `/enforcement?merchantId=${MERCHANT}&apiKeyId=${blocked}`);
      expect(operatorView.body.data.decisions).toEqual([withoutExempt]);
      expect((await adminCall(other.url, await token(MERCHANT, 'admin'), `/enforcement?merchantId=m_someone_else`)).status).toBe(403);

      // The key allowlisted: no decision, without a restart.
      writeFileSync(configFile, JSON.stringify({ merchants: { [MERCHANT]: { allowlist: { keys: [blocked], ips: ['192.0.2.0/24'] } } } }));
      await waitFor(async () => ours(await decisionsOf(other.url)).every((decision) => decision.apiKeyId !== blocked), 'the allowlisted key is let through', 30_000);

      // The other alert dismissed by an admin (on the replica that did not detect it): its decision ends.
      const [toDismiss] = (await detecting.alertStore.loadForDedup(new Date(0))).filter((stored) => stored.apiKeyId === dismissed);
      const patch = await adminCall(other.url, await token(MERCHANT, 'admin'), `/alerts/${toDismiss!.id}`, { method: 'PATCH', body: { status: 'dismissed', note: 'our own scanner' } });
      expect(patch.status).toBe(200);
      await waitFor(async () => ours(await decisionsOf(detecting.url)).length === 0, 'the dismissed alert enforces nothing', 30_000);

      // The history: both decisions, each one entry although both replicas recorded it, both ended.
      const historyOf = async (url: string) => {
        const view = await adminCall(url, await token(MERCHANT, 'viewer'), '/enforcement/history');
        expect(view.status).toBe(200);
        return ours(view.body.data.entries) as { apiKeyId: string; endedAt: string | null }[];
      };
      await waitFor(async () => ours(await decisionsOf(other.url)).length === 0, 'neither replica enforces them', 30_000);
      await waitFor(async () => (await historyOf(other.url)).every((entry) => entry.endedAt !== null), 'the ends are recorded', 30_000);
      // Each replica writes its own sight of the end just after it reads it: both views agree once both landed.
      await waitFor(async () => JSON.stringify(await historyOf(other.url)) === JSON.stringify(await historyOf(detecting.url)), 'both replicas show the same history', 30_000);
      const history = await historyOf(other.url);
      expect(history.map((entry) => entry.apiKeyId).sort()).toEqual([blocked, dismissed]);
      expect(history.find((entry) => entry.apiKeyId === blocked)).toMatchObject({ alertId: alert!.id, action: 'block', mode: 'enforce', reason: answer.body.data.decisions[0].reason, active: false });
      for (const entry of history as unknown as { startedAt: string; endedAt: string }[]) {
        expect(Date.parse(entry.startedAt)).toBeLessThanOrEqual(Date.parse(entry.endedAt));
      }
      expect((await adminCall(other.url, await token('m_someone_else', 'admin'), '/enforcement/history')).body.data.entries).toEqual([]);
      const badRange = await adminCall(other.url, await token(MERCHANT, 'viewer'), '/enforcement/history?from=yesterday');
      expect(badRange.status).toBe(400);
      expect(badRange.body.details).toEqual([{ path: ['query', 'from'], message: expect.stringContaining('ISO 8601') }]);
      // A from given alone is checked against to's default, now.
      const fromTomorrow = await adminCall(other.url, await token(MERCHANT, 'viewer'), `/enforcement/history?from=${new Date(Date.now() + 86_400_000).toISOString()}`);
      expect(fromTomorrow.status).toBe(400);
      expect(fromTomorrow.body.details).toEqual([{ path: ['query', 'from'], message: 'must not be after to (default: now)' }]);
      // Pages of one, each from the last one's nextCursor: the same entries, in the same order, each once.
      const whole = (await adminCall(other.url, await token(MERCHANT, 'viewer'), '/enforcement/history')).body.data.entries;
      const paged: unknown[] = [];
      let cursor: string | null = null;
      do {
        const page = await adminCall(other.url, await token(MERCHANT, 'viewer'), `/enforcement/history?limit=1${cursor ? `&cursor=${cursor}` : ''}`);
        expect(page.status).toBe(200);
        paged.push(...page.body.data.entries);
        cursor = page.body.data.nextCursor;
      } while (cursor !== null && paged.length <= whole.length);
      expect(paged).toEqual(whole);
      expect(whole.length).toBeGreaterThanOrEqual(2);
      const badCursor = await adminCall(other.url, await token(MERCHANT, 'viewer'), '/enforcement/history?cursor=bm90LWEtY3Vyc29y');
      expect(badCursor.status).toBe(400);
      expect(badCursor.body.details).toEqual([{ path: ['query', 'cursor'], message: 'not a cursor from this API' }]);

      // The fleet's token only; a bad query is a 400 naming the field.
      expect((await readDecisions(other.url, '', '')).status).toBe(401);
      expect((await readDecisions(other.url, '', 'not-the-ingest-token-at-all')).status).toBe(401);
      const bad = await readDecisions(other.url, '?apiKey=x');
      expect(bad.status).toBe(400);
      expect(bad.body.details).toEqual([{ path: ['query', 'apiKey'], message: 'unknown field' }]);
    } finally {
      await Promise.all([detecting.stop(), other.stop()]);
    }
  });

  it('does not start with a detection config file it cannot use: without its allowlists, allowlisted keys would be enforced', () => {
    const names = testNames('enforce_badfile');
    const dir = mkdtempSync(join(tmpdir(), 'enforce-'));
    const invalid = join(dir, 'invalid.json');
    writeFileSync(invalid, JSON.stringify({ allowlist: { keys: ['pk_live_monitoring'] }, plans: { business: { rules: { velocity_attack: {} } } }, rule: {} }));
    for (const [file, problem] of [
      [join(dir, 'missing.json'), /DETECTION_CONFIG_FILE: cannot read .*missing\.json \(ENOENT\)/],
      [invalid, /DETECTION_CONFIG_FILE: .*invalid\.json: invalid detection config: .*rule/],
    ] as const) {
      // Refused with every other invalid setting, before any part starts (config.ts).
      const configure = () => testConfig({ clickhouse: engines.clickhouse, names, extra: { ENFORCEMENT_MODE: 'enforce', DETECTION_CONFIG_FILE: file } });
      expect(configure).toThrow(ConfigError);
      expect(configure).toThrow(problem);
    }
  });

  it('in shadow mode offers nothing to apply and shows what enforcing would; off, serves nothing', async () => {
    const names = testNames('shadow');
    const apiKeyId = `pk_live_${names.runId}`;
    const shadow = await engines.startWorker(testConfig({ clickhouse: engines.clickhouse, names, extra: { ...ADMIN_ENV, ENFORCEMENT_MODE: 'shadow' } }));
    const off = await engines.startWorker(testConfig({ clickhouse: engines.clickhouse, names, extra: ADMIN_ENV }));
    // Detection off does not turn enforcement off (ENFORCEMENT_MODE does): it serves the stored alerts' decisions, and says so.
    const warnings: string[] = [];
    // With KAFKA_BROKERS set, as an operator who turned detection off may leave it: nothing is consumed, and it says so.
    const notDetecting = await engines.startWorker(testConfig({ brokers: engines.brokers, clickhouse: engines.clickhouse, names, extra: { ENFORCEMENT_MODE: 'shadow', FEATURE_ANOMALY_DETECTION: 'false' } }), {
      logger: createLogger('warn', { write: (line: string) => warnings.push(JSON.parse(line).msg) }),
    });
    try {
      await postAttack(shadow.url, apiKeyId);
      const shadowOf = async () => ((await readDecisions(shadow.url, `?apiKeyId=${apiKeyId}`)).body.data?.shadowDecisions ?? []) as { action: string }[];
      await waitFor(async () => (await shadowOf()).length === 1, 'the shadow decision is shown', 30_000);
      const answer = await readDecisions(shadow.url);
      expect(answer.body.data).toMatchObject({ mode: 'shadow', decisions: [] });
      // The default block threshold, 0.95: a critical alert under it is throttled.
      const [alert] = (await shadow.alertStore.loadForDedup(new Date(0))).filter((stored) => stored.apiKeyId === apiKeyId);
      expect(alert).toMatchObject({ severity: 'critical', recommendedAction: 'block' });
      expect((await shadowOf())[0]!.action).toBe(alert!.riskScore >= 0.95 ? 'block' : 'throttle');
      expect((await readDecisions(off.url)).status).toBe(404);
      await waitFor(async () => ((await readDecisions(notDetecting.url, `?apiKeyId=${apiKeyId}`)).body.data?.shadowDecisions ?? []).length === 1, 'a replica without detection serves the decision', 30_000);
      expect(warnings).toContainEqual(expect.stringMatching(/FEATURE_ANOMALY_DETECTION is off, but enforcement serves the decisions of the alerts stored; set ENFORCEMENT_MODE=off/));
      expect(warnings).toContainEqual(expect.stringMatching(/^KAFKA_BROKERS is set but FEATURE_ANOMALY_DETECTION is off: nothing is consumed from Kafka/));

      // Admins see the shadow decision as not applied; with enforcement off, the mode and nothing else.
      const shadowView = await adminCall(shadow.url, await token(MERCHANT, 'viewer'), `/enforcement?apiKeyId=${apiKeyId}`);
      expect(shadowView.body.data).toMatchObject({ mode: 'shadow', applied: false, decisions: [{ apiKeyId, alertId: alert!.id, action: (await shadowOf())[0]!.action }] });
      const offView = await adminCall(off.url, await token(MERCHANT, 'viewer'), '/enforcement');
      expect(offView.status).toBe(200);
      expect(offView.body.data).toEqual({ mode: 'off', applied: false, generatedAt: null, decisions: [] });

      // The history holds the shadow decision, in force: whether it is active now is known where enforcement runs.
      const historyAt = async (url: string) => (await adminCall(url, await token(MERCHANT, 'viewer'), `/enforcement/history?apiKeyId=${apiKeyId}`)).body.data.entries;
      await waitFor(async () => (await historyAt(shadow.url)).length === 1, 'the shadow decision is in the history', 30_000);
      expect(await historyAt(shadow.url)).toEqual([expect.objectContaining({ apiKeyId, alertId: alert!.id, mode: 'shadow', endedAt: null, active: true })]);
      expect(await historyAt(off.url)).toEqual([expect.objectContaining({ apiKeyId, mode: 'shadow', endedAt: null, active: null })]);
    } finally {
      await Promise.all([shadow.stop(), off.stop(), notDetecting.stop()]);
    }
  });

  it('keeps one history entry per decision: the earliest start, and an end only if none came after it', async () => {
    const service = engines.clickhouse;
    const db = connectClickHouse({ url: service.url, username: service.username, password: service.password, dataDir: service.dataDir });
    const tables = tablesIn(`${service.database}`);
    try {
      await migrate(db, { tables, eventsTtlDays: 30 }, createLogger('silent'));
      const store = new EnforcementHistoryStore(db, tables);
      const merchantId = `m_history_${randomUUID().slice(0, 8)}`;
      const T = Date.UTC(2026, 10, 20, 12, 0, 0);
      const MINUTE = 60_000;
      const record = (apiKeyId: string, alertId: string, startedAt: number, endedAt: number | null): DecisionRecord => ({
        merchantId, apiKeyId, alertId, action: 'throttle', mode: 'shadow', reason: `reason of ${apiKeyId}`, startedAt, endedAt, expiresAt: new Date(startedAt + 30 * MINUTE).toISOString(),
      });
      const [a, b, c] = [randomUUID(), randomUUID(), randomUUID()];
      // Two replicas saw pk_a start (2 s apart) and end; pk_b ended, then started again; pk_c ended long before the range.
      await store.record([record('pk_a', a, T, null), record('pk_b', b, T, null), record('pk_c', c, T - 600 * MINUTE, null)]);
      await store.record([record('pk_a', a, T + 2_000, null), record('pk_c', c, T - 600 * MINUTE, T - 500 * MINUTE)]);
      await store.record([record('pk_a', a, T, T + 10 * MINUTE), record('pk_a', a, T + 2_000, T + 10 * MINUTE + 1_500), record('pk_b', b, T, T + 5 * MINUTE)]);
      await store.record([record('pk_b', b, T + 20 * MINUTE, null)]);

      // The clock: pk_b's expiry (T + 50 min) is ahead, so its last start, with no end recorded, is in force.
      const range = { from: new Date(T - 60 * MINUTE), to: new Date(T + 60 * MINUTE), merchantId, limit: 50, now: T + 30 * MINUTE };
      const entries = await store.list(range);
      expect(entries.map(({ apiKeyId, startedAt, endedAt, expiresAt }) => ({ apiKeyId, startedAt, endedAt, expiresAt }))).toEqual([
        { apiKeyId: 'pk_a', startedAt: new Date(T).toISOString(), endedAt: new Date(T + 10 * MINUTE + 1_500).toISOString(), expiresAt: new Date(T + 2_000 + 30 * MINUTE).toISOString() },
        { apiKeyId: 'pk_b', startedAt: new Date(T).toISOString(), endedAt: null, expiresAt: new Date(T + 50 * MINUTE).toISOString() },
      ]);
      expect(entries[0]).toMatchObject({ merchantId, alertId: a, action: 'throttle', mode: 'shadow', reason: 'reason of pk_a' });
      // pk_a's end is before this range; pk_b is still in force; nothing starts after `to`.
      expect((await store.list({ ...range, from: new Date(T + 15 * MINUTE) })).map((entry) => entry.apiKeyId)).toEqual(['pk_b']);
      expect(await store.list({ ...range, to: new Date(T - 1), from: new Date(T - 60 * MINUTE) })).toEqual([]);
      expect((await store.list({ ...range, apiKeyId: 'pk_a' })).map((entry) => entry.apiKeyId)).toEqual(['pk_a']);
      expect(await store.list({ ...range, merchantId: 'm_nobody' })).toEqual([]);
      // No replica ran when pk_b's expiry came: no end was recorded. Up to a step past its expiry it may
      // still be in force (a replica records a moved expiry once it has moved a step); after that it
      // lapsed at its expiry, and a range after that does not list it.
      const pkB = async (now: number, from = range.from) => (await store.list({ ...range, from, now })).find((entry) => entry.apiKeyId === 'pk_b');
      expect((await pkB(T + 50 * MINUTE + EXPIRY_RECORD_STEP_MS - 1))?.endedAt).toBeNull();
      expect((await pkB(T + 50 * MINUTE + EXPIRY_RECORD_STEP_MS + 1))?.endedAt).toBe(new Date(T + 50 * MINUTE).toISOString());
      expect(await pkB(T + 600 * MINUTE, new Date(T + 51 * MINUTE))).toBeUndefined();
      expect(await pkB(T + 600 * MINUTE, new Date(T + 50 * MINUTE))).toBeDefined();
      expect(await store.list({ ...range, limit: 1 })).toHaveLength(1);
      // After an entry: the next in the list's order, on a tie of start times (pk_a, pk_b) and across them (pk_c).
      const position = (entry: DecisionHistoryEntry) => ({ ...entry, startedAt: Date.parse(entry.startedAt) });
      const wider = { ...range, from: new Date(T - 700 * MINUTE) };
      const all = await store.list(wider);
      expect(all.map((entry) => entry.apiKeyId)).toEqual(['pk_a', 'pk_b', 'pk_c']);
      expect((await store.list({ ...wider, after: position(all[0]!) })).map((entry) => entry.apiKeyId)).toEqual(['pk_b', 'pk_c']);
      expect((await store.list({ ...wider, after: position(all[1]!) })).map((entry) => entry.apiKeyId)).toEqual(['pk_c']);
      expect(await store.list({ ...wider, after: position(all[2]!) })).toEqual([]);
      // pk_d's alert escalated with the action kept, and the new reason's record (its expiry moved with the
      // evidence) reached storage before a replica's late write of the first: the history shows the new one.
      const d = randomUUID();
      const escalated = { ...record('pk_d', d, T, null), reason: 'now critical', expiresAt: new Date(T + 40 * MINUTE).toISOString() };
      await store.record([escalated]);
      await store.record([{ ...record('pk_d', d, T, null), reason: 'was high' }]);
      expect(await store.list({ ...range, apiKeyId: 'pk_d' })).toEqual([expect.objectContaining({ reason: 'now critical', expiresAt: new Date(T + 40 * MINUTE).toISOString() })]);
      // Its end, recorded with the latest reason, keeps it, and so do merges (which keep one row of the key).
      await store.record([{ ...escalated, endedAt: T + 45 * MINUTE }]);
      expect(await store.list({ ...range, apiKeyId: 'pk_d' })).toEqual([expect.objectContaining({ reason: 'now critical', endedAt: new Date(T + 45 * MINUTE).toISOString() })]);
      await store.record([{ ...record('pk_d', d, T, null), reason: 'was high' }]);
      await db.command(`OPTIMIZE TABLE ${tables.enforcementHistory} FINAL`);
      expect(await store.list({ ...range, apiKeyId: 'pk_d' })).toEqual([expect.objectContaining({ reason: 'now critical', endedAt: new Date(T + 45 * MINUTE).toISOString() })]);
    } finally {
      await db.close();
    }
  });
});
