/**
 * Detection end to end, on the real broker and ClickHouse: a mixed stream of a few hundred ordinary
 * keys (with benign look-alikes) and one planted attack of each type; exactly the five attacks alert,
 * each with the right type, key and evidence. Then an attack that straddles a worker restart is
 * still caught, because the new worker warms its windows from ClickHouse: as of the partition's own
 * times when it restarts behind, and again when a rebalance cuts the warm-up short (a partition a
 * replica keeps through a rebalance is not read again), each partition with its share of the windows'
 * budget. A key's new owner continues the alert its previous owner opened. A key's networks of the
 * last days outlive a restart (key_networks_1d), so a daily job from many networks alerts once. An
 * attack that worsens within REJUDGE_MS of its first finding and then stops is still judged, with no
 * later event to prompt it. A network trying many keys alerts each merchant once, also across a
 * restart; a test key's alerts are low.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import type { Alert } from '../../src/alerts/alert.ts';
import type { Worker } from '../../src/main.ts';
import type { ClickHouse } from '../../src/store/clickhouse.ts';
import { networkOf } from '../../rules/network.ts';
import { adminCall, ADMIN_ENV, token } from '../support/admin.ts';
import { useEngines } from '../support/engines.ts';
import { groupCaughtUp, produceAll, readTopic } from '../support/kafka.ts';
import { metricTotal, scrapeMetric, TEST_INGEST_TOKEN, testConfig, testNames, waitFor, waitForPartitionsSplit } from '../support/worker.ts';

const MINUTE = 60_000;
const LIBRARY_AGENTS = ['okhttp/4.12.0', 'python-requests/2.32.3', 'axios/1.7.7', 'Go-http-client/2.0', 'curl/8.5.0', 'Java/17.0.2'];

type Event = Record<string, unknown> & { apiKeyId: string };
let sequence = 0;

function event(apiKeyId: string, timestamp: number, overrides: Partial<Event> = {}): Event {
  return {
    eventId: `evt_${apiKeyId}_${sequence++}`,
    timestamp: new Date(timestamp).toISOString(),
    merchantId: `m_${apiKeyId.slice(-3)}`,
    plan: 'business',
    apiKeyId,
    environment: 'live',
    ip: '10.1.1.5',
    userAgent: 'okhttp/4.12.0',
    method: 'POST',
    path: '/v1/verify/sessions',
    status: 201,
    responseTimeMs: 80,
    country: 'DE',
    ...overrides,
  };
}

/** count events spread evenly over [start, start + span). */
function spread(count: number, start: number, span: number, make: (timestamp: number, i: number) => Event): Event[] {
  return Array.from({ length: count }, (_, i) => make(start + Math.floor((i * span) / count), i));
}

function ordinaryTraffic(runId: string, now: number): Event[] {
  const events: Event[] = [];
  for (let k = 0; k < 300; k++) {
    const key = `pk_live_${runId}_ok${String(k).padStart(3, '0')}`;
    const plan = k % 2 ? 'business' : 'enterprise';
    events.push(
      ...spread(25, now - 5 * MINUTE, 5 * MINUTE, (t, i) =>
        event(key, t, {
          plan,
          ip: `10.${k >> 8}.${k & 255}.${5 + (i % 3)}`,
          userAgent: LIBRARY_AGENTS[k % LIBRARY_AGENTS.length],
          status: i % 29 === 0 ? 400 : i % 31 === 0 ? 404 : 201,
          path: i % 2 ? '/v1/verify/sessions' : '/v1/verify/sessions/:id',
          method: i % 2 ? 'POST' : 'GET',
        }),
      ),
    );
  }
  // Benign look-alikes.
  const lookAlike = (name: string) => `pk_live_${runId}_${name}`;
  events.push(...spread(60, now - 4 * MINUTE, 2 * MINUTE, (t) => event(lookAlike('outage'), t, { status: 503 }))); // the API's own fault
  events.push(...spread(80, now - 3 * MINUTE, MINUTE, (t) => event(lookAlike('throttled'), t, { status: 429 }))); // the limiter working
  events.push(...spread(120, now - 4 * MINUTE, MINUTE, (t) => event(lookAlike('oneburst'), t))); // one spike minute
  events.push(
    ...spread(12, now - 4 * MINUTE, 3 * MINUTE, (t, i) =>
      event(lookAlike('e2etests'), t, { userAgent: 'Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) HeadlessChrome/120.0.0.0 Safari/537.36', path: `/v1/verify/sessions/:id`, method: i % 2 ? 'GET' : 'POST' }),
    ),
  );
  // An attack tool on a plan without the Security Center: stored, never evaluated.
  events.push(event(lookAlike('proplan'), now - MINUTE, { plan: 'pro', userAgent: 'sqlmap/1.7.2#stable (https://sqlmap.org)' }));
  return events;
}

