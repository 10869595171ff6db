import { describe, expect, it } from 'vitest';
import type { BatchEvent, RequestEvent, UnjudgedEvent } from '../events/request-event.ts';
import { RULES } from '../../rules/index.ts';
import { prng } from '../../test/support/random.ts';
import { PLACES } from '../../rules/fixtures.ts';
import { DetectionConfig } from './detection-config.ts';
import { capWithin, DetectionEngine, HISTORY_ENTRIES_PER_KEY, HISTORY_ENTRY_WEIGHT, KEY_WEIGHT, MIN_EVENTS_PER_KEY, REJUDGE_MS, TALLY_ENTRIES_PER_KEY, TALLY_ENTRY_WEIGHT, WARM_UP_MAX_EVENTS, warmUpLimit, type AnyRule, type EngineLoad } from './engine.ts';
import { eventIdHash } from './event-id-hashes.ts';
import type { GeoLookup } from './geo.ts';
import type { KeyWindow } from './types.ts';

const T0 = Date.UTC(2026, 10, 20, 12, 0, 0);
const HOUR = 3_600_000;
/** The engine's wall clock in these tests: after every synthetic timestamp they use, whatever the date. */
const WALL_CLOCK = () => T0 + 24 * HOUR;

/** Fires when a key has at least `min` events in its window, reporting how many it saw. */
const countingRule: AnyRule = {
  id: 'velocity_attack',
  version: 'test',
  title: 'count',
  description: 'counts events',
  windowMs: 60_000,
  defaults: { min: 3 },
  actions: { low: 'monitor', medium: 'rate_limit', high: 'rate_limit', critical: 'block' },
  falsePositives: [],
  evaluate: (window, params: { min: number }) =>
    window.events.length >= params.min
      ? [
          {
            scope: window.apiKeyId,
            apiKeyId: window.apiKeyId,
            severity: 'medium',
            confidence: 0.5,
            title: `count ${window.events.length}`,
            summary: 's',
            evidence: { count: window.events.length, networks: window.events.map((e) => e.network), sampleEventIds: [], windowMs: 60_000 },
            firstSeenAt: window.events[0]!.timestamp,
            lastSeenAt: window.events.at(-1)!.timestamp,
          },
        ]
      : [],
};

/** What the memory budget bounds, from the engine's load: windows, keys, history entries beyond HISTORY_ENTRIES_PER_KEY per history, tally entries beyond TALLY_ENTRIES_PER_KEY per key. */
function budgetCost(load: EngineLoad): number {
  const histories = load.trackedKeys + load.idleHistories;
  return (
    load.windowEvents +
    KEY_WEIGHT * load.trackedKeys +
    HISTORY_ENTRY_WEIGHT * Math.max(0, load.historyEntries - HISTORY_ENTRIES_PER_KEY * histories) +
    TALLY_ENTRY_WEIGHT * Math.max(0, load.tallyEntries - TALLY_ENTRIES_PER_KEY * load.trackedKeys)
  );
}

const throwingRule: AnyRule = { ...countingRule, id: 'bot_traffic', evaluate: () => { throw new Error('boom'); } };

function event(i: number, overrides: Partial<RequestEvent> = {}): RequestEvent {
  return {
    eventId: `e${i}`,
    timestamp: T0 + i * 1000,
    merchantId: 'm_1',
    plan: 'business',
    apiKeyId: 'pk_live_a',
    environment: 'live',
    ip: `203.0.113.${i}`,
    userAgent: 'okhttp/4.12.0',
    method: 'POST',
    path: '/v1/verify/sessions',
    status: 201,
    responseTimeMs: 50,
    ...overrides,
  };
}

function engine(rules: AnyRule[] = [countingRule], config = new DetectionConfig(), maxWindowEvents?: number, clock = WALL_CLOCK) {
  const errors: string[] = [];
  const detection = new DetectionEngine({
    rules,
    entitledPlans: ['business', 'enterprise'],
    config: () => config,
    onRuleError: (ruleId) => errors.push(ruleId),
    maxWindowEvents,
    clock,
  });
  return { detection, errors };
}

