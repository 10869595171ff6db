/**
 * The contract between the detection engine (src/detect) and the rule modules (rules/).
 * A rule is pure: it receives one key's window of recent events, its parameters and the current
 * time, and returns findings. It does no I/O and keeps no state between calls; the engine owns the
 * windows, geolocation, allowlists, deduplication into alerts, severity-to-risk mapping and storage.
 * A rule may also have a screen: running tallies of a key's window that the engine keeps for it,
 * and a cheap test on them that spares evaluating a window that cannot produce a finding.
 */
import type { Plan } from '../events/request-event.ts';

export const ANOMALY_TYPES = ['velocity_attack', 'impossible_travel', 'high_failure_rate', 'bot_traffic', 'credential_sharing'] as const;
export type AnomalyType = (typeof ANOMALY_TYPES)[number];

export const SEVERITIES = ['low', 'medium', 'high', 'critical'] as const;
export type Severity = (typeof SEVERITIES)[number];

export const ACTIONS = ['monitor', 'rate_limit', 'investigate', 'block'] as const;
/** The actions that act on the key: enforcement throttles (rate_limit) or blocks it. */
export const KEY_ACTIONS: ReadonlySet<string> = new Set(['rate_limit', 'block']);

/** evidence.judgedBy of credential stuffing: a network judged across keys (src/detect/source-spray.ts), not one key's window. */
export const JUDGED_ACROSS_KEYS = 'network_across_keys';
/**
 * evidence.judgedFrom of credential stuffing: the keys of the replica's own partitions (its own
 * tally), or of every partition (its reading of storage, by the owner of partition 0).
 */
export const SPRAY_JUDGED_FROM = ['own_partitions', 'all_partitions'] as const;
export type SprayJudgedFrom = (typeof SPRAY_JUDGED_FROM)[number];
export type RecommendedAction = (typeof ACTIONS)[number];

/** Where an IP is, as far as the GeoIP database knows. */
export interface GeoPoint {
  latitude: number;
  longitude: number;
  /** Radius of uncertainty in km (City databases give one; default 50 when absent). */
  accuracyKm: number;
  country?: string;
  city?: string;
  /** The autonomous system announcing the address (its network operator), when an ASN database is configured (GEOIP_ASN_DB). */
  asn?: number;
  asOrganization?: string;
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
  /**
   * Limit in force for the key (RateLimit-Limit), or 0 when the event carried none or the plan's
   * default (admission.ts): velocity_attack then uses its defaultLimitPerMinute parameter.
   */
  rateLimitPerMinute: number;
  /** ISO 3166-1 alpha-2: from the edge when it sent one, else from geo, else undefined. */
  country?: string;
  /** Undefined when the IP is private, reserved or unknown to the database. */
  geo?: GeoPoint;
}

/**
 * What the engine remembers of a key beyond its window: the networks it was seen from and the places
 * it was seen at over the last days (7), with the first time of each (and, for a place, when it
 * became established). "Before the window" is the
 * key's own habit (a daily job from five regions, a site idle for hours); inside the window, rules
 * judge the events themselves.
 */
/**
 * A key's memory of the last days. Only what is vouched for counts (key-history.ts): a place seen
 * within half an hour of one of the key's own places (a hop impossible_travel judged), or the key's
 * first; a network while its place is. What a thief does while the key is idle is not.
 */
export interface KeyHistoryView {
  /** Whether the key was seen from this network before `before` (epoch ms), within the remembered days, and it was vouched for by then. */
  knowsNetwork(network: string, before: number): boolean;
  /** The points (exact coordinates) the key was seen at before `before`, within the remembered days, vouched for by then. */
  placesBefore(before: number): GeoPoint[];
  /**
   * The points the key was established at before `before`: vouched for, and seen there again,
   * before `before`, at least half an hour after it was first seen there (over half an hour of use,
   * or on two days; ESTABLISHED_MS in key-history.ts), or within half an hour of another of its places.
   * A single request (a thief's while the key was idle) is not.
   */
  establishedPlacesBefore(before: number): GeoPoint[];
  /** The earliest time the key was seen since it was last idle for the remembered days (7), however many sightings it let go since; Infinity when it remembers nothing. */
  readonly firstSeen: number;
}

/** The recent history of one API key, oldest event first. */
export interface KeyWindow {
  merchantId: string;
  apiKeyId: string;
  plan: Plan;
  /** Events within the engine's window (the longest windowMs of any rule), oldest first. */
  events: readonly WindowEvent[];
  /** The key's longer memory; undefined where there is none (a fixture without one, a unit test). */
  history?: KeyHistoryView;
  /**
   * The newest time of an event the engine's per-key cap dropped from the window (a key sending more
   * than the cap holds); undefined when none was. Minutes up to it hold only part of their events.
   */
  cappedAt?: number;
  /** What the per-key cap dropped, minute by minute; undefined when it dropped nothing. */
  dropped?: DroppedRequests;
}

/**
 * The requests the engine's per-key cap dropped from a key's window (a key sending more than the cap
 * holds), per UTC clock minute (minutes since the epoch), for at least the latest 16 minutes it dropped any
 * of: what a rule counting requests per minute adds to the window's own, which holds only the newest
 * of them. A minute it dropped none of, or one too long ago, counts 0 (its times are NaN).
 */
