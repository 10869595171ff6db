/**
 * Credential stuffing across keys: one network (an IPv4 /24, an IPv6 /48: sprayNetworkOf) answered 401 for many distinct keys within
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
 * Across replicas: with R replicas, each sees about 1/R of a spray's keys. So the replica that owns
 * partition 0 also judges, every SPRAY_ACROSS_REPLICAS_MS (spray-across-replicas.ts), the keys of
 * every partition that storage holds failing from a network that failed for minKeys keys or more,
 * one of them on another replica's partition (EventStore.sprayedRequests, sprayedKeysOf): a tally of
 * its own (FleetSpray), judged as of storage's newest 401, since this replica's batches may be
 * behind (a backlog) or quiet. The two share what was reported to whom (SprayReports), so a merchant
 * is told of a spray once, by whichever judged it first, and again for a newer 401 or a higher
 * severity or more of its keys.
 *
 * Memory: at most MAX_ENTRIES (network, key) pairs and MAX_KEYS_PER_NETWORK keys a network (the
 * networks that began failing longest ago go first); pairs leave as the window passes them, every
 * network's at least once a minute.
 */
import { sprayNetworkOf } from '../../rules/network.ts';
import type { Plan, RequestEvent } from '../events/request-event.ts';
import type { EngineFinding } from './engine.ts';
import { testKeyFinding } from './test-keys.ts';
import { JUDGED_ACROSS_KEYS, type Finding, type Severity, type SprayJudgedFrom, type WindowEvent } from './types.ts';

/** Not yet parameters per plan or merchant, as the rules' are. */
const PARAMS = { windowMinutes: 10, minKeys: 20, highKeys: 100 } as const;
type SprayParams = typeof PARAMS;

const MINUTE = 60_000;
/** How far back a network's 401s count: the events a warm-up hands over count from this long before its newest. */
export const SPRAY_WINDOW_MS = PARAMS.windowMinutes * MINUTE;
/** A network reported is reported again at most this often while its severity stays the same. */
export const REPORT_EVERY_MS = MINUTE;
/** How long a reading of storage (FleetSpray) covers its networks, by the wall clock: four readings missed, and the replica's own tally reports them again. */
const FLEET_COVERS_MS = MINUTE;
/** The fewest keys a network must fail for to be reported; storage's reading reads only such networks. */
export const SPRAY_MIN_KEYS = PARAMS.minKeys;
const MAX_ENTRIES = 200_000;
/** The most keys a network holds in the tally, and a reading of storage takes of it. */
export const MAX_KEYS_PER_NETWORK = 5_000;
const MAX_LISTED = 20;
const MAX_SAMPLES = 10;

/** The highest severity a merchant is told of a spray at when all its keys in it are test keys (DetectionConfig.testKeyMaxSeverity). */
export type TestKeyCeiling = (plan: Plan, merchantId: string) => Severity;
const LOW: TestKeyCeiling = () => 'low';

/** One key's 401s from a network. */
export interface SprayedKey {
  merchantId: string;
  apiKeyId: string;
  /** The Kafka partition of the key's events (-1 for HTTP): a replica that no longer owns it drops the key (keepPartitions). */
  partition: number;
  /** Whether most of its requests from the network failed, as its window said when the memory budget forgot it (keepVerdict). */
  failedMostly?: boolean;
  failures: number;
  first: number;
  newest: number;
  /** `test` while the key is a test key (a merchant whose keys in a spray are all test keys is told at no more than its test-key ceiling). */
  environment: RequestEvent['environment'];
  /** Its plan, as its latest request counted said (the test-key ceiling may differ per plan). */
  plan: Plan;
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
  reportedAt: number;
  reportedSeverity: Severity | undefined;
  /** When its keys were last read one by one (failedMostly), and the severity their count allowed then. */
  checkedAt: number;
  checkedBound: Severity | undefined;
}

/** A key's requests from one address and user agent of a network, as storage has them (EventStore.sprayedRequests). */
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
  /** The key's plan, as its newest request from the address and user agent said. */
  plan: Plan;
  /**
   * The key's totals from the network, of all its rows; a reading cuts a key's rows beyond a bound
   * (those of the fewest requests), and when it did, these count what it left out.
   */
  keyRows: number;
  keyFailures: number;
  keyJudged: number;
  /** Whether any of the key's requests in the window, from any network, said it is a live key. */
  keyLive: boolean;
}

