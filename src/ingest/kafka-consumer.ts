/**
 * Kafka intake (kafkajs, eachBatch). Each message ends as stored, dead-lettered or dropped as a
 * duplicate, and every outcome is counted.
 *
 * Contract: offsets are committed only after the rows (and dead letters) up to them are stored
 * (at-least-once). A message at or below the highest offset already stored for its partition is a
 * redelivery and is skipped, so a restart does not count anything twice, unless those stored offsets
 * are an earlier incarnation's of the topic (see readStoredOffset). A storage outage pauses the
 * topic and commits nothing until storage is back. On shutdown the owner stops fetching (a batch
 * still waiting on storage gives up), drains the shared EventBuffer (which commits through this
 * intake), then disconnects, within a deadline.
 *
 * A partition an assignment brings is validated once the ids of its recently stored events are
 * recalled (so a re-publish across a restart or a rebalance is a repeat) and judged once its
 * detection windows are warmed (a recall or warm-up that storage fails is not fatal; one a rebalance
 * cuts short leaves its batch to be fetched again) and the alerts other replicas wrote are read
 * again; a partition kept through a rebalance goes on at once. One the group gives back to this
 * replica after dropping it (a rejoin under a new member id: a session that timed out, a crash) is
 * not kept but lost and brought: what this replica still held of it (buffered rows, offsets to
 * commit, how far it was handed off, its recent ids and windows) is dropped first, as another
 * replica may have stored and committed it meanwhile.
 *
 * Consumer lag (security_center_consumer_lag) is, per partition this replica owns, the partition's
 * end (high watermark) minus the group's committed offset: the messages not yet stored and
 * committed. It is read from the brokers every few seconds, paused or not, so that it keeps growing
 * through a storage outage, and updated in between by each batch and commit.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { doneWithin, unlessAborted } from '../deadlines.ts';
import { FailureLog } from '../failure-log.ts';
import { Partitioners, type Admin, type Batch, type Consumer, type EachBatchPayload, type Kafka, type KafkaMessage, type Producer } from 'kafkajs';
import type { RequestEvent } from '../events/request-event.ts';
import type { Logger } from '../logger.ts';
import type { WorkerMetrics } from '../metrics.ts';
import type { EventStore } from '../store/event-store.ts';
import type { AnalysisThread, Detection } from './analysis-thread.ts';
import { KafkaDeadLetterQueue, toDeadLetter, type DeadLetter } from './dead-letter.ts';
import type { EventBuffer, OffsetMark } from './event-buffer.ts';
import { explainSaslRefusal, sendInRequests, type KafkaClientOptions } from './kafka-client.ts';

/** How long after the last misrouted event the warning says it ended. */
const MISROUTED_QUIET_MS = 10 * 60_000;

export interface KafkaIntakeOptions {
  kafka: Kafka;
  topic: string;
  dlqTopic: string;
  groupId: string;
  fromBeginning: boolean;
  sessionTimeoutMs: number;
  heartbeatIntervalMs: number;
  maxWaitMs: number;
  store: EventStore;
  /** Validates batches and runs detection, off the main thread. */
  analysis: AnalysisThread;
  /** Receives each batch's findings, in fetch order. */
  onDetection(detection: Detection): void;
  /**
   * Loads recent history of a partition this replica now owns into the detection windows, calling
   * heartbeat after each page it loads; `partitionsOwned` share the windows' budget.
   */
  warmPartition?(partition: number, heartbeat: () => Promise<void>, partitionsOwned: number): Promise<void>;
  /**
   * The capacity of the analysis thread's memory of recent eventIds (DEDUP_CACHE_SIZE). Set, a
   * partition an assignment brings has the ids of its events stored in the last
   * RECALL_EVENT_IDS_MS recalled into that memory before its first batch is validated (see
   * recallEventIds), so that a re-publish of an event another replica, or this one before a
   * restart, stored is dropped as a repeat rather than counted twice by the rollup.
   */
  dedupCacheSize?: number;
  /**
   * Learns the alerts other replicas wrote; rejects when they cannot be read. A partition an
   * assignment brings is judged only after one such read made since that assignment: an alert its
   * previous owner opened for a key moments before is then continued, not opened a second time.
   */
  syncAlerts?(): Promise<void>;
  /** The shared write path; it calls back commit(), sendDeadLetters(), pause() and resume(). */
  buffer: EventBuffer;
  /** Called once if intake stops for good: the consumer crashed beyond kafkajs's restarts, or a batch could not be analysed. */
  onStopped?(error: Error): void;
  metrics: WorkerMetrics;
  logger: Logger;
  /** How often the consumer lag of the owned partitions is read from the brokers (LAG_INTERVAL_MS by default). */
  lagIntervalMs?: number;
  /** KAFKA_SASL_* and KAFKA_SSL, as `kafka` was made with: a start or publish the brokers refuse for SASL names them (explainSaslRefusal). */
  sasl?: KafkaClientOptions['sasl'];
  ssl?: KafkaClientOptions['ssl'];
}

/**
 * Tells when the replica catches up with a backlog: a batch that leaves no message behind it on its
 * partition, when its partition and no other was behind before. The buffer then stores at once
 * what it holds instead of waiting out the flush interval (event-buffer.ts).
 */
export class BacklogWatch {
  /** Partitions whose last batch left messages behind it (consumer lag above 0). */
  private readonly behind = new Set<number>();

  /** Records a batch's lag; true when the replica has just caught up. */
  note(partition: number, lag: number): boolean {
    if (lag > 0) {
      this.behind.add(partition);
      return false;
    }
    return this.behind.delete(partition) && this.behind.size === 0;
  }

