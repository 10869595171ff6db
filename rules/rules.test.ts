/**
 * The rule harness: every fixture of every rule in RULES, and a meta-test over the rule files.
 * A rule is judged on what a user would see (how many findings, their severity, the evidence that
 * explains them) and on the contract of src/detect/types.ts: pure, deterministic, no wall time, no
 * mutation of its input, explained findings.
 */
import { readdirSync } from 'node:fs';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { ACTIONS, ANOMALY_TYPES, SEVERITIES, type Finding, type KeyWindow, type RuleDefinition, type WindowEvent } from '../src/detect/types.ts';
import { keyWindow, MINUTE, spread, T0, type RuleFixture } from './fixtures.ts';
import { RULES } from './index.ts';
import { networkOf } from './network.ts';

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

/** Evaluates with the wall clock set to `wallClock`, so a rule that reads it gives itself away. */
function evaluateAt(rule: AnyRule, window: KeyWindow, fixture: RuleFixture, wallClock: number): Finding[] {
  vi.useFakeTimers({ toFake: ['Date'], now: wallClock });
  try {
    return rule.evaluate(window, { ...rule.defaults, ...fixture.params } as AnyRule['defaults'], fixture.now);
  } finally {
    vi.useRealTimers();
  }
}

afterEach(() => {
  vi.useRealTimers();
});

describe('rule fixtures', () => {
  it.each(cases)('$label', ({ rule, fixture }) => {
    const pristine = structuredClone(fixture.window);
    const frozen = deepFreeze(structuredClone(fixture.window));
    const findings = evaluateAt(rule, frozen, fixture, Date.UTC(1999, 0, 1));

    // Deterministic, independent of the wall clock, and the input is left as it was.
    expect(evaluateAt(rule, structuredClone(pristine), fixture, Date.UTC(2042, 5, 15))).toEqual(findings);
    expect(frozen).toEqual(pristine);

    expect(findings).toHaveLength(fixture.expect.findings);
    if (fixture.expect.severity) for (const finding of findings) expect(finding.severity).toBe(fixture.expect.severity);
    if (fixture.expect.evidence) expect(findings[0]?.evidence).toMatchObject(fixture.expect.evidence);
    if (fixture.expect.title) expect(findings[0]?.title).toMatch(fixture.expect.title);
    if (fixture.expect.summary) expect(findings[0]?.summary).toMatch(fixture.expect.summary);

    const eventIds = new Set(fixture.window.events.map((e) => e.eventId));
    const timestamps = fixture.window.events.map((e) => e.timestamp);
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

  it.each(rules.map((rule) => ({ id: rule.id, rule })))('$id overrides only parameters it declares', ({ id, rule }) => {
    for (const fixture of fixturesByRule.get(id) ?? []) {
      for (const name of Object.keys(fixture.params ?? {})) expect(Object.keys(rule.defaults), fixture.name).toContain(name);
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

describe('rule screens', () => {
  type Screen = NonNullable<AnyRule['screen']>;
  const screened = cases.map((c) => ({ ...c, screen: c.rule.screen as Screen }));

  /** The screen's tally after `events` arrive in the given order, and `gone` (older ones) arrive and leave first. */
  function tallyOf(screen: Screen, events: readonly WindowEvent[], gone: readonly WindowEvent[] = []): unknown {
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
    const params = { ...rule.defaults, ...fixture.params } as AnyRule['defaults'];
    const findings = rule.evaluate(fixture.window, params, fixture.now);
    const { events } = fixture.window;
    const verdicts = [tallyOf(screen, events), tallyOf(screen, shuffled(events)), tallyOf(screen, events, earlier(events))].map((tally) =>
      screen.mayFire(tally, params, fixture.now),
    );
    if (findings.length > 0) expect(verdicts).toEqual([true, true, true]);
    // The same window judges the same way, however its events arrived.
    expect(new Set(verdicts).size).toBe(1);
  });

  // A screen that always said "may fire" would pass the test above and spare nothing.
  it.each(rules.map((rule) => ({ id: rule.id, rule })))('$id screens ordinary traffic out', ({ rule }) => {
    const screen = rule.screen as Screen;
    const window = keyWindow(spread(120, T0 - 60 * MINUTE, 60 * MINUTE, (i) => ({ status: i % 10 === 0 ? 404 : 201 })));
    expect(screen.mayFire(tallyOf(screen, window.events), rule.defaults, T0)).toBe(false);
  });
});
