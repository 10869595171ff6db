/**
 * The engine's first step: which events detection looks at, and what it knows about them. An event
 * is admitted when its plan is entitled, no allowlist covers its key, address, network or user
 * agent, and it is not dated more than MAX_CLOCK_SKEW_MS ahead of the clock; it then becomes a
 * WindowEvent, with its network and geolocation filled in, and its rate limit when it carried one.
 * Stateless apart from bounded memories of addresses and user agents, and a count of the events
 * dated ahead.
 */
import type { BatchEvent, RequestEvent } from '../events/request-event.ts';
import { networkOf } from '../../rules/network.ts';
import type { DetectionConfig } from './detection-config.ts';
import type { GeoLookup } from './geo.ts';
import type { GeoPoint, WindowEvent } from './types.ts';

/** The admitted events of a batch and their window events, index for index. */
export interface AdmittedBatch {
  events: RequestEvent[];
  windowEvents: WindowEvent[];
}

/**
 * How far ahead of the worker's clock an event may be dated and still enter a window: producers'
 * clocks drift a little. A window is pruned relative to its newest event, so an event dated a day
 * ahead would push every real event of its key out as it arrives (and keep the key from ever
 * looking idle); such events are stored all the same (validation accepts timestamps up to a day ahead),
 * but detection leaves them out, and counts them (futureEvents). The worker judges a batch as of
 * its newest event but never later than the clock, so an event within the skew is judged as
 * belonging to the current minute.
 */
export const MAX_CLOCK_SKEW_MS = 5 * 60_000;

/** How many addresses and user agents are remembered: clients repeat theirs. */
const REMEMBERED = 50_000;

/** What admission knows about an address. */
interface Address {
  ip: string;
  network: string;
  geo: GeoPoint | undefined;
}

/**
 * One string object per distinct value (bounded): windows hold one copy of a user agent or network,
 * not one per event, and rules comparing them event to event find equal pointers at once.
 */
class Interner {
  private strings = new Map<string, string>();

  intern(value: string): string {
    const known = this.strings.get(value);
    if (known !== undefined) return known;
    if (this.strings.size >= REMEMBERED) this.strings = new Map();
    this.strings.set(value, value);
    return value;
  }
}

export class Admission {
  private readonly entitled: Set<string>;
  private addresses = new Map<string, Address>();
  private readonly networks = new Interner();
  private readonly userAgents = new Interner();
  /** Events left out since start for being dated more than MAX_CLOCK_SKEW_MS ahead of the clock. */
  futureEvents = 0;

  constructor(
    entitledPlans: readonly string[],
    private readonly config: () => DetectionConfig,
    private readonly geo?: GeoLookup,
    /** The wall clock, epoch ms, that events' timestamps are checked against. */
    private readonly clock: () => number = Date.now,
  ) {
    this.entitled = new Set(entitledPlans);
  }

  admit(events: readonly BatchEvent[]): AdmittedBatch {
    const config = this.config();
    const latest = this.clock() + MAX_CLOCK_SKEW_MS;
    const batch: AdmittedBatch = { events: [], windowEvents: [] };
    for (const event of events) {
      if (!this.entitled.has(event.plan) || 'unjudged' in event) continue;
      if (config.isAllowlisted(event.merchantId, event.apiKeyId, event.ip, event.userAgent)) continue;
      if (event.timestamp > latest) {
        this.futureEvents++;
        continue;
      }
      batch.events.push(event);
      batch.windowEvents.push(this.toWindowEvent(event));
    }
    return batch;
  }

  /** The network and geolocation of an address, as events from it get them. */
  place(ip: string): { network: string; geo: GeoPoint | undefined } {
    return this.address(ip);
  }

  private address(ip: string): Address {
    let address = this.addresses.get(ip);
    if (address === undefined) {
      if (this.addresses.size >= REMEMBERED) this.addresses = new Map();
      address = { ip, network: this.networks.intern(networkOf(ip)), geo: this.geo?.lookup(ip) };
      this.addresses.set(ip, address);
    }
    return address;
  }

  private toWindowEvent(event: RequestEvent): WindowEvent {
    const { ip, network, geo } = this.address(event.ip);
    // Every event has the same fields (country and geo may be undefined): the rules' reads stay monomorphic.
    return {
      eventId: event.eventId,
      timestamp: event.timestamp,
      ip,
      network,
      userAgent: this.userAgents.intern(event.userAgent),
      method: event.method,
      path: event.path,
      status: event.status,
      responseTimeMs: event.responseTimeMs,
      rateLimitPerMinute: carriedLimit(event),
      country: event.country ?? geo?.country,
      geo,
    };
  }
}

/**
 * The limit an event carried (RateLimit-Limit), or 0 when it carried none: velocity_attack then
 * judges its minute against its defaultLimitPerMinute parameter, the plan's default (60) unless an
 * operator overrides it for the plan or the merchant (a fleet that sends no RateLimit-Limit for
 * keys whose limit is higher). Storage keeps the difference (0 in request_events.rate_limit_per_minute),
 * so events warmed after a restart are judged as the live ones were.
 */
function carriedLimit(event: RequestEvent): number {
  return event.rateLimitPerMinute ?? 0;
}