  /** After a rebalance: partitions may have gone elsewhere. */
  reset(): void {
    this.behind.clear();
  }
}

/** Fetched batches allowed to wait for the analysis thread before the consumer waits too. */
const MAX_BATCHES_IN_FLIGHT = 16;

/** How often the consumer lag of the owned partitions is read from the brokers, fetching or paused. */
export const LAG_INTERVAL_MS = 5_000;

/** How far back the ids of stored events are recalled, so that a retry or re-publish across a restart or rebalance is a repeat (publishers retry within minutes): by a partition an assignment brings, and, without Kafka, by a start for posted events (main.ts). */
export const RECALL_EVENT_IDS_MS = 60 * 60_000;

/** How long disconnect() waits for the consumer to leave its group (and the producer to close) before going on without. */
export const DISCONNECT_DEADLINE_MS = 5_000;

export class KafkaIntake {
  private readonly buffer: EventBuffer;
  private readonly consumer: Consumer;
  /** Dead letters, and events posted over HTTP (publish). */
  private readonly producer: Producer;
  /** The producer's connection, made by the first of start() and publish(); cleared when it fails, to be tried again. */
  private producerConnection: Promise<void> | undefined;
  private readonly deadLetterQueue: KafkaDeadLetterQueue;
  /** Highest offset per partition known to be stored or handed to the buffer, for skipping redeliveries. */
  private readonly handedOff = new Map<number, number>();
  /** Partitions of the topic this replica owns since the last rebalance. */
  private owned: ReadonlySet<number> = new Set();
  /**
   * Per owned partition, the assignment (count) that brought it: a batch fetched under an earlier
   * one (before the partition moved away and back, or before the group dropped this replica and
   * gave it back) is not handed to the buffer, as its partition's rows were released since.
   */
  private readonly tenures = new Map<number, number>();
  /** Stored offsets read from ClickHouse, per partition, refreshed after each rebalance. */
  private storedOffsets = new Map<number, Promise<number>>();
  /** Recall of stored eventIds, then detection warm-up, per partition, started on its first batch after an assignment that brought it. */
  private readonly warmups = new Map<number, Promise<void>>();
  /** This replica's member id in the group at the last assignment. */
  private memberId: string | undefined;
  /** The partitions the last assignment brought (broughtBy). */
  private brought: ReadonlySet<number> = new Set();
  /** The read of other replicas' alerts made since the last assignment (syncAlerts), once one is started. */
  private alertsSynced: Promise<void> | undefined;
  private running = false;
  /** Validated batches are added to the buffer in fetch order, through this chain. */
  private chain: Promise<void> = Promise.resolve();
  private batchesInFlight = 0;
  private readonly backlog = new BacklogWatch();
  private failure: Error | undefined;
  private stoppedBy: Error | undefined;
  /** Set while a read a batch waits for keeps failing: what cannot be read. */
  private readFailure: string | undefined;
  /**
   * Why the consumer is not consuming, until it has joined its group: starting, the last start that
   * failed (brokers unreachable; the owner retries), or a crash kafkajs restarts from (its run() may
   * even resolve after one).
   */
  private notConsuming: string | undefined = 'kafka consumer starting: connecting to the brokers';
  /** Partitions whose stored offsets were found to be an earlier incarnation's of the topic, reported once each. */
  private readonly staleReported = new Set<number>();
  /** Whether the topic is to be paused (by the owner, for an outage or the shutdown): a consumer group kafkajs makes anew is paused again. */
  private pauseWanted = false;
  /** Aborted by stopFetching(): batches waiting on storage give up, and nothing more is handed off. */
  private readonly stopping = new AbortController();
  /** Reads partition ends and committed offsets for the lag; connected on first use. */
  private readonly admin: Admin;
  private adminConnection: Promise<void> | undefined;
  private lagTimer: NodeJS.Timeout | undefined;
  private lagReading: Promise<void> | undefined;
  private lagReadAgain = false;
  /** Counts assignments (GROUP_JOIN), so that a lag read begun before one is not applied after it. */
  private assignment = 0;
  /** Per owned partition: its end (high watermark) and the offset committed for it, as last known. */
  private readonly partitionEnds = new Map<number, number>();
  private readonly committedOffsets = new Map<number, number>();
  /** Events keyed by something other than their apiKeyId: a producer's fault, logged as a state while it lasts. */
  private readonly misroutedLog: FailureLog;

