/**
 * The dispatcher's promises to detection, with storage faked: notify never throws or waits, and the
 * notifications waiting for storage are capped. Delivery itself is tested on the real engine in
 * test/integration/webhook-delivery.test.ts; the schedule's arithmetic is here.
 */
import { describe, expect, it, vi } from 'vitest';
import { fake } from '../../test/support/fake.ts';
import type { Alert } from '../alerts/alert.ts';
import { testAlert } from '../alerts/test-findings.ts';
import { createLogger } from '../logger.ts';
import { WorkerMetrics } from '../metrics.ts';
import type { ClaimVerdict, PendingMessage, WebhookMessage, WebhookStore } from '../store/webhook-store.ts';
import { ALERT_EVENT, ATTEMPT_SCHEDULE_MS, nextAttemptAt, WebhookDispatcher, webhookBody } from './dispatcher.ts';
import { targetPolicy } from './target-policy.ts';
import { waitFor } from '../../test/support/worker.ts';

function alert(i: number): Alert {
  return testAlert(Date.UTC(2026, 10, 21, 10, 0, 0), { id: `00000000-0000-4000-8000-${String(i).padStart(12, '0')}` });
}

/** A store whose writes never finish: what a hung storage looks like to the dispatcher. */
function stalledStore(): WebhookStore {
  const never = () => new Promise<never>(() => undefined);
  return fake<WebhookStore>({ endpoints: never, saveMessages: never, pendingMessages: never, loadBreakers: async () => [], nextVersion: () => 1 });
}

describe('webhookBody', () => {
  it('is the contract body: event, alertId, merchantId, the alert without its internal scope, timestamp', () => {
    const body = JSON.parse(webhookBody(alert(1), Date.UTC(2026, 10, 21, 10, 0, 1, 5)));
    expect(body).toMatchObject({ event: ALERT_EVENT, alertId: alert(1).id, merchantId: 'm_1', timestamp: '2026-11-21T10:00:01.005Z' });
    expect(body.data).toMatchObject({ id: alert(1).id, type: 'bot_traffic', severity: 'critical', apiKeyId: 'pk_live_a' });
    expect(body.data).not.toHaveProperty('scope');
  });
});

describe('WebhookDispatcher.notify', () => {
  it('never throws or waits, and caps what waits for storage: the rest is dropped and counted', async () => {
    const metrics = new WorkerMetrics({ defaultMetrics: false });
    const dispatcher = new WebhookDispatcher({
      store: stalledStore(),
      oncall: { url: 'https://oncall.example.com/hook', secret: 'x'.repeat(32) },
      policy: targetPolicy(),
      metrics,
      logger: createLogger('silent'),
      maxUnsaved: 10,
    });
    const started = performance.now();
    for (let i = 0; i < 25; i++) expect(() => dispatcher.notify(alert(i))).not.toThrow();
    expect(performance.now() - started).toBeLessThan(1_000);
    expect(dispatcher.stats()).toMatchObject({ unsaved: 10, maxUnsaved: 10 });
    expect((await metrics.webhookNotificationsDropped.get()).values[0]?.value).toBe(15);
  });

  it('counts the notifications being stored in the cap, so a storage outage cannot grow what is held', async () => {
    const metrics = new WorkerMetrics({ defaultMetrics: false });
    let failStore: (error: Error) => void = () => undefined;
    let stores = 0;
    const store = fake<WebhookStore>({
      nextVersion: () => 1,
      // Each try to store hangs until the test fails it, as a storage outage's timeouts do.
      endpoints: () => new Promise((_, reject) => ((failStore = reject), stores++)),
    });
    const dispatcher = new WebhookDispatcher({
      store,
      oncall: { url: 'https://oncall.example.com/hook', secret: 'x'.repeat(32) },
      policy: targetPolicy(),
      metrics,
      logger: createLogger('silent'),
      maxUnsaved: 10,
    });
    const dropped = async () => (await metrics.webhookNotificationsDropped.get()).values[0]?.value ?? 0;
    for (let retry = 1; retry <= 3; retry++) {
      for (let i = 0; i < 10; i++) dispatcher.notify(alert(i));
      await waitFor(() => stores === retry, 'a try to store the notifications', 5_000);
      for (let i = 0; i < 5; i++) dispatcher.notify(alert(i)); // arriving while that try is under way
      expect(dispatcher.stats().unsaved).toBe(10);
      failStore(new Error('storage is down'));
      await waitFor(() => stores === retry + 1 || retry === 3, 'the retry', 5_000);
    }
    expect(dispatcher.stats()).toMatchObject({ unsaved: 10, maxUnsaved: 10 });
    expect(await dropped()).toBe(3 * 15 - 10); // all but the first ten
    const stopping = dispatcher.stop(); // tries to store what it holds once more
    await waitFor(() => stores === 4, 'the last try', 5_000);
    failStore(new Error('storage is down'));
    await stopping;
  });

  it('after stop, drops and counts instead of throwing', async () => {
    const metrics = new WorkerMetrics({ defaultMetrics: false });
    const store = fake<WebhookStore>({ endpoints: async () => new Map(), saveMessages: async () => undefined, loadBreakers: async () => [] });
    const dispatcher = new WebhookDispatcher({ store, policy: targetPolicy(), metrics, logger: createLogger('silent') });
    await dispatcher.stop();
    expect(() => dispatcher.notify(alert(1))).not.toThrow();
    expect(dispatcher.stats().unsaved).toBe(0);
    expect((await metrics.webhookNotificationsDropped.get()).values[0]?.value).toBe(1);
  });
});

