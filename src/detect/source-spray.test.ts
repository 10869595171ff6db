/**
 * Credential stuffing across keys (source-spray.ts), through the engine with the five rules: one
 * network's 401s for many keys, a failure or two each, far below any key's own bar.
 */
import { describe, expect, it } from 'vitest';
import { RULES } from '../../rules/index.ts';
import { explainAlert, TEST_KEYS_INSIGHT } from '../alerts/insights.ts';
import type { RequestEvent } from '../events/request-event.ts';
import { DetectionConfig } from './detection-config.ts';
import { DetectionEngine, type EngineFinding } from './engine.ts';
import { SourceSpray, SprayReports, sprayedKeysOf, type SprayedRequests } from './source-spray.ts';

const T0 = Date.UTC(2026, 10, 20, 12, 0, 0);
const SECOND = 1000;
const MINUTE = 60 * SECOND;
const CONFIG = new DetectionConfig();
const STUFFER = '203.0.113.9';
let sequence = 0;

function engine(): DetectionEngine {
  return new DetectionEngine({ rules: RULES, entitledPlans: ['business', 'enterprise'], config: () => CONFIG, clock: () => T0 + 24 * 60 * MINUTE });
}

function request(merchant: number, key: number, at: number, overrides: Partial<RequestEvent> = {}): RequestEvent {
  return {
    eventId: `e${sequence++}`,
    timestamp: at,
    merchantId: `m_${merchant}`,
    plan: 'business',
    apiKeyId: `pk_live_m${merchant}_k${key}`,
    environment: 'live',
    ip: '198.51.100.20',
    userAgent: 'python-requests/2.32.3',
    method: 'POST',
    path: '/v1/verify/sessions',
    status: 201,
    responseTimeMs: 80,
    ...overrides,
  };
}

/** One 401 from the stuffer for each key, a second apart from `start`; keys spread over `merchants`. */
function spray(keys: number, merchants: number, start: number, ip = STUFFER): RequestEvent[] {
  return Array.from({ length: keys }, (_, k) => request(k % merchants, k, start + k * SECOND, { ip, status: 401, userAgent: 'curl/8.5.0' }));
}

/** The engine's findings about networks (apiKeyId null), batch by batch of `size` events. */
function networkFindings(detection: DetectionEngine, events: readonly RequestEvent[], size = 10): EngineFinding[] {
  const found: EngineFinding[] = [];
  for (let i = 0; i < events.length; i += size) {
    const batch = events.slice(i, i + size);
    found.push(...detection.process(batch, batch.at(-1)!.timestamp).filter((finding) => finding.finding.apiKeyId === null));
  }
  return found;
}

