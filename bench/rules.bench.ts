/**
 * tsx bench/rules.bench.ts (npm run bench:rules) — the five rules of rules/ over 1M synthetic
 * request events across 10k keys, on one thread, the way the engine runs them: per-key arrays hold
 * the last windowMs of events (old ones shifted off the front), events arrive in batches of 1,000,
 * and after each batch every key the batch touched is evaluated by every rule (per key per batch,
 * never per event; a key without new events is not evaluated).
 * It measures, in the same run, plain JSON.parse of the same 1M event JSON strings, and prints both
 * rates and their ratio: the goal is that the rules cost no more than parsing the events does.
 * Parsing and enrichment (network, geolocation) happen per batch as in the engine but are not timed.
 * Three floors are measured with the same loop and no rules, to show where the time goes: window
 * upkeep alone, upkeep plus a bare walk over each evaluated window's last 10 minutes of event
 * objects (what any rule that reads its window pays in memory latency), and that walk over columnar
 * windows (typed arrays per key) instead.
 * Traffic: ordinary integrations (library user agents, a few IPs in one /24, one region, mostly 2xx
 * with some 401/404/422/429/5xx) at BENCH_RATE events/s in all, 2% of keys served from two regions,
 * and 25 abusive keys (velocity, attack tool, sharing, travel, 401 storm) so the rules' firing paths
 * are measured too.
 * Note: windows start empty, so keys served from two regions report impossible travel while their
 * second region is new (the engine warms its windows from storage at start; this bench does not).
 * Env: BENCH_EVENTS (1000000), BENCH_KEYS (10000), BENCH_BATCH (1000), BENCH_RATE (1000 events/s),
 * BENCH_EVALUATE_EVERY (1: dirty keys are evaluated after every batch; N: after every Nth batch).
 */
import type { RequestEvent } from '../src/events/request-event.ts';
import type { GeoPoint, KeyWindow, WindowEvent } from '../src/detect/types.ts';
import { networkOf } from '../rules/network.ts';
import { RULES } from '../rules/index.ts';

const EVENTS = Number(process.env.BENCH_EVENTS ?? 1_000_000);
const KEYS = Number(process.env.BENCH_KEYS ?? 10_000);
const BATCH = Number(process.env.BENCH_BATCH ?? 1000);
const RATE = Number(process.env.BENCH_RATE ?? 1000);
/** Evaluate dirty keys after every Nth batch (1 = after every batch, as specified). */
const EVALUATE_EVERY = Math.max(1, Number(process.env.BENCH_EVALUATE_EVERY ?? 1));
const START = Date.UTC(2026, 10, 20, 12, 0, 0);
const WINDOW_MS = Math.max(...RULES.map((rule) => rule.windowMs));

const REGIONS: { country: string; geo: GeoPoint }[] = [
  ['US', 'Ashburn', 39.04, -77.49],
  ['US', 'Portland', 45.52, -122.68],
  ['IE', 'Dublin', 53.35, -6.26],
  ['DE', 'Frankfurt', 50.11, 8.68],
  ['GB', 'London', 51.51, -0.13],
  ['SG', 'Singapore', 1.35, 103.82],
  ['JP', 'Tokyo', 35.68, 139.65],
  ['AU', 'Sydney', -33.87, 151.21],
  ['BR', 'São Paulo', -23.56, -46.64],
  ['IN', 'Mumbai', 19.08, 72.88],
].map(([country, city, latitude, longitude]) => ({
  country: country as string,
  geo: { latitude: latitude as number, longitude: longitude as number, accuracyKm: 20, country: country as string, city: city as string },
}));
const LIBRARIES = ['python-requests/2.32.3', 'okhttp/4.12.0', 'axios/1.7.7', 'Go-http-client/2.0', 'node-fetch/1.0', 'Java/17.0.2', 'GuzzleHttp/7', 'curl/8.7.1', ''];
const STATUSES = [...Array<number>(85).fill(201), ...Array<number>(5).fill(404), ...Array<number>(3).fill(401), ...Array<number>(4).fill(422), 429, 429, 503];

/** Deterministic PRNG (mulberry32), so every run sees the same traffic. */
function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

type Abuse = 'velocity' | 'attack_tool' | 'sharing' | 'travel' | 'auth_storm' | undefined;
const abuseOf = (key: number): Abuse => (['velocity', 'attack_tool', 'sharing', 'travel', 'auth_storm'] as const)[Math.floor(key / 5)];

