/**
 * The rule harness: every fixture of every rule in RULES, and a meta-test over the rule files.
 * A rule is judged on what a user would see (how many findings, their severity, the evidence that
 * explains them) and on the contract of src/detect/types.ts: pure, deterministic, no wall time, no
 * mutation of its input, explained findings.
 */
import { readdirSync } from 'node:fs';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { ACTIONS, ANOMALY_TYPES, SEVERITIES, type Finding, type KeyWindow, type RuleDefinition, type RuleScreen, type WindowEvent } from '../src/detect/types.ts';
import { keyWindow, MINUTE, perMinute, spread, T0, type EventSpec, type RuleFixture } from './fixtures.ts';
import { RULES } from './index.ts';
import { DetectionConfig } from '../src/detect/detection-config.ts';
import { defaultsFor } from '../src/detect/engine.ts';
import { networkOf, sprayNetworkOf } from './network.ts';
import { rule as credentialSharing } from './credential_sharing.ts';
import { rule as highFailureRate } from './high_failure_rate.ts';
import { rule as velocityAttack } from './velocity_attack.ts';
import { prng } from '../test/support/random.ts';

type AnyRule = RuleDefinition<Record<string, number | string | boolean | readonly string[]>, unknown>;

const rules = RULES as readonly AnyRule[];
const RULE_FILE = /^[a-z_]+\.ts$/;
const SUPPORT_FILES = new Set(['index.ts', 'fixtures.ts', 'network.ts']);
const ruleFiles = readdirSync(new URL('.', import.meta.url))
  .filter((name) => RULE_FILE.test(name) && !SUPPORT_FILES.has(name))
  .map((name) => name.slice(0, -'.ts'.length))
  .sort();

const fixturesByRule = new Map<string, RuleFixture[]>();
for (const rule of rules) {
  const module = (await import(`./${rule.id}.fixtures.ts`)) as { fixtures: RuleFixture[] };
  fixturesByRule.set(rule.id, module.fixtures);
}

const cases = rules.flatMap((rule) =>
  (fixturesByRule.get(rule.id) ?? []).map((fixture) => ({ label: `${rule.id} [${fixture.kind}] ${fixture.name}`, rule, fixture })),
);

function deepFreeze<T>(value: T): T {
  if (value !== null && typeof value === 'object' && !Object.isFrozen(value)) {
    Object.freeze(value);
    for (const child of Object.values(value)) deepFreeze(child);
  }
  return value;
}

/** A deep copy of a window's events; its history and dropped requests (objects with methods, read-only to rules) are shared. */
function cloneWindow(window: KeyWindow): KeyWindow {
  const { history, dropped, ...plain } = window;
  const copy: KeyWindow = structuredClone(plain);
  if (history) copy.history = history;
  if (dropped) copy.dropped = dropped;
  return copy;
}

/** Evaluates with the wall clock set to `wallClock`, so a rule that reads it gives itself away. */
function evaluateAt(rule: AnyRule, window: KeyWindow, fixture: RuleFixture, wallClock: number): Finding[] {
  vi.useFakeTimers({ toFake: ['Date'], now: wallClock });
  try {
    return rule.evaluate(window, { ...defaultsFor(rule, window.plan), ...fixture.params } as AnyRule['defaults'], fixture.now);
  } finally {
    vi.useRealTimers();
  }
}

afterEach(() => {
  vi.useRealTimers();
});