describe('credential stuffing across keys', () => {
  it('reports a network that fails for 20 keys in 10 minutes to each merchant of those keys, with its own keys alone', () => {
    const findings = networkFindings(engine(), spray(20, 3, T0));
    expect(findings.map((f) => f.merchantId).sort()).toEqual(['m_0', 'm_1', 'm_2']);
    for (const { merchantId, ruleId, finding } of findings) {
      expect(ruleId).toBe('high_failure_rate');
      expect(finding).toMatchObject({ scope: 'network:203.0.113.0/24', apiKeyId: null, severity: 'medium' });
      expect(finding.title).toMatch(/^Credential stuffing from 203\.0\.113\.0\/24: 401 for 20 API keys in 10 min, \d of them yours$/);
      expect((finding.evidence.merchantKeys as string[]).every((key) => key.startsWith(`pk_live_m${merchantId.slice(2)}_`))).toBe(true);
      expect(finding.evidence).toMatchObject({ judgedBy: 'network_across_keys', distinctKeys: 20, ips: [STUFFER], minKeys: 20 });
      // Other merchants' keys and events are counted, never named.
      expect(JSON.stringify(finding)).not.toMatch(new RegExp(`pk_live_m(?!${merchantId.slice(2)}_)`));
      expect(finding.evidence.sampleEventIds).toHaveLength(finding.evidence.merchantKeyCount as number);
    }
  });

  it('counts an IPv6 spray by its /48: a new /64 for every key is still one network, and a /64 alone is reported as its /48', () => {
    const rotating = spray(20, 2, T0).map((event, k) => ({ ...event, ip: `2001:db8:7:${k.toString(16)}::9` }));
    const findings = networkFindings(engine(), rotating);
    expect(findings.map((f) => [f.merchantId, f.finding.scope, f.finding.evidence.distinctKeys])).toEqual([
      ['m_0', 'network:2001:db8:7::/48', 20],
      ['m_1', 'network:2001:db8:7::/48', 20],
    ]);
    expect(networkFindings(engine(), spray(20, 1, T0, '2001:db8:8:1::9')).map((f) => f.finding.scope)).toEqual(['network:2001:db8:8::/48']);
    // Two /48s, 10 keys each: two networks, neither a spray.
    expect(networkFindings(engine(), spray(20, 1, T0).map((event, k) => ({ ...event, ip: `2001:db8:${k % 2}:${k}::9` })))).toEqual([]);
  });

  it('does not count a key failing from a network of its own: 20 deleted keys still set in deployments behind one shared egress', () => {
    // Each key worked from the shared /24 until yesterday (its rotation); the deployments kept the old key.
    const worked = Array.from({ length: 20 }, (_, k) => request(k % 4, k, T0 - 18 * 60 * MINUTE + k * SECOND, { ip: '203.0.113.40' }));
    const detection = engine();
    detection.process(worked, worked.at(-1)!.timestamp);
    expect(networkFindings(detection, spray(20, 4, T0))).toEqual([]);
    // A stranger trying the same keys from another /64 of a /48 where their owners work is still counted: their successes there hide nothing.
    const owners = Array.from({ length: 20 }, (_, k) => request(k % 4, k, T0 - 18 * 60 * MINUTE + k * SECOND, { ip: '2001:db8:9:1::5' }));
    const other = engine();
    other.process(owners, owners.at(-1)!.timestamp);
    other.process(owners.map((event) => ({ ...event, eventId: `${event.eventId}_now`, timestamp: event.timestamp + 18 * 60 * MINUTE - 30 * SECOND })), T0 - SECOND);
    expect(networkFindings(other, spray(20, 4, T0, '2001:db8:9:2::66')).map((f) => f.finding.scope)).toEqual(Array.from({ length: 4 }, () => 'network:2001:db8:9::/48'));
  });

  it('counts two merchants\' keys that share an id as two keys, each in its own merchant\'s report', () => {
    // 19 keys of m_0, and one key of m_1 whose id is one of m_0's: 20 keys, across two merchants.
    const events = [...spray(19, 1, T0), request(1, 0, T0 + 30 * SECOND, { ip: STUFFER, status: 401, apiKeyId: 'pk_live_m0_k0' })];
    const findings = networkFindings(engine(), events);
    expect(findings.map((f) => f.merchantId).sort()).toEqual(['m_0', 'm_1']);
    const of = (merchant: string) => findings.find((f) => f.merchantId === merchant)!.finding.evidence;
    expect(of('m_0')).toMatchObject({ distinctKeys: 20, merchantKeyCount: 19 });
    expect(of('m_1')).toMatchObject({ distinctKeys: 20, merchantKeyCount: 1, merchantKeys: ['pk_live_m0_k0'] });
  });

  it('stays quiet for 19 keys, for 30 spread so that no 10 minutes hold 20, and for networks that each fail for fewer keys', () => {
    expect(networkFindings(engine(), spray(19, 3, T0))).toEqual([]);
    const slow = Array.from({ length: 30 }, (_, k) => request(0, k, T0 + k * 33 * SECOND, { ip: STUFFER, status: 401 }));
    expect(networkFindings(engine(), slow)).toEqual([]); // never 20 within 10 minutes
    const split = [...spray(15, 2, T0, '203.0.113.9'), ...spray(15, 2, T0, '203.0.114.9').map((e, k) => ({ ...e, apiKeyId: `pk_other_${k}` }))];
    expect(networkFindings(engine(), split)).toEqual([]);
  });

  it('does not count a key whose requests from the network mostly succeed: an integration platform calling for many merchants', () => {
    const detection = engine();
    // 40 merchants' keys called from one egress, each a few times a minute, each key's calls failing now and then.
    const platform: RequestEvent[] = [];
    for (let minute = 0; minute < 10; minute++) {
      for (let k = 0; k < 40; k++) {
        for (let call = 0; call < 3; call++) platform.push(request(k, 0, T0 + minute * MINUTE + k * 500 + call * 10 * SECOND, { ip: '192.0.2.7', status: call === 0 && (minute + k) % 4 === 0 ? 401 : 200 }));
      }
    }
    platform.sort((a, b) => a.timestamp - b.timestamp);
    expect(networkFindings(detection, platform, 40)).toEqual([]);
  });

  it('is high from 100 keys, reported at once though it was reported medium a moment before; the same again waits a minute, and then goes to the merchants with new failures', () => {
    const detection = engine();
    const first = networkFindings(detection, spray(20, 1, T0), 20);
    expect(first.map((f) => f.finding.severity)).toEqual(['medium']);
    // More keys of m_0 within the minute: not reported again until severity rises.
    expect(networkFindings(detection, spray(30, 1, T0 + 20 * SECOND).map((e, k) => ({ ...e, apiKeyId: `pk_live_m0_more${k}` })), 30)).toEqual([]);
    const high = networkFindings(detection, spray(60, 2, T0 + 40 * SECOND).map((e, k) => ({ ...e, apiKeyId: `pk_live_m${k % 2}_late${k}` })), 60);
    expect(high.map((f) => `${f.merchantId} ${f.finding.severity}`).sort()).toEqual(['m_0 high', 'm_1 high']);
    expect(high[0]!.finding.evidence.distinctKeys).toBe(110);
    // Two minutes on, a failure for m_1 alone: m_1 hears of it, m_0 (nothing new) does not.
    const later = networkFindings(detection, [request(1, 999, T0 + 3 * MINUTE, { ip: STUFFER, status: 401 })]);
    expect(later.map((f) => f.merchantId)).toEqual(['m_1']);
  });

  it('reports what came within a minute of a report with the first batch after the minute, whatever it holds', () => {
    const detection = engine();
    expect(networkFindings(detection, spray(20, 1, T0), 20).map((f) => f.finding.evidence.distinctKeys)).toEqual([20]);
    expect(networkFindings(detection, spray(10, 1, T0 + 20 * SECOND).map((e, k) => ({ ...e, apiKeyId: `pk_live_m0_more${k}` })), 10)).toEqual([]);
    // The spray has ended; an ordinary request of another key, another network, a minute on.
    const next = networkFindings(detection, [request(5, 1, T0 + 81 * SECOND)]);
    expect(next.map((f) => [f.merchantId, f.finding.evidence.distinctKeys])).toEqual([['m_0', 30]]);
    // Reported, it is not reported again without new failures.
    expect(networkFindings(detection, [request(5, 1, T0 + 3 * MINUTE)])).toEqual([]);
  });

  it('forgets the keys whose failures left the window', () => {
    const detection = engine();
    expect(networkFindings(detection, spray(15, 1, T0))).toEqual([]);
    expect(networkFindings(detection, spray(4, 1, T0 + 20 * SECOND).map((e, k) => ({ ...e, apiKeyId: `pk_live_m0_x${k}` })))).toEqual([]); // 19 keys
    // Eleven minutes on, the first 15 have left: 5 more make 9, not 24.
    expect(networkFindings(detection, spray(5, 1, T0 + 11 * MINUTE).map((e, k) => ({ ...e, apiKeyId: `pk_live_m0_y${k}` })))).toEqual([]);
  });

  it('reads the keys of a network whose failures are not a spray at most once a minute, however many batches bring it 401s', () => {
    const tally = new SourceSpray();
    let reads = 0;
    const notMostly = () => (reads++, false);
    const windowEvent = (e: RequestEvent) => ({ ...e, network: '192.0.2.0/24', rateLimitPerMinute: 0, country: undefined, geo: undefined });
    // 40 keys of an integration platform, each with a 401 now and then, over 30 batches two seconds apart.
    for (let batch = 0; batch < 30; batch++) {
      for (let k = 0; k < 40; k++) {
        const e = request(k, 0, T0 + batch * 2 * SECOND + k, { ip: '192.0.2.7', status: 401 });
        tally.add(e, windowEvent(e), -1);
      }
      expect(tally.judge(T0 + batch * 2 * SECOND + 40, notMostly)).toEqual([]);
    }
    expect(reads).toBe(40); // once, at the first batch: 40 keys
    const e = request(0, 0, T0 + 61 * SECOND, { ip: '192.0.2.7', status: 401 });
    tally.add(e, windowEvent(e), -1);
    tally.judge(T0 + 61 * SECOND, notMostly);
    expect(reads).toBe(80); // and again a minute on
  });

  it('finds a spray that straddles a restart: the 401s warmed from storage count with those after it', () => {
    const events = spray(20, 2, T0);
    const restarted = engine();
    restarted.warm(events.slice(0, 15), 0, events[14]!.timestamp);
    const findings = networkFindings(restarted, events.slice(15));
    expect(findings.map((f) => [f.merchantId, f.finding.evidence.distinctKeys])).toEqual([
      ['m_0', 20],
      ['m_1', 20],
    ]);
    // Warming judges nothing; the batches after it do.
    const warmedOnly = engine();
    warmedOnly.warm(spray(25, 2, T0), 0, T0 + 25 * SECOND);
    expect(networkFindings(warmedOnly, [request(0, 99, T0 + 30 * SECOND)])).toHaveLength(2);
  });

  it('takes from a warm-up only the 401s of the 10 minutes before the partition\'s newest event', () => {
    // 25 keys tried half an hour before the restart: stale, so no spray, and no room taken from one.
    const stale = engine();
    stale.warm(spray(25, 2, T0), 0, T0 + 30 * MINUTE);
    expect(stale.load.sprayEntries).toBe(0);
    expect(networkFindings(stale, [request(0, 99, T0 + 30 * MINUTE)])).toEqual([]);
    const recent = engine();
    recent.warm(spray(25, 2, T0), 0, T0 + 5 * MINUTE);
    expect(recent.load.sprayEntries).toBe(25);
    expect(networkFindings(recent, [request(0, 99, T0 + 5 * MINUTE)])).toHaveLength(2);
  });

  it('counts no key as failing that its window does not show failing (its partition moved, the memory budget forgot it, the cap cut it), nor a regained partition\'s 401s twice', () => {
    // An integration platform's egress: 25 keys on partition 1, each with 20 successes and one 401 (not a spray).
    const platform = Array.from({ length: 25 }, (_, k) => [
      ...Array.from({ length: 20 }, (_, i) => request(k, 0, T0 + k * 4 * SECOND + i * 100, { ip: '192.0.2.7' })),
      request(k, 0, T0 + k * 4 * SECOND + 2_100, { ip: '192.0.2.7', status: 401 }),
    ]).flat();
    const revoked = engine();
    expect(revoked.process(platform, T0 + 100 * SECOND, 1).filter((f) => f.finding.apiKeyId === null)).toEqual([]);
    revoked.keepPartitions(new Set([0]));
    const later = request(99, 0, T0 + 3 * MINUTE, { ip: '192.0.2.7', status: 401 });
    expect(revoked.process([later], T0 + 3 * MINUTE, 0).filter((f) => f.finding.apiKeyId === null)).toEqual([]);

    // The same platform's keys forgotten for the memory budget (60 keys of 21 events each over 3 minutes, a budget of 500): not counted as failing.
    const squeezed = new DetectionEngine({ rules: RULES, entitledPlans: ['business', 'enterprise'], config: () => CONFIG, clock: () => T0 + 24 * 60 * MINUTE, maxWindowEvents: 500 });
    const wider = Array.from({ length: 60 }, (_, k) => [
      ...Array.from({ length: 20 }, (_, i) => request(k, 1, T0 + k * 3 * SECOND + i * 50, { ip: '192.0.2.7' })),
      request(k, 1, T0 + k * 3 * SECOND + 1_100, { ip: '192.0.2.7', status: 401 }),
    ]).flat();
    expect(networkFindings(squeezed, wider, 21)).toEqual([]);
    expect(squeezed.load.forgottenKeys).toBeGreaterThan(40);

    // The same platform's keys busy from their own networks too, with a cap of 100 events: their
    // windows lose the platform's calls, which no longer say anything, failed or not.
    const capped = new DetectionEngine({ rules: RULES, entitledPlans: ['business', 'enterprise'], config: () => CONFIG, clock: () => T0 + 24 * 60 * MINUTE, maxEventsPerKey: 100 });
    capped.process(platform, T0 + 100 * SECOND);
    const own = Array.from({ length: 25 }, (_, k) => Array.from({ length: 150 }, (_, i) => request(k, 0, T0 + 2 * MINUTE + i * 800, { ip: `198.51.100.${k + 1}` }))).flat();
    capped.process(own.sort((x, y) => x.timestamp - y.timestamp), T0 + 4 * MINUTE);
    const another = request(0, 0, T0 + 4 * MINUTE + SECOND, { ip: '192.0.2.7', status: 401 });
    expect(capped.process([another], T0 + 4 * MINUTE + SECOND).filter((f) => f.finding.apiKeyId === null)).toEqual([]);

    // A spray on partition 1 that the replica loses and gets back, warmed again: each 401 counts once.
    const tried = spray(24, 1, T0);
    const regained = engine();
    expect(regained.process(tried, T0 + 30 * SECOND, 1).filter((f) => f.finding.apiKeyId === null)).toHaveLength(1);
    regained.keepPartitions(new Set([0]));
    regained.warm(tried, 1, T0 + 30 * SECOND);
    const [again] = regained.process([request(0, 99, T0 + 2 * MINUTE, { ip: STUFFER, status: 401 })], T0 + 2 * MINUTE, 1).filter((f) => f.finding.apiKeyId === null);
    expect(again!.finding.evidence).toMatchObject({ distinctKeys: 25, authFailures: 25 });
  });

  it('finds a spray whose keys the memory budget forgot, by what their windows said before', () => {
    // 30 dormant keys tried once each, 6 s apart, while 20 busy keys fill a budget of 2,500: the tried keys are forgotten first.
    const squeezed = new DetectionEngine({ rules: RULES, entitledPlans: ['business', 'enterprise'], config: () => CONFIG, clock: () => T0 + 24 * 60 * MINUTE, maxWindowEvents: 2_500 });
    const found: EngineFinding[] = [];
    for (let s = 0; s < 200; s++) {
      const batch = Array.from({ length: 20 }, (_, b) => request(b % 3, 100 + b, T0 + s * SECOND + b, { ip: `198.51.100.${b + 1}` }));
      if (s % 6 === 0 && s / 6 < 30) batch.push(request(s % 3, s / 6, T0 + s * SECOND + 500, { ip: STUFFER, status: 401, userAgent: 'curl/8.5.0' }));
      found.push(...squeezed.process(batch, T0 + s * SECOND + 999).filter((f) => f.finding.apiKeyId === null));
    }
    expect(squeezed.load.forgottenKeys).toBeGreaterThanOrEqual(20);
    expect(found.length).toBeGreaterThan(0);
    expect(found[0]!.finding.evidence.distinctKeys).toBeGreaterThanOrEqual(20);
  });

  it('is explained as credential stuffing, with the figures of its evidence', () => {
    const [found] = networkFindings(engine(), spray(24, 2, T0), 24).filter((f) => f.merchantId === 'm_1');
    const { evidence } = found!.finding;
    expect(evidence).toMatchObject({ distinctKeys: 24, merchantKeyCount: 12, windowMinutes: 10, ips: [STUFFER] });
    expect(explainAlert({ type: 'high_failure_rate', severity: 'medium', evidence })).toEqual({
      pattern: 'credential_stuffing',
      insights: [
        'Credential stuffing: 203.0.113.0/24 failed authentication with 24 API keys in 10 min, 12 of them yours.',
        "A list of stolen or guessed keys is being tried: no one key's own traffic shows it.",
        'All the failures came from a single IP address.',
      ],
    });
  });
});

