/**
 * The streaming detection engine. Every batch the worker takes in is evaluated at once: events go
 * into per-key windows in memory, and every rule judges each key the batch touched.
 * Contract: only entitled plans are evaluated; an eventId counts once per key; allowlisted sources
 * never enter a window; a rule that throws is isolated (counted, reported, the others go on); the
 * engine does no I/O — findings go back to the caller, which turns them into alerts.
 * Cost: each rule's screen (RuleScreen in types.ts) keeps running tallies of every window as events
 * enter and leave it, so judging a key is usually a few counter checks; a rule reads the window
 * (evaluate) only when its screen says it may fire.
 */
import { DEFAULT_RATE_LIMIT_PER_MINUTE, type Plan, type RequestEvent } from '../events/request-event.ts';
import { networkOf } from '../../rules/network.ts';
import type { DetectionConfig } from './detection-config.ts';
import { EventWindow } from './event-window.ts';
import type { GeoLookup } from './geo.ts';
import type { AnomalyType, Finding, KeyWindow, RuleDefinition, WindowEvent } from './types.ts';

// Rules have different parameter and tally types; the engine treats them alike.
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type AnyRule = RuleDefinition<any, any>;

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
  /** Most events kept per key (the oldest go first); bounds memory for the busiest keys. */
  maxEventsPerKey?: number;
  onRuleError?(ruleId: string, error: unknown): void;
}

/** A screen that threw: its tally can no longer be trusted, so the rule evaluates the window every time. */
const BROKEN = Symbol('broken screen');

interface KeyState {
  merchantId: string;
  apiKeyId: string;
  plan: Plan;
  window: EventWindow;
  eventIds: Set<string>;
  /** Kafka partition the key's events arrive on (-1 for HTTP), for dropping keys after a rebalance. */
  partition: number;
  /** Per rule (same index as the rules): its screen's tally, undefined without a screen, or BROKEN. */
  tallies: unknown[];
  /** Per rule: its parameters for this key, merged for `paramsOf` (the config and plan they were merged under). */
  params: unknown[];
  paramsOf: { config: DetectionConfig; plan: Plan } | undefined;
  /** The batch that last touched the key, so each key is evaluated once per batch. */
  batch: number;
}

export class DetectionEngine {
  private readonly keys = new Map<string, KeyState>();
  private readonly rules: readonly AnyRule[];
  private readonly windowMs: number;
  private readonly maxEventsPerKey: number;
  private readonly entitled: Set<string>;
  private batches = 0;
  ruleErrors = 0;

  constructor(private readonly options: EngineOptions) {
    this.rules = options.rules;
    this.windowMs = Math.max(...options.rules.map((rule) => rule.windowMs));
    this.maxEventsPerKey = options.maxEventsPerKey ?? 5_000;
    this.entitled = new Set(options.entitledPlans);
  }

  get trackedKeys(): number {
    return this.keys.size;
  }

  /** Adds events to their windows and evaluates every key they touched, as of `now`. */
  process(events: readonly RequestEvent[], now: number, partition = -1): EngineFinding[] {
    const batch = ++this.batches;
    const touched: KeyState[] = [];
    for (const event of events) {
      const state = this.add(event, partition);
      if (state && state.batch !== batch) {
        state.batch = batch;
        touched.push(state);
      }
    }
    const findings: EngineFinding[] = [];
    for (const state of touched) this.evaluate(state, now, findings);
    return findings;
  }

  /** Adds events without evaluating (warming the windows after a start or a rebalance). */
  warm(events: readonly RequestEvent[], partition = -1): void {
    for (const event of events) this.add(event, partition);
  }

  /** Forgets the keys of partitions this replica no longer owns. */
  keepPartitions(owned: ReadonlySet<number>): void {
    for (const [key, state] of this.keys) {
      if (state.partition >= 0 && !owned.has(state.partition)) this.keys.delete(key);
    }
  }

