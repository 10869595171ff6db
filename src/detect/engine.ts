/**
 * The streaming detection engine. Every batch the worker takes in is evaluated at once: events go
 * into per-key windows in memory, and every rule judges each key the batch touched.
 * Contract: only entitled plans are evaluated; an eventId counts once per key; allowlisted sources
 * never enter a window, nor do events dated more than MAX_CLOCK_SKEW_MS (admission.ts) ahead of
 * the clock; a rule that throws is isolated (counted, reported, the others go on); the engine does
 * no I/O — findings go back to the caller, which turns them into alerts.
 * Beyond its window, each key has a history (key-history.ts): the networks and places of its last
 * 7 days, kept while the key is idle and warmed from storage (recall), which rules read as
 * KeyWindow.history.
 * Cost: each rule's screen (RuleScreen in types.ts) keeps running tallies of every window as events
 * enter and leave it, so judging a key is usually a few counter checks; a rule reads the window
 * (evaluate) only when its screen says it may fire.
 */
import { sprayNetworkOf } from '../../rules/network.ts';
import type { BatchEvent, Plan, RequestEvent } from '../events/request-event.ts';
import { Admission, MAX_CLOCK_SKEW_MS, type AdmittedBatch } from './admission.ts';
import type { DetectionConfig } from './detection-config.ts';
import { EventIdHashes, eventIdHash } from './event-id-hashes.ts';
import { EventWindow } from './event-window.ts';
import { HISTORY_MS, KeyHistory, type HistoryEntryCount, type NetworkSighting } from './key-history.ts';
import { FleetSpray, SourceSpray, SprayReports, SPRAY_WINDOW_MS, sprayedKeysOf, type SprayedKey, type SprayedRequests, type TestKeyCeiling } from './source-spray.ts';
import { testKeyFinding } from './test-keys.ts';

const MAX_UNTAKEN_VOUCHED = 100_000;

/** A network a key's history vouched for (key-history.ts), with its key and partition: for storage to record. */
export interface VouchedNetwork {
  merchantId: string;
  apiKeyId: string;
  /** Kafka partition of the key (-1 for HTTP). */
  partition: number;
  network: string;
  at: number;
}
import type { GeoLookup } from './geo.ts';
import { DroppedRequestTally } from './tallies.ts';
import { KEY_ACTIONS, type AnomalyType, type Finding, type KeyWindow, type RuleDefinition, type Severity, type WindowEvent } from './types.ts';

// Rules have different parameter and tally types; the engine treats them alike.
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type AnyRule = RuleDefinition<any, any>;

/** The ruleId under which a failure of the engine itself (not of one rule) is reported. */
export const ENGINE_ERROR = 'engine';

export interface EngineFinding {
  merchantId: string;
  ruleId: AnomalyType;
  finding: Finding;
}

export interface EngineOptions {
  rules: readonly AnyRule[];
  entitledPlans: readonly string[];
  geo?: GeoLookup;
  config: () => DetectionConfig;
  /**
   * Most events kept per key (default 20,000); bounds memory for the busiest keys. A key over it
   * first has its history thinned (thin), then loses its oldest events.
   */
  maxEventsPerKey?: number;
  /**
   * The memory budget, in events held by all windows together, each tracked key counting
   * KEY_WEIGHT events more and each history entry beyond HISTORY_ENTRIES_PER_KEY per history
   * HISTORY_ENTRY_WEIGHT (default: no budget). Over it, idle keys' histories go first, then the
   * busiest keys keep only their newest events; if that is not enough, the keys seen least
   * recently are forgotten.
   */
  maxWindowEvents?: number;
  /**
   * The wall clock, epoch ms (default Date.now): events dated more than MAX_CLOCK_SKEW_MS
   * (admission.ts) ahead of it never enter a window. Tests and benchmarks that feed synthetic
   * timestamps give their own.
   */
  clock?: () => number;
  onRuleError?(ruleId: string, error: unknown): void;
}

/**
 * What a tracked key costs beyond its events, in events: its tallies and tables take about 6 KB, an
 * event about 200 B (measured: 5.9 KB for keys of one network at one place, their history included).
 * A key that sent requests in every minute of the hour takes about 2 KB more (high_failure_rate's
 * counts per network and minute): its 60 events or more are counted at 300 B each, which covers it.
 */
export const KEY_WEIGHT = 20;

/**
 * The history entries each key's history (tracked or idle) holds outside the budget's count: one
 * network and one place, an ordinary key's. A tracked key's KEY_WEIGHT covers them (measured so);
 * idle keys' are bounded, as their histories' own objects are, by their number (MAX_IDLE_HISTORIES).
 */
export const HISTORY_ENTRIES_PER_KEY = 2;

/** However tight memory is, a key keeps this many of its newest events before keys are forgotten. */
export const MIN_EVENTS_PER_KEY = 100;

/** A window event's share of the heap, measured with the five rules (about 200 B, and the key's tables), with room to spare. */
const BYTES_PER_WINDOW_EVENT = 300;

/**
 * A history entry's share of the heap (a network or a place a key was seen at, key-history.ts):
 * measured with histories of 256 networks and 256 places, 110 B (the networks' strings are the
 * events' too; a history's two Maps and itself take about 250 B more, bounded by MAX_IDLE_HISTORIES),
 * and 12% more since each carries when it was vouched for and recorded (163 -> 183 B per entry,
 * measured the same way with each point distinct).
 */
const BYTES_PER_HISTORY_ENTRY = 125;

/**
 * A history entry against the budget, in events (about 0.42). A key seen from many networks may
 * hold 640 entries (MAX_SIGHTINGS networks and as many places, a quarter more before a trim), some
 * 80 KB, over ten times its KEY_WEIGHT, and an idle key's history has no KEY_WEIGHT at all: so the
 * entries beyond HISTORY_ENTRIES_PER_KEY per history count.
 */
export const HISTORY_ENTRY_WEIGHT = BYTES_PER_HISTORY_ENTRY / BYTES_PER_WINDOW_EVENT;

/**
 * The distinct values each tracked key's tallies hold outside the budget's count (RuleScreen.entries:
 * networks, places, paths), an ordinary key's: its network in credential_sharing's tally and in
 * high_failure_rate's, and its place in impossible_travel's. KEY_WEIGHT covers them; beyond them,
 * each counts as TALLY_ENTRY_WEIGHT events.
 */
export const TALLY_ENTRIES_PER_KEY = 3;

/**
 * A tally entry against the budget, in events. Measured with a flood of 10 keys whose every event
 * came from a new network, or a new place, or both: 280-440 B an entry, with its Map entry and
 * minutes, so 1.5 window events with room. Uncounted, such a flood (a botnet on a few keys) held
 * 1,180 B per window event against the 300 the budget assumes: 3.5 times the budget, which is
 * half the heap, so the analysis thread ran out of heap.
 */
export const TALLY_ENTRY_WEIGHT = 1.5;

/** The default memory budget for a heap of `heapMb` MiB: windows may take half of it. */
export function windowBudgetFor(heapMb: number): number {
  return Math.floor((heapMb * 1024 * 1024) / 2 / BYTES_PER_WINDOW_EVENT);
}

