import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { RULES } from '../../rules/index.ts';
import { fake } from '../../test/support/fake.ts';
import type { Finding, Severity } from '../detect/types.ts';
import { createLogger } from '../logger.ts';
import { WorkerMetrics } from '../metrics.ts';
import type { AlertStore } from '../store/alert-store.ts';
import { changeStatus, type Alert } from './alert.ts';
import { AlertManager } from './alert-manager.ts';
import { AlertService, MAX_HELD_FINDINGS, type AlertServiceHooks } from './alert-service.ts';
import { finding as makeFinding, testAlert } from './test-findings.ts';

const T0 = Date.UTC(2026, 10, 21, 12, 0, 0);

function finding(severity: Severity, scope = 'pk_live_a'): Finding {
  return makeFinding(severity, T0, scope);
}

/** A service over a store that holds `stored` (what start() loads for dedup); not started. */
function unstartedService(onCritical?: AlertServiceHooks['onCritical'], stored: Alert[] = []) {
  const manager = new AlertManager({ suppressionMs: 3_600_000, now: () => T0 });
  const saved: Alert[] = [];
  const store = fake<AlertStore>({
    save: async (alerts: Alert[]) => void saved.push(...alerts),
    getMany: async () => [],
    loadForDedup: async () => stored,
    changedSince: async () => [],
  });
  const alerts = new AlertService(manager, store, RULES, new WorkerMetrics({ defaultMetrics: false }), createLogger('silent'), { onCritical });
  const apply = (severity: Severity, scope?: string) =>
    alerts.handle({ findings: [{ merchantId: 'm_1', ruleId: 'velocity_attack', finding: finding(severity, scope) }], ruleErrors: [] });
  return { alerts, manager, apply, saved };
}

/** A started service (the open alerts loaded: none). */
async function service(onCritical: AlertServiceHooks['onCritical']) {
  const started = unstartedService(onCritical);
  await started.alerts.start();
  return started;
}

describe('AlertService onCritical', () => {
  it('is called when an alert is created critical or escalated to critical, and not for repeats or lower severities', async () => {
    const calls: [string, string, string][] = [];
    const { apply, alerts } = await service((alert, change) => calls.push([alert.apiKeyId ?? '', alert.severity, change]));
    apply('critical', 'pk_a'); // created critical
    apply('critical', 'pk_a'); // repeat: no news
    apply('high', 'pk_b'); // created high
    await alerts.flush();
    apply('critical', 'pk_b'); // escalated
    apply('medium', 'pk_c');
    await alerts.flush();
    expect(calls).toEqual([
      ['pk_a', 'critical', 'created'],
      ['pk_b', 'critical', 'escalated'],
    ]);
  });

  it('is called when a resolved critical alert is reopened', async () => {
    const calls: string[] = [];
    const { apply, manager, alerts } = await service((_alert, change) => calls.push(change));
    let created: Alert | undefined;
    const capture = await service((alert) => (created = alert));
    capture.apply('critical');
    await capture.alerts.flush();
    // Resolved before the evidence: the pattern recurred.
    manager.load([{ ...created!, status: 'resolved', updatedAt: new Date(T0 - 1_000).toISOString() }]);
    apply('critical');
    await alerts.flush();
    expect(calls).toEqual(['reopened']);
    // Resolved after the evidence it was created on: that evidence, judged again, pages nobody.
    const quiet: string[] = [];
    const resolvedLater = await service((_alert, change) => quiet.push(change));
    resolvedLater.manager.load([{ ...created!, status: 'resolved', updatedAt: new Date(T0 + 1_000).toISOString() }]);
    resolvedLater.apply('critical');
    await resolvedLater.alerts.flush();
    expect(quiet).toEqual([]);
  });

  it('a hook that throws does not stop the other findings', async () => {
    const seen: string[] = [];
    const { apply, alerts, saved } = await service((alert) => {
      seen.push(alert.apiKeyId ?? '');
      throw new Error('boom');
    });
    expect(() => {
      apply('critical', 'pk_a');
      apply('critical', 'pk_b');
    }).not.toThrow();
    await expect(alerts.flush()).resolves.toBeUndefined();
    expect(seen).toEqual(['pk_a', 'pk_b']);
    expect(saved.map((alert) => alert.apiKeyId)).toEqual(['pk_a', 'pk_b']);
  });

  it('is called only once the alert is stored, with the stored copy: not while its write fails, nor after a dismissal stored meanwhile', async () => {
    const calls: string[] = [];
    const saved: Alert[] = [];
    const attempted: Alert[] = [];
    let storageUp = false;
    const dismissedElsewhere = new Map<string, Alert>();
    const store = fake<AlertStore>({
      save: async (alerts: Alert[]) => {
        attempted.push(...alerts);
        if (!storageUp) throw new Error('ClickHouse is down');
        saved.push(...alerts);
      },
      getMany: async (ids: string[]) => ids.flatMap((id) => (dismissedElsewhere.has(id) ? [{ alert: dismissedElsewhere.get(id)!, version: 1 }] : [])),
      loadForDedup: async () => [],
      changedSince: async () => [],
    });
    const manager = new AlertManager({ suppressionMs: 3_600_000, now: () => T0 });
    const alerts = new AlertService(manager, store, RULES, new WorkerMetrics({ defaultMetrics: false }), createLogger('silent'), {
      onCritical: (alert, change) => calls.push(`${alert.apiKeyId}:${change}:${saved.some((s) => s.id === alert.id)}`),
    });
    await alerts.start();
    const apply = (scope: string) => alerts.handle({ findings: [{ merchantId: 'm_1', ruleId: 'velocity_attack', finding: finding('critical', scope) }], ruleErrors: [] });
    apply('pk_a');
    await alerts.flush(); // the write fails: nobody is told of an alert storage does not hold
    expect(calls).toEqual([]);
    storageUp = true;
    await alerts.flush();
    expect(calls).toEqual(['pk_a:created:true']);
    // pk_b's alert: its first write fails, and meanwhile an admin dismisses it through another replica
    // (which stores it so); our next write merges that in. A dismissed alert is no news.
    storageUp = false;
    apply('pk_b');
    await alerts.flush();
    const ours = attempted.at(-1)!;
    expect(ours.apiKeyId).toBe('pk_b');
    const dismissal = changeStatus(ours, 'dismissed', 'admin@m_1', 'our pentest', T0 + 1);
    if (!dismissal.ok) throw new Error(dismissal.reason);
    dismissedElsewhere.set(ours.id, dismissal.alert);
    storageUp = true;
    await alerts.flush();
    expect(saved.at(-1)).toMatchObject({ id: ours.id, status: 'dismissed' });
    expect(calls).toEqual(['pk_a:created:true']);
    await alerts.stop();
  });
});