  constructor(private readonly options: KafkaIntakeOptions) {
    const { kafka, logger } = options;
    this.misroutedLog = new FailureLog(
      logger,
      "events whose Kafka message key is not their apiKeyId: producers must key messages by apiKeyId, or with several replicas one key's events are split between them and detection sees part of each",
      'events are keyed by their apiKeyId again',
      // A producer's keying is a state, not an incident: mixed with well-keyed batches (one producer
      // of several), it has not ended until none came for a while.
      { level: 'warn', quietMs: MISROUTED_QUIET_MS },
    );
    this.consumer = kafka.consumer({
      groupId: options.groupId,
      sessionTimeout: options.sessionTimeoutMs,
      rebalanceTimeout: Math.max(options.sessionTimeoutMs, 10_000),
      heartbeatInterval: options.heartbeatIntervalMs,
      maxWaitTimeInMs: options.maxWaitMs,
      maxBytesPerPartition: 4 * 1024 * 1024,
      retry: { retries: 10 },
    });
    // kafkajs's default partitioner (murmur2, Java's for keyed messages; README), named so that
    // kafkajs does not warn at every start that its default changed in v2: the key→partition mapping
    // the fleet's producers share stays the same.
    this.producer = kafka.producer({ idempotent: true, maxInFlightRequests: 1, createPartitioner: Partitioners.DefaultPartitioner });
    this.admin = kafka.admin();
    this.deadLetterQueue = new KafkaDeadLetterQueue(this.producer, options.dlqTopic);
    this.buffer = options.buffer;
    // A new assignment may bring partitions another replica stored into: read their progress again.
    this.consumer.on(this.consumer.events.GROUP_JOIN, (event) => {
      // After a crash kafkajs restarts with a consumer group of its own, which is not paused (the
      // pause state lives in the group object): pause it again before its first fetch, which follows
      // this event, if storage is still out or the worker is stopping. A consumer started during an
      // outage is paused here too. (Listeners run synchronously from kafkajs's join.)
      if (this.pausedNow) this.tryConsumer(() => this.consumer.pause([{ topic: options.topic }]));
      this.notConsuming = undefined;
      this.storedOffsets = new Map();
      this.backlog.reset();
      this.readFailure = undefined; // the batch that kept failing may have gone with its partition
      const owned = event.payload.memberAssignment[options.topic] ?? [];
      this.brought = this.broughtBy(event.payload.memberId, owned);
      // The partitions kept through this rebalance; every other one was lost, even one the
      // assignment gives back: when the group dropped this replica meanwhile (a session that timed
      // out), another replica may have stored and committed what this one still holds of it.
      const kept = owned.filter((partition) => !this.brought.has(partition));
      // The windows of the partitions it keeps are live: warming them again would re-read up to a
      // million events each while intake waits. Those it brings are warmed on their first batch, and
      // judged once the alerts other replicas wrote have been read again (handleBatch).
      for (const partition of this.warmups.keys()) if (!owned.includes(partition) || this.brought.has(partition)) this.warmups.delete(partition);
      this.alertsSynced = undefined;
      options.metrics.assignedPartitions.set(owned.length);
      // A partition's lag is reported by its owner only: a moved one's last figure would stay behind,
      // counted twice. Owned ones are read again at once.
      this.assignment++;
      options.metrics.consumerLag.reset();
      this.partitionEnds.clear();
      this.committedOffsets.clear();
      this.releasePartitions(new Set(owned), new Set(kept));
      this.readLagSoon();
      // Keys of partitions that moved to another replica are its to watch now. Those of a partition
      // given back after the group dropped this replica are forgotten too, with the ids of its
      // events: the rows not stored were dropped, and whatever was stored meanwhile is recalled and
      // warmed again before its first batch, as for any partition an assignment brings.
      options.analysis.keepPartitions(kept).catch(() => undefined);
      logger.info({ assignment: event.payload.memberAssignment }, 'kafka partitions assigned');
    });
    this.consumer.on(this.consumer.events.CRASH, (event) => {
      const { error, restart } = event.payload;
      logger.error({ err: error, restart }, 'kafka consumer crashed');
      this.notConsuming = `kafka consumer crashed and is restarting: ${error.message}`;
      // kafkajs restarts after retriable errors only; otherwise nothing is consumed any more, and
      // a worker that looks alive while it consumes nothing is worse than one that stops.
      if (!restart) this.stopFor(new Error(`kafka consumer stopped: ${error.message}`));
    });
  }

  /**
   * Connects, joins the group and starts fetching. A stop (stopFetching) that comes while a step is
   * under way ends the start before the next step, and the start rejects: the owner's stop may have
   * given up waiting for it and called disconnect() already, which leaves alone a consumer that is not
   * running yet, so a consumer this start connected is disconnected here. Otherwise it would go on to
   * join the group and fetch, with no one left to take it out (its partitions held until the session
   * timeout, and the process kept alive).
   */
  async start(): Promise<void> {
    let consumerConnecting = false;
    try {
      this.throwIfStopping();
      await this.connectProducer();
      this.throwIfStopping();
      consumerConnecting = true;
      await this.consumer.connect();
      this.throwIfStopping();
      await this.consumer.subscribe({ topic: this.options.topic, fromBeginning: this.options.fromBeginning });
      this.throwIfStopping();
      await this.consumer.run({
        autoCommit: false,
        eachBatchAutoResolve: false,
        eachBatch: (payload) => this.handleBatch(payload),
      });
      this.throwIfStopping();
    } catch (error) {
      if (this.stopping.signal.aborted) {
        if (consumerConnecting) await this.disconnectStoppedStart();
        throw error;
      }
      const explained = explainSaslRefusal(error, this.options);
      this.notConsuming = `kafka consumer cannot start (retrying): ${(explained as Error).message}`;
      throw explained;
    }
    this.running = true;
    // Storage may have gone out, or come back, since the join paused it or not (pause() and resume()
    // do not reach a consumer that is not running yet).
    const topics = [{ topic: this.options.topic }];
    this.tryConsumer(() => (this.pausedNow ? this.consumer.pause(topics) : this.consumer.resume(topics)));
    this.lagTimer = setInterval(() => this.readLagSoon(), this.options.lagIntervalMs ?? LAG_INTERVAL_MS);
    this.lagTimer.unref();
    this.options.logger.info({ topic: this.options.topic, groupId: this.options.groupId }, 'kafka intake started');
  }

  private throwIfStopping(): void {
    if (this.stopping.signal.aborted) throw new Error('kafka intake stopped while starting');
  }

