/**
 * Credential stuffing across keys: one network (/24, /64) answered 401 for many distinct keys within
 * a few minutes, someone trying a list of stolen or guessed keys from one place. Every rule judges
 * one key's window, where such a spray is a failure or two per key, far below any key's own bar;
 * this tally follows the 401s of every network across all the keys this replica owns (Kafka
 * partitions by key, so a replica sees its share of a spray: with R replicas, about 1/R of the keys).
 *
 * A key counts only when most of its requests from the network failed (its own window says, read
 * when the network has enough keys to report): an integration platform calling for many merchants
 * from one egress, a few of its calls failing, is not a spray.
 * It reports to each merchant whose keys were among them, as a high_failure_rate alert about the
 * network (scope "network:<cidr>", no apiKeyId: no one key is at fault, nor is any to be throttled),
 * with this merchant's keys and events only: of other merchants' keys, the count alone. (Two
 * replicas that see one spray at once may each open an alert for it, before they read each other's:
 * the earlier is then resolved as a duplicate, AlertManager.sync.)
 * Medium from minKeys (20) keys in windowMinutes (10), high from highKeys (100). A network is judged
 * when a batch brings it 401s, at most once per REPORT_EVERY_MS unless its severity rises (what came
 * meanwhile is judged by the first batch after that), and reported to the merchants with failures
 * since its last report.
 *
 * The engine adds the events it warms after a start or a rebalance as well (those of the last
 * SPRAY_WINDOW_MS before the partition's newest), so a spray that straddles one is judged whole by the
 * first batch after it; the keys of a partition the replica loses leave the tally (keepPartitions).
 *
 * Across replicas: the replica that owns partition 0 also holds the keys of the other partitions
 * that failed from a network that failed for many keys, as storage has their requests
 * (EventStore.sprayedRequestsElsewhere, read every SPRAY_ACROSS_REPLICAS_MS: spray-across-replicas.ts),
 * so a spray spread thin over R replicas is judged whole there (takeElsewhere). Such a key is judged
 * by whether most of its requests from the network failed, those the allowlists cover left out
 * (sprayedKeysOf); each reading replaces the last, and the key's own events, should its partition
 * come to this replica, replace it.
 *
 * Memory: at most MAX_ENTRIES (network, key) pairs, and MAX_KEYS_PER_NETWORK keys of its own a
 * network and as many of storage's (the networks that began failing longest ago go first); pairs
 * leave as the window passes them, every network's at least once a minute.
 */
import type { RequestEvent } from '../events/request-event.ts';
import type { EngineFinding } from './engine.ts';
import type { Severity, WindowEvent } from './types.ts';

/** Not yet parameters per plan or merchant, as the rules' are. */
const PARAMS = { windowMinutes: 10, minKeys: 20, highKeys: 100 } as const;
type SprayParams = typeof PARAMS;

const MINUTE = 60_000;
/** How far back a network's 401s count: the events a warm-up hands over count from this long before its newest. */
export const SPRAY_WINDOW_MS = PARAMS.windowMinutes * MINUTE;
/** A network reported is reported again at most this often while its severity stays the same. */
export const REPORT_EVERY_MS = MINUTE;
/** The fewest keys a network must fail for to be reported; storage's reading of other replicas' keys reads only such networks. */
export const SPRAY_MIN_KEYS = PARAMS.minKeys;
const MAX_ENTRIES = 200_000;
/** The most keys of its own a network holds (and as many of storage's). */
export const MAX_KEYS_PER_NETWORK = 5_000;
const MAX_LISTED = 20;
const MAX_SAMPLES = 10;

/** One key's 401s from a network. */
export interface SprayedKey {
  merchantId: string;
  apiKeyId: string;
  /** The Kafka partition of the key's events (-1 for HTTP): a replica that no longer owns it drops the key (keepPartitions). */
  partition: number;
  /** Whether most of its requests from the network failed, as its window said when the memory budget forgot it (keepVerdict), or as storage says (elsewhere). */
  failedMostly?: boolean;
  /** A key of a partition another replica owns, as storage had it at the last reading (takeElsewhere). */
  elsewhere?: true;
  failures: number;
  first: number;
  newest: number;
  /** The key's newest failed event from the network (a sample for its merchant's evidence), its address, user agent and country. */
  newestEventId: string;
  ip: string;
  userAgent: string;
  country: string | undefined;
}

