import { Kafka, KafkaJSSASLAuthenticationError, logLevel, Partitioners, type Batch, type EachBatchPayload, type KafkaMessage, type ProducerRecord } from 'kafkajs';
import { describe, expect, it, vi } from 'vitest';
import { makeEvent } from '../../test/support/events.ts';
import { fake } from '../../test/support/fake.ts';
import { capturedLogs } from '../../test/support/logs.ts';
import { parseRequestEventText, parseRequestEventValue, type RequestEvent } from '../events/request-event.ts';
import { createLogger } from '../logger.ts';
import { WorkerMetrics } from '../metrics.ts';
import type { EventStore } from '../store/event-store.ts';
import type { AnalysisThread } from './analysis-thread.ts';
import { EventBuffer, type OffsetMark } from './event-buffer.ts';
import { BacklogWatch, KafkaIntake, type KafkaIntakeOptions } from './kafka-consumer.ts';

describe('BacklogWatch', () => {
  it('says the replica caught up on the batch that ends the last partition behind, once', () => {
    const watch = new BacklogWatch();
    expect(watch.note(0, 5000)).toBe(false);
    expect(watch.note(1, 2000)).toBe(false);
    expect(watch.note(0, 0)).toBe(false); // partition 1 is still behind
    expect(watch.note(1, 0)).toBe(true);
    expect(watch.note(1, 0)).toBe(false); // already caught up: no backlog ended
  });

  it('never reports a backlog on a consumer that was never behind', () => {
    const watch = new BacklogWatch();
    for (let i = 0; i < 5; i++) expect(watch.note(i % 2, 0)).toBe(false);
  });

  it('forgets partitions behind before a rebalance', () => {
    const watch = new BacklogWatch();
    watch.note(3, 100);
    watch.reset();
    expect(watch.note(0, 10)).toBe(false);
    expect(watch.note(0, 0)).toBe(true); // partition 3 went elsewhere; it does not hold the backlog open
  });
});

describe('KafkaIntake\'s producer', () => {
  it('is made with kafkajs\'s default partitioner named, so that kafkajs does not warn at every start that its default changed, and keys map to partitions as before', () => {
    const kafkajsLines: string[] = [];
    const kafka = new Kafka({ brokers: ['127.0.0.1:9'], logLevel: logLevel.WARN, logCreator: () => ({ log }) => void kafkajsLines.push(log.message) });
    const producer = vi.spyOn(kafka, 'producer');
    const metrics = new WorkerMetrics({ defaultMetrics: false });
    new KafkaIntake({ kafka, topic: 't', dlqTopic: 't.dlq', groupId: 'g', sessionTimeoutMs: 6_000, heartbeatIntervalMs: 500, maxWaitMs: 100, metrics, logger: createLogger('silent') } as unknown as KafkaIntakeOptions);
    // The one kafkajs uses when none is named (murmur2, Java's: README): the fleet's keys stay on their partitions.
    expect(producer).toHaveBeenCalledWith(expect.objectContaining({ createPartitioner: Partitioners.DefaultPartitioner }));
    expect(kafkajsLines).toEqual([]);
  });
});

