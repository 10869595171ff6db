/**
 * Alerts shared by replicas, on the real ClickHouse engine: an admin's change made through one
 * replica is not written back over by the replica that owns the alert's key, silences the key there,
 * and survives a racing write; a key's new owner continues the alert its previous owner created;
 * a status change is decided on the latest status, wherever it was set, not on a replica's stale copy.
 * None of this depends on the replicas' clocks agreeing. Of two conflicting changes made through two
 * replicas from the same copy, one is made and the other refused. The background reads
 * (changedSince, enforceable) see each alert's latest version only.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RULES } from '../../rules/index.ts';
import { AlertManager } from '../../src/alerts/alert-manager.ts';
import { AlertService } from '../../src/alerts/alert-service.ts';
import { finding } from '../../src/alerts/test-findings.ts';
import type { Alert } from '../../src/alerts/alert.ts';
import type { Severity } from '../../src/detect/types.ts';
import { createLogger } from '../../src/logger.ts';
import { WorkerMetrics } from '../../src/metrics.ts';
import { AlertStore } from '../../src/store/alert-store.ts';
import type { ClickHouse } from '../../src/store/clickhouse.ts';
import type { Tables } from '../../src/store/tables.ts';
import { makeAlert } from '../support/admin.ts';
import { useMigratedClickHouse } from '../support/engines.ts';
import { waitFor } from '../support/worker.ts';

/** Resolves the n callers' waits once all n wait; later callers pass at once. */
function barrier(n: number): () => Promise<void> {
  let arrived = 0;
  let open: () => void = () => undefined;
  const opened = new Promise<void>((resolve) => (open = resolve));
  return () => {
    if (++arrived >= n) open();
    return opened;
  };
}

