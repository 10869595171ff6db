/**
 * tsx bench/rules.bench.ts (npm run bench:rules) — the five rules of rules/ over 1M synthetic
 * request events across 10k keys, on one thread, run by the engine itself (src/detect/engine.ts):
 * events arrive in batches of 1,000, each key keeps its window of events and every rule's tally
 * (the rule's screen), and after each batch every key the batch touched is judged by every rule
 * (per key per batch, never per event; a key without new events is not judged): each rule's screen
 * checks its tally, and the rule reads the key's window only when its screen says it may fire.
 * It measures, in the same run, plain JSON.parse of the same 1M event JSON strings, and prints both
 * rates and their ratio: the goal is that the engine costs no more than parsing the events does.
 * Timed: DetectionEngine.detect per batch (windows, eventId dedup per key, tallies, screens,
 * rules). Not timed, as before: parsing, and the engine's admission step (plan, allowlists, network,
 * geolocation; DetectionEngine.admit), which happen per batch as in the engine.
 * For comparison, with the same engine and traffic: admission timed too (DetectionEngine.process),
 * the engine's upkeep alone (one rule that keeps no tally and never fires), and the five rules
 * without their screens (every rule reads every touched window, as before the screens); the last
 * must report the same findings. And, for scale, validation of the same events as Kafka batches
 * (validateBatch), the analysis thread's other work per event.
 * Traffic: ordinary integrations (library user agents, a few IPs in one /24, one region, mostly 2xx
 * with some 401/404/422/429/5xx) at BENCH_RATE events/s in all, 2% of keys served from two regions,
 * and 25 abusive keys (velocity, attack tool, sharing, travel, 401 storm) so the rules' firing paths
 * are measured too.
 * Note: windows start empty, so keys served from two regions report impossible travel while their
 * second region is new (the engine warms its windows from storage at start; this bench does not).
 * Env: BENCH_EVENTS (1000000), BENCH_KEYS (10000), BENCH_BATCH (1000), BENCH_RATE (1000 events/s),
 * BENCH_EVALUATE_EVERY (1: keys are judged after every batch; N: N batches are handed over as one),
 * BENCH_HOT_SHARE (0.01: the share of all events that go to the five velocity keys; 0.1 at
 * BENCH_RATE=10000 is five keys attacking at 200 requests/s each).
 */
import { DetectionConfig } from '../src/detect/detection-config.ts';
import { DetectionEngine, type AnyRule, type EngineFinding } from '../src/detect/engine.ts';
import type { GeoLookup } from '../src/detect/geo.ts';
import type { GeoPoint } from '../src/detect/types.ts';
import { EVENT_TIME_RANGE, PLANS, type RequestEvent } from '../src/events/request-event.ts';
import { RecentEventIds } from '../src/ingest/recent-event-ids.ts';
import { validateBatch, type RawBatch } from '../src/ingest/validate-batch.ts';
import { RULES } from '../rules/index.ts';
import { packed } from '../test/support/events.ts';
import { prng } from '../test/support/random.ts';

const EVENTS = Number(process.env.BENCH_EVENTS ?? 1_000_000);
const KEYS = Number(process.env.BENCH_KEYS ?? 10_000);
const BATCH = Number(process.env.BENCH_BATCH ?? 1000);
const RATE = Number(process.env.BENCH_RATE ?? 1000);
/** Evaluate dirty keys after every Nth batch (1 = after every batch, as specified). */
const EVALUATE_EVERY = Math.max(1, Number(process.env.BENCH_EVALUATE_EVERY ?? 1));
/** The share of events sent by the five velocity keys. */
const HOT_SHARE = Number(process.env.BENCH_HOT_SHARE ?? 0.01);
const START = Date.UTC(2026, 10, 20, 12, 0, 0);
/** The engine's wall clock: the end of the traffic's event time, whatever today's date (events dated ahead of it are left out). */
const CLOCK = START + Math.ceil(EVENTS / RATE) * 1000;
const WINDOW_MS = Math.max(...RULES.map((rule) => rule.windowMs));
/** No allowlists, no overrides. */
const CONFIG = new DetectionConfig();

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
    // HOT_SHARE of events (1%: about 2x their limit each) go to the five velocity keys; the rest are uniform.
    const key = random() < HOT_SHARE ? Math.floor(random() * 5) : Math.floor(random() * KEYS);
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
    json[i] = flat(
      JSON.stringify({
        eventId: `evt_${i.toString(36)}_${key}`,
        timestamp: START + Math.floor((i * 1000) / RATE),
        merchantId: `m_${key % 500}`,
        plan: (['business', 'enterprise', 'pro', 'free'] as const)[key % 4],
        // Enterprise limits are custom: the fleet sends them (velocity_attack does not judge an enterprise minute without one).
        ...(key % 4 === 1 ? { rateLimitPerMinute: 60 } : {}),
        apiKeyId: keyNames[key]!,
        environment: 'live',
        ip,
        userAgent,
        method: i % 3 === 0 ? 'GET' : 'POST',
        path: i % 3 === 0 ? `/v1/verify/sessions/ses_${(i * 7919) % 1_000_000}` : '/v1/verify/sessions',
        status,
        responseTimeMs: 20 + (i % 180),
      }),
    );
  }
  return { json, regionOf };
}