  private add(event: RequestEvent, partition: number): KeyState | undefined {
    if (!this.entitled.has(event.plan)) return undefined;
    if (this.options.config().isAllowlisted(event.merchantId, event.apiKeyId, event.ip, event.userAgent)) return undefined;
    const key = `${event.merchantId}\u0000${event.apiKeyId}`;
    let state = this.keys.get(key);
    if (!state) {
      state = this.newKey(event, partition);
      this.keys.set(key, state);
    }
    if (state.eventIds.has(event.eventId)) return undefined; // a redelivery counts once
    state.eventIds.add(event.eventId);
    state.plan = event.plan;
    if (partition >= 0) state.partition = partition;
    const windowEvent = this.toWindowEvent(event);
    state.window.insert(windowEvent);
    this.updateTallies(state, 'add', windowEvent);
    this.prune(state);
    return state;
  }

  private newKey(event: RequestEvent, partition: number): KeyState {
    return {
      merchantId: event.merchantId,
      apiKeyId: event.apiKeyId,
      plan: event.plan,
      window: new EventWindow(),
      eventIds: new Set(),
      partition,
      tallies: this.rules.map((rule) => rule.screen?.create()),
      params: [],
      paramsOf: undefined,
      batch: 0,
    };
  }

  private toWindowEvent(event: RequestEvent): WindowEvent {
    const geo = this.options.geo?.lookup(event.ip);
    // Every event has the same fields (country and geo may be undefined): the rules' reads stay monomorphic.
    return {
      eventId: event.eventId,
      timestamp: event.timestamp,
      ip: event.ip,
      network: networkOf(event.ip),
      userAgent: event.userAgent,
      method: event.method,
      path: event.path,
      status: event.status,
      responseTimeMs: event.responseTimeMs,
      rateLimitPerMinute: event.rateLimitPerMinute ?? DEFAULT_RATE_LIMIT_PER_MINUTE[event.plan],
      country: event.country ?? geo?.country,
      geo,
    };
  }

  /** Drops events older than the longest rule window (relative to the key's newest event), and the excess. */
  private prune(state: KeyState): void {
    const { window } = state;
    const cutoff = window.newest!.timestamp - this.windowMs;
    while (window.size > this.maxEventsPerKey || window.oldest!.timestamp < cutoff) {
      const event = window.dropOldest();
      state.eventIds.delete(event.eventId);
      this.updateTallies(state, 'removeOldest', event);
    }
  }

  /** An event enters or leaves the key's window: every rule's tally follows. */
  private updateTallies(state: KeyState, update: 'add' | 'removeOldest', event: WindowEvent): void {
    for (let r = 0; r < this.rules.length; r++) {
      const tally = state.tallies[r];
      if (tally === undefined || tally === BROKEN) continue;
      try {
        this.rules[r]!.screen![update](tally, event);
      } catch (error) {
        this.screenFailed(state, r, error);
      }
    }
  }

  /** Screens a key for one rule: false when the rule cannot fire. A screen that throws is set aside for the key. */
  private mayFire(state: KeyState, r: number, params: unknown, now: number): boolean {
    const tally = state.tallies[r];
    if (tally === undefined || tally === BROKEN) return true;
    try {
      return this.rules[r]!.screen!.mayFire(tally, params, now);
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

  private evaluate(state: KeyState, now: number, findings: EngineFinding[]): void {
    const params = this.paramsFor(state);
    let window: KeyWindow | undefined;
    for (let r = 0; r < this.rules.length; r++) {
      const rule = this.rules[r]!;
      if (!this.mayFire(state, r, params[r], now)) continue;
      try {
        window ??= { merchantId: state.merchantId, apiKeyId: state.apiKeyId, plan: state.plan, events: state.window.toArray() };
        for (const finding of rule.evaluate(window, params[r], now)) findings.push({ merchantId: state.merchantId, ruleId: rule.id, finding });
      } catch (error) {
        this.ruleError(rule.id, error);
      }
    }
  }

  /** The rules' parameters for a key, merged again only when the config or the key's plan changed. */
  private paramsFor(state: KeyState): unknown[] {
    const config = this.options.config();
    if (state.paramsOf?.config !== config || state.paramsOf.plan !== state.plan) {
      state.params = this.rules.map((rule) => config.parameters(rule.id, rule.defaults, state.plan, state.merchantId));
      state.paramsOf = { config, plan: state.plan };
    }
    return state.params;
  }

  private ruleError(ruleId: string, error: unknown): void {
    this.ruleErrors++;
    this.options.onRuleError?.(ruleId, error);
  }
}
