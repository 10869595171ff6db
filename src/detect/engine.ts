/**
 * The streaming detection engine. Every batch the worker takes in is evaluated at once: events go
 * into per-key windows in memory, and every rule runs over each key the batch touched.
 * Contract: only entitled plans are evaluated; an eventId counts once per key; allowlisted sources
 * never enter a window; a rule that throws is isolated (counted, reported, the others go on); the
 * engine does no I/O — findings go back to the caller, which turns them into alerts.
 */
import { DEFAULT_RATE_LIMIT_PER_MINUTE, type RequestEvent } from '../events/request-event.ts';
import { networkOf } from '../../rules/network.ts';
import type { DetectionConfig } from './detection-config.ts';
import type { GeoLookup } from './geo.ts';
import type { AnomalyType, Finding, KeyWindow, RuleDefinition, WindowEvent } from './types.ts';

// Rules have different parameter types; the engine treats them alike.
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type AnyRule = RuleDefinition<any>;

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

interface KeyState {
  window: { merchantId: string; apiKeyId: string; plan: RequestEvent['plan']; events: WindowEvent[] };
  eventIds: Set<string>;
  /** Kafka partition the key's events arrive on (-1 for HTTP), for dropping keys after a rebalance. */
  partition: number;
}

export class DetectionEngine {
  private readonly keys = new Map<string, KeyState>();
  private readonly windowMs: number;
  private readonly maxEventsPerKey: number;
  private readonly entitled: Set<string>;
  ruleErrors = 0;

  constructor(private readonly options: EngineOptions) {
    this.windowMs = Math.max(...options.rules.map((rule) => rule.windowMs));
    this.maxEventsPerKey = options.maxEventsPerKey ?? 5_000;
    this.entitled = new Set(options.entitledPlans);
  }

  get trackedKeys(): number {
    return this.keys.size;
  }

  /** Adds events to their windows and evaluates every key they touched. */
  process(events: readonly RequestEvent[], now: number, partition = -1): EngineFinding[] {
    const touched = new Set<KeyState>();
    for (const event of events) {
      const state = this.add(event, partition);
      if (state) touched.add(state);
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
      state = {
        window: { merchantId: event.merchantId, apiKeyId: event.apiKeyId, plan: event.plan, events: [] },
        eventIds: new Set(),
        partition,
      };
      this.keys.set(key, state);
    }
    if (state.eventIds.has(event.eventId)) return undefined; // a redelivery counts once
    state.eventIds.add(event.eventId);
    state.window.plan = event.plan;
    if (partition >= 0) state.partition = partition;
    insertInTimeOrder(state.window.events, this.toWindowEvent(event));
    this.prune(state);
    return state;
  }

  private toWindowEvent(event: RequestEvent): WindowEvent {
    const geo = this.options.geo?.lookup(event.ip);
    const country = event.country ?? geo?.country;
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
      ...(country ? { country } : {}),
      ...(geo ? { geo } : {}),
    };
  }

  /** Drops events older than the longest rule window (relative to the key's newest event), and the excess. */
  private prune(state: KeyState): void {
    const events = state.window.events;
    const newest = events[events.length - 1]!.timestamp;
    let drop = 0;
    while (drop < events.length && (events[drop]!.timestamp < newest - this.windowMs || events.length - drop > this.maxEventsPerKey)) {
      state.eventIds.delete(events[drop]!.eventId);
      drop++;
    }
    if (drop > 0) events.splice(0, drop);
  }

  private evaluate(state: KeyState, now: number, findings: EngineFinding[]): void {
    const { window } = state;
    const config = this.options.config();
    for (const rule of this.options.rules) {
      try {
        const params = config.parameters(rule.id, rule.defaults, window.plan, window.merchantId);
        for (const finding of rule.evaluate(window as KeyWindow, params, now)) {
          findings.push({ merchantId: window.merchantId, ruleId: rule.id, finding });
        }
      } catch (error) {
        this.ruleErrors++;
        this.options.onRuleError?.(rule.id, error);
      }
    }
  }
}

/** Events arrive nearly in order: append, or walk back to the right place. */
function insertInTimeOrder(events: WindowEvent[], event: WindowEvent): void {
  let index = events.length;
  while (index > 0 && events[index - 1]!.timestamp > event.timestamp) index--;
  events.splice(index, 0, event);
}