describe('alerts shared by replicas', () => {
  const clickhouse = useMigratedClickHouse();
  let db: ClickHouse;
  let store: AlertStore;
  let tables: Tables;
  const replicas: AlertService[] = [];

  beforeAll(() => {
    ({ db, tables } = clickhouse);
    store = new AlertStore(db, tables);
  });

  // Registered after the ClickHouse's own: runs first, while storage is open.
  afterAll(async () => {
    for (const replica of replicas) await replica.stop();
  });

  async function replica(): Promise<AlertService> {
    const alerts = new AlertService(new AlertManager({ suppressionMs: 3_600_000 }), store, RULES, new WorkerMetrics({ defaultMetrics: false }), createLogger('silent'));
    await alerts.start();
    replicas.push(alerts);
    return alerts;
  }

  /** A replica with its own store (its own versions) and a clock skewMs away from the real one. */
  async function replicaWithClock(skewMs: number, own: (now: () => number) => AlertStore = (now) => new AlertStore(db, tables, now)): Promise<AlertService> {
    const now = () => Date.now() + skewMs;
    const alerts = new AlertService(new AlertManager({ suppressionMs: 3_600_000, now }), own(now), RULES, new WorkerMetrics({ defaultMetrics: false }), createLogger('silent'), { now });
    await alerts.start();
    replicas.push(alerts);
    return alerts;
  }

  function detect(alerts: AlertService, scope: string, severity: Severity = 'high'): void {
    alerts.handle({ findings: [{ merchantId: 'm_1', ruleId: 'velocity_attack', finding: finding(severity, Date.now(), scope) }], ruleErrors: [] });
  }

  async function storedFor(scope: string) {
    const alerts = (await store.list({ merchantId: 'm_1' })).filter((alert) => alert.scope === scope);
    expect(alerts).toHaveLength(1); // one alert per key, never a second one
    return alerts[0]!;
  }

  it('keeps a dismissal made through another replica, and the owner goes quiet on the key', async () => {
    const owner = await replica();
    const other = await replica();
    detect(owner, 'pk_dismissed');
    await owner.flush();
    const created = await storedFor('pk_dismissed');

    const change = await other.changeStatus(created.id, 'm_1', { to: 'dismissed', actor: 'admin@m_1', note: 'our load test' });
    expect(change?.ok).toBe(true);
    // The owner has not heard of the dismissal: it counts a repeat and writes its copy.
    detect(owner, 'pk_dismissed');
    await owner.flush();
    expect(await storedFor('pk_dismissed')).toMatchObject({ id: created.id, status: 'dismissed', occurrences: 2 });
    // Its write merged the dismissal in: the next finding on the key is suppressed.
    detect(owner, 'pk_dismissed');
    await owner.flush();
    expect(await storedFor('pk_dismissed')).toMatchObject({ status: 'dismissed', occurrences: 2 });
  });

  it('writes a status change again when a racing write from another replica dropped it', async () => {
    const owner = await replica();
    const other = await replica();
    detect(owner, 'pk_raced');
    await owner.flush();
    const created = await storedFor('pk_raced');
    await other.changeStatus(created.id, 'm_1', { to: 'acknowledged', actor: 'admin@m_1' });
    // The owner's copy, read just before the change and written just after it.
    await store.save([{ ...created, occurrences: 9, updatedAt: new Date().toISOString() }]);
    expect(await storedFor('pk_raced')).toMatchObject({ status: 'open', occurrences: 9 });
    await waitFor(async () => (await storedFor('pk_raced')).status === 'acknowledged', 'the change is written again', 10_000);
    expect(await storedFor('pk_raced')).toMatchObject({ status: 'acknowledged', occurrences: 9 });
  });

  /**
   * The key's owner has a stale copy of the alert (it has not synced since a change made through
   * another replica), made newer than the stored one by a repeat; then an admin's change reaches it.
   */
  async function staleOwner(scope: string, elsewhere: (id: string, other: AlertService, owner: AlertService) => Promise<void>) {
    const owner = await replica();
    const other = await replica();
    detect(owner, scope);
    await owner.flush();
    const { id } = await storedFor(scope);
    await elsewhere(id, other, owner);
    await sleep(5); // the repeat and the change below come strictly later
    detect(owner, scope);
    return { owner, id };
  }

  it('refuses a move from the owner\'s stale status: acknowledged, then resolved elsewhere, is not dismissed', async () => {
    const { owner, id } = await staleOwner('pk_stale_resolved', async (alertId, other, owner) => {
      expect((await other.changeStatus(alertId, 'm_1', { to: 'acknowledged', actor: 'admin@m_1' }))?.ok).toBe(true);
      await owner.syncWithStore(); // the owner learns acknowledged, not what follows
      expect((await other.changeStatus(alertId, 'm_1', { to: 'resolved', actor: 'admin@m_1' }))?.ok).toBe(true);
    });
    expect(await owner.changeStatus(id, 'm_1', { to: 'dismissed', actor: 'admin@m_1', note: 'load test' })).toEqual({ ok: false, reason: 'not_allowed' });
    expect(await storedFor('pk_stale_resolved')).toMatchObject({ status: 'resolved' });
  });

  it('accepts a move from the latest status that the owner\'s stale copy would refuse', async () => {
    const { owner, id } = await staleOwner('pk_stale_acknowledged', async (alertId, other) => {
      expect((await other.changeStatus(alertId, 'm_1', { to: 'acknowledged', actor: 'admin@m_1' }))?.ok).toBe(true);
    });
    expect(await owner.changeStatus(id, 'm_1', { to: 'resolved', actor: 'admin@m_1' })).toMatchObject({ ok: true, alert: { status: 'resolved' } });
    const stored = await storedFor('pk_stale_acknowledged');
    expect(stored.status).toBe('resolved');
    expect(stored.history.map((entry) => `${entry.from}->${entry.to}`)).toEqual(['null->open', 'open->acknowledged', 'acknowledged->resolved']);
  });

  it('does not acknowledge an alert dismissed elsewhere', async () => {
    const { owner, id } = await staleOwner('pk_stale_dismissed', async (alertId, other) => {
      expect((await other.changeStatus(alertId, 'm_1', { to: 'dismissed', actor: 'admin@m_1', note: 'load test' }))?.ok).toBe(true);
    });
    expect(await owner.changeStatus(id, 'm_1', { to: 'acknowledged', actor: 'admin@m_1' })).toEqual({ ok: false, reason: 'not_allowed' });
    expect(await storedFor('pk_stale_dismissed')).toMatchObject({ status: 'dismissed' });
  });

  it('keeps an admin\'s change made through a replica whose clock is behind the key owner\'s, while the owner goes on writing', async () => {
    const owner = await replicaWithClock(5_000);
    const other = await replicaWithClock(0);
    detect(owner, 'pk_skew_dismissed');
    await owner.flush();
    const created = await storedFor('pk_skew_dismissed');

    expect((await other.changeStatus(created.id, 'm_1', { to: 'dismissed', actor: 'admin@m_1', note: 'our load test' }))?.ok).toBe(true);
    // Stored as answered, though the owner's copy was written with its clock 5 s ahead.
    expect(await storedFor('pk_skew_dismissed')).toMatchObject({ status: 'dismissed' });
    // The owner, not knowing of it, writes a repeat: its write is made from the dismissed copy.
    await sleep(5);
    detect(owner, 'pk_skew_dismissed');
    await owner.flush();
    const stored = await storedFor('pk_skew_dismissed');
    expect(stored).toMatchObject({ status: 'dismissed', occurrences: 2 });
    expect(stored.history.map((entry) => `${entry.from}->${entry.to}`)).toEqual(['null->open', 'open->dismissed']);
  });

  it('orders a change made through a replica whose clock is behind after the change it was made on', async () => {
    const owner = await replicaWithClock(0);
    const ahead = await replicaWithClock(5_000);
    const onTime = await replicaWithClock(0);
    detect(owner, 'pk_skew_resolved');
    await owner.flush();
    const { id } = await storedFor('pk_skew_resolved');

    expect((await ahead.changeStatus(id, 'm_1', { to: 'acknowledged', actor: 'alice' }))?.ok).toBe(true);
    expect((await onTime.changeStatus(id, 'm_1', { to: 'resolved', actor: 'bob' }))?.ok).toBe(true);
    // The owner has heard of neither: it writes a repeat, merging the stored history into its copy.
    await sleep(5);
    detect(owner, 'pk_skew_resolved');
    await owner.flush();
    const stored = await storedFor('pk_skew_resolved');
    expect(stored.status).toBe('resolved');
    expect(stored.history.map((entry) => `${entry.actor}:${entry.to}`)).toEqual(['system:open', 'alice:acknowledged', 'bob:resolved']);
    expect(stored.history[2]!.at > stored.history[1]!.at).toBe(true);
    // A resolved alert cannot be dismissed, through any replica.
    expect(await owner.changeStatus(id, 'm_1', { to: 'dismissed', actor: 'carol', note: 'fp' })).toEqual({ ok: false, reason: 'not_allowed' });
  });

  it('makes one of two conflicting changes sent through two replicas at the same time, and refuses the other', async () => {
    // Both replicas decide on the same stored copy (each waits at its write for the other to get there),
    // and both writes land before either is read back.
    const beforeWrite = barrier(2);
    const afterWrite = barrier(2);
    class Racing extends AlertStore {
      override async save(alerts: readonly Alert[], over?: ReadonlyMap<string, number>): Promise<void> {
        await beforeWrite();
        await super.save(alerts, over);
        await afterWrite();
      }
    }
    const first = await replicaWithClock(0, (now) => new Racing(db, tables, now));
    const second = await replicaWithClock(0, (now) => new Racing(db, tables, now));
    const alert = makeAlert(0, { merchantId: 'm_race', createdAtMs: Date.now() - 60_000 });
    await store.save([alert]);

    const outcomes = await Promise.all([
      first.changeStatus(alert.id, 'm_race', { to: 'dismissed', actor: 'alice', note: 'false positive' }),
      second.changeStatus(alert.id, 'm_race', { to: 'acknowledged', actor: 'bob' }),
    ]);
    const made = outcomes.filter((outcome) => outcome?.ok);
    expect(made).toHaveLength(1);
    expect(outcomes.filter((outcome) => !outcome?.ok)).toEqual([{ ok: false, reason: 'not_allowed' }]);
    const status = made[0]!.ok ? made[0]!.alert.status : undefined;
    const moves = (stored: Alert) => stored.history.map((entry) => `${entry.from}->${entry.to}`);
    expect(await store.get(alert.id, 'm_race')).toMatchObject({ status });
    // The refused change is not written again by the read-backs.
    await sleep(2_500);
    const stored = (await store.get(alert.id, 'm_race'))!;
    expect(stored.status).toBe(status);
    expect(moves(stored)).toEqual(['null->open', `open->${status}`]);
  });

  it('lets a key\'s new owner continue the alert its previous owner created', async () => {
    const newOwner = await replica(); // started before the alert existed
    const previousOwner = await replica();
    detect(previousOwner, 'pk_moved', 'medium');
    await previousOwner.flush();
    await newOwner.syncWithStore();
    detect(newOwner, 'pk_moved', 'high');
    await newOwner.flush();
    expect(await storedFor('pk_moved')).toMatchObject({ severity: 'high', occurrences: 2 });
  });

  it('reads only each alert\'s latest version in the background reads: what changed, and what enforcement may act on', async () => {
    const now = Date.now();
    const merchantId = 'm_latest';
    const live = { merchantId, createdAtMs: now - 600_000, lastSeenAt: new Date(now - 60_000).toISOString(), updatedAt: new Date(now).toISOString() };
    const versions = (first: Alert, ...later: Partial<Alert>[]) => [first, ...later.map((change) => ({ ...first, ...change }))];
    const resolved = versions(makeAlert(0, { ...live, apiKeyId: 'pk_resolved', recommendedAction: 'rate_limit' }), { status: 'resolved' });
    const escalated = versions(makeAlert(1, { ...live, apiKeyId: 'pk_escalated', severity: 'medium', recommendedAction: 'monitor' }), {
      severity: 'critical',
      riskScore: 0.97,
      recommendedAction: 'block',
      title: 'escalated',
    });
    const calmed = versions(makeAlert(2, { ...live, apiKeyId: 'pk_calmed', recommendedAction: 'block' }), { recommendedAction: 'monitor' });
    const old = versions(makeAlert(3, { ...live, apiKeyId: 'pk_old', recommendedAction: 'rate_limit', lastSeenAt: new Date(now - 7_200_000).toISOString() }));
    const ipOnly = versions(makeAlert(4, { ...live, apiKeyId: null, recommendedAction: 'block' }));
    const acknowledged = versions(makeAlert(5, { ...live, apiKeyId: 'pk_acknowledged', recommendedAction: 'rate_limit' }), { status: 'acknowledged' });
    const histories = [resolved, escalated, calmed, old, ipOnly, acknowledged];

    // Each version its own insert, in order (later versions are higher), as replicas write them; with
    // merges stopped, every version stays in the table, as it does until a merge collapses it.
    await db.command(`SYSTEM STOP MERGES ${tables.alerts}`);
    try {
      for (const history of histories) for (const version of history) await store.save([version]);
      const [stored] = await db.queryRows<{ versions: number | string }>(`SELECT count() AS versions FROM ${tables.alerts} WHERE merchant_id = {merchantId:String}`, { merchantId });
      expect(Number(stored?.versions)).toBe(10);

      const enforceable = (await store.enforceable(new Date(now - 3_600_000))).filter((alert) => alert.merchantId === merchantId);
      expect(enforceable.map((alert) => alert.apiKeyId).sort()).toEqual(['pk_acknowledged', 'pk_escalated']);
      expect(enforceable.find((alert) => alert.apiKeyId === 'pk_escalated')).toEqual({
        id: escalated[0]!.id,
        merchantId,
        apiKeyId: 'pk_escalated',
        type: escalated[0]!.type,
        severity: 'critical',
        riskScore: 0.97,
        recommendedAction: 'block',
        status: 'open',
        title: 'escalated',
        lastSeenAt: live.lastSeenAt,
      });

      const byId = (a: Alert, b: Alert) => a.id.localeCompare(b.id);
      const changed = (await store.changedSince(new Date(now - 60_000))).filter((alert) => alert.merchantId === merchantId);
      expect(changed.sort(byId)).toEqual(histories.map((history) => history.at(-1)!).sort(byId)); // one row per alert, its latest
    } finally {
      await db.command(`SYSTEM START MERGES ${tables.alerts}`);
    }
  });
});