describe('KafkaIntake\'s start', () => {
  it('names the SASL settings, not the password, when the brokers refuse the consumer\'s SASL', async () => {
    const refused = new (KafkaJSSASLAuthenticationError as unknown as new (message: string) => Error)('SASL PLAIN authentication failed: SASL Authentication failed');
    const kafka = {
      consumer: () => ({ events: {}, on: () => undefined, connect: () => Promise.reject(refused) }),
      producer: () => ({ connect: async () => undefined }),
      admin: () => ({}),
    } as unknown as Kafka;
    const sasl = { mechanism: 'plain', username: 'svc', password: 'pass-word-secret' } as const;
    const metrics = new WorkerMetrics({ defaultMetrics: false });
    const intake = new KafkaIntake({ kafka, sasl, topic: 't', groupId: 'g', metrics, logger: createLogger('silent') } as unknown as KafkaIntakeOptions);
    const hint = "SASL PLAIN authentication failed: SASL Authentication failed: the brokers refuse this worker's SASL: check KAFKA_SASL_MECHANISM (plain), KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD, and that the listener of KAFKA_BROKERS takes SASL without TLS (KAFKA_SSL=false)";
    await expect(intake.start()).rejects.toThrow(hint);
    expect(intake.notReadyReason).toBe(`kafka consumer cannot start (retrying): ${hint}`);
  });

  // main.ts's stop waits 5 s for start-up, then stops fetching and disconnects: a step of the
  // consumer's start may still be under way then, and end after disconnect() has run.
  const consumerSteps = ['connect', 'subscribe', 'run'] as const;
  it.each(consumerSteps)('takes no step after %s once the stop came during it, and disconnects the consumer it connected', async (slowStep) => {
    const calls: string[] = [];
    let finishStep!: () => void;
    const step = (name: string) => () => {
      calls.push(name);
      return name === slowStep ? new Promise<void>((resolve) => (finishStep = resolve)) : Promise.resolve();
    };
    const consumer = { events: {}, on: () => undefined, connect: step('connect'), subscribe: step('subscribe'), run: step('run'), disconnect: step('disconnect') };
    const kafka = {
      consumer: () => consumer,
      producer: () => ({ connect: async () => undefined, disconnect: async () => undefined }),
      admin: () => ({}),
    } as unknown as Kafka;
    const metrics = new WorkerMetrics({ defaultMetrics: false });
    const intake = new KafkaIntake({ kafka, topic: 't', groupId: 'g', metrics, logger: createLogger('silent') } as unknown as KafkaIntakeOptions);
    const started = intake.start().then(
      () => 'started',
      (error: Error) => error.message,
    );
    await vi.waitFor(() => expect(calls.at(-1)).toBe(slowStep));
    const stepsTaken = consumerSteps.slice(0, consumerSteps.indexOf(slowStep) + 1);
    await intake.disconnect();
    expect(calls).toEqual(stepsTaken); // not running yet: disconnect() leaves the consumer alone
    finishStep();
    const outcome = await started;
    expect(calls).toEqual([...stepsTaken, 'disconnect']);
    expect(outcome).toBe('kafka intake stopped while starting');
  });
});