interface NetworkSpray {
  network: string;
  /** By apiKeyId; by merchant and key for a key id another merchant's key has too (rare). */
  keys: Map<string, SprayedKey>;
  /** How many of `keys` are storage's (takeElsewhere): they do not count against the keys of its own a network may hold. */
  keysElsewhere: number;
  reportedAt: number;
  reportedSeverity: Severity | undefined;
  /**
   * Per merchant reported to, the newest 401 of its keys and the severity in its last report: it is
   * reported to again for a newer 401 or a higher severity. (Not "failures since the network's last
   * report": a key's 401 may be dated ahead of the others', and the reading of other replicas' keys
   * is judged ahead of this replica's own batches.) Dropped once the window has passed that 401.
   */
  reportedTo: Map<string, { newest: number; severity: Severity }>;
  /** When its keys were last read one by one (failedMostly), and the severity their count allowed then. */
  checkedAt: number;
  checkedBound: Severity | undefined;
}

/** A key of another replica's partition that failed from `network`, as storage has its requests (sprayedKeysOf). */
export interface SprayedKeyElsewhere extends Omit<SprayedKey, 'failedMostly' | 'elsewhere'> {
  network: string;
  failedMostly: boolean;
}

/** A key's requests from one address and user agent of a network (EventStore.sprayedRequestsElsewhere). */
export interface SprayedRequests {
  network: string;
  merchantId: string;
  apiKeyId: string;
  partition: number;
  ip: string;
  userAgent: string;
  /** Its 401s, and the requests a failure share counts (all but 403, 429 and 5xx, as the engine's failedFrom). */
  failures: number;
  judged: number;
  /** The first and the newest 401 (0 without one), and the newest's eventId and country. */
  first: number;
  newest: number;
  newestEventId: string;
  country: string | undefined;
}

/**
 * The keys of storage's requests, one per network: their 401s and whether most of their requests
 * from the network failed, the requests `allowlisted` says (an address, a network, a user agent, the
 * key) left out as admission leaves them out of the windows, and a key whose 401s are dated after
 * `notAfter` (a producer's clock far ahead) left out as well. The newest 401 is the key's sample.
 */
export function sprayedKeysOf(requests: readonly SprayedRequests[], allowlisted: (requests: SprayedRequests) => boolean, notAfter: number): SprayedKeyElsewhere[] {
  const keys = new Map<string, SprayedKeyElsewhere & { judged: number }>();
  for (const request of requests) {
    if (allowlisted(request)) continue;
    const { network, merchantId, apiKeyId, partition } = request;
    const ref = `${network}\u0000${merchantId}\u0000${apiKeyId}`;
    let key = keys.get(ref);
    if (key === undefined) {
      key = { network, merchantId, apiKeyId, partition, failures: 0, judged: 0, first: Infinity, newest: -Infinity, newestEventId: '', ip: request.ip, userAgent: request.userAgent, country: undefined, failedMostly: false };
      keys.set(ref, key);
    }
    key.failures += request.failures;
    key.judged += request.judged;
    if (request.failures === 0) continue;
    key.first = Math.min(key.first, request.first);
    if (request.newest > key.newest) {
      key.newest = request.newest;
      key.newestEventId = request.newestEventId;
      key.ip = request.ip;
      key.userAgent = request.userAgent;
      key.country = request.country;
    }
  }
  const held: SprayedKeyElsewhere[] = [];
  for (const { judged, ...key } of keys.values()) {
    if (key.failures === 0 || key.newest > notAfter) continue;
    held.push({ ...key, failedMostly: key.failures * 2 >= judged });
  }
  return held;
}

const SEVERITY_RANK: Record<Severity, number> = { low: 0, medium: 1, high: 2, critical: 3 };

export class SourceSpray {
  /** In the order of their first 401 in the window: the first is the one that began failing longest ago. */
  private readonly networks = new Map<string, NetworkSpray>();
  private readonly touched = new Set<NetworkSpray>();
  /** Networks with failures their last report did not include (it was too recent): judged again once due, by any batch. */
  private readonly unreported = new Set<NetworkSpray>();
  private entries = 0;
  private sweptAt = -Infinity;
  /** The networks holding keys from storage (takeElsewhere), so that the next reading finds them to replace. */
  private readonly withElsewhere = new Set<NetworkSpray>();

  /** The (network, key) pairs held. */
  get size(): number {
    return this.entries;
  }