describe('credential stuffing across keys: test keys', () => {
  const asTest = (event: RequestEvent): RequestEvent => ({ ...event, environment: 'test', apiKeyId: event.apiKeyId.replace('live', 'test') });

  it('tells a merchant whose keys in a spray are all test keys at its test-key ceiling, and the others at the spray\'s severity', () => {
    // m_0's keys are test keys; m_1's live; m_2's test keys but one, which a live request of it says is live.
    const events = spray(30, 3, T0).map((event) => (event.merchantId === 'm_1' ? event : asTest(event)));
    const m2Live = events.find((event) => event.merchantId === 'm_2')!;
    const findings = networkFindings(engine(), [...events, { ...m2Live, eventId: 'm2_live', environment: 'live' }], 31);
    expect(findings.map((f) => `${f.merchantId} ${f.finding.severity}`).sort()).toEqual(['m_0 low', 'm_1 medium', 'm_2 medium']);
    const ofTestKeys = findings.find((f) => f.merchantId === 'm_0')!.finding;
    expect(ofTestKeys.evidence).toMatchObject({ keyEnvironment: 'test', judgedSeverity: 'medium', distinctKeys: 30, merchantKeyCount: 10 });
    expect(ofTestKeys.summary).toMatch(/Reported as low, not medium, because your keys among them are all test keys: they reach only mock verifications/);
    // Explained as the spray it was judged, and last that the keys are test keys.
    const { insights } = explainAlert({ type: 'high_failure_rate', severity: 'low', evidence: ofTestKeys.evidence });
    expect(insights[0]).toMatch(/^Credential stuffing: 203\.0\.113\.0\/24 failed authentication with 30 API keys in 10 min, 10 of them yours\.$/);
    expect(insights.at(-1)).toBe(TEST_KEYS_INSIGHT);
    expect(findings.find((f) => f.merchantId === 'm_1')!.finding.evidence).not.toHaveProperty('keyEnvironment');
  });

  it('takes a key for live once any of its events said so, as its other findings do', () => {
    // m_0's keys each made a live request before their 401s, which say test.
    const earlier = spray(20, 1, T0 - 30 * SECOND).map((event) => ({ ...event, status: 200, ip: '198.51.100.20' }));
    const findings = networkFindings(engine(), [...earlier, ...spray(20, 1, T0).map((event) => ({ ...event, environment: 'test' as const }))], 20);
    expect(findings.map((f) => `${f.merchantId} ${f.finding.severity}`)).toEqual(['m_0 medium']);
    // Or after them: in the same batch, before the network is judged.
    const later = spray(20, 1, T0 + 30 * SECOND).map((event) => ({ ...event, apiKeyId: event.apiKeyId.replace('_k', '_later'), status: 200, ip: '198.51.100.20' }));
    const tested = spray(20, 1, T0).map((event) => ({ ...event, apiKeyId: event.apiKeyId.replace('_k', '_later'), environment: 'test' as const }));
    expect(networkFindings(engine(), [...tested, ...later], 40).map((f) => `${f.merchantId} ${f.finding.severity}`)).toEqual(['m_0 medium']);
  });

  it('takes the test-key ceiling of the merchant\'s plan or of the merchant from the detection config, and tells a merchant at its ceiling nothing more when the spray rises to high', () => {
    const config = DetectionConfig.parse(JSON.stringify({ plans: { enterprise: { testKeys: { maxSeverity: 'medium' } } }, merchants: { m_1: { testKeys: { maxSeverity: 'medium' } } } }));
    const detection = new DetectionEngine({ rules: RULES, entitledPlans: ['business', 'enterprise'], config: () => config, clock: () => T0 + 24 * 60 * MINUTE });
    const told = (findings: EngineFinding[]) => findings.map((f) => `${f.merchantId} ${f.finding.severity}`).sort();
    const tried = spray(30, 3, T0).map((event) => asTest(event.merchantId === 'm_0' ? { ...event, plan: 'enterprise' } : event));
    expect(told(networkFindings(detection, tried, 30))).toEqual(['m_0 medium', 'm_1 medium', 'm_2 low']);
    // 80 more keys of m_3, live: high for m_3; the others, at their ceilings with no newer 401, hear nothing.
    const more = spray(80, 1, T0 + 30 * SECOND).map((event, k) => ({ ...event, merchantId: 'm_3', apiKeyId: `pk_live_m3_k${k}` }));
    expect(told(networkFindings(detection, more, 80))).toEqual(['m_3 high']);
  });

  it('judges storage\'s reading of test keys alike: a key is live when any of its requests in the window said so, from any network', () => {
    const detection = engine();
    const stored = (merchant: number, key: number, keyLive: boolean): SprayedRequests => ({
      network: '203.0.113.0/24', merchantId: `m_${merchant}`, apiKeyId: `pk_m${merchant}_k${key}`, partition: key % 4, ip: STUFFER, userAgent: 'curl/8.5.0',
      failures: 1, judged: 1, first: T0 + key * SECOND, newest: T0 + key * SECOND, newestEventId: `s_${key}`, country: undefined, plan: 'business',
      keyRows: 1, keyFailures: 1, keyJudged: 1, keyLive,
    });
    const reading = Array.from({ length: 24 }, (_, k) => stored(k % 2, k, k % 2 === 1 || k === 22));
    expect(detection.judgeFleetSpray(reading, T0 + 24 * 60 * MINUTE).map((f) => `${f.merchantId} ${f.finding.severity}`).sort()).toEqual(['m_0 medium', 'm_1 medium']);
    const allTest = Array.from({ length: 24 }, (_, k) => stored(k % 2, 100 + k, k % 2 === 1));
    expect(engine().judgeFleetSpray(allTest, T0 + 24 * 60 * MINUTE).map((f) => `${f.merchantId} ${f.finding.severity}`).sort()).toEqual(['m_0 low', 'm_1 medium']);
  });
});