describe('rule fixtures', () => {
  it.each(cases)('$label', ({ rule, fixture }) => {
    const pristine = cloneWindow(fixture.window);
    const frozen = deepFreeze(cloneWindow(fixture.window));
    const findings = evaluateAt(rule, frozen, fixture, Date.UTC(1999, 0, 1));

    // Deterministic, independent of the wall clock, and the input is left as it was.
    expect(evaluateAt(rule, cloneWindow(pristine), fixture, Date.UTC(2042, 5, 15))).toEqual(findings);
    expect(frozen).toEqual(pristine);

    expect(findings).toHaveLength(fixture.expect.findings);
    if (fixture.expect.severity) for (const finding of findings) expect(finding.severity).toBe(fixture.expect.severity);
    if (fixture.expect.evidence) expect(findings[0]?.evidence).toMatchObject(fixture.expect.evidence);
    if (fixture.expect.title) expect(findings[0]?.title).toMatch(fixture.expect.title);
    if (fixture.expect.summary) expect(findings[0]?.summary).toMatch(fixture.expect.summary);

    const eventIds = new Set(fixture.window.events.map((e) => e.eventId));
    const timestamps = fixture.window.events.map((e) => e.timestamp);
    // A capped window's requests include those the cap dropped (KeyWindow.dropped, its last 16 minutes).
    const { dropped, cappedAt } = fixture.window;
    for (let minute = Math.floor((cappedAt ?? 0) / MINUTE); dropped && minute > Math.floor((cappedAt ?? 0) / MINUTE) - 16; minute--) {
      if (dropped.count(minute) > 0) timestamps.push(dropped.earliest(minute), dropped.latest(minute));
    }
    for (const finding of findings) {
      expect(finding.title.trim()).not.toBe('');
      expect(finding.title).not.toContain('\n');
      expect(finding.summary.trim()).not.toBe('');
      expect(SEVERITIES).toContain(finding.severity);
      expect(finding.confidence).toBeGreaterThanOrEqual(0);
      expect(finding.confidence).toBeLessThanOrEqual(1);
      expect(finding.scope).not.toBe('');
      if (finding.apiKeyId === null) expect(finding.scope).toMatch(/^ip:/);
      else {
        expect(finding.apiKeyId).toBe(fixture.window.apiKeyId);
        expect(finding.scope).toBe(finding.apiKeyId);
        expect(finding.title).toContain(finding.apiKeyId);
      }
      const { sampleEventIds, windowMs } = finding.evidence;
      expect(sampleEventIds.length).toBeGreaterThan(0);
      expect(sampleEventIds.length).toBeLessThanOrEqual(10);
      for (const id of sampleEventIds) expect(eventIds).toContain(id);
      expect(windowMs).toBeGreaterThan(0);
      expect(finding.firstSeenAt).toBeLessThanOrEqual(finding.lastSeenAt);
      expect(finding.firstSeenAt).toBeGreaterThanOrEqual(Math.min(...timestamps));
      expect(finding.lastSeenAt).toBeLessThanOrEqual(Math.max(...timestamps));
      // Evidence is stored as JSON: no NaN, Infinity or undefined may hide in it.
      expect(JSON.parse(JSON.stringify(finding.evidence))).toEqual(finding.evidence);
    }
  });
});

describe('rule catalogue', () => {
  it('has one rule per anomaly type, ids unique', () => {
    const ids = rules.map((rule) => rule.id);
    expect(new Set(ids).size).toBe(ids.length);
    expect([...ids].sort()).toEqual([...ANOMALY_TYPES].sort());
  });

  it('names every rule file after its rule id, and registers every rule file in RULES', async () => {
    expect(ruleFiles).toEqual(rules.map((rule) => rule.id).sort());
    for (const name of ruleFiles) {
      const module = (await import(`./${name}.ts`)) as { rule?: AnyRule };
      expect(module.rule?.id, `rules/${name}.ts`).toBe(name);
      expect(rules).toContain(module.rule);
    }
  });

  it.each(rules.map((rule) => ({ id: rule.id, rule })))('$id declares its definition completely', ({ rule }) => {
    expect(rule.version).toMatch(/^\d+\.\d+\.\d+$/);
    expect(rule.title.trim()).not.toBe('');
    expect(rule.description.trim()).not.toBe('');
    expect(rule.windowMs).toBeGreaterThan(0);
    expect(rule.falsePositives.length).toBeGreaterThan(0);
    for (const severity of SEVERITIES) expect(ACTIONS).toContain(rule.actions[severity]);
    expect(Object.keys(rule.defaults).length).toBeGreaterThan(0);
  });

  it.each(rules.map((rule) => ({ id: rule.id })))('$id has positive and negative fixtures with unique names', ({ id }) => {
    const fixtures = fixturesByRule.get(id) ?? [];
    expect(fixtures.some((f) => f.kind === 'positive' && f.expect.findings > 0)).toBe(true);
    expect(fixtures.some((f) => f.kind === 'negative' && f.expect.findings === 0)).toBe(true);
    for (const fixture of fixtures) expect(fixture.kind === 'positive', fixture.name).toBe(fixture.expect.findings > 0);
    expect(new Set(fixtures.map((f) => f.name)).size).toBe(fixtures.length);
  });

  it('velocity_attack says it needs a carried limit exactly where a flood carrying none goes unjudged: without a default (enterprise\'s)', () => {
    // Three minutes of 1,000 requests each, none carrying a limit.
    const flood = keyWindow(perMinute([1_000, 1_000, 1_000], T0, { rateLimitPerMinute: 0 }), { plan: 'enterprise' });
    const now = T0 + 3 * MINUTE;
    for (const [defaultLimitPerMinute, needs, fires] of [[0, true, false], [60, false, true], [1_000_000, false, false]] as const) {
      const params = { ...velocityAttack.defaults, defaultLimitPerMinute };
      expect(velocityAttack.needsLimit!(params), `default ${defaultLimitPerMinute}`).toBe(needs);
      expect(velocityAttack.evaluate(flood, params, now).length > 0, `default ${defaultLimitPerMinute}`).toBe(fires);
    }
    expect(velocityAttack.needsLimit!(defaultsFor(velocityAttack, 'enterprise'))).toBe(true);
    expect(velocityAttack.needsLimit!(defaultsFor(velocityAttack, 'business'))).toBe(false);
    expect(rules.filter((rule) => rule.needsLimit).map((rule) => rule.id)).toEqual(['velocity_attack']);
  });

  it.each(rules.map((rule) => ({ id: rule.id, rule })))('$id overrides only parameters it declares, within their ranges', ({ id, rule }) => {
    const asOverride = (params: object) => () => DetectionConfig.parse(JSON.stringify({ plans: { business: { rules: { [id]: params } } } }), RULES);
    // The detection config checks an override's range by its name (…Share, …Minutes): the defaults must pass it too.
    expect(asOverride(rule.defaults)).not.toThrow();
    // And a plan's own defaults, which the engine merges under the config's overrides.
    for (const planDefaults of Object.values(rule.planDefaults ?? {})) expect(asOverride(planDefaults)).not.toThrow();
    for (const fixture of fixturesByRule.get(id) ?? []) {
      for (const name of Object.keys(fixture.params ?? {})) expect(Object.keys(rule.defaults), fixture.name).toContain(name);
      expect(asOverride(fixture.params ?? {}), fixture.name).not.toThrow();
    }
  });
});

