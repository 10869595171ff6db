/**
 * Redelivery and replicas on the real engines: messages delivered again from an older offset (as
 * after a crash between store and commit) are not stored twice; two replicas in one consumer group
 * split the partitions and store every event once between them; events stored without their views'
 * rows (a kill between the commits of one insert) are added to the views when redelivered; a
 * replica that loses partitions in a rebalance does not store the rows of them it still held, nor,
 * when its flush of them is being retried through a storage outage, the rows of that flush; an
 * eventId re-published after the replica that stored it restarted, or after its partition moved to
 * another replica, is dropped as a repeat, not counted twice by the rollup; a replica the group
 * dropped and gave its partitions back stores none of the rows it held from before.
 */
import { describe, expect, it } from 'vitest';
import type { Worker } from '../../src/main.ts';
import { useEngines } from '../support/engines.ts';
import { asOfToday, makeEvent } from '../support/events.ts';
import { commitGroupOffsets, groupCaughtUp, produceAll } from '../support/kafka.ts';
import { metricTotal, testConfig, testNames, waitFor, waitForPartitionsSplit } from '../support/worker.ts';

const names = testNames('redeliver');
const eventOptions = { runId: names.runId, startMs: asOfToday(Date.UTC(2026, 10, 20, 14, 0, 0)) };