  /** Disconnects the consumer of a start the stop overtook (see start), within DISCONNECT_DEADLINE_MS. */
  private async disconnectStoppedStart(): Promise<void> {
    const leaving = this.consumer.disconnect();
    leaving.catch((error: unknown) => this.options.logger.warn({ err: error }, 'disconnecting the kafka consumer of a start the stop overtook failed'));
    if (!(await doneWithin(leaving, DISCONNECT_DEADLINE_MS).catch(() => true))) {
      this.options.logger.error({ deadlineMs: DISCONNECT_DEADLINE_MS }, 'the kafka consumer of a start the stop overtook did not disconnect in time; going on without');
    }
  }

  /** Why intake stopped for good, if it did. */
  get stoppedReason(): string | undefined {
    return this.stoppedBy?.message;
  }

  /** Why intake cannot go on for now, if it cannot: stopped for good, not consuming (yet), or storage unreadable. */
  get notReadyReason(): string | undefined {
    return this.stoppedReason ?? this.notConsuming ?? (this.readFailure && `storage unavailable: ${this.readFailure}`);
  }

  /** Intake will take nothing more: the owner is told once, and stops the worker. */
  private stopFor(error: Error): void {
    if (this.stoppedBy) return;
    this.stoppedBy = error;
    this.options.metrics.assignedPartitions.set(0);
    clearInterval(this.lagTimer);
    this.assignment++; // a lag read in progress is not applied
    this.options.metrics.consumerLag.reset();
    this.options.onStopped?.(error);
  }

  /** The partitions of the topic this replica owns now (since the last assignment). */
  get ownedPartitions(): ReadonlySet<number> {
    return this.owned;
  }

  /** Stops fetching (partitions stay assigned, so offsets can still be committed). */
  pause(): void {
    this.pauseWanted = true;
    // kafkajs throws when the consumer is not running (not started yet, or crashed and restarting):
    // the next GROUP_JOIN pauses it then.
    if (this.running) this.tryConsumer(() => this.consumer.pause([{ topic: this.options.topic }]));
  }

  resume(): void {
    if (this.stopping.signal.aborted) return; // stopping: paused for good
    this.pauseWanted = false;
    if (this.running) this.tryConsumer(() => this.consumer.resume([{ topic: this.options.topic }]));
  }

  /** Whether the topic is to be paused now: by the owner (an outage, the shutdown), or for a failed batch. */
  private get pausedNow(): boolean {
    return this.pauseWanted || !this.buffer.healthy || this.failure !== undefined;
  }

  /**
   * At shutdown, before the buffer drains: pauses for good, and a batch still waiting on storage (how
   * far its partition is stored, its detection warm-up) gives up at once, handing nothing to the
   * buffer. Its offsets are not committed, so Kafka delivers it again to the next owner; and the
   * consumer, no longer held by it, can leave its group at once.
   */
  stopFetching(): void {
    this.stopping.abort();
    clearInterval(this.lagTimer);
    this.pause();
  }

  private tryConsumer(action: () => void): void {
    try {
      action();
    } catch (error) {
      this.options.logger.warn({ err: error }, 'kafka consumer is not running');
    }
  }

  /** Resolves when every fetched batch has been validated and handed to the buffer. */
  async settle(): Promise<void> {
    await this.chain.catch(() => undefined);
  }

  /**
   * Leaves the group. Settle and drain the buffer first: commits need group membership. Waits at most
   * `deadlineMs` (kafkajs waits for the batch in progress before it leaves; stopFetching() makes one
   * waiting on storage give up), then goes on without: the group moves the partitions after the
   * session timeout then.
   */
  async disconnect(deadlineMs = DISCONNECT_DEADLINE_MS): Promise<void> {
    this.stopFetching();
    const wasRunning = this.running;
    this.running = false;
    const leaving = (async () => {
      if (wasRunning) await this.consumer.disconnect();
      // The producer may be connected without the consumer: by a post during start-up.
      const connection = this.producerConnection;
      this.producerConnection = undefined;
      const admin = this.adminConnection;
      this.adminConnection = undefined;
      await Promise.all([
        connection && connection.then(() => this.producer.disconnect(), () => undefined),
        admin && admin.then(() => this.admin.disconnect(), () => undefined),
      ]);
    })();
    const inTime = await doneWithin(leaving, deadlineMs);
    if (!inTime) {
      leaving.catch((error: unknown) => this.options.logger.warn({ err: error }, 'disconnecting from kafka failed'));
      this.options.logger.error({ deadlineMs }, 'kafka intake did not disconnect in time; going on without (its partitions move after the session timeout)');
      return;
    }
    if (wasRunning) this.options.logger.info('kafka intake stopped');
  }

  /** Resolves to undefined as soon as stopFetching() is called, else as `promise` does. */
  private unlessStopping<T>(promise: Promise<T>): Promise<T | undefined> {
    return unlessAborted(promise, this.stopping.signal);
  }

  /** Reads the lag of the owned partitions now (after the read in progress, if one is). */
  private readLagSoon(): void {
    if (this.lagReading) {
      this.lagReadAgain = true;
      return;
    }
    this.lagReading = this.readLag()
      .catch((error: unknown) => this.options.logger.debug({ err: error }, 'reading consumer lag failed'))
      .finally(() => {
        this.lagReading = undefined;
        if (this.lagReadAgain) {
          this.lagReadAgain = false;
          this.readLagSoon();
        }
      });
  }