interface Generated {
  json: string[];
  /** What the engine's GeoIP lookup would say for each event: an index into REGIONS. */
  regionOf: Uint8Array;
}

function generate(): Generated {
  const random = prng(42);
  const json: string[] = new Array(EVENTS);
  const regionOf = new Uint8Array(EVENTS);
  const keyNames = Array.from({ length: KEYS }, (_, k) => `pk_live_${k.toString(36).padStart(6, '0')}`);
  for (let i = 0; i < EVENTS; i++) {
    // 1% of events go to the five velocity keys (about 2x their limit each); the rest are uniform.
    const key = random() < 0.01 ? Math.floor(random() * 5) : Math.floor(random() * KEYS);
    const abuse = abuseOf(key);
    const home = key % REGIONS.length;
    let region = key % 50 === 49 && random() < 0.5 ? (home + 3) % REGIONS.length : home;
    let ip = `${100 + (key % 100)}.${(key >> 7) & 255}.${(key & 127) + (region === home ? 0 : 128)}.${10 + Math.floor(random() * 4)}`;
    let userAgent = LIBRARIES[key % LIBRARIES.length]!;
    let status = STATUSES[Math.floor(random() * STATUSES.length)]!;
    if (abuse === 'attack_tool' && random() < 0.01) userAgent = 'sqlmap/1.8.4#stable (https://sqlmap.org)';
    if (abuse === 'sharing' && random() < 0.3) {
      ip = `198.18.${Math.floor(random() * 256)}.${Math.floor(random() * 256)}`;
      region = Math.floor(random() * REGIONS.length);
    }
    if (abuse === 'travel' && random() < 0.05) {
      ip = `203.0.113.${Math.floor(random() * 256)}`;
      region = home < 5 ? home + 5 : home - 5;
    }
    if (abuse === 'auth_storm' && random() < 0.7) status = 401;
    regionOf[i] = region;
    json[i] = JSON.stringify({
      eventId: `evt_${i.toString(36)}_${key}`,
      timestamp: START + Math.floor((i * 1000) / RATE),
      merchantId: `m_${key % 500}`,
      plan: (['business', 'enterprise', 'pro', 'free'] as const)[key % 4],
      apiKeyId: keyNames[key]!,
      environment: 'live',
      ip,
      userAgent,
      method: i % 3 === 0 ? 'GET' : 'POST',
      path: i % 3 === 0 ? `/v1/verify/sessions/ses_${(i * 7919) % 1_000_000}` : '/v1/verify/sessions',
      status,
      responseTimeMs: 20 + (i % 180),
    });
  }
  return { json, regionOf };
}

function timeParse(json: readonly string[], count: number): number {
  let checksum = 0;
  const started = performance.now();
  for (let i = 0; i < count; i++) checksum += (JSON.parse(json[i]!) as { status: number }).status;
  const ms = performance.now() - started;
  if (checksum === 0) throw new Error('unreachable: keeps the parse from being optimised away');
  return ms;
}

/** The fields of a request event this benchmark generates. */
type RawEvent = Pick<RequestEvent, 'eventId' | 'timestamp' | 'apiKeyId' | 'ip' | 'userAgent' | 'method' | 'path' | 'status' | 'responseTimeMs'>;

/**
 * The engine's side of a batch, not timed: parse and enrich. Like an engine's caches, a network and
 * a user agent seen before are the same string objects (rules compare them per event, and equal
 * pointers compare at once), and a place's GeoPoint is one shared object (as a GeoIP lookup cache
 * returns it).
 */
class Enricher {
  private readonly networks = new Map<string, string>();
  private readonly interned = new Map<string, string>();
  private readonly userAgents = new Map<string, string>();

