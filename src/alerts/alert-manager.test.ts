import { describe, expect, it } from 'vitest';
import type { Finding, RecommendedAction, Severity } from '../detect/types.ts';
import { changeStatus, duplicateResolution, type Alert, type AlertStatus } from './alert.ts';
import { AlertManager, laterCreatedFirst, type RuleInfo } from './alert-manager.ts';
import { alertInsights } from './insights.ts';
import { finding as makeFinding, fixtureFinding } from './test-findings.ts';

const T0 = Date.UTC(2026, 10, 20, 12, 0, 0);
const rule: RuleInfo = {
  id: 'velocity_attack',
  version: '1.0.0',
  actions: { low: 'monitor', medium: 'rate_limit', high: 'rate_limit', critical: 'block' } as Record<Severity, RecommendedAction>,
};

function finding(severity: Severity, at = T0, scope = 'pk_live_a'): Finding {
  return makeFinding(severity, at, scope);
}

/**
 * A credential-stuffing report (source-spray.ts) to m_1 of `keys` of its keys, the newest 401 at
 * `at`: a replica's share (own_partitions) or the reading of every partition (all_partitions).
 */
function sprayReport(
  judgedFrom: 'own_partitions' | 'all_partitions',
  keys: number,
  at: number,
  { severity = 'medium' as Severity, merchantKeys = Array.from({ length: Math.min(keys, 20) }, (_, k) => `pk_live_${k}`) } = {},
): Finding {
  const base = makeFinding(severity, at, 'network:203.0.113.0/24');
  return {
    ...base,
    apiKeyId: null,
    title: `Credential stuffing from 203.0.113.0/24, ${keys} of them yours`,
    evidence: { ...base.evidence, judgedBy: 'network_across_keys', judgedFrom, merchantKeys, merchantKeyCount: keys, lastFailureAt: new Date(at).toISOString(), windowMs: 600_000 },
  };
}

/** An admin's moves, made in turn, as the alert service records them once stored. */
function admin(alerts: AlertManager, alert: Alert, moves: AlertStatus[], at = T0): Alert {
  for (const to of moves) {
    const outcome = changeStatus(alert, to, 'admin@m_1', 'a note', at);
    if (!outcome.ok) throw new Error(`${alert.status} -> ${to} refused`);
    alert = alerts.sync(outcome.alert);
  }
  return alert;
}

function manager(options: { aiInsights?: boolean } = {}) {
  let now = T0;
  let ids = 0;
  const alerts = new AlertManager({ suppressionMs: 3_600_000, now: () => now, newId: () => `id-${++ids}`, ...options });
  return { alerts, advance: (ms: number) => (now += ms) };
}

