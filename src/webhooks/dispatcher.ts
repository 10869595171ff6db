/**
 * Critical-alert webhooks: from a critical alert to signed deliveries (contracts section 4, spec 6.5).
 * Contract:
 *  - `notify` never throws and never waits: detection is not slowed by webhooks. A notification
 *    becomes one message per destination (the on-call endpoint when configured, the merchant's when
 *    registered), stored before its first attempt.
 *  - Attempts are due 0, 1 and 5 minutes after the message was created. The first is made however
 *    late (a notification stored only once storage came back from an outage, a worker down past
 *    the budget); no retry starts later than 15 minutes after. The message id is svc-id on every
 *    attempt, and the body is the same bytes every time.
 *  - Attempt state lives in storage, so another dispatcher on the same storage (after a restart)
 *    resumes on schedule. A message is delivered at least once: an attempt cut short by a stop
 *    or a crash is made again.
 *  - Replicas share storage but not attempts: a message is owned by the replica that created it
 *    (`owner`, stable across its restarts), and another replica attempts it only once its owner is
 *    gone (no heartbeat for `adoptAfterMs`) and it is that overdue, owning it from then on. So one
 *    alert pages on-call once, not once per replica, even while the owner has a backlog; a dead
 *    replica's messages go out a minute late. An owner that only looked gone (restarted, or its
 *    heartbeats failed through a storage outage) must not make the attempt an adopter makes:
 *    the adopter first stores a claim (the message as read, owned by it, with the version just
 *    above the one read), waits a few polls, and sends only if the claim still stands and the owner
 *    is still silent; the owner attempts nothing while its own heartbeat is stale, nor messages
 *    whose stored owner is no longer itself.
 *  - Replicas share breakers: each stores the pauses and closures it decides, and takes in the
 *    others' every few seconds.
 *  - Memory is bounded: at most `concurrency` attempts are in flight and at most twice that many
 *    messages are held (bodies included; the others' results being stored); the rest stay in
 *    storage and are read in pages. Notifications waiting to be stored are capped.
 *  - A message to a merchant goes to the merchant's endpoint as registered at the time of the
 *    attempt (a removed endpoint cancels it); an endpoint paused by its breaker skips the attempt,
 *    and one with as many attempts in flight as its breaker allows keeps the message queued.
 */
import { createHash, randomUUID } from 'node:crypto';
import { setMaxListeners } from 'node:events';
import { hostname } from 'node:os';
import { setTimeout as sleep } from 'node:timers/promises';
import { toWireAlert, type Alert } from '../alerts/alert.ts';
import { FailureLog } from '../failure-log.ts';
import type { Logger } from '../logger.ts';
import type { WorkerMetrics } from '../metrics.ts';
import {
  DESTINATIONS,
  ENDPOINT_REMOVED,
  type BreakerState,
  type ClaimVerdict,
  type Destination,
  type FullDestinations,
  type MessageToSave,
  type PendingMessage,
  type WebhookEndpoint,
  type WebhookMessage,
  type WebhookStore,
} from '../store/webhook-store.ts';
import { CircuitBreakers } from './breaker.ts';
import { ATTEMPT_OUTCOMES, REQUEST_TIMEOUT_MS, sendWebhook, type AttemptResult, type SendOptions } from './sender.ts';
import type { TargetPolicy } from './target-policy.ts';
import { signWebhook, WEBHOOK_HEADERS } from './verify.ts';

export const ALERT_EVENT = 'anomaly.alert.critical';
/** When attempts are due, after the message was created. */
export const ATTEMPT_SCHEDULE_MS: readonly number[] = [0, 60_000, 5 * 60_000];
/** No attempt starts later than this after the message was created. */
export const DELIVERY_BUDGET_MS = 15 * 60_000;
/** Failing endpoints whose failure lines are tracked at once; past this the longest tracked is forgotten (its next failure logs as new). */
const MAX_FAILING_ENDPOINTS = 10_000;

const DEFAULT_CONCURRENCY = 16;
const DEFAULT_MAX_UNSAVED = 5_000;
const SAVE_DELAY_MS = 20;
/** Slots freed within this long are filled by one read of storage, not one read each. */
const TICK_COALESCE_MS = 25;
/** Attempts ending within this long are stored in one write. */
const WRITE_COALESCE_MS = 20;
const RETRY_DELAY_MS = 1_000;
/**
 * How long another replica must have been silent (no heartbeat), and its message overdue, before
 * this one adopts the message. Well above the longest attempt (connect 5 s + request 10 s,
 * sender.ts) and many heartbeats long, so a live owner is not taken for gone.
 */
export const ADOPT_AFTER_MS = 60_000;
/** Heartbeats per ADOPT_AFTER_MS: a few may be late or fail without the owner looking gone. */
const HEARTBEATS_PER_ADOPTION = 6;
/**
 * A replica whose last stored heartbeat is this share of ADOPT_AFTER_MS old attempts nothing until it
 * stores one again: well before others may take it for gone, with room for an attempt and its
 * write, and for the replicas' clocks being apart.
 */
const STALE_HEARTBEAT_SHARE = 0.5;
/** How often the stored breakers are read again (by the dispatcher's clock): other replicas' pauses hold here too. */
export const BREAKER_REFRESH_MS = 5_000;