/** A key as storage has its requests from a network: its 401s and whether most of its requests there failed (sprayedKeysOf). */
export interface StoredSprayedKey extends SprayedKey {
  network: string;
  failedMostly: boolean;
}

/**
 * The keys of storage's requests, one per key and network: their 401s and whether most of their
 * requests from the network failed, the requests `allowlisted` says (an address, a network, a user
 * agent, the key) left out as admission leaves them out of the windows (of a key whose rows the
 * reading cut, what was cut counts from its totals, allowlisted or not), and a key whose 401s are
 * dated after `notAfter` (a producer's clock far ahead) left out as well. The newest 401 is the
 * key's sample.
 */
export function sprayedKeysOf(requests: readonly SprayedRequests[], allowlisted: (requests: SprayedRequests) => boolean, notAfter: number): StoredSprayedKey[] {
  interface Tally {
    key: StoredSprayedKey;
    judged: number;
    /** The rows given, and their 401s and requests judged, allowlisted or not; the key's totals of all its rows. */
    rows: number;
    givenFailures: number;
    givenJudged: number;
    totals: Pick<SprayedRequests, 'keyRows' | 'keyFailures' | 'keyJudged'>;
  }
  const tallies = new Map<string, Tally>();
  for (const request of requests) {
    const { network, merchantId, apiKeyId, partition } = request;
    const ref = `${network}\u0000${merchantId}\u0000${apiKeyId}`;
    let tally = tallies.get(ref);
    if (tally === undefined) {
      const environment = request.keyLive ? 'live' : 'test';
      const key: StoredSprayedKey = { network, merchantId, apiKeyId, partition, failures: 0, first: Infinity, newest: -Infinity, environment, plan: request.plan, newestEventId: '', ip: request.ip, userAgent: request.userAgent, country: undefined, failedMostly: false };
      tally = { key, judged: 0, rows: 0, givenFailures: 0, givenJudged: 0, totals: request };
      tallies.set(ref, tally);
    }
    tally.rows++;
    tally.givenFailures += request.failures;
    tally.givenJudged += request.judged;
    if (allowlisted(request)) continue;
    const { key } = tally;
    key.failures += request.failures;
    tally.judged += request.judged;
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
  const held: StoredSprayedKey[] = [];
  for (const { key, judged, rows, givenFailures, givenJudged, totals } of tallies.values()) {
    if (key.failures === 0 || key.newest > notAfter) continue;
    const cut = rows < totals.keyRows;
    const failures = key.failures + (cut ? Math.max(0, totals.keyFailures - givenFailures) : 0);
    const all = judged + (cut ? Math.max(0, totals.keyJudged - givenJudged) : 0);
    key.failedMostly = failures * 2 >= all;
    held.push(key);
  }
  return held;
}

const SEVERITY_RANK: Record<Severity, number> = { low: 0, medium: 1, high: 2, critical: 3 };

/**
 * What was reported about each network to each merchant: the newest 401 of its keys, the highest
 * severity, the most of its keys and of the network's, and the newest 401 a reading of storage
 * reported. A merchant is reported to again for a newer 401, a higher severity or more of its keys
 * only, or by a reading holding more of the network's keys than it was told of, with a 401 as new
 * as a reading reported (one taken before every replica had stored its keys, then the whole): a
 * key's 401 may be dated ahead of the others', and the replica's tally and its reading of storage
 * judge in times of their own; the reading of every
 * replica's keys may hold no 401 newer than the replica's own share did (a spray of a few seconds),
 * but more of the merchant's keys, which it must rotate, or the same keys with the whole spray's
 * (the alert keeps the reading's description: sprayKeptOver in src/alerts/alert.ts). Shared by
 * the two (SourceSpray, FleetSpray); entries leave once the replica's own tally's window has passed
 * their 401 (it sweeps: storage's time may stand still).
 */
export class SprayReports {
  private readonly byNetwork = new Map<string, Map<string, { newest: number; severity: Severity; keys: number; networkKeys: number; readingNewest: number }>>();

  /**
   * Whether `merchantId` is to be told of `network` failing for `keys` of its keys (`networkKeys`
   * in all) up to `newest`, at `severity`, judged `from` the keys of the replica's own partitions or
   * of all; if so, it is recorded as told.
   */
  tell(network: string, merchantId: string, newest: number, severity: Severity, keys: number, networkKeys: number, from: SprayJudgedFrom): boolean {
    let told = this.byNetwork.get(network);
    const last = told?.get(merchantId);
    const reading = from === 'all_partitions';
    const wholer = reading && last !== undefined && newest >= last.readingNewest && networkKeys > last.networkKeys;
    if (last && newest <= last.newest && !above(severity, last.severity) && keys <= last.keys && !wholer) return false;
    if (told === undefined) this.byNetwork.set(network, (told = new Map()));
    told.set(merchantId, {
      newest: Math.max(newest, last?.newest ?? -Infinity),
      severity: last && !above(severity, last.severity) ? last.severity : severity,
      keys: Math.max(keys, last?.keys ?? 0),
      networkKeys: Math.max(networkKeys, last?.networkKeys ?? 0),
      readingNewest: reading ? Math.max(newest, last?.readingNewest ?? -Infinity) : (last?.readingNewest ?? -Infinity),
    });
    return true;
  }

  /** Forgets what was told of 401s before `since` (SourceSpray.sweep, once a minute). */
  sweep(since: number): void {
    for (const [network, told] of this.byNetwork) {
      for (const [merchantId, last] of told) if (last.newest < since) told.delete(merchantId);
      if (told.size === 0) this.byNetwork.delete(network);
    }
  }
}

export class SourceSpray {
  /** In the order of their first 401 in the window: the first is the one that began failing longest ago. */
  private readonly networks = new Map<string, NetworkSpray>();
  private readonly touched = new Set<NetworkSpray>();
  /** Networks with failures their last report did not include (it was too recent): judged again once due, by any batch. */
  private readonly unreported = new Set<NetworkSpray>();
  private entries = 0;
  private sweptAt = -Infinity;

  constructor(
    private readonly reports = new SprayReports(),
    private readonly testKeyCeiling: TestKeyCeiling = LOW,
  ) {}

  /** The (network, key) pairs held. */
  get size(): number {
    return this.entries;
  }

  /**
   * Counts a 401 (other statuses are ignored) of a key whose events arrive on `partition`, a live key
   * or a test key as `environment` says (the key's, as detection holds it: live once any event said
   * so); its network is judged by the next judge().
   */
  add(event: RequestEvent, windowEvent: WindowEvent, partition: number, environment: RequestEvent['environment'] = event.environment): void {
    if (windowEvent.status !== 401) return;
    const network = sprayNetworkOf(windowEvent.network);
    let spray = this.networks.get(network);
    if (spray === undefined) {
      spray = { network, keys: new Map(), reportedAt: -Infinity, reportedSeverity: undefined, checkedAt: -Infinity, checkedBound: undefined };
      this.networks.set(network, spray);
    }
    const { merchantId, apiKeyId, plan } = event;
    const { ref, key } = heldKey(spray.keys, merchantId, apiKeyId);
    const { timestamp, eventId, ip, userAgent, country } = windowEvent;
    if (key !== undefined) {
      key.failures++;
      key.partition = partition;
      key.plan = plan;
      if (environment === 'live') key.environment = 'live';
      if (timestamp < key.first) key.first = timestamp;
      if (timestamp >= key.newest) {
        key.newest = timestamp;
        key.newestEventId = eventId;
        key.ip = ip;
        key.userAgent = userAgent;
        key.country = country;
      }
    } else if (spray.keys.size < MAX_KEYS_PER_NETWORK) {
      spray.keys.set(ref, { merchantId, apiKeyId, partition, failures: 1, first: timestamp, newest: timestamp, environment, plan, newestEventId: eventId, ip, userAgent, country });
      if (++this.entries > MAX_ENTRIES) this.dropOldest(spray);
    }
    this.touched.add(spray);
  }

  /**
   * Judges the networks that got 401s since the last call, as of `now`; a finding per merchant to
   * report to. `failedMostly` tells whether most of a key's requests from the network since a time
   * failed (401), from the key's own window; a network `coveredElsewhere` with this many failing keys
   * (FleetSpray.covers) is not reported.
   */
  judge(
    now: number,
    failedMostly: (key: SprayedKey, network: string, since: number) => boolean,
    coveredElsewhere: (network: string, failingKeys: number, now: number) => boolean = () => false,
  ): EngineFinding[] {
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
      const failing = [...spray.keys.values()].filter((key) => failedMostly(key, spray.network, since));
      const severity = severityOf(failing.length, params);
      if (severity === undefined) continue;
      if (now - spray.reportedAt < REPORT_EVERY_MS && !above(severity, spray.reportedSeverity)) {
        this.unreported.add(spray);
        continue;
      }
      // A network the reading of storage judges whole is its to report: this replica's share would
      // add only a sighting to the merchants' alerts (which keep the reading's description:
      // sprayKeptOver in src/alerts/alert.ts). Judged again once due, should the readings stop.
      if (coveredElsewhere(spray.network, failing.length, now)) {
        this.unreported.add(spray);
        continue;
      }
      findings.push(...reportSpray(spray.network, failing, severity, 'own_partitions', params, this.reports, this.testKeyCeiling));
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
    }
    if (spray.keys.size > 0) return true;
    if (this.networks.get(spray.network) === spray) this.networks.delete(spray.network);
    this.unreported.delete(spray);
    return false;
  }

  /** A key held as a test key turned out live (an event of it said so): so it is in every network's keys (rare: once a key). */
  keyIsLive(merchantId: string, apiKeyId: string): void {
    for (const spray of this.networks.values()) {
      const key = heldKey(spray.keys, merchantId, apiKeyId).key;
      if (key !== undefined) key.environment = 'live';
    }
  }

  /** Records whether most of a key's requests from a network failed, as its window says before the engine forgets it. */
  keepVerdict(network: string, merchantId: string, apiKeyId: string, failedMostly: boolean): void {
    const keys = this.networks.get(network)?.keys;
    const key = keys && heldKey(keys, merchantId, apiKeyId).key;
    if (key !== undefined) key.failedMostly = failedMostly;
  }

  /**
   * Drops the keys of partitions this replica no longer owns (HTTP's stay): their new owner warms
   * and judges them. Kept, they would be counted twice when the partition comes back and is warmed
   * again, and judged as failing mostly once their windows are gone.
   */
  keepPartitions(owned: ReadonlySet<number>): void {
    for (const spray of this.networks.values()) {
      for (const [ref, key] of spray.keys) {
        if (key.partition < 0 || owned.has(key.partition)) continue;
        spray.keys.delete(ref);
        this.entries--;
      }
      if (spray.keys.size > 0) continue;
      this.networks.delete(spray.network);
      this.touched.delete(spray);
      this.unreported.delete(spray);
    }
  }

  /** Prunes every network (those no batch touches any more too). */
  private sweep(since: number, now: number): void {
    this.sweptAt = now;
    this.reports.sweep(since);
    for (const spray of this.networks.values()) this.prune(spray, since);
  }

  /** Over MAX_ENTRIES: the networks that failed longest ago go, never `keep` (the one being added to). */
  private dropOldest(keep: NetworkSpray): void {
    for (const spray of this.networks.values()) {
      if (this.entries <= MAX_ENTRIES) return;
      if (spray === keep) continue;
      this.networks.delete(spray.network);
      this.touched.delete(spray);
      this.unreported.delete(spray);
      this.entries -= spray.keys.size;
    }
  }
}