describe('DetectionEngine', () => {
  it('evaluates the keys a batch touched, with networks filled in', () => {
    const { detection } = engine();
    const findings = detection.process([event(1), event(2), event(3)], T0 + 3000);
    expect(findings).toHaveLength(1);
    expect(findings[0]).toMatchObject({ merchantId: 'm_1', ruleId: 'velocity_attack', finding: { apiKeyId: 'pk_live_a' } });
    expect(findings[0]!.finding.evidence.networks).toEqual(['203.0.113.0/24', '203.0.113.0/24', '203.0.113.0/24']);
  });

  it('counts a redelivered eventId once', () => {
    const { detection } = engine();
    expect(detection.process([event(1), event(2), event(1), event(2)], T0)).toHaveLength(0);
  });

  it('counts two ids whose hashes collide as two events', () => {
    // eventIdHash('evt_250487') === eventIdHash('evt_507479'): the engine confirms a hash hit against the events.
    expect(eventIdHash('evt_250487')).toBe(eventIdHash('evt_507479'));
    const { detection } = engine();
    const findings = detection.process([event(1, { eventId: 'evt_250487' }), event(2, { eventId: 'evt_507479' }), event(3), event(1, { eventId: 'evt_250487' })], T0 + 3000);
    expect(findings.map((f) => f.finding.evidence.count)).toEqual([3]);
  });

  it('keeps apart two merchants that use the same apiKeyId', () => {
    const { detection } = engine();
    const findings = detection.process([event(1), event(2, { merchantId: 'm_2' }), event(3), event(4, { merchantId: 'm_2' }), event(5)], T0 + 5000);
    expect(findings.map((f) => [f.merchantId, f.finding.evidence.count])).toEqual([['m_1', 3]]);
    expect(detection.trackedKeys).toBe(2);
  });

  it('forgets the keys of partitions it no longer owns, and keeps those of HTTP', () => {
    const { detection } = engine();
    detection.warm([event(1, { apiKeyId: 'pk_live_p1' })], 1);
    detection.warm([event(2, { apiKeyId: 'pk_live_p2' })], 2);
    detection.warm([event(3, { apiKeyId: 'pk_live_http' })], -1);
    detection.keepPartitions(new Set([1]));
    expect(detection.trackedKeys).toBe(2);
    // pk_live_p2's window is gone: two more events are not three.
    expect(detection.process([event(4, { apiKeyId: 'pk_live_p2' }), event(5, { apiKeyId: 'pk_live_p2' })], T0 + 5000, 2)).toHaveLength(0);
    expect(detection.process([event(6, { apiKeyId: 'pk_live_p1' }), event(7, { apiKeyId: 'pk_live_p1' })], T0 + 7000, 1)).toHaveLength(1);
  });

  it('forgets keys idle for a whole window by their own partition\'s clock, and judges a returning key as before', () => {
    const { detection } = engine();
    const idleKey = (i: number) => event(i, { apiKeyId: 'pk_live_idle', eventId: `idle${i}` });
    const busy = (i: number, partition: number) => event(i, { apiKeyId: `pk_live_busy${partition}`, eventId: `p${partition}e${i}` });
    detection.process([idleKey(0), idleKey(1)], T0 + 1000, 1);
    detection.process([busy(0, 2)], T0, 2);
    // 256 batches later on partition 1, 10 minutes on: pk_live_idle has had nothing for far longer than the 60 s window.
    for (let b = 0; b < 256; b++) detection.process([busy(600 + b, 1)], T0 + (600 + b) * 1000, 1);
    // Gone: pk_live_idle (partition 1's clock moved on); kept: pk_live_busy1, and pk_live_busy2, whose partition's clock did not move.
    expect(detection.trackedKeys).toBe(2);
    // Back with two events: two, not four (the old ones were out of the window either way).
    expect(detection.process([idleKey(900), idleKey(901)], T0 + 901_000, 1)).toHaveLength(0);
    expect(detection.process([idleKey(902)], T0 + 902_000, 1)).toHaveLength(1);
  });

  it('keeps a merchant\'s history of a shared apiKeyId when the other merchant\'s state is forgotten', () => {
    const { detection } = engine();
    detection.process([event(0)], T0, 1); // m_1 first: its state is the apiKeyId's main entry
    for (let b = 1; b <= 256; b++) detection.process([event(0, { merchantId: 'm_2', eventId: `m2e${b}`, timestamp: T0 + 100_000 + b * 100 })], T0 + 100_000 + b * 100, 1);
    // m_1's state went idle and was dropped; m_2 goes on with its window (256 events in the last minute).
    expect(detection.trackedKeys).toBe(1);
    const findings = detection.process([event(0, { merchantId: 'm_2', eventId: 'm2e-next', timestamp: T0 + 126_200 })], T0 + 126_200, 1);
    expect(findings.map((f) => [f.merchantId, f.finding.evidence.count])).toEqual([['m_2', 257]]);
  });

  it('ignores plans that are not entitled', () => {
    const { detection } = engine();
    expect(detection.process([1, 2, 3, 4].map((i) => event(i, { plan: 'pro' })), T0)).toHaveLength(0);
    expect(detection.trackedKeys).toBe(0);
  });

  it('keeps only the longest rule window of history per key', () => {
    const { detection } = engine();
    detection.process([event(1), event(2)], T0);
    // 120 s later: the first two fell out of the 60 s window.
    const findings = detection.process([event(120), event(121)], T0 + 121_000);
    expect(findings).toHaveLength(0);
  });

  it('isolates a rule that throws: the others still run', () => {
    const { detection, errors } = engine([throwingRule, countingRule]);
    const findings = detection.process([event(1), event(2), event(3)], T0);
    expect(findings.map((f) => f.ruleId)).toEqual(['velocity_attack']);
    expect(errors).toEqual(['bot_traffic']);
    expect(detection.ruleErrors).toBe(1);
  });

  it('keeps events dated more than a few minutes ahead of the clock out of the windows, warm-up included, and counts them', () => {
    const { detection } = engine([countingRule], new DetectionConfig(), undefined, () => T0);
    // A producer's clock a day ahead (or a hostile timestamp): stored, but left out of detection.
    detection.warm([event(0, { eventId: 'warm-future', timestamp: T0 + 24 * HOUR })]);
    expect(detection.process([event(1), event(0, { eventId: 'future', timestamp: Date.UTC(2099, 11, 31) })], T0 + 1000)).toHaveLength(0);
    // The key's real events still count (three of them fire), one a little ahead of the clock included.
    const findings = detection.process([event(2), event(0, { eventId: 'skewed', timestamp: T0 + 30_000 })], T0 + 2000);
    expect(findings.map((f) => f.finding.evidence.count)).toEqual([3]);
    expect(detection.load).toMatchObject({ futureEvents: 2, windowEvents: 3 });
  });

  it('counts the judged events that carry no limit where velocity_attack needs one, naming the batch\'s merchants, and no others', () => {
    const velocity = RULES.find((rule) => rule.id === 'velocity_attack')!;
    // m_set has a default limit of its own for the plan; m_ent and m_ent2 rely on enterprise's (none).
    const config = DetectionConfig.parse(JSON.stringify({ merchants: { m_set: { rules: { velocity_attack: { defaultLimitPerMinute: 600 } } } } }));
    const { detection } = engine([velocity], config);
    const enterprise = (i: number, merchantId: string, overrides: Partial<RequestEvent> = {}) =>
      event(i, { plan: 'enterprise', merchantId, apiKeyId: `pk_live_${merchantId}`, ...overrides });
    // Warmed events were counted when they were first judged (before a restart): not again.
    detection.warm([enterprise(0, 'm_ent', { eventId: 'warmed' })]);
    expect(detection.load).toMatchObject({ eventsWithoutLimit: 0, merchantsWithoutLimit: [] });
    detection.process(
      [
        enterprise(1, 'm_ent'),
        enterprise(2, 'm_ent'),
        enterprise(3, 'm_ent', { rateLimitPerMinute: 5_000 }), // carries its limit
        enterprise(4, 'm_set'), // its merchant's default applies
        event(5, { merchantId: 'm_biz', apiKeyId: 'pk_live_biz' }), // business: the plan's 60 applies
        enterprise(6, 'm_ent2'),
        enterprise(7, 'm_ent2', { status: 503 }), // a limit does not count it
      ],
      T0 + 7000,
    );
    expect(detection.load).toMatchObject({ eventsWithoutLimit: 3, merchantsWithoutLimit: ['m_ent', 'm_ent2'] });
    // A repeat counts once; the merchants named are the latest batch's.
    detection.process([enterprise(2, 'm_ent'), enterprise(8, 'm_ent')], T0 + 8000);
    expect(detection.load).toMatchObject({ eventsWithoutLimit: 4, merchantsWithoutLimit: ['m_ent'] });
    // At most five of them.
    detection.process(Array.from({ length: 7 }, (_, k) => enterprise(9 + k, `m_many${k}`)), T0 + 16_000);
    expect(detection.load.eventsWithoutLimit).toBe(11);
    expect(detection.load.merchantsWithoutLimit).toEqual(['m_many0', 'm_many1', 'm_many2', 'm_many3', 'm_many4']);
    // A batch judged in slices (a backlog spanning minutes) names the merchants of all its slices.
    detection.processBatch([enterprise(20, 'm_backlog'), event(200, { merchantId: 'm_biz', apiKeyId: 'pk_live_biz' })], T0 + 200_000);
    expect(detection.load).toMatchObject({ eventsWithoutLimit: 12, merchantsWithoutLimit: ['m_backlog'] });
  });

  it('isolates a rule whose needsLimit throws: reported, taken as no, and the key is judged all the same', () => {
    const throwing: AnyRule = { ...countingRule, needsLimit: () => { throw new Error('boom'); } };
    const { detection, errors } = engine([throwing]);
    const findings = detection.process([event(1, { plan: 'enterprise' }), event(2, { plan: 'enterprise' }), event(3, { plan: 'enterprise' })], T0 + 3000);
    expect(findings.map((f) => f.ruleId)).toEqual(['velocity_attack']);
    expect(errors).toEqual(['velocity_attack']);
    expect(detection.load.eventsWithoutLimit).toBe(0);
  });

  it('never lets an allowlisted key, network or user agent feed a window', () => {
    const config = DetectionConfig.parse(
      JSON.stringify({ allowlist: { ips: ['198.51.100.0/24'], userAgents: ['^uptime-probe'] }, merchants: { m_1: { allowlist: { keys: ['pk_live_ok'] } } } }),
    );
    const { detection } = engine([countingRule], config);
    const fromNetwork = [1, 2, 3].map((i) => event(i, { ip: `198.51.100.${i}` }));
    const fromProbe = [4, 5, 6].map((i) => event(i, { userAgent: 'uptime-probe/1.0' }));
    const fromKey = [7, 8, 9].map((i) => event(i, { apiKeyId: 'pk_live_ok' }));
    expect(detection.process([...fromNetwork, ...fromProbe, ...fromKey], T0)).toHaveLength(0);
  });

  it('takes what a reloaded allowlist covers out of the windows, and forgets a key allowlisted as a whole', () => {
    let config = new DetectionConfig();
    const detection = new DetectionEngine({ rules: [countingRule], entitledPlans: ['business'], config: () => config, clock: WALL_CLOCK });
    const pentest = { ip: '203.0.113.50' };
    const server = { ip: '198.51.100.10' };
    const keyB = (i: number) => event(i, { apiKeyId: 'pk_live_b', eventId: `b${i}`, ...server });
    const first = detection.process([event(1, pentest), event(2, { userAgent: 'uptime-probe/1.0', ...server }), event(3, server), keyB(1), keyB(2), keyB(3)], T0 + 3000);
    expect(first.map((f) => [f.finding.apiKeyId, f.finding.evidence.count])).toEqual([['pk_live_a', 3], ['pk_live_b', 3]]);

    // The file is reloaded: the pentest box, the uptime probe and the key pk_live_b are allowlisted.
    config = DetectionConfig.parse(
      JSON.stringify({ allowlist: { userAgents: ['^uptime-probe/'] }, merchants: { m_1: { allowlist: { ips: ['203.0.113.50'], keys: ['pk_live_b'] } } } }),
    );
    expect(detection.process([event(4, server)], T0 + 4000)).toHaveLength(0); // events 3 and 4: not 4 events
    expect(detection.load).toMatchObject({ trackedKeys: 1, windowEvents: 2, forgottenKeys: 0 });
    const findings = detection.process([event(5, server)], T0 + 5000);
    expect(findings.map((f) => [f.finding.apiKeyId, f.finding.evidence.count, f.finding.evidence.networks])).toEqual([['pk_live_a', 3, Array(3).fill('198.51.100.0/24')]]);
    // A reload that allowlists nothing more changes nothing.
    config = DetectionConfig.parse(JSON.stringify({ allowlist: { userAgents: ['^uptime-probe/'] } }));
    expect(detection.process([event(6, server)], T0 + 6000).map((f) => f.finding.evidence.count)).toEqual([4]);
  });

  describe('a rule that keeps finding the same key', () => {
    /** countingRule, counting its evaluations; a second rule that never finds anything, counting its own. */
    function watched() {
      const calls = { counting: 0, other: 0 };
      const counting: AnyRule = { ...countingRule, evaluate: (window, params, now) => (calls.counting++, countingRule.evaluate(window, params, now)) };
      const other: AnyRule = { ...countingRule, id: 'bot_traffic', defaults: { min: 1e9 }, evaluate: (window, params, now) => (calls.other++, countingRule.evaluate(window, params, now)) };
      return { calls, rules: [counting, other] };
    }
    /** One event of `apiKeyId` at `at` ms after T0, judged as of then, on partition 0. */
    const at = (detection: DetectionEngine, ms: number, apiKeyId = 'pk_live_a') =>
      detection.process([event(0, { apiKeyId, eventId: `${apiKeyId}_${ms}`, ip: '203.0.113.7', timestamp: T0 + ms })], T0 + ms, 0);
    const countOf = (findings: ReturnType<DetectionEngine['process']>, ruleId = 'velocity_attack') =>
      findings.filter((f) => f.ruleId === ruleId && f.finding.apiKeyId === 'pk_live_a').map((f) => f.finding.evidence.count);

    it('judges it again at most every REJUDGE_MS, each other rule as before', () => {
      const { calls, rules } = watched();
      const { detection } = engine(rules);
      at(detection, 0);
      at(detection, 100);
      // The third event completes the evidence: found at once.
      expect(countOf(at(detection, 200))).toEqual([3]);
      expect(calls.counting).toBe(3);
      // Batches every 100 ms: the rule waits REJUDGE_MS after its finding; the other rule judges every batch.
      for (let ms = 300; ms < 200 + REJUDGE_MS; ms += 100) expect(countOf(at(detection, ms))).toEqual([]);
      expect(calls.counting).toBe(3);
      expect(calls.other).toBe(3 + (REJUDGE_MS - 100) / 100);
      // The wait is over: every event that arrived meanwhile is in the finding.
      expect(countOf(at(detection, 200 + REJUDGE_MS))).toEqual([3 + REJUDGE_MS / 100]);
      expect(calls.counting).toBe(4);
    });

    it('judges what arrived during the wait once it is over, without new events of the key', () => {
      const { detection } = engine();
      at(detection, 0);
      at(detection, 100);
      expect(countOf(at(detection, 200))).toEqual([3]);
      expect(countOf(at(detection, 300))).toEqual([]);
      // pk_live_a gets nothing more; another key's batch on its partition, after the wait, judges it.
      const later = at(detection, 200 + REJUDGE_MS, 'pk_live_b');
      expect(countOf(later)).toEqual([4]);
      // Judged once: the next batch does not report it again.
      expect(countOf(at(detection, 300 + REJUDGE_MS, 'pk_live_b'))).toEqual([]);
    });

    it("judges it so on a batch of events of a plan not judged, handed as UnjudgedEvents (validation's stand-ins) or whole", () => {
      const after = (last: BatchEvent) => {
        const { detection } = engine();
        for (const ms of [0, 100, 200, 300]) at(detection, ms);
        return countOf(detection.processBatch([last], WALL_CLOCK(), 0));
      };
      const timestamp = T0 + 200 + REJUDGE_MS;
      const whole = event(9, { plan: 'pro', apiKeyId: 'pk_live_pro', timestamp });
      const standIn: UnjudgedEvent = { plan: 'pro', timestamp, unjudged: true };
      expect(after(whole)).toEqual([4]);
      expect(after(standIn)).toEqual([4]);
      // Of an entitled plan (validation makes none), it still enters no window.
      expect(after({ ...standIn, plan: 'business', timestamp: T0 + 400 })).toEqual([]);
    });

    it('judges what arrived during the wait once it is over when no batch comes at all (judgeDue), as of the wait\'s end', () => {
      const nows: number[] = [];
      const { detection } = engine([{ ...countingRule, evaluate: (window, params, now) => (nows.push(now), countingRule.evaluate(window, params, now)) }]);
      at(detection, 0);
      at(detection, 100);
      expect(countOf(at(detection, 200))).toEqual([3]);
      expect(countOf(at(detection, 300))).toEqual([]);
      expect(detection.nextDeferredDue()).toBe(T0 + 200 + REJUDGE_MS);
      expect(detection.judgeDue(T0 + 199 + REJUDGE_MS)).toEqual([]);
      // The ingest goes quiet: nothing more arrives, on any partition.
      expect(countOf(detection.judgeDue(T0 + 10_000))).toEqual([4]);
      expect(nows.at(-1)).toBe(T0 + 200 + REJUDGE_MS);
      // Judged once: nothing waits any more.
      expect(detection.nextDeferredDue()).toBeUndefined();
      expect(detection.judgeDue(T0 + 20_000)).toEqual([]);
    });

    it('leaves judgeDue the keys of a partition still taking batches: its batches judge them', () => {
      const { detection } = engine();
      at(detection, 0);
      at(detection, 100);
      expect(countOf(at(detection, 200))).toEqual([3]);
      expect(countOf(at(detection, 300))).toEqual([]);
      expect(detection.judgeDue(T0 + 10_000, (partition) => partition !== 0)).toEqual([]);
      expect(detection.nextDeferredDue()).toBe(T0 + 200 + REJUDGE_MS); // still waiting, for a batch or a quiet partition
      expect(countOf(detection.judgeDue(T0 + 10_000, () => true))).toEqual([4]);
    });

    it('leaves a waiting key to batches of its own partition, and forgets it with the partition', () => {
      const { calls, rules } = watched();
      const { detection } = engine(rules);
      for (const ms of [0, 100, 200, 300]) at(detection, ms);
      expect(calls.counting).toBe(3);
      const onPartition1 = (ms: number) => detection.process([event(0, { apiKeyId: 'pk_live_z', eventId: `z${ms}`, timestamp: T0 + ms })], T0 + ms, 1);
      // The wait is over, but partition 1's batches (another clock) leave pk_live_a alone.
      expect(countOf(onPartition1(1_000))).toEqual([]);
      expect(calls.counting).toBe(4); // pk_live_z's own
      detection.keepPartitions(new Set([1]));
      // Partition 0 is gone, and pk_live_a with it: a new batch on it does not judge the forgotten key.
      expect(countOf(at(detection, 1_200, 'pk_live_b'))).toEqual([]);
      expect(calls.counting).toBe(5); // pk_live_b's own
    });

    it('does not wait after an evaluation that found nothing, nor for a batch judged as of an earlier time', () => {
      const { calls, rules } = watched();
      const { detection } = engine([rules[0]!]);
      for (const ms of [0, 100]) at(detection, ms);
      expect(countOf(at(detection, 200))).toEqual([3]);
      // 61 s on: the window holds one event, nothing found, so the next one is judged at once.
      expect(countOf(at(detection, 61_200))).toEqual([]);
      at(detection, 61_300);
      expect(countOf(at(detection, 61_400))).toEqual([3]);
      // A batch judged as of an earlier time than the finding (another clock) is not held back.
      expect(countOf(detection.process([event(0, { eventId: 'older', ip: '203.0.113.7', timestamp: T0 + 61_350 })], T0 + 61_350, 0))).toEqual([4]);
      expect(calls.counting).toBe(7);
    });
  });

  describe('memory budget', () => {
    /** `count` events of one key, all inside the 60 s window, ending at `end`. */
    const burst = (apiKeyId: string, count: number, end = T0 + 50_000) =>
      Array.from({ length: count }, (_, i) => event(0, { apiKeyId, eventId: `${apiKeyId}_${i}`, ip: '203.0.113.7', timestamp: end - count + 1 + i }));
    const counts = (findings: ReturnType<DetectionEngine['process']>) => Object.fromEntries(findings.map((f) => [f.finding.apiKeyId, f.finding.evidence.count]));

    it('caps the busiest keys\' windows first, keeping their newest events and every small key whole', () => {
      const { detection } = engine([countingRule], new DetectionConfig(), 2_000);
      const small = Array.from({ length: 20 }, (_, k) => burst(`pk_live_small${k}`, 10)).flat();
      detection.process([...burst('pk_live_busy', 3_000), ...small], T0 + 50_000);
      const load = detection.load;
      // 90% of the budget: 20 small keys of 10 events, 21 keys' tallies, and what is left for the busy key.
      const busyKept = 1_800 - 200 - 21 * KEY_WEIGHT;
      expect(load).toMatchObject({ windowEvents: 200 + busyKept, trackedKeys: 21, eventsPerKeyCap: busyKept, shedEvents: 3_000 - busyKept, forgottenKeys: 0 });
      // The next batch sees the busy key's newest events only, and every small key's ten.
      // (Each key fired at T0 + 50 s: the next look is REJUDGE_MS later.)
      const findings = detection.process([event(0, { apiKeyId: 'pk_live_busy', eventId: 'next', ip: '203.0.113.7', timestamp: T0 + 50_600 })], T0 + 50_600);
      expect(counts(findings)).toEqual({ pk_live_busy: busyKept });
      expect(counts(detection.process([event(0, { apiKeyId: 'pk_live_small3', eventId: 'x', ip: '203.0.113.7', timestamp: T0 + 50_700 })], T0 + 50_700))).toEqual({ pk_live_small3: 11 });
    });

    it('forgets the keys seen least recently when capping windows is not enough', () => {
      const { detection } = engine([countingRule], new DetectionConfig(), 1_000);
      // 100 keys of 3 events (2,300 against a budget of 1,000), the later keys more recent.
      detection.process(Array.from({ length: 100 }, (_, k) => burst(`pk_live_${k}`, 3, T0 + 1_000 + k * 100)).flat(), T0 + 11_000);
      const { trackedKeys, windowEvents, forgottenKeys } = detection.load;
      expect(windowEvents + KEY_WEIGHT * trackedKeys).toBeLessThanOrEqual(900);
      expect(trackedKeys + forgottenKeys).toBe(100);
      expect(trackedKeys).toBe(Math.floor(900 / (3 + KEY_WEIGHT)));
      // The most recent keys are the ones kept: pk_live_99 has its three events, pk_live_0 none.
      expect(counts(detection.process([event(0, { apiKeyId: 'pk_live_99', eventId: 'n99', ip: '203.0.113.7', timestamp: T0 + 11_600 })], T0 + 11_600))).toEqual({ pk_live_99: 4 });
      expect(counts(detection.process([event(0, { apiKeyId: 'pk_live_0', eventId: 'n0', ip: '203.0.113.7', timestamp: T0 + 11_700 })], T0 + 11_700))).toEqual({});
    });

    it('lets the cap grow back once the windows are well under budget', () => {
      const { detection } = engine([countingRule], new DetectionConfig(), 2_000);
      detection.process(burst('pk_live_busy', 3_000), T0 + 50_000, 1);
      const capped = detection.load.eventsPerKeyCap;
      expect(capped).toBeLessThan(detection.load.maxEventsPerKey);
      detection.keepPartitions(new Set([2])); // the busy key moves to another replica
      expect(detection.load.windowEvents).toBe(0);
      for (let b = 0; b < 10; b++) detection.process([event(0, { apiKeyId: 'pk_live_other', eventId: `o${b}`, timestamp: T0 + 50_000 + b })], T0 + 50_000 + b, 2);
      expect(detection.load.eventsPerKeyCap).toBe(detection.load.maxEventsPerKey);
    });

    /** `networks` events of one key, one from each of as many networks, ending at `end`. */
    const wide = (apiKeyId: string, networks: number, end: number) =>
      Array.from({ length: networks }, (_, n) => event(0, { apiKeyId, eventId: `${apiKeyId}_${n}`, ip: `198.51.${n}.7`, timestamp: end - networks + 1 + n }));

    it('counts keys\' history entries against the budget: keys seen from many networks stay within it', () => {
      const { detection } = engine([countingRule], new DetectionConfig(), 2_000);
      for (let k = 0; k < 100; k++) {
        detection.process(wide(`pk_live_wide${k}`, 40, T0 + k * 500), T0 + k * 500);
        expect(budgetCost(detection.load)).toBeLessThanOrEqual(2_000);
      }
      // A key's 40 events, KEY_WEIGHT and 38 networks beyond HISTORY_ENTRIES_PER_KEY (0.37 each): about 74, so at most 27 fit.
      const { trackedKeys, idleHistories, forgottenKeys, shedEvents } = detection.load;
      expect(trackedKeys).toBeLessThanOrEqual(27);
      expect(trackedKeys + forgottenKeys).toBe(100);
      expect(idleHistories).toBeLessThan(forgottenKeys);
      expect(shedEvents).toBe(0);
    });

    it('sheds idle keys\' histories, the longest idle first, before any tracked key\'s events', () => {
      const { detection } = engine([countingRule], new DetectionConfig(), 2_000);
      // 10 keys of 50 events from one network: 700 of the budget.
      detection.process(Array.from({ length: 10 }, (_, k) => burst(`pk_live_${k}`, 50)).flat(), T0 + 50_000);
      // What storage remembers of 100 other keys, idle, 40 networks each: 100 x 38 x 0.37, about 1,400 more.
      const remembered = (k: number) => Array.from({ length: 40 }, (_, n) => ({ merchantId: 'm_1', apiKeyId: `pk_live_idle${k}`, ip: `198.51.${n}.${k}`, first: T0 - HOUR, last: T0 - HOUR + 1000 }));
      for (let k = 0; k < 100; k++) detection.recall(remembered(k), k < 50 ? 1 : 2);
      detection.process([event(0, { apiKeyId: 'pk_live_0', eventId: 'next', ip: '203.0.113.7', timestamp: T0 + 50_001 })], T0 + 50_001);
      const load = detection.load;
      expect(budgetCost(load)).toBeLessThanOrEqual(2_000);
      expect(load).toMatchObject({ trackedKeys: 10, windowEvents: 501, eventsPerKeyCap: load.maxEventsPerKey, shedEvents: 0, forgottenKeys: 0 });
      const shed = 100 - load.idleHistories;
      expect(shed).toBeGreaterThan(0);
      expect(shed).toBeLessThan(50);
      expect(load.shedHistories).toBe(shed);
      // Those shed were recalled first: partition 1's; partition 2 keeps its 50.
      detection.keepPartitions(new Set([2]));
      expect(detection.load.idleHistories).toBe(50);
    });

    it('counts the rules\' tally entries against the budget: a botnet sending every request from a new network and place stays within it', () => {
      // Every address its own network, at its own point on the map.
      const everywhere: GeoLookup = {
        lookup: (ip) => {
          const [a, b, c] = ip.split('.').map(Number) as [number, number, number];
          return { latitude: -60 + ((b * 256 + c) % 1200) / 10, longitude: -170 + a + Math.floor((b * 256 + c) / 1200) / 10, accuracyKm: 20, country: 'US' };
        },
      };
      const budget = 4_000;
      const detection = new DetectionEngine({ rules: [...RULES], entitledPlans: ['business'], geo: everywhere, config: () => new DetectionConfig(), maxWindowEvents: budget, clock: WALL_CLOCK });
      for (let b = 0; b < 20; b++) {
        const batch = Array.from({ length: 500 }, (_, j) => {
          const n = b * 500 + j;
          return event(n, { apiKeyId: `pk_live_bot${n % 5}`, ip: `${11 + (n >> 16)}.${(n >> 8) & 255}.${n & 255}.7`, timestamp: T0 + n * 100 });
        });
        detection.process(batch, T0 + (b * 500 + 499) * 100);
        expect(budgetCost(detection.load)).toBeLessThanOrEqual(budget);
        // Kept from what the screens' add and remove return, through events shed and keys forgotten.
        expect(detection.load.tallyEntries).toBe(detection.recountTallyEntries());
      }
      // The tallies hold about two entries per window event (a network and a place), which the windows make room for.
      const { windowEvents, tallyEntries, shedEvents } = detection.load;
      expect(tallyEntries).toBeGreaterThan(windowEvents);
      expect(windowEvents).toBeLessThan(budget / 2);
      expect(shedEvents).toBeGreaterThan(0);
    });

    it('finds the highest cap that fits', () => {
      expect(capWithin([1_000, 500, 50], 700, 5_000)).toBe(325);
      expect(capWithin([1_000, 500, 50], 10_000, 5_000)).toBe(5_000);
      expect(capWithin([1_000, 1_000], 10, 5_000)).toBe(MIN_EVENTS_PER_KEY);
      expect(capWithin([1_000], 10, 50)).toBe(50);
    });
  });

  it('merges plan and merchant parameter overrides over the defaults', () => {
    const config = DetectionConfig.parse(
      JSON.stringify({ plans: { business: { rules: { velocity_attack: { min: 10 } } } }, merchants: { m_2: { rules: { velocity_attack: { min: 2 } } } } }),
    );
    const { detection } = engine([countingRule], config);
    expect(detection.process([1, 2, 3].map((i) => event(i)), T0)).toHaveLength(0); // plan raised it to 10
    expect(detection.process([1, 2].map((i) => event(i, { merchantId: 'm_2', eventId: `x${i}` })), T0)).toHaveLength(1);
  });

  it('refuses an invalid config naming the field', () => {
    expect(() => DetectionConfig.parse(JSON.stringify({ allowlist: { ips: ['not-an-ip'] } }))).toThrow(/allowlist\.ips\.0/);
    expect(() => DetectionConfig.parse(JSON.stringify({ allowlist: { userAgents: ['('] } }))).toThrow(/userAgents/);
  });

  it('refuses overrides the rules would silently ignore, naming each one', () => {
    const parse = (input: unknown) => () => DetectionConfig.parse(JSON.stringify(input), RULES);
    expect(parse({ merchants: { m_1: { rules: { velocity_attack: { thresholdRatoi: 3 } } } } })).toThrow(/merchants\.m_1\.rules\.velocity_attack\.thresholdRatoi: unknown parameter \(parameters: windowMinutes, /);
    expect(parse({ merchants: { m_1: { rules: { velocity: { thresholdRatio: 3 } } } } })).toThrow(/merchants\.m_1\.rules\.velocity: unknown rule/);
    expect(parse({ plans: { buisness: { rules: {} } } })).toThrow(/plans\.buisness: unknown plan/);
    expect(parse({ plans: { business: { rules: { velocity_attack: { thresholdRatio: '3' } } } } })).toThrow(/plans\.business\.rules\.velocity_attack\.thresholdRatio: must be a number/);
    expect(parse({ plans: { business: { rules: { credential_sharing: { windowMinutes: 120 } } } } })).toThrow(/windowMinutes: at most 60/);
    expect(parse({ plans: { business: { rules: { high_failure_rate: { longWindowMinutes: 90 } } } } })).toThrow(/high_failure_rate\.longWindowMinutes: at most 60/);
    // Values no rule could mean: a percentage for a share, a negative count, a fraction of a minute.
    expect(parse({ merchants: { m_1: { rules: { high_failure_rate: { thresholdShare: 50 } } } } })).toThrow(/high_failure_rate\.thresholdShare: must be a share from 0 to 1 \(0\.5 is half\), not 50/);
    expect(parse({ merchants: { m_1: { rules: { high_failure_rate: { minRequests: -1 } } } } })).toThrow(/minRequests: must not be negative/);
    expect(parse({ merchants: { m_1: { rules: { credential_sharing: { intervalMinutes: 2.5 } } } } })).toThrow(/intervalMinutes: must be a whole number of minutes/);
    expect(parse({ merchants: { m_1: { rules: { velocity_attack: { windowMinutes: 0 } } } } })).toThrow(/windowMinutes: must be a whole number of minutes, at least 1/);
    // Every problem at once, so one edit fixes the file.
    expect(parse({ plans: { buisness: {} }, merchants: { m_1: { rules: { velocity: {}, velocity_attack: { x: 1 } } } } })).toThrow(/buisness.*; .*velocity: unknown rule.*; .*velocity_attack\.x: unknown/);
    // What the rules accept still loads, and is merged.
    const config = DetectionConfig.parse(JSON.stringify({ plans: { enterprise: { rules: { velocity_attack: { thresholdRatio: 2, windowMinutes: 60 }, high_failure_rate: { thresholdShare: 1, minRequests: 0 } } } } }), RULES);
    expect(config.parameters('velocity_attack', RULES[0]!.defaults, 'enterprise', 'm_1')).toMatchObject({ thresholdRatio: 2, windowMinutes: 60 });
  });
});

describe('DetectionEngine with the rules of rules/', () => {
  const places = Object.values(PLACES);
  const geo: GeoLookup = {
    // 10.x addresses are private (no geo); 100.<place>.x.y is at that place.
    lookup: (ip) => (ip.startsWith('100.') ? places[Number(ip.split('.')[1]) % places.length]!.geo : undefined),
  };

  type Profile = 'ordinary' | 'failing' | 'busy' | 'travelling' | 'shared' | 'bot' | 'regions';
  const PROFILES: Profile[] = ['ordinary', 'failing', 'busy', 'travelling', 'shared', 'bot', 'regions'];

  /**
   * Two hours of traffic from keys near every rule's thresholds: failure shares around 50%, rates
   * around 1.5x the limit, hops between near and far places, many networks, attack tools and
   * headless browsers; events arrive up to two minutes late, some twice, in batches of any size.
   */
  function traffic(seed: number): RequestEvent[][] {
    const random = prng(seed);
    const pick = <T>(items: readonly T[]): T => items[Math.floor(random() * items.length)]!;
    const keys = Array.from({ length: 42 }, (_, k) => ({ k, profile: PROFILES[k % PROFILES.length]!, home: k % places.length, share: 0.3 + random() * 0.4 }));
    const events: RequestEvent[] = [];
    let clock = T0;
    for (let i = 0; events.length < 50_000; i++) {
      clock += Math.floor(random() * 1800);
      const key = pick(keys);
      // Busy keys now and then send bursts above their limit of 60 a minute, a request every 250 ms to
      // 1.25 s, some for minutes; failing keys call more often.
      const burst = key.profile === 'busy' ? (random() < 0.25 ? 100 + Math.floor(random() * 150) : 1) : key.profile === 'failing' ? 3 : 1;
      const gap = key.profile === 'busy' ? 250 + Math.floor(random() * 1_000) : 250;
      for (let b = 0; b < burst; b++) {
        const late = random() < 0.05 ? Math.floor(random() * 120_000) : 0;
        let place = key.home;
        if (key.profile === 'travelling' && random() < 0.1) place = Math.floor(random() * places.length);
        if (key.profile === 'regions') place = random() < 0.5 ? key.home : (key.home + 4) % places.length;
        const network = key.profile === 'shared' && random() < 0.5 ? Math.floor(random() * 40) : key.k;
        const failing = (key.profile === 'failing' || key.profile === 'bot') && random() < key.share;
        events.push({
          eventId: `e${i}_${b}`,
          timestamp: clock + b * gap - late,
          merchantId: `m_${key.k % 3}`,
          plan: key.k % 5 === 0 ? 'enterprise' : 'business',
          apiKeyId: `pk_live_${key.k}`,
          environment: 'live',
          ip: random() < 0.05 ? `10.0.${key.k}.${i % 4}` : `100.${place}.${network}.${i % 3}`,
          userAgent: key.profile === 'bot' && random() < 0.3 ? pick(['sqlmap/1.8', 'HeadlessChrome/120', 'Scrapy/2.11']) : pick(['okhttp/4.12.0', 'python-requests/2.32']),
          method: 'GET',
          path: key.profile === 'bot' ? `/v1/verify/sessions/ses_${Math.floor(random() * 200)}` : '/v1/verify/sessions',
          status: failing ? pick([401, 403, 404]) : pick([200, 201, 201, 422, 429, 503]),
          responseTimeMs: 40,
          // Two busy keys have a low limit (20), so that their bursts go over it even in a window capped at 100 events.
          ...(key.k % 4 === 0 ? { rateLimitPerMinute: pick([40, 60, 100]) } : key.profile === 'busy' && key.k % 3 === 0 ? { rateLimitPerMinute: 20 } : {}),
        });
      }
      // A redelivery now and then.
      if (random() < 0.02) events.push({ ...events[Math.floor(random() * events.length)]! });
    }
    const batches: RequestEvent[][] = [];
    for (let start = 0; start < events.length; ) {
      const size = 1 + Math.floor(random() * 150);
      batches.push(events.slice(start, start + size));
      start += size;
    }
    return batches;
  }

  // Overrides move the thresholds and windows so the screens are checked away from the defaults too.
  const config = DetectionConfig.parse(
    JSON.stringify({
      merchants: {
        m_1: { rules: { velocity_attack: { thresholdRatio: 1.2, windowMinutes: 3 }, high_failure_rate: { windowMinutes: 7, minRequests: 12, thresholdShare: 0.45 } } },
        m_2: { rules: { impossible_travel: { recentMinutes: 4, windowMinutes: 30 }, credential_sharing: { minNetworks: 3, minCountries: 1 }, bot_traffic: { minDistinctResources: 15 } } },
      },
    }),
  );

  function engineWith(rules: AnyRule[], maxWindowEvents?: number) {
    return new DetectionEngine({ rules, entitledPlans: ['business', 'enterprise'], geo, config: () => config, maxEventsPerKey: 300, maxWindowEvents, clock: WALL_CLOCK });
  }

  // Traffic 6 and 7 run over a memory budget (42 keys' tallies and about 3,000 events), so the tallies
  // are checked to follow windows that lose events to the per-key cap and keys that are forgotten.
  it.each([
    [1, undefined],
    [2, undefined],
    [3, undefined],
    [4, undefined],
    [5, undefined],
    [6, 4_000],
    [7, 2_500],
  ])('finds exactly what evaluating every rule on every window finds (traffic %i, budget %s)', (seed, maxWindowEvents) => {
    const screened = engineWith([...RULES], maxWindowEvents);
    // Every window read, every time: the screens keep their tallies (whose entries count against
    // the budget alike, so both engines shed the same events) but never say no.
    const unscreened = engineWith(
      RULES.map((rule) => ({ ...rule, screen: { ...rule.screen, mayFire: () => true } }) as AnyRule),
      maxWindowEvents,
    );
    const fired = new Set<string>();
    for (const batch of traffic(seed)) {
      // As the analysis thread does: the batch is judged as of its newest event.
      const now = Math.max(...batch.map((e) => e.timestamp));
      const expected = unscreened.process(batch, now);
      expect(screened.process(batch, now)).toEqual(expected);
      for (const finding of expected) fired.add(finding.ruleId);
    }
    // The traffic does make every rule fire.
    expect([...fired].sort()).toEqual(RULES.map((rule) => rule.id).sort());
    expect(screened.ruleErrors).toBe(0);
    if (maxWindowEvents !== undefined) expect(screened.load.shedEvents).toBeGreaterThan(0);
  });

  describe('test keys', () => {
    const sqlmap = 'sqlmap/1.7.2#stable (https://sqlmap.org)';
    /** One sqlmap request from each key (critical for a live key), the merchant m_1 unless given. */
    function judged(config: DetectionConfig, keys: { apiKeyId: string; merchantId?: string; environments: RequestEvent['environment'][] }[]) {
      const detection = new DetectionEngine({ rules: [...RULES], entitledPlans: ['business'], geo, config: () => config, clock: WALL_CLOCK });
      let i = 0;
      const batch = keys.flatMap(({ apiKeyId, merchantId = 'm_1', environments }) =>
        environments.map((environment) => event(i++, { apiKeyId, merchantId, environment, userAgent: sqlmap, ip: '100.0.7.7' })),
      );
      return new Map(detection.process(batch, T0 + 60_000).map(({ finding }) => [finding.apiKeyId, finding]));
    }

    it('reports a test key\'s finding at low, saying what it was judged and why, and a live key\'s as judged', () => {
      const findings = judged(new DetectionConfig(), [
        { apiKeyId: 'pk_test_qa', environments: ['test', 'test'] },
        { apiKeyId: 'pk_live_prod', environments: ['live'] },
        // A key one event calls live is judged as live.
        { apiKeyId: 'pk_mixed', environments: ['test', 'live', 'test'] },
      ]);
      const test = findings.get('pk_test_qa')!;
      expect(test.severity).toBe('low');
      expect(test.evidence).toMatchObject({ keyEnvironment: 'test', judgedSeverity: 'critical', category: 'attack_tool' });
      expect(test.summary).toMatch(/ Reported as low, not critical, because pk_test_qa is a test key: it reaches only mock verifications/);
      for (const key of ['pk_live_prod', 'pk_mixed']) {
        expect(findings.get(key)!.severity).toBe('critical');
        expect(findings.get(key)!.evidence).not.toHaveProperty('keyEnvironment');
      }
    });

    it('takes the ceiling from the merchant, else its plan, else the file', () => {
      const config = DetectionConfig.parse(
        JSON.stringify({ testKeys: { maxSeverity: 'medium' }, plans: { business: { testKeys: { maxSeverity: 'high' } } }, merchants: { m_2: { testKeys: { maxSeverity: 'critical' } } } }),
        RULES,
      );
      const findings = judged(config, [
        { apiKeyId: 'pk_test_1', environments: ['test'] },
        { apiKeyId: 'pk_test_2', merchantId: 'm_2', environments: ['test'] },
      ]);
      expect(findings.get('pk_test_1')).toMatchObject({ severity: 'high', evidence: { keyEnvironment: 'test', judgedSeverity: 'critical' } });
      // At or under the ceiling: marked as a test key's, nothing lowered.
      expect(findings.get('pk_test_2')!.severity).toBe('critical');
      expect(findings.get('pk_test_2')!.evidence).toMatchObject({ keyEnvironment: 'test' });
      expect(findings.get('pk_test_2')!.evidence).not.toHaveProperty('judgedSeverity');
      expect(findings.get('pk_test_2')!.summary).not.toMatch(/Reported as/);
      expect(config.testKeyMaxSeverity('enterprise', 'm_1')).toBe('medium');
      expect(new DetectionConfig().testKeyMaxSeverity('business', 'm_1')).toBe('low');
    });

    it('refuses a ceiling that is not a severity, naming the field', () => {
      expect(() => DetectionConfig.parse(JSON.stringify({ merchants: { m_1: { testKeys: { maxSeverity: 'none' } } } }), RULES)).toThrow(/merchants\.m_1\.testKeys\.maxSeverity: /);
      expect(() => DetectionConfig.parse(JSON.stringify({ testKeys: { max: 'low' } }), RULES)).toThrow(/testKeys: .*max/);
    });
  });

  it('judges a backlog batch a minute at a time, so attacks early in it alert as they would have live', () => {
    const MINUTE = 60_000;
    const at = (t: number, i: number, overrides: Partial<RequestEvent> = {}) => event(i, { timestamp: t, ip: '100.0.7.7', ...overrides });
    // A partition catching up on 20 minutes in one fetch: 3 minutes of key A at 300 a minute
    // (limit 60), one sqlmap request from key B, 100 requests of key C answered 401, then ordinary
    // traffic of other keys up to minute 20, the batch in offset order (a few events late).
    const batch: RequestEvent[] = [];
    let i = 0;
    for (let m = 0; m < 3; m++) for (let j = 0; j < 300; j++) batch.push(at(T0 + m * MINUTE + j * 200, i++, { apiKeyId: 'pk_live_flood' }));
    batch.push(at(T0 + 4 * MINUTE, i++, { apiKeyId: 'pk_live_tool', userAgent: 'sqlmap/1.7.2#stable (https://sqlmap.org)' }));
    for (let j = 0; j < 100; j++) batch.push(at(T0 + 5 * MINUTE + j * 100, i++, { apiKeyId: 'pk_live_guess', status: 401 }));
    for (let m = 0; m <= 20; m++) batch.push(at(T0 + m * MINUTE, i++, { apiKeyId: `pk_live_quiet_${m}` }));
    batch.push(at(T0 + 2 * MINUTE, i++, { apiKeyId: 'pk_live_late' }));
    const plain = () => new DetectionEngine({ rules: [...RULES], entitledPlans: ['business'], geo, config: () => new DetectionConfig(), clock: WALL_CLOCK });
    const detection = plain();
    const fired = detection.processBatch(batch, WALL_CLOCK()).map((finding) => `${finding.ruleId} ${finding.finding.apiKeyId}`);
    expect(new Set(fired)).toEqual(new Set(['velocity_attack pk_live_flood', 'bot_traffic pk_live_tool', 'high_failure_rate pk_live_guess']));
    // A batch within a minute is judged once, as process() judges it.
    const live = plain();
    const tool = [at(T0, 0, { apiKeyId: 'pk_live_tool', userAgent: 'Nikto/2.5.0' }), at(T0 + 30_000, 1)];
    const once = plain().process(tool, T0 + 10_000);
    expect(once.map((finding) => finding.ruleId)).toEqual(['bot_traffic']);
    expect(live.processBatch(tool, T0 + 10_000)).toEqual(once);
    expect(live.processBatch([], T0)).toEqual([]);
  });

  it('keeps the screens right when a reloaded allowlist takes events out of a window', () => {
    let config = new DetectionConfig();
    const make = (rules: AnyRule[]) => new DetectionEngine({ rules, entitledPlans: ['business'], geo, config: () => config, clock: WALL_CLOCK });
    const screened = make([...RULES]);
    const unscreened = make(RULES.map(({ screen: _screen, ...rule }) => rule as AnyRule));
    const both = (batch: RequestEvent[], now: number) => {
      const findings = screened.process(batch, now);
      expect(findings).toEqual(unscreened.process(batch, now));
      return findings.map((f) => f.ruleId);
    };
    // The merchant's pentest box runs Nuclei and sqlmap with a live key, among the key's ordinary traffic from Ashburn, then Tokyo.
    const tool = (i: number, userAgent: string) => event(i, { ip: '203.0.113.50', userAgent, status: 401 });
    const ordinary = (i: number, place = '100.0.1.1') => event(i, { ip: place, eventId: `o${i}` });
    expect(both([ordinary(1), tool(2, 'Nuclei - Open-source project (github.com/projectdiscovery/nuclei)'), tool(3, 'sqlmap/1.8.4#stable (https://sqlmap.org)'), ordinary(4)], T0 + 4000)).toEqual(['bot_traffic']);
    // The admin allowlists the box; the key's next ordinary request no longer finds the tools.
    config = DetectionConfig.parse(JSON.stringify({ merchants: { m_1: { allowlist: { ips: ['203.0.113.0/24'] } } } }));
    expect(both([ordinary(60)], T0 + 60_000)).toEqual([]);
    expect(screened.load.tallyEntries).toBe(screened.recountTallyEntries());
    expect(both([ordinary(600, `100.${places.length - 1}.2.2`)], T0 + 600_000)).toEqual(['impossible_travel']);
  });

  describe('requests answered 401 (a key\'s id named without its secret)', () => {
    const MINUTE = 60_000;
    /** `perMinute` requests a minute for `minutes` minutes up to T0, from the address, answered `status`. */
    const requests = (name: string, perMinute: number, minutes: number, overrides: Partial<RequestEvent>) =>
      Array.from({ length: perMinute * minutes }, (_, i) =>
        event(0, { eventId: `${name}_${i}`, merchantId: 'm_9', apiKeyId: 'pk_live_v', timestamp: T0 - minutes * MINUTE + Math.floor((i * MINUTE) / perMinute), ...overrides }),
      );
    const judgedFindings = (events: RequestEvent[], rule: string, detection = engineWith([...RULES])) =>
      detection
        .process(events.sort((a, b) => a.timestamp - b.timestamp), T0)
        .filter((found) => found.ruleId === rule)
        .map(({ finding }) => finding);
    const judged = (events: RequestEvent[], rule: string, detection?: DetectionEngine) =>
      judgedFindings(events, rule, detection).map((finding) => ({ severity: finding.severity, keyHolderSeverity: finding.keyHolderSeverity }));

    it('gives a finding the severity of the requests that passed authentication alone, null when they show nothing', () => {
      const sqlmap = 'sqlmap/1.8.4#stable (https://sqlmap.org)';
      expect(judged(requests('tool', 1, 1, { userAgent: sqlmap, status: 401, ip: '100.0.9.9' }), 'bot_traffic')).toEqual([{ severity: 'critical', keyHolderSeverity: null }]);
      // No 401 in the window: nothing to take apart.
      expect(judged(requests('tool', 1, 1, { userAgent: sqlmap, status: 400, ip: '100.0.9.9' }), 'bot_traffic')).toEqual([{ severity: 'critical', keyHolderSeverity: undefined }]);
      // A stranger's flood of wrong secrets beside the owner's 30 requests a minute; then a thief holding the secret, with a few 401s.
      const owner = requests('owner', 30, 4, { status: 201, ip: '100.0.7.7' });
      expect(judged([...owner, ...requests('stranger', 300, 4, { status: 401, ip: '100.1.9.9' })], 'velocity_attack')).toEqual([{ severity: 'high', keyHolderSeverity: null }]);
      expect(judged([...requests('thief', 300, 4, { status: 201, ip: '100.1.9.9' }), ...requests('guess', 5, 4, { status: 401, ip: '100.2.9.9' })], 'velocity_attack')).toEqual([
        { severity: 'high', keyHolderSeverity: 'high' },
      ]);
    });

    it('says when the holders\' own requests end, which 401s after them do not move', () => {
      // The thief's sqlmap request passed authentication 5 minutes before T0; a stranger's sqlmap, answered 401, goes on up to T0.
      const sqlmap = 'sqlmap/1.8.4#stable (https://sqlmap.org)';
      const thief = requests('thief', 1, 5, { userAgent: sqlmap, status: 201, ip: '100.1.9.9' }).slice(0, 1);
      const [found] = judgedFindings([...thief, ...requests('guess', 2, 4, { userAgent: sqlmap, status: 401, ip: '100.2.9.9' })], 'bot_traffic');
      expect(found).toMatchObject({ severity: 'critical', keyHolderSeverity: 'critical', keyHolderLastSeenAt: T0 - 5 * MINUTE });
      expect(found!.lastSeenAt).toBeGreaterThan(T0 - MINUTE);
      // No holders' finding, no time.
      const [refused] = judgedFindings(requests('tool', 1, 1, { userAgent: sqlmap, status: 401, ip: '100.0.9.9' }), 'bot_traffic');
      expect(refused).not.toHaveProperty('keyHolderLastSeenAt');
    });

    it('leaves out the 401s the per-key cap dropped, counted by minute', () => {
      // 700 a minute is more than the window holds of the key (300): velocity counts what the cap dropped.
      const flood = [...requests('owner', 30, 4, { status: 201, ip: '100.0.7.7' }), ...requests('stranger', 700, 4, { status: 401, ip: '100.1.9.9' })];
      expect(judged(flood, 'velocity_attack')).toEqual([{ severity: 'critical', keyHolderSeverity: null }]);
    });
  });

  // An operator whose fleet sends no RateLimit-Limit for enterprise keys, whose limit is 600, says so
  // with defaultLimitPerMinute; events that carried no limit are judged against it, and a limit an
  // event carried still wins, the plan's 60 too. Without it, enterprise limits are custom: not judged.
  // The engine merges the rule's plan defaults (RuleDefinition.planDefaults) under the config's.
  describe('velocity_attack\'s defaultLimitPerMinute, for events without a RateLimit-Limit', () => {
    const MINUTE = 60_000;
    const withConfig = (json: unknown) =>
      new DetectionEngine({ rules: [...RULES], entitledPlans: ['business', 'enterprise'], geo, config: () => DetectionConfig.parse(JSON.stringify(json), RULES), clock: WALL_CLOCK });
    const ENTERPRISE_AT_600 = { plans: { enterprise: { rules: { velocity_attack: { defaultLimitPerMinute: 600 } } } } };
    /** 200 requests a minute for `minutes` minutes from `from`, by an enterprise key. */
    const flood = (key: string, from: number, minutes: number, overrides: Partial<RequestEvent> = {}) => {
      const events: RequestEvent[] = [];
      for (let m = 0; m < minutes; m++) {
        for (let i = 0; i < 200; i++) events.push(event(0, { eventId: `${key}_${from}_${m}_${i}`, apiKeyId: key, plan: 'enterprise', timestamp: from + m * MINUTE + i * 300, ip: '100.0.7.7', ...overrides }));
      }
      return events;
    };
    const velocity = (detection: DetectionEngine, events: RequestEvent[]) =>
      events.flatMap((e) => detection.processBatch([e], WALL_CLOCK())).filter((finding) => finding.ruleId === 'velocity_attack');

    it('judges 200/min against the override when set; an enterprise key without one is not judged, another plan\'s against its 60', () => {
      expect(velocity(withConfig({}), flood('pk_live_default', T0, 3))).toEqual([]);
      expect(velocity(withConfig(ENTERPRISE_AT_600), flood('pk_live_ent', T0, 3))).toEqual([]);
      expect(velocity(withConfig({ plans: { enterprise: { rules: { velocity_attack: { defaultLimitPerMinute: 100 } } } } }), flood('pk_live_ent100', T0, 3)).length).toBeGreaterThan(0);
      // Other plans keep the default.
      expect(velocity(withConfig(ENTERPRISE_AT_600), flood('pk_live_biz', T0, 3, { plan: 'business' })).length).toBeGreaterThan(0);
      expect(velocity(withConfig({}), flood('pk_live_biz2', T0, 3, { plan: 'business' })).length).toBeGreaterThan(0);
    });

    it('takes a carried limit as the key\'s, the plan\'s 60 too, over the override', () => {
      // A RateLimit-Limit the fleet did send is the key's limit: 200/min is twice 100, and over three times 60.
      const limits = (limit: number) =>
        velocity(withConfig(ENTERPRISE_AT_600), flood('pk_live_custom', T0, 3, { rateLimitPerMinute: limit })).map((found) => found.finding.evidence.limitPerMinute);
      expect(limits(100)).toContain(100);
      expect(limits(60)).toContain(60);
    });
  });

  // high_failure_rate through the engine, whose history of the key decides which networks are new.
  describe('high_failure_rate\'s networks new to the key, and its hour', () => {
    const MINUTE = 60_000;
    const DAY = 24 * HOUR;
    const detect = () => new DetectionEngine({ rules: [...RULES], entitledPlans: ['business'], geo, config: () => new DetectionConfig(), clock: () => T0 + 2 * DAY });
    /** The key's own traffic: `perMinute` requests a minute from its usual address (Ashburn) for `minutes`. */
    const own = (from: number, minutes: number, perMinute: number, overrides: Partial<RequestEvent> = {}) =>
      Array.from({ length: minutes * perMinute }, (_, i) => event(0, { eventId: `own_${from}_${i}`, timestamp: from + Math.floor((i * MINUTE) / perMinute), ip: '100.0.7.7', ...overrides }));
    const failures = (detection: DetectionEngine, events: RequestEvent[]) => {
      const sorted = [...events].sort((a, b) => a.timestamp - b.timestamp);
      const found: string[] = [];
      // Batches of a second, as the analysis thread takes them.
      for (let start = 0; start < sorted.length; ) {
        let end = start + 1;
        while (end < sorted.length && sorted[end]!.timestamp - sorted[start]!.timestamp < 1000) end++;
        const batch = sorted.slice(start, end);
        for (const { ruleId, finding } of detection.processBatch(batch, batch.at(-1)!.timestamp)) if (ruleId === 'high_failure_rate') found.push(`${finding.severity} ${finding.evidence.judgedBy} ${finding.evidence.horizon}`);
        start = end;
      }
      return found;
    };
    const TODAY = T0 + DAY;

    it('finds a stranger guessing the secret slowly (25 × 401 every 10 minutes) among the key\'s 100 requests a minute, and not the key alone', () => {
      const yesterday = own(T0, 60, 10);
      const today = own(TODAY, 60, 100);
      const stranger = Array.from({ length: 150 }, (_, i) => event(0, { eventId: `guess_${i}`, timestamp: TODAY + i * 24_000, ip: '100.4.9.9', status: 401 }));
      expect(failures(detect(), [...yesterday, ...today])).toEqual([]);
      const found = failures(detect(), [...yesterday, ...today, ...stranger]);
      expect(found.length).toBeGreaterThan(0);
      expect(new Set(found)).toEqual(new Set(['medium network long']));
    });

    it('finds a stranger walking ids among the key\'s successes, but not the merchant\'s second site (seen yesterday) doing the same', () => {
      const walk = (ip: string) => Array.from({ length: 400 }, (_, i) => event(0, { eventId: `walk_${ip}_${i}`, timestamp: TODAY + 50 * MINUTE + i * 1500, ip, method: 'GET', path: '/v1/verify/sessions/:id', status: 404 }));
      const yesterday = [...own(T0, 60, 10), ...own(T0, 60, 2, { ip: '100.2.8.8', eventId: undefined })].map((e, i) => ({ ...e, eventId: `y${i}` }));
      const today = own(TODAY, 60, 120);
      expect(failures(detect(), [...yesterday, ...today, ...walk('100.2.8.8')])).toEqual([]);
      const found = failures(detect(), [...yesterday, ...today, ...walk('100.4.9.9')]);
      expect(found).toContain('high network short');
    });
  });

  describe('a key\'s history beyond its window', () => {
    const DAY = 24 * HOUR;
    const historyEngine = () =>
      new DetectionEngine({ rules: [...RULES], entitledPlans: ['business'], geo, config: () => new DetectionConfig(), clock: () => T0 + 30 * DAY });

    /** A ten-minute job from six networks at six places in five countries (US twice), judged a minute at a time; the rules that fired. */
    function job(detection: DetectionEngine, start: number, partition = 1): string[] {
      const events = Array.from({ length: 120 }, (_, i) => event(0, { eventId: `job${start}_${i}`, timestamp: start + i * 5000, ip: `100.${i % 6}.${i % 6}.1` }));
      const fired = new Set<string>();
      for (let s = 0; s < events.length; s += 12) {
        const batch = events.slice(s, s + 12);
        for (const { ruleId } of detection.process(batch, batch.at(-1)!.timestamp, partition)) fired.add(ruleId);
      }
      return [...fired].sort();
    }

    /** Another key's traffic on the partition, from `from`: enough batches for the engine to look for idle keys. */
    function otherTraffic(detection: DetectionEngine, from: number, partition = 1): void {
      for (let b = 0; b < 300; b++) {
        const at = from + b * 1000;
        detection.process([event(0, { apiKeyId: 'pk_live_other', eventId: `other${at}`, timestamp: at, ip: '10.0.0.1' })], at, partition);
      }
    }

    it('remembers a daily job\'s networks and places while the key is idle, for seven days', () => {
      const detection = historyEngine();
      // The first run is new: six networks in five countries, hops of thousands of km in seconds.
      expect(job(detection, T0)).toEqual(['credential_sharing', 'impossible_travel']);
      otherTraffic(detection, T0 + 2 * HOUR);
      expect(detection.trackedKeys).toBe(1); // the job's key left memory with its window
      // The next day the same job is the key's own habit.
      expect(job(detection, T0 + DAY)).toEqual([]);
      // After more than seven days without it, the job is new again.
      otherTraffic(detection, T0 + DAY + 2 * HOUR);
      otherTraffic(detection, T0 + 9 * DAY);
      expect(job(detection, T0 + 9 * DAY + HOUR)).toEqual(['credential_sharing', 'impossible_travel']);
    });

    it('keeps at most one idle key\'s history per 10 events of the memory budget, forgetting the longest idle first', () => {
      const detection = new DetectionEngine({ rules: [...RULES], entitledPlans: ['business'], geo, config: () => new DetectionConfig(), clock: () => T0 + 30 * DAY, maxWindowEvents: 20_000 });
      for (let k = 0; k < 3_000; k++) detection.process([event(0, { apiKeyId: `pk_live_k${k}`, eventId: `k${k}`, timestamp: T0 + k, ip: `100.1.${k % 250}.1` })], T0 + k, 1);
      otherTraffic(detection, T0 + 2 * HOUR);
      expect(detection.load).toMatchObject({ trackedKeys: 1, idleHistories: 2_000 });
      // The last 2,000 keys to go idle kept theirs: pk_live_k2999 knows its network; pk_live_k0 does not.
      const known = (k: number) => {
        const job = [event(0, { apiKeyId: `pk_live_k${k}`, eventId: `again${k}`, timestamp: T0 + DAY, ip: `100.1.${k % 250}.1` })];
        detection.process(job, T0 + DAY, 1);
        return detection.load.idleHistories;
      };
      expect(known(2_999)).toBe(1_999); // taken back into its new window's state
      expect(known(0)).toBe(1_999); // nothing to take back
    });

    it('keeps its counts of history and tally entries equal to a recount as histories grow, expire, move between key and idle, and go', () => {
      const detection = new DetectionEngine({ rules: [...RULES], entitledPlans: ['business'], geo, config: () => new DetectionConfig(), clock: () => T0 + 30 * DAY, maxWindowEvents: 5_000 });
      const recounted = () => {
        expect(detection.load.historyEntries).toBe(detection.recountHistoryEntries());
        expect(detection.load.tallyEntries).toBe(detection.recountTallyEntries());
      };
      const sighting = (apiKeyId: string, ip: string, last: number) => ({ merchantId: 'm_1', apiKeyId, ip, first: last - 600_000, last });
      // 1,100 keys of one network on partition 2 (over the cap of 1,000 idle keys), 60 of 300 networks on partition 1 (over the budget).
      detection.recall(Array.from({ length: 1_100 }, (_, k) => sighting(`pk_live_one${k}`, `100.1.${k % 250}.1`, T0 - DAY)), 2);
      recounted();
      detection.recall(Array.from({ length: 60 * 300 }, (_, i) => sighting(`pk_live_many${i % 60}`, `100.${i % 14}.${Math.floor(i / 60)}.1`, T0 - DAY)), 1);
      recounted();
      // pk_live_a's job from six networks at six places the day before, and a network last used eight days before.
      detection.recall([...Array.from({ length: 6 }, (_, p) => sighting('pk_live_a', `100.${p}.${p}.9`, T0 - DAY)), sighting('pk_live_a', '100.7.7.9', T0 - 8 * DAY)], 1);
      recounted();
      // pk_live_a's job: its idle history taken back by its new window's key.
      job(detection, T0);
      recounted();
      // A key seen from 400 networks, trimmed to the latest ones (idle histories shed to make room).
      detection.process(Array.from({ length: 400 }, (_, n) => event(0, { apiKeyId: 'pk_live_wide', eventId: `wide${n}`, timestamp: T0 + HOUR + n, ip: `100.${n % 14}.${n % 250}.${n % 3}` })), T0 + HOUR + 400, 1);
      recounted();
      // Their windows dropped (the histories go idle), pk_live_a's network of eight days before forgotten.
      otherTraffic(detection, T0 + 2 * HOUR);
      recounted();
      // Partition 2's key and idle histories go.
      detection.process([event(0, { apiKeyId: 'pk_live_p2', eventId: 'p2', timestamp: T0 + 3 * HOUR, ip: '100.3.3.3' })], T0 + 3 * HOUR, 2);
      detection.keepPartitions(new Set([1]));
      recounted();
      // Seven days later, the idle histories are forgotten.
      otherTraffic(detection, T0 + 9 * DAY);
      recounted();
    });

    it('warms the history from what storage remembers, and forgets it with the partition', () => {
      // Yesterday's run of the job, each network recorded as vouched for a minute in.
      const sightings = Array.from({ length: 6 }, (_, p) => ({ merchantId: 'm_1', apiKeyId: 'pk_live_a', ip: `100.${p}.${p}.9`, first: T0 - DAY, last: T0 - DAY + 600_000, vouched: T0 - DAY + 60_000 }));
      const warmed = historyEngine();
      warmed.recall(sightings, 1);
      expect(job(warmed, T0)).toEqual([]);
      // Without the records only the first recalled is the key's: the other five are new to it.
      const unrecorded = historyEngine();
      unrecorded.recall(sightings.map(({ vouched: _, ...sighting }) => sighting), 1);
      expect(job(unrecorded, T0)).toEqual(['credential_sharing', 'impossible_travel']);
      // Another merchant's key of the same id has a history of its own.
      const other = historyEngine();
      other.recall(sightings.map((s) => ({ ...s, merchantId: 'm_2' })), 1);
      expect(job(other, T0)).toEqual(['credential_sharing', 'impossible_travel']);
      // A replica that no longer owns the partition drops the history with it.
      const moved = historyEngine();
      moved.recall(sightings, 1);
      moved.keepPartitions(new Set([2]));
      expect(job(moved, T0, 2)).toEqual(['credential_sharing', 'impossible_travel']);
    });
  });

  describe('what the histories vouch for', () => {
    const DAY = 24 * HOUR;
    const historyEngine = () =>
      new DetectionEngine({ rules: [...RULES], entitledPlans: ['business'], geo, config: () => new DetectionConfig(), clock: () => T0 + 30 * DAY });
    const at = (timestamp: number, ip: string, apiKeyId = 'pk_live_v') => event(0, { apiKeyId, eventId: `v${apiKeyId}${timestamp}${ip}`, timestamp, ip });

    it('hands over each place vouched for once a day it is used, with its key and partition, and what a thief does while the key is idle not at all', () => {
      const detection = historyEngine();
      // Ashburn (the key's first place), Dublin 10 minutes later (tied to it), Ashburn again: two records.
      detection.process([at(T0, '100.0.1.10'), at(T0 + 10 * 60_000, '100.3.1.10'), at(T0 + 11 * 60_000, '100.0.1.10')], T0 + 11 * 60_000, 4);
      expect(detection.takeVouched()).toEqual([
        { merchantId: 'm_1', apiKeyId: 'pk_live_v', partition: 4, network: '100.0.1.0/24', at: T0 },
        { merchantId: 'm_1', apiKeyId: 'pk_live_v', partition: 4, network: '100.3.1.0/24', at: T0 + 10 * 60_000 },
      ]);
      expect(detection.takeVouched()).toEqual([]);
      // Later the same day: nothing new. Moscow hours later, while the key is idle: not vouched for.
      detection.process([at(T0 + HOUR, '100.0.1.10'), at(T0 + HOUR + 60_000, '100.3.1.10'), at(T0 + 5 * HOUR, '100.8.1.10')], T0 + 5 * HOUR, 4);
      expect(detection.takeVouched()).toEqual([]);
      // The next day, Ashburn again: recorded again.
      detection.process([at(T0 + DAY, '100.0.1.10')], T0 + DAY, 4);
      expect(detection.takeVouched()).toEqual([{ merchantId: 'm_1', apiKeyId: 'pk_live_v', partition: 4, network: '100.0.1.0/24', at: T0 + DAY }]);
    });
  });

  // A key's history built as in production (one batch per event, every rule): a thief's lone
  // request while the key is idle must not make his place the key's own; a job's fresh egress /24s
  // in its own cities must not look like sharing; a leak that grows must not become its own baseline.
  describe('the rules reading a key\'s history, fed one event at a time', () => {
    const DAY = 24 * HOUR;
    const MINUTE = 60_000;
    // 100.<p>.x.y is at places[p]: 0 Ashburn, 3 Dublin, 8 Moscow, 10 Singapore, ...
    const ASHBURN = '100.0.1.10';
    const MOSCOW = '100.8.1.10';
    const historyEngine = () =>
      new DetectionEngine({ rules: [...RULES], entitledPlans: ['business'], geo, config: () => new DetectionConfig(), clock: () => T0 + 30 * DAY });
    let seq = 0;
    const at = (timestamp: number, ip: string) => event(0, { eventId: `h${++seq}`, timestamp, ip });
    /** Each event in its own batch, in time order; the rules that fired, with when. */
    function run(detection: DetectionEngine, events: RequestEvent[]): { ruleId: string; at: number; title: string }[] {
      const fired: { ruleId: string; at: number; title: string }[] = [];
      for (const e of [...events].sort((a, b) => a.timestamp - b.timestamp)) {
        for (const { ruleId, finding } of detection.process([e], e.timestamp)) fired.push({ ruleId, at: e.timestamp, title: finding.title });
      }
      return fired;
    }
    type Fired = { ruleId: string; at: number; title: string };
    const travel = (fired: Fired[]) => fired.filter((f) => f.ruleId === 'impossible_travel');
    const sharing = (fired: Fired[]) => fired.filter((f) => f.ruleId === 'credential_sharing');
    const minutes = (from: number, to: number, ip: string) => Array.from({ length: Math.round((to - from) / MINUTE) }, (_, m) => at(from + m * MINUTE, ip));

    it('reports a thief whose first request fell while the owner was idle, when both use the key a minute apart the next morning', () => {
      const events = [...minutes(T0 - DAY, T0 - DAY + 8 * HOUR, ASHBURN), at(T0 - 6 * HOUR, MOSCOW), ...minutes(T0, T0 + 40 * MINUTE, ASHBURN), at(T0 + 20 * MINUTE + 30_000, MOSCOW)];
      const fired = travel(run(historyEngine(), events));
      expect(fired.length).toBeGreaterThan(0);
      expect(fired[0]).toMatchObject({ at: T0 + 20 * MINUTE + 30_000, title: expect.stringContaining('Ashburn, US to Moscow, RU') });
    });

    it('reports the thief first after an idle hour as soon as the owner answers, and again 55 minutes later', () => {
      const events = [...minutes(T0 - DAY, T0 - DAY + HOUR, ASHBURN), at(T0, MOSCOW), ...minutes(T0 + 5 * MINUTE, T0 + HOUR, ASHBURN), at(T0 + 55 * MINUTE + 30_000, MOSCOW)];
      const fired = travel(run(historyEngine(), events));
      expect(fired[0]).toMatchObject({ at: T0 + 5 * MINUTE, title: expect.stringContaining('Moscow, RU to Ashburn, US') });
      expect(fired.some((f) => f.at === T0 + 55 * MINUTE + 30_000 && f.title.includes('Ashburn, US to Moscow, RU'))).toBe(true);
    });

    it('stays quiet for a ten-minute daily job alternating between two regions, from its second day', () => {
      const job = (start: number) => Array.from({ length: 60 }, (_, i) => at(start + i * 10_000, i % 2 ? '100.3.1.10' : ASHBURN));
      const detection = historyEngine();
      expect(travel(run(detection, job(T0))).length).toBeGreaterThan(0); // its first run: Dublin is new
      expect(run(detection, job(T0 + DAY))).toEqual([]);
    });

    // A thief's hours while the owner is idle look the same: such a region is judged at its first hop
    // with the key's own (reported once), and is the key's from then on.
    it('reports a region that served alone for hours, while the key\'s other one was idle, at its first hop with it only', () => {
      const alternate = (start: number) => Array.from({ length: 60 }, (_, i) => at(start + i * 30_000, i % 2 ? '100.3.1.10' : ASHBURN));
      const detection = historyEngine();
      const fired = travel(run(detection, [...minutes(T0 - DAY - 12 * HOUR, T0 - DAY - 10 * HOUR, ASHBURN), ...minutes(T0 - DAY - 6 * HOUR, T0 - DAY - 2 * HOUR, '100.3.1.10'), ...alternate(T0)]));
      expect(fired.length).toBeGreaterThan(0);
      expect(fired[0]).toMatchObject({ at: T0 + 30_000, title: expect.stringContaining('Ashburn, US to Dublin, IE') });
      expect(travel(run(detection, alternate(T0 + DAY)))).toEqual([]);
    });

    it('reports a thief who used the key for hours while the owner was idle, when both use it the next morning', () => {
      const events = [
        ...minutes(T0 - DAY, T0 - DAY + 8 * HOUR, ASHBURN),
        at(T0 - 8 * HOUR, MOSCOW),
        at(T0 - 8 * HOUR + 31 * MINUTE, MOSCOW),
        ...minutes(T0 - 6 * HOUR, T0 - 2 * HOUR, MOSCOW),
        ...minutes(T0, T0 + 40 * MINUTE, ASHBURN),
        at(T0 + 20 * MINUTE + 30_000, MOSCOW),
      ];
      const fired = travel(run(historyEngine(), events));
      expect(fired[0]).toMatchObject({ at: T0 + 20 * MINUTE + 30_000, title: expect.stringContaining('Ashburn, US to Moscow, RU') });
    });

    it('alerts on the first night only for a job in three cloud regions whose egress /24s churn every night', () => {
      const detection = historyEngine();
      const regions = [0, 3, 10]; // Ashburn, Dublin, Singapore
      const night = (n: number) => Array.from({ length: 60 }, (_, i) => at(T0 + n * DAY + i * 10_000, `100.${regions[i % 3]}.${n * 2 + (i % 2) + 1}.${(i % 7) + 1}`));
      const perNight = [0, 1, 2].map((n) => sharing(run(detection, night(n))).length > 0);
      expect(perNight).toEqual([true, false, false]);
    });

    it('still reports strangers in other cities beside the churning job', () => {
      const detection = historyEngine();
      const regions = [0, 3, 10];
      const night = (n: number) => Array.from({ length: 60 }, (_, i) => at(T0 + n * DAY + i * 10_000, `100.${regions[i % 3]}.${n * 2 + (i % 2) + 1}.${(i % 7) + 1}`));
      run(detection, night(0));
      // Tokyo, Sydney, Mumbai, São Paulo, Johannesburg, Mexico City: one network each.
      const strangers = [11, 12, 13, 9, 14, 15].flatMap((p, k) => [0, 1, 2].map((r) => at(T0 + DAY + 30_000 + k * 60_000 + r * 1000, `100.${p}.9.${r + 1}`)));
      expect(sharing(run(detection, [...night(1), ...strangers])).length).toBeGreaterThan(0);
    });

    it('reports a key leaked gradually (2 to 7 never-seen networks per 10 minutes in many countries): the leak is not its own baseline', () => {
      const events: RequestEvent[] = [];
      for (let d = 7; d >= 1; d--) events.push(...minutes(T0 - d * DAY, T0 - d * DAY + HOUR, ASHBURN));
      events.push(...minutes(T0, T0 + HOUR, ASHBURN));
      let stranger = 0;
      [2, 3, 4, 5, 6, 7].forEach((count, k) => {
        for (let j = 0; j < count; j++, stranger++) {
          const place = 1 + (stranger % 15); // anywhere but Ashburn: 100.<place>.<stranger>.x
          for (let r = 0; r < 3; r++) events.push(at(T0 + k * 10 * MINUTE + 30_000 + j * 60_000 + r * 1000, `100.${place}.${100 + stranger}.${r + 1}`));
        }
      });
      const fired = sharing(run(historyEngine(), events));
      expect(fired.length).toBeGreaterThan(0);
      expect(fired[0]!.title).toMatch(/new networks in \d+ countries in 60 min, more every interval/);
    });

    it('stays quiet for a mobile carrier\'s addresses churning more every interval, all in one country', () => {
      const events: RequestEvent[] = [...minutes(T0 - DAY, T0 - DAY + HOUR, ASHBURN), ...minutes(T0, T0 + HOUR, ASHBURN)];
      let n = 0;
      [2, 3, 4, 5, 6, 7].forEach((count, k) => {
        for (let j = 0; j < count; j++, n++) events.push(at(T0 + k * 10 * MINUTE + 30_000 + j * 60_000, `100.${n % 2 ? 1 : 0}.${100 + n}.7`)); // New York and Ashburn
      });
      expect(sharing(run(historyEngine(), events))).toEqual([]);
    });
  });

  describe('a key busier than its window holds', () => {
    const MINUTE = 60_000;
    const busyEngine = (maxEventsPerKey?: number) =>
      new DetectionEngine({ rules: [...RULES], entitledPlans: ['business'], geo, config: () => new DetectionConfig(), maxEventsPerKey, clock: WALL_CLOCK });

    /** `perSecond` requests a second from `from` for `minutes`, the i-th from ipOf(i); in batches of one second. */
    function steady(from: number, minutes: number, perSecond: number, ipOf: (i: number, at: number) => string): RequestEvent[][] {
      const batches: RequestEvent[][] = [];
      for (let second = 0; second < minutes * 60; second++) {
        batches.push(
          Array.from({ length: perSecond }, (_, j) => {
            const i = second * perSecond + j;
            const at = from + second * 1000 + Math.floor((j * 1000) / perSecond);
            return event(0, { eventId: `b${from}_${i}`, timestamp: at, ip: ipOf(i, at), rateLimitPerMinute: 1_200 });
          }),
        );
      }
      return batches;
    }

    /** The engine warmed with the first hour (as after a start), then judging the second; the rules that fired. */
    function secondHour(detection: DetectionEngine, ipOf: (i: number, at: number) => string) {
      for (const batch of steady(T0, 60, 10, ipOf)) detection.warm(batch);
      const fired: { ruleId: string; at: number; title: string }[] = [];
      for (const batch of steady(T0 + HOUR, 60, 10, ipOf)) {
        const now = batch.at(-1)!.timestamp;
        for (const { ruleId, finding } of detection.process(batch, now)) fired.push({ ruleId, at: now, title: finding.title });
      }
      return fired;
    }

    it('finds a flood faster than the key\'s cap holds a minute: the window is cut, not one burst of seconds', () => {
      // 600 requests a minute against a limit of 60, a cap of 200 events: the window holds 20 s of it.
      const detection = busyEngine(200);
      const fired: string[] = [];
      for (let second = 0; second < 180; second++) {
        const batch = Array.from({ length: 10 }, (_, j) => event(0, { eventId: `f${second}_${j}`, timestamp: T0 + second * 1000 + j * 100, ip: '100.0.7.7' }));
        for (const { ruleId, finding } of detection.process(batch, batch.at(-1)!.timestamp)) fired.push(`${ruleId} ${finding.severity}`);
      }
      expect(detection.load.eventsPerKeyCap).toBe(200);
      expect(fired.filter((f) => f.startsWith('velocity_attack')).length).toBeGreaterThan(0);
    });

    it('rates a flood beyond the key\'s cap by all its requests, those the cap dropped too', () => {
      // 600 requests a minute against a limit of 60 (10x: critical), a cap of 200 events: the window
      // holds 20 s of it, so a minute it holds is at most a third of the flood.
      const detection = busyEngine(200);
      const found: { second: number; severity: string; evidence: Record<string, unknown> }[] = [];
      for (let second = 0; second < 240; second++) {
        const batch = Array.from({ length: 10 }, (_, j) => event(0, { eventId: `c${second}_${j}`, timestamp: T0 + second * 1000 + j * 100, ip: '100.0.7.7' }));
        for (const { ruleId, finding } of detection.process(batch, batch.at(-1)!.timestamp)) {
          if (ruleId === 'velocity_attack') found.push({ second, severity: finding.severity, evidence: finding.evidence });
        }
      }
      const later = found.filter((f) => f.second >= 120);
      // Found on every judgement: a minute the cap dropped whole does not hide the flood the window holds.
      expect(later.map((f) => f.second)).toEqual(Array.from({ length: 120 }, (_, k) => 120 + k));
      // Critical whenever its stretch is whole minutes of it (with a partial current minute, high at least).
      const perMinuteOf = (f: (typeof found)[number]) => (f.evidence as { perMinute: { requests: number }[] }).perMinute.map((m) => m.requests);
      const wholeMinutes = later.filter((f) => perMinuteOf(f).every((requests) => requests === 600));
      expect(wholeMinutes.length).toBeGreaterThan(10);
      expect(wholeMinutes.every((f) => f.severity === 'critical')).toBe(true);
      expect(later.every((f) => f.severity === 'critical' || f.severity === 'high')).toBe(true);
      const { requestsDroppedByCap, sampleEventIds } = wholeMinutes.at(-1)!.evidence as { requestsDroppedByCap: number; sampleEventIds: string[] };
      expect(requestsDroppedByCap).toBeGreaterThan(600);
      expect(sampleEventIds.length).toBeGreaterThan(0);
    });

    it('counts a request the cap dropped once, when it is delivered again', () => {
      // 1,000 requests a minute against a RateLimit-Limit of 800: 1.25x, under the 1.5x that is over.
      // The last 210 seconds come again (a redelivery the intake did not catch): over if counted twice.
      const detection = busyEngine(500);
      const batches: RequestEvent[][] = Array.from({ length: 300 }, () => []);
      for (let k = 0; k < 5_000; k++) batches[Math.floor((k * 60) / 1000)]!.push(event(0, { eventId: `r${k}`, timestamp: T0 + k * 60, rateLimitPerMinute: 800 }));
      const velocity = (batch: RequestEvent[], now: number) => detection.process(batch, now).filter((f) => f.ruleId === 'velocity_attack');
      for (const batch of batches) expect(velocity(batch, batch.at(-1)!.timestamp)).toEqual([]);
      // Judged as of the key's latest time, as when they come in one batch with new events.
      for (const batch of batches.slice(90)) expect(velocity(batch, T0 + 300_000)).toEqual([]);
    });

    it('records every request the cap dropped when many share a timestamp (whole seconds), and a redelivered one once', () => {
      // 10 requests a second, all dated the whole second, in two batches a second; a cap of 200.
      let seen: KeyWindow | undefined;
      const watching: AnyRule = { ...countingRule, windowMs: 6 * MINUTE, evaluate: (window) => ((seen = window), []) };
      const detection = new DetectionEngine({ rules: [watching], entitledPlans: ['business'], geo, config: () => new DetectionConfig(), maxEventsPerKey: 200, clock: WALL_CLOCK });
      const half = (second: number, part: number) =>
        Array.from({ length: 5 }, (_, j) => event(0, { eventId: `w${second}_${part * 5 + j}`, timestamp: T0 + second * 1000, ip: '198.51.100.9' }));
      const batches: RequestEvent[][] = [];
      for (let second = 0; second < 240; second++) batches.push(half(second, 0), half(second, 1));
      for (const batch of batches) detection.process(batch, batch[0]!.timestamp);
      const minute = T0 / MINUTE + 1;
      expect(seen?.dropped?.count(minute)).toBe(600);
      // The batches of the minute the cap is dropping now come again (a redelivery the intake did not
      // catch): those it dropped already, dated before what it drops now or at the same second, count once.
      const dropping = Math.floor((seen!.cappedAt! - T0) / MINUTE);
      const countBefore = seen!.dropped!.count(T0 / MINUTE + dropping);
      for (const batch of batches.slice(dropping * 120)) detection.process(batch, T0 + 240_000);
      expect(seen!.dropped!.count(T0 / MINUTE + dropping)).toBe(countBefore);
    });

    it('forgets what the cap dropped when a reloaded allowlist takes requests out of the window', () => {
      // A load test from one address floods the key past its cap; the app sends a request every 10 s.
      let config = new DetectionConfig();
      let seen: KeyWindow | undefined;
      const watching: AnyRule = { ...countingRule, windowMs: 6 * MINUTE, evaluate: (window) => ((seen = window), []) };
      const detection = new DetectionEngine({ rules: [watching], entitledPlans: ['business'], geo, config: () => config, maxEventsPerKey: 200, clock: WALL_CLOCK });
      const app = (second: number) => event(0, { eventId: `app${second}`, timestamp: T0 + second * 1000 + 50, ip: '203.0.113.5' });
      for (let second = 0; second < 240; second++) {
        const batch = Array.from({ length: 10 }, (_, j) => event(0, { eventId: `lt${second}_${j}`, timestamp: T0 + second * 1000 + j * 100, ip: '198.51.100.9' }));
        if (second % 10 === 0) batch.push(app(second));
        batch.sort((a, b) => a.timestamp - b.timestamp);
        detection.process(batch, batch.at(-1)!.timestamp);
      }
      const minute = T0 / MINUTE + 1;
      expect(seen?.dropped?.count(minute)).toBe(606);
      // The load test's address is allowlisted: what the cap dropped, mostly its requests, no longer counts.
      config = DetectionConfig.parse(JSON.stringify({ merchants: { m_1: { allowlist: { ips: ['198.51.100.9'] } } } }));
      detection.process([app(240)], T0 + 240_050);
      expect(seen?.events.map((e) => e.eventId)).toEqual(['app230', 'app240']);
      expect(seen?.dropped).toBeUndefined();
      expect(seen?.cappedAt).toBe(T0 + 220_050); // its minutes are still cut
    });

    // A deployment in us-east, eu-west and ap-southeast, two networks each, at 600 requests a minute:
    // 36,000 events an hour. With the oldest events dropped at the cap, its window held under 10
    // minutes, no baseline, and its six networks in three countries looked like a shared key.
    it('keeps the hour of networks that tells a multi-region deployment from a shared key', () => {
      const detection = busyEngine();
      const ips = ['100.0.1.5', '100.0.2.5', '100.3.1.5', '100.3.2.5', '100.10.1.5', '100.10.2.5'];
      expect(secondHour(detection, (i) => ips[i % ips.length]!)).toEqual([]);
      const { windowEvents, thinnedEvents, maxEventsPerKey } = detection.load;
      expect(thinnedEvents).toBeGreaterThan(10_000);
      expect(windowEvents).toBeLessThanOrEqual(maxEventsPerKey);
    });

    // Ashburn all day; a job in Dublin runs a minute every half hour. Dublin was seen 30 minutes
    // ago, so it is a known site; a new place still alerts.
    it('remembers a site seen half an hour ago, and still alerts on a new one', () => {
      const detection = busyEngine();
      const minuteOf = (at: number) => Math.floor((at - T0) / MINUTE) % 60;
      const fired = secondHour(detection, (i, at) => {
        const minute = minuteOf(at);
        if (minute === 10 || minute === 40) return `100.3.7.${i % 4}`;
        if (at >= T0 + HOUR + 50 * MINUTE && minute === 50 && i % 2 === 0) return '100.11.9.9'; // Tokyo, once
        return `100.0.7.${i % 4}`;
      });
      // Only the hops to Tokyo, from its first minute on (each batch judges them again until they age out).
      expect(fired.length).toBeGreaterThan(0);
      for (const { ruleId, at, title } of fired) {
        expect(ruleId).toBe('impossible_travel');
        expect(title).toContain('to Tokyo');
        expect(at).toBeGreaterThanOrEqual(T0 + HOUR + 50 * MINUTE);
      }
    });

    // Warmed again (a warm-up a rebalance cut short, read again from its start; partitions given back
    // to a replica the group had dropped), a busy key's stored hour must leave its window as it was:
    // events it thinned out, back whole, would take it over its cap, and the cap drops the oldest.
    it('leaves a busy key\'s window as it was when its stored hour is warmed again', () => {
      const detection = busyEngine();
      const ips = ['100.0.1.5', '100.0.2.5', '100.3.1.5', '100.3.2.5', '100.10.1.5', '100.10.2.5'];
      const stored: RequestEvent[] = [];
      for (const batch of steady(T0, 60, 10, (i) => ips[i % ips.length]!)) {
        detection.warm(batch);
        stored.push(...batch);
      }
      for (const batch of steady(T0 + HOUR, 30, 10, (i) => ips[i % ips.length]!)) {
        detection.process(batch, batch.at(-1)!.timestamp);
        stored.push(...batch);
      }
      const before = detection.load;
      expect(before.thinnedEvents).toBeGreaterThan(0);
      const lastHour = stored.filter((event) => event.timestamp >= T0 + 30 * MINUTE);
      for (let start = 0; start < lastHour.length; start += 10_000) detection.warm(lastHour.slice(start, start + 10_000));
      expect(detection.load).toEqual(before);
    });

    // What thinning keeps is all that the rules read that far back: an engine thinning its busy keys
    // finds exactly what an engine keeping every event finds.
    it('finds exactly what keeping every event finds', () => {
      const random = prng(11);
      const whole = busyEngine(1_000_000);
      const thinning = busyEngine(3_000);
      const keys = ['regions', 'shared', 'travel', 'failing'] as const;
      let fired = 0;
      // Two requests a second per key, judged every five seconds, for 100 minutes.
      let batch: RequestEvent[] = [];
      for (let second = 0; second < 100 * 60; second++) {
        const minute = Math.floor(second / 60);
        for (const [k, profile] of keys.entries()) {
          for (let j = 0; j < 2; j++) {
            let ip = `100.${k}.${1 + j}.${second % 7}`;
            if (profile === 'regions') ip = `100.${[0, 3, 10][(second + j) % 3]}.${j}.1`;
            if (profile === 'shared' && minute % 40 > 30) ip = `100.${Math.floor(random() * 6)}.${Math.floor(random() * 12)}.9`;
            if (profile === 'travel' && random() < 0.002) ip = `100.${Math.floor(random() * 16)}.99.1`;
            const status = profile === 'failing' && minute % 30 > 20 && random() < 0.6 ? 401 : 201;
            batch.push(event(0, { apiKeyId: `pk_live_${profile}`, eventId: `s${second}_${k}_${j}`, timestamp: T0 + second * 1000 + j * 400, ip, status, rateLimitPerMinute: 300 }));
          }
        }
        if (second % 5 < 4) continue;
        const now = T0 + second * 1000 + 400;
        const expected = whole.process(batch, now);
        expect(thinning.process(batch, now)).toEqual(expected);
        fired += expected.length;
        batch = [];
      }
      expect(thinning.load.thinnedEvents).toBeGreaterThan(0);
      expect(fired).toBeGreaterThan(0);
      expect(whole.load.thinnedEvents).toBe(0);
    });
  });

  it('sets aside a screen that throws: counted once for the key, and the rule judges the window from then on', () => {
    const failing: AnyRule = { ...countingRule, screen: { create: () => ({}), add: () => { throw new Error('tally broke'); }, remove: () => undefined, mayFire: () => false } };
    const { detection, errors } = engine([failing]);
    expect(detection.process([event(1), event(2)], T0)).toHaveLength(0);
    expect(detection.process([event(3)], T0 + 3000)).toHaveLength(1);
    expect(errors).toEqual(['velocity_attack']);
  });
});

describe('warmUpLimit', () => {
  it('gives each partition a replica owns its share of 80% of the budget, at most WARM_UP_MAX_EVENTS', () => {
    // An hour at 1,750 events/s on 4 partitions is 1.575M each: 1.43M of it (55 minutes) with a 4 GiB
    // heap's budget (7.16M); a fixed 1M (38 minutes) before.
    expect(warmUpLimit(7_158_278, 4)).toBe(1_431_655);
    expect(warmUpLimit(900_000, 4)).toBe(180_000); // a small heap: together they leave room
    expect(warmUpLimit(50_000_000, 1)).toBe(WARM_UP_MAX_EVENTS);
    expect(warmUpLimit(1_000, 0)).toBe(800); // no partition counted: one
    expect(warmUpLimit(0, 3)).toBe(1);
  });
});