export interface OncallEndpoint {
  url: string;
  secret: string;
}

export interface WebhookDispatcherOptions {
  store: WebhookStore;
  /** This replica's stable id (WORKER_ID, else the hostname): the messages it creates are its own. */
  owner?: string;
  /** Another replica's message is attempted once this overdue and its owner this long silent (default ADOPT_AFTER_MS). */
  adoptAfterMs?: number;
  /** ONCALL_WEBHOOK_URL and ONCALL_WEBHOOK_SECRET. */
  oncall?: OncallEndpoint;
  policy: TargetPolicy;
  /** Trusted CAs (default: Node's bundled roots). */
  ca?: readonly string[];
  metrics: WorkerMetrics;
  logger: Logger;
  /** The clock of the schedule, the breakers, svc-timestamp and the once-a-minute failure lines (tests move it). */
  now?: () => number;
  /** Attempts in flight at once; twice this many messages are held in memory at most. */
  concurrency?: number;
  /** Notifications waiting to be stored; beyond it they are dropped, counted and logged. */
  maxUnsaved?: number;
  /** How often the clock is compared with the next due time (real milliseconds). */
  pollIntervalMs?: number;
  /** How often storage is read even when nothing is known to be due (other replicas, restarts). */
  rescanIntervalMs?: number;
  connectTimeoutMs?: number;
  requestTimeoutMs?: number;
}

export interface DispatcherStats {
  /** Notifications waiting to be stored, now and at most so far. */
  unsaved: number;
  maxUnsaved: number;
  /** Messages held in memory (being attempted or their result being stored), now and at most so far. */
  busy: number;
  maxBusy: number;
  /** Attempts in flight, at most so far. */
  maxSending: number;
}

/**
 * An attempt not made: cut short by stop(), an adopted message whose claim did not stand (read
 * again at once), or one whose claim could not be stored or read (read again a second later).
 */
type NoAttempt = 'stopped' | 'yielded' | 'claim_failed';

interface Notification {
  alertId: string;
  merchantId: string;
  createdAt: number;
  body: string;
  /**
   * Its message ids, one per destination, and the row version of their first write: made once, so a
   * retried write (whose first try may have landed) rewrites the same rows, and loses to any write
   * of an attempt made meanwhile.
   */
  ids: Record<Destination, string>;
  version?: number;
}

const UNREADABLE_SECRET =
  'the endpoint\'s signing secret does not open with WEBHOOK_SECRET_KEY (was the key changed? set the old one as WEBHOOK_SECRET_KEY_PREVIOUS), ' +
  'or the merchant registers the endpoint again';

/**
 * An attempt's result; `circuit_open` is an attempt skipped because the endpoint is paused,
 * `secret_unreadable` one skipped because its signing secret cannot be read.
 */
type AttemptReport = Omit<AttemptResult, 'outcome'> & { outcome: (typeof REPORTED_OUTCOMES)[number] };
const REPORTED_OUTCOMES = [...ATTEMPT_OUTCOMES, 'circuit_open', 'secret_unreadable'] as const;
/** The statuses security_center_webhook_messages_total counts: a message's creation, and how it ended. */
const COUNTED_STATUSES = ['created', 'delivered', 'failed', 'cancelled'] as const;

interface Outcome {
  message: WebhookMessage;
  breaker?: BreakerState;
}

/** What a log line says of an endpoint: never its URL's path, query or user info, which may hold a token. */
type EndpointFields = {
  destination: Destination;
  /** A merchant's endpoint: whose. */
  merchantId?: string;
  host: string;
};

/** The message body; `data` is the alert in its wire format (contracts section 2). */
export function webhookBody(alert: Alert, createdAt: number): string {
  const data = toWireAlert(alert);
  return JSON.stringify({ event: ALERT_EVENT, alertId: alert.id, merchantId: alert.merchantId, data, timestamp: new Date(createdAt).toISOString() });
}

export class WebhookDispatcher {
  private readonly store: WebhookStore;
  private readonly now: () => number;
  private readonly concurrency: number;
  /**
   * Of the concurrency, the attempts merchants' endpoints may have in flight together: a quarter is
   * kept for on-call, whose pages no merchant's backlog may hold up (none with a concurrency of 1,
   * nor without on-call).
   */
  private readonly merchantSlots: number;
  /** And one merchant's endpoint, at most. */
  private readonly merchantEndpointSlots: number;
  private readonly maxUnsaved: number;
  private readonly breakers = new CircuitBreakers();
  private readonly logger: Logger;
  private readonly metrics: WorkerMetrics;
  private readonly sendOptions: SendOptions;
  private readonly oncallId: string | undefined;
  private readonly owner: string;
  private readonly adoptAfterMs: number;
  private readonly abort = new AbortController();