  /** The owned partitions' ends and committed offsets, from the brokers: two requests, beside the consumer's. */
  private async readLag(): Promise<void> {
    const { topic, groupId, fromBeginning } = this.options;
    const owned = this.owned;
    const assignment = this.assignment;
    if (owned.size === 0 || this.stopping.signal.aborted || this.stoppedBy) return;
    this.adminConnection ??= this.admin.connect().catch((error: unknown) => {
      this.adminConnection = undefined;
      throw error;
    });
    await this.adminConnection;
    const [ends, groupOffsets] = await Promise.all([this.admin.fetchTopicOffsets(topic), this.admin.fetchOffsets({ groupId, topics: [topic] })]);
    if (assignment !== this.assignment || this.stopping.signal.aborted) return; // rebalanced meanwhile: read again by then
    const committed = new Map((groupOffsets.find((entry) => entry.topic === topic)?.partitions ?? []).map((entry) => [entry.partition, Number(entry.offset)]));
    for (const { partition, high, low } of ends) {
      if (!owned.has(partition)) continue;
      const offset = committed.get(partition) ?? -1;
      // Nothing committed yet: the consumer starts at the partition's start or end. Committed below
      // the start (removed by retention): it starts at the start.
      const from = offset >= 0 ? offset : fromBeginning ? Number(low) : Number(high);
      this.partitionEnds.set(partition, Number(high));
      // A commit of this replica's that landed after this read's answer was made is not undone.
      this.committedOffsets.set(partition, Math.max(from, Number(low), this.committedOffsets.get(partition) ?? -1));
      this.reportLag(partition);
    }
  }

  /** Counts a batch's events keyed by something other than their apiKeyId, and says so while it lasts (at most a line a minute). */
  private noteMisrouted(misrouted: number, partition: number): void {
    if (misrouted === 0) return this.misroutedLog.succeeded();
    this.options.metrics.eventsMisrouted.inc(misrouted);
    this.misroutedLog.failed({ topic: this.options.topic, partition, events: misrouted });
  }

  /** Sets a partition's lag from its last known end and committed offset. */
  private reportLag(partition: number): void {
    const end = this.partitionEnds.get(partition);
    const committed = this.committedOffsets.get(partition);
    if (end === undefined || committed === undefined || !this.owned.has(partition)) return;
    this.options.metrics.consumerLag.set({ topic: this.options.topic, partition }, Math.max(0, end - committed));
  }

  private connectProducer(): Promise<void> {
    this.producerConnection ??= this.producer.connect().catch((error: unknown) => {
      this.producerConnection = undefined;
      throw explainSaslRefusal(error, this.options);
    });
    return this.producerConnection;
  }

  sendDeadLetters(records: readonly DeadLetter[]): Promise<void> {
    return this.deadLetterQueue.send(records);
  }

  /**
   * Produces events posted over HTTP to the input topic, keyed by apiKeyId as the fleet's producers
   * key theirs, so that the replica that owns the key's partition stores and detects them with the
   * key's other events. Resolves once all in-sync replicas have them. The producer is idempotent (its
   * retries add no copies) and retries until the brokers take them. Needs no consumer: posts are
   * taken while the worker starts, and consumed once it has.
   */
  async publish(events: readonly RequestEvent[]): Promise<void> {
    await this.connectProducer();
    return sendInRequests(this.producer, this.options.topic, events.map((event) => ({ key: event.apiKeyId, value: JSON.stringify(event) })));
  }

  /**
   * Commits offsets the buffer stored up to. The buffer drops the marks of partitions lost in a
   * rebalance before it commits (releasePartitions), so a commit made after one never carries them.
   * One made before it and still being retried when it comes may land under the new membership
   * (kafkajs retries a failed commit, with the group's generation at each attempt), and move the
   * group's committed offset of a partition back behind another replica's commits until the
   * partition's next commit (a later rebalance reads it again from there, skipping what is stored).
   * It cannot be called back; it is not taken here for the partition's committed offset (the lag),
   * which is read again from the brokers instead, and it is logged.
   */
  async commit(offsets: readonly OffsetMark[]): Promise<void> {
    if (offsets.length === 0) return;
    const tenures = offsets.map(({ partition }) => this.tenures.get(partition));
    await this.consumer.commitOffsets(offsets.map(({ topic, partition, offset }) => ({ topic, partition, offset: String(offset) })));
    const overtaken: number[] = [];
    for (const [index, { topic, partition, offset }] of offsets.entries()) {
      if (topic !== this.options.topic) continue;
      if (this.tenures.get(partition) !== tenures[index]) {
        overtaken.push(partition);
        continue;
      }
      if (!this.owned.has(partition)) continue;
      this.committedOffsets.set(partition, offset);
      this.reportLag(partition);
    }
    if (overtaken.length > 0) {
      this.options.logger.info(
        { partitions: overtaken },
        'an offset commit begun before a rebalance ended after it: if it landed under the new membership, the committed offset of these partitions may lag behind until their next commit',
      );
      this.readLagSoon();
    }
  }