describe('AlertManager', () => {
  it('creates one open alert, then counts repeats on it', () => {
    const { alerts, advance } = manager();
    const first = alerts.apply('m_1', rule, finding('medium'));
    expect(first.change).toBe('created');
    expect(first.alert).toMatchObject({ id: 'id-1', status: 'open', occurrences: 1, recommendedAction: 'rate_limit' });
    advance(30_000);
    const repeat = alerts.apply('m_1', rule, finding('medium', T0 + 30_000));
    expect(repeat.change).toBe('updated');
    expect(repeat.alert).toMatchObject({ id: 'id-1', occurrences: 2, lastSeenAt: new Date(T0 + 30_000).toISOString() });
  });

  it('escalates severity but never lowers it', () => {
    const { alerts } = manager();
    alerts.apply('m_1', rule, finding('medium'));
    const up = alerts.apply('m_1', rule, finding('critical'));
    expect(up.change).toBe('escalated');
    expect(up.alert).toMatchObject({ severity: 'critical', recommendedAction: 'block' });
    const down = alerts.apply('m_1', rule, finding('low', T0 + 1_000));
    expect(down.alert).toMatchObject({ severity: 'critical', title: 'critical finding' });
  });

  it('places the risk score by each finding in its own band: a weaker repeat does not raise a critical alert\'s', () => {
    const { alerts } = manager();
    const critical = alerts.apply('m_1', rule, { ...finding('critical'), confidence: 0.1 }).alert!;
    expect(critical.riskScore).toBeCloseTo(0.91, 3);
    // A medium finding sure of itself (the top of the medium band) is still a medium finding.
    const weaker = alerts.apply('m_1', rule, { ...finding('medium', T0 + 1_000), confidence: 1 });
    expect(weaker).toMatchObject({ change: 'updated', alert: { severity: 'critical', riskScore: critical.riskScore } });
    // A stronger critical finding raises it; an escalation is placed in the new band by its own confidence.
    expect(alerts.apply('m_1', rule, { ...finding('critical', T0 + 2_000), confidence: 0.5 }).alert!.riskScore).toBeCloseTo(0.95, 3);
    const { alerts: other } = manager();
    other.apply('m_1', rule, { ...finding('medium'), confidence: 1 });
    expect(other.apply('m_1', rule, { ...finding('high', T0 + 1_000), confidence: 0 }).alert).toMatchObject({ severity: 'high', riskScore: 0.7 });
  });

  it('does not count the same evidence twice: a finding no newer than the alert is stale', () => {
    const { alerts, advance } = manager();
    alerts.apply('m_1', rule, finding('medium', T0 + 30_000));
    advance(60_000);
    // The rule judged the window again (another event of the key arrived), and found the same events.
    expect(alerts.apply('m_1', rule, finding('medium', T0 + 30_000))).toEqual({ alert: undefined, change: 'stale' });
    expect(alerts.apply('m_1', rule, finding('medium', T0 + 10_000))).toEqual({ alert: undefined, change: 'stale' });
    // Newer evidence is a repeat; the same evidence judged more severe (say, lowered thresholds) escalates.
    expect(alerts.apply('m_1', rule, finding('medium', T0 + 40_000))).toMatchObject({ change: 'updated', alert: { occurrences: 2 } });
    expect(alerts.apply('m_1', rule, finding('high', T0 + 40_000))).toMatchObject({ change: 'escalated', alert: { occurrences: 3 } });
  });

  it('describes a spray\'s alert by the reading of every partition over a replica\'s share, whichever came first, even when no later', () => {
    const { alerts } = manager();
    alerts.apply('m_1', rule, sprayReport('own_partitions', 1, T0));
    // The reading holds the same key and 401 (its only one, on that replica), and every other replica's keys:
    // a better description of the same sighting, not another sighting.
    const reading = { ...sprayReport('all_partitions', 1, T0), title: 'the whole' };
    expect(alerts.apply('m_1', rule, reading)).toMatchObject({ change: 'updated', alert: { title: 'the whole', occurrences: 1 } });
    expect(alerts.apply('m_1', rule, reading)).toEqual({ alert: undefined, change: 'stale' });
    // The replica's share of a newer 401 adds its sighting, not its description.
    expect(alerts.apply('m_1', rule, sprayReport('own_partitions', 1, T0 + 5_000))).toMatchObject({ change: 'updated', alert: { title: 'the whole', occurrences: 2, lastSeenAt: new Date(T0 + 5_000).toISOString() } });
    // A reading with a newer 401 than the whole describes it, though the alert was seen later still; an older one does not.
    const newer = { ...sprayReport('all_partitions', 1, T0 + 3_000), title: 'a newer whole' };
    expect(alerts.apply('m_1', rule, newer)).toMatchObject({ change: 'updated', alert: { title: 'a newer whole', occurrences: 2, lastSeenAt: new Date(T0 + 5_000).toISOString() } });
    expect(alerts.apply('m_1', rule, sprayReport('all_partitions', 2, T0 + 1_000))).toEqual({ alert: undefined, change: 'stale' });
    // Of two readings as late, the one listing more of the merchant's keys.
    const more = sprayReport('all_partitions', 2, T0 + 3_000);
    expect(alerts.apply('m_1', rule, more).alert!.evidence).toEqual(more.evidence);
    expect(alerts.apply('m_1', rule, sprayReport('all_partitions', 1, T0 + 3_000))).toEqual({ alert: undefined, change: 'stale' });
    // Then the one holding more of the network's keys (a reading taken before every replica had stored its own, then the whole).
    const wider = { ...more, evidence: { ...more.evidence, distinctKeys: 52 } };
    expect(alerts.apply('m_1', rule, wider)).toMatchObject({ change: 'updated', alert: { occurrences: 2, evidence: { distinctKeys: 52 } } });
    expect(alerts.apply('m_1', rule, more)).toEqual({ alert: undefined, change: 'stale' });
  });

  it('describes a spray\'s alert by a replica\'s share only when it is more than a window later than the reading (no reading since)', () => {
    const cases: [string, Finding, boolean][] = [
      ['more keys, earlier', sprayReport('own_partitions', 13, T0 - 1_000), false],
      ['more keys, later', sprayReport('own_partitions', 13, T0 + 1_000), false],
      ['a new key, later', sprayReport('own_partitions', 6, T0 + 6_000, { merchantKeys: ['pk_live_new', 'pk_live_1'] }), false],
      ['a window later, with more keys', sprayReport('own_partitions', 13, T0 + 10 * 60_000), false],
      ['more than a window later', sprayReport('own_partitions', 6, T0 + 10 * 60_000 + 1), true],
    ];
    for (const [name, share, describes] of cases) {
      const { alerts } = manager();
      const whole = alerts.apply('m_1', rule, sprayReport('all_partitions', 12, T0)).alert!;
      const evidence = alerts.apply('m_1', rule, share).alert?.evidence ?? whole.evidence;
      expect([name, evidence]).toEqual([name, describes ? share.evidence : whole.evidence]);
    }
  });

  it('describes a spray\'s alert by the later of two readings or of two shares, fewer keys or not, and by no report of a lower severity nor from before a resolution', () => {
    const { alerts } = manager();
    alerts.apply('m_1', rule, sprayReport('all_partitions', 30, T0));
    const fewer = sprayReport('all_partitions', 25, T0 + 3 * 60_000, { merchantKeys: Array.from({ length: 20 }, (_, k) => `pk_live_new${k}`) });
    expect(alerts.apply('m_1', rule, fewer).alert!.evidence).toEqual(fewer.evidence);
    const high = alerts.apply('m_1', rule, sprayReport('all_partitions', 25, T0 + 4 * 60_000, { severity: 'high' })).alert!;
    expect(alerts.apply('m_1', rule, sprayReport('all_partitions', 70, T0 + 5 * 60_000))).toMatchObject({ change: 'updated', alert: { severity: 'high', evidence: high.evidence } });
    expect(alerts.apply('m_1', rule, sprayReport('all_partitions', 80, T0 + 5 * 60_000))).toEqual({ alert: undefined, change: 'stale' });
    // A single replica (or no reading yet): its later share describes the alert.
    const { alerts: single } = manager();
    single.apply('m_1', rule, sprayReport('own_partitions', 12, T0));
    const next = sprayReport('own_partitions', 6, T0 + 60_000);
    expect(single.apply('m_1', rule, next).alert!.evidence).toEqual(next.evidence);
    // Resolved, then reopened by a later share: a reading of 401s from before the resolution was dealt with.
    const { alerts: reopened, advance } = manager();
    const opened = reopened.apply('m_1', rule, sprayReport('own_partitions', 12, T0)).alert!;
    advance(62_000);
    admin(reopened, opened, ['acknowledged', 'resolved'], T0 + 62_000);
    expect(reopened.apply('m_1', rule, sprayReport('own_partitions', 2, T0 + 63_000)).change).toBe('reopened');
    expect(reopened.apply('m_1', rule, sprayReport('all_partitions', 12, T0 + 61_500))).toEqual({ alert: undefined, change: 'stale' });
    // Other rules' repeats, and reports stored before they said which tally judged them, describe their alerts when later.
    const { alerts: third } = manager();
    third.apply('m_1', rule, { ...finding('medium', T0), evidence: { sampleEventIds: ['e1'], windowMs: 60_000, merchantKeyCount: 12 } });
    expect(third.apply('m_1', rule, { ...finding('medium', T0 + 1_000), evidence: { sampleEventIds: ['e2'], windowMs: 60_000, merchantKeyCount: 6 } }).alert!.evidence).toMatchObject({ merchantKeyCount: 6 });
    const { alerts: older } = manager();
    const { judgedFrom: _judgedFrom, ...untold } = sprayReport('all_partitions', 30, T0).evidence;
    older.apply('m_1', rule, { ...sprayReport('all_partitions', 30, T0), evidence: untold as Finding['evidence'] });
    const share = sprayReport('own_partitions', 6, T0 + 1_000);
    expect(older.apply('m_1', rule, share).alert!.evidence).toEqual(share.evidence);
    expect(older.apply('m_1', rule, { ...share, lastSeenAt: T0 + 2_000, evidence: { ...share.evidence, lastFailureAt: 'not a time' } }).alert!.evidence).toMatchObject({ lastFailureAt: 'not a time' });
  });

  it('keeps separate alerts per merchant and per scope', () => {
    const { alerts } = manager();
    const a = alerts.apply('m_1', rule, finding('high'));
    const b = alerts.apply('m_2', rule, finding('high'));
    const c = alerts.apply('m_1', rule, finding('high', T0, 'pk_live_b'));
    expect(new Set([a.alert?.id, b.alert?.id, c.alert?.id]).size).toBe(3);
  });

  it('stays quiet after a dismissal for the suppression period, then alerts again', () => {
    const { alerts, advance } = manager();
    const created = alerts.apply('m_1', rule, finding('high')).alert!;
    admin(alerts, created, ['dismissed']);
    advance(10 * 60_000);
    expect(alerts.apply('m_1', rule, finding('high')).change).toBe('suppressed');
    advance(60 * 60_000);
    // Once the suppression ends, evidence from before the dismissal still says nothing new.
    expect(alerts.apply('m_1', rule, finding('high'))).toEqual({ alert: undefined, change: 'stale' });
    const again = alerts.apply('m_1', rule, finding('high', T0 + 70 * 60_000));
    expect(again.change).toBe('created');
    expect(again.alert?.id).not.toBe(created.id);
  });

  it('reopens a resolved alert whose pattern recurs, described by the new evidence alone, recording why', () => {
    const { alerts, advance } = manager();
    const created = alerts.apply('m_1', rule, finding('critical')).alert!;
    admin(alerts, created, ['acknowledged', 'resolved'], T0 + 120_000);
    advance(180_000);
    const recurring = finding('medium', T0 + 150_000);
    const reopened = alerts.apply('m_1', rule, recurring);
    expect(reopened.change).toBe('reopened');
    expect(reopened.alert).toMatchObject({
      id: created.id,
      status: 'open',
      severity: 'medium',
      recommendedAction: 'rate_limit',
      title: 'medium finding',
      occurrences: 1,
      firstSeenAt: new Date(recurring.firstSeenAt).toISOString(),
      lastSeenAt: new Date(recurring.lastSeenAt).toISOString(),
    });
    expect(reopened.alert!.riskScore).toBeLessThan(0.7);
    expect(reopened.alert?.history.at(-1)).toMatchObject({ actor: 'system', from: 'resolved', to: 'open' });
  });

  it('does not reopen a resolved alert on evidence from before its resolution', () => {
    const { alerts, advance } = manager();
    const created = alerts.apply('m_1', rule, finding('critical', T0 + 10_000)).alert!;
    admin(alerts, created, ['acknowledged', 'resolved'], T0 + 120_000);
    advance(300_000);
    // An ordinary request made the rule judge the window, which still holds the old events.
    expect(alerts.apply('m_1', rule, finding('critical', T0 + 10_000))).toEqual({ alert: undefined, change: 'stale' });
    expect(alerts.apply('m_1', rule, finding('critical', T0 + 120_000))).toEqual({ alert: undefined, change: 'stale' });
  });
});