  private unsaved: Notification[] = [];
  /** Notifications being stored (out of `unsaved` meanwhile, but still held). */
  private savingCount = 0;
  private readonly saveSoon = new Coalesced(() => void this.saveNew(), SAVE_DELAY_MS);
  private readonly tickSoon = new Coalesced(() => void this.tick(), TICK_COALESCE_MS);
  private readonly writeSoon = new Coalesced(() => void this.writeOutcomes(), WRITE_COALESCE_MS);
  private saving: Promise<void> | undefined;
  /** Ids of messages being attempted or whose result is being stored. */
  private readonly busy = new Set<string>();
  private sending = 0;
  /** Requests in flight per endpoint, with its merchant (undefined: the on-call endpoint). */
  private readonly requestsTo = new Map<string, { count: number; merchantId: string | undefined }>();
  private breakersReadAt = Number.NEGATIVE_INFINITY;
  private readonly heartbeatMs: number;
  private lastHeartbeatAt = Number.NEGATIVE_INFINITY;
  /** A read of due messages was skipped for a stale heartbeat: the next stored heartbeat reads again. */
  private waitingForHeartbeat = false;
  private readonly pollMs: number;
  /** How long an adopter waits between storing its claim and reading it back (real milliseconds). */
  private readonly claimSettleMs: number;
  /** How long a claim holds the message (by the dispatcher's clock): the claim's wait and an attempt. */
  private readonly claimLeaseMs: number;
  private beating: Promise<void> | undefined;
  private peakSending = 0;
  private readonly attempts = new Set<Promise<void>>();
  private outcomes: Outcome[] = [];
  private writing: Promise<void> | undefined;
  /** The read of due messages in progress, if any. */
  private ticking: Promise<void> | undefined;
  private tickAgain = false;
  private nextDueAt = 0;
  private lastScanAt = 0;
  private pollTimer: NodeJS.Timeout | undefined;
  private started = false;
  private stopped = false;
  private storageOk = true;
  /** Storage failures, one log per retry loop: a line when it starts failing, once a minute while it does, and when it works again. */
  private readonly storageFailures: Record<'saving' | 'reading' | 'claiming' | 'writing' | 'heartbeat', FailureLog>;
  /** Failed attempts per endpoint (by id), while they fail: logged as the storage failures are. */
  private readonly endpointFailures = new Map<string, FailureLog>();
  private peakBusy = 0;
  private peakUnsaved = 0;

  constructor(private readonly options: WebhookDispatcherOptions) {
    this.store = options.store;
    this.now = options.now ?? Date.now;
    this.owner = options.owner ?? hostname();
    this.adoptAfterMs = options.adoptAfterMs ?? ADOPT_AFTER_MS;
    this.heartbeatMs = this.adoptAfterMs / HEARTBEATS_PER_ADOPTION;
    this.pollMs = options.pollIntervalMs ?? 1_000;
    // Long enough for a live owner whose storage just came back to store a heartbeat (it tries at
    // every poll), and for another adopter's claim made from the same read to land.
    this.claimSettleMs = 2 * this.pollMs + 1_000;
    this.claimLeaseMs = this.claimSettleMs + (options.requestTimeoutMs ?? REQUEST_TIMEOUT_MS) + 5_000;
    this.concurrency = options.concurrency ?? DEFAULT_CONCURRENCY;
    this.merchantSlots = this.concurrency === 1 || !options.oncall ? this.concurrency : this.concurrency - Math.max(1, Math.floor(this.concurrency / 4));
    this.merchantEndpointSlots = Math.max(1, Math.floor(this.concurrency / 4));
    this.maxUnsaved = options.maxUnsaved ?? DEFAULT_MAX_UNSAVED;
    this.logger = options.logger;
    this.metrics = options.metrics;
    const storageFailure = (what: string, recovery: string) => new FailureLog(this.logger, what, recovery, { now: this.now });
    this.storageFailures = {
      saving: storageFailure('storing webhook messages failed; retrying', 'webhook messages are stored again'),
      reading: storageFailure('reading due webhook messages failed; retrying', 'due webhook messages are read again'),
      claiming: storageFailure('claiming an adopted webhook message failed; retrying', 'adopted webhook messages are claimed again'),
      writing: storageFailure('storing webhook attempts failed; retrying', 'webhook attempts are stored again'),
      heartbeat: storageFailure('storing the webhook heartbeat failed; retrying', 'the webhook heartbeat is stored again'),
    };
    // At 0 from the start: increase() cannot count a series' first sample, so the first message given
    // up, or the first failed attempt to on-call, would otherwise alert no one.
    for (const destination of DESTINATIONS) {
      for (const status of COUNTED_STATUSES) this.metrics.webhookMessages.inc({ destination, status }, 0);
      for (const outcome of REPORTED_OUTCOMES) this.metrics.webhookAttempts.inc({ destination, outcome }, 0);
    }
    this.sendOptions = {
      policy: options.policy,
      ...(options.ca ? { ca: options.ca } : {}),
      ...(options.connectTimeoutMs ? { connectTimeoutMs: options.connectTimeoutMs } : {}),
      ...(options.requestTimeoutMs ? { requestTimeoutMs: options.requestTimeoutMs } : {}),
      signal: this.abort.signal,
    };
    setMaxListeners(0, this.abort.signal); // every attempt in flight listens to it
    this.oncallId = options.oncall ? `oncall:${createHash('sha256').update(options.oncall.url).digest('hex').slice(0, 16)}` : undefined;
  }