  private async handleBatch({ batch, resolveOffset, heartbeat, isRunning, isStale }: EachBatchPayload): Promise<void> {
    // A failed validation stops intake before anything after it can be committed.
    if (this.failure) throw this.failure;
    if (!isRunning() || isStale() || batch.isEmpty() || this.stopping.signal.aborted) return;
    const started = performance.now();
    const { topic, partition } = batch;
    const { metrics } = this.options;
    // The assignment this batch was fetched under: one that ends before the batch is handed off
    // (its partition lost, if only to be given back) leaves the batch to be fetched again.
    const tenure = this.tenures.get(partition);
    const stillHeld = () => tenure !== undefined && this.tenures.get(partition) === tenure;
    // Stopping meanwhile: the batch is left to the next owner (nothing of it is committed).
    const payload = { heartbeat, isRunning, isStale };
    const alreadyStored = await this.unlessStopping(this.whenReadable(() => this.skipUpTo(batch), 'cannot read how far partitions are stored', partition, payload));
    if (alreadyStored === undefined) return;
    // A rebalance that cuts the warm-up short throws here: nothing of the batch is judged or handed off.
    if ((await this.unlessStopping(this.warmup(partition, heartbeat).then(() => true))) === undefined) return;
    // A partition this assignment brought: its previous owner may have opened alerts for its keys
    // since this replica last read them (every 5 s); judged without them, they would open again.
    if (this.brought.has(partition)) {
      const synced = this.whenReadable(() => this.alertsSyncedSinceAssignment(), 'cannot read the alerts of other replicas', partition, payload);
      if ((await this.unlessStopping(synced.then(() => true))) === undefined) return;
    }
    // Lost in a rebalance meanwhile: its messages are the new owner's, and validating them here would
    // make this replica take them for repeats if the partition came back. So is one given back after
    // the group dropped this replica: its memory of the partition was cleared (releasePartitions),
    // and it is read again from the committed offset.
    if (!stillHeld() || isStale() || !isRunning() || this.stopping.signal.aborted) return;
    const fresh = batch.messages.filter((message) => Number(message.offset) > alreadyStored);
    const redelivered = batch.messages.length - fresh.length;
    const analysis = fresh.length > 0 ? this.options.analysis.analyzeBatch(topic, partition, fresh) : undefined;
    // The chain awaits it; after a failure earlier in the chain nothing does, and that is expected.
    analysis?.catch(() => undefined);
    const lastOffset = Number(batch.lastOffset());
    this.handedOff.set(partition, Math.max(this.handedOff.get(partition) ?? -1, lastOffset));
    resolveOffset(batch.lastOffset()); // moves the fetch position on; the commit waits for storage
    metrics.eventsConsumed.inc({ source: 'kafka' }, batch.messages.length);
    if (redelivered > 0) metrics.eventsDuplicate.inc({ source: 'kafka' }, redelivered);
    this.partitionEnds.set(partition, Number(batch.highWatermark));
    this.reportLag(partition);
    const mark: OffsetMark = { topic, partition, offset: lastOffset + 1 };
    // Messages left behind this batch (not the lag, which counts those not yet committed too).
    const endsBacklog = this.backlog.note(partition, Math.max(0, Number(batch.highWatermark) - lastOffset - 1));

    this.batchesInFlight++;
    const step = this.chain.then(async () => {
      const result = analysis ? await analysis : undefined;
      // Moved to another replica meanwhile (perhaps given back since): its messages are the owner's, read again from the committed offset.
      if (!stillHeld()) return;
      const deadLetters = (result?.rejections ?? []).map(({ rejection, text, offset, timestamp }) => toDeadLetter(rejection, text, { topic, partition, offset, timestamp }));
      if (result && result.duplicates > 0) metrics.eventsDuplicate.inc({ source: 'kafka' }, result.duplicates);
      if (result) this.noteMisrouted(result.misrouted, partition);
      void this.buffer.add({ encodedRows: result && { bytes: result.rows, count: result.rowCount }, deadLetters, offsets: [mark], endsBacklog });
      if (result) this.options.onDetection(result);
      metrics.batchDuration.observe((performance.now() - started) / 1000);
    });
    this.chain = step.finally(() => this.batchesInFlight--);
    // A failed step leaves the chain rejected, so nothing after it is added; step.catch below reports it.
    this.chain.catch(() => undefined);
    step.catch((error: Error) => {
      if (this.failure) return;
      // Stopping: the analysis thread may be closed before a batch's turn (settle() has a deadline).
      // Nothing of it or after it is committed; the next owner reads it again.
      if (this.stopping.signal.aborted) {
        this.options.logger.info({ err: error }, 'a batch was not analysed before the shutdown');
        return;
      }
      this.failure = error;
      this.pause();
      this.options.logger.error({ err: error }, 'analysing a batch failed; intake stopped, nothing after it is committed');
      // Paused, no batch would come to report it: the worker must stop rather than look alive.
      this.stopFor(new Error(`analysing a batch failed: ${error.message}`));
    });
    // Bound the batches waiting for validation; then the usual storage backpressure.
    if (this.batchesInFlight > MAX_BATCHES_IN_FLIGHT) await this.unlessStopping(this.settle());
    await heartbeat();
    await this.buffer.waitForCapacity(heartbeat);
  }

  /**
   * After a rebalance, lets go of every partition not kept through it: those that moved to another
   * replica, and those given back after the group dropped this replica (another replica may have
   * owned them meanwhile). What the buffer still holds of them is dropped, offsets included (the
   * owner reads it again from the committed offset, skipping what is stored), and so is the memory
   * of how far they were handed off, which would skip those messages when a partition comes back,
   * or commit an offset that another replica's commits have passed.
   */
  private releasePartitions(owned: ReadonlySet<number>, kept: ReadonlySet<number>): void {
    this.owned = owned;
    for (const partition of this.handedOff.keys()) if (!kept.has(partition)) this.handedOff.delete(partition);
    for (const partition of this.tenures.keys()) if (!kept.has(partition)) this.tenures.delete(partition);
    for (const partition of owned) if (!kept.has(partition)) this.tenures.set(partition, this.assignment);
    const dropped = this.buffer.releasePartitions(this.options.topic, kept);
    if (dropped > 0) this.options.logger.info({ rows: dropped }, 'dropped buffered rows of partitions lost in a rebalance (now another replica\'s, or given back after the group dropped this one)');
  }