/**
 * Credential stuffing across replicas, as storage has it: the keys of every partition failing from
 * networks that failed for minKeys keys or more (sprayedKeysOf), judged as a whole at each reading,
 * as of storage's time (`now`). A network is reported at most once per REPORT_EVERY_MS of the wall
 * clock (storage's time stands still once a spray stops, and what its last minute brought must still
 * be told) unless its severity rises, and only for 401s newer than those it last reported, more
 * failing keys (another replica's, stored late) or a higher severity (a spray that stopped is read
 * again and again), to the merchants SprayReports says are to be told. Holds what it reported when,
 * and how many failing keys the last reading held of each network: the replica's own tally leaves
 * to it a network it judged with as many (covers).
 */
export class FleetSpray {
  private readonly reported = new Map<string, { at: number; newest: number; severity: Severity; keys: number }>();
  private read: { at: number; now: number; failingKeys: ReadonlyMap<string, number> } = { at: -Infinity, now: -Infinity, failingKeys: new Map() };

  constructor(
    private readonly reports: SprayReports,
    private readonly testKeyCeiling: TestKeyCeiling = LOW,
  ) {}

  /**
   * Whether the last reading, at most FLEET_COVERS_MS ago by `clock`, judged `network` with at
   * least `failingKeys` keys failing (the replica's own tally's count: the reading's bounds may have
   * cut the network), as of a time no more than a minute after `now` (the own tally's): it judges
   * that network whole then. A tally further behind (a backlog) judges 401s the reading no longer holds.
   */
  covers(network: string, failingKeys: number, now: number, clock: number): boolean {
    return clock - this.read.at < FLEET_COVERS_MS && now >= this.read.now - MINUTE && (this.read.failingKeys.get(network) ?? 0) >= failingKeys;
  }

