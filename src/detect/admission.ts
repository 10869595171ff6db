/**
 * The engine's first step: which events detection looks at, and what it knows about them. An event
 * is admitted when its plan is entitled and no allowlist covers its key, address, network or user
 * agent; it then becomes a WindowEvent, with its network, geolocation and rate limit filled in.
 * Stateless apart from the GeoIP lookup's cache.
 */
import { DEFAULT_RATE_LIMIT_PER_MINUTE, type RequestEvent } from '../events/request-event.ts';
import { networkOf } from '../../rules/network.ts';
import type { DetectionConfig } from './detection-config.ts';
import type { GeoLookup } from './geo.ts';
import type { WindowEvent } from './types.ts';

/** The admitted events of a batch and their window events, index for index. */
export interface AdmittedBatch {
  events: RequestEvent[];
  windowEvents: WindowEvent[];
}

/** Addresses whose network is remembered: clients repeat their addresses. */
const NETWORKS_REMEMBERED = 50_000;

export class Admission {
  private readonly entitled: Set<string>;
  /** Address -> its network, as one string per network: rules compare networks event to event, and equal pointers compare at once. */
  private networks = new Map<string, string>();
  private networkStrings = new Map<string, string>();

  constructor(
    entitledPlans: readonly string[],
    private readonly config: () => DetectionConfig,
    private readonly geo?: GeoLookup,
  ) {
    this.entitled = new Set(entitledPlans);
  }

  admit(events: readonly RequestEvent[]): AdmittedBatch {
    const config = this.config();
    const batch: AdmittedBatch = { events: [], windowEvents: [] };
    for (const event of events) {
      if (!this.entitled.has(event.plan)) continue;
      if (config.isAllowlisted(event.merchantId, event.apiKeyId, event.ip, event.userAgent)) continue;
      batch.events.push(event);
      batch.windowEvents.push(this.toWindowEvent(event));
    }
    return batch;
  }

  private networkOf(ip: string): string {
    let network = this.networks.get(ip);
    if (network === undefined) {
      if (this.networks.size >= NETWORKS_REMEMBERED) {
        this.networks = new Map();
        this.networkStrings = new Map();
      }
      network = networkOf(ip);
      const known = this.networkStrings.get(network);
      if (known === undefined) this.networkStrings.set(network, network);
      else network = known;
      this.networks.set(ip, network);
    }
    return network;
  }

  private toWindowEvent(event: RequestEvent): WindowEvent {
    const geo = this.geo?.lookup(event.ip);
    // Every event has the same fields (country and geo may be undefined): the rules' reads stay monomorphic.
    return {
      eventId: event.eventId,
      timestamp: event.timestamp,
      ip: event.ip,
      network: this.networkOf(event.ip),
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
}