describe('redelivery and replicas', () => {
  const engines = useEngines();
  const { kafka } = engines;

  /** Raw rows and distinct eventIds stored, of one topic or of all. */
  async function countRows(worker: Worker, topic = ''): Promise<{ rows: number; ids: number }> {
    const [row] = await worker.clickhouse.queryRows<{ rows: number; ids: number }>(
      `SELECT count() AS rows, uniqExact(event_id) AS ids FROM ${engines.clickhouse.database}.request_events
        WHERE {topic:String} = '' OR source_topic = {topic:String}`,
      { topic },
    );
    return row!;
  }

  /** The partitions a worker reports consumer lag for. */
  async function lagSeries(worker: Worker): Promise<string[]> {
    const metric = (await worker.metrics.registry.getMetricsAsJSON()).find((m) => m.name === 'security_center_consumer_lag');
    return (metric?.values ?? []).map((value) => String(value.labels.partition));
  }

  it('two replicas in one group split the partitions and store every event once', async () => {
    const events = Array.from({ length: 20_000 }, (_, i) => makeEvent(i, eventOptions));
    const messages = events.map((event) => ({ key: event.apiKeyId, value: JSON.stringify(event) }));
    const config = testConfig({ brokers: engines.brokers, clickhouse: engines.clickhouse, names });
    // The first replica alone takes the first half, from every partition; the second then joins.
    const workers = [await engines.startWorker(config)];
    await produceAll(engines.producer, names.topic, messages.slice(0, 10_000), 1000);
    await waitFor(() => groupCaughtUp(kafka, names.groupId, names.topic), 'the first replica commits the first half', 90_000);
    workers.push(await engines.startWorker(config));
    await waitForPartitionsSplit(workers);
    await produceAll(engines.producer, names.topic, messages.slice(10_000), 1000);
    await waitFor(() => groupCaughtUp(kafka, names.groupId, names.topic), 'both replicas commit to the end', 90_000);

    const consumed = await Promise.all(workers.map((worker) => metricTotal(worker, 'security_center_events_consumed_total')));
    expect(consumed[1]).toBeGreaterThan(0); // the second replica owned partitions
    expect(consumed[0]! + consumed[1]!).toBe(20_000);
    expect(await countRows(workers[0]!)).toEqual({ rows: 20_000, ids: 20_000 });
    // Each partition's lag is reported by its owner alone: the first replica no longer reports those it gave up.
    const lagPartitions = await Promise.all(workers.map(async (worker) => lagSeries(worker)));
    expect(lagPartitions[0]!.length).toBeLessThanOrEqual(await metricTotal(workers[0]!, 'security_center_assigned_partitions'));
    expect(lagPartitions[0]!.filter((partition) => lagPartitions[1]!.includes(partition))).toEqual([]);
  });

  it('skips messages already stored when they are delivered again from an older offset', async () => {
    // A topic of its own, stored once by a first group; a second group then starts from the
    // beginning, so every message it reads is a redelivery of a stored one.
    const own = testNames('replay');
    const startMs = asOfToday(Date.UTC(2026, 10, 20, 16, 0, 0)); // an hour of its own, for the rollup total below
    const events = Array.from({ length: 5_000 }, (_, i) => makeEvent(i, { runId: own.runId, startMs }));
    await produceAll(engines.producer, own.topic, events.map((event) => ({ key: event.apiKeyId, value: JSON.stringify(event) })), 1000);
    const first = await engines.startWorker(testConfig({ brokers: engines.brokers, clickhouse: engines.clickhouse, names: own }));
    await waitFor(() => groupCaughtUp(kafka, own.groupId, own.topic), 'the first group stores the topic', 90_000);
    await first.stop();

    const replayGroup = `${own.groupId}.replay`;
    const worker = await engines.startWorker(testConfig({ brokers: engines.brokers, clickhouse: engines.clickhouse, names: { ...own, groupId: replayGroup } }));
    await waitFor(() => groupCaughtUp(kafka, replayGroup, own.topic), 'replay group reaches the end', 90_000);
    expect(await metricTotal(worker, 'security_center_events_duplicate_total')).toBe(5_000);
    expect(await metricTotal(worker, 'security_center_events_stored_total')).toBe(0);
    expect(await countRows(worker, own.topic)).toEqual({ rows: 5_000, ids: 5_000 });
    const totals = await worker.store.trafficTotals({ from: new Date(startMs - 60_000), to: new Date(startMs + 60_000) });
    expect(totals.requests).toBe(5_000);
  });
  it('drops an eventId re-published after the replica that stored it restarted, or after its partition moved, and counts it once in the rollup', async () => {
    const own = testNames('republish');
    const startMs = Date.now() - 10 * 60_000;
    const events = Array.from({ length: 200 }, (_, i) => makeEvent(i, { runId: own.runId, startMs, keys: 50 }));
    const messages = events.map((event) => ({ key: event.apiKeyId, value: JSON.stringify(event) }));
    const republished = messages.slice(0, 50); // one event of each key, so of every partition the keys fall on
    const config = testConfig({ brokers: engines.brokers, clickhouse: engines.clickhouse, names: own });

    const first = await engines.startWorker(config);
    await produceAll(engines.producer, own.topic, messages, 200);
    await waitFor(() => groupCaughtUp(kafka, own.groupId, own.topic), 'the first worker stores the events', 90_000);
    // Within one process, the memory of recent eventIds drops the re-publish.
    await produceAll(engines.producer, own.topic, republished, 200);
    await waitFor(() => groupCaughtUp(kafka, own.groupId, own.topic), 'the first worker drops the repeats', 90_000);
    expect(await metricTotal(first, 'security_center_events_duplicate_total')).toBe(50);
    await first.stop();

    // A deploy: the replica restarts, and the fleet (or a client's retry of a post) re-publishes the same events.
    const second = await engines.startWorker(config);
    await produceAll(engines.producer, own.topic, republished, 200);
    await waitFor(() => groupCaughtUp(kafka, own.groupId, own.topic), 'the restarted worker consumes the re-publish', 90_000);
    expect(await metricTotal(second, 'security_center_events_duplicate_total')).toBe(50);

    // A rebalance: a second replica takes partitions over from the first, and the events are re-published once more.
    const third = await engines.startWorker(config);
    await waitForPartitionsSplit([second, third]);
    await produceAll(engines.producer, own.topic, republished, 200);
    await waitFor(() => groupCaughtUp(kafka, own.groupId, own.topic), 'both replicas consume the re-publish', 90_000);
    const duplicates = await Promise.all([second, third].map((worker) => metricTotal(worker, 'security_center_events_duplicate_total')));
    expect(duplicates[1]).toBeGreaterThan(0); // the partitions it took over had events re-published
    expect(duplicates[0]! + duplicates[1]!).toBe(100);

    expect(await countRows(second, own.topic)).toMatchObject({ ids: 200 });
    // What GET /admin/anomaly/metrics shows as totalRequests: every event once.
    const totals = await second.store.trafficTotals({ from: new Date(startMs - 60_000), to: new Date(Date.now() + 60_000) });
    expect(totals.requests).toBe(200);
  });

  it('adds to the views the events a killed replica stored without their view rows', async () => {
    // ClickHouse commits an insert's raw rows and each view's rows separately. A kill in between is
    // forced here by detaching the views while the second half is stored, and then rewinding the
    // group to before that half, as if the kill came before the commit too.
    const own = testNames('rollup');
    const startMs = asOfToday(Date.UTC(2026, 10, 20, 17, 0, 0));
    const events = Array.from({ length: 4_000 }, (_, i) => makeEvent(i, { runId: own.runId, startMs, keys: 200 }));
    const messages = events.map((event) => ({ key: event.apiKeyId, value: JSON.stringify(event) }));
    const config = testConfig({ brokers: engines.brokers, clickhouse: engines.clickhouse, names: own });
    const views = ['request_rollup_1m_mv', 'key_networks_1d_mv'].map((view) => `${engines.clickhouse.database}.${view}`);

    const first = await engines.startWorker(config);
    await produceAll(engines.producer, own.topic, messages.slice(0, 2_000), 1000);
    await waitFor(() => groupCaughtUp(kafka, own.groupId, own.topic), 'the first half is stored and committed', 90_000);
    const admin = kafka.admin();
    await admin.connect();
    const [firstHalfCommitted] = await admin.fetchOffsets({ groupId: own.groupId, topics: [own.topic] });
    for (const view of views) await first.clickhouse.command(`DETACH TABLE ${view}`);
    try {
      await produceAll(engines.producer, own.topic, messages.slice(2_000), 1000);
      await waitFor(() => groupCaughtUp(kafka, own.groupId, own.topic), 'the second half is stored, without view rows', 90_000);
    } finally {
      for (const view of views) await first.clickhouse.command(`ATTACH TABLE ${view}`);
    }
    const range = { from: new Date(startMs - 60_000), to: new Date(startMs + 60_000) };
    expect((await first.store.trafficTotals(range)).requests).toBe(2_000); // the forced gap is there
    await first.stop();
    await admin.disconnect();
    await commitGroupOffsets(kafka, own.groupId, own.topic, firstHalfCommitted!.partitions);

    const second = await engines.startWorker(config);
    await waitFor(() => groupCaughtUp(kafka, own.groupId, own.topic), 'the restarted replica commits to the end', 90_000);
    expect(await metricTotal(second, 'security_center_events_duplicate_total')).toBe(2_000);
    expect(await metricTotal(second, 'security_center_events_stored_total')).toBe(0);
    expect(await second.store.trafficTotals(range)).toEqual({
      requests: 4_000,
      successes: events.filter((event) => event.status < 400).length,
      failureRate: events.filter((event) => event.status >= 400).length / 4_000,
      uniqueIps: new Set(events.map((event) => event.ip)).size,
    });
    // Every rollup column agrees with the raw events, per key and minute.
    const perMinute = (from: string, columns: string) =>
      second.clickhouse.queryRows(`SELECT api_key_id, ${columns} FROM ${from} GROUP BY api_key_id, minute ORDER BY api_key_id, minute`);
    const [rolled, raw] = await Promise.all([
      perMinute(
        `${engines.clickhouse.database}.request_rollup_1m WHERE api_key_id LIKE '%${own.runId}%'`,
        `minute, sum(requests) AS requests, sum(successes) AS ok, sum(client_errors) AS c4, sum(server_errors) AS c5,
         sum(auth_failures) AS auth, sum(not_found) AS nf, sum(rate_limited) AS rl, sum(response_time_sum) AS rt,
         max(response_time_max) AS rt_max, uniqMerge(unique_ips) AS ips`,
      ),
      perMinute(
        `${engines.clickhouse.database}.request_events WHERE source_topic = '${own.topic}'`,
        `toStartOfMinute(ts) AS minute, count() AS requests, countIf(status < 400) AS ok, countIf(status BETWEEN 400 AND 499) AS c4,
         countIf(status >= 500) AS c5, countIf(status IN (401, 403)) AS auth, countIf(status = 404) AS nf, countIf(status = 429) AS rl,
         sum(toFloat64(response_time_ms)) AS rt, max(response_time_ms) AS rt_max, uniq(ip) AS ips`,
      ),
    ]);
    expect(rolled).toHaveLength(200);
    expect(rolled).toEqual(raw);
    // And so does key_networks_1d, detection's memory of each key's networks (one network a key here).
    const perKey = (from: string, columns: string) =>
      second.clickhouse.queryRows(`SELECT api_key_id, ${columns} FROM ${from} GROUP BY api_key_id ORDER BY api_key_id`);
    const [networks, rawPerKey] = await Promise.all([
      perKey(`${engines.clickhouse.database}.key_networks_1d WHERE source_topic = '${own.topic}'`, 'sum(requests) AS requests, min(first_seen) AS first, max(last_seen) AS last'),
      perKey(`${engines.clickhouse.database}.request_events WHERE source_topic = '${own.topic}'`, 'count() AS requests, min(ts) AS first, max(ts) AS last'),
    ]);
    expect(networks).toHaveLength(200);
    expect(networks).toEqual(rawPerKey);
  });

  it('a replica that loses partitions in a rebalance does not store their rows it still held', async () => {
    // The first replica holds everything it read (a long flush interval, longer than a rebalance
    // takes on a loaded machine) while a second joins and takes partitions over from their committed
    // offsets, still at the start: the first must not store its rows of those partitions as well.
    const own = testNames('handover');
    const startMs = asOfToday(Date.UTC(2026, 10, 20, 18, 0, 0));
    const events = Array.from({ length: 4_000 }, (_, i) => makeEvent(i, { runId: own.runId, startMs, keys: 200 }));
    const config = testConfig({ brokers: engines.brokers, clickhouse: engines.clickhouse, names: own });
    const holding = testConfig({ brokers: engines.brokers, clickhouse: engines.clickhouse, names: own, extra: { STORE_FLUSH_INTERVAL_MS: '30000' } });
    const first = await engines.startWorker(holding);
    await produceAll(engines.producer, own.topic, events.map((event) => ({ key: event.apiKeyId, value: JSON.stringify(event) })), 1000);
    await waitFor(async () => (await metricTotal(first, 'security_center_buffered_rows')) === 4_000, 'the first replica holds every event', 30_000);

    const second = await engines.startWorker(config);
    await waitFor(() => groupCaughtUp(kafka, own.groupId, own.topic), 'the two replicas commit to the end', 90_000);
    expect(await countRows(second, own.topic)).toEqual({ rows: 4_000, ids: 4_000 });
    const totals = await second.store.trafficTotals({ from: new Date(startMs - 60_000), to: new Date(startMs + 60_000) });
    expect(totals.requests).toBe(4_000);
    expect(await metricTotal(second, 'security_center_events_stored_total')).toBeGreaterThan(0); // it took partitions over
  });

  it('a replica retrying a flush through a storage outage does not store the rows of partitions it lost meanwhile', async () => {
    // Storage fails for the first replica alone while it holds a flush of every partition; a second
    // replica joins, takes partitions over from their committed offsets (the start) and stores
    // them. When storage comes back, the first one's retry must leave those partitions' rows out:
    // raw rows would collapse on merge, but the rollup would count them twice for good.
    const own = testNames('outagemove');
    const startMs = asOfToday(Date.UTC(2026, 10, 20, 19, 0, 0));
    const events = Array.from({ length: 4_000 }, (_, i) => makeEvent(i, { runId: own.runId, startMs, keys: 200 }));
    await produceAll(engines.producer, own.topic, events.map((event) => ({ key: event.apiKeyId, value: JSON.stringify(event) })), 1000);
    const config = testConfig({ brokers: engines.brokers, clickhouse: engines.clickhouse, names: own });
    let outage = true;
    let failedWrites = 0;
    const first = await engines.startWorker(config, {
      wrapStoreRows: (storeRows) => async (body) => {
        if (outage) {
          failedWrites++;
          throw new Error('injected: this replica cannot store');
        }
        return storeRows(body);
      },
    });
    await waitFor(
      async () => failedWrites >= 2 && (await metricTotal(first, 'security_center_events_consumed_total')) > 0,
      'the first replica read events and retries storing them',
      60_000,
    );

    const second = await engines.startWorker(config);
    await waitForPartitionsSplit([first, second]);
    await waitFor(async () => (await metricTotal(second, 'security_center_events_stored_total')) > 0, 'the second replica stores the partitions it took over', 60_000);
    outage = false;
    await waitFor(() => groupCaughtUp(kafka, own.groupId, own.topic), 'the two replicas commit to the end', 90_000);
    await waitFor(async () => (await metricTotal(first, 'security_center_events_stored_total')) > 0, 'the first replica stores its partitions once storage is back', 30_000);

    expect(await countRows(first, own.topic)).toEqual({ rows: 4_000, ids: 4_000 });
    const totals = await first.store.trafficTotals({ from: new Date(startMs - 60_000), to: new Date(startMs + 60_000) });
    expect(totals.requests).toBe(4_000);
    const stored = await Promise.all([first, second].map((worker) => metricTotal(worker, 'security_center_events_stored_total')));
    expect(stored[0]! + stored[1]!).toBe(4_000);
  });

  it('a partition that moves away and comes back before its new owner stored anything loses nothing', async () => {
    // The first replica holds what it read; a second takes some partitions over, cannot store
    // (storage fails for it alone), and leaves: the partitions come back to the first from their
    // committed offsets, and the messages it had validated and dropped must be stored now, not
    // taken for repeats.
    const own = testNames('roundtrip');
    const startMs = asOfToday(Date.UTC(2026, 10, 20, 20, 0, 0));
    const events = Array.from({ length: 4_000 }, (_, i) => makeEvent(i, { runId: own.runId, startMs, keys: 200 }));
    const holding = testConfig({ brokers: engines.brokers, clickhouse: engines.clickhouse, names: own, extra: { STORE_FLUSH_INTERVAL_MS: '30000' } });
    const first = await engines.startWorker(holding);
    await produceAll(engines.producer, own.topic, events.map((event) => ({ key: event.apiKeyId, value: JSON.stringify(event) })), 1000);
    await waitFor(async () => (await metricTotal(first, 'security_center_buffered_rows')) === 4_000, 'the first replica holds every event', 30_000);

    const second = await engines.startWorker(testConfig({ brokers: engines.brokers, clickhouse: engines.clickhouse, names: own }), {
      wrapStoreRows: () => async () => {
        throw new Error('injected: this replica cannot store');
      },
    });
    await waitFor(async () => (await metricTotal(second, 'security_center_events_consumed_total')) > 0, 'the second replica reads partitions it took over', 30_000);
    await second.stop(); // gives up its rows after the drain deadline; commits nothing of them

    await waitFor(() => groupCaughtUp(kafka, own.groupId, own.topic), 'the first replica commits every partition to the end', 90_000);
    expect(await countRows(first, own.topic)).toEqual({ rows: 4_000, ids: 4_000 });
  });

  it('a replica the group dropped (its session timed out) and gave its partitions back stores none of the rows it held, nor commits their old offsets', async () => {
    // The first replica holds what it read (a long flush interval). A second joins and takes half the
    // partitions; the first keeps the rest, rows and all. The first then stalls in a storage read
    // past its session timeout (no heartbeats): the group drops it and gives every partition to the
    // second, which stores them from their committed offsets (the start), more events too, and
    // commits. The second leaves; the first, back, rejoins under a new member id and gets every
    // partition again. It must store none of the rows it held from before, and commit none of their
    // offsets: the rollup would count them twice, and the group's committed offsets would move back.
    const own = testNames('rejoin');
    const startMs = asOfToday(Date.UTC(2026, 10, 20, 21, 0, 0));
    const events = Array.from({ length: 3_000 }, (_, i) => makeEvent(i, { runId: own.runId, startMs, keys: 200 }));
    const messages = events.map((event) => ({ key: event.apiKeyId, value: JSON.stringify(event) }));
    const held = messages.slice(0, 2_000);
    let stall: Promise<void> | undefined;
    let endStall!: () => void;
    let stalled = false;
    const first = await engines.startWorker(testConfig({ brokers: engines.brokers, clickhouse: engines.clickhouse, names: own, extra: { STORE_FLUSH_INTERVAL_MS: '60000' } }), {
      // The read of how far a partition is stored, made by its first batch after each assignment.
      wrapClickHouse: (db) => ({
        ...db,
        queryRows: async (...args: Parameters<typeof db.queryRows>) => {
          if (stall && args[0].includes('max(source_offset)')) {
            stalled = true;
            await stall;
          }
          return db.queryRows(...args);
        },
      }),
    });
    await produceAll(engines.producer, own.topic, held, 500);
    await waitFor(async () => (await metricTotal(first, 'security_center_buffered_rows')) === held.length, 'the first replica holds every event', 30_000);

    stall = new Promise<void>((resolve) => (endStall = resolve));
    const second = await engines.startWorker(testConfig({ brokers: engines.brokers, clickhouse: engines.clickhouse, names: own }));
    await waitFor(() => stalled, 'the first replica stalls in the first batch of a partition it kept', 60_000);
    await produceAll(engines.producer, own.topic, messages.slice(held.length), 500);
    await waitFor(() => groupCaughtUp(kafka, own.groupId, own.topic), 'the second replica, alone in the group, commits every partition to the end', 90_000);
    await second.stop();

    endStall();
    await waitFor(async () => (await metricTotal(first, 'security_center_assigned_partitions')) === 4, 'the first replica rejoins and gets every partition', 60_000);
    await first.stop(); // drains what it holds, and commits it
    const caughtUp = await groupCaughtUp(kafka, own.groupId, own.topic);
    const storedBy = await Promise.all([first, second].map((worker) => metricTotal(worker, 'security_center_events_stored_total')));
    // A worker of its own, without Kafka, reads storage once the others are stopped.
    const probe = await engines.startWorker(testConfig({ clickhouse: engines.clickhouse, names: testNames('rejoinprobe') }));
    const raw = await countRows(probe, own.topic);
    const { requests } = await probe.store.trafficTotals({ from: new Date(startMs - 60_000), to: new Date(startMs + 60_000) });
    expect({ caughtUp, storedFirst: storedBy[0], stored: storedBy[0]! + storedBy[1]!, raw, requests }).toEqual({
      caughtUp: true, // no old offset committed over the second replica's
      storedFirst: 0, // it had nothing left to store once back
      stored: messages.length,
      raw: { rows: messages.length, ids: messages.length },
      requests: messages.length, // the rollup counts every event once
    });
  });

  it('a worker stopped while it warms up a partition stops cleanly, and the next stores every event once', async () => {
    const own = testNames('stopwarm');
    const startMs = asOfToday(Date.UTC(2026, 10, 20, 22, 0, 0));
    const events = Array.from({ length: 3_000 }, (_, i) => makeEvent(i, { runId: own.runId, startMs, keys: 100 }));
    await produceAll(engines.producer, own.topic, events.map((event) => ({ key: event.apiKeyId, value: JSON.stringify(event) })), 1000);
    const config = testConfig({ brokers: engines.brokers, clickhouse: engines.clickhouse, names: own });
    let warmups = 0;
    const fatal: Error[] = [];
    const first = await engines.startWorker(config, {
      onFatal: (error) => fatal.push(error),
      // Warm-up reads take 2 s each, so that the stop lands while a partition's first batch waits on one.
      wrapClickHouse: (db) => ({
        ...db,
        queryPages: async (...args) => {
          warmups++;
          await new Promise((resolve) => setTimeout(resolve, 2_000));
          return db.queryPages(...args);
        },
      }),
    });
    await waitFor(() => warmups >= 2, 'a partition warm-up begins (after the HTTP events\' one)', 30_000);
    await first.stop();
    // The batch that waited on the warm-up is dropped, not analysed after the analysis thread closed.
    expect(fatal).toEqual([]);
    expect(await metricTotal(first, 'security_center_events_stored_total')).toBe(0);

    const second = await engines.startWorker(config);
    await waitFor(() => groupCaughtUp(kafka, own.groupId, own.topic), 'the next worker commits to the end', 90_000);
    expect(await countRows(second, own.topic)).toEqual({ rows: 3_000, ids: 3_000 });
  });
});