describe('credential stuffing across keys: what each merchant is told', () => {
  it('tells a merchant again for a newer 401, a higher severity or more of its keys than it was ever told of, or by a reading of more of the network\'s keys', () => {
    const reports = new SprayReports();
    const own = 'own_partitions' as const;
    expect(reports.tell('n', 'm_0', T0, 'medium', 6, 20, own)).toBe(true);
    expect(reports.tell('n', 'm_0', T0, 'medium', 6, 20, own)).toBe(false);
    expect(reports.tell('n', 'm_0', T0, 'low', 12, 20, own)).toBe(true);
    // Told medium and 12 keys already (by two reports): nothing new.
    expect(reports.tell('n', 'm_0', T0, 'medium', 6, 20, own)).toBe(false);
    expect(reports.tell('n', 'm_0', T0, 'high', 6, 20, own)).toBe(true);
    expect(reports.tell('n', 'm_0', T0 + 1, 'medium', 6, 20, own)).toBe(true);
    expect(reports.tell('n', 'm_1', T0, 'medium', 6, 20, own)).toBe(true);
    // The reading of every partition: the same of m_1's keys and 401, more of the network's (the whole spray), news;
    // the same network's keys, or more from a replica's share, or from a reading of an older 401 of m_1's, not.
    expect(reports.tell('n', 'm_1', T0, 'medium', 6, 20, 'all_partitions')).toBe(false);
    expect(reports.tell('n', 'm_1', T0, 'medium', 6, 40, own)).toBe(false);
    expect(reports.tell('n', 'm_1', T0, 'medium', 6, 40, 'all_partitions')).toBe(true);
    expect(reports.tell('n', 'm_1', T0, 'medium', 6, 40, 'all_partitions')).toBe(false);
    // A reading taken before every replica had stored its keys, then the whole: news again.
    expect(reports.tell('n', 'm_1', T0, 'medium', 6, 45, 'all_partitions')).toBe(true);
    expect(reports.tell('n', 'm_1', T0 - 1, 'medium', 6, 50, 'all_partitions')).toBe(false);
  });

  it('reports a rise to high to every merchant of the spray, one whose newest 401 was reported already too', () => {
    const detection = engine();
    // 19 keys of m_0, and a key of m_1 whose 401 is dated 4 minutes ahead (a producer's clock, within what admission takes).
    const first = [...spray(19, 1, T0), request(1, 0, T0 + 4 * MINUTE, { ip: STUFFER, status: 401 })];
    expect(networkFindings(detection, first, 20).map((f) => `${f.merchantId} ${f.finding.severity}`).sort()).toEqual(['m_0 medium', 'm_1 medium']);
    // 90 more keys 30 s in, 10 of m_1 and 80 of m_2: 110 keys.
    const more = Array.from({ length: 90 }, (_, k) => request(k < 10 ? 1 : 2, 100 + k, T0 + 30 * SECOND + k * 100, { ip: STUFFER, status: 401 }));
    expect(networkFindings(detection, more, 90).map((f) => `${f.merchantId} ${f.finding.severity}`).sort()).toEqual(['m_0 high', 'm_1 high', 'm_2 high']);
  });
});