  judge(keys: readonly StoredSprayedKey[], now: number, clock: number): EngineFinding[] {
    const params = PARAMS;
    const since = now - params.windowMinutes * MINUTE;
    for (const [network, last] of this.reported) if (last.newest < since) this.reported.delete(network);
    const failingByNetwork = new Map<string, StoredSprayedKey[]>();
    for (const key of keys) {
      if (!key.failedMostly || key.newest < since) continue;
      const failing = failingByNetwork.get(key.network);
      if (failing) failing.push(key);
      else failingByNetwork.set(key.network, [key]);
    }
    this.read = { at: clock, now, failingKeys: new Map([...failingByNetwork].map(([network, failing]) => [network, failing.length])) };
    const findings: EngineFinding[] = [];
    for (const [network, failing] of failingByNetwork) {
      const severity = severityOf(failing.length, params);
      if (severity === undefined) continue;
      const newest = failing.reduce((latest, key) => Math.max(latest, key.newest), -Infinity);
      const last = this.reported.get(network);
      if (last && !above(severity, last.severity) && (clock - last.at < REPORT_EVERY_MS || (newest <= last.newest && failing.length <= last.keys))) continue;
      findings.push(...reportSpray(network, failing, severity, 'all_partitions', params, this.reports, this.testKeyCeiling));
      this.reported.set(network, { at: clock, newest: Math.max(newest, last?.newest ?? -Infinity), severity, keys: failing.length });
    }
    return findings;
  }
}