function plantedAttacks(runId: string, now: number): Record<string, { key: string; events: Event[] }> {
  const key = (name: string) => `pk_live_${runId}_${name}`;
  const currentMinute = Math.floor(now / MINUTE) * MINUTE;
  return {
    velocity_attack: {
      key: key('velocity'),
      events: [3, 2, 1].flatMap((ago) => spread(200, currentMinute - ago * MINUTE, MINUTE, (t) => event(key('velocity'), t))),
    },
    impossible_travel: {
      key: key('travel'),
      events: [
        ...spread(5, now - 9 * MINUTE, MINUTE, (t) => event(key('travel'), t, { ip: '81.2.69.142', country: undefined })), // London
        ...spread(5, now - 3 * MINUTE, MINUTE, (t) => event(key('travel'), t, { ip: '8.8.8.8', country: undefined })), // California
      ],
    },
    high_failure_rate: {
      key: key('failures'),
      events: spread(80, now - 6 * MINUTE, 5 * MINUTE, (t, i) => event(key('failures'), t, { status: i % 8 === 0 ? 201 : 401 })),
    },
    bot_traffic: {
      key: key('sqlmap'),
      events: [event(key('sqlmap'), now - 2 * MINUTE, { userAgent: 'sqlmap/1.7.2#stable (https://sqlmap.org)', path: "/v1/verify/sessions/1' OR '1'='1" })],
    },
    credential_sharing: {
      key: key('shared'),
      events: [
        // An hour of calls from one network, then the key turns up in eight networks in four countries.
        ...spread(10, now - 55 * MINUTE, 45 * MINUTE, (t) => event(key('shared'), t, { ip: '10.9.9.9' })),
        ...spread(16, now - 8 * MINUTE, 7 * MINUTE, (t, i) =>
          event(key('shared'), t, { ip: `172.${16 + (i % 8)}.${i % 8}.10`, country: ['DE', 'BR', 'JP', 'US'][i % 4] }),
        ),
      ],
    },
  };
}

/**
 * Storage for a worker whose Kafka partitions' warm-up reads (not the HTTP events') are watched:
 * `onRead` hears of each, `onRows` of each page of events it loads, and with `page` their rows come
 * `size` at a time, each `delayMs` late.
 */
function watchedWarmUps(watch: {
  onRead?: (partition: number) => void;
  onRows?: (partition: number, rows: number) => void;
  page?: { size: number; delayMs: number };
}): (db: ClickHouse) => ClickHouse {
  const { onRead, onRows, page } = watch;
  return (db) => ({
    ...db,
    queryPages: <T>(query: string, params: Record<string, unknown>, pageSize: number, onPage: (rows: T[]) => Promise<void>) => {
      const partition = Number(params.partition);
      if (!query.includes('LIMIT 1 BY event_id') || !(partition >= 0)) return db.queryPages(query, params, pageSize, onPage);
      onRead?.(partition);
      return db.queryPages<T>(query, params, page?.size ?? pageSize, async (rows) => {
        onRows?.(partition, rows.length);
        if (page) await sleep(page.delayMs);
        await onPage(rows);
      });
    },
  });
}

/**
 * Storage for a worker whose reads of the alerts other replicas wrote (AlertStore.changedSince)
 * fail while `reads.failing`; with `reads.lastFailure` set, the next one to fail is the last.
 */
function failingAlertSyncs(reads: { failing: boolean; lastFailure: boolean }): (db: ClickHouse) => ClickHouse {
  return (db) => ({
    ...db,
    queryRows: <T>(query: string, params?: Record<string, unknown>) => {
      if (!reads.failing || !query.includes('WHERE id IN (SELECT id FROM') || !query.includes('updated_at >=')) return db.queryRows<T>(query, params);
      if (reads.lastFailure) reads.failing = false;
      return Promise.reject(new Error('injected: reading the alerts of other replicas failed'));
    },
  });
}