/** The most events one partition's warm-up loads, whatever the budget: about 30 s of reading on the embedded engine. */
export const WARM_UP_MAX_EVENTS = 4_000_000;

/**
 * The most events a warm-up loads for one of the `partitions` a replica owns: its share of 80% of the
 * budget (the rest for the keys' own weight, and the traffic that arrives meanwhile, so that the
 * warmed windows do not start out shedding), at most WARM_UP_MAX_EVENTS.
 */
export function warmUpLimit(budget: number, partitions: number): number {
  return Math.max(1, Math.min(WARM_UP_MAX_EVENTS, Math.floor((0.8 * budget) / Math.max(1, partitions))));
}

/** How the engine stands against its memory budget; the counts of shed events and forgotten keys are since start. */
export interface EngineLoad {
  windowEvents: number;
  trackedKeys: number;
  /** The events a key may keep now: maxEventsPerKey, or less while over budget. */
  eventsPerKeyCap: number;
  maxEventsPerKey: number;
  maxWindowEvents: number;
  shedEvents: number;
  forgottenKeys: number;
  /** Events thinned out of the busiest keys' history (the first and last of each network and place in each minute stay). */
  thinnedEvents: number;
  /** Events left out of the windows for being dated too far ahead of the clock (stored all the same). */
  futureEvents: number;
  /** Keys without a window whose history (networks and places of the last days) is kept. */
  idleHistories: number;
  /**
   * Events judged (not warmed) that carried no rateLimitPerMinute and were not answered 5xx, of keys
   * for which a rule needs a limit (RuleDefinition.needsLimit: velocity_attack without a default
   * limit, enterprise's by default): their minutes go unjudged unless another of their events not
   * answered 5xx carries one, until the fleet sends the keys' limits or a default is configured.
   */
  eventsWithoutLimit: number;
  /** The merchants of those events in the latest batch processed (process, processBatch), at most MERCHANTS_WITHOUT_LIMIT of them. */
  merchantsWithoutLimit: string[];
  /** Networks and places held by all keys' histories, tracked and idle (beyond HISTORY_ENTRIES_PER_KEY per history, counted against the budget). */
  historyEntries: number;
  /** Idle keys' histories dropped to stay within the budget (not those dropped for their age or the idle count cap). */
  shedHistories: number;
  /** Distinct values held by the rules' tallies of all tracked keys (beyond TALLY_ENTRIES_PER_KEY per key, counted against the budget). */
  tallyEntries: number;
  /** The (network, key) pairs the credential-stuffing tally holds (source-spray.ts: bounded on its own, not by the budget). */
  sprayEntries: number;
}

const MINUTE = 60_000;

/** How many merchants EngineLoad.merchantsWithoutLimit names at most. */
export const MERCHANTS_WITHOUT_LIMIT = 5;

/** Idle keys are looked for once per this many batches judged. */
const SWEEP_EVERY_BATCHES = 256;

/**
 * Most idle keys whose history (KeyHistory: networks and places of the last days) is kept after
 * their window is dropped, and at most one per 10 events of the memory budget; beyond it, the keys
 * idle longest lose theirs. A history takes about 125 bytes per network and per place it holds
 * (measured), so most take less than an event does; its entries beyond HISTORY_ENTRIES_PER_KEY count
 * against the budget as well.
 */
export const MAX_IDLE_HISTORIES = 200_000;

/** A screen that threw: its tally can no longer be trusted, so the rule evaluates the window every time. */
const BROKEN = Symbol('broken screen');

/**
 * A rule that found something for a key is judged again for that key at most this often (by the
 * times batches are judged as of), however many batches bring it events meanwhile; what arrives in
 * between is judged once the interval is over, with or without more events. Under attack a key is
 * in nearly every batch (dozens a second at full speed), and a firing rule reads the key's whole
 * window each time, up to maxEventsPerKey events: without this, detection's cost would grow with
 * the attack's rate times the batches' rate, just when it must keep up. A first finding is never
 * delayed; a repeat (occurrences, lastSeenAt, a higher severity) is, by at most this.
 */
export const REJUDGE_MS = 500;

/** A batch spanning more event time than this is judged in slices of it (processBatch). */
export const SLICE_MS = MINUTE;

interface KeyState {
  merchantId: string;
  apiKeyId: string;
  plan: Plan;
  /** `test` while every event of the key said so; its findings are capped at testKeyMaxSeverity (test-keys.ts). */
  environment: RequestEvent['environment'];
  window: EventWindow;
  /** The eventIds of the window and of `arrived`. */
  eventIds: EventIdHashes;
  /** Kafka partition the key's events arrive on (-1 for HTTP), for dropping keys after a rebalance. */
  partition: number;
  /** Per rule (same index as the rules): its screen's tally, undefined without a screen, or BROKEN. */
  tallies: unknown[];
  /**
   * The entries its tallies hold (RuleScreen.entries), kept up to date from what each add and remove
   * says it changed; part of the engine's tallyEntries. A tally set aside (BROKEN) leaves its entries
   * counted until the key is forgotten: an overcount, on the safe side.
   */
  tallyEntries: number;
  /** Per rule: its parameters for this key, merged under paramsConfig for paramsPlan. */
  params: unknown[];
  /** Whether a rule cannot judge the key's events that carry no limit, under its params (RuleDefinition.needsLimit). */
  needsLimit: boolean;
  /** The highest severity reported for the key while it is a test key, under paramsConfig for paramsPlan. */
  testKeyMaxSeverity: Severity;
  paramsConfig: DetectionConfig | undefined;
  paramsPlan: Plan | undefined;
  /** The batch's events for this key (repeats left out), before they go into the window. */
  arrived: WindowEvent[];
  /** The window's events dated before this (a whole minute) have been thinned (thin). */
  thinnedBefore: number;
  /** The newest time of an event the per-key cap dropped (KeyWindow.cappedAt); -Infinity when none was. */
  cappedAt: number;
  /** The eventIds of the events the per-key cap dropped dated cappedAt (see prune); undefined until it drops one. */
  cappedIds: Set<string> | undefined;
  /** What the per-key cap dropped, per minute (KeyWindow.dropped); undefined until it drops an event. */
  dropped: DroppedRequestTally | undefined;
  /** The networks and places of the key's last days. */
  history: KeyHistory;
  /**
   * Per rule, once one has found something for the key (undefined before): the time the key was
   * last judged as of when the rule found something, -Infinity when its last evaluation found nothing.
   */
  firedAt: number[] | undefined;
  /** Per rule: events arrived while the rule was waiting out REJUDGE_MS, so it is to be judged once that is over. */
  deferred: boolean[] | undefined;
}

/** An idle key's history, with the partition its events arrive on. */
interface IdleHistory {
  history: KeyHistory;
  partition: number;
}

/** Merchant and key as one string: where a shared apiKeyId's state and an idle key's history are kept. */
function keyRef(merchantId: string, apiKeyId: string): string {
  return `${merchantId}\u0000${apiKeyId}`;
}

/**
 * What thinning keeps apart: events of one network at one place. Of each in each minute, the first
 * and the last stay, so the rules reading history (which networks and places a key was seen at,
 * and when) see the same as in the whole window.
 */