  /** Counts a 401 (other statuses are ignored) of a key whose events arrive on `partition`; its network is judged by the next judge(). */
  add(event: RequestEvent, windowEvent: WindowEvent, partition: number): void {
    if (windowEvent.status !== 401) return;
    const { network } = windowEvent;
    let spray = this.networks.get(network);
    if (spray === undefined) {
      spray = newNetworkSpray(network);
      this.networks.set(network, spray);
    }
    const { merchantId, apiKeyId } = event;
    const { ref, key } = heldKey(spray.keys, merchantId, apiKeyId);
    const { timestamp, eventId, ip, userAgent, country } = windowEvent;
    if (key?.elsewhere) {
      // The key's partition came to this replica: its own events count from now on (its warm-up brings the earlier ones).
      spray.keys.set(ref, { merchantId, apiKeyId, partition, failures: 1, first: timestamp, newest: timestamp, newestEventId: eventId, ip, userAgent, country });
      spray.keysElsewhere--;
    } else if (key !== undefined) {
      key.failures++;
      key.partition = partition;
      if (timestamp < key.first) key.first = timestamp;
      if (timestamp >= key.newest) {
        key.newest = timestamp;
        key.newestEventId = eventId;
        key.ip = ip;
        key.userAgent = userAgent;
        key.country = country;
      }
    } else if (spray.keys.size - spray.keysElsewhere < MAX_KEYS_PER_NETWORK) {
      spray.keys.set(ref, { merchantId, apiKeyId, partition, failures: 1, first: timestamp, newest: timestamp, newestEventId: eventId, ip, userAgent, country });
      if (++this.entries > MAX_ENTRIES) this.dropOldest(spray);
    }
    this.touched.add(spray);
  }

  /**
   * Judges the networks that got 401s since the last call, as of `now`; a finding per merchant to
   * report to. `failedMostly` tells whether most of a key's requests from the network since a time
   * failed (401), from the key's own window.
   */
  judge(now: number, failedMostly: (key: SprayedKey, network: string, since: number) => boolean): EngineFinding[] {
    const params = PARAMS;
    const since = now - params.windowMinutes * MINUTE;
    if (now - this.sweptAt >= MINUTE) this.sweep(since, now);
    for (const spray of this.unreported) if (now - spray.checkedAt >= REPORT_EVERY_MS) this.touched.add(spray);
    if (this.touched.size === 0) return [];
    const findings: EngineFinding[] = [];
    for (const spray of this.touched) {
      this.unreported.delete(spray);
      if (!this.prune(spray, since)) continue;
      // The keys with a 401 bound the severity from above: most networks stop here, at no cost. A
      // network is checked key by key (their windows read) at most once per REPORT_EVERY_MS unless
      // that bound rose: an integration platform whose many keys fail now and then is not read on
      // every batch. What it skips is checked by the first batch after that (unreported).
      const bound = severityOf(spray.keys.size, params);
      if (bound === undefined) continue;
      if (now - spray.checkedAt < REPORT_EVERY_MS && !above(bound, spray.checkedBound)) {
        this.unreported.add(spray);
        continue;
      }
      spray.checkedAt = now;
      spray.checkedBound = bound;
      const failing = [...spray.keys.values()].filter((key) => (key.elsewhere ? key.failedMostly : failedMostly(key, spray.network, since)));
      const severity = severityOf(failing.length, params);
      if (severity === undefined) continue;
      if (now - spray.reportedAt < REPORT_EVERY_MS && !above(severity, spray.reportedSeverity)) {
        this.unreported.add(spray);
        continue;
      }
      findings.push(...this.report(spray, failing, severity, params));
      spray.reportedAt = now;
      spray.reportedSeverity = severity;
    }
    this.touched.clear();
    return findings;
  }

  /** Drops the network's keys whose last 401 is before `since`, and the network once it has none; whether it has any left. */
  private prune(spray: NetworkSpray, since: number): boolean {
    for (const [ref, key] of spray.keys) {
      if (key.newest >= since) continue;
      spray.keys.delete(ref);
      this.entries--;
      if (key.elsewhere) spray.keysElsewhere--;
    }
    for (const [merchantId, reported] of spray.reportedTo) if (reported.newest < since) spray.reportedTo.delete(merchantId);
    if (spray.keys.size > 0) return true;
    this.forgetNetwork(spray);
    return false;
  }