describe('AlertService onCritical with a duplicate from another replica', () => {
  it('pages for the kept alert when ours, critical, is resolved as its duplicate before it was ever stored', async () => {
    // Another replica opened the key's alert a moment later, high (it saw less of the attack).
    const rule = RULES.find((r) => r.id === 'velocity_attack')!;
    const theirs = new AlertManager({ suppressionMs: 3_600_000, now: () => T0 + 1_000 });
    const kept = theirs.apply('m_1', { id: rule.id, version: rule.version, actions: rule.actions }, finding('high', 'pk_a')).alert!;
    const calls: string[] = [];
    const saved: Alert[] = [];
    const store = fake<AlertStore>({
      save: async (alerts: Alert[]) => void saved.push(...alerts),
      getMany: async () => [],
      getStored: async () => undefined,
      loadForDedup: async () => [],
      changedSince: async () => [kept],
    });
    const alerts = new AlertService(new AlertManager({ suppressionMs: 3_600_000, now: () => T0 }), store, RULES, new WorkerMetrics({ defaultMetrics: false }), createLogger('silent'), {
      now: () => T0,
      onCritical: (alert, change) => calls.push(`${alert.id === kept.id ? 'kept' : 'ours'}:${alert.severity}:${alert.status}:${change}`),
    });
    await alerts.start();
    // Ours is opened critical, and the sync that finds theirs comes before our first write.
    alerts.handle({ findings: [{ merchantId: 'm_1', ruleId: 'velocity_attack', finding: finding('critical', 'pk_a') }], ruleErrors: [] });
    await alerts.syncWithStore();
    await vi.waitFor(() => expect(saved.map((a) => a.status)).toContain('resolved'), { timeout: 2_000 });
    await alerts.flush();
    await alerts.stop();
    expect(saved.map((a) => `${a.id === kept.id ? 'kept' : 'ours'}:${a.severity}:${a.status}`).sort()).toEqual(['kept:critical:open', 'ours:critical:resolved']);
    expect(calls).toEqual(['kept:critical:open:escalated']);
  });

  it('pages for the kept alert when ours, stored high, escalates to critical and is resolved as its duplicate before that is written', async () => {
    const { rows, store } = memoryStore();
    const calls: string[] = [];
    let oursId: string | undefined;
    const alerts = new AlertService(new AlertManager({ suppressionMs: 3_600_000, now: () => T0 }), store, RULES, new WorkerMetrics({ defaultMetrics: false }), createLogger('silent'), {
      now: () => T0,
      onCritical: (alert, change) => calls.push(`${alert.id === oursId ? 'ours' : 'kept'}:${alert.severity}:${alert.status}:${change}`),
    });
    await alerts.start();
    const apply = (severity: Severity) => alerts.handle({ findings: [{ merchantId: 'm_1', ruleId: 'velocity_attack', finding: finding(severity, 'pk_a') }], ruleErrors: [] });
    apply('high');
    await alerts.flush();
    oursId = [...rows.keys()][0];
    // The other replica's, opened a moment later, becomes visible; ours escalates, and the sync comes before its write.
    const rule = RULES.find((r) => r.id === 'velocity_attack')!;
    const kept = new AlertManager({ suppressionMs: 3_600_000, now: () => T0 + 1_000 }).apply('m_1', { id: rule.id, version: rule.version, actions: rule.actions }, makeFinding('high', T0 + 1_000, 'pk_a')).alert!;
    rows.set(kept.id, kept);
    store.changedSince = async () => [kept];
    apply('critical');
    await alerts.syncWithStore();
    await vi.waitFor(() => expect(rows.get(oursId!)?.status).toBe('resolved'), { timeout: 2_000 });
    await alerts.flush();
    await alerts.stop();
    expect([...rows.values()].map((a) => `${a.id === kept.id ? 'kept' : 'ours'}:${a.severity}:${a.status}`).sort()).toEqual(['kept:critical:open', 'ours:critical:resolved']);
    expect(calls).toEqual(['kept:critical:open:escalated']);
  });
});