function historyGroup(event: WindowEvent): string {
  const geo = event.geo;
  return geo === undefined ? event.network : `${event.network} ${geo.latitude},${geo.longitude}`;
}

export class DetectionEngine {
  private readonly admission: Admission;
  /** apiKeyId -> the key's state; an apiKeyId also used by another merchant is in `sharedIds` for that one. */
  private readonly keys = new Map<string, KeyState>();
  /** keyRef -> the key's state, for the rare apiKeyId that two merchants use. */
  private readonly sharedIds = new Map<string, KeyState>();
  /** keyRef -> the history of a key without a window (idle, or known only from storage), oldest first. */
  private readonly idleHistories = new Map<string, IdleHistory>();
  /** The entries of every history above, tracked or idle: each history the engine holds keeps it up to date. */
  private readonly historyEntries: HistoryEntryCount = { entries: 0 };
  /** What the histories vouched for since the last takeVouched. */
  private vouched: VouchedNetwork[] = [];
  private readonly rules: readonly AnyRule[];
  private readonly windowMs: number;
  /**
   * How far back from a key's newest event every event stays (the longest detailMs of any rule),
   * with MAX_CLOCK_SKEW_MS more: rules judge as of `now`, which may be that much earlier.
   */
  private readonly detailMs: number;
  private readonly maxEventsPerKey: number;
  private readonly maxWindowEvents: number;
  private readonly maxIdleHistories: number;
  /** The events a key may keep: maxEventsPerKey, lowered while the windows are over their budget. */
  private eventsPerKeyCap: number;
  /** Events in all windows together. */
  private windowEvents = 0;
  /** The distinct values all tracked keys' tallies hold (each key's as last counted). */
  private tallyEntries = 0;
  private shedEvents = 0;
  private forgottenKeys = 0;
  private shedHistories = 0;
  private thinnedEvents = 0;
  private eventsWithoutLimit = 0;
  /** The merchants of the latest batch's eventsWithoutLimit (cleared by process and processBatch, for a batch's slices together). */
  private readonly merchantsWithoutLimit = new Set<string>();
  private batches = 0;
  /** Per partition (-1 for HTTP): the latest time its keys were judged as of. */
  private readonly partitionClocks = new Map<number, number>();
  /** The detection config the windows were last brought in line with (followConfig). */
  private config: DetectionConfig | undefined;
  /** Keys with a rule waiting out REJUDGE_MS with events it has not judged (KeyState.deferred). */
  private readonly deferredKeys = new Set<KeyState>();
  /** What the spray tallies reported to whom: the replica's own (spray) and storage's of every partition (fleetSpray, judgeFleetSpray). */
  private readonly sprayReports = new SprayReports();
  /** How high a merchant is told of a spray in which all its keys are test keys. */
  private readonly testKeyCeiling: TestKeyCeiling = (plan, merchantId) => this.options.config().testKeyMaxSeverity(plan, merchantId);
  /** 401s per network across keys: credential stuffing, which no one key's window shows. */
  private readonly spray = new SourceSpray(this.sprayReports, this.testKeyCeiling);
  private readonly fleetSpray = new FleetSpray(this.sprayReports, this.testKeyCeiling);
  ruleErrors = 0;

  constructor(private readonly options: EngineOptions) {
    this.admission = new Admission(options.entitledPlans, options.config, options.geo, options.clock);
    this.rules = options.rules;
    this.windowMs = Math.max(...options.rules.map((rule) => rule.windowMs));
    this.detailMs = Math.max(...options.rules.map((rule) => rule.detailMs ?? rule.windowMs)) + MAX_CLOCK_SKEW_MS;
    this.maxEventsPerKey = options.maxEventsPerKey ?? 20_000;
    this.maxWindowEvents = options.maxWindowEvents ?? Infinity;
    this.eventsPerKeyCap = this.maxEventsPerKey;
    this.maxIdleHistories = Math.min(MAX_IDLE_HISTORIES, Math.max(1_000, Math.floor(this.maxWindowEvents / 10)));
  }

  get load(): EngineLoad {
    return {
      windowEvents: this.windowEvents,
      trackedKeys: this.trackedKeys,
      eventsPerKeyCap: this.eventsPerKeyCap,
      maxEventsPerKey: this.maxEventsPerKey,
      maxWindowEvents: this.maxWindowEvents,
      shedEvents: this.shedEvents,
      forgottenKeys: this.forgottenKeys,
      thinnedEvents: this.thinnedEvents,
      futureEvents: this.admission.futureEvents,
      eventsWithoutLimit: this.eventsWithoutLimit,
      merchantsWithoutLimit: [...this.merchantsWithoutLimit],
      idleHistories: this.idleHistories.size,
      historyEntries: this.historyEntries.entries,
      shedHistories: this.shedHistories,
      tallyEntries: this.tallyEntries,
      sprayEntries: this.spray.size,
    };
  }

  get trackedKeys(): number {
    return this.keys.size + this.sharedIds.size;
  }

  /** Every tracked key's tally entries counted afresh (RuleScreen.entries), for tests: load.tallyEntries must equal it. */
  recountTallyEntries(): number {
    let entries = 0;
    for (const state of [...this.keys.values(), ...this.sharedIds.values()]) {
      state.tallies.forEach((tally, r) => {
        const count = this.rules[r]!.screen?.entries;
        if (tally !== undefined && tally !== BROKEN && count) entries += count(tally);
      });
    }
    return entries;
  }

  /** Every history's entries counted afresh, for tests: load.historyEntries must equal it. */
  recountHistoryEntries(): number {
    let entries = 0;
    for (const state of [...this.keys.values(), ...this.sharedIds.values()]) entries += state.history.size;
    for (const idle of this.idleHistories.values()) entries += idle.history.size;
    return entries;
  }

  /** Adds events to their windows and evaluates every key they touched, as of `now`. */
  process(events: readonly BatchEvent[], now: number, partition = -1): EngineFinding[] {
    this.merchantsWithoutLimit.clear();
    return this.detect(this.admit(events), now, partition);
  }

  /**
   * process() for a batch as the worker takes it in: judged as of its newest event, never later
   * than `clock` (a consumer catching up judges as of the backlog's times, not today's). A batch
   * spanning more than SLICE_MS of event time (a backlog after a restart or a lag: a fetch holds up
   * to 4 MB a partition) is taken a slice at a time in time order, each judged as of its own newest
   * event: judged once as of the newest, an attack early in it would already be outside the rules'
   * windows (velocity looks 6 minutes back) and never be judged at all.
   */
  processBatch(events: readonly BatchEvent[], clock: number, partition = -1): EngineFinding[] {
    if (events.length === 0) return [];
    let oldest = Infinity;
    let newest = -Infinity;
    for (const event of events) {
      if (event.timestamp < oldest) oldest = event.timestamp;
      if (event.timestamp > newest) newest = event.timestamp;
    }
    if (newest - oldest <= SLICE_MS) return this.process(events, Math.min(clock, newest), partition);
    const inTimeOrder = [...events].sort((a, b) => a.timestamp - b.timestamp);
    const findings: EngineFinding[] = [];
    // The merchants of the whole batch's events without a limit, not of its last slice's.
    this.merchantsWithoutLimit.clear();
    for (let start = 0, end = 1; start < inTimeOrder.length; start = end++) {
      while (end < inTimeOrder.length && inTimeOrder[end]!.timestamp - inTimeOrder[start]!.timestamp <= SLICE_MS) end++;
      const sliceNewest = inTimeOrder[end - 1]!.timestamp;
      findings.push(...this.detect(this.admit(inTimeOrder.slice(start, end)), Math.min(clock, sliceNewest), partition));
    }
    return findings;
  }