export interface DroppedRequests {
  /** The minute's requests dropped. */
  count(minute: number): number;
  /** How many of them the API answered 5xx. */
  serverErrors(minute: number): number;
  /** The highest rateLimitPerMinute that those not answered 5xx carried (0 when none carried one). */
  highestLimit(minute: number): number;
  /** The time of the earliest and of the latest of those not answered 5xx (NaN when none was). */
  earliest(minute: number): number;
  latest(minute: number): number;
  /**
   * At least how many of the requests dropped between `from` and `to` (epoch ms) the API did not
   * answer 5xx: those of the 10-second steps wholly within (the cap's record is kept by step).
   */
  answeredBetween(from: number, to: number): number;
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
  /**
   * Set by the engine, never by a rule: when some of the key's requests in the window were answered
   * 401, the severity the finding has on the other requests alone, or null when those alone make no
   * finding. A 401 names a key without its secret, and anyone who knows the key's public id can send
   * one, so the alert recommends throttling or blocking the key only as far as the requests that
   * passed authentication go (alert-manager.ts, recommendedActionFor). Undefined: no 401 in the window.
   */
  keyHolderSeverity?: Severity | null;
  /**
   * Set with a keyHolderSeverity that is a severity: the end of the holders' own finding (epoch ms),
   * which the later 401s in the window do not move. What keeps a throttle or block going (Alert.actionSeenAt).
   */
  keyHolderLastSeenAt?: number;
}

/**
 * Spares the engine most evaluations: instead of reading a key's whole window on every batch, a
 * rule keeps running tallies of it (counts per minute, distinct networks with their newest time,
 * ...), and says from them whether evaluate could find anything. The engine makes one tally per key
 * and rule, adds every event that enters the key's window and removes every event that leaves it
 * (usually the window's oldest; for the busiest keys, also events thinned out of their history, see
 * detailMs), and calls evaluate only when mayFire says yes. A thinned event is never the newest of
 * its network or place in its minute, yet may be the newest of another value a tally keeps a time
 * for: such a time may then stay later than the window's, which only makes mayFire say yes more often.
 * mayFire must be conservative: it returns false only when evaluate(window, params, now) would
 * return no finding for that same window; when in doubt it returns true. The rule stays pure: add
 * and remove change only the tally, mayFire changes nothing, none does I/O or reads the clock.
 */
export interface RuleScreen<P, T> {
  /** The tally of an empty window. */
  create(): T;
  /**
   * An event enters the window (events arrive nearly, not always, in time order). A tally that counts
   * its entries (see entries) returns how many the event added: 1 when it brought a value the tally
   * did not hold; else 0, or nothing.
   */
  add(tally: T, event: WindowEvent): number | void;
  /** An event leaves the window (usually its oldest); returns how many entries it took away (1 when its value's last event left), as add does. */
  remove(tally: T, event: WindowEvent): number | void;
  /** False only when evaluate would find nothing; history and dropped are the window's (KeyWindow.history, KeyWindow.dropped). */
  mayFire(tally: T, params: P, now: number, history?: KeyHistoryView, dropped?: DroppedRequests): boolean;
  /**
   * How many distinct values (networks, places, paths, ...) the tally holds, for a tally that keeps
   * one entry per value: each weighs about as much as a window event, and a key flooded from new
   * values holds about one per event, so the engine counts them against its memory budget. The
   * engine keeps that count from what add and remove return; rules.test.ts checks they agree with this.
   */
  entries?(tally: T): number;
}

export interface RuleDefinition<P extends Record<string, number | string | boolean | readonly string[]> = Record<string, number>, T = unknown> {
  /** Stable id; equals the anomaly type and the file name (rules/<id>.ts). */
  id: AnomalyType;
  version: string;
  title: string;
  description: string;
  /** How much history the rule needs, in ms. */
  windowMs: number;
  /**
   * How far back from the key's newest event the rule reads every single event (default windowMs).
   * When a key is busier than its window can hold, the engine thins what is older (EventWindow.thin):
   * of each network and place in each minute, only the first and the last event stay. Every network
   * and place is still there, minute by minute; not every request.
   */
  detailMs?: number;
  /** Tunable parameters with their defaults; the engine merges plan and merchant overrides on top. */
  defaults: P;
  /** Defaults of a plan that differ from `defaults` (the spec's enterprise limits are custom); the configuration's overrides go on top. */
  planDefaults?: Partial<Record<Plan, Partial<P>>>;
  /** The recommended action for each severity. */
  actions: Record<Severity, RecommendedAction>;
  /** Known benign look-alikes and how the rule avoids them. */
  falsePositives: readonly string[];
  /** Pure: no I/O, no state, no Date.now() (use `now`). */
  evaluate(window: KeyWindow, params: P, now: number): Finding[];
  /**
   * Whether, under these parameters, the rule needs the limit events carry (WindowEvent.rateLimitPerMinute)
   * to judge them: velocity_attack with no default limit (enterprise's by default) leaves a minute
   * none of whose events carries one unjudged. The engine counts the events that carry none, but for
   * those answered 5xx, which a limit does not count (EngineLoad.eventsWithoutLimit), so that an
   * operator whose fleet sends no limit learns that the rule is blind to those keys.
   */
  needsLimit?(params: P): boolean;
  /**
   * Optional, but every rule of rules/ has one: without a screen, evaluate reads the key's window
   * on every batch that touches the key, which is too slow at production volumes.
   */
  screen?: RuleScreen<P, T>;
}