describe('AlertService onCritical across replicas of one alert', () => {
  it('pages once when the key\'s previous and new owner each escalate the same alert before either syncs', async () => {
    // Both replicas hold the key's alert, stored high (a rebalance moved the key between them).
    const rule = RULES.find((r) => r.id === 'velocity_attack')!;
    const high = new AlertManager({ suppressionMs: 3_600_000, now: () => T0 }).apply('m_1', { id: rule.id, version: rule.version, actions: rule.actions }, finding('high', 'pk_a')).alert!;
    const { rows, store } = memoryStore(high);
    const pages: string[] = [];
    const replica = async (name: string, at: number) => {
      const alerts = new AlertService(new AlertManager({ suppressionMs: 3_600_000, now: () => at }), store, RULES, new WorkerMetrics({ defaultMetrics: false }), createLogger('silent'), {
        now: () => at,
        onCritical: (alert, change) => pages.push(`${name}:${alert.id === high.id}:${change}`),
      });
      await alerts.start();
      const escalate = () => alerts.handle({ findings: [{ merchantId: 'm_1', ruleId: 'velocity_attack', finding: makeFinding('critical', at, 'pk_a') }], ruleErrors: [] });
      return { alerts, escalate };
    };
    const previousOwner = await replica('previous', T0 + 1_000);
    const newOwner = await replica('new', T0 + 2_000);
    previousOwner.escalate();
    await previousOwner.alerts.flush();
    newOwner.escalate();
    await newOwner.alerts.flush();
    expect(rows.get(high.id)).toMatchObject({ severity: 'critical', status: 'open', lastSeenAt: new Date(T0 + 2_000).toISOString() });
    expect(pages).toEqual(['previous:true:escalated']);
    // Once resolved, the attack coming back is news again, whoever finds it.
    const acknowledged = changeStatus(rows.get(high.id)!, 'acknowledged', 'admin@m_1', undefined, T0 + 3_000);
    if (!acknowledged.ok) throw new Error(acknowledged.reason);
    const resolved = changeStatus(acknowledged.alert, 'resolved', 'admin@m_1', 'keys rotated', T0 + 3_000);
    if (!resolved.ok) throw new Error(resolved.reason);
    rows.set(high.id, resolved.alert);
    await newOwner.alerts.syncWithStore();
    const later = await replica('new', T0 + 4_000);
    later.escalate();
    await later.alerts.flush();
    expect(pages).toEqual(['previous:true:escalated', 'new:true:reopened']);
    await Promise.all([previousOwner.alerts.stop(), newOwner.alerts.stop(), later.alerts.stop()]);
  });

  it('pages when its own write stored the critical alert though the write failed (its answer lost), at the retry', async () => {
    const { rows, store, writes } = memoryStore();
    const pages: string[] = [];
    const alerts = new AlertService(new AlertManager({ suppressionMs: 3_600_000, now: () => T0 }), store, RULES, new WorkerMetrics({ defaultMetrics: false }), createLogger('silent'), {
      now: () => T0,
      onCritical: (alert, change) => pages.push(`${alert.severity}:${change}`),
    });
    await alerts.start();
    alerts.handle({ findings: [{ merchantId: 'm_1', ruleId: 'velocity_attack', finding: makeFinding('critical', T0, 'pk_a') }], ruleErrors: [] });
    writes.failingAfter = true;
    await alerts.flush(); // fails (logged), and is retried
    expect([...rows.values()].map((alert) => alert.severity)).toEqual(['critical']); // stored all the same
    expect(pages).toEqual([]);
    writes.failingAfter = false;
    await alerts.flush();
    expect(pages).toEqual(['critical:created']);
    await alerts.stop();
  });
});

describe('AlertService before the open alerts are loaded', () => {
  it('holds findings until start() has loaded the open alerts, then continues the open alert instead of opening a second', async () => {
    let open: Alert | undefined;
    const earlier = await service((alert) => (open = alert));
    earlier.apply('critical', 'pk_a');
    await earlier.alerts.flush();
    const pages: string[] = [];
    // A restarted worker: the alert is open in storage, and a finding for it arrives before the load.
    const { alerts, manager, saved } = unstartedService((_alert, change) => pages.push(change), [open!]);
    const later = (severity: Severity, scope: string) =>
      alerts.handle({ findings: [{ merchantId: 'm_1', ruleId: 'velocity_attack', finding: makeFinding(severity, T0 + 60_000, scope) }], ruleErrors: [] });
    later('critical', 'pk_a');
    later('high', 'pk_b');
    expect(manager.current(open!)).toBe(open); // nothing applied yet
    await alerts.start();
    await alerts.flush();
    const continued = saved.find((alert) => alert.apiKeyId === 'pk_a');
    expect(continued?.id).toBe(open!.id);
    expect(continued?.occurrences).toBe(open!.occurrences + 1);
    expect(saved.filter((alert) => alert.apiKeyId === 'pk_b')).toHaveLength(1);
    expect(pages).toEqual([]); // the open critical alert was not news again
    later('high', 'pk_c'); // after the load: applied at once
    await alerts.flush();
    expect(saved.filter((alert) => alert.apiKeyId === 'pk_c')).toHaveLength(1);
    await alerts.stop();
  });

  it(`holds at most ${MAX_HELD_FINDINGS} findings, the first ones`, async () => {
    const { alerts, saved } = unstartedService();
    const findings = Array.from({ length: MAX_HELD_FINDINGS + 5 }, (_, i) => ({ merchantId: 'm_1', ruleId: 'velocity_attack' as const, finding: finding('low', `pk_${i}`) }));
    alerts.handle({ findings: findings.slice(0, 3), ruleErrors: [] });
    alerts.handle({ findings: findings.slice(3), ruleErrors: [] });
    await alerts.start();
    await alerts.flush();
    const keys = new Set(saved.map((alert) => alert.apiKeyId));
    expect(keys.size).toBe(MAX_HELD_FINDINGS);
    expect(keys.has('pk_0') && keys.has(`pk_${MAX_HELD_FINDINGS - 1}`)).toBe(true);
    expect(keys.has(`pk_${MAX_HELD_FINDINGS}`)).toBe(false);
    await alerts.stop();
  });
});