describe('WebhookDispatcher.stop', () => {
  it('waits for the read of due messages in progress, so storage is not closed under it', async () => {
    let release: (rows: []) => void = () => undefined;
    const store = fake<WebhookStore>({
      saveHeartbeat: async () => undefined,
      loadBreakers: async () => [],
      pendingMessages: () => new Promise<[]>((resolve) => (release = resolve)),
    });
    const dispatcher = new WebhookDispatcher({ store, policy: targetPolicy(), metrics: new WorkerMetrics({ defaultMetrics: false }), logger: createLogger('silent') });
    await dispatcher.start();

    let stopped = false;
    const stopping = dispatcher.stop().then(() => (stopped = true));
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(stopped).toBe(false);
    release([]);
    await stopping;
    expect(stopped).toBe(true);
  });
});

describe('WebhookDispatcher.up (security_center_webhook_dispatcher_up)', () => {
  it('is 0 until start-up is done, 1 once started, 0 while its storage fails and again after stop', async () => {
    const metrics = new WorkerMetrics({ defaultMetrics: false });
    let storageDown = true;
    const failsWhileDown = async () => {
      if (storageDown) throw new Error('storage is down');
    };
    const nothingOrFails = async () => (await failsWhileDown(), []);
    const store = fake<WebhookStore>({ saveHeartbeat: failsWhileDown, loadBreakers: nothingOrFails, pendingMessages: nothingOrFails, endpoints: async () => new Map(), saveMessages: async () => undefined });
    const dispatcher = new WebhookDispatcher({ store, policy: targetPolicy(), metrics, logger: createLogger('silent'), pollIntervalMs: 10, rescanIntervalMs: 10 });
    metrics.reportWebhookDispatcherUp(() => dispatcher.up);
    const gauge = async () => (await metrics.registry.getSingleMetric('security_center_webhook_dispatcher_up')!.get()).values[0]?.value;
    await expect(dispatcher.start()).rejects.toThrow('storage is down');
    expect(await gauge()).toBe(0);
    storageDown = false;
    await dispatcher.start();
    expect(await gauge()).toBe(1);
    storageDown = true; // the next read of due messages fails
    await waitFor(async () => (await gauge()) === 0, 'the gauge follows a failed read', 2_000);
    storageDown = false;
    await waitFor(async () => (await gauge()) === 1, 'the gauge follows a read that succeeds again', 2_000);
    await dispatcher.stop();
    expect(await gauge()).toBe(0);
  });
});

describe('nextAttemptAt', () => {
  const [, oneMinute, fiveMinutes] = ATTEMPT_SCHEDULE_MS as [number, number, number];
  it.each([
    ['the second attempt, after a first on time', 1, 0, oneMinute],
    ['the third attempt, after a second on time', 2, oneMinute, fiveMinutes],
    ['the second attempt, after a first a minute late (adopted): a minute after it', 1, oneMinute, 2 * oneMinute],
    ['the third attempt, after a second made at 3 minutes: the 4-minute step after it', 2, 3 * oneMinute, 7 * oneMinute],
    ['none after the third', 3, fiveMinutes, Number.POSITIVE_INFINITY],
  ])('%s', (_case, attempt, at, due) => {
    const createdAt = Date.UTC(2026, 10, 21, 10, 0, 0);
    expect(nextAttemptAt(createdAt, attempt, createdAt + at)).toBe(createdAt + due);
  });
});

/**
 * A fake store serving one pending on-call message (to a loopback URL, which the default target
 * policy refuses at send time: an attempt without network), and recording what is written.
 */