/**
 * The text as one flat string, as the worker's are (decoded from a message's bytes). JSON.stringify
 * returns a cons string (V8 joins its parts lazily), which each first JSON.parse flattens: measured
 * on such strings, JSON.parse took about 2.6 µs an event the first time and 1.0 µs after (200k
 * events of about 270 bytes), so timing it on them made the engine's ratio to it look a quarter to a
 * third of what it is.
 */
function flat(text: string): string {
  return Buffer.from(text).toString();
}

function timeParse(json: readonly string[], count: number): number {
  let checksum = 0;
  const started = performance.now();
  for (let i = 0; i < count; i++) checksum += (JSON.parse(json[i]!) as { status: number }).status;
  const ms = performance.now() - started;
  if (checksum === 0) throw new Error('unreachable: keeps the parse from being optimised away');
  return ms;
}

/**
 * Validation of the same events as Kafka batches of BATCH messages keyed by their apiKeyId
 * (validateBatch, as the analysis thread runs it before detection: each message's bytes to its
 * stored row and, every plan being judged here, to the event detection gets; the eventId memory of
 * the worker's default size). Packing the batches is not timed. One event (of 1,029 or more) is
 * refused: event 1028, whose eventId is `evt_sk_<key>` (1028 is `sk` in base 36), which the secret
 * filter takes for a key secret.
 */
function timeValidation(json: readonly string[], count: number): { ms: number; refused: number } {
  const batches: RawBatch[] = [];
  for (let first = 0; first < count; first += BATCH) {
    const texts = json.slice(first, Math.min(count, first + BATCH));
    const value = packed(texts);
    const key = packed(texts.map((text) => (JSON.parse(text) as { apiKeyId: string }).apiKeyId));
    const offsets = Float64Array.from(texts, (_, i) => first + i);
    batches.push({ topic: 'api.request-metadata', partition: 0, values: value.bytes, ends: value.ends, keys: key.bytes, keyEnds: key.ends, offsets, timestamps: offsets.map(() => CLOCK) });
  }
  const recentIds = new RecentEventIds(1_000_000);
  const judged = new Set<string>(PLANS);
  let rows = 0;
  let refused = 0;
  const started = performance.now();
  for (const batch of batches) {
    const validated = validateBatch(batch, recentIds, EVENT_TIME_RANGE, CLOCK, judged);
    rows += validated.rowCount;
    refused += validated.rejections.length;
  }
  const ms = performance.now() - started;
  if (rows + refused !== count || refused > count / 1000) throw new Error(`validation stored ${rows} and refused ${refused} of ${count} events: the bench's events must be valid`);
  return { ms, refused };
}

/** What the engine's GeoIP lookup says: the region the generator placed each address in. */
function geoLookup(generated: Generated, count: number): GeoLookup {
  const places = new Map<string, GeoPoint>();
  for (let i = 0; i < count; i++) {
    const ip = (JSON.parse(generated.json[i]!) as RequestEvent).ip;
    if (!places.has(ip)) places.set(ip, REGIONS[generated.regionOf[i]!]!.geo);
  }
  return { lookup: (ip) => places.get(ip) };
}

/** engine: detect() timed (admission and enrichment not); whole: process() timed; upkeep, screens, unscreened: see rulesFor. */
type Variant = 'engine' | 'whole' | 'upkeep' | 'screens' | 'unscreened';

/** A rule that keeps no tally and never fires: the engine's own upkeep, with a window as long as the real rules'. */
const NO_RULE: AnyRule = {
  ...RULES[0],
  windowMs: WINDOW_MS,
  evaluate: () => [],
  screen: { create: () => 0, add: () => undefined, remove: () => undefined, mayFire: () => false },
};

const VARIANTS: readonly Variant[] = ['engine', 'whole', 'upkeep', 'screens', 'unscreened'];

function rulesFor(variant: Variant): AnyRule[] {
  if (variant === 'upkeep') return [NO_RULE];
  if (variant === 'screens') return RULES.map((rule) => ({ ...rule, evaluate: () => [] }) as AnyRule);
  if (variant === 'unscreened') return RULES.map(({ screen: _screen, ...rule }) => rule as AnyRule);
  return [...RULES];
}

interface RunStats {
  ms: number;
  evaluations: number;
  findingsByRule: Record<string, number>;
}

/**
 * The engine over the first `count` events, in batches judged as of their newest event: each batch
 * is parsed and admitted (plan, allowlists, network, geolocation; not timed), then detected (timed:
 * windows, dedup, tallies, rules). Variant 'whole' times admission too (DetectionEngine.process).
 */