describe('AlertService.stop', () => {
  it('waits for a read of the other replicas\' alerts in progress, so storage is not closed under it', async () => {
    vi.useFakeTimers();
    try {
      let release: (rows: Alert[]) => void = () => undefined;
      const reads: string[] = [];
      const store = fake<AlertStore>({
        loadForDedup: async () => [],
        changedSince: () => {
          reads.push('changedSince');
          return new Promise<Alert[]>((resolve) => (release = resolve));
        },
        save: async () => undefined,
      });
      const manager = new AlertManager({ suppressionMs: 3_600_000, now: () => T0 });
      const alerts = new AlertService(manager, store, RULES, new WorkerMetrics({ defaultMetrics: false }), createLogger('silent'));
      await alerts.start();
      await vi.advanceTimersByTimeAsync(5_000);
      expect(reads).toEqual(['changedSince']);

      let stopped = false;
      const stopping = alerts.stop().then(() => (stopped = true));
      await vi.advanceTimersByTimeAsync(100);
      expect(stopped).toBe(false);
      release([]);
      await stopping;
      expect(stopped).toBe(true);
    } finally {
      vi.useRealTimers();
    }
  });
});

describe('AlertService after stop()', () => {
  it('ignores findings handed over after stop(): nothing notified or written, storage being closed next', async () => {
    vi.useFakeTimers({ now: T0 });
    try {
      const pages: string[] = [];
      const { alerts, apply, saved } = unstartedService((_alert, change) => pages.push(change));
      await alerts.start();
      await alerts.stop();
      apply('critical');
      await vi.advanceTimersByTimeAsync(30_000); // past any flush
      expect({ saved, pages }).toEqual({ saved: [], pages: [] });
    } finally {
      vi.useRealTimers();
    }
  });

  it('does not retry after stop() a write that fails while it stops: storage is closed next', async () => {
    vi.useFakeTimers({ now: T0 });
    try {
      let saves = 0;
      let failFirstSave!: (error: Error) => void;
      const store = fake<AlertStore>({
        loadForDedup: async () => [],
        changedSince: async () => [],
        getMany: async () => [],
        save: () => {
          saves++;
          if (saves === 1) return new Promise<void>((_resolve, reject) => (failFirstSave = reject));
          return Promise.reject(new Error('storage closed'));
        },
      });
      const alerts = new AlertService(new AlertManager({ suppressionMs: 3_600_000, now: () => T0 }), store, RULES, new WorkerMetrics({ defaultMetrics: false }), createLogger('silent'));
      await alerts.start();
      alerts.handle({ findings: [{ merchantId: 'm_1', ruleId: 'velocity_attack', finding: finding('high') }], ruleErrors: [] });
      await vi.advanceTimersByTimeAsync(100); // the flush timer fires: its write is in progress
      expect(saves).toBe(1);
      const stopping = alerts.stop();
      failFirstSave(new Error('storage closing')); // the write in progress fails once stop() has begun
      await stopping; // its final flush fails too
      expect(saves).toBe(2);
      await vi.advanceTimersByTimeAsync(30_000); // past many retry delays
      expect(saves).toBe(2);
    } finally {
      vi.useRealTimers();
    }
  });
});

describe('AlertService stopped while it starts', () => {
  it('starts nothing once the load of the open alerts ends after stop(): no syncs, no held findings applied, nothing written', async () => {
    vi.useFakeTimers({ now: T0 });
    try {
      let finishLoad!: (alerts: Alert[]) => void;
      const reads: string[] = [];
      const saved: Alert[] = [];
      const store = fake<AlertStore>({
        loadForDedup: () => new Promise<Alert[]>((resolve) => (finishLoad = resolve)),
        changedSince: async () => (reads.push('changedSince'), []),
        getMany: async () => [],
        save: async (alerts: Alert[]) => void saved.push(...alerts),
      });
      const manager = new AlertManager({ suppressionMs: 3_600_000, now: () => T0 });
      const pages: string[] = [];
      const alerts = new AlertService(manager, store, RULES, new WorkerMetrics({ defaultMetrics: false }), createLogger('silent'), { onCritical: (_alert, change) => pages.push(change) });
      alerts.handle({ findings: [{ merchantId: 'm_1', ruleId: 'velocity_attack', finding: finding('critical') }], ruleErrors: [] }); // held until the load
      const started = alerts.start().then(
        () => 'started',
        (error: Error) => error.message,
      );
      // main.ts's stop gives up waiting for start-up after 5 s, and stops alerts later on.
      await alerts.stop();
      finishLoad([]);
      await vi.advanceTimersByTimeAsync(30_000); // past several sync intervals and any flush
      expect({ reads, saved, pages }).toEqual({ reads: [], saved: [], pages: [] });
      expect(await started).toBe('alerts stopped while starting');
    } finally {
      vi.useRealTimers();
    }
  });
});

describe('AlertService status changes with racing replicas', () => {
  // Fake timers from T0: the read-backs and flushes run on timers.
  beforeEach(() => {
    vi.useFakeTimers({ now: T0 });
  });
  afterEach(() => {
    vi.useRealTimers();
  });
  it('writes an admin\'s change again each time another replica writes over it, until it stays', async () => {
    const open = testAlert(T0);
    // What storage holds; the key's owner (another replica) writes its copy, without the change, over it.
    let stored = open;
    const ownerWritesOver = () => (stored = { ...open, occurrences: stored.occurrences + 1 });
    const store = fake<AlertStore>({
      getStored: async () => ({ alert: stored, version: 1 }),
      getMany: async () => [{ alert: stored, version: 1 }],
      save: async (alerts: Alert[]) => {
        stored = alerts[0]!;
      },
    });
    const manager = new AlertManager({ suppressionMs: 3_600_000, now: () => T0 });
    const alerts = new AlertService(manager, store, RULES, new WorkerMetrics({ defaultMetrics: false }), createLogger('silent'));

    const outcome = await alerts.changeStatus(open.id, 'm_1', { to: 'acknowledged', actor: 'admin@m_1' });
    expect(outcome?.ok).toBe(true);
    expect(stored.status).toBe('acknowledged');
    for (let race = 1; race <= 3; race++) {
      ownerWritesOver();
      expect(stored.status).toBe('open');
      await vi.advanceTimersByTimeAsync(2_100); // read back, found missing, written again
      expect(stored.status, `after race ${race}`).toBe('acknowledged');
    }
    await alerts.stop();
  });
});