describe('AlertManager and requests answered 401', () => {
  const bot: RuleInfo = { id: 'bot_traffic', version: '1.0.0', actions: { low: 'monitor', medium: 'investigate', high: 'rate_limit', critical: 'block' } };
  const seen = (severity: Severity, keyHolderSeverity: Severity | null | undefined, at = T0): Finding => ({ ...finding(severity, at), keyHolderSeverity });

  it('acts on the key only as far as the requests that passed authentication show, saying why', () => {
    const { alerts } = manager();
    const strangers = alerts.apply('m_1', bot, seen('critical', null)).alert!;
    expect(strangers).toMatchObject({ severity: 'critical', recommendedAction: 'investigate' });
    expect(strangers.summary).toBe(
      `${finding('critical').summary} Recommended: investigate, not block: the key's requests that passed authentication do not show that much; ` +
        'the rest were answered 401, which anyone who knows the key\'s id can cause, so the key is not blocked for them: that would hit its owner.',
    );
    expect(alerts.apply('m_2', bot, seen('critical', 'high')).alert).toMatchObject({ recommendedAction: 'rate_limit', summary: expect.stringContaining('Recommended: rate_limit, not block') });
    // The holders' own requests at medium recommend investigate, which does not act on the key either.
    expect(alerts.apply('m_3', bot, seen('critical', 'medium')).alert).toMatchObject({ recommendedAction: 'investigate' });
    const holders = alerts.apply('m_4', bot, seen('critical', 'critical')).alert!;
    expect(holders).toMatchObject({ recommendedAction: 'block', summary: finding('critical').summary });
    // Nothing to cap: an alert that does not act on the key, and a window without 401s.
    expect(alerts.apply('m_5', bot, seen('medium', null)).alert).toMatchObject({ recommendedAction: 'investigate', summary: finding('medium').summary });
    expect(alerts.apply('m_6', bot, seen('critical', undefined)).alert).toMatchObject({ recommendedAction: 'block' });
    // Never more than the rule's action for the alert's own severity.
    expect(alerts.apply('m_7', bot, seen('high', 'critical')).alert).toMatchObject({ recommendedAction: 'rate_limit' });
  });

  it('lets a stranger\'s repeat raise neither the score within the alert\'s band (which decides a block) nor leave a stale note', () => {
    const { alerts, advance } = manager();
    const earned = alerts.apply('m_1', bot, { ...seen('critical', 'critical'), confidence: 0.2 }).alert!;
    advance(1_000);
    const repeated = alerts.apply('m_1', bot, { ...seen('critical', null, T0 + 1_000), confidence: 1 }).alert!;
    expect(repeated).toMatchObject({ riskScore: earned.riskScore, recommendedAction: 'block', lastSeenAt: new Date(T0 + 1_000).toISOString() });
    expect(repeated.summary).toBe(finding('critical').summary); // the alert recommends its rule's action: no note
    // An alert a stranger opened, then the holders' own requests at high: throttled, and the note says so.
    const opened = alerts.apply('m_2', bot, seen('critical', null)).alert!;
    advance(1_000);
    const theirs = alerts.apply('m_2', bot, seen('high', 'high', T0 + 2_000)).alert!;
    expect(theirs).toMatchObject({ severity: 'critical', recommendedAction: 'rate_limit', title: opened.title });
    expect(theirs.summary).toBe(`${finding('critical').summary} Recommended: rate_limit, not block: the key's requests that passed authentication do not show that much; the rest were answered 401, which anyone who knows the key's id can cause, so the key is not blocked for them: that would hit its owner.`);
  });

  it('keeps the action the key\'s holders earned through a stranger\'s repeats, and raises it only on theirs', () => {
    const { alerts, advance } = manager();
    alerts.apply('m_1', bot, seen('high', 'high'));
    advance(1_000);
    // A stranger's 401s make it critical: the key is still throttled, not blocked.
    const escalated = alerts.apply('m_1', bot, seen('critical', null, T0 + 1_000)).alert!;
    expect(escalated).toMatchObject({ severity: 'critical', recommendedAction: 'rate_limit' });
    advance(1_000);
    expect(alerts.apply('m_1', bot, seen('critical', 'critical', T0 + 2_000)).alert).toMatchObject({ recommendedAction: 'block' });
    advance(1_000);
    expect(alerts.apply('m_1', bot, seen('critical', null, T0 + 3_000)).alert).toMatchObject({ recommendedAction: 'block' });
  });

  it('keeps when the holders last earned the action (actionSeenAt), which a stranger\'s repeat does not move', () => {
    const { alerts, advance } = manager();
    const iso = (ms: number) => new Date(ms).toISOString();
    expect(alerts.apply('m_1', bot, seen('high', 'high')).alert).toMatchObject({ lastSeenAt: iso(T0), actionSeenAt: iso(T0) });
    advance(600_000);
    // Strangers' 401s go on: the alert is seen, its action is not earned again.
    expect(alerts.apply('m_1', bot, seen('high', null, T0 + 600_000)).alert).toMatchObject({ lastSeenAt: iso(T0 + 600_000), actionSeenAt: iso(T0) });
    advance(600_000);
    expect(alerts.apply('m_1', bot, seen('high', 'high', T0 + 1_200_000)).alert).toMatchObject({ lastSeenAt: iso(T0 + 1_200_000), actionSeenAt: iso(T0 + 1_200_000) });
    // An alert strangers opened has none until the holders earn one.
    expect(alerts.apply('m_2', bot, seen('critical', null, T0 + 1_200_000)).alert!.actionSeenAt).toBeUndefined();
    // An alert whose rule does not act on the key at this severity has none either.
    expect(alerts.apply('m_3', bot, seen('medium', 'medium', T0 + 1_200_000)).alert!.actionSeenAt).toBeUndefined();
    // The holders' own requests end before the 401s after them (Finding.keyHolderLastSeenAt): those extend nothing.
    advance(600_000);
    const late401s = { ...seen('high', 'high', T0 + 1_800_000), keyHolderLastSeenAt: T0 + 1_500_000 };
    expect(alerts.apply('m_1', bot, late401s).alert).toMatchObject({ lastSeenAt: iso(T0 + 1_800_000), actionSeenAt: iso(T0 + 1_500_000) });
  });

  it('keeps when the holders last earned a block (blockSeenAt): their later requests that earn only a throttle do not move it', () => {
    const { alerts, advance } = manager();
    const iso = (ms: number) => new Date(ms).toISOString();
    expect(alerts.apply('m_1', bot, seen('critical', 'critical')).alert).toMatchObject({ recommendedAction: 'block', actionSeenAt: iso(T0), blockSeenAt: iso(T0) });
    advance(600_000);
    // The holders go on at a throttle's worth: the alert still recommends block, and its block was earned at T0.
    expect(alerts.apply('m_1', bot, seen('critical', 'high', T0 + 600_000)).alert).toMatchObject({ recommendedAction: 'block', actionSeenAt: iso(T0 + 600_000), blockSeenAt: iso(T0) });
    advance(600_000);
    expect(alerts.apply('m_1', bot, seen('critical', 'critical', T0 + 1_200_000)).alert).toMatchObject({ blockSeenAt: iso(T0 + 1_200_000) });
    // A throttle earns none; the holders' own escalation to a block does.
    expect(alerts.apply('m_2', bot, seen('high', 'high', T0 + 1_200_000)).alert!.blockSeenAt).toBeUndefined();
    advance(60_000);
    expect(alerts.apply('m_2', bot, seen('critical', 'critical', T0 + 1_260_000)).alert).toMatchObject({ recommendedAction: 'block', blockSeenAt: iso(T0 + 1_260_000) });
    // An alert stored before blockSeenAt was kept, recommending block, was earned when its action last was.
    const { blockSeenAt: _none, ...stored } = alerts.apply('m_3', bot, seen('critical', 'critical', T0 + 1_260_000)).alert!;
    const { alerts: restarted } = manager();
    restarted.load([stored]);
    advance(60_000);
    expect(restarted.apply('m_3', bot, seen('critical', 'high', T0 + 1_320_000)).alert).toMatchObject({ actionSeenAt: iso(T0 + 1_320_000), blockSeenAt: iso(T0 + 1_260_000) });
  });

  it('holds an alert stored before actionSeenAt was kept, acting on the key, to its lastSeenAt as stored: strangers move only that', () => {
    const { alerts, advance } = manager();
    const iso = (ms: number) => new Date(ms).toISOString();
    const { actionSeenAt: _none, ...stored } = alerts.apply('m_1', bot, seen('high', 'high')).alert!;
    const { alerts: restarted } = manager();
    restarted.load([stored]);
    advance(600_000);
    expect(restarted.apply('m_1', bot, seen('high', null, T0 + 600_000)).alert).toMatchObject({ lastSeenAt: iso(T0 + 600_000), actionSeenAt: iso(T0) });
    // One that acts on nothing gets none from its lastSeenAt.
    const { actionSeenAt: _neither, ...looked } = alerts.apply('m_2', bot, seen('medium', 'medium')).alert!;
    restarted.load([looked]);
    expect(restarted.apply('m_2', bot, seen('medium', null, T0 + 600_000)).alert!.actionSeenAt).toBeUndefined();
  });

  it('forgets the earlier episode\'s actionSeenAt when a resolved alert is reopened by a stranger\'s requests', () => {
    const { alerts, advance } = manager();
    const earned = alerts.apply('m_1', bot, seen('high', 'high')).alert!;
    admin(alerts, earned, ['acknowledged', 'resolved'], T0 + 60_000);
    advance(120_000);
    const reopened = alerts.apply('m_1', bot, seen('high', null, T0 + 120_000));
    expect(reopened).toMatchObject({ change: 'reopened', alert: { recommendedAction: 'investigate' } });
    expect(reopened.alert!.actionSeenAt).toBeUndefined();
  });
});

