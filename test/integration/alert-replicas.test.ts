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
import { changeStatus, type Alert } from '../../src/alerts/alert.ts';
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

  async function replica(metrics = new WorkerMetrics({ defaultMetrics: false })): Promise<AlertService> {
    const alerts = new AlertService(new AlertManager({ suppressionMs: 3_600_000 }), store, RULES, metrics, createLogger('silent'));
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

  /** A finding of evidence seen up to `at` (now). */
  function detect(alerts: AlertService, scope: string, severity: Severity = 'high', at = Date.now()): void {
    alerts.handle({ findings: [{ merchantId: 'm_1', ruleId: 'velocity_attack', finding: finding(severity, at, scope) }], ruleErrors: [] });
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
   * The repeat's evidence was seen before the changes made elsewhere (evidence seen after a
   * resolution is a recurrence: the merge reopens the alert).
   */
  async function staleOwner(scope: string, elsewhere: (id: string, other: AlertService, owner: AlertService) => Promise<void>) {
    const owner = await replica();
    const other = await replica();
    detect(owner, scope);
    await owner.flush();
    const { id } = await storedFor(scope);
    await sleep(2);
    const seenBefore = Date.now();
    await elsewhere(id, other, owner);
    await sleep(5); // the repeat and the change below come strictly later
    detect(owner, scope, 'high', seenBefore);
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

  it('leaves one open alert when two replicas see one pattern at once: the earlier is resolved as a duplicate of the later', async () => {
    const first = await replicaWithClock(0);
    const second = await replicaWithClock(3_000); // its alert is created 3 s later
    const scope = 'network:203.0.113.0/24';
    const at = Date.now();
    detect(first, scope, 'medium', at);
    detect(second, scope, 'high', at + 1_000);
    await Promise.all([first.flush(), second.flush()]);
    const stored = async () => (await store.list({ merchantId: 'm_1' })).filter((alert) => alert.scope === scope);
    expect((await stored()).map((alert) => alert.status)).toEqual(['open', 'open']);
    // Each reads the other's: the first resolves its own, and both go on with the second's.
    await Promise.all([first.syncWithStore(), second.syncWithStore()]);
    await waitFor(async () => (await stored()).some((alert) => alert.status === 'resolved'), 'the duplicate is resolved', 5_000);
    const [kept, duplicate] = (await stored()).sort((x, y) => (x.status === 'open' ? -1 : y.status === 'open' ? 1 : 0));
    expect(kept).toMatchObject({ status: 'open', severity: 'high' });
    expect(duplicate).toMatchObject({ status: 'resolved', severity: 'medium' });
    expect(duplicate!.history.at(-1)).toMatchObject({ actor: 'system', from: 'open', to: 'resolved', note: expect.stringContaining(`a duplicate of alert ${kept!.id}`) });
    detect(first, scope, 'high', at + 2_000);
    await first.flush();
    // Its own finding, the duplicate's, and this one.
    expect(await stored()).toEqual(expect.arrayContaining([expect.objectContaining({ id: kept!.id, status: 'open', occurrences: 3 })]));
    expect((await stored()).filter((alert) => alert.status === 'open')).toHaveLength(1);
  });

  it('gives the alert kept what its duplicate saw: a critical duplicate leaves the alert kept critical, with the findings of both', async () => {
    const first = await replicaWithClock(0);
    // Its alert is created 3 s later; what it tells on-call is recorded.
    const paged: string[] = [];
    const now = () => Date.now() + 3_000;
    const second = new AlertService(new AlertManager({ suppressionMs: 3_600_000, now }), new AlertStore(db, tables, now), RULES, new WorkerMetrics({ defaultMetrics: false }), createLogger('silent'), {
      now,
      onCritical: (_alert, change) => paged.push(change),
    });
    await second.start();
    replicas.push(second);
    const scope = 'pk_moved_at_once';
    const at = Date.now();
    // The key's previous owner escalated its alert to critical; its new owner opened one at medium.
    for (const [i, severity] of (['high', 'critical', 'critical'] as const).entries()) detect(first, scope, severity, at - 3_000 + i * 500);
    await first.flush();
    detect(second, scope, 'medium', at + 1_000);
    await second.flush();
    await first.syncWithStore();
    await first.flush(); // after the duplicate's resolution, queued before it, and the alert kept's update
    const alerts = (await store.list({ merchantId: 'm_1' })).filter((alert) => alert.scope === scope);
    const [kept, duplicate] = [alerts.find((alert) => alert.status === 'open')!, alerts.find((alert) => alert.status === 'resolved')!];
    expect(kept).toMatchObject({ severity: 'critical', recommendedAction: 'block', occurrences: 4, firstSeenAt: duplicate.firstSeenAt, lastSeenAt: new Date(at + 1_000).toISOString() });
    expect(kept.riskScore).toBeGreaterThanOrEqual(0.9);
    // The new owner learns it: its next critical finding is a repeat, not an escalation that pages on-call again.
    await second.syncWithStore();
    detect(second, scope, 'critical', at + 2_000);
    await second.flush();
    expect((await store.list({ merchantId: 'm_1' })).find((alert) => alert.id === kept.id)).toMatchObject({ severity: 'critical', occurrences: 5 });
    expect(paged).toEqual([]);
  });

  it('writes what the alert kept takes from a duplicate its creator resolves as it stops', async () => {
    let failingReads = false;
    class FlakyReads extends AlertStore {
      override async getStored(...args: Parameters<AlertStore['getStored']>): ReturnType<AlertStore['getStored']> {
        if (failingReads) throw new Error('storage down');
        return super.getStored(...args);
      }
    }
    const first = await replicaWithClock(0, (now) => new FlakyReads(db, tables, now));
    const second = await replicaWithClock(3_000); // its alert is created 3 s later
    const scope = 'pk_owner_stopping';
    const at = Date.now();
    detect(first, scope, 'critical', at - 1_000);
    await first.flush();
    detect(second, scope, 'medium', at + 1_000);
    await second.flush();
    failingReads = true;
    await first.syncWithStore(); // finds its alert a duplicate; resolving it fails, left for later
    await first.flush(); // after the failed attempt, queued before it
    failingReads = false;
    await first.stop(); // resolves it, and writes what the alert kept takes
    const alerts = (await store.list({ merchantId: 'm_1' })).filter((alert) => alert.scope === scope);
    expect(alerts.map((alert) => `${alert.status} ${alert.severity} ${alert.occurrences}`).sort()).toEqual(['open critical 2', 'resolved critical 1']);
  });

  it('resolves, as it starts, the earlier of two alerts open for one pattern that their creator, killed, left open', async () => {
    const t0 = Date.now() - 60_000;
    const scope = { scope: 'pk_left_open', apiKeyId: 'pk_left_open', type: 'velocity_attack', ruleId: 'velocity_attack' } as const;
    const earlier = makeAlert(0, { merchantId: 'm_1', createdAtMs: t0, ...scope, severity: 'critical', riskScore: 0.95, recommendedAction: 'block', occurrences: 3 });
    const later = makeAlert(0, { merchantId: 'm_1', createdAtMs: t0 + 1_000, ...scope, severity: 'medium', riskScore: 0.5, recommendedAction: 'rate_limit', occurrences: 2 });
    await store.save([earlier, later]);
    const metrics = [new WorkerMetrics({ defaultMetrics: false }), new WorkerMetrics({ defaultMetrics: false })];
    const [one, two] = [await replica(metrics[0]), await replica(metrics[1])]; // both start (a rollout): one resolution stands
    await Promise.all([one.syncWithStore(), two.syncWithStore()]);
    await Promise.all([one.flush(), two.flush()]); // after the duplicate's resolution, queued before it
    const alerts = (await store.list({ merchantId: 'm_1' })).filter((alert) => alert.scope === scope.scope);
    expect(alerts.find((alert) => alert.id === earlier.id)!.history.map((entry) => `${entry.actor} ${entry.to}`)).toEqual(['system open', 'system resolved']);
    expect(alerts.find((alert) => alert.id === later.id)).toMatchObject({ status: 'open', severity: 'critical', occurrences: 5 });
    const resolved = await Promise.all(metrics.map(async (m) => (await m.duplicateAlertsResolved.get()).values.find((v) => v.labels.type === 'velocity_attack')?.value ?? 0));
    expect(resolved.sort()).toEqual([0, 1]);
  });

  /** Two replicas, clocks 3 s apart, each opening an alert for `scope` before reading the other's: the first's is the duplicate. */
  async function duplicates(scope: string) {
    const first = await replicaWithClock(0);
    const second = await replicaWithClock(3_000);
    const stored = async () => (await store.list({ merchantId: 'm_1' })).filter((alert) => alert.scope === scope);
    detect(first, scope, 'medium');
    await first.flush();
    const duplicate = (await stored())[0]!;
    detect(second, scope, 'medium', Date.now() + 1_000);
    await second.flush();
    return { first, second, stored, duplicate };
  }

  it('writes a duplicate\'s resolution again when an update made from a copy read before it lands over it', async () => {
    const { first, stored, duplicate: before } = await duplicates('network:203.0.113.128/25');
    await first.syncWithStore();
    await first.flush(); // after the resolution, queued before it
    expect((await stored()).find((alert) => alert.id === before.id)?.status).toBe('resolved');
    // A third replica's repeat, made from the copy it read before the resolution, lands over it.
    await store.save([{ ...before, occurrences: 9, updatedAt: new Date().toISOString() }]);
    expect((await stored()).filter((alert) => alert.status === 'open')).toHaveLength(2);
    await waitFor(async () => (await stored()).filter((alert) => alert.status === 'open').length === 1, 'the resolution is written again', 12_000);
    expect((await stored()).find((alert) => alert.id === before.id)).toMatchObject({ status: 'resolved', occurrences: 9 });
  });

  it('keeps a duplicate resolved while a third replica, not yet aware of the alert kept, goes on counting on it', async () => {
    const [first, third] = [await replicaWithClock(0), await replicaWithClock(0)];
    const second = await replicaWithClock(3_000); // its alert is created 3 s later
    const scope = 'network:198.51.100.0/24';
    const stored = async () => (await store.list({ merchantId: 'm_1' })).filter((alert) => alert.scope === scope);
    const at = Date.now();
    detect(first, scope, 'medium', at);
    await first.flush();
    await third.syncWithStore(); // the third continues the first's alert
    detect(second, scope, 'medium', at + 1_000);
    await second.flush();
    await first.syncWithStore();
    await waitFor(async () => (await stored()).some((alert) => alert.status === 'resolved'), 'the duplicate is resolved', 5_000);
    // The first's update of the alert kept (what it takes from the duplicate) is written too: landing
    // over the third's below, it would lower it until the third's next read repaired it.
    await first.flush();
    // The third counts a finding on its open copy of the duplicate, seen after the resolution, and writes it.
    detect(third, scope, 'high', Date.now() + 1_000);
    await third.flush();
    await third.syncWithStore();
    detect(third, scope, 'high', Date.now() + 2_000);
    await third.flush();
    const alerts = await stored();
    expect(alerts.map((alert) => alert.status).sort()).toEqual(['open', 'resolved']);
    expect(alerts.find((alert) => alert.status === 'open')).toMatchObject({ severity: 'high', createdAt: expect.any(String) });
    expect(alerts.find((alert) => alert.status === 'resolved')!.history.map((entry) => entry.to)).toEqual(['open', 'resolved']);
  });

  it('lets an admin\'s change of a duplicate, made before its creator resolves it, stand', async () => {
    const { first, second, stored, duplicate } = await duplicates('network:192.0.2.0/24');
    expect((await second.changeStatus(duplicate.id, 'm_1', { to: 'dismissed', actor: 'alice', note: 'our pentest' }))?.ok).toBe(true);
    await first.syncWithStore();
    await first.flush(); // waits for the writes queued before it, the duplicate's resolution among them
    const after = (await stored()).find((alert) => alert.id === duplicate.id)!;
    expect(after.status).toBe('dismissed');
    expect(after.history.map((entry) => `${entry.actor} ${entry.to}`)).toEqual(['system open', 'alice dismissed']);
  });

  it('writes a duplicate resolved, never open, when its creator learns of the alert kept before its first write lands', async () => {
    let failing = false;
    class Outage extends AlertStore {
      override async save(...args: Parameters<AlertStore['save']>): Promise<void> {
        if (failing) throw new Error('storage down');
        return super.save(...args);
      }
    }
    const first = await replicaWithClock(0, (now) => new Outage(db, tables, now));
    const second = await replicaWithClock(3_000); // its alert is created 3 s later
    const scope = 'network:198.51.100.128/25';
    const stored = async () => (await store.list({ merchantId: 'm_1' })).filter((alert) => alert.scope === scope);
    detect(second, scope, 'medium', Date.now() + 1_000);
    await second.flush();
    failing = true;
    detect(first, scope, 'medium');
    await first.flush(); // fails: its alert waits to be written, retried in a second
    await first.syncWithStore();
    failing = false;
    await first.flush(); // after the duplicate's resolution, queued before it
    const alerts = await stored();
    expect(alerts.map((alert) => alert.status).sort()).toEqual(['open', 'resolved']);
    expect(alerts.find((alert) => alert.status === 'resolved')!.history.map((entry) => `${entry.actor} ${entry.to}`)).toEqual(['system open', 'system resolved']);
  });

  it('does not reopen a duplicate an admin resolved when its creator, which had counted a repeat on it, reads of the alert kept first', async () => {
    const scope = 'network:192.0.2.128/25';
    const { first, second, stored, duplicate } = await duplicates(scope);
    await sleep(100); // the creation's flush timer has run: the repeat below waits for the 5-second one
    expect((await second.changeStatus(duplicate.id, 'm_1', { to: 'acknowledged', actor: 'alice' }))?.ok).toBe(true);
    expect((await second.changeStatus(duplicate.id, 'm_1', { to: 'resolved', actor: 'alice' }))?.ok).toBe(true);
    // The first, unaware of both, counts a repeat on its alert (seen after the resolution, stamped by
    // the second's clock 3 s ahead), and reads the others' before writing it.
    detect(first, scope, 'medium', Date.now() + 5_000);
    await first.syncWithStore();
    await first.flush();
    const alerts = await stored();
    expect(alerts.filter((alert) => alert.status === 'open').map((alert) => alert.id)).toEqual([expect.not.stringMatching(duplicate.id)]);
    expect(alerts.find((alert) => alert.id === duplicate.id)).toMatchObject({ status: 'resolved', occurrences: 2 });
    expect(alerts.find((alert) => alert.id === duplicate.id)!.history.map((entry) => `${entry.actor} ${entry.to}`)).toEqual(['system open', 'alice acknowledged', 'alice resolved']);
  });

  it('keeps the owner\'s counters when it reads an admin\'s change made through another replica before its repeats are written', async () => {
    const owner = await replica();
    const admin = await replica();
    const t0 = Date.now() - 10_000;
    detect(owner, 'pk_counters', 'high', t0);
    await owner.flush();
    const { id } = await storedFor('pk_counters');
    await sleep(100); // the creation's flush timer has run: the repeats below wait for the 5-second one
    // Under attack: the owner counts repeats, written within 5 s.
    for (let i = 1; i <= 4; i++) detect(owner, 'pk_counters', 'high', t0 + i * 500);
    await sleep(5);
    expect((await admin.changeStatus(id, 'm_1', { to: 'acknowledged', actor: 'alice' }))?.ok).toBe(true);
    // The owner's read of the others' alerts comes before its repeats' write.
    await owner.syncWithStore();
    await owner.flush();
    expect(await storedFor('pk_counters')).toMatchObject({ status: 'acknowledged', occurrences: 5, lastSeenAt: new Date(t0 + 2_000).toISOString() });
    detect(owner, 'pk_counters', 'high', t0 + 3_000);
    await owner.flush();
    expect(await storedFor('pk_counters')).toMatchObject({ status: 'acknowledged', occurrences: 6, lastSeenAt: new Date(t0 + 3_000).toISOString() });
  });

  it('keeps an escalation that lands between an admin\'s read and write: the change is made on it, and on-call hears of it once', async () => {
    const critical: string[] = [];
    const owner = new AlertService(new AlertManager({ suppressionMs: 3_600_000 }), new AlertStore(db, tables), RULES, new WorkerMetrics({ defaultMetrics: false }), createLogger('silent'), {
      onCritical: (alert, change) => critical.push(`${alert.id}:${change}`),
    });
    await owner.start();
    replicas.push(owner);
    let escalate: () => Promise<void> = async () => undefined;
    const admin = await replicaWithClock(0, (now) => {
      return new (class extends AlertStore {
        override async getStored(alertId: string, merchantId: string | undefined) {
          const stored = await super.getStored(alertId, merchantId);
          await escalate(); // the owner's escalation lands after the admin's read
          return stored;
        }
      })(db, tables, now);
    });
    detect(owner, 'pk_escalated_meanwhile', 'high');
    await owner.flush();
    const { id } = await storedFor('pk_escalated_meanwhile');
    escalate = async () => {
      escalate = async () => undefined;
      detect(owner, 'pk_escalated_meanwhile', 'critical');
      await owner.flush();
      await sleep(2);
    };
    expect(await admin.changeStatus(id, 'm_1', { to: 'acknowledged', actor: 'alice' })).toMatchObject({ ok: true, alert: { status: 'acknowledged', severity: 'critical' } });
    expect(await storedFor('pk_escalated_meanwhile')).toMatchObject({ status: 'acknowledged', severity: 'critical', recommendedAction: 'block' });
    // The owner reads it, and the attack goes on at critical: a repeat, not a second escalation.
    await owner.syncWithStore();
    await sleep(5);
    detect(owner, 'pk_escalated_meanwhile', 'critical');
    await owner.flush();
    expect(await storedFor('pk_escalated_meanwhile')).toMatchObject({ status: 'acknowledged', severity: 'critical', occurrences: 3 });
    expect(critical).toEqual([`${id}:escalated`]);
  });

  it('keeps the escalation a key\'s previous owner stored after its new owner read the alert', async () => {
    const previous = await replica();
    const next = await replica();
    detect(previous, 'pk_rebalanced', 'high');
    await previous.flush();
    // Rebalance: the new owner reads the alerts before judging the partition (high, as stored then).
    await next.syncWithStore();
    // The previous owner's escalation, decided just before the partition moved, lands after that read.
    detect(previous, 'pk_rebalanced', 'critical');
    await previous.flush();
    // The new owner judges the attack, a little calmer now: a repeat at high, written over the escalation.
    await sleep(5);
    detect(next, 'pk_rebalanced', 'high');
    await next.flush();
    const stored = await storedFor('pk_rebalanced');
    // Both owners counted a second occurrence: the higher count stands (occurrences are not summed).
    expect({ severity: stored.severity, recommendedAction: stored.recommendedAction, occurrences: stored.occurrences }).toEqual({ severity: 'critical', recommendedAction: 'block', occurrences: 2 });
    expect(stored.riskScore).toBeGreaterThanOrEqual(0.9);
  });

  it('keeps lastSeenAt when a key\'s previous owner writes its older repeat after the new owner\'s', async () => {
    const previous = await replica();
    const next = await replica();
    const t0 = Date.now() - 10_000;
    detect(previous, 'pk_late_write', 'high', t0);
    await previous.flush();
    await sleep(100); // the creation's flush timer has run: the repeat below waits for the 5-second one
    await next.syncWithStore();
    detect(previous, 'pk_late_write', 'high', t0 + 1_000); // counted just before the rebalance, not written yet
    detect(next, 'pk_late_write', 'high', t0 + 5_000);
    await next.flush();
    await previous.flush(); // lands last
    const stored = await storedFor('pk_late_write');
    expect({ lastSeenAt: stored.lastSeenAt, occurrences: stored.occurrences }).toEqual({ lastSeenAt: new Date(t0 + 5_000).toISOString(), occurrences: 2 });
  });

  it('repairs, at its next read of the others\' alerts, an escalation a stale write lowered, with no finding to update the alert', async () => {
    const owner = await replica();
    detect(owner, 'pk_repaired', 'critical');
    await owner.flush();
    const escalated = await storedFor('pk_repaired');
    // A write made from an older copy (high) lands over it: what enforcement reads is lowered.
    await store.save([{ ...escalated, severity: 'high', riskScore: 0.8, recommendedAction: 'rate_limit', updatedAt: new Date().toISOString() }]);
    expect(await storedFor('pk_repaired')).toMatchObject({ severity: 'high' });
    await owner.syncWithStore();
    await waitFor(async () => (await storedFor('pk_repaired')).severity === 'critical', 'the escalation is written again', 5_000);
    expect(await storedFor('pk_repaired')).toMatchObject({ severity: 'critical', riskScore: escalated.riskScore, recommendedAction: 'block' });
  });

  it('stores an admin\'s change only on the copy it was decided on: a second change decided on that copy is dropped whenever it lands', async () => {
    const alert = makeAlert(0, { merchantId: 'm_cas', createdAtMs: Date.now() - 60_000 });
    await store.save([alert]);
    const base = (await store.getStored(alert.id, 'm_cas'))!;
    const move = (to: 'acknowledged' | 'dismissed', actor: string) => {
      const outcome = changeStatus(base.alert, to, actor, 'a note', Date.now());
      if (!outcome.ok) throw new Error('refused');
      return outcome.alert;
    };
    await store.save([move('dismissed', 'alice')], undefined, { decidedOn: base.version });
    const afterFirst = (await store.getStored(alert.id, 'm_cas'))!;
    expect(afterFirst).toMatchObject({ version: base.version + 1, alert: { status: 'dismissed' } });
    // Later, after a detection write landed over it too: still dropped.
    await store.save([{ ...afterFirst.alert, occurrences: 7 }], new Map([[alert.id, afterFirst.version]]));
    await store.save([move('acknowledged', 'bob')], undefined, { decidedOn: base.version });
    expect((await store.get(alert.id, 'm_cas'))!).toMatchObject({ status: 'dismissed', occurrences: 7 });
    const [versions] = await db.queryRows<{ n: number | string }>(`SELECT count() AS n FROM ${tables.alerts} WHERE id = {id:UUID} AND status = 'acknowledged'`, { id: alert.id });
    expect(Number(versions?.n)).toBe(0);
    // A change decided on a copy a write has landed over since stands below that write.
    const stale = (await store.getStored(alert.id, 'm_cas'))!;
    await store.save([{ ...stale.alert, occurrences: 8 }], new Map([[alert.id, stale.version]]));
    await store.save([{ ...stale.alert, title: 'decided on the older copy' }], undefined, { decidedOn: stale.version });
    expect((await store.get(alert.id, 'm_cas'))!).toMatchObject({ occurrences: 8, title: stale.alert.title });
  });

  it('refuses the second of two conflicting changes decided on the same copy, even when it lands after the first was read back', async () => {
    // Both replicas read the same stored copy; the second one's write lands just after the first
    // replica has read its own change back.
    const bothRead = barrier(2);
    let releaseSecond: () => void = () => undefined;
    const secondMayWrite = new Promise<void>((resolve) => (releaseSecond = resolve));
    class First extends AlertStore {
      override async getStored(id: string, merchantId: string | undefined) {
        const stored = await super.getStored(id, merchantId);
        await bothRead();
        return stored;
      }
      override async getMany(ids: readonly string[]) {
        const result = await super.getMany(ids);
        releaseSecond(); // the read-back is done: now the other write lands
        return result;
      }
    }
    class Second extends AlertStore {
      override async getStored(id: string, merchantId: string | undefined) {
        const stored = await super.getStored(id, merchantId);
        await bothRead();
        return stored;
      }
      override async save(...args: Parameters<AlertStore['save']>) {
        await secondMayWrite;
        await super.save(...args);
      }
    }
    const first = await replicaWithClock(0, (now) => new First(db, tables, now));
    const second = await replicaWithClock(0, (now) => new Second(db, tables, now));
    const alert = makeAlert(0, { merchantId: 'm_race_late', createdAtMs: Date.now() - 60_000 });
    await store.save([alert]);
    const outcomes = await Promise.all([
      first.changeStatus(alert.id, 'm_race_late', { to: 'dismissed', actor: 'alice', note: 'our load test' }),
      second.changeStatus(alert.id, 'm_race_late', { to: 'acknowledged', actor: 'bob' }),
    ]);
    expect(outcomes.map((outcome) => outcome?.ok)).toEqual([true, false]);
    const moves = async () => (await store.get(alert.id, 'm_race_late'))!.history.map((entry) => `${entry.actor}:${entry.from}->${entry.to}`);
    expect(await moves()).toEqual(['system:null->open', 'alice:open->dismissed']);
    // Neither replica writes the refused change back: not the read-backs, not a detection write of bob's replica.
    second.handle({ findings: [{ merchantId: 'm_race_late', ruleId: alert.type, finding: finding('high', Date.now(), alert.scope) }], ruleErrors: [] });
    await second.flush();
    await sleep(2_500);
    expect(await moves()).toEqual(['system:null->open', 'alice:open->dismissed']);
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
      // The holders earned the block, then a throttle, before strangers' 401s were last seen.
      actionSeenAt: new Date(now - 120_000).toISOString(),
      blockSeenAt: new Date(now - 180_000).toISOString(),
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
        actionSeenAt: new Date(now - 120_000).toISOString(),
        blockSeenAt: new Date(now - 180_000).toISOString(),
      });
      // An alert stored without them is read without them (decisions then count from lastSeenAt).
      expect(enforceable.find((alert) => alert.apiKeyId === 'pk_acknowledged')).not.toHaveProperty('actionSeenAt');
      expect(enforceable.find((alert) => alert.apiKeyId === 'pk_acknowledged')).not.toHaveProperty('blockSeenAt');

      const byId = (a: Alert, b: Alert) => a.id.localeCompare(b.id);
      const changed = (await store.changedSince(new Date(now - 60_000))).filter((alert) => alert.merchantId === merchantId);
      expect(changed.sort(byId)).toEqual(histories.map((history) => history.at(-1)!).sort(byId)); // one row per alert, its latest
    } finally {
      await db.command(`SYSTEM START MERGES ${tables.alerts}`);
    }
  });
});