  private forgetNetwork(spray: NetworkSpray): void {
    if (this.networks.get(spray.network) === spray) this.networks.delete(spray.network);
    this.touched.delete(spray);
    this.unreported.delete(spray);
    this.withElsewhere.delete(spray);
  }

  /** Records whether most of a key's requests from a network failed, as its window says before the engine forgets it. */
  keepVerdict(network: string, merchantId: string, apiKeyId: string, failedMostly: boolean): void {
    const keys = this.networks.get(network)?.keys;
    const key = keys && heldKey(keys, merchantId, apiKeyId).key;
    if (key !== undefined && !key.elsewhere) key.failedMostly = failedMostly;
  }

  /**
   * Replaces the keys of other replicas' partitions with storage's latest reading of them (the
   * reading of none, when this replica no longer reads them); the networks they are on are judged by
   * the next judge(). A key this replica holds of its own is left as it is.
   */
  takeElsewhere(keys: readonly SprayedKeyElsewhere[]): void {
    // The networks stay until the new reading is in, so that one it still names keeps when it was last reported.
    const previous = [...this.withElsewhere].filter((spray) => this.networks.get(spray.network) === spray);
    this.withElsewhere.clear();
    for (const spray of previous) {
      for (const [ref, key] of spray.keys) {
        if (!key.elsewhere) continue;
        spray.keys.delete(ref);
        this.entries--;
      }
      spray.keysElsewhere = 0;
    }
    for (const { network, ...held } of keys) {
      let spray = this.networks.get(network);
      if (spray === undefined) {
        spray = newNetworkSpray(network);
        this.networks.set(network, spray);
      }
      const { ref, key } = heldKey(spray.keys, held.merchantId, held.apiKeyId);
      if (key !== undefined || spray.keysElsewhere >= MAX_KEYS_PER_NETWORK) continue;
      spray.keys.set(ref, { ...held, elsewhere: true });
      spray.keysElsewhere++;
      this.withElsewhere.add(spray);
      this.touched.add(spray);
      if (++this.entries > MAX_ENTRIES) this.dropOldest(spray);
    }
    for (const spray of previous) if (spray.keys.size === 0) this.forgetNetwork(spray);
  }

  /**
   * Drops the keys of partitions this replica no longer owns (HTTP's stay): their new owner warms
   * and judges them. Kept, they would be counted twice when the partition comes back and is warmed
   * again, and judged as failing mostly once their windows are gone.
   */
  keepPartitions(owned: ReadonlySet<number>): void {
    for (const spray of this.networks.values()) {
      for (const [ref, key] of spray.keys) {
        if (key.elsewhere || key.partition < 0 || owned.has(key.partition)) continue;
        spray.keys.delete(ref);
        this.entries--;
      }
      if (spray.keys.size === 0) this.forgetNetwork(spray);
    }
  }

  /** Prunes every network (those no batch touches any more too). */
  private sweep(since: number, now: number): void {
    this.sweptAt = now;
    for (const spray of this.networks.values()) this.prune(spray, since);
  }

  /** Over MAX_ENTRIES: the networks that failed longest ago go, never `keep` (the one being added to). */
  private dropOldest(keep: NetworkSpray): void {
    for (const spray of this.networks.values()) {
      if (this.entries <= MAX_ENTRIES) return;
      if (spray === keep) continue;
      this.forgetNetwork(spray);
      this.entries -= spray.keys.size;
    }
  }