describe('detection end to end', () => {
  const engines = useEngines();
  const { kafka } = engines;

  async function alertsOf(w: Worker): Promise<Alert[]> {
    return w.alertStore.list({});
  }

  /** A run of its own with a key on each of the topic's four partitions (key i on partition i), and the alerts of those keys. */
  function keyPerPartition(prefix: string) {
    const names = testNames(prefix);
    const keys = [0, 1, 2, 3].map((partition) => `pk_live_${names.runId}_p${partition}`);
    const config = testConfig({ brokers: engines.brokers, clickhouse: engines.clickhouse, names });
    const alertsOfKeys = async (w: Worker) => (await alertsOf(w)).filter((alert) => keys.includes(alert.apiKeyId ?? ''));
    return { names, keys, config, alertsOfKeys };
  }

  /** `count` requests of each key over the minute from `start`; key i on partition i. */
  async function sendMinute(topic: string, keys: readonly string[], start: number, count = 200): Promise<void> {
    for (const [partition, key] of keys.entries()) {
      const messages = spread(count, start, MINUTE, (t) => event(key, t)).map((e) => ({ key, value: JSON.stringify(e), partition }));
      await engines.producer.send({ topic, acks: -1, messages });
    }
  }

  it('alerts on exactly the five planted attacks among ordinary traffic', async () => {
    const { clickhouse, producer } = engines;
    const names = testNames('detect');
    const now = Date.now();
    const attacks = plantedAttacks(names.runId, now);
    const stream = [...ordinaryTraffic(names.runId, now), ...Object.values(attacks).flatMap((attack) => attack.events)];
    stream.sort((a, b) => String(a.timestamp).localeCompare(String(b.timestamp)));
    await produceAll(producer, names.topic, stream.map((e) => ({ key: e.apiKeyId, value: JSON.stringify(e) })), 2000);

    const worker = await engines.startWorker(testConfig({ brokers: engines.brokers, clickhouse, names }));
    await waitFor(() => groupCaughtUp(kafka, names.groupId, names.topic), 'worker consumes the stream', 90_000);
    await waitFor(async () => (await alertsOf(worker)).length >= 5, 'five alerts', 10_000);
    await new Promise((resolve) => setTimeout(resolve, 1_000)); // room for a wrong sixth
    const alerts = await alertsOf(worker);

    expect(alerts.map((alert) => `${alert.type} ${alert.apiKeyId}`).sort()).toEqual(
      Object.entries(attacks).map(([type, attack]) => `${type} ${attack.key}`).sort(),
    );
    const byType = new Map(alerts.map((alert) => [alert.type, alert]));
    for (const alert of alerts) {
      expect(alert).toMatchObject({ status: 'open', merchantId: expect.stringMatching(/^m_/), occurrences: expect.any(Number) });
      expect(alert.title).toContain(alert.apiKeyId);
      expect(alert.summary.length).toBeGreaterThan(20);
      expect((alert.evidence.sampleEventIds as string[]).length).toBeGreaterThan(0);
      expect(alert.riskScore).toBeGreaterThan(0);
    }
    expect(byType.get('velocity_attack')?.severity).toBe('high'); // 200/min against 60 is 3.3x
    expect(JSON.stringify(byType.get('impossible_travel')?.evidence)).toMatch(/GB/);
    expect(JSON.stringify(byType.get('impossible_travel')?.evidence)).toMatch(/US/);
    expect(byType.get('bot_traffic')?.recommendedAction).toBe('block');
    expect(JSON.stringify(byType.get('credential_sharing')?.evidence)).toMatch(/JP/);
    expect(JSON.stringify(byType.get('high_failure_rate')?.evidence)).toMatch(/401/);
    await worker.stop();
  });

  it.each([
    { when: 'live', behindMinutes: 0 },
    // Restarted 90 minutes behind (a backlog after an outage): the backlog is judged as of its own
    // times, so the warm-up must load the hour before them, not the hour before the clock.
    { when: 'in a backlog 90 minutes behind', behindMinutes: 90 },
  ])('still alerts on an attack that straddles a worker restart, $when', async ({ behindMinutes }) => {
    const { clickhouse, producer } = engines;
    const names = testNames('restart');
    const key = `pk_live_${names.runId}_velocity`;
    const config = testConfig({ brokers: engines.brokers, clickhouse, names });
    const attackMinute = Math.floor((Date.now() - behindMinutes * MINUTE) / MINUTE) * MINUTE - MINUTE;
    // One partition: beside the attack, an event from a producer whose clock is most of a day ahead.
    const send = (events: Event[]) => producer.send({ topic: names.topic, acks: -1, messages: events.map((e) => ({ key: e.apiKeyId, value: JSON.stringify(e), partition: 0 })) });
    // One minute over the limit before the restart: not sustained yet, so no alert.
    await send([...spread(200, attackMinute - MINUTE, MINUTE, (t) => event(key, t)), event(`pk_live_${names.runId}_ahead`, Date.now() + 23 * 60 * MINUTE)]);
    const first = await engines.startWorker(config);
    await waitFor(() => groupCaughtUp(kafka, names.groupId, names.topic), 'first worker consumes', 60_000);
    await new Promise((resolve) => setTimeout(resolve, 500));
    expect((await alertsOf(first)).filter((alert) => alert.apiKeyId === key)).toHaveLength(0);
    await first.stop();

    // The next minute over arrives while the worker restarts; only the warmed window can join them.
    await send(spread(200, attackMinute, MINUTE, (t) => event(key, t)));
    const second = await engines.startWorker(config);
    await waitFor(() => groupCaughtUp(kafka, names.groupId, names.topic), 'second worker consumes', 60_000);
    await waitFor(async () => (await alertsOf(second)).some((alert) => alert.apiKeyId === key), 'alert after restart', 10_000);
    const [alert] = (await alertsOf(second)).filter((a) => a.apiKeyId === key);
    expect(alert).toMatchObject({ type: 'velocity_attack', status: 'open' });
  });

  it('still alerts on an attack that straddles a restart when a rebalance cuts the warm-up short', async () => {
    // A key on each partition: the rebalance reaches every partition's warm-up.
    const { names, keys, config, alertsOfKeys } = keyPerPartition('rewarm');
    const currentMinute = Math.floor(Date.now() / MINUTE) * MINUTE;
    await sendMinute(names.topic, keys, currentMinute - 2 * MINUTE);
    const first = await engines.startWorker(config);
    await waitFor(() => groupCaughtUp(kafka, names.groupId, names.topic), 'first worker consumes', 60_000);
    await new Promise((resolve) => setTimeout(resolve, 500));
    expect(await alertsOfKeys(first)).toHaveLength(0);
    await first.stop();

    // The next minute comes while no worker runs. The next worker warms slowly (10 pages of 0.7 s a
    // partition), and a third joins the group meanwhile: the rebalance lands during the warm-ups.
    await sendMinute(names.topic, keys, currentMinute - MINUTE);
    let warmUpReads = 0;
    await engines.startWorker(config, { wrapClickHouse: watchedWarmUps({ onRead: () => warmUpReads++, page: { size: 20, delayMs: 700 } }) });
    await waitFor(() => warmUpReads > 0, 'the second worker warms a partition', 30_000);
    const third = await engines.startWorker(config);
    await waitFor(() => groupCaughtUp(kafka, names.groupId, names.topic), 'the replicas consume the next minute', 90_000);
    await waitFor(async () => (await alertsOfKeys(third)).length >= keys.length, 'every key alerts', 15_000);
    expect((await alertsOfKeys(third)).map((alert) => `${alert.type} ${alert.apiKeyId}`).sort()).toEqual(keys.map((key) => `velocity_attack ${key}`));
  });

  it('does not warm again the partitions a replica keeps through a rebalance', async () => {
    const { names, keys, config } = keyPerPartition('kept');
    /** The first worker's warm-up reads, per partition. */
    const reads = new Map<number, number>();
    await sendMinute(names.topic, keys, Date.now() - 10 * MINUTE, 50);
    const first = await engines.startWorker(config, { wrapClickHouse: watchedWarmUps({ onRead: (partition) => reads.set(partition, (reads.get(partition) ?? 0) + 1) }) });
    await waitFor(() => groupCaughtUp(kafka, names.groupId, names.topic), 'the first worker consumes', 60_000);
    expect(Object.fromEntries(reads)).toEqual({ 0: 1, 1: 1, 2: 1, 3: 1 });

    const second = await engines.startWorker(config);
    await waitForPartitionsSplit([first, second]);
    await sendMinute(names.topic, keys, Date.now() - 5 * MINUTE, 50);
    await waitFor(() => groupCaughtUp(kafka, names.groupId, names.topic), 'both consume the next minute', 60_000);
    expect(await metricTotal(first, 'security_center_assigned_partitions')).toBeGreaterThan(0);
    // The partitions the first worker kept were warmed once: their windows stayed live.
    expect(Object.fromEntries(reads)).toEqual({ 0: 1, 1: 1, 2: 1, 3: 1 });
  });

  it('warms each partition it owns with its share of the windows\' budget', async () => {
    const names = testNames('share');
    const keys = [0, 1, 2, 3].map((partition) => `pk_live_${names.runId}_p${partition}`);
    // Room for 1,000 events in all: a worker that owns the four partitions loads 200 of each.
    const config = testConfig({ brokers: engines.brokers, clickhouse: engines.clickhouse, names, extra: { DETECTION_MAX_WINDOW_EVENTS: '1000' } });
    await sendMinute(names.topic, keys, Date.now() - 10 * MINUTE, 600);
    const first = await engines.startWorker(config);
    await waitFor(() => groupCaughtUp(kafka, names.groupId, names.topic), 'the first worker consumes', 60_000);
    await first.stop();

    /** The events the restarted worker's warm-up loads, per partition. */
    const loaded = new Map<number, number>();
    await engines.startWorker(config, { wrapClickHouse: watchedWarmUps({ onRows: (partition, rows) => loaded.set(partition, (loaded.get(partition) ?? 0) + rows) }) });
    await sendMinute(names.topic, keys, Date.now() - 5 * MINUTE, 1); // a first batch for each partition, which its warm-up precedes
    await waitFor(() => groupCaughtUp(kafka, names.groupId, names.topic), 'the restarted worker consumes', 60_000);
    // 600 each (all of them, under 80% of the budget) were every partition to take the whole budget.
    expect(Object.fromEntries(loaded)).toEqual({ 0: 200, 1: 200, 2: 200, 3: 200 });
  });

  it('alerts each merchant once about a network that tries 30 keys with one 401 each, naming only its own keys, and the admin API serves it', async () => {
    const names = testNames('stuffing');
    const merchantOf = (k: number) => `m_${names.runId}_${k % 3}`;
    const keys = Array.from({ length: 30 }, (_, k) => `pk_live_${names.runId}_${k}`);
    const now = Date.now();
    // Each key's own traffic from its merchant's server, then one 401 from the stuffer per key, a few seconds apart.
    const stream = keys.flatMap((key, k) => [
      ...spread(5, now - 9 * MINUTE, 4 * MINUTE, (t) => event(key, t, { merchantId: merchantOf(k), ip: `10.20.${k % 3}.5` })),
      event(key, now - 3 * MINUTE + k * 3_000, { merchantId: merchantOf(k), ip: '203.0.113.9', status: 401, userAgent: 'curl/8.5.0' }),
    ]);
    stream.sort((a, b) => String(a.timestamp).localeCompare(String(b.timestamp)));
    await produceAll(engines.producer, names.topic, stream.map((e) => ({ key: e.apiKeyId, value: JSON.stringify(e) })));
    const worker = await engines.startWorker(testConfig({ brokers: engines.brokers, clickhouse: engines.clickhouse, names, extra: ADMIN_ENV }));
    await waitFor(() => groupCaughtUp(kafka, names.groupId, names.topic), 'worker consumes the stream', 60_000);
    const ofRun = async () => (await alertsOf(worker)).filter((alert) => alert.merchantId.startsWith(`m_${names.runId}_`));
    await waitFor(async () => (await ofRun()).length >= 3, 'an alert for each merchant', 10_000);
    await sleep(1_000); // room for a wrong fourth

    const alerts = await ofRun();
    expect(alerts.map((alert) => alert.merchantId).sort()).toEqual([0, 1, 2].map(merchantOf));
    for (const alert of alerts) {
      expect(alert).toMatchObject({ type: 'high_failure_rate', apiKeyId: null, severity: 'medium', status: 'open', recommendedAction: 'investigate' });
      // As many keys as the batches had brought when it fired (at least 20), and what came within a minute of it is not reported before a later batch.
      const [, keysTried, yours] = alert.title.match(/^Credential stuffing from 203\.0\.113\.0\/24: 401 for (\d+) API keys in 10 min, (\d+) of them yours$/)!.map(Number);
      expect(keysTried).toBeGreaterThanOrEqual(20);
      const own = keys.filter((_, k) => merchantOf(k) === alert.merchantId);
      expect(alert.evidence.merchantKeys as string[]).toHaveLength(yours!);
      for (const key of alert.evidence.merchantKeys as string[]) expect(own).toContain(key);
      expect(JSON.stringify(alert)).not.toMatch(new RegExp(keys.filter((key) => !own.includes(key)).map((key) => `${key}"`).join('|')));
    }
    const [first] = alerts;
    const served = await adminCall(worker.url, await token(first!.merchantId, 'viewer'), `/alerts/${first!.id}`);
    expect(served.status).toBe(200);
    expect(served.body.data).toMatchObject({ id: first!.id, apiKeyId: null, type: 'high_failure_rate' });
    const dashboard = await adminCall(worker.url, await token(first!.merchantId, 'viewer'), '/dashboard?range=1h');
    expect(dashboard.status).toBe(200);
    expect(dashboard.body.data.metrics.activeAlerts).toBe(1);
  });

  it('alerts on a network trying keys across a worker restart: the 401s before it are warmed from storage', async () => {
    const names = testNames('stuffrestart');
    const keys = Array.from({ length: 24 }, (_, k) => `pk_live_${names.runId}_${k}`);
    const merchantId = `m_${names.runId}`;
    const config = testConfig({ brokers: engines.brokers, clickhouse: engines.clickhouse, names });
    const now = Date.now();
    const tried = (k: number) => event(keys[k]!, now - 4 * MINUTE + k * 5_000, { merchantId, ip: '203.0.113.9', status: 401, userAgent: 'curl/8.5.0' });
    // Key k on partition k % 4, before and after the restart: a partition is warmed on its first batch,
    // so each must get one after the restart for its keys' earlier 401s to be warmed.
    const send = (events: Event[]) =>
      engines.producer.send({ topic: names.topic, acks: -1, messages: events.map((e) => ({ key: e.apiKeyId, value: JSON.stringify(e), partition: keys.indexOf(e.apiKeyId) % 4 })) });
    const ofRun = async (w: Worker) => (await alertsOf(w)).filter((alert) => alert.merchantId === merchantId);
    // 16 keys before the restart: under the 20 that make a spray.
    await send(keys.slice(0, 16).map((_, k) => tried(k)));
    const first = await engines.startWorker(config);
    await waitFor(() => groupCaughtUp(kafka, names.groupId, names.topic), 'first worker consumes', 60_000);
    await sleep(500);
    expect(await ofRun(first)).toHaveLength(0);
    await first.stop();

    await send(keys.slice(16).map((_, k) => tried(16 + k)));
    const second = await engines.startWorker(config);
    await waitFor(() => groupCaughtUp(kafka, names.groupId, names.topic), 'second worker consumes', 60_000);
    await waitFor(async () => (await ofRun(second)).length > 0, 'an alert about the network', 10_000);
    const [alert] = await ofRun(second);
    expect(alert).toMatchObject({ type: 'high_failure_rate', apiKeyId: null, scope: 'network:203.0.113.0/24', severity: 'medium' });
    expect(alert!.evidence.distinctKeys).toBeGreaterThanOrEqual(20);
    await second.stop();
  });

  /**
   * Two replicas with two partitions each, then one 401 from a stuffer for each of `count` keys, key
   * k on partition k % 4 and of merchant k % 3 unless `placed` says otherwise, `gapMs` apart from a
   * minute ago; once both replicas have consumed them, the keys and the alerts about the run's merchants.
   */
  async function sprayOverTwoReplicas(prefix: string, count: number, gapMs: number, placed: (k: number) => { merchant: number; partition: number } | undefined = () => undefined) {
    const names = testNames(prefix);
    const keys = Array.from({ length: count }, (_, k) => `pk_live_${names.runId}_${k}`);
    const merchantOf = (k: number) => `m_${names.runId}_${placed(k)?.merchant ?? k % 3}`;
    const partitionOf = (k: number) => placed(k)?.partition ?? k % 4;
    const config = testConfig({ brokers: engines.brokers, clickhouse: engines.clickhouse, names });
    const deps = { sprayAcrossReplicasMs: 1_000 };
    const workers = [await engines.startWorker(config, deps), await engines.startWorker(config, deps)];
    await waitForPartitionsSplit(workers);
    const owned = () => Promise.all(workers.map((worker) => metricTotal(worker, 'security_center_assigned_partitions')));
    await waitFor(async () => (await owned()).join() === '2,2', 'two partitions each', 10_000);
    const now = Date.now();
    const tried = keys.map((key, k) => event(key, now - MINUTE + k * gapMs, { merchantId: merchantOf(k), ip: '203.0.113.9', status: 401, userAgent: 'curl/8.5.0' }));
    await engines.producer.send({ topic: names.topic, acks: -1, messages: tried.map((e, k) => ({ key: e.apiKeyId, value: JSON.stringify(e), partition: partitionOf(k) })) });
    await waitFor(() => groupCaughtUp(kafka, names.groupId, names.topic), 'both replicas consume', 60_000);
    const ofRun = async () => (await alertsOf(workers[0]!)).filter((alert) => alert.merchantId.startsWith(`m_${names.runId}_`));
    return { keys, merchantOf, workers, ofRun };
  }

  it('alerts each merchant once about a network that tries 30 keys split between two replicas, 15 each: the owner of partition 0 reads the other\'s', async () => {
    // Each replica sees 15 keys, under the 20 that make a spray (with three partitions of four, one would see 22 and alert on its own).
    const { keys, merchantOf, workers, ofRun } = await sprayOverTwoReplicas('stuffsplit', 30, 1_000);
    await waitFor(async () => (await ofRun()).length >= 3, 'an alert for each merchant', 20_000);
    await sleep(3_000); // room for a wrong fourth, from either replica

    const alerts = await ofRun();
    expect(alerts.map((alert) => alert.merchantId).sort()).toEqual([0, 1, 2].map(merchantOf));
    for (const alert of alerts) {
      expect(alert).toMatchObject({ type: 'high_failure_rate', apiKeyId: null, scope: 'network:203.0.113.0/24', severity: 'medium', status: 'open' });
      expect(alert.evidence.distinctKeys).toBeGreaterThanOrEqual(20);
      const own = keys.filter((_, k) => merchantOf(k) === alert.merchantId);
      for (const key of alert.evidence.merchantKeys as string[]) expect(own).toContain(key);
    }
    for (const worker of workers) await worker.stop();
  });

  it('alerts each merchant of a burst of 52 keys split between two replicas with the whole and all its keys, one whose keys are all on the reader\'s partition too', async () => {
    // 52 keys in 5 seconds: each replica holds 26, enough for an alert of its own. A fourth merchant's 2 keys are both on
    // partition 0: the reader's own share holds all of them, with the same newest 401 as its reading, which holds the whole.
    const { keys, merchantOf, workers, ofRun } = await sprayOverTwoReplicas('stuffburst', 52, 100, (k) => (k >= 50 ? { merchant: 3, partition: 0 } : undefined));
    // Both replicas report their 25 keys at once, and may each open an alert: the earlier is resolved as a duplicate.
    const open = async () => (await ofRun()).filter((alert) => alert.status === 'open');
    // A reading taken before both replicas stored their keys reports the rest a minute later (REPORT_EVERY_MS).
    await waitFor(async () => (await open()).filter((alert) => alert.evidence.distinctKeys === 52).length === 4, 'every merchant told of the 52 keys', 120_000);
    await sleep(3_000); // room for a wrong description, from either replica

    for (const worker of workers) expect(await scrapeMetric(worker.url, 'security_center_alert_changes_total', { type: 'high_failure_rate' })).toBeGreaterThan(0);
    const alerts = await open();
    expect(alerts).toHaveLength(4);
    for (const alert of alerts) {
      const own = keys.filter((_, k) => merchantOf(k) === alert.merchantId);
      expect(alert.evidence).toMatchObject({ distinctKeys: 52, merchantKeyCount: own.length, judgedFrom: 'all_partitions' });
      expect([...(alert.evidence.merchantKeys as string[])].sort()).toEqual(own.slice(0, 20).sort());
    }
    for (const worker of workers) await worker.stop();
  }, 180_000);

  it('reports an attack tool on a test key at low (monitor), from Kafka and over HTTP, and on a live key at critical', async () => {
    const names = testNames('testkeys');
    const key = (name: string) => `pk_${names.runId}_${name}`;
    const sqlmap = { userAgent: 'sqlmap/1.7.2#stable (https://sqlmap.org)' };
    const now = Date.now();
    const fromKafka = [event(key('kafka_test'), now - MINUTE, { ...sqlmap, environment: 'test' }), event(key('kafka_live'), now - MINUTE, sqlmap)];
    await produceAll(engines.producer, names.topic, fromKafka.map((e) => ({ key: e.apiKeyId, value: JSON.stringify(e) })));
    const worker = await engines.startWorker(testConfig({ brokers: engines.brokers, clickhouse: engines.clickhouse, names }));
    const posted = await fetch(`${worker.url}/v1/ingest/events`, {
      method: 'POST',
      headers: { authorization: `Bearer ${TEST_INGEST_TOKEN}`, 'content-type': 'application/json' },
      body: JSON.stringify([event(key('http_test'), now - MINUTE, { ...sqlmap, environment: 'test' })]),
    });
    expect(posted.status).toBe(202);
    await waitFor(() => groupCaughtUp(kafka, names.groupId, names.topic), 'worker consumes the stream', 60_000);
    const ofRun = async () => (await alertsOf(worker)).filter((alert) => alert.apiKeyId?.startsWith(`pk_${names.runId}_`));
    await waitFor(async () => (await ofRun()).length >= 3, 'an alert for each key', 10_000);

    const byKey = new Map((await ofRun()).map((alert) => [alert.apiKeyId, alert]));
    for (const name of ['kafka_test', 'http_test']) {
      const alert = byKey.get(key(name))!;
      expect(alert).toMatchObject({ type: 'bot_traffic', severity: 'low', recommendedAction: 'monitor', evidence: { keyEnvironment: 'test', judgedSeverity: 'critical' } });
      expect(alert.riskScore).toBeLessThan(0.4);
    }
    expect(byKey.get(key('kafka_live'))).toMatchObject({ type: 'bot_traffic', severity: 'critical', recommendedAction: 'block' });
    await worker.stop();
  });

  it('alerts on an attack tool whose user agent carries a secret: the event is dead-lettered, not stored, and still judged', async () => {
    const names = testNames('uasecret');
    const key = `pk_live_${names.runId}_hidden`;
    // Anyone can append `sk_1` to their user agent: the contract rejects the event, which must not blind detection.
    const hidden = event(key, Date.now() - MINUTE, { userAgent: 'sqlmap/1.8.2#stable (https://sqlmap.org) sk_1' });
    await produceAll(engines.producer, names.topic, [{ key, value: JSON.stringify(hidden) }]);
    const worker = await engines.startWorker(testConfig({ brokers: engines.brokers, clickhouse: engines.clickhouse, names }));
    await waitFor(() => groupCaughtUp(kafka, names.groupId, names.topic), 'worker consumes the stream', 60_000);
    await waitFor(async () => (await alertsOf(worker)).some((alert) => alert.apiKeyId === key), 'an alert for the key', 10_000);
    const alert = (await alertsOf(worker)).find((alert) => alert.apiKeyId === key)!;
    expect(alert).toMatchObject({ type: 'bot_traffic', severity: 'critical', recommendedAction: 'block' });
    expect(JSON.stringify(alert)).toContain('sk_[REDACTED]');
    const [letter] = await readTopic(kafka, names.dlqTopic, 1);
    expect(JSON.parse(letter!)).toMatchObject({ reason: 'secret_in_event', eventId: hidden.eventId });
    const [stored] = await worker.clickhouse.queryRows<{ n: string | number }>(`SELECT count() AS n FROM ${engines.clickhouse.database}.request_events WHERE api_key_id = {key:String}`, { key });
    expect(Number(stored!.n)).toBe(0);
    await worker.stop();
  });

  it('continues on a key\'s new owner the alert its previous owner opened since the new owner last read the alerts', async () => {
    const { names, keys, config, alertsOfKeys } = keyPerPartition('moved');
    const currentMinute = Math.floor(Date.now() / MINUTE) * MINUTE;
    const previousOwner = await engines.startWorker(config);
    const syncs = { failing: false, lastFailure: false };
    const newOwner = await engines.startWorker(config, { wrapClickHouse: failingAlertSyncs(syncs) });
    await waitForPartitionsSplit([previousOwner, newOwner]);
    // Each replica takes a first batch of its partitions while it can read the other's alerts.
    await sendMinute(names.topic, keys, currentMinute - 4 * MINUTE, 1);
    await waitFor(() => groupCaughtUp(kafka, names.groupId, names.topic), 'the replicas take their partitions', 60_000);

    // Then each alerts on its keys, while the new owner does not hear of the other's alerts (as
    // between two of its reads, 5 s apart, of what other replicas wrote).
    syncs.failing = true;
    await sendMinute(names.topic, keys, currentMinute - 3 * MINUTE);
    await sendMinute(names.topic, keys, currentMinute - 2 * MINUTE);
    await waitFor(async () => (await alertsOfKeys(newOwner)).length >= keys.length, 'every key alerts', 30_000);
    await previousOwner.stop();
    await waitFor(async () => (await metricTotal(newOwner, 'security_center_assigned_partitions')) === keys.length, 'the partitions move', 30_000);

    // Its next read of them fails, and the next reads succeed again. The attack goes on.
    syncs.lastFailure = true;
    await sendMinute(names.topic, keys, currentMinute - MINUTE);
    await waitFor(() => groupCaughtUp(kafka, names.groupId, names.topic), 'the new owner consumes', 60_000);
    const sawLastMinute = async () => (await alertsOfKeys(newOwner)).filter((alert) => Date.parse(alert.lastSeenAt) >= currentMinute - MINUTE);
    await waitFor(async () => new Set((await sawLastMinute()).map((alert) => alert.apiKeyId)).size === keys.length, 'every key\'s alert sees the last minute', 15_000);
    // One alert per key: those of the previous owner's keys were continued, not opened a second time.
    expect((await alertsOfKeys(newOwner)).map((alert) => `${alert.type} ${alert.apiKeyId}`).sort()).toEqual(keys.map((key) => `velocity_attack ${key}`));
  });

  it('remembers the networks of a key\'s daily job across a restart: the job alerts on its first day only', async () => {
    const { clickhouse, producer } = engines;
    const names = testNames('habits');
    const config = testConfig({ brokers: engines.brokers, clickhouse, names });
    const dailyKey = `pk_live_${names.runId}_daily`;
    const newKey = `pk_live_${names.runId}_newjob`;
    // Six networks in four countries, IPv4 and IPv6, two addresses in each: a multi-region job.
    const addresses = (n: number, i: number) => (n < 3 ? `10.${n}.7.${10 + i}` : `2001:db8:${n}:1::${(10 + i).toString(16)}`);
    const job = (key: string, start: number) =>
      spread(24, start, 8 * MINUTE, (t, i) => event(key, t, { merchantId: 'm_habits', ip: addresses(i % 6, (i >> 3) % 2), country: ['US', 'DE', 'SG', 'BR'][i % 4] }));
    const yesterday = Date.now() - 24 * 60 * MINUTE;
    const today = Date.now() - 10 * MINUTE;
    // And one request from the job's first network three hours before today's run: the hour a
    // restarted worker warms its windows with (the hour before the partition's newest stored event)
    // then holds none of the job's other networks, and only what was recorded as vouched for tells
    // them from a thief's.
    const lone = event(dailyKey, today - 3 * 60 * MINUTE, { merchantId: 'm_habits', ip: addresses(0, 0), country: 'US' });
    await produceAll(producer, names.topic, [...job(dailyKey, yesterday), lone].map((e) => ({ key: dailyKey, value: JSON.stringify(e) })), 2000);
    const first = await engines.startWorker(config);
    await waitFor(() => groupCaughtUp(kafka, names.groupId, names.topic), 'first worker consumes yesterday\'s job', 60_000);
    // Yesterday's run was new: it alerted then.
    await waitFor(async () => (await alertsOf(first)).some((alert) => alert.apiKeyId === dailyKey), 'yesterday\'s run alerts', 10_000);
    const [yesterdays] = (await alertsOf(first)).filter((alert) => alert.apiKeyId === dailyKey);
    expect(yesterdays).toMatchObject({ type: 'credential_sharing', occurrences: expect.any(Number) });
    // Storage keeps one sighting per network, named by the worker as the rules name it.
    const [stored] = await first.clickhouse.queryRows<{ partition: number }>(
      `SELECT any(source_partition) AS partition FROM ${clickhouse.database}.request_events WHERE api_key_id = {key:String}`,
      { key: dailyKey },
    );
    const sightings: { apiKeyId: string; ip: string }[] = [];
    await first.store.networkSightings({ since: new Date(yesterday), topic: names.topic, partition: Number(stored!.partition) }, async (page) => {
      sightings.push(...page);
    });
    const jobNetworks = [...new Set(job(dailyKey, yesterday).map((e) => networkOf(String(e.ip))))].sort();
    expect(sightings.filter((s) => s.apiKeyId === dailyKey).map((s) => networkOf(s.ip)).sort()).toEqual(jobNetworks);
    await first.stop();

    // Today the same job runs on that key and, for the first time, on another: a restarted worker
    // knows the first key's networks from storage (yesterday is far outside the window it warms).
    const todays = [...job(dailyKey, today), ...job(newKey, today)].sort((a, b) => String(a.timestamp).localeCompare(String(b.timestamp)));
    await produceAll(producer, names.topic, todays.map((e) => ({ key: e.apiKeyId, value: JSON.stringify(e) })), 2000);
    const second = await engines.startWorker(config);
    await waitFor(() => groupCaughtUp(kafka, names.groupId, names.topic), 'second worker consumes today\'s runs', 60_000);
    await waitFor(async () => (await alertsOf(second)).some((alert) => alert.apiKeyId === newKey), 'the new job alerts', 10_000);
    await new Promise((resolve) => setTimeout(resolve, 1_000)); // room for a wrong finding on the daily key
    const [daily] = (await alertsOf(second)).filter((alert) => alert.apiKeyId === dailyKey);
    // No finding today: the alert of yesterday's run is as it was.
    expect(daily).toMatchObject({ id: yesterdays!.id, occurrences: yesterdays!.occurrences, lastSeenAt: yesterdays!.lastSeenAt });
    await second.stop();
  });

  it('consumes on, ready, when its warm-up cannot be read', async () => {
    const { clickhouse, producer } = engines;
    const names = testNames('coldstart');
    const key = `pk_live_${names.runId}_cold`;
    const events = spread(300, Date.now() - 5 * MINUTE, 4 * MINUTE, (t) => event(key, t));
    await produceAll(producer, names.topic, events.map((e) => ({ key, value: JSON.stringify(e) })), 2000);
    // Every warm-up read fails (HTTP events at start, then each partition on its first batch).
    const failedReads: string[] = [];
    const worker = await engines.startWorker(testConfig({ brokers: engines.brokers, clickhouse, names }), {
      wrapClickHouse: (db) => ({
        ...db,
        queryPages: async (query) => {
          failedReads.push(query);
          throw new Error('injected: warm-up read failed');
        },
      }),
    });
    await waitFor(() => groupCaughtUp(kafka, names.groupId, names.topic), 'worker consumes without its warm-up', 60_000);
    const [stored] = await worker.clickhouse.queryRows<{ rows: number }>(
      `SELECT count() AS rows FROM ${clickhouse.database}.request_events WHERE api_key_id = {key:String}`,
      { key },
    );
    expect(Number(stored?.rows)).toBe(events.length);
    expect(failedReads.length).toBeGreaterThanOrEqual(2); // the HTTP events' and at least one partition's
    expect((await fetch(`${worker.url}/ready`)).status).toBe(200);
  });

  it('escalates an alert whose attack worsened within REJUDGE_MS of its first finding and then stopped: judged with no later event', async () => {
    const names = testNames('quiet');
    const key = `pk_live_${names.runId}_guess`;
    const worker = await engines.startWorker(testConfig({ clickhouse: engines.clickhouse, names }));
    const post = async (events: Event[]) => {
      const response = await fetch(`${worker.url}/v1/ingest/events`, { method: 'POST', headers: { authorization: `Bearer ${TEST_INGEST_TOKEN}`, 'content-type': 'application/json' }, body: JSON.stringify(events) });
      expect(response.status).toBe(202);
    };
    const failureAlerts = async () =>
      (await worker.alertStore.loadForDedup(new Date(0))).filter((alert) => alert.apiKeyId === key).map((alert) => ({ type: alert.type, severity: alert.severity }));
    // Judged as of the events' times: 40 requests in a second, 30 of them refused, a medium brute force ...
    const start = Date.now() - 2_000;
    await post(spread(40, start, 1_000, (t, i) => event(key, t, { status: i % 4 === 3 ? 201 : 401 })));
    await waitFor(async () => (await failureAlerts()).length === 1, 'the brute force alerts', 30_000);
    expect(await failureAlerts()).toEqual([{ type: 'high_failure_rate', severity: 'medium' }]);
    // ... then guessing flat out in the next 200 ms of event time, while the rule waits out REJUDGE_MS after its finding.
    await post(spread(1_200, start + 1_000, 200, (t) => event(key, t, { status: 401 })));
    // Nothing more is posted: the key is judged once the wait is over.
    await waitFor(async () => (await failureAlerts())[0]?.severity === 'critical', 'the alert escalates with no later event', 30_000, async () => JSON.stringify(await failureAlerts()));
    expect(await failureAlerts()).toEqual([{ type: 'high_failure_rate', severity: 'critical' }]);
  });
});