describe('AlertManager over days', () => {
  it('forgets resolved and dismissed alerts after a day, as a start would not load them: a later recurrence opens a new alert', () => {
    const { alerts, advance } = manager();
    const resolved = alerts.apply('m_1', rule, finding('high')).alert!;
    admin(alerts, resolved, ['acknowledged', 'resolved'], T0 + 60_000);
    const dismissed = alerts.apply('m_1', rule, finding('high', T0, 'pk_live_b')).alert!;
    admin(alerts, dismissed, ['dismissed'], T0 + 60_000);
    const open = alerts.apply('m_1', rule, finding('high', T0, 'pk_live_c')).alert!;
    expect(alerts.closedAlertMemoryMs).toBe(24 * 3_600_000);

    advance(23 * 3_600_000);
    expect(alerts.forgetClosed()).toBe(0);
    advance(2 * 3_600_000);
    expect(alerts.forgetClosed()).toBe(2);
    const later = T0 + 25 * 3_600_000;
    const recurred = alerts.apply('m_1', rule, finding('high', later));
    expect(recurred).toMatchObject({ change: 'created', alert: { status: 'open', occurrences: 1 } });
    expect(recurred.alert!.id).not.toBe(resolved.id);
    expect(alerts.apply('m_1', rule, finding('high', later, 'pk_live_b'))).toMatchObject({ change: 'created' });
    // An open alert is never forgotten, however old.
    expect(alerts.apply('m_1', rule, finding('high', later, 'pk_live_c'))).toMatchObject({ change: 'updated', alert: { id: open.id, occurrences: 2 } });
  });

  it('remembers a dismissal for the suppression period when that is longer than a day', () => {
    const week = 7 * 24 * 3_600_000;
    let now = T0;
    const alerts = new AlertManager({ suppressionMs: week, now: () => now });
    const dismissed = alerts.apply('m_1', rule, finding('high')).alert!;
    admin(alerts, dismissed, ['dismissed'], T0);
    now += week - 60_000;
    expect(alerts.forgetClosed()).toBe(0);
    expect(alerts.apply('m_1', rule, finding('critical', now)).change).toBe('suppressed');
  });
});