  enrich(text: string, region: number): { apiKeyId: string; event: WindowEvent } {
    const raw = JSON.parse(text) as RawEvent;
    let network = this.networks.get(raw.ip);
    if (network === undefined) {
      network = networkOf(raw.ip);
      network = this.interned.get(network) ?? (this.interned.set(network, network), network);
      this.networks.set(raw.ip, network);
    }
    let userAgent = this.userAgents.get(raw.userAgent);
    if (userAgent === undefined) this.userAgents.set(raw.userAgent, (userAgent = raw.userAgent));
    const place = REGIONS[region]!;
    return {
      apiKeyId: raw.apiKeyId,
      event: {
        eventId: raw.eventId,
        timestamp: raw.timestamp,
        ip: raw.ip,
        network,
        userAgent,
        method: raw.method,
        path: raw.path,
        status: raw.status,
        responseTimeMs: raw.responseTimeMs,
        rateLimitPerMinute: 60,
        country: place.country,
        geo: place.geo,
      },
    };
  }
}

type Work = 'rules' | 'upkeep' | 'walk' | 'columns';

/** A key's window as columns (a ring of timestamps and statuses): what a columnar window would cost. */
class Columns {
  private timestamps = new Float64Array(16);
  private statuses = new Uint16Array(16);
  private head = 0;
  length = 0;

  push(timestamp: number, status: number): void {
    if (this.length === this.timestamps.length) this.grow();
    const at = (this.head + this.length) & (this.timestamps.length - 1);
    this.timestamps[at] = timestamp;
    this.statuses[at] = status;
    this.length++;
  }

  dropBefore(cutoff: number): void {
    const mask = this.timestamps.length - 1;
    while (this.length > 0 && this.timestamps[this.head]! < cutoff) {
      this.head = (this.head + 1) & mask;
      this.length--;
    }
  }

  /** The walk of the 'walk' floor, over columns. */
  sumStatusSince(since: number): number {
    const mask = this.timestamps.length - 1;
    let sum = 0;
    for (let k = this.length - 1; k >= 0; k--) {
      const at = (this.head + k) & mask;
      if (this.timestamps[at]! < since) break;
      sum += this.statuses[at]!;
    }
    return sum;
  }

  private grow(): void {
    const timestamps = new Float64Array(this.timestamps.length * 2);
    const statuses = new Uint16Array(this.statuses.length * 2);
    for (let k = 0; k < this.length; k++) {
      const at = (this.head + k) & (this.timestamps.length - 1);
      timestamps[k] = this.timestamps[at]!;
      statuses[k] = this.statuses[at]!;
    }
    this.timestamps = timestamps;
    this.statuses = statuses;
    this.head = 0;
  }
}

interface RunStats {
  ms: number;
  evaluations: number;
  windowEvents: number;
  findingsByRule: Record<string, number>;
}

/**
 * The engine loop over the first `count` events. Only window upkeep and evaluation are timed.
 * work = 'upkeep' keeps the windows and evaluates nothing; 'walk' replaces the rules by a bare walk over each evaluated window's last 10 minutes
 * (touching timestamp and status): the memory-bound floor of any rule that reads a window of event
 * objects. work = 'columns' does the same walk over a columnar window (typed arrays per key).
 */
function run(generated: Generated, count: number, work: Work): RunStats {
  const params = RULES.map((rule) => rule.defaults as never);
  const enricher = new Enricher();
  type State = KeyWindow & { events: WindowEvent[]; columns: Columns };
  const windows = new Map<string, State>();
  const findingsByRule: Record<string, number> = Object.fromEntries(RULES.map((rule) => [rule.id, 0]));
  const batch: { apiKeyId: string; event: WindowEvent }[] = [];
  let dirty = new Set<State>();
  let evaluations = 0;
  let windowEvents = 0;
  let checksum = 0;
  let ms = 0;
  for (let start = 0, batchNumber = 1; start < count; start += BATCH, batchNumber++) {
    const end = Math.min(count, start + BATCH);
    batch.length = 0;
    for (let i = start; i < end; i++) batch.push(enricher.enrich(generated.json[i]!, generated.regionOf[i]!));

    const started = performance.now();
    for (const { apiKeyId, event } of batch) {
      let window = windows.get(apiKeyId);
      if (!window) windows.set(apiKeyId, (window = { merchantId: 'm', apiKeyId, plan: 'business', events: [], columns: new Columns() }));
      if (work === 'columns') window.columns.push(event.timestamp, event.status);
      else window.events.push(event);
      dirty.add(window);
    }
    if (batchNumber % EVALUATE_EVERY === 0 || end === count) {
      const now = batch[batch.length - 1]!.event.timestamp;
      const cutoff = now - WINDOW_MS;
      for (const window of dirty) {
        evaluations++;
        if (work === 'columns') {
          window.columns.dropBefore(cutoff);
          windowEvents += window.columns.length;
          checksum += window.columns.sumStatusSince(now - 10 * 60_000);
          continue;
        }
        const events = window.events;
        while (events.length > 0 && events[0]!.timestamp < cutoff) events.shift();
        windowEvents += events.length;
        if (work === 'upkeep') continue;
        if (work === 'walk') {
          for (let i = events.length - 1; i >= 0 && events[i]!.timestamp >= now - 10 * 60_000; i--) checksum += events[i]!.status;
          continue;
        }
        for (let r = 0; r < RULES.length; r++) {
          const rule = RULES[r]!;
          const findings = (rule.evaluate as (w: KeyWindow, p: never, n: number) => unknown[])(window, params[r]!, now);
          if (findings.length > 0) findingsByRule[rule.id]! += 1;
        }
      }
      dirty = new Set();
    }
    ms += performance.now() - started;
  }
  if (checksum < 0) throw new Error('unreachable');
  return { ms, evaluations, windowEvents, findingsByRule };
}