/**
 * Storage as a map, whose writes can be made to fail (before storing, or after: the answer lost), or
 * to wait until released one by one.
 */
function memoryStore(...alerts: Alert[]) {
  const rows = new Map(alerts.map((alert) => [alert.id, alert]));
  const writes = { failing: false, failingAfter: false, holding: false, held: [] as (() => void)[], count: 0 };
  const stored = (id: string) => {
    const alert = rows.get(id);
    return alert && { alert, version: writes.count };
  };
  const store = fake<AlertStore>({
    getStored: async (id: string) => stored(id),
    getMany: async (ids: string[]) => ids.flatMap((id) => stored(id) ?? []),
    loadForDedup: async () => [...rows.values()],
    changedSince: async () => [],
    save: async (saved: Alert[]) => {
      if (writes.holding) await new Promise<void>((release) => writes.held.push(release));
      if (writes.failing) throw new Error('storage is down');
      for (const alert of saved) rows.set(alert.id, alert);
      writes.count++;
      if (writes.failingAfter) throw new Error('socket hang up');
    },
  });
  const releaseOne = async () => {
    writes.held.shift()?.();
    await vi.advanceTimersByTimeAsync(0);
  };
  return { rows, store, writes, releaseOne };
}

describe('AlertService status changes and failed or slow writes', () => {
  // Fake timers from T0: the read-backs and flushes run on timers.
  beforeEach(() => {
    vi.useFakeTimers({ now: T0 });
  });
  afterEach(() => {
    vi.useRealTimers();
  });
  const newService = async (store: AlertStore) => {
    const alerts = new AlertService(new AlertManager({ suppressionMs: 3_600_000, now: () => Date.now() }), store, RULES, new WorkerMetrics({ defaultMetrics: false }), createLogger('silent'));
    await alerts.start();
    return alerts;
  };
  const acknowledge = { to: 'acknowledged', actor: 'admin@m_1' } as const;

  it('leaves nothing behind when the write fails (the caller gets an error), and the same change tried again is accepted', async () => {
    const open = testAlert(T0);
    const { rows, store, writes } = memoryStore(open);
    const alerts = await newService(store);
    writes.failing = true;
    await expect(alerts.changeStatus(open.id, 'm_1', acknowledge)).rejects.toThrow('storage is down');
    writes.failing = false;
    await vi.advanceTimersByTimeAsync(10_000); // past any retry or read-back
    expect(rows.get(open.id)?.status).toBe('open');

    const retry = await alerts.changeStatus(open.id, 'm_1', acknowledge);
    expect(retry).toMatchObject({ ok: true, alert: { status: 'acknowledged' } });
    expect(rows.get(open.id)?.history.map((entry) => entry.to)).toEqual(['open', 'acknowledged']);
    await alerts.stop();
  });

  it('accepts the retry of a change whose write was stored though it failed (its answer lost), without recording it twice', async () => {
    const open = testAlert(T0);
    const { rows, store, writes } = memoryStore(open);
    const alerts = await newService(store);
    writes.failingAfter = true;
    const dismiss = { to: 'dismissed', actor: 'admin@m_1', note: 'our load test' } as const;
    await expect(alerts.changeStatus(open.id, 'm_1', dismiss)).rejects.toThrow('socket hang up');
    writes.failingAfter = false;
    expect(rows.get(open.id)?.status).toBe('dismissed'); // stored all the same
    const written = writes.count;

    const retry = await alerts.changeStatus(open.id, 'm_1', dismiss);
    expect(retry).toMatchObject({ ok: true, alert: { status: 'dismissed' } });
    expect(writes.count).toBe(written); // nothing written again
    // With another note it is no retry: the note would be dropped, so the move is refused.
    expect(await alerts.changeStatus(open.id, 'm_1', { ...dismiss, note: 'typed again' })).toEqual({ ok: false, reason: 'not_allowed' });
    expect(rows.get(open.id)?.history.map((entry) => `${entry.actor}:${entry.to}`)).toEqual(['system:open', 'admin@m_1:dismissed']);
    // Another admin's same move is a move from dismissed: refused.
    expect(await alerts.changeStatus(open.id, 'm_1', { ...dismiss, actor: 'other@m_1' })).toEqual({ ok: false, reason: 'not_allowed' });
    // And dedup here has learned the dismissal: the key is silent.
    alerts.handle({ findings: [{ merchantId: 'm_1', ruleId: open.type, finding: makeFinding('high', T0 + 60_000, open.scope) }], ruleErrors: [] });
    await alerts.flush();
    expect(rows.get(open.id)?.occurrences).toBe(open.occurrences);
    await alerts.stop();
  });

  it('writes a retried change again at once when a racing write dropped it from storage', async () => {
    const open = testAlert(T0);
    const { rows, store } = memoryStore(open);
    const alerts = await newService(store);
    expect(await alerts.changeStatus(open.id, 'm_1', acknowledge)).toMatchObject({ ok: true });
    rows.set(open.id, { ...open, occurrences: 5 }); // the owner's copy, without the change, written over it
    expect(await alerts.changeStatus(open.id, 'm_1', acknowledge)).toMatchObject({ ok: true, alert: { status: 'acknowledged' } });
    expect(rows.get(open.id)?.history.map((entry) => entry.to)).toEqual(['open', 'acknowledged']);
    await alerts.stop();
  });

  it('decides a change on the copy read just before its write: one made elsewhere while this replica was writing counts', async () => {
    const { rows, releaseOne, writes, alerts, open } = await timerFlushWaiting();
    const answer = alerts.changeStatus(open.id, 'm_1', acknowledge);
    await vi.advanceTimersByTimeAsync(0);
    // Meanwhile the alert is dismissed through another replica.
    const dismissed = changeStatus(open, 'dismissed', 'other@m_1', 'load test', T0 + 1);
    if (!dismissed.ok) throw new Error('refused');
    rows.set(open.id, dismissed.alert);
    for (let i = 0; i < 5; i++) await releaseOne();
    writes.holding = false;
    await releaseOne();
    expect(await answer).toEqual({ ok: false, reason: 'not_allowed' });
    expect(rows.get(open.id)?.history.map((entry) => entry.to)).toEqual(['open', 'dismissed']);
    await alerts.stop();
  });

  it('refuses a change that lost to a conflicting one stored through another replica at the same time, and does not write it again', async () => {
    const open = testAlert(T0);
    const { rows, store } = memoryStore(open);
    const alerts = await newService(store);
    // The other replica decided on the same copy, and its row is the one that stands.
    const theirs = changeStatus(open, 'dismissed', 'other@m_1', 'load test', T0 + 1);
    if (!theirs.ok) throw new Error('refused');
    const save = store.save.bind(store);
    store.save = async (saved) => {
      await save(saved);
      rows.set(open.id, theirs.alert);
    };
    expect(await alerts.changeStatus(open.id, 'm_1', acknowledge)).toEqual({ ok: false, reason: 'not_allowed' });
    store.save = save;
    await vi.advanceTimersByTimeAsync(15_000); // past every read-back
    expect(rows.get(open.id)?.history.map((entry) => `${entry.from}->${entry.to}`)).toEqual(['null->open', 'open->dismissed']);
    await alerts.stop();
  });

  it('does not write a change again once a conflicting one stored through another replica at the same time stands instead', async () => {
    const open = testAlert(T0);
    const { rows, store } = memoryStore(open);
    const alerts = await newService(store);
    expect(await alerts.changeStatus(open.id, 'm_1', acknowledge)).toMatchObject({ ok: true });
    // Read back before the other replica's write landed; now its row, made from the same copy, stands.
    const theirs = changeStatus(open, 'dismissed', 'other@m_1', 'load test', T0 + 1);
    if (!theirs.ok) throw new Error('refused');
    rows.set(open.id, theirs.alert);
    await vi.advanceTimersByTimeAsync(15_000); // past every read-back
    expect(rows.get(open.id)?.history.map((entry) => `${entry.from}->${entry.to}`)).toEqual(['null->open', 'open->dismissed']);
    await alerts.stop();
  });

  it('writes a change again with the repeat detection has counted here meanwhile, and the other copy\'s counters', async () => {
    const open = testAlert(T0);
    const { rows, store } = memoryStore(open);
    const alerts = await newService(store);
    expect(await alerts.changeStatus(open.id, 'm_1', acknowledge)).toMatchObject({ ok: true });
    rows.set(open.id, { ...open, occurrences: 5 }); // another replica's copy, without the change, written over it
    await vi.advanceTimersByTimeAsync(1_000);
    // A repeat counted here, due to be written in 5 s.
    alerts.handle({ findings: [{ merchantId: 'm_1', ruleId: open.type, finding: makeFinding('critical', Date.now(), open.scope) }], ruleErrors: [] });
    await vi.advanceTimersByTimeAsync(1_200); // the read-back finds the change missing and writes it again at once
    // The repeat here is no escalation (the alert is critical); of the two copies' counts, the higher
    // (mergeDetection: increments on two replicas cannot be told apart, and a count never goes back).
    expect(rows.get(open.id)).toMatchObject({ status: 'acknowledged', severity: 'critical', occurrences: 5 });
    await alerts.stop();
  });

  /** A write in progress, and a timer's flush of another new alert waiting for it. */
  async function timerFlushWaiting() {
    const open = testAlert(T0);
    const storage = memoryStore(open);
    const alerts = await newService(storage.store);
    const detect = (scope: string) =>
      alerts.handle({ findings: [{ merchantId: 'm_1', ruleId: 'velocity_attack', finding: makeFinding('high', Date.now(), scope) }], ruleErrors: [] });
    storage.writes.holding = true;
    detect('pk_first'); // due in 50 ms
    void alerts.flush(); // written at once, and held
    await vi.advanceTimersByTimeAsync(0);
    detect('pk_second');
    await vi.advanceTimersByTimeAsync(50); // the timer's flush waits for the held write
    return { ...storage, alerts, open };
  }

  it('answers a change only once it is stored, even when a timer\'s flush takes the next write', async () => {
    const { rows, releaseOne, writes, alerts, open } = await timerFlushWaiting();
    const statusWhenAnswered = alerts.changeStatus(open.id, 'm_1', acknowledge).then(() => rows.get(open.id)?.status);
    await vi.advanceTimersByTimeAsync(0);
    for (let i = 0; i < 5; i++) await releaseOne();
    writes.holding = false;
    await releaseOne();
    expect(await statusWhenAnswered).toBe('acknowledged');
    await alerts.stop();
  });

  it('flush resolves only once every alert unsaved when it was called is stored, even when a timer\'s flush took them', async () => {
    const { rows, releaseOne, writes, alerts } = await timerFlushWaiting();
    const storedWhenFlushed = alerts.flush().then(() => [...rows.values()].map((alert) => alert.scope).sort());
    for (let i = 0; i < 5; i++) await releaseOne();
    writes.holding = false;
    await releaseOne();
    expect(await storedWhenFlushed).toEqual(['pk_first', 'pk_live_a', 'pk_second']);
    await alerts.stop();
  });
});