describe('AlertManager across replicas', () => {
  it('honours a dismissal made on another replica: the key is silent after sync', () => {
    const replicaA = manager();
    const replicaB = manager();
    const created = replicaB.alerts.apply('m_1', rule, finding('high')).alert!;
    replicaA.alerts.sync(created); // A learns B's alert from storage
    const dismissed = changeStatus(created, 'dismissed', 'admin@m_1', 'load test', T0 + 1_000);
    if (!dismissed.ok) throw new Error('dismissal refused');
    // B repeats the alert before it hears of the dismissal: a later copy, without the dismissal.
    replicaB.advance(2_000);
    const repeat = replicaB.alerts.apply('m_1', rule, finding('high', T0 + 2_000)).alert!;
    expect(repeat.status).toBe('open');
    const merged = replicaB.alerts.sync(dismissed.alert);
    expect(merged).toMatchObject({ id: repeat.id, status: 'dismissed', occurrences: 2 });
    replicaB.advance(1_000);
    expect(replicaB.alerts.apply('m_1', rule, finding('high', T0 + 3_000)).change).toBe('suppressed');
  });

  it('gives an admin\'s change the status stored by another replica, even when the copy here is newer', () => {
    const { alerts, advance } = manager();
    const created = alerts.apply('m_1', rule, finding('high')).alert!;
    const acknowledged = changeStatus(created, 'acknowledged', 'admin@m_1', undefined, T0 + 1_000);
    if (!acknowledged.ok) throw new Error('refused');
    advance(2_000);
    const repeat = alerts.apply('m_1', rule, finding('high', T0 + 2_000)).alert!; // not synced: still open here
    expect(repeat.status).toBe('open');
    expect(alerts.current(acknowledged.alert)).toMatchObject({ status: 'acknowledged', occurrences: 2, history: acknowledged.alert.history });
  });

  it('keeps its own repeats over a copy stamped by a replica whose clock is ahead, once it has seen that copy', () => {
    const { alerts, advance } = manager();
    const created = alerts.apply('m_1', rule, finding('high')).alert!;
    // Acknowledged through a replica whose clock is 5 s ahead of this one.
    const acknowledged = changeStatus(created, 'acknowledged', 'admin@m_1', undefined, T0 + 5_000);
    if (!acknowledged.ok) throw new Error('refused');
    alerts.sync(acknowledged.alert);
    advance(1_000);
    const repeat = alerts.apply('m_1', rule, finding('high', T0 + 1_000)).alert!;
    expect(Date.parse(repeat.updatedAt)).toBeGreaterThan(T0 + 5_000); // made from that copy: newer than it
    // Read from storage again (a sync): the repeat made here is not undone.
    expect(alerts.sync(acknowledged.alert)).toMatchObject({ status: 'acknowledged', occurrences: 2 });
  });

  it('reopens after a resolution stamped by a replica whose clock is ahead, and stays open when that copy is read again', () => {
    const { alerts, advance } = manager();
    const created = alerts.apply('m_1', rule, finding('high')).alert!;
    const resolved = admin(alerts, created, ['acknowledged', 'resolved'], T0 + 5_000); // the other replica's clock
    advance(2_000);
    // Evidence newer than the resolution (an event's time may be ahead of this replica's clock).
    const reopened = alerts.apply('m_1', rule, finding('high', T0 + 6_000));
    expect(reopened).toMatchObject({ change: 'reopened', alert: { status: 'open' } });
    expect(reopened.alert!.history.at(-1)!.at > resolved.history.at(-1)!.at).toBe(true);
    expect(alerts.sync(resolved).status).toBe('open');
  });

  it('continues an alert another replica created for the key instead of opening a second one', () => {
    const previousOwner = manager();
    const newOwner = manager();
    const created = previousOwner.alerts.apply('m_1', rule, finding('medium')).alert!;
    newOwner.alerts.sync({ ...created, id: 'from-previous-owner' });
    newOwner.advance(10_000);
    const next = newOwner.alerts.apply('m_1', rule, finding('medium', T0 + 10_000));
    expect(next).toMatchObject({ change: 'updated', alert: { id: 'from-previous-owner', occurrences: 2 } });
  });

  it('reopens a resolution made elsewhere when it hears of it after counting a recurrence as a repeat', () => {
    const { alerts, advance } = manager();
    const created = alerts.apply('m_1', rule, finding('high')).alert!;
    // Another replica: acknowledged, then resolved at T0 + 1 s; this replica (the key's owner) has not synced.
    const acknowledged = changeStatus(created, 'acknowledged', 'alice', undefined, T0 + 500);
    if (!acknowledged.ok) throw new Error('refused');
    const resolved = changeStatus(acknowledged.alert, 'resolved', 'alice', 'key rotated', T0 + 1_000);
    if (!resolved.ok) throw new Error('refused');
    // The attack comes back at T0 + 2 s: an escalation of the alert it thinks open.
    advance(2_000);
    expect(alerts.apply('m_1', rule, finding('critical', T0 + 2_000)).change).toBe('escalated');
    // Its read of the others' alerts brings the resolution: the pattern recurred after it.
    advance(1_000);
    const merged = alerts.sync(resolved.alert);
    expect(merged).toMatchObject({ status: 'open', severity: 'critical', lastSeenAt: new Date(T0 + 2_000).toISOString(), occurrences: 1 });
    expect(merged.history.map((entry) => `${entry.actor}:${entry.from}->${entry.to}`)).toEqual([
      'system:null->open',
      'alice:open->acknowledged',
      'alice:acknowledged->resolved',
      'system:resolved->open',
    ]);
    expect(merged.history.at(-1)!.at > resolved.alert.history.at(-1)!.at).toBe(true);
    // Read again, the resolved copy changes nothing: one reopen.
    expect(alerts.sync(resolved.alert)).toEqual(merged);
    expect(alerts.current(resolved.alert)).toEqual(merged);
  });

  it('does not reopen a resolution made elsewhere for evidence counted before it, nor for what the resolution knew', () => {
    const { alerts, advance } = manager();
    const created = alerts.apply('m_1', rule, finding('high')).alert!;
    advance(500);
    alerts.apply('m_1', rule, finding('high', T0 + 500)); // a repeat the resolving replica has not seen
    const acknowledged = changeStatus(created, 'acknowledged', 'alice', undefined, T0 + 1_000);
    if (!acknowledged.ok) throw new Error('refused');
    const resolved = changeStatus(acknowledged.alert, 'resolved', 'alice', undefined, T0 + 2_000);
    if (!resolved.ok) throw new Error('refused');
    advance(2_000);
    expect(alerts.sync(resolved.alert)).toMatchObject({ status: 'resolved', occurrences: 2 });
    // A copy that knows the resolution, with evidence after it (its lastSeenAt came with the resolving copy), neither.
    const other = manager();
    const seen = { ...resolved.alert, lastSeenAt: new Date(T0 + 3_000).toISOString() };
    other.alerts.sync(seen);
    expect(other.alerts.sync(seen).status).toBe('resolved');
  });

  it('keeps the later created of two alerts for one key when their ids differ', () => {
    const { alerts } = manager();
    const older = alerts.apply('m_1', rule, finding('medium')).alert!;
    const dismissed = admin(alerts, older, ['dismissed'], T0 + 1_000);
    // Opened elsewhere after the dismissal; then the dismissed copy is read again, written later still.
    const newer = { ...older, id: 'newer', createdAt: new Date(T0 + 2_000).toISOString(), updatedAt: new Date(T0 + 2_000).toISOString() };
    alerts.sync(newer);
    expect(alerts.sync({ ...dismissed, updatedAt: new Date(T0 + 9_000).toISOString() }).id).toBe('newer');
    expect(alerts.takeDuplicates()).toEqual([]);
  });

  it('resolves its own alert as a duplicate when another replica opened one for the same pattern at the same time', () => {
    let now = T0;
    const replica = (name: string) => {
      let ids = 0;
      return new AlertManager({ suppressionMs: 3_600_000, now: () => now, newId: () => `${name}-${++ids}` });
    };
    const [a, b, c] = [replica('a'), replica('b'), replica('c')];
    const spray = finding('medium', T0, 'network:203.0.113.0/24');
    const first = a.apply('m_1', rule, spray).alert!;
    now += 1_000;
    const second = b.apply('m_1', rule, { ...spray, severity: 'high', lastSeenAt: T0 + 1_000 }).alert!;
    now += 4_000;
    // Every replica keeps the one created later; only the earlier one's creator resolves it.
    expect(b.sync(first).id).toBe(second.id);
    expect(b.takeDuplicates()).toEqual([]);
    expect(c.sync(first).id).toBe(first.id);
    expect(c.sync(second).id).toBe(second.id);
    expect(c.takeDuplicates()).toEqual([]);
    expect(a.sync(second).id).toBe(second.id);
    expect(a.takeDuplicates()).toEqual([{ alert: first, kept: second }]);
    expect(a.takeDuplicates()).toEqual([]);
    // Resolved (AlertService does it as an admin's change: duplicateResolution), read back: nothing changes; its next finding goes to the one kept.
    const resolved = duplicateResolution(first, second, now);
    expect(resolved).toMatchObject({ id: first.id, status: 'resolved', occurrences: 1 });
    expect(resolved.history.at(-1)).toMatchObject({ actor: 'system', from: 'open', to: 'resolved', note: expect.stringContaining(`a duplicate of alert ${second.id}`) });
    expect(a.sync(resolved).id).toBe(second.id);
    expect(a.sync(first).id).toBe(second.id);
    expect(a.takeDuplicates()).toEqual([]);
    expect(a.apply('m_1', rule, { ...spray, lastSeenAt: T0 + 6_000 })).toMatchObject({ change: 'updated', alert: { id: second.id, severity: 'high', occurrences: 2 } });
  });

  it('does not reopen an alert an admin resolved once it knows the later alert of its key it is a duplicate of', () => {
    let now = T0;
    const a = new AlertManager({ suppressionMs: 3_600_000, now: () => now, newId: () => 'a-1' });
    const spray = finding('medium', T0, 'network:203.0.113.0/24');
    const first = a.apply('m_1', rule, spray).alert!;
    const kept = { ...first, id: 'b-1', createdAt: new Date(T0 + 1_000).toISOString() };
    now += 3_000;
    const byAdmin = admin(new AlertManager({ suppressionMs: 3_600_000, now: () => now }), first, ['acknowledged', 'resolved'], now);
    // A repeat counted before the replica read either, written after: a recurrence while the key was its.
    const counted = a.apply('m_1', rule, { ...spray, lastSeenAt: T0 + 5_000 }).alert!;
    expect(a.merge(counted, byAdmin).status).toBe('open');
    // Read in sync's order, the alert kept first: the admin's resolution is not merged as the key's, nor undone.
    for (const stored of [byAdmin, kept].sort(laterCreatedFirst)) a.sync(stored);
    expect(a.merge(counted, byAdmin)).toMatchObject({ status: 'resolved', occurrences: 2, history: byAdmin.history });
    expect(a.takeDuplicates()).toEqual([{ alert: counted, kept }]);
  });

  it('resolves, as it starts, the earlier of two alerts open for one key, which their creator did not', () => {
    const spray = finding('medium', T0, 'network:203.0.113.0/24');
    const earlier = manager().alerts.apply('m_1', rule, spray).alert!;
    const later = { ...earlier, id: 'later', createdAt: new Date(T0 + 1_000).toISOString() };
    const other = { ...earlier, id: 'other', scope: 'pk_other' };
    for (const loaded of [[earlier, other, later], [later, other, earlier]]) {
      const { alerts } = manager();
      alerts.load(loaded);
      expect(alerts.takeDuplicates()).toEqual([{ alert: earlier, kept: later }]);
    }
    // One closed before the other opened (or resolved as a duplicate already) is no duplicate.
    for (const status of ['dismissed', 'resolved'] as const) {
      const { alerts } = manager();
      alerts.load([{ ...earlier, status }, later]);
      expect(alerts.takeDuplicates()).toEqual([]);
    }
  });

  it('never reopens a duplicate\'s resolution: a replica still counting findings on it has not read the alert kept', () => {
    let now = T0;
    const replica = (name: string) => new AlertManager({ suppressionMs: 3_600_000, now: () => now, newId: () => `${name}-1` });
    const [a, c] = [replica('a'), replica('c')];
    const spray = finding('medium', T0, 'network:203.0.113.0/24');
    const first = a.apply('m_1', rule, spray).alert!;
    c.sync(first);
    now += 5_000;
    const kept = { ...first, id: 'b-1', createdAt: new Date(T0 + 1_000).toISOString() };
    const resolved = duplicateResolution(first, kept, now);
    // c counted a finding after the resolution, on its open copy: merged, it stays resolved (a
    // resolution by an admin would be reopened, "the pattern recurred").
    const counted = c.apply('m_1', rule, { ...spray, lastSeenAt: T0 + 8_000 }).alert!;
    expect(c.merge(counted, resolved)).toMatchObject({ status: 'resolved', history: resolved.history });
    const byAdmin = admin(replica('d'), first, ['acknowledged', 'resolved'], now);
    expect(c.merge(counted, byAdmin).status).toBe('open');
    // Once it has read the resolution, and before it reads the alert kept, its findings go nowhere.
    c.sync(resolved);
    expect(c.apply('m_1', rule, { ...spray, lastSeenAt: T0 + 9_000 })).toEqual({ alert: undefined, change: 'suppressed' });
    expect(c.sync(kept).id).toBe('b-1');
    // A replica that never reads the alert kept (loaded at a start after it was closed and forgotten)
    // opens a new alert a minute after the resolution.
    const late = replica('e');
    late.sync(resolved);
    now += 61_000;
    expect(late.apply('m_1', rule, { ...spray, lastSeenAt: now })).toMatchObject({ change: 'created', alert: { id: 'e-1', status: 'open' } });
  });
});

