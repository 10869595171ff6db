/**
 * The contract between the detection engine (src/detect) and the rule modules (rules/).
 * A rule is pure: it receives one key's window of recent events, its parameters and the current
 * time, and returns findings. It does no I/O and keeps no state between calls; the engine owns the
 * windows, geolocation, allowlists, deduplication into alerts, severity-to-risk mapping and storage.
 */
import type { Plan } from '../events/request-event.ts';

export const ANOMALY_TYPES = ['velocity_attack', 'impossible_travel', 'high_failure_rate', 'bot_traffic', 'credential_sharing'] as const;
export type AnomalyType = (typeof ANOMALY_TYPES)[number];

export const SEVERITIES = ['low', 'medium', 'high', 'critical'] as const;
export type Severity = (typeof SEVERITIES)[number];

export const ACTIONS = ['monitor', 'rate_limit', 'investigate', 'block'] as const;
export type RecommendedAction = (typeof ACTIONS)[number];

/** Where an IP is, as far as the GeoIP database knows. */
export interface GeoPoint {
  latitude: number;
  longitude: number;
  /** Radius of uncertainty in km (City databases give one; default 50 when absent). */
  accuracyKm: number;
  country?: string;
  city?: string;
}

/** One request event as a rule sees it: validated, deduplicated by eventId, enriched. */
export interface WindowEvent {
  eventId: string;
  /** Epoch ms. */
  timestamp: number;
  ip: string;
  /** The client's network: the /24 for IPv4 ("203.0.113.0/24"), the /64 for IPv6. */
  network: string;
  userAgent: string;
  method: string;
  path: string;
  status: number;
  responseTimeMs: number;
  /** Limit in force for the key (RateLimit-Limit), or the plan's default. */
  rateLimitPerMinute: number;
  /** ISO 3166-1 alpha-2: from the edge when it sent one, else from geo, else undefined. */
  country?: string;
  /** Undefined when the IP is private, reserved or unknown to the database. */
  geo?: GeoPoint;
}

/** The recent history of one API key, oldest event first. */
export interface KeyWindow {
  merchantId: string;
  apiKeyId: string;
  plan: Plan;
  /** Events within the engine's window (the longest windowMs of any rule), oldest first. */
  events: readonly WindowEvent[];
}

/** What a rule reports. The engine turns findings into deduplicated alerts. */
export interface Finding {
  /**
   * Deduplication scope within (merchant, rule type): usually the apiKeyId; "ip:<addr>" for a
   * finding about one address. One open alert exists per (merchantId, type, scope).
   */
  scope: string;
  /** Null when the finding is about an IP alone. */
  apiKeyId: string | null;
  severity: Severity;
  /** 0..1: how sure the rule is and how large the excess is; places riskScore within the severity band. */
  confidence: number;
  /** One line for a list, e.g. "Velocity attack on pk_live_abc: 840 requests/min (limit 60)". */
  title: string;
  /** A sentence a person can act on: what happened, against what threshold, what to do. */
  summary: string;
  /**
   * What was observed against what threshold or baseline, the window, distinct values (IPs, networks,
   * countries, user agents), for travel both points with distance, gap and speed, and sampleEventIds.
   */
  evidence: Record<string, unknown> & { sampleEventIds: string[]; windowMs: number };
  /** Epoch ms span of the evidence. */
  firstSeenAt: number;
  lastSeenAt: number;
}

export interface RuleDefinition<P extends Record<string, number | string | boolean | readonly string[]> = Record<string, number>> {
  /** Stable id; equals the anomaly type and the file name (rules/<id>.ts). */
  id: AnomalyType;
  version: string;
  title: string;
  description: string;
  /** How much history the rule needs, in ms. */
  windowMs: number;
  /** Tunable parameters with their defaults; the engine merges plan and merchant overrides on top. */
  defaults: P;
  /** The recommended action for each severity. */
  actions: Record<Severity, RecommendedAction>;
  /** Known benign look-alikes and how the rule avoids them. */
  falsePositives: readonly string[];
  /** Pure: no I/O, no state, no Date.now() (use `now`). */
  evaluate(window: KeyWindow, params: P, now: number): Finding[];
}