  /** process() in two steps: admission and enrichment (admission.ts), ... */
  admit(events: readonly BatchEvent[]): AdmittedBatch {
    return this.admission.admit(events);
  }

  /**
   * ... then windows and rules, key by key: each key touched by the batch takes its new events
   * (window and tallies) and is judged at once, so its state is fetched from memory once.
   */
  detect(batch: AdmittedBatch, now: number, partition = -1): EngineFinding[] {
    this.followConfig();
    const findings: EngineFinding[] = [];
    for (const state of this.arrive(batch, partition)) {
      this.countEventsWithoutLimit(state);
      this.take(state);
      this.judge(state, now, findings);
    }
    try {
      const coveredByFleet = (network: string, failingKeys: number, at: number) => this.fleetSpray.covers(network, failingKeys, at, (this.options.clock ?? Date.now)());
      for (const finding of this.spray.judge(now, (key, network, since) => this.failedMostly(key, network, since), coveredByFleet)) findings.push(finding);
    } catch (error) {
      this.ruleError('high_failure_rate', error);
    }
    this.judgeDeferred(partition, now, findings);
    if (now > (this.partitionClocks.get(partition) ?? -Infinity)) this.partitionClocks.set(partition, now);
    if (++this.batches % SWEEP_EVERY_BATCHES === 0) this.dropIdleKeys();
    this.keepWithinBudget();
    return findings;
  }

  /**
   * Judges the keys whose REJUDGE_MS wait is over by `clock`, each as of the end of its wait, on the
   * partitions `quiet` names: what arrived during the wait is judged even when no batch comes to do
   * it (judgeDeferred), as when ingest goes quiet. A partition still taking batches is left to them:
   * judged here too, as of a time ahead of its events (which reach detection late), its keys would
   * be judged again by every batch, the cost REJUDGE_MS bounds. The analysis thread calls it on a
   * timer set for nextDeferredDue.
   */
  judgeDue(clock: number, quiet: (partition: number) => boolean = () => true): EngineFinding[] {
    this.followConfig();
    const findings: EngineFinding[] = [];
    for (const state of this.deferredKeys) {
      if (!quiet(state.partition)) continue;
      const due = this.deferredDue(state);
      if (due <= clock) this.judge(state, due, findings, true);
      // Judged, now or by a batch since it was marked: it waits no more.
      if (!state.deferred!.includes(true)) this.deferredKeys.delete(state);
    }
    return findings;
  }

  /** When judgeDue next has a key to judge (the earliest end of a wait), undefined while no key waits. */
  nextDeferredDue(): number | undefined {
    let next = Infinity;
    for (const state of this.deferredKeys) next = Math.min(next, this.deferredDue(state));
    return next === Infinity ? undefined : next;
  }

  /** The networks the keys' histories vouched for since the last call (each place once a day), for storage to record. */
  takeVouched(): VouchedNetwork[] {
    const vouched = this.vouched;
    if (vouched.length > 0) this.vouched = [];
    return vouched;
  }

  /**
   * Adds events without evaluating (warming the windows after a start or a rebalance), and those of
   * the last SPRAY_WINDOW_MS before `asOf` (the partition's newest stored event; by default the
   * newest of these events) to the spray tally: a spray that straddles the restart is judged whole,
   * and the older 401s of the hour a warm-up reads, which the tally would drop at once, never crowd
   * out a spray it is following.
   */
  warm(events: readonly RequestEvent[], partition = -1, asOf?: number): void {
    this.followConfig();
    const batch = this.admit(events);
    const sprayFrom = (asOf ?? batch.events.reduce((newest, event) => Math.max(newest, event.timestamp), -Infinity)) - SPRAY_WINDOW_MS;
    for (const state of this.arrive(batch, partition, sprayFrom)) this.take(state);
    this.keepWithinBudget();
  }

  /**
   * Loads what storage remembers of keys' networks into their histories, without judging (after a
   * start or a rebalance, like warm). A key allowlisted as a whole is left out.
   */
  recall(sightings: readonly NetworkSighting[], partition = -1): void {
    const config = this.options.config();
    for (const sighting of sightings) {
      if (config.isKeyAllowlisted(sighting.merchantId, sighting.apiKeyId)) continue;
      const history = this.historyOf(sighting.merchantId, sighting.apiKeyId, partition);
      const { network, geo } = this.admission.place(sighting.ip);
      history.recalled(network, geo, sighting.first, sighting.last, sighting.vouched);
    }
    this.keepWithinBudget();
  }

  /**
   * Credential stuffing across replicas (FleetSpray): judges storage's reading of the requests of
   * every partition's keys from networks that failed for many keys (EventStore.sprayedRequests), as
   * of its newest 401 (never past `clock`, the wall clock): this replica's own batches may be
   * behind or quiet. The requests the detection config allowlists are left out, as admission leaves
   * them out of the windows, and so are keys whose 401s are dated more than MAX_CLOCK_SKEW_MS ahead
   * of `clock`. What it reports, and what the replica's own tally reports, each merchant hears once.
   */
  judgeFleetSpray(requests: readonly SprayedRequests[], clock: number): EngineFinding[] {
    this.followConfig();
    const config = this.options.config();
    const allowlisted = (r: SprayedRequests) => config.isAllowlisted(r.merchantId, r.apiKeyId, r.ip, r.userAgent);
    const keys = sprayedKeysOf(requests, allowlisted, clock + MAX_CLOCK_SKEW_MS);
    let now = -Infinity;
    for (const key of keys) now = Math.max(now, Math.min(clock, key.newest));
    try {
      return this.fleetSpray.judge(keys, now === -Infinity ? clock : now, clock);
    } catch (error) {
      this.ruleError('high_failure_rate', error);
      return [];
    }
  }

  /** Forgets the keys of partitions this replica no longer owns, and their histories. */
  keepPartitions(owned: ReadonlySet<number>): void {
    for (const keys of [this.keys, this.sharedIds]) {
      for (const [key, state] of keys) if (state.partition >= 0 && !owned.has(state.partition)) this.forget(keys, key, state, false);
    }
    for (const [ref, idle] of this.idleHistories) if (idle.partition >= 0 && !owned.has(idle.partition)) this.dropIdle(ref, idle);
    this.spray.keepPartitions(owned);
  }

  /**
   * After the detection config changed (a file reload), the events it now allowlists leave the
   * windows, as if they had never entered them: a key with such events has its window, eventIds and
   * tallies built again from the rest (tallies only follow events entering and leaving in order;
   * reloads are rare), and a key now allowlisted as a whole is forgotten. Runs before a batch's
   * events go into the windows; the batch itself was admitted under the new config.
   */
  private followConfig(): void {
    const config = this.options.config();
    if (config === this.config) return;
    const first = this.config === undefined;
    this.config = config;
    if (first || !config.hasAllowlists) return;
    for (const keys of [this.keys, this.sharedIds]) {
      for (const [key, state] of keys) {
        if (config.isKeyAllowlisted(state.merchantId, state.apiKeyId)) this.forget(keys, key, state, false);
        else this.dropAllowlisted(state, config);
      }
    }
  }