function oneMessageStore(message: Partial<PendingMessage>, options: { verdict?: ClaimVerdict } = {}) {
  const now = Date.UTC(2026, 10, 21, 10, 0, 0);
  const pending: PendingMessage = {
    id: '00000000-0000-4000-8000-000000000001',
    alertId: '00000000-0000-4000-8000-000000000002',
    merchantId: 'm_1',
    destination: 'oncall',
    endpointId: '',
    target: '',
    body: '{}',
    status: 'pending',
    owner: 'replica-a',
    attempts: 0,
    nextAttemptAt: now,
    lastOutcome: '',
    lastError: '',
    attemptLog: [],
    createdAt: now,
    updatedAt: now,
    dueAt: now,
    storedVersion: 7,
    ...message,
  };
  const written: WebhookMessage[] = [];
  const claims: { owner: string; leaseUntil: number }[] = [];
  let served = false;
  const store = fake<WebhookStore>({
    nextVersion: () => 1,
    saveHeartbeat: async () => undefined,
    loadBreakers: async () => [],
    saveBreakers: async () => undefined,
    endpoints: async () => new Map(),
    pendingMessages: async () => (served ? [] : ((served = true), [pending])),
    saveMessages: async (messages: WebhookMessage[]) => void written.push(...messages),
    claimMessage: async (_message: PendingMessage, owner: string, leaseUntil: number) => (claims.push({ owner, leaseUntil }), pending.storedVersion + 1),
    claimStands: async () => options.verdict ?? 'claimed',
  });
  return { store, now, written, claims };
}

function dispatcherOn(store: WebhookStore, now: number, owner = 'replica-a') {
  return new WebhookDispatcher({
    store,
    owner,
    now: () => now,
    oncall: { url: 'https://127.0.0.1/hook', secret: 'x'.repeat(32) },
    policy: targetPolicy(), // refuses loopback: the attempt ends as blocked_target without a request
    metrics: new WorkerMetrics({ defaultMetrics: false }),
    logger: createLogger('silent'),
    pollIntervalMs: 10,
    rescanIntervalMs: 60_000,
  });
}

describe('WebhookDispatcher: adopted messages', () => {
  it('claims another replica\'s message before attempting it, and attempts it only when the claim stands', async () => {
    const { store, now, written, claims } = oneMessageStore({ owner: 'replica-a' });
    const dispatcher = dispatcherOn(store, now, 'replica-b');
    await dispatcher.start();
    try {
      await waitFor(() => written.length === 1, 'the attempt stored', 5_000);
      expect(claims).toEqual([{ owner: 'replica-b', leaseUntil: expect.any(Number) }]);
      expect(claims[0]!.leaseUntil).toBeGreaterThan(now);
      expect(written[0]).toMatchObject({ owner: 'replica-b', attempts: 1, lastOutcome: 'blocked_target' });
    } finally {
      await dispatcher.stop();
    }
  });

  it.each(['taken', 'owner_alive'] as const)('makes no attempt when the claim read back is %s', async (verdict) => {
    const { store, now, written, claims } = oneMessageStore({ owner: 'replica-a' }, { verdict });
    const dispatcher = dispatcherOn(store, now, 'replica-b');
    await dispatcher.start();
    try {
      await waitFor(() => claims.length === 1, 'the claim', 5_000);
      await new Promise((resolve) => setTimeout(resolve, 1_500)); // the claim's wait (2 polls + 1 s) and more
      expect(written).toEqual([]);
    } finally {
      await dispatcher.stop();
    }
  });

  it('does not claim its own messages', async () => {
    const { store, now, written, claims } = oneMessageStore({ owner: 'replica-a' });
    const dispatcher = dispatcherOn(store, now, 'replica-a');
    await dispatcher.start();
    try {
      await waitFor(() => written.length === 1, 'the attempt stored', 5_000);
      expect(claims).toEqual([]);
    } finally {
      await dispatcher.stop();
    }
  });
});

describe('WebhookDispatcher: the 15-minute budget', () => {
  it('makes the first attempt however late (a message stored late), and expires a retry due past the budget', async () => {
    const late = oneMessageStore({ owner: 'replica-a' });
    const first = dispatcherOn(late.store, late.now + 20 * 60_000);
    await first.start();
    await waitFor(() => late.written.length === 1, 'the attempt stored', 5_000);
    await first.stop();
    expect(late.written[0]).toMatchObject({ status: 'failed', attempts: 1, lastOutcome: 'blocked_target' });

    const retry = oneMessageStore({ owner: 'replica-a', attempts: 1 });
    const second = dispatcherOn(retry.store, retry.now + 20 * 60_000);
    await second.start();
    await waitFor(() => retry.written.length === 1, 'the outcome stored', 5_000);
    await second.stop();
    expect(retry.written[0]).toMatchObject({ status: 'failed', attempts: 1, lastOutcome: 'expired' });
  });
});