function run(generated: Generated, count: number, variant: Variant): RunStats {
  const engine = new DetectionEngine({
    rules: rulesFor(variant),
    entitledPlans: PLANS,
    geo: geoLookup(generated, count),
    config: () => CONFIG,
    clock: () => CLOCK,
  });
  const findingsByRule: Record<string, number> = Object.fromEntries(RULES.map((rule) => [rule.id, 0]));
  const batch: RequestEvent[] = [];
  const keysInBatch = new Set<string>();
  let evaluations = 0;
  let ms = 0;
  for (let start = 0; start < count; start += BATCH * EVALUATE_EVERY) {
    const end = Math.min(count, start + BATCH * EVALUATE_EVERY);
    batch.length = 0;
    keysInBatch.clear();
    for (let i = start; i < end; i++) {
      const event = JSON.parse(generated.json[i]!) as RequestEvent;
      batch.push(event);
      keysInBatch.add(event.apiKeyId);
    }
    evaluations += keysInBatch.size;
    const now = batch[batch.length - 1]!.timestamp;
    let findings: EngineFinding[];
    if (variant === 'whole') {
      const started = performance.now();
      findings = engine.process(batch, now);
      ms += performance.now() - started;
    } else {
      const admitted = engine.admit(batch);
      const started = performance.now();
      findings = engine.detect(admitted, now);
      ms += performance.now() - started;
    }
    for (const { ruleId } of findings) findingsByRule[ruleId]! += 1;
  }
  return { ms, evaluations, findingsByRule };
}

function main(): void {
  const generateStarted = performance.now();
  const generated = generate();
  const averageBytes = Math.round(generated.json.reduce((sum, text) => sum + text.length, 0) / EVENTS);
  const spanMinutes = EVENTS / RATE / 60;
  console.log(
    `input: ${EVENTS.toLocaleString('en')} events, ${KEYS.toLocaleString('en')} keys, ${averageBytes} bytes of JSON on average, ` +
      `${RATE} events/s (${((RATE * 60) / KEYS).toFixed(1)} per key per minute) over ${spanMinutes.toFixed(1)} min of event time; ` +
      `batches of ${BATCH}, ${HOT_SHARE * 100}% of events from the five velocity keys, touched keys judged every ${EVALUATE_EVERY} batch(es); engine window ${WINDOW_MS / 60_000} min ` +
      `(generated in ${((performance.now() - generateStarted) / 1000).toFixed(1)} s)`,
  );

  // Warm up on the first 10% (separate engines), then measure the whole input.
  const warm = Math.min(EVENTS, 100_000);
  timeParse(generated.json, warm);
  timeValidation(generated.json, warm);
  for (const variant of VARIANTS) run(generated, warm, variant);

  const parseMs = timeParse(generated.json, EVENTS);
  const validation = timeValidation(generated.json, EVENTS);
  const [engine, whole, upkeep, screens, unscreened] = VARIANTS.map((variant) => run(generated, EVENTS, variant)) as [RunStats, RunStats, RunStats, RunStats, RunStats];
  const perSecond = (ms: number) => Math.round(EVENTS / (ms / 1000)).toLocaleString('en');
  console.log(`JSON.parse of the same events: ${perSecond(parseMs)} events/s (${(parseMs / 1000).toFixed(2)} s)`);
  console.log(
    `engine with the ${RULES.length} rules (DetectionEngine.detect, keys judged every ${EVALUATE_EVERY} batch(es)): ${perSecond(engine.ms)} events/s (${(engine.ms / 1000).toFixed(2)} s); ` +
      `${engine.evaluations.toLocaleString('en')} key evaluations, ${((engine.ms * 1000) / engine.evaluations).toFixed(2)} µs per key judged (all rules, upkeep included)`,
  );
  console.log(`ratio engine / JSON.parse (time): ${(engine.ms / parseMs).toFixed(2)} (goal: <= 1)`);
  const compare = (label: string, stats: RunStats) =>
    console.log(
      `  ${label}: ${perSecond(stats.ms)} events/s, ${((stats.ms * 1000) / stats.evaluations).toFixed(2)} µs per key evaluation, ` +
        `ratio to JSON.parse ${(stats.ms / parseMs).toFixed(2)}`,
    );
  console.log(
    `validation of the same events as Kafka batches (validateBatch: rows to store, events to detect; the analysis thread's other work): ` +
      `${perSecond(validation.ms)} events/s, ratio to JSON.parse ${(validation.ms / parseMs).toFixed(2)} (${validation.refused} refused as carrying a secret)`,
  );
  console.log('for comparison, the same engine and traffic:');
  compare('admission and enrichment timed too (DetectionEngine.process)', whole);
  compare('upkeep alone (keys, eventId dedup, windows; no rules)', upkeep);
  compare('upkeep and the five screens, no rule evaluated (the rest of the engine\'s cost is evaluate)', screens);
  compare('rules without their screens (every rule reads every touched window)', unscreened);
  const same = JSON.stringify(engine.findingsByRule) === JSON.stringify(unscreened.findingsByRule);
  console.log(`evaluations with findings: ${JSON.stringify(engine.findingsByRule)} (${same ? 'the same' : 'NOT the same'} without screens)`);
  console.log(`peak RSS: ${Math.round(process.resourceUsage().maxRSS / 1024)} MB`);
}

main();
