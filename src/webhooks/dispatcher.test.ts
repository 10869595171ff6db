/**
 * The dispatcher's promises to detection, with storage faked: notify never throws or waits, and the
 * notifications waiting for storage are capped. Delivery itself is tested on the real engine in
 * test/integration/webhook-delivery.test.ts; the schedule's arithmetic is here.
 */
import { describe, expect, it } from 'vitest';
import type { Alert } from '../alerts/alert.ts';
import { testAlert } from '../alerts/test-findings.ts';
import { createLogger } from '../logger.ts';
import { WorkerMetrics } from '../metrics.ts';
import type { WebhookStore } from '../store/webhook-store.ts';
import { ALERT_EVENT, ATTEMPT_SCHEDULE_MS, nextAttemptAt, WebhookDispatcher, webhookBody } from './dispatcher.ts';
import { targetPolicy } from './target-policy.ts';
import { waitFor } from '../../test/support/worker.ts';

function alert(i: number): Alert {
  return testAlert(Date.UTC(2026, 10, 21, 10, 0, 0), { id: `00000000-0000-4000-8000-${String(i).padStart(12, '0')}` });
}

/** A store whose writes never finish: what a hung storage looks like to the dispatcher. */
function stalledStore(): WebhookStore {
  const never = () => new Promise<never>(() => undefined);
  return { endpoints: never, saveMessages: never, pendingMessages: never, loadBreakers: async () => [], nextVersion: () => 1 } as unknown as WebhookStore;
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
    const store = {
      nextVersion: () => 1,
      // Each try to store hangs until the test fails it, as a storage outage's timeouts do.
      endpoints: () => new Promise((_, reject) => ((failStore = reject), stores++)),
    } as unknown as WebhookStore;
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
    const store = { endpoints: async () => new Map(), saveMessages: async () => undefined, loadBreakers: async () => [] } as unknown as WebhookStore;
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
    const store = {
      saveHeartbeat: async () => undefined,
      loadBreakers: async () => [],
      pendingMessages: () => new Promise<[]>((resolve) => (release = resolve)),
    } as unknown as WebhookStore;
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
    const fails = async () => {
      if (storageDown) throw new Error('storage is down');
      return [];
    };
    const store = { saveHeartbeat: fails, loadBreakers: fails, pendingMessages: fails, endpoints: async () => new Map(), saveMessages: async () => undefined } as unknown as WebhookStore;
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