describe('networkOf', () => {
  it.each([
    ['203.0.113.77', '203.0.113.0/24'],
    ['10.1.2.3', '10.1.2.0/24'],
    ['2001:db8:1:2:3:4:5:6', '2001:db8:1:2::/64'],
    ['2001:0DB8:0001:0002::1', '2001:db8:1:2::/64'],
    ['2001:db8::1', '2001:db8::/64'],
    ['2001:db8:0:5::9', '2001:db8:0:5::/64'],
    ['0:0:0:7::', '0:0:0:7::/64'],
    ['::1', '::/64'],
    ['fe80::1%eth0', 'fe80::/64'],
    ['::ffff:198.51.100.7', '198.51.100.0/24'],
    ['64:ff9b::192.0.2.1', '64:ff9b::/64'],
    ['2001:db8::1::2', '2001:db8::1::2'],
    ['not an ip', 'not an ip'],
  ])('%s is in %s', (ip, network) => {
    expect(networkOf(ip)).toBe(network);
  });
});

describe('sprayNetworkOf', () => {
  it.each([
    ['203.0.113.0/24', '203.0.113.0/24'],
    ['2001:db8:1:2::/64', '2001:db8:1::/48'],
    ['2001:db8:0:5::/64', '2001:db8::/48'],
    ['2001:db8::/64', '2001:db8::/48'],
    ['0:0:0:7::/64', '::/48'],
    ['::/64', '::/48'],
    ['not an ip', 'not an ip'],
  ])('%s is counted in %s', (network, spray) => {
    expect(sprayNetworkOf(network)).toBe(spray);
  });
});