describe('WebhookDispatcher: a stale heartbeat', () => {
  it('reads and attempts nothing while its last stored heartbeat is half the adoption delay old, and reads again once one is stored', async () => {
    let now = Date.UTC(2026, 10, 21, 10, 0, 0);
    let heartbeatsFail = false;
    let reads = 0;
    const store = fake<WebhookStore>({
      saveHeartbeat: async () => {
        if (heartbeatsFail) throw new Error('storage is down');
      },
      loadBreakers: async () => [],
      pendingMessages: async () => (reads++, []),
    });
    const dispatcher = new WebhookDispatcher({
      store,
      now: () => now,
      adoptAfterMs: 60_000,
      policy: targetPolicy(),
      metrics: new WorkerMetrics({ defaultMetrics: false }),
      logger: createLogger('silent'),
      pollIntervalMs: 10,
      rescanIntervalMs: 10,
    });
    await dispatcher.start();
    try {
      await waitFor(() => reads > 3, 'reads every poll', 2_000);
      heartbeatsFail = true;
      now += 30_000; // its heartbeat, which fails from now on, is 30 s old
      await new Promise((resolve) => setTimeout(resolve, 100));
      const readsWhileStale = reads;
      await new Promise((resolve) => setTimeout(resolve, 300));
      expect(reads).toBe(readsWhileStale);
      expect(dispatcher.up).toBe(false);
      heartbeatsFail = false;
      await waitFor(() => reads > readsWhileStale + 3, 'reads again once a heartbeat is stored', 2_000);
      expect(dispatcher.up).toBe(true);
    } finally {
      await dispatcher.stop();
    }
  });
});

describe('WebhookDispatcher: storage failures in the log', () => {
  it('logs each retry loop\'s failure when it starts (with its cause), once a minute while it lasts (with the count), and once when storage is back', async () => {
    vi.useFakeTimers({ now: Date.UTC(2026, 10, 21, 10, 0, 0) });
    const lines: { level: number; msg: string; occurrences?: number; failures?: number; err?: { message: string } }[] = [];
    const failed = { endpoints: 0, saveHeartbeat: 0, pendingMessages: 0, loadBreakers: 0 };
    let down = false;
    const answer = <T>(op: keyof typeof failed, value: T) => async () => {
      if (!down) return value;
      failed[op]++;
      throw new Error('connect ECONNREFUSED 10.0.0.9:8123');
    };
    const store = fake<WebhookStore>({
      nextVersion: () => 1,
      endpoints: answer('endpoints', new Map()),
      saveMessages: async () => undefined,
      saveHeartbeat: answer('saveHeartbeat', undefined),
      loadBreakers: answer('loadBreakers', []),
      pendingMessages: answer('pendingMessages', []),
    });
    const dispatcher = new WebhookDispatcher({
      store,
      policy: targetPolicy(),
      metrics: new WorkerMetrics({ defaultMetrics: false }),
      logger: createLogger('info', { write: (line: string) => void lines.push(JSON.parse(line)) }),
    });
    try {
      await dispatcher.start();
      down = true;
      dispatcher.notify(alert(1)); // storing it is retried every second; the heartbeat, at every poll once one failed
      await vi.advanceTimersByTimeAsync(150_000);
      down = false;
      await vi.advanceTimersByTimeAsync(2_000);
    } finally {
      await dispatcher.stop();
      vi.useRealTimers();
    }
    const linesOf = (what: string, recovery: string) => lines.filter((line) => line.msg.startsWith(what) || line.msg === recovery);
    const still = ' (still; logged at most once a minute)';
    for (const [what, recovery, failures] of [
      ['storing webhook messages failed; retrying', 'webhook messages are stored again', failed.endpoints],
      ['storing the webhook heartbeat failed; retrying', 'the webhook heartbeat is stored again', failed.saveHeartbeat],
    ] as const) {
      const logged = linesOf(what, recovery);
      expect(logged.map((line) => [line.level, line.msg])).toEqual([[50, what], [50, what + still], [50, what + still], [30, recovery]]);
      expect(logged[0]!.err?.message).toBe('connect ECONNREFUSED 10.0.0.9:8123');
      expect(logged.map((line) => line.occurrences)).toEqual([1, 60, 60, undefined]); // one failure a second
      expect(logged.at(-1)!.failures).toBe(failures); // every failure counted
    }
    expect(lines).toHaveLength(8); // where a line per failure made about 290
  });
});