function main(): void {
  const generateStarted = performance.now();
  const generated = generate();
  const averageBytes = Math.round(generated.json.reduce((sum, text) => sum + text.length, 0) / EVENTS);
  const spanMinutes = EVENTS / RATE / 60;
  console.log(
    `input: ${EVENTS.toLocaleString('en')} events, ${KEYS.toLocaleString('en')} keys, ${averageBytes} bytes of JSON on average, ` +
      `${RATE} events/s (${((RATE * 60) / KEYS).toFixed(1)} per key per minute) over ${spanMinutes.toFixed(1)} min of event time; ` +
      `batches of ${BATCH}, dirty keys evaluated every ${EVALUATE_EVERY} batch(es); engine window ${WINDOW_MS / 60_000} min ` +
      `(generated in ${((performance.now() - generateStarted) / 1000).toFixed(1)} s)`,
  );

  // Warm up on the first 10% (separate state), then measure the whole input.
  const warm = Math.min(EVENTS, 100_000);
  timeParse(generated.json, warm);
  run(generated, warm, 'rules');
  for (const work of ['upkeep', 'walk', 'columns'] as const) run(generated, warm, work);

  const parseMs = timeParse(generated.json, EVENTS);
  const rules = run(generated, EVENTS, 'rules');
  const upkeep = run(generated, EVENTS, 'upkeep');
  const walk = run(generated, EVENTS, 'walk');
  const columns = run(generated, EVENTS, 'columns');
  const perSecond = (ms: number) => Math.round(EVENTS / (ms / 1000)).toLocaleString('en');
  console.log(`JSON.parse of the same events: ${perSecond(parseMs)} events/s (${(parseMs / 1000).toFixed(2)} s)`);
  console.log(
    `rules (${RULES.length} rules, dirty keys every ${EVALUATE_EVERY} batch(es), window upkeep included): ${perSecond(rules.ms)} events/s (${(rules.ms / 1000).toFixed(2)} s); ` +
      `${rules.evaluations.toLocaleString('en')} key evaluations, ${(rules.windowEvents / rules.evaluations).toFixed(1)} events per window on average, ` +
      `${((rules.ms * 1000) / rules.evaluations).toFixed(2)} µs per key evaluation (all rules)`,
  );
  console.log(`ratio rules / JSON.parse (time): ${(rules.ms / parseMs).toFixed(2)} (goal: <= 1)`);
  const floor = (label: string, stats: RunStats) =>
    console.log(
      `  ${label}: ${perSecond(stats.ms)} events/s, ${((stats.ms * 1000) / stats.evaluations).toFixed(2)} µs per key evaluation, ` +
        `ratio to JSON.parse ${(stats.ms / parseMs).toFixed(2)}`,
    );
  console.log('floors (same loop, no rules):');
  floor('window upkeep alone (push, shift, dirty set)', upkeep);
  floor("upkeep + walking each evaluated window's last 10 min of event objects", walk);
  floor('upkeep + the same walk over columnar windows (typed arrays per key)', columns);
  console.log(`evaluations with findings: ${JSON.stringify(rules.findingsByRule)}`);
  console.log(`peak RSS: ${Math.round(process.resourceUsage().maxRSS / 1024)} MB`);
}

main();