  /** A finding for each merchant with keys among `failing` that failed since its last report or whose severity rose (NetworkSpray.reportedTo). */
  private report(spray: NetworkSpray, failing: readonly SprayedKey[], severity: Severity, params: SprayParams): EngineFinding[] {
    const byMerchant = new Map<string, SprayedKey[]>();
    let failures = 0;
    for (const key of failing) {
      failures += key.failures;
      const keys = byMerchant.get(key.merchantId);
      if (keys) keys.push(key);
      else byMerchant.set(key.merchantId, [key]);
    }
    const allKeys = failing.length;
    // The attacker's addresses, user agents and countries (each key's newest failure's): the same for every merchant.
    const ips = distinct(failing, (key) => key.ip);
    const userAgents = distinct(failing, (key) => key.userAgent);
    const countries = distinct(failing, (key) => key.country);
    const confidence = Math.min(1, Math.log(allKeys / params.minKeys) / Math.log((params.highKeys * 5) / params.minKeys));
    const findings: EngineFinding[] = [];
    for (const [merchantId, keys] of byMerchant) {
      keys.sort((a, b) => b.newest - a.newest);
      const reported = spray.reportedTo.get(merchantId);
      if (reported && keys[0]!.newest <= reported.newest && !above(severity, reported.severity)) continue;
      spray.reportedTo.set(merchantId, { newest: Math.max(keys[0]!.newest, reported?.newest ?? -Infinity), severity });
      const listed = keys.slice(0, MAX_LISTED).map((key) => key.apiKeyId);
      const theirFailures = keys.reduce((sum, key) => sum + key.failures, 0);
      const firstSeenAt = Math.min(...keys.map((key) => key.first));
      const lastSeenAt = keys[0]!.newest;
      const yours = keys.length === 1 ? `1 of yours (${listed[0]})` : `${keys.length} of yours (${listed.slice(0, 3).join(', ')}${keys.length > 3 ? ', ...' : ''})`;
      findings.push({
        merchantId,
        ruleId: 'high_failure_rate',
        finding: {
          scope: `network:${spray.network}`,
          apiKeyId: null,
          severity,
          confidence: Math.max(0, confidence),
          title: `Credential stuffing from ${spray.network}: 401 for ${allKeys} API keys in ${params.windowMinutes} min, ${keys.length} of them yours`,
          summary:
            `One network (${spray.network}, ${addresses(ips.length)}) failed authentication with ${allKeys} distinct API keys ` +
            `in ${params.windowMinutes} minutes (at least ${params.minKeys} make an alert), ${yours}: someone is trying a list of keys. ` +
            'Check that those keys\' secrets have not leaked (rotate them if in doubt), and block the network at your edge if it is not yours.',
          evidence: {
            judgedBy: 'network_across_keys',
            network: spray.network,
            ips,
            userAgents,
            countries,
            distinctKeys: allKeys,
            minKeys: params.minKeys,
            highKeys: params.highKeys,
            authFailures: failures,
            merchantKeys: listed,
            merchantKeyCount: keys.length,
            merchantAuthFailures: theirFailures,
            windowMinutes: params.windowMinutes,
            windowMs: params.windowMinutes * MINUTE,
            sampleEventIds: keys.slice(0, MAX_SAMPLES).map((key) => key.newestEventId),
          },
          firstSeenAt,
          lastSeenAt,
        },
      });
    }
    return findings;
  }
}

function newNetworkSpray(network: string): NetworkSpray {
  return { network, keys: new Map(), keysElsewhere: 0, reportedAt: -Infinity, reportedSeverity: undefined, reportedTo: new Map(), checkedAt: -Infinity, checkedBound: undefined };
}

/**
 * A key's entry among a network's keys (see NetworkSpray.keys), and the ref it is or would be held
 * by: by its id, or by merchant and id when another merchant's key of that id is (or was, while this
 * one came: it stays where it is held) held by the id.
 */
function heldKey(keys: ReadonlyMap<string, SprayedKey>, merchantId: string, apiKeyId: string): { ref: string; key: SprayedKey | undefined } {
  const key = keys.get(apiKeyId);
  if (key?.merchantId === merchantId) return { ref: apiKeyId, key };
  const ref = `${merchantId}\u0000${apiKeyId}`;
  const shared = keys.get(ref);
  return shared !== undefined || key !== undefined ? { ref, key: shared } : { ref: apiKeyId, key: undefined };
}

function above(severity: Severity, than: Severity | undefined): boolean {
  return than === undefined || SEVERITY_RANK[severity] > SEVERITY_RANK[than];
}

function severityOf(keys: number, params: SprayParams): Severity | undefined {
  if (keys >= params.highKeys) return 'high';
  if (keys >= params.minKeys) return 'medium';
  return undefined;
}

/** The first MAX_LISTED distinct values the keys have. */
function distinct(keys: readonly SprayedKey[], valueOf: (key: SprayedKey) => string | undefined): string[] {
  const values = new Set<string>();
  for (const key of keys) {
    const value = valueOf(key);
    if (value !== undefined) values.add(value);
    if (values.size >= MAX_LISTED) break;
  }
  return [...values];
}

function addresses(count: number): string {
  if (count >= MAX_LISTED) return `${MAX_LISTED} or more addresses`;
  return count === 1 ? '1 address' : `${count} addresses`;
}