/**
 * A finding for each merchant with keys among `failing` (a network's keys failing mostly with 401)
 * that `reports` says is to be told (SprayReports.tell: a 401 newer, a severity higher or more of
 * its keys than it was ever told of, or a reading's whole after its share). A merchant whose keys
 * among them are all test keys is told at no more than its test-key ceiling, as of any finding on a test key (test-keys.ts); the spray
 * still counts them, and its other merchants are told at the spray's severity.
 */
function reportSpray(
  network: string,
  failing: readonly SprayedKey[],
  severity: Severity,
  judgedFrom: SprayJudgedFrom,
  params: SprayParams,
  reports: SprayReports,
  testKeyCeiling: TestKeyCeiling,
): EngineFinding[] {
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
    const ceiling = keys.every((key) => key.environment === 'test') ? testKeyCeiling(keys[0]!.plan, merchantId) : undefined;
    const toldSeverity = ceiling !== undefined && above(severity, ceiling) ? ceiling : severity;
    if (!reports.tell(network, merchantId, keys[0]!.newest, toldSeverity, keys.length, allKeys, judgedFrom)) continue;
    const listed = keys.slice(0, MAX_LISTED).map((key) => key.apiKeyId);
    const theirFailures = keys.reduce((sum, key) => sum + key.failures, 0);
    const firstSeenAt = Math.min(...keys.map((key) => key.first));
    const lastSeenAt = keys[0]!.newest;
    const yours = keys.length === 1 ? `1 of yours (${listed[0]})` : `${keys.length} of yours (${listed.slice(0, 3).join(', ')}${keys.length > 3 ? ', ...' : ''})`;
    const finding: Finding = {
      scope: `network:${network}`,
      apiKeyId: null,
      severity,
      confidence: Math.max(0, confidence),
      title: `Credential stuffing from ${network}: 401 for ${allKeys} API keys in ${params.windowMinutes} min, ${keys.length} of them yours`,
      summary:
        `One network (${network}, ${addresses(ips.length)}) failed authentication with ${allKeys} distinct API keys ` +
        `in ${params.windowMinutes} minutes (at least ${params.minKeys} make an alert), ${yours}: someone is trying a list of keys. ` +
        'Check that those keys\' secrets have not leaked (rotate them if in doubt), and block the network at your edge if it is not yours.',
      evidence: {
        judgedBy: JUDGED_ACROSS_KEYS,
        judgedFrom,
        network,
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
        lastFailureAt: new Date(lastSeenAt).toISOString(),
        windowMinutes: params.windowMinutes,
        windowMs: params.windowMinutes * MINUTE,
        sampleEventIds: keys.slice(0, MAX_SAMPLES).map((key) => key.newestEventId),
      },
      firstSeenAt,
      lastSeenAt,
    };
    findings.push({ merchantId, ruleId: 'high_failure_rate', finding: ceiling === undefined ? finding : testKeyFinding(finding, ceiling) });
  }
  return findings;
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