describe('AlertService memory of closed alerts', () => {
  it('loads the closed alerts as far back as the manager remembers them, and forgets older ones at each sync', async () => {
    let now = T0;
    const manager = new AlertManager({ suppressionMs: 3_600_000, now: () => now });
    const loadedSince: number[] = [];
    const resolvedAt = T0 - 3_600_000;
    const store = fake<AlertStore>({
      save: async () => undefined,
      getMany: async () => [],
      loadForDedup: async (since: Date) => (loadedSince.push(since.getTime()), [testAlert(resolvedAt, { status: 'resolved', updatedAt: new Date(resolvedAt).toISOString() })]),
      changedSince: async () => [],
    });
    const alerts = new AlertService(manager, store, RULES, new WorkerMetrics({ defaultMetrics: false }), createLogger('silent'));
    const startedAt = Date.now();
    await alerts.start();
    try {
      expect(loadedSince).toHaveLength(1);
      expect(Math.abs(loadedSince[0]! - (startedAt - 24 * 3_600_000))).toBeLessThan(5_000);
      now = resolvedAt + 24 * 3_600_000 + 1;
      await alerts.syncWithStore();
      expect(manager.forgetClosed()).toBe(0); // the sync forgot it already
    } finally {
      await alerts.stop();
    }
  });
});