describe('credential stuffing across replicas (storage\'s reading of every partition\'s keys)', () => {
  /** Key `key` of merchant `merchant` as storage has it: one 401 from the stuffer at `at`, and `succeeded` requests from it that did not fail. */
  function stored(merchant: number, key: number, at: number, succeeded = 0, overrides: Partial<SprayedRequests> = {}): SprayedRequests {
    return {
      network: '203.0.113.0/24',
      merchantId: `m_${merchant}`,
      apiKeyId: `pk_live_m${merchant}_k${key}`,
      partition: key % 4,
      ip: STUFFER,
      userAgent: 'curl/8.5.0',
      failures: 1,
      judged: 1 + succeeded,
      first: at,
      newest: at,
      newestEventId: `stored_${merchant}_${key}`,
      country: 'NL',
      plan: 'business',
      keyRows: 1,
      keyFailures: 1,
      keyJudged: 1 + succeeded,
      keyLive: true,
      ...overrides,
    };
  }
  /** `count` keys, merchant k % `merchants`, a second apart from `at`. */
  const reading = (count: number, merchants: number, at: number) => Array.from({ length: count }, (_, k) => stored(k % merchants, k, at + k * SECOND));
  const WALL = T0 + 24 * 60 * MINUTE;
  const told = (findings: readonly EngineFinding[]) => findings.map((f) => `${f.merchantId} ${f.finding.severity} ${f.finding.evidence.distinctKeys}`).sort();

  it('judges a spray split over replicas as a whole, reporting to each merchant with its own keys alone', () => {
    const detection = engine();
    // 30 keys over three merchants, and two more whose requests from the network mostly succeeded.
    const findings = detection.judgeFleetSpray([...reading(30, 3, T0), stored(0, 100, T0, 2), stored(1, 101, T0, 3)], WALL);
    expect(told(findings)).toEqual(['m_0 medium 30', 'm_1 medium 30', 'm_2 medium 30']);
    for (const { merchantId, finding } of findings) {
      expect(finding).toMatchObject({ scope: 'network:203.0.113.0/24', apiKeyId: null, firstSeenAt: expect.any(Number), lastSeenAt: expect.any(Number) });
      expect(finding.evidence).toMatchObject({ judgedBy: 'network_across_keys', merchantKeyCount: 10, countries: ['NL'] });
      expect(JSON.stringify(finding)).not.toMatch(new RegExp(`pk_live_m(?!${merchantId.slice(2)}_)`));
    }
  });

  it('judges storage\'s reading as of its newest 401, apart from this replica\'s own keys and time', () => {
    const detection = engine();
    // 12 keys of its own failed at T0, then its partitions went quiet; half an hour later storage holds 8 keys failing: no spray.
    expect(networkFindings(detection, spray(12, 2, T0))).toEqual([]);
    expect(detection.judgeFleetSpray(reading(8, 1, T0 + 30 * MINUTE), WALL)).toEqual([]);
    // Storage holds 20 keys of m_3 failing at T0 + 40 min, while the replica, catching up on a backlog, finds 20 keys
    // of m_4 that failed at T0 + 15 min: two sprays, neither of 40.
    expect(told(detection.judgeFleetSpray(reading(20, 1, T0 + 40 * MINUTE).map((r) => ({ ...r, merchantId: 'm_3' })), WALL))).toEqual(['m_3 medium 20']);
    expect(told(networkFindings(detection, Array.from({ length: 20 }, (_, k) => request(4, k, T0 + 15 * MINUTE + k * SECOND, { ip: STUFFER, status: 401 })), 20))).toEqual(['m_4 medium 20']);
  });

  it('tells a merchant once of what both the replica\'s own tally and storage\'s reading found, and again for a higher severity', () => {
    const detection = engine();
    expect(told(networkFindings(detection, spray(20, 1, T0), 20))).toEqual(['m_0 medium 20']);
    // Storage's reading of the same 20 keys, every 15 s for 10 minutes: nothing new.
    const same = reading(20, 1, T0);
    for (let s = 15; s <= 600; s += 15) expect(detection.judgeFleetSpray(same, WALL)).toEqual([]);
    // Then 100 more keys of m_1: high, to both.
    expect(told(detection.judgeFleetSpray([...same, ...reading(120, 1, T0).slice(20).map((r) => ({ ...r, merchantId: 'm_1' }))], WALL))).toEqual(['m_0 high 120', 'm_1 high 120']);
  });

  it('leaves to the reading of storage a network it holds, so that its own share does not overwrite the whole, until readings stop', () => {
    let wall = WALL;
    const detection = new DetectionEngine({ rules: RULES, entitledPlans: ['business', 'enterprise'], config: () => CONFIG, clock: () => wall });
    // Storage holds 40 keys of m_0 failing, 20 of them this replica's.
    expect(told(detection.judgeFleetSpray(reading(40, 1, T0), wall))).toEqual(['m_0 medium 40']);
    // Its own 20 keys fail again a minute on: the reading judges the network, this replica's 20 are not told.
    expect(networkFindings(detection, spray(20, 1, T0 + MINUTE), 20)).toEqual([]);
    // No reading for a minute (partition 0 moved, storage fails): its own tally reports again, with the next batch, whatever it brings.
    wall += MINUTE;
    expect(told(networkFindings(detection, [request(5, 0, T0 + 2.5 * MINUTE)]))).toEqual(['m_0 medium 20']);
  });

  it('tells a merchant again of a reading that holds more of its keys than its own tally told, though no newer 401 (a spray of a few seconds)', () => {
    const detection = engine();
    // The spray's last 25 keys are this replica's: reported at once.
    expect(told(networkFindings(detection, spray(25, 1, T0 + 25 * SECOND), 25))).toEqual(['m_0 medium 25']);
    // Storage holds its first 25 too, another replica's: the same newest 401, twice the merchant's keys.
    const whole = [...Array.from({ length: 25 }, (_, k) => stored(0, 100 + k, T0 + k * SECOND)), ...Array.from({ length: 25 }, (_, k) => stored(0, k, T0 + (25 + k) * SECOND))];
    const findings = detection.judgeFleetSpray(whole, WALL);
    expect(told(findings)).toEqual(['m_0 medium 50']);
    expect(findings[0]!.finding.evidence.merchantKeyCount).toBe(50);
    expect(detection.judgeFleetSpray(whole, WALL + MINUTE)).toEqual([]);
  });

  it('reports a network again for more failing keys with no newer 401 (another replica\'s, stored after a reading), once a minute', () => {
    const detection = engine();
    const first = reading(25, 1, T0 + 15 * SECOND);
    expect(told(detection.judgeFleetSpray(first, WALL))).toEqual(['m_0 medium 25']);
    // m_1's 15 keys failed before m_0's, on a replica whose store flush came after that reading.
    const late = [...first, ...Array.from({ length: 15 }, (_, k) => stored(1, 100 + k, T0 + k * SECOND))];
    expect(detection.judgeFleetSpray(late, WALL + 30 * SECOND)).toEqual([]);
    // m_1 first; m_0 too, whose alert counts the network's 25 keys.
    expect(told(detection.judgeFleetSpray(late, WALL + MINUTE))).toEqual(['m_0 medium 40', 'm_1 medium 40']);
    expect(detection.judgeFleetSpray(late, WALL + 2 * MINUTE)).toEqual([]);
  });

  it('reports a network itself that the reading of storage holds with fewer failing keys (the reading\'s bounds cut it)', () => {
    const detection = engine();
    expect(told(detection.judgeFleetSpray(reading(20, 1, T0), WALL))).toEqual(['m_0 medium 20']);
    // Its own 24 keys of m_1 fail: more than the reading judged.
    expect(told(networkFindings(detection, spray(24, 1, T0 + 30 * SECOND).map((e, k) => ({ ...e, merchantId: 'm_1', apiKeyId: `pk_live_m1_k${k}` })), 24))).toEqual(['m_1 medium 24']);
  });

  it('tells a spray that stopped once, however long storage\'s reading of it goes on and its own tally sweeps', () => {
    let wall = WALL;
    const detection = new DetectionEngine({ rules: RULES, entitledPlans: ['business', 'enterprise'], config: () => CONFIG, clock: () => wall });
    const stopped = reading(20, 1, T0);
    const found: string[] = [];
    for (let s = 0; s <= 20 * 60; s += 15, wall += 15 * SECOND) {
      // Its own partitions' ordinary traffic moves its own time (and sweeps) on.
      found.push(...told(networkFindings(detection, [request(5, 0, T0 + s * SECOND)])), ...told(detection.judgeFleetSpray(stopped, wall)));
    }
    expect(found).toEqual(['m_0 medium 20']);
  });

  it('reports a network at most once a minute of the wall clock, then, for more keys, to its merchants, also once the spray has stopped', () => {
    const detection = engine();
    expect(told(detection.judgeFleetSpray(reading(20, 1, T0), WALL))).toEqual(['m_0 medium 20']);
    const more = [...reading(20, 1, T0), stored(1, 500, T0 + 30 * SECOND), stored(2, 501, T0 + 31 * SECOND)];
    expect(detection.judgeFleetSpray(more, WALL + 30 * SECOND)).toEqual([]);
    // The spray stopped at T0 + 31 s; the readings go on.
    expect(detection.judgeFleetSpray(more, WALL + 45 * SECOND)).toEqual([]);
    // Every merchant: those with new keys, and m_0, whose alert counts the network's 20 keys.
    expect(told(detection.judgeFleetSpray(more, WALL + 60 * SECOND))).toEqual(['m_0 medium 22', 'm_1 medium 22', 'm_2 medium 22']);
    expect(detection.judgeFleetSpray(more, WALL + 120 * SECOND)).toEqual([]);
  });

  it('leaves out the requests the detection config allowlists', () => {
    const config = DetectionConfig.parse(JSON.stringify({ merchants: { m_0: { allowlist: { ips: ['203.0.113.7'] } } } }));
    const detection = new DetectionEngine({ rules: RULES, entitledPlans: ['business', 'enterprise'], config: () => config, clock: () => WALL });
    // 20 keys, one of which failed from the allowlisted monitor alone.
    const requests = [...reading(19, 1, T0), stored(0, 19, T0 + 19 * SECOND, 0, { ip: '203.0.113.7' })];
    expect(detection.judgeFleetSpray(requests, WALL)).toEqual([]);
    expect(told(detection.judgeFleetSpray([...requests, stored(0, 20, T0 + 20 * SECOND)], WALL))).toEqual(['m_0 medium 20']);
  });

  it('counts a key id two merchants have once for each after the first to fail leaves the window', () => {
    const detection = engine();
    const x = (merchant: number, at: number) => request(merchant, 0, at, { apiKeyId: 'pk_x', ip: STUFFER, status: 401 });
    networkFindings(detection, [x(2, T0)]);
    networkFindings(detection, [x(1, T0 + 5 * MINUTE)]);
    // m_2's pk_x leaves the window; then m_1's fails again.
    networkFindings(detection, [request(0, 9, T0 + 10 * MINUTE + SECOND, { ip: STUFFER, status: 401 })]);
    networkFindings(detection, [x(1, T0 + 10 * MINUTE + 2 * SECOND)]);
    expect(detection.load.sprayEntries).toBe(2);
  });
});