describe('AlertManager with FEATURE_AI_RISK_SCORING', () => {
  // Two real findings of one key: a medium flood, then the critical one it becomes.
  const mild = () => fixtureFinding('velocity_attack', 'two minutes at twice the limit is medium');
  const severe = () => fixtureFinding('velocity_attack', 'sustained 840 requests/min for five minutes on a limit of 60 is critical');

  it('gives created alerts insights from their evidence, and derives them again when an escalation brings new evidence', () => {
    const { alerts } = manager({ aiInsights: true });
    const created = alerts.apply('m_1', rule, mild());
    expect(created.alert?.aiInsights).toEqual(alertInsights(created.alert!));
    expect(created.alert?.aiInsights?.[0]).toMatch(/^Scripted request flood: 2x the key's limit of 60\/min/);
    const escalated = alerts.apply('m_1', rule, severe());
    expect(escalated.change).toBe('escalated');
    expect(escalated.alert?.aiInsights?.[0]).toMatch(/^Scripted request flood: 14x the key's limit of 60\/min/);
    // A milder repeat (newer evidence) keeps the critical evidence, and so its insights.
    const later = Date.parse(escalated.alert!.lastSeenAt) + 60_000;
    const repeat = alerts.apply('m_1', rule, { ...mild(), lastSeenAt: later });
    expect(repeat.change).toBe('updated');
    expect(repeat.alert?.aiInsights).toEqual(escalated.alert?.aiInsights);
  });

  it('gives no alert the field when the flag is off, and drops insights stored while it was on', () => {
    const { alerts } = manager();
    const created = alerts.apply('m_1', rule, mild()).alert!;
    expect(created).not.toHaveProperty('aiInsights');
    const stored = alerts.sync({ ...created, aiInsights: ['stored while the flag was on'], updatedAt: new Date(T0 + 1).toISOString() });
    expect(stored.aiInsights).toEqual(['stored while the flag was on']);
    const escalated = alerts.apply('m_1', rule, severe());
    expect(escalated.change).toBe('escalated');
    expect(escalated.alert).not.toHaveProperty('aiInsights');
  });
});