/** An open high velocity_attack alert of pk_live_a, created at T0 (its rule's findings update it). */
const velocity = () => testAlert(T0, { type: 'velocity_attack', ruleId: 'velocity_attack', severity: 'high', riskScore: 0.8, recommendedAction: 'rate_limit' });

/** A started service over `store`, on the (fake) clock. */
async function started(store: AlertStore, onCritical?: AlertServiceHooks['onCritical']) {
  const alerts = new AlertService(new AlertManager({ suppressionMs: 3_600_000, now: () => Date.now() }), store, RULES, new WorkerMetrics({ defaultMetrics: false }), createLogger('silent'), { onCritical });
  await alerts.start();
  return alerts;
}

describe('AlertService while a status change is written, or after it lost', () => {
  beforeEach(() => {
    vi.useFakeTimers({ now: T0 });
  });
  afterEach(() => {
    vi.useRealTimers();
  });
  const detected = (alerts: AlertService, severity: Severity) =>
    alerts.handle({ findings: [{ merchantId: 'm_1', ruleId: 'velocity_attack', finding: makeFinding(severity, Date.now(), 'pk_live_a') }], ruleErrors: [] });

  it('silences the key of an alert being dismissed: an escalation meanwhile notifies no one and is not stored', async () => {
    const open = velocity();
    const { rows, store, writes, releaseOne } = memoryStore(open);
    const notified: string[] = [];
    const alerts = await started(store, (alert, change) => notified.push(`${alert.id}:${change}`));
    writes.holding = true;
    const dismissing = alerts.changeStatus(open.id, 'm_1', { to: 'dismissed', actor: 'alice', note: 'our own load test' });
    await vi.advanceTimersByTimeAsync(0);
    // The dismissal is decided and being written; detection escalates the alert meanwhile.
    await vi.advanceTimersByTimeAsync(5);
    detected(alerts, 'critical');
    writes.holding = false;
    await releaseOne();
    expect((await dismissing)?.ok).toBe(true);
    await alerts.flush();
    expect({ status: rows.get(open.id)?.status, severity: rows.get(open.id)?.severity, notified }).toEqual({ status: 'dismissed', severity: 'high', notified: [] });
    await alerts.stop();
  });

  it('forgets a dismissal whose write failed: the next finding is counted, and notified when critical', async () => {
    const open = velocity();
    const { rows, store, writes } = memoryStore(open);
    const notified: string[] = [];
    const alerts = await started(store, (alert, change) => notified.push(`${alert.id}:${change}`));
    writes.failing = true;
    await expect(alerts.changeStatus(open.id, 'm_1', { to: 'dismissed', actor: 'alice', note: 'our own load test' })).rejects.toThrow('storage is down');
    writes.failing = false;
    await vi.advanceTimersByTimeAsync(5);
    detected(alerts, 'critical');
    await alerts.flush();
    expect({ status: rows.get(open.id)?.status, severity: rows.get(open.id)?.severity, notified }).toEqual({ status: 'open', severity: 'critical', notified: [`${open.id}:escalated`] });
    await alerts.stop();
  });

  it('forgets a change answered as made once a conflicting one stands instead: no later write of its own brings it back', async () => {
    const open = velocity();
    const { rows, store } = memoryStore(open);
    const alerts = await started(store);
    expect(await alerts.changeStatus(open.id, 'm_1', { to: 'dismissed', actor: 'alice', note: 'our load test' })).toMatchObject({ ok: true });
    // A stale write lands over alice's dismissal, and bob acknowledges the alert through another replica, decided on that copy.
    await vi.advanceTimersByTimeAsync(5);
    const bob = changeStatus(open, 'acknowledged', 'bob', undefined, Date.now());
    if (!bob.ok) throw new Error('refused');
    rows.set(open.id, bob.alert);
    await vi.advanceTimersByTimeAsync(2_100); // the read-back finds alice's dismissal lost to bob's move
    // Detection here counts a repeat of the attack (the key is not silenced here) and writes it.
    detected(alerts, 'high');
    await alerts.flush();
    const stored = rows.get(open.id)!;
    expect(stored.history.map((entry) => `${entry.actor}:${entry.from}->${entry.to}`)).toEqual(['system:null->open', 'bob:open->acknowledged']);
    expect(stored).toMatchObject({ status: 'acknowledged', occurrences: 2 });
    await alerts.stop();
  });
});