  /** Writes its first heartbeat, loads the breakers and starts attempting what is due. */
  async start(): Promise<void> {
    await this.beat();
    await this.refreshBreakers();
    this.started = true;
    this.metrics.webhookEndpointsPaused.set(this.breakers.openCount(this.now()));
    const pollMs = this.pollMs;
    const rescanMs = this.options.rescanIntervalMs ?? 30_000;
    this.pollTimer = setInterval(() => {
      this.metrics.webhookEndpointsPaused.set(this.breakers.openCount(this.now())); // pauses end by themselves
      if (this.now() - this.lastHeartbeatAt >= this.heartbeatMs) this.beatInBackground();
      if (this.now() >= this.nextDueAt || Date.now() - this.lastScanAt >= rescanMs) void this.tick();
    }, pollMs);
    this.pollTimer.unref();
    void this.tick();
  }

  /**
   * A critical alert was created, escalated or reopened: queue its messages. Never throws, never
   * waits; storing happens in the background.
   */
  notify(alert: Alert): void {
    try {
      if (this.stopped) throw new Error('the webhook dispatcher is stopped');
      if (this.waitingCount() >= this.maxUnsaved) {
        this.metrics.webhookNotificationsDropped.inc();
        this.logger.error({ alertId: alert.id, merchantId: alert.merchantId, waiting: this.waitingCount() }, 'webhook queue full: notification dropped');
        return;
      }
      const createdAt = this.now();
      const ids = { oncall: randomUUID(), merchant: randomUUID() };
      this.unsaved.push({ alertId: alert.id, merchantId: alert.merchantId, createdAt, body: webhookBody(alert, createdAt), ids });
      this.peakUnsaved = Math.max(this.peakUnsaved, this.waitingCount());
      this.saveSoon.request();
    } catch (error) {
      this.metrics.webhookNotificationsDropped.inc();
      this.logger.error({ err: error, alertId: alert.id }, 'webhook notification failed');
    }
  }

  /**
   * Whether it delivers: started (its breakers loaded), not stopped, and its last storage read or
   * write succeeded. Critical alerts' notifications are stored while it is down, and delivered late.
   */
  get up(): boolean {
    return this.started && !this.stopped && this.storageOk;
  }

  stats(): DispatcherStats {
    return { unsaved: this.waitingCount(), maxUnsaved: this.peakUnsaved, busy: this.busy.size, maxBusy: this.peakBusy, maxSending: this.peakSending };
  }