  /** Takes the events the config allowlists (by address, network or user agent) out of the key's window. */
  private dropAllowlisted(state: KeyState, config: DetectionConfig): void {
    const events = state.window.toArray();
    // Consecutive events usually share their address and user agent: the last verdict is kept at hand.
    let ip: string | undefined;
    let userAgent: string | undefined;
    let allowlisted = false;
    let kept: WindowEvent[] | undefined;
    for (let i = 0; i < events.length; i++) {
      const event = events[i]!;
      if (event.ip !== ip || event.userAgent !== userAgent) {
        ip = event.ip;
        userAgent = event.userAgent;
        allowlisted = config.isAllowlisted(state.merchantId, state.apiKeyId, ip, userAgent);
      }
      if (allowlisted) kept ??= events.slice(0, i);
      else kept?.push(event);
    }
    if (kept === undefined) return;
    // Built again from the events kept, in time order, their tally entries counted afresh; a screen set aside (BROKEN) gets a new tally.
    this.windowEvents -= state.window.size;
    this.tallyEntries -= state.tallyEntries;
    state.tallyEntries = 0;
    state.window = new EventWindow();
    state.eventIds = new EventIdHashes();
    state.tallies = this.rules.map((rule) => rule.screen?.create());
    state.thinnedBefore = -Infinity;
    // What the cap dropped cannot be sorted into allowlisted and not: it is forgotten (a rule then
    // counts less, never the allowlisted requests). cappedAt stays: its minutes are still cut.
    state.dropped = undefined;
    for (const event of kept) {
      state.eventIds.add(eventIdHash(event.eventId));
      state.arrived.push(event);
    }
    this.take(state);
  }

  /** Drops a key's window; its history is kept for when it returns, unless `keepHistory` is false. */
  private forget(keys: Map<string, KeyState>, key: string, state: KeyState, keepHistory = true): void {
    keys.delete(key);
    this.deferredKeys.delete(state);
    this.windowEvents -= state.window.size;
    this.tallyEntries -= state.tallyEntries;
    if (keepHistory && state.history.size > 0) this.keepIdle(keyRef(state.merchantId, state.apiKeyId), { history: state.history, partition: state.partition });
    else state.history.release();
  }

  private keepIdle(ref: string, idle: IdleHistory): void {
    this.idleHistories.set(ref, idle);
    if (this.idleHistories.size <= this.maxIdleHistories) return;
    const [oldestRef, oldest] = this.idleHistories.entries().next().value!;
    this.dropIdle(oldestRef, oldest);
  }

  /** An idle key's history goes, and its entries with it. */
  private dropIdle(ref: string, idle: IdleHistory): void {
    this.idleHistories.delete(ref);
    idle.history.release();
  }

  /** A tracked key's state, by its id or (another merchant's key of the same id) by merchant and id; undefined for a key not tracked. */
  private trackedState(merchantId: string, apiKeyId: string): KeyState | undefined {
    const state = this.keys.get(apiKeyId);
    return state !== undefined && state.merchantId === merchantId ? state : this.sharedIds.get(keyRef(merchantId, apiKeyId));
  }

  /** The history of a key, tracked or idle; an unknown key gets an idle one. */
  private historyOf(merchantId: string, apiKeyId: string, partition: number): KeyHistory {
    const tracked = this.trackedState(merchantId, apiKeyId);
    if (tracked !== undefined) return tracked.history;
    const ref = keyRef(merchantId, apiKeyId);
    let idle = this.idleHistories.get(ref);
    if (idle === undefined) this.keepIdle(ref, (idle = { history: new KeyHistory(this.historyEntries), partition }));
    return idle.history;
  }

  /** The windows' and histories' cost against the budget, in events. */
  private get cost(): number {
    return this.windowEvents + KEY_WEIGHT * this.trackedKeys + HISTORY_ENTRY_WEIGHT * this.historyEntriesCounted + TALLY_ENTRY_WEIGHT * this.tallyEntriesCounted;
  }

  /** The tally entries beyond TALLY_ENTRIES_PER_KEY per tracked key, all keys together. */
  private get tallyEntriesCounted(): number {
    return Math.max(0, this.tallyEntries - TALLY_ENTRIES_PER_KEY * this.trackedKeys);
  }

  /**
   * The history entries beyond HISTORY_ENTRIES_PER_KEY per history, tracked or idle, all histories
   * together (the budget bounds the whole: a key with fewer leaves room for one with more).
   */
  private get historyEntriesCounted(): number {
    return Math.max(0, this.historyEntries.entries - HISTORY_ENTRIES_PER_KEY * (this.trackedKeys + this.idleHistories.size));
  }

  /**
   * Over budget, idle keys' histories go first, the longest idle first, while their entries count
   * (they cost the rules least: a key that returns has only its networks and places of the last
   * days forgotten). Then the busiest keys lose their oldest events (the per-key cap comes down to
   * the highest value that fits 90% of the budget, never under MIN_EVENTS_PER_KEY), then the keys
   * seen least recently go, and with them their histories if these still do not fit. Their history
   * is lost, as after a restart without warm-up: rules see less of it (fewer findings), and a place
   * or network that only the lost part held looks new. Well under budget again, the cap doubles
   * back towards maxEventsPerKey, a batch at a time.
   */
  private keepWithinBudget(): void {
    const budget = this.maxWindowEvents;
    if (this.cost <= budget) {
      if (this.eventsPerKeyCap < this.maxEventsPerKey && this.cost < budget / 2) this.eventsPerKeyCap = Math.min(this.maxEventsPerKey, this.eventsPerKeyCap * 2);
      return;
    }
    const target = Math.floor(budget * 0.9);
    this.shedIdleHistories(target);
    if (this.cost <= target) return;
    const states = [...this.keys.values(), ...this.sharedIds.values()];
    // Tally entries come with events (a key flooded from new networks holds one per event): they
    // leave as the events do, so each event is taken to bring its share of them.
    const perEvent = 1 + (TALLY_ENTRY_WEIGHT * this.tallyEntriesCounted) / Math.max(1, this.windowEvents);
    const room = (target - KEY_WEIGHT * states.length - HISTORY_ENTRY_WEIGHT * this.historyEntriesCounted) / perEvent;
    this.eventsPerKeyCap = capWithin(states.map((state) => state.window.size), Math.floor(room), this.eventsPerKeyCap);
    for (const state of states) {
      if (state.window.size <= this.eventsPerKeyCap) continue;
      const before = state.window.size + this.thinnedEvents;
      this.prune(state);
      this.shedEvents += before - state.window.size - this.thinnedEvents;
    }
    if (this.cost <= target) return;
    this.forgetLeastRecent(this.cost - target);
    this.shedIdleHistories(target);
  }