describe('AlertService reading the other replicas\' alerts', () => {
  beforeEach(() => {
    vi.useFakeTimers({ now: T0 });
  });
  afterEach(() => {
    vi.useRealTimers();
  });
  /** A started service over a store whose every alert counts as written by another replica since the last read. */
  const replica = async (...alerts: Alert[]) => {
    const storage = memoryStore(...alerts);
    storage.store.changedSince = async () => [...storage.rows.values()];
    return { ...storage, service: await started(storage.store) };
  };

  it('writes what it knows over a stored copy a stale write weakened, with no finding to update the alert', async () => {
    const escalated = { ...velocity(), severity: 'critical', riskScore: 0.95, recommendedAction: 'block', occurrences: 4, lastSeenAt: new Date(T0 + 4_000).toISOString() } as const;
    const { rows, service, writes } = await replica(escalated);
    // Another replica's write made from an older copy (a key's previous owner, say) lands over it.
    const stale = { ...velocity(), occurrences: 2, lastSeenAt: new Date(T0 + 2_000).toISOString(), updatedAt: new Date(T0 + 5_000).toISOString() };
    rows.set(stale.id, stale);
    await vi.advanceTimersByTimeAsync(1_000);
    const written = writes.count;
    await service.syncWithStore();
    await vi.advanceTimersByTimeAsync(100);
    expect(writes.count).toBe(written + 1);
    expect(rows.get(stale.id)).toMatchObject({ severity: 'critical', riskScore: 0.95, recommendedAction: 'block', occurrences: 4, lastSeenAt: escalated.lastSeenAt });
    // Stored as known: the next read writes nothing.
    await service.syncWithStore();
    await vi.advanceTimersByTimeAsync(100);
    expect(writes.count).toBe(written + 1);
    await service.stop();
  });

  it('writes the alert reopened when it counted a recurrence before it heard of a resolution made elsewhere', async () => {
    const open = velocity();
    const { rows, service } = await replica(open);
    // Acknowledged and resolved through another replica at T0 + 1 s.
    const acknowledged = changeStatus(open, 'acknowledged', 'alice', undefined, T0 + 500);
    if (!acknowledged.ok) throw new Error('refused');
    const resolved = changeStatus(acknowledged.alert, 'resolved', 'alice', 'key rotated', T0 + 1_000);
    if (!resolved.ok) throw new Error('refused');
    rows.set(open.id, resolved.alert);
    // The attack comes back at T0 + 2 s; this replica (the key's owner) thinks the alert open: a repeat, written within 5 s.
    await vi.advanceTimersByTimeAsync(2_000);
    service.handle({ findings: [{ merchantId: 'm_1', ruleId: 'velocity_attack', finding: makeFinding('high', Date.now(), 'pk_live_a') }], ruleErrors: [] });
    await vi.advanceTimersByTimeAsync(10_000); // its read of the others' alerts, and its write
    const stored = rows.get(open.id)!;
    expect(stored).toMatchObject({ status: 'open', lastSeenAt: new Date(T0 + 2_000).toISOString() });
    expect(stored.history.map((entry) => `${entry.actor}:${entry.from}->${entry.to}`)).toEqual([
      'system:null->open',
      'alice:open->acknowledged',
      'alice:acknowledged->resolved',
      'system:resolved->open',
    ]);
    await service.stop();
  });
});

describe('AlertService storage failures in the log', () => {
  beforeEach(() => {
    vi.useFakeTimers({ now: T0 });
  });
  afterEach(() => {
    vi.useRealTimers();
  });

  it('logs a failing write and a failing read of the others\' alerts when they start (with the cause), once a minute while they last, and once when they work again', async () => {
    const lines: { level: number; msg: string; occurrences?: number; failures?: number; err?: { message: string } }[] = [];
    const logger = createLogger('info', { write: (line: string) => void lines.push(JSON.parse(line)) });
    const { store, writes } = memoryStore();
    const reads = { failing: false, failed: 0 };
    store.changedSince = async () => {
      if (!reads.failing) return [];
      reads.failed++;
      throw new Error('connect ECONNREFUSED 10.0.0.9:8123');
    };
    let failedWrites = 0;
    const save = store.save.bind(store);
    store.save = async (...args: Parameters<AlertStore['save']>) => {
      if (writes.failing) failedWrites++;
      return save(...args);
    };
    const alerts = new AlertService(new AlertManager({ suppressionMs: 3_600_000, now: () => Date.now() }), store, RULES, new WorkerMetrics({ defaultMetrics: false }), logger);
    await alerts.start();
    writes.failing = true; // 'storage is down'
    reads.failing = true;
    alerts.handle({ findings: [{ merchantId: 'm_1', ruleId: 'velocity_attack', finding: makeFinding('high', Date.now(), 'pk_live_a') }], ruleErrors: [] });
    await vi.advanceTimersByTimeAsync(150_000); // the write is retried every second, the read made every 5 s
    writes.failing = false;
    reads.failing = false;
    await vi.advanceTimersByTimeAsync(6_000);
    await alerts.stop();

    const still = ' (still; logged at most once a minute)';
    for (const [what, recovery, level, failures, perMinute, cause] of [
      ['storing alerts failed; retrying', 'alerts are stored again', 50, failedWrites, 60, 'storage is down'],
      ['reading alerts written by other replicas failed; trying again', 'alerts written by other replicas are read again', 40, reads.failed, 12, 'connect ECONNREFUSED 10.0.0.9:8123'],
    ] as const) {
      const logged = lines.filter((line) => line.msg.startsWith(what) || line.msg === recovery);
      expect(logged.map((line) => [line.level, line.msg, line.occurrences])).toEqual([
        [level, what, 1],
        [level, what + still, perMinute],
        [level, what + still, perMinute],
        [30, recovery, undefined],
      ]);
      expect(logged[0]!.err?.message).toBe(cause);
      expect(logged.at(-1)!.failures).toBe(failures); // every failure counted
    }
  });
});