  /**
   * Stops attempting, cuts attempts in flight short (they are made again by the next dispatcher),
   * and stores what is in hand.
   */
  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    clearInterval(this.pollTimer);
    for (const soon of [this.saveSoon, this.tickSoon, this.writeSoon]) soon.cancel();
    this.abort.abort();
    await this.ticking; // the storage read in progress ends before storage may be closed
    await this.beating;
    await Promise.allSettled([...this.attempts]);
    await this.saveNew();
    await this.writeOutcomes();
    if (this.unsaved.length > 0) this.logger.error({ lost: this.unsaved.length }, 'webhook notifications could not be stored before stopping');
  }

  // Storing notifications -----------------------------------------------------------------------

  /** Notifications waiting to be stored, the ones being stored included. */
  private waitingCount(): number {
    return this.unsaved.length + this.savingCount;
  }

  /** Turns waiting notifications into stored messages, one per destination. */
  private async saveNew(): Promise<void> {
    await this.saving;
    if (this.unsaved.length === 0) return;
    const batch = this.unsaved;
    this.unsaved = [];
    this.savingCount = batch.length;
    this.saving = (async () => {
      try {
        for (const item of batch) item.version ??= this.store.nextVersion();
        const endpoints = await this.store.endpoints(batch.map((item) => item.merchantId));
        const messages = batch.flatMap((item) => this.messagesOf(item, endpoints.get(item.merchantId)));
        await this.store.saveMessages(messages);
        this.storageOk = true;
        this.storageFailures.saving.succeeded();
        for (const message of messages) this.metrics.webhookMessages.inc({ destination: message.destination, status: 'created' });
        if (messages.length > 0) {
          this.nextDueAt = Math.min(this.nextDueAt, ...messages.map((message) => message.nextAttemptAt));
          if (this.started) void this.tick();
        }
      } catch (error) {
        this.storageOk = false;
        this.requeue(batch);
        this.storageFailures.saving.failed({ err: error, notifications: batch.length });
        if (!this.stopped) this.saveSoon.request(RETRY_DELAY_MS);
      } finally {
        this.savingCount = 0;
      }
    })();
    await this.saving;
  }

  /**
   * Puts a batch that could not be stored back before the newer notifications, within the cap (which
   * counts the batch while it is stored, so nothing is over it today: a guard for the bound).
   */
  private requeue(batch: Notification[]): void {
    const waiting = [...batch, ...this.unsaved];
    const excess = waiting.length - this.maxUnsaved;
    if (excess > 0) {
      this.metrics.webhookNotificationsDropped.inc(excess);
      this.logger.error({ dropped: excess, waiting: this.maxUnsaved }, 'webhook queue full: notifications dropped');
    }
    this.unsaved = waiting.slice(0, this.maxUnsaved);
  }

  private messagesOf(item: Notification, endpoint: WebhookEndpoint | undefined): MessageToSave[] {
    const destinations: Destination[] = [...(this.options.oncall ? (['oncall'] as const) : []), ...(endpoint ? (['merchant'] as const) : [])];
    return destinations.map((destination) => ({
      id: item.ids[destination],
      version: item.version,
      alertId: item.alertId,
      merchantId: item.merchantId,
      destination,
      endpointId: '',
      target: '',
      body: item.body,
      status: 'pending',
      owner: this.owner,
      attempts: 0,
      nextAttemptAt: item.createdAt + ATTEMPT_SCHEDULE_MS[0]!,
      lastOutcome: '',
      lastError: '',
      attemptLog: [],
      createdAt: item.createdAt,
      updatedAt: item.createdAt,
    }));
  }

  // Attempting --------------------------------------------------------------------------------

  /** Loads due messages into the free slots; learns when the next one is due. */
  private tick(): Promise<void> {
    if (this.ticking) {
      this.tickAgain = true;
      return this.ticking;
    }
    this.ticking = this.loadDue().finally(() => {
      this.ticking = undefined;
    });
    return this.ticking;
  }

  private async loadDue(): Promise<void> {
    try {
      do {
        this.tickAgain = false;
        // A slot frees when its attempt ends; its message stays held until its result is stored.
        const free = Math.min(this.concurrency - this.sending, 2 * this.concurrency - this.busy.size);
        if (free <= 0 || this.stopped) break;
        if (!this.heartbeatFresh(this.now())) {
          // Others may take this replica for gone and adopt its messages: it attempts nothing until
          // it has stored a heartbeat again, and then reads anew (an adopter's claim hides the
          // message from it; one that lands later finds this replica alive and does not send).
          this.waitingForHeartbeat = true;
          this.beatInBackground();
          break;
        }
        await this.refreshBreakers();
        const now = this.now();
        const reader = { owner: this.owner, adoptAfterMs: this.adoptAfterMs };
        const page = await this.store.pendingMessages(free + 1, [...this.busy], reader, this.fullDestinations(now));
        this.lastScanAt = Date.now();
        this.storageOk = true;
        this.storageFailures.reading.succeeded();
        const due = page.slice(0, free).filter((message) => message.dueAt <= now);
        this.nextDueAt = page[due.length]?.dueAt ?? Number.POSITIVE_INFINITY;
        if (this.stopped) break;
        for (const message of due) {
          if (this.hasRoom(message, now)) this.launch(message);
          else this.tickAgain = true; // its endpoint filled up with this page: read again, without its messages
        }
        // Messages stored while this read ran asked for another (tickAgain): it may not have seen them.
      } while (this.tickAgain);
    } catch (error) {
      this.storageOk = false;
      this.storageFailures.reading.failed({ err: error });
    }
  }

  /**
   * Whether a due message may start: not while its endpoint has as many requests in flight as its
   * breaker allows (it stays queued). One that ends without a request (paused, cancelled) may.
   */
  private hasRoom(message: PendingMessage, now: number): boolean {
    const target = this.targetOf(message);
    if (!target || target.secret === undefined || this.breakers.pausedUntil(target.endpointId, now) !== undefined) return true;
    if (message.destination === 'merchant' && this.merchantRequests() >= this.merchantSlots) return false;
    return (this.requestsTo.get(target.endpointId)?.count ?? 0) < this.allowedInFlight(target.endpointId, message.destination);
  }

  /**
   * Requests in flight one endpoint may have: as many as its breaker allows, and a merchant's at most
   * a quarter of the slots, so that a few slow (yet answering) merchant endpoints do not hold every slot.
   */
  private allowedInFlight(endpointId: string, destination: Destination): number {
    const allowed = this.breakers.allowedInFlight(endpointId);
    return destination === 'merchant' ? Math.min(allowed, this.merchantEndpointSlots) : allowed;
  }

  /** Requests in flight to merchants' endpoints, all together. */
  private merchantRequests(): number {
    let count = 0;
    for (const requests of this.requestsTo.values()) if (requests.merchantId !== undefined) count += requests.count;
    return count;
  }

  /** The destinations whose endpoint has no room for another request: reads leave their messages out. */
  private fullDestinations(now: number): FullDestinations {
    const full = { oncall: false, merchants: this.merchantRequests() >= this.merchantSlots, merchantIds: [] as string[] };
    for (const [endpointId, { count, merchantId }] of this.requestsTo) {
      const destination = merchantId === undefined ? 'oncall' : 'merchant';
      if (this.breakers.pausedUntil(endpointId, now) !== undefined || count < this.allowedInFlight(endpointId, destination)) continue;
      if (merchantId === undefined) full.oncall = true;
      else full.merchantIds.push(merchantId);
    }
    return full;
  }

  private launch(message: PendingMessage): void {
    this.busy.add(message.id);
    this.sending++;
    this.peakBusy = Math.max(this.peakBusy, this.busy.size);
    this.peakSending = Math.max(this.peakSending, this.sending);
    const attempt = this.attempt(message).finally(() => this.sending--).then(
      (outcome) => {
        if (outcome === 'stopped' || outcome === 'claim_failed') {
          // Cut short by stop() (the next dispatcher makes it again), or its claim failed (the
          // poll reads it again: claim() made it due a second from now).
          this.busy.delete(message.id);
          return;
        }
        if (outcome === 'yielded') {
          this.busy.delete(message.id); // its claim did not stand: read it again as it is now
          this.tickSoon.request();
          return;
        }
        this.outcomes.push(outcome);
        this.writeSoon.request();
        this.tickSoon.request(); // the slot is free
      },
      (error: unknown) => {
        this.busy.delete(message.id);
        this.logger.error({ err: error, messageId: message.id }, 'webhook attempt failed unexpectedly');
      },
    );
    this.attempts.add(attempt);
    void attempt.finally(() => this.attempts.delete(attempt));
  }

  /** One attempt of one message, or why none was made (see NoAttempt). */
  private async attempt(message: PendingMessage): Promise<Outcome | NoAttempt> {
    let now = this.now();
    const number = message.attempts + 1;
    // The budget bounds retries: a first attempt is made however late (stored late, after an outage).
    if (message.attempts > 0 && now >= message.createdAt + DELIVERY_BUDGET_MS) {
      return this.conclude(message, 'failed', 'expired', 'the 15-minute delivery budget ran out', now);
    }
    const target = this.targetOf(message);
    if (!target) {
      const reason = message.destination === 'oncall' ? 'the on-call endpoint is no longer configured' : ENDPOINT_REMOVED;
      return this.conclude(message, 'cancelled', 'cancelled', reason, now);
    }
    let result: AttemptReport;
    let breaker: BreakerState | undefined;
    let breakerChange: 'paused' | 'closed' | undefined;
    const pausedUntil = this.breakers.pausedUntil(target.endpointId, now);
    if (target.secret === undefined) {
      // Nothing is sent unsigned; the message waits on its schedule for the key to be restored.
      result = { outcome: 'secret_unreadable', error: UNREADABLE_SECRET, durationMs: 0 };
    } else if (pausedUntil !== undefined) {
      result = { outcome: 'circuit_open', error: `endpoint paused until ${new Date(pausedUntil).toISOString()}`, durationMs: 0 };
    } else {
      this.countRequest(target.endpointId, message, +1); // from the claim on: it holds a place toward the breaker's limit
      try {
        if (message.owner !== '' && message.owner !== this.owner) {
          const verdict = await this.claim(message);
          if (verdict === 'stopped' || verdict === 'failed') return verdict === 'stopped' ? 'stopped' : 'claim_failed';
          if (verdict !== 'claimed') return 'yielded';
          now = this.now(); // the attempt starts once claimed
        }
        const timestamp = String(now);
        const request = {
          url: target.url,
          body: message.body,
          headers: {
            [WEBHOOK_HEADERS.id]: message.id,
            [WEBHOOK_HEADERS.timestamp]: timestamp,
            [WEBHOOK_HEADERS.signature]: signWebhook(target.secret, message.id, timestamp, message.body),
          },
        };
        result = await sendWebhook(request, this.sendOptions);
      } finally {
        this.countRequest(target.endpointId, message, -1);
      }
      if (this.abort.signal.aborted) return 'stopped';
      const recordedAt = this.now();
      const wasOpen = this.breakers.isOpen(target.endpointId);
      // An attempt that ends after another one's failure paused the endpoint does not pause it anew.
      const wasPaused = this.breakers.pausedUntil(target.endpointId, recordedAt) !== undefined;
      breaker = this.breakers.record(target.endpointId, result.outcome === 'delivered', recordedAt);
      if (breaker?.pausedUntil) breakerChange = wasPaused ? undefined : 'paused';
      else if (breaker && wasOpen) breakerChange = 'closed';
      this.metrics.webhookEndpointsPaused.set(this.breakers.openCount(recordedAt));
    }
    this.metrics.webhookAttempts.inc({ destination: message.destination, outcome: result.outcome });
    const nextAt = nextAttemptAt(message.createdAt, number, now);
    const status = result.outcome === 'delivered' ? 'delivered' : nextAt < message.createdAt + DELIVERY_BUDGET_MS ? 'pending' : 'failed';
    if (status !== 'pending') this.metrics.webhookMessages.inc({ destination: message.destination, status });
    const endpoint: EndpointFields = {
      destination: message.destination,
      ...(message.destination === 'merchant' ? { merchantId: message.merchantId } : {}),
      host: hostOf(target.url),
    };
    const attemptFields = {
      ...endpoint,
      messageId: message.id,
      alertId: message.alertId,
      attempt: number,
      outcome: result.outcome,
      statusCode: result.statusCode,
      error: result.error,
      status,
      ...(status === 'pending' ? { nextAttemptAt: new Date(nextAt).toISOString() } : {}),
    };
    if (result.outcome === 'delivered') {
      this.endpointDelivers(target.endpointId, endpoint, breakerChange === 'closed');
    } else if (result.outcome === 'circuit_open') {
      this.logger.debug(attemptFields, 'webhook attempt skipped: its endpoint is paused'); // counted by security_center_webhook_attempts_total
    } else {
      this.failuresOf(target.endpointId).failed(attemptFields);
    }
    if (breakerChange === 'paused') this.logPaused(endpoint, breaker!, result.error ?? result.outcome);
    // Each message given up is said once, whatever the endpoint's lines: its alert never reached them.
    if (status === 'failed') {
      this.logger.warn(
        { ...endpoint, messageId: message.id, alertId: message.alertId, attempts: number, outcome: result.outcome, error: result.error },
        'webhook message given up: not delivered within 15 minutes of attempts',
      );
    }
    return {
      message: {
        ...message,
        endpointId: target.endpointId,
        target: target.display,
        status,
        owner: this.owner, // an adopted message is this replica's from now on
        attempts: number,
        nextAttemptAt: status === 'pending' ? nextAt : message.nextAttemptAt,
        lastOutcome: result.outcome,
        lastError: result.error ?? '',
        attemptLog: [
          ...message.attemptLog,
          {
            attempt: number,
            at: now,
            outcome: result.outcome,
            ...(result.statusCode !== undefined ? { statusCode: result.statusCode } : {}),
            error: result.error ?? '',
            durationMs: result.durationMs,
          },
        ],
        updatedAt: this.now(),
      },
      ...(breaker ? { breaker } : {}),
    };
  }

  /**
   * Claims another replica's message before sending it (WebhookStore.claimMessage), waits
   * `claimSettleMs`, and reads the claim back: the request goes out only when it still stands and
   * the previous owner is still silent. Otherwise the message is left as it is now: to whoever
   * wrote since, or (the owner came back) to this replica's claim, made when its lease ends. A
   * claim that cannot be stored or read sends nothing.
   */
  private async claim(message: PendingMessage): Promise<ClaimVerdict | 'stopped' | 'failed'> {
    try {
      const at = this.now();
      const version = await this.store.claimMessage(message, this.owner, at + this.claimLeaseMs, at);
      await sleep(this.claimSettleMs, undefined, { signal: this.abort.signal });
      const verdict = await this.store.claimStands(message, { owner: this.owner, version }, message.owner, this.now(), this.adoptAfterMs);
      this.storageOk = true;
      this.storageFailures.claiming.succeeded();
      if (verdict !== 'claimed') {
        this.logger.info({ messageId: message.id, alertId: message.alertId, destination: message.destination, owner: message.owner, verdict }, 'adopted webhook message not sent: its claim did not stand');
      }
      return verdict;
    } catch (error) {
      if (this.abort.signal.aborted) return 'stopped';
      this.storageOk = false;
      this.nextDueAt = Math.min(this.nextDueAt, this.now() + RETRY_DELAY_MS);
      this.storageFailures.claiming.failed({ err: error, messageId: message.id });
      return 'failed';
    }
  }

  /** Failed attempts to an endpoint, logged as a failure that lasts until it delivers again. */
  private failuresOf(endpointId: string): FailureLog {
    let failures = this.endpointFailures.get(endpointId);
    if (!failures) {
      // Bounded: an endpoint replaced (PUT /webhook makes a new id) while failing would stay for good.
      if (this.endpointFailures.size >= MAX_FAILING_ENDPOINTS) this.endpointFailures.delete(this.endpointFailures.keys().next().value!);
      failures = new FailureLog(this.logger, 'webhook attempt failed', 'webhook endpoint delivers again', { level: 'warn', now: this.now });
      this.endpointFailures.set(endpointId, failures);
    }
    return failures;
  }

  /** An endpoint delivered: the end of its failures, said once (with its breaker's closing, if this closed it). */
  private endpointDelivers(endpointId: string, endpoint: EndpointFields, closedBreaker: boolean): void {
    const failures = this.endpointFailures.get(endpointId);
    this.endpointFailures.delete(endpointId);
    if (closedBreaker) this.logger.info(endpoint, 'webhook endpoint delivers again: its breaker closed');
    else failures?.succeeded(endpoint);
  }

  /**
   * An endpoint's breaker paused it (BREAKER_THRESHOLD failures in a row, or the attempt after a
   * pause failed): nothing goes to it for an hour, which on-call must hear of at once.
   */
  private logPaused(endpoint: EndpointFields, state: BreakerState, lastError: string): void {
    const fields = { ...endpoint, consecutiveFailures: state.consecutiveFailures, lastError, pausedUntil: new Date(state.pausedUntil).toISOString() };
    if (endpoint.destination === 'oncall') {
      this.logger.error(fields, 'on-call webhook endpoint paused for an hour after failed attempts: critical alerts do not page on-call until pausedUntil');
    } else {
      this.logger.warn(fields, "merchant's webhook endpoint paused for an hour after failed attempts: its critical alerts are not delivered until pausedUntil");
    }
  }

  /** Counts a request to an endpoint starting (+1) or ending (-1). */
  private countRequest(endpointId: string, message: PendingMessage, change: 1 | -1): void {
    const count = (this.requestsTo.get(endpointId)?.count ?? 0) + change;
    if (count > 0) this.requestsTo.set(endpointId, { count, merchantId: message.destination === 'merchant' ? message.merchantId : undefined });
    else this.requestsTo.delete(endpointId);
  }

  /** Ends a message without an attempt. */
  private conclude(message: WebhookMessage, status: 'failed' | 'cancelled', outcome: string, reason: string, now: number): Outcome {
    this.metrics.webhookMessages.inc({ destination: message.destination, status });
    this.logger.warn({ messageId: message.id, alertId: message.alertId, destination: message.destination, status }, reason);
    return { message: { ...message, status, owner: this.owner, lastOutcome: outcome, lastError: reason, updatedAt: now } };
  }

  private targetOf({ destination, endpoint }: PendingMessage) {
    if (destination === 'oncall') {
      const oncall = this.options.oncall;
      // The on-call URL may carry a token in its path: only its origin is shown.
      return oncall ? { url: oncall.url, secret: oncall.secret, endpointId: this.oncallId!, display: new URL(oncall.url).origin } : undefined;
    }
    return endpoint ? { url: endpoint.url, secret: endpoint.secret, endpointId: endpoint.endpointId, display: endpoint.url } : undefined;
  }

  /** Stores finished attempts: the breakers first, then the messages (which end the attempts). */
  private async writeOutcomes(): Promise<void> {
    if (this.writing) return this.writing;
    this.writing = (async () => {
      while (this.outcomes.length > 0) {
        const batch = this.outcomes;
        this.outcomes = [];
        // Until stored, the ids stay busy, so nothing is attempted twice meanwhile.
        const stored =
          (await this.untilStored(() => this.store.saveBreakers(batch.flatMap(({ breaker }) => (breaker ? [breaker] : []))))) &&
          (await this.untilStored(() => this.store.saveMessages(batch.map(({ message }) => message))));
        if (!stored) return;
        for (const { message } of batch) {
          this.busy.delete(message.id);
          if (message.status === 'pending') this.nextDueAt = Math.min(this.nextDueAt, message.nextAttemptAt);
        }
        this.tickSoon.request();
      }
    })().finally(() => {
      this.writing = undefined;
    });
    return this.writing;
  }

  /** Takes in the breakers stored by every replica, when the last read is BREAKER_REFRESH_MS old. */
  private async refreshBreakers(): Promise<void> {
    const now = this.now();
    if (now - this.breakersReadAt < BREAKER_REFRESH_MS) return;
    this.breakers.merge(await this.store.loadBreakers());
    this.breakersReadAt = now;
  }

  /** Tells the other replicas this one is alive: its messages are not adopted meanwhile. */
  private async beat(): Promise<void> {
    const at = this.now();
    await this.store.saveHeartbeat(this.owner, at);
    this.lastHeartbeatAt = at;
  }

  /** Whether its last stored heartbeat is recent enough that no other replica may take it for gone. */
  private heartbeatFresh(now: number): boolean {
    return now - this.lastHeartbeatAt < this.adoptAfterMs * STALE_HEARTBEAT_SHARE;
  }

  /** A heartbeat from the poll timer; one that fails is tried again at the next poll. */
  private beatInBackground(): void {
    if (this.beating) return;
    this.beating = this.beat()
      .then(() => {
        this.storageOk = true;
        this.storageFailures.heartbeat.succeeded();
        if (this.waitingForHeartbeat && this.started && !this.stopped) {
          this.waitingForHeartbeat = false;
          this.tickSoon.request();
        }
      })
      .catch((error: unknown) => {
        this.storageOk = false;
        this.storageFailures.heartbeat.failed({ err: error });
      })
      .finally(() => {
        this.beating = undefined;
      });
  }

  /** Retries a write until it succeeds (true) or the dispatcher stops (false). */
  private async untilStored(write: () => Promise<void>): Promise<boolean> {
    for (;;) {
      try {
        await write();
        this.storageOk = true;
        this.storageFailures.writing.succeeded();
        return true;
      } catch (error) {
        this.storageOk = false;
        this.storageFailures.writing.failed({ err: error });
        if (this.stopped) return false;
        await sleep(RETRY_DELAY_MS);
      }
    }
  }
}

/**
 * When the attempt after attempt `attempt` (made at `at`) is due: on schedule, but never sooner
 * than the schedule's step after a late attempt (adopted, or after a restart), so a retry is not
 * spent at once. Infinity after the last attempt.
 */
export function nextAttemptAt(createdAt: number, attempt: number, at: number): number {
  const scheduled = ATTEMPT_SCHEDULE_MS[attempt];
  if (scheduled === undefined) return Number.POSITIVE_INFINITY;
  return Math.max(createdAt + scheduled, at + scheduled - ATTEMPT_SCHEDULE_MS[attempt - 1]!);
}

/** An endpoint URL's host (and port) alone: its path, query and user info may hold a token. */
function hostOf(url: string): string {
  try {
    return new URL(url).host;
  } catch {
    return '(not a URL)';
  }
}

/** Runs a task once, a delay after it was first requested, however often it is requested meanwhile. */
class Coalesced {
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly run: () => void,
    private readonly delayMs: number,
  ) {}

  request(delayMs = this.delayMs): void {
    if (this.timer) return;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      this.run();
    }, delayMs);
    this.timer.unref();
  }

  cancel(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
  }
}