  /**
   * Drops idle keys' histories of more than HISTORY_ENTRIES_PER_KEY entries (dropping a smaller one
   * frees nothing the budget counts), the longest idle first, until the cost is down to `target` or
   * history entries no longer count in it.
   */
  private shedIdleHistories(target: number): void {
    for (const [ref, idle] of this.idleHistories) {
      if (this.cost <= target || this.historyEntriesCounted === 0) return;
      if (idle.history.size <= HISTORY_ENTRIES_PER_KEY) continue;
      this.dropIdle(ref, idle);
      this.shedHistories++;
    }
  }

  /**
   * Forgets the keys seen least recently until what they held makes up `excess`: their windows, and
   * their histories' entries beyond those KEY_WEIGHT covers (the histories go idle, to be shed next).
   */
  private forgetLeastRecent(excess: number): void {
    const entries: [Map<string, KeyState>, string, KeyState][] = [];
    for (const keys of [this.keys, this.sharedIds]) for (const [key, state] of keys) entries.push([keys, key, state]);
    entries.sort((a, b) => a[2].window.newestTime - b[2].window.newestTime);
    let freed = 0;
    for (const [keys, key, state] of entries) {
      if (freed >= excess) break;
      freed += state.window.size + KEY_WEIGHT + HISTORY_ENTRY_WEIGHT * Math.max(0, state.history.size - HISTORY_ENTRIES_PER_KEY);
      this.keepSprayVerdicts(state);
      this.forget(keys, key, state);
      this.forgottenKeys++;
    }
  }

  /**
   * Forgets keys whose newest event left the window a whole window ago, by the clock of the key's
   * own partition (a partition catching up on a backlog keeps its keys). Without this, every key
   * ever seen would stay in memory. Nothing changes for a key that returns: its first new event
   * would have pruned the whole old window anyway. Runs at the end of detect, when every key's
   * arrived events are in its window.
   */
  private dropIdleKeys(): void {
    for (const keys of [this.keys, this.sharedIds]) {
      for (const [key, state] of keys) {
        const clock = this.partitionClocks.get(state.partition);
        if (clock === undefined) continue;
        if (state.window.newestTime < clock - this.windowMs) this.forget(keys, key, state);
        else state.history.expire(clock);
      }
    }
    for (const [ref, idle] of this.idleHistories) {
      const clock = this.partitionClocks.get(idle.partition);
      if (clock === undefined) continue;
      if (idle.history.newest < clock - HISTORY_MS) this.dropIdle(ref, idle);
      else idle.history.expire(clock);
    }
  }

  /**
   * Hands each event to its key, unless the key has its eventId already; returns the keys touched.
   * Warming, an event older than what the key has thinned is left out too: the key had it, and thinned
   * it out (which forgot its eventId). Back whole, the key would go over its cap, which drops the oldest.
   */
  private arrive(batch: AdmittedBatch, partition: number, warmingSprayFrom?: number): KeyState[] {
    const warming = warmingSprayFrom !== undefined;
    const touched: KeyState[] = [];
    for (let i = 0; i < batch.events.length; i++) {
      const event = batch.events[i]!;
      const state = this.stateOf(event, partition);
      if (warming && event.timestamp < state.thinnedBefore) continue;
      const idHash = eventIdHash(event.eventId);
      if (state.eventIds.has(idHash) && this.holds(state, event.eventId)) continue; // a redelivery counts once
      state.eventIds.add(idHash);
      state.plan = event.plan;
      // A key one event calls live is judged as live: never under-report a live key.
      if (event.environment === 'live' && state.environment !== 'live') {
        state.environment = 'live';
        this.spray.keyIsLive(state.merchantId, state.apiKeyId);
      }
      if (partition >= 0) state.partition = partition;
      if (state.arrived.push(batch.windowEvents[i]!) === 1) touched.push(state);
      if (!warming || event.timestamp >= warmingSprayFrom) this.spray.add(event, batch.windowEvents[i]!, state.partition, state.environment);
    }
    return touched;
  }

  /**
   * Whether most of a key's requests from a network since `since` failed with 401, by its window
   * (403, 429 and 5xx not counted, as high_failure_rate does not). A key the memory budget forgot
   * is judged by what its window said then (keepSprayVerdicts); a key without a verdict is not
   * counted, nor one whose window holds none of its requests from the network (the cap cut them):
   * nothing says they failed, and an integration platform's keys, failing now and then, would count.
   * Requests from the key's own networks (/24, /64) there, known to its history before `since`, are
   * left out: a key deleted but still set where it worked, failing from a shared egress, is no
   * stranger's try; nor do the owner's successes there hide a stranger's 401s from the rest of a /48.
   */
  private failedMostly(key: SprayedKey, network: string, since: number): boolean {
    const state = this.trackedState(key.merchantId, key.apiKeyId);
    return state === undefined ? key.failedMostly === true : this.failedFrom(state, network, since);
  }

  /** Before the budget forgets a key, the spray keeps its window's verdict on each network it failed from in the spray's window. */
  private keepSprayVerdicts(state: KeyState): void {
    const since = state.window.newestTime - SPRAY_WINDOW_MS;
    const networks = new Set<string>();
    const sprayNetwork = sprayNetworkMemo();
    state.window.forEachSince(since, (event) => {
      if (event.status === 401) networks.add(sprayNetwork(event.network));
    });
    for (const network of networks) this.spray.keepVerdict(network, state.merchantId, state.apiKeyId, this.failedFrom(state, network, since));
  }

  private failedFrom(state: KeyState, network: string, since: number): boolean {
    let failed = 0;
    let judged = 0;
    const sprayNetwork = sprayNetworkMemo();
    const own = new Map<string, boolean>();
    const isOwn = (keyNetwork: string) => {
      let known = own.get(keyNetwork);
      if (known === undefined) own.set(keyNetwork, (known = state.history.knowsNetwork(keyNetwork, since)));
      return known;
    };
    state.window.forEachSince(since, (event) => {
      if (event.status === 403 || event.status === 429 || event.status >= 500 || sprayNetwork(event.network) !== network || isOwn(event.network)) return;
      judged++;
      if (event.status === 401) failed++;
    });
    return judged > 0 && failed * 2 >= judged;
  }

  /** Whether the key has an event with this id already (to confirm a hash hit: a repeat or a rare collision). */
  private holds(state: KeyState, eventId: string): boolean {
    return state.window.includes(eventId) || state.arrived.some((event) => event.eventId === eventId);
  }

  /** The key's new events go into its window and every rule's tally; then the oldest leave. */
  private take(state: KeyState): void {
    for (const event of state.arrived) {
      state.window.insert(event);
      state.history.saw(event.network, event.geo, event.timestamp);
      this.updateTallies(state, 'add', event);
    }
    const vouched = state.history.takeVouched();
    if (vouched !== undefined) {
      const { merchantId, apiKeyId, partition } = state;
      // Bounded for an engine nobody takes them from (a benchmark): one record a day per place is few.
      for (const { network, at } of vouched) if (this.vouched.length < MAX_UNTAKEN_VOUCHED) this.vouched.push({ merchantId, apiKeyId, partition, network, at });
    }
    this.windowEvents += state.arrived.length;
    state.arrived.length = 0;
    this.prune(state);
  }