describe('sprayedKeysOf', () => {
  const requests = (apiKeyId: string, ip: string, failures: number, judged: number, newest: number, totals?: Partial<SprayedRequests>): SprayedRequests => ({
    network: '203.0.113.0/24',
    merchantId: 'm_1',
    apiKeyId,
    partition: 2,
    ip,
    userAgent: 'curl/8.5.0',
    failures,
    judged,
    first: failures > 0 ? newest - 1_000 : 0,
    newest: failures > 0 ? newest : 0,
    newestEventId: failures > 0 ? `${apiKeyId}_${ip}` : '',
    country: 'NL',
    plan: 'business',
    keyRows: 1,
    keyFailures: failures,
    keyJudged: judged,
    keyLive: true,
    ...totals,
  });
  const MONITOR = '203.0.113.7';
  const allowlisted = (r: SprayedRequests) => r.ip === MONITOR;

  it('sums a key\'s requests from the network\'s addresses, but those the allowlists cover, and takes its newest 401 as its sample', () => {
    const keys = sprayedKeysOf(
      [
        // a: three 401s from the allowlisted monitor; from .8, one 401 and three that succeeded. Mostly not failing, then.
        requests('a', MONITOR, 3, 3, T0 + 9_000, { keyRows: 2, keyFailures: 4, keyJudged: 7 }),
        requests('a', '203.0.113.8', 1, 4, T0 + 5_000, { keyRows: 2, keyFailures: 4, keyJudged: 7 }),
        // b: 401s from the monitor only: not a key of the spray.
        requests('b', MONITOR, 2, 2, T0),
        // c: a 401 from .8, then another and a 200 from .9; its newest 401 is .9's.
        requests('c', '203.0.113.8', 1, 1, T0, { keyRows: 2, keyFailures: 2, keyJudged: 3 }),
        requests('c', '203.0.113.9', 1, 2, T0 + 2_000, { keyRows: 2, keyFailures: 2, keyJudged: 3 }),
        // d: a 200 alone.
        requests('d', '203.0.113.8', 0, 1, 0),
      ],
      allowlisted,
      T0 + MINUTE,
    );
    expect(keys.map(({ apiKeyId, failures, failedMostly, ip, first, newest, newestEventId }) => ({ apiKeyId, failures, failedMostly, ip, first, newest, newestEventId }))).toEqual([
      { apiKeyId: 'a', failures: 1, failedMostly: false, ip: '203.0.113.8', first: T0 + 4_000, newest: T0 + 5_000, newestEventId: 'a_203.0.113.8' },
      { apiKeyId: 'c', failures: 2, failedMostly: true, ip: '203.0.113.9', first: T0 - 1_000, newest: T0 + 2_000, newestEventId: 'c_203.0.113.9' },
    ]);
  });

  it('judges a key whose rows the reading cut by its totals: the requests of the rows left out count', () => {
    // One 401 row given of 11; the ten left out succeeded 30 times.
    const cut = requests('a', '203.0.113.8', 1, 1, T0, { keyRows: 11, keyFailures: 1, keyJudged: 31 });
    expect(sprayedKeysOf([cut], allowlisted, T0 + MINUTE).map((key) => key.failedMostly)).toEqual([false]);
    expect(sprayedKeysOf([{ ...cut, keyRows: 1, keyJudged: 1 }], allowlisted, T0 + MINUTE).map((key) => key.failedMostly)).toEqual([true]);
  });

  it('leaves out a key whose 401s are dated after notAfter', () => {
    expect(sprayedKeysOf([requests('a', '203.0.113.8', 1, 1, T0 + 2 * MINUTE)], allowlisted, T0 + MINUTE)).toEqual([]);
  });
});