  /**
   * The partitions an assignment brings: those this replica did not own before it; all of them when
   * its member id changed, as the group dropped it meanwhile (a crash, a session that timed out) and
   * another replica may have owned them since. Called before `owned` is updated.
   */
  private broughtBy(memberId: string, owned: readonly number[]): ReadonlySet<number> {
    const stayed = memberId === this.memberId;
    this.memberId = memberId;
    return new Set(owned.filter((partition) => !stayed || !this.owned.has(partition)));
  }

  /** One read of the alerts other replicas wrote, started since the last assignment; a failed one is started again on the next call. */
  private alertsSyncedSinceAssignment(): Promise<void> {
    const { syncAlerts } = this.options;
    if (!syncAlerts) return Promise.resolve();
    if (!this.alertsSynced) {
      const read = syncAlerts();
      read.catch(() => {
        if (this.alertsSynced === read) this.alertsSynced = undefined;
      });
      this.alertsSynced = read;
    }
    return this.alertsSynced;
  }

  /**
   * Warms detection for a partition once per assignment that brings it. A warm-up that storage fails
   * is logged, not fatal. One whose heartbeat failed (the group is rebalancing) rejects and is
   * forgotten: its batch, judged on half-warmed windows, would be committed and never judged again.
   * handleBatch throws it to kafkajs, which rejoins and fetches the batch again; the partition is
   * warmed on its next assignment.
   */
  private warmup(partition: number, heartbeat: () => Promise<void>): Promise<void> {
    const { warmPartition, dedupCacheSize } = this.options;
    if (!warmPartition && dedupCacheSize === undefined) return Promise.resolve();
    const warming = this.warmups.get(partition);
    if (warming) return warming;
    const started = (async () => {
      // Every plan's events: the rollup counts them all, not only the entitled plans' the warm-up loads.
      if (dedupCacheSize !== undefined) await this.recallEventIds(partition, dedupCacheSize);
      if (warmPartition) await this.warmOrFailOpen(warmPartition, partition, heartbeat);
    })();
    started.catch(() => {
      if (this.warmups.get(partition) === started) this.warmups.delete(partition);
    });
    this.warmups.set(partition, started);
    return started;
  }

  /**
   * Recalls into the analysis thread's memory of recent eventIds the ids of a partition's events
   * stored in the last RECALL_EVENT_IDS_MS (by the replica that owned it before, or by this one
   * before a restart): that memory lives in the process and keeps only the partitions this replica
   * owns, so without this a re-publish (a producer's retry or replay, a client's retry of a post)
   * that crosses a restart or a rebalance would be stored again, and counted twice by the rollup.
   * Runs before the partition's first batch is validated (the thread handles requests in order).
   *
   * At most capacity / (2 x partitions owned) ids, the newest: the memory is two generations of
   * capacity / 2, and a generation filled up drops the older one whole. So the partitions an
   * assignment brings recall at most one generation's worth together, and the newer generation of
   * the ids of the partitions kept (those this replica had already seen) survives it; each recalls
   * its share of what the memory is sure to hold (capacity / 2) when traffic is even. Recalling
   * capacity / 2 for each would make every brought partition evict the others' ids wholesale.
   * A failed read fails open, as the warm-up does: logged, and intake goes on.
   */
  private async recallEventIds(partition: number, capacity: number): Promise<void> {
    const { store, analysis, topic, logger } = this.options;
    const limit = Math.max(1, Math.floor(capacity / (2 * Math.max(1, this.owned.size))));
    try {
      const ids = await store.recentEventIds({ topic, partition }, new Date(Date.now() - RECALL_EVENT_IDS_MS), limit);
      if (ids.length > 0) await analysis.recallEventIds(ids, partition);
      logger.debug({ partition, eventIds: ids.length, limit }, 'recalled the ids of events stored from the partition');
    } catch (error) {
      logger.warn({ err: error, partition }, 'cannot read the ids of events stored from the partition: a re-publish of one of them is counted twice');
    }
  }

  /** warmPartition; a failure other than the heartbeat's is logged, saying whether any page was loaded. */
  private async warmOrFailOpen(warmPartition: NonNullable<KafkaIntakeOptions['warmPartition']>, partition: number, heartbeat: () => Promise<void>): Promise<void> {
    let pagesLoaded = 0;
    let heartbeatFailure: { error: unknown } | undefined;
    // A warm-up of a busy partition can outlast the session timeout: it keeps the membership alive.
    const afterPage = async () => {
      pagesLoaded++;
      try {
        await heartbeat();
      } catch (error) {
        heartbeatFailure = { error };
        throw error;
      }
    };
    try {
      await warmPartition(partition, afterPage, this.owned.size);
    } catch (error) {
      if (heartbeatFailure) throw heartbeatFailure.error;
      this.options.logger.warn(
        { err: error, partition, pagesLoaded },
        pagesLoaded === 0 ? 'detection warm-up failed; windows start empty' : 'detection warm-up failed part-way; windows hold only the pages loaded',
      );
    }
  }

  /**
   * The offset up to which messages of this batch's partition are already stored (or on their way).
   * The first batch after an assignment starts at the offset committed for the partition.
   */
  private async skipUpTo(batch: Batch): Promise<number> {
    const { partition } = batch;
    // Handed off past the partition's end: its log started again while this replica owned it (the
    // topic created again, a broker without its data), and how far it is stored is to be read again.
    const handedOff = this.handedOff.get(partition);
    if (handedOff !== undefined && handedOff >= Number(batch.highWatermark)) {
      this.handedOff.delete(partition);
      this.storedOffsets.delete(partition);
      this.reportStale(partition, 'beyond_end', handedOff, batch);
    }
    let stored = this.storedOffsets.get(partition);
    if (!stored) {
      stored = this.readStoredOffset(batch);
      this.storedOffsets.set(partition, stored);
      stored.catch(() => this.storedOffsets.delete(partition)); // asked again on the next batch
    }
    return Math.max(await stored, this.handedOff.get(partition) ?? -1);
  }