  /**
   * An event enters or leaves the key's window: every rule's tally follows, and says how many entries
   * it gained or lost (counted as it goes: asking every tally for its size after each batch cost 7%
   * of the engine's time, in memory reads); a screen that throws is set aside.
   */
  private updateTallies(state: KeyState, update: 'add' | 'remove', event: WindowEvent): void {
    let entries = 0;
    for (let r = 0; r < this.rules.length; r++) {
      const tally = state.tallies[r];
      if (tally === undefined || tally === BROKEN) continue;
      try {
        const changed = this.rules[r]!.screen![update](tally, event);
        if (changed) entries += changed;
      } catch (error) {
        this.screenFailed(state, r, error);
      }
    }
    if (entries === 0) return;
    if (update === 'remove') entries = -entries;
    state.tallyEntries += entries;
    this.tallyEntries += entries;
  }

  private stateOf(event: RequestEvent, partition: number): KeyState {
    const state = this.keys.get(event.apiKeyId);
    if (state !== undefined && state.merchantId === event.merchantId) return state;
    // Rare: another merchant's key of the same id, or a key whose first owner was forgotten.
    const key = keyRef(event.merchantId, event.apiKeyId);
    const shared = this.sharedIds.get(key);
    if (shared !== undefined) return shared;
    return state === undefined ? this.newState(this.keys, event.apiKeyId, event, partition) : this.newState(this.sharedIds, key, event, partition);
  }

  private newState(keys: Map<string, KeyState>, key: string, event: RequestEvent, partition: number): KeyState {
    const ref = keyRef(event.merchantId, event.apiKeyId);
    const idle = this.idleHistories.get(ref);
    if (idle !== undefined) this.idleHistories.delete(ref);
    const state: KeyState = {
      merchantId: event.merchantId,
      apiKeyId: event.apiKeyId,
      plan: event.plan,
      environment: event.environment,
      window: new EventWindow(),
      eventIds: new EventIdHashes(),
      partition,
      tallies: this.rules.map((rule) => rule.screen?.create()),
      tallyEntries: 0,
      params: [],
      needsLimit: false,
      testKeyMaxSeverity: 'low',
      paramsConfig: undefined,
      paramsPlan: undefined,
      arrived: [],
      thinnedBefore: -Infinity,
      cappedAt: -Infinity,
      cappedIds: undefined,
      dropped: undefined,
      history: idle?.history ?? new KeyHistory(this.historyEntries),
      firedAt: undefined,
      deferred: undefined,
    };
    keys.set(key, state);
    return state;
  }

  /**
   * Drops events older than the longest rule window (relative to the key's newest event); a key
   * over the cap has its history thinned, then loses its oldest events down to the cap.
   */
  private prune(state: KeyState): void {
    const { window } = state;
    const cutoff = window.newestTime - this.windowMs;
    while (window.size > 0 && window.oldestTime < cutoff) this.dropOldest(state);
    if (window.size > this.eventsPerKeyCap) this.thin(state);
    // An event older than what the cap had already dropped, dropped at once, is recorded only once:
    // it is likely one the cap dropped before, delivered again (its id left with it), not a new one.
    // One dated the same as the newest it dropped is told by its id: timestamps of whole seconds
    // (a producer's `date +%s`) would otherwise leave most of a flood unrecorded.
    while (window.size > this.eventsPerKeyCap) {
      const event = this.dropOldest(state);
      if (event.timestamp < state.cappedAt) continue;
      if (event.timestamp > state.cappedAt) {
        state.cappedAt = event.timestamp;
        (state.cappedIds ??= new Set()).clear();
      } else if (state.cappedIds!.has(event.eventId)) continue;
      state.cappedIds!.add(event.eventId);
      (state.dropped ??= new DroppedRequestTally()).add(event);
    }
  }

  /** Drops the window's oldest event, and returns it. */
  private dropOldest(state: KeyState): WindowEvent {
    const event = state.window.dropOldest();
    this.windowEvents--;
    state.eventIds.delete(eventIdHash(event.eventId));
    this.updateTallies(state, 'remove', event);
    return event;
  }

  /**
   * A key busier than its cap keeps its whole window all the same where it can: the minutes older
   * than detailMs that are not thinned yet are thinned to the first and the last event of each
   * network and place (historyGroup) in each minute. The rules reading that far back only ask which
   * networks and places the key was seen at, and when; so a busy key keeps the history that tells a
   * multi-region deployment from a shared key, instead of losing it to the cap. Each minute is
   * thinned once, as a whole: at most once a minute per key.
   */
  private thin(state: KeyState): void {
    const before = Math.floor((state.window.newestTime - this.detailMs) / MINUTE) * MINUTE;
    if (!(before > state.thinnedBefore)) return;
    const removed = state.window.thin(state.thinnedBefore, before, historyGroup);
    state.thinnedBefore = before;
    for (const event of removed) {
      state.eventIds.delete(eventIdHash(event.eventId));
      this.updateTallies(state, 'remove', event);
    }
    this.windowEvents -= removed.length;
    this.thinnedEvents += removed.length;
  }

  /**
   * Every rule whose screen says it may fire reads the key's window; a rule that found something
   * less than REJUDGE_MS ago waits (judgeDeferred). With `deferredOnly`, only the rules that waited.
   */
  private judge(state: KeyState, now: number, findings: EngineFinding[], deferredOnly = false): void {
    this.refreshParams(state);
    let window: KeyWindow | undefined;
    for (let r = 0; r < this.rules.length; r++) {
      if (deferredOnly && state.deferred?.[r] !== true) continue;
      if (state.firedAt !== undefined && !this.judgeable(state, state.firedAt[r]!, r, now)) continue;
      const rule = this.rules[r]!;
      const tally = state.tallies[r];
      if (tally !== undefined && tally !== BROKEN && !this.screen(state, r, tally, now)) {
        if (state.firedAt !== undefined) state.firedAt[r] = -Infinity;
        continue;
      }
      window ??= {
        merchantId: state.merchantId,
        apiKeyId: state.apiKeyId,
        plan: state.plan,
        events: state.window.toArray(),
        history: state.history,
        ...(state.cappedAt > -Infinity ? { cappedAt: state.cappedAt } : {}),
        ...(state.dropped ? { dropped: state.dropped } : {}),
      };
      let found = false;
      try {
        const ruleFindings = rule.evaluate(window, state.params[r], now);
        if (ruleFindings.length > 0) this.markKeyHolderSeverity(rule, window, state.dropped, state.params[r], now, ruleFindings);
        for (const finding of ruleFindings) {
          const reported = state.environment === 'test' ? testKeyFinding(finding, state.testKeyMaxSeverity) : finding;
          findings.push({ merchantId: state.merchantId, ruleId: rule.id, finding: reported });
          found = true;
        }
      } catch (error) {
        this.ruleError(rule.id, error);
      }
      if (found) (state.firedAt ??= this.rules.map(() => -Infinity))[r] = now;
      else if (state.firedAt !== undefined) state.firedAt[r] = -Infinity;
    }
  }