describe('rule screens', () => {
  type Screen = NonNullable<AnyRule['screen']>;
  const screened = cases.map((c) => ({ ...c, screen: c.rule.screen as Screen }));

  /** The screen's tally after `events` arrive in the given order, and `gone` (older ones) arrive and leave first. */
  function tallyOf<T>(screen: Pick<RuleScreen<never, T>, 'create' | 'add' | 'remove'>, events: readonly WindowEvent[], gone: readonly WindowEvent[] = []): T {
    const tally = screen.create();
    for (const event of gone) screen.add(tally, event);
    for (const event of events) screen.add(tally, event);
    for (const event of gone) screen.remove(tally, event);
    return tally;
  }

  /** The window's events in a different arrival order: odd positions first, then even ones reversed. */
  function shuffled(events: readonly WindowEvent[]): WindowEvent[] {
    return [...events.filter((_, i) => i % 2 === 1), ...events.filter((_, i) => i % 2 === 0).reverse()];
  }

  /** The same events three hours earlier, as history that has left the window since. */
  function earlier(events: readonly WindowEvent[]): WindowEvent[] {
    return events.map((e) => ({ ...e, eventId: `old_${e.eventId}`, timestamp: e.timestamp - 3 * 60 * MINUTE }));
  }

  it('every rule has one', () => {
    for (const rule of rules) expect(rule.screen, rule.id).toBeDefined();
  });

  // The contract: mayFire is false only when evaluate finds nothing. Checked on every fixture, with the
  // window's events arriving in order and out of order, and after older events have come and gone.
  it.each(screened)('$label: the screen lets every finding through', ({ rule, fixture, screen }) => {
    const params = { ...defaultsFor(rule, fixture.window.plan), ...fixture.params } as AnyRule['defaults'];
    const findings = rule.evaluate(fixture.window, params, fixture.now);
    const { events } = fixture.window;
    const verdicts = [tallyOf(screen, events), tallyOf(screen, shuffled(events)), tallyOf(screen, events, earlier(events))].map((tally) =>
      screen.mayFire(tally, params, fixture.now, fixture.window.history, fixture.window.dropped),
    );
    if (findings.length > 0) expect(verdicts).toEqual([true, true, true]);
    // The same window judges the same way, however its events arrived.
    expect(new Set(verdicts).size).toBe(1);
  });

  // The engine counts a tally's entries from what add and remove return, never asking entries() while
  // it runs: the two must agree after every event in and out, in any order, or its memory budget drifts.
  it.each(screened.filter(({ screen }) => screen.entries))('$label: add and remove report the tally\'s entries as they change', ({ fixture, screen }) => {
    const { events } = fixture.window;
    for (const [arriving, leaving] of [
      [events, events],
      [shuffled(events), events],
      [[...earlier(events), ...events], [...shuffled(earlier(events)), ...events]],
    ] as const) {
      const tally = screen.create();
      let counted = 0;
      for (const event of arriving) {
        counted += screen.add(tally, event) || 0;
        expect(counted).toBe(screen.entries!(tally));
      }
      for (const event of leaving) {
        counted -= screen.remove(tally, event) || 0;
        expect(counted).toBe(screen.entries!(tally));
      }
      expect(counted).toBe(0);
    }
  });

  // A screen that always said "may fire" would pass the test above and spare nothing.
  it.each(rules.map((rule) => ({ id: rule.id, rule })))('$id screens ordinary traffic out', ({ rule }) => {
    const screen = rule.screen as Screen;
    const window = keyWindow(spread(120, T0 - 60 * MINUTE, 60 * MINUTE, (i) => ({ status: i % 10 === 0 ? 404 : 201 })));
    expect(screen.mayFire(tallyOf(screen, window.events), rule.defaults, T0)).toBe(false);
  });

  describe('high_failure_rate', () => {
    type Params = typeof highFailureRate.defaults;
    const screen = highFailureRate.screen!;
    const tallyFor = (events: readonly WindowEvent[]) => tallyOf(screen, events);
    /** An event from network n (a /24). */
    const from = (n: number) => ({ ip: `100.64.${n}.7`, network: `100.64.${n}.0/24` });
    const ORDINARY_STATUSES = [200, 201, 201, 201, 422, 429, 503, 403];

    const established = (count: number, now: number) => spread(count, now - 60 * MINUTE, 60 * MINUTE, from(0));
    const knownSince = (specs: readonly EventSpec[]) => ({ history: [{ at: T0 - 3 * 60 * MINUTE, ...from(0) }, ...specs] });

    // A key seen for less than an hour: every network of it is new. A busy one with an ordinary
    // share of failures was read on every batch, as its new networks held enough failures.
    it('screens out a busy young key failing as keys ordinarily do (3% of 1,800 requests from three new networks)', () => {
      const specs = spread(1_800, T0 - 45 * MINUTE, 45 * MINUTE, (i) => ({ ...from(i % 3), status: i % 33 === 0 ? 401 : 201 }));
      const window = keyWindow(specs, { history: specs });
      expect(highFailureRate.evaluate(window, highFailureRate.defaults, T0)).toEqual([]);
      expect(screen.mayFire(tallyFor(window.events), highFailureRate.defaults, T0, window.history)).toBe(false);
    });

    // A network's requests in the minute its horizon starts inside may lie before the start: they
    // bound its judged requests from above, not from below.
    it('lets a new network through whose horizon starts after its successes, inside their minute', () => {
      const now = T0 + 30_000; // the 10 minutes start at 11:50:30
      const specs = [
        ...established(600, now),
        ...spread(40, T0 - 10 * MINUTE, 30_000, from(50)), // 11:50:00-11:50:30, before the horizon
        ...spread(30, now - 10 * MINUTE, 10 * MINUTE, { ...from(50), status: 401 }),
      ];
      const window = keyWindow(specs, knownSince(specs));
      const findings = highFailureRate.evaluate(window, highFailureRate.defaults, now);
      expect(findings.map((f) => [f.severity, f.evidence.judgedBy, f.evidence.judgedRequests])).toEqual([['medium', 'network', 30]]);
      expect(screen.mayFire(tallyFor(window.events), highFailureRate.defaults, now, window.history)).toBe(true);
    });

    it('counts in the new networks\' hour a network whose one request came as the hour began', () => {
      // 100 × 401 (longMinFailures), each from a network of its own, the first right at the hour's start.
      const specs = [...established(6_000, T0), ...spread(100, T0 - 60 * MINUTE, 60 * MINUTE, (i) => ({ ...from(100 + i), status: 401 }))];
      const window = keyWindow(specs, knownSince(specs));
      const findings = highFailureRate.evaluate(window, highFailureRate.defaults, T0);
      expect(findings.map((f) => [f.severity, f.evidence.judgedBy, f.evidence.horizon, f.evidence.signalFailures])).toEqual([['medium', 'new_networks', 'long', 100]]);
      expect(screen.mayFire(tallyFor(window.events), highFailureRate.defaults, T0, window.history)).toBe(true);
    });

    // The contract on random windows: keys young (every network new) and established, failing at
    // their own rate, with strangers (one network, or a pool rotating through many) failing at theirs,
    // quiet spells, and other horizons and thresholds.
    it('says no only when evaluate finds nothing, on random windows', () => {
      const random = prng(11);
      const variants: Partial<Params>[] = [{}, { minRequests: 10, thresholdShare: 0.3 }, { windowMinutes: 5, longWindowMinutes: 30, longMinFailures: 40 }];
      let quiet = 0;
      let screenedOut = 0;
      for (let round = 0; round < 300; round++) {
        const params: Params = { ...highFailureRate.defaults, ...variants[round % variants.length] };
        const pick = <T,>(values: readonly T[]): T => values[Math.floor(random() * values.length)]!;
        const usual = 1 + Math.floor(random() * 4);
        const young = random() < 0.4; // no request before the window: every network is new to the key
        const keyFailing = pick([0, 0.03, 0.1, 0.4, 0.7, 0.95]);
        const strangers = pick([0, 0.05, 0.3]);
        const pool = pick([1, 3, 40, 400]);
        const strangerFailing = pick([0.1, 0.5, 0.9]);
        const gapMs = pick([1_500, 6_000, 30_000]);
        const specs: EventSpec[] = [];
        for (let t = T0 - 70 * MINUTE; t < T0 + MINUTE; ) {
          t += Math.floor(random() * (random() < 0.03 ? 10 * MINUTE : gapMs));
          const stranger = random() < strangers;
          const failing = random() < (stranger ? strangerFailing : keyFailing);
          const status = failing ? pick([401, 404]) : pick(ORDINARY_STATUSES);
          specs.push({ at: t, status, ...from(stranger ? 10 + Math.floor(random() * pool) : Math.floor(random() * usual)) });
        }
        const earlier = young ? [] : Array.from({ length: usual }, (_, n) => ({ at: T0 - 3 * 60 * MINUTE, ...from(n) }));
        const { history, events } = keyWindow(specs, { history: [...earlier, ...specs] });
        for (const now of [T0 - 25 * MINUTE, T0 - 9 * MINUTE - 17_000, T0 - 3 * MINUTE - 1, T0]) {
          const window = { ...keyWindow([]), history, events: events.filter((e) => e.timestamp >= now - 60 * MINUTE && e.timestamp <= now + 2 * MINUTE) };
          const verdict = screen.mayFire(tallyFor(window.events), params, now, history);
          if (highFailureRate.evaluate(window, params, now).length > 0) {
            expect(verdict, `round ${round} at ${now - T0}`).toBe(true);
          } else {
            quiet++;
            if (!verdict) screenedOut++;
          }
        }
      }
      // Most quiet windows are screened out, young keys' too: failures from new networks alone (the
      // screen before per-network counts) let 161 of these 582 through, now 19.
      expect(screenedOut).toBeGreaterThan(quiet * 0.9);
    });
  });

  describe('credential_sharing', () => {
    type Params = typeof credentialSharing.defaults;
    const screen = credentialSharing.screen!;
    const tallyFor = (events: readonly WindowEvent[]) => tallyOf(screen, events);
    const COUNTRIES = ['US', 'IE', 'SG', 'DE', 'JP', 'BR'];
    /** An event from network n (a /24), in country n % countries. */
    const from = (n: number, countries = 3) => ({ ip: `100.64.${n}.7`, network: `100.64.${n}.0/24`, country: COUNTRIES[n % countries]! });

    // A deployment that always calls from six networks in three countries has its window read only
    // when its recent networks outnumber its usual ones, not on every batch for being busy.
    it('screens out a key that always calls from many networks, and lets a jump above its baseline through', () => {
      const usual = spread(3_600, T0 - 60 * MINUTE, 60 * MINUTE, (i) => from(i % 6));
      const steady = keyWindow(usual);
      expect(credentialSharing.evaluate(steady, credentialSharing.defaults, T0)).toEqual([]);
      expect(screen.mayFire(tallyFor(steady.events), credentialSharing.defaults, T0)).toBe(false);

      const jump = keyWindow([...usual, ...spread(60, T0 - 5 * MINUTE, 5 * MINUTE, (i) => from(6 + (i % 20), 6))]);
      expect(credentialSharing.evaluate(jump, credentialSharing.defaults, T0)).toHaveLength(1);
      expect(screen.mayFire(tallyFor(jump.events), credentialSharing.defaults, T0)).toBe(true);
    });

    // The contract on random windows: keys active in some intervals and not others, minutes cut by
    // the intervals' edges, events leaving the window, and other interval lengths.
    it('says no only when evaluate finds nothing, on random windows', () => {
      const random = prng(5);
      let screenedOut = 0;
      let judged = 0;
      for (let round = 0; round < 400; round++) {
        const params: Params = { ...credentialSharing.defaults, ...(round % 3 === 1 ? { intervalMinutes: 7, windowMinutes: 45 } : {}), ...(round % 3 === 2 ? { minNetworks: 3, baselineMultiplier: 1.5 } : {}) };
        const usualNetworks = 1 + Math.floor(random() * 8);
        const specs: EventSpec[] = [];
        for (let t = T0 - 70 * MINUTE; t < T0; ) {
          t += Math.floor(random() * (random() < 0.05 ? 12 * MINUTE : 40_000));
          const burst = t > T0 - 15 * MINUTE && random() < 0.3;
          specs.push({ at: t, ...(burst ? from(10 + Math.floor(random() * 30), 6) : from(Math.floor(random() * usualNetworks))) });
        }
        const { events } = keyWindow(specs);
        // The engine's way: every event added, then the ones before the window's start removed, oldest first.
        const kept = tallyFor(events);
        let first = 0;
        while (events[first]!.timestamp < T0 - 60 * MINUTE) screen.remove(kept, events[first++]!);
        expect(screen.mayFire(kept, params, T0)).toBe(screen.mayFire(tallyFor(events.slice(first)), params, T0));
        for (const now of [T0 - 20 * MINUTE, T0 - 9 * MINUTE - 17_000, T0 - 3 * MINUTE - 1, T0]) {
          const window = { ...keyWindow([]), events: events.filter((e) => e.timestamp >= now - 60 * MINUTE && e.timestamp <= now + 2 * MINUTE) };
          const tally = tallyFor(window.events);
          const verdict = screen.mayFire(tally, params, now);
          if (credentialSharing.evaluate(window, params, now).length > 0) expect(verdict, `round ${round} at ${now - T0}`).toBe(true);
          judged++;
          if (!verdict && tally.countSince(now - params.intervalMinutes * MINUTE) >= Math.max(1, params.minNetworks)) screenedOut++;
        }
      }
      // The baseline's bound did screen windows out that the recent networks alone let through.
      expect(screenedOut).toBeGreaterThan(judged / 20);
    });
  });
});