  /**
   * A read a batch needs (skipUpTo, the alerts of other replicas), retried with backoff while
   * storage cannot be read (heartbeating meanwhile), as a failed insert is: the batch waits rather
   * than fail into kafkajs's restarts, and `/ready` says what `cannot` be read. Gives up only when
   * the batch is no longer this replica's to handle.
   */
  private async whenReadable<T>(read: () => Promise<T>, cannot: string, partition: number, payload: Pick<EachBatchPayload, 'heartbeat' | 'isRunning' | 'isStale'>): Promise<T> {
    for (let attempt = 1; ; attempt++) {
      try {
        const result = await read();
        if (this.readFailure) this.options.logger.info({ partition }, 'storage is readable again');
        this.readFailure = undefined;
        return result;
      } catch (error) {
        if (!this.readFailure) this.options.logger.error({ err: error, partition }, `${cannot}; retrying`);
        this.readFailure = cannot;
        if (!payload.isRunning() || payload.isStale() || this.stopping.signal.aborted) throw error;
        await sleep(Math.min(5_000, 100 * 2 ** attempt), undefined, { signal: this.stopping.signal }).catch(() => undefined);
        if (this.stopping.signal.aborted) throw error;
        await payload.heartbeat();
      }
    }
  }

  /**
   * Reads how far a partition is stored. Events stored at or past the committed offset were stored
   * by a replica that did not get to commit them, perhaps killed before the parts of its insert's
   * views (rollup, key networks) landed: the views are repaired for them before they are skipped,
   * and so before the partition's detection warm-up reads its keys' networks (handleBatch).
   *
   * Unless they are an earlier incarnation's: rows record topic, partition and offset, and a topic
   * deleted and created again (or a new cluster: `docker compose down` without a volume for Kafka)
   * starts every partition at offset 0 again, under offsets already stored. Skipping up to those
   * would drop each new message as a redelivery. So the first message of this batch at an offset
   * where events are stored is compared with them: its eventId among them means a redelivery,
   * another eventId (or none) an earlier incarnation, and then nothing is skipped. Where no event
   * is stored at this batch's offsets, stored offsets at or past the partition's end (its high
   * watermark) cannot be this topic's either. One query, once a partition and assignment, and only
   * when this batch would be skipped in part.
   */
  private async readStoredOffset(batch: Batch): Promise<number> {
    const { store, topic, logger } = this.options;
    const { partition } = batch;
    const committed = Number(batch.firstOffset());
    const storedUpTo = (await store.storedOffsets(topic, [partition])).get(partition) ?? -1;
    if (storedUpTo >= committed) {
      const stale = await this.staleReason(batch, storedUpTo);
      if (stale) {
        this.reportStale(partition, stale, storedUpTo, batch);
        return -1;
      }
      try {
        const added = await store.repairViews({ topic, partition, fromOffset: committed });
        if (Object.values(added).some((events) => events > 0)) {
          logger.warn({ partition, fromOffset: committed, toOffset: storedUpTo, events: added }, 'views were missing events stored before a crash; added them');
        }
      } catch (error) {
        // Metrics, and detection's memory of these keys' networks after a restart, may stay short by these events; intake goes on.
        logger.error({ err: error, partition, fromOffset: committed, toOffset: storedUpTo }, 'repairing the views failed');
      }
    }
    return storedUpTo;
  }

  /** Why the offsets stored up to `storedUpTo` are not this topic's (readStoredOffset), if they are not. */
  private async staleReason(batch: Batch, storedUpTo: number): Promise<'other_events' | 'beyond_end' | undefined> {
    const { partition } = batch;
    const toOffset = Math.min(storedUpTo, Number(batch.lastOffset()));
    const stored = await this.options.store.eventIdsAtFirstStoredOffset({ topic: this.options.topic, partition, fromOffset: Number(batch.firstOffset()), toOffset });
    const message = stored && batch.messages.find((candidate) => Number(candidate.offset) === stored.offset);
    if (stored && message) return stored.eventIds.includes(eventIdOf(message) ?? '') ? undefined : 'other_events';
    return storedUpTo >= Number(batch.highWatermark) ? 'beyond_end' : undefined;
  }

  private reportStale(partition: number, reason: 'other_events' | 'beyond_end', storedUpTo: number, batch: Batch): void {
    if (this.staleReported.has(partition)) return;
    this.staleReported.add(partition);
    this.options.metrics.staleStoredOffsets.inc({ reason });
    this.options.logger.warn(
      { topic: this.options.topic, partition, storedUpTo, reason, firstOffset: batch.firstOffset(), highWatermark: batch.highWatermark },
      reason === 'beyond_end'
        ? 'offsets stored for this partition reach past its end: they are an earlier incarnation\'s of the topic (deleted and created again, or a new cluster); its messages are not skipped as already stored'
        : 'other events are stored at the offsets of this partition\'s messages: they are an earlier incarnation\'s of the topic (deleted and created again, or a new cluster); its messages are not skipped as already stored',
    );
  }
}

/** The eventId a Kafka message carries, if it is a JSON object with one. */
function eventIdOf(message: KafkaMessage): string | undefined {
  try {
    const value: unknown = JSON.parse(message.value?.toString('utf8') ?? '');
    const eventId = value && typeof value === 'object' ? (value as { eventId?: unknown }).eventId : undefined;
    return typeof eventId === 'string' ? eventId : undefined;
  } catch {
    return undefined;
  }
}