describe('KafkaIntake', () => {
  /**
   * An intake over a stand-in consumer: the test hands it batches of partition 0 as kafkajs would.
   * `brokers` is what the stand-in admin client reads: partition 0's end and the group's committed offset.
   * `options` replace the intake's own (a warm-up, a logger).
   */
  async function intakeWithBatches(brokers = { end: 0, committed: -1 }, lagIntervalMs = 20, options: Partial<KafkaIntakeOptions> = {}) {
    let eachBatch: ((payload: EachBatchPayload) => Promise<void>) | undefined;
    let onJoin: ((event: unknown) => void) | undefined;
    const analysed: number[][] = [];
    const made: string[] = [];
    const sent: ProducerRecord[] = [];
    /** The pause state of the stand-in consumer group, and the calls that set it; how it leaves and commits. */
    const group = { paused: false, calls: [] as string[], leave: async () => undefined as void, commit: async () => undefined as void };
    /** Set to a promise that does not settle to make storage reads hang (a black-holed server). */
    const storage: { hang?: Promise<never> } = {};
    const buffer = { healthy: true, add: () => Promise.resolve(), waitForCapacity: async () => undefined, releasePartitions: () => 0 };
    const metrics = new WorkerMetrics({ defaultMetrics: false });
    const consumer = {
      events: { GROUP_JOIN: 'join', CRASH: 'crash' },
      on: (name: string, listener: (event: unknown) => void) => {
        if (name === 'join') onJoin = listener;
      },
      connect: async () => undefined,
      subscribe: async () => undefined,
      run: async (options: { eachBatch: (payload: EachBatchPayload) => Promise<void> }) => {
        eachBatch = options.eachBatch;
      },
      pause: () => (group.calls.push('pause'), (group.paused = true)),
      resume: () => (group.calls.push('resume'), (group.paused = false)),
      commitOffsets: () => group.commit(),
      disconnect: () => group.leave(),
    };
    const admin = {
      connect: async () => undefined,
      disconnect: async () => undefined,
      fetchTopicOffsets: async () => [{ partition: 0, offset: String(brokers.end), high: String(brokers.end), low: '0' }],
      fetchOffsets: async () => [{ topic: 't', partitions: [{ partition: 0, offset: String(brokers.committed), metadata: null }] }],
    };
    const intake = new KafkaIntake({
      kafka: {
        consumer: () => (made.push('consumer'), consumer),
        producer: () => (made.push('producer'), { connect: async () => undefined, disconnect: async () => undefined, send: async (record: ProducerRecord) => (sent.push(record), []) }),
        admin: () => (made.push('admin'), admin),
      } as unknown as Kafka,
      topic: 't',
      dlqTopic: 't.dlq',
      groupId: 'g',
      fromBeginning: true,
      sessionTimeoutMs: 6_000,
      heartbeatIntervalMs: 500,
      maxWaitMs: 100,
      // Nothing stored yet when the partition is assigned; the rows of offsets 0-99 once they are.
      store: fake<EventStore>({
        storedOffsets: async () => (await storage.hang, new Map(analysed.length > 0 ? [[0, 99]] : [])),
        eventIdsAtFirstStoredOffset: async () => ({ offset: 0, eventIds: ['evt_0'] }),
        repairViews: async () => ({ rollup: 0, keyNetworks: 0, merchantRollup: 0 }),
      }),
      analysis: fake<AnalysisThread>({
        analyzeBatch: async (_topic: string, _partition: number, messages: KafkaMessage[]) => {
          analysed.push(messages.map((message) => Number(message.offset)));
          return { rows: Buffer.alloc(0), rowCount: messages.length, rejections: [], duplicates: 0, misrouted: 0, findings: [], ruleErrors: [] };
        },
        keepPartitions: async () => ({ findings: [], ruleErrors: [] }),
      }),
      onDetection: () => undefined,
      buffer: buffer as unknown as EventBuffer,
      metrics,
      logger: createLogger('silent'),
      lagIntervalMs,
      ...options,
    });
    /** An assignment of these partitions to this replica, under this member id in the group. */
    const join = (partitions = [0], memberId = 'member-1') => onJoin!({ payload: { memberId, memberAssignment: { t: partitions } } });
    join();
    await intake.start();
    /**
     * Hands the intake a batch of these offsets (each message an event `evt_<prefix><offset>`) and waits until it took it.
     * `heartbeat` is the batch's (it throws while the group rebalances).
     */
    const deliver = async (offsets: number[], highWatermark: number, prefix: string, heartbeat = async () => undefined) => {
      const messages = offsets.map((offset) => ({ offset: String(offset), value: Buffer.from(JSON.stringify({ eventId: `evt_${prefix}${offset}` })) }) as KafkaMessage);
      const batch = {
        topic: 't',
        partition: 0,
        highWatermark: String(highWatermark),
        messages,
        isEmpty: () => messages.length === 0,
        firstOffset: () => messages[0]!.offset,
        lastOffset: () => messages.at(-1)!.offset,
      } as unknown as Batch;
      await eachBatch!({ batch, resolveOffset: () => undefined, heartbeat, isRunning: () => true, isStale: () => false } as unknown as EachBatchPayload);
      await intake.settle();
    };
    return { intake, deliver, analysed, made, sent, metrics, group, buffer, join, storage };
  }

  it('makes its consumer, its dead-letter producer and its admin client from the one client it is given, with its TLS and SASL settings', async () => {
    expect((await intakeWithBatches()).made.sort()).toEqual(['admin', 'consumer', 'producer']);
  });

  it('warns when the views\' repair added events to any of them, merchant_rollup_15m alone included', async () => {
    const { logger, lines } = capturedLogs<{ msg: string; events?: Record<string, number> }>();
    const { deliver } = await intakeWithBatches({ end: 20, committed: -1 }, 60_000, {
      logger,
      // Offsets 0-9 stored (their first one's eventId is the message's: a redelivery), with merchant_rollup_15m short of 25 events.
      store: fake<EventStore>({
        storedOffsets: async () => new Map([[0, 9]]),
        eventIdsAtFirstStoredOffset: async () => ({ offset: 0, eventIds: ['evt_0'] }),
        repairViews: async () => ({ rollup: 0, keyNetworks: 0, merchantRollup: 25 }),
      }),
    });
    await deliver([0, 1, 2, 10, 11], 20, '');
    const warnings = lines.filter((line) => line.msg === 'views were missing events stored before a crash; added them');
    expect(warnings.map((line) => line.events)).toEqual([{ rollup: 0, keyNetworks: 0, merchantRollup: 25 }]);
  });

  /** The consumer lag the intake reports for partition 0, or undefined when it reports none. */
  async function lagOf(metrics: WorkerMetrics): Promise<number | undefined> {
    return (await metrics.consumerLag.get()).values.find((value) => value.labels.partition === 0)?.value;
  }

  it('reports the lag as the partition\'s end minus the committed offset, read from the brokers while no batch comes (paused for an outage)', async () => {
    const brokers = { end: 500, committed: 200 };
    const { intake, metrics } = await intakeWithBatches(brokers);
    await vi.waitFor(async () => expect(await lagOf(metrics)).toBe(300));
    intake.pause(); // storage is out: no batch comes, messages keep arriving
    brokers.end = 2_500;
    await vi.waitFor(async () => expect(await lagOf(metrics)).toBe(2_300));
    // Storage back: what is stored is committed, and the lag follows at once.
    intake.resume();
    await intake.commit([{ topic: 't', partition: 0, offset: 2_500 }]);
    expect(await lagOf(metrics)).toBe(0);
    await intake.disconnect();
  });

  it('counts a partition without a committed offset from its start (fromBeginning), and a batch updates the end at once', async () => {
    const { deliver, metrics, intake } = await intakeWithBatches({ end: 100, committed: -1 }, 60_000); // read at the join only
    await vi.waitFor(async () => expect(await lagOf(metrics)).toBe(100));
    await deliver(range(0, 100), 400, ''); // consumed, not committed yet: 400 behind the commit
    expect(await lagOf(metrics)).toBe(400);
    await intake.disconnect();
  });

  it('pauses again the consumer group kafkajs makes anew after a crash, while storage is out', async () => {
    const { intake, group, buffer, join } = await intakeWithBatches();
    buffer.healthy = false;
    intake.pause(); // the buffer's onOutage
    expect(group.paused).toBe(true);
    // kafkajs restarts after a retriable crash with a new consumer group, not paused, and joins with it.
    group.paused = false;
    join();
    expect(group.paused).toBe(true);
    // Storage back: resumed; a later join leaves it fetching.
    buffer.healthy = true;
    intake.resume();
    join();
    expect(group.paused).toBe(false);
  });

  it('at shutdown, gives up a batch waiting on a storage read, and leaves the group within its deadline', async () => {
    const { intake, deliver, analysed, storage, group } = await intakeWithBatches();
    storage.hang = new Promise<never>(() => undefined);
    let delivered = false;
    const delivering = deliver(range(0, 10), 10, '').then(() => (delivered = true));
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(delivered).toBe(false); // kafkajs would wait for it before leaving the group
    intake.stopFetching();
    await delivering;
    expect(analysed).toEqual([]); // nothing of it handed off, so nothing committed
    // The consumer's own leaving hangs too: disconnect goes on after its deadline.
    group.leave = () => new Promise<never>(() => undefined);
    const started = Date.now();
    await intake.disconnect(200);
    expect(Date.now() - started).toBeLessThan(1_000);
  });

  it('does not fetch again after a rejoin once stopping, nor resume when storage comes back then', async () => {
    const { intake, group, join } = await intakeWithBatches();
    intake.stopFetching();
    expect(group.paused).toBe(true);
    group.paused = false;
    join();
    expect(group.paused).toBe(true);
    intake.resume(); // storage back during the drain
    expect(group.paused).toBe(true);
  });

  it('publishes events posted over HTTP to its topic, keyed by API key, acknowledged by all in-sync replicas, as the consumer reads them back', async () => {
    const { intake, sent } = await intakeWithBatches();
    const events = [0, 1, 2].map((i) => (parseRequestEventValue(makeEvent(i, { runId: 'unit', startMs: Date.UTC(2026, 10, 21), keys: 2 })) as { event: RequestEvent }).event);
    await intake.publish(events);
    expect(sent).toEqual([{ topic: 't', acks: -1, messages: events.map((event) => ({ key: event.apiKeyId, value: expect.any(String) })) }]);
    expect(sent[0]!.messages.map((message) => parseRequestEventText(message.value as string))).toEqual(events.map((event) => ({ ok: true, event })));
  });

  const range = (from: number, count: number) => Array.from({ length: count }, (_, i) => from + i);

  it('takes the messages of a partition whose log started again under what it handed off for new ones, not for redeliveries', async () => {
    const { deliver, analysed, metrics } = await intakeWithBatches();
    await deliver(range(0, 100), 100, '');
    // The broker comes back without its data (or the topic is created again) while this replica
    // owns the partition: offsets 0-9 again, other events, and the partition ends at 10.
    await deliver(range(0, 10), 10, 'new_');
    expect(analysed).toEqual([range(0, 100), range(0, 10)]);
    const duplicates = await metrics.eventsDuplicate.get();
    expect(duplicates.values.reduce((sum, value) => sum + value.value, 0)).toBe(0);
    expect((await metrics.staleStoredOffsets.get()).values).toEqual([{ value: 1, labels: { reason: 'beyond_end' } }]);
  });

  it('still skips a redelivery below what it handed off', async () => {
    const { deliver, analysed } = await intakeWithBatches();
    await deliver(range(0, 100), 200, '');
    await deliver(range(50, 100), 200, ''); // offsets 50-99 again, then 100-149
    expect(analysed).toEqual([range(0, 100), range(100, 50)]);
  });

  describe('detection warm-up', () => {
    const rebalancing = new Error('The group is rebalancing, so a rejoin is needed');

    it('does not judge a batch whose warm-up a rebalance cut short, and warms the partition again on its next assignment', async () => {
      const warmed: number[] = [];
      const { deliver, analysed, join } = await intakeWithBatches(undefined, undefined, {
        warmPartition: async (partition, afterPage) => {
          warmed.push(partition);
          for (let page = 0; page < 3; page++) await afterPage();
        },
      });
      await expect(deliver(range(0, 10), 10, '', async () => Promise.reject(rebalancing))).rejects.toBe(rebalancing);
      expect(analysed).toEqual([]); // neither judged nor handed off: kafkajs rejoins and fetches it again
      join(); // the partition stays with this replica
      await deliver(range(0, 10), 10, '');
      expect(warmed).toEqual([0, 0]);
      expect(analysed).toEqual([range(0, 10)]);
    });

    it.each([
      { loaded: 'before any page', pages: 0, message: 'detection warm-up failed; windows start empty' },
      { loaded: 'after two pages', pages: 2, message: 'detection warm-up failed part-way; windows hold only the pages loaded' },
    ])('judges a batch whose warm-up storage failed $loaded, and logs what the windows hold', async ({ pages, message }) => {
      const warnings: { msg: string; partition?: number; pagesLoaded?: number }[] = [];
      const { deliver, analysed } = await intakeWithBatches(undefined, undefined, {
        warmPartition: async (_partition, afterPage) => {
          for (let page = 0; page < pages; page++) await afterPage();
          throw new Error('injected: a warm-up read failed');
        },
        logger: createLogger('warn', { write: (line: string) => void warnings.push(JSON.parse(line)) }),
      });
      await deliver(range(0, 10), 10, '');
      expect(analysed).toEqual([range(0, 10)]);
      expect(warnings).toContainEqual(expect.objectContaining({ msg: message, partition: 0, pagesLoaded: pages }));
    });

    it('tells the warm-up how many partitions this replica owns, which share the windows\' budget', async () => {
      const owned: number[] = [];
      const { deliver, join } = await intakeWithBatches(undefined, undefined, { warmPartition: async (_partition, _afterPage, partitionsOwned) => void owned.push(partitionsOwned) });
      join([0, 1, 2], 'member-2'); // dropped and given three partitions: partition 0 is warmed again
      await deliver(range(0, 10), 200, '');
      expect(owned).toEqual([3]);
    });

    it('warms a partition once while it stays here, and again once it comes back or the group dropped this replica meanwhile', async () => {
      const warmed: number[] = [];
      const { deliver, join } = await intakeWithBatches(undefined, undefined, { warmPartition: async (partition) => void warmed.push(partition) });
      await deliver(range(0, 10), 200, '');
      join(); // a rebalance that leaves partition 0 here: its windows are live
      await deliver(range(100, 10), 200, '');
      expect(warmed).toEqual([0]);
      join([]); // it moves to another replica...
      join(); // ... and comes back
      await deliver(range(110, 10), 200, '');
      expect(warmed).toEqual([0, 0]);
      join([0], 'member-2'); // the group dropped this replica (a session that timed out), which joined again
      await deliver(range(120, 10), 200, '');
      expect(warmed).toEqual([0, 0, 0]);
    });
  });

  describe('recall of stored eventIds', () => {
    /** An intake with DEDUP_CACHE_SIZE 1000 whose storage holds `stored` ids of every partition; `steps` logs recalls and validations in order. */
    async function recallingIntake(stored: string[] | Error, logger = createLogger('silent')) {
      const steps: string[] = [];
      const reads: { partition: number; sinceAgoMs: number; limit: number }[] = [];
      const made = await intakeWithBatches(undefined, undefined, {
        dedupCacheSize: 1000,
        logger,
        store: fake<EventStore>({
          storedOffsets: async () => new Map(),
          recentEventIds: async (source: { topic: string; partition: number }, since: Date, limit: number) => {
            reads.push({ partition: source.partition, sinceAgoMs: Date.now() - since.getTime(), limit });
            if (stored instanceof Error) throw stored;
            return stored;
          },
        }),
        analysis: fake<AnalysisThread>({
          recallEventIds: async (eventIds: string[], partition: number) => void steps.push(`recall ${partition}: ${eventIds.join(',')}`),
          analyzeBatch: async (_topic: string, partition: number, messages: KafkaMessage[]) => {
            steps.push(`validate ${partition}: ${messages.length}`);
            return { rows: Buffer.alloc(0), rowCount: messages.length, rejections: [], duplicates: 0, misrouted: 0, findings: [], ruleErrors: [] };
          },
          keepPartitions: async () => ({ findings: [], ruleErrors: [] }),
        }),
      });
      return { ...made, steps, reads };
    }

    it('recalls the last hour of a partition an assignment brings before its first batch is validated, and again only when it comes back', async () => {
      const { deliver, join, steps, reads } = await recallingIntake(['evt_a', 'evt_b']);
      await deliver(range(0, 10), 200, '');
      await deliver(range(10, 10), 200, '');
      join(); // kept: this replica's memory of it is live
      await deliver(range(20, 10), 200, '');
      join([]); // it moves to another replica...
      join(); // ... and comes back
      await deliver(range(30, 10), 200, '');
      expect(steps).toEqual(['recall 0: evt_a,evt_b', 'validate 0: 10', 'validate 0: 10', 'validate 0: 10', 'recall 0: evt_a,evt_b', 'validate 0: 10']);
      expect(reads.map((read) => read.partition)).toEqual([0, 0]);
      for (const { sinceAgoMs } of reads) expect(sinceAgoMs).toBeGreaterThanOrEqual(60 * 60_000);
      for (const { sinceAgoMs } of reads) expect(sinceAgoMs).toBeLessThan(60 * 60_000 + 5_000);
    });

    it('recalls at most capacity / (2 x partitions owned) ids of a partition, so the partitions brought together never evict the memory of the others wholesale', async () => {
      const { deliver, join, reads } = await recallingIntake([]);
      await deliver(range(0, 10), 200, '');
      join([0, 1, 2, 3], 'member-2'); // the group dropped this replica, which joined again with four partitions
      await deliver(range(10, 10), 200, '');
      expect(reads.map((read) => read.limit)).toEqual([500, 125]);
    });

    it('validates the batch all the same when the read fails, and logs it', async () => {
      const warnings: { msg: string; partition?: number }[] = [];
      const { deliver, steps } = await recallingIntake(new Error('injected: storage unreachable'), createLogger('warn', { write: (line: string) => void warnings.push(JSON.parse(line)) }));
      await deliver(range(0, 10), 200, '');
      expect(steps).toEqual(['validate 0: 10']);
      expect(warnings).toContainEqual(expect.objectContaining({ msg: expect.stringContaining('cannot read the ids of events stored from the partition'), partition: 0 }));
    });
  });

  describe('after the group dropped this replica and gave its partitions back (a rejoin under a new member id)', () => {
    /**
     * An intake (intakeWithBatches) whose buffer is a real EventBuffer that holds its rows (a long
     * flush interval) until drained. `storage.storedUpTo` is the highest offset of partition 0
     * storage holds, `storage.ids` the ids it recalls; `steps` logs what the analysis thread is
     * asked, in order, and `analysisGate.wait`, once set, holds its answers.
     */
    async function intakeHoldingRows() {
      const stored: string[] = [];
      const commits: OffsetMark[][] = [];
      const steps: string[] = [];
      const storage: { storedUpTo?: number; ids: string[] } = { ids: [] };
      const analysisGate: { wait?: Promise<void> } = {};
      const brokers = { end: 1_000, committed: -1 };
      const metrics = new WorkerMetrics({ defaultMetrics: false });
      const buffer = new EventBuffer({
        flushRows: 1_000_000,
        flushIntervalMs: 60_000,
        maxBufferedRows: 1_000_000,
        storeRows: async (body) => void stored.push(...Buffer.concat(body).toString('utf8').trim().split('\n')),
        sendDeadLetters: async () => undefined,
        commit: async (offsets) => void commits.push([...offsets]),
        metrics,
        logger: createLogger('silent'),
      });
      const made = await intakeWithBatches(brokers, 60_000, {
        buffer,
        metrics,
        dedupCacheSize: 1000,
        store: fake<EventStore>({
          storedOffsets: async () => new Map(storage.storedUpTo === undefined ? [] : [[0, storage.storedUpTo]]),
          eventIdsAtFirstStoredOffset: async () => undefined,
          repairViews: async () => ({ rollup: 0, keyNetworks: 0, merchantRollup: 0 }),
          recentEventIds: async () => storage.ids,
        }),
        analysis: fake<AnalysisThread>({
          analyzeBatch: async (_topic: string, _partition: number, messages: KafkaMessage[]) => {
            steps.push(`validate ${messages[0]!.offset}-${messages.at(-1)!.offset}`);
            await analysisGate.wait;
            const rows = Buffer.from(messages.map((message) => `evt_${message.offset}\n`).join(''));
            return { rows, rowCount: messages.length, rejections: [], duplicates: 0, misrouted: 0, findings: [], ruleErrors: [] };
          },
          recallEventIds: async (eventIds: string[], partition: number) => void steps.push(`recall ${partition}: ${eventIds.join(',')}`),
          keepPartitions: async (partitions: number[]) => (steps.push(`keep [${partitions.join(',')}]`), { findings: [], ruleErrors: [] }),
        }),
      });
      /** A batch of partition 0 with these offsets, handed in and (once analysed) to the buffer. */
      const deliver = (offsets: number[]) => made.deliver(offsets, brokers.end, '');
      /** Back in the group under another member id (the group dropped this replica), with partition 0 again. */
      const rejoin = () => made.join([0], 'member-2');
      return { ...made, buffer, deliver, rejoin, stored, commits, steps, storage, analysisGate, brokers, metrics };
    }

    const evt = (offsets: number[]) => offsets.map((offset) => `evt_${offset}`);

    it('drops the rows it held of a partition given back, which another replica stored meanwhile, commits none of their old offsets, and reads the partition again as one brought', async () => {
      const { buffer, rejoin, deliver, stored, commits, steps, storage } = await intakeHoldingRows();
      await deliver(range(0, 10)); // held in the buffer: neither stored nor committed
      // This replica stalls past its session timeout; the group gives partition 0 to another replica,
      // which reads it from the committed offset (none: the start), stores offsets 0-9 and commits 10.
      storage.storedUpTo = 9;
      storage.ids = evt(range(0, 10));
      rejoin();
      await deliver(range(10, 5)); // fetched from the offset the other replica committed
      await buffer.drain();
      expect(stored).toEqual(evt(range(10, 5)));
      expect(commits).toEqual([[{ topic: 't', partition: 0, offset: 15 }]]);
      // Its memory of the partition's ids is cleared, then what storage holds is recalled before the next batch is validated.
      expect(steps).toEqual(['keep []', 'validate 0-9', 'keep []', `recall 0: ${evt(range(0, 10)).join(',')}`, 'validate 10-14']);
    });

    it('skips what the other replica stored when the partition is read again from an older committed offset', async () => {
      const { buffer, rejoin, deliver, stored, commits, storage } = await intakeHoldingRows();
      await deliver(range(0, 10));
      storage.storedUpTo = 9; // stored by the other replica, which had not committed yet when it lost the partition
      rejoin();
      await deliver(range(0, 15)); // fetched again from the committed offset: the start
      await buffer.drain();
      expect(stored).toEqual(evt(range(10, 5)));
      expect(commits).toEqual([[{ topic: 't', partition: 0, offset: 15 }]]);
    });

    it('reads again, and stores, the messages it held past what the other replica stored before the partition came back', async () => {
      const { buffer, rejoin, deliver, stored, commits, storage } = await intakeHoldingRows();
      await deliver(range(0, 20)); // held: offsets 0-19
      storage.storedUpTo = 9; // the other replica stored offsets 0-9 and committed 10, then the group gave the partition back
      rejoin();
      await deliver(range(10, 15)); // from the committed offset: 10-19 are this replica's to store now, not repeats
      await buffer.drain();
      expect(stored).toEqual(evt(range(10, 15)));
      expect(commits).toEqual([[{ topic: 't', partition: 0, offset: 25 }]]);
    });

    it('keeps the rows it holds of a partition a rebalance leaves with it under the same member id', async () => {
      const { buffer, join, deliver, stored, commits, steps } = await intakeHoldingRows();
      await deliver(range(0, 10));
      join(); // another replica joined or left; partition 0 stays here, under the same member id
      await deliver(range(10, 5));
      await buffer.drain();
      expect(stored).toEqual(evt(range(0, 15)));
      expect(commits).toEqual([[{ topic: 't', partition: 0, offset: 15 }]]);
      expect(steps).toEqual(['keep []', 'validate 0-9', 'keep [0]', 'validate 10-14']);
    });

    it('does not hand to the buffer a batch fetched before the group dropped it and analysed after it rejoined', async () => {
      const { buffer, rejoin, deliver, stored, commits, steps, storage, analysisGate } = await intakeHoldingRows();
      let analysed!: () => void;
      analysisGate.wait = new Promise<void>((resolve) => (analysed = resolve));
      const delivering = deliver(range(0, 10));
      await vi.waitFor(() => expect(steps).toContain('validate 0-9')); // the analysis thread has not answered yet
      storage.storedUpTo = 9;
      rejoin();
      analysed();
      await delivering;
      analysisGate.wait = undefined;
      await deliver(range(10, 5));
      await buffer.drain();
      expect(stored).toEqual(evt(range(10, 5)));
      expect(commits).toEqual([[{ topic: 't', partition: 0, offset: 15 }]]);
    });

    it('does not take a commit begun before it rejoined, which may land after it, for the committed offset of the partition', async () => {
      const { intake, rejoin, group, brokers, metrics } = await intakeHoldingRows();
      let committed!: () => void;
      group.commit = () => new Promise<void>((resolve) => (committed = resolve));
      const commit = intake.commit([{ topic: 't', partition: 0, offset: 10 }]); // retried by kafkajs while the group is without this replica
      brokers.committed = 500; // the other replica's progress meanwhile
      rejoin();
      const lag = async () => (await metrics.consumerLag.get()).values.find((value) => value.labels.partition === 0)?.value;
      await vi.waitFor(async () => expect(await lag()).toBe(500));
      committed();
      await commit;
      expect(await lag()).toBe(500);
    });
  });

  it('judges a partition an assignment brings once the alerts of other replicas are read since, retrying a failed read; one it keeps at once', async () => {
    /** Per read of the alerts: how many batches had been judged before it. */
    const reads: number[] = [];
    let failures = 1;
    const { intake, deliver, analysed, join } = await intakeWithBatches(undefined, undefined, {
      syncAlerts: async () => {
        reads.push(analysed.length);
        if (failures-- > 0) throw new Error('injected: reading the alerts failed');
      },
    });
    const delivering = deliver(range(0, 10), 200, '');
    await vi.waitFor(() => expect(intake.notReadyReason).toBe('storage unavailable: cannot read the alerts of other replicas'));
    await delivering;
    expect(reads).toEqual([0, 0]); // the failed read, then the one that let the batch be judged
    expect(intake.notReadyReason).toBeUndefined();
    await deliver(range(100, 10), 200, '');
    join(); // kept: this replica wrote its keys' alerts itself
    await deliver(range(110, 10), 200, '');
    expect(reads).toEqual([0, 0]);
    join([]); // it moves to another replica...
    join(); // ... and comes back
    await deliver(range(120, 10), 200, '');
    expect(reads).toEqual([0, 0, 3]);
    expect(analysed).toHaveLength(4);
  });
});