  /**
   * Sets each key finding's keyHolderSeverity when the window holds 401s: the rule judges the window
   * again without them, and its finding of the same scope there is what the key's holders' own
   * requests show. Only for a window with a finding, so the second evaluation is rare. Enforcement
   * fails open: when that evaluation throws, the key's holders are taken to show nothing.
   */
  private markKeyHolderSeverity(rule: AnyRule, window: KeyWindow, dropped: DroppedRequestTally | undefined, params: unknown, now: number, findings: Finding[]): void {
    // Only findings whose action acts on the key (the rest recommend no more than investigate anyway).
    // What the per-key cap dropped is counted by minute, its 401s apart: a flood of them past the cap counts too.
    const actsOnKey = (finding: Finding) => finding.apiKeyId !== null && KEY_ACTIONS.has(rule.actions[finding.severity]);
    if (!findings.some(actsOnKey) || !(window.events.some(refusedAuthentication) || dropped?.holdsRefused())) return;
    const authenticated = window.events.filter((event) => !refusedAuthentication(event));
    let holderFindings: Finding[] = [];
    if (authenticated.length > 0) {
      try {
        holderFindings = rule.evaluate({ ...window, events: authenticated, ...(dropped ? { dropped: dropped.withoutRefused() } : {}) }, params, now);
      } catch (error) {
        this.ruleError(rule.id, error);
      }
    }
    for (const finding of findings) {
      if (!actsOnKey(finding)) continue;
      const holders = holderFindings.find((holder) => holder.scope === finding.scope);
      finding.keyHolderSeverity = holders?.severity ?? null;
      if (holders !== undefined) finding.keyHolderLastSeenAt = holders.lastSeenAt;
    }
  }

  /**
   * Whether rule r may judge the key now: not while it waits out REJUDGE_MS after a finding (then
   * the key is marked for judgeDeferred). A `now` earlier than the finding's (another partition's
   * clock, a batch of older events) does not wait.
   */
  private judgeable(state: KeyState, firedAt: number, r: number, now: number): boolean {
    if (!(now >= firedAt && now < firedAt + REJUDGE_MS)) {
      if (state.deferred !== undefined) state.deferred[r] = false;
      return true;
    }
    (state.deferred ??= this.rules.map(() => false))[r] = true;
    this.deferredKeys.add(state);
    return false;
  }

  /**
   * The keys of this batch's partition whose rules waited out REJUDGE_MS with events they had not
   * judged: judged now if the wait is over, even without new events (so the last of an attack is
   * judged too); a key still waiting stays marked.
   */
  private judgeDeferred(partition: number, now: number, findings: EngineFinding[]): void {
    for (const state of this.deferredKeys) {
      if (state.partition !== partition) continue;
      this.judge(state, now, findings, true);
      if (!state.deferred!.includes(true)) this.deferredKeys.delete(state);
    }
  }

  /** When the first of the key's waiting rules may be judged again; Infinity if none waits (any longer). */
  private deferredDue(state: KeyState): number {
    let due = Infinity;
    state.deferred?.forEach((waiting, r) => {
      if (waiting) due = Math.min(due, state.firedAt![r]! + REJUDGE_MS);
    });
    return due;
  }

  /** A screen's verdict on a key; a screen that throws is set aside for the key, and the rule evaluates. */
  private screen(state: KeyState, r: number, tally: unknown, now: number): boolean {
    try {
      return this.rules[r]!.screen!.mayFire(tally, state.params[r], now, state.history, state.dropped);
    } catch (error) {
      this.screenFailed(state, r, error);
      return true;
    }
  }

  /** The rule is reported, and evaluates this key's window every time from now on. */
  private screenFailed(state: KeyState, r: number, error: unknown): void {
    state.tallies[r] = BROKEN;
    this.ruleError(this.rules[r]!.id, error);
  }

  /**
   * The key's newly arrived events that carried no limit, where a rule needs one to judge them
   * (EngineLoad.eventsWithoutLimit); those answered 5xx are left out, as a limit does not count them.
   * Repeats are not among them (arrive), but for one whose first delivery has left the window (rare:
   * validation's memory of recent eventIds drops most redeliveries first).
   */
  private countEventsWithoutLimit(state: KeyState): void {
    this.refreshParams(state);
    if (!state.needsLimit) return;
    let count = 0;
    for (const event of state.arrived) if (event.rateLimitPerMinute === 0 && event.status < 500) count++;
    if (count === 0) return;
    this.eventsWithoutLimit += count;
    if (this.merchantsWithoutLimit.size < MERCHANTS_WITHOUT_LIMIT) this.merchantsWithoutLimit.add(state.merchantId);
  }

  /** The rules' parameters (and test-key ceiling) for a key, merged again only when the config or the key's plan changed. */
  private refreshParams(state: KeyState): void {
    const config = this.options.config();
    if (state.paramsConfig === config && state.paramsPlan === state.plan) return;
    state.params = this.rules.map((rule) => config.parameters(rule.id, defaultsFor(rule, state.plan), state.plan, state.merchantId));
    state.needsLimit = this.rules.some((rule, r) => this.ruleNeedsLimit(rule, state.params[r]));
    state.testKeyMaxSeverity = config.testKeyMaxSeverity(state.plan, state.merchantId);
    state.paramsConfig = config;
    state.paramsPlan = state.plan;
  }

  /** RuleDefinition.needsLimit, isolated as a rule's other calls are: one that throws is reported and taken as no. */
  private ruleNeedsLimit(rule: AnyRule, params: unknown): boolean {
    try {
      return rule.needsLimit?.(params) === true;
    } catch (error) {
      this.ruleError(rule.id, error);
      return false;
    }
  }

  private ruleError(ruleId: string, error: unknown): void {
    this.ruleErrors++;
    this.options.onRuleError?.(ruleId, error);
  }
}

/**
 * The highest per-key cap, between MIN_EVENTS_PER_KEY (or `ceiling` if lower) and `ceiling`, at
 * which the windows' sizes, each capped, add up to `room` at most; the lowest when none does.
 */
export function capWithin(sizes: readonly number[], room: number, ceiling: number): number {
  const fits = (cap: number) => {
    let total = 0;
    for (const size of sizes) total += Math.min(size, cap);
    return total <= room;
  };
  let low = Math.min(MIN_EVENTS_PER_KEY, ceiling);
  let high = ceiling;
  if (fits(high)) return high;
  while (low < high) {
    const middle = Math.ceil((low + high) / 2);
    if (fits(middle)) low = middle;
    else high = middle - 1;
  }
  return low;
}

/** A request that named the key without its secret (a wrong, revoked or deleted one). */
const refusedAuthentication = (event: WindowEvent) => event.status === 401;

/** A rule's defaults for a plan: its defaults, with the plan's own (RuleDefinition.planDefaults) over them. */
export function defaultsFor<P extends Record<string, number | string | boolean | readonly string[]>>(rule: Pick<RuleDefinition<P>, 'defaults' | 'planDefaults'>, plan: Plan): P {
  const planDefaults = rule.planDefaults?.[plan];
  return planDefaults ? { ...rule.defaults, ...planDefaults } : rule.defaults;
}

/** sprayNetworkOf, remembering its last answer: a window's events mostly come in runs from one network. */
function sprayNetworkMemo(): (network: string) => string {
  let last: string | undefined;
  let answer = '';
  return (network) => {
    if (network !== last) {
      last = network;
      answer = sprayNetworkOf(network);
    }
    return answer;
  };
}
